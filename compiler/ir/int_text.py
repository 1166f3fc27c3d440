"""Decimal text of integer columns, built with numpy (no Python object per value).

The IR JSON and the kernel sources are mostly integers: at 1,024 ranks that is ~60 M numbers, where
``str(int)`` and ``join`` cost about a microsecond each. Here a column becomes a byte matrix of its
digits (one row per value, right-aligned) and the texts are scattered into one output buffer:

- :func:`decimal_digits` gives that matrix and each value's text length (sign included);
- :func:`join_ints` is ``sep.join(map(str, a))`` (:func:`join_ints_view`: the same as bytes, uncopied);
- :class:`RowText` assembles one line per row from constant pieces, integer columns and per-row
  choices among a few constant strings, e.g. ``HCCC_P(%d, SEND, %d);`` for every primitive.

Every result equals the ``str``/``%d`` formatting it replaces (``tests/test_int_text.py``).
"""
from __future__ import annotations

import threading

import numpy as np

from hccc.compiler.ir import int_text_kernel

__all__ = ["decimal_digits", "join_ints", "join_ints_view", "RowText"]


def decimal_digits(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(digits, length)``: ``digits[i, -length[i]:]`` is the ASCII text of ``a[i]`` (``uint8``,
    right-aligned, a leading ``-`` for negative values)."""
    v = np.asarray(a, np.int64)
    n = len(v)
    if n == 0:
        return np.zeros((0, 1), np.uint8), np.zeros(0, np.int64)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo <= max(4096, n // 16) and n > 64:
        # few distinct values (ranks, TBs, ops, small offsets): texts of the range, then one gather
        d, ln = _digits(np.arange(lo, hi + 1, dtype=np.int64))
        i = v - lo
        return d[i], ln[i]
    return _digits(v)


def _digits(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(v)
    neg = v < 0
    mag = np.abs(v).astype(np.uint64)     # |INT64_MIN| fits an unsigned 64-bit value
    width = max(1, len(str(int(mag.max())))) if n else 1
    out = np.full((n, width + 1), 48, np.uint8)
    ndig = np.ones(n, np.int64)
    rest = mag
    for j in range(width, 0, -1):
        rest, digit = np.divmod(rest, np.uint64(10))
        out[:, j] += digit.astype(np.uint8)
        if j < width:
            ndig += mag >= _POW10[width - j]
    length = ndig + neg
    if neg.any():
        # each negative value's sign just before its first digit
        rows = np.flatnonzero(neg)
        out[rows, width - ndig[rows]] = 45
    return out, length


_POW10 = np.array([10 ** k for k in range(20)], np.uint64)

#: rows assembled at once (bounds the temporary byte matrix)
_BLOCK = 1 << 17


def _tail_mask(length: np.ndarray, width: int) -> np.ndarray:
    """Row i selects its last ``length[i]`` of ``width`` columns."""
    return np.arange(width) >= (width - length)[:, None]


def join_ints(a: np.ndarray, sep: str = ",") -> str:
    """``sep.join(map(str, a))`` for an integer array."""
    return str(join_ints_view(a, sep), "ascii")


def join_ints_view(a: np.ndarray, sep: str = ",") -> memoryview:
    """:func:`join_ints` as ASCII bytes: a view of the rendered buffer (no copy of a long text)."""
    a = np.asarray(a)
    n = len(a)
    if n == 0:
        return memoryview(b"")
    rt = RowText(n).int(a)
    text, _ = rt.render_view(end=sep)
    return text[:len(text) - len(sep)]


class RowText:
    """One line of text per row, built piece by piece (all rows at once).

    ``text(s)`` appends a constant; ``int(a)`` the decimal text of ``a[row]``; ``choice(idx, names)``
    the string ``names[idx[row]]``; ``blob(data, start, length)`` the bytes
    ``data[start[row]:start[row] + length[row]]``. A piece may be limited to the rows of a boolean
    ``where`` (its array arguments still have one entry per row). :meth:`render` ends every row
    with ``end`` and returns the bytes and each row's start offset (``offsets[n]`` is the total).
    From :data:`COMPILED_FROM` rows on (and with numba installed) a compiled loop writes the text
    (:mod:`hccc.compiler.ir.int_text_kernel`); otherwise numpy does, piece by piece (35-360x faster
    than the kernel run as plain Python: measured there).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.specs: list[tuple] = []   # (kind, arrays/constants..., where)

    def text(self, s: str, where: np.ndarray | None = None) -> "RowText":
        if s:
            self.specs.append(("text", s.encode("ascii"), where))
        return self

    def int(self, a: np.ndarray, where: np.ndarray | None = None) -> "RowText":
        self.specs.append(("int", np.asarray(a, np.int64), where))
        return self

    def choice(self, idx: np.ndarray, names: list[str], where: np.ndarray | None = None) -> "RowText":
        self.specs.append(("choice", np.asarray(idx, np.int64), [nm.encode("ascii") for nm in names], where))
        return self

    def blob(self, data: bytes, start: np.ndarray, length: np.ndarray,
             where: np.ndarray | None = None) -> "RowText":
        self.specs.append(("blob", bytes(data), np.asarray(start, np.int64), np.asarray(length, np.int64), where))
        return self

    def render(self, end: str = "\n", compiled: bool | None = None) -> tuple[bytes, np.ndarray]:
        """``compiled``: None picks by size (``int_text_kernel.COMPILED_FROM`` rows, ``HCCC_JIT``
        overriding: :class:`~hccc.util.jit.Kernels`); True/False force the compiled /
        numpy path."""
        text, offsets = self.render_view(end, compiled)
        return text.obj if isinstance(text.obj, bytes) else text.tobytes(), offsets

    def render_view(self, end: str = "\n", compiled: bool | None = None) -> tuple[memoryview, np.ndarray]:
        """:meth:`render` with the text as a read-only byte view of the buffer it was written into
        (a long text is not copied)."""
        if compiled is None:
            render_rows = int_text_kernel.KERNELS.compiled_for("render_rows", self.n)
        elif compiled:
            render_rows = int_text_kernel.KERNELS.require("render_rows")
        else:
            render_rows = None
        if render_rows is not None:
            text, offsets = self._render_compiled(end, render_rows)
            return memoryview(text).toreadonly(), offsets
        text, offsets = self._render_numpy(end)
        return memoryview(text), offsets

    # ------------------------------------------------------------------ compiled path
    def _render_compiled(self, end: str, render_rows) -> tuple[np.ndarray, np.ndarray]:
        kernel = int_text_kernel
        texts: list[bytes] = []
        text_bytes = 0
        ints: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        kinds, args, mask_of = [], [], []
        mask_ids: dict[int, int] = {}
        pending_blobs = []

        def add_text(b: bytes) -> int:
            nonlocal text_bytes
            texts.append(b)
            text_bytes += len(b)
            return len(texts) - 1

        def add_int(a: np.ndarray) -> int:
            ints.append(np.ascontiguousarray(a, np.int64))
            return len(ints) - 1

        for spec in self.specs:
            where = spec[-1]
            if where is None:
                mask_of.append(-1)
            else:
                key = id(where)
                if key not in mask_ids:
                    masks.append(np.ascontiguousarray(where, np.bool_))
                    mask_ids[key] = len(masks) - 1
                mask_of.append(mask_ids[key])
            if spec[0] == "text":
                kinds.append(kernel.TEXT)
                args.append((add_text(spec[1]), 0))
            elif spec[0] == "int":
                kinds.append(kernel.INT)
                args.append((add_int(spec[1]), 0))
            elif spec[0] == "choice":
                first = len(texts)
                for nm in spec[2]:
                    add_text(nm)
                kinds.append(kernel.CHOICE)
                args.append((add_int(spec[1]), first))
            else:
                kinds.append(kernel.BLOB)
                pending_blobs.append((len(args), spec))
                args.append((0, 0))
        # blobs go after the constants, their start columns shifted to where they land
        blob_parts = []
        base = text_bytes
        for k, (_, data, start, length, _) in pending_blobs:
            args[k] = (add_int(start + base), add_int(length))
            blob_parts.append(data)
            base += len(data)
        # numba compiles one kernel per tuple length (8 s each, the first time): pad to a power of
        # two, at least 16 masks and 32 integer columns (the padding is never read), so that one
        # version serves every text hccc writes (the .rccl text and the kernels' tables need up to
        # 29 integer columns and 8 masks)
        masks += [np.zeros(1, np.bool_)] * (_padded(len(masks), 16) - len(masks))
        ints += [np.zeros(1, np.int64)] * (_padded(len(ints), 32) - len(ints))
        text_off = np.zeros(len(texts) + 1, np.int64)
        np.cumsum([len(t) for t in texts], out=text_off[1:])
        blob = np.frombuffer(b"".join(texts) + b"".join(blob_parts) + b"\0", np.uint8)
        with _KERNEL_LOCK:
            buf, offsets = render_rows(
                self.n, np.array(kinds, np.int64), np.array(args, np.int64).reshape(-1, 2),
                np.array(mask_of, np.int64), tuple(ints), tuple(masks), blob, text_off,
                np.frombuffer(end.encode("ascii") + b"\0", np.uint8)[:-1].copy())
        return buf, offsets

    # ------------------------------------------------------------------ numpy path
    def _pieces(self) -> list[tuple]:
        """(block(r0, r1) -> right-aligned byte matrix of those rows, text length per row)."""
        n = self.n
        out = []
        for spec in self.specs:
            kind, where = spec[0], spec[-1]
            if kind == "text":
                b = np.frombuffer(spec[1], np.uint8)
                block = (lambda b: lambda r0, r1: np.broadcast_to(b, (r1 - r0, len(b))))(b)
                length = np.full(n, len(b), np.int64)
            elif kind == "int":
                digits, length = decimal_digits(spec[1])
                block = (lambda d: lambda r0, r1: d[r0:r1])(digits)
            elif kind == "choice":
                idx, enc = spec[1], spec[2]
                width = max([len(e) for e in enc] + [1])
                table = np.zeros((len(enc), width), np.uint8)
                for i, e in enumerate(enc):        # right-aligned, like decimal_digits
                    if e:
                        table[i, width - len(e):] = np.frombuffer(e, np.uint8)
                lens = np.array([len(e) for e in enc], np.int64)
                block = (lambda t, i: lambda r0, r1: t[i[r0:r1]])(table, idx)
                length = lens[idx]
            else:
                data, start, length = spec[1], spec[2], spec[3]
                arr = np.frombuffer(data, np.uint8) if len(data) else np.zeros(1, np.uint8)
                if where is not None:
                    length = np.where(where, length, 0)

                def block(r0, r1, arr=arr, start=start, length=length):
                    ln = length[r0:r1]
                    w = max(1, int(ln.max()) if len(ln) else 1)
                    ix = (start[r0:r1] - (w - ln))[:, None] + np.arange(w)
                    return arr[np.clip(ix, 0, len(arr) - 1)]
            if where is not None:
                length = np.where(where, length, 0)
            out.append((block, np.asarray(length, np.int64)))
        return out

    def _render_numpy(self, end: str) -> tuple[bytes, np.ndarray]:
        n = self.n
        pieces = self._pieces()
        row_len = np.zeros(n, np.int64)
        for _, ln in pieces:
            row_len += ln
        e = np.frombuffer(end.encode("ascii"), np.uint8)
        row_len += len(e)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(row_len, out=offsets[1:])
        out = []
        for r0 in range(0, n, _BLOCK):
            r1 = min(n, r0 + _BLOCK)
            mats, masks = [], []
            for block, ln in pieces:
                m = block(r0, r1)
                mats.append(m)
                masks.append(_tail_mask(ln[r0:r1], m.shape[1]))
            if len(e):
                mats.append(np.broadcast_to(e, (r1 - r0, len(e))))
                masks.append(np.ones((r1 - r0, len(e)), bool))
            if mats:
                out.append(np.hstack(mats)[np.hstack(masks)].tobytes())
        return b"".join(out), offsets


#: one compiled text kernel at a time: it already runs on every core, and numba's workqueue threading
#: layer (used where no OpenMP or TBB is installed) must not be entered by two threads at once
_KERNEL_LOCK = threading.Lock()

#: rows from which :meth:`RowText.render` uses the compiled loop (below it, loading numba costs more)
COMPILED_FROM = int_text_kernel.COMPILED_FROM


def _padded(count: int, least: int) -> int:
    """The tuple length :meth:`RowText._render_compiled` pads ``count`` arrays to: a power of two,
    at least ``least`` and more than ``count`` (one padding array at least)."""
    size = least
    while size <= count:
        size *= 2
    return size
