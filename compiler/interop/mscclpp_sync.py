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

A pipeline's body counts once (both ends of a channel iterate over the same sizes), as in the
import. Refusals are :class:`~hccc.util.diagnostics.CompileError` located at the operation.
"""
from __future__ import annotations

from bisect import bisect_right
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
    return name == "ppkt" and op.get("_t") == "port"


def _data_access(name, op, p, r, region):
    """The regions a data operation reads and writes with all the block's threads, as the race
    check compares them (packets carry their own flags, so packet regions are left out)."""
    src = [region(op, x, p + ("src_buff", j), r) for j, x in enumerate(op.get("src_buff", []))]
    dst = [region(op, x, p + ("dst_buff", j), r) for j, x in enumerate(op.get("dst_buff", []))]
    if name == "ppkt" or name == "cpkt":
        return src, []
    if name == "upkt":
        return [], dst
    if name == "rppkt":
        return [], []
    if name in ("repkt", "respkt", "recpkt", "recspkt"):
        return src[:1], dst[:1]
    return src, dst


def _overlap(a, b) -> bool:
    return any(x[0] == y[0] and x[1] == y[1] and x[2] < y[2] + y[3] and y[2] < x[2] + x[3] for x in a for y in b)


def check_races(tbs, region, err) -> None:
    """Refuse a first-threads operation and a data operation, or two data operations on the same
    bytes, that follow each other in a thread block with no ``nop`` or ``barrier`` between them.
    A pipeline body is also checked across its wrap (its last operation, then its first)."""
    for r, ti, ops in tbs:
        prev = None
        body_start = None
        for pos, (p, op) in enumerate(ops):
            name = op["name"]
            cur = _kind(name, op.get("_t", "memory"))
            acc = _data_access(name, op, p, r, region) if cur == "data" else ([], [])
            _race(prev, (cur, acc, name, p), r, ti, err)
            prev = None if cur == "sync" else (cur, acc, name, p)
            # a pipeline body (paths ... "ops", k, "ops", j) runs again from its start
            in_body = len(p) >= 2 and p[-2] == "ops" and len(p) >= 4 and p[-4] == "ops"
            if in_body and (body_start is None or ops[body_start][0][:-1] != p[:-1]):
                body_start = pos
            last_of_body = in_body and (pos + 1 == len(ops) or ops[pos + 1][0][:-1] != p[:-1])
            if last_of_body and prev is not None:
                bp, bop = ops[body_start]
                bname = bop["name"]
                bk = _kind(bname, bop.get("_t", "memory"))
                bacc = _data_access(bname, bop, bp, r, region) if bk == "data" else ([], [])
                _race(prev, (bk, bacc, bname, bp), r, ti, err, wrap=True)
            if not in_body:
                body_start = None


def _race(prev, cur, r, ti, err, wrap=False):
    if prev is None or cur[0] == "sync":
        return
    pkind, (preads, pwrites), pname, _ = prev
    kind, (reads, writes), name, p = cur
    where = (f"rank {r} thread block {ti}: '{name}' " + ("at the start of the pipeline's next iteration "
                                                         if wrap else "") + f"directly after '{pname}'")
    if pkind == "acquire" and kind == "data":
        raise err(p, f"{where} with no 'nop' between them: the wait runs on the block's first threads, "
                     f"so the other threads read and write before it returned (a race)")
    if pkind == "data" and kind == "release":
        raise err(p, f"{where} with no 'nop' between them: the first threads signal before the other "
                     f"threads finished the data operation (a race)")
    if pkind == "data" and kind == "data" and (_overlap(pwrites, reads + writes) or _overlap(preads, writes)):
        raise err(p, f"{where} on the same bytes with no 'nop' between them: threads of one operation "
                     f"touch elements another thread of the other still uses (a race)")


def check_counts(tbs, pair, chans, region, sem_init, err) -> None:
    """Run one call of the plan on its synchronisation alone (see the module's doc): refuse a
    thread block left waiting (naming what it waits for) and a call that leaves a channel count or
    a semaphore other than it found it. ``tbs`` lists ``(rank, thread block, [(path, operation)])``
    with each operation's rank-level channel ids in ``_ids`` and its channel type in ``_t``;
    ``pair[(r, type, c)]`` is the partner end ``(channel on the peer, k)``; ``region(op, ref,
    path, r)`` resolves a buffer reference to ``(owner rank, buffer, first chunk, chunks)``;
    ``sem_init[r]`` the declared initial values; ``err(path, message)`` makes the located error."""
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
            name = op["name"]
            ids = []
            if name in PACKET_PUT_FROM or _is_port_ppkt(name, op):
                first = PACKET_PUT_FROM.get(name, 0)
                for j, ref in enumerate(op.get("dst_buff", [])[first:], start=first):
                    owner, _, lo, n = region(op, ref, p + ("dst_buff", j), r)
                    writes[owner].append((lo, lo + n, nwrites, p))
                    ids.append(nwrites)
                    nwrites += 1
            if name in PACKET_LOCAL_DST:
                j = PACKET_LOCAL_DST[name]
                owner, _, lo, n = region(op, op["dst_buff"][j], p + ("dst_buff", j), r)
                writes[owner].append((lo, lo + n, nwrites, p))
                ids.append(nwrites)
                nwrites += 1
            if ids:
                write_at[(r, ti, pos)] = ids
            if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.get("_t") == "port"):
                for c in op["_ids"]:
                    end = _partner(r, op["_t"], c, pair, chans, p, err)
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
            name = op["name"]
            if _is_port_ppkt(name, op):
                name = "rppkt"
            if name not in PACKET_READ_FROM:
                continue
            srcs = op.get("src_buff", [])
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
        name = op["name"]
        if name in ("wait", "rlxwait"):
            for c in op["_ids"]:
                end = (r, op["_t"], c)
                if inbound[end] <= expected[end]:
                    return ("ch",) + end
        elif name == "sem_acquire":
            for s in op["semaphore_ids"]:
                if sems[(r, s)] <= 0:
                    return ("sem", r, s)
        elif name == "barrier":
            key = (r, op["barrier_id"])
            if b not in barrier_target:
                n = op["num_threadblocks"]
                barrier_target[b] = (arrivals[key] // n + 1) * n
                arrivals[key] += 1
                wake(("bar",) + key)
            if arrivals[key] < barrier_target[b]:
                return ("bar",) + key
            del barrier_target[b]
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
            name = op["name"]
            if name in ("wait", "rlxwait"):
                for c in op["_ids"]:
                    expected[(r, op["_t"], c)] += 1
            elif name == "sem_acquire":
                for s in op["semaphore_ids"]:
                    sems[(r, s)] -= 1
            elif name == "sem_release":
                for s in op["semaphore_ids"]:
                    sems[(r, s)] += 1
                    wake(("sem", r, s))
            if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.get("_t") == "port"):
                for c in op["_ids"]:
                    end = _partner(r, op["_t"], c, pair, chans, p, err)
                    inbound[end] += 1
                    last_signal[end] = p
                    wake(("ch",) + end)
            for w in write_at.get((r, ti, i), ()):
                for key in readers_of.get(w, ()):
                    pending[key] -= 1
                    if pending[key] == 0:
                        wake(("pk",) + key)
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
                      if op["name"] in ("sem_release", "sem_acquire") and s in op["semaphore_ids"])
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
    name = op["name"]
    head = f"deadlock under the executor: rank {r} thread block {ti} never passes this '{name}'"
    if name in ("wait", "rlxwait"):
        for c in op["_ids"]:
            end = (r, op["_t"], c)
            if inbound[end] <= expected[end]:
                k = expected[end] + 1
                peer = chans[r][op["_t"]][c]
                total = signals_to.get(end, 0)
                if total < k:
                    return (f"{head}: it waits for signal {k} of the call on its {op['_t']} channel {c} from rank "
                            f"{peer}, which signals that channel only {total} time{'' if total == 1 else 's'} (a wait no signal satisfies)")
                return (f"{head}: it waits for signal {k} on its {op['_t']} channel {c} from rank {peer}, "
                        f"which is itself blocked before sending it (a cycle of waits)")
    if name == "sem_acquire":
        s = next(s for s in op["semaphore_ids"] if sems[(r, s)] <= 0)
        return f"{head}: semaphore {s} is never released enough for it"
    if name == "barrier":
        return (f"{head}: barrier {op['barrier_id']} waits for {op['num_threadblocks']} thread blocks, "
                f"{arrivals[(r, op['barrier_id'])]} arrive")
    return f"{head}: it reads packets whose writer never runs (a cycle of waits)"


__all__ = ["check_counts", "check_races", "ACQUIRE", "RELEASE", "SYNC"]
