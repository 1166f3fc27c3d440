"""The kernels' chunk geometry without division per unit (``hccc_walk`` in hccc_prims.h): chunk c
of ``count`` elements cut into ``n`` chunks starts at ``floor(c * count / n)``; ``hccc_walk_at``
finds that once per primitive (no division when the chunks are equal, a 32-bit one where the
product fits, else a 64-bit one) and ``hccc_walk_step`` moves to the next chunk by additions,
returning the chunk's length. Checked against Python's exact integers, run in the CPU emulation."""
from __future__ import annotations

import ctypes
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, harness_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS = r"""
#include "hccc_prims.h"
// From chunk c0 of `count` elements in n chunks, `steps` chunks on: their starts (out[2k]) and
// lengths (out[2k + 1]), as the sync lane computes them.
extern "C" __attribute__((visibility("default"))) void hccc_test_walk(uint64_t count, uint32_t n,
                                                                     uint64_t c0, int steps,
                                                                     uint64_t* out) {
  hccc_geom g;
  g.q = count / n;
  g.r = (uint32_t)(count % n);
  g.n = n;
  hccc_walk w = hccc_walk_at(g, c0);
  for (int k = 0; k < steps; ++k) {
    out[2 * k] = w.lo;
    out[2 * k + 1] = hccc_walk_step(w, g);
  }
}
"""


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    lib, _ = harness_library(tmp_path_factory.mktemp("walk"), HARNESS, "walk")
    lib.hccc_test_walk.restype = None
    lib.hccc_test_walk.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int,
                                   ctypes.c_void_p]
    return lib


def _walk(lib, count: int, n: int, c0: int, steps: int) -> list[tuple[int, int]]:
    out = (ctypes.c_uint64 * (2 * steps))()
    lib.hccc_test_walk(count, n, c0, steps, out)
    return [(out[2 * k], out[2 * k + 1]) for k in range(steps)]


def _exact(count: int, n: int, c: int) -> int:
    return c * count // n


@settings(max_examples=examples(200), deadline=None)
@given(count=st.one_of(st.integers(0, 10**6), st.integers(0, 2**40)),
       n=st.integers(1, 5000), c0=st.integers(0, 2**20), steps=st.integers(1, 6))
def test_walks_follow_the_exact_chunk_starts(walk, count, n, c0, steps):
    got = _walk(walk, count, n, c0, steps)
    for k, (lo, length) in enumerate(got):
        c = c0 + k
        assert lo == _exact(count, n, c)
        assert length == _exact(count, n, c + 1) - _exact(count, n, c)


def test_each_branch_of_the_first_step(walk):
    """Equal chunks (no division), a product that fits 32 bits, one that does not."""
    for count, n, c0 in ((1 << 20, 8, 5), (1000003, 7, 3), (2**40 + 12345, 4999, 2**20 + 7)):
        assert _walk(walk, count, n, c0, 2) == [(_exact(count, n, c), _exact(count, n, c + 1) - _exact(count, n, c))
                                               for c in (c0, c0 + 1)]


VDIV_HARNESS = r"""
#include "hccc_prims.h"
// floor(x / K) as AllToAllv's piece bounds take it (hccc_v_div, through the double reciprocal of K
// hccc_launch_init keeps), for n values.
extern "C" __attribute__((visibility("default"))) void hccc_test_vdiv(const uint64_t* x, uint32_t K, int n,
                                                                     uint64_t* out) {
  const double inv = 1.0 / (double)K;
  for (int i = 0; i < n; ++i) out[i] = hccc_v_div(x[i], K, inv);
}
"""


@pytest.fixture(scope="module")
def vdiv(tmp_path_factory):
    lib, _ = harness_library(tmp_path_factory.mktemp("vdiv"), VDIV_HARNESS, "vdiv")
    lib.hccc_test_vdiv.restype = None
    lib.hccc_test_vdiv.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p]
    return lib


@settings(max_examples=examples(200), deadline=None)
@given(K=st.one_of(st.integers(1, 64), st.integers(1, 2**32 - 1)),
       xs=st.lists(st.one_of(st.integers(0, 2**20), st.integers(0, 2**53), st.integers(0, 2**64 - 1)),
                   min_size=1, max_size=8))
def test_piece_bounds_divide_exactly_without_a_64_bit_division(vdiv, K, xs):
    """The quotient from the reciprocal, corrected, is the exact floor for every 64-bit x (near
    multiples of K and past 2^53, where a double no longer holds x, included)."""
    xs = xs + [min(2**64 - 1, q * K + d) for q in (xs[0] // K, 2**40 + 3) for d in (-1, 0, 1) if q * K + d >= 0]
    arr = (ctypes.c_uint64 * len(xs))(*xs)
    out = (ctypes.c_uint64 * len(xs))()
    vdiv.hccc_test_vdiv(arr, K, len(xs), out)
    assert list(out) == [x // K for x in xs]
