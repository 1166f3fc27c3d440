"""Which receives could run in direct mode: the sender writing the receiver's destination.

In the FIFO protocol every byte goes through the receiver's FIFO slot: the sender writes the slot,
the receiver copies it to its destination (one HBM read and write more per byte and hop). In
direct mode the sender would write the receiver's destination itself and only publish ``tail``;
the receiver would wait for it and free the slot (``head``) without moving data. The FIFO's flow
control stays (the ``k``-th message is still the ``k``-th receive), only the data skips the slot.

When that is safe. The sender may write message ``k`` as soon as the receiver has consumed message
``k - NSLOTS`` of the connection, long before the receiving TB reaches the receive. So a receive
``P`` on rank ``r`` that moves data only (``RECV``, ``RECV_COPY_SEND``: the destination's old value
is not read by ``P``) is *direct-safe* when every other primitive ``Q`` of rank ``r`` that reads or
writes a location ``P`` writes is ordered with the transfer: ``Q`` is reachable from ``P`` (it
runs after the receive), or ``P``'s sending primitive ``S`` is reachable from ``Q`` (the sender
starts after ``Q``). Reachability is along happens-before edges that hold per micro-batch: the
next primitive of a TB (it starts after every micro-batch of the previous one), a cross-TB
dependency (micro-batch ``m`` after the producer's ``m``) and a message (the receive of ``m``
after its send of ``m``); so slice ``m`` of the destination is touched by nobody else between
the sender's write of ``m`` and the receive's completion of ``m``. Locations: input and output chunks are named by their chunk of the full buffer
(the in-place aliasing of input and output, :func:`hccc.compiler.ir.extents.buffer_bases`; taken
for every run, in place or not), scratch slots by their index; different names are disjoint
memory. Back-pressure (a sender waiting for a free slot) is not counted as an ordering. Each
search is bounded (:data:`SEARCH_BUDGET`); a receive whose orderings are not found within it keeps
the FIFO, so the analysis stays sound and its cost linear in the program's size.

The kernels do not implement direct mode: this analysis is what ``benchmarks/kernel_model.py``
counts its direct rows from (:func:`hccc.runtime.kernel_traffic.traffic`).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from hccc.compiler.ir.extents import buffer_bases
from hccc.compiler.ir.program_ir import Buf, Op, ProgramIR

__all__ = ["DIRECT_OPS", "locations", "direct_safe"]

#: receives whose destination's old value the primitive itself does not read
DIRECT_OPS = (Op.RECV, Op.RECV_COPY_SEND)


def locations(ir: ProgramIR, i: int, side: str, in_base=None, out_base=None) -> list[tuple[int, int]]:
    """Memory locations (``(space, index)``: space 0 = input/output by full-buffer chunk, 1 =
    scratch slot) primitive ``i`` reads (``side="src"``) or writes (``side="dst"``)."""
    p = ir.prims
    if in_base is None or out_base is None:
        in_base, out_base = buffer_bases(ir)
    buf = int(p[f"{side}_buf"][i])
    if buf == Buf.NONE:
        return []
    off, cnt, r = int(p[f"{side}_off"][i]), max(int(p["count"][i]), 0), int(p["rank"][i])
    if buf == Buf.SCRATCH:
        return [(1, off + k) for k in range(cnt)]
    base = int(in_base[r]) if buf == Buf.INPUT else int(out_base[r])
    return [(0, base + off + k) for k in range(cnt)]


#: most primitives one reachability search visits before it gives up (the receive then keeps
#: the FIFO): bounds the analysis to about ``candidates * SEARCH_BUDGET`` steps
SEARCH_BUDGET = 2048


def _topo_index(n: int, succ: dict[int, list[int]], pred: dict[int, list[int]]) -> list[int]:
    """Position of every primitive in a topological order of the happens-before graph (a program
    that passes the deadlock check has no cycle; primitives on a cycle, if any, come last)."""
    indeg = [len(pred.get(i, ())) for i in range(n)]
    ready = [i for i in range(n) if indeg[i] == 0]
    pos = [n] * n
    k = 0
    while ready:
        x = ready.pop()
        pos[x] = k
        k += 1
        for y in succ.get(x, ()):
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    return pos


def _reach(start: int, adj: dict[int, list[int]], targets: set[int], topo: list[int],
           forward: bool) -> set[int]:
    """The members of ``targets`` reachable from ``start`` along ``adj`` (``start`` excluded),
    searching only primitives that lie between ``start`` and a target in topological order, and
    at most :data:`SEARCH_BUDGET` of them (what is not found by then counts as unreachable)."""
    found: set[int] = set()
    bound = max(topo[t] for t in targets) if forward else min(topo[t] for t in targets)
    seen = {start}
    stack = [start]
    visits = 0
    while stack and len(found) < len(targets) and visits < SEARCH_BUDGET:
        x = stack.pop()
        visits += 1
        for y in adj.get(x, ()):
            if y in seen or (topo[y] > bound if forward else topo[y] < bound):
                continue
            seen.add(y)
            if y in targets:
                found.add(y)
            stack.append(y)
    return found


def direct_safe(ir: ProgramIR) -> np.ndarray:
    """Boolean per primitive: a receive that could run in direct mode (module docstring)."""
    from hccc.compiler.ir.connections import match_connections

    p = ir.prims
    n = ir.nprims
    safe = np.zeros(n, dtype=bool)
    if n == 0:
        return safe
    in_base, out_base = buffer_bases(ir)
    op = p["op"].astype(np.int64)
    cand = np.isin(op, [int(o) for o in DIRECT_OPS]) & (p["recv_peer"] >= 0)
    rank = p["rank"].astype(np.int64)
    # happens-before per micro-batch: the next primitive of the TB, every dependant, and the
    # receive of every message
    succ: dict[int, list[int]] = defaultdict(list)
    pred: dict[int, list[int]] = defaultdict(list)
    order = np.lexsort((p["seq"], p["tb"], rank))
    same = (rank[order[1:]] == rank[order[:-1]]) & (p["tb"][order[1:]] == p["tb"][order[:-1]])
    s_of = np.full(n, -1, dtype=np.int64)
    sends, recvs = match_connections(ir)
    s_of[recvs] = sends
    edges = [zip(order[:-1][same].tolist(), order[1:][same].tolist()),
             zip(ir.dep_on.tolist(), ir.dep_prim.tolist()), zip(sends.tolist(), recvs.tolist())]
    for pairs in edges:
        for a, b in pairs:
            succ[a].append(b)
            pred[b].append(a)
    topo = _topo_index(n, succ, pred)
    # accessors of every location, per rank
    touch: dict[tuple[int, int, int], set[int]] = defaultdict(set)
    for i in range(n):
        r = int(rank[i])
        for side in ("src", "dst"):
            for loc in locations(ir, i, side, in_base, out_base):
                touch[(r, *loc)].add(i)
    for i in np.flatnonzero(cand).tolist():
        r = int(rank[i])
        others: set[int] = set()
        for loc in locations(ir, i, "dst", in_base, out_base):
            others |= touch[(r, *loc)]
        others.discard(i)
        if others:
            others -= _reach(i, succ, others, topo, True)                  # after the receive
        if others:
            others -= _reach(int(s_of[i]), pred, others, topo, False)      # before the sender starts
        safe[i] = not others
    return safe
