"""The CPU emulation platform and the platform-neutral launcher.

The generated kernels are compiled with g++ and the emulation header, every thread block runs as a
group of emulated threads (fibers on a pool of OS threads), and the outputs are compared with numpy closed forms of the collectives (an
oracle independent of the reference executor; the launcher's own check against the reference
executor must agree). Covers remainders, many micro-batches with FIFO wrap-around, fused
primitives, cross-TB dependencies, in-place runs, several threads per block with real barriers,
the deadlock report, the host watchdog, the kernel ABI, the build cache and the emulation header.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from hccc.compiler.backend.abi import NSLOTS
from hccc.compiler.backend.codegen import generate
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.runtime import cache, kernel_abi, reference
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.launcher import Runner, run_program
from hccc.runtime.busbw import busbw_factor
from hccc.runtime.platform import PlatformError, get_platform
from codegen_irs import ring_allgather, stuck_ir, ring_allreduce, ring_allreduce_fused

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32}
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


@pytest.fixture(scope="module")
def pf():
    """One CPU platform for the module; -O0 builds (quick to compile)."""
    p = CpuPlatform(opt="-O0")
    yield p
    p.close()


def bounds(count, nchunks):
    return [c * count // nchunks for c in range(nchunks + 1)]


def reduced(x: np.ndarray, op: str, dtype: str) -> np.ndarray:
    return REDUCE[op](x, axis=0).astype(NP[dtype])


def run_check(runner: Runner, inputs, **kw):
    res = runner.run(count=len(inputs[0]) if runner.ir.collective != "allgather" else kw.pop("count"),
                     inputs=inputs, keep_outputs=True, **kw)
    assert res.stuck is None, res.stuck
    assert res.wrong == 0 and res.collective_wrong == 0, res.first_wrong
    return res.outputs


# ---------------------------------------------------------------------------- collectives
@pytest.mark.parametrize("n", [2, 4])
def test_ring_allreduce(pf, n):
    ir = ring_allreduce(n)
    ir.chunk_bytes = 64          # 16 float32 per slice: many micro-batches, FIFO wrap-around
    rng = np.random.default_rng(n)
    cases = [(1000, "float32", "sum", 1), (997, "int32", "max", 2), (3, "int32", "sum", 4),
             (333, "float16", "min", 3), (n * 16 * 9, "int32", "min", 2), (0, "float32", "sum", 2)]
    for count, dtype, op, nt in cases:
        with Runner(ir, pf, dtype, op, nthreads=nt) as runner:
            x = rng.integers(-50, 50, size=(n, count)).astype(NP[dtype])
            outs = run_check(runner, list(x))
            for r in range(n):
                np.testing.assert_array_equal(outs[r], reduced(x, op, dtype), err_msg=f"{count} {dtype} {op} r{r}")
    # in place (input == output), random non-integer floats: the same order of additions as the
    # reference executor, so still exact
    with Runner(ir, pf, "float32", "sum", nthreads=2) as runner:
        x = rng.standard_normal((n, 500)).astype(np.float32)
        outs = run_check(runner, list(x), inplace=True)
        np.testing.assert_allclose(outs[0], x.sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 3])
def test_ring_allreduce_fused(pf, n):
    """Fused primitives (recvReduceSend, recvReduceCopySend, recvCopySend) with nmb < NSLOTS.
    The reference executor refuses this program (it deadlocks with one FIFO slot), so the runs are
    checked against the collective's definition."""
    ir = ring_allreduce_fused(n, name="fused")
    ir.chunk_bytes = 64
    rng = np.random.default_rng(n)
    for count, dtype, op in [(n * 16 * 7, "int32", "sum"), (100, "float32", "max"), (7, "float16", "sum")]:
        with Runner(ir, pf, dtype, op, nthreads=2) as runner:
            x = rng.integers(-9, 9, size=(n, count)).astype(NP[dtype])
            res = runner.run(count=count, inputs=list(x), keep_outputs=True)
            assert res.ok and res.oracle == "definition", (res.stuck, res.first_wrong)
            for r in range(n):
                np.testing.assert_array_equal(res.outputs[r], reduced(x, op, dtype))


@pytest.mark.parametrize("nthreads", [1, 3])
def test_ring_allgather_with_cross_tb_deps(pf, nthreads):
    n = 3
    ir = ring_allgather(n)
    ir.chunk_bytes = 32
    rng = np.random.default_rng(0)
    with Runner(ir, pf, "float32", "sum", nthreads=nthreads) as runner:
        for count in (300, 301, 2, 96, 0):
            b = bounds(count, n)
            full = rng.standard_normal(count).astype(np.float32)
            parts = [full[b[r]:b[r + 1]] for r in range(n)]
            for inplace in (False, True):
                outs = run_check(runner, parts, count=count, inplace=inplace)
                for r in range(n):
                    np.testing.assert_array_equal(outs[r], full)


def test_bfloat16_rounds_like_the_reference(pf):
    """bf16 sums of values that do not stay exact: every partial sum is rounded to bf16, in the
    program's order, exactly as the reference executor does."""
    n = 4
    ir = ring_allreduce(n)
    ir.chunk_bytes = 64
    rng = np.random.default_rng(1)
    x = reference.round_bf16(rng.standard_normal((n, 777)).astype(np.float32) * 100)
    with Runner(ir, pf, "bfloat16", "sum", nthreads=2) as runner:
        res = runner.run(count=777, inputs=list(x), keep_outputs=True)
        assert res.stuck is None and res.wrong == 0, res.first_wrong
        want = reference.execute(ir, list(x), op="sum", bf16=True)
        for r in range(n):
            np.testing.assert_array_equal(res.outputs[r], want[r])
            # bf16 values: the low 16 bits are zero
            assert not (res.outputs[r].view(np.uint32) & 0xFFFF).any()


