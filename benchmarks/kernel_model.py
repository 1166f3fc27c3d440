"""What bandwidth each kernel design choice allows, from the programs' own memory traffic.

    python benchmarks/kernel_model.py [--sizes 64M,1G] [--latency-ns 700] [--hbm-gbs 3000]
                                      [--channels 4] [--sms 132] [--json]
    python benchmarks/kernel_model.py --recorded [--predict] [--json]

For ring AllGather 8, ring AllReduce 8 and HM AllReduce 4x8 (examples/), counted from each
ProgramIR with :mod:`hccc.runtime.kernel_traffic`:

- HBM bytes per payload byte: every byte the kernels read or write in HBM (FIFO slots included),
  summed over the ranks, per byte of the collective's full buffer S.
- Fused rows: the same program lowered with receive-and-forward fusion (``--fuse``: fused traffic
  on logical connections and TBs of its own, one per connection pair), as built.
- Blocks per connection: 1 with one channel; K with ``--channels K`` (the kernels as built: each of
  K blocks moves 1/K of every slice, and every one of them posts every message, so a block's loads
  drop K-fold while its messages and their sync do not).
- Per-block rate (Little's law): bytes of loads in flight per block / memory latency. v1 (the
  protocol before this work): one 16-byte load in flight per thread; v2 (as built): HCCC_LOADS = 8
  independent 16-byte loads per thread. A TB needing R bytes of loads takes R / rate.
- Sync per message (assumed, printed): v1 a sequentially consistent system fence per post and a
  remote poll of the receiver's head; v2 a release store and local polls.

Bounds, all ranks on one GPU (what benchmarks/gpu_busbw.py measures): time >= HBM bytes / HBM
bandwidth, and >= the slowest TB's (loads / per-block rate + messages x sync). busbw = S / time x
the collective's busbw factor. Direct rows: the sender writes the peer's destination for the
receives :mod:`hccc.compiler.ir.direct` proves safe (``--direct auto``, the default, in
single-process launches). Every row is the kernels as they were (v1) or are (v2, with one channel
or K, fused or not, direct or not); no row is marked "model" today (the column stays for designs
not built). No GPU is needed; every number is derived from the parameters shown.

v3 (the kernels as built now, all ranks on one H100: what the first GPU run is read against).
Three terms the v2 rows leave out, each printed with its parameter:

- Residency: the kernels keep to 64 registers per thread, so an SM holds 1,024 threads of them;
  the runtime halves the threads per block from the emitted 512 until every block of the run is
  resident (HM AllReduce 4x8: 448 blocks, so 128 threads), and the per-block rate scales with the
  threads. Channels: the run-time ``auto`` rule for the device (``--sms``) with every rank on it.
- Sync per message, not overlapped with the copy. The kernels sync per warp (hccc_prim,
  docs/kernel-protocol.md): each warp waits for a message on its own, moves its piece, and
  arrives on a block-shared counter; the last warp to arrive posts. No block barrier: while one
  warp polls or posts, the block's other warps keep their loads in flight (warps drift apart by up
  to the FIFO depth, 8 messages, and the 16-unit arrival ring). So a message costs the block
  ``SYNC_WARP_US`` in every warp (0.08 us: a warp barrier, a vote, a shared-memory read of the
  unit's `ready` entry and one shared-memory atomic) plus one warp's poll of a counter another SM
  posted with its acquire fence (``SYNC_POLL_US``, 0.5 us at GPU scope: an L2 round trip and a
  fence; the warp that claims the unit polls, the others wait for `ready` and poll nothing) and
  the posting warp's release store (``SYNC_RELEASE_US``, 0.5 us: a fence that drains its stores),
  each stalling one of the block's
  ``w`` warps: sync = 0.08 + (0.5 + 0.5) / w us (``overlapped_sync_us``): 0.14 us at 512 threads
  (16 warps), 0.33 us at 128, 1.08 us at one warp. These are assumptions (printed per row; what an
  H200 measured: docs/measurements.md#gpu-kernels-v4-one-nvidia-h200-every-rank-on-it), not
  measurements; the lock-step v2 sync (one thread polls while the block waits at a barrier, two
  block barriers and a release per message) was 1.0 us; ``--sync-us X`` models any fixed cost.
  Overlap hides the sync from a block's throughput, not from a message's latency: each link of the
  fill below costs the whole chain, 0.08 + 0.5 + 0.5 us (the last warp's arrival, the release,
  the receiver's poll and acquire).
- Launch and fill (``--launch-us``, default 5 us for a cooperative launch; fill = the longest
  primitive chain of a thread block less one, each link one message time): a pipeline of
  messages needs that long before every block is busy.

Time = launch + fill + max(HBM bytes / HBM bandwidth, the slowest block's loads / its rate +
its messages x sync). Bandwidths: ``--hbm-gbs`` 3,000 GB/s, what a device-to-device copy reaches
on an H100 SXM (3,350 is the data sheet's).

LL (built: ``hccc run --proto ll``, docs/kernel-protocol.md; not yet measured on a GPU). Each 8-byte store carries 4 bytes of
data and a 4-byte flag the receiver polls, so no fence, no barrier and no counter wait per
message (``--ll-sync-us``, default 0.2 us: a poll of a line another SM wrote), at twice the slot
bytes and with two 8-byte lines in flight per thread instead of eight 16-byte vectors. Its time uses the same terms; the crossover is the largest full-buffer size (powers of
two) at which LL beats the v3 Simple protocol for ring AllReduce 8.

v4 (the kernels' rebuild, the slice policy's terms: compiler/passes/slicing.py, each constant
read from the kernel cost model, compiler/passes/kernel_cost.py, and measured on the fifth GPU
run):

- Per-unit cost: a unit (one micro-batch of one primitive on one block) costs its block
  ``UNIT_SECONDS`` (2.56 us) beyond its bytes, a COPY unit ``COPY_UNIT_SECONDS`` (2.07 us), an LL
  unit ``LL_UNIT_SECONDS`` (a COPY unit's: its lines carry their flags, so it waits for no flag word).
- One sync warp off the data path: a block's waits and posts run on a warp of their own while
  its data warps copy, so where the next unit's inputs are already there the two overlap and a
  block's steady time is ``max(its units' costs, its loads / its bandwidth)``.
- Per-block bandwidth: ``BLOCK_BYTES_PER_SECOND`` (49 GB/s on long units for a block of 16 warps;
  a block of fewer warps in proportion, as the runtime halves the threads until every block is
  resident); channels split each unit's slice.
- LL lines of 16 bytes, 8 data bytes and two 4-byte flags (NCCL's layout): a block moves
  ``LL_DATA_FRACTION`` (half) of its bandwidth as data, a slot holds half its Simple share, and
  every slot byte is written and read twice over in HBM.
- Launch and fill: ``--launch-us`` once, and the critical path's units beyond the busiest path's
  whole runs (``CriticalPath.fill``, the slice policy's ``D(m) - 1``) at a unit's full cost and
  bytes each: a hop whose inputs just arrived hides nothing.

The slice is the one the launchers pick (``launch_slice_bytes``' rule: the model's, over the
program's critical path, under LL within LL's share); time = launch + fill + max(HBM bytes / HBM
bandwidth, the slowest block's steady time). The v4 LL crossover is the v3 one's for these terms.

The kernel cost model against the recorded runs (``--recorded [--json]``). Every program row of
every GPU run (``benchmarks/recorded/gpu_runs.json``, transcribed from docs/archive/measurements-log.md,
then ``benchmarks/recorded/runs/*.json``, each written by ``benchmarks/record_gpu_run.py`` from a
``gpu_validate.py --quick --json`` report) is
predicted from that run's own unit-level figures (:func:`run_costs`): the model
(:func:`hccc.runtime.kernel_time.program_time`) composes the units of the program's
ProgramIR as the run launched it (every rank on the one GPU, the run-time channel rule, the
threads halved until the grid is resident, direct mode where proven safe, the slice that run's
launcher picked) along its critical path -- a block's order, dependencies and messages across
ranks and blocks, each message a hop, slot back-pressure -- plus a launch cost per block, or its
HBM bound if longer. No recorded run timed a launch alone, so each run's launch cost per block
is taken from its direct AllGather 8 at 4 KiB (the shortest critical path), marked
``calibration``. A run recorded with its ``slot_anatomy`` rows (``units.anatomy``: what
``gpu_validate.py --quick`` measures first) is predicted from those alone
(:func:`costs_from_anatomy`: unit costs, flag round trip, copy table and its launches by blocks,
:func:`launch_from_anatomy`), with no calibration row. A row
within ``EXPLAINED_WITHIN`` (30 %) is ``explained``; any other is ``unexplained`` and named with
its hypothesis (``HYPOTHESES``), never fitted. JSON: ``{"rows": [{"run", "program", "bytes",
"measured_us", "predicted_us", "verdict", ...}]}``.

``--predict``: the same model with hccc's costs (the fifth run's units) and today's structure
(the slice policy, channels and threads hccc picks now), for what the next GPU run checks: a hop,
ring AllReduce 8 at 4 KiB, ring AllGather 8 at 256 MiB against its HBM bound, HM AllReduce 4x8 at
32 MiB in place against its bound, each beside its target.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hccc.args import parse_size
from hccc.util.sizes import format_size

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = {
    "ring_allgather_8": ROOT / "examples" / "ring_allgather_8.rccl",
    "ring_allreduce_8": ROOT / "examples" / "ring_allreduce_8.rccl",
    "hm_allreduce_4x8": ROOT / "examples" / "hm_allreduce_4x8.rccl",
}
THREADS = 512            # threads per block of the CUDA kernels as emitted (16 warps)
#: threads of the kernels (64 registers each) one SM holds at once (65,536 registers)
RESIDENT_THREADS_PER_SM = 1024
H100_SMS = 132
#: LL model: bytes of 8-byte line loads in flight per thread (two lines)
LL_INFLIGHT = 16
LOADS_V2 = 8             # HCCC_LOADS
SYNC_US = {"v1": 2.0, "v2": 0.7}   # per message, assumed (see the module docstring)
#: the overlapped sync (v3), assumed, at GPU scope on an H100 (module docstring): every warp's part,
#: one warp's poll and acquire, the posting warp's release
SYNC_WARP_US = 0.08
SYNC_POLL_US = 0.5
SYNC_RELEASE_US = 0.5


def overlapped_sync_us(threads: int) -> float:
    """Per message, what the overlapped sync of a block of ``threads`` threads does not hide (us):
    every warp's own part, and one warp's poll and one warp's release, each stalling 1/w of the
    block's loads in flight."""
    warps = max(1, threads // 32)
    return SYNC_WARP_US + (SYNC_POLL_US + SYNC_RELEASE_US) / warps






def designs(channels: int):
    """(name, loads in flight per thread, blocks per connection, direct, sync key, model only, fused)"""
    return [("v1 (before)", 1, 1, False, "v1", False, False),
            ("v2 (as built)", LOADS_V2, 1, False, "v2", False, False),
            ("v2 + fused", LOADS_V2, 1, False, "v2", False, True),
            (f"v2 + {channels} channels", LOADS_V2, channels, False, "v2", False, False),
            ("v2 + direct", LOADS_V2, 1, True, "v2", False, False),
            ("v2 + fused + direct", LOADS_V2, 1, True, "v2", False, True),
            (f"v2 + {channels} ch + direct", LOADS_V2, channels, True, "v2", False, False)]


def model(ir, nbytes: int, *, latency_ns: float, hbm_gbs: float, channels: int,
          fused_ir=None) -> list[dict]:
    from hccc.compiler.passes.slicing import micro_batches, program_slice_bytes, slot_share_bytes
    from hccc.runtime.busbw import busbw_factor
    from hccc.runtime.kernel_traffic import traffic

    es = 4
    factor = busbw_factor(ir.collective, ir.nranks)

    def messages(prog):
        slice_b = program_slice_bytes(prog, nbytes, slot_share_bytes(prog.chunk_bytes, prog.max_step_chunks), es)
        nmb = micro_batches(nbytes, prog.nchunks, slice_b, es)
        out: dict = {}
        for r, t in zip(prog.prims["rank"].tolist(), prog.prims["tb"].tolist()):
            out[(r, t)] = out.get((r, t), 0) + nmb
        return out

    msgs_of = {False: messages(ir)}
    if fused_ir is not None:
        msgs_of[True] = messages(fused_ir)
    rows = []
    for name, loads, k, direct, sync, only_model, fused in designs(channels):
        if fused and fused_ir is None:
            continue
        prog = fused_ir if fused else ir
        msgs = msgs_of[fused]
        tr = traffic(prog, nbytes, es, direct=direct)
        rate = THREADS * 16 * loads / (latency_ns * 1e-9)            # bytes/s per block
        t_hbm = tr.hbm / (hbm_gbs * 1e9)
        # each of a TB's k blocks loads 1/k of its bytes and posts every one of its messages
        t_tb = max((tr.per_tb_reads[key] / (rate * k)) + msgs[key] * SYNC_US[sync] * 1e-6
                   for key in tr.per_tb_reads)
        t = max(t_hbm, t_tb)
        rows.append({
            "algorithm": ir.name, "size": nbytes, "design": name, "model_only": only_model,
            "hbm_per_byte": tr.hbm / nbytes, "blocks_per_conn": k, "block_gbs": rate / 1e9,
            "hbm_bound_busbw": nbytes / t_hbm * factor / 1e9 if t_hbm else math.inf,
            "block_bound_busbw": nbytes / t_tb * factor / 1e9 if t_tb else math.inf,
            "busbw": nbytes / t * factor / 1e9, "limit": "HBM" if t_hbm >= t_tb else "blocks",
        })
    return rows


def v3_threads(blocks: int, sms: int) -> int:
    """Threads per block the runtime launches: the emitted 512, halved until ``blocks`` blocks are
    resident at once (1,024 threads of 64 registers per SM), at least one warp."""
    t = THREADS
    while t > 32 and blocks > sms * (RESIDENT_THREADS_PER_SM // t):
        t //= 2
    return t


def v3(ir, nbytes: int, *, latency_ns: float, hbm_gbs: float, sms: int, sync_us: float | None = None,
       launch_us: float, ll: bool = False, ll_sync_us: float = 0.2, channels: int | None = None) -> dict:
    """One v3 row (module docstring): the kernels as built now, all ranks on one GPU; ``ll``: the
    low-latency protocol's model instead of Simple; ``sync_us``: a fixed sync per message instead
    of the overlapped sync's (``overlapped_sync_us`` of the row's threads)."""
    from hccc.compiler.passes.channels import device_channels, with_channels
    from hccc.compiler.passes.slicing import micro_batches, program_slice_bytes, slot_share_bytes
    from hccc.runtime.busbw import busbw_factor
    from hccc.runtime.kernel_traffic import traffic

    es = 4
    k = channels or device_channels(ir, sms, ir.nranks)
    prog = with_channels(ir, k)
    tbs = {(r, t) for r, t in zip(prog.prims["rank"].tolist(), prog.prims["tb"].tolist())}
    blocks = len(tbs) * k
    threads = v3_threads(blocks, sms)
    share = slot_share_bytes(prog.chunk_bytes, prog.max_step_chunks)
    slice_b = program_slice_bytes(prog, nbytes, share // 2 if ll else share, es, "ll" if ll else "simple")
    nmb = micro_batches(nbytes, prog.nchunks, slice_b, es)
    prims_per_tb: dict = {}
    for key in zip(prog.prims["rank"].tolist(), prog.prims["tb"].tolist()):
        prims_per_tb[key] = prims_per_tb.get(key, 0) + 1
    tr = traffic(prog, nbytes, es)
    hbm = tr.hbm + (tr.link * 2 if ll else 0)          # LL: each slot byte written and read twice over
    # bytes of loads in flight per thread: 8 vectors of 16 bytes (Simple); LL polls 8-byte lines, two
    # at a time, and half of each line is its flag
    rate = threads * (LL_INFLIGHT if ll else 16 * LOADS_V2) / (latency_ns * 1e-9)
    simple_sync = overlapped_sync_us(threads) if sync_us is None else sync_us
    sync = (ll_sync_us if ll else simple_sync) * 1e-6
    # a message's latency from one primitive to the next (the fill below) hides nothing: Simple's
    # data is visible once the last warp arrived, the poster released and the receiver polled
    hop = (ll_sync_us if ll else SYNC_WARP_US + SYNC_POLL_US + SYNC_RELEASE_US if sync_us is None
           else sync_us) * 1e-6
    t_hbm = hbm / (hbm_gbs * 1e9)
    t_tb = max(tr.per_tb_reads[key] * (2 if ll else 1) / (rate * k) + prims_per_tb[key] * nmb * sync
               for key in tr.per_tb_reads)
    # fill: the longest chain of primitives a message passes, less one, each one message time
    msg_t = slice_b / k / rate + hop
    fill = (max(prims_per_tb.values()) - 1) * msg_t
    t = launch_us * 1e-6 + fill + max(t_hbm, t_tb)
    factor = busbw_factor(ir.collective, ir.nranks)
    return {"algorithm": ir.name, "size": nbytes, "design": "LL (model, built, not measured)" if ll else "v3 (as built)",
            "model_only": bool(ll), "threads": threads, "channels": k, "blocks": blocks,
            "hbm_per_byte": hbm / nbytes if nbytes else 0.0, "messages_per_block": max(prims_per_tb.values()) * nmb,
            "sync_us": sync * 1e6, "time_us": t * 1e6, "fill_us": fill * 1e6, "hbm_us": t_hbm * 1e6, "block_us": t_tb * 1e6,
            "busbw": nbytes / t * factor / 1e9, "of_hbm_bound": t_hbm / t,
            "limit": "HBM" if t_hbm >= t_tb else "blocks"}


def ll_crossover(ir, **kw) -> int:
    """The largest power-of-two full-buffer size (4 KiB .. 1 GiB) at which the LL model is faster
    than v3 Simple (0: never)."""
    best = 0
    for e in range(12, 31):
        n = 1 << e
        if v3(ir, n, ll=True, **kw)["time_us"] < v3(ir, n, **kw)["time_us"]:
            best = n
    return best


def v4(ir, nbytes: int, *, hbm_gbs: float, sms: int, launch_us: float, proto: str = "simple",
       channels: int | None = None) -> dict:
    """One v4 row (module docstring): the rebuilt kernels' design, all ranks on one GPU of ``sms``
    multiprocessors, under ``proto`` ("simple" or "ll"); every cost is a constant of
    :mod:`hccc.compiler.passes.slicing` (the kernel cost model's, measured on the fifth GPU run)."""
    from collections import Counter

    from hccc.compiler.backend import abi
    from hccc.compiler.ir.program_ir import Op
    from hccc.compiler.passes import slicing
    from hccc.compiler.passes.channels import device_channels, with_channels
    from hccc.runtime.busbw import busbw_factor
    from hccc.runtime.kernel_traffic import traffic

    es = 4
    ll = proto == "ll"
    k = channels or device_channels(ir, sms, ir.nranks)
    prog = with_channels(ir, k)
    keys = list(zip(prog.prims["rank"].tolist(), prog.prims["tb"].tolist()))
    blocks = len(set(keys)) * k
    threads = v3_threads(blocks, sms)
    # bytes of loads a second one block moves (a block of fewer warps in proportion), data under LL
    rate = slicing.block_bytes_per_second(proto) * min(1.0, threads / THREADS)
    share = slicing.slot_share_bytes(prog.chunk_bytes, prog.max_step_chunks)
    if ll:
        share = abi.ll_share_bytes(share) or share
    slice_b = slicing.program_slice_bytes(prog, nbytes, share, es, proto)
    nmb = slicing.micro_batches(nbytes, prog.nchunks, slice_b, es)
    part = 16 * -(-(slice_b // 16) // k)                     # the largest channel's part of a slice
    cp = slicing.critical_path(prog)
    c = slicing.unit_seconds(proto)
    # what a block's units cost its sync warp: COPY units less under Simple
    copy = prog.prims["op"] == int(Op.COPY)
    sync: dict = {}
    for key, is_copy in zip(keys, copy.tolist()):
        sync[key] = sync.get(key, 0.0) + nmb * (slicing.COPY_UNIT_SECONDS if is_copy and not ll else c)
    tr = traffic(prog, nbytes, es)
    hbm = tr.hbm + (tr.link * 2 if ll else 0)            # LL: every slot byte written and read twice over
    t_hbm = hbm / (hbm_gbs * 1e9)
    # the sync warp off the data path: a block's steady time is the longer of its units' costs and
    # its loads (each of its k blocks loads 1/k of them)
    steady = {key: max(sync[key], tr.per_tb_reads[key] / (rate * k)) for key in tr.per_tb_reads}
    t_tb = max(steady.values())
    # the fill: the critical path's units beyond its whole runs, each a unit's cost and bytes
    fill = cp.fill(nmb) * (c + part / rate)
    t = launch_us * 1e-6 + fill + max(t_hbm, t_tb)
    factor = busbw_factor(ir.collective, ir.nranks)
    return {"algorithm": ir.name, "size": nbytes, "design": f"v4 {proto} (model)", "model_only": True,
            "proto": proto, "threads": threads, "channels": k, "blocks": blocks, "slice": slice_b,
            "micro_batches": nmb, "units_per_block": max(Counter(keys).values(), default=0) * nmb,
            "unit_us": c * 1e6, "block_gbs": rate / 1e9, "hbm_per_byte": hbm / nbytes if nbytes else 0.0,
            "time_us": t * 1e6, "fill_us": fill * 1e6, "hbm_us": t_hbm * 1e6, "block_us": t_tb * 1e6,
            "sync_bound": t_tb > 0 and max(sync.values()) >= t_tb, "busbw": nbytes / t * factor / 1e9,
            "of_hbm_bound": t_hbm / t, "limit": "HBM" if t_hbm >= t_tb else "blocks"}


def v4_ll_crossover(ir, **kw) -> int:
    """The largest power-of-two full-buffer size (4 KiB .. 1 GiB) at which v4 LL is faster than v4
    Simple (0: never)."""
    best = 0
    for e in range(12, 31):
        n = 1 << e
        if v4(ir, n, proto="ll", **kw)["time_us"] < v4(ir, n, **kw)["time_us"]:
            best = n
    return best


def v4_constants() -> dict:
    """The v4 rows' constants (compiler/passes/slicing.py, read from compiler/passes/kernel_cost.py:
    measured on the fifth GPU run), as printed."""
    from hccc.compiler.passes import slicing
    return {"unit_us": slicing.UNIT_SECONDS * 1e6, "copy_unit_us": slicing.COPY_UNIT_SECONDS * 1e6,
            "ll_unit_us": slicing.LL_UNIT_SECONDS * 1e6, "block_gbs": slicing.BLOCK_BYTES_PER_SECOND / 1e9,
            "ll_data_fraction": slicing.LL_DATA_FRACTION, "measured": True}


def _auto_max() -> int:
    from hccc.compiler.backend import abi
    return abi.LL_AUTO_MAX_BYTES


# ---------------------------------------------------------------------------------------------
# --recorded and --predict: the kernel cost model (compiler/passes/kernel_cost.py) against the
# recorded GPU runs (benchmarks/recorded/gpu_runs.json)
# ---------------------------------------------------------------------------------------------
RECORDED = ROOT / "benchmarks" / "recorded" / "gpu_runs.json"
#: a row is explained when the model's time is within this share of the measured one
EXPLAINED_WITHIN = 0.30
#: the program each run's launch cost per block is taken from (the shortest critical path: 3 units)
LAUNCH_ROW = ("direct_allgather_8", 4096)
#: The v3 kernels' slice rule (compiler/passes/slicing.py before the slice model, the first to
#: fourth runs): about this many micro-batches a chunk, none below ``V3_MIN_SLICE`` unless the
#: chunk is smaller, none above the slot share.
V3_MICRO_BATCHES = 32
V3_MIN_SLICE = 64 << 10
#: The slice model's constants when the fifth run was taken (compiler/passes/slicing.py at that
#: commit: the v4 design targets, 0.5 us a unit and 0.2 us an LL unit, 100 GB/s a block): the
#: slices that run used.
V4_SLICE_COSTS = {"simple": (0.5e-6, 100e9), "ll": (0.2e-6, 50e9)}
#: Rows the model does not explain, each with its hypothesis, by (program, size, kernels): a row is
#: named here only when its prediction misses by more than ``EXPLAINED_WITHIN`` (both ways:
#: tests/test_kernel_cost.py checks none is named that the model explains, and none is missing).
HYPOTHESES = {
    ("ring_broadcast_8", 32 << 20, "v3"):
        "600x the model: its busiest block's 512 slots at 4.6 ms a slot against 7 us elsewhere (the "
        "second run), so neither a unit's cost nor its bytes: the blocks of a chain of seven hops from "
        "the root wait on a peer for long, and the waiting blocks' polls delayed the working ones (the "
        "v4 engine's waiting blocks no longer starve a working one, the fifth run, and it ran 1,100x "
        "faster there)",
    ("ring_broadcast_8", 32 << 20, "v4"):
        "3.6x the model: every hop of its chain forwards (RECV_COPY_SEND: reads the slot, writes the "
        "destination and the next slot), a unit the fifth run's table has no row for; the model charges "
        "it a RECV unit's fixed cost and its loads, not its second store, and a wait that spans a "
        "whole unit at half a flag round trip (the static review: a receive takes three round trips, "
        "tail poll, L1 invalidation, region-header load); unmeasured: slot_anatomy of a forwarding unit",
    ("hm_allreduce_4x8", 32 << 20, "v3"):
        "20-200x the model (631 ms in place against 62 out of place): 9 micro-batches against 8 slots "
        "on a grid of 32 ranks; the model's back-pressure waits one hop per freed slot and finds none on "
        "its longest path, while the engine runs later phases before earlier ones on adjacent "
        "primitives (a convoy the model's per-block order cannot produce); in place adds what the model "
        "does not see at all",
    ("hm_allreduce_4x4", 4 << 10, "v3"):
        "0.68 of the measured time since thread blocks run their primitives in step order "
        "(compiler/passes/phase_order.py; 0.95 before): the run's program sent a later step's chunk "
        "before an earlier step's on the same block, which today's program does not; the model "
        "predicts today's shorter critical path (22 units on it instead of 37), not re-measured",
    ("hm_allreduce_4x8", 4 << 10, "v3"):
        "0.58 of the measured time since thread blocks run their primitives in step order "
        "(compiler/passes/phase_order.py; 0.74 before): the run's program ran 1,072 adjacent "
        "primitive pairs of a block a later step first, today's none; the model predicts today's "
        "shorter critical path (26 units on it instead of 52), not re-measured",
    ("hm_allreduce_4x8", 32 << 20, "v4"):
        "35x the model: the static review counts 2,048 blocks of one data warp (the model, from the "
        "run-time channel rule: 512 blocks of 8 warps), 9 micro-batches against 8 slots, and 576 of "
        "3,456 adjacent primitive pairs running a later phase before an earlier one: a back-pressure "
        "convoy the model's task-level order and one-hop slot waits do not produce (today's program "
        "runs none: compiler/passes/phase_order.py; the alpha-beta simulator, which holds a send "
        "until its slot is free, finds no convoy either way; not re-measured)",
    ("hm_allgather_4x8", 32 << 20, "v3"):
        "0.55-0.58 of the measured time: 512 blocks at 256 threads, while the v3 units were timed at "
        "16 warps on 128-block grids; the model charges these blocks the same unit and the v3 kit's "
        "flat copy rate whatever their warps (the fifth run's copy table: 8 warps copy at 0.7-0.85 of "
        "16), and its hierarchy's blocks share the card with 31 other ranks' (contention unmodelled)",
    ("ring_allgather_8", 32 << 20, "v4"):
        "about 250 us more than launch + critical path + HBM at 32 MiB, in neither the 4 KiB nor the "
        "256 MiB rows: the model's per-block copy rate is one block's alone (the copy-engine table) "
        "while 128 blocks copy at once; a unit that waits for HBM under that load would cost this at "
        "mid sizes and hide under the HBM bound at large ones (unmeasured: slot_anatomy with a full "
        "grid copying)",
    ("ring_allreduce_8", 32 << 20, "v4"):
        "as ring AllGather 8 at 32 MiB (about 430 us beyond the model, none at 4 KiB or 256 MiB): one "
        "block's copy rate where 128 copy at once, its reductions loading twice",
}


#: runs recorded by ``benchmarks/record_gpu_run.py`` from a ``gpu_validate.py --quick --json``
#: report, one file each (``<run>.json``), after those of :data:`RECORDED` in their ``recorded`` order
RECORDED_RUNS = ROOT / "benchmarks" / "recorded" / "runs"


def load_recorded(path: Path = RECORDED, runs_dir: Path | None = None) -> dict:
    """The recorded runs (``benchmarks/recorded/gpu_runs.json``, then every run file of
    ``runs_dir``, default :data:`RECORDED_RUNS` beside the default ``path``), by run name."""
    data = json.loads(Path(path).read_text())
    runs = {r["run"]: r for r in data["runs"]}
    if runs_dir is None and Path(path) == RECORDED:
        runs_dir = RECORDED_RUNS
    extra = [json.loads(f.read_text()) for f in sorted(Path(runs_dir).glob("*.json"))] if runs_dir else []
    for r in sorted(extra, key=lambda r: (str(r.get("recorded", "")), r["run"])):
        if r["run"] in runs:
            raise ValueError(f"recorded run {r['run']!r} twice")
        runs[r["run"]] = r
    return runs


def example_program(row: dict):
    """The ProgramIR of a recorded row: ``examples/<program>.rccl`` or ``.json``, compiled with
    the row's ``fuse`` (``--fuse``) where it has one."""
    from hccc.compiler.pipeline import CompileOptions, load_program
    path = ROOT / "examples" / f"{row['program']}.rccl"
    if not path.exists():
        path = path.with_suffix(".json")
    return load_program(path, CompileOptions(fuse=row["fuse"]) if row.get("fuse") else None)


#: the ping-pong flavour of ``slot_anatomy`` whose round trip is the kernels' own ordering (its
#: ``PP_HCCC``: the engine's poll, acquire, release and post functions within one GPU)
ANATOMY_FLAG_FLAVOUR = "hccc v4, one GPU"
#: the launch rows of ``slot_anatomy`` a one-grid call is charged (it is launched cooperatively)
ANATOMY_LAUNCH_KIND = "engine, cooperative"
#: unit ops of ``slot_anatomy``'s units rows that are rows of :data:`kernel_cost.UNIT_US`
ANATOMY_UNIT_OPS = ("COPY", "SEND", "RECV", "RECV_REDUCE_COPY")


def launch_from_anatomy(rows: list, kind: str = ANATOMY_LAUNCH_KIND) -> tuple:
    """((blocks, us), ...) of a launch from ``slot_anatomy``'s launch rows of ``kind``: the engine
    with one NOP row a block less one row's cost (the 16-row launch's extra time over 15), so that
    the launch is not charged a unit the program's path charges again. Empty where the rows lack
    a grid's pair (1 and 16 rows)."""
    by = {}
    for r in rows:
        if r.get("exp") == "launch" and r.get("kind") == kind:
            by.setdefault(int(r["blocks"]), {})[int(r["rows"])] = float(r["us"])
    out = []
    for b, t in sorted(by.items()):
        if 1 in t and 16 in t:
            row = max(0.0, (t[16] - t[1]) / 15)
            out.append((b, round(max(0.0, t[1] - row), 3)))
    return tuple(out)


def costs_from_anatomy(rows: list, *, hbm_bytes_per_s: float, source: str):
    """:class:`~hccc.compiler.passes.kernel_cost.KernelCosts` from one run's ``slot_anatomy`` rows
    (``--json``'s ``rows``): each op's unit cost by warps (the ``unit_cost`` fits), the kernels'
    flag round trip (:data:`ANATOMY_FLAG_FLAVOUR`), one block's copy table (the ``copy`` rows, GB/s
    by warps and unit size) and the launch by blocks (:func:`launch_from_anatomy`). Raises
    ValueError naming what the rows lack."""
    from hccc.compiler.passes.kernel_cost import KernelCosts
    warp = next((int(r["warp"]) for r in rows if r.get("exp") == "device"), 32)

    def warps_of(threads) -> int:          # the CPU emulation's blocks are a few threads: one warp
        return max(1, int(threads) // warp)
    fits = {(r["op"], warps_of(r["threads"])): r["us_per_unit"] for r in rows
            if r.get("exp") == "unit_cost" and r.get("us_per_unit") is not None}
    warps = sorted({w for (op, w) in fits if op in ANATOMY_UNIT_OPS})
    missing = [(op, w) for op in ANATOMY_UNIT_OPS for w in warps if (op, w) not in fits]
    if not warps or missing:
        raise ValueError(f"the slot anatomy has no unit cost for {missing or 'any op'}")
    flags = [r["us_round_trip"] for r in rows if r.get("exp") == "pingpong"
             and str(r.get("flavour", "")).startswith(ANATOMY_FLAG_FLAVOUR)]
    if not flags:
        raise ValueError(f"the slot anatomy has no ping-pong of the kernels' ordering ({ANATOMY_FLAG_FLAVOUR})")
    copy = {}
    for r in rows:
        if r.get("exp") == "copy" and r.get("correct"):
            copy.setdefault(warps_of(r["threads"]), {})[int(r["slice"]) // 1024] = float(r["GBps"])
    kib = sorted(set.intersection(*(set(v) for v in copy.values()))) if copy else []
    if len(kib) < 2:
        raise ValueError("the slot anatomy has no copy table of two unit sizes at every warp count")
    return KernelCosts(
        unit_us={op: tuple(max(0.0, float(fits[(op, w)])) for w in warps) for op in ANATOMY_UNIT_OPS},
        warps=tuple(warps), flag_round_trip_us=float(flags[0]), launch_per_block_s=0.0,
        hbm_bytes_per_s=float(hbm_bytes_per_s), copy_kib=tuple(kib),
        copy_gbs={w: tuple(v[k] for k in kib) for w, v in copy.items()}, source=source,
        launch_us_by_blocks=launch_from_anatomy(rows))


def run_costs(run: dict, runs: dict, launch_per_block_s: float = 0.0):
    """:class:`~hccc.compiler.passes.kernel_cost.KernelCosts` from ``run``'s own unit-level
    figures (module docstring of kernel_cost): the fifth run's unit, flag and copy tables for the v4
    kernels; for the v3 kernels (first to fourth runs), the run's slot slope at 16 warps as every
    unit's fixed cost (the fourth run measured none: the third run's, the same kernels and card),
    the v3 kit's copy rate and the v3 protocol's flag round trip (the fifth run's baseline figures,
    the only ones taken of the v3 kernels)."""
    from hccc.compiler.passes.kernel_cost import KernelCosts
    u = run["units"]
    if "anatomy" in u:          # a run that kept its slot_anatomy rows: every figure from them
        return costs_from_anatomy(u["anatomy"], hbm_bytes_per_s=u["hbm_tbs"] * 1e12, source=run["section"])
    if run["kernels"] == "v4":
        warps = tuple(u["unit_warps"])
        return KernelCosts(
            unit_us={k: tuple(v) for k, v in u["unit_us"].items()}, warps=warps,
            flag_round_trip_us=u["flag_round_trip_us"]["v4"], launch_per_block_s=launch_per_block_s,
            hbm_bytes_per_s=u["hbm_tbs"] * 1e12, copy_kib=tuple(u["copy_unit_kib"]),
            copy_gbs={int(w): tuple(v) for w, v in u["copy_gbs"].items()}, source=run["section"])
    own = runs[u["same_kernels_as"]]["units"] if "same_kernels_as" in u else u
    if "slot_slope_us" in own:
        slopes = list(own["slot_slope_us"].values())
    else:           # --diagnose: ring AllGather 8, direct auto, the 16-warp column
        slopes = [own["diagnose_slot_us"]["ring_allgather_8 auto"][own["diagnose_warps"].index(16)]]
    slot = sum(slopes) / len(slopes)
    fifth = runs["fifth"]["units"]
    return KernelCosts(
        unit_us={k: (slot,) for k in ("COPY", "SEND", "RECV", "RECV_REDUCE_COPY")}, warps=(16,),
        flag_round_trip_us=fifth["flag_round_trip_us"]["v3"], launch_per_block_s=launch_per_block_s,
        hbm_bytes_per_s=2 * max(u["device_copy_tbs"]) * 1e12, flat_gbs=fifth["v3_kit_copy_gbs_16_warps"],
        source=run["section"])


def _v3_slice(nbytes: int, nchunks: int, share: int, es: int = 4) -> int:
    """The v3 kernels' slice (``V3_MICRO_BATCHES``, ``V3_MIN_SLICE``)."""
    def up(x):
        return -(-int(x) // 16) * 16
    chunk = max(1, -(-(nbytes // es) // nchunks)) * es
    return int(min(share - share % 16, max(up(-(-chunk // V3_MICRO_BATCHES)), min(up(V3_MIN_SLICE), up(chunk)))))


def predict(ir, nbytes: int, costs, *, kernels: str, sms: int, proto: str = "simple", slice_bytes: int | None = None,
            slice_costs: tuple | None = None):
    """The model's :class:`~hccc.runtime.kernel_time.ProgramTime` of one call as a run
    launched it: every rank on one GPU of ``sms`` SMs, the run-time channel rule, the threads
    halved until the grid is resident, direct mode where proven safe, the slice the launcher of
    those ``kernels`` picked (``slice_costs``: the slice model's constants then) unless given."""
    from hccc.compiler.backend import abi
    from hccc.compiler.passes import slicing
    from hccc.runtime import kernel_time
    from hccc.compiler.passes.channels import device_channels, with_channels

    k = device_channels(ir, sms, ir.nranks)
    prog = with_channels(ir, k)
    blocks = len(set(zip(prog.prims["rank"].tolist(), prog.prims["tb"].tolist()))) * k
    threads = v3_threads(blocks, sms)
    share = slicing.slot_share_bytes(prog.chunk_bytes, prog.max_step_chunks)
    if proto == "ll":
        share = abi.ll_share_bytes(share) or share
    if slice_bytes is None:
        if kernels == "v3":
            slice_bytes = _v3_slice(nbytes, prog.nchunks, share)
        else:
            slice_bytes = slicing.auto_slice_bytes(
                nbytes, prog.nchunks, share, 4, path=slicing.critical_path(prog), nchannels=k, proto=proto,
                policy=prog.slice_policy, costs=slice_costs)
    return kernel_time.program_time(prog, nbytes, costs, slice_bytes=int(slice_bytes), warps=threads // 32,
                                    proto=proto)


def _hypothesis(run: dict, row: dict) -> str:
    return HYPOTHESES.get((row["program"], row["bytes"], run["kernels"]), "none recorded")


def recorded(path: Path = RECORDED) -> list[dict]:
    """Every program row of every recorded run (:func:`load_recorded`) with the model's time
    from that run's own unit-level figures: :func:`recorded_runs`."""
    return recorded_runs(load_recorded(path))


def recorded_runs(runs: dict) -> list[dict]:
    """Every program row of ``runs`` (by name, as :func:`load_recorded` gives them) with the
    model's time from that run's own unit-level figures (:func:`run_costs`), its parts and its
    verdict: ``explained`` (within ``EXPLAINED_WITHIN``), ``calibration`` (the row the run's launch
    cost is taken from), ``unexplained`` (with its hypothesis) or ``not predicted`` (a program the
    repository does not hold)."""
    irs: dict = {}
    out = []
    for run in runs.values():
        base = run_costs(run, runs)
        slice_costs = V4_SLICE_COSTS if run["kernels"] == "v4" else {}

        def one(row, costs):
            key = (row["program"], row.get("fuse"))
            ir = irs.get(key)
            if ir is None:
                ir = irs[key] = example_program(row)
            return predict(ir, row["bytes"], costs, kernels=run["kernels"], sms=run["sms"], proto=row["proto"],
                           slice_bytes=row.get("slice"), slice_costs=slice_costs.get(row["proto"]))

        if base.launch_us_by_blocks:        # the run measured its launches: no row calibrates
            cal, per_block, costs = None, 0.0, base
        else:
            cal = next(r for r in run["rows"] if (r["program"], r["bytes"]) == LAUNCH_ROW)
            t0 = one(cal, base)
            per_block = (cal["us"] * 1e-6 - (t0.total - t0.launch)) / t0.blocks
            costs = run_costs(run, runs, per_block)
        for row in run["rows"]:
            rec = {"run": run["run"], "card": run["card"], "kernels": run["kernels"], "program": row["program"],
                   "bytes": row["bytes"], "proto": row["proto"], "placement": row["placement"],
                   "slice": row.get("slice"), "fuse": row.get("fuse"), "measured_us": row["us"], "predicted_us": None}
            if row.get("not_in_repository"):
                rec.update(verdict="not predicted", hypothesis="the program was synthesised for the run and is "
                                                               "not in the repository")
                out.append(rec)
                continue
            t = one(row, costs)
            rec.update(predicted_us=round(t.total * 1e6, 1), ratio=round(t.total * 1e6 / row["us"], 3),
                       launch_us=round(t.launch * 1e6, 1), path_us=round(t.path * 1e6, 1),
                       hbm_us=round(t.hbm * 1e6, 1), units=t.units, hops=t.hops, waits=t.waits, blocks=t.blocks,
                       warps=t.warps, micro_batches=t.micro_batches, model_slice=t.slice,
                       launch_per_block_us=round(per_block * 1e6, 3))
            if row is cal:
                rec["verdict"] = "calibration"
            elif abs(rec["ratio"] - 1) <= EXPLAINED_WITHIN:
                rec["verdict"] = "explained"
            else:
                rec.update(verdict="unexplained", hypothesis=_hypothesis(run, row))
            out.append(rec)
    return out


def next_run_predictions() -> list[dict]:
    """What the next GPU run checks, by this model with hccc's costs (kernel_cost.V4_H200: the
    fifth run's units) and today's kernels' structure (the slice policy, channels and threads
    hccc picks now), each beside its target."""
    from hccc.compiler.passes import kernel_cost as kc
    from hccc.compiler.pipeline import load_program
    from hccc.runtime import kernel_time

    sms = H100_SMS
    c = kc.V4_H200
    ar = load_program(ALGORITHMS["ring_allreduce_8"])
    ag = load_program(ALGORITHMS["ring_allgather_8"])
    hm = load_program(ALGORITHMS["hm_allreduce_4x8"])
    rows = [{"what": "per hop (a unit's post to the next block's unit: half a flag round trip + a RECV unit)",
             "predicted_us": round((c.hop_seconds() + c.fixed_seconds("RECV", 16)) * 1e6, 3), "target": "<= 1 us"}]
    for proto in ("simple", "ll"):
        t = predict(ar, 4096, c, kernels="v4", sms=sms, proto=proto)
        rows.append({"what": f"ring AllReduce 8 at 4 KiB, {proto}", "predicted_us": round(t.total * 1e6, 1),
                     "launch_us": round(t.launch * 1e6, 1), "path_us": round(t.path * 1e6, 1), "units": t.units,
                     "target": "<= 15 us (one-shot: 8 us)"})
    # fused (--fuse) under LL: the forwarding primitives run as fused LL chains in the data threads
    # (codegen marks them, hccc.compiler.ir.ll_chains; CUDA and HIP builds and the CPU emulation run them)
    from hccc.compiler.pipeline import CompileOptions
    arf = load_program(ALGORITHMS["ring_allreduce_8"], CompileOptions(fuse="on"))
    t = predict(arf, 4096, c, kernels="v4", sms=sms, proto="ll")
    rows.append({"what": "per hop in a fused LL chain (half a flag round trip + a 4 KiB unit's lines, no unit cost; "
                         "CUDA and HIP builds)",
                 "predicted_us": round((c.hop_seconds() + c.bytes_seconds(4096 / kc.LL_DATA_FRACTION, 16)) * 1e6, 3),
                 "target": "<= 1 us"})
    rows.append({"what": "ring AllReduce 8 at 4 KiB, fused, ll (fused LL chains, as every build runs them)", "predicted_us": round(t.total * 1e6, 1),
                 "launch_us": round(t.launch * 1e6, 1), "path_us": round(t.path * 1e6, 1), "units": t.units,
                 "hops": t.hops, "target": "<= 15 us; per hop <= 1 us"})
    # the small-message programs the built-in catalog picks within a node (one dependent hop each),
    # as it builds them (their slots sized to their band: builtin_catalog.build_entry)
    from hccc.builtin_catalog import build_entry, plan
    picks = {n: build_entry(make, n, hi) for c in ("allreduce", "allgather")
             for n, make, _lo, hi in plan(c, 8, ["node"] * 8, None) if hi is not None}
    for name, ir in (("one-shot AllReduce 8", picks["one_shot_allreduce_8"]),
                     ("one-step AllGather 8", picks["direct_allgather_8"])):
        t = predict(ir, 4096, c, kernels="v4", sms=sms, proto="ll")
        rows.append({"what": f"{name} at 4 KiB, ll", "predicted_us": round(t.total * 1e6, 1),
                     "launch_us": round(t.launch * 1e6, 1), "path_us": round(t.path * 1e6, 1), "units": t.units,
                     "hops": t.hops, "target": "<= 8 us"})
    # the crossovers the model gives where hccc's rules hold a size of their own: --proto auto's
    # LL_AUTO_MAX_BYTES and the built-in catalog's SMALL_BYTES (recursive doubling below it)
    rd = load_program(ROOT / "examples" / "recursive_doubling_allgather_8.rccl")
    sizes = [1 << e for e in range(12, 27)]
    ll_up = kernel_time.ll_ahead_up_to([ar, ag], c)      # one rank a GPU, as --proto auto runs
    rd_up = max([n for n in sizes if predict(rd, n, c, kernels="v4", sms=sms).total
                 < predict(ag, n, c, kernels="v4", sms=sms).total], default=0)
    rows.append({"what": "LL faster than Simple (ring AllReduce and AllGather 8, one rank a GPU, full buffer) up to",
                 "predicted_bytes": ll_up,
                 "predicted_us": None, "in_force_bytes": _auto_max(), "target": "--proto auto's switch"})
    rows.append({"what": "recursive doubling AllGather 8 faster than ring up to", "predicted_bytes": rd_up,
                 "predicted_us": None, "in_force_bytes": _small_bytes(), "target": "the built-in catalog's band"})
    for name, ir, n, placement in (("ring AllGather 8 at 256 MiB", ag, 256 << 20, "out"),
                                   ("HM AllReduce 4x8 at 32 MiB, in place", hm, 32 << 20, "in")):
        t = predict(ir, n, c, kernels="v4", sms=sms)
        rows.append({"what": name, "predicted_us": round(t.total * 1e6, 1), "hbm_bound_us": round(t.hbm * 1e6, 1),
                     "of_bound": round(t.hbm / t.total, 3), "path_us": round(t.path * 1e6, 1), "waits": t.waits,
                     "target": ">= 0.9 of its HBM bound" if "AllGather" in name else "<= 2x its HBM bound"})
    return rows


def print_recorded(rows: list[dict]) -> None:
    head = (f"{'run':<7}{'program':<32}{'size':>7} {'proto':<7}{'pl':<4}{'slice':>7}{'measured':>10}{'model':>10}"
            f"{'ratio':>7}{'launch':>8}{'path':>9}{'HBM':>8}{'units':>6}{'hops':>5}{'waits':>6}  verdict")
    print(head)
    print("-" * len(head))
    for r in rows:
        pred = "-" if r["predicted_us"] is None else f"{r['predicted_us']:.0f}"
        print(f"{r['run']:<7}{r['program'][:31]:<32}{format_size(r['bytes']):>7} {r['proto']:<7}{r['placement']:<4}"
              f"{format_size(r['slice']) if r['slice'] else 'auto':>7}{r['measured_us']:>10.0f}{pred:>10}"
              f"{r.get('ratio', float('nan')):>7.2f}{r.get('launch_us', 0):>8.0f}{r.get('path_us', 0):>9.0f}"
              f"{r.get('hbm_us', 0):>8.0f}{r.get('units', 0):>6}{r.get('hops', 0):>5}{r.get('waits', 0):>6}  {r['verdict']}")
    print()
    for r in rows:
        if r["verdict"] in ("unexplained", "not predicted"):
            print(f"{r['run']} {r['program']} {format_size(r['bytes'])} {r['placement']}: {r['hypothesis']}")
    n = sum(r["verdict"] == "explained" for r in rows)
    m = sum(r["verdict"] in ("explained", "unexplained") for r in rows)
    print(f"\n{n} of {m} predicted rows within {EXPLAINED_WITHIN:.0%} (calibration rows: "
          f"{sum(r['verdict'] == 'calibration' for r in rows)}; not predicted: "
          f"{sum(r['verdict'] == 'not predicted' for r in rows)})")


def _small_bytes() -> int:
    import importlib
    return importlib.import_module("hccc.builtin_catalog").SMALL_BYTES


def print_predictions(rows: list[dict]) -> None:
    print("predicted for the next GPU run (hccc's costs: the fifth run's units; today's slices, channels "
          "and threads):")
    for r in rows:
        if r["predicted_us"] is None:
            print(f"  {r['what']} {format_size(r['predicted_bytes']) if r['predicted_bytes'] else 'no size'} "
                  f"(in force: {format_size(r['in_force_bytes'])}, {r['target']})")
            continue
        extra = "".join(f", {k} {r[k]}" for k in ("launch_us", "path_us", "units", "hbm_bound_us", "of_bound", "waits")
                        if k in r)
        print(f"  {r['what']}: {r['predicted_us']} us{extra} (target {r['target']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64M,1G")
    ap.add_argument("--latency-ns", type=float, default=700.0, help="loaded HBM latency")
    ap.add_argument("--hbm-gbs", type=float, default=3000.0,
                    help="achievable HBM bandwidth (an H100 SXM's device copy; 3,350 on its data sheet)")
    ap.add_argument("--sms", type=int, default=H100_SMS, help="multiprocessors of the device (v3 rows)")
    ap.add_argument("--sync-us", type=float, default=None,
                    help="v3: a fixed sync per message, not overlapped (default: the overlapped sync's, "
                         "per threads per block)")
    ap.add_argument("--ll-sync-us", type=float, default=0.2, help="LL model: sync per message")
    ap.add_argument("--launch-us", type=float, default=5.0, help="v3: launch of the one grid")
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--recorded", action="store_true",
                    help="the kernel cost model against every program row of the recorded GPU runs "
                         "(benchmarks/recorded/gpu_runs.json), each from its run's own unit-level figures")
    ap.add_argument("--predict", action="store_true",
                    help="the kernel cost model's predictions for the next GPU run, beside the targets")
    args = ap.parse_args(argv)
    if args.recorded or args.predict:
        sys.path.insert(0, str(ROOT.parent))
        out = {}
        if args.recorded:
            out["rows"] = recorded()
        if args.predict:
            out["predictions"] = next_run_predictions()
        if args.json:
            print(json.dumps(out, indent=1))
            return 0
        if args.recorded:
            print_recorded(out["rows"])
        if args.predict:
            if args.recorded:
                print()
            print_predictions(out["predictions"])
        return 0
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        print(f"kernel_model: bad --sizes {args.sizes!r}", file=sys.stderr)
        return 1
    if args.channels < 1 or args.sms < 1 or not sizes or min(sizes) <= 0 \
            or min(args.sync_us or 0.0, args.ll_sync_us, args.launch_us) < 0:
        print("kernel_model: --channels, --sms and sizes must be positive, times not negative", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT.parent))
    from hccc.compiler.pipeline import CompileOptions, load_program

    rows = []
    v3_rows = []
    v4_rows = []
    kw4 = dict(hbm_gbs=args.hbm_gbs, sms=args.sms, launch_us=args.launch_us)
    kw = dict(latency_ns=args.latency_ns, hbm_gbs=args.hbm_gbs, sms=args.sms, sync_us=args.sync_us,
              launch_us=args.launch_us, ll_sync_us=args.ll_sync_us)
    irs = {}
    for name, path in ALGORITHMS.items():
        ir = irs[name] = load_program(path)
        fused_ir = load_program(path, CompileOptions(fuse=True))
        for n in sizes:
            rows += model(ir, n, latency_ns=args.latency_ns, hbm_gbs=args.hbm_gbs, channels=args.channels,
                          fused_ir=fused_ir)
            v3_rows += [v3(ir, n, **kw), v3(ir, n, ll=True, **kw)]
            v4_rows += [v4(ir, n, **kw4), v4(ir, n, proto="ll", **kw4)]
    # what the first GPU run (benchmarks/gpu_validate.py) is read against
    predictions = {
        "ring_allgather_8 1G": v3(irs["ring_allgather_8"], 1 << 30, **kw),
        "ring_allreduce_8 4K simple": v3(irs["ring_allreduce_8"], 4 << 10, **kw),
        "ring_allreduce_8 4K ll": v3(irs["ring_allreduce_8"], 4 << 10, ll=True, **kw),
        "ll_crossover_bytes": ll_crossover(irs["ring_allreduce_8"], **kw),
        "v4 ring_allgather_8 1G": v4(irs["ring_allgather_8"], 1 << 30, **kw4),
        "v4 ring_allreduce_8 4K simple": v4(irs["ring_allreduce_8"], 4 << 10, **kw4),
        "v4 ring_allreduce_8 4K ll": v4(irs["ring_allreduce_8"], 4 << 10, proto="ll", **kw4),
        "v4_ll_crossover_bytes": v4_ll_crossover(irs["ring_allreduce_8"], **kw4),
    }
    if args.json:
        print(json.dumps({"parameters": {"latency_ns": args.latency_ns, "hbm_gbs": args.hbm_gbs,
                                         "threads": THREADS, "sync_us": SYNC_US, "v3": kw},
                          "v4": v4_constants(), "rows": rows, "v3_rows": v3_rows, "v4_rows": v4_rows,
                          "predictions": predictions}, indent=1))
        return 0
    print(f"all ranks on one GPU: HBM {args.hbm_gbs:.0f} GB/s, load latency {args.latency_ns:.0f} ns, "
          f"{THREADS} threads/block, sync per message v1 {SYNC_US['v1']} us / v2 {SYNC_US['v2']} us (assumed)")
    head = (f"{'algorithm':<18}{'size':>6}  {'design':<26}{'HBM B/B':>8}{'blk/conn':>9}{'blk GB/s':>9}"
            f"{'HBM-bound':>10}{'blk-bound':>10}{'bound':>8}  limit   (busbw GB/s)")
    print(head)
    print("-" * len(head))
    for r in rows:
        tag = " (model)" if r["model_only"] else ""
        print(f"{r['algorithm']:<18}{format_size(r['size']):>6}  {r['design'] + tag:<26}{r['hbm_per_byte']:>8.1f}"
              f"{r['blocks_per_conn']:>9}{r['block_gbs']:>9.1f}{r['hbm_bound_busbw']:>10.1f}"
              f"{r['block_bound_busbw']:>10.1f}{r['busbw']:>8.1f}  {r['limit']}")
    print()
    sync_note = (f"{args.sync_us} us per message (fixed)" if args.sync_us is not None else
                 f"overlapped, per message not hidden {SYNC_WARP_US} + ({SYNC_POLL_US} + {SYNC_RELEASE_US}) "
                 f"/ warps us")
    print(f"v3, all ranks on one GPU of {args.sms} SMs: HBM {args.hbm_gbs:.0f} GB/s, sync {sync_note}, "
          f"launch {args.launch_us} us, LL sync {args.ll_sync_us} us (model)")
    head = (f"{'algorithm':<18}{'size':>6}  {'design':<22}{'threads':>8}{'ch':>4}{'blocks':>7}{'msgs/blk':>9}"
            f"{'sync us':>8}{'fill us':>9}{'time us':>10}{'busbw':>8}{'of HBM':>8}  limit")
    print(head)
    print("-" * len(head))
    for r in v3_rows:
        print(f"{r['algorithm']:<18}{format_size(r['size']):>6}  {r['design']:<22}{r['threads']:>8}{r['channels']:>4}"
              f"{r['blocks']:>7}{r['messages_per_block']:>9}{r['sync_us']:>8.2f}{r['fill_us']:>9.1f}{r['time_us']:>10.1f}"
              f"{r['busbw']:>8.1f}{r['of_hbm_bound']:>8.2f}  {r['limit']}")
    print()
    ag, s4, l4 = (predictions[k] for k in ("ring_allgather_8 1G", "ring_allreduce_8 4K simple", "ring_allreduce_8 4K ll"))
    print("predicted for the first GPU run (one H100, one-grid launch):")
    print(f"  ring AllGather 8 at 1 GiB: {ag['time_us']:.0f} us, busbw {ag['busbw']:.0f} GB/s, "
          f"{ag['of_hbm_bound']:.0%} of the bound its HBM traffic allows (target >= 70 %)")
    print(f"  ring AllReduce 8 at 4 KiB: Simple {s4['time_us']:.1f} us, LL (model) {l4['time_us']:.1f} us "
          f"(target within 2x of 15 us)")
    cross = predictions["ll_crossover_bytes"]
    print(f"  LL beats Simple up to {format_size(cross) if cross else 'no size'} (ring AllReduce 8, full buffer)")
    print()
    const = v4_constants()
    print(f"v4 (the slice policy's terms; its costs the kernel cost model's, measured on the fifth GPU run), all ranks on one GPU "
          f"of {args.sms} SMs: a unit {const['unit_us']:.2g} us (COPY {const['copy_unit_us']:.2g}, LL "
          f"{const['ll_unit_us']:.2g}) beyond its bytes, sync warp off the data path, "
          f"{const['block_gbs']:.0f} GB/s a block of 16 warps (LL data {const['ll_data_fraction']:.0%} of it: "
          f"16-byte lines of 8 data bytes), HBM {args.hbm_gbs:.0f} GB/s, launch {args.launch_us} us")
    head = (f"{'algorithm':<18}{'size':>6}  {'design':<16}{'threads':>8}{'ch':>4}{'slice':>8}{'mb':>5}"
            f"{'blk GB/s':>9}{'fill us':>9}{'block us':>10}{'HBM us':>9}{'time us':>10}{'busbw':>8}  limit")
    print(head)
    print("-" * len(head))
    for r in v4_rows:
        print(f"{r['algorithm']:<18}{format_size(r['size']):>6}  {r['design']:<16}{r['threads']:>8}{r['channels']:>4}"
              f"{format_size(r['slice']):>8}{r['micro_batches']:>5}{r['block_gbs']:>9.1f}{r['fill_us']:>9.1f}"
              f"{r['block_us']:>10.1f}{r['hbm_us']:>9.1f}{r['time_us']:>10.1f}{r['busbw']:>8.1f}  {r['limit']}"
              + (" (units)" if r["limit"] == "blocks" and r["sync_bound"] else ""))
    print()
    ag, s4, l4 = (predictions[k] for k in ("v4 ring_allgather_8 1G", "v4 ring_allreduce_8 4K simple",
                                           "v4 ring_allreduce_8 4K ll"))
    print("v4, predicted (model):")
    print(f"  ring AllGather 8 at 1 GiB: {ag['time_us']:.0f} us, busbw {ag['busbw']:.0f} GB/s, "
          f"{ag['of_hbm_bound']:.0%} of the bound its HBM traffic allows")
    print(f"  ring AllReduce 8 at 4 KiB: Simple {s4['time_us']:.1f} us, LL {l4['time_us']:.1f} us")
    cross = predictions["v4_ll_crossover_bytes"]
    print(f"  LL beats Simple up to {format_size(cross) if cross else 'no size'} (ring AllReduce 8, full buffer; "
          f"--proto auto switches at {format_size(_auto_max())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
