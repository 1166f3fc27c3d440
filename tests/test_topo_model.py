"""Topology model: builder, de-duplication, pair queries, graph view, summary, scale."""
from __future__ import annotations

import json
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.cluster.topology import (DuplicateLinkError, Topology, TopologyBuilder, chunk_time,
                                    logical_capacity)


def small() -> Topology:
    b = TopologyBuilder("t")
    b.add_node("a", 2)
    b.add_node("b", 2, vendor="amd", model="MI300X", gamma_gbps=500)
    slow = b.params("internode", 10, 1, 2)
    fast = b.params("direct", 100, 2, "0.5")
    pcie = b.params("switch", 20, 1, 1)
    b.add_links([0, 1], [1, 0], fast)
    b.add_links([0, 0], [1, 2], pcie, mergeable=True)
    ids = b.add_links([1, 2], [3, 0], slow, mergeable=True)
    b.add_group("internode", "a->b", "g", ids, 10, 2, 2)
    return b.build(chunk_size=10**6)


def test_builder_and_queries():
    t = small()
    assert t.nranks == 4 and t.nlinks == 6
    assert t.vendor_of(2) == "amd" and t.model_of(3) == "MI300X" and t.node_of(1).name == "a"
    assert list(t.rank_gamma[:2]) == [np.inf, np.inf] and t.rank_gamma[2] == 500e9
    # tau_ref: 2 us + 1e6 / 10e9 = 102 us
    assert t.tau_ref_exact == Fraction(102, 10**6)
    best = t.link_between(0, 1)
    assert best.cls == "direct"
    tau_fast = chunk_time(Fraction("0.5"), Fraction(100), 10**6)
    assert best.capacity == logical_capacity(t.tau_ref_exact, tau_fast, 2)
    assert len(t.links_between(0, 1)) == 2
    assert t.capacity(0, 1) == best.capacity + t.links_between(0, 1)[1].capacity
    assert t.has_link(1, 3) and not t.has_link(3, 1) and t.link_between(3, 1) is None
    with pytest.raises(IndexError):
        t.has_link(0, 4)
    g = t.groups[0]
    assert g.capacity_bytes == 20e9 and g.capacity == 1 * 2
    assert t.link_between(1, 3).groups == (0,)
    assert t.graph.number_of_edges() == 6 and t.graph.nodes[2]["vendor"] == "amd"
    json.dumps(t.summary())


def test_capacity_hand_computed():
    # tau(direct) = 0.5 us + 10 us = 10.5 us ; tau_ref = 102 us ; 102 / 10.5 = 9.714 -> 10 ; x2 lanes
    t = small()
    assert t.link_between(0, 1).capacity == 20
    # switch: 1 + 50 = 51 us -> 102/51 = 2 exactly -> 2
    assert [l.capacity for l in t.links_between(0, 2)] == [2]
    assert t.link_between(0, 2).cls == "switch"


def test_duplicates():
    b = TopologyBuilder()
    b.add_node("n", 3)
    p = b.params("switch", 10, 1, 1)
    q = b.params("switch", 20, 1, 1)
    g1 = b.add_links([0, 0], [1, 2], p, mergeable=True)
    g2 = b.add_links([0], [1], p, mergeable=True)  # same link again: merged
    b.add_group("switch", "a->b", "one", g1, 10, 1, 1)
    b.add_group("switch", "a->b", "two", g2, 10, 1, 1)
    t = b.build()
    assert t.nlinks == 2
    assert t.link_between(0, 1).groups == (0, 1)
    b.add_links([0], [2], q, mergeable=True)
    with pytest.raises(DuplicateLinkError) as e:
        b.build()
    assert (e.value.first, e.value.second) == (1, 3)
    b2 = TopologyBuilder()
    b2.add_node("n", 2)
    d = b2.params("direct", 10, 1, 1)
    b2.add_links([0], [1], d)
    b2.add_links([0], [1], d)
    with pytest.raises(DuplicateLinkError):
        b2.build()


def test_builder_rejects_bad_input():
    b = TopologyBuilder()
    b.add_node("n", 2)
    with pytest.raises(ValueError):
        b.params("direct", 0, 1, 1)
    with pytest.raises(ValueError):
        b.params("warp", 1, 1, 1)
    p = b.params("direct", 1, 1, 1)
    with pytest.raises(ValueError):
        b.add_links([0], [0], p)
    with pytest.raises(ValueError):
        b.add_links([0], [2], p)
    with pytest.raises(ValueError):
        b.add_node("m", 1, vendor="intel")


def test_no_links():
    b = TopologyBuilder()
    b.add_node("solo", 1)
    t = b.build()
    assert t.nlinks == 0 and t.tau_ref is None and not t.has_link(0, 0)
    assert t.summary()["link_classes"] == {}


@pytest.mark.slow
def test_scale_1024_gpus():
    """128 H20 nodes (1,024 GPUs, ~1M inter-node links) parse into the right model (the parse time
    is printed; benchmarks measure speed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "clusters"))
    try:
        import generate as g
    finally:
        sys.path.pop(0)
    from hccc.compiler.cluster.topo_parser import format_topology, parse_topology

    text = format_topology(g.cluster([g.h20_node8() for _ in range(128)], "1024 H20"))
    t0 = time.perf_counter()
    t = parse_topology(text, "big.topo")
    elapsed = time.perf_counter() - t0
    print(f"1024 GPUs: parsed in {elapsed:.2f}s")
    assert t.nranks == 1024 and t.nlinks == 128 * 56 + 1024 * 1016
    l = t.link_between(0, 1023)
    assert l.cls == "nic" and len(l.groups) == 2
    assert t.groups[l.groups[0]].members.size == 2 * 1016
