"""ProgramIR -> MSCCL++ execution plan (see :mod:`hccc.compiler.interop.mscclpp_plan` for the format).

How a program becomes a plan:

* every hccc thread block becomes a plan thread block running the primitives in their order, once
  over whole chunks (the executor's algorithm-level execution: with one micro-batch per chunk it is
  the task-level order too); a thread block longer than the executor's ``MAX_OPERATION`` is cut
  into segments on thread blocks of their own, chained by device semaphores (each segment starts
  when the one before it finished), so long programs are unrolled within the limits;
* every connection ``(sender, receiver, channel)`` gets a channel pair: a memory channel when both
  ranks are on one node, a port channel (host proxy, IB) across nodes, by the algorithm's
  ``GPUPerNode`` or the cluster's nodes;
* a message is put into a scratch slot of its own on the receiver (the receive FIFO of hccc's
  kernels), then signalled (a port channel puts, signals and flushes in one ``pwsf``); the
  receiver waits on its end and copies or reduces (``copy``, ``re``) the slot into place; every
  slot is written once per run, so a sender never overwrites data not yet read. Before the first
  put on a connection the sender waits for the receiver's ``ready`` signal, which the receiver
  sends when its run starts: a rank a run ahead cannot write into a slot its peer still reads;
* with the ``LL`` protocol the message travels as packets (``ppkt``) that carry their own flag,
  the receiver unpacks or reduces them (``upkt``, ``repkt``, ``respkt`` when it forwards the sum),
  without signals, in a double scratch buffer (LL runs within a node: a port channel carries
  packets only from a packet-format source);
* a cross-thread-block dependency is a device semaphore released after the producer and acquired
  before the consumer; ``nop`` (``__syncthreads``) separates the operations the first threads run
  (waits, signals, semaphores) from the data operations around them, and data operations from
  each other;
* in place, the buffers alias as the collective dictates (AllGather input = output[rank], ...),
  a copy onto itself is dropped;
* ``instances`` = k: k copies of every thread block on channels of their own, copy ``j`` moving
  part ``j`` of every chunk (the plan's chunks are hccc's chunks split k ways);
* ``micro_batches`` = M: the task-level pipeline unrolled: every chunk cut into M parts, each
  thread block running each primitive for every part before the next primitive (so a forwarded
  part moves on while the next one arrives), within the executor's limits (long blocks chained).

Every executor limit is checked on the finished plan and a refusal names the limit, the rank and
thread block that break it and what would fit; the message-size range is bounded by the 32-bit
offsets of the device plan.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.interop.mscclpp_limits import check_plan_fits, largest_input
from hccc.compiler.interop.mscclpp_ops import NOP, PlanOp, local, remote
from hccc.compiler.interop.mscclpp_plan import (BUFFER_ALIGNMENT, COLLECTIVES, CONTROL_OPS, LETTER_OF_BUF,
                                                PROTOCOLS, PlanLimits)
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op, ProgramIR
from hccc.compiler.ir.sort_order import lexsort


def _error(msgs: list[str]) -> CompileError:
    return CompileError([Diagnostic(m, None) for m in msgs])


def _refuse(msg: str) -> CompileError:
    return _error(["the program does not fit the MSCCL++ executor: " + msg])


def node_map(nranks: int, gpus_per_node: int = 0, topology=None) -> np.ndarray:
    """rank -> node: the cluster's nodes when given, else ``rank // gpus_per_node`` (0: one node)."""
    if topology is not None:
        return np.asarray(topology.rank_node, dtype=np.int64)[:nranks]
    if gpus_per_node and gpus_per_node > 0:
        return np.arange(nranks, dtype=np.int64) // int(gpus_per_node)
    return np.zeros(nranks, dtype=np.int64)


class _Tb:
    """One plan thread block being written: its operations with symbolic channels and remote buffers
    (``(type, rank-level index)``), resolved to the block's own lists when it is finished."""

    def __init__(self, label: str):
        self.label = label
        self.ops: list[PlanOp] = []
        self.last_data = False
        self.cuts: list[int] = []       # where the block may be cut: after the handshake and each primitive

    def cut(self) -> None:
        if self.ops and (not self.cuts or self.cuts[-1] != len(self.ops)):
            self.cuts.append(len(self.ops))

    def emit(self, op: PlanOp) -> None:
        data = op.name not in CONTROL_OPS
        if self.ops and (data or self.last_data) and not self.ops[-1].is_nop:
            self.ops.append(NOP)
        self.ops.append(op)
        self.last_data = data


