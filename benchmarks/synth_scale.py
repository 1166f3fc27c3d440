#!/usr/bin/env python3
"""Synthesis at scale: time, steps and lower bounds; simulated busbw against a ring and the cut bound.

    python benchmarks/synth_scale.py                  # everything (a few minutes)
    python benchmarks/synth_scale.py --quick          # the six HeteCCL clusters (V100) and 64 GPUs
    python benchmarks/synth_scale.py --json out.json  # also write the rows as JSON
    python benchmarks/synth_scale.py --end-to-end     # 512 and 1,024 H20 GPUs: synth then compile, vs 120 s
    python benchmarks/synth_scale.py --time-limits    # 512 and 1,024 H20 GPUs under --time-limit 10, vs T + 10 % + 2 s

Rows:
* HeteCCL's six heterogeneous clusters (section 6.1) in both flavours (``examples/clusters/{h20,v100}_*``);
* scaled heterogeneous clusters of 16, 32, 48 and 64 GPUs (mixes of 4- and 8-GPU nodes);
* 128 to 1,024 GPUs: 2 to 16 copies of the 64-GPU cluster, synthesised through hierarchical
  composition (one pod solved, pods as nodes, composed).

Columns: synthesis wall time, steps and the step lower bound (gap = steps - bound) for AllGather and
AllReduce; for the clusters of up to 64 GPUs, when the simulator is available, the simulated busbw at
1 GiB of the synthesised schedule, of an NCCL-style ring (ranks in node order) and ForestColl's cut
bound expressed as a busbw, with the ratios synthesised/ring and synthesised/bound.

``--end-to-end``: AllGather and AllReduce on 64 and 128 nodes of 8 H20 GPUs (512 and 1,024 GPUs,
``examples/clusters/generate.py``'s node) made as a user makes them, each command a fresh process:
``hccc synth CLUSTER --collective C -o x.rccl`` (its defaults) then ``hccc x.rccl -o DIR``. Per case:
the wall seconds and CPU seconds (user + system, its children's included) of each command, and
their sums: the CPU seconds are held to :data:`END_TO_END_TARGET` (what an idle machine takes; on
a shared one the wall seconds grow with the load, and are printed beside them); and the transfers
and method of the program. ``--nodes 64,128`` picks the cluster sizes.

``--time-limits``: AllToAll, Broadcast, AllGather and AllReduce on the same clusters, ``hccc synth
CLUSTER --collective C --time-limit T`` (``--time-limit``, default 10) each a fresh process: its wall
and CPU seconds, its exit status (1: refused with a located reason, which is printed), and whether
the wall time is within what the limit promises, ``T`` + 10 % + 2 s (``budget.overruns``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from hccc.compiler.passes.build import build_program
from hccc.compiler.cluster.topo_parser import format_topology, parse_topology
from hccc.compiler.frontend.generators import ring_allgather, ring_allreduce
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import bandwidth_cut_bound, network_from_topology, synthesize, to_algorithm
from hccc.compiler.passes.verify import verify
from hccc.runtime.busbw import busbw_factor

ROOT = Path(__file__).resolve().parents[1]

SIZE = 1 << 30
HETECCL = ["4_8", "4x2_8", "4x3", "4x3_8", "8x2_4", "4x2_8x2"]
POD64 = [4, 4, 4, 4, 8, 8, 8, 8, 8, 8]
SCALED = {16: [4, 4, 8], 32: [4, 4, 8, 8, 8], 48: [4, 4, 4, 4, 8, 8, 8, 8], 64: POD64}


def _node_builders():
    spec = importlib.util.spec_from_file_location("cluster_gen", ROOT / "examples" / "clusters" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def scaled_cluster(sizes: list[int], flavour: str, name: str):
    """A cluster of 4- and 8-GPU nodes in the V100 or H20 flavour of examples/clusters."""
    return parse_topology(format_topology(scaled_spec(sizes, flavour)), name)


def scaled_spec(sizes: list[int], flavour: str):
    """:func:`scaled_cluster`'s cluster description (a ``ClusterSpec``)."""
    g = _node_builders()
    nodes, k = [], 0
    for s in sizes:
        if flavour == "h20":
            nodes.append(g.h20_node8() if s == 8 else g.h20_node4())
        else:
            nodes.append(g.v100_node8() if s == 8 else g.v100_node4(64 if k % 2 == 0 else 100))
            k += s == 4
    return g.cluster(nodes, f"{sum(sizes)} GPUs")


