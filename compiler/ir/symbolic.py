"""Symbolic proof that a ProgramIR implements its collective, independent of any data.

Used by the MSCCL XML importer (an imported program comes with no proof) and by tests as an oracle
that shares only the collective's definition (its spec) with the ResCCLang verifier.

Model. Every chunk slot ``(rank, buffer, index)`` holds a symbolic value: *nothing* (never written,
garbage), or ``(chunk c, contributors S)`` meaning "chunk ``c`` of the collective reduced over the
ranks in ``S``", or a *poison* that remembers the first primitive that combined values wrongly
(two different chunks, a contributor counted twice, undefined data). The collective's
precondition and postcondition come from its spec (:mod:`hccc.compiler.frontend.collectives`):
initially every start holder's input slot of a chunk holds ``(chunk id, {holder})``, outputs and
scratch hold nothing; at the end every output slot the postcondition names must hold its chunk
with the contributions it requires (all ranks for a reducing collective, the one it came from
otherwise). The primitives act as in :mod:`hccc.compiler.ir.program_ir` (a reduction is the
disjoint union of the contributor sets).

In-place runs alias buffers as the spec's :attr:`~hccc.compiler.frontend.collectives.CollectiveSpec.alias`
says (AllGather ``input[j] = output[r*k + j]``, ReduceScatter ``output[j] = input[r*k + j]``, AllReduce
and AllToAll ``input = output``) and a COPY whose source and destination coincide does nothing; :func:`prove` checks either mode.

Order. The value computed is the value of *every* execution only if no two primitives that touch
one slot (one of them writing) can run in either order. Happens-before is program order within a
TB, cross-TB dependencies, and "a send happens before its matched receive". :func:`check_races`
decides it exactly with vector clocks (one clock entry per thread block, computed level by level,
wide levels in numpy and narrow ones per primitive, in column blocks to bound memory): sorting the
accesses of each slot in one topological order, it suffices that every access is ordered after the
previous write and every read before the next write. The symbolic run then follows that same topological order, one primitive at a time
(a receive takes the values its matched send put on the wire).

Deadlocks. Happens-before itself must be acyclic (:func:`prim_order`). For MSCCL's execution --
every thread block runs its whole program once per slice, connections buffer messages --
:func:`check_deadlock_buffered` adds "the k-th send of a connection waits until message
k - capacity was received" and checks acyclicity again. hccc's own kernels run each primitive for
every micro-batch before the next (task-level); their stricter model is
:func:`hccc.compiler.ir.check.check_deadlock`.

Every failure raises :class:`ProofError` naming the primitives involved (``prims``), so callers can
point at their own source locations; ``describe`` callbacks turn primitive indices into text.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hccc.compiler.frontend.collectives import ALL, DEST, OWN, ROOT, spec_of
from hccc.compiler.ir.check import CYCLE_EDGES_SHOWN, cycle_text, describe_prim, match_connections
from hccc.compiler.ir.levels import NARROW_LEVEL, graph_levels
from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR
from hccc.util.plural import plural, plural_noun

_READS = np.array([Op(i).reads_src for i in range(len(Op))])
_WRITES = np.array([Op(i).writes_dst for i in range(len(Op))])

#: the most chunk slots (every rank's input, output and scratch chunks: :func:`proof_slots`) the
#: proof takes: it holds a Python value per slot, about 500 bytes each (an AllGather on 2,000 GPUs,
#: 4 M slots: 2.0 GB and 40 s), so this bounds a proof at about 2 GB; a 1,024-GPU AllGather of one
#: chunk per rank needs 1 M. An 8-rank program whose ProgramIR declared 4,096 ranks (16.8 M
#: slots) took 127 s and 7.8 GB before ending "out of memory"
MAX_PROOF_SLOTS = 1 << 22


def proof_slots(ir: ProgramIR) -> int:
    """The chunk slots :func:`prove` holds a value for: every rank's input, output and scratch."""
    return int(ir.nranks) * (int(ir.in_chunks) + int(ir.out_chunks) + int(ir.scratch_chunks))


