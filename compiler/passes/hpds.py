"""HPDS: hierarchical priority-based dynamic scheduling (ResCCL section 4.3, Algorithm 1).

Input: an Algorithm and its :class:`~hccc.compiler.passes.dag.DependencyDAG`. Output: a
:class:`~hccc.compiler.passes.schedule.Schedule` (sub-pipeline index per task and the global insertion
order).

Algorithm 1, as implemented here (interpretations of the pseudocode are marked *I*):

- ``G[C]`` is the chunk-DAG of one chunk id: the tasks of that chunk not yet scheduled. The priority
  queue ``Q`` holds one entry per chunk id; every chunk starts with priority 0 (*I1*: "equal
  initial priority"). ``Q`` lives across sub-pipelines (it is created once, line 3); the flags ``F``
  are reset to true at the start of every sub-pipeline (line 7).
- ``GetHighestWithFlag`` returns the flagged chunk of highest priority; ties go to the smallest
  chunk id (*I2*, for determinism). A chunk with no task left is flagged too but contributes
  nothing on its first visit and is unflagged, exactly as line 16 would do (*I3*: we simply do not
  put it in the queue, which is equivalent).
- Task extraction (lines 11-15): the chunk's tasks that have no remaining data predecessor at the
  moment of the visit are traversed in ``(step, row)`` order (*I4*: the traversal order of
  ``G[C]``); a task "satisfies all comm dependencies" when its link (directed ``(src, dst)``) is
  used neither by a task already in the current sub-pipeline nor by a task earlier in the same
  NodeList (*I5*). NodeList is a snapshot: a successor of a task of NodeList does not join the same
  NodeList, but it may be picked up by a later visit of the chunk in the *same* sub-pipeline, so a
  dependency chain can pipeline across micro-batches inside one sub-pipeline (*I6*).
- Line 16: an empty NodeList unflags the chunk for the rest of the sub-pipeline. (Links only get
  busier within a sub-pipeline and a chunk's ready set only grows when the chunk itself
  contributes, so an unflagged chunk could not have contributed later anyway.)
- Lines 19-22: NodeList is appended to the sub-pipeline (its order is the insertion order), the
  chunk's priority drops by 1 (under-used chunks come first), ``Q`` is re-sorted and the tasks are
  removed from ``G``.
- The sub-pipeline closes when no chunk is flagged (line 8) and is appended to the result; the
  outer loop runs until every task is scheduled.
- *I7* (hccc's addition; ResCCL orders candidates "by chunk priority and data-dependency
  readiness"): a ready task does not take a free link while another ready task of the same link
  became ready earlier. "Earlier" is measured on a unit-cost clock kept while scheduling: every
  task lasts 1 on its link, links run their tasks in scheduling order, a task starts after its
  producers of earlier sub-pipelines end and 1/16 (one micro-batch) after its producers of the
  same sub-pipeline start (they pipeline), and ends no sooner than 1/16 after its last producer
  ends; a task's ready time is the latest end among its producers. The parked task stays ready
  and competes again later; the one ready earliest is never blocked by this rule, so every
  sub-pipeline still makes progress.

  Why: in task-level execution a thread block runs a task for all micro-batches before its next
  one, so a link's order is what matters. Algorithm 1 alone lets a chained task whose producers
  end late (e.g. a ring hop behind a shared inter-node bottleneck) take a link ahead of a task
  whose data has long been there, and the bottleneck then idles while the chain refills. Measured
  with the simulator (busbw GB/s, HM AllReduce, 64 MB / 1 GB, size-aware slices): Fig. 10 cluster
  9.41 / 9.77 -> 9.74 / 9.98 (round-robin 9.74 / 9.98, algorithm-level 9.91 / 9.99); V100 (4+8)
  example 20.67 / 21.40 -> 21.39 / 21.89 (algorithm-level 21.49 / 21.75); A100 Topo4 113.9 /
  119.0 -> 121.8 / 125.9; unchanged elsewhere. Rejected alternatives, measured the same way: a
  strict per-link order by DAG depth or by as-late-as-possible level (also over tasks not yet
  ready: it leaves links idle at start-up, A100 Topo2 1 GB -12 %); preferring the smaller DAG depth
  among ready tasks (depth ignores where earlier tasks sit on their links: A100 Topo1/2 -5..-12 %).
  The clock's pipelining lag (1/16 vs 0 .. 1/2) did not change any of these results.

Data structures (for 2 M tasks): tasks are renumbered in ``(chunk, step, row)`` order; each chunk
keeps the list of its ready tasks not yet examined in the current sub-pipeline; a ready task found
link-blocked is parked until the sub-pipeline closes (a link used in a sub-pipeline stays used
until it closes, so re-examining it earlier is pointless); links carry the index of the last
sub-pipeline that used them (no clearing between sub-pipelines); the queue is a binary heap of
``(-priority, chunk)``. Rule I7 adds a heap of ``(ready time, task)`` per link (lazy deletion)
and a few floats per task: O(log) per task, about 4x the time of Algorithm 1 alone on 2 M tasks.
From :data:`~hccc.compiler.passes.hpds_kernel.COMPILED_FROM` tasks on (and when numba is installed)
:func:`hpds` runs the same procedure over flat arrays, compiled (:mod:`hccc.compiler.passes.hpds_kernel`):
the same schedule, task for task, about 15x faster. The list scheduler stays because plain Python runs it 3.4-3.8x
faster than the kernel's array loops (measured there).
"""
from __future__ import annotations

