"""Synthesised schedules as hccc Algorithms and ResCCLang text (DESIGN.md section 3).

The text is an ordinary ``.rccl`` program: a header comment (cluster, collective, steps and lower
bound, synthesis time), the ``ResCCLAlgo(...)`` header and one ``transfer(src, dst, step, chunk, op)``
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
from hccc.compiler.frontend.algorithm import OP_NAMES, Algorithm, Collective, Header
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.synth.collectives import SynthResult


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


def header(result: SynthResult, topo: Topology | None = None) -> Header:
    gpn = max((nd.ngpus for nd in topo.nodes), default=result.nranks) if topo is not None else result.nranks
    coll = dsl_collective(result.collective)
    return Header(nranks=result.nranks, collective=coll, name=algo_name(result),
                  nchannels=int(result.detail.get("channels", 1)), nwarps=result.warps, gpu_per_node=gpn, nic_per_node=_nic_per_node(topo),
                  root=int(result.root or 0) if coll.rooted else 0, chunks_per_rank=int(result.chunks_per_rank))


def to_algorithm(result: SynthResult, topo: Topology | None = None) -> Algorithm:
    """The synthesised transfers as an :class:`Algorithm` (one anonymous site)."""
    rows = _sorted_rows(result)
    h = header(result, topo)
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
    """``part`` (:class:`hccc.compiler.synth.trees.LoopRows`) as ResCCLang loops: the representative
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


def _run_lines(rows: np.ndarray) -> list[str]:
    """Flat transfers as ResCCLang with their runs folded into loops: transfers of one pair, op and
    channel whose steps and chunks advance by the same amounts from one to the next (the pieces of
    a tree program's stream) become ``for p in range(0, n):`` over one ``transfer`` with ``step0 +
    ds * p`` and ``chunk0 + dc * p``; a transfer in no run of 2 or more stays one line. The lines
    are ordered by the step of each run's first transfer. Parses back to exactly ``rows``."""
    ops = dict(OP_NAMES)
    ch = rows[:, 5] if rows.shape[1] > 5 else np.zeros(len(rows), np.int64)
    order = np.lexsort((rows[:, 3], ch, rows[:, 4], rows[:, 1], rows[:, 0]))
    r = np.c_[rows[order, :5], ch[order]].tolist()

    def term(start: int, d: int) -> str:
        return str(start) if d == 0 else f"{start} + {d} * p" if d > 0 else f"{start} - {-d} * p"

    runs, i, n = [], 0, len(r)
    while i < n:
        j = i
        if i + 1 < n and r[i + 1][:2] == r[i][:2] and r[i + 1][4:] == r[i][4:]:
            ds, dc = r[i + 1][2] - r[i][2], r[i + 1][3] - r[i][3]
            j = i + 1
            while j + 1 < n and r[j + 1][:2] == r[i][:2] and r[j + 1][4:] == r[i][4:] and \
                    r[j + 1][2] - r[j][2] == ds and r[j + 1][3] - r[j][3] == dc:
                j += 1
        x = r[i]
        if j > i:
            text = [f"    for p in range(0, {j - i + 1}):",
                    f"        transfer({x[0]}, {x[1]}, {term(x[2], ds)}, {term(x[3], dc)}, {ops[x[4]]}"
                    f"{_channel_arg(x, 5)})"]
        else:
            text = [f"    transfer({x[0]}, {x[1]}, {x[2]}, {x[3]}, {ops[x[4]]}{_channel_arg(x, 5)})"]
        runs.append((x[2], x[0], x[1], x[3], text))
        i = j + 1
    runs.sort(key=lambda t: t[:4])
    folded = sum(1 for t in runs if len(t[4]) > 1)
    out = [f"    # {n} transfers: runs of one pair whose steps and chunks advance evenly as loops "
           f"({folded} loops, {len(runs) - folded} single transfers)"]
    for t in runs:
        out.extend(t[4])
    return out


def _channel_arg(row: list, col: int) -> str:
    """``, channel`` for a row with a channel column ``col`` that is not 0, else nothing."""
    return f", {row[col]}" if len(row) > col and row[col] else ""


def _comment(text: str) -> str:
    """Text from inputs (cluster names, file names) as one line of a comment: no control characters."""
    return printable(text, limit=1 << 16)


def to_rccl(result: SynthResult, topo: Topology | None = None, *, cluster: str | None = None,
            extra_comments: list[str] | None = None) -> str:
    """ResCCLang source of ``result`` (see the module docstring)."""
    h = header(result, topo)
    name = _comment(cluster or result.cluster)
    trees = result.detail.get("method") == "trees"
    lines = [
        "# Synthesised by hccc synth (" + ("bandwidth-optimal spanning-tree packing" if trees else
                                         "HeteCCL-style chunking, greedy + CEGIS with z3") + ")",
        f"# cluster: {name} ({result.nranks} GPUs"
        + (f", {len(topo.nodes)} nodes: " + ", ".join(str(nd.ngpus) for nd in topo.nodes[:16])
           + (", ..." if len(topo.nodes) > 16 else "") if topo is not None else "") + ")",
        f"# collective: {result.collective}"
        + (f" (root {result.root})" if result.root is not None else ""),
        f"# steps: {result.steps} (lower bound {result.lower_bound_steps}, gap {result.gap}); "
        f"transfers: {result.ntransfers}",
    ]
    for name, t in result.detail.get("trees", {}).items():
        lines.append(f"#   {name}: {t['trees']} trees, {t['chunks_per_rank']} chunks per rank, "
                     f"{t['model_fraction']:.4f} of the cut bound in the link model")
    for p in result.phases:
        lines.append(f"#   {p.name}: steps {p.step0}..{p.step0 + p.steps - 1} ({p.steps} steps, lower bound "
                     f"{p.result.bound.steps}; greedy {p.result.greedy_steps}, CEGIS iterations "
                     f"{p.result.iterations}, shared groups learned {p.result.learned_groups})")
    if result.composed:
        lines.append(f"# hierarchical composition: {_comment(str(result.composed))}")
    lines.append(f"# synthesis time: {result.seconds:.2f} s" + (" (time limit reached: best schedule so far)"
                                                                 if result.timed_out else ""))
    for c in extra_comments or []:
        lines.append("# " + _comment(c))
    extra = (f"Root={h.root}, " if h.collective.rooted else "") + \
        (f"nChunksPerRank={h.chunks_per_rank}, " if h.chunks_per_rank != 1 else "")
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
