"""HPDS over flat arrays: Algorithm 1 with rule *I7* (see ``hpds.py``'s docstring), the one
scheduler of :func:`hccc.compiler.passes.hpds.hpds`, run by the interpreter for small programs and
compiled with numba for large ones (:meth:`~hccc.util.jit.Kernels.pick`), up to millions of tasks.

The procedure over preallocated arrays, so numba compiles it to machine code:

- internal task ids are sorted by ``(chunk, step, row)``, so chunk ``c`` owns the id range
  ``cstart[c]:cstart[c+1]``; its ready-not-examined list (``cand``) and its parked list (``park``)
  are segments of two flat arrays at that offset (a task is in at most one of them, and only
  tasks of chunk ``c`` ever are: dependency edges never leave a chunk);
- each link's heap of ``(ready time, task)`` is a segment of two flat arrays at the link's offset
  (every task enters its link's heap exactly once, when it becomes ready), with lazy deletion of
  scheduled tasks;
- the chunk queue is a binary heap of ``-priority * nchunks + chunk`` (the order of the
  ``(-priority, chunk)`` tuples).

Only the minimum of each heap is ever used and heap keys are unique, so the heap implementation
does not influence the result. ``tests/test_schedulers.py`` checks it, plain and compiled, against
a literal reading of Algorithm 1.

Why no plain-Python formulation beside it: a list-based scheduler of the same procedure ran
3.5-19x faster than this kernel as plain Python, but that is milliseconds on the examples, while
compiled the kernel is 12-90x faster than the list scheduler. Measured with
``benchmarks/twins.py`` (HM AllReduce on N x 8 GPUs; a 2-core machine under a load of about 13,
so the figures are slow but the ratios hold), seconds:

==========  =================  ===============  ===============
tasks       list scheduler     kernel, plain    kernel, compiled
==========  =================  ===============  ===============
480         0.0011             0.0200           0.0001
1,984       0.0258             0.0895           0.0003
32,512      2.23               7.52             0.147
==========  =================  ===============  ===============

(the last row from an earlier run under a load of about 25.)
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels, have_numba
from hccc.util.kernel_sort import COMPILED as SORTS, sort_range

HAVE_NUMBA = have_numba()

#: Rule I7's clock: a task lasts 1; a task pipelined behind a producer of its own sub-pipeline
#: starts, and ends at the earliest, this long after the producer (one micro-batch of ~16)
SLICE = 1.0 / 16
EPS = 1e-9


def _less(t1, k1, t2, k2):
    return t1 < t2 or (t1 == t2 and k1 < k2)


def _lheap_push(ht, hk, base, size, t, k):
    """Push (t, k) onto the heap ``ht/hk[base:base+size]``; returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if _less(t, k, ht[base + parent], hk[base + parent]):
            ht[base + i] = ht[base + parent]
            hk[base + i] = hk[base + parent]
            i = parent
        else:
            break
    ht[base + i] = t
    hk[base + i] = k
    return size + 1


