"""Threads per block such that every block of the ranks that run at once is resident at once
(their blocks spin on each other): the fewest halvings of the emitted threads per block that fit
(:func:`fit_block_threads`), and the refusal, with the platform's advice, where nothing fits
(:func:`check_resident_together`); a rank's set-up and a job of ranks on one device use both.
"""
from __future__ import annotations

from hccc.compiler.backend.codegen import WARP_SIZE
from hccc.compiler.passes.kernel_cost import least_block_threads
from hccc.runtime.platform import PlatformError
from hccc.util.plural import plural


def fit_block_threads(block: int, platform: str, fits, least: int | None = None) -> tuple[int, str | None]:
    """The most threads per block, from ``block`` halving down to ``least`` (default: the sync warp
    and two data warps of ``platform``, "cuda" / "hip",
    :func:`hccc.compiler.passes.kernel_cost.least_block_threads`; the running platform's
    :meth:`Platform.least_block_threads`),
    for which ``fits(threads)`` holds, and a note saying so when that is fewer than ``block``;
    ``(block, None)`` when ``block`` fits or nothing does (the caller refuses)."""
    b = int(block)
    floor = least_block_threads(WARP_SIZE.get(platform, 32)) if least is None else int(least)
    while not fits(b) and b // 2 >= floor:
        b //= 2
    if b == block or not fits(b):
        return int(block), None
    return b, (f"{plural(b, 'thread')} per thread block instead of the emitted {block}, so that every block "
               "of the kernel is resident at once")


def check_resident_together(name: str, pf, device: int, nranks: int, need: int, block: int, cap: int) -> None:
    """PlatformError unless ``need`` thread blocks of ``block`` threads, of ``nranks`` ranks of
    program ``name`` on ``device`` of ``pf``, fit the ``cap`` blocks resident at once there: they
    spin on each other, so every one must run at once (with the platform's advice)."""
    if need > cap:
        raise PlatformError(
            f"cannot run {name} on {pf.name}: its {nranks} ranks on device {device} need {need} thread "
            f"blocks of {block} threads resident at once, but at most {cap} fit; "
            f"{pf.residency_advice(need, block)}")


__all__ = ["fit_block_threads", "check_resident_together"]
