"""benchmarks/gpu_validate.py, the one command for the first GPU run, tested without a GPU:
argument handling, a step that hangs costs only its own timeout, a spent budget skips the rest,
wrong / stuck results fail their step, and the report from a real run on the CPU emulation."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script():
    if "gpu_validate" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_validate", ROOT / "benchmarks" / "gpu_validate.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_validate"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gpu_validate"]


@pytest.mark.parametrize("argv,msg", [
    (["--skip", "nonsense"], "unknown step 'nonsense'"),
    (["--examples", "no_such_example"], "no example 'no_such_example'"),
    (["--small", "lots"], "--small / --large must be sizes"),
    (["--step-timeout", "0"], "must be positive"),
    (["--latency-iters", "0"], "--latency-iters must be positive"),
])
def test_bad_arguments_exit_2_with_a_message(argv, msg, capsys, tmp_path):
    v = _script()
    assert v.main([*argv, "--backend", "cpu", "--report", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
    assert not (tmp_path / "r.md").exists()


def _py(code: str) -> list:
    return [sys.executable, "-c", code]


def test_a_hanging_step_costs_its_timeout_and_the_rest_still_run(monkeypatch, tmp_path, capsys):
    v = _script()
    ok = json.dumps({"ok": True, "nthreads": 2, "results": [{"inplace": False, "time_us": 3.5, "wrong": 0,
                                                             "stuck": None}]})
    steps = [v.Step("examples", "hangs", _py("import time; print('started', flush=True); time.sleep(60)"), 1.0),
             v.Step("examples", "fine", _py(f"print({ok!r})"), 30.0),
             v.Step("examples", "stuck", _py("print('{\"ok\": false, \"results\": [{\"wrong\": 0, \"stuck\": "
                                             "\"rank 1, TB 0 stuck in recv\"}]}')"), 30.0),
             v.Step("tests", "crashes", _py("import sys; sys.exit('boom')"), 30.0)]
    monkeypatch.setattr(v, "plan", lambda args: steps)
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    t0 = time.monotonic()
    rc = v.main(["--backend", "cpu", "--report", str(report), "--json", str(js)])
    assert time.monotonic() - t0 < 30
    assert rc == 1
    res = {s["name"]: s for s in json.loads(js.read_text())["steps"]}
    assert res["hangs"]["status"] == "timeout" and "no answer in 1 s" in res["hangs"]["summary"]
    assert res["fine"]["status"] == "ok" and "out 3.5 us" in res["fine"]["summary"]
    assert res["stuck"]["status"] == "failed" and "STUCK: rank 1, TB 0" in res["stuck"]["summary"]
    assert res["crashes"]["status"] == "failed" and "exit 1: boom" in res["crashes"]["summary"]
    text = report.read_text()
    assert "| examples | hangs | timeout |" in text and "1/4 steps passed" in text


def test_a_spent_budget_skips_the_remaining_steps(monkeypatch, tmp_path):
    v = _script()
    steps = [v.Step("model", "slow", _py("import time; time.sleep(60)"), 100.0),
             v.Step("model", "never", _py("print('x')"), 100.0)]
    monkeypatch.setattr(v, "plan", lambda args: steps)
    js = tmp_path / "r.json"
    assert v.main(["--backend", "cpu", "--budget", "1", "--report", str(tmp_path / "r.md"), "--json", str(js)]) == 1
    st = [s["status"] for s in json.loads(js.read_text())["steps"]]
    assert st == ["timeout", "skipped"]


def test_plan_covers_every_example_at_two_sizes_and_both_placements():
    v = _script()
    args = v.argparse.Namespace(backend="cuda", skip=[], step_timeout=60.0, examples=["ring_allreduce_8", "hm_allreduce_4x8"],
                                small="4K", large="64M", iters=5, latency_iters=20)
    steps = v.plan(args)
    groups = [s.group for s in steps]
    assert groups == ["tests", "examples", "examples", "examples", "examples", "busbw", "latency", "latency", "model"]
    ex = [s for s in steps if s.group == "examples"]
    assert all("--inplace" not in s.argv and "--out-of-place" not in s.argv for s in ex)   # both placements
    assert [s.argv[s.argv.index("-b") + 1] for s in ex] == ["4K", "64M", "4K", "64M"]
    assert all(s.timeout_s == 60.0 for s in steps)
    lat = [s for s in steps if s.group == "latency"]          # Simple, then LL, each its own step
    assert [s.argv[s.argv.index("--proto") + 1] for s in lat] == ["simple", "ll"]
    for s in lat:
        a = s.argv
        assert a[a.index("-b") + 1] == a[a.index("-e") + 1] == "4K" and "--out-of-place" in a
        assert a[a.index("-n") + 1] == "20" and a[a.index("run") + 1].endswith("ring_allreduce_8.rccl")
    args.backend = "cpu"
    assert "busbw" not in [s.group for s in v.plan(args)]                                # needs CUDA


def test_report_from_a_cpu_run(tmp_path):
    v = _script()
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    rc = v.main(["--backend", "cpu", "--examples", "ring_allgather_8", "--small", "4K", "--large", "16K",
                 "--iters", "1", "--skip", "tests,latency,model", "--report", str(report), "--json", str(js)])
    assert rc == 0
    steps = json.loads(js.read_text())["steps"]
    assert [s["name"] for s in steps] == ["ring_allgather_8 4K", "ring_allgather_8 16K"]
    assert all(s["status"] == "ok" for s in steps)
    assert all({r["inplace"] for r in s["data"]["results"]} == {False, True} for s in steps)
    text = report.read_text()
    assert text.startswith("# hccc GPU validation: CPU emulation") and "2/2 steps passed" in text


def _latency_json(proto: str, time_us) -> str:
    return json.dumps({"ok": True, "nthreads": 512, "results": [
        {"inplace": False, "time_us": time_us, "wrong": 0, "stuck": None, "proto": proto}]})


@pytest.mark.parametrize("simple_us,ll_us,ll_ran,want", [
    (32.0, 11.0, "ll", ("ok", "Simple 32.0 us, LL 11.0 us: LL 2.91x faster; best 11.0 us vs target <= 30 us "
                        "(2x 15 us): met")),
    (80.0, 95.0, "ll", ("ok", "LL 0.84x of Simple; best 80.0 us vs target <= 30 us (2x 15 us): not met")),
    (32.0, 11.0, "simple", ("failed", "no time for ll")),
])
def test_latency_steps_and_their_comparison_row(monkeypatch, tmp_path, simple_us, ll_us, ll_ran, want):
    """The two latency steps report the protocol they ran; an LL step that ran Simple fails; the
    comparison row gives LL's speed-up and the 4 KiB target, or says which time is missing."""
    v = _script()
    args = v.argparse.Namespace(backend="cuda", skip=["tests", "examples", "busbw", "model"], step_timeout=30.0,
                                examples=[], small="4K", large="64M", iters=5, latency_iters=20)
    steps = v.plan(args)
    assert [s.name for s in steps] == ["ring_allreduce_8 4K simple", "ring_allreduce_8 4K ll"]
    fake = {"simple": _latency_json("simple", simple_us), "ll": _latency_json(ll_ran, ll_us)}
    for s in steps:      # a stand-in for hccc run, keeping the --proto it was asked (summarise reads it)
        proto = s.argv[s.argv.index("--proto") + 1]
        s.argv = _py(f"print({fake[proto]!r})") + ["--proto", proto]
    monkeypatch.setattr(v, "plan", lambda a: steps)
    js = tmp_path / "r.json"
    rc = v.main(["--backend", "cuda", "--report", str(tmp_path / "r.md"), "--json", str(js)])
    res = {s["name"]: s for s in json.loads(js.read_text())["steps"]}
    assert list(res) == ["ring_allreduce_8 4K simple", "ring_allreduce_8 4K ll", "ring_allreduce_8 4K LL vs Simple"]
    if ll_ran != "ll":
        assert res["ring_allreduce_8 4K ll"]["status"] == "failed"
        assert "asked for ll, ran simple" in res["ring_allreduce_8 4K ll"]["summary"]
    row = res["ring_allreduce_8 4K LL vs Simple"]
    assert row["status"] == want[0] and want[1] in row["summary"], row
    assert rc == (0 if want[0] == "ok" else 1)
    assert "| latency | ring_allreduce_8 4K LL vs Simple |" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_latency_steps_from_a_cpu_run(tmp_path):
    """Both latency steps run for real on the CPU emulation (hccc run --proto simple / ll) and
    the LL one ran LL."""
    v = _script()
    js = tmp_path / "r.json"
    rc = v.main(["--backend", "cpu", "--skip", "tests,examples,model", "--latency-iters", "1",
                 "--report", str(tmp_path / "r.md"), "--json", str(js)])
    steps = json.loads(js.read_text())["steps"]
    assert rc == 0, steps
    assert [s["name"] for s in steps] == ["ring_allreduce_8 4K simple", "ring_allreduce_8 4K ll",
                                          "ring_allreduce_8 4K LL vs Simple"]
    assert [r["proto"] for s in steps[:2] for r in s["data"]["results"]] == ["simple", "ll"]
    assert "Simple " in steps[2]["summary"] and "LL " in steps[2]["summary"]
