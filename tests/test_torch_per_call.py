"""Per-call work the torch backend and the Communicator do once per call shape instead of on
every call (the backend's per-call overhead, ``benchmarks/torch_backend.py``): a work's future
made only when asked for, a communicator's call plan kept per shape."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_a_works_future_is_made_on_request_and_settled_exactly_once():
    """The work of a call run in the caller's thread has no event and no future until asked;
    asked before or after the call finishes (or fails), the future holds its result once."""
    import threading
    from hccc.torch.process_group import HcccWork
    done = HcccWork("r", queued=False)
    assert done._done is None and done._future is None
    done._finish()
    assert done.wait() and done.is_completed() and done.is_success()
    fut = done.get_future()
    assert fut.wait() == "r" and done.get_future() is fut
    early = HcccWork("x")                         # queued: a future asked for before the worker ran it
    fut = early.get_future()
    assert not fut.done() and not early.is_completed()
    threading.Timer(0.05, early._finish, args=(ValueError("boom"),)).start()
    with pytest.raises(ValueError, match="boom"):
        early.wait(5)
    with pytest.raises(Exception, match="boom"):
        fut.wait()
    late = HcccWork("y")
    with pytest.raises(RuntimeError, match="did not complete"):
        late.wait(0.01)
    # racing: the future asked for while the worker finishes, many times: never settled twice
    for _ in range(200):
        w = HcccWork(1)
        t = threading.Thread(target=w._finish)
        t.start()
        f = w.get_future()
        t.join()
        assert f.wait() == 1


def test_a_communicator_plans_each_call_shape_once(monkeypatch):
    """The call's protocol, slice and layout are planned on the first call of a shape and read
    after (the same values LaunchCall.plan gives); asking another protocol plans again."""
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime import communicator as C
    from hccc.runtime.launcher import program_layout
    from hccc.runtime.rank_memory import LaunchCall
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=4096)
    comm = C.Communicator.__new__(C.Communicator)
    comm.ir, comm.rank, comm.chunk_bytes, comm._proto, comm._net, comm._call_plans = ir, 1, 4096, "auto", None, {}
    made = []
    real = LaunchCall.plan.__func__

    def counting(cls, *a, **k):
        made.append(a[1])
        return real(cls, *a, **k)
    monkeypatch.setattr(LaunchCall, "plan", classmethod(counting))
    for count in (1000, 1 << 20, 1000, 1 << 20, 1000):
        call, row = comm._plan(count, 4)
        want = real(LaunchCall, ir, count, 4, 4096, proto="auto")
        assert (call.proto, call.slice_bytes, call.messages) == (want.proto, want.slice_bytes, want.messages)
        assert tuple(row) == tuple(program_layout(ir, count)[1])
    assert made == [1000, 1 << 20]
    comm._proto = "simple"
    assert comm._plan(1000, 4)[0].proto == "simple" and made == [1000, 1 << 20, 1000]
