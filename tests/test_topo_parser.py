"""The .topo front end: HeteCCL Fig. 10, extensions, and located errors."""
from __future__ import annotations

import json

import pytest

from hccc.util.diagnostics import CompileError, render
from hccc.compiler.cluster.topo_parser import load_topology, parse_topology

from cluster_texts import FIG10 as DESIGN_EXAMPLE  # noqa: E402

# The listing as printed in the HeteCCL paper (Fig. 10): its parenthesisation ( ( (A) , (B) >-> (bw,n) ) ) and
# line breaks.  The extracted text drops a ']' after the switch list and a ')' on line 7; those are restored.
PAPER_FIG10 = """\
define nodenum = 2
define node1 = 2
define bandwidth = {direct => [( (0,1) -> (25,2) )
, ( (1,0) -> (25,2) ) ]}
define node2 = 4
define bandwidth = {switch => [( ( (0,1) , (2,3)
>-> (16,1) ) ) ], direct => [( (0,1) -> (25,2) )
, ( (1,0) -> (25,2) ) , ( (2,3) -> (25,2) ) , ( (3,2)
-> (25,2) ) ]}
define internode = (node1, node2)
define interbandwidth = {switch => [( ( (0,1)
, (0,1,2,3) >-> (8,1) ) ) ]}
"""

GB = 1e9


def edges(topo):
    return {(l.src, l.dst, l.cls, l.bandwidth / GB, l.lanes) for l in topo.links()}


def expected_fig10():
    exp = set()
    # node1: ranks 0,1 ; node2: ranks 2..5
    exp |= {(0, 1, "direct", 25, 2), (1, 0, "direct", 25, 2)}
    exp |= {(2, 3, "direct", 25, 2), (3, 2, "direct", 25, 2), (4, 5, "direct", 25, 2), (5, 4, "direct", 25, 2)}
    for a in (2, 3):
        for b in (4, 5):
            exp |= {(a, b, "switch", 16, 1), (b, a, "switch", 16, 1)}
    for a in (0, 1):
        for b in (2, 3, 4, 5):
            exp |= {(a, b, "internode", 8, 1), (b, a, "internode", 8, 1)}
    return exp


@pytest.mark.parametrize("text", [DESIGN_EXAMPLE, PAPER_FIG10], ids=["design", "paper"])
def test_fig10_graph(text):
    t = parse_topology(text, "fig10.topo")
    assert t.nranks == 6 and [n.ngpus for n in t.nodes] == [2, 4]
    assert [n.offset for n in t.nodes] == [0, 2]
    assert edges(t) == expected_fig10()
    assert t.nlinks == len(expected_fig10())  # no duplicate links
    groups = {(g.kind, g.direction): {(t.link(i).src, t.link(i).dst) for i in g.members} for g in t.groups}
    assert groups == {
        ("switch", "a->b"): {(a, b) for a in (2, 3) for b in (4, 5)},
        ("switch", "b->a"): {(b, a) for a in (2, 3) for b in (4, 5)},
        ("internode", "a->b"): {(a, b) for a in (0, 1) for b in range(2, 6)},
        ("internode", "b->a"): {(b, a) for a in (0, 1) for b in range(2, 6)},
    }
    for g in t.groups:
        assert g.capacity_bytes == (16 * GB if g.kind == "switch" else 8 * GB)
    g = t.graph
    assert g.number_of_nodes() == 6 and g.number_of_edges() == len(expected_fig10())
    assert all(d["beta"] == pytest.approx(1 / d["bandwidth"]) for _, _, d in g.edges(data=True))
    assert t.node_of(3).name == "node2" and t.vendor_of(0) == "nvidia"


