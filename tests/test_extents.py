"""hccc.compiler.ir.extents: every access in bounds and exact for every element count.

The oracle is brute force and shares no code with the module: it lays the buffers out from the
collective's definition (AllGather input = the rank's own chunks, ReduceScatter output likewise,
everything else the full buffer), pairs the k-th send of every connection with its k-th receive by
walking the primitives, and compares the element counts of every input/output chunk that one
message touches, at every admissible element count over more than one full period.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.ir.check import check_structure, load_ir_json
from hccc.compiler.ir.extents import ExtentError, chunk_anchors, count_unit, same_size, size_witness
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op
from hccc.compiler.passes.build import build_program
from hccc.testing import valid_programs

from codegen_irs import ir_from_rows

COLLS = ("allgather", "reducescatter", "allreduce", "alltoall")


@st.composite
def random_irs(draw, scratch_ok: bool = True):
    """Structurally valid random programs whose primitives name arbitrary chunks (so many name
    chunks of different sizes): sends with plain or reducing receives, forwarding chains, local
    copies and reductions, multi-chunk steps, scratch."""
    coll = draw(st.sampled_from(COLLS))
    N = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    C = N * k
    in_n = k if coll == "allgather" else C
    out_n = k if coll == "reducescatter" else C
    S = draw(st.integers(0, 4)) if scratch_ok else 0
    bufs = [(Buf.INPUT, in_n), (Buf.OUTPUT, out_n)] + ([(Buf.SCRATCH, S)] if S else [])
    rows: list[dict] = []
    tbs: dict[tuple, int] = {}        # (rank, role) -> tb id
    seqs: dict[tuple, int] = {}

    def tb_of(r, role):
        if (r, role) not in tbs:
            tbs[(r, role)] = sum(1 for (q, _) in tbs if q == r)
        return tbs[(r, role)]

    def add(r, role, **row):
        t = tb_of(r, role)
        seq = seqs.get((r, t), 0)
        seqs[(r, t)] = seq + 1
        rows.append(dict(rank=r, tb=t, seq=seq, **row))

    def place(cnt):
        b, size = draw(st.sampled_from([x for x in bufs if x[1] >= cnt]))
        return int(b), draw(st.integers(0, size - cnt))

    for _ in range(draw(st.integers(1, 6))):
        cnt = draw(st.integers(1, min(2, k)))
        if N >= 2 and draw(st.booleans()):
            hops = draw(st.lists(st.integers(0, N - 1), min_size=2, max_size=3, unique=True))
            for h, (a, b) in enumerate(zip(hops, hops[1:])):
                last = h == len(hops) - 2
                if h == 0:
                    sb, so = place(cnt)
                    add(a, ("send", b), op=Op.SEND, send_peer=b, src_buf=sb, src_off=so, count=cnt)
                if last:
                    op = draw(st.sampled_from([Op.RECV, Op.RECV_REDUCE_COPY]))
                else:
                    op = draw(st.sampled_from([Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND,
                                               Op.RECV_REDUCE_COPY_SEND]))
                row = dict(op=op, recv_peer=a, count=cnt)
                if op.writes_dst:
                    row["dst_buf"], row["dst_off"] = place(cnt)
                if op.reads_src:
                    row["src_buf"], row["src_off"] = place(cnt)
                if not last:
                    row["send_peer"] = hops[h + 2]
                # a forwarding primitive owns its receive end and the next send end: one TB
                add(b, ("recv", a) if last else ("fwd", a, hops[h + 2]), **row)
        else:
            r = draw(st.integers(0, N - 1))
            op = draw(st.sampled_from([Op.COPY, Op.REDUCE]))
            sb, so = place(cnt)
            db, do = place(cnt)
            add(r, "local", op=op, src_buf=sb, src_off=so, dst_buf=db, dst_off=do, count=cnt)
    ir = ir_from_rows("rnd", coll, N, C, in_n, out_n, S, rows)
    try:
        check_structure(ir)
    except IRFormatError:
        return None            # e.g. one connection end used by two TBs: not this test's subject
    return ir


def _sizes(count: int, C: int) -> np.ndarray:
    b = np.arange(C + 1, dtype=np.int64) * count // C
    return np.diff(b)


def _slot_chunk(ir, rank, buf, j):
    """Full-buffer chunk of input/output slot j, from the collective's definition."""
    k_in = ir.nchunks // ir.nranks
    if buf == Buf.INPUT and ir.collective == "allgather":
        return rank * k_in + j
    if buf == Buf.OUTPUT and ir.collective == "reducescatter":
        return rank * k_in + j
    return j


def _messages(ir):
    """Lists of primitives moving one message (a send, its forwarders, the final receive) and
    lone local primitives; the k-th send of a connection pairs with its k-th receive."""
    p = ir.prims
    n = ir.nprims
    order = sorted(range(n), key=lambda i: (int(p["rank"][i]), int(p["tb"][i]), int(p["seq"][i])))
    sends, recvs = {}, {}
    for i in order:
        o = Op(int(p["op"][i]))
        if o.sends:
            sends.setdefault((int(p["rank"][i]), int(p["send_peer"][i]), int(p["channel"][i])), []).append(i)
        if o.receives:
            recvs.setdefault((int(p["recv_peer"][i]), int(p["rank"][i]), int(p["channel"][i])), []).append(i)
    nxt, has_prev = {}, set()
    for key, ss in sends.items():
        for s_, r_ in zip(ss, recvs.get(key, [])):
            nxt[s_] = r_
            has_prev.add(r_)
    out = []
    for i in range(n):
        if i in has_prev:
            continue
        chain = [i]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        out.append(chain)
    return out


