"""The greedy heuristic (HeteCCL Appendix H, GREEDYHEURISTIC): link-saturating, hierarchy-aware.

Each step is filled level by level over the network's hierarchy (nodes, islands, single ranks; see
:mod:`.problem`). At a level every *part* (a node, say) takes, in rounds, one chunk it does not
hold yet from a holder inside its parent part (the whole cluster for nodes, the node for islands, the
island for single ranks), most urgent part first (missing chunks over the part's entry capacity),
rarest chunk first, least loaded sender and receiver first. So a chunk crosses a bottleneck (a NIC,
a UPI link) into a part once and then spreads over cheap links, and the scarcest ingress is fed every
step. Coarse levels go first so that they get the scarce resources.

Only *enforced* shared groups are respected (``genforce``): the CEGIS loop starts with none and adds
the groups that verification finds overloaded, so the first schedule saturates links and may break
group limits, exactly as the paper's greedy does. Link capacities C(u, v), causality (a sender holds
the chunk at the start of the step, a receiver does not), receive-once and, when asked, HeteCCL
Eq. 8 (``fanout_one``) always hold.

The kernel is plain Python that numba compiles for large clusters (:mod:`hccc.util.jit`,
from :data:`MIN_COMPILED_WORK` ranks x ranks x chunks; same results either way).
"""
from __future__ import annotations

import threading

import numpy as np

from hccc.util import clock
from hccc.util.jit import Kernels
from hccc.util.kernel_sort import COMPILED as SORTS, argsort_stable
from hccc.compiler.synth.problem import Network, Schedule, Task


class GreedyStopped(ValueError):
    """A greedy run stopped at its time limit before its schedule was complete."""

def _append(out, nout, u, v, t, k):
    """Row ``nout`` of the growable transfer table ``out`` set to ``(u, v, t, k)``; the table doubles
    when full. Returns the (possibly new) table."""
    if nout == out.shape[0]:
        big = np.zeros((out.shape[0] * 2, 4), np.int64)
        for i in range(nout):          # (a loop: a slice assignment costs numba seconds to compile)
            for j in range(4):
                big[i, j] = out[i, j]
        out = big
    out[nout, 0] = u
    out[nout, 1] = v
    out[nout, 2] = t
    out[nout, 3] = k
    return out


