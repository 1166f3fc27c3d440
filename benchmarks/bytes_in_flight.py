"""Bytes in flight per block: what one block's copy engine keeps loaded and not yet stored, by its
warps and by what it moves, counted from the engine's structure (no GPU).

    python benchmarks/bytes_in_flight.py [--warps 1,4,8,16] [--json]

For each block size, for a copy and a two-source reduction, and for the engine before and after
the shared-memory loads (``v4``: the engine the fifth GPU run measured, every vector in registers;
``v5``: the engine built now, whose data threads on CUDA sm_90 also load
``engine_shape.ASYNC_VECTORS`` vectors through shared memory, cp.async, where the buffer has room
for every data thread; HIP runs the v4 shape), from
:func:`hccc.compiler.passes.kernel_cost.block_bytes_in_flight` and ``block_bytes_per_round``
(:mod:`hccc.compiler.ir.engine_shape`): the bytes of loads in flight, the bytes stored per
round of loads, and the bandwidth Little's law predicts for that round at the round trip the fifth
run's copy rate implies (``kernel_cost.LOAD_ROUND_TRIP_SECONDS``). The predicted column is a
prediction: no run has measured a v5 row, and the v4 rows reproduce the fifth run only at 16
warps, where the round trip was taken (its smaller blocks moved more than this predicts: their
round trips were shorter).
"""
from __future__ import annotations

import argparse
import json
import sys


def rows(warps: list[int]) -> list[dict]:
    from hccc.compiler.passes import kernel_cost as kc
    out = []
    for engine, async_loads in (("v4", False), ("v5", True)):
        for w in warps:
            for moves, reduces in (("copy", False), ("reduce", True)):
                per_round = kc.block_bytes_per_round(w, reduces, async_loads=async_loads)
                out.append({"engine": engine, "warps": w, "moves": moves,
                            "bytes_in_flight": kc.block_bytes_in_flight(w, reduces, async_loads=async_loads),
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
    print(f"{'engine':6} {'warps':>5} {'moves':6} {'in flight B':>11} {'per round B':>11} {'predicted GB/s':>14}")
    for r in table:
        print(f"{r['engine']:6} {r['warps']:>5} {r['moves']:6} {r['bytes_in_flight']:>11,} "
              f"{r['bytes_per_round']:>11,} {r['predicted_gbs']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
