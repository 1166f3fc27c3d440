"""The block's roles (``hccc_run`` in ``hccc_prims.h``: lane 0 of warp 0 prepares, waits for and
posts every unit, the other warps move the data between two named barriers; a one-warp block runs
in lock-step), run in the CPU emulation with **wide emulated warps** (``-DHCCC_WARP_SIZE=4``:
``hccc_syncwarp`` is then a real barrier over 4 threads, the sync warp's other lanes leave and its
arrivals count for the whole warp, as a GPU counts them), so partial last warps (6 or 9 threads:
warps of 4 + 2, 4 + 4 + 1) and the one-warp block run against the reference executor. The default
build (one thread per warp) runs through every other kernel test.

- the emulated named barriers against an oracle of the hand-off (and a thread that laps one is
  stopped with a message), and a barrier of the data warps alone, which the sync warp's exited
  lanes do not complete;
- a fixed program (ring AllReduce, 2 channels) under Simple and LL, in and out of place, uneven
  count: 0 wrong elements;
- a deadlock: every warp leaves (the run returns, the error record names the wait);
- the sync lane's dependency polls past the counters kept with a primitive (``-DHCCC_DEP_CACHE=1``:
  the examples' second dependencies are read through the primitive's pointer to its slots,
  ``hccc_sprim::deps``): 0 wrong elements;
- the sync lane posting every unit (``-DHCCC_SYNC_POSTS=1``: the next unit released first where its
  inputs were met, so units overlap), Simple and LL, channels, dependencies: 0 wrong elements;
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
import hccc.runtime.cpu_build as cpu_build
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime.launcher import Runner
from hccc.testing import KernelCase, describe_failure, kernel_cases, run_case, valid_programs

from conftest import harness_library
from codegen_irs import ring_allreduce, stuck_ir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

WARP = 4
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A CPU platform whose kernels model warps of WARP threads (its compile commands recorded in
    ``wide.commands``)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(cpu_build, "_CXX_FLAGS", [*cpu_build._CXX_FLAGS, f"-DHCCC_WARP_SIZE={WARP}"])
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
// One TB of nthreads threads run the kernels' hand-off: thread 0 (the sync lane) publishes value
// k in a shared cell and arrives at barrier 1; every thread of the other warps syncs on barrier 1,
// records the cell and arrives at barrier 2, on which thread 0 syncs before the next value. The
// other lanes of warp 0 leave at once (a warp arrives with its exited lanes). `lap`: thread 0
// arrives at barrier 1 twice in a row (what the kernels' protocol never does).
extern "C" __attribute__((visibility("default"))) int hccc_test_handoff(int nthreads, int rounds, int lap,
                                                                        int* seen) {
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, nthreads);
  static volatile int cell;
  struct job { int rounds, lap; int* seen; } j{rounds, lap, seen};
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t)
    ts.emplace_back([&, t] {
      hccc_cpu_run_thread(+[](const job& x) {
        const int t = hccc_tid(), W = HCCC_WARP_SIZE, nt = hccc_nthreads();
        const int nbar = (nt + W - 1) / W * W;
        if (t > 0 && t < W) return;
        for (int k = 0; k < x.rounds; ++k) {
          if (t == 0) {
            cell = 100 + k;
            hccc_bar_arrive(1, nbar);
            if (x.lap) hccc_bar_arrive(1, nbar);
            hccc_bar_sync(2, nbar);
          } else {
            hccc_bar_sync(1, nbar);
            x.seen[t * x.rounds + k] = cell;
            hccc_bar_arrive(2, nbar);
          }
        }
      }, j, &blk, t);
    });
  for (auto& t : ts) t.join();
  return HCCC_WARP_SIZE;
}
// The same hand-off with the data warps' own barrier (3, over their threads only, as the kernels'
// DATA barrier): each data thread stores its round number in a cell of its own (all but the first
// after a pause, so that a barrier completed early is caught), syncs on barrier 3, and the first
// data thread then counts, in *bad, the cells that do not hold the round yet.
extern "C" __attribute__((visibility("default"))) int hccc_test_data_barrier(int nthreads, int rounds,
                                                                             int* bad) {
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, nthreads);
  static volatile int cells[64];
  for (int t = 0; t < 64; ++t) cells[t] = 0;
  struct job { int rounds; int* bad; } j{rounds, bad};
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t)
    ts.emplace_back([&, t] {
      hccc_cpu_run_thread(+[](const job& x) {
        const int t = hccc_tid(), W = HCCC_WARP_SIZE, nt = hccc_nthreads();
        const int nbar = (nt + W - 1) / W * W;
        if (t > 0 && t < W) return;
        for (int k = 0; k < x.rounds; ++k) {
          if (t == 0) {
            hccc_bar_arrive(1, nbar);
            hccc_bar_sync(2, nbar);
          } else {
            hccc_bar_sync(1, nbar);
            if (t != W) std::this_thread::sleep_for(std::chrono::milliseconds(2));
            cells[t] = k + 1;
            hccc_bar_sync(3, nbar - W);
            if (t == W)
              for (int u = W; u < nt; ++u) *x.bad += cells[u] != k + 1;
            hccc_bar_arrive(2, nbar);
          }
        }
      }, j, &blk, t);
    });
  for (auto& t : ts) t.join();
  return HCCC_WARP_SIZE;
}
"""


