"""``hccc topo``: text tables, the stable JSON report, the picture, and located errors for bad input.

Oracles: hand-computed HeteCCL chunking for Fig. 10 (closed forms), counts derived from the .topo
text, brute-force checks of the plot layout, and random mutations of real files for the errors.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.commands import topo as cmd_topo
from hccc.cli import main
from hccc.compiler.cluster.topo_parser import parse_topology

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "examples" / "clusters"
EXAMPLES = sorted(p.name for p in CLUSTERS.glob("*.topo"))

from cluster_texts import FIG10  # noqa: E402
from cli_runs import run_cli  # noqa: E402

# a homogeneous 2 x 4 mesh: every GPU pair NVLinked inside a node, one 12.5 GB/s NIC per node
MESH = """\
define nodenum = 2
define chunksize = 512K
define latency = {direct => 1, nic => 2}
define vendor = amd
define gpu = MI250
define node1 = 4
define bandwidth = {direct => [%s]}
define nic = [((0,1,2,3) -> (12.5,1))]
define node2 = 4
define bandwidth = {direct => [%s]}
define nic = [((0,1,2,3) -> (12.5,1))]
define internode = all
define interbandwidth = nic
""" % ((", ".join(f"(({a},{b}) -> (50,1))" for a in range(4) for b in range(4) if a != b),) * 2)

TOP_KEYS = {"schema", "name", "file", "nranks", "nnodes", "nlinks", "chunk_size", "tau_ref_us", "bottleneck",
            "nodes", "vendors", "link_classes", "shared_groups", "hierarchy"}
NODE_KEYS = {"name", "first_rank", "last_rank", "ngpus", "vendor", "platform", "model", "gamma_gbps"}
VENDOR_KEYS = {"vendor", "platform", "nodes", "ranks", "models"}
CLASS_KEYS = {"class", "links", "bandwidth_gbps", "lanes", "total_gbps", "alpha_us", "tau_us", "tau_ref_over_tau",
              "capacity"}
GROUP_KEYS = {"id", "kind", "direction", "label", "links", "bandwidth_gbps", "lanes", "capacity_gbps", "capacity"}


def run_in_a_pipe(*args: str) -> subprocess.CompletedProcess:
    """hccc in a process whose stdout is a real pipe (what a terminal check sees there)."""
    return subprocess.run([sys.executable, "-m", "hccc.cli", *args], capture_output=True, text=True, timeout=600)


def topo_json(path: Path, capsys) -> dict:
    assert main(["topo", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------
# JSON report
# ---------------------------------------------------------------------------------------------
def test_fig10_report_matches_hand_computed_chunking(tmp_path, capsys):
    """S_c = 1 MiB: tau = alpha + 2^20 B / bw. direct 25 GB/s x2 (0.7 us), switch 16 GB/s (1 us),
    internode 8 GB/s (1.7 us, the slowest): tau_ref = 1.7 + 131.072 = 132.772 us."""
    p = tmp_path / "fig10.topo"
    p.write_text(FIG10)
    rep = topo_json(p, capsys)
    assert rep["schema"] == "hccc.topo/1" and rep["name"] == "fig10" and rep["file"] == "fig10.topo"
    assert (rep["nranks"], rep["nnodes"], rep["chunk_size"]) == (6, 2, 1 << 20)
    # links: node1 2 direct; node2 4 direct + 2*2*2 switch; inter 2*4*2 internode
    assert rep["nlinks"] == 2 + 4 + 8 + 16
    tau = {"direct": Fraction(7, 10) + Fraction(2**20, 25_000), "switch": 1 + Fraction(2**20, 16_000),
           "internode": Fraction(17, 10) + Fraction(2**20, 8_000)}  # microseconds
    tau_ref = tau["internode"]
    assert rep["tau_ref_us"] == pytest.approx(float(tau_ref), rel=1e-12)
    assert rep["bottleneck"] == {"class": "internode", "bandwidth_gbps": 8.0, "lanes": 1, "alpha_us": 1.7}
    lanes = {"direct": 2, "switch": 1, "internode": 1}
    links = {"direct": 6, "switch": 8, "internode": 16}
    got = {c["class"]: c for c in rep["link_classes"]}
    assert list(got) == ["direct", "switch", "internode"]
    for cls, c in got.items():
        assert c["links"] == links[cls] and c["lanes"] == lanes[cls]
        assert c["tau_us"] == pytest.approx(float(tau[cls]), rel=1e-12)
        assert c["capacity"] == math.ceil(tau_ref / tau[cls]) * lanes[cls]
    assert [got[c]["capacity"] for c in ("direct", "switch", "internode")] == [8, 2, 1]
    groups = rep["shared_groups"]
    assert [(g["kind"], g["direction"], g["links"], g["capacity_gbps"], g["capacity"]) for g in groups] == [
        ("switch", "a->b", 4, 16.0, 2), ("switch", "b->a", 4, 16.0, 2),
        ("internode", "a->b", 8, 8.0, 1), ("internode", "b->a", 8, 8.0, 1)]
    assert rep["nodes"] == [
        {"name": "node1", "first_rank": 0, "last_rank": 1, "ngpus": 2, "vendor": "nvidia", "platform": "cuda",
         "model": None, "gamma_gbps": None},
        {"name": "node2", "first_rank": 2, "last_rank": 5, "ngpus": 4, "vendor": "nvidia", "platform": "cuda",
         "model": None, "gamma_gbps": None}]
    assert rep["vendors"] == [{"vendor": "nvidia", "platform": "cuda", "nodes": 2, "ranks": 6,
                               "models": {"unknown": 6}}]


def test_mesh_report_extensions(tmp_path, capsys):
    p = tmp_path / "mesh.topo"
    p.write_text(MESH)
    rep = topo_json(p, capsys)
    assert rep["chunk_size"] == 512 * 1024
    assert rep["vendors"] == [{"vendor": "amd", "platform": "hip", "nodes": 2, "ranks": 8, "models": {"MI250": 8}}]
    by = {c["class"]: c for c in rep["link_classes"]}
    # tau(nic) = 2 us + 2^19 B / 12.5 GB/s; tau(direct) = 1 us + 2^19 B / 50 GB/s
    t_nic = 2 + Fraction(2**19, 12_500)
    t_dir = 1 + Fraction(2**19, 50_000)
    assert by["nic"]["links"] == 2 * 4 * 4 and by["direct"]["links"] == 2 * 12
    assert by["direct"]["capacity"] == math.ceil(t_nic / t_dir) and by["nic"]["capacity"] == 1
    assert by["direct"]["alpha_us"] == 1.0 and by["nic"]["alpha_us"] == 2.0
    nic_groups = [g for g in rep["shared_groups"] if g["kind"] == "nic"]
    assert sorted((g["label"].split()[0], g["direction"], g["links"]) for g in nic_groups) == [
        ("node1", "egress", 16), ("node1", "ingress", 16), ("node2", "egress", 16), ("node2", "ingress", 16)]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_report_is_consistent_and_stable(name, capsys):
    path = CLUSTERS / name
    rep = topo_json(path, capsys)
    again = topo_json(path, capsys)
    assert rep == again
    assert set(rep) == TOP_KEYS
    assert all(set(n) == NODE_KEYS for n in rep["nodes"])
    assert all(set(v) == VENDOR_KEYS for v in rep["vendors"])
    assert all(set(c) == CLASS_KEYS for c in rep["link_classes"])
    assert all(set(g) == GROUP_KEYS for g in rep["shared_groups"])
    text = path.read_text()
    # ranks per node from the text: `define nodeK = G`
    sizes = [int(g) for g in re.findall(r"^define node\d+ = (\d+)", text, re.M)]
    assert [n["ngpus"] for n in rep["nodes"]] == sizes and rep["nranks"] == sum(sizes)
    assert [n["first_rank"] for n in rep["nodes"]] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert sum(v["ranks"] for v in rep["vendors"]) == rep["nranks"]
    assert sum(c["links"] for c in rep["link_classes"]) == rep["nlinks"]
    assert all(c["capacity"] == math.ceil(c["tau_ref_over_tau"] - 1e-12) * c["lanes"] for c in rep["link_classes"])
    assert max(c["tau_us"] for c in rep["link_classes"]) == pytest.approx(rep["tau_ref_us"])
    assert [g["id"] for g in rep["shared_groups"]] == list(range(len(rep["shared_groups"])))
    for n in rep["nodes"]:
        assert n["platform"] == {"nvidia": "cuda", "amd": "hip"}[n["vendor"]]


def test_json_keys_are_documented():
    doc = cmd_topo.__doc__
    for key in TOP_KEYS | NODE_KEYS | VENDOR_KEYS | CLASS_KEYS | GROUP_KEYS:
        assert f"``{key}``" in doc, key
    words = set(re.findall(r"[a-z_]+", cmd_topo.EPILOG))  # what `hccc topo -h` prints
    assert TOP_KEYS | NODE_KEYS | VENDOR_KEYS | CLASS_KEYS | GROUP_KEYS <= words
    readme = (ROOT / "docs" / "command-line.md").read_text()
    for key in TOP_KEYS | NODE_KEYS | VENDOR_KEYS | CLASS_KEYS | GROUP_KEYS:
        assert f"`{key}`" in readme or f"`{key}[]`" in readme, key


# ---------------------------------------------------------------------------------------------
# text output
# ---------------------------------------------------------------------------------------------
def test_text_output_in_a_pipe():
    p = run_in_a_pipe("topo", str(CLUSTERS / "mixed_v100_w7800.topo"))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "\x1b[" not in out  # no terminal escapes when not a terminal
    assert out.startswith("cluster mixed_v100_w7800 (mixed_v100_w7800.topo): 4 nodes, 16 GPUs")
    for row in (r"node1\s+0-3\s+4\s+nvidia\s+cuda\s+V100-PCIe\s+300 GB/s",
                r"node3\s+8-11\s+4\s+amd\s+hip\s+W7800\s+190 GB/s",
                r"amd\s+hip\s+2\s+8\s+W7800 x8", r"nvidia\s+cuda\s+2\s+8\s+V100-PCIe x8",
                # a V100's PCIe link: 3 peer links + 12 links to the other nodes' GPUs, 8 GPUs x 2 directions
                r"pcie\s+16\s+egress, ingress\s+15\s+16\s+1\s+16\s+1"):
        assert re.search(row, out), row
    for head in ("nodes", "vendors", "link classes", "shared groups", "C(u,v)", "tau_ref/tau", "C_g"):
        assert head in out


def test_text_link_class_rows_match_the_report(capsys):
    path = CLUSTERS / "v100_4_8.topo"
    rep = topo_json(path, capsys)
    assert main(["topo", str(path)]) == 0
    out = capsys.readouterr().out
    for c in rep["link_classes"]:
        assert re.search(rf"^\s+{c['class']}\s+{c['links']}\s+\S+\s+{c['lanes']}\s+.*\s{c['capacity']}$", out, re.M)
    assert main(["topo", str(path), "--groups"]) == 0
    listed = capsys.readouterr().out
    for g in rep["shared_groups"]:
        assert g["label"] in listed


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutate,line,pattern", [
    (lambda t: t.replace("(25,2)", "(25,2.5)", 1), 3, "lane count must be an integer"),
    (lambda t: t.replace("define node2 = 4", "define node3 = 4"), 4, "out of range"),
    (lambda t: t.replace("(0,1,2,3)", "(0,1,2,7)"), 7, "GPU id 7 is out of range"),
    (lambda t: t.replace("(16,1)", "(0,1)"), 5, "bandwidth must be > 0"),
    (lambda t: t.replace("interbandwidth", "interbandwith"), 7, "unknown definition"),
    (lambda t: t.replace("define node2 = 4", "define node2 = 4\ndefine vendor = intel"), 5, "unknown vendor"),
    (lambda t: t.replace(">->", "->", 1), 5, ""),
    (lambda t: t.replace("define nodenum = 2", "define nodenum = 2\ndefine nodenum = 3"), 2, "twice"),
])
def test_bad_clusters_give_located_errors(tmp_path, mutate, line, pattern):
    p = tmp_path / "bad.topo"
    p.write_text(mutate(FIG10))
    proc = run_cli("topo", str(p))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert re.search(rf"^{re.escape(str(p))}:{line}:\d+: error: .*{pattern}", proc.stderr, re.M), proc.stderr


def test_missing_file_and_usage(tmp_path):
    p = run_cli("topo", str(tmp_path / "nope.topo"))
    assert p.returncode == 1 and "cannot read" in p.stderr and "Traceback" not in p.stderr
    assert run_cli("topo").returncode == 2


_TOKENS = ["(", ")", "[", "]", "{", "}", ",", "->", ">->", "=>", "define", "node1", "node9", "nodenum", "0", "-1",
           "2.5", "nic", "all", "switch", "direct", "pcie", "latency", "vendor", "amd", "1M", "9" * 30, "\n", "#"]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(EXAMPLES), edits=st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from(_TOKENS + [""]), st.integers(0, 6)), min_size=1, max_size=4))
def test_mutated_clusters_never_crash(tmp_path, capsys, name, edits):
    text = (CLUSTERS / name).read_text()
    for pos, tok, cut in edits:
        i = int(pos * len(text))
        text = text[:i] + tok + text[i + cut:]
    p = tmp_path / "m.topo"
    p.write_text(text)
    rc = main(["topo", str(p), "--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    if rc == 1:
        assert re.search(rf"^{re.escape(str(p))}:\d+:\d+: error: ", err, re.M), err
    else:
        assert json.loads(out)["nranks"] == parse_topology(text, str(p)).nranks


def test_json_cluster_goes_through_load_cluster(tmp_path, capsys, monkeypatch):
    """A TACCL profile (.json) is loaded by the pipeline's load_cluster, like every cluster input."""
    import hccc.compiler.pipeline as pipeline

    seen = []
    fig10 = parse_topology(FIG10, "profile")

    def fake(path):
        seen.append(Path(path))
        return fig10

    monkeypatch.setattr(pipeline, "load_cluster", fake)
    prof = tmp_path / "profile.json"
    prof.write_text("{}")
    assert main(["topo", str(prof), "--json"]) == 0
    assert seen == [prof]
    rep = json.loads(capsys.readouterr().out)
    assert rep["file"] == "profile.json" and rep["nranks"] == 6


