"""benchmarks/vs_nccl.py and benchmarks/gpu_common.py without a GPU: the NCCL version gate, the
copy-bound arithmetic (hypothesis), how rank files become rows and ratios, the step runner's
process groups, a run end to end on the CPU emulation (table and JSON), and steps that fail or hang
reported in their rows, not fatal. The GPU side (NCCL, CUDA IPC, CUDA events) runs only on a GPU
(marked ``gpu``)."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from conftest import cuda_platform_or_skip

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    if name not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


common = _load("gpu_common")
vs = _load("vs_nccl")


# ------------------------------------------------------------------------------ the NCCL gate
@pytest.mark.parametrize("version,runs", [((2, 28, 9), False), (22809, False), ([2, 29, 7], False),
                                          ((2, 30, 0), True), (23000, True), ((2, 31, 2), True), ((3, 0, 1), True),
                                          (2708, False)])
def test_the_version_gate(version, runs):
    ok, line = common.nccl_gate(version)
    assert ok is runs
    if not runs:
        assert line.endswith("cannot run several ranks on one GPU (needs 2.30+): compared with the copy bound only")
    else:
        assert "several ranks on one GPU" in line and "cannot" not in line


def test_the_gate_names_the_version_torch_loads():
    assert common.nccl_gate((2, 28, 9))[1] == ("NCCL 2.28.9 cannot run several ranks on one GPU (needs 2.30+): "
                                               "compared with the copy bound only")
    assert common.nccl_version(22809) == (2, 28, 9) and common.nccl_version(2708) == (2, 7, 8)
    assert common.nccl_gate(None) == (False, "torch has no NCCL: compared with the copy bound only")


@pytest.mark.parametrize("backend,probe,runs,says", [
    ("cpu", None, False, "no CUDA GPU: skipped"),
    ("cuda", {"cuda": False, "nccl": [2, 30, 0]}, False, "no CUDA GPU: skipped"),
    ("cuda", None, False, "NCCL not probed (exit 1: boom): skipped"),
    ("cuda", {"cuda": True, "nccl": [2, 28, 9]}, False, "NCCL 2.28.9 cannot run several ranks"),
    ("cuda", {"cuda": True, "nccl": [2, 30, 0]}, True, "NCCL 2.30.0: several ranks on one GPU"),
])
def test_nccl_runs_only_on_a_gpu_with_2_30(tmp_path, backend, probe, runs, says):
    got, line, _ = vs.nccl_decision(backend, probe, "exit 1: boom")
    assert got is runs and says in line
    args = vs.parse_args(["--backend", backend, "--ranks", "2,4", "--sizes", "4K,1M"])
    steps = vs.plan(args, tmp_path, got)
    nccl = [s for s in steps if s.impl == "nccl"]
    assert len(nccl) == (6 if runs else 0)                 # (collective, N) each
    assert all(s.env["NCCL_MULTI_RANK_GPU_ENABLE"] == "1" and "LD_PRELOAD" not in s.env for s in nccl)
    assert {s.impl for s in steps} - {"nccl"} == {"comm-ring", "comm-direct", "grid-ring", "grid-direct"}


def test_nccl_lib_is_preloaded_into_the_nccl_workers_only(tmp_path):
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"")
    args = vs.parse_args(["--ranks", "2", "--sizes", "4K", "--nccl-lib", str(lib)])
    steps = vs.plan(args, tmp_path, True)
    assert all(s.env.get("LD_PRELOAD", "").startswith(str(lib)) for s in steps if s.impl == "nccl")
    assert all("LD_PRELOAD" not in s.env for s in steps if s.impl != "nccl")


@pytest.mark.parametrize("argv,msg", [
    (["--ranks", "1"], "every rank count must be at least 2"),
    (["--ranks", "two"], "--ranks must be a list of integers"),
    (["--ranks", "3", "--sizes", "4K"], "size 4096 B is not a positive multiple of 4 x 3 bytes"),
    (["--sizes", "lots"], "--sizes must be sizes"),
    (["--impls", "mpi"], "unknown implementation 'mpi'"),
    (["--collectives", "alltoall"], "unknown collective 'alltoall'"),
    (["--iters", "0"], "must be positive"),
    (["--nccl-lib", "/nonexistent/libnccl.so.2"], "no such file"),
])
def test_bad_arguments_exit_1_with_a_message(argv, msg, capsys):
    assert vs.main(["--backend", "cpu", *argv]) == 1
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


# ------------------------------------------------------------------------------ the copy bound
COLLS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")


@given(coll=st.sampled_from(COLLS), n=st.integers(2, 64), k=st.integers(1, 1 << 20),
       hbm=st.floats(1.0, 1e4), slow=st.floats(1.0, 1e3), inplace=st.booleans())
def test_the_copy_bound_arithmetic(coll, n, k, hbm, slow, inplace):
    size = 4 * n * k
    h = common.hbm_bytes(coll, n, size, inplace)
    # at least what must be written (each rank's output; a ReduceScatter's S/N each) and read once
    must_write = size if coll in ("reducescatter", "reduce") else (n - 1) * size if inplace else n * size
    assert h >= must_write + size
    assert h <= 2 * n * size
    assert common.hbm_bytes(coll, n, size, True) <= common.hbm_bytes(coll, n, size, False)
    b = common.bound_us(coll, n, size, hbm, inplace)
    assert b == pytest.approx(h / (hbm * 1e3), rel=1e-12)
    # a kernel `slow` times the bound: its ratio (busbw over the bound's busbw) is 1 / slow
    t = b * slow
    ratio = common.busbw_gbps(coll, n, size, t) / common.bound_busbw(coll, n, size, hbm, inplace)
    assert ratio == pytest.approx(1.0 / slow, rel=1e-9)
    # twice the size, twice the bound; twice the bandwidth, half of it
    assert common.bound_us(coll, n, 2 * size, hbm, inplace) == pytest.approx(2 * b, rel=1e-12)
    assert common.bound_us(coll, n, size, 2 * hbm, inplace) == pytest.approx(b / 2, rel=1e-12)


def test_the_formulas_of_the_docstring():
    S = 1 << 20
    assert common.hbm_bytes("allreduce", 8, S) == 16 * S
    assert common.hbm_bytes("AllGather", 8, S) == 9 * S and common.hbm_bytes("allgather", 8, S, True) == 8 * S
    assert common.hbm_bytes("reduce_scatter", 8, S) == 9 * S
    assert common.hbm_bytes("broadcast", 8, S, True) == 8 * S
    with pytest.raises(ValueError, match="no HBM bound for collective 'gather'"):
        common.hbm_bytes("gather", 8, S)


def _row(coll, n, impl, size, t, status="ok"):
    r = vs.make_row(coll, n, impl, size, {"wrong": 0, "time_us": t, "iters": 3} if t else None, status)
    return r


def test_ratios_are_against_nccl_where_it_ran_else_against_the_copy_bound():
    rows = [_row("allreduce", 8, "nccl", 1 << 20, 100.0), _row("allreduce", 8, "comm-ring", 1 << 20, 400.0),
            _row("allreduce", 8, "grid-ring", 4096, 50.0), _row("allreduce", 8, "nccl", 4096, None, "skipped"),
            _row("allgather", 4, "grid-direct", 4096, 20.0)]
    out = vs.add_bounds_and_ratios(rows, 2000.0)
    by = {(r["collective"], r["bytes"], r["impl"]): r for r in out}
    # a bound row per (collective, N, size), first in its group
    assert [r["impl"] for r in out] == ["copy bound", "nccl", "comm-ring", "copy bound", "grid-ring", "nccl",
                                        "copy bound", "grid-direct"]
    bound = by[("allreduce", 1 << 20, "copy bound")]
    assert bound["time_us"] == pytest.approx(16 * (1 << 20) / 2e6)        # 2 N S at 2,000 GB/s
    hccc = by[("allreduce", 1 << 20, "comm-ring")]
    assert hccc["ratio_to"] == "nccl" and hccc["ratio"] == pytest.approx(0.25)
    nccl = by[("allreduce", 1 << 20, "nccl")]
    assert nccl["ratio_to"] == "copy bound" and nccl["ratio"] == pytest.approx(bound["time_us"] / 100.0)
    small = by[("allreduce", 4096, "grid-ring")]
    assert small["ratio_to"] == "copy bound"          # NCCL skipped there
    assert small["ratio"] == pytest.approx(by[("allreduce", 4096, "copy bound")]["time_us"] / 50.0)
    assert small["busbw"] == pytest.approx(4096 / 50e3 * 2 * 7 / 8)
    # no copy measured: no bound rows, ratios only against NCCL
    again = vs.add_bounds_and_ratios([_row("allgather", 4, "grid-direct", 4096, 20.0)], None)
    assert [r["impl"] for r in again] == ["grid-direct"] and again[0]["ratio"] is None


def test_rank_files_combine_into_the_slowest_rank_per_iteration_then_the_median():
    lines = {"rank0": [{"size": 4096, "times_us": [10.0, 30.0, 20.0], "wrong": 0, "proto": "ll"},
                       {"size": 8192, "times_us": [5.0], "wrong": 2,
                        "first_wrong": "element 3: got 1.0, expected 2.0"}],
             "rank1": [{"size": 4096, "times_us": [12.0, 11.0, 40.0], "wrong": 0, "proto": "ll"},
                       {"size": 8192, "times_us": [6.0], "wrong": 1}],
             "rank2": [{"size": 4096, "times_us": [9.0, 9.0, 9.0], "wrong": 0}]}
    got = vs.combine(lines, 3, [4096, 8192], "comm-ring")
    assert list(got) == [4096]                          # rank 2 never reported 8 KiB
    assert got[4096]["time_us"] == 30.0                 # max per iteration: 12, 30, 40 -> median 30
    assert got[4096]["iters"] == 3 and got[4096]["proto"] == "ll"
    two = vs.combine(lines, 2, [4096, 8192], "comm-ring")
    assert two[8192]["wrong"] == 3 and two[8192]["first_wrong"].startswith("element 3")
    row = vs.make_row("allreduce", 2, "comm-ring", 8192, two[8192], "ok")
    assert row["status"] == "wrong" and row["time_us"] == 6.0
    err = vs.combine({"grid": [{"size": 4096, "error": "stuck: rank 1, TB 0", "times_us": []}]}, 2, [4096], "grid-ring")
    assert vs.make_row("allreduce", 2, "grid-ring", 4096, err[4096], "ok")["status"] == "failed"


def test_the_catalog_holds_a_proven_ring_and_direct_program_per_collective(tmp_path):
    from hccc.catalog import Catalog
    for n in (2, 4):
        cat = Catalog.load(vs.write_catalog(tmp_path / f"c{n}", n))
        assert sorted((e.collective, e.nranks) for e in cat.entries) == sorted(
            (c, n) for c in ("allreduce", "allgather", "reducescatter") for _ in range(2))
        for coll in ("allreduce", "allgather", "reducescatter"):
            entry, why = cat.select(coll, n, 1 << 20, "float32", "sum")
            assert entry is not None and why == "" and entry.name == f"direct_{coll}_{n}.rccl"


# ------------------------------------------------------------------------------ the step runner
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


@pytest.mark.slow   # (real timeouts: seconds of waiting; CI runs the slow set too)
def test_a_step_that_hangs_is_killed_with_every_process_it_started(tmp_path):
    pidfile = tmp_path / "child"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
            "time.sleep(60)")
    t0 = time.monotonic()
    res = common.run_command([sys.executable, "-c", code], 4.0)
    assert time.monotonic() - t0 < 20
    assert res.status == "timeout" and res.returncode is None and "started" in res.stdout
    assert res.why().startswith("no answer in 4 s; last output: started")
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_failing_and_a_passing_command():
    bad = common.run_command([sys.executable, "-c", "import sys; print('x'); sys.exit('boom')"], 30)
    assert bad.status == "failed" and bad.returncode == 1 and bad.why() == "exit 1: boom"
    good = common.run_command([sys.executable, "-c", "print('{\"a\": 1}')"], 30, env={"HCCC_X": "1"})
    assert good.status == "ok" and common.last_json(good.stdout) == {"a": 1}
    missing = common.run_command(["/nonexistent/program"], 30)
    assert missing.status == "failed" and missing.returncode is None and "cannot start" in missing.why()


# ------------------------------------------------------------------------------ end to end, CPU
def _fake(monkeypatch, behaviours: dict, hang_timeout: float | None = 2.0):
    """Steps of the implementations in ``behaviours`` run a stand-in: "hang" writes its first size's
    line for every rank, then sleeps (its step times out after ``hang_timeout``, None: --step-timeout);
    "fail" exits with an error."""
    real = vs.step_command
    real_plan = vs.plan

    def plan(*a, **k):
        steps = real_plan(*a, **k)
        for s in steps:
            if behaviours.get(s.impl) == "hang":
                s.timeout_s = hang_timeout
        return steps
    monkeypatch.setattr(vs, "plan", plan)

    def fake(spec):
        what = behaviours.get(spec["impl"])
        if what is None:
            return real(spec)
        d = spec["dir"]
        first = spec["sizes"][0]
        if what == "hang":
            code = (f"import json, os, time; os.makedirs({d!r}, exist_ok=True)\n"
                    f"for r in range({spec['n']}):\n"
                    f"    open(os.path.join({d!r}, f'rank{{r}}.jsonl'), 'a').write(json.dumps("
                    f"{{'size': {first}, 'times_us': [7.0, 9.0, 8.0], 'wrong': 0}}) + '\\n')\n"
                    "time.sleep(60)")
        else:
            code = ("import json, sys; print(json.dumps({'ok': False, 'error': 'rank 1: RuntimeError: boom'})); "
                    "sys.exit(1)")
        return [sys.executable, "-c", code]
    monkeypatch.setattr(vs, "step_command", fake)


def test_a_cpu_run_end_to_end_with_a_failing_and_a_hanging_step(monkeypatch, tmp_path, capsys):
    """The one-grid ring runs for real on the CPU emulation; a Communicator step that hangs after its
    first size and one that fails are reported in their rows, and the run goes on."""
    _fake(monkeypatch, {"comm-ring": "hang", "comm-direct": "fail"})
    js = tmp_path / "r.json"
    rc = vs.main(["--backend", "cpu", "--ranks", "2", "--collectives", "allreduce", "--sizes", "4K,8K",
                  "--impls", "comm-ring,comm-direct,grid-ring,nccl", "--json", str(js),
                  "--workdir", str(tmp_path / "w")])
    assert rc == 1
    out = capsys.readouterr().out
    assert "# no CUDA GPU: skipped (--backend cpu)" in out
    for col in ("collective", "impl", "size", "count", "type", "time (us)", "algbw", "busbw", "ratio", "#wrong"):
        assert col in out
    rep = json.loads(js.read_text())
    assert rep["nccl"]["runs"] is False and rep["copy"]["hbm_gbps"] > 0
    steps = {s["ident"]: s for s in rep["steps"]}
    assert steps["comm-ring-allreduce-2"]["status"] == "timeout"
    assert steps["comm-direct-allreduce-2"]["status"] == "failed"
    assert steps["comm-direct-allreduce-2"]["reason"] == "rank 1: RuntimeError: boom"
    assert steps["grid-ring-allreduce-2"]["status"] == "ok"
    rows = {(r["impl"], r["bytes"]): r for r in rep["rows"]}
    assert [r["impl"] for r in rep["rows"]] == ["copy bound", "nccl", "comm-ring", "comm-direct", "grid-ring"] * 2
    # the hanging step kept the size it finished: the slowest rank per iteration, then the median
    assert rows[("comm-ring", 4096)]["status"] == "ok" and rows[("comm-ring", 4096)]["time_us"] == 8.0
    assert rows[("comm-ring", 8192)]["status"] == "timeout" and rows[("comm-ring", 8192)]["time_us"] is None
    assert rows[("comm-direct", 4096)]["status"] == "failed" and "boom" in rows[("comm-direct", 4096)]["note"]
    assert rows[("nccl", 4096)]["status"] == "skipped" and rows[("nccl", 4096)]["note"].startswith("no CUDA GPU")
    for size in (4096, 8192):
        grid, bound = rows[("grid-ring", size)], rows[("copy bound", size)]
        assert grid["status"] == "ok" and grid["wrong"] == 0 and grid["iters"] == 2 and grid["launch"]
        assert grid["count"] == size // 4 and grid["type"] == "float"
        assert grid["algbw"] == pytest.approx(size / (grid["time_us"] * 1e3))
        assert grid["busbw"] == pytest.approx(grid["algbw"])               # AllReduce on 2: 2(N-1)/N = 1
        assert grid["ratio_to"] == "copy bound"
        assert grid["ratio"] == pytest.approx(bound["time_us"] / grid["time_us"])
        assert bound["time_us"] == pytest.approx(4 * size / (rep["copy"]["hbm_gbps"] * 1e3))
        assert grid["catalog_pick"] is False         # the catalog picks the direct entry (first by name)
    assert rows[("comm-direct", 4096)]["catalog_pick"] is True


@pytest.mark.slow   # (real timeouts: seconds of waiting; CI runs the slow set too)
def test_what_does_not_fit_the_budget_is_not_run(monkeypatch, tmp_path):
    _fake(monkeypatch, {"grid-ring": "hang"}, hang_timeout=None)     # it hangs till the budget's end
    js = tmp_path / "r.json"
    t0 = time.monotonic()
    rc = vs.main(["--backend", "cpu", "--ranks", "2", "--collectives", "allreduce,allgather", "--sizes", "4K",
                  "--impls", "grid-ring", "--budget", "5", "--copy-bytes", "64K", "--json", str(js),
                  "--workdir", str(tmp_path / "w")])
    assert time.monotonic() - t0 < 20
    rep = json.loads(js.read_text())
    assert rc == 1
    assert [s["status"] for s in rep["steps"]] == ["timeout", "skipped"]
    gather = [r for r in rep["rows"] if r["collective"] == "allgather" and r["impl"] == "grid-ring"]
    assert gather[0]["status"] == "skipped" and gather[0]["note"] == "not run (budget spent)"


@pytest.mark.slow
def test_every_collective_through_the_communicator_and_a_gloo_stand_in_for_nccl(tmp_path):
    """All three collectives, ring and direct, one rank per process (POSIX shared memory), against
    gloo in NCCL's place (--force-nccl on the CPU backend): every element right, ratios to it."""
    js = tmp_path / "r.json"
    rc = vs.main(["--backend", "cpu", "--ranks", "2", "--sizes", "4K", "--impls", "nccl,comm-ring,comm-direct",
                  "--force-nccl", "--json", str(js), "--workdir", str(tmp_path / "w")])
    rep = json.loads(js.read_text())
    assert rc == 0, rep["steps"]
    mine = [r for r in rep["rows"] if r["impl"].startswith("comm-")]
    assert len(mine) == 6 and all(r["status"] == "ok" and r["wrong"] == 0 for r in mine)
    assert all(r["ratio_to"] == "nccl" for r in mine)
    assert all(r["status"] == "ok" and r["wrong"] == 0 for r in rep["rows"] if r["impl"] == "nccl")


@pytest.mark.gpu
def test_vs_nccl_quick_on_a_gpu(tmp_path):
    """On a CUDA GPU: N = 2, every hccc implementation correct at 4 KiB; NCCL runs or says why not."""
    cuda_platform_or_skip().close()
    js = tmp_path / "r.json"
    vs.main(["--ranks", "2", "--sizes", "4K", "--iters", "3", "--warmup", "1", "--json", str(js),
             "--workdir", str(tmp_path / "w")])
    rep = json.loads(js.read_text())
    mine = [r for r in rep["rows"] if r["impl"].startswith(("comm-", "grid-"))]
    assert mine and all(r["status"] == "ok" and r["wrong"] == 0 for r in mine), mine
    assert rep["nccl"]["line"]
