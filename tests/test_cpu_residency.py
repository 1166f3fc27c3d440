"""The CPU emulation's fibers and its partial-residency mode.

* Emulated GPU threads are fibers on a bounded pool of OS worker threads: a run of thousands of
  emulated threads holds at most ``workers`` threads per module (counted in ``/proc/self/task``
  during the run), and an idle module none.
* Partial residency (``CpuPlatform(resident_blocks=K)``): at most K blocks of a launch run at once,
  admitted in block order. Random programs (``hccc.testing.valid_programs``) with no wait that a
  block not yet resident could leave unmet (:func:`hccc.compiler.ir.block_waits.residency_hazards`,
  checked here against a plain loop over the IR's dependencies and connections) run correctly for
  every K; the others are refused before launch, naming a wait. Forced past the refusal, such a
  program sticks until its timeout, and the report names the waiting block.
"""
from __future__ import annotations

import os
import re
import shutil
import threading
import time

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.ir.block_waits import residency_hazards
from hccc.compiler.backend.abi import NSLOTS
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime.cpu import CpuPlatform, residency_limit, worker_count
from hccc.runtime.launcher import Runner
from hccc.runtime.platform import PlatformError
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs
from codegen_irs import ring_allgather, ring_allgather_fused, ring_allreduce

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

#: worker threads of the platforms here
WORKERS = 2
#: the K the property tests draw from
MAX_K = 3

_PLATFORMS: dict = {}


def platform(resident: int | None) -> CpuPlatform:
    if resident not in _PLATFORMS:
        _PLATFORMS[resident] = CpuPlatform(opt="-O0", workers=WORKERS, resident_blocks=resident)
    return _PLATFORMS[resident]


#: the name the launcher gives its worker threads (cpu_launcher.cpp)
WORKER_NAME = "hccc-cpu-worker"


class LoadsCpu(CpuPlatform):
    """A CPU platform that keeps every module it loads (to count their workers)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.modules: list = []

    def load(self, path):
        module = super().load(path)
        self.modules.append(module)
        return module


def rank_blocks(ir) -> list[int]:
    """Blocks of each rank's launch: its thread blocks, once per channel."""
    return [int(n) * int(ir.nchannels) for n in ir.ntbs]


def os_threads() -> tuple[int, int]:
    """(threads of this process, those of them the emulation's workers)."""
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return len(names), names.count(WORKER_NAME)


