"""Every call of an ``"hccc"`` process group that the catalog cannot serve goes to the delegate
(gloo for CPU tensors) and completes -- or fails -- within the group's timeout, whatever the
delegate's work object reports (gloo's reduce_scatter and send/recv never report completion).

Two ranks in threads of this process (:func:`torch_ranks.ranks_in_threads`, which gives up on a
rank after three timeouts: a hang fails the test instead of blocking the suite). Each collective
(and the coalesced forms) at
dtypes and ops no catalog serves (int8, complex64, the bitwise ops), on the built-in catalog and on
an empty one; each result against its definition computed here with torch arithmetic from inputs
every rank recomputes. A delegate call that gloo refuses fails on both ranks, within the timeout;
:class:`hccc.torch.jobs.WorkWatch` against works that report their end in each way.
"""
from __future__ import annotations

import threading
import time

import pytest

from conftest import needs_torch

torch = needs_torch()
dist = needs_torch("torch.distributed")

from torch_ranks import ranks_in_threads  # noqa: E402

#: the groups' timeout, seconds: a call that hangs past it (and its grace) fails the test
GROUP_TIMEOUT_S = 8.0
WORLD = 2
N = 6


def _inp(r: int, dtype, k: int = N):
    """Rank ``r``'s input of ``k`` elements (small values: no dtype overflows in a sum of two)."""
    base = torch.arange(k) % 5 + 3 * r + 1
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float() / 2).to(dtype)
    return base.to(dtype)


def _opts(cls, op=None, root=None):
    o = getattr(dist, cls, None) or getattr(torch._C._distributed_c10d, cls)
    o = o()
    if op is not None:
        o.reduceOp = op
    if root is not None:
        o.rootRank = root
    return o


def _reduce(op, xs):
    """The reduction ``op`` of the tensors ``xs`` (the oracle)."""
    out = xs[0].clone()
    for x in xs[1:]:
        if op == dist.ReduceOp.SUM:
            out = out + x
        elif op == dist.ReduceOp.BAND:
            out = out & x
        elif op == dist.ReduceOp.BOR:
            out = out | x
        elif op == dist.ReduceOp.BXOR:
            out = out ^ x
        elif op == dist.ReduceOp.MAX:
            out = torch.maximum(out, x)
        else:
            raise AssertionError(op)
    return out


