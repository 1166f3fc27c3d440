"""End-to-end compile time and peak memory of HM AllReduce at growing scale.

    python benchmarks/compile_scale.py [--gpus 32,128,512,1024] [--gpus-per-node 8]
                                       [--codegen specialized,table] [--repeat 1]

For each size the ResCCLang source is generated (hccc.compiler.frontend.generators.hm_allreduce_rccl), written to
a temporary file, and compiled by a fresh ``hccc`` process exactly as a user would run it
(``hccc algo.rccl -o OUT --timings``), so the figures include interpreter start-up, parsing, verification,
DAG, HPDS, lowering, TB allocation, the deadlock check and code generation. Peak memory is the child's
maximum resident set size; "total CPU" is its user + system time, which a loaded machine inflates
less than the wall-clock figures (compare it with wall to see how much waiting for a core cost). ``--codegen`` lists the code-generation modes to compare (each size is
compiled once per mode, side by side). Prints a phase table: seconds per stage (parse, verify, schedule+lower,
msccl_xml, codegen) and per phase inside the big ones (dag, HPDS schedule, lowering, TB allocation,
checks; kernel analysis, primitive lines, template rendering, then "write": what is left of the IR JSON, made
on a background thread from the start of code generation, and of the file writes, which also run in the
background as files are made). ``msccl_xml``
is the MSCCL XML export, which programs past the runtimes' limits skip after the up-front check.
Stages marked "beside" ran on a second thread (verification beside schedule+lower, the IR checks
beside codegen), so their seconds overlap the stage named. ``--repeat N`` compiles each size and
mode N times (the runs of one size interleaved across modes) and reports the run with the median
wall time: on a shared machine single runs vary by a few seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hccc.compiler.frontend.generators import hm_allreduce_rccl


def run_one(nnodes: int, g: int, workdir: Path, codegen: str = "specialized") -> dict:
    src = workdir / f"hm_allreduce_{nnodes}x{g}.rccl"
    src.write_text(hm_allreduce_rccl(nnodes, g))
    out = workdir / f"out_{nnodes}x{g}_{codegen}"
    cmd = [sys.executable, "-m", "hccc.cli", str(src), "-o", str(out), "--timings", "--codegen", codegen]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"hccc failed on {nnodes}x{g}:\n{stderr}")
    stages = {m.group(1): float(m.group(2))   # stages, and their phases as "stage/phase"
              for m in re.finditer(r"^\s+(\S+)\s+([0-9.]+) s\b", stdout, re.M)
              if m.group(1) != "total"}                # (the last line: the whole command, as "wall")
    beside = {m.group(1): m.group(2) for m in re.finditer(r"^\s+(\S+)\s+[0-9.]+ s\s+\(beside (\S+),", stdout, re.M)}
    transfers = re.search(r"(\d+) transfers", stdout)
    tbs = re.search(r"TBs per rank <= (\d+)", stdout)
    files = [f for f in out.rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    xml = sum(f.stat().st_size for f in files if f.suffix == ".xml")
    shutil.rmtree(out)
    return {"gpus": nnodes * g, "codegen": codegen, "xml_mib": xml / 2 ** 20, "transfers": int(transfers.group(1)) if transfers else -1,
            "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024, "stages": stages, "beside": beside,
            "tbs": int(tbs.group(1)) if tbs else -1, "out_mib": size / 2 ** 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="32,128,512,1024")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--codegen", default="specialized",
                    help="comma list of code-generation modes to compare: specialized, table")
    ap.add_argument("--repeat", type=int, default=1,
                    help="compiles per size and mode; the run with the median wall time is shown")
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    codegens = args.codegen.split(",")
    if not set(codegens) <= {"specialized", "table"}:
        raise SystemExit(f"--codegen: unknown mode in {args.codegen!r}")
    g = args.gpus_per_node
    sizes = [int(x) for x in args.gpus.split(",")]
    console = Console(width=160)
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hccc-bench-") as tmp:
        for n in sizes:
            if n % g:
                raise SystemExit(f"{n} GPUs is not a multiple of {g} GPUs per node")
            runs: dict[str, list[dict]] = {cg: [] for cg in codegens}
            for i in range(args.repeat):
                for cg in codegens:
                    console.print(f"compiling HM AllReduce {n // g}x{g} ({cg}, run {i + 1} of {args.repeat}) ...",
                                  style="dim")
                    runs[cg].append(run_one(n // g, g, Path(tmp), cg))
            for cg in codegens:
                ordered = sorted(runs[cg], key=lambda r: r["wall"])
                row = ordered[(len(ordered) - 1) // 2]
                row["walls"] = [r["wall"] for r in runs[cg]]
                rows.append(row)
    console.print(phase_table(rows))
    console.print(f"machine load (1-minute average): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
                  f"on {os.cpu_count()} cores")


def phase_table(rows: list[dict]) -> Table:
    """One row per stage (and, indented, per phase inside it), one column per size and mode."""
    names = list(dict.fromkeys(k for r in rows for k in r["stages"]))   # printed order: stage, its phases
    table = Table(title="hccc compile of HM AllReduce: seconds per stage / phase")
    table.add_column("stage / phase")
    for r in rows:
        table.add_column(f"{r['gpus']:,} GPUs {r['codegen']}", justify="right")
    table.add_row("transfers", *[f"{r['transfers']:,}" for r in rows])
    for k in names:
        label = ("    " + k.split("/", 1)[1]) if "/" in k else k
        where = {r["beside"][k] for r in rows if k in r.get("beside", {})}
        if where:
            label += f" (beside {', '.join(sorted(where))})"
        table.add_row(label, *[f"{r['stages'][k]:.2f}" if k in r["stages"] else "" for r in rows])
    table.add_row("total wall", *[f"{r['wall']:.2f}" for r in rows])
    if any(len(r.get("walls", ())) > 1 for r in rows):
        table.add_row("walls of all runs", *[" ".join(f"{w:.1f}" for w in r.get("walls", [r["wall"]])) for r in rows])
    table.add_row("total CPU (user+sys)", *[f"{r['cpu']:.2f}" for r in rows])
    table.add_row("peak RSS (MiB)", *[f"{r['peak_mib']:.0f}" for r in rows])
    table.add_row("output (MiB)", *[f"{r['out_mib']:.1f}" for r in rows])
    table.add_row("of which XML (MiB)", *[f"{r['xml_mib']:.1f}" for r in rows])
    table.add_row("TBs/rank", *[str(r["tbs"]) for r in rows])
    return table


if __name__ == "__main__":
    main()
