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

from conftest import examples
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop import msccl_export as me
from hccc.compiler.interop import msccl_prims as mp
from hccc.compiler.interop import msccl_tbs as mt
from hccc.compiler.interop import msccl_waits as mw
from hccc.compiler.interop import msccl_text
from hccc.compiler.interop.msccl_text import xml_text
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
    _, rows = _program(alg, level, fuse)
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


# eight ranks already make eight batches of one rank and hundreds of pieces of text; the 32-rank
# HM AllReduce (a second of CPU a case) in the slow set
@pytest.mark.parametrize("name", ["hm_allreduce_2x4", pytest.param("hm_allreduce_4x8", marks=pytest.mark.slow),
                                  "ring_allgather_8", "hierarchical_alltoall_2x4"])
@pytest.mark.parametrize("k", [1, 3])
def test_ranks_in_batches_and_text_in_pieces_change_nothing(monkeypatch, name, k):
    """Vector clocks done one rank at a time, and the text formatted a few lines at a time, give the
    same XML as the defaults."""
    alg = load_algorithm(EX / f"{name}.rccl")
    for level in (True, False):
        ir = build_algorithm_level(alg) if level else build_program(alg)
        want = me.export_xml(ir, LIM, instances=k)
        with monkeypatch.context() as m:
            m.setattr(mw, "CLOCK_ENTRIES", 1)
            m.setattr(msccl_text, "LINES_AT_ONCE", 5)
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


# ---------------------------------------------------------------------------------------------
@st.composite
def layouts(draw):
    """A random layout of rows over thread blocks of a few ranks, with random waits that follow one
    random order of each rank's rows (so the waits and the thread blocks' orders have no cycle)."""
    nranks = draw(st.integers(1, 3))
    per = [draw(st.integers(1, 14)) for _ in range(nranks)]
    ntb = [draw(st.integers(1, 4)) for _ in range(nranks)]
    rank, tbl, a, b = [], [], [], []
    base = 0
    for r in range(nranks):
        tbs = draw(st.lists(st.integers(0, ntb[r] - 1), min_size=per[r], max_size=per[r]))
        for i in range(per[r]):
            rank.append(r)
            tbl.append(tbs[i])
            for j in draw(st.sets(st.integers(0, max(i - 1, 0)), max_size=min(i, 4))):
                if j < i:
                    a.append(base + i)
                    b.append(base + j)
        base += per[r]
    n = base
    rank = np.array(rank, np.int64)
    tbl = np.array(tbl, np.int64)
    # global thread blocks: (rank, local TB) pairs that hold rows, ids by local TB
    key = rank * 8 + tbl
    uniq, tb = np.unique(key, return_inverse=True)
    tb_rank = uniq // 8
    tb_id = np.zeros(len(uniq), np.int64)
    for r in range(nranks):
        m = np.flatnonzero(tb_rank == r)
        tb_id[m] = np.arange(len(m))
    idx = np.zeros(n, np.int64)
    for t in range(len(uniq)):
        m = np.flatnonzero(tb == t)
        idx[m] = np.arange(len(m))
    z = np.zeros(n, np.int64)
    wa, wb = mp.unique_waits(np.array(a, np.int64), np.array(b, np.int64), n)
    rows = mp.Prims(rank, z, z.astype(float), z, z - 1, z - 1, z, z, z, z, z, z + 1, z - 1, z - 1,
                    np.zeros((n, 4), np.int64), wa, wb)
    nt = len(uniq)
    return mt.Layout(rows, tb_rank, np.full(nt, -1), np.full(nt, -1), np.zeros(nt, np.int64), np.zeros(nt, np.int64),
                     tb_id, np.zeros(nt, np.int64), tb.astype(np.int64), idx, z.copy(), np.zeros(n, bool))