def _calls(dtype, op):
    """(name, job(pg, rank) -> got, want(rank)) for every collective the group offers."""
    ins = [_inp(r, dtype) for r in range(WORLD)]
    full = [_inp(r, dtype, WORLD * N) for r in range(WORLD)]

    def allreduce(pg, r):
        t = ins[r].clone()
        pg.allreduce([t], _opts("AllreduceOptions", op)).wait()
        return t

    def all_gather(pg, r):
        outs = [torch.zeros(N, dtype=dtype) for _ in range(WORLD)]
        pg.allgather([outs], [ins[r]], _opts("AllgatherOptions")).wait()
        return torch.cat(outs)

    def all_gather_into_tensor(pg, r):
        out = torch.zeros(WORLD * N, dtype=dtype)
        pg._allgather_base(out, ins[r], _opts("AllgatherOptions")).wait()
        return out

    def reduce_scatter(pg, r):
        out = torch.zeros(N, dtype=dtype)
        pg.reduce_scatter([out], [list(full[r].chunk(WORLD))], _opts("ReduceScatterOptions", op)).wait()
        return out

    def reduce_scatter_tensor(pg, r):
        out = torch.zeros(N, dtype=dtype)
        pg._reduce_scatter_base(out, full[r], _opts("ReduceScatterOptions", op)).wait()
        return out

    def broadcast(pg, r):
        t = ins[r].clone()
        pg.broadcast([t], _opts("BroadcastOptions", root=1)).wait()
        return t

    def reduce(pg, r):
        t = ins[r].clone()
        pg.reduce([t], _opts("ReduceOptions", op, root=0)).wait()
        return t

    def gather(pg, r):
        outs = [[torch.zeros(N, dtype=dtype) for _ in range(WORLD)]] if r == 1 else []
        pg.gather(outs, [ins[r]], _opts("GatherOptions", root=1)).wait()
        return torch.cat(outs[0]) if r == 1 else None

    def scatter(pg, r):
        out = torch.zeros(N, dtype=dtype)
        lists = [[_inp(10 + k, dtype) for k in range(WORLD)]] if r == 0 else []
        pg.scatter([out], lists, _opts("ScatterOptions", root=0)).wait()
        return out

    def all_to_all_single(pg, r):
        out = torch.zeros(WORLD * N, dtype=dtype)
        pg.alltoall_base(out, full[r], [], [], _opts("AllToAllOptions")).wait()
        return out

    def all_to_all(pg, r):
        outs = [torch.zeros(N, dtype=dtype) for _ in range(WORLD)]
        pg.alltoall(outs, list(full[r].chunk(WORLD)), _opts("AllToAllOptions")).wait()
        return torch.cat(outs)

    def send_recv(pg, r):
        t = ins[r].clone()
        if r == 0:
            pg.send([t], 1, 7).wait()
            return None
        pg.recv([t], 0, 7).wait()
        return t

    def allreduce_coalesced(pg, r):
        ts = [ins[r].clone(), ins[r][:3].clone()]
        pg.allreduce_coalesced(ts, _opts("AllreduceCoalescedOptions", op)).wait()
        return torch.cat(ts)

    def all_gather_into_tensor_coalesced(pg, r):
        outs = [torch.zeros(WORLD * N, dtype=dtype), torch.zeros(WORLD * 2, dtype=dtype)]
        pg.allgather_into_tensor_coalesced(outs, [ins[r], ins[r][:2].clone()], _opts("AllgatherOptions")).wait()
        return torch.cat(outs)

    def reduce_scatter_tensor_coalesced(pg, r):
        outs = [torch.zeros(N, dtype=dtype), torch.zeros(N, dtype=dtype)]
        pg.reduce_scatter_tensor_coalesced(outs, [full[r], full[r].flip(0)],
                                           _opts("ReduceScatterOptions", op)).wait()
        return torch.cat(outs)

    def all_gather_coalesced(pg, r):
        outs = [[torch.zeros(N, dtype=dtype)] for _ in range(WORLD)]      # per rank, per tensor
        pg.allgather_coalesced(outs, [ins[r]], _opts("AllgatherOptions")).wait()
        return torch.cat([o[0] for o in outs])

    def barrier(pg, r):
        pg.barrier(_opts("BarrierOptions")).wait()
        return None

    red = _reduce(op, ins)
    red_full = _reduce(op, full)
    return [
        ("allreduce", allreduce, lambda r: red),
        ("all_gather", all_gather, lambda r: torch.cat(ins)),
        ("all_gather_into_tensor", all_gather_into_tensor, lambda r: torch.cat(ins)),
        ("reduce_scatter", reduce_scatter, lambda r: red_full.chunk(WORLD)[r]),
        ("reduce_scatter_tensor", reduce_scatter_tensor, lambda r: red_full.chunk(WORLD)[r]),
        ("broadcast", broadcast, lambda r: ins[1]),
        # (the buffer of a rank the result does not reach is left unspecified by torch: gloo
        # leaves partial sums in it)
        ("reduce", reduce, lambda r: red if r == 0 else ...),
        ("gather", gather, lambda r: torch.cat(ins) if r == 1 else None),
        ("scatter", scatter, lambda r: _inp(10 + r, dtype)),
        ("all_to_all_single", all_to_all_single, lambda r: torch.cat([f.chunk(WORLD)[r] for f in full])),
        ("all_to_all", all_to_all, lambda r: torch.cat([f.chunk(WORLD)[r] for f in full])),
        ("send_recv", send_recv, lambda r: ins[0] if r == 1 else None),
        ("allreduce_coalesced", allreduce_coalesced, lambda r: torch.cat([red, red[:3]])),
        ("all_gather_into_tensor_coalesced", all_gather_into_tensor_coalesced,
         lambda r: torch.cat([torch.cat(ins), torch.cat([x[:2] for x in ins])])),
        ("reduce_scatter_tensor_coalesced", reduce_scatter_tensor_coalesced,
         lambda r: torch.cat([red_full.chunk(WORLD)[r], _reduce(op, [f.flip(0) for f in full]).chunk(WORLD)[r]])),
        ("all_gather_coalesced", all_gather_coalesced, lambda r: torch.cat(ins)),
        ("barrier", barrier, lambda r: None),
    ]


