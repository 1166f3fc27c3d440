"""MSCCL thread blocks for the export's primitive table: which thread block runs each row, in
which order, on which channel, which waits remain, and the step numbers (:class:`Layout`).

An MSCCL thread block (TB) has one send peer, one receive peer and one channel, so the rows of a
component of connection ends (:func:`~hccc.compiler.interop.msccl_prims.end_components`) share
one. In order:

1. :func:`assign_tbs`: one TB per component (merging the components of one hccc TB while they
   fit), local rows join a neighbour of their hccc TB, and where an hccc TB was split its order is
   kept with waits;
2. :func:`spread_channels`: connections move to other channels where a channel has too many peer
   TBs on one rank;
3. :func:`~hccc.compiler.interop.msccl_waits.reduce_deps`: waits implied by program order and
   other waits are dropped (vector clocks, computed wave by wave over all ranks at once);
4. :func:`targets_first`: TBs that others wait for get the small ids (the runtimes store 8 bits);
5. :func:`number_steps`: step numbers (extra waits of a row become ``nop`` steps before it);
6. :func:`instantiate`: ``k`` instances of the layout (msccl-tools' ``instances``).

:func:`lay_out` runs them in that order.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields

import numpy as np

from hccc.compiler.interop.msccl_format import XmlLimits
from hccc.compiler.interop.msccl_prims import Prims, end_components, unique_waits
from hccc.compiler.interop.msccl_waits import OrderCycle, reduce_deps
from hccc.compiler.ir.program_ir import Buf
from hccc.compiler.ir.sort_order import lexsort, stable_argsort, unique_first


@dataclass(slots=True)
class Layout:
    """The rows (with the waits that remain) and the MSCCL thread blocks that run them.

    Thread blocks are the rows of the ``tb_*`` arrays, ordered by rank (ranks in the order their
    first thread block was made) and id within the rank."""

    rows: Prims
    tb_rank: np.ndarray
    tb_send: np.ndarray       # send peer or -1
    tb_recv: np.ndarray       # recv peer or -1
    tb_ch: np.ndarray
    tb_htb: np.ndarray        # the hccc thread block it came from
    tb_id: np.ndarray         # id within its rank
    tb_nsteps: np.ndarray     # steps, nops included
    tb: np.ndarray            # per row: its thread block (index into the tb_* arrays)
    idx: np.ndarray           # per row: position among its thread block's rows
    s: np.ndarray             # per row: XML step number
    hasdep: np.ndarray        # per row: another row waits for it

    @property
    def mtb(self) -> np.ndarray:
        """Per row: the id of its thread block within its rank."""
        return self.tb_id[self.tb]

    @property
    def ntbs(self) -> int:
        return len(self.tb_rank)

    def members(self) -> np.ndarray:
        """Rows ordered by (thread block, position)."""
        return lexsort((self.idx, self.tb))


def _half_steps(pos: np.ndarray) -> np.ndarray:
    """Positions (whole or half steps) as integers of the same order, for the integer sorts."""
    return (pos * 2).astype(np.int64)


def assign_tbs(rows: Prims, merge_up_to: int = 0) -> Layout:
    """MSCCL thread blocks: one per component of connection ends (+ local-only ones).

    With ``merge_up_to > 0``, components of one hccc thread block are merged (first fit, same
    channel, at most one send and one receive peer, at most that many primitives): they ran one
    after another in that thread block anyway, so merging adds no wait and saves thread blocks.
    """
    n = len(rows)
    comps = _components(rows)
    group = _merge_groups(rows, comps, merge_up_to)
    table, owner = _group_tbs(rows, comps, group)
    tb, order, seg = _place_local_rows(rows, owner, table)
    idx, mem, starts = _positions(rows, tb, owner, order, table.ntbs)
    tb_id = _tb_ids(rows, mem, starts, table)
    out = _keep_split_order(rows, tb, order, seg)
    nt = table.ntbs
    lay = Layout(out, table.rank, table.send, table.recv, table.ch, table.htb, tb_id, np.zeros(nt, np.int64), tb,
                 idx, np.zeros(n, np.int64), np.zeros(n, bool))
    return _canonical(lay)


@dataclass(slots=True)
class _Components:
    """The rows' components of connection ends (:func:`~hccc.compiler.interop.msccl_prims.end_components`)."""

    n: int
    pc: np.ndarray           # per row: its component (-1: a local row)
    peer_rows: np.ndarray    # the rows in a component, in row order
    size: np.ndarray         # per component: its rows
    first_row: np.ndarray    # per component: its first row
    last_row: np.ndarray     # per component: its last row
    send: np.ndarray         # per component: its send peer or -1
    recv: np.ndarray         # per component: its receive peer or -1


