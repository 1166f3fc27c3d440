"""Hand-made ProgramIRs for the code-generation tests (ring AllGather / AllReduce, random IRs).

These are written directly as primitive columns so codegen can be tested without the lowering.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR, PRIM_COLUMNS

_COLS = list(PRIM_COLUMNS)


def ir_from_rows(name, collective, nranks, nchunks, in_chunks, out_chunks, scratch, rows,
                  deps=(), nwarps=16, chunk_bytes=1 << 16, npipelines=1):
    """rows: dicts with the PRIM_COLUMNS keys (missing -> default); deps: (prim, on) row indices."""
    defaults = dict(send_peer=-1, recv_peer=-1, channel=0, src_buf=0, src_off=0, dst_buf=0,
                    dst_off=0, count=1, task=-1, task2=-1, pipeline=0)
    prims = {k: np.array([r.get(k, defaults.get(k, 0)) for r in rows], dtype=dt)
             for k, dt in PRIM_COLUMNS.items()}
    ntbs = np.zeros(nranks, np.int32)
    for r in rows:
        ntbs[r["rank"]] = max(ntbs[r["rank"]], r["tb"] + 1)
    ir = ProgramIR(name=name, collective=collective, nranks=nranks, nchunks=nchunks,
                   in_chunks=in_chunks, out_chunks=out_chunks, scratch_chunks=scratch,
                   prims=prims,
                   dep_prim=np.array([d[0] for d in deps], np.int64),
                   dep_on=np.array([d[1] for d in deps], np.int64),
                   nwarps=nwarps, chunk_bytes=chunk_bytes, npipelines=npipelines, ntbs=ntbs,
                   stats={"transfers": 0, "subpipelines": npipelines})
    ir.sort_canonical()
    return ir


def stuck_ir(copies: bool = True):
    """Two ranks that each receive before they send: a deadlock the kernels must report (with
    ``copies``, each rank also copies its own chunk on a second TB)."""
    rows = []
    for r in range(2):
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.RECV, recv_peer=1 - r, dst_buf=Buf.OUTPUT,
                         dst_off=1 - r, task=1 - r))
        rows.append(dict(rank=r, tb=0, seq=1, op=Op.SEND, send_peer=1 - r, src_buf=Buf.INPUT,
                         src_off=0, task=r))
        if copies:
            rows.append(dict(rank=r, tb=1, seq=0, op=Op.COPY, src_buf=Buf.INPUT, src_off=0,
                             dst_buf=Buf.OUTPUT, dst_off=r))
    return ir_from_rows("stuck", "allgather", 2, 2, 1, 2, 0, rows)


def ring_allgather(n: int, name: str = "ring_ag") -> ProgramIR:
    """Out-of-place ring AllGather: TB 2 copies input -> output[r]; TB 0 sends output[r] once the
    copy is done, then forwards each chunk TB 1 received (cross-TB deps per micro-batch)."""
    rows, deps = [], []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        copy_i = len(rows)
        rows.append(dict(rank=r, tb=2, seq=0, op=Op.COPY, src_buf=Buf.INPUT, src_off=0,
                         dst_buf=Buf.OUTPUT, dst_off=r))
        recv_i = {}
        for k in range(1, n):
            recv_i[k] = len(rows)
            rows.append(dict(rank=r, tb=1, seq=k - 1, op=Op.RECV, recv_peer=prv,
                             dst_buf=Buf.OUTPUT, dst_off=(r - k) % n, pipeline=k,
                             task=(k - 1) * n + prv))
        deps.append((len(rows), copy_i))
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.SEND, send_peer=nxt, src_buf=Buf.OUTPUT,
                         src_off=r, task=r))
        for k in range(1, n - 1):
            deps.append((len(rows), recv_i[k]))
            rows.append(dict(rank=r, tb=0, seq=k, op=Op.SEND, send_peer=nxt, src_buf=Buf.OUTPUT,
                             src_off=(r - k) % n, pipeline=k, task=k * n + r))
    return ir_from_rows(name, "allgather", n, n, 1, n, 0, rows, deps, npipelines=n)


def ring_allgather_fused(n: int, name: str = "ring_agf") -> ProgramIR:
    """Ring AllGather on one TB per rank with recvCopySend (needs micro-batches < FIFO slots)."""
    rows = []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.SEND, send_peer=nxt, src_buf=Buf.INPUT,
                         src_off=0, task=r))
        rows.append(dict(rank=r, tb=1, seq=0, op=Op.COPY, src_buf=Buf.INPUT, src_off=0,
                         dst_buf=Buf.OUTPUT, dst_off=r))
        for k in range(1, n):
            op = Op.RECV_COPY_SEND if k < n - 1 else Op.RECV
            rows.append(dict(rank=r, tb=0, seq=k, op=op, recv_peer=prv,
                             send_peer=nxt if op == Op.RECV_COPY_SEND else -1,
                             dst_buf=Buf.OUTPUT, dst_off=(r - k) % n, pipeline=k,
                             task=(k - 1) * n + prv, task2=k * n + r if op == Op.RECV_COPY_SEND else -1))
    return ir_from_rows(name, "allgather", n, n, 1, n, 0, rows, npipelines=n)


def ring_allreduce(n: int, name: str = "ring_ar") -> ProgramIR:
    """Ring AllReduce with a send TB and a receive TB per rank, linked by cross-TB deps (ResCCL's
    task-level form: deadlock-free for any number of micro-batches). The i-th message on a
    connection is task ``i * n + sender`` at both ends."""
    rows, deps = [], []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        recv_rows = []
        for k in range(1, n):                       # ReduceScatter receives
            c = (r - k - 1) % n
            recv_rows.append(dict(op=Op.RECV_REDUCE_COPY, recv_peer=prv, src_buf=Buf.INPUT,
                                  src_off=c, dst_buf=Buf.OUTPUT, dst_off=c, task=(k - 1) * n + prv))
        for j in range(1, n):                       # AllGather receives
            c = (r - j) % n
            recv_rows.append(dict(op=Op.RECV, recv_peer=prv, dst_buf=Buf.OUTPUT, dst_off=c,
                                  task=(n - 2 + j) * n + prv))
        base = len(rows)
        for i, row in enumerate(recv_rows):
            rows.append(dict(rank=r, tb=1, seq=i, pipeline=i + 1, **row))
        send_rows = [(dict(op=Op.SEND, send_peer=nxt, src_buf=Buf.INPUT, src_off=(r - 1) % n,
                           task=r), None)]
        for k in range(1, n):                       # forward what was just reduced
            c = (r - k - 1) % n
            send_rows.append((dict(op=Op.SEND, send_peer=nxt, src_buf=Buf.OUTPUT, src_off=c,
                                   task=k * n + r), base + k - 1))
        for j in range(1, n - 1):                   # forward gathered chunks
            c = (r - j) % n
            send_rows.append((dict(op=Op.SEND, send_peer=nxt, src_buf=Buf.OUTPUT, src_off=c,
                                   task=(n - 1 + j) * n + r), base + n - 2 + j))
        for i, (row, dep) in enumerate(send_rows):
            if dep is not None:
                deps.append((len(rows), dep))
            rows.append(dict(rank=r, tb=0, seq=i, pipeline=i, **row))
    return ir_from_rows(name, "allreduce", n, n, n, n, 0, rows, deps, npipelines=2 * n - 1)


def ring_allreduce_fused(n: int, name: str = "ring_arf") -> ProgramIR:
    """Ring AllReduce on one TB per rank with fused primitives. Under task-level execution this
    needs FIFO depth >= micro-batches (it deadlocks beyond): compile tests, and small runs."""
    rows = []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        seq = 0

        def add(**kw):
            nonlocal seq
            kw.setdefault("pipeline", seq)
            rows.append(dict(rank=r, tb=0, seq=seq, **kw))
            seq += 1

        add(op=Op.SEND, send_peer=nxt, src_buf=Buf.INPUT, src_off=(r - 1) % n, task=r)
        for k in range(1, n - 1):
            c = (r - k - 1) % n
            add(op=Op.RECV_REDUCE_SEND, send_peer=nxt, recv_peer=prv, src_buf=Buf.INPUT,
                src_off=c, task=prv, task2=r)
        add(op=Op.RECV_REDUCE_COPY_SEND, send_peer=nxt, recv_peer=prv, src_buf=Buf.INPUT,
            src_off=r, dst_buf=Buf.OUTPUT, dst_off=r, task=prv, task2=r)
        for k in range(1, n - 1):
            c = (r - k) % n
            add(op=Op.RECV_COPY_SEND, send_peer=nxt, recv_peer=prv, dst_buf=Buf.OUTPUT,
                dst_off=c, task=prv, task2=r)
        add(op=Op.RECV, recv_peer=prv, dst_buf=Buf.OUTPUT, dst_off=(r + 1) % n, task=prv)
    return ir_from_rows(name, "allreduce", n, n, n, n, 0, rows, npipelines=2 * n - 1)


def random_ir(rng: np.random.Generator, name: str = "rand") -> ProgramIR:
    """A structurally valid random IR (matched FIFO connections, single-TB connection ends,
    cross-TB deps on the same rank, scratch use, multi-chunk primitives). Not necessarily
    deadlock-free: it is for code-generation tests only."""
    nranks = int(rng.integers(1, 5))
    nchunks = nranks * int(rng.integers(1, 3))
    scratch = int(rng.integers(0, 3))
    ntb = [int(rng.integers(1, 4)) for _ in range(nranks)]
    tb_lists: dict[tuple[int, int], list[dict]] = {(r, t): [] for r in range(nranks) for t in range(ntb[r])}
    # connections: (s, d, ch) -> (sender tb, receiver tb)
    conns = {}
    for _ in range(int(rng.integers(0, 6))):
        if nranks < 2:
            break
        s, d = (int(x) for x in rng.choice(nranks, 2, replace=False))
        ch = int(rng.integers(0, 2))
        if (s, d, ch) not in conns:
            conns[(s, d, ch)] = (int(rng.integers(0, ntb[s])), int(rng.integers(0, ntb[d])))
    bufs = [(Buf.INPUT, nchunks), (Buf.OUTPUT, nchunks)] + ([(Buf.SCRATCH, scratch)] if scratch else [])

    def loc(cnt, c):
        """A place for chunks c .. c+cnt-1 of the full buffer: their own slots of input or output,
        or scratch slots c .. (every slot keeps one chunk size, as hccc.compiler.ir.extents needs)."""
        b, size = bufs[int(rng.integers(0, len(bufs)))]
        if size < c + cnt:
            b, size = Buf.OUTPUT, nchunks
        return int(b), c

    task = 0
    for _ in range(int(rng.integers(1, 12))):
        kind = int(rng.integers(0, 3))
        cnt = int(rng.integers(1, min(2, nchunks) + 1))
        c = int(rng.integers(0, nchunks - cnt + 1))      # the chunk(s) this transfer moves
        if kind == 0 and conns:
            keys = sorted(conns)
            s, d, ch = keys[int(rng.integers(0, len(keys)))]
            stb, dtb = conns[(s, d, ch)]
            sb, so = loc(cnt, c)
            tb_lists[(s, stb)].append(dict(op=Op.SEND, send_peer=d, channel=ch, src_buf=sb,
                                           src_off=so, count=cnt, task=task))
            # receiver: plain or reducing receive; may forward when it owns a matching send end
            fwd = [k for k in keys if k[0] == d and conns[k][0] == dtb and k[2] == ch]
            ops = [Op.RECV, Op.RECV_REDUCE_COPY]
            if fwd:
                ops += [Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND]
            op = ops[int(rng.integers(0, len(ops)))]
            row = dict(op=op, recv_peer=s, channel=ch, count=cnt, task=task)
            if op.writes_dst:
                row["dst_buf"], row["dst_off"] = loc(cnt, c)
            if op.reads_src:
                row["src_buf"], row["src_off"] = loc(cnt, c)
            if op.sends:
                tgt = fwd[int(rng.integers(0, len(fwd)))]
                row["send_peer"] = tgt[1]
                row["task2"] = task + 1
                # the forwarded message must be received at tgt[1]
                fb, fo = loc(cnt, c)
                tb_lists[(tgt[1], conns[tgt][1])].append(dict(
                    op=Op.RECV, recv_peer=d, channel=ch, count=cnt, task=task + 1,
                    dst_buf=fb, dst_off=fo))
            tb_lists[(d, dtb)].append(row)
            task += 2
        else:
            r = int(rng.integers(0, nranks))
            t = int(rng.integers(0, ntb[r]))
            op = [Op.COPY, Op.REDUCE, Op.NOP][int(rng.integers(0, 3))]
            row = dict(op=op, count=cnt)
            if op != Op.NOP:
                row["src_buf"], row["src_off"] = loc(cnt, c)
                row["dst_buf"], row["dst_off"] = loc(cnt, c)
            tb_lists[(r, t)].append(row)
    rows = []
    renum: dict[tuple[int, int], int] = {}
    for (r, t), lst in sorted(tb_lists.items()):
        if lst:   # TB ids stay dense: empty TBs are dropped
            renum[(r, t)] = sum(1 for (r2, _) in renum if r2 == r)
        for i, row in enumerate(lst):
            rows.append(dict(rank=r, tb=renum[(r, t)], seq=i, pipeline=i, **row))
    deps = []
    by_rank = {}
    for i, row in enumerate(rows):
        by_rank.setdefault(row["rank"], []).append(i)
    for r, idx in by_rank.items():
        for _ in range(int(rng.integers(0, 3))):
            a, b = (int(x) for x in rng.choice(idx, 2)) if len(idx) > 1 else (idx[0], idx[0])
            if rows[a]["tb"] != rows[b]["tb"]:
                deps.append((a, b))
    # chunk_bytes: at least 16 bytes per chunk of a 2-chunk step
    ir = ir_from_rows(name, ["allgather", "reducescatter", "allreduce"][int(rng.integers(0, 3))],
                       nranks, nchunks, nchunks, nchunks, scratch, rows, sorted(set(deps)),
                       nwarps=int(rng.integers(1, 40)), chunk_bytes=16 * int(rng.integers(2, 5000)),
                       npipelines=max((row["pipeline"] for row in rows), default=0) + 1)
    return ir