@given(layouts(), st.sampled_from([1, 2, 1 << 25]), st.sampled_from([0, 2, mw.NARROW_LEVEL]))
@settings(max_examples=examples(100), deadline=None)     # the thorough profile: ten times as many
def test_vector_clocks_keep_exactly_the_waits_nothing_else_implies(lay, entries, narrow):
    """On random layouts (and with ranks done one, two or all at a time; the waves of fewer than
    ``narrow`` rows a row at a time, the others in numpy): the kept waits keep each
    rank's happens-before, and each kept wait is implied neither by its row's predecessor in its
    TB nor by another kept wait of the row (networkx reachability as the oracle)."""
    n = len(lay.rows)
    order = _program_order(lay)
    before = list(zip(lay.rows.wait_a.tolist(), lay.rows.wait_b.tolist()))
    full = _closure(n, [(b, a) for a, b in before] + order)
    old = mw.CLOCK_ENTRIES, mw.NARROW_LEVEL
    mw.CLOCK_ENTRIES, mw.NARROW_LEVEL = entries, narrow
    try:
        mw.reduce_deps(lay)
    finally:
        mw.CLOCK_ENTRIES, mw.NARROW_LEVEL = old
    kept = list(zip(lay.rows.wait_a.tolist(), lay.rows.wait_b.tolist()))
    assert set(kept) <= set(before)
    after = _closure(n, [(b, a) for a, b in kept] + order)
    assert set(full.edges) == set(after.edges)
    prev = {b: a for a, b in order}
    waits: dict = {}
    for a, b in kept:
        waits.setdefault(a, []).append(b)
    for a, ds in waits.items():
        for d in ds:
            others = [e for e in ds if e != d] + ([prev[a]] if a in prev else [])
            assert not any(e == d or after.has_edge(d, e) for e in others), (a, d)
    # and nothing implied was kept: every dropped wait is implied by what is left
    for a, b in set(before) - set(kept):
        assert lay.tb[a] == lay.tb[b] or after.has_edge(b, a)


def _connection_fields_agree(text: str) -> int:
    """Both ends of every message name the same data: the k-th send of a connection names where the
    k-th receive stores it (or, for an ``rrs``, what it reduces with), and an ``r`` names where the
    sender reads it (for ``rcs``/``rrcs``, where the sender stored it). Returns the messages checked."""
    import xml.etree.ElementTree as ET

    sending = ("s", "rcs", "rrs", "rrcs")
    receiving = ("r", "rrc", "rcs", "rrs", "rrcs")
    ends: dict = {}
    for gpu in ET.fromstring(text):
        r = int(gpu.get("id"))
        for tb in gpu:
            steps = sorted(tb, key=lambda x: int(x.get("s")))
            ch = tb.get("chan")
            if tb.get("send") != "-1":
                ends.setdefault((r, int(tb.get("send")), ch), [None, None])[0] = [x.attrib for x in steps
                                                                                  if x.get("type") in sending]
            if tb.get("recv") != "-1":
                ends.setdefault((int(tb.get("recv")), r, ch), [None, None])[1] = [x.attrib for x in steps
                                                                                  if x.get("type") in receiving]
    checked = 0
    for key, (snd, rcv) in ends.items():
        assert snd is not None and rcv is not None and len(snd) == len(rcv), key
        for s, x in zip(snd, rcv):
            assert s["cnt"] == x["cnt"], key
            stored = (x["srcbuf"], x["srcoff"]) if x["type"] == "rrs" else (x["dstbuf"], x["dstoff"])
            if s["type"] in ("s", "rrs"):
                assert (s["dstbuf"], s["dstoff"]) == stored, (key, s, x)
            if x["type"] == "r":
                src = (s["dstbuf"], s["dstoff"]) if s["type"] in ("rcs", "rrcs") else (s["srcbuf"], s["srcoff"])
                assert (x["srcbuf"], x["srcoff"]) == src, (key, s, x)
            checked += 1
    return checked


