"""TACCL topology profiles (compiler/interop/taccl.py) as hccc Topologies."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.util.diagnostics import CompileError
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.interop.taccl import NDV2_DOUBLE, NDV2_SINGLE, load_taccl, parse_taccl

MB = 1 << 20
NDV2 = {"name": "NDv2_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.3, "node_betas_list": [23, 46],
        "node_invbws_list": [23, 46], "remote_invbw": 107, "remote_alpha": 2.6, "remote_beta": 105}
DGX2 = {"name": "DGX2_1MB", "gpus_per_node": 16, "nics_per_node": 8, "alpha": 0.3, "node_betas_list": [8],
        "node_invbws_list": [8], "remote_invbw": 107, "remote_alpha": 2.6, "remote_beta": 105}


def topo(d: dict, name="p.json"):
    return parse_taccl(json.dumps(d, indent=4), name)


def links(t):
    return {(int(a), int(b)) for a, b in zip(t.link_src, t.link_dst)}


def test_ndv2_cube_mesh():
    t = topo(NDV2)
    assert t.nranks == 8 and len(t.nodes) == 1 and t.chunk_size == MB
    pairs = set(NDV2_DOUBLE) | set(NDV2_SINGLE)
    assert len(pairs) == 16 and links(t) == pairs | {(b, a) for a, b in pairs}
    # every GPU has 4 NVLink peers, two of them over double links (DGX-1 hybrid cube mesh)
    deg = np.bincount(t.link_src, minlength=8)
    assert (deg == 4).all()
    dbl = np.bincount(np.array(NDV2_DOUBLE).ravel(), minlength=8)
    assert (dbl == 2).all()
    fast = t.link_between(0, 1)
    slow = t.link_between(0, 2)
    assert fast.cls == slow.cls == "direct"
    assert fast.bandwidth == pytest.approx(MB / 23e-6) and slow.bandwidth == pytest.approx(MB / 46e-6)
    assert fast.alpha == pytest.approx(0.3e-6)
    assert t.link_between(0, 5) is None


def test_dgx2_switch_ports_and_two_nodes():
    t = topo(DGX2)
    assert t.nranks == 16 and t.nlinks == 16 * 15
    assert {(g.kind, g.direction) for g in t.groups} == {("switch", "egress"), ("switch", "ingress")}
    assert len(t.groups) == 32 and all(g.members.size == 15 for g in t.groups)
    t2 = topo(dict(DGX2, nnodes=2))
    nic = [g for g in t2.groups if g.kind == "nic"]
    assert len(nic) == 2 * 8 * 2
    # a NIC serves 2 GPUs, each linked to the 16 GPUs of the other node
    assert all(g.members.size == 2 * 16 for g in nic)
    cross = t2.link_between(0, 16)
    assert cross.cls == "nic" and cross.bandwidth == pytest.approx(MB / 105e-6)
    assert cross.alpha == pytest.approx(2.6e-6)
    for g in nic:
        src, dst = t2.link_src[g.members], t2.link_dst[g.members]
        assert ((src // 16) != (dst // 16)).all()
        ends = src if g.direction == "egress" else dst
        assert len(set((ends % 16 // 2).tolist())) == 1


def test_ndv2_two_nodes_share_one_nic():
    t = topo(dict(NDV2, nnodes=2))
    assert t.nranks == 16 and t.nlinks == 64 + 2 * 8 * 8
    nic = [g for g in t.groups if g.kind == "nic"]
    assert len(nic) == 4 and all(g.members.size == 64 for g in nic)


def test_custom_matrices_are_destination_first():
    d = {"name": "tiny", "topology": "custom", "gpus_per_node": 3, "alpha": 1,
         "links": [[0, 2, 0], [1, 0, 0], [1, 1, 0]],            # links[dst][src]
         "betas": [[0, 10, 0], [20, 0, 0], [5, 40, 0]], "invbws": [[0, 0, 0], [0, 0, 0], [0, 0, 0]]}
    t = topo(d)
    assert links(t) == {(1, 0), (0, 1), (0, 2), (1, 2)}
    l10 = t.link_between(1, 0)
    assert l10.lanes == 2 and l10.bandwidth == pytest.approx(MB / 10e-6)
    assert t.link_between(0, 1).bandwidth == pytest.approx(MB / 20e-6)


@given(st.integers(2, 5), st.data())
@settings(max_examples=40)
def test_custom_profiles_round_trip_their_matrices(n, data):
    lanes = [[0 if i == j else data.draw(st.integers(0, 3)) for j in range(n)] for i in range(n)]
    betas = [[0 if i == j else data.draw(st.integers(1, 200)) for j in range(n)] for i in range(n)]
    chunk = data.draw(st.sampled_from([4096, 1 << 16, MB]))
    t = topo({"name": "r", "topology": "custom", "gpus_per_node": n, "alpha": 0.5, "links": lanes, "betas": betas,
              "chunk_size": chunk})
    want = {(s, d) for d in range(n) for s in range(n) if lanes[d][s]}
    assert links(t) == want
    for s, d in want:
        ln = t.link_between(s, d)
        assert ln.lanes == lanes[d][s]
        assert ln.bandwidth == pytest.approx(chunk / (betas[d][s] * 1e-6))


def test_chunk_size_from_name_or_key():
    assert topo(dict(NDV2, name="NDv2_32KB")).chunk_size == 32 * 1024
    assert topo(dict(NDV2, name="NDv2-1KB")).chunk_size == 1024
    assert topo(dict(NDV2, name="NDv2", chunk_size=5000)).chunk_size == 5000
    assert topo(dict(NDV2, name="NDv2")).chunk_size == MB
    # beta is per chunk: the same beta over a smaller chunk means a slower link
    assert topo(dict(NDV2, name="NDv2_32KB")).link_between(0, 1).bandwidth == pytest.approx(32768 / 23e-6)


def test_wiring_is_inferred_or_named():
    hub = topo({"name": "box", "gpus_per_node": 4, "alpha": 0.1, "node_betas_list": [10]})
    assert hub.nlinks == 12 and len(hub.groups) == 8
    named = topo(dict(NDV2, name="mine", topology="ndv2"))
    assert named.nlinks == 32


def err(d_or_text, name="p.json"):
    text = d_or_text if isinstance(d_or_text, str) else json.dumps(d_or_text, indent=4)
    with pytest.raises(CompileError) as e:
        parse_taccl(text, name)
    return e.value.diagnostics[0]


@pytest.mark.parametrize("change,message,key", [
    ({"alpha": "fast"}, '"alpha" must be a number', "alpha"),
    ({"gpus_per_node": 4}, "an NDv2 node has 8 GPUs", "gpus_per_node"),
    ({"node_betas_list": [23]}, "lists 2 betas", "node_betas_list"),
    ({"node_betas_list": [23, -1]}, "must be > 0", "node_betas_list"),
    ({"topology": "torus"}, "unknown topology 'torus'", "topology"),
    ({"nnodes": 2, "nics_per_node": 3}, "cannot be split evenly over 3 NICs", "nics_per_node"),
    ({"nnodes": 0}, "out of range", "nnodes"),
    ({"gpus_per_node": 8.5}, "must be an integer", "gpus_per_node"),
    ({"vendor": "intel"}, "unknown vendor", "vendor"),
])
def test_bad_values_are_located_at_their_key(change, message, key):
    d = dict(NDV2, **change)
    diag = err(d)
    assert message in diag.message
    text = json.dumps(d, indent=4)
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if f'"{key}"' in ln)
    assert diag.location.line == line


def test_missing_keys_and_bad_json():
    d = dict(NDV2)
    del d["gpus_per_node"]
    assert 'lacks "gpus_per_node"' in err(d).message
    d = dict(NDV2, nnodes=2)
    del d["remote_beta"]
    assert 'lacks "remote_beta"' in err(d).message
    diag = err('{"name": "x",\n  "gpus_per_node": 8,,\n}')
    assert diag.message.startswith("not valid JSON") and (diag.location.line, diag.location.col) == (2, 22)
    assert "JSON object" in err("[1, 2]").message
    custom = {"name": "c", "topology": "custom", "gpus_per_node": 2, "alpha": 0, "links": [[0, 1]], "betas": [[0, 1]]}
    assert "must be a 2 x 2 matrix" in err(custom).message
    selfl = dict(custom, links=[[1, 0], [0, 0]], betas=[[1, 0], [0, 0]])
    assert "links GPU 0 to itself" in err(selfl).message


def test_files_cluster_loader_and_cli(tmp_path, capsys):
    p = tmp_path / "topo-ndv2-1MB.json"
    p.write_text(json.dumps(dict(NDV2, nnodes=2), indent=4))
    t = load_taccl(p)
    assert load_cluster(p).nlinks == t.nlinks
    assert main(["topo", str(p)]) == 0
    assert "NDv2_1MB" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "gpus_per_node": 8, "alpha": 0.3}')
    assert main(["topo", str(bad)]) == 1
    assert f"{bad}:1:1: error: cannot tell the node's wiring" in capsys.readouterr().err
