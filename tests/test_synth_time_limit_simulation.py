"""``hccc synth --time-limit`` bounds the whole command: the simulator's work budget and deadline
(:func:`hccc.runtime.simulator.simulate_by`), the channel fitting that keeps its best answer when
the deadline stops it, and the output that says what was not simulated."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.cli import main
from hccc.commands import synth as synth_cmd
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_algorithm, load_cluster
from hccc.runtime import simulator as sim
from hccc.runtime.simulator import SimulationStopped
from hccc.util import clock

REPO = Path(__file__).resolve().parents[1]
CLUSTERS = REPO / "examples" / "clusters"
MiB = 1 << 20


@pytest.fixture(scope="module")
def ring():
    """A ring AllGather on a100_topo1 prepared for the simulator, and its unbudgeted run."""
    topo = load_cluster(CLUSTERS / "a100_topo1.topo")
    prog = sim.prepare(build_program(load_algorithm(REPO / "examples" / "ring_allgather_8.rccl")), topo)
    full = sim.simulate(prog, topo, 64 * MiB)
    return topo, prog, full, full.events + full.stats["share_classes"]


@settings(max_examples=examples(12))
@given(frac=st.floats(0.0, 2.0))
def test_work_budget_stops_exactly_when_the_work_is_more(ring, frac):
    """A budget at least the run's work (events plus re-shared flow classes, counted by the unbudgeted
    run) changes nothing; a smaller one stops the run with SimulationStopped, never a result."""
    topo, prog, full, work = ring
    budget = int(work * frac)
    if budget >= work:
        r = sim.simulate(prog, topo, 64 * MiB, work_budget=budget)
        assert r.time_s == full.time_s and r.events == full.events
    else:
        with pytest.raises(SimulationStopped) as exc:
            sim.simulate(prog, topo, 64 * MiB, work_budget=budget)
        assert exc.value.work <= budget + 2 * prog.ntbs + 2 * len(prog.c_total)   # stops after the instant
        assert isinstance(exc.value, sim.SimulationError)


def test_work_floor_refuses_before_running(ring):
    """A budget below an event per sending primitive and micro-batch does not start the engine."""
    topo, prog, full, _ = ring
    sends = int((prog.p_flags & 1).astype(bool).sum())
    floor = sends * full.micro_batches
    assert floor <= full.events          # the floor is a true lower bound of the run's events
    with pytest.raises(SimulationStopped, match="not started") as exc:
        sim.simulate(prog, topo, 64 * MiB, work_budget=floor - 1)
    assert exc.value.work == 0


def test_simulate_by_deadline(ring, monkeypatch):
    topo, prog, full, work = ring
    with pytest.raises(SimulationStopped, match="no time left"):
        sim.simulate_by(clock.now() - 1.0, prog, topo, 64 * MiB)
    assert sim.simulate_by(clock.now() + 600.0, prog, topo, 64 * MiB).time_s == full.time_s
    # a rate at which the time left does not buy the run's least work (an event per sending
    # primitive and micro-batch): not started
    sends = int((prog.p_flags & 1).astype(bool).sum())
    monkeypatch.setattr(sim, "work_rate", lambda: sends * full.micro_batches / 2 / 100.0)
    with pytest.raises(SimulationStopped, match="not started"):
        sim.simulate_by(clock.now() + 100.0, prog, topo, 64 * MiB)



def test_an_assumed_rate_does_not_stop_a_run_the_clock_allows(ring, monkeypatch):
    """Before a process has timed a simulation the rate it assumes only refuses runs whose least
    work the time left cannot buy; the run itself stops by the clock. Here three quarters of the
    work is bought at the assumed rate (above the floor): a work budget stopped such a first run,
    which then ran again at the rate it measured (the whole of it once more); now it runs once."""
    topo, prog, full, work = ring
    monkeypatch.setattr(sim, "_measured_rate", [])
    monkeypatch.setattr(sim, "ASSUMED_WORK_PER_S", work * 3 / 4 / 100.0)
    runs = []
    real = sim.simulate
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: runs.append(k.get("work_budget")) or real(*a, **k))
    r = sim.simulate_by(clock.now() + 100.0, prog, topo, 64 * MiB)
    assert r.time_s == full.time_s and runs == [None] or not sim.eng.HAVE_CLOCK


def test_the_clock_stops_a_run_past_its_deadline(ring, monkeypatch):
    """A deadline that passes while the event loop runs stops it at the next look at the clock,
    with :class:`SimulationStopped` saying so (here a deadline a second past)."""
    topo, prog, full, work = ring
    if not sim.eng.HAVE_CLOCK:
        pytest.skip("no clock_gettime on this platform")
    monkeypatch.setattr(sim.eng, "_clock_deadline",
                        lambda d: 0.0 if d is None else max(1e-9, sim.eng.clock_now() - 1.0))
    with pytest.raises(SimulationStopped, match="its deadline") as exc:
        sim.simulate_by(clock.now() + 100.0, prog, topo, 64 * MiB)
    assert exc.value.work < work


# ---------------------------------------------------------------- channel fitting
class ScriptedSimulations(synth_cmd.Simulations):
    """Simulations whose times come from a table (channels -> seconds, None: the unlimited
    program), stopping (the deadline) after ``stop_after`` simulations."""

    def __init__(self, table: dict, stop_after: int | None = None, steps: list | None = None):
        self.table = table
        self.steps = list(synth_cmd.CHANNEL_STEPS) if steps is None else list(steps)
        self.stop_after = stop_after
        self.calls: list = []
        self.times = {}
        self.stopped = False
        self.failed = None
        self.available = True
        self.deadline = clock.now() + 3600.0

    def _key(self, result):
        return ("p",)

    def channel_steps(self, result):
        return list(self.steps)

    def seconds(self, result, channels):
        if ("p", channels) in self.times:
            return self.times[("p", channels)]
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            self.stopped = True
            return None
        self.calls.append(channels)
        self.times[("p", channels)] = self.table[channels]
        return self.table[channels]


class _Result:
    def __init__(self, channels: int, bound: float):
        self.detail = {"channels": channels, "cut_bound_seconds": bound}


@st.composite
def channel_tables(draw):
    """Times non-increasing in channels over CHANNEL_STEPS, the unlimited time at most the
    fewest's and at least the bound; the counts that stay resident (a prefix of CHANNEL_STEPS, as
    few as one: a program of many thread blocks) and the packing's own count (any step)."""
    steps = synth_cmd.CHANNEL_STEPS
    bound = 1.0
    free = bound * draw(st.sampled_from([1.0, 1.001, 1.01, 1.2]))
    t, table = free * draw(st.floats(1.0, 4.0)), {}
    for c in steps:
        table[c] = max(free, t)
        t = t / draw(st.sampled_from([1.0, 1.0, 1.002, 1.3, 2.0]))
    table[None] = free
    resident = list(steps[:draw(st.integers(1, len(steps)))])
    return table, bound, draw(st.sampled_from(steps)), resident


