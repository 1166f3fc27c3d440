"""The decoded-primitive table: whether a program's thread blocks decode their primitives once, at
launch, into shared memory (``hccc_ptable_decode`` in ``hccc_prims.h``), and how many entries.

A block's sync lane needs each primitive decoded (``struct hccc_sprim``: its connections, counters,
chunk walks and piece template). Without a table it decodes each one when it reaches it
(``hccc_sprim_load``: a call with dependent global loads, once per primitive, on its loop). With
one, every thread of the block decodes the block's primitives at launch and the loop reads the
current one from shared memory. Codegen picks the table at compile time, per program: the
program's type in its sources is ``hccc_tprogram<N>``, N the most primitives of any of its thread
blocks, when N entries fit :data:`PTABLE_BUDGET_BYTES`; else the per-primitive load. An
AllToAll program (its kernels carry the AllToAllv path) has one too (:data:`ALLTOALL_TABLE`; its
type is ``hccc_tvprogram<N>``: its entries hold their templates at round 0, and another round of an
AllToAllv primitive is rebuilt in its entry where the cursor moves to it). The table mode's
generic kernels (their programs are read at run time) always take the per-primitive load. So
does a program with receive groups (:mod:`hccc.compiler.ir.reduce_groups`, :data:`GROUPS_TABLE`):
the engine runs a group as N-source units only without a table (``hccc_groups_of`` in
``hccc_prims.h``), whose state is the sync lane's (``hccc_sgroup``), not the table's entries.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir import engine_shape

#: bytes of one decoded primitive, ``sizeof(hccc_sprim)`` on every platform (CUDA, HIP, the CPU
#: emulation: 8-byte pointers) with the engine's default HCCC_DEP_CACHE and HCCC_UNIT_PIECES (a
#: build setting fewer is smaller); the engine checks the bound (a static_assert rendered from it)
SPRIM_BYTES = 848
#: static shared memory a CUDA block may declare (gfx90a / gfx1030: 64 KiB of LDS)
STATIC_SHARED_BYTES = 48 * 1024
#: room kept for the block's other state (``hccc_shared``, about 3 KiB)
OTHER_SHARED_BYTES = 8 * 1024
#: shared memory a block's table may take: the static limit less the block's other state and the
#: copy engine's shared-memory vectors on sm_90 (``engine_shape``: every data thread's
#: ``ASYNC_VECTORS`` 16-byte vectors, 15 KiB), so that table, buffer and state together never pass
#: the 48 KiB a block may declare. With the table full, a block takes at most 48 KiB of an H100
#: SM's 228 KiB: four such blocks per SM stay resident, and a rank's blocks (channels x thread
#: blocks) are spread one or two per SM
PTABLE_BUDGET_BYTES = (STATIC_SHARED_BYTES - OTHER_SHARED_BYTES
                       - engine_shape.ASYNC_THREADS * engine_shape.ASYNC_VECTORS * engine_shape.VECTOR_BYTES)
#: entries the budget holds
PTABLE_MAX_PRIMS = PTABLE_BUDGET_BYTES // SPRIM_BYTES
#: shared memory bulk copies (``HCCC_TMA=1``, ``hccc_bulk_of`` in ``hccc_prims.h``) add to a block:
#: a 16-byte cell a data thread after the copy engine's vectors (7,680 B)
BULK_CELL_BYTES = engine_shape.ASYNC_THREADS * engine_shape.VECTOR_BYTES
#: the most bytes a block's table may take in a build with bulk copies: a program whose table is
#: larger is refused such a build (``hccc.runtime.platform.build_switches``; the engine's
#: static_assert for builds outside the runtime), since table, buffer, cells and state would pass
#: the static limit
TMA_PTABLE_BUDGET_BYTES = PTABLE_BUDGET_BYTES - BULK_CELL_BYTES
#: whether an AllToAll program decodes its primitives into a table (``hccc_tvprogram<N>``): yes
#: where it fits, as every other program. Two spills kept it off, both measured with ``ptxas -v``
#: and nvdisasm (sm_90, nvcc 13.0, direct AllToAll 8 float32 sum): the data loop's round counter
#: (8 B stored and loaded in ``hccc_run`` of every rank kernel: the data threads held their index
#: and count across the loop; they compute them each round now, ``hccc_first_data``) and two words
#: of the one-grid entry's program, held in registers across thread 0's ``hccc_launch_init`` call
#: and the barrier for the table's decode (8 B; the decode reads it from shared memory now,
#: ``hccc_prog_slot``). With both gone, every entry of direct AllToAll 8 and hierarchical AllToAll
#: 2x4 and 2x8, single-GPU and system builds, keeps 64 registers with no spill
#: (``tests/test_kernel_registers.py``)
ALLTOALL_TABLE = True
#: whether a program with receive groups decodes its primitives into a table: not yet. A table's
#: engine runs no N-source unit (``hccc_groups_of``): with them beside the table's sync lane, the
#: sm_90 engine of ring AllReduce 8 (which has no group) spilled 8 B in ``hccc_run`` of every entry
#: (``ptxas -v``, nvcc 13), the data threads' N-source loop; a program with groups takes the
#: per-primitive load, which runs them as N-source units (``tests/test_kernel_registers.py``)
GROUPS_TABLE = False


def max_block_prims(ir) -> int:
    """The most primitives of any thread block (rank, tb) of ``ir``."""
    if ir.nprims == 0:
        return 0
    key = np.asarray(ir.prims["rank"], np.int64) * (int(np.max(ir.prims["tb"])) + 1) + ir.prims["tb"]
    return int(np.bincount(key).max())


def ptable_prims(ir, no_table: bool = False) -> int:
    """Entries of ``ir``'s decoded table (0: the per-primitive load); ``no_table``: the kernels
    read the program at run time (the table mode's), and so never have one; an AllToAll program has
    one only where :data:`ALLTOALL_TABLE`, a program with receive groups (any the rows form without
    direct mode: every group codegen emits is one of them) only where :data:`GROUPS_TABLE`."""
    from hccc.compiler.frontend.collectives import spec_of
    n = max_block_prims(ir)
    if no_table or not 0 < n <= PTABLE_MAX_PRIMS:
        return 0
    if not ALLTOALL_TABLE and spec_of(ir.collective).per_pair_counts:
        return 0
    return n if GROUPS_TABLE or not has_receive_groups(ir) else 0


def has_receive_groups(ir) -> bool:
    """Whether ``ir`` has receive groups (:func:`hccc.compiler.ir.reduce_groups.reduce_groups`
    without direct mode: every group codegen emits is one of them)."""
    from hccc.compiler.ir.reduce_groups import reduce_groups
    return bool(reduce_groups(ir))


def ptable_stats(ir, no_table: bool) -> dict:
    """The manifest's ``stats`` entries of the choice: ``prim_decode`` (``table``: decoded once at
    launch into shared memory; ``load``: per primitive), ``prim_table_entries`` and
    ``prim_table_bytes`` (shared memory per block; 0 without a table)."""
    n = ptable_prims(ir, no_table)
    return {"prim_decode": "table" if n else "load", "prim_table_entries": n,
            "prim_table_bytes": n * SPRIM_BYTES}


__all__ = ["SPRIM_BYTES", "STATIC_SHARED_BYTES", "OTHER_SHARED_BYTES", "PTABLE_BUDGET_BYTES", "PTABLE_MAX_PRIMS",
           "BULK_CELL_BYTES", "TMA_PTABLE_BUDGET_BYTES",
           "ALLTOALL_TABLE", "GROUPS_TABLE", "max_block_prims", "has_receive_groups", "ptable_prims", "ptable_stats"]