#: bytes of vector-clock storage per column block (int32 entries)
VC_BUDGET = 1 << 26


class ProofError(Exception):
    """The program is wrong: ``kind`` "value" (a wrong result), "race" or "deadlock"; ``prims`` are
    the primitives to blame (the first one is the best place to point at); ``slot``: a race's
    physical slot (:class:`Slots`), for a front end that names it in its own terms."""

    def __init__(self, message: str, prims=(), kind: str = "value", slot: int | None = None):
        super().__init__(message)
        self.prims = [int(p) for p in prims]
        self.kind = kind  # "race" | "value"
        self.slot = slot


class _Poison:
    __slots__ = ("reason", "prim")

    def __init__(self, reason: str, prim: int):
        self.reason = reason
        self.prim = prim


# ---------------------------------------------------------------------------------------------
# slots
# ---------------------------------------------------------------------------------------------
class Slots:
    """Physical slot ids of ``(rank, buffer, index)`` in one execution mode."""

    def __init__(self, ir: ProgramIR, inplace: bool):
        self.ir = ir
        self.inplace = inplace
        self.sizes = np.array([0, ir.in_chunks, ir.out_chunks, ir.scratch_chunks], np.int64)
        self.base = np.array([0, 0, ir.in_chunks, ir.in_chunks + ir.out_chunks], np.int64)
        self.per_rank = int(ir.in_chunks + ir.out_chunks + ir.scratch_chunks)
        try:
            self.spec = spec = spec_of(ir.collective)
        except ValueError:
            raise ProofError(f"unsupported collective '{ir.collective}'") from None
        N, C, coll = int(ir.nranks), int(ir.nchunks), ir.collective
        if spec.split_by_rank and C % N:
            raise ProofError(f"{coll}: nchunks = {C} is not a multiple of {N} ranks")
        #: chunks each rank owns (None when the collective has no such split)
        self.k = C // N if spec.split_by_rank else None
        for what, have in (("input", ir.in_chunks), ("output", ir.out_chunks)):
            want = spec.slots(what, N, C)
            if have != want:
                layout = spec.input if what == "input" else spec.output
                part = f"nchunks / nranks = {C} / {N}" if layout == OWN else f"nchunks = {C}"
                raise ProofError(f"{coll}: the {what} buffer has {plural(int(have), 'chunk')}, expected {part}")
        self.nphys = self.per_rank * ir.nranks

    def phys(self, rank, buf, off):
        """Vectorised physical slot of (rank, buf, off) (buf NONE gives garbage; mask it)."""
        rank = np.asarray(rank, np.int64)
        buf = np.asarray(buf, np.int64)
        off = np.asarray(off, np.int64)
        if self.inplace:   # the collective's overlay of the two buffers
            alias = self.spec.alias
            if alias == "same":
                buf = np.where(buf == Buf.INPUT, Buf.OUTPUT, buf)
            else:
                part, whole = (Buf.INPUT, Buf.OUTPUT) if alias == "input in output" else (Buf.OUTPUT, Buf.INPUT)
                ali = buf == part
                off = np.where(ali, rank * self.k + off, off)
                buf = np.where(ali, whole, buf)
        return rank * self.per_rank + self.base[buf] + off

    def name(self, slot: int) -> str:
        """``rank R output chunk C`` for a physical slot (aliased slots are named by the full buffer)."""
        rank, local = divmod(int(slot), self.per_rank)
        ir = self.ir
        if local < ir.in_chunks:
            return f"rank {rank} input chunk {local}"
        if local < ir.in_chunks + ir.out_chunks:
            return f"rank {rank} output chunk {local - ir.in_chunks}"
        return f"rank {rank} scratch chunk {local - ir.in_chunks - ir.out_chunks}"


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for every (s, c)."""
    counts = counts.astype(np.int64)
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    offs = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts.astype(np.int64), counts) + (np.arange(total, dtype=np.int64) - offs)


# ---------------------------------------------------------------------------------------------
# order
# ---------------------------------------------------------------------------------------------
def _edges(ir: ProgramIR, capacity: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Happens-before edges (program order, dependencies, send -> matched receive); with
    ``capacity`` also "message k-capacity received before message k is sent" on every connection."""
    p = ir.prims
    rank = p["rank"].astype(np.int64)
    tb = p["tb"].astype(np.int64)
    po = np.flatnonzero((rank[1:] == rank[:-1]) & (tb[1:] == tb[:-1]))
    s, r = match_connections(ir)
    src = [po, np.asarray(ir.dep_on, np.int64), s]
    dst = [po + 1, np.asarray(ir.dep_prim, np.int64), r]
    if capacity is not None and len(s) > capacity:
        # s and r are sorted by connection, in message order; consecutive entries of one connection
        N = int(ir.nranks)
        ch = p["channel"].astype(np.int64)
        nch = int(ch.max()) + 1 if len(ch) else 1
        key = (rank[s] * N + p["send_peer"][s].astype(np.int64)) * nch + ch[s]
        same = key[capacity:] == key[:-capacity]
        src.append(r[:-capacity][same])
        dst.append(s[capacity:][same])
    return np.concatenate(src), np.concatenate(dst)


