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

While numba compiles hccc's kernels (10-20 s a module, once after an install: numba caches them on
disk) every Progress says so (:func:`hccc.util.clock.watch_compiles`): on a terminal a line with a
spinner and the seconds spent, otherwise one plain line per command.
"""
from __future__ import annotations

import contextlib
import os
import sys
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


class _Task:
    """Counted work inside a :class:`Progress`."""

    def __init__(self, owner: "Progress", text: str, total: int | None):
        self.owner, self.text, self.total, self.done = owner, text, total, 0
        self.id = None
        if owner.live is not None:
            self.id = owner.live.add_task(text, total=total)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.id is not None:
            self.owner.live.update(self.id, advance=n)

    def update(self, detail: str) -> None:
        """Change the text after the phase name (live display only)."""
        if self.id is not None:
            self.owner.live.update(self.id, description=f"{self.text}: {detail}")

    def finish(self) -> None:
        if self.id is not None:
            self.owner.live.remove_task(self.id)
            self.id = None


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
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=Console(file=self.stream), transient=True)
            self.live.__enter__()
        if self.enabled:
            from hccc.util.clock import watch_compiles
            watch_compiles(self._on_compile)
        return self

    def __exit__(self, *exc) -> None:
        from hccc.util.clock import unwatch_compiles
        unwatch_compiles(self._on_compile)
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

    def task(self, text: str, total: int) -> _Task:
        """Counted work (``total`` steps); call ``advance()`` per step."""
        self._plain(text)
        return _Task(self, text, total)

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
