"""The ReduceScatter made as an AllGather's time-reverse (``generators.reversed_allgather``) and
its classic candidate ``hm_reversed``: proven by ``verify``, its reference execution equal to the
collective's definition, every transfer an AllGather transfer turned around, and the reversed
steps' order kept."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RRC, Collective
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.runtime.reference import execute, expected, inputs_for
from hccc.testing import hm_shapes, ring_orders, trees


def _allgathers():
    """Small AllGather programs of every shape the generators make: trees (fan-out), rings,
    recursive doubling, all pairs, the hierarchical mesh; 1 to 3 chunks a rank."""
    tree = st.integers(2, 7).flatmap(lambda n: st.tuples(st.just(n), trees(n))).map(
        lambda a: gen.tree_allgather(*a))
    ring = st.integers(2, 7).flatmap(ring_orders).map(lambda o: gen.ring_allgather(len(o), o))
    rd = st.sampled_from([2, 4, 8]).map(gen.recursive_doubling_allgather)
    direct = st.integers(2, 6).map(gen.direct_allgather)
    hm = hm_shapes(12).map(lambda s: gen.hm_allgather(*s))
    return st.tuples(st.one_of(tree, ring, rd, direct, hm), st.integers(1, 3)).map(
        lambda a: gen.split_chunks(a[0], a[1]) if a[1] > 1 else a[0])


@settings(max_examples=40, deadline=None)
@given(_allgathers(), st.integers(0, 3))
def test_reversed_allgather_computes_the_reducescatter(ag, seed):
    rs = gen.reversed_allgather(ag)
    assert rs.header.collective == Collective.REDUCESCATTER
    verify(rs)
    ir = build_program(rs)
    n = rs.header.nranks
    ins = inputs_for(ir, 2 * n * rs.header.chunks_per_rank + 1, "int32", seed=seed)
    out = execute(ir, ins, nmicro=1 + seed % 2, seed=seed)
    want = expected("reducescatter", ins)
    assert all(np.array_equal(o, w) for o, w in zip(out, want))


@settings(max_examples=40, deadline=None)
@given(_allgathers())
def test_reversed_allgather_is_the_transfers_turned_around_in_reverse_order(ag):
    rs = gen.reversed_allgather(ag)
    assert np.all(rs.op == RRC) and rs.ntransfers == ag.ntransfers
    fwd = sorted(zip(ag.dst.tolist(), ag.src.tolist(), ag.chunk.tolist(), ag.step.tolist()))
    back = sorted(zip(rs.src.tolist(), rs.dst.tolist(), rs.chunk.tolist(), rs.step.tolist()))
    assert [f[:3] for f in fwd] == [b[:3] for b in back]
    # a later AllGather step is an earlier ReduceScatter step: the order of any two transfers of
    # different AllGather steps is reversed
    by = {}
    for s, d, c, t in zip(ag.src.tolist(), ag.dst.tolist(), ag.chunk.tolist(), ag.step.tolist()):
        by[(d, s, c)] = t
    pairs = [(by[(s, d, c)], t) for s, d, c, t in zip(rs.src.tolist(), rs.dst.tolist(), rs.chunk.tolist(),
                                                       rs.step.tolist())]
    for a_step, r_step in pairs:
        for b_step, q_step in pairs:
            if a_step < b_step:
                assert r_step > q_step
    # no two reductions into one (rank, chunk) at one step
    keys = list(zip(rs.dst.tolist(), rs.chunk.tolist(), rs.step.tolist()))
    assert len(keys) == len(set(keys))


def test_reversed_allgather_refuses_what_has_no_reverse():
    with pytest.raises(ValueError, match="only an AllGather"):
        gen.reversed_allgather(gen.ring_reducescatter(4))
    ag = gen.ring_allgather(3)
    bad = gen._algorithm(ag.header, np.stack([ag.src, ag.dst, ag.step, ag.chunk, np.full(len(ag.src), RRC)], 1))
    with pytest.raises(ValueError, match="receives only"):
        gen.reversed_allgather(bad)


@settings(max_examples=20, deadline=None)
@given(hm_shapes(16))
def test_hm_reversed_overlaps_the_ring_with_the_node(shape):
    """hm's ReduceScatter runs its nNodes*(G-1) intra-node steps before its ring; the reversed
    AllGather interleaves them: its first ring transfer comes before its last intra-node
    reduction (the ring's reductions sit among the node's in every reversed step but the first)."""
    nn, g = shape
    rs = gen.hm_reversed_reducescatter(nn, g)
    verify(rs)
    ring = (rs.src // g) != (rs.dst // g)
    intra = ~ring
    if nn >= 2 and g >= 2:
        assert rs.step[ring].min() < rs.step[intra].max()
    old = gen.hm_reducescatter(nn, g)
    oring = (old.src // g) != (old.dst // g)
    if nn >= 2 and g >= 2:
        assert old.step[oring].min() > old.step[~oring].max()


def test_hm_reversed_is_a_reducescatter_candidate_on_equal_nodes():
    from pathlib import Path

    from hccc.compiler.cluster.topo_parser import load_topology
    from hccc.compiler.synth.classic import DESCRIPTIONS, classic_candidates, equal_nodes

    topo = load_topology(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "v100_4x3.topo")
    nn, g = equal_nodes(topo)
    got = dict(classic_candidates(topo, "reducescatter").made)
    assert "hm_reversed" in got and "hm_reversed" in DESCRIPTIONS
    res = got["hm_reversed"]
    want = gen.hm_reversed_reducescatter(nn, g)
    assert res.nranks == nn * g and len(res.rows) == want.ntransfers
    assert "hm_reversed" not in dict(classic_candidates(topo, "allgather").made)


@pytest.mark.parametrize("export,suffix", [("xml", ".xml"), ("plan", ".json")])
def test_hm_reversed_exports_to_both_engines_and_passes_check(tmp_path, capsys, export, suffix):
    """The MSCCL XML and the MSCCL++ plan of ``hm_reversed`` (2 nodes of 4 GPUs), written by the
    engine's exporter and proven by ``hccc check`` of the export."""
    from hccc.cli import main
    from hccc.compiler.frontend.rccl_text import algorithm_text

    src = tmp_path / "hm_reversed_2x4.rccl"
    src.write_text(algorithm_text(gen.hm_reversed_reducescatter(2, 4)))
    out = tmp_path / f"hm_reversed_2x4{suffix}"
    assert main([export, str(src), "-o", str(out)]) == 0, capsys.readouterr().err
    assert main(["check", str(out)]) == 0, capsys.readouterr().err
    assert "valid reducescatter on 8 ranks" in capsys.readouterr().out.lower()
