"""The compile's cost-model choices: which thread-block allocation, whether to fuse, whether a TB
runs its primitives by step first.

A :class:`CostModel` predicts a program's time on a cluster at a few message sizes; the choices
here compare alternatives built from one schedule by those predictions, and are passes of the
compile (:mod:`hccc.compiler.pipeline.compile`) run when the context has a cost model. The
predictions come from the alpha-beta simulator (``hccc.runtime.simulator.SimulatedCost``);
any object with ``sizes``, ``cluster_name``, ``times(ir)`` and ``times_of(irs)`` serves.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Callable

#: Two predicted times within this share of each other are the same time: the simulator's floating
#: point sums one program's steps in another order than an equal program's (a few units in the last
#: place, some 1e-16 of a time), which must not decide a choice between programs that tie.
SAME_TIME = 1e-9

#: sizes at which the choices compare programs by default (nccl-tests' small and large regimes:
#: latency-bound and bandwidth-bound)
ALLOCATION_SIZES = (1 << 20, 64 << 20)


class CostModel(ABC):
    """Predicted seconds of a program on one cluster, at each of :attr:`sizes` (bytes)."""

    sizes: tuple[int, ...] = ALLOCATION_SIZES

    @property
    @abstractmethod
    def cluster_name(self) -> str:
        """The cluster's name, recorded with the choices in the program's stats."""

    @abstractmethod
    def times(self, ir) -> list[float]:
        """Seconds of one call of ``ir`` at each size of :attr:`sizes`."""

    def times_of(self, irs) -> list[list[float]]:
        """:meth:`times` of each of ``irs`` (a model may predict them side by side)."""
        return [self.times(ir) for ir in irs]


def not_slower(t: float, than: float) -> bool:
    """``t`` is at most ``than``, or the same time (:data:`SAME_TIME`)."""
    return float(t) <= float(than) * (1 + SAME_TIME)


def faster_allocation(cost: CostModel, state_ir, build_connection: Callable):
    """State-based TB allocation that never costs time on the cluster: sharing a TB between units
    whose spans do not overlap can still delay the later unit (its micro-batch i waits for all of
    the earlier unit's micro-batches), so when state-based allocation shares anything, both
    allocations are predicted at ``cost.sizes`` and the one with the smaller total time is kept
    (state-based on a tie, :func:`not_slower`: fewer TBs). ``build_connection()`` builds the
    connection-based program from the same schedule. ``allocation.tb_alloc_kept`` records the choice
    and ``stats["tb_alloc_state_s"]``, ``tb_alloc_connection_s``, ``tb_alloc_sizes`` and
    ``tb_alloc_topology`` the comparison (flat: a ProgramIR's stats hold scalars only);
    ``allocation.tb_alloc`` stays the mode asked for ("state") and ``ntbs`` are those of the kept
    allocation."""
    ir = state_ir
    al = ir.allocation
    if al.tbs_state_based == al.tbs_connection_based:
        return ir                      # nothing shared: the two allocations are the same
    conn = build_connection()
    conn.nchannels = ir.nchannels      # both allocations with the channels the program runs with
    t_state, t_conn = (sum(t) for t in cost.times_of([ir, conn]))
    keep = ir if not_slower(t_state, t_conn) else conn
    if keep is conn:
        conn.allocation = replace(conn.allocation, tb_alloc="state", tbs_state_based=al.tbs_connection_based)
    keep.allocation = replace(keep.allocation, tb_alloc_kept="state" if keep is ir else "connection")
    keep.stats.update({"tb_alloc_state_s": t_state,
                       "tb_alloc_connection_s": t_conn,
                       "tb_alloc_sizes": ",".join(str(int(s)) for s in cost.sizes),
                       "tb_alloc_topology": cost.cluster_name})
    return keep


def faster_fusion(cost: CostModel, plain_ir, fused_ir):
    """The fused program (receive-and-forward fusion, one TB per connection pair) where it never
    costs time on the cluster, else ``plain_ir``. Fusion saves a pass over memory per forwarded
    byte (which the simulator does not charge), but its traffic runs on TBs and channels of its
    own, beside the unfused traffic of the same links, which can delay the schedule's critical
    chains; so both are predicted at ``cost.sizes`` and the fused one is kept only when it is at
    least as fast at every size (:func:`not_slower`). ``stats["fusion_kept"]``, ``fusion_plain_s`` and
    ``fusion_fused_s`` (totals over the sizes) record the comparison."""
    if not fused_ir.allocation.fused:
        keep, t_plain, t_fused = plain_ir, None, None
    else:
        t_plain = cost.times(plain_ir)
        t_fused = cost.times(fused_ir)
        keep = fused_ir if all(not_slower(f, p) for f, p in zip(t_fused, t_plain)) else plain_ir
    keep.stats.update({"fusion_kept": keep is fused_ir,
                       "fusion_plain_s": sum(t_plain) if t_plain else -1.0,
                       "fusion_fused_s": sum(t_fused) if t_fused else -1.0})
    return keep


def faster_order(cost: CostModel, phased_ir, build_keyed: Callable):
    """TBs that run their primitives by step first (:mod:`hccc.compiler.passes.phase_order`) where
    that never costs time on the cluster, else in the schedule's key order. Step order keeps an
    earlier step's primitive from waiting behind a later step's that waits long (a convoy the
    kernels' per-unit costs make dear), but the schedule's order may send a chunk that is ready
    early sooner (the alpha-beta simulator: HM AllReduce 4x8 at 32 MiB on a100_topo4 in 9
    micro-batches, 559 us in key order against 612 by step; in one, 1,094 against 678), so where
    the step order moved any primitive both are predicted at ``cost.sizes`` and the key order is
    kept only when strictly faster in total. ``build_keyed()`` builds the key-ordered program with
    the same allocation and fusion. ``stats["phase_order_kept"]`` ("step" / "key"),
    ``phase_order_step_s`` and ``phase_order_key_s`` record the comparison."""
    keyed = build_keyed()
    keyed.nchannels = phased_ir.nchannels
    t_step, t_key = (sum(t) for t in cost.times_of([phased_ir, keyed]))
    keep = phased_ir if not_slower(t_step, t_key) else keyed
    if keep is keyed:           # the phased program's record, with the keyed one's thread blocks
        ka = keyed.allocation
        keyed.stats = dict(phased_ir.stats)
        keyed.allocation = replace(phased_ir.allocation, tbs_state_based=ka.tbs_state_based,
                                   tbs_connection_based=ka.tbs_connection_based,
                                   tbs_per_rank_max=ka.tbs_per_rank_max)
    keep.stats.update({"phase_order_kept": "step" if keep is phased_ir else "key",
                       "phase_order_step_s": t_step, "phase_order_key_s": t_key})
    return keep


__all__ = ["CostModel", "ALLOCATION_SIZES", "SAME_TIME", "not_slower", "faster_allocation", "faster_fusion",
           "faster_order"]
