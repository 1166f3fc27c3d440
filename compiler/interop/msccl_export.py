"""ProgramIR -> MSCCL XML (the dialect the MSCCL executor and RCCL load). See :mod:`msccl_xml`.

The passes, in order (each keeps the program's meaning; the module docstring of
:mod:`hccc.compiler.interop.msccl_xml` explains why):

1. drop NOP primitives, moving their dependencies to their successors and dependents;
2. AllGather: sends that read the rank's input chunk read the output copy of it instead (after the
   local copy), so a chunk keeps one buffer position along its whole path;
3. un-fuse forwarding primitives whose receive and send ends cannot share one MSCCL TB;
4. split hccc thread blocks into MSCCL thread blocks (one send peer, one recv peer, one channel),
   merging the pieces of one hccc TB back while they fit (retried without merging if a merged TB
   breaks a limit), and restore the original order with dependencies where a TB was split;
5. spread connections over channels when a channel has too many peer TBs on one rank;
6. drop dependencies already implied by others, number the steps (extra dependencies become
   ``nop`` steps), check the runtime limits and write the text.
"""
from __future__ import annotations

import gc
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure, match_connections
from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered
from hccc.compiler.interop.msccl_format import LETTER_OF_BUF, MESSAGES_IN_FLIGHT, TYPE_OF_OP, XmlLimits
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op, ProgramIR

_FUSED = (Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND)


@dataclass(slots=True)
class _X:
    """One exported primitive (a ProgramIR primitive, or one half of an un-fused one)."""

    rank: int
    htb: int                  # hccc thread block
    pos: float                # position in the hccc thread block (halves get .0 / .5)
    op: Op
    sp: int                   # send peer or -1
    rp: int                   # recv peer or -1
    ch: int
    sbuf: int
    soff: int
    dbuf: int
    doff: int
    cnt: int
    deps: set = field(default_factory=set)   # indices of _X this one waits for
    peer_x: int = -1          # send half: matched receiver; receive half: matched sender
    peer_x2: int = -1         # forwarding primitive: receiver of its send
    mtb: int = -1             # MSCCL thread block (index into the rank's list)
    idx: int = -1             # position within the MSCCL thread block (real steps only)
    s: int = -1               # XML step number
    hasdep: bool = False
    key: tuple = (0, 0, 0, 0)  # (sub-pipeline, 0 send / 1 other, transfer, seq): an order of the rank's
                               # primitives that keeps every dependency (transfers of one step are
                               # independent, so within a step sends may go first)


def _copy(x: _X) -> _X:
    return _X(x.rank, x.htb, x.pos, x.op, x.sp, x.rp, x.ch, x.sbuf, x.soff, x.dbuf, x.doff, x.cnt, set(x.deps),
              x.peer_x, x.peer_x2, x.mtb, x.idx, x.s, x.hasdep, x.key)


class _OrderCycle(AssertionError):
    """Program order and dependencies of one rank's MSCCL thread blocks form a cycle: an internal
    error, except after fusing a program whose thread blocks are not ordered like its steps (a
    task-level program), where merging two thread blocks can order a pair against a path through a
    third one; that fused export is then dropped for the plain one (:func:`_export_checked`)."""


def _err(msgs: list[str]) -> CompileError:
    return CompileError([Diagnostic(m, None) for m in msgs])


# ---------------------------------------------------------------------------------------------
def _from_ir(ir: ProgramIR) -> list[_X]:
    """Primitives as _X records with NOPs removed (their waits moved to successors/dependents)."""
    p = {k: v.tolist() for k, v in ir.prims.items()}
    n = ir.nprims
    deps: list[set] = [set() for _ in range(n)]
    for a, b in zip(np.asarray(ir.dep_prim).tolist(), np.asarray(ir.dep_on).tolist()):
        deps[a].add(b)
    nop = int(Op.NOP)
    is_nop = [o == nop for o in p["op"]]
    any_nop = any(is_nop)
    same_prev = [i > 0 and p["rank"][i] == p["rank"][i - 1] and p["tb"][i] == p["tb"][i - 1] for i in range(n)] \
        if any_nop else None
    # eff[n] for a NOP: the real primitives its completion stands for
    eff: dict[int, set] = {}

    def resolve(i: int) -> set:
        if not is_nop[i]:
            return {i}
        if i in eff:
            return eff[i]
        stack = [(i, False)]
        while stack:
            j, done = stack.pop()
            if j in eff:
                continue
            parts = list(deps[j]) + ([j - 1] if same_prev[j] else [])
            pend = [d for d in parts if is_nop[d] and d not in eff]
            if pend and not done:
                stack.append((j, True))
                stack.extend((d, False) for d in pend)
                continue
            out = set()
            for d in parts:
                out |= eff[d] if is_nop[d] else {d}
            eff[j] = out
        return eff[i]

    keep = [i for i in range(n) if not is_nop[i]]
    new_index = {old: k for k, old in enumerate(keep)}
    if len(keep) == n:
        new_index = range(n)          # no NOPs: indices stay
    ops = list(Op)
    R, TB, SEQ, OP = p["rank"], p["tb"], p["seq"], p["op"]
    SP, RP, CH, SB, SO, DB, DO, CNT = (p[k] for k in ("send_peer", "recv_peer", "channel", "src_buf", "src_off",
                                                       "dst_buf", "dst_off", "count"))
    PIPE, TASK = p["pipeline"], p["task"]
    xs = []
    for i in keep:
        di = deps[i]
        if any_nop:
            d = set()
            for t in di:
                d |= resolve(t)
            if same_prev[i] and is_nop[i - 1]:
                d |= resolve(i - 1)
            d.discard(i)
            dset = {new_index[t] for t in d}
        else:
            dset = di
            dset.discard(i)
        op = ops[OP[i]]
        xs.append(_X(R[i], TB[i], float(SEQ[i]), op, SP[i], RP[i], CH[i], SB[i], SO[i], DB[i], DO[i], CNT[i], dset,
                     key=(PIPE[i], 0 if op is Op.SEND else 1, TASK[i], SEQ[i])))
    s, r = match_connections(ir)
    for a, b in zip(s.tolist(), r.tolist()):
        xa, xb = new_index[a], new_index[b]
        if xs[xa].op.receives:
            xs[xa].peer_x2 = xb
        else:
            xs[xa].peer_x = xb
        xs[xb].peer_x = xa
    return xs


