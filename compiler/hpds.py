"""HPDS: hierarchical priority-based dynamic scheduling (ResCCL section 4.3, Algorithm 1).

Input: an Algorithm and its :class:`~hccc.compiler.dag.DependencyDAG`. Output: a
:class:`~hccc.compiler.schedule.Schedule` (sub-pipeline index per task and the global insertion
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

Data structures (for 2 M tasks): tasks are renumbered in ``(chunk, step, row)`` order; each chunk
keeps the list of its ready tasks not yet examined in the current sub-pipeline; a ready task found
link-blocked is parked until the sub-pipeline closes (a link used in a sub-pipeline stays used
until it closes, so re-examining it earlier is pointless); links carry the index of the last
sub-pipeline that used them (no clearing between sub-pipelines); the queue is a binary heap of
``(-priority, chunk)``.
"""
from __future__ import annotations

import heapq

import numpy as np

from .algorithm import Algorithm
from .dag import DependencyDAG
from .schedule import Schedule

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
        topo = np.lexsort((np.arange(n), step, chunk_idx))  # internal id -> row
        pos = np.empty(n, np.int64)
        pos[topo] = np.arange(n)
        self.topo = topo
        ps, pd = pos[dag.edge_src], pos[dag.edge_dst]
        order = np.lexsort((pd, ps))
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


def hpds(alg: Algorithm, dag: DependencyDAG) -> Schedule:
    """Schedule ``alg``'s tasks into sub-pipelines with HPDS (see the module docstring)."""
    st = _ChunkScheduler(alg, dag)
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
