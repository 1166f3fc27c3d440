"""The one wait for running kernels under a limit: a rank's wait while it watches its peers
(:func:`~hccc.runtime.kernel_wait.wait_for_kernel`; the single-process runner's ranks wait so too): the platforms synchronized in the
background (:func:`~hccc.runtime.rank_memory.synchronize_in_background`), the abort flag raised at
the first problem the caller reports or when the limit passes, and the kernels given up on when
they outlive the abort by the grace time (they ignore the flag: their memory must stay).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from hccc.runtime.rank_memory import synchronize_in_background

#: the least time kernels get to end after the abort flag is raised (more with a longer spin-wait
#: timeout, which each caller adds): a kernel ends at its next wait, which comes within a
#: primitive's copy of at most one slot
ABORT_GRACE_S = 5.0

#: the least host-side limit on one launch of every rank (the watchdog's floor, seconds)
WATCHDOG_FLOOR_S = 30.0
#: bytes per second the slowest launch is assumed to move at least, over the ranks' buffers
#: (4 bytes of traffic per byte of each rank's buffer): the CPU emulation of a large program on a
#: loaded 2-core host, far below any GPU's, so that the watchdog only fires on kernels that hang
WATCHDOG_BYTES_PER_S = 20e6


def default_watchdog_s(kernel_timeout_s: float, nbytes: int, nranks: int) -> float:
    """The host-side limit on one launch of ``nranks`` ranks at ``nbytes`` of full buffer when the
    caller gives none: at least :data:`WATCHDOG_FLOOR_S` and three times the kernels' own
    spin-wait limit, plus the time the traffic takes at :data:`WATCHDOG_BYTES_PER_S`."""
    total = int(nbytes) * max(int(nranks), 1) * 4
    return max(WATCHDOG_FLOOR_S, 3.0 * float(kernel_timeout_s)) + total / WATCHDOG_BYTES_PER_S


@dataclass
class Watched:
    """How a :func:`watched_wait` ended."""
    #: every kernel ended (on its own, or after the abort flag)
    finished: bool
    #: the caller's problem that raised the abort flag, or None
    cause: str | None
    #: the limit passed before the kernels ended
    late: bool
    #: the error a synchronize raised, or None
    failure: BaseException | None
    #: the background waiter (:func:`synchronize_in_background`); ended when :attr:`finished`
    waiter: object


def watched_wait(platforms, flags, limit: float, grace: float, *, name: str, problem=None,
                 on_problem=None, poll_s: float | None = None, sync=None) -> Watched:
    """Wait for every launch on ``platforms`` (``flags``: their
    :class:`~hccc.runtime.rank_memory.LaunchFlags`). ``problem()``, asked every ``poll_s`` until
    the limit passes, is a reason to abort now or None; the first reason raises the abort flag and
    calls ``on_problem()``. When ``limit`` seconds pass first, the abort flag is raised; kernels
    still running ``grace`` seconds after the limit are given up on (``finished`` False). Without
    ``problem`` the wait sleeps until the limit, polling nothing. ``sync``: the
    :class:`~hccc.runtime.rank_memory.BackgroundSync` whose kept thread synchronizes, else a
    thread is started for this wait."""
    if problem is not None and not (poll_s and poll_s > 0):
        raise ValueError("a watched wait that asks for problems needs a positive poll_s")
    done, failure, waiter = (sync.start if sync is not None else synchronize_in_background)(platforms, name)
    deadline = time.monotonic() + float(limit)
    cause, late = None, False
    while True:
        now = time.monotonic()
        if problem is not None and not late:
            step = poll_s
        else:
            step = (deadline + grace if late else deadline) - now
        if done.wait(max(0.0, step)):
            break
        if problem is not None and not late and cause is None:
            why = problem()
            if why:
                cause = why
                flags.raise_abort()
                if on_problem is not None:
                    on_problem()
        now = time.monotonic()
        if now > deadline and not late:
            late = True
            if cause is None:
                flags.raise_abort()
        if late and now > deadline + grace:
            return Watched(False, cause, True, None, waiter)
    return Watched(True, cause, late, failure[0] if failure else None, waiter)


__all__ = ["ABORT_GRACE_S", "Watched", "watched_wait"]
