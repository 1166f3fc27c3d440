"""Memory traffic of the emitted kernels, counted from a ProgramIR: what each primitive reads and
writes in HBM per byte it moves, under the FIFO protocol and under direct mode (the sender writes
the receiver's destination: ``--direct auto``, single-process launches).

Per byte of a primitive's slices (``hccc_prim`` in hccc_prims.h; a FIFO slot lives in the
receiver's HBM, so a sender's slot write lands there):

=========================  ====  =====  =======================================================
op                         read  write  what
=========================  ====  =====  =======================================================
SEND                       1     1      source -> slot
RECV                       1     1      slot -> destination
RECV_REDUCE_COPY           2     1      slot (+) source -> destination
RECV_COPY_SEND             1     2      slot -> destination and next slot
RECV_REDUCE_SEND           2     1      slot (+) source -> next slot
RECV_REDUCE_COPY_SEND      2     2      slot (+) source -> destination and next slot
COPY                       1     1      (nothing when source and destination coincide)
REDUCE                     2     1      destination (+) source -> destination
=========================  ====  =====  =======================================================

Direct mode: a receive that only copies (RECV, RECV_COPY_SEND) and that
:func:`hccc.compiler.ir.direct.direct_safe` proves may take its data straight from the sender
finds it already in its destination: RECV moves nothing, RECV_COPY_SEND reads its destination and
writes the next hop (1 + 1); sends cost the same (source -> the peer's destination instead of its
slot). Reductions, and receives whose destination another primitive of the rank may touch before
them, keep the FIFO.

``reads`` counts what a thread block must load per byte it moves: with ``L`` bytes of loads in
flight per block and a memory latency ``t``, a block moves at most ``L / t / reads`` bytes per
second (Little's law; ``benchmarks/kernel_model.py``'s v1-v3 rows). The kernel cost model
(:mod:`hccc.compiler.passes.kernel_cost`) charges a unit's loads, counted by these reads, at a
block's measured copy rate instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR

__all__ = ["HBM_COST", "DIRECT_COST", "Traffic", "prim_bytes", "traffic"]

#: op -> (bytes read, bytes written) per byte moved, FIFO protocol (the kernels as built)
HBM_COST = {
    Op.SEND: (1, 1), Op.RECV: (1, 1), Op.RECV_REDUCE_COPY: (2, 1), Op.RECV_COPY_SEND: (1, 2),
    Op.RECV_REDUCE_SEND: (2, 1), Op.RECV_REDUCE_COPY_SEND: (2, 2), Op.COPY: (1, 1),
    Op.REDUCE: (2, 1), Op.NOP: (0, 0),
}
#: the same with direct mode for copy-only receives proven safe
DIRECT_COST = dict(HBM_COST)
DIRECT_COST.update({Op.RECV: (0, 0), Op.RECV_COPY_SEND: (1, 1)})

_SENDS = (Op.SEND, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND)


def prim_bytes(ir: ProgramIR, nbytes: int, element_bytes: int = 4) -> np.ndarray:
    """Bytes each primitive moves for a full buffer of ``nbytes``: the sizes of its ``count``
    chunks from its anchor chunk, in the kernels' geometry (chunk ``c`` holds elements
    ``[c*n/nchunks, (c+1)*n/nchunks)``)."""
    from hccc.compiler.backend.codegen import analyse
    if ir.nprims == 0:
        return np.zeros(0, np.int64)
    count = int(nbytes) // int(element_bytes)
    anchor = analyse(ir).chunk.astype(np.int64)
    cnt = np.maximum(ir.prims["count"].astype(np.int64), 0)
    n = np.int64(max(ir.nchunks, 1))
    lo = lambda c: (c * count) // n          # noqa: E731  exact integer arithmetic
    return (lo(anchor + cnt) - lo(anchor)) * int(element_bytes)


@dataclass(frozen=True)
class Traffic:
    """Totals over every rank for one full buffer of ``nbytes`` (bytes)."""
    nbytes: int
    hbm_read: int
    hbm_write: int
    link: int                      # bytes sent over connections
    per_tb_reads: dict             # (rank, tb) -> bytes that TB loads
    per_tb_moved: dict             # (rank, tb) -> bytes that TB moves (its primitives' sizes)

    @property
    def hbm(self) -> int:
        return self.hbm_read + self.hbm_write


def traffic(ir: ProgramIR, nbytes: int, element_bytes: int = 4, *, direct: bool = False) -> Traffic:
    """HBM and link bytes of ``ir``'s kernels for a full buffer of ``nbytes`` (module docstring);
    ``direct``: copy-only receives proven direct-safe in direct mode (as the kernels run them
    in single-process launches; the Communicator and the table mode keep the FIFO)."""
    p = ir.prims
    b = prim_bytes(ir, nbytes, element_bytes)
    op = p["op"].astype(np.int64)
    same = (op == Op.COPY) & (p["src_buf"] == p["dst_buf"]) & (p["src_off"] == p["dst_off"])
    if direct:
        from hccc.compiler.ir.direct import direct_safe
        is_direct = direct_safe(ir)
    else:
        is_direct = np.zeros(len(op), dtype=bool)
    rd = np.array([(DIRECT_COST if d else HBM_COST)[Op(int(o))][0] for o, d in zip(op, is_direct)],
                  np.int64) * b * ~same
    wr = np.array([(DIRECT_COST if d else HBM_COST)[Op(int(o))][1] for o, d in zip(op, is_direct)],
                  np.int64) * b * ~same
    link = int(b[np.isin(op, [int(x) for x in _SENDS])].sum())
    reads: dict = {}
    moved: dict = {}
    for r, t, x, m in zip(p["rank"].tolist(), p["tb"].tolist(), rd.tolist(), b.tolist()):
        reads[(r, t)] = reads.get((r, t), 0) + x
        moved[(r, t)] = moved.get((r, t), 0) + m
    return Traffic(int(nbytes), int(rd.sum()), int(wr.sum()), link, reads, moved)
