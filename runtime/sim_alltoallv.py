"""Simulating an AllToAll program as an AllToAllv (``hccc sim --counts FILE``).

The simulator's engine reads each primitive's chunk lengths from a table indexed by its anchor
(:mod:`hccc.runtime.sim_model`). For a call with per-pair counts the length of every chunk of every
primitive is that of the block piece it carries (:func:`hccc.compiler.ir.vblocks.vblock_map`: piece
``k`` of block ``(s, d)`` has ``(k+1)*c//K - k*c//K`` elements of ``c = counts[s][d]``), so the table
becomes one entry per chunk of every primitive, each primitive anchored at its own entries. The
micro-batch slice is the launchers' (:func:`hccc.runtime.alltoallv.equal_count`: the slice of the
equal AllToAll whose pieces are all as large as the call's largest), and the micro-batches cover
the largest piece, as in the kernels.

Bandwidth follows nccl-tests' (and rccl-tests' ``alltoallv_perf``) AllToAll convention, with the
per-rank size taken as the mean of the ranks' send buffers: ``size = total bytes / nranks``,
``algbw = size / time``, ``busbw = algbw * (nranks - 1) / nranks``. An equal-count matrix gives
exactly the AllToAll figures of the same size.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import alltoallv as av
from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS, DEFAULT_ELEMENT_BYTES, Geometry, SimProgram

__all__ = ["VProgram", "prepare_v", "simulate_v", "max_call_bytes"]


@dataclasses.dataclass(frozen=True)
class VProgram:
    """What :func:`simulate_v` reuses across counts matrices: the prepared program and its pieces."""
    ir: ProgramIR
    prog: SimProgram
    k: int
    start: np.ndarray          # per primitive, its first entry in the chunk-length table
    pieces: np.ndarray         # per entry, the block piece it carries (-1: none)


def prepare_v(ir: ProgramIR, topo, block_gbps: float | None = DEFAULT_BLOCK_GBPS) -> VProgram:
    """The simulator's program for AllToAllv calls of ``ir`` on ``topo`` (VBlockError when ``ir``
    cannot run with per-pair counts; SimulationError when it cannot run on ``topo``)."""
    from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
    from hccc.compiler.ir.vblocks import vblock_map
    from hccc.runtime.simulator import prepare
    if not _is_canonical(ir):
        ir = _sorted_copy(ir)
    vm = vblock_map(ir, False)
    prog = prepare(ir, topo, block_gbps)
    return VProgram(ir, prog, vm.k, vm.start, vm.pieces)


def max_call_bytes(nchunks: int) -> int:
    """The largest equal-size stand-in (bytes) a call of a program of ``nchunks`` chunks may be
    simulated as: the simulator's chunk bounds are int64 products of a chunk index (up to
    ``nchunks``) and the call's size (:func:`hccc.runtime.sim_model.geometry`)."""
    return ((1 << 63) - 1) // (int(nchunks) + 1)


def _lengths(vp: VProgram, counts: np.ndarray) -> np.ndarray:
    N, K = vp.prog.nranks, vp.k
    g = vp.pieces
    live = g >= 0
    gg = np.where(live, g, 0)
    blk, k = gg // K, gg % K
    c = counts.ravel()[blk]
    # floor(k * c / K) as k * q + floor(k * r / K) with c = q * K + r: no product past c
    q, rem = c // K, c % K
    return np.where(live, q + ((k + 1) * rem) // K - (k * rem) // K, 0).astype(np.int64)


def simulate_v(vp: VProgram, topo, counts, *, element_bytes: int = DEFAULT_ELEMENT_BYTES,
               execution: str = "task", slice_bytes="auto", record=False, **kw):
    """Simulate one AllToAllv call of ``counts`` (elements of ``element_bytes``) with ``vp``'s
    program; returns the simulator's SimResult, its ``nbytes`` the mean per-rank send buffer (see
    the module docstring). CountsError for a matrix of the wrong shape or negative counts."""
    from hccc.runtime.simulator import _call_geometry, simulate
    prog = vp.prog
    N = prog.nranks
    counts = av.as_counts(counts, N)
    es = int(element_bytes)
    lens = _lengths(vp, counts)
    table = lens if len(lens) else np.zeros(1, np.int64)
    vprog = dataclasses.replace(prog, p_chunk=vp.start[:-1].astype(np.int64), nchunks=len(table))
    eq = av.equal_count(counts, vp.k)
    if eq * es > max_call_bytes(prog.nchunks):
        s, d = (int(i) for i in np.unravel_index(int(np.argmax(counts)), counts.shape))
        raise av.CountsError(f"counts[{s}][{d}] = {int(counts[s, d])} elements of {es} bytes: the call is "
                             f"sized as an equal AllToAll of {eq * es} bytes, past the "
                             f"{max_call_bytes(prog.nchunks)} bytes the simulator's arithmetic holds for "
                             f"{prog.nchunks} chunks")
    _, slice_b = _call_geometry(prog, eq * es, slice_bytes, es)
    slice_elems = max(1, slice_b // es)
    piece = av.scratch_slot(counts, vp.k)
    nmb = max(1, -(-piece // slice_elems))
    total = av.exact_sum(counts)
    per_rank = total * es // max(N, 1)
    geo = Geometry(per_rank, total, es, slice_elems, nmb, table)
    return simulate(vprog, topo, per_rank, execution=execution, element_bytes=es, record=record,
                    call_geometry=(geo, slice_b), **kw)
