"""Reference executor (runtime/reference.py): runs lowered programs and must compute the collective."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.compiler.frontend.algorithm import Collective
from hccc.compiler.passes.build import build_from_schedule, build_program
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.ir.extents import ExtentError
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.runtime.reference import (chunk_bounds, execute, expected, expected_for, input_length, inputs_for,
                                    make_inputs, round_bf16)

from random_programs import EXAMPLES, algorithms, step_schedule


def _equal(out, exp):
    """Every defined output equal (``None``: the collective leaves that rank's output unspecified)."""
    return len(out) == len(exp) and all(
        b is None or (a.shape == b.shape and np.array_equal(a, b, equal_nan=False)) for a, b in zip(out, exp))


@given(algorithms(max_ranks=6), st.integers(0, 40), st.booleans(), st.sampled_from([None, 1, 2, 3]),
       st.sampled_from(["sum", "max", "min"]), st.sampled_from(["float32", "int32", "float16"]),
       st.integers(0, 3), st.sampled_from(["hpds", "rr", "step"]))
@settings(max_examples=80)
def test_lowered_random_programs_compute_the_collective(alg, count, inplace, nmicro, op, dtype, seed,
                                                        scheduler):
    dag = build_dag(alg)
    if scheduler == "step":
        sched = step_schedule(alg)
    else:
        from hccc.compiler.passes.build import schedule_algorithm
        sched = schedule_algorithm(alg, dag, scheduler)
    ir = build_from_schedule(alg, dag, sched)
    ins = inputs_for(ir, count, dtype, seed=seed)
    out = execute(ir, ins, op=op, inplace=inplace, nmicro=nmicro, seed=seed)
    assert _equal(out, expected_for(ir, ins, op))


@pytest.mark.parametrize("make", EXAMPLES)
@pytest.mark.parametrize("inplace", [False, True])
def test_examples_compute_the_collective(make, inplace):
    alg = make()
    ir = build_program(alg)
    n = alg.header.nranks
    for count in (n, 3 * n + 1):
        ins = inputs_for(ir, count, "float32", seed=count)
        assert _equal(execute(ir, ins, inplace=inplace, nmicro=2), expected_for(ir, ins))


def test_bfloat16_emulation():
    alg = G.ring_allreduce(4)
    ir = build_program(alg)
    ins = make_inputs("allreduce", 4, 13, "bfloat16", seed=3)
    out = execute(ir, ins, bf16=True)
    exp = expected("allreduce", ins, bf16=True)
    assert _equal(out, exp)
    assert all(np.array_equal(round_bf16(o), o) for o in out)


def test_round_bf16_known_values():
    one = np.float32(1.0)
    ulp = 2.0 ** -7
    x = np.array([1.0, 1 + ulp / 2, 1 + 1.5 * ulp, 1 + 0.75 * ulp, -2.5, np.inf, 3.0e38], np.float32)
    got = round_bf16(x)
    assert got[0] == one
    assert got[1] == one                       # tie -> even
    assert got[2] == np.float32(1 + 2 * ulp)   # tie -> even (upwards)
    assert got[3] == np.float32(1 + ulp)
    assert got[4] == np.float32(-2.5) and np.isinf(got[5])
    assert np.isnan(round_bf16(np.array([np.nan], np.float32)))[0]


def test_expected_is_the_collective():
    a = [np.array([1, 2, 3, 4, 5], np.int32), np.array([10, 20, 30, 40, 50], np.int32)]
    ar = expected("allreduce", a)
    assert all(x.tolist() == [11, 22, 33, 44, 55] for x in ar)
    rs = expected("reducescatter", a)
    # 5 elements in 2 chunks: [0, 2) and [2, 5)
    assert rs[0].tolist() == [11, 22] and rs[1].tolist() == [33, 44, 55]
    assert expected("reducescatter", a, "max")[1].tolist() == [30, 40, 50]
    assert expected("allreduce", a, "min")[0].tolist() == [1, 2, 3, 4, 5]
    ag = expected("allgather", [np.array([1], np.int32), np.array([2, 3], np.int32)])
    assert all(x.tolist() == [1, 2, 3] for x in ag)


def test_chunk_bounds_and_input_lengths():
    assert chunk_bounds(10, 4).tolist() == [0, 2, 5, 7, 10]
    assert chunk_bounds(2, 4).tolist() == [0, 0, 1, 1, 2]
    assert [input_length("allgather", r, 4, 4, 10) for r in range(4)] == [2, 3, 2, 3]
    assert input_length("allreduce", 1, 4, 4, 10) == 10


def test_executor_catches_a_wrong_program():
    alg = G.ring_allreduce(3)
    ir = build_program(alg)
    ins = make_inputs("allreduce", 3, 9, "int32", seed=1)
    assert _equal(execute(ir, ins), expected("allreduce", ins))
    # a receive that stores where a reduction belongs: the result must differ
    wrong = build_program(alg)
    i = int(np.flatnonzero(wrong.prims["op"] == Op.RECV_REDUCE_COPY)[0])
    wrong.prims["op"][i] = Op.RECV
    wrong.prims["src_buf"][i] = Buf.NONE
    wrong.prims["src_off"][i] = 0
    assert not _equal(execute(wrong, ins), expected("allreduce", ins))
    # redirecting a receive to another chunk makes its message the wrong size at some counts
    i = int(np.flatnonzero(ir.prims["op"] == Op.RECV)[0])
    ir.prims["dst_off"][i] = (ir.prims["dst_off"][i] + 1) % 3
    with pytest.raises(ExtentError, match="differ in size at 1 element "):
        execute(ir, ins)


def test_executor_catches_a_missing_dependency():
    """Dropping every cross-TB dependency breaks some random topological order."""
    alg = G.hm_allreduce(2, 2)
    ir = build_program(alg, scheduler="rr")
    ins = make_inputs("allreduce", 4, 8, "int32", seed=5)
    exp = expected("allreduce", ins)
    assert len(ir.dep_prim)
    for s in range(5):
        assert _equal(execute(ir, ins, seed=s), exp)
    ir.dep_prim = ir.dep_prim[:0]
    ir.dep_on = ir.dep_on[:0]
    assert any(not _equal(execute(ir, ins, seed=s), exp) for s in range(40))


def test_out_of_place_unwritten_output_shows_garbage():
    alg = G.ring_allgather(3)
    ir = build_program(alg)
    # drop the local copies (own chunk): out-of-place output then lacks the own chunk
    keep = ir.prims["op"] != Op.COPY
    assert (~keep).sum() == 3
    ins = make_inputs("allgather", 3, 6, "float32")
    out = execute(ir, ins)
    assert _equal(out, expected("allgather", ins))
    ir.prims["op"][~keep] = Op.NOP
    ir.prims["src_buf"][~keep] = Buf.NONE
    ir.prims["dst_buf"][~keep] = Buf.NONE
    out = execute(ir, ins)
    assert all(np.isnan(o).any() for o in out)
    # in place the own chunk is already in the output
    assert _equal(execute(ir, ins, inplace=True), expected("allgather", ins))


def test_reducescatter_uses_scratch_and_inplace_aliasing():
    alg = G.ring_reducescatter(4)
    ir = build_program(alg)
    assert ir.scratch_chunks == 4 and ir.out_chunks == 1
    assert (ir.prims["dst_buf"] == Buf.SCRATCH).any()
    ins = make_inputs("reducescatter", 4, 11, "int32", seed=2)
    for inplace in (False, True):
        assert _equal(execute(ir, ins, inplace=inplace), expected("reducescatter", ins))


def test_bad_inputs_rejected():
    ir = build_program(G.ring_allreduce(3))
    with pytest.raises(ValueError):
        execute(ir, [np.zeros(3, np.float32)] * 2)
    with pytest.raises(ValueError):
        execute(ir, [np.zeros(3, np.float32), np.zeros(4, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ValueError):
        execute(ir, [np.zeros(3, np.float32)] * 3, op="xor")
    with pytest.raises(ValueError, match="integer"):
        execute(ir, [np.zeros(3, np.int64)] * 3, op="avg")
    with pytest.raises(ValueError):
        make_inputs("allreduce", 3, 3, "complex64")


@pytest.mark.parametrize("coll", list(Collective))
def test_one_rank(coll):
    from hccc.compiler.frontend.algorithm import Algorithm, Header
    alg = Algorithm.from_rows(Header(nranks=1, collective=coll, name="one"), [])
    ir = build_program(alg)
    ins = make_inputs(coll.value, 1, 5, "int32")
    for inplace in (False, True):
        assert _equal(execute(ir, ins, inplace=inplace), expected(coll.value, ins))


def test_rooted_definitions():
    a = [np.array([1, 2, 3, 4], np.int32), np.array([10, 20, 30, 40], np.int32), np.array([5, 5, 5, 5], np.int32)]
    bc = expected("broadcast", a, root=1)
    assert all(x.tolist() == [10, 20, 30, 40] for x in bc)
    rd = expected("reduce", a, "max", root=2)
    assert rd[0] is None and rd[1] is None and rd[2].tolist() == [10, 20, 30, 40]


def test_reduce_leaves_non_root_outputs_alone():
    """A Reduce's partial sums on non-root ranks live in scratch: their outputs stay untouched."""
    ir = build_program(G.ring_reduce(4, root=2, chunks_per_rank=2))
    ins = inputs_for(ir, 17, "float32", seed=1)
    out = execute(ir, ins)
    assert np.array_equal(out[2], np.sum(ins, axis=0))
    for r in (0, 1, 3):
        assert np.isnan(out[r]).all()
