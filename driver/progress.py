"""Progress and feedback for every long phase of the ``hccc`` commands: one implementation.

On a terminal (standard error is a TTY) a ``rich`` live display shows each running phase with a
spinner and its elapsed time (``elapsed 3.2 s of 60 s`` when the phase has a time limit), and a bar
for counted work (sizes run, cases fuzzed); lines the command prints meanwhile appear above it.
Otherwise (a pipe, a log file, a CI job) each phase prints one plain line to standard error when it
starts (``hccc sim: simulating 3 sizes``) and nothing else, so logs stay short and stable.

Used by builds (g++/nvcc/hipcc through the runtime), simulation, plotting, big compiles,
synthesis and fuzzing::

    with Progress("hccc sim", enabled=not args.json) as progress:
        with progress.phase("building ring.rccl"):
            ...
        task = progress.task("simulating", total=len(sizes))
        for size in sizes:
            ...
            task.advance()
        progress.update("simulating", "size 64M")

``enabled=False`` (``--json`` output) keeps the command silent on standard error.

Counted work whose steps have sizes (a sweep's: ``task(text, total, sizes=...)``) shows the time
left on a terminal (:class:`Eta`, fitted to the steps done), and after :data:`SILENCE_S` with nothing
shown (before a first phase, between phases) a spinner says the command is still working.

While numba compiles hccc's kernels (10-20 s a module, once after an install: numba caches them on
disk) every Progress says so (:func:`hccc.util.clock.watch_compiles`): on a terminal a line with a
spinner and the seconds spent, otherwise one plain line per command.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time


def interactive(stream=None) -> bool:
    """Whether live progress fits ``stream`` (standard error by default): a TTY, and not turned off
    with ``HCCC_PROGRESS=plain``."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("HCCC_PROGRESS", "").lower() == "plain":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


#: the longest a live display goes without a sign of life: after this many seconds with nothing
#: shown (before the first phase, between two, after the last), a spinner says the command is still
#: working, after which phase, with the seconds it has been shown. 2 s: long enough that a quick step between phases shows nothing, short
#: enough that nobody wonders whether the command hangs (it replaced 35 s of silence of a first
#: ``hccc synth``)
SILENCE_S = 2.0
#: how often the live display checks for silence
SILENCE_POLL_S = 0.25