# ---------------------------------------------------------------------------- bounded threads
def test_a_run_of_thousands_of_emulated_threads_holds_at_most_the_workers():
    n = 8
    ir = ring_allreduce(n)          # 2 TBs a rank
    ir.chunk_bytes = 64
    pf = LoadsCpu(opt="-O0", workers=WORKERS)
    peak, stop = [0, 0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[:] = [max(a, b) for a, b in zip(peak, os_threads())]
            time.sleep(0.002)

    with Runner(ir, pf, "float32", "sum", nthreads=64, one_grid=False, timeout_s=60) as runner:
        assert runner.run(count=64).ok        # what the runner keeps between runs is started
        deadline = time.monotonic() + 5
        while any(m.os_threads() for m in pf.modules) and time.monotonic() < deadline:
            time.sleep(0.01)
        before = os_threads()[0]
        t = threading.Thread(target=sample)
        t.start()
        try:
            res = runner.run(count=2000)
        finally:
            stop.set()
            t.join()
        assert res.ok, (res.stuck, res.first_wrong)
        emulated = sum(rank_blocks(ir)) * 64
        assert emulated >= 1024
        # every module of the run has at most WORKERS workers, and they ran; besides them, the
        # sampler and the runtime's few waiting threads
        modules = len(pf.modules)
        assert 1 <= peak[1] <= WORKERS * modules, peak
        assert peak[0] <= before + WORKERS * modules + 3, (peak, before)
        # idle: none (a worker leaves once it finds no fiber left, just after the launch ends)
        deadline = time.monotonic() + 5
        while any(m.os_threads() for m in pf.modules) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(m.os_threads() == 0 for m in pf.modules)


def _fiber_stack_mappings() -> int:
    """This process's fiber stacks as the CPU emulation maps them: a private read-write mapping of
    exactly 256 KiB (the launcher's HCCC_CPU_STACK_BYTES) right above a one-page guard mapping with
    no access (what malloc maps for a buffer of that size has no guard page; a thread's stack is
    larger)."""
    page = os.sysconf("SC_PAGE_SIZE")
    n, prev = 0, None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if (hi - lo == 256 * 1024 and parts[1] == "rw-p" and prev is not None
                    and prev[1] == lo and prev[1] - prev[0] == page and prev[2] == "---p"):
                n += 1
            prev = (lo, hi, parts[1])
    return n


def test_an_idle_module_holds_no_fiber_stacks():
    """Once a module's launches have ended (its workers gone), it keeps none of its fibers' stacks:
    a process loads many modules (every test worker does), and each pooled stack is two of the
    system's bounded memory mappings (vm.max_map_count). Kept pools once exhausted them, and a
    long-lived process then could not map stacks or start threads."""
    ir = ring_allreduce(4)
    ir.chunk_bytes = 64
    before = _fiber_stack_mappings()
    for dtype in ("float32", "int32"):          # two modules
        pf = LoadsCpu(opt="-O0", workers=WORKERS)
        with Runner(ir, pf, dtype, "sum", nthreads=32, one_grid=False, timeout_s=60) as runner:
            assert runner.run(count=600).ok
            deadline = time.monotonic() + 5
            while any(m.os_threads() for m in pf.modules) and time.monotonic() < deadline:
                time.sleep(0.01)
    # (the two modules ran 4 x 2 x 32 fibers each; the last worker unmaps its pool as it leaves,
    # just after the module counts it gone)
    deadline = time.monotonic() + 5
    while _fiber_stack_mappings() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _fiber_stack_mappings() <= before


def test_worker_and_residency_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("HCCC_CPU_WORKERS", "3")
    monkeypatch.setenv("HCCC_CPU_RESIDENT_BLOCKS", "2")
    assert worker_count() == 3 and residency_limit() == 2
    pf = CpuPlatform()
    assert pf.workers == 3 and pf.resident_blocks == 2 and pf.launch_residency() == 2
    monkeypatch.delenv("HCCC_CPU_WORKERS")
    monkeypatch.delenv("HCCC_CPU_RESIDENT_BLOCKS")
    assert worker_count() == len(os.sched_getaffinity(0)) and residency_limit() is None
    for name in ("HCCC_CPU_WORKERS", "HCCC_CPU_RESIDENT_BLOCKS"):
        for bad in ("0", "-1", "two"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(PlatformError, match=f"{name} must be a positive number"):
                CpuPlatform()
            monkeypatch.delenv(name)
    with pytest.raises(PlatformError, match="resident_blocks must be a positive integer"):
        CpuPlatform(resident_blocks=0)
    with pytest.raises(PlatformError, match="workers must be a positive integer"):
        CpuPlatform(workers=0)


# ---------------------------------------------------------------------------- partial residency
def plain_hazards(ir, k: int) -> set:
    """The oracle: (rank, block, on_rank, on_block, kind) of every wait that a launch of at most k
    resident blocks per rank may leave unmet, by a plain loop over the dependencies and the
    connections (the k-th send on (sender, receiver, channel) pairs with the k-th receive)."""
    p = {c: [int(x) for x in v] for c, v in ir.prims.items()}
    n = len(p["rank"])
    tbwaits = []   # (waiting prim, awaited prim, kind)
    for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        if p["tb"][a] != p["tb"][b]:
            tbwaits.append((a, b, "dependency"))
    sends, recvs = {}, {}
    for i in sorted(range(n), key=lambda i: (p["rank"][i], p["tb"][i], p["seq"][i])):
        if p["send_peer"][i] >= 0:
            sends.setdefault((p["rank"][i], p["send_peer"][i], p["channel"][i]), []).append(i)
        if p["recv_peer"][i] >= 0:
            recvs.setdefault((p["recv_peer"][i], p["rank"][i], p["channel"][i]), []).append(i)
    for key, ss in sends.items():
        for s, r in zip(ss, recvs[key]):
            tbwaits += [(r, s, "data"), (s, r, "slot")]
    out = set()
    for a, b, kind in tbwaits:
        for c in range(ir.nchannels):
            i = c * int(ir.ntbs[p["rank"][a]]) + p["tb"][a]
            j = c * int(ir.ntbs[p["rank"][b]]) + p["tb"][b]
            same = p["rank"][a] == p["rank"][b]
            if j >= k and (same or j > i):
                out.add((p["rank"][a], i, p["rank"][b], j, kind))
    return out


@settings(max_examples=examples(12), deadline=None)
@given(data=st.data())
def test_random_programs_run_with_k_resident_blocks_or_are_refused(data):
    alg = data.draw(valid_programs(max_ranks=5), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))
    ir = with_channels(ir, data.draw(st.integers(1, 3), label="channels"))
    k = data.draw(st.integers(1, MAX_K), label="K")
    hazards = residency_hazards(ir, k)
    assert {(w.rank, w.block, w.on_rank, w.on_block, w.kind) for w in hazards} == plain_hazards(ir, k)
    # a rank per process checks its own blocks' waits (ProcessRank): together, every rank's
    assert [w for r in range(ir.nranks) for w in residency_hazards(ir, k, [r])] == hazards
    # up to twice the FIFO's slots: a send waits for its receiver's block
    case = data.draw(kernel_cases(ir, dtypes=["float32"], ops=["sum"], max_microbatches=2 * NSLOTS,
                                  threads=(1, 2)), label="case")
    if hazards:   # (a wait on block j >= K: a rank of more than K blocks)
        with pytest.raises(PlatformError, match="resident at once") as exc:
            run_case(ir, case, platform(k), timeout_s=20)
        assert "waits on" in str(exc.value), exc.value
        return
    res = run_case(ir, case, platform(k), timeout_s=20)
    assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks, K={k}): " + describe_failure(case, res)


