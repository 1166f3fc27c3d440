"""Lowering: scheduled tasks -> per-rank primitives (ResCCL section 4.3, "task-to-primitive translation").

Every transfer (task) ``t`` becomes a send on ``src[t]`` and a receive on ``dst[t]`` (``RECV`` for
``recv``, ``RECV_REDUCE_COPY`` for ``rrc``). The result, :class:`LoweredProgram`, is a columnar
primitive table without thread blocks yet; :mod:`tb_alloc` assigns TBs and sequence numbers.

Buffer mapping (how one ``.rccl`` serves in-place and out-of-place runs). The DSL gives every rank one
data buffer of ``nchunks = nranks * K`` chunks (``K`` chunks per rank; rank ``r`` owns chunks
``r*K .. r*K+K-1``). The collective's spec (:mod:`hccc.compiler.frontend.collectives`) says where
each chunk lives: chunk ``c`` of rank ``r`` is read from its input slot until it is first written
(by step order; only the ranks the precondition gives the chunk may read it from there). Writes
go to the chunk's output slot where the postcondition puts the chunk on that rank (AllGather,
AllReduce and Broadcast: every rank, ``output[c]``; ReduceScatter: the owner, ``output[c - r*K]``;
Reduce: the root), and to ``scratch[c]`` elsewhere (a non-root's output buffer is not the
collective's to touch, as in NCCL). Output chunks the postcondition needs but the program never
writes (AllGather: the rank's own chunks; Broadcast and Reduce: the root's; one-rank programs) get
a local ``COPY`` input->output, which in-place runs skip because source and destination alias.

A collective whose in-place overlay is crossed (:attr:`CollectiveSpec.crossed_overlay`: an output
slot is another id's input slot; AllToAll, ``nchunks = N*N*K`` DSL chunk ids, ``N*K`` slots per
buffer) has its own mapping, with the care in-place runs need: see :func:`_alltoall_mapping`. Both
take every id's blocks, slots and holders from the spec, never from the collective's name.

Fusion. A receive into ``(r, c)`` (task ``a``) followed by a send of ``(r, c)`` (task ``b``) becomes one
``RECV_COPY_SEND`` / ``RECV_REDUCE_COPY_SEND`` primitive when: ``a`` is ``b``'s only data predecessor on
the sending rank ``r`` (``a`` is the last writer of ``(r, c)`` before ``b``; predecessors on ``b``'s
receiving rank are enforced there and do not matter), both are in the same sub-pipeline, ``a`` is not
already fused (the first such ``b`` in insertion order wins), and the fused send keeps the FIFO
order of its connection and channel (below). ``forbid`` lists task pairs never to fuse (used by :func:`hccc.compiler.passes.build` to back off
when a fusion would close a wait cycle).

Channels of fused traffic. A fused primitive receives on one connection and sends on another, so
its thread block owns both ends. Fused traffic therefore travels on logical channels of its own
(:func:`fused_channels`): every chain of fused tasks gets one channel ``>= 1`` on each connection it
uses, chosen so that the fused primitives on a connection end and channel all belong to one
(receive-from, send-to) pair of that rank and no plain primitive shares their end. Unfused traffic
stays on channel 0 with its own thread blocks and FIFOs, so fusion no longer ties independent
connections together. A program that names channels itself (``transfer(..., channel)``) keeps them
and is not fused.
FIFO order is kept per (connection, channel): a fused send runs with its receive's key, so fusions
that would reorder the sends of a channel against its receives (:func:`_fifo_inversions`) are
dropped and the choice is made again.

Order keys. Each primitive has ``key = (pipeline, insertion position)`` packed into one int64. A fused
primitive runs in its receive's sub-pipeline after every unfused primitive of it, in insertion
order of its receive (``pipeline * (2T + 2) + T + 1 + position + 1``): a chain's head send then
precedes the forwarded traffic of its sub-pipeline on a shared channel, as the receives at the
other end expect. Within a TB primitives run in key order.

Dependencies. For every DAG edge ``u -> b`` and every rank where the two tasks conflict (one of them
writes that rank's copy of the chunk), the primitive of ``b`` on that rank depends on the primitive
of ``u`` there. :mod:`tb_alloc` keeps the pairs whose primitives land on different TBs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.frontend.algorithm import RRC, Algorithm, Collective
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.passes.schedule import Schedule
from hccc.compiler.ir.sort_order import lexsort, stable_argsort, unique
from hccc.compiler.passes.phase_order import phase_keys

NO_STEP = np.iinfo(np.int64).max


@dataclass
class LoweredProgram:
    """Primitives before TB allocation (columns as in ``program_ir.PRIM_COLUMNS`` minus tb/seq)."""

    collective: Collective
    nranks: int
    nchunks: int
    in_chunks: int
    out_chunks: int
    scratch_chunks: int
    npipelines: int
    cols: dict[str, np.ndarray]   # rank, pipeline, op, send_peer, recv_peer, channel, src_buf,
                                  # src_off, dst_buf, dst_off, count, task, task2
    key: np.ndarray               # int64 order key within a rank (module docstring, "Order keys")
    dep_prim: np.ndarray          # int64: dep_prim depends on dep_on (same rank, maybe same TB,
                                  # maybe repeated)
    dep_on: np.ndarray
    nfused: int = 0
    root: int = 0                 # Broadcast / Reduce root
    phase: np.ndarray | None = None   # int64 per primitive: a TB runs its primitives in (phase, key)
                                      # order; None: key order (compiler/passes/phase_order.py)

    @property
    def nprims(self) -> int:
        return len(self.key)


def buffer_sizes(coll: Collective, nranks: int, chunks_per_rank: int = 1) -> tuple[int, int, int]:
    """(in_chunks, out_chunks, scratch_chunks) for a collective over ``nranks`` ranks (its spec's
    :meth:`~hccc.compiler.frontend.collectives.CollectiveSpec.buffer_sizes`)."""
    return coll.spec.buffer_sizes(nranks, chunks_per_rank)


def _write_location(coll: Collective, rank: np.ndarray, chunk: np.ndarray, N: int, C: int, root: int = 0):
    """Where writes of (rank, chunk) go: (buf, off) arrays; the output slot where the
    postcondition puts the chunk, scratch (at the chunk id) where it does not."""
    spec = coll.spec
    keep = spec.holds(spec.end, rank, chunk, N, C, root)
    buf = np.where(keep, Buf.OUTPUT, Buf.SCRATCH).astype(np.int8)
    off = np.where(keep, spec.slot("output", rank, chunk, N, C), chunk)
    return buf, off


def lower(alg: Algorithm, dag, sched: Schedule, *, fuse: bool = True,
          forbid: set[tuple[int, int]] | None = None) -> LoweredProgram:
    """Lower the scheduled tasks of ``alg`` to primitives (see the module docstring)."""
    h = alg.header
    T = alg.ntransfers
    pipe = np.asarray(sched.subpipeline, dtype=np.int64)
    if len(pipe) != T or len(sched.order) != T:
        raise ValueError("schedule does not cover the algorithm's transfers")
    t = _Tasks(alg, pipe, sched.position())
    bm = _buffer_map(t)
    # the channels the program names; such a program is not fused: its channels already give
    # each stream connections and thread blocks of its own
    es = np.asarray(dag.edge_src, dtype=np.int64)
    ed = np.asarray(dag.edge_dst, dtype=np.int64)
    if fuse and alg.channel is None and len(es) and T:
        fused_send, task_channel = _fuse(t, es, ed, forbid)
    else:
        fused_send, task_channel = np.full(T, -1, dtype=np.int64), alg.channels.copy()
    is_fused_b = np.zeros(T, dtype=bool)
    is_fused_b[fused_send[fused_send >= 0]] = True
    send_tasks = np.flatnonzero(~is_fused_b)
    cp = _local_copies(t, bm.a2a)
    cols, key = _primitive_table(t, bm, cp, fused_send, task_channel, send_tasks)
    dep_prim, dep_on = _dependencies(t, es, ed, fused_send, send_tasks, bm.a2a, len(cp.rank))
    in_chunks, out_chunks, _ = buffer_sizes(h.collective, h.nranks, h.chunks_per_rank)
    phase = phase_keys(t.step, cols["task"], cols["task2"], key, dep_prim, dep_on)
    return LoweredProgram(
        collective=h.collective, nranks=h.nranks, nchunks=t.Cf, in_chunks=in_chunks,
        out_chunks=out_chunks, scratch_chunks=bm.scratch_chunks,
        npipelines=sched.nsubpipelines if T else (1 if len(cp.rank) else 0),
        cols=cols, key=key, dep_prim=dep_prim, dep_on=dep_on, nfused=int((fused_send >= 0).sum()),
        root=int(h.root), phase=phase)


class _Tasks:
    """The transfers being lowered, as int64 arrays, with their schedule: ``pipe`` (each task's
    sub-pipeline), ``pos`` (its position in the order) and ``key_t`` (the order within a
    sub-pipeline, the tie-breaker of every key)."""

    def __init__(self, alg: Algorithm, pipe: np.ndarray, pos: np.ndarray):
        h = alg.header
        self.alg, self.spec, self.root = alg, h.collective.spec, h.root
        self.N, self.C, self.T = h.nranks, h.nchunks, alg.ntransfers
        self.src, self.dst = alg.src.astype(np.int64), alg.dst.astype(np.int64)
        self.chunk, self.step = alg.chunk.astype(np.int64), alg.step.astype(np.int64)
        self.rrc = alg.op == RRC
        self.pipe, self.pos = pipe, pos
        self.key_t = pipe * (self.T + 1) + pos + 1
        self.Cf = self.spec.full_chunks(self.N, self.C)   # the full buffer's chunks
        self.tasks = np.arange(self.T, dtype=np.int64)
        self.first_write = np.full(self.N * self.C, NO_STEP, dtype=np.int64)
        np.minimum.at(self.first_write, self.dst * self.C + self.chunk, self.step)

    def input_offset(self, rank, ch, tasks, verb):
        """The input slots of (rank, chunk) pairs the tasks read before any write; a rank that
        does not start with its chunk is a located error."""
        spec, alg = self.spec, self.alg
        bad = ~spec.holds(spec.start, rank, ch, self.N, self.Cf, self.root)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            i = int(tasks[j])
            raise CompileError([Diagnostic(
                f"rank {int(rank[j])} {verb} chunk {int(ch[j])} before holding it at step "
                f"{int(self.step[i])} {alg.describe(i)}".rstrip(), alg.location_of(i))])
        return spec.slot("input", rank, ch, self.N, self.Cf)


@dataclass
class _BufferMap:
    """Where each task's send reads (``s_*``), its receive writes (``w_*``) and an rrc reads the
    value it reduces into (``r_src_*``); ``a2a``: the AllToAll mapping, where the spec has one."""
    s_buf: np.ndarray
    s_off: np.ndarray
    w_buf: np.ndarray
    w_off: np.ndarray
    r_src_buf: np.ndarray
    r_src_off: np.ndarray
    scratch_chunks: int
    a2a: "_AlltoallMapping | None"


def _buffer_map(t: _Tasks) -> _BufferMap:
    """Each task's buffer locations (the module docstring)."""
    h = t.alg.header
    _, _, scratch_chunks = buffer_sizes(h.collective, t.N, h.chunks_per_rank)
    r_src_buf = np.full(t.T, Buf.NONE, np.int8)
    r_src_off = np.zeros(t.T, np.int64)
    if t.spec.crossed_overlay:
        # a different mapping, not a special case: in place an arrival overwrites another id's
        # input slot, which the general one below never has to order (its overlays keep each id
        # in one slot); the mapping reads the ids and slots from the spec
        a2a = _alltoall_mapping(t.alg, t.key_t, t.first_write)
        return _BufferMap(a2a.s_buf, a2a.s_off, a2a.w_buf, a2a.w_off, r_src_buf, r_src_off,
                          a2a.scratch_chunks, a2a)
    coll, src, dst, chunk, step, C = h.collective, t.src, t.dst, t.chunk, t.step, t.C
    # send side: read (src, c)
    s_from_input = step < t.first_write[src * C + chunk]
    s_buf, s_off = _write_location(coll, src, chunk, t.N, t.Cf, t.root)
    if s_from_input.any():
        idx = np.flatnonzero(s_from_input)
        s_buf[idx] = Buf.INPUT
        s_off[idx] = t.input_offset(src[idx], chunk[idx], idx, "sends")
    # receive side: write (dst, c); rrc also reads the old value (from input if this is the first write)
    w_buf, w_off = _write_location(coll, dst, chunk, t.N, t.Cf, t.root)
    if t.rrc.any():
        idx = np.flatnonzero(t.rrc)
        first = step[idx] <= t.first_write[dst * C + chunk][idx]
        r_src_buf[idx] = np.where(first, np.int8(Buf.INPUT), w_buf[idx])
        r_src_off[idx] = w_off[idx]
        fi = idx[first]
        if len(fi):
            r_src_off[fi] = t.input_offset(dst[fi], chunk[fi], fi, "reduces into")
    return _BufferMap(s_buf, s_off, w_buf, w_off, r_src_buf, r_src_off, scratch_chunks, None)


