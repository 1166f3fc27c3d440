"""Which blocks of a ProgramIR's kernels wait on which, and which of those waits a launch that keeps
only some of a rank's blocks resident can leave unmet (:func:`residency_hazards`).

Blocks are numbered as the kernels launch them (``hccc_prims.h``): rank ``r``'s block ``c *
ntbs[r] + tb`` is replica ``c`` of thread block ``tb``. A block waits on another block

* of its own rank: a cross-TB dependency (``deps``) waits on the producer's progress counter, in
  the same replica;
* of another rank: a receive waits for its send's data, and a send for a free FIFO slot, that is
  for the receive of an earlier micro-batch (the two ends of a connection, same replica).

Partial residency. A GPU whose SMs are held by other kernels runs a per-rank launch with only some
of its blocks resident, dispatched in block order, a block's place taken by the next one when it
returns (the CPU emulation's ``HCCC_CPU_RESIDENT_BLOCKS``). With at most ``K`` resident blocks per
rank, a wait of block ``i`` of rank ``r`` on block ``j`` of rank ``s`` is a *hazard* when ``j >= K``
(block ``j`` is not sure to be resident from the start) and either ``s == r`` (blocks of one rank
are not sure to be resident together) or ``j > i`` (block ``j`` of rank ``s`` may wait for a place
behind blocks of ``s`` that wait in turn). A program with no hazard completes for every ``K >= 1``
whenever it completes with every block resident (which :mod:`hccc.compiler.ir.check` proves):
blocks ``0 .. K-1`` of every rank are resident from the start and wait only on each other; then,
by induction on the block index ``i >= K``, once every block below ``i`` has returned, every
rank's block ``i`` is resident, and the blocks ``i`` of all ranks wait only on each other and on
blocks that have returned, so they complete as they would with every block resident.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.ir.connections import describe_prim, match_connections
from hccc.compiler.ir.program_ir import ProgramIR

#: what a waiting primitive waits for, by kind of wait
KINDS = ("dependency", "data", "slot")


@dataclass(frozen=True)
class BlockWait:
    """Block ``block`` of rank ``rank`` waits on block ``on_block`` of rank ``on_rank``: its
    primitive ``prim`` for primitive ``on_prim``'s progress counter (``dependency``), send
    (``data``) or receive (``slot``)."""

    rank: int
    block: int
    on_rank: int
    on_block: int
    prim: int
    on_prim: int
    kind: str

    def describe(self, ir: ProgramIR) -> str:
        what = {"dependency": "the progress counter of", "data": "the data sent by",
                "slot": "a FIFO slot freed by"}[self.kind]
        return (f"rank {self.rank}'s block {self.block} ({describe_prim(ir, self.prim)}) waits on "
                f"{'its' if self.on_rank == self.rank else f'rank {self.on_rank}' + chr(39) + 's'} "
                f"block {self.on_block}: {what} {describe_prim(ir, self.on_prim)}")


def _tb_waits(ir: ProgramIR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(waiting primitive, awaited primitive, kind index) of every wait between two thread blocks."""
    p = ir.prims
    dp = np.asarray(ir.dep_prim, np.int64)
    do = np.asarray(ir.dep_on, np.int64)
    cross = p["tb"][dp] != p["tb"][do]
    sends, recvs = (np.asarray(a, np.int64) for a in match_connections(ir))
    waiter = np.concatenate([dp[cross], recvs, sends])
    awaited = np.concatenate([do[cross], sends, recvs])
    kind = np.concatenate([np.zeros(int(cross.sum()), np.int64), np.ones(len(recvs), np.int64),
                           np.full(len(sends), 2, np.int64)])
    return waiter, awaited, kind


def residency_hazards(ir: ProgramIR, resident: int, ranks=None, *, limit: int | None = None) -> list[BlockWait]:
    """The waits (module docstring) that a launch keeping at most ``resident`` blocks of a rank
    resident may leave unmet, of the waiting blocks of ``ranks`` (None: every rank), by rank and
    block; at most ``limit`` of them (None: all). Empty: the program runs with any such launch."""
    if resident < 1:
        raise ValueError(f"resident blocks must be at least 1, not {resident}")
    p = ir.prims
    waiter, awaited, kind = _tb_waits(ir)
    if not len(waiter):
        return []
    ntbs = np.asarray(ir.ntbs, np.int64)
    r, s = p["rank"][waiter].astype(np.int64), p["rank"][awaited].astype(np.int64)
    tb, on_tb = p["tb"][waiter].astype(np.int64), p["tb"][awaited].astype(np.int64)
    keep = np.ones(len(waiter), bool) if ranks is None else np.isin(r, np.asarray(list(ranks), np.int64))
    out: list[BlockWait] = []
    for c in range(max(1, int(ir.nchannels))):
        i = c * ntbs[r] + tb
        j = c * ntbs[s] + on_tb
        bad = keep & (j >= resident) & ((r == s) | (j > i))
        for k in np.flatnonzero(bad):
            out.append(BlockWait(int(r[k]), int(i[k]), int(s[k]), int(j[k]), int(waiter[k]),
                                 int(awaited[k]), KINDS[int(kind[k])]))
    out.sort(key=lambda w: (w.rank, w.block, w.on_rank, w.on_block, w.prim))
    # one wait per pair of blocks and kind: a TB's every micro-batch waits alike
    seen, unique = set(), []
    for w in out:
        key = (w.rank, w.block, w.on_rank, w.on_block, w.kind)
        if key not in seen:
            seen.add(key)
            unique.append(w)
    return unique if limit is None else unique[:limit]


__all__ = ["BlockWait", "KINDS", "residency_hazards"]
