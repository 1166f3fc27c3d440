"""AllReduce by reduce trees into a few roots, then broadcast trees out of them.

The tree packing's AllReduce (:func:`.trees.pack_allreduce`) gives *every* rank's share of the
buffer an in-tree into that rank and an out-tree out of it, so a stream of every rank's trees
crosses every rank: on 32 GPUs a program of one chunk a rank has 32 x 31 transfers per half, and
the engines that run a plan or an XML (MSCCL++: at most 64 operations a thread block and 108
thread blocks a rank) fit it only with every chunk cut a few ways, too few to pipeline the trees.
Here the buffer is cut among ``K`` roots instead (a handful, spread over the nodes): root ``r``'s
``1/K`` of the buffer is reduced into ``r`` up in-trees (spanning arborescences of the transposed
network) and broadcast from it down out-trees. The loads are the same kind as the packing's (every
element still crosses ``N - 1`` arcs each way), but the chunk ids are the roots' alone, so the
program's transfers stay ``2 (N - 1)`` per chunk id while each tree carries many chunk ids:
the trees pipeline, and their weights round finely.

**The LP** is the packing LP of :mod:`.packing_lp` with one row per root and direction (the
representatives are the roots, each its own class): minimise ``T`` such that every root's in-trees
and out-trees each carry its whole share and every pair and shared group fits its load in ``T``,
solved by the same column generation (:func:`.packing_lp._column_generation`: Chu-Liu/Edmonds at
the LP's prices, rail trees beside). Its optimum is never below the AllReduce's bound for any
schedule (:func:`.bounds.allreduce_bound_seconds`).

**Rounding.** ``S`` streams per root: each root's in-tree weights and out-tree weights are rounded
to ``S`` by largest remainders and repaired (:func:`.rounding._round_counts`,
:func:`.balancing._repair`, the AllGather packing's own), and where that misses the LP and an
engine accepts it, by the packing's MILP over the same trees where faster
(:func:`milp_rounding`), so a stream follows one in-tree and one out-tree of its root. Where that
still misses the LP by more than :data:`.rounding.ROUND_TOL`, or the engine refuses it, the trees
are packed integrally at ``S`` (:mod:`.root_branchings`: arc multiplicities meeting Edmonds' cut
condition for the roots, then trees grown from them; :func:`_integral_program`), kept where
faster: the LP's trees are many and light on large clusters (64 GPUs, 2 roots: 53 trees, none
above 0.28 of its root's data) and round to 0.50, 0.67 and 0.83 of the LP at 2, 4 and 5 streams,
where the integral packing at 2 streams reaches the LP.

**Rows.** Chunk id ``c`` of root ``r`` is reduced up its in-tree (``rrc``: a rank's children
reduce into it at distinct steps, :func:`.tree_rows._reduce_steps`), then broadcast down its
out-tree (``recv``) from the step after the last reduction of the program. Chunk ids run in
*streams* of equal length, a stream on a channel of its own on each pair it crosses
(:func:`.forest.pair_channels`, :data:`STREAMS`).

**Candidates** (:func:`root_tree_programs`): for each root count of :data:`ROOT_COUNTS`, the
stream counts of :data:`STREAMS`, kept where the engine's check (``engine``,
:func:`hccc.synth_engines.transfers_check`) accepts the rows; where it refuses them, the LP again
with every rank's connection ends capped (:func:`with_end_groups`), and the integral packing with
them capped, for at most :data:`INTEGRAL_COUNTS` stream counts a root count. The stream counts
stop at the first whose integral packing comes within :data:`INTEGRAL_TOL` of the LP, and a root
count after one whose did seeks no integral packing. The selection
(``driver/synth_select.py``) simulates the candidates beside every other program and keeps the
fastest.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.frontend.algorithm import RECV, RRC
from hccc.compiler.synth.balancing import _repair
from hccc.compiler.synth.packing import PackOptions
from hccc.compiler.synth.packing_lp import LP_TOL, _column_generation, _columns, _initial_columns
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.rounding import ROUND_TOL, _round_counts
from hccc.compiler.synth.tree_rows import _depths, _reduce_steps
from hccc.util import clock

#: the root counts tried, fewest first: a few roots keep each tree's chunk ids many (on 32 GPUs at
#: 4 chunks a rank, 4 roots give a tree 32 chunk ids where every rank as a root gives it 4)
ROOT_COUNTS = (2, 4, 8)
#: the chunks per rank a program may have (``nChunksPerRank``): the fewest whose chunk ids cut into
#: the streams (:func:`chunks_for`)
CHUNKS_PER_RANK = tuple(range(1, 17))
#: streams per root tried, fewest first. A stream is a run of chunk ids on one tree, on a channel
#: of its own on every pair: all streams carry as many chunk ids, so the links' fair shares give
#: every stream its planned rate (ho_8x4_mesh, 2 roots, a channel per *tree* carrying unequal
#: counts: 0.742 of the cut bound simulated against 0.971 in the link model; equal streams: the
#: simulation within 2 % of the link model). An engine's thread blocks grow with the streams (one
#: per connection end), its operations per block with the chunk ids a stream carries
STREAMS = (2, 3, 4, 5, 6, 8, 12, 16)
#: stream counts in a row an engine refuses at every share of :data:`ENDS_SHARES` before no more
#: are tried: its thread blocks grow with the streams, but a rounding's busiest rank varies from
#: one count to the next (ho_8x4_mesh, 4 roots, MSCCL++: 3 streams accepted as packed, 0.914 of
#: the cut bound simulated; 4 streams only at 0.85 of the ends)
REFUSED_STREAMS = 2
#: shares of the busiest rank's connection ends (:func:`tree_ends`, the LP's trees by weight) the
#: LP is packed again under where a rounding is refused, each LP made once and rounded at every
#: stream count (ho_8x4_mesh for MSCCL++: 4 roots of 4 streams as packed need 119 thread blocks on
#: the busiest rank, 108 allowed, at 0.962 of the cut bound in the link model; packed with the ends
#: capped, accepted at 0.926, 0.904 simulated; the table's run wrote 8 roots of 2 streams at 0.85:
#: 0.945. Each share costs an LP per root count, about half a second on 24 GPUs under load)
ENDS_SHARES = (0.9, 0.85, 0.8)
#: how near the LP an integral packing (:mod:`.root_branchings`) must come for no more stream
#: counts (and no more root counts) to be packed integrally: ho_3x8_switch, 2 roots at 4 streams:
#: 0.980 of the AllReduce bound in the link model, 0.930 simulated; every further count's program
#: cost seconds of cut rounds under the synthesis's limit and left the roots' trees unsimulated
INTEGRAL_TOL = 0.03
#: the most stream counts of one root count packed integrally (each a mixed-integer program with
#: rounds of cuts: on 24 GPUs with 8 roots, tens of seconds)
INTEGRAL_COUNTS = 3


@dataclass
class RootTrees:
    """The fractional packing of an AllReduce over ``roots``: every tree as ``(root, in_tree,
    parents)`` with its weight (a share of its root's data), the LP's time per byte of a root's
    share, and every tree's load per resource (``load``, normalised as the LP's ``capn``)."""

    nranks: int
    roots: np.ndarray
    trees: list
    weights: np.ndarray
    load: np.ndarray
    capn: np.ndarray
    lp_time: float
    scale: float


def spread_roots(net: Network, k: int) -> np.ndarray:
    """``k`` roots spread over the nodes (``net.levels[0]``): the first rank of every node, then the
    next rank of every node, and so on (rank order where there are no levels)."""
    n = net.nranks
    node = np.asarray(net.levels[0], np.int64) if net.levels else np.zeros(n, np.int64)
    local = np.zeros(n, np.int64)
    seen: dict[int, int] = {}
    for v in range(n):
        local[v] = seen.get(int(node[v]), 0)
        seen[int(node[v])] = local[v] + 1
    order = np.lexsort((node, local))
    return np.sort(order[:max(1, min(int(k), n))])


def with_end_groups(net: Network, ends_cap: np.ndarray) -> Network:
    """``net`` with a shared group per rank over every pair that starts or ends there, of capacity
    ``ends_cap[v]`` (bytes/s; 0: none): a tree's load on it is its arcs at ``v`` (a connection end
    each in the program), so the LP that packs on it caps every rank's connection ends."""
    import dataclasses

    P, G = net.npairs, net.ngroups
    keep = np.flatnonzero(np.asarray(ends_cap) > 0)
    rp, rg = net.pair_group_rows()
    new_p = np.concatenate([np.flatnonzero(net.psrc == v).tolist() + np.flatnonzero(net.pdst == v).tolist()
                            for v in keep.tolist()] or [[]]).astype(np.int64)
    new_g = np.concatenate([np.full(int((net.psrc == v).sum() + (net.pdst == v).sum()), G + i)
                            for i, v in enumerate(keep.tolist())] or [[]]).astype(np.int64)
    pair = np.r_[rp, new_p]
    grp = np.r_[rg, new_g]
    o = np.lexsort((grp, pair))
    ptr = np.r_[0, np.cumsum(np.bincount(pair, minlength=P))].astype(np.int64)
    gbw = np.r_[net.gbw if net.gbw is not None else np.zeros(G), np.asarray(ends_cap, float)[keep]]
    return dataclasses.replace(net, pg_ptr=ptr, pg_idx=grp[o].astype(np.int32),
                               gcap=np.r_[net.gcap, np.ones(keep.size, net.gcap.dtype)],
                               glabel=list(net.glabel) + [f"connection ends at rank {v}" for v in keep.tolist()],
                               gbw=gbw, _in_csr=None, _out_csr=None, _spread=None, _self_transposed=None)


