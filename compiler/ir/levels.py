"""Longest-path levels of a directed graph, in time linear in its nodes and edges.

Kahn's algorithm a level at a time: a level's nodes are done, their out-edges lower the in-degree
of their successors, and those left with none form the next level. A wide level costs a few numpy
operations whatever its size; a narrow one (fewer than :data:`NARROW_LEVEL` nodes) is a plain loop
over its nodes and edges, so a deep, narrow graph (a chain of dependent transfers: a level per
primitive) pays per node and edge, not a fixed numpy overhead per level. The proofs' orders
(:func:`hccc.compiler.ir.symbolic.prim_order`, :func:`hccc.compiler.ir.check.check_deadlock`) and
their happens-before (:func:`hccc.compiler.ir.symbolic.happens_before`) all start from these levels.
"""
from __future__ import annotations

import numpy as np

#: a level of fewer nodes than this is done in a plain loop, a wider one in numpy. Measured on
#: levels of k nodes of two in-edges each (2-core machine, load 5): the numpy step costs 18-25 us a
#: level whatever k (4-128), the loop about 0.8 us a node (4 us at k=4, 25 us at k=32, 95 us at
#: k=128): they break even near 24 nodes, and 32 keeps either side within 1.3x of the better one
NARROW_LEVEL = 32


def _csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(src, kind="stable")
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    return ptr, dst[o]


def graph_levels(n: int, src: np.ndarray, dst: np.ndarray, narrow: int = NARROW_LEVEL) -> np.ndarray:
    """Level of every node of the graph with edges ``src[i] -> dst[i]`` over nodes ``0..n-1``:
    0 for a node without predecessors, else one more than its predecessors' greatest level; -1
    for every node on a cycle or after one (so the graph is acyclic iff no level is -1). A level
    of fewer than ``narrow`` nodes is done in the plain loop (the tests vary it)."""
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    level = np.full(n, -1, np.int64)
    if not n:
        return level
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    ptr, csr = _csr(n, src, dst)
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while len(frontier):
        level[frontier] = lv
        if len(frontier) >= narrow:
            frontier = _wide_step(frontier, indeg, ptr, csr)
        else:
            nxt = []
            for u in frontier.tolist():
                for t in csr[ptr[u]:ptr[u + 1]].tolist():
                    indeg[t] -= 1
                    if not indeg[t]:
                        nxt.append(t)
            frontier = np.asarray(nxt, np.int64)
        lv += 1
    return level


def _wide_step(frontier: np.ndarray, indeg: np.ndarray, ptr: np.ndarray, csr: np.ndarray) -> np.ndarray:
    st = ptr[frontier]
    cnt = ptr[frontier + 1] - st
    tot = int(cnt.sum())
    if not tot:
        return frontier[:0]
    offs = np.repeat(np.cumsum(cnt) - cnt, cnt)
    tg = csr[np.repeat(st, cnt) + (np.arange(tot, dtype=np.int64) - offs)]
    u, c = np.unique(tg, return_counts=True)
    indeg[u] -= c
    return u[indeg[u] == 0]


__all__ = ["NARROW_LEVEL", "graph_levels"]
