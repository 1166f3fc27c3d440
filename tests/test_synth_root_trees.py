"""AllReduce by reduce and broadcast trees of a few roots (compiler/synth/root_trees.py).

Oracles independent of the code under test: the trees checked as spanning arborescences of the
network by walking their parents here; every chunk's transfers recounted from the rows; the program
proven by hccc's verifier (the symbolic proof of the postcondition) and run by the numpy reference
executor; the link-model time never below the AllReduce bound of :mod:`hccc.compiler.synth.bounds`;
the MSCCL++ plan's thread blocks counted in the exported plan itself."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend.algorithm import RECV, RRC
from hccc.compiler.synth.packing import pair_bandwidth
from hccc.compiler.synth.problem import network_from_topology
from hccc.compiler.synth import root_trees as rt_mod
from hccc.util import clock

from synth_oracles import M, clusters

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _walks_to(par: np.ndarray, root: int) -> bool:
    """Every rank reaches ``root`` by following ``par`` (no cycle), the root has no parent."""
    n = par.size
    if par[root] != -1:
        return False
    for v in range(n):
        seen, u = 0, v
        while u != root:
            u = int(par[u])
            seen += 1
            if u < 0 or seen > n:
                return False
    return True


@settings(max_examples=12, deadline=None)
@given(topo=clusters(), k=st.integers(1, 3), streams=st.sampled_from([1, 2, 4]))
def test_trees_span_and_every_chunk_is_reduced_once_then_broadcast(topo, k, streams):
    """On random small clusters: every tree is a spanning arborescence of the network (arcs that
    are pairs), rooted at one of the roots; in the rows every rank but a chunk's root sends its
    partial sum exactly once (``rrc``), up the tree into the root, and every rank but the root
    receives it exactly once (``recv``), after the last reduction; the program passes hccc's
    proof and the reference executor; the rounded time is never below the AllReduce bound."""
    from hccc.compiler.synth.bounds import allreduce_bound_seconds

    net = network_from_topology(topo)
    n = net.nranks
    if n < 2:
        return
    roots = rt_mod.spread_roots(net, min(k, n))
    rt = rt_mod.pack_root_trees(net, roots, pair_bw=pair_bandwidth(topo), deadline=clock.now() + 30)
    for r, rev, par in rt.trees:
        assert r in roots.tolist() and _walks_to(par, r)
        v = np.flatnonzero(par >= 0)
        src, dst = (v, par[v]) if rev else (par[v], v)
        assert (net.pair_index(src, dst) >= 0).all()
    counts = rt_mod.round_root_trees(rt, streams)
    kc = rt_mod.chunks_for(n, roots.size, streams)
    if not kc:
        return
    b = n * kc // (roots.size * streams)
    rows = rt_mod.root_tree_rows(rt, counts, b)
    assert len(np.unique(rows[:, 3])) == n * kc
    last_reduce = rows[rows[:, 4] == RRC, 2].max()
    for c in np.unique(rows[:, 3]).tolist():
        mine = rows[rows[:, 3] == c]
        red, bc = mine[mine[:, 4] == RRC], mine[mine[:, 4] == RECV]
        root = int(np.setdiff1d(np.arange(n), red[:, 0])[0])
        assert root in roots.tolist()
        assert sorted(red[:, 0].tolist()) == sorted(set(range(n)) - {root})      # each once
        assert sorted(bc[:, 1].tolist()) == sorted(set(range(n)) - {root})
        par = np.full(n, -1)
        par[red[:, 0]] = red[:, 1]
        assert _walks_to(par, root)
        assert (bc[:, 2] > last_reduce).all()
    # the bound: no rounding beats the AllReduce bound for any schedule
    t = rt_mod.rounded_time(rt, counts, streams) / roots.size * M
    assert t >= allreduce_bound_seconds(net, M) * (1 - 1e-6)
    assert rt.lp_time / roots.size * M >= allreduce_bound_seconds(net, M) * (1 - 1e-6)
    _proven_and_run(topo, rows, kc)


def _proven_and_run(topo, rows, kc):
    """The rows as a program: proven by hccc's verifier and run by the numpy reference executor
    against the sum of every rank's input."""
    from hccc.compiler.passes.verify import verify
    from hccc import build_program
    from hccc.compiler.synth.collectives import SynthResult
    from hccc.compiler.synth.emit import to_algorithm
    from hccc.runtime.reference import execute, expected_for, inputs_for

    n = topo.nranks
    res = SynthResult("allreduce", n, kc, None, rows, int(rows[:, 2].max()) + 1, 0, [], 0.0, "t",
                      detail={"method": "root trees"})
    alg = to_algorithm(res, topo)
    verify(alg)
    ir = build_program(alg)
    inputs = inputs_for(ir, 3 * n * kc + 1, "int32", seed=3)
    for r, (got, want) in enumerate(zip(execute(ir, inputs, op="sum"), expected_for(ir, inputs, "sum"))):
        assert np.array_equal(got, want), f"rank {r}: the reference executor's sum differs"


