"""Integral reduce and broadcast trees of a few roots: ``S`` streams per root, packed exactly.

:mod:`.root_trees` rounds the fractional packing of an AllReduce over ``K`` roots (every root's
in-trees and out-trees with weights) to ``S`` equal streams per root and direction. Where the LP's
trees are many and light (64 GPUs, 2 roots: 53 trees, none above 0.28 of its root's data) a few
streams cannot follow them: largest remainders put a stream on a tree of weight 0.2, which then
carries 0.5, and the rounding reaches 0.50, 0.67 and 0.83 of the LP at 2, 4 and 5 streams a root.
Here the streams are packed at ``S`` itself, in the two exact steps of :mod:`.branchings`
generalised to a set of roots and to in-trees:

1. **Arc multiplicities** (:func:`root_arcs`). Edmonds' branching theorem with roots ``R``: a
   multigraph holds ``S`` arc-disjoint spanning out-trees rooted at each root of ``R`` iff every
   set ``Z`` of ranks has at least ``S |R - Z|`` arcs entering it (a source joined to every root
   by ``S`` arcs: the maximum flow to every rank is ``S |R|``). In-trees are out-trees of the
   transposed network: ``S |R - Z|`` arcs *leaving* ``Z``. The least time of such multiplicities,
   an out-tree multigraph and an in-tree multigraph on the network's pairs, is a mixed-integer
   program (HiGHS): an integer per pair and direction, the time continuous, every pair's and
   shared group's streams within ``S cap T``, the cut conditions (the singletons, their
   complements and the machine nodes first, then every set a maximum flow finds short, until none
   is). The engine's limits are rows of it: at most ``ends[v]`` arcs at rank ``v`` (a connection
   end each: a thread block of the engines). Only the pairs the LP's trees use in that direction
   are variables: the LP's packing, its arcs' weights times ``S``, is a point of the program's
   relaxation, so the relaxation reaches the LP's time there, and the program is far smaller than
   over every pair (64 GPUs, 2 roots: 1,005 variables, not 8,064).
2. **The trees**: :func:`.branchings.branchings` grows them from each multigraph (of the roots, on
   the transposed multigraph for the in-trees), and :func:`.exchanges.shallower` makes them
   shallower keeping every arc's multiplicity.

The work is bounded by counts: the program's branch-and-bound nodes (:data:`ARC_NODES`) and its
rounds of cut separation (:data:`ARC_ROUNDS`), so the packing is the same on every machine; the
deadline is a guard only.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.synth.branchings import first_sets, short_sets
from hccc.compiler.synth.problem import Network
from hccc.util import clock
from hccc.util.native_output import silenced

#: branch-and-bound nodes one solve of the arc program may explore (a count, not seconds: the same
#: packing on every machine): past it HiGHS keeps the best point found, a packing all the same once
#: the cut conditions hold (64 GPUs, 2 roots: 1,005 variables, every solve within its gap in far fewer)
ARC_NODES = 200
#: relative gap at which the arc program's search stops (the rounding's tolerance is 5e-3)
ARC_GAP = 5e-3
#: rounds of cut separation before giving up (each adds every set a maximum flow finds short; 64
#: GPUs: 10 to 23 rounds where an integral point at the LP's time exists at 2 or 4 streams, each
#: solve slower with every round's rows: 3-10 s in all; 8 roots at 2 streams found none in 34)
ARC_ROUNDS = 25


def _support(n: int, trees: list, rev: bool) -> np.ndarray:
    """``(src, dst)`` of every arc the trees of direction ``rev`` use (in-trees: child -> parent),
    each once, as an ``(m, 2)`` array."""
    arcs = set()
    for r, rv, par in trees:
        if rv != rev:
            continue
        v = np.flatnonzero(np.asarray(par) >= 0)
        a = np.stack([v, par[v]], 1) if rev else np.stack([par[v], v], 1)
        arcs.update(map(tuple, a.tolist()))
    return np.array(sorted(arcs), np.int64).reshape(-1, 2)


def root_arcs(net: Network, roots, k: int, cap: np.ndarray, support: tuple[np.ndarray, np.ndarray], *,
              deadline: float, ends: np.ndarray | None = None, sets: list | None = None) -> tuple[float, np.ndarray, np.ndarray] | None:
    """Step 1 of the module docstring: ``(time, out_mult, in_mult)``, the least time (seconds per
    byte of a root's share, the most loaded resource's) of ``k`` out-trees and ``k`` in-trees per
    root of ``roots`` and their arc multiplicities (``(m, 3)`` arrays ``src, dst, count``), or
    None where no integral point was found within the counts (or ``deadline``). ``cap``: the
    resources' capacities (pairs then groups, bytes/s); ``support``: the ``(src, dst)`` arcs each
    direction may use (out-trees', in-trees': child -> parent); ``ends``: the most arcs at each
    rank, both directions together; ``sets``: the cut
    conditions known so far (rank masks, whatever ``k``: those found here are appended, so that the
    caller can pass them on to another stream count of the same roots)."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, P, G = net.nranks, net.npairs, net.ngroups
    roots = np.asarray(sorted(set(int(r) for r in roots)), np.int64)
    cap = np.asarray(cap, float)
    ok = cap > 0
    if not ok.any():
        return None
    scale = float(cap[ok].max())
    arcs = [np.asarray(a, np.int64).reshape(-1, 2) for a in support]
    pidx = [net.pair_index(a[:, 0], a[:, 1]) for a in arcs]
    if any((p < 0).any() for p in pidx):
        raise ValueError("root_arcs: a support arc is not a pair of the network")
    pid = np.r_[pidx[0], pidx[1]]
    src = np.r_[arcs[0][:, 0], arcs[1][:, 0]]
    dst = np.r_[arcs[0][:, 1], arcs[1][:, 1]]
    m0, V = arcs[0].shape[0], pid.size
    if not V:
        return None
    # resources x variables: each variable on its pair and on the pair's groups
    rp, rg = net.pair_group_rows()
    pg = sparse.csr_matrix((np.ones(rp.size), (rg, rp)), shape=(G, P))
    on_pair = sparse.csr_matrix((np.ones(V), (pid, np.arange(V))), shape=(P, V))
    inc = sparse.vstack([on_pair, pg @ on_pair]).tocsr()
    used = np.asarray(inc.sum(axis=1)).ravel() > 0
    if (used & ~ok).any():
        return None
    rows = np.flatnonzero(used)
    a_res = sparse.hstack([inc[rows], sparse.csr_matrix(-k * cap[rows][:, None] / scale)]).tocsr()
    cons = [LinearConstraint(a_res, -np.inf, 0.0)]
    if ends is not None:
        at = sparse.csr_matrix((np.ones(2 * V), (np.r_[src, dst], np.r_[np.arange(V), np.arange(V)])), shape=(n, V))
        cons.append(LinearConstraint(sparse.hstack([at, sparse.csr_matrix((n, 1))]).tocsr(), -np.inf,
                                     np.asarray(ends, float)))
    c = np.zeros(V + 1)
    c[V] = 1.0
    ub = np.r_[np.full(V, k * roots.size, float), np.inf]
    integrality = np.r_[np.ones(V), 0.0]
    if sets is None:
        sets = []
    if not sets:
        sets += first_sets(net, roots)
    is_in = np.arange(V) >= m0
    for _ in range(ARC_ROUNDS):
        left = deadline - clock.now()
        if left <= 0:
            return None
        z = np.array(sets)
        # a row per set and direction: the out-trees' arcs entering Z, the in-trees' leaving it
        cross = np.vstack([~z[:, src] & z[:, dst] & ~is_in[None, :], z[:, src] & ~z[:, dst] & is_in[None, :]])
        need = np.tile(k * (~z[:, roots]).sum(axis=1).astype(float), 2)
        a_cut = sparse.hstack([sparse.csr_matrix(cross.astype(float)), sparse.csr_matrix((2 * len(sets), 1))]).tocsr()
        with silenced():
            res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(V + 1), ub),
                       constraints=cons + [LinearConstraint(a_cut, need, np.inf)],
                       options={"time_limit": left, "node_limit": ARC_NODES, "mip_rel_gap": ARC_GAP,
                                "disp": False})
        if res.x is None or res.status in (2, 3):
            return None
        x = np.round(res.x[:V]).astype(np.int64)
        more = (short_sets(n, src[:m0], dst[:m0], x[:m0], k, roots)
                + short_sets(n, dst[m0:], src[m0:], x[m0:], k, roots))
        if not more:
            load = np.asarray(inc @ x, float)
            t = float((load[ok] / cap[ok]).max()) / k
            return (t, np.stack([src[:m0], dst[:m0], x[:m0]], 1), np.stack([src[m0:], dst[m0:], x[m0:]], 1))
        known = {z.tobytes() for z in sets}
        for z in more:
            if z.tobytes() not in known:
                known.add(z.tobytes())
                sets.append(z)
    return None


