"""Checks of a ProgramIR: structure, FIFO order on connections, deadlock freedom.

All three are vectorised (numpy) so they run on millions of primitives. Each raises
:class:`IRFormatError` (or a subclass) with a message naming the offending primitives as
``rank R tb T seq S (op)``.

Deadlock model (:func:`check_deadlock`). Execution is task-level: a TB runs its primitives in ``seq``
order, each for every micro-batch before the next; a cross-TB dependency lets micro-batch ``m`` of
``dep_prim`` run once micro-batch ``m`` of ``dep_on`` is done. Take the worst case: one FIFO slot per
connection and any number ``M >= 1`` of micro-batches. Then a send primitive cannot finish before its
matching receive has started (with ``M >= 2`` it blocks on the full slot), and a receive cannot
progress before its send has started, so a matched send/receive pair behaves as a rendezvous that all
of its primitives occupy together. A fused primitive takes part in two rendezvous, so rendezvous
connected through fused primitives form one *component* (a chain ``send -> fwd -> ... -> recv``;
a closed ring of forwarding primitives is a deadlock by itself: all wait to receive first).

Contract every component to one node and add an edge for every consecutive pair of primitives of a
TB (program order) and for every dependency. Claim: the program is deadlock-free for every ``M``
if this graph is acyclic and has no self-loop (no component with two primitives on one TB or a
dependency inside one component). Proof sketch: in any stuck state take an
unfinished component with no unfinished predecessor in the graph. All program-order predecessors of
its primitives have finished, so each of them is the current primitive of its TB; all its
dependencies are fully satisfied; along its chain the first primitive can always send into a freed
slot and every later one can receive, so some primitive progresses, a contradiction. The check is
conservative only in treating a dependency as "finished before started" and in rejecting
dependencies inside one component; the lowering never produces either pattern legitimately.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.connections import describe_prim, match_connections
from hccc.compiler.ir.extents import check_extents
from hccc.compiler.ir.levels import graph_levels
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, IRFormatError, Op, ProgramIR
from hccc.compiler.ir.program_ir_json import decode_json
from hccc.util.plural import plural, plural_noun
from hccc.compiler.ir.sort_order import lexsort, stable_argsort

_SEND_OPS = np.array([Op(i).sends for i in range(len(Op))])
_RECV_OPS = np.array([Op(i).receives for i in range(len(Op))])
_READS = np.array([Op(i).reads_src for i in range(len(Op))])
_WRITES = np.array([Op(i).writes_dst for i in range(len(Op))])


class FifoOrderError(IRFormatError):
    """The k-th send and the k-th receive of a connection disagree."""


class DeadlockError(IRFormatError):
    """The per-TB programs can wait on each other forever; ``cycle`` lists primitive indices."""

    def __init__(self, message: str, cycle: list[int] | None = None, involved=None, split=None):
        super().__init__(message)
        self.cycle = cycle or []
        #: forwarding primitives whose un-fusing breaks the reported cycles (may be empty)
        self.split = np.asarray(split if split is not None else [], dtype=np.int64)
        #: every primitive of every send/receive chain taking part in a wait cycle found (for
        #: self-loops: all of them at once), so a caller can undo fusions in bulk
        self.involved = np.asarray(involved if involved is not None else self.cycle, dtype=np.int64)


def _fail(ir: ProgramIR, bad: np.ndarray, what: str, cls=IRFormatError):
    idx = np.flatnonzero(bad)
    if len(idx):
        i = int(idx[0])
        more = f" (and {len(idx) - 1} more)" if len(idx) > 1 else ""
        raise cls(f"primitive {i}, {describe_prim(ir, i)}: {what}{more}")


def _key_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (ascending) and their multiplicities, by sorting (faster than hashing here)."""
    k = np.sort(keys)
    if not len(k):
        return k, np.zeros(0, np.int64)
    start = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[start], np.diff(np.r_[start, len(k)])


# ---------------------------------------------------------------------------------------------
def _i64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.int64, copy=False)


def check_structure(ir: ProgramIR) -> None:
    """Validate ranges, canonical order, buffers, peers, connection ownership and dependencies."""
    p, ntbs = _columns(ir)
    _check_order(ir, p, ntbs)
    _check_codes(ir, p)
    _check_peers(ir, p)
    _check_connections(ir, p)
    _check_deps(ir, p)


