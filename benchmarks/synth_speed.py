#!/usr/bin/env python3
"""``hccc synth`` end to end: wall time, CPU time (user + system) and peak memory of the command,
each run in a process of its own, on the generated multi-rail H800 clusters (8 GPUs per node on
NVSwitch, one 400 Gb/s NIC per GPU) and optionally the example clusters.

    python benchmarks/synth_speed.py                       # 64 GPUs: AllGather, ReduceScatter, AllReduce; 512: AllGather
    python benchmarks/synth_speed.py --compare OTHER_CHECKOUT   # the same with another source tree, side by side
    python benchmarks/synth_speed.py --examples            # also every example cluster
    python benchmarks/synth_speed.py --time-limit 3        # how far past a limit the command runs
    python benchmarks/synth_speed.py --no-multirail --asym 1,2 --method trees --time-limit 600
                                                           # the held-out clusters of the speed targets
    python benchmarks/synth_speed.py --no-multirail --ladder --method trees --time-limit 600
                                                           # a 64-GPU cluster no threshold was set on
    python benchmarks/synth_speed.py --no-multirail --asym 1,2 --method search --collectives allgather
                                                           # the step search on them

With ``--compare``, every case runs under the other checkout's sources and this one's in turn
(interleaved, so that a machine shared with other work loads both alike). The printed line of
``synth`` (method, fraction of the bound) is kept for each run.

The held-out clusters (``--asym SEEDS``) are ``synth_quality.py``'s: 64 GPUs in nodes drawn apart,
so that no symmetry reduces them. ``--ladder`` adds :func:`ladder_text`, a 64-GPU cluster built
here for checking that a speed-up carries over: no constant of synthesis was set on it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: imports ``hccc`` from the source tree given as the first argument (the package layout of pyproject.toml)
LOAD_TREE = r"""
import importlib.util, os, sys
root = sys.argv[1]
mods = []
for name, d in (("hccc", "driver"), ("hccc.compiler", "compiler"), ("hccc.util", "util"),
                ("hccc.runtime", "runtime"), ("hccc.templates", "templates")):
    path = os.path.join(root, d)
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    mods.append((m, spec))
for m, spec in mods:
    spec.loader.exec_module(m)
"""
#: runs ``hccc`` (the rest of the arguments) from that source tree
BOOT = LOAD_TREE + "import hccc.cli\nsys.exit(hccc.cli.main(sys.argv[2:]))\n"


def run(tree: Path, argv: list[str]) -> dict:
    """One ``hccc`` command under ``tree``'s sources: wall, CPU and peak memory of its process."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", BOOT, str(tree), *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in out.splitlines()[::-1] if ln.startswith("hccc synth:") and " by " in ln), "")
    return {"rc": p.returncode, "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_mb": round(usage.ru_maxrss / 1024), "line": line or (err.strip().splitlines() or [""])[-1]}


#: what every 64-GPU cluster is timed on (``--collectives`` narrows it)
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def ladder_text() -> str:
    """A 64-GPU cluster of ten nodes, each unlike the others and unlike ``synth_quality.py``'s
    generators: node ``i`` has 4, 6 or 8 GPUs on a ring of ``50 + 25 (i mod 4)`` GB/s links (the
    way back half as fast on every third node), rungs between the GPUs ``k`` and ``k + 2`` on odd
    nodes, NVIDIA and AMD in turn, and a NIC of ``12.5 (1 + i mod 3)`` GB/s per GPU (per two GPUs
    on every fourth node); every pair of nodes through the NICs. Deterministic: no seed."""
    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, format_topology

    sizes = (8, 8, 6, 6, 6, 6, 8, 4, 6, 6)
    nodes = []
    for i, gpn in enumerate(sizes):
        bw = 50.0 + 25.0 * (i % 4)
        back = bw / 2 if i % 3 == 0 else bw
        links = []
        for a in range(gpn):
            b = (a + 1) % gpn
            links += [LinkSpec(a, b, bw), LinkSpec(b, a, back)]
            if i % 2 and a + 2 < gpn and a % 2 == 0:
                links += [LinkSpec(a, a + 2, bw / 2), LinkSpec(a + 2, a, bw / 2)]
        share = 2 if i % 4 == 3 else 1
        nics = [NicSpec(tuple(range(g, min(gpn, g + share))), 12.5 * (1 + i % 3)) for g in range(0, gpn, share)]
        vendor = "amd" if i % 2 else "nvidia"
        nodes.append(NodeSpec(gpn, {"direct": links}, nics=nics, vendor=vendor,
                              gpu="MI250" if vendor == "amd" else "A100"))
    assert sum(sizes) == 64
    return format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")],
                                       comment="ladder: 64 GPUs in ten nodes drawn by rule, each unlike the others"))


