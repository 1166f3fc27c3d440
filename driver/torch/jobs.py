"""The jobs a call of the ``"hccc"`` process group becomes on its worker (:mod:`hccc.torch.work`):
each call numbered and posted to the ledger (:mod:`hccc.torch.ledger`), then run on hccc's kernels
through the catalog entry's :class:`~hccc.runtime.Communicator` (made on the entry's first call) or
on the delegate backend, watched so that a peer's different call is named on every rank
(:class:`~hccc.torch.ledger.CallMismatch`, after which the group is unusable: :attr:`CallJobs.broken`).
A call that fails on a rank after it was posted is recorded in the ledger with its error, so that
the peers waiting for that rank's part fail at once, naming it, instead of at the timeout.

A delegate's work is watched until it ends (:func:`watch_work`), whatever its work object reports:
gloo's reduce_scatter and point-to-point works never report completion (``is_completed`` stays
False, they have no future) and their ``wait`` ignores its timeout, so such a work is waited for by
a thread of its own while the call's thread keeps comparing the peers' calls; every delegated call
completes or fails within the group's timeout (:data:`DELEGATE_GRACE_S` past it at the latest,
should the delegate's own timeout not fire).

A delegate's work a rank gives up on (a peer made another call or failed, or the group's timeout
passed) is still pending in the delegate, which cannot cancel it: it ends at the delegate's
timeout. Until then the work and its backend are held by a thread of their own (:func:`outlive`,
or the thread already waiting for it), because a gloo process group's destructor waits for its
pending work: had the group's last reference gone with the garbage collector, in whatever thread
it ran (a later call's, a later group's), that thread would stall until the timeout.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import torch

from hccc.torch.ledger import CallMismatch, digest
from hccc.torch.routes import ROUTE_CACHE_MAX, kernel_dtype

#: seconds between looks at a delegate's work (and the peers' calls) once its first millisecond
#: has passed: well below a gloo call's own time at any size worth measuring
DELEGATE_POLL_S = 0.0005
#: seconds between looks at an abandoned delegate's work (:func:`outlive`): it only has to end
#: before the delegate's timeout is long past
ABANDONED_POLL_S = 0.1
#: how long a delegate's work is polled without sleeping (most calls complete within it)
_DELEGATE_SPIN_S = 1e-3
#: seconds a delegated call may run past the group's timeout before this rank gives up on it: the
#: delegate gets the group's timeout and normally fails first, with its own message; this margin
#: only has to cover its clock and its error's way back (gloo's come within 10 ms of its timeout)
DELEGATE_GRACE_S = 2.0


def error_text(exc: BaseException) -> str:
    """How a rank's failed or refused call is told to its peers: the error's type and message
    (without hccc's own prefix)."""
    return f"{type(exc).__name__}: {str(exc).removeprefix('hccc: ') or type(exc).__name__}"


class WorkWatch:
    """Whether a delegate's ``work`` has ended, asked without blocking (:meth:`done`), however the
    work reports it: ``is_completed``, else its future, else (a work with neither, such as gloo's
    reduce_scatter and send/recv) a thread of its own blocked in the work's ``wait``, which the
    delegate's timeout bounds; that thread holds ``backend`` with the work until it ends (see the
    module docstring). :meth:`result` re-raises the work's error."""

    def __init__(self, work, backend=None):
        self.work = work
        self._future = None
        self._ended: threading.Event | None = None
        self._error: BaseException | None = None
        try:
            self._future = work.get_future()
        except Exception:               # (a work without a future: "not implemented")
            self._future = None
        if self._future is None:
            self._ended = threading.Event()
            threading.Thread(target=self._wait, args=(work, backend), name="hccc-delegate-wait",
                             daemon=True).start()

    def _wait(self, work, backend) -> None:
        # blocked in the delegate until the work ends (its timeout at the latest); polling is not
        # possible for a work that never reports its end. (A daemon thread whose wait returns
        # while the interpreter is exiting aborts the process: only an abandoned work still pending
        # as the process exits can be caught so, within its last milliseconds.)
        try:
            work.wait()
        except BaseException as exc:
            self._error = exc
        self._ended.set()

    def done(self) -> bool:
        if self._ended is not None:
            return self._ended.is_set()
        return self.work.is_completed() or self._future.done()

    def result(self) -> None:
        """The work's outcome once :meth:`done`: returns, or raises the delegate's error."""
        if self._ended is not None:
            if self._error is not None:
                raise self._error
            return
        self.work.wait()

    def outlive(self, backend) -> None:
        """This work is given up on: hold it and ``backend`` until it ends (:func:`outlive`; the
        waiting thread already does for a work without a way to poll it)."""
        if self._ended is None:
            outlive(self, backend)


def watch_work(work, backend=None) -> WorkWatch:
    """A delegate's work and how to tell whether it has ended (:class:`WorkWatch`)."""
    return WorkWatch(work, backend)


def outlive(watch: WorkWatch, backend) -> None:
    """Hold a delegate's abandoned work (``watch``, polled) and its ``backend`` on a thread of their
    own until the work ends (at the delegate's timeout at the latest), then drop them there (see
    the module docstring)."""
    def hold(watch, backend):
        # polled, not waited for: a daemon thread blocked in the delegate's wait when the
        # interpreter exits aborts the process (std::terminate)
        while not watch.done():
            time.sleep(ABANDONED_POLL_S)
    threading.Thread(target=hold, args=(watch, backend), name="hccc-abandoned-work",
                     daemon=True).start()


class CallJobs:
    """The jobs of group rank ``rank`` of ``size`` (``store``: the group's store, where the
    Communicators meet; ``ledger``: the ranks' calls; ``timeout_s`` / ``kernel_timeout_s`` as the
    group's), counting FIFO protocols into ``protos`` and the worker's seconds into ``seconds``
    (route kind -> collective -> seconds)."""

    def __init__(self, rank: int, size: int, store, ledger, timeout_s: float, kernel_timeout_s: float,
                 protos: Counter, seconds: dict):
        self.rank, self.size, self.store, self.ledger = rank, size, store, ledger
        self.timeout_s, self.kernel_timeout_s = timeout_s, kernel_timeout_s
        self.protos, self.seconds = protos, seconds
        #: (entry name, device type) -> its Communicator
        self.comms: dict[tuple[str, str], object] = {}
        self.calls = 0
        self.digests: dict[str, int] = {}
        #: why the group is unusable (a peer's different call), or None
        self.broken: str | None = None

    def communicator(self, entry, dev: torch.device, dtype: str, op: str, watch=None):
        """The entry's Communicator, made on its first call (``watch``: polled while its set-up
        waits for the peers, who may be making another call)."""
        key = (entry.name, dev.type)
        comm = self.comms.get(key)
        if comm is None:
            from hccc.runtime.bootstrap import StoreBootstrap
            from hccc.runtime.communicator import Communicator
            boot = StoreBootstrap(self.store, self.rank, self.size, name=f"entry/{entry.name}",
                                  timeout_s=self.timeout_s, watch=watch)
            backend = "cpu" if dev.type == "cpu" else ("hip" if torch.version.hip else "cuda")
            comm = Communicator(entry.path if entry.outdir else entry.ir, bootstrap=boot,
                                backend=backend, device=dev.index, timeout_s=self.timeout_s,
                                kernel_timeout_s=self.kernel_timeout_s, dtype=dtype, op=op)
            boot.watch = None                # set up: the first call's watch has done its part
            self.comms[key] = comm
        return comm

    def next_call(self, text: str) -> tuple[int, int]:
        """Number and post this rank's next call (the worker's thread: calls in their order)."""
        self.calls += 1
        tag = self.digests.get(text)
        if tag is None:
            if len(self.digests) >= ROUTE_CACHE_MAX:
                self.digests.clear()
            tag = self.digests[text] = digest(text)
        self.ledger.post(self.calls, text, tag)
        return self.calls, tag

    def mismatch(self, why: str, seq: int) -> CallMismatch:
        """The error of call ``seq``, given up on because of a peer (``why``): the group is
        unusable here from now on, which the ledger tells the peers (their later calls would
        wait for this rank's in vain)."""
        self._break(seq, why)
        return CallMismatch(f"hccc: rank {self.rank}: {why}")

    def gave_up(self, seq: int, text: str, waited: float) -> TimeoutError:
        """The error of delegated call ``seq`` (``text``) that has not ended ``waited`` seconds
        after it began, past the group's timeout: the group is unusable here from now on (the
        delegate's later calls would pair with this one's messages), which the ledger tells the
        peers."""
        why = (f"the delegated call {text} did not complete within the group's timeout "
               f"({self.timeout_s:g} s; {waited:.1f} s waited)")
        self._break(seq, why)
        return TimeoutError(f"hccc: rank {self.rank}: {why}")

    def _break(self, seq: int, why: str) -> None:
        """The group unusable here from call ``seq`` on, for ``why``; the ledger tells the peers."""
        self.broken = why
        try:
            self.ledger.fail(seq, why, onward=True)
        except Exception:
            pass                        # (a ledger already closed: the group is shut down)

    def failed(self, seq: int, exc: BaseException) -> None:
        """Record in the ledger that this rank's posted call ``seq`` failed with ``exc``, for the
        peers waiting for it; not an error that names a peer's call (each rank sees that peer's
        call itself)."""
        if isinstance(exc, CallMismatch):
            return
        try:
            self.ledger.fail(seq, error_text(exc))
        except Exception:
            pass                        # (a ledger already closed: the group is shut down)

    def wait_delegate(self, work, seq: int, text: str, tag: int, backend=None) -> None:
        """Wait for a delegate's work (:class:`WorkWatch`), comparing the peers' calls meanwhile,
        for the group's timeout at most (:data:`DELEGATE_GRACE_S` past it); a work given up on is
        held until it ends (:func:`outlive`)."""
        start = time.monotonic()
        watch = None
        while True:
            if watch is None:
                if work.is_completed():
                    break
                if time.monotonic() - start >= _DELEGATE_SPIN_S:
                    watch = watch_work(work, backend)
            elif watch.done():
                break
            why = self.ledger.conflict(seq, text, tag)
            if why:
                (watch or watch_work(work, backend)).outlive(backend)
                raise self.mismatch(why, seq)
            waited = time.monotonic() - start
            if waited > self.timeout_s + DELEGATE_GRACE_S:
                watch.outlive(backend)
                raise self.gave_up(seq, text, waited)
            # yield for the first millisecond (most calls complete within it), then sleep
            time.sleep(0 if watch is None else DELEGATE_POLL_S)
        try:
            if watch is None:
                work.wait()
            else:
                watch.result()
        except Exception:
            # (a peer that failed or made another call may have broken the delegate's
            # connections before this rank looked: its reason says more than the delegate's)
            why = self.ledger.conflict(seq, text, tag)
            if why:
                raise self.mismatch(why, seq) from None
            raise

    def wait_bounded(self, work, backend, what: str = "a point-to-point call") -> None:
        """Wait for a delegate's work without comparing the peers' calls (``what``: a
        point-to-point call, whose peers' calls differ, or a part of a call, such as an AVG's SUM,
        compared as a whole), for the group's timeout at most, as :meth:`wait_delegate` does."""
        start = time.monotonic()
        watch = watch_work(work, backend)
        while not watch.done():
            waited = time.monotonic() - start
            if waited > self.timeout_s + DELEGATE_GRACE_S:
                watch.outlive(backend)
                raise TimeoutError(f"hccc: rank {self.rank}: {what} did not "
                                   f"complete within the group's timeout ({self.timeout_s:g} s; "
                                   f"{waited:.1f} s waited)")
            time.sleep(DELEGATE_POLL_S)
        watch.result()

    def hccc_job(self, coll: str, dev: torch.device, route: tuple, run_hccc, ready, text: str,
                 result_dtype: torch.dtype):
        """The job of a call on hccc's kernels: wait for the caller's stream, post the call, run it
        on the entry's Communicator (made on the first call), naming a peer's different call."""
        entry, kop, acc = route[1], route[2], route[3]
        dtype = kernel_dtype(acc if acc is not None else result_dtype)
        made = (entry.name, dev.type)       # the communicator's key (:meth:`communicator`)
        protos, seconds = self.protos, self.seconds["hccc"]

        def fn():
            t0 = time.perf_counter()
            if ready is not None:
                ready.synchronize()
            seq, tag = self.next_call(text)
            try:
                comm = run_posted(seq, tag)
            except Exception as exc:
                self.failed(seq, exc)
                raise
            protos[comm.last_proto] += 1     # auto: LL for small calls
            seconds[coll] += time.perf_counter() - t0

        def run_posted(seq: int, tag: int):
            """Run the posted call ``seq`` on the entry's Communicator; returns it."""
            def watch():
                return self.ledger.conflict(seq, text, tag)
            try:
                comm = self.comms.get(made)
                if comm is None:
                    comm = self.communicator(entry, dev, dtype, kop, watch)
            except Exception as exc:
                why = watch()
                if why:
                    raise self.mismatch(why, seq) from None
                raise exc
            comm.call_tag = tag
            comm.watch = watch
            try:
                run_hccc(comm, kop)
            except Exception as exc:
                why = self.ledger.conflict(seq, text, tag)
                if why:
                    raise self.mismatch(why, seq) from None
                raise exc
            finally:
                comm.watch = None
            # no comparison after the call: every rank's call met this one's on the same
            # communicator, which compared their digests (call_tag) before its kernel ran
            return comm
        return fn

    def delegate_job(self, coll: str, kind: str, backend, run_delegate, ready, text: str | None):
        """The job of a call on the delegate ``backend``: posted and compared with the peers' calls
        while it runs, unless it is point-to-point (``text`` None)."""
        def fn():
            t0 = time.perf_counter()
            if ready is not None:
                ready.synchronize()
            if text is None:
                work = run_delegate(backend)
                if work is not None:
                    self.wait_bounded(work, backend)
            else:
                seq, tag = self.next_call(text)
                try:
                    work = run_delegate(backend)
                    if work is not None:
                        self.wait_delegate(work, seq, text, tag, backend)
                    self.ledger_settle(seq, text, tag)
                except Exception as exc:
                    self.failed(seq, exc)
                    raise
            self.seconds[kind][coll] += time.perf_counter() - t0
        return fn

    def refused_job(self, text: str):
        """The job of a call this rank refused before queueing it (``text``: the call as refused):
        it takes the call's number and posts it, so a peer waiting in that call sees the refusal
        (:meth:`HcccProcessGroup._refused <hccc.torch.process_group.HcccProcessGroup._refused>`)."""
        def fn():
            self.next_call(text)
        return fn

    def ledger_settle(self, seq: int, text: str, tag: int) -> None:
        """Compare the completed call ``seq`` with the peers' (:meth:`Ledger.settle`). A difference
        makes the group unusable here, as one found while the call waits does: the delegate met a
        peer's other call, so its later calls would pair with the wrong ones, and a peer whose later
        call met this one must learn it from the record (it waits for this rank's post of it, which
        never comes, and would otherwise complete unchecked at the timeout)."""
        try:
            self.ledger.settle(seq, text, tag, self.timeout_s)
        except CallMismatch as exc:
            raise self.mismatch(str(exc), seq) from None

    def close(self) -> None:
        """Close the communicators (the worker has stopped) and the ledger."""
        for comm in self.comms.values():
            try:
                comm.close()
            except Exception:
                pass
        self.comms.clear()
        if self.ledger is not None:
            self.ledger.close()


__all__ = ["CallJobs", "DELEGATE_GRACE_S", "DELEGATE_POLL_S", "WorkWatch", "watch_work"]
