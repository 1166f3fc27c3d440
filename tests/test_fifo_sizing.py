"""FIFO memory bounded by the call: a launch's slot capacity (``hccc_args::slot_cap``,
:attr:`~hccc.runtime.rank_memory.LaunchCall.slot_cap`) holds a slice of each chunk of the call's
largest message and no more, the Runner's FIFOs follow it (grown, never past the compiled slot),
and the Communicator's are bounded by a per-connection budget (``HCCC_FIFO_BYTES``).

The oracles are written from the ProgramIR and the kernels' arithmetic, not from the sizing code:
the largest message a connection carries (its primitives' chunk counts times the call's largest
chunk) and the micro-batches ``hccc_launch_init`` cuts (slice = min(slice_bytes, share) / element).
The real files are those the compiled-slot sizing refused: msccl-tools' 16-rank all-pairs AllReduce
and a 64-rank binary-tree AllReduce at 3 MB, MSCCL++'s installed two-node AllReduce plan (16 ranks)
at 1 MiB.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import examples
from hccc.compiler.backend import abi
from hccc.compiler.backend.codegen import slot_bytes
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes.build import build_program
from hccc.runtime.generated import GeneratedProgram
from hccc.runtime.memory_limits import plans_memory_bytes
from hccc.compiler.passes.slicing import budget_slot_capacity
from hccc.runtime.rank_memory import LaunchCall
from hccc.testing import valid_programs

from msccl_texts import allpairs_allreduce, binary_tree_allreduce

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
CORPUS = Path(__file__).parent / "mscclpp_corpus"
REGION_ROOM = abi.SLOT_OVERHEAD + 16    # a region's header and alignment, and its 16-byte rounding


def largest_message(ir, count: int, es: int) -> int:
    """Bytes of the largest message any connection carries in a call of ``count`` elements: the
    most chunks a sending or receiving primitive moves, times the call's largest chunk."""
    comm = np.array([Op(int(o)).sends or Op(int(o)).receives for o in ir.prims["op"]], dtype=bool)
    most = int(ir.prims["count"][comm].max()) if comm.any() else 1
    return max(1, most) * -(-count // ir.nchunks) * es


def micro_batches(ir, count: int, es: int, cap: int, slice_bytes: int, ll: bool) -> int:
    """The micro-batches ``hccc_launch_init`` cuts a chunk into with slot capacity ``cap``."""
    mc = max(1, ir.max_step_chunks)
    share = cap // mc
    share = share - share % 16 if share >= 16 else share
    if ll:
        share = share // 2 - (share // 2) % 16 if share // 2 >= 16 else share // 2
    sb = slice_bytes if 0 < slice_bytes < cap else cap
    per = max(1, min(sb, share) // es)
    return max(1, -(-(-(-count // ir.nchunks)) // per))


@st.composite
def calls(draw):
    alg = draw(valid_programs(max_ranks=6))
    chunk = draw(st.sampled_from([1 << 10, 1 << 16, 1 << 20]))
    ir = build_program(alg, chunk_bytes=max(chunk, 16 * 64))
    es = draw(st.sampled_from([2, 4, 8]))
    count = draw(st.integers(1, 1 << 22))
    proto = draw(st.sampled_from(["simple", "ll"]))
    slice_bytes = draw(st.one_of(st.just("auto"), st.integers(1, ir.chunk_bytes // 16).map(lambda k: 16 * k)))
    return ir, count, es, proto, slice_bytes


@given(calls())
@settings(max_examples=examples(60), deadline=None)
def test_a_launch_slot_is_a_small_multiple_of_its_largest_message(case):
    """A connection's FIFO for the call is at most 2 x NSLOTS times the call's largest message
    (twice: LL's flag words) plus the regions' fixed room, never over the compiled slot's, and the
    call runs in it the micro-batches it runs in the compiled slot."""
    ir, count, es, proto, slice_bytes = case
    call = LaunchCall.plan(ir, count, es, ir.chunk_bytes, proto=proto, slice_bytes=slice_bytes)
    mc = max(1, ir.max_step_chunks)
    fifo = abi.NSLOTS * slot_bytes(call.slot_cap, mc)
    assert fifo <= abi.NSLOTS * slot_bytes(ir.chunk_bytes, mc)
    assert fifo <= 2 * abi.NSLOTS * (largest_message(ir, count, es) + mc * REGION_ROOM)
    ll = call.proto == "ll"
    assert micro_batches(ir, count, es, call.slot_cap, call.slice_bytes, ll) == \
        micro_batches(ir, count, es, ir.chunk_bytes, call.slice_bytes, ll)


@given(budget=st.integers(1, 1 << 26), mc=st.integers(1, 64), chunk=st.integers(1, 1 << 16))
@settings(max_examples=examples(200), deadline=None)
def test_the_communicator_budget_bounds_each_connection(budget, mc, chunk):
    """The Communicator's slots (a per-connection budget, HCCC_FIFO_BYTES): NSLOTS slots carry at
    most the budget of data (unless the least slot, one 16-byte share per region, is larger), at
    most the compiled slot, and the compiled slot itself whenever it fits."""
    class _Ir:
        max_step_chunks = mc
    compiled = 16 * mc * chunk
    cap = budget_slot_capacity(_Ir, compiled, budget, abi.NSLOTS)
    share = cap // mc - (cap // mc) % 16
    assert cap <= compiled and share >= 16
    assert abi.NSLOTS * mc * share <= max(budget, abi.NSLOTS * mc * 16)
    if abi.NSLOTS * compiled <= budget:
        assert cap == compiled


def _program(kind: str, tmp_path):
    from hccc.compiler.pipeline import load_program
    if kind == "allpairs16":
        path, nbytes = tmp_path / "allpairs16.xml", 3_000_000
        path.write_text(allpairs_allreduce(16, 1))
    elif kind == "tree64":
        path, nbytes = tmp_path / "tree64.xml", 3_000_000
        path.write_text(binary_tree_allreduce(64))
    else:
        path, nbytes = CORPUS / "installed__allreduce_2nodes_128K_2M.json", 1 << 20
    return load_program(path), nbytes


@pytest.mark.parametrize("kind", ["allpairs16", pytest.param("tree64", marks=pytest.mark.slow),      # 8 s each:
                                  pytest.param("mscclpp_2nodes", marks=pytest.mark.slow)])  # their codegen
def test_real_files_need_fifos_of_their_call(kind, tmp_path):
    """The files the compiled-slot sizing refused (85.8 GiB, 157.4 GiB, 15.8 GiB of FIFOs): their
    FIFOs at the size that was refused, with the slot ``hccc run`` compiles them with (an
    algorithm-level import: one chunk of the largest call per region), are a small multiple of
    the message per connection."""
    from hccc.commands.run import _least_slot
    from types import SimpleNamespace
    ir, nbytes = _program(kind, tmp_path)
    es = 4
    _least_slot(ir, SimpleNamespace(sizes=[nbytes]), es)
    call = LaunchCall.plan(ir, nbytes // es, es, ir.chunk_bytes, proto="simple")
    prog = GeneratedProgram(ir, ["cuda"] * ir.nranks, tmp_path / "cache")
    plans = [p.with_capacity(call.slot_cap, ir.max_step_chunks) for p in prog.plans]
    conns = sum(len(p.recv_conns) for p in plans)
    need = plans_memory_bytes(plans)
    compiled = plans_memory_bytes(prog.plans)
    per_conn = 2 * abi.NSLOTS * (largest_message(ir, nbytes // es, es) + ir.max_step_chunks * REGION_ROOM)
    assert need <= conns * per_conn + sum(p.ctrl_bytes for p in plans) + 16 * conns
    assert need <= 2 << 30 and need * 4 < compiled, (need, compiled)


# ---------------------------------------------------------------------------- the Runner
@needs_gxx
def test_the_runner_grows_its_fifos_with_the_calls():
    """The Runner's FIFOs start at the least slot and grow to each larger call's slot (never past
    the compiled one, never shrunk); every call is right, LL ones after a growth too (the new
    slots are zeroed before the first LL launch in them)."""
    from hccc.compiler.frontend import generators as gen
    from hccc.runtime.launcher import Runner
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1 << 16)
    least = 16 * ir.max_step_chunks
    with Runner(ir, "cpu", "float32", "sum", nthreads=2) as runner:
        assert runner.fifo_capacity == least
    # the runner's ranks (a job started at the least slot, as the runner starts them), every rank's slots
    with LocalJob(ir, nthreads=2, fifo_capacity=least) as job:
        assert job.fifo_capacity == least
        seen = []
        for count, proto in [(64, "simple"), (4096, "simple"), (64, "ll"), (1 << 16, "ll"), (256, "simple"),
                             (1 << 18, "simple")]:
            res = job.run(count=count, proto=proto)
            assert res.ok, (count, proto, res.stuck)
            call = LaunchCall.plan(ir, count, 4, ir.chunk_bytes, proto=res.proto)
            seen.append(call.slot_cap)
            assert job.fifo_capacity == min(ir.chunk_bytes, max(16, *seen))
            assert all(c.slot_bytes == c.memory.plan.slot_bytes == slot_bytes(job.fifo_capacity, ir.max_step_chunks)
                       for c in job.comms)
        assert job.fifo_capacity == ir.chunk_bytes      # the largest call needs the whole slot


@needs_gxx
def test_a_runner_whose_fifos_could_not_grow_says_so(monkeypatch):
    """A reallocation that fails half-way (out of memory) fails its call, and every later call
    says why the runner is unusable; closing it frees what it holds."""
    from hccc.compiler.frontend import generators as gen
    from hccc.runtime.launcher import Runner
    from hccc.runtime.platform import PlatformError
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1 << 16)
    with Runner(ir, "cpu", "float32", "sum", nthreads=2) as runner:
        assert runner.run(count=48).ok

        def out_of_memory(*_a, **_k):
            raise PlatformError("out of memory allocating 1 bytes")
        monkeypatch.setattr(runner.platform, "malloc", out_of_memory)      # every allocation from now on
        with pytest.raises(PlatformError, match="out of memory"):
            runner.run(count=1 << 15)
        with pytest.raises(PlatformError, match="runner is unusable: reallocating its FIFOs for slots of"):
            runner.run(count=48)


# ---------------------------------------------------------------------------- the Communicator
@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    pytest.importorskip("torch.distributed")
    from rank_pool import RankPool
    p = RankPool(4, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


def _ring_json():
    from hccc.compiler.frontend import generators as gen
    return build_program(gen.ring_allreduce(4), chunk_bytes=1 << 16).to_json()


@needs_gxx
def test_the_communicator_pipelines_calls_through_its_budget(pool):
    """With HCCC_FIFO_BYTES=1K a 64 KiB-slot program's connections hold 8 slots of 128 bytes: a
    16 KiB call runs in slices of at most 128 bytes, right on every rank."""
    x = [np.arange(4096, dtype=np.float32) * (r + 1) for r in range(4)]
    calls = [[{"method": "all_reduce", "x": x[r]}] for r in range(4)]
    replies = pool.run(_ring_json(), 4, calls, timeout=30.0, env={"HCCC_FIFO_BYTES": "1K"}, proto="simple")
    want = np.arange(4096, dtype=np.float32) * 10
    for r, rep in enumerate(replies):
        assert rep["ok"], rep
        assert np.array_equal(rep["outputs"][0], want), r
        assert 0 < rep["slices"][0] <= 128, rep["slices"]


@needs_gxx
def test_ranks_with_different_budgets_all_refuse(pool):
    replies = pool.run(_ring_json(), 4, [[{"method": "all_reduce", "x": np.ones(64, np.float32)}]] * 4,
                       timeout=20.0, env={"HCCC_FIFO_BYTES": ""},     # (a rank's environment stays)
                       per_rank={1: {"env": {"HCCC_FIFO_BYTES": "1K"}}})
    for rep in replies:
        assert not rep["ok"] and "do not run the same program" in rep["error"], rep
        assert "has fifo_slot_bytes " in rep["error"], rep["error"]


@needs_gxx
def test_a_bad_budget_is_refused_by_name(pool):
    replies = pool.run(_ring_json(), 4, [[{"method": "all_reduce", "x": np.ones(64, np.float32)}]] * 4,
                       timeout=20.0, env={"HCCC_FIFO_BYTES": "lots"})
    for rep in replies:
        assert not rep["ok"] and "HCCC_FIFO_BYTES must be a positive size such as 8M, not 'LOTS'" in rep["error"], rep
        assert "Traceback" not in rep["error"]


def test_the_budget_option_is_checked():
    from hccc.runtime.rank_memory import fifo_budget_bytes
    assert fifo_budget_bytes(4096) == 4096
    for bad in (0, -1, 1.5, "8M", True):
        with pytest.raises(ValueError, match="fifo_bytes must be a positive whole number of bytes"):
            fifo_budget_bytes(bad)


@needs_gxx
def test_a_budget_across_nodes(pool):
    """Two emulated nodes of two ranks (the network proxy forwards the slots over UCX's TCP): the
    budget's 128-byte slots carry a 16 KiB AllReduce right, the proxy's slot layout the same as
    the kernels'."""
    from net_ranks import TCP, have_ucx
    if not have_ucx():
        pytest.skip("UCX (libucx-dev) not installed")
    from communicator_calls import calls_for, check
    from hccc.compiler.frontend import generators as gen
    ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=1 << 16)
    calls, want, count = calls_for(ir, 4096, "float32", "sum", 0)
    replies = pool.run(ir.to_json(), 4, calls, nodes=["a", "a", "b", "b"],
                       env={**TCP, "HCCC_FIFO_BYTES": "1K"}, timeout=30.0)
    check(replies, want, f"{ir.name} across nodes in 1 KiB FIFOs ({count} x float32 sum)", 1)
    assert all(0 < s <= 128 for rep in replies for s in rep["slices"]), [rep["slices"] for rep in replies]


# ---------------------------------------------------------------------------- the C++ host API
_HOST_PROBE = """#include "hccc_host.h"
#include <cstdio>
int main() {
  printf("%llu %llu %llu\\n", (unsigned long long)HCCC_HOST_SLOT_CAP, (unsigned long long)HCCC_HOST_SLOT_BYTES,
         (unsigned long long)HCCC_HOST_SHARE_BYTES);
  return 0;
}
"""


def _host_build(tmp_path, ir, sources: str, defines=()) -> Path:
    import subprocess
    from hccc.compiler.backend.codegen import generate
    from hccc.util.dtypes import only_instance_flags
    d = tmp_path / "gen"
    if not d.exists():
        d.mkdir()
        generate(ir, d, platforms=["cuda"] * ir.nranks)
    tu = tmp_path / f"tu{len(list(tmp_path.glob('tu*')))}.cpp"
    tu.write_text(sources)
    exe = tu.with_suffix("")
    res = subprocess.run(["g++", "-std=c++17", "-O1", "-DHCCC_PLATFORM_CPU=1", *defines, f"-I{d}",
                          *only_instance_flags("float32", "sum"), "-pthread", str(tu), "-o", str(exe), "-lrt"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return exe


@needs_gxx
def test_the_host_api_sizes_its_fifos_by_the_same_budget(tmp_path):
    """hccc_host.h's slot capacity, slot and share (compile-time, HCCC_HOST_FIFO_DATA_BYTES) are the
    Python Communicator's for the same budget: the compiled slot under the default budget where
    it fits, the budget's otherwise."""
    import subprocess
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.slicing import FIFO_BUDGET_BYTES, slot_share_bytes
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1 << 22)     # 4 MiB slots: over the default budget
    for budget, defines in ((FIFO_BUDGET_BYTES, ()), (1024, ("-DHCCC_HOST_FIFO_DATA_BYTES=1024",)),
                            (1 << 30, ("-DHCCC_HOST_FIFO_DATA_BYTES=(1ull<<30)",))):
        exe = _host_build(tmp_path, ir, _HOST_PROBE, defines)
        got = tuple(map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()))
        cap = budget_slot_capacity(ir, ir.chunk_bytes, budget, abi.NSLOTS)
        assert got == (cap, slot_bytes(cap, ir.max_step_chunks), slot_share_bytes(cap, ir.max_step_chunks)), budget
        assert cap == (ir.chunk_bytes if budget >= abi.NSLOTS * ir.chunk_bytes else budget // abi.NSLOTS)


@needs_gxx
@pytest.mark.slow    # 8 s: the rank kernels and the host program built with g++
def test_host_api_calls_pipeline_through_a_small_budget(tmp_path):
    """One process per rank through hccc_host.h with 1 KiB FIFOs (128-byte slots) for a 64 KiB-slot
    program: Simple and LL calls, in and out of place, every element the sum."""
    import subprocess
    from hccc.compiler.frontend import generators as gen
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1 << 16)
    root = Path(__file__).resolve().parent
    exe = _host_build(tmp_path, ir, f'#include "{ir.name}_cuda.cu"\n#include "{root / "host_proto_ranks.cpp"}"\n',
                      ("-DHCCC_HOST_FIFO_DATA_BYTES=1024",))
    out = tmp_path / "out"
    out.mkdir()
    counts = [4096, 1001, "3000:1", "64:1"]
    res = subprocess.run([str(exe), str(out), "0", *map(str, counts)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    for k, c in enumerate(counts):
        n = int(str(c).split(":")[0])
        i = np.arange(n)
        want = sum(((7 * r + 3 * i + k) % 17) - 8 for r in range(4)).astype(np.float32)
        for r in range(4):
            got = np.fromfile(out / f"r{r}_c{k}.bin", dtype=np.float32)
            assert np.array_equal(got, want), (r, k)
