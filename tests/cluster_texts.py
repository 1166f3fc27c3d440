"""Cluster descriptions shared by several test files (written here, not in examples/, so the
tests see clusters that the repository's examples do not cover)."""
from __future__ import annotations

from hypothesis import strategies as st


# HeteCCL Fig. 10: a 2-GPU node and a 4-GPU node behind shared switches.
FIG10 = """\
define nodenum = 2
define node1 = 2
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define node2 = 4
define bandwidth = {switch => [(((0,1),(2,3)) >-> (16,1))], direct => [((0,1) -> (25,2)), ((1,0) -> (25,2)), ((2,3) -> (25,2)), ((3,2) -> (25,2))]}
define internode = (node1, node2)
define interbandwidth = {switch => [(((0,1),(0,1,2,3)) >-> (8,1))]}
"""

# NVIDIA, AMD, NVIDIA, AMD nodes of two GPUs each, one NIC per node, every pair of GPUs reachable
# (mixed-vendor compile and runtime tests).
MIXED_2X2 = """\
define nodenum = 4
define node1 = 2
define vendor = nvidia
define gpu = V100
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define nic = [((0,1) -> (25,1))]
define node2 = 2
define vendor = amd
define gpu = W7800
define bandwidth = {switch => [(((0),(1)) >-> (32,1))]}
define nic = [((0,1) -> (25,1))]
define node3 = 2
define vendor = nvidia
define nic = [((0,1) -> (25,1))]
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define node4 = 2
define vendor = amd
define nic = [((0,1) -> (25,1))]
define bandwidth = {switch => [(((0),(1)) >-> (32,1))]}
define internode = all
define interbandwidth = nic
"""


# Two AMD nodes: six GPUs in a mesh of 1-4 lanes of 50 GB/s with a NIC per pair, and
# eight in a ring of 25 GB/s lanes with a 12.5 GB/s NIC each (tree programs with deep trees; its
# ReduceScatter rounds to many streams, whose pipelines fill and drain short of the packing).
RING_AND_MESH_14 = """\
define nodenum = 2

define node1 = 6
define vendor = amd
define bandwidth = {direct => [((0,1) -> (50,4)), ((1,0) -> (50,4)), ((0,2) -> (50,3)), ((2,0) -> (50,3)),
    ((0,3) -> (50,4)), ((3,0) -> (50,4)), ((0,4) -> (50,1)), ((4,0) -> (50,1)),
    ((0,5) -> (50,2)), ((5,0) -> (50,2)), ((1,2) -> (50,4)), ((2,1) -> (50,4)),
    ((1,3) -> (50,4)), ((3,1) -> (50,4)), ((1,4) -> (50,2)), ((4,1) -> (50,2)),
    ((1,5) -> (50,2)), ((5,1) -> (50,2)), ((2,3) -> (50,1)), ((3,2) -> (50,1)),
    ((2,4) -> (50,1)), ((4,2) -> (50,1)), ((2,5) -> (50,2)), ((5,2) -> (50,2)),
    ((3,4) -> (50,4)), ((4,3) -> (50,4)), ((3,5) -> (50,2)), ((5,3) -> (50,2)),
    ((4,5) -> (50,2)), ((5,4) -> (50,2))]}
define nic = [((0,1) -> (50,1)), ((2,3) -> (50,1)), ((4,5) -> (50,1))]

define node2 = 8
define vendor = amd
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2)), ((0,7) -> (25,1)), ((7,0) -> (25,1)),
    ((1,2) -> (25,3)), ((2,1) -> (25,3)), ((2,3) -> (25,4)), ((3,2) -> (25,4)),
    ((3,4) -> (25,2)), ((4,3) -> (25,2)), ((4,5) -> (25,4)), ((5,4) -> (25,4)),
    ((5,6) -> (25,4)), ((6,5) -> (25,4)), ((6,7) -> (25,4)), ((7,6) -> (25,4))]}
define nic = [((0) -> (12.5,1)), ((1) -> (12.5,1)), ((2) -> (12.5,1)), ((3) -> (12.5,1)),
    ((4) -> (12.5,1)), ((5) -> (12.5,1)), ((6) -> (12.5,1)), ((7) -> (12.5,1))]

define internode = all
define interbandwidth = nic
"""


