"""Fused LL chain rows: consecutive fused primitives of one thread block that the kernels may run,
under LL, as one descriptor whose units the data threads move line by line (``hccc_pd::chain``,
docs/kernel-protocol.md "Fused LL chains").

Codegen marks them, so that the engine decides no link at run time: each row of a run gets the
number of the run's rows from it on, at most :data:`CHAIN_PRIMS` (``k, k - 1, ..., 1`` at a run's
end), 0 outside every run. The engine then takes, at a row it reaches with mark ``k``,
``min(k, NSLOTS // m)`` rows as one chain
(``m`` micro-batches a primitive: a chain's units fit the slots) and moves on to the row after the
last, whose mark is again its run's rest (capped alike: a chain never holds more than
``CHAIN_PRIMS`` rows, so the cap changes no cut): the chains are the runs cut greedily into pieces
of that many rows (:func:`chain_pieces`, the kernel cost model's reading). What makes a run, each a
condition under which a chain moves what its rows move, in their order:

- every row is a fused op (RECV_COPY_SEND, RECV_REDUCE_SEND, RECV_REDUCE_COPY_SEND) of 1 to
  :data:`CHAIN_PIECES` chunks that awaits no progress counter and that no row awaits (a chain
  waits once, for its sent slots, and posts only its received slots' head); a direct-mode row
  (:mod:`hccc.compiler.backend.direct_fields`) is one too: an LL launch has no peers array, so it
  takes the FIFO path, as LL lines, like every row of the launch;
- the rows follow each other in one thread block on one receive and one send connection (one
  rank, block, receive peer, send peer and channel), so that their messages follow each other on
  both, and a chain's slots are consecutive.

Launch-wide conditions stay the engine's (``hccc_chain_mark``): an LL launch (no peers array) of
at most ``NSLOTS`` micro-batches, a decoded primitive table (the links are its entries), and no AVG
scaling of a floating type (the data threads pick the scaling once a descriptor).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import Op, ProgramIR

__all__ = ["CHAIN_PRIMS", "CHAIN_PIECES", "FUSED_OPS", "CHAIN_PLATFORMS", "chain_rows", "chain_pieces"]

#: The most rows one chain holds (``HCCC_CHAIN_PRIMS`` of the engine): a chain's links and its
#: units' descriptors are shared memory of the block (``hccc_chain``, ``hccc_unit``)
CHAIN_PRIMS = 8
#: The chunks a chain's row moves (``HCCC_CHAIN_PIECES``): one piece a unit, as fused primitives move
CHAIN_PIECES = 1
#: The platforms whose kernels run chains (``HCCC_LL_CHAINS`` 1; the template renders it from this):
#: the CPU emulation, CUDA and HIP. CUDA: the sm_90 engine with the chains' code keeps 64 registers
#: with no spill in every build ``tests/test_kernel_registers.py`` checks (nvcc 13.0), since each
#: connection's scope lives in words the engine keeps anyway (the unit's ``HCCC_K_PSYS`` kind bit,
#: two bits of the waits' ``fresh``); as fields of their own beside the chains ``hccc_run`` spilled
#: 8 bytes. HIP: the engine keeps its registers with no spill (gfx90a 64 VGPRs + 32 AGPRs, gfx1030
#: 120 VGPRs); its frame (the callee-saved VGPRs it saves at its entry) grows from 64 to 100 bytes
#: on gfx90a (gfx1030: 32 either way; ring AllReduce 8 and HM AllReduce 4x8 float32 sum, ROCm 5.2
#: hipcc, ``ScratchSize``), within the 256 the AMD register test holds a kernel to
#: (``tests/test_kernel_registers_amd.py``) since a kernel passes the engine its argument in place
#: (``hccc_kernel_arg``; a rank kernel's copy of ``hccc_args`` had put it at 276).
CHAIN_PLATFORMS = ("cpu", "cuda", "hip")
#: The ops a chain's rows are
FUSED_OPS = (int(Op.RECV_COPY_SEND), int(Op.RECV_REDUCE_SEND), int(Op.RECV_REDUCE_COPY_SEND))


def chain_rows(ir: ProgramIR) -> np.ndarray:
    """``chain`` per row of ``ir`` (canonical order; int64): in a run of chain rows (the module
    docstring's conditions), the run's rows from this one on, at most :data:`CHAIN_PRIMS`; 0
    elsewhere."""
    n = int(ir.nprims)
    out = np.zeros(n, np.int64)
    if n == 0:
        return out
    p = ir.prims
    cnt = p["count"].astype(np.int64)
    awaited = np.zeros(n, bool)
    awaited[np.asarray(ir.dep_prim, np.int64)] = True
    awaited[np.asarray(ir.dep_on, np.int64)] = True
    link = np.isin(p["op"].astype(np.int64), FUSED_OPS) & (cnt >= 1) & (cnt <= CHAIN_PIECES) & ~awaited
    same = np.zeros(n, bool)
    same[1:] = link[1:] & link[:-1]
    for k in ("rank", "tb", "recv_peer", "send_peer", "channel"):
        v = p[k].astype(np.int64)
        same[1:] &= v[1:] == v[:-1]
    if "seq" in p:
        s = p["seq"].astype(np.int64)
        same[1:] &= s[1:] == s[:-1] + 1
    # a run's rest from each row on: count back from each run's last row
    starts = np.flatnonzero(link & ~same)
    for i in starts.tolist():
        j = i + 1
        while j < n and same[j]:
            j += 1
        out[i:j] = np.minimum(np.arange(j - i, 0, -1), CHAIN_PRIMS)
    return out


def chain_pieces(marks: np.ndarray, m: int, nslots: int) -> list[range]:
    """The chains the engine forms from ``marks`` (:func:`chain_rows`) at ``m`` micro-batches a
    primitive with ``nslots`` FIFO slots a connection (the ABI's ``NSLOTS``), as row ranges: none
    past ``nslots`` micro-batches; else each run cut greedily into pieces of ``min(CHAIN_PRIMS,
    nslots // m)`` rows."""
    NSLOTS = int(nslots)
    m = int(m)
    if m < 1 or m > NSLOTS:
        return []
    most = min(CHAIN_PRIMS, NSLOTS // m)
    out: list[range] = []
    i, n = 0, len(marks)
    while i < n:
        k = int(marks[i])
        if k <= 0:
            i += 1
            continue
        take = min(k, most)
        out.append(range(i, i + take))
        i += take
    return out
