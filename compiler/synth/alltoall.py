"""AllToAll synthesis: route every block, then pack the hops into steps.

AllToAll is not a dissemination problem (each block has one destination), so it does not go
through the CEGIS loop of :mod:`.cegis`. Instead:

1. **Routing.** Every piece of every block (``(i*N + j)*K + k``) gets a path
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
import math

import numpy as np

from hccc.compiler.synth.bounds import alltoall_step_bound
from hccc.compiler.synth.budget import least_transfers, overruns, schedule_seconds, wall_seconds
from hccc.compiler.synth.compose import list_schedule
from hccc.compiler.synth.problem import Network, Schedule, Task
from hccc.util import clock
from hccc.util.clock import Deadline

#: the share of the time left that the step lower bound's max-flows get before the routing (its
#: cuts are examined most telling first and stop there, the bound staying valid): a 512-GPU
#: cluster has 1,152 cut sets, 5 ms each by the compiled max-flow, which the rest of the command
#: (routing, scheduling, the cut bound in bytes, emission) needs time beside
BOUND_SHARE = 0.25


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


def synthesize_alltoall(net: Network, chunks_per_rank: int = 1, *, time_limit: float | None = None,
                        deadline: Deadline | None = None, must_end: Deadline | None = None):
    """``(schedule, lower_bound_steps, detail)`` for an AllToAll on ``net`` (see the module doc), by
    ``deadline`` (or within ``time_limit`` seconds; neither: 60 s): the step bound gets
    :data:`BOUND_SHARE` of it; the routing stops where the list scheduler's predicted time
    (:func:`.budget.schedule_seconds` of the hops and the step bound) is all that is left, and
    every block not yet routed then takes its direct link (a block without one is still routed).
    ``detail["phase_seconds"]``: what the bound, the routing and the scheduling took.

    ``must_end``: the time by which the whole synthesis must end (``hccc synth --time-limit``, less
    the closing phases' predicted time); where the list scheduler alone, which cannot stop, would
    end past it by more than :func:`.budget.overruns` allows, the AllToAll is refused (a
    ``ValueError`` saying what it needs) before any routing."""
    if deadline is None:
        deadline = Deadline.after(60.0 if time_limit is None else float(time_limit))
    n, K = net.nranks, int(chunks_per_rank)
    if K < 1:
        raise ValueError("chunks per rank must be at least 1")
    task = alltoall_task(n, K)
    t0 = clock.now()
    lb = alltoall_step_bound(net, K, deadline=deadline.share(BOUND_SHARE))
    t_bound = clock.now()
    # the scheduler cannot stop: the routing leaves it its predicted time
    hops = least_transfers("alltoall", n, K)
    scheduling = schedule_seconds(hops, lb)
    left = must_end.left() if must_end is not None else 0.0
    # refused where it cannot fit at an idle machine's pace; the routing leaves it its time at the
    # pace the machine gives the command (budget.wall_seconds)
    if must_end is not None and overruns(scheduling, left):
        leaves = (f"the time limit leaves it {left:.1f} s" if left > 0 else
                  f"the time limit leaves it nothing ({-left:.1f} s short already)")
        raise ValueError(f"the AllToAll's list scheduler alone needs about {scheduling:.1f} s for its "
                         f"{hops:,} transfers over at least {lb:,} steps, and {leaves} once the proof and "
                         f"the text have their predicted time; raise --time-limit by "
                         f"{math.ceil(scheduling - left)} s or more")
    deadline = Deadline(deadline.at - wall_seconds(scheduling))
    out_ptr, out_idx = net.out_csr()
    load_p = np.zeros(net.npairs, np.int64)
    load_g = np.zeros(net.ngroups, np.int64)
    # blocks whose ranks sit in different top-level parts first (they cross the scarce links)
    part = net.levels[0] if net.levels else np.zeros(n, np.int64)
    ii, jj = np.divmod(np.arange(n * n, dtype=np.int64), n)
    ii, jj = ii[ii != jj], jj[ii != jj]
    first = np.lexsort((ii, (jj - ii) % n, part[ii] == part[jj]))
    ii, jj = ii[first], jj[first]
    direct = net.pair_index(np.arange(n).repeat(n), np.tile(np.arange(n), n)).reshape(n, n)
    tu, tv, tk, plen, hop = [], [], [], [], []
    cut_at = None                      # (k, block index) from which the direct links are taken

    def route(i: int, j: int, c: int) -> None:
        """Block ``c`` from ``i`` to ``j`` on its least-loaded path, recorded hop by hop."""
        path = _route(net, i, j, load_p, load_g, out_ptr, out_idx)
        for h, p in enumerate(path):
            load_p[p] += 1
            load_g[net.groups_of(p)] += 1
            tu.append(int(net.psrc[p]))
            tv.append(int(net.pdst[p]))
            tk.append(c)
            plen.append(len(path))
            hop.append(h)

    for k in range(K):
        for b, (i, j) in enumerate(zip(ii.tolist(), jj.tolist())):
            c = (i * n + j) * K + k
            if deadline.passed() and direct[i, j] >= 0:
                cut_at = (k, b)
                break
            route(i, j, c)
        if cut_at is not None:
            break
    timed_out = cut_at is not None
    if timed_out:
        # out of time: every block not routed takes its direct link, all at once; one without a
        # direct link is still routed
        k0, b0 = cut_at
        kk = np.concatenate([np.full(len(ii) - b0, k0, np.int64)] +
                            [np.full(len(ii), k, np.int64) for k in range(k0 + 1, K)])
        bi = np.concatenate([ii[b0:]] + [ii] * (K - k0 - 1))
        bj = np.concatenate([jj[b0:]] + [jj] * (K - k0 - 1))
        p = direct[bi, bj]
        has = p >= 0
        tu.extend(net.psrc[p[has]].astype(np.int64).tolist())
        tv.extend(net.pdst[p[has]].astype(np.int64).tolist())
        tk.extend(((bi[has] * n + bj[has]) * K + kk[has]).tolist())
        plen.extend([1] * int(has.sum()))
        hop.extend([0] * int(has.sum()))
        for i, j, k in zip(bi[~has].tolist(), bj[~has].tolist(), kk[~has].tolist()):
            route(i, j, (i * n + j) * K + k)
    if not tu:
        return Schedule.empty(), lb, {"timed_out": False}
    tu, tv, tk = (np.asarray(x, np.int64) for x in (tu, tv, tk))
    # the scheduler's priority: long paths first, earlier hops first, then the blocks in the order
    # they were routed (by shift): each step's first transfers then come from every rank to every
    # other, the NIC groups fill evenly, and each step's scan ends soon after they are full (a
    # 512-GPU AllToAll's scheduling less than half the CPU of the blocks' own order, the same steps:
    # docs/archive/measurements-log.md#alltoall-under---time-limit-every-phase)
    routed = np.empty(n * n, np.int64)
    routed[ii * n + jj] = np.arange(len(ii))
    rank = (tk % K) * len(ii) + routed[tk // K]
    order = np.lexsort((rank, np.asarray(hop), -np.asarray(plen)))
    t_route = clock.now()
    sched = list_schedule(net, task, tu[order], tv[order], tk[order])
    plen = np.asarray(plen)
    detail = {"timed_out": timed_out, "max_path_hops": int(plen.max()), "relayed_blocks":
              int(np.unique(tk[plen > 1]).size),
              "phase_seconds": {"step_bound": round(t_bound - t0, 3), "routing": round(t_route - t_bound, 3),
                                "scheduling": round(clock.now() - t_route, 3)}}
    return sched, lb, detail


__all__ = ["alltoall_task", "synthesize_alltoall"]
