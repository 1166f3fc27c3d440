"""A call's work and the queue that runs the calls: :class:`HcccWork` is what torch gets back, and
:class:`CallQueue` runs a group's calls one at a time in the order they were made (the same order
on every rank), at once in the caller's thread when nothing is pending, else on the group's worker
thread."""
from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch
from torch.futures import Future

_C = torch._C._distributed_c10d


class HcccWork(_C.Work):
    """The result of one call: completes when the call has run (in the caller's thread, before the
    work is returned, or on the group's worker). ``queued``: the call waits for the worker, so
    :meth:`wait` may block (an event to block on); a call run in the caller's thread is finished
    when its work is returned and needs none. The future is made when it is asked for (most calls
    never are: DDP's hooks ask, a plain ``dist.all_reduce`` does not)."""

    #: guards a work's lazily made future against the worker finishing the call meanwhile
    _future_lock = threading.Lock()

    def __init__(self, result, queued: bool = True):
        super().__init__()
        self._finished = False
        self._done = threading.Event() if queued else None
        self._exc: BaseException | None = None
        self._result = result
        self._future: Future | None = None

    def _settle(self, fut: Future) -> None:
        if self._exc is None:
            fut.set_result(self._result)
        else:
            fut.set_exception(self._exc)

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        with HcccWork._future_lock:
            self._finished = True
            fut = self._future
        if self._done is not None:
            self._done.set()
        if fut is not None:
            self._settle(fut)

    def wait(self, timeout=None) -> bool:
        if not self._finished:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if secs is not None and secs <= 0:
                secs = None
            if self._done is None or not self._done.wait(secs):
                raise RuntimeError(f"hccc: the collective did not complete within {secs:g} s")
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self) -> Future:
        with HcccWork._future_lock:
            fut = self._future
            if fut is not None:
                return fut
            fut = self._future = Future()
            finished = self._finished
        if finished:
            self._settle(fut)
        return fut

    def result(self):
        return self._result



class CallQueue:
    """The calls of one group, run one at a time in the order they were made: at once in the
    caller's thread when no earlier call is queued or running (the common case: two thread
    hand-offs less per call, which on a loaded host cost more than the call's own work), else
    after them on the worker thread. ``name``: the worker thread's."""

    def __init__(self, name: str):
        self._queue: queue.Queue = queue.Queue()
        #: held while a call runs (on the worker or inline in the caller's thread)
        self._exec = threading.Lock()
        #: guards _pending: calls made and not finished (queued or running)
        self._state = threading.Lock()
        self._pending = 0
        self.closed = False
        self.thread = threading.Thread(target=self._worker, name=name, daemon=True)
        self.thread.start()

    def queued(self) -> int:
        """Calls waiting for the worker."""
        return self._queue.qsize()

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._run_job(*job)

    def _run_job(self, fn, work: HcccWork) -> None:
        exc = None
        with self._exec:
            try:
                fn()
            except BaseException as e:
                exc = e
        with self._state:
            self._pending -= 1
        # last: a future's callbacks run here and may make further calls
        work._finish(exc)

    def submit(self, fn, result) -> HcccWork:
        """Run ``fn`` (a call) in its turn; its work holds ``result``."""
        with self._state:
            inline = self._pending == 0 and threading.get_ident() != self.thread.ident
            self._pending += 1
        work = HcccWork(result, queued=not inline)
        if inline:
            self._run_job(fn, work)
        else:
            self._queue.put((fn, work))
        return work

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the worker after the calls already queued (waiting up to ``timeout_s`` for it,
        unless called from the worker itself)."""
        if self.closed:
            return
        self.closed = True
        self._queue.put(None)
        if timeout_s is not None and threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)
