"""Where a Simple FIFO region's data starts, with nothing sent: both ends of a message compute the
offset from the message's anchor chunk (``hccc_region_offset``, hccc_prims.h), so code generation
must give both ends one anchor (``hccc.compiler.backend.codegen.message_anchors``: a send/receive
chain's first sender's) and that anchor must still have the size of every chunk the primitive moves.

- Property (random valid programs of every collective): the two ends of every message name one
  anchor, and at every admissible element count each primitive's anchor chunks ``anchor + k`` have
  the sizes of the chunks the extents proof anchored it to (sizes by brute force, the chunk model's
  formula, not the proof's periodicity argument).
- The kernels on the CPU emulation, at counts whose chunks start off 16-byte boundaries and slices
  of several micro-batches: AllToAll and send/receive programs (whose two ends name different
  chunks of their own), a program of more chunks a primitive than a unit round holds (the general
  path), ring AllReduce (the template path); every element equal to the reference executor's.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.backend.codegen import analyse
from hccc.compiler.ir.connections import match_connections
from hccc.compiler.ir.extents import chunk_anchors, count_unit
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import CompileOptions, load_program
from hccc.testing import KernelCase, describe_failure, run_case, valid_programs

ROOT = Path(__file__).resolve().parent.parent


def _size(chunk: int, count: int, nchunks: int) -> int:
    """Elements of chunk ``chunk`` (wrapping) of a full buffer of ``count``: the chunk model's
    boundaries c * count // nchunks, written out."""
    c = chunk % nchunks
    return (c + 1) * count // nchunks - c * count // nchunks


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                        "alltoall"])
@settings(max_examples=examples(6))
@given(data=st.data())
def test_both_ends_of_every_message_name_one_anchor_of_the_right_size(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=256)
    anchor = np.asarray(analyse(ir).chunk, np.int64)
    s, r = match_connections(ir)
    assert len(s) == len(r)
    assert (anchor[s] == anchor[r]).all(), [(int(a), int(b)) for a, b in zip(s, r) if anchor[a] != anchor[b]][:4]
    own = chunk_anchors(ir)
    C, u = int(ir.nchunks), count_unit(ir)
    cnt = ir.prims["count"].astype(np.int64)
    for t in range(1, 2 * C + 2):
        count = u * t
        for i in range(ir.nprims):
            for k in range(int(cnt[i])):
                assert _size(int(anchor[i]) + k, count, C) == _size(int(own[i]) + k, count, C), (i, k, count)


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@needs_gxx
@pytest.mark.parametrize("example,chunk_bytes", [
    ("ring_alltoall_6", 256),    # the two ends of a message name different chunks of their own
    ("ring_sendrecv_8", 256),
    ("ring_broadcast_8", 1024),  # 16 chunks a primitive: two unit rounds (the general path)
    ("ring_allreduce_8", 256),   # the template path
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernels_move_data_that_starts_off_16_byte_boundaries(example, chunk_bytes, dtype):
    ir = load_program(ROOT / "examples" / f"{example}.rccl", CompileOptions(chunk_bytes=chunk_bytes))
    C = int(ir.nchunks) * count_unit(ir)
    # chunks of 5 or 6 elements apart from the unit: their starts fall on every 4- or 2-byte offset
    for count, slice_bytes in ((C * 5 + 3, 0), (C * 37 + 5, 32)):
        res = run_case(ir, KernelCase(count=count, dtype=dtype, slice_bytes=slice_bytes))
        assert res.ok, f"{example} {describe_failure(KernelCase(count, dtype, slice_bytes=slice_bytes), res)}"
        assert res.oracle == "reference"
