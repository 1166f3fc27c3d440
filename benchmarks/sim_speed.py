#!/usr/bin/env python3
"""The simulator's own speed: wall time of one simulated call at 1 GiB of tree-packed programs on the
generated heterogeneous clusters (mixes of 4- and 8-GPU nodes in the H20 or the V100 flavour, as
benchmarks/synth_scale.py: the V100 flavour's NICs and PCIe switches shared by GPU pairs join most
flows into one component of the bandwidth sharing), each case in a process of its own (the programs
are made once, by this checkout's ``hccc synth``).

    python benchmarks/sim_speed.py                          # 16, 32 and 64 GPUs, AllGather
    python benchmarks/sim_speed.py --compare OTHER_CHECKOUT # the same under another source tree, side by side
    python benchmarks/sim_speed.py --compare OTHER_CHECKOUT --rounds 4   # the two trees' processes in turn, 4 times
    python benchmarks/sim_speed.py --gpus 16,32 --collectives allgather,reducescatter
    python benchmarks/sim_speed.py --flavours h20,v100 --gpus 64 --collectives allgather,allreduce

Columns: transfers of the program, events and flow classes re-shared by the engine (its work; flows in trees before the classes), the
simulated time (which must not differ between the trees beyond rounding: the engines compute the
same thing; ``same result`` says how far apart where not to the last bit), and
the engine's wall time (the median of ``--repeats`` calls after one call that compiles it), with
``--compare`` that of the other tree and the ratio. ``--rounds N`` runs the two trees' processes
in turn N times (this tree first in odd rounds, the other first in even ones), and the walls are
the medians of all their calls: a machine whose speed moves between runs then moves both trees
alike.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from synth_speed import LOAD_TREE  # noqa: E402  (imports ``hccc`` from a given source tree)

#: simulates a program in the source tree given first: build, prepare, one call that compiles the
#: engine, then the timed calls; prints one JSON line
SIMULATE = LOAD_TREE + r"""
import json, time
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.pipeline.readers import load_algorithm
from hccc.compiler.passes.build import build_program
from hccc.runtime.simulator import prepare, simulate
from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS
algo, topo_path, repeats = sys.argv[2], sys.argv[3], int(sys.argv[4])
topo = load_cluster(topo_path)
prog = prepare(build_program(load_algorithm(algo)), topo, DEFAULT_BLOCK_GBPS)
simulate(prog, topo, 1 << 30, slice_bytes="auto")
walls = []
for _ in range(repeats):
    r = simulate(prog, topo, 1 << 30, slice_bytes="auto")
    walls.append(r.wall_s)
print(json.dumps({"time_s": r.time_s, "events": r.events, "share_flows": r.stats.get("share_classes", r.stats.get("share_flows")),
                  "walls": walls}))
"""


def make_program(gpus: int, collective: str, folder: Path, flavour: str = "h20") -> tuple[Path, Path, int]:
    """The cluster of ``gpus`` GPUs in ``flavour`` and its tree-packed ``collective`` program
    (``hccc synth``)."""
    from synth_scale import SCALED, scaled_spec

    from hccc.compiler.cluster.topo_parser import format_topology

    tpath = folder / f"{flavour}_{gpus}.topo"
    tpath.write_text(format_topology(scaled_spec(SCALED[gpus], flavour)))
    apath = folder / f"{flavour}_{gpus}_{collective}.rccl"
    out = subprocess.run([sys.executable, "-m", "hccc", "synth", str(tpath), "--collective", collective,
                          "--method", "trees", "--time-limit", "30", "-o", str(apath), "--json"],
                         capture_output=True, text=True, check=True)
    transfers = int(json.loads(out.stdout.splitlines()[0])["transfers"])
    return tpath, apath, transfers


def simulate_in(tree: Path, algo: Path, topo: Path, repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", SIMULATE, str(tree), str(algo), str(topo), str(repeats)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"simulation under {tree} failed:\n{out.stderr}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["wall_s"] = statistics.median(row["walls"])
    return row


def in_turn(trees: list[Path], algo: Path, topo: Path, repeats: int, rounds: int) -> list[dict]:
    """Each tree's :func:`simulate_in` ``rounds`` times, the trees in turn (their order reversed every
    other round); per tree, the last row with ``walls`` and ``wall_s`` over every round."""
    walls: list[list[float]] = [[] for _ in trees]
    rows: list[dict] = [{} for _ in trees]
    for r in range(max(1, rounds)):
        order = list(range(len(trees))) if r % 2 == 0 else list(range(len(trees)))[::-1]
        for i in order:
            rows[i] = simulate_in(trees[i], algo, topo, repeats)
            walls[i] += rows[i]["walls"]
    for row, w in zip(rows, walls):
        row["walls"], row["wall_s"] = w, statistics.median(w)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="16,32,64", help="cluster sizes (of 16, 32, 48, 64)")
    ap.add_argument("--collectives", default="allgather")
    ap.add_argument("--flavours", default="h20", help="cluster flavours (h20, v100; comma-separated)")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per case (median)")
    ap.add_argument("--compare", type=Path, help="another checkout: its engine side by side")
    ap.add_argument("--rounds", type=int, default=1, help="with --compare: the two trees in turn this many times")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="simulator speed: one call at 1 GiB (engine wall time)")
    for col in ("cluster", "collective", "transfers", "events", "classes re-shared", "simulated us", "wall s"):
        table.add_column(col, justify="right")
    if args.compare:
        for col in ("other wall s", "other / this", "same result"):
            table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for flavour, gpus in [(f, int(g)) for f in args.flavours.split(",") for g in args.gpus.split(",")]:
            for coll in args.collectives.split(","):
                tpath, apath, transfers = make_program(gpus, coll, Path(tmp), flavour)
                trees = [ROOT] + ([args.compare.resolve()] if args.compare else [])
                this, *others = in_turn(trees, apath, tpath, args.repeats, args.rounds if args.compare else 1)
                cells = [f"{flavour} {gpus} GPUs", coll, f"{transfers:,}", f"{this['events']:,}",
                         f"{this['share_flows']:,}", f"{this['time_s'] * 1e6:.1f}", f"{this['wall_s']:.2f}"]
                if args.compare:
                    other = others[0]
                    cells += [f"{other['wall_s']:.2f}", f"{other['wall_s'] / this['wall_s']:.2f}x",
                              "yes" if other["time_s"] == this["time_s"] else
                              f"{abs(other['time_s'] / this['time_s'] - 1):.0e} apart"]
                table.add_row(*cells)
    Console(width=max(150, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