def _components(rows: Prims) -> _Components:
    ends = end_components(rows)
    nc = ends.ncomp
    pc = ends.row_comp()
    peer_rows = np.flatnonzero(pc >= 0)
    size = np.bincount(pc[peer_rows], minlength=nc)
    u, fi, _ = unique_first(pc[peer_rows])
    first_row = np.full(nc, -1, np.int64)
    first_row[u] = peer_rows[fi]
    rev = peer_rows[::-1]
    u, li, _ = unique_first(pc[rev])
    last_row = np.full(nc, -1, np.int64)
    last_row[u] = rev[li]
    comp_send = np.full(nc, -1, np.int64)
    comp_recv = np.full(nc, -1, np.int64)
    comp_send[ends.comp[ends.sends]] = ends.peer[ends.sends]
    comp_recv[ends.comp[~ends.sends]] = ends.peer[~ends.sends]
    return _Components(nc, pc, peer_rows, size, first_row, last_row, comp_send, comp_recv)


def _merge_groups(rows: Prims, c: _Components, merge_up_to: int) -> np.ndarray:
    """Per component: the component whose thread block it joins (itself where it joins none).
    First fit among the components of its hccc thread block, by position (:func:`assign_tbs`)."""
    group = np.arange(c.n)
    if not (merge_up_to > 0 and c.n):
        return group
    h_rank, h_htb = rows.rank[c.last_row], rows.htb[c.last_row]
    first_pos, ch = rows.pos[c.first_row], rows.ch[c.first_row]
    cur = None
    groups: list[list] = []      # [root, sends, receives, channel, size]
    by_htb = lexsort((_half_steps(first_pos), h_htb, h_rank))
    alone = np.ones(c.n, bool)   # the only component of its hccc TB: nothing to merge
    twin = (h_rank[by_htb][1:] == h_rank[by_htb][:-1]) & (h_htb[by_htb][1:] == h_htb[by_htb][:-1])
    alone[by_htb[1:][twin]] = alone[by_htb[:-1][twin]] = False
    for r in by_htb[~alone[by_htb]].tolist():
        if (h_rank[r], h_htb[r]) != cur:
            cur, groups = (h_rank[r], h_htb[r]), []
        se, re_, cc = c.send[r] >= 0, c.recv[r] >= 0, ch[r]
        for g in groups:
            if g[3] == cc and not (g[1] and se) and not (g[2] and re_) and g[4] + c.size[r] <= merge_up_to:
                g[1] |= se
                g[2] |= re_
                g[4] += c.size[r]
                group[r] = g[0]
                break
        else:
            groups.append([r, se, re_, cc, c.size[r]])
    return group


@dataclass(slots=True)
class _TbTable:
    """The thread blocks made so far, one entry each, in the order made."""

    rank: np.ndarray
    send: np.ndarray
    recv: np.ndarray
    ch: np.ndarray
    htb: np.ndarray

    @property
    def ntbs(self) -> int:
        return len(self.rank)

    def add_local(self, rank: np.ndarray, htb: np.ndarray) -> None:
        """Append thread blocks without peers, on channel 0."""
        m = len(rank)
        self.rank = np.concatenate([self.rank, rank])
        self.htb = np.concatenate([self.htb, htb])
        self.ch = np.concatenate([self.ch, np.zeros(m, np.int64)])
        self.send = np.concatenate([self.send, np.full(m, -1, np.int64)])
        self.recv = np.concatenate([self.recv, np.full(m, -1, np.int64)])