# the 32-rank HM AllReduce in the slow set: hm_allreduce_2x4 is the same shape on two nodes
@pytest.mark.parametrize("name", ["hm_allreduce_2x4", pytest.param("hm_allreduce_4x8", marks=pytest.mark.slow),
                                  "ring_allreduce_8", "hm_allgather_2x4", "ring_reducescatter_8",
                                  "hierarchical_alltoall_2x4"])
def test_both_ends_of_every_message_name_the_same_data(name):
    """Step-ordered exports (plain, fused, instanced) and the exports of hccc's fused kernels, whose
    forwarding primitives are split where their ends need two MSCCL thread blocks."""
    from hccc.compiler.pipeline import CompileOptions, load_program

    alg = load_algorithm(EX / f"{name}.rccl")
    texts = [me.export_algorithm(alg, LIM, fuse=f, instances=k)[1] for f in (False, True) for k in (1, 2)]
    texts += [me.export_xml(load_program(EX / f"{name}.rccl", CompileOptions(fuse=True, tb_alloc=t)), LIM)
              for t in ("state", "connection")]
    assert any(" type=\"rrcs\"" in t or " type=\"rcs\"" in t for t in texts) or name.startswith("hierarchical")
    for text in texts:
        assert _connection_fields_agree(text) > 0


@pytest.mark.parametrize("name", ["hm_allreduce_2x4", "hm_allreduce_4x4"])
@pytest.mark.parametrize("merge", [True, False])
def test_split_hccc_thread_blocks_keep_their_order(name, merge):
    """hccc's fused state-based kernels have thread blocks that forward to two peers: the export
    splits them over MSCCL thread blocks and orders consecutive rows of one hccc TB with a wait
    (or program order, or a path of them), before and after dropping implied waits."""
    from hccc.compiler.pipeline import CompileOptions, load_program

    ir = load_program(EX / f"{name}.rccl", CompileOptions(fuse=True, tb_alloc="state"))
    lay = mt.assign_tbs(mp.unfuse(mp.allgather_sources(ir, mp.from_ir(ir))), LIM.max_steps if merge else 0)
    rows = lay.rows
    o = np.lexsort((rows.pos, rows.htb, rows.rank))
    pairs = [(x, y) for x, y in zip(o[:-1].tolist(), o[1:].tolist())
             if (rows.rank[x], rows.htb[x]) == (rows.rank[y], rows.htb[y])]
    assert any(lay.tb[x] != lay.tb[y] for x, y in pairs)       # some hccc TB is split
    for reduced in (False, True):
        if reduced:
            mt.reduce_deps(lay)
        g = _closure(len(rows), [(b, a) for a, b in zip(lay.rows.wait_a.tolist(), lay.rows.wait_b.tolist())]
                     + _program_order(lay))
        assert all(g.has_edge(x, y) for x, y in pairs)


def _matching_is_symmetric(rows: mp.Prims) -> int:
    """Every sending row's receiver (``peer_x2`` for a forwarding row, else ``peer_x``) is a row of
    its send peer receiving from it whose sender is that row."""
    snd = np.flatnonzero(mp.SENDS[rows.op])
    rcv = np.where(mp.RECEIVES[rows.op[snd]], rows.peer_x2[snd], rows.peer_x[snd])
    assert np.all(rcv >= 0)
    assert np.all(mp.RECEIVES[rows.op[rcv]])
    assert np.array_equal(rows.rank[rcv], rows.sp[snd]) and np.array_equal(rows.rp[rcv], rows.rank[snd])
    assert np.array_equal(rows.peer_x[rcv], snd)
    assert np.array_equal(rows.cnt[rcv], rows.cnt[snd])
    return len(snd)


