"""MSCCL++ plan operations as values: :class:`PlanOp` and its buffer references, :class:`BufRef`.

One class for every operation kind, keyed by :data:`~hccc.compiler.interop.mscclpp_operands.OPERANDS`
(the fields each kind carries): :meth:`PlanOp.to_dict` writes the operation object of a plan's
thread block, :meth:`PlanOp.from_dict` reads one back after :func:`check_operation` has refused a
malformed one with its location. The keys are written in the order hccc's plans have always had:
``name``, ``src_buff``, ``dst_buff``, then the channel of a data operation (``channel_type`` before
``channel_ids``) or of a synchronisation (``channel_ids`` before ``channel_type``), the semaphores,
a barrier's id and size.

While the exporter builds a thread block, channel ids and remote buffer ids are symbolic
(``(channel type, rank-level index)``); :mod:`hccc.compiler.interop.mscclpp_export` resolves them
into the block's own lists before writing (:meth:`PlanOp.with_refs`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from hccc.compiler.interop.mscclpp_operands import OPERANDS, check_operation


@dataclass(frozen=True)
class BufRef:
    """``index`` and ``size`` (in chunks) of a local buffer (``type``: ``i``, ``o`` or ``s``) or of
    a peer's buffer reached over a channel (``buffer_id``, an index into the thread block's
    ``remote_buffer_refs``)."""
    index: int
    size: int
    type: str | None = None
    buffer_id: Any = None

    def to_dict(self) -> dict:
        if self.buffer_id is not None:
            return {"buffer_id": self.buffer_id, "index": self.index, "size": self.size}
        return {"type": self.type, "index": self.index, "size": self.size}

    @staticmethod
    def from_dict(d: dict) -> BufRef:
        if "buffer_id" in d:
            return BufRef(d["index"], d["size"], buffer_id=d["buffer_id"])
        return BufRef(d["index"], d["size"], type=d["type"])


def local(letter: str, index: int, size: int) -> BufRef:
    """A reference into the rank's own buffer ``letter`` (``i``, ``o``, ``s``)."""
    return BufRef(index, size, type=letter)


def remote(buffer_id, index: int, size: int) -> BufRef:
    """A reference into a peer's buffer, ``buffer_id`` an entry of the block's remote buffers."""
    return BufRef(index, size, buffer_id=buffer_id)


class PlanOpError(ValueError):
    """A malformed operation object read without a plan's own error reporting."""


def _plain_err(path: tuple, message: str) -> PlanOpError:
    return PlanOpError(("/".join(map(str, path)) + ": " if path else "") + message)


