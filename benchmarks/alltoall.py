"""Simulated AllToAll on the example clusters: direct vs hierarchical vs C2C vs synthesised, with the
fraction of the cut bound each reaches.

    python benchmarks/alltoall.py [--sizes 1M,64M,1G] [--clusters a100_topo2,...] [--synth-time S]
                                  [--json]

Algorithms (each verified, lowered as ``hccc`` does -- HPDS, state-based TBs -- and simulated by
``hccc.runtime.simulator``, alpha-beta with shared NIC / PCIe / switch groups):

* ``direct``: all pairs, one step per peer offset (``generators.direct_alltoall``);
* ``hierarchical``: two-step RCCL-style ``nNodes x G`` (``generators.hierarchical_alltoall``; only on
  clusters whose nodes have the same GPU count);
* ``c2c``: the cluster-to-cluster breakdown (``hccc gen c2c --collective alltoall``: border ranks one
  per NIC, gather / exchange / scatter);
* ``synth``: ``hccc synth --collective alltoall`` (routing + list scheduling), synthesis time apart.

``busbw`` uses nccl-tests' AllToAll factor (n-1)/n of algbw = size / time, size = one rank's buffer.
``of bound`` is the cut bound's time (``hccc.compiler.synth.bounds.alltoall_cut_bound_seconds``:
max over cuts of the bytes that must cross / the cut's capacity, bandwidth only) divided by the
simulated time: 1.0 would be a schedule as fast as the bound allows, latencies aside.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hccc.args import parse_size
from hccc.compiler.cluster.c2c_alltoall import plan_c2c_alltoall
from hccc.compiler.cluster.hierarchy import hierarchy
from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.frontend.generators import direct_alltoall, hierarchical_alltoall
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.synth import network_from_topology, synthesize, to_algorithm
from hccc.compiler.synth.bounds import alltoall_cut_bound_seconds
from hccc.runtime.simulator import simulate_sizes

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"
DEFAULT_CLUSTERS = ("a100_topo2", "h20_4x3", "v100_4x2_8", "mixed_v100_w7800")


def algorithms(topo, synth_time: float | None = 20.0):
    """(label, Algorithm, synthesis seconds or None) for one cluster."""
    n = topo.nranks
    out = [("direct", direct_alltoall(n, name="direct"), None)]
    sizes = {nd.ngpus for nd in topo.nodes}
    if len(sizes) == 1 and len(topo.nodes) > 1:
        out.append(("hierarchical", hierarchical_alltoall(len(topo.nodes), sizes.pop(), name="hierarchical"),
                    None))
    hier = hierarchy(topo, border="one-per-nic")
    if hier.nclusters > 1:
        out.append(("c2c", plan_c2c_alltoall(topo, hier=hier, name="c2c").algorithm(), None))
    if synth_time is not None:
        res = synthesize(topo, "alltoall", time_limit=synth_time)
        out.append(("synth" + (" (time limit)" if res.timed_out else ""), to_algorithm(res, topo), res.seconds))
    return out


def run(sizes: list[int], clusters, synth_time: float | None = 20.0) -> list[dict]:
    rows = []
    for stem in clusters:
        topo = load_topology(CLUSTERS / f"{stem}.topo")
        net = network_from_topology(topo)
        for label, alg, synth_s in algorithms(topo, synth_time):
            verify(alg)
            t0 = time.perf_counter()
            ir = build_program(alg)
            res = simulate_sizes(ir, topo, sizes)
            bound = {s: alltoall_cut_bound_seconds(net, s)[0] for s in sizes}
            rows.append({
                "cluster": stem, "nranks": topo.nranks, "algorithm": label, "transfers": alg.ntransfers,
                "steps": alg.nsteps,
                "busbw_GBps": {str(s): r.busbw_GBps for s, r in zip(sizes, res)},
                "of_cut_bound": {str(s): bound[s] / r.time_s if r.time_s > 0 else 0.0
                                 for s, r in zip(sizes, res)},
                "seconds": time.perf_counter() - t0, "synthesis_seconds": synth_s,
            })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,64M,1G", help="per-rank buffer sizes, e.g. 1M,64M,1G")
    ap.add_argument("--clusters", default=",".join(DEFAULT_CLUSTERS),
                    help="example clusters (stems of examples/clusters/*.topo)")
    ap.add_argument("--synth-time", type=float, default=20.0, metavar="S", help="hccc synth time limit")
    ap.add_argument("--no-synth", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = run(sizes, args.clusters.split(","), None if args.no_synth else args.synth_time)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    names = args.sizes.split(",")
    tab = Table(title="simulated AllToAll: busbw (GB/s) and fraction of the cut bound, side by side")
    for col in ("cluster", "algorithm", "transfers", "steps",
                *[c for s in names for c in (f"busbw {s}", f"of bound {s}")], "synth s"):
        tab.add_column(col, justify="left" if col in ("cluster", "algorithm") else "right")
    for r in rows:
        cells = []
        for s in sizes:
            cells += [f"{r['busbw_GBps'][str(s)]:.2f}", f"{r['of_cut_bound'][str(s)]:.2f}"]
        tab.add_row(f"{r['cluster']} ({r['nranks']})", r["algorithm"], str(r["transfers"]), str(r["steps"]),
                    *cells, "" if r["synthesis_seconds"] is None else f"{r['synthesis_seconds']:.1f}")
    Console(width=220).print(tab)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