def test_the_engine_limits_hold_in_the_exported_plan():
    """A 12-GPU cluster's candidates weighed by the MSCCL++ executor's check: each exports, and the
    plan written has at most the executor's thread blocks on every GPU (counted in the plan)."""
    from hccc.compiler.interop.mscclpp_export import export_plan, node_map
    from hccc.compiler.interop.mscclpp_plan import PlanLimits
    from hccc.compiler.passes.build import build_algorithm_level
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth.emit import to_algorithm
    from hccc.synth_engines import transfers_check

    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    made, why = rt_mod.root_tree_candidates(topo, deadline=clock.now() + 120,
                                            engine=transfers_check("mscclpp", topo))
    assert made, why
    for res in made:
        alg = to_algorithm(res, topo)
        plan = export_plan(build_algorithm_level(alg), nodes=node_map(alg.header.nranks, topology=topo),
                           micro_batches=1)
        assert max(len(g["threadblocks"]) for g in plan["gpus"]) <= PlanLimits().max_tbs


@pytest.mark.parametrize("share", [0.9, 0.7])
def test_capping_connection_ends_caps_them_in_the_lp(share):
    """The LP packed under a cap on every rank's tree arcs (:func:`with_end_groups`) keeps every
    rank's arcs, summed over the trees by weight, within the cap at its time (recounted here from
    the trees), where the LP without it exceeds that cap somewhere."""
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    net = network_from_topology(topo)
    roots = rt_mod.spread_roots(net, 2)
    bw = pair_bandwidth(topo)

    def arcs(rt):       # every arc of every tree is a connection end at both its ranks, by weight
        out = [0.0] * net.nranks
        for (_, _, par), y in zip(rt.trees, rt.weights):
            for child, parent in enumerate(par.tolist()):
                if parent >= 0:
                    out[child] += float(y)
                    out[parent] += float(y)
        return np.asarray(out)
    free = rt_mod.pack_root_trees(net, roots, pair_bw=bw, deadline=clock.now() + 30)
    cap = float(arcs(free).max()) * share
    capped = rt_mod.pack_root_trees(net, roots, pair_bw=bw, deadline=clock.now() + 30,
                                    ends=np.full(net.nranks, cap))
    assert (arcs(capped) <= cap * capped.lp_time / free.lp_time * (1 + 1e-6)).all()
    assert capped.lp_time >= free.lp_time * (1 - 1e-9)