def _fuse(t: _Tasks, es: np.ndarray, ed: np.ndarray, forbid) -> tuple[np.ndarray, np.ndarray]:
    """Which task's send rides on which task's receive (``fused_send[a] = b``: b's send is fused
    into a's receive; -1: none), and the tasks' channels: at most one send per receive, no pair in
    ``forbid``, no rank revisited, and pairs that would invert a FIFO's order refused until none
    does."""
    T, src, dst = t.T, t.src, t.dst
    fused_send = np.full(T, -1, dtype=np.int64)
    task_channel = t.alg.channels.copy()
    cand = dst[es] == src[ed]
    ca, cb = es[cand], ed[cand]
    if forbid:
        fb_ = np.array(sorted(x * T + y for x, y in forbid), dtype=np.int64)
        keep = ~np.isin(ca * T + cb, fb_)
        ca, cb = ca[keep], cb[keep]
    # one send per receive: the first b in insertion order
    o = lexsort((t.pos[cb], ca))
    ca, cb = ca[o], cb[o]
    refused = np.zeros(len(ca), dtype=bool)
    while len(ca):
        fused_send[:] = -1
        a, b = ca[~refused], cb[~refused]
        firsts = np.r_[True, a[1:] != a[:-1]] if len(a) else np.zeros(0, bool)
        # b has a single writer-predecessor on its sending rank, so it is chosen at most once
        fused_send[a[firsts]] = b[firsts]
        _cut_rank_revisits(fused_send, src, dst)
        is_fused_b = np.zeros(T, dtype=bool)
        is_fused_b[fused_send[fused_send >= 0]] = True
        task_channel = fused_channels(fused_send, is_fused_b, src, dst, t.key_t, t.N)
        rkey, skey = _task_keys(t.key_t, fused_send, t.pipe, t.pos, T)
        bad = _fifo_inversions(fused_send, task_channel, src, dst, rkey, skey, t.N)
        if not len(bad):
            break
        refused |= np.isin(ca * T + cb, bad[:, 0] * T + bad[:, 1])
    return fused_send, task_channel


