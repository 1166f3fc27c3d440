"""Integral tree packings: ``k`` spanning out-trees per root in the least time, exactly.

The LP of :mod:`.trees` gives every root fractional tree weights; a program needs each of a rank's
``K`` equal chunks on one tree, and rounding the LP's weights can lose several percent where
their denominators are large (two MI250 nodes: 1/240) and ``K`` must stay small (every stream is
a thread block on every rank it visits). This module finds the best packing *at* a given ``k``
instead, in two exact steps (the approach of ForestColl, on hccc's network of pairs and shared
groups):

1. **Arc multiplicities** (:func:`integral_arcs`). Edmonds' branching theorem: a multigraph with
   ``M[u, v]`` parallel arcs holds ``k`` arc-disjoint spanning out-trees rooted at every rank iff
   every set ``Z`` of ranks (not all) has at least ``k (N - |Z|)`` arcs entering it (join a source
   ``s`` to every rank by ``k`` arcs: ``kN`` arc-disjoint ``s``-arborescences, each leaving ``s``
   once). A packing of ``k`` trees per root with ``M[u, v]`` trees on pair ``u -> v`` therefore
   exists iff those cut conditions hold, and its time is the largest load over capacity of any
   pair or shared group, ``sum_{p in e} M_p / (k cap_e)``. The least such time is a small mixed-
   integer program (HiGHS): integral ``M`` over the pairs, the time ``T`` continuous,
   ``sum_{p in e} M_p <= k cap_e T`` for every pair and group, and the cut conditions, which are
   exponentially many: the singletons, their complements and the machine nodes go in first, and
   the program is solved again with every set a max-flow from ``s`` finds short (its minimum cut's
   sink side), until none is.
2. **The trees** (:func:`branchings`), grown one at a time from the multiplicities, breadth first,
   then made shallower by exchanges between trees that keep every arc's multiplicity
   (:mod:`.exchanges`; growing fills every resource, so late trees snake through every rank).
   A tree carries a count of identical copies (all ``k`` of its root at first). Adding arc
   ``x -> y`` to tree ``j`` keeps the rest packable for ``mu`` of its copies, where ``mu`` is the
   maximum ``x -> y`` flow in the remaining arcs, with every other unfinished tree ``i`` as a
   node fed by ``x`` with its count and feeding every rank it spans, less the sum of those counts
   (capped by tree ``j``'s count and the arc's multiplicity); where ``mu`` is short of the count,
   the tree splits and the rest of its copies grow on later.

Both are exact; what costs is their size (an integer variable per pair, a max-flow per arc of every
tree), so the two are tried where the rounding of the LP misses, on networks of at
most :data:`MAX_RANKS` ranks whose integer program has at most :data:`MAX_VARIABLES` variables
(:func:`variables`), within a time limit, and kept where they are faster (see
``trees._pack``'s rounding's ``finish``, :mod:`.rounding`).
"""
from __future__ import annotations


import numpy as np

from hccc.compiler.synth.problem import Network
from hccc.util import clock
from hccc.util.native_output import silenced

#: networks above this many ranks are not given integral packings (the program and the trees'
#: max-flows grow with the pairs, the ranks squared)
MAX_RANKS = 64
#: the most chunks per rank an integral packing is sought for (more chunks round the LP well)
MAX_CHUNKS = 12
#: integer programs of more variables (pair orbits) than this are not solved: a branch-and-bound
#: node's LP grows with them, and the node limit then bounds no time that fits a synthesis (four
#: MI250 nodes, 824 orbits: 2 s for one count; 42 GPUs of six different nodes, 1,672 pairs of
#: their own: 4-9 s per count, 45 s at one chunk per rank, and the re-roundings that need them cost
#: a ReduceScatter its candidate programs)
MAX_VARIABLES = 1024
#: seconds a packing (every chunk count it tries) may spend on integral packings: a guard only (two
#: MI250 nodes spend about 2 s over seven counts); the node limits, not the clock, decide the result
SECONDS = 30.0
#: relative gap at which the integer program's search stops (the rounding's own tolerance is 5e-3)
MIP_GAP = 2e-3
#: branch-and-bound nodes one solve of the integer program may explore (a count, not seconds, so
#: the result is the same on every machine): past it the best point found is taken (a valid packing
#: once it meets every cut condition, if not always the fastest; proving the least time can take far
#: longer than finding it)
SOLVE_NODES = 50
#: rounds of cut separation before giving up
MAX_ROUNDS = 50


