"""The MSCCL XML dialect shared by the exporter and the importer: names, codes and runtime limits.

Values here follow what the MSCCL executor (msccl-executor-nccl) and RCCL's MSCCL path load:
``<step type>`` codes, buffer letters ``i``/``o``/``s``, protocol names and the ``coll`` spellings,
and the fixed-size tables those runtimes copy an algorithm into (see :class:`XmlLimits`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.program_ir import Buf, Op

#: ``<step type="...">`` for every ProgramIR op (NOP is written as ``nop``).
TYPE_OF_OP: dict[Op, str] = {
    Op.SEND: "s",
    Op.RECV: "r",
    Op.RECV_COPY_SEND: "rcs",
    Op.RECV_REDUCE_SEND: "rrs",
    Op.RECV_REDUCE_COPY: "rrc",
    Op.RECV_REDUCE_COPY_SEND: "rrcs",
    Op.COPY: "cpy",
    Op.REDUCE: "re",
    Op.NOP: "nop",
}
OP_OF_TYPE: dict[str, Op] = {v: k for k, v in TYPE_OF_OP.items()}

LETTER_OF_BUF: dict[Buf, str] = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}
BUF_OF_LETTER: dict[str, Buf] = {v: k for k, v in LETTER_OF_BUF.items()}

PROTOCOLS = ("Simple", "LL", "LL128")
#: messages one connection buffers in the runtimes: the FIFO has NCCL_STEPS = 8 slots; a Simple
#: message takes MSCCL_CHUNKSTEPS = 4 of them, an LL / LL128 message one
MESSAGES_IN_FLIGHT = {"Simple": 2, "LL": 8, "LL128": 8}
#: collectives hccc proves and runs as MSCCL XML (``coll`` spelling: the spec's ``msccl``)
SUPPORTED_COLLECTIVES = tuple(s.msccl for s in SPECS.values() if s.msccl)
#: other spellings of supported collectives that real tools write (the specs' ``msccl_aliases``:
#: msccl-tools and the original MSCCL executor name ReduceScatter ``reduce_scatter``)
COLLECTIVE_ALIASES = {a: s.msccl for s in SPECS.values() if s.msccl for a in s.msccl_aliases}
#: ``coll`` spelling -> ProgramIR collective
COLLECTIVE_OF_COLL = {s.msccl: s.name for s in SPECS.values() if s.msccl}
#: collectives the runtimes know but hccc does not handle (``custom``: msccl-tools' programs that
#: are no standard collective, whose postcondition the file does not state)
OTHER_COLLECTIVES = ("reduce", "broadcast", "alltoallv", "send", "recv", "gather", "scatter", "custom")


@dataclass(frozen=True)
class XmlLimits:
    """Limits of the runtime an exported algorithm targets, and the ``<algo>`` metadata to write.

    The defaults are those of the current MSCCL executor and of RCCL (``MSCCL_MAX_NUM_STEPS`` 64,
    ``MSCCL_MAX_COUNT`` 72, 32 send-peer and 32 recv-peer thread blocks per channel, ``int8``
    dependency thread-block ids, ``int16`` chunk offsets, 4096 XML nodes per rank in their loader);
    :data:`LEGACY_LIMITS` are the older msccl executor's (256 steps, 216 thread blocks).
    """

    max_steps: int = 64               # steps per thread block, nops included
    max_count: int = 71               # chunks per step (cnt < 72)
    max_tbs_per_channel: int = 32     # thread blocks with a send peer (and, separately, with a recv peer)
    max_dep_tb: int = 127             # largest thread-block id a dependency may name
    max_offset: int = 32767           # largest chunk offset
    max_channels: int = 32
    max_tbs: int = 1024               # thread blocks per rank
    max_xml_nodes: int = 4096         # 1 + ngpus + thread blocks + steps of one rank (runtime XML loader)
    max_children: int = 1024          # child elements of one element (runtime XML loader)
    proto: str = "Simple"
    min_bytes: int = 0
    max_bytes: int = 0                # 0: no upper limit

    def __post_init__(self):
        for name in ("max_steps", "max_count", "max_tbs_per_channel", "max_channels", "max_tbs",
                     "max_xml_nodes", "max_children"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"XmlLimits.{name} must be positive")
        if self.max_dep_tb < 0 or self.max_offset < 0:
            raise ValueError("XmlLimits.max_dep_tb and max_offset must not be negative")
        if self.proto not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.proto!r} (expected {', '.join(PROTOCOLS)})")
        if self.min_bytes < 0 or self.max_bytes < 0:
            raise ValueError("minBytes/maxBytes must not be negative")

    def with_(self, **changes) -> "XmlLimits":
        return replace(self, **changes)


LEGACY_LIMITS = XmlLimits(max_steps=256, max_tbs=216)

__all__ = ["COLLECTIVE_ALIASES", "MESSAGES_IN_FLIGHT", "TYPE_OF_OP", "OP_OF_TYPE", "LETTER_OF_BUF", "BUF_OF_LETTER", "PROTOCOLS",
           "SUPPORTED_COLLECTIVES", "COLLECTIVE_OF_COLL", "OTHER_COLLECTIVES", "XmlLimits", "LEGACY_LIMITS"]
