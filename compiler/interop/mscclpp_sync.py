"""The MSCCL++ executor's synchronisation, checked on a plan: every wait satisfied, nothing races.

The importer (:mod:`hccc.compiler.interop.mscclpp_import`) proves what a plan computes from where
its data moves; this module checks that the executor runs it at all, with the executor's own
semantics (its device kernel: ``execution_kernel.hpp``):

* **counts**: a ``signal`` (``rlxsignal``; a port channel's ``pws``/``pwsf``) on a channel raises
  the inbound count of the partner end (the ``k``-th channel rank A lists to B pairs with the
  ``k``-th B lists to A); a ``wait`` (``rlxwait``) on an end returns once the inbound count exceeds
  the waits already done there. A device semaphore is a counter from its ``init_value``:
  ``sem_release`` adds one, ``sem_acquire`` waits for a positive value and takes one. A
  ``barrier`` returns once ``num_threadblocks`` blocks of the rank arrived at that barrier id. An
  LL packet read waits for the flags of this call on every packet of its region.
* **one call**: every thread block is run in program order, each as far as it can, until none
  moves (an event-driven fixed point: a block blocked on something is looked at again only when
  that thing changes, so the work is linear in the operations). Since every channel end is waited
  on by one thread block at a time and every semaphore acquired by one (the importer refuses the
  rest), the order the blocks move in does not change the outcome: a block left over deadlocks in
  every schedule. A plan must also leave every count as it found it: a signal nobody waits for
  this call would satisfy a wait of the next call early (a race), a release nobody acquires the
  same.
* **races inside a thread block**: waits, signals and semaphore operations run on the block's
  first threads only, and a data operation spreads over all threads; only a ``nop``
  (``__syncthreads``) or ``barrier`` orders them. So a wait or acquire directly followed by a data
  operation, a data operation directly followed by a signal, release or port-channel put (posted by
  the first threads), and two data operations on the same bytes with nothing between them race.
  MSCCL++'s own DSL inserts these ``nop``\\ s.

* **the next call** (:func:`check_next_call`): on the happens-before of the run above, a write
  into a peer's scratch must follow, through some rank's calls, every access of those bytes in
  the call before (two calls before with a double scratch buffer).

A pipeline's body counts once (both ends of a channel iterate over the same sizes), as in the
import. Refusals are :class:`~hccc.util.diagnostics.CompileError` located at the operation.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict, deque

#: run by the first threads only; a later data operation must not start before they finished
ACQUIRE = frozenset({"wait", "rlxwait", "sem_acquire"})
#: run by the first threads only; they must not start before the data operations before them
RELEASE = frozenset({"signal", "rlxsignal", "sem_release", "flush"})
#: operations that order the whole block
SYNC = frozenset({"nop", "barrier"})
#: packet reads of the rank's own scratch: the first packet source (``rppkt`` reads only that one)
PACKET_READ_FROM = {"upkt": 0, "repkt": 1, "respkt": 1, "recpkt": 1, "recspkt": 1, "rppkt": 0}
#: operations writing packets into a peer's scratch: their first remote destination
PACKET_PUT_FROM = {"ppkt": 0, "respkt": 1, "recspkt": 2, "rppkt": 0}
#: operations writing packets into the rank's own scratch: which destination
PACKET_LOCAL_DST = {"cpkt": 0, "recpkt": 1, "recspkt": 1}


def _kind(name: str, ctype: str) -> str:
    if name in SYNC:
        return "sync"
    if name in ACQUIRE:
        return "acquire"
    if name in RELEASE or (name in ("put", "pws", "pwsf") and ctype == "port"):
        return "release"
    return "data"


def _is_port_ppkt(name, op):
    return name == "ppkt" and op.t == "port"


def _data_access(name, op, p, r, region):
    """The regions a data operation reads and writes with all the block's threads, as the race
    check compares them (packets carry their own flags, so packet regions are left out)."""
    src = [region(op, x, p + ("src_buff", j), r) for j, x in enumerate(op.src)]
    dst = [region(op, x, p + ("dst_buff", j), r) for j, x in enumerate(op.dst)]
    if name == "ppkt" or name == "cpkt":
        return src, []
    if name == "upkt":
        return [], dst
    if name == "rppkt":
        return [], []
    if name in ("repkt", "respkt", "recpkt", "recspkt"):
        return src[:1], dst[:1]
    return src, dst


#: packet operations whose thread ``t`` moves payload ``t``, ``t + blockDim``, ... of every buffer
#: it names, counted from each buffer's start (the executor's ``upkt``, ``repkt``, ``respkt``,
#: ``recpkt``, ``recspkt`` loops, and ``copyToPackets`` under ``cpkt`` and a memory ``ppkt``)
PER_PAYLOAD = {"upkt", "repkt", "respkt", "recpkt", "recspkt", "cpkt", "ppkt"}


def _per_payload(name, op) -> bool:
    return name in PER_PAYLOAD and not _is_port_ppkt(name, op)


def _overlap(a, b, same_thread: bool = False) -> bool:
    """Whether a region of ``a`` and one of ``b`` share bytes; with ``same_thread`` (two
    per-payload packet operations in a row) regions that start at the same byte are moved by the
    same thread in both operations, so only overlaps that start apart count."""
    return any(x[0] == y[0] and x[1] == y[1] and x[2] < y[2] + y[3] and y[2] < x[2] + x[3]
               and not (same_thread and x[2] == y[2]) for x in a for y in b)


def _echo(prev, op, dst, r, region) -> bool:
    """Whether ``upkt`` ``op`` writes back, at destination region ``dst``, exactly the values the
    operation ``prev`` before it (``cpkt``, ``recpkt``, ``recspkt``) holds at the same place: it
    unpacks packets ``prev`` packed from (``cpkt``: its source) or alongside (its reduced
    destination) that region. Each payload's packet is written after its value was read or
    written, and ``upkt`` waits for the packet, so whichever thread's store lands last, the bytes
    hold that one value (as MSCCL++'s own hierarchical ReduceScatter writes it)."""
    (pp, pop), (up, uop) = prev, op
    pname = pop.name
    k = PACKET_LOCAL_DST[pname]
    side, j = ("src_buff", 0) if pname == "cpkt" else ("dst_buff", 0)
    refs = pop.src if side == "src_buff" else pop.dst
    if len(refs) <= j or len(pop.dst) <= k or not uop.src:
        return False
    plain = region(pop, refs[j], pp + (side, j), r)
    pack = region(pop, pop.dst[k], pp + ("dst_buff", k), r)
    src = region(uop, uop.src[0], up + ("src_buff", 0), r)
    if src[:2] != pack[:2] or not (pack[2] <= src[2] and src[2] + src[3] <= pack[2] + pack[3]):
        return False
    return (dst[:2] == plain[:2] and dst[3] == src[3] and dst[2] - plain[2] == src[2] - pack[2]
            and plain[3] == pack[3])


def check_races(tbs, region, err) -> None:
    """Refuse a first-threads operation and a data operation, or two data operations on the same
    bytes, that follow each other in a thread block with no ``nop`` or ``barrier`` between them.
    A pipeline body is also checked across its wrap (its last operation, then its first). The
    operations a switch operation was rewritten into (consecutive, at its path) are one operation
    here, as the executor runs it: together against the operation before and the one after."""
    for r, ti, ops in tbs:
        prev = None
        body_start = None
        group_p, before_group = None, None     # the switch operation being read, the unit before it
        for pos, (p, op) in enumerate(ops):
            name = op.name
            cur = _kind(name, op.t)
            acc = _data_access(name, op, p, r, region) if cur == "data" else ([], [])
            per = _per_payload(name, op)
            if prev is not None and name == "upkt" and prev[2] in PACKET_LOCAL_DST:
                acc = (acc[0], [w for w in acc[1] if not _echo(ops[pos - 1], (p, op), w, r, region)])
            if op.switch:
                name = op.switch       # messages name the plan's operation, not its parts
            if p == group_p and prev is not None and cur == "data" == prev[0]:
                # one more part of the switch operation at p: its accesses join the parts before
                acc, per = (prev[1][0] + acc[0], prev[1][1] + acc[1]), False
                _race(before_group, (cur, acc, name, p, per), r, ti, err)
            else:
                before_group = prev
                _race(prev, (cur, acc, name, p, per), r, ti, err)
            group_p = p
            prev = None if cur == "sync" else (cur, acc, name, p, per)
            # a pipeline body (paths ... "ops", k, "ops", j) runs again from its start
            in_body = len(p) >= 2 and p[-2] == "ops" and len(p) >= 4 and p[-4] == "ops"
            if in_body and (body_start is None or ops[body_start][0][:-1] != p[:-1]):
                body_start = pos
            last_of_body = in_body and (pos + 1 == len(ops) or ops[pos + 1][0][:-1] != p[:-1])
            if last_of_body and prev is not None:
                bp, bop = ops[body_start]
                bname = bop.name
                bk = _kind(bname, bop.t)
                bacc = _data_access(bname, bop, bp, r, region) if bk == "data" else ([], [])
                _race(prev, (bk, bacc, bname, bp, _per_payload(bname, bop)), r, ti, err, wrap=True)
            if not in_body:
                body_start = None


def _race(prev, cur, r, ti, err, wrap=False):
    if prev is None or cur[0] == "sync":
        return
    pkind, (preads, pwrites), pname, _, pper = prev
    kind, (reads, writes), name, p, per = cur
    where = (f"rank {r} thread block {ti}: '{name}' " + ("at the start of the pipeline's next iteration "
                                                         if wrap else "") + f"directly after '{pname}'")
    if pkind == "acquire" and kind == "data":
        raise err(p, f"{where} with no 'nop' between them: the wait runs on the block's first threads, "
                     f"so the other threads read and write before it returned (a race)")
    if pkind == "data" and kind == "release":
        raise err(p, f"{where} with no 'nop' between them: the first threads signal before the other "
                     f"threads finished the data operation (a race)")
    same = pper and per
    if pkind == "data" and kind == "data" and (_overlap(pwrites, reads + writes, same)
                                              or _overlap(preads, writes, same)):
        raise err(p, f"{where} on the same bytes with no 'nop' between them: threads of one operation "
                     f"touch elements another thread of the other still uses (a race)")


def check_counts(tbs, pair, chans, region, sem_init, err, order: list | None = None) -> None:
    """Run one call of the plan on its synchronisation alone (see the module's doc): refuse a
    thread block left waiting (naming what it waits for) and a call that leaves a channel count or
    a semaphore other than it found it. ``tbs`` lists ``(rank, thread block, [(path, operation)])``
    with each operation's rank-level channel ids in ``_ids`` and its channel type in ``_t``;
    ``pair[(r, type, c)]`` is the partner end ``(channel on the peer, k)``; ``region(op, ref,
    path, r)`` resolves a buffer reference to ``(owner rank, buffer, first chunk, chunks)``;
    ``sem_init[r]`` the declared initial values; ``err(path, message)`` makes the located error.
    ``order``, when given, receives the call's happens-before graph (for :func:`check_next_call`):
    every operation ``(rank, tb, pos)`` in an order the run found (a topological order), each
    with the operations of other thread blocks it surely waits for (the signal a wait consumes,
    the releases an acquire needs whichever blocks release first, the blocks' operations before a
    barrier they pass together, the packet writes a read waits for); its block's previous
    operation precedes it too."""
    writes, write_at, signals_to = _writes_and_signals(tbs, pair, chans, region, err)
    his = _check_packet_overlaps(writes, err)
    readers_of, pending = _packet_reads(tbs, writes, his, region, err)
    run = _CallRun(tbs, pair, chans, sem_init, err, order)
    run.packets(write_at, readers_of, pending)
    run.run()
    run.check_left_over(signals_to)


def _is_signal(name, op) -> bool:
    """Whether an operation raises its channels' partner ends (a port channel's puts signal too)."""
    return name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.t == "port")