def _resolve(ops: list[PlanOp], tb_id: int) -> dict:
    """A thread block object with its channel and remote-buffer lists, the operations' symbolic
    references replaced by indices into them."""
    chans: dict[str, list[int]] = {"memory": [], "port": []}
    bufs: dict[str, list[int]] = {"memory": [], "port": []}
    chan_at: dict[tuple[str, int], int] = {}
    buf_at: dict[tuple[str, int], int] = {}
    def index(at: dict, lists: dict, key: tuple[str, int]) -> int:
        if key not in at:
            at[key] = len(lists[key[0]])
            lists[key[0]].append(key[1])
        return at[key]

    def refs(side):
        if side is None:
            return None
        return tuple(remote(index(buf_at, bufs, ref.buffer_id), ref.index, ref.size)
                     if ref.buffer_id is not None else ref for ref in side)

    out = []
    for op in ops:
        ids = None if op.channel_ids is None else tuple(index(chan_at, chans, c) for c in op.channel_ids)
        out.append(op.with_refs(ids, refs(op.src), refs(op.dst)).to_dict())
    tb = {"id": tb_id, "ops": out,
          "channels": [{"channel_type": t, "channel_ids": chans[t]} for t in ("memory", "port") if chans[t]],
          "remote_buffer_refs": [{"access_channel_type": t, "remote_buffer_ids": bufs[t]}
                                 for t in ("memory", "port") if bufs[t]]}
    return tb