# ---------------------------------------------------------------------------------------------
# the picture
# ---------------------------------------------------------------------------------------------
def _layout_invariants(topo):
    from hccc.topo_plot import NIC_KINDS, layout

    sc = layout(topo)
    assert not sc.compact
    boxes = {b.node: b for b in sc.boxes}
    assert sorted(boxes) == list(range(len(topo.nodes)))
    # every GPU sits inside its node's box, and GPUs never overlap
    for r in range(topo.nranks):
        b = boxes[int(topo.rank_node[r])]
        x, y = sc.gpu_xy[r]
        assert b.x < x - 0.3 and x + 0.3 < b.x + b.w and b.y < y - 0.3 and y + 0.3 < b.y + b.h
    xy = sc.gpu_xy
    for a in range(topo.nranks):
        for c in range(a + 1, topo.nranks):
            assert math.dist(xy[a], xy[c]) >= 0.99
    # boxes do not overlap
    bl = list(boxes.values())
    for i, p in enumerate(bl):
        for q in bl[i + 1:]:
            assert p.x + p.w <= q.x or q.x + q.w <= p.x or p.y + p.h <= q.y or q.y + q.h <= p.y
    # device markers stay apart, and a node's devices and NICs stay within its box's width
    for i, d in enumerate(sc.devices):
        for e in sc.devices[i + 1:]:
            assert math.dist((d.x, d.y), (e.x, e.y)) >= 0.69
        if d.place != "cross":
            b = boxes[int(topo.rank_node[d.ranks[0]])]
            assert b.x <= d.x <= b.x + b.w
    # every shared group is drawn by exactly one device
    drawn = [g for d in sc.devices for g in d.groups]
    assert sorted(drawn) == list(range(len(topo.groups)))
    # every link is drawn: as a line, by a NIC + bus, or by a device holding both of its ends
    lines = {(min(l.u, l.v), max(l.u, l.v), l.cls) for l in sc.lines}
    holders = [set(d.ranks) for d in sc.devices if d.kind not in NIC_KINDS]
    in_nic = set()
    for g in topo.groups:
        if g.kind in NIC_KINDS:
            in_nic.update(g.members.tolist())
    for link in topo.links():
        key = (min(link.src, link.dst), max(link.src, link.dst), link.cls)
        assert (key in lines or link.cls == "nic" or link.id in in_nic
                or any(link.src in h and link.dst in h for h in holders)), link
    return sc


