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

One implementation (:mod:`hccc.compiler.passes.hpds_kernel`): Algorithm 1 with rule *I7* over
flat arrays -- tasks renumbered in ``(chunk, step, row)`` order, each chunk's ready tasks not yet
examined and its link-blocked (parked) tasks as segments of two arrays, a link stamped with the last
sub-pipeline that used it, the queue a binary heap of ``(-priority, chunk)``, a heap of ``(ready
time, task)`` per link -- which the interpreter runs for small programs and numba compiles once a
process has scheduled :data:`~hccc.compiler.passes.hpds_kernel.COMPILED_FROM` tasks
(:meth:`~hccc.util.jit.Kernels.pick`). Compiled it is 12-90x faster than a list-based scheduler
of the same procedure that plain Python ran 3.5-19x faster than the kernel (``benchmarks/twins.py``:
1.1 ms against 20 ms at 480 tasks, 26 ms against 90 ms at 1,984), which was removed: on the
examples the kernel run plain costs tens of milliseconds, where the list scheduler would cost
seconds per million tasks.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.compiler.passes import hpds_kernel
from hccc.compiler.passes.dag import DependencyDAG
from hccc.compiler.passes.schedule import Schedule
from hccc.compiler.ir.sort_order import lexsort

__all__ = ["hpds"]

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


def hpds(alg: Algorithm, dag: DependencyDAG, *, engine: str = "auto") -> Schedule:
    """Schedule ``alg``'s tasks into sub-pipelines with HPDS (see the module docstring).

    ``engine``: ``"python"`` (the kernel of :mod:`hccc.compiler.passes.hpds_kernel` run by the
    interpreter), ``"compiled"`` (the kernel numba-compiled; needs numba) or ``"auto"`` (plain below
    ``hpds_kernel.COMPILED_FROM`` tasks of the process, compiled from there on when numba is
    installed, ``HCCC_JIT`` overriding: :meth:`~hccc.util.jit.Kernels.pick`): the same schedule."""
    if engine not in ("auto", "python", "compiled"):
        raise ValueError(f"unknown HPDS engine {engine!r} (expected auto, python or compiled)")
    kernels = hpds_kernel.KERNELS
    if engine == "compiled":
        kernel = kernels.require("hpds_arrays")
    elif engine == "python":
        kernel = hpds_kernel.hpds_arrays
    else:
        kernel = kernels.pick("hpds_arrays", dag.ntasks)
    return _hpds_arrays(alg, dag, kernel)


def _hpds_arrays(alg: Algorithm, dag: DependencyDAG, hpds_arrays) -> Schedule:
    """:func:`hpds` through ``hpds_arrays`` (the kernel, plain or compiled): its inputs as arrays."""
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
