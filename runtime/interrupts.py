"""Ctrl-C while workers run: stop them first, then free, then leave.

A KeyboardInterrupt reaches the main thread between two Python steps; the work it interrupts may
go on elsewhere (the CPU emulation's kernel threads, a GPU, a waiter thread). Freeing the memory
that work uses before it has stopped ends the process with SIGSEGV instead of exit status 130.
:func:`deferred_interrupts` holds further Ctrl-Cs back while the stopping and freeing run, so a
second press cannot cut them short either; one pressed meanwhile is raised when the block ends
(unless an exception already leaves it).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def deferred_interrupts():
    """Run the block with SIGINT recorded instead of raised (main thread only; elsewhere the block
    runs as it is, signals being delivered to the main thread anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum, frame):
        pending.append(signum)

    try:
        old = signal.signal(signal.SIGINT, record)
    except ValueError:                      # no signal handling here (an embedded interpreter)
        yield
        return
    leaving_by_exception = True
    try:
        yield
        leaving_by_exception = False
    finally:
        signal.signal(signal.SIGINT, old)
        if pending and not leaving_by_exception:
            raise KeyboardInterrupt


__all__ = ["deferred_interrupts"]