def test_fig10_chunking_hand_computed():
    # S_c = 1 MiB, default alpha: direct 0.7 us, switch 1 us, internode 1.7 us.
    t = parse_topology(DESIGN_EXAMPLE)
    S = 1 << 20
    tau = {"direct": 0.7e-6 + S / 25e9, "switch": 1e-6 + S / 16e9, "internode": 1.7e-6 + S / 8e9}
    assert t.tau_ref == pytest.approx(tau["internode"])
    import math
    want = {c: math.ceil(tau["internode"] / v) for c, v in tau.items()}
    assert want == {"direct": 4, "switch": 2, "internode": 1}  # 132.77/42.64 = 3.11 ; 132.77/66.54 = 1.995
    assert t.link_between(0, 1).capacity == 4 * 2
    assert t.link_between(2, 4).capacity == 2
    assert t.link_between(0, 5).capacity == 1
    assert all(g.capacity == (2 if g.kind == "switch" else 1) for g in t.groups)


def test_chunking_exact_ratio():
    # alpha 0, S_c = 10^6: tau(12.5) / tau(25) is exactly 2 -> C = 2, never 3 from rounding.
    text = """
    define nodenum = 1
    define chunksize = 1000000
    define latency = {direct => 0, switch => 0}
    define node1 = 3
    define bandwidth = {direct => [((0,1) -> (25,3)), ((1,2) -> (12.5,1)), ((2,0) -> (0.1,1))]}
    """
    t = parse_topology(text)
    assert t.chunk_size == 10**6
    assert t.link_between(2, 0).capacity == 1
    # tau_ref = 1e6 / 0.1e9 = 10 ms ; 12.5 GB/s -> 80 us -> 125 exactly
    assert t.link_between(1, 2).capacity == 125
    assert t.link_between(0, 1).capacity == 250 * 3
    assert t.capacity(0, 1) == 750 and t.capacity(1, 0) == 0


def test_extensions():
    text = """
    define nodenum = 2
    define chunksize = 512K
    define latency = {direct => 2, internode => 3}
    define gamma = {nvidia => 300, amd => 190}
    define node1 = 2
    define vendor = AMD
    define gpu = W7800
    define bandwidth = {direct => [((0,1) -> (50,1))]}
    define latency = {direct => 0.5}
    define nic = [((0,1) -> (25,2))]
    define node2 = 2
    define gamma = 1000
    define nic = [((0) -> (12.5,1)), ((1) -> (25, 1))]
    define internode = (node1, node2)
    define interbandwidth = nic
    define latency = {nic => 4}
    """
    t = parse_topology(text, "ext.topo")
    assert t.name == "ext" and t.chunk_size == 512 * 1024
    assert [n.vendor for n in t.nodes] == ["amd", "nvidia"]
    assert t.nodes[0].model == "W7800" and t.nodes[1].model is None
    assert [float(n.gamma_gbps) for n in t.nodes] == [190, 1000]
    assert t.link_between(0, 1).alpha == pytest.approx(0.5e-6)
    nic = {(l.src, l.dst): l for l in t.links() if l.cls == "nic"}
    assert set(nic) == {(a, b) for a in (0, 1) for b in (2, 3)} | {(b, a) for a in (0, 1) for b in (2, 3)}
    assert nic[(0, 2)].bandwidth == 12.5e9 and nic[(0, 2)].lanes == 1
    assert nic[(3, 1)].bandwidth == 25e9 and nic[(3, 1)].lanes == 1
    assert all(l.alpha == pytest.approx(4e-6) for l in nic.values())
    by = {g.label: {(t.link(i).src, t.link(i).dst) for i in g.members} for g in t.groups}
    assert by["node1 nic0 (0,1) egress"] == {(a, b) for a in (0, 1) for b in (2, 3)}
    assert by["node1 nic0 (0,1) ingress"] == {(b, a) for a in (0, 1) for b in (2, 3)}
    assert by["node2 nic0 (0) egress"] == {(2, 0), (2, 1)}
    assert by["node2 nic1 (1) ingress"] == {(0, 3), (1, 3)}
    cap = {g.label: g.capacity_bytes for g in t.groups}
    assert cap["node1 nic0 (0,1) egress"] == 50e9
    json.dumps(t.summary())