def _allgather_sources(ir: ProgramIR, xs: list[_X]) -> None:
    """Sends of input chunks read the output copy (after the local copy) when that is equivalent."""
    if ir.collective != "allgather" or ir.in_chunks * ir.nranks != ir.nchunks:
        return
    k = ir.in_chunks
    by_rank: dict[int, list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        by_rank[x.rank].append(i)
    for r, idxs in by_rank.items():
        copy_of: dict[int, int] = {}
        for i in idxs:
            x = xs[i]
            if x.op == Op.COPY and x.sbuf == Buf.INPUT and x.dbuf == Buf.OUTPUT and x.doff == r * k + x.soff:
                for j in range(x.cnt):
                    copy_of[x.soff + j] = i
        if not copy_of:
            continue
        own = range(r * k, r * k + k)
        writers = [i for i in idxs if xs[i].op.writes_dst and xs[i].dbuf == Buf.OUTPUT
                   and xs[i].doff < own.stop and xs[i].doff + xs[i].cnt > own.start]
        if any(xs[i].op != Op.COPY or i not in copy_of.values() for i in writers):
            continue
        for i in idxs:
            x = xs[i]
            if x.op != Op.SEND or x.sbuf != Buf.INPUT:
                continue
            cps = {copy_of.get(x.soff + j, -1) for j in range(x.cnt)}
            if -1 in cps:
                continue
            x.sbuf, x.soff = Buf.OUTPUT, r * k + x.soff
            x.deps |= cps


def _fuse_forwarding(xs: list[_X]) -> list[_X]:
    """Fuse a receive with the send that forwards what it stored (MSCCL's ``rcs``/``rrcs``/``rrs``).

    Input: one hccc TB per connection end (the step-ordered export), so a receive ``R`` (from ``p``,
    storing range ``d``) and a later send ``S`` (to ``q``, reading exactly ``d``, waiting for ``R``)
    sit in two TBs ``a`` (receives from ``p``) and ``b`` (sends to ``q``). Per rank, the (a, b) pairs
    with most such candidates are merged (each TB at most once: an MSCCL TB has one receive and one
    send peer; only chains, where at least half of either TB's steps fuse) and their members ordered by the program's key (sub-pipeline, sends first, transfer); candidates
    then become one step at ``R``'s place when that moves no other message of ``b`` (a connection
    keeps its message order) and ``S`` waits for nothing later than ``R``. Every wait then still
    goes from a smaller key to a larger one, as in the program. A fused receive-reduce whose stored
    result is overwritten on that rank before anything reads it sends without storing (``rrs``).
    Returns a new list (or ``xs`` itself when nothing fuses)."""
    by_rank: dict[int, list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        by_rank[x.rank].append(i)
    ends: dict = defaultdict(lambda: [set(), set()])     # (rank, htb) -> (send peers, recv peers)
    for x in xs:
        if x.sp >= 0:
            ends[(x.rank, x.htb)][0].add((x.sp, x.ch))
        if x.rp >= 0:
            ends[(x.rank, x.htb)][1].add((x.rp, x.ch))
    pure_recv = {k for k, (se, re_) in ends.items() if not se and len(re_) == 1}
    pure_send = {k for k, (se, re_) in ends.items() if len(se) == 1 and not re_}
    cand: dict = defaultdict(list)       # (rank, a, b) -> [(R, S)]
    for i, x in enumerate(xs):
        if x.op != Op.SEND or (x.rank, x.htb) not in pure_send:
            continue
        for d in x.deps:
            r = xs[d]
            if (r.op in (Op.RECV, Op.RECV_REDUCE_COPY) and (r.rank, r.htb) in pure_recv and r.ch == x.ch
                    and (r.dbuf, r.doff, r.cnt) == (x.sbuf, x.soff, x.cnt)):
                cand[(x.rank, r.htb, x.htb)].append((d, i))
    if not cand:
        return xs
    fused: dict[int, int] = {}           # S -> R
    members: dict = defaultdict(list)    # (rank, htb) -> member indices
    for i, x in enumerate(xs):
        members[(x.rank, x.htb)].append(i)
    merged: list = []                   # (rank, kept TB id, merged member order)
    used: set = set()
    for (rank, a, b), pairs in sorted(cand.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1], kv[0][2])):
        if (rank, a) in used or (rank, b) in used:
            continue
        order = _merge_order(xs, members[(rank, a)], members[(rank, b)])
        where = {i: k for k, i in enumerate(order)}
        bpos = sorted(where[i] for i in members[(rank, b)])
        fused_here = {}
        for R, S in pairs:
            pr, ps = where[R], where[S]
            if not pr < ps or S in fused_here:
                continue
            # no other message of b between R and S (a connection keeps its order); S's other
            # waits all come before R
            between = bisect_left(bpos, ps) - bisect_right(bpos, pr)
            if between or any((where[d] >= pr) if d in where else (xs[d].key >= xs[R].key)
                              for d in xs[S].deps if d != R):
                continue
            fused_here[S] = R
        # merge only chains: a pair of TBs that mostly forwards (most of either TB's steps fuse);
        # otherwise the merged TB would run two mostly unrelated connections in series
        if 2 * len(fused_here) < max(len(members[(rank, a)]), len(members[(rank, b)])):
            continue
        used |= {(rank, a), (rank, b)}
        merged.append((rank, a, order))
        fused.update(fused_here)
    if not fused:
        return xs
    # merged TBs: members in the merged order, positions renumbered
    for rank, a, order in merged:
        for k, i in enumerate(order):
            xs[i].htb = a
            xs[i].pos = float(k)
    last_use = _dead_after(xs, by_rank, fused)
    out: list[_X] = []
    new_of: dict[int, int] = {}
    for i, x in enumerate(xs):
        if i in fused:
            continue
        new_of[i] = len(out)
        out.append(_copy(x))
    for S, R in fused.items():
        new_of[S] = new_of[R]
    fused_r = set(fused.values())
    for i, x in enumerate(xs):
        y = out[new_of[i]]
        if i in fused:
            R = fused[i]
            y.deps = {new_of[d] for d in xs[R].deps | x.deps if d not in (R, i)}
            y.sp = x.sp
            y.peer_x2 = new_of[x.peer_x]
            if xs[R].op == Op.RECV:
                y.op = Op.RECV_COPY_SEND
            elif R in last_use:
                y.op, y.dbuf, y.doff = Op.RECV_REDUCE_SEND, Buf.NONE, 0
            else:
                y.op = Op.RECV_REDUCE_COPY_SEND
            continue
        if i in fused_r:
            y.peer_x = new_of[x.peer_x]
            continue
        y.deps = {new_of[d] for d in x.deps if new_of[d] != new_of[i]}
        if x.peer_x >= 0:
            y.peer_x = new_of[x.peer_x]
        if x.peer_x2 >= 0:
            y.peer_x2 = new_of[x.peer_x2]
    return out


