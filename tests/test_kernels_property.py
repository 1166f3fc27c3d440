"""Property: for random valid programs of every collective (``hccc.testing.valid_programs``: rings,
trees, full meshes, recursive doubling, HM shapes, odd rank counts, relabelled ranks, renumbered
steps), the emitted kernels run on the CPU emulation produce exactly what the reference executor
computes, and that is the collective, at random sizes, dtypes, operators, in-place or not, with one
or several threads per thread block. Every element type and operator of ``hccc.util.dtypes`` is
drawn (the int64 / uint8 / float64 types and the prod / avg operators by tests of their own, a few
builds by default and many in the slow set).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.passes.build import build_program
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.frontend import generators as gen
from hccc.util import dtypes as dtypes_table
from hccc.testing import (assert_implements, assert_kernels_match, describe_failure, kernel_cases,
                          run_case, valid_programs)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                        "alltoall"])
# four builds a collective by default (two sizes each; the channel, fused-channel, direct-mode and
# one-grid files run random programs of every collective too); the thorough profile ten times that
@settings(max_examples=examples(4))
@given(data=st.data())
def test_random_programs_kernels_match_oracle(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    chunk = data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes")
    ir = build_program(alg, chunk_bytes=chunk)
    dtype = data.draw(st.sampled_from(["float32", "float16", "bfloat16", "int32"]), label="dtype")
    op = data.draw(st.sampled_from(["sum", "max", "min"]), label="op")
    for _ in range(2):   # two sizes per build
        case = data.draw(kernel_cases(ir, dtypes=[dtype], ops=[op], max_microbatches=12), label="case")
        res = run_case(ir, case)
        assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)
        assert res.oracle == "reference"


#: the (dtype, op) pairs of the types and operators beyond float32 / float16 / bfloat16 / int32 and
#: sum / max / min (hccc.util.dtypes: every pair the kernels instantiate)
NEW_PAIRS = [(d.name, o.name) for d, o in dtypes_table.instances()
             if d.name in ("int64", "uint8", "float64") or o.name in ("prod", "avg")]


def _new_pairs_match(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    chunk = data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes")
    ir = build_program(alg, chunk_bytes=chunk)
    dtype, op = data.draw(st.sampled_from(NEW_PAIRS), label="dtype, op")
    for _ in range(2):   # two sizes per build
        case = data.draw(kernel_cases(ir, dtypes=[dtype], ops=[op], max_microbatches=12), label="case")
        res = run_case(ir, case)
        assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)
        assert res.oracle == "reference"


# one build per collective in the default set (a reduction, a scattered reduction, a pure move of
# 1- and 8-byte elements); every collective and more examples in the slow set
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "alltoall"])
@settings(max_examples=examples(1))
@given(data=st.data())
def test_new_types_and_ops_kernels_match_oracle(collective, data):
    _new_pairs_match(collective, data)


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                        "alltoall"])
@settings(max_examples=examples(6))
@given(data=st.data())
def test_new_types_and_ops_kernels_match_oracle_thoroughly(collective, data):
    _new_pairs_match(collective, data)


def test_assert_implements_runs_the_kernels():
    alg = gen.ring_allreduce(5, [0, 3, 1, 4, 2])
    assert_implements(alg, backend="cpu", counts=[0, 7, 5 * 64 * 3 + 2], dtypes=["int32"],
                      ops=["max"], chunk_bytes=64)


def test_assert_kernels_match_reports_a_program_that_is_not_the_collective():
    alg = gen.ring_allreduce(3)
    ir = build_program(alg, chunk_bytes=64)
    i = int(np.flatnonzero(ir.prims["op"] == Op.RECV_REDUCE_COPY)[0])
    ir.prims["op"][i] = Op.RECV
    ir.prims["src_buf"][i] = Buf.NONE
    ir.prims["src_off"][i] = 0
    with pytest.raises(AssertionError, match="does not implement allreduce"):
        assert_kernels_match(ir, counts=[99], dtypes=["int32"], inplace=[False])