def pack_root_trees(net: Network, roots, *, pair_bw: np.ndarray | None = None, deadline: float,
                    tol: float = LP_TOL, options: PackOptions | None = None,
                    ends: np.ndarray | None = None) -> RootTrees:
    """The LP of the module docstring over ``roots`` on ``net`` (``pair_bw``: bytes/s of every pair,
    default ``net.bw``), by column generation until ``deadline`` (a stopped LP keeps a feasible
    packing). ``ends`` (per rank, or None): the most tree arcs at each rank, summed over the
    roots' trees by weight, at the time the LP without it reaches (:func:`with_end_groups`; at a
    longer time proportionally more): what caps a program's connection ends on an engine."""
    n = net.nranks
    roots = np.asarray(sorted(set(int(r) for r in roots)), np.int64)
    bw = np.asarray(net.bw if pair_bw is None else pair_bw, float)
    ident = np.arange(n, dtype=np.int64)[None, :]
    translate = {int(r): ident for r in roots}
    # every tree priced by the compiled Chu-Liu/Edmonds: the LPs here are many (one per root
    # count, and again per cap on the ends), and the plain formulation's first trees took most of
    # their time (24 GPUs: 8,056 trees priced, 7 of 11 s)
    options = options or PackOptions(priced_plain=0)
    cs = _columns(net, bw, False, True, translate, options)
    _initial_columns(cs, None)
    sol = _column_generation(cs, None, tol, deadline)
    if ends is not None:
        # the groups' capacity: ``ends[v]`` arcs by weight in the unconstrained optimum's time
        free = sol.value / cs.scale
        capped = with_end_groups(net, np.asarray(ends, float) / max(free, 1e-30))
        seeds = [(r, cs.col_par[j], rev) for j in np.flatnonzero(sol.y > 1e-9).tolist()
                 for r, rev in [cs.root_of(j)]]
        cs = _columns(capped, bw, False, True, translate, options)
        _initial_columns(cs, seeds)
        sol = _column_generation(cs, None, tol, deadline)
    keep = np.flatnonzero(sol.y > 1e-9)
    trees = []
    for j in keep.tolist():
        r, rev = cs.root_of(j)
        trees.append((int(r), bool(rev), np.asarray(cs.col_par[j], np.int64)))
    P = net.npairs
    nres = P + net.ngroups           # the network's own resources (not the ends' groups)
    load = np.array([cs.unit_of(j)[:nres] for j in keep.tolist()]) if keep.size else np.zeros((0, nres))
    return RootTrees(n, roots, trees, sol.y[keep], load, cs.capn[:nres], sol.value / cs.scale, cs.scale)


