"""Row sets of the DSL evaluator (:mod:`hccc.compiler.frontend.evaluator`): a :class:`Frame` holds
one row per combination of enclosing loop iterations, each variable a Python int (the same in every
row) or an int64 array with one entry per row; and how what a loop's rows assigned is written back
into the rows that enclose it (:func:`collapse`, :func:`merge_sub`, :func:`merge`).
"""
from __future__ import annotations

import numpy as np

from hccc.util.diagnostics import CompileError, Location

I64 = np.int64


class Frame:
    """A row set. ``pidx[j]`` is the parent row of row ``j`` (``None``: identity mapping)."""

    __slots__ = ("n", "parent", "pidx", "vars", "cache", "maps", "loop_var", "loop_val", "iter_idx",
                 "bounds")

    def __init__(self, n: int, parent: "Frame | None" = None, pidx: np.ndarray | None = None,
                 loop_var: str | None = None):
        self.n = n
        self.parent = parent
        self.pidx = pidx
        # name -> (value, defined-mask, assigned-mask) for names assigned in this frame; masks are
        # None when true for every row. "assigned" = written during this frame's own iteration
        # (rows where a nested zero-trip loop skipped the write hold an older value).
        self.vars: dict = {}
        self.cache: dict = {}     # name -> (value, mask, bound) inherited from an ancestor, lifted
        # name -> (array, b): every entry of that array (the value in ``vars`` while it is the
        # same object) has magnitude <= b; lets expressions skip overflow scans (see _binop)
        self.bounds: dict = {}
        self.maps: dict = {}      # id(ancestor) -> composite row index (or None)
        self.loop_var = loop_var
        self.loop_val = None
        self.iter_idx = None

    def index_from(self, anc: "Frame"):
        if anc is self:
            return None
        key = id(anc)
        if key in self.maps:
            return self.maps[key]
        up = self.parent.index_from(anc)
        if up is None:
            idx = self.pidx
        elif self.pidx is None:
            idx = up
        else:
            idx = up[self.pidx]
        self.maps[key] = idx
        return idx

    def lift(self, val, anc: "Frame"):
        if not isinstance(val, np.ndarray):
            return val
        idx = self.index_from(anc)
        return val if idx is None else val[idx]

    def read(self, name: str):
        """(value, mask) lifted to this frame's rows, or None when never assigned."""
        v = self.read_bounded(name)
        return None if v is None else (v[0], v[1])

    def read_bounded(self, name: str):
        """(value, mask, bound) lifted to this frame's rows, or None when never assigned.
        ``bound``: a known bound on the magnitude of an array value, else None."""
        v = self.vars.get(name)
        if v is not None:
            b = self.bounds.get(name)
            return v[0], v[1], (b[1] if b is not None and b[0] is v[0] else None)
        v = self.cache.get(name)
        if v is not None:
            return v
        f = self.parent
        while f is not None:
            pv = f.vars.get(name)
            if pv is not None:
                val, mask = pv[0], pv[1]
                b = f.bounds.get(name)
                res = (self.lift(val, f), None if mask is None else self.lift(mask, f),
                       b[1] if b is not None and b[0] is val else None)
                self.cache[name] = res
                return res
            f = f.parent
        return None

    def names(self) -> list[str]:
        """Every name assigned in this frame or an enclosing one (what a misspelt name is matched
        against)."""
        out, f = [], self
        while f is not None:
            out += list(f.vars) + ([f.loop_var] if f.loop_var else [])
            f = f.parent
        return out

    def describe(self, j: int) -> str:
        parts = []
        f = self
        while f is not None:
            if f.loop_var is not None:
                v = f.loop_val
                parts.append(f"{f.loop_var}={int(v[j]) if isinstance(v, np.ndarray) else int(v)}")
            if f.pidx is not None:
                j = int(f.pidx[j])
            f = f.parent
        return "(" + ", ".join(reversed(parts)) + ")" if parts else ""


def fail(loc: Location, msg: str, frame: Frame | None = None, row: int = 0):
    """A CompileError at ``loc``, its message followed by the loop values of ``frame``'s row ``row``."""
    if frame is not None and frame.n > 0:
        suffix = frame.describe(row)
        if suffix:
            msg = f"{msg} {suffix}"
    raise CompileError.at(loc, msg)


def first(mask: np.ndarray) -> int:
    """The first row where ``mask`` holds."""
    return int(np.argmax(mask))


