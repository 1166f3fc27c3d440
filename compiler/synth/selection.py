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

Across a band of sizes (``hccc synth --band``) the candidates, each timed at every size of the
band, are ranked by :func:`band_ranked` (:data:`BAND_RULE`): one program cannot be the fastest at
4 KiB and at 1 GiB, so the one kept is the one whose worst ratio to the fastest at each size is
least, ties to the smaller program (fewer transfers), then to the one made first.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

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


#: the message sizes ``hccc synth --band`` scores every candidate at, where no ``--size`` is given:
#: 4 KiB, 64 KiB, 1 MiB, 64 MiB and 1 GiB, the sizes the selection's guarantee is measured at
#: (``benchmarks/synth_candidates.py``), from the latency regime to the bandwidth regime
SCORE_BAND = (4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30)
#: how :func:`band_ranked` orders candidates timed across a band
BAND_RULE = ("the least worst ratio, over the band's sizes, of the candidate's simulated time to the fastest "
             "candidate's there; ties to the fewer transfers, then to the one made first")


@dataclass(frozen=True)
class BandScore:
    """One candidate across a band: its name, its transfers, its simulated seconds at each size of
    the band (None: not timed there), its ratio to the fastest there (None: not timed) and its
    place in the list ranked (``index``: two candidates may share a name)."""

    name: str
    transfers: int
    seconds: tuple
    ratios: tuple
    index: int = -1

    @property
    def worst(self) -> float:
        """Its worst ratio over the band (infinity where a size did not time it)."""
        return max((math.inf if r is None else r for r in self.ratios), default=math.inf)


def band_ranked(names: Sequence[str], transfers: Sequence[int], seconds: Sequence[Sequence]) -> list[BandScore]:
    """The candidates (``names`` in the order made, their ``transfers``, ``seconds[i][j]``: the
    i-th's simulated seconds at the band's j-th size, None where not timed) ranked by
    :data:`BAND_RULE`, best first. The fastest at a size is taken over the candidates timed there;
    one not timed at some size ranks after every one timed at all (its worst ratio is infinite)."""
    nsizes = len(seconds[0]) if len(seconds) else 0
    if any(len(row) != nsizes for row in seconds):
        raise ValueError("every candidate needs one time (or None) per size of the band")
    best = [min((row[j] for row in seconds if row[j] is not None), default=None) for j in range(nsizes)]
    scores = [BandScore(str(n), int(k), tuple(row),
                        tuple(None if t is None or b is None else (t / b if b > 0 else 1.0) for t, b in zip(row, best)),
                        i)
              for i, (n, k, row) in enumerate(zip(names, transfers, seconds))]
    order = sorted(range(len(scores)), key=lambda i: (scores[i].worst, scores[i].transfers, i))
    return [scores[i] for i in order]


__all__ = ["BAND_RULE", "BandScore", "SCORE_BAND", "SelectionLoop", "band_ranked"]
