"""The one wait for running kernels under a limit (:func:`hccc.runtime.kernel_watch.watched_wait`),
which both the single-process runner's watchdog and a rank's wait for its kernel use: against fake
kernels that end on their own after a while, end when the abort flag is raised, or ignore it."""
from __future__ import annotations

import threading
import time

import pytest

from hccc.runtime.kernel_watch import watched_wait


class Flags:
    """The abort flag, as :class:`~hccc.runtime.rank_memory.LaunchFlags` raises it."""

    def __init__(self):
        self.abort, self.raised = threading.Event(), 0

    def raise_abort(self):
        self.raised += 1
        self.abort.set()


class Kernel:
    """A platform whose launch runs ``run_s`` seconds, or until the abort flag when it obeys it."""

    def __init__(self, flags: Flags, run_s: float, obeys: bool = True):
        self.flags, self.run_s, self.obeys = flags, run_s, obeys

    def synchronize(self):
        end = time.monotonic() + self.run_s
        while time.monotonic() < end:
            if self.obeys and self.flags.abort.is_set():
                return
            time.sleep(0.005)


@pytest.mark.parametrize("problem", [False, True])
def test_kernels_that_end_in_time_are_left_alone(problem):
    flags = Flags()
    w = watched_wait([Kernel(flags, 0.05)], flags, 5.0, 5.0, name="t",
                     problem=(lambda: None) if problem else None, poll_s=0.01)
    assert (w.finished, w.late, w.cause, w.failure, flags.raised) == (True, False, None, None, 0)
    w.waiter.join(1)
    assert not w.waiter.is_alive()


def test_kernels_past_the_limit_are_aborted():
    flags = Flags()
    t0 = time.monotonic()
    w = watched_wait([Kernel(flags, 30.0)], flags, 0.2, 5.0, name="t")
    assert (w.finished, w.late, w.cause, flags.raised) == (True, True, None, 1)
    assert 0.2 <= time.monotonic() - t0 < 4.0


def test_kernels_that_ignore_the_abort_flag_are_given_up_after_the_grace():
    flags = Flags()
    t0 = time.monotonic()
    w = watched_wait([Kernel(flags, 2.0, obeys=False)], flags, 0.1, 0.2, name="t")
    took = time.monotonic() - t0
    assert (w.finished, w.late, flags.raised) == (False, True, 1)
    assert 0.3 <= took < 1.8


def test_the_first_problem_aborts_at_once_and_is_the_cause():
    flags, told, asked = Flags(), [], []
    start = time.monotonic()

    def problem():
        asked.append(1)
        return "rank 3 exited" if time.monotonic() - start > 0.1 else None
    w = watched_wait([Kernel(flags, 30.0)], flags, 10.0, 5.0, name="t", problem=problem,
                     on_problem=lambda: told.append(1), poll_s=0.01)
    assert time.monotonic() - start < 4.0
    assert (w.finished, w.late, w.cause, flags.raised, told) == (True, False, "rank 3 exited", 1, [1])
    assert len(asked) >= 2          # polled until the problem came, not after


def test_a_synchronize_error_is_handed_back():
    class Failing:
        def synchronize(self):
            raise RuntimeError("device lost")
    flags = Flags()
    w = watched_wait([Failing()], flags, 5.0, 5.0, name="t")
    assert w.finished and not w.late and str(w.failure) == "device lost" and flags.raised == 0


def test_problems_need_a_poll_interval():
    with pytest.raises(ValueError, match="poll_s"):
        watched_wait([], Flags(), 1.0, 1.0, name="t", problem=lambda: None)


def test_waits_through_a_kept_thread_use_it_for_every_wait_and_fall_back_while_it_is_busy():
    """:class:`~hccc.runtime.rank_memory.BackgroundSync`: every wait synchronizes in its one kept
    thread while the previous wait has ended; a wait that starts while that thread is still held
    by kernels that ignore the abort flag gets a thread of its own and ends all the same; the kept
    thread ends on close once its wait is over."""
    from hccc.runtime.rank_memory import BackgroundSync

    class Seen:
        def __init__(self, run_s=0.0):
            self.threads, self.run_s = [], run_s

        def synchronize(self):
            self.threads.append(threading.current_thread())
            time.sleep(self.run_s)

    sync = BackgroundSync("kept")
    quick = Seen()
    for _ in range(3):
        w = watched_wait([quick], Flags(), 5.0, 5.0, name="t", sync=sync)
        assert w.finished and not w.late
    assert len(set(quick.threads)) == 1 and quick.threads[0].name == "kept"
    stuck = Flags()
    held = watched_wait([Kernel(stuck, 1.0, obeys=False)], stuck, 0.05, 0.05, name="t", sync=sync)
    assert not held.finished
    other = Seen()
    w = watched_wait([other], Flags(), 5.0, 5.0, name="own", sync=sync)
    assert w.finished and other.threads[0].name == "own"
    held.waiter.join(5.0)
    w = watched_wait([quick], Flags(), 5.0, 5.0, name="t", sync=sync)
    assert w.finished and quick.threads[-1] is quick.threads[0]
    sync.close()
    quick.threads[0].join(5.0)
    assert not quick.threads[0].is_alive()


def test_a_wait_without_a_thread_to_spare_synchronizes_in_the_caller():
    """Where no thread can start (no memory for its stack), the platforms are synchronized in the
    caller before it returns: the kernels finish before their memory could be freed."""
    import threading
    from unittest import mock

    from hccc.runtime import rank_memory

    calls = []

    class Pf:
        def synchronize(self):
            calls.append(self)

    pfs = [Pf(), Pf()]
    with mock.patch.object(threading.Thread, "start", side_effect=RuntimeError("can't start new thread")):
        done, failure, thread = rank_memory.synchronize_in_background(pfs, "test-wait")
    assert done.is_set() and failure == [] and calls == pfs
    thread.join()
