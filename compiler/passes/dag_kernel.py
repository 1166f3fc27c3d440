"""The transitive reduction of ``dag.py`` (step 2) for chunks of at most :data:`MAX_TASKS` tasks,
compiled with numba: the same procedure as the Python loop there, with each task's ancestor set as
a row of 64-bit words instead of a Python integer.

Per chunk, in topological order: a task with one producer inherits that producer's ancestors plus
the producer; a task with several drops every producer edge whose producer is already an ancestor
of another producer, and its ancestors are the union of theirs plus the producers. The tests
(``tests/test_dag.py``) hold both paths to an all-pairs reduction of the naive relation.

Why ``dag.py`` keeps its Python-integer bitsets beside this kernel: a Python integer ORs a whole
ancestor set in one operation, where this kernel loops over 64-bit words, which the interpreter
runs 3.2-8x slower; compiled, the kernel makes the whole DAG build 1.5x faster. Measured with ``benchmarks/twins.py`` (HM AllReduce on N x 8 GPUs; a 2-core machine under a load
of about 25, so the figures are slow but the ratios hold),
seconds of :func:`~hccc.compiler.passes.dag.build_dag`:

==========  ======================  ===============  ================
tasks       Python-integer bitsets  kernel, plain    kernel, compiled
==========  ======================  ===============  ================
1,984       0.056                   0.179            0.039
32,512      0.652                   5.18             0.417
==========  ======================  ===============  ================

So the bitsets run below :data:`COMPILED_FROM` tasks and wherever numba is missing, this kernel
compiled above it (:class:`~hccc.util.jit.Kernels`).
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels, have_numba

HAVE_NUMBA = have_numba()

#: chunks up to this many tasks (8 MiB of ancestor bits) go through the kernel
MAX_TASKS = 8192


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


#: from this many tasks on, :func:`hccc.compiler.passes.dag.build_dag` reduces through the compiled
#: kernel (:meth:`~hccc.util.jit.Kernels.compiled_for`)
COMPILED_FROM = 100_000
KERNELS = Kernels(globals(), ["reduce_chunks"], min_work=COMPILED_FROM)
