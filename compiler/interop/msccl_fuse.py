"""Fusing a receive with the send that forwards what it stored (MSCCL's ``rcs``/``rrcs``/``rrs``),
on the export's primitive table (:class:`~hccc.compiler.interop.msccl_prims.Prims`).

Only asked for (``--xml-fuse``): the pass walks the candidates in Python, one rank at a time.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict

import numpy as np

from hccc.compiler.interop.msccl_prims import READS_SRC, WRITES_DST, Prims, unique_waits
from hccc.compiler.ir.program_ir import Buf, Op


def fuse_forwarding(rows: Prims) -> Prims | None:
    """Fuse a receive with the send that forwards what it stored; None when nothing fuses.

    Input: one hccc TB per connection end (the step-ordered export), so a receive ``R`` (from ``p``,
    storing range ``d``) and a later send ``S`` (to ``q``, reading exactly ``d``, waiting for ``R``)
    sit in two TBs ``a`` (receives from ``p``) and ``b`` (sends to ``q``). Per rank, the (a, b) pairs
    with most such candidates are merged (each TB at most once: an MSCCL TB has one receive and one
    send peer; only chains, where at least half of either TB's steps fuse) and their members ordered
    by the program's key (sub-pipeline, sends first, transfer); candidates then become one step at
    ``R``'s place when that moves no other message of ``b`` (a connection keeps its message order)
    and ``S`` waits for nothing later than ``R``. Every wait then still goes from a smaller key to a
    larger one, as in the program. A fused receive-reduce whose stored result is overwritten on that
    rank before anything reads it sends without storing (``rrs``)."""
    t = _RowLists(rows)
    cand = _candidates(t)
    if not cand:
        return None
    fused, merged = _choose_pairs(t, cand)
    if not fused:
        return None
    return _fused_rows(rows, t, fused, merged)


class _RowLists:
    """The columns of the rows as Python lists (the pass walks them one row at a time), each
    row's waits as a set, and each row's hccc TB as (rank, hccc TB)."""

    def __init__(self, rows: Prims):
        self.n = len(rows)
        self.op, self.rank, self.htb = rows.op.tolist(), rows.rank.tolist(), rows.htb.tolist()
        self.sp, self.rp, self.ch = rows.sp.tolist(), rows.rp.tolist(), rows.ch.tolist()
        self.sbuf, self.soff, self.dbuf, self.doff, self.cnt = (
            c.tolist() for c in (rows.sbuf, rows.soff, rows.dbuf, rows.doff, rows.cnt))
        self.key = [tuple(k) for k in rows.key.tolist()]
        self.deps: list[set] = [set() for _ in range(self.n)]
        for a, b in zip(rows.wait_a.tolist(), rows.wait_b.tolist()):
            self.deps[a].add(b)

    def tb(self, i: int) -> tuple[int, int]:
        return self.rank[i], self.htb[i]


def _candidates(t: _RowLists) -> dict:
    """(rank, receiving TB a, sending TB b) -> [(R, S)]: a send ``S`` that waits for a receive
    ``R`` and reads exactly what it stored, each the only connection end of its hccc TB."""
    ends: dict = defaultdict(lambda: [set(), set()])     # (rank, htb) -> (send ends, recv ends)
    for i in range(t.n):
        if t.sp[i] >= 0:
            ends[t.tb(i)][0].add((t.sp[i], t.ch[i]))
        if t.rp[i] >= 0:
            ends[t.tb(i)][1].add((t.rp[i], t.ch[i]))
    pure_recv = {k for k, (se, re_) in ends.items() if not se and len(re_) == 1}
    pure_send = {k for k, (se, re_) in ends.items() if len(se) == 1 and not re_}
    send, recv, rrc = int(Op.SEND), int(Op.RECV), int(Op.RECV_REDUCE_COPY)
    cand: dict = defaultdict(list)
    for i in range(t.n):
        if t.op[i] != send or t.tb(i) not in pure_send:
            continue
        for d in t.deps[i]:
            if (t.op[d] in (recv, rrc) and t.tb(d) in pure_recv and t.ch[d] == t.ch[i]
                    and (t.dbuf[d], t.doff[d], t.cnt[d]) == (t.sbuf[i], t.soff[i], t.cnt[i])):
                cand[(t.rank[i], t.htb[d], t.htb[i])].append((d, i))
    return cand


def _choose_pairs(t: _RowLists, cand: dict) -> tuple[dict[int, int], list]:
    """The TB pairs merged, most candidates first, each TB at most once, only chains; (S -> R for
    every fused pair, [(kept TB id, merged member order)])."""
    fused: dict[int, int] = {}           # S -> R
    members: dict = defaultdict(list)    # (rank, htb) -> member rows
    for i in range(t.n):
        members[t.tb(i)].append(i)
    merged: list = []
    used: set = set()
    for (r, a, b), pairs in sorted(cand.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1], kv[0][2])):
        if (r, a) in used or (r, b) in used:
            continue
        order = _merge_order(t.key, t.deps, members[(r, a)], members[(r, b)])
        fused_here = _fusable(t, pairs, order, members[(r, b)])
        # merge only chains: a pair of TBs that mostly forwards (most of either TB's steps fuse);
        # otherwise the merged TB would run two mostly unrelated connections in series
        if 2 * len(fused_here) < max(len(members[(r, a)]), len(members[(r, b)])):
            continue
        used |= {(r, a), (r, b)}
        merged.append((a, order))
        fused.update(fused_here)
    return fused, merged


def _fusable(t: _RowLists, pairs: list, order: list[int], members_b: list[int]) -> dict[int, int]:
    """S -> R for the candidate pairs that can become one step in the merged ``order``: no other
    message of ``b`` between R and S (a connection keeps its order), S's other waits all before R."""
    where = {i: k for k, i in enumerate(order)}
    bpos = sorted(where[i] for i in members_b)
    fused_here = {}
    for R, S in pairs:
        pr, ps = where[R], where[S]
        if not pr < ps or S in fused_here:
            continue
        between = bisect_left(bpos, ps) - bisect_right(bpos, pr)
        if between or any((where[d] >= pr) if d in where else (t.key[d] >= t.key[R]) for d in t.deps[S] if d != R):
            continue
        fused_here[S] = R
    return fused_here


def _fused_rows(rows: Prims, t: _RowLists, fused: dict[int, int], merged: list) -> Prims:
    """The rows with the merged TBs' members renumbered, each fused pair one row at R's place
    (sending to S's peer; R's result not stored when dead) and the S rows dropped."""
    out = rows.copy()
    for a, order in merged:          # merged TBs: members in the merged order, positions renumbered
        out.htb[order] = a
        out.pos[order] = np.arange(len(order), dtype=np.float64)
    by_rank: dict[int, list[int]] = defaultdict(list)
    for i in range(t.n):
        by_rank[t.rank[i]].append(i)
    dead = _dead_after(rows, t.key, by_rank, fused)
    S = np.array(list(fused), np.int64)
    R = np.array([fused[s] for s in S.tolist()], np.int64)
    out.sp[R] = rows.sp[S]
    out.peer_x2[R] = rows.peer_x[S]
    is_recv = rows.op[R] == int(Op.RECV)
    is_dead = np.isin(R, np.array(sorted(dead), np.int64))
    out.op[R] = np.where(is_recv, int(Op.RECV_COPY_SEND),
                         np.where(is_dead, int(Op.RECV_REDUCE_SEND), int(Op.RECV_REDUCE_COPY_SEND)))
    gone = ~is_recv & is_dead
    out.dbuf[R[gone]] = int(Buf.NONE)
    out.doff[R[gone]] = 0
    return _without_sends(rows, out, S, R)


def _without_sends(rows: Prims, out: Prims, S: np.ndarray, R: np.ndarray) -> Prims:
    """``out`` without the rows ``S``, references to them (matches, waits) moved to ``R``."""
    n = len(rows)
    keep = np.ones(n, bool)
    keep[S] = False
    new_of = np.cumsum(keep) - 1
    new_of[S] = new_of[R]
    kept = np.flatnonzero(keep)
    res = Prims(*(getattr(out, f)[kept] for f in ("rank", "htb", "pos", "op", "sp", "rp", "ch", "sbuf", "soff",
                                                   "dbuf", "doff", "cnt", "peer_x", "peer_x2", "key")),
                wait_a=None, wait_b=None)
    for col in (res.peer_x, res.peer_x2):
        col[col >= 0] = new_of[col[col >= 0]]
    # a wait of R or S moves to the fused step (the two waiting for each other disappears)
    res.wait_a, res.wait_b = unique_waits(new_of[rows.wait_a], new_of[rows.wait_b], len(kept))
    return res


def _merge_order(key: list, deps: list[set], ma: list[int], mb: list[int]) -> list[int]:
    """Members of two TBs in one order that keeps each TB's order and every dependency between
    them, smallest key first among the ready ones (a topological sort)."""
    mem = ma + mb
    inside = set(mem)
    succ: dict[int, list[int]] = defaultdict(list)
    indeg = dict.fromkeys(mem, 0)
    for m in (ma, mb):
        for u, v in zip(m, m[1:]):
            succ[u].append(v)
            indeg[v] += 1
    for v in mem:
        for u in deps[v]:
            if u in inside:
                succ[u].append(v)
                indeg[v] += 1
    heap = [(key[i], i) for i in mem if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (key[v], v))
    if len(order) != len(mem):
        raise AssertionError("internal error: dependency cycle between two thread blocks of one rank")
    return order


def _dead_after(rows: Prims, key: list, by_rank: dict, fused: dict[int, int]) -> set[int]:
    """Receive-reduce halves ``R`` of fused pairs whose stored range is overwritten on their rank (in
    key order) before anything but the fused send reads it: their result need not be stored."""
    out: set[int] = set()
    op = rows.op.tolist()
    sbuf, soff, dbuf, doff, cnt = (c.tolist() for c in (rows.sbuf, rows.soff, rows.dbuf, rows.doff, rows.cnt))
    rr = {R: S for S, R in fused.items() if op[R] == int(Op.RECV_REDUCE_COPY) and dbuf[R] != int(Buf.NONE)}
    if not rr:
        return out
    overwrite = (int(Op.RECV), int(Op.RECV_COPY_SEND), int(Op.COPY))
    for idxs in by_rank.values():
        mine = [R for R in idxs if R in rr]
        if not mine:
            continue
        order = sorted(idxs, key=lambda i: key[i])
        pos = {i: k for k, i in enumerate(order)}
        for R in mine:
            b, lo, hi = dbuf[R], doff[R], doff[R] + cnt[R]
            dead = False
            for j in order[pos[R] + 1:]:
                if j == rr[R]:
                    continue
                if READS_SRC[op[j]] and sbuf[j] == b and soff[j] < hi and soff[j] + cnt[j] > lo:
                    break
                if WRITES_DST[op[j]] and dbuf[j] == b and doff[j] < hi and doff[j] + cnt[j] > lo:
                    # an overwrite of the whole range that does not read it kills the stored value
                    dead = op[j] in overwrite and doff[j] <= lo and doff[j] + cnt[j] >= hi
                    break
            if dead:
                out.add(R)
    return out


__all__ = ["fuse_forwarding"]
