#!/usr/bin/env python3
"""(Re)write the mixed-vendor C2C example programs in this folder (deterministic).

    python examples/c2c/generate.py            # (re)write the .rccl files next to this script
    python examples/c2c/generate.py --check    # exit 1 if a file is missing or out of date
    python examples/c2c/generate.py --out DIR  # write somewhere else

Each file is what ``hccc gen c2c examples/clusters/mixed_v100_w7800.topo --collective C -o FILE`` writes:
HetCCL's cluster-to-cluster breakdown of C for 2 nodes x 4 NVIDIA V100 + 2 nodes x 4 AMD W7800
(Broadcast and Reduce with ``--root 9``, an AMD rank).
Compile one for its cluster with
``hccc examples/c2c/c2c_allreduce_mixed_v100_w7800.rccl -o kernels/ --topology examples/clusters/mixed_v100_w7800.topo``
(CUDA kernels for the NVIDIA ranks, HIP for the AMD ranks).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hccc.compiler.cluster.c2c import COLLECTIVES, plan_c2c
from hccc.compiler.cluster.topo_parser import load_topology

HERE = Path(__file__).resolve().parent
CLUSTER = HERE.parent / "clusters" / "mixed_v100_w7800.topo"
#: the rooted examples use an AMD rank as the root, so the data starts (or ends) in the second cluster
ROOT = 9


def examples() -> dict[str, str]:
    """File name -> text."""
    topo = load_topology(CLUSTER)
    out = {}
    for coll in COLLECTIVES:
        plan = plan_c2c(topo, coll, root=ROOT if coll in ("broadcast", "reduce") else None)
        out[f"{plan.name}.rccl"] = plan.rccl()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="write the mixed-vendor C2C example programs")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--check", action="store_true", help="only check that the files are current")
    args = ap.parse_args(argv)
    stale = []
    for name, text in examples().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        print(path)
    if stale:
        print("out of date: " + ", ".join(stale) + " (run python examples/c2c/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