@settings(max_examples=examples(60))
@given(case=channel_tables())
def test_fit_channels_against_brute_force(case):
    """The fitted count is the fewest of CHANNEL_STEPS whose time is within the tolerance of the
    reference (the bound where the packing's own count already meets it, else the unlimited
    time), found by trying every count; the packing's count confirmed at the bound costs one
    simulation, and so does the only count that stays resident."""
    table, bound, own, resident = case
    sims = ScriptedSimulations(table, steps=resident)
    res = _Result(own, bound)
    t = synth_cmd._fit_channels(res, None, 1 << 30, sims)
    tol = synth_cmd.FIT_TOLERANCE
    start = max([c for c in resident if c <= own] or [resident[0]])     # the packing's, resident
    ref = bound if table[start] <= bound * (1 + tol) else table[None]
    ok = [c for c in resident if table[c] <= ref * (1 + tol)]
    want = min(ok) if ok else max(resident)
    assert res.detail["channels"] == want and res.detail["channels_fitted"] is True
    assert t == table[want]
    if table[start] <= bound * (1 + tol):
        assert None not in sims.calls          # no unlimited simulation at the bound
    if start == 1 and table[1] <= bound * (1 + tol):
        assert sims.calls == [1]
    if len(resident) == 1:                     # nothing to choose: one simulation, no unlimited one
        assert sims.calls == resident


@settings(max_examples=examples(40))
@given(case=channel_tables(), stop=st.integers(0, 4))
def test_fit_channels_stopped_keeps_the_best_known(case, stop):
    """Stopped by the deadline after ``stop`` simulations: the fewest count known to pass, else the
    packing's own; marked not fitted; the time returned is that count's, when it was simulated."""
    table, bound, own, resident = case
    full = ScriptedSimulations(table, steps=resident)
    _Result_full = _Result(own, bound)
    synth_cmd._fit_channels(_Result_full, None, 1 << 30, full)
    sims = ScriptedSimulations(table, stop_after=stop, steps=resident)
    res = _Result(own, bound)
    t = synth_cmd._fit_channels(res, None, 1 << 30, sims)
    if len(full.calls) <= stop:                 # the deadline came after the fitting's last simulation
        assert res.detail == _Result_full.detail and not sims.stopped
        return
    assert sims.stopped and res.detail["channels_fitted"] is False
    ch = res.detail["channels"]
    tol = synth_cmd.FIT_TOLERANCE
    start = max([c for c in resident if c <= own] or [resident[0]])     # the packing's, resident
    ref = bound if start in sims.calls and table[start] <= bound * (1 + tol) \
        else table[None] if None in sims.calls else None
    passed = [c for c in sims.calls if c is not None and ref is not None and table[c] <= ref * (1 + tol)]
    assert ch == (min(passed) if passed else start)
    assert t == (table[ch] if ch in sims.calls else None)


