"""Dependency DAG of an Algorithm (ResCCL section 4.1).

A *task* is one transfer, i.e. one row of the :class:`~hccc.compiler.frontend.algorithm.Algorithm` table; task
ids are row numbers.

Data dependencies exist only between tasks of the same chunk id (different chunk ids live at
different addresses). A transfer ``(src, dst, step, chunk, op)`` reads location ``(src, chunk)``,
for ``rrc`` also ``(dst, chunk)``, and writes ``(dst, chunk)``. Task ``t2`` depends on ``t1`` when
``step1 < step2`` and they touch a common location that at least one of them writes (RAW, WAR or
WAW). Accesses in the same step are simultaneous and never ordered against each other (two such
accesses to one location are a race, which the verifier reports; the DAG simply has no edge).

Construction (vectorised):

1. Per location, accesses are grouped by step. A read depends on every write of the latest earlier
   step that wrote the location (normally one task); a write depends on those writes too, and on
   every read-only access since that step (from the step of the last write, inclusive, up to its
   own step, exclusive). This sparse relation has exactly the reachability of the all-pairs
   relation above.
2. The result is reduced to its exact transitive reduction: an edge ``u -> v`` is dropped when ``v``
   is reachable from ``u`` through another of ``v``'s predecessors. Chunks are independent, so
   this is done per chunk, only for chunks holding a task with two or more predecessors, with
   ancestor bitsets (Python integers, one bit per task of the chunk in topological order) kept
   only while a task still has unprocessed successors. Python integers and no numba kernel: a
   kernel of the same procedure over rows of 64-bit words ran 38x slower than the integers as
   plain Python on 2 x 8 GPUs (``benchmarks/twins.py``: 0.8 ms against 30 ms; 3.2x at 1,984 tasks),
   and compiled it was only 1.5x faster than them (32,512 tasks: 0.42 s against 0.65 s).

Communication dependencies are not edges: ``link[t]`` is a dense id of the connection the task
uses, the directed pair ``(src, dst)`` and, in a program that names channels, the channel; equal
ids share a link. Channels of one pair are connections of their own (FIFOs and thread blocks of
their own), so the schedulers treat them as separate links: counted as one,
the streams of a tree program that share a pair, each on its channel, were ordered as if they ran
one after another, and the chunks of one stream came out in different orders on the thread blocks
of its tree (a100_topo4 tree AllReduce 0.80 -> 1.00 of ReduceScatter + AllGather's optimum in the
simulator).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.frontend.algorithm import RRC, Algorithm
from hccc.compiler.ir.sort_order import lexsort, stable_argsort

__all__ = ["DependencyDAG", "build_dag"]

# Above this, (location, step) keys no longer fit one int64 and a multi-key sort is used.
_KEY_LIMIT = 1 << 62
# Chunks with more tasks than this free ancestor bitsets early (see _transitive_reduction).
_KEEP_ALL_BITSETS = 8192


@dataclass
class DependencyDAG:
    """Data dependencies (transitively reduced) and link ids of an Algorithm's tasks.

    Edges are sorted by ``(edge_src, edge_dst)`` and contain no duplicates.

    CSR helpers (all int64):

    - ``succ_ptr`` (ntasks + 1) / ``succ_idx``: successors of task ``t`` are
      ``succ_idx[succ_ptr[t]:succ_ptr[t + 1]]`` (ascending). Since edges are sorted by source,
      ``succ_idx`` is ``edge_dst`` itself.
    - ``pred_ptr`` (ntasks + 1) / ``pred_idx``: predecessors of ``t`` are
      ``pred_idx[pred_ptr[t]:pred_ptr[t + 1]]`` (ascending).
    - ``link_src`` / ``link_dst`` (nlinks): the rank pair of each link id; link ids are numbered in
      ascending ``(src, dst, channel)`` order (a pair has one link per channel its tasks name).
    - ``chunk_index`` (ntasks): dense chunk number of each task (chunk ids in ascending order),
      ``chunk_ids`` (nchunks): the chunk id of each dense number.
    """

    ntasks: int
    edge_src: np.ndarray
    edge_dst: np.ndarray
    link: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    chunk_index: np.ndarray
    chunk_ids: np.ndarray

    @property
    def nedges(self) -> int:
        return len(self.edge_src)

    @property
    def nlinks(self) -> int:
        return len(self.link_src)

    @property
    def nchunks(self) -> int:
        return len(self.chunk_ids)

    def indegree(self) -> np.ndarray:
        return np.diff(self.pred_ptr)

    def outdegree(self) -> np.ndarray:
        return np.diff(self.succ_ptr)

    def successors(self, t: int) -> np.ndarray:
        return self.succ_idx[self.succ_ptr[t]:self.succ_ptr[t + 1]]

    def predecessors(self, t: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[t]:self.pred_ptr[t + 1]]


# ---------------------------------------------------------------------------------------- helpers
def _expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges ``[lo[i], hi[i])``: (owner i per element, element value), vectorised."""
    cnt = np.maximum(hi - lo, 0)
    total = int(cnt.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), cnt)
    start = np.cumsum(cnt) - cnt
    vals = np.arange(total, dtype=np.int64) - np.repeat(start - lo, cnt)
    return owner, vals