def _writes_and_signals(tbs, pair, chans, region, err):
    """Packet writes into each rank's scratch (``writes``: owner -> ``[(lo, hi, write id, path)]``;
    ``write_at``: ``(rank, tb, pos)`` -> its write ids) and the signals each receiving end gets
    per call (``signals_to``)."""
    writes = defaultdict(list)         # rank -> [(lo, hi, write id)] of its scratch
    write_at = {}                      # (rank, tb, pos) -> [write id]
    signals_to = defaultdict(int)      # receiving end -> signals the plan sends it per call
    nwrites = 0
    for r, ti, ops in tbs:
        for pos, (p, op) in enumerate(ops):
            name = op.name
            ids = []
            if name in PACKET_PUT_FROM or _is_port_ppkt(name, op):
                first = PACKET_PUT_FROM.get(name, 0)
                for j, ref in enumerate(op.dst[first:], start=first):
                    owner, _, lo, n = region(op, ref, p + ("dst_buff", j), r)
                    writes[owner].append((lo, lo + n, nwrites, p))
                    ids.append(nwrites)
                    nwrites += 1
            if name in PACKET_LOCAL_DST:
                j = PACKET_LOCAL_DST[name]
                owner, _, lo, n = region(op, op.dst[j], p + ("dst_buff", j), r)
                writes[owner].append((lo, lo + n, nwrites, p))
                ids.append(nwrites)
                nwrites += 1
            if ids:
                write_at[(r, ti, pos)] = ids
            if _is_signal(name, op):
                for c in op.ids:
                    end = _partner(r, op.t, c, pair, chans, p, err)
                    signals_to[end] += 1
    return writes, write_at, signals_to