class Eta:
    """The seconds left of counted work whose steps cost about ``a + b * size`` each (a sweep's
    sizes: a fixed part per call and a part in proportion to its bytes), ``a`` and ``b`` >= 0
    fitted by least squares to the steps done so far. Unknown (None) until two steps of different
    sizes are done, unless every step has the same size (then each takes the mean time so far): one
    size alone cannot tell the fixed part from the proportional one, and a sweep's later, larger
    sizes are where its time goes.

    The steps are ``sizes`` repeated ``cycles`` times (``hccc run -N``); every update and estimate
    takes constant time and memory (running sums, the fit's moments updated as Welford's are),
    however many steps there are."""

    def __init__(self, sizes, cycles: int = 1):
        self.sizes = [float(x) for x in sizes]
        self.steps = len(self.sizes) * max(0, int(cycles))
        self.n = 0                                     # steps done
        self._cycle_sum = sum(self.sizes)
        self._left_sum = self._cycle_sum * max(0, int(cycles))
        self._first: float | None = None
        self._varied = False                           # two sizes among the steps done
        self._mx = self._mt = self._sxx = self._sxt = 0.0   # means and co-moments of (size, seconds)
        self._xx = self._xt = 0.0                      # raw sums (the fit through the origin)

    def step(self, seconds: float) -> None:
        """The next step is done, in ``seconds``."""
        if self.n >= self.steps:
            return
        x, t = self.sizes[self.n % len(self.sizes)], max(0.0, float(seconds))
        self.n += 1
        self._left_sum -= x
        if self._first is None:
            self._first = x
        elif x != self._first:
            self._varied = True
        dx = x - self._mx
        self._mx += dx / self.n
        dt = t - self._mt
        self._mt += dt / self.n
        self._sxx += dx * (x - self._mx)
        self._sxt += dx * (t - self._mt)
        self._xx += x * x
        self._xt += x * t

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``, or None while the steps done have fewer than two sizes."""
        if not self._varied or self._sxx <= 0:
            return None
        b = self._sxt / self._sxx
        a = self._mt - b * self._mx
        if b < 0:                     # the constrained optimum lies on an edge
            return self._mt, 0.0
        if a < 0:
            return 0.0, self._xt / self._xx
        return a, b

    def seconds_left(self) -> float | None:
        """The fit's time of the steps left; where every step has one size, their mean time each."""
        left = self.steps - self.n
        if self.n and not self._varied and all(x == self._first for x in self.sizes):
            return left * self._mt
        ab = self.fit()
        if ab is None:
            return None
        a, b = ab
        return max(0.0, a * left + b * max(0.0, self._left_sum))


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "ETA ?"
    s = int(round(seconds))
    return f"ETA {s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"ETA {s // 60}:{s % 60:02d}"


class _Task:
    """Counted work inside a :class:`Progress`; with ``sizes`` (each step's size, in order) the live
    display shows the time left (:class:`Eta`)."""

    def __init__(self, owner: "Progress", text: str, total: int | None, sizes=None, cycles: int = 1):
        self.owner, self.text, self.total, self.done = owner, text, total, 0
        self.id = None
        self.eta = Eta(sizes, cycles) if sizes is not None else None
        self._last = time.perf_counter()
        if owner.live is not None:
            self.id = owner.live.add_task(text, total=total, eta=_eta_text(None) if self.eta else "")

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        fields = {}
        if self.eta is not None:
            for _ in range(n):
                self.eta.step((now - self._last) / n)
            fields["eta"] = _eta_text(self.eta.seconds_left())
        self._last = now
        if self.id is not None:
            self.owner.live.update(self.id, advance=n, **fields)

    def update(self, detail: str) -> None:
        """Change the text after the phase name (live display only)."""
        if self.id is not None:
            self.owner.live.update(self.id, description=f"{self.text}: {detail}")

    def finish(self) -> None:
        if self.id is not None:
            self.owner.live.remove_task(self.id)
            self.id = None
        if self.text != Progress.COMPILING:
            self.owner._last_shown = self.text


class Progress:
    """Live progress on a terminal, one plain line per phase otherwise (see the module docstring)."""

    def __init__(self, label: str, *, enabled: bool = True, stream=None):
        self.label = label
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.live = None
        self.lines: list[str] = []       # the plain lines written (for tests and callers)
        self._compiling = None           # the live task shown while numba compiles
        self._told_compile = False
        self._last_shown: str | None = None   # the text of the last task or phase finished
        self._quiet = None               # the live task that says the command is working (SILENCE_S)
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    #: what every display says while numba compiles
    COMPILING = "numba is compiling hccc's kernels (once after an install; cached on disk for later runs)"

    def _on_compile(self, starting: bool) -> None:
        """numba started (``starting``) or ended an outermost compile (:mod:`hccc.util.clock`)."""
        if self.live is not None:
            if starting and self._compiling is None:
                self._compiling = _Task(self, self.COMPILING, None)
            elif not starting and self._compiling is not None:
                self._compiling.finish()
                self._compiling = None
        elif starting and not self._told_compile:
            self._told_compile = True
            self._plain(self.COMPILING)

    def __enter__(self) -> "Progress":
        if self.enabled and interactive(self.stream):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self.live = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                     console=Console(file=self.stream), transient=True)
            self.live.__enter__()
            self._quiet = self.live.add_task("", total=None, visible=False, eta="")
            self._stop.clear()
            self._watch = threading.Thread(target=self._watch_silence, name="hccc-progress", daemon=True)
            self._watch.start()
        if self.enabled:
            from hccc.util.clock import watch_compiles
            watch_compiles(self._on_compile)
        return self

    def _watch_silence(self) -> None:
        """(live display) After :data:`SILENCE_S` with no task shown, show that the command is
        working and after which phase; hide that again while a task is shown."""
        quiet_since, showing = time.perf_counter(), False
        while not self._stop.wait(SILENCE_POLL_S):
            live = self.live
            if live is None:
                return
            busy = any(t.visible and t.id != self._quiet for t in live.tasks)
            now = time.perf_counter()
            if busy:
                quiet_since = now
                if showing:
                    live.update(self._quiet, visible=False)
                    showing = False
            elif not showing and now - quiet_since >= SILENCE_S:
                after = f" (after {self._last_shown})" if self._last_shown else ""
                live.reset(self._quiet, visible=True, description=f"working{after}")
                showing = True

    def __exit__(self, *exc) -> None:
        from hccc.util.clock import unwatch_compiles
        unwatch_compiles(self._on_compile)
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
            self._watch = None
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def _plain(self, text: str) -> None:
        if not self.enabled or self.live is not None:
            return
        line = f"{self.label}: {text}"
        self.lines.append(line)
        self.stream.write(line + "\n")
        self.stream.flush()

    @contextlib.contextmanager
    def phase(self, text: str, *, limit_s: float | None = None):
        """A phase of unknown length: spinner and elapsed time (of ``limit_s`` when given)."""
        self._plain(text + (f" (time limit {limit_s:g} s)" if limit_s else ""))
        task = _Task(self, text, None)
        start = time.perf_counter()
        try:
            yield _Phase(task, start, limit_s)
        finally:
            task.finish()

    def task(self, text: str, total: int, *, sizes=None, cycles: int = 1) -> _Task:
        """Counted work (``total`` steps); call ``advance()`` per step. ``sizes``: each step's
        size in order (a sweep's bytes), repeated ``cycles`` times, for the time left on the live
        display (:class:`Eta`)."""
        self._plain(text)
        return _Task(self, text, total, sizes, cycles)

    def print(self, line: str) -> None:
        """A line of the command's output on standard output (above the live display on a terminal)."""
        if self.live is not None:
            self.live.console.file.flush()
        print(line, flush=True)


class _Phase:
    """Handle of a running phase: ``update(detail)`` changes the live text (elapsed and limit shown)."""

    def __init__(self, task: _Task, start: float, limit_s: float | None):
        self.task, self.start, self.limit_s = task, start, limit_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, detail: str) -> None:
        limit = f" of {self.limit_s:g} s" if self.limit_s else ""
        self.task.update(f"{detail} (elapsed {self.elapsed():.1f} s{limit})")
