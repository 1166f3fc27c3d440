"""Thread-block allocation (ResCCL section 4.4): state-based, with connection-based as the baseline.

A *connection end* is ``(rank, peer, direction, channel)``: the sending end of connection
``rank -> peer`` or the receiving end of ``peer -> rank``. A fused primitive (receive + forward) uses
one receiving and one sending end, so it ties them into one *allocation unit* (union-find over the
ends). A unit is *active* over the closed span ``[first, last]`` of the sub-pipeline indices of its
primitives.

- Connection-based (MSCCL-like baseline): one TB per unit.
- State-based: units whose spans never overlap may share a TB, and do only when sharing cannot
  delay the later one. Sweeping the units by span start, a unit reuses the lowest-numbered TB
  whose last unit ``V`` ended (by span) before it starts *and* whose last primitive its own first
  primitive already waits for: ``last(V) ->* first(U)`` in the program's wait graph without the
  sharing (data dependencies on a rank, each send before its receive, and each unit's primitives
  in order, as a TB of their own would run them). Otherwise it takes a new TB. Without the
  reachability condition this is plain interval partitioning (:func:`partition_intervals`, as
  many TBs as the maximum number of spans overlapping one sub-pipeline); the condition can only
  add TBs, never more than one per unit (connection-based).

  Why the condition: sub-pipelines are not barriers. A unit whose span starts after another's
  ends can be ready earlier in time (its producers sit on other ranks and TBs), and queueing it
  behind the other unit on one TB then delays it: 4-27 % of simulated time on random small
  programs. When ``first(U)`` already waits for ``last(V)`` the only cost left is that ``U``'s
  micro-batch ``i`` now waits for all of ``last(V)``'s micro-batches instead of its ``i``-th.
  Reachability is searched forward from ``last(V)`` over primitives whose order key does not
  exceed ``first(U)``'s (keys never decrease along the wait graph), and only on ranks where
  interval partitioning would share at all, by the kernel of
  :mod:`hccc.compiler.passes.tb_share_kernel`: run by the interpreter for programs whose ranks ask
  few such questions, compiled for those that ask many (tree programs give every rank a unit per
  peer and direction).

Local ``COPY`` primitives (never-written output chunks) use no connection and have no dependencies;
they run first on TB 0. Within a TB, primitives run in order-key order (sub-pipeline, then insertion
position of the task in the schedule), after the algorithm's step where the lowering gives one
(``LoweredProgram.phase``, :mod:`hccc.compiler.passes.phase_order`): a TB never runs a later step's
primitive before an earlier step's.
"""
from __future__ import annotations

import heapq

import numpy as np
from networkx.utils import UnionFind

from hccc.compiler.passes.lower import LoweredProgram
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Allocation, ProgramIR
from hccc.compiler.ir.sort_order import lexsort, stable_argsort, unique_inverse

SEND_DIR = 0
RECV_DIR = 1


#: the work of the sharing searches (the reachability of the module docstring), counted in
#: wait-graph arcs followed: at most this many per primitive of the program, and at least
#: :data:`SHARE_SEARCH_FLOOR`, split evenly over the ranks that share. Past its part, a rank's
#: question left to a search counts as unreachable: the unit takes a thread block of its own, never
#: a shared one the definition would refuse (sharing by spans alone was not kept: whether it can
#: deadlock where the exact allocation does not is not established)
#: (``Allocation.tbs_search_cut`` counts those ranks). Measured on the tree AllReduce hccc
#: synthesises for 128 nodes of 8 H20s (4,190,208 primitives, up to 4,043 units a rank): the exact
#: searches follow 0.28-0.93 G arcs a rank, 40 CPU s a rank compiled (about 11 hours for the
#: program), and still give rank 0 3,133 thread blocks; with 64 arcs a primitive the whole compile
#: takes 79.2 CPU s (``benchmarks/synth_scale.py --end-to-end --nodes 128``)
SHARE_SEARCH_PER_PRIM = 64
#: the least work of the sharing searches, whatever the program's size: no program of the examples
#: or the tests comes near it (about 4 CPU s compiled), so their allocations are exact
SHARE_SEARCH_FLOOR = 1 << 26


