"""Reference executor: runs a ProgramIR on per-rank numpy buffers. The oracle for every other backend.

Element layout. The collective's *full buffer* has ``count`` elements split into ``nchunks`` chunks;
chunk ``c`` covers elements ``[c*count//nchunks, (c+1)*count//nchunks)`` (so sizes differ by at most
one element when ``count`` does not divide evenly, and chunks may be empty). A buffer of ``nchunks``
chunk slots (AllReduce input/output, AllGather output, ReduceScatter input) is laid out like the
full buffer. A buffer of ``k < nchunks`` slots holds only rank ``r``'s own part, chunks
``r*k .. r*k+k-1`` (AllGather input, ReduceScatter output), so slot ``i`` is chunk ``r*k+i``.
Scratch slot ``j`` is a container of ``ceil(count/nchunks)`` elements at element
``j*ceil(count/nchunks)`` (as the kernels and the launcher lay it out), whatever the program's
scratch size; a primitive moves, for its chunk ``i``, the elements of its anchor chunk ``a + i``
(:func:`hccc.compiler.ir.extents.chunk_anchors`, which proves that every input/output chunk it
names has that size).

Per-rank inputs: AllGather rank ``r`` passes its own part; the other collectives pass the full
buffer (a Broadcast reads only the root's). AllToAll's full buffer is one rank's buffer of
``nranks`` equal blocks (``count`` a multiple of ``nranks``): input block ``j`` goes to rank ``j``,
output block ``i`` comes from rank ``i``. In-place runs alias buffers as ``program_ir``
describes (AllGather ``input`` is rank ``r``'s part of ``output``, ReduceScatter ``output`` is
rank ``r``'s part of ``input``, AllReduce, Broadcast, Reduce and AllToAll ``input == output``). A Reduce
defines only the root's output (:func:`expected` gives ``None`` for the others). Out-of-place outputs and scratch start as garbage (NaN / INT_MIN) so a chunk
that is never written shows up.

Order. Matched send/receive pairs are joined into chains (see :mod:`hccc.compiler.ir.check`); the
chains run one at a time in a topological order of the wait graph (program order + dependencies),
each for every micro-batch (``nmicro`` slices of every chunk) before the next. ``seed`` shuffles
the topological order, which exposes missing dependencies in tests.

bfloat16: numpy has no bfloat16, so pass float32 buffers with ``bf16=True``; every reduction result
is then rounded to bfloat16 (round to nearest even) and stays representable.

Operators (:mod:`hccc.util.dtypes` states the semantics; this module computes them with numpy
alone, not with the kernels' code): ``sum`` ``np.add``, ``prod`` ``np.multiply`` (integers wrap
modulo 2**bits as numpy's array arithmetic does), ``max`` / ``min`` ``np.fmax`` / ``np.fmin`` (a NaN
loses), ``avg`` of a floating type: every rank's input multiplied by ``1/nranks`` rounded to the
type (the product rounded to the type) before a sum; the integer types have no ``avg``.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.collectives import OWN, spec_of
from hccc.util import dtypes as dtypes_table
from hccc.compiler.ir.check import check_structure, match_connections, topological_components
from hccc.compiler.ir.extents import chunk_anchors, chunk_size, count_unit
from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR

OPS = dtypes_table.OP_NAMES
DTYPES = dtypes_table.DTYPE_NAMES
_UFUNC = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.fmax, "min": np.fmin}


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, out).astype(np.float32)


def _reducer(op: str, bf16: bool):
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r} (expected one of {', '.join(OPS)})")
    f = _UFUNC[op]
    if bf16:
        return lambda a, b: round_bf16(f(a, b))
    return lambda a, b: f(a, b).astype(a.dtype, copy=False)


def avg_scaled(inputs: list[np.ndarray], bf16: bool = False) -> list[np.ndarray]:
    """Every rank's contribution to an ``avg``: its input times ``1/nranks`` rounded to the element
    type, the product rounded to the type (computed in float64, where the product of two float32,
    float16 or bfloat16 values is exact, so it is rounded once; float64 multiplies directly)."""
    n = len(inputs)
    out = []
    for x in inputs:
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"avg is not defined for {x.dtype} (integer types have no avg kernels)")
        if x.dtype == np.float64:
            out.append(x * np.float64(1.0 / n))
            continue
        if bf16:
            s = float(round_bf16(np.array([1.0 / n], np.float32))[0])
            out.append(round_bf16((x.astype(np.float64) * s).astype(np.float32)))
            continue
        s = float(x.dtype.type(1.0 / n))
        out.append((x.astype(np.float64) * s).astype(x.dtype))
    return out


def alltoall_count(count: int, nranks: int) -> int:
    """The largest AllToAll size not above ``count`` elements per rank: a multiple of ``nranks``
    (every rank sends every other the same number of elements; nccl-tests rounds the same way).
    With any other unit (:meth:`~hccc.compiler.frontend.collectives.CollectiveSpec.count_unit`,
    :func:`count_unit`) it rounds down to a multiple of that: 1 leaves ``count`` as it is."""
    return int(count) - int(count) % max(1, int(nranks))


def alltoall_unit(ir: ProgramIR) -> int:
    """What an AllToAll run's per-rank count must be a multiple of (:func:`count_unit`)."""
    u = count_unit(ir)
    return u if u > 1 else int(ir.nranks)


