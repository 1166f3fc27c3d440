"""Compiling and checking against a cluster: ``--topology`` on ``hccc ALGO`` and ``hccc check``.

Oracles: brute-force link sets from ``Topology.links()``, hand-counted rank/vendor layouts, hashlib.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from cli_runs import run_cli
from hccc.compiler.frontend.algorithm import Algorithm, Collective, Header
from hccc.util.diagnostics import CompileError
from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.frontend.generators import (direct_allgather_rccl, hm_allreduce_rccl, ring_allgather_rccl,
                                      ring_allreduce_rccl)
from hccc.compiler.pipeline import (ClusterSource, CompileOptions, compile_algorithm, load_algorithm,
                                    platforms_for, read_cluster)
from hccc.util.dtypes import only_instance_flags
from hccc.compiler.cluster.topology_check import MAX_LISTED, check_on_topology, link_usage

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "examples" / "clusters"

# HeteCCL Appendix A, Fig. 10 (6 GPUs: node1 = 2, node2 = 4), every GPU pair linked
from cluster_texts import FIG10, MIXED_2X2  # noqa: E402

# V100 (4 + 8) without the UPI: the two NVLink islands of node2 (ranks 4-7, 8-11) are not linked
V100_NO_UPI = """\
define nodenum = 2
define node1 = 4
define gpu = V100
define bandwidth = {direct => [%s]}
define nic = [((0,1) -> (8,1)), ((2,3) -> (8,1))]
define node2 = 8
define bandwidth = {direct => [%s]}
define nic = [((0,1) -> (12.5,1)), ((2,3) -> (12.5,1)), ((4,5) -> (12.5,1)), ((6,7) -> (12.5,1))]
define internode = all
define interbandwidth = nic
""" % (", ".join(f"(({a},{b}) -> (25,2))" for a in range(4) for b in range(4) if a != b),
       ", ".join(f"(({a},{b}) -> (25,2))" for isl in ((0, 1, 2, 3), (4, 5, 6, 7)) for a in isl for b in isl
                 if a != b))

# a homogeneous 4-GPU node whose GPUs form a directed ring (0 -> 1 -> 2 -> 3 -> 0)
RING_MESH = """\
define nodenum = 1
define node1 = 4
define bandwidth = {direct => [((0,1) -> (25,1)), ((1,2) -> (25,1)), ((2,3) -> (25,1)), ((3,0) -> (25,1))]}
"""

MIXED_VENDORS = ["nvidia", "nvidia", "amd", "amd", "nvidia", "nvidia", "amd", "amd"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def run_process(*args: str) -> subprocess.CompletedProcess:
    """hccc in a fresh process: output compared across runs must not depend on one process's state."""
    return subprocess.run([sys.executable, "-m", "hccc.cli", *args], capture_output=True, text=True, timeout=600)


def link_set(topo) -> set[tuple[int, int]]:
    return {(l.src, l.dst) for l in topo.links()}


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


# ---------------------------------------------------------------------------------------------
# rank count and links: located errors
# ---------------------------------------------------------------------------------------------
def test_rank_count_mismatch_is_located_at_the_header(tmp_path):
    algo = write(tmp_path, "ring8.rccl", ring_allreduce_rccl(8))
    topo = write(tmp_path, "fig10.topo", FIG10)
    for args in (["check", str(algo), "--topology", str(topo)],
                 [str(algo), "-o", str(tmp_path / "out"), "--topology", str(topo)]):
        p = run_cli(*args)
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert re.search(rf"{re.escape(str(algo))}:1:1: error: the algorithm has nRanks=8 but cluster "
                         r"'fig10.topo' has 6 GPUs \(node1: 2, node2: 4\)", p.stderr), p.stderr
    assert not (tmp_path / "out").exists()


