"""The table mode's library build: CPU seconds per (dtype, op) instance, per unit, and ``make -j2``.

    python benchmarks/table_build.py [--instances] [--build] [--algo examples/hm_allreduce_4x8.rccl]
                                     [--jobs 2] [--platform cuda] [--json OUT.json]

``--instances`` (the cost model of :mod:`hccc.compiler.backend.table_units`): the device compiler's
CPU seconds (user + sys of the compiler and every process it starts, ``getrusage``) for the generic
source with no instance enabled (a unit's fixed cost: the headers parsed, the host pass, the
functions every kernel shares) and with each (dtype, op) instance alone, compiled one after the
other as the emitted Makefile compiles a unit (nvcc ``-O3 -arch=sm_90``; ``--platform hip``: hipcc
gfx90a). An instance's cost is its unit's less the empty unit's.

``--build`` (the default): ``hccc ALGO --target PLATFORM --codegen table -o DIR`` then ``make -jJOBS``
of every default instance, the wall seconds, the CPU seconds of the whole build and of each unit
(the Makefile's compiler wrapped in a timer through ``NVCC=`` / ``HIPCC=``), each unit's modelled
cost beside its measured one, and the load average before and after (the machine may be shared: the
CPU seconds are what a quiet machine's wall time follows; its ``make -jJOBS`` wall is about the
largest sum of the units one job compiles).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hccc.util import dtypes as dtypes_table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ALGO = ROOT / "examples" / "hm_allreduce_4x8.rccl"
EXT = {"cuda": "cu", "hip": "hip"}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def compile_command(platform: str, src: Path, obj: Path, flags: list[str]) -> tuple[list[str], dict]:
    """One unit's compile as the emitted Makefile runs it."""
    env = dict(os.environ)
    if platform == "cuda":
        cmd = ["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-Xcompiler", "-fPIC"]
    else:
        env["HIP_PLATFORM"] = "amd"
        cmd = ["hipcc", "-std=c++17", "-O3", "--offload-arch=gfx90a", "-fPIC"]
    return cmd + [f"-I{src.parent}", *flags, "-c", str(src), "-o", str(obj)], env


def timed_compile(platform: str, src: Path, obj: Path, flags: list[str]) -> float:
    """CPU seconds of one compile (raises on a failed one)."""
    cmd, env = compile_command(platform, src, obj, flags)
    c0 = _children_cpu()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed on {src.name} {' '.join(flags)}:\n{res.stderr[-3000:]}")
    return _children_cpu() - c0


def instance_costs(platform: str, tmp: Path, console: Console) -> dict:
    generic = tmp / "generic"
    subprocess.run([sys.executable, "-m", "hccc", "--table-kernels", str(generic)], check=True)
    src = generic / f"hccc_table.{EXT[platform]}"
    off = [f"-DHCCC_ENABLE_{d.name.upper()}=0" for d in dtypes_table.DTYPES]
    base = ["-DHCCC_TABLE_GRID_KERNELS=0"]
    empty = timed_compile(platform, src, tmp / "empty.o", base + off)
    console.print(f"empty unit: {empty:.2f} CPU s", style="dim")
    costs = {}
    for d, o in dtypes_table.instances():
        s = timed_compile(platform, src, tmp / "one.o", base + dtypes_table.only_instance_flags(d.name, o.name))
        costs[f"{d.name}/{o.name}"] = round(s - empty, 2)
        console.print(f"{d.name} {o.name}: {s:.2f} CPU s ({s - empty:.2f} over the empty unit)", style="dim")
    return {"platform": platform, "empty_unit_s": round(empty, 2), "instance_s": costs,
            "load": os.getloadavg()}


WRAPPER = """#!/bin/sh
# times one compile: CPU seconds (user + sys, children included) of the unit named by -c
out=$1; shift
exec /usr/bin/time -a -o "$out" -f "%U %S $*" "$@"
"""


def build(algo: Path, platform: str, jobs: int, tmp: Path, console: Console, make_vars: tuple[str, ...] = ()) -> dict:
    """``make -jJOBS`` of ``algo``'s table-mode output (``make_vars``: e.g. ``HCCC_DTYPES=uint8``)."""
    from hccc.compiler.backend.table_units import default_units
    out = tmp / "k"
    res = subprocess.run([sys.executable, "-m", "hccc", str(algo), "--target", platform, "--codegen", "table",
                          "-o", str(out)], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"hccc failed:\n{res.stderr[-3000:]}")
    log = tmp / "units.log"
    wrap = tmp / "timed-compiler"
    wrap.write_text(WRAPPER)
    wrap.chmod(0o755)
    compiler = {"cuda": ("NVCC", "nvcc"), "hip": ("HIPCC", "hipcc")}[platform]
    load0 = os.getloadavg()
    c0, t0 = _children_cpu(), time.perf_counter()
    res = subprocess.run(["make", f"-j{jobs}", "-C", str(out), f"{compiler[0]}={wrap} {log} {compiler[1]}",
                          *make_vars], capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if res.returncode != 0:
        raise SystemExit(f"make failed:\n{res.stderr[-3000:]}")
    model = {u.source(platform): u.cost_s for u in default_units()}
    units = {}
    for line in log.read_text().splitlines():
        f = line.split()
        src = f[f.index("-c") + 1]
        units[src] = {"cpu_s": round(float(f[0]) + float(f[1]), 2), "model_s": round(model.get(src, 0.0), 2)}
    return {"algo": algo.name, "platform": platform, "jobs": jobs, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "units": units, "load_before": load0, "load_after": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", action="store_true", help="the cost of each instance (the model's numbers)")
    ap.add_argument("--build", action="store_true", help="make -jJOBS of every default instance (the default)")
    ap.add_argument("--algo", type=Path, default=DEFAULT_ALGO)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--platform", choices=sorted(EXT), default="cuda")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args()
    tool = {"cuda": "nvcc", "hip": "hipcc"}[args.platform]
    if shutil.which(tool) is None:
        raise SystemExit(f"{tool} not found")
    console = Console(width=150)
    result = {}
    with tempfile.TemporaryDirectory(prefix="hccc-table-build-") as tmpd:
        tmp = Path(tmpd)
        if args.instances:
            result["instances"] = r = instance_costs(args.platform, tmp, console)
            t = Table(title=f"{tool}: CPU seconds of each instance alone in a unit, over the empty unit's "
                            f"{r['empty_unit_s']:.2f} s (load {r['load'][0]:.1f})")
            for col in ("instance", "CPU s"):
                t.add_column(col, justify="right")
            for k, v in r["instance_s"].items():
                t.add_row(k, f"{v:.2f}")
            t.add_row("sum", f"{sum(r['instance_s'].values()):.2f}")
            console.print(t)
        if args.build or not args.instances:
            result["build"] = r = build(args.algo, args.platform, args.jobs, tmp, console)
            t = Table(title=f"make -j{r['jobs']} of {r['algo']} --codegen table ({r['platform']}): "
                            f"{r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU s; load "
                            f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after")
            for col in ("unit", "CPU s", "model s"):
                t.add_column(col, justify="right")
            for k, v in r["units"].items():
                t.add_row(k, f"{v['cpu_s']:.2f}", f"{v['model_s']:.2f}")
            console.print(t)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
