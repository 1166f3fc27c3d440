"""Lower bounds of hccc.compiler.synth against closed forms and brute force; optimality of the
CEGIS + z3 search on problems small enough to solve exhaustively."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                format_topology, parse_topology)
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import allgather_task, broadcast_task, network_from_topology
from hccc.compiler.synth.bounds import (cut_bound_seconds, hub_graph, max_cut_ratio, rank_classes,
                                        step_lower_bound)
from hccc.compiler.synth.cegis import synthesize_task
from hccc.compiler.synth.check import check
from hccc.compiler.synth.problem import Network
from hccc.util import clock
from synth_networks import unit_network

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"
GB = 1e9


def _mesh(n: int, gbps: int, lanes: int):
    links = [LinkSpec(a, b, gbps, lanes) for a in range(n) for b in range(n) if a != b]
    return parse_topology(format_topology(ClusterSpec([NodeSpec(n, {"direct": links})])), "mesh.topo")


def _two_nodes(g: int, nic_gbps: int):
    nodes = [NodeSpec(g, {"direct": [LinkSpec(a, b, 100, 2) for a in range(g) for b in range(g) if a != b]},
                      nics=[NicSpec(tuple(range(g)), nic_gbps)]) for _ in range(2)]
    return parse_topology(format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")])), "two.topo")


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_cut_bound_full_mesh(n):
    """Every rank must receive (n-1)/n of the buffer through n-1 links of B: T* = M / (n B)."""
    topo = _mesh(n, 25, 2)
    net = network_from_topology(topo)
    M = 1 << 30
    t = cut_bound_seconds(net, allgather_task(n), M)
    assert t == pytest.approx(M / (n * 50 * GB), rel=1e-9)
    # broadcast: the root's n-1 links carry the whole buffer: T* = M / ((n-1) B)
    tb = cut_bound_seconds(net, broadcast_task(n, n - 1), M)
    assert tb == pytest.approx(M / ((n - 1) * 50 * GB), rel=1e-9)


@pytest.mark.parametrize("g,nic", [(2, 10), (4, 25), (3, 8)])
def test_cut_bound_two_nodes_behind_one_nic(g, nic):
    """Half of the chunks must cross one NIC each way: T* = (M/N) * g / b."""
    topo = _two_nodes(g, nic)
    net = network_from_topology(topo)
    M = 3 << 28
    N = 2 * g
    assert cut_bound_seconds(net, allgather_task(N), M) == pytest.approx(M / N * g / (nic * GB), rel=1e-9)
    # steps: g chunks enter each node through a NIC of capacity 1, then one more step to spread
    b = step_lower_bound(net, allgather_task(N))
    assert b.cut == g and b.steps == (g + 1 if g > 1 else g)


def test_symmetry_classes_do_not_change_the_cut_bound():
    for name in ("v100_4x2_8", "h20_4x3_8", "heteccl_fig10"):
        net = network_from_topology(load_cluster(CLUSTERS / f"{name}.topo"))
        task = allgather_task(net.nranks)
        G = hub_graph(net, net.cap.astype(np.int64), net.gcap.astype(np.int64))
        w = {r: 1 for r in range(net.nranks)}
        classes = rank_classes(net, task)
        if name == "h20_4x3_8":  # three identical 4-GPU nodes: one target serves them all
            assert len(classes) <= net.nranks - 8
        assert max_cut_ratio(G, w, classes)[0] == max_cut_ratio(G, w, range(net.nranks))[0]


# ---------------------------------------------------------------- brute force
@st.composite
def tiny_networks(draw):
    n = draw(st.integers(2, 3))
    all_pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    keep = draw(st.lists(st.booleans(), min_size=len(all_pairs), max_size=len(all_pairs)))
    pairs = [p for p, k in zip(all_pairs, keep) if k]
    # strongly connected: add a ring
    for a in range(n):
        if (a, (a + 1) % n) not in pairs:
            pairs.append((a, (a + 1) % n))
    caps = [draw(st.integers(1, 2)) for _ in pairs]
    ngroups = draw(st.integers(0, 2))
    groups, gcaps = [], []
    for _ in range(ngroups):
        mem = draw(st.lists(st.integers(0, len(pairs) - 1), min_size=2, max_size=len(pairs), unique=True))
        groups.append(mem)
        gcaps.append(draw(st.integers(1, 2)))
    kpr = draw(st.integers(1, 2 if n == 2 else 1))
    return unit_network(n, pairs, caps, groups, gcaps), kpr


def _brute_force_steps(net: Network, task) -> int:
    """Fewest steps over all schedules, by breadth-first search over holdings (exhaustive)."""
    n, nc = task.nranks, task.nchunks
    gpairs = net.group_pairs()
    start = tuple(task.initial().ravel().tolist())
    full = tuple([1] * (n * nc))
    frontier, seen, steps = {start}, {start}, 0
    while full not in frontier:
        steps += 1
        nxt = set()
        for state in frontier:
            has = np.array(state).reshape(n, nc)
            cand = [(p, k) for p in range(net.npairs) for k in range(nc)
                    if has[net.psrc[p], k] and not has[net.pdst[p], k]]
            for r in range(len(cand), 0, -1):
                for sub in itertools.combinations(cand, r):
                    used = np.bincount([p for p, _ in sub], minlength=net.npairs)
                    if (used > net.cap).any():
                        continue
                    if any(used[gp].sum() > net.gcap[g] for g, gp in enumerate(gpairs)):
                        continue
                    recv = [(int(net.pdst[p]), k) for p, k in sub]
                    if len(set(recv)) != len(recv):
                        continue
                    if task.fanout_one:
                        sends = [(int(net.psrc[p]), k) for p, k in sub]
                        if len(set(sends)) != len(sends):
                            continue
                    h = has.copy()
                    for v, k in recv:
                        h[v, k] = 1
                    key = tuple(h.ravel().tolist())
                    if key not in seen:
                        seen.add(key)
                        nxt.add(key)
        frontier = nxt
        assert frontier, "unreachable"
    return steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tiny_networks(), fanout=st.booleans())
def test_bound_and_search_against_brute_force(case, fanout):
    net, k = case
    task = allgather_task(net.nranks, k, fanout_one=fanout)
    opt = _brute_force_steps(net, task)
    lb = step_lower_bound(net, allgather_task(net.nranks, k)).steps
    assert lb <= opt
    res = synthesize_task(net, task, deadline=clock.now() + 20, max_window=8)
    assert check(net, task, res.schedule) == []
    assert res.steps >= opt
    # z3 re-solves suffix windows up to the whole schedule: on problems this small it finds the optimum
    assert res.steps == opt
    greedy_only = synthesize_task(net, task, deadline=clock.now() + 20, use_smt=False)
    assert greedy_only.steps >= res.steps


def test_allreduce_cut_bound_is_kept_per_network_not_reused_across_networks():
    """AllReduce's least cut capacity is computed once per network: asked again it is the same,
    and a network whose bandwidths differ gets its own (the buffer over its least cut, recomputed
    here by networkx's max-flow on the hub graph, the oracle)."""
    import copy

    import networkx as nx

    from hccc.compiler.synth.bounds import collective_cut_bound_seconds

    def oracle(net) -> float:
        G = hub_graph(net, net.bw, net.gbw)
        cap = min(min(nx.maximum_flow_value(G, 0, v), nx.maximum_flow_value(G, v, 0))
                  for v in range(1, net.nranks))
        return 1e9 / cap

    net = network_from_topology(load_cluster(CLUSTERS / "v100_4_8.topo"))
    first = collective_cut_bound_seconds(net, "allreduce", net.nranks, 1, 0, 1e9)
    assert first == pytest.approx(oracle(net), rel=1e-9)
    assert collective_cut_bound_seconds(net, "allreduce", net.nranks, 1, 0, 1e9) == first
    slow = copy.copy(net)
    slow.bw, slow.gbw = net.bw * 0.5, net.gbw * 0.5
    half = collective_cut_bound_seconds(slow, "allreduce", slow.nranks, 1, 0, 1e9)
    assert half == pytest.approx(oracle(slow), rel=1e-9) and half == pytest.approx(2 * first, rel=1e-9)
