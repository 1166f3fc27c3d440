"""Shallower trees by exchanges that keep every arc's load.

A packing's trees fix the load of every pair (each tree's arcs, weighted by its count), and so its
time in the link model; they do not fix how deep the trees are. Depth costs a pipelined program
time the link model leaves out: a slice crosses its tree's hops one after another, so a stream
fills and drains over about as many slice times as its tree has levels. Integral packings
(:mod:`.branchings`), which fill every resource to the bound, grow trees that snake through every
rank of a node and through the nodes one after another (four MI250 nodes at three trees per root:
the shallowest trees 6 levels deep, the deepest 26).

Two trees ``A`` and ``B`` of the same count may exchange the parents of a set ``S`` of ranks that
neither is rooted in: ``A`` takes ``B``'s arcs into ``S`` and ``B`` takes ``A``'s. Every arc keeps
its multiplicity, so every pair's and every shared group's load stays what it was, exactly; the
exchange is kept where both results are still spanning trees (no cycle) and the deeper of the two
is shallower, or as deep with the two depths' sum less (so the search ends). The sets tried are
each rank on the path to a tree's deepest rank (a rank that can take a shallower parent) and each
part of the cluster's partitions (nodes: a tree that enters a node from a third node can take
another tree's entry from its own root's node, and that one's arcs inside the node with it).
"""
from __future__ import annotations

import numpy as np

from hccc.util import clock

#: passes over every tree (each tries every tree, deepest first; four MI250 nodes at three trees per
#: root: 124, 27 and 4 exchanges, 0.2 s each, then none)
MAX_PASSES = 3


def depths(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth of every rank in each row of ``parents`` (``parents[t, v]``: the parent of ``v`` in tree
    ``t``, -1 at its root) and whether the row is a tree (every rank reaches a rank with no parent:
    no cycle), by pointer jumping."""
    T, n = parents.shape
    has = parents >= 0
    d = has.astype(np.int64).ravel()
    # flat indices: rank v of row t is t * n + v; a root points at itself
    anc = (np.where(has, parents, np.arange(n)[None, :]) + (np.arange(T) * n)[:, None]).ravel()
    for _ in range(max(1, int(n).bit_length())):
        nxt = anc[anc]
        d = d + d[anc]
        if (nxt == anc).all():
            break
        anc = nxt
    ok = (parents.ravel()[anc] < 0).reshape(T, n).all(axis=1)
    return d.reshape(T, n), ok


def _path_to_deepest(par: np.ndarray, d: np.ndarray) -> list[int]:
    """The ranks (root excluded) on the paths from the root to the deepest ranks of one tree."""
    out: set[int] = set()
    for x in np.flatnonzero(d == d.max()).tolist():
        while par[x] >= 0 and x not in out:
            out.add(x)
            x = int(par[x])
    return sorted(out, key=lambda v: int(d[v]))


def shallower(parents: list[np.ndarray], counts: list[int], parts: list[np.ndarray],
              deadline: float | None = None) -> tuple[list[np.ndarray], int]:
    """The trees ``parents`` (one parent array per tree, -1 at its root) after the exchanges of the
    module docstring between trees of equal ``counts``, over single ranks and the rank sets
    ``parts``, until none is kept, :data:`MAX_PASSES` passes or ``deadline``; and how many were made.
    The loads of every pair are unchanged (each arc keeps its multiplicity, counts included)."""
    if len(parents) < 2:
        return [np.asarray(p).copy() for p in parents], 0
    P = np.array(parents, np.int64)
    cnt = np.asarray(counts, np.int64)
    D, ok = depths(P)
    if not ok.all():
        raise ValueError("shallower: a parent array is not a tree")
    H = D.max(axis=1)
    sets = [np.asarray(s, np.int64) for s in parts if 1 < len(s) < P.shape[1]]
    made = 0
    for _ in range(MAX_PASSES):
        kept = 0
        for a in np.argsort(-H, kind="stable").tolist():
            if H[a] <= 1:
                continue
            path = _path_to_deepest(P[a], D[a])
            on_path = np.zeros(P.shape[1], bool)
            on_path[path] = True
            # a set none of whose ranks lies on the way to a's deepest ranks leaves those as deep
            tried = [np.array([v]) for v in path] + [S for S in sets if on_path[S].any()]
            for S in tried:
                if deadline is not None and clock.now() > deadline:
                    return [p.copy() for p in P], made
                if (P[a, S] < 0).any():
                    continue                      # a's root is in S
                cand = (cnt == cnt[a]) & (P[:, S] >= 0).all(axis=1) & (P[:, S] != P[a, S]).any(axis=1)
                if S.size == 1:
                    # one rank: only a parent shallower in a than its own can make a shallower
                    cand &= D[a, np.maximum(P[:, S[0]], 0)] + 1 < D[a, S[0]]
                bs = np.flatnonzero(cand)
                if not bs.size:
                    continue
                na = np.repeat(P[a][None, :], bs.size, axis=0)
                na[:, S] = P[np.ix_(bs, S)]
                nb = P[bs].copy()
                nb[:, S] = P[a, S]
                dd, okk = depths(np.concatenate([na, nb]))      # both sides in one batch
                da, db, oka, okb = dd[:bs.size], dd[bs.size:], okk[:bs.size], okk[bs.size:]
                ha, hb = da.max(axis=1), db.max(axis=1)
                new_max, new_sum = np.maximum(ha, hb), ha + hb
                old_max, old_sum = np.maximum(H[a], H[bs]), H[a] + H[bs]
                better = oka & okb & ((new_max < old_max) | ((new_max == old_max) & (new_sum < old_sum)))
                if not better.any():
                    continue
                # the exchange that lowers the deeper tree most, then the sum
                gain = np.where(better, (old_max - new_max) * (2 * P.shape[1] + 1) + (old_sum - new_sum), -1)
                i = int(np.argmax(gain))
                b = int(bs[i])
                P[a], P[b], D[a], D[b] = na[i], nb[i], da[i], db[i]
                H[a], H[b] = ha[i], hb[i]
                kept += 1
        made += kept
        if not kept:
            break
    return [p.copy() for p in P], made