def test_the_xml_limits_hold_in_the_exported_xml():
    """The same for the MSCCL executor: every candidate weighed by its check exports, and the XML
    written keeps every GPU's thread blocks, every thread block's steps and the channels within
    the runtime's limits (counted in the XML text)."""
    import xml.etree.ElementTree as ET

    from hccc.compiler.interop.msccl_export import export_algorithm
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth.emit import to_algorithm
    from hccc.synth_engines import transfers_check

    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    made, why = rt_mod.root_tree_candidates(topo, deadline=clock.now() + 120, engine=transfers_check("xml", topo))
    assert made, why
    lim = XmlLimits()
    for res in made:
        _, text = export_algorithm(to_algorithm(res, topo))
        root = ET.fromstring(text)
        gpus = root.findall("gpu")
        assert len(gpus) == topo.nranks
        for g in gpus:
            tbs = g.findall("tb")
            assert len(tbs) <= lim.max_tbs
            assert all(len(tb.findall("step")) <= lim.max_steps for tb in tbs)
            assert all(int(tb.get("chan")) < lim.max_channels for tb in tbs)


def test_what_the_deadline_leaves_is_said():
    """A deadline already past makes nothing and says, for every root count, that the time limit
    left it (the selection lists those as not made, so the report says the limit bound)."""
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "v100_4_8.topo")
    made, why = rt_mod.root_tree_candidates(topo, deadline=clock.now() - 1.0)
    assert made == []
    assert why == [f"{k} roots: not made: time limit" for k in rt_mod.ROOT_COUNTS if k < topo.nranks]


@settings(max_examples=8, deadline=None)
@given(topo=clusters(), most=st.integers(2, 12))
def test_every_candidate_is_one_its_engine_check_accepts(topo, most):
    """An engine that takes at most ``most`` transfers on a connection (a pair's on one channel):
    every candidate made has no longer connection (recounted here on its rows), or none is made
    and the reason says the engine refused."""
    def engine(rows):
        _, c = np.unique(rows[:, [0, 1, 5]], axis=0, return_counts=True)
        return None if c.max() <= most else f"{int(c.max())} transfers on a connection"

    if topo.nranks < 2:
        return
    made, why = rt_mod.root_tree_candidates(topo, deadline=clock.now() + 60, engine=engine)
    for res in made:
        _, c = np.unique(res.rows[:, [0, 1, 5]], axis=0, return_counts=True)
        assert c.max() <= most
    assert made or all("refuses" in w for w in why), why


@pytest.mark.parametrize("engine, collective, made", [
    (None, "allreduce", False), ("hccc", "allreduce", False), ("msccl", "allreduce", True),
    ("xml", "allreduce", True), ("mscclpp", "allreduce", True), ("mscclpp", "allgather", False)])
def test_only_an_allreduce_for_an_engine_with_limits_makes_root_trees(engine, collective, made):
    """hccc's own AllReduce is not charged the roots' LP: the selection queues it only where an
    engine's limits cut the packing's program."""
    from types import SimpleNamespace

    from hccc.synth_select import _root_trees_asked
    assert _root_trees_asked(SimpleNamespace(engine=engine, collective=collective)) is made


def _recounted_time(net, cap, trees, streams):
    """Seconds per byte of a root's share of ``(root, in_tree, parents, copies)`` trees, recounted
    here: every tree's arcs as pairs, a pair's streams on it and on each of its shared groups, the
    most loaded over its capacity."""
    P = net.npairs
    load = np.zeros(P + net.ngroups)
    rp, rg = net.pair_group_rows()
    for _, rev, par, c in trees:
        for child, parent in enumerate(par.tolist()):
            if parent < 0:
                continue
            p = int(net.pair_index(np.array([child if rev else parent]), np.array([parent if rev else child]))[0])
            assert p >= 0
            load[p] += c
            load[P + rg[rp == p]] += c
    ok = cap > 0
    assert (load[~ok] == 0).all()
    return float((load[ok] / cap[ok]).max()) / streams


