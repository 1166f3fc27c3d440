"""MSCCL XML export at scale: seconds per export phase, peak memory, and the export beside the rest
of the compile.

    python benchmarks/xml_scale.py [--shapes 16x8,32x8] [--instances 1,2] [--json]

For each HM AllReduce shape (hccc.compiler.frontend.generators.hm_allreduce_rccl) and ``--instances
K`` (the XML then has K times the channels the program declares, as ``hccc`` writes it; the table's
K column is that total), a fresh process exports the algorithm the way ``hccc ALGO -o OUT`` does
(:func:`hccc.compiler.interop.msccl_export.export_algorithm`: the step-ordered program, one thread
block per connection end) with the runtime limits relaxed so that it fits (elements per rank,
steps per thread block, children), timing each phase: ``program`` (building the step-ordered
program), ``checks`` (its structure, FIFO order and deadlock proofs), ``rows`` (the primitive
table), ``layout`` (thread blocks and channels), ``waits`` (dropping implied waits: vector clocks),
``steps`` (step numbers, the instances and the limit check), ``text``, under the memory policy of
an ``hccc`` process (``driver/allocator.py``). Its peak resident memory is the child's. A second fresh process compiles the same file with ``hccc ALGO -o OUT --timings`` and
the same limits: "xml / rest" is its ``msccl_xml`` stage over all its other stages, side by side in
that one run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

#: limits relaxed so that every shape fits (the defaults refuse HM AllReduce past 32 GPUs per rank)
RELAXED = {"max_xml_nodes": 10 ** 7, "max_children": 10 ** 6, "max_steps": 4096, "max_channels": 256}
PHASES = ("program", "checks", "rows", "layout", "waits", "steps", "text")


def export_phases(src: Path, k: int) -> dict:
    """Seconds per phase of one export (in this process), with the text's size."""
    from hccc.compiler.interop import msccl_export as me
    from hccc.compiler.interop import msccl_prims as mp
    from hccc.compiler.interop import msccl_tbs as mt
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.interop.msccl_text import xml_text
    from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure
    from hccc.compiler.passes.build import build_algorithm_level
    from hccc.compiler.pipeline import load_algorithm

    lim = XmlLimits(**RELAXED)
    alg = load_algorithm(src)
    t = {}
    clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        now = time.perf_counter()
        t[name] = now - clock
        clock = now

    ir = build_algorithm_level(alg)
    lap("program")
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)
    lap("checks")
    rows = mp.unfuse(mp.allgather_sources(ir, mp.from_ir(ir)))
    lap("rows")
    lay = mt.assign_tbs(rows, lim.max_steps)
    mt.spread_channels(lay, lim)
    lap("layout")
    mt.reduce_deps(lay)
    lap("waits")
    mt.targets_first(lay)
    mt.number_steps(lay)
    full = mt.instantiate(lay, k)
    me._check_limits(ir, full, lim)
    lap("steps")
    text = xml_text(ir, full, lim, k)
    lap("text")
    return {"phases": t, "transfers": int(alg.ntransfers), "rows": len(rows), "steps": text.count("<step "),
            "text_mib": len(text) / (1 << 20)}


def measure(nnodes: int, g: int, k: int, workdir: Path) -> dict:
    from hccc.compiler.frontend.generators import hm_allreduce_rccl

    from hccc.compiler.pipeline import load_algorithm

    src = workdir / f"hm_allreduce_{nnodes}x{g}.rccl"
    src.write_text(hm_allreduce_rccl(nnodes, g))
    # the compile writes --instances K times the channels the program declares
    total = k * max(1, int(load_algorithm(src).header.nchannels))
    proc = subprocess.Popen([sys.executable, __file__, "--one", str(src), "--k", str(total)],
                            stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the export of {nnodes}x{g} failed")
    row = json.loads(out)
    row.update(gpus=nnodes * g, instances=total, peak_mib=usage.ru_maxrss / 1024)
    out = workdir / f"out_{nnodes}x{g}_{k}"
    cmd = [sys.executable, "-m", "hccc.cli", str(src), "-o", str(out), "--timings", "--instances", str(k),
           "--xml-max-elements", str(RELAXED["max_xml_nodes"]), "--xml-max-steps", str(RELAXED["max_steps"]),
           "--xml-max-channels", str(RELAXED["max_channels"])]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    if not list(out.glob("*.xml")):
        raise SystemExit(f"the compile of {nnodes}x{g} wrote no XML:\n{res.stdout}{res.stderr}")
    stages = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\S+)\s+([0-9.]+) s(.*)$", res.stdout, re.M)
              if "beside" not in m.group(3) and m.group(1) != "total"}      # (the last line: the whole command)
    row["compile_xml_s"] = stages.pop("msccl_xml")
    row["compile_rest_s"] = sum(stages.values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="16x8,32x8", help="HM AllReduce NODESxGPUS shapes (e.g. 16x8,32x8,128x8)")
    ap.add_argument("--instances", default="1,2", help="hccc's --instances K (the XML has K x the channels "
                                                     "the program declares)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        from hccc.allocator import tune_allocator
        tune_allocator()              # the memory policy of an hccc process (driver/allocator.py)
        print(json.dumps(export_phases(Path(args.one), args.k)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            nn, g = (int(v) for v in shape.split("x"))
            for k in (int(v) for v in args.instances.split(",")):
                rows.append(measure(nn, g, k, Path(tmp)))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title="MSCCL XML export of HM AllReduce (relaxed limits), seconds")
    for col in ("GPUs", "K", "transfers", "steps", *PHASES, "export", "peak MiB", "text MiB", "compile: xml",
                "rest", "xml / rest"):
        t.add_column(col, justify="right")
    for r in rows:
        ph = r["phases"]
        t.add_row(str(r["gpus"]), str(r["instances"]), f"{r['transfers']:,}", f"{r['steps']:,}",
                  *(f"{ph[p]:.2f}" for p in PHASES), f"{sum(ph.values()) - ph['program']:.2f}",
                  f"{r['peak_mib']:.0f}", f"{r['text_mib']:.0f}", f"{r['compile_xml_s']:.2f}",
                  f"{r['compile_rest_s']:.2f}", f"{r['compile_xml_s'] / r['compile_rest_s']:.2f}")
    Console(width=220).print(t)
    print("export = every phase but building the step-ordered program (which the kernels' compile does not share)")


if __name__ == "__main__":
    main()
