"""Receive groups (``compiler/ir/reduce_groups.py``): a thread block's consecutive receive-reduces
into one destination run as one N-source unit (``hccc_pd::nsrc``). The groups are checked against
their conditions written out here row by row (plain loops over the primitive table), the deadlock
proof with groups against a program whose grouping would deadlock, and the kernels that run them
against the reference executor (the rows one by one) in the CPU emulation: the one-shot AllReduce
at several rank counts, dtypes and ops, in and out of place, Simple and LL, both code-generation
modes, channels; random all-to-all reduce programs of randomised receive orders and send layouts."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_fifo_order, check_structure
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, Op, ProgramIR
from hccc.compiler.ir.reduce_groups import GROUP_RECVS, UNIT_PIECES, reduce_groups

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


# ---------------------------------------------------------------- programs
def _ir(rows: list[dict], deps: list[tuple[int, int]], n: int, nchunks: int, name: str) -> ProgramIR:
    """A ProgramIR from rows (column -> value; the others default) and (waiting, awaited) row pairs."""
    defaults = {"pipeline": 0, "channel": 0, "send_peer": -1, "recv_peer": -1, "src_buf": int(Buf.NONE),
                "src_off": 0, "dst_buf": int(Buf.NONE), "dst_off": 0, "task": -1, "task2": -1}
    prims = {k: np.array([r.get(k, defaults.get(k, 0)) for r in rows], dtype=dt) for k, dt in PRIM_COLUMNS.items()}
    ntbs = np.zeros(n, np.int32)
    for r in rows:
        ntbs[r["rank"]] = max(ntbs[r["rank"]], r["tb"] + 1)
    ir = ProgramIR(name=name, collective="allreduce", nranks=n, nchunks=nchunks, in_chunks=nchunks,
                   out_chunks=nchunks, scratch_chunks=nchunks, prims=prims,
                   dep_prim=np.array([a for a, _ in deps], np.int64), dep_on=np.array([b for _, b in deps], np.int64),
                   nwarps=4, chunk_bytes=64 * nchunks, npipelines=1, ntbs=ntbs)
    ir.sort_canonical()
    return ir


def all_to_all_reduce(n: int, orders: list[list[int]], shared_sends: list[bool]) -> ProgramIR:
    """An AllReduce in the one-shot's shape: rank r copies its input to scratch, sends the copy to
    every peer (each send its own thread block, or all in one in ``orders[r]``'s order when
    ``shared_sends[r]``) and reduces the peers' messages into its output in ``orders[r]``'s order
    (the first with its input), in one thread block."""
    rows: list[dict] = []
    deps: list[tuple[int, int]] = []
    for r in range(n):
        copy = len(rows)
        rtb = 0 if shared_sends[r] else n - 1
        stb = 1 if shared_sends[r] else None
        rows.append(dict(rank=r, tb=rtb, seq=0, op=int(Op.COPY), src_buf=int(Buf.INPUT), dst_buf=int(Buf.SCRATCH), count=n))
        for k, s in enumerate(orders[r]):      # the sends, to the peers in this rank's order
            tb = stb if stb is not None else k
            deps.append((len(rows), copy))
            rows.append(dict(rank=r, tb=tb, seq=k if stb is not None else 0, op=int(Op.SEND), send_peer=s,
                             src_buf=int(Buf.SCRATCH), count=n))
        for k, s in enumerate(orders[r]):      # the receives, from the peers in this rank's order
            rows.append(dict(rank=r, tb=rtb, seq=1 + k, op=int(Op.RECV_REDUCE_COPY), recv_peer=s,
                             src_buf=int(Buf.INPUT if k == 0 else Buf.OUTPUT), dst_buf=int(Buf.OUTPUT), count=n))
    return _ir(rows, deps, n, n, f"all_to_all_reduce_{n}")


# ---------------------------------------------------------------- the conditions, row by row
def _conditions_hold(ir: ProgramIR, groups) -> None:
    """Every group satisfies reduce_groups' conditions, checked one row at a time."""
    p = {k: v.tolist() for k, v in ir.prims.items()}
    waiting = set(np.asarray(ir.dep_prim).tolist())
    awaited = set(np.asarray(ir.dep_on).tolist())
    covered = set()
    for s, k in groups:
        assert 2 <= k <= GROUP_RECVS
        conns = set()
        for j in range(s, s + k):
            assert j not in covered
            covered.add(j)
            assert p["op"][j] == int(Op.RECV_REDUCE_COPY)
            assert 1 <= p["count"][j] <= UNIT_PIECES and p["count"][j] == p["count"][s]
            assert (p["rank"][j], p["tb"][j], p["seq"][j]) == (p["rank"][s], p["tb"][s], p["seq"][s] + j - s)
            assert (p["dst_buf"][j], p["dst_off"][j]) == (p["dst_buf"][s], p["dst_off"][s])
            assert (p["recv_peer"][j], p["channel"][j]) not in conns
            conns.add((p["recv_peer"][j], p["channel"][j]))
            if j > s:
                assert (p["src_buf"][j], p["src_off"][j]) == (p["dst_buf"][j], p["dst_off"][j])
                assert j not in waiting
            if j < s + k - 1:
                assert j not in awaited