def max_flow(nv: int, eu: np.ndarray, ev: np.ndarray, ecap: np.ndarray, s: int, t: int) -> tuple[int, np.ndarray]:
    """The maximum flow from ``s`` to ``t`` over arcs ``eu[i] -> ev[i]`` of whole-number capacity
    ``ecap[i]`` on ``nv`` vertices, and a minimum cut's sink side (boolean mask): the compiled
    kernel of :mod:`.maxflow` where numba is installed, else scipy's."""
    from hccc.compiler.synth.maxflow import KERNELS

    eu, ev, ecap = (np.asarray(a, np.int64) for a in (eu, ev, ecap))
    fn = KERNELS.compiled_for("max_flow_arrays", max(int(eu.size), KERNELS.min_work))
    if fn is not None:
        sink = np.zeros(nv, np.bool_)
        return int(fn(nv, eu, ev, ecap, s, t, sink)), sink
    from scipy import sparse
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    keep = ecap > 0
    g = sparse.csr_matrix((ecap[keep].astype(np.int32), (eu[keep], ev[keep])), shape=(nv, nv))
    g.sum_duplicates()
    res = maximum_flow(g, s, t, method="dinic")
    resid = (g - res.flow).tocsr()
    resid.data = np.maximum(resid.data, 0)
    resid.eliminate_zeros()
    sink = np.ones(nv, bool)
    sink[breadth_first_order(resid, s, directed=True, return_predecessors=False)] = False
    return int(res.flow_value), sink


def short_sets(n: int, src: np.ndarray, dst: np.ndarray, mult: np.ndarray, k: int,
               root=None) -> list[np.ndarray]:
    """Sets of ranks (boolean masks) with fewer than ``k (n - |Z|)`` arcs entering them in the
    multigraph of ``mult[i]`` arcs ``src[i] -> dst[i]``: for every rank ``v`` whose maximum flow
    from a source joined to every rank by ``k`` arcs is short of ``k n``, the sink side of that
    flow's minimum cut. With a ``root``, a rank or an array of ranks (``k`` out-trees of each
    root): sets that fewer than ``k |roots - Z|`` arcs enter (Edmonds' condition; the source
    joined to the roots alone, the flow short of ``k |roots|``)."""
    s = n
    tails = np.arange(n) if root is None else np.atleast_1d(np.asarray(root, np.int64))
    eu = np.r_[np.asarray(src, np.int64), np.full(tails.size, s)]
    ev = np.r_[np.asarray(dst, np.int64), tails]
    ecap = np.r_[np.asarray(mult, np.int64), np.full(tails.size, k, np.int64)]
    keep = ecap > 0
    eu, ev, ecap = eu[keep], ev[keep], ecap[keep]
    want = k * tails.size
    out, seen = [], set()
    for v in range(n):
        flow, sink = max_flow(n + 1, eu, ev, ecap, s, v)
        if flow >= want:
            continue
        z = sink[:n].copy()
        if z.tobytes() not in seen:
            seen.add(z.tobytes())
            out.append(z)
    return out


def first_sets(net: Network, root=None) -> list[np.ndarray]:
    """The cut conditions every integral packing is asked first: each rank, all ranks but one, and
    every part of the network's hierarchy (machine nodes first) and its complement (with a
    ``root``, a rank or an array of ranks: those that leave some root outside)."""
    n = net.nranks
    sets = []
    for v in range(n):
        z = np.zeros(n, bool)
        z[v] = True
        sets += [z, ~z]
    for lev in net.levels:
        for part in np.unique(lev):
            z = np.asarray(lev) == part
            if 1 < z.sum() < n - 1:
                sets += [z, ~z]
    if root is None:
        return sets
    roots = np.atleast_1d(np.asarray(root, np.int64))
    return [z for z in sets if (~z[roots]).any()]