# ---------------------------------------------------------------------------- failures
@pytest.mark.parametrize("nthreads", [1, 4])
def test_deadlock_times_out_reports_and_aborts(pf, nthreads):
    """The timeout names rank, TB, primitive and chunk, and every TB exits (the run returns)."""
    with Runner(stuck_ir(), pf, "float32", "sum", nthreads=nthreads, timeout_s=0.2) as runner:
        res = runner.run(count=16)
        assert res.stuck is not None and res.wrong == 0
        m = re.match(r"rank ([01]), TB 0 stuck in recv for chunk ([01]) \(micro-batch 0\): waiting for "
                     r"data from rank ([01])", res.stuck)
        assert m, res.stuck
        r, c, peer = (int(g) for g in m.groups())
        assert c == 1 - r and peer == 1 - r
        # the runner stays usable: a second run reports again
        assert runner.run(count=40).stuck is not None


def test_host_watchdog_aborts_when_kernels_never_time_out(pf):
    with Runner(stuck_ir(), pf, "float32", "sum", nthreads=2, timeout_s=0, watchdog_s=0.5) as runner:
        res = runner.run(count=16)
        assert res.stuck is not None and res.stuck.startswith(
            "host watchdog: kernel still running after 0.5 s; aborted"), res.stuck   # as a job says


def test_wrong_program_is_counted(pf):
    """A receive that drops a contribution: the kernels agree with the reference run of the IR,
    but that run is not the collective, which the result says."""
    ir = ring_allreduce(3)
    ir.chunk_bytes = 64
    i = int(np.flatnonzero(ir.prims["op"] == Op.RECV_REDUCE_COPY)[0])
    ir.prims["op"][i] = Op.RECV
    ir.prims["src_buf"][i] = Buf.NONE
    ir.prims["src_off"][i] = 0
    with Runner(ir, pf, "int32", "sum") as runner:
        res = runner.run(count=99)
        assert res.stuck is None and res.wrong == 0
        assert res.collective_wrong > 0 and not res.ok
        assert "allreduce needs" in res.first_wrong


def test_structurally_invalid_ir_is_refused(pf):
    from hccc.compiler.ir.program_ir import IRFormatError
    ir = ring_allreduce(2)
    ir.prims["send_peer"][0] = 7
    with pytest.raises(IRFormatError):
        Runner(ir, pf)


def test_too_many_threads_are_refused():
    pf = CpuPlatform(opt="-O0", max_threads=8)
    with pytest.raises(PlatformError, match="resident"):
        Runner(ring_allreduce(4), pf, nthreads=2)


def test_a_program_over_the_thread_budget_is_told_the_budget_that_runs_it(monkeypatch):
    """At one thread per block the emulation's only limit is its thread budget: the refusal names
    ``HCCC_CPU_MAX_THREADS`` and the budget the program needs (it said "use fewer threads per
    block", which it already was, for a synthesised 20-GPU ReduceScatter of 8,554 blocks), and
    that budget runs it."""
    ir = ring_allreduce(4)                     # 8 thread blocks in all
    with pytest.raises(PlatformError, match="HCCC_CPU_MAX_THREADS=8 ") as exc:
        Runner(ir, CpuPlatform(max_threads=7))
    assert "thread budget of 7" in str(exc.value) and "fewer threads" not in str(exc.value)
    with pytest.raises(PlatformError, match="use fewer threads per block, or .*HCCC_CPU_MAX_THREADS=16 "):
        Runner(ir, CpuPlatform(max_threads=15), nthreads=2)
    monkeypatch.setenv("HCCC_CPU_MAX_THREADS", "8")
    with Runner(ir, CpuPlatform()) as runner:
        res = runner.run(count=1000)
        assert res.nthreads == 1 and res.wrong == 0


def test_the_thread_budget_follows_the_environment_and_the_system(monkeypatch):
    from hccc.runtime import cpu
    limits = cpu._system_thread_limits()                 # this machine's: half of the fibers its mappings allow
    with open("/proc/sys/vm/max_map_count") as f:
        assert limits == [int(f.read()) // 4]
    monkeypatch.delenv("HCCC_CPU_MAX_THREADS", raising=False)
    assert cpu.thread_budget() == max(64, min([cpu.MAX_THREADS, *limits]))
    monkeypatch.setattr(cpu, "_system_thread_limits", lambda: [])
    assert cpu.thread_budget() == cpu.MAX_THREADS == CpuPlatform().max_threads
    monkeypatch.setattr(cpu, "_system_thread_limits", lambda: [5000])
    assert cpu.thread_budget() == 5000
    monkeypatch.setattr(cpu, "_system_thread_limits", lambda: [3])
    assert cpu.thread_budget() == 64
    monkeypatch.setenv("HCCC_CPU_MAX_THREADS", " 123 ")
    assert cpu.thread_budget() == 123
    for bad in ("abc", "0", "-5", "1e4"):
        monkeypatch.setenv("HCCC_CPU_MAX_THREADS", bad)
        with pytest.raises(PlatformError, match="HCCC_CPU_MAX_THREADS must be a positive number"):
            CpuPlatform()


# ---------------------------------------------------------------------------- API details
def test_run_program_and_sizes(pf):
    ir = ring_allreduce(4)
    ir.chunk_bytes = 64
    res = run_program(ir, backend=pf, nbytes=4096, dtype="float16", op="max", iters=2, warmup=1)
    assert res.ok and res.count == 2048 and res.bytes == 4096 and res.iters == 2
    assert res.time_us > 0 and res.algbw_GBps == pytest.approx(4096 / (res.time_us * 1e3))
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * 1.5)
    js = res.to_json()
    assert set(js) >= {"bytes", "dtype", "op", "wrong", "time_us", "algbw_GBps", "busbw_GBps", "stuck"}
    with pytest.raises(ValueError, match="whole number"):
        run_program(ir, backend=pf, nbytes=4097, dtype="float32")


