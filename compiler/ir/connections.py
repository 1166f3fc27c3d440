"""Connections of a ProgramIR: which send pairs with which receive, and how to name a primitive.

The base of the IR checks (:mod:`hccc.compiler.ir.check`, :mod:`hccc.compiler.ir.extents`,
:mod:`hccc.compiler.ir.symbolic`): the ``k``-th send on a connection ``(sender, receiver,
channel)`` is received by the ``k``-th receive on it.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from hccc.compiler.ir.program_ir import Op, ProgramIR
from hccc.compiler.ir.sort_order import stable_argsort

_SEND_OPS = np.array([Op(i).sends for i in range(len(Op))])
_RECV_OPS = np.array([Op(i).receives for i in range(len(Op))])


def describe_prim(ir: ProgramIR, i: int) -> str:
    p = ir.prims
    i = int(i)
    op = int(p["op"][i])
    name = Op(op).name.lower() if 0 <= op < len(Op) else f"op{op}"
    extra = []
    if 0 <= op < len(Op):
        if Op(op).receives:
            extra.append(f"from rank {int(p['recv_peer'][i])}")
        if Op(op).sends:
            extra.append(f"to rank {int(p['send_peer'][i])}")
    t = int(p["task"][i])
    if t >= 0:
        extra.append(f"task {t}")
    return (f"rank {int(p['rank'][i])} tb {int(p['tb'][i])} seq {int(p['seq'][i])} "
            f"({name}{' ' + ', '.join(extra) if extra else ''})")


#: the columns the pairing reads
_COLUMNS = ("op", "rank", "channel", "send_peer", "recv_peer")
#: id(op column) -> (weak references to the columns, nranks, result): the IR checks, the extents
#: proof and code generation all pair one program's connections, some on two threads at once
_MEMO: dict[int, tuple] = {}
_MEMO_LOCK = threading.Lock()


def match_connections(ir: ProgramIR) -> tuple[np.ndarray, np.ndarray]:
    """Pairs ``(send_prim, recv_prim)``: the k-th send on each connection with its k-th receive.

    Assumes :func:`~hccc.compiler.ir.check.check_structure` passed (canonical order, balanced connections), so the order
    of a connection's sends is the ``seq`` order of the one TB owning that end.

    The result is computed once per set of columns (the very arrays, which hccc never changes in
    place; it is forgotten when they are freed) and returned read-only.
    """
    cols = [ir.prims[c] for c in _COLUMNS]
    key = id(cols[0])
    with _MEMO_LOCK:         # a second thread asking for the same program waits for the first
        hit = _MEMO.get(key)
        if hit is not None and hit[1] == int(ir.nranks) and all(w() is c for w, c in zip(hit[0], cols)):
            return hit[2]
        result = _match(ir)
        for a in result:
            a.flags.writeable = False
        refs = tuple(weakref.ref(c, lambda _, k=key: _MEMO.pop(k, None)) for c in cols)
        _MEMO[key] = (refs, int(ir.nranks), result)
        return result


def _match(ir: ProgramIR) -> tuple[np.ndarray, np.ndarray]:
    p = ir.prims
    N = int(ir.nranks)
    op = p["op"].astype(np.int64)
    rank = p["rank"].astype(np.int64)
    ch = p["channel"].astype(np.int64)
    nch = int(ch.max()) + 1 if len(ch) else 1
    si = np.flatnonzero(_SEND_OPS[op])
    ri = np.flatnonzero(_RECV_OPS[op])
    skey = (rank[si] * N + p["send_peer"][si].astype(np.int64)) * nch + ch[si]
    rkey = (p["recv_peer"][ri].astype(np.int64) * N + rank[ri]) * nch + ch[ri]
    s_sorted = si[stable_argsort(skey)]
    r_sorted = ri[stable_argsort(rkey)]
    return s_sorted, r_sorted


__all__ = ["describe_prim", "match_connections"]
