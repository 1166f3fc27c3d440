"""ReduceScatter against AllGather on the same trees: how much of a ReduceScatter's shortfall is
its program's, not its packing's.

    python benchmarks/rs_ag_gap.py [--clusters a100_topo1,...] [--mi250 2,4] [--chunks 2]
                                   [--split auto] [--size 1G] [--slices auto,16K] [--json F]

A ReduceScatter is the time-reverse of an AllGather: the same trees turned around move the same
bytes over the same pairs, so in the link model the two take one time. ``hccc synth`` packs them
once where the network is its own transpose (docs/synthesis.md). This script takes that packing,
rounded to ``--chunks`` trees per rank (the LP's own rounding or the integral trees, whichever
the packing keeps), writes both programs from it (every chunk cut ``--split`` ways, ``auto``:
what ``synth`` cuts it into, a channel per stream, 16 warps a block), and simulates both at
``--size`` with each micro-batch slice of ``--slices`` (a row each; ``auto``: the slice each
program's slicing policy gives, as ``synth`` writes it; ``slice AG/RS`` the two slices). Columns: ``model`` the packing's fraction
of the bound in the link model; ``AG`` and ``RS`` each program's simulated fraction of the cut
bound; ``RS/AG`` their ratio of times; ``busy AG``/``busy RS`` the busiest link's share of the
run with a flow on it.

What it shows (docs/measurements.md#reducescatter-against-allgather-on-one-packing): in an
in-tree a rank sends its partial sum of a slice only once every child's slice has arrived, so
every rank joins its subtree's paths, and a link waiting for the slowest of them idles where an
AllGather's, fed by one parent whose data it keeps, would not.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _sizes(text: str) -> list[int]:
    from hccc.args import parse_size
    return [parse_size(s) for s in text.split(",") if s]


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:g}K"


def clusters(names: str, mi250: str) -> list[tuple[str, object]]:
    """``(name, Topology)`` of the example clusters ``names`` and of ``mi250`` nodes of MI250s."""
    from hccc.compiler.cluster.topo_parser import load_topology, parse_topology
    from synth_quality import mi250_text

    out = []
    for name in [x for x in names.split(",") if x]:
        path = ROOT / "examples" / "clusters" / f"{name}.topo"
        if not path.exists():
            raise SystemExit(f"rs_ag_gap.py: no example cluster {name!r}")
        out.append((name, load_topology(path)))
    for nodes in [int(x) for x in mi250.split(",") if x]:
        out.append((f"mi250_{nodes}x16", parse_topology(mi250_text(nodes), f"mi250_{nodes}x16")))
    return out


def measure(topo, chunks: int, split: int | None, size: int, slice_bytes: int | None) -> dict:
    """Both programs of ``topo``'s packing at ``chunks`` trees per rank, simulated at ``size``."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.synth import to_algorithm
    from hccc.compiler.synth import forest as fo
    from hccc.compiler.synth import trees as tr
    from hccc.compiler.synth.packing import pair_bandwidth
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds
    from hccc.compiler.synth.collectives import SynthResult
    from hccc.compiler.synth.problem import network_from_topology
    from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS
    from hccc.runtime.simulator import prepare, simulate

    net = network_from_topology(topo)
    if not net.is_self_transposed():
        raise SystemExit(f"rs_ag_gap.py: {topo.name} is not its own transpose (its ReduceScatter packs apart)")
    n = net.nranks
    packing = tr.pack_trees(net, pair_bw=pair_bandwidth(topo), max_chunks=chunks)
    if packing.chunks_per_rank != chunks:
        packing = packing.reround(chunks)[0]
    bound = collective_cut_bound_seconds(net, "allgather", n, 1, 0, float(size))
    row = {"cluster": topo.name, "N": n, "chunks": packing.chunks_per_rank, "integral": bool(packing.stats.get("integral")),
           "model": packing.fraction}
    times = {}
    for coll in ("allgather", "reducescatter"):
        s_ = split or fo.split_for(packing.chunks_per_rank, n, fo.REDUCE_SPLIT_LEAST if coll == "reducescatter" else 2)
        rows = fo.stream_rows(packing, coll, s_)
        res = SynthResult(coll, n, packing.chunks_per_rank * s_, None, rows, 0, 0, [], 0.0, topo.name,
                          detail={"channels": 1, "warps": fo.WARPS})
        ir = build_program(to_algorithm(res, topo))
        prog = prepare(ir, topo, DEFAULT_BLOCK_GBPS)
        sim = simulate(prog, topo, size, slice_bytes="auto" if slice_bytes is None else slice_bytes)
        key = "AG" if coll == "allgather" else "RS"
        row[f"slice {key}"] = sim.slice_bytes
        times[key] = sim.time_s
        row[f"split {key}"] = s_
        row[key] = bound / sim.time_s
        row[f"busy {key}"] = float((sim.link_busy / sim.time_s).max())
    row["RS/AG"] = times["RS"] / times["AG"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default="", help="example clusters (names without .topo, comma-separated)")
    ap.add_argument("--mi250", default="2", help="MI250 cluster sizes in nodes of 16 GCDs ('' for none)")
    ap.add_argument("--chunks", default="2", help="trees per rank (comma-separated)")
    ap.add_argument("--split", default="auto", help="ways every chunk is cut ('auto': as synth cuts it)")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--slices", default="auto", help="micro-batch slices ('auto': the slicing policy's; comma-separated)")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    split = None if args.split == "auto" else int(args.split)
    size = _sizes(args.size)[0]
    rows = []
    head = (f"{'cluster':<14} {'N':>3} {'K':>3} {'int':>3} {'slice AG/RS':>11} {'model':>6} {'AG':>6} {'RS':>6} "
            f"{'RS/AG':>6} {'busy AG':>7} {'busy RS':>7}")
    print(head)
    print("-" * len(head))
    for name, topo in clusters(args.clusters, args.mi250):
        for k in [int(x) for x in args.chunks.split(",") if x]:
            for sl in [None if x == "auto" else _sizes(x)[0] for x in args.slices.split(",") if x]:
                r = measure(topo, k, split, size, sl)
                r["cluster"] = name
                rows.append(r)
                print(f"{name:<14} {r['N']:>3} {r['chunks']:>3} {'yes' if r['integral'] else 'no':>3} "
                      f"{_kib(r['slice AG']) + '/' + _kib(r['slice RS']):>11} {r['model']:>6.3f} {r['AG']:>6.3f} {r['RS']:>6.3f} {r['RS/AG']:>6.3f} "
                      f"{r['busy AG']:>7.3f} {r['busy RS']:>7.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