@dataclass(frozen=True)
class PlanOp:
    """One operation of a plan thread block; the fields a kind does not carry stay ``None``."""
    name: str
    src: tuple[BufRef, ...] | None = None
    dst: tuple[BufRef, ...] | None = None
    channel_type: str | None = None
    channel_ids: tuple | None = None
    semaphore_ids: tuple[int, ...] | None = None
    barrier_id: int | None = None
    num_threadblocks: int | None = None
    #: ``(tb_id, tbg_size)`` of a thread-block group's member (the block moves part ``tb_id``)
    tbg: tuple[int, int] | None = None
    #: the switch operation (``glres``, ``gstore``, ``gstorepkt``) this one is a part of, where a
    #: switch operation was rewritten into memory-channel ones (:mod:`.mscclpp_switch`)
    switch: str | None = None

    def __post_init__(self):
        if self.name not in OPERANDS or OPERANDS[self.name].body:
            raise ValueError(f"PlanOp cannot hold an operation '{self.name}'")

    @property
    def is_nop(self) -> bool:
        return self.name == "nop"

    def with_refs(self, channel_ids: tuple | None, src: tuple | None, dst: tuple | None) -> PlanOp:
        """The same operation with its channel ids and buffer references replaced."""
        return replace(self, channel_ids=channel_ids, src=src, dst=dst)

    def to_dict(self) -> dict:
        d: dict = {"name": self.name}
        if self.src is not None:
            d["src_buff"] = [b.to_dict() for b in self.src]
        if self.dst is not None:
            d["dst_buff"] = [b.to_dict() for b in self.dst]
        has_buffers = self.src is not None or self.dst is not None
        if self.channel_ids is not None or self.channel_type is not None:
            chans = {"channel_ids": list(self.channel_ids) if self.channel_ids is not None else None,
                     "channel_type": self.channel_type}
            order = ("channel_type", "channel_ids") if has_buffers else ("channel_ids", "channel_type")
            d.update((k, chans[k]) for k in order if chans[k] is not None)
        if self.semaphore_ids is not None:
            d["semaphore_ids"] = list(self.semaphore_ids)
        if self.barrier_id is not None:
            d["barrier_id"] = self.barrier_id
        if self.num_threadblocks is not None:
            d["num_threadblocks"] = self.num_threadblocks
        if self.tbg is not None:
            d["tbg_info"] = {"tb_id": self.tbg[0], "tbg_size": self.tbg[1]}
        return d

    @staticmethod
    def from_dict(d, path: tuple = (), err: Callable[[tuple, str], Exception] = _plain_err,
                  nsem: int | None = None) -> PlanOp:
        """The operation object ``d`` (at ``path``) as a :class:`PlanOp`; a malformed one is
        refused by raising ``err(path, message)`` at the offending field. ``nsem``: the semaphores
        the rank declares (``None``: not checked)."""
        if not isinstance(d, dict):
            raise err(path, "an operation must be an object")
        name = d.get("name")
        if not isinstance(name, str):
            raise err(path, "an operation needs a 'name'")
        if name not in OPERANDS:
            raise err(path + ("name",), f"invalid operation type '{name}'")
        if OPERANDS[name].body:
            raise err(path + ("name",), f"'{name}' has a body: it is not a single operation")
        ids = d.get("semaphore_ids")
        check_operation(d, path, err, nsem if nsem is not None else
                        (max(ids) + 1 if isinstance(ids, list) and ids and
                         all(isinstance(s, int) for s in ids) else 0))
        refs = {side: tuple(BufRef.from_dict(r) for r in d[side]) if side in d else None
                for side in ("src_buff", "dst_buff")}
        tup = (lambda k: tuple(d[k]) if k in d else None)
        tbg = (d["tbg_info"]["tb_id"], d["tbg_info"]["tbg_size"]) if "tbg_info" in d else None
        return PlanOp(name, refs["src_buff"], refs["dst_buff"], d.get("channel_type"), tup("channel_ids"),
                      tup("semaphore_ids"), d.get("barrier_id"), d.get("num_threadblocks"), tbg)


@dataclass(frozen=True)
class BlockOp:
    """An operation as the importer reads it inside its thread block: the :class:`PlanOp`, where it
    stands in the plan (``path``), its channel type (``memory`` where it names none), its channel
    ids resolved to the rank's channel list (``ids``) and the block's remote buffer table by channel
    type (``rbufs``: type -> indices into the rank's ``remote_buffers``)."""
    op: PlanOp
    path: tuple
    t: str
    ids: tuple[int, ...]
    rbufs: dict

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def switch(self) -> str | None:
        """The switch operation this one is a part of (None for the plan's own operations)."""
        return self.op.switch

    @property
    def src(self) -> tuple[BufRef, ...]:
        return self.op.src or ()

    @property
    def dst(self) -> tuple[BufRef, ...]:
        return self.op.dst or ()

    @property
    def semaphore_ids(self) -> tuple[int, ...]:
        return self.op.semaphore_ids or ()

    @property
    def barrier_id(self) -> int | None:
        return self.op.barrier_id

    @property
    def num_threadblocks(self) -> int | None:
        return self.op.num_threadblocks

    @property
    def tbg(self) -> tuple[int, int] | None:
        return self.op.tbg


NOP = PlanOp("nop")


__all__ = ["BlockOp", "BufRef", "NOP", "PlanOp", "PlanOpError", "local", "remote"]