@pytest.mark.parametrize("n", range(2, 11))
def test_the_one_shot_reduces_each_ranks_receives_in_one_unit(n):
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    ir = one_shot_allreduce(n)
    groups = reduce_groups(ir)
    _conditions_hold(ir, groups)
    # its receives: n - 1 rows of n chunks a rank, one group where a unit round holds n chunks
    recv_rows = [i for i in range(ir.nprims) if int(ir.prims["op"][i]) == int(Op.RECV_REDUCE_COPY)]
    if 3 <= n <= UNIT_PIECES:
        assert [k for _, k in groups] == [n - 1] * n
        assert sorted(s for s, _ in groups) == recv_rows[::n - 1]
    else:
        assert groups == []


def test_a_dependency_cuts_a_group():
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    ir = one_shot_allreduce(5)
    first = [s for s, _ in reduce_groups(ir)]
    # a send of rank 1 now waits for rank 0's first receive: the group starts after it
    send = int(np.flatnonzero((ir.prims["rank"] == 1) & (ir.prims["op"] == int(Op.SEND)))[0])
    ir.dep_prim = np.r_[ir.dep_prim, send]
    ir.dep_on = np.r_[ir.dep_on, first[0]]
    check_deadlock(ir)
    groups = reduce_groups(ir)
    _conditions_hold(ir, groups)
    assert (first[0] + 1, 3) in groups and all(s != first[0] for s, _ in groups)


def test_a_repeated_connection_cuts_a_group():
    # rank 0 receives twice from rank 1 (two messages on one connection) and once from rank 2
    rows = [dict(rank=1, tb=0, seq=0, op=int(Op.SEND), send_peer=0, src_buf=int(Buf.INPUT), count=1),
            dict(rank=1, tb=0, seq=1, op=int(Op.SEND), send_peer=0, src_buf=int(Buf.INPUT), count=1),
            dict(rank=2, tb=0, seq=0, op=int(Op.SEND), send_peer=0, src_buf=int(Buf.INPUT), count=1)]
    rows += [dict(rank=0, tb=0, seq=k, op=int(Op.RECV_REDUCE_COPY), recv_peer=s, src_buf=int(Buf.OUTPUT),
                  dst_buf=int(Buf.OUTPUT), count=1) for k, s in enumerate((1, 1, 2))]
    ir = _ir(rows, [], 3, 1, "repeated")
    check_structure(ir)
    check_fifo_order(ir)
    groups = reduce_groups(ir)
    _conditions_hold(ir, groups)
    assert groups == [(1, 2)]      # rows: rank 0's three receives first; the second and third


def test_a_grouping_that_would_deadlock_is_not_formed():
    """Rank 0 reduces rank 1's and rank 2's messages; rank 2 sends only after it has received from
    rank 1, which sends to rank 2 only after all of its messages to rank 0. One by one the rows run
    (rank 0 drains rank 1 first); as one unit, rank 0 would wait for rank 2's first message, which
    waits for rank 1, which waits for rank 0 to free its slots: the proof refuses the group."""
    rows = [dict(rank=0, tb=0, seq=0, op=int(Op.RECV_REDUCE_COPY), recv_peer=1, src_buf=int(Buf.INPUT),
                 dst_buf=int(Buf.OUTPUT), count=1),
            dict(rank=0, tb=0, seq=1, op=int(Op.RECV_REDUCE_COPY), recv_peer=2, src_buf=int(Buf.OUTPUT),
                 dst_buf=int(Buf.OUTPUT), count=1),
            dict(rank=1, tb=0, seq=0, op=int(Op.SEND), send_peer=0, src_buf=int(Buf.INPUT), count=1),
            dict(rank=1, tb=0, seq=1, op=int(Op.SEND), send_peer=2, src_buf=int(Buf.INPUT), count=1),
            dict(rank=2, tb=0, seq=0, op=int(Op.RECV), recv_peer=1, dst_buf=int(Buf.SCRATCH), count=1),
            dict(rank=2, tb=0, seq=1, op=int(Op.SEND), send_peer=0, src_buf=int(Buf.SCRATCH), count=1)]
    ir = _ir(rows, [], 3, 1, "would_deadlock")
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)                                   # one by one: deadlock-free
    with pytest.raises(DeadlockError):
        check_deadlock(ir, groups=[(0, 2)])              # as one unit: a wait cycle
    assert reduce_groups(ir) == []


