"""Round-robin scheduler: the baseline HPDS is compared with (ResCCL section 5.3).

"We traverse each chunk's DAG in ascending chunk-ID order, visit the chunks in a circular queue,
and schedule them in that same immutable sequence." Precisely:

- Each sub-pipeline starts a fresh cycle at the smallest chunk id; every chunk with tasks left is
  flagged.
- The flagged chunks are visited in ascending chunk-id order, cyclically (pass after pass). A visit
  is the same as an HPDS visit of Algorithm 1 (see :mod:`hccc.compiler.passes.hpds`; HPDS's
  readiness rule I7 is not applied here): the chunk's tasks that have no
  remaining data predecessor, traversed in ``(step, row)`` order, join the sub-pipeline when their
  link is not used yet in it (nor by an earlier task of the same visit); their successors may join
  on a later visit in the same sub-pipeline.
- A visit that adds nothing unflags the chunk for the rest of the sub-pipeline; the sub-pipeline
  closes when no chunk is flagged.

Unlike HPDS there are no priorities and no dynamic re-selection: the visiting order is fixed, so
low chunk ids always get the first pick of the links in every sub-pipeline.
"""
from __future__ import annotations

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.compiler.passes.dag import DependencyDAG
from hccc.compiler.passes.hpds import _ChunkScheduler
from hccc.compiler.passes.schedule import Schedule

__all__ = ["round_robin"]


def round_robin(alg: Algorithm, dag: DependencyDAG) -> Schedule:
    """Schedule ``alg``'s tasks into sub-pipelines, visiting chunks cyclically by id."""
    st = _ChunkScheduler(alg, dag)
    remaining = st.remaining
    while not st.done():
        before = len(st.order)
        flagged = [c for c in range(st.nchunks) if remaining[c]]
        visit = st.visit
        while flagged:
            flagged = [c for c in flagged if visit(c)]
        if len(st.order) == before:  # cannot happen on a DAG; guards against an endless loop
            raise RuntimeError("round-robin made no progress: the dependency graph has a cycle")
        st.close_subpipeline()
    return st.result("rr")