def _columns(ir: ProgramIR) -> tuple[dict, np.ndarray]:
    """The primitive table's columns as they are (comparisons need no widening; sums and keys are
    made in int64) and the thread blocks per rank, after the header's and the columns' checks."""
    N = int(ir.nranks)
    if N < 1:
        raise IRFormatError(f"nranks must be at least 1, not {N}")
    for nm in ("nchunks", "in_chunks", "out_chunks", "scratch_chunks", "npipelines"):
        if int(getattr(ir, nm)) < 0:
            raise IRFormatError(f"{nm} must not be negative")
    missing = [k for k in PRIM_COLUMNS if k not in ir.prims]
    if missing:
        raise IRFormatError(f"primitive table lacks {plural_noun(len(missing), 'column')} {', '.join(missing)}")
    p = {k: np.asarray(ir.prims[k]) for k in PRIM_COLUMNS}
    bad_dtype = [k for k, v in p.items() if v.dtype.kind not in "iub"]
    if bad_dtype:
        raise IRFormatError(f"primitive column '{bad_dtype[0]}' does not hold integers")
    n = len(p["rank"])
    for k, v in p.items():
        if len(v) != n:
            raise IRFormatError(f"primitive column '{k}' has {len(v)} entries, expected {n}")
    ntbs = np.asarray(ir.ntbs).astype(np.int64)
    if len(ntbs) != N:
        raise IRFormatError(f"tbs_per_rank has {len(ntbs)} entries, expected nranks = {N}")
    if len(ntbs) and ntbs.min() < 0:
        raise IRFormatError("tbs_per_rank must not be negative")
    return p, ntbs


def _check_order(ir: ProgramIR, p: dict, ntbs: np.ndarray) -> None:
    """Ranks, thread blocks and sequence numbers in range and in canonical order, without gaps,
    and each rank using exactly its thread blocks."""
    N, n = int(ir.nranks), len(p["rank"])
    rank, tb, seq = p["rank"], p["tb"], p["seq"]
    _fail(ir, (rank < 0) | (rank >= N), f"rank out of range 0..{N - 1}")
    _fail(ir, (tb < 0) | (tb >= ntbs[rank]), "tb out of range (tbs_per_rank)")
    _fail(ir, seq < 0, "negative seq")
    # canonical order, contiguous seq and TB ids
    if n:
        key_prev = (rank[:-1], tb[:-1], seq[:-1])
        key_next = (rank[1:], tb[1:], seq[1:])
        same_tb = (key_prev[0] == key_next[0]) & (key_prev[1] == key_next[1])
        bad_order = np.r_[False, (rank[1:] < rank[:-1]) | ((rank[1:] == rank[:-1]) & (tb[1:] < tb[:-1]))
                          | (same_tb & (seq[1:] <= seq[:-1]))]
        _fail(ir, bad_order, "primitives are not sorted by (rank, tb, seq)")
        new_tb = np.r_[True, ~same_tb]
        start = np.maximum.accumulate(np.where(new_tb, np.arange(n), 0))
        _fail(ir, seq != np.arange(n) - start, "seq numbers of a TB must be 0, 1, 2, ... without gaps")
        new_rank = np.r_[True, rank[1:] != rank[:-1]]
        # TB ids of a rank: first TB is 0, each next TB is previous + 1
        prev_tb = np.r_[-1, tb[:-1]]
        expect = np.where(new_rank, 0, prev_tb + 1)
        _fail(ir, new_tb & (tb != expect), "TB ids of a rank must be 0, 1, 2, ... without gaps")
    used = np.zeros(N, dtype=np.int64)
    if n:   # rows are in canonical order here (checked above): each rank's rows are contiguous
        firsts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
        used[rank[firsts]] = np.maximum.reduceat(tb + 1, firsts)
    badr = np.flatnonzero(used != ntbs)
    if len(badr):
        r = int(badr[0])
        raise IRFormatError(f"rank {r}: tbs_per_rank says {int(ntbs[r])} TBs but primitives use {int(used[r])}")


