"""The fields of one emitted primitive (``struct hccc_pd`` in ``hccc_prims.h``) and their values.

One list serves both code-generation modes: the specialised emission writes these values as
compile-time constants at each call site, the table mode stores them in a rank's binary table
(:mod:`hccc.compiler.backend.table_format` derives its column layout from :data:`PD_FIELDS`) and
the generic kernel rebuilds an ``hccc_pd`` from them (``hccc_table.h``, rendered from the same list).
A field's ``source`` says where the table mode takes it from:

- ``column``: a column of the table (every primitive has a value);
- ``seq``: the primitive's position in its thread block (implicit in the table).

The awaited progress counters are not a field: each mode keeps a rank's in one array, in primitive
order, a thread block's from its ``first_dep`` on (``struct hccc_tb_range``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PdField:
    name: str       # member of struct hccc_pd
    source: str     # column | seq | deps
    doc: str


#: the members of ``struct hccc_pd``, in declaration order
PD_FIELDS: tuple[PdField, ...] = (
    PdField("seq", "seq", "position in the TB"),
    PdField("op", "column", "HCCC_SEND ... HCCC_NOP"),
    PdField("sconn", "column", "send connection index, -1 if none"),
    PdField("rconn", "column", "receive connection index, -1 if none"),
    PdField("spos", "column", "chunks posted earlier on the send connection"),
    PdField("rpos", "column", "chunks received earlier on the receive connection"),
    PdField("sbuf", "column", "source buffer (HCCC_BUF_*)"),
    PdField("soff", "column", "source chunk offset"),
    PdField("dbuf", "column", "destination buffer"),
    PdField("doff", "column", "destination chunk offset"),
    PdField("cnt", "column", "consecutive chunks"),
    PdField("chunk", "column", "chunk of the full buffer that sizes the slices"),
    PdField("post", "column", "progress counter published, -1 if none"),
    PdField("ndeps", "column", "progress counters awaited (the rank's deps array, in primitive order)"),
    PdField("task", "column", "originating transfer, -1 if none"),
    PdField("direct", "column", "direct mode: 1 the send writes the peer's destination, 2 the receive "
                                "finds its data in its destination (backend/direct_fields.py)"),
    PdField("dpeer", "column", "direct send: the receiving rank"),
    PdField("pbuf", "column", "direct send: the receiver's destination buffer"),
    PdField("poff", "column", "direct send: the receiver's destination chunk"),
    PdField("pbase", "column", "direct send: chunk of the full buffer chunk 0 of pbuf holds there"),
    PdField("nsrc", "column", "receives the kernels reduce in one unit from this row on (its group's rows, "
                              "compiler/ir/reduce_groups.py), 0: none"),
    PdField("chain", "column", "rows of the fused LL chain run from this row on (compiler/ir/ll_chains.py), "
                               "0: none"),
)


def pd_columns(ir, col, dx: dict | None = None) -> dict[str, np.ndarray]:
    """Value of every ``column``/``seq`` field for every primitive of ``ir`` (canonical order),
    as int64 arrays; ``col`` is :func:`hccc.compiler.backend.codegen.analyse`'s result, ``dx``
    :func:`hccc.compiler.backend.direct_fields.direct_fields`' (None: no direct primitive). The
    awaited slots themselves are ``col.dep_slots`` (grouped by primitive, in primitive order)."""
    p = ir.prims
    ndeps = np.zeros(ir.nprims, np.int64)
    if len(col.dep_owner):
        ndeps[col.dep_owner] = col.dep_n
    as64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
    from hccc.compiler.ir.reduce_groups import group_rows, reduce_groups
    from hccc.compiler.ir.ll_chains import chain_rows
    direct = dx["direct"] if dx is not None else None
    nsrc = group_rows(ir.nprims, reduce_groups(ir, direct, col.chunk))
    return {
        "seq": as64(p["seq"]), "op": as64(p["op"]), "sconn": as64(col.sconn),
        "rconn": as64(col.rconn), "spos": as64(col.spos), "rpos": as64(col.rpos),
        "sbuf": as64(p["src_buf"]), "soff": as64(p["src_off"]), "dbuf": as64(p["dst_buf"]),
        "doff": as64(p["dst_off"]), "cnt": as64(p["count"]), "chunk": as64(col.chunk),
        "post": as64(col.post), "ndeps": ndeps, "task": as64(p["task"]),
        **{k: (as64(dx[k]) if dx is not None else np.zeros(ir.nprims, np.int64))
           for k in ("direct", "dpeer", "pbuf", "poff", "pbase")},
        "nsrc": nsrc,
        "chain": chain_rows(ir),
    }


__all__ = ["PdField", "PD_FIELDS", "pd_columns"]