# ---------------------------------------------------------------- the command
def _synth_json(capsys, *argv) -> dict:
    assert main(["synth", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_time_limit_reached_says_not_simulated(tmp_path, capsys):
    """A limit spent by the packing alone: the program is written, proved, and says that neither
    its fraction of the bound nor its channels were simulated, in the JSON, the printed line and
    the program's comments."""
    out = tmp_path / "ag.rccl"
    t0 = time.perf_counter()
    s = _synth_json(capsys, CLUSTERS / "a100_topo1.topo", "--collective", "allgather", "--method", "trees",
                    "--time-limit", "0.001", "-o", out)
    assert s["fraction_of_bound"] is None and s["not_simulated"] == "time limit"
    assert s["channels_fitted"] is False and s["simulations_stopped"] is True
    assert s["methods_tried"] == {"trees": None}
    text = out.read_text()
    assert "not simulated during synthesis (time limit" in text
    assert "not confirmed by simulation (time limit)" in text
    load_algorithm(out)
    assert main(["synth", str(CLUSTERS / "a100_topo1.topo"), "--collective", "allgather", "--method", "trees",
                 "--time-limit", "0.001", "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert "fraction of the cluster's cut bound not simulated (time limit)" in line and "not fitted: time limit" in line
    assert time.perf_counter() - t0 < 60       # two packings of 8 GPUs, nothing simulated


def test_simulation_stopped_by_the_deadline(tmp_path, capsys, monkeypatch):
    """The deadline stops a simulation that has started: the program is still written, reported
    as not simulated for the time limit."""
    calls = []
    real = sim.simulate

    def counting(*a, **kw):
        try:
            return real(*a, **kw)
        except SimulationStopped as exc:
            calls.append(str(exc))
            raise

    monkeypatch.setattr(sim, "simulate", counting)
    # every run's deadline a second past: each stops at its first look at the clock
    if not sim.eng.HAVE_CLOCK:
        pytest.skip("no clock_gettime on this platform")
    monkeypatch.setattr(sim.eng, "_clock_deadline",
                        lambda d: 0.0 if d is None else max(1e-9, sim.eng.clock_now() - 1.0))
    s = _synth_json(capsys, CLUSTERS / "heteccl_fig10.topo", "--collective", "allgather", "--method", "trees",
                    "--time-limit", "30", "-o", tmp_path / "ag.rccl")
    assert calls and all("stopped at its deadline" in c for c in calls)
    assert s["fraction_of_bound"] is None and s["not_simulated"] == "time limit"
    assert s["channels_fitted"] is False


def test_fraction_unchanged_by_reuse(tmp_path, capsys):
    """The fraction ``synth`` reports (simulated once, its time reused by the shape choice and the
    channel fitting) is the written program's own, simulated here from the file."""
    out = tmp_path / "rs.rccl"
    s = _synth_json(capsys, CLUSTERS / "heteccl_fig10.topo", "--collective", "reducescatter", "--method", "trees",
                    "-o", out)
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    alg = load_algorithm(out)
    ir = build_program(alg)
    ir.nchannels = alg.header.nchannels
    t = sim.simulate(ir, topo, 1 << 30, slice_bytes="auto").time_s
    assert s["fraction_of_bound"] == pytest.approx(s["bandwidth_bound"]["seconds"] / t, rel=1e-9)


@pytest.mark.slow
def test_time_limit_bounds_the_simulations_at_64_gpus(tmp_path):
    """64 H800s on 8 multi-rail nodes with a 2 s limit: the packing fits in it, the simulations
    after it (about 10 s of CPU before they were bounded) do not, and the command ends within a
    few seconds of CPU past the limit, its program written and saying what was not simulated."""
    import resource
    import subprocess
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from synth_quality import multirail_text

    topo = tmp_path / "mr64.topo"
    topo.write_text(multirail_text(8))
    out = tmp_path / "ag.rccl"
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "hccc", "synth", str(topo), "--collective", "allgather",
                        "--time-limit", "2", "-o", str(out), "--json"], capture_output=True, text=True, timeout=600)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    print(f"64 GPUs, --time-limit 2: {cpu:.1f} s CPU, not simulated: {s['not_simulated']}")
    assert cpu < 2 + 6, s          # imports, one program build, writing
    assert s["fraction_of_bound"] is not None or s["not_simulated"] == "time limit"
    assert out.exists()
