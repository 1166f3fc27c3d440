"""Size-aware micro-batch slice: how many bytes of a chunk one FIFO slot carries, per run size.

The generated kernels cut every chunk of the buffer into micro-batch *slices* and stream them
through FIFOs of ``NSLOTS`` slots per connection (``templates/common/hccc_prims.h.j2``). The slot
capacity (``ProgramIR.chunk_bytes``, the manifest's ``chunk_bytes``) is fixed when the FIFOs are
allocated; the slice actually used may be any multiple of 16 bytes up to it, so it can follow the
size of each call.

Why the slice must follow the size. Task-level execution (hccc's kernels) runs one primitive for
every micro-batch before the TB's next primitive; a dependent primitive on another rank can start
on micro-batch ``i`` as soon as micro-batch ``i`` of its producer has arrived. A chain of ``D``
dependent primitives over ``m`` micro-batches therefore takes about ``(m + D - 1)`` slice times
where a perfectly pipelined one takes ``m``: the pipeline fill costs a fraction of the run that only
the micro-batch count can shrink. With a fixed 1 MiB slice a 64 MB AllReduce over 16 or 32 GPUs has
2 to 4 micro-batches per chunk and task-level execution loses to running the whole algorithm per
micro-batch.

Measured (``hccc.runtime.simulator``, HM AllGather / AllReduce with HPDS on the A100 clusters
``examples/clusters/a100_topo1..4.topo``, the HeteCCL Fig. 10 cluster, a V100 4+8 cluster and an
8-GPU NVLink mesh, 8 MB .. 1 GB): the fraction of the best achievable busbw grows like
``m / (m + 1)`` with ``m`` micro-batches per chunk on HM AllReduce (Topo4, 64 MB: 0.66 at m = 2,
0.89 at 8, 0.95 at 16, 0.98 at 32) and faster on AllGather (0.96 at m = 2). The start-up of
task-level execution against running the whole algorithm per micro-batch is also one slice time:
HM AllReduce 3x2 on the HeteCCL Fig. 10 cluster at 64 MB (11 MB chunks) runs 1.7 % behind
algorithm-level execution with 16 micro-batches, 0.4 % with 32 and 0.9 % ahead with 64.
:data:`TARGET_MICRO_BATCHES` = 32 keeps task-level execution within about 2 % of its small-slice
limit while the per-slice costs that the alpha-beta model leaves out (flag polling, fences, one
proxy round per slot on inter-node connections: microseconds per slice on real GPUs) stay a small
share of a slice: a slice never falls below :data:`MIN_SLICE_BYTES` = 64 KiB (NCCL's Simple
protocol moves 512 KiB per step, LL128 much less), unless the whole chunk is smaller, and never
exceeds the slot capacity. Untested on a GPU: the per-slice cost there decides whether a larger
floor pays.
"""
from __future__ import annotations

__all__ = ["TARGET_MICRO_BATCHES", "MIN_SLICE_BYTES", "SLICE_ALIGN", "DEFAULT_SLOT_BYTES", "MAX_MICRO_BATCHES",
           "THIN_SLICE_BYTES", "THIN_SLOT_SECONDS", "THIN_SLOT_SHARE", "SlicePolicy",
           "thin_policies", "busiest_tb_prims", "busiest_slots", "thin_policy",
           "auto_slice_bytes", "program_slice_bytes", "micro_batches", "slot_share_bytes"]

import numpy as np

from hccc.compiler.frontend.slice_policy import (MAX_MICRO_BATCHES, MIN_SLICE_BYTES, SLICE_ALIGN,
                                                 TARGET_MICRO_BATCHES, SlicePolicy)

