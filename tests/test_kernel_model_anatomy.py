"""The kernel cost model from one run's own slot anatomy (benchmarks/kernel_model.py's
``costs_from_anatomy``, ``launch_from_anatomy``; ``KernelCosts.launch_seconds`` over measured
launches): what the next GPU run's rows are predicted from, checked here on hand-made rows, on a
recorded run that carries them, and on the rows the CPU emulation's slot anatomy prints."""
from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import benchmark_script
from hccc.compiler.passes import kernel_cost as kc

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "recorded" / "gpu_runs.json"


_script = benchmark_script


def _costs(points=(), per_block=1e-6):
    return kc.KernelCosts(unit_us={k: (1.0,) for k in kc.UNIT_US}, warps=(16,), flag_round_trip_us=1.0,
                          launch_per_block_s=per_block, hbm_bytes_per_s=1e12, flat_gbs=10.0,
                          launch_us_by_blocks=tuple(points))


# ----------------------------------------------------------------------------- launch by blocks
@settings(max_examples=60, deadline=None)
@given(pts=st.dictionaries(st.integers(1, 600), st.integers(0, 500), min_size=1, max_size=6),
       b=st.integers(1, 1200))
def test_measured_launches_are_interpolated_in_the_blocks(pts, b):
    """Between two measured grids: on the line through them (exact rational oracle); below the
    smallest: its time; past the largest: the last two grids' slope (never negative)."""
    xs = sorted(pts)
    got = _costs(pts.items()).launch_seconds(b) * 1e6
    if b <= xs[0]:
        want = Fraction(pts[xs[0]])
    elif b >= xs[-1]:
        if len(xs) == 1:
            want = Fraction(pts[xs[0]])
        else:
            slope = max(Fraction(0), Fraction(pts[xs[-1]] - pts[xs[-2]], xs[-1] - xs[-2]))
            want = pts[xs[-1]] + (b - xs[-1]) * slope
    else:
        lo = max(x for x in xs if x <= b)
        hi = min(x for x in xs if x >= b)
        want = Fraction(pts[lo]) if lo == hi else pts[lo] + Fraction(pts[hi] - pts[lo], hi - lo) * (b - lo)
    assert got == pytest.approx(float(want), rel=1e-9, abs=1e-9)


def test_without_measured_launches_the_cost_is_per_block():
    assert _costs(per_block=2e-6).launch_seconds(10) == pytest.approx(20e-6)
    assert kc.V4_H200.launch_us_by_blocks == ()


# ----------------------------------------------------------------------------- anatomy rows
def _anatomy(unit=None, flag=1.5, copy=None, launch=None, warp=32):
    """Rows as slot_anatomy prints them (after its fits)."""
    unit = unit or {("COPY", 1): 3.0, ("COPY", 16): 1.0, ("SEND", 1): 3.5, ("SEND", 16): 1.2,
                    ("RECV", 1): 4.0, ("RECV", 16): 1.3, ("RECV_REDUCE_COPY", 1): 4.5,
                    ("RECV_REDUCE_COPY", 16): 1.4}
    copy = copy or {1: {4: 1.0, 64: 5.0}, 16: {4: 2.0, 64: 30.0}}
    launch = launch if launch is not None else {8: (10.0, 40.0), 64: (20.0, 50.0)}
    rows = [{"exp": "device", "name": "test", "warp": warp, "nslots": 8},
            {"exp": "pingpong", "flavour": "relaxed poll / relaxed post (floor)", "us_round_trip": 0.4},
            {"exp": "pingpong", "flavour": _script("kernel_model").ANATOMY_FLAG_FLAVOUR + ": the kernels' ordering",
             "us_round_trip": flag}]
    rows += [{"exp": "unit_cost", "op": op, "threads": w * warp, "us_per_unit": us, "points": 4}
             for (op, w), us in unit.items()]
    rows += [{"exp": "copy", "threads": w * warp, "slice": k * 1024, "GBps": g, "correct": True}
             for w, t in copy.items() for k, g in t.items()]
    for b, (one, sixteen) in launch.items():
        rows += [{"exp": "launch", "kind": "engine, cooperative", "blocks": b, "rows": 1, "us": one},
                 {"exp": "launch", "kind": "engine, cooperative", "blocks": b, "rows": 16, "us": sixteen},
                 {"exp": "launch", "kind": "engine", "blocks": b, "rows": 1, "us": 999.0},
                 {"exp": "launch", "kind": "empty", "blocks": b, "rows": 0, "us": 999.0}]
    return rows


