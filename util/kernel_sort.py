"""Sorting inside hccc's kernels, cheap for numba to compile.

A kernel (``util/jit.py`` ``Kernels``) that calls numpy's sorts makes numba compile its generic
sort implementations the first time: about 2 s per sort and key type (``np.sort``, ``ndarray.sort``,
``np.argsort``; ``kind="mergesort"`` another 2 s), paid on every fresh install and by every test
worker (``benchmarks/jit_compile.py``). The two functions here are what kernels call instead,
bound per variant through ``Kernels(compiled_globals=...)``: the plain twin runs numpy's sort (the
interpreter would run a hand-written one hundreds of times slower), the compiled twin a short loop
numba compiles in a fraction of that. Both variants give the same result: sorted values, and for
:func:`argsort_stable` ties in index order.
"""
from __future__ import annotations

import functools

import numpy as np


def sort_range(a, lo, hi):
    """Sort ``a[lo:hi]`` in place, ascending (plain: numpy's sort of the view)."""
    a[lo:hi].sort()


def argsort_stable(keys):
    """The indices that sort ``keys`` ascending, ties in index order (plain: numpy's stable sort)."""
    return np.argsort(keys, kind="stable")


def _heap_sort_range(a, lo, hi):
    """Heapsort of ``a[lo:hi]`` in place (values only, so stability does not matter)."""
    n = hi - lo
    for phase in range(2):
        # phase 0 builds the max-heap (every inner node sifted down, last first); phase 1 moves
        # the maximum behind the heap, which shrinks by one, and sifts the new root down
        steps = n // 2 if phase == 0 else n - 1
        for s in range(steps):
            if phase == 0:
                root, size = n // 2 - 1 - s, n
            else:
                size = n - 1 - s
                v = a[lo]
                a[lo] = a[lo + size]
                a[lo + size] = v
                root = 0
            v = a[lo + root]
            while True:
                child = 2 * root + 1
                if child >= size:
                    break
                if child + 1 < size and a[lo + child + 1] > a[lo + child]:
                    child += 1
                if a[lo + child] <= v:
                    break
                a[lo + root] = a[lo + child]
                root = child
            a[lo + root] = v


def _merge_argsort(keys):
    """Bottom-up merge sort of the indices of ``keys`` (stable)."""
    n = keys.shape[0]
    idx = np.empty(n, np.int64)
    for i in range(n):
        idx[i] = i
    tmp = np.empty(n, np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if keys[idx[j]] < keys[idx[i]]:        # strictly less: the left run wins ties
                    tmp[k] = idx[j]
                    j += 1
                else:
                    tmp[k] = idx[i]
                    i += 1
                k += 1
            while i < mid:
                tmp[k] = idx[i]
                i += 1
                k += 1
            while j < hi:
                tmp[k] = idx[j]
                j += 1
                k += 1
        idx, tmp = tmp, idx
        width *= 2
    return idx


@functools.lru_cache(maxsize=None)
def compiled_sort_range():
    """The compiled :func:`sort_range` (a heapsort), for ``Kernels(compiled_globals=...)``: one
    dispatcher per process, shared by the kernel modules."""
    from hccc.util.jit import cached_njit

    return cached_njit(_heap_sort_range, nogil=True)


@functools.lru_cache(maxsize=None)
def compiled_argsort_stable():
    """The compiled :func:`argsort_stable` (a merge sort), for ``Kernels(compiled_globals=...)``."""
    from hccc.util.jit import cached_njit

    return cached_njit(_merge_argsort, nogil=True)


#: what a kernel module passes to ``Kernels(compiled_globals=...)`` for the names it imports from here
COMPILED = {"sort_range": compiled_sort_range, "argsort_stable": compiled_argsort_stable}
