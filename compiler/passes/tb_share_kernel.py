"""State-based thread-block sharing over flat arrays: the tracks of
:func:`hccc.compiler.passes.tb_alloc.allocate`'s state-based mode (its module docstring) for every
sharing rank of a program in one call, run by the interpreter for small programs and compiled with
numba for large ones (:meth:`~hccc.util.jit.Kernels.pick`).

Why a kernel: a rank with ``m`` allocation units asks up to ``m^2/2`` reachability questions, and
tree programs give every rank a unit per peer and direction (``m = 2(N-1)``): 64 ranks ask some
450,000 questions, 256 ranks tens of millions. Each one is a short search (about 8 primitives on
the measured programs), but the interpreter spends ~15 us on it; compiled, well under one.

Most answers are "no". Before searching, a question is put to two *interval labels* of the wait
graph (a post-order number ``post`` and the smallest post-order number ``low`` below a primitive,
for two depth-first traversals in opposite child orders, as GRAIL does): if ``b`` is reachable
from ``a`` then ``post[b] <= post[a]`` and ``low[a] <= low[b]`` in every labelling, so a pair
that fails this is unreachable without a search. The labels only exist for an acyclic graph (a
lowering with fusion can deadlock before its back-off; then every question is searched). The
search itself goes forward from ``a`` over primitives whose order key does not exceed ``b``'s.
``tests/test_tb_alloc.py`` holds the tracks to a networkx oracle of the definition.

Why no plain-Python formulation beside it: a list version (Python lists and sets, no labels) ran
2.2-2.3x faster than this kernel as plain Python, where both take well under a second
(``benchmarks/twins.py``, HM AllReduce, seconds of the state-based allocation on a 2-core machine
under a load of about 13: 2 x 8 GPUs 0.020 against 0.046, 4 x 8 GPUs 0.31 against 0.67), while
compiled the kernel is 12x faster than that list version there and the only one that finishes
256-rank tree programs (tens of millions of questions) in seconds.
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels


def interval_labels(ptr, adj, reverse):
    """``(post, low, acyclic)`` of one depth-first traversal of the graph ``ptr``/``adj`` (CSR):
    roots in ascending order and children in adjacency order, or both descending with
    ``reverse``. ``acyclic`` is False when the traversal met a cycle (the labels are then
    meaningless)."""
    n = ptr.shape[0] - 1
    post = np.zeros(n, np.int64)
    low = np.zeros(n, np.int64)
    state = np.zeros(n, np.int8)          # 0 unseen, 1 on the stack, 2 done
    cur = np.zeros(n, np.int64)           # next adjacency position of a node on the stack
    stk = np.empty(max(n, 1), np.int64)
    big = n + 1                           # above every post-order number
    counter = 0
    for s0 in range(n):
        s = n - 1 - s0 if reverse else s0
        if state[s] != 0:
            continue
        stk[0] = s
        sp = 1
        state[s] = 1
        low[s] = big
        cur[s] = ptr[s + 1] - 1 if reverse else ptr[s]
        while sp > 0:
            v = stk[sp - 1]
            j = cur[v]
            if (reverse and j >= ptr[v]) or (not reverse and j < ptr[v + 1]):
                cur[v] = j - 1 if reverse else j + 1
                c = adj[j]
                if state[c] == 0:
                    state[c] = 1
                    low[c] = big
                    cur[c] = ptr[c + 1] - 1 if reverse else ptr[c]
                    stk[sp] = c
                    sp += 1
                elif state[c] == 1:
                    return post, low, False
                elif low[c] < low[v]:
                    low[v] = low[c]
            else:
                post[v] = counter
                counter += 1
                if counter - 1 < low[v]:
                    low[v] = counter - 1
                state[v] = 2
                sp -= 1
                if sp > 0:
                    p = stk[sp - 1]
                    if low[v] < low[p]:
                        low[p] = low[v]
    return post, low, True


def share_tracks(order, rank_ptr, todo, ustart, uend, first, last, ptr, adj, key,
                 post1, low1, post2, low2, use_labels, track, count, budget, cut):
    """Tracks of the units of every rank in ``todo`` (the state-based sharing of ``tb_alloc``'s
    module docstring): ``order[rank_ptr[r]:rank_ptr[r+1]]`` are rank ``r``'s units in sweep
    order (span start, span end, unit); ``track[u]`` and ``count[r]`` are written. A rank's
    searches follow at most about ``budget`` wait-graph arcs: past it, a question left to a search
    counts as unreachable (a new track, never a wrong share) and ``cut[r]`` counts those."""
    n = key.shape[0]
    seen = np.zeros(n, np.int64)
    stack = np.empty(max(n, 1), np.int64)
    epoch = 0
    widest = 0
    for t in range(todo.shape[0]):
        r = todo[t]
        if rank_ptr[r + 1] - rank_ptr[r] > widest:
            widest = rank_ptr[r + 1] - rank_ptr[r]
    tail = np.empty(max(widest, 1), np.int64)
    for t in range(todo.shape[0]):
        r = todo[t]
        nt = 0
        used = 0
        refused = 0
        for i in range(rank_ptr[r], rank_ptr[r + 1]):
            u = order[i]
            b = first[u]
            kb = key[b]
            s = ustart[u]
            k = 0
            found = False
            # one mark per unit: the primitives a failed search from one tail visited cannot reach
            # ``b`` (through primitives keyed at most ``kb``), so no later search for this unit
            # enters them again
            epoch += 1
            while k < nt:
                v = tail[k]
                if uend[v] < s:
                    a = last[v]
                    if a == b:
                        found = True
                    elif use_labels and (post1[b] > post1[a] or low1[a] > low1[b]
                                         or post2[b] > post2[a] or low2[a] > low2[b]):
                        found = False
                    elif used >= budget:
                        refused += 1
                    elif seen[a] != epoch:
                        seen[a] = epoch
                        stack[0] = a
                        sp = 1
                        while sp > 0 and not found:
                            sp -= 1
                            x = stack[sp]
                            used += ptr[x + 1] - ptr[x]
                            for j in range(ptr[x], ptr[x + 1]):
                                y = adj[j]
                                if y == b:
                                    found = True
                                    break
                                if seen[y] != epoch and key[y] <= kb:
                                    seen[y] = epoch
                                    stack[sp] = y
                                    sp += 1
                    if found:
                        break
                k += 1
            if not found:
                k = nt
                nt += 1
            tail[k] = u
            track[u] = k
        count[r] = nt
        cut[r] = refused


#: once a process's sharing ranks could have asked about this many unit pairs (``m^2/2`` summed
#: over the ranks), :func:`hccc.compiler.passes.tb_alloc.allocate` runs the kernel compiled, before
#: that plain (:meth:`~hccc.util.jit.Kernels.pick`)
COMPILED_FROM = 200_000
#: the same where numba's cache of these kernels is on disk (loading it, not compiling): the step
#: search's programs on the held-out 64-GPU cluster (``benchmarks/synth_quality.py --asym 1``,
#: ``hccc synth --method search``) give 24,000-25,000 pairs per build (four builds, one command),
#: whose reachability questions cost the plain run more than loading the kernel does
#: (docs/archive/measurements-log.md#synthesis-speed-at-64-gpus-the-seconds-cut-no-gpu)
COMPILED_FROM_CACHED = 20_000
KERNELS = Kernels(globals(), ["interval_labels", "share_tracks"], min_work=COMPILED_FROM,
                  cached_min_work=COMPILED_FROM_CACHED)
