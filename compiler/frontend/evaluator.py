"""Vectorised, bounded evaluator for ResCCLang programs (AST from :mod:`rccl_parser`) -> Algorithm.

ResCCLang has no conditionals, so every statement runs for *all* active loop iterations. We
evaluate each statement once over a "row set": a :class:`Frame` holds one row per combination of
enclosing loop iterations, and every variable is either a Python int (same in every row) or an
int64 array with one entry per row.

* A ``for`` loop without loop-carried variables is *expanded*: rows are repeated by their trip
  counts (which may differ per row), the body runs once over the expanded rows, and afterwards
  every variable assigned in the body takes its value from the last iteration of each group
  (unchanged where the trip count was 0; undefined where it did not exist before).
* A loop with a loop-carried variable (assigned in the body and read before being definitely
  assigned in the same iteration, e.g. a counter ``s = s + 1``) runs sequentially over its
  iteration index ``i``, still vectorised across the outer rows (rows active where ``i < trip``).

The result equals plain sequential (Python) semantics; tests compare against a naive interpreter.
Bounds (iterations, transfers, total work, integer magnitude, division by zero, range step 0) are
checked before the work they guard, and reported at the offending construct with the loop values of the
first offending row, e.g. ``division by zero (n=3, r=0)``. The rows of an array result are scanned
for overflow only when what is known of its operands' magnitudes (scalars, loop ranges, earlier
results) does not already rule it out.
"""
from __future__ import annotations

import os

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm, TransferSite
from hccc.util.diagnostics import CompileError, Diagnostic, Location, printable
from hccc.compiler.frontend.rccl_parser import (HEADER_VARS, INT_LIMIT, Assign, BinOp, For, Int, Neg, Pass, Program,
                          Transfer, Var, gc_paused)

DEFAULT_MAX_TRANSFERS = 10 ** 7
DEFAULT_MAX_ITERATIONS = 10 ** 8
#: The evaluator's total work, in units of one row of one vectorised operation. Measured (CPython
#: 3.11, numpy, one core): a vectorised operation costs about 10 ns a row, and one statement run
#: once (by a loop with a carried name, which runs its body iteration by iteration) about 5 us, so
#: :data:`STATEMENT_COST` row units. The default budget is about 1.5 s of evaluation at those rates
#: and leaves room for the largest programs the transfer limit admits (10**7 transfers from a
#: loop of a few operations a row: about 7 * 10**7 units); ``HCCC_MAX_RCCL_WORK`` raises it.
DEFAULT_MAX_WORK = 150_000_000
#: the work of running one statement (or one iteration of a loop) once, in row units (see above)
STATEMENT_COST = 500
# An expanded loop materialises at most this many rows at once; bigger loops run in pieces
# (contiguous parent rows, or iteration ranges of one row) so memory stays bounded.
CHUNK_ROWS = 1 << 22

_I64 = np.int64


# ------------------------------------------------------------------------- static analysis
def _reads(e, out: set, keys: dict) -> int:
    """Adds the names ``e`` reads to ``out``; sets ``key`` on ``e`` and its subexpressions (equal
    keys: equal expressions; ``keys`` interns them) and returns ``e.key``."""
    t = type(e)
    if t is BinOp:
        k = (e.op, _reads(e.left, out, keys), _reads(e.right, out, keys))
    elif t is Int:
        k = ("int", e.value)
    elif t is Var:
        out.add(e.name)
        k = ("var", e.name)
    else:  # Neg
        k = ("neg", _reads(e.operand, out, keys))
    key = keys.get(k)
    if key is None:
        key = keys[k] = len(keys)
    e.key = key
    return key


def _fold(e):
    """Value of a literal-only expression, or None."""
    if isinstance(e, Int):
        return e.value
    if isinstance(e, Neg):
        v = _fold(e.operand)
        return None if v is None else -v
    if isinstance(e, BinOp):
        a, b = _fold(e.left), _fold(e.right)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if b == 0:
            return None
        return a // b if e.op in ("/", "//") else a % b
    return None


def _trip_scalar(start: int, stop: int, step: int) -> int:
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // (-step))


