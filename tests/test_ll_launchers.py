"""The LL protocol in every launcher: the single-process Runner (direct mode under LL), the
Communicator (one rank per process, protocol chosen per call by size), the torch backend through
it, and the C++ host API (``hccc_host.h``) built against the CPU emulation.

Outputs are compared with the collective's definition computed with numpy from the inputs alone
(:func:`hccc.runtime.reference.expected`, or a numpy sum), never with another run of the kernels.
The size rule is checked against the documented crossover written out here (128 KiB of full
buffer), not against the function that implements it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime import reference

from conftest import examples, shm_leaks
from hccc.util.dtypes import only_instance_flags
from rank_pool import RankPool
from communicator_calls import INSTANCE, PROGRAMS, no_leaks, require_torch, calls_for, check  # noqa: F401

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
ROOT = Path(__file__).resolve().parent.parent
#: the documented crossover of ``--proto auto`` (docs/kernel-protocol.md), in bytes of full buffer
CROSSOVER = 256 * 1024


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    require_torch()
    # as many rank processes as the largest program of PROGRAMS (Scatter's binomial tree: 5)
    p = RankPool(max(PROGRAMS[c]().header.nranks for c in PROGRAMS), tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


def test_the_documented_crossover_is_the_one_in_force():
    assert abi.LL_AUTO_MAX_BYTES == CROSSOVER


# ---------------------------------------------------------------------------- the Runner
@pytest.mark.slow
def test_runner_sends_direct_messages_as_ll_lines_under_ll():
    """Ring AllReduce 4 has direct-mode receives (its AllGather half: the sender writes the
    receiver's output). Under Simple the slots of those messages stay untouched; under LL the launch
    has no peers array, so every message's slot holds LL lines (flag = message index +
    LL_FLAG_BASE, message k in slot k mod NSLOTS) and the run says how many receives that moved."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1024)
    count = 4 * 64
    # the runner's ranks (a LocalJob started at the least slot, launched together with direct
    # mode's peers array, as the runner launches them), each rank's slots read from its memory
    least = 16 * ir.max_step_chunks
    with LocalJob(ir, nthreads=2, fifo_capacity=least) as job:
        assert job.direct_receives() > 0

        def run(**kw):
            return job.run(count=count, direct=True, **kw)

        def first_words(at: int = 0):
            """[rank, receive connection, slot]: 8 bytes of the slot, ``at`` bytes in (a Simple
            message's data lies past the reserved region header and alignment room,
            abi.SLOT_OVERHEAD: the sender writes no header; LL lines start at 0)."""
            out = []
            for r in range(4):
                mem = job.comms[r].memory
                plan = mem.plan
                raw = np.zeros(plan.slots_bytes, np.uint8)
                mem.platform.memcpy_dtoh(raw, mem.slots)
                out.append([[raw[j * plan.fifo_bytes + s * plan.slot_bytes + at:][:8].view(np.uint64)[0]
                             for s in range(abi.NSLOTS)] for j in range(len(plan.recv_conns))])
            return np.array(out, np.uint64)

        # the FIFOs follow the call (a Simple call's slots; an LL call's are twice as large): one
        # call first, so that the slots marked below are those the Simple call runs in
        assert run(proto="simple").ok
        for r in range(4):
            mem = job.comms[r].memory
            mem.platform.memset(mem.slots, 0xAB, mem.plan.slots_bytes)
        inputs = reference.make_inputs("allreduce", 4, count, "float32", nchunks=ir.nchunks, seed=1)
        want = np.sum(np.stack(inputs), axis=0)
        res = run(proto="simple", inputs=inputs, keep_outputs=True)
        assert res.ok and res.proto == "simple" and job.proto_note is None
        untouched = first_words(abi.SLOT_OVERHEAD) == np.uint64(0xABABABABABABABAB)
        # 6 messages per connection (3 ReduceScatter through the FIFO, 3 AllGather direct)
        assert untouched[:, :, 3:6].all() and not untouched[:, :, :3].any()
        res = run(proto="ll", inputs=inputs, keep_outputs=True)
        assert res.ok and res.proto == "ll"
        assert f"{job.direct_receives()} direct-mode receives" in job.proto_note
        flags = first_words()[:, :, :6] >> np.uint64(32)
        assert (flags == np.arange(6, dtype=np.uint64) + np.uint64(abi.LL_FLAG_BASE)).all(), flags
        for out in res.outputs:
            assert np.array_equal(out, want)
    with LocalJob(ir, nthreads=2, direct="off") as job:
        assert job.direct_receives() == 0
        assert job.run(count=count, proto="ll", direct=True).ok and job.proto_note is None


