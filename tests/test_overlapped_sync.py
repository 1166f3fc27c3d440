"""The overlapped sync of the kernels (``hccc_prim``: each warp waits, moves its piece of a message
and arrives on a block-shared counter; the last warp to arrive posts), run in the CPU emulation
with **wide emulated warps** (``-DHCCC_WARP_SIZE=4``: ``hccc_syncwarp`` is then a real barrier over
4 threads and ``hccc_warp_all`` a vote among them), so the per-warp logic with several lanes, and
partial last warps (6 or 9 threads: warps of 4 + 2, 4 + 4 + 1), run against the reference
executor. The default build (one thread per warp) runs through every other kernel test.

- a fixed program (ring AllReduce, 2 channels) under Simple and LL, in and out of place, uneven
  count: 0 wrong elements;
- a deadlock: every warp leaves (the run returns, the error record names the wait);
- (slow) random valid programs of every collective, 1-3 channels, uneven counts, every dtype and
  op, both protocols, fused primitives, one grid or a kernel per rank, specialised or table kernels:
  0 wrong elements (a run that completes is also the check that no warp was left waiting).
"""
from __future__ import annotations

import re
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hccc.runtime.cpu as cpu
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime.launcher import Runner
from hccc.testing import KernelCase, describe_failure, kernel_cases, run_case, valid_programs

from test_codegen_irs import ring_allreduce, stuck_ir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

WARP = 4
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A CPU platform whose kernels model warps of WARP threads (its compile commands recorded in
    ``wide.commands``)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(cpu, "_CXX_FLAGS", [*cpu._CXX_FLAGS, f"-DHCCC_WARP_SIZE={WARP}"])
    commands: list[list[str]] = []
    real_run = cpu.subprocess.run

    def run(cmd, *a, **k):
        commands.append([str(x) for x in cmd])
        return real_run(cmd, *a, **k)

    mp.setattr(cpu.subprocess, "run", run)
    plat = cpu.CpuPlatform(opt="-O0", cache_dir=tmp_path_factory.mktemp("wide-cache"))
    plat.commands = commands
    try:
        yield plat
    finally:
        plat.close()
        mp.undo()


HARNESS = r"""
#include "hccc_prims.h"
#include <thread>
#include <vector>
// nthreads threads of one TB: out[t] = hccc_warp_all(in[t]) twice in a row (the vote word is
// reset between votes), then, after a store and hccc_syncwarp, the sum of the values its warp's
// lanes stored.
extern "C" __attribute__((visibility("default"))) int hccc_test_warps(int nthreads, const int* in,
                                                                      int* out, int* seen) {
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, nthreads);
  static int cell[64];
  struct job { const int* in; int* out; int* seen; } j{in, out, seen};
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t)
    ts.emplace_back([&, t] {
      hccc_cpu_run_thread(+[](const job& x) {
        const int t = hccc_tid();
        x.out[2 * t] = hccc_warp_all(x.in[t]);
        x.out[2 * t + 1] = hccc_warp_all(!x.in[t]);
        cell[t] = 10 + t;
        hccc_syncwarp();
        int sum = 0;
        for (int l = t / HCCC_WARP_SIZE * HCCC_WARP_SIZE; l < hccc_nthreads() && l / HCCC_WARP_SIZE == t / HCCC_WARP_SIZE; ++l)
          sum += __atomic_load_n(&cell[l], __ATOMIC_RELAXED);
        x.seen[t] = sum;
      }, j, &blk, t);
    });
  for (auto& t : ts) t.join();
  return HCCC_WARP_SIZE;
}
"""


@pytest.fixture(scope="module")
def warps_lib(tmp_path_factory):
    import ctypes
    import subprocess
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.frontend import generators as gen
    d = tmp_path_factory.mktemp("warps")
    generate(build_program(gen.ring_allgather(2), chunk_bytes=64), d, platforms=["cuda"] * 2)
    (d / "harness.cpp").write_text(HARNESS)
    so = d / "warps.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-DHCCC_PLATFORM_CPU",
                    f"-DHCCC_WARP_SIZE={WARP}", "-I", str(d), str(d / "harness.cpp"), "-o", str(so)],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    lib.hccc_test_warps.restype = ctypes.c_int
    lib.hccc_test_warps.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 3
    return lib