@dataclass
class _Copies:
    """The local copies of a program: per copy its rank, source and destination slots, source
    buffer, key, sub-pipeline and chunk count."""
    rank: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sbuf: np.ndarray
    key: np.ndarray
    pipe: np.ndarray
    cnt: np.ndarray


def _local_copies(t: _Tasks, a2a) -> _Copies:
    """Copies of the output chunks that are never written (from the input), then an in-place
    AllToAll's copies of the blocks that arrived in scratch; each rank's copies of consecutive
    slots into consecutive slots become one copy of that many chunks."""
    cr, cc = _missing_output_chunks(t.alg, t.first_write)
    nK = len(cr)
    copy_src = t.spec.slot("input", cr, cc, t.N, t.Cf)
    copy_dst = t.spec.slot("output", cr, cc, t.N, t.Cf)
    copy_sbuf = np.full(nK, Buf.INPUT, np.int8)
    copy_key = np.zeros(nK, np.int64)
    copy_pipe = np.zeros(nK, np.int64)
    if a2a is not None:
        # after the copies of the chunks never written (an AllToAll rank's own block, placed by
        # the spec's slots above), the blocks that arrived in scratch because their output slot
        # was still to be sent (in place)
        nA = len(a2a.copy_rank)
        cr = np.concatenate([cr, a2a.copy_rank])
        copy_src = np.concatenate([copy_src, a2a.copy_src])
        copy_dst = np.concatenate([copy_dst, a2a.copy_dst])
        copy_sbuf = np.concatenate([copy_sbuf, np.full(nA, Buf.SCRATCH, np.int8)])
        last_key = int(t.key_t.max()) + 1 if t.T else 1
        copy_key = np.concatenate([copy_key, last_key + np.arange(nA, dtype=np.int64)])
        last_pipe = int(t.pipe.max()) if t.T else 0
        copy_pipe = np.concatenate([copy_pipe, np.full(nA, last_pipe, np.int64)])
        nK += nA
    # each rank's copies of consecutive slots into consecutive slots: one primitive of that many
    # chunks (a unit per micro-batch for them all, not one per chunk: a tree AllGather's rank
    # copies its K own chunks on one thread block, whose sends waited behind K units per micro-batch)
    plain = nK if a2a is None else nK - len(a2a.copy_rank)     # the a2a copies after them carry deps
    copy_cnt = np.ones(nK, np.int64)
    if plain > 1:
        keep, cnt = _copy_runs(cr[:plain], copy_src[:plain], copy_dst[:plain])
        keep = np.r_[keep, np.arange(plain, nK)]
        copy_cnt = np.r_[cnt, np.ones(nK - plain, np.int64)]
        cr, copy_src, copy_dst = cr[keep], copy_src[keep], copy_dst[keep]
        copy_sbuf, copy_key, copy_pipe = copy_sbuf[keep], copy_key[keep], copy_pipe[keep]
    return _Copies(cr, copy_src, copy_dst, copy_sbuf, copy_key, copy_pipe, copy_cnt)


