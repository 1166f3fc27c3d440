"""The host side of the kernel ABI declared in the emitted ``hccc_prims.h`` (``HCCC_ABI_VERSION`` 3).

Device pointers are 64-bit integers on every platform, so the argument structs are packed the same
way for the CPU emulation, CUDA and HIP. :class:`Args` is passed to every rank kernel by value;
:class:`Conn` tables and the :class:`ErrorRecord` live in device memory.
"""
from __future__ import annotations

import ctypes

from hccc.compiler.ir.program_ir import Op

ABI_VERSION = 3


class Conn(ctypes.Structure):
    """``struct hccc_conn``: one connection end (both ends point to the same FIFO and counters:
    slots and tail in the receiver's memory, head in the sender's)."""
    _fields_ = [("slots", ctypes.c_uint64),   # NSLOTS * slot_bytes bytes (manifest)
                ("head", ctypes.c_uint64),    # uint64_t*: slots consumed by the receiver (sender memory)
                ("tail", ctypes.c_uint64)]    # uint64_t*: slots published by the sender (receiver memory)


class ErrorRecord(ctypes.Structure):
    """``struct hccc_error``: filled by the first TB whose spin-wait timed out."""
    _fields_ = [("claimed", ctypes.c_uint32), ("valid", ctypes.c_uint32),
                ("rank", ctypes.c_int32), ("tb", ctypes.c_int32), ("seq", ctypes.c_int32),
                ("op", ctypes.c_int32), ("wait", ctypes.c_int32), ("chunk", ctypes.c_int32),
                ("task", ctypes.c_int64), ("microbatch", ctypes.c_uint64),
                ("waited", ctypes.c_uint64)]


class Args(ctypes.Structure):
    """``struct hccc_args``, the kernels' single by-value argument."""
    _fields_ = [("input", ctypes.c_uint64), ("output", ctypes.c_uint64),
                ("scratch", ctypes.c_uint64), ("count", ctypes.c_uint64),
                ("send_conns", ctypes.c_uint64), ("recv_conns", ctypes.c_uint64),
                ("progress", ctypes.c_uint64), ("abort_flag", ctypes.c_uint64),
                ("error", ctypes.c_uint64), ("timeout", ctypes.c_uint64),
                ("slice_bytes", ctypes.c_uint64),
                ("peers", ctypes.c_uint64)]   # every rank's hccc_args (direct mode), or 0


#: what a stuck TB was waiting for (``hccc_error::wait``)
WAIT_DATA, WAIT_SLOT, WAIT_DEP = 1, 2, 3


def sizes() -> tuple[int, int, int]:
    """(sizeof hccc_args, sizeof hccc_conn, sizeof hccc_error) as packed here."""
    return ctypes.sizeof(Args), ctypes.sizeof(Conn), ctypes.sizeof(ErrorRecord)


def op_name(op: int) -> str:
    """``recv_reduce_copy`` for Op.RECV_REDUCE_COPY, ``op9`` for an unknown value."""
    return Op(op).name.lower() if 0 <= op < len(Op) else f"op{op}"


def conn_table(conns: list[tuple[int, int, int]]) -> bytes:
    """Packed ``hccc_conn`` array from (slots, head, tail) pointers."""
    arr = (Conn * max(1, len(conns)))(*[Conn(*c) for c in conns])
    return bytes(arr)[:ctypes.sizeof(Conn) * len(conns)] if conns else b""


__all__ = ["ABI_VERSION", "Args", "Conn", "ErrorRecord", "WAIT_DATA", "WAIT_SLOT", "WAIT_DEP",
           "sizes", "op_name", "conn_table"]
