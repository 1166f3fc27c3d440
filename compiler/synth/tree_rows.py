"""A packing's trees as transfer rows.

:func:`allgather_rows` (chunks down the out-trees, a rank forwarding at the step after it receives)
and :func:`reducescatter_rows` (partial sums up the in-trees, the children of a rank reducing into
it at distinct steps, :func:`_reduce_steps`) list every ``(src, dst, step, chunk)``;
:func:`loop_rows` gives a symmetric packing's representative trees only (:class:`LoopRows`), which
:func:`hccc.compiler.synth.emit.to_rccl` writes as loops.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.synth.packing import Packing
from hccc.compiler.synth.symmetry import Symmetry


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every rank in the spanning tree ``parent`` (-1 at its root): :func:`.exchanges.depths`."""
    from hccc.compiler.synth.exchanges import depths

    return depths(np.asarray(parent, np.int64)[None, :])[0][0]


def _tree_rows(packing: Packing, reduce: bool, trees) -> np.ndarray:
    """``(src, dst, step, root, j)`` rows of the trees ``trees``: chunk ``j`` of the root per chunk
    the tree carries (a root's chunks numbered in tree order)."""
    next_chunk: dict[int, int] = {}
    out = []
    for t in trees:
        r, par, cnt = packing.roots[t], packing.parents[t], packing.counts[t]
        d = _depths(par)
        v = np.flatnonzero(par >= 0)
        if reduce:
            step = _reduce_steps(par, d)
            src, dst, st = v, par[v], step[v]
        else:
            src, dst, st = par[v], v, d[v] - 1
        for _ in range(cnt):
            j = next_chunk.get(r, 0)
            next_chunk[r] = j + 1
            out.append(np.stack([src, dst, st, np.full(v.size, r), np.full(v.size, j)], axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 5), np.int64)


def _reduce_steps(par: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Step of every rank's send to its parent in an in-tree: once all its children have reduced
    into it, siblings at distinct steps."""
    n = par.size
    step = np.zeros(n, np.int64)       # step of v's send to its parent
    ready = np.zeros(n, np.int64)      # first step v may send (all children reduced into it)
    for lev in range(int(d.max()), 0, -1):
        vs = np.flatnonzero(d == lev)
        # siblings: group by parent, order by readiness, give distinct steps >= ready
        order = vs[np.lexsort((vs, ready[vs], par[vs]))]
        prev_p, last = -1, -1
        for v in order.tolist():
            p = int(par[v])
            s = int(ready[v]) if p != prev_p else max(int(ready[v]), last + 1)
            step[v] = s
            prev_p, last = p, s
            ready[p] = max(int(ready[p]), s + 1)
    return step


@dataclass
class LoopRows:
    """Transfers that repeat under a symmetry: the rows ``(src, dst, step, root, j, op)`` of the
    representative trees; every element of ``symmetry`` maps them onto the transfers of the
    translated trees (ranks and roots shifted, chunk ``root * K + j``). ``expand`` lists them all;
    :func:`hccc.compiler.synth.emit.to_rccl` writes them as loops over the shifts."""

    symmetry: Symmetry
    chunks_per_rank: int
    rows: np.ndarray

    def expand(self) -> np.ndarray:
        """All ``(src, dst, step, chunk, op)`` rows, element by element."""
        E = self.symmetry.ranks
        r = self.rows
        if not len(r):
            return np.zeros((0, 5), np.int64)
        G = E.shape[0]
        K = self.chunks_per_rank
        out = np.empty((G, len(r), 5), np.int64)
        out[:, :, 0] = E[:, r[:, 0]]
        out[:, :, 1] = E[:, r[:, 1]]
        out[:, :, 2] = r[None, :, 2]
        out[:, :, 3] = E[:, r[:, 3]] * K + r[None, :, 4]
        out[:, :, 4] = r[None, :, 5]
        return out.reshape(-1, 5)


def _rows_of(packing: Packing, reduce: bool) -> np.ndarray:
    if packing.symmetry is None:
        r5 = _tree_rows(packing, reduce, range(len(packing.roots)))
        return np.c_[r5[:, :3], r5[:, 3] * packing.chunks_per_rank + r5[:, 4]] if len(r5) else np.zeros((0, 4), np.int64)
    return loop_rows(packing, 0, reduce=reduce).expand()[:, :4]


def loop_rows(packing: Packing, op: int, step0: int = 0, *, reduce: bool = False) -> LoopRows | None:
    """The representative trees' transfers of a symmetric packing (None without a symmetry), ``op``
    in every row and steps from ``step0``."""
    sym = packing.symmetry
    if sym is None:
        return None
    r5 = _tree_rows(packing, reduce, range(0, len(packing.roots), len(sym)))
    r5[:, 2] += step0
    return LoopRows(sym, packing.chunks_per_rank, np.c_[r5, np.full(len(r5), op, np.int64)])


def allgather_rows(packing: Packing) -> np.ndarray:
    """``(src, dst, step, chunk)`` rows: chunk ``r*K + j`` of root ``r`` down its tree, a rank
    forwarding at the step after the one it receives in."""
    return _rows_of(packing, False)


def reducescatter_rows(packing: Packing) -> np.ndarray:
    """``(src, dst, step, chunk)`` rows of the ReduceScatter whose in-trees are ``packing``'s trees
    (computed on the transposed network) turned around: a rank sends its partial sum to its tree
    parent once all its children have reduced into it; the children of one rank reduce into it at
    distinct steps."""
    return _rows_of(packing, True)
