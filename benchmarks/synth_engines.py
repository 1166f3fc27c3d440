#!/usr/bin/env python3
"""``hccc synth --for msccl|mscclpp`` on held-out clusters: the fraction of the cut bound and the export.

    python benchmarks/synth_engines.py                                  # the held-out clusters below
                                                                        # and v100_4_8, h20_4_8
    python benchmarks/synth_engines.py --clusters v100_4_8 --engines mscclpp --collectives allreduce
    python benchmarks/synth_engines.py --json out.json                  # also write the rows as JSON

Every row is one ``hccc synth CLUSTER --collective C --for ENGINE --time-limit S --json`` (1 GiB),
its program then exported by the engine's exporter (``hccc xml`` or ``hccc plan``, default limits)
and the export read back and proven by ``hccc check``. Columns: ``method`` (what was written),
``K`` (chunks per rank), ``fraction`` (the written program's simulated time over the cut bound's, as
the command reports it; the target is :data:`TARGET`), for AllReduce ``reach`` (the most of the cut
bound any AllReduce can reach there: :func:`reachable`) and ``of AR`` (the program's fraction of the
AllReduce bound for any schedule), ``check`` (``ok`` where the exported file
passes ``hccc check``), ``wall`` (seconds of the synthesis).

The held-out clusters (:func:`held_out`) are made here from a fixed seed, not taken from the
examples the synthesis was developed on: 8 to 64 GPUs in nodes of 4 or 8, NVSwitch or NVLink-mesh
nodes of varied link rates, PCIe-attached GPUs, NICs of 64 to 400 Gbps, one or two NICs per GPU
pair, and a cluster of NVIDIA and AMD nodes. ``msccl`` is the MSCCL executor's XML (``--for xml``).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "clusters"))

#: the fraction of the cut bound ``--for`` programs are to reach (synthesis v3, item 2)
TARGET = 0.9
#: ``--for`` name and the export command of each engine
ENGINES = {"msccl": ("xml", "xml", ".xml"), "mscclpp": ("mscclpp", "plan", ".json")}
#: the fixed seed of the held-out clusters
SEED = 20261129


def held_out(seed: int = SEED) -> dict[str, str]:
    """Cluster name -> .topo text: clusters of 8 to 64 GPUs drawn from ``seed`` (see the module
    docstring), built from the example clusters' node kinds (``examples/clusters/generate.py``)
    with their rates varied."""
    from generate import LinkSpec, NicSpec, NodeSpec, cluster, format_topology, nvlink_mesh, nvswitch, pcie_node

    rng = random.Random(seed)

    def switch_node(g: int) -> NodeSpec:
        port, ports = rng.choice([(25, 12), (50, 9), (25, 6)])
        nic = rng.choice([12.5, 25, 50])
        per = rng.choice([1, 2])
        nics = [NicSpec(tuple(range(a, a + per)), nic) for a in range(0, g, per)]
        return NodeSpec(g, nvswitch(g, port, ports), vendor="nvidia", gpu="H100", gamma=1000, nics=nics)

    def mesh_node(g: int) -> NodeSpec:
        lanes = rng.choice([1, 2, 3, 4])
        nic = rng.choice([8, 12.5, 25])
        return NodeSpec(g, {"direct": nvlink_mesh(list(range(g)), 25, lanes)}, vendor="nvidia", gpu="V100",
                        gamma=300, nics=[NicSpec((a, a + 1), nic) for a in range(0, g, 2)])

    def one(nodes: int, g: int, kinds: str) -> str:
        if kinds == "mixed":
            made = [pcie_node("nvidia", "V100-PCIe", 16, 3) if i % 2 == 0 else pcie_node("amd", "W7800", 32, 4)
                    for i in range(nodes)]
            return format_topology(cluster(made, "held-out: NVIDIA and AMD nodes on PCIe",
                                           gamma={"nvidia": 300, "amd": 190}))
        make = switch_node if kinds == "switch" else mesh_node
        return format_topology(cluster([make(g) for _ in range(nodes)], f"held-out: {nodes} x {g} GPUs ({kinds})"))

    return {"ho_2x4_mesh": one(2, 4, "mesh"), "ho_2x8_switch": one(2, 8, "switch"),
            "ho_3x8_switch": one(3, 8, "switch"), "ho_4x4_mixed": one(4, 4, "mixed"),
            "ho_8x4_mesh": one(8, 4, "mesh"), "ho_8x8_switch": one(8, 8, "switch")}


def _hccc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hccc", *args], capture_output=True, text=True)


def row(name: str, topo: Path, collective: str, engine: str, time_limit: float, work: Path) -> dict:
    """One ``hccc synth --for``, its export and ``hccc check`` of the export."""
    flag, export, suffix = ENGINES[engine]
    out = work / f"{name}.{collective}.{engine}.rccl"
    t0 = time.perf_counter()
    got = _hccc("synth", str(topo), "--collective", collective, "--for", flag, "--time-limit", str(time_limit),
                "-o", str(out), "--json")
    wall = time.perf_counter() - t0
    if got.returncode != 0:
        return {"cluster": name, "collective": collective, "engine": engine, "method": "-", "K": None,
                "fraction": None, "of_allreduce_bound": None, "reachable": None, "check": "synth: " + (got.stderr.strip().splitlines() or ["?"])[-1],
                "wall": round(wall, 1)}
    s = json.loads(got.stdout)
    exported = out.with_suffix(suffix)
    ex = _hccc(export, str(out), "-o", str(exported))
    check = _hccc("check", str(exported)) if ex.returncode == 0 else ex
    why = "ok" if check.returncode == 0 else (check.stderr.strip().splitlines() or ["failed"])[-1]
    return {"cluster": name, "collective": collective, "engine": engine, "method": s["method"],
            "K": s["chunks_per_rank"], "fraction": s.get("fraction_of_bound"),
            "of_allreduce_bound": s["bandwidth_bound"].get("fraction_of_allreduce_bound"),
            "reachable": reachable(s["bandwidth_bound"]), "check": why, "wall": round(wall, 1)}


def reachable(bound: dict) -> float | None:
    """The most of the cut bound any AllReduce can reach: the cut bound over the AllReduce bound
    for any schedule (docs/bounds.md: above the cut bound where a node is slower inside than the
    cut it stands behind); None for the other collectives."""
    if "allreduce_bound_seconds" not in bound:
        return None
    return bound["seconds"] / bound["allreduce_bound_seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default=None, help="comma-separated: held-out names or example clusters "
                    "(default: every held-out cluster, v100_4_8, h20_4_8)")
    ap.add_argument("--collectives", default="allgather,reducescatter,allreduce")
    ap.add_argument("--engines", default="msccl,mscclpp")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    made = held_out()
    names = a.clusters.split(",") if a.clusters else list(made) + ["v100_4_8", "h20_4_8"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"{'cluster':16} {'collective':14} {'engine':8} {'method':11} {'K':>3} {'fraction':>8} {'reach':>5} "
              f"{'of AR':>5}  check  wall")
        for name in names:
            if name in made:
                topo = work / f"{name}.topo"
                topo.write_text(made[name])
            else:
                topo = ROOT / "examples" / "clusters" / f"{name}.topo"
            for coll in a.collectives.split(","):
                for engine in a.engines.split(","):
                    r = row(name, topo, coll, engine, a.time_limit, work)
                    rows.append(r)
                    f, reach, of_ar = ("-" if r[k] is None else f"{r[k]:.3f}"
                                       for k in ("fraction", "reachable", "of_allreduce_bound"))
                    print(f"{r['cluster']:16} {coll:14} {engine:8} {r['method']:11} {str(r['K']):>3} {f:>8} {reach:>5} "
                          f"{of_ar:>5}  {r['check']}  {r['wall']}", flush=True)
    low = [r for r in rows if r["fraction"] is None or r["fraction"] < TARGET or r["check"] != "ok"]
    print(f"{len(rows) - len(low)} of {len(rows)} rows at or above {TARGET} of the cut bound and checked")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
