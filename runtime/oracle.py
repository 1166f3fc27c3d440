"""The host side of a checked single-process run: the data a run puts in (small integers, exact
under every reduction order; garbage in outputs and scratch, so an element never written shows up)
and the comparison of what its kernels wrote with the oracle.

The oracle is :func:`hccc.runtime.reference.execute` run on the same inputs (exact comparison: the
reference reduces in the program's own order, rounding bfloat16 after every reduction like the
kernels do); its outputs are also compared with the collective's definition
(:func:`~hccc.runtime.reference.expected_for`), which catches IRs that do not implement their
collective. A program the reference executor refuses (it can deadlock with one FIFO slot, though
the real FIFO depth may hide that) is compared with the definition directly.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import IRFormatError, ProgramIR
from hccc.runtime import reference
from hccc.util import dtypes as dtypes_table

#: how the host holds a device buffer's elements (bfloat16: its bit patterns)
DEVICE_DTYPE = {d.name: (np.uint16 if d.name == "bfloat16" else np.dtype(d.numpy).type)
                for d in dtypes_table.DTYPES}
#: what out-of-place outputs and scratch start as (a NaN, the most negative integer, 0xA5 for
#: uint8), so that an element never written shows up
GARBAGE = {d.name: (np.uint16(0x7FC0) if d.name == "bfloat16" else np.dtype(d.numpy).type(np.nan)
                    if d.floating else np.dtype(d.numpy).type(0xA5 if d.kind == "uint" else np.iinfo(d.numpy).min))
           for d in dtypes_table.DTYPES}
#: largest magnitude every partial sum of the inputs may reach and stay exact in the type
_EXACT = {d.name: d.exact for d in dtypes_table.DTYPES}
#: the generated inputs' largest magnitude: small, so every sum and product stays exact
_INPUT_BOUND = 8


def make_inputs(ir: ProgramIR, count: int, dtype: str, op: str, seed: int) -> list[np.ndarray]:
    """Every rank's input at ``count`` elements: small integers whose every partial sum (or, under
    ``prod``, product) over the ranks is exact in ``dtype``."""
    n = max(ir.nranks, 1)
    bound = max(1, min(_INPUT_BOUND, _EXACT[dtype] // n))
    if op == "prod":   # every partial product exact: bound ** N within the range
        bound = max(1, min(_INPUT_BOUND, int(_EXACT[dtype] ** (1.0 / n))))
    return reference.make_inputs(ir.collective, ir.nranks, count, dtype, nchunks=ir.nchunks,
                                 seed=seed, low=-bound, high=bound + 1)


def to_device(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` as the device holds it (bfloat16: rounded, its upper 16 bits)."""
    if dtype == "bfloat16":
        bits = reference.round_bf16(np.asarray(x, np.float32)).view(np.uint32)
        return (bits >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, dtype=DEVICE_DTYPE[dtype])


def from_device(a: np.ndarray, dtype: str) -> np.ndarray:
    """A device buffer's elements as the oracle sees them (bfloat16 as float32)."""
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise exact agreement (NaN equals NaN)."""
    eq = a == b
    if np.issubdtype(a.dtype, np.floating):
        eq |= np.isnan(a) & np.isnan(b)
    return eq


def fmt(v) -> str:
    return repr(v.item()) if hasattr(v, "item") else repr(v)


def close(dtype: str, nranks: int):
    """Elementwise agreement of a reference run with the collective's definition: exact for
    integers (and for the generated small-integer data, which every order sums exactly); floats
    within the rounding that a different reduction order of ``nranks`` terms may cause."""
    def agree(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not np.issubdtype(np.asarray(b).dtype, np.floating):
            return same(a, b)
        eps = 2.0 ** -7 if dtype == "bfloat16" else float(np.finfo(dtype).eps)
        tol = 4 * max(nranks, 1) * eps
        fin = np.abs(b[np.isfinite(b)]).astype(np.float64)   # (infinities compare as equals)
        scale = float(fin.max()) if fin.size else 0.0
        return np.isclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True)
    return agree


def count_wrong(collective: str, got, want, agree=same, what: str = ""):
    """Elements of ``got`` differing from ``want`` (all ranks, by ``agree``) and a line about the
    first. Ranks whose ``want`` (or ``got``) is None have no specified output: nothing is wrong
    there. ``what``: the name of ``got`` when it is not the kernels' outputs."""
    total, first = 0, None
    for r in range(len(want)):
        if want[r] is None or got[r] is None:
            continue
        a, b = np.asarray(got[r]), np.asarray(want[r])
        if len(a) != len(b):
            total += max(len(a), len(b))
            first = first or f"rank {r}: {len(a)} output elements where {len(b)} are expected"
            continue
        bad = ~agree(a, b)
        n = int(bad.sum())
        if n and first is None:
            i = int(np.flatnonzero(bad)[0])
            if what:
                first = (f"rank {r}, output element {i}: the {what} gives {fmt(a[i])}, "
                         f"{collective} needs {fmt(b[i])}")
            else:
                first = f"rank {r}, output element {i}: got {fmt(a[i])}, expected {fmt(b[i])}"
        total += n
    return total, first


def compare(ir: ProgramIR, dtype: str, op: str, outs, inputs, inplace: bool):
    """(wrong, first wrong, collective_wrong, oracle name) for the kernels' outputs ``outs`` of a
    run of ``ir`` on ``inputs``."""
    bf16 = dtype == "bfloat16"
    agree = close(dtype, ir.nranks)
    coll = list(reference.expected_for(ir, [np.array(x) for x in inputs], op, bf16=bf16))
    # ranks whose output the collective leaves unspecified (a Reduce's non-root ranks) are not
    # compared at all
    unspecified = {r for r, c in enumerate(coll) if c is None}
    try:
        want = reference.execute(ir, [np.array(x) for x in inputs], op=op, inplace=inplace, bf16=bf16)
    except IRFormatError:
        # The reference executor refuses programs that can deadlock under its worst-case model
        # (one FIFO slot); they may still run with the real FIFO depth. Compare with the
        # collective's definition instead.
        wrong, first = count_wrong(ir.collective, outs, coll, agree)
        return wrong, first, 0, "definition"
    want = [None if r in unspecified else w for r, w in enumerate(want)]
    wrong, first = count_wrong(ir.collective, outs, want)
    coll_wrong, coll_first = count_wrong(ir.collective, want, coll, agree, "reference run")
    return wrong, first or coll_first, coll_wrong, "reference"


__all__ = ["DEVICE_DTYPE", "GARBAGE", "make_inputs", "to_device", "from_device", "same", "close",
           "count_wrong", "compare"]
