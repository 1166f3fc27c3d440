"""Bytes in flight per block: what one block's copy engine keeps loaded and not yet stored, by its
warps and by what it moves, counted from the engine's structure (no GPU).

    python benchmarks/bytes_in_flight.py [--warps 1,4,8,16] [--json]

For each block size and for a copy and a two-source reduction, from
:func:`hccc.compiler.passes.kernel_cost.block_bytes_in_flight` and ``block_bytes_per_round``
(:mod:`hccc.compiler.backend.engine_shape`: vectors a data thread loads before its first store):
the bytes of loads in flight, the bytes stored per round of loads, and the bandwidth Little's law
predicts for that round at the round trip the fifth GPU run's copy rate implies
(``kernel_cost.LOAD_ROUND_TRIP_SECONDS``). The predicted column is a prediction: no run measured
it except where it reproduces the fifth run's 16-warp copy rate. Before and after: the v4 engine
the fifth run measured had this shape (8 vectors a thread copying, 4 a source reducing), and so
does the engine built now, since one vector more a thread spills at sm_90 (``engine_shape``); what
the build switch ``HCCC_SYNC_POSTS=1`` changes is not the bytes of a round but the gap between two
units' rounds (docs/kernel-protocol.md, "Bytes in flight").
"""
from __future__ import annotations

import argparse
import json
import sys


def rows(warps: list[int]) -> list[dict]:
    from hccc.compiler.passes import kernel_cost as kc
    out = []
    for w in warps:
        for moves, reduces in (("copy", False), ("reduce", True)):
            per_round = kc.block_bytes_per_round(w, reduces)
            out.append({"warps": w, "moves": moves, "bytes_in_flight": kc.block_bytes_in_flight(w, reduces),
                        "bytes_per_round": per_round,
                        "predicted_gbs": round(kc.predicted_block_bytes_per_second(per_round) / 1e9, 1)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", default="1,4,8,16", help="block sizes in warps, comma separated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        warps = [int(x) for x in args.warps.split(",") if x.strip()]
    except ValueError:
        print(f"error: --warps: not a list of integers: {args.warps!r}", file=sys.stderr)
        return 1
    if not warps or min(warps) < 1 or max(warps) > 32:
        print(f"error: --warps: each from 1 to 32 (a block has at most 1,024 threads): {args.warps!r}",
              file=sys.stderr)
        return 1
    table = rows(warps)
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    from hccc.compiler.passes.kernel_cost import LOAD_ROUND_TRIP_SECONDS
    print(f"round trip {LOAD_ROUND_TRIP_SECONDS * 1e6:.2f} us (the fifth run's copy rate, Little's law); "
          "predicted GB/s: a prediction")
    print(f"{'warps':>5} {'moves':6} {'in flight B':>11} {'per round B':>11} {'predicted GB/s':>14}")
    for r in table:
        print(f"{r['warps']:>5} {r['moves']:6} {r['bytes_in_flight']:>11,} "
              f"{r['bytes_per_round']:>11,} {r['predicted_gbs']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