def _analyze_block(stmts: list, defined: set, keys: dict) -> tuple[set, set, set]:
    """Returns (exposed reads, assigned names, definitely assigned after) for one iteration.

    ``exposed`` = names read before being definitely assigned in ``stmts`` (given ``defined``).
    Marks every For node's ``carried`` / ``trip_known_positive`` / ``direct_transfers``.
    """
    exposed: set = set()
    assigned: set = set()
    d = set(defined)
    for s in stmts:
        t = type(s)
        if t is Transfer:
            r: set = set()
            for a in s.args:
                _reads(a, r, keys)
            if r:
                exposed |= r - d
        elif t is Assign:
            r = set()
            _reads(s.value, r, keys)
            exposed |= r - d
            assigned.add(s.name)
            d.add(s.name)
        elif t is For:
            r = set()
            for a in s.args:
                _reads(a, r, keys)
            exposed |= r - d
            e_body, a_body, d_body = _analyze_block(s.body, {s.var}, keys)
            s.carried = bool(e_body & a_body)
            s.direct_transfers = [x for x in s.body if type(x) is Transfer]
            vals = [_fold(a) for a in s.args]
            if all(v is not None for v in vals):
                start, stop, step = (0, vals[0], 1) if len(vals) == 1 else (
                    (vals[0], vals[1], 1) if len(vals) == 2 else tuple(vals))
                s.trip_known_positive = step != 0 and _trip_scalar(start, stop, step) > 0
            exposed |= e_body - d
            assigned |= a_body | {s.var}
            if s.trip_known_positive:
                d |= d_body | {s.var}
    return exposed, assigned, d


def _mark_keys(stmts: list, expanded_above: bool, needs: bool) -> None:
    """A transfer needs a sort key when a sequential loop encloses it inside an expanded loop."""
    for s in stmts:
        if isinstance(s, Transfer):
            s.needs_key = needs
        elif isinstance(s, For):
            _mark_keys(s.body, expanded_above or not s.carried,
                       needs or (s.carried and expanded_above))


def analyze(program: Program) -> None:
    _analyze_block(program.body, set(HEADER_VARS), {})
    _mark_keys(program.body, False, False)


# ------------------------------------------------------------------------------- frames
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


def _start_loc(e) -> Location:
    """Location of the leftmost token of an expression (binary nodes are located at their operator)."""
    while isinstance(e, BinOp):
        e = e.left
    return e.loc


def _maxabs(a) -> int:
    if isinstance(a, np.ndarray):
        if a.size == 0:
            return 0
        return max(int(a.max()), -int(a.min()))
    return abs(a)


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _full(n: int, v) -> np.ndarray:
    """``np.full(n, v, dtype=int64)`` without its Python-level overhead."""
    a = np.empty(n, dtype=_I64)
    a.fill(v)
    return a