@pytest.mark.parametrize("name", ["hm_allreduce_2x4", "hm_allreduce_4x4", "ring_allgather_8"])
def test_rows_match_each_send_with_its_receive(name):
    from hccc.compiler.pipeline import CompileOptions, load_program

    for fuse in (False, True):
        ir = load_program(EX / f"{name}.rccl", CompileOptions(fuse=fuse, tb_alloc="state"))
        rows = mp.from_ir(ir)
        assert _matching_is_symmetric(rows) == int(mp.SENDS[ir.prims["op"]].sum())
        if fuse and name.startswith("hm"):
            assert mp.FORWARDS[rows.op].any()


def _forwarding_to_two_peers() -> tuple[object, mp.Prims]:
    """Rank 1 forwards chunk 0 from rank 0 to rank 2 and chunk 1 to rank 3 with two ``rcs`` rows of
    one hccc thread block: one MSCCL thread block would need two send peers."""
    from types import SimpleNamespace

    from hccc.compiler.ir.program_ir import Buf, Op

    # rank, htb, op, sp, rp, sbuf, soff, dbuf, doff, peer_x, peer_x2
    spec = [(0, 0, Op.SEND, 1, -1, Buf.INPUT, 0, Buf.NONE, 0, 2, -1),
            (0, 0, Op.SEND, 1, -1, Buf.INPUT, 1, Buf.NONE, 0, 3, -1),
            (1, 0, Op.RECV_COPY_SEND, 2, 0, Buf.NONE, 0, Buf.OUTPUT, 0, 0, 4),
            (1, 0, Op.RECV_COPY_SEND, 3, 0, Buf.NONE, 0, Buf.OUTPUT, 1, 1, 5),
            (2, 0, Op.RECV, -1, 1, Buf.NONE, 0, Buf.OUTPUT, 0, 2, -1),
            (3, 0, Op.RECV, -1, 1, Buf.NONE, 0, Buf.OUTPUT, 1, 3, -1)]
    cols = list(zip(*spec))
    n = len(spec)

    def a(i):
        return np.array([int(v) for v in cols[i]], np.int64)

    rows = mp.Prims(rank=a(0), htb=a(1), pos=np.array([0, 1, 0, 1, 0, 0], float), op=a(2), sp=a(3), rp=a(4),
                    ch=np.zeros(n, np.int64), sbuf=a(5), soff=a(6), dbuf=a(7), doff=a(8), cnt=np.ones(n, np.int64),
                    peer_x=a(9), peer_x2=a(10), key=np.zeros((n, 4), np.int64),
                    wait_a=np.zeros(0, np.int64), wait_b=np.zeros(0, np.int64))
    ir = SimpleNamespace(name="fwd", nranks=4, nchunks=2, in_chunks=2, out_chunks=2, scratch_chunks=0,
                         collective="allgather", placements=(False, True))
    return ir, rows


def test_unfusing_splits_the_less_used_peer_pair_and_keeps_the_messages():
    ir, rows = _forwarding_to_two_peers()
    assert _matching_is_symmetric(rows) == 4
    out = mp.unfuse(rows)
    assert len(out) == len(rows) + 1
    assert _matching_is_symmetric(out) == 4
    ends = mp.end_components(out)
    ns = np.bincount(ends.comp[ends.sends], minlength=ends.ncomp)
    nr = np.bincount(ends.comp[~ends.sends], minlength=ends.ncomp)
    assert ns.max() <= 1 and nr.max() <= 1
    from hccc.compiler.ir.program_ir import Op
    # the (recv 0, send 2) pair stays fused; the one to rank 3 is a receive, then a send waiting for it
    r1 = np.flatnonzero(out.rank == 1)
    assert [Op(o) for o in out.op[r1]] == [Op.RECV_COPY_SEND, Op.RECV, Op.SEND]
    assert (int(r1[2]), int(r1[1])) in set(zip(out.wait_a.tolist(), out.wait_b.tolist()))
    text = xml_text(ir, mt.lay_out(out, LIM, LIM.max_steps, 1), LIM, 1)
    assert _connection_fields_agree(text) == 4
