"""The selection loop of synthesis: one loop for every choice among programs.

Synthesis chooses among programs at two levels, and both run this loop: the tree packing among
the programs of its packings (:class:`hccc.compiler.synth.forest._Selection`: shapes, chunk
counts, re-roundings, queued as the scores ask) and ``hccc synth`` among every program it could
write (``hccc.synth_select``'s ``_Choices``: the tree packing's, the step search's, hccc's
generators', the default program's). The tree packing's best is one candidate of the outer loop.

A loop holds a queue of jobs. :meth:`SelectionLoop.step` builds (and scores) one job's candidate
and may queue further jobs; jobs still to be made (:meth:`~SelectionLoop.pending`) are queued by
:meth:`~SelectionLoop.complete` when the queue runs dry. The first job is always run; each further
one only where :meth:`~SelectionLoop.affordable` says the work it needs fits before the deadline
(by default: twice the longest step so far, as long again for the caller's work on the program),
so a candidate whose construction would outlast its budget is not waited on: the loop ends there
and :meth:`~SelectionLoop.cut` is told how many jobs were not run, for the report.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable

from hccc.util import clock


class SelectionLoop:
    """A queue of jobs run in turn (see the module docstring). ``candidates``: what the steps
    built; ``build_s``: the longest step so far (the steps that build set it); ``deadline``: a
    work-clock time (:func:`hccc.util.clock.now`)."""

    def __init__(self, jobs: Iterable, deadline: float):
        self.queue = deque(jobs)
        self.deadline = float(deadline)
        self.candidates: list = []
        self.build_s = 0.0

    # ------------------------------------------------------------ what a loop defines
    def step(self, job) -> None:
        """Build (and score) ``job``'s candidate; queue what its result asks for."""
        raise NotImplementedError

    def pending(self) -> bool:
        """Whether jobs are still to be made (queued by :meth:`complete`)."""
        return False

    def complete(self) -> None:
        """Queue the jobs still to be made."""

    def affordable(self, job) -> bool:
        """Whether ``job`` (not the first) may run: twice the longest step fits before the deadline."""
        return clock.now() + 2 * self.build_s <= self.deadline

    def cut(self, not_run: int, total: int) -> None:
        """The deadline ended the loop with ``not_run`` of ``total`` jobs not run (those in
        ``queue``)."""

    def finish(self) -> None:
        """After the last step."""

    # ------------------------------------------------------------ the loop
    def run(self) -> list:
        done = 0
        while self.queue or self.pending():
            if not self.queue:
                self.complete()
                if not self.queue:
                    break
            job = self.queue.popleft()
            if self.candidates and not self.affordable(job):
                self.queue.appendleft(job)      # the jobs not run are the queue's
                self.complete()
                total = done + len(self.queue)
                self.cut(total - done, total)
                break
            done += 1
            self.step(job)
        self.finish()
        return self.candidates


__all__ = ["SelectionLoop"]