def partition_intervals(start, end) -> tuple[np.ndarray, int]:
    """Assign closed intervals ``[start[i], end[i]]`` to the fewest tracks so no track holds two
    overlapping intervals. Returns (track per interval, number of tracks). Deterministic."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    n = len(start)
    track = np.empty(n, dtype=np.int64)
    if n == 0:
        return track, 0
    order = lexsort((np.arange(n), end, start))
    busy: list[tuple[int, int]] = []   # (end, track)
    free: list[int] = []
    ntracks = 0
    s_l, e_l = start.tolist(), end.tolist()
    for i in order.tolist():
        s = s_l[i]
        while busy and busy[0][0] < s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            t = heapq.heappop(free)
        else:
            t = ntracks
            ntracks += 1
        track[i] = t
        heapq.heappush(busy, (e_l[i], t))
    return track, ntracks


def max_overlap(start, end) -> int:
    """Maximum number of closed intervals sharing one point (the optimal track count)."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if len(start) == 0:
        return 0
    # events: +1 at start, -1 just after end; starts before ends at equal coordinates
    pts = np.concatenate([start * 2, end * 2 + 1])
    delta = np.concatenate([np.ones(len(start), np.int64), -np.ones(len(end), np.int64)])
    o = stable_argsort(pts)
    return int(np.cumsum(delta[o]).max())


def dense_ids(keys: np.ndarray, space: int) -> tuple[np.ndarray, int]:
    """Rank of each key among the distinct non-negative keys (ascending); -1 stays -1."""
    valid = keys >= 0
    if space <= 1 << 26:
        present = np.zeros(space, dtype=bool)
        present[keys[valid]] = True
        idmap = np.cumsum(present, dtype=np.int64) - 1
        out = np.where(valid, idmap[np.where(valid, keys, 0)], -1)
        return out, int(present.sum())
    u, inv = unique_inverse(keys[valid])
    out = np.full(len(keys), -1, dtype=np.int64)
    out[valid] = inv
    return out, len(u)


def connection_units(low: LoweredProgram) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Allocation units of the primitives.

    Returns ``(unit, unit_rank, unit_start, unit_end)``: ``unit[p]`` (-1 for local primitives), and
    per unit its rank and active span. Units are numbered in ascending (rank, smallest end key).
    """
    c = low.cols
    n = low.nprims
    N = low.nranks
    nch = int(c["channel"].max()) + 1 if n else 1
    rank = c["rank"].astype(np.int64)

    def end_key(peer, direction):
        return ((rank * N + peer.astype(np.int64)) * 2 + direction) * nch + c["channel"]

    has_send = c["send_peer"] >= 0
    has_recv = c["recv_peer"] >= 0
    skey = np.where(has_send, end_key(c["send_peer"], SEND_DIR), -1)
    rkey = np.where(has_recv, end_key(c["recv_peer"], RECV_DIR), -1)
    inv, nend = dense_ids(np.concatenate([skey, rkey]), N * N * 2 * nch)
    s_end = inv[:n]
    r_end = inv[n:]
    # union-find over ends linked by a primitive that both receives and sends; each end's root is
    # the smallest end of its component
    root = np.arange(nend, dtype=np.int64)
    both = has_send & has_recv
    if both.any():
        uf = UnionFind()
        for a, b in np.unique(np.stack([r_end[both], s_end[both]], axis=1), axis=0).tolist():
            uf.union(a, b)
        for comp in uf.to_sets():
            ids = np.fromiter(comp, dtype=np.int64)
            root[ids] = ids.min()
    _, end_unit = unique_inverse(root)   # dense, ascending by smallest end key
    unit = np.full(n, -1, dtype=np.int64)
    unit[has_recv] = end_unit[r_end[has_recv]]
    unit[has_send & ~has_recv] = end_unit[s_end[has_send & ~has_recv]]
    nunits = int(end_unit.max()) + 1 if nend else 0
    ustart = np.full(nunits, np.iinfo(np.int64).max, dtype=np.int64)
    uend = np.full(nunits, -1, dtype=np.int64)
    urank = np.zeros(nunits, dtype=np.int64)
    m = unit >= 0
    pipe = c["pipeline"].astype(np.int64)
    np.minimum.at(ustart, unit[m], pipe[m])
    np.maximum.at(uend, unit[m], pipe[m])
    urank[unit[m]] = rank[m]
    return unit, urank, ustart, uend


class _WaitGraph:
    """Forward adjacency of the primitives' wait graph without TB sharing (see the module
    docstring) as CSR arrays, built once per program when some rank could share."""

    def __init__(self, low: LoweredProgram, unit: np.ndarray) -> None:
        c = low.cols
        n = low.nprims
        task = c["task"].astype(np.int64)
        task2 = c["task2"].astype(np.int64)
        recv = c["recv_peer"] >= 0
        send = c["send_peer"] >= 0
        ntask = int(max(task.max(initial=-1), task2.max(initial=-1))) + 1
        recv_of = np.full(max(ntask, 1), -1, dtype=np.int64)
        recv_of[task[recv]] = np.flatnonzero(recv)
        sent = np.where(send & ~recv, task, np.where(send & recv, task2, -1))
        sp = np.flatnonzero(sent >= 0)
        src = [low.dep_on, sp]
        dst = [low.dep_prim, recv_of[sent[sp]]]
        m = unit >= 0
        idx = np.flatnonzero(m)
        o = idx[lexsort((low.key[idx], unit[idx]))]
        same = unit[o[1:]] == unit[o[:-1]]
        src.append(o[:-1][same])
        dst.append(o[1:][same])
        es = np.concatenate(src).astype(np.int64)
        ed = np.concatenate(dst).astype(np.int64)
        ok = ed >= 0
        es, ed = es[ok], ed[ok]
        order = stable_argsort(es)
        self.ptr_array = np.searchsorted(es[order], np.arange(n + 1)).astype(np.int64)
        self.adj_array = ed[order]
        self.key_array = np.asarray(low.key, dtype=np.int64)


def _unit_ends(low: LoweredProgram, unit: np.ndarray, nunits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, its first and last primitive in order-key order."""
    idx = np.flatnonzero(unit >= 0)
    o = idx[lexsort((low.key[idx], unit[idx]))]
    u = unit[o]
    starts = np.searchsorted(u, np.arange(nunits))
    ends = np.searchsorted(u, np.arange(nunits), side="right") - 1
    return o[starts], o[ends]


