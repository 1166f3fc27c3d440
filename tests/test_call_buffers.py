"""A one-rank call's arrays (hccc.runtime.call_buffers): what the kernel of a rank gets as its
input and output for the caller's arrays, against the program's buffer layout
(hccc.runtime.launcher.program_layout, the oracle): the arrays themselves out of place, aliased at
the layout's offset in place, and refusals naming the array for the wrong size or an overlap."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.passes.build import build_program
from hccc.runtime.call_buffers import CallError, as_buf, call_arrays, full_count, route
from hccc.runtime.launcher import program_layout

_AG = build_program(gen.ring_allgather(4), chunk_bytes=256)
_AR = build_program(gen.ring_allreduce(4), chunk_bytes=256)


def _route(ir, rank, x, out, inplace):
    spec = SPECS[ir.collective]
    bx, bo = call_arrays("m", x, out, "cpu")
    count = full_count(spec, "m", bx, bo, 1, ir.nranks)
    return route(ir, spec, rank, "m", bx, bo, inplace, program_layout(ir, count)[rank], count, 4, "cpu")


@pytest.mark.parametrize("rank", range(4))
def test_all_gather_in_place_points_the_input_at_its_block_of_the_output(rank):
    out = np.zeros(40, np.float32)
    n_in, _, _, in_off, _ = program_layout(_AG, 40)[rank]
    x = out[in_off:in_off + n_in]                       # the rank's block of the output
    in_p, out_p, back = _route(_AG, rank, x, out, False)
    assert (in_p, out_p, back) == (out.ctypes.data + 4 * in_off, out.ctypes.data, None)


def test_out_of_place_takes_the_arrays_as_they_are_and_checks_their_sizes():
    x, out = np.zeros(10, np.float32), np.zeros(40, np.float32)
    assert _route(_AG, 1, x, out, False) == (x.ctypes.data, out.ctypes.data, None)
    with pytest.raises(ValueError, match="rank 1's input holds 11 elements"):
        _route(_AG, 1, np.zeros(11, np.float32), out, False)
    with pytest.raises(ValueError, match="overlap"):
        _route(_AG, 1, out[3:13], out, False)            # not the rank's block of the output


def test_in_place_all_reduce_is_one_buffer():
    x = np.zeros(64, np.float32)
    assert _route(_AR, 2, x, None, True) == (x.ctypes.data, x.ctypes.data, None)


def test_an_out_of_place_only_program_runs_in_place_through_a_copy():
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    ir.origin = dataclasses.replace(ir.origin, inplace=False)        # an MSCCL XML with inplace="0"
    x = np.zeros(64, np.float32)
    in_p, out_p, back = _route(ir, 0, x, None, True)
    assert in_p == x.ctypes.data and out_p != in_p
    tmp, dst, nbytes = back
    assert dst == x.ctypes.data and nbytes == 64 * 4 and tmp.nbytes >= nbytes
    ir.origin = dataclasses.replace(ir.origin, inplace=True, outofplace=False)
    with pytest.raises(CallError, match="proven in place only"):
        _route(ir, 0, x, np.zeros(64, np.float32), False)


def test_arrays_are_refused_with_the_argument_named():
    with pytest.raises(TypeError, match="input: numpy dtype complex64"):
        as_buf(np.zeros(4, np.complex64), "input")
    with pytest.raises(ValueError, match="output: the array must be C-contiguous"):
        as_buf(np.zeros((4, 4), np.float32)[:, 1], "output")
    with pytest.raises(TypeError, match="input is float32 but output is int32"):
        call_arrays("m", np.zeros(4, np.float32), np.zeros(4, np.int32), "cpu")