def round_root_trees(rt: RootTrees, per_root: int) -> np.ndarray:
    """Streams per tree, ``per_root`` in each root's in-trees and as many in its out-trees:
    largest remainders, then repaired (single streams moved between a root's trees of one
    direction while the most loaded resource gets lighter)."""
    key = _root_keys(rt)
    counts = _round_counts(rt.weights, key, rt.nranks, int(per_root))
    return _repair(counts, key, rt.load, rt.capn, int(per_root), rounds=4 * int(per_root) * max(1, rt.roots.size))


def _root_keys(rt: RootTrees) -> np.ndarray:
    return np.array([r + rt.nranks * rev for r, rev, _ in rt.trees], np.int64)


def milp_rounding(rt: RootTrees, per_root: int, counts: np.ndarray) -> np.ndarray | None:
    """Where ``counts`` (:func:`round_root_trees`) miss the LP by more than
    :data:`.rounding.ROUND_TOL`: the counts of the AllGather packing's MILP over the same trees
    where they are faster (:func:`.rounding._milp_counts`, its node limit
    :data:`.rounding.ROUND_MILP_NODES` deciding), else None."""
    from hccc.compiler.synth.packing import ROUND_MILP_EACH
    from hccc.compiler.synth.rounding import ROUND_MILP_NODES, ROUND_TOL, _milp_counts

    t = rounded_time(rt, counts, per_root)
    if t <= rt.lp_time * (1 + ROUND_TOL) or not len(rt.trees):
        return None
    got = _milp_counts(_root_keys(rt), rt.load, rt.capn, int(per_root), ROUND_MILP_EACH,
                       target=t * rt.scale * (1 - 1e-9), gap=ROUND_TOL, nodes=ROUND_MILP_NODES,
                       floor=rt.lp_time * rt.scale)
    return got if got is not None and rounded_time(rt, got, per_root) < t * (1 - 1e-9) else None


