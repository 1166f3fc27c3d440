"""Every example program's emitted kernels, run on the CPU emulation, equal the reference executor.

Each example is lowered once (64-byte slices, so small sizes already give many micro-batches and
FIFO wrap-around) and built for one (dtype, op) instance only (the instances rotate over the
examples so that together they cover every dtype and operator); builds are cached by content hash.
Sizes: the edge cases of :func:`hccc.testing.default_counts` (empty and one-element chunks,
remainders, one and many micro-batches), in place and out of place, plus a few random cases.
"""
from __future__ import annotations

import functools
import pathlib
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.passes.build import build_program
from hccc.compiler.frontend.load import load_rccl
from hccc.testing import (assert_kernels_match, default_counts, describe_failure, kernel_cases, kernel_runner,
                          run_case)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.rccl"))
#: the 16- and 32-rank examples run with the slow set (``-m slow``); their 8-rank siblings (2x4)
#: cover the same shapes
SLOW = {"hm_allreduce_4x8", "hm_allgather_4x8", "hm_allreduce_2x8", "hm_allgather_2x8", "hm_allreduce_4x4",
        "hm_allgather_4x4", "hierarchical_alltoall_2x8"}
CASES = [pytest.param(p, id=p.stem, marks=pytest.mark.slow if p.stem in SLOW else ()) for p in EXAMPLES]
INSTANCES = [("float32", "sum"), ("int32", "max"), ("float16", "min"), ("bfloat16", "sum"),
             ("int32", "sum"), ("float32", "min"), ("bfloat16", "max"), ("float16", "sum")]


@functools.lru_cache(maxsize=None)
def lowered(path: pathlib.Path):
    return build_program(load_rccl(path), chunk_bytes=64)


def instance(path: pathlib.Path) -> tuple[str, str]:
    return INSTANCES[EXAMPLES.index(path) % len(INSTANCES)]


@pytest.mark.parametrize("path", CASES)
def test_example_kernels_match_oracle_at_edge_sizes(path):
    ir = lowered(path)
    dtype, op = instance(path)
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=default_counts(ir, dtype),
                         inplace=(False, True), nthreads=1 + EXAMPLES.index(path) % 3)
    # every rank in one emulated process: the runs went through the one-grid entry
    assert kernel_runner(ir, "cpu", dtype, op).grid_fn is not None


@pytest.mark.parametrize("path", CASES)
def test_example_kernels_launched_per_rank_match_oracle(path):
    """The kernel per rank (what runs when the ranks span GPUs), at a few uneven sizes (the build
    of the one-grid test serves: one module holds both)."""
    ir = lowered(path)
    dtype, op = instance(path)
    counts = default_counts(ir, dtype)
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts[1::3], inplace=(False, True),
                         nthreads=2, one_grid=False)
    assert kernel_runner(ir, "cpu", dtype, op, one_grid=False).grid_fn is None


@pytest.mark.parametrize("path", CASES)
@settings(max_examples=3)
@given(data=st.data())
def test_example_kernels_match_oracle_at_random_sizes(path, data):
    ir = lowered(path)
    dtype, op = instance(path)
    case = data.draw(kernel_cases(ir, dtypes=[dtype], ops=[op], max_microbatches=12), label="case")
    res = run_case(ir, case)
    assert res.ok, describe_failure(case, res)


@pytest.mark.parametrize("path", CASES)
def test_example_table_kernels_match_oracle(path):
    """The same programs through the generic table kernels (one build serves every example):
    edge sizes with a different instance than the specialised test's, in place and not."""
    ir = lowered(path)
    dtype, op = INSTANCES[(EXAMPLES.index(path) + 3) % len(INSTANCES)]
    counts = default_counts(ir, dtype)
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts[::2] + counts[-1:],
                         inplace=(False, True), nthreads=1 + EXAMPLES.index(path) % 3, codegen="table")
