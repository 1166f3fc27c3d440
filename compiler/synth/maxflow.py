"""Exact maximum flow and minimum cut on whole-number capacities (Dinic's algorithm, compiled).

The cut bounds (:mod:`hccc.compiler.synth.bounds`) run Dinkelbach's iteration: a max-flow per
target rank and step, on the hub graph of a cluster with its capacities scaled by the current
ratio. networkx's preflow-push takes 30-60 ms per max-flow on a 64-GPU hub graph (and a 72-GPU
AllGather bound ran 154 of them); this kernel takes about a millisecond compiled. It works on
``int64`` capacities, so the flow is exact: callers pass whole numbers whose sum fits (see
:func:`fits`) and otherwise keep networkx.

The graph is given as edge arrays ``(u, v, capacity)`` over vertices ``0..n-1``; each edge gets a
reverse twin (edge ``2e`` forward, ``2e+1`` back). The minimum cut returned is the one networkx's
``minimum_cut`` returns, whatever maximum flow was found: the sink side is every vertex that can
still reach the sink in the residual graph (the least sink side of a minimum cut, which every
maximum flow leaves the same).
"""
from __future__ import annotations

import math

import numpy as np

from hccc.util.jit import Kernels

#: graphs from this many edges use the compiled kernel (smaller ones stay with networkx, whose
#: max-flow is then as fast as loading the kernel)
MIN_COMPILED_EDGES = 1024
#: capacities (and their sum) must stay below this for the int64 arithmetic to be exact
LIMIT = 1 << 62


def fits(capacities) -> bool:
    """Whole, non-negative (finite) numbers whose sum stays below :data:`LIMIT`."""
    total = 0
    for c in capacities:
        if not math.isfinite(c) or c < 0 or c != int(c):
            return False
        total += int(c)
    return total < LIMIT


def _bfs(n, head, nxt, to, res, start, back, level, queue):
    """Hop distances (``level``, -1: none) from ``start`` over edges with room left, or with
    ``back`` to ``start``: vertex ``v`` is a hop from ``u`` where the edge ``v -> u`` has room."""
    for x in range(n):
        level[x] = -1
    level[start] = 0
    qh = 0
    qt = 1
    queue[0] = start
    while qh < qt:
        u = queue[qh]
        qh += 1
        e = head[u]
        while e >= 0:
            v = to[e]
            room = res[e ^ 1] if back else res[e]
            if room > 0 and level[v] < 0:
                level[v] = level[u] + 1
                queue[qt] = v
                qt += 1
            e = nxt[e]


def _blocking_flow(head, nxt, to, res, s, t, level, it, stack_v, stack_e):
    """Augment along shortest paths (the level graph) until none is left; an iterative DFS with
    each vertex's next edge kept in ``it``. Returns the flow pushed."""
    total = 0
    while True:
        # find a path s -> t in the level graph
        sp = 0
        u = s
        found = False
        while True:
            if u == t:
                found = True
                break
            e = it[u]
            advanced = False
            while e >= 0:
                v = to[e]
                if res[e] > 0 and level[v] == level[u] + 1:
                    stack_v[sp] = u
                    stack_e[sp] = e
                    sp += 1
                    u = v
                    advanced = True
                    break
                e = nxt[e]
                it[u] = e
            if not advanced:
                if sp == 0:
                    break
                level[u] = -1           # a dead end: no path through u in this phase
                sp -= 1
                u = stack_v[sp]
                it[u] = nxt[it[u]]
        if not found:
            return total
        push = res[stack_e[0]]
        for k in range(1, sp):
            if res[stack_e[k]] < push:
                push = res[stack_e[k]]
        for k in range(sp):
            e = stack_e[k]
            res[e] -= push
            res[e ^ 1] += push
        total += push


def max_flow_arrays(n, eu, ev, ecap, s, t, sink_side):
    """The maximum flow from ``s`` to ``t`` over edges ``eu[i] -> ev[i]`` of capacity ``ecap[i]``
    (``int64``); ``sink_side[x]`` is set where vertex ``x`` can reach ``t`` in the final residual
    graph."""
    m = eu.shape[0]
    head = np.full(n, -1, np.int64)
    nxt = np.empty(2 * m, np.int64)
    to = np.empty(2 * m, np.int64)
    res = np.empty(2 * m, np.int64)
    for i in range(m - 1, -1, -1):
        a = 2 * i
        to[a] = ev[i]
        res[a] = ecap[i]
        nxt[a] = head[eu[i]]
        head[eu[i]] = a
        to[a + 1] = eu[i]
        res[a + 1] = 0
        nxt[a + 1] = head[ev[i]]
        head[ev[i]] = a + 1
    level = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    it = np.empty(n, np.int64)
    stack_v = np.empty(n + 1, np.int64)
    stack_e = np.empty(n + 1, np.int64)
    flow = 0
    forward, backward = np.bool_(False), np.bool_(True)    # not literals: _bfs compiled once
    while True:
        _bfs(n, head, nxt, to, res, s, forward, level, queue)
        if level[t] < 0:
            break
        for x in range(n):
            it[x] = head[x]
        flow += _blocking_flow(head, nxt, to, res, s, t, level, it, stack_v, stack_e)
    _bfs(n, head, nxt, to, res, t, backward, level, queue)   # the vertices that still reach t
    for x in range(n):
        sink_side[x] = level[x] >= 0
    return flow


KERNELS = Kernels(globals(), ["_bfs", "_blocking_flow", "max_flow_arrays"], min_work=MIN_COMPILED_EDGES)


def compiled_max_flow(nedges: int):
    """The compiled :func:`max_flow_arrays` for a graph of ``nedges`` edges, or None where
    networkx should run (numba missing, ``HCCC_JIT=python``, or a small graph)."""
    return KERNELS.compiled_for("max_flow_arrays", int(nedges))
