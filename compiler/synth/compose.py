"""Hierarchical composition beyond one pod (HeteCCL section 7) and symmetry.

Large clusters are built from identical pods. :func:`plan_pods` finds them (or checks a requested pod
size): consecutive blocks of ``m`` ranks that never split a node, whose sub-networks are isomorphic
under the rank order (same pairs, capacities and group structure: :meth:`.problem.Network.node_signature`),
and that are joined by *rails* (rank i of every pod linked to rank i of every other pod).

:func:`synthesize_composed` then, for an AllGather-type task:

1. solves **one** pod (the pod's AllGather, CEGIS on the pod's sub-network); every other pod reuses
   it, relabelled -- the isomorphic pods are solved once;
2. solves the **inter-pod problem over pods as nodes**: an AllGather over P logical vertices, one
   block (a pod's chunks) per vertex, each vertex sending and receiving at most one block per logical
   step (shared groups of capacity 1), with the same CEGIS engine;
3. **composes** them: each block transfer ``p -> q`` of the inter-pod schedule becomes one transfer
   per rail (rank i of pod p sends its chunks of the block to rank i of pod q), and afterwards rank i
   of every pod spreads the chunks it gathered over its pod along the pod schedule's trees (rank a's
   chunk tree carries, for every source pod, the chunk that pod's rank a owned). All these transfers
   are packed into real steps by a list scheduler that respects every capacity of the real cluster
   (links, NICs, switches) and starts a transfer as soon as its sender holds the chunk, so the rail
   phase and the intra-pod phase overlap.

The result is checked like any other schedule (:func:`.check.check`) before it is returned.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.util import clock
from hccc.util.jit import Kernels
from hccc.util.kernel_sort import COMPILED as SORTS, argsort_stable, sort_range
from hccc.compiler.synth.bounds import step_lower_bound
from hccc.compiler.synth.cegis import Progress, TaskResult, synthesize_task
from hccc.compiler.synth.check import check
from hccc.compiler.synth.problem import Network, Schedule, Task, allgather_task

#: flat synthesis up to this many ranks when no pod size is requested
FLAT_LIMIT = 64


@dataclass(frozen=True)
class PodPlan:
    pod_ranks: int
    npods: int

    def as_dict(self) -> dict:
        return {"pod_ranks": self.pod_ranks, "pods": self.npods}


def _rails_ok(net: Network, m: int, P: int) -> bool:
    n = net.nranks
    r = np.arange(n)
    src = np.repeat(r, P - 1)
    pod = src // m
    other = np.tile(np.arange(P - 1), n)
    qpod = other + (other >= pod)
    dst = qpod * m + src % m
    return bool((net.pair_index(src, dst) >= 0).all())


def _pod_ok(net: Network, m: int) -> bool:
    n = net.nranks
    if n % m or n // m < 2:
        return False
    P = n // m
    node = net.levels[0]
    blocks = np.arange(n) // m
    # a node never spans two pods
    first = np.zeros(node.max() + 1, np.int64) - 1
    for r in range(n):
        if first[node[r]] < 0:
            first[node[r]] = blocks[r]
        elif first[node[r]] != blocks[r]:
            return False
    sig = net.node_signature(np.arange(m))
    for p in range(1, P):
        if net.node_signature(np.arange(p * m, (p + 1) * m)) != sig:
            return False
    return _rails_ok(net, m, P)


def plan_pods(net: Network, task: Task, pod_ranks: int | None) -> PodPlan | None:
    """The pod decomposition to use, or None for flat synthesis (see the module docstring)."""
    n = net.nranks
    allgather_like = task.kind == "allgather"
    if pod_ranks is not None:
        m = int(pod_ranks)
        if m >= n:
            return None
        if not allgather_like:
            raise ValueError("hierarchical composition supports AllGather-type phases only "
                             "(AllGather, ReduceScatter, AllReduce)")
        if not _pod_ok(net, m):
            raise ValueError(f"the cluster is not made of identical pods of {m} ranks joined by rails")
        return PodPlan(m, n // m)
    if n <= FLAT_LIMIT or not allgather_like:
        return None
    for m in range(min(FLAT_LIMIT, n // 2), 0, -1):
        if n % m == 0 and _pod_ok(net, m):
            return PodPlan(m, n // m)
    return None


def pod_level_network(P: int) -> Network:
    """P logical vertices, all connected; one block in and one block out per vertex per step."""
    src = np.repeat(np.arange(P), P - 1)
    other = np.tile(np.arange(P - 1), P)
    dst = other + (other >= src)
    order = np.lexsort((dst, src))
    src, dst = src[order].astype(np.int32), dst[order].astype(np.int32)
    # group P + v: ingress of v; group v: egress of v
    pairs_g = np.stack([src, P + dst], axis=1).astype(np.int32)
    ptr = np.arange(0, 2 * src.size + 1, 2, dtype=np.int64)
    labels = [f"pod {v} egress" for v in range(P)] + [f"pod {v} ingress" for v in range(P)]
    levels = [np.arange(P, dtype=np.int32)]
    return Network(P, src, dst, np.ones(src.size, np.int32), ptr, pairs_g.ravel(), np.ones(2 * P, np.int32),
                   labels, levels, f"{P} pods")


def _list_schedule(has, tu, tv, tk, tp, cap, pg_ptr, pg_idx, gcap, fanout_one, max_steps):
    """Pack transfers (in priority order) into steps: a transfer runs at the first step at which its
    sender holds the chunk and every capacity it needs is free. Returns the step of each transfer
    (-1 when it never could run)."""
    N, NC = has.shape
    M = tu.shape[0]
    step_of = np.full(M, -1, np.int64)
    # transfers waiting for (u, k): CSR by key
    key = tu * NC + tk
    order = argsort_stable(key)
    skey = key[order]
    ready = np.zeros(M, np.uint8)
    nready = 0
    rlist = np.zeros(M, np.int64)
    P = cap.shape[0]
    G = gcap.shape[0]
    # ready transfers not yet placed: using each group, and using none
    ready_g = np.zeros(max(G, 1), np.int64)
    left_g = np.zeros(max(G, 1), np.int64)
    ready_free = 0
    for i in range(M):
        if has[tu[i], tk[i]]:
            rlist[nready] = i
            nready += 1
            ready[i] = 1
            p = tp[i]
            if pg_ptr[p] == pg_ptr[p + 1]:
                ready_free += 1
            for q in range(pg_ptr[p], pg_ptr[p + 1]):
                ready_g[pg_idx[q]] += 1
    used_p = np.zeros(P, np.int64)
    used_g = np.zeros(max(G, 1), np.int64)
    sent = np.zeros((N, NC), np.uint8) if fanout_one else np.zeros((1, 1), np.uint8)
    done = 0
    t = 0
    acc = np.zeros(M, np.int64)
    nsorted = nready                   # rlist[:nsorted] is in priority order already
    rl = np.zeros(M, np.int64)
    while done < M and t < max_steps:
        # ready transfers in priority order (index order = priority): the ones kept from the last
        # step are in order, the ones released since are sorted and merged in (sorting the whole
        # list each step made a 512-GPU AllToAll's 2,016 steps take 87 s)
        sort_range(rlist, nsorted, nready)
        x, y, z = 0, nsorted, 0
        while x < nsorted or y < nready:
            if y >= nready or (x < nsorted and rlist[x] < rlist[y]):
                rl[z] = rlist[x]
                x += 1
            else:
                rl[z] = rlist[y]
                y += 1
            z += 1
        used_p[:] = 0
        used_g[:] = 0
        if fanout_one:
            sent[:, :] = 0
        nacc = 0
        keep = 0
        # the scan ends early, exactly, once every transfer left in it needs a full group: no open
        # group has a user left to visit (``live``) and no transfer without a group is left
        # (a 512-GPU AllToAll, its NIC groups binding: 2,016 steps over up to 261,632 ready
        # transfers in a third of the CPU of the full scan, the same steps:
        # docs/archive/measurements-log.md#alltoall-under---time-limit-every-phase)
        live = 0
        for g in range(G):
            left_g[g] = ready_g[g]
            if left_g[g] > 0 and gcap[g] > 0:
                live += 1
        left_free = ready_free
        for j in range(nready):
            if live == 0 and left_free == 0:
                for r in range(j, nready):      # all refused: kept, in order
                    rl[keep] = rl[r]
                    keep += 1
                break
            i = rl[j]
            p = tp[i]
            if pg_ptr[p] == pg_ptr[p + 1]:
                left_free -= 1
            for q in range(pg_ptr[p], pg_ptr[p + 1]):
                g = pg_idx[q]
                left_g[g] -= 1
                if left_g[g] == 0 and used_g[g] < gcap[g]:
                    live -= 1
            ok = used_p[p] < cap[p]
            if ok:
                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                    if used_g[pg_idx[q]] >= gcap[pg_idx[q]]:
                        ok = False
                        break
            if ok and fanout_one and sent[tu[i], tk[i]]:
                ok = False
            if ok:
                used_p[p] += 1
                if pg_ptr[p] == pg_ptr[p + 1]:
                    ready_free -= 1
                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                    g = pg_idx[q]
                    used_g[g] += 1
                    ready_g[g] -= 1
                    if used_g[g] == gcap[g] and left_g[g] > 0:
                        live -= 1
                if fanout_one:
                    sent[tu[i], tk[i]] = 1
                step_of[i] = t
                acc[nacc] = i
                nacc += 1
            else:
                rl[keep] = i
                keep += 1
        if nacc == 0:
            break
        nready = keep
        for j in range(keep):          # (a loop: a slice assignment costs numba seconds to compile)
            rlist[j] = rl[j]
        nsorted = keep
        # receptions: new holders release their waiting transfers
        for a in range(nacc):
            i = acc[a]
            v = tv[i]
            k = tk[i]
            if has[v, k] == 0:
                has[v, k] = 1
                kk = v * NC + k
                lo = np.searchsorted(skey, kk)
                while lo < M and skey[lo] == kk:
                    w = order[lo]
                    if ready[w] == 0:
                        ready[w] = 1
                        rlist[nready] = w
                        nready += 1
                        pw = tp[w]
                        if pg_ptr[pw] == pg_ptr[pw + 1]:
                            ready_free += 1
                        for q in range(pg_ptr[pw], pg_ptr[pw + 1]):
                            ready_g[pg_idx[q]] += 1
                    lo += 1
        done += nacc
        t += 1
    return step_of


#: transfers from which the list scheduler runs compiled (:mod:`hccc.util.jit`). The plain twin's
#: time grows as transfers x steps: a 128-GPU AllToAll (16,256 transfers, 127 steps) took 9.7 s
#: plain and about 0.3 s compiled on a 2-core machine (the whole 1 s-limited synthesis 2.0 s), so
#: the plain twin is kept only below a sixteenth of that, where it takes well under a second
MIN_COMPILED_TRANSFERS = 1_000
KERNELS = Kernels(globals(), ["_list_schedule"], min_work=MIN_COMPILED_TRANSFERS,
                  compiled_globals={name: SORTS[name] for name in ("sort_range", "argsort_stable")})


def list_schedule(net: Network, task: Task, tu, tv, tk) -> Schedule:
    """Steps for transfers given in priority order (see :func:`_list_schedule`)."""
    tp = net.pair_index(tu, tv)
    if (tp < 0).any():
        raise ValueError("composition produced a transfer between unconnected ranks")
    st = KERNELS.pick("_list_schedule", len(tu))(task.initial(), np.asarray(tu, np.int64), np.asarray(tv, np.int64),
                        np.asarray(tk, np.int64), tp.astype(np.int64), net.cap.astype(np.int64), net.pg_ptr,
                        net.pg_idx.astype(np.int64), net.gcap.astype(np.int64), bool(task.fanout_one),
                        int(len(tu)) + 1)
    if (st < 0).any():
        raise ValueError("composition could not place every transfer")
    return Schedule(np.asarray(tu, np.int64), np.asarray(tv, np.int64), st, np.asarray(tk, np.int64))


def synthesize_composed(net: Network, task: Task, plan: PodPlan, *, deadline: float,
                        progress: Progress | None = None, use_smt: bool = True) -> tuple[TaskResult, dict]:
    """Compose a pod schedule and an inter-pod schedule (module docstring); returns (result, info)."""
    t0 = clock.now()
    note = progress or (lambda *_: None)
    m, P, K = plan.pod_ranks, plan.npods, task.chunks_per_rank
    budget = max(0.0, deadline - t0)
    # 1. one pod, solved once (isomorphic pods share it)
    pod_net, _ = net.subnetwork(np.arange(m))
    pod_task = allgather_task(m, K, fanout_one=task.fanout_one)
    pod = synthesize_task(pod_net, pod_task, deadline=t0 + 0.6 * budget, progress=progress, use_smt=use_smt)
    note("pod", {"steps": pod.steps, "ranks": m})
    # 2. pods as nodes
    lnet = pod_level_network(P)
    ltask = allgather_task(P, 1, fanout_one=task.fanout_one)
    inter = synthesize_task(lnet, ltask, deadline=t0 + 0.8 * budget, progress=None, use_smt=use_smt)
    note("inter-pod", {"steps": inter.steps, "pods": P})
    # 3. compose: rails first (inter-pod schedule per rail), then the pod trees per source pod
    i_loc = np.arange(m)
    j_loc = np.arange(K)
    ls = inter.schedule.sorted()
    # rail transfers: for each block transfer (p -> q, block b) and each rail i and chunk j
    lp, lq, lb = ls.src[:, None, None], ls.dst[:, None, None], ls.chunk[:, None, None]
    ru = (lp * m + i_loc[None, :, None]) + 0 * j_loc[None, None, :]
    rv = (lq * m + i_loc[None, :, None]) + 0 * j_loc[None, None, :]
    rk = ((lb * m + i_loc[None, :, None]) * K + j_loc[None, None, :])
    rprio = np.broadcast_to(ls.step[:, None, None], ru.shape)
    # pod trees: pod transfer (a -> b, local chunk c) at pod step s, for every pod p and source pod q
    ps = pod.schedule.sorted()
    a, b, c, s = ps.src, ps.dst, ps.chunk, ps.step
    pp = np.arange(P)[:, None, None]
    qq = np.arange(P)[None, :, None]
    tu2 = pp * m + a[None, None, :] + 0 * qq
    tv2 = pp * m + b[None, None, :] + 0 * qq
    # local chunk c belongs to local rank c // K (its j-th chunk c % K); for source pod q the
    # corresponding global chunk is ((q*m + c//K) * K + c % K)
    tk2 = (qq * m + (c // K)[None, None, :]) * K + (c % K)[None, None, :] + 0 * pp
    # priority: rails by logical step, then pod transfers by (pod step, rotation of the source pod)
    base = inter.steps
    prio2 = base + s[None, None, :] * P + (qq - pp) % P + 0 * tu2
    tu = np.concatenate([ru.ravel(), tu2.ravel()])
    tv = np.concatenate([rv.ravel(), tv2.ravel()])
    tk = np.concatenate([rk.ravel(), tk2.ravel()])
    prio = np.concatenate([rprio.ravel(), prio2.ravel()])
    keep = tu != tv
    tu, tv, tk, prio = tu[keep], tv[keep], tk[keep], prio[keep]
    order = np.lexsort((tk, tv, tu, prio))
    sched = list_schedule(net, task, tu[order], tv[order], tk[order])
    cex = check(net, task, sched, stop_after_first_step=True)
    if cex:
        raise AssertionError("composed schedule is invalid: " + cex[0].message)
    bound = step_lower_bound(net, task)
    info = {"pod_ranks": m, "pods": P, "pod_steps": pod.steps, "pod_lower_bound": pod.bound.steps,
            "inter_pod_steps": inter.steps, "inter_pod_lower_bound": inter.bound.steps,
            "pod_seconds": round(pod.seconds, 3), "inter_pod_seconds": round(inter.seconds, 3)}
    res = TaskResult(sched.sorted(), bound, pod.iterations + inter.iterations,
                     pod.learned_groups + inter.learned_groups, sched.nsteps, sched.nsteps <= bound.steps,
                     pod.timed_out or inter.timed_out, {"pod": pod.smt, "inter_pod": inter.smt},
                     clock.now() - t0)
    return res, info