def _group_tbs(rows: Prims, c: _Components, group: np.ndarray) -> tuple[_TbTable, np.ndarray]:
    """One thread block per group of components, made in the order of the group's first row;
    (the table, per row its thread block or -1 for local rows)."""
    g_send = np.full(c.n, -1, np.int64)
    g_recv = np.full(c.n, -1, np.int64)
    np.maximum.at(g_send, group, c.send)
    np.maximum.at(g_recv, group, c.recv)
    gid = group[c.pc[c.peer_rows]]
    gu, gfirst, _ = unique_first(gid)
    made = stable_argsort(gfirst)
    tb_of_group = np.full(c.n, -1, np.int64)
    tb_of_group[gu[made]] = np.arange(len(gu))
    head = c.peer_rows[gfirst[made]]
    table = _TbTable(rows.rank[head], g_send[gu[made]], g_recv[gu[made]], rows.ch[head], rows.htb[head])
    owner = np.full(len(rows), -1, np.int64)
    owner[c.peer_rows] = tb_of_group[gid]
    return table, owner


def _place_local_rows(rows: Prims, owner: np.ndarray, table: _TbTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row's thread block: local rows join the TB of the closest peer row before them in
    their hccc TB (after them when there is none); an hccc TB without peer rows gets a local TB
    (added to ``table``). (per row its TB, the rows by (rank, hccc TB, position), where in that
    order an hccc TB begins)."""
    n = len(rows)
    order = lexsort((_half_steps(rows.pos), rows.htb, rows.rank))
    o = owner[order]
    seg = np.ones(n, bool)
    seg[1:] = (rows.rank[order][1:] != rows.rank[order][:-1]) | (rows.htb[order][1:] != rows.htb[order][:-1])
    begins = np.flatnonzero(seg)
    seg_id = np.cumsum(seg) - 1
    at = np.arange(n)
    last_valid = np.maximum.accumulate(np.where(o >= 0, at, -1)) if n else at
    first_valid = np.minimum.reduceat(np.where(o >= 0, at, n), begins) if n else begins
    fill = np.where(last_valid >= begins[seg_id], o[np.maximum(last_valid, 0)],
                    np.where(first_valid[seg_id] < n, o[np.minimum(first_valid[seg_id], n - 1)], -1))
    lonely = np.flatnonzero(first_valid == n)          # hccc TBs without peer rows
    fill = np.where(fill < 0, table.ntbs + np.searchsorted(lonely, seg_id), fill)
    first_of = order[begins[lonely]]
    table.add_local(rows.rank[first_of], rows.htb[first_of])
    tb = np.empty(n, np.int64)
    tb[order] = fill
    return tb, order, seg


def _positions(rows: Prims, tb: np.ndarray, owner: np.ndarray, order: np.ndarray,
               nt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per row its position in its TB, the rows by (TB, position), where each TB starts there).

    Members by position; at equal positions (one component served by two hccc TBs) peer rows in
    row order, then local rows in (hccc TB, position) order."""
    n = len(rows)
    at = np.arange(n)
    local = owner < 0
    second = np.empty(n, np.int64)
    second[order] = at
    second = np.where(local, second, np.arange(n))
    mem = lexsort((second, local, _half_steps(rows.pos), tb))
    counts = np.bincount(tb, minlength=nt)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    idx = np.empty(n, np.int64)
    idx[mem] = at - np.repeat(starts, counts)
    return idx, mem, starts


def _tb_ids(rows: Prims, mem: np.ndarray, starts: np.ndarray, table: _TbTable) -> np.ndarray:
    """Ids: a rank's TBs by (hccc TB, position of the first member), in order made at ties."""
    nt = table.ntbs
    first_pos = rows.pos[mem[starts]] if len(rows) else np.zeros(0)
    by_id = lexsort((_half_steps(first_pos), table.htb, table.rank))
    tb_id = np.empty(nt, np.int64)
    rk = table.rank[by_id]
    rstart = np.concatenate([[True], rk[1:] != rk[:-1]]) if nt else np.zeros(0, bool)
    rbeg = np.flatnonzero(rstart)
    tb_id[by_id] = np.arange(nt) - np.repeat(rbeg, np.diff(np.append(rbeg, nt)))
    return tb_id


def _keep_split_order(rows: Prims, tb: np.ndarray, order: np.ndarray, seg: np.ndarray) -> Prims:
    """The rows with a wait wherever consecutive rows of an hccc TB went to different TBs."""
    same = ~seg[1:] & (tb[order][1:] != tb[order][:-1])
    wa = np.concatenate([rows.wait_a, order[1:][same]])
    wb = np.concatenate([rows.wait_b, order[:-1][same]])
    out = Prims(*(getattr(rows, f.name) for f in fields(Prims)))
    out.wait_a, out.wait_b = unique_waits(wa, wb, len(rows))
    return out


def _canonical(lay: Layout) -> Layout:
    """The thread-block table ordered by rank (ranks in the order their first TB was made: the
    table's present order) and id."""
    nt = lay.ntbs
    made = np.full(int(lay.tb_rank.max(initial=-1)) + 1, nt, np.int64)
    np.minimum.at(made, lay.tb_rank, np.arange(nt))
    perm = lexsort((lay.tb_id, made[lay.tb_rank]))
    inv = np.empty(nt, np.int64)
    inv[perm] = np.arange(nt)
    for f in ("tb_rank", "tb_send", "tb_recv", "tb_ch", "tb_htb", "tb_id", "tb_nsteps"):
        setattr(lay, f, getattr(lay, f)[perm])
    lay.tb = inv[lay.tb]
    return lay


# ---------------------------------------------------------------------------------------------
def _over_channel_limit(lay: Layout, lim: XmlLimits) -> bool:
    nch = int(lay.tb_ch.max(initial=0)) + 1
    for peer in (lay.tb_send, lay.tb_recv):
        m = peer >= 0
        if m.any() and np.bincount(lay.tb_rank[m] * nch + lay.tb_ch[m]).max() > lim.max_tbs_per_channel:
            return True
    return False


def spread_channels(lay: Layout, lim: XmlLimits) -> None:
    """Move whole connections to other channels where a (rank, channel) has too many peer TBs.

    A connection's two thread blocks must share its channel, and a thread block has one channel,
    so connections linked through thread blocks move together (union-find). Groups keep their
    channel when it fits; others take the lowest channel where every rank stays within
    ``max_tbs_per_channel`` sending and receiving thread blocks and no connection appears twice.
    Messages keep their order: a connection moves with all of its messages.
    """
    if not _over_channel_limit(lay, lim):
        return
    from networkx.utils import UnionFind    # imported here: networkx is slow to import
    rank, send, recv, ch, tid = (a.tolist() for a in (lay.tb_rank, lay.tb_send, lay.tb_recv, lay.tb_ch, lay.tb_id))
    uf = UnionFind()
    owner: dict = {}
    by_rank = sorted(range(lay.ntbs), key=lambda t: (rank[t], tid[t]))
    for t in by_rank:
        uf[t]
        if send[t] >= 0:
            owner.setdefault((rank[t], send[t], ch[t]), []).append(t)
        if recv[t] >= 0:
            owner.setdefault((recv[t], rank[t], ch[t]), []).append(t)
    for ts in owner.values():
        uf.union(*ts)
    groups: dict = defaultdict(list)
    for t in by_rank:
        if send[t] >= 0 or recv[t] >= 0:
            groups[uf[t]].append(t)
    count: dict = defaultdict(int)     # (rank, channel, 0 send / 1 recv) -> thread blocks
    used: set = set()                  # (sender, receiver, channel)
    for g in sorted(groups.values(), key=lambda g: (ch[g[0]], rank[g[0]], tid[g[0]])):
        conns = {(rank[t], send[t]) for t in g if send[t] >= 0}
        sends: dict = defaultdict(int)
        recvs: dict = defaultdict(int)
        for t in g:
            if send[t] >= 0:
                sends[rank[t]] += 1
            if recv[t] >= 0:
                recvs[rank[t]] += 1

        def fits(c):
            return (all((a, b, c) not in used for a, b in conns)
                    and all(count[(r, c, 0)] + k <= lim.max_tbs_per_channel for r, k in sends.items())
                    and all(count[(r, c, 1)] + k <= lim.max_tbs_per_channel for r, k in recvs.items()))
        c = ch[g[0]] if fits(ch[g[0]]) else next((c for c in range(lim.max_channels) if fits(c)), None)
        if c is None:
            break    # the limit check reports the overflow
        for t in g:
            ch[t] = c
        used |= {(a, b, c) for a, b in conns}
        for r, k in sends.items():
            count[(r, c, 0)] += k
        for r, k in recvs.items():
            count[(r, c, 1)] += k
    lay.tb_ch = np.array(ch, np.int64)


def targets_first(lay: Layout) -> None:
    """Renumber each rank's TBs so those that others wait for come first (the runtimes store the
    waited-for TB id in 8 bits); otherwise keep the order."""
    rows = lay.rows
    mtb = lay.mtb
    if not len(rows.wait_b) or mtb[rows.wait_b].max() < 128:
        return
    waited = np.zeros(lay.ntbs, bool)
    waited[lay.tb[rows.wait_b]] = True
    top = np.zeros(int(lay.tb_rank.max()) + 1, np.int64)
    np.maximum.at(top, lay.tb_rank, np.where(waited, lay.tb_id, -1))
    redo = top[lay.tb_rank] >= 128
    order = lexsort((lay.tb_id, ~waited, lay.tb_rank))
    order = order[redo[order]]
    rk = lay.tb_rank[order]
    beg = np.flatnonzero(np.concatenate([[True], rk[1:] != rk[:-1]])) if len(order) else np.zeros(0, np.int64)
    lay.tb_id[order] = np.arange(len(order)) - np.repeat(beg, np.diff(np.append(beg, len(order))))
    _canonical(lay)


def number_steps(lay: Layout) -> None:
    """Step numbers: each row after the ``nop`` steps carrying all but one of its waits."""
    rows = lay.rows
    n = len(rows)
    nd = np.bincount(rows.wait_a, minlength=n)
    extra = np.maximum(nd - 1, 0)
    mem = lay.members()
    width = (extra + 1)[mem]
    end = np.cumsum(width)
    counts = np.bincount(lay.tb, minlength=lay.ntbs)
    tb_end = np.cumsum(counts)
    base = np.concatenate([[0], end[tb_end[:-1] - 1]]) if lay.ntbs else np.zeros(0, np.int64)
    s = np.empty(n, np.int64)
    s[mem] = end - 1 - np.repeat(base, counts)
    lay.s = s
    lay.tb_nsteps = np.where(counts > 0, end[np.maximum(tb_end - 1, 0)] - base, 0) if n else counts
    lay.hasdep = np.zeros(n, bool)
    lay.hasdep[rows.wait_b] = True


@dataclass(frozen=True)
class Segments:
    """How instances rename chunks: the input and output buffers are cut into segments of
    ``seg`` chunks, the scratch buffer into segments of ``scratch`` chunks; instance ``i`` of
    chunk ``q*g + j`` of a buffer cut into segments of ``g`` is the fine chunk ``q*g*k + i*g + j``
    (:func:`instantiate`; ``g = 1`` is msccl-tools' rule ``c*k + i``)."""

    seg: int
    scratch: int


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, max(1, n) + 1) if max(1, n) % d == 0]


