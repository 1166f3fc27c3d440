"""``hccc topo --from-nccl / --from-smi / --detect``: machine descriptions become ``.topo`` files.

Oracles: the hardware each fixture under ``tests/topo_dumps`` describes, with every bandwidth worked
out here by hand from the published figures (PCIe Gen4 x16 = 16 x 1.969 GB/s, NVLink 3 and 4 = 25 GB/s
per link, a 200 Gbit/s port = 25 GB/s); two descriptions of one machine by two tools (NCCL's dump
and ``nvidia-smi topo -m`` of a DGX A100) that must agree; random matrices whose links the test
itself knows; and a stand-in NVML whose answers the test sets.
"""
from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.cluster.topo_parser import load_topology, parse_topology
from hccc.util.diagnostics import CompileError, SourceFile

DUMPS = Path(__file__).resolve().parent / "topo_dumps"
NCCL = sorted(p.name for p in DUMPS.glob("*.xml"))
SMI = sorted(p.name for p in DUMPS.glob("*_smi.txt"))
GB = 10**9
GEN4_X16 = Fraction("1.969") * 16          # 31.504 GB/s
GEN3_X16 = Fraction("0.985") * 16          # 15.76 GB/s


def links(topo) -> dict[tuple[int, int, str], tuple[Fraction, int]]:
    """(src, dst, class) -> (GB/s per lane, lanes) of every link of a parsed cluster."""
    out = {}
    for ln in topo.links():
        key = (ln.src, ln.dst, ln.cls)
        assert key not in out
        out[key] = (Fraction(ln.bandwidth).limit_denominator(10**6) / GB, ln.lanes)
    return out


def imported(tmp_path, capsys, *argv) -> tuple[Path, dict]:
    """Import with -o, then summarise the written file with plain ``hccc topo --json``."""
    out = tmp_path / "imported.topo"
    assert main(["topo", *argv, "-o", str(out), "--json"]) == 0, capsys.readouterr().err
    rep_import = json.loads(capsys.readouterr().out)
    assert main(["topo", str(out), "--json"]) == 0
    rep_file = json.loads(capsys.readouterr().out)
    assert rep_import == rep_file           # what the import reports is what hccc topo reads back
    return out, rep_file


def full_mesh(n: int, cls: str, gbps, lanes: int, offset: int = 0) -> dict:
    return {(offset + a, offset + b, cls): (Fraction(gbps), lanes) for a in range(n) for b in range(n) if a != b}


# ---------------------------------------------------------------------------------------------
# NCCL dumps: every fixture, against the hardware it describes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NCCL)
def test_every_nccl_dump_imports_and_round_trips(tmp_path, capsys, name):
    out, rep = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / name))
    text = out.read_text()
    assert text.startswith("# imported by hccc topo from NCCL topology dump")
    # the printed text (no -o) is the written one, and parsing it twice gives one model
    assert main(["topo", "--from-nccl", str(DUMPS / name)]) == 0
    assert capsys.readouterr().out == text
    a, b = parse_topology(text, "a.topo"), load_topology(out)
    assert links(a) == links(b) and a.nranks == b.nranks == rep["nranks"]


def test_dgx_a100_dump_is_an_nvswitch_fabric_with_a_nic_per_gpu(tmp_path, capsys):
    """DGX A100: each GPU has 6 x 2 NVLinks to the 6 NVSwitches = 12 links of 25 GB/s (600 GB/s
    bidirectional); each GPU is nearest to one 200 Gbit/s HDR port of its PCIe switch tree."""
    out, rep = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "dgx_a100.xml"))
    topo = load_topology(out)
    assert links(topo) == full_mesh(8, "switch", 25, 12)
    assert rep["nodes"][0]["model"] == "A100-SXM4-80GB"
    sw = [g for g in rep["shared_groups"] if g["kind"] == "switch"]
    assert len(sw) == 16 and all(g["capacity_gbps"] == 300 for g in sw)   # 12 x 25 GB/s each way per GPU
    assert "define nic = [((0) -> (25,1)), ((1) -> (25,1))" in out.read_text()


def test_two_dgx_h100_dumps_are_two_nodes_joined_by_their_nics(tmp_path, capsys):
    """DGX H100: 18 NVLinks (5+4+4+5 to the 4 NVSwitches) of 25 GB/s per GPU, one 400 Gbit/s
    (50 GB/s) ConnectX-7 per GPU; two dumps, two nodes, every cross-node pair on the NICs."""
    out, rep = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "dgx_h100_node0.xml"),
                        str(DUMPS / "dgx_h100_node1.xml"))
    topo = load_topology(out)
    want = full_mesh(8, "switch", 25, 18) | full_mesh(8, "switch", 25, 18, offset=8)
    for a in range(8):
        for b in range(8, 16):
            want[(a, b, "nic")] = want[(b, a, "nic")] = (Fraction(50), 1)
    assert links(topo) == want
    assert rep["nnodes"] == 2 and [n["ngpus"] for n in rep["nodes"]] == [8, 8]
    assert rep["nodes"][1]["model"] == "H100-SXM5-80GB"


