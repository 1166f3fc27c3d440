"""The residency rule of per-rank launches that keep only some of a rank's blocks resident (the CPU
emulation's partial-residency mode, :meth:`hccc.runtime.platform.Platform.launch_residency`): a
program runs so only when none of its blocks waits on a block that may not be resident
(:func:`hccc.compiler.ir.block_waits.residency_hazards`); otherwise it is refused before launch,
naming the waits, since it could hang until its timeout.
"""
from __future__ import annotations

from typing import Iterable

from hccc.compiler.ir.block_waits import residency_hazards
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.platform import Platform, PlatformError
from hccc.util.plural import plural

#: waits a refusal names (the first, by rank and block); the count of the others follows
SHOWN_WAITS = 3


def launch_residency(platforms: Iterable[Platform]) -> int | None:
    """The fewest blocks of a launch that the platforms keep resident at once (None: all)."""
    ks = [k for k in (pf.launch_residency() for pf in platforms) if k is not None]
    return min(ks) if ks else None


def check_grid_residency(name: str, blocks: int, resident: int | None) -> None:
    """PlatformError unless a one-grid launch of ``blocks`` blocks of program ``name`` fits the
    ``resident`` blocks a launch keeps resident at once (None: all): the launch is cooperative,
    its blocks wait on each other."""
    if resident is not None and blocks > resident:
        raise PlatformError(
            f"cannot run {name} as one grid: the launch is cooperative (its {blocks} blocks wait on "
            f"each other) but at most {resident} blocks of a launch are resident at once; launch each "
            "rank on its own (--launch per-rank)")


def check_rank_residency(ir: ProgramIR, resident: int | None, ranks: Iterable[int] | None = None) -> None:
    """Raise PlatformError unless the per-rank launches of ``ir`` (rank r: ``nchannels x ntbs[r]``
    blocks) complete with at most ``resident`` blocks of each resident at once (None: all of them,
    nothing to check), as far as the blocks of ``ranks`` wait (None: every rank's)."""
    if resident is None:
        return
    hazards = residency_hazards(ir, resident, ranks)
    if not hazards:
        return
    shown = "; ".join(w.describe(ir) for w in hazards[:SHOWN_WAITS])
    more = len(hazards) - SHOWN_WAITS
    if more > 0:
        shown += f" (and {plural(more, 'other wait')})"
    blocks = [int(ir.nchannels) * int(t) for t in ir.ntbs]
    most = max(range(len(blocks)), key=lambda r: blocks[r])
    raise PlatformError(
        f"cannot run {ir.name} with at most {plural(resident, 'block')} of a rank resident at once: "
        f"{shown}. Such a block could wait for a block that never gets a place; run it with every "
        f"block of a rank resident (rank {most} launches {blocks[most]} blocks: the CPU emulation's "
        "HCCC_CPU_RESIDENT_BLOCKS at least that, or unset)")


__all__ = ["SHOWN_WAITS", "check_rank_residency", "launch_residency"]
