"""C2C collective generator (hccc.compiler.cluster.c2c, ``hccc gen c2c``): HetCCL's hierarchical breakdown.

Oracles: the verifier (postconditions), the numpy reference executor against directly computed
results, cross-cluster volumes counted transfer by transfer and compared with closed forms and with
HetCCL Table 7, the cluster description's links, and NIC-proportional load by counting.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.passes.build import build_program
from hccc.compiler.cluster.c2c import C2CError, _ring_order, plan_c2c, swrr
from hccc.compiler.frontend import parse_rccl
from hccc.compiler.cluster.topo_parser import load_topology, parse_topology
from hccc.compiler.cluster.hierarchy import hierarchy
from hccc.compiler.cluster.topology import TopologyBuilder
from hccc.compiler.passes.verify import verify
from hccc.runtime.reference import execute, expected_for, inputs_for
from cli_runs import run_cli
from cluster_texts import MIXED_3, cluster_specs, topo_text

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "examples" / "clusters"
COLLS = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce")


def root_for(coll, topo):
    """Broadcast / Reduce from the last rank (a cluster other than the first); None otherwise."""
    return topo.nranks - 1 if coll in ("broadcast", "reduce") else None

SINGLE_RANK = [("nvidia", "V100", 1, [((0,), 25)]), ("amd", "MI250", 4, [((0, 1), 25), ((2, 3), 50)])]
TRIPLE = [("nvidia", "A100", 2, [((0, 1), 25)]), ("amd", "MI300X", 3, [((0,), 25), ((1, 2), 50)]),
          ("nvidia", "H100", 4, [((0, 1), 50), ((2, 3), 50)]), ("amd", "MI300X", 3, [((0, 1, 2), 25)])]


def _cases():
    """name -> (topology, hierarchy): 2-4 clusters, several vendor mixes, odd sizes, several NICs."""
    mixed = load_topology(CLUSTERS / "mixed_v100_w7800.topo")
    h20 = load_topology(CLUSTERS / "h20_4x2_8x2.topo")
    out = {
        "mixed_v100_w7800": (mixed, hierarchy(mixed)),  # every GPU shares its node's NIC: all border
        "mixed/one-per-nic": (mixed, hierarchy(mixed, border="one-per-nic")),  # 2 border ranks of 8
        "h20_4x2_8x2/4": (h20, hierarchy(h20, nodes_per_cluster=1)),  # clusters of 4, 4, 8, 8 GPUs
        "mix3": (t := parse_topology(topo_text(MIXED_3), "mix3.topo"), hierarchy(t)),  # 3, 6, 2 GPUs
        "single_rank": (t := parse_topology(topo_text(SINGLE_RANK), "single.topo"), hierarchy(t)),
        "triple": (t := parse_topology(topo_text(TRIPLE), "triple.topo"), hierarchy(t)),  # 2, 6, 4
        "triple/one-per-nic": (t, hierarchy(t, border="one-per-nic")),
    }
    return out


CASES = _cases()


def cross_counts(alg, hier):
    """Cross-cluster chunks sent / received per cluster and per rank, by plain counting."""
    C = hier.nclusters
    send, recv = [0] * C, [0] * C
    rsend, rrecv = {}, {}
    for s, d, _, _, _ in alg.rows():
        cs, cd = int(hier.rank_cluster[s]), int(hier.rank_cluster[d])
        if cs != cd:
            send[cs] += 1
            recv[cd] += 1
            rsend[s] = rsend.get(s, 0) + 1
            rrecv[d] = rrecv.get(d, 0) + 1
    return send, recv, rsend, rrecv


def ar_blocks(G, C):
    """AllReduce block sizes: G chunks in C nearly equal consecutive blocks (the larger ones first)."""
    return [G // C + (1 if i < G % C else 0) for i in range(C)]


def check_volumes(coll, alg, hier, n_bytes: int = 4096):
    """Bytes crossing clusters against the closed forms and Table 7 (n = bytes per rank's chunk)."""
    C, G = hier.nclusters, hier.nranks
    N = [c.nranks for c in hier.clusters]
    send, recv, _, _ = cross_counts(alg, hier)
    send_b = [s * n_bytes for s in send]
    recv_b = [r * n_bytes for r in recv]
    for c in range(C):
        nxt, prv = (c + 1) % C, (c - 1) % C
        if C == 1:
            assert send[c] == recv[c] == 0
            continue
        if coll == "allgather":  # Table 7: about G*n each way
            assert send_b[c] == (G - N[nxt]) * n_bytes and recv_b[c] == (G - N[c]) * n_bytes
            assert abs(send_b[c] - G * n_bytes) <= max(N) * n_bytes
        elif coll in ("broadcast", "reduce"):  # Table 7: n each way, except at the ends of the ring
            o = int(hier.rank_cluster[alg.header.root])
            first, last = (o, (o - 1) % C) if coll == "broadcast" else ((o + 1) % C, o)
            assert send[c] == (0 if c == last else G) and recv[c] == (0 if c == first else G)
        elif coll == "reducescatter":  # Table 7: (G-N)*n sent, (C-1)*N*n received
            assert send_b[c] == (G - N[c]) * n_bytes
            assert recv_b[c] == (G - N[prv]) * n_bytes
            if C == 2 or len(set(N)) == 1:
                assert recv_b[c] == (C - 1) * N[c] * n_bytes
        else:  # Table 7: about 2*n*(C-1)/C each way, n = the whole buffer = G chunks
            B = ar_blocks(G, C)
            assert send[c] == 2 * G - B[c] - B[nxt] and recv[c] == 2 * G - B[prv] - B[c]
            assert abs(send[c] - 2 * G * (C - 1) / C) < 2 and abs(recv[c] - 2 * G * (C - 1) / C) < 2
    assert sum(send) == sum(recv)


def check_structure(plan):
    """Links exist, cross-cluster transfers go border -> border to the next cluster on the ring."""
    alg, hier, topo = plan.algorithm(), plan.hierarchy, plan.topology
    C = hier.nclusters
    for s, d, _, _, _ in alg.rows():
        assert topo.has_link(s, d), (s, d)
        cs, cd = int(hier.rank_cluster[s]), int(hier.rank_cluster[d])
        if cs != cd:
            assert cd == (cs + 1) % C
            assert s in hier.clusters[cs].border_ranks and d in hier.clusters[cd].border_ranks


def check_balance(plan):
    """Cross-cluster chunks per border rank track its share of the cluster's NIC bandwidth."""
    alg, hier = plan.algorithm(), plan.hierarchy
    if hier.nclusters == 1:
        return
    send, recv, rsend, rrecv = cross_counts(alg, hier)
    bound = 3 if plan.collective.value == "allreduce" else 2
    for c in hier.clusters:
        tot = float(c.total_nic_gbps)
        for b in c.border_ranks:
            share = float(c.nic_gbps[b]) / tot
            assert abs(rsend.get(b, 0) - share * send[c.index]) < bound
            assert abs(rrecv.get(b, 0) - share * recv[c.index]) < bound


# ---------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("pipeline,intra", [(1, "ring"), (3, "ring"), (2, "mesh")])
def test_c2c_verifies_with_table7_volumes(case, coll, pipeline, intra):
    topo, hier = CASES[case]
    plan = plan_c2c(topo, coll, pipeline=pipeline, intra=intra, hier=hier, root=root_for(coll, topo))
    alg = plan.algorithm()
    rep = verify(alg)
    assert rep.transfers == plan.ntransfers and alg.header.collective.value == coll
    check_volumes(coll, alg, hier)
    check_structure(plan)
    check_balance(plan)
    # pieces: disjoint, non-empty chunk sets, no more than asked for
    assert 1 <= plan.pieces <= pipeline
    assert sorted(set(plan.piece_of.tolist())) == list(range(plan.pieces))
    assert np.array_equal(plan.piece, plan.piece_of[plan.chunk])


@pytest.mark.parametrize("case", ["mixed_v100_w7800", "mixed/one-per-nic", "mix3", "single_rank",
                                  "triple/one-per-nic"])
@pytest.mark.parametrize("coll", COLLS)
def test_c2c_runs_on_the_reference_executor(case, coll):
    topo, hier = CASES[case]
    G = topo.nranks
    for pipeline, intra, dtype, op in ((1, "ring", "float32", "sum"), (2, "mesh", "int32", "max")):
        alg = plan_c2c(topo, coll, pipeline=pipeline, intra=intra, hier=hier,
                       root=root_for(coll, topo)).algorithm()
        ir = build_program(alg)
        # uneven element counts: chunks differ in size by one element
        inputs = inputs_for(ir, G * 5 + 2 if coll == "allgather" else G * 7 + 3, dtype)
        out = execute(ir, inputs, op=op, nmicro=3, seed=pipeline)
        for r, (o, e) in enumerate(zip(out, expected_for(ir, inputs, op))):
            assert e is None or np.array_equal(o, e), (case, coll, r)


@pytest.mark.parametrize("coll", COLLS)
def test_rccl_text_round_trips(coll):
    topo, hier = CASES["triple/one-per-nic"]
    plan = plan_c2c(topo, coll, pipeline=2, hier=hier, root=root_for(coll, topo))
    text = plan.rccl()
    alg = parse_rccl(text, "c2c.rccl")
    # twins: the same transfers in the same order (the compiled program's), nChannels given in both
    assert list(alg.rows()) == list(plan.algorithm().rows())
    assert alg.header.nchannels_given and plan.algorithm().header.nchannels_given
    assert alg.header.nranks == topo.nranks and alg.header.collective == plan.collective
    assert alg.header.name == f"c2c_{coll}_triple" and alg.header.nic_per_node == 2
    assert alg.header.root == (root_for(coll, topo) or 0)
    head = [ln for ln in text.splitlines() if ln.startswith("#")][:16]
    joined = "\n".join(head)
    rooted = f" (root {topo.nranks - 1})" if plan.collective.rooted else ""
    assert f"C2C {plan.collective.dsl_name}{rooted} for cluster 'triple'" in joined
    assert "C1 amd-MI300X (amd MI300X): ranks 2-4, 9-11; border ranks 2, 9 (25 GB/s each); 3 (50 GB/s)" \
        in joined
    assert "pieces: 2 (asked for 2)" in joined and "ring C0 -> C1 -> C2 -> C0" in joined
    assert plan.rccl() == text  # deterministic


def test_pipelining_overlaps_intra_and_inter_stages():
    """Fig. 9: with K pieces, piece k's inter-cluster hop shares a step with piece k+1's start."""
    topo, hier = CASES["mixed/one-per-nic"]  # 2 clusters, 4 chunks per border rank
    rc = hier.rank_cluster
    for coll in COLLS:
        seq = plan_c2c(topo, coll, pipeline=1, hier=hier)
        cross = rc[seq.src] != rc[seq.dst]
        # two clusters, one piece: the stages run one after the other, and inter- and intra-cluster
        # transfers share a step only where a stage holds both: AllGather chunks that their owner
        # sends across itself (next to the start), AllReduce's end broadcast next to the ring AllGather
        both = set(seq.step[cross].tolist()) & set(seq.step[~cross].tolist())
        assert seq.overlap_steps() == len(both)
        if coll == "reducescatter":
            assert not both
        if coll == "allgather":
            early = cross & (seq.stage == 0)
            assert early.any() and np.all(seq.src[early] == seq.chunk[early])
            assert set(seq.step[early].tolist()) <= both  # (their broadcast then meets the other hops)
        pip = plan_c2c(topo, coll, pipeline=2, hier=hier)
        assert pip.pieces == 2 and pip.ntransfers == seq.ntransfers
        assert sorted(zip(pip.src.tolist(), pip.dst.tolist(), pip.chunk.tolist(), pip.op.tolist())) == \
            sorted(zip(seq.src.tolist(), seq.dst.tolist(), seq.chunk.tolist(), seq.op.tolist()))
        cross = rc[pip.src] != rc[pip.dst]
        hop0 = set(pip.step[cross & (pip.piece == 0)].tolist())
        start1 = set(pip.step[(pip.phase == 0) & (pip.piece == 1)].tolist())
        assert hop0 & start1, coll
        assert pip.overlap_steps() > seq.overlap_steps()
        # within a piece, steps follow stages (the per-chunk order the verifier relies on)
        for k in range(2):
            m = pip.piece == k
            order = np.lexsort((pip.step[m], pip.stage[m]))
            assert np.all(np.diff(pip.step[m][order]) >= 0)
        # at most one chunk per piece: 4 own chunks per border rank (AllGather), 8 per block, a rooted
        # collective's 16 chunks in one block
        most = {"allgather": 4, "broadcast": 16, "reduce": 16}.get(coll, 8)
        assert plan_c2c(topo, coll, pipeline=99, hier=hier).pieces == most
    # every rank a border rank (all GPUs share their node's NIC): each one sends its own chunk across
    # at once, next to the start AllGather, so one piece already overlaps (and is all there can be)
    topo, hier = CASES["mixed_v100_w7800"]
    ag = plan_c2c(topo, "allgather", pipeline=4, hier=hier)
    assert ag.pieces == 1
    cross = hier.rank_cluster[ag.src] != hier.rank_cluster[ag.dst]
    assert np.all(ag.src[cross & (ag.stage == 0)] == ag.chunk[cross & (ag.stage == 0)])
    assert 0 in set(ag.step[cross].tolist()) and ag.overlap_steps() >= 1


def test_single_cluster_is_an_intra_cluster_collective():
    topo = load_topology(CLUSTERS / "h20_4x2_8x2.topo")
    for coll in COLLS:
        plan = plan_c2c(topo, coll)
        assert plan.hierarchy.nclusters == 1
        verify(plan.algorithm())
        assert (plan.phase == 1).sum() == 0  # no cluster-to-cluster hop
        G = topo.nranks
        # a ring collective: every rank sends to its ring successor only, N-1 chunks per phase
        per_rank = {"allgather": G - 1, "reducescatter": G - 1, "allreduce": 2 * (G - 1), "broadcast": G - 1,
                    "reduce": G - 1}[coll]
        assert plan.ntransfers == G * per_rank
        ring = plan.rings[0]
        nxt = {ring[i]: ring[(i + 1) % G] for i in range(G)}
        assert all(nxt[s] == d for s, d in zip(plan.src.tolist(), plan.dst.tolist()))


def test_ring_search_avoids_missing_links():
    b = TopologyBuilder("odd_ring")
    b.add_node("a", 4, vendor="nvidia")
    p = b.params("direct", 25, 1, 1)
    cycle = [0, 2, 1, 3]  # the only ring: 0 -> 2 -> 1 -> 3 -> 0
    b.add_links(cycle, cycle[1:] + cycle[:1], p)
    topo = b.build()
    assert _ring_order(topo, [0, 1, 2, 3], "a") == (0, 2, 1, 3)
    for coll in COLLS:
        verify(plan_c2c(topo, coll).algorithm())
    with pytest.raises(C2CError, match="link from rank"):
        plan_c2c(topo, "allgather", intra="mesh")
    b2 = TopologyBuilder("no_ring")
    b2.add_node("a", 3)
    b2.add_links([0, 1], [1, 2], b2.params("direct", 25, 1, 1))
    with pytest.raises(C2CError, match="no ring through the ranks"):
        plan_c2c(b2.build(), "allgather")


def test_refusals_say_what_is_missing():
    topo, hier = CASES["mixed_v100_w7800"]
    for coll in ("broadcast", "reduce"):
        with pytest.raises(C2CError, match="root 16 is not a rank"):
            plan_c2c(topo, coll, root=16)
    with pytest.raises(C2CError, match="pipeline depth"):
        plan_c2c(topo, "allgather", pipeline=0)
    with pytest.raises(C2CError, match="intra-cluster algorithm"):
        plan_c2c(topo, "allgather", intra="tree")
    with pytest.raises(C2CError, match="unknown collective"):
        plan_c2c(topo, "alltoall")
    with pytest.raises(C2CError, match="a root applies"):
        plan_c2c(topo, "allreduce", root=0)
    # two vendors with no link between them: no border ranks
    lonely = parse_topology(topo_text([("nvidia", "A", 2, []), ("amd", "B", 2, [])], nic_links=False), "l.topo")
    with pytest.raises(C2CError, match="has no border rank"):
        plan_c2c(lonely, "allreduce")


def test_missing_cluster_link_is_reported():
    """amd - nvidia - amd in a line: the cluster ring needs amd(2) -> amd(0), which does not exist."""
    text = """define nodenum = 3
define node1 = 1
define vendor = amd
define node2 = 1
define node3 = 1
define vendor = amd
define internode = (node1, node2)
define interbandwidth = {switch => [(((0),(0)) >-> (10,1))]}
define internode = (node2, node3)
define interbandwidth = {switch => [(((0),(0)) >-> (10,1))]}
"""
    topo = parse_topology(text, "line.topo")
    with pytest.raises(C2CError, match="needs a link from rank 2 to rank 0 \\(between clusters\\)"):
        plan_c2c(topo, "allgather")


# ---------------------------------------------------------------------------------------- properties
@settings(max_examples=25)
@given(cluster_specs(max_nodes=4, max_gpus=4).filter(lambda s: len(s) >= 2),
       st.sampled_from(COLLS), st.integers(1, 4), st.sampled_from(["ring", "mesh"]), st.data())
def test_c2c_property(spec, coll, pipeline, intra, data):
    topo = parse_topology(topo_text(spec), "spec.topo")
    root = data.draw(st.integers(0, topo.nranks - 1)) if coll in ("broadcast", "reduce") else None
    plan = plan_c2c(topo, coll, pipeline=pipeline, intra=intra, root=root)
    verify(plan.algorithm())
    check_volumes(coll, plan.algorithm(), plan.hierarchy)
    check_structure(plan)
    check_balance(plan)


@settings(max_examples=60)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=6), st.integers(0, 60))
def test_swrr_prefixes_stay_proportional(weights, n):
    seq = swrr(weights, n)
    W = sum(weights)
    counts = np.zeros(len(weights))
    for i, p in enumerate(seq.tolist()):
        counts[p] += 1
        assert np.all(np.abs(counts - (i + 1) * np.asarray(weights) / W) < 1)


