"""Schedule synthesis (hccc.compiler.synth): correctness against the verifier, the numpy reference
executor and the CPU emulation; the model checker's counterexamples; composition."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.passes.build import build_program
from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                format_topology, parse_topology)
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import (Schedule, allgather_task, broadcast_task, network_from_topology, synthesize,
                                 to_algorithm, to_rccl)
from hccc.compiler.synth.bounds import step_lower_bound
from hccc.compiler.synth.cegis import synthesize_task
from hccc.compiler.synth.check import check
from hccc.compiler.synth.compose import plan_pods
from hccc.compiler.synth.problem import replay
from hccc.compiler.frontend import parse_rccl
from hccc.compiler.cluster.topology_check import check_on_topology
from hccc.compiler.passes.verify import verify
from hccc.runtime.reference import execute, expected_for, inputs_for
from hccc.util import clock
from synth_oracles import mixed_clusters

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"


def _run_reference(alg, count: int = 96):
    ir = build_program(alg)
    inputs = inputs_for(ir, count, "int32", seed=3)
    got = execute(ir, inputs, op="sum")
    want = expected_for(ir, inputs, "sum")
    for r, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"rank {r}: reference executor disagrees with the oracle"


def _assert_valid(result, topo):
    alg = to_algorithm(result, topo)
    verify(alg)
    check_on_topology(alg, topo)
    assert result.steps >= result.lower_bound_steps
    # the text parses back to exactly the same transfers
    back = parse_rccl(to_rccl(result, topo), "synth.rccl")
    for field in ("nranks", "collective", "name", "gpu_per_node", "nic_per_node", "root", "chunks_per_rank"):
        assert getattr(back.header, field) == getattr(alg.header, field)
    assert sorted(back.rows()) == sorted(alg.rows())
    return alg


# ---------------------------------------------------------------- example clusters
# the two 32-GPU clusters take 8-16 s each: slow set
@pytest.mark.parametrize("name", [pytest.param("v100_4_8", marks=pytest.mark.slow),
                                  pytest.param("h20_4_8", marks=pytest.mark.slow), "heteccl_fig10",
                                  "v100_4x3", "a100_topo1"])
def test_allgather_on_example_clusters_is_valid_and_near_the_bound(name):
    topo = load_cluster(CLUSTERS / f"{name}.topo")
    res = synthesize(topo, "allgather", time_limit=20)
    alg = _assert_valid(res, topo)
    net = network_from_topology(topo)
    task = allgather_task(topo.nranks)
    sched = Schedule(alg.src, alg.dst, alg.step, alg.chunk)
    assert check(net, task, sched) == []  # link and shared-group capacities hold at every step
    assert res.steps <= res.lower_bound_steps + 1
    assert res.ntransfers == task.demand  # every rank receives every chunk exactly once
    _run_reference(alg)


@pytest.mark.slow
@pytest.mark.parametrize("coll", ["reducescatter", "allreduce"])
def test_reductions_on_v100_4_8(coll):
    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    res = synthesize(topo, coll, time_limit=10)
    alg = _assert_valid(res, topo)
    _run_reference(alg)
    if coll == "allreduce":
        rs, ag = res.phases
        assert rs.name == "reducescatter" and ag.name == "allgather" and ag.step0 == rs.steps
        assert res.lower_bound_steps == rs.result.bound.steps + ag.result.bound.steps


def test_reducescatter_is_the_time_reversed_allgather():
    """Every rrc of the synthesised ReduceScatter, turned around and run backwards in time, is an
    AllGather transfer valid on the transposed network with Eq. 8 (one forward per chunk per step)."""
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    res = synthesize(topo, "reducescatter", time_limit=10)
    rows = res.rows
    assert (rows[:, 4] == 1).all()
    T = res.steps
    fwd = Schedule(rows[:, 1].copy(), rows[:, 0].copy(), T - 1 - rows[:, 2], rows[:, 3].copy())
    net = network_from_topology(topo).transposed()
    assert check(net, allgather_task(topo.nranks, fanout_one=True), fwd) == []


# ---------------------------------------------------------------- property: random clusters
@pytest.mark.slow   # a minute of the default run went to a few CLI and random-cluster runs
@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=mixed_clusters(), coll=st.sampled_from(["allgather", "reducescatter", "allreduce", "broadcast"]),
       k=st.sampled_from([1, 1, 2]), data=st.data())
def test_random_clusters_verify_and_match_the_reference(topo, coll, k, data):
    root = data.draw(st.integers(0, topo.nranks - 1)) if coll == "broadcast" else 0
    res = synthesize(topo, coll, time_limit=4, root=root, chunks_per_rank=k)
    alg = _assert_valid(res, topo)
    assert alg.header.chunks_per_rank == k and alg.header.root == root
    _run_reference(alg)
    net = network_from_topology(topo)
    if coll in ("allgather", "broadcast"):
        sched = Schedule(alg.src, alg.dst, alg.step, alg.chunk)
        task = allgather_task(topo.nranks, k) if coll == "allgather" else broadcast_task(topo.nranks, root, k)
        assert check(net, task, sched) == []


def _launcher():
    try:
        from hccc.runtime.launcher import run_program
    except ImportError:
        return None
    import shutil
    return run_program if shutil.which("g++") else None


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=mixed_clusters(max_nodes=2, max_gpus=3),
       coll=st.sampled_from(["allgather", "reducescatter", "allreduce", "broadcast"]))
def test_random_clusters_run_in_cpu_emulation(topo, coll):
    run_program = _launcher()
    if run_program is None:
        pytest.skip("CPU emulation (hccc.runtime.launcher and g++) not available")
    res = synthesize(topo, coll, time_limit=3, root=topo.nranks - 1)
    alg = _assert_valid(res, topo)
    out = run_program(build_program(alg, chunk_bytes=256), backend="cpu", nbytes=4096 + 12, dtype="float32",
                      op="sum", timeout_s=20)
    assert out.stuck is None and out.wrong == 0


# ---------------------------------------------------------------- counterexamples
def _fig10():
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    return topo, network_from_topology(topo), allgather_task(topo.nranks)


def test_check_reports_each_violation_kind():
    topo, net, task = _fig10()
    # ranks 0,1 (node 1) and 2..5 (node 2); 2->3 is direct (cap 8), node-1 <-> node-2 via a shared switch
    kinds = lambda rows: {c.kind for c in check(net, task, Schedule.from_rows(rows))}
    assert "causality" in kinds([(0, 1, 0, 2)])                     # rank 0 does not hold chunk 2
    assert "receive-once" in kinds([(0, 1, 0, 0), (0, 1, 1, 0)])    # received twice
    assert "receive-once" in kinds([(1, 0, 0, 1), (1, 0, 0, 1)])
    grp = [(s, d, 0, s) for s in (0, 1) for d in (2, 3, 4, 5)]      # 8 chunks through the 0,1 -> 2..5 group
    assert "group" in kinds(grp)
    assert kinds([(2, 3, 0, 2)]) == {"postcondition"}              # valid, but incomplete
    assert "postcondition" in kinds([])
    fan_task = allgather_task(topo.nranks, fanout_one=True)
    assert any(c.kind == "fanout" for c in check(net, fan_task, Schedule.from_rows([(2, 3, 0, 2), (2, 4, 0, 2)])))
    # capacity of one link: the internode links 0 -> 2 carry C = 1 chunk per step
    p = int(net.pair_index([0], [2])[0])
    assert net.cap[p] == 1
    over = [(0, 2, 0, 0), (0, 2, 1, 0)]
    assert "receive-once" in kinds(over)
    two = Schedule.from_rows([(0, 1, 0, 0), (1, 0, 0, 1), (0, 2, 1, 0), (0, 2, 1, 1)])
    assert any(c.kind == "link" for c in check(net, task, two))


def test_checkpoint_is_the_earliest_violation():
    topo, net, task = _fig10()
    res = synthesize_task(net, task, deadline=clock.now() + 10)
    good = res.schedule
    assert check(net, task, good) == []
    # corrupt one transfer at the last step: the first counterexample is at that step
    last = good.nsteps - 1
    bad = Schedule(good.src.copy(), good.dst.copy(), good.step.copy(), good.chunk.copy())
    i = int(np.flatnonzero(bad.step == last)[0])
    bad.src[i] = bad.dst[i]  # self transfer: no such link
    cex = check(net, task, bad, stop_after_first_step=True)
    assert cex and min(c.step for c in cex) == last


# ---------------------------------------------------------------- CEGIS and z3
def test_cegis_learns_groups_and_repairs_with_z3():
    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    net = network_from_topology(topo)
    task = allgather_task(topo.nranks)
    res = synthesize_task(net, task, deadline=clock.now() + 20)
    assert res.iterations >= 1 and res.learned_groups >= 1  # the first greedy schedule overloads NICs
    assert res.smt["calls"] >= 1
    assert check(net, task, res.schedule) == []
    # greedy only (no z3) is valid as well
    res2 = synthesize_task(net, task, deadline=clock.now() + 20, use_smt=False)
    assert check(net, task, res2.schedule) == []


def test_time_limit_still_returns_a_valid_schedule():
    topo = load_cluster(CLUSTERS / "h20_4x2_8x2.topo")
    res = synthesize(topo, "allgather", time_limit=1e-3)
    assert res.timed_out
    _assert_valid(res, topo)


def test_broadcast_schedule():
    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    net = network_from_topology(topo)
    task = broadcast_task(topo.nranks, 5)
    res = synthesize_task(net, task, deadline=clock.now() + 10)
    assert check(net, task, res.schedule) == []
    assert res.steps >= res.bound.steps
    # the root's egress bounds the steps: 12 chunks leave rank 5 at most `out` per step
    assert res.bound.steps >= 2
    full = replay(task, res.schedule)
    assert full.all()


def test_chunks_per_rank_schedule():
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    net = network_from_topology(topo)
    task = allgather_task(topo.nranks, 2)
    res = synthesize_task(net, task, deadline=clock.now() + 10)
    assert check(net, task, res.schedule) == []
    assert len(res.schedule) == task.demand


# ---------------------------------------------------------------- composition
def _pods(npods: int, odd_last: bool = False):
    nodes = []
    for p in range(npods):
        for g in (2, 4):
            if odd_last and p == npods - 1 and g == 4:
                g = 2
            nodes.append(NodeSpec(g, {"direct": [LinkSpec(a, b, 25, 2) for a in range(g) for b in range(g) if a != b]},
                                  nics=[NicSpec(tuple(range(a, min(a + 2, g))), 8) for a in range(0, g, 2)]))
    return parse_topology(format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")], chunksize="1M")),
                          "pods.topo")


@pytest.mark.slow
@pytest.mark.parametrize("coll", ["allgather", "allreduce"])
def test_composition_over_identical_pods(coll):
    topo = _pods(3)
    net = network_from_topology(topo)
    plan = plan_pods(net, allgather_task(topo.nranks), 6)
    assert plan is not None and plan.npods == 3
    res = synthesize(topo, coll, time_limit=20, pod_ranks=6)
    assert res.composed is not None
    alg = _assert_valid(res, topo)
    _run_reference(alg)


def test_composition_needs_identical_pods():
    topo = _pods(3, odd_last=True)
    net = network_from_topology(topo)
    with pytest.raises(ValueError, match="identical pods"):
        plan_pods(net, allgather_task(topo.nranks), 6)
    assert plan_pods(net, allgather_task(topo.nranks), None) is None  # small: flat


def test_lower_bound_is_a_bound_for_composed_schedules():
    topo = _pods(4)
    res = synthesize(topo, "allgather", time_limit=20, pod_ranks=6)
    net = network_from_topology(topo)
    assert res.steps >= step_lower_bound(net, allgather_task(topo.nranks)).steps


# ---------------------------------------------------------------- variants, selection, determinism
@pytest.mark.slow   # a timed search of three variants (4 s idle, up to 25 s under the suite's load)
def test_variant_selection_follows_the_score():
    topo = load_cluster(CLUSTERS / "v100_4x2_8.topo")
    seen = []

    def score(phase, rows):
        seen.append((phase, rows.shape))
        return -float(len(seen))  # the last candidate scored wins

    res = synthesize(topo, "allgather", time_limit=30, variants=3, score=score)
    ph = res.phases[0].result
    assert ph.variants == 3
    assert len(seen) in (0, 2, 3)  # only variants with the fewest steps are scored
    if seen:
        assert all(p == "allgather" and shape[1] == 5 for p, shape in seen)
        assert ph.variant > 0  # a later candidate (lower score) beat variant 0
    _assert_valid(res, topo)


@pytest.mark.slow
def test_allreduce_candidates_are_scored_as_whole_programs():
    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    phases = []
    res = synthesize(topo, "allreduce", time_limit=30, variants=2,
                     score=lambda phase, rows: phases.append((phase, int(rows[:, 4].sum()))) or 0.0)
    assert {p for p, _ in phases} <= {"allgather", "allreduce"}
    for p, nrrc in phases:  # AllReduce candidates carry the ReduceScatter half as rrc rows
        assert (nrrc > 0) == (p == "allreduce")
    _assert_valid(res, topo)


def test_simulated_score_ranks_programs():
    from hccc.commands.synth import simulated_score

    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    score = simulated_score(topo, 1 << 24)
    if score is None:
        pytest.skip("simulator not available")
    res = synthesize(topo, "allgather", time_limit=10)
    t = score("allgather", res.rows)
    assert t > 0
    # a program that sends everything twice as far (ring order) is not faster than the bound allows
    from hccc.compiler.synth import bandwidth_cut_bound
    assert t >= bandwidth_cut_bound(network_from_topology(topo), "allgather", 12, 1, 0, 1 << 24) * 0.999


@pytest.mark.slow
def test_same_input_same_schedule():
    topo = load_cluster(CLUSTERS / "h20_4x3.topo")
    a = synthesize(topo, "allreduce", time_limit=60)
    b = synthesize(topo, "allreduce", time_limit=60)
    assert np.array_equal(a.rows, b.rows)