# ---------------------------------------------------------------------------- the Communicator
_RING4 = build_program(gen.ring_allreduce(4), chunk_bytes=1024)


def _bare_communicator(ir, proto="auto", net=None):
    """A Communicator object holding only what the protocol choice reads (no processes)."""
    from hccc.runtime.communicator import Communicator
    c = Communicator.__new__(Communicator)
    c.ir, c.chunk_bytes, c._net, c.rank = ir, 1024, net, 0
    c.proto = proto
    return c


def test_communicator_protocol_rule():
    """auto: LL up to the crossover, Simple above; explicit protocols as asked; an MSCCL import
    proven with one micro-batch per chunk and a job across nodes run Simple and say why."""
    import dataclasses
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1024)
    c = _bare_communicator(ir)
    assert c._choose_proto(CROSSOVER) == "ll" and c.last_proto == "ll" and c.proto_note is None
    assert c._choose_proto(CROSSOVER + 4) == "simple" and c.proto_note is None
    c.proto = "ll"
    assert c._choose_proto(1 << 30) == "ll"
    c.proto = "simple"
    assert c._choose_proto(16) == "simple"
    with pytest.raises(ValueError, match="protocol"):
        c.proto = "ll128"
    assert c.proto == "simple"
    imported = dataclasses.replace(ir, origin=dataclasses.replace(ir.origin, execution="algorithm"))
    c = _bare_communicator(imported, "ll")
    assert c._choose_proto(64) == "simple" and "one micro-batch per chunk" in c.proto_note
    c = _bare_communicator(ir, "auto", net=object())
    assert c._choose_proto(64) == "simple" and "across nodes" in c.proto_note


@settings(max_examples=examples(40), deadline=None)
@given(nbytes=st.integers(0, 1 << 40), asked=st.sampled_from(["auto", "simple", "ll"]),
       imported=st.booleans(), across_nodes=st.booleans())
def test_communicator_protocol_rule_holds_for_any_size(nbytes, asked, imported, across_nodes):
    import dataclasses
    ir = _RING4
    if imported:
        ir = dataclasses.replace(ir, origin=dataclasses.replace(ir.origin, execution="algorithm"))
    c = _bare_communicator(ir, asked, net=object() if across_nodes else None)
    want = asked if asked != "auto" else ("ll" if nbytes <= CROSSOVER else "simple")
    if imported or across_nodes:
        want = "simple"
    assert c._choose_proto(nbytes) == want
    assert (c.proto_note is not None) == (want == "simple" and asked != "simple"
                                          and (asked == "ll" or nbytes <= CROSSOVER))


def test_communicator_refuses_an_unknown_protocol_before_set_up():
    from hccc.runtime.communicator import Communicator
    with pytest.raises(ValueError, match="protocol must be 'auto', 'simple' or 'll'"):
        Communicator(build_program(gen.ring_allreduce(2)), rank=0, world_size=2, proto="ll128")


def _allreduce_calls(n_ranks, counts_protos, seed=0):
    """Per rank: AllReduce calls (count, protocol asked for or None, out of place?) and the numpy
    sums they must give."""
    calls, wants = [[] for _ in range(n_ranks)], []
    rng = np.random.default_rng(seed)
    for count, proto, out_of_place in counts_protos:
        xs = [rng.integers(-8, 9, count).astype(np.float32) for _ in range(n_ranks)]
        wants.append(np.sum(np.stack(xs), axis=0))
        for r in range(n_ranks):
            c = {"method": "all_reduce", "x": xs[r]}
            if proto is not None:
                c["proto"] = proto
            if out_of_place:
                c["out"] = count
            calls[r].append(c)
    return calls, wants


def _run_allreduces(pool, ir, plan, protos):
    from hccc.runtime.rank_memory import launch_slice_bytes
    calls, wants = _allreduce_calls(ir.nranks, plan)
    replies = pool.run(ir.to_json(), ir.nranks, calls)
    for r, rep in enumerate(replies):
        assert rep["ok"], f"rank {r}: {rep['error']}\n{rep.get('trace', '')}"
        assert [p for p, _ in rep["protos"]] == protos
        assert rep["slices"] == [launch_slice_bytes(ir, 4 * count, 4, ir.chunk_bytes, proto)
                                 for (count, _, _), proto in zip(plan, protos)]
        assert all(note is None for _, note in rep["protos"])
        for k, (got, want) in enumerate(zip(rep["outputs"], wants)):
            assert np.array_equal(got, want), f"rank {r}, call {k} ({plan[k]})"


