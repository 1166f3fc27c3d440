"""The MSCCL XML text of a laid-out export (:class:`~hccc.compiler.interop.msccl_tbs.Layout`).

Each row is a ``<step>``, each wait of a row beyond its last one a ``nop`` step before it, in the
file's order (ranks, their thread blocks by id, steps); the step lines are made from columns with
numpy (:func:`~hccc.compiler.interop.column_text.column_lines`), a bounded number at a time.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.interop.column_text import Choice, column_lines
from hccc.compiler.interop.msccl_format import LETTER_OF_BUF, TYPE_OF_OP, XmlLimits
from hccc.compiler.interop.msccl_prims import RECEIVES, Prims
from hccc.compiler.interop.msccl_tbs import Layout
from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR
from hccc.compiler.ir.sort_order import lexsort

_TYPES = tuple(TYPE_OF_OP.get(o, "nop") for o in Op)           # Op.NOP: "nop"
_SRC_LETTERS = tuple(LETTER_OF_BUF.get(b, "i") for b in Buf)   # no buffer: "i" (and offset -1)
_DST_LETTERS = tuple(LETTER_OF_BUF.get(b, "o") for b in Buf)

#: step lines made at once, or a thread block's when it has more (bounds the byte matrix of
#: :func:`column_lines`, about 150 bytes a line: below the mmap threshold the hccc process sets,
#: so the matrix reuses freed heap instead of faulting in fresh pages each time)
LINES_AT_ONCE = 1 << 17


def step_fields(rows: Prims) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """srcbuf/srcoff/dstbuf/dstoff of every row: its local operands, the remote ones where the op
    has none (a send names where the receiver stores, a receive where the sender reads)."""
    op = rows.op
    sb, so, db, do = rows.sbuf.copy(), rows.soff.copy(), rows.dbuf.copy(), rows.doff.copy()
    snd = np.flatnonzero((op == int(Op.SEND)) | (op == int(Op.RECV_REDUCE_SEND)))
    rcv = np.where(RECEIVES[op[snd]], rows.peer_x2[snd], rows.peer_x[snd])
    stored = rows.dbuf[rcv] != int(Buf.NONE)      # else the receiver forwards without storing: its source
    db[snd] = np.where(stored, rows.dbuf[rcv], rows.sbuf[rcv])
    do[snd] = np.where(stored, rows.doff[rcv], rows.soff[rcv])
    r = np.flatnonzero(op == int(Op.RECV))
    sender = rows.peer_x[r]
    fwd = (op[sender] == int(Op.RECV_COPY_SEND)) | (op[sender] == int(Op.RECV_REDUCE_COPY_SEND))
    sb[r] = np.where(fwd, rows.dbuf[sender], rows.sbuf[sender])
    so[r] = np.where(fwd, rows.doff[sender], rows.soff[sender])
    c = np.flatnonzero(op == int(Op.RECV_COPY_SEND))
    sb[c], so[c] = db[c], do[c]
    return sb, so, db, do


def xml_text(ir: ProgramIR, lay: Layout, lim: XmlLimits, k: int) -> str:
    """The XML text of an instantiated layout (``k`` instances)."""
    cols = _step_columns(lay)

    def lines(lo: int, hi: int) -> tuple[memoryview, list[int]]:
        st, ty, sl, o1, dl, o2, c, di, ds, h = (x[lo:hi] for x in cols)
        blob, ends = column_lines(['      <step s="', st, '" type="', Choice(ty, _TYPES), '" srcbuf="',
                                   Choice(sl, _SRC_LETTERS), '" srcoff="', o1, '" dstbuf="',
                                   Choice(dl, _DST_LETTERS), '" dstoff="', o2, '" cnt="', c, '" depid="', di,
                                   '" deps="', ds, '" hasdep="', h, '"/>'])
        return memoryview(blob), [0, *ends.tolist()]

    return _document(ir, lay, lim, k, lines)


def _step_columns(lay: Layout) -> list[np.ndarray]:
    """The attributes of every step line (nops and rows) as columns, in the file's order (TBs by
    rank and id, steps): s, type, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep."""
    rows = lay.rows
    n = len(rows)
    mtb, s = lay.mtb, lay.s
    # every row's waits by (waited-for TB, step): the last one is the row's own, the others nops
    a, b = rows.wait_a, rows.wait_b
    w = lexsort((s[b], mtb[b], a))
    a, b = a[w], b[w]
    last = np.ones(len(a), bool)
    last[:-1] = a[1:] != a[:-1]
    dep_id = np.full(n, -1, np.int64)
    dep_s = np.full(n, -1, np.int64)
    dep_id[a[last]] = mtb[b[last]]
    dep_s[a[last]] = s[b[last]]
    nop = ~last
    na, nb = a[nop], b[nop]
    # a nop's step: its row's step minus the waits after it
    after = (np.bincount(a, minlength=n)[a] - (np.arange(len(a)) - np.searchsorted(a, a)) - 1)[nop]
    sb, so, db, do = step_fields(rows)
    m = len(na)
    tb = np.concatenate([lay.tb[na], lay.tb])
    step = np.concatenate([s[na] - after, s])
    order = lexsort((step, lay.tb_id[tb], lay.tb_rank[tb]))
    none = np.full(m, int(Buf.NONE))
    return [np.concatenate(c)[order] for c in (
        (step[:m], s), (np.full(m, int(Op.NOP)), rows.op), (none, sb), (np.full(m, -1), np.where(sb != int(Buf.NONE), so, -1)),
        (none, db), (np.full(m, -1), np.where(db != int(Buf.NONE), do, -1)), (np.zeros(m, np.int64), rows.cnt),
        (mtb[nb], dep_id), (s[nb], dep_s), (np.zeros(m, np.int64), lay.hasdep.astype(np.int64)))]


def _document(ir: ProgramIR, lay: Layout, lim: XmlLimits, k: int, lines) -> str:
    """The file: the ``<algo>``, ``<gpu>`` and ``<tb>`` elements around the step lines, which
    ``lines(lo, hi)`` makes a few thousand at a time (whole thread blocks)."""
    nch = int(lay.tb_ch.max(initial=0)) + 1
    inplace = 1 if True in ir.placements else 0
    outofplace = 1 if False in ir.placements else 0
    pieces: list = [f'<algo name="{ir.name}" proto="{lim.proto}" nchannels="{nch}" '
                    f'nchunksperloop="{ir.nchunks * k}" ngpus="{ir.nranks}" coll="{SPECS[ir.collective].msccl}" '
                    f'inplace="{inplace}" outofplace="{outofplace}" minBytes="{lim.min_bytes}" '
                    f'maxBytes="{lim.max_bytes}">\n'.encode()]
    parts: list[str] = []      # the text, a few thousand step lines (whole thread blocks) at a time
    tbs = lexsort((lay.tb_id, lay.tb_rank))
    tb_end = np.cumsum(lay.tb_nsteps[tbs]).tolist()
    ranks = lay.tb_rank[tbs].tolist()
    send, recv, ch, tid = (x[tbs].tolist() for x in (lay.tb_send, lay.tb_recv, lay.tb_ch, lay.tb_id))
    j = start = lo = hi = 0
    chunk, ends = memoryview(b""), [0]
    for rank in range(ir.nranks):
        pieces.append(f'  <gpu id="{rank}" i_chunks="{ir.in_chunks * k}" o_chunks="{ir.out_chunks * k}" '
                      f's_chunks="{ir.scratch_chunks * k}">\n'.encode())
        while j < len(ranks) and ranks[j] == rank:
            if tb_end[j] > hi:
                parts.append(b"".join(pieces).decode())
                pieces = []
                lo, hi = start, max(tb_end[j], start + LINES_AT_ONCE)
                chunk, ends = lines(lo, hi)
            pieces.append(f'    <tb id="{tid[j]}" send="{send[j]}" recv="{recv[j]}" chan="{ch[j]}">\n'.encode())
            pieces.append(chunk[ends[start - lo]:ends[tb_end[j] - lo]])
            pieces.append(b"    </tb>\n")
            start = tb_end[j]
            j += 1
        pieces.append(b"  </gpu>\n")
    pieces.append(b"</algo>\n")
    parts.append(b"".join(pieces).decode())
    return "".join(parts)


__all__ = ["xml_text", "step_fields", "LINES_AT_ONCE"]
