"""Receive-and-forward fusion, per connection pair: simulated busbw and HBM traffic, fused vs not.

    python benchmarks/fusion.py [--sizes 1M,64M,1G] [--only NAME] [--json]

For every example program (``examples/*.rccl``) on every example cluster with its rank count, and
for ring AllGather / AllReduce on every example cluster, side by side:

* ``fused``: forwards fused (``RECV_COPY_SEND`` / ``RECV_REDUCE_COPY_SEND``);
* ``TBs``: thread blocks, unfused / fused (fused traffic has channels and TBs of its own);
* busbw (GB/s) at each size, unfused / fused, from the task-level simulator
  (:mod:`hccc.runtime.simulator`, HPDS, state-based TBs, the faster allocation on the cluster,
  slice per size as ``hccc sim``);
* ``HBM B/B``: HBM bytes the kernels read and write per byte of the collective's buffer, summed
  over the ranks, unfused / fused (:mod:`hccc.runtime.kernel_traffic`; the simulator does not
  charge memory passes, so this is what fusion saves);
* ``auto``: what ``--fuse auto`` keeps on that cluster (fused when its simulated time is at most
  the unfused one's at every size of :data:`hccc.runtime.simulator.ALLOCATION_SIZES`).

Everything is deterministic; no GPU is needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hccc.args import parse_size
from hccc.util.sizes import format_size

ROOT = Path(__file__).resolve().parent.parent






def cases():
    """(program name, Algorithm, cluster name, Topology), deterministic order."""
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.pipeline import load_algorithm, load_cluster

    clusters = []
    for t in sorted((ROOT / "examples" / "clusters").glob("*.topo")):
        topo = load_cluster(t)
        clusters.append((t.stem, topo))
    programs = [(a.stem, load_algorithm(a)) for a in sorted((ROOT / "examples").glob("*.rccl"))]
    for cname, topo in clusters:
        for pname, alg in programs:
            if alg.header.nranks == topo.nranks:
                yield pname, alg, cname, topo
        n = topo.nranks
        if not any(alg.header.nranks == n and pname.startswith("ring_allgather") for pname, alg in programs):
            yield f"ring_allgather_{n}", gen.ring_allgather(n), cname, topo
        if not any(alg.header.nranks == n and pname.startswith("ring_allreduce") for pname, alg in programs):
            yield f"ring_allreduce_{n}", gen.ring_allreduce(n), cname, topo


def measure(alg, topo, sizes) -> dict:
    from hccc.runtime.kernel_traffic import traffic
    from hccc.runtime.simulator import (
        build_for_execution,
        faster_fusion,
        simulate_sizes,
    )

    plain = build_for_execution(alg, "task", topology=topo)
    fused = build_for_execution(alg, "task", topology=topo, fuse=True)
    bp = [r.busbw_GBps for r in simulate_sizes(plain, topo, sizes)]
    bf = [r.busbw_GBps for r in simulate_sizes(fused, topo, sizes)]
    big = max(sizes)
    auto = faster_fusion(alg, topo, plain, fused)
    return {
        "fused": int(fused.allocation.fused or 0),
        "tbs": [int(plain.ntbs.sum()), int(fused.ntbs.sum())],
        "busbw": [[round(a, 2), round(b, 2)] for a, b in zip(bp, bf)],
        "hbm_per_byte": [round(traffic(plain, big).hbm / big, 3), round(traffic(fused, big).hbm / big, 3)],
        "auto": "fused" if auto.stats.get("fusion_kept") else "unfused",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,64M,1G")
    ap.add_argument("--only", default=None, help="only programs whose name contains this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        print(f"fusion: bad --sizes {args.sizes!r}", file=sys.stderr)
        return 1
    if not sizes or min(sizes) <= 0:
        print("fusion: sizes must be positive", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT.parent))
    rows = []
    for pname, alg, cname, topo in cases():
        if args.only and args.only not in pname:
            continue
        row = {"program": pname, "cluster": cname, "sizes": sizes}
        row.update(measure(alg, topo, sizes))
        rows.append(row)
        if not args.json:
            if len(rows) == 1:
                head = (f"{'program':<32}{'cluster':<18}{'fused':>6}{'TBs':>11}"
                        + "".join(f"{'busbw ' + format_size(s):>16}" for s in sizes)
                        + f"{'HBM B/B':>13}  auto")
                print(head)
                print("-" * len(head))
            bw = "".join(f"{a:>8.1f}/{b:<7.1f}" for a, b in row["busbw"])
            print(f"{pname:<32}{cname:<18}{row['fused']:>6}{row['tbs'][0]:>6}/{row['tbs'][1]:<4}{bw}"
                  f"{row['hbm_per_byte'][0]:>7.1f}/{row['hbm_per_byte'][1]:<5.1f}  {row['auto']}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