def _find_cycle(n: int, src: np.ndarray, dst: np.ndarray) -> list[int] | None:
    """Some cycle of the directed graph as a node list (each waits for the previous), or None."""
    done = graph_levels(n, src, dst) >= 0
    if done.all():
        return None
    # walk backwards through unfinished predecessors until a node repeats
    rem = ~done
    m = rem[src] & rem[dst]
    ps, pd = src[m], dst[m]
    pred = np.full(n, -1, np.int64)
    pred[pd] = ps
    v = int(np.flatnonzero(rem & (pred >= 0))[0])
    seen: dict[int, int] = {}
    path = []
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = int(pred[v])
    cyc = path[seen[v]:]
    return cyc[::-1]


def prim_order(ir: ProgramIR, describe: Callable[[int], str] | None = None,
               rng: np.random.Generator | None = None) -> np.ndarray:
    """Primitives in an order that respects happens-before (program order, dependencies, send before
    its receive), level by level (``rng``: shuffled within a level). Raises :class:`ProofError`
    (kind "deadlock") when no such order exists: then the program hangs however much the
    connections can buffer."""
    n = ir.nprims
    src, dst = _edges(ir)
    level = _levels(n, src, dst)
    if level is None:
        check_deadlock_buffered(ir, None, describe)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    return np.lexsort((tie, level))


def check_deadlock_buffered(ir: ProgramIR, capacity: int | None = 1,
                            describe: Callable[[int], str] | None = None) -> None:
    """Deadlock freedom when every thread block runs its whole program once per slice (MSCCL's
    execution) and a connection buffers ``capacity`` messages: the k-th send of a connection can
    finish once its (k - capacity)-th message has been received. Acyclicity of program order +
    dependencies + matches + these capacity edges is necessary and sufficient for one slice, and
    slices only ever wait for earlier slices."""
    describe = describe or (lambda i: describe_prim(ir, i))
    src, dst = _edges(ir, capacity)
    cyc = _find_cycle(ir.nprims, src, dst)
    if cyc is None:
        return
    pairs = list(zip(cyc[-1:] + cyc[:-1], cyc))
    text = cycle_text([f"{describe(b)} waits for {describe(a)}" for a, b in pairs[:CYCLE_EDGES_SHOWN]],
                      len(pairs))
    raise ProofError(f"deadlock: {text}", cyc[::-1], kind="deadlock")