def topo_text(nodes, *, nic_links: bool = True) -> str:
    """A .topo with full NVLink meshes inside nodes and every node pair linked through NICs.

    ``nodes``: list of (vendor, model, ngpus, nics) with ``nics`` a list of (gpu tuple, GB/s)."""
    out = [f"define nodenum = {len(nodes)}"]
    for i, (vendor, model, g, nics) in enumerate(nodes, 1):
        out.append(f"define node{i} = {g}")
        out.append(f"define vendor = {vendor}")
        if model:
            out.append(f"define gpu = {model}")
        if g > 1:
            links = ", ".join(f"(({a},{b}) -> (25,2))" for a in range(g) for b in range(g) if a != b)
            out.append(f"define bandwidth = {{direct => [{links}]}}")
        if nics:
            out.append("define nic = [" + ", ".join(f"(({','.join(map(str, gp))}{',' if len(gp) == 1 else ''})"
                                                    f" -> ({bw},1))" for gp, bw in nics) + "]")
    if nic_links and len(nodes) > 1:
        out += ["define internode = all", "define interbandwidth = nic"]
    return "\n".join(out) + "\n"


MIXED_3 = [  # 3 vendor/model mixes, odd GPU counts, several NICs per node, unequal NICs
    ("nvidia", "A100", 3, [((0, 1), 25), ((2,), "12.5")]),
    ("amd", "MI250", 5, [((0, 1, 2), 50), ((3, 4), 25)]),
    ("nvidia", "H100", 2, [((0, 1), 50)]),
    ("amd", "MI250", 1, [((0,), 25)]),
]


VENDOR_MODELS = [("nvidia", "A100"), ("nvidia", "H100"), ("amd", "MI300X"), ("amd", "W7800")]


@st.composite
def cluster_specs(draw, max_nodes: int = 5, max_gpus: int = 5):
    n = draw(st.integers(1, max_nodes))
    nodes = []
    for _ in range(n):
        vendor, model = draw(st.sampled_from(VENDOR_MODELS))
        g = draw(st.integers(1, max_gpus))
        cuts = sorted(draw(st.sets(st.integers(1, g - 1), max_size=g - 1))) if g > 1 else []
        bounds = [0, *cuts, g]
        nics = [(tuple(range(bounds[i], bounds[i + 1])), draw(st.sampled_from([25, 50, "12.5"])))
                for i in range(len(bounds) - 1)]
        nodes.append((vendor, model, g, nics))
    return nodes


def many_nodes_text(nodes: int, gpus: int = 8) -> str:
    """``nodes`` nodes of ``gpus`` NVLink-meshed GPUs, two NICs each, every GPU pair across nodes
    linked through the NICs: big enough that AllToAll's bounds and routing need a time limit."""
    mesh = ", ".join(f"(({a},{b}) -> (100,2))" for a in range(gpus) for b in range(gpus) if a != b)
    half = gpus // 2
    nics = f"[(({','.join(map(str, range(half)))}) -> (25,1)), (({','.join(map(str, range(half, gpus)))}) -> (25,1))]"
    lines = [f"define nodenum = {nodes}"]
    for i in range(1, nodes + 1):
        lines += [f"define node{i} = {gpus}", f"define bandwidth = {{direct => [{mesh}]}}", f"define nic = {nics}"]
    return "\n".join(lines + ["define internode = all", "define interbandwidth = nic"]) + "\n"


def h20_nodes_text(nodes: int) -> str:
    """``nodes`` 8-GPU H20 nodes as examples/clusters writes them (NVSwitch, a 400 Gbps NIC per GPU
    pair), every pair of nodes through the NICs: the large clusters of ``hccc synth`` at scale."""
    import importlib.util
    from pathlib import Path

    from hccc.compiler.cluster.topo_parser import format_topology

    path = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "generate.py"
    spec = importlib.util.spec_from_file_location("cluster_gen", path)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    return format_topology(g.cluster([g.h20_node8() for _ in range(nodes)], f"{nodes} x 8 H20"))


def slow_switch_node_beside_a_fast_one() -> str:
    """Two NVSwitch nodes of four GPUs behind 100 GB/s of NICs each way: the first of 300 GB/s
    ports (a 50 GB/s NIC a GPU pair), the second of 100 GB/s ports (a 25 GB/s NIC a GPU): two
    kinds of node, so the packing's LP runs over classes of ranks and their translates, and no
    AllReduce reaches the cut bound (the slow node is slower inside than its cut)."""
    from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, NicSpec, NodeSpec, SharedSpec,
                                                    format_topology)

    def node(port_gbps, ports, nics):
        switch = [SharedSpec((a,), tuple(b for b in range(4) if b != a), port_gbps, ports) for a in range(4)]
        return NodeSpec(4, {"switch": switch}, nics=[NicSpec(g, bw) for g, bw in nics])

    return format_topology(ClusterSpec([node(25, 12, [((0, 1), 50), ((2, 3), 50)]),
                                        node(25, 4, [((g,), 25) for g in range(4)])],
                                       [InternodeSpec("all", "nic")]))
