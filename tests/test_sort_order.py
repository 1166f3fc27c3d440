"""The fast stable orders equal numpy's stable sorts (the oracle), on both sides of the size
threshold, with many ties, negative keys and key ranges too wide to fold."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.ir import sort_order
from hccc.compiler.ir.sort_order import lexsort, stable_argsort

sizes = st.sampled_from([0, 1, 7, sort_order.FAST_FROM - 1, sort_order.FAST_FROM, 20_000])
ranges = st.sampled_from([(0, 1), (0, 4), (-50, 50), (0, 1 << 20), (-(1 << 62), 1 << 62)])
dtypes = st.sampled_from([np.int64, np.int32, np.uint16, np.int8, np.bool_])


def _keys(seed, n, lo, hi, dtype):
    rng = np.random.default_rng(seed)
    if dtype is np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    info = np.iinfo(dtype)
    lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
    return rng.integers(lo, hi, n, endpoint=True, dtype=np.int64).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes, ranges, dtypes)
def test_stable_argsort_is_numpys_stable_argsort(seed, n, rng_, dtype):
    key = _keys(seed, n, *rng_, dtype)
    got = stable_argsort(key)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argsort(key, kind="stable"))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes, st.lists(st.tuples(ranges, dtypes), min_size=1, max_size=4))
def test_lexsort_is_numpys_lexsort(seed, n, specs):
    keys = [_keys(seed + i, n, *r, d) for i, (r, d) in enumerate(specs)]
    got = lexsort(keys)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.lexsort(keys))


def test_the_fast_path_is_taken_and_leaves_the_key_alone():
    key = np.random.default_rng(1).integers(0, 100, 50_000)
    before = key.copy()
    assert np.array_equal(stable_argsort(key), np.argsort(key, kind="stable"))
    assert np.array_equal(key, before)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes)
def test_lexsort_with_an_index_tie_breaker(seed, n):
    rng = np.random.default_rng(seed)
    keys = [np.arange(n), rng.integers(0, 3000, n), rng.integers(0, 1 << 20, n)]
    assert np.array_equal(lexsort(keys), np.lexsort(keys))
    keys = [np.arange(n) * 2 - 5, np.arange(n)[::-1].copy(), rng.integers(0, 3, n)]
    assert np.array_equal(lexsort(keys), np.lexsort(keys))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes, ranges, dtypes)
def test_unique_is_numpys_unique(seed, n, rng_, dtype):
    from hccc.compiler.ir.sort_order import unique
    a = _keys(seed, n, *rng_, dtype)
    got = unique(a)
    want = np.unique(a)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(unique(a.reshape(-1, 1)), want)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([sort_order.FAST_FROM, 30_000]), st.booleans())
def test_wide_keys_distinct_or_not(seed, n, distinct):
    """Keys whose range times their count exceeds 64 bits: distinct ones, and ones with ties."""
    rng = np.random.default_rng(seed)
    key = rng.choice(1 << 50, n, replace=False) if distinct else rng.integers(0, 1 << 50, n // 4).repeat(4)
    rng.shuffle(key)
    assert np.array_equal(stable_argsort(key), np.argsort(key, kind="stable"))
    pairs = [key % 1000, key // 1000]
    assert np.array_equal(lexsort(pairs), np.lexsort(pairs))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes, ranges, st.sampled_from([np.int64, np.int32, np.uint16]))
def test_unique_inverse_is_numpys(seed, n, rng_, dtype):
    from hccc.compiler.ir.sort_order import unique_inverse
    a = _keys(seed, n, *rng_, dtype)
    u, inv = unique_inverse(a)
    wu, winv = np.unique(a, return_inverse=True)
    assert u.dtype == wu.dtype and np.array_equal(u, wu)
    assert inv.dtype == winv.dtype and inv.shape == winv.shape and np.array_equal(inv, winv)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), sizes, ranges, st.sampled_from([np.int64, np.int32, np.uint16]))
def test_unique_first_is_numpys(seed, n, rng_, dtype):
    from hccc.compiler.ir.sort_order import unique_first
    a = _keys(seed, n, *rng_, dtype)
    u, first, inv = unique_first(a)
    wu, wfirst, winv = np.unique(a, return_index=True, return_inverse=True)
    assert np.array_equal(u, wu) and np.array_equal(first, wfirst) and np.array_equal(inv, winv)