def test_busbw_factor_closed_forms():
    for n in (1, 2, 3, 8, 32):
        assert busbw_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
        assert busbw_factor("allgather", n) == pytest.approx((n - 1) / n)
        assert busbw_factor("reducescatter", n) == pytest.approx((n - 1) / n)
        assert busbw_factor("broadcast", n) == 1.0 and busbw_factor("Reduce", n) == 1.0
        assert busbw_factor("alltoall", n) == pytest.approx((n - 1) / n)
    with pytest.raises(ValueError):
        busbw_factor("alltoallv", 4)


def test_ranks_without_a_specified_output_are_not_compared(pf, monkeypatch):
    """Where the collective's definition gives None (a Reduce's non-root ranks), neither the
    kernels' output nor the reference run is compared: nothing there counts as wrong."""
    ir = ring_allreduce(3)
    ir.chunk_bytes = 64
    i = int(np.flatnonzero(ir.prims["op"] == Op.RECV_REDUCE_COPY)[0])
    ir.prims["op"][i] = Op.RECV                     # drops a contribution: not the collective
    ir.prims["src_buf"][i] = Buf.NONE
    ir.prims["src_off"][i] = 0
    inputs = reference.make_inputs("allreduce", 3, 99, "int32", seed=5)
    real_expected, real_execute = reference.expected, reference.execute
    with Runner(ir, pf, "int32", "sum") as runner:
        base = runner.run(count=99, inputs=inputs, keep_outputs=True)
        want = real_expected("allreduce", inputs, "sum", nchunks=ir.nchunks)
        per_rank = {r: int((base.outputs[r] != want[r]).sum()) for r in range(3)}
        assert base.wrong == 0 and base.collective_wrong == sum(per_rank.values()) > 0

        def unspecified(ranks):
            def expected(*a, **k):
                return [None if r in ranks else x for r, x in enumerate(real_expected(*a, **k))]
            return expected

        for skip in ({0}, {1, 2}, {0, 1, 2}):
            monkeypatch.setattr(reference, "expected", unspecified(skip))
            res = runner.run(count=99, inputs=inputs)
            left = sum(n for r, n in per_rank.items() if r not in skip)
            assert res.wrong == 0 and res.collective_wrong == left and res.ok == (left == 0)

        # the kernels' output of an unspecified rank may differ from the reference run, too
        k = 1

        def corrupted(*a, **kw):
            out = real_execute(*a, **kw)
            out[k] = out[k] + 1
            return out

        monkeypatch.setattr(reference, "execute", corrupted)
        monkeypatch.setattr(reference, "expected", unspecified({k}))
        res = runner.run(count=99, inputs=inputs)
        assert res.wrong == 0
        monkeypatch.setattr(reference, "expected", unspecified(set()))
        res = runner.run(count=99, inputs=inputs)
        assert res.wrong == len(base.outputs[k]) and res.first_wrong.startswith(f"rank {k},")


def test_kernel_abi_matches_the_header(pf, tmp_path):
    """The struct sizes the host packs equal the C++ sizeof of the emitted header's structs (the
    module checks it at load), and the error record decodes."""
    # hccc_args: 13 words, ll_epoch (+ padding), the AllToAllv words vcounts, vdispls, vmap, vslot,
    # then the launch's slot capacity slot_cap; hccc_conn: three pointers, its place and a pad word
    assert kernel_abi.sizes() == (160, 32, 56)
    ir = ring_allreduce(2)
    with Runner(ir, pf) as runner:
        out = (ctypes.c_uint64 * 4)()
        runner.platform.load(runner.libraries["cuda"]).lib.hccc_cpu_abi(out)   # the module the run built
        assert tuple(out[:3]) == kernel_abi.sizes() and out[3] == NSLOTS
    e = kernel_abi.ErrorRecord(claimed=1, valid=1, rank=3, tb=2, seq=1, op=int(Op.RECV_REDUCE_COPY),
                               wait=kernel_abi.WAIT_DATA, chunk=5, task=9, microbatch=4, waited=2000)
    from hccc.runtime.kernel_errors import describe_stuck
    msg = describe_stuck(ir, e, 1000.0)
    assert msg.startswith("rank 3, TB 2 stuck in recv_reduce_copy for chunk 5 (micro-batch 4)")


