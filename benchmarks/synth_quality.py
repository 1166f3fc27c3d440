#!/usr/bin/env python3
"""Synthesis quality against the optimum: every example cluster and generated multi-rail clusters.

    python benchmarks/synth_quality.py                      # example clusters + 64 H800s (minutes)
    python benchmarks/synth_quality.py --clusters h20_4_8   # some example clusters only
    python benchmarks/synth_quality.py --multirail 8,64     # multi-rail clusters of 8 and 64 nodes x 8
    python benchmarks/synth_quality.py --json out.json      # also write the rows as JSON
    python benchmarks/synth_quality.py --clusters '' --multirail 8,64 --collectives allgather --sim-large
                                                            # 64 and 512 H800s, the 512 simulated apart
    python benchmarks/synth_quality.py --clusters '' --multirail '' --hetero h20,v100
                                                            # 64 GPUs in nodes of two kinds
    python benchmarks/synth_quality.py --clusters '' --multirail '' --mi250 2,4
                                                            # 32 and 64 MI250 GCDs (ForestColl's cluster)
    python benchmarks/synth_quality.py --clusters '' --multirail '' --random 1,2,3,4,5,6
                                                            # seeded random clusters of AMD nodes
    python benchmarks/synth_quality.py --clusters '' --multirail '' --mixed 1,2,3,4,5,6
                                                            # seeded mixed clusters (vendors, sizes, links)
    python benchmarks/synth_quality.py --clusters '' --multirail '' --asym 1,2
                                                            # seeded asymmetric 64-GPU clusters
    python benchmarks/synth_quality.py --clusters '' --multirail '' --shapes all
                                                            # meshes, rings, hypercubes, tori (SHAPES)

Every row is one ``hccc synth --json`` run in a process of its own (so its peak memory is its own),
at 1 GiB, by the method ``--method`` names (default ``trees``). Columns:

* ``opt busbw``: the optimum as nccl-tests' busbw (GB/s): the cut bound of docs/bounds.md, which
  the tree packing's LP meets on these clusters (``LP = bound`` column);
* ``sim``: the synthesised program simulated by hccc's simulator at 1 GiB (per-block limit on,
  the program's own channels), as a fraction of the optimum; AllReduce also against its bound for
  any schedule (``AR bound``) and against ReduceScatter + AllGather's optimum (``RS+AG``);
* ``model``: the packing's own time in the link model (integral chunks) as a fraction of the bound;
* ``K``, ``ch``: chunks per rank and blocks per thread block (``nChannels``) of the program;
  ``method``: what ``auto`` kept; ``slice``: the least slice of its slice policy in KiB (64: hccc's
  default; less where ``synth`` gave its thin streams smaller slices, ``MinSliceBytes``);
* ``TBs``, ``blocks``: thread blocks of the busiest rank in the compiled program, and its blocks
  (x ``nChannels``), which must all be resident at once (up to 128 GPUs; ``-`` past that);
* ``wall``: seconds of the whole ``hccc synth`` run (packing, simulated shapes, channel fitting);
  ``peak MB``: the process's peak resident memory.

Multi-rail clusters: 8 H800s per node on an NVSwitch (900 GB/s per GPU), one 400 Gb/s NIC per GPU,
every pair of nodes through the NICs. Heterogeneous clusters (``--hetero``, default none):
benchmarks/synth_scale.py's 64 GPUs in 4 nodes of 4 and 6 of 8, in its H20 or V100 flavour.
MI250 clusters (``--mi250``, default none): the cluster ForestColl's paper evaluates on, nodes of
eight MI250s (16 GCDs) joined by 1, 2 or 4 xGMI links of 50 GB/s each way (the two GCDs
of a package by 4), each GCD with a 16 GB/s NIC, every pair of nodes through the NICs.
Random clusters (``--random SEEDS``, default none): per seed, 2-6 identical nodes of 4-8 AMD GPUs
(the seed draws the counts), a ring inside each node and each other pair linked with probability
0.4, every link 25 or 50 GB/s with 1 or 2 lanes, a 50 GB/s NIC per GPU, every pair of nodes through
the NICs: clusters no one tuned for, where the thread blocks an AMD GPU keeps resident (fewer than
an H100) and the slice floor bind.
Mixed clusters (``--mixed SEEDS``, default none): per seed, 2-5 nodes, alike (probability 0.4)
or each drawn apart: NVIDIA or AMD, and one of two kinds, drawn per cluster. Half the seeds have
fast NICs (50 or 100 GB/s) on nodes of 4-8 GPUs with sparse direct links (a ring and each other pair
with probability 0.3; 16-100 GB/s, 1 or 2 lanes, one direction in five slower than the other), a
NIC per GPU or per two, so that the links inside the nodes bind. The other half have nodes of 1-8
GPUs on a switch (100, 200 or 300 GB/s each way of each pair, drawn apart) or on such direct links,
and 12.5-50 GB/s NICs per GPU, per two or per node. Every pair of nodes talks through the NICs.
Asymmetric clusters (``--asym SEEDS``, default none): per seed, 64 GPUs in nodes of 2, 4, 6 or 8
(the last one what is left), each node drawn apart: NVIDIA or AMD, a ring and each other pair
linked with probability 0.4 at 25-150 GB/s (1 or 2 lanes, one direction in five slower), a 12.5, 25
or 50 GB/s NIC per GPU or per two; the held-out clusters of the speed targets (no symmetry to reduce).
Regular clusters (``--shapes NAME,...`` or ``all``, default none): full meshes, rings, hypercubes,
tori and unequal nodes of two vendors (:data:`SHAPES`), the kinds of cluster ForestColl's and the
issue's comparisons use, none tuned for.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1 << 30


def multirail_text(nodes: int, gpn: int = 8, nvswitch_gbps: float = 900.0, nic_gbits: float = 400.0) -> str:
    """A multi-rail cluster in the .topo language (see the module docstring)."""
    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, NicSpec, NodeSpec, SharedSpec, format_topology

    lanes = 9
    switch = [SharedSpec((g,), tuple(x for x in range(gpn) if x != g), nvswitch_gbps / lanes, lanes) for g in range(gpn)]
    node = NodeSpec(gpn, {"switch": switch}, nics=[NicSpec((g,), nic_gbits / 8) for g in range(gpn)],
                    vendor="nvidia", gpu="H800")
    return format_topology(ClusterSpec([node] * nodes, [InternodeSpec("all", "nic")],
                                       comment=f"{nodes} x {gpn} H800, NVSwitch, one 400 Gb/s NIC per GPU"))


#: xGMI links between the 16 GCDs of an 8 x MI250 node (GCD a, GCD b, links; both directions): the
#: two GCDs of a package by 4 links, the others by 2 or 1
MI250_XGMI = ((0, 1, 4), (0, 4, 2), (0, 8, 1), (1, 5, 1), (1, 9, 1), (1, 10, 1), (2, 3, 4), (2, 6, 1), (2, 9, 1),
              (2, 10, 1), (3, 7, 2), (3, 11, 1), (4, 5, 4), (4, 6, 1), (5, 6, 1), (5, 7, 1), (6, 7, 4),
              (8, 9, 4), (8, 12, 2), (9, 13, 1), (10, 11, 4), (10, 14, 1), (11, 15, 2), (12, 13, 4), (12, 14, 1),
              (13, 14, 1), (13, 15, 1), (14, 15, 4))


def mi250_text(nodes: int, xgmi_gbps: float = 50.0, nic_gbps: float = 16.0) -> str:
    """A cluster of ``nodes`` nodes of 8 MI250s (16 GCDs) in the .topo language (module docstring)."""
    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, format_topology

    links = [LinkSpec(x, y, xgmi_gbps, k) for a, b, k in MI250_XGMI for x, y in ((a, b), (b, a))]
    node = NodeSpec(16, {"direct": links}, nics=[NicSpec((g,), nic_gbps) for g in range(16)], vendor="amd",
                    gpu="MI250")
    return format_topology(ClusterSpec([node] * nodes, [InternodeSpec("all", "nic")],
                                       comment=f"{nodes} x 8 MI250 (16 GCDs each), xGMI, one {nic_gbps:g} GB/s NIC per GCD"))


def random_text(seed: int) -> str:
    """The random cluster of ``seed`` (module docstring) in the .topo language: the same text for a
    seed on every machine (its own ``random.Random``)."""
    import random

    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, format_topology

    rng = random.Random(seed)
    nodes, gpn = rng.randint(2, 6), rng.choice([4, 6, 8])
    links = []
    for a in range(gpn):
        for b in range(a + 1, gpn):
            if b == a + 1 or (a == 0 and b == gpn - 1) or rng.random() < 0.4:
                bw, lanes = rng.choice([25.0, 50.0]), rng.choice([1, 1, 2])
                links += [LinkSpec(a, b, bw, lanes), LinkSpec(b, a, bw, lanes)]
    node = NodeSpec(gpn, {"direct": links}, nics=[NicSpec((g,), 50.0) for g in range(gpn)], vendor="amd", gpu="MI250")
    return format_topology(ClusterSpec([node] * nodes, [InternodeSpec("all", "nic")],
                                       comment=f"random cluster {seed}: {nodes} x {gpn} AMD GPUs, a 50 GB/s NIC each"))


def one(topo: str, collective: str, method: str, time_limit: float, sim_large: bool = False) -> dict:
    """``hccc synth`` in this process; its summary, wall time and peak memory. With ``sim_large``,
    a program ``synth`` did not simulate (past its size limit) is simulated by ``hccc sim`` in a
    process of its own (wall time and peak memory of that process reported apart)."""
    import contextlib
    import io

    from hccc.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        buf = io.StringIO()
        algo = Path(tmp) / "p.rccl"
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            rc = main(["synth", topo, "--collective", collective, "--method", method, "--size", str(SIZE),
                       "--time-limit", str(time_limit), "-o", str(algo), "--json"])
        wall = time.perf_counter() - t0
        out = {"rc": rc, "wall_s": wall, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if rc == 0:
            out["summary"] = json.loads(buf.getvalue())
            if out["summary"]["nranks"] <= TBS_MAX_RANKS:
                out["tbs"] = thread_blocks(algo)
            if sim_large and out["summary"].get("fraction_of_bound") is None:
                out["large_sim"] = simulate_apart(algo, topo)
    return out


#: thread blocks per rank are counted (by compiling the program) up to this many GPUs
TBS_MAX_RANKS = 128


def thread_blocks(algo: Path) -> dict:
    """Thread blocks of the compiled program: the busiest rank's thread blocks, and its blocks
    (thread blocks x the program's blocks per thread block, ``nChannels``), which must all be
    resident on the GPU at once."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.passes.channels import most_tbs
    from hccc.compiler.pipeline.readers import load_algorithm

    alg = load_algorithm(algo)
    ir = build_program(alg)
    return {"tbs": most_tbs(ir), "blocks": most_tbs(ir) * int(alg.header.nchannels)}


def simulate_apart(algo: Path, topo: str) -> dict:
    """``hccc sim ALGO --topology TOPO --sizes SIZE`` in a process of its own: the simulated
    seconds, the lines of the program, the wall time and the peak memory of that process."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "hccc", "sim", str(algo), "--topology", topo, "--sizes", str(SIZE),
                        "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-300:]}
    res = json.loads(p.stdout)["results"][0]
    return {"seconds": res["time_us"] * 1e-6, "wall_s": wall, "lines": algo.read_text().count("\n"),
            "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def row(name: str, topo: str, collective: str, method: str, time_limit: float, sim_large: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--one", topo, collective, method, str(time_limit)] + (["--sim-large"] if sim_large else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        return {"cluster": name, "collective": collective, "error": (p.stderr or p.stdout).strip()[-300:]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        return {"cluster": name, "collective": collective, "error": f"hccc synth exit {r['rc']}"}
    s = r["summary"]
    b = s["bandwidth_bound"]
    tr = (s.get("trees") or {})
    model = min((t["model_fraction"] for t in tr.values()), default=None)
    lp_at_bound = all(t["lp_seconds_per_byte"] <= t["bound_seconds_per_byte"] * (1 + 1e-3) for t in tr.values()) \
        if tr else None
    big = r.get("large_sim") or {}
    sim = s["fraction_of_bound"]
    if sim is None and big.get("seconds"):
        sim = b["seconds"] / big["seconds"]
    return {"cluster": name, "nranks": s["nranks"], "collective": collective, "method": s["method"],
            "opt_busbw": b["busbw_GBps"], "sim": sim, "model": model, "lp_at_bound": lp_at_bound,
            "sim_apart_wall_s": big.get("wall_s"), "sim_apart_peak_mb": big.get("peak_mb"), "lines": big.get("lines"),
            "ar_bound": b.get("fraction_of_allreduce_bound"), "rs_ag": b.get("fraction_of_rs_ag"),
            "K": s["chunks_per_rank"], "channels": s["channels"],
            "slice_kib": (s.get("slicing") or {}).get("min_slice_bytes", 65536) // 1024,
            "tbs": (r.get("tbs") or {}).get("tbs"), "blocks": (r.get("tbs") or {}).get("blocks"), "wall_s": r["wall_s"], "peak_mb": r["peak_mb"]}


def fmt(v, f="{:.3f}") -> str:
    return "-" if v is None else (f.format(v) if not isinstance(v, bool) else ("yes" if v else "NO"))


def _mixed_node(rng, tight: bool):
    """One node of :func:`mixed_text`: its GPU count, vendor, links inside and NICs."""
    from hccc.compiler.cluster.topo_parser import LinkSpec, NicSpec, NodeSpec

    gpn = rng.choice([4, 6, 8]) if tight else rng.choice([1, 2, 3, 4, 4, 6, 8, 8])
    vendor = rng.choice(["nvidia", "amd"])
    kind = "direct" if tight else rng.choice(["switch", "direct", "direct"])
    links = []
    if kind == "switch":
        links = [LinkSpec(a, b, rng.choice([100.0, 200.0, 300.0])) for a in range(gpn) for b in range(gpn) if a != b]
    else:
        for a in range(gpn):
            for b in range(a + 1, gpn):
                if b == a + 1 or (a == 0 and b == gpn - 1) or rng.random() < 0.3:
                    bw, lanes = rng.choice([16.0, 25.0, 50.0, 100.0]), rng.choice([1, 1, 2])
                    back = bw if rng.random() < 0.8 else rng.choice([16.0, 25.0, 50.0])   # one way slower
                    links += [LinkSpec(a, b, bw, lanes), LinkSpec(b, a, back, lanes)]
    share = rng.choice([1, 1, 2]) if tight else rng.choice([1, 1, 2, gpn])
    nic = rng.choice([50.0, 100.0]) if tight else rng.choice([12.5, 25.0, 50.0])
    nics = [NicSpec(tuple(range(g, min(gpn, g + share))), nic) for g in range(0, gpn, share)]
    return NodeSpec(gpn, {kind: links} if links else None, nics=nics, vendor=vendor,
                    gpu="MI250" if vendor == "amd" else "A100")


def mixed_text(seed: int) -> str:
    """The mixed cluster of ``seed`` (module docstring) in the .topo language: the same text for a
    seed on every machine (its own ``random.Random``)."""
    import random

    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, format_topology

    rng = random.Random(seed)
    tight = rng.random() < 0.5
    nodes = rng.randint(2, 5)
    alike = rng.random() < 0.4
    first = _mixed_node(rng, tight)
    specs = [first if alike or i == 0 else _mixed_node(rng, tight) for i in range(nodes)]
    return format_topology(ClusterSpec(specs, [InternodeSpec("all", "nic")],
                                       comment=f"mixed cluster {seed}: {nodes} nodes, "
                                               f"{'fast NICs, direct links' if tight else 'any links and NICs'}"))


#: GPUs of an ``--asym`` cluster: issue 71's size for the speed targets
ASYM_GPUS = 64


def asym_text(seed: int) -> str:
    """The asymmetric 64-GPU cluster of ``seed`` (module docstring) in the .topo language: the same
    text for a seed on every machine (its own ``random.Random``). Every node is drawn apart (size,
    links, NIC speed), so that no two nodes are alike and symmetry reduction does not apply."""
    import random

    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, format_topology

    rng = random.Random(seed)
    sizes, left = [], ASYM_GPUS
    while left:
        gpn = min(left, rng.choice([2, 4, 6, 8]))
        sizes.append(gpn)
        left -= gpn
    specs = []
    for gpn in sizes:
        links = []
        for a in range(gpn):
            for b in range(a + 1, gpn):
                if b == a + 1 or (a == 0 and b == gpn - 1) or rng.random() < 0.4:
                    bw, lanes = rng.choice([25.0, 50.0, 100.0, 150.0]), rng.choice([1, 1, 2])
                    back = bw if rng.random() < 0.8 else rng.choice([25.0, 50.0])   # one way slower
                    links += [LinkSpec(a, b, bw, lanes), LinkSpec(b, a, back, lanes)]
        share = rng.choice([1, 1, 2])
        nic = rng.choice([12.5, 25.0, 50.0])
        nics = [NicSpec(tuple(range(g, min(gpn, g + share))), nic) for g in range(0, gpn, share)]
        vendor = rng.choice(["nvidia", "amd"])
        specs.append(NodeSpec(gpn, {"direct": links}, nics=nics, vendor=vendor,
                              gpu="MI250" if vendor == "amd" else "A100"))
    return format_topology(ClusterSpec(specs, [InternodeSpec("all", "nic")],
                                       comment=f"asymmetric cluster {seed}: {len(sizes)} nodes drawn apart, "
                                               f"{ASYM_GPUS} GPUs"))


def _both_ways(pairs, bw: float, lanes: int = 1) -> list:
    from hccc.compiler.cluster.topo_parser import LinkSpec

    return [LinkSpec(x, y, bw, lanes) for a, b in pairs for x, y in ((a, b), (b, a))]


def _shape_nodes(name: str) -> list:
    """The nodes of the regular cluster ``name`` (:data:`SHAPES`)."""
    from hccc.compiler.cluster.topo_parser import NicSpec, NodeSpec

    def node(n, links, nics=None, vendor="nvidia", gpu="A100"):
        return NodeSpec(n, {"direct": links}, nics=nics, vendor=vendor, gpu=gpu)

    mesh8 = _both_ways([(a, b) for a in range(8) for b in range(a + 1, 8)], 25.0)
    ring8 = _both_ways([(a, (a + 1) % 8) for a in range(8)], 50.0, 2)
    cube8 = _both_ways([(a, a ^ (1 << k)) for a in range(8) for k in range(3) if a < a ^ (1 << k)], 50.0)
    torus16 = _both_ways(sorted({tuple(sorted((r * 4 + c, (r + dr) % 4 * 4 + (c + dc) % 4)))
                                 for r in range(4) for c in range(4) for dr, dc in ((0, 1), (1, 0))}), 50.0)
    nic8 = [NicSpec((g,), 25.0) for g in range(8)]
    return {
        "mesh8": lambda: [node(8, mesh8)],
        "mesh8x2": lambda: [node(8, mesh8, nic8)] * 2,
        "ring8x2": lambda: [node(8, ring8, [NicSpec((g, g + 1), 25.0) for g in range(0, 8, 2)])] * 2,
        "cube8x3": lambda: [node(8, cube8, nic8)] * 3,
        "torus16": lambda: [node(16, torus16)],
        "torus16x2": lambda: [node(16, torus16, [NicSpec((g,), 12.5) for g in range(16)])] * 2,
        "asym842": lambda: [node(8, mesh8, nic8),
                            node(4, _both_ways([(a, b) for a in range(4) for b in range(a + 1, 4)], 50.0, 2),
                                 [NicSpec((0, 1), 25.0), NicSpec((2, 3), 12.5)], "amd", "MI100"),
                            node(2, _both_ways([(0, 1)], 50.0, 4), [NicSpec((0,), 50.0), NicSpec((1,), 50.0)],
                                 "amd", "MI250")],
    }[name]()


#: regular clusters (``--shapes``): an 8-GPU full mesh of 25 GB/s links, alone and two of them; two
#: 8-GPU rings (2 x 50 GB/s) with a NIC per pair; three 8-GPU hypercubes; a 4 x 4 torus of 50 GB/s
#: links, alone and two of them on 12.5 GB/s NICs; nodes of 8, 4 and 2 GPUs of two vendors with
#: unequal NICs. 25 GB/s NICs per GPU unless said; every pair of nodes through the NICs.
SHAPES = ("mesh8", "mesh8x2", "ring8x2", "cube8x3", "torus16", "torus16x2", "asym842")


def shape_text(name: str) -> str:
    """The regular cluster ``name`` (:data:`SHAPES`) in the .topo language."""
    from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, format_topology

    nodes = _shape_nodes(name)
    return format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")] if len(nodes) > 1 else [],
                                       comment=f"regular cluster {name}"))


def hetero_text(flavour: str) -> str:
    """benchmarks/synth_scale.py's 64-GPU cluster of 4- and 8-GPU nodes, as .topo text."""
    import importlib.util

    from hccc.compiler.cluster.topo_parser import format_topology

    spec = importlib.util.spec_from_file_location("synth_scale", ROOT / "benchmarks" / "synth_scale.py")
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    return format_topology(scale.scaled_spec(scale.POD64, flavour))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=4, metavar=("TOPO", "COLL", "METHOD", "LIMIT"), help=argparse.SUPPRESS)
    ap.add_argument("--clusters", default=None, help="example clusters (names without .topo, comma-separated; '' for none)")
    ap.add_argument("--multirail", default="8", help="multi-rail cluster sizes in nodes of 8 GPUs (default 8, "
                                                     "i.e. 64 GPUs; '' for none)")
    ap.add_argument("--hetero", default="", help="flavours (h20, v100; comma-separated) of synth_scale.py's "
                                                 "64 GPUs in nodes of two kinds (default none)")
    ap.add_argument("--mi250", default="", help="MI250 cluster sizes in nodes of 16 GCDs (comma-separated; "
                                                "default none)")
    ap.add_argument("--random", default="", help="seeds of random clusters of AMD nodes (comma-separated; "
                                                 "default none; see the module docstring)")
    ap.add_argument("--mixed", default="", help="seeds of mixed clusters (vendors, node sizes, links, NICs; "
                                                "comma-separated; default none; see the module docstring)")
    ap.add_argument("--asym", default="", help="seeds of asymmetric 64-GPU clusters (every node drawn apart; "
                                               "comma-separated; default none; see the module docstring)")
    ap.add_argument("--shapes", default="", help="regular clusters (comma-separated, or 'all': "
                                                 + ", ".join(SHAPES) + "; default none; see SHAPES)")
    ap.add_argument("--collectives", default="allgather,reducescatter,allreduce")
    ap.add_argument("--method", default="trees", choices=("trees", "auto", "search"))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--sim-large", action="store_true",
                    help="simulate with hccc sim, in a process of its own, the programs synth does not simulate "
                         "(over 128 GPUs; minutes each at 512): their 'sim' column, and the 'sim wall'/'sim MB' "
                         "columns (the simulation's wall time and peak memory)")
    args = ap.parse_args()
    if args.one:
        topo, coll, method, limit = args.one
        print(json.dumps(one(topo, coll, method, float(limit), args.sim_large)))
        return 0
    cases = []
    names = ([c for c in args.clusters.split(",") if c] if args.clusters is not None else
             sorted(p.stem for p in (ROOT / "examples/clusters").glob("*.topo")))
    for name in names:
        cases.append((name, str(ROOT / "examples/clusters" / f"{name}.topo")))
    flavours = [x.strip() for x in args.hetero.split(",") if x.strip()]
    for flavour in flavours:
        if flavour not in ("h20", "v100"):
            ap.error(f"--hetero: unknown flavour {flavour!r} (h20, v100)")

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    shapes = list(SHAPES) if args.shapes.strip() == "all" else [x.strip() for x in args.shapes.split(",") if x.strip()]
    for shape in shapes:
        if shape not in SHAPES:
            ap.error(f"--shapes: unknown cluster {shape!r} ({', '.join(SHAPES)})")

    # generated clusters: (the values asked for, the cluster's name, its .topo text of a value)
    generated = [(ints(args.multirail), "h800_multirail_{}x8", multirail_text), (flavours, "hetero64_{}", hetero_text),
                 (ints(args.mi250), "mi250_{}x16", mi250_text), (ints(args.random), "random_{}", random_text),
                 (ints(args.mixed), "mixed_{}", mixed_text),
                 (ints(args.asym), "asym64_{}", asym_text), (shapes, "{}", shape_text)]
    tmp = tempfile.TemporaryDirectory()
    for values, name, text in generated:
        for value in values:
            path = Path(tmp.name) / f"{name.format(value)}.topo"
            path.write_text(text(value))
            cases.append((path.stem, str(path)))
    rows = []
    head = (f"{'cluster':24s} {'N':>4s} {'collective':13s} {'method':6s} {'opt busbw':>9s} {'sim':>6s} {'AR bound':>8s} "
            f"{'RS+AG':>6s} {'model':>6s} {'LP=bound':>8s} {'K':>3s} {'ch':>3s} {'slice':>5s} {'TBs':>4s} {'blocks':>6s} {'wall s':>7s} {'peak MB':>7s}"
            + (f" {'sim wall':>8s} {'sim MB':>7s}" if args.sim_large else ""))
    print(head)
    print("-" * len(head))
    for name, topo in cases:
        for coll in args.collectives.split(","):
            r = row(name, topo, coll, args.method, args.time_limit, args.sim_large)
            rows.append(r)
            if "error" in r:
                print(f"{name:24s} {'':>4s} {coll:13s} error: {r['error']}", flush=True)
                continue
            print(f"{name:24s} {r['nranks']:4d} {coll:13s} {r['method']:6s} {r['opt_busbw']:9.1f} {fmt(r['sim']):>6s} "
                  f"{fmt(r['ar_bound']):>8s} {fmt(r['rs_ag']):>6s} {fmt(r['model']):>6s} {fmt(r['lp_at_bound'], ''):>8s} "
                  f"{r['K']:3d} {r['channels']:3d} {r['slice_kib']:5d} {fmt(r['tbs'], '{:d}'):>4s} {fmt(r['blocks'], '{:d}'):>6s} {r['wall_s']:7.1f} {r['peak_mb']:7.0f}"
                  + (f" {fmt(r['sim_apart_wall_s'], '{:.0f}'):>8s} {fmt(r['sim_apart_peak_mb'], '{:.0f}'):>7s}"
                     if args.sim_large else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