def root_branchings(net: Network, roots, k: int, out_mult: np.ndarray, in_mult: np.ndarray, *,
                    deadline: float) -> list[tuple[int, bool, np.ndarray, int]] | None:
    """Step 2 of the module docstring: the trees of the multiplicities of :func:`root_arcs` as
    ``(root, in_tree, parents, copies)``, every root's copies summing to ``k`` in each direction
    (an in-tree's ``parents[v]``: the rank ``v`` sends to); None where ``deadline`` passes first
    or the multiplicities miss a cut condition."""
    from hccc.compiler.synth.branchings import branchings
    from hccc.compiler.synth.exchanges import shallower

    n = net.nranks
    roots = sorted(set(int(r) for r in roots))
    parts = [np.flatnonzero(level == x) for level in net.levels for x in np.unique(level)]
    out = []
    for rev, mult in ((False, out_mult), (True, in_mult)):
        arcs = np.zeros((n, n), np.int64)
        mult = np.asarray(mult, np.int64).reshape(-1, 3)
        np.add.at(arcs, (mult[:, 0], mult[:, 1]), mult[:, 2])
        got = branchings(n, arcs.T if rev else arcs, k, deadline, root=roots)
        if got is None:
            return None
        parents, _ = shallower([par for _, par, _ in got], [c for _, _, c in got], parts, deadline)
        out += [(int(r), rev, par, int(c)) for (r, _, c), par in zip(got, parents)]
    return out