import heapq
from heapq import heappop, heappush

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.compiler.passes import hpds_kernel
from hccc.compiler.passes.dag import DependencyDAG
from hccc.compiler.passes.schedule import Schedule
from hccc.compiler.ir.sort_order import lexsort

__all__ = ["hpds"]

#: Rule I7's clock: a task lasts 1; a task pipelined behind a producer of its own sub-pipeline
#: starts, and ends at the earliest, this long after the producer (one micro-batch of ~16).
_SLICE = 1.0 / 16
_EPS = 1e-9


class _ChunkScheduler:
    """State shared by HPDS and round-robin: ready lists, link stamps, the growing pipeline."""

    def __init__(self, alg: Algorithm, dag: DependencyDAG) -> None:
        n = dag.ntasks
        if alg.ntransfers != n:
            raise ValueError(f"DAG has {n} tasks but the algorithm has {alg.ntransfers} transfers")
        self.n = n
        chunk_idx = np.asarray(dag.chunk_index, np.int64)
        step = np.asarray(alg.step, np.int64)
        topo = lexsort((np.arange(n), step, chunk_idx))  # internal id -> row
        pos = np.empty(n, np.int64)
        pos[topo] = np.arange(n)
        self.topo = topo
        ps, pd = pos[dag.edge_src], pos[dag.edge_dst]
        order = lexsort((pd, ps))
        ps, pd = ps[order], pd[order]
        self.sptr = np.searchsorted(ps, np.arange(n + 1)).tolist()
        self.succ = pd.tolist()
        self.indeg = np.bincount(pd, minlength=n).tolist()
        self.link = np.asarray(dag.link, np.int64)[topo].tolist()
        self.stamp = [-1] * max(dag.nlinks, int(dag.link.max()) + 1 if n else 0)
        nchunks = dag.nchunks
        self.nchunks = nchunks
        sorted_chunk = chunk_idx[topo]
        cstart = np.searchsorted(sorted_chunk, np.arange(nchunks + 1))
        self.remaining = np.diff(cstart).tolist()
        ready0 = np.flatnonzero(np.asarray(self.indeg) == 0) if n else np.zeros(0, np.int64)
        rc = sorted_chunk[ready0]
        rptr = np.searchsorted(rc, np.arange(nchunks + 1)).tolist()
        ready_list = ready0.tolist()
        # cand[c]: ready tasks of chunk c not yet examined in the current sub-pipeline (ascending).
        self.cand = [ready_list[rptr[c]:rptr[c + 1]] for c in range(nchunks)]
        # parked[c]: ready tasks of chunk c found link-blocked in the current sub-pipeline.
        self.parked: list[list[int]] = [[] for _ in range(nchunks)]
        self.sp_of = [0] * n
        self.order: list[int] = []
        self.sp = 0

    def visit(self, c: int) -> int:
        """Lines 10-22 of Algorithm 1 for chunk ``c``: returns the NodeList size."""
        sp = self.sp
        stamp, link = self.stamp, self.link
        park = self.parked[c]
        take = []
        for t in self.cand[c]:
            lk = link[t]
            if stamp[lk] == sp:
                park.append(t)
            else:
                stamp[lk] = sp
                take.append(t)
        if not take:
            self.cand[c] = []
            return 0
        sp_of, indeg, sptr, succ = self.sp_of, self.indeg, self.sptr, self.succ
        new = []
        for t in take:
            sp_of[t] = sp
            for j in range(sptr[t], sptr[t + 1]):
                s = succ[j]
                indeg[s] -= 1
                if not indeg[s]:
                    new.append(s)
        self.order.extend(take)
        if len(new) > 1:
            new.sort()
        self.cand[c] = new
        self.remaining[c] -= len(take)
        return len(take)

    def close_subpipeline(self) -> None:
        """Return parked tasks to the ready lists and move on to the next sub-pipeline."""
        for c in range(self.nchunks):
            p = self.parked[c]
            if p:
                # Parked tasks come from several visits, so they are not in order by themselves.
                rest = self.cand[c]
                if rest:
                    p.extend(rest)
                p.sort()
                self.cand[c] = p
                self.parked[c] = []
        self.sp += 1

    def done(self) -> bool:
        return len(self.order) == self.n

    def result(self, name: str) -> Schedule:
        sp_rows = np.empty(self.n, np.int32)
        sp_rows[self.topo] = np.asarray(self.sp_of, np.int32)
        order = self.topo[np.asarray(self.order, np.int64)] if self.n else np.zeros(0, np.int64)
        return Schedule(subpipeline=sp_rows, order=order.astype(np.int64), scheduler=name)