@pytest.fixture(scope="module")
def handoff_lib(tmp_path_factory):
    import ctypes
    lib, so = harness_library(tmp_path_factory.mktemp("handoff"), HARNESS, "handoff", warp=WARP)
    lib.hccc_test_handoff.restype = ctypes.c_int
    lib.hccc_test_handoff.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.hccc_test_data_barrier.restype = ctypes.c_int
    lib.hccc_test_data_barrier.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib, so


@settings(max_examples=12, deadline=None)
@given(nthreads=st.integers(WARP + 1, 3 * WARP + 3), rounds=st.integers(1, 6))
def test_emulated_named_barriers_hand_each_value_to_every_data_thread(handoff_lib, nthreads, rounds):
    """Oracle: every thread of the data warps (the last warp partial) sees values 100 .. 100 +
    rounds - 1 in order, each exactly once: bar.arrive does not wait, bar.sync completes at the
    barrier's count with the exited lanes of the sync warp and the missing lanes of a partial warp
    counted as arrived, and the barrier orders the cell's store before the reads."""
    import numpy as np
    lib, _ = handoff_lib
    seen = np.full(nthreads * rounds, -1, dtype=np.int32)
    assert lib.hccc_test_handoff(nthreads, rounds, 0, seen.ctypes.data) == WARP
    seen = seen.reshape(nthreads, rounds)
    for t in range(WARP, nthreads):
        assert seen[t].tolist() == [100 + k for k in range(rounds)]
    assert (seen[:WARP] == -1).all()


@settings(max_examples=6, deadline=None)
@given(nthreads=st.integers(WARP + 1, 3 * WARP + 3))
def test_a_barrier_of_the_data_warps_alone_waits_for_every_data_thread(handoff_lib, nthreads):
    """Oracle: the data warps' own barrier (the kernels' DATA barrier, which the sync warp does not
    take part in) completes only once every data thread arrived: the sync warp's exited lanes do
    not count for it (a warp arrives with its exited lanes only where one of its lanes arrives),
    the missing lanes of a partial last data warp do."""
    import subprocess
    import sys
    _, so = handoff_lib
    code = ("import ctypes\n"
            f"lib = ctypes.CDLL({str(so)!r})\n"
            "bad = ctypes.c_int(0)\n"
            f"w = lib.hccc_test_data_barrier(ctypes.c_int({nthreads}), ctypes.c_int(3), ctypes.byref(bad))\n"
            "print(w, bad.value)\n")
    # (in a process of its own: a barrier that completes early leaves a thread in a phase of its own)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(WARP), "0"]