#: The smallest floor :func:`thin_policies` offers a program: 16 KiB, a quarter of the default.
THIN_SLICE_BYTES = 16 << 10
#: What a slot costs a thread block beyond the bytes it moves (polling its flags, the fences, the
#: flag it posts), which the simulator leaves out: 7 us, as measured on an H200 with every rank on
#: it (``benchmarks/slot_cost.py``: the slope of a call's time against its busiest thread block's
#: slots, 6.6-7.0 us for ring AllGather and AllReduce 8 at 4 and 64 MiB, slices of 4-64 KiB;
#: 4.6-6.8 us on an H100, ring AllGather on 2 and 8 ranks at 1-16 warps a block; 6.4-6.8 us on
#: an H200 again after a unit's waits and posts came to one fence each; docs/measurements.md).
#: Measure it again when the kernels' per-message path changes.
THIN_SLOT_SECONDS = 7e-6
#: The share of a call's time such costs may take on the busiest thread block (:func:`thin_policy`)
THIN_SLOT_SHARE = 0.5
#: The slot capacity compiled in by default (``--chunk-size``, CompileOptions.chunk_bytes).
DEFAULT_SLOT_BYTES = 1 << 20


def _round_up(x: int, a: int) -> int:
    return -(-int(x) // a) * a


def micro_batches(nbytes: int, nchunks: int, slice_bytes: int, element_bytes: int = 4) -> int:
    """Micro-batches per chunk as the kernels count them: ``max(1, ceil(ceil(count/nchunks) /
    (slice_bytes // element_bytes)))`` with ``count = nbytes // element_bytes``."""
    if nchunks < 1 or element_bytes < 1 or slice_bytes < 1 or nbytes < 0:
        raise ValueError("sizes must be positive")
    count = int(nbytes) // int(element_bytes)
    maxc = -(-count // int(nchunks))
    per = max(1, int(slice_bytes) // int(element_bytes))
    return max(1, -(-maxc // per))


def slot_share_bytes(slot_bytes: int, max_step_chunks: int = 1) -> int:
    """The largest slice (bytes) the kernels use with FIFO slots of ``slot_bytes``: a slot carries
    one micro-batch of one primitive, a slice of each of its chunks, so a program whose primitives
    move up to ``max_step_chunks`` chunks (``ProgramIR.max_step_chunks``) gives each chunk
    ``slot_bytes // max_step_chunks``, rounded down to 16 bytes when that is at least 16 (the same
    arithmetic as ``hccc_ctx_init`` in ``hccc_prims.h``)."""
    share = int(slot_bytes) // max(1, int(max_step_chunks))
    return share - share % SLICE_ALIGN if share >= SLICE_ALIGN else share


def auto_slice_bytes(nbytes: int, nchunks: int, slot_bytes: int = DEFAULT_SLOT_BYTES,
                     element_bytes: int = 4, *, target: int = TARGET_MICRO_BATCHES,
                     min_slice: int = MIN_SLICE_BYTES) -> int:
    """The slice (bytes) for one call of ``nbytes`` (the collective's full buffer) cut into
    ``nchunks`` chunks, streamed through slots of ``slot_bytes``.

    The result is a multiple of 16 bytes (hence of any element size up to 16), at most
    ``slot_bytes`` (rounded down to 16), and:

    * ``ceil(chunk / target)`` rounded up to 16 bytes, so a chunk gets ``target`` micro-batches,
    * but at least ``min_slice``, or the whole chunk (rounded up to 16) when that is smaller, so a
      small chunk is one micro-batch instead of many tiny ones.

    Pure and deterministic; the kernels and the simulator take it as the per-launch slice.
    """
    nbytes, nchunks, slot_bytes = int(nbytes), int(nchunks), int(slot_bytes)
    element_bytes, target, min_slice = int(element_bytes), int(target), int(min_slice)
    if nbytes < 0:
        raise ValueError("nbytes must be non-negative")
    if nchunks < 1 or element_bytes < 1 or target < 1:
        raise ValueError("nchunks, element_bytes and target must be positive")
    if element_bytes > SLICE_ALIGN or SLICE_ALIGN % element_bytes:
        raise ValueError(f"element size {element_bytes} does not divide {SLICE_ALIGN}")
    cap = (slot_bytes // SLICE_ALIGN) * SLICE_ALIGN
    if cap < SLICE_ALIGN:
        raise ValueError(f"slot capacity {slot_bytes} is below {SLICE_ALIGN} bytes")
    count = nbytes // element_bytes
    chunk = max(1, -(-count // nchunks)) * element_bytes     # bytes of the largest chunk
    want = _round_up(-(-chunk // target), SLICE_ALIGN)
    floor = min(_round_up(max(min_slice, 1), SLICE_ALIGN), _round_up(chunk, SLICE_ALIGN))
    return int(min(cap, max(want, floor)))


def program_slice_bytes(program, nbytes: int, slot_bytes: int, element_bytes: int = 4) -> int:
    """:func:`auto_slice_bytes` under ``program``'s own policy (``ProgramIR.slice_policy``): the slice the
    launcher, the communicator and the simulator use for a call of ``nbytes``."""
    pol = program.slice_policy
    return auto_slice_bytes(nbytes, program.nchunks, slot_bytes, element_bytes, target=pol.micro_batches,
                            min_slice=pol.min_slice)


def thin_policies() -> list[SlicePolicy]:
    """The policies of smaller slices a program of thin streams may take, smallest slice first:
    floors from :data:`THIN_SLICE_BYTES` up to half the default's, each with the micro-batches per
    chunk raised as much as its floor falls (the same chunk gets as many more, smaller slices)."""
    out, floor = [], THIN_SLICE_BYTES
    while floor < MIN_SLICE_BYTES:
        out.append(SlicePolicy(TARGET_MICRO_BATCHES * (MIN_SLICE_BYTES // floor), floor))
        floor *= 2
    return out


def busiest_tb_prims(program) -> int:
    """Primitives of the thread block of ``program`` (a ProgramIR) that runs the most (0 without any)."""
    r, t = program.prims["rank"], program.prims["tb"]
    if not len(r):
        return 0
    key = r.astype("int64") * (1 << 20) + t.astype("int64")
    return int(np.unique(key, return_counts=True)[1].max())


def busiest_slots(program, policy: SlicePolicy, nbytes: int, slot_bytes: int, element_bytes: int = 4) -> int:
    """Slots (messages: one per primitive and micro-batch, each a flag to wait for and one to
    post) the busiest thread block of ``program`` (a ProgramIR) handles in one call of ``nbytes``
    under ``policy``."""
    share = slot_share_bytes(slot_bytes, program.max_step_chunks)
    slice_b = min(auto_slice_bytes(nbytes, program.nchunks, share, element_bytes, target=policy.micro_batches,
                                   min_slice=policy.min_slice), share)
    return busiest_tb_prims(program) * micro_batches(nbytes, program.nchunks, slice_b, element_bytes)


def thin_policy(program, nbytes: int, seconds: float, slot_bytes: int = DEFAULT_SLOT_BYTES,
                element_bytes: int = 4) -> list[SlicePolicy]:
    """The :func:`thin_policies` that ``program`` (a ProgramIR running a call of ``nbytes`` in
    about ``seconds``) can afford, smallest slice first: those whose busiest thread block's slots
    (:func:`busiest_slots`), at :data:`THIN_SLOT_SECONDS` each (what a slot costs on a GPU beyond
    the bytes it moves, which the simulator leaves out), take at most :data:`THIN_SLOT_SHARE` of
    ``seconds``. A stream that carries a small share of its links waits for its data most of
    the time, so such costs hide there; a program whose thread blocks are busy moving bytes is
    not offered smaller slices at all (the default's floor stands)."""
    budget = float(seconds) * THIN_SLOT_SHARE / THIN_SLOT_SECONDS
    return [p for p in thin_policies() if busiest_slots(program, p, nbytes, slot_bytes, element_bytes) <= budget]