def _primitive_table(t: _Tasks, bm: _BufferMap, cp: _Copies, fused_send, task_channel,
                     send_tasks) -> tuple[dict, np.ndarray]:
    """The primitives' columns and keys: the unfused sends, then one receive per task (fused with
    the send that rides on it), then the copies."""
    T, src, dst, rrc = t.T, t.src, t.dst, t.rrc
    nS, nR, nK = len(send_tasks), T, len(cp.rank)
    fa = fused_send >= 0
    recv_op = np.where(rrc, Op.RECV_REDUCE_COPY, Op.RECV).astype(np.int8)
    recv_op[fa & rrc] = Op.RECV_REDUCE_COPY_SEND
    recv_op[fa & ~rrc] = Op.RECV_COPY_SEND
    fb = np.maximum(fused_send, 0)
    cols = {
        "rank": np.concatenate([src[send_tasks], dst, cp.rank]),
        "pipeline": np.concatenate([t.pipe[send_tasks], t.pipe, cp.pipe]),
        "op": np.concatenate([np.full(nS, Op.SEND, np.int8), recv_op, np.full(nK, Op.COPY, np.int8)]),
        "send_peer": np.concatenate([dst[send_tasks], np.where(fa, dst[fb], -1), np.full(nK, -1)]),
        "recv_peer": np.concatenate([np.full(nS, -1), src, np.full(nK, -1)]),
        "channel": np.concatenate([task_channel[send_tasks], task_channel, np.zeros(nK, np.int64)]),
        "src_buf": np.concatenate([bm.s_buf[send_tasks], bm.r_src_buf, cp.sbuf]),
        "src_off": np.concatenate([bm.s_off[send_tasks], bm.r_src_off, cp.src]),
        "dst_buf": np.concatenate([np.full(nS, Buf.NONE, np.int8), bm.w_buf,
                                   np.full(nK, Buf.OUTPUT, np.int8)]),
        "dst_off": np.concatenate([np.zeros(nS, np.int64), bm.w_off, cp.dst]),
        "count": np.r_[np.ones(nS + nR, np.int64), cp.cnt],
        "task": np.concatenate([send_tasks, t.tasks, np.full(nK, -1)]),
        "task2": np.concatenate([np.full(nS, -1), fused_send, np.full(nK, -1)]),
    }
    rkey, skey = _task_keys(t.key_t, fused_send, t.pipe, t.pos, T)
    key = np.concatenate([skey[send_tasks], rkey, _widen_keys(cp.key, T)])
    return cols, key


