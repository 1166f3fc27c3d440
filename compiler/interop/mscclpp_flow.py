"""Where an MSCCL++ plan's data goes (the import's first pass over the operations).

Every operation is visited in its block's order and noted where it matters to the receiving end:

* a put into a peer (a memory channel's ``put``/``pws``/``pwsf``, a port channel's, the remote
  outputs of ``res``/``rres``) waits in a signal group until the signal that announces it: the
  block's next signal to that peer on a memory channel (its fence publishes every earlier write),
  the next on its own channel on a port channel (the proxy keeps one order per channel), or across
  a barrier the signal another block sends after it;
* packets (``ppkt``, ``respkt``, ``recspkt``, ``rppkt``) are sent in the pieces their readers cut
  them into, and packets a rank writes into its own scratch (``cpkt``, ``recpkt``) are noted;
* a read of a peer's buffer (``get``, ``rre``, ``rres``) belongs to the peer's signal matching the
  reader's latest wait towards it (waits handed over by a semaphore count too).

The rows themselves are written by :mod:`hccc.compiler.interop.mscclpp_rows`, from a
:class:`DataFlow` and the :class:`Connections` numbered on the way.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, replace

from hccc.compiler.interop.mscclpp_blocks import PlanBlocks
from hccc.compiler.interop.mscclpp_layout import PlanLayout
from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.ir.program_ir import Buf

#: operations that read packets from the rank's own scratch (which sources: from this one on)
PACKET_READS = {"upkt": 0, "repkt": 1, "respkt": 1, "recpkt": 1, "recspkt": 1, "rppkt": 0}


@dataclass(slots=True, eq=False)
class Write:
    """Data a thread block writes into a peer's buffer (a put's or a packet operation's send:
    ``peer``, the source ``sb``/``so``, ``n`` chunks, the destination ``dst`` = (buffer, index,
    n)), or packets it writes into its own scratch (``local``). What the passes after find is set
    on it: the connection it is announced on (``key``), its channel, its row, its packet readers.
    A record per write with slots (a plan's hundreds of thousands of them took a dict each);
    compared by identity."""
    rank: int
    tb: int
    path: tuple
    pos: int = -1
    sb: int = 0
    so: int = 0
    n: int = 0
    peer: int = -1
    dst: tuple = ()
    local: bool = False
    key: tuple | None = None          # the connection it is announced on (a signal's, a barrier's)
    channel: int | None = None        # set where its receive is placed
    row: int | None = None            # its SEND row
    readers: int = 1                  # packets: the operations reading the region (1 unless counted)
    received: bool = False            # packets: received already (by the first reader)
    pk_row: int | None = None         # packets: the row that puts them in place
    tb_in: int | None = None          # packets: the block that received them


@dataclass(slots=True, eq=False)
class Read:
    """A read of a peer's buffer (``get``, the remote inputs of ``rre``/``rres``): the reader's
    block and position, the ``peer`` read, the reader's latest ``wait`` towards it (type,
    channel, k), the region read (``src``), the operand ``j``; its channel and SEND row (on the
    peer) set by the passes after."""
    rank: int
    tb: int
    pos: int
    peer: int
    wait: tuple
    src: tuple
    path: tuple
    j: int
    channel: int | None = None
    send_row: int | None = None


class Connections:
    """One ProgramIR connection per (kind, sender, receiver, type, channel, sending and receiving
    thread blocks): a subsequence of the channel's messages, in their order; numbered per
    (sender, receiver) in the order first asked for."""

    def __init__(self):
        self.chan_no: dict[tuple, int] = {}
        self.between: dict[tuple, int] = defaultdict(int)   # (sender, receiver) -> connections so far

    def number(self, key: tuple) -> int:
        if key not in self.chan_no:
            self.chan_no[key] = self.between[key[1:3]]
            self.between[key[1:3]] += 1
        return self.chan_no[key]


def trace_data(rd: PlanReader, layout: PlanLayout, blocks: PlanBlocks, conns: Connections) -> "DataFlow":
    """The first pass: every operation placed, packet writes cut at their readers' bounds, every put
    announced and every remote read tied to the signal it follows (refused where none is)."""
    flow = DataFlow(rd, layout, blocks)
    for r, ti, ops in blocks.tbs:
        for pos, (p, op) in enumerate(ops):
            flow.place(r, ti, pos, p, op)
    cut_packet_writes(rd, flow.packet_writes, flow.packet_reads, flow.local_pk, flow.emit_at)
    flow.pk_los = count_packet_readers(flow.packet_writes, flow.pk_readers)
    announce_across_barriers(flow.pending, flow.mem_signals, flow.bar_pass, flow.bar_members)
    for key, lst in flow.pending.items():
        if lst:
            raise rd.err(lst[0].path, f"rank {key[0]} puts into rank {lst[0].peer} without a signal "
                                      f"after it: the peer cannot know when the data is there")
    flow.attach_reads(conns)
    return flow


class DataFlow:
    """What the first pass finds, per operation: the rows to emit at it (``emit_at``: sends, and
    the waits whose receives it places), the signal groups (``groups``), the packet writes into
    each rank's scratch (``packet_writes``, sorted, with ``pk_los`` their starts), the local packet
    writes (``local_pk_by``), the remote reads by reader (``reads_at``) and by signal
    (``sig_reads``)."""

    def __init__(self, rd: PlanReader, layout: PlanLayout, blocks: PlanBlocks):
        self.rd, self.layout = rd, layout
        self.sem_init, self.tb_chans = blocks.sem_init, blocks.tb_chans
        self.chans = layout.chans
        self.pending = defaultdict(list)         # announcing key -> puts waiting for their signal
        self.mem_signals = defaultdict(list)     # (rank, tb) -> [(pos, peer, channel, its group)]
        self.bar_pass = defaultdict(list)        # (rank, tb) -> [(pos, (barrier id, k-th pass))]
        self.bar_members = defaultdict(list)     # (rank, barrier id, k) -> blocks passing it
        self.bar_uses = defaultdict(int)
        self.groups = defaultdict(list)          # (rank, type, channel) -> [the sends of each signal]
        self.sig_tb = defaultdict(list)          # (rank, type, channel) -> thread block of each signal
        self.nwait = defaultdict(int)
        self.emit_at: dict[tuple, list] = defaultdict(list)  # (rank, tb, op position) -> rows to emit there
        self.packet_writes = defaultdict(list)               # receiver -> [(lo, n, send)]
        self.packet_reads = defaultdict(set)                 # reader -> boundaries of the packet regions it reads
        self.local_pk = defaultdict(list)                    # rank -> packets it writes into its own scratch
        self.pk_readers = defaultdict(list)
        self.pk_los: dict = {}
        self.local_pk_by = {}                                # (rank, tb, op) -> its local packet write
        self.reads = []                                      # remote reads: (rank, tb, pos, peer, wait key, region)
        self.last_wait = {}
        self.waits_of = defaultdict(dict)                    # (rank, tb) -> {peer: its latest wait towards it}
        self.sem_waits = defaultdict(list)                   # (rank, semaphore) -> waits handed over per release
        self.sem_acquired = defaultdict(int)
        self.sig_reads = defaultdict(list)
        self.reads_at = defaultdict(list)            # (rank, tb, op position) -> its remote reads, in order

    def place(self, r, ti, pos, p, op):
        """Where one operation's data goes, and the synchronisation it counts."""
        name, t, ids = op.name, op.t, op.ids
        if name in ("put", "pws", "pwsf", "res", "rres", "ppkt", "respkt", "recspkt", "rppkt"):
            first_remote = {"res": 1, "rres": 1, "respkt": 1, "recspkt": 2}.get(name, 0)
            for j, ref in enumerate(op.dst[first_remote:], start=first_remote):
                self.put(r, ti, pos, p, op, j, first_remote, ref)
            if name in ("pws", "pwsf") and t == "port":
                for c in ids:
                    self.signal(r, t, c, ti)
        if name in ("signal", "rlxsignal"):
            for c in ids:
                self.signal(r, t, c, ti)
                if t == "memory":
                    self.mem_signals[(r, ti)].append((pos, self.chans[r][t][c], c, self.groups[(r, t, c)][-1]))
        if name in ("sem_release", "sem_acquire"):
            self.hand_over_waits(r, ti, op)
        if name == "barrier":
            bkey = (op.barrier_id, self.bar_uses[(r, ti, op.barrier_id)])
            self.bar_uses[(r, ti, op.barrier_id)] += 1
            self.bar_pass[(r, ti)].append((pos, bkey))
            self.bar_members[(r,) + bkey].append(ti)
        if name in ("wait", "rlxwait"):
            for c in ids:
                k = self.nwait[(r, t, c)]
                self.nwait[(r, t, c)] += 1
                self.last_wait[(r, ti, self.chans[r][t][c])] = (t, c, k)
                self.waits_of[(r, ti)][self.chans[r][t][c]] = (t, c, k)
                self.emit_at[(r, ti, pos)].append(("wait", (t, c, k)))
        self.packet_places(r, ti, pos, p, op)

    def signal(self, r, t, c, ti):
        """A signal on channel ``c``: it announces the puts waiting for it."""
        peer = self.chans[r][t][c]
        sent = self.pending.pop((r, ti, peer) if t == "memory" else (r, ti, peer, c), [])
        for s in sent:
            s.key = ("put", r, peer, t, c)
        self.groups[(r, t, c)].append(sent)
        self.sig_tb[(r, t, c)].append(ti)

    def hand_over_waits(self, r, ti, op):
        """A block's waits so far count for a block that acquires a semaphore it releases (the
        ``k``-th acquire after the ``k``-th release): that block may read the peers the waits were
        towards (a pipeline's reduce after a copy block's signal and wait)."""
        for s in op.semaphore_ids:
            if op.name == "sem_release":
                self.sem_waits[(r, s)].append(dict(self.waits_of[(r, ti)]))
                continue
            k = self.sem_acquired[(r, s)] - self.sem_init[r][s]
            self.sem_acquired[(r, s)] += 1
            if 0 <= k < len(self.sem_waits[(r, s)]):
                for peer, w in self.sem_waits[(r, s)][k].items():
                    self.last_wait.setdefault((r, ti, peer), w)
                    self.waits_of[(r, ti)].setdefault(peer, w)

    def put(self, r, ti, pos, p, op, j, first_remote, ref):
        """The send of one remote destination ``j`` of a put or packet operation."""
        rd, name, t, ids = self.rd, op.name, op.t, op.ids
        region = self.layout.region
        dsts, srcs = op.dst, op.src
        if ref.buffer_id is None:
            raise rd.err(p + ("dst_buff", j), f"'{name}' writes a peer's buffer: a buffer_id is needed")
        peer, buf, idx, n = region(op, ref, p + ("dst_buff", j), r)
        port_pkt = name == "ppkt" and t == "port"
        if port_pkt and (not srcs or srcs[0].type != "s"):
            raise rd.err(p, "a port-channel ppkt sends packets already in the source buffer: "
                            "only packets of the rank's scratch are modelled")
        if name == "rppkt" or port_pkt:       # forwards the packets of its own scratch region
            _, _, qi, qn = region(op, srcs[0], p + ("src_buff", 0), r)
            sb, so, sn = Buf.SCRATCH, self.layout.PK + qi, qn
            if sn != n:
                raise rd.err(p, "source and destination sizes differ")
        elif name in ("put", "pws", "pwsf", "ppkt"):
            s = srcs[j] if j < len(srcs) else srcs[0] if srcs else None
            if s is None:
                raise rd.err(p, f"'{name}' without a source")
            _, sb, so, sn = region(op, s, p + ("src_buff", min(j, len(srcs) - 1)), r)
            if sn != n:
                raise rd.err(p, "source and destination sizes differ")
        else:
            _, sb, so, sn = region(op, dsts[0], p + ("dst_buff", 0), r)
        c = self.channel_to(r, t, ids, j - first_remote, peer, p, ti)
        send = Write(r, ti, p, pos=pos, sb=sb, so=so, n=n, peer=peer, dst=(buf, idx, n))
        self.emit_at[(r, ti, pos)].append(("send", send))
        if name in ("ppkt", "respkt", "recspkt", "rppkt"):
            if t != "memory" and name not in ("rppkt", "ppkt"):
                raise rd.err(p, f"'{name}' over a port channel is not modelled")
            self.packet_writes[peer].append((idx, n, send))
        else:
            # a memory put is announced by the block's next signal to that peer (the
            # signal's fence publishes every earlier write of the block); a port put
            # by the next signal on its own channel (the proxy keeps one order per channel)
            self.pending[(r, ti, peer) if t == "memory" else (r, ti, peer, c)].append(send)

    def channel_to(self, r, t, ids, j, peer, p, ti):
        """The channel an operation writing ``peer``'s buffer goes through: the one it names (which
        must lead to ``peer``), else for a memory channel none is needed, for a port channel the
        thread block's only one to ``peer``."""
        if j < len(ids):
            c = ids[j]
            if self.chans[r][t][c] != peer:
                raise self.rd.err(p + ("channel_ids",), f"{t} channel {c} of rank {r} leads to rank "
                                                        f"{self.chans[r][t][c]}, not to rank {peer} whose buffer "
                                                        f"the operation writes")
            return c
        if t == "memory":
            return None
        cands = {c for c in self.tb_chans[(r, ti)].get(t, []) if self.chans[r][t][c] == peer}
        if len(cands) != 1:
            raise self.rd.err(p, f"which {t} channel to rank {peer} this operation uses is not said")
        return cands.pop()

    def packet_places(self, r, ti, pos, p, op):
        """The packet regions an operation reads, the packets it writes into its own scratch, and
        its reads of a peer's buffer (after the block's latest wait towards that peer)."""
        rd, name, t = self.rd, op.name, op.t
        region = self.layout.region
        if name in PACKET_READS or (name == "ppkt" and t == "port"):
            srcs = op.src
            name = "rppkt" if name == "ppkt" else name
            for j in range(PACKET_READS[name], min(len(srcs), PACKET_READS[name] + (1 if name == "rppkt"
                                                                                      else len(srcs)))):
                _, _, idx, n = region(op, srcs[j], p + ("src_buff", j), r)
                self.packet_reads[r].update((idx, idx + n))
                self.pk_readers[r].append((idx, idx + n))
        if name in ("cpkt", "recpkt", "recspkt"):
            k = 0 if name == "cpkt" else 1
            _, _, idx, n = region(op, op.dst[k], p + ("dst_buff", k), r)
            w = Write(r, ti, p, local=True)
            self.local_pk[r].append((idx, n, w))
            self.local_pk_by[(r, ti, pos)] = w
        if name in ("get", "rre", "rres"):
            srcs = op.src
            first = 0 if name == "get" else 1
            for j, ref in enumerate(srcs[first:], start=first):
                if ref.buffer_id is None:
                    raise rd.err(p + ("src_buff", j), f"'{name}' reads a peer's buffer: a buffer_id is needed")
                peer, buf, idx, n = region(op, ref, p + ("src_buff", j), r)
                w = self.last_wait.get((r, ti, peer))
                if w is None:
                    raise rd.err(p, f"rank {r} reads rank {peer}'s buffer without first waiting for a "
                                    f"signal from it in this thread block")
                self.reads.append(Read(r, ti, pos, peer, w, (buf, idx, n), p, j))

    def attach_reads(self, conns: Connections):
        """The signal a read belongs to: the peer's k-th signal on the partner channel."""
        rd = self.rd
        for x in self.reads:
            self.reads_at[(x.rank, x.tb, x.pos)].append(x)
        for rd_ in self.reads:
            t, c, k = rd_.wait
            partner = self.layout.pair.get((rd_.rank, t, c))
            if partner is None:
                raise rd.err(rd_.path, "the channel of the wait before this read has no partner")
            sigs = self.sig_tb.get((rd_.peer, t, partner[0]), [])
            if k >= len(sigs):
                raise rd.err(rd_.path, f"rank {rd_.rank} reads rank {rd_.peer}'s buffer after a wait "
                                       f"rank {rd_.peer} never signals")
            rd_.channel = conns.number(("read", rd_.peer, rd_.rank, t, partner[0], sigs[k], rd_.tb))
            self.sig_reads[(rd_.peer, t, partner[0], k)].append(rd_)


