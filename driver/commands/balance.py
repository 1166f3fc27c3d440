"""``hccc balance --speeds S1,S2,... --batch B [--min-each K] [--json]``: integer micro-batch sizes
proportional to measured GPU speeds that sum to B (HetCCL-SNU section 4.5), minimising the step time."""
from __future__ import annotations

import argparse
import json
import math

from hccc.args import comma_list, count_at_least
from hccc.table import table_lines
from hccc.util.diagnostics import CompileError, Diagnostic

SUMMARY = "micro-batch sizes proportional to measured GPU speeds"


def _speed(part: str) -> float:
    try:
        v = float(part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid speed '{part}' (expected numbers like 2.1,1.0)") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"speeds must be positive and finite, got '{part}'")
    return v


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speeds", type=comma_list(_speed, 'speeds', max_items=1 << 16), required=True, metavar="S1,S2,...",
                   help="measured speed of each GPU (tokens/s or any common unit), comma-separated")
    p.add_argument("--batch", type=count_at_least(0), required=True, metavar="B", help="total micro-batch size per step")
    p.add_argument("--min-each", type=count_at_least(0), default=0, metavar="K",
                   help="give every GPU at least K")
    p.add_argument("--json", action="store_true",
                   help='print {"sizes": [...], "step_time": ..., "uniform_step_time": ..., "speedup": ...}')


def run(args) -> int:
    from hccc.runtime.balance import BalanceError, balance, step_time

    try:
        sizes = balance(args.speeds, args.batch, min_each=args.min_each)
    except BalanceError as exc:
        raise CompileError([Diagnostic(str(exc), None)]) from None
    n = len(sizes)
    uniform = [args.batch // n + (1 if i < args.batch % n else 0) for i in range(n)]
    t, tu = step_time(sizes, args.speeds), step_time(uniform, args.speeds)
    if not math.isfinite(t) or not math.isfinite(tu):   # a speed so small a step's time overflows a double
        raise CompileError([Diagnostic(f"--speeds: a batch of {max(uniform)} at speed {min(args.speeds):g} takes "
                                       "longer than a double can hold (give the speeds in a larger unit)", None)])
    speedup = tu / t if t > 0 else 1.0
    if args.json:
        print(json.dumps({"sizes": sizes, "step_time": t, "uniform_step_time": tu, "speedup": speedup}))
        return 0
    rows = [[str(i), f"{sp:g}", str(b), f"{b / sp:.4g}"] for i, (sp, b) in enumerate(zip(args.speeds, sizes))]
    print("\n".join(table_lines(["gpu", "speed", "batch", "time"], rows, {0, 1, 2, 3}, indent=0)))
    print(f"step time {t:.4g} (uniform split: {tu:.4g}, {speedup:.2f}x faster)")
    return 0
