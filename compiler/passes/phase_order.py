"""Primitives ordered by phase within a thread block: the algorithm's step first, then the
schedule's order key.

The scheduler's order key (sub-pipeline, insertion position; :mod:`hccc.compiler.passes.lower`,
"Order keys") pipelines chunks through the algorithm: a chunk that is ready early goes through
its later steps in early sub-pipelines. On a thread block that serves one connection for several
steps this can put a primitive of a later step before one of an earlier step. A TB runs its
primitives one after the other, each for every micro-batch, so such an *inversion* makes the
earlier step's primitive wait for everything the later one waits for: HM AllReduce 4x8 (32
ranks, 16 TBs a rank) had a TB send a fully reduced chunk of its last step (which waits for the
whole reduction of that chunk, over every node) before the first step's sends of three other
chunks, which nothing holds back; the peers' receives, and every TB waiting on them, queue
behind it (a convoy), 576 of the 3,456 adjacent pairs of primitives of a TB ran a later phase
before an earlier one (1,072 by step).

:func:`phase_keys` gives each primitive its step; :func:`~hccc.compiler.passes.tb_alloc.allocate`
then runs a TB's primitives in ``(step, key)`` order. Why this keeps the program free of deadlock,
with FIFOs of any depth: in an unfused program the send and the receive of a transfer have the
same step and key, every dependency goes from a smaller to a larger key and, checked here, never
to a smaller step. So ``(step, key)`` grows along every edge of the wait graph (dependencies,
each send before its receive, a TB's order, and a send waiting for the receive of message ``k -
NSLOTS`` of its connection, which the same order puts earlier on both ends), which is therefore
acyclic. A fused primitive ties two transfers of different steps (its receive and its send); such
programs, and any whose dependencies ever go to a smaller step, keep the schedule's order
(:func:`phase_keys` returns None).

Micro-batches against slots. A primitive of ``M`` micro-batches on a connection of ``NSLOTS``
slots (HM AllReduce 4x8 at 32 MiB: 9 against 8) has its sender wait, at micro-batch ``m >=
NSLOTS``, for the receiver to consume message ``m - NSLOTS``. In this order that wait cannot hold
up anything the receiver waits for: the message belongs to the same transfer or an earlier one of
the connection (no larger order), so the receive's micro-batch waits only for primitives of a
smaller order and for data the sender posted before it blocked; a full FIFO can stall a sender,
never a block its receiver depends on. (The same holds for the schedule's key order alone; what
the step order removes is the wait of an earlier step behind a later one.)

Which order is faster depends on the machine: the kernels pay a fixed cost per unit, and a block
that waits long delays everything behind it on the block, while on the alpha-beta simulator's
links the schedule's order may send a chunk that is ready early sooner. Without a cluster the
compile orders by step; with one, the cost model keeps the key order where it predicts it strictly
faster (:func:`hccc.compiler.pipeline.cost_model.faster_order`, the compile's ``order`` pass).

:func:`step_inversions` counts the adjacent pairs of a TB that run a later step first.
"""
from __future__ import annotations

import numpy as np


def phase_keys(step: np.ndarray, task: np.ndarray, task2: np.ndarray, key: np.ndarray,
               dep_prim: np.ndarray, dep_on: np.ndarray) -> np.ndarray | None:
    """The phase of every primitive (the step of its transfer; local copies without one: before
    every step when they come first in key order, after every step otherwise), or None where
    ordering a TB by it first could close a cycle (module docstring): a fused primitive
    (``task2 >= 0``) or a dependency on a later step."""
    task = np.asarray(task, np.int64)
    if np.any(np.asarray(task2) >= 0):
        return None
    step = np.asarray(step, np.int64)
    key = np.asarray(key, np.int64)
    has = task >= 0
    phase = np.empty(len(task), np.int64)
    phase[has] = step[task[has]]
    if np.any(~has):
        first = key[has].min() if has.any() else 0
        last = int(step.max()) + 1 if len(step) else 0
        phase[~has] = np.where(key[~has] < first, -1, last)
    dp, do = np.asarray(dep_prim, np.int64), np.asarray(dep_on, np.int64)
    if np.any(phase[do] > phase[dp]):
        return None
    return phase


def step_inversions(ir, step: np.ndarray, bounds: np.ndarray | None = None) -> int:
    """Pairs of consecutive primitives of one TB of ``ir`` (in seq order, among those with a task)
    whose first runs a later phase than the second. The phase of a primitive is ``step[task]``, or with
    ``bounds`` (increasing steps) the number of bounds at or below that step: the phases of an
    algorithm written as a few loops of steps. Primitives without a task are left out of the
    pairs."""
    p = ir.prims
    o = np.lexsort((p["seq"], p["tb"], p["rank"]))
    task = np.asarray(p["task"], np.int64)[o]
    keep = task >= 0
    rank, tb = np.asarray(p["rank"])[o][keep], np.asarray(p["tb"])[o][keep]
    ph = np.asarray(step, np.int64)[task[keep]]
    if bounds is not None:
        ph = np.searchsorted(np.asarray(bounds, np.int64), ph, side="right")
    same = (rank[1:] == rank[:-1]) & (tb[1:] == tb[:-1])
    return int(np.count_nonzero(same & (ph[:-1] > ph[1:])))


__all__ = ["phase_keys", "step_inversions"]
