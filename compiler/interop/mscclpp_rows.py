"""An MSCCL++ plan's ProgramIR rows, in every thread block's order (the import's second pass).

Per operation (:meth:`RowBuilder.operation`): the receives its waits announce, the sends of data
peers read at its signals, its local data movement (``copy`` a COPY, ``re``/``res`` COPY and
REDUCE, a remote read a RECV or RECV_REDUCE_COPY, a packet read a receive where first read, then
COPY or REDUCE), its own sends, and the NOPs where it passes a semaphore or barrier
(:class:`~hccc.compiler.interop.mscclpp_order.SyncOrder`). A received slot read once by the
operation is received into its final place, as hccc's kernels receive.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left

import numpy as np

from hccc.compiler.interop.mscclpp_blocks import PlanBlocks
from hccc.compiler.interop.mscclpp_flow import PACKET_READS, Connections, DataFlow
from hccc.compiler.interop.mscclpp_layout import PlanLayout
from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.interop.mscclpp_order import SyncOrder
from hccc.compiler.ir.program_ir import Buf, Op
from collections import defaultdict


#: what a row does for its operation, after the operation's description (the peer is the row's
#: send peer, else its receive peer); a row holds the index
NOTES = ("", "sending to rank", "receiving from rank", "reading rank", "from rank")
SENDING, RECEIVING, READING, FROM = 1, 2, 3, 4
#: the columns of a row, in order
ROW_COLUMNS = ("rank", "tb", "op", "send_peer", "recv_peer", "channel", "src_buf", "src_off", "dst_buf", "dst_off",
               "count")
_CHANNEL = ROW_COLUMNS.index("channel")


class RowTable:
    """The rows so far as columns (:data:`ROW_COLUMNS`, one flat 64-bit array, a row after the
    other), each row with the operation it belongs to (an index into ``ops``: the operation's path
    in the plan and its description, kept once per operation) and its :data:`NOTES` entry. A row
    costs 11 integers and two small ones, its message is written only when asked for
    (:meth:`describe`), so a plan's rows take memory in proportion to their number, not to their
    text."""

    def __init__(self):
        self.cols = array("q")
        self.op_of = array("q")
        self.note = array("b")
        self.ops: list[tuple[tuple, str]] = []   # (path, description) of each operation with rows

    def __len__(self) -> int:
        return len(self.op_of)

    def add(self, r, ti, op, path, desc, sp=-1, rp=-1, ch=0, sb=Buf.NONE, so=0, db=Buf.NONE, do=0, n=1,
            note=0) -> int:
        """Append a row of operation (``path``, ``desc``): the same objects for every row of one
        operation, which is then kept once; its index."""
        last = self.ops[-1] if self.ops else None
        if last is None or last[0] is not path or last[1] is not desc:
            self.ops.append((path, desc))
        self.cols.extend((r, ti, int(op), sp, rp, ch, int(sb), so, int(db), do, n))
        self.op_of.append(len(self.ops) - 1)
        self.note.append(note)
        return len(self.op_of) - 1

    def set_channel(self, row: int, ch: int) -> None:
        self.cols[row * len(ROW_COLUMNS) + _CHANNEL] = ch

    def array(self) -> np.ndarray:
        """The rows as an (N, 11) int64 array (a view of the columns)."""
        return np.frombuffer(self.cols, dtype=np.int64).reshape(-1, len(ROW_COLUMNS)) if len(self) \
            else np.zeros((0, len(ROW_COLUMNS)), np.int64)

    def path(self, row: int) -> tuple:
        return self.ops[self.op_of[row]][0]

    def describe(self, row: int) -> str:
        """Row ``row``'s message: its operation's description and what the row does there."""
        text = self.ops[self.op_of[row]][1]
        note = self.note[row]
        if not note:
            return text
        base = row * len(ROW_COLUMNS)
        sp, rp = self.cols[base + 3], self.cols[base + 4]
        return f"{text} {NOTES[note]} {sp if sp >= 0 else rp}"


def write_rows(rd: PlanReader, layout: PlanLayout, blocks: PlanBlocks, flow: DataFlow, conns: Connections,
               gpus: list) -> tuple[RowTable, list]:
    """Every block's rows in order, the put channels set, and the dependencies the plan's
    synchronisation carries."""
    table = RowTable()
    order = SyncOrder(rd, gpus)
    builder = RowBuilder(rd, layout, flow, conns, table, order)
    for r, ti, ops in blocks.tbs:
        before = len(table)
        for pos, (p, op) in enumerate(ops):
            builder.operation(r, ti, pos, p, op)
        if len(table) == before:
            # a block that only synchronises (or has no operations) moves no data: a NOP keeps
            # its place, so the program's thread blocks stay the plan's
            at = ops[0][0] if ops else ("gpus", r, "threadblocks", ti)
            table.add(r, ti, Op.NOP, at, f"rank {r} thread block {ti}")
    _set_put_channels(rd, blocks, flow, table)
    return table, order.deps(builder.pk_deps)


def _set_put_channels(rd: PlanReader, blocks: PlanBlocks, flow: DataFlow, table: RowTable) -> None:
    """Put-message channels (set when their receive was placed)."""
    for r, ti, ops in blocks.tbs:
        for pos, (p, op) in enumerate(ops):
            for kind, s in flow.emit_at.get((r, ti, pos), []):
                if kind == "send":
                    if s.channel is None:
                        raise rd.err(s.path, f"rank {r} sends to rank {s.peer}, but rank {s.peer} "
                                                f"never receives it (no matching wait or packet read)")
                    table.set_channel(s.row, s.channel)


class RowBuilder:
    """The rows of one operation at a time, from what the first pass found (``flow``)."""

    def __init__(self, rd: PlanReader, layout: PlanLayout, flow: DataFlow, conns: Connections, table: RowTable,
                 order: SyncOrder):
        self.rd, self.layout, self.flow, self.conns, self.order = rd, layout, flow, conns, order
        self.region = layout.region
        self.add = table.add
        self.nsig = defaultdict(int)       # (rank, type, channel) -> signals written so far
        self.pk_deps = []                  # (reader row, packet write): flags order them

    def operation(self, r, ti, pos, p, op):
        """One operation's rows: receives its waits announce, sends of data peers read at its
        signals, its local data movement, its own sends, NOPs where it passes a semaphore or barrier."""
        name = op.name
        desc = f"rank {r} thread block {ti} operation {pos} ({name})"
        self.receives_at_wait(r, ti, pos, p, desc)
        if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.t == "port"):
            self.sends_at_signal(r, ti, p, op, desc)
        self.local(r, ti, pos, p, op, desc)
        for kind, what in self.flow.emit_at.get((r, ti, pos), []):
            if kind == "send":
                s = what
                s.row = self.add(r, ti, Op.SEND, p, desc, sp=s.peer, note=SENDING,
                                 ch=-1, sb=s.sb, so=s.so, n=s.n)
        self.order.note(self.add, r, ti, p, op, desc)

    def receives_at_wait(self, r, ti, pos, p, desc):
        """Receives announced by a wait."""
        chans = self.layout.chans
        for kind, what in self.flow.emit_at.get((r, ti, pos), []):
            if kind == "wait":
                t, c, k = what
                partner = self.layout.pair.get((r, t, c))
                if partner is None:
                    raise self.rd.err(p, f"rank {r}'s {t} channel {c} has no partner channel on rank "
                                         f"{chans[r][t][c]}")
                peer = chans[r][t][c]
                grp = self.flow.groups.get((peer, t, partner[0]), [])
                if k < len(grp):
                    for s in grp[k]:
                        b, i, n = s.dst
                        ch = self.conns.number(s.key + (s.tb, ti))
                        s.channel = ch
                        self.add(r, ti, Op.RECV, p, desc, rp=peer, ch=ch, note=RECEIVING,
                                 db=b, do=i, n=n)

    def sends_at_signal(self, r, ti, p, op, desc):
        """Sends reading a peer's announced data at this signal."""
        for c in op.ids:
            t = op.t
            k = self.nsig[(r, t, c)]
            self.nsig[(r, t, c)] += 1
            for rr in self.flow.sig_reads.get((r, t, c, k), []):
                b, i, n = rr.src
                rr.send_row = self.add(r, ti, Op.SEND, p, desc, note=SENDING,
                                       sp=rr.rank, ch=rr.channel, sb=b, so=i, n=n)

    def local(self, r, ti, pos, p, op, desc):
        """Local data operations, remote reads and packet reads of one operation."""
        ref = self.region
        name = op.name
        if name in ("copy",):
            s = ref(op, op.src[0], p + ("src_buff", 0), r)
            d = ref(op, op.dst[0], p + ("dst_buff", 0), r)
            self.add(r, ti, Op.COPY, p, desc, sb=s[1], so=s[2], db=d[1], do=d[2], n=s[3])
            return
        if name in ("re", "res"):
            srcs = [ref(op, s, p + ("src_buff", j), r) for j, s in enumerate(op.src)]
            d = ref(op, op.dst[0], p + ("dst_buff", 0), r)
            if any(s[0] != r for s in srcs):
                raise self.rd.err(p, f"'{name}' reduces local buffers only")
            self.reduce_local(r, ti, p, desc, srcs, d)
            return
        if name in ("get", "rre", "rres"):
            self.remote_reads(r, ti, pos, p, op, desc)
            return
        if name == "cpkt":
            sr = ref(op, op.src[0], p + ("src_buff", 0), r)
            q = ref(op, op.dst[0], p + ("dst_buff", 0), r)
            self.flow.local_pk_by[(r, ti, pos)].pk_row = self.add(r, ti, Op.COPY, p, desc, sb=sr[1], so=sr[2],
                                                                  db=Buf.SCRATCH, do=self.layout.PK + q[2],
                                                                  n=sr[3])
            return
        if name == "ppkt" and op.t == "port":
            name = "rppkt"            # packets of its own scratch, put as they are
        if name in PACKET_READS:
            self.packet_reads(r, ti, pos, p, op, desc, name)

    def remote_reads(self, r, ti, pos, p, op, desc):
        """``get`` receives what it reads; ``rre``/``rres`` reduce each peer's region into place."""
        ref = self.region
        mine = self.flow.reads_at.get((r, ti, pos), [])
        if op.name == "get":
            for x in mine:
                d = ref(op, op.dst[x.j], p + ("dst_buff", x.j), r)
                self.add(r, ti, Op.RECV, p, desc, rp=x.peer, ch=x.channel, note=READING,
                         db=d[1], do=d[2], n=d[3])
            return
        s0 = ref(op, op.src[0], p + ("src_buff", 0), r)
        d = ref(op, op.dst[0], p + ("dst_buff", 0), r)
        acc = s0
        for x in mine:
            self.add(r, ti, Op.RECV_REDUCE_COPY, p, desc, rp=x.peer, note=READING,
                     ch=x.channel, sb=acc[1], so=acc[2], db=d[1], do=d[2], n=d[3])
            acc = d

    def packet_reads(self, r, ti, pos, p, op, desc, name):
        """An operation reading packets of its own scratch (``name``: ``rppkt`` for a port ppkt):
        each source region in the pieces packets were written in, received, copied or reduced."""
        ref, PK = self.region, self.layout.PK
        srcs = op.src
        first_pk = PACKET_READS[name]
        last = first_pk + 1 if name == "rppkt" else len(srcs)
        d = None if name == "rppkt" else ref(op, op.dst[0], p + ("dst_buff", 0), r)
        acc = None if first_pk == 0 else ref(op, srcs[0], p + ("src_buff", 0), r)
        for j in range(first_pk, last):
            q = ref(op, srcs[j], p + ("src_buff", j), r)
            for lo, n, s in self.packet_pieces(r, q, p + ("src_buff", j)):
                self.read_piece(r, ti, p, desc, lo - q[2], PK + lo, n, s, d, acc)
            if d is not None and acc is not None:
                acc = d
        if name in ("recpkt", "recspkt"):
            q = ref(op, op.dst[1], p + ("dst_buff", 1), r)
            self.flow.local_pk_by[(r, ti, pos)].pk_row = self.add(r, ti, Op.COPY, p, desc, sb=d[1], so=d[2],
                                                                  db=Buf.SCRATCH, do=PK + q[2], n=d[3])

    def packet_pieces(self, r, q, path):
        """The packet writes that make up region ``q`` of rank ``r``'s packet scratch, in order;
        a region that is not exactly such writes is refused at ``path``."""
        lst, los = self.flow.packet_writes.get(r, []), self.flow.pk_los.get(r, [])
        end = q[2] + q[3]
        pieces = []
        # the writes are disjoint and sorted: only the one before the first that starts
        # inside the read may reach into it
        for lo, n, s in lst[max(bisect_left(los, q[2]) - 1, 0):bisect_left(los, end)]:
            if lo + n <= q[2]:
                continue
            if lo >= q[2] and lo + n <= end:
                pieces.append((lo, n, s))
            elif s.local:
                # part of packets this rank wrote itself (a thread-block group's share of
                # them): each packet's own flag makes the read wait for it
                a, b = max(lo, q[2]), min(lo + n, end)
                pieces.append((a, b - a, s))
        cover = q[2]
        for lo, n, s in pieces:
            if lo != cover:
                break
            cover += n
        if cover != q[2] + q[3]:
            raise self.rd.err(path, f"packets [{q[2]}, {q[2] + q[3]}) of rank {r}'s scratch are "
                                    f"not exactly the regions packets are written into")
        return pieces

    def read_piece(self, r, ti, p, desc, off, slot, n, s, d, acc):
        """One packet write ``s`` read at offset ``off`` of the read (its packets in scratch
        ``slot``): received where first read (into its place when one operation reads it), waited
        for where another block wrote it, then copied or reduced into ``d`` (with ``acc``)."""
        if not s.local and not s.received:
            s.channel = self.conns.number(("pkt", s.rank, r, id(s)))      # packets: a connection each
            s.received = True
            if d is not None and s.readers == 1:
                if acc is None:
                    self.add(r, ti, Op.RECV, p, desc, rp=s.rank, note=FROM,
                             ch=s.channel, db=d[1], do=d[2] + off, n=n)
                else:
                    self.add(r, ti, Op.RECV_REDUCE_COPY, p, desc, rp=s.rank, note=FROM,
                             ch=s.channel, sb=acc[1], so=acc[2] + off, db=d[1], do=d[2] + off, n=n)
                return
            s.pk_row = self.add(r, ti, Op.RECV, p, desc, rp=s.rank, note=FROM,
                                ch=s.channel, db=Buf.SCRATCH, do=slot, n=n)
            s.tb_in = ti
        elif (s.tb_in if s.tb_in is not None else s.tb if s.local else None) != ti:
            # packets another block wrote here: their flags make this read wait for them
            self.pk_deps.append((self.add(r, ti, Op.NOP, p, desc), s))
        if d is None:
            return            # rppkt: its sends read the slot
        if acc is None:
            self.add(r, ti, Op.COPY, p, desc, sb=Buf.SCRATCH, so=slot, db=d[1], do=d[2] + off, n=n)
        else:
            self.reduce_local(r, ti, p, desc, [(r, acc[1], acc[2] + off, n), (r, Buf.SCRATCH, slot, n)],
                              (r, d[1], d[2] + off, n))

    def reduce_local(self, r, ti, p, desc, srcs, d):
        """dst := src0 (+) src1 (+) ... as COPY / REDUCE primitives."""
        n = srcs[0][3]
        others = list(srcs)
        if any(s[1:3] == d[1:3] for s in srcs):
            others.remove(next(s for s in srcs if s[1:3] == d[1:3]))
        else:
            first = others.pop(0)
            self.add(r, ti, Op.COPY, p, desc, sb=first[1], so=first[2], db=d[1], do=d[2], n=n)
        for s in others:
            self.add(r, ti, Op.REDUCE, p, desc, sb=s[1], so=s[2], db=d[1], do=d[2], n=n)


__all__ = ["NOTES", "ROW_COLUMNS", "RowTable", "RowBuilder", "write_rows"]
