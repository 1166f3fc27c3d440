"""Rounding a tree packing's LP again to fewer chunks per rank (``Packing.reround``), and the
synthesis that uses it: where a program would need more blocks than a GPU keeps resident, its
streams share channels in bundles (a bundle takes one fair share of a link where its streams took
one each), so the same LP rounded to fewer chunks, every stream on a channel of its own, is a
candidate too and the simulator chooses."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from conftest import examples
from hccc.compiler.synth import network_from_topology, synthesize
from hccc.compiler.synth import forest
from hccc.compiler.synth import rounding
from hccc.compiler.synth import trees as tr
from hccc.compiler.synth.packing import pair_bandwidth, transposed_pair_order
from hccc.compiler.synth.rounding import CHUNK_CANDIDATES
from hccc.compiler.synth.tree_rows import allgather_rows
from hccc.compiler.synth.tree_shapes import SHAPES, shaped
from hccc.util import clock
from synth_oracles import clusters

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _spanning_out_tree(par: np.ndarray, root: int) -> bool:
    n = len(par)
    if par[root] != -1 or (np.delete(par, root) < 0).any():
        return False
    for v in range(n):
        seen, x = set(), v
        while x != root:
            if x in seen:
                return False
            seen.add(x)
            x = int(par[x])
    return True


@settings(max_examples=examples(8), deadline=None)
@given(topo=clusters())
def test_reround_rounds_the_same_lp_to_at_most_the_chunks_asked(topo):
    net = network_from_topology(topo)
    p = tr.pack_trees(net)
    for k in (1, 2, 3):
        q, = p.reround(k)
        assert 1 <= q.chunks_per_rank <= k
        assert q.lp_time == p.lp_time and q.lower_bound == p.lower_bound
        assert q.rounded_time >= q.lp_time * (1 - 1e-9)     # no rounding beats its LP
        per_root = np.zeros(net.nranks, np.int64)
        for r, par, c in zip(q.roots, q.parents, q.counts):
            assert _spanning_out_tree(np.asarray(par), r) and c > 0
            per_root[r] += c
        assert (per_root == q.chunks_per_rank).all()      # every rank's data, all of it
    # rounding again to the packing's own count gives the packing's own counts
    same, = p.reround(p.chunks_per_rank, min_chunks=p.chunks_per_rank)
    assert same.chunks_per_rank == p.chunks_per_rank and same.counts == p.counts


def test_chunks_to_fit_scales_the_streams_to_the_blocks():
    assert forest.chunks_to_fit(12, 1246, 208) == 2
    assert forest.chunks_to_fit(16, 400, 208) == 8
    assert forest.chunks_to_fit(4, 1000, 208) == 0          # fewer than one chunk: none
    assert forest.chunks_to_fit(8, 100, 208) == 6            # always fewer than it had


@pytest.mark.slow   # 4.6 s of synthesis and simulation
def test_a_bundled_program_is_also_tried_with_fewer_chunks_on_channels_of_their_own(monkeypatch, packing_without_classes):
    """v100_4x2_8's AllReduce with a block budget that forces bundles: a re-rounded candidate with
    no bundles, within the budget, is simulated beside the bundled ones, and the program kept is
    the fastest within the budget (every candidate simulated: none is settled by a faster one's
    time, as the re-rounded one is where its packing's link-model time is above the bundled one's
    simulated time)."""
    from hccc.commands.synth import Simulations, tree_simulated_score
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "v100_4x2_8.topo")      # 2 chunks per rank, up to 2 on a tree
    monkeypatch.setattr(forest, "resident_blocks", lambda vendors, nwarps=16: None)
    free = synthesize(topo, "allreduce", method="trees", time_limit=60)
    budget = free.detail["blocks_per_rank"] * 2 // 3
    monkeypatch.setattr(forest, "resident_blocks", lambda vendors, nwarps=16: budget)
    sims = Simulations(topo, 1 << 30, clock.now() + 120)
    score = tree_simulated_score(sims)
    score.settled = lambda *a, **k: False
    res = synthesize(topo, "allreduce", method="trees", time_limit=60, bandwidth_bound_bytes=1 << 30,
                     tree_score=score)
    cands = res.detail["simulated_candidates"]
    bundled = {k: v for k, v in cands.items() if "bundles" in k}
    own = {k: v for k, v in cands.items() if "bundles" not in k and int(k.split("blocks ")[1]) <= budget}
    assert bundled and own, cands
    # the joint packing (both halves at once) needed bundles; rounded again it needs none
    assert any("joint" in k for k in bundled) and any("joint" in k for k in own)
    assert res.detail["blocks_per_rank"] <= budget
    fits = [v for k, v in cands.items() if int(k.split("blocks ")[1]) <= budget]
    assert sims.known(res, res.detail["channels"]) == min(fits)     # the fastest within the budget


@pytest.mark.slow          # 8 s (64 GPUs packed twice)
def test_a_rerounding_reuses_the_counts_it_rounded_to_before(monkeypatch):
    """A packing keeps what each chunk count rounded to (largest remainders, or the MILP's counts
    when those missed): rounding again to counts tried before runs no MILP again where the first
    MILP ended by its node limit or proved that no counts fit (64 heterogeneous V100s: 4 s of the
    AllReduce's 18 s packing once), and gives the same trees and counts as a packing rounded afresh."""
    import sys
    sys.path.insert(0, str(CLUSTERS.parents[1] / "benchmarks"))
    from synth_scale import POD64, scaled_cluster

    calls = []
    real = rounding._milp_counts
    monkeypatch.setattr(rounding, "_milp_counts", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    net = network_from_topology(scaled_cluster(POD64, "v100", "pod64"))
    p = tr.pack_trees(net)
    assert calls, "the example needs the MILP (2 and 3 chunks per rank: regrowing misses there)"
    tried = sorted(set(calls))
    calls.clear()
    k = tried[0]
    again, = p.reround(k, min_chunks=k)
    assert calls == [] and again.chunks_per_rank == k
    fresh, = tr.pack_trees(net, min_chunks=k, max_chunks=k).reround(k, min_chunks=k)
    assert (again.roots, again.counts, again.rounded_time) == (fresh.roots, fresh.counts, fresh.rounded_time)


def test_the_joint_allreduce_rounds_only_to_chunk_counts_whose_streams_can_be_resident():
    """With a channel per stream, the joint AllReduce's 2 N K streams of N - 1 arcs give a rank
    4 K (N - 1) connection ends on average, a thread block each: past what stays resident at the
    fewest warps the program could run only in bundles, so the packing is not rounded there. The
    cap is that average (a lower bound of the busiest rank's), recounted from the rounded trees;
    it applies where blocks of fewer warps are an option (a re-rounding runs there)."""
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "v100_4x2_8x2.topo")           # 24 GPUs
    net = network_from_topology(topo)
    n = net.nranks
    for least in (None, 2112, 400, 150, 40):
        cap = forest.joint_chunks_resident(n, None, 528, None if least is None else lambda w, x=least: x)
        if least is None:
            assert cap is None
            continue
        assert cap in CHUNK_CANDIDATES and (4 * cap * (n - 1) <= least or cap == 1)
        bigger = [c for c in CHUNK_CANDIDATES if c > cap]
        assert not bigger or 4 * bigger[0] * (n - 1) > least
        ag, rs = tr.pack_allreduce(net, max_chunks=cap)
        assert ag.chunks_per_rank <= cap and rs.chunks_per_rank == ag.chunks_per_rank
        ends = np.zeros(n)
        for p in (ag, rs):
            for r, par, c in zip(p.roots, p.parents, p.counts):
                par = np.asarray(par)
                ends += c * (np.bincount(par[par >= 0], minlength=n) + (par >= 0))   # children + parent
        assert ends.mean() == 4 * ag.chunks_per_rank * (n - 1)
    # the fewest warps' residency decides; without blocks of fewer warps, no cap (bundles at more
    # chunks may be all that fits); a caller's own cap stays
    assert forest.joint_chunks_resident(n, None, 100, lambda w: 2112 * 16 // w // 4) == 16
    assert forest.joint_chunks_resident(n, None, 100, None) is None
    assert forest.joint_chunks_resident(n, 2, 100, lambda w: 2112) == 2


def test_stream_blocks_counts_the_built_programs_thread_blocks():
    """The thread blocks of a channel-per-stream program, or of one with a tree's streams in
    bundles, counted from its trees alone, are those the built rows need (``blocks_per_rank``),
    shaped or not, for one collective and an AllReduce's halves."""
    from hccc.compiler.pipeline import load_cluster

    for name in ("v100_4x3_8", "h20_4x3_8", "a100_topo2"):
        topo = load_cluster(CLUSTERS / f"{name}.topo")
        net = network_from_topology(topo)
        ag = tr.pack_trees(net, pair_bw=pair_bandwidth(topo))
        rs = tr.pack_trees(net.transposed(), pair_bw=pair_bandwidth(topo)[transposed_pair_order(net)])
        for shape in ("",) + SHAPES:
            sag, srs = shaped(net, ag, shape), shaped(net.transposed(), rs, shape)
            split = forest.split_for(ag.chunks_per_rank, net.nranks, 2)
            sp = forest.split_packing(sag, split)
            for most in (None, 2, 3, 8):
                rows = forest._rows(allgather_rows(sp), forest.RECV, 0,
                                    forest.bundles(sp, split, most)[forest.stream_of_chunk(sp, split)])
                assert forest.stream_blocks({"allgather": sag}, most) == \
                    forest.blocks_per_rank(rows, net.nranks).max()
            assert forest.stream_blocks({"allgather": sag, "reducescatter": srs}) >= \
                forest.stream_blocks({"allgather": sag})


@pytest.mark.slow
def test_a_program_short_of_its_packing_is_tried_with_half_the_streams(monkeypatch, design_target_costs):
    """A ReduceScatter whose packing rounds to many chunks per rank (14 GPUs, two nodes with deep
    trees): its program simulates more than ``FEWER_STREAMS_ABOVE`` slower than the packing's time
    in the link model (each of its many streams crosses a link at a small share of it, so its
    pipeline fills and drains slowly), so the same LP rounded to half the chunks is simulated too,
    and the faster is kept: within 0.97 of the cut bound at the design targets' units (the slice
    policy and the simulator both charging 0.5 us a unit), where the many streams' best is not.
    Without the halving (the threshold out of reach), the program stays short. Candidates are
    scored at hccc's default slices here (``THIN_CHOOSE_MOST`` 0): at its own 16 KiB slices the
    first one is no longer short (0.991 of the bound, tests/test_slice_program_policy.py has that
    rule), and the halving is what is under test."""
    from cluster_texts import RING_AND_MESH_14
    from hccc.commands import synth as cmd  # noqa: F401
    import hccc.synth_select as select
    from hccc.commands.synth import Simulations, tree_simulated_score
    from hccc.compiler.cluster.topo_parser import parse_topology

    monkeypatch.setattr(select, "THIN_CHOOSE_MOST", 0)
    topo = parse_topology(RING_AND_MESH_14, "ring_and_mesh.topo")

    def run():
        sims = Simulations(topo, 1 << 30, clock.now() + 120)
        res = synthesize(topo, "reducescatter", method="trees", time_limit=60, bandwidth_bound_bytes=1 << 30,
                         tree_score=tree_simulated_score(sims))
        return res, sims.known(res, res.detail["channels"]), sims.bound_seconds("reducescatter")

    monkeypatch.setattr(forest, "FEWER_STREAMS_ABOVE", np.inf)
    many, t_many, bound = run()
    assert bound / t_many < 0.98
    monkeypatch.setattr(forest, "FEWER_STREAMS_ABOVE", 0.02)
    res, t, _ = run()
    cands = res.detail["simulated_candidates"]
    simulated = [c["simulated_seconds"] for c in res.detail["candidates"] if c["simulated_seconds"] is not None]
    assert any(int(k.split()[0][2:]) < many.chunks_per_rank for k in cands), cands
    assert res.chunks_per_rank < many.chunks_per_rank and t == min(simulated) < t_many
    assert bound / t >= 0.97


def test_shaped_trees_that_break_residency_give_way_to_the_packings_own(monkeypatch):
    """h20_4x3_8's AllGather: shaping puts 80 thread blocks on its busiest rank, its own trees
    68. With 70 resident (at any warps) the shaped programs cannot run at all, and one chunk per
    rank cannot be bundled or rounded to fewer: the unshaped program is built and kept."""
    from hccc.commands.synth import Simulations, tree_simulated_score
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "h20_4x3_8.topo")
    monkeypatch.setattr(forest, "resident_blocks", lambda vendors, nwarps=16: 70)
    sims = Simulations(topo, 1 << 30, clock.now() + 120)
    res = synthesize(topo, "allgather", method="trees", time_limit=60, bandwidth_bound_bytes=1 << 30,
                     tree_score=tree_simulated_score(sims))
    d = res.detail
    assert d["shape"] == "-" and d["blocks_per_rank"] <= 70, d["simulated_candidates"]
    assert any("unshaped" in k for k in d["simulated_candidates"])
    assert sims.known(res, d["channels"]) is not None


@pytest.mark.slow
def test_a_rerounding_at_fewer_warps_is_simulated_beside_one_at_full_warps(monkeypatch):
    """Two MI250 nodes' ReduceScatter (32 GCDs): its packing rounds to many chunks per rank, whose
    streams are resident only in bundles; the re-rounding that fits at the fewest warps (blocks of
    a quarter of the rate) and the one with fewer chunks that fits at full warps are both
    simulated, and the faster (here the one at full warps) is kept. At hccc's default slices
    (``THIN_CHOOSE_MOST`` 0: the candidates' own slices, tests/test_slice_program_policy.py, rank
    them otherwise)."""
    import sys

    from hccc.commands import synth as cmd  # noqa: F401
    import hccc.synth_select as select
    from hccc.commands.synth import Simulations, tree_simulated_score
    from hccc.compiler.cluster.topo_parser import parse_topology

    monkeypatch.setattr(select, "THIN_CHOOSE_MOST", 0)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_quality import mi250_text

    topo = parse_topology(mi250_text(2), "mi250_2.topo")
    sims = Simulations(topo, 1 << 30, clock.now() + 120)
    res = synthesize(topo, "reducescatter", method="trees", time_limit=60, bandwidth_bound_bytes=1 << 30,
                     tree_score=tree_simulated_score(sims))
    # the bundled programs are not resident: listed with their link-model time, not simulated
    cands = {k: v for k, v in res.detail["simulated_candidates"].items() if "bundles" not in k}
    few = [k for k in cands if k.endswith(f"of {forest.LEAST_WARPS} warps")]
    full = [k for k in cands if "warps" not in k]
    assert few and full, cands
    blocks = {k: int(k.split("blocks ")[1].split()[0]) for k in cands}
    assert max(blocks[k] for k in full) < min(blocks[k] for k in few), cands
    assert sims.known(res, res.detail["channels"]) == min(cands.values())
    assert res.detail["blocks_per_rank"] == blocks[min(cands, key=cands.get)]

