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

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from networkx.utils import UnionFind

from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure, match_connections
from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered
from hccc.compiler.interop.msccl_format import LETTER_OF_BUF, MESSAGES_IN_FLIGHT, TYPE_OF_OP, XmlLimits
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op, ProgramIR

_FUSED = (Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND)


@dataclass
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


def _copy(x: _X) -> _X:
    y = _X(**{f: getattr(x, f) for f in _X.__dataclass_fields__})
    y.deps = set(x.deps)
    return y


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
    is_nop = [p["op"][i] == Op.NOP for i in range(n)]
    same_prev = [i > 0 and p["rank"][i] == p["rank"][i - 1] and p["tb"][i] == p["tb"][i - 1] for i in range(n)]
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
    xs = []
    for i in keep:
        d = set()
        for t in deps[i]:
            d |= resolve(t)
        if same_prev[i] and is_nop[i - 1]:
            d |= resolve(i - 1)
        d.discard(i)
        op = Op(p["op"][i])
        xs.append(_X(rank=p["rank"][i], htb=p["tb"][i], pos=float(p["seq"][i]), op=op,
                     sp=p["send_peer"][i], rp=p["recv_peer"][i], ch=p["channel"][i],
                     sbuf=p["src_buf"][i], soff=p["src_off"][i], dbuf=p["dst_buf"][i],
                     doff=p["dst_off"][i], cnt=p["count"][i], deps={new_index[t] for t in d}))
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


def _end_components(xs: list[_X]):
    """Union-find over connection ends joined by forwarding primitives: (find, {root: [send ends, recv ends]})."""
    uf = UnionFind()
    for x in xs:
        se = (x.rank, "s", x.sp, x.ch) if x.sp >= 0 else None
        re_ = (x.rank, "r", x.rp, x.ch) if x.rp >= 0 else None
        uf.union(*(e for e in (se, re_) if e is not None))
    comps: dict = defaultdict(lambda: [set(), set()])
    for e in list(uf.parents):
        comps[uf[e]][0 if e[1] == "s" else 1].add(e)
    return uf.__getitem__, comps



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
            raise AssertionError("internal error: dependency cycle after splitting thread blocks")
        vc: dict[int, np.ndarray] = {}
        for i in order:
            x = xs[i]
            t = lst[x.mtb]
            base = vc[t.members[x.idx - 1]].copy() if x.idx > 0 else np.zeros(T, np.int64)
            cand = [d for d in sorted(x.deps) if base[xs[d].mtb] < xs[d].idx + 1]
            keep = []
            for d in cand:
                implied = any(vc[e][xs[d].mtb] >= xs[d].idx + 1 for e in cand if e != d)
                if not implied:
                    keep.append(d)
            for d in keep:
                np.maximum(base, vc[d], out=base)
            base[x.mtb] = x.idx + 1
            vc[i] = base
            x.deps = set(keep)


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
        rcv = x.peer_x
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


def export_xml(ir: ProgramIR, limits: XmlLimits | None = None) -> str:
    """The MSCCL XML text of ``ir``; raises :class:`CompileError` when it exceeds ``limits``."""
    lim = limits or XmlLimits()
    _quick_step_check(ir, lim)
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
    xs = _from_ir(ir)
    _allgather_sources(ir, xs)
    base = _unfuse(xs)
    # first try merging the pieces of each hccc thread block (fewer TBs); if that breaks a limit
    # (long TBs), fall back to one MSCCL TB per group of connection ends
    for merge in (lim.max_steps, 0):
        xs = [_copy(x) for x in base]
        tbs = _assign_tbs(xs, merge)
        _spread_channels(tbs, lim)
        _reduce_deps(xs, tbs)
        _targets_first(xs, tbs)
        _number_steps(xs, tbs)
        try:
            _check_limits(ir, xs, tbs, lim)
            break
        except CompileError:
            if merge == 0:
                raise
    nch = max((t.ch for lst in tbs.values() for t in lst), default=0) + 1
    st = ir.stats or {}
    inplace = 1 if st.get("msccl_inplace", True) else 0
    outofplace = 1 if st.get("msccl_outofplace", True) else 0
    out = [f'<algo name="{ir.name}" proto="{lim.proto}" nchannels="{nch}" nchunksperloop="{ir.nchunks}" '
           f'ngpus="{ir.nranks}" coll="{ir.collective}" inplace="{inplace}" outofplace="{outofplace}" '
           f'minBytes="{lim.min_bytes}" maxBytes="{lim.max_bytes}">']
    L = LETTER_OF_BUF
    for rank in range(ir.nranks):
        out.append(f'  <gpu id="{rank}" i_chunks="{ir.in_chunks}" o_chunks="{ir.out_chunks}" '
                   f's_chunks="{ir.scratch_chunks}">')
        for t in tbs.get(rank, []):
            out.append(f'    <tb id="{t.id}" send="{t.send}" recv="{t.recv}" chan="{t.ch}">')
            for i in t.members:
                x = xs[i]
                deps = sorted(x.deps, key=lambda d: (xs[d].mtb, xs[d].s))
                for d in deps[:-1]:
                    out.append(f'      <step s="{x.s - len(deps) + 1 + deps.index(d)}" type="nop" srcbuf="i" '
                               f'srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="{xs[d].mtb}" '
                               f'deps="{xs[d].s}" hasdep="0"/>')
                sb, so, db, do = _step_fields(xs, i)
                dep_id, dep_s = (xs[deps[-1]].mtb, xs[deps[-1]].s) if deps else (-1, -1)
                out.append(f'      <step s="{x.s}" type="{TYPE_OF_OP[x.op]}" srcbuf="{L.get(sb, "i")}" '
                           f'srcoff="{so if sb != Buf.NONE else -1}" dstbuf="{L.get(db, "o")}" '
                           f'dstoff="{do if db != Buf.NONE else -1}" cnt="{x.cnt}" depid="{dep_id}" '
                           f'deps="{dep_s}" hasdep="{1 if x.hasdep else 0}"/>')
            out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def export_summary(text: str) -> dict:
    """Counts of an exported text (thread blocks, steps, nops) for progress messages."""
    return {"tbs": text.count("<tb "), "steps": text.count("<step "), "nops": text.count('type="nop"')}


__all__ = ["export_xml", "export_summary"]