def test_platform_memory(pf):
    for n in (1, 100, 4096, 1 << 17):
        p = pf.malloc(n)
        assert p % 256 == 0
        a = np.arange(n, dtype=np.uint8)
        pf.memcpy_htod(p, a)
        b = np.empty(n, np.uint8)
        pf.memcpy_dtoh(b, p)
        np.testing.assert_array_equal(a, b)
        pf.memset(p, 7, n)
        pf.memcpy_dtoh(b, p)
        assert (b == 7).all()
        with pytest.raises(PlatformError, match="outside"):
            pf.memcpy_dtoh(np.empty(n + 1, np.uint8), p)
        pf.free(p)
    with pytest.raises(PlatformError):
        pf.free(12345)


def test_platform_memory_is_shared_by_threads_at_once(monkeypatch):
    """The ranks of an in-process job share one platform: threads that allocate, copy and free at
    once (the interpreter switching threads as often as it can, and inside every search of the
    sorted book of allocations) each read back what they wrote, every copy is checked against its
    own allocation, and the book ends empty."""
    import bisect
    import sys
    import threading
    import time
    import types
    from hccc.runtime import cpu_memory
    from hccc.runtime.cpu_memory import CpuMemory

    def yielding(fn):
        def call(*a):
            time.sleep(0)              # another thread runs here
            out = fn(*a)
            time.sleep(0)
            return out
        return call
    monkeypatch.setattr(cpu_memory, "bisect", types.SimpleNamespace(
        bisect_left=yielding(bisect.bisect_left), bisect_right=yielding(bisect.bisect_right),
        insort=yielding(bisect.insort)))
    mem = CpuMemory(sanitize=False)
    errors: list = []

    def work(t: int) -> None:
        try:
            rng = np.random.default_rng(t)
            for _ in range(150):
                n = int(rng.choice([1, 100, 4096, 1 << 16]))
                p = mem.malloc(n)
                a = rng.integers(0, 256, n, dtype=np.uint8)
                mem.memcpy_htod(p, a)
                b = np.empty(n, np.uint8)
                mem.memcpy_dtoh(b, p)
                if not np.array_equal(a, b):
                    errors.append(f"thread {t}: read back differs")
                mem.free(p)
        except Exception as exc:       # reported by the test, never lost in a thread
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert mem._allocs == {} and mem._starts == [] and mem._sizes == {}


def test_get_platform_cpu_and_cuda_errors():
    assert get_platform("cpu").name == "cpu"
    with pytest.raises(PlatformError, match="unknown backend"):
        get_platform("tpu")


# ---------------------------------------------------------------------------- the emulation header
EMU_TEST = r"""
#define HCCC_PLATFORM_CPU 1
#include "hccc_prims.h"
#include <thread>
#include <vector>
// Every thread writes its tid into a block-shared array; after the barrier, each thread checks
// what every other thread of its block wrote, and that the leader's block-shared value is its
// own block's (so the arena is shared within a block and private to it).
static int failures = 0;
void body() {
  HCCC_SHARED_VAR(int, who);
  HCCC_SHARED_VAR(int[64], seen);
  for (int round = 0; round < 200; ++round) {
    if (hccc_tid() == 0) who = hccc_block() * 1000 + round;
    seen[hccc_tid()] = hccc_block() * 100 + hccc_tid() + round;
    hccc_barrier();
    for (int t = 0; t < hccc_nthreads(); ++t)
      if (seen[t] != hccc_block() * 100 + t + round) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    if (who != hccc_block() * 1000 + round) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    hccc_barrier();
  }
}
int main() {
  const int nb = 5, nt = 7;
  std::vector<hccc_cpu_block> blocks(nb);
  std::vector<std::thread> th;
  for (int b = 0; b < nb; ++b) hccc_cpu_block_init(&blocks[b], b, nt);
  for (int b = 0; b < nb; ++b)
    for (int t = 0; t < nt; ++t)
      th.emplace_back([&, b, t] { hccc_cpu_run_thread([](int) { body(); }, 0, &blocks[b], t); });
  for (auto& x : th) x.join();
  printf("failures %d\n", failures);
  return failures != 0;
}
"""


