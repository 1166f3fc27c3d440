"""Cut bounds of every collective (docs/bounds.md) against independent oracles: enumerated rank
cuts with a max-flow (networkx) or a linear program (scipy) per cut, hand-computed clusters, and
simulated schedules that must never beat the bound."""
from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.cluster.topo_parser import ClusterSpec, LinkSpec, NodeSpec, format_topology, parse_topology
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.synth import bandwidth_cut_bound, network_from_topology
from hccc.compiler.synth.bounds import BOUND_COLLECTIVES, collective_cut_bound_seconds, hub_graph
from hccc.compiler.synth.problem import Network
from synth_networks import GB, tiny_networks, two_nic_nodes
from synth_oracles import lp_rate


# ---------------------------------------------------------------- oracles
def _demand(coll: str, side: frozenset, n: int, root: int, M: float) -> float:
    """Bytes that must leave ``side``, from the collective's pre/postconditions alone."""
    inside, outside = len(side), n - len(side)
    return {"allgather": inside * M / n,            # S's own chunks, needed outside
            "reducescatter": outside * M / n,       # S's contributions to the outside's chunks
            "broadcast": M if root in side else 0.0,
            "reduce": 0.0 if root in side else M,   # S's contributions to every chunk, pre-reduced
            "allreduce": M,                         # every chunk outside depends on S
            "alltoall": inside * outside * M / n,   # one M/n block per ordered pair across
            "gather": 0.0 if root in side else inside * M / n,      # S's blocks, for the root
            "scatter": outside * M / n if root in side else 0.0,   # the root's blocks for the outside
            # (root: the shift) the part of every rank of S whose peer is outside
            "sendrecv": sum((r + root) % n not in side for r in side) * M / n}[coll]


def _hub_flow(net: Network, side) -> float:
    """Max-flow across the rank cut (side -> rest) in the hub-graph model of the network."""
    G = hub_graph(net, net.bw, net.gbw).copy()
    for r in range(net.nranks):
        if r in side:
            G.add_edge("s", r)          # no capacity attribute: unbounded
        else:
            G.add_edge(r, "t")
    return nx.maximum_flow_value(G, "s", "t")


def _brute_force(net: Network, coll: str, root: int, M: float, capacity) -> float:
    n = net.nranks
    best = 0.0
    for size in range(1, n):
        for side in itertools.combinations(range(n), size):
            side = frozenset(side)
            d = _demand(coll, side, n, root, M)
            if d > 0:
                cap = capacity(net, side)
                assert cap > 0
                best = max(best, d / cap)
    return best


