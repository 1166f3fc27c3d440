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

Its parts: the row sets and how a loop's rows are written back (:mod:`eval_rows`), expressions
(:mod:`eval_expr`), the limits and what was spent of them (:mod:`eval_budget`); this module holds the
static analysis (carried names, sort keys), the statements and loops (:class:`Evaluator`) and the
gathering of the transfers into an :class:`Algorithm` (:func:`assemble`).
"""
from __future__ import annotations

import os

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm, TransferSite
from hccc.util.diagnostics import CompileError, Diagnostic, Location, printable
from hccc.compiler.frontend.rccl_parser import (HEADER_VARS, Assign, BinOp, For, Int, Neg, Pass, Program,
                          Transfer, Var, gc_paused)
from hccc.compiler.frontend.eval_budget import (DEFAULT_MAX_ITERATIONS, DEFAULT_MAX_TRANSFERS, DEFAULT_MAX_WORK,
                                                STATEMENT_COST, Budget, trip_scalar)
from hccc.compiler.frontend.eval_expr import value
from hccc.compiler.frontend.eval_rows import (I64 as _I64, Frame, collapse, expansion, fail, first, full,
                                              merge_sub)

# An expanded loop materialises at most this many rows at once; bigger loops run in pieces
# (contiguous parent rows, or iteration ranges of one row) so memory stays bounded.
CHUNK_ROWS = 1 << 22


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
                s.trip_known_positive = step != 0 and trip_scalar(start, stop, step) > 0
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


def _start_loc(e) -> Location:
    """Location of the leftmost token of an expression (binary nodes are located at their operator)."""
    while isinstance(e, BinOp):
        e = e.left
    return e.loc


# ----------------------------------------------------------------------------- evaluator
class Evaluator:
    """One evaluation of a parsed program: its statements run over row sets (:class:`Frame`,
    :mod:`hccc.compiler.frontend.eval_rows`), its expressions by :func:`~hccc.compiler.frontend.eval_expr.value`,
    what they spend counted by a :class:`~hccc.compiler.frontend.eval_budget.Budget`; the transfers
    each site made, gathered into an :class:`Algorithm` (:func:`assemble`)."""

    def __init__(self, program: Program, max_transfers: int, max_iterations: int,
                 max_work: int = DEFAULT_MAX_WORK):
        self.program = program
        self.budget = Budget(max_transfers, max_iterations, max_work)
        #: per transfer site, its blocks of transfers: (argument columns, loop values, sort keys)
        self.blocks: list[list] = [[] for _ in program.transfers]

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
        return assemble(prog, self.blocks)

    def block(self, stmts: list, f: Frame) -> None:
        memo: dict = {}   # see eval_expr.value; emptied whenever a statement may change f's variables
        for s in stmts:
            self.budget.charge(STATEMENT_COST + f.n, s.loc)
            t = type(s)
            if t is Transfer:
                self.transfer(s, f, memo)
            elif t is For:
                self.for_loop(s, f, memo)
                memo.clear()
            elif t is Assign:
                val, bound = value(s.value, f, memo, self.budget)
                f.vars[s.name] = (val, None, None)
                if bound is not None:
                    f.bounds[s.name] = (val, bound)
                memo.clear()
            elif t is Pass:
                pass
            else:  # pragma: no cover
                raise AssertionError(type(s).__name__)

    def transfer(self, s: Transfer, f: Frame, memo: dict) -> None:
        vals = [value(a, f, memo, self.budget)[0] for a in s.args]
        n = f.n
        if not self.budget.fits_transfers(n):
            self.budget.too_many_transfers(s)
        self.budget.ntransfers += n
        cols = [v if isinstance(v, np.ndarray) else full(n, v) for v in vals]
        lv = []
        keys = []
        fr = f
        while fr is not None:
            if fr.loop_var is not None:
                v = f.lift(fr.loop_val, fr)
                lv.append(v if isinstance(v, np.ndarray) else full(n, v))
                if s.needs_key:
                    k = f.lift(fr.iter_idx, fr)
                    keys.append(k if isinstance(k, np.ndarray) else full(n, k))
            fr = fr.parent
        lv.reverse()
        keys.reverse()
        # (n, depth); a transposed view (assemble makes the result contiguous)
        mat = np.array(lv).T if lv else np.zeros((n, 0), dtype=_I64)
        self.blocks[s.site].append((cols, mat, keys))

    # ---------------------------------------------------------------- loops
    def range_args(self, s: For, f: Frame, memo: dict):
        vals = [value(a, f, memo, self.budget)[0] for a in s.args]
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
                fail(step_loc, "range() step must not be zero", f, first(zero))
        elif step == 0:
            fail(step_loc, "range() step must not be zero", f, 0)
        return start, stop, step

    def for_loop(self, s: For, f: Frame, memo: dict) -> None:
        start, stop, step = self.range_args(s, f, memo)
        t, total = self.budget.trips(start, stop, step, f, s)
        self.budget.iterations += total
        if total == 0:
            return
        if s.direct_transfers and not self.budget.fits_transfers(total):
            self.budget.too_many_transfers(s.direct_transfers[0])
        self.budget.charge(total, s.loc)           # the expanded rows, or the sequential loop's indices
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
                merge_sub(f, sub, sub.pidx)
            r = r1

    def expanded(self, s: For, f: Frame, start, step, t, total: int, it_offset: int) -> None:
        """The loop's body run once over its expanded rows (every iteration of every row of ``f``),
        then each name it assigned written back into ``f`` (:func:`collapse`)."""
        pidx, it, last, all_nz = expansion(f.n, t, total)
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
        collapse(f, e, t, total, last, all_nz)

    def sequential(self, s: For, f: Frame, start, step, t) -> None:
        n = f.n
        maxt = int(t.max()) if isinstance(t, np.ndarray) else t
        for i in range(maxt):
            self.budget.charge(STATEMENT_COST, s.loc)
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
            merge_sub(f, sf, active)


# ---------------------------------------------------------------------------------- output
def assemble(prog: Program, blocks_of: list[list]) -> Algorithm:
    """The :class:`Algorithm` of ``prog``'s transfers, from each site's blocks (see
    :attr:`Evaluator.blocks`), in site order and within a site in loop order."""
    cols = [[], [], [], [], []]     # src, dst, step, chunk, channel
    ops, sites_col, counts, loop_values, sites = [], [], [], [], []
    named = any(len(tr.args) == 5 for tr in prog.transfers)   # some transfer names its channel
    for tr in prog.transfers:
        blocks = blocks_of[tr.site]
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
