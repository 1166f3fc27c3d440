"""Receive groups: consecutive receive-reduces of one thread block that the kernels run as one
N-source unit (``hccc_pd::nsrc``, docs/kernel-protocol.md "N-source units").

A thread block that reduces ``k`` peers' messages into one destination, one primitive each::

    RECV_REDUCE_COPY  dst := recv_0() (+) src
    RECV_REDUCE_COPY  dst := recv_1() (+) dst
    ...
    RECV_REDUCE_COPY  dst := recv_{k-1}() (+) dst

runs, one primitive after another, ``k`` units in a row per micro-batch window, each waiting for
its message and posting its slot back. As a group, micro-batch ``m`` is one unit: it waits for
message ``m`` of all ``k`` connections at once, reads the ``k`` received regions and ``src`` once
and writes ``dst`` once, in the primitives' order (``acc := recv_0 (+) src``, then ``acc :=
recv_g (+) acc``, the same operands in the same order as the primitives: the same bits for every
op, floating ones included), then posts the ``k`` slots back. The one-shot AllReduce
(:mod:`hccc.compiler.ir.one_shot`) is then one dependent hop and one unit deep.

What makes a run of rows a group (:func:`reduce_groups`), each a condition under which the group
computes what the rows compute and waits for nothing the rows would not reach:

- the rows follow each other in one thread block (``seq`` consecutive), each a
  RECV_REDUCE_COPY of the same destination (buffer, chunk, count), at most
  :data:`GROUP_RECVS` rows of at most :data:`UNIT_PIECES` chunks (one unit round);
- every row after the first reduces into the destination (``src`` is ``dst``), so the running value
  of an element is only ever read by the thread that holds it; the first row's source is the
  destination itself or a buffer that never shares memory with it other than element for element
  (scratch, or input and output at one chunk in a collective whose in-place run makes them one
  buffer: AllReduce, Broadcast, Reduce);
- the rows' messages share one anchor chunk (the kernels place a region's data at an offset both
  ends compute from it, with no header: every region of the group then has the first row's);
- the rows receive on distinct connections (one message of each per unit: FIFO order holds), and
  none is a direct receive (:mod:`hccc.compiler.backend.direct_fields`: its data would land in the
  destination the group is accumulating);
- no row but the first waits on a dependency and no dependency names a row but the last (the group
  posts the last row's progress counter, once the whole unit is done);
- the program with every group's rows run together is deadlock-free
  (:func:`hccc.compiler.ir.check.check_deadlock` with ``groups``: the group's rendezvous contracted
  into one node, which is what running them as one unit means). Groups the proof refuses are not
  formed.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR

__all__ = ["GROUP_RECVS", "UNIT_PIECES", "ALIAS_ONE_BUFFER", "reduce_groups", "group_rows"]

#: The most receives one N-source unit reduces (``HCCC_GROUP_RECVS`` of the engine): the one-shot
#: AllReduce of 9 ranks within a node; each receive costs the unit descriptor 40 bytes of shared
#: memory (``hccc_unit``, double-buffered) and the sync lane's primitive 32.
GROUP_RECVS = 8
#: Chunks a unit round holds (``HCCC_UNIT_PIECES``): a group is one round.
UNIT_PIECES = 8
#: Collectives whose in-place run makes input and output one buffer, chunk for chunk.
ALIAS_ONE_BUFFER = frozenset({"allreduce", "broadcast", "reduce"})


def _candidates(ir: ProgramIR, direct: np.ndarray | None, anchors: np.ndarray | None) -> list[tuple[int, int]]:
    """Runs of rows satisfying every condition but the deadlock proof: (first row, rows)."""
    p = ir.prims
    n = ir.nprims
    if n < 2:
        return []
    op = p["op"].astype(np.int64)
    rank, tb, seq = (p[k].astype(np.int64) for k in ("rank", "tb", "seq"))
    sb, so, db, do, cnt = (p[k].astype(np.int64) for k in ("src_buf", "src_off", "dst_buf", "dst_off", "count"))
    rrc = (op == int(Op.RECV_REDUCE_COPY)) & (cnt >= 1) & (cnt <= UNIT_PIECES)
    if direct is not None:
        rrc &= np.asarray(direct, np.int64) == 0
    if ir.collective == "alltoall":   # (AllToAllv's block pieces are another path)
        return []
    into_dst = (sb == db) & (so == do)
    scratch = (sb == int(Buf.SCRATCH)) | (db == int(Buf.SCRATCH))
    one_buffer = ir.collective in ALIAS_ONE_BUFFER
    io = (np.isin(sb, (int(Buf.INPUT), int(Buf.OUTPUT))) & np.isin(db, (int(Buf.INPUT), int(Buf.OUTPUT)))
          & (sb != db) & (so == do) & one_buffer)
    can_start = rrc & (into_dst | scratch | io)
    waits = np.zeros(n, bool)
    waits[np.asarray(ir.dep_prim, np.int64)] = True
    awaited = np.zeros(n, bool)
    awaited[np.asarray(ir.dep_on, np.int64)] = True
    # row i + 1 joins row i's group
    joins = np.zeros(n, bool)
    a, b = np.arange(n - 1), np.arange(1, n)
    joins[1:] = (rrc[a] & rrc[b] & (rank[a] == rank[b]) & (tb[a] == tb[b]) & (seq[b] == seq[a] + 1)
                 & (db[a] == db[b]) & (do[a] == do[b]) & (cnt[a] == cnt[b]) & into_dst[b]
                 & ~waits[b] & ~awaited[a])
    if anchors is not None:              # the group's regions share the first row's data offset
        anc = np.asarray(anchors, np.int64)
        joins[1:] &= anc[a] == anc[b]
    peer = p["recv_peer"].astype(np.int64)
    chan = p["channel"].astype(np.int64)
    out: list[tuple[int, int]] = []
    starts = np.flatnonzero(can_start & np.r_[joins[1:], False])
    i_end = -1
    for s in starts.tolist():
        if s < i_end:
            continue
        conns = {(int(peer[s]), int(chan[s]))}
        e = s + 1
        while e < n and joins[e] and e - s < GROUP_RECVS and (int(peer[e]), int(chan[e])) not in conns:
            conns.add((int(peer[e]), int(chan[e])))
            e += 1
        if e - s >= 2:
            out.append((s, e - s))
        i_end = e
    return out


def _proven(ir: ProgramIR, groups: list[tuple[int, int]]) -> bool:
    from hccc.compiler.ir.check import DeadlockError, check_deadlock
    try:
        check_deadlock(ir, groups=groups)
    except DeadlockError:
        return False
    return True


def reduce_groups(ir: ProgramIR, direct: np.ndarray | None = None,
                  anchors: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The receive groups of ``ir`` (canonical order, structurally checked and deadlock-free
    ungrouped), as (first row, rows) in row order; ``direct``: the rows' direct-mode field
    (:func:`hccc.compiler.backend.direct_fields.direct_fields`' ``direct``; None: no direct row);
    ``anchors``: every row's message anchor (:func:`hccc.compiler.backend.codegen.message_anchors`):
    a group's rows must share one, so that each received region's data lies at the first row's
    offset (``hccc_region_offset``: the kernels send no header); None: not checked (the cost
    model's estimate). Every group satisfies the module docstring's conditions, proven together."""
    cand = _candidates(ir, direct, anchors)
    if not cand or _proven(ir, cand):
        return cand
    kept = [g for g in cand if _proven(ir, [g])]
    return kept if kept and _proven(ir, kept) else []


def group_rows(nprims: int, groups: list[tuple[int, int]]) -> np.ndarray:
    """``nsrc`` per row: the group's rows on its first row, 0 elsewhere (int64)."""
    v = np.zeros(nprims, np.int64)
    for s, k in groups:
        v[s] = k
    return v
