"""Hierarchical topology abstraction (hccc.compiler.cluster.hierarchy): clusters, border and internal ranks.

Oracles: clusters written inline from a spec whose answer is known by construction (nodes of one
vendor/model joined by NIC links form one cluster; every GPU behind a NIC is a border rank with an
equal share of it, or with ``border="one-per-nic"`` the NIC's first GPU with all of it), the shipped
mixed-vendor example, and brute-force connectivity for the non-fully-connected case.
"""
from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.cluster.topo_parser import load_topology, parse_topology
from hccc.compiler.cluster.hierarchy import HierarchyError, hierarchy
from hccc.compiler.cluster.topology import TopologyBuilder
from cluster_texts import MIXED_3, cluster_specs, topo_text

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"


# ---------------------------------------------------------------------------------------- inline clusters
def expected_hierarchy(nodes, one_per_nic: bool = False):
    """(vendor, model, ranks, {border: (GB/s, members)}) per cluster, from the spec alone."""
    keys: dict = {}
    off = 0
    for vendor, model, g, nics in nodes:
        k = (vendor, model)
        entry = keys.setdefault(k, (vendor, model, [], {}))
        entry[2].extend(range(off, off + g))
        for gp, bw in nics:
            members = tuple(off + x for x in sorted(gp))
            chosen = members[:1] if one_per_nic else members
            for b in chosen:
                entry[3][b] = (Fraction(str(bw)) / len(chosen), members)
        off += g
    return list(keys.values())  # dicts keep first-insertion order = order of first node


