"""Direct-mode fields of the emitted primitives (``hccc_pd::direct, dpeer, pbuf, poff, pbase``).

The receives :func:`hccc.compiler.ir.direct.direct_safe` proves safe are received directly: their
primitive gets direct bit 2 (its data is in its destination already) and the send at the other
end of their message (the ``k``-th send of the connection for the ``k``-th receive) gets bit 1 and
the receiver's destination: rank, buffer, chunk, and the chunk of the full buffer that chunk 0 of
that buffer holds. Both ends are marked or neither, so the two ends of a message always agree.

Modes: ``auto`` (the default: every proven receive, in programs of up to
:data:`DIRECT_MAX_PRIMS` primitives; the analysis is a bounded Python graph search, about 1 s at
16,000 primitives, so larger programs keep the FIFO rather than slow the compile) and ``off``. Both
code-generation modes carry the fields (specialised: ``HCCC_PX`` calls; table mode: columns).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.connections import match_connections
from hccc.compiler.ir.direct import direct_safe
from hccc.compiler.ir.extents import buffer_bases
from hccc.compiler.ir.program_ir import Buf, ProgramIR

__all__ = ["DIRECT_MODES", "DIRECT_MAX_PRIMS", "direct_fields"]

DIRECT_MODES = ("auto", "off")
#: programs with more primitives keep the FIFO everywhere in ``auto`` mode
DIRECT_MAX_PRIMS = 20_000


def direct_fields(ir: ProgramIR, mode: str = "auto") -> dict[str, np.ndarray] | None:
    """Per primitive (``ir`` in canonical order, structurally checked): ``direct``, ``dpeer``,
    ``pbuf``, ``poff``, ``pbase`` as int64 arrays; None when no primitive is direct."""
    if mode not in DIRECT_MODES:
        raise ValueError(f"unknown direct mode {mode!r} (expected {' or '.join(DIRECT_MODES)})")
    if mode == "off" or ir.nprims == 0 or ir.nprims > DIRECT_MAX_PRIMS:
        return None
    safe = direct_safe(ir)
    if not safe.any():
        return None
    p = ir.prims
    n = ir.nprims
    sends, recvs = match_connections(ir)
    send_of = np.full(n, -1, np.int64)
    send_of[recvs] = sends
    r = np.flatnonzero(safe)
    s = send_of[r]
    out = {k: np.zeros(n, np.int64) for k in ("direct", "dpeer", "pbuf", "poff", "pbase")}
    out["direct"][r] |= 2
    out["direct"][s] |= 1
    rr = p["rank"][r].astype(np.int64)
    buf = p["dst_buf"][r].astype(np.int64)
    in_base, out_base = buffer_bases(ir)
    out["dpeer"][s] = rr
    out["pbuf"][s] = buf
    out["poff"][s] = p["dst_off"][r]
    out["pbase"][s] = np.where(buf == Buf.INPUT, in_base[rr], np.where(buf == Buf.OUTPUT, out_base[rr], 0))
    return out