def _built_against_the_emitted_headers(tmp_path, source: str, std: str = "c++17"):
    """``source`` compiled (g++, -Wall) with the headers a program emits, into an executable."""
    gen = tmp_path / "gen"
    gen.mkdir()
    generate(ring_allreduce(2), gen, platforms=["cuda", "cuda"])
    (tmp_path / "t.cpp").write_text(source)
    exe = tmp_path / "t"
    res = subprocess.run(["g++", f"-std={std}", "-O1", "-pthread", "-Wall", "-I", str(gen),
                          str(tmp_path / "t.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return exe


@pytest.mark.parametrize("std", ["c++17", "c++20"])
def test_emulation_header_blocks_barriers_and_shared_storage(tmp_path, std):
    exe = _built_against_the_emitted_headers(tmp_path, EMU_TEST, std)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "failures 0", out.stdout + out.stderr


WAIT_TEST = r"""
#define HCCC_PLATFORM_CPU 1
#include "hccc_prims.h"
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
static void away() { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }
int main(int argc, char** argv) {
  // One wait whose thread is away 3 ms between its pauses (a thread among a thousand on two
  // cores): the flag holds its value, so the pauses are one streak (they sleep after the yields).
  uint64_t flag = 5;
  for (int i = 0; i < 12; ++i) {
    hccc_poll_peer(&flag);
    away();
    hccc_spin_pause();
  }
  printf("same_wait %u\n", hccc_cpu_self.streak);
  // The flag moved: a new wait, a new streak.
  flag = 6;
  hccc_poll_peer(&flag);
  away();
  hccc_spin_pause();
  printf("new_wait %u\n", hccc_cpu_self.streak);
  // A chain of threads, each waiting for its flag, then posting the next one's: every waiter
  // sleeps (as long as a sleep may get) before the chain reaches it, and each post wakes it.
  const int n = argc > 1 ? atoi(argv[1]) : 1000;
  std::vector<uint64_t> flags(n + 1, 0);
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i)
    th.emplace_back([&, i] {
      while (hccc_poll_peer(&flags[i]) < 1) hccc_spin_pause();
      hccc_post_peer(&flags[i + 1], 1);
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));   // every waiter asleep by now
  const auto t0 = std::chrono::steady_clock::now();
  hccc_post_peer(&flags[0], 1);
  for (auto& x : th) x.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("chain %d %.3f\n", (int)flags[n], s);
  return 0;
}
"""


def test_a_wait_is_one_streak_however_long_its_thread_is_away_and_posts_wake_sleepers(tmp_path):
    """The emulation's spin-wait escalates from yielding to sleeping within one wait even when its
    thread goes unscheduled for milliseconds between pauses (a thousand threads on two cores: a
    streak that restarted there would only yield, and a thread block with work to do waited behind
    all of them until the run's timeout called it stuck), and a post wakes a sleeping waiter at
    once, not at the end of its sleep: a chain of a thousand sleeping waiters runs through in well
    under one sleep a link (64 ms at the longest)."""
    exe = _built_against_the_emitted_headers(tmp_path, WAIT_TEST)
    out = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    got = dict((line.split()[0], line.split()[1:]) for line in out.stdout.splitlines())
    assert int(got["same_wait"][0]) >= 11, out.stdout     # twelve pauses, one streak
    assert int(got["new_wait"][0]) == 0, out.stdout
    assert int(got["chain"][0]) == 1, out.stdout
    # every link a sleep's length would take 1000 x 64 ms = 64 s; woken by its post, seconds
    assert float(got["chain"][1]) < 20.0, out.stdout


# ---------------------------------------------------------------------------- the build cache
def _publish(args):
    root, key, tag = args
    from hccc.runtime import cache as c

    def build(tmp):
        (tmp / "value").write_text(tag)
    return str(c.entry("race", key, build, root=root)), (c.entry("race", key, build, root=root) / "value").read_text()


#: the processes of the cache's races: forked (a spawned one imported this module again, about
#: half a second of CPU each); each is a process of its own, with its own pid, file descriptors and
#: locks, which is all the cache's turns and renames see
RACE_CONTEXT = "fork"


def test_cache_entry_is_atomic_under_concurrent_builders(tmp_path):
    key = cache.content_key("race", 1)
    ctx = multiprocessing.get_context(RACE_CONTEXT)
    with ctx.Pool(4) as pool:
        got = pool.map(_publish, [(str(tmp_path), key, f"w{i}") for i in range(8)])
    paths = {p for p, _ in got}
    values = {v for _, v in got}
    assert len(paths) == 1 and len(values) == 1        # everyone uses the one published entry
    leftovers = [p.name for p in (tmp_path / "race").iterdir() if p.name != key]
    assert leftovers == []                              # losers cleaned up their private copies


def _build_counted(root, key, log, fail, start, results):
    import os as _os
    import time as _time
    from hccc.runtime import cache as c

    def build(tmp):
        with open(log, "a") as f:
            f.write(f"{_os.getpid()}\n")
        _time.sleep(0.5)
        if fail:
            raise RuntimeError("compiler failed")
        (tmp / "value").write_text("v")
    start.wait()
    try:
        results.put(str(c.entry("turns", key, build, root=root)))
    except RuntimeError:
        results.put(None)


@pytest.mark.parametrize("fail", [False, True])
def test_cache_entry_is_built_once_by_processes_that_want_it_at_once(tmp_path, fail):
    """Processes that miss the same entry at once (a job's ranks, each in its own process) take
    turns: the first builds it and the others use its entry (one build, not one per process); where
    that build fails, the next in turn tries again (every process builds, each failing)."""
    key = cache.content_key("turns", fail)
    log = tmp_path / "builds.log"
    ctx = multiprocessing.get_context(RACE_CONTEXT)
    start, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_build_counted, args=(str(tmp_path / "c"), key, str(log), fail, start, results))
             for _ in range(4)]
    for q in procs:
        q.start()
    got = [results.get(timeout=120) for _ in procs]
    for q in procs:
        q.join(30)
    builds = log.read_text().split()
    if fail:
        assert got == [None] * 4 and len(builds) == 4
    else:
        assert len(set(got)) == 1 and None not in got and len(builds) == 1, builds
    assert [q.name for q in (tmp_path / "c" / "turns").iterdir()] == ([] if fail else [key])


def test_cache_failed_build_leaves_nothing(tmp_path):
    def build(tmp):
        (tmp / "half").write_text("x")
        raise RuntimeError("compiler failed")
    key = cache.content_key("fail")
    with pytest.raises(RuntimeError):
        cache.entry("k", key, build, root=tmp_path)
    assert list((tmp_path / "k").iterdir()) == []


def test_cache_keys():
    assert cache.content_key("ab", "c") != cache.content_key("a", "bc")   # parts are delimited
    assert cache.content_key(b"x") == cache.content_key("x")
    with pytest.raises(ValueError):
        cache.entry("k", "../evil", lambda p: None)


def test_build_is_cached_by_content(tmp_path):
    """A module per program and instance; the precompiled headers one per flags, shared by the
    instances (the instance is a macro each unit defines after them), and g++ really loads them
    for a unit of either instance (-H marks a precompiled header it loads with '!'; one it refuses
    -Winvalid-pch names)."""
    import json
    from hccc.runtime import cpu_build
    from hccc.runtime.platform import Instance
    pf = CpuPlatform(opt="-O0", cache_dir=tmp_path)
    ir = ring_allreduce(2)
    with Runner(ir, pf, "int32", "max", cache_dir=tmp_path) as r1:
        lib1 = r1.libraries["cuda"]
    with Runner(ir, pf, "int32", "max", cache_dir=tmp_path) as r2:
        assert r2.libraries["cuda"] == lib1
    with Runner(ir, pf, "int32", "min", cache_dir=tmp_path) as r3:
        assert r3.libraries["cuda"] != lib1
    pch, = (tmp_path / "cpu_pch").iterdir()
    assert len(list((tmp_path / "cpu_engine").iterdir())) == 2
    out = tmp_path / "src"
    out.mkdir()
    generate(ir, out, platforms=["cuda"] * ir.nranks)
    rank0 = json.loads((out / "manifest.json").read_text())["ranks"][0]["source"]
    for op in ("max", "min"):
        unit = tmp_path / f"unit_{op}.cpp"
        unit.write_text(cpu_build.instance_selector(Instance("int32", op)) + cpu_build.ENGINE_EXTERN
                        + f'#include "{rank0}"\n')
        # (the flags of the Runner's build: all ranks in this process, HCCC_SINGLE_GPU)
        used = subprocess.run(["g++", *cpu_build._CXX_FLAGS, "-O0", "-DHCCC_SINGLE_GPU=1", cpu_build.PCH_DEFINE,
                               "-Winvalid-pch", "-H",
                               "-I", str(pch), "-include", "hccc_prims.h", "-I", str(out), "-fsyntax-only", str(unit)],
                              capture_output=True, text=True, cwd=str(tmp_path))
        assert used.returncode == 0 and f"! {pch}" in used.stderr and "not used" not in used.stderr, used.stderr


def test_build_jobs_from_the_environment(tmp_path, monkeypatch):
    """HCCC_CPU_JOBS sets how many units a build compiles at once (an 8-rank program in one unit
    at 1, in two at 2: at least four ranks a unit); the platform's own argument wins; anything
    but a positive integer is refused by name."""
    import json
    from hccc.runtime import cpu as cpu_module
    from hccc.runtime.platform import Instance
    monkeypatch.delenv("HCCC_CPU_JOBS", raising=False)
    assert cpu_module.build_jobs() == max(1, os.cpu_count() or 1)
    ir = ring_allgather(8)
    out = tmp_path / "src"
    out.mkdir()
    generate(ir, out, platforms=["cuda"] * ir.nranks)
    man = json.loads((out / "manifest.json").read_text())
    for jobs in ("1", "2"):
        monkeypatch.setenv("HCCC_CPU_JOBS", jobs)
        pf = CpuPlatform(opt="-O0", cache_dir=tmp_path / "cache")
        assert pf.jobs == int(jobs) and CpuPlatform(jobs=3).jobs == 3
        lib = pf.build(out, man, Instance("float32", "sum"))
        assert sorted(p.name for p in lib.parent.glob("unit*.cpp")) == [f"unit{i}.cpp" for i in range(int(jobs))]
        # the module's entry gone (its key is the program's, not the units'): the next build
        # compiles its units again, from the precompiled headers and objects this one cached
        shutil.rmtree(lib.parent)
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("HCCC_CPU_JOBS", bad)
        with pytest.raises(PlatformError, match="HCCC_CPU_JOBS"):
            CpuPlatform()


def test_the_compilers_version_is_asked_once_per_process_and_compiler(tmp_path):
    """Every CPU platform's cache keys name the compiler and its version line: asked of the
    compiler once per process (a fake compiler counts how often it is run), not once per platform
    object, and asked again when the compiler's file changes."""
    from hccc.runtime.cpu_build import CpuToolchain
    runs = tmp_path / "runs"
    fake = tmp_path / "fake-c++"

    def write(version: str) -> None:
        fake.write_text(f"#!/bin/sh\necho run >> {runs}\necho '{version}'\n")
        fake.chmod(0o755)
    write("fake c++ 1.0")
    ids = [CpuToolchain(str(fake), "-O0", 1, None).compiler_id() for _ in range(3)]
    assert ids == [f"{fake} fake c++ 1.0"] * 3
    assert runs.read_text().count("run") == 1
    write("fake c++ 2.0.1")
    assert CpuToolchain(str(fake), "-O0", 1, None).compiler_id() == f"{fake} fake c++ 2.0.1"
    assert runs.read_text().count("run") == 2


def test_modules_are_linked_by_gold_where_the_driver_has_it(tmp_path, monkeypatch):
    """A module is linked with gold where g++ has it (readelf: gold's version note), else with the
    toolchain's own linker (a module of its own in the cache); both run right. A linker the
    driver does not have is found missing."""
    from hccc.runtime import cpu_build
    assert not cpu_build.links_with("g++", "-fuse-ld=no-such-linker")
    if not cpu_build.links_with("g++", cpu_build.FAST_LINKER):
        pytest.skip("g++ has no gold linker here")
    ir = ring_allreduce(2)
    libs = {}
    # the user's cache (as the module's other runs): the precompiled headers, engine and launcher,
    # which do not depend on the linker, are those the suite has built; the modules' keys name it
    for gold in (True, False):
        monkeypatch.setattr(cpu_build, "links_with", lambda exe, flag, gold=gold: gold)
        with Runner(ir, CpuPlatform(opt="-O0"), "int32", "max") as r:
            libs[gold] = r.libraries["cuda"]
            assert r.run(count=64).ok
    notes = {g: subprocess.run(["readelf", "-n", str(p)], capture_output=True, text=True).stdout
             for g, p in libs.items()}
    assert libs[True] != libs[False]
    assert "gold" in notes[True] and "gold" not in notes[False], notes


@pytest.mark.slow   # 6 s: three g++ builds of two programs (compile-heavy)
def test_units_start_from_the_precompiled_headers_and_build_the_same_module(tmp_path, monkeypatch):
    """The emitted headers are precompiled once per flags and shared by every program and instance
    (one ``cpu_pch`` entry for two programs and for another instance); g++ really uses it
    (-H marks a precompiled header it loads with '!'); and a library built without it has the
    same code (the same exported kernels, which compute the same results)."""
    import json
    from hccc.runtime import cpu_build
    from hccc.runtime.platform import Instance
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    pf = CpuPlatform(opt="-O0")
    inst = Instance("float32", "sum")
    libs = {}
    for name, ir in (("ar", ring_allreduce(2)), ("ag", ring_allgather(2))):
        out = tmp_path / name
        out.mkdir()
        generate(ir, out, platforms=["cuda"] * ir.nranks)
        man = json.loads((out / "manifest.json").read_text())
        libs[name] = (out, man, pf.build(out, man, inst))
    pch = list((tmp_path / "cache" / "cpu_pch").iterdir())
    assert len(pch) == 1 and (pch[0] / "hccc_prims.h.gch").stat().st_size > 0
    out, man, lib = libs["ar"]
    flags = [*cpu_build._CXX_FLAGS, "-O0"]
    unit = tmp_path / "unit.cpp"
    unit.write_text(cpu_build.instance_selector(inst) + f'#include "{man["ranks"][0]["source"]}"\n')
    used = subprocess.run(["g++", *flags, cpu_build.PCH_DEFINE, "-H", "-I", str(pch[0]), "-include", "hccc_prims.h",
                           "-I", str(out), "-fsyntax-only", str(unit)], capture_output=True, text=True,
                          cwd=str(tmp_path))
    assert used.returncode == 0 and "! " in used.stderr and "hccc_prims.h.gch" in used.stderr, used.stderr
    monkeypatch.setattr(cpu_build.CpuToolchain, "_prims_pch", lambda self, *a: None)
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "plain"))
    plain = CpuPlatform(opt="-O0").build(out, man, inst)
    assert plain != lib
    syms = [subprocess.run(["nm", "-D", "--defined-only", str(x)], capture_output=True, text=True).stdout
            for x in (lib, plain)]
    assert syms[0] == syms[1] and "_r0_float32_sum" in syms[0]
    monkeypatch.undo()
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    pf.build(out, man, Instance("int32", "max"))
    assert len(list((tmp_path / "cache" / "cpu_pch").iterdir())) == 1
    res = run_program(ring_allreduce(2), backend=pf, nbytes=4096, dtype="float32", op="sum", iters=1, warmup=0)
    assert res.ok