def cases(examples: bool, big: bool, multirail: bool = True, asym: tuple[int, ...] = (), ladder: bool = False,
          collectives: tuple[str, ...] = COLLECTIVES) -> list[tuple[str, str]]:
    from synth_quality import asym_text, multirail_text

    tmp = Path(tempfile.mkdtemp(prefix="synth_speed_"))
    out = []
    if multirail:
        mr64 = tmp / "multirail_64.topo"
        mr64.write_text(multirail_text(8))
        out += [(str(mr64), c) for c in collectives]
    for seed in asym:
        f = tmp / f"asym{seed}.topo"
        f.write_text(asym_text(seed))
        out += [(str(f), c) for c in collectives]
    if ladder:
        f = tmp / "ladder.topo"
        f.write_text(ladder_text())
        out += [(str(f), c) for c in collectives]
    if big and multirail and "allgather" in collectives:
        mr512 = tmp / "multirail_512.topo"
        mr512.write_text(multirail_text(64))
        out.append((str(mr512), "allgather"))
    if examples:
        for f in sorted((ROOT / "examples" / "clusters").glob("*.topo")):
            out += [(str(f), c) for c in collectives]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", type=Path, default=None, metavar="CHECKOUT",
                    help="another source tree (a checkout of this repository) run side by side")
    ap.add_argument("--examples", action="store_true", help="also every example cluster")
    ap.add_argument("--no-512", action="store_true", help="leave out the 512-GPU AllGather")
    ap.add_argument("--no-multirail", action="store_true", help="leave out the multi-rail H800 clusters")
    ap.add_argument("--asym", default="", metavar="SEEDS",
                    help="also synth_quality.py's held-out 64-GPU clusters of these seeds (comma-separated)")
    ap.add_argument("--ladder", action="store_true", help="also ladder_text()'s 64-GPU cluster")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma-separated (default: %(default)s)")
    ap.add_argument("--method", default=None, help="--method for every run (default: synth's)")
    ap.add_argument("--time-limit", type=float, default=None, help="--time-limit for every run (default: synth's)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    trees = ([("other", args.compare.resolve())] if args.compare else []) + [("this", ROOT)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, tree in trees:   # each tree's numba kernels compiled and cached before the timing
            run(tree, ["synth", str(ROOT / "examples" / "clusters" / "a100_topo1.topo"), "--collective", "allreduce",
                       "-o", str(Path(tmp) / "warm.rccl")])
        asym = tuple(int(x) for x in args.asym.split(",") if x.strip())
        colls = tuple(c.strip() for c in args.collectives.split(",") if c.strip())
        for topo, coll in cases(args.examples, not args.no_512, not args.no_multirail, asym, args.ladder, colls):
            for label, tree in trees:
                cmd = ["synth", topo, "--collective", coll, "-o", str(Path(tmp) / "p.rccl")]
                if args.method is not None:
                    cmd += ["--method", args.method]
                if args.time_limit is not None:
                    cmd += ["--time-limit", str(args.time_limit)]
                r = {"tree": label, "cluster": Path(topo).stem, "collective": coll, **run(tree, cmd)}
                rows.append(r)
                print(f"{r['cluster']:>18} {coll:>13} {label:>5}: {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s CPU "
                      f"{r['peak_mb']:6d} MB  rc {r['rc']}  {r['line'].split(': ', 1)[-1][:150]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