def execution_order(ir: ProgramIR, describe=None) -> tuple[np.ndarray, np.ndarray]:
    """(primitives in a happens-before-respecting order, position of every primitive in it)."""
    order = prim_order(ir, describe)
    pos = np.empty(ir.nprims, np.int64)
    pos[order] = np.arange(ir.nprims)
    return order, pos


def _levels(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Longest-path level of every node of a DAG (sources are level 0); None if there is a cycle."""
    level = graph_levels(n, src, dst)
    return None if (level < 0).any() else level


def _tb_components(T: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Weakly connected components of the thread-block graph with edges ``a[i] -- b[i]``: a label
    per thread block (the smallest thread block of its component). Min-label propagation with
    pointer jumping, vectorised; a few rounds for the programs hccc meets."""
    lab = np.arange(T, dtype=np.int64)
    keep = a != b
    a, b = a[keep], b[keep]
    if not len(a):
        return lab
    key = np.unique(np.minimum(a, b) * T + np.maximum(a, b))
    a, b = key // T, key % T
    while True:
        m = np.minimum(lab[a], lab[b])
        new = lab.copy()
        np.minimum.at(new, a, m)
        np.minimum.at(new, b, m)
        new = new[new]
        while True:   # pointer jumping to the root
            nxt = new[new]
            if np.array_equal(nxt, new):
                break
            new = nxt
        if np.array_equal(new, lab):
            return lab
        lab = new


def _wide_clock_step(vc: np.ndarray, src: np.ndarray, dst: np.ndarray, nodes: np.ndarray,
                     mine: np.ndarray, own: np.ndarray, seq: np.ndarray) -> None:
    """One level's clocks in numpy: the level's in-edges ``src -> dst`` (sorted by ``dst``) merged
    into their targets' clocks, then its ``nodes`` on a thread block of this column block
    (``mine``) tick their own entry (column ``own``) to ``seq + 1``."""
    if len(dst):
        starts = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
        red = np.maximum.reduceat(vc[src], starts, axis=0)
        ud = dst[starts]
        vc[ud] = np.maximum(vc[ud], red)
    nodes = nodes[mine[nodes]]
    vc[nodes, own[nodes]] = seq[nodes] + 1


def happens_before(ir: ProgramIR, qa: np.ndarray, qb: np.ndarray, budget: int = VC_BUDGET,
                   narrow: int = NARROW_LEVEL) -> np.ndarray:
    """For each query ``i``: does primitive ``qa[i]`` happen before primitive ``qb[i]``?

    Exact (vector clocks over thread blocks). ``qa[i] != qb[i]`` is assumed. Only the thread
    blocks that some ``qa`` runs on get a clock entry, and happens-before never crosses a weakly
    connected component of the thread-block graph (MSCCL instances, independent channels), so the
    entries of different components share columns: a row holds the clocks of its own component's
    thread blocks only, and the width is the most queried thread blocks of one component.

    The clocks advance a level at a time: a wide level in a few numpy operations, a narrow one
    (fewer than ``narrow`` edges and nodes, :data:`hccc.compiler.ir.levels.NARROW_LEVEL`) a row
    operation per edge and node, so a deep, narrow program costs per primitive, not a numpy
    step per level (a 50,000-transfer chain: a level per primitive). No numba kernel beside it. The kernel it once had (one edge and column at a time) ran 16-36x slower
    than this loop as plain Python (``benchmarks/twins.py``, 960-3,968 primitives), so below
    numba's threshold it could not replace this loop; compiled it was 3.4-3.6x faster, for
    programs past 4 M clock entries only (docs/architecture.md, the row on numba).
    """
    qa = np.asarray(qa, np.int64)
    qb = np.asarray(qb, np.int64)
    out = np.zeros(len(qa), bool)
    if not len(qa):
        return out
    n = ir.nprims
    p = ir.prims
    rank = p["rank"].astype(np.int64)
    tb = p["tb"].astype(np.int64)
    seq = p["seq"].astype(np.int64)
    ntbs = np.asarray(ir.ntbs, np.int64)
    tb_off = np.r_[0, np.cumsum(ntbs)[:-1]]
    g = tb_off[rank] + tb
    T = int(ntbs.sum())
    src, dst = _edges(ir)
    level = graph_levels(n, src, dst, narrow)
    if (level < 0).any():
        raise ValueError("happens-before graph has a cycle (run the deadlock check first)")
    comp = _tb_components(T, g[src], g[dst])
    # column of every queried thread block: its index among its component's queried thread blocks
    need = np.unique(g[qa])
    need = need[np.lexsort((need, comp[need]))]
    first = np.r_[True, comp[need][1:] != comp[need][:-1]]
    grp_start = np.maximum.accumulate(np.where(first, np.arange(len(need)), 0))
    col = np.full(T, -1, np.int64)
    col[need] = np.arange(len(need)) - grp_start
    W = int(col.max()) + 1
    order_e = np.lexsort((dst, level[dst]))
    src, dst = src[order_e], dst[order_e]
    nlev = int(level.max()) + 1 if n else 0
    ebound = np.searchsorted(level[dst], np.arange(nlev + 1))
    order_n = np.argsort(level, kind="stable")
    nbound = np.searchsorted(level[order_n], np.arange(nlev + 1))
    same = comp[g[qa]] == comp[g[qb]]   # different components: never ordered
    width = max(1, min(W, budget // max(4 * n, 1)))
    gcol = col[g]
    qcol = gcol[qa]
    eb_l, nb_l = ebound.tolist(), nbound.tolist()
    for c0 in range(0, W, width):
        c1 = min(W, c0 + width)
        w = c1 - c0
        vc = np.zeros((n, w), np.int32)
        own = gcol - c0
        mine = (gcol >= c0) & (gcol < c1)
        for lv in range(nlev):
            e0, e1 = eb_l[lv], eb_l[lv + 1]
            n0, n1 = nb_l[lv], nb_l[lv + 1]
            if e1 - e0 < narrow and n1 - n0 < narrow:
                # a narrow level: a row operation per edge and node (a deep chain's levels)
                for d, s in zip(dst[e0:e1].tolist(), src[e0:e1].tolist()):
                    row = vc[d]
                    np.maximum(row, vc[s], out=row)
                for v in order_n[n0:n1].tolist():
                    if mine[v]:
                        vc[v, own[v]] = seq[v] + 1
                continue
            _wide_clock_step(vc, src[e0:e1], dst[e0:e1], order_n[n0:n1], mine, own, seq)
        sel = np.flatnonzero(same & (qcol >= c0) & (qcol < c1))
        a, bq = qa[sel], qb[sel]
        out[sel] = vc[bq, qcol[sel] - c0] >= seq[a] + 1
    return out


# ---------------------------------------------------------------------------------------------
# races
# ---------------------------------------------------------------------------------------------
def _skipped_copies(ir: ProgramIR, slots: Slots) -> np.ndarray:
    p = ir.prims
    op = p["op"].astype(np.int64)
    cp = op == Op.COPY
    sp = slots.phys(p["rank"], p["src_buf"], p["src_off"])
    dp = slots.phys(p["rank"], p["dst_buf"], p["dst_off"])
    return cp & (sp == dp)


def check_races(ir: ProgramIR, inplace: bool = False, pos: np.ndarray | None = None,
                describe: Callable[[int], str] | None = None) -> None:
    """Raise :class:`ProofError` (kind "race") if two unordered primitives touch one slot, one writing."""
    describe = describe or (lambda i: describe_prim(ir, i))
    slots = Slots(ir, inplace)
    if pos is None:
        _, pos = execution_order(ir, describe)
    p = ir.prims
    op = p["op"].astype(np.int64)
    skip = _skipped_copies(ir, slots)
    reads = _READS[op] & ~skip
    writes = _WRITES[op] & ~skip
    cnt = p["count"].astype(np.int64)
    ri, wi = np.flatnonzero(reads), np.flatnonzero(writes)
    rs = slots.phys(p["rank"][ri], p["src_buf"][ri], p["src_off"][ri])
    ws = slots.phys(p["rank"][wi], p["dst_buf"][wi], p["dst_off"][wi])
    prim = np.concatenate([np.repeat(ri, cnt[ri]), np.repeat(wi, cnt[wi])])
    slot = np.concatenate([_ragged(rs, cnt[ri]), _ragged(ws, cnt[wi])])
    isw = np.concatenate([np.zeros(int(cnt[ri].sum()), bool), np.ones(int(cnt[wi].sum()), bool)])
    if not len(prim):
        return
    o = np.lexsort((isw, pos[prim], slot))
    prim, slot, isw = prim[o], slot[o], isw[o]
    m = len(prim)
    idx = np.arange(m)
    seg = np.r_[True, slot[1:] != slot[:-1]]
    seg_start = np.maximum.accumulate(np.where(seg, idx, 0))
    # previous write (strictly before i) within the slot
    wpos = np.where(isw, idx, -1)
    last_w_incl = np.maximum.accumulate(wpos)
    prev_w = np.r_[-1, last_w_incl[:-1]]
    prev_w = np.where(prev_w >= seg_start, prev_w, -1)
    # next write (strictly after i) within the slot
    seg_end = np.r_[np.flatnonzero(seg)[1:], m]
    seg_end_of = np.repeat(seg_end, np.diff(np.r_[np.flatnonzero(seg), m]))
    wpos2 = np.where(isw, idx, m)
    next_w_incl = np.minimum.accumulate(wpos2[::-1])[::-1]
    next_w = np.r_[next_w_incl[1:], m]
    next_w = np.where(next_w < seg_end_of, next_w, -1)
    qa_l, qb_l, qi = [], [], []
    a = prev_w >= 0
    qa_l.append(prim[prev_w[a]])
    qb_l.append(prim[a])
    qi.append(idx[a])
    b = (~isw) & (next_w >= 0)
    qa_l.append(prim[b])
    qb_l.append(prim[next_w[b]])
    qi.append(idx[b])
    qa = np.concatenate(qa_l)
    qb = np.concatenate(qb_l)
    qs = slot[np.concatenate(qi)]
    keep = qa != qb
    qa, qb, qs = qa[keep], qb[keep], qs[keep]
    if not len(qa):
        return
    ok = happens_before(ir, qa, qb)
    bad = np.flatnonzero(~ok)
    if len(bad):
        j = int(bad[np.argmin(pos[qb[bad]])])
        x, y = int(qa[j]), int(qb[j])

        def verb(i):
            w = bool(writes[i]) and slots.phys(p["rank"][i], p["dst_buf"][i], p["dst_off"][i]) <= qs[j] < \
                slots.phys(p["rank"][i], p["dst_buf"][i], p["dst_off"][i]) + cnt[i]
            return "writes" if w else "reads"
        more = len(np.unique(qs[bad])) - 1
        raise ProofError(
            f"data race on {slots.name(int(qs[j]))}{' (in-place run)' if inplace else ''}: "
            f"{describe(y)} {verb(y)} it while {describe(x)} {verb(x)} it, and neither waits for the "
            f"other (add a dependency)" + (f"; {more} more {'slot races' if more == 1 else 'slots race'}" if more > 0 else ""),
            [y, x], kind="race", slot=int(qs[j]))


# ---------------------------------------------------------------------------------------------
# symbolic run
# ---------------------------------------------------------------------------------------------
def _fmt_set(mask: int, limit: int = 8) -> str:
    ids = []
    i = 0
    while mask and len(ids) <= limit:
        if mask & 1:
            ids.append(i)
        mask >>= 1
        i += 1
    s = ", ".join(map(str, ids[:limit]))
    return "{" + s + (", ..." if len(ids) > limit or mask else "") + "}"


def simulate(ir: ProgramIR, inplace: bool = False, order=None, describe=None):
    """Symbolic values of every physical slot after the run, the last writer of each slot, and the
    :class:`Slots` naming them. ``order``: primitives in a happens-before order (default
    :func:`prim_order`)."""
    describe = describe or (lambda i: describe_prim(ir, i))
    slots = Slots(ir, inplace)
    N = ir.nranks
    val: list = [None] * slots.nphys
    # the precondition: every start holder's input slot holds (chunk id, {holder})
    spec = slots.spec
    rr, ids, contrib = spec.start_holders(N, ir.nchunks, ir.root)
    cc = spec.slot("input", rr, ids, N, ir.nchunks)
    at = slots.phys(rr, np.full(len(rr), int(Buf.INPUT), np.int64), cc)
    for slot, cid, r in zip(at.tolist(), ids.tolist(), contrib.tolist()):
        val[slot] = (cid, 1 << r)
    writer = [-1] * slots.nphys
    if order is None:
        order = prim_order(ir, describe)
    p = ir.prims
    s_m, r_m = match_connections(ir)
    sender = np.full(ir.nprims, -1, np.int64)
    sender[r_m] = s_m
    sender_l = sender.tolist()
    opl = p["op"].tolist()
    cnt = p["count"].tolist()
    sphys = slots.phys(p["rank"], p["src_buf"], p["src_off"]).tolist()
    dphys = slots.phys(p["rank"], p["dst_buf"], p["dst_off"]).tolist()
    wire: dict[int, list] = {}   # sending primitive -> the values it put on the wire

    def red(a, b, i):
        if isinstance(a, _Poison):
            return a
        if isinstance(b, _Poison):
            return b
        if a is None or b is None:
            return _Poison(f"{describe(i)} reduces a chunk that holds no data", i)
        if a[0] != b[0]:
            return _Poison(f"{describe(i)} combines chunk {a[0]} with chunk {b[0]}", i)
        if a[1] & b[1]:
            return _Poison(f"{describe(i)} counts {plural_noun(bin(a[1] & b[1]).count('1'), 'rank')} {_fmt_set(a[1] & b[1])} twice in chunk {a[0]}", i)
        return (a[0], a[1] | b[1])

    for i in np.asarray(order).tolist():
        o = opl[i]
        c = cnt[i]
        s0, d0 = sphys[i], dphys[i]
        v = wire.pop(sender_l[i]) if sender_l[i] >= 0 else None
        if o == Op.SEND:
            wire[i] = val[s0:s0 + c]
        elif o == Op.RECV:
            val[d0:d0 + c] = v
            writer[d0:d0 + c] = [i] * c
        elif o == Op.RECV_COPY_SEND:
            val[d0:d0 + c] = v
            writer[d0:d0 + c] = [i] * c
            wire[i] = v
        elif o == Op.RECV_REDUCE_COPY or o == Op.RECV_REDUCE_COPY_SEND:
            v = [red(v[j], val[s0 + j], i) for j in range(c)]
            val[d0:d0 + c] = v
            writer[d0:d0 + c] = [i] * c
            if o == Op.RECV_REDUCE_COPY_SEND:
                wire[i] = v
        elif o == Op.RECV_REDUCE_SEND:
            wire[i] = [red(v[j], val[s0 + j], i) for j in range(c)]
        elif o == Op.COPY:
            if s0 != d0:
                val[d0:d0 + c] = val[s0:s0 + c]
                writer[d0:d0 + c] = [i] * c
        elif o == Op.REDUCE:
            val[d0:d0 + c] = [red(val[d0 + j], val[s0 + j], i) for j in range(c)]
            writer[d0:d0 + c] = [i] * c
    return val, writer, slots


def _expected(ir: ProgramIR, slots: Slots):
    """[(physical slot, (chunk, mask)), ...] the postcondition requires (its output slots)."""
    N, spec = ir.nranks, slots.spec
    full = (1 << N) - 1
    rr, ids, want = spec.end_holders(N, ir.nchunks, ir.root)
    at = slots.phys(rr, np.full(len(rr), int(Buf.OUTPUT), np.int64),
                    spec.slot("output", rr, ids, N, ir.nchunks))
    return [(slot, (cid, full if w == ALL else 1 << w))
            for slot, cid, w in zip(at.tolist(), ids.tolist(), want.tolist())]


def check_postcondition(ir: ProgramIR, inplace: bool = False, order=None, describe=None) -> None:
    """Raise :class:`ProofError` unless every output slot ends with the collective's value."""
    describe = describe or (lambda i: describe_prim(ir, i))
    val, writer, slots = simulate(ir, inplace, order, describe)
    N = ir.nranks
    bad = []
    for slot, want in _expected(ir, slots):
        if val[slot] != want:
            bad.append((slot, want))
    if not bad:
        return
    slot, want = bad[0]
    got = val[slot]
    w = writer[slot]
    where = slots.name(slot) + (" (in-place run)" if inplace else "")
    spec = slots.spec
    if spec.reduces:
        need = f"chunk {want[0]} reduced over all {N} ranks"
    elif spec.end == DEST:   # one destination per id: name the block it is
        src_r, dst_r, piece = spec.block_of(want[0], N, ir.nchunks)
        need = f"block {want[0]} (piece {piece} of what rank {src_r} sends to rank {dst_r})"
    else:
        src_r = want[1].bit_length() - 1
        need = f"chunk {want[0]} (from {'root' if spec.start == ROOT else 'rank'} {src_r})"
    if isinstance(got, _Poison):
        msg = f"{where} must hold {need}, but {got.reason}"
        prims = [got.prim]
    elif got is None:
        if w < 0:
            msg = f"{where} must hold {need}, but nothing ever writes it"
            prims = []
        else:
            msg = f"{where} must hold {need}, but {describe(w)} stores undefined data there"
            prims = [w]
    elif got[0] != want[0]:
        msg = f"{where} must hold {need}, but holds chunk {got[0]}" + (f" (written by {describe(w)})"
                                                                       if w >= 0 else "")
        prims = [w] if w >= 0 else []
    else:
        missing = want[1] & ~got[1]
        extra = got[1] & ~want[1]
        parts = []
        if missing:
            parts.append(f"misses {plural_noun(bin(missing).count('1'), 'rank')} {_fmt_set(missing)}")
        if extra:
            parts.append(f"also has {plural_noun(bin(extra).count('1'), 'rank')} {_fmt_set(extra)}")
        msg = (f"{where} must hold {need}, but its value {' and '.join(parts)}"
               + (f" (last written by {describe(w)})" if w >= 0 else " (never written)"))
        prims = [w] if w >= 0 else []
    if len(bad) > 1:
        msg += f"; {len(bad) - 1} more output {'chunk is' if len(bad) == 2 else 'chunks are'} wrong"
    raise ProofError(msg, prims)


def prove(ir: ProgramIR, inplace: bool = False, describe: Callable[[int], str] | None = None) -> None:
    """Prove ``ir`` implements its collective in the given mode, or raise :class:`ProofError`.

    The caller must have checked the structure (:func:`hccc.compiler.ir.check.check_structure`)
    and matched sends with receives (:func:`~hccc.compiler.ir.check.check_fifo_order`); a program
    whose happens-before relation has a cycle fails with kind "deadlock".
    """
    order, pos = execution_order(ir, describe)
    check_races(ir, inplace, pos, describe)
    check_postcondition(ir, inplace, order, describe)


__all__ = ["MAX_PROOF_SLOTS", "proof_slots", "ProofError", "Slots", "prim_order", "execution_order", "check_deadlock_buffered",
           "happens_before", "check_races", "simulate", "check_postcondition", "prove"]
