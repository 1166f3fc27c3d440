"""How much of an algorithm's own performance its MSCCL XML export keeps, beside msccl-tools' XML.

    python benchmarks/xml_export.py [--size 1G] [--pairs ring_allreduce_8:a100_topo1,...]
                                    [--ref hm_allreduce_2x8=FILE.xml ...] [--instances 1,2] [--json]

For every (example algorithm, example cluster) pair the script simulates, side by side under the
MSCCL runtimes' algorithm-level execution (every thread block runs its whole step list once per
slice; ``hccc.runtime.simulator``, alpha-beta with shared NIC / PCIe / switch groups):

* ``program``: the algorithm itself (``.rccl``), the way that execution runs it best (its steps in
  order, one thread block per connection end: ``hccc.compiler.passes.build.build_algorithm_level``);
* ``xml``: ``hccc xml ALGO`` (``export_algorithm``), read back with the importer (which proves it)
  and simulated as the file says; ``fused``: the same with ``--xml-fuse`` (``rcs``/``rrcs``/``rrs``);
  one row per ``--instances`` value;
* ``msccl-tools``: an XML file the user points at with ``--ref NAME=FILE`` (e.g. made by
  msccl-tools' ``examples/mscclang/hierarchical_allreduce.py 8 2 1``), imported and simulated on the
  same cluster, for the row of the algorithm ``NAME``.

``xml/prog`` is the ratio of busbw (1.00 = the export loses nothing); ``steps`` counts ``<step>``
elements (nops included); ``export ms`` is the export's wall time. A second table times the
up-front limit check (:func:`hccc.compiler.interop.msccl_limits.check_algorithm_fits`) on HM
AllReduce at growing scale: the programs past the runtimes' limits are refused there, from the
transfer table, before anything is built.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hccc.args import parse_size
from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend.generators import hm_allreduce
from hccc.compiler.interop.msccl_export import export_algorithm
from hccc.compiler.interop.msccl_format import XmlLimits
from hccc.compiler.interop.msccl_limits import check_algorithm_fits
from hccc.compiler.interop.msccl_xml import import_xml, import_xml_text
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


def run(pairs: list[tuple[str, str]], size: int, instances: list[int], refs: dict[str, Path]) -> list[dict]:
    rows = []
    for name, cluster in pairs:
        alg = load_algorithm(EXAMPLES / f"{name}.rccl")
        verify(alg)
        topo = load_cluster(EXAMPLES / "clusters" / f"{cluster}.topo")
        prog = busbw(build_algorithm_level(alg), topo, size)
        row = {"algorithm": name, "cluster": cluster, "program_GBps": prog, "exports": []}
        for k in instances:
            for fuse in (False, True):
                t0 = time.perf_counter()
                try:
                    _, text = export_algorithm(alg, fuse=fuse, instances=k)
                except CompileError as exc:
                    row["exports"].append({"instances": k, "fused": fuse, "error": exc.diagnostics[0].message})
                    continue
                ms = (time.perf_counter() - t0) * 1e3
                bw = busbw(import_xml_text(text), topo, size)
                row["exports"].append({"instances": k, "fused": fuse, "GBps": bw, "ratio": bw / prog,
                                       "steps": text.count("<step "), "tbs": text.count("<tb "), "export_ms": ms})
        if name in refs:
            text = refs[name].read_text()
            bw = busbw(import_xml(refs[name]), topo, size)
            row["msccl_tools"] = {"file": refs[name].name, "GBps": bw, "ratio": bw / prog,
                                  "steps": text.count("<step "), "tbs": text.count("<tb ")}
        rows.append(row)
    return rows


def check_times(shapes: list[tuple[int, int]]) -> list[dict]:
    out = []
    for nn, g in shapes:
        alg = hm_allreduce(nn, g)
        for lim_name, lim in (("default", XmlLimits()), ("legacy 256 steps", XmlLimits(max_steps=256))):
            t0 = time.perf_counter()
            try:
                check_algorithm_fits(alg, lim)
                verdict = "fits"
            except CompileError as exc:
                verdict = exc.diagnostics[0].message.split(": ", 1)[1][:90]
            out.append({"gpus": nn * g, "transfers": int(alg.ntransfers), "limits": lim_name,
                        "check_s": time.perf_counter() - t0, "verdict": verdict})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="buffer size (default 1G)")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="ALGO:CLUSTER,... (example names)")
    ap.add_argument("--instances", default="1", help="instance counts to export with (e.g. 1,2)")
    ap.add_argument("--ref", action="append", default=[], metavar="NAME=FILE.xml",
                    help="an MSCCL XML file (e.g. msccl-tools') to show beside algorithm NAME")
    ap.add_argument("--scale", default="2x8,16x8,128x8", help="HM AllReduce shapes for the limit-check table")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
    refs = {}
    for r in args.ref:
        name, _, f = r.partition("=")
        refs[name] = Path(f)
    rows = run(pairs, args.size, [int(k) for k in args.instances.split(",")], refs)
    checks = check_times([tuple(int(v) for v in s.split("x")) for s in args.scale.split(",") if s])
    if args.json:
        print(json.dumps({"size": args.size, "rows": rows, "limit_checks": checks}, indent=1))
        return
    console = Console(width=200)
    t = Table(title=f"MSCCL XML vs the program, algorithm-level execution, simulated busbw at {args.size >> 20} MiB")
    for col in ("algorithm", "cluster", "program GB/s", "K", "xml GB/s", "xml/prog", "steps", "export ms",
                "fused GB/s", "fused/prog", "fused steps", "msccl-tools GB/s", "tools/prog", "tools steps"):
        t.add_column(col, justify="right")
    for r in rows:
        by = {(e["instances"], e["fused"]): e for e in r["exports"]}
        for k in sorted({e["instances"] for e in r["exports"]}):
            p, f = by[(k, False)], by[(k, True)]
            mt = r.get("msccl_tools") if k == min(by)[0] else None

            def cells(e):
                if "error" in e:
                    return ["refused", "", ""]
                return [f"{e['GBps']:.2f}", f"{e['ratio']:.3f}", str(e["steps"])]
            pc, fc = cells(p), cells(f)
            t.add_row(r["algorithm"], r["cluster"], f"{r['program_GBps']:.2f}", str(k), *pc,
                      f"{p.get('export_ms', 0):.0f}", *fc,
                      *( [f"{mt['GBps']:.2f}", f"{mt['ratio']:.3f}", str(mt["steps"])] if mt else ["", "", ""]))
    console.print(t)
    c = Table(title="Up-front MSCCL limit check on the transfer table (HM AllReduce)")
    for col in ("GPUs", "transfers", "limits", "check (s)", "verdict"):
        c.add_column(col, justify="right" if col != "verdict" else "left")
    for r in checks:
        c.add_row(f"{r['gpus']:,}", f"{r['transfers']:,}", r["limits"], f"{r['check_s']:.3f}", r["verdict"])
    console.print(c)


if __name__ == "__main__":
    main()
