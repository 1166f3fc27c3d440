"""The ranks of one job as threads of this process: one
:class:`~hccc.runtime.communicator.Communicator` per rank (its
:class:`~hccc.runtime.process_rank.ProcessRank`: kernel, memory, launch, wait, failure handling,
exactly the path a job of one rank per process takes), brought together through the in-process
bootstrap (:func:`~hccc.runtime.bootstrap.local_bootstraps`) instead of a torch.distributed store.

:class:`LocalJob` makes the communicators together (a rank whose set-up fails ends every peer's at
once, with its reason) and runs a step on every rank together (:meth:`LocalJob.each`, one thread
per rank); :meth:`LocalJob.collective` is one call of the program's collective on every rank's
array, the outputs returned in rank order for the caller's oracle. Everything a rank allocates is
POSIX shared memory or the platform's, mapped by its peers as in separate processes.
"""
from __future__ import annotations

import threading

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.runtime.bootstrap import local_bootstraps
from hccc.runtime.communicator import Communicator, CommunicatorError, METHODS
from hccc.runtime.launcher import program_layout


class LocalJob:
    """The ``ir.nranks`` ranks of ``ir`` (a ProgramIR) as communicators in threads of this
    process; ``timeout_s`` bounds the set-up and every call as for a Communicator, and every other
    keyword (``backend``, ``dtype``, ``op``, ``proto``, ``kernel_timeout_s``, ``codegen``,
    ``fifo_bytes``, ...) is given to each rank's :class:`Communicator`. Raises
    :class:`CommunicatorError` naming each rank's failure when a set-up fails; nothing stays
    allocated then."""

    def __init__(self, ir, *, timeout_s: float = 60.0, **communicator_options):
        self.ir, self.nranks = ir, int(ir.nranks)
        boots = local_bootstraps(self.nranks, timeout_s=timeout_s)
        #: the ranks' communicators, in rank order
        self.comms: list[Communicator] = []
        made = _together(self.nranks, lambda r: Communicator(ir, bootstrap=boots[r], timeout_s=timeout_s,
                                                             **communicator_options))
        self.comms = [c for c, _ in made if c is not None]
        errors = [e for _, e in made]
        if any(e is not None for e in errors):
            self.close()
            raise _job_error(errors, "setting up")

    def each(self, step) -> list:
        """``step(rank, communicator)`` on every rank at once, one thread each; the results in rank
        order, or :class:`CommunicatorError` naming every rank that raised (a failed call leaves
        every communicator unusable, as in separate processes)."""
        got = _together(self.nranks, lambda r: step(r, self.comms[r]))
        errors = [e for _, e in got]
        if any(e is not None for e in errors):
            raise _job_error(errors, "in a call")
        return [x for x, _ in got]

    def collective(self, inputs: list, count: int, op: str = "sum") -> list[np.ndarray]:
        """One call of the program's collective at ``count`` elements of full buffer (nccl-tests'
        S), ``inputs[r]`` rank ``r``'s array (copied; out of place, into an output of the
        program's layout at that count): every rank's output, in rank order."""
        if len(inputs) != self.nranks:
            raise ValueError(f"expected {self.nranks} input arrays, got {len(inputs)}")
        spec, method = SPECS[self.ir.collective], METHODS[self.ir.collective]
        lens = [row[1] for row in program_layout(self.ir, int(count))]
        kwargs = {"op": op} if spec.reduces else {}

        def step(r, comm):
            x = np.array(inputs[r], copy=True)
            out = np.full(lens[r], np.nan if x.dtype.kind == "f" else -1, dtype=x.dtype)
            return np.array(getattr(comm, method)(x, out=out, **kwargs), copy=True)
        return self.each(step)

    def close(self) -> None:
        """Close every rank's communicator (together: a peer that closes first is not a failure)."""
        comms, self.comms = self.comms, []
        _together(len(comms), lambda r: comms[r].close())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _together(n: int, fn) -> list[tuple[object, BaseException | None]]:
    """``fn(r)`` for every ``r`` below ``n``, each in its own thread, all at once: (result, None)
    or (None, the exception) per rank. Every call is bounded by the communicators' own timeouts,
    so the threads are joined without one."""
    got: list = [(None, None)] * n

    def run(r):
        try:
            got[r] = (fn(r), None)
        except BaseException as exc:   # reported per rank, never lost in a thread
            got[r] = (None, exc)
    threads = [threading.Thread(target=run, args=(r,), name=f"hccc-rank-{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def _job_error(errors: list, doing: str) -> CommunicatorError:
    """One error naming every rank's failure (each message names its rank)."""
    lines = [str(e) if isinstance(e, CommunicatorError) else f"rank {r}: {type(e).__name__}: {e}"
             for r, e in enumerate(errors) if e is not None]
    return CommunicatorError(f"the job failed {doing}: " + "; ".join(lines))


__all__ = ["LocalJob"]
