"""Synthesised schedules as hccc Algorithms and ResCCLang text (the AllToAll layout of :mod:`hccc.compiler.frontend.collectives`).

The text is an ordinary ``.rccl`` program: a header comment (cluster, collective, steps and lower
bound; never a timing, so one synthesis always writes the same bytes), the ``ResCCLAlgo(...)`` header and one ``transfer(src, dst, step, chunk, op)``
per line, grouped by step (with a sixth argument, the channel, where it is not 0: tree programs
give every stream channels of its own); a tree program of at least :data:`LOOPS_FROM_TRANSFERS` transfers on
identical nodes is written as ``for`` loops over the node (and GPU) shifts that map its
representative trees onto the others, so the text stays short at any scale; one of as many
transfers without that symmetry has its runs (a pair's transfers whose steps and chunks advance
evenly: a stream's pieces) written as loops. It parses back to exactly the transfers of :func:`to_algorithm`, so
``hccc`` compiles it like any other program. Chunk ids follow the language's data model: with ``K``
chunks per rank (``nChunksPerRank``), rank r's own chunks (AllGather) and the chunks reduced at
rank r (ReduceScatter) are chunks ``r*K .. r*K+K-1``; a Broadcast names its ``Root``.
"""
from __future__ import annotations


import numpy as np

from hccc.util.limits import printable
from hccc.util.plural import plural
from hccc.compiler.frontend.algorithm import OP_NAMES, Algorithm, Collective, Header
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.synth.collectives import SynthResult
from hccc.compiler.synth.plan import SynthPlan


def dsl_collective(collective: str) -> Collective:
    """The ResCCLang OpType for a synthesis request, or a CompileError saying why there is none."""
    coll = Collective.parse(collective)
    if coll is None:
        raise CompileError([Diagnostic(
            f"ResCCLang has no OpType for {collective} (OpType is one of "
            + ", ".join(c.dsl_name for c in Collective) + ")", None)])
    return coll


def algo_name(result: SynthResult) -> str:
    return f"synth_{result.collective}_{result.nranks}"


def _nic_per_node(topo: Topology | None) -> int:
    if topo is None:
        return 0
    counts = np.zeros(len(topo.nodes), np.int64)
    for g in topo.groups:
        if g.kind == "nic" and g.direction == "ingress" and g.members.size:
            counts[topo.rank_node[topo.link_dst[int(g.members[0])]]] += 1
    return int(counts.max()) if counts.size else 0


def header(result: SynthResult, topo: Topology | None = None, plan: SynthPlan | None = None) -> Header:
    """The program's header, every choice in it (channels, warps, chunks, slices) from ``plan``
    (default: the plan ``result`` carries as made, :meth:`SynthPlan.of`). The text always writes
    ``nChannels``, so the header says it was given, as the parser's does for that text."""
    plan = plan or SynthPlan.of(result)
    gpn = max((nd.ngpus for nd in topo.nodes), default=result.nranks) if topo is not None else result.nranks
    coll = dsl_collective(result.collective)
    return Header(nranks=result.nranks, collective=coll, name=algo_name(result),
                  nchannels=int(plan.channels), nwarps=int(plan.warps), gpu_per_node=gpn, nic_per_node=_nic_per_node(topo),
                  root=int(result.root or 0) if coll.rooted else 0, chunks_per_rank=int(plan.chunks_per_rank),
                  micro_batches=plan.slicing.micro_batches, min_slice_bytes=plan.slicing.min_slice,
                  nchannels_given=True)


def to_algorithm(result: SynthResult, topo: Topology | None = None, plan: SynthPlan | None = None) -> Algorithm:
    """The synthesised transfers as an :class:`Algorithm` (one anonymous site): what the text of
    :func:`to_rccl` with the same ``plan`` parses to, header and transfers (in the text's order
    where it is one ``transfer`` per line, below :data:`LOOPS_FROM_TRANSFERS`; loops give the same
    transfers in loop order). Synthesis hands this to the compiler; the text is for the user."""
    rows = _sorted_rows(result)
    h = header(result, topo, plan)
    base = Algorithm.from_rows(h, [])  # one anonymous site at the header
    n = len(rows)
    return Algorithm(header=h, src=rows[:, 0].copy(), dst=rows[:, 1].copy(), step=rows[:, 2].copy(),
                     chunk=rows[:, 3].copy(), op=rows[:, 4].astype(np.uint8), site=np.zeros(n, np.int64),
                     sites=base.sites, loop_values=[np.zeros((n, 0), np.int64)],
                     channel=rows[:, 5].copy() if rows.shape[1] > 5 else None)