@pytest.mark.slow   # 8 s: the engine, headers and two programs built from an empty cache
def test_a_programs_units_take_the_engine_from_the_shared_engine_object(tmp_path, monkeypatch):
    """The engine is compiled once per flags and instance (one ``cpu_engine`` entry for an
    AllReduce and an AllToAll program: it holds both program types' engines) and a program's units
    only declare it: a unit compiled as the build compiles it leaves ``hccc_run`` undefined (nm),
    where the same unit without the declaration defines it; the modules compute right."""
    import json
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.frontend import generators as gen
    from hccc.runtime import cpu_build
    from hccc.runtime.platform import Instance
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    pf = CpuPlatform(opt="-O0")
    inst = Instance("float32", "sum")
    out, irs = None, (ring_allreduce(2), build_program(gen.direct_alltoall(2), chunk_bytes=64))
    for name, ir in zip(("ar", "a2a"), irs):
        d = tmp_path / name
        d.mkdir()
        generate(ir, d, platforms=["cuda"] * ir.nranks)
        man = json.loads((d / "manifest.json").read_text())
        pf.build(d, man, inst)
        out = out or (d, man)
    assert len(list((tmp_path / "cache" / "cpu_engine").iterdir())) == 1
    for ir in irs:
        res = run_program(ir, backend=pf, nbytes=4096, dtype="float32", op="sum", iters=1, warmup=0)
        assert res.ok, ir.name
    d, man = out
    flags = [*cpu_build._CXX_FLAGS, "-O0", cpu_build.instance_define(inst), "-include", "hccc_prims.h", "-I", str(d)]

    def engine_symbols(text):
        unit = tmp_path / "unit.cpp"
        unit.write_text(text + f'#include "{man["ranks"][0]["source"]}"\n')
        subprocess.run(["g++", *flags, "-c", str(unit), "-o", str(tmp_path / "unit.o")], check=True,
                       cwd=str(tmp_path))
        nm = subprocess.run(["nm", str(tmp_path / "unit.o")], capture_output=True, text=True).stdout
        return {line.split()[-2] for line in nm.splitlines() if "hccc_run" in line}
    assert engine_symbols(cpu_build.ENGINE_EXTERN) == {"U"}
    assert engine_symbols("") - {"U"}


