"""What bandwidth each kernel design choice allows, from the programs' own memory traffic.

    python benchmarks/kernel_model.py [--sizes 64M,1G] [--latency-ns 700] [--hbm-gbs 3350]
                                      [--link-gbs 450] [--channels 4] [--json]

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
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hccc.args import parse_size
from hccc.compiler.frontend.sizes import format_size

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = {
    "ring_allgather_8": ROOT / "examples" / "ring_allgather_8.rccl",
    "ring_allreduce_8": ROOT / "examples" / "ring_allreduce_8.rccl",
    "hm_allreduce_4x8": ROOT / "examples" / "hm_allreduce_4x8.rccl",
}
THREADS = 512            # threads per block of the CUDA kernels (16 warps)
LOADS_V2 = 8             # HCCC_LOADS
SYNC_US = {"v1": 2.0, "v2": 0.7}   # per message, assumed (see the module docstring)






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
    import numpy as np
    from hccc.compiler.passes.slicing import (
        auto_slice_bytes,
        micro_batches,
        slot_share_bytes,
    )
    from hccc.runtime.busbw import busbw_factor
    from hccc.runtime.kernel_traffic import traffic

    es = 4
    factor = busbw_factor(ir.collective, ir.nranks)

    def messages(prog):
        slice_b = auto_slice_bytes(nbytes, prog.nchunks, slot_share_bytes(prog.chunk_bytes, prog.max_step_chunks), es)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64M,1G")
    ap.add_argument("--latency-ns", type=float, default=700.0, help="loaded HBM latency")
    ap.add_argument("--hbm-gbs", type=float, default=3350.0, help="HBM bandwidth (H100 SXM)")
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        print(f"kernel_model: bad --sizes {args.sizes!r}", file=sys.stderr)
        return 1
    if args.channels < 1 or not sizes or min(sizes) <= 0:
        print("kernel_model: --channels and sizes must be positive", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT.parent))
    from hccc.compiler.pipeline import CompileOptions, load_program

    rows = []
    for name, path in ALGORITHMS.items():
        ir = load_program(path)
        fused_ir = load_program(path, CompileOptions(fuse=True))
        for n in sizes:
            rows += model(ir, n, latency_ns=args.latency_ns, hbm_gbs=args.hbm_gbs, channels=args.channels,
                          fused_ir=fused_ir)
    if args.json:
        print(json.dumps({"parameters": {"latency_ns": args.latency_ns, "hbm_gbs": args.hbm_gbs,
                                         "threads": THREADS, "sync_us": SYNC_US}, "rows": rows}, indent=1))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