@settings(max_examples=20, deadline=None)
@given(votes=st.lists(st.booleans(), min_size=1, max_size=13))
def test_emulated_warp_votes_and_barriers(warps_lib, votes):
    """Oracle: lanes t of warp t // WARP (the last warp partial); a vote is the AND over the lanes
    that exist; after hccc_syncwarp a lane sees every store its warp's lanes made before it."""
    import numpy as np
    n = len(votes)
    vin = np.array(votes, dtype=np.int32)
    out = np.full(2 * n, -1, dtype=np.int32)
    seen = np.zeros(n, dtype=np.int32)
    assert warps_lib.hccc_test_warps(n, vin.ctypes.data, out.ctypes.data, seen.ctypes.data) == WARP
    for t in range(n):
        lanes = range(t // WARP * WARP, min(n, t // WARP * WARP + WARP))
        assert out[2 * t] == all(votes[l] for l in lanes)
        assert out[2 * t + 1] == all(not votes[l] for l in lanes)
        assert seen[t] == sum(10 + l for l in lanes)


def test_the_platform_builds_wide_warps(wide):
    """The negative control of the runs below: their kernels were compiled with wide warps."""
    ir = ring_allreduce(2)
    ir.chunk_bytes = 64
    case = KernelCase(count=37, nthreads=6)
    res = run_case(ir, case, backend=wide)
    assert res.ok, describe_failure(case, res)
    compiles = [c for c in wide.commands if "-c" in c]
    assert compiles and all(f"-DHCCC_WARP_SIZE={WARP}" in c for c in compiles)


@pytest.mark.parametrize("proto", ["simple", "ll"])
@pytest.mark.parametrize("inplace", [False, True])
def test_ring_allreduce_with_channels_and_partial_warps(wide, proto, inplace):
    ir = with_channels(build_program(_ring(4), chunk_bytes=128), 2)
    for nthreads, count in ((6, 4 * 3 * 40 + 3), (9, 1001)):
        case = KernelCase(count=count, dtype="float32", op="sum", inplace=inplace, nthreads=nthreads,
                          slice_bytes=64)
        res = run_case(ir, case, backend=wide, proto=proto)
        assert res.ok and res.wrong == 0, describe_failure(case, res)


def test_a_deadlock_makes_every_warp_leave(wide):
    """Both ranks receive first: one warp's lane 0 times out and raises the abort flag, the other
    warps (waiting on the same counters, or on the block's arrival counters) see it and leave; the
    run returns and names the wait."""
    with Runner(stuck_ir(), wide, "float32", "sum", nthreads=6, timeout_s=0.2) as runner:
        res = runner.run(count=16)
        assert res.stuck is not None and res.wrong == 0
        assert re.match(r"rank [01], TB 0 stuck in recv for chunk [01] \(micro-batch 0\): waiting for "
                        r"data from rank [01]", res.stuck), res.stuck
        assert runner.run(count=40).stuck is not None   # and again


def _ring(n: int):
    from hccc.compiler.frontend import generators as gen
    return gen.ring_allreduce(n)


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_random_programs_with_wide_warps_match_the_oracle(wide, collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=4), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([64, 128, 256]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))
    ir = with_channels(ir, data.draw(st.sampled_from([1, 2, 3]), label="channels"))
    case = data.draw(kernel_cases(ir, max_microbatches=10, threads=(4, 6, 8, 9)), label="case")
    proto = data.draw(st.sampled_from(["simple", "ll"]), label="proto")
    res = run_case(ir, case, backend=wide, proto=proto, one_grid=data.draw(st.booleans(), label="one_grid"),
                   codegen=data.draw(st.sampled_from(["specialized", "table"]), label="codegen"))
    assert res.ok and res.wrong == 0, f"{proto}: {describe_failure(case, res)}"
