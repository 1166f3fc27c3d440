"""Lowering (compiler/passes/lower.py) and the middle of the pipeline (compiler/passes/build.py).

The random valid programs (tests/random_programs.py) are checked here with the verifier.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header
from hccc.compiler.passes.build import build_from_schedule, build_program, sanitize_identifier
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure
from hccc.compiler.passes.lower import buffer_sizes, lower
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.passes.schedule import Schedule
from hccc.compiler.passes.verify import verify

from random_programs import EXAMPLES, algorithms, random_algorithm, step_schedule


# ------------------------------------------------------------------------------ tests
def test_random_generator_makes_valid_programs():
    for coll in Collective:
        for n in (1, 2, 3, 5):
            for seed in range(4):
                verify(random_algorithm(coll, n, seed))


def _lower_checked(alg, sched=None, **kw):
    dag = build_dag(alg)
    sched = sched if sched is not None else step_schedule(alg)
    low = lower(alg, dag, sched, **kw)
    return dag, sched, low


def test_every_transfer_becomes_one_send_and_one_receive():
    alg = G.hm_allreduce(2, 4)
    _, _, low = _lower_checked(alg, fuse=False)
    c = low.cols
    sends = c["op"] == Op.SEND
    recvs = np.isin(c["op"], [Op.RECV, Op.RECV_REDUCE_COPY])
    assert sends.sum() == recvs.sum() == alg.ntransfers
    assert np.array_equal(np.sort(c["task"][sends]), np.arange(alg.ntransfers))
    assert np.array_equal(np.sort(c["task"][recvs]), np.arange(alg.ntransfers))
    t = c["task"][sends]
    assert np.array_equal(c["rank"][sends], alg.src[t]) and np.array_equal(c["send_peer"][sends], alg.dst[t])
    t = c["task"][recvs]
    assert np.array_equal(c["rank"][recvs], alg.dst[t]) and np.array_equal(c["recv_peer"][recvs], alg.src[t])
    assert np.array_equal(c["op"][recvs] == Op.RECV_REDUCE_COPY, alg.op[t] == RRC)


def _oracle_locations(alg):
    """Per task, by brute force: (send src buf, off), (recv dst buf, off), (recv reduce src buf, off)."""
    coll = alg.header.collective
    k, root = alg.header.chunks_per_rank, alg.header.root
    first = {}
    for i, (s, d, stp, c, o) in enumerate(alg.rows()):
        first[(d, c)] = min(first.get((d, c), stp), stp)

    def wloc(r, c):
        if coll in (Collective.REDUCESCATTER, Collective.SCATTER):
            return (Buf.OUTPUT, c % k) if c // k == r else (Buf.SCRATCH, c)
        if coll in (Collective.REDUCE, Collective.GATHER):
            return (Buf.OUTPUT, c) if r == root else (Buf.SCRATCH, c)
        return (Buf.OUTPUT, c)

    def inloc(r, c):
        return (Buf.INPUT, c % k if coll in (Collective.ALLGATHER, Collective.GATHER) else c)

    out = []
    for i, (s, d, stp, c, o) in enumerate(alg.rows()):
        snd = inloc(s, c) if stp < first.get((s, c), 1 << 62) else wloc(s, c)
        red = None
        if o == RRC:
            red = inloc(d, c) if stp <= first[(d, c)] else wloc(d, c)
        out.append((snd, wloc(d, c), red))
    return out


@given(algorithms())
@settings(max_examples=40)
def test_buffer_mapping_matches_brute_force(alg):
    if alg.header.collective is Collective.ALLTOALL:
        _check_alltoall_mapping(alg)
        return
    if alg.header.collective is Collective.SENDRECV:
        _check_sendrecv_mapping(alg)
        return
    _, _, low = _lower_checked(alg, fuse=False)
    c = low.cols
    want = _oracle_locations(alg)
    for i in range(low.nprims):
        t = int(c["task"][i])
        op = Op(int(c["op"][i]))
        if op == Op.COPY:
            continue
        snd, dstloc, red = want[t]
        if op == Op.SEND:
            assert (c["src_buf"][i], c["src_off"][i]) == snd
            assert c["dst_buf"][i] == Buf.NONE
        else:
            assert (c["dst_buf"][i], c["dst_off"][i]) == dstloc
            if op == Op.RECV_REDUCE_COPY:
                assert (c["src_buf"][i], c["src_off"][i]) == red
            else:
                assert c["src_buf"][i] == Buf.NONE
    h = alg.header
    assert (low.in_chunks, low.out_chunks, low.scratch_chunks) == buffer_sizes(h.collective, h.nranks,
                                                                              h.chunks_per_rank)


def _check_alltoall_mapping(alg):
    """AllToAll's mapping by brute force: sends of a block on its source before anything arrives
    there read input slot j*K + k; everything else reads where it was written; arrivals at the
    destination go to output slot i*K + k or, when they would land before the block leaving that
    slot is sent, to scratch and a final copy; transit copies go to scratch, one slot per
    (rank, chunk), of the piece's size class."""
    h = alg.header
    N, K = h.nranks, h.chunks_per_rank
    _, sched, low = _lower_checked(alg, fuse=False)
    c = low.cols
    assert (low.in_chunks, low.out_chunks, low.nchunks) == (N * K, N * K, N * K)
    where = {}    # (rank, chunk) -> written location
    for i in range(low.nprims):
        if Op(int(c["op"][i])) in (Op.RECV,):
            t = int(c["task"][i])
            key = (int(alg.dst[t]), int(alg.chunk[t]))
            loc = (int(c["dst_buf"][i]), int(c["dst_off"][i]))
            assert where.setdefault(key, loc) == loc
    first = {}
    for (s, d, stp, ch, o) in alg.rows():
        first[(d, ch)] = min(first.get((d, ch), stp), stp)
    scratch_slots = {}
    copies = {(int(c["rank"][i]), int(c["src_buf"][i]), int(c["src_off"][i])): int(c["dst_off"][i])
              for i in np.flatnonzero(c["op"] == Op.COPY)}
    for (r, ch), (b, off) in where.items():
        i, j, k = ch // (N * K), (ch // K) % N, ch % K
        if b == Buf.SCRATCH:
            assert off % K == k and 0 <= off < low.scratch_chunks
            assert scratch_slots.setdefault((r, off), ch) == ch
            if j == r:   # an arrival parked in scratch is copied to its output slot at the end
                assert copies[(r, Buf.SCRATCH, off)] == i * K + k
        else:
            assert (b, off, j) == (Buf.OUTPUT, i * K + k, r)
    for i in np.flatnonzero(c["op"] == Op.SEND):
        t = int(c["task"][i])
        s, ch, stp = int(alg.src[t]), int(alg.chunk[t]), int(alg.step[t])
        if stp < first.get((s, ch), 1 << 62):
            assert ch // (N * K) == s
            assert (c["src_buf"][i], c["src_off"][i]) == (Buf.INPUT, ((ch // K) % N) * K + ch % K)
        else:
            assert (c["src_buf"][i], c["src_off"][i]) == where[(s, ch)]


def _check_sendrecv_mapping(alg):
    """SendRecv's mapping by brute force (shift ``s``): rank ``i``'s piece ``k`` (chunk ``i*K + k``)
    is read from input slot ``k`` on rank ``i`` until something arrives there; it arrives at
    ``(i + s) % N`` in output slot ``k``, or, when it would land before that rank's own piece ``k``
    (the same slot in place) has left, in scratch and a final copy to slot ``k``; every other
    arrival goes to scratch, one slot per (rank, chunk), of the piece's size class."""
    h = alg.header
    N, K, s = h.nranks, h.chunks_per_rank, h.root
    _, _, low = _lower_checked(alg, fuse=False)
    c = low.cols
    assert (low.in_chunks, low.out_chunks, low.nchunks) == (K, K, N * K)
    where = {}
    for i in np.flatnonzero(c["op"] == Op.RECV):
        t = int(c["task"][i])
        loc = (int(c["dst_buf"][i]), int(c["dst_off"][i]))
        assert where.setdefault((int(alg.dst[t]), int(alg.chunk[t])), loc) == loc
    copies = {(int(c["rank"][i]), int(c["src_buf"][i]), int(c["src_off"][i])): int(c["dst_off"][i])
              for i in np.flatnonzero(c["op"] == Op.COPY)}
    scratch_slots = {}
    for (r, ch), (b, off) in where.items():
        owner, k = divmod(ch, K)
        dest = (owner + s) % N
        if b == Buf.SCRATCH:
            assert off % K == k and 0 <= off < low.scratch_chunks
            assert scratch_slots.setdefault((r, off), ch) == ch
            if r == dest:
                assert copies[(r, Buf.SCRATCH, off)] == k
        else:
            assert (b, off, r) == (Buf.OUTPUT, k, dest)
    first = {}
    for (src, d, stp, ch, o) in alg.rows():
        first[(d, ch)] = min(first.get((d, ch), stp), stp)
    for i in np.flatnonzero(c["op"] == Op.SEND):
        t = int(c["task"][i])
        src, ch, stp = int(alg.src[t]), int(alg.chunk[t]), int(alg.step[t])
        if stp < first.get((src, ch), 1 << 62):
            assert ch // K == src and (c["src_buf"][i], c["src_off"][i]) == (Buf.INPUT, ch % K)
        else:
            assert (c["src_buf"][i], c["src_off"][i]) == where[(src, ch)]


def test_buffer_sizes():
    assert buffer_sizes(Collective.ALLGATHER, 8) == (1, 8, 0)
    assert buffer_sizes(Collective.REDUCESCATTER, 8) == (8, 1, 8)
    assert buffer_sizes(Collective.ALLREDUCE, 8) == (8, 8, 0)
    assert buffer_sizes(Collective.BROADCAST, 8) == (8, 8, 0)
    assert buffer_sizes(Collective.REDUCE, 8) == (8, 8, 8)
    assert buffer_sizes(Collective.ALLGATHER, 4, 3) == (3, 12, 0)
    assert buffer_sizes(Collective.REDUCESCATTER, 4, 3) == (12, 3, 12)
    assert buffer_sizes(Collective.ALLTOALL, 4, 3) == (12, 12, 0)


@pytest.mark.parametrize("k", [1, 3])
def test_allgather_gets_local_copy_of_own_chunks_in_one_primitive(k):
    """A rank's K own chunks: one copy of K chunks (a unit per micro-batch for them all)."""
    alg = G.ring_allgather(4) if k == 1 else G.split_chunks(G.ring_allgather(4), k)
    _, _, low = _lower_checked(alg)
    c = low.cols
    cp = np.flatnonzero(c["op"] == Op.COPY)
    assert sorted(c["rank"][cp].tolist()) == [0, 1, 2, 3]
    for i in cp:
        r = int(c["rank"][i])
        assert (c["src_buf"][i], c["src_off"][i], c["dst_buf"][i], c["dst_off"][i], c["count"][i]) == \
            (Buf.INPUT, 0, Buf.OUTPUT, k * r, k)


@given(algorithms())
@settings(max_examples=40)
def test_local_copies_are_one_primitive_per_run(alg):
    """The copies a rank makes of chunks no transfer writes: together (each primitive's count
    expanded) every such (rank, output chunk) once, from the slot of the rank's input that holds
    it; a primitive per run of consecutive slots, so an AllGather rank copies its K own chunks in
    one primitive (a unit per micro-batch, not K)."""
    from hccc.compiler.passes.verify import final_rows

    if alg.header.collective in (Collective.ALLTOALL, Collective.SENDRECV):
        return      # own blocks, parked arrivals: _check_alltoall_mapping, _check_sendrecv_mapping
    h = alg.header
    N, C = h.nranks, h.nchunks
    _, _, low = _lower_checked(alg, fuse=False)
    c = low.cols
    written = {(int(d), int(ch)) for d, ch in zip(alg.dst, alg.chunk)}
    rows = final_rows(h.collective, N, C, h.root)
    want = {(int(x // C), int(x % C)) for x in rows} - written
    got = []
    for i in np.flatnonzero(c["op"] == Op.COPY):
        r, n = int(c["rank"][i]), int(c["count"][i])
        assert c["dst_buf"][i] == Buf.OUTPUT and c["src_buf"][i] == Buf.INPUT
        for j in range(n):
            so, do = int(c["src_off"][i]) + j, int(c["dst_off"][i]) + j
            # a slot holds the rank's own chunks when the buffer is the rank's part only
            held = r * low.in_chunks + so if low.in_chunks * N == low.nchunks else so
            kept = r * low.out_chunks + do if low.out_chunks * N == low.nchunks else do
            assert held == kept, (r, so, do)
            got.append((r, kept))
    assert sorted(got) == sorted(want)
    # runs: no two copies of a rank that one primitive could have made
    cp = np.flatnonzero(c["op"] == Op.COPY)
    ends = {(int(c["rank"][i]), int(c["src_off"][i]) + int(c["count"][i]), int(c["dst_off"][i]) + int(c["count"][i]))
            for i in cp}
    assert not any((int(c["rank"][i]), int(c["src_off"][i]), int(c["dst_off"][i])) in ends for i in cp)


@pytest.mark.parametrize("coll", list(Collective))
def test_one_rank_program_is_a_local_copy(coll):
    alg = Algorithm.from_rows(Header(nranks=1, collective=coll, name="solo"), [])
    ir = build_program(alg)
    assert ir.nprims == 1 and ir.prims["op"][0] == Op.COPY and list(ir.ntbs) == [1]
    check_structure(ir)


def test_fusion_on_a_pipelined_chain():
    # chunk 0 travels 0 -> 1 -> 2 -> 3; one sub-pipeline holds the whole chain (task-level execution)
    h = Header(nranks=4, collective=Collective.ALLGATHER, name="chain")
    rows = [(0, 1, 0, 0, RECV), (1, 2, 1, 0, RECV), (2, 3, 2, 0, RECV)]
    rows += [(1, 0, 0, 1, RECV), (1, 2, 0, 1, RECV), (1, 3, 0, 1, RECV)]
    rows += [(2, 0, 0, 2, RECV), (2, 1, 1, 2, RECV), (2, 3, 0, 2, RECV)]
    rows += [(3, 0, 1, 3, RECV), (3, 1, 0, 3, RECV), (3, 2, 1, 3, RECV)]
    alg = Algorithm.from_rows(h, rows)
    verify(alg)
    dag = build_dag(alg)
    one = Schedule(np.zeros(len(rows), np.int32), np.argsort(alg.step, kind="stable"), "one")
    low = lower(alg, dag, one)
    c = low.cols
    fused = np.flatnonzero(c["op"] == Op.RECV_COPY_SEND)
    pairs = sorted((int(c["task"][i]), int(c["task2"][i])) for i in fused)
    assert (1, 2) in pairs
    # task 4 (1 -> 2, chunk 1) sits on task 1's link between tasks 0 and 1 in the sub-pipeline; the
    # fused chain 0 -> 1 -> 2 travels on a channel of its own, so it keeps its FIFO order there and
    # fusing 0 with 1 is legal
    assert (0, 1) in pairs
    ch = {int(c["task"][i]): int(c["channel"][i]) for i in range(low.nprims) if c["recv_peer"][i] >= 0}
    assert ch[0] == ch[1] == ch[2] >= 1 and ch[4] == 0
    # the (1,2,0,1) and (1,3,0,1) transfers are sends of rank 1's own chunk: never fused
    assert all(a not in (3, 4, 5) for a, _ in pairs)
    ir = build_from_schedule(alg, dag, one)
    assert ir.allocation.fused == low.nfused
    check_fifo_order(ir)
    # one sub-pipeline per step: the chain still fuses across sub-pipelines
    low2 = lower(alg, dag, step_schedule(alg))
    c2 = low2.cols
    pairs2 = {(int(c2["task"][i]), int(c2["task2"][i])) for i in np.flatnonzero(c2["task2"] >= 0)}
    assert {(0, 1), (1, 2)} <= pairs2
    ir2 = build_from_schedule(alg, dag, step_schedule(alg))
    check_fifo_order(ir2)
    check_deadlock(ir2)


@given(algorithms())
@settings(max_examples=40)
def test_fusion_conditions_hold(alg):
    dag = build_dag(alg)
    # everything in one sub-pipeline: as much fusion as possible
    sched = Schedule(np.zeros(alg.ntransfers, np.int32), np.argsort(alg.step, kind="stable"), "one")
    low = lower(alg, dag, sched)
    c = low.cols
    preds = {}
    for a, b in zip(dag.edge_src.tolist(), dag.edge_dst.tolist()):
        preds.setdefault(b, []).append(a)
    fused = np.flatnonzero(c["task2"] >= 0)
    seen_a, seen_b = set(), set()
    for i in fused:
        a, b = int(c["task"][i]), int(c["task2"][i])
        assert a not in seen_a and b not in seen_b
        seen_a.add(a), seen_b.add(b)
        assert alg.dst[a] == alg.src[b] and alg.chunk[a] == alg.chunk[b]
        # a is b's only predecessor that wrote b's source
        writers = [u for u in preds.get(b, []) if alg.dst[u] == alg.src[b]]
        assert writers == [a]
        assert Op(int(c["op"][i])) == (Op.RECV_REDUCE_COPY_SEND if alg.op[a] == RRC else Op.RECV_COPY_SEND)
        assert c["send_peer"][i] == alg.dst[b]
    # the fused sends have no separate SEND primitive
    plain = set(c["task"][c["op"] == Op.SEND].tolist())
    assert plain.isdisjoint(seen_b) and plain | seen_b == set(range(alg.ntransfers))


@pytest.mark.parametrize("make", EXAMPLES)
@pytest.mark.parametrize("scheduler", ["hpds", "rr"])
def test_examples_lower_deadlock_free(make, scheduler):
    alg = make()
    ir = build_program(alg, scheduler=scheduler)
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)
    s = ir.record()          # the stats as the JSON form and the manifest write them
    for k in ("transfers", "subpipelines", "tbs_state_based", "tbs_connection_based", "tbs_per_rank_max",
              "scheduler", "tb_alloc"):
        assert k in s
    assert s["transfers"] == alg.ntransfers
    assert s["tbs_state_based"] <= s["tbs_connection_based"]
    assert s["scheduler"] == scheduler and s["tb_alloc"] == "state"


def test_hm_allreduce_4x8_fits_16_tbs():
    ir = build_program(G.hm_allreduce(4, 8))
    assert ir.allocation.tbs_per_rank_max <= 16
    assert ir.stats["transfers"] == 1984


@given(algorithms(), st.sampled_from(["hpds", "rr", "step", "one"]), st.sampled_from(["state", "connection"]))
@settings(max_examples=60)
def test_random_programs_lower_deadlock_free(alg, scheduler, mode):
    dag = build_dag(alg)
    if scheduler == "step":
        sched = step_schedule(alg)
    elif scheduler == "one":
        sched = Schedule(np.zeros(alg.ntransfers, np.int32), np.argsort(alg.step, kind="stable"), "one")
    else:
        from hccc.compiler.passes.build import schedule_algorithm
        sched = schedule_algorithm(alg, dag, scheduler)
    ir = build_from_schedule(alg, dag, sched, tb_alloc=mode)   # runs all three checks
    check_deadlock(ir)
    assert ir.allocation.tb_alloc == mode


def test_dependencies_stay_on_one_rank_and_cross_tbs():
    ir = build_program(G.hm_allreduce(2, 4), scheduler="rr")
    assert len(ir.dep_prim)
    assert np.array_equal(ir.prims["rank"][ir.dep_prim], ir.prims["rank"][ir.dep_on])
    assert (ir.prims["tb"][ir.dep_prim] != ir.prims["tb"][ir.dep_on]).all()


def test_tb_order_follows_pipeline_then_insertion():
    alg = G.ring_allreduce(4)
    dag = build_dag(alg)
    sched = step_schedule(alg)
    ir = build_from_schedule(alg, dag, sched, fuse=False)
    pos = sched.position()
    for sl in ir.tb_slices().values():
        pipe = ir.prims["pipeline"][sl].astype(np.int64)
        t = ir.prims["task"][sl]
        key = np.where(t >= 0, pipe * (len(pos) + 1) + pos[np.maximum(t, 0)], -1)
        assert (np.diff(key) > 0).all()


def test_sanitize_identifier():
    assert sanitize_identifier("HM") == "HM"
    assert sanitize_identifier("my algo-2!") == "my_algo_2"
    assert sanitize_identifier("9lives") == "_9lives"
    assert sanitize_identifier("") == "algo"
    assert sanitize_identifier("ü/../;rm -rf") == "rm_rf"
    assert len(sanitize_identifier("x" * 500)) == 64


@given(st.text(max_size=100))
def test_sanitize_identifier_property(text):
    import re
    s = sanitize_identifier(text)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", s)
    assert sanitize_identifier(text) == s


def test_build_program_name_and_determinism():
    alg = G.hm_allreduce(2, 4, name="HM all-reduce")
    a = build_program(alg)
    b = build_program(alg)
    assert a.name == "HM_all_reduce"
    assert a.to_json() == b.to_json()
    assert build_program(alg, name="x y").name == "x_y"


def test_unverified_allgather_errors_are_located_compile_errors():
    from hccc.util.diagnostics import CompileError
    h = Header(nranks=3, collective=Collective.ALLGATHER, name="bad")
    # rank 1 forwards chunk 0 before it receives it
    alg = Algorithm.from_rows(h, [(1, 2, 0, 0, RECV), (0, 1, 1, 0, RECV), (1, 0, 0, 1, RECV),
                                  (1, 2, 1, 1, RECV), (2, 0, 0, 2, RECV), (2, 1, 0, 2, RECV)])
    with pytest.raises(CompileError, match="rank 1 sends chunk 0 before holding it at step 0"):
        build_program(alg)
    # rank 2 never gets chunk 1
    alg = Algorithm.from_rows(h, [(0, 1, 0, 0, RECV), (0, 2, 0, 0, RECV), (1, 0, 0, 1, RECV),
                                  (2, 0, 0, 2, RECV), (2, 1, 0, 2, RECV)])
    with pytest.raises(CompileError, match="rank 2 never receives chunk 1"):
        build_program(alg)
