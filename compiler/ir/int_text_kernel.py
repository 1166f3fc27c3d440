"""The compiled form of :meth:`hccc.compiler.ir.int_text.RowText.render` (numba, when installed).

The integer columns and the row masks come as tuples of arrays (numba compiles one version per
tuple length, cached on disk); both passes run their rows on all cores (numba's prange). A row's text is a list of pieces; each piece is a constant (an entry of ``texts``), the decimal
text of an integer column, or a column of indices into constants (``choice``), optionally only on
the rows of a boolean column. Two passes over the rows: the length of every row (its offsets),
then the bytes. Same output as the numpy path of ``int_text.py`` (``tests/test_int_text.py``).
"""
from __future__ import annotations

import numpy as np

try:  # numba is optional (extras "scale", "sim", "synth"); int_text.py has a numpy path without it
    from numba import njit as _numba_njit
    from numba import prange

    def _jit(fn):
        return _numba_njit(cache=True, nogil=True)(fn)

    def _jit_parallel(fn):
        return _numba_njit(cache=True, nogil=True, parallel=True)(fn)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    HAVE_NUMBA = False
    prange = range

    def _jit(fn):
        return fn

    _jit_parallel = _jit

TEXT, INT, CHOICE, BLOB = 0, 1, 2, 3


@_jit
def _ndigits(v):
    if v < 0:
        if v == -9223372036854775807 - 1:
            return 20
        return 1 + _ndigits(-v)
    n = 1
    p = 10
    while v >= p:                      # comparisons, not divisions
        n += 1
        if n == 19:
            return 19
        p *= 10
    return n


@_jit
def _write_int(buf, at, v):
    """Write v's decimal text at buf[at:]; returns the position after it."""
    if v < 0:
        buf[at] = 45
        at += 1
        if v == -9223372036854775807 - 1:
            digits = "9223372036854775808"
            for i in range(19):
                buf[at + i] = ord(digits[i])
            return at + 19
        v = -v
    n = _ndigits(v)
    end = at + n
    p = end - 1
    while True:
        buf[p] = 48 + v % 10
        v //= 10
        if v == 0:
            break
        p -= 1
    return end


@_jit_parallel
def render_rows(n, kind, arg, mask_of, ints, masks, texts, text_off, end_text):
    """Texts of rows ``0..n-1``; piece ``k`` (present on the rows where ``masks[mask_of[k]]`` holds,
    on every row when ``mask_of[k] < 0``) is, by ``kind[k]``: TEXT the constant
    ``texts[text_off[a]:text_off[a + 1]]`` with ``a = arg[k, 0]``; INT the decimal text of
    ``ints[arg[k, 0]][row]``; CHOICE the constant ``arg[k, 1] + ints[arg[k, 0]][row]``; BLOB the
    bytes ``texts[s:s + l]`` with ``s = ints[arg[k, 0]][row]``, ``l = ints[arg[k, 1]][row]``. Every
    row ends with ``end_text``. Returns (the bytes as a uint8 array, the row offsets)."""
    npieces = len(kind)
    elen = len(end_text)
    rowlen = np.empty(n, np.int64)
    for r in prange(n):                # pass 1: row lengths (rows on all cores)
        total = elen
        for k in range(npieces):
            m = mask_of[k]
            if m >= 0 and not masks[m][r]:
                continue
            kd = kind[k]
            if kd == TEXT:
                t = arg[k, 0]
                total += text_off[t + 1] - text_off[t]
            elif kd == INT:
                total += _ndigits(ints[arg[k, 0]][r])
            elif kd == BLOB:
                total += ints[arg[k, 1]][r]
            else:
                t = arg[k, 1] + ints[arg[k, 0]][r]
                total += text_off[t + 1] - text_off[t]
        rowlen[r] = total
    offsets = np.zeros(n + 1, np.int64)
    for r in range(n):
        offsets[r + 1] = offsets[r] + rowlen[r]
    buf = np.empty(offsets[n], np.uint8)
    for r in prange(n):                # pass 2: the bytes (each row writes its own range)
        at = offsets[r]
        for k in range(npieces):
            m = mask_of[k]
            if m >= 0 and not masks[m][r]:
                continue
            kd = kind[k]
            if kd == INT:
                at = _write_int(buf, at, ints[arg[k, 0]][r])
                continue
            if kd == TEXT:
                t = arg[k, 0]
                b0, b1 = text_off[t], text_off[t + 1]
            elif kd == BLOB:
                b0 = ints[arg[k, 0]][r]
                b1 = b0 + ints[arg[k, 1]][r]
            else:
                t = arg[k, 1] + ints[arg[k, 0]][r]
                b0, b1 = text_off[t], text_off[t + 1]
            for i in range(b0, b1):
                buf[at] = texts[i]
                at += 1
        for i in range(elen):
            buf[at + i] = end_text[i]
    return buf, offsets
