"""Expressions of the DSL evaluator (:mod:`hccc.compiler.frontend.evaluator`) over a row set:
:func:`value` gives an expression's value in every row of a :class:`~hccc.compiler.frontend.eval_rows.Frame`
with a bound on its magnitude; undefined names, division by zero and overflow beyond
:data:`~hccc.compiler.frontend.rccl_parser.INT_LIMIT` are located errors naming the first
offending row's loop values. The rows of an array result are scanned for overflow only when what is
known of its operands' magnitudes (scalars, loop ranges, earlier results) does not already rule it out.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.rccl_parser import INT_LIMIT, BinOp, Int, Neg, Var
from hccc.compiler.frontend.eval_budget import Budget
from hccc.compiler.frontend.eval_rows import Frame, fail, first
from hccc.util.diagnostics import did_you_mean


def maxabs(a) -> int:
    """The largest magnitude in ``a`` (an int, or an array: 0 when empty)."""
    if isinstance(a, np.ndarray):
        if a.size == 0:
            return 0
        return max(int(a.max()), -int(a.min()))
    return abs(a)


def value(e, f: Frame, memo: dict, budget: Budget):
    """(value, bound): ``bound`` >= the magnitude of every entry of an array value, or None
    when not known; for a scalar value it is unused (None). ``memo``: key -> (value, bound)
    of operations already evaluated over ``f`` since its variables last changed (programs
    repeat subexpressions across the transfers of one loop body). Array operations are charged
    to ``budget``, one unit a row."""
    t = type(e)
    if t is Int:
        return e.value, None
    if t is BinOp:
        r = memo.get(e.key)
        if r is None:
            a, ba = value(e.left, f, memo, budget)
            b, bb = value(e.right, f, memo, budget)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                budget.charge(f.n, e.loc)
            r = memo[e.key] = binop(e, a, b, f, ba, bb)
        return r
    if t is Var:
        v = f.read_bounded(e.name)
        if v is None:
            fail(e.loc, f"name '{e.name}' is not defined{did_you_mean(e.name, f.names())}", f)
        val, mask, bound = v
        if mask is not None and not mask.all():
            fail(e.loc, f"name '{e.name}' is not defined", f, first(~mask))
        return val, bound
    if t is Neg:
        v, bound = value(e.operand, f, memo, budget)
        return -v, bound
    raise AssertionError(f"unknown expression {type(e).__name__}")  # pragma: no cover


def binop(e: BinOp, a, b, f: Frame, ba, bb):
    """``a op b`` and a bound on its magnitude (see :func:`value`). Array overflow is found by
    scanning the rows, which only runs when the operands' magnitudes (``ba`` / ``bb`` where
    known, else measured) allow a result beyond INT_LIMIT."""
    op = e.op
    if op == "+" or op == "-":
        return _additive(e, a, b, f, ba, bb)
    if op == "*":
        return _product(e, a, b, f, ba, bb)
    # '/', '//', '%': Python floor semantics (numpy's integer ops agree).
    what = "modulo by zero" if op == "%" else "division by zero"
    if isinstance(b, np.ndarray):
        zero = b == 0
        if zero.any():
            fail(e.loc, what, f, first(zero))
    elif b == 0:
        fail(e.loc, what, f, 0)
    if op == "%":   # |a % b| < |b|
        return a % b, (abs(b) if bb is None and not isinstance(b, np.ndarray) else bb)
    # |a // b| <= |a| for integers with b != 0
    return a // b, (abs(a) if ba is None and not isinstance(a, np.ndarray) else ba)


def _additive(e: BinOp, a, b, f: Frame, ba, bb):
    """``a + b`` or ``a - b`` and its bound (:func:`binop`)."""
    op = e.op
    if not (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
        r = a + b if op == "+" else a - b
        if abs(r) > INT_LIMIT:
            _overflow(e, f, 0)
        return r, None
    r = (a + b) if op == "+" else (a - b)
    m = (maxabs(a) if ba is None else ba) + (maxabs(b) if bb is None else bb)
    if m > INT_LIMIT:
        bad = (r > INT_LIMIT) | (r < -INT_LIMIT)
        if bad.any():
            _overflow(e, f, first(bad))
        m = INT_LIMIT
    return r, m


def _product(e: BinOp, a, b, f: Frame, ba, bb):
    """``a * b`` and its bound (:func:`binop`)."""
    if not (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
        r = a * b
        if abs(r) > INT_LIMIT:
            _overflow(e, f, 0)
        return r, None
    m = (maxabs(a) if ba is None else ba) * (maxabs(b) if bb is None else bb)
    if m > INT_LIMIT:
        aa = np.abs(np.broadcast_to(a, (f.n,)))
        bb = np.abs(np.broadcast_to(b, (f.n,)))
        bad = (aa != 0) & (bb > INT_LIMIT // np.where(aa == 0, 1, aa))
        if bad.any():
            _overflow(e, f, first(bad))
        m = INT_LIMIT
    return a * b, m


def _overflow(e: BinOp, f: Frame, row: int):
    fail(e.loc, f"integer overflow: result of '{e.op}' exceeds 2**62 in magnitude", f, row)