def test_missing_links_are_located_at_the_transfer_with_ranks_nodes_and_loop_values(tmp_path):
    text = direct_allgather_rccl(12)
    algo = write(tmp_path, "direct12.rccl", text)
    topo_path = write(tmp_path, "v100.topo", V100_NO_UPI)
    topo = parse_topology(V100_NO_UPI, str(topo_path))
    links = link_set(topo)
    alg = load_algorithm(algo)
    missing = [(s, d) for s, d in zip(alg.src.tolist(), alg.dst.tolist()) if (s, d) not in links]
    # brute force: the islands {4..7} and {8..11} are the only unlinked pairs, both directions
    assert sorted(set(missing)) == sorted((a, b) for a in range(4, 12) for b in range(4, 12)
                                          if (a < 8) != (b < 8))
    p = run_cli("check", str(algo), "--topology", str(topo_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    tline = line_of(text, "transfer(")
    errs = re.findall(rf"^{re.escape(str(algo))}:(\d+):(\d+): error: (.*)$", p.stderr, re.M)
    assert len(errs) == MAX_LISTED
    assert {int(e[0]) for e in errs} == {tline}
    # the first listed pair is the first missing transfer in program order
    s0, d0 = missing[0]
    first = errs[0][2]
    assert f"rank {s0} (node2 GPU {s0 - 4})" in first and f"rank {d0} (node2 GPU {d0 - 4})" in first
    assert "'v100.topo'" in first
    i0 = next(i for i, sd in enumerate(zip(alg.src.tolist(), alg.dst.tolist())) if sd == (s0, d0))
    assert alg.describe(i0) and first.endswith(alg.describe(i0))
    assert f"{len(missing)} transfers over {len(set(missing))} unconnected rank pairs" in p.stderr
    assert f"{len(set(missing)) - MAX_LISTED} more errors not shown" in p.stderr


def test_missing_link_in_json_mode(tmp_path):
    algo = write(tmp_path, "ag4.rccl", direct_allgather_rccl(4))
    topo = write(tmp_path, "ring.topo", RING_MESH)
    p = run_cli("check", str(algo), "--topology", str(topo), "--json")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["valid"] is False
    assert len(out["errors"]) == 8  # 12 ordered pairs, 4 of them are ring links
    assert all(e["file"] == str(algo) and e["line"] == line_of(direct_allgather_rccl(4), "transfer(")
               for e in out["errors"])


def test_ring_in_the_ring_direction_fits_and_against_it_does_not(tmp_path):
    topo = write(tmp_path, "ring.topo", RING_MESH)
    fwd = write(tmp_path, "fwd.rccl", ring_allgather_rccl(4))
    rev = write(tmp_path, "rev.rccl", ring_allgather_rccl(4, [3, 2, 1, 0]))
    assert run_cli("check", str(fwd), "--topology", str(topo)).returncode == 0
    p = run_cli("check", str(rev), "--topology", str(topo))
    assert p.returncode == 1 and "no link from rank 3 (node1 GPU 3) to rank 2 (node1 GPU 2)" in p.stderr


def _rows_strategy():
    @st.composite
    def case(draw):
        sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        n = sum(sizes)
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
        chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
        # a cluster with exactly the chosen directed links (intra: direct links; inter: internode links)
        offs = np.cumsum([0] + sizes)
        node_of = np.repeat(np.arange(len(sizes)), sizes)
        lines = [f"define nodenum = {len(sizes)}"]
        for k, g in enumerate(sizes):
            lines.append(f"define node{k + 1} = {g}")
            intra = [(a - offs[k], b - offs[k]) for a, b in chosen if node_of[a] == node_of[b] == k]
            if intra:
                lines.append("define bandwidth = {direct => [" + ", ".join(f"(({a},{b}) -> (10,1))"
                                                                          for a, b in intra) + "]}")
        for x in range(len(sizes)):
            for y in range(len(sizes)):
                inter = [(a - offs[x], b - offs[y]) for a, b in chosen if node_of[a] == x and node_of[b] == y]
                if x != y and inter:
                    lines.append(f"define internode = (node{x + 1}, node{y + 1})")
                    lines.append("define interbandwidth = {direct => [" + ", ".join(
                        f"(({a},{b}) -> (5,1))" for a, b in inter) + "]}")
        rows = draw(st.lists(st.tuples(st.sampled_from(pairs), st.integers(0, 3)), max_size=30)) if pairs else []
        return n, "\n".join(lines) + "\n", set(chosen), [(s, d, t, 0, 0) for (s, d), t in rows]
    return case()


@settings(max_examples=60)
@given(_rows_strategy())
def test_check_accepts_exactly_the_linked_transfers(case):
    n, text, chosen, rows = case
    topo = parse_topology(text, "c.topo")
    assert link_set(topo) == chosen
    alg = Algorithm.from_rows(Header(n, Collective.ALLGATHER), rows)
    bad = [(s, d) for s, d, *_ in rows if (s, d) not in chosen]
    if not bad:
        check_on_topology(alg, topo)
        usage = link_usage(alg, topo)
        assert usage["pairs"] == len({(s, d) for s, d, *_ in rows})
        intra = sum(1 for s, d, *_ in rows if topo.rank_node[s] == topo.rank_node[d])
        expect = {"direct": intra, "internode": len(rows) - intra}
        assert usage["transfers_by_class"] == {k: v for k, v in expect.items() if v}
        return
    with pytest.raises(CompileError) as ei:
        check_on_topology(alg, topo)
    distinct = list(dict.fromkeys(bad))  # first-occurrence order
    msgs = [d.message for d in ei.value.diagnostics]
    assert len(msgs) == min(len(distinct), MAX_LISTED)
    assert ei.value.more == max(0, len(distinct) - MAX_LISTED)
    for (s, d), m in zip(distinct, msgs):
        assert m.startswith(f"no link from rank {s} (") and f" to rank {d} (" in m


# ---------------------------------------------------------------------------------------------
# platforms and the manifest
# ---------------------------------------------------------------------------------------------
def test_platforms_for():
    topo = parse_topology(MIXED_2X2, "mixed.topo")
    assert topo.rank_vendor == tuple(MIXED_VENDORS)
    expect = [("cuda",) if v == "nvidia" else ("hip",) for v in MIXED_VENDORS]
    assert platforms_for(8, "auto", topo) == expect
    assert platforms_for(8, "cuda", topo) == [("cuda",)] * 8
    assert platforms_for(8, "hip", topo) == [("hip",)] * 8
    assert platforms_for(8, "all", topo) == [("cuda", "hip") if v == "nvidia" else ("hip", "cuda")
                                             for v in MIXED_VENDORS]
    assert platforms_for(8, "all") == [("cuda", "hip")] * 8
    assert platforms_for(8, "auto") == [("cuda",)] * 8
    with pytest.raises(ValueError):
        platforms_for(6, "auto", topo)


def _compile(tmp_path: Path, algo: Path, topo: Path, out: str, *extra: str) -> dict:
    p = run_process(str(algo), "-o", str(tmp_path / out), "--topology", str(topo), *extra)
    assert p.returncode == 0, p.stderr
    return json.loads((tmp_path / out / "manifest.json").read_text())


@pytest.mark.slow   # compiles for both vendors twice
def test_mixed_vendor_compile_takes_platforms_from_vendors_and_records_the_cluster(tmp_path):
    algo = write(tmp_path, "hm.rccl", hm_allreduce_rccl(4, 2))
    topo = write(tmp_path, "mixed.topo", MIXED_2X2)
    man = _compile(tmp_path, algo, topo, "k")
    plats = [r["platform"] for r in man["ranks"]]
    assert plats == ["cuda" if v == "nvidia" else "hip" for v in MIXED_VENDORS]
    for r in man["ranks"]:
        assert r["source"].endswith(".cu" if r["platform"] == "cuda" else ".hip")
        assert (tmp_path / "k" / r["source"]).is_file()
        assert set(r["sources"]) == {r["platform"]}
    assert set(man["libraries"]) == {"cuda", "hip"}
    t = man["topology"]
    assert t["name"] == "mixed" and t["file"] == "mixed.topo" and t["nranks"] == 8
    assert t["sha256"] == hashlib.sha256(topo.read_bytes()).hexdigest()
    assert t["rank_vendor"] == MIXED_VENDORS
    assert [(n["name"], n["first_rank"], n["ngpus"], n["vendor"], n["model"]) for n in t["nodes"]] == [
        ("node1", 0, 2, "nvidia", "V100"), ("node2", 2, 2, "amd", "W7800"),
        ("node3", 4, 2, "nvidia", None), ("node4", 6, 2, "amd", None)]
    # --target overrides the vendors
    assert {r["platform"] for r in _compile(tmp_path, algo, topo, "c", "--target", "cuda")["ranks"]} == {"cuda"}
    everything = _compile(tmp_path, algo, topo, "a", "--target", "all")
    assert [r["platform"] for r in everything["ranks"]] == plats
    assert all(set(r["sources"]) == {"cuda", "hip"} for r in everything["ranks"])


@pytest.mark.slow   # three full compiles
def test_topology_compile_is_deterministic_and_absent_without_topology(tmp_path):
    algo = write(tmp_path, "hm.rccl", hm_allreduce_rccl(4, 2))
    topo = write(tmp_path, "mixed.topo", MIXED_2X2)
    _compile(tmp_path, algo, topo, "k1")
    _compile(tmp_path, algo, topo, "k2")
    digest = {d: {p.name: p.read_bytes() for p in sorted((tmp_path / d).iterdir())} for d in ("k1", "k2")}
    assert digest["k1"] == digest["k2"]
    p = run_cli(str(algo), "-o", str(tmp_path / "plain"))
    assert p.returncode == 0
    plain = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert "topology" not in plain and {r["platform"] for r in plain["ranks"]} == {"cuda"}


@pytest.mark.parametrize("algo_name,cluster", [
    ("hm_allreduce_4x8.rccl", "a100_topo4.topo"),
    ("hm_allgather_2x8.rccl", "a100_topo2.topo"),
    ("hm_allreduce_4x4.rccl", "mixed_v100_w7800.topo"),
])
def test_examples_fit_their_clusters(tmp_path, algo_name, cluster):
    algo = ROOT / "examples" / algo_name
    p = run_cli("check", str(algo), "--topology", str(CLUSTERS / cluster), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    topo = read_cluster(CLUSTERS / cluster).topology
    alg = load_algorithm(algo)
    # brute force: class of the only link of each used pair
    cls = {}
    for l in topo.links():
        cls.setdefault((l.src, l.dst), set()).add(l.cls)
    assert all(len(v) == 1 for v in cls.values())
    counts: dict[str, int] = {}
    for s, d in zip(alg.src.tolist(), alg.dst.tolist()):
        (c,) = cls[(s, d)]
        counts[c] = counts.get(c, 0) + 1
    assert out["topology"]["transfers_by_class"] == counts
    assert out["topology"]["pairs"] == len(set(zip(alg.src.tolist(), alg.dst.tolist())))
    assert out["topology"]["file"] == cluster


def test_check_text_summary_names_the_cluster(tmp_path, capsys):
    algo = ROOT / "examples" / "hm_allreduce_4x4.rccl"
    assert main(["check", str(algo), "--topology", str(CLUSTERS / "mixed_v100_w7800.topo")]) == 0
    out = capsys.readouterr().out
    assert "valid Allreduce on 16 ranks" in out and "fits cluster mixed_v100_w7800.topo" in out


def test_bad_topology_file_is_a_located_error_and_no_output(tmp_path):
    algo = write(tmp_path, "hm.rccl", hm_allreduce_rccl(4, 2))
    topo = write(tmp_path, "bad.topo", MIXED_2X2.replace("define node3 = 2", "define node3 = 2.5"))
    out = tmp_path / "k"
    p = run_cli(str(algo), "-o", str(out), "--topology", str(topo))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert re.search(rf"{re.escape(str(topo))}:{line_of(MIXED_2X2, 'define node3')}:\d+: error: .*integer", p.stderr)
    assert not out.exists()
    p = run_cli("check", str(algo), "--topology", str(tmp_path / "missing.topo"))
    assert p.returncode == 1 and "cannot read" in p.stderr and "Traceback" not in p.stderr


def test_compile_algorithm_api_and_manifest_extra(tmp_path):
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.passes.build import build_program

    topo_path = write(tmp_path, "mixed.topo", MIXED_2X2)
    cluster = read_cluster(topo_path)
    assert isinstance(cluster, ClusterSource) and cluster.name == "mixed.topo"
    alg = load_algorithm(write(tmp_path, "hm.rccl", hm_allreduce_rccl(4, 2)))
    ir, files, _notes = compile_algorithm(alg, tmp_path / "k", CompileOptions(), cluster=cluster)
    man = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert man["topology"] == json.loads(json.dumps(cluster.manifest_entry()))
    # an extra field may not replace a manifest field
    ir2 = build_program(alg, scheduler="hpds", tb_alloc="state", chunk_bytes=1 << 20)
    (tmp_path / "e").mkdir()
    with pytest.raises(ValueError, match="nranks"):
        generate(ir2, tmp_path / "e", platforms=["cuda"] * 8, manifest_extra={"nranks": 3})
    assert not any((tmp_path / "e").iterdir())


@pytest.mark.slow
def test_mixed_vendor_output_builds_with_nvcc_and_hipcc(tmp_path, nvcc, hipcc):
    """The generated Makefile builds the CUDA library from the NVIDIA ranks and the HIP library from
    the AMD ranks; each library defines exactly its own ranks' kernels."""
    algo = write(tmp_path, "hm.rccl", hm_allreduce_rccl(4, 2))
    topo = write(tmp_path, "mixed.topo", MIXED_2X2)
    man = _compile(tmp_path, algo, topo, "k")
    out = tmp_path / "k"
    trim = " ".join(f for f in only_instance_flags("float32", "sum") if "MAX" not in f)   # float32 sum, max
    res = subprocess.run(["make", "-j2", f"NVCC={nvcc}", f"HIPCC={hipcc}", f"HCCC_FLAGS={trim}"], cwd=out,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    for pl, lib in man["libraries"].items():
        syms = subprocess.run(["nm", f"lib{lib}.a"], cwd=out, capture_output=True, text=True).stdout
        for r in man["ranks"]:
            kernel = f"{r['kernel']}_float32_sum"
            assert (kernel in syms) == (r["platform"] == pl), (pl, kernel)