def _simulator():
    try:
        from hccc.runtime.simulator import simulate
    except ImportError:
        return None
    return simulate


def run_case(topo, label: str, coll: str, time_limit: float, sim, variants: int) -> dict:
    from hccc.commands.synth import simulated_score

    t0 = time.perf_counter()
    # what `hccc synth` does: greedy variants, the simulator choosing among the fewest-step ones
    score = simulated_score(topo, SIZE) if (sim is not None and variants > 1) else None
    res = synthesize(topo, coll, time_limit=time_limit, variants=variants, score=score)
    wall = time.perf_counter() - t0
    row = {"cluster": label, "gpus": topo.nranks, "collective": coll, "seconds": round(wall, 2),
           "steps": res.steps, "lower_bound": res.lower_bound_steps, "gap": res.gap,
           "composed": bool(res.composed), "timed_out": res.timed_out}
    if sim is not None and topo.nranks <= 64:
        alg = to_algorithm(res, topo)
        verify(alg)
        n = topo.nranks
        s = sim(build_program(alg), topo, SIZE, slice_bytes="auto")
        ring = (ring_allgather if coll == "allgather" else ring_allreduce)(n)
        r = sim(build_program(ring), topo, SIZE, slice_bytes="auto")
        cut = bandwidth_cut_bound(network_from_topology(topo), coll, n, 1, 0, SIZE)
        cut_busbw = SIZE / cut / 1e9 * busbw_factor(coll, n)
        row.update({"busbw": round(s.busbw_GBps, 2), "ring_busbw": round(r.busbw_GBps, 2),
                    "cut_busbw": round(cut_busbw, 2), "vs_ring": round(s.busbw_GBps / r.busbw_GBps, 2),
                    "vs_cut": round(s.busbw_GBps / cut_busbw, 3)})
    return row


#: seconds a 1,024-GPU AllGather or AllReduce may take from ``hccc synth`` to compiled kernels on a
#: 2-core machine without a GPU (the target synthesis at scale is held to), counted in CPU seconds
#: (user + system), which a machine shared with other work does not inflate
END_TO_END_TARGET = 120.0
#: the clusters of ``--end-to-end``: nodes of 8 H20 GPUs
END_TO_END_NODES = (64, 128)