def integral_arcs(net: Network, k: int, cap: np.ndarray, deadline: float, sets: list | None = None,
                  perms: np.ndarray | None = None, root: int | None = None) -> tuple[float, np.ndarray] | None:
    """The least time (seconds per byte of each rank's data) of ``k`` spanning out-trees per root
    and the arc multiplicities ``M`` (per pair) that attain it (module docstring, step 1), or None
    where the time runs out first. ``cap``: the resources' capacities in bytes/s, the pairs' then
    the groups'; ``sets``: cut conditions known so far (rank masks; those found here are
    appended, so the caller can pass them on to another ``k``); ``perms``: automorphisms of the
    network as rank permutations (one per row, a group): the multiplicities are then the same on
    every pair of an orbit, one variable per orbit (far fewer where nodes repeat), and every set
    found short is added with its images. With a ``root``: ``k`` out-trees of that rank alone (a
    Broadcast's, time per byte of its buffer): every set without the root needs ``k`` arcs entering
    it (Edmonds), and ``perms`` must fix the root."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, P, G = net.nranks, net.npairs, net.ngroups
    cap = np.asarray(cap, float)
    pair_cap, group_cap = cap[:P], cap[P:P + G]
    live = cap > 0
    scale = float(cap[live].max())
    src, dst = net.psrc.astype(np.int64), net.pdst.astype(np.int64)
    rp, rg = net.pair_group_rows()
    orbit = pair_orbits(net, perms)
    O = int(orbit.max()) + 1
    first = np.full(O, -1, np.int64)
    first[orbit[::-1]] = np.arange(P)[::-1]
    to_orbit = sparse.csr_matrix((np.ones(P), (np.arange(P), orbit)), shape=(P, O))
    # variables: M over the pair orbits, then tau = T * scale
    usable = pair_cap[first] > 0
    ub = np.r_[np.where(usable, k * (n if root is None else 1), 0), np.inf]
    a_pair = sparse.hstack([sparse.identity(O, format="csr"),
                            sparse.csr_matrix(-k * pair_cap[first][:, None] / scale)]).tocsr()
    a_group = sparse.hstack([sparse.csr_matrix((np.ones(rp.size), (rg, rp)), shape=(G, P)) @ to_orbit,
                             sparse.csr_matrix(-k * group_cap[:, None] / scale)]).tocsr()
    if sets is None:
        sets = []
    if not sets:
        sets += first_sets(net, root)
    c = np.zeros(O + 1)
    c[O] = 1.0
    integrality = np.r_[np.ones(O), 0.0]
    for _ in range(MAX_ROUNDS):
        left = deadline - clock.now()
        if left <= 0:
            return None
        z = np.array(sets)
        entering = sparse.csr_matrix(((~z[:, src]) & z[:, dst]).astype(float)) @ to_orbit
        a_cut = sparse.hstack([entering, sparse.csr_matrix((len(sets), 1))]).tocsr()
        need = k * (n - z.sum(axis=1)).astype(float) if root is None else np.full(len(sets), float(k))
        with silenced():
            res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(O + 1), ub),
                       constraints=[LinearConstraint(a_pair, -np.inf, 0.0), LinearConstraint(a_group, -np.inf, 0.0),
                                    LinearConstraint(a_cut, need, np.inf)],
                       options={"time_limit": left, "node_limit": SOLVE_NODES, "mip_rel_gap": MIP_GAP, "disp": False})
        if res.x is None or res.status in (2, 3):
            return None                     # no integral point found in the time (or none exists)
        # at its node limit (HiGHS: a limit status) the search keeps the best point found: a
        # packing all the same (once the cut conditions hold), if not the least time's
        mult = np.round(res.x[:O]).astype(np.int64)[orbit]
        more = short_sets(n, src, dst, mult, k, root)
        if not more:
            return arcs_time(net, mult, k, cap), mult
        known = {z.tobytes() for z in sets}
        for z in more:
            for perm in (perms if perms is not None else np.arange(n)[None, :]):
                img = np.zeros(n, bool)
                img[perm[z]] = True
                if img.tobytes() not in known:
                    known.add(img.tobytes())
                    sets.append(img)
    return None


def pair_orbits(net: Network, perms: np.ndarray | None) -> np.ndarray:
    """The orbit of every pair under the rank permutations ``perms`` (None: every pair its own),
    orbits numbered from 0 in the order of their least pair: the connected components of the
    graph joining every pair to its image under every permutation."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    P = net.npairs
    if perms is None or len(perms) <= 1:
        return np.arange(P)
    perms = np.asarray(perms)
    img = net.pair_index(perms[:, net.psrc].ravel(), perms[:, net.pdst].ravel())
    src = np.tile(np.arange(P), len(perms))
    ok = img >= 0
    graph = coo_matrix((np.ones(int(ok.sum())), (src[ok], img[ok])), shape=(P, P))
    _, label = connected_components(graph, directed=True, connection="weak")
    least = np.full(int(label.max()) + 1, P)
    np.minimum.at(least, label, np.arange(P))
    order = np.empty(least.size, np.int64)
    order[np.argsort(least, kind="stable")] = np.arange(least.size)
    return order[label].astype(np.int64)


