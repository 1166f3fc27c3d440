"""The host side of the kernel ABI (:mod:`hccc.compiler.backend.abi`, the one source of its facts).

Device pointers are 64-bit integers on every platform, so the argument structs are packed the same
way for the CPU emulation, CUDA and HIP: every pointer member of the C struct is a ``uint64`` here.
:class:`Args` is passed to every rank kernel by value; :class:`Conn` tables and the
:class:`ErrorRecord` live in device memory. The classes are built from the ABI's member tables, so
they cannot drift from the emitted ``hccc_prims.h``.
"""
from __future__ import annotations

import ctypes

from hccc.compiler.backend import abi
from hccc.compiler.ir.program_ir import Op

ABI_VERSION = abi.VERSION

_CTYPES = {"uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32, "int": ctypes.c_int32, "int16_t": ctypes.c_int16,
           "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64}


def ctypes_fields(fields, nested: dict | None = None) -> list[tuple[str, type]]:
    """ctypes ``_fields_`` of an ABI member table (pointers as 64-bit integers; ``nested``: the
    ctypes class of each struct type a member has by value)."""
    types = dict(_CTYPES, **(nested or {}))
    return [(f.name, ctypes.c_uint64 if f.ctype.endswith("*") else types[f.ctype]) for f in fields]


class Conn(ctypes.Structure):
    """``struct hccc_conn``: one connection end (both ends point to the same FIFO and counters:
    slots and tail in the receiver's memory, head in the sender's)."""
    _fields_ = ctypes_fields(abi.CONN)


class ErrorRecord(ctypes.Structure):
    """``struct hccc_error``: filled by the first TB whose spin-wait timed out."""
    _fields_ = ctypes_fields(abi.ERROR)


class Args(ctypes.Structure):
    """``struct hccc_args``, the kernels' single by-value argument."""
    _fields_ = ctypes_fields(abi.ARGS)


class TableArgs(ctypes.Structure):
    """``struct hccc_table_args``: the table mode's kernel argument (``hccc_args``, then the table)."""
    _fields_ = ctypes_fields(abi.TABLE_ARGS, {"hccc_args": Args})


class GridArgs(ctypes.Structure):
    """``struct hccc_grid_args``: the one-grid entry's argument."""
    _fields_ = ctypes_fields(abi.GRID_ARGS)


class TableGridArgs(ctypes.Structure):
    """``struct hccc_table_grid_args``: the table mode's one-grid argument."""
    _fields_ = ctypes_fields(abi.TABLE_GRID_ARGS)


#: ctypes class of every struct of the ABI by its C name
STRUCT_CLASSES = {"hccc_args": Args, "hccc_conn": Conn, "hccc_error": ErrorRecord,
                  "hccc_table_args": TableArgs, "hccc_grid_args": GridArgs,
                  "hccc_table_grid_args": TableGridArgs}


def grid_first(blocks) -> bytes:
    """The one-grid block table (``hccc_grid_locate``'s ``first``) for ``blocks`` per rank: the
    first block of every rank, then the total."""
    n = [0]
    for b in blocks:
        n.append(n[-1] + int(b))
    return bytes((_CTYPES[abi.GRID_FIRST] * len(n))(*n))


#: what a stuck TB was waiting for (``hccc_error::wait``)
WAIT_DATA, WAIT_SLOT, WAIT_DEP, WAIT_COUNTS = (dict(abi.WAITS)[k] for k in ("DATA", "SLOT", "DEP", "COUNTS"))
#: why the kernels refused an AllToAllv call (``hccc_error::op`` under ``WAIT_COUNTS``), by name
V_REFUSAL = {name: value for name, value, _ in abi.V_REFUSALS}


def sizes() -> tuple[int, int, int]:
    """(sizeof hccc_args, sizeof hccc_conn, sizeof hccc_error) as packed here."""
    return ctypes.sizeof(Args), ctypes.sizeof(Conn), ctypes.sizeof(ErrorRecord)


def op_name(op: int) -> str:
    """``recv_reduce_copy`` for Op.RECV_REDUCE_COPY, ``op9`` for an unknown value."""
    return Op(op).name.lower() if 0 <= op < len(Op) else f"op{op}"


#: ``hccc_conn::place`` values by name (:data:`hccc.compiler.backend.abi.PLACES`)
PLACE = {name: value for name, value, _ in abi.PLACES}


def conn_table(conns: list[tuple[int, int, int, int]]) -> bytes:
    """Packed ``hccc_conn`` array from (slots, head, tail, place) entries (``place``: a value of
    :data:`PLACE`; ValueError naming the entry for any other, so no record leaves here unplaced)."""
    for i, c in enumerate(conns):
        if len(c) != 4 or int(c[3]) not in PLACE.values():
            raise ValueError(f"connection {i}: {tuple(c)!r} is not (slots, head, tail, place) with place "
                             f"one of {sorted(PLACE.values())} ({', '.join(PLACE)})")
    arr = (Conn * max(1, len(conns)))(*[Conn(*(int(x) for x in c)) for c in conns])
    return bytes(arr)[:ctypes.sizeof(Conn) * len(conns)] if conns else b""


__all__ = ["ABI_VERSION", "ctypes_fields", "Args", "Conn", "ErrorRecord", "TableArgs", "GridArgs",
           "TableGridArgs", "STRUCT_CLASSES", "grid_first", "WAIT_DATA", "WAIT_SLOT",
           "WAIT_DEP", "WAIT_COUNTS", "V_REFUSAL", "PLACE", "sizes", "op_name", "conn_table"]