def _check_codes(ir: ProgramIR, p: dict) -> None:
    """Op and buffer codes, counts, channels, pipelines and task ids; each op's buffers present
    exactly where it uses them, and their ranges within the buffers."""
    # op and buffer codes
    op = p["op"]
    _fail(ir, (op < 0) | (op >= len(Op)), f"invalid op code (valid: 0..{len(Op) - 1})")
    for side in ("src", "dst"):
        b = p[f"{side}_buf"]
        _fail(ir, (b < 0) | (b >= len(Buf)), f"invalid {side}_buf code (valid: 0..{len(Buf) - 1})")
    _fail(ir, p["count"] < 1, "count must be at least 1")
    _fail(ir, p["channel"] < 0, "negative channel")
    _fail(ir, (p["pipeline"] < 0) | (p["pipeline"] >= max(int(ir.npipelines), 1)),
          f"pipeline out of range 0..{max(int(ir.npipelines), 1) - 1}")
    _fail(ir, (p["task"] < -1) | (p["task2"] < -1), "task ids must be >= -1")
    sizes = np.array([0, ir.in_chunks, ir.out_chunks, ir.scratch_chunks], dtype=np.int64)
    names = {Buf.INPUT: "input", Buf.OUTPUT: "output", Buf.SCRATCH: "scratch"}
    for side, uses in (("src", _READS[op]), ("dst", _WRITES[op])):
        b, off = p[f"{side}_buf"], p[f"{side}_off"]
        _fail(ir, uses & (b == Buf.NONE), f"op needs a {side} buffer but {side}_buf is none")
        _fail(ir, ~uses & (b != Buf.NONE), f"op uses no {side} buffer but {side}_buf is set")
        for code, nm in names.items():
            m = uses & (b == code)
            _fail(ir, m & ((off < 0) | (np.add(off, p["count"], dtype=np.int64) > sizes[code])),
                  f"{side} range [{side}_off, {side}_off + count) exceeds the {nm} buffer "
                  f"({int(sizes[code])} chunks)")


def _check_peers(ir: ProgramIR, p: dict) -> None:
    """Send and receive peers in range, never the primitive's own rank, -1 where unused."""
    N, rank, op = int(ir.nranks), p["rank"], p["op"]
    # peers
    sends, recvs = _SEND_OPS[op], _RECV_OPS[op]
    for nm, uses in (("send_peer", sends), ("recv_peer", recvs)):
        peer = p[nm]
        _fail(ir, uses & ((peer < 0) | (peer >= N)), f"{nm} out of range 0..{N - 1}")
        _fail(ir, uses & (peer == rank), f"{nm} equals the primitive's own rank")
        _fail(ir, ~uses & (peer != -1), f"{nm} must be -1 for an op that does not "
                                        f"{'send' if nm == 'send_peer' else 'receive'}")


def _check_connections(ir: ProgramIR, p: dict) -> None:
    """Each end of a connection (rank, peer, channel) owned by one thread block, and as many
    sends as receives on every connection."""
    N, n, rank, tb, op = int(ir.nranks), len(p["rank"]), p["rank"], p["tb"], p["op"]
    sends, recvs = _SEND_OPS[op], _RECV_OPS[op]
    # connection ends owned by one TB; sends and receives per connection balance
    nch = int(p["channel"].max()) + 1 if n else 1
    for nm, uses, d in (("send_peer", sends, 0), ("recv_peer", recvs, 1)):
        idx = np.flatnonzero(uses)
        if not len(idx):
            continue
        ek = (_i64(rank[idx]) * N + p[nm][idx]) * nch + p["channel"][idx]
        o = stable_argsort(ek)
        eks, tbs = ek[o], tb[idx][o]
        clash = np.flatnonzero((eks[1:] == eks[:-1]) & (tbs[1:] != tbs[:-1]))
        if len(clash):
            i0, i1 = int(idx[o][clash[0]]), int(idx[o][clash[0] + 1])
            kind = "sending" if d == 0 else "receiving"
            raise IRFormatError(f"the {kind} end of connection rank {int(rank[i0])} "
                                f"{'->' if d == 0 else '<-'} rank {int(p[nm][i0])} channel "
                                f"{int(p['channel'][i0])} is used by two TBs: {describe_prim(ir, i0)} and "
                                f"{describe_prim(ir, i1)}")
    si, ri = np.flatnonzero(sends), np.flatnonzero(recvs)
    skey = (_i64(rank[si]) * N + p["send_peer"][si]) * nch + p["channel"][si]
    rkey = (_i64(p["recv_peer"][ri]) * N + rank[ri]) * nch + p["channel"][ri]
    su, sc = _key_counts(skey)
    ru, rc = _key_counts(rkey)
    if len(su) != len(ru) or not np.array_equal(su, ru) or not np.array_equal(sc, rc):
        allk = np.union1d(su, ru)
        s_cnt = np.zeros(len(allk), np.int64)
        r_cnt = np.zeros(len(allk), np.int64)
        s_cnt[np.searchsorted(allk, su)] = sc
        r_cnt[np.searchsorted(allk, ru)] = rc
        k = int(allk[np.flatnonzero(s_cnt != r_cnt)[0]])
        j = int(np.flatnonzero(s_cnt != r_cnt)[0])
        ch, pair = k % nch, k // nch
        raise IRFormatError(f"connection rank {pair // N} -> rank {pair % N} channel {ch} has "
                            f"{plural(int(s_cnt[j]), 'send')} but {plural(int(r_cnt[j]), 'receive')}")