def _share(low: LoweredProgram, unit, urank, ustart, uend, bounds, sharing: list[int], state_tb,
           state_count) -> int:
    """State-based tracks of the units of the ranks ``sharing`` (the module docstring: sweeping
    each rank's units by span start, a unit takes the lowest-numbered track whose last unit ended
    before it starts and whose last primitive its first primitive waits for, else a new track),
    into ``state_tb`` and ``state_count``, by :mod:`hccc.compiler.passes.tb_share_kernel`: plain
    while the process's unit pairs stay below its threshold, compiled from there on
    (:meth:`~hccc.util.jit.Kernels.pick`)."""
    from hccc.compiler.passes import tb_share_kernel as kern

    nunits = len(urank)
    graph = _WaitGraph(low, unit)
    first, last = _unit_ends(low, unit, nunits)
    sizes = (bounds[1:] - bounds[:-1])[sharing]
    share_tracks = kern.KERNELS.pick("share_tracks", int((sizes * sizes).sum() // 2))
    labels = kern.interval_labels if share_tracks is kern.share_tracks else kern.KERNELS.compiled()["interval_labels"]
    ptr, adj = graph.ptr_array, graph.adj_array
    post1, low1, ok1 = labels(ptr, adj, False)
    post2, low2, ok2 = labels(ptr, adj, True)
    # the sweep order: by rank, span start, span end, unit (units are numbered by rank)
    order = lexsort((np.arange(nunits), uend, ustart, urank)).astype(np.int64)
    track = np.zeros(nunits, dtype=np.int64)
    count = np.zeros(len(bounds) - 1, dtype=np.int64)
    cut = np.zeros(len(bounds) - 1, dtype=np.int64)
    budget = max(SHARE_SEARCH_FLOOR, SHARE_SEARCH_PER_PRIM * low.nprims) // max(len(sharing), 1)
    share_tracks(order, bounds.astype(np.int64), np.asarray(sharing, dtype=np.int64), ustart, uend,
                 first.astype(np.int64), last.astype(np.int64), ptr, adj, graph.key_array,
                 post1, low1, post2, low2, bool(ok1 and ok2), track, count, int(budget), cut)
    for r in sharing:
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        state_tb[lo:hi] = track[lo:hi]
        state_count[r] = count[r]
    return int(np.count_nonzero(cut))


def allocate(low: LoweredProgram, mode: str = "state", *, name: str = "algo", nwarps: int = 16,
             chunk_bytes: int = 1 << 20) -> ProgramIR:
    """Assign TBs (``mode`` = "state" or "connection") and sequence numbers; build the ProgramIR.

    ``stats`` of the result holds both TB totals (``tbs_state_based``, ``tbs_connection_based``) and
    ``tbs_per_rank_max`` for the chosen mode.
    """
    if mode not in ("state", "connection"):
        raise ValueError(f"unknown TB allocation mode {mode!r}")
    N = low.nranks
    n = low.nprims
    unit, urank, ustart, uend = connection_units(low)
    nunits = len(urank)
    # per-unit TB index within its rank, for both modes
    conn_tb = np.zeros(nunits, dtype=np.int64)
    state_tb = np.zeros(nunits, dtype=np.int64)
    conn_count = np.zeros(N, dtype=np.int64)
    state_count = np.zeros(N, dtype=np.int64)
    search_cut = 0
    if nunits:
        bounds = np.searchsorted(urank, np.arange(N + 1))   # units are sorted by rank
        sharing = []                                        # ranks where interval partitioning shares
        for r in range(N):
            lo, hi = int(bounds[r]), int(bounds[r + 1])
            if hi == lo:
                continue
            conn_tb[lo:hi] = np.arange(hi - lo)
            conn_count[r] = hi - lo
            if max_overlap(ustart[lo:hi], uend[lo:hi]) == hi - lo:   # nothing could share
                state_tb[lo:hi] = np.arange(hi - lo)
                state_count[r] = hi - lo
            else:
                sharing.append(r)
        if sharing:
            search_cut = _share(low, unit, urank, ustart, uend, bounds, sharing, state_tb, state_count)
    has_local = np.zeros(N, dtype=bool)
    local = unit < 0
    has_local[low.cols["rank"][local]] = True
    conn_count = np.maximum(conn_count, has_local)
    state_count = np.maximum(state_count, has_local)
    unit_tb = state_tb if mode == "state" else conn_tb
    ntbs = state_count if mode == "state" else conn_count

    tb = np.zeros(n, dtype=np.int64)
    tb[~local] = unit_tb[unit[~local]]
    rank = low.cols["rank"].astype(np.int64)
    # a TB runs its primitives in (phase, key) order: compiler/passes/phase_order.py
    order = lexsort((low.key, tb, rank))
    moved = 0
    if low.phase is not None:
        by_phase = lexsort((low.key, low.phase, tb, rank))
        moved = int(np.count_nonzero(by_phase != order))
        order = by_phase
    rs, ts = rank[order], tb[order]
    newgrp = np.r_[True, (rs[1:] != rs[:-1]) | (ts[1:] != ts[:-1])] if n else np.zeros(0, bool)
    gstart = np.maximum.accumulate(np.where(newgrp, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    seq_sorted = np.arange(n) - gstart
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)

    prims = {}
    for k, dt in PRIM_COLUMNS.items():
        if k == "tb":
            col = ts
        elif k == "seq":
            col = seq_sorted
        else:
            col = low.cols[k][order]
        prims[k] = np.ascontiguousarray(col, dtype=dt)
    cross = tb[low.dep_prim] != tb[low.dep_on]
    dp, do = inv[low.dep_prim[cross]], inv[low.dep_on[cross]]
    pair = np.sort(dp * max(n, 1) + do)
    if len(pair):
        pair = pair[np.r_[True, pair[1:] != pair[:-1]]]
    dp, do = pair // max(n, 1), pair % max(n, 1)
    ir = ProgramIR(
        name=name, collective=low.collective.value, nranks=N, nchunks=low.nchunks,
        in_chunks=low.in_chunks, out_chunks=low.out_chunks, scratch_chunks=low.scratch_chunks,
        prims=prims, dep_prim=dp.astype(np.int64), dep_on=do.astype(np.int64),
        nwarps=nwarps, chunk_bytes=chunk_bytes, npipelines=low.npipelines,
        ntbs=ntbs.astype(np.int32),
        allocation=Allocation(
            tb_alloc=mode, tbs_state_based=int(state_count.sum()), tbs_connection_based=int(conn_count.sum()),
            tbs_per_rank_max=int(ntbs.max()) if N else 0, fused=int(low.nfused),
            # primitives whose place in their TB the step order changed (0: none, or no phase)
            phase_order_moved=moved,
            # ranks whose sharing searches ran past their budget (None: none did)
            tbs_search_cut=search_cut or None,
        ), root=int(low.root))
    return ir


__all__ = ["partition_intervals", "max_overlap", "connection_units", "dense_ids",
           "allocate"]