@pytest.mark.slow
def test_communicator_chooses_the_protocol_per_call(pool):
    """Ring AllReduce 3, fused, one rank per process: auto runs small calls (uneven counts, in and
    out of place) under LL; a protocol set between calls wins; every sum is right (channels: the
    slow tests)."""
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1024, fuse=True)
    plan = [(1001, None, True), (777, None, False), (1001, "simple", True), (5, "ll", False),
            (13, "auto", True)]
    _run_allreduces(pool, ir, plan, ["ll", "ll", "simple", "ll", "ll"])


@pytest.mark.slow
def test_communicator_reuses_the_fifos_across_ll_calls(pool):
    """Ring AllReduce 3, one rank per process: LL calls one after another (uneven counts, in and
    out of place, several messages per connection) run each in the next flag epoch without
    zeroing the slots; a Simple call between them makes the next LL call zero them once. Every
    rank reports the same (next epoch, zeroings) after every call; every sum is right."""
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=256)
    plan = [(1001, "ll", True), (777, "ll", False), (1001, "ll", True), (5, "simple", False),
            (13, "ll", True), (96, "ll", False), (500, "ll", True)]
    calls, wants = _allreduce_calls(ir.nranks, plan, seed=3)
    replies = pool.run(ir.to_json(), ir.nranks, calls)
    for r, rep in enumerate(replies):
        assert rep["ok"], f"rank {r}: {rep['error']}\n{rep.get('trace', '')}"
        assert [p for p, _ in rep["protos"]] == ["ll", "ll", "ll", "simple", "ll", "ll", "ll"]
        assert [tuple(e) for e in rep["epochs"]] == [(1, 1), (2, 1), (3, 1), (3, 1), (1, 2), (2, 2),
                                                    (3, 2)], rep["epochs"]
        for k, (got, want) in enumerate(zip(rep["outputs"], wants)):
            assert np.array_equal(got, want), f"rank {r}, call {k} ({plan[k]})"


@pytest.mark.slow
def test_communicator_runs_ll_up_to_the_crossover_and_simple_above(pool):
    """The same at the crossover: 128 KiB of full buffer runs LL, 4 bytes more Simple (unless LL
    is asked for)."""
    ir = with_channels(build_program(gen.ring_allreduce(4), chunk_bytes=16384, fuse=True), 2)
    c4 = CROSSOVER // 4
    plan = [(c4, None, True), (c4 + 1, None, False), (c4 + 1, "ll", True), (c4, "simple", False)]
    _run_allreduces(pool, ir, plan, ["ll", "simple", "ll", "simple"])


@pytest.mark.slow
def test_ranks_that_ask_for_different_protocols_all_get_an_error(pool):
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=512)
    calls, _ = _allreduce_calls(4, [(96, None, True)])
    replies = pool.run(ir.to_json(), 4, calls, proto="simple", per_rank={2: {"proto": "ll"}})
    for r, rep in enumerate(replies):
        assert not rep["ok"], f"rank {r} went on"
        assert "every rank must make the same call" in rep["error"], rep["error"]
        assert "(sum, ll)" in rep["error"] and "(sum, simple)" in rep["error"], rep["error"]


def _collective_plan(coll):
    """(program, dtype, op, counts) per collective: uneven counts, LL throughout."""
    ir = build_program(PROGRAMS[coll](), chunk_bytes=256, fuse=coll in ("allreduce", "reducescatter"))
    return with_channels(ir, 2) if coll in ("allgather", "reduce", "alltoall") else ir


@pytest.mark.slow
@pytest.mark.parametrize("collective", sorted(PROGRAMS))
def test_every_collective_under_ll_in_separate_processes(pool, collective):
    """Every collective (fused or with 2 channels), its instance's dtype and op, uneven counts,
    under LL forced and under auto at a small size: against the definition."""
    ir = _collective_plan(collective)
    dtype, op = INSTANCE[collective]
    for count, proto in ((3 * 97 + 2, "ll"), (1000, "auto"), (13, "ll")):
        calls, want, count = calls_for(ir, count, dtype, op, seed=count)
        replies = pool.run(ir.to_json(), ir.nranks, calls, dtype=dtype, op=op, proto=proto)
        check(replies, want, f"{ir.name} {count} x {dtype} {op} {proto}")
        assert all(rep["protos"][0][0] == "ll" for rep in replies)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,op", [("float16", "max"), ("bfloat16", "sum"), ("int32", "min")])
def test_allreduce_under_ll_in_every_dtype_in_place(pool, dtype, op):
    ir = with_channels(build_program(gen.ring_allreduce(3), chunk_bytes=256, fuse=True), 3)
    calls, want, count = calls_for(ir, 3 * 211 + 1, dtype, op, seed=5)
    replies = pool.run(ir.to_json(), ir.nranks, calls, dtype=dtype, op=op, proto="ll")
    check(replies, want, f"{ir.name} {count} x {dtype} {op} ll")
    assert all(rep["protos"][0][0] == "ll" for rep in replies)