def _check_deps(ir: ProgramIR, p: dict) -> None:
    """Dependencies between existing primitives of one rank, none on itself."""
    n, rank = len(p["rank"]), p["rank"]
    # dependencies
    dp = np.asarray(ir.dep_prim).astype(np.int64)
    do = np.asarray(ir.dep_on).astype(np.int64)
    if len(dp) != len(do):
        raise IRFormatError("deps: 'prim' and 'on' differ in length")
    if len(dp):
        if min(dp.min(), do.min()) < 0 or max(dp.max(), do.max()) >= n:
            raise IRFormatError("deps: primitive index out of range")
        bad = np.flatnonzero(rank[dp] != rank[do])
        if len(bad):
            j = int(bad[0])
            raise IRFormatError(f"dependency of {describe_prim(ir, dp[j])} on {describe_prim(ir, do[j])} "
                                f"crosses ranks (dependencies must stay on one rank)")
        bad = np.flatnonzero(dp == do)
        if len(bad):
            raise IRFormatError(f"{describe_prim(ir, dp[bad[0]])} depends on itself")


# ---------------------------------------------------------------------------------------------
def load_ir_json(text: str) -> ProgramIR:
    """A ProgramIR from its JSON text, decoded and checked by :func:`check_loaded`
    (:class:`IRFormatError`)."""
    ir = decode_json(text)
    check_loaded(ir)
    return ir


def check_loaded(ir: ProgramIR) -> None:
    """The checks of a program read from a file (a ProgramIR JSON, a table-mode OUTDIR's tables):
    its structure, the two ends of every message agreeing on what it carries (chunk count and
    task, :func:`check_fifo_order`), and every access proven in bounds for every element count."""
    check_structure(ir)
    check_fifo_order(ir)
    check_extents(ir)


def check_fifo_order(ir: ProgramIR) -> None:
    """The k-th send and k-th receive on each connection agree on count and (when known) task."""
    s, r = match_connections(ir)
    p = ir.prims
    bad = np.flatnonzero(p["count"][s] != p["count"][r])
    if len(bad):
        j = int(bad[0])
        raise FifoOrderError(f"FIFO order mismatch: {describe_prim(ir, r[j])} receives "
                             f"{plural(int(p['count'][r[j]]), 'chunk')} but the matching {describe_prim(ir, s[j])} "
                             f"sends {int(p['count'][s[j]])}")
    send_task = np.where(p["task2"][s] >= 0, p["task2"][s], p["task"][s])
    recv_task = p["task"][r]
    bad = (send_task >= 0) & (recv_task >= 0) & (send_task != recv_task)
    idx = np.flatnonzero(bad)
    if len(idx):
        j = int(idx[0])
        raise FifoOrderError(f"FIFO order mismatch: {describe_prim(ir, r[j])} is matched with "
                             f"{describe_prim(ir, s[j])}, which sends task {int(send_task[j])}"
                             + (f" (and {len(idx) - 1} more)" if len(idx) > 1 else ""))


