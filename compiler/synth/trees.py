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
:func:`min_arborescence`, arc costs ``pi_pair + sum of pi_group`` over the pair's groups). Every
round also gives a lower bound (the Lagrangian ``sum_r min_t pi(t) / sum_e pi_e cap_e``), and the
loop stops when the LP is within ``tol`` of it, or of the cut bound (:mod:`.bounds`), which no
schedule beats (on most networks the two meet: Edmonds' branching theorem, extended to balanced
switches by edge splitting, as in ForestColl; see *Optimality* below where they do not).

**Integral chunks.** A ResCCLang program has ``K`` equal chunks per rank; each chunk follows one
tree, so the fractional weights are rounded to multiples of ``1/K`` (largest remainder) and then
repaired locally (a chunk moves to another generated tree of its root while that lowers the most
loaded resource); where that misses, chunks are moved one at a time onto the cheapest tree of their
root at prices exponential in the rounded loads, trees never generated included (:meth:`_Rounding._regrown`,
cheap); where that misses too, a small mixed-integer program picks the counts over
the LP's trees (:func:`_milp_counts`, a node limit per ``K`` and a few seconds in all; it stops at
the first counts within ``round_tol`` of the LP, the rounding's own acceptance test), kept where
it beats the regrown counts.
``K`` is the smallest candidate (:data:`CHUNK_CANDIDATES` and the common denominator of the LP's
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

:func:`pack_trees` returns a :class:`Packing`; :func:`allgather_rows`, :func:`reducescatter_rows`
and :func:`loop_rows` turn it into transfer rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.compiler.synth.master_lp import MasterLP
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.symmetry import Symmetry, class_symmetry, node_symmetry, period_symmetry
from hccc.util import clock
from hccc.util.native_output import silenced

#: the LP stops when within this factor of its lower bound (Lagrangian or cut bound)
LP_TOL = 2e-4
#: chunk counts tried when rounding, smallest first
CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: rounded packings within this factor of the LP time are accepted
ROUND_TOL = 5e-3
#: seconds the integral rounding (:func:`_milp_counts`) may spend over all chunk counts tried: a
#: guard only, as :data:`ROUND_MILP_EACH`
ROUND_MILP_SECONDS = 30.0
#: seconds it may spend on one chunk count: a guard only, the node limit
#: (:data:`ROUND_MILP_NODES`) decides, so that the counts do not depend on the machine's speed or
#: load (where the guard ends a program first, the report says so: ``time_limit_cut``). Where it
#: finds counts at all it does so within a few hundredths of a second; proving that none fits takes
#: up to 2.5 s of CPU at the node limit (64 heterogeneous V100s, ``synth_scale.py``'s POD64, joint
#: AllReduce at 6 and 8 chunks per rank: 2.2 and 2.5 s of CPU, 16 and 21 s of wall time on a
#: loaded 2-core machine), so the former 0.5 s ended such programs by the clock on any machine
ROUND_MILP_EACH = 5.0
#: the exponents (times the LP time) of the regrowing's load prices, one sweep each
#: (:meth:`_Rounding._regrown`), and the passes over every chunk each may make
REGROW_ALPHAS = (16.0, 64.0)
REGROW_PASSES = 3
#: branch-and-bound nodes the rounding's program may explore per chunk count (deterministic)
ROUND_MILP_NODES = 40
#: the most generated trees the rounding's program chooses among
MILP_COLUMNS = 300
#: trees a packing prices with the numpy formulation of Chu-Liu/Edmonds on matrices below
#: :data:`~hccc.compiler.synth.edmonds_kernel.MIN_COMPILED_RANKS` ranks; the rest run compiled
#: (a 32-rank matrix: 80-600 us numpy, about 10 us compiled; loading the kernel costs about what these
#: numpy calls do, and two MI250 nodes price 19,000 trees)
PRICED_PLAIN = 256
#: with classes of several kinds of node, the LP over every root is also rounded where the LP of
#: translates needs more chunks per rank than this, or has at most :data:`EVERY_ROOT_RANKS` ranks
#: (and more than one chunk per rank), where that LP takes well under a second
SEED_EVERY_ROOT_ABOVE = 8
EVERY_ROOT_RANKS = 32


@dataclass(frozen=True)
class PackOptions:
    """The choices of a packing a caller may set instead of the module's defaults (each field's
    default is its module constant, read when the options are made, where its measurement is
    written): the regrowing's exponents (``()``: no regrowing), the trees priced with the plain
    formulation before the compiled one, the MILP's seconds per chunk count, when a classes'
    packing is also rounded over every root, whether rail trees join the columns, and whether
    integral trees (:mod:`.branchings`) are sought where the LP's trees round badly."""

    regrow_alphas: tuple = field(default_factory=lambda: REGROW_ALPHAS)
    priced_plain: int = field(default_factory=lambda: PRICED_PLAIN)
    round_milp_each: float = field(default_factory=lambda: ROUND_MILP_EACH)
    seed_every_root_above: int = field(default_factory=lambda: SEED_EVERY_ROOT_ABOVE)
    every_root_ranks: int = field(default_factory=lambda: EVERY_ROOT_RANKS)
    rails: bool = True
    integral: bool = True


class PackingError(ValueError):
    """The network admits no spanning tree from some rank (it is not strongly connected)."""


# ---------------------------------------------------------------- minimum arborescence
def min_arborescence(cost: np.ndarray, root: int, many: bool = False) -> np.ndarray:
    """``parent[v]`` of a minimum-cost spanning arborescence rooted at ``root`` (``parent[root] =
    -1``) of the dense arc-cost matrix ``cost[u, v]`` (``inf``: no arc). Chu-Liu/Edmonds: every
    vertex takes its cheapest entering arc; cycles are contracted (entering costs reduced by the
    cycle arc they would replace) and the contracted problem solved recursively, then expanded.
    Large matrices run compiled (:mod:`hccc.compiler.synth.edmonds_kernel`, the same steps), and
    any matrix where the caller will solve ``many`` (where loading the kernel pays for itself)."""
    C = np.array(cost, dtype=float, copy=True)
    np.fill_diagonal(C, np.inf)
    C[:, root] = np.inf
    from hccc.compiler.synth.edmonds_kernel import MIN_COMPILED_RANKS, compiled_edmonds

    kernel = compiled_edmonds(max(C.shape[0], MIN_COMPILED_RANKS if many else 0))
    if kernel is None:
        return _edmonds(C, int(root))
    par = kernel(C, int(root))
    if par[0] <= -2:
        raise PackingError(f"vertex {-2 - int(par[0])} cannot be reached")
    return par


def _edmonds(C: np.ndarray, root: int) -> np.ndarray:
    n = C.shape[0]
    par = C.argmin(axis=0)
    inc = C[par, np.arange(n)]
    par[root] = -1
    inc[root] = 0.0
    if not np.isfinite(inc).all():
        v = int(np.flatnonzero(~np.isfinite(inc))[0])
        raise PackingError(f"vertex {v} cannot be reached")
    # cycles of the parent function, by pointer jumping: P^(2^k) (2^k >= n) maps every vertex onto
    # its terminal cycle (the root's self-loop, or a cycle), and is a bijection on each cycle, so
    # its image is the set of cycle vertices; a cycle's id is its least vertex
    P = par.copy()
    P[root] = root
    J = P.copy()
    low = np.minimum(np.arange(n), P)
    for _ in range(max(1, int(np.ceil(np.log2(max(n, 2)))))):
        low = np.minimum(low, low[J])
        J = J[J]
    on = np.zeros(n, bool)
    on[J] = True
    on[root] = False
    cyc_id = np.full(n, -1, np.int64)
    ncyc = 0
    if on.any():
        ids, inv = np.unique(low[on], return_inverse=True)
        cyc_id[on] = inv.reshape(-1)
        ncyc = int(ids.size)
    if ncyc == 0:
        return par
    # contract: singletons keep one vertex each, then one vertex per cycle
    single = np.flatnonzero(cyc_id < 0)
    m = single.size + ncyc
    comp = np.empty(n, np.int64)
    comp[single] = np.arange(single.size)
    comp[cyc_id >= 0] = single.size + cyc_id[cyc_id >= 0]
    A = C - np.where(cyc_id >= 0, inc, 0.0)[None, :]     # entering a cycle vertex replaces its arc
    # column groups: min over the members of each target component (argmin kept)
    M1 = np.empty((n, m))
    a1 = np.empty((n, m), np.int64)
    M1[:, :single.size] = A[:, single]
    a1[:, :single.size] = single[None, :]
    members = [np.flatnonzero(cyc_id == c) for c in range(ncyc)]
    for c, mem in enumerate(members):
        sub = A[:, mem]
        j = sub.argmin(axis=1)
        M1[:, single.size + c] = sub[np.arange(n), j]
        a1[:, single.size + c] = mem[j]
    M2 = np.empty((m, m))
    a2 = np.empty((m, m), np.int64)
    M2[:single.size] = M1[single]
    a2[:single.size] = single[:, None]
    for c, mem in enumerate(members):
        sub = M1[mem]
        i = sub.argmin(axis=0)
        M2[single.size + c] = sub[i, np.arange(m)]
        a2[single.size + c] = mem[i]
    np.fill_diagonal(M2, np.inf)
    croot = int(comp[root])
    M2[:, croot] = np.inf
    cpar = _edmonds(M2, croot)
    out = par.copy()
    for b in range(m):
        a = int(cpar[b])
        if a < 0:
            continue
        u = int(a2[a, b])
        v = int(a1[u, b])
        out[v] = u                    # the arc entering component b; the cycle keeps its other arcs
    out[root] = -1
    return out


# ---------------------------------------------------------------- the packing LP
@dataclass
class Packing:
    """Trees per root with integral chunk counts (``counts[i]`` of ``chunks_per_rank`` chunks of
    ``roots[i]`` follow ``parents[i]``), and the LP's figures (times for a unit of data per rank:
    multiply by the bytes per rank, ``M/N``)."""

    nranks: int
    chunks_per_rank: int
    roots: list[int]
    parents: list[np.ndarray]
    counts: list[int]
    lp_time: float            # LP optimum, seconds per byte of each rank's data
    lower_bound: float        # the best lower bound proven (cut bound or Lagrangian), same unit
    rounded_time: float       # with the integral chunk counts, same unit
    iterations: int
    columns: int
    seconds: float
    pair_load: np.ndarray = field(repr=False, default=None)  # bytes per pair per byte of each rank's data
    stats: dict = field(default_factory=dict)
    res_load: np.ndarray = field(repr=False, default=None)   # per resource (pairs, groups), normalised
    res_limit: np.ndarray = field(repr=False, default=None)  # time x capacity per resource, normalised
    #: the symmetry the trees follow (None: none): trees come in runs of ``len(symmetry)``, the
    #: translates of a representative by every element in order, with equal counts
    symmetry: Symmetry | None = field(repr=False, default=None)
    #: ``reround(max_chunks)``: the same LP's trees rounded to at most ``max_chunks`` chunks per
    #: rank, without solving the LP again (a tuple: the AllGather and ReduceScatter packings of a
    #: joint packing, else one packing); None where not kept
    reround: Callable | None = field(repr=False, default=None, compare=False)
    #: the LP's trees of positive weight as ``(root, parents, in-tree)`` for every root, where the
    #: LP was over representatives and their translates (they seed the LP over every root)
    lp_support: list | None = field(repr=False, default=None, compare=False)
    #: where the trees are integral ones (:mod:`.branchings`, ``stats["integral"]``): the LP's own
    #: trees rounded (what the packing is without them), which can run faster where the integral
    #: trees, filling every resource, grow deep (the simulator decides; see ``forest``)
    alternative: "Packing | None" = field(repr=False, default=None, compare=False)
    #: the integral packings found while rounding (``_pack``'s cache: per chunk count, the cut
    #: conditions, the time spent), for another packing of the same network (:func:`pack_trees`)
    exact: dict | None = field(repr=False, default=None, compare=False)

    @property
    def load_time(self) -> float:
        """The time of the trees' loads in the link model, same unit: :attr:`rounded_time`, or less
        where :func:`shaped` made the most loaded resource lighter."""
        if self.res_load is None or self.res_limit is None:
            return self.rounded_time
        ok = self.res_limit > 0
        if not ok.any():
            return self.rounded_time
        return self.rounded_time * float((self.res_load[ok] / self.res_limit[ok]).max())

    @property
    def fraction(self) -> float:
        """Bound / rounded time: the share of the optimum the integral packing reaches (model)."""
        return self.lower_bound / self.rounded_time if self.rounded_time > 0 else 1.0


def _resources(net: Network, pair_bw: np.ndarray):
    """Resource capacities (pairs then groups, bytes/s) and the pair -> groups CSR."""
    gbw = net.gbw if net.gbw is not None else np.zeros(net.ngroups)
    cap = np.concatenate([np.asarray(pair_bw, float), np.asarray(gbw, float)])
    return cap


def pair_incidence(net: Network, nres: int):
    """The sparse (pairs x resources) incidence of :func:`_resources`' resources: every pair on
    itself and on each of its shared groups (a pair's price is ``incidence @ prices``)."""
    from scipy import sparse

    P = net.npairs
    rp, rg = net.pair_group_rows()
    return sparse.csr_matrix((np.ones(P + rp.size), (np.r_[np.arange(P), rp], np.r_[np.arange(P), P + rg])),
                             shape=(P, nres))


def pair_cost_matrix(net: Network, bw: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``C[u, v]``: the cost ``w`` of pair ``u -> v`` (infinite where there is none or it has no
    bandwidth ``bw``), for :func:`min_arborescence`."""
    n = net.nranks
    C = np.full((n, n), np.inf)
    C[net.psrc, net.pdst] = np.where(bw > 0, w, np.inf)
    return C


def _tree_pairs(net: Network, parent: np.ndarray, root: int) -> np.ndarray:
    v = np.flatnonzero(parent >= 0)
    idx = net.pair_index(parent[v], v)
    if (idx < 0).any():
        raise PackingError("a tree uses an arc that is not a pair of the network")
    return idx


def _tree_column(net: Network, pairs: np.ndarray) -> np.ndarray:
    """Resource ids a tree's pairs occupy, with multiplicity (a group counted once per pair): the
    pairs, then their groups in pair order."""
    pairs = np.asarray(pairs, np.int64)
    lo = net.pg_ptr[pairs]
    cnt = net.pg_ptr[pairs + 1] - lo
    tot = int(cnt.sum())
    if not tot:
        return pairs.copy()
    start = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
    return np.concatenate([pairs, net.npairs + net.pg_idx[start + np.arange(tot)].astype(np.int64)])


def _rails(net: Network) -> tuple[np.ndarray, list] | None:
    """Every rank's node and its *rail peers*: the ranks at the same place (local index, in rank
    order) in every other node, where the nodes have as many ranks each (None otherwise, or with
    one node). Rails need no NIC of their own: they only name which rank of another node a rail
    tree enters it by (:meth:`_Columns.price`)."""
    node = np.asarray(net.levels[0], np.int64) if net.levels else np.zeros(net.nranks, np.int64)
    sizes = np.bincount(node)
    if sizes.size < 2 or (sizes != sizes[0]).any():
        return None
    local = np.zeros(net.nranks, np.int64)
    at = {}
    for v in range(net.nranks):
        local[v] = at.get(int(node[v]), 0)
        at[int(node[v])] = local[v] + 1
    where = {(int(node[v]), int(local[v])): v for v in range(net.nranks)}
    peer = [np.array([where[(b, int(local[v]))] for b in range(sizes.size) if b != node[v]], np.int64)
            for v in range(net.nranks)]
    return node, peer


def _pair_matrix(net: Network) -> np.ndarray:
    """``m[u, v]``: the index of pair ``u -> v``, -1 where there is none."""
    m = np.full((net.nranks, net.nranks), -1, np.int64)
    m[net.psrc, net.pdst] = np.arange(net.npairs)
    return m



def _translates(E: np.ndarray, root: int, par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tree ``par`` rooted at ``root`` moved by every rank permutation in ``E``: the roots and
    the parent arrays of the images."""
    v = np.flatnonzero(par >= 0)
    tp = np.full((len(E), par.size), -1, np.int64)
    tp[np.arange(len(E))[:, None], E[:, v]] = E[:, par[v]]
    return E[:, root], tp


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


@dataclass
class _Columns:
    """The LP's setting and the trees generated so far (one packing's solver state).

    Resources are the network's pairs then its shared groups (capacities normalised by ``scale``);
    with a symmetry the LP's rows are resource *orbits* (``orb``: resource -> orbit, ``ocap`` an
    orbit's capacity, ``mult`` the load on each member per tree member in it, ``csize`` a root's
    class size) and only the representatives ``reps`` get trees. A column is a tree as the
    resource orbits it occupies, with multiplicity; ``translate`` (representative -> rank
    permutations) makes a column a representative's tree with all its translates."""

    net: Network
    bw: np.ndarray
    cap: np.ndarray
    capn: np.ndarray
    scale: float
    inc: object
    group: Symmetry | None
    lp_only: bool
    seeding: bool
    perms: np.ndarray
    orb: np.ndarray
    reps: np.ndarray
    mult: np.ndarray
    csize: np.ndarray
    ocap: np.ndarray
    kinds: tuple
    rails: tuple | None
    cross: np.ndarray | None       # arcs between nodes (where there are rails)
    translate: dict | None
    pair_img: dict
    cols: list = field(default_factory=list)        # resource orbits per column, with multiplicity
    col_root: list = field(default_factory=list)    # the root's row key: r, or n + r for an in-tree
    col_par: list = field(default_factory=list)
    col_of: dict = field(default_factory=dict)      # (root, in-tree, parents) -> column
    priced_plain: int = PRICED_PLAIN                # trees priced plain before compiled (:data:`PRICED_PLAIN`)
    priced: int = 0                                 # trees priced so far
    _arcs: tuple = (None, None, None)               # prices, kind, their arc matrix (:meth:`arcs`)

    @property
    def n(self) -> int:
        return self.net.nranks

    @property
    def norbits(self) -> int:
        return int(self.orb.max()) + 1

    def arc_matrix(self, w: np.ndarray, rev: bool) -> np.ndarray:
        """:func:`pair_cost_matrix`, transposed for an in-tree (an out-tree of the transposed network)."""
        C = pair_cost_matrix(self.net, self.bw, w)
        return C.T.copy() if rev else C

    def arcs(self, pi_o: np.ndarray, rev: bool) -> np.ndarray:
        """The arc costs at the prices ``pi_o`` of a tree whose root's class has one member (the
        costs of every root are these times its class size); kept for the next call at the same
        prices (every root of a round, a tree and its rail tree)."""
        if self._arcs[0] is not pi_o or self._arcs[1] != rev:
            self._arcs = (pi_o, rev, self.arc_matrix(self.inc @ (pi_o * self.mult)[self.orb], rev))
        return self._arcs[2]

    def price(self, pi_o: np.ndarray, r: int, rev: bool = False, rail: bool = False,
              many: bool = False) -> tuple[float, np.ndarray | None]:
        """The cheapest tree of root ``r`` at the resource prices ``pi_o`` and its cost; ``rail``:
        the cheapest *rail tree* (None where there is none), whose only arcs between nodes are
        from the root to its rail peers (:func:`_rails`): each other node gets the root's data
        once, on the root's own rail, and spreads it inside. A rail tree is a spanning tree like
        any other and joins the columns only where it prices below the root's dual, so the LP's
        optimum is unchanged; but where every rank's NIC is tight (a 16 GB/s NIC per GCD on
        MI250 nodes) the LP's own trees send some roots' data through other ranks' NICs and
        round to whole chunks one chunk over on a NIC, where rail trees fill each NIC exactly."""
        if rail and self.rails is None:
            return np.inf, None
        self.priced += 1
        many = many or self.priced > self.priced_plain
        if self.translate is not None:     # the tree's cost with all its translates
            w = self.inc @ (pi_o * self.mult)[self.orb]
            C = self.arc_matrix((w * self.csize[r])[self.pair_img[r]].sum(axis=0), rev)
        else:
            C = self.arcs(pi_o, rev) * self.csize[r]
        if rail:
            peer = self.rails[1]
            keep = C[r, peer[r]].copy()
            C[self.cross] = np.inf
            C[r, peer[r]] = keep
        try:
            par = min_arborescence(C, r, many)
        except PackingError:
            if not rail:
                raise
            return np.inf, None           # a node its rail peer cannot span, or no rail
        v = np.flatnonzero(par >= 0)
        return float(C[par[v], v].sum()), par

    def add(self, r: int, par: np.ndarray, rev: bool = False) -> bool:
        """Tree ``par`` of root ``r`` (``rev``: an in-tree) as a new column; False if it is one."""
        net = self.net
        key = (r, rev, par.tobytes())
        if key in self.col_of:
            return False
        self.col_of[key] = len(self.col_par)
        self.col_par.append(par)
        self.col_root.append(r + self.n * rev)
        if rev:
            v = np.flatnonzero(par >= 0)
            pairs = net.pair_index(v, par[v])
            if (pairs < 0).any():
                raise PackingError("a tree uses an arc that is not a pair of the network")
        else:
            pairs = _tree_pairs(net, par, r)
        if self.translate is not None:
            pairs = self.pair_img[r][:, pairs].ravel()
        self.cols.append(self.orb[_tree_column(net, pairs)])
        return True

    def unit_of(self, j: int) -> np.ndarray:
        """The load of column ``j`` on every resource orbit, per unit of its root's data."""
        row = np.zeros(self.norbits)
        c = self.cols[j]
        np.add.at(row, c, self.mult[c] * self.csize[self.col_root[j] % self.n])
        return row

    def root_of(self, j: int) -> tuple[int, bool]:
        """Column ``j``'s root and whether it is an in-tree."""
        rev = self.col_root[j] >= self.n
        return self.col_root[j] - self.n * rev, rev


def _columns(net: Network, bw: np.ndarray, symmetry: bool, joint: bool, translate: dict | None,
             options: PackOptions) -> _Columns:
    """The LP's setting for ``net`` at the pair bandwidths ``bw`` (:class:`_Columns`, no columns yet):
    the symmetry whose classes it solves (:func:`_pack`)."""
    n, P = net.nranks, net.npairs
    cap = _resources(net, bw)
    R = cap.size
    ok = cap > 0
    scale = float(cap[ok].max())
    group = node_symmetry(net, bw) if symmetry else None
    lp_only = seeding = False
    if group is None and symmetry:
        group = period_symmetry(net, bw)       # the LP's classes only: the packing has no loops
        lp_only = group is not None
    if group is None and symmetry and translate is None:
        group = class_symmetry(net, bw)        # classes whose trees seed the LP of translates
        seeding = group is not None
    pair_img = {}
    if translate is not None:
        # a column: a representative's tree and its translates, loads per resource
        perms, orb = np.arange(n)[None, :], np.arange(R)
        reps = np.array(sorted(translate), np.int64)
        for r, E in translate.items():
            pair_img[r] = net.pair_index(E[:, net.psrc].ravel(), E[:, net.pdst].ravel()).reshape(len(E), P)
    elif group is not None:
        perms, orb = group.ranks, group.orbits
        reps = np.unique(perms.min(axis=0))
    else:
        perms, orb, reps = np.arange(n)[None, :], np.arange(R), np.arange(n)
    RO = int(orb.max()) + 1
    # load on each member of an orbit per tree member in it: the root's class size over the orbit's
    csize = np.bincount(perms.min(axis=0), minlength=n)[perms.min(axis=0)].astype(float)
    first = np.full(RO, -1, np.int64)
    first[orb[::-1]] = np.arange(R)[::-1]
    capn = np.where(ok, cap / scale, 0.0)        # normalised capacities (LP conditioning)
    rails = _rails(net) if options.rails else None
    return _Columns(net=net, bw=bw, cap=cap, capn=capn, scale=scale, inc=pair_incidence(net, R), group=group,
                    lp_only=lp_only, seeding=seeding, perms=perms, orb=orb, reps=reps,
                    mult=1.0 / np.bincount(orb, minlength=RO), csize=csize, ocap=capn[first],
                    kinds=(False, True) if joint else (False,), rails=rails,
                    cross=None if rails is None else rails[0][:, None] != rails[0][None, :], translate=translate,
                    pair_img=pair_img, priced_plain=options.priced_plain)


@dataclass
class _LPSolution:
    """Where the column generation ended: the LP's value (normalised time), its weights per column,
    its duals (resource prices ``pi``, root rows ``lam``), the best lower bound proven and rounds."""

    value: float
    y: np.ndarray
    pi: np.ndarray
    lam: np.ndarray
    lower_bound: float
    rounds: int


def _root_rows(cs: _Columns) -> np.ndarray:
    """The LP row of every root key (``r``, or ``n + r`` for an in-tree), -1 for none."""
    n = cs.n
    root_row = np.full(2 * n, -1, np.int64)
    for k, rev in enumerate(cs.kinds):
        root_row[cs.reps + n * rev] = np.arange(cs.reps.size) + k * cs.reps.size
    return root_row


def _initial_columns(cs: _Columns, seed: list | None) -> None:
    """The cheapest tree (and rail tree) of every root by 1/bandwidth, then the ``seed`` trees."""
    okc = cs.ocap > 0
    pi0 = np.where(okc, 1.0 / np.where(okc, cs.ocap, 1.0), 0.0) / cs.mult
    for rev in cs.kinds:
        for r in cs.reps.tolist():
            cs.add(r, cs.price(pi0, r, rev)[1], rev)
            par_r = cs.price(pi0, r, rev, rail=True)[1]
            if par_r is not None:
                cs.add(r, par_r, rev)
    for r, par, rev in seed or ():
        cs.add(int(r), np.asarray(par, np.int64), bool(rev))


def _price_round(cs: _Columns, pi: np.ndarray, lam: np.ndarray) -> tuple[int, float]:
    """Every root's cheapest tree and rail tree at the prices ``pi``, added where below its dual
    ``lam``: the trees added and the sum of the cheapest costs (the Lagrangian's numerator)."""
    added, lag = 0, 0.0
    for k, rev in enumerate(cs.kinds):
        for i0, r in enumerate(cs.reps.tolist()):
            i = i0 + k * cs.reps.size
            below = lam[i] - 1e-9 * max(1.0, abs(lam[i]))
            cost, par = cs.price(pi, r, rev)
            lag += cost
            if cost < below:
                added += cs.add(r, par, rev)
            cost_r, par_r = cs.price(pi, r, rev, rail=True)
            if par_r is not None and cost_r < below:
                added += cs.add(r, par_r, rev)
    return added, lag


def _feed(lp: MasterLP, cs: _Columns, root_row: np.ndarray, fed: int) -> int:
    """The columns of ``cs`` from ``fed`` on join the LP; how many it has."""
    for j in range(fed, len(cs.cols)):
        lp.add(cs.cols[j], cs.mult[cs.cols[j]] * cs.csize[cs.col_root[j] % cs.n], int(root_row[cs.col_root[j]]))
    return len(cs.cols)


def _column_generation(cs: _Columns, bound: float | None, tol: float, deadline: float) -> _LPSolution:
    """The packing LP over the trees of ``cs``, new trees priced in until none improves it, it is
    within ``tol`` of a lower bound (Lagrangian, or ``bound``), or ``deadline``: the fractional
    packing (the module docstring)."""
    root_row = _root_rows(cs)
    lp = MasterLP(cs.ocap, cs.reps.size * len(cs.kinds))
    fed = 0                      # columns handed to the LP so far
    best_lb = 0.0 if bound is None else float(bound) * cs.scale
    lp_val, y, it = np.inf, None, 0
    while True:
        it += 1
        J = fed = _feed(lp, cs, root_row, fed)
        # a round after the first gets only the time left: stopped, the last round's packing stays
        res = lp.solve(None if y is None else deadline - clock.now())
        if res.status == 1 and y is not None:
            break
        if res.status != 0:
            raise PackingError(f"the packing LP failed: {res.message}")
        lp_val, y, pi, lam = float(res.fun), res.y[:J], res.prices, res.eq
        denom = float(pi @ cs.ocap)
        added, lag = _price_round(cs, pi, lam)
        if denom > 0:
            best_lb = max(best_lb, lag / denom)
        if not added or lp_val <= best_lb * (1 + tol) or clock.now() > deadline:
            break
    if lp.solves > 1 and clock.now() < deadline:
        # the last LP (the last round's columns too) solved from scratch: a vertex on fewer trees,
        # which round to whole chunks better than the warm-started one (:mod:`.master_lp`)
        _feed(lp, cs, root_row, fed)
        again = lp.solve_fresh(deadline - clock.now())
        if again.status == 0:
            lp_val, y, pi, lam = float(again.fun), again.y, again.prices, again.eq
    return _LPSolution(lp_val, y, pi, lam, best_lb, it)


def _support_translates(cs: _Columns, y: np.ndarray, perms_of) -> list:
    """``(root, parents, in-tree)`` of every translate (by ``perms_of(root)``) of the LP's trees of
    positive weight ``y``, each once."""
    out, got = [], set()
    for j in np.flatnonzero(y > 1e-9).tolist():
        r, rev = cs.root_of(j)
        roots, tps = _translates(perms_of(r), r, cs.col_par[j])
        for x, tp in zip(roots.tolist(), tps):
            key = (int(x), rev, tp.tobytes())
            if key not in got:
                got.add(key)
                out.append((int(x), tp, rev))
    return out


def _pack_by_classes(net: Network, cs: _Columns, sol: _LPSolution, t0: float, deadline: float, common: dict):
    """The classes' LP (``sol``, over ``cs``'s kinds of node) turned into packings: its trees under
    every element fixing their root seed the LP of translates, rounded per representative; where
    that rounds only at many chunks per rank (or the cluster is small), also the LP over every root
    (seeded with that LP's trees), the better rounding kept."""
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
    if (k_cls > opt.seed_every_root_above or 1 < k_cls and n <= opt.every_root_ranks) and deadline > clock.now():
        # a representative's K chunks go to its whole class alike; where that rounds only at
        # many chunks per rank (or the cluster is small), the LP over every root (seeded with
        # the translates of that LP's trees, an optimal solution) rounds each rank apart,
        # often at fewer
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


class _Rounding:
    """The fractional packing ``sol`` over the trees of ``cs`` rounded to whole chunks: for each
    chunk count tried, the rounding strategies (:attr:`strategies`) run in turn until one is within
    ``round_tol`` of the LP; where none is, integral trees (:mod:`.branchings`) where faster.
    Keeps what it found per chunk count, so that rounding again to fewer chunks (:meth:`reround`,
    a packing's ``reround``) reuses it."""

    def __init__(self, cs: _Columns, sol: _LPSolution, *, joint: bool, round_tol: float, deadline: float,
                 exact: dict, lp_s: float, options: PackOptions):
        self.cs, self.sol, self.joint, self.round_tol, self.options = cs, sol, joint, round_tol, options
        self.deadline, self.exact, self.lp_s = deadline, exact, lp_s
        n = cs.n
        # integral chunk counts (columns added in the last round have no weight yet)
        self.y = np.r_[sol.y, np.zeros(len(cs.cols) - sol.y.size)]
        self.load_unit = np.array([cs.unit_of(j) for j in range(len(cs.cols))]).reshape(len(cs.cols), cs.norbits)
        self.croot = np.array(cs.col_root)
        self.exact_k = _lp_denominator(self.y)
        root_row = _root_rows(cs)
        rc = self.load_unit @ sol.pi - sol.lam[root_row[np.array(cs.col_root)]]     # reduced costs at the last duals
        # the MILP's trees: past MILP_COLUMNS generated ones, those of the LP's support and the
        # cheapest others by their last reduced cost (the rest rarely help and slow it down)
        keep = np.ones(len(cs.cols), bool)
        if len(cs.cols) > MILP_COLUMNS:
            keep = self.y > 1e-9
            rest = np.flatnonzero(~keep)
            keep[rest[np.argsort(rc[rest], kind="stable")[:max(0, MILP_COLUMNS - int(keep.sum()))]]] = True
        self.keep_cols = keep
        self.target = sol.value * (1 + round_tol)   # a rounding this close to the LP is accepted
        self.rounded: dict[int, tuple] = {}    # K -> round_to's (time, counts, seconds): a re-rounding reuses them
        self.nroots = 2 * n
        #: after the largest remainders repaired, each tried while the counts miss the target
        self.strategies = (self._regrown, self._milp)

    # ------------------------------------------------------------ one chunk count
    def round_to(self, K: int, left: float) -> tuple[float, np.ndarray, float]:
        """Counts of K chunks per rank: largest remainders repaired, then each of
        :attr:`strategies` while the counts miss the LP by more than ``round_tol`` (``left``
        seconds for the MILP); and the seconds with which the rounding would end the same
        (infinity: the MILP ended before its time, by its node limit, or was not needed)."""
        counts = _repair(_round_counts(self.y, self.croot, self.nroots, K), self.croot, self.load_unit,
                         self.cs.ocap, K)
        t = _time_of(counts, self.load_unit, self.cs.ocap, K)
        same_within = np.inf
        for strategy in self.strategies:
            if t <= self.target or K <= 1:
                break
            counts, t, same_within = strategy(K, counts, t, left)
        return t, counts, same_within

    def _milp(self, K: int, counts: np.ndarray, t: float, left: float):
        """The MILP's counts over the kept columns (:func:`_milp_counts`) where better, given ``left``
        seconds; with the seconds with which it would end the same."""
        if left <= 0.05:
            return counts, t, 0.0              # no MILP run
        m0 = clock.now()
        sub = np.flatnonzero(self.keep_cols)
        got = _milp_counts(self.croot[sub], self.load_unit[sub], self.cs.ocap, K, left, target=self.target,
                           gap=self.round_tol, nodes=ROUND_MILP_NODES, floor=self.sol.value)
        if got is not None:
            exact = np.zeros(len(self.croot), np.int64)
            exact[sub] = got
            te = _time_of(exact, self.load_unit, self.cs.ocap, K)
            if te < t:
                counts, t = exact, te
        # its time guard may have ended it: more time may find more
        return counts, t, (left if clock.now() - m0 > 0.9 * left else np.inf)

    def _regrown(self, K: int, counts: np.ndarray, t: float, left: float):
        """Counts of K chunks per rank that the LP's trees could not round well, improved by moving
        one chunk at a time onto the cheapest tree of its root at prices that grow exponentially
        with each resource's load (a new tree where none generated is cheaper): the rounding's
        own column generation, against the integral loads rather than the LP's duals."""
        cs = self.cs
        okr = cs.ocap > 0
        inv = np.where(okr, 1.0 / np.where(okr, cs.ocap, 1.0), 0.0) / K
        grow = _Regrowth(list(self.load_unit * inv[None, :]), counts.tolist(), counts @ self.load_unit * inv,
                         (t, counts.tolist()), len(cs.cols))
        for alpha in self.options.regrow_alphas:
            moved = True
            for _ in range(REGROW_PASSES):
                if not moved or grow.best[0] <= self.target:
                    break
                moved = self._regrow_pass(grow, alpha / self.sol.value, inv, okr)
        new = len(cs.cols) - grow.first_new
        if new:
            self.load_unit = np.vstack([self.load_unit] + [cs.unit_of(i) for i in range(grow.first_new, len(cs.cols))])
            self.croot = np.r_[self.croot, np.array(cs.col_root[grow.first_new:], np.int64)]
            self.y = np.r_[self.y, np.zeros(new)]
            self.keep_cols = np.r_[self.keep_cols, np.zeros(new, bool)]
        tb, cb = grow.best
        return np.r_[np.array(cb, np.int64), np.zeros(len(cs.cols) - len(cb), np.int64)], tb, np.inf

    def _regrow_pass(self, grow: "_Regrowth", a: float, inv: np.ndarray, okr: np.ndarray) -> bool:
        """One pass of :meth:`_regrown` over every chunk at the exponent ``a``: whether a chunk moved."""
        cs, lp_val = self.cs, self.sol.value
        moved = False
        cnt, U = grow.cnt, grow.U
        for j in np.repeat(np.arange(len(cnt)), cnt).tolist():
            if cnt[j] == 0 or not (grow.util[U[j] > 0] > lp_val).any():
                continue        # a chunk loading no resource past the LP's time stays
            rest = grow.util - U[j]
            r, rev = cs.root_of(j)
            top = float(grow.util.max())         # the exponents' shift: no overflow
            pi = inv * np.exp(a * (rest - top))
            here = float(np.exp(a * (grow.util - top)).sum())
            for rail in (False, True):
                par = cs.price(pi, r, rev, rail=rail, many=True)[1]
                if par is None:
                    continue
                i = cs.col_of.get((r, rev, par.tobytes()))
                if i is None:
                    cs.add(r, par, rev)
                    i = len(cs.cols) - 1
                    U.append(cs.unit_of(i) * inv)
                    cnt.append(0)
                if i == j:
                    continue
                trial = rest + U[i]
                there = float(np.exp(np.minimum(a * (trial - top), 700.0)).sum())
                if there < here * (1 - 1e-12):
                    cnt[j] -= 1
                    cnt[i] += 1
                    grow.util, moved = trial, True
                    break
            tm = float(grow.util[okr].max()) if okr.any() else 0.0
            if tm < grow.best[0] * (1 - 1e-12):
                grow.best = (tm, list(cnt))
        return moved

    # ------------------------------------------------------------ integral trees
    def integral_at(self, K: int, until: float) -> tuple[float, np.ndarray] | None:
        """The least time of K trees per root and the pair multiplicities that attain it
        (:func:`.branchings.integral_arcs`; the trees themselves are grown only for the count
        kept) as ``(normalised time, multiplicities)``, where the network is small enough and the
        time allows (:data:`.branchings.SECONDS` in all, across every K, and the packing's time limit); None otherwise.
        Out-trees only (a joint packing's halves share their resources)."""
        from hccc.compiler.synth import branchings as br

        exact, net = self.exact, self.cs.net
        if self.joint or not self.options.integral or K > br.MAX_CHUNKS:
            return None
        if "sized" not in exact:
            exact["sized"] = br.sized(net, exact["perms"])
        if not exact["sized"]:
            return None
        if K not in exact["found"]:
            b0 = clock.now()
            until = min(until, b0 + br.SECONDS - exact["spent"])
            got = br.integral_arcs(net, K, self.cs.cap, until, exact["sets"], exact["perms"]) if until > b0 else None
            exact["spent"] += clock.now() - b0
            if got is None and clock.now() >= until:
                exact.setdefault("clock_cut", set()).add(K)      # the clock, not a node limit, ended it
            exact["found"][K] = None if got is None else (got[0] * self.cs.scale, got[1])
        return exact["found"][K]

    def integral_trees(self, K: int, t_round: float, mult: np.ndarray, r0: float) -> Packing | None:
        """The Packing of the integral trees on the multiplicities ``mult`` (K per root, no
        symmetry: every tree listed) with the LP's figures; None where growing them runs out of
        time."""
        from hccc.compiler.synth import branchings as br

        cs, sol, exact, net = self.cs, self.sol, self.exact, self.cs.net
        if K not in exact["grown"]:
            exact["grown"][K] = br.trees_on(net, mult, K, clock.now() + br.SECONDS)
        trees = exact["grown"][K]
        if trees is None:
            exact.setdefault("clock_cut", set()).add(K)          # growing them ran out of time
            return None
        load = np.zeros(cs.cap.size)
        for r, par, c in trees:
            np.add.at(load, _tree_column(net, _tree_pairs(net, par, r)), c / K)
        return Packing(cs.n, K, [int(r) for r, _, _ in trees], [np.asarray(par) for _, par, _ in trees],
                       [int(c) for _, _, c in trees], sol.value / cs.scale, sol.lower_bound / cs.scale,
                       t_round / cs.scale, sol.rounds, len(cs.cols), self.lp_s + clock.now() - r0,
                       load[:net.npairs].copy(),
                       {"lp_trees": int((self.y > 1e-9).sum()), "symmetry": 1, "classes": int(cs.reps.size),
                        "lp_rows": cs.norbits, "integral": True, **self.clock_cut()}, load, cs.capn * t_round, None, self.reround, None)

    # ------------------------------------------------------------ the loop over chunk counts
    def _tried(self, kmax: int, min_k: int, round_deadline: float) -> tuple[tuple, list]:
        """Every chunk count from ``min_k`` to ``kmax`` rounded, fewest first, until one is within
        the tolerance: the best ``(time, K, counts)`` and all those tried."""
        best, tried = None, []
        tries = sorted({k for k in CHUNK_CANDIDATES + ((self.exact_k,) if self.exact_k else ()) if min_k <= k <= kmax})
        for K in tries or [min_k]:
            left = min(round_deadline - clock.now(), self.options.round_milp_each)
            if not (K in self.rounded and self.rounded[K][2] >= left):
                self.rounded[K] = self.round_to(K, left)   # else rounded before, and more time would not change it
            t, counts = self.rounded[K][:2]
            tried.append((t, K, counts))
            if best is None or t < best[0] * (1 - 1e-12):
                best = (t, K, counts)
            if t <= self.target:
                break
        return best, tried

    def _with_integral(self, best: tuple, tried: list) -> tuple:
        """No count rounds the LP's trees within the tolerance: the best K trees per root at
        every count (:mod:`.branchings`), where faster, the fewest counts first; bounded by the
        packing's own time limit, not the rounding's (so the counts tried, and the result, do not
        depend on how fast the rounding ran). Edits ``tried``."""
        for j, (t, K, _) in enumerate(tried):
            got = self.integral_at(K, self.deadline)
            if got is not None and got[0] < t * (1 - 1e-12):
                tried[j] = (got[0], K, got[1])      # (time, multiplicities)
                if got[0] < best[0] * (1 - 1e-12):
                    best = tried[j]
                if got[0] <= self.target:
                    break
        return best

    def finish(self, kmax: int, min_k: int, round_deadline: float, integral: bool = True):
        """The LP's trees rounded to integral counts of at most ``kmax`` chunks per rank, or
        (``integral``: where no count rounds within the tolerance, and they are faster) integral
        trees at that count."""
        r0 = clock.now()
        best, tried = self._tried(kmax, min_k, round_deadline)
        if integral and best[0] > self.target:
            best = self._with_integral(best, tried)
        # where no count is within the tolerance of the LP, the fewest chunks within it of the
        # best rounding (more chunks are more streams and thread blocks for a sliver of rate)
        t_round, K, counts = next(c for c in tried if c[0] <= best[0] * (1 + self.round_tol))
        found = self.exact["found"].get(K)
        if integral and not self.joint and found is not None and counts is found[1]:
            # integral trees: grown now (where that runs out of time, the LP's rounding stands)
            plain = self.finish(kmax, min_k, round_deadline, integral=False)[0]     # its roundings are cached
            exact_p = self.integral_trees(K, t_round, counts, r0)
            if exact_p is None:
                return (plain,)
            exact_p.alternative = plain
            exact_p.exact = self.exact
            return (exact_p,)
        return self._packings(K, t_round, np.r_[counts, np.zeros(len(self.cs.col_root) - counts.size, np.int64)], r0)

    def clock_cut(self) -> dict:
        """``{"rounding_stopped_by_clock": [K, ...]}``: the chunk counts whose rounding the clock
        ended (its MILP's seconds guard, or no seconds left for it) rather than its node limit
        (:meth:`round_to`'s seconds, finite only then), or whose integral packing
        (:mod:`.branchings`, :meth:`integral_at`) its seconds ended; empty where none was. Only
        these roundings may come out otherwise on a slower or busier machine."""
        cut = sorted({K for K, got in self.rounded.items() if np.isfinite(got[2])}
                     | set((self.exact or {}).get("clock_cut", ())))
        return {"rounding_stopped_by_clock": cut} if cut else {}

    def _support(self) -> list | None:
        """With translates: the LP's trees of positive weight, every translate listed."""
        cs = self.cs
        if cs.translate is None:
            return None
        support = []
        for j in np.flatnonzero(self.y > 1e-9).tolist():
            r, rev = cs.root_of(j)
            got_roots, tp = _translates(cs.translate[r], r, cs.col_par[j])
            support += [(int(x), t, rev) for x, t in zip(got_roots.tolist(), tp)]
        return support

    def _packings(self, K: int, t_round: float, counts: np.ndarray, r0: float) -> tuple:
        """The :class:`Packing` of every kind (out-trees; with a joint packing, in-trees too) of
        ``counts`` chunks on the columns, every translate of a representative's tree listed."""
        cs, sol, net = self.cs, self.sol, self.cs.net
        n, P = cs.n, net.npairs
        support = self._support()
        # the translates load every member of an orbit alike: the orbit's load per member
        load = ((counts[:, None] * self.load_unit).sum(axis=0) / K)[cs.orb]
        limit = cs.capn * t_round
        col_root = np.array(cs.col_root)
        out = []
        for rev in cs.kinds:
            keep = np.flatnonzero((counts > 0) & ((col_root >= n) == rev))
            order = keep[np.lexsort((keep, col_root[keep]))]
            roots, parents, cnts = [], [], []
            for j in order.tolist():           # every translate of a representative's tree
                r = cs.col_root[j] - n * rev
                got_roots, tp = _translates(cs.perms if cs.translate is None else cs.translate[r], r, cs.col_par[j])
                roots.extend(got_roots.tolist())
                parents.extend(tp)
                cnts.extend([int(counts[j])] * len(tp))
            lo, li = load, limit
            if rev:     # the in-trees' packing is read on the transposed network: its pair order
                tord = transposed_pair_order(net)
                lo, li = np.r_[load[:P][tord], load[P:]], np.r_[limit[:P][tord], limit[P:]]
            out.append(Packing(n, K, roots, parents, cnts, sol.value / cs.scale, sol.lower_bound / cs.scale,
                               t_round / cs.scale, sol.rounds, len(cs.cols), self.lp_s + clock.now() - r0,
                               lo[:P].copy(),
                               {"lp_trees": int((self.y > 1e-9).sum()), "symmetry": cs.perms.shape[0],
                                "classes": int(cs.reps.size), "lp_rows": cs.norbits,
                                **({"joint": True} if self.joint else {}), **self.clock_cut()}, lo, li,
                               None if cs.lp_only else cs.group, self.reround, support, exact=self.exact))
        return tuple(out)

    def reround(self, kmax: int, time_limit: float = ROUND_MILP_SECONDS, min_chunks: int = 1):
        """The same LP's trees rounded again to at most ``kmax`` chunks per rank (at least
        ``min_chunks``) within ``time_limit`` seconds."""
        return self.finish(max(1, int(kmax)), max(1, min(int(min_chunks), int(kmax))),
                           clock.now() + max(0.0, float(time_limit)))


@dataclass
class _Regrowth:
    """The regrowing's state (:meth:`_Rounding._regrown`): utilisation per chunk of every column,
    the counts, the utilisation of every resource, the best ``(time, counts)`` so far and the
    first column made by it."""

    U: list
    cnt: list
    util: np.ndarray
    best: tuple
    first_new: int


#: the orders of the shaping passes tried (``c``: consolidate, ``f``: flatten); the first is the default
SHAPES = ("cfc", "cf", "f")


def shaped(net: Network, packing: Packing, order: str = SHAPES[0]) -> Packing:
    """A copy of ``packing`` with its trees reshaped by :func:`_consolidate` (``c``) and
    :func:`_flatten` (``f``) in ``order``. The loads of the saturated resources never grow, so the
    packing's time (:attr:`Packing.rounded_time`, kept) is an upper bound of the reshaped trees'
    (:attr:`Packing.load_time`: lower where a move lightened the most loaded resource, e.g. a
    one-chunk packing of a100_topo2's ReduceScatter, 0.960 -> 1.000 of the bound); what changes
    besides is how the compiled program's thread blocks overlap (see those functions). With a
    symmetry only the representative trees are reshaped, every move made in all their translates
    at once (:class:`_Loads`), so the result keeps the symmetry."""
    import dataclasses

    sym = packing.symmetry
    G = len(sym) if sym is not None else 1
    parents = [p.copy() for p in packing.parents]
    loads = _Loads(net, packing)
    K = packing.chunks_per_rank
    moves = {"consolidated": 0, "flattened": 0}
    own = range(0, len(parents), G)            # the trees reshaped (representatives)
    for step in order:
        if step == "c":
            moves["consolidated"] += _consolidate(net, packing.roots, parents, packing.counts, K, loads, own)
        elif step == "f":
            moves["flattened"] += _flatten(net, packing.roots, parents, packing.counts, K, loads, own)
        else:
            raise ValueError(f"unknown shaping pass {step!r} (c or f)")
        if sym is not None:
            _retranslate(sym, parents)
    load = loads.full()
    return dataclasses.replace(packing, parents=parents, pair_load=load[:net.npairs].copy(), res_load=load,
                               stats={**packing.stats, "shape": order, **moves})


def _retranslate(sym: Symmetry, parents: list) -> None:
    """Make every tree the translate of its run's representative again (in place)."""
    G = len(sym)
    E = sym.ranks
    rows = np.arange(G)[:, None]
    for j in range(0, len(parents), G):
        par = parents[j]
        v = np.flatnonzero(par >= 0)
        tp = np.full((G, par.size), -1, np.int64)
        tp[rows, E[:, v]] = E[:, par[v]]
        parents[j:j + G] = list(tp)


class _Loads:
    """The resource loads the shaping passes keep, against the packing's limits: per resource, or,
    with a symmetry, per resource orbit (a move made in a representative tree and all its translates
    adds to every member of an orbit alike: ``|G| / |O|`` per member for each of the orbit's
    resources the moved pair occupies)."""

    def __init__(self, net: Network, packing: Packing):
        self.net = net
        self.pairs = _pair_matrix(net)
        sym = packing.symmetry
        if sym is None:
            self.of = None
            self.load = packing.res_load.copy()
            self.limit = packing.res_limit
            self.mult = None
        else:
            O = sym.norbits
            first = np.full(O, -1, np.int64)
            first[sym.orbits[::-1]] = np.arange(sym.orbits.size)[::-1]
            self.of = sym.orbits
            self.load = packing.res_load[first].copy()
            self.limit = packing.res_limit[first]
            self.mult = len(sym) / np.bincount(sym.orbits, minlength=O)
        self._ids: dict = {}
        self.start_pass()

    def start_pass(self) -> None:
        """Room and saturation as they stand at the start of a shaping pass."""
        self.slack = self.limit * (1 + 1e-9) - self.load
        self.tight = (self.limit > 0) & (self.load >= self.limit * (1 - 1e-6))

    def ids(self, pair: int) -> list:
        """The resources (resource orbits, with a symmetry) ``pair`` occupies, with multiplicity
        (worked out once per pair: the passes ask again and again)."""
        got = self._ids.get(pair)
        if got is None:
            ids = _tree_column(self.net, np.array([pair]))
            got = self._ids[pair] = (ids if self.of is None else self.of[ids]).tolist()
        return got

    def try_move(self, p_old: int, p_new: int, w: float) -> bool:
        """Move load ``w`` from pair ``p_old`` to ``p_new`` when every resource has room for it."""
        delta: dict = {}
        mult = self.mult
        for x, pair in ((w, p_new), (-w, p_old)):
            for r in self.ids(pair):
                v = x if mult is None else x * float(mult[r])
                delta[r] = delta[r] + v if r in delta else v
        slack, load = self.slack, self.load
        for r, d in delta.items():
            if not d <= slack[r] + 1e-15:
                return False
        for r, d in delta.items():
            slack[r] -= d
            load[r] += d
        return True

    def full(self) -> np.ndarray:
        return self.load.copy() if self.of is None else self.load[self.of]


def _is_ancestor(par: np.ndarray, a: int, v: int) -> bool:
    """Whether ``a`` lies on the path from ``v`` up to the root (``a == v`` included)."""
    while v >= 0:
        if v == a:
            return True
        v = int(par[v])
    return False


def _consolidate(net: Network, roots, parents, counts, K: int, loads: _Loads, own) -> int:
    """Let every forwarding rank receive the chunks it forwards from one sender: where trees bring
    chunks that ``v`` passes on from several senders, move them to the sender that already brings
    the most, when that pair exists, has room, and is not below ``v`` in the tree. A thread block
    runs its transfers one after another, so a rank forwarding streams that arrive side by side
    (each at a fraction of the link) queues all but one of them until they have arrived; one
    connection brings them chunk after chunk at the full rate, each forwarded while it streams.
    Edits the trees ``own`` of ``parents`` and ``loads``; returns the moves made."""
    n = net.nranks
    P = net.npairs
    pm = loads.pairs
    par_all = np.array(parents, np.int64).reshape(len(parents), n)
    w_all = np.asarray(counts, float) / K
    has_child = np.zeros(par_all.shape, bool)
    t_idx, v_idx = np.nonzero(par_all >= 0)
    has_child[t_idx, par_all[t_idx, v_idx]] = True
    fw = has_child[t_idx, v_idx]
    fwd_load = np.bincount(pm[par_all[t_idx[fw], v_idx[fw]], v_idx[fw]], weights=w_all[t_idx[fw]], minlength=P)
    # every rank's preferred sender: the pair into it with the most forwarded load (the first such pair)
    cand = np.flatnonzero(fwd_load > 0)
    pref = np.full(n, -1, np.int64)
    if cand.size:
        o = cand[np.lexsort((cand, -fwd_load[cand], net.pdst[cand]))]
        head = np.ones(o.size, bool)
        head[1:] = net.pdst[o][1:] != net.pdst[o][:-1]
        pref[net.pdst[o[head]]] = net.psrc[o[head]]
    moves = 0
    loads.start_pass()
    for t in own:
        par = parents[t]
        w = counts[t] / K
        hc = np.zeros(n, bool)
        hc[par[par >= 0]] = True
        for v in np.flatnonzero(hc & (par >= 0)).tolist():
            u, u2 = int(par[v]), int(pref[v])
            if u2 < 0 or u2 == u or _is_ancestor(par, v, u2):
                continue
            new = int(pm[u2, v])
            if new < 0:
                continue
            if loads.try_move(int(pm[u, v]), new, w):
                par[v] = u2
                moves += 1
    return moves


def _flatten(net: Network, roots, parents, counts, K: int, loads: _Loads, own) -> int:
    """Make trees shallower without raising any resource above ``limit`` (the rounded packing's
    time x capacity): a vertex whose parent is not the root moves up to its grandparent when that
    pair exists and has room (its load moves from the old arc to the new one). Shallow trees
    forward less: a chunk that reaches a rank late (over a slow link) is passed on by fewer ranks,
    each on a connection of its own. Edits the trees ``own`` of ``parents`` and ``loads``; returns
    the moves made."""
    moves = 0
    pm = loads.pairs
    loads.start_pass()
    tight = loads.tight
    for t in own:
        r, par = roots[t], parents[t]
        w = counts[t] / K
        changed = True
        while changed:
            changed = False
            d = _depths(par)
            for v in np.argsort(d, kind="stable").tolist():
                p = int(par[v])
                if p < 0 or p == r:
                    continue
                g = int(par[p])
                new = int(pm[g, v])
                if new < 0:
                    continue
                if any(tight[r] for r in loads.ids(new)):
                    continue          # never onto a saturated resource (see _consolidate)
                if loads.try_move(int(pm[p, v]), new, w):
                    par[v] = g
                    moves += 1
                    changed = True
    return moves


def _round_counts(y: np.ndarray, root: np.ndarray, n: int, K: int) -> np.ndarray:
    """Per column a count, ``sum over a root's columns = K``, nearest to ``K * y`` (largest remainder)."""
    counts = np.zeros(y.size, np.int64)
    for r in np.unique(root).tolist():
        js = np.flatnonzero(root == r)
        w = np.maximum(y[js], 0.0)
        w = w / w.sum() if w.sum() > 0 else np.full(js.size, 1.0 / js.size)
        f = w * K
        base = np.floor(f + 1e-9).astype(np.int64)
        rest = K - int(base.sum())
        if rest > 0:
            base[np.argsort(-(f - base), kind="stable")[:rest]] += 1
        counts[js] = base
    return counts


def _lp_denominator(y: np.ndarray, most: int = CHUNK_CANDIDATES[-1]) -> int | None:
    """The least ``K <= most`` with every LP weight a multiple of ``1/K`` (an LP vertex's weights
    are often fractions such as sixteenths or seventeenths), or None."""
    import math
    from fractions import Fraction

    K = 1
    for w in y[y > 1e-9].tolist():
        f = Fraction(w).limit_denominator(most)
        if abs(float(f) - w) > 1e-7:
            return None
        K = K * f.denominator // math.gcd(K, f.denominator)
        if K > most:
            return None
    return K


def _milp_counts(root: np.ndarray, load_unit: np.ndarray, capn: np.ndarray, K: int,
                 time_limit: float, target: float = np.inf, gap: float = 1e-4,
                 nodes: int | None = None, floor: float = 0.0) -> np.ndarray | None:
    """Integral chunk counts over the generated trees (``K`` per root row) whose most loaded
    resource is least: a small mixed-integer program (scipy's HiGHS) over the LP's columns, stopped
    after ``nodes`` branch-and-bound nodes (deterministic; ``time_limit`` seconds as a guard) with
    the best counts found, or once within ``gap`` of its relaxation
    (None: none found, or none with the most loaded resource's time at most ``target``, in the
    units of ``capn``). Where largest-remainder
    rounding of the LP's weights misses (an LP vertex whose weights are thirds or sevenths of a
    chunk), another combination of the same trees often fits ``K`` chunks exactly.

    ``floor``: a lower bound of the least most-loaded time (the LP's): a resource that no choice
    of counts loads past it (every root's ``K`` chunks on its tree loading it most) can never be
    the most loaded one above it, so it is left out of the program, which has the same optimum
    (on 64 heterogeneous GPUs 63 of 1,528 resources stay)."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    J = root.size
    ok = (capn > 0) & (load_unit.sum(axis=0) > 0)
    if J == 0 or not ok.any():
        return None
    U = load_unit[:, ok] / (capn[ok] * K)           # utilisation per chunk on each column
    rows, ridx = np.unique(root, return_inverse=True)
    most = np.zeros((rows.size, U.shape[1]))
    np.maximum.at(most, ridx.reshape(-1), U)
    can = K * most.sum(axis=0) > float(floor)       # resources some counts load past ``floor``
    U = U[:, can] if can.any() else U[:, :1]
    A_eq = sparse.csr_matrix((np.ones(J), (np.searchsorted(rows, root), np.arange(J))), shape=(rows.size, J + 1))
    A_ub = sparse.hstack([sparse.csr_matrix(U.T), sparse.csr_matrix(-np.ones((U.shape[1], 1)))]).tocsr()
    c = np.zeros(J + 1)
    c[-1] = 1.0
    try:
        with silenced():
            res = milp(c, constraints=[LinearConstraint(A_eq, K, K), LinearConstraint(A_ub, -np.inf, 0.0)],
                       integrality=np.r_[np.ones(J), 0.0], bounds=Bounds(np.zeros(J + 1), np.r_[np.full(J, K), target]),
                       options={"time_limit": float(time_limit), "mip_rel_gap": float(gap), "disp": False,
                                **({"node_limit": int(nodes)} if nodes else {})})
    except ValueError:
        return None
    if res.x is None:
        return None
    counts = np.round(res.x[:J]).astype(np.int64)
    per_row = np.bincount(np.searchsorted(rows, root), weights=counts, minlength=rows.size)
    return counts if (per_row == K).all() and (counts >= 0).all() else None


def _time_of(counts, load_unit, capn, K) -> float:
    load = (counts[:, None] * load_unit).sum(axis=0) / K
    ok = capn > 0
    return float((load[ok] / capn[ok]).max()) if ok.any() else 0.0


def _repair(counts: np.ndarray, root: np.ndarray, load_unit: np.ndarray, capn: np.ndarray, K: int,
            rounds: int = 200) -> np.ndarray:
    """Move single chunks between trees of one root while the most loaded resource gets lighter."""
    counts = counts.copy()
    ok = capn > 0
    inv = np.where(ok, 1.0 / np.where(ok, capn, 1.0), 0.0)
    util_unit = load_unit * inv[None, :] / K       # per chunk on a column: utilisation added
    util = counts @ util_unit
    for _ in range(rounds):
        e = int(util.argmax())
        cur = util[e]
        if cur <= 0:
            break
        donors = np.flatnonzero((counts > 0) & (util_unit[:, e] > 0))
        best = None
        for j in donors.tolist():
            alts = np.flatnonzero(root == root[j])
            alts = alts[alts != j]
            if not alts.size:
                continue
            trial = util[None, :] - util_unit[j][None, :] + util_unit[alts]
            peak = trial.max(axis=1)
            a = int(peak.argmin())
            if peak[a] < cur * (1 - 1e-9) and (best is None or peak[a] < best[0]):
                best = (float(peak[a]), j, int(alts[a]))
        if best is None:
            break
        _, j, a = best
        counts[j] -= 1
        counts[a] += 1
        util = util - util_unit[j] + util_unit[a]
    return counts


# ---------------------------------------------------------------- transfers
def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every rank in the spanning tree ``parent`` (-1 at its root): :func:`.exchanges.depths`."""
    from hccc.compiler.synth.exchanges import depths

    return depths(np.asarray(parent, np.int64)[None, :])[0][0]


def _tree_rows(packing: Packing, reduce: bool, trees) -> np.ndarray:
    """``(src, dst, step, root, j)`` rows of the trees ``trees``: chunk ``j`` of the root per chunk
    the tree carries (a root's chunks numbered in tree order)."""
    next_chunk: dict[int, int] = {}
    out = []
    for t in trees:
        r, par, cnt = packing.roots[t], packing.parents[t], packing.counts[t]
        d = _depths(par)
        v = np.flatnonzero(par >= 0)
        if reduce:
            step = _reduce_steps(par, d)
            src, dst, st = v, par[v], step[v]
        else:
            src, dst, st = par[v], v, d[v] - 1
        for _ in range(cnt):
            j = next_chunk.get(r, 0)
            next_chunk[r] = j + 1
            out.append(np.stack([src, dst, st, np.full(v.size, r), np.full(v.size, j)], axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 5), np.int64)


def _reduce_steps(par: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Step of every rank's send to its parent in an in-tree: once all its children have reduced
    into it, siblings at distinct steps."""
    n = par.size
    step = np.zeros(n, np.int64)       # step of v's send to its parent
    ready = np.zeros(n, np.int64)      # first step v may send (all children reduced into it)
    for lev in range(int(d.max()), 0, -1):
        vs = np.flatnonzero(d == lev)
        # siblings: group by parent, order by readiness, give distinct steps >= ready
        order = vs[np.lexsort((vs, ready[vs], par[vs]))]
        prev_p, last = -1, -1
        for v in order.tolist():
            p = int(par[v])
            s = int(ready[v]) if p != prev_p else max(int(ready[v]), last + 1)
            step[v] = s
            prev_p, last = p, s
            ready[p] = max(int(ready[p]), s + 1)
    return step


@dataclass
class LoopRows:
    """Transfers that repeat under a symmetry: the rows ``(src, dst, step, root, j, op)`` of the
    representative trees; every element of ``symmetry`` maps them onto the transfers of the
    translated trees (ranks and roots shifted, chunk ``root * K + j``). ``expand`` lists them all;
    :func:`hccc.compiler.synth.emit.to_rccl` writes them as loops over the shifts."""

    symmetry: Symmetry
    chunks_per_rank: int
    rows: np.ndarray

    def expand(self) -> np.ndarray:
        """All ``(src, dst, step, chunk, op)`` rows, element by element."""
        E = self.symmetry.ranks
        r = self.rows
        if not len(r):
            return np.zeros((0, 5), np.int64)
        G = E.shape[0]
        K = self.chunks_per_rank
        out = np.empty((G, len(r), 5), np.int64)
        out[:, :, 0] = E[:, r[:, 0]]
        out[:, :, 1] = E[:, r[:, 1]]
        out[:, :, 2] = r[None, :, 2]
        out[:, :, 3] = E[:, r[:, 3]] * K + r[None, :, 4]
        out[:, :, 4] = r[None, :, 5]
        return out.reshape(-1, 5)


def _rows_of(packing: Packing, reduce: bool) -> np.ndarray:
    if packing.symmetry is None:
        r5 = _tree_rows(packing, reduce, range(len(packing.roots)))
        return np.c_[r5[:, :3], r5[:, 3] * packing.chunks_per_rank + r5[:, 4]] if len(r5) else np.zeros((0, 4), np.int64)
    return loop_rows(packing, 0, reduce=reduce).expand()[:, :4]


def loop_rows(packing: Packing, op: int, step0: int = 0, *, reduce: bool = False) -> LoopRows | None:
    """The representative trees' transfers of a symmetric packing (None without a symmetry), ``op``
    in every row and steps from ``step0``."""
    sym = packing.symmetry
    if sym is None:
        return None
    r5 = _tree_rows(packing, reduce, range(0, len(packing.roots), len(sym)))
    r5[:, 2] += step0
    return LoopRows(sym, packing.chunks_per_rank, np.c_[r5, np.full(len(r5), op, np.int64)])


def allgather_rows(packing: Packing) -> np.ndarray:
    """``(src, dst, step, chunk)`` rows: chunk ``r*K + j`` of root ``r`` down its tree, a rank
    forwarding at the step after the one it receives in."""
    return _rows_of(packing, False)


def reducescatter_rows(packing: Packing) -> np.ndarray:
    """``(src, dst, step, chunk)`` rows of the ReduceScatter whose in-trees are ``packing``'s trees
    (computed on the transposed network) turned around: a rank sends its partial sum to its tree
    parent once all its children have reduced into it; the children of one rank reduce into it at
    distinct steps."""
    return _rows_of(packing, True)


def pair_bandwidth(topo) -> np.ndarray:
    """Bytes/s of every pair of ``network_from_topology(topo)`` as the simulator runs it: the pair's
    best link only (``Topology.link_between``), bandwidth x lanes."""
    from hccc.compiler.synth.problem import _best_links

    best = _best_links(topo)
    return (topo.link_bandwidth[best] * topo.link_lanes[best]).astype(float)


# ---------------------------------------------------------------- collectives
#: collectives the AllGather packing builds (:mod:`.forest`)
PACKED_COLLECTIVES = ("allgather", "reducescatter", "allreduce")
#: collectives the tree method builds: those, and Broadcast by its root's trees (:mod:`.broadcast_trees`)
TREE_COLLECTIVES = PACKED_COLLECTIVES + ("broadcast",)


def transposed_pair_order(net: Network) -> np.ndarray:
    """Index into ``net``'s pairs of every pair of ``net.transposed()`` (same order as it)."""
    n = net.nranks
    return np.argsort(net.pdst.astype(np.int64) * n + net.psrc, kind="stable")


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
