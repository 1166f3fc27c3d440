"""The work clock: wall time less what numba spends compiling in this process.

Every time limit of hccc (``hccc synth --time-limit``, the simulator's ``deadline``, the packing's
and the search's budgets) is measured on this clock, so a first run after an install, which
compiles the kernels of :mod:`hccc.util.jit` (10-20 s each module), makes the very same decisions
as a run that loads them from numba's cache: what a time limit cuts depends on the work done, not
on whether the machine had compiled before. (Measured before the clock: two MI250 nodes'
AllGather, ``hccc synth --method trees``, kept 24 chunks per rank at 0.930 of the bound on a cold
cache, where the packing's 19 s of compiling left no time for the integral trees, and 32 at 0.946
with the cache.)

:func:`now` is :func:`time.perf_counter` minus :func:`compile_seconds`, the seconds numba spent
in its ``numba:compile`` events (numba's own compiler, not the loading of its on-disk cache, which
is cheap), counted from the moment :func:`count_compiles` installed the listener: the
:class:`hccc.util.jit.Kernels` install it before they first import numba's compiler, and nothing
else in hccc compiles. A compile nested in another (a kernel's callee, compiled while its caller
is typed) is counted once. Deadlines are times on this clock; a caller that needs real seconds
from now (a timer, a solver's time limit) takes ``deadline - now()``, which is as good as the
compiles it cannot foresee.
"""
from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_compiled = 0.0          # seconds of finished outermost compiles
_depth = 0               # compiles in progress (nested ones inside the outermost)
_started = 0.0           # perf_counter() at which the outermost one in progress began
_installed = False
# where :func:`slowdown` counts from: this module's import, early in every command
_wall0 = time.perf_counter()
_cpu0 = time.process_time()

#: the least CPU time of this process, in seconds, from which :func:`slowdown` trusts its ratio
#: (below it, a few imports' disk reads would pass for a loaded machine)
SLOWDOWN_SAMPLE_CPU_S = 0.2
#: the largest slowdown :func:`slowdown` reports: a 2-core machine shared by six busy processes
#: gave hccc synth 4.8 wall seconds per CPU second (64 nodes x 8 H20, AllToAll: 17.3 s for 3.6 s of
#: CPU, load average 12); twice that bounds what a phase that cannot stop is predicted to take
MAX_SLOWDOWN = 8.0


def _spent(t: float) -> float:
    """Compile seconds up to ``perf_counter()`` time ``t`` (the caller holds the lock)."""
    return _compiled + (t - _started if _depth else 0.0)


def compile_seconds() -> float:
    """Seconds numba has spent compiling in this process since :func:`count_compiles`, the compile
    in progress (if any) up to now included."""
    with _lock:
        return _spent(time.perf_counter())


def now() -> float:
    """The work clock: :func:`time.perf_counter` less :func:`compile_seconds`. It never runs
    backwards and stands still while numba compiles."""
    with _lock:
        t = time.perf_counter()
        return t - _spent(t)


#: callables told ``(True)`` when numba starts an outermost compile and ``(False)`` when it ends
#: (:func:`watch_compiles`: the commands' progress displays say that numba is compiling)
_watchers: list = []


def watch_compiles(callback) -> None:
    """Call ``callback(True)`` when numba starts an outermost compile, ``callback(False)`` when it
    ends (until :func:`unwatch_compiles`). The listener itself is installed by whatever compiles
    (:class:`hccc.util.jit.Kernels`), so watching costs no import of numba."""
    with _lock:
        _watchers.append(callback)


def unwatch_compiles(callback) -> None:
    with _lock:
        if callback in _watchers:
            _watchers.remove(callback)


def _tell(starting: bool) -> None:
    with _lock:
        watchers = list(_watchers)
    for w in watchers:
        try:
            w(starting)
        except Exception:        # a display that fails must never break a compile
            pass


def _begin() -> None:
    global _depth, _started
    with _lock:
        outermost = _depth == 0
        if outermost:
            _started = time.perf_counter()
        _depth += 1
    if outermost:
        _tell(True)


def _end() -> None:
    global _depth, _compiled
    with _lock:
        _depth = max(0, _depth - 1)
        outermost = _depth == 0
        if outermost:
            _compiled += time.perf_counter() - _started
    if outermost:
        _tell(False)


