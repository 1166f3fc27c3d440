"""The launches of a :class:`~hccc.runtime.rank_group.RankGroup`'s ranks under the host watchdog:
every rank's kernel started between one timer per platform object, the wait for them all with a
limit on top of the kernels' own timeout, the abort flag raised when that limit passes (or on an
interrupt or an error), and why a launch stuck, read from the error record
(:func:`describe_stuck`). Kernels that outlive the abort flag's grace mark the group broken
(:attr:`RankLaunches.broken`): their memory is never freed.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.kernel_abi import (V_REFUSAL, WAIT_COUNTS, WAIT_DATA, WAIT_DEP, WAIT_SLOT, ErrorRecord,
                                     op_name)
from hccc.runtime.kernel_watch import ABORT_GRACE_S, watched_wait
from hccc.runtime.rank_memory import synchronize_in_background


class RankLaunches:
    """Launch and watch the kernels of every rank: ``kernels`` (the group's
    :class:`~hccc.runtime.rank_kernels.RankKernels`) on ``rank_pf`` (each rank's Platform object)
    in ``streams``, ``distinct`` the platform objects to synchronize, ``grid`` the thread blocks of
    each rank, ``flags`` the :class:`~hccc.runtime.rank_memory.LaunchFlags` (abort flag and error
    record, ``flags_pf``'s), ``timeout_s`` the kernels' spin-wait limit and ``ir`` the program
    (for :func:`describe_stuck`)."""

    def __init__(self, ir: ProgramIR, kernels, rank_pf: list, distinct: list, grid, streams: list,
                 flags, flags_pf, timeout_s: float):
        self.ir, self.kernels, self.rank_pf, self.distinct = ir, kernels, rank_pf, distinct
        self.grid, self.streams, self.flags, self.flags_pf = grid, streams, flags, flags_pf
        self.timeout_s = timeout_s
        #: why the kernels of an earlier launch still run (their memory must stay), or None
        self.broken: str | None = None

    def names(self) -> str:
        """The platforms' names, e.g. ``"cuda+hip"``."""
        return "+".join(sorted({pf.name for pf in self.distinct})) or "no"

    def launch_all(self, args, blocks, limit, grid_arg: bytes | None = None) -> list:
        """Launch every rank's kernel through its own platform, or with ``grid_arg`` the one-grid
        entry once (every rank, ``sum(grid)`` blocks), between the start and the stop of one timer
        per platform object; returns the timers."""
        users = [pf for pf in self.distinct if any(self.rank_pf[r] is pf and self.grid[r] > 0
                                                      for r in range(len(self.rank_pf)))]
        timers = []
        try:
            for pf in users:
                timers.append(pf.timer())
                timers[-1].start()
            self.kernels.launch(args, blocks, self.streams, grid_arg, self.flags.abort)
        except BaseException:
            # ranks already launched (or held back by a timer) wait for the others: abort them
            try:
                self.flags.raise_abort()
                for t in timers:
                    t.stop()
                self.wait(limit)
            except Exception:
                pass
            raise
        for t in timers:
            t.stop()
        return timers

    @staticmethod
    def timed(launch, warmup: int, iters: int):
        """``warmup + iters`` launches (``launch()``: timers and why it stuck), until one sticks:
        (the timed launches' times in us, why the last stuck or None). Platforms hold their
        launches until their timer stops (all ranks start together): a launch takes as long as
        its slowest platform's part."""
        times, stuck = [], None
        for it in range(warmup + iters):
            timers, stuck = launch()
            if stuck is not None:
                break
            if it >= warmup:
                times.append(max(t.elapsed_us() for t in timers))
        return times, stuck

    def wait(self, limit: float) -> str | None:
        """Synchronize under the host watchdog (:func:`~hccc.runtime.kernel_watch.watched_wait`);
        None when every kernel finished."""
        grace = max(ABORT_GRACE_S, 2.0 * self.timeout_s)
        w = watched_wait(self.distinct, self.flags, limit, grace, name="hccc-synchronize")
        if not w.late:
            if w.failure is not None:
                raise w.failure
            return None
        if w.finished:
            rec = self.error_message()
            return (f"host watchdog: kernels still running after {limit:.0f} s; aborted"
                    + (f" ({rec})" if rec else " (no thread block reported a timeout)"))
        self.broken = (f"kernels still running {limit + grace:.0f} s after launch and ignore the "
                       "abort flag")
        return f"host watchdog: {self.broken}"

    def stop(self) -> None:
        """Stop every kernel launched here before anything they use is freed (an interrupt or an
        error left them running): raise the abort flag and wait for every platform, with Ctrl-C
        held back. Kernels still running after the grace time mark the group broken."""
        if self.broken:
            return
        with deferred_interrupts():
            try:
                self.flags.raise_abort()
            except Exception:
                pass
            # (an aborted kernel's error is ignored: it has stopped all the same)
            done, _, _ = synchronize_in_background(self.distinct, "hccc-stop")
            if not done.wait(max(ABORT_GRACE_S, 2.0 * self.timeout_s)):
                self.broken = "kernels still running after an interrupt ignore the abort flag"

    def error_message(self) -> str | None:
        """Why the last launch failed, from the error record (None: no record, no abort)."""
        e = self.flags.record()
        if not e.valid:
            return "aborted without an error record" if self.flags.aborted else None
        # the waited time is counted in the ticks of the reporting rank's platform
        pf = self.rank_pf[e.rank] if 0 <= e.rank < len(self.rank_pf) else self.flags_pf
        return describe_stuck(self.ir, e, pf.ticks_per_us)


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


__all__ = ["RankLaunches", "describe_stuck", "describe_refusal"]
