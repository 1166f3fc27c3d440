"""ResCCL's evaluation, simulated: bandwidth, scheduler and TB-utilisation comparisons on A100 Topo1-4.

    python benchmarks/resccl_eval.py [--out benchmarks/out/resccl_eval] [--sizes 8M..4G]
                                     [--topos 1,2,3,4] [--scale-nodes 128] [--skip-scale] [--quick]

For each cluster ``examples/clusters/a100_topo{1..4}.topo`` (2 or 4 servers of 4 or 8 A100s) and each
algorithm (HM AllGather, HM AllReduce, and the ring AllGather / AllReduce baselines) it simulates, over
buffer sizes from 8 MB to 4 GB (``hccc.runtime.simulator``, alpha-beta-gamma model with its per-block
limit; every program runs with the channels ``hccc ALGO -o`` gives it there, ``--channels auto``):

* ``hccc``        task-level execution, HPDS, state-based TBs (what ``hccc ALGO`` emits);
* ``rr``          task-level execution, round-robin scheduler (ResCCL section 5.3's baseline);
* ``conn``        task-level execution, HPDS, connection-based TBs;
* ``fuse``        as ``hccc`` but lowered with receive-and-forward fusion (``--fuse``; fused traffic on
                  channels and TBs of its own, one per connection pair);
* ``msccl``       algorithm-level execution (every micro-batch runs the whole algorithm in step
                  order) on connection-based TBs: the MSCCL-like baseline.

It writes ``report.md`` with the busbw tables (Fig. 6/8's shape), HPDS vs RR speed-ups (Fig. 10b),
TB counts and idle ratios (Table 3: #TB, comm time, avg idle, max idle), and the simulation wall time
of HM AllReduce at 1,024 GPUs (128 x 8 A100, target: at most 60 s for one size); plus PNG plots next to
it. The same tables are printed with rich. Everything is deterministic.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hccc.compiler.frontend import generators as gen
from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.pipeline import CompileOptions, apply_channels, platforms_for
from hccc.runtime.simulator import build_for_execution, prepare, simulate

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {1: (2, 4), 2: (2, 8), 3: (4, 4), 4: (4, 8)}   # Topo k: nodes x GPUs per node
CONFIGS = {  # name -> (execution, scheduler, tb_alloc, fuse, label)
    "hccc": ("task", "hpds", "state", False, "task-level, HPDS, state-based TBs"),
    "rr": ("task", "rr", "state", False, "task-level, round-robin, state-based TBs"),
    "conn": ("task", "hpds", "connection", False, "task-level, HPDS, connection-based TBs"),
    "fuse": ("task", "hpds", "state", True, "as hccc, with receive-and-forward fusion (--fuse)"),
    "msccl": ("algorithm", "hpds", "connection", False, "algorithm-level (step order), connection-based TBs"),
}
ALGOS = {
    "HM AllGather": lambda n, g: gen.hm_allgather(n, g),
    "HM AllReduce": lambda n, g: gen.hm_allreduce(n, g),
    "Ring AllGather": lambda n, g: gen.ring_allgather(n * g),
    "Ring AllReduce": lambda n, g: gen.ring_allreduce(n * g),
}
TABLE3_SIZE = 1 << 30
MiB = 1 << 20


def human(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def parse_sizes(text: str) -> list[int]:
    """``8M..4G`` (powers of two between) or a comma list ``8M,64M,1G``."""
    from hccc.args import parse_size

    if ".." in text:
        lo, hi = (parse_size(x) for x in text.split(".."))
        out = []
        s = lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    return [parse_size(x) for x in text.split(",") if x.strip()]


def a100_cluster_text(nnodes: int, g: int = 8) -> str:
    """Cluster DSL for ``nnodes`` A100 servers like Topo4's: NVSwitch (12 x 25 GB/s per GPU each
    way), 200 Gbps NICs shared by GPU pairs, every pair of servers connected through the NICs."""
    lines = [f"# {nnodes} x {g} A100 (ResCCL testbed servers)", f"define nodenum = {nnodes}",
             "define chunksize = 1M"]
    sw = ", ".join(f"((({i}),({','.join(str(j) for j in range(g) if j != i)})) >-> (25,12))" for i in range(g))
    nic = ", ".join(f"(({a},{a + 1}) -> (25,1))" for a in range(0, g, 2))
    for k in range(1, nnodes + 1):
        lines += [f"define node{k} = {g}", "define vendor = nvidia", "define gpu = A100-SXM4-80GB",
                  "define gamma = 650", f"define bandwidth = {{switch => [{sw}]}}", f"define nic = [{nic}]"]
    lines += ["define internode = all", "define interbandwidth = nic"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- measurements
def evaluate(topos: list[int], sizes: list[int], console: Console) -> dict:
    """busbw per (topo, algo, config, size) and TB metrics at TABLE3_SIZE."""
    data: dict = {"sizes": sizes, "runs": {}, "tb": {}, "slice": {}}
    for k in topos:
        nn, g = SHAPES[k]
        topo = load_cluster(ROOT / "examples" / "clusters" / f"a100_topo{k}.topo")
        for aname, make in ALGOS.items():
            alg = make(nn, g)
            for cname, (ex, sch, tba, fuse, _) in CONFIGS.items():
                t0 = time.perf_counter()
                ir = build_for_execution(alg, ex, scheduler=sch, tb_alloc=tba, fuse=fuse)
                # the channels hccc ALGO -o gives it on the cluster's GPUs (for the MSCCL-like
                # baseline: one instance per channel, as the XML export writes)
                ir = apply_channels(ir, CompileOptions(), platforms_for(ir.nranks, "auto", topo),
                                    declared=alg.header.nchannels)
                prog = prepare(ir, topo)
                res = [simulate(prog, topo, s, execution=ex, slice_bytes="auto") for s in sizes]
                t3 = simulate(prog, topo, TABLE3_SIZE, execution=ex, slice_bytes="auto")
                data["runs"][(k, aname, cname)] = [r.busbw_GBps for r in res]
                data["slice"][k] = [r.slice_bytes for r in res]
                data["tb"][(k, aname, cname)] = {
                    "tbs": t3.ntbs, "tbs_per_rank_max": t3.tbs_per_rank_max, "comm_time": t3.comm_time,
                    "avg_idle": t3.tb_idle_avg, "max_idle": t3.tb_idle_max, "busbw": t3.busbw_GBps,
                    "time_us": t3.time_us, "bound_us": t3.lower_bound_s * 1e6}
                console.log(f"Topo{k} {aname:15s} {cname:6s} {time.perf_counter() - t0:6.2f} s")
    return data


def scale_run(nnodes: int, g: int, size: int, console: Console) -> dict:
    """HM AllReduce on nnodes x g A100s: build, prepare and simulate one size, with wall times."""
    out = {"nodes": nnodes, "gpus": nnodes * g, "bytes": size}
    t0 = time.perf_counter()
    topo = parse_topology(a100_cluster_text(nnodes, g), f"a100_{nnodes}x{g}.topo")
    t1 = time.perf_counter()
    alg = gen.hm_allreduce(nnodes, g)
    ir = build_for_execution(alg, "task")
    t2 = time.perf_counter()
    prog = prepare(ir, topo)
    t3 = time.perf_counter()
    r = simulate(prog, topo, size, slice_bytes="auto")
    t4 = time.perf_counter()
    out.update(transfers=int(alg.ntransfers), prims=int(ir.nprims), tbs=int(ir.ntbs.sum()),
               links=int(topo.nlinks), topology_s=t1 - t0, compile_s=t2 - t1, prepare_s=t3 - t2,
               simulate_s=t4 - t3, engine_s=r.wall_s, events=r.events, time_us=r.time_us,
               busbw=r.busbw_GBps, bound_us=r.lower_bound_s * 1e6, micro_batches=r.micro_batches,
               slice_bytes=r.slice_bytes)
    console.log(f"{nnodes * g} GPUs: simulate {out['simulate_s']:.2f} s ({r.events} events)")
    return out


# ---------------------------------------------------------------------------- plots
def plot_busbw(data: dict, topos: list[int], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    sizes = data["sizes"]
    markers = {"hccc": "o", "rr": "s", "conn": "^", "fuse": "d", "msccl": "x"}
    for k in topos:
        fig, axes = plt.subplots(1, len(ALGOS), figsize=(4 * len(ALGOS), 3.4), dpi=110)
        for ax, aname in zip(np.atleast_1d(axes), ALGOS):
            for cname in CONFIGS:
                ax.plot(sizes, data["runs"][(k, aname, cname)], marker=markers[cname], ms=4, label=cname)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes[::2])
            ax.set_xticklabels([human(s) for s in sizes[::2]], fontsize=7)
            ax.set_title(aname, fontsize=9)
            ax.set_xlabel("buffer size")
            ax.grid(linestyle=":", linewidth=0.5)
        np.atleast_1d(axes)[0].set_ylabel("busbw (GB/s)")
        np.atleast_1d(axes)[-1].legend(fontsize=7)
        nn, g = SHAPES[k]
        fig.suptitle(f"A100 Topo{k} ({nn} x {g} GPUs): simulated busbw", fontsize=10)
        fig.tight_layout()
        p = outdir / f"busbw_topo{k}.png"
        fig.savefig(p)
        plt.close(fig)
        files.append(p)
    # Fig. 10b: HPDS vs RR speed-up per algorithm and topology at every size >= 64M
    fig, ax = plt.subplots(figsize=(8, 3.4), dpi=110)
    labels, vals = [], []
    big = [i for i, s in enumerate(sizes) if s >= 64 * MiB] or list(range(len(sizes)))
    for aname in ALGOS:
        for k in topos:
            h = np.array(data["runs"][(k, aname, "hccc")])[big]
            r = np.array(data["runs"][(k, aname, "rr")])[big]
            labels.append(f"{aname.replace('AllGather', 'AG').replace('AllReduce', 'AR')}\nT{k}")
            vals.append(float(np.mean(h / r)))
    x = np.arange(len(vals))
    ax.bar(x, vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("HPDS / RR busbw")
    ax.set_title("HPDS vs round-robin (mean over sizes >= 64M)", fontsize=9)
    fig.tight_layout()
    p = outdir / "hpds_vs_rr.png"
    fig.savefig(p)
    plt.close(fig)
    files.append(p)
    return files


# ---------------------------------------------------------------------------- report
def markdown(data: dict, topos: list[int], scale: dict | None, plots: list[Path], args) -> str:
    sizes = data["sizes"]
    L = ["# ResCCL evaluation, simulated", "",
         "Generated by `python benchmarks/resccl_eval.py`. Simulated with hccc's alpha-beta-gamma model "
         "(`hccc.runtime.simulator`: FIFO of 8 slots per connection, max-min fair sharing of links, NICs "
         "and NVSwitch ports, latency per slot hop, reductions at the node's gamma). FIFO slots of 1 MiB; "
         "the micro-batch slice follows the size (`hccc.compiler.passes.slicing.auto_slice_bytes`, the same "
         "for every configuration: column `slice`), float32, busbw as nccl-tests defines it.", "",
         "Configurations: " + "; ".join(f"**{c}** = {v[4]}" for c, v in CONFIGS.items()) + ".", ""]
    for k in topos:
        nn, g = SHAPES[k]
        L += [f"## Topo{k}: {nn} servers x {g} A100 (busbw, GB/s)", "",
              f"![busbw Topo{k}](busbw_topo{k}.png)", ""]
        for aname in ALGOS:
            L += [f"**{aname}**", "", "| size | slice | " + " | ".join(CONFIGS) + " | hccc / best other |",
                  "|---:|---:|" + "---:|" * (len(CONFIGS) + 1)]
            for i, s in enumerate(sizes):
                vals = {c: data["runs"][(k, aname, c)][i] for c in CONFIGS}
                other = max(v for c, v in vals.items() if c in ("rr", "msccl"))
                L.append(f"| {human(s)} | {human(data['slice'][k][i])} | "
                         + " | ".join(f"{vals[c]:.2f}" for c in CONFIGS)
                         + f" | {vals['hccc'] / other:.3f} |")
            L.append("")
    L += ["## HPDS vs round-robin (Fig. 10b)", "", "![HPDS vs RR](hpds_vs_rr.png)", "",
          "| algorithm | " + " | ".join(f"Topo{k}" for k in topos) + " |", "|---|" + "---:|" * len(topos)]
    big = [i for i, s in enumerate(sizes) if s >= 64 * MiB] or list(range(len(sizes)))
    for aname in ALGOS:
        row = []
        for k in topos:
            h = np.array(data["runs"][(k, aname, "hccc")])[big]
            r = np.array(data["runs"][(k, aname, "rr")])[big]
            row.append(f"{np.min(h / r):.3f} .. {np.max(h / r):.3f}")
        L.append(f"| {aname} | " + " | ".join(row) + " |")
    L += ["", "Speed-up of HPDS over RR (busbw ratio), smallest .. largest over sizes >= 64M.", "",
          f"## TB resource utilisation at {human(TABLE3_SIZE)} (Table 3)", "",
          "`msccl` = algorithm-level on connection-based TBs, `hccc` = task-level HPDS on state-based TBs. "
          "A TB is busy while it writes, reduces, or has a slot being written to it; idle ratio = 1 - busy / "
          "lifetime (launch to its last primitive); comm time = mean busy ratio.", "",
          "| algorithm | backend | " + " | ".join(f"Topo{k}" for k in topos) + " |",
          "|---|---|" + "---:|" * len(topos)]
    for aname in ALGOS:
        for cname in ("msccl", "hccc"):
            for metric, fmt in (("tbs", "{:d}"), ("comm_time", "{:.1%}"), ("avg_idle", "{:.1%}"),
                                ("max_idle", "{:.1%}")):
                vals = [fmt.format(data["tb"][(k, aname, cname)][metric]) for k in topos]
                L.append(f"| {aname} | {cname} {metric.replace('_', ' ')} | " + " | ".join(vals) + " |")
    L += ["", "TB totals of state-based vs connection-based allocation for the same HPDS schedule "
          "(`hccc` vs `conn`) and their simulated times at " + human(TABLE3_SIZE) + ":", "",
          "| algorithm | " + " | ".join(f"Topo{k} TBs state / conn, time ratio" for k in topos) + " |",
          "|---|" + "---:|" * len(topos)]
    for aname in ALGOS:
        row = []
        for k in topos:
            s, c = data["tb"][(k, aname, "hccc")], data["tb"][(k, aname, "conn")]
            row.append(f"{s['tbs']} / {c['tbs']}, {s['time_us'] / c['time_us']:.3f}")
        L.append(f"| {aname} | " + " | ".join(row) + " |")
    if scale:
        L += ["", f"## Simulation at scale: HM AllReduce on {scale['gpus']} GPUs", "",
              f"{scale['nodes']} x 8 A100 servers like Topo4's ({scale['links']:,} links), "
              f"{scale['transfers']:,} transfers, {scale['prims']:,} primitives on {scale['tbs']:,} TBs, "
              f"{human(scale['bytes'])}B ({scale['micro_batches']} micro-batches of "
              f"{human(scale['slice_bytes'])}B per chunk).", "",
              "| stage | wall time (s) |", "|---|---:|",
              f"| cluster (DSL parse) | {scale['topology_s']:.2f} |",
              f"| compile (DAG, HPDS, lower, TBs, checks) | {scale['compile_s']:.2f} |",
              f"| simulator set-up (`prepare`) | {scale['prepare_s']:.2f} |",
              f"| **simulation of one size** | **{scale['simulate_s']:.2f}** (target <= 60) |", "",
              f"{scale['events']:,} events; simulated time {scale['time_us']:.1f} us, busbw "
              f"{scale['busbw']:.2f} GB/s, lower bound {scale['bound_us']:.1f} us."]
    cmd = " ".join(["python benchmarks/resccl_eval.py", *args])
    L += ["", f"Command: `{cmd}`", ""]
    return "\n".join(L)


def print_tables(data: dict, topos: list[int], scale: dict | None, console: Console) -> None:
    sizes = data["sizes"]
    for aname in ALGOS:
        t = Table(title=f"{aname}: busbw GB/s (hccc in green where no baseline beats it)")
        t.add_column("size", justify="right")
        for k in topos:
            t.add_column(f"T{k} slice", justify="right")
            for c in ("hccc", "rr", "msccl"):
                t.add_column(f"T{k} {c}", justify="right")
        for i, s in enumerate(sizes):
            cells = []
            for k in topos:
                h, r, m = (data["runs"][(k, aname, c)][i] for c in ("hccc", "rr", "msccl"))
                style = "green" if h >= max(r, m) * (1 - 1e-9) else "red"
                cells += [human(data["slice"][k][i]), f"[{style}]{h:.1f}[/]", f"{r:.1f}", f"{m:.1f}"]
            t.add_row(human(s), *cells)
        console.print(t)
    t = Table(title=f"TBs and idle ratios at {human(TABLE3_SIZE)}: msccl -> hccc")
    t.add_column("algorithm")
    t.add_column("topo", justify="right")
    for col in ("#TB", "comm time", "avg idle", "max idle"):
        t.add_column(col, justify="right")
    for aname in ALGOS:
        for k in topos:
            m, h = data["tb"][(k, aname, "msccl")], data["tb"][(k, aname, "hccc")]
            t.add_row(aname, f"Topo{k}", f"{m['tbs']} -> {h['tbs']}",
                      f"{m['comm_time']:.1%} -> {h['comm_time']:.1%}",
                      f"{m['avg_idle']:.1%} -> {h['avg_idle']:.1%}", f"{m['max_idle']:.1%} -> {h['max_idle']:.1%}")
    console.print(t)
    if scale:
        console.print(f"HM AllReduce on {scale['gpus']} GPUs, {human(scale['bytes'])}B: simulation "
                      f"{scale['simulate_s']:.2f} s (compile {scale['compile_s']:.1f} s, set-up "
                      f"{scale['prepare_s']:.1f} s), busbw {scale['busbw']:.2f} GB/s")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "resccl_eval")
    ap.add_argument("--sizes", default="8M..4G", help="8M..4G (powers of two) or a comma list")
    ap.add_argument("--topos", default="1,2,3,4")
    ap.add_argument("--scale-nodes", type=int, default=128, help="servers of 8 GPUs for the scale run")
    ap.add_argument("--scale-size", default="1G")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--quick", action="store_true", help="sizes 8M,64M,1G only and a 32-server scale run")
    args = ap.parse_args(argv)
    from hccc.args import parse_size

    sizes = parse_sizes("8M,64M,1G" if args.quick else args.sizes)
    topos = [int(x) for x in args.topos.split(",")]
    if any(k not in SHAPES for k in topos):
        ap.error("topologies are 1..4")
    console = Console(stderr=True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = evaluate(topos, sizes, console)
    scale = None
    if not args.skip_scale:
        scale = scale_run(32 if args.quick else args.scale_nodes, 8, parse_size(args.scale_size), console)
    plots = plot_busbw(data, topos, out)
    (out / "report.md").write_text(markdown(data, topos, scale, plots, argv))
    raw = {"sizes": sizes, "slice_bytes": {f"topo{k}": v for k, v in data["slice"].items()},
           "busbw": {f"topo{k}/{a}/{c}": v for (k, a, c), v in data["runs"].items()},
           "tb": {f"topo{k}/{a}/{c}": v for (k, a, c), v in data["tb"].items()}, "scale": scale}
    (out / "results.json").write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    print_tables(data, topos, scale, Console(width=max(120, Console().width)))
    console.log(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
