"""Chu-Liu/Edmonds on a dense arc-cost matrix, as loops numba compiles: the twin of
:func:`hccc.compiler.synth.arborescence._edmonds` (its numpy formulation), step for step and with the same
ties (the first least entry of a column or row), so both give the same arborescence.

The column generation of the tree packing prices a tree per root and round (3,672 arborescences
for a 72-GPU AllGather), and the numpy formulation spends ~0.1 ms per call of a 64-rank matrix on
numpy's per-call overhead; compiled, a call is a few microseconds. Small packings keep the numpy
formulation (:data:`MIN_COMPILED_RANKS`), which then costs less than loading the kernel.
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels

#: matrices of this many ranks or more are solved by the compiled kernel
MIN_COMPILED_RANKS = 48


def edmonds(C, root):
    """``parent[v]`` of a minimum arborescence rooted at ``root`` of ``C`` (``C[u, v]``: cost of
    the arc ``u -> v``, infinite on the diagonal, into ``root`` and where there is no arc). Where
    a vertex cannot be reached (no finite arc enters it, here or in a contracted problem, where
    the numpy formulation raises), the one entry ``-2 - v`` instead, ``v`` that vertex."""
    n = C.shape[0]
    par = np.empty(n, np.int64)
    inc = np.empty(n, np.float64)
    for v in range(n):
        best = C[0, v]
        arg = 0
        for u in range(1, n):
            if C[u, v] < best:
                best = C[u, v]
                arg = u
        par[v] = arg
        inc[v] = best
    par[root] = -1
    inc[root] = 0.0
    for v in range(n):
        if not np.isfinite(inc[v]):
            return np.full(1, -2 - v, np.int64)
    # cycles of the parent function by pointer jumping (as the numpy formulation): every vertex
    # reaches its terminal cycle, named by its least vertex
    P = par.copy()
    P[root] = root
    J = P.copy()
    low = np.empty(n, np.int64)
    for v in range(n):
        low[v] = v if v < P[v] else P[v]
    rounds = 1
    while (1 << rounds) < max(n, 2):
        rounds += 1
    tmp = np.empty(n, np.int64)
    for _ in range(rounds):
        # (swapped, not copied back: an array assigned to a slice makes numba compile the shape
        # check's error message, seconds the first time)
        for v in range(n):
            tmp[v] = low[v] if low[v] < low[J[v]] else low[J[v]]
        low, tmp = tmp, low
        for v in range(n):
            tmp[v] = J[J[v]]
        J, tmp = tmp, J
    on = np.zeros(n, np.bool_)
    for v in range(n):
        on[J[v]] = True
    on[root] = False
    # cycle ids in the order of their least vertex
    ident = np.full(n, -1, np.int64)
    for v in range(n):
        if on[v]:
            ident[low[v]] = 0
    ncyc = 0
    for v in range(n):
        if ident[v] == 0:
            ident[v] = ncyc + 1
            ncyc += 1
    if ncyc == 0:
        return par
    cyc_id = np.full(n, -1, np.int64)
    for v in range(n):
        if on[v]:
            cyc_id[v] = ident[low[v]] - 1
    nsingle = 0
    for v in range(n):
        if cyc_id[v] < 0:
            nsingle += 1
    single = np.empty(nsingle, np.int64)
    comp = np.empty(n, np.int64)
    k = 0
    for v in range(n):
        if cyc_id[v] < 0:
            single[k] = v
            comp[v] = k
            k += 1
        else:
            comp[v] = nsingle + cyc_id[v]
    m = nsingle + ncyc
    # members of each cycle, ascending
    mptr = np.zeros(ncyc + 1, np.int64)
    for v in range(n):
        if cyc_id[v] >= 0:
            mptr[cyc_id[v] + 1] += 1
    for c in range(ncyc):
        mptr[c + 1] += mptr[c]
    mem = np.empty(mptr[ncyc], np.int64)
    fill = mptr[:ncyc].copy()
    for v in range(n):
        c = cyc_id[v]
        if c >= 0:
            mem[fill[c]] = v
            fill[c] += 1
    # entering a cycle vertex replaces its arc: A = C - inc on cycle columns
    M1 = np.empty((n, m), np.float64)
    a1 = np.empty((n, m), np.int64)
    for u in range(n):
        for j in range(nsingle):
            M1[u, j] = C[u, single[j]]
            a1[u, j] = single[j]
        for c in range(ncyc):
            best = np.inf
            arg = -1
            for q in range(mptr[c], mptr[c + 1]):
                x = C[u, mem[q]] - inc[mem[q]]
                if arg < 0 or x < best:
                    best = x
                    arg = mem[q]
            M1[u, nsingle + c] = best
            a1[u, nsingle + c] = arg
    M2 = np.empty((m, m), np.float64)
    a2 = np.empty((m, m), np.int64)
    for i in range(nsingle):
        for b in range(m):
            M2[i, b] = M1[single[i], b]
            a2[i, b] = single[i]
    for c in range(ncyc):
        for b in range(m):
            best = np.inf
            arg = -1
            for q in range(mptr[c], mptr[c + 1]):
                x = M1[mem[q], b]
                if arg < 0 or x < best:
                    best = x
                    arg = mem[q]
            M2[nsingle + c, b] = best
            a2[nsingle + c, b] = arg
    for b in range(m):
        M2[b, b] = np.inf
    croot = comp[root]
    for i in range(m):
        M2[i, croot] = np.inf
    cpar = edmonds(M2, croot)
    if cpar[0] <= -2:
        return cpar
    out = par.copy()
    for b in range(m):
        a = cpar[b]
        if a < 0:
            continue
        u = a2[a, b]
        out[a1[u, b]] = u
    out[root] = -1
    return out


KERNELS = Kernels(globals(), ["edmonds"], min_work=MIN_COMPILED_RANKS)


def compiled_edmonds(nranks: int):
    """The compiled :func:`edmonds` for a matrix of ``nranks`` ranks, or None (numba missing,
    ``HCCC_JIT=python``, or a small matrix: the numpy formulation runs)."""
    return KERNELS.compiled_for("edmonds", int(nranks))
