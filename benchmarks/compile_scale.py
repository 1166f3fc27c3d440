"""End-to-end compile time and peak memory of HM AllReduce at growing scale.

    python benchmarks/compile_scale.py [--gpus 32,128,512,1024] [--gpus-per-node 8]
                                       [--codegen specialized,table]

For each size the ResCCLang source is generated (hccc.compiler.frontend.generators.hm_allreduce_rccl), written to
a temporary file, and compiled by a fresh ``hccc`` process exactly as a user would run it
(``hccc algo.rccl -o OUT --timings``), so the figures include interpreter start-up, parsing, verification,
DAG, HPDS, lowering, TB allocation, the deadlock check and code generation. Peak memory is the child's
maximum resident set size. ``--codegen`` lists the code-generation modes to compare (each size is
compiled once per mode, side by side). Prints a table.
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
    stages = {m.group(1): float(m.group(2))
              for m in re.finditer(r"^\s+(\S+)\s+([0-9.]+) s$", stdout, re.M)}
    transfers = re.search(r"(\d+) transfers", stdout)
    tbs = re.search(r"TBs per rank <= (\d+)", stdout)
    files = [f for f in out.rglob("*") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    xml = sum(f.stat().st_size for f in files if f.suffix == ".xml")
    shutil.rmtree(out)
    return {"gpus": nnodes * g, "codegen": codegen, "xml_mib": xml / 2 ** 20, "transfers": int(transfers.group(1)) if transfers else -1,
            "wall": wall, "peak_mib": usage.ru_maxrss / 1024, "stages": stages,
            "tbs": int(tbs.group(1)) if tbs else -1, "out_mib": size / 2 ** 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="32,128,512,1024")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--codegen", default="specialized",
                    help="comma list of code-generation modes to compare: specialized, table")
    args = ap.parse_args()
    codegens = args.codegen.split(",")
    if not set(codegens) <= {"specialized", "table"}:
        raise SystemExit(f"--codegen: unknown mode in {args.codegen!r}")
    g = args.gpus_per_node
    sizes = [int(x) for x in args.gpus.split(",")]
    console = Console(width=160)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hccc-bench-") as tmp:
        for n in sizes:
            if n % g:
                raise SystemExit(f"{n} GPUs is not a multiple of {g} GPUs per node")
            for cg in codegens:
                console.print(f"compiling HM AllReduce {n // g}x{g} ({cg}) ...", style="dim")
                rows.append(run_one(n // g, g, Path(tmp), cg))
    stage_names = sorted({k for r in rows for k in r["stages"]},
                         key=lambda k: ["parse", "verify", "schedule+lower", "codegen"].index(k)
                         if k in ("parse", "verify", "schedule+lower", "codegen") else 99)
    table = Table(title="hccc end-to-end compile of HM AllReduce (this machine)")
    for col in ["GPUs", "codegen", "transfers", *[f"{s} (s)" for s in stage_names], "total wall (s)",
                "peak RSS (MiB)", "output (MiB)", "of which XML", "TBs/rank"]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['gpus']:,}", r["codegen"], f"{r['transfers']:,}",
                      *[f"{r['stages'].get(s, 0):.2f}" for s in stage_names],
                      f"{r['wall']:.2f}", f"{r['peak_mib']:.0f}", f"{r['out_mib']:.1f}",
                      f"{r['xml_mib']:.1f}", str(r["tbs"]))
    console.print(table)


if __name__ == "__main__":
    main()