def test_internode_all_and_shared_merge():
    # per-GPU "NVSwitch port" groups: each link belongs to its source's and its destination's group
    ports = ", ".join(f"((({g}),({','.join(str(h) for h in range(3) if h != g)})) >-> (50,9))" for g in range(3))
    text = f"""
    define nodenum = 3
    define node1 = 3
    define bandwidth = {{switch => [{ports}]}}
    define node2 = 1
    define node3 = 1
    define internode = all
    define interbandwidth = {{direct => [((0,0) -> (10,1))]}}
    """
    t = parse_topology(text)
    intra = [l for l in t.links() if l.cls == "switch"]
    assert len(intra) == 6
    for l in intra:
        assert len(l.groups) == 2
        labels = {t.groups[g].label for g in l.groups}
        assert any(lab.endswith("a->b") and f"(({l.src})," in lab for lab in labels)
        assert any(lab.endswith("b->a") and f"(({l.dst})," in lab for lab in labels)
    inter = {(l.src, l.dst) for l in t.links() if l.cls == "internode"}
    assert inter == {(0, 3), (0, 4), (3, 4)}


def test_nul_and_garbage(tmp_path):
    p = tmp_path / "bad.topo"
    p.write_bytes(b"define nodenum = 1\n\xff\xfe")
    with pytest.raises(CompileError) as e:
        load_topology(p)
    assert e.value.diagnostics[0].location.line == 2
    with pytest.raises(CompileError) as e:
        parse_topology("define nodenum = 1\x00")
    assert "NUL" in e.value.diagnostics[0].message


def _err(text):
    with pytest.raises(CompileError) as e:
        parse_topology(text, "t.topo")
    d = e.value.diagnostics[0]
    assert d.location is not None
    render(d)  # renders without error
    return d.message, d.location.line, d.location.col


N1 = "define nodenum = 1\ndefine node1 = 2\n"


@pytest.mark.parametrize("text,fragment,line,col", [
    ("define nodenum = 2\ndefine node1 = 2\n", "missing: node2", 1, 8),
    ("define nodenum = 1\ndefine node2 = 2\n", "out of range", 2, 8),
    ("define node1 = 2\n", "before 'define nodenum", 1, 8),
    ("define nodenum = 2\ndefine node1 = 2\ndefine node1 = 3\n", "defined twice", 3, 8),
    (N1 + "define bandwidth = {direct => [((0,2) -> (25,1))]}\n", "GPU id 2 is out of range", 3, 36),
    (N1 + "define bandwidth = {direct => [((0,1) -> (0,1))]}\n", "bandwidth must be > 0", 3, 43),
    (N1 + "define bandwidth = {direct => [((0,1) -> (-3,1))]}\n", "bandwidth must be > 0", 3, 43),
    (N1 + "define bandwidth = {direct => [((0,1) -> (5,1.5))]}\n", "must be an integer", 3, 45),
    (N1 + "define bandwidth = {direct => [((0,1) -> (5,1)), ((0,1) -> (6,1))]}\n", "defined twice", 3, 50),
    (N1 + "define bandwidth = {direct => [((0,0) -> (5,1))]}\n", "itself", 3, 36),
    (N1 + "define bandwidth = {direct => []}\ndefine bandwidth = {direct => []}\n", "twice in this scope", 4, 8),
    (N1 + "define bandwidth = {nvlink => []}\n", "unknown connection type", 3, 21),
    (N1 + "define bandwidth = {switch => [(((0),(0,1)) >-> (5,1))]}\n", "in both groups", 3, 38),
    (N1 + "define interbandwidth = {direct => []}\n", "must follow 'define internode", 3, 8),
    ("define nodenum = 1\ndefine bandwidth = {direct => []}\n", "must follow a node", 2, 8),
    ("define nodenum = 2\ndefine node1 = 1\ndefine node2 = 1\ndefine internode = (node1, node3)\n"
     "define interbandwidth = {direct => []}\n", "undefined node 'node3'", 4, 28),
    ("define nodenum = 2\ndefine node1 = 1\ndefine node2 = 1\ndefine internode = (node1, node2)\n",
     "no 'define interbandwidth", 4, 8),
    ("define nodenum = 2\ndefine node1 = 1\ndefine node2 = 2\ndefine internode = (node1, node2)\n"
     "define interbandwidth = {direct => [((0,2) -> (5,1))]}\n", "node2 has 2 GPU", 5, 41),
    ("define nodenum = 2\ndefine node1 = 1\ndefine node2 = 1\ndefine internode = (node1, node2)\n"
     "define interbandwidth = nic\n", "has none", 5, 25),
    (N1 + "define vendor = intel\n", "unknown vendor", 3, 17),
    (N1 + "define frobnicate = 3\n", "unknown definition", 3, 8),
    (N1 + "define bandwidth = {direct => [((0,1) -> (25,1)]}\n", "unexpected ']'", 3, 48),
    (N1 + "define bandwidth = {direct => [((0,1) -> (25,1))\n", "end of input", 3, 49),
    (N1 + "define node1 = 2 $\n", "unexpected character '$'", 3, 18),
    ("define nodenum = 0\n", "must be > 0", 1, 18),
    ("define nodenum = 1\ndefine chunksize = 1M\ndefine node1 = 1\ndefine chunksize = 2M\n", "twice", 4, 8),
    (N1 + "define nic = [((0,1) -> (5,1)), ((1) -> (5,1))]\n", "already behind NIC", 3, 34),
    (N1 + "define bandwidth = {direct => [((0,1) -> (5M,1))]}\n", "plain number", 3, 43),
    ("", "missing 'define nodenum", 1, 1),
])
def test_errors_located(text, fragment, line, col):
    msg, l, c = _err(text)
    assert fragment in msg, msg
    assert (l, c) == (line, col), (msg, l, c)


