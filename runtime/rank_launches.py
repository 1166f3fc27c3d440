"""The launches of a :class:`~hccc.runtime.rank_group.RankGroup`'s ranks under the host watchdog:
every rank's kernel started between one timer per platform object, the wait for them all with a
limit on top of the kernels' own timeout, the abort flag raised when that limit passes (or on an
interrupt or an error), and why a launch stuck, read from the error record
(:func:`~hccc.runtime.kernel_errors.describe_stuck`). Kernels that outlive the abort flag's grace mark the group broken
(:attr:`RankLaunches.broken`): their memory is never freed.
"""
from __future__ import annotations

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.kernel_errors import IGNORES_ABORT, describe_stuck, watchdog_aborted, watchdog_expired
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
            return watchdog_aborted(limit, rec)
        self.broken = f"{watchdog_expired(limit)}; {IGNORES_ABORT}"
        return self.broken

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
                self.broken = f"kernels still running after an interrupt; {IGNORES_ABORT}"

    def error_message(self) -> str | None:
        """Why the last launch failed, from the error record (None: no record, no abort)."""
        e = self.flags.record()
        if not e.valid:
            return "aborted without an error record" if self.flags.aborted else None
        # the waited time is counted in the ticks of the reporting rank's platform
        pf = self.rank_pf[e.rank] if 0 <= e.rank < len(self.rank_pf) else self.flags_pf
        return describe_stuck(self.ir, e, pf.ticks_per_us)


__all__ = ["RankLaunches"]
