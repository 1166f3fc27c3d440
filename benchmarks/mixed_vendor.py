"""Simulated bus bandwidth of HetCCL's C2C algorithms against a flat ring, with cross-cluster bytes.

    python benchmarks/mixed_vendor.py [--sizes 1M,16M,256M] [--execution task|algorithm]
                                      [--synth-time S | --no-synth] [--json]

Setups (example clusters in ``examples/clusters``):

* ``mixed_v100_w7800``: 2 nodes x 4 NVIDIA V100-PCIe + 2 nodes x 4 AMD W7800, one 200 Gbps NIC per node
  (the HetCCL NVIDIA+AMD testbed): two vendor clusters of 8 GPUs;
* ``a100_topo4 2+2``: 4 nodes x 8 A100 split into two 2-node clusters (HetCCL section 6.1.3's "2+2 C2C"
  experiment on four 8-GPU nodes);
* ``a100_topo2 1+1``: 2 nodes x 8 A100, one node per cluster (HetCCL's 2-node setups).

For AllGather and AllReduce each row is one algorithm: the flat ring over all ranks in rank order
(``hccc.compiler.frontend.generators``), a C2C variant (``hccc.compiler.cluster.c2c``: border ranks = every GPU behind a
NIC, or one per NIC; intra-cluster ring or mesh; K pieces), or the schedule ``hccc synth`` finds for
the whole cluster (``hccc.compiler.synth``, HeteCCL's chunking + CEGIS, ``--synth-time`` seconds per
collective; its synthesis time is reported apart). Every algorithm is verified, lowered
exactly as ``hccc`` does (HPDS, state-based TBs) and simulated by ``hccc.runtime.simulator`` (alpha-beta
model with shared NIC / PCIe groups). ``xMB`` is the data that crosses cluster boundaries for the
largest size (both algorithms counted with the same clusters); busbw uses nccl-tests' factors.
At the largest size, ``prog bound`` is the simulator's bound for that very program (its bytes over
each link's and shared group's capacity, plus latency: ``hccc.runtime.sim_model.lower_bound``),
``cut bound`` the collective's first-principles cut bound that no schedule can beat
(``hccc.compiler.synth.bounds.collective_cut_bound_seconds``, docs/bounds.md; AllReduce: the whole
buffer over the narrowest cut), both as busbw, and ``of cut bound`` the row's busbw over it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hccc.args import parse_size
from hccc.compiler.cluster.c2c import cross_cluster_chunks, plan_c2c
from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.frontend.generators import ring_allgather, ring_allreduce
from hccc.compiler.cluster.hierarchy import hierarchy
from hccc.compiler.synth import network_from_topology, synthesize, to_algorithm
from hccc.compiler.synth.bounds import collective_cut_bound_seconds
from hccc.runtime.busbw import busbw_factor
from hccc.compiler.passes.verify import verify
from hccc.runtime.simulator import build_for_execution, simulate

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"
SETUPS = (("mixed_v100_w7800", None), ("a100_topo4", 2), ("a100_topo2", 1))
VARIANTS = (  # (label, border rule, intra-cluster algorithm, pieces)
    ("c2c", "nic", "ring", 1),
    ("c2c K=2", "nic", "ring", 2),
    ("c2c mesh", "nic", "mesh", 1),
    ("c2c 1/NIC", "one-per-nic", "ring", 1),
    ("c2c 1/NIC K=2", "one-per-nic", "ring", 2),
)


def algorithms(topo, coll: str, nodes_per_cluster, synth_time: float | None = 10.0):
    """(label, Algorithm, Hierarchy used to count cross-cluster bytes, synthesis seconds or None)
    for one setup; ``synth_time`` None leaves the synthesised schedule out."""
    base = hierarchy(topo, nodes_per_cluster=nodes_per_cluster)
    ring = {"allgather": ring_allgather, "allreduce": ring_allreduce}[coll](topo.nranks, name="ring")
    out = [("flat ring", ring, base, None)]
    for label, border, intra, k in VARIANTS:
        hier = hierarchy(topo, nodes_per_cluster=nodes_per_cluster, border=border)
        plan = plan_c2c(topo, coll, hier=hier, intra=intra, pipeline=k)
        out.append((label + (f" (K={plan.pieces})" if plan.pieces != k else ""), plan.algorithm(), hier, None))
    if synth_time is not None:
        res = synthesize(topo, coll, time_limit=synth_time)
        label = "synth" + (" (time limit)" if res.timed_out else "")
        out.append((label, to_algorithm(res, topo), base, res.seconds))
    return out


def run(sizes: list[int], execution: str, synth_time: float | None = 10.0) -> list[dict]:
    rows = []
    for stem, npc in SETUPS:
        topo = load_topology(CLUSTERS / f"{stem}.topo")
        name = stem + (f" {'+'.join(['' + str(npc)] * (len(topo.nodes) // npc))}" if npc else "")
        net = network_from_topology(topo)
        for coll in ("allgather", "allreduce"):
            # the collective's first-principles cut bound (docs/bounds.md), as a busbw per size
            cut = {str(s): s / collective_cut_bound_seconds(net, coll, topo.nranks, 1, 0, s) / 1e9
                   * busbw_factor(coll, topo.nranks) for s in sizes}
            for label, alg, hier, synth_s in algorithms(topo, coll, npc, synth_time):
                verify(alg)
                t0 = time.perf_counter()
                ir = build_for_execution(alg, execution)
                res = [simulate(ir, topo, s, execution=execution, slice_bytes="auto") for s in sizes]
                send, _ = cross_cluster_chunks(alg, hier)
                rows.append({
                    "setup": name, "clusters": hier.nclusters, "collective": coll, "algorithm": label,
                    "transfers": alg.ntransfers, "steps": alg.nsteps,
                    "cross_cluster_bytes": int(send.sum()) * (max(sizes) // topo.nranks),
                    "busbw_GBps": {str(s): r.busbw_GBps for s, r in zip(sizes, res)},
                    "lower_bound_busbw_GBps": {str(s): r.busbw_GBps * r.time_s / r.lower_bound_s
                                               for s, r in zip(sizes, res)},
                    "cut_bound_busbw_GBps": cut,
                    "of_cut_bound": {str(s): r.busbw_GBps / cut[str(s)] for s, r in zip(sizes, res)},
                    "seconds": time.perf_counter() - t0,
                    "synthesis_seconds": synth_s,
                })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,16M,256M",
                    help="comma-separated buffer sizes (nccl-tests' size), e.g. 1M,64M,1G")
    ap.add_argument("--execution", choices=("task", "algorithm"), default="task")
    ap.add_argument("--synth-time", type=float, default=10.0, metavar="S",
                    help="time limit of each hccc synth run (default 10 s)")
    ap.add_argument("--no-synth", action="store_true", help="leave the synthesised schedules out")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = run(sizes, args.execution, None if args.no_synth else args.synth_time)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"simulated busbw (GB/s), {args.execution}-level execution; xMB = MB crossing "
                      f"clusters at {args.sizes.split(',')[-1]}")
    for col in ("setup", "coll", "algorithm", "transfers", "steps", "xMB",
                *[f"busbw {s}" for s in args.sizes.split(",")], "prog bound", "cut bound", "of cut bound",
                "synth s"):
        tab.add_column(col, justify="left" if col in ("setup", "coll", "algorithm") else "right")
    for r in rows:
        last = str(max(sizes))
        tab.add_row(r["setup"], r["collective"], r["algorithm"], str(r["transfers"]), str(r["steps"]),
                    f"{r['cross_cluster_bytes'] / 2**20:.0f}",
                    *[f"{r['busbw_GBps'][str(s)]:.2f}" for s in sizes],
                    f"{r['lower_bound_busbw_GBps'][last]:.2f}", f"{r['cut_bound_busbw_GBps'][last]:.2f}",
                    f"{r['of_cut_bound'][last]:.1%}",
                    "" if r["synthesis_seconds"] is None else f"{r['synthesis_seconds']:.1f}")
    Console(width=200).print(tab)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