def _merge_order(xs: list[_X], ma: list[int], mb: list[int]) -> list[int]:
    """Members of two TBs in one order that keeps each TB's order and every dependency between
    them, smallest key first among the ready ones (a topological sort)."""
    import heapq
    mem = ma + mb
    inside = set(mem)
    succ: dict[int, list[int]] = defaultdict(list)
    indeg = dict.fromkeys(mem, 0)
    for m in (ma, mb):
        for u, v in zip(m, m[1:]):
            succ[u].append(v)
            indeg[v] += 1
    for v in mem:
        for u in xs[v].deps:
            if u in inside:
                succ[u].append(v)
                indeg[v] += 1
    heap = [(xs[i].key, i) for i in mem if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (xs[v].key, v))
    if len(order) != len(mem):
        raise AssertionError("internal error: dependency cycle between two thread blocks of one rank")
    return order


def _dead_after(xs: list[_X], by_rank: dict, fused: dict[int, int]) -> set[int]:
    """Receive-reduce halves ``R`` of fused pairs whose stored range is overwritten on their rank (in
    key order) before anything but the fused send reads it: their result need not be stored."""
    out: set[int] = set()
    rr = {R: S for S, R in fused.items() if xs[R].op == Op.RECV_REDUCE_COPY and xs[R].dbuf != Buf.NONE}
    if not rr:
        return out
    for rank, idxs in by_rank.items():
        mine = [R for R in idxs if R in rr]
        if not mine:
            continue
        order = sorted(idxs, key=lambda i: xs[i].key)
        pos = {i: k for k, i in enumerate(order)}
        for R in mine:
            b, lo, hi = xs[R].dbuf, xs[R].doff, xs[R].doff + xs[R].cnt
            dead = False
            for j in order[pos[R] + 1:]:
                if j == rr[R]:
                    continue
                y = xs[j]
                if y.op.reads_src and y.sbuf == b and y.soff < hi and y.soff + y.cnt > lo:
                    break
                if y.op.writes_dst and y.dbuf == b and y.doff < hi and y.doff + y.cnt > lo:
                    # an overwrite of the whole range that does not read it kills the stored value
                    dead = (y.op in (Op.RECV, Op.RECV_COPY_SEND, Op.COPY) and y.doff <= lo and y.doff + y.cnt >= hi)
                    break
            if dead:
                out.add(R)
    return out


def _end_components(xs: list[_X]):
    """Union-find over connection ends joined by forwarding primitives: (find, {root: [send ends, recv ends]}).

    Only forwarding primitives join two ends; every other end is a component of its own, so the
    union-find holds just the joined ends (most programs have none)."""
    seen: dict = {}                     # every end, in order of first appearance
    pairs = []
    for x in xs:
        se = (x.rank, "s", x.sp, x.ch) if x.sp >= 0 else None
        re_ = (x.rank, "r", x.rp, x.ch) if x.rp >= 0 else None
        if se is not None:
            seen[se] = None
        if re_ is not None:
            seen[re_] = None
            if se is not None:
                pairs.append((se, re_))
    if pairs:
        from networkx.utils import UnionFind   # imported here: networkx is slow to import
        uf = UnionFind()
        for a, b in pairs:
            uf.union(a, b)
        joined = uf.parents

        def find(e):
            return uf[e] if e in joined else e
    else:
        def find(e):
            return e
    comps: dict = defaultdict(lambda: [set(), set()])
    for e in seen:
        comps[find(e)][0 if e[1] == "s" else 1].add(e)
    return find, comps


def _unfuse(xs: list[_X]) -> list[_X]:
    """Split forwarding primitives whose ends would need two MSCCL TBs; returns the new list.

    Forwarding primitives join a receive end and a send end into one MSCCL TB; where such joins
    would give one TB two send (or two receive) peers, all but the most frequent (recv peer, send
    peer) pair of the group are split into a receive (storing the chunk) and a send of it."""
    find, comps = _end_components(xs)
    bad_roots = {root for root, (se, re_) in comps.items() if len(se) > 1 or len(re_) > 1}
    if not bad_roots:
        return xs
    # in each bad group keep the forwarding primitives of its most used (recv peer, send peer) pair
    # fused and split the others; the group is then that one pair
    pair_count: dict = defaultdict(int)
    for x in xs:
        if x.op in _FUSED:
            root = find((x.rank, "s", x.sp, x.ch))
            if root in bad_roots:
                pair_count[(root, x.rp, x.sp)] += 1
    keep = {}
    for (root, rp, sp), c in sorted(pair_count.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][2])):
        keep.setdefault(root, (rp, sp))
    split = [i for i, x in enumerate(xs) if x.op in _FUSED and find((x.rank, "s", x.sp, x.ch)) in bad_roots
             and keep[find((x.rank, "s", x.sp, x.ch))] != (x.rp, x.sp)]
    bad = [i for i in split if xs[i].op == Op.RECV_REDUCE_SEND]
    if bad:
        x = xs[bad[0]]
        raise _err([f"cannot export: rank {x.rank} thread block {x.htb} step {int(x.pos)} is a recv-reduce-send "
                    f"whose receive and send would need different MSCCL thread blocks, and un-fusing it needs "
                    f"a scratch chunk the program does not have"])
    # new list: every split primitive becomes (receive half, send half)
    out: list[_X] = []
    first: dict[int, int] = {}   # old index -> index of its first (or only) new record
    last: dict[int, int] = {}    # old index -> index of its last new record
    split_set = set(split)
    for i, x in enumerate(xs):
        if i in split_set:
            rop = Op.RECV if x.op == Op.RECV_COPY_SEND else Op.RECV_REDUCE_COPY
            a = _X(rank=x.rank, htb=x.htb, pos=x.pos, op=rop, sp=-1, rp=x.rp, ch=x.ch, sbuf=x.sbuf,
                   soff=x.soff, dbuf=x.dbuf, doff=x.doff, cnt=x.cnt)
            b = _X(rank=x.rank, htb=x.htb, pos=x.pos + 0.5, op=Op.SEND, sp=x.sp, rp=-1, ch=x.ch,
                   sbuf=x.dbuf, soff=x.doff, dbuf=Buf.NONE, doff=0, cnt=x.cnt)
            first[i] = len(out)
            out.append(a)
            last[i] = len(out)
            out.append(b)
        else:
            first[i] = last[i] = len(out)
            out.append(_X(**{f: getattr(x, f) for f in ("rank", "htb", "pos", "op", "sp", "rp", "ch", "sbuf",
                                                        "soff", "dbuf", "doff", "cnt")}))
    for i, x in enumerate(xs):
        a = out[first[i]]
        a.deps = {last[d] for d in x.deps}
        if i in split_set:
            out[last[i]].deps = {first[i]}
        # matching: receive side of x <- sender; send side of x -> receiver
        if x.op.receives:
            snd = x.peer_x
            a.peer_x = last[snd]
        if x.op.sends:
            rcv = x.peer_x2 if x.op.receives else x.peer_x
            sx = out[last[i]]
            if sx.op.receives:
                sx.peer_x2 = first[rcv]
            else:
                sx.peer_x = first[rcv]
    return out