def _fill_steps(has, t0, max_steps, psrc, cap, in_ptr, in_pairs, pg_ptr, pg_idx, gcap, genforce,
                part_of, nparts, mem_ptr, mem_idx, ecap, fanout_one, frozen_step, frozen_rows, prate, grate,
                rot, stop):
    """Run greedy steps from state ``has`` (modified in place) starting at step ``t0``.

    ``stop[0]`` set (by a timer thread: the kernel runs without the GIL) ends the run, polled before
    every part's pick (one search over the chunks, the part's members and their incoming pairs: a
    bounded piece of work, where one step of a 1,024-GPU Broadcast of 1,024 chunks took 30 s of
    CPU); a step stopped half-way is dropped whole, and the result is then incomplete.

    ``frozen_rows`` (src, dst, chunk) are imposed at step ``frozen_step`` first (the repaired
    checkpoint step); the greedy then fills that step's remaining capacity and the following steps.
    Returns (rows (M, 4) int64, number of steps used, complete flag).
    """
    N, NC = has.shape
    NL = part_of.shape[0]
    P = psrc.shape[0]
    G = gcap.shape[0]
    cap_rows = 1024
    out = np.zeros((cap_rows, 4), np.int64)
    nout = np.int64(0)    # not a literal 0: _append compiled once
    missing = 0
    for v in range(N):
        for k in range(NC):
            if has[v, k] == 0:
                missing += 1
    used_pair = np.zeros(P, np.int32)
    used_group = np.zeros(max(G, 1), np.int32)
    used_in = np.zeros(N, np.int32)
    used_out = np.zeros(N, np.int32)
    recv_now = np.zeros((N, NC), np.uint8)
    sent_now = np.zeros((N, NC), np.uint8)
    gh = np.zeros(NC, np.int64)
    cum_pair = np.zeros(P, np.float64)
    cum_group = np.zeros(max(G, 1), np.float64)
    cum_in = np.zeros((NL, N), np.float64)
    cum_out = np.zeros((NL, N), np.float64)
    t = t0
    halted = False
    while missing > 0 and t < t0 + max_steps and stop[0] == 0:
        step_rows = nout
        used_pair[:] = 0
        used_group[:] = 0
        used_in[:] = 0
        used_out[:] = 0
        recv_now[:, :] = 0
        sent_now[:, :] = 0
        gh[:] = 0
        for v in range(N):
            for k in range(NC):
                gh[k] += has[v, k]
        korder = argsort_stable(gh * NC + (np.arange(NC) + t * 7 + rot) % NC)   # distinct keys
        made = 0
        if t == frozen_step:
            for i in range(frozen_rows.shape[0]):
                u = frozen_rows[i, 0]
                v = frozen_rows[i, 1]
                k = frozen_rows[i, 2]
                p = frozen_rows[i, 3]
                recv_now[v, k] = 1
                sent_now[u, k] = 1
                used_pair[p] += 1
                cum_pair[p] += 1
                for j in range(pg_ptr[p], pg_ptr[p + 1]):
                    used_group[pg_idx[j]] += 1
                    cum_group[pg_idx[j]] += 1
                used_in[v] += 1
                used_out[u] += 1
                out = _append(out, nout, u, v, t, k)
                nout += 1
                made += 1
        for lvl in range(NL):
            npart = nparts[lvl]
            phas = np.zeros((npart, NC), np.uint8)
            for v in range(N):
                c = part_of[lvl, v]
                for k in range(NC):
                    if has[v, k] or recv_now[v, k]:
                        phas[c, k] = 1
            need = np.zeros(npart, np.int64)
            for c in range(npart):
                s = 0
                for k in range(NC):
                    if phas[c, k]:
                        s += 1      # (not s += phas[c, k]: a Python int plus a numpy uint8 is a uint8)
                need[c] = NC - s
            done = np.zeros(npart, np.uint8)
            while True:
                urg = np.zeros(npart)
                for c in range(npart):
                    if done[c] or need[c] == 0:
                        urg[c] = -1.0
                    else:
                        urg[c] = need[c] / ecap[lvl, c]
                porder = argsort_stable(-urg)
                progress = False
                for ci in range(npart):
                    if stop[0] != 0:
                        halted = True
                        break
                    c = porder[ci]
                    if urg[c] < 0:
                        break
                    # the rarest chunk first; among equally rare chunks the least loaded
                    # (sender, receiver, pair) wins
                    best_p = -1
                    best_v = np.int64(-1)    # not literal -1s: _append compiled once
                    best_k = np.int64(-1)
                    best_score = 1e300
                    for kk in range(NC):
                        k = korder[kk]
                        if phas[c, k]:
                            continue
                        if best_k >= 0 and gh[k] > gh[best_k]:
                            break
                        for mi in range(mem_ptr[lvl, c], mem_ptr[lvl, c + 1]):
                            v = mem_idx[lvl, mi]
                            for j in range(in_ptr[v], in_ptr[v + 1]):
                                p = in_pairs[j]
                                u = psrc[p]
                                if has[u, k] == 0 or part_of[lvl, u] == c:
                                    continue
                                if lvl > 0 and part_of[lvl - 1, u] != part_of[lvl - 1, v]:
                                    continue
                                if used_pair[p] >= cap[p]:
                                    continue
                                if fanout_one and sent_now[u, k]:
                                    continue
                                ok = True
                                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                                    g = pg_idx[q]
                                    if genforce[g] and used_group[g] >= gcap[g]:
                                        ok = False
                                        break
                                if not ok:
                                    continue
                                # per-step balance first, then the load so far (normalised by
                                # capacity) of the pair and its groups: spreads a node's traffic
                                # over all its NICs, not only within a step
                                cum = cum_pair[p] / prate[p]
                                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                                    g = pg_idx[q]
                                    cg = cum_group[g] / grate[g]
                                    if cg > cum:
                                        cum = cg
                                score = ((used_in[v] * 4 + used_out[u]) * 1e6 + cum * 1e3
                                         + (cum_in[lvl, v] + cum_out[lvl, u]) * 10 + used_pair[p])
                                if score < best_score:
                                    best_score = score
                                    best_p = p
                                    best_v = v
                                    best_k = k
                    found = best_p >= 0
                    if found:
                        p = best_p
                        v = best_v
                        k = best_k
                        u = psrc[p]
                        recv_now[v, k] = 1
                        sent_now[u, k] = 1
                        used_pair[p] += 1
                        cum_pair[p] += 1
                        for q in range(pg_ptr[p], pg_ptr[p + 1]):
                            used_group[pg_idx[q]] += 1
                            cum_group[pg_idx[q]] += 1
                        used_in[v] += 1
                        used_out[u] += 1
                        cum_in[lvl, v] += 1
                        cum_out[lvl, u] += 1
                        phas[c, k] = 1
                        need[c] -= 1
                        out = _append(out, nout, u, v, t, k)
                        nout += 1
                        made += 1
                        progress = True
                    if not found:
                        done[c] = 1
                if halted or not progress:
                    break
            if halted:
                break
        if halted:
            nout = step_rows         # the step stopped half-way: none of it
            break
        if made == 0:
            break
        for v in range(N):
            for k in range(NC):
                if recv_now[v, k]:
                    has[v, k] = 1
                    missing -= 1
        t += 1
    return out[:nout], t - t0, missing == 0