def _dependencies(t: _Tasks, es, ed, fused_send, send_tasks, a2a, ncopies: int):
    """The primitives' dependencies ``(dep_prim, dep_on)`` from the DAG's edges (RAW, WAW, WAR on
    the ranks they share) and, in place, an AllToAll's overwrites."""
    src, dst, T = t.src, t.dst, t.T
    nS = len(send_tasks)
    fa = fused_send >= 0
    send_prim = np.empty(T, dtype=np.int64)
    send_prim[send_tasks] = np.arange(nS)
    recv_prim = nS + t.tasks
    send_prim[fused_send[fa]] = recv_prim[np.flatnonzero(fa)]
    dp, do = [], []
    if len(es):
        # u wrote rank dst[u]: RAW (b reads it) or WAW (b writes it)
        m = dst[es] == src[ed]
        dp.append(send_prim[ed[m]]); do.append(recv_prim[es[m]])
        m = dst[es] == dst[ed]
        dp.append(recv_prim[ed[m]]); do.append(recv_prim[es[m]])
        # u read rank src[u] and b overwrites it: WAR
        m = src[es] == dst[ed]
        dp.append(recv_prim[ed[m]]); do.append(send_prim[es[m]])
    if a2a is not None:
        # in-place AllToAll: a block's arrival overwrites the input slot of the block going the
        # other way, so it waits until that block has been sent (every key grows along these)
        dp.append(recv_prim[a2a.dep_write]); do.append(send_prim[a2a.dep_read])
        copy_base = nS + T + (ncopies - len(a2a.copy_rank))
        dp.append(copy_base + a2a.cdep_copy); do.append(np.where(
            a2a.cdep_is_write, recv_prim[a2a.cdep_task], send_prim[a2a.cdep_task]))
    dep_prim = np.concatenate(dp) if dp else np.zeros(0, np.int64)
    dep_on = np.concatenate(do) if do else np.zeros(0, np.int64)
    keep = dep_prim != dep_on
    return dep_prim[keep], dep_on[keep]


@dataclass
class _AlltoallMapping:
    """Where an AllToAll program's accesses go (see :func:`_alltoall_mapping`)."""

    s_buf: np.ndarray          # per task: where the send reads
    s_off: np.ndarray
    w_buf: np.ndarray          # per task: where the receive writes
    w_off: np.ndarray
    scratch_chunks: int
    dep_write: np.ndarray      # task pairs: the receive of dep_write waits for the send of dep_read
    dep_read: np.ndarray
    copy_rank: np.ndarray      # final scratch -> output copies
    copy_src: np.ndarray       # scratch slot
    copy_dst: np.ndarray       # output slot
    cdep_copy: np.ndarray      # copy index waits for task cdep_task's receive (cdep_is_write) or send
    cdep_task: np.ndarray
    cdep_is_write: np.ndarray


def _alltoall_mapping(alg: Algorithm, key_t: np.ndarray, first_write: np.ndarray) -> _AlltoallMapping:
    """Buffer mapping of an AllToAll (``N`` ranks, ``K`` chunks per block, chunk
    ``c = (i*N + j)*K + k``).

    Rank ``r`` reads chunk ``c`` from ``input[j*K + k]`` until it is first written there (only
    the source ``i == r`` holds it from the start); writes go to ``output[i*K + k]`` on the
    destination ``j == r`` and to scratch elsewhere. Scratch is dense per rank: the ``d``-th block
    a rank keeps there uses slots ``d*K .. d*K + K-1`` (slot ``s`` has the size of piece ``s % K``,
    the size every piece ``k`` has).

    In place, ``output[i*K + k]`` of rank ``r`` is ``input[i*K + k]``, which holds the block ``r``
    sends to ``i``. A block arriving there must not land before that one has left. When every
    write of the arriving block comes after (in order key) every send of the leaving one, each
    such write waits for those sends (a dependency along growing keys). Otherwise the arriving
    block lands in scratch instead and one local copy at the very end (after the sends and the
    writes) moves it to the output; out of place that copy costs one extra pass over the block.
    """
    t = _a2a_transfers(alg)
    in_slot, from_input = _a2a_sends_from_input(t, alg, first_write)
    read_idx = np.flatnonzero(from_input)
    read_loc = t.src[read_idx] * t.C + t.chunk[read_idx]
    loc_w, arriving, alias, redirect_loc = _a2a_inplace_hazards(t, key_t, read_idx, read_loc)
    loc = _a2a_write_locations(t, loc_w, redirect_loc)
    w_buf, w_off = loc.where(loc_w)
    s_buf = np.full(t.T, Buf.INPUT, np.int8)
    s_off = in_slot.copy()
    later = ~from_input
    if later.any():
        s_buf[later], s_off[later] = loc.where(t.src[later] * t.C + t.chunk[later])

    # waits of direct arrivals on the sends of their aliased blocks
    direct = arriving & ~redirect_loc[loc_w]
    dw, dr = _pairs_by_key(np.flatnonzero(direct), alias[direct], read_idx, read_loc)
    # final copies of redirected arrivals, after their writes and the aliased sends
    N, C, Cf, spec = t.N, t.C, t.Cf, t.spec
    red_l = loc.wl[loc.to_scratch & redirect_loc[loc.wl]]
    copy_rank, copy_chunk = red_l // C, red_l % C
    c_buf, c_off = loc.where(red_l)
    copy_dst = spec.slot("output", copy_rank, copy_chunk, N, Cf)
    c_alias = copy_rank * C + spec.id_at("input", copy_rank, copy_dst, N, Cf)
    cw, tw = _pairs_by_key(np.arange(len(red_l)), red_l, np.arange(t.T), loc_w)
    cr, tr = _pairs_by_key(np.arange(len(red_l)), c_alias, read_idx, read_loc)
    return _AlltoallMapping(
        s_buf=s_buf, s_off=s_off, w_buf=w_buf, w_off=w_off, scratch_chunks=loc.scratch_chunks,
        dep_write=dw, dep_read=dr, copy_rank=copy_rank, copy_src=c_off,
        copy_dst=copy_dst,
        cdep_copy=np.concatenate([cw, cr]), cdep_task=np.concatenate([tw, tr]),
        cdep_is_write=np.r_[np.ones(len(cw), bool), np.zeros(len(cr), bool)])


