#!/usr/bin/env python3
"""``hccc synth`` against every program it could have written: the written program's time over the best one's.

    python benchmarks/synth_candidates.py                          # a100_topo1,v100_4x3,heteccl_fig10,
                                                                   # mixed_v100_w7800: AllReduce, AllGather
    python benchmarks/synth_candidates.py --clusters all --collectives all      # the guarantee's full sweep
    python benchmarks/synth_candidates.py --clusters a100_topo4 --collectives allreduce --sizes 64K
    python benchmarks/synth_candidates.py --json out.json          # also write the rows as JSON

Every row is one ``hccc.synthesize_program(cluster, collective, sizes=(size,))`` (the program
``hccc synth --size SIZE`` writes), at the sizes of the selection's band
(:data:`hccc.compiler.synth.selection.SCORE_BAND`: 4 KiB, 64 KiB, 1 MiB, 64 MiB, 1 GiB). Timed
here, each by hccc's simulator through its API as ``hccc sim`` times a program (built with
``hccc.build_program``, the slice chosen per size, the block rate its default), none by the
selection's own numbers:

* the written program, at the channels its header says;
* every candidate the selection scored (the tree packing's, the step search's, the generators',
  the default program's: ``Program.candidates``), each at the channels it would have been written
  with;
* hccc's generators that fit the cluster (ring, all pairs, recursive doubling on a power of two,
  hierarchical mesh or AllToAll on equal nodes, a Broadcast's binomial tree: built here from
  :mod:`hccc.compiler.frontend.generators`, not from the selection's list), each at its best of
  1, 2, 4 and 8 blocks per thread block.

Columns: ``kept`` (what ``auto`` wrote), ``written`` and ``best`` (us, the fastest of all the
programs above, and which), ``ratio`` (written over best: at most 1.02 is the guarantee,
:data:`TOLERANCE`), ``runner-up`` (the selection's, with its ratio), ``wall`` (seconds of the
synthesis). tests/test_synth_guarantee.py runs the same rows.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"
#: the generators' channel counts tried here, the best kept
CHANNELS = (1, 2, 4, 8)
#: the written program against the best program timed here: at most this ratio (synthesis v3's 1.02)
TOLERANCE = 1.02
#: every collective ``hccc synth`` makes programs for
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "alltoall")


def shipped_clusters() -> list[str]:
    """The names of every cluster shipped in examples/clusters/."""
    return sorted(p.stem for p in CLUSTERS.glob("*.topo"))


def _time(alg, topo, nbytes: int, channels: int) -> float:
    from hccc import build_program
    from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS
    from hccc.runtime.simulator import prepare, simulate

    ir = build_program(alg)
    ir.nchannels = channels
    return float(simulate(prepare(ir, topo, DEFAULT_BLOCK_GBPS), topo, nbytes, slice_bytes="auto").time_s)


def generators(topo, collective: str, root: int = 0) -> dict:
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
            "allreduce": {"ring": lambda: gen.ring_allreduce(n), "direct": lambda: gen.direct_allreduce(n)},
            "broadcast": {"ring": lambda: gen.ring_broadcast(n, root), "direct": lambda: gen.direct_broadcast(n, root),
                          "binomial": lambda: gen.tree_broadcast(n, gen.binomial_tree(n, root), root)},
            "alltoall": {"ring": lambda: gen.ring_alltoall(n), "direct": lambda: gen.direct_alltoall(n)}}[collective]
    if collective == "allgather" and n & (n - 1) == 0:
        make["rd"] = lambda: gen.recursive_doubling_allgather(n)
    if grid and grid[1] > 1 and collective != "broadcast":
        make["hier_a2a" if collective == "alltoall" else "hm"] = {
            "allgather": lambda: gen.hm_allgather(*grid), "reducescatter": lambda: gen.hm_reducescatter(*grid),
            "allreduce": lambda: gen.hm_allreduce(*grid), "alltoall": lambda: gen.hierarchical_alltoall(*grid)}[collective]
    out = {}
    for name, m in make.items():
        try:
            alg = m()
            check_on_topology(alg, topo)
        except (CompileError, ValueError):
            continue
        out[name] = alg
    return out


def row(cluster: str, collective: str, size: int, time_limit: float) -> dict:
    """One row of the table (see the module docstring); ``times``: every program timed, by name
    (``candidate NAME``, ``generator NAME``)."""
    from hccc import load_cluster, synthesize_program
    from hccc.compiler.synth import to_algorithm

    topo = load_cluster(CLUSTERS / f"{cluster}.topo")
    t0 = time.perf_counter()
    prog = synthesize_program(topo, collective, sizes=(size,), time_limit=time_limit)
    wall = time.perf_counter() - t0
    written = _time(prog.algorithm, topo, size, prog.algorithm.header.nchannels)
    times = {}
    for name, result in prog.candidates:
        alg = to_algorithm(result, topo)
        times[f"candidate {name}"] = _time(alg, topo, size, alg.header.nchannels)
    for name, alg in generators(topo, collective).items():
        times[f"generator {name}"] = min(_time(alg, topo, size, c) for c in CHANNELS)
    best_name = min(times, key=times.get)
    best = times[best_name]
    sel = prog.summary["selection"]
    return {"cluster": cluster, "collective": collective, "bytes": size, "kept": prog.summary["method"],
            "written_us": written * 1e6, "best": best_name, "best_us": best * 1e6, "ratio": written / best,
            "runner_up": sel["runner_up"], "time_limit_cut": sel["time_limit_cut"], "wall_s": wall,
            "times_us": {k: v * 1e6 for k, v in times.items()}}


def main() -> None:
    from hccc.args import comma_list, format_size, parse_size
    from hccc.compiler.synth.selection import SCORE_BAND

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", default="a100_topo1,v100_4x3,heteccl_fig10,mixed_v100_w7800",
                   help="comma-separated names in examples/clusters/, or 'all'")
    p.add_argument("--collectives", default="allreduce,allgather", help="comma-separated, or 'all'")
    p.add_argument("--sizes", type=comma_list(parse_size, "sizes"), default=SCORE_BAND)
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    clusters = shipped_clusters() if args.clusters == "all" else args.clusters.split(",")
    collectives = COLLECTIVES if args.collectives == "all" else args.collectives.split(",")
    rows = []
    print(f"{'cluster':18} {'collective':13} {'size':>5} {'kept':9} {'written':>11} {'best':>11} {'(which)':20} "
          f"{'ratio':>6} {'runner-up':>18} {'wall':>6}")
    for cluster in clusters:
        for coll in collectives:
            for size in args.sizes:
                r = row(cluster, coll, int(size), args.time_limit)
                rows.append(r)
                run = r["runner_up"]
                runner = f"{run['candidate']} {run['ratio']:.3f}x" if run and run["ratio"] is not None else "-"
                print(f"{cluster:18} {coll:13} {format_size(size):>5} {r['kept']:9} {r['written_us']:11.2f} "
                      f"{r['best_us']:11.2f} {r['best']:20} {r['ratio']:6.3f} {runner:>18} {r['wall_s']:6.1f}",
                      flush=True)
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"worst ratio: {worst['ratio']:.3f} over {len(rows)} rows ({worst['cluster']} {worst['collective']} "
          f"{format_size(worst['bytes'])}); {sum(r['ratio'] > TOLERANCE for r in rows)} above {TOLERANCE}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