@pytest.mark.slow
def test_a_job_across_nodes_runs_simple_and_says_why(pool):
    """2 nodes x 2 ranks over UCX (TCP): LL asked for, Simple run on every rank with the reason
    (the network proxy forwards a slot when its tail advances); the sums are right."""
    from net_ranks import TCP, have_ucx
    if not have_ucx():
        pytest.skip("UCX (libucx-dev) not installed")
    ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=256)
    calls, wants = _allreduce_calls(4, [(1000, "ll", True), (37, None, False)])
    replies = pool.run(ir.to_json(), 4, calls, nodes=["a", "a", "b", "b"], env=TCP)
    for r, rep in enumerate(replies):
        assert rep["ok"], f"rank {r}: {rep['error']}"
        assert [p for p, _ in rep["protos"]] == ["simple", "simple"]
        assert all("across nodes" in note for _, note in rep["protos"])
        for got, want in zip(rep["outputs"], wants):
            assert np.array_equal(got, want)


# ---------------------------------------------------------------------------- the torch backend
def _torch_job(rank, world, url, small, large):
    import torch
    import torch.distributed as dist

    import hccc.torch
    from torch_ranks import init
    init("hccc", rank, world, url)
    got = {}
    for n in (small, large, small):
        t = (torch.arange(n) % 11 + 3 * rank).to(torch.float32)
        dist.all_reduce(t)
        got[n] = t.numpy().copy()
    stats = hccc.torch.stats()
    dist.destroy_process_group()
    return {"got": got, "stats": stats}


@pytest.mark.slow
def test_torch_backend_gets_ll_for_small_messages(tmp_path, monkeypatch):
    """dist.all_reduce through the "hccc" backend: the Communicator picks LL for 96 floats and
    Simple above the crossover (counted in hccc.torch.stats()["protos"]); the sums are right."""
    require_torch()
    from torch_ranks import spawn
    monkeypatch.setenv("HCCC_ALGO_DIR", str(ROOT / "examples" / "torch" / "catalog4"))
    small, large = 96, CROSSOVER // 4 + 8
    replies = spawn(_torch_job, 4, tmp_path, small, large)
    for r, (ok, rep) in enumerate(replies):
        assert ok, f"rank {r}: {rep}"
        for n in (small, large):
            want = sum((np.arange(n) % 11 + 3 * q).astype(np.float32) for q in range(4))
            assert np.array_equal(rep["got"][n], want), (r, n)
        assert rep["stats"]["protos"] == {"ll": 2, "simple": 1}, rep["stats"]


# ---------------------------------------------------------------------------- the C++ host API
TRIM = only_instance_flags("float32", "sum")


def _emit(ir, d: Path) -> Path:
    from hccc.compiler.backend.codegen import generate
    d.mkdir(parents=True, exist_ok=True)
    generate(ir, d, platforms=["cuda"] * ir.nranks)
    return d


def _oracle_proto(count: int, element_bytes: int, want: int, algorithm_level: bool) -> int:
    """The documented rule: auto (-1) is LL (1) up to 128 KiB of full buffer, else Simple (0); an
    MSCCL import proven with one micro-batch per chunk runs Simple; anything else is refused (-1)."""
    if want == -1:
        want = 1 if count * element_bytes <= CROSSOVER else 0
    if want not in (0, 1):
        return -1
    return 0 if algorithm_level else want


_PROTO_PROBE = r"""
#include "hccc_host.h"
int main() {
  const unsigned long long counts[] = {0, 1, 4096, 65535, 65536, 65537, 131072, 1ull << 40};
  const int sizes[] = {1, 2, 4}, wants[] = {-1, 0, 1, 2, -7};
  for (unsigned long long n : counts)
    for (int es : sizes)
      for (int w : wants) printf("%llu %d %d %d\n", n, es, w, hccc_host_proto(n, es, w));
  return 0;
}
"""


