"""``hccc run``: programs that are not in the repository (rings of odd sizes, HM shapes, recursive
doubling, ReduceScatter, AllReduce, a ProgramIR .json) through the CPU emulation at several sizes,
dtypes and operators with zero wrong elements; the nccl-tests table and its bandwidth columns; JSON
output; a broken IR reported as stuck (and not hanging); clear errors for bad input and for an
unusable CUDA backend."""
from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from hccc.cli import main
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from codegen_irs import stuck_ir

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# size count type redop root, then (time algbw busbw #wrong) per placement (out-of-place, in-place)
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)((?:\s+\S+){4}|(?:\s+\S+){8})\s*$")


@pytest.fixture(autouse=True)
def quick_builds(monkeypatch):
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")


def run_cli(capsys, *argv):
    rc = main(list(map(str, argv)))
    out = capsys.readouterr()
    return rc, out.out, out.err


def table(out: str) -> list[tuple]:
    rows = []
    for line in out.splitlines():
        m = ROW.match(line)
        if m and not line.startswith("#"):
            rows.append(m.groups()[:5] + tuple(m.group(6).split()))
    return rows


PROGRAMS = {
    "ring_ag_5": (lambda: gen.ring_allgather_rccl(5, name="ring_ag_5"), 5),
    "ring_rs_6": (lambda: gen.ring_reducescatter_rccl(6, [0, 2, 4, 1, 5, 3], name="ring_rs_6"), 6),
    "ring_ar_3": (lambda: gen.ring_allreduce_rccl(3, name="ring_ar_3"), 3),
    "hm_ar_2x3": (lambda: gen.hm_allreduce_rccl(2, 3), 6),
    "hm_ag_3x2": (lambda: gen.hm_allgather_rccl(3, 2), 6),
    "rd_ag_8": (lambda: gen.recursive_doubling_allgather_rccl(8), 8),
}
PROGRAM_COLLECTIVE = {"ring_ag_5": "allgather", "ring_rs_6": "reducescatter", "ring_ar_3": "allreduce",
                      "hm_ar_2x3": "allreduce", "hm_ag_3x2": "allgather", "rd_ag_8": "allgather"}