# ----------------------------------------------------------------------------- evaluator
class Evaluator:
    def __init__(self, program: Program, max_transfers: int, max_iterations: int,
                 max_work: int = DEFAULT_MAX_WORK):
        self.program = program
        self.max_transfers = max_transfers
        self.max_iterations = max_iterations
        self.max_work = max_work
        self.work = 0
        self.iterations = 0
        self.ntransfers = 0
        self.blocks: list[list] = [[] for _ in program.transfers]

    # ---------------------------------------------------------------- errors
    @staticmethod
    def _fail(loc: Location, msg: str, frame: Frame | None = None, row: int = 0):
        if frame is not None and frame.n > 0:
            suffix = frame.describe(row)
            if suffix:
                msg = f"{msg} {suffix}"
        raise CompileError.at(loc, msg)

    def _charge(self, units: int, loc: Location) -> None:
        """Count ``units`` of work (:data:`DEFAULT_MAX_WORK`) before doing it; past the budget,
        a located error at the construct that would do it."""
        self.work += units
        if self.work > self.max_work:
            raise CompileError.at(loc, f"evaluation work limit exceeded: the program needs more than "
                                       f"{self.max_work} units of work (one unit: one row of one "
                                       f"operation; one statement run once: {STATEMENT_COST}); write "
                                       f"fewer nested loops, or set HCCC_MAX_RCCL_WORK to raise the limit")

    # ---------------------------------------------------------------- expressions
    def ev(self, e, f: Frame, memo: dict | None = None):
        return self._ev(e, f, {} if memo is None else memo)[0]

    def _ev(self, e, f: Frame, memo: dict):
        """(value, bound): ``bound`` >= the magnitude of every entry of an array value, or None
        when not known; for a scalar value it is unused (None). ``memo``: key -> (value, bound)
        of operations already evaluated over ``f`` since its variables last changed (programs
        repeat subexpressions across the transfers of one loop body)."""
        t = type(e)
        if t is Int:
            return e.value, None
        if t is BinOp:
            r = memo.get(e.key)
            if r is None:
                a, ba = self._ev(e.left, f, memo)
                b, bb = self._ev(e.right, f, memo)
                if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                    self._charge(f.n, e.loc)
                r = memo[e.key] = self._binop(e, a, b, f, ba, bb)
            return r
        if t is Var:
            v = f.read_bounded(e.name)
            if v is None:
                self._fail(e.loc, f"name '{e.name}' is not defined", f)
            val, mask, bound = v
            if mask is not None and not mask.all():
                self._fail(e.loc, f"name '{e.name}' is not defined", f, _first(~mask))
            return val, bound
        if t is Neg:
            v, bound = self._ev(e.operand, f, memo)
            return -v, bound
        raise AssertionError(f"unknown expression {type(e).__name__}")  # pragma: no cover

    def _binop(self, e: BinOp, a, b, f: Frame, ba, bb):
        """``a op b`` and a bound on its magnitude (see :meth:`_ev`). Array overflow is found by
        scanning the rows, which only runs when the operands' magnitudes (``ba`` / ``bb`` where
        known, else measured) allow a result beyond INT_LIMIT."""
        op = e.op
        arr = isinstance(a, np.ndarray) or isinstance(b, np.ndarray)
        if op == "+" or op == "-":
            if not arr:
                r = a + b if op == "+" else a - b
                if abs(r) > INT_LIMIT:
                    self._overflow(e, f, 0)
                return r, None
            r = (a + b) if op == "+" else (a - b)
            m = (_maxabs(a) if ba is None else ba) + (_maxabs(b) if bb is None else bb)
            if m > INT_LIMIT:
                bad = (r > INT_LIMIT) | (r < -INT_LIMIT)
                if bad.any():
                    self._overflow(e, f, _first(bad))
                m = INT_LIMIT
            return r, m
        if op == "*":
            if not arr:
                r = a * b
                if abs(r) > INT_LIMIT:
                    self._overflow(e, f, 0)
                return r, None
            m = (_maxabs(a) if ba is None else ba) * (_maxabs(b) if bb is None else bb)
            if m > INT_LIMIT:
                aa = np.abs(np.broadcast_to(a, (f.n,)))
                bb = np.abs(np.broadcast_to(b, (f.n,)))
                bad = (aa != 0) & (bb > INT_LIMIT // np.where(aa == 0, 1, aa))
                if bad.any():
                    self._overflow(e, f, _first(bad))
                m = INT_LIMIT
            return a * b, m
        # '/', '//', '%': Python floor semantics (numpy's integer ops agree).
        what = "modulo by zero" if op == "%" else "division by zero"
        if isinstance(b, np.ndarray):
            zero = b == 0
            if zero.any():
                self._fail(e.loc, what, f, _first(zero))
        elif b == 0:
            self._fail(e.loc, what, f, 0)
        if op == "%":   # |a % b| < |b|
            return a % b, (abs(b) if bb is None and not isinstance(b, np.ndarray) else bb)
        # |a // b| <= |a| for integers with b != 0
        return a // b, (abs(a) if ba is None and not isinstance(a, np.ndarray) else ba)

    def _overflow(self, e: BinOp, f: Frame, row: int):
        self._fail(e.loc, f"integer overflow: result of '{e.op}' exceeds 2**62 in magnitude", f, row)

    # ---------------------------------------------------------------- statements
    def run(self) -> Algorithm:
        prog = self.program
        top = Frame(1)
        h = prog.header
        param = h.collective.spec.parameter   # Header.root is the root or SendRecv's shift
        for name, val in zip(HEADER_VARS, (h.nranks, h.nchannels, h.nwarps, h.gpu_per_node, h.nic_per_node,
                                           h.root if param == "root" else 0, h.chunks_per_rank, h.nchunks,
                                           h.root if param == "shift" else 0)):
            top.vars[name] = (val, None, None)
        self.block(prog.body, top)
        return self.assemble()

    def block(self, stmts: list, f: Frame) -> None:
        memo: dict = {}   # see _ev; emptied whenever a statement may change f's variables
        for s in stmts:
            self._charge(STATEMENT_COST + f.n, s.loc)
            t = type(s)
            if t is Transfer:
                self.transfer(s, f, memo)
            elif t is For:
                self.for_loop(s, f, memo)
                memo.clear()
            elif t is Assign:
                val, bound = self._ev(s.value, f, memo)
                f.vars[s.name] = (val, None, None)
                if bound is not None:
                    f.bounds[s.name] = (val, bound)
                memo.clear()
            elif t is Pass:
                pass
            else:  # pragma: no cover
                raise AssertionError(type(s).__name__)

    def transfer(self, s: Transfer, f: Frame, memo: dict) -> None:
        vals = [self._ev(a, f, memo)[0] for a in s.args]
        n = f.n
        if self.ntransfers + n > self.max_transfers:
            self._too_many_transfers(s)
        self.ntransfers += n
        cols = [v if isinstance(v, np.ndarray) else _full(n, v) for v in vals]
        lv = []
        keys = []
        fr = f
        while fr is not None:
            if fr.loop_var is not None:
                v = f.lift(fr.loop_val, fr)
                lv.append(v if isinstance(v, np.ndarray) else _full(n, v))
                if s.needs_key:
                    k = f.lift(fr.iter_idx, fr)
                    keys.append(k if isinstance(k, np.ndarray) else _full(n, k))
            fr = fr.parent
        lv.reverse()
        keys.reverse()
        # (n, depth); a transposed view (assemble makes the result contiguous)
        mat = np.array(lv).T if lv else np.zeros((n, 0), dtype=_I64)
        self.blocks[s.site].append((cols, mat, keys))

    def _too_many_transfers(self, s: Transfer):
        raise CompileError.at(s.loc, f"too many transfers: the program makes more than "
                                     f"{self.max_transfers} (raise the max_transfers limit if "
                                     f"this is intended)")

    def range_args(self, s: For, f: Frame, memo: dict):
        vals = [self._ev(a, f, memo)[0] for a in s.args]
        if len(vals) == 1:
            start, stop, step = 0, vals[0], 1
        elif len(vals) == 2:
            start, stop, step = vals[0], vals[1], 1
        else:
            start, stop, step = vals
        step_loc = _start_loc(s.args[2]) if len(s.args) == 3 else s.range_loc
        if isinstance(step, np.ndarray):
            zero = step == 0
            if zero.any():
                self._fail(step_loc, "range() step must not be zero", f, _first(zero))
        elif step == 0:
            self._fail(step_loc, "range() step must not be zero", f, 0)
        return start, stop, step

    def trips(self, start, stop, step, f: Frame, s: For):
        """Per-row trip counts (int or int64 array) and their total, checked against the budget."""
        budget = self.max_iterations - self.iterations
        if not any(isinstance(x, np.ndarray) for x in (start, stop, step)):
            t = _trip_scalar(start, stop, step)
            total = t * f.n
            if total > budget:
                self._iteration_limit(s)
            return t, total
        n = f.n
        st = np.broadcast_to(np.asarray(start, dtype=_I64), (n,))
        sp = np.broadcast_to(np.asarray(stop, dtype=_I64), (n,))
        sc = np.broadcast_to(np.asarray(step, dtype=_I64), (n,))
        pos = sc > 0
        hi = np.where(pos, sp, st)
        lo = np.where(pos, st, sp)
        # hi - lo is exact modulo 2**64, and < 2**64 when hi > lo (|values| <= 2**62).
        d = hi.astype(np.uint64) - lo.astype(np.uint64)
        a = np.abs(sc).astype(np.uint64)
        t = d // a + (d % a != 0).astype(np.uint64)
        t = np.where(hi > lo, t, np.uint64(0))
        if int(t.max()) > budget:
            self._iteration_limit(s)
        t = t.astype(_I64)
        total = int(t.sum())
        if total > budget:
            self._iteration_limit(s)
        return t, total

    def _iteration_limit(self, s: For):
        raise CompileError.at(s.loc, f"loop iteration limit exceeded: the program would run more "
                                     f"than {self.max_iterations} loop iterations")

    def for_loop(self, s: For, f: Frame, memo: dict) -> None:
        start, stop, step = self.range_args(s, f, memo)
        t, total = self.trips(start, stop, step, f, s)
        self.iterations += total
        if total == 0:
            return
        if s.direct_transfers and self.ntransfers + total > self.max_transfers:
            self._too_many_transfers(s.direct_transfers[0])
        self._charge(total, s.loc)           # the expanded rows, or the sequential loop's indices
        if s.carried:
            self.sequential(s, f, start, step, t)
        elif total <= CHUNK_ROWS:
            self.expanded(s, f, start, step, t, total, 0)
        else:
            self.chunked(s, f, start, step, t)

    def chunked(self, s: For, f: Frame, start, step, t) -> None:
        """An expanded loop too big for one piece. Pieces may run one after another because the
        loop has no carried names: no piece reads what an earlier piece wrote."""
        n = f.n
        tt = t if isinstance(t, np.ndarray) else np.full(n, t, dtype=_I64)
        cum = np.cumsum(tt)
        cap = CHUNK_ROWS
        r = 0
        while r < n:
            base = int(cum[r] - tt[r])
            r1 = int(np.searchsorted(cum, base + cap, side="right"))
            if r1 > r:
                pieces = [(r, r1, 0, None)]
            else:  # one row alone is too big: split its iterations
                pieces = [(r, r + 1, i0, min(int(tt[r]), i0 + cap)) for i0 in range(0, int(tt[r]), cap)]
                r1 = r + 1
            for r0, r_end, i0, i1 in pieces:
                rows = np.arange(r0, r_end, dtype=_I64)
                sub = Frame(r_end - r0, f, None if (r0 == 0 and r_end == n) else rows)
                tsub = tt[r0:r_end] if i1 is None else np.array([i1 - i0], dtype=_I64)
                if not tsub.any():
                    continue
                sc = sub.lift(step, f)
                st = sub.lift(start, f) + sc * i0
                self.expanded(s, sub, st, sc, tsub, int(tsub.sum()), i0)
                self._merge_sub(f, sub, sub.pidx)
            r = r1

    def expanded(self, s: For, f: Frame, start, step, t, total: int, it_offset: int) -> None:
        n = f.n
        if not isinstance(t, np.ndarray):
            if t == 1:
                pidx, it = None, 0
            else:
                pidx = np.repeat(np.arange(n, dtype=_I64), t) if n > 1 else np.zeros(t, _I64)
                it = np.arange(n * t, dtype=_I64) % t if n > 1 else np.arange(t, dtype=_I64)
            last = None if t == 1 else np.arange(t - 1, n * t, t, dtype=_I64)
            all_nz = True
        else:
            pidx = np.repeat(np.arange(n, dtype=_I64), t)
            ends = np.cumsum(t)
            it = np.arange(total, dtype=_I64) - np.repeat(ends - t, t)
            last = ends - 1
            all_nz = bool((t > 0).all())
            if all_nz and total == n:
                pidx, last = None, None
        e = Frame(total, f, pidx, s.var)
        st = e.lift(start, f)
        sc = e.lift(step, f)
        val = st + sc * it
        e.loop_val = val
        e.iter_idx = it + it_offset if it_offset else it
        e.vars[s.var] = (val, None, None)
        if isinstance(val, np.ndarray) and not isinstance(st, np.ndarray) and not isinstance(sc, np.ndarray):
            # the values run from st to st + sc * (longest trip - 1), all between start and stop
            tmax = int(t.max()) if isinstance(t, np.ndarray) else t
            e.bounds[s.var] = (val, max(abs(st), abs(st + sc * (tmax - 1))))
        self.block(s.body, e)
        # collapse: each group takes its last iteration's value; where the trip count was 0, or
        # where no iteration of the group wrote the name, the value from before the loop stays.
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
                cand = np.where(a, np.arange(total, dtype=_I64), -1)
                src = np.full(n, -1, dtype=_I64)
                if isinstance(t, np.ndarray):
                    ne = np.flatnonzero(t > 0)
                    starts = (np.cumsum(t) - t)[ne]
                else:
                    ne = np.arange(n, dtype=_I64)
                    starts = ne * t
                src[ne] = np.maximum.reduceat(cand, starts)
            rows = np.flatnonzero(src >= 0)
            sel = src[rows]
            self._merge(f, name, v[sel] if isinstance(v, np.ndarray) else v,
                        None if m is None else m[sel], rows)

    @staticmethod
    def _merge(f: Frame, name: str, vals, mvals, rows: np.ndarray) -> None:
        """Write ``vals`` (aligned with ``rows``) into ``f``'s rows ``rows``; others keep theirs."""
        own = f.vars.get(name)
        if own is not None:
            ov, om, oa = own
            asg = np.ones(f.n, dtype=bool) if oa is None else oa.copy()
        else:
            old = f.read(name)
            asg = np.zeros(f.n, dtype=bool)
            ov, om = old if old is not None else (0, np.zeros(f.n, dtype=bool))
        base = np.array(np.broadcast_to(ov, (f.n,)), dtype=_I64)
        bmask = np.ones(f.n, dtype=bool) if om is None else om.copy()
        base[rows] = vals
        bmask[rows] = True if mvals is None else mvals
        asg[rows] = True
        f.vars[name] = (base, None if bmask.all() else bmask, None if asg.all() else asg)

    def sequential(self, s: For, f: Frame, start, step, t) -> None:
        n = f.n
        maxt = int(t.max()) if isinstance(t, np.ndarray) else t
        for i in range(maxt):
            self._charge(STATEMENT_COST, s.loc)
            if isinstance(t, np.ndarray) and not (t > i).all():
                active = np.flatnonzero(t > i)
                m = len(active)
            else:
                active, m = None, n
            sf = Frame(m, f, active, s.var)
            val = sf.lift(start, f) + sf.lift(step, f) * i
            sf.loop_val = val
            sf.iter_idx = i
            sf.vars[s.var] = (val, None, None)
            self.block(s.body, sf)
            self._merge_sub(f, sf, active)

    def _merge_sub(self, f: Frame, sf: Frame, active) -> None:
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
            self._merge(f, name, vals, mvals, rows)

    # ---------------------------------------------------------------- output
    def assemble(self) -> Algorithm:
        prog = self.program
        cols = [[], [], [], [], []]     # src, dst, step, chunk, channel
        ops, sites_col, counts, loop_values, sites = [], [], [], [], []
        named = any(len(tr.args) == 5 for tr in prog.transfers)   # some transfer names its channel
        for tr in prog.transfers:
            blocks = self.blocks[tr.site]
            depth = len(tr.loop_vars)
            sites.append(TransferSite(tr.loc, tuple(tr.loop_vars)))
            if not blocks:
                loop_values.append(np.zeros((0, depth), dtype=_I64))
                continue
            if len(blocks) == 1:
                bc, mat, _ = blocks[0]
            else:
                bc = [np.concatenate([b[0][k] for b in blocks]) for k in range(len(tr.args))]
                mat = np.concatenate([b[1] for b in blocks])
                if tr.needs_key:
                    keys = [np.concatenate([b[2][k] for b in blocks]) for k in range(depth)]
                    order = np.lexsort(keys[::-1])
                    bc = [c[order] for c in bc]
                    mat = mat[order]
            for k in range(4):
                cols[k].append(np.asarray(bc[k], dtype=_I64))
            cnt = len(bc[0])
            if named:
                cols[4].append(np.asarray(bc[4], dtype=_I64) if len(bc) > 4 else np.zeros(cnt, _I64))
            ops.append(tr.op)
            sites_col.append(tr.site)
            counts.append(cnt)
            loop_values.append(np.ascontiguousarray(mat, dtype=_I64))

        def cat(parts, dtype):
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        return Algorithm(
            header=prog.header,
            src=cat(cols[0], _I64), dst=cat(cols[1], _I64), step=cat(cols[2], _I64),
            chunk=cat(cols[3], _I64), op=np.repeat(np.array(ops, dtype=np.uint8), counts),
            site=np.repeat(np.array(sites_col, dtype=_I64), counts),
            sites=sites, loop_values=loop_values, channel=cat(cols[4], _I64) if named else None,
        )


def work_budget() -> int:
    """The work budget: ``HCCC_MAX_RCCL_WORK`` (a positive number of units) or
    :data:`DEFAULT_MAX_WORK`."""
    text = os.environ.get("HCCC_MAX_RCCL_WORK", "").strip().replace("_", "")
    if not text:
        return DEFAULT_MAX_WORK
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) <= 0:
        raise CompileError([Diagnostic(f"HCCC_MAX_RCCL_WORK must be a positive number of work units, "
                                       f"got {printable(text, limit=40)!r}", None)])
    return int(text)


def evaluate(program: Program, *, max_transfers: int = DEFAULT_MAX_TRANSFERS,
             max_iterations: int = DEFAULT_MAX_ITERATIONS, max_work: int | None = None) -> Algorithm:
    """Evaluate a parsed program into an :class:`Algorithm` (bounded by iterations, transfers
    and total work, :data:`DEFAULT_MAX_WORK`; errors are located)."""
    budget = work_budget() if max_work is None else max_work
    with gc_paused():
        analyze(program)
        return Evaluator(program, max_transfers, max_iterations, budget).run()
