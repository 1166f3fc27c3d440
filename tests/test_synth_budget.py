"""``--time-limit`` in every phase (compiler/synth/budget.py): the search leaves the closing phases
(proof, text) their predicted time, and the AllToAll routing leaves its list scheduler its own;
the predictions rest on the fewest transfers a program can have, which every valid program meets."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from conftest import examples

from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.synth import alltoall as a2a, budget, synthesize
from hccc.testing import valid_programs
from hccc.util import clock

from cluster_texts import many_nodes_text

SYNTH = ["allgather", "broadcast", "reducescatter", "allreduce", "alltoall"]


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(SYNTH, max_ranks=8))
def test_every_valid_program_has_at_least_the_least_transfers(alg):
    h = alg.header
    assert len(alg) >= budget.least_transfers(h.collective.value, h.nranks, h.chunks_per_rank)


def test_the_least_transfers_are_reached_by_direct_programs():
    """The count is tight where a program sends every chunk straight to where it is needed."""
    from hccc.compiler.frontend import generators as gen
    for n in (2, 5):
        assert len(gen.direct_allgather(n)) == budget.least_transfers("allgather", n)
        assert len(gen.direct_alltoall(n)) == budget.least_transfers("alltoall", n)
        assert len(gen.direct_broadcast(n, 0)) == budget.least_transfers("broadcast", n)


def test_the_routing_leaves_the_scheduler_its_predicted_time(monkeypatch):
    """With a scheduler predicted to take longer than the whole limit, no block is routed: every
    block takes its direct link at once, and the synthesis still ends with a valid program well
    within a generous limit; with none predicted, the routing of 32 GPUs ends by itself."""
    topo = parse_topology(many_nodes_text(4), "n4.topo")
    seen = []
    monkeypatch.setattr(a2a, "schedule_seconds", lambda m, s: seen.append((m, s)) or 1e6)
    t0 = clock.now()
    res = synthesize(topo, "alltoall", time_limit=60.0)
    assert clock.now() - t0 < 30
    assert res.timed_out and res.detail["max_path_hops"] == 1 and res.detail["relayed_blocks"] == 0
    assert seen == [(32 * 31, res.lower_bound_steps)]
    assert set(res.detail["phase_seconds"]) == {"step_bound", "routing", "scheduling"}
    monkeypatch.setattr(a2a, "schedule_seconds", lambda m, s: 0.0)
    assert not synthesize(topo, "alltoall", time_limit=60.0).timed_out


def test_the_search_leaves_the_closing_phases_their_predicted_time(monkeypatch, tmp_path, capsys):
    """A closing predicted at a second per transfer leaves a 60 s search nothing on 32 GPUs (992
    transfers): the program is the direct one, proven and written, and the report says what each
    phase took and what the closing was predicted to take."""
    from hccc.cli import main

    monkeypatch.setattr(budget, "CLOSING_SECONDS_PER_TRANSFER", 1.0)
    p = tmp_path / "n4.topo"
    p.write_text(many_nodes_text(4))
    t0 = clock.now()
    assert main(["synth", str(p), "--collective", "alltoall", "--time-limit", "60", "-o", str(tmp_path / "a.rccl"),
                 "--json"]) == 0
    assert clock.now() - t0 < 30
    got = json.loads(capsys.readouterr().out)
    took = got["phase_seconds"]
    assert got["timed_out"] and took["closing_predicted"] == pytest.approx(32 * 31)
    assert {"search", "proof", "text", "step_bound", "routing", "scheduling", "cut_bound"} <= set(took)
    assert (tmp_path / "a.rccl").read_text().count("transfer(") == got["transfers"]


def test_alltoall_command_holds_its_limit_on_128_gpus(tmp_path, capsys):
    """The whole command, reading the cluster and writing the program included, on 128 GPUs with a
    one-second limit: its phases add up to the limit and the few seconds that cannot stop (the list
    scheduler, the proof and the text; docs/measurements.md#synthesis-speed-at-64-gpus-no-gpu), with
    room for a loaded machine."""
    from hccc.cli import main

    p = tmp_path / "n16.topo"
    p.write_text(many_nodes_text(16))
    t0 = clock.now()
    assert main(["synth", str(p), "--collective", "alltoall", "--time-limit", "1", "-o", str(tmp_path / "a.rccl"),
                 "--json"]) == 0
    took = clock.now() - t0
    got = json.loads(capsys.readouterr().out)
    assert got["timed_out"] and got["transfers"] >= 128 * 127
    assert took < 1 + 12, (took, got["phase_seconds"])


def test_the_scheduler_prediction_counts_its_kernel_load_only_where_it_runs_compiled():
    from hccc.compiler.synth.compose import MIN_COMPILED_TRANSFERS

    small = MIN_COMPILED_TRANSFERS - 1
    assert budget.schedule_seconds(small, 10) == pytest.approx(budget.SCHEDULE_SECONDS_PER_TRANSFER_STEP * small * 10)
    big = 512 * 511
    assert budget.schedule_seconds(big, 2016) == pytest.approx(
        budget.SCHEDULER_LOAD_SECONDS + budget.SCHEDULE_SECONDS_PER_TRANSFER_STEP * big * 2016)
