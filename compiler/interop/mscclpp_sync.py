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
    A pipeline body is also checked across its wrap (its last operation, then its first)."""
    for r, ti, ops in tbs:
        prev = None
        body_start = None
        for pos, (p, op) in enumerate(ops):
            name = op.name
            cur = _kind(name, op.t)
            acc = _data_access(name, op, p, r, region) if cur == "data" else ([], [])
            per = _per_payload(name, op)
            if prev is not None and name == "upkt" and prev[2] in PACKET_LOCAL_DST:
                acc = (acc[0], [w for w in acc[1] if not _echo(ops[pos - 1], (p, op), w, r, region)])
            _race(prev, (cur, acc, name, p, per), r, ti, err)
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
    inbound = defaultdict(int)         # (rank, type, channel) -> signals arrived this call
    expected = defaultdict(int)        # (rank, type, channel) -> waits done
    sems = {(r, s): v for r, vals in enumerate(sem_init) for s, v in enumerate(vals)}
    arrivals = defaultdict(int)        # (rank, barrier id) -> arrivals this call
    last_signal = {}                   # receiving end -> (path of the last signal raising it)
    signals_to = defaultdict(int)      # receiving end -> signals the plan sends it per call
    # ---- packets: which packet writes each packet read waits for
    writes = defaultdict(list)         # rank -> [(lo, hi, write id)] of its scratch
    write_at = {}                      # (rank, tb, pos) -> [write id]
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
            if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.t == "port"):
                for c in op.ids:
                    end = _partner(r, op.t, c, pair, chans, p, err)
                    signals_to[end] += 1
    his = {}
    for owner, lst in writes.items():
        lst.sort()
        for a, b in zip(lst, lst[1:]):
            if b[0] < a[1]:
                raise err(b[3], f"packets written into rank {owner}'s scratch chunks [{b[0]}, {min(a[1], b[1])}) by "
                                f"two operations in one call: which one a read sees is not fixed")
        his[owner] = [w[1] for w in lst]
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
    writer_of = {w: key for key, ids in write_at.items() for w in ids}
    reads_of = defaultdict(list)       # read key -> the writes it waits for
    for w, keys in readers_of.items():
        for key in keys:
            reads_of[key].append(writer_of[w])
    # releases of each semaphore per block (each semaphore is acquired by one block)
    releases = defaultdict(lambda: defaultdict(list))     # (rank, sem) -> block -> [pos]
    for r, ti, ops in tbs:
        for pos, (p, op) in enumerate(ops):
            if op.name == "sem_release":
                for sm in op.semaphore_ids:
                    releases[(r, sm)][ti].append(pos)
    acquired = defaultdict(int)        # (rank, sem) -> acquires done
    sent = defaultdict(list)           # receiving end -> the signals raising it, in order
    members = defaultdict(list)        # (rank, barrier id, target) -> the members' previous ops
    passed = {}                        # block -> the arrival count of the barrier it just passed
    # ---- the run: every block as far as it goes; a blocked block waits on one key
    pc = {(r, ti): 0 for r, ti, _ in tbs}
    ops_of = {(r, ti): ops for r, ti, ops in tbs}
    waiters = defaultdict(list)        # key -> blocks blocked on it
    barrier_target = {}                # block -> the arrival count its barrier waits for
    ready = deque(pc)
    queued = set(pc)

    def wake(key):
        for b in waiters.pop(key, ()):
            if b not in queued:
                queued.add(b)
                ready.append(b)

    def blocked_on(b, ops, i):
        """The key ``b``'s operation ``i`` waits on, or None when it can run now."""
        r = b[0]
        op = ops[i][1]
        name = op.name
        if name in ("wait", "rlxwait"):
            for c in op.ids:
                end = (r, op.t, c)
                if inbound[end] <= expected[end]:
                    return ("ch",) + end
        elif name == "sem_acquire":
            for s in set(op.semaphore_ids):       # a semaphore named k times is acquired k times
                if sems[(r, s)] < op.semaphore_ids.count(s):
                    return ("sem", r, s)
        elif name == "barrier":
            key = (r, op.barrier_id)
            if b not in barrier_target:
                n = op.num_threadblocks
                barrier_target[b] = (arrivals[key] // n + 1) * n
                arrivals[key] += 1
                if i:
                    members[key + (barrier_target[b],)].append((r, b[1], i - 1))
                wake(("bar",) + key)
            if arrivals[key] < barrier_target[b]:
                return ("bar",) + key
            passed[b] = barrier_target.pop(b)
        if pending.get((r, b[1], i), 0) > 0:
            return ("pk", r, b[1], i)
        return None

    while ready:
        b = ready.popleft()
        queued.discard(b)
        ops = ops_of[b]
        r, ti = b
        while pc[b] < len(ops):
            i = pc[b]
            key = blocked_on(b, ops, i)
            if key is not None:
                waiters[key].append(b)
                break
            p, op = ops[i]
            name = op.name
            preds = []
            if name in ("wait", "rlxwait"):
                for c in op.ids:
                    end = (r, op.t, c)
                    preds.append(sent[end][expected[end]])
                    expected[end] += 1
            elif name == "sem_acquire":
                for s in op.semaphore_ids:
                    sems[(r, s)] -= 1
                    acquired[(r, s)] += 1
                    need = acquired[(r, s)] - sem_init[r][s]
                    by = releases[(r, s)]
                    total = sum(len(v) for v in by.values())
                    for rb, poss in by.items():
                        j = need - (total - len(poss))     # this block's releases surely done
                        if j >= 1:
                            preds.append((r, rb, poss[min(j, len(poss)) - 1]))
            elif name == "sem_release":
                for s in op.semaphore_ids:
                    sems[(r, s)] += 1
                    wake(("sem", r, s))
            if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.t == "port"):
                for c in op.ids:
                    end = _partner(r, op.t, c, pair, chans, p, err)
                    inbound[end] += 1
                    sent[end].append((r, ti, i))
                    last_signal[end] = p
                    wake(("ch",) + end)
            for w in write_at.get((r, ti, i), ()):
                for key in readers_of.get(w, ()):
                    pending[key] -= 1
                    if pending[key] == 0:
                        wake(("pk",) + key)
            if order is not None:
                if name == "barrier":
                    preds += members[(r, op.barrier_id, passed.pop(b))]
                order.append(((r, ti, i), preds + reads_of.get((r, ti, i), [])))
            pc[b] = i + 1
    # ---- what is left: a deadlock, or counts the next call would inherit
    stuck = [(r, ti) for r, ti, ops in tbs if pc[(r, ti)] < len(ops)]
    if stuck:
        r, ti = stuck[0]
        i = pc[(r, ti)]
        p, op = ops_of[(r, ti)][i]
        more = f" ({len(stuck) - 1} more thread blocks are stuck too)" if len(stuck) > 1 else ""
        raise err(p, _why_stuck(r, ti, op, inbound, expected, signals_to, sems, arrivals, chans) + more)
    for end, n in sorted(inbound.items()):
        if n != expected[end]:
            r, t, c = end
            raise err(last_signal[end], f"{n} signals per call reach rank {r}'s {t} channel {c} (from rank "
                                        f"{chans[r][t][c]}), which waits on it {expected[end]} times: the "
                                        f"extra signals satisfy waits of the next call early (a race)")
    for (r, s), v in sorted(sems.items()):
        init = sem_init[r][s]
        if v != init:
            at = next(p for rr, ti, ops in tbs if rr == r for p, op in ops
                      if op.name in ("sem_release", "sem_acquire") and s in op.semaphore_ids)
            raise err(at, f"rank {r}'s semaphore {s} ends a call at {v}, not at its initial {init}: it is released "
                          f"{'more' if v > init else 'less'} often than acquired, so the next call "
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
    by_owner = defaultdict(list)    # owner -> [(lo, hi, writes, node, name, path)]
    for r, ti, ops in tbs:
        for pos, (p, op) in enumerate(ops):
            for side, writes in (("src_buff", False), ("dst_buff", True)):
                for j, ref in enumerate((op.src if side == "src_buff" else op.dst)):
                    owner, buf, lo, n = region(op, ref, p + (side, j), r)
                    if is_scratch(buf):
                        by_owner[owner].append((lo, lo + n, writes, (r, ti, pos), op.name, p))
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