def _check_packet_overlaps(writes, err) -> dict:
    """Refuse two packet writes into the same scratch bytes in one call (``writes`` sorted in
    place); returns each owner's write ends in that order."""
    his = {}
    for owner, lst in writes.items():
        lst.sort()
        for a, b in zip(lst, lst[1:]):
            if b[0] < a[1]:
                raise err(b[3], f"packets written into rank {owner}'s scratch chunks [{b[0]}, {min(a[1], b[1])}) by "
                                f"two operations in one call: which one a read sees is not fixed")
        his[owner] = [w[1] for w in lst]
    return his


def _packet_reads(tbs, writes, his, region, err):
    """Which packet writes each packet read waits for (``readers_of``: write id -> read keys
    ``(rank, tb, pos)``), and how many per read (``pending``); a read of packets no operation
    writes waits forever (refused)."""
    readers_of = defaultdict(list)     # write id -> [read key]
    pending = {}                       # read key (rank, tb, pos) -> writes still to come
    for r, ti, ops in tbs:
        for pos, (p, op) in enumerate(ops):
            name = op.name
            if _is_port_ppkt(name, op):
                name = "rppkt"
            if name not in PACKET_READ_FROM:
                continue
            srcs = op.src
            first = PACKET_READ_FROM[name]
            last = first + 1 if name == "rppkt" else len(srcs)
            need = 0
            for j in range(first, min(last, len(srcs))):
                _, _, lo, n = region(op, srcs[j], p + ("src_buff", j), r)
                lst = writes.get(r, [])
                k = bisect_right(his.get(r, []), lo)
                cover = lo
                while k < len(lst) and lst[k][0] < lo + n:
                    if lst[k][0] > cover:
                        break
                    cover = max(cover, lst[k][1])
                    readers_of[lst[k][2]].append((r, ti, pos))
                    need += 1
                    k += 1
                if cover < lo + n:
                    raise err(p + ("src_buff", j), f"rank {r} thread block {ti} reads packets of its scratch chunks "
                                                   f"[{cover}, {lo + n}) that no operation writes in a call: it "
                                                   f"waits for their flags forever")
            pending[(r, ti, pos)] = need
    return readers_of, pending


