"""Native libraries that write to the process's standard output behind Python's back.

HiGHS (scipy's LP and MIP solver) prints some diagnostics of its own with C stdio whatever its
``disp`` option says: ``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``
reached stdout in the middle of ``hccc synth --json``'s output on four MI250 nodes, so that the
JSON no longer parsed. :func:`silenced` sends file descriptor 1 to the null device for the length
of such a call: what the library wrote goes nowhere, and what Python wrote before it is flushed
out first, so no output of hccc's own is lost or reordered. Only the calling thread should write
to standard output meanwhile (hccc's progress display writes to standard error).
"""
from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager

_libc = None


def _flush_c_stdio() -> None:
    """Flush every C stdio stream of the process (a library's buffered text goes where fd 1
    points now, not later)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        _libc.fflush(None)
    except (OSError, AttributeError):
        pass


@contextmanager
def silenced():
    """Standard output at the file-descriptor level sent to the null device inside the block."""
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass
    _flush_c_stdio()
    try:
        saved = os.dup(1)
    except OSError:             # no fd 1 at all: nothing to protect
        saved = None
    if saved is None:
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
