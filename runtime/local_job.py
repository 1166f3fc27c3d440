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

A call may also be launched together, as the single-process runner launches (:class:`GroupLaunch`):
each rank's thread takes its call through the job's steps up to the launch
(:meth:`~hccc.runtime.process_rank.ProcessRank._begin`: compared with the peers, counters reset,
arguments), one thread then launches every rank's kernel between one timer per rank's platform
(with direct mode's peers array, :mod:`hccc.runtime.direct_peers`, where asked), and each rank waits
for its kernel watching its peers (:meth:`~hccc.runtime.process_rank.ProcessRank._wait`).
"""
from __future__ import annotations

import threading

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.runtime.bootstrap import local_bootstraps
from hccc.runtime.communicator import Communicator, CommunicatorError, METHODS
from hccc.runtime.direct_peers import peers_blob, peers_usable
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
        #: the time of the last call launched together (:meth:`collective`), in microseconds
        self.last_time_us: float | None = None
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

    def collective(self, inputs: list, count: int, op: str = "sum", *, together: bool = False,
                   direct: bool = False) -> list[np.ndarray]:
        """One call of the program's collective at ``count`` elements of full buffer (nccl-tests'
        S), ``inputs[r]`` rank ``r``'s array (copied; out of place, into an output of the
        program's layout at that count): every rank's output, in rank order. ``together``: the
        ranks' kernels launched by one thread (:class:`GroupLaunch`; the call's time in
        :attr:`last_time_us`), with ``direct`` direct mode's peers array for a Simple call."""
        if len(inputs) != self.nranks:
            raise ValueError(f"expected {self.nranks} input arrays, got {len(inputs)}")
        if direct and not together:
            raise ValueError("direct mode's peers array needs the ranks launched together")
        spec, method = SPECS[self.ir.collective], METHODS[self.ir.collective]
        lens = [row[1] for row in program_layout(self.ir, int(count))]
        kwargs = {"op": op} if spec.reduces else {}
        group = GroupLaunch(self.comms, direct) if together else None

        def step(r, comm):
            x = np.array(inputs[r], copy=True)
            out = np.full(lens[r], np.nan if x.dtype.kind == "f" else -1, dtype=x.dtype)
            if group is None:
                return np.array(getattr(comm, method)(x, out=out, **kwargs), copy=True)
            try:
                group.call(r, method, x, out, op)
            except BaseException:
                group.gate.abort()          # the peers stop waiting for this rank's launch
                raise
            return np.array(out, copy=True)
        try:
            got = self.each(step)
            if group is not None:
                #: the last call launched together: microseconds from its launch to its last kernel's end
                self.last_time_us = group.time_us()
            return got
        finally:
            if group is not None:
                group.free()

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


class GroupLaunch:
    """One call of every rank of ``comms`` (the job's communicators, in rank order) launched by one
    thread (see the module docstring); ``direct``: with direct mode's peers array for a Simple call
    where the ranks share an address space. Each rank's thread runs :meth:`call`."""

    def __init__(self, comms: list, direct: bool = False):
        self.comms, self.direct = comms, direct
        self._pending: list = [None] * len(comms)
        self._timers: list = []
        #: (communicator, pointer) of every rank's peers array, freed after the call
        self._staged: list = []
        self.gate = threading.Barrier(len(comms), action=self._launch_all)

    def call(self, rank: int, method: str, x, out, op: str) -> None:
        """Rank ``rank``'s part: its call checked and routed (``x`` into ``out``, out of place),
        taken up to the launch, the launch left to the last rank to arrive, then its wait."""
        comm = self.comms[rank]
        count, dtype, in_p, out_p, copy_back = comm._prepare(method, x, out, False, op)
        if copy_back is not None:
            raise CommunicatorError(f"rank {rank}: {method}: launched together, a call runs on the "
                                    "caller's arrays only (no temporaries)")
        self._pending[rank] = comm._begin(method, count, dtype, op, in_p, out_p)
        try:
            self.gate.wait()
        except BaseException:
            # the launch failed or a peer gave up before it: kernels already launched stop
            comm.flags.raise_abort()
            comm._owned.abort_peers()
            try:
                comm._wait(method)
            except CommunicatorError:
                pass
            raise
        comm._wait(method)

    def _launch_all(self) -> None:
        """Every rank's kernel between the start and the stop of one timer per rank's platform."""
        comms, pending = self.comms, self._pending
        call = pending[0][2]
        if (self.direct and call.proto != "ll"
                and peers_usable([c._pf for c in comms], [c.device for c in comms])):
            blob = peers_blob([p[1] for p in pending])
            for c, p in zip(comms, pending):
                ptr = c._owned.local(max(blob.nbytes, 16))
                self._staged.append((c, ptr))
                c._pf.memcpy_htod(ptr, blob)
                p[1].peers = ptr
        self._timers = [c._pf.timer() for c in comms]
        for t in self._timers:
            t.start()
        try:
            for c, (fn, args, call, what) in zip(comms, pending):
                c._launch(fn, args, call, what)
        finally:
            for t in self._timers:
                t.stop()

    def time_us(self) -> float:
        """From the launch to the end of the last rank's kernel, in microseconds."""
        return max((t.elapsed_us() for t in self._timers), default=float("nan"))

    def free(self) -> None:
        """Give back the peers arrays (after every rank's wait)."""
        for c, ptr in self._staged:
            c._owned.free(ptr)
        self._staged = []


def _job_error(errors: list, doing: str) -> CommunicatorError:
    """One error naming every rank's failure (each message names its rank)."""
    lines = [str(e) if isinstance(e, CommunicatorError) else f"rank {r}: {type(e).__name__}: {e}"
             for r, e in enumerate(errors) if e is not None]
    return CommunicatorError(f"the job failed {doing}: " + "; ".join(lines))


__all__ = ["LocalJob", "GroupLaunch"]