def _draw_all_to_all_reduce(data, least: int, most: int):
    """A deadlock-free all-to-all reduce of ``least`` to ``most`` ranks, each rank's receive order
    and whether its sends share a chunk drawn (other draws are rejected)."""
    n = data.draw(st.integers(least, most), label="ranks")
    orders = [data.draw(st.permutations([s for s in range(n) if s != r]), label=f"order{r}") for r in range(n)]
    shared = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="shared sends")
    ir = all_to_all_reduce(n, orders, shared)
    try:
        check_deadlock(ir)
    except DeadlockError:
        assume(False)
    return ir


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_groups_hold_their_conditions(data):
    ir = _draw_all_to_all_reduce(data, 2, 9)
    n = ir.nranks
    groups = reduce_groups(ir)
    _conditions_hold(ir, groups)
    check_deadlock(ir, groups=groups)
    # every rank's receives of at most UNIT_PIECES chunks form runs of at most GROUP_RECVS rows, or none
    for s, k in groups:
        assert k == min(n - 1, GROUP_RECVS)


# ---------------------------------------------------------------- the kernels
@needs_gxx
@pytest.mark.parametrize("n,dtype,op", [(3, "float32", "sum"), (4, "float16", "avg"), (5, "int32", "prod"),
                                        (8, "bfloat16", "max"), (6, "uint8", "min"), (4, "float64", "sum"),
                                        (3, "int64", "sum")])
def test_the_one_shot_runs_its_n_source_units_correct(n, dtype, op):
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.testing import assert_kernels_match, kernel_runner
    ir = one_shot_allreduce(n, chunk_bytes=64 * n)
    assert reduce_groups(ir)
    counts = [0, 1, n, 5 * n + 3, 24 * n + 1]           # many micro-batches: the FIFOs wrap
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts, inplace=(False, True))
    runner = kernel_runner(ir, "cpu", dtype, op)
    for count in counts[1:]:
        for inplace in (False, True):
            res = runner.run(count=count, proto="ll", inplace=inplace)
            assert res.ok and res.proto == "ll", (count, inplace, res)


@needs_gxx
@pytest.mark.parametrize("k", [2, 3])
def test_n_source_units_with_channels_and_table_kernels(k):
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.compiler.passes.channels import with_channels
    from hccc.testing import KernelCase, run_case
    ir = with_channels(one_shot_allreduce(4, chunk_bytes=256), k)
    for codegen in ("specialized", "table"):
        for proto in ("simple", "ll"):
            for count in (4 * 37 + 3, 4 * 300 + 1):
                for inplace in (False, True):
                    case = KernelCase(count, "float32", "sum", inplace, 3)
                    res = run_case(ir, case, codegen=codegen, proto=proto)
                    assert res.ok, (codegen, proto, case, res)


@needs_gxx
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_n_source_programs_match_the_reference(data):
    from hccc.testing import describe_failure, kernel_cases, run_case
    ir = _draw_all_to_all_reduce(data, 3, 5)
    from hccc.compiler.ir.symbolic import prove
    for inplace in (False, True):
        prove(ir, inplace)
    case = data.draw(kernel_cases(ir, dtypes=["float32", "int32", "float16"], ops=["sum", "max", "prod"],
                                  max_microbatches=12), label="case")
    codegen = data.draw(st.sampled_from(["specialized", "table"]), label="codegen")
    proto = data.draw(st.sampled_from(["simple", "ll"]), label="proto")
    res = run_case(ir, case, codegen=codegen, proto=proto)
    assert res.ok, (codegen, proto, reduce_groups(ir), describe_failure(case, res))