@pytest.mark.parametrize("name", ["heteccl_fig10.topo", "v100_4x2_8x2.topo", "mixed_v100_w7800.topo",
                                  "h20_4x3_8.topo", "a100_topo4.topo"])
def test_plot_layout_invariants(name):
    from hccc.compiler.pipeline import load_cluster

    sc = _layout_invariants(load_cluster(CLUSTERS / name))
    assert sc.width > 0 and sc.height > 0


def test_plot_layout_one_nic_and_one_pcie_switch_per_gpu():
    ids = range(8)
    node = ("define node@ = 8\n"
            "define bandwidth = {switch => [" + ", ".join(f"(({a},{b}) -> (16,1))" for a in ids for b in ids if a != b)
            + "]}\ndefine nic = [" + ", ".join(f"(({g}) -> (25,1))" for g in ids) + "]\n"
            "define pcie = [" + ", ".join(f"(({g}) -> (16,1))" for g in ids) + "]\n")
    text = ("define nodenum = 5\n" + "".join(node.replace("@", str(k)) for k in range(1, 6))
            + "define internode = all\ndefine interbandwidth = nic\n")
    sc = _layout_invariants(parse_topology(text, "wide.topo"))
    assert len([d for d in sc.devices if d.kind == "nic"]) == 40
    # the 8 one-GPU PCIe links of a node are one hub "8 x 16 GB/s" with a spoke to every GPU
    hubs = [d for d in sc.devices if d.kind == "pcie"]
    assert [(d.copies, d.ranks, len(d.groups)) for d in hubs] == [(8, tuple(range(8 * k, 8 * k + 8)), 16)
                                                                  for k in range(5)]
    assert not sc.lines  # every peer link runs through its node's hub
    assert len(sc.bus_y) == 2  # 5 nodes: two rows, each with its bus segment