def _sorted_rows(result: SynthResult) -> np.ndarray:
    r = result.rows
    return r[np.lexsort((r[:, 3], r[:, 1], r[:, 0], r[:, 2]))] if len(r) else r.reshape(0, r.shape[-1] if r.ndim == 2 else 5)


#: programs of this many transfers or more are written as loops over their symmetry when they
#: have one (a tree packing on identical nodes): the text stays short at any scale
LOOPS_FROM_TRANSFERS = 10_000


def _loop_lines(part) -> list[str]:
    """``part`` (:class:`hccc.compiler.synth.tree_rows.LoopRows`) as ResCCLang loops: the representative
    transfers once, inside ``for a`` (node shifts) and ``for b`` (GPU shifts within a node) loops
    whose rank expressions shift every rank ``r`` to ``((r // g + a) % nodes) * g + (r % g + b) % g``
    (:class:`hccc.compiler.synth.symmetry.Symmetry`)."""
    sym = part.symmetry
    N, g, B = sym.nodes, sym.gpn, sym.gpu_shifts
    K = part.chunks_per_rank
    ops = dict(OP_NAMES)

    def rank(r: int) -> str:
        node, gpu = divmod(int(r), g)
        within = f"({gpu} + b) % {g}" if B > 1 else f"{gpu}"
        return f"(({node} + a) % {N}) * {g} + {within}"

    def chunk(root: int, j: int) -> str:
        return f"({rank(root)}) * {K} + {j}" if K > 1 else rank(root)

    rows = part.rows
    rows = rows[np.lexsort((rows[:, 4], rows[:, 3], rows[:, 1], rows[:, 0], rows[:, 2]))] if len(rows) else rows
    ind = "            " if B > 1 else "        "
    out = [f"    # {len(rows)} transfers of the representative trees, repeated for every shift of the ranks by "
           f"a nodes{' and b GPUs within a node' if B > 1 else ''} ({len(rows) * len(sym)} transfers)",
           f"    for a in range(0, {N}):"]
    if B > 1:
        out.append(f"        for b in range(0, {B}):")
    out.extend(f"{ind}transfer({rank(x[0])}, {rank(x[1])}, {x[2]}, {chunk(x[3], x[4])}, {ops[x[5]]}{_channel_arg(x, 6)})"
               for x in rows.tolist())
    return out


#: loop variables of :func:`_run_lines`, innermost first: runs, runs of runs, ...
RUN_VARS = ("p", "q", "u", "v")


