"""The waits an MSCCL export keeps: those no program order and no other wait implies
(:func:`reduce_deps`, vector clocks over each rank's thread blocks of a
:class:`~hccc.compiler.interop.msccl_tbs.Layout`)."""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.levels import NARROW_LEVEL
from hccc.compiler.ir.sort_order import lexsort, stable_argsort


class OrderCycle(AssertionError):
    """Program order and waits of one rank's MSCCL thread blocks form a cycle: an internal error,
    except after fusing a program whose thread blocks are not ordered like its steps (a task-level
    program), where merging two thread blocks can order a pair against a path through a third one;
    that fused export is then dropped for the plain one."""


def _ranges(ptr: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(ptr[v], ptr[v+1])`` for the given nodes (a CSR row gather)."""
    lo, hi = ptr[nodes], ptr[nodes + 1]
    ln = hi - lo
    tot = int(ln.sum())
    if not tot:
        return np.zeros(0, np.int64)
    return np.repeat(lo - np.cumsum(ln) + ln, ln) + np.arange(tot)


def _narrow_wave(frontier: list, vc, prev, nxt, a, b, by_b, in_ptr, out_ptr, indeg, mtb, idx) -> np.ndarray:
    """One wave of fewer than NARROW_LEVEL rows as :func:`_reduce_batch`'s numpy wave computes it,
    a row at a time (a deep rank, a wave per row, costs per row, not a numpy step per wave):
    each row's clock from its predecessor's and its waits', its own entry ticked; the next wave."""
    ready = []
    for v in frontier:
        row = vc[v]
        row[:] = vc[prev[v]]
        for j in range(in_ptr[v], in_ptr[v + 1]):
            np.maximum(row, vc[b[j]], out=row)
        row[mtb[v]] = idx[v] + 1
        succ = a[by_b[out_ptr[v]:out_ptr[v + 1]]].tolist()
        if nxt[v] >= 0:
            succ.append(int(nxt[v]))
        for w in succ:
            indeg[w] -= 1
            if not indeg[w]:
                ready.append(w)
    return np.asarray(sorted(ready), np.int64)


#: clock entries (rows x thread blocks of a rank) held at once: ranks are done in batches this big
CLOCK_ENTRIES = 1 << 25


def reduce_deps(lay) -> None:
    """Drop same-TB waits and those implied by program order and other waits of ``lay`` (a
    :class:`~hccc.compiler.interop.msccl_tbs.Layout`, which imports this module).

    Vector clocks over one rank's thread blocks, propagated along program order and waits in waves
    of rows whose predecessors are done, for a batch of ranks at once (waits stay within a rank; a
    batch holds at most :data:`CLOCK_ENTRIES` clock entries). A sound under-approximation of
    happens-before: kept waits may still be implied through other ranks, never the other way
    round. A wait of row ``i`` for ``d`` is implied when ``i``'s predecessor in its TB already
    follows ``d``, or when another wait of ``i`` follows ``d``."""
    rows = lay.rows
    n = len(rows)
    mtb, idx, tb = lay.mtb, lay.idx, lay.tb
    a, b = rows.wait_a, rows.wait_b
    if np.any(rows.rank[a] != rows.rank[b]):
        raise AssertionError("internal error: a wait between two ranks")
    same = tb[a] == tb[b]
    if np.any(same & (idx[b] > idx[a])):
        raise OrderCycle("internal error: a primitive waits for a later one of its own thread block")
    a, b = a[~same], b[~same]
    mem = lay.members()
    prev = np.full(n, -1, np.int64)              # the row before in its TB (-1: none)
    follows = tb[mem][1:] == tb[mem][:-1]
    prev[mem[1:][follows]] = mem[:-1][follows]
    # batches of whole ranks, each with at most CLOCK_ENTRIES clock entries (or one rank)
    by_rank = stable_argsort(rows.rank)
    ranks, rstart = np.unique(rows.rank[by_rank], return_index=True)
    rend = np.append(rstart[1:], n)
    ntb = np.zeros(len(ranks), np.int64)
    np.maximum.at(ntb, np.searchsorted(ranks, rows.rank), mtb + 1)
    wait_order = stable_argsort(rows.rank[a])
    a, b = a[wait_order], b[wait_order]
    wbound = np.searchsorted(rows.rank[a], np.append(ranks, np.iinfo(np.int64).max))
    keep = np.zeros(len(a), bool)
    lo = 0
    while lo < len(ranks):
        hi, width = lo + 1, ntb[lo]
        while hi < len(ranks) and (rend[hi] - rstart[lo]) * max(width, ntb[hi]) <= CLOCK_ENTRIES:
            width = max(width, ntb[hi])
            hi += 1
        nodes = np.sort(by_rank[rstart[lo]:rend[hi - 1]])
        e = slice(wbound[lo], wbound[hi])
        keep[e] = _reduce_batch(nodes, prev, a[e], b[e], mtb, idx, int(width))
        lo = hi
    keep_a, keep_b = a[keep], b[keep]
    o = lexsort((keep_b, keep_a))
    rows.wait_a, rows.wait_b = keep_a[o], keep_b[o]


def _reduce_batch(nodes: np.ndarray, prev_g: np.ndarray, a_g: np.ndarray, b_g: np.ndarray, mtb_g: np.ndarray,
                  idx_g: np.ndarray, width: int) -> np.ndarray:
    """Which waits ``a_g -> b_g`` (rows of the ranks ``nodes`` covers) :func:`reduce_deps` keeps."""
    m = len(nodes)
    a = np.searchsorted(nodes, a_g)
    b = np.searchsorted(nodes, b_g)
    mtb, idx = mtb_g[nodes], idx_g[nodes]
    pg = prev_g[nodes]
    prev = np.where(pg >= 0, np.searchsorted(nodes, pg), m)      # m: the zero clock
    nxt = np.full(m, -1, np.int64)
    nxt[prev[prev < m]] = np.flatnonzero(prev < m)
    order = lexsort((b, a))
    a, b = a[order], b[order]
    in_ptr = np.searchsorted(a, np.arange(m + 1))                  # waits by waiter
    by_b = stable_argsort(b)
    out_ptr = np.searchsorted(b[by_b], np.arange(m + 1))
    indeg = (prev < m).astype(np.int64) + np.diff(in_ptr)
    vc = np.zeros((m + 1, width), np.int32 if idx.max(initial=0) >= 32767 else np.int16)
    frontier = np.flatnonzero(indeg == 0)
    done = 0
    while len(frontier):
        if len(frontier) < NARROW_LEVEL:     # a narrow wave: a row operation per row and wait
            done += len(frontier)
            frontier = _narrow_wave(frontier.tolist(), vc, prev, nxt, a, b, by_b, in_ptr, out_ptr, indeg, mtb, idx)
            continue
        vc[frontier] = vc[prev[frontier]]
        e = _ranges(in_ptr, frontier)
        if len(e):       # waits of one row are adjacent: reduce them, then merge into its clock
            w = a[e]
            heads = np.flatnonzero(np.concatenate([[True], w[1:] != w[:-1]]))
            vc[w[heads]] = np.maximum(vc[w[heads]], np.maximum.reduceat(vc[b[e]], heads, axis=0))
        vc[frontier, mtb[frontier]] = idx[frontier] + 1
        done += len(frontier)
        nx = nxt[frontier]
        succ = np.concatenate([nx[nx >= 0], a[by_b[_ranges(out_ptr, frontier)]]])
        np.subtract.at(indeg, succ, 1)
        ready = np.sort(succ[indeg[succ] == 0])
        frontier = ready[np.concatenate([[True], ready[1:] != ready[:-1]])] if len(ready) else ready
    if done < m:
        raise OrderCycle("internal error: dependency cycle after splitting thread blocks")
    keep = np.zeros(len(a), bool)
    need = idx[b] + 1                            # a row follows d when its clock has d's TB at need
    cand = np.flatnonzero(vc[prev[a], mtb[b]] < need)
    # the other candidate waits of the same row: pairs within each row's candidates
    ca = a[cand]
    first = np.searchsorted(ca, ca)
    size = np.searchsorted(ca, ca, side="right") - first
    single = size == 1
    keep[cand[single]] = True
    multi = np.flatnonzero(~single)
    if len(multi):
        reps = size[multi]
        j = np.repeat(multi, reps)                                  # candidate d, once per candidate e
        e = np.repeat(first[multi], reps) + (np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps))
        other = e != j
        j, e = j[other], e[other]
        d = b[cand[j]]
        implied = np.zeros(len(cand), bool)
        implied[j[vc[b[cand[e]], mtb[d]] >= need[cand[j]]]] = True
        keep[cand[multi]] = ~implied[multi]
    out = np.zeros(len(a), bool)
    out[order] = keep
    return out


__all__ = ["OrderCycle", "reduce_deps", "CLOCK_ENTRIES"]
