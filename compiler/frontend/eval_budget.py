"""What the DSL evaluator (:mod:`hccc.compiler.frontend.evaluator`) may spend: loop iterations,
transfers and work, each counted before the work it guards (:class:`Budget`), and the trip counts
of a ``range`` checked against it (:meth:`Budget.trips`). Past a limit: a located CompileError at
the construct that would exceed it.
"""
from __future__ import annotations

import numpy as np

from hccc.util.diagnostics import CompileError, Location
from hccc.compiler.frontend.rccl_parser import For, Transfer
from hccc.compiler.frontend.eval_rows import I64, Frame

DEFAULT_MAX_TRANSFERS = 10 ** 7
DEFAULT_MAX_ITERATIONS = 10 ** 8
#: The evaluator's total work, in units of one row of one vectorised operation. Measured (CPython
#: 3.11, numpy, one core): a vectorised operation costs about 10 ns a row, and one statement run
#: once (by a loop with a carried name, which runs its body iteration by iteration) about 5 us, so
#: :data:`STATEMENT_COST` row units. The default budget is about 1.5 s of evaluation at those rates
#: and leaves room for the largest programs the transfer limit admits (10**7 transfers from a
#: loop of a few operations a row: about 7 * 10**7 units); ``HCCC_MAX_RCCL_WORK`` raises it.
DEFAULT_MAX_WORK = 150_000_000
#: the work of running one statement (or one iteration of a loop) once, in row units (see above)
STATEMENT_COST = 500


def trip_scalar(start: int, stop: int, step: int) -> int:
    """How many iterations ``range(start, stop, step)`` runs (``step`` nonzero)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // (-step))


class Budget:
    """The limits of one evaluation and what it has spent of them so far."""

    def __init__(self, max_transfers: int, max_iterations: int, max_work: int = DEFAULT_MAX_WORK):
        self.max_transfers = max_transfers
        self.max_iterations = max_iterations
        self.max_work = max_work
        self.work = 0
        self.iterations = 0
        self.ntransfers = 0

    def charge(self, units: int, loc: Location) -> None:
        """Count ``units`` of work (:data:`DEFAULT_MAX_WORK`) before doing it; past the budget,
        a located error at the construct that would do it."""
        self.work += units
        if self.work > self.max_work:
            raise CompileError.at(loc, f"evaluation work limit exceeded: the program needs more than "
                                       f"{self.max_work} units of work (one unit: one row of one "
                                       f"operation; one statement run once: {STATEMENT_COST}); write "
                                       f"fewer nested loops, or set HCCC_MAX_RCCL_WORK to raise the limit")

    def fits_transfers(self, n: int) -> bool:
        """Would ``n`` more transfers stay within the limit?"""
        return self.ntransfers + n <= self.max_transfers

    def too_many_transfers(self, s: Transfer):
        raise CompileError.at(s.loc, f"too many transfers: the program makes more than "
                                     f"{self.max_transfers} (raise the max_transfers limit if "
                                     f"this is intended)")

    def trips(self, start, stop, step, f: Frame, s: For):
        """Per-row trip counts (int or int64 array) and their total, checked against the budget."""
        budget = self.max_iterations - self.iterations
        if not any(isinstance(x, np.ndarray) for x in (start, stop, step)):
            t = trip_scalar(start, stop, step)
            total = t * f.n
            if total > budget:
                self.iteration_limit(s)
            return t, total
        n = f.n
        st = np.broadcast_to(np.asarray(start, dtype=I64), (n,))
        sp = np.broadcast_to(np.asarray(stop, dtype=I64), (n,))
        sc = np.broadcast_to(np.asarray(step, dtype=I64), (n,))
        pos = sc > 0
        hi = np.where(pos, sp, st)
        lo = np.where(pos, st, sp)
        # hi - lo is exact modulo 2**64, and < 2**64 when hi > lo (|values| <= 2**62).
        d = hi.astype(np.uint64) - lo.astype(np.uint64)
        a = np.abs(sc).astype(np.uint64)
        t = d // a + (d % a != 0).astype(np.uint64)
        t = np.where(hi > lo, t, np.uint64(0))
        if int(t.max()) > budget:
            self.iteration_limit(s)
        t = t.astype(I64)
        total = int(t.sum())
        if total > budget:
            self.iteration_limit(s)
        return t, total

    def iteration_limit(self, s: For):
        raise CompileError.at(s.loc, f"loop iteration limit exceeded: the program would run more "
                                     f"than {self.max_iterations} loop iterations")