#: Greedy variants: how the load so far is normalised when choosing among equally good transfers.
#: 0: by real bandwidth (C(u, v) rounds up, so two chunks "fit" a NIC only 1.5x faster); 1: by the
#: chunk capacities C; 2: not at all (per-step balance only). Variant v >= 3 is variant v % 3 with
#: the order of equally rare chunks rotated.
VARIANTS = ("bandwidth", "capacity", "step")


class GreedyInputs:
    """Arrays the kernel needs, derived once per (network, task, variant)."""

    prate: np.ndarray
    grate: np.ndarray

    def __init__(self, net: Network, task: Task, variant: int = 0):
        self.net = net
        self.task = task
        n = net.nranks
        levels = [lv.astype(np.int64) for lv in net.levels] + [np.arange(n, dtype=np.int64)]
        self.part_of = np.stack(levels).astype(np.int64)
        NL = len(levels)
        self.nparts = np.array([int(lv.max()) + 1 for lv in levels], np.int64)
        maxp = int(self.nparts.max())
        self.mem_ptr = np.zeros((NL, maxp + 1), np.int64)
        self.mem_idx = np.zeros((NL, n), np.int64)
        for i, lv in enumerate(levels):
            order = np.argsort(lv, kind="stable")
            self.mem_idx[i] = order
            ptr = np.searchsorted(lv[order], np.arange(maxp + 1))
            self.mem_ptr[i] = ptr
        self.in_ptr, self.in_pairs = net.in_csr()
        self.in_pairs = self.in_pairs.astype(np.int64)
        self.ecap = entry_capacity(net, levels)
        # rates that normalise the load so far when choosing among equivalent transfers (VARIANTS)
        mode = VARIANTS[int(variant) % len(VARIANTS)]
        # further variants rotate the order in which equally rare chunks are tried
        self.rot = (int(variant) // len(VARIANTS)) * max(1, task.nchunks // 3 + 1)
        if mode == "step":
            self.prate = np.full(net.npairs, 1e12)
            self.grate = np.full(max(net.ngroups, 1), 1e12)
        elif mode == "bandwidth" and net.bw is not None and net.gbw is not None:
            scale = float(np.min(net.bw)) if net.npairs else 1.0
            self.prate = np.asarray(net.bw, float) / scale
            self.grate = np.maximum(np.asarray(net.gbw, float) / scale, 1e-9) if net.ngroups else np.ones(1)
        else:
            self.prate = net.cap.astype(float)
            self.grate = net.gcap.astype(float) if net.ngroups else np.ones(1)
        if self.grate.size == 0:
            self.grate = np.ones(1)

    def run(self, has: np.ndarray, t0: int, max_steps: int, genforce: np.ndarray,
            frozen: Schedule | None = None, stop_at: float | None = None) -> tuple[Schedule, bool]:
        """Greedy steps from ``has`` at step ``t0``; returns (schedule of the new steps, complete).
        ``stop_at`` (a ``clock.now()`` value): an unfinished run is stopped then and
        :class:`GreedyStopped` raised."""
        stop = np.zeros(1, np.uint8)
        timer = None
        if stop_at is not None:
            # compile (or load) the kernel first: the timer counts real seconds from here, and
            # numba's compiling is not the search's (the work clock leaves it out). The loading and
            # the warm run's own work are the command's: ``stop_at`` is not moved for them (it
            # was, by up to 1.2 s at 1,024 GPUs, past --time-limit)
            self._run(has, t0, 0, genforce, frozen, stop)
            timer = threading.Timer(max(0.0, stop_at - clock.now()), stop.fill, args=(1,))
            timer.daemon = True
            timer.start()
        try:
            sched, complete = self._run(has, t0, max_steps, genforce, frozen, stop)
        finally:
            if timer is not None:
                timer.cancel()
        if stop[0] and not complete:
            raise GreedyStopped("the greedy schedule was not complete at the time limit")
        return sched, complete

    def _run(self, has, t0, max_steps, genforce, frozen, stop) -> tuple[Schedule, bool]:
        net = self.net
        h = np.ascontiguousarray(has, dtype=np.uint8).copy()
        if frozen is not None and len(frozen):
            fr = np.stack([frozen.src, frozen.dst, frozen.chunk,
                           net.pair_index(frozen.src, frozen.dst)], axis=1).astype(np.int64)
            fstep = int(frozen.step[0])
        else:
            fr = np.zeros((0, 4), np.int64)
            fstep = -1
        rows, _, complete = KERNELS.pick("_fill_steps", h.shape[0] * h.size)(
            h, int(t0), int(max_steps), net.psrc.astype(np.int64), net.cap.astype(np.int64),
            self.in_ptr, self.in_pairs, net.pg_ptr, net.pg_idx.astype(np.int64),
            net.gcap.astype(np.int64), np.ascontiguousarray(genforce, dtype=np.uint8),
            self.part_of, self.nparts, self.mem_ptr, self.mem_idx, self.ecap, bool(self.task.fanout_one),
            fstep, fr, self.prate, self.grate, self.rot, stop)
        return Schedule(rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(), rows[:, 3].copy()), bool(complete)


def entry_capacity(net: Network, levels: list[np.ndarray]) -> np.ndarray:
    """Chunks per step that can enter each part of each level from the rest of its parent part
    (:meth:`.problem.Network.entry_capacity`); the greedy's urgency is missing chunks over this."""
    maxp = max(int(lv.max()) + 1 for lv in levels)
    ecap = np.full((len(levels), maxp), 1e-9)
    for li, lv in enumerate(levels):
        parent = levels[li - 1] if li > 0 else None
        e = net.entry_capacity(lv, parent)
        ecap[li, :e.size] = np.maximum(e, 1e-9)
    return ecap


#: ranks x ranks x chunks from which the greedy runs compiled (plain Python takes about a second
#: per greedy run there; numba's first compile of the kernel takes 15-20 s)
MIN_COMPILED_WORK = 1 << 17
KERNELS = Kernels(globals(), ["_append", "_fill_steps"], min_work=MIN_COMPILED_WORK,
                  compiled_globals={"argsort_stable": SORTS["argsort_stable"]})