def _csr(keys: np.ndarray, n: int) -> np.ndarray:
    """Pointer array for ``keys`` already sorted ascending, values in ``[0, n)``."""
    return np.searchsorted(keys, np.arange(n + 1, dtype=np.int64)).astype(np.int64)


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, index of each value in them); a table lookup for compact ranges."""
    if len(values) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(values.min()), int(values.max())
    span = hi - lo + 1
    if span <= max(4 * len(values), 1 << 16):
        off = values - lo
        present = np.zeros(span, bool)
        present[off] = True
        ids = np.cumsum(present, dtype=np.int64) - 1
        return np.flatnonzero(present).astype(np.int64) + lo, ids[off]
    order = stable_argsort(values)
    sv = values[order]
    first = np.r_[True, sv[1:] != sv[:-1]]
    inv = np.empty(len(values), np.int64)
    inv[order] = np.cumsum(first) - 1
    return sv[first].astype(np.int64), inv


def _sparse_edges(src, dst, step, chunk_idx, is_rrc, n):
    """Step 1 of the module docstring: per-location dependency edges (producer, consumer).

    Access records (one read of ``src``, one write of ``dst`` per task; an rrc write also reads)
    are sorted by (location, step, read-only?), so that in every (location, step) group the writes
    come first. Between a location's last earlier write group and a record's own group there are
    only read-only records, hence both ranges an access depends on are contiguous.
    """
    tasks = np.arange(n, dtype=np.int64)
    r_task = np.concatenate([tasks, tasks])
    r_ro = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])  # read-only (the src read)
    _, rk = _dense(np.concatenate([src, dst]))
    nr = int(rk.max()) + 1 if len(rk) else 1
    _, sk = _dense(step)
    ns = int(sk.max()) + 1 if len(sk) else 1
    r_loc = chunk_idx[r_task] * nr + rk
    nloc = (int(chunk_idx.max()) + 1) * nr if n else 1
    if nloc * ns * 2 < _KEY_LIMIT:
        key = (r_loc * ns + sk[r_task]) * 2 + r_ro
        order = stable_argsort(key)
    else:  # astronomically sparse ids: fall back to a multi-key sort
        order = lexsort((r_task, r_ro, sk[r_task], r_loc))
    loc = r_loc[order]
    gkey = loc * ns + sk[r_task[order]]          # (location, step) group key, sorted
    ro = r_ro[order]
    task = r_task[order]
    m = len(order)
    newg = np.ones(m, bool)
    newg[1:] = gkey[1:] != gkey[:-1]
    gs = np.flatnonzero(newg)                    # start of each (location, step) group
    gid = np.cumsum(newg) - 1                    # group of each record
    ng = len(gs)
    gloc = loc[gs]
    wcount = np.bincount(gid[~ro], minlength=ng)  # writes at the head of each group
    newloc = np.ones(ng, bool)
    newloc[1:] = gloc[1:] != gloc[:-1]
    lstart_g = gs[np.flatnonzero(newloc)][np.cumsum(newloc) - 1]
    # Last group with writes strictly before each group, within its location.
    last_w = np.maximum.accumulate(np.where(wcount > 0, np.arange(ng), -1))
    prev_g = np.r_[-1, last_w[:-1]][:ng]
    valid_g = prev_g >= 0
    valid_g[valid_g] = gloc[prev_g[valid_g]] == gloc[valid_g]
    pw_lo = np.where(valid_g, gs[np.maximum(prev_g, 0)], 0)
    pw_hi = np.where(valid_g, pw_lo + wcount[np.maximum(prev_g, 0)], 0)

    # Every access depends on the writes of the last earlier write group.
    o1, v1 = _expand_ranges(pw_lo[gid], pw_hi[gid])
    e_src = [task[v1]]
    e_dst = [task[o1]]
    # Writes also depend on the read-only accesses since that group (or the location start).
    wr = np.flatnonzero(~ro)
    wg = gid[wr]
    lo = np.where(valid_g[wg], pw_hi[wg], lstart_g[wg])
    o2, v2 = _expand_ranges(lo, gs[wg])
    e_src.append(task[v2])
    e_dst.append(task[wr][o2])

    es = np.concatenate(e_src)
    ed = np.concatenate(e_dst)
    keep = es != ed
    es, ed = es[keep], ed[keep]
    if len(es):
        code = np.sort(es * n + ed)
        code = code[np.r_[True, code[1:] != code[:-1]]]
        es, ed = code // n, code % n
    return es.astype(np.int64), ed.astype(np.int64)


def _transitive_reduction(es, ed, topo_pos, chunk_of_pos, n):
    """Step 2: boolean mask of the edges to keep (exact transitive reduction, per chunk).

    ``topo_pos[t]`` is t's position in a topological order sorted by chunk; edges only join tasks
    of one chunk, so a task's local bit index is its position minus its chunk's first position.
    """
    keep = np.ones(len(es), bool)
    if len(es) == 0:
        return keep
    indeg = np.bincount(ed, minlength=n)
    multi = np.flatnonzero(indeg >= 2)
    if len(multi) == 0:
        return keep
    # Edges in the order (consumer position, producer position).
    ps, pd = topo_pos[es], topo_pos[ed]
    order = lexsort((ps, pd))
    ps, pd = ps[order], pd[order]
    nchunks = int(chunk_of_pos.max()) + 1
    cstart = np.searchsorted(chunk_of_pos, np.arange(nchunks + 1))
    # Chunks that need work, and in each, the last position holding a multi-predecessor task.
    mpos = np.sort(topo_pos[multi])
    mchunk = chunk_of_pos[mpos]
    last_in_chunk = np.r_[np.flatnonzero(np.diff(mchunk)), len(mchunk) - 1]
    work_chunks = mchunk[last_in_chunk]
    work_last = mpos[last_in_chunk]
    eptr = np.searchsorted(pd, np.arange(n + 1))
    # Remaining-successor counts only matter to free bitsets early.
    outdeg = np.bincount(ps, minlength=n)
    drop: list[int] = []
    for c, last in zip(work_chunks.tolist(), work_last.tolist()):
        base = int(cstart[c])
        e_lo, e_hi = int(eptr[base]), int(eptr[last + 1])
        src_local = (ps[e_lo:e_hi] - base).tolist()
        ptr = (eptr[base:last + 2] - e_lo).tolist()
        m = last + 1 - base
        # Small chunks keep every bitset (at most m*m/8 bytes); large ones free a bitset as soon
        # as its last successor has been processed.
        left = outdeg[base:last + 1].tolist() if m > _KEEP_ALL_BITSETS else None
        anc: list = [0] * m
        for v in range(m):
            a, b = ptr[v], ptr[v + 1]
            if b - a == 1:
                p = src_local[a]
                anc[v] = anc[p] | (1 << p)
            elif a == b:
                continue
            else:
                acc = 0
                for j in range(a, b):
                    acc |= anc[src_local[j]]
                bits = 0
                for j in range(a, b):
                    p = src_local[j]
                    if (acc >> p) & 1:
                        drop.append(e_lo + j)
                    bits |= 1 << p
                anc[v] = acc | bits
            if left is not None:
                for j in range(a, b):
                    p = src_local[j]
                    left[p] -= 1
                    if not left[p]:
                        anc[p] = 0
    drop_sorted = np.zeros(len(ps), bool)
    drop_sorted[np.asarray(drop, np.int64)] = True
    keep[order[drop_sorted]] = False
    return keep


# ------------------------------------------------------------------------------------------- API
def build_dag(alg: Algorithm) -> DependencyDAG:
    """Dependency DAG of ``alg`` (see the module docstring)."""
    n = alg.ntransfers
    src = np.asarray(alg.src, np.int64)
    dst = np.asarray(alg.dst, np.int64)
    step = np.asarray(alg.step, np.int64)
    chunk = np.asarray(alg.chunk, np.int64)
    is_rrc = np.asarray(alg.op) == RRC

    chunk_ids, chunk_idx = _dense(chunk)
    # Links: dense ids over (src, dst[, channel]) in ascending order.
    if n:
        rank_ids, rk = _dense(np.concatenate([src, dst]))
        nr = len(rank_ids)
        code = rk[:n] * nr + rk[n:]
        nch = 1
        if alg.channel is not None:
            chan = np.asarray(alg.channel, np.int64)
            nch = int(chan.max()) + 1
            code = code * nch + chan
        link_codes, link = _dense(code)
        pair_codes = link_codes // nch
        link_src, link_dst = rank_ids[pair_codes // nr], rank_ids[pair_codes % nr]
    else:
        link = np.zeros(0, np.int64)
        link_src = link_dst = np.zeros(0, np.int64)

    es, ed = _sparse_edges(src, dst, step, chunk_idx, is_rrc, n)

    # Topological order grouped by chunk: (chunk, step, row).
    topo = lexsort((np.arange(n), step, chunk_idx))
    topo_pos = np.empty(n, np.int64)
    topo_pos[topo] = np.arange(n)
    keep = _transitive_reduction(es, ed, topo_pos, chunk_idx[topo], n)
    es, ed = es[keep], ed[keep]  # still sorted by (src, dst)

    succ_ptr = _csr(es, n)
    porder = lexsort((es, ed))
    pred_idx = es[porder]
    pred_ptr = _csr(ed[porder], n)
    return DependencyDAG(
        ntasks=n, edge_src=es, edge_dst=ed, link=link,
        succ_ptr=succ_ptr, succ_idx=ed, pred_ptr=pred_ptr, pred_idx=pred_idx,
        link_src=link_src, link_dst=link_dst,
        chunk_index=chunk_idx, chunk_ids=chunk_ids.astype(np.int64),
    )
