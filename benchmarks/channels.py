"""Simulated busbw against the number of channels (blocks per thread block), side by side.

    python benchmarks/channels.py [--sizes 64M,1G] [--channels 1,2,4,8] [--block-gbs 20]
                                  [--pairs ring_allreduce_8:h20_4_8,...] [--json]

Each (example algorithm, example cluster) pair is lowered as ``hccc`` does (HPDS, state-based TBs)
and simulated by :mod:`hccc.runtime.simulator` with every channel count: each block moves at most
``--block-gbs`` GB/s (the per-block limit), so a connection runs at min(its share of link and
groups, K x block rate). ``xK1`` is busbw over the one-channel busbw at the same size; ``link``
is the busbw with no per-block limit at all (what the link model alone allows): once K x block
rate covers a connection's link share, more channels change nothing.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hccc.args import format_size, parse_size
from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.frontend.load import load_rccl
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS, with_channels
from hccc.runtime.simulator import simulate_sizes

ROOT = Path(__file__).resolve().parent.parent
PAIRS = ["ring_allreduce_8:a100_topo1", "ring_allgather_8:a100_topo1", "hm_allreduce_2x4:a100_topo1",
         "hm_allreduce_2x8:a100_topo2", "hm_allgather_2x8:a100_topo2"]


def run(pairs, sizes, channels, block_gbs) -> list[dict]:
    rows = []
    for pair in pairs:
        algo, cluster = pair.split(":")
        topo = load_topology(ROOT / "examples" / "clusters" / f"{cluster}.topo")
        ir = build_program(load_rccl(ROOT / "examples" / f"{algo}.rccl"))
        if topo.nranks != ir.nranks:
            raise SystemExit(f"channels: {algo} has {ir.nranks} ranks, {cluster} {topo.nranks} GPUs")
        link = [r.busbw_GBps for r in simulate_sizes(ir, topo, sizes, block_gbps=None)]
        base = None
        for k in channels:
            bw = [r.busbw_GBps for r in simulate_sizes(with_channels(ir, k), topo, sizes, block_gbps=block_gbs)]
            base = base or bw
            rows.append({"algorithm": algo, "cluster": cluster, "channels": k,
                         "busbw": {str(s): b for s, b in zip(sizes, bw)},
                         "vs_one_channel": {str(s): b / b1 for s, b, b1 in zip(sizes, bw, base)},
                         "link_model_busbw": {str(s): b for s, b in zip(sizes, link)}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64M,1G")
    ap.add_argument("--channels", default="1,2,4,8")
    ap.add_argument("--block-gbs", type=float, default=DEFAULT_BLOCK_GBPS)
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    channels = [int(k) for k in args.channels.split(",")]
    rows = run(args.pairs.split(","), sizes, channels, args.block_gbs)
    if args.json:
        print(json.dumps({"block_gbs": args.block_gbs, "rows": rows}, indent=1))
        return 0
    t = Table(title=f"simulated busbw (GB/s) against channels, {args.block_gbs:g} GB/s per block")
    for col in ("algorithm", "cluster", "K"):
        t.add_column(col, justify="right")
    for s in sizes:
        t.add_column(f"{format_size(s)}B", justify="right")
        t.add_column("xK1", justify="right")
        t.add_column("link", justify="right")
    for r in rows:
        cells = [r["algorithm"], r["cluster"], str(r["channels"])]
        for s in sizes:
            cells += [f"{r['busbw'][str(s)]:.2f}", f"{r['vs_one_channel'][str(s)]:.2f}",
                      f"{r['link_model_busbw'][str(s)]:.2f}"]
        t.add_row(*cells)
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