@dataclass(eq=False)
class _TB:
    rank: int
    send: int
    recv: int
    ch: int
    htb: int
    members: list = field(default_factory=list)
    id: int = -1
    nsteps: int = 0


def _assign_tbs(xs: list[_X], merge_up_to: int = 0) -> dict[int, list[_TB]]:
    """MSCCL thread blocks: one per component of connection ends (+ local-only ones).

    With ``merge_up_to > 0``, components of one hccc thread block are merged (first fit, same
    channel, at most one send and one receive peer, at most that many primitives): they ran one
    after another in that thread block anyway, so merging adds no wait and saves thread blocks.
    """
    find, comps = _end_components(xs)
    size: dict = defaultdict(int)
    first: dict = {}
    htb_of: dict = {}
    for i, x in enumerate(xs):
        e = (x.rank, "s", x.sp, x.ch) if x.sp >= 0 else ((x.rank, "r", x.rp, x.ch) if x.rp >= 0 else None)
        if e is not None:
            r = find(e)
            size[r] += 1
            first.setdefault(r, x.pos)
            htb_of[r] = (x.rank, x.htb)
    group: dict = {r: r for r in comps}   # component root -> merged group root
    if merge_up_to > 0:
        by_htb: dict = defaultdict(list)
        for r in sorted(comps, key=lambda r: (htb_of.get(r, (0, 0)), first.get(r, 0))):
            if r in htb_of:
                by_htb[htb_of[r]].append(r)
        for roots in by_htb.values():
            groups: list[list] = []   # [root, send ends, recv ends, channel, size]
            for r in roots:
                se, re_ = comps[r]
                ch = next(iter(se | re_))[3]
                for g in groups:
                    if g[3] == ch and not (g[1] and se) and not (g[2] and re_) and g[4] + size[r] <= merge_up_to:
                        g[1] = g[1] | se
                        g[2] = g[2] | re_
                        g[4] += size[r]
                        group[r] = g[0]
                        break
                else:
                    groups.append([r, set(se), set(re_), ch, size[r]])
    ends_of: dict = defaultdict(lambda: [set(), set()])
    for r, (se, re_) in comps.items():
        ends_of[group[r]][0] |= se
        ends_of[group[r]][1] |= re_
    tbs: dict[int, list[_TB]] = defaultdict(list)
    tb_of_root: dict = {}
    for i, x in enumerate(xs):
        e = (x.rank, "s", x.sp, x.ch) if x.sp >= 0 else ((x.rank, "r", x.rp, x.ch) if x.rp >= 0 else None)
        if e is None:
            continue
        root = group[find(e)]
        t = tb_of_root.get(root)
        if t is None:
            send_ends, recv_ends = ends_of[root]
            assert len(send_ends) <= 1 and len(recv_ends) <= 1, \
                "internal error: unfusing left two peers in one thread block"
            t = _TB(x.rank, next(iter(send_ends))[2] if send_ends else -1,
                    next(iter(recv_ends))[2] if recv_ends else -1, x.ch, x.htb)
            tb_of_root[root] = t
            tbs[x.rank].append(t)
        t.members.append(i)
    # local primitives join a neighbour of their hccc thread block
    seqs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        seqs[(x.rank, x.htb)].append(i)
    tb_of: dict[int, _TB] = {}
    for t in (t for lst in tbs.values() for t in lst):
        for i in t.members:
            tb_of[i] = t
    for (rank, htb), idxs in sorted(seqs.items()):
        idxs.sort(key=lambda i: xs[i].pos)
        owner = [tb_of.get(i) for i in idxs]
        if all(o is None for o in owner):
            t = _TB(rank, -1, -1, 0, htb)
            tbs[rank].append(t)
            owner = [t] * len(idxs)
        else:
            cur = next(o for o in owner if o is not None)
            for j, o in enumerate(owner):
                if o is None:
                    owner[j] = cur
                else:
                    cur = o
        for i, o in zip(idxs, owner):
            if i not in tb_of:
                tb_of[i] = o
                o.members.append(i)
    for rank, lst in tbs.items():
        for t in lst:
            t.members.sort(key=lambda i: xs[i].pos)
        lst.sort(key=lambda t: (t.htb, xs[t.members[0]].pos))
        for j, t in enumerate(lst):
            t.id = j
            for k, i in enumerate(t.members):
                xs[i].mtb = j
                xs[i].idx = k
    # original thread-block order where a thread block was split
    for (rank, htb), idxs in seqs.items():
        for a, b in zip(idxs, idxs[1:]):
            if xs[a].mtb != xs[b].mtb:
                xs[b].deps.add(a)
    return tbs