def cut_packet_writes(rd: PlanReader, packet_writes: dict, packet_reads: dict, local_pk: dict, emit_at: dict) -> None:
    """A packet write read in parts (by several operations) is sent in those parts (its send in
    ``emit_at`` replaced by theirs); packet writes into one region by two operations are refused.
    ``packet_writes[peer]`` ends as every write into the peer's scratch, local ones included,
    sorted by start."""
    for peer, writes in list(packet_writes.items()):
        cuts = sorted(packet_reads.get(peer, set()))
        parts = []
        for lo, n, send in writes:
            bounds = [lo] + cuts[bisect_right(cuts, lo):bisect_left(cuts, lo + n)] + [lo + n]
            if len(bounds) == 2:
                parts.append((lo, n, send))
                continue
            pieces = []
            for a, b in zip(bounds, bounds[1:]):
                piece = replace(send, so=send.so + (a - lo), n=b - a, dst=(send.dst[0], a, b - a))
                pieces.append(piece)
                parts.append((a, b - a, piece))
            at = emit_at[(send.rank, send.tb, send.pos)]
            k = next(i for i, e in enumerate(at) if e[1] is send)
            at[k:k + 1] = [("send", x) for x in pieces]
        parts += local_pk.pop(peer, [])
        parts.sort(key=lambda x: x[0])
        for (a, n, s1), (b, _, s2) in zip(parts, parts[1:]):
            if b < a + n:
                raise rd.err(s2.path, f"rank {s2.rank} puts packets into rank {peer}'s scratch where rank "
                                      f"{s1.rank} puts packets too: which one a read sees is not fixed")
        packet_writes[peer] = parts
    for peer, parts in local_pk.items():
        packet_writes[peer] = sorted(parts, key=lambda x: x[0])


