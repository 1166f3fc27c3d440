"""The residency rule of the GPU platforms: every rank's thread blocks must be resident at once,
since they spin on each other (:func:`check_residency`, with the numbers and what to change where
they cannot be).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hccc.runtime.platform import PlatformError


@dataclass(frozen=True)
class ResidentKernel:
    """One kernel that must be resident together with the others on one GPU."""

    name: str
    blocks: int        # grid size (thread blocks)
    per_sm: int        # blocks of it one SM holds at once (the occupancy calculator's answer)
    threads: int       # threads per block


def residency_capacity(sms: int, kernels: Sequence[ResidentKernel]) -> int:
    """Blocks that are guaranteed to be resident at once: ``sms * min(per_sm)`` over the kernels
    that launch blocks. Sufficient because a block of any kernel uses at most ``1/per_sm_k <=
    1/min(per_sm)`` of every SM resource, so an SM with fewer than ``min(per_sm)`` blocks accepts
    any further block; exact when all kernels have the same occupancy."""
    used = [k.per_sm for k in kernels if k.blocks > 0]
    return sms * min(used) if used else 0


def check_residency(sms: int, kernels: Sequence[ResidentKernel], *, device: str = "the GPU",
                    max_kernels: int = 128) -> None:
    """Raise PlatformError, with the numbers and what to change, unless every block of every
    kernel can be resident at the same time (the kernels spin on each other)."""
    live = [k for k in kernels if k.blocks > 0]
    if not live:
        return
    if len(live) > max_kernels:
        raise PlatformError(f"cannot run {len(live)} rank kernels at once on {device}: it runs at "
                            f"most {max_kernels} kernels concurrently; spread the ranks over more GPUs")
    dead = [k for k in live if k.per_sm <= 0]
    if dead:
        k = dead[0]
        raise PlatformError(f"kernel {k.name} cannot run on {device}: not one block of {k.threads} "
                            "threads fits on an SM (too many registers or threads); lower nWarps")
    need = sum(k.blocks for k in live)
    cap = residency_capacity(sms, live)
    if need > cap:
        worst = min(live, key=lambda k: k.per_sm)
        raise PlatformError(
            f"cannot run all ranks at once on {device}: their kernels need {need} thread blocks "
            f"resident together but it holds at most {cap} ({sms} SMs x {worst.per_sm} blocks of "
            f"{worst.threads} threads per SM for {worst.name}); the ranks spin on each other, so "
            "they would deadlock. Use more GPUs, fewer ranks, fewer thread blocks per rank "
            "(--tb-alloc state) or fewer warps per block (nWarps)")