@pytest.mark.slow   # g++ builds per rank from an empty cache
def test_a_process_builds_only_its_ranks_and_caches_per_rank(pf, tmp_path, monkeypatch):
    """A process that runs some ranks (one rank per process: ``hccc.Communicator``) compiles only
    their sources: the cache entry is keyed by those ranks' sources, so rank 1's library is reused
    by every later process of rank 1 (no compiler run) and is not rank 2's."""
    import json
    from pathlib import Path
    from hccc.runtime import cpu as cpu_module
    from hccc.runtime.platform import Instance
    ir = ring_allgather(4)
    out = tmp_path / "gen"
    out.mkdir()
    generate(ir, out, platforms=["cuda"] * ir.nranks)
    man = json.loads((out / "manifest.json").read_text())
    units = []          # the text of every translation unit of the algorithm the compiler is given
    real = subprocess.run

    def spy(cmd, *a, **k):
        units.extend(Path(x).read_text() for x in map(str, cmd) if Path(x).name.startswith("unit")
                     and x.endswith(".cpp"))
        return real(cmd, *a, **k)

    monkeypatch.setattr(cpu_module.subprocess, "run", spy)
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))   # an empty cache
    inst = Instance("float32", "sum")
    one = pf.build(out, man, inst, ranks=[1])
    source = {e["rank"]: e["source"] for e in man["ranks"]}
    text = "".join(units)
    assert source[1] in text and not any(source[r] in text for r in (0, 2, 3))
    units.clear()
    assert pf.build(out, man, inst, ranks=[1]) == one and not units      # a cache hit: no compile
    assert pf.build(out, man, inst, ranks=[2]) != one and source[2] in "".join(units)