def count_packet_readers(packet_writes: dict, pk_readers: dict) -> dict:
    """Each packet write's ``readers``, and the starts of each rank's packet writes (returned).

    A packet region read by one operation is received into that operation's place; one read by
    several is received into the scratch (at PK + index) by the first and read there (parts never
    straddle a read's bounds, which cut them: the parts a read covers are those starting inside it)."""
    pk_los = {}
    for peer, parts in packet_writes.items():
        los = [lo for lo, _, _ in parts]
        pk_los[peer] = los
        for _, _, w in parts:
            w.readers = 0
        for a, b in pk_readers.get(peer, []):
            for k in range(bisect_left(los, a), bisect_left(los, b)):
                lo, n, w = parts[k]
                if lo + n <= b:
                    w.readers += 1
    return pk_los


def announce_across_barriers(pending, mem_signals, bar_pass, bar_members):
    """Memory-channel puts a block never signals itself (a thread-block group's parts): the
    first barrier the block passes after the put orders it before what the other blocks of
    that barrier do after it, so the signal to the same peer that one other block sends first
    after the barrier announces it (the signal's fence publishes what the barrier ordered
    before it). Several blocks signalling that peer after the barrier: which one announces
    the put is not fixed, and it stays unannounced (refused)."""
    for key in [k for k, lst in pending.items() if lst and len(k) == 3]:
        r, ti, peer = key
        left = []
        for snd in pending[key]:
            after = [(pos, bk) for pos, bk in bar_pass.get((r, ti), []) if pos > snd.pos]
            if not after:
                left.append(snd)
                continue
            bk = after[0][1]
            found = []
            for tj in bar_members.get((r,) + bk, []):
                if tj == ti:
                    continue
                at = next(pos for pos, k in bar_pass[(r, tj)] if k == bk)
                sig = next((x for x in mem_signals.get((r, tj), []) if x[0] > at and x[1] == peer), None)
                if sig is not None:
                    found.append(sig)
            if len(found) != 1:
                left.append(snd)
                continue
            _, _, c, group = found[0]
            snd.key = ("put", r, peer, "memory", c)
            group.append(snd)
        pending[key] = left


__all__ = ["Connections", "DataFlow", "PACKET_READS", "Read", "Write", "trace_data", "cut_packet_writes", "count_packet_readers",
           "announce_across_barriers"]
