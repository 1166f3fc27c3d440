"""AllToAll synthesis: route every block, then pack the hops into steps.

AllToAll is not a dissemination problem (each block has one destination), so it does not go
through the CEGIS loop of :mod:`.cegis`. Instead:

1. **Routing.** Every piece of every block (``(i*N + j)*K + k``, DESIGN.md section 3) gets a path
   from ``i`` to ``j`` over the cluster's rank pairs, chosen one piece at a time by Dijkstra with
   load-dependent weights: crossing pair ``p`` costs ``(load_p + 1) / C(p)`` plus, for each shared
   group ``g`` it belongs to, ``(load_g + 1) / C_g`` -- the steps the piece would add to the
   busiest resource if everything so far were spread evenly. Pieces of blocks that cross the
   most constrained cut are routed first. Without a direct link a block relays through other ranks
   (scratch), and when the direct link is saturated a detour through a less loaded path is taken.
2. **Scheduling.** The hops are packed into steps by the list scheduler of :mod:`.compose`: a hop
   runs at the first step at which its sender holds the piece and every capacity it needs
   (C(u, v), shared groups) has room; long paths first.

The step lower bound and the bandwidth cut bound are :func:`.bounds.alltoall_step_bound` and
:func:`.bounds.alltoall_cut_bound_seconds`.
"""
from __future__ import annotations

import heapq

import numpy as np

from hccc.compiler.synth.bounds import alltoall_step_bound
from hccc.compiler.synth.compose import list_schedule
from hccc.compiler.synth.problem import Network, Schedule, Task
from hccc.util import clock


def alltoall_task(nranks: int, chunks_per_rank: int = 1) -> Task:
    """The AllToAll holdings: chunk ``(i*N + j)*K + k`` starts at rank ``i``."""
    n, k = int(nranks), int(chunks_per_rank)
    origin = np.arange(n * n * k, dtype=np.int64) // (n * k)
    return Task(n, n * n * k, origin, False, "alltoall", k)


def _route(net: Network, src: int, dst: int, load_p: np.ndarray, load_g: np.ndarray,
           out_ptr: np.ndarray, out_idx: np.ndarray) -> list[int]:
    """Pairs of the cheapest path src -> dst under the current loads (Dijkstra)."""
    n = net.nranks
    dist = np.full(n, np.inf)
    via = np.full(n, -1, np.int64)
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        if u == dst:
            break
        for p in out_idx[out_ptr[u]:out_ptr[u + 1]].tolist():
            w = (load_p[p] + 1) / max(int(net.cap[p]), 1)
            for g in net.groups_of(p).tolist():
                w += (load_g[g] + 1) / max(int(net.gcap[g]), 1)
            v = int(net.pdst[p])
            nd = d + w
            if nd < dist[v] - 1e-12:
                dist[v] = nd
                via[v] = p
                heapq.heappush(heap, (nd, v))
    if not np.isfinite(dist[dst]):
        raise ValueError(f"rank {dst} cannot be reached from rank {src}")
    path = []
    v = dst
    while v != src:
        p = int(via[v])
        path.append(p)
        v = int(net.psrc[p])
    return path[::-1]


def synthesize_alltoall(net: Network, chunks_per_rank: int = 1, *, time_limit: float = 60.0):
    """``(schedule, lower_bound_steps, detail)`` for an AllToAll on ``net`` (see the module doc)."""
    t0 = clock.now()
    n, K = net.nranks, int(chunks_per_rank)
    if K < 1:
        raise ValueError("chunks per rank must be at least 1")
    task = alltoall_task(n, K)
    lb = alltoall_step_bound(net, K)
    out_ptr, out_idx = net.out_csr()
    load_p = np.zeros(net.npairs, np.int64)
    load_g = np.zeros(net.ngroups, np.int64)
    # blocks whose ranks sit in different top-level parts first (they cross the scarce links)
    part = net.levels[0] if net.levels else np.zeros(n, np.int64)
    blocks = [(i, j) for i in range(n) for j in range(n) if i != j]
    blocks.sort(key=lambda b: (part[b[0]] == part[b[1]], (b[1] - b[0]) % n, b[0]))
    tu, tv, tk, plen, hop = [], [], [], [], []
    deadline = t0 + float(time_limit)
    direct = net.pair_index(np.arange(n).repeat(n), np.tile(np.arange(n), n)).reshape(n, n)
    timed_out = False
    for k in range(K):
        for i, j in blocks:
            c = (i * n + j) * K + k
            if clock.now() < deadline or direct[i, j] < 0:
                path = _route(net, i, j, load_p, load_g, out_ptr, out_idx)
            else:   # out of time: the direct link
                timed_out = True
                path = [int(direct[i, j])]
            for h, p in enumerate(path):
                load_p[p] += 1
                load_g[net.groups_of(p)] += 1
                tu.append(int(net.psrc[p]))
                tv.append(int(net.pdst[p]))
                tk.append(c)
                plen.append(len(path))
                hop.append(h)
    if not tu:
        return Schedule.empty(), lb, {"timed_out": False}
    tu, tv, tk = (np.asarray(x, np.int64) for x in (tu, tv, tk))
    order = np.lexsort((tk, np.asarray(hop), -np.asarray(plen)))
    sched = list_schedule(net, task, tu[order], tv[order], tk[order])
    detail = {"timed_out": timed_out, "max_path_hops": int(max(plen)), "relayed_blocks":
              int(len({int(c) for c, L in zip(tk.tolist(), plen) if L > 1}))}
    return sched, lb, detail


__all__ = ["alltoall_task", "synthesize_alltoall"]
