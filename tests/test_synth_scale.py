"""Tree synthesis at scale: symmetric programs written as loops, read back by hccc, and larger
multi-rail clusters synthesised, compiled and simulated within the default limits."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import network_from_topology, synthesize, to_algorithm, to_rccl

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"


def _transfers(alg) -> np.ndarray:
    rows = np.stack([alg.src, alg.dst, alg.step, alg.chunk, alg.op.astype(np.int64)], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def test_symmetry_elements_are_automorphisms():
    """Every element of the node symmetry maps each pair onto a pair of equal bandwidth and each
    shared group onto a group of equal capacity with the mapped members (checked on the network
    itself, not through the code that found the symmetry), and the elements are distinct."""
    from hccc.compiler.synth.symmetry import node_symmetry

    net = network_from_topology(load_cluster(CLUSTERS / "a100_topo3.topo"))
    sym = node_symmetry(net)
    assert sym is not None and len(sym) == sym.nodes * sym.gpu_shifts
    bw = {(int(u), int(v)): float(b) for u, v, b in zip(net.psrc, net.pdst, net.bw)}
    groups = {}
    for g, members in enumerate(net.group_pairs()):
        groups[frozenset((int(net.psrc[p]), int(net.pdst[p])) for p in members)] = float(net.gbw[g])
    seen = set()
    for e in sym.ranks:
        assert sorted(e.tolist()) == list(range(net.nranks))
        seen.add(tuple(e.tolist()))
        for (u, v), b in bw.items():
            assert bw.get((int(e[u]), int(e[v]))) == b
        for members, c in groups.items():
            assert groups.get(frozenset((int(e[u]), int(e[v])) for u, v in members)) == c
    assert len(seen) == len(sym)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", pytest.param("allreduce", marks=pytest.mark.slow)])
def test_loops_read_back_as_the_same_transfers(collective, monkeypatch):
    """A symmetric tree program written as loops over the node shifts parses back into exactly the
    transfers of the program (as a multiset), in a text of a few lines per representative transfer."""
    from hccc.compiler.frontend import parse_rccl
    import hccc.compiler.synth.emit as emit

    topo = load_cluster(CLUSTERS / "a100_topo3.topo")
    res = synthesize(topo, collective, method="trees", time_limit=30)
    assert res.loops is not None
    monkeypatch.setattr(emit, "LOOPS_FROM_TRANSFERS", 1)
    text = to_rccl(res, topo)
    assert "for a in range(0, 4):" in text
    back = parse_rccl(text, "synth.rccl")
    assert np.array_equal(_transfers(back), _transfers(to_algorithm(res, topo)))
    reps = sum(len(part.rows) for part in res.loops)
    assert text.count("transfer(") == reps < res.ntransfers


def test_tree_column_matches_pairwise():
    """The vectorised resource column of a set of pairs equals the pairs followed by each pair's
    groups in pair order."""
    from hccc.compiler.synth.packing import _tree_column

    net = network_from_topology(load_cluster(CLUSTERS / "h20_4x2_8.topo"))
    rng = np.random.default_rng(3)
    for _ in range(20):
        pairs = rng.choice(net.npairs, size=rng.integers(0, 12), replace=True)
        want = list(pairs) + [net.npairs + int(g) for p in pairs for g in net.groups_of(int(p))]
        assert _tree_column(net, pairs).tolist() == want


@pytest.mark.slow
def test_multirail_64_synthesises_compiles_and_simulates(tmp_path):
    """64 H800s on 8 multi-rail nodes (past the 10,000 transfers from which synth writes loops): ``hccc synth`` writes loops within the default line
    limit, ``hccc sim`` reads and simulates it, and ``hccc`` compiles it."""
    import json
    import subprocess

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from synth_quality import multirail_text

    topo = tmp_path / "mr16.topo"
    topo.write_text(multirail_text(8))
    algo = tmp_path / "ag.rccl"
    hccc = [sys.executable, "-m", "hccc"]
    p = subprocess.run(hccc + ["synth", str(topo), "--collective", "allgather", "--method", "trees",
                               "-o", str(algo), "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["nranks"] == 64 and s["transfers"] == 64 * 63 * s["chunks_per_rank"]
    text = algo.read_text()
    # loops: a few lines per representative transfer, far fewer than the transfers
    assert "for a in range(0, 8):" in text and text.count("\n") * 20 < s["transfers"]
    p = subprocess.run(hccc + ["sim", str(algo), "--topology", str(topo), "--sizes", "1G", "--json"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    p = subprocess.run(hccc + [str(algo), "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