def full(n: int, v) -> np.ndarray:
    """``np.full(n, v, dtype=int64)`` without its Python-level overhead."""
    a = np.empty(n, dtype=I64)
    a.fill(v)
    return a


def expansion(n: int, t, total: int):
    """How an expanded loop's rows come from ``n`` enclosing rows with trip counts ``t`` (an int
    for all, or an array; ``total`` rows in all): ``(pidx, it, last, all_nz)``, the parent row of
    each row (None: row j is parent row j), its iteration index, the last row of each group (None:
    every group is one row), and whether every trip count is nonzero."""
    if not isinstance(t, np.ndarray):
        if t == 1:
            pidx, it = None, 0
        else:
            pidx = np.repeat(np.arange(n, dtype=I64), t) if n > 1 else np.zeros(t, I64)
            it = np.arange(n * t, dtype=I64) % t if n > 1 else np.arange(t, dtype=I64)
        last = None if t == 1 else np.arange(t - 1, n * t, t, dtype=I64)
        return pidx, it, last, True
    pidx = np.repeat(np.arange(n, dtype=I64), t)
    ends = np.cumsum(t)
    it = np.arange(total, dtype=I64) - np.repeat(ends - t, t)
    last = ends - 1
    all_nz = bool((t > 0).all())
    if all_nz and total == n:
        pidx, last = None, None
    return pidx, it, last, all_nz


def collapse(f: Frame, e: Frame, t, total: int, last, all_nz: bool) -> None:
    """Write back what expanded frame ``e`` (rows of ``f`` repeated by trip counts ``t``) assigned:
    each group takes its last iteration's value; where the trip count was 0, or where no
    iteration of the group wrote the name, the value from before the loop stays."""
    n = f.n
    for name, (v, m, a) in e.vars.items():
        if a is None and all_nz:
            if last is not None:
                if isinstance(v, np.ndarray):
                    v = v[last]
                if m is not None:
                    m = m[last]
            f.vars[name] = (v, m, None)
            continue
        if a is None:
            src = np.where(t > 0, last, -1)
        else:
            cand = np.where(a, np.arange(total, dtype=I64), -1)
            src = np.full(n, -1, dtype=I64)
            if isinstance(t, np.ndarray):
                ne = np.flatnonzero(t > 0)
                starts = (np.cumsum(t) - t)[ne]
            else:
                ne = np.arange(n, dtype=I64)
                starts = ne * t
            src[ne] = np.maximum.reduceat(cand, starts)
        rows = np.flatnonzero(src >= 0)
        sel = src[rows]
        merge(f, name, v[sel] if isinstance(v, np.ndarray) else v, None if m is None else m[sel], rows)


def merge(f: Frame, name: str, vals, mvals, rows: np.ndarray) -> None:
    """Write ``vals`` (aligned with ``rows``) into ``f``'s rows ``rows``; others keep theirs."""
    own = f.vars.get(name)
    if own is not None:
        ov, om, oa = own
        asg = np.ones(f.n, dtype=bool) if oa is None else oa.copy()
    else:
        old = f.read(name)
        asg = np.zeros(f.n, dtype=bool)
        ov, om = old if old is not None else (0, np.zeros(f.n, dtype=bool))
    base = np.array(np.broadcast_to(ov, (f.n,)), dtype=I64)
    bmask = np.ones(f.n, dtype=bool) if om is None else om.copy()
    base[rows] = vals
    bmask[rows] = True if mvals is None else mvals
    asg[rows] = True
    f.vars[name] = (base, None if bmask.all() else bmask, None if asg.all() else asg)


def merge_sub(f: Frame, sf: Frame, active) -> None:
    """Write back what sub-frame ``sf`` (rows ``active`` of ``f``; None: all) assigned.

    Rows that ``sf`` did not write already hold ``f``'s current value, so only written rows
    are copied."""
    for name, (v, mk, a) in sf.vars.items():
        if active is None and a is None:
            f.vars[name] = (v, mk, None)
            continue
        if a is None:
            rows = active
            vals, mvals = v, mk
        else:
            sel = np.flatnonzero(a)
            rows = sel if active is None else active[sel]
            vals = v[sel] if isinstance(v, np.ndarray) else v
            mvals = None if mk is None else mk[sel]
        merge(f, name, vals, mvals, rows)
