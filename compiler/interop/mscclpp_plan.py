"""The MSCCL++ execution plan (JSON), shared by the exporter and the importer: names and limits.

An execution plan is what the MSCCL++ executor (``mscclpp::Executor``, and through it the NCCL-API
shim ``libmscclpp_nccl.so``) loads: one JSON object naming the collective, the protocol (``Simple``
or ``LL`` packets), in place or not and the message-size range, and per GPU (``gpus[r]``, ``id``
== rank r) its chunk counts (``input_chunks``, ``output_chunks``, ``scratch_chunks``), its
channels (``channels``: ``memory`` channels within a node, ``port`` channels through the host
proxy across nodes; each lists the peers it connects to), the peer buffers it reaches
(``remote_buffers``), its device semaphores and its thread blocks. A thread block lists the
channels and remote buffers it uses (``channels``, ``remote_buffer_refs``: its operations index
into these lists) and its operations in order (``ops``).

Buffer references: ``{"type": "i"|"o"|"s", "index": c, "size": n}`` names chunks ``[c, c+n)`` of
the rank's own input, output or scratch buffer; ``{"buffer_id": b, "index": c, "size": n}`` the
same range of the thread block's ``b``-th remote buffer (of the op's channel type). A chunk is
``input_size / input_chunks`` bytes (or ``output_size / output_chunks``; the two must agree), and
the executor refuses sizes that are not a multiple of ``buffer_alignment`` x chunks.

Channels pair up in order: the ``k``-th memory (port) channel rank A lists towards B is the
``k``-th B lists towards A. ``signal`` on A's end raises B's end; ``wait`` on B's end returns once
as many signals arrived as it has waited. A ``wait``, ``signal`` or ``sem_*`` operation runs on the
first threads only, so a ``nop`` (``__syncthreads``) separates it from the data operations around
it, as MSCCL++'s own DSL does.

The limits are the executor's (``execution_common.hpp``: ``MAX_OPERATION`` operations per thread
block, pipeline bodies included; ``MAX_CHANNEL`` channels of each type and remote buffers per thread
block; ``MAX_CHANNEL_PER_OPERATION`` channels and ``MAX_LOCAL_BUFFER_PER_OPERATION`` +
``MAX_CHANNEL_PER_OPERATION`` buffers per operation; ``MAX_DEVICE_SEMAPHORES`` semaphores per
operation; 32-bit byte offsets and sizes), and one more of the hardware: the thread blocks of a
rank wait on each other, so they must all be resident at once (one 1,024-thread block per SM).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.program_ir import Buf
from hccc.compiler.ir.symbolic import MAX_PROOF_SLOTS

#: executor limits (execution_common.hpp)
MAX_OPERATION = 64
MAX_CHANNEL = 16
MAX_CHANNEL_PER_OPERATION = 8
MAX_LOCAL_BUFFER_PER_OPERATION = 2
MAX_DEVICE_SEMAPHORES = 16
MAX_DEVICE_SYNCERS = 16
#: byte offsets and sizes of an operation are uint32 in the device plan
MAX_BYTE_OFFSET = (1 << 32) - 1
BUFFER_ALIGNMENT = 16
#: the largest ``buffer_alignment`` read: byte offsets are uint32 (above), so a larger one aligns
#: nothing the device plan can address
MAX_BUFFER_ALIGNMENT = 1 << 32
#: ``num_threads_per_block`` at most: the most threads a CUDA or HIP thread block may have
#: (``maxThreadsPerBlock`` of every NVIDIA GPU since sm_20 and of every AMD GPU HIP targets)
MAX_THREADS_PER_BLOCK = 1024
#: the executor's scratch buffer shared by the plans that set ``reuse_resources``
#: (``PREDFINED_SCRATCH_SIZE`` in execution_common.hpp: 64 MiB; half per call with a double buffer)
SHARED_SCRATCH_BYTES = 1 << 26
#: the largest ``max_message_size`` the loader defaults to (uint64 max)
NO_MAX_SIZE = (1 << 64) - 1

#: the most chunk slots a plan may declare, over all ranks (input + output + scratch chunks, the
#: scratch twice with LL, where packets take a second region), checked from the declared counts
#: before anything is allocated: every import is proven, by the ProgramIR's proof, so its bound
#: (:data:`hccc.compiler.ir.symbolic.MAX_PROOF_SLOTS`, about 2 GB of proof)
MAX_PLAN_SLOTS = MAX_PROOF_SLOTS

#: the most work the import takes on: every operation it reads counts one, and one more per buffer it
#: names (every transfer is a remote buffer an operation names), a switch operation counted as the
#: memory-channel operation it becomes (which names every member's buffer: a 150-byte ``glres`` on
#: 1,024 ranks names 2,048) and a run of plain nops as one. Counted as they are read, so that the
#: work stays bounded where the plan's text does not bound it. hccc's own plans fit with room: ring
#: AllGather plans export 10.2 operations and 14.3 units of this work a transfer (8, 32 and 64 GPUs),
#: about 15 million for 1,024 GPUs (1,047,552 transfers); the import holds about 1 KB a transfer
MAX_PLAN_WORK = 1 << 26

#: the most parts the import cuts a chunk into for thread-block groups (the least common multiple
#: of a plan's ``tbg_size``s; MSCCL++'s DSL writes groups of up to a node's peers or SMs per peer:
#: 7 and 4 in its installed plans); parts multiply the chunk slots checked against MAX_PLAN_SLOTS
MAX_GROUP_PARTS = 1024

PROTOCOLS = ("Simple", "LL")
#: collectives hccc writes and reads as plans (the ``collective`` field): every collective but the
#: rooted ones (a plan has no root); SendRecv's shift is not written either: its data flow says it
COLLECTIVES = tuple(name for name, spec in SPECS.items() if not spec.rooted)

LETTER_OF_BUF = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}
BUF_OF_LETTER = {v: k for k, v in LETTER_OF_BUF.items()}

#: operations that only synchronise (run on the first threads of the block)
CONTROL_OPS = frozenset({"signal", "wait", "rlxsignal", "rlxwait", "flush", "sem_acquire", "sem_release",
                         "barrier"})
#: the MSCCL++ commit whose executor source the format and its semantics were read from (its
#: ``main``, August 2026); the ``*_LINES`` constants quote it
EXECUTOR_COMMIT = "1f5f065"
#: where the kernel calls the packet operations' handlers, without a pipeline iteration's offset
PACKET_HANDLER_LINES = "src/core/include/execution_kernel.hpp:742-768, 780"
#: LL packet operations: the kernel runs them without a pipeline iteration's offset and unit, whole
#: in every iteration (:data:`PACKET_HANDLER_LINES`)
PACKET_OPS = frozenset({"ppkt", "rppkt", "respkt", "repkt", "recspkt", "recpkt", "upkt", "cpkt", "gstorepkt"})
#: every operation name the executor's loader accepts
OP_NAMES = frozenset({"nop", "barrier", "put", "pws", "pwsf", "get", "copy", "signal", "wait", "flush", "re",
                      "res", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt", "recpkt",
                      "recspkt", "glres", "gstore", "gstorepkt", "rlxsignal", "rlxwait", "pipeline",
                      "sem_acquire", "sem_release"})


@dataclass(frozen=True)
class PlanLimits:
    """What the exported plan must fit: the executor's tables (defaults: ``execution_common.hpp``)
    and ``max_tbs`` thread blocks per rank resident at once (108: an A100's SMs, the smallest of
    the GPUs MSCCL++ targets)."""

    max_operations: int = MAX_OPERATION
    max_channels: int = MAX_CHANNEL
    max_channels_per_op: int = MAX_CHANNEL_PER_OPERATION
    max_buffers_per_op: int = MAX_LOCAL_BUFFER_PER_OPERATION + MAX_CHANNEL_PER_OPERATION
    max_semaphores_per_op: int = MAX_DEVICE_SEMAPHORES
    max_tbs: int = 108
    threads_per_block: int = MAX_THREADS_PER_BLOCK

    def __post_init__(self):
        if self.max_operations < 8:
            raise ValueError("PlanLimits.max_operations must be at least 8")
        for name in ("max_channels", "max_channels_per_op", "max_buffers_per_op", "max_semaphores_per_op",
                     "max_tbs", "threads_per_block"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"PlanLimits.{name} must be positive")

    def with_(self, **changes) -> "PlanLimits":
        return replace(self, **changes)


def looks_like_plan(obj) -> bool:
    """Whether a parsed JSON document is an MSCCL++ execution plan (and not a ProgramIR or a
    manifest, which carry a ``schema``): a ``gpus`` list beside ``collective`` and ``protocol``."""
    return (isinstance(obj, dict) and "schema" not in obj and isinstance(obj.get("gpus"), list)
            and "collective" in obj and "protocol" in obj)


__all__ = ["MAX_GROUP_PARTS", "SHARED_SCRATCH_BYTES", "MAX_PLAN_WORK", "MAX_PLAN_SLOTS", "MAX_OPERATION", "MAX_CHANNEL", "MAX_CHANNEL_PER_OPERATION", "MAX_LOCAL_BUFFER_PER_OPERATION",
           "MAX_DEVICE_SEMAPHORES", "MAX_DEVICE_SYNCERS", "MAX_BYTE_OFFSET", "BUFFER_ALIGNMENT", "MAX_BUFFER_ALIGNMENT",
           "MAX_THREADS_PER_BLOCK", "NO_MAX_SIZE",
           "PROTOCOLS", "COLLECTIVES", "LETTER_OF_BUF", "BUF_OF_LETTER", "CONTROL_OPS", "OP_NAMES",
           "PlanLimits", "looks_like_plan"]
