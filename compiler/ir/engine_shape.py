"""The copy engine's shape: how many 16-byte vectors a data thread of the emitted kernels loads
before its first store, by the kind of piece it moves, in registers and through shared memory.

``hccc_prims.h`` renders these (``HCCC_LOADS``, ``HCCC_LOADS_REDUCE``, ``HCCC_LOADS_SCALE``,
``HCCC_ASYNC_VECTORS``, ``HCCC_ASYNC_THREADS``: the unrolled body of ``hccc_vblocks``, which issues
every load of a block of vectors before any store),
and the kernel cost model (:func:`hccc.compiler.passes.kernel_cost.block_bytes_in_flight`) counts a
block's bytes in flight from them. They are not ABI facts: the host never reads them, and a build
may still override them (``-DHCCC_LOADS=...``) to study another shape.

What sets them is the register budget (64 registers a thread: two 512-thread blocks per SM,
``tests/test_kernel_registers.py``), read from ``ptxas -v`` at sm_90 (nvcc 13.0) for ring
AllReduce 8 float32 sum and HM AllReduce 4x8 bfloat16 max, system and single-GPU builds: the
values below spill nothing; one vector more spills in every one of those builds (spill stores of
``hccc_run``: a copy of 9 vectors 24 bytes, of 10 44, of 12 76; a reduction of 5 vectors a source
8 bytes, of 6 12).
So the registers hold at most these many bytes in flight a thread; shared memory holds
:data:`ASYNC_VECTORS` more where the platform loads into it without a register
(docs/kernel-protocol.md, "Bytes in flight").
"""
from __future__ import annotations

#: bytes of one vector (``hccc_v16``: one ``ld.global.v4`` / ``global_load_dwordx4``)
VECTOR_BYTES = 16
#: vectors a thread loads before its first store when it copies (one source)
LOADS = 8
#: vectors a thread loads per source before its first store when it reduces two sources
LOADS_REDUCE = 4
#: the same for pieces whose elements cost several instructions each (AVG's scaled pieces, uint8
#: reductions, 8-byte products, float64 max / min: ``hccc_costly_reduce``): ptxas -v spills four
#: vectors a source of these (float64 max / min: 8 bytes of ``hccc_run`` in every kernel)
LOADS_SCALE = 2

#: vectors a data thread loads into shared memory besides its registers' (a copy's; a reduction
#: takes half of them from each source), on platforms that load without holding a register (CUDA
#: sm_90: cp.async; the CPU emulation): bytes in flight the register budget does not
#: bound. Two, so that their buffer (:data:`ASYNC_THREADS` x 2 x 16 B = 15 KiB, plus the block's
#: 2,032 bytes of state and the 1 KiB an SM reserves a block) leaves ten blocks on an H200's SM
#: (228 KiB): as many as the registers allow the runtime's smallest blocks of 96 threads; three
#: would leave eight.
ASYNC_VECTORS = 2
#: data threads the shared-memory buffer has room for: a 512-thread block's (the kernels as
#: emitted); a block of more moves without those loads (the runtime's modules define the emitted
#: block's own, so a smaller block pays no more shared memory than it uses)
ASYNC_THREADS = 480

__all__ = ["VECTOR_BYTES", "LOADS", "LOADS_REDUCE", "LOADS_SCALE", "ASYNC_VECTORS", "ASYNC_THREADS",
           "vectors_per_source", "async_threads"]


def async_threads(block_threads: int, warp: int) -> int:
    """Data threads the shared-memory buffer of a module whose blocks are emitted with
    ``block_threads`` threads holds (``HCCC_ASYNC_THREADS``): its data threads (every warp but the
    sync warp), at most :data:`ASYNC_THREADS`; 0 for a one-warp block (no whole data warp)."""
    return max(0, min(ASYNC_THREADS, int(block_threads) - int(warp)))


def vectors_per_source(reduces: bool, scaled: bool = False, async_loads: bool = False) -> int:
    """Vectors a data thread loads from each source before its first store: :data:`LOADS` for a
    copy, :data:`LOADS_REDUCE` for a reduction, :data:`LOADS_SCALE` for a scaled piece (as
    ``hccc_vblocks`` picks its unroll); with ``async_loads`` the shared-memory ones too
    (:data:`ASYNC_VECTORS`, half of them a source of a reduction)."""
    regs = LOADS_SCALE if scaled else LOADS_REDUCE if reduces else LOADS
    return regs + ((ASYNC_VECTORS // 2 if reduces else ASYNC_VECTORS) if async_loads else 0)
