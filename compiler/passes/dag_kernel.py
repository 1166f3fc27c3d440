"""The transitive reduction of ``dag.py`` (step 2) for chunks of at most :data:`MAX_TASKS` tasks,
compiled with numba: the same procedure as the Python loop there, with each task's ancestor set as
a row of 64-bit words instead of a Python integer.

Per chunk, in topological order: a task with one producer inherits that producer's ancestors plus
the producer; a task with several drops every producer edge whose producer is already an ancestor
of another producer, and its ancestors are the union of theirs plus the producers. The tests
(``tests/test_dag.py``) hold both paths to an all-pairs reduction of the naive relation.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.jit import optional_njit

_jit, HAVE_NUMBA = optional_njit()

#: chunks up to this many tasks (8 MiB of ancestor bits) go through the kernel
MAX_TASKS = 8192


@_jit
def reduce_chunks(ps, eptr, chunk_base, chunk_last, drop):
    """For each chunk ``k`` (positions ``chunk_base[k]..chunk_last[k]``), mark in ``drop`` the
    edges implied by others. ``ps[e]`` is edge e's producer position; the edges of consumer
    position v are ``eptr[v]:eptr[v + 1]``."""
    for k in range(len(chunk_base)):
        base = chunk_base[k]
        m = chunk_last[k] + 1 - base
        words = (m + 63) >> 6
        anc = np.zeros((m, words), np.uint64)
        acc = np.zeros(words, np.uint64)
        for v in range(m):
            a = eptr[base + v]
            b = eptr[base + v + 1]
            if b == a:
                continue
            if b - a == 1:
                p = ps[a] - base
                for w in range(words):
                    anc[v, w] = anc[p, w]
                anc[v, p >> 6] |= np.uint64(1) << np.uint64(p & 63)
                continue
            for w in range(words):
                acc[w] = 0
            for j in range(a, b):
                p = ps[j] - base
                for w in range(words):
                    acc[w] |= anc[p, w]
            for w in range(words):
                anc[v, w] = acc[w]
            for j in range(a, b):
                p = ps[j] - base
                if (acc[p >> 6] >> np.uint64(p & 63)) & np.uint64(1):
                    drop[j] = True
                anc[v, p >> 6] |= np.uint64(1) << np.uint64(p & 63)