@dataclass
class _A2ATransfers:
    """An AllToAll program's shape (``N`` ranks, ``K`` chunks per block, ``C`` chunk ids of which
    the collective's full buffers hold ``Cf``) and its transfers as int64 columns."""

    N: int
    K: int
    C: int
    Cf: int
    spec: object
    T: int
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    step: np.ndarray
    root: int = 0           # the spec's rank parameter: SendRecv's shift


def _a2a_transfers(alg: Algorithm) -> _A2ATransfers:
    """The program's transfers (a reduction is refused, located: an AllToAll moves blocks only)."""
    h = alg.header
    N, K, C = h.nranks, h.chunks_per_rank, h.nchunks
    spec = h.collective.spec
    t = _A2ATransfers(N, K, C, spec.full_chunks(N, C), spec, alg.ntransfers, alg.src.astype(np.int64),
                      alg.dst.astype(np.int64), alg.chunk.astype(np.int64), alg.step.astype(np.int64), h.root)
    if (alg.op == RRC).any():
        i = int(np.flatnonzero(alg.op == RRC)[0])
        raise CompileError([Diagnostic(f"reduction (rrc) in an Alltoall {alg.describe(i)}".rstrip(),
                                       alg.location_of(i))])
    return t


def _a2a_sends_from_input(t: _A2ATransfers, alg: Algorithm, first_write: np.ndarray):
    """(input slot of each transfer's chunk on its source, whether the send reads it there: before
    the chunk is first written on that rank); a send of a chunk its rank never held is refused."""
    spec, N, C, Cf = t.spec, t.N, t.C, t.Cf
    in_slot = spec.slot("input", t.src, t.chunk, N, Cf)
    from_input = t.step < first_write[t.src * C + t.chunk]
    bad = from_input & ~spec.holds(spec.start, t.src, t.chunk, N, Cf, t.root)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CompileError([Diagnostic(
            f"rank {int(t.src[i])} sends chunk {int(t.chunk[i])} before holding it at step "
            f"{int(t.step[i])} {alg.describe(i)}".rstrip(), alg.location_of(i))])
    return in_slot, from_input