@pytest.mark.parametrize("imported", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_host_api_protocol_rule(tmp_path, imported):
    """hccc_host_proto, compiled and run, against the documented rule, for a program and for one
    marked as an MSCCL import proven with one micro-batch per chunk (LL falls back to Simple)."""
    import dataclasses
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1024)
    if imported:
        ir = dataclasses.replace(ir, origin=dataclasses.replace(ir.origin, execution="algorithm"))
    assert ir.algorithm_level == imported
    d = _emit(ir, tmp_path / "gen")
    (tmp_path / "probe.cpp").write_text(_PROTO_PROBE)
    res = subprocess.run(["g++", "-std=c++17", "-DHCCC_PLATFORM_CPU=1", f"-I{d}", *TRIM, "-pthread",
                          str(tmp_path / "probe.cpp"), "-o", str(tmp_path / "probe")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert len(lines) == 8 * 3 * 5
    for line in lines:
        n, es, w, got = map(int, line.split())
        assert got == _oracle_proto(n, es, w, imported), line


def _oracle_epochs(protos: list[int], next_after_first: int | None = None) -> list[tuple[int, int]]:
    """The documented LL epoch rule per call: (flag epoch, slot zeroings so far). An LL call (1)
    gets the next epoch; it zeroes the slots first (and restarts at epoch 0) when it is the first
    LL call, follows a Simple call (0), or the epochs are used up; a Simple call runs in epoch 0.
    ``next_after_first``: the next epoch is forced to it after the first call."""
    nxt, dirty, zeroings, out = 0, True, 0, []
    for k, p in enumerate(protos):
        if p == 1:
            if dirty or nxt >= abi.LL_EPOCHS:
                nxt, zeroings = 0, zeroings + 1
            out.append((nxt, zeroings))
            nxt, dirty = nxt + 1, False
        else:
            out.append((0, zeroings))
            dirty = True
        if k == 0 and next_after_first is not None:
            nxt = next_after_first
    return out


def _host_program(tmp_path, ir) -> Path:
    """The rank kernels of ``ir`` (float32 / sum) and tests/host_proto_ranks.cpp, built with g++."""
    d = _emit(ir, tmp_path / "gen")
    tu = tmp_path / "ranks.cpp"
    tu.write_text(f'#include "{ir.name}_cuda.cu"\n#include "{ROOT / "tests" / "host_proto_ranks.cpp"}"\n')
    exe = tmp_path / "ranks"
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-DHCCC_PLATFORM_CPU=1", f"-I{d}", *TRIM, "-pthread",
                          str(tu), "-o", str(exe), "-lrt"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return exe


@pytest.mark.slow
def test_host_api_runs_ll_by_size_on_every_rank(tmp_path):
    """Ring AllReduce 4 (2 channels) through hccc_host.h, one process per rank: auto runs LL up to
    the crossover and Simple above, forced LL and Simple run as asked, at uneven counts, in and out
    of place, every element equal to the numpy sum. Successive LL calls reuse the FIFOs without
    zeroing them, each in the next flag epoch (the slots are zeroed at the first LL call, after a
    Simple one and at the wrap of the epochs, forced here with LL_NEXT): the epochs and zeroings
    each rank reports follow the documented rule, and every result is right."""
    import os
    from hccc.runtime import shm
    ir = with_channels(build_program(gen.ring_allreduce(4), chunk_bytes=4096), 2)
    exe = _host_program(tmp_path, ir)
    c4 = CROSSOVER // 4
    before = set(shm.ours())
    cases = ((-1, [1001, 7, c4, c4 + 1, 96], None), (1, [c4 + 3, 1001], None), (0, [1001, 5], None),
             (1, ["1001", "777", "5:0", "1001", "13", "96", "7:0", "64"], None),
             (1, [1001, 777, 96, 13, 5], abi.LL_EPOCHS - 2))
    for i, (want, counts, ll_next) in enumerate(cases):
        out = tmp_path / f"out{i}"
        out.mkdir()
        env = dict(os.environ, **({"LL_NEXT": str(ll_next)} if ll_next is not None else {}))
        res = subprocess.run([str(exe), str(out), str(want), *map(str, counts)], capture_output=True,
                             text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        calls = [(int(str(c).split(":")[0]), int(str(c).split(":")[1]) if ":" in str(c) else want)
                 for c in counts]
        protos = [_oracle_proto(n, 4, w, False) for n, w in calls]
        epochs = _oracle_epochs(protos, ll_next)
        got = sorted(res.stdout.splitlines())
        assert got == sorted(f"rank {r} call {k} proto {p} epoch {e} zeroings {z}"
                             for r in range(4) for k, (p, (e, z)) in enumerate(zip(protos, epochs))), got
        for k, (n, _) in enumerate(calls):
            idx = np.arange(n)
            want_sum = sum(((7 * r + 3 * idx + k) % 17 - 8).astype(np.float32) for r in range(4))
            for r in range(4):
                data = np.fromfile(out / f"r{r}_c{k}.bin", dtype=np.float32)
                assert np.array_equal(data, want_sum), (want, k, n, r)
    assert shm_leaks(before) == set()