def rounded_time(rt: RootTrees, counts: np.ndarray, per_root: int) -> float:
    """Seconds per byte of a root's share with ``counts`` streams per tree: the most loaded
    resource's (the LP's unit)."""
    load = (np.asarray(counts, float)[:, None] * rt.load).sum(axis=0) / int(per_root)
    ok = rt.capn > 0
    return float((load[ok] / rt.capn[ok]).max()) / rt.scale if ok.any() else 0.0


def root_tree_rows(rt: RootTrees, counts: np.ndarray, per_stream: int) -> np.ndarray:
    """``(src, dst, step, chunk, op, channel)`` rows of the rounded trees (the module docstring):
    ``counts[t]`` streams on tree ``t``, each of ``per_stream`` consecutive chunk ids (the ``i``-th
    root's streams numbered from ``i x`` its streams), reduced up their in-trees, then broadcast
    down their out-trees; every stream on a channel of its own on each pair it crosses."""
    per_root = int(counts[[not rev for _, rev, _ in rt.trees]].sum()) // max(1, rt.roots.size) \
        if len(rt.trees) else 0
    at_root = {int(r): i for i, r in enumerate(rt.roots.tolist())}
    nxt = {(int(r), rev): 0 for r in rt.roots.tolist() for rev in (False, True)}
    b = int(per_stream)
    parts = []
    for (r, rev, par), c in zip(rt.trees, np.asarray(counts).tolist()):
        if c <= 0:
            continue
        j0 = nxt[(r, rev)]
        nxt[(r, rev)] = j0 + c
        streams = at_root[r] * per_root + j0 + np.arange(c)
        chunks = (streams[:, None] * b + np.arange(b)[None, :]).ravel()
        d = _depths(par)
        v = np.flatnonzero(par >= 0)
        if rev:
            src, dst, st = v, par[v], _reduce_steps(par, d)[v]
        else:
            src, dst, st = par[v], v, d[v] - 1
        m, C = v.size, chunks.size
        parts.append(np.stack([np.tile(src, C), np.tile(dst, C), np.tile(st, C), np.repeat(chunks, m),
                               np.full(m * C, RRC if rev else RECV), np.repeat(chunks // b, m)], axis=1))
    if not parts:
        return np.zeros((0, 6), np.int64)
    rows = np.concatenate(parts).astype(np.int64)
    bcast = rows[:, 4] == RECV
    if (~bcast).any():
        rows[bcast, 2] += int(rows[~bcast, 2].max()) + 1
    from hccc.compiler.synth.forest import pair_channels

    rows[:, 5] = pair_channels(rows[:, 0], rows[:, 1], rows[:, 5] * 2 + bcast)
    return rows[np.lexsort((rows[:, 3], rows[:, 2]))]


@dataclass
class RootTreeProgram:
    """One candidate: its rows, chunks per rank, roots, streams per root and chunk ids per stream,
    the cap on connection ends its LP packed under (None: none), and the rounding's link-model time
    (seconds per byte of the buffer)."""

    rows: np.ndarray
    chunks_per_rank: int
    roots: np.ndarray
    streams: int
    per_stream: int
    ends_share: float | None
    seconds_per_byte: float
    #: what the deadline left undone while this root count's program was made (empty: nothing)
    cut: list = field(default_factory=list)
    #: whether its trees are the integral packing at its stream count (:mod:`.root_branchings`),
    #: not a rounding of the LP's
    integral: bool = False

    @property
    def detail(self) -> dict:
        return {"roots": self.roots.tolist(), "streams_per_root": self.streams, "chunks_per_stream": self.per_stream,
                "ends_share": self.ends_share, "link_model_seconds_per_byte": self.seconds_per_byte,
                "integral": self.integral}


def chunks_for(nranks: int, roots: int, streams: int) -> int:
    """The fewest chunks per rank (of :data:`CHUNKS_PER_RANK`) whose chunk ids cut into ``roots``
    x ``streams`` equal streams (0: none)."""
    return next((k for k in sorted(CHUNKS_PER_RANK) if (nranks * k) % (roots * streams) == 0), 0)


def tree_ends(rt: RootTrees) -> np.ndarray:
    """Every rank's tree arcs (a connection end each in a program), summed over the trees by
    weight: per stream of every root, what a rank's connection ends are on average."""
    out = np.zeros(rt.nranks)
    for (_, _, par), y in zip(rt.trees, rt.weights):
        v = np.flatnonzero(par >= 0)
        np.add.at(out, v, y)
        np.add.at(out, par[v], y)
    return out


def root_tree_programs(net: Network, *, pair_bw: np.ndarray | None = None, deadline: float,
                       engine=None, root_counts=ROOT_COUNTS) -> tuple[list, list]:
    """The candidates of the module docstring, ``(programs, why others were not made)``, the
    programs fastest in the link model first. For each root count below the ranks: the LP, and
    (only where ``engine`` refuses a rounding of it) the LP again with every rank's connection
    ends capped at each share of :data:`ENDS_SHARES` of the busiest rank's (:func:`tree_ends`,
    :func:`pack_root_trees`' ``ends``), each made once; then for every stream count per root of
    :data:`STREAMS`, fewest first, the first of those LPs whose rounding ``engine(rows)`` accepts
    (None: every rounding is accepted), until :data:`REFUSED_STREAMS` stream counts in a row are
    refused by all of them. Where a stream count's rounding misses the LP by more than
    :data:`.rounding.ROUND_TOL` or is refused, its integral packing too (:func:`_integral_program`,
    at most :data:`INTEGRAL_COUNTS` counts a root count, stopping within :data:`INTEGRAL_TOL` of the
    LP). Per root count the accepted program fastest in the link model is a candidate."""
    from hccc.compiler.synth.packing import _resources

    n = net.nranks
    cap = _resources(net, np.asarray(net.bw if pair_bw is None else pair_bw, float))
    made, why = [], []
    # an integral packing near the LP's time made for fewer roots (INTEGRAL_TOL): more roots'
    # integral packings could gain little in the link model, and are not sought (64 GPUs, 8 roots:
    # 100 s of cut rounds without an integral point)
    reached = False
    for k in root_counts:
        if k >= n:
            continue
        if clock.now() > deadline:
            why.append(f"{k} roots: not made: time limit")
            continue
        cut: list = []
        roots = spread_roots(net, k)
        try:
            lps = [pack_root_trees(net, roots, pair_bw=pair_bw, deadline=deadline)]
        except ValueError as exc:          # a root no tree spans (PackingError)
            why.append(f"{k} roots: {str(exc).splitlines()[0]}")
            continue
        busiest = float(tree_ends(lps[0]).max())
        shares = (None,) + ENDS_SHARES
        best, refused, integral_done, tried = None, 0, False, 0
        cut_sets: list = []         # the cut conditions the integral packings of these roots found
        for s in STREAMS:
            kc = chunks_for(n, k, s)
            if not kc:
                continue
            b = n * kc // (k * s)
            got = None
            for i, share in enumerate(shares):
                if i == len(lps):
                    if clock.now() > deadline:
                        cut.append(f"{k} roots: the LP with the ends capped at {share} not made")
                        break
                    lps.append(pack_root_trees(net, roots, pair_bw=pair_bw, deadline=deadline,
                                               ends=np.full(n, busiest * share)))
                rt = lps[i]
                counts = round_root_trees(rt, s)
                rows = root_tree_rows(rt, counts, b)
                if engine is None or engine(rows) is None:
                    # accepted: the MILP's counts where faster and accepted too (the MILP only
                    # where the engine took the repaired counts: about half a second a call on
                    # 24 GPUs)
                    if clock.now() >= deadline:
                        cut.append(f"{k} roots, {s} streams: the MILP rounding not tried")
                    better = milp_rounding(rt, s, counts) if clock.now() < deadline else None
                    if better is not None:
                        rows2 = root_tree_rows(rt, better, b)
                        if engine is None or engine(rows2) is None:
                            counts, rows = better, rows2
                    got = RootTreeProgram(rows, kc, roots, s, b, share, rounded_time(rt, counts, s) / k)
                    break
            exact = None
            short = got is None or got.seconds_per_byte * k > lps[0].lp_time * (1 + ROUND_TOL)
            if tried < INTEGRAL_COUNTS and not reached and short:
                if clock.now() >= deadline:
                    cut.append(f"{k} roots, {s} streams: the integral packing not tried")
                else:
                    tried += 1
                    exact = _integral_program(net, lps[0], s, cap, deadline=deadline, engine=engine, kc=kc, b=b,
                                              sets=cut_sets)
                    if exact is None and clock.now() >= deadline:
                        cut.append(f"{k} roots, {s} streams: the integral packing cut short")
            if exact is not None and (got is None or exact.seconds_per_byte < got.seconds_per_byte * (1 - 1e-9)):
                got = exact
                # the fewest streams whose integral packing comes near the LP: more cost thread
                # blocks, fewer chunk ids a stream, and the time of their programs (INTEGRAL_TOL)
                integral_done = exact.seconds_per_byte * k <= lps[0].lp_time * (1 + INTEGRAL_TOL)
            refused = 0 if got is not None else refused + 1
            if got is not None and (best is None or got.seconds_per_byte < best.seconds_per_byte * (1 - 1e-9)):
                best = got
            if refused >= REFUSED_STREAMS or integral_done:
                break
            if clock.now() > deadline:
                if s != STREAMS[-1]:
                    cut.append(f"{k} roots: more than {s} streams not tried")
                break
        if best is None:
            why.append(f"{k} roots: not made: time limit" if cut else
                       f"{k} roots: {'the engine refuses' if engine is not None else 'no rounding of'} every stream count")
            continue
        best.cut = cut
        reached = reached or integral_done
        made.append(best)
    made.sort(key=lambda p: p.seconds_per_byte)
    return made, why


def _integral_program(net: Network, rt: RootTrees, streams: int, cap: np.ndarray, *, deadline: float, engine,
                      kc: int, b: int, sets: list) -> RootTreeProgram | None:
    """The integral packing of ``streams`` streams per root over the pairs of ``rt``'s trees
    (:func:`.root_branchings.integral_root_trees`) as a program ``engine`` accepts (None: any): as
    packed, else with every rank's connection ends capped at each share of :data:`ENDS_SHARES` of
    the busiest rank's in the refused packing; None where none is found or accepted. ``sets``: the
    cut conditions found for these roots so far, passed on (:func:`.root_branchings.root_arcs`)."""
    from hccc.compiler.synth.root_branchings import integral_root_trees

    k = rt.roots.size
    ends, busiest = None, None
    for share in (None,) + ENDS_SHARES:
        if share is not None:
            if clock.now() >= deadline:
                return None
            ends = np.full(rt.nranks, np.floor(busiest * share))
        got = integral_root_trees(net, rt, streams, cap, deadline=deadline, ends=ends, sets=sets)
        if got is None:
            return None
        it, counts = got
        rows = root_tree_rows(it, counts, b)
        if engine is None or engine(rows) is None:
            return RootTreeProgram(rows, kc, rt.roots, streams, b, share, rounded_time(it, counts, streams) / k,
                                   integral=True)
        if busiest is None:
            busiest = float((tree_ends(it) * streams).max())
    return None


def root_tree_candidates(topo, *, deadline: float, engine=None) -> tuple[list, list]:
    """:func:`root_tree_programs` on the cluster ``topo`` (its pairs at the rates the simulator
    runs them) as the selection's candidates: :class:`~.collectives.SynthResult` AllReduce
    programs (``detail["method"]`` ``root trees``; ``engine_fitted`` where ``engine`` weighed
    them), fastest in the link model first, and why others were not made."""
    from hccc.compiler.synth.collectives import SynthResult
    from hccc.compiler.synth.forest import _distance_bound
    from hccc.compiler.synth.packing import pair_bandwidth
    from hccc.compiler.synth.problem import network_from_topology

    from hccc.compiler.synth.forest import blocks_per_rank, resident_blocks

    t0 = clock.now()
    net = network_from_topology(topo)
    most = resident_blocks(topo.rank_vendor)

    def check(rows) -> str | None:
        # the engine's limits where given, else hccc's own: every thread block resident at once
        if engine is not None:
            return engine(rows)
        busiest = int(blocks_per_rank(rows, net.nranks).max())
        return None if most is None or busiest <= most else f"{busiest} thread blocks on a rank, {most} resident"
    progs, why = root_tree_programs(net, pair_bw=pair_bandwidth(topo), deadline=deadline, engine=check)
    lb = 2 * _distance_bound(net)
    out = []
    for p in progs:
        detail = {"method": "root trees", **p.detail, "engine_fitted": engine is not None}
        if p.cut:
            detail["time_limit_cut"] = list(p.cut)
        steps = int(p.rows[:, 2].max()) + 1 if len(p.rows) else 0
        out.append(SynthResult("allreduce", net.nranks, p.chunks_per_rank, None, p.rows, steps, min(lb, steps), [],
                               clock.now() - t0, net.name, detail=detail))
    return out, why


__all__ = ["root_tree_candidates", "CHUNKS_PER_RANK", "ENDS_SHARES", "INTEGRAL_COUNTS", "INTEGRAL_TOL", "REFUSED_STREAMS", "STREAMS", "chunks_for", "milp_rounding", "tree_ends", "with_end_groups", "ROOT_COUNTS", "RootTreeProgram", "RootTrees", "pack_root_trees",
           "root_tree_programs", "root_tree_rows", "round_root_trees", "rounded_time", "spread_roots"]
