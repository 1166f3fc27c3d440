"""compiler/synth/smt.py's step repair: a repair whose first z3 call ends ``unknown`` returns its
greedy baseline, and later repairs no smaller go to that baseline without asking z3
(``SmtStats.skip_repair``); the baseline is checked against capacities recounted here."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import allgather_task, network_from_topology
from hccc.compiler.synth import smt
from hccc.compiler.synth.cegis import _weights, greedy_stop_at, synthesize_task
from hccc.compiler.synth.check import check, earliest_step
from hccc.compiler.synth.greedy import GreedyInputs
from hccc.util import clock

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"

pytestmark = pytest.mark.skipif(not smt.available(), reason="z3 not installed")


def _first_repair(name: str):
    """The network, task, first checkpoint step's candidate transfers and the groups learned there,
    as the CEGIS loop meets them on the example cluster ``name``."""
    topo = load_cluster(CLUSTERS / f"{name}.topo")
    net = network_from_topology(topo)
    task = allgather_task(topo.nranks)
    enforced = np.zeros(net.ngroups, np.uint8)
    deadline = clock.now() + 30
    sched, _ = GreedyInputs(net, task, variant=0).run(task.initial(), 0, task.demand + 1, enforced,
                                                      stop_at=greedy_stop_at(deadline))
    cex = check(net, task, sched, stop_after_first_step=True)
    assert cex, "the first greedy schedule overloads a shared group on this cluster"
    t = earliest_step(cex)
    enforced[[c.resource for c in cex if c.step == t]] = 1
    return net, task, sched.at(t), enforced.astype(bool)


def _feasible(net, task, cand, keep, enforced) -> bool:
    """Capacities recounted from the kept transfers: each pair's, each learned group's, receive-once."""
    src, dst, chunk = cand.src[keep], cand.dst[keep], cand.chunk[keep]
    pairs = net.pair_index(src, dst)
    if np.any(np.bincount(pairs, minlength=net.npairs) > net.cap):
        return False
    used = np.zeros(net.ngroups, np.int64)
    for q in pairs.tolist():
        used[net.groups_of(q)] += 1
    if np.any(used[enforced] > net.gcap[enforced]):
        return False
    got = dst.astype(np.int64) * task.nchunks + chunk
    return len(np.unique(got)) == len(got)


@pytest.mark.parametrize("name", ["v100_4_8", "h20_4x2_8x2"])
def test_unknown_repair_returns_its_baseline_and_later_ones_skip_z3(name):
    net, task, cand, enforced = _first_repair(name)
    stats = smt.SmtStats()
    rep = smt.StepRepair(net, task, cand, enforced, _weights(net, cand), stats)
    out = rep.solve(clock.now() + 30, per_call=1)      # one resource unit: z3 answers unknown at once
    assert stats.calls == 1 and stats.unknown == 1
    assert stats.repair_unknown_at == len(cand)
    # what it returned is the greedy subset the skipping path takes, and that subset is feasible
    keep = smt.greedy_subset(net, cand, net.pair_index(cand.src, cand.dst), enforced, _weights(net, cand),
                             task.fanout_one)
    assert len(out) == int(keep.sum())
    assert sorted(zip(out.src.tolist(), out.dst.tolist(), out.chunk.tolist())) == \
        sorted(zip(cand.src[keep].tolist(), cand.dst[keep].tolist(), cand.chunk[keep].tolist()))
    assert _feasible(net, task, cand, keep, enforced)
    assert keep.sum() > 0
    # a repair no smaller is skipped, a smaller one is still asked
    assert stats.skip_repair(len(cand)) and stats.skip_repair(len(cand) + 5)
    assert not stats.skip_repair(len(cand) - 1)
    assert stats.repairs_skipped == 2


def test_a_repair_that_proves_or_improves_records_nothing():
    net, task, cand, enforced = _first_repair("v100_4_8")
    stats = smt.SmtStats()
    rep = smt.StepRepair(net, task, cand, enforced, _weights(net, cand), stats)
    out = rep.solve(clock.now() + 30)
    assert stats.unknown == 0 and stats.repair_unknown_at == 0
    assert not stats.skip_repair(len(cand))
    keep = np.zeros(len(cand), bool)
    idx = {(s, d, c): i for i, (s, d, c) in enumerate(zip(cand.src.tolist(), cand.dst.tolist(), cand.chunk.tolist()))}
    for row in zip(out.src.tolist(), out.dst.tolist(), out.chunk.tolist()):
        keep[idx[row]] = True
    assert _feasible(net, task, cand, keep, enforced)
    base = smt.greedy_subset(net, cand, net.pair_index(cand.src, cand.dst), enforced, _weights(net, cand),
                             task.fanout_one)
    assert keep.sum() >= base.sum()


def _rows(sched) -> list:
    return sorted(zip(sched.step.tolist(), sched.src.tolist(), sched.dst.tolist(), sched.chunk.tolist()))


@pytest.mark.parametrize("name", ["v100_4_8", "h20_4x2_8x2", "mixed_v100_w7800", "a100_topo2"])
@pytest.mark.parametrize("rlimit", [1, pytest.param(smt.REPAIR_RLIMIT, marks=pytest.mark.slow)])
def test_skipping_repairs_gives_the_schedule_every_repair_asked_gives(name, rlimit):
    """The oracle is the same search with every repair asked of z3 (``skip_unknown=False``): with
    one resource unit per call every z3 answer is ``unknown``, so later repairs are skipped; with
    the default limit these small clusters' repairs are answered, and nothing is skipped."""
    topo = load_cluster(CLUSTERS / f"{name}.topo")
    net = network_from_topology(topo)
    task = allgather_task(topo.nranks)
    runs = {skip: synthesize_task(net, task, deadline=clock.now() + 60, variants=3, minimize=False,
                                  repair_rlimit=rlimit, skip_unknown=skip)
            for skip in (True, False)}
    assert _rows(runs[True].schedule) == _rows(runs[False].schedule)
    assert check(net, task, runs[True].schedule) == []
    assert runs[False].smt["repairs_skipped"] == 0
    if rlimit == 1:         # every cluster here repairs more than once: later repairs are skipped
        assert runs[True].smt["repairs_skipped"] >= 1
        assert runs[True].smt["calls"] < runs[False].smt["calls"]
