"""C2C AllToAll (``hccc gen c2c --collective alltoall``): valid on the cluster's links, every block
between clusters crosses exactly once (the minimum, counted here from cluster sizes), the three
phases in order, and the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.cluster.c2c_alltoall import plan_c2c_alltoall
from hccc.compiler.cluster.hierarchy import hierarchy
from hccc.compiler.cluster.topology_check import check_on_topology
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.pipeline import load_cluster

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


@pytest.mark.parametrize("name", ["mixed_v100_w7800", "v100_4x2_8", "h20_8x2_4", "a100_topo2"])
@pytest.mark.parametrize("border,k", [("nic", 1), ("one-per-nic", 2)])
def test_valid_and_cross_cluster_bytes_at_the_minimum(name, border, k):
    topo = load_cluster(CLUSTERS / f"{name}.topo")
    hier = hierarchy(topo, border=border)
    plan = plan_c2c_alltoall(topo, hier=hier, chunks_per_rank=k)
    alg = plan.algorithm()
    verify(alg)
    check_on_topology(alg, topo)
    rc = hier.rank_cluster
    n = topo.nranks
    # the minimum, from first principles: every piece of every block between clusters
    want = sum(k for i in range(n) for j in range(n) if rc[i] != rc[j])
    cross = rc[alg.src] != rc[alg.dst]
    assert int(cross.sum()) == want == plan.summary()["min_cross_cluster_chunks"]
    # each such chunk crosses once, from a border rank to a border rank
    assert len(np.unique(alg.chunk[cross])) == want
    borders = {r for c in hier.clusters for r in c.border_ranks}
    assert set(alg.src[cross].tolist()) <= borders and set(alg.dst[cross].tolist()) <= borders
    # phases in order: gathers before the exchange, scatters after it (the plan's rows, phase by phase)
    ph, step = plan.phase, plan.rows[:, 2]
    if (ph == 2).any():
        ex = int(step[ph == 2].max())
        assert (step[ph == 1] < ex).all() if (ph == 1).any() else True
        assert (step[ph == 3] > ex).all() if (ph == 3).any() else True


@pytest.mark.parametrize("border,k", [("nic", 1), ("one-per-nic", 2)])
def test_text_parses_to_the_algorithm_in_order(border, k):
    """``rccl()`` and ``algorithm()`` are twins: the text parses to the same header and the same
    transfers in the same order (the compiled program's)."""
    import dataclasses
    from hccc.compiler.frontend import parse_rccl
    topo = load_cluster(CLUSTERS / "mixed_v100_w7800.topo")
    plan = plan_c2c_alltoall(topo, hier=hierarchy(topo, border=border), chunks_per_rank=k)
    alg, back = plan.algorithm(), parse_rccl(plan.rccl(), "a2a.rccl")
    assert list(back.rows()) == list(alg.rows())
    assert dataclasses.replace(back.header, location=None) == dataclasses.replace(alg.header, location=None)
    assert back.header.nchannels_given == alg.header.nchannels_given


def test_gather_happens_behind_a_shared_nic():
    topo = load_cluster(CLUSTERS / "mixed_v100_w7800.topo")
    plan = plan_c2c_alltoall(topo, hier=hierarchy(topo, border="one-per-nic"))
    assert (plan.phase == 1).any() and (plan.phase == 3).any()


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_runs_in_cpu_emulation():
    from hccc.testing import assert_kernels_match
    topo = load_cluster(CLUSTERS / "mixed_v100_w7800.topo")
    plan = plan_c2c_alltoall(topo, hier=hierarchy(topo, border="one-per-nic"))
    ir = build_program(plan.algorithm(), chunk_bytes=64)
    n = topo.nranks
    assert_kernels_match(ir, counts=[n * 5, n * 37 + 3], dtypes=["float32", "int32"])


def test_cli(tmp_path, capsys):
    from hccc.cli import main
    out = tmp_path / "a2a.rccl"
    assert main(["gen", "c2c", str(CLUSTERS / "mixed_v100_w7800.topo"), "--collective", "alltoall",
                 "--pipeline", "2", "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["cross_cluster_chunks"] == s["min_cross_cluster_chunks"] == 2 * 2 * 8 * 8
    assert main(["check", str(out), "--topology", str(CLUSTERS / "mixed_v100_w7800.topo")]) == 0
    assert main(["gen", "c2c", str(CLUSTERS / "mixed_v100_w7800.topo"), "--collective", "alltoall",
                 "--root", "1", "-o", str(out)]) == 1
