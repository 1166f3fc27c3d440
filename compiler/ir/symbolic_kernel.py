"""One column block of :func:`hccc.compiler.ir.symbolic.happens_before`'s vector clocks, compiled
with numba: the same level-by-level propagation as the numpy loop there, one edge at a time.

Every node's clock row holds, for the thread blocks of the block's columns, one more than the
highest ``seq`` of that thread block's primitives that reach the node. Levels are processed in
order: first every edge into the level's nodes (their sources sit on lower levels, final already),
then each node of the level sets its own thread block's entry. The numpy loop makes a temporary
per level and gathers rows; this kernel updates the rows in place (``tests/test_msccl_symbolic.py``
holds both to networkx reachability).

Why ``symbolic.py`` keeps its numpy loop beside this kernel: the numpy loop handles a whole level
with a few array operations, where this kernel visits every edge and column, which the interpreter
runs 16-36x slower; compiled it is 3.4-3.6x faster than numpy. Measured with ``benchmarks/twins.py`` (HM AllReduce on N x 8 GPUs; a 2-core machine under a load
of about 25, so the figures are slow but the ratios hold), seconds of
2,000 happens-before queries on the compiled program:

==========  ===========  ===============  ================
primitives  numpy        kernel, plain    kernel, compiled
==========  ===========  ===============  ================
960         0.124        2.03             0.035
3,968       0.620        22.4             0.180
==========  ===========  ===============  ================

So numpy runs below :data:`COMPILED_FROM` clock entries and wherever numba is missing, this
kernel compiled above it (:class:`~hccc.util.jit.Kernels`; the threshold also pays
for numba's first compile of it, seconds).
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels, have_numba

HAVE_NUMBA = have_numba()

#: from this many clock entries (nodes x columns) on, happens_before runs the compiled block
COMPILED_FROM = 1 << 22


def clock_block(n, w, c0, src, dst, ebound, order_n, nbound, gcol, seq, qa, qb, qcol, out):
    """Clocks of columns ``c0 .. c0 + w - 1``, then ``out[i]`` (query ``i`` of this block: its
    column ``qcol[i]``) is whether ``qa[i]`` reaches ``qb[i]``. ``src``/``dst``: the edges sorted
    by their target's level, ``ebound[lv]:ebound[lv + 1]`` those into level ``lv``; ``order_n``:
    the nodes by level, ``nbound`` likewise; ``gcol``: every node's column (its thread block's)."""
    vc = np.zeros((n, w), np.int32)
    nlev = len(ebound) - 1
    for lv in range(nlev):
        for e in range(ebound[lv], ebound[lv + 1]):
            s = src[e]
            d = dst[e]
            for c in range(w):
                v = vc[s, c]
                if v > vc[d, c]:
                    vc[d, c] = v
        for k in range(nbound[lv], nbound[lv + 1]):
            node = order_n[k]
            col = gcol[node] - c0
            if 0 <= col < w:
                vc[node, col] = seq[node] + 1
    for i in range(len(qa)):
        out[i] = vc[qb[i], qcol[i] - c0] >= seq[qa[i]] + 1


KERNELS = Kernels(globals(), ["clock_block"], min_work=COMPILED_FROM)