def test_mixed_example_two_vendor_clusters():
    t = load_topology(CLUSTERS / "mixed_v100_w7800.topo")
    h = hierarchy(t)
    assert h.nclusters == 2 and h.mixed_vendor and h.nranks == 16
    nv, amd = h.clusters
    assert (nv.vendor, nv.model, nv.ranks) == ("nvidia", "V100-PCIe", tuple(range(8)))
    assert (amd.vendor, amd.model, amd.ranks) == ("amd", "W7800", tuple(range(8, 16)))
    # one 200 Gbps NIC per node, shared by its four GPUs: all are border ranks, a quarter each
    assert nv.border_ranks == tuple(range(8)) and nv.internal_ranks == ()
    assert nv.nic_bandwidth == {r: 6.25e9 for r in range(8)} and nv.nic_members[5] == (4, 5, 6, 7)
    assert nv.total_nic_gbps == 50
    assert nv.nodes == ("node1", "node2") and amd.nodes == ("node3", "node4")
    assert [h.cluster_of(r).index for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    one = hierarchy(t, border="one-per-nic")
    nv1, amd1 = one.clusters
    assert nv1.border_ranks == (0, 4) and amd1.border_ranks == (8, 12)
    assert nv1.internal_ranks == (1, 2, 3, 5, 6, 7)
    assert nv1.nic_bandwidth == {0: 25e9, 4: 25e9} and nv1.nic_members[4] == (4, 5, 6, 7)
    s = json.loads(json.dumps(one.summary()))
    assert s["nclusters"] == 2 and s["clusters"][1]["border_ranks"] == [8, 12]
    assert s["clusters"][0]["total_nic_gbps"] == 50.0
    text = one.describe()
    assert "border ranks: 0 (25 GB/s for 0-3), 4 (25 GB/s for 4-7)" in text and "amd W7800" in text
    assert "0 (6.25 GB/s for 0-3)" in h.describe()
    with pytest.raises(HierarchyError, match="border-rank rule"):
        hierarchy(t, border="some")


def test_inline_mix_matches_spec():
    t = parse_topology(topo_text(MIXED_3), "mix3.topo")
    for one in (False, True):
        h = hierarchy(t, border="one-per-nic" if one else "nic")
        exp = expected_hierarchy(MIXED_3, one)
        assert h.nclusters == 3
        for c, (vendor, model, ranks, border) in zip(h.clusters, exp):
            assert (c.vendor, c.model, c.ranks) == (vendor, model, tuple(ranks))
            assert c.border_ranks == tuple(sorted(border))
            assert dict(c.nic_gbps) == {b: bw for b, (bw, _) in border.items()}
            assert dict(c.nic_members) == {b: m for b, (_, m) in border.items()}
            assert set(c.border_ranks) | set(c.internal_ranks) == set(c.ranks)
            assert c.border_source == "nic"
    h = hierarchy(t, border="one-per-nic")
    # the two MI250 nodes are not adjacent in rank order but form one cluster
    assert h.clusters[1].ranks == (3, 4, 5, 6, 7, 10) and h.clusters[1].nodes == ("node2", "node4")
    assert h.clusters[1].border_ranks == (3, 6, 10)
    # grouping by vendor merges the two NVIDIA models
    hv = hierarchy(parse_topology(topo_text(MIXED_3), "mix3.topo"), by="vendor")
    assert [c.ranks for c in hv.clusters] == [(0, 1, 2, 8, 9), (3, 4, 5, 6, 7, 10)]
    assert hv.clusters[0].model is None and hv.clusters[0].name == "nvidia"


def test_clusters_follow_connectivity():
    """amd - nvidia - amd in a line: the two AMD nodes are not linked to each other, so they are two
    clusters (a vendor library cannot run a collective across them by itself)."""
    text = """define nodenum = 3
define node1 = 2
define vendor = amd
define bandwidth = {direct => [((0,1) -> (25,1)), ((1,0) -> (25,1))]}
define node2 = 2
define bandwidth = {direct => [((0,1) -> (25,1)), ((1,0) -> (25,1))]}
define node3 = 2
define vendor = amd
define bandwidth = {direct => [((0,1) -> (25,1)), ((1,0) -> (25,1))]}
define internode = (node1, node2)
define interbandwidth = {direct => [((1,0) -> (10,1))]}
define internode = (node2, node1)
define interbandwidth = {direct => [((0,1) -> (10,1))]}
define internode = (node2, node3)
define interbandwidth = {switch => [(((1),(0,1)) >-> (8,1))]}
"""
    t = parse_topology(text, "line.topo")
    h = hierarchy(t)
    assert [(c.vendor, c.ranks) for c in h.clusters] == [("amd", (0, 1)), ("nvidia", (2, 3)), ("amd", (4, 5))]
    assert [c.name for c in h.clusters] == ["amd-0", "nvidia", "amd-1"]
    # no NICs: border ranks are the ranks with a link leaving the cluster, at that link's bandwidth
    # (capped by the shared switch it goes through)
    assert h.clusters[0].border_ranks == (1,) and h.clusters[0].nic_gbps == {1: 10}
    assert h.clusters[1].border_ranks == (2, 3)
    assert h.clusters[1].nic_gbps == {2: 10, 3: 8}
    assert h.clusters[2].border_ranks == (4, 5) and h.clusters[2].nic_gbps == {4: 8, 5: 8}
    assert all(c.border_source == "links" for c in h.clusters)
    # brute force: clusters are the connected components of same-vendor nodes
    g = nx.Graph()
    g.add_nodes_from(range(3))
    g.add_edges_from((int(t.rank_node[u]), int(t.rank_node[v])) for u, v in zip(t.link_src, t.link_dst)
                     if t.nodes[int(t.rank_node[u])].vendor == t.nodes[int(t.rank_node[v])].vendor)
    assert sorted(map(sorted, nx.connected_components(g))) == [[0], [1], [2]]


def test_nodes_per_cluster_and_partition():
    t = load_topology(CLUSTERS / "h20_4x2_8x2.topo")  # one vendor, one model: one cluster
    assert hierarchy(t).nclusters == 1
    h = hierarchy(t, nodes_per_cluster=2)  # HetCCL's "2+2" sub-clusters
    assert [c.nodes for c in h.clusters] == [("node1", "node2"), ("node3", "node4")]
    assert [c.name for c in h.clusters] == ["nvidia-H20-0", "nvidia-H20-1"]
    assert h.clusters[1].border_ranks == tuple(range(8, 24))  # one NIC per GPU pair: 25 GB/s each
    assert set(h.clusters[1].nic_gbps.values()) == {25}
    p = hierarchy(t, partition=[["node4", "node1"], [1, 2]])
    assert [c.nodes for c in p.clusters] == [("node1", "node4"), ("node2", "node3")]
    assert p.rank_cluster.tolist() == [0] * 4 + [1] * 12 + [0] * 8
    with pytest.raises(HierarchyError, match="exactly once"):
        hierarchy(t, partition=[["node1"], ["node2", "node3"]])
    with pytest.raises(HierarchyError, match="exactly once"):
        hierarchy(t, partition=[["node1", "node2"], ["node2", "node3", "node4"]])
    with pytest.raises(HierarchyError, match="unknown node"):
        hierarchy(t, partition=[["node1", "node9"]])
    with pytest.raises(HierarchyError, match="mix vendors"):
        hierarchy(load_topology(CLUSTERS / "mixed_v100_w7800.topo"), partition=[[0, 2], [1, 3]])
    with pytest.raises(HierarchyError):
        hierarchy(t, by="colour")
    with pytest.raises(HierarchyError):
        hierarchy(t, nodes_per_cluster=0)


def test_single_node_without_nic_has_no_border():
    h = hierarchy(parse_topology(topo_text([("nvidia", None, 3, [])]), "one.topo"))
    (c,) = h.clusters
    assert c.border_ranks == () and c.internal_ranks == (0, 1, 2) and c.border_source == "none"
    assert "border ranks: none" in h.describe()


def test_builder_topology_without_nic_groups():
    """A programmatic topology: the fallback uses links leaving the cluster."""
    b = TopologyBuilder("prog")
    b.add_node("a", 2, vendor="nvidia", model="X")
    b.add_node("b", 3, vendor="amd", model="Y")
    d = b.params("direct", 50, 1, 1)
    ib = b.params("internode", 12, 2, 2)
    b.add_links([0, 1, 2, 3, 4], [1, 0, 3, 4, 2], d)
    b.add_links([0, 2, 4], [2, 0, 0], ib)
    h = hierarchy(b.build())
    assert [c.border_ranks for c in h.clusters] == [(0,), (2, 4)]
    assert h.clusters[0].nic_gbps == {0: 24} and h.clusters[1].internal_ranks == (3,)


# ---------------------------------------------------------------------------------------- properties
@settings(max_examples=40)
@given(cluster_specs(), st.booleans())
def test_hierarchy_matches_spec(spec, one_per_nic):
    t = parse_topology(topo_text(spec), "spec.topo")
    h = hierarchy(t, border="one-per-nic" if one_per_nic else "nic")
    exp = expected_hierarchy(spec, one_per_nic)
    assert h.nclusters == len(exp)
    assert sorted(r for c in h.clusters for r in c.ranks) == list(range(t.nranks))
    for c, (vendor, model, ranks, border) in zip(h.clusters, exp):
        assert (c.vendor, c.model, c.ranks) == (vendor, model, tuple(ranks))
        if len(spec) > 1:  # NIC groups exist only where NIC links do
            assert c.border_ranks == tuple(sorted(border))
            assert dict(c.nic_gbps) == {b: bw for b, (bw, _) in border.items()}
        assert set(c.border_ranks).isdisjoint(c.internal_ranks)
        assert sorted(c.border_ranks + c.internal_ranks) == list(c.ranks)
        assert all(h.cluster_of(r) is c for r in c.ranks)
    json.dumps(h.summary())