class _TimedChunkScheduler(_ChunkScheduler):
    """HPDS's scheduler state plus the unit-cost clock of rule *I7* (see the module docstring).

    Per task: ``est_s`` / ``est_e`` (estimated start / end once scheduled) and, while it waits,
    the running maxima over its scheduled predecessors: ``a_sp`` (the latest sub-pipeline among
    them), ``a_s`` / ``a_e`` (largest start / end of the predecessors in ``a_sp``) and ``b_e``
    (largest end of those in earlier sub-pipelines). Per link: ``lend`` (estimated time the link
    finishes its scheduled tasks) and ``lheap``, a heap of ``(ready time, task)`` of its ready,
    unscheduled tasks (entries of scheduled tasks are dropped lazily).
    """

    def __init__(self, alg: Algorithm, dag: DependencyDAG) -> None:
        super().__init__(alg, dag)
        n = self.n
        self.est_s = [0.0] * n
        self.est_e = [0.0] * n
        self.a_sp = [-1] * n
        self.a_s = [0.0] * n
        self.a_e = [0.0] * n
        self.b_e = [0.0] * n
        self.taken = [False] * n
        self.lend = [0.0] * len(self.stamp)
        lheap: list[list] = [[] for _ in range(len(self.stamp))]
        link = self.link
        for c in self.cand:
            for t in c:                      # ascending ids: each heap list stays a valid heap
                lheap[link[t]].append((0.0, t))
        self.lheap = lheap

    def visit(self, c: int) -> int:
        """Like :meth:`_ChunkScheduler.visit`, with rule *I7* and the clock update."""
        sp = self.sp
        stamp, link, lheap, taken = self.stamp, self.link, self.lheap, self.taken
        a_sp, a_s, a_e, b_e = self.a_sp, self.a_s, self.a_e, self.b_e
        park = self.parked[c]
        take = []
        for t in self.cand[c]:
            lk = link[t]
            if stamp[lk] == sp:
                park.append(t)
                continue
            h = lheap[lk]
            while taken[h[0][1]]:
                heappop(h)
            if h[0][0] < (a_e[t] if a_e[t] > b_e[t] else b_e[t]) - _EPS:
                park.append(t)               # another ready task of this link is ready earlier
                continue
            stamp[lk] = sp
            take.append(t)
        if not take:
            self.cand[c] = []
            return 0
        sp_of, indeg, sptr, succ = self.sp_of, self.indeg, self.sptr, self.succ
        est_s, est_e, lend = self.est_s, self.est_e, self.lend
        new = []
        for t in take:
            sp_of[t] = sp
            taken[t] = True
            lk = link[t]
            # start: after the link's earlier tasks, the earlier sub-pipelines' producers, and
            # one slice after the producers pipelined in this sub-pipeline
            start = lend[lk]
            if b_e[t] > start:
                start = b_e[t]
            if a_sp[t] == sp:
                if a_s[t] + _SLICE > start:
                    start = a_s[t] + _SLICE
                done = max(a_e[t], b_e[t]) + _SLICE
            else:
                if a_e[t] > start:
                    start = a_e[t]
                done = max(a_e[t], b_e[t]) + _SLICE if a_sp[t] >= 0 else 0.0
            end = start + 1.0
            if done > end:
                end = done
            est_s[t] = start
            est_e[t] = end
            lend[lk] = end
            for j in range(sptr[t], sptr[t + 1]):
                s = succ[j]
                if a_sp[s] < sp:             # first producer from this sub-pipeline
                    if a_e[s] > b_e[s]:
                        b_e[s] = a_e[s]
                    a_sp[s] = sp
                    a_s[s] = start
                    a_e[s] = end
                else:
                    if start > a_s[s]:
                        a_s[s] = start
                    if end > a_e[s]:
                        a_e[s] = end
                indeg[s] -= 1
                if not indeg[s]:
                    new.append(s)
                    heappush(lheap[link[s]], (a_e[s] if a_e[s] > b_e[s] else b_e[s], s))
        self.order.extend(take)
        if len(new) > 1:
            new.sort()
        self.cand[c] = new
        self.remaining[c] -= len(take)
        return len(take)


