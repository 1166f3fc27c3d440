"""The minimum-cost spanning arborescence (Chu-Liu/Edmonds) that prices a packing's trees.

:func:`min_arborescence` is the cheapest out-tree of a root on a dense arc-cost matrix: numpy's
formulation (:func:`_edmonds`) on small matrices, the compiled one
(:mod:`hccc.compiler.synth.edmonds_kernel`, the same steps) on large ones.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.synth.packing import PackingError


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