def _spread_channels(tbs: dict[int, list[_TB]], lim: XmlLimits) -> None:
    """Move whole connections to other channels where a (rank, channel) has too many peer TBs.

    A connection's two thread blocks must share its channel, and a thread block has one channel,
    so connections linked through thread blocks move together (union-find). Groups keep their
    channel when it fits; others take the lowest channel where every rank stays within
    ``max_tbs_per_channel`` sending and receiving thread blocks and no connection appears twice.
    Messages keep their order: a connection moves with all of its messages.
    """
    def over():
        for rank, lst in tbs.items():
            cnt: dict = defaultdict(int)
            for t in lst:
                if t.send >= 0:
                    cnt[(t.ch, 0)] += 1
                if t.recv >= 0:
                    cnt[(t.ch, 1)] += 1
            if any(c > lim.max_tbs_per_channel for c in cnt.values()):
                return True
        return False

    if not over():
        return
    from networkx.utils import UnionFind
    uf = UnionFind()
    find = uf.__getitem__
    owner: dict = {}
    for rank, lst in tbs.items():
        for t in lst:
            find(id(t))
            if t.send >= 0:
                owner.setdefault((rank, t.send, t.ch), []).append(t)
            if t.recv >= 0:
                owner.setdefault((t.recv, rank, t.ch), []).append(t)
    for ts in owner.values():
        uf.union(*(id(t) for t in ts))
    groups: dict = defaultdict(list)
    for rank in sorted(tbs):
        for t in tbs[rank]:
            if t.send >= 0 or t.recv >= 0:
                groups[find(id(t))].append(t)
    order = sorted(groups.values(), key=lambda g: (g[0].ch, g[0].rank, g[0].id))
    count: dict = defaultdict(int)     # (rank, channel, 0 send / 1 recv) -> thread blocks
    used: set = set()                  # (sender, receiver, channel)
    for g in order:
        conns = {(t.rank, t.send) for t in g if t.send >= 0}
        sends: dict = defaultdict(int)
        recvs: dict = defaultdict(int)
        for t in g:
            if t.send >= 0:
                sends[t.rank] += 1
            if t.recv >= 0:
                recvs[t.rank] += 1

        def fits(c):
            return (all((a, b, c) not in used for a, b in conns)
                    and all(count[(r, c, 0)] + n <= lim.max_tbs_per_channel for r, n in sends.items())
                    and all(count[(r, c, 1)] + n <= lim.max_tbs_per_channel for r, n in recvs.items()))
        c = g[0].ch if fits(g[0].ch) else next((c for c in range(lim.max_channels) if fits(c)), None)
        if c is None:
            return    # _check_limits reports the overflow
        for t in g:
            t.ch = c
        used |= {(a, b, c) for a, b in conns}
        for r, n in sends.items():
            count[(r, c, 0)] += n
        for r, n in recvs.items():
            count[(r, c, 1)] += n


def _reduce_deps(xs: list[_X], tbs: dict[int, list[_TB]]) -> None:
    """Drop same-TB dependencies and those implied by program order and other dependencies.

    Vector clocks over one rank's thread blocks, propagated along that rank's program order and
    dependencies (a sound under-approximation of happens-before: kept dependencies may still be
    implied through other ranks, never the other way round).
    """
    for rank, lst in tbs.items():
        T = len(lst)
        members = [i for t in lst for i in t.members]
        for i in members:
            xs[i].deps = {d for d in xs[i].deps if not (xs[d].mtb == xs[i].mtb and xs[d].idx < xs[i].idx)}
            if any(xs[d].mtb == xs[i].mtb for d in xs[i].deps):
                raise AssertionError("internal error: a primitive waits for a later one of its own thread block")
        # topological order over program order + dependencies (Kahn)
        succ: dict[int, list[int]] = defaultdict(list)
        indeg = {i: 0 for i in members}
        for t in lst:
            for a, b in zip(t.members, t.members[1:]):
                succ[a].append(b)
                indeg[b] += 1
        for i in members:
            for d in xs[i].deps:
                succ[d].append(i)
                indeg[i] += 1
        ready = sorted(i for i in members if indeg[i] == 0)
        order = []
        while ready:
            i = ready.pop()
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        if len(order) != len(members):
            raise _OrderCycle("internal error: dependency cycle after splitting thread blocks")
        # clocks are Python lists (a rank has few TBs: list operations beat numpy's per-call cost);
        # a primitive without dependencies shares its predecessor's clock until it changes one entry
        vc: dict[int, list] = {}
        zero = [0] * T
        for i in order:
            x = xs[i]
            t = lst[x.mtb]
            prev = vc[t.members[x.idx - 1]] if x.idx > 0 else zero
            if x.deps:
                cand = [d for d in sorted(x.deps) if prev[xs[d].mtb] < xs[d].idx + 1]
                if len(cand) > 1:
                    keep = [d for d in cand
                            if not any(vc[e][xs[d].mtb] >= xs[d].idx + 1 for e in cand if e != d)]
                else:
                    keep = cand
                if keep:
                    base = list(prev)
                    for d in keep:
                        base = list(map(max, base, vc[d]))
                else:
                    base = list(prev)
                x.deps = set(keep)
            else:
                base = list(prev)
            base[x.mtb] = x.idx + 1
            vc[i] = base


def _targets_first(xs: list[_X], tbs: dict[int, list[_TB]]) -> None:
    """Renumber each rank's TBs so those that others wait for come first (the runtimes store the
    waited-for TB id in 8 bits); otherwise keep the order."""
    for rank, lst in tbs.items():
        waited = {xs[d].mtb for t in lst for i in t.members for d in xs[i].deps}
        if not waited or max(waited) < 128:
            continue
        lst.sort(key=lambda t: (t.id not in waited, t.id))
        for j, t in enumerate(lst):
            t.id = j
            for i in t.members:
                xs[i].mtb = j


def _number_steps(xs: list[_X], tbs: dict[int, list[_TB]]) -> None:
    for lst in tbs.values():
        for t in lst:
            s = 0
            for i in t.members:
                s += max(len(xs[i].deps) - 1, 0)
                xs[i].s = s
                s += 1
            t.nsteps = s
    for x in xs:
        for d in x.deps:
            xs[d].hasdep = True


def _instantiate(xs: list[_X], tbs: dict[int, list[_TB]], k: int) -> tuple[list[_X], dict[int, list[_TB]]]:
    """``k`` instances of the program (msccl-tools' ``instances``): every MSCCL TB becomes ``k`` TBs
    (ids ``id*k + i``, channel ``i*nchannels + ch``), each moving its own ``1/k`` of every chunk
    range: a step on chunks ``[off, off+cnt)`` moves chunks ``[off*k + i*cnt, off*k + (i+1)*cnt)`` of
    the ``k`` times finer buffers in instance ``i``.

    With one-chunk steps (:func:`_relabels`) instance ``i`` is the one-instance program with chunk
    ``c`` of every buffer of every rank renamed ``c*k + i``: one renaming for all buffers and ranks,
    so each fine chunk follows the path of its coarse chunk, and the postconditions of the exported
    collectives are invariant under it (AllReduce ``out[c] = sum in[c]``; AllGather
    ``out[s*I + j] = in_s[j]`` becomes ``out[s*I*k + j*k + i] = in_s[j*k + i]`` with ``I*k`` input
    chunks; ReduceScatter and AllToAll alike; an in-place alias at chunk ``r*I`` stays one at
    ``r*I*k``). The instances share no TB, channel or dependency, so they are deadlock-free when one
    is. Multi-chunk ranges are renamed per step and need not agree between steps: the exporter then
    proves the result with the importer (:func:`export_xml`)."""
    if k == 1:
        return xs, tbs
    nch = max((t.ch for lst in tbs.values() for t in lst), default=0) + 1
    n = len(xs)
    out: list[_X] = []
    for i in range(k):
        for x in xs:
            y = _copy(x)
            y.deps = {d + i * n for d in x.deps}
            y.peer_x = x.peer_x + i * n if x.peer_x >= 0 else -1
            y.peer_x2 = x.peer_x2 + i * n if x.peer_x2 >= 0 else -1
            y.mtb = x.mtb * k + i
            if y.sbuf != Buf.NONE:
                y.soff = x.soff * k + i * x.cnt
            if y.dbuf != Buf.NONE:
                y.doff = x.doff * k + i * x.cnt
            out.append(y)
    new: dict[int, list[_TB]] = {}
    for rank, lst in tbs.items():
        nl = []
        for t in sorted(lst, key=lambda t: t.id):
            for i in range(k):
                nl.append(_TB(rank, t.send, t.recv, i * nch + t.ch, t.htb, [m + i * n for m in t.members],
                              t.id * k + i, t.nsteps))
        new[rank] = nl
    return out, new