# ---------------------------------------------------------------------------------------------
def rendezvous_components(ir: ProgramIR, with_depth: bool = False):
    """Components of primitives joined by matched send/receive pairs.

    Returns ``(comp, prev, nxt)`` (plus ``depth`` with ``with_depth``): ``comp[p]`` is the primitive
    index of the head of ``p``'s chain (the primitive that sends without receiving, or ``p`` itself
    when it is local); primitives on a closed forwarding ring get ``comp = -1``. ``prev[p]`` is the
    send matched with ``p``'s receive, ``nxt[p]`` the receive matched with ``p``'s send (``-1`` when
    none), ``depth[p]`` the number of hops from the chain head.
    """
    n = ir.nprims
    s, r = match_connections(ir)
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    prev[r] = s
    nxt[s] = r
    anc = np.where(prev >= 0, prev, np.arange(n))
    depth = (prev >= 0).astype(np.int64)
    for _ in range(max(1, int(n).bit_length() + 1)):
        nanc = anc[anc]
        if np.array_equal(nanc, anc):
            break
        depth = depth + depth[anc]
        anc = nanc
    ring = prev[anc] >= 0
    comp = np.where(ring, -1, anc)
    if with_depth:
        return comp, prev, nxt, depth
    return comp, prev, nxt


def _graph(ir: ProgramIR, groups=None):
    """Contracted wait graph: (comp per prim, edge source prim, edge target prim). ``groups``:
    receive groups (first row, rows) run as one unit each (:mod:`hccc.compiler.ir.reduce_groups`):
    the rendezvous of a group's rows are one node, and the program order between its rows is gone."""
    comp, prev, nxt = rendezvous_components(ir)
    ring = np.flatnonzero(comp < 0)
    if len(ring):
        i = int(ring[0])
        cyc = [i]
        j = int(prev[i])
        while j != i and len(cyc) < 64:
            cyc.append(j)
            j = int(prev[j])
        raise DeadlockError("deadlock: a ring of forwarding primitives each waits to receive before "
                            "sending: " + " <- ".join(describe_prim(ir, x) for x in cyc), cyc)
    p = ir.prims
    rank = p["rank"].astype(np.int64)
    tb = p["tb"].astype(np.int64)
    same = (rank[1:] == rank[:-1]) & (tb[1:] == tb[:-1])
    po_a = np.flatnonzero(same)
    if groups:
        # a chain ends in at most one receive that reduces without sending, so at most one group
        # row: relabelling each row's component by its group's first row's unites them all
        first = np.repeat(np.array([s for s, _ in groups], np.int64), [k for _, k in groups])
        rows = np.concatenate([np.arange(s, s + k, dtype=np.int64) for s, k in groups])
        lab = np.arange(ir.nprims, dtype=np.int64)
        lab[comp[rows]] = comp[first]
        comp = lab[comp]
        inside = np.zeros(ir.nprims, bool)
        inside[rows[rows != first]] = True     # rows after a group's first: no order edge into them
        po_a = po_a[~inside[po_a + 1]]
    ea = np.concatenate([po_a, np.asarray(ir.dep_on, np.int64)])
    eb = np.concatenate([po_a + 1, np.asarray(ir.dep_prim, np.int64)])
    return comp, ea, eb


#: the edges of a wait cycle a deadlock message spells out: a hostile program's cycle can run
#: through every primitive (an MSCCL++ plan of 20,000 switch operations on 8 ranks: 280,015
#: edges, 19 s of describing before this cap); the first few name where it is, the error's
#: ``prims`` still hold them all
CYCLE_EDGES_SHOWN = 8


def cycle_text(shown: list[str], total: int) -> str:
    """The first edges of a wait cycle of ``total`` edges, joined, and how many more it has."""
    more = total - len(shown)
    return "; ".join(shown) + (f"; and {plural(more, 'more edge')}" if more > 0 else "")


def _kahn(nnodes: int, src: np.ndarray, dst: np.ndarray, rng: np.random.Generator | None = None):
    """Topological order of nodes 0..nnodes-1, level by level. Returns (order, remaining_mask).

    With ``rng`` the nodes of each level are shuffled (a random topological order).
    """
    level = graph_levels(nnodes, src, dst)
    done = np.flatnonzero(level >= 0)
    tie = rng.permutation(nnodes)[done] if rng is not None else done
    order = done[np.lexsort((tie, level[done]))]
    return order, level < 0