def test_blocks_that_wait_only_on_their_peers_run_one_at_a_time():
    """Ring AllGather on one forwarding TB and one copy TB per rank, as 3 channels: 6 blocks a rank,
    each replica waiting only on the same replica of its neighbours (the same block index), so it
    runs with one block of a rank resident at a time (up to six micro-batches: the fused ring needs
    fewer than the FIFO's slots)."""
    n = 4
    ir = with_channels(ring_allgather_fused(n), 3)
    ir.chunk_bytes = 64
    assert residency_hazards(ir, 1) == []
    with Runner(ir, platform(1), "float32", "sum", nthreads=2) as runner:
        assert runner.grid_fn is None and max(rank_blocks(ir)) == 6
        for count in (0, 7, 383):
            res = runner.run(count=count, inplace=False)
            assert res.ok, (count, res.stuck, res.first_wrong)


def test_a_rank_whose_blocks_wait_on_each_other_is_refused_and_named():
    ir = ring_allgather(3)           # TB 0 waits on TB 1's receives and TB 2's copy
    ir.chunk_bytes = 32
    with pytest.raises(PlatformError) as exc:
        Runner(ir, platform(1), "float32", "sum", nthreads=1)
    msg = str(exc.value)
    assert re.search(r"rank 0's block 0 \(rank 0 tb 0 seq 0 \(send to rank 1.*\) waits on its block [12]", msg), msg
    assert "HCCC_CPU_RESIDENT_BLOCKS" in msg and "3 blocks" in msg
    # every block resident (K = the blocks of a rank): runs
    with Runner(ir, platform(3), "float32", "sum", nthreads=1) as runner:
        res = runner.run(count=300)
        assert res.ok, (res.stuck, res.first_wrong)