def _relabels(xs: list[_X]) -> bool:
    """Whether :func:`_instantiate` is a renaming of chunks for these primitives (every one moves
    one chunk), so that ``k`` instances are correct when one is."""
    return all(x.cnt == 1 for x in xs)


def _instances_fit(ir: ProgramIR, xs: list[_X], tbs: dict[int, list[_TB]], lim: XmlLimits, k: int) -> bool:
    """Whether ``k`` instances of the one-instance layout (``xs``, ``tbs``) keep every limit that
    :func:`_check_limits` checks, computed from the one instance: TBs, channels and elements per rank
    times ``k``, offsets ``off*k + k*cnt - 1`` at most, dependency targets ``mtb*k + k - 1`` at most;
    steps per TB, chunks per step and TBs per channel as they are."""
    if max((t.nsteps for lst in tbs.values() for t in lst), default=0) > lim.max_steps:
        return False
    if max((x.cnt for x in xs), default=0) > lim.max_count:
        return False
    for x in xs:
        for buf, off in ((x.sbuf, x.soff), (x.dbuf, x.doff)):
            if buf != Buf.NONE and off * k + k * x.cnt - 1 > lim.max_offset:
                return False
    if any(xs[d].mtb * k + k - 1 > lim.max_dep_tb for x in xs for d in x.deps):
        return False
    nch = max((t.ch for lst in tbs.values() for t in lst), default=0) + 1
    if nch * k > lim.max_channels or ir.nranks > lim.max_children:
        return False
    for lst in tbs.values():
        per: dict[tuple[int, bool], int] = defaultdict(int)
        for t in lst:
            if t.send >= 0:
                per[(t.ch, True)] += 1
            if t.recv >= 0:
                per[(t.ch, False)] += 1
        if len(lst) * k > min(lim.max_tbs, lim.max_children) or max(per.values(), default=0) > lim.max_tbs_per_channel:
            return False
        if 1 + ir.nranks + k * (len(lst) + sum(t.nsteps for t in lst)) > lim.max_xml_nodes:
            return False
    return True


def _check_limits(ir: ProgramIR, xs: list[_X], tbs: dict[int, list[_TB]], lim: XmlLimits) -> None:
    msgs: list[str] = []

    def desc(t: _TB) -> str:
        parts = []
        if t.send >= 0:
            parts.append(f"sends to rank {t.send}")
        if t.recv >= 0:
            parts.append(f"receives from rank {t.recv}")
        return (f"rank {t.rank} thread block {t.id} ({' and '.join(parts) or 'local copies'}, "
                f"channel {t.ch})")

    worst = max((t for lst in tbs.values() for t in lst), key=lambda t: t.nsteps, default=None)
    if worst is not None and worst.nsteps > lim.max_steps:
        nops = worst.nsteps - len(worst.members)
        n_over = sum(1 for lst in tbs.values() for t in lst if t.nsteps > lim.max_steps)
        msgs.append(f"{desc(worst)} needs {worst.nsteps} steps"
                    + (f" ({nops} of them nops carrying extra dependencies)" if nops else "")
                    + f", but the target runtime runs at most {lim.max_steps} per thread block"
                    + (f" ({n_over - 1} more thread block(s) are too long)" if n_over > 1 else "")
                    + "; the older msccl executor allows 256 (--xml-max-steps 256 or --xml-legacy)")
    big = max(xs, key=lambda x: x.cnt, default=None)
    if big is not None and big.cnt > lim.max_count:
        msgs.append(f"rank {big.rank} thread block {tbs[big.rank][big.mtb].id} step {big.s} moves {big.cnt} "
                    f"chunks at once, but the target runtime allows at most {lim.max_count} "
                    f"(--xml-max-count)")
    far = [(off + x.cnt - 1, x) for x in xs for buf, off in ((x.sbuf, x.soff), (x.dbuf, x.doff))
           if buf != Buf.NONE and off + x.cnt - 1 > lim.max_offset]
    if far:
        off, x = max(far, key=lambda t: t[0])
        msgs.append(f"rank {x.rank} thread block {x.mtb} step {x.s} uses chunk offset {off}, but the target "
                    f"runtime stores offsets up to {lim.max_offset}")
    late = [(t, xs[d].mtb) for lst in tbs.values() for t in lst for i in t.members for d in xs[i].deps
            if xs[d].mtb > lim.max_dep_tb]
    if late:
        t, target = late[0]
        msgs.append(f"{desc(t)} waits for thread block {target} of its rank, but dependency targets must have "
                    f"ids <= {lim.max_dep_tb} in the target runtime")
    nch = max((t.ch for lst in tbs.values() for t in lst), default=0) + 1
    if nch > lim.max_channels:
        msgs.append(f"the program uses {nch} channels, but the target runtime has {lim.max_channels} "
                    f"(--xml-max-channels)")
    for rank in sorted(tbs):
        lst = tbs[rank]
        if len(lst) > lim.max_tbs:
            msgs.append(f"rank {rank} needs {len(lst)} thread blocks, more than the runtime's {lim.max_tbs}")
            break
    done = False
    for rank in sorted(tbs):
        per: dict[tuple[int, str], int] = defaultdict(int)
        for t in tbs[rank]:
            if t.send >= 0:
                per[(t.ch, "sending")] += 1
            if t.recv >= 0:
                per[(t.ch, "receiving")] += 1
        for (ch, kind), c in sorted(per.items()):
            if c > lim.max_tbs_per_channel:
                msgs.append(f"rank {rank} has {c} thread blocks {kind} on channel {ch}, but the runtime "
                            f"allows {lim.max_tbs_per_channel} per channel, and spreading connections over "
                            f"{lim.max_channels} channels does not make room (--xml-max-tbs-per-channel, "
                            f"--xml-max-channels)")
                done = True
                break
        if done:
            break
    for rank in sorted(tbs):
        nodes = 1 + ir.nranks + len(tbs[rank]) + sum(t.nsteps for t in tbs[rank])
        if nodes > lim.max_xml_nodes:
            msgs.append(f"rank {rank} needs {nodes} XML elements (algo + gpus + thread blocks + steps), but "
                        f"the runtime's XML loader holds at most {lim.max_xml_nodes}")
            break
        if len(tbs[rank]) > lim.max_children or ir.nranks > lim.max_children:
            msgs.append(f"rank {rank}: more than {lim.max_children} child elements in one XML element")
            break
    if msgs:
        raise _err(["the algorithm does not fit the MSCCL runtime: " + m for m in msgs])