def test_pcie_only_box_gets_pcie_links_and_its_two_switches(tmp_path, capsys):
    """4 x L40S (no NVLink) behind two Gen4 x16 PCIe switches, one 100 GbE port: every pair over
    PCIe at 31.504 GB/s; the pairs of one switch share its uplink; all four GPUs share the NIC."""
    out, rep = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "pcie_4gpu.xml"))
    topo = load_topology(out)
    assert links(topo) == full_mesh(4, "switch", GEN4_X16, 1)
    text = out.read_text()
    assert "define pcie = [((0,1) -> (31.504,1)), ((2,3) -> (31.504,1))]" in text
    assert "define nic = [((0,1,2,3) -> (12.5,1))]" in text
    pcie = [g for g in rep["shared_groups"] if g["kind"] == "pcie"]
    assert len(pcie) == 4 and all(g["capacity_gbps"] == pytest.approx(31.504) for g in pcie)


def test_nvlink_bridges_and_a_socket_crossing_with_two_nics(tmp_path, capsys):
    """4 x A100 PCIe on two AMD EPYC 7763 sockets (Zen 3, family 0x19): NVLink bridges (12 links)
    join 0-1 and 2-3; the other pairs cross Infinity Fabric (NCCL's 24 GB/s for Zen 3-4, below the
    GPUs' 31.504); one NIC per socket."""
    out, _ = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "two_nics.xml"))
    want = {}
    for a, b in ((0, 1), (2, 3)):
        want[(a, b, "direct")] = want[(b, a, "direct")] = (Fraction(25), 12)
    for a in (0, 1):
        for b in (2, 3):
            want[(a, b, "switch")] = want[(b, a, "switch")] = (Fraction(24), 1)
    assert links(load_topology(out)) == want
    assert "define nic = [((0,1) -> (25,1)), ((2,3) -> (25,1))]" in out.read_text()


def test_nccl_and_smi_descriptions_of_one_dgx_a100_agree(tmp_path, capsys):
    """Two tools, one machine: the same links and the same NIC per GPU."""
    a, _ = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "dgx_a100.xml"))
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    b, _ = imported(b_dir, capsys, "--from-smi", str(DUMPS / "dgx_a100_smi.txt"))
    ta, tb = load_topology(a), load_topology(b)
    assert links(ta) == links(tb)
    nic_lines = [ln for ln in a.read_text().splitlines() if "define nic" in ln or ln.startswith("    ((4)")]
    assert nic_lines == [ln for ln in b.read_text().splitlines() if "define nic" in ln or ln.startswith("    ((4)")]


# ---------------------------------------------------------------------------------------------
# nvidia-smi topo -m
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SMI)
def test_every_smi_file_imports_and_round_trips(tmp_path, capsys, name):
    out, _ = imported(tmp_path, capsys, "--from-smi", str(DUMPS / name))
    assert out.read_text().startswith("# imported by hccc topo from nvidia-smi topo -m")