def hpds(alg: Algorithm, dag: DependencyDAG, *, engine: str = "auto") -> Schedule:
    """Schedule ``alg``'s tasks into sub-pipelines with HPDS (see the module docstring).

    ``engine``: ``"python"`` (the list scheduler below), ``"compiled"`` (the same schedule from
    :mod:`hccc.compiler.passes.hpds_kernel`, numba-compiled; needs numba) or ``"auto"`` (compiled
    from ``hpds_kernel.COMPILED_FROM`` tasks on when numba is installed, ``HCCC_JIT`` overriding:
    :class:`~hccc.util.jit.Kernels`)."""
    if engine not in ("auto", "python", "compiled"):
        raise ValueError(f"unknown HPDS engine {engine!r} (expected auto, python or compiled)")
    if engine == "compiled":
        return _hpds_compiled(alg, dag, hpds_kernel.KERNELS.require("hpds_arrays"))
    if engine == "auto":
        kernel = hpds_kernel.KERNELS.compiled_for("hpds_arrays", dag.ntasks)
        if kernel is not None:
            return _hpds_compiled(alg, dag, kernel)
    st = _TimedChunkScheduler(alg, dag)
    prio = [0] * st.nchunks
    remaining = st.remaining
    while not st.done():
        before = len(st.order)
        heap = [(-prio[c], c) for c in range(st.nchunks) if remaining[c]]
        heapq.heapify(heap)
        visit = st.visit
        while heap:
            negp, c = heap[0]
            if visit(c):
                prio[c] -= 1
                heapq.heapreplace(heap, (negp + 1, c))
            else:
                heapq.heappop(heap)
        if len(st.order) == before:  # cannot happen on a DAG; guards against an endless loop
            raise RuntimeError("HPDS made no progress: the dependency graph has a cycle")
        st.close_subpipeline()
    return st.result("hpds")


def _hpds_compiled(alg: Algorithm, dag: DependencyDAG, hpds_arrays) -> Schedule:
    """:func:`hpds` through the compiled array kernel ``hpds_arrays``: the same inputs as the list
    scheduler builds, as arrays."""
    n = dag.ntasks
    if alg.ntransfers != n:
        raise ValueError(f"DAG has {n} tasks but the algorithm has {alg.ntransfers} transfers")
    chunk_idx = np.asarray(dag.chunk_index, np.int64)
    step = np.asarray(alg.step, np.int64)
    topo = lexsort((np.arange(n), step, chunk_idx))  # internal id -> row
    pos = np.empty(n, np.int64)
    pos[topo] = np.arange(n)
    ps = pos[np.asarray(dag.edge_src, np.int64)]
    pd = pos[np.asarray(dag.edge_dst, np.int64)]
    order = lexsort((pd, ps))
    ps, pd = ps[order], pd[order]
    sptr = np.searchsorted(ps, np.arange(n + 1)).astype(np.int64)
    indeg = np.bincount(pd, minlength=n).astype(np.int64)
    link = np.asarray(dag.link, np.int64)[topo]
    nlinks = max(int(dag.nlinks), int(link.max()) + 1 if n else 0)
    cstart = np.searchsorted(chunk_idx[topo], np.arange(dag.nchunks + 1)).astype(np.int64)
    sp_of, ins, ok = hpds_arrays(sptr, pd.astype(np.int64), indeg, link, cstart, nlinks)
    if not ok:
        raise RuntimeError("HPDS made no progress: the dependency graph has a cycle")
    sp_rows = np.empty(n, np.int32)
    sp_rows[topo] = sp_of.astype(np.int32)
    return Schedule(subpipeline=sp_rows, order=topo[ins].astype(np.int64), scheduler="hpds")
