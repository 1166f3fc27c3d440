"""The shipped example clusters: they parse, have the expected shape, and are up to date."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hccc.compiler.cluster.topo_parser import load_topology

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"

HETECCL = {"4_8": [4, 8], "4x2_8": [4, 4, 8], "4x3": [4, 4, 4], "4x3_8": [4, 4, 4, 8], "8x2_4": [8, 8, 4],
           "4x2_8x2": [4, 4, 8, 8]}
EXPECTED = {"heteccl_fig10": ([2, 4], {"nvidia": 6})}
for label, sizes in HETECCL.items():
    EXPECTED[f"h20_{label}"] = (sizes, {"nvidia": sum(sizes)})
    EXPECTED[f"v100_{label}"] = (sizes, {"nvidia": sum(sizes)})
for i, (n, g) in enumerate([(2, 4), (2, 8), (4, 4), (4, 8)], start=1):
    EXPECTED[f"a100_topo{i}"] = ([g] * n, {"nvidia": n * g})
EXPECTED["mixed_v100_w7800"] = ([4, 4, 4, 4], {"nvidia": 8, "amd": 8})


def test_every_example_is_listed():
    assert {p.stem for p in CLUSTERS.glob("*.topo")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_parses(name):
    sizes, vendors = EXPECTED[name]
    t = load_topology(CLUSTERS / f"{name}.topo")
    assert [n.ngpus for n in t.nodes] == sizes
    assert t.summary()["vendors"] == vendors
    json.dumps(t.summary())
    # every pair of GPUs can talk (directly: all these clusters are fully connected)
    src, dst = t.pairs()
    assert src.size == t.nranks * (t.nranks - 1)
    # inter-node traffic always goes through a bounded device: every cross-node link is in a group
    for i in range(t.nlinks):
        if t.rank_node[t.link_src[i]] != t.rank_node[t.link_dst[i]]:
            assert t.groups_of_link(i)
    assert min(int(c) for c in t.link_capacity) >= 1


def test_h20_figures():
    t = load_topology(CLUSTERS / "h20_4_8.topo")
    node2 = t.nodes[1]
    a, b = node2.offset, node2.offset + 5
    l = t.link_between(a, b)
    assert l.cls == "switch" and l.total_bandwidth == 450e9
    # the port groups of GPU a (egress) and GPU b (ingress), 450 GB/s each
    caps = sorted(t.groups[g].capacity_bytes for g in l.groups)
    assert caps == [450e9, 450e9]
    nic = t.link_between(0, a)
    assert nic.cls == "nic" and nic.bandwidth == 50e9
    assert {t.groups[g].direction for g in nic.groups} == {"egress", "ingress"}


def test_v100_figures():
    t = load_topology(CLUSTERS / "v100_4_8.topo")
    n8 = t.nodes[1].offset
    assert t.link_between(n8, n8 + 1).cls == "direct" and t.link_between(n8, n8 + 1).total_bandwidth == 50e9
    upi = t.link_between(n8, n8 + 4)
    assert upi.cls == "switch" and t.groups[upi.groups[0]].capacity_bytes == 48e9
    assert t.link_between(0, n8).bandwidth == 8e9  # the 4-GPU node's 64 Gbps NIC is the bottleneck


def test_mixed_vendor():
    t = load_topology(CLUSTERS / "mixed_v100_w7800.topo")
    assert [t.vendor_of(r) for r in (0, 7, 8, 15)] == ["nvidia", "nvidia", "amd", "amd"]
    assert t.model_of(9) == "W7800"
    assert [float(n.gamma_gbps) for n in t.nodes] == [300, 300, 190, 190]


def test_generator_is_deterministic_and_current(tmp_path):
    gen = CLUSTERS / "generate.py"
    r = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    subprocess.run([sys.executable, str(gen), "--out", str(tmp_path)], check=True)
    for p in sorted(tmp_path.glob("*.topo")):
        assert p.read_bytes() == (CLUSTERS / p.name).read_bytes()
