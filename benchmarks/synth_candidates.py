#!/usr/bin/env python3
"""``hccc synth`` against every generator that fits: the written program's time over the best one's.

    python benchmarks/synth_candidates.py                          # a100_topo1,v100_4x3,heteccl_fig10,
                                                                   # mixed_v100_w7800: AllReduce, AllGather
    python benchmarks/synth_candidates.py --clusters a100_topo4 --collectives allreduce --sizes 64K
    python benchmarks/synth_candidates.py --json out.json          # also write the rows as JSON

Every row is one ``hccc.synthesize_program(cluster, collective, sizes=(size,))`` (the program
``hccc synth --size SIZE`` writes), at the sizes of the default band (4 KiB, 64 KiB, 1 MiB, 64 MiB,
1 GiB). The program written and each of hccc's generators that fit the cluster (ring, all pairs,
recursive doubling on a power of two, hierarchical mesh on equal nodes: built here from
:mod:`hccc.compiler.frontend.generators`, not from the selection's list) are compiled with
``hccc.build_program`` and timed by hccc's simulator at the size, each generator at its best of 1,
2, 4 and 8 blocks per thread block, the written program at the channels its header says. Columns:
``kept`` (what ``auto`` wrote), ``written`` and ``best gen`` (us), ``ratio`` (written over the best
generator's: at most 1.02 is the target), ``runner-up`` (the selection's, with its ratio), ``wall``
(seconds of the synthesis).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAND = (4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30)
CHANNELS = (1, 2, 4, 8)


def _time(alg, topo, nbytes: int, channels: int) -> float:
    from hccc import build_program
    from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS
    from hccc.runtime.simulator import prepare, simulate

    ir = build_program(alg)
    ir.nchannels = channels
    return float(simulate(prepare(ir, topo, DEFAULT_BLOCK_GBPS), topo, nbytes, slice_bytes="auto").time_s)


def generators(topo, collective: str) -> dict:
    """Every generator's program of ``collective`` whose shape fits ``topo`` and whose pairs it links."""
    from hccc.compiler.cluster.topology_check import check_on_topology
    from hccc.compiler.frontend import generators as gen
    from hccc.util.diagnostics import CompileError

    n = topo.nranks
    sizes = {nd.ngpus for nd in topo.nodes}
    grid = (len(topo.nodes), sizes.pop()) if len(topo.nodes) > 1 and len(sizes) == 1 else None
    make = {"allgather": {"ring": lambda: gen.ring_allgather(n), "direct": lambda: gen.direct_allgather(n)},
            "reducescatter": {"ring": lambda: gen.ring_reducescatter(n),
                              "direct": lambda: gen.direct_reducescatter(n)},
            "allreduce": {"ring": lambda: gen.ring_allreduce(n), "direct": lambda: gen.direct_allreduce(n)}}[collective]
    if collective == "allgather" and n & (n - 1) == 0:
        make["rd"] = lambda: gen.recursive_doubling_allgather(n)
    if grid and grid[1] > 1:
        make["hm"] = {"allgather": lambda: gen.hm_allgather(*grid), "reducescatter": lambda: gen.hm_reducescatter(*grid),
                      "allreduce": lambda: gen.hm_allreduce(*grid)}[collective]
    out = {}
    for name, m in make.items():
        alg = m()
        try:
            check_on_topology(alg, topo)
        except CompileError:
            continue
        out[name] = alg
    return out


def row(cluster: str, collective: str, size: int, time_limit: float) -> dict:
    from hccc import load_cluster, synthesize_program

    topo = load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.topo")
    t0 = time.perf_counter()
    prog = synthesize_program(topo, collective, sizes=(size,), time_limit=time_limit)
    wall = time.perf_counter() - t0
    written = _time(prog.algorithm, topo, size, prog.algorithm.header.nchannels)
    gens = {name: min(_time(alg, topo, size, c) for c in CHANNELS) for name, alg in generators(topo, collective).items()}
    best = min(gens.values())
    sel = prog.summary["selection"]
    return {"cluster": cluster, "collective": collective, "bytes": size, "kept": prog.summary["method"],
            "written_us": written * 1e6, "best_generator_us": best * 1e6, "ratio": written / best,
            "runner_up": sel["runner_up"], "time_limit_cut": sel["time_limit_cut"], "wall_s": wall}


def main() -> None:
    from hccc.args import comma_list, format_size, parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", default="a100_topo1,v100_4x3,heteccl_fig10,mixed_v100_w7800")
    p.add_argument("--collectives", default="allreduce,allgather")
    p.add_argument("--sizes", type=comma_list(parse_size, "sizes"), default=BAND)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    print(f"{'cluster':18} {'collective':13} {'size':>5} {'kept':9} {'written':>11} {'best gen':>11} {'ratio':>6} "
          f"{'runner-up':>18} {'wall':>6}")
    for cluster in args.clusters.split(","):
        for coll in args.collectives.split(","):
            for size in args.sizes:
                r = row(cluster, coll, int(size), args.time_limit)
                rows.append(r)
                run = r["runner_up"]
                runner = f"{run['candidate']} {run['ratio']:.3f}x" if run else "-"
                print(f"{cluster:18} {coll:13} {format_size(size):>5} {r['kept']:9} {r['written_us']:11.2f} "
                      f"{r['best_generator_us']:11.2f} {r['ratio']:6.3f} {runner:>18} {r['wall_s']:6.1f}", flush=True)
    print(f"worst ratio: {max(r['ratio'] for r in rows):.3f} over {len(rows)} rows")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