# ---------------------------------------------------------------------------------------- command line
def run_process(*args):
    """hccc in a fresh process: output compared across runs must not depend on one process's state."""
    return subprocess.run([sys.executable, "-m", "hccc.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow   # generates, checks and compiles three clusters' programs
def test_cli_gen_check_compile(tmp_path):
    topo = str(CLUSTERS / "mixed_v100_w7800.topo")
    out = tmp_path / "ar.rccl"
    r = run_process("gen", "c2c", topo, "--collective", "allreduce", "--pipeline", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "C2C Allreduce on 16 ranks, 2 clusters" in r.stdout
    text = out.read_text()
    assert text.startswith("# HetCCL C2C Allreduce for cluster 'mixed_v100_w7800'")
    assert "border ranks 0-7 (6.25 GB/s each)" in text and "pieces: 2" in text
    assert 'GPUPerNode=4, NICPerNode=1' in text
    r2 = run_process("gen", "c2c", topo, "--collective", "allreduce", "--pipeline", "2", "-o", str(tmp_path / "b.rccl"))
    assert r2.returncode == 0 and (tmp_path / "b.rccl").read_bytes() == out.read_bytes()
    r = run_process("check", str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["valid"] is True
    r = run_process(str(out), "-o", str(tmp_path / "kernels"))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "kernels" / "manifest.json").read_text())
    assert manifest["nranks"] == 16
    r = run_process("gen", "c2c", topo, "--collective", "reducescatter", "--json", "--border", "one-per-nic",
                "-o", str(tmp_path / "rs.rccl"))
    s = json.loads(r.stdout)
    assert s["collective"] == "reducescatter" and [c["border_ranks"] for c in s["clusters"]] == [[0, 4], [8, 12]]
    assert [c["cross_cluster_chunks_sent"] for c in s["clusters"]] == [8, 8]
    r = run_process("gen", "c2c", str(CLUSTERS / "h20_4x2_8x2.topo"), "--collective", "allgather",
                "--nodes-per-cluster", "2", "--intra", "mesh", "-o", "-")
    assert r.returncode == 0 and parse_rccl(r.stdout, "x.rccl").header.nranks == 24


def test_cli_gen_errors(tmp_path):
    topo = str(CLUSTERS / "mixed_v100_w7800.topo")
    r = run_cli("gen", "c2c", topo, "--collective", "broadcast", "--root", "16", "-o", str(tmp_path / "b.rccl"))
    assert r.returncode == 1 and "root rank 16 is out of range" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "b.rccl").exists()
    r = run_cli("gen", "c2c", topo, "--collective", "allgather", "--root", "2", "-o", str(tmp_path / "b.rccl"))
    assert r.returncode == 1 and "a root applies to broadcast and reduce, not allgather" in r.stderr
    r = run_cli("gen", "c2c", topo, "--collective", "allgather", "--pipeline", "0", "-o", str(tmp_path / "b.rccl"))
    assert r.returncode == 2
    r = run_cli("gen", "c2c", topo, "--collective", "allgather", "-o", str(tmp_path / "nodir" / "b.rccl"))
    assert r.returncode == 1 and "does not exist" in r.stderr
    bad = tmp_path / "bad.topo"
    bad.write_text("define nodenum = 1\ndefine node1 = x\n")
    r = run_cli("gen", "c2c", str(bad), "--collective", "allgather", "-o", str(tmp_path / "b.rccl"))
    assert r.returncode == 1 and f"{bad}:2:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow     # 6 s: a 16-rank mixed compile; test_runtime_mixed runs a mixed cluster by default
def test_compile_for_the_mixed_cluster(tmp_path):
    """With the cluster given, NVIDIA ranks get CUDA kernels and AMD ranks HIP kernels."""
    topo = str(CLUSTERS / "mixed_v100_w7800.topo")
    algo = ROOT / "examples" / "c2c" / "c2c_allreduce_mixed_v100_w7800.rccl"
    r = run_cli(str(algo), "-o", str(tmp_path / "k"), "--topology", topo)
    if r.returncode == 2 and "--topology" in r.stderr:
        pytest.skip("hccc has no --topology option yet")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert [e["platform"] for e in manifest["ranks"]] == ["cuda"] * 8 + ["hip"] * 8


def test_examples_are_current_and_verify():
    import importlib.util

    spec = importlib.util.spec_from_file_location("c2c_examples", ROOT / "examples" / "c2c" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    texts = mod.examples()
    assert sorted(texts) == [f"c2c_{c}_mixed_v100_w7800.rccl" for c in sorted(COLLS)]
    topo = load_topology(mod.CLUSTER)
    for name, text in texts.items():
        path = ROOT / "examples" / "c2c" / name
        assert path.read_text(encoding="utf-8") == text, f"{name}: run python examples/c2c/generate.py"
        alg = parse_rccl(text, name)
        verify(alg)
        # the file is the twin of its plan's Algorithm: the same transfers in the same order
        coll = name.split("_")[1]
        plan = plan_c2c(topo, coll, root=mod.ROOT if coll in ("broadcast", "reduce") else None)
        assert list(alg.rows()) == list(plan.algorithm().rows()), name
    assert mod.main(["--check"]) == 0


# ---------------------------------------------------------------------------------------- CPU emulation
@pytest.mark.parametrize("coll", COLLS)
def test_c2c_runs_in_cpu_emulation(coll):
    launcher = pytest.importorskip("hccc.runtime.launcher")
    topo, hier = CASES["single_rank"]  # 1 NVIDIA + 4 AMD GPUs: small enough to compile quickly
    ir = build_program(plan_c2c(topo, coll, pipeline=2, hier=hier, root=root_for(coll, topo)).algorithm())
    for dtype, op in (("float32", "sum"), ("int32", "max")):
        res = launcher.run_program(ir, backend="cpu", nbytes=topo.nranks * 4 * 33, dtype=dtype, op=op)
        assert res.count > 0 and res.wrong == 0 and res.stuck is None and res.collective_wrong == 0


def test_c2c_collectives_are_the_specs_its_breakdowns_build():
    """Every non-blockwise spec either has a C2C breakdown (and builds a program that satisfies the
    spec on a two-cluster machine) or is refused with the list of those that have one."""
    from hccc.compiler.cluster.c2c import COLLECTIVES
    from hccc.compiler.frontend.collectives import SPECS
    topo = load_topology(CLUSTERS / "mixed_v100_w7800.topo")
    assert set(COLLECTIVES) <= set(SPECS)
    for name, spec in SPECS.items():
        if name in COLLECTIVES:
            verify(plan_c2c(topo, name, root=1 if spec.rooted else None).algorithm())
        else:
            with pytest.raises(C2CError) as err:
                plan_c2c(topo, name)
            assert f"expected one of {', '.join(COLLECTIVES)}" in str(err.value)
