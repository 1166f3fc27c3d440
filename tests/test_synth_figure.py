"""The report's figure (driver/synth_figure.py, ``hccc synth --exact``): an estimated time's interval
holds the whole call's simulated time (the oracle: the event loop over every micro-batch) on
generated clusters; the program written is byte-identical with and without ``--exact``; ``--json``
says whether the figure is estimated and gives its interval."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from sim_programs import periodic_call
from hccc.cli import main
from hccc.runtime.simulator import simulate
from hccc.runtime.sim_periodic import simulate_periodic
from hccc import synth_figure
from hccc.synth_figure import ESTIMATE_FLOOR, estimate_interval, whole_work

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


@settings(max_examples=examples(25), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_estimates_interval_holds_the_whole_calls_time(data):
    """Where the samples' periods agree and the time is extrapolated, the whole call's simulated
    time lies inside :func:`estimate_interval`, whose half-width is at least :data:`ESTIMATE_FLOOR`
    of the time; the predicted work of the whole call is within a factor of two of what it took.
    Random programs of the tree collectives on random clusters, many micro-batches a chunk."""
    prog, topo, nbytes = periodic_call(data, 24)
    found = simulate_periodic(prog, topo, nbytes, slice_bytes=None)
    if not found.extrapolated:
        return
    whole = simulate(prog, topo, nbytes, slice_bytes=None)
    low, high = estimate_interval(found)
    assert low <= whole.time_s <= high
    assert high - found.time_s >= ESTIMATE_FLOOR * found.time_s * (1 - 1e-12)
    assert whole.events / 2 <= whole_work(found) <= 2 * whole.events


def _synth(tmp_path, capsys, name: str, *args: str) -> tuple[dict, bytes]:
    out = tmp_path / f"{name}.rccl"
    assert main(["synth", str(CLUSTERS / "a100_topo1.topo"), "--collective", "allgather", "--method", "trees",
                 "--select-size", "16G", "-o", str(out), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out), out.read_bytes()


def test_past_the_work_budget_the_figure_is_estimated_and_exact_gives_the_same_program(tmp_path, capsys,
                                                                                     monkeypatch):
    """An AllGather of 64 micro-batches a chunk (8 A100s at 16 GiB), its time extrapolated by the
    selection: with no work budget for the figure, the report gives the estimate and its interval;
    ``--exact`` gives the whole call's figure, inside that interval; the two programs are the same
    bytes. Within the budget the figure is exact without ``--exact``."""
    monkeypatch.setattr(synth_figure, "FIGURE_WORK_BUDGET", 0)
    est, text = _synth(tmp_path, capsys, "estimated")
    assert est["figure_estimated"] is True and "estimated from 3 short calls" in est["figure"]
    low, high = est["fraction_of_bound_interval"]
    assert low < est["fraction_of_bound"] < high
    exact, exact_text = _synth(tmp_path, capsys, "exact", "--exact")
    assert exact["figure_estimated"] is False and "--exact" in exact["figure"]
    assert exact["fraction_of_bound_interval"] == [exact["fraction_of_bound"]] * 2
    assert low <= exact["fraction_of_bound"] <= high
    assert exact_text == text
    monkeypatch.setattr(synth_figure, "FIGURE_WORK_BUDGET", 10 ** 9)
    within, within_text = _synth(tmp_path, capsys, "within")
    assert within["figure_estimated"] is False and "within the figure's work budget" in within["figure"]
    assert within["fraction_of_bound"] == exact["fraction_of_bound"] and within_text == text


def test_the_human_report_gives_the_estimate_with_its_uncertainty(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(synth_figure, "FIGURE_WORK_BUDGET", 0)
    assert main(["synth", str(CLUSTERS / "a100_topo1.topo"), "--collective", "allgather", "--method", "trees",
                 "--select-size", "16G", "-o", str(tmp_path / "a.rccl")]) == 0
    line = capsys.readouterr().out
    assert " +- " in line and "of the cluster's cut bound at 16G (estimated from 3 short calls" in line


def test_exact_simulates_a_program_the_selection_does_not(tmp_path, capsys, monkeypatch):
    """Past ``SIMULATE_MAX_RANKS`` GPUs the selection simulates nothing and the report has no
    figure; ``--exact`` simulates the written program whole for it, and writes the same bytes."""
    from hccc import synth_select
    monkeypatch.setattr(synth_select, "SIMULATE_MAX_RANKS", 4)
    none, text = _synth(tmp_path, capsys, "none")
    assert none["fraction_of_bound"] is None and none["figure_estimated"] is None
    assert none["fraction_of_bound_interval"] is None
    got, exact_text = _synth(tmp_path, capsys, "exact", "--exact")
    assert got["figure_estimated"] is False and 0 < got["fraction_of_bound"] <= 1
    assert exact_text == text


def test_exact_must_be_a_boolean():
    from hccc import synthesize
    from hccc.util.diagnostics import CompileError
    with pytest.raises(CompileError, match="--exact: expected True or False"):
        synthesize(str(CLUSTERS / "a100_topo1.topo"), "allgather", exact="yes")