# ---------------------------------------------------------------- random tiny networks
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=tiny_networks(), coll=st.sampled_from(BOUND_COLLECTIVES), root=st.integers(0, 3))
def test_bound_equals_enumerated_cuts_of_the_flow_model(net, coll, root):
    """Exact in the hub-graph model: the largest demand / max-flow over every enumerated rank cut."""
    root %= net.nranks
    M = 6.0 * 2 ** 20
    got = collective_cut_bound_seconds(net, coll, net.nranks, 1, root, M)
    want = _brute_force(net, coll, root, M, _hub_flow)
    assert got == pytest.approx(want, rel=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(net=tiny_networks(), coll=st.sampled_from(BOUND_COLLECTIVES), root=st.integers(0, 3))
def test_bound_never_exceeds_the_linear_program_cuts(net, coll, root):
    """Valid: the hub graph over-estimates what crosses a cut, so the bound is at most the exact
    per-cut rate bound (LP over pair and group capacities); with no shared groups they agree."""
    root %= net.nranks
    M = 6.0 * 2 ** 20
    got = collective_cut_bound_seconds(net, coll, net.nranks, 1, root, M)
    want = _brute_force(net, coll, root, M, lp_rate)
    assert got <= want * (1 + 1e-9)
    if net.ngroups == 0:
        assert got == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- hand-computed clusters
def test_allreduce_bound_is_the_buffer_across_the_narrowest_cut():
    """4 + 8 GPUs, one 12 GB/s NIC per node: every byte of the buffer crosses the NIC once each
    way, T = M / 12 GB/s, busbw = 12 * 2 * 11 / 12 = 22 GB/s (ReduceScatter + AllGather said 16.5)."""
    net = network_from_topology(two_nic_nodes(4, 8, 12))
    M = 1 << 30
    t = bandwidth_cut_bound(net, "allreduce", 12, 1, 0, M)
    assert t == pytest.approx(M / (12 * GB), rel=1e-9)
    assert M / t / GB * 2 * 11 / 12 == pytest.approx(22.0, rel=1e-9)
    # the cut's other collectives: AllGather/ReduceScatter move the 8-GPU node's 8/12 of the buffer
    for coll in ("allgather", "reducescatter"):
        assert bandwidth_cut_bound(net, coll, 12, 1, 0, M) == pytest.approx(M * 8 / 12 / (12 * GB), rel=1e-9)
    # Broadcast/Reduce: the whole buffer once across the NIC (intra-node links are faster)
    for coll in ("broadcast", "reduce"):
        assert bandwidth_cut_bound(net, coll, 12, 1, 5, M) == pytest.approx(M / (12 * GB), rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_allreduce_bound_full_mesh(n):
    """A single rank is the narrowest cut: (n-1) links of 2 x 25 GB/s."""
    links = [LinkSpec(a, b, 25, 2) for a in range(n) for b in range(n) if a != b]
    topo = parse_topology(format_topology(ClusterSpec([NodeSpec(n, {"direct": links})])), "mesh.topo")
    M = 1 << 28
    t = bandwidth_cut_bound(network_from_topology(topo), "allreduce", n, 1, 0, M)
    assert t == pytest.approx(M / ((n - 1) * 50 * GB), rel=1e-9)


def test_unknown_collective_is_refused():
    net = network_from_topology(two_nic_nodes(2, 2, 10))
    with pytest.raises(ValueError, match="no cut bound"):
        collective_cut_bound_seconds(net, "bogus", 4, 1, 0, 1.0)


# ---------------------------------------------------------------- no schedule beats its bound
def _algorithms(coll: str, n: int, root: int):
    if coll == "allgather":
        yield gen.ring_allgather(n)
        yield gen.direct_allgather(n)
    elif coll == "reducescatter":
        yield gen.ring_reducescatter(n)
        yield gen.direct_reducescatter(n)
    elif coll == "allreduce":
        yield gen.ring_allreduce(n)
        yield gen.direct_allreduce(n)
        yield gen.tree_allreduce(n, [(i, i + 1) for i in range(n - 1)])
    elif coll == "broadcast":
        yield gen.ring_broadcast(n, root)
    elif coll == "alltoall":
        yield gen.direct_alltoall(n)
        yield gen.ring_alltoall(n)
    elif coll == "gather":
        yield gen.ring_gather(n, root)
        yield gen.direct_gather(n, root)
    elif coll == "scatter":
        yield gen.ring_scatter(n, root)
        yield gen.direct_scatter(n, root)
        yield gen.tree_scatter(n, gen.binomial_tree(n, root), root)
    elif coll == "sendrecv":
        yield gen.direct_sendrecv(n, root)
        yield gen.ring_sendrecv(n, root)
    else:
        yield gen.ring_reduce(n, root)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g1=st.integers(1, 3), g2=st.integers(1, 3), nic=st.integers(5, 40), intra=st.integers(5, 60),
       coll=st.sampled_from(BOUND_COLLECTIVES), root=st.integers(0, 5))
def test_no_simulated_schedule_beats_its_bound(g1, g2, nic, intra, coll, root):
    from hccc.runtime.simulator import simulate

    topo = two_nic_nodes(g1, g2, nic, intra)
    n = g1 + g2
    root %= n
    net = network_from_topology(topo)
    M = 1 << 24
    bound = bandwidth_cut_bound(net, coll, n, 1, root, M)
    for alg in _algorithms(coll, n, root):
        res = simulate(build_program(alg), topo, M, slice_bytes="auto")
        assert res.time_s >= bound * (1 - 1e-9), (alg.header.name, res.time_s, bound)


# ---------------------------------------------------------------- AllReduce: the traffic bound
@pytest.mark.parametrize("n", [2, 3, 5])
def test_allreduce_traffic_bound_full_mesh(n):
    """Every element moves 2(n-1) times; n(n-1) links of 50 GB/s carry at most n(n-1) x 50 GB/s:
    2M / (n 50 GB/s), above the cut bound M / ((n-1) 50 GB/s) from 3 ranks on."""
    from hccc.compiler.synth.bounds import allreduce_bound_seconds, allreduce_volume_bound_seconds

    links = [LinkSpec(a, b, 25, 2) for a in range(n) for b in range(n) if a != b]
    topo = parse_topology(format_topology(ClusterSpec([NodeSpec(n, {"direct": links})])), "mesh.topo")
    net = network_from_topology(topo)
    M = 1 << 28
    assert allreduce_volume_bound_seconds(net, M) == pytest.approx(2 * (n - 1) * M / (n * (n - 1) * 50 * GB))
    assert allreduce_bound_seconds(net, M) == pytest.approx(max(M / ((n - 1) * 50 * GB), 2 * M / (n * 50 * GB)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g1=st.integers(1, 3), g2=st.integers(1, 3), nic=st.integers(5, 40), intra=st.integers(5, 60))
def test_no_simulated_allreduce_beats_the_allreduce_bound(g1, g2, nic, intra):
    from hccc.compiler.synth.bounds import allreduce_bound_seconds
    from hccc.runtime.simulator import simulate

    topo = two_nic_nodes(g1, g2, nic, intra)
    net = network_from_topology(topo)
    M = 1 << 24
    bound = allreduce_bound_seconds(net, M)
    for alg in _algorithms("allreduce", g1 + g2, 0):
        res = simulate(build_program(alg), topo, M, slice_bytes="auto")
        assert res.time_s >= bound * (1 - 1e-9), (alg.header.name, res.time_s, bound)