def test_forced_past_the_refusal_the_emulation_finds_the_wait(monkeypatch):
    """Partial residency left unchecked: block 0 of every rank waits on block 2, which is never
    admitted while block 0 holds the one place; the run sticks and the report names the block."""
    from hccc.runtime import local_job, process_rank
    for refusing in (local_job, process_rank):     # the job's refusal and every rank's
        monkeypatch.setattr(refusing, "check_rank_residency", lambda *a, **k: None)
    ir = ring_allgather(3)
    ir.chunk_bytes = 32
    with Runner(ir, platform(1), "float32", "sum", nthreads=1, timeout_s=0.5) as runner:
        assert runner.grid_fn is None   # a launch per rank
        res = runner.run(count=300)
    assert res.stuck is not None, "the run should stick"
    assert re.match(r"rank \d, TB 0 stuck in send for chunk \d+ \(micro-batch 0\): waiting for another "
                    r"thread block of its rank", res.stuck), res.stuck


def test_a_one_grid_launch_is_cooperative_and_refused_when_it_cannot_be_resident():
    ir = ring_allreduce(4)
    ir.chunk_bytes = 64
    with pytest.raises(PlatformError, match="as one grid: the launch is cooperative"):
        Runner(ir, platform(2), "float32", "sum", nthreads=1, one_grid=True)
    # auto: a launch per rank
    with Runner(ir, platform(2), "float32", "sum", nthreads=1) as runner:
        assert runner.grid_fn is None


def test_run_resident_blocks_option(tmp_path, capfd):
    """``hccc run --resident-blocks K``: a program whose blocks wait on each other is refused with
    the waits named (exit 1, no traceback); with K at least a rank's blocks it runs; other backends
    are refused."""
    from hccc.cli import main
    from msccl_texts import allpairs_allreduce
    xml = tmp_path / "allpairs.xml"
    xml.write_text(allpairs_allreduce(2, 3))
    assert main(["run", str(xml), "--resident-blocks", "1", "--bytes", "100"]) == 1
    err = capfd.readouterr().err
    assert "hccc: error: cannot run allpairs_2x3 with at most 1 block of a rank resident at once" in err, err
    assert "waits on its block 1" in err and "Traceback" not in err, err
    assert os.environ.get("HCCC_CPU_RESIDENT_BLOCKS") is None     # the option's setting is undone
    assert main(["run", str(xml), "--resident-blocks", "64", "--bytes", "4,100", "--json"]) == 0
    assert '"ok": true' in capfd.readouterr().out.replace("True", "true")
    assert main(["run", str(xml), "--resident-blocks", "2", "--backend", "cuda"]) == 2
    assert "--resident-blocks needs --backend cpu" in capfd.readouterr().err


def _run_in_child(q):
    from codegen_irs import stuck_ir
    with Runner(stuck_ir(), CpuPlatform(opt="-O0", workers=WORKERS), "float32", "sum", nthreads=2,
                timeout_s=0.5) as runner:
        q.put(runner.run(count=16).stuck)


def test_a_process_forked_while_workers_run_runs_kernels_of_its_own():
    """The parent's worker threads (and any lock they held) are not in a forked child: the child's
    launches of the same module get a scheduler of their own instead of waiting on workers that do
    not exist there (its kernels run, time out and report where they are stuck)."""
    import multiprocessing
    from codegen_irs import stuck_ir
    pf = LoadsCpu(opt="-O0", workers=WORKERS)
    with Runner(stuck_ir(), pf, "float32", "sum", nthreads=2, timeout_s=4) as stuck:
        t = threading.Thread(target=stuck.run, kwargs={"count": 16})
        t.start()
        try:
            time.sleep(0.5)                     # its fibers wait on their workers now
            assert any(m.os_threads() for m in pf.modules)
            ctx = multiprocessing.get_context("fork")
            q = ctx.Queue()
            child = ctx.Process(target=_run_in_child, args=(q,))
            child.start()
            child.join(60)
            if child.is_alive():
                child.kill()
                child.join()
                pytest.fail("the forked child's run hung")
            assert child.exitcode == 0
            report = q.get(timeout=5)
            assert re.match(r"rank [01], TB 0 stuck in recv", report or ""), report
        finally:
            t.join()
