"""The compiled max-flow of the cut bounds (:mod:`hccc.compiler.synth.maxflow`) against networkx:
the same flow value and the same minimum cut (every vertex that can still reach the sink in the
residual graph on the sink side), on random directed graphs with whole-number capacities, plain
and compiled; and the cut bound it computes equal to networkx's on the example clusters."""
from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.synth import maxflow
from hccc.util import jit

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 9))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                                    st.sampled_from([0, 1, 2, 3, 5, 8, 10 ** 12, 3 * 10 ** 15])),
                          max_size=30))
    edges = [(u, v, c) for u, v, c in edges if u != v]
    s, t = draw(st.sampled_from([(a, b) for a in range(n) for b in range(n) if a != b]))
    return n, edges, s, t


def _kernels():
    out = [maxflow.max_flow_arrays]
    if jit.have_numba():
        out.append(maxflow.KERNELS.compiled()["max_flow_arrays"])
    return out


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_max_flow_and_min_cut_equal_networkx(case):
    n, edges, s, t = case
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for u, v, c in edges:           # parallel edges add up in networkx's graph and in the arrays
        g.add_edge(u, v, capacity=g.get_edge_data(u, v, {"capacity": 0})["capacity"] + c)
    value, (_, sink_side) = nx.minimum_cut(g, s, t)
    eu = np.array([e[0] for e in edges], np.int64)
    ev = np.array([e[1] for e in edges], np.int64)
    cap = np.array([e[2] for e in edges], np.int64)
    for kernel in _kernels():
        sink = np.zeros(n, np.bool_)
        got = kernel(n, eu, ev, cap, s, t, sink)
        assert got == value
        assert set(np.flatnonzero(sink).tolist()) == set(sink_side)


def test_whole_capacities_that_fit_64_bits():
    assert maxflow.fits([0, 3, 2.0, 10 ** 18])
    assert not maxflow.fits([2.5])
    assert not maxflow.fits([-1])
    assert not maxflow.fits([1 << 61, 1 << 61])
    assert not maxflow.fits([float("nan")]) and not maxflow.fits([float("inf")])


@pytest.mark.skipif(not jit.have_numba(), reason="numba is not installed")
@pytest.mark.parametrize("cluster", ["a100_topo4", "h20_4_8", "mixed_v100_w7800"])
def test_cut_bound_compiled_equals_networkx(monkeypatch, cluster):
    """The AllGather and ReduceScatter cut bounds with every max-flow compiled (``HCCC_JIT=numba``)
    and with networkx's (``HCCC_JIT=python``): equal."""
    from hccc.compiler.cluster.topo_parser import load_topology
    from hccc.compiler.synth import bounds
    from hccc.compiler.synth.problem import network_from_topology

    net = network_from_topology(load_topology(CLUSTERS / f"{cluster}.topo"))
    got = {}
    for mode in ("numba", "python"):
        monkeypatch.setenv("HCCC_JIT", mode)
        bounds._CUT_RATIOS.clear()
        got[mode] = [bounds.collective_cut_bound_seconds(net, c, net.nranks, 1, 0, 1 << 30)
                     for c in ("allgather", "reducescatter")]
    assert got["numba"] == got["python"]
