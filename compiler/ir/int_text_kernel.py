"""The compiled form of :meth:`hccc.compiler.ir.int_text.RowText.render` (numba, when installed).

The integer columns and the row masks come as tuples of arrays (numba compiles one version per
tuple length, cached on disk); both passes run blocks of rows on all cores (numba's prange). A row's text is a list of pieces; each piece is a constant (an entry of ``texts``), the decimal
text of an integer column, or a column of indices into constants (``choice``), optionally only on
the rows of a boolean column. Two passes over the rows: the length of every row (its offsets),
then the bytes. Same output as the numpy path of ``int_text.py`` (``tests/test_int_text.py``).

Why ``int_text.py`` keeps its numpy path beside this kernel: this kernel writes byte by byte, which
the interpreter runs 35-360x slower than numpy's whole-column operations; compiled it is 1.6x
faster than numpy at 65,024 rows (and slower on small inputs: starting its threads costs more than
the rows). Measured with ``benchmarks/twins.py`` (HM AllReduce on N x 8 GPUs; a 2-core machine under a load
of about 25, so the figures are slow but the ratios hold), seconds of one ``HCCC_P(...)``-like line per primitive:

==========  ===========  ===============  ================
rows        numpy        kernel, plain    kernel, compiled
==========  ===========  ===============  ================
3,968       0.0024       0.878            0.208
65,024      0.370        13.1             0.228
==========  ===========  ===============  ================

So numpy renders below :data:`COMPILED_FROM` rows and wherever numba is missing, this kernel
compiled above it (:class:`~hccc.util.jit.Kernels`).
"""
from __future__ import annotations

import numpy as np

from hccc.util.jit import Kernels, have_numba, prange

# numba is optional (extras "scale", "sim", "synth"); int_text.py has a numpy path without it
HAVE_NUMBA = have_numba()

TEXT, INT, CHOICE, BLOB = 0, 1, 2, 3


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


#: the text of the least int64 (which has no positive counterpart), as bytes: a str constant would
#: make numba compile its unicode indexing, seconds the first time
_MIN_TEXT = np.frombuffer(b"-9223372036854775808", np.uint8).copy()
#: the two-digit texts "00".."99", for writing two digits per division
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode("ascii"), np.uint8).copy()


def _write_int(buf, at, v):
    """Write v's decimal text at buf[at:]; returns the position after it."""
    if v < 0:
        if v == -9223372036854775807 - 1:
            for i in range(20):
                buf[at + i] = _MIN_TEXT[i]
            return at + 20
        buf[at] = 45
        at += 1
        v = -v
    end = at + _ndigits(v)
    p = end
    while v >= 100:
        q = v // 100
        d = (v - q * 100) * 2
        p -= 2
        buf[p] = _PAIRS[d]
        buf[p + 1] = _PAIRS[d + 1]
        v = q
    if v >= 10:
        buf[p - 2] = _PAIRS[v * 2]
        buf[p - 1] = _PAIRS[v * 2 + 1]
    else:
        buf[p - 1] = 48 + v
    return end


#: rows per block: each block of rows is one unit of parallel work, rendered piece by piece
BLOCK = 4096


def render_rows(n, kind, arg, mask_of, ints, masks, texts, text_off, end_text):
    """Texts of rows ``0..n-1``; piece ``k`` (present on the rows where ``masks[mask_of[k]]`` holds,
    on every row when ``mask_of[k] < 0``) is, by ``kind[k]``: TEXT the constant
    ``texts[text_off[a]:text_off[a + 1]]`` with ``a = arg[k, 0]``; INT the decimal text of
    ``ints[arg[k, 0]][row]``; CHOICE the constant ``arg[k, 1] + ints[arg[k, 0]][row]``; BLOB the
    bytes ``texts[s:s + l]`` with ``s = ints[arg[k, 0]][row]``, ``l = ints[arg[k, 1]][row]``. Every
    row ends with ``end_text``. Returns (the bytes as a uint8 array, the row offsets).

    Blocks of :data:`BLOCK` rows run on all cores; inside a block the loop runs piece by piece
    (one column lookup per piece and block, then a tight loop over the block's rows)."""
    npieces = len(kind)
    elen = len(end_text)
    nblocks = (n + BLOCK - 1) // BLOCK
    rowlen = np.empty(n, np.int64)
    for b in prange(nblocks):          # pass 1: row lengths
        r0 = b * BLOCK
        r1 = min(n, r0 + BLOCK)
        for r in range(r0, r1):
            rowlen[r] = elen
        for k in range(npieces):
            m = mask_of[k]
            mk = masks[m] if m >= 0 else masks[0]
            kd = kind[k]
            if kd == TEXT:
                t = arg[k, 0]
                ln = text_off[t + 1] - text_off[t]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        rowlen[r] += ln
            elif kd == INT:
                col = ints[arg[k, 0]]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        rowlen[r] += _ndigits(col[r])
            elif kd == BLOB:
                col = ints[arg[k, 1]]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        rowlen[r] += col[r]
            else:
                col = ints[arg[k, 0]]
                base = arg[k, 1]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        t = base + col[r]
                        rowlen[r] += text_off[t + 1] - text_off[t]
    offsets = np.zeros(n + 1, np.int64)
    total = 0
    for r in range(n):
        total += rowlen[r]
        offsets[r + 1] = total
    buf = np.empty(total, np.uint8)
    for b in prange(nblocks):          # pass 2: the bytes (each row writes its own range)
        r0 = b * BLOCK
        r1 = min(n, r0 + BLOCK)
        at = offsets[r0:r1].copy()
        for k in range(npieces):
            m = mask_of[k]
            mk = masks[m] if m >= 0 else masks[0]
            kd = kind[k]
            if kd == INT:
                col = ints[arg[k, 0]]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        at[r - r0] = _write_int(buf, at[r - r0], col[r])
                continue
            if kd == TEXT:
                t = arg[k, 0]
                b0 = text_off[t]
                ln = text_off[t + 1] - b0
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        a = at[r - r0]
                        for i in range(ln):
                            buf[a + i] = texts[b0 + i]
                        at[r - r0] = a + ln
            elif kd == BLOB:
                cs = ints[arg[k, 0]]
                cl = ints[arg[k, 1]]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        a = at[r - r0]
                        s0 = cs[r]
                        ln = cl[r]
                        for i in range(ln):
                            buf[a + i] = texts[s0 + i]
                        at[r - r0] = a + ln
            else:
                col = ints[arg[k, 0]]
                base = arg[k, 1]
                for r in range(r0, r1):
                    if m < 0 or mk[r]:
                        t = base + col[r]
                        b0 = text_off[t]
                        ln = text_off[t + 1] - b0
                        a = at[r - r0]
                        for i in range(ln):
                            buf[a + i] = texts[b0 + i]
                        at[r - r0] = a + ln
        for r in range(r0, r1):
            a = at[r - r0]
            for i in range(elen):
                buf[a + i] = end_text[i]
    return buf, offsets


#: rows from which a call of :meth:`hccc.compiler.ir.int_text.RowText.render` uses the compiled
#: loop (:meth:`~hccc.util.jit.Kernels.compiled_for`)
COMPILED_FROM = 100_000
KERNELS = Kernels(globals(), ["_ndigits", "_write_int", "render_rows"], min_work=COMPILED_FROM,
                  parallel=["render_rows"])