def _run_lines(rows: np.ndarray) -> list[str]:
    """Flat transfers as ResCCLang with their runs folded into loops: transfers of one pair and op
    whose steps, chunks and channels advance by the same amounts from one to the next (the pieces
    of a tree program's stream) become ``for p in range(0, n):`` over one ``transfer`` with
    ``step0 + ds * p``, ``chunk0 + dc * p`` (and ``channel0 + dh * p``); consecutive such loops of
    one pair and op, alike in their counts and advances, whose first transfers advance evenly (the
    streams of a pair, a channel each) fold again into ``for q in range(0, m):`` around them, and
    so on, up to :data:`RUN_VARS` deep. A transfer in no run stays one line. The lines are ordered
    by the step of each loop's first transfer (then its source, destination and chunk, then the
    folding order). Parses back to exactly ``rows``.

    Transfers in no run (all of an AllToAll's at one chunk per block, nearly all where blocks are
    relayed) are formatted and ordered over arrays; only the loops are folded item by item (a
    single transfer is never alike a loop, so it only separates the loops around it): a 512-GPU
    AllToAll's 261,632 lines take 0.2 s instead of 3 s."""
    ops = dict(OP_NAMES)
    ch = rows[:, 5] if rows.shape[1] > 5 else np.zeros(len(rows), np.int64)
    order = np.lexsort((rows[:, 3], ch, rows[:, 4], rows[:, 1], rows[:, 0]))
    base = np.c_[rows[order, :5], ch[order]].astype(np.int64)
    starts, counts, advances = _first_runs(base)
    one = counts == 1
    # the loops: (first transfer, loops innermost first, each (count, step, chunk and channel
    # advance), position in the folding order). Leaving the single transfers out joins no loops
    # that were apart: a pair's rows are contiguous, and a single one of them ends them (a row
    # followed by one of its pair and op begins a run), so no single lies between two loops of
    # one pair and op
    looped = np.flatnonzero(~one)
    items = [(x, ((c, *adv),), pos) for x, c, adv, pos in
             zip(base[starts[looped]].tolist(), counts[looped].tolist(), advances[looped].tolist(),
                 starts[looped].tolist())]

    def alike(a, b) -> bool:
        return a[0][:2] == b[0][:2] and a[0][4] == b[0][4] and a[1] == b[1]

    def advance(a, b) -> tuple:
        return b[0][2] - a[0][2], b[0][3] - a[0][3], b[0][5] - a[0][5]

    for _ in RUN_VARS[1:]:
        folded, k = [], 0
        while k < len(items):
            m = 1
            if k + 1 < len(items) and alike(items[k], items[k + 1]):
                adv = advance(items[k], items[k + 1])
                m = 2
                while k + m < len(items) and alike(items[k], items[k + m]) and \
                        advance(items[k + m - 1], items[k + m]) == adv:
                    m += 1
            it = items[k]
            folded.append((it[0], it[1] + ((m,) + adv,), it[2]) if m > 1 else it)
            k += m
        if len(folded) == len(items):
            break
        items = folded

    def term(start: int, loops: tuple, col: int) -> str:
        text = str(start)
        for loop, var in reversed(list(zip(loops, RUN_VARS))):      # outermost first
            d = loop[col]
            if d:
                text += f" + {d} * {var}" if d > 0 else f" - {-d} * {var}"
        return text

    texts = []
    for x, loops, _ in items:
        depth = len(loops)
        text = [f"    {'    ' * lev}for {RUN_VARS[depth - 1 - lev]} in range(0, {loops[depth - 1 - lev][0]}):"
                for lev in range(depth)]
        chan = term(x[5], loops, 3)
        text.append(f"    {'    ' * depth}transfer({x[0]}, {x[1]}, {term(x[2], loops, 1)}, {term(x[3], loops, 2)}, "
                    f"{ops[x[4]]}{'' if chan == '0' else ', ' + chan})")
        texts.append(text)
    singles = base[starts[one]]
    names = [ops.get(k, "") for k in range(max(ops) + 1)]
    texts.extend(f"    transfer({s}, {d}, {t}, {c}, {names[op]}{', ' + str(h) if h else ''})"
                 for s, d, t, c, op, h in singles.tolist())
    # every line in the order of its first transfer's (step, src, dst, chunk), then the folding's
    firsts = np.array([x for x, _, _ in items], np.int64).reshape(-1, 6)
    key = np.r_[firsts, singles]
    pos = np.r_[np.array([it[2] for it in items], np.int64), starts[one]]
    line_order = np.lexsort((pos, key[:, 3], key[:, 1], key[:, 0], key[:, 2]))
    out = [f"    # {len(rows)} transfers: runs of one pair whose steps, chunks and channels advance evenly "
           f"as loops, and runs of such runs ({len(items)} loops, {len(singles)} single transfers)"]
    for i in line_order.tolist():
        t = texts[i]
        if isinstance(t, str):
            out.append(t)
        else:
            out.extend(t)
    return out


def _first_runs(base: np.ndarray):
    """The first folding of :func:`_run_lines` over arrays: ``base`` (``src, dst, step, chunk, op,
    channel`` rows, in pair, op, channel and chunk order) cut into runs, taken greedily from the
    first row: a run is a row and the following ones of its pair and op while their steps, chunks
    and channels advance by the first advance. ``(starts, counts, advances)``: each run's first
    row, its rows and its (step, chunk, channel) advance."""
    n = len(base)
    if n < 2:
        return np.arange(n, dtype=np.int64), np.ones(n, np.int64), np.zeros((n, 3), np.int64)
    same = (base[1:, 0] == base[:-1, 0]) & (base[1:, 1] == base[:-1, 1]) & (base[1:, 4] == base[:-1, 4])
    adv = base[1:][:, [2, 3, 5]] - base[:-1][:, [2, 3, 5]]
    # a run from row k has 2 + (how many advances after advance k repeat it) rows
    even = same[:-1] & same[1:] & (adv[:-1] == adv[1:]).all(axis=1)
    at = np.arange(len(even))
    repeat = np.r_[np.minimum.accumulate(np.where(even, len(even), at)[::-1])[::-1] - at, 0]
    length = np.r_[np.where(same, 2 + repeat, 1), 1]
    if not same.any():                 # no run at all (an AllToAll's)
        return np.arange(n, dtype=np.int64), length, np.zeros((n, 3), np.int64)
    starts, k = [], 0
    lens = length.tolist()
    while k < n:
        starts.append(k)
        k += lens[k]
    starts = np.asarray(starts, np.int64)
    advances = np.zeros((len(starts), 3), np.int64)
    folds = length[starts] > 1
    advances[folds] = adv[starts[folds]]
    return starts, length[starts], advances