def integral_root_trees(net: Network, rt, k: int, cap: np.ndarray, *, deadline: float,
                        ends: np.ndarray | None = None, sets: list | None = None) -> tuple[object, np.ndarray] | None:
    """``k`` streams per root and direction packed exactly over the pairs the fractional packing
    ``rt`` (a :class:`.root_trees.RootTrees`) uses (the module docstring): a ``RootTrees`` of the
    integral trees (weights their copies over ``k``, loads counted from their pairs) and the streams
    of every tree, or None where no packing was found within the counts (or ``deadline``).
    ``cap``: the resources' capacities (pairs then groups, bytes/s); ``ends``: the most arcs at
    each rank (connection ends); ``sets``: cut conditions known so far (:func:`root_arcs`)."""
    from dataclasses import replace

    from hccc.compiler.synth.packing import _tree_column

    n = net.nranks
    sup = (_support(n, rt.trees, False), _support(n, rt.trees, True))
    got = root_arcs(net, rt.roots, k, cap, sup, deadline=deadline, ends=ends, sets=sets)
    if got is None:
        return None
    trees = root_branchings(net, rt.roots, k, got[1], got[2], deadline=deadline)
    if trees is None:
        return None
    nres = rt.capn.size
    load = np.zeros((len(trees), nres))
    for i, (_, rev, par, _) in enumerate(trees):
        v = np.flatnonzero(par >= 0)
        pairs = net.pair_index(v, par[v]) if rev else net.pair_index(par[v], v)
        load[i] = np.bincount(_tree_column(net, pairs), minlength=nres)[:nres]
    counts = np.array([c for *_, c in trees], np.int64)
    # (rt's own packing with these trees: its roots, capacities, LP time and scale kept)
    out = replace(rt, trees=[(r, rev, par) for r, rev, par, _ in trees], weights=counts / float(k), load=load)
    return out, counts


__all__ = ["ARC_GAP", "ARC_NODES", "ARC_ROUNDS", "integral_root_trees", "root_arcs", "root_branchings"]
