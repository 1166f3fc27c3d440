"""Test helper: the slice model of compiler/passes/slicing.py written out again, plainly, and
minimised by trying every slice (the oracle ``auto_slice_bytes`` is checked against).

Everything here is computed from the module docstring's definitions with Python integers and
exact fractions: the micro-batches the kernels count, the largest channel's part of a slice as
``channel_part`` cuts it, the critical path's units by the samples' straight lines, and the bounds
of a program's own policy. Nothing is imported from the module under test but the constants it
names and the :class:`CriticalPath` record (whose fields this reads)."""
from __future__ import annotations

from fractions import Fraction

from hccc.compiler.ir.program_ir import channel_part


def units(path, m: int) -> Fraction:
    """``CP(m)``: the samples' values joined by straight lines, ``slope`` a micro-batch past them."""
    xs, ys = [int(x) for x in path.samples], [int(y) for y in path.units]
    if m >= xs[-1]:
        return Fraction(ys[-1] + int(path.slope) * (m - xs[-1]))
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= m <= x1:
            return y0 + Fraction((y1 - y0) * (m - x0), x1 - x0)
    raise AssertionError("unreachable")


def chunk_elements(nbytes: int, nchunks: int, element_bytes: int) -> int:
    """Elements of the largest chunk."""
    count = nbytes // element_bytes
    return (count + nchunks - 1) // nchunks


def micro_batches(nbytes: int, nchunks: int, slice_bytes: int, element_bytes: int) -> int:
    per = slice_bytes // element_bytes
    return max(1, (chunk_elements(nbytes, nchunks, element_bytes) + per - 1) // per)


def largest_part(slice_bytes: int, nchannels: int, element_bytes: int) -> int:
    """Bytes of the largest channel's part of a slice window."""
    elems = slice_bytes // element_bytes
    parts = [channel_part(elems, 16 // element_bytes, nchannels, c) for c in range(nchannels)]
    return max(hi - lo for lo, hi in parts) * element_bytes


def bounds(nbytes: int, nchunks: int, share: int, element_bytes: int, micro: int, floor: int) -> tuple[int, int]:
    """(least, largest) slice: the floor (or the whole chunk, rounded up to 16, when smaller), at
    most the chunk's ``micro``-th part rounded up to 16 unless the floor is more, at most the share
    (rounded down to 16)."""
    def up16(x: int) -> int:
        return (x + 15) // 16 * 16
    chunk = max(1, chunk_elements(nbytes, nchunks, element_bytes)) * element_bytes
    cap = share // 16 * 16
    lo = min(up16(floor), up16(chunk))
    hi = max(lo, up16((chunk + micro - 1) // micro))
    return min(lo, cap), min(hi, cap)


def seconds(slice_bytes: int, nbytes: int, nchunks: int, element_bytes: int, path, nchannels: int,
            c: float, b: float) -> Fraction:
    """The model's time of one slice, exactly: CP(m) (c + part / B)."""
    m = micro_batches(nbytes, nchunks, slice_bytes, element_bytes)
    return units(path, m) * (Fraction(c) + Fraction(largest_part(slice_bytes, nchannels, element_bytes)) / Fraction(b))


def best_slice(nbytes: int, nchunks: int, share: int, element_bytes: int, path, nchannels: int, c: float,
               b: float, micro: int = 1, floor: int = 16) -> tuple[int, Fraction]:
    """(the smallest slice of least time, that time), trying every multiple of 16 in the bounds."""
    lo, hi = bounds(nbytes, nchunks, share, element_bytes, micro, floor)
    best = None
    for s in range(lo, hi + 1, 16):
        t = seconds(s, nbytes, nchunks, element_bytes, path, nchannels, c, b)
        if best is None or t < best[1]:
            best = (s, t)
    return best
