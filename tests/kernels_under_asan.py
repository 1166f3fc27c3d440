"""Kernel properties run under AddressSanitizer (collected only by ``test_kernels_asan.py``, which
starts pytest on this file in a child process with the ASan runtime preloaded and
``HCCC_CPU_SANITIZE=address``: every buffer the CPU platform hands the kernels then ends in a
poisoned redzone, and any access one element past a chunk aborts the child with ASan's report).

Random programs of every collective (hccc's lowering: sends, receives, fused forwarding
primitives, local copies), imported MSCCL programs with multi-chunk steps, scratch, local
``cpy``/``re`` steps, at uneven sizes (empty, one-element and ragged chunks), in place and out of
place. A few examples per run; ``HYPOTHESIS_PROFILE=thorough`` runs many more.
"""
from __future__ import annotations

import ctypes
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.interop.msccl_xml import import_xml_text
from hccc.compiler.passes.build import build_program
from hccc.runtime.cpu import asan_loaded
from hccc.runtime.platform import get_platform
from hccc.testing import KernelCase, describe_failure, kernel_cases, run_case, valid_programs

from msccl_texts import allpairs_allreduce, direct_allgather

pytestmark = pytest.mark.skipif(os.environ.get("HCCC_CPU_SANITIZE") != "address" or not asan_loaded(),
                                reason="run through test_kernels_asan.py (ASan runtime preloaded)")

FEW = settings(max_examples=int(os.environ.get("HCCC_ASAN_EXAMPLES", "2")), deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
    FEW = settings(max_examples=200, deadline=None)


def test_buffers_end_in_a_redzone():
    """The negative control: one byte past any buffer of the platform is poisoned."""
    plat = get_platform("cpu")
    assert plat.sanitize == "address"
    poisoned = ctypes.CDLL(None).__asan_address_is_poisoned
    poisoned.restype = ctypes.c_int
    poisoned.argtypes = [ctypes.c_void_p]
    for n in (1, 4, 60, 4096, 1 << 17):
        ptr = plat.malloc(n)
        try:
            assert not poisoned(ptr) and not poisoned(ptr + n - 1)
            assert poisoned(ptr + n)
        finally:
            plat.free(ptr)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "alltoall"])
@FEW
@given(data=st.data())
def test_random_programs_in_bounds(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=4), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64])), fuse=data.draw(st.booleans()))
    case = data.draw(kernel_cases(ir, dtypes=["float32", "float16", "int32"], max_microbatches=5,
                                  threads=(1, 2)), label="case")
    res = run_case(ir, case, timeout_s=60)
    assert res.ok, describe_failure(case, res)


@FEW
@given(family=st.sampled_from([allpairs_allreduce, direct_allgather]), n=st.integers(2, 3),
       per=st.integers(1, 17), data=st.data())
def test_imported_multi_chunk_steps_in_bounds(family, n, per, data):
    """Steps of ``per`` chunks; AllReduce with scratch smaller than the loop and local ``re``
    steps (in place the importer's input copy is a ``cpy`` between coinciding chunks, out of place a
    real one), AllGather with a local ``cpy`` of the rank's block."""
    ir = import_xml_text(family(n, per), "algo.xml")
    ir.chunk_bytes = 64 * ir.max_step_chunks
    count = data.draw(st.integers(0, 16 * ir.nchunks), label="count")
    case = KernelCase(count, data.draw(st.sampled_from(["float32", "int32"])), "sum",
                      data.draw(st.booleans(), label="inplace"), data.draw(st.sampled_from([1, 2])))
    res = run_case(ir, case, timeout_s=60)
    assert res.ok, describe_failure(case, res)