def _static_sides(ir, i):
    p = ir.prims
    o = Op(int(p["op"][i]))
    out = []
    for side, used in (("src", o.reads_src), ("dst", o.writes_dst)):
        b = int(p[f"{side}_buf"][i])
        if used and b in (Buf.INPUT, Buf.OUTPUT):
            out.append((b, int(p[f"{side}_off"][i])))
    return out


def _oracle_feasible(ir, counts) -> bool:
    """Does every message touch input/output chunks of one size, at every count?"""
    p = ir.prims
    for count in counts:
        sz = _sizes(count, ir.nchunks)
        for chain in _messages(ir):
            for k in range(int(p["count"][chain[0]])):
                lens = {int(sz[_slot_chunk(ir, int(p["rank"][i]), b, off + k)])
                        for i in chain for b, off in _static_sides(ir, i)}
                if len(lens) > 1:
                    return False
    return True


def _counts(ir):
    u, C = count_unit(ir), ir.nchunks
    return [u * t for t in range(0, 2 * C + 3)]


@settings(max_examples=examples(100), deadline=None)     # the thorough profile: ten times as many
@given(random_irs())
def test_anchors_are_exact_or_the_program_is_refused(ir):
    if ir is None:
        return
    counts = _counts(ir)
    try:
        anchor = chunk_anchors(ir)
    except ExtentError as exc:
        scratchy = "scratch chunk" in str(exc)
        assert scratchy or not _oracle_feasible(ir, counts), f"refused but every size agrees: {exc}"
        assert exc.prims and 0 <= exc.prims[0] < ir.nprims
        return
    assert _oracle_feasible(ir, counts)
    p = ir.prims
    for count in counts:
        sz = _sizes(count, ir.nchunks)
        for chain in _messages(ir):
            for k in range(int(p["count"][chain[0]])):
                moved = {int(sz[(int(anchor[i]) + k) % ir.nchunks]) for i in chain}
                assert len(moved) == 1, "a sender and its receiver disagree on a message's length"
                for i in chain:
                    for b, off in _static_sides(ir, i):
                        assert {int(sz[_slot_chunk(ir, int(p["rank"][i]), b, off + k)])} == moved


@settings(max_examples=examples(100), deadline=None)     # the thorough profile: ten times as many
@given(random_irs(scratch_ok=False))
def test_without_scratch_refused_exactly_when_sizes_differ(ir):
    if ir is None:
        return
    feasible = _oracle_feasible(ir, _counts(ir))
    try:
        chunk_anchors(ir)
        assert feasible
    except ExtentError:
        assert not feasible


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_hccc_programs_are_accepted(coll, data):
    """No false alarms: whatever hccc lowers passes (fused or not)."""
    alg = data.draw(valid_programs(coll, max_ranks=6))
    ir = build_program(alg, fuse=data.draw(st.booleans()))
    anchor = chunk_anchors(ir)
    assert ((0 <= anchor) & (anchor < ir.nchunks)).all()
    load_ir_json(ir.to_json())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 80), st.integers(0, 80))
def test_same_size_matches_brute_force(C, a, b):
    """Chunks a and b (wrapping around) have one size at every count, per brute force."""
    class _IR:
        collective, nchunks, nranks, stats, scratch_chunks = "allreduce", C, 1, {}, 0
    brute = all(_sizes(n, C)[a % C] == _sizes(n, C)[b % C] for n in range(0, 3 * C + 2))
    assert bool(same_size(_IR, [a], [b])[0]) == brute
    w = size_witness(_IR, a, b)
    assert (w is None) == brute
    if w is not None:
        assert _sizes(w, C)[a % C] != _sizes(w, C)[b % C]


def test_two_rank_allgather_copy_into_a_smaller_chunk_is_refused_with_a_location():
    """The reported segfault: COPY output[1] -> input[0] on rank 0 of a 2-rank AllGather."""
    rows = []
    for r in range(2):
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.COPY, src_buf=Buf.INPUT, src_off=0,
                         dst_buf=Buf.OUTPUT, dst_off=r))
        rows.append(dict(rank=r, tb=0, seq=1, op=Op.SEND, send_peer=1 - r, src_buf=Buf.OUTPUT, src_off=r))
        rows.append(dict(rank=r, tb=0, seq=2, op=Op.RECV, recv_peer=1 - r, dst_buf=Buf.OUTPUT,
                         dst_off=1 - r))
    rows.append(dict(rank=0, tb=0, seq=3, op=Op.COPY, src_buf=Buf.OUTPUT, src_off=1, dst_buf=Buf.INPUT,
                     dst_off=0))
    ir = ir_from_rows("ag", "allgather", 2, 2, 1, 2, 0, rows)
    with pytest.raises(IRFormatError, match=r"rank 0 tb 0 seq 3 \(copy\): copies between chunks of "
                                            r"different sizes: .* differ in size at 1 element \(1 vs 0\)"):
        load_ir_json(ir.to_json())


def test_a_slot_too_small_for_the_largest_step_is_refused():
    rows = [dict(rank=0, tb=0, seq=0, op=Op.SEND, send_peer=1, src_buf=Buf.INPUT, src_off=0, count=4),
            dict(rank=1, tb=0, seq=0, op=Op.RECV, recv_peer=0, dst_buf=Buf.OUTPUT, dst_off=0, count=4)]
    ir = ir_from_rows("big_step", "allreduce", 2, 4, 4, 4, 0, rows, chunk_bytes=48)
    with pytest.raises(IRFormatError, match=r"chunk_bytes 48 is too small for steps of 4 chunks.*>= 64"):
        load_ir_json(ir.to_json())
    ir.chunk_bytes = 64
    load_ir_json(ir.to_json())