def _zip_runs(*lists: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Cut runs ``(index, size)`` of equal total size at common boundaries: ``(i1, i2, ..., size)``."""
    out = []
    pos = [0] * len(lists)
    used = [0] * len(lists)
    while pos[0] < len(lists[0]):
        size = min(lst[p][1] - u for lst, p, u in zip(lists, pos, used))
        out.append(tuple(lst[p][0] + u for lst, p, u in zip(lists, pos, used)) + (size,))
        for k, lst in enumerate(lists):
            used[k] += size
            if used[k] == lst[pos[k]][1]:
                pos[k] += 1
                used[k] = 0
    return out


def export_plan(ir: ProgramIR, *, nodes: np.ndarray | None = None, protocol: str = "Simple",
                inplace: bool = False, instances: int = 1, micro_batches: int = 1, min_bytes: int = 0,
                max_bytes: int = 0,
                limits: PlanLimits | None = None, name: str | None = None) -> dict:
    """The MSCCL++ execution plan of ``ir`` (a JSON-ready dict); raises :class:`CompileError`
    naming the executor limit a program breaks. ``nodes``: rank -> node (:func:`node_map`; default
    one node). ``min_bytes`` / ``max_bytes``: the message sizes the plan serves (0: from the
    smallest the chunking allows to the largest its 32-bit offsets reach)."""
    lim = limits or PlanLimits()
    _check_arguments(ir, protocol, instances, micro_batches)
    nodes = np.zeros(ir.nranks, np.int64) if nodes is None else np.asarray(nodes, np.int64)
    F = int(instances)
    M = int(micro_batches)
    # limits the plan certainly breaks, from the IR's columns, before anything is built
    check_plan_fits(ir, lim, nodes=nodes, protocol=protocol, copies=F * M, instances=F)
    _check_valid(ir)
    if M > 1:
        _check_task_level(ir)
    copies = [(j, m) for j in range(F) for m in range(M)]     # (instance, micro-batch)
    P = {k: v.tolist() for k, v in ir.prims.items()}
    order = lexsort((ir.prims["seq"], ir.prims["tb"], ir.prims["rank"])).tolist()
    conns, msg_send, msg_recv, kind = _messages(P, order, nodes, protocol)
    chan_lists, chan_of = _channels(ir.nranks, F, conns, kind)
    nscratch, slot, temp = _scratch(ir, P, order, protocol, copies, msg_recv)
    sems, acq, rel = _semaphores(ir, P, copies)
    ctx = _Emit(P, protocol, msg_send, msg_recv, chan_of, slot, temp, _RemoteBuffers(ir.nranks),
                _BufferRuns(ir, inplace, F, M), lim)
    tb_ops = _thread_blocks(ctx, order, F, M, acq, rel)
    gpus = [_gpu(ir, r, tb_ops[r], chan_lists[r], ctx.remote.lists[r], nscratch[r], sems, lim, F, M)
            for r in range(ir.nranks)]
    lo, hi = _size_range(ir, gpus, F * M, protocol, min_bytes, max_bytes)
    return {"name": name or ir.name, "collective": ir.collective, "protocol": protocol, "inplace": bool(inplace),
            "reuse_resources": False, "num_threads_per_block": lim.threads_per_block,
            "use_double_scratch_buffer": protocol == "LL", "buffer_alignment": BUFFER_ALIGNMENT,
            "min_message_size": lo, "max_message_size": hi, "gpus": gpus}


def _check_arguments(ir: ProgramIR, protocol: str, instances: int, micro_batches: int) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r} (expected {', '.join(PROTOCOLS)})")
    if instances < 1:
        raise ValueError("instances must be at least 1")
    if ir.collective not in COLLECTIVES:
        raise _error([f"cannot export collective '{ir.collective}' as an MSCCL++ plan: hccc writes "
                      f"{', '.join(COLLECTIVES)} (the executor's plans have no root)"])
    if int(micro_batches) < 1:
        raise ValueError("micro_batches must be at least 1")


def _messages(P: dict, order: list[int], nodes: np.ndarray, protocol: str):
    """The connections ``(sender, receiver, channel)``, each primitive's message ``(connection, k)``
    on the sending and the receiving side (the k-th send of a connection is the k-th receive) and
    each connection's channel type (port across nodes)."""
    sends: dict[tuple, list[int]] = defaultdict(list)
    recvs: dict[tuple, list[int]] = defaultdict(list)
    for i in order:
        op = Op(P["op"][i])
        if op.sends:
            sends[(P["rank"][i], P["send_peer"][i], P["channel"][i])].append(i)
        if op.receives:
            recvs[(P["recv_peer"][i], P["rank"][i], P["channel"][i])].append(i)
    conns = sorted(set(sends) | set(recvs))
    msg_send: dict[int, tuple] = {}
    msg_recv: dict[int, tuple] = {}
    for c in conns:
        for k, (i, j) in enumerate(zip(sends.get(c, []), recvs.get(c, []))):
            msg_send[i] = (c, k)
            msg_recv[j] = (c, k)
    kind = {c: ("port" if nodes[c[0]] != nodes[c[1]] else "memory") for c in conns}
    if protocol == "LL":
        far = [c for c in conns if kind[c] == "port"]
        if far:
            s, r, ch = far[0]
            raise _error([f"protocol LL: rank {s} sends to rank {r} (channel {ch}) on another node, over a "
                          f"port channel, which carries packets only from a packet-format source; "
                          f"export with protocol Simple, or run the program within one node"])
    return conns, msg_send, msg_recv, kind


def _channels(R: int, F: int, conns: list, kind: dict):
    """One channel pair per connection and instance, in one global order on both ends: each rank's
    peers per channel type and ``(rank, instance, conn) -> (type, index)``."""
    chan_lists: list[dict[str, list[int]]] = [{"memory": [], "port": []} for _ in range(R)]
    chan_of: dict[tuple, tuple[str, int]] = {}
    for j in range(F):
        for c in conns:
            s, r, _ = c
            t = kind[c]
            for a, b in ((s, r), (r, s)):
                chan_of[(a, j, c)] = (t, len(chan_lists[a][t]))
                chan_lists[a][t].append(b)
    return chan_lists, chan_of


class _RemoteBuffers:
    """Each rank's remote buffers (a peer's scratch over a channel type), declared on first use."""

    def __init__(self, R: int):
        self.lists: list[list[dict]] = [[] for _ in range(R)]
        self._at: list[dict] = [{} for _ in range(R)]

    def __call__(self, rank: int, peer: int, t: str) -> tuple[str, int]:
        key = (peer, t)
        if key not in self._at[rank]:
            self._at[rank][key] = len(self.lists[rank])
            self.lists[rank].append({"rank": peer, "type": "s", "access_channel_types": [t]})
        return (t, self._at[rank][key])


def _scratch(ir: ProgramIR, P: dict, order: list[int], protocol: str, copies: list, msg_recv: dict):
    """Scratch chunks per rank: the program's own chunks, LL reduce temporaries, then one slot per
    message; the slot of each ``(message, copy)`` and temporary of each ``(primitive, copy)``."""
    FM = len(copies)
    R = ir.nranks
    plain = [ir.scratch_chunks * FM] * R
    if protocol == "LL":
        for i in order:
            if P["op"][i] == Op.RECV_REDUCE_SEND:
                plain[P["rank"][i]] += P["count"][i] * FM
    nscratch = list(plain)
    slot: dict[tuple, int] = {}
    temp: dict[tuple, int] = {}
    tmp_next = [ir.scratch_chunks * FM] * R
    for j in copies:
        for i in order:
            r = P["rank"][i]
            if i in msg_recv:
                slot[(msg_recv[i], j)] = nscratch[r]
                nscratch[r] += P["count"][i]
            if protocol == "LL" and P["op"][i] == Op.RECV_REDUCE_SEND:
                temp[(i, j)] = tmp_next[r]
                tmp_next[r] += P["count"][i]
    return nscratch, slot, temp


class _BufferRuns:
    """A primitive's buffer range as the plan addresses it: aliased in place as the collective
    dictates, then (with several copies) the copy's part of every chunk."""

    def __init__(self, ir: ProgramIR, inplace: bool, F: int, M: int):
        self.ir, self.inplace, self.F, self.M = ir, inplace, F, M

    def alias(self, rank: int, buf: int, off: int) -> tuple[int, int]:
        if not self.inplace:
            return buf, off
        overlay = SPECS[self.ir.collective].alias      # how the collective's buffers overlay in place
        if overlay == "input in output" and buf == Buf.INPUT:
            return int(Buf.OUTPUT), rank * self.ir.in_chunks + off
        if overlay == "output in input" and buf == Buf.OUTPUT:
            return int(Buf.INPUT), rank * self.ir.out_chunks + off
        if overlay == "same" and buf == Buf.INPUT:
            return int(Buf.OUTPUT), off
        return buf, off

    def __call__(self, rank: int, buf: int, off: int, cnt: int, j: tuple) -> tuple[str, list[tuple[int, int]]]:
        buf, off = self.alias(rank, buf, off)
        F, M = self.F, self.M
        if F * M == 1:
            return LETTER_OF_BUF[Buf(buf)], [(off, cnt)]
        return LETTER_OF_BUF[Buf(buf)], [((c * F + j[0]) * M + j[1], 1) for c in range(off, off + cnt)]


def _semaphores(ir: ProgramIR, P: dict, copies: list):
    """Cross-thread-block dependencies as semaphores: the count per rank, the ids each
    ``(primitive, copy)`` acquires before and releases after it."""
    sems = [0] * ir.nranks
    acq: dict[tuple, list[int]] = defaultdict(list)
    rel: dict[tuple, list[int]] = defaultdict(list)
    dp, do = ir.dep_prim.tolist(), ir.dep_on.tolist()
    for j in copies:
        for a, b in zip(dp, do):
            if P["tb"][a] == P["tb"][b] and P["seq"][b] < P["seq"][a]:
                continue      # program order already
            r = P["rank"][a]
            acq[(a, j)].append(sems[r])
            rel[(b, j)].append(sems[r])
            sems[r] += 1
    return sems, acq, rel


@dataclass(frozen=True)
class _Emit:
    """What writing a primitive's operations reads: the columns, protocol, messages, channels,
    scratch slots and temporaries, remote buffers, buffer runs and limits."""
    P: dict
    protocol: str
    msg_send: dict
    msg_recv: dict
    chan_of: dict
    slot: dict
    temp: dict
    remote: _RemoteBuffers
    runs: _BufferRuns
    lim: PlanLimits


def _thread_blocks(ctx: _Emit, order: list[int], F: int, M: int, acq: dict, rel: dict):
    """Per rank, each plan thread block (one per program thread block and instance) as
    ``(label, operations, cuts)``."""
    P = ctx.P
    tb_ops: list[list[tuple]] = [[] for _ in range(len(ctx.remote.lists))]
    by_tb: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in order:
        by_tb[(P["rank"][i], P["tb"][i])].append(i)
    for inst in range(F):
        for (r, t), prims in sorted(by_tb.items()):
            tb = _Tb(f"rank {r} thread block {t}" + (f" (instance {inst})" if F > 1 else ""))
            if ctx.protocol == "Simple":
                _handshake(tb, r, inst, prims, P, ctx.msg_send, ctx.msg_recv, ctx.chan_of, ctx.lim)
                tb.cut()
            for i in prims:
                for m in range(M):       # task-level: each primitive for every micro-batch before the next
                    j = (inst, m)
                    _prim_ops(tb, i, j, P, ctx.protocol, ctx.msg_send, ctx.msg_recv, ctx.chan_of, ctx.slot,
                              ctx.temp, ctx.runs, ctx.remote, acq.get((i, j), []), rel.get((i, j), []), ctx.lim)
                    tb.cut()
            tb_ops[r].append((tb.label, tb.ops, tb.cuts))
    return tb_ops


def _gpu(ir: ProgramIR, r: int, tb_ops: list, chan_lists: dict, rbufs: list, nscratch: int, sems: list[int],
         lim: PlanLimits, F: int, M: int) -> dict:
    """Rank ``r``'s plan object: its thread blocks cut into segments and resolved, checked against
    the executor's limits."""
    tbs = []
    for label, ops, cuts in tb_ops:
        for seg in _segments(ops, cuts, lim, sems, r, label):
            tbs.append(_resolve(seg, len(tbs)))
    _check_rank(r, tbs, tb_ops, lim, F)
    channels = [{"channel_type": t, "connected_to": chan_lists[t]} for t in ("memory", "port") if chan_lists[t]]
    FM = F * M
    return {"id": r, "input_chunks": ir.in_chunks * FM, "output_chunks": ir.out_chunks * FM,
            "scratch_chunks": nscratch, "threadblocks": tbs, "channels": channels,
            "remote_buffers": rbufs, "semaphores": [{"init_value": 0}] * sems[r]}


def _check_task_level(ir: ProgramIR) -> None:
    """Micro-batches unrolled in task-level order (each primitive for every micro-batch before the
    next) need the program to be deadlock-free that way (hccc's own programs are)."""
    from hccc.compiler.ir.check import DeadlockError, check_deadlock
    try:
        check_deadlock(ir)
    except DeadlockError as exc:
        raise _error([f"cannot unroll micro-batches: the program is deadlock-free only when every thread block "
                      f"runs its whole list per micro-batch (algorithm-level): {exc}; export it with one "
                      f"micro-batch"]) from None


def _check_valid(ir: ProgramIR) -> None:
    from hccc.compiler.ir.check import check_fifo_order, check_structure
    from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered
    try:
        check_structure(ir)
        check_fifo_order(ir)
        # the plan's execution: every thread block runs its list once, a message has a slot of its
        # own (sends never block), receives wait for their send, consumers for their producers
        check_deadlock_buffered(ir, None)
    except (IRFormatError, ProofError) as exc:
        raise _error([f"cannot export an invalid program: {exc}"]) from None


def _batches(ids: list, n: int) -> list[list]:
    return [ids[k:k + n] for k in range(0, len(ids), n)]


def _handshake(tb: _Tb, r, j, prims, P, msg_send, msg_recv, chan_of, lim: PlanLimits) -> None:
    """Ready signals on the connections this block receives on, then waits for them on the ones
    it sends on (before the first put)."""
    recv_ch, send_ch = [], []
    for i in prims:
        if i in msg_recv and chan_of[(r, j, msg_recv[i][0])] not in recv_ch:
            recv_ch.append(chan_of[(r, j, msg_recv[i][0])])
        if i in msg_send and chan_of[(r, j, msg_send[i][0])] not in send_ch:
            send_ch.append(chan_of[(r, j, msg_send[i][0])])
    for name, chs in (("signal", recv_ch), ("wait", send_ch)):
        for t in ("memory", "port"):
            ids = [c for c in chs if c[0] == t]
            for batch in _batches(ids, lim.max_channels_per_op):
                tb.emit(PlanOp(name, channel_ids=tuple(batch), channel_type=t))


def _prim_ops(tb: _Tb, i, j, P, protocol, msg_send, msg_recv, chan_of, slot, temp, runs, remote_scratch,
              acq, rel, lim: PlanLimits) -> None:
    r = P["rank"][i]
    op = Op(P["op"][i])
    cnt = P["count"][i]
    for batch in _batches(acq, lim.max_semaphores_per_op):
        tb.emit(PlanOp("sem_acquire", semaphore_ids=tuple(batch)))
    src = runs(r, P["src_buf"][i], P["src_off"][i], cnt, j) if op.reads_src else None
    dst = runs(r, P["dst_buf"][i], P["dst_off"][i], cnt, j) if op.writes_dst else None
    rslot = None
    if i in msg_recv:
        q = slot[(msg_recv[i], j)]
        rslot = ("s", [(q, cnt)])
        if protocol == "Simple":
            t, g = chan_of[(r, j[0], msg_recv[i][0])]
            tb.emit(PlanOp("wait", channel_ids=((t, g),), channel_type=t))

    def copy(a, b):
        for x, y, n in _zip_runs(a[1], b[1]):
            if a[0] == b[0] and x == y:
                continue
            tb.emit(PlanOp("copy", src=(local(a[0], x, n),), dst=(local(b[0], y, n),)))

    def reduce(a, b, out, name="re"):
        for x, y, z, n in _zip_runs(a[1], b[1], out[1]):
            tb.emit(PlanOp(name, src=(local(a[0], x, n), local(b[0], y, n)), dst=(local(out[0], z, n),)))

    def send(a):
        c, k = msg_send[i]
        peer = c[1]
        t, g = chan_of[(r, j[0], c)]
        q = slot[((c, k), j)]
        rb = remote_scratch(r, peer, t)
        pieces = _zip_runs(a[1], [(q, cnt)])
        for n_, (x, y, n) in enumerate(pieces):
            last = n_ == len(pieces) - 1
            if protocol == "LL":
                name = "ppkt"
            elif t == "port":
                name = "pwsf" if last else "put"
            else:
                name = "put"
            tb.emit(PlanOp(name, src=(local(a[0], x, n),), dst=(remote(rb, y, n),), channel_type=t,
                           channel_ids=((t, g),)))
        if protocol == "Simple" and t == "memory":
            tb.emit(PlanOp("signal", channel_ids=((t, g),), channel_type=t))

    if protocol == "LL" and rslot is not None:
        _ll_receive(tb, i, j, op, r, src, dst, rslot, cnt, msg_send, chan_of, slot, temp, remote_scratch, send)
    elif op == Op.SEND:
        send(src)
    elif op == Op.RECV:
        copy(rslot, dst)
    elif op == Op.RECV_REDUCE_COPY:
        reduce(src, rslot, dst)
    elif op == Op.RECV_COPY_SEND:
        copy(rslot, dst)
        send(rslot)
    elif op == Op.RECV_REDUCE_SEND:
        reduce(src, rslot, rslot)
        send(rslot)
    elif op == Op.RECV_REDUCE_COPY_SEND:
        reduce(src, rslot, dst)
        send(dst)
    elif op == Op.COPY:
        copy(src, dst)
    elif op == Op.REDUCE:
        reduce(dst, src, dst)
    for batch in _batches(rel, lim.max_semaphores_per_op):
        tb.emit(PlanOp("sem_release", semaphore_ids=tuple(batch)))


def _ll_receive(tb, i, j, op, r, src, dst, rslot, cnt, msg_send, chan_of, slot, temp, remote_scratch,
                send) -> None:
    """A receiving primitive with packets: the slot holds packets (unpacked by ``upkt``, reduced by
    ``repkt``; ``respkt`` reduces and forwards the sum as packets in one operation)."""
    if op in (Op.RECV, Op.RECV_COPY_SEND):
        for x, y, n in _zip_runs(rslot[1], dst[1]):
            tb.emit(PlanOp("upkt", src=(local("s", x, n),), dst=(local(dst[0], y, n),)))
        if op == Op.RECV_COPY_SEND:
            send(dst)
        return
    if op == Op.RECV_REDUCE_COPY:
        for x, y, z, n in _zip_runs(src[1], rslot[1], dst[1]):
            tb.emit(PlanOp("repkt", src=(local(src[0], x, n), local("s", y, n)), dst=(local(dst[0], z, n),)))
        return
    # RECV_REDUCE_SEND / RECV_REDUCE_COPY_SEND: reduce, keep (dst or a temporary), forward
    out = dst if op == Op.RECV_REDUCE_COPY_SEND else ("s", [(temp[(i, j)], cnt)])
    c, k = msg_send[i]
    t, g = chan_of[(r, j[0], c)]
    q = slot[((c, k), j)]
    rb = remote_scratch(r, c[1], t)
    for x, y, z, w, n in _zip_runs(src[1], rslot[1], out[1], [(q, cnt)]):
        tb.emit(PlanOp("respkt", src=(local(src[0], x, n), local("s", y, n)),
                       dst=(local(out[0], z, n), remote(rb, w, n)), channel_type=t, channel_ids=((t, g),)))


def _segments(ops: list[PlanOp], cuts: list[int], lim: PlanLimits, sems: list[int], r: int,
              label: str) -> list[list[PlanOp]]:
    """A thread block's operations cut, between primitives, into segments of at most
    ``max_operations``, each after the first starting once the one before finished (a semaphore
    released at the end of one and acquired at the start of the next)."""
    if len(ops) <= lim.max_operations:
        return [ops]
    body = lim.max_operations - 4         # acquire + nop before, nop + release after
    pieces = []
    start = 0
    bounds = [c for c in cuts if c > 0] + ([len(ops)] if not cuts or cuts[-1] != len(ops) else [])
    prev = 0
    for c in bounds:
        if c - start > body and prev > start:
            pieces.append(ops[start:prev])
            start = prev
        if c - start > body:        # the primitive from ``start`` to ``c`` alone is too long
            raise _refuse(f"{label}: one primitive needs {c - start} operations, more than fit one thread "
                          f"block ({lim.max_operations}, MAX_OPERATION, with the operations chaining it to the "
                          f"block before and after); fewer instances or fewer chunks per step would fit")
        prev = c
    pieces.append(ops[start:])
    out = []
    for n, piece in enumerate(pieces):
        while piece and piece[0].is_nop:
            piece = piece[1:]
        while piece and piece[-1].is_nop:
            piece = piece[:-1]
        seg = _Tb("")
        if n:
            seg.emit(PlanOp("sem_acquire", semaphore_ids=(sems[r] - 1,)))
        for op in piece:
            if op.is_nop:
                seg.ops.append(op)
                seg.last_data = False
            else:
                seg.emit(op)
        if n < len(pieces) - 1:
            seg.emit(PlanOp("sem_release", semaphore_ids=(sems[r],)))
            sems[r] += 1
        out.append(seg.ops)
    return out


def _check_rank(r: int, tbs: list[dict], hccc_tbs: list, lim: PlanLimits, F: int) -> None:
    msgs = []
    if len(tbs) > lim.max_tbs:
        per = len(tbs) // max(1, F)
        fit = f"; with {F // 2 or 1} instance(s) it would need about {per * (F // 2 or 1)}" if F > 1 else ""
        msgs.append(f"rank {r} needs {len(tbs)} thread blocks ({len(hccc_tbs)} program thread blocks"
                    + (f" for {F} instances" if F > 1 else "")
                    + f", cut into segments of at most {lim.max_operations} operations), but at most "
                    f"{lim.max_tbs} can be resident at once (one 1,024-thread block per SM; the blocks of a rank "
                    f"wait on each other){fit}")
    for tb in tbs:
        if len(tb["ops"]) > lim.max_operations:
            msgs.append(f"rank {r} thread block {tb['id']} has {len(tb['ops'])} operations, more than "
                        f"MAX_OPERATION {lim.max_operations}")
        for ent in tb["channels"]:
            if len(ent["channel_ids"]) > lim.max_channels:
                msgs.append(f"rank {r} thread block {tb['id']} uses {len(ent['channel_ids'])} "
                            f"{ent['channel_type']} channels, but a thread block holds at most MAX_CHANNEL "
                            f"{lim.max_channels} of each type (fewer connections per program thread block "
                            f"would fit)")
        for ent in tb["remote_buffer_refs"]:
            if len(ent["remote_buffer_ids"]) > lim.max_channels:
                msgs.append(f"rank {r} thread block {tb['id']} reaches {len(ent['remote_buffer_ids'])} peer "
                            f"buffers over {ent['access_channel_type']} channels, but a thread block holds at most "
                            f"MAX_CHANNEL {lim.max_channels}")
        if len(msgs) > 4:
            break
    if msgs:
        raise _error(["the program does not fit the MSCCL++ executor: " + m for m in msgs])


def _size_range(ir: ProgramIR, gpus: list[dict], F: int, protocol: str, min_bytes: int,
                max_bytes: int) -> tuple[int, int]:
    """The message sizes the plan serves: multiples of ``buffer_alignment`` x chunks whose every byte
    offset fits the device plan's 32 bits. Sizes are the input's (AllGather: the output's)."""
    in_fine = ir.in_chunks * F
    end, where = 1, "input"
    for g in gpus:
        ends = {"input": g["input_chunks"], "output": g["output_chunks"],
                "scratch": g["scratch_chunks"] * (2 if protocol == "LL" else 1)}
        for what, e in ends.items():
            if e > end:
                end, where = e, f"rank {g['id']}'s {what} buffer ({e} chunks"\
                    + (", packets twice the data" if what == "scratch" and protocol == "LL" else "") + ")"
    step = BUFFER_ALIGNMENT * in_fine             # input sizes the executor accepts are multiples of this
    largest_in = largest_input(in_fine, end)
    scale = (ir.out_chunks / ir.in_chunks) if ir.collective == "allgather" else 1
    smallest = int(step * scale)
    largest = int(largest_in * scale)
    if largest < smallest:
        raise _refuse(f"{where} does not fit 32-bit byte offsets even at the smallest message size")
    if max_bytes and max_bytes > largest:
        raise _refuse(f"a message of {max_bytes} bytes would put {where} past the executor's 32-bit byte "
                      f"offsets; the largest message this plan can serve is {largest} bytes (max bytes {largest})")
    lo = max(int(min_bytes), 0)
    hi = int(max_bytes) if max_bytes else largest
    if lo > hi:
        raise _error([f"the smallest message size {lo} is above the largest {hi}"])
    return lo, hi


def plan_text(plan: dict) -> str:
    """The plan as the JSON text written to disk (deterministic: one thread block per line)."""
    head = {k: v for k, v in plan.items() if k != "gpus"}
    parts = ["{" + json.dumps(head)[1:-1] + ',\n "gpus": [\n']
    for n, g in enumerate(plan["gpus"]):
        ghead = {k: v for k, v in g.items() if k != "threadblocks"}
        parts.append("  {" + json.dumps(ghead)[1:-1] + ',\n   "threadblocks": [\n')
        parts.append(",\n".join("    " + json.dumps(tb, separators=(",", ":")) for tb in g["threadblocks"]))
        parts.append("\n   ]}" + (",\n" if n < len(plan["gpus"]) - 1 else "\n"))
    parts.append(" ]}\n")
    return "".join(parts)


def plan_summary(plan: dict) -> dict:
    """Counts of a plan (thread blocks, operations by name) for messages and tables."""
    tbs = ops = nops = 0
    for g in plan["gpus"]:
        for tb in g["threadblocks"]:
            tbs += 1
            for op in tb["ops"]:
                ops += 1 + len(op.get("ops", ()))
                nops += op["name"] == "nop"
    return {"tbs": tbs, "ops": ops, "nops": nops}


__all__ = ["export_plan", "node_map", "plan_text", "plan_summary"]
