"""The copy engine's shape: how many 16-byte vectors a data thread of the emitted kernels loads
before its first store, by the kind of piece it moves.

``hccc_prims.h`` renders these (``HCCC_LOADS``, ``HCCC_LOADS_REDUCE``, ``HCCC_LOADS_SCALE``: the
unrolled body of ``hccc_vectors``, which issues every load of a block of vectors before any store),
and the kernel cost model (:func:`hccc.compiler.passes.kernel_cost.block_bytes_in_flight`) counts a
block's bytes in flight from them. They are not ABI facts: the host never reads them, and a build
may still override them (``-DHCCC_LOADS=...``) to study another shape.

What sets them is the register budget (64 registers a thread: two 512-thread blocks per SM,
``tests/test_kernel_registers.py``), read from ``ptxas -v`` at sm_90 (nvcc 13.0) for ring
AllReduce 8 float32 sum and HM AllReduce 4x8 bfloat16 max, system and single-GPU builds: the
values below spill nothing; one vector more spills in every one of those builds (a copy of 9
vectors: 24 bytes of spill stores; a reduction of 5 or 6 vectors a source: 12; a copy of 12: 76).
So the registers hold at most these many bytes in flight a thread, and a block's bytes in flight
grow only with its data warps (docs/kernel-protocol.md, "Bytes in flight").
"""
from __future__ import annotations

#: bytes of one vector (``hccc_v16``: one ``ld.global.v4`` / ``global_load_dwordx4``)
VECTOR_BYTES = 16
#: vectors a thread loads before its first store when it copies (one source)
LOADS = 8
#: vectors a thread loads per source before its first store when it reduces two sources
LOADS_REDUCE = 4
#: the same for pieces whose elements cost several instructions each (AVG's scaled pieces, uint8
#: reductions, int64 products): ptxas -v spills four vectors a source of these
LOADS_SCALE = 2

__all__ = ["VECTOR_BYTES", "LOADS", "LOADS_REDUCE", "LOADS_SCALE", "vectors_per_source"]


def vectors_per_source(reduces: bool, scaled: bool = False) -> int:
    """Vectors a data thread loads from each source before its first store: :data:`LOADS` for a
    copy, :data:`LOADS_REDUCE` for a reduction, :data:`LOADS_SCALE` for a scaled piece (as
    ``hccc_vectors`` picks its unroll)."""
    if scaled:
        return LOADS_SCALE
    return LOADS_REDUCE if reduces else LOADS
