"""benchmarks/slot_anatomy.py: the unit-cost microbenchmark, built for the CPU emulation (the GPU run
uses the same program and script): every experiment runs and the copies it times are correct; the
slope it reports is a least-squares fit (checked against a known line)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("slot_anatomy", ROOT / "benchmarks" / "slot_anatomy.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["slot_anatomy"] = mod
    spec.loader.exec_module(mod)
    return mod


@settings(max_examples=30, deadline=None)
@given(a=st.floats(-100, 100), b=st.floats(-5, 5),
       xs=st.lists(st.integers(1, 5000), min_size=2, max_size=8, unique=True))
def test_slope_recovers_a_line(a, b, xs):
    sa = _module()
    got = sa.slope([float(x) for x in xs], [a + b * x for x in xs])
    assert got == pytest.approx(b, abs=1e-6 * (1 + abs(b)))
    assert sa.slope([3.0, 3.0], [1.0, 2.0]) is None


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_copy_engine_alone_with_bulk_copies(tmp_path, monkeypatch):
    """``--copy-only`` under ``HCCC_TMA=1`` (what gpu_validate --quick's A/B runs): the program is
    built with bulk copies, prints the copy engine's rows alone, every one correct; a bad switch
    value is refused with a message."""
    sa = _module()
    out = tmp_path / "copy.json"
    monkeypatch.delenv("HCCC_TMA", raising=False)
    assert sa.main(["--backend", "cpu", "--copy-only", "--json", str(out)]) == 0
    device = [r for r in json.loads(out.read_text())["rows"] if r["exp"] == "device"]
    assert [r["bulk_copies"] for r in device] == [0]        # (the portable path)
    monkeypatch.setenv("HCCC_TMA", "1")
    assert sa.main(["--backend", "cpu", "--copy-only", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["bulk_copies"] for r in data["rows"] if r["exp"] == "device"] == [1]
    assert {r["exp"] for r in data["rows"]} == {"device", "copy"}
    copies = [r for r in data["rows"] if r["exp"] == "copy"]
    assert len(copies) == 15 and all(r["correct"] and r["us"] > 0 for r in copies)
    monkeypatch.setenv("HCCC_TMA", "on")
    with pytest.raises(SystemExit, match="HCCC_TMA='on'"):
        sa.main(["--backend", "cpu", "--copy-only"])


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_every_experiment_runs_on_the_cpu_emulation(tmp_path):
    sa = _module()
    out = tmp_path / "anatomy.json"
    assert sa.main(["--backend", "cpu", "--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["backend"] == "cpu"
    kinds = {r["exp"] for r in rows}
    assert kinds >= {"device", "pingpong", "units", "copy", "grid", "unit_cost"}
    ops = {r["op"] for r in rows if r["exp"] == "units"}
    assert ops == {"COPY", "SEND", "RECV", "RECV_REDUCE_COPY", "SEND after a met dependency"}
    copies = [r for r in rows if r["exp"] == "copy"]
    assert copies and all(r["correct"] for r in copies)
    assert all(r["us"] > 0 for r in rows if r["exp"] in ("units", "copy", "grid"))
    # a fit per op and thread count, over every slice of the units rows
    fits = [r for r in rows if r["exp"] == "unit_cost"]
    assert len(fits) == len({(r["op"], r["threads"]) for r in rows if r["exp"] == "units"})
    assert {r["blocks"] for r in rows if r["exp"] == "grid"} == {1, 4}
    # the launch rows: an empty kernel and the engine (plain, cooperative; 1 and 16 rows a block)
    # at every grid the emulation holds, each a positive time
    launches = [r for r in rows if r["exp"] == "launch"]
    assert {(r["kind"], r["blocks"], r["rows"]) for r in launches} == {
        (kind, b, n) for b in (1, 2, 4) for kind, n in
        (("empty", 0), ("engine", 1), ("engine", 16), ("engine, cooperative", 1), ("engine, cooperative", 16))}
    assert all(r["us"] > 0 and r["us_each"] > 0 for r in launches)
    # the timer rows: the emulation has no streams, only the plain event pair's rows
    timers = [r for r in rows if r["exp"] == "timer"]
    assert {(r["streams"], r["kernels"], r["blocks"]) for r in timers} == {(0, 1, 8), (0, 1, 128)}
    assert all(r["us"] > 0 for r in timers)


@pytest.mark.parametrize("body, why", [
    ('echo \'{"exp": "device", "name": "x"}\'; echo \'{"exp": "copy", "GBps": 1}\'; echo boom >&2; exit 3',
     "exit 3"),
    ('echo \'{"exp": "device", "name": "x"}\'; echo \'{"exp": "copy", "GBps": 1}\'; exec sleep 30', "did not finish"),
    ('echo \'{"exp": "device", "name": "x"}\'; echo \'{"exp": "copy", "GBps": 1}\'; echo \'{"exp": "co\'',
     "ended before"),
])
def test_a_program_that_stops_short_keeps_the_rows_it_printed(tmp_path, body, why):
    sa = _module()
    exe = tmp_path / "prog"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    rows, got = sa.run(exe, "quick", 1.0, timeout=1.0)
    assert rows == [{"exp": "device", "name": "x"}, {"exp": "copy", "GBps": 1}]
    assert got is not None and why in got and ("boom" in got) == (why == "exit 3")
    exe.write_text('#!/bin/sh\necho \'{"exp": "device"}\'; echo \'{"exp": "done"}\'\n')
    assert sa.run(exe, "quick", 1.0, timeout=3.0) == ([{"exp": "device"}], None)
