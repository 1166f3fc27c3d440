"""The memory-allocation policy of an ``hccc`` process (set once, by the command line's entry).

A large compile (HM AllReduce on 1,024 GPUs: 2.1 M transfers) makes thousands of short-lived numpy
arrays of 1-100 MiB. With the defaults, glibc's malloc gives every array above its mmap threshold
fresh pages from the kernel and returns them when the array dies, and numpy asks for transparent
huge pages on every large array (``madvise``), which makes the kernel compact memory inside page
faults: the compile then spends a third of its CPU time in the kernel (``sys``), not in hccc. The
policy here keeps freed memory in the process for reuse (glibc ``mallopt``: mmap threshold 32 MiB,
no trimming below 2 GiB of free heap) and turns numpy's huge-page advice off. It changes where
memory comes from, never what is computed; it is applied by the ``hccc`` command only (not by
library callers, whose process is theirs) and ``HCCC_ALLOCATOR=default`` leaves everything as is.
"""
from __future__ import annotations

import os

#: glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: arrays below this come from the heap (glibc caps the threshold at 32 MiB on 64-bit systems)
MMAP_THRESHOLD = 32 << 20
#: free heap kept before it is returned to the system
TRIM_THRESHOLD = 2 << 30


def tune_allocator() -> list[str]:
    """Apply the policy; returns what was changed (empty where nothing applies: not glibc, numpy
    without the switch, or ``HCCC_ALLOCATOR=default``). Never raises."""
    if os.environ.get("HCCC_ALLOCATOR", "") == "default":
        return []
    done = []
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        glibc = None
    if glibc:
        try:
            import ctypes

            libc = ctypes.CDLL(None)
            if (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                    and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1):
                done.append("malloc")
        except (OSError, AttributeError):
            pass
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            _set_madvise_hugepage = None
    if _set_madvise_hugepage is not None:
        _set_madvise_hugepage(False)
        done.append("numpy-hugepage")
    return done


__all__ = ["tune_allocator", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]
