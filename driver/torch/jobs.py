"""The jobs a call of the ``"hccc"`` process group becomes on its worker (:mod:`hccc.torch.work`):
each call numbered and posted to the ledger (:mod:`hccc.torch.ledger`), then run on hccc's kernels
through the catalog entry's :class:`~hccc.runtime.Communicator` (made on the entry's first call) or
on the delegate backend, watched so that a peer's different call is named on every rank
(:class:`~hccc.torch.ledger.CallMismatch`, after which the group is unusable: :attr:`CallJobs.broken`).
A call that fails on a rank after it was posted is recorded in the ledger with its error, so that
the peers waiting for that rank's part fail at once, naming it, instead of at the timeout.

A delegate's work a rank gives up on (a peer made another call or failed) is still pending in the
delegate, which cannot cancel it: it ends at the delegate's timeout. Until then the work and its
backend are held by a thread of their own (:func:`outlive`), because a gloo process group's
destructor waits for its pending work: had the group's last reference gone with the garbage
collector, in whatever thread it ran (a later call's, a later group's), that thread would stall
until the timeout.
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


def error_text(exc: BaseException) -> str:
    """How a rank's failed or refused call is told to its peers: the error's type and message
    (without hccc's own prefix)."""
    return f"{type(exc).__name__}: {str(exc).removeprefix('hccc: ') or type(exc).__name__}"


def outlive(work, backend) -> None:
    """Hold a delegate's abandoned ``work`` and its ``backend`` on a thread of their own until the
    work ends (at the delegate's timeout at the latest), then drop them there (see the module
    docstring)."""
    def hold(work, backend):
        # polled, not waited for: a daemon thread blocked in the delegate's wait when the
        # interpreter exits aborts the process (std::terminate)
        while not work.is_completed():
            time.sleep(ABANDONED_POLL_S)
    threading.Thread(target=hold, args=(work, backend), name="hccc-abandoned-work",
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
        self.broken = why
        try:
            self.ledger.fail(seq, why, onward=True)
        except Exception:
            pass                        # (a ledger already closed: the group is shut down)
        return CallMismatch(f"hccc: rank {self.rank}: {why}")

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
        """Wait for a delegate's work, comparing the peers' calls meanwhile; a work given up on
        is held until it ends (:func:`outlive`)."""
        start = time.monotonic()
        while not work.is_completed():
            why = self.ledger.conflict(seq, text, tag)
            if why:
                outlive(work, backend)
                raise self.mismatch(why, seq)
            # yield for the first millisecond (most calls complete within it), then sleep
            time.sleep(0 if time.monotonic() - start < _DELEGATE_SPIN_S else DELEGATE_POLL_S)
        try:
            work.wait()
        except Exception:
            # (a peer that failed or made another call may have broken the delegate's
            # connections before this rank looked: its reason says more than the delegate's)
            why = self.ledger.conflict(seq, text, tag)
            if why:
                raise self.mismatch(why, seq) from None
            raise

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
                    work.wait()
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


__all__ = ["CallJobs", "DELEGATE_POLL_S"]