def test_plot_layout_merges_nvswitch_ports_and_pairs_directions():
    from hccc.compiler.pipeline import load_cluster

    from hccc.topo_plot import layout

    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    sc = layout(topo)
    switch = [d for d in sc.devices if d.kind == "switch"]
    # 8 per-GPU port devices of node2 (each: a->b and b->a) drawn as one marker "8 x 450"
    assert len(switch) == 1 and switch[0].copies == 8 and len(switch[0].groups) == 16
    assert switch[0].ranks == tuple(range(4, 12)) and switch[0].capacity_gbps == 450
    nics = [d for d in sc.devices if d.kind == "nic"]
    assert len(nics) == 6 and all(len(d.groups) == 2 for d in nics)  # 2 + 4 NICs, egress + ingress each
    assert sc.bus  # nic links: a network bus


def test_plot_compact_mode_for_large_clusters():
    from hccc.compiler.cluster.topology import TopologyBuilder
    from hccc.topo_plot import DETAIL_LIMIT, layout

    b = TopologyBuilder("big")
    for i in range(DETAIL_LIMIT // 8 + 2):
        b.add_node(f"node{i + 1}", 8)
    pid = b.params("internode", 10, 1, 2)
    b.add_links([0, 8], [8, 16], pid)
    topo = b.build()
    sc = layout(topo)
    assert sc.compact and not sc.devices and not sc.lines
    assert [(nl.a, nl.b, nl.cls, nl.links) for nl in sc.node_lines] == [(0, 1, "internode", 1),
                                                                        (1, 2, "internode", 1)]


def test_plot_png_is_written_and_deterministic(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png1, png2 = tmp_path / "a.png", tmp_path / "b.png"
    for png in (png1, png2):
        assert main(["topo", str(CLUSTERS / "v100_4_8.topo"), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {png2}" in out
    data = png1.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert data == png2.read_bytes()
    # PNG header: a picture wide enough to read (>= 600 px)
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert width >= 600 and height >= 200


def test_plot_into_missing_directory_is_an_error(tmp_path):
    pytest.importorskip("matplotlib")
    p = run_cli("topo", str(CLUSTERS / "heteccl_fig10.topo"), "--plot", str(tmp_path / "no" / "such" / "x.png"))
    assert p.returncode == 1 and "cannot write" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------
# the `pcie` extension (shown by `hccc topo` as groups of kind pcie)
# ---------------------------------------------------------------------------------------------
@st.composite
def pcie_clusters(draw):
    """Two nodes with random direct/switch links, NICs, and random PCIe switch partitions."""
    sizes = [draw(st.integers(2, 4)), draw(st.integers(1, 3))]
    lines = ["define nodenum = 2"]
    switches = []
    for k, g in enumerate(sizes):
        lines.append(f"define node{k + 1} = {g}")
        pairs = [(a, b) for a in range(g) for b in range(g) if a != b]
        direct = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
        switch = [p for p in pairs if p not in direct and draw(st.booleans())]
        parts = []
        if direct:
            parts.append("direct => [" + ", ".join(f"(({a},{b}) -> (25,1))" for a, b in direct) + "]")
        if switch:
            parts.append("switch => [" + ", ".join(f"(({a},{b}) -> (16,1))" for a, b in switch) + "]")
        if parts:
            lines.append("define bandwidth = {" + ", ".join(parts) + "}")
        lines.append(f"define nic = [(({','.join(map(str, range(g)))}) -> (12.5,1))]")
        # a random partition of a random subset of the GPUs into PCIe switches
        owner = [draw(st.integers(-1, 1)) for _ in range(g)]
        groups = [tuple(i for i in range(g) if owner[i] == s) for s in (0, 1)]
        groups = [grp for grp in groups if grp]
        if groups:
            lines.append("define pcie = [" + ", ".join(f"(({','.join(map(str, grp))}) -> (16,1))"
                                                     for grp in groups) + "]")
        off = sum(sizes[:k])
        switches += [(f"node{k + 1}", {off + i for i in grp}) for grp in groups]
    lines += ["define internode = all", "define interbandwidth = nic"]
    return "\n".join(lines) + "\n", switches


@settings(max_examples=60)
@given(pcie_clusters())
def test_pcie_groups_hold_exactly_the_non_nvlink_links_through_the_switch(case):
    text, switches = case
    topo = parse_topology(text, "p.topo")
    links = list(topo.links())
    pcie = [g for g in topo.groups if g.kind == "pcie"]
    expect = []
    for node, gpus in switches:
        for direction in ("egress", "ingress"):
            members = sorted(l.id for l in links if l.cls != "direct"
                             and ((l.src in gpus and l.dst not in gpus) if direction == "egress"
                                  else (l.dst in gpus and l.src not in gpus)))
            if members:
                expect.append((node, direction, members))
    got = [(g.label.split()[0], g.direction, g.members.tolist()) for g in pcie]
    assert sorted(got) == sorted(expect)
    for g in pcie:
        assert float(g.bandwidth_gbps) == 16 and g.lanes == 1


def test_pcie_errors_are_located(tmp_path):
    base = "define nodenum = 1\ndefine node1 = 4\n"
    cases = [
        ("define pcie = [((0,1) -> (16,1))]\n" + base, 1, "must follow a node definition"),
        (base + "define pcie = [((0,1) -> (16,1)), ((1,2) -> (16,1))]\n", 3, "already behind PCIe switch 0"),
        (base + "define pcie = [(((0),(1)) >-> (16,1))]\n", 3, "a pcie entry is"),
        (base + "define pcie = [((0,9) -> (16,1))]\n", 3, "GPU id 9 is out of range"),
        (base + "define pcie = [((0,1) -> (16,1))]\ndefine pcie = [((2,3) -> (16,1))]\n", 4, "defined twice"),
        (base + "define pcie = 16\n", 3, "expects a list"),
    ]
    for text, line, pattern in cases:
        p = tmp_path / "p.topo"
        p.write_text(text)
        proc = run_cli("topo", str(p))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert re.search(rf"^{re.escape(str(p))}:{line}:\d+: error: .*{pattern}", proc.stderr, re.M), proc.stderr


def test_pcie_round_trips_through_the_writer():
    from hccc.compiler.cluster.topo_parser import ClusterSpec, LinkSpec, NicSpec, NodeSpec, format_topology

    spec = ClusterSpec([NodeSpec(4, {"switch": [LinkSpec(0, 2, 16), LinkSpec(2, 0, 16)]},
                                 pcie=[NicSpec((0, 1), 16), NicSpec((2,), "12.5", 2)])])
    text = format_topology(spec)
    assert "define pcie = [((0,1) -> (16,1)), ((2) -> (12.5,2))]" in text
    topo = parse_topology(text, "w.topo")
    assert sorted((g.label, g.members.size, float(g.bandwidth_gbps), g.lanes) for g in topo.groups) == [
        ("node1 pcie0 (0,1) egress", 1, 16.0, 1), ("node1 pcie0 (0,1) ingress", 1, 16.0, 1),
        ("node1 pcie1 (2) egress", 1, 12.5, 2), ("node1 pcie1 (2) ingress", 1, 12.5, 2)]


def test_v100_example_models_the_pcie_switches():
    """DESIGN section 4: in the V100 8-GPU node, GPU pairs sit behind 16 GB/s PCIe switches that carry
    the pair's cross-island (UPI) and NIC traffic; the mixed cluster's GPUs each have their own link."""
    from hccc.compiler.pipeline import load_cluster

    t = load_cluster(CLUSTERS / "v100_4_8.topo")
    n8 = t.nodes[1].offset
    upi = t.link_between(n8, n8 + 4)
    kinds = sorted((t.groups[g].kind, t.groups[g].direction, float(t.groups[g].bandwidth_gbps)) for g in upi.groups)
    assert kinds == [("pcie", "egress", 16.0), ("pcie", "ingress", 16.0), ("switch", "a->b", 48.0)]
    nic = t.link_between(n8, 0)
    assert {(t.groups[g].kind, t.groups[g].direction) for g in nic.groups} == {
        ("nic", "egress"), ("nic", "ingress"), ("pcie", "egress")}
    assert not [g for g in t.link_between(n8, n8 + 1).groups]  # NVLink bypasses PCIe
    m = load_cluster(CLUSTERS / "mixed_v100_w7800.topo")
    v100_nic = m.link_between(0, 8)
    caps = {(m.groups[g].kind, m.groups[g].direction): float(m.groups[g].capacity_bytes) for g in v100_nic.groups}
    assert caps[("pcie", "egress")] == 16e9 and caps[("pcie", "ingress")] == 32e9  # V100 Gen3 out, W7800 Gen4 in


def test_taccl_profile_summary_and_plot(tmp_path, capsys):
    """A TACCL profile (NDv2 node, two copies) goes through the same report and picture."""
    pytest.importorskip("hccc.compiler.interop.taccl")
    prof = tmp_path / "ndv2.json"
    prof.write_text(json.dumps({"name": "NDv2_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.3,
                                "node_betas_list": [23, 46], "remote_alpha": 2.6, "remote_beta": 105,
                                "nnodes": 2}))
    rep = topo_json(prof, capsys)
    assert (rep["file"], rep["nranks"], rep["nnodes"]) == ("ndv2.json", 16, 2)
    assert [n["ngpus"] for n in rep["nodes"]] == [8, 8]
    assert sum(c["links"] for c in rep["link_classes"]) == rep["nlinks"]
    assert rep["bottleneck"]["class"] == "nic"
    from hccc.compiler.pipeline import load_cluster

    _layout_invariants(load_cluster(prof))


def test_topo_shows_the_vendor_hierarchy(capsys):
    """The mixed cluster splits into its NVIDIA and AMD halves, in text and JSON."""
    rep = topo_json(CLUSTERS / "mixed_v100_w7800.topo", capsys)
    h = rep["hierarchy"]
    assert h["nclusters"] == 2 and h["mixed_vendor"] is True
    assert main(["topo", str(CLUSTERS / "mixed_v100_w7800.topo")]) == 0
    out = capsys.readouterr().out
    assert "hierarchy: 2 homogeneous clusters" in out and "border ranks" in out
