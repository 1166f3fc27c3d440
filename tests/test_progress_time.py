"""Long work shows how long it has left, a command never sits silent on a terminal, and the time a
command reports is the time its user waited: the sweep's time left (:class:`hccc.progress.Eta`,
against the cost model's own sums), the live display's ETA and its "working" spinner after
:data:`hccc.progress.SILENCE_S` of silence (both only on a terminal), and :mod:`hccc.timing`'s parts,
which add up to the command's wall time with numba's compiling named apart (``hccc synth``)."""
from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hccc.progress as progress
from hccc import timing
from hccc.cli import main
from hccc.progress import Eta, Progress

ROOT = Path(__file__).resolve().parent.parent
IMPORTED = time.perf_counter()


class _Tty(io.StringIO):
    def isatty(self):
        return True


SIZES = st.lists(st.integers(1, 1 << 30), min_size=2, max_size=30)
COST = st.floats(0, 10, allow_nan=False)


@given(SIZES, COST, COST, st.data())
def test_the_time_left_is_the_cost_model_of_the_steps_left(sizes, a, per_gb, data):
    """Steps that cost exactly a + b * size: once two sizes are done, the time left is that cost
    summed over the sizes left."""
    b = per_gb / (1 << 30)
    eta = Eta(sizes)
    k = data.draw(st.integers(1, len(sizes)))
    for x in sizes[:k]:
        eta.step(a + b * x)
    got = eta.seconds_left()
    if len(set(sizes[:k])) < 2:
        if set(sizes[k:]) <= set(sizes[:k]):
            assert got == pytest.approx(sum(a + b * x for x in sizes[k:]), rel=1e-6, abs=1e-9)
        else:
            assert got is None
        return
    assert got == pytest.approx(sum(a + b * x for x in sizes[k:]), rel=1e-6, abs=1e-6)


@given(st.lists(st.integers(1, 1 << 30), min_size=1, max_size=8), st.integers(1, 5), COST, COST, st.data())
def test_cycles_of_a_sweep_count_as_the_sweep_repeated(sizes, cycles, a, per_gb, data):
    b = per_gb / (1 << 30)
    steps = sizes * cycles                       # the oracle: the steps written out
    eta = Eta(sizes, cycles)
    k = data.draw(st.integers(0, len(steps)))
    for x in steps[:k]:
        eta.step(a + b * x)
    got = eta.seconds_left()
    if len(set(steps[:k])) >= 2 or (k and len(set(steps)) == 1):
        assert got == pytest.approx(sum(a + b * x for x in steps[k:]), rel=1e-6, abs=1e-6)
    else:
        assert got is None
    assert Eta([1], 10 ** 12).steps == 10 ** 12            # constant memory, however many steps


@given(SIZES, st.lists(COST, min_size=30, max_size=30), st.data())
def test_the_time_left_is_never_negative_and_none_when_nothing_is_left(sizes, times, data):
    eta = Eta(sizes)
    k = data.draw(st.integers(0, len(sizes)))
    for x, t in zip(sizes[:k], times):
        eta.step(t)
    got = eta.seconds_left()
    assert got is None or got >= 0
    if k == len(sizes) and len(set(sizes)) > 1:
        assert got == 0


def test_a_sized_task_shows_its_time_left_on_a_terminal_only(monkeypatch):
    monkeypatch.delenv("HCCC_PROGRESS", raising=False)
    stream = _Tty()
    with Progress("hccc x", stream=stream) as p:
        t = p.task("running 3 sizes", total=3, sizes=[4096, 1 << 20, 1 << 24])
        p.live.refresh()
        assert "ETA ?" in stream.getvalue()
        t.advance()
        t.advance()
        p.live.refresh()
        assert re.search(r"ETA \d+:\d\d", stream.getvalue())
    plain = io.StringIO()
    with Progress("hccc x", stream=plain) as p:
        assert p.live is None and p._watch is None           # no display, no watcher off a terminal
        t = p.task("running 3 sizes", total=3, sizes=[1, 2, 3])
        for _ in range(3):
            t.advance()
    assert plain.getvalue() == "hccc x: running 3 sizes\n"


