"""Schedule: the output of HPDS / round-robin, the input of lowering.

A schedule assigns every task (transfer row of the Algorithm) to a sub-pipeline and fixes a global
insertion order. The insertion order is a topological order of the dependency DAG, and a task's
sub-pipeline index never decreases along it, so ``(subpipeline[t], rank of t in order)`` is a total
order consistent with every dependency.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.ir.sort_order import lexsort


@dataclass
class Schedule:
    subpipeline: np.ndarray  # int32 per task: sub-pipeline index, 0-based
    order: np.ndarray        # int64 permutation of task ids, in insertion order
    scheduler: str = "hpds"  # "hpds" | "rr"

    @property
    def nsubpipelines(self) -> int:
        return int(self.subpipeline.max()) + 1 if len(self.subpipeline) else 0

    def position(self) -> np.ndarray:
        """Inverse of ``order``: position[t] = index of task t in the insertion order."""
        pos = np.empty(len(self.order), dtype=np.int64)
        pos[self.order] = np.arange(len(self.order))
        return pos


def step_schedule(alg) -> Schedule:
    """The schedule of algorithm-level execution (MSCCL's): one sub-pipeline per step, in step order
    (rows in program order within a step)."""
    step = np.asarray(alg.step, dtype=np.int64)
    _, dense = np.unique(step, return_inverse=True)
    order = lexsort((np.arange(len(step)), step)).astype(np.int64)
    return Schedule(subpipeline=dense.astype(np.int32).reshape(-1), order=order, scheduler="step")