def test_launch_from_anatomy_takes_one_rows_cost_off_the_cooperative_launch():
    km = _script("kernel_model")
    # 8 blocks: 10 us with one row, 40 with 16: a row 2 us, the launch 8; 64 blocks: a row 2, launch 18
    assert km.launch_from_anatomy(_anatomy()) == ((8, 8.0), (64, 18.0))
    # a grid without its 16-row launch is left out; no rows: nothing measured
    rows = [r for r in _anatomy() if not (r.get("blocks") == 64 and r.get("rows") == 16)]
    assert km.launch_from_anatomy(rows) == ((8, 8.0),)
    assert km.launch_from_anatomy(_anatomy(launch={})) == ()


def test_costs_from_anatomy_are_the_rows_figures():
    km = _script("kernel_model")
    c = km.costs_from_anatomy(_anatomy(), hbm_bytes_per_s=3e12, source="s")
    assert c.warps == (1, 16) and c.unit_us["SEND"] == (3.5, 1.2) and c.unit_us["RECV_REDUCE_COPY"] == (4.5, 1.4)
    assert c.flag_round_trip_us == 1.5 and c.hop_seconds() == pytest.approx(0.75e-6)
    assert c.copy_kib == (4, 64) and c.copy_gbs == {1: (1.0, 5.0), 16: (2.0, 30.0)}
    assert c.copy_rate(64 * 1024, 16) == pytest.approx(30e9)
    assert c.launch_seconds(8) == pytest.approx(8e-6) and c.launch_seconds(36) == pytest.approx(13e-6)
    assert c.hbm_bytes_per_s == 3e12


@pytest.mark.parametrize("drop, says", [
    (lambda r: r.get("op") == "RECV", "RECV"),
    (lambda r: r.get("exp") == "pingpong" and r["us_round_trip"] == 1.5, "ping-pong"),
    (lambda r: r.get("exp") == "copy", "copy table"),
])
def test_costs_from_anatomy_name_what_the_rows_lack(drop, says):
    km = _script("kernel_model")
    with pytest.raises(ValueError, match=says):
        km.costs_from_anatomy([r for r in _anatomy() if not drop(r)], hbm_bytes_per_s=1e12, source="s")


