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


# ------------------------------------------------------------------------------ --quick
def _quick_args(v, backend="cuda", **kw):
    a = dict(backend=backend, quick=True, small="4K", large="32M", iters=3, examples=v.all_examples(),
             step_timeout=40.0, budget=360.0, build_jobs=8, kernel_timeout=20.0, workdir=None, latency_iters=20)
    a.update(kw)
    return v.argparse.Namespace(**a)


def test_quick_plan_covers_every_step_of_a_short_lease(tmp_path):
    v = _script()
    args = _quick_args(v)
    steps = v.plan_quick(args, tmp_path)
    examples = sorted(p.stem for p in (ROOT / "examples").glob("*.rccl"))
    assert [s.group for s in steps] == (["env", "build", "copy", "slot", "latency", "latency", "latency", "large",
                                         "large", "tma", "tma", "hm", "hm", "hm"] + ["examples"] * len(examples)
                                        + ["torch", "vs_nccl", "pathology", "pathology", "model"])
    # the latency rows: ring AllReduce 8 under both protocols, fused and not; the one-shot; the one-step
    lat = {s.name: json.loads(s.argv[-1]) for s in steps if s.group == "latency"}
    ring = lat["ring_allreduce_8 4K"]
    assert [(r[r.index("--proto") + 1], r[r.index("--fuse") + 1]) for r in ring] == [
        ("simple", "off"), ("simple", "on"), ("ll", "off"), ("ll", "on")]
    assert all(r[r.index("--sizes") + 1] == "4K" and r[r.index("-n") + 1] == str(args.latency_iters)
               and "--out-of-place" in r for rs in lat.values() for r in rs)
    assert lat["one_shot_allreduce_8 4K"][0][1].endswith("one_shot_allreduce_8.json")
    large = [json.loads(s.argv[-1])[0] for s in steps if s.group == "large"]
    assert [(Path(r[1]).stem, r[r.index("--sizes") + 1]) for r in large] == [("ring_allgather_8", "256M"),
                                                                             ("ring_allreduce_8", "256M")]
    # the bulk-copy A/B: the copy engine alone and ring AllGather 8 at 256 MiB (the large group's
    # first row, its portable side), both built with HCCC_TMA=1
    copy_ab, ag_ab = [s for s in steps if s.group == "tma"]
    assert copy_ab.argv[1:3] == [str(v.SLOT_ANATOMY), "--copy-only"] and copy_ab.env == {"HCCC_TMA": "1"}
    assert copy_ab.data_file.endswith(".json") and "--backend" not in copy_ab.argv
    (ag_line,) = json.loads(ag_ab.argv[-1])
    assert ag_line == large[0] and ag_ab.env == {"HCCC_TMA": "1"}
    assert all(not s.env for s in steps if s.group != "tma")
    hm = [json.loads(s.argv[-1])[0] for s in steps if s.group == "hm"]
    assert [("--inplace-only" in r, "--slice-size" in r) for r in hm] == [(True, False), (False, False),
                                                                          (True, True)]
    # the fewest micro-batches: HM 4x8's 32 chunks at 32 MiB are 1 MiB each, cut to a slot's share
    from hccc.compiler.passes import slicing
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / "hm_allreduce_4x8.rccl")
    share = slicing.slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
    assert int(hm[2][hm[2].index("--slice-size") + 1]) == min(share, (32 << 20) // ir.nchunks)
    torch_step = next(s for s in steps if s.group == "torch")
    assert torch_step.argv[1].endswith("torch_gpu_check.py") and torch_step.argv[
        torch_step.argv.index("--device") + 1] == "cuda" and torch_step.data_file.endswith(".json")
    assert steps[-1].argv[-2] == "--model-worker"
    assert sorted(s.name for s in steps if s.group == "examples") == examples
    assert [s.name for s in steps if s.group == "examples"][:3] == list(v.EXAMPLES[:3])   # the full mode's first
    for s in (s for s in steps if s.group == "examples"):
        simple, ll = json.loads(s.argv[-1])            # both protocols in one process
        assert simple[simple.index("--sizes") + 1] == "4K,32M" and simple[simple.index("--proto") + 1] == "simple"
        assert ll[ll.index("--sizes") + 1] == "4K" and ll[ll.index("--proto") + 1] == "ll"
        assert all("--out-of-place" in r and "--json" in r and r[r.index("--backend") + 1] == "cuda"
                   for r in (simple, ll))
    vs = next(s for s in steps if s.group == "vs_nccl")
    assert "--quick" in vs.argv and vs.argv[vs.argv.index("--ranks") + 1] == "8,4,2"
    assert vs.argv[vs.argv.index("--budget") + 1] == v.LEFT and vs.data_file.endswith("vs_nccl.json")
    path = {s.name: s for s in steps if s.group == "pathology"}
    runs = {name: json.loads(s.argv[-1])[0] for name, s in path.items()}
    assert [r[r.index("--sizes") + 1] for r in runs.values()] == ["32M", "64M"]
    synth = path["synth h20_4_8 allgather (table)"]
    assert runs[synth.name][runs[synth.name].index("--codegen") + 1] == "table"
    before = json.loads(synth.before[0][-1])[0]
    assert before[:2] == ["synth", str(ROOT / "examples" / "clusters" / "h20_4_8.topo")]
    assert before[before.index("--time-limit") + 1] == "20" and synth.creates == before[before.index("-o") + 1]
    build = json.loads(steps[1].argv[-1])
    # every example, then each latency run once (the one-shot's and the fused kernels)
    assert len(build["examples"]) == len(examples) + 7 and build["jobs"] == 8
    assert [Path(r[1]).stem for r in build["tma"]] == ["ring_allgather_8"]      # built with HCCC_TMA=1
    assert all(r[r.index("-n") + 1] == "1" for r in build["examples"][len(examples):])
    assert build["synth"][0] == before and build["synth"][1][build["synth"][1].index("--sizes") + 1] == "4K"
    assert "--build-only" in build["vs_nccl"] and build["vs_nccl"][build["vs_nccl"].index("--ranks") + 1] == "8"
    slot = steps[3]
    assert slot.argv[1:4] == [str(v.SLOT_ANATOMY), "--quick", "--json"] and "--backend" not in slot.argv
    cpu = v.plan_quick(_quick_args(v, "cpu", large="16K"), tmp_path)
    assert "build" not in [s.group for s in cpu]                       # nothing to build ahead on the CPU
    assert next(s for s in cpu if s.group == "slot").argv[-2:] == ["--backend", "cpu"]


def _json_cmd(obj) -> list:
    return _py(f"import json; print(json.dumps({obj!r}))")


def _run_json(collective: str, nranks: int, nbytes: int, time_us: float, inplace=False, proto="simple") -> dict:
    return {"runs": [{"argv": ["run"], "rc": 0, "error": None, "result": {
        "algorithm": "x", "nranks": nranks, "nthreads": 512, "launch": "grid", "results": [
            {"bytes": nbytes, "inplace": inplace, "wrong": 0, "stuck": None, "time_us": time_us, "proto": proto,
             "collective": collective, "nranks": nranks, "algbw_GBps": 1.0, "busbw_GBps": 1.0}]}}]}


@pytest.mark.slow   # (real timeouts: seconds of waiting; CI runs the slow set too)
def test_quick_mode_shares_the_budget_times_out_and_reports_what_did_not_run(monkeypatch, tmp_path):
    """A hanging example is stopped where its group's share ends, so the next example does not run
    (reported so) while the pathology group keeps its share; a missing slot_anatomy.py is "not
    available"; the HBM bound comes from the copy step."""
    v = _script()
    steps = [v.Step("env", "environment", _json_cmd({"gpu": "Fake GPU", "sms": 132, "cpus": 2}), 30.0),
             v.Step("copy", "device copy", _json_cmd({"bytes": 1 << 30, "copy_gbps": 1000.0, "hbm_gbps": 2000.0,
                                                      "timer": "CUDA events", "iters": 10, "time_us": 1.0}), 30.0),
             v.Step("slot", "slot_anatomy --quick", [sys.executable, str(tmp_path / "slot_anatomy.py"), "--quick"],
                    30.0),
             v.Step("examples", "hangs", _py("import time; print('building', flush=True); time.sleep(60)"), 100.0),
             v.Step("examples", "never", _json_cmd(_run_json("allgather", 8, 4096, 100.0)), 100.0),
             v.Step("pathology", "ring_broadcast_8", _json_cmd(_run_json("broadcast", 8, 32 << 20, 2.4e6)), 100.0)]
    monkeypatch.setattr(v, "plan_quick", lambda args, workdir: steps)
    # of 6 s: env 1.2, copy 1.2, slot 0.3, examples 2.1 (and what the groups before leave), pathology 1.2
    monkeypatch.setattr(v, "QUICK_GROUPS", {"env": 0.2, "copy": 0.2, "slot": 0.05, "examples": 0.35,
                                            "pathology": 0.2})
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    t0 = time.monotonic()
    rc = v.main(["--quick", "--budget", "6", "--report", str(report), "--json", str(js), "--workdir", str(tmp_path)])
    assert time.monotonic() - t0 < 30
    assert rc == 1
    doc = json.loads(js.read_text())
    assert doc["mode"] == "quick" and doc["device"] == "Fake GPU"
    res = {s["name"]: s for s in doc["steps"]}
    assert res["environment"]["status"] == "ok" and "Fake GPU, 132 SMs" in res["environment"]["summary"]
    assert res["device copy"]["status"] == "ok" and "2,000.0 GB/s read + written" in res["device copy"]["summary"]
    assert res["slot_anatomy --quick"]["status"] == "n/a"
    assert res["slot_anatomy --quick"]["summary"].startswith("not available (benchmarks/slot_anatomy.py")
    assert res["hangs"]["status"] == "timeout" and "last output: building" in res["hangs"]["summary"]
    assert res["never"] == dict(res["never"], status="skipped", summary="not run (budget spent)")
    patho = res["ring_broadcast_8"]
    assert patho["status"] == "ok"
    bound = 9 * (32 << 20) / 2000e3           # (N+1) S at 2,000 GB/s
    assert f"HBM bound {bound:,.1f} us" in patho["summary"]
    text = report.read_text()
    assert "| slot | slot_anatomy --quick | n/a |" in text and "| examples | never | skipped |" in text
    assert "## Pathological programs" in text and f"| {bound:,.1f} |" in text


def test_slot_anatomy_runs_where_it_exists(monkeypatch, tmp_path):
    v = _script()
    fake = tmp_path / "slot_anatomy.py"
    fake.write_text("import json, sys\n"
                    "a = sys.argv[1:]\n"
                    "assert a[:2] == ['--quick', '--json'] and a[3:] == ['--backend', 'cpu'], a\n"
                    "open(a[2], 'w').write(json.dumps({'rows': [{'phase': 'wait'}, {'phase': 'post'}]}))\n"
                    "print('phase  us\\nwait   3.1\\npost   1.2')\n")
    monkeypatch.setattr(v, "SLOT_ANATOMY", fake)
    real = v.plan_quick
    monkeypatch.setattr(v, "plan_quick", lambda args, wd: [s for s in real(args, wd) if s.group == "slot"])
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    assert v.main(["--quick", "--backend", "cpu", "--report", str(report), "--json", str(js),
                   "--workdir", str(tmp_path / "w")]) == 0
    (step,) = json.loads(js.read_text())["steps"]
    assert step["status"] == "ok" and step["summary"] == "2 rows"
    assert "## Slot anatomy" in report.read_text() and "wait   3.1" in report.read_text()


def test_the_run_worker_runs_both_protocols_in_one_process_and_stops_at_a_failure(capsys):
    v = _script()
    ex = str(ROOT / "examples" / "ring_allgather_8.rccl")
    base = ["run", ex, "--backend", "cpu", "--sizes", "4K", "-n", "1", "-w", "0", "--out-of-place", "--json"]
    assert v.main(["--run-worker", json.dumps([base + ["--proto", "simple"], base + ["--proto", "ll"]])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rc"] for r in out["runs"]] == [0, 0]
    assert [r["result"]["results"][0]["proto"] for r in out["runs"]] == ["simple", "ll"]
    assert all(r["result"]["results"][0]["wrong"] == 0 for r in out["runs"])
    bad = ["run", "/nonexistent.rccl", "--backend", "cpu", "--json"]
    assert v.main(["--run-worker", json.dumps([bad, base])]) == 1
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 1 and out["runs"][0]["rc"] != 0 and out["runs"][0]["error"]


@pytest.mark.slow
def test_quick_mode_from_a_cpu_run(tmp_path):
    """Every quick step for real on the CPU emulation (one example, small sizes)."""
    v = _script()
    js = tmp_path / "r.json"
    rc = v.main(["--quick", "--backend", "cpu", "--examples", "ring_allgather_8", "--large", "16K", "--budget", "400",
                 "--report", str(tmp_path / "r.md"), "--json", str(js), "--workdir", str(tmp_path / "w")])
    steps = json.loads(js.read_text())["steps"]
    assert rc == 0, steps
    assert [s["group"] for s in steps] == (["env", "copy", "slot"] + ["latency"] * 3 + ["large"] * 2 + ["tma"] * 3
                                           + ["hm"] * 3
                                           + ["examples", "torch", "vs_nccl", "pathology", "pathology", "model"])
    ex = next(s for s in steps if s["group"] == "examples")
    assert [r["proto"] for run in ex["data"]["runs"] for r in run["result"]["results"]] == ["simple", "simple", "ll"]
    assert all("HBM bound" in s["summary"] for s in steps if s["group"] in ("pathology", "large", "hm"))
    # every measured row has the model's prediction beside it, in the tables
    keys = {v.model_key(row) for s in steps if s["group"] in ("latency", "large", "hm", "examples", "pathology")
            for row in v._run_results(s["data"])}          # (a row measured twice is predicted once)
    assert len(keys) > 12 and steps[-1]["summary"] == (f"{len(keys)}/{len(keys)} measured rows predicted; "
                                                       "also from this run's own units")
    # ... and this run's own slot anatomy (the emulation's here) predicted every row too
    assert all(r["predicted_own_us"] > 0 for r in steps[-1]["data"]["rows"])
    text = (tmp_path / "r.md").read_text()
    for title in ("## Small messages", "## Bandwidth", "## HM AllReduce 4x8", "## The torch backend on cpu tensors"):
        assert title in text
    fused = [line for line in text.splitlines() if line.startswith("| ring_allreduce_8 4K | ll | on |")]
    assert len(fused) == 1 and fused[0].split("|")[9].strip() not in ("", "-")      # the model column
    assert fused[0].split("|")[10].strip() not in ("", "-")                          # this run's units
    assert "| all_to_all_single |" in text and text.count("| ok |") >= 2
    # the bulk-copy A/B beside the portable path: every copy row paired, the AllGather's times
    ab = next(s for s in steps if s["name"] == "bulk copies vs the portable path")
    assert ab["status"] == "ok" and ab["data"]["allgather"]["bytes"] == 16 << 10
    assert len(ab["data"]["copy"]) == 15 and "## Bulk copies (HCCC_TMA=1) beside the portable path" in text
    assert next(s for s in steps if s["name"] == "copy engine, bulk copies")["summary"].startswith("bulk copies on")


def test_a_step_runs_its_before_commands_unless_their_file_exists_and_gets_its_seconds(tmp_path):
    v = _script()
    made = tmp_path / "made"
    fail = _py("import sys; sys.exit('cannot synthesise')")
    step = v.Step("pathology", "p", _py("import sys; print(sys.argv[1])") + [v.LEFT], 30.0, before=[fail],
                  creates=str(made))
    r = v.run_step(step, 100.0)
    assert r.status == "failed" and r.summary.endswith("exit 1: cannot synthesise")
    made.write_text("")
    r = v.run_step(step, 100.0)
    assert r.status == "ok" and r.summary == "25"          # its 30 s less a margin of 5
    assert v.run_step(step, 12.0).summary == "7"            # never past what the budget leaves


def test_the_torch_checks_uneven_splits_agree_between_sender_and_receiver():
    """What rank r sends to rank p is what p expects from r, and no two peers get the same count."""
    spec = importlib.util.spec_from_file_location("torch_gpu_check", ROOT / "benchmarks" / "torch_gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for world in (2, 3, 8):
        splits = [mod.a2a_splits(world, r, 5) for r in range(world)]
        for r in range(world):
            assert len(set(splits[r][0])) == world and len(set(splits[r][1])) == world
            for p in range(world):
                assert splits[r][0][p] == splits[p][1][r] > 0


def _slot(rates: dict, bulk: bool | None = None) -> dict:
    d = {"rows": [{"exp": "copy", "threads": t, "slice": sl, "GBps": g, "correct": True}
                  for (t, sl), g in rates.items()]}
    if bulk is not None:
        d["rows"].insert(0, {"exp": "device", "name": "Fake GPU", "bulk_copies": int(bulk)})
    return d


@pytest.mark.parametrize("copy_on,ag_on_us,want", [
    ({(32, 4096): 11.0, (512, 65536): 60.0, (512, 524288): 70.0}, 90.0, "bulk copies win"),
    ({(32, 4096): 11.0, (512, 65536): 60.0, (512, 524288): 70.0}, 97.0, "the portable path stays"),  # AG 1.03x
    ({(32, 4096): 9.0, (512, 65536): 51.0, (512, 524288): 80.0}, 50.0, "the portable path stays"),   # copy 1.02x
])
def test_the_bulk_copy_comparison_pairs_the_rows_and_decides_by_the_threshold(copy_on, ag_on_us, want):
    """The A/B row: the copy engine's rows joined on (threads, slice) with the slot step's (a row
    only one side has is left out), ring AllGather 8's time against the large step's, each portable
    over bulk; bulk copies win only where both gain TMA_WIN (5 %)."""
    v = _script()
    assert v.TMA_WIN == 0.05
    off = {(32, 4096): 10.0, (512, 65536): 50.0, (512, 524288): 66.0, (128, 4096): 20.0}
    results = [v.Result("slot", "slot_anatomy --quick", "ok", 1.0, "", {"json": _slot(off), "stdout": ""}),
               v.Result("large", "ring_allgather_8 256M", "ok", 1.0, "", _run_json("allgather", 8, 256 << 20, 100.0)),
               v.Result("tma", "copy engine, bulk copies", "ok", 1.0, "", _slot(copy_on, True))]
    assert v.tma_comparison(results, "cuda") is None                    # (before the AllGather has run)
    results.append(v.Result("tma", "ring_allgather_8 256M, bulk copies", "ok", 1.0, "",
                            _run_json("allgather", 8, 256 << 20, ag_on_us)))
    row = v.tma_comparison(results, "cuda")
    assert row.status == "ok" and row.data["verdict"].startswith(want), row.summary
    assert [(c["threads"], c["slice"]) for c in row.data["copy"]] == sorted(copy_on)
    for c in row.data["copy"]:
        assert c["speedup"] == pytest.approx(copy_on[c["threads"], c["slice"]] / off[c["threads"], c["slice"]])
    assert row.data["allgather"]["speedup"] == pytest.approx(100.0 / ag_on_us)
    # a build without bulk copies (a GPU before sm_90) has nothing to compare
    results[2] = v.Result("tma", "copy engine, bulk copies", "ok", 1.0, "", _slot(copy_on, False))
    assert v.tma_comparison(results, "cuda").status == "n/a"
    # a side missing: failed, undecided
    results[2] = v.Result("tma", "copy engine, bulk copies", "timeout", 90.0, "no answer", None)
    row = v.tma_comparison(results, "cuda")
    assert row.status == "failed" and row.data["verdict"].startswith("undecided")


def test_the_bulk_copy_steps_are_not_available_on_hip(monkeypatch, tmp_path):
    v = _script()
    real = v.plan_quick
    monkeypatch.setattr(v, "plan_quick", lambda args, wd: [s for s in real(args, wd) if s.group == "tma"])
    js = tmp_path / "r.json"
    assert v.main(["--quick", "--backend", "hip", "--build-jobs", "0", "--report", str(tmp_path / "r.md"),
                   "--json", str(js), "--workdir", str(tmp_path / "w")]) == 0
    steps = json.loads(js.read_text())["steps"]
    assert [s["status"] for s in steps] == ["n/a"] * 3
    assert steps[0]["summary"] == "not available on hip (no bulk copies)"