def _a2a_inplace_hazards(t: _A2ATransfers, key_t: np.ndarray, read_idx: np.ndarray, read_loc: np.ndarray):
    """In-place hazards, per (rank, arriving chunk) location against the latest send of the chunk
    its output slot overlays: ``(loc_w, arriving, alias, redirect_loc)``, each transfer's write
    location, whether it delivers a chunk to its final owner, the (rank, chunk) location it aliases
    in the input, and the write locations that must land in scratch instead."""
    spec, N, C, Cf = t.spec, t.N, t.C, t.Cf
    loc_w = t.dst * C + t.chunk
    max_read = np.full(N * C, -1, np.int64)
    np.maximum.at(max_read, read_loc, key_t[read_idx])
    min_write = np.full(N * C, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(min_write, loc_w, key_t)
    arriving = spec.holds(spec.end, t.dst, t.chunk, N, Cf, t.root) & ~spec.holds(spec.start, t.dst, t.chunk, N, Cf, t.root)
    # (rank, the id in its input slot that the arriving id's output slot overlays: the chunk it
    # sends to the arriving one's source)
    alias = t.dst * C + spec.id_at("input", t.dst, spec.slot("output", t.dst, t.chunk, N, Cf), N, Cf)
    redirect_loc = np.zeros(N * C, bool)
    hazard = arriving & (min_write[loc_w] <= max_read[alias])
    redirect_loc[loc_w[hazard]] = True
    return loc_w, arriving, alias, redirect_loc


@dataclass
class _A2AWriteLocations:
    """Where each written (rank, chunk) location ``wl`` (sorted) lives: output or dense scratch."""

    wl: np.ndarray
    to_scratch: np.ndarray
    loc_buf: np.ndarray
    loc_off: np.ndarray
    scratch_chunks: int

    def where(self, loc):
        """(buffer, offset) of the written locations ``loc``."""
        j = np.searchsorted(self.wl, loc)
        return self.loc_buf[j], self.loc_off[j]


def _a2a_write_locations(t: _A2ATransfers, loc_w: np.ndarray, redirect_loc: np.ndarray) -> _A2AWriteLocations:
    """The write location of every written (rank, chunk): the output where the rank keeps the chunk
    and it is not redirected, else dense scratch blocks per rank (block ``c // K`` of the
    ``C // K`` blocks of K pieces)."""
    spec, N, K, C, Cf = t.spec, t.N, t.K, t.C, t.Cf
    wl = unique(loc_w)
    wr, wc = wl // C, wl % C
    w_piece = spec.block_of(wc, N, Cf)[2]
    to_scratch = ~spec.holds(spec.end, wr, wc, N, Cf, t.root) | redirect_loc[wl]
    nb = C // K
    sb = wr[to_scratch] * nb + wc[to_scratch] // K
    ub = unique(sb)
    first_of_rank = np.searchsorted(ub // nb, np.arange(N))
    dense = np.searchsorted(ub, sb) - first_of_rank[sb // nb]
    loc_buf = np.full(len(wl), Buf.OUTPUT, np.int8)
    loc_off = spec.slot("output", wr, wc, N, Cf)
    loc_buf[to_scratch] = Buf.SCRATCH
    loc_off[to_scratch] = dense * K + w_piece[to_scratch]
    per_rank = np.bincount(ub // nb, minlength=N) if len(ub) else np.zeros(N, np.int64)
    scratch_chunks = int(per_rank.max()) * K if len(ub) else 0
    return _A2AWriteLocations(wl, to_scratch, loc_buf, loc_off, scratch_chunks)


def _pairs_by_key(a_idx: np.ndarray, a_key: np.ndarray, b_idx: np.ndarray, b_key: np.ndarray):
    """All ``(a, b)`` with equal keys (an equi-join of two small lists), as two int64 arrays."""
    if not len(a_idx) or not len(b_idx):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = stable_argsort(b_key)
    bk, bi = b_key[o], b_idx[o]
    lo = np.searchsorted(bk, a_key, "left")
    hi = np.searchsorted(bk, a_key, "right")
    n = hi - lo
    a = np.repeat(a_idx, n)
    starts = np.repeat(lo - np.r_[0, np.cumsum(n)[:-1]], n)
    b = bi[np.arange(int(n.sum())) + starts]
    return a.astype(np.int64), b.astype(np.int64)


def fused_channels(fused_send: np.ndarray, is_fused_b: np.ndarray, src: np.ndarray, dst: np.ndarray,
                   key_t: np.ndarray, nranks: int) -> np.ndarray:
    """The logical channel of every task's connection: 0 for unfused traffic, ``>= 1`` for chains
    of fused tasks (see the module docstring, "Channels of fused traffic").

    A chain ``t0 -> t1 -> ... -> tk`` (``fused_send[t_i] == t_{i+1}``) has one channel ``c``: its
    fused primitive on rank ``dst[t_i]`` (``i < k``) receives on ``(src[t_i] -> dst[t_i], c)`` and
    sends on ``(dst[t_i] -> dst[t_{i+1}], c)``; the head's send and the tail's receive are plain
    primitives on channel ``c``. Chains take, in order of their head's order key, the lowest
    ``c >= 1`` where each of their connection ends is unused or used for the same purpose: fused
    primitives of the same pair (receive from ``p``, send to ``q``) on that rank, or plain ones.
    So an allocation unit (TB) of channel ``c >= 1`` holds the fused traffic of one connection
    pair, or plain traffic of one connection end, never channel 0's. Plain ends stay apart from
    fused ones: a chain's head send queued on the TB of the traffic it feeds would, in task-level
    execution (a primitive runs all micro-batches before the next), wait for its own chain's
    forwarding around a ring, which cannot start until the head send is done."""
    T = len(fused_send)
    channel = np.zeros(T, dtype=np.int64)
    heads = np.flatnonzero((fused_send >= 0) & ~is_fused_b)
    if not len(heads):
        return channel
    heads = heads[np.argsort(key_t[heads], kind="stable")]
    N = int(nranks)
    PLAIN = -1
    owner: dict[tuple[int, int], int] = {}      # (end, channel) -> purpose
    nxt = fused_send.tolist()
    s_l, d_l = src.tolist(), dst.tolist()
    for h in heads.tolist():
        chain = [h]
        while nxt[chain[-1]] >= 0:
            chain.append(nxt[chain[-1]])
        ends = [((s_l[h] * N + d_l[h]) * 2, PLAIN)]                      # head's send end
        for a, b in zip(chain[:-1], chain[1:]):
            r = d_l[a]
            purpose = s_l[a] * N + d_l[b]
            ends.append(((r * N + s_l[a]) * 2 + 1, purpose))
            ends.append(((r * N + d_l[b]) * 2, purpose))
        t = chain[-1]
        ends.append(((d_l[t] * N + s_l[t]) * 2 + 1, PLAIN))                # tail's receive end
        c = 1
        while any(owner.get((e, c), p) != p for e, p in ends):
            c += 1
        for e, p in ends:
            owner[(e, c)] = p
        channel[chain] = c
    return channel


def _widen_keys(k: np.ndarray, T: int) -> np.ndarray:
    """Order keys ``pipeline * (T + 1) + r`` re-packed as ``pipeline * (2T + 2) + r`` (monotone),
    which leaves room for the fused primitives after each sub-pipeline's unfused ones."""
    return (k // (T + 1)) * (2 * T + 2) + k % (T + 1)


def _task_keys(key_t: np.ndarray, fused_send: np.ndarray, pipe: np.ndarray, pos: np.ndarray,
               T: int) -> tuple[np.ndarray, np.ndarray]:
    """Order keys of every task's receiving and sending primitive (see "Order keys")."""
    wide = _widen_keys(key_t, T)
    fa = fused_send >= 0
    rkey = np.where(fa, pipe * (2 * T + 2) + T + 1 + pos + 1, wide)
    skey = wide.copy()
    skey[fused_send[fa]] = rkey[fa]
    return rkey, skey


def _fifo_inversions(fused_send: np.ndarray, channel: np.ndarray, src: np.ndarray, dst: np.ndarray,
                     rkey: np.ndarray, skey: np.ndarray, nranks: int) -> np.ndarray:
    """Fused pairs ``(a, b)`` whose primitives break the FIFO order of a connection and channel.

    Sends of one connection end run on one TB in order-key order, and so do its receives. The
    ``k``-th send must be the ``k``-th receive, so on every (connection, channel), sorted by send
    key, the receive keys must increase. Returns the fused pairs involved at each inversion (the
    pair whose send or whose receive is out of place), as an ``(n, 2)`` array."""
    T = len(fused_send)
    a_idx = np.flatnonzero(fused_send >= 0)
    prev = np.full(T, -1, dtype=np.int64)
    prev[fused_send[a_idx]] = a_idx
    nch = int(channel.max()) + 1 if T else 1
    grp = (src * nranks + dst) * nch + channel
    o = np.lexsort((rkey, skey, grp))
    g, rk = grp[o], rkey[o]
    inv = np.flatnonzero((g[1:] == g[:-1]) & (rk[1:] < rk[:-1]))
    tasks = np.unique(np.concatenate([o[inv], o[inv + 1]]))
    pairs = [np.stack([prev[tasks], tasks], axis=1)[prev[tasks] >= 0],
             np.stack([tasks, fused_send[tasks]], axis=1)[fused_send[tasks] >= 0]]
    return np.concatenate(pairs).astype(np.int64)


def _cut_rank_revisits(fused_send: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """Un-fuse so that no chain of fused tasks visits a rank twice (in place).

    A chain's primitives must all run at once; two of them on one rank would sit on one TB (or be
    ordered by a dependency) and wait for each other. Positions of a chain: 0 = the head's source
    rank, k + 1 = the destination of the task at depth k. For a repeated rank at positions
    ``p1 < p2`` the fusion into the task received at ``p2`` (its send sits at ``p2 - 1``) is cut (``p1 < p2 - 1`` always holds
    since no task sends to its own rank), which separates the two; repeat until no chain repeats.
    """
    while True:
        a_idx = np.flatnonzero(fused_send >= 0)
        if not len(a_idx):
            return
        b_idx = fused_send[a_idx]
        members = np.unique(np.concatenate([a_idx, b_idx]))
        prev_task = np.full(len(fused_send), -1, dtype=np.int64)
        prev_task[b_idx] = a_idx
        anc = np.where(prev_task[members] >= 0, prev_task[members], members)
        local = np.full(len(fused_send), -1, dtype=np.int64)
        local[members] = np.arange(len(members))
        anc_l = local[anc]
        depth = (prev_task[members] >= 0).astype(np.int64)
        while True:
            nanc = anc_l[anc_l]
            if np.array_equal(nanc, anc_l):
                break
            depth = depth + depth[anc_l]
            anc_l = nanc
        head = members[anc_l]
        is_head = depth == 0
        h = np.concatenate([head, members[is_head]])
        rk = np.concatenate([dst[members], src[members[is_head]]])
        ps = np.concatenate([depth + 1, np.zeros(int(is_head.sum()), np.int64)])
        tk = np.concatenate([members, np.full(int(is_head.sum()), -1, np.int64)])
        o = lexsort((ps, rk, h))
        h, rk, ps, tk = h[o], rk[o], ps[o], tk[o]
        dup = np.flatnonzero((h[1:] == h[:-1]) & (rk[1:] == rk[:-1])) + 1
        if not len(dup):
            return
        dh, dp, db = h[dup], ps[dup], tk[dup]
        o = lexsort((dp, dh))
        dh, db = dh[o], db[o]
        first = np.r_[True, dh[1:] != dh[:-1]]
        b = db[first]
        cut_a = prev_task[b]   # b is received at p2 and has depth p2 - 1 >= 1, so it has a predecessor
        fused_send[cut_a[cut_a >= 0]] = -1


def _copy_runs(rank: np.ndarray, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The copies (``rank``, source slot ``src``, destination slot ``dst``, one chunk each) as
    runs: the indices of the first copy of each run and the run's length, a run being copies of
    one rank from consecutive slots into consecutive slots (in the order of their source slots)."""
    o = lexsort((src, rank))
    r, s, d = rank[o], src[o], dst[o]
    start = np.r_[True, (r[1:] != r[:-1]) | (s[1:] != s[:-1] + 1) | (d[1:] != d[:-1] + 1)]
    first = np.flatnonzero(start)
    return o[first], np.diff(np.r_[first, len(o)]).astype(np.int64)


def _missing_output_chunks(alg: Algorithm, first_write: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, chunk) pairs the postcondition places in ``output`` but no transfer writes; each must
    be the rank's own data (its input holds it), which the verifier guarantees for valid programs."""
    from hccc.compiler.passes.verify import final_rows

    h = alg.header
    N, C = h.nranks, h.nchunks
    rows = final_rows(h.collective, N, C, h.root)
    rows = rows[first_write[rows] == NO_STEP]
    r, c = (rows // C).astype(np.int64), (rows % C).astype(np.int64)
    spec = h.collective.spec
    bad = np.flatnonzero(~spec.holds(spec.start, r, c, N, spec.full_chunks(N, C), h.root))
    if len(bad):
        raise CompileError([Diagnostic(
            f"rank {int(r[bad[0]])} never receives chunk {int(c[bad[0]])}", alg.header.location)])
    return r, c