def check_deadlock(ir: ProgramIR, groups=None) -> None:
    """Raise :class:`DeadlockError` naming a wait cycle if the program can deadlock (see module doc).
    ``groups``: receive groups, each run as one unit (:mod:`hccc.compiler.ir.reduce_groups`; a
    group's rows occupy their rendezvous together, so the proof holds with them contracted into one
    node: in a stuck state, the unfinished node without an unfinished predecessor has every chain
    into the group able to deliver its next message, and the group can then consume them all)."""
    comp, ea, eb = _graph(ir, groups)
    ca, cb = comp[ea], comp[eb]
    selfl = np.flatnonzero(ca == cb)
    if len(selfl):
        j = int(selfl[0])
        a, b = int(ea[j]), int(eb[j])
        bad_comps = np.unique(ca[selfl])
        # for each looping pair, the forwarding primitive just before the deeper one in the chain
        _, _, _, depth = rendezvous_components(ir, with_depth=True)
        hi = np.maximum(depth[ea[selfl]], depth[eb[selfl]]) - 1
        o = lexsort((depth, comp))
        key_sorted = comp[o] * (ir.nprims + 1) + depth[o]
        at = np.searchsorted(key_sorted, ca[selfl] * (ir.nprims + 1) + hi)
        split = np.unique(o[np.minimum(at, len(o) - 1)])
        split = split[_SEND_OPS[ir.prims["op"][split].astype(np.int64)]
                      & _RECV_OPS[ir.prims["op"][split].astype(np.int64)]]
        raise DeadlockError(
            f"deadlock: {describe_prim(ir, b)} must wait for {describe_prim(ir, a)}, but both belong to "
            f"the same send/receive chain, which must run concurrently"
            + (f" (and {plural(len(bad_comps) - 1, 'more chain')} like it)" if len(bad_comps) > 1 else ""),
            [a, b], np.flatnonzero(np.isin(comp, bad_comps)), split)
    heads, node = np.unique(comp, return_inverse=True)
    na, nb = node[ea], node[eb]
    order, remaining = _kahn(len(heads), na, nb)
    if not remaining.any():
        return
    # walk back through remaining predecessors until a node repeats
    m = remaining[na] & remaining[nb]
    ra, rb, rea, reb = na[m], nb[m], ea[m], eb[m]
    o = stable_argsort(rb)
    ra, rb, rea, reb = ra[o], rb[o], rea[o], reb[o]
    first_in = np.searchsorted(rb, np.arange(len(heads)))
    v = int(np.flatnonzero(remaining)[0])
    seen: dict[int, int] = {}
    path: list[tuple[int, int]] = []
    while v not in seen:
        seen[v] = len(path)
        j = int(first_in[v])
        path.append((int(rea[j]), int(reb[j])))
        v = int(ra[j])
    cyc = path[seen[v]:][::-1]
    prims = []
    for a, b in cyc:
        prims += [a, b]
    text = cycle_text([f"{describe_prim(ir, b)} waits for {describe_prim(ir, a)}"
                       for a, b in cyc[:CYCLE_EDGES_SHOWN]], len(cyc))
    involved = np.flatnonzero(np.isin(comp, np.unique(comp[np.asarray(prims, np.int64)])))
    raise DeadlockError(f"deadlock: wait cycle of {len(cyc)} edge(s): {text}", prims, involved)


def topological_components(ir: ProgramIR, rng: np.random.Generator | None = None):
    """(comp per prim, component heads in a dependency-respecting order). Raises on deadlock."""
    comp, ea, eb = _graph(ir)
    heads, node = np.unique(comp, return_inverse=True)
    order, remaining = _kahn(len(heads), node[ea], node[eb], rng)
    if remaining.any() or (comp[ea] == comp[eb]).any():
        check_deadlock(ir)
        raise DeadlockError("deadlock: the wait graph has a cycle")
    return comp, heads[order]


def check_all(ir: ProgramIR) -> None:
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)