#: (dtype, op): int8 and complex64 have no kernels; the bitwise ops no algorithm; a complex
#: tensor goes to gloo as it is (torch.distributed's functions view it as real first for the
#: calls gloo lacks complex for: those are left out below)
CASES = [(torch.int8, dist.ReduceOp.SUM), (torch.int32, dist.ReduceOp.BAND),
         (torch.int64, dist.ReduceOp.BXOR), (torch.uint8, dist.ReduceOp.BOR),
         (torch.complex64, dist.ReduceOp.SUM)]
#: the calls gloo serves complex tensors in
COMPLEX_CALLS = {"allreduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "reduce",
                 "send_recv", "barrier", "allreduce_coalesced", "reduce_scatter_tensor_coalesced"}


def _run_every_call(options, dtype, op):
    calls = [c for c in _calls(dtype, op) if not dtype.is_complex or c[0] in COMPLEX_CALLS]

    def job(r):
        def run(pg):
            got = []
            for name, fn, _ in calls:
                t0 = time.monotonic()
                try:
                    got.append((name, fn(pg, r), time.monotonic() - t0))
                except Exception as exc:
                    got.append((name, exc, time.monotonic() - t0))
            from hccc.torch.process_group import stats
            return got, stats(pg)
        return run
    out = ranks_in_threads([job(r) for r in range(WORLD)], options, timeout_s=GROUP_TIMEOUT_S)
    for r, res in enumerate(out):
        assert res is not None, f"rank {r} did not finish within {3 * GROUP_TIMEOUT_S} s"
        assert not isinstance(res[0], BaseException), f"rank {r}: {res[0]!r}"
        got, st = res[0]
        assert [g[0] for g in got] == [c[0] for c in calls]
        for (name, val, secs), (_, _, want) in zip(got, calls):
            assert not isinstance(val, BaseException), f"rank {r}: {name}: {val!r}"
            assert secs < GROUP_TIMEOUT_S, f"rank {r}: {name} took {secs:.1f} s"
            w = want(r)
            if w is not ...:
                assert (val is None) if w is None else torch.equal(val, w), (r, name, val, w)
        # a dtype without kernels: nothing on hccc's (but a barrier, which has no dtype: the
        # built-in catalog's one-element allreduce carries it); a bitwise op: no reduction
        carried = set(st["hccc"]) - {"barrier"}
        if dtype in (torch.int8, torch.complex64):
            assert not carried, f"rank {r}: hccc's kernels carried {st['hccc']}"
        assert not carried & {"allreduce", "reducescatter", "reduce"}, (r, st["hccc"])
    return out


@pytest.mark.parametrize("dtype,op", CASES, ids=lambda v: str(v).replace("torch.", "").replace("RedOpType.", ""))
def test_every_call_the_built_in_catalog_cannot_serve_completes_on_the_delegate(monkeypatch, dtype, op):
    monkeypatch.delenv("HCCC_ALGO_DIR", raising=False)
    monkeypatch.delenv("HCCC_TOPOLOGY", raising=False)
    monkeypatch.delenv("HCCC_CLUSTER", raising=False)
    from hccc.torch import Options
    _run_every_call(Options(), dtype, op)