def count_compiles() -> bool:
    """Install the listener that counts numba's compiles (once per process; True when numba is
    there to be listened to)."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from numba.core import event
        except ImportError:
            return False

        class _CompileTimer(event.Listener):
            def on_start(self, ev):
                _begin()

            def on_end(self, ev):
                _end()

        event.register("numba:compile", _CompileTimer())
        _installed = True
        return True


def slowdown() -> float:
    """Wall seconds per CPU second of this process so far (1 on an idle machine, more where others
    share its cores; at least 1, at most :data:`MAX_SLOWDOWN`): what turns a phase's predicted CPU
    seconds into the wall seconds a deadline counts (:mod:`hccc.compiler.synth.budget`). Numba's
    compiling is left out of the wall time as the work clock leaves it out; until the process has
    used :data:`SLOWDOWN_SAMPLE_CPU_S` of CPU, 1."""
    cpu = time.process_time() - _cpu0
    if cpu < SLOWDOWN_SAMPLE_CPU_S:
        return 1.0
    with _lock:
        t = time.perf_counter()
        wall = t - _wall0 - _spent(t)
    return min(MAX_SLOWDOWN, max(1.0, wall / cpu))


#: how far :func:`pace_ahead` trusts the run queue past the pace so far: at most this many times
#: it. At a load average of 9-10 on 2 cores (about 5 a CPU) ``hccc synth`` on 64 and 128 nodes x
#: 8 H20 weighed its tree program at a pace so far of 1.5-1.9 and then ran at 2.0 (AllGather,
#: 1,024 GPUs, ``--time-limit 20``: 16.7 s), 2.2 (AllReduce, 512 GPUs, ``--time-limit 10``: 8.6 s)
#: and 4.3 (AllReduce, 1,024 GPUs, ``--time-limit 30``: 62 s): the run queue alone (5) would refuse
#: the first two, the pace so far alone let the third overrun. 1.5 lets the first two go on and
#: refuses the third (benchmarks/synth_scale.py --time-limits)
PACE_QUEUE_TRUST = 1.5


def pace_ahead() -> float:
    """The wall seconds a CPU second of this process is likely to take from now on: :func:`slowdown`
    (the pace so far), or where the machine's run queue per CPU this process may use (the
    one-minute load average over them, this process one of the load) is longer, that, up to
    :data:`PACE_QUEUE_TRUST` times the pace so far; at least 1, at most :data:`MAX_SLOWDOWN`. What a
    refusal of work that cannot stop weighs: a command's first phases (the imports, reading the
    cluster) wait on the disk as much as on the CPUs, so the pace so far understates what a loaded
    machine gives the long computing after them (``hccc synth`` on 128 nodes x 8 H20, AllReduce,
    ``--time-limit 30``, load average 10 on 2 cores: 1.6-1.9 wall seconds a CPU second when the
    command weighed its tree program, 4.3 over the whole run). A load that grows later is not
    foreseen."""
    import os
    try:
        try:
            cpus = max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            cpus = max(1, os.cpu_count() or 1)
        queue = os.getloadavg()[0] / cpus
    except (AttributeError, OSError):
        queue = 1.0
    so_far = slowdown()
    return min(MAX_SLOWDOWN, max(1.0, so_far, min(queue, PACE_QUEUE_TRUST * so_far)))


class Deadline:
    """A time on the work clock by which a piece of work must end, passed explicitly through every
    phase of it (``hccc synth --time-limit``: the bounds, the search or packing, the simulations,
    the emission). ``Deadline.after(s)``: ``s`` seconds from now; ``Deadline.never()``: no limit."""

    __slots__ = ("at",)

    def __init__(self, at: float):
        self.at = float(at)

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(now() + float(seconds))

    @classmethod
    def never(cls) -> "Deadline":
        return cls(float("inf"))

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - now()

    def passed(self) -> bool:
        return now() >= self.at

    def share(self, fraction: float) -> "Deadline":
        """The deadline that leaves the rest of the time left (``1 - fraction`` of it) to what follows."""
        if self.at == float("inf"):
            return self
        return Deadline(now() + max(0.0, self.left()) * float(fraction))

    def sooner(self, other: "Deadline | float | None") -> "Deadline":
        """The earlier of this and ``other`` (a Deadline, a work-clock time, or None: this one)."""
        if other is None:
            return self
        at = other.at if isinstance(other, Deadline) else float(other)
        return self if self.at <= at else Deadline(at)

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r})"
