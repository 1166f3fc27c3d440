"""The MSCCL export's thread-block layout (compiler/interop/msccl_tbs.py): thread blocks have one
send peer, one receive peer and one channel and keep each hccc thread block's order; the waits that
remain keep every rank's happens-before and none of them is implied by the others (networkx
reachability is the oracle); doing ranks in small batches and writing the text in small pieces
change nothing."""
from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend.diagnostics import CompileError
from hccc.compiler.interop import msccl_export as me
from hccc.compiler.interop import msccl_prims as mp
from hccc.compiler.interop import msccl_tbs as mt
from hccc.compiler.interop.msccl_format import SUPPORTED_COLLECTIVES, XmlLimits
from hccc.compiler.passes.build import build_algorithm_level, build_program
from hccc.compiler.pipeline import load_algorithm
from hccc.testing import valid_programs

EX = Path(__file__).resolve().parent.parent / "examples"
LIM = XmlLimits(max_xml_nodes=10 ** 6, max_steps=10 ** 4)


def _program(alg, level: bool, fuse: bool):
    ir = build_algorithm_level(alg) if level else build_program(alg)
    rows = mp.allgather_sources(ir, mp.from_ir(ir))
    if fuse:
        from hccc.compiler.interop.msccl_fuse import fuse_forwarding
        rows = fuse_forwarding(rows) or rows
    return ir, mp.unfuse(rows)


def _program_order(lay: mt.Layout) -> list[tuple[int, int]]:
    mem = lay.members()
    same = lay.tb[mem][1:] == lay.tb[mem][:-1]
    return list(zip(mem[:-1][same].tolist(), mem[1:][same].tolist()))


def _closure(n: int, edges) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    return nx.transitive_closure_dag(g)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5), st.booleans(), st.booleans(), st.booleans())
@settings(max_examples=40, deadline=None)
def test_kept_waits_keep_happens_before_and_none_is_implied(alg, level, fuse, merge):
    ir, rows = _program(alg, level, fuse)
    try:
        lay = mt.assign_tbs(rows, LIM.max_steps if merge else 0)
    except mt.OrderCycle:
        return
    n = len(lay.rows)
    # thread blocks: one send peer, one receive peer, one channel; members numbered 0.. in order
    tb = lay.tb
    assert np.all((lay.rows.sp == -1) | (lay.rows.sp == lay.tb_send[tb]))
    assert np.all((lay.rows.rp == -1) | (lay.rows.rp == lay.tb_recv[tb]))
    assert np.all((lay.rows.ch == lay.tb_ch[tb]) | ((lay.rows.sp < 0) & (lay.rows.rp < 0)))
    for t in range(lay.ntbs):
        assert sorted(lay.idx[tb == t].tolist()) == list(range(int((tb == t).sum())))
    for r in np.unique(lay.tb_rank):
        assert sorted(lay.tb_id[lay.tb_rank == r].tolist()) == list(range(int((lay.tb_rank == r).sum())))
    # each hccc TB's order survives: program order or a wait between consecutive rows
    before = set(zip(lay.rows.wait_a.tolist(), lay.rows.wait_b.tolist()))
    order = _program_order(lay)
    full = _closure(n, [(b, a) for a, b in before] + order)
    for h in {(int(r), int(t)) for r, t in zip(lay.rows.rank, lay.rows.htb)}:
        rows_h = np.flatnonzero((lay.rows.rank == h[0]) & (lay.rows.htb == h[1]))
        rows_h = rows_h[np.argsort(lay.rows.pos[rows_h], kind="stable")]
        for x, y in zip(rows_h[:-1].tolist(), rows_h[1:].tolist()):
            assert full.has_edge(x, y)
    try:
        mt.reduce_deps(lay)
    except mt.OrderCycle:
        assert not nx.is_directed_acyclic_graph(nx.DiGraph([(b, a) for a, b in before] + order))
        return
    kept = list(zip(lay.rows.wait_a.tolist(), lay.rows.wait_b.tolist()))
    assert set(kept) <= before
    after = _closure(n, [(b, a) for a, b in kept] + order)
    assert set(full.edges) == set(after.edges)            # happens-before within each rank kept
    prev = {b: a for a, b in order}
    waits: dict = {}
    for a, b in kept:
        waits.setdefault(a, []).append(b)
        assert lay.tb[a] != lay.tb[b]
    for a, ds in waits.items():
        for d in ds:
            # neither the row before it in its TB nor another kept wait of it follows d
            others = [e for e in ds if e != d] + ([prev[a]] if a in prev else [])
            assert not any(e == d or after.has_edge(d, e) for e in others), (a, d)


@pytest.mark.parametrize("name", ["hm_allreduce_4x8", "ring_allgather_8", "hierarchical_alltoall_2x4"])
@pytest.mark.parametrize("k", [1, 3])
def test_ranks_in_batches_and_text_in_pieces_change_nothing(monkeypatch, name, k):
    """Vector clocks done one rank at a time, and the text formatted a few lines at a time, give the
    same XML as the defaults."""
    alg = load_algorithm(EX / f"{name}.rccl")
    for level in (True, False):
        ir = build_algorithm_level(alg) if level else build_program(alg)
        want = me.export_xml(ir, LIM, instances=k)
        with monkeypatch.context() as m:
            m.setattr(mt, "CLOCK_ENTRIES", 1)
            m.setattr(me, "_LINES_AT_ONCE", 5)
            assert me.export_xml(ir, LIM, instances=k) == want


def test_a_fused_export_that_breaks_a_limit_is_written_plain():
    """Fusing can leave a program whose layout breaks a limit the plain one keeps (or breaks too):
    the result, text or error, is the plain export's."""
    alg = load_algorithm(EX / "hm_allgather_2x4.rccl")
    ir = build_algorithm_level(alg)
    lim = XmlLimits(max_steps=24, max_tbs=40, max_channels=3, max_offset=40, max_dep_tb=6, max_xml_nodes=300)

    def result(fuse):
        try:
            return me.export_xml(ir, lim, fuse=fuse, instances=2)
        except CompileError as exc:
            return [d.message for d in exc.diagnostics]

    from hccc.compiler.interop.msccl_fuse import fuse_forwarding
    fused = fuse_forwarding(mp.allgather_sources(ir, mp.from_ir(ir)))
    assert fused is not None
    with pytest.raises(CompileError):
        me._export(ir, fused, lim, 2)
    assert result(True) == result(False)