def chunk_bounds(count: int, nchunks: int) -> np.ndarray:
    c = np.arange(nchunks + 1, dtype=np.int64)
    return c * count // nchunks


def input_length(collective: str, rank: int, nranks: int, nchunks: int, count: int) -> int:
    """Number of elements rank ``rank`` passes as input for a full buffer of ``count`` elements
    (its own part where the collective's input is the rank's part; otherwise ``count``), ``count``
    first rounded down to the spec's count unit (AllToAll's whole blocks, SendRecv's equal parts:
    :func:`alltoall_count`)."""
    spec = spec_of(collective)
    count = alltoall_count(count, spec.count_unit(nranks))
    if spec.input == OWN:
        b = chunk_bounds(count, nchunks)
        k = nchunks // nranks
        return int(b[rank * k + k] - b[rank * k])
    return count


def make_inputs(collective: str, nranks: int, count: int, dtype: str = "float32", *,
                nchunks: int | None = None, seed: int = 0, low: int = -8, high: int = 9) -> list[np.ndarray]:
    """Random small-integer inputs (exact under any reduction order) of the right per-rank length."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    nchunks = nchunks or nranks
    rng = np.random.default_rng(seed)
    np_dt = np.dtype(dtypes_table.dtype(dtype).numpy)
    return [rng.integers(low, high, input_length(collective, r, nranks, nchunks, count)).astype(np_dt)
            for r in range(nranks)]


def expected(collective: str, inputs: list[np.ndarray], op: str = "sum", *,
             nchunks: int | None = None, bf16: bool = False, root: int = 0) -> list[np.ndarray | None]:
    """What each rank's output must hold, computed directly from the inputs by the collective's
    definition (its spec's ``semantics``; no IR involved).

    ``None`` marks an output the collective leaves unspecified (a Reduce's non-root ranks)."""
    spec = spec_of(collective)
    nchunks = nchunks or len(inputs)
    if op == "avg" and spec.reduces:
        inputs = avg_scaled(inputs, bf16)
    return spec.semantics(inputs, _reducer(op, bf16), nchunks, root)


def expected_for(ir: ProgramIR, inputs: list[np.ndarray], op: str = "sum", *,
                 bf16: bool = False) -> list[np.ndarray | None]:
    """:func:`expected` for the collective ``ir`` implements (its chunk count and root)."""
    return expected(ir.collective, inputs, op, nchunks=ir.nchunks, bf16=bf16, root=ir.root)


def inputs_for(ir: ProgramIR, count: int, dtype: str = "float32", *, seed: int = 0) -> list[np.ndarray]:
    """:func:`make_inputs` for ``ir``'s collective and chunk count."""
    return make_inputs(ir.collective, ir.nranks, count, dtype, nchunks=ir.nchunks, seed=seed)


def _garbage(dtype) -> object:
    return np.nan if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _run_in_prim_order(ir: ProgramIR, region, red, seed) -> None:
    """Programs marked ``origin.execution == "algorithm"`` (MSCCL XML: every TB runs its whole
    program once per slice) may not be ordered chain by chain; run them one primitive at a time in
    a happens-before order (program order, dependencies, send before its receive). Slices are
    independent, so one pass over whole regions gives the same result."""
    from hccc.compiler.ir.symbolic import prim_order

    s, rcv = match_connections(ir)
    sender = np.full(ir.nprims, -1, dtype=np.int64)
    sender[rcv] = s
    wire = {}
    ops = ir.prims["op"].tolist()
    cnts = ir.prims["count"].tolist()
    for i in prim_order(ir, rng=np.random.default_rng(seed) if seed is not None else None).tolist():
        o = Op(ops[i])
        got = wire.pop(int(sender[i])) if o.receives else None
        out = []
        for k in range(cnts[i]):
            src = region(i, "src", k) if o.reads_src else None
            dst = region(i, "dst", k) if o.writes_dst else None
            v = got[k] if got is not None else None
            if o in (Op.RECV_REDUCE_COPY, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND):
                v = red(v, src)
            elif o == Op.SEND:
                v = src.copy()
            elif o == Op.COPY:
                dst[:] = src.copy()
            elif o == Op.REDUCE:
                dst[:] = red(dst.copy(), src)
            if o.writes_dst and o not in (Op.COPY, Op.REDUCE):
                dst[:] = v
            out.append(v)
        if o.sends:
            wire[i] = out


def execute(ir: ProgramIR, inputs: list[np.ndarray], *, op: str = "sum", inplace: bool = False,
            nmicro: int | None = None, seed: int | None = None, bf16: bool = False,
            return_scratch: bool = False):
    """Run ``ir`` on ``inputs`` (one array per rank) and return each rank's output buffer."""
    check_structure(ir)
    if len(inputs) != ir.nranks:
        raise ValueError(f"expected {ir.nranks} input buffers, got {len(inputs)}")
    red = _reducer(op, bf16)
    if op == "avg" and spec_of(ir.collective).reduces:
        # the kernels scale a rank's contribution where it is read from its input buffer: the
        # same as running the program on the scaled inputs
        inputs = avg_scaled(inputs, bf16)
    mem = _RankMemory(ir, inputs, inplace)
    if ir.algorithm_level:
        _run_in_prim_order(ir, mem.region, red, seed)
        order = np.zeros(0, np.int64)   # done: the chain loop below has nothing to run
    else:
        comp, order = topological_components(ir, np.random.default_rng(seed) if seed is not None else None)
    s, rcv = match_connections(ir)
    nxt = np.full(ir.nprims, -1, dtype=np.int64)
    nxt[s] = rcv
    nxt_l = nxt.tolist()
    ops = ir.prims["op"].tolist()
    m_count = max(1, int(nmicro or 1))
    cnts = ir.prims["count"].tolist()
    for head in order.tolist():
        chain = [head]
        while nxt_l[chain[-1]] >= 0:
            chain.append(nxt_l[chain[-1]])
        for k in range(min(cnts[i] for i in chain)):
            _run_chain_chunk(chain, k, ops, mem.region, red, m_count)
    outs = [b[Buf.OUTPUT].copy() for b in mem.bufs]
    if return_scratch:
        return outs, [b[Buf.SCRATCH].copy() for b in mem.bufs]
    return outs


class _RankMemory:
    """Every rank's input, output and scratch buffers for one run of ``ir`` on ``inputs`` (in
    place: overlaid as the spec says; elsewhere filled with garbage), and the elements each
    primitive's chunk touches (:meth:`region`)."""

    def __init__(self, ir: ProgramIR, inputs: list[np.ndarray], inplace: bool):
        N, C = ir.nranks, ir.nchunks
        spec = spec_of(ir.collective)
        self.dtype = dtype = np.asarray(inputs[0]).dtype
        # an own-part input: the full buffer is the concatenation of all ranks' parts
        self.count = count = int(sum(len(x) for x in inputs)) if spec.input == OWN else len(inputs[0])
        if count % count_unit(ir):
            raise ValueError(f"an {spec.title} of {count} elements per rank is not {count_unit(ir)} equal "
                             f"blocks (use a multiple of {count_unit(ir)})")
        for r in range(N):
            want = input_length(ir.collective, r, N, C, count) if spec.input == OWN else count
            if len(inputs[r]) != want or np.asarray(inputs[r]).dtype != dtype:
                raise ValueError(f"rank {r}: input must have {want} elements of {dtype}")
        self.ir, self.C = ir, C
        self.bounds = chunk_bounds(count, C)
        self.lay = {Buf.INPUT: self._layout(ir.in_chunks), Buf.OUTPUT: self._layout(ir.out_chunks)}
        self.maxc = -(-count // C) if count else 0
        self.anchors = chunk_anchors(ir).tolist()
        self.P = dict(ir.prims)
        self.bufs = [self._buffers(r, inputs[r], spec, inplace) for r in range(N)]

    def _layout(self, slots: int):
        """(array length, slot start function) for a buffer of ``slots`` slots on rank r (fewer
        than ``nchunks`` slots hold the rank's own part)."""
        bounds, C, count = self.bounds, self.C, self.count
        if slots < C:
            def start(r, i):
                return int(bounds[r * slots + i] - bounds[r * slots])
            return (lambda r: int(bounds[r * slots + slots] - bounds[r * slots])), start

        def start_full(r, i):
            return int((i // C) * count + bounds[i % C])
        return (lambda r: int(-(-slots // C) * count)), start_full

    def _buffers(self, r: int, given, spec, inplace: bool) -> dict[int, np.ndarray]:
        ir, bounds, dtype = self.ir, self.bounds, self.dtype
        g = _garbage(dtype)
        inp = np.array(given, dtype=dtype, copy=True)
        if inplace:   # the spec's overlay of the two buffers
            if spec.alias == "same":
                out = inp
            elif spec.alias == "input in output":
                out = np.full(self.lay[Buf.OUTPUT][0](r), g, dtype=dtype)
                kk = ir.in_chunks
                s0 = int(bounds[r * kk])
                out[s0:s0 + len(inp)] = inp
                inp = out[s0:s0 + len(inp)]
            else:
                kk = ir.out_chunks
                out = inp[int(bounds[r * kk]):int(bounds[r * kk + kk])]
        else:
            out = np.full(self.lay[Buf.OUTPUT][0](r), g, dtype=dtype)
        scr = np.full(ir.scratch_chunks * self.maxc, g, dtype=dtype)
        return {Buf.INPUT: inp, Buf.OUTPUT: out, Buf.SCRATCH: scr}

    def region(self, i: int, side: str, k: int) -> np.ndarray:
        """The elements chunk ``k`` of primitive ``i`` touches on ``side``."""
        P, C = self.P, self.C
        b = int(P[f"{side}_buf"][i])
        r = int(P["rank"][i])
        j = int(P[f"{side}_off"][i]) + k
        n = chunk_size(self.anchors[i] + k, self.count, C) if C else 0
        if b == Buf.SCRATCH:
            return self.bufs[r][b][j * self.maxc:j * self.maxc + n]
        start = self.lay[b][1]
        lo, hi = start(r, j), start(r, j + 1)
        if hi - lo != n:   # chunk_anchors proved this cannot happen
            raise AssertionError(f"primitive {i}: {side} chunk of {hi - lo} elements, anchor says {n}")
        return self.bufs[r][b][lo:hi]


def _run_chain_chunk(chain, k, ops, region, red, m_count) -> None:
    """Chunk ``k`` of every primitive of one send/receive chain, micro-batch by micro-batch."""
    regions = []
    length = None
    for i in chain:
        o = Op(ops[i])
        src = region(i, "src", k) if o.reads_src else None
        dst = region(i, "dst", k) if o.writes_dst else None
        for a in (src, dst):
            if a is not None:
                if length is None:
                    length = len(a)
                elif len(a) != length:   # chunk_anchors gives a chain one anchor
                    raise AssertionError(f"primitive {i}: region of {len(a)} elements where the chain "
                                         f"moves {length}")
        regions.append((o, src, dst))
    length = length or 0
    for m in range(m_count):
        lo, hi = m * length // m_count, (m + 1) * length // m_count
        v = None
        for o, src, dst in regions:
            sl = slice(lo, hi)
            if o == Op.SEND:
                v = src[sl].copy()
            elif o == Op.RECV:
                dst[sl] = v
            elif o == Op.RECV_REDUCE_COPY:
                dst[sl] = red(v, src[sl])
            elif o == Op.RECV_COPY_SEND:
                dst[sl] = v
            elif o == Op.RECV_REDUCE_SEND:
                v = red(v, src[sl])
            elif o == Op.RECV_REDUCE_COPY_SEND:
                v = red(v, src[sl])
                dst[sl] = v
            elif o == Op.COPY:
                dst[sl] = src[sl].copy()
            elif o == Op.REDUCE:
                dst[sl] = red(dst[sl].copy(), src[sl])


__all__ = ["execute", "expected", "make_inputs", "input_length", "chunk_bounds", "alltoall_count",
           "alltoall_unit", "round_bf16", "avg_scaled", "OPS",
           "DTYPES"]