class _WidePlatform(CpuPlatform):
    """The CPU emulation launching the emitted threads per block (as a GPU does), with a small
    budget of resident threads."""

    def block_threads(self, emitted: int) -> int:
        return 64


def test_runner_fits_threads_per_block_instead_of_refusing():
    """Without ``nthreads`` the Runner halves the threads per block until every block of the run
    can be resident, says so, and the run is right; with ``nthreads`` it refuses as before."""
    from hccc.runtime.rank_kernels import fit_block_threads
    ir = ring_allreduce(4)
    pf = _WidePlatform(max_threads=8 * 32)          # 8 blocks of 32 threads, not of 64
    assert sum(int(n) for n in ir.ntbs) * ir.nchannels == 8
    with Runner(ir, pf) as runner:
        assert "32 threads per thread block instead of the emitted 64" in runner.threads_note
        res = runner.run(count=1000)
        assert res.nthreads == 32 and res.wrong == 0 and not res.stuck
    with pytest.raises(PlatformError, match="resident at once"):
        Runner(ir, _WidePlatform(max_threads=8 * 32), nthreads=64)
    b, note = fit_block_threads(512, "cuda", lambda b: b <= 128)
    assert b == 128 and note.startswith("128 threads per thread block instead of the emitted 512")
    assert fit_block_threads(512, "cuda", lambda b: True) == (512, None)
    assert fit_block_threads(512, "hip", lambda b: b < 64) == (512, None)    # below one warp: refuse
    # never below the sync warp and two data warps (96 threads on CUDA, 192 on HIP): refuse
    assert fit_block_threads(512, "cuda", lambda b: b <= 64) == (512, None)
    assert fit_block_threads(1024, "hip", lambda b: b <= 128) == (1024, None)
    assert fit_block_threads(1024, "hip", lambda b: b <= 256)[0] == 256
    from hccc.runtime.platform import Platform
    assert [Platform.least_block_threads(None, f) for f in ("cuda", "hip")] == [3 * 32, 3 * 64]
    assert "--channels 1" in Platform.residency_advice(None, 2048, 128)
    assert fit_block_threads(2, "cuda", lambda b: b < 2, least=1)[0] == 1


def test_the_cpu_emulation_fits_down_to_one_thread_per_block():
    """The CPU emulation runs kernels of any block size, so with too many thread blocks for its
    thread budget at its default 2 threads it goes down to 1 (not to a GPU's warp, which left
    synthesised tree programs of 4,000+ blocks refused), and the run is right."""
    ir = ring_allreduce(4)
    assert sum(int(n) for n in ir.ntbs) * ir.nchannels == 8
    with Runner(ir, CpuPlatform(max_threads=8)) as runner:      # 8 blocks: of 1 thread, not of 2
        assert "1 thread per thread block instead of the emitted 2" in runner.threads_note
        res = runner.run(count=1000)
        assert res.nthreads == 1 and res.wrong == 0 and not res.stuck