def _h20_cluster_text(nodes: int) -> str:
    """``nodes`` 8-GPU H20 nodes as examples/clusters writes them, every pair of nodes through the NICs."""
    spec = importlib.util.spec_from_file_location("cluster_gen", ROOT / "examples" / "clusters" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return format_topology(gen.cluster([gen.h20_node8() for _ in range(nodes)], f"{nodes} x 8 H20"))


def _timed(cmd: list[str]) -> tuple[int, float, float, str, str]:
    """Run ``cmd`` to its end: (exit status, wall seconds, CPU seconds of it and its children,
    stderr's tail, stdout)."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    got = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return got.returncode, wall, cpu, (got.stderr or "").strip()[-400:], got.stdout


def end_to_end(nodes_list, workdir: Path) -> list[dict]:
    """The ``--end-to-end`` rows: synthesised then compiled, each by its own ``hccc`` process."""
    hccc = [sys.executable, "-m", "hccc"]
    rows = []
    for nodes in nodes_list:
        topo = workdir / f"h20_{nodes}x8.topo"
        topo.write_text(_h20_cluster_text(nodes))
        for coll in ("allgather", "allreduce"):
            algo = workdir / f"{coll}_{nodes * 8}.rccl"
            rc_s, wall_s, cpu_s, err_s, out_s = _timed(hccc + ["synth", str(topo), "--collective", coll, "-o", str(algo),
                                                               "--json"])
            row = {"gpus": nodes * 8, "collective": coll, "synth_rc": rc_s, "synth_wall_s": round(wall_s, 1),
                   "synth_cpu_s": round(cpu_s, 1)}
            if rc_s == 0:
                rep = json.loads(out_s)
                row.update({k: rep.get(k) for k in ("method", "transfers", "chunks_per_rank", "timed_out")})
                rc_c, wall_c, cpu_c, err_c, _ = _timed(hccc + [str(algo), "-o", str(workdir / f"{coll}_{nodes * 8}")])
                row.update({"compile_rc": rc_c, "compile_wall_s": round(wall_c, 1), "compile_cpu_s": round(cpu_c, 1)})
                if rc_c:
                    row["error"] = err_c
            else:
                row["error"] = err_s
            row["total_wall_s"] = round(row["synth_wall_s"] + row.get("compile_wall_s", 0.0), 1)
            row["total_cpu_s"] = round(row["synth_cpu_s"] + row.get("compile_cpu_s", 0.0), 1)
            row["within_target"] = rc_s == 0 and row.get("compile_rc") == 0 and row["total_cpu_s"] <= END_TO_END_TARGET
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def time_limits(nodes_list, limit: float, workdir: Path) -> list[dict]:
    """The ``--time-limits`` rows: each collective under ``--time-limit limit``, its own process."""
    from hccc.compiler.synth.budget import OVERRUN_FRACTION, OVERRUN_SECONDS

    hccc = [sys.executable, "-m", "hccc"]
    promise = limit * (1 + OVERRUN_FRACTION) + OVERRUN_SECONDS
    rows = []
    for nodes in nodes_list:
        topo = workdir / f"h20_{nodes}x8.topo"
        topo.write_text(_h20_cluster_text(nodes))
        for coll in ("alltoall", "broadcast", "allgather", "allreduce"):
            load = _load()
            rc, wall, cpu, err, _ = _timed(hccc + ["synth", str(topo), "--collective", coll, "--time-limit", f"{limit:g}",
                                                   "-o", str(workdir / f"{coll}_{nodes * 8}.rccl")])
            row = {"gpus": nodes * 8, "collective": coll, "time_limit": limit, "rc": rc, "wall_s": round(wall, 2),
                   "cpu_s": round(cpu, 2), "load": load, "within": wall <= promise}
            if rc:
                row["refusal"] = err.splitlines()[-1] if err else ""
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _load() -> float | None:
    import os
    try:
        return round(os.getloadavg()[0], 1)
    except (AttributeError, OSError):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="V100 HeteCCL clusters and 64 GPUs only")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per synthesis (default 10)")
    ap.add_argument("--max-gpus", type=int, default=1024, help="largest composed cluster (default 1024)")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated busbw columns")
    ap.add_argument("--variants", type=int, default=3, help="greedy variants per phase (default 3, as hccc synth)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    ap.add_argument("--end-to-end", action="store_true",
                    help=f"512 and 1,024 H20 GPUs: hccc synth then hccc compile, against {END_TO_END_TARGET:g} s")
    ap.add_argument("--nodes", default=",".join(map(str, END_TO_END_NODES)),
                    help="--end-to-end's clusters, in nodes of 8 GPUs (default 64,128)")
    ap.add_argument("--time-limits", action="store_true",
                    help="512 and 1,024 H20 GPUs, every collective, hccc synth --time-limit (default 10) against "
                         "T + 10 %% + 2 s of wall time")
    args = ap.parse_args(argv)
    if args.time_limits:
        import tempfile

        nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
        with tempfile.TemporaryDirectory(prefix="hccc_synth_limits_") as d:
            rows = time_limits(nodes, args.time_limit, Path(d))
        for r in rows:
            print(f"{r['gpus']:5d} GPUs {r['collective']:10s} --time-limit {r['time_limit']:g}: {r['wall_s']:6.1f} s wall "
                  f"({r['cpu_s']:.1f} CPU, load {r['load']}), rc {r['rc']}  {'within' if r['within'] else 'OVER'}"
                  + (f"  {r['refusal']}" if r.get("refusal") else ""))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0 if all(r["within"] for r in rows) else 1
    if args.end_to_end:
        import tempfile

        nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
        with tempfile.TemporaryDirectory(prefix="hccc_synth_scale_") as d:
            rows = end_to_end(nodes, Path(d))
        for r in rows:
            print(f"{r['gpus']:5d} GPUs {r['collective']:10s} synth {r['synth_wall_s']:6.1f} s wall "
                  f"({r['synth_cpu_s']:.1f} CPU)  compile {r.get('compile_wall_s', float('nan')):6.1f} s wall "
                  f"({r.get('compile_cpu_s', float('nan')):.1f} CPU)  total {r['total_cpu_s']:6.1f} CPU s "
                  f"({r['total_wall_s']:.1f} s wall)  "
                  f"{'within' if r['within_target'] else 'OVER'} {END_TO_END_TARGET:g} s"
                  + (f"  error: {r['error']}" if "error" in r else ""))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0 if all(r["within_target"] for r in rows) else 1
    sim = None if args.no_sim else _simulator()
    cases = []
    flavours = ["v100"] if args.quick else ["h20", "v100"]
    for fl in flavours:
        for lab in HETECCL:
            cases.append((f"{fl}_{lab}", lambda fl=fl, lab=lab: load_cluster(ROOT / "examples" / "clusters" / f"{fl}_{lab}.topo")))
    for n, sizes in SCALED.items():
        if args.quick and n != 64:
            continue
        cases.append((f"scaled_{n}", lambda sizes=sizes, n=n: scaled_cluster(sizes, "v100", f"scaled_{n}")))
    if not args.quick:
        for copies in (2, 4, 8, 16):
            n = 64 * copies
            if n > args.max_gpus:
                break
            cases.append((f"pods_{n}", lambda copies=copies, n=n: scaled_cluster(POD64 * copies, "v100", f"pods_{n}")))
    rows = []
    for label, make in cases:
        topo = make()
        for coll in ("allgather", "allreduce"):
            row = run_case(topo, label, coll, args.time_limit, sim, args.variants)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    _print_table(rows, sim is not None)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _print_table(rows, with_sim: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="hccc synth: synthesis time, steps vs lower bound; simulated busbw at 1 GiB (GB/s)")
    cols = ["cluster", "GPUs", "collective", "time (s)", "steps", "bound", "gap"]
    if with_sim:
        cols += ["busbw", "ring", "cut bound", "x ring", "of bound"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("cluster", "collective") else "right")
    for r in rows:
        cells = [r["cluster"] + (" (composed)" if r["composed"] else ""), str(r["gpus"]), r["collective"],
                 f"{r['seconds']:.2f}" + ("*" if r["timed_out"] else ""), str(r["steps"]), str(r["lower_bound"]),
                 str(r["gap"])]
        if with_sim:
            if "busbw" in r:
                cells += [f"{r['busbw']:.1f}", f"{r['ring_busbw']:.1f}", f"{r['cut_busbw']:.1f}",
                          f"{r['vs_ring']:.2f}", f"{100 * r['vs_cut']:.0f}%"]
            else:
                cells += [""] * 5
        t.add_row(*cells)
    Console(width=180).print(t)
    print("* time limit reached (best schedule so far); cut bound = first-principles cut bound, docs/bounds.md (AllReduce: "
          "the whole buffer across the narrowest cut)")


if __name__ == "__main__":
    sys.exit(main())
