"""Thread-block groups (``tbg_info``) as MSCCL++'s executor runs them, and a race between the blocks
of a group named in the plan's own terms.

The executor's loader cuts every buffer range of an operation on its own: block ``tb_id`` of a
group of ``tbg_size`` moves part ``tb_id`` of each range the operation names, the range's
alignment units shared out ``nelems // tbg_size`` each, the first ``nelems % tbg_size`` parts one
unit more (:data:`CUT_LINES`). Nothing joins the blocks of a group at run time: each block runs
its own list, and a signal or wait is run by the block's own first threads on the block's own
channels (:data:`SIGNAL_LINES`), so a signal publishes what its block did, not what its group did.
Two operations of a group over different ranges therefore hand one block different bytes: block 1's
part of chunks ``[0, 1)`` is the second half of chunk 0, block 0's part of chunks ``[0, 2)`` all of
chunk 0. The import cuts every chunk into ``F`` parts (the least common multiple of the plan's group
sizes) so that each block's share is whole parts (:func:`group_part`: the executor's cut at sizes
whose chunks are a multiple of ``F`` alignment units) and proves the plan at that granularity;
:func:`explain_group_race` adds, to a race the proof finds on bytes a group's operation moves,
which operations move them and the executor's lines that make it a race. A group's operation in a
pipeline of several iterations runs past its part (:func:`pipeline_past_part`) and is refused.
"""
from __future__ import annotations

from typing import Iterable

from hccc.compiler.interop.mscclpp_plan import EXECUTOR_COMMIT

#: where the loader cuts an operation's source and destination ranges among a group's blocks
#: (``calcOffset(size, tb_id, tbg_size)``, ``calcSize``) and the cut itself (``calcOffset``)
CUT_LINES = ("src/core/executor/execution_plan.cc:541-545 (src_buff), 572-575 (dst_buff), "
             "621-627 (calcOffset)")
#: where a signal and a wait are run: by threads ``tid < nChannels`` of the block that runs them,
#: each on one of that block's channels
SIGNAL_LINES = "src/core/include/execution_kernel.hpp:83-99 (handleSignal), 102-118 (handleWait)"

#: where a pipeline's iterations are counted (over ``num_chunks`` whole chunks, not a group
#: member's part) and cut (``offset = i * unitSize``; each operation moves
#: ``min(size - offset, unitSize)`` of its part, in 32-bit unsigned arithmetic)
PIPELINE_LINES = ("src/core/executor/execution_plan.cc:592-598 (nIterations), "
                  "src/core/include/execution_kernel.hpp:653-668 (handlePipeline), 511 (handleCopy: "
                  "min(op.inputBufferSizes[0] - offset, unitSize))")


def group_part(idx: int, n: int, F: int, tbg: tuple[int, int] | None) -> tuple[int, int]:
    """``(first part, parts)`` a block moves of chunks ``[idx, idx + n)``, in parts of ``1 / F``
    chunk: part ``tb_id`` of ``tbg_size`` equal parts of the range (``F`` is a multiple of every
    ``tbg_size``), the whole range without a group."""
    if tbg and tbg[1] > 1:
        part = n * F // tbg[1]
        return idx * F + tbg[0] * part, part
    return idx * F, n * F


def uneven_groups_note(F: int) -> str:
    """The stats note of a plan where a group of ``tbg_size`` cuts a range of ``n`` chunks that
    ``tbg_size`` does not divide: the executor's parts are whole alignment units (``calcOffset``:
    the first ``nelems % tbg_size`` parts one unit longer), so at a size whose chunks are not a
    multiple of ``F`` units they end elsewhere than the import's (a group of 4 over 2 chunks of 5
    units ends its parts at units 3, 6, 8, 10; a group of 2 over chunk 1 at 8), and the proof does
    not cover those sizes."""
    return (f"thread-block groups: proven at message sizes whose chunks are a multiple of {F} x the "
            f"alignment (a group cuts a range of chunks its size does not divide: at other sizes the "
            f"executor rounds its parts to whole alignment units, {CUT_LINES})")


def pipeline_past_part(num_chunks: int, unit_size: int, largest_chunk: int) -> str | None:
    """Why a group member's operation in a pipeline may run past its part (``None``: never). The
    executor counts the iterations over the pipeline's ``num_chunks`` chunks and each iteration
    ``i`` takes ``min(part - i * unit_size, unit_size)`` bytes in unsigned 32-bit arithmetic: once an
    iteration starts past the part (which several iterations do at most sizes) the difference wraps
    and the operation moves ``unit_size`` bytes beyond it, into other members' parts and past the
    range. Accepted only while every size the plan serves (chunks up to ``largest_chunk`` bytes) is
    one iteration."""
    if num_chunks * largest_chunk <= unit_size:
        return None
    return (f"an operation of a thread-block group inside a pipeline of more than one iteration (its "
            f"{num_chunks} chunks of up to {largest_chunk} bytes in units of {unit_size}): the executor "
            f"counts the iterations over the whole chunks and cuts each from the block's part of them, so at "
            f"most such sizes an iteration starts past the part and moves {unit_size} bytes beyond it "
            f"({PIPELINE_LINES}, at MSCCL++ {EXECUTOR_COMMIT}); keep the group out of the pipeline, or "
            f"bound 'max_message_size' so that the pipeline is one iteration")


def describe_part(chunk_part: int, F: int) -> str:
    """``chunk 3`` (F 1) or ``chunk 3 (part 1 of 2)``: a slot of the refined program in plan chunks."""
    c, k = divmod(chunk_part, F)
    return f"chunk {c}" if F == 1 else f"chunk {c} (part {k} of {F})"


def explain_group_race(slot: int, accesses: Iterable[tuple[str, int, int, int, int, tuple[int, int] | None]]
                       ) -> str | None:
    """What to add to a race the proof found on physical ``slot`` when operations of thread-block
    groups move its bytes (``None`` when none does). ``accesses``: ``(what, lo, hi, index, size,
    tbg)`` for every buffer range of the plan's operations: ``what`` names the operation ("rank 1
    thread block 0's copy writes"), ``[lo, hi)`` are the physical slots the block moves (the run's
    aliasing of input and output applied), ``index`` and ``size`` the range as the plan writes it."""
    movers = [f"{what} part {tbg[0]} of {tbg[1]} of chunks [{idx}, {idx + n})"
              for what, lo, hi, idx, n, tbg in accesses if lo <= slot < hi and tbg and tbg[1] > 1]
    if not movers:
        return None
    shown = "; ".join(movers[:4]) + (f"; {len(movers) - 4} more" if len(movers) > 4 else "")
    return (f" (thread-block groups: {shown}. MSCCL++'s executor cuts each range of an operation among "
            f"its group's blocks by itself ({CUT_LINES}, at MSCCL++ {EXECUTOR_COMMIT}), so operations of "
            f"a group over different ranges give a block different bytes, and a signal or wait is run by "
            f"its own block's threads on that block's channels ({SIGNAL_LINES}): a block's signal does not "
            f"publish what the other blocks of its group wrote, nor does its wait order their reads)")


__all__ = ["CUT_LINES", "PIPELINE_LINES", "SIGNAL_LINES", "describe_part", "explain_group_race", "group_part",
           "pipeline_past_part", "uneven_groups_note"]
