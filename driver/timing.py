"""A command's wall time, from its start to its report, in named parts that add up to it.

A report of how long a command took must be the time its user waited: ``hccc synth`` on a cold
cache (the first run after an install, numba compiling hccc's kernels) once waited 39 s and
reported 2.44 s, the search's own time on the work clock (:mod:`hccc.util.clock`, which leaves the
compiles out so that a time limit decides alike on a cold and a warm run). Here the whole is the
wall time from the command's start, and the parts are its spans between :meth:`Spans.mark` calls,
each less the compiling that fell in it, with numba's compiling a part of its own; so the parts
add up to the whole (to the rounding of the figures printed).

The start is the process's own start where the command is the ``hccc`` process (Linux: the start
time of ``/proc/self/stat``, so the interpreter's start-up and the imports count; elsewhere the
moment :mod:`hccc.cli` was imported), or the call of :func:`hccc.cli.main` in a caller's process
(:func:`start`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from hccc.util import clock

_started: float | None = None      # perf_counter() at the command's start
_compiled_at_start = 0.0           # clock.compile_seconds() then


def process_start() -> float | None:
    """The ``time.perf_counter()`` reading at which this process started, or None where the
    system does not say (Linux's ``/proc``: clock ticks, 10 ms)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        age = uptime - int(after_name[19]) / ticks      # field 22 of stat: the start time, in ticks since boot
    except (OSError, ValueError, IndexError):
        return None
    return time.perf_counter() - max(0.0, age)


def start(at: float | None = None, *, compiled: float | None = None) -> None:
    """The command starts at ``perf_counter()`` reading ``at`` (now when None), when numba had
    compiled for ``compiled`` seconds (:func:`hccc.util.clock.compile_seconds`; read now when None)."""
    global _started, _compiled_at_start
    _started = time.perf_counter() if at is None else min(at, time.perf_counter())
    _compiled_at_start = clock.compile_seconds() if compiled is None else compiled


def started() -> float:
    """The command's start (:func:`start`; now where none was set)."""
    if _started is None:
        start()
    return _started  # type: ignore[return-value]


def started_on_work_clock() -> float:
    """The command's start (:func:`started`) on the work clock (:func:`hccc.util.clock.now`: wall
    time less numba's compiling): a deadline ``T`` seconds after it is ``T`` seconds of the
    command's own wall time, its start-up (the interpreter, the imports) included."""
    return started() - _compiled_at_start


#: the name of the part that is numba's compiling, wherever it fell
COMPILING = "numba compiling hccc's kernels"


@dataclass
class Spans:
    """The parts of a command's wall time: each :meth:`mark` ends the part it names (from the
    previous mark, or the command's start), less the compiling in it; :meth:`parts` adds the
    compiling as a part of its own, so the parts add up to :meth:`total`."""
    begin: float = field(default_factory=started)
    compiled: float = field(default_factory=lambda: _compiled_at_start if _started is not None
                            else clock.compile_seconds())
    marks: list = field(default_factory=list)          # (name, perf_counter(), compile_seconds())

    def mark(self, name: str) -> None:
        self.marks.append((name, time.perf_counter(), clock.compile_seconds()))

    def total(self) -> float:
        """Wall seconds from the start to the last mark."""
        return (self.marks[-1][1] if self.marks else self.begin) - self.begin

    def parts(self) -> dict[str, float]:
        """``{part: seconds}`` in order, the compiling last (where there was any)."""
        out: dict[str, float] = {}
        t, c = self.begin, self.compiled
        for name, t2, c2 in self.marks:
            out[name] = out.get(name, 0.0) + max(0.0, (t2 - t) - (c2 - c))
            t, c = t2, c2
        spent = c - self.compiled
        if spent > 0:
            out[COMPILING] = spent
        return out