def test_a_thread_that_laps_a_named_barrier_stops_the_emulation(handoff_lib):
    """A thread arriving twice in one phase would be counted twice by the hardware: the emulation
    stops the program with a message (checked in a process of its own)."""
    import subprocess
    import sys
    _, so = handoff_lib
    code = ("import ctypes, numpy as np\n"
            f"lib = ctypes.CDLL({str(so)!r})\n"
            "seen = np.zeros(64, dtype=np.int32)\n"
            "lib.hccc_test_handoff(ctypes.c_int(6), ctypes.c_int(3), ctypes.c_int(1), ctypes.c_void_p(seen.ctypes.data))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "arrived twice at named barrier 1 in one phase" in res.stderr


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
    # one warp (the lock-step block), a warp and a partial one, two warps and a lane
    for nthreads, count in ((4, 997), (6, 4 * 3 * 40 + 3), (9, 1001)):
        case = KernelCase(count=count, dtype="float32", op="sum", inplace=inplace, nthreads=nthreads,
                          slice_bytes=64)
        res = run_case(ir, case, backend=wide, proto=proto)
        assert res.ok and res.wrong == 0, describe_failure(case, res)


@pytest.fixture(scope="module")
def one_dep_cached(tmp_path_factory):
    """A CPU platform whose kernels keep one dependency's counter per primitive with it
    (``-DHCCC_DEP_CACHE=1``): every later dependency is polled through the primitive's pointer to its slots."""
    mp = pytest.MonkeyPatch()
    mp.setattr(cpu_build, "_CXX_FLAGS", [*cpu_build._CXX_FLAGS, "-DHCCC_DEP_CACHE=1"])
    plat = cpu.CpuPlatform(opt="-O0", cache_dir=tmp_path_factory.mktemp("dep-cache"))
    try:
        yield plat
    finally:
        plat.close()
        mp.undo()


@pytest.mark.parametrize("example", ["hm_allreduce_2x4", "ring_allgather_8"])
def test_dependencies_past_the_kept_counters_are_polled_through_the_primitives_slots(one_dep_cached, example):
    """The sync lane's dependency polls with one counter kept per primitive: the examples' second
    dependencies take the other path (the slot, through the primitive's pointer, then the counter); 0 wrong elements,
    uneven count, in and out of place, several data threads."""
    from hccc.compiler.frontend.load import load_rccl
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    ir = build_program(load_rccl(root / "examples" / f"{example}.rccl"), chunk_bytes=64)
    for inplace in (False, True):
        case = KernelCase(count=8 * 3 * 40 + 5, dtype="float32", op="sum", inplace=inplace, nthreads=3,
                          slice_bytes=64)
        res = run_case(ir, case, backend=one_dep_cached, proto="simple")
        assert res.ok and res.wrong == 0, describe_failure(case, res)


@pytest.fixture(scope="module")
def sync_posts(tmp_path_factory):
    """A CPU platform whose sync lane posts every unit (``-DHCCC_SYNC_POSTS=1``: the next unit is
    released before the last one is posted where its inputs were met), with warps of WARP threads."""
    mp = pytest.MonkeyPatch()
    mp.setattr(cpu_build, "_CXX_FLAGS", [*cpu_build._CXX_FLAGS, f"-DHCCC_WARP_SIZE={WARP}",
                                         "-DHCCC_SYNC_POSTS=1"])
    plat = cpu.CpuPlatform(opt="-O0", cache_dir=tmp_path_factory.mktemp("sync-posts"))
    try:
        yield plat
    finally:
        plat.close()
        mp.undo()


@pytest.mark.parametrize("proto", ["simple", "ll"])
def test_units_released_before_the_last_is_posted_match_the_oracle(sync_posts, proto):
    """The sync lane's posts (``HCCC_SYNC_POSTS=1``): ring AllReduce on 2 channels, and the examples
    whose thread blocks wait on each other's progress (HM AllReduce 2x4, ring AllGather 8), in and
    out of place, uneven counts, a warp and a partial one or two warps and a lane: 0 wrong
    elements, and every run completes (a unit posted late, or out of order, would leave a peer
    waiting)."""
    from hccc.compiler.frontend.load import load_rccl
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    irs = [with_channels(build_program(_ring(4), chunk_bytes=128), 2)]
    irs += [build_program(load_rccl(root / "examples" / f"{ex}.rccl"), chunk_bytes=64)
            for ex in ("hm_allreduce_2x4", "ring_allgather_8")]
    for ir in irs:
        for inplace in (False, True):
            for nthreads, count in ((6, 8 * 3 * 40 + 5), (9, 1001)):
                case = KernelCase(count=count, dtype="float32", op="sum", inplace=inplace,
                                  nthreads=nthreads, slice_bytes=64)
                res = run_case(ir, case, backend=sync_posts, proto=proto)
                assert res.ok and res.wrong == 0, describe_failure(case, res)


def test_a_deadlock_makes_every_warp_leave(wide):
    """Both ranks receive first: the sync lane times out, raises the abort flag and hands the data
    warps a STOP descriptor; every thread leaves, the run returns and names the wait."""
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