class _CallRun:
    """One call of the plan run on its synchronisation: every block in program order as far as it
    goes, a blocked block waiting on one key (a channel end, a semaphore, a barrier, a packet
    read) until that key changes (an event-driven fixed point)."""

    def __init__(self, tbs, pair, chans, sem_init, err, order):
        self.tbs, self.pair, self.chans, self.sem_init, self.err, self.order = tbs, pair, chans, sem_init, err, order
        self.inbound = defaultdict(int)         # (rank, type, channel) -> signals arrived this call
        self.expected = defaultdict(int)        # (rank, type, channel) -> waits done
        self.sems = {(r, s): v for r, vals in enumerate(sem_init) for s, v in enumerate(vals)}
        self.arrivals = defaultdict(int)        # (rank, barrier id) -> arrivals this call
        self.last_signal = {}                   # receiving end -> (path of the last signal raising it)
        # releases of each semaphore per block (each semaphore is acquired by one block)
        self.releases = defaultdict(lambda: defaultdict(list))     # (rank, sem) -> block -> [pos]
        for r, ti, ops in tbs:
            for pos, (p, op) in enumerate(ops):
                if op.name == "sem_release":
                    for sm in op.semaphore_ids:
                        self.releases[(r, sm)][ti].append(pos)
        self.acquired = defaultdict(int)        # (rank, sem) -> acquires done
        self.sent = defaultdict(list)           # receiving end -> the signals raising it, in order
        self.members = defaultdict(list)        # (rank, barrier id, target) -> the members' previous ops
        self.passed = {}                        # block -> the arrival count of the barrier it just passed
        self.pc = {(r, ti): 0 for r, ti, _ in tbs}
        self.ops_of = {(r, ti): ops for r, ti, ops in tbs}
        self.waiters = defaultdict(list)        # key -> blocks blocked on it
        self.barrier_target = {}                # block -> the arrival count its barrier waits for
        self.ready = deque(self.pc)
        self.queued = set(self.pc)

    def packets(self, write_at, readers_of, pending):
        """The packet writes of each operation, the reads waiting for each write, and how many
        writes each read still waits for; ``reads_of``: read key -> the writes it waits for."""
        self.write_at, self.readers_of, self.pending = write_at, readers_of, pending
        writer_of = {w: key for key, ids in write_at.items() for w in ids}
        self.reads_of = defaultdict(list)
        for w, keys in readers_of.items():
            for key in keys:
                self.reads_of[key].append(writer_of[w])

    def wake(self, key):
        for b in self.waiters.pop(key, ()):
            if b not in self.queued:
                self.queued.add(b)
                self.ready.append(b)

    def blocked_on(self, b, ops, i):
        """The key ``b``'s operation ``i`` waits on, or None when it can run now."""
        r = b[0]
        op = ops[i][1]
        name = op.name
        if name in ("wait", "rlxwait"):
            for c in op.ids:
                end = (r, op.t, c)
                if self.inbound[end] <= self.expected[end]:
                    return ("ch",) + end
        elif name == "sem_acquire":
            for s in set(op.semaphore_ids):       # a semaphore named k times is acquired k times
                if self.sems[(r, s)] < op.semaphore_ids.count(s):
                    return ("sem", r, s)
        elif name == "barrier":
            key = (r, op.barrier_id)
            if b not in self.barrier_target:
                n = op.num_threadblocks
                self.barrier_target[b] = (self.arrivals[key] // n + 1) * n
                self.arrivals[key] += 1
                if i:
                    self.members[key + (self.barrier_target[b],)].append((r, b[1], i - 1))
                self.wake(("bar",) + key)
            if self.arrivals[key] < self.barrier_target[b]:
                return ("bar",) + key
            self.passed[b] = self.barrier_target.pop(b)
        if self.pending.get((r, b[1], i), 0) > 0:
            return ("pk", r, b[1], i)
        return None

    def run(self):
        """Every block as far as it goes."""
        while self.ready:
            b = self.ready.popleft()
            self.queued.discard(b)
            ops = self.ops_of[b]
            while self.pc[b] < len(ops):
                i = self.pc[b]
                key = self.blocked_on(b, ops, i)
                if key is not None:
                    self.waiters[key].append(b)
                    break
                self.step(b, i, *ops[i])
                self.pc[b] = i + 1

    def step(self, b, i, p, op):
        """Operation ``i`` of block ``b``, which can run: the counts it changes, the blocks it
        wakes, and (with ``order``) what it surely waited for."""
        r, ti = b
        name = op.name
        preds = []
        if name in ("wait", "rlxwait"):
            for c in op.ids:
                end = (r, op.t, c)
                preds.append(self.sent[end][self.expected[end]])
                self.expected[end] += 1
        elif name == "sem_acquire":
            self.acquire(r, op, preds)
        elif name == "sem_release":
            for s in op.semaphore_ids:
                self.sems[(r, s)] += 1
                self.wake(("sem", r, s))
        if _is_signal(name, op):
            for c in op.ids:
                end = _partner(r, op.t, c, self.pair, self.chans, p, self.err)
                self.inbound[end] += 1
                self.sent[end].append((r, ti, i))
                self.last_signal[end] = p
                self.wake(("ch",) + end)
        for w in self.write_at.get((r, ti, i), ()):
            for key in self.readers_of.get(w, ()):
                self.pending[key] -= 1
                if self.pending[key] == 0:
                    self.wake(("pk",) + key)
        if self.order is not None:
            if name == "barrier":
                preds += self.members[(r, op.barrier_id, self.passed.pop(b))]
            self.order.append(((r, ti, i), preds + self.reads_of.get((r, ti, i), [])))

    def acquire(self, r, op, preds):
        """A ``sem_acquire``: takes one from each semaphore; the releases surely done before it
        (whichever blocks release first) join ``preds``."""
        for s in op.semaphore_ids:
            self.sems[(r, s)] -= 1
            self.acquired[(r, s)] += 1
            need = self.acquired[(r, s)] - self.sem_init[r][s]
            by = self.releases[(r, s)]
            total = sum(len(v) for v in by.values())
            for rb, poss in by.items():
                j = need - (total - len(poss))     # this block's releases surely done
                if j >= 1:
                    preds.append((r, rb, poss[min(j, len(poss)) - 1]))

    def check_left_over(self, signals_to):
        """What is left: a deadlock, or counts the next call would inherit."""
        err, chans, sem_init = self.err, self.chans, self.sem_init
        stuck = [(r, ti) for r, ti, ops in self.tbs if self.pc[(r, ti)] < len(ops)]
        if stuck:
            r, ti = stuck[0]
            i = self.pc[(r, ti)]
            p, op = self.ops_of[(r, ti)][i]
            more = f" ({len(stuck) - 1} more thread blocks are stuck too)" if len(stuck) > 1 else ""
            raise err(p, _why_stuck(r, ti, op, self.inbound, self.expected, signals_to, self.sems, self.arrivals,
                                    chans) + more)
        for end, n in sorted(self.inbound.items()):
            if n != self.expected[end]:
                r, t, c = end
                raise err(self.last_signal[end], f"{n} signals per call reach rank {r}'s {t} channel {c} (from rank "
                                                 f"{chans[r][t][c]}), which waits on it {self.expected[end]} times: "
                                                 f"the extra signals satisfy waits of the next call early (a race)")
        for (r, s), v in sorted(self.sems.items()):
            init = sem_init[r][s]
            if v != init:
                at = next(p for rr, ti, ops in self.tbs if rr == r for p, op in ops
                          if op.name in ("sem_release", "sem_acquire") and s in op.semaphore_ids)
                raise err(at, f"rank {r}'s semaphore {s} ends a call at {v}, not at its initial {init}: it is "
                              f"released {'more' if v > init else 'less'} often than acquired, so the next call "
                              + ("passes an acquire early (a race)" if v > init else "starts short"))


def _partner(r, t, c, pair, chans, path, err):
    got = pair.get((r, t, c))
    if got is None:
        raise err(path, f"rank {r}'s {t} channel {c} to rank {chans[r][t][c]} has no partner channel there: "
                        f"its signals reach no one")
    return (chans[r][t][c], t, got[0])


def _why_stuck(r, ti, op, inbound, expected, signals_to, sems, arrivals, chans) -> str:
    name = op.name
    head = f"deadlock under the executor: rank {r} thread block {ti} never passes this '{name}'"
    if name in ("wait", "rlxwait"):
        for c in op.ids:
            end = (r, op.t, c)
            if inbound[end] <= expected[end]:
                k = expected[end] + 1
                peer = chans[r][op.t][c]
                total = signals_to.get(end, 0)
                if total < k:
                    return (f"{head}: it waits for signal {k} of the call on its {op.t} channel {c} from rank "
                            f"{peer}, which signals that channel only {total} time{'' if total == 1 else 's'} (a wait no signal satisfies)")
                return (f"{head}: it waits for signal {k} on its {op.t} channel {c} from rank {peer}, "
                        f"which is itself blocked before sending it (a cycle of waits)")
    if name == "sem_acquire":
        s = next(s for s in op.semaphore_ids if sems[(r, s)] < op.semaphore_ids.count(s))
        return f"{head}: semaphore {s} is never released enough for it"
    if name == "barrier":
        return (f"{head}: barrier {op.barrier_id} waits for {op.num_threadblocks} thread blocks, "
                f"{arrivals[(r, op.barrier_id)]} arrive")
    return f"{head}: it reads packets whose writer never runs (a cycle of waits)"


def check_next_call(tbs, order, region, is_scratch, double: bool, err) -> None:
    """Refuse a plan whose next call may write scratch bytes before this call is done with them.

    The executor runs a rank's calls in stream order (call k+1's kernel starts when call k's has
    finished on that rank) but nothing orders rank A's call k+1 after rank B's call k unless the
    plan does: a write by A in call k+1 into B's scratch (a put, a packet) is safe after an access
    R of those bytes in call k only if some rank C is reached from R in call k (R happens before
    an operation of C: through signals, semaphores, barriers, packets; R's own rank always) and
    C's call k+1 reaches the write (A's own call always). With ``use_double_scratch_buffer`` the
    calls alternate halves of the scratch, so the write to fear is call k+2's, one more call of
    ranks in between. ``order`` is :func:`check_counts`' happens-before graph of one call,
    ``is_scratch(buffer)`` tells a region's buffer (scratch is the plan's own, kept between
    calls; input and output are the caller's)."""
    bwd, fwd, rank_reach = _reach(order)
    by_owner = _scratch_accesses(tbs, region, is_scratch)
    gap = 2 if double else 1
    for owner, acc in by_owner.items():
        acc.sort(key=lambda a: a[0])
        los = [a[0] for a in acc]
        longest = max(a[1] - a[0] for a in acc)
        for lo, hi, w_writes, w_node, w_name, w_path in acc:
            if not w_writes:
                continue
            before = bwd[w_node]
            # the accesses that may overlap [lo, hi): those starting in (lo - longest, hi)
            for lo2, hi2, _, r_node, r_name, _ in acc[bisect_right(los, lo - longest):bisect_left(los, hi)]:
                if hi2 <= lo or r_node[0] == w_node[0]:
                    continue
                seen = fwd[r_node]
                for _ in range(gap - 1):
                    more = seen
                    for c in range(seen.bit_length()):
                        if seen >> c & 1:
                            more |= rank_reach[c]
                    seen = more
                if seen & before:
                    continue
                a, b = w_node[0], r_node[0]
                nxt = "call k+2 (the double scratch buffer gives every other call the same half)" if double \
                    else "call k+1"
                raise err(w_path, f"rank {a}'s '{w_name}' of {nxt} may write rank {owner}'s scratch before rank "
                                  f"{b}'s '{r_name}' (thread block {r_node[1]}) of call k is done with the same "
                                  f"bytes: nothing orders rank {b}'s call k before that write (a race between "
                                  f"calls; rank {a} must first wait for a signal that rank {b} sends after it)")


def _reach(order):
    """Over one call's happens-before graph ``order``: per operation the ranks with an operation
    that happens before it (``bwd``) and after it (``fwd``), as bit sets, and per rank the ranks its
    call reaches (``rank_reach``: its blocks' first operations)."""
    succ = defaultdict(list)
    bwd = {}                     # operation -> ranks with an operation that happens before it (bits)
    for node, preds in order:
        r, ti, i = node
        m = 1 << r
        if i:
            m |= bwd[(r, ti, i - 1)]
        for q in preds:
            m |= bwd[q]
            succ[q].append(node)
        bwd[node] = m
    fwd = {}                     # operation -> ranks with an operation that happens after it (bits)
    for node, _ in reversed(order):
        r, ti, i = node
        m = 1 << r
        m |= fwd.get((r, ti, i + 1), 0)
        for q in succ[node]:
            m |= fwd[q]
        fwd[node] = m
    rank_reach = defaultdict(int)   # rank -> ranks its call reaches (its blocks' first operations)
    for (r, ti, i), m in fwd.items():
        if i == 0:
            rank_reach[r] |= m
    return bwd, fwd, rank_reach


def _scratch_accesses(tbs, region, is_scratch):
    """Every access of scratch bytes by owner: ``[(lo, hi, writes, node, name, path)]``."""
    by_owner = defaultdict(list)    # owner -> [(lo, hi, writes, node, name, path)]
    for r, ti, ops in tbs:
        for pos, (p, op) in enumerate(ops):
            for side, writes in (("src_buff", False), ("dst_buff", True)):
                for j, ref in enumerate((op.src if side == "src_buff" else op.dst)):
                    owner, buf, lo, n = region(op, ref, p + (side, j), r)
                    if is_scratch(buf):
                        by_owner[owner].append((lo, lo + n, writes, (r, ti, pos), op.name, p))
    return by_owner


__all__ = ["check_counts", "check_next_call", "check_pipeline_iterations", "check_races", "ACQUIRE", "RELEASE", "SYNC"]


def check_pipeline_iterations(tbs, contexts, region, is_scratch, err) -> None:
    """Refuse pipelined operations of different thread blocks that touch overlapping bytes of one
    scratch buffer, one of them writing, unless both pipelines cut their iterations alike
    (``contexts``: a pipeline's path -> its ``(unit_size, num_chunks)``) and both ranges start at
    the same chunk. Iteration ``i`` of a pipeline moves part ``i`` of every range it names, so
    then iteration ``i`` of one meets only iteration ``i`` of the other, which the plan's
    synchronisation orders as it orders the body (the importer models a body once). Otherwise
    iteration ``i + 1`` of the writer reaches bytes iteration ``i`` of the other still reads or
    writes, or the ``k``-th signal of one pipeline is not the ``k``-th iteration of the other, and
    nothing the plan says orders them: a race between iterations of one call."""
    by_owner = defaultdict(list)     # owner -> [(lo, hi, writes, (rank, tb), name, path, context)]
    for r, ti, ops in tbs:
        for p, op in ops:
            if not (len(p) >= 4 and p[-2] == "ops" and p[-4] == "ops"):
                continue                                 # not in a pipeline's body
            reads, writes = _data_access(op.name, op, p, r, region)
            for regions, w in ((reads, False), (writes, True)):
                for owner, buf, lo, n in regions:
                    if is_scratch(buf):
                        by_owner[owner].append((lo, lo + n, w, (r, ti), op.name, p, contexts[p[:-2]]))
    for owner, acc in by_owner.items():
        acc.sort(key=lambda a: a[0])
        for k, a in enumerate(acc):
            for b in acc[k + 1:]:
                if b[0] >= a[1]:
                    break
                if a[3] == b[3] or not (a[2] or b[2]) or (a[0] == b[0] and a[6] == b[6]):
                    continue
                w, o = (a, b) if a[2] else (b, a)
                raise err(w[5], f"pipelined '{w[4]}' (rank {w[3][0]} thread block {w[3][1]}) writes rank {owner}'s "
                                f"scratch parts [{w[0]}, {w[1]}) that pipelined '{o[4]}' (rank {o[3][0]} thread "
                                f"block {o[3][1]}, at {'/'.join(map(str, o[5]))}) "
                                f"{'writes' if o[2] else 'reads'} as [{o[0]}, {o[1]}): "
                                + ("their ranges start at different chunks, so one iteration of the first "
                                   "reaches the bytes another iteration of the second moves"
                                   if a[6] == b[6] else
                                   f"their pipelines cut iterations differently ({w[6]} and {o[6]}: unit size "
                                   f"and chunks), so the k-th iteration of one is not the k-th of the other")
                                + "; nothing orders the iterations: a race between iterations of one call")