def _fitting(lo: np.ndarray, cnt: np.ndarray, total: int) -> int | None:
    """The smallest divisor ``g`` of ``total`` such that no range ``[lo, lo+cnt)`` crosses a
    multiple of ``g``, or None."""
    hi = lo + cnt - 1
    return next((g for g in _divisors(total) if np.all(lo // g == hi // g)), None)


def segments(rows: Prims, unit: int, scratch: int) -> Segments | None:
    """The renaming segments for these rows, or None where none keeps every row's chunk range
    contiguous.

    ``unit`` is the collective's own segment (the chunks one rank's part of a rank-indexed buffer
    holds: an AllGather's input, a ReduceScatter's output, an AllToAll's block; the whole buffer of
    an AllReduce, Broadcast or Reduce). Any divisor ``g`` of ``unit`` gives a renaming under which
    the collective's postcondition holds when it held before: every chunk index in it has the form
    ``q*unit + j`` on both sides, and the renaming maps it to ``q*unit*k + (j//g)*g*k + i*g +
    j%g``, which is chunk ``(j//g)*g*k + i*g + j%g`` of segment ``q`` of ``unit*k`` chunks, the same
    on every buffer and rank. The scratch buffer is private to a rank, so any divisor of its size
    renames it. The smallest ``g`` under which no row's chunk range crosses a segment boundary is
    chosen: ranges then stay contiguous (one XML step each), and with one-chunk steps it is
    msccl-tools' own rule."""
    def ranges(which):
        parts = [(o[which(b)], rows.cnt[which(b)]) for b, o in ((rows.sbuf, rows.soff), (rows.dbuf, rows.doff))]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    g = _fitting(*ranges(lambda b: (b == int(Buf.INPUT)) | (b == int(Buf.OUTPUT))), unit)
    gs = _fitting(*ranges(lambda b: b == int(Buf.SCRATCH)), scratch)
    return None if g is None or gs is None else Segments(g, gs)


def instantiate(lay: Layout, k: int, segs: Segments | None = None) -> Layout:
    """``k`` instances of the layout (msccl-tools' ``instances``): every MSCCL TB becomes ``k`` TBs
    (ids ``id*k + i``, channel ``i*nchannels + ch``), each moving its own ``1/k`` of the data.

    With ``segs`` (:func:`segments`) the instances are one renaming of chunks for every buffer,
    rank and step: instance ``i`` of chunk ``q*g + j`` is ``q*g*k + i*g + j`` (``g``: the
    buffer's segment). Each fine chunk then follows the path of its coarse chunk,
    the collective's postcondition holds for the fine chunks (:func:`segments`), and the instances
    share no TB, channel or dependency, so they are deadlock-free and correct when one is. Without
    ``segs`` a step on chunks ``[off, off+cnt)`` moves chunks ``[off*k + i*cnt, off*k + (i+1)*cnt)``
    in instance ``i``: renamed per step, which need not agree between steps, so the exporter then
    proves the result with the importer."""
    if k == 1:
        return lay
    rows = lay.rows
    n, nt = len(rows), lay.ntbs
    nch = int(lay.tb_ch.max(initial=0)) + 1
    inst = np.repeat(np.arange(k), n)

    def tile(col):
        return np.concatenate([col] * k)

    def shift(col):
        t = tile(col)
        return np.where(t >= 0, t + inst * n, -1)

    new = Prims(*(tile(getattr(rows, f.name)) for f in fields(Prims)))
    new.peer_x, new.peer_x2 = shift(rows.peer_x), shift(rows.peer_x2)
    for buf, off in (("sbuf", "soff"), ("dbuf", "doff")):
        o, b = getattr(new, off), getattr(new, buf)
        if segs is None:
            fine = o * k + inst * new.cnt
        else:
            g = np.where(b == int(Buf.SCRATCH), segs.scratch, segs.seg)
            fine = (o // g) * g * k + inst * g + o % g
        setattr(new, off, np.where(b != int(Buf.NONE), fine, o))
    m = len(rows.wait_a)
    new.wait_a = tile(rows.wait_a) + np.repeat(np.arange(k), m) * n
    new.wait_b = tile(rows.wait_b) + np.repeat(np.arange(k), m) * n
    # TBs: each rank's list by id, instance copies next to each other (ids id*k + i)
    ti = np.repeat(np.arange(k), nt)
    src = np.tile(np.arange(nt), k)
    tb_rows = lexsort((ti, src))               # canonical order: rank, id, instance
    src, ti = src[tb_rows], ti[tb_rows]
    row_of = np.empty(nt * k, np.int64)
    row_of[tb_rows] = np.arange(nt * k)            # (instance, TB) -> new table row
    return Layout(new, lay.tb_rank[src], lay.tb_send[src], lay.tb_recv[src], ti * nch + lay.tb_ch[src],
                  lay.tb_htb[src], lay.tb_id[src] * k + ti, lay.tb_nsteps[src],
                  row_of[inst * nt + tile(lay.tb)], tile(lay.idx), tile(lay.s), tile(lay.hasdep))


def split_connections(rows: Prims, per_tb: int) -> Prims | None:
    """The rows with every connection of more than ``per_tb`` messages cut into consecutive runs
    of ``per_tb``, run ``j`` on channel ``ch + j*nch`` (``nch``: the channels the rows use), at both
    ends. The rows as given where no connection is longer; None where the cut cannot be made.

    An MSCCL thread block has one channel and a connection (sender, receiver, channel) one thread
    block at each end, so a connection's messages are a lower bound on its thread blocks' steps.
    Messages of one connection arrive in the order they were sent (FIFO), so the ``m``-th send
    and the ``m``-th receive of a connection are one message: cutting both ends' sequences at the
    same counts keeps every match, and each run is a connection of its own on its own channel.
    :func:`assign_tbs` then gives each run its thread block and keeps the order of the thread block
    the runs came from with a wait at each cut. A forwarding primitive whose receive and send fall
    into different runs cannot be cut (None)."""
    sends = np.flatnonzero(rows.sp >= 0)
    recvs = np.flatnonzero(rows.rp >= 0)
    if not len(sends):
        return rows

    def ordinals(idx, peer):
        key = (rows.rank[idx], peer[idx], rows.ch[idx])
        order = lexsort((_half_steps(rows.pos[idx]), rows.htb[idx]) + key[::-1])
        k = np.stack([a[order] for a in key], axis=1)
        new = np.ones(len(idx), bool)
        new[1:] = np.any(k[1:] != k[:-1], axis=1)
        start = np.maximum.accumulate(np.where(new, np.arange(len(idx)), 0))
        out = np.full(len(rows), -1, np.int64)
        out[idx[order]] = np.arange(len(idx)) - start
        return out

    n = len(rows)
    s_ord = np.full(n, -1, np.int64)
    s_ord[sends] = ordinals(sends, rows.sp)[sends]
    if s_ord.max() < per_tb:
        return rows
    r_ord = np.full(n, -1, np.int64)
    r_ord[recvs] = ordinals(recvs, rows.rp)[recvs]
    fwd = (rows.sp >= 0) & (rows.rp >= 0)
    partner = np.where(fwd, rows.peer_x2, rows.peer_x)       # a send's receiving row
    if np.any(partner[sends] < 0) or np.any(r_ord[partner[sends]] != s_ord[sends]):
        return None          # the rows' order is not each connection's message order
    run = np.zeros(n, np.int64)
    run[sends] = s_ord[sends] // per_tb
    recv_run = np.zeros(n, np.int64)
    recv_run[recvs] = r_ord[recvs] // per_tb
    if np.any(run[fwd] != recv_run[fwd]):
        return None
    run = np.where(rows.sp >= 0, run, recv_run)
    nch = int(rows.ch.max(initial=0)) + 1
    out = rows.copy()
    out.ch = rows.ch + run * nch
    return out


def lay_out(rows: Prims, lim: XmlLimits, merge_up_to: int, k: int, segs: Segments | None = None) -> Layout:
    """The passes in order: thread blocks, channels, waits, ids, step numbers, then ``k`` instances
    (renamed by ``segs``, see :func:`instantiate`)."""
    lay = assign_tbs(rows, merge_up_to)
    spread_channels(lay, lim)
    reduce_deps(lay)
    targets_first(lay)
    number_steps(lay)
    return instantiate(lay, k, segs)


def relabels(rows: Prims) -> bool:
    """Whether :func:`instantiate` is a renaming of chunks for these rows (every one moves one
    chunk), so that ``k`` instances are correct when one is."""
    return bool(np.all(rows.cnt == 1))


__all__ = ["Layout", "OrderCycle", "Segments", "segments", "lay_out", "assign_tbs", "spread_channels", "reduce_deps", "targets_first",
           "number_steps", "instantiate", "relabels", "split_connections"]
