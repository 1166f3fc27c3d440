"""Text lines made from columns with numpy: every line is the same sequence of constant strings and
fields, each field one value per line (an integer column, or a column of codes into a few strings).

:func:`column_lines` lays the lines out as rows of a byte matrix, each piece in a slot as wide as
its widest value (integers written digit by digit, right-aligned, the unused bytes of a slot zero),
then drops the zero bytes: no Python object per line. The MSCCL XML writer
(:mod:`hccc.compiler.interop.msccl_text`) writes its million-step files this way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_POW10 = 10 ** np.arange(1, 19, dtype=np.int64)


@dataclass(frozen=True)
class Choice:
    """A string field: ``codes[i]`` picks line ``i``'s string from ``strings`` (ASCII)."""

    codes: np.ndarray
    strings: tuple[str, ...]


def _digits(a: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers (0 has one)."""
    return 1 + np.searchsorted(_POW10, a, side="right")


def column_lines(parts: list) -> tuple[bytes, np.ndarray]:
    """The lines (each ending in a newline) of ``parts`` (``str``: the same in every line; an integer
    array: one value per line; :class:`Choice`), and the offset where each line ends."""
    n = next((len(p.codes) if isinstance(p, Choice) else len(p) for p in parts if not isinstance(p, str)), None)
    if n is None:
        raise ValueError("column_lines needs at least one column")
    if n == 0:
        return b"", np.zeros(0, np.int64)
    slots = []
    length = np.ones(n, np.int64)          # each line's length (its newline included)
    for p in parts:
        if isinstance(p, str):
            b = np.frombuffer(p.encode("ascii"), np.uint8)
            slots.append(("const", b, len(b)))
            length += len(b)
        elif isinstance(p, Choice):
            if len(p.codes) != n:
                raise ValueError("columns of different lengths")
            enc = [s.encode("ascii") for s in p.strings]
            w = max(map(len, enc), default=0)
            table = np.zeros((len(enc), max(w, 1)), np.uint8)
            for i, e in enumerate(enc):
                table[i, :len(e)] = np.frombuffer(e, np.uint8)
            codes = np.asarray(p.codes)
            slots.append(("choice", table[codes][:, :w], w))
            length += np.array([len(e) for e in enc], np.int64)[codes]
        else:
            a = np.asarray(p, np.int64)
            if len(a) != n:
                raise ValueError("columns of different lengths")
            neg = a < 0
            mag = np.abs(a)
            nd = _digits(mag)
            if mag.max(initial=0) < 1 << 32:
                mag = mag.astype(np.uint32)        # (faster digit arithmetic)
            w = int((nd + neg).max())
            slots.append(("int", (mag, nd, neg), w))
            length += nd + neg
    width = sum(s[2] for s in slots) + 1
    # built one slot column at a time in a (width, n) matrix (each write contiguous), then turned
    # into lines (rows) and the zero bytes dropped
    m = np.zeros((width, n), np.uint8)
    col = 0
    for kind, v, w in slots:
        if kind == "const":
            m[col:col + w] = v[:, None]
        elif kind == "choice":
            m[col:col + w] = v.T
        else:
            mag, nd, neg = v
            end = col + w - 1
            rest = mag.copy()
            for d in range(int(nd.max())):
                m[end - d] = np.where(d < nd, rest % 10 + 48, 0)
                rest //= 10
            rows = np.flatnonzero(neg)
            m[end - nd[rows], rows] = ord("-")
        col += w
    m[-1] = ord("\n")
    lines = np.ascontiguousarray(m.T)
    del m
    return lines[lines != 0].tobytes(), np.cumsum(length)


__all__ = ["Choice", "column_lines"]