@settings(max_examples=10, deadline=None)
@given(topo=clusters(), k=st.integers(1, 3), streams=st.sampled_from([1, 2, 3]), capped=st.booleans())
def test_integral_trees_span_and_their_loads_are_the_programs(topo, k, streams, capped):
    """The integral packing (compiler/synth/root_branchings.py) on random small clusters: every
    tree a spanning arborescence rooted at one of the roots (walked here), whole stream counts that
    sum to ``streams`` per root and direction, the time recounted from the trees' pairs and groups
    equal to the packing's and never below the LP's nor the AllReduce bound; with a cap on the
    connection ends, every rank's arcs (recounted) within it; the rows proven and run."""
    from hccc.compiler.synth.bounds import allreduce_bound_seconds
    from hccc.compiler.synth.packing import _resources
    from hccc.compiler.synth.packing_lp import LP_TOL
    from hccc.compiler.synth import root_branchings as rb

    net = network_from_topology(topo)
    n = net.nranks
    if n < 2:
        return
    roots = rt_mod.spread_roots(net, min(k, n))
    bw = pair_bandwidth(topo)
    cap = _resources(net, bw)
    rt = rt_mod.pack_root_trees(net, roots, pair_bw=bw, deadline=clock.now() + 30)
    ends = None
    if capped:
        free = rb.integral_root_trees(net, rt, streams, cap, deadline=clock.now() + 60)
        if free is None:
            return
        ends = np.full(n, float(max(2 * streams * roots.size, int((rt_mod.tree_ends(free[0]) * streams).max()) - 1)))
    sup = (rb._support(n, rt.trees, False), rb._support(n, rt.trees, True))
    known: list = []
    arcs = rb.root_arcs(net, roots, streams, cap, sup, deadline=clock.now() + 60, ends=ends, sets=known)
    if arcs is None:
        return
    # the cut conditions found are passed on to another stream count: its trees exist too, and
    # its time is its trees' (recounted)
    more = rb.root_arcs(net, roots, streams + 1, cap, sup, deadline=clock.now() + 60, sets=known)
    if more is not None:
        grown = rb.root_branchings(net, roots, streams + 1, more[1], more[2], deadline=clock.now() + 60)
        assert grown is not None
        assert _recounted_time(net, cap, grown, streams + 1) == pytest.approx(more[0], rel=1e-9)
    trees = rb.root_branchings(net, roots, streams, arcs[1], arcs[2], deadline=clock.now() + 60)
    assert trees is not None            # the multiplicities meet the cut conditions: trees exist
    per = {}
    at = np.zeros(n)
    for r, rev, par, c in trees:
        assert r in roots.tolist() and _walks_to(par, r) and isinstance(c, int) and c >= 1
        per[(r, rev)] = per.get((r, rev), 0) + c
        for child, parent in enumerate(par.tolist()):
            if parent >= 0:
                at[child] += c
                at[parent] += c
    assert per == {(r, rev): streams for r in roots.tolist() for rev in (False, True)}
    t = _recounted_time(net, cap, trees, streams)
    assert t == pytest.approx(arcs[0], rel=1e-9)
    # the LP stops within LP_TOL of its optimum; no integral packing is below the optimum
    assert t >= rt.lp_time * (1 - LP_TOL) * (1 - 1e-6)
    assert t / roots.size * M >= allreduce_bound_seconds(net, M) * (1 - 1e-6)
    if ends is not None:
        assert (at <= ends + 1e-9).all()
    kc = rt_mod.chunks_for(n, roots.size, streams)
    if kc:
        got = rb.integral_root_trees(net, rt, streams, cap, deadline=clock.now() + 60, ends=ends)
        assert got is not None
        it, counts = got
        assert rt_mod.rounded_time(it, counts, streams) == pytest.approx(t, rel=1e-9)
        _proven_and_run(topo, rt_mod.root_tree_rows(it, counts, n * kc // (roots.size * streams)), kc)


def test_a_root_set_cut_short_is_found():
    """:func:`~hccc.compiler.synth.branchings.short_sets` of several roots against the cut condition checked here over every set of 4 ranks:
    2 out-trees of roots 0 and 1 need ``2 |R - Z|`` arcs into every set ``Z``."""
    from itertools import combinations

    from hccc.compiler.synth.branchings import short_sets

    rng = np.random.default_rng(5)
    n, k, roots = 4, 2, np.array([0, 1])
    for _ in range(30):
        mult = rng.integers(0, 4, size=(n, n)) * (1 - np.eye(n, dtype=np.int64))
        src, dst = np.nonzero(mult >= 0)
        m = mult[src, dst]
        short = any(mult[np.ix_([u for u in range(n) if u not in Z], list(Z))].sum() < k * len(set(roots.tolist()) - set(Z))
                    for size in range(1, n + 1) for Z in combinations(range(n), size))
        found = short_sets(n, src, dst, m, k, roots)
        assert bool(found) == short
        for z in found:
            entering = mult[np.ix_(np.flatnonzero(~z), np.flatnonzero(z))].sum()
            assert entering < k * int((~z[roots]).sum())


@pytest.mark.slow
def test_the_64_gpu_held_out_cluster_packs_two_roots_integrally_at_the_lp():
    """ho_8x8_switch (benchmarks/synth_engines.py), where the LP's 2-root packing rounds to 0.50 of
    the LP at 2 streams: the integral packing at 2 streams reaches the LP (its time recounted from
    its trees), and the candidates the MSCCL executor's check accepts include it."""
    import sys

    from hccc.compiler.cluster.topo_parser import parse_topology
    from hccc.compiler.synth.packing import _resources
    from hccc.compiler.synth import root_branchings as rb
    from hccc.synth_engines import transfers_check

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_engines import held_out

    topo = parse_topology(held_out()["ho_8x8_switch"], "ho_8x8_switch")
    net = network_from_topology(topo)
    bw = pair_bandwidth(topo)
    cap = _resources(net, bw)
    rt = rt_mod.pack_root_trees(net, rt_mod.spread_roots(net, 2), pair_bw=bw, deadline=clock.now() + 120)
    rounded = rt_mod.round_root_trees(rt, 2)
    assert rt_mod.rounded_time(rt, rounded, 2) > 1.5 * rt.lp_time
    it, counts = rb.integral_root_trees(net, rt, 2, cap, deadline=clock.now() + 300)
    t = _recounted_time(net, cap, [(r, rev, par, int(c)) for (r, rev, par), c in zip(it.trees, counts)], 2)
    assert t <= rt.lp_time * (1 + 5e-3)
    made, _ = rt_mod.root_tree_programs(net, pair_bw=bw, deadline=clock.now() + 600, engine=transfers_check("xml", topo),
                                        root_counts=(2,))
    assert made and made[0].integral and made[0].seconds_per_byte * 2 <= rt.lp_time * (1 + 5e-3)


@pytest.mark.slow     # (the longest of the README's command: in the slow set)
def test_the_integral_trees_are_the_same_under_load():
    """ho_4x4_mixed (benchmarks/synth_engines.py), where the 2 roots' trees are packed integrally:
    the candidates made alone and with a busy thread beside them are the same bytes (the
    packing's work is counted in nodes and rounds, not seconds)."""
    import sys
    import threading

    from hccc.compiler.cluster.topo_parser import parse_topology
    from hccc.synth_engines import transfers_check

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_engines import held_out

    topo = parse_topology(held_out()["ho_4x4_mixed"], "ho_4x4_mixed")
    net = network_from_topology(topo)

    def made():
        got, _ = rt_mod.root_tree_programs(net, pair_bw=pair_bandwidth(topo), deadline=clock.now() + 300,
                                           engine=transfers_check("xml", topo), root_counts=(2,))
        return [(p.rows.tobytes(), p.streams, p.integral) for p in got]
    alone = made()
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x = (x * 31 + 7) % 1000003
    t = threading.Thread(target=busy)
    t.start()
    try:
        loaded = made()
    finally:
        stop.set()
        t.join()
    assert alone == loaded
    assert any(integral for _, _, integral in alone)
