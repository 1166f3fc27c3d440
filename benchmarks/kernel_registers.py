"""Registers, spills and stack of one program's CUDA kernels, from ``ptxas -v`` (sm_90).

    python benchmarks/kernel_registers.py [EXAMPLE ...] [--dtype float32] [--op sum] [--system] [--table]

For each example of ``examples/`` (default: the two ``tests/test_kernel_registers.py`` checks, ring
AllReduce 8 and HM AllReduce 4x8, and the AllToAll programs whose kernels also run as AllToAllv:
direct AllToAll 8, ring AllToAll 6, hierarchical AllToAll 2x4) it builds the module the runtime
builds (every rank's kernel and the one-grid entry, one instance; ``--system``: the system-scope
build, else the single-GPU one; ``--table``: the table mode's generic kernels instead, which run
every program and carry the AllToAllv path) and prints, per function of the call tree (one line for the
copies ptxas makes per entry when they agree): its spill stores / loads in bytes, and per entry
its registers and cumulative stack. The figures of
docs/measurements.md#the-engines-registers-under-alltoallv-ptxas-no-gpu are this script's. Needs
``nvcc``; a few seconds per example.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["ring_allreduce_8", "hm_allreduce_4x8", "direct_alltoall_8", "ring_alltoall_6",
           "hierarchical_alltoall_2x4"]


def report(text: str) -> dict[str, dict]:
    """``ptxas -v`` output -> function -> {spill_stores, spill_loads[, registers, stack]} (the
    entries' cumulative stack as ``stack``)."""
    from hccc.runtime.cuda import ptxas_report
    out = {}
    for name, v in ptxas_report(text).items():
        row = {"spill_stores": v["spill_stores"], "spill_loads": v["spill_loads"]} if "spill_stores" in v else {}
        if "registers" in v:
            row.update(registers=v["registers"], stack=v["cumulative_stack"])
        out[name] = row
    return out


def build(example: str, dtype: str, op: str, system: bool, table: bool = False) -> dict[str, dict]:
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.backend.table_codegen import generate_table
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.cuda import cuda_flags
    from hccc.runtime.gpu import translation_unit
    from hccc.runtime.platform import Instance
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ir = load_program(ROOT / "examples" / f"{example}.rccl")
        (generate_table if table else generate)(ir, d, platforms=["cuda"] * ir.nranks)
        man = json.loads((d / "manifest.json").read_text())
        src = d / "all.cu"
        src.write_text(translation_unit(man, Instance(dtype, op), list(range(ir.nranks)), "cuda"))
        res = subprocess.run(["nvcc", *cuda_flags("sm_90", not system), "-Xptxas", "-v", "-I", str(d),
                              "-o", str(d / "all.cubin"), str(src)], capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{example}: nvcc failed:\n{res.stderr[-3000:]}")
        return report(res.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("examples", nargs="*", default=DEFAULT)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--op", default="sum")
    ap.add_argument("--system", action="store_true", help="the system-scope build (default: single-GPU)")
    ap.add_argument("--table", action="store_true", help="the table mode's generic kernels")
    args = ap.parse_args(argv)
    for ex in args.examples:
        rep = build(ex, args.dtype, args.op, args.system, args.table)
        print(f"{ex} ({args.dtype} {args.op}, {'system' if args.system else 'single-GPU'} build"
              f"{', table kernels' if args.table else ''})")
        rows: dict[tuple, int] = defaultdict(int)
        for name, v in rep.items():
            if name == "hccc_runtime_gate":
                continue
            if "registers" in v:
                kind = ("one-grid entry" if "_grid_" in name else
                        "generic table kernel" if args.table else "rank kernel")
                rows[(kind, f"{v['registers']} registers, {v['stack']} B stack, "
                            f"spills {v['spill_stores']}/{v['spill_loads']} B")] += 1
            else:
                rows[(re.sub(r"^_Z\d+", "", name)[:48], f"spills {v['spill_stores']}/{v['spill_loads']} B")] += 1
        for (what, fig), n in sorted(rows.items()):
            print(f"  {what:50s} {fig}" + (f"  (x{n})" if n > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
