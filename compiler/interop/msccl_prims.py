"""The primitives an MSCCL export works on, as columns, and the passes that prepare them.

One row per exported primitive (a ProgramIR primitive, or one half of an un-fused forwarding
primitive), every attribute a numpy column, and the waits between rows as an edge list
(:class:`Prims`). The passes here take and return that table:

- :func:`from_ir`: the program's primitives without NOPs (their waits moved to successors and
  dependents), with each send matched to its receive;
- :func:`allgather_sources`: AllGather sends of the rank's input chunk read the output copy of it
  instead (after the local copy), so a chunk keeps one buffer position along its whole path;
- :func:`end_components`: connection ends joined by forwarding primitives (one MSCCL thread block
  each);
- :func:`unfuse`: forwarding primitives whose receive and send ends cannot share an MSCCL thread
  block become a receive and a send.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.ir.connections import match_connections
from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR
from hccc.compiler.ir.sort_order import stable_argsort, unique, unique_first


def _op_table(prop: str) -> np.ndarray:
    return np.array([getattr(o, prop) for o in Op])


SENDS = _op_table("sends")
RECEIVES = _op_table("receives")
READS_SRC = _op_table("reads_src")
WRITES_DST = _op_table("writes_dst")
FORWARDS = np.array([o in (Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND) for o in Op])


def export_error(msgs: list[str]) -> CompileError:
    return CompileError([Diagnostic(m, None) for m in msgs])


@dataclass(slots=True)
class Prims:
    """Exported primitives, one row each, and their waits: row ``wait_a[j]`` waits for row
    ``wait_b[j]`` (no row waits for itself, no pair twice; see :func:`unique_waits`)."""

    rank: np.ndarray
    htb: np.ndarray       # hccc thread block
    pos: np.ndarray       # (float) position in the hccc thread block; an un-fused pair's halves .0 / .5
    op: np.ndarray        # Op
    sp: np.ndarray        # send peer or -1
    rp: np.ndarray        # recv peer or -1
    ch: np.ndarray
    sbuf: np.ndarray
    soff: np.ndarray
    dbuf: np.ndarray
    doff: np.ndarray
    cnt: np.ndarray
    peer_x: np.ndarray    # send half: the matched receiving row; receive half: the matched sending row
    peer_x2: np.ndarray   # forwarding primitive: the receiving row of its send; else -1
    key: np.ndarray       # (n, 4): (sub-pipeline, 0 send / 1 other, transfer, seq), an order of a rank's
                          # primitives that keeps every wait (transfers of one step are independent, so
                          # within a step sends may go first)
    wait_a: np.ndarray
    wait_b: np.ndarray

    def __len__(self) -> int:
        return len(self.rank)

    def copy(self) -> Prims:
        return Prims(*(getattr(self, f.name).copy() for f in fields(self)))


def unique_waits(a: np.ndarray, b: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Wait edges without self-waits and repeats, ordered by (waiter, waited-for)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    keep = a != b
    code = unique(a[keep] * max(n, 1) + b[keep])
    return code // max(n, 1), code % max(n, 1)


# ---------------------------------------------------------------------------------------------
def from_ir(ir: ProgramIR) -> Prims:
    """The program's primitives without NOPs (their waits moved to successors and dependents)."""
    P = ir.prims
    n = ir.nprims
    op = P["op"].astype(np.int64)
    a = np.asarray(ir.dep_prim, np.int64)
    b = np.asarray(ir.dep_on, np.int64)
    is_nop = op == int(Op.NOP)
    if is_nop.any():
        a, b = _waits_past_nops(P, a, b, is_nop)
        keep = np.flatnonzero(~is_nop)
        new_index = np.full(n, -1, np.int64)
        new_index[keep] = np.arange(len(keep))
        a, b = new_index[a], new_index[b]
    else:
        keep = np.arange(n)
        new_index = keep
    m = len(keep)

    def col(name: str) -> np.ndarray:
        return P[name][keep].astype(np.int64)

    rows = Prims(rank=col("rank"), htb=col("tb"), pos=P["seq"][keep].astype(np.float64), op=op[keep],
                 sp=col("send_peer"), rp=col("recv_peer"), ch=col("channel"), sbuf=col("src_buf"),
                 soff=col("src_off"), dbuf=col("dst_buf"), doff=col("dst_off"), cnt=col("count"),
                 peer_x=np.full(m, -1, np.int64), peer_x2=np.full(m, -1, np.int64),
                 key=np.stack([col("pipeline"), (op[keep] != int(Op.SEND)).astype(np.int64), col("task"),
                               col("seq")], axis=1),
                 wait_a=a, wait_b=b)
    rows.wait_a, rows.wait_b = unique_waits(a, b, m)
    s, r = match_connections(ir)
    s, r = new_index[np.asarray(s, np.int64)], new_index[np.asarray(r, np.int64)]
    fwd = RECEIVES[rows.op[s]]
    rows.peer_x2[s[fwd]] = r[fwd]
    rows.peer_x[s[~fwd]] = r[~fwd]
    rows.peer_x[r] = s
    return rows


