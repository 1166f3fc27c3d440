"""Throughput-optimal AllGather / ReduceScatter by packing spanning trees (bandwidth regime).

For a large buffer only bandwidth matters: an AllGather is ``N`` broadcasts, rank ``r`` sending its
``M/N`` bytes to every other rank, and a broadcast pipelined down a spanning out-tree moves its data
at the rate the tree is given on every arc. A *packing* gives every rank's data a weighted set of
out-trees rooted at it (weights summing to 1: the share of the rank's data each tree carries); with
``T`` the time of the whole collective, the load each tree puts on a pair ``u -> v`` (and on every
shared group the pair runs through) is ``weight * (M/N) / T`` bytes/s, which must fit the pair's and
the groups' bandwidth. The least ``T`` is a linear program over trees:

    minimise T   s.t.   sum_{t rooted at r} y_t = 1            for every rank r
                        sum_t y_t * uses_e(t) <= T * cap_e      for every pair and group e

solved by **column generation**: the LP over the trees found so far (HiGHS, one model kept between
the rounds, :mod:`.master_lp`) prices resources with its duals ``pi_e``; a tree rooted at ``r``
improves the LP iff its cost ``sum_{e in t} pi_e`` is below the dual ``lambda_r`` of ``r``'s row,
and the cheapest tree of every root is a minimum-cost spanning arborescence (Chu-Liu/Edmonds,
:func:`.arborescence.min_arborescence`, arc costs ``pi_pair + sum of pi_group`` over the pair's groups). Every
round also gives a lower bound (the Lagrangian ``sum_r min_t pi(t) / sum_e pi_e cap_e``), and the
loop stops when the LP is within ``tol`` of it, or of the cut bound (:mod:`.bounds`), which no
schedule beats (on most networks the two meet: Edmonds' branching theorem, extended to balanced
switches by edge splitting, as in ForestColl; see *Optimality* below where they do not).

**Integral chunks.** A ResCCLang program has ``K`` equal chunks per rank; each chunk follows one
tree, so the fractional weights are rounded to multiples of ``1/K`` (largest remainder) and then
repaired locally (a chunk moves to another generated tree of its root while that lowers the most
loaded resource); where that misses, chunks are moved one at a time onto the cheapest tree of their
root at prices exponential in the rounded loads, trees never generated included (:meth:`.rounding._Rounding._regrown`,
cheap); where that misses too, a small mixed-integer program picks the counts over
the LP's trees (:func:`.rounding._milp_counts`, a node limit per ``K`` and a few seconds in all; it stops at
the first counts within ``round_tol`` of the LP, the rounding's own acceptance test), kept where
it beats the regrown counts.
``K`` is the smallest candidate (:data:`.rounding.CHUNK_CANDIDATES` and the common denominator of the LP's
weights) whose rounded time is within ``round_tol`` of the LP's, or where none is, the smallest
within ``round_tol`` of the best rounding: few chunks per rank mean few streams, so the program's
thread blocks stay resident without sharing channels, and fewer transfers.

**Optimality.** Every byte of a rank's data reaches every other rank, the first copy at each from a
rank that held it, so any store-and-forward schedule's loads contain a packing of spanning trees:
the LP's optimum is the least time of any schedule in this model (the *packing bound*,
:func:`hccc.compiler.synth.bounds.packing_bound_seconds`), which can lie above the cut bound where
a shared group feeds several ranks that must each get the data (docs/bounds.md).

**ReduceScatter** is the time-reverse: the packing on the transposed network gives in-trees; each
chunk's partial sums flow leaves-to-owner with ``rrc``, children of a rank reducing into it at
distinct steps (two reductions into one (rank, chunk) never share a step).

:func:`pack_trees` returns a :class:`.packing.Packing`; :mod:`.tree_rows` turns it into transfer rows.

**Modules.** This module runs the packing (:func:`_pack`: the LP, then its rounding, or the LP
over classes of ranks first, :func:`_pack_by_classes`) and names the collectives it builds; the
parts are modules of their own: :mod:`.packing` (the types, options and resources),
:mod:`.arborescence` (Chu-Liu/Edmonds), :mod:`.packing_lp` (the LP and its column generation),
:mod:`.rounding` (whole chunks), :mod:`.balancing` (chunks moved between trees),
:mod:`.tree_shapes` (trees reshaped) and :mod:`.tree_rows` (transfer rows).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.synth.packing import Packing, PackOptions
from hccc.compiler.synth.packing_lp import (LP_TOL, _Columns, _column_generation, _columns, _initial_columns,
                                            _LPSolution, _support_translates)
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.rounding import CHUNK_CANDIDATES, ROUND_MILP_SECONDS, ROUND_TOL, _Rounding
from hccc.util import clock


def pack_trees(net: Network, *, pair_bw: np.ndarray | None = None, bound: float | None = None,
               max_chunks: int | None = None, min_chunks: int = 1, time_limit: float = 60.0, tol: float = LP_TOL,
               round_tol: float = ROUND_TOL, symmetry: bool = True, exact: dict | None = None,
               options: PackOptions | None = None) -> Packing:
    """The least-time tree packing of an AllGather on ``net`` (:func:`_pack`); ``exact``: the integral
    packings another packing of the same network found (its ``Packing.exact``), reused; ``options``:
    :class:`PackOptions` (default: the module's)."""
    return _pack(net, pair_bw=pair_bw, bound=bound, max_chunks=max_chunks, min_chunks=min_chunks,
                 time_limit=time_limit, tol=tol, round_tol=round_tol, symmetry=symmetry, exact=exact,
                 options=options)[0]


def pack_allreduce(net: Network, *, pair_bw: np.ndarray | None = None, max_chunks: int | None = None,
                   min_chunks: int = 1, time_limit: float = 60.0, tol: float = LP_TOL, round_tol: float = ROUND_TOL,
                   symmetry: bool = True, options: PackOptions | None = None) -> tuple[Packing, Packing]:
    """An AllReduce's ReduceScatter and AllGather packed together, to run at once: the least
    ``T`` such that every rank's data has out-trees (its AllGather) and in-trees (its
    ReduceScatter) whose loads *together* fit every pair and shared group in ``T`` (the LP of the
    module docstring with two rows per rank, in-trees priced as arborescences of the transposed
    network). No worse than the two packed apart (their trees fit in the sum of their times), and
    better where the two halves' bottlenecks differ: the ReduceScatter's in-trees load the links
    into a cut, the AllGather's out-trees the links out of it. Returns ``(allgather,
    reducescatter)``: the out-trees on ``net`` and the in-trees as out-trees of
    ``net.transposed()`` (as :func:`pack_trees` packs each), both with the joint time and loads."""
    return _pack(net, pair_bw=pair_bw, bound=None, max_chunks=max_chunks, min_chunks=min_chunks,
                 time_limit=time_limit, tol=tol, round_tol=round_tol, symmetry=symmetry, joint=True, options=options)


def _pack_by_classes(net: Network, cs: _Columns, sol: _LPSolution, t0: float, deadline: float, common: dict):
    """The classes' LP (``sol``, over ``cs``'s kinds of node) turned into packings: its trees under
    every element fixing their root seed the LP of translates, rounded per representative; where
    that rounds only at many chunks per rank or not within the tolerance at all (or the cluster is
    small), also the LP over every root (seeded with that LP's trees), the better rounding kept."""
    group, reps = cs.group, cs.reps
    seeds = _support_translates(cs, sol.y, lambda r: cs.perms[cs.perms[:, r] == r])
    class_s = clock.now() - t0
    common = dict(common, bound=max(sol.lower_bound / cs.scale, common["bound"] or 0.0), symmetry=False)
    out = _pack(net, time_limit=max(0.0, deadline - clock.now()), seed=seeds,
                translate={r: group.kind_elements(r) for r in reps.tolist()}, **common)
    how = "translates"
    k_cls = out[0].chunks_per_rank
    n = net.nranks
    opt = common["options"]
    p0 = out[0]
    short = p0.rounded_time > p0.lp_time * (1 + common["round_tol"])    # no K within the tolerance
    if (k_cls > opt.seed_every_root_above or (1 < k_cls or short) and n <= opt.every_root_ranks) and \
            deadline > clock.now():
        # a representative's K chunks go to its whole class alike; where that rounds only at
        # many chunks per rank, or not within the tolerance at the chunks allowed (one chunk per
        # rank on two NVSwitch nodes of unlike ports: 0.288 of the bound over translates, 0.989
        # over every root), or the cluster is small, the LP over every root (seeded with the
        # translates of that LP's trees, an optimal solution) rounds each rank apart, often at fewer
        alt = _pack(net, time_limit=max(0.0, deadline - clock.now()), seed=out[0].lp_support, **common)

        def rank(pk):
            p = pk[0]
            return (p.rounded_time > p.lp_time * (1 + common["round_tol"]), p.chunks_per_rank, p.rounded_time)
        if rank(alt) < rank(out):
            out, how = alt, "every root"
    for packing in out:
        packing.seconds = clock.now() - t0
        packing.stats.update(symmetry=cs.perms.shape[0], classes=int(reps.size), class_lp_rows=cs.norbits,
                             class_lp_rounds=sol.rounds, class_lp_time=sol.value / cs.scale,
                             class_lp_s=round(class_s, 3), seeds=len(seeds), rounded_over=how)
    return out


def _pack(net: Network, *, pair_bw: np.ndarray | None = None, bound: float | None = None,
          max_chunks: int | None = None, min_chunks: int = 1, time_limit: float = 60.0, tol: float = LP_TOL,
          round_tol: float = ROUND_TOL, symmetry: bool = True, joint: bool = False, seed: list | None = None,
          translate: dict | None = None, exact: dict | None = None, options: PackOptions | None = None):
    """The least-time tree packing of an AllGather on ``net`` (see the module docstring): the
    column generation to a fractional packing (:func:`_column_generation`), then its rounding to
    whole chunks (:class:`_Rounding`).

    ``pair_bw``: bytes/s of every pair (default ``net.bw``); ``bound``: a proven lower bound in
    seconds per byte of each rank's data (the cut bound), used to stop early; ``max_chunks``: the
    largest chunks per rank the rounding may use.

    ``symmetry``: on clusters of identical nodes (:func:`node_symmetry`) only one root per class of
    equivalent ranks is solved: a packing that gives every translate of a representative's trees to
    the translated root loads every resource of an orbit alike, ``|t & O| |G| / |O|`` for a tree
    ``t``, the orbit ``O`` and the group ``G``, so the LP has a row per resource orbit and trees
    for the representatives only; the trees of the other ranks are the translates. Where the nodes
    come in several kinds (:func:`.symmetry.class_symmetry`, a group that does not act freely) a
    tree of root ``r`` stands for its translates spread over ``r``'s class, so its load on an orbit
    member is ``|t & O| |C_r| / |O|``; that LP's optimum is the full LP's (average any packing over
    the group). Its trees then seed (``seed``: ``(root, parents, in-tree)`` columns) the LP whose
    columns are a representative's tree with its translates by its own kind's elements, which act
    on the class freely (``translate``: representative -> those rank permutations): its rows are
    the resources themselves, its optimum again the full one's (the seeds are the representatives'
    trees under every element that fixes them, so the averaged packing is among its solutions), it
    needs about one round, and its integral counts of K chunks per representative give every rank
    of the class K chunks."""
    t0 = clock.now()
    n, P = net.nranks, net.npairs
    if n < 2:
        empty = Packing(n, 1, [], [], [], 0.0, 0.0, 0.0, 0, 0, 0.0, np.zeros(P), {}, np.zeros(0), np.zeros(0))
        return (empty, empty) if joint else (empty,)
    bw = np.asarray(net.bw if pair_bw is None else pair_bw, float)
    options = PackOptions() if options is None else options
    cs = _columns(net, bw, symmetry, joint, translate, options)
    if exact is None:
        # integral packings at a chunk count (:mod:`.branchings`), shared with the LPs this one
        # seeds: the network's automorphisms (their multiplicities alike on a pair orbit), the cut
        # conditions found so far, the time and multiplicities found per K, the trees grown on
        # them per K, the seconds spent finding them
        exact = {"perms": None if cs.group is None else cs.group.ranks, "sets": [], "found": {}, "grown": {},
                 "spent": 0.0}
    _initial_columns(cs, seed)
    deadline = t0 + float(time_limit)
    sol = _column_generation(cs, bound, tol, deadline)
    if cs.seeding:
        common = dict(pair_bw=bw, bound=bound, max_chunks=max_chunks, min_chunks=min_chunks, tol=tol,
                      round_tol=round_tol, joint=joint, exact=exact, options=options)
        return _pack_by_classes(net, cs, sol, t0, deadline, common)
    rounding = _Rounding(cs, sol, joint=joint, round_tol=round_tol, deadline=deadline, exact=exact,
                         lp_s=clock.now() - t0, options=options)
    return rounding.finish(max_chunks or CHUNK_CANDIDATES[-1], min_chunks,
                           clock.now() + min(ROUND_MILP_SECONDS, max(0.0, deadline - clock.now())))


#: collectives the AllGather packing builds (:mod:`.forest`)
PACKED_COLLECTIVES = ("allgather", "reducescatter", "allreduce")
#: collectives the tree method builds: those, and Broadcast by its root's trees (:mod:`.broadcast_trees`)
TREE_COLLECTIVES = PACKED_COLLECTIVES + ("broadcast",)


def channels_for(net: Network, packing: Packing, data_bytes_per_rank: float, seconds: float,
                 *, block_gbps: float, reverse: bool = False) -> int:
    """Blocks per thread block so that no connection's planned rate exceeds what its blocks move:
    the planned bytes/s of the busiest pair over ``block_gbps`` (at least 1, at most the IR's
    maximum). A connection's traffic runs on thread blocks of its own unless the compiler shares
    one between connections whose spans do not overlap, so the busiest pair's rate is what one
    thread block must sustain."""
    if seconds <= 0:
        return 1
    # pair_load: bytes per pair per byte of every rank's data
    return blocks_at(float((packing.pair_load * data_bytes_per_rank / seconds).max()), block_gbps)


def blocks_at(rate: float, block_gbps: float) -> int:
    """Blocks a thread block needs to move ``rate`` bytes/s at ``block_gbps`` GB/s a block, with 5 %
    to spare: at least 1, at most the IR's maximum (1 without a per-block rate)."""
    from hccc.compiler.ir.program_ir import MAX_CHANNELS

    if rate <= 0 or not block_gbps:
        return 1
    return int(min(MAX_CHANNELS, max(1, int(np.ceil(rate / (block_gbps * 1e9) * 1.05)))))