def arcs_time(net: Network, mult: np.ndarray, k: int, cap: np.ndarray) -> float:
    """Seconds per byte of each rank's data for ``mult[p]`` chunks of ``1/k`` on every pair:
    the largest load over capacity of a pair or group (its pairs' loads summed)."""
    rp, rg = net.pair_group_rows()
    load = np.r_[np.asarray(mult, float), np.bincount(rg, weights=np.asarray(mult, float)[rp], minlength=net.ngroups)] / k
    cap = np.asarray(cap, float)
    used = load > 0
    if (used & ~(cap > 0)).any():
        return float("inf")
    return float((load[used] / cap[used]).max()) if used.any() else 0.0


def _others(n: int, big: int, others: list[int], spans: list, copies: list) -> tuple:
    """The unfinished trees ``others`` in the max-flow test of :func:`branchings`: a node each
    (``n + a`` for the ``a``-th), fed by the tail of the tested arc with the tree's copies and
    feeding every rank the tree spans. Returns the flow graph's size, those nodes' arcs (rows,
    columns, capacities), the columns and capacities of the tail's arcs to them, and their sum."""
    rows = [np.full(int(spans[i].sum()), n + a) for a, i in enumerate(others)]
    cols = [np.flatnonzero(spans[i]) for i in others]
    o_rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    o_cols = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    x_caps = np.array([copies[i] for i in others], np.int64)
    return (n + len(others), o_rows, o_cols, np.full(o_cols.size, big, np.int64),
            n + np.arange(len(others)), x_caps, int(x_caps.sum()))