def _waits_past_nops(P: dict, a: np.ndarray, b: np.ndarray, is_nop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Wait edges of the real primitives once NOPs are gone: a wait for a NOP becomes waits for
    the real primitives its completion stands for (its own waits and its thread-block predecessor,
    through chains of NOPs), and so does the successor of a NOP in its thread block."""
    rank, tb = P["rank"], P["tb"]
    nops = np.flatnonzero(is_nop)
    same_prev = np.zeros(len(is_nop), bool)
    same_prev[1:] = (rank[1:] == rank[:-1]) & (tb[1:] == tb[:-1])
    parts: dict[int, list[int]] = {int(j): ([int(j) - 1] if same_prev[j] else []) for j in nops}
    on_nop = is_nop[a]
    for x, y in zip(a[on_nop].tolist(), b[on_nop].tolist()):
        parts[x].append(y)
    nop = set(parts)
    eff: dict[int, set] = {}
    for j0 in nops.tolist():
        stack = [(j0, False)]
        while stack:
            j, done = stack.pop()
            if j in eff:
                continue
            pend = [d for d in parts[j] if d in nop and d not in eff]
            if pend and not done:
                stack.append((j, True))
                stack.extend((d, False) for d in pend)
                continue
            out: set = set()
            for d in parts[j]:
                out |= eff[d] if d in nop else {d}
            eff[j] = out
    real = ~is_nop[a]
    plain = real & ~is_nop[b]
    ea, eb = [a[plain]], [b[plain]]
    extra_a: list[int] = []
    extra_b: list[int] = []
    for x, y in zip(a[real & is_nop[b]].tolist(), b[real & is_nop[b]].tolist()):
        for t in eff[y]:
            extra_a.append(x)
            extra_b.append(t)
    after = nops + 1
    after = after[(after < len(is_nop))]
    after = after[same_prev[after] & ~is_nop[after]]
    for x in after.tolist():
        for t in eff[x - 1]:
            extra_a.append(x)
            extra_b.append(t)
    ea.append(np.array(extra_a, np.int64))
    eb.append(np.array(extra_b, np.int64))
    return np.concatenate(ea), np.concatenate(eb)


def allgather_sources(ir: ProgramIR, rows: Prims) -> Prims:
    """AllGather sends of an input chunk read the output copy of it (waiting for the local copy)
    where every write of the rank's own output part is that copy (any collective whose input is
    the rank's part of its output)."""
    if SPECS[ir.collective].alias != "input in output" or ir.in_chunks * ir.nranks != ir.nchunks:
        return rows
    k = ir.in_chunks
    op, rank = rows.op, rows.rank
    own_lo = rank * k
    copies = np.flatnonzero((op == int(Op.COPY)) & (rows.sbuf == int(Buf.INPUT)) & (rows.dbuf == int(Buf.OUTPUT))
                            & (rows.doff == own_lo + rows.soff))
    if not len(copies):
        return rows
    copy_of: dict[int, dict[int, int]] = defaultdict(dict)     # rank -> input chunk -> copying row
    for i, r, so, c in zip(copies.tolist(), rank[copies].tolist(), rows.soff[copies].tolist(),
                           rows.cnt[copies].tolist()):
        for j in range(c):
            copy_of[r][so + j] = i
    copying = {r: set(m.values()) for r, m in copy_of.items()}
    writers = np.flatnonzero(WRITES_DST[op] & (rows.dbuf == int(Buf.OUTPUT)) & (rows.doff < own_lo + k)
                             & (rows.doff + rows.cnt > own_lo))
    other = {r for i, r, o in zip(writers.tolist(), rank[writers].tolist(), op[writers].tolist())
             if o != int(Op.COPY) or i not in copying.get(r, ())}
    sends = np.flatnonzero((op == int(Op.SEND)) & (rows.sbuf == int(Buf.INPUT)))
    rows = rows.copy()
    wa, wb = [], []
    for i, r, so, c in zip(sends.tolist(), rank[sends].tolist(), rows.soff[sends].tolist(), rows.cnt[sends].tolist()):
        if r not in copy_of or r in other:
            continue
        cps = {copy_of[r].get(so + j, -1) for j in range(c)}
        if -1 in cps:
            continue
        if any(rows.htb[d] == rows.htb[i] and rows.pos[d] > rows.pos[i] for d in cps):
            continue            # the copy comes later in the sender's own thread block: keep the input
        rows.sbuf[i], rows.soff[i] = int(Buf.OUTPUT), r * k + so
        for d in cps:
            wa.append(i)
            wb.append(d)
    rows.wait_a, rows.wait_b = unique_waits(np.concatenate([rows.wait_a, np.array(wa, np.int64)]),
                                            np.concatenate([rows.wait_b, np.array(wb, np.int64)]), len(rows))
    return rows


# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Ends:
    """Connection ends (one per (rank, send or receive, peer, channel)) and their components:
    ends joined by forwarding primitives, which one MSCCL thread block must serve together."""

    send_end: np.ndarray    # per row: its send end, or -1
    recv_end: np.ndarray    # per row: its receive end, or -1
    comp: np.ndarray        # per end: component, numbered by first appearance (a row's send end first)
    sends: np.ndarray       # per end: whether it is a send end
    peer: np.ndarray        # per end: the peer rank
    ncomp: int

    def row_comp(self) -> np.ndarray:
        """Per row: the component of its send end, else of its receive end, else -1 (local)."""
        e = np.where(self.send_end >= 0, self.send_end, self.recv_end)
        if not len(self.comp):
            return e
        return np.where(e >= 0, self.comp[np.maximum(e, 0)], -1)


def end_components(rows: Prims) -> Ends:
    n = len(rows)
    has_s, has_r = rows.sp >= 0, rows.rp >= 0
    npeer = int(max(rows.rank.max(initial=0), rows.sp.max(initial=0), rows.rp.max(initial=0))) + 1
    nch = int(rows.ch.max(initial=0)) + 1
    code = np.stack([((rows.rank * 2) * npeer + rows.sp) * nch + rows.ch,
                     ((rows.rank * 2 + 1) * npeer + rows.rp) * nch + rows.ch], axis=1)
    code[~has_s, 0] = -1
    code[~has_r, 1] = -1
    flat = code.ravel()                               # a row's send end, then its receive end
    valid = np.flatnonzero(flat >= 0)
    uniq, first, inv = unique_first(flat[valid])
    rank_of = np.empty(len(first), np.int64)          # ends numbered by first appearance
    rank_of[stable_argsort(first)] = np.arange(len(first))
    end = np.full(2 * n, -1, np.int64)
    end[valid] = rank_of[inv]
    nend = len(uniq)
    by_id = np.empty(nend, np.int64)
    by_id[rank_of] = uniq
    sends = (by_id // nch // npeer) % 2 == 0
    peer = (by_id // nch) % npeer
    end = end.reshape(n, 2)
    both = has_s & has_r
    comp = np.arange(nend)
    if both.any():
        pairs = np.unique(end[both] @ np.array([nend, 1], np.int64))
        from networkx.utils import UnionFind   # imported here: networkx is slow to import
        uf = UnionFind()
        for p in pairs.tolist():
            uf.union(p // nend, p % nend)
        comp = np.array([uf[e] if e in uf.parents else e for e in range(nend)], np.int64)
    _, first_c, dense = unique_first(comp)
    order = np.empty(len(first_c), np.int64)          # components numbered by first appearance
    order[stable_argsort(first_c)] = np.arange(len(first_c))
    return Ends(send_end=end[:, 0], recv_end=end[:, 1], comp=order[dense], sends=sends, peer=peer,
                ncomp=len(first_c))


def _ends_per_comp(ends: Ends) -> tuple[np.ndarray, np.ndarray]:
    """Per component: how many send ends and how many receive ends it has."""
    ns = np.bincount(ends.comp[ends.sends], minlength=ends.ncomp)
    nr = np.bincount(ends.comp[~ends.sends], minlength=ends.ncomp)
    return ns, nr


def unfuse(rows: Prims) -> Prims:
    """Split forwarding primitives whose ends would need two MSCCL thread blocks.

    Forwarding primitives join a receive end and a send end into one MSCCL TB; where such joins
    would give one TB two send (or two receive) peers, all but the most frequent (recv peer, send
    peer) pair of the group are split into a receive (storing the chunk) and a send of it."""
    ends = end_components(rows)
    ns, nr = _ends_per_comp(ends)
    bad = (ns > 1) | (nr > 1)
    if not bad.any():
        return rows
    fwd = FORWARDS[rows.op]
    comp = np.where(fwd, ends.comp[np.maximum(ends.send_end, 0)], -1)
    in_bad = fwd & bad[np.maximum(comp, 0)]
    # in each bad group keep the forwarding primitives of its most used (recv peer, send peer) pair
    # fused and split the others; the group is then that one pair
    idx = np.flatnonzero(in_bad)
    pair_count: dict = defaultdict(int)
    for c, rp, sp in zip(comp[idx].tolist(), rows.rp[idx].tolist(), rows.sp[idx].tolist()):
        pair_count[(c, rp, sp)] += 1
    keep: dict = {}
    for (c, rp, sp), _ in sorted(pair_count.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][2])):
        keep.setdefault(c, (rp, sp))
    split = np.zeros(len(rows), bool)
    split[idx] = [keep[c] != (rp, sp) for c, rp, sp in zip(comp[idx].tolist(), rows.rp[idx].tolist(),
                                                              rows.sp[idx].tolist())]
    bad_rrs = np.flatnonzero(split & (rows.op == int(Op.RECV_REDUCE_SEND)))
    if len(bad_rrs):
        i = int(bad_rrs[0])
        raise export_error([f"cannot export: rank {rows.rank[i]} thread block {rows.htb[i]} step {int(rows.pos[i])} "
                            f"is a recv-reduce-send whose receive and send would need different MSCCL thread "
                            f"blocks, and un-fusing it needs a scratch chunk the program does not have"])
    n = len(rows)
    first = np.arange(n) + np.concatenate([[0], np.cumsum(split)[:-1]])
    last = first + split
    m = n + int(split.sum())
    out = Prims(*(np.empty((m,) + getattr(rows, f.name).shape[1:], getattr(rows, f.name).dtype)
                  for f in fields(Prims)))
    for f in fields(Prims):
        if f.name not in ("wait_a", "wait_b"):
            col = getattr(rows, f.name)
            getattr(out, f.name)[first] = col
            getattr(out, f.name)[last] = col
    s = np.flatnonzero(split)
    a, b = first[s], last[s]
    out.op[a] = np.where(rows.op[s] == int(Op.RECV_COPY_SEND), int(Op.RECV), int(Op.RECV_REDUCE_COPY))
    out.sp[a] = -1
    out.pos[b] = rows.pos[s] + 0.5
    out.op[b] = int(Op.SEND)
    out.rp[b] = -1
    out.sbuf[b], out.soff[b] = rows.dbuf[s], rows.doff[s]
    out.dbuf[b], out.doff[b] = int(Buf.NONE), 0
    # matching: the receive side of a row <- its sender; the send side -> its receiver
    out.peer_x[:] = -1
    out.peer_x2[:] = -1
    rcv_rows = np.flatnonzero(RECEIVES[rows.op])
    out.peer_x[first[rcv_rows]] = last[rows.peer_x[rcv_rows]]
    snd_rows = np.flatnonzero(SENDS[rows.op])
    rcv = np.where(RECEIVES[rows.op[snd_rows]], rows.peer_x2[snd_rows], rows.peer_x[snd_rows])
    t = last[snd_rows]
    still_fwd = RECEIVES[out.op[t]]
    out.peer_x2[t[still_fwd]] = first[rcv[still_fwd]]
    out.peer_x[t[~still_fwd]] = first[rcv[~still_fwd]]
    out.wait_a, out.wait_b = unique_waits(np.concatenate([first[rows.wait_a], b]),
                                          np.concatenate([last[rows.wait_b], a]), m)
    return out


__all__ = ["Prims", "Ends", "from_ir", "allgather_sources", "end_components", "unfuse", "unique_waits",
           "export_error", "SENDS", "RECEIVES", "READS_SRC", "WRITES_DST", "FORWARDS"]