CASES = [("float32", "sum"), ("int32", "max"), ("float16", "min"), ("bfloat16", "sum")]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_not_in_the_repository_run_with_zero_wrong(tmp_path, capsys, name):
    make, nranks = PROGRAMS[name]
    algo = tmp_path / f"{name}.rccl"
    algo.write_text(make())
    dtype, op = CASES[sorted(PROGRAMS).index(name) % len(CASES)]
    sizes = [0, 2 * nranks, 1000, 4096 + 8 * nranks, 65536]   # bytes; 2-byte types take all
    sizes = [s for s in sizes if s % (4 if dtype in ("float32", "int32") else 2) == 0]
    # out of place and in place, side by side in one table (nccl-tests' layout)
    rc, out, err = run_cli(capsys, "run", algo, "--backend", "cpu", "--sizes", ",".join(map(str, sizes)),
                           "-d", dtype, "-o", op, "--chunk-size", "256", "-n", "1", "-w", "0")
    assert rc == 0, out + err
    rows = table(out)
    assert [int(r[0]) for r in rows] == sizes
    es = 4 if dtype in ("float32", "int32") else 2
    assert [int(r[1]) for r in rows] == [s // es for s in sizes]
    assert all(len(r) == 13 and r[8] == "0" and r[12] == "0" for r in rows), out
    coll = PROGRAM_COLLECTIVE[name]
    assert {r[3] for r in rows} == {op if coll in ("allreduce", "reducescatter") else "none"}
    assert {r[4] for r in rows} == {"-1"}
    head = [ln for ln in out.splitlines() if ln.startswith("#")]
    assert any("out-of-place" in ln and "in-place" in ln for ln in head), out
    assert out.splitlines()[-2] == "# Out of bounds values : 0 OK"
    assert out.splitlines()[-1].startswith("# Avg bus bandwidth    : ")


def test_table_bandwidths_follow_nccl_tests(tmp_path, capsys):
    algo = tmp_path / "ar.rccl"
    algo.write_text(gen.ring_allreduce_rccl(4, name="ar4"))
    rc, out, _ = run_cli(capsys, "run", algo, "--bytes", "64K", "--json", "--iters", "2", "--out-of-place")
    assert rc == 0
    doc = json.loads(out)
    assert doc["collective"] == "allreduce" and doc["nranks"] == 4 and doc["ok"] is True
    assert doc["redop"] == "sum" and doc["root"] == -1
    (res,) = doc["results"]
    assert res["inplace"] is False
    assert {"bytes", "dtype", "op", "wrong", "time_us", "algbw_GBps", "busbw_GBps", "stuck"} <= set(res)
    assert res["bytes"] == 65536 and res["count"] == 16384 and res["wrong"] == 0
    assert res["algbw_GBps"] == pytest.approx(65536 / (res["time_us"] * 1e3))
    assert res["busbw_GBps"] == pytest.approx(res["algbw_GBps"] * 2 * 3 / 4)
    # allgather: size is the per-rank output (the full buffer), busbw factor (n-1)/n
    ag = tmp_path / "ag.rccl"
    ag.write_text(gen.ring_allgather_rccl(5, name="ag5"))
    rc, out, _ = run_cli(capsys, "run", ag, "--bytes", "5000", "--json", "--dtype", "int32")
    res = json.loads(out)["results"][0]
    assert rc == 0 and res["count"] == 1250
    assert res["busbw_GBps"] == pytest.approx(res["algbw_GBps"] * 4 / 5)


def test_program_ir_json_runs_as_given(tmp_path, capsys):
    """An IR written by `hccc ALGO -o OUTDIR` (and one built in memory) runs without re-lowering."""
    algo = tmp_path / "ar.rccl"
    algo.write_text(gen.ring_allreduce_rccl(4, [0, 2, 1, 3], name="ar4x"))
    assert main([str(algo), "-o", str(tmp_path / "out"), "--chunk-size", "128"]) == 0
    capsys.readouterr()
    rc, out, err = run_cli(capsys, "run", tmp_path / "out" / "ar4x.ir.json", "--bytes", "4K,10000",
                           "--op", "min", "--chunk-size", "1M")
    assert rc == 0, out + err
    assert "chunk size 128 B" in out                # the IR's own chunk size, not --chunk-size
    ir = build_program(gen.direct_allreduce(3), chunk_bytes=64)
    p = tmp_path / "direct.json"
    p.write_text(ir.to_json())
    rc, out, err = run_cli(capsys, "run", p, "--bytes", "12,1200", "--dtype", "int32", "--threads", "3")
    assert rc == 0 and "3 threads per thread block" in out, out + err


def _stuck_ir_json(tmp_path):
    p = tmp_path / "stuck.json"
    p.write_text(stuck_ir().to_json())
    return p


def test_deadlocked_ir_is_reported_not_hung(tmp_path, capsys):
    p = _stuck_ir_json(tmp_path)
    t0 = time.monotonic()
    rc, out, err = run_cli(capsys, "run", p, "--timeout", "0.3", "--bytes", "64,256", "--out-of-place")
    assert time.monotonic() - t0 < 60
    assert rc == 1
    lines = [ln for ln in out.splitlines() if "stuck in" in ln]
    assert len(lines) == 2, out
    assert re.search(r"rank [01], TB 0 stuck in recv for chunk [01] \(micro-batch 0\)", lines[0])
    rc, out, _ = run_cli(capsys, "run", p, "--timeout", "0.3", "--bytes", "64", "--json")
    res = json.loads(out)["results"][0]
    assert rc == 1 and res["stuck"] and res["time_us"] is None


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    algo = tmp_path / "ar.rccl"
    algo.write_text(gen.ring_allreduce_rccl(2, name="ar2"))
    rc, _, err = run_cli(capsys, "run", algo, "--bytes", "6", "--dtype", "int32")
    assert rc == 2 and "whole number" in err
    bad = tmp_path / "bad.json"
    doc = json.loads(build_program(gen.ring_allreduce(2)).to_json())
    doc["prims"]["send_peer"][0] = 9
    bad.write_text(json.dumps(doc))
    rc, _, err = run_cli(capsys, "run", bad)
    assert rc == 1 and "error:" in err and "Traceback" not in err


def test_cuda_backend_unavailable_is_a_clear_error(tmp_path, capsys):
    from hccc.runtime.platform import PlatformError, get_platform
    try:
        get_platform("cuda").close()
        pytest.skip("a CUDA device is usable here")
    except PlatformError:
        pass
    algo = tmp_path / "ar.rccl"
    algo.write_text(gen.ring_allreduce_rccl(2, name="ar2"))
    rc, out, err = run_cli(capsys, "run", algo, "--backend", "cuda")
    assert rc == 1 and err.splitlines()[-1].startswith("hccc: error: ") and "Traceback" not in err


def test_launch_mode_is_chosen_and_reported(tmp_path, capsys):
    """Every rank in one emulated process: one grid by default; --launch per-rank runs a kernel per
    rank; both are correct and reported (JSON "launch", the table's header)."""
    algo = tmp_path / "ar.rccl"
    algo.write_text(gen.ring_allreduce_rccl(3, name="ar3"))
    for flag, want in ((None, "grid"), ("grid", "grid"), ("per-rank", "per-rank")):
        extra = ["--launch", flag] if flag else []
        rc, out, _ = run_cli(capsys, "run", algo, "--bytes", "3000", "--json", "--iters", "1", *extra)
        doc = json.loads(out)
        assert rc == 0 and doc["ok"] is True and doc["launch"] == want
    rc, out, _ = run_cli(capsys, "run", algo, "--bytes", "3000", "--iters", "1", "--launch", "per-rank")
    assert rc == 0 and "a kernel per rank" in out
    rc, out, _ = run_cli(capsys, "run", algo, "--bytes", "3000", "--iters", "1")
    assert rc == 0 and "one grid for every rank" in out


@pytest.mark.parametrize("n", [0, 1, 2, 4])
def test_check_count_is_nccl_tests_check_iterations(tmp_path, capsys, monkeypatch, n):
    """nccl-tests' -c N: N checked launches per size and placement (the last timed launch, then
    N-1 more from fresh inputs), their wrong elements summed; -c 0 checks nothing. Counted at the
    runner: every launch of every rank's kernel (a one-grid launch is one of every rank) and every
    comparison with the oracle (each here reports 2 wrong elements)."""
    from hccc.runtime import oracle
    from hccc.runtime.cpu import CpuPlatform
    ir = build_program(gen.ring_allgather(3), chunk_bytes=256)
    f = tmp_path / "ag.json"
    f.write_text(ir.to_json())
    kernels, compares = [], []           # (kernels launched: one per rank and launch)
    real_launch, real_grid = CpuPlatform.launch, CpuPlatform.launch_grid
    in_grid = []                         # (the emulation launches the one grid as a plain launch)

    def count_launch(self, *a, **k):
        if not in_grid:
            kernels.append(1)
        return real_launch(self, *a, **k)

    def count_grid(self, *a, **k):
        kernels.extend([1] * ir.nranks)
        in_grid.append(1)
        try:
            return real_grid(self, *a, **k)
        finally:
            in_grid.pop()

    def fake_compare(*_a, **_k):
        compares.append(len(kernels) // ir.nranks)
        return 2, "rank 0, output element 0: got 1.0, expected 2.0", 0, "reference"
    monkeypatch.setattr(CpuPlatform, "launch", count_launch)
    monkeypatch.setattr(CpuPlatform, "launch_grid", count_grid)
    monkeypatch.setattr(oracle, "compare", fake_compare)
    rc, out, _ = run_cli(capsys, "run", f, "--sizes", "3K", "-n", "2", "-w", "1", "-c", n,
                         "--out-of-place-only", "--json")
    res = json.loads(out)["results"][0]
    assert len(kernels) == ir.nranks * (1 + 2 + max(n - 1, 0))   # warmup, timed, then the extra checks
    assert compares == list(range(3, 3 + n))                    # after the last timed launch, then after each
    assert res["checks"] == n and res["wrong"] == 2 * n and res["iters"] == 2
    assert rc == (0 if n == 0 else 1)                           # -c 0: results do not fail the run
    rc, out, _ = run_cli(capsys, "run", f, "--sizes", "3K", "-n", "1", "-w", "0", "-c", n, "--out-of-place-only")
    assert f"validation: {n}" in out
    assert table(out)[0][-1] == ("N/A" if n == 0 else str(2 * n))