def _lheap_pop(ht, hk, base, size):
    """Drop the minimum of the heap ``ht/hk[base:base+size]``; returns the new size."""
    size -= 1
    if size == 0:
        return 0
    t = ht[base + size]
    k = hk[base + size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _less(ht[base + child + 1], hk[base + child + 1],
                                      ht[base + child], hk[base + child]):
            child += 1
        if _less(ht[base + child], hk[base + child], t, k):
            ht[base + i] = ht[base + child]
            hk[base + i] = hk[base + child]
            i = child
        else:
            break
    ht[base + i] = t
    hk[base + i] = k
    return size


def _qheap_sift_down(q, size, i):
    x = q[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and q[child + 1] < q[child]:
            child += 1
        if q[child] < x:
            q[i] = q[child]
            i = child
        else:
            break
    q[i] = x


def hpds_arrays(sptr, succ, indeg, link, cstart, nlinks):
    """Schedule tasks ``0..n-1`` (internal ids, see the module docstring).

    ``sptr``/``succ``: successors of task t are ``succ[sptr[t]:sptr[t+1]]`` (ascending);
    ``indeg``: data predecessors per task (modified); ``link``: dense link id per task;
    ``cstart``: first task of each chunk (length nchunks + 1). Returns ``(sp_of, order, ok)``:
    the sub-pipeline of every task, the insertion order, and False when no progress was possible
    (a cycle; cannot happen on a DAG).
    """
    n = len(link)
    nchunks = len(cstart) - 1
    sp_of = np.zeros(n, np.int64)
    order = np.empty(n, np.int64)
    norder = 0
    stamp = np.full(nlinks, -1, np.int64)
    remaining = np.empty(nchunks, np.int64)
    for c in range(nchunks):
        remaining[c] = cstart[c + 1] - cstart[c]
    # per-chunk ready lists: cand (not yet examined in this sub-pipeline) and park (link-blocked)
    cand = np.empty(n, np.int64)
    cand_len = np.zeros(nchunks, np.int64)
    park = np.empty(n, np.int64)
    park_len = np.zeros(nchunks, np.int64)
    # per-link heaps of (ready time, task)
    lcount = np.zeros(nlinks + 1, np.int64)
    for t in range(n):
        lcount[link[t] + 1] += 1
    loff = np.cumsum(lcount)
    lsize = np.zeros(nlinks, np.int64)
    ht = np.empty(n, np.float64)
    hk = np.empty(n, np.int64)
    for c in range(nchunks):
        for t in range(cstart[c], cstart[c + 1]):
            if indeg[t] == 0:
                cand[cstart[c] + cand_len[c]] = t
                cand_len[c] += 1
                lk = link[t]
                lsize[lk] = _lheap_push(ht, hk, loff[lk], lsize[lk], 0.0, t)
    # the unit-cost clock of rule I7
    est_s = np.zeros(n, np.float64)
    est_e = np.zeros(n, np.float64)
    a_sp = np.full(n, -1, np.int64)
    a_s = np.zeros(n, np.float64)
    a_e = np.zeros(n, np.float64)
    b_e = np.zeros(n, np.float64)
    taken = np.zeros(n, np.bool_)
    lend = np.zeros(nlinks, np.float64)
    prio = np.zeros(nchunks, np.int64)
    q = np.empty(nchunks, np.int64)
    take = np.empty(n, np.int64)
    new = np.empty(n, np.int64)
    sp = 0
    while norder < n:
        before = norder
        qn = np.int64(0)    # not a literal 0: _qheap_sift_down compiled once
        for c in range(nchunks):
            if remaining[c]:
                q[qn] = -prio[c] * nchunks + c
                qn += 1
        for i in range(qn // 2 - 1, -1, -1):
            _qheap_sift_down(q, qn, i)
        while qn:
            top = q[0]
            c = top % nchunks
            # ---- visit chunk c: take its ready tasks whose links are free (rule I7)
            base = cstart[c]
            ntake = 0
            for i in range(cand_len[c]):
                t = cand[base + i]
                lk = link[t]
                if stamp[lk] == sp:
                    park[base + park_len[c]] = t
                    park_len[c] += 1
                    continue
                hb = loff[lk]
                while taken[hk[hb]]:
                    lsize[lk] = _lheap_pop(ht, hk, hb, lsize[lk])
                ready = a_e[t] if a_e[t] > b_e[t] else b_e[t]
                if ht[hb] < ready - EPS:
                    park[base + park_len[c]] = t
                    park_len[c] += 1
                    continue
                stamp[lk] = sp
                take[ntake] = t
                ntake += 1
            if ntake == 0:
                cand_len[c] = 0
                qn -= 1                      # heappop
                if qn:
                    q[0] = q[qn]
                    _qheap_sift_down(q, qn, np.int64(0))   # not a literal 0: one compile
                continue
            nnew = 0
            for i in range(ntake):
                t = take[i]
                sp_of[t] = sp
                taken[t] = True
                lk = link[t]
                start = lend[lk]
                if b_e[t] > start:
                    start = b_e[t]
                if a_sp[t] == sp:
                    if a_s[t] + SLICE > start:
                        start = a_s[t] + SLICE
                    done = max(a_e[t], b_e[t]) + SLICE
                else:
                    if a_e[t] > start:
                        start = a_e[t]
                    done = max(a_e[t], b_e[t]) + SLICE if a_sp[t] >= 0 else 0.0
                end = start + 1.0
                if done > end:
                    end = done
                est_s[t] = start
                est_e[t] = end
                lend[lk] = end
                for j in range(sptr[t], sptr[t + 1]):
                    s = succ[j]
                    if a_sp[s] < sp:
                        if a_e[s] > b_e[s]:
                            b_e[s] = a_e[s]
                        a_sp[s] = sp
                        a_s[s] = start
                        a_e[s] = end
                    else:
                        if start > a_s[s]:
                            a_s[s] = start
                        if end > a_e[s]:
                            a_e[s] = end
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        new[nnew] = s
                        nnew += 1
                        ls = link[s]
                        lsize[ls] = _lheap_push(ht, hk, loff[ls], lsize[ls],
                                                a_e[s] if a_e[s] > b_e[s] else b_e[s], s)
                order[norder] = t
                norder += 1
            if nnew > 1:
                sort_range(new, 0, nnew)
            for i in range(nnew):
                cand[base + i] = new[i]
            cand_len[c] = nnew
            remaining[c] -= ntake
            # ---- priority drops by one: heapreplace with (-prio + 1, c)
            prio[c] -= 1
            q[0] = top + nchunks
            _qheap_sift_down(q, qn, np.int64(0))   # not a literal 0: one compile
        if norder == before:
            return sp_of, order, False
        # ---- close the sub-pipeline: parked tasks go back to the ready lists, in order
        for c in range(nchunks):
            np_ = park_len[c]
            if np_:
                base = cstart[c]
                m = cand_len[c]
                for i in range(m):
                    park[base + np_ + i] = cand[base + i]
                for i in range(np_ + m):
                    cand[base + i] = park[base + i]
                sort_range(cand, base, base + np_ + m)
                cand_len[c] = np_ + m
                park_len[c] = 0
        sp += 1
    return sp_of, order, True


#: once a process has scheduled this many tasks (a tenth of it where numba's cache of the kernels
#: is on disk), :func:`hccc.compiler.passes.hpds.hpds` runs the kernel compiled, before that plain
#: (:meth:`~hccc.util.jit.Kernels.pick`)
COMPILED_FROM = 100_000
KERNELS = Kernels(globals(), ["_less", "_lheap_push", "_lheap_pop", "_qheap_sift_down", "hpds_arrays"],
                  min_work=COMPILED_FROM, compiled_globals={"sort_range": SORTS["sort_range"]})