def test_every_call_on_a_catalog_without_algorithms_completes_on_the_delegate(tmp_path):
    """An empty catalog: float32 SUM, which the built-in catalog would serve, goes to gloo."""
    from hccc.torch import Options
    (tmp_path / "empty").mkdir()
    _run_every_call(Options(catalog=tmp_path / "empty", builtin=False), torch.float32, dist.ReduceOp.SUM)


@pytest.mark.parametrize("call", ["all_gather", "all_to_all_single", "gather", "scatter"])
def test_a_call_the_delegate_refuses_fails_on_every_rank_within_the_timeout(tmp_path, call):
    """gloo has no complex all_gather, all_to_all, gather or scatter: both ranks get its error,
    well within the group's timeout."""
    from hccc.torch import Options
    (tmp_path / "empty").mkdir()
    fn = next(c[1] for c in _calls(torch.complex64, dist.ReduceOp.SUM) if c[0] == call)
    out = ranks_in_threads([lambda pg, r=r: fn(pg, r) for r in range(WORLD)],
                           Options(catalog=tmp_path / "empty", builtin=False), timeout_s=GROUP_TIMEOUT_S)
    for r, res in enumerate(out):
        assert res is not None, f"rank {r} did not finish"
        assert isinstance(res[0], Exception), f"rank {r}: {call} did not fail"
        assert res[1] < GROUP_TIMEOUT_S, f"rank {r}: the error took {res[1]:.1f} s"


def test_a_reduce_scatter_whose_peer_never_calls_fails_within_the_timeout(tmp_path):
    """Rank 1 makes no call: rank 0's delegated reduce_scatter (a gloo work that never reports
    completion) fails within the group's timeout and its grace, naming the timeout."""
    from hccc.torch import Options
    from hccc.torch.jobs import DELEGATE_GRACE_S
    (tmp_path / "empty").mkdir()
    timeout_s = 3.0
    done = threading.Event()

    def rank0(pg):
        out = torch.zeros(N)
        try:
            pg._reduce_scatter_base(out, torch.ones(WORLD * N), _opts("ReduceScatterOptions")).wait()
        finally:
            done.set()

    def rank1(pg):
        done.wait(4 * timeout_s)

    out = ranks_in_threads([rank0, rank1], Options(catalog=tmp_path / "empty", builtin=False), timeout_s=timeout_s)
    res, secs = out[0]
    assert isinstance(res, Exception), res
    assert secs < timeout_s + DELEGATE_GRACE_S + 2.0, secs
    assert "timed out" in str(res).lower() or "timeout" in str(res).lower(), res


# ------------------------------------------------------------------------------ WorkWatch
class _Work:
    """A work that reports its end in one way only (``how``), ending when ``ended`` is set."""

    def __init__(self, how: str, ended: threading.Event, error: Exception | None = None):
        self.how, self.ended, self.error, self.waits = how, ended, error, 0

    def is_completed(self):
        return self.how == "is_completed" and self.ended.is_set()

    def get_future(self):
        if self.how != "future":
            raise RuntimeError("Work::getFuture not implemented.")
        work = self

        class F:
            def done(self):
                return work.ended.is_set()
        return F()

    def wait(self, timeout=None):
        self.waits += 1
        self.ended.wait()           # ignores its timeout, as gloo's reduce_scatter work does
        if self.error is not None:
            raise self.error
        return True


@pytest.mark.parametrize("how", ["is_completed", "future", "wait only"])
@pytest.mark.parametrize("error", [None, RuntimeError("peer gone")])
def test_a_work_watch_tells_the_end_of_every_kind_of_work(how, error):
    from hccc.torch.jobs import WorkWatch
    ended = threading.Event()
    w = _Work(how, ended, error)
    watch = WorkWatch(w)
    time.sleep(0.05)
    assert not watch.done()
    ended.set()
    deadline = time.monotonic() + 5
    while not watch.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert watch.done()
    if error is None:
        watch.result()
    else:
        with pytest.raises(RuntimeError, match="peer gone"):
            watch.result()
