"""How much of an algorithm's own performance its MSCCL++ execution plan keeps, and how big the plan is.

    python benchmarks/mscclpp_plan.py [--size 1G] [--pairs ring_allreduce_8:a100_topo1,...] [--json]

For every (example algorithm, example cluster) pair the script simulates, under the executors'
algorithm-level execution (every thread block runs its list once per slice; ``hccc.runtime.simulator``,
alpha-beta with shared NIC / PCIe / switch groups):

* ``program``: the algorithm the way that execution runs it best (its steps in order, one thread
  block per connection end: ``hccc.compiler.passes.build.build_algorithm_level``), what
  ``hccc plan`` exports;
* ``plan``: that program exported as an MSCCL++ plan (connections between the cluster's nodes as
  port channels), read back with the importer (which proves it) and simulated as the file says.

``plan/prog`` is the ratio of busbw (1.00: the export loses nothing); ``KiB`` the plan's size,
``TBs`` its thread blocks, ``ops`` its operations (``nops`` of them ``__syncthreads``), ``max ops``
the longest thread block (the executor holds 64), ``export ms`` the export's wall time.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hccc.args import parse_size
from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_summary, plan_text
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.compiler.passes.build import build_algorithm_level
from hccc.compiler.passes.verify import verify
from hccc.compiler.pipeline import load_algorithm, load_cluster
from hccc.runtime.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DEFAULT_PAIRS = ("ring_allreduce_8:a100_topo1,ring_allgather_8:a100_topo1,ring_reducescatter_8:a100_topo1,"
                 "hm_allreduce_2x4:a100_topo1,hm_allgather_2x4:a100_topo1,hm_allreduce_2x8:a100_topo2,"
                 "hm_allgather_2x8:a100_topo2,hm_allreduce_4x8:a100_topo4,hierarchical_alltoall_2x8:a100_topo2")


def busbw(ir, topo, size: int) -> float:
    return simulate(ir, topo, size, execution="algorithm", slice_bytes="auto").busbw_GBps


def run(pairs: list[tuple[str, str]], size: int) -> list[dict]:
    rows = []
    for name, cluster in pairs:
        alg = load_algorithm(EXAMPLES / f"{name}.rccl")
        verify(alg)
        topo = load_cluster(EXAMPLES / "clusters" / f"{cluster}.topo")
        prog = build_algorithm_level(alg)
        pbw = busbw(prog, topo, size)
        t0 = time.perf_counter()
        plan = export_plan(prog, nodes=node_map(prog.nranks, topology=topo))
        text = plan_text(plan)
        ms = (time.perf_counter() - t0) * 1e3
        back = import_plan_text(text, f"{name}.mscclpp.json")
        bw = busbw(back, topo, size)
        s = plan_summary(plan)
        rows.append({"algorithm": name, "cluster": cluster, "program_GBps": pbw, "plan_GBps": bw, "ratio": bw / pbw,
                     "bytes": len(text), "tbs": s["tbs"], "ops": s["ops"], "nops": s["nops"],
                     "max_ops": max(len(tb["ops"]) for g in plan["gpus"] for tb in g["threadblocks"]),
                     "port_channels": sum(len(c["connected_to"]) for g in plan["gpus"] for c in g["channels"]
                                          if c["channel_type"] == "port"),
                     "export_ms": ms})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="buffer size (default 1G)")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="ALGO:CLUSTER,... (example names)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
    rows = run(pairs, args.size)
    if args.json:
        print(json.dumps({"size": args.size, "rows": rows}, indent=1))
        return
    t = Table(title=f"MSCCL++ plan vs the program, algorithm-level execution, simulated busbw at {args.size >> 20} MiB")
    for col in ("algorithm", "cluster", "program GB/s", "plan GB/s", "plan/prog", "KiB", "TBs", "ops", "nops",
                "max ops", "port ch", "export ms"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["algorithm"], r["cluster"], f"{r['program_GBps']:.2f}", f"{r['plan_GBps']:.2f}",
                  f"{r['ratio']:.3f}", f"{r['bytes'] / 1024:.0f}", str(r["tbs"]), str(r["ops"]), str(r["nops"]),
                  str(r["max_ops"]), str(r["port_channels"]), f"{r['export_ms']:.0f}")
    Console(width=200).print(t)


if __name__ == "__main__":
    main()
