"""Per-call work the torch backend and the Communicator do once per call shape instead of on
every call (the backend's per-call overhead, ``benchmarks/torch_backend.py``): a work's future
made only when asked for, a communicator's call plan kept per shape."""
from __future__ import annotations

import pytest

from conftest import needs_torch

needs_torch()


def test_a_works_future_is_made_on_request_and_settled_exactly_once():
    """The work of a call run in the caller's thread has no event and no future until asked;
    asked before or after the call finishes (or fails), the future holds its result once."""
    import threading
    from hccc.torch.work import HcccWork
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


def test_a_call_shape_is_checked_and_routed_once_and_capture_is_refused_every_call(tmp_path, monkeypatch):
    """An in-place call (all_reduce, broadcast, reduce) of one tensor works out its checks, route
    and description on the first call of its shape (collective, op, root, dtype, device, count,
    contiguity) and looks them up after; any other shape is worked out anew, and the refusal under
    CUDA graph capture still holds on every call of a known shape."""
    import datetime
    import torch
    import torch.distributed as dist
    import hccc.torch
    from hccc.torch import process_group as pgmod
    catalog = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples" / "torch" / "catalog4"
    dist.init_process_group("hccc", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            pg_options=hccc.torch.Options(catalog=catalog),
                            timeout=datetime.timedelta(seconds=30))
    try:
        routed = []
        real = pgmod.HcccProcessGroup._route

        def counting(self, coll, dev, tensors, nbytes, op, *a, **k):
            routed.append((coll, tensors[0].dtype, nbytes, op, tensors[0].is_contiguous()))
            return real(self, coll, dev, tensors, nbytes, op, *a, **k)
        monkeypatch.setattr(pgmod.HcccProcessGroup, "_route", counting)
        t = torch.arange(8.0)
        for _ in range(3):
            dist.all_reduce(t)
        assert routed == [("allreduce", torch.float32, 32, "sum", True)]
        base = torch.arange(16.0)
        for x, op in ((torch.arange(8, dtype=torch.float64), dist.ReduceOp.SUM),   # another dtype
                      (base[::2], dist.ReduceOp.SUM),                              # not contiguous
                      (t, dist.ReduceOp.MAX),                                      # another op
                      (torch.arange(9.0), dist.ReduceOp.SUM)):                     # another count
            dist.all_reduce(x, op=op)
            dist.all_reduce(x, op=op)
        assert len(routed) == 5 and routed[2] == ("allreduce", torch.float32, 32, "sum", False)
        dist.broadcast(t, src=0)                                                   # another call
        assert len(routed) == 6
        # one rank: every result is its own input (the strided one written back through its view)
        assert torch.equal(t, torch.arange(8.0)) and torch.equal(base, torch.arange(16.0))
        assert hccc.torch.stats()["fallback"] == {"allreduce": 11, "broadcast": 1}
        monkeypatch.setattr(pgmod, "capture_active", lambda: True)
        with pytest.raises(hccc.torch.CaptureError, match="CUDA graph is being captured"):
            dist.all_reduce(t)
        assert hccc.torch.stats()["fallback"] == {"allreduce": 11, "broadcast": 1}
    finally:
        dist.destroy_process_group()