# ---------------------------------------------------------------------------------------------
def _message_src(xs: list[_X], i: int) -> tuple[int, int]:
    """(buffer, offset) of the data a sending primitive puts on the wire."""
    x = xs[i]
    if x.op in (Op.RECV_COPY_SEND, Op.RECV_REDUCE_COPY_SEND):
        return x.dbuf, x.doff
    return x.sbuf, x.soff


def _step_fields(xs: list[_X], i: int) -> tuple[int, int, int, int]:
    """srcbuf/srcoff/dstbuf/dstoff: local operands, remote ones where the op has none."""
    x = xs[i]
    sb, so, db, do = x.sbuf, x.soff, x.dbuf, x.doff
    if x.op in (Op.SEND, Op.RECV_REDUCE_SEND):
        rcv = x.peer_x2 if x.op.receives else x.peer_x
        db, do = xs[rcv].dbuf, xs[rcv].doff
        if db == Buf.NONE:      # the receiver forwards without storing (rrs): name its source
            db, do = xs[rcv].sbuf, xs[rcv].soff
    if x.op == Op.RECV:
        sb, so = _message_src(xs, x.peer_x)
    if x.op == Op.RECV_COPY_SEND:
        sb, so = db, do
    return sb, so, db, do


def _quick_step_check(ir: ProgramIR, lim: XmlLimits) -> None:
    """Refuse at once (numpy, before the per-primitive export) a program whose MSCCL thread blocks
    must exceed ``lim.max_steps``: every primitive that sends to peer ``p`` on channel ``c`` (or
    receives from it) lands in the one MSCCL thread block that owns that connection end, one step
    or more each, so the largest such count is a lower bound on that thread block's steps."""
    P = ir.prims
    worst = None
    for peer, what in (("send_peer", "sends to"), ("recv_peer", "receives from")):
        m = P[peer] >= 0
        if not m.any():
            continue
        key = (P["rank"][m].astype(np.int64) * (ir.nranks + 1) + P[peer][m]) * (1 << 16) + P["channel"][m]
        keys, counts = np.unique(key, return_counts=True)
        i = int(np.argmax(counts))
        if worst is None or counts[i] > worst[0]:
            k = int(keys[i])
            rank, rest = divmod(k >> 16, ir.nranks + 1)
            worst = (int(counts[i]), rank, what, rest, k & 0xFFFF, int((counts > lim.max_steps).sum()))
    if worst is not None and worst[0] > lim.max_steps:
        n, rank, what, peer, ch, n_over = worst
        raise _err([f"the algorithm does not fit the MSCCL runtime: rank {rank} {what} rank {peer} on "
                    f"channel {ch} in {n} primitives, all in one MSCCL "
                    f"thread block of at least {n} steps, but the target runtime runs at most "
                    f"{lim.max_steps} per thread block"
                    + (f" ({n_over - 1} more connection(s) are too long)" if n_over > 1 else "")
                    + "; the older msccl executor allows 256 (--xml-max-steps 256 or --xml-legacy)"])


def export_algorithm(alg, limits: XmlLimits | None = None, *, fuse: bool = False, instances: int = 1,
                     chunk_bytes: int = 1 << 20, name: str | None = None) -> tuple[ProgramIR, str]:
    """An Algorithm as MSCCL XML, built for the way the runtimes execute it: (program, text).

    The runtimes run every thread block's whole step list once per slice (algorithm-level
    execution), so the export starts from the program that execution runs best
    (:func:`hccc.compiler.passes.build.build_algorithm_level`: the algorithm's steps in order, one
    thread block per connection end) rather than from hccc's task-level kernels, whose thread
    blocks serve several connections one after another and would serialise them slice by slice.
    The runtime limits are checked on the transfer table first
    (:func:`~hccc.compiler.interop.msccl_limits.check_algorithm_fits`), so a program that cannot fit
    is refused before anything is built."""
    from hccc.compiler.interop.msccl_limits import check_algorithm_fits
    from hccc.compiler.passes.build import build_algorithm_level
    lim = limits or XmlLimits()
    if alg.header.collective.value not in ("allgather", "allreduce", "reducescatter", "alltoall"):
        raise _err([f"cannot export collective '{alg.header.collective.value}': hccc exports AllGather, "
                    f"AllReduce, ReduceScatter and AllToAll (an MSCCL <algo> has no root attribute)"])
    check_algorithm_fits(alg, lim, instances=instances, fuse=fuse)
    ir = build_algorithm_level(alg, chunk_bytes=chunk_bytes, name=name)
    return ir, export_xml(ir, lim, fuse=fuse, instances=instances)


def export_xml(ir: ProgramIR, limits: XmlLimits | None = None, *, fuse: bool = False, instances: int = 1,
               prove: bool = True) -> str:
    """The MSCCL XML text of ``ir``; raises :class:`CompileError` when it exceeds ``limits``.

    ``fuse``: receives and the sends forwarding what they stored become one ``rcs``/``rrcs``/``rrs``
    step where their connection ends can share a TB (:func:`_fuse_forwarding`). ``instances``: ``k``
    copies of the program on their own TBs and channels, each moving ``1/k`` of every chunk
    (:func:`_instantiate`). Fused output, and instances of programs with multi-chunk steps, are
    re-read with the importer, which proves the collective and checks deadlock freedom under the
    runtimes' execution (``prove``); a fused export that fails is written unfused, an instanced one
    is refused. Instances of one-chunk steps are a renaming of the one-instance export's chunks
    (:func:`_instantiate`) and are not re-read.
    """
    lim = limits or XmlLimits()
    if instances < 1:
        raise ValueError("instances must be at least 1")
    _quick_step_check(ir, lim)
    # the export builds a few Python objects per primitive and frees none of them until it ends:
    # the cyclic collector would rescan all of them again and again (a third of the time)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _export_checked(ir, lim, fuse, instances, prove)
    finally:
        if enabled:
            gc.enable()


