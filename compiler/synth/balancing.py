"""Chunks moved between the trees of one root to balance the resources' loads.

A rounded packing's counts are repaired (:func:`_repair`: single chunks moved between a root's
generated trees while the most loaded resource gets lighter) and, where that misses, regrown
(:func:`_regrow_pass`: chunks moved onto the cheapest tree of their root at prices exponential in
the loads, new trees included; its state :class:`_Regrowth`); :func:`_time_of` is the time of
counts in the link model. The rounding that calls them is :mod:`.rounding`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hccc.compiler.synth.packing_lp import _Columns


#: the passes over every chunk each of the regrowing's exponents (:data:`.packing.REGROW_ALPHAS`)
#: may make
REGROW_PASSES = 3


@dataclass
class _Regrowth:
    """The regrowing's state (:meth:`_Rounding._regrown`): utilisation per chunk of every column,
    the counts, the utilisation of every resource, the best ``(time, counts)`` so far and the
    first column made by it."""

    U: list
    cnt: list
    util: np.ndarray
    best: tuple
    first_new: int


def _regrow_pass(cs: "_Columns", grow: _Regrowth, a: float, inv: np.ndarray, okr: np.ndarray,
                 lp_val: float) -> bool:
    """One pass of the regrowing (:meth:`.rounding._Rounding._regrown`) over every chunk at the
    exponent ``a``, chunks moved onto the cheapest tree of their root (new trees join ``cs``):
    whether a chunk moved. ``lp_val``: the LP's time, which a chunk loading no resource past
    it leaves the chunk in place."""
    moved = False
    cnt, U = grow.cnt, grow.U
    for j in np.repeat(np.arange(len(cnt)), cnt).tolist():
        if cnt[j] == 0 or not (grow.util[U[j] > 0] > lp_val).any():
            continue        # a chunk loading no resource past the LP's time stays
        rest = grow.util - U[j]
        r, rev = cs.root_of(j)
        top = float(grow.util.max())         # the exponents' shift: no overflow
        pi = inv * np.exp(a * (rest - top))
        here = float(np.exp(a * (grow.util - top)).sum())
        for rail in (False, True):
            par = cs.price(pi, r, rev, rail=rail, many=True)[1]
            if par is None:
                continue
            i = cs.col_of.get((r, rev, par.tobytes()))
            if i is None:
                cs.add(r, par, rev)
                i = len(cs.cols) - 1
                U.append(cs.unit_of(i) * inv)
                cnt.append(0)
            if i == j:
                continue
            trial = rest + U[i]
            there = float(np.exp(np.minimum(a * (trial - top), 700.0)).sum())
            if there < here * (1 - 1e-12):
                cnt[j] -= 1
                cnt[i] += 1
                grow.util, moved = trial, True
                break
        tm = float(grow.util[okr].max()) if okr.any() else 0.0
        if tm < grow.best[0] * (1 - 1e-12):
            grow.best = (tm, list(cnt))
    return moved


def _time_of(counts, load_unit, capn, K) -> float:
    load = (counts[:, None] * load_unit).sum(axis=0) / K
    ok = capn > 0
    return float((load[ok] / capn[ok]).max()) if ok.any() else 0.0


def _repair(counts: np.ndarray, root: np.ndarray, load_unit: np.ndarray, capn: np.ndarray, K: int,
            rounds: int = 200) -> np.ndarray:
    """Move single chunks between trees of one root while the most loaded resource gets lighter."""
    counts = counts.copy()
    ok = capn > 0
    inv = np.where(ok, 1.0 / np.where(ok, capn, 1.0), 0.0)
    util_unit = load_unit * inv[None, :] / K       # per chunk on a column: utilisation added
    util = counts @ util_unit
    for _ in range(rounds):
        e = int(util.argmax())
        cur = util[e]
        if cur <= 0:
            break
        donors = np.flatnonzero((counts > 0) & (util_unit[:, e] > 0))
        best = None
        for j in donors.tolist():
            alts = np.flatnonzero(root == root[j])
            alts = alts[alts != j]
            if not alts.size:
                continue
            trial = util[None, :] - util_unit[j][None, :] + util_unit[alts]
            peak = trial.max(axis=1)
            a = int(peak.argmin())
            if peak[a] < cur * (1 - 1e-9) and (best is None or peak[a] < best[0]):
                best = (float(peak[a]), j, int(alts[a]))
        if best is None:
            break
        _, j, a = best
        counts[j] -= 1
        counts[a] += 1
        util = util - util_unit[j] + util_unit[a]
    return counts
