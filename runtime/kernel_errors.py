"""What a launch's error record says (:class:`~hccc.runtime.kernel_abi.ErrorRecord`, written by the
first thread block to give up): where a kernel stuck and what it waited for
(:func:`describe_stuck`), or why the kernels refused an AllToAllv call at launch
(:func:`describe_refusal`). Both launchers' waits say it in these words: the single-process
runner's watchdog and a rank's wait for its kernel (:mod:`hccc.runtime.kernel_wait`), and so
do their watchdogs (:func:`watchdog_expired`).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.kernel_abi import (V_REFUSAL, WAIT_COUNTS, WAIT_DATA, WAIT_DEP, WAIT_SLOT, ErrorRecord,
                                     op_name)


def describe_stuck(ir: ProgramIR, e: ErrorRecord, ticks_per_us: float) -> str:
    """"rank R, TB T stuck in <op> for chunk C (micro-batch M)" plus what it waited for."""
    msg = (f"rank {e.rank}, TB {e.tb} stuck in {op_name(e.op)} for chunk {e.chunk} "
           f"(micro-batch {e.microbatch})")
    p = ir.prims
    hit = np.flatnonzero((p["rank"] == e.rank) & (p["tb"] == e.tb) & (p["seq"] == e.seq))
    peer = None
    if len(hit):
        i = int(hit[0])
        if e.wait == WAIT_DATA:
            peer = int(p["recv_peer"][i])
        elif e.wait == WAIT_SLOT:
            peer = int(p["send_peer"][i])
    what = {WAIT_DATA: f"waiting for data from rank {peer}" if peer is not None else "waiting for data",
            WAIT_SLOT: (f"waiting for a free FIFO slot towards rank {peer}" if peer is not None
                        else "waiting for a free FIFO slot"),
            WAIT_DEP: "waiting for another thread block of its rank"}.get(e.wait, "waiting")
    if e.wait == WAIT_COUNTS and e.chunk < 0:
        return (f"rank {e.rank}'s kernels refused the AllToAllv counts: they are not an AllToAll "
                "program's, and have no AllToAllv path")
    if e.wait == WAIT_COUNTS:
        return f"rank {e.rank}'s kernels refused the AllToAllv counts matrix: " + describe_refusal(ir, e)
    extra = [what, f"primitive {e.seq}"]
    if e.task >= 0:
        extra.append(f"task {e.task}")
    if ticks_per_us > 0:
        extra.append(f"gave up after {e.waited / ticks_per_us / 1e6:.3g} s")
    return msg + ": " + ", ".join(extra)


def _signed(word: int) -> int:
    """A record's uint64 word read as the int64 the kernels stored in it."""
    word = int(word)
    return word - (1 << 64) if word >= 1 << 63 else word


def describe_refusal(ir: ProgramIR, e: ErrorRecord) -> str:
    """Why the kernels refused an AllToAllv call at launch (``hccc_error::op``, one of
    :data:`hccc.compiler.backend.abi.V_REFUSALS`), naming the entry of the matrix."""
    N = max(1, int(ir.nranks))
    s, d = divmod(int(e.chunk), N)
    cnt, at, n = int(e.task), _signed(e.microbatch), _signed(e.waited)
    why = e.op
    if why == V_REFUSAL["SEND"]:
        return (f"rank {s}'s send buffer holds {n} elements, but the block to rank {d} (counts[{s}][{d}] = "
                f"{cnt} at element {at}) does not fit in it")
    if why == V_REFUSAL["RECV"]:
        return (f"rank {d}'s receive buffer holds {n} elements, but the block from rank {s} (counts[{s}][{d}] "
                f"= {cnt} at element {at}) does not fit in it")
    if why == V_REFUSAL["OVERLAP"]:
        return (f"rank {d} receives the blocks from ranks {n} and {s} into overlapping elements (counts[{s}][{d}] "
                f"= {cnt} at element {at})")
    if why == V_REFUSAL["ASYM"]:
        return (f"an in-place AllToAllv needs symmetric counts: counts[{s}][{d}] = {cnt} but counts[{d}][{s}] "
                f"= {at}")
    if why == V_REFUSAL["DISPLS"]:
        return (f"an in-place AllToAllv needs equal send and receive displacements: rank {s} sends to {d} "
                f"from element {cnt} but receives from {d} at {at}")
    return (f"counts[{s}][{d}] = {cnt} is negative or its block's pieces exceed the scratch slots the "
            "call allocated")


#: the end of the words for a kernel given up on: it still runs after its abort flag was raised
#: and the grace time passed (callers test a failure for it: that kernel's memory must stay)
IGNORES_ABORT = "the kernel ignores the abort flag"


#: how the host watchdog's words begin (:func:`watchdog_expired`; a job finds its ranks' in their failures)
WATCHDOG = "host watchdog: "


def watchdog_expired(limit_s: float) -> str:
    """The host watchdog's words for a launch that outran its limit, in both launchers (the
    single-process runner's and a rank's wait, :mod:`hccc.runtime.kernel_wait`); the caller adds
    what followed (:func:`watchdog_aborted`, or :data:`IGNORES_ABORT`)."""
    return f"{WATCHDOG}kernel still running after {limit_s:g} s"


def watchdog_aborted(limit_s: float, record: str | None) -> str:
    """The words for a launch the host watchdog aborted after ``limit_s`` and that then stopped,
    in both launchers: ``record`` is what its error record says (None: no block reported)."""
    return (f"{watchdog_expired(limit_s)}; aborted"
            + (f" ({record})" if record else " (no thread block reported a timeout)"))


__all__ = ["describe_stuck", "describe_refusal", "watchdog_expired", "watchdog_aborted", "WATCHDOG",
           "IGNORES_ABORT"]