def _export_checked(ir: ProgramIR, lim: XmlLimits, fuse: bool, instances: int, prove: bool) -> str:
    try:
        check_structure(ir)
        check_fifo_order(ir)
        if ir.algorithm_level:
            # an MSCCL-style program (imported XML): deadlock-free the way the runtimes run it
            check_deadlock_buffered(ir, MESSAGES_IN_FLIGHT[lim.proto])
        else:
            check_deadlock(ir)
    except (IRFormatError, ProofError) as exc:
        raise _err([f"cannot export an invalid program: {exc}"]) from None
    if ir.collective not in ("allgather", "allreduce", "reducescatter", "alltoall"):
        raise _err([f"cannot export collective '{ir.collective}': hccc exports AllGather, AllReduce, "
                     f"ReduceScatter and AllToAll (an MSCCL <algo> has no root attribute)"])
    xs0 = _from_ir(ir)
    _allgather_sources(ir, xs0)
    for fused in ((True, False) if fuse else (False,)):
        xs = _fuse_forwarding([_copy(x) for x in xs0]) if fused else xs0
        if fused and xs is xs0:
            continue          # nothing to fuse: the plain export below is the same
        try:
            text = _export(ir, xs, lim, instances)
        except _OrderCycle:
            if not fused:
                raise
            continue          # fusing ordered two thread blocks against a path between them
        if not prove or (not fused and (instances == 1 or _relabels(xs))):
            return text
        try:
            from hccc.compiler.interop.msccl_import import import_xml_text
            import_xml_text(text, f"{ir.name}.xml")
            return text
        except CompileError as exc:
            if not fused:
                raise _err([f"cannot export {instances} instances of this program: "
                            + "; ".join(d.message for d in exc.diagnostics[:2])]) from None
    raise AssertionError("unreachable")


def _export(ir: ProgramIR, xs0: list[_X], lim: XmlLimits, instances: int) -> str:
    """Thread blocks, dependencies, limits and text for prepared primitives ``xs0``."""
    base = _unfuse(xs0)
    # first try merging the pieces of each hccc thread block (fewer TBs); if that breaks a limit
    # (long TBs), fall back to one MSCCL TB per group of connection ends
    for merge in (lim.max_steps, 0):
        xs = [_copy(x) for x in base]
        tbs = _assign_tbs(xs, merge)
        _spread_channels(tbs, lim)
        _reduce_deps(xs, tbs)
        _targets_first(xs, tbs)
        _number_steps(xs, tbs)
        if instances > 1 and _instances_fit(ir, xs, tbs, lim, instances):
            break
        try:
            # one instance, or instances that break a limit: the materialised copies say which
            _check_limits(ir, *_instantiate(xs, tbs, instances), lim)
            break
        except CompileError:
            if merge == 0:
                raise
    k = instances
    nch = max((t.ch for lst in tbs.values() for t in lst), default=0) + 1
    st = ir.stats or {}
    inplace = 1 if st.get("msccl_inplace", True) else 0
    outofplace = 1 if st.get("msccl_outofplace", True) else 0
    out = [f'<algo name="{ir.name}" proto="{lim.proto}" nchannels="{nch * k}" nchunksperloop="{ir.nchunks * k}" '
           f'ngpus="{ir.nranks}" coll="{ir.collective}" inplace="{inplace}" outofplace="{outofplace}" '
           f'minBytes="{lim.min_bytes}" maxBytes="{lim.max_bytes}">']
    L = LETTER_OF_BUF
    for rank in range(ir.nranks):
        out.append(f'  <gpu id="{rank}" i_chunks="{ir.in_chunks * k}" o_chunks="{ir.out_chunks * k}" '
                   f's_chunks="{ir.scratch_chunks * k}">')
        for t in sorted(tbs.get(rank, []), key=lambda t: t.id):
            # each step once as text around its instance-dependent numbers (instance i: TB ids
            # mtb*k + i, chunk offsets off*k + i*cnt; see _instantiate); None is written -1
            steps = []
            for m in t.members:
                x = xs[m]
                deps = sorted(x.deps, key=lambda d: (xs[d].mtb, xs[d].s))
                for j, d in enumerate(deps[:-1]):        # nops carrying the extra dependencies
                    steps.append((f'      <step s="{x.s - len(deps) + 1 + j}" type="nop" srcbuf="i" srcoff="',
                                  None, '" dstbuf="o" dstoff="', None, '" cnt="0" depid="', xs[d].mtb,
                                  f'" deps="{xs[d].s}" hasdep="0"/>', 0))
                sb, so, db, do = _step_fields(xs, m)
                steps.append((f'      <step s="{x.s}" type="{TYPE_OF_OP[x.op]}" srcbuf="{L.get(sb, "i")}" srcoff="',
                              so if sb != Buf.NONE else None, f'" dstbuf="{L.get(db, "o")}" dstoff="',
                              do if db != Buf.NONE else None, f'" cnt="{x.cnt}" depid="',
                              xs[deps[-1]].mtb if deps else None,
                              f'" deps="{xs[deps[-1]].s if deps else -1}" hasdep="{1 if x.hasdep else 0}"/>', x.cnt))
            for i in range(k):
                out.append(f'    <tb id="{t.id * k + i}" send="{t.send}" recv="{t.recv}" chan="{i * nch + t.ch}">')
                for head, so, mid, do, tail, dep, end, cnt in steps:
                    out.append(f"{head}{-1 if so is None else so * k + i * cnt}{mid}"
                               f"{-1 if do is None else do * k + i * cnt}{tail}"
                               f"{-1 if dep is None else dep * k + i}{end}")
                out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def export_summary(text: str) -> dict:
    """Counts of an exported text (thread blocks, steps, nops) for progress messages."""
    return {"tbs": text.count("<tb "), "steps": text.count("<step "), "nops": text.count('type="nop"')}


__all__ = ["export_xml", "export_algorithm", "export_summary"]