def test_silence_on_a_terminal_shows_that_the_command_is_working(monkeypatch):
    monkeypatch.delenv("HCCC_PROGRESS", raising=False)
    monkeypatch.setattr(progress, "SILENCE_S", 0.05)
    monkeypatch.setattr(progress, "SILENCE_POLL_S", 0.01)

    def working(p):
        return [t.description for t in p.live.tasks if t.visible and t.description.startswith("working")]

    def wait_for(cond):
        for _ in range(300):
            if cond():
                return True
            time.sleep(0.01)
        return False

    with Progress("hccc x", stream=_Tty()) as p:
        assert wait_for(lambda: working(p) == ["working"])             # before any phase
        with p.phase("building a"):
            assert wait_for(lambda: working(p) == [])                   # a phase shows itself
        assert wait_for(lambda: working(p) == ["working (after building a)"])
        t = p.task("running", total=1)
        assert wait_for(lambda: working(p) == [])
        t.finish()


@st.composite
def _run(draw):
    """A command's clock readings: (wall, compile) at the start and at each mark, both never
    running backwards, compiling never more than the wall time that passed."""
    n = draw(st.integers(1, 6))
    wall, comp = draw(st.floats(0, 1e4)), draw(st.floats(0, 100))
    reads = [(wall, comp)]
    for _ in range(n):
        dw = draw(st.floats(0, 100))
        dc = draw(st.floats(0, 1)) * dw
        wall, comp = wall + dw, comp + dc
        reads.append((wall, comp))
    names = draw(st.lists(st.sampled_from(["start-up", "synthesis", "writing"]), min_size=n, max_size=n))
    return reads, names


@given(_run())
def test_the_parts_add_up_to_the_wall_time_and_name_the_compiling(run):
    reads, names = run
    (w0, c0), marks = reads[0], reads[1:]
    spans = timing.Spans(begin=w0, compiled=c0)
    spans.marks = [(name, w, c) for name, (w, c) in zip(names, marks)]
    parts = spans.parts()
    assert spans.total() == pytest.approx(marks[-1][0] - w0)
    assert sum(parts.values()) == pytest.approx(spans.total(), abs=1e-6)
    assert parts.get(timing.COMPILING, 0.0) == pytest.approx(marks[-1][1] - c0, abs=1e-9)
    assert all(v >= 0 for v in parts.values())


def test_the_process_start_is_before_anything_it_ran():
    t = timing.process_start()
    if t is None:
        pytest.skip("the system does not say when a process started")
    assert t <= IMPORTED <= time.perf_counter()


def test_synth_reports_the_wall_time_from_its_start_in_parts(capsys, tmp_path):
    before = time.perf_counter()
    rc = main(["synth", str(ROOT / "examples" / "clusters" / "v100_4_8.topo"), "--collective", "allgather",
               "-o", str(tmp_path / "ag.rccl"), "--json"])
    waited = time.perf_counter() - before
    assert rc == 0
    took = json.loads(capsys.readouterr().out)["command_seconds"]
    parts = {k: v for k, v in took.items() if k != "total"}
    assert list(parts)[:3] == ["start-up", "synthesis", "writing"]
    assert sum(parts.values()) == pytest.approx(took["total"], abs=0.005)
    assert 0 < took["total"] <= waited + 0.0005        # (rounded to ms)
    rc = main(["synth", str(ROOT / "examples" / "clusters" / "v100_4_8.topo"), "--collective", "allgather",
               "-o", str(tmp_path / "ag.rccl")])
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "from the command's start" in ln)
    total = float(re.search(r"synth: ([0-9.]+) s from", line).group(1))
    shown = [float(v) for v in re.findall(r" ([0-9.]+) s", line.split(": ", 2)[2])]
    assert rc == 0 and sum(shown) == pytest.approx(total, abs=0.02)





def test_compile_timings_end_with_the_wall_time_from_the_command_start(capsys, tmp_path):
    before = time.perf_counter()
    assert main([str(ROOT / "examples" / "ring_allreduce_8.rccl"), "-o", str(tmp_path / "out"), "--timings"]) == 0
    waited = time.perf_counter() - before
    lines = capsys.readouterr().out.splitlines()
    total = re.fullmatch(r"  total +([0-9.]+) s  \(wall time from the command's start.*\)", lines[-1])
    assert total, lines[-1]
    stages = [float(m.group(1)) for ln in lines[:-1]
              for m in [re.fullmatch(r"  \S+ +([0-9.]+) s", ln)] if m]       # one after another (none beside)
    assert stages and sum(stages) <= float(total.group(1)) + 0.001 <= waited + 0.002