def test_smi_pcie_box_old_driver_format(tmp_path, capsys):
    """SOC (old SYS), NIC columns named mlx5_0, an underlined header: PIX pairs at the assumed Gen3
    x16 (15.76 GB/s), pairs across the sockets at the inter-socket figure (10 GB/s)."""
    out, _ = imported(tmp_path, capsys, "--from-smi", str(DUMPS / "pcie_4gpu_smi.txt"))
    want = {}
    for a in range(4):
        for b in range(4):
            if a != b:
                want[(a, b, "switch")] = (GEN3_X16 if a // 2 == b // 2 else Fraction(10), 1)
    assert links(load_topology(out)) == want
    text = out.read_text()
    assert "PCIe generation unknown: Gen3 x16 assumed" in text and "NVLink taken" not in text


def test_smi_nvlink_mesh_with_model_and_nic_speed_options(tmp_path, capsys):
    """HGX A100 4-GPU: NV4 to every peer (12 links per GPU: a mesh, not a switch), --gpu says A100
    (Gen4), --nic-gbit 100 makes each port 12.5 GB/s; each GPU pair uses the port of its switch."""
    out, _ = imported(tmp_path, capsys, "--from-smi", str(DUMPS / "hgx_a100_4gpu_smi.txt"), "--gpu", "A100",
                      "--nic-gbit", "100")
    assert links(load_topology(out)) == full_mesh(4, "direct", 25, 4)
    text = out.read_text()
    assert "define gpu = A100" in text and "define nic = [((0,1) -> (12.5,1)), ((2,3) -> (12.5,1))]" in text
    assert "define pcie = [((0) -> (31.504,1))" in text


def _smi_text(nv: list[list[int]], rel: list[list[str]]) -> str:
    n = len(nv)
    rows = ["\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity"]
    for a in range(n):
        cells = [" X " if a == b else (f"NV{nv[a][b]}" if nv[a][b] else rel[a][b]) for b in range(n)]
        rows.append(f"GPU{a}\t" + "\t".join(cells) + "\t0-63\t0")
    return "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\n" + "\n".join(rows) + "\n"


@settings(max_examples=40)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.sampled_from(["NV1", "NV2", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]),
                         min_size=n * (n - 1) // 2, max_size=n * (n - 1) // 2))))
def test_smi_matrix_links_are_the_matrix(case):
    """A random symmetric matrix of an H100 box (sm 90: 18 NVLinks, PCIe Gen5 x16 = 63.008 GB/s)
    whose NVLink counts stay within 18 per GPU: NV# pairs are direct links of # lanes, PCIe pairs
    switch links at the GPU's link, SYS pairs at the inter-socket 10 GB/s."""
    n, cells = case
    nv = [[0] * n for _ in range(n)]
    rel = [["PIX"] * n for _ in range(n)]
    it = iter(cells)
    for a in range(n):
        for b in range(a + 1, n):
            c = next(it)
            if c.startswith("NV") and sum(nv[a]) + int(c[2:]) <= 18 and sum(nv[b]) + int(c[2:]) <= 18:
                nv[a][b] = nv[b][a] = int(c[2:])
            else:
                rel[a][b] = rel[b][a] = c if not c.startswith("NV") else "PHB"
    from hccc.compiler.cluster.import_smi import read_smi_topo
    from hccc.compiler.cluster.machine import write_topology
    node = read_smi_topo(SourceFile("m.txt", _smi_text(nv, rel)))
    _, topo = write_topology([node], "t")
    want = {}
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            if nv[a][b]:
                want[(a, b, "direct")] = (Fraction(25), nv[a][b])
            else:
                want[(a, b, "switch")] = (Fraction(10) if rel[a][b] == "SYS" else Fraction("3.938") * 16, 1)
    assert links(topo) == want


# ---------------------------------------------------------------------------------------------
# NVML through a stand-in
# ---------------------------------------------------------------------------------------------
class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Answers the pynvml calls detect() makes, from a description the test writes."""

    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    class _Pci:
        def __init__(self, bus):
            self.busId = bus

    def __init__(self, names, busids, links, levels, gen=4, width=16, cc=(8, 0), fail_init=None, remote_types=True):
        self.names, self.busids, self.links, self.levels = names, busids, links, levels
        self.gen, self.width, self.cc, self.fail_init = gen, width, cc, fail_init
        self.shutdown = False
        if not remote_types:
            self.nvmlDeviceGetNvLinkRemoteDeviceType = None

    def nvmlInit(self):
        if self.fail_init:
            raise FakeNVMLError(self.fail_init)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()          # old bindings return bytes

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.cc

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.width

    def nvmlDeviceGetPciInfo(self, h):
        return self._Pci(self.busids[h])

    def _link(self, h, link):
        if link >= len(self.links[h]):
            raise FakeNVMLError("Not Supported")
        return self.links[h][link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._link(h, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return self._Pci(self._link(h, link)[1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self._link(h, link)[2]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        if self.levels[a][b] is None:
            raise FakeNVMLError("Not Supported")
        return self.levels[a][b]


def _bus(i):
    return f"00000000:{0x10 + i:02X}:00.0"


def test_detect_nvswitch_machine_through_fake_nvml():
    """8 GPUs, 12 links each to NVSwitches (remote type 2), one link down on GPU 5: the fabric is
    modelled at 11 ports and the file says so; NVML's levels 10/20/50 are PIX, PXB, SYS."""
    from hccc.compiler.cluster.detect import detect
    from hccc.compiler.cluster.machine import write_topology
    links_ = [[(1, "00000000:C4:00.0", 2)] * 12 for _ in range(8)]
    links_[5] = [(1, "00000000:C4:00.0", 2)] * 11 + [(0, "00000000:C4:00.0", 2)]
    levels = [[0 if a == b else 10 if a // 2 == b // 2 else 20 if a // 4 == b // 4 else 50 for b in range(8)]
              for a in range(8)]
    fake = FakeNVML(["NVIDIA A100-SXM4-80GB"] * 8, [_bus(i) for i in range(8)], links_, levels)
    node = detect(fake)
    assert fake.shutdown
    text, topo = write_topology([node], "t")
    assert links(topo) == full_mesh(8, "switch", 25, 11)
    assert "GPU 5: 11" in text and "modelled at 11 per GPU" in text
    assert "define gpu = A100-SXM4-80GB" in text and "NVML knows no NICs" in text


def test_detect_nvlink_pairs_and_pcie_without_remote_types():
    """Older NVML without remote device types: links to another GPU's bus id are direct NVLinks,
    the rest are PCIe (Gen3 x8 here: 7.88 GB/s), the SYS pair capped at 10 GB/s."""
    from hccc.compiler.cluster.detect import detect
    from hccc.compiler.cluster.machine import write_topology
    links_ = [[(1, _bus(1), 0)] * 2, [(1, _bus(0), 0)] * 2, [], []]
    levels = [[0, 10, 30, 50], [10, 0, 30, 50], [30, 30, 0, 50], [50, 50, 50, 0]]
    fake = FakeNVML(["Tesla V100-PCIE-16GB"] * 4, [_bus(i) for i in range(4)], links_, levels, gen=3, width=8,
                    cc=(7, 0), remote_types=False)
    _, topo = write_topology([detect(fake)], "t")
    x8 = Fraction("0.985") * 8
    want = {(0, 1, "direct"): (Fraction(25), 2), (1, 0, "direct"): (Fraction(25), 2)}
    for a, b in ((0, 2), (1, 2)):
        want[(a, b, "switch")] = want[(b, a, "switch")] = (x8, 1)
    for a in (0, 1, 2):
        want[(a, 3, "switch")] = want[(3, a, "switch")] = (x8 if x8 < 10 else Fraction(10), 1)
    assert links(topo) == want


@pytest.mark.parametrize("fake, message", [
    (FakeNVML([], [], [], [], ), "NVML sees no GPU on this machine"),
    (FakeNVML(["x"], [_bus(0)], [[]], [[0]], fail_init="Driver Not Loaded"),
     "NVML cannot start: Driver Not Loaded (no NVIDIA driver on this machine?)"),
])
def test_detect_errors_are_one_line(fake, message):
    from hccc.compiler.cluster.detect import DetectError, detect
    with pytest.raises(DetectError) as exc:
        detect(fake)
    assert exc.value.diagnostics[0].message == message


def test_detect_without_pynvml_exits_1_with_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)       # import pynvml raises ImportError
    assert main(["topo", "--detect"]) == 1
    cap = capsys.readouterr()
    assert cap.err.strip().count("\n") == 0 and "pip install 'hccc[detect]'" in cap.err and cap.out == ""


def test_detect_command_with_a_fake_module(monkeypatch, tmp_path, capsys):
    levels = [[0, 20], [20, 0]]
    fake = FakeNVML(["NVIDIA H100 PCIe"] * 2, [_bus(0), _bus(1)], [[(1, _bus(1), 0)] * 12, [(1, _bus(0), 0)] * 12],
                    levels, gen=5, cc=(9, 0))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = tmp_path / "here.topo"
    assert main(["topo", "--detect", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert links(load_topology(out)) == full_mesh(2, "direct", 25, 12)


# ---------------------------------------------------------------------------------------------
# synthesis accepts what the importers write
# ---------------------------------------------------------------------------------------------
def test_synth_accepts_an_imported_cluster(tmp_path, capsys):
    topo, _ = imported(tmp_path, capsys, "--from-nccl", str(DUMPS / "two_nics.xml"))
    prog = tmp_path / "ag.rccl"
    assert main(["synth", str(topo), "--collective", "allgather", "-o", str(prog), "--time-limit", "1"]) == 0
    capsys.readouterr()
    assert main(["check", str(prog), "--topology", str(topo)]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--from-nccl", str(DUMPS / n)] for n in ("dgx_a100.xml", "pcie_4gpu.xml")]
                         + [["--from-nccl", str(DUMPS / "dgx_h100_node0.xml"), str(DUMPS / "dgx_h100_node1.xml")]]
                         + [["--from-smi", str(DUMPS / n)] for n in SMI])
def test_synth_accepts_every_imported_fixture(tmp_path, capsys, argv):
    topo, _ = imported(tmp_path, capsys, *argv)
    prog = tmp_path / "ar.rccl"
    assert main(["synth", str(topo), "--collective", "allreduce", "-o", str(prog), "--time-limit", "10"]) == 0
    capsys.readouterr()
    assert main(["check", str(prog), "--topology", str(topo)]) == 0


# ---------------------------------------------------------------------------------------------
# bad inputs: located, exit 1, no traceback, nothing written
# ---------------------------------------------------------------------------------------------
H100 = (DUMPS / "dgx_h100_node0.xml").read_text()

BAD_XML = [
    ("<system version=\"1\">\n  <cpu>\n</system>\n", "3:3", "malformed XML: mismatched tag"),
    ("<?xml version=\"1.0\"?>\n<!DOCTYPE system [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;\">]>\n"
     "<system version=\"1\">&b;</system>\n", "2:1", "DOCTYPE declarations are not accepted"),
    ("<algo name=\"x\"/>\n", "1:1", "is not an NCCL topology dump"),
    (H100.replace("<nic>", "<nic>\n<fancy/>", 1), None, "unexpected <fancy> inside <nic>"),
    (H100.replace("<gpu ", "<gpu>text</gpu><gpu ", 1), None, "unexpected text 'text'"),
    (H100.replace(' sm="90"', ' sm="nine"', 1), None, 'sm="nine" is not an integer'),
    (H100.replace('target="0000:05:00.0" count="5" tclass="0x068000"', 'target="zz" count="5" tclass="0x030200"', 1),
     None, 'target="zz" is not a PCI bus id'),
    (H100.replace('tclass="0x068000"', 'tclass="0x010000"', 1), None, "is not a GPU of this dump"),
    (H100.replace('vendor="0x10de" device="0x2330"', 'vendor="0x1002" device="0x740c"', 1), None,
     "only NVIDIA GPUs"),
    (H100.replace(' speed="400000"', '', 1), None, "<net> lacks the attribute speed"),
    (H100.replace('<nvlink target="0000:05:00.0"', '<xgmi target="0000:05:00.0"', 1), None, "<xgmi> is RCCL's"),
    ("<system version=\"1\"><cpu/></system>\n", "1:1", "the dump lists no <gpu>"),
    ("", "1:1", "malformed XML: no element found"),
    ("\n  GPU 0: NVIDIA A100\n", "2:3", "not XML: NCCL's topology dump begins with <system>"),
    ("<system version=\"1\"/><system version=\"1\"/>", "1:22", "junk after document element"),
    ("<system version=\"1\"><cpu>" + "<pci>" * 70, None, "nested more than 64 deep"),
]


@pytest.mark.parametrize("text, where, message", BAD_XML, ids=[m for _, _, m in BAD_XML])
def test_bad_nccl_dumps_are_located_errors(tmp_path, capsys, text, where, message):
    dump = tmp_path / "bad.xml"
    dump.write_text(text)
    out = tmp_path / "c.topo"
    assert main(["topo", "--from-nccl", str(dump), "-o", str(out)]) == 1
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and message in cap.err and cap.out == ""
    first = cap.err.splitlines()[0]
    assert first.startswith(f"{dump}:{where + ':' if where else ''}") and ": error: " in first
    assert not out.exists() and list(tmp_path.iterdir()) == [dump]


def test_a_bad_dump_in_a_process_of_its_own(tmp_path):
    """The real command line: exit status 1, the located message, no traceback."""
    dump = tmp_path / "bad.xml"
    dump.write_text(H100.replace("<nic>", "<nic>\n<fancy/>", 1))
    r = subprocess.run([sys.executable, "-m", "hccc.cli", "topo", "--from-nccl", str(dump)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.startswith(f"{dump}:") and "unexpected <fancy> inside <nic>" in r.stderr


def test_entity_expansion_is_refused_before_it_grows(tmp_path, capsys):
    """A billion-laughs document is refused at its DOCTYPE, without expanding anything."""
    ents = "".join(f'<!ENTITY e{i} "{"&e%d;" % (i - 1) * 10 if i else "lol"}">' for i in range(10))
    dump = tmp_path / "bomb.xml"
    dump.write_text(f"<!DOCTYPE system [{ents}]>\n<system version=\"1\">&e9;</system>\n")
    assert main(["topo", "--from-nccl", str(dump)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{dump}:1:1: error: DOCTYPE declarations are not accepted")


def test_too_big_and_binary_inputs_are_refused(tmp_path, capsys, monkeypatch):
    big = tmp_path / "big.xml"
    big.write_text(H100 + " " * 5000)
    monkeypatch.setenv("HCCC_MAX_INPUT_BYTES", "4K")
    assert main(["topo", "--from-nccl", str(big)]) == 1
    assert "big.xml" in capsys.readouterr().err
    monkeypatch.delenv("HCCC_MAX_INPUT_BYTES")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\tGPU0\x00")
    assert main(["topo", "--from-smi", str(binary)]) == 1
    assert f"{binary}:1:6: error: file contains a NUL byte" in capsys.readouterr().err


def test_too_many_elements_are_refused(tmp_path, monkeypatch, capsys):
    from hccc.compiler.cluster import import_nccl
    monkeypatch.setattr(import_nccl, "MAX_ELEMENTS", 50)
    with pytest.raises(CompileError) as exc:
        import_nccl.read_nccl_dump(SourceFile("h.xml", H100))
    assert "more than 50 elements" in exc.value.diagnostics[0].message


SMI_A100 = (DUMPS / "hgx_a100_4gpu_smi.txt").read_text()

BAD_SMI = [
    ("hello\n", "1:1", "no matrix header"),
    (H100, "1:1", "this is XML, not the output of nvidia-smi topo -m"),
    (SMI_A100.replace("NV4", "NVX", 1), None, "'NVX' is not a link kind nvidia-smi writes"),
    (SMI_A100.replace("NV4", "PIX", 1), None, "the matrix is not symmetric"),
    ("\n".join(ln for ln in SMI_A100.splitlines() if not ln.startswith("GPU2")), None, "the matrix has no row for GPU2"),
    (SMI_A100.replace("GPU1\tNV4\t X \tNV4\tNV4", "GPU1\tNV4\t X ", 1), None, "row GPU1 has"),
    (SMI_A100.replace("\tGPU0\tGPU1", "\tGPU0\tGPU2", 1), None, "column GPU2 appears twice"),
    (SMI_A100.replace("\tGPU0\tGPU1\tGPU2", "\tGPU0\tGPU2\tGPU1", 1), None, "not GPU0, GPU1, ... in order"),
]


@pytest.mark.parametrize("text, where, message", BAD_SMI, ids=[m for _, _, m in BAD_SMI])
def test_bad_smi_files_are_located_errors(tmp_path, capsys, text, where, message):
    f = tmp_path / "m.txt"
    f.write_text(text)
    assert main(["topo", "--from-smi", str(f), "-o", str(tmp_path / "c.topo")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith(f"{f}:{where + ':' if where else ''}") and ": error: " in err.splitlines()[0]
    assert not (tmp_path / "c.topo").exists()


def test_a_node_without_nic_cannot_join_a_cluster(tmp_path, capsys):
    no_nic = tmp_path / "no_nic.xml"
    text = (DUMPS / "two_nics.xml").read_text()
    import re
    no_nic.write_text(re.sub(r"\s*<pci busid=\"0000:[3b]1:00.0\".*?</pci>", "", text, flags=re.S))
    assert main(["topo", "--from-nccl", str(DUMPS / "two_nics.xml"), str(no_nic)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hccc: error: no_nic.xml: GPU 0 has no NIC") and err.count("\n") == 1


def test_output_never_replaces_an_input_and_usage_errors(tmp_path, capsys):
    dump = tmp_path / "d.xml"
    dump.write_text((DUMPS / "pcie_4gpu.xml").read_text())
    assert main(["topo", "--from-nccl", str(dump), "-o", str(dump)]) == 1
    assert "is the input" in capsys.readouterr().err and dump.read_text() == (DUMPS / "pcie_4gpu.xml").read_text()
    for argv in (["topo"], ["topo", "x.topo", "--from-nccl", str(dump)], ["topo", "x.topo", "-o", "y.topo"],
                 ["topo", "--from-nccl", str(dump), "--gpu", "A100"], ["topo", "--from-nccl", str(dump), "--detect"],
                 ["topo", "--from-smi", str(dump), "--nic-gbit", "fast"], ["topo", "--from-nccl", str(dump), "--plot", "x.png"],
                 ["topo", "--from-smi", str(dump), "--nic-gbit", "0"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "usage:" in err and "Traceback" not in err


def test_link_speed_tables_are_consistent():
    """Each table's own arithmetic: the NVLink figure per link times the link count is the
    generation's bidirectional total halved; PCIe x16 at 8 GT/s is 15.76 GB/s."""
    from hccc.compiler.cluster import link_speeds as s
    totals = {60: 160, 70: 300, 80: 600, 86: Fraction("112.5"), 90: 900, 100: 1800}   # GB/s bidirectional
    for sm, total in totals.items():
        assert s.NVLINK_GBPS_BY_SM[sm] * s.NVLINKS_PER_GPU_BY_SM[sm] * 2 == total
    assert s.pcie_gbps("8", 16) == Fraction("15.76") and s.nvlink_gbps(89) == s.nvlink_gbps(86)
    assert s.model_key("NVIDIA A100-SXM4-80GB") == "A100" and s.model_key("NVIDIA H200") == "H200"
    assert s.model_key("NVIDIA L40S") == "L40S" and s.model_key("NVIDIA GH200 480GB") == "GH200"


# ---------------------------------------------------------------------------------------------
# random PCIe trees: every pair's bandwidth is its path's slowest hop
# ---------------------------------------------------------------------------------------------
#: PCIe GB/s per lane after line coding, typed in from PCI-SIG's published table
SPEC_LANE = {"2.5 GT/s": Fraction("0.25"), "5.0 GT/s PCIe": Fraction("0.5"), "8 GT/s": Fraction("0.985"),
             "16.0 GT/s PCIe": Fraction("1.969"), "32.0 GT/s PCIe": Fraction("3.938")}

_link = st.tuples(st.sampled_from(sorted(SPEC_LANE)), st.sampled_from([4, 8, 16]))
_tree = st.recursive(st.builds(lambda l: ("gpu", l), _link),
                     lambda kids: st.builds(lambda l, k: ("sw", l, k), _link, st.lists(kids, min_size=1, max_size=3)),
                     max_leaves=6)


def _render(trees_per_cpu) -> tuple[str, list[list[tuple]]]:
    """The dump's XML, and each GPU's path upward as (element id, link GB/s) up to its CPU, then
    ("cpu", index); GPUs in document order (rank = order)."""
    paths, lines, bus = [], ['<system version="1">'], [0]

    def emit(node, up, depth):
        bus[0] += 1
        me = f"0000:{bus[0]:02x}:00.0"
        speed, width = node[1]
        gbps = SPEC_LANE[speed] * width
        cls = "0x030200" if node[0] == "gpu" else "0x060400"
        pad = "  " * depth
        lines.append(f'{pad}<pci busid="{me}" class="{cls}" vendor="0x10de" device="0x2330" '
                     f'link_speed="{speed}" link_width="{width}">')
        here = [(me, gbps)] + up
        if node[0] == "gpu":
            lines.append(f'{pad}  <gpu dev="{len(paths)}" sm="90" rank="{len(paths)}" gdr="1"/>')
            paths.append(here)
        else:
            for kid in node[2]:
                emit(kid, here, depth + 1)
        lines.append(f"{pad}</pci>")

    for c, trees in enumerate(trees_per_cpu):
        lines.append(f'  <cpu numaid="{c}" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">')
        for t in trees:
            emit(t, [("cpu", c)], 2)
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n", paths


@settings(max_examples=60)
@given(st.lists(st.lists(_tree, min_size=1, max_size=3), min_size=1, max_size=2))
def test_random_pcie_trees_pair_bandwidth_is_the_slowest_hop(trees_per_cpu):
    from hccc.compiler.cluster.import_nccl import read_nccl_dump
    text, paths = _render(trees_per_cpu)
    if not 2 <= len(paths) <= 8:
        return
    node = read_nccl_dump(SourceFile("r.xml", text))
    upi = Fraction(22)       # NCCL's figure for Sapphire Rapids' UPI (family 6, model 143 = 0x8F)
    for a in range(len(paths)):
        for b in range(a + 1, len(paths)):
            pa, pb = paths[a], paths[b]
            ids_b = [x[0] for x in pb]
            k = next((i for i, x in enumerate(pa) if x[0] in ids_b and x[0] != "cpu"), None)
            if k is not None:                                  # a shared PCIe switch
                want = min(x[1] for x in pa[:k] + pb[:ids_b.index(pa[k][0])])
            else:
                want = min(x[1] for x in pa[:-1] + pb[:-1])
                if pa[-1] != pb[-1]:                           # different CPU sockets
                    want = min(want, upi)
            assert node.pcie[(a, b)] == want, (a, b)
    # every GPU is in exactly one PCIe group, whose uplink is the top element under its CPU
    members = sorted(g for gpus, _, _ in node.pcie_groups for g in gpus)
    assert members == list(range(len(paths)))
    for gpus, bw, _ in node.pcie_groups:
        assert {paths[g][-2] for g in gpus} == {paths[gpus[0]][-2]} and bw == paths[gpus[0]][-2][1]


def test_two_smi_files_are_two_nodes(tmp_path, capsys):
    out, rep = imported(tmp_path, capsys, "--from-smi", str(DUMPS / "hgx_a100_4gpu_smi.txt"),
                        str(DUMPS / "hgx_a100_4gpu_smi.txt"), "--gpu", "A100")
    assert rep["nnodes"] == 2 and rep["nranks"] == 8
    topo = load_topology(out)
    assert sum(1 for ln in topo.links() if ln.cls == "nic") == 2 * 4 * 4
    assert all(ln.bandwidth == 25 * GB for ln in topo.links() if ln.cls == "nic")


def test_what_is_left_out_or_assumed_is_said_in_the_file(tmp_path, capsys):
    """GPU 1 lists 11 NVLinks back to GPU 0's 12 (one down): the pair gets 11; a C2C link and an
    NVLink to a CPU are noted, not modelled; an unreadable link speed is read as Gen3 (NCCL's
    fallback) and said."""
    text = (DUMPS / "two_nics.xml").read_text()
    text = text.replace('<nvlink target="0000:21:00.0" count="12"', '<nvlink target="0000:21:00.0" count="11"', 1)
    text = text.replace('<gpu dev="2" sm="80" rank="2" gdr="1">',
                        '<gpu dev="2" sm="80" rank="2" gdr="1">\n<c2c bw="40000" count="10"/>\n'
                        '<nvlink target="0000:00:00.0" count="2" tclass="0x068001"/>', 1)
    text = text.replace('busid="0000:a1:00.0" class="0x030200" vendor="0x10de" device="0x20f1" '
                        'subsystem_vendor="0x10de" subsystem_device="0x1463" link_speed="16.0 GT/s PCIe"',
                        'busid="0000:a1:00.0" class="0x030200" vendor="0x10de" device="0x20f1" '
                        'subsystem_vendor="0x10de" subsystem_device="0x1463" link_speed="weird"', 1)
    dump = tmp_path / "d.xml"
    dump.write_text(text)
    out, _ = imported(tmp_path, capsys, "--from-nccl", str(dump))
    written = out.read_text()
    assert "GPUs 0 and 1 list 12 and 11 NVLinks to each other: the fewer taken" in written
    assert "C2C link to its CPU is not modelled" in written and "2 NVLinks to its CPU are not modelled" in written
    assert 'link_speed "weird" read as 8 GT/s (PCIe Gen3)' in written
    got = links(load_topology(out))
    assert got[(0, 1, "direct")] == got[(1, 0, "direct")] == (Fraction(25), 11)
    assert got[(2, 0, "switch")] == (GEN3_X16, 1)       # 15.76, below the sockets' 24


def test_a_node_with_too_many_pcie_pairs_is_refused_before_the_work(monkeypatch, capsys):
    """4 GPUs on PCIe only: 6 pairs, 12 links; with room for 10 the node is refused, by name, before
    any path is worked out (a large node's pairs grow with the square of its GPUs)."""
    from hccc.compiler.cluster import import_nccl, machine
    monkeypatch.setattr(machine, "MAX_PAIR_LINKS", 10)
    walked = []
    ancestors = import_nccl._ancestors
    monkeypatch.setattr(import_nccl, "_ancestors", lambda el: walked.append(el) or ancestors(el))
    assert main(["topo", "--from-nccl", str(DUMPS / "pcie_4gpu.xml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hccc: error: pcie_4gpu.xml: 4 GPUs with 6 pairs outside an NVSwitch fabric would "
                          "need 12 links, over the 10") and not walked
    assert main(["topo", "--from-nccl", str(DUMPS / "dgx_a100.xml")]) == 0    # a fabric's pairs need none
    capsys.readouterr()


def test_detect_when_nvml_does_not_say_a_pcie_path():
    """A VM whose NVML answers no common ancestor: the pair is taken as SYS (the inter-socket
    figure caps it) and the file says so."""
    from hccc.compiler.cluster.detect import detect
    from hccc.compiler.cluster.machine import write_topology
    fake = FakeNVML(["NVIDIA L4"] * 2, [_bus(0), _bus(1)], [[], []], [[0, None], [None, 0]], gen=4, cc=(8, 9))
    text, topo = write_topology([detect(fake)], "t")
    assert links(topo) == full_mesh(2, "switch", 10, 1)
    assert "NVML did not say the PCIe path of 1 GPU pairs: taken as SYS" in text


@pytest.mark.parametrize("vendor, family, model, gbps", [
    ("GenuineIntel", 6, 0x4F, 6), ("GenuineIntel", 6, 0x55, 10), ("GenuineIntel", 6, 0x6A, 10),
    ("GenuineIntel", 6, 0x8F, 22), ("GenuineIntel", 6, 0xCF, 40), ("AuthenticAMD", 0x17, 0x31, 16),
    ("AuthenticAMD", 0x19, 0x01, 24), ("AuthenticAMD", 0x1A, 0x02, 32), ("", None, None, 10),
])
def test_inter_socket_figures_follow_the_cpu_as_nccl_reads_it(vendor, family, model, gbps):
    """Broadwell 6, Skylake/Ice Lake 10, Sapphire Rapids 22, Emerald Rapids 40; AMD Zen 1-2 16,
    Zen 3-4 24, Zen 5 32 (NCCL's src/graph/topo.h); a CPU the input does not name: 10."""
    from hccc.compiler.cluster.link_speeds import inter_socket_gbps
    assert inter_socket_gbps(vendor, "x86_64", family, model)[0] == gbps


def test_detect_topology_for_callers(monkeypatch):
    """The Python entry a backend uses: the .topo text and the parsed Topology of this machine."""
    from hccc.compiler.cluster.detect import detect_topology
    fake = FakeNVML(["NVIDIA A100-SXM4-80GB"] * 2, [_bus(0), _bus(1)], [[(1, _bus(1), 0)] * 4, [(1, _bus(0), 0)] * 4],
                    [[0, 10], [10, 0]])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    text, topo = detect_topology()
    assert text.startswith("# detected by hccc through NVML") and topo.nranks == 2
    assert links(topo) == full_mesh(2, "direct", 25, 4)


def test_fixtures_are_what_their_generator_writes():
    """tests/topo_dumps/generate.py writes every fixture; a hand edit of one (or of the generator
    alone) is caught here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("topo_dumps_generate", DUMPS / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.files()
    assert sorted(written) == sorted(NCCL + SMI)
    for name, text in written.items():
        assert (DUMPS / name).read_text() == text, name