def branchings(n: int, arcs: np.ndarray, k: int, deadline: float,
               root: int | None = None) -> list[tuple[int, np.ndarray, int]] | None:
    """``k`` spanning out-trees rooted at every rank (at ``root`` alone, where given: a rank or a
    sequence of ranks) inside the multigraph ``arcs[u, v]`` (arc multiplicities meeting the cut
    conditions of the module docstring) as ``(root, parents, copies)``, the copies of a root
    summing to ``k`` (step 2 of the module docstring); None where ``deadline`` passes first."""
    left_arcs = np.array(arcs, np.int64, copy=True)
    big = k * n + 1
    roots, spans, parents, copies = [], [], [], []
    for r in (range(n) if root is None else np.atleast_1d(np.asarray(root, np.int64)).tolist()):
        roots.append(r)
        z = np.zeros(n, bool)
        z[r] = True
        spans.append(z)
        parents.append(np.full(n, -1, np.int64))
        copies.append(k)
    queue = list(range(len(roots)))
    done = []
    while queue:
        j = queue.pop(0)
        m, o_rows, o_cols, o_caps, x_cols, x_caps, held = _others(n, big, queue, spans, copies)
        au, av = np.nonzero(left_arcs)
        frontier = list(np.flatnonzero(spans[j]))
        while frontier:
            x = int(frontier.pop(0))
            for y in np.flatnonzero(left_arcs[x] > 0).tolist():
                if spans[j][y]:
                    continue
                if clock.now() > deadline:
                    return None
                flow, _ = max_flow(m, np.concatenate([au, np.full(x_cols.size, x), o_rows]),
                                   np.concatenate([av, x_cols, o_cols]),
                                   np.concatenate([left_arcs[au, av], x_caps, o_caps]), x, y)
                mu = min(copies[j], int(left_arcs[x, y]), flow - held)
                if mu <= 0:
                    continue
                if mu < copies[j]:
                    # the copies this arc cannot take grow on as a tree of their own, later
                    roots.append(roots[j])
                    spans.append(spans[j].copy())
                    parents.append(parents[j].copy())
                    copies.append(copies[j] - mu)
                    queue.append(len(roots) - 1)
                    copies[j] = mu
                    m, o_rows, o_cols, o_caps, x_cols, x_caps, held = _others(n, big, queue, spans, copies)
                spans[j][y] = True
                parents[j][y] = x
                left_arcs[x, y] -= mu
                if not left_arcs[x, y]:
                    au, av = np.nonzero(left_arcs)
                frontier.append(y)
        if not spans[j].all():
            return None         # the cut conditions did not hold (not for multiplicities of integral_arcs)
        done.append(j)
    return [(roots[j], parents[j], copies[j]) for j in done]


def trees_on(net: Network, mult: np.ndarray, k: int, deadline: float,
             root: int | None = None) -> list[tuple[int, np.ndarray, int]] | None:
    """:func:`branchings` on the pair multiplicities ``mult`` of :func:`integral_arcs` (of every
    rank, or of ``root`` alone), made shallower by :func:`.exchanges.shallower` (every arc keeps its
    multiplicity) over single ranks and the parts of the network's partitions (its nodes)."""
    from hccc.compiler.synth.exchanges import shallower

    n = net.nranks
    arcs = np.zeros((n, n), np.int64)
    arcs[net.psrc, net.pdst] = mult
    trees = branchings(n, arcs, k, deadline, root)
    if trees is None:
        return None
    parts = [np.flatnonzero(level == x) for level in net.levels for x in np.unique(level)]
    parents, _ = shallower([par for _, par, _ in trees], [c for _, _, c in trees], parts, deadline)
    return [(r, par, c) for (r, _, c), par in zip(trees, parents)]


def variables(net: Network, perms: np.ndarray | None = None) -> int:
    """The integer variables of :func:`integral_arcs`'s program on ``net`` with the symmetry
    ``perms``: one per pair orbit."""
    return int(pair_orbits(net, perms).max()) + 1 if net.npairs else 0


def sized(net: Network, perms: np.ndarray | None = None) -> bool:
    """Whether integral packings are sought on ``net`` (:data:`MAX_RANKS`, :data:`MAX_VARIABLES`)."""
    return 2 <= net.nranks <= MAX_RANKS and variables(net, perms) <= MAX_VARIABLES


def integral_packing(net: Network, k: int, cap: np.ndarray, deadline: float, sets: list | None = None,
                     perms: np.ndarray | None = None) -> tuple[float, list[tuple[int, np.ndarray, int]]] | None:
    """The least-time packing of ``k`` spanning out-trees per root on ``net`` (``cap``: pair then
    group capacities, bytes/s): its time in seconds per byte of each rank's data and its trees as
    ``(root, parents, copies)``; None where ``deadline`` passes first or the network is too large
    (:func:`sized`)."""
    if k < 1 or not sized(net, perms):
        return None
    got = integral_arcs(net, k, cap, deadline, sets, perms)
    if got is None:
        return None
    trees = trees_on(net, got[1], k, deadline)
    return None if trees is None else (got[0], trees)