def test_a_recorded_run_with_its_anatomy_needs_no_calibration_row(tmp_path):
    """The fifth run recorded again with anatomy rows that restate its own tables plus measured
    launches: every row predicted, none a calibration, each row's launch the measured curve at its
    blocks."""
    km = _script("kernel_model")
    data = json.loads(DATA.read_text())
    fifth = next(r for r in data["runs"] if r["run"] == "fifth")
    u = fifth["units"]
    unit = {(op, w): us for op, row in u["unit_us"].items() for w, us in zip(u["unit_warps"], row)}
    copy = {int(w): dict(zip(u["copy_unit_kib"], g)) for w, g in u["copy_gbs"].items()}
    launch = {16: (12.0, 42.0), 128: (30.0, 60.0), 512: (90.0, 120.0)}
    run = dict(fifth, run="sixth", units=dict(u, anatomy=_anatomy(unit=unit, copy=copy, launch=launch,
                                                                  flag=u["flag_round_trip_us"]["v4"])))
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(dict(data, runs=[fifth, run])))
    rows = km.recorded(path)
    sixth = [r for r in rows if r["run"] == "sixth" and r["verdict"] != "not predicted"]
    assert sixth and all(r["verdict"] != "calibration" for r in sixth)
    curve = _costs(((16, 10.0), (128, 28.0), (512, 88.0)))
    for r in sixth:
        assert r["launch_us"] == pytest.approx(curve.launch_seconds(r["blocks"]) * 1e6, abs=0.06)
    # the same figures but the launch: the paths are the fifth run's
    five = {(r["program"], r["bytes"], r["proto"], r["placement"], r["slice"]): r for r in rows if r["run"] == "fifth"}
    for r in sixth:
        f = five[(r["program"], r["bytes"], r["proto"], r["placement"], r["slice"])]
        assert r["path_us"] == pytest.approx(f["path_us"], rel=1e-6, abs=0.06)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_emulations_own_anatomy_gives_costs(tmp_path):
    """slot_anatomy's rows as printed (here by the CPU emulation) are what costs_from_anatomy reads."""
    sa, km = _script("slot_anatomy"), _script("kernel_model")
    out = tmp_path / "a.json"
    assert sa.main(["--backend", "cpu", "--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    c = km.costs_from_anatomy(rows, hbm_bytes_per_s=1e11, source="emulation")
    assert set(c.unit_us) == set(kc.UNIT_US) and c.flag_round_trip_us > 0
    assert [b for b, _ in c.launch_us_by_blocks] == [1, 2, 4]
    assert c.launch_seconds(4) >= 0 and c.copy_rate(64 * 1024, 1) > 0


# ----------------------------------------------------------------------------- recording a run
def _report(tmp_path, backend="cuda", slot=True, slot_status="ok"):
    """A gpu_validate --quick --json report as a GPU run would write it (its step data's shapes)."""
    ex = ROOT / "examples"

    def run(prog, size, proto, *, fuse=None, inplace=False, us=100.0, wrong=0, stuck=None, slice_=None):
        argv = ["run", str(prog), "--backend", backend, "--sizes", str(size), "--proto", proto]
        argv += ["--fuse", fuse] if fuse else []
        argv += ["--slice-size", str(slice_)] if slice_ else []
        return {"argv": argv + ["--json"], "rc": 0,
                "result": {"algorithm": Path(prog).stem, "results": [
                    {"bytes": size, "proto": proto, "inplace": inplace, "wrong": wrong, "time_us": us,
                     "stuck": stuck}]}}
    steps = [{"group": "env", "name": "environment", "status": "ok", "data": {"gpu": "NVIDIA H200", "sms": 132}},
             {"group": "copy", "name": "device copy", "status": "ok", "data": {"hbm_gbps": 4200.0}}]
    if slot:
        steps.append({"group": "slot", "name": "slot_anatomy --quick", "status": slot_status,
                      "data": {"json": {"rows": _anatomy()}}})
    steps += [
        {"group": "latency", "name": "ring_allreduce_8 4K", "status": "ok", "data": {"runs": [
            run(ex / "ring_allreduce_8.rccl", 4096, "ll", us=150.0),
            run(ex / "ring_allreduce_8.rccl", 4096, "ll", fuse="on", us=120.0),
            run(ex / "ring_allreduce_8.rccl", 4096, "simple", wrong=3)]}},
        {"group": "latency", "name": "one_shot_allreduce_8 4K", "status": "ok", "data": {"runs": [
            run(ex / "one_shot_allreduce_8.json", 4096, "ll", us=60.0)]}},
        {"group": "hm", "name": "hm_allreduce_4x8 32M", "status": "ok", "data": {"runs": [
            run(ex / "hm_allreduce_4x8.rccl", 32 << 20, "simple", inplace=True, slice_=65536, us=9000.0),
            run(ex / "hm_allreduce_4x8.rccl", 32 << 20, "simple", stuck="rank 3, TB 1 stuck")]}},
        {"group": "examples", "name": "ring_allreduce_8", "status": "ok", "data": {"runs": [
            run(ex / "ring_allreduce_8.rccl", 4096, "ll", us=151.0)]}},
        {"group": "pathology", "name": "synth", "status": "ok", "data": {"runs": [
            run(tmp_path / "synth_x.json", 64 << 20, "simple", us=3000.0)]}},
        {"group": "torch", "name": "torch", "status": "ok", "data": {"rows": []}},
    ]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"backend": backend, "steps": steps}))
    return path


