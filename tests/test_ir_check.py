"""IR checks (compiler/ir/check.py): structure, FIFO order, deadlock; JSON round trip."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.compiler.passes.build import build_program
from hccc.compiler.ir.check import (load_ir_json, CYCLE_EDGES_SHOWN, DeadlockError, FifoOrderError, check_deadlock,
                                    check_fifo_order, check_structure, match_connections)
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, IRFormatError, Op, ProgramIR

from random_programs import algorithms


def make_ir(rows, nranks, ntbs, deps=(), coll="allreduce", nchunks=None):
    """IR from rows of dicts (missing fields get neutral defaults)."""
    n = len(rows)
    defaults = {"pipeline": 0, "send_peer": -1, "recv_peer": -1, "channel": 0, "src_buf": 0, "src_off": 0,
                "dst_buf": 0, "dst_off": 0, "count": 1, "task": -1, "task2": -1}
    prims = {}
    for k, dt in PRIM_COLUMNS.items():
        prims[k] = np.array([r.get(k, defaults.get(k, 0)) for r in rows], dtype=dt).reshape(n)
    nchunks = nchunks or nranks
    return ProgramIR(name="t", collective=coll, nranks=nranks, nchunks=nchunks, in_chunks=nchunks,
                     out_chunks=nchunks, scratch_chunks=0, prims=prims,
                     dep_prim=np.array([d[0] for d in deps], np.int64),
                     dep_on=np.array([d[1] for d in deps], np.int64), npipelines=1,
                     ntbs=np.array(ntbs, np.int32))


def send(rank, tb, seq, peer, task=-1, off=0):
    return dict(rank=rank, tb=tb, seq=seq, op=Op.SEND, send_peer=peer, src_buf=Buf.INPUT, src_off=off, task=task)


def recv(rank, tb, seq, peer, task=-1, off=0):
    return dict(rank=rank, tb=tb, seq=seq, op=Op.RECV, recv_peer=peer, dst_buf=Buf.OUTPUT, dst_off=off, task=task)


def test_hand_built_deadlock_is_found():
    # each rank receives first from the other, then sends: classic deadlock
    ir = make_ir([recv(0, 0, 0, 1, task=1), send(0, 0, 1, 1, task=0),
                  recv(1, 0, 0, 0, task=0), send(1, 0, 1, 0, task=1)], 2, [1, 1])
    check_structure(ir)
    check_fifo_order(ir)
    with pytest.raises(DeadlockError) as ei:
        check_deadlock(ir)
    msg = str(ei.value)
    assert "deadlock" in msg and "rank 0 tb 0" in msg and "rank 1 tb 0" in msg
    assert set(ei.value.cycle) <= set(range(4)) and len(ei.value.cycle) >= 2


def test_long_wait_cycle_message_is_bounded():
    """A ring of R ranks each receiving before it sends waits around all of them: the message spells
    out the first CYCLE_EDGES_SHOWN edges and counts the rest, the error holds every primitive."""
    R = 3 * CYCLE_EDGES_SHOWN
    prims = []
    for r in range(R):
        prims += [recv(r, 0, 0, (r - 1) % R, task=r), send(r, 0, 1, (r + 1) % R, task=(r + 1) % R)]
    ir = make_ir(prims, R, [1] * R)
    check_structure(ir)
    check_fifo_order(ir)
    with pytest.raises(DeadlockError) as ei:
        check_deadlock(ir)
    msg = str(ei.value)
    edges = len(ei.value.cycle) // 2
    assert edges >= R
    assert msg.count(" waits for ") == CYCLE_EDGES_SHOWN
    assert msg.endswith(f"and {edges - CYCLE_EDGES_SHOWN} more edges")
    assert set(ei.value.cycle) == set(range(2 * R))


def test_hand_built_exchange_without_deadlock():
    ir = make_ir([send(0, 0, 0, 1, task=0), recv(0, 0, 1, 1, task=1),
                  recv(1, 0, 0, 0, task=0), send(1, 0, 1, 0, task=1)], 2, [1, 1])
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)


def test_deadlock_through_dependency():
    # rank 0: TB0 sends to 1 but depends on TB1's receive, which waits for rank 1's send; rank 1's
    # TB receives from 0 first, then sends: cycle through a cross-TB dependency
    ir = make_ir([send(0, 0, 0, 1), recv(0, 1, 0, 1),
                  recv(1, 0, 0, 0), send(1, 0, 1, 0)], 2, [2, 1], deps=[(0, 1)])
    check_structure(ir)
    with pytest.raises(DeadlockError):
        check_deadlock(ir)
    # without the dependency it is fine
    ir2 = make_ir([send(0, 0, 0, 1), recv(0, 1, 0, 1),
                   recv(1, 0, 0, 0), send(1, 0, 1, 0)], 2, [2, 1])
    check_deadlock(ir2)


def test_forwarding_ring_is_a_deadlock():
    rows = []
    for r in range(3):
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.RECV_COPY_SEND, recv_peer=(r - 1) % 3, send_peer=(r + 1) % 3,
                         dst_buf=Buf.OUTPUT))
    ir = make_ir(rows, 3, [1, 1, 1])
    check_structure(ir)
    with pytest.raises(DeadlockError, match="ring"):
        check_deadlock(ir)


def test_chain_visiting_a_tb_twice_is_a_deadlock():
    # 0 -> 1 -> 0 forwarded, and rank 0's TB both starts and ends the chain
    rows = [send(0, 0, 0, 1), recv(0, 0, 1, 1),
            dict(rank=1, tb=0, seq=0, op=Op.RECV_COPY_SEND, recv_peer=0, send_peer=0, dst_buf=Buf.OUTPUT)]
    ir = make_ir(rows, 2, [1, 1])
    check_structure(ir)
    with pytest.raises(DeadlockError, match="same send/receive chain"):
        check_deadlock(ir)


def test_fifo_mismatch_detected():
    ir = make_ir([send(0, 0, 0, 1, task=0), send(0, 0, 1, 1, task=1),
                  recv(1, 0, 0, 0, task=1), recv(1, 0, 1, 0, task=0)], 2, [1, 1])
    check_structure(ir)
    with pytest.raises(FifoOrderError, match="task"):
        check_fifo_order(ir)
    ir.prims["task"][:] = -1
    check_fifo_order(ir)          # without task ids nothing to compare but counts
    ir.prims["count"][3] = 2
    ir.out_chunks = 4
    with pytest.raises(FifoOrderError, match="chunk"):
        check_fifo_order(ir)


def test_match_connections_is_computed_once_per_set_of_columns():
    """The pairing is remembered per set of column arrays (read-only), recomputed for new ones and
    forgotten with them; two threads asking at once get the one result."""
    import gc
    import threading

    from hccc.compiler.ir import connections
    ir = build_program(G.ring_allreduce(4))
    first = match_connections(ir)
    assert match_connections(ir) is first and not first[0].flags.writeable
    got = []
    threads = [threading.Thread(target=lambda: got.append(match_connections(ir))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g is first for g in got)
    ir.prims = dict(ir.prims, channel=ir.prims["channel"].copy())
    again = match_connections(ir)
    assert again is not first and all(np.array_equal(a, b) for a, b in zip(again, first))
    key = id(ir.prims["op"])
    del ir, first, again, got
    gc.collect()
    assert key not in connections._MEMO


def test_match_connections_pairs_kth_with_kth():
    ir = build_program(G.ring_allreduce(4))
    s, r = match_connections(ir)
    p = ir.prims
    assert np.array_equal(p["send_peer"][s], p["rank"][r])
    assert np.array_equal(p["rank"][s], p["recv_peer"][r])
    assert np.array_equal(np.where(p["task2"][s] >= 0, p["task2"][s], p["task"][s]), p["task"][r])


# ------------------------------------------------------------------------------ structure corruption
def _base():
    return build_program(G.hm_allreduce(2, 2), scheduler="rr")


CORRUPTIONS = [
    ("rank", lambda ir: ir.prims["rank"].__setitem__(0, 99), "rank out of range"),
    ("tb", lambda ir: ir.prims["tb"].__setitem__(0, 50), "tb out of range"),
    ("seq gap", lambda ir: ir.prims["seq"].__setitem__(1, ir.prims["seq"][1] + 5), "seq"),
    ("op", lambda ir: ir.prims["op"].__setitem__(0, 42), "invalid op code"),
    ("src_buf", lambda ir: ir.prims["src_buf"].__setitem__(0, 9), "invalid src_buf"),
    ("count", lambda ir: ir.prims["count"].__setitem__(0, 0), "count"),
    ("src range", lambda ir: _set_first(ir, lambda p: p["src_buf"] == Buf.INPUT, "src_off", 1000),
     "exceeds the input buffer"),
    # offset + count past int32 (the columns' own width): the sum must not wrap into range
    ("src range wraps", lambda ir: _set_first(ir, lambda p: p["src_buf"] == Buf.INPUT, "src_off",
                                              np.iinfo(ir.prims["src_off"].dtype).max),
     "exceeds the input buffer"),
    ("dst range", lambda ir: _set_first(ir, lambda p: p["dst_buf"] == Buf.OUTPUT, "dst_off", -1),
     "exceeds the output buffer"),
    ("send peer self", lambda ir: _set_first(ir, lambda p: p["op"] == Op.SEND, "send_peer", None), "own rank"),
    ("send peer on recv", lambda ir: _set_first(ir, lambda p: p["op"] == Op.RECV, "send_peer", 0),
     "send_peer"),
    ("missing recv peer", lambda ir: _set_first(ir, lambda p: p["op"] == Op.RECV, "recv_peer", -1),
     "recv_peer"),
    ("dst on send", lambda ir: _set_first(ir, lambda p: p["op"] == Op.SEND, "dst_buf", Buf.OUTPUT), "dst_buf"),
    ("ntbs", lambda ir: ir.ntbs.__setitem__(0, ir.ntbs[0] + 1), "tbs_per_rank"),
    ("pipeline", lambda ir: ir.prims["pipeline"].__setitem__(0, 10 ** 6), "pipeline"),
    ("dep rank", lambda ir: _cross_rank_dep(ir), "crosses ranks"),
    ("dep self", lambda ir: _self_dep(ir), "depends on itself"),
    ("unbalanced", lambda ir: _drop_send(ir), "send"),
]


def _set_first(ir, pred, col, val):
    i = int(np.flatnonzero(pred(ir.prims))[0])
    ir.prims[col][i] = ir.prims["rank"][i] if val is None else val


def _cross_rank_dep(ir):
    r = ir.prims["rank"]
    a, b = 0, int(np.flatnonzero(r != r[0])[0])
    ir.dep_prim = np.r_[ir.dep_prim, a]
    ir.dep_on = np.r_[ir.dep_on, b]


def _self_dep(ir):
    ir.dep_prim = np.r_[ir.dep_prim, 0]
    ir.dep_on = np.r_[ir.dep_on, 0]


def _drop_send(ir):
    # turn a SEND into a NOP: the connection then has one receive too many
    i = int(np.flatnonzero(ir.prims["op"] == Op.SEND)[0])
    ir.prims["op"][i] = Op.NOP
    ir.prims["send_peer"][i] = -1
    ir.prims["src_buf"][i] = Buf.NONE


@pytest.mark.parametrize("name,mutate,msg", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_check_structure_rejects_corruption(name, mutate, msg):
    ir = _base()
    check_structure(ir)
    mutate(ir)
    with pytest.raises(IRFormatError) as ei:
        check_structure(ir)
    assert msg in str(ei.value)


def test_connection_end_on_two_tbs_rejected():
    ir = make_ir([send(0, 0, 0, 1), send(0, 1, 0, 1), recv(1, 0, 0, 0), recv(1, 0, 1, 0)], 2, [2, 1])
    with pytest.raises(IRFormatError, match="used by two TBs"):
        check_structure(ir)


def test_unsorted_rejected():
    ir = make_ir([send(0, 0, 1, 1), send(0, 0, 0, 1), recv(1, 0, 0, 0), recv(1, 0, 1, 0)], 2, [1, 1])
    with pytest.raises(IRFormatError, match="sorted"):
        check_structure(ir)
    ir.sort_canonical()
    check_structure(ir)


@given(st.data())
@settings(max_examples=60)
def test_random_column_mutation_never_crashes(data):
    """Any single-cell mutation either passes every check or raises IRFormatError (no traceback)."""
    ir = _base()
    col = data.draw(st.sampled_from(list(PRIM_COLUMNS)))
    i = data.draw(st.integers(0, ir.nprims - 1))
    v = data.draw(st.integers(-3, 40))
    ir.prims[col][i] = v
    try:
        check_structure(ir)
        check_fifo_order(ir)
        check_deadlock(ir)
    except IRFormatError as exc:
        assert str(exc)


# ------------------------------------------------------------------------------ JSON
def _same_ir(a: ProgramIR, b: ProgramIR):
    for k in PRIM_COLUMNS:
        assert np.array_equal(a.prims[k], b.prims[k]) and a.prims[k].dtype == b.prims[k].dtype, k
    assert np.array_equal(a.dep_prim, b.dep_prim) and np.array_equal(a.dep_on, b.dep_on)
    assert np.array_equal(a.ntbs, b.ntbs)
    for k in ("name", "collective", "nranks", "nchunks", "in_chunks", "out_chunks", "scratch_chunks",
              "nwarps", "chunk_bytes", "npipelines", "stats"):
        assert getattr(a, k) == getattr(b, k), k


@given(algorithms(max_ranks=5), st.sampled_from(["state", "connection"]))
@settings(max_examples=25)
def test_json_round_trip(alg, mode):
    ir = build_program(alg, tb_alloc=mode)
    text = ir.to_json()
    back = load_ir_json(text)
    _same_ir(ir, back)
    assert back.to_json() == text


def test_json_rejects_corrupted_ir():
    ir = build_program(G.ring_allgather(3))
    import json
    d = json.loads(ir.to_json())
    d["prims"]["send_peer"][0] = 7
    with pytest.raises(IRFormatError):
        load_ir_json(json.dumps(d))


@given(st.lists(st.integers(-(2 ** 40), 2 ** 40), max_size=300) | st.lists(st.integers(-3, 40), max_size=3000))
@settings(max_examples=60, deadline=None)
def test_int_list_text_is_the_plain_join(vals):
    """The IR writer's fast integer-list text equals the obvious ",".join(map(str, ...))."""
    from hccc.compiler.ir.program_ir import int_list_text
    a = np.asarray(vals, dtype=np.int64)
    assert int_list_text(a) == ",".join(map(str, vals))
    assert int_list_text(a.astype(np.int32) if len(vals) and max(map(abs, vals)) < 2 ** 31 else a) == \
        ",".join(map(str, vals))
