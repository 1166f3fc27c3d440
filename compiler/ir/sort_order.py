"""Stable orders of integer keys, fast on large arrays.

numpy's stable sorts (``kind="stable"``, ``np.lexsort``) are merge/radix sorts; its default sort of
integers is a vectorised quicksort (AVX2 / AVX-512 where the CPU has them) that is 3-10x faster on
millions of elements, but not stable. :func:`stable_argsort` gets the stable order from the fast
sort: every key is made unique by its index (``(key - min) * n + index``, when that fits in 64 bits)
and the codes are sorted by value, which is the stable order by construction (keys too wide for
that: when they are distinct, every sort gives the one order); :func:`lexsort` folds
its keys into one the same way (a least significant key that increases along the array, such
as ``np.arange(n)``, is the index order every stable sort keeps, so it is left out). Small arrays, non-integer keys and key ranges too wide to fold use
numpy's stable sorts, so the result is always exactly ``np.argsort(key, kind="stable")`` /
``np.lexsort(keys)`` (``tests/test_sort_order.py``). :func:`unique` is ``np.unique`` by one sort, :func:`unique_inverse` with ``return_inverse``, :func:`unique_first` also with ``return_index``.
"""
from __future__ import annotations

import numpy as np

#: below this many elements numpy's stable sort is used as is
FAST_FROM = 4096
_LIMIT = 1 << 62


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` (1-D integer or boolean ``key``), as int64."""
    key = np.asarray(key)
    n = len(key)
    if n < FAST_FROM or key.ndim != 1 or key.dtype.kind not in "iub":
        return np.argsort(key, kind="stable").astype(np.int64, copy=False)
    k = key.astype(np.int64, copy=False)
    lo, hi = int(k.min()), int(k.max())
    if (hi - lo + 1) * n >= _LIMIT:
        # too wide to fold in the index: distinct keys have one order, which the fast sort finds
        s = np.sort(k)
        if not (s[1:] == s[:-1]).any():
            return np.argsort(k).astype(np.int64, copy=False)
        return np.argsort(k, kind="stable").astype(np.int64, copy=False)
    code = k - lo
    code *= n
    code += np.arange(n, dtype=np.int64)
    code.sort()
    return code % n


def lexsort(keys) -> np.ndarray:
    """``np.lexsort(keys)`` (the last key is the primary one) for 1-D integer keys, as int64."""
    keys = [np.asarray(k) for k in keys]
    n = len(keys[0]) if keys else 0
    if (n < FAST_FROM or any(k.ndim != 1 or k.dtype.kind not in "iub" or len(k) != n for k in keys)):
        return np.lexsort(keys).astype(np.int64, copy=False)
    while len(keys) > 1 and (keys[0][1:] > keys[0][:-1]).all():
        keys = keys[1:]                    # an increasing last tie-breaker is the index order: stable anyway
    folded = None
    span_total = 1
    for k in reversed(keys):               # primary key first
        k = k.astype(np.int64, copy=False)
        lo, hi = int(k.min()), int(k.max())
        span = hi - lo + 1
        span_total *= span
        if span_total >= _LIMIT:
            return np.lexsort(keys).astype(np.int64, copy=False)
        folded = (k - lo) if folded is None else folded * span + (k - lo)
    return stable_argsort(folded)


def unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` for integer or boolean ``a``: one sort (numpy's own unique hashes
    integers, several times slower on millions of values)."""
    a = np.asarray(a).ravel()
    if len(a) < FAST_FROM or a.dtype.kind not in "iub":
        return np.unique(a)
    s = np.sort(a)
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def unique_first(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(a, return_index=True, return_inverse=True)`` for a 1-D integer ``a``: the
    distinct values, the index of each one's first occurrence, and each element's value number."""
    a = np.asarray(a)
    n = len(a)
    order = stable_argsort(a)
    s = a[order]
    change = np.ones(n, bool)
    np.not_equal(s[1:], s[:-1], out=change[1:])
    inverse = np.empty(n, np.int64)
    inverse[order] = np.cumsum(change) - 1
    return s[change], order[change], inverse


def unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for a 1-D integer ``a``: one sort of codes that carry
    each element's index (no argsort)."""
    a = np.asarray(a)
    n = len(a)
    if n < FAST_FROM or a.ndim != 1 or a.dtype.kind not in "iu":
        return np.unique(a, return_inverse=True)
    k = a.astype(np.int64, copy=False)
    lo, hi = int(k.min()), int(k.max())
    if (hi - lo + 1) * n >= _LIMIT:
        return np.unique(a, return_inverse=True)
    code = k - lo
    code *= n
    code += np.arange(n, dtype=np.int64)
    code.sort()
    order = code % n
    sv = code // n
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(sv[1:], sv[:-1], out=first[1:])
    inv = np.empty(n, np.intp)
    inv[order] = np.cumsum(first) - 1
    return (sv[first] + lo).astype(a.dtype, copy=False), inv


__all__ = ["stable_argsort", "lexsort", "unique", "unique_first", "unique_inverse", "FAST_FROM"]