def _channel_arg(row: list, col: int) -> str:
    """``, channel`` for a row with a channel column ``col`` that is not 0, else nothing."""
    return f", {row[col]}" if len(row) > col and row[col] else ""


def _comment(text: str) -> str:
    """Text from inputs (cluster names, file names) as one line of a comment: no control characters."""
    return printable(text, limit=1 << 16)


def to_rccl(result: SynthResult, topo: Topology | None = None, plan: SynthPlan | None = None, *,
            cluster: str | None = None, extra_comments: list[str] | None = None) -> str:
    """ResCCLang source of ``result`` written as ``plan`` says (see the module docstring and
    :func:`header`)."""
    plan = plan or SynthPlan.of(result)
    h = header(result, topo, plan)
    name = _comment(cluster or result.cluster)
    from hccc.compiler.synth.classic import DESCRIPTIONS
    made_by = ("bandwidth-optimal spanning-tree packing" if plan.method == "trees" else
               "HeteCCL-style chunking, greedy + CEGIS with z3" if plan.method == "search" else
               f"the candidate kept: {DESCRIPTIONS.get(plan.method, plan.method)}")
    lines = [
        f"# Synthesised by hccc synth ({made_by})",
        f"# cluster: {name} ({plural(result.nranks, 'GPU')}"
        + (f", {plural(len(topo.nodes), 'node')}: " + ", ".join(str(nd.ngpus) for nd in topo.nodes[:16])
           + (", ..." if len(topo.nodes) > 16 else "") if topo is not None else "") + ")",
        f"# collective: {result.collective}"
        + (f" (root {result.root})" if result.root is not None else ""),
        f"# steps: {result.steps} (lower bound {result.lower_bound_steps}, gap {result.gap}); "
        f"transfers: {result.ntransfers}",
    ]
    for name, t in plan.trees.items():
        lines.append(f"#   {name}: {t['trees']} trees, {t['chunks_per_rank']} chunks per rank, "
                     f"{t['model_fraction']:.4f} of the cut bound in the link model")
    for p in result.phases:
        span = f"steps {p.step0}..{p.step0 + p.steps - 1}" if p.steps else "no step"
        lines.append(f"#   {p.name}: {span} ({plural(p.steps, 'step')}, lower bound "
                     f"{p.result.bound.steps}; greedy {p.result.greedy_steps}, CEGIS iterations "
                     f"{p.result.iterations}, shared groups learned {p.result.learned_groups})")
    if result.composed:
        lines.append(f"# hierarchical composition: {_comment(str(result.composed))}")
    # no timing: the same synthesis writes the same bytes (``hccc synth`` says its time on stderr)
    if result.timed_out:
        lines.append("# time limit reached: best schedule so far")
    for c in extra_comments or []:
        lines.append("# " + _comment(c))
    extra = (f"Root={h.root}, " if h.collective.rooted else "") + \
        (f"nChunksPerRank={h.chunks_per_rank}, " if h.chunks_per_rank != 1 else "") + \
        (f"nMicroBatches={h.micro_batches}, MinSliceBytes={h.min_slice_bytes}, "
         if not plan.slicing.is_default else "")
    lines.append(f'def ResCCLAlgo(nRanks={h.nranks}, nChannels={h.nchannels}, nWarps={h.nwarps}, '
                 f'AlgoName="{h.name}", OpType="{h.collective.dsl_name}", {extra}GPUPerNode={h.gpu_per_node}, '
                 f'NICPerNode={h.nic_per_node}):')
    rows = _sorted_rows(result)
    if not len(rows):
        lines.append("    pass")
    elif result.loops and len(rows) >= LOOPS_FROM_TRANSFERS:
        for part in result.loops:
            lines.extend(_loop_lines(part))
    elif len(rows) >= LOOPS_FROM_TRANSFERS:
        lines.extend(_run_lines(rows))
    else:
        steps = rows[:, 2]
        bounds = np.r_[0, np.flatnonzero(np.diff(steps)) + 1, len(rows)]
        ops = dict(OP_NAMES)
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            lines.append(f"    # step {int(steps[a])}: {b - a} transfers")
            lines.extend(f"    transfer({r[0]}, {r[1]}, {r[2]}, {r[3]}, {ops[r[4]]}{_channel_arg(r, 5)})"
                         for r in rows[a:b].tolist())
    return "\n".join(lines) + "\n"