def test_a_gpu_report_is_recorded_as_a_run_the_model_predicts_from_its_own_anatomy(tmp_path, capsys):
    rec, km = _script("record_gpu_run"), _script("kernel_model")
    runs = tmp_path / "runs"
    assert rec.main([str(_report(tmp_path)), "--run", "sixth", "--section", "The sixth GPU run",
                     "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    run = json.loads((runs / "sixth.json").read_text())
    assert (run["card"], run["sms"], run["kernels"], run["units"]["hbm_tbs"]) == ("H200", 132, "v5", 4.2)
    assert run["units"]["anatomy"] == _anatomy()
    key = {(r["program"], r["bytes"], r["proto"], r["placement"], r.get("slice"), r.get("fuse"), r["us"],
            bool(r.get("not_in_repository"))) for r in run["rows"]}
    assert key == {("ring_allreduce_8", 4096, "ll", "out", None, None, 150.0, False),
                   ("ring_allreduce_8", 4096, "ll", "out", None, "on", 120.0, False),
                   ("one_shot_allreduce_8", 4096, "ll", "out", None, None, 60.0, False),
                   ("hm_allreduce_4x8", 32 << 20, "simple", "in", 65536, None, 9000.0, False),
                   ("synth_x", 64 << 20, "simple", "out", None, None, 3000.0, True)}
    # the wrong, the stuck and the repeated rows are named, not recorded
    assert out.count("left out:") == 3 and "3 wrong" in out and "stuck" in out and "measured again" in out
    # read back with the other runs: predicted from its anatomy, no calibration row, every row a verdict
    runs_read = km.load_recorded(km.RECORDED, runs)
    assert list(runs_read)[-1] == "sixth" and runs_read["sixth"] == run
    rows = km.recorded_runs({"sixth": runs_read["sixth"]})
    assert len(rows) == 5 and not any(r["verdict"] == "calibration" for r in rows)
    assert all(r["predicted_us"] > 0 for r in rows if r["program"] != "synth_x")
    assert "| ring_allreduce_8 | 4K | ll | on | out | auto | 120.0 |" in out
    # a second record of the same name is refused, and the first is left as it was
    before = (runs / "sixth.json").read_text()
    assert rec.main([str(_report(tmp_path)), "--run", "sixth", "--section", "x", "--runs-dir", str(runs)]) == 1
    assert "already recorded" in capsys.readouterr().err and (runs / "sixth.json").read_text() == before


@pytest.mark.parametrize("kw, says", [({"backend": "cpu"}, "only GPU runs"), ({"slot": False}, "no slot step")])
def test_a_report_that_cannot_be_recorded_is_refused_and_nothing_written(tmp_path, capsys, kw, says):
    rec = _script("record_gpu_run")
    runs = tmp_path / "runs"
    assert rec.main([str(_report(tmp_path, **kw)), "--run", "x", "--section", "x", "--runs-dir", str(runs)]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not runs.exists()


def test_a_slot_anatomy_that_stopped_short_is_recorded_with_the_rows_it_kept(tmp_path):
    rec = _script("record_gpu_run")
    runs = tmp_path / "runs"
    assert rec.main([str(_report(tmp_path, slot_status="failed")), "--run", "x", "--section", "x",
                     "--runs-dir", str(runs)]) == 0
    assert json.loads((runs / "x.json").read_text())["units"]["anatomy"] == _anatomy()