def test_conflicting_shared_redeclaration():
    text = N1 + "define bandwidth = {switch => [(((0),(1)) >-> (5,1)), (((1),(0)) >-> (6,1))]}\n"
    msg, l, c = _err(text)
    assert "different bandwidth" in msg and (l, c) == (3, 55)


def test_duplicate_internode_pair():
    text = ("define nodenum = 2\ndefine node1 = 1\ndefine node2 = 1\n"
            "define internode = (node1, node2)\ndefine interbandwidth = {direct => [((0,0) -> (5,1))]}\n"
            "define internode = (node1, node2)\ndefine interbandwidth = {direct => []}\n")
    msg, l, c = _err(text)
    assert "already defined" in msg and (l, c) == (6, 8)


def test_huge_numbers_rejected():
    msg, *_ = _err("define nodenum = 99999999999999999999\n")
    assert "too large" in msg
    msg, *_ = _err("define nodenum = 1\ndefine node1 = 100000\n")
    assert "too large" in msg


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from conftest import examples  # noqa: E402

_ALPHABET = st.sampled_from(list("define nodenum=0123456789.-()[]{},>$#\n") + ["node1", "node2", "switch",
                                                                              "direct", "->", ">->", "=>"])


@settings(max_examples=examples(150))     # the thorough profile: ten times as many
@given(st.data())
def test_mutated_input_never_crashes(data):
    """Any edit of a valid file either parses or fails with a located CompileError, never a traceback."""
    text = data.draw(st.sampled_from([DESIGN_EXAMPLE, PAPER_FIG10]))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 6))
        ins = "".join(data.draw(st.lists(_ALPHABET, max_size=3)))
        text = text[:pos] + ins + text[pos + cut:]
    try:
        parse_topology(text, "m.topo")
    except CompileError as e:
        d = e.diagnostics[0]
        assert d.location is not None and d.location.line >= 1 and d.location.col >= 1
        render(d)


@settings(max_examples=examples(50))     # the thorough profile: ten times as many
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes(text):
    try:
        parse_topology(text)
    except CompileError as e:
        assert e.diagnostics[0].location is not None
