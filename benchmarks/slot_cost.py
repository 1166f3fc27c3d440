"""What one slot (one primitive's micro-batch: a flag waited for and one posted) costs a thread
block on a GPU, beyond the bytes it moves: the constant ``THIN_SLOT_SECONDS`` that ``hccc synth``
weighs smaller slices with (compiler/passes/slicing.py) assumes 1 us.

    python benchmarks/slot_cost.py [--backend cuda] [--algorithms ring_allgather_8,ring_allreduce_8]
                                   [--sizes 4M,64M] [--slices 64K,32K,16K,8K,4K] [--iters 10] [--json]

For each algorithm (examples/) and size (the collective's full buffer), the launcher runs the same
call with each fixed micro-batch slice (``Runner.run(slice_bytes=)``), every rank on one device,
out of place, float32 sum, and checks the result against the oracle. The bytes each rank moves
do not depend on the slice; the slots do: the busiest thread block handles (its primitives) x
(micro-batches per chunk) of them (:func:`hccc.compiler.passes.slicing.busiest_slots`' count). The
least-squares slope of time against the busiest block's slots is the cost of one slot as a thread
block sees it (fill and drain of the pipeline shrink with the slice too, so at small sizes the
slope is a lower bound). ``slot us`` is that slope; ``vs model`` is it over the constant.

On the CPU emulation (``--backend cpu``, the default where no GPU is present) the numbers are the
emulator's, not a GPU's: that backend is for checking this script.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _sizes(text: str) -> list[int]:
    from hccc.args import parse_size
    return [parse_size(s) for s in text.split(",") if s]


def slots_of(ir, nbytes: int, slice_bytes: int, element_bytes: int = 4) -> int:
    """Slots of the busiest thread block of ``ir`` in a call of ``nbytes`` cut into ``slice_bytes``
    slices: its primitives times the micro-batches per chunk."""
    from hccc.compiler.passes.slicing import micro_batches
    r, t = ir.prims["rank"], ir.prims["tb"]
    key = r.astype("int64") * (1 << 20) + t.astype("int64")
    per_tb = int(np.unique(key, return_counts=True)[1].max())
    return per_tb * micro_batches(nbytes, ir.nchunks, slice_bytes, element_bytes)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys against xs (None with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return None
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def measure(name: str, ir, runner, sizes: list[int], slices: list[int], iters: int, warmup: int) -> list[dict]:
    rows = []
    for size in sizes:
        for sl in slices:
            res = runner.run(size, slice_bytes=sl, iters=iters, warmup=warmup, seed=0)
            ok = not res.stuck and not res.wrong and res.iters
            rows.append({"algorithm": name, "bytes": size, "slice": int(res.slice_bytes or sl),
                         "slots": slots_of(ir, size, int(res.slice_bytes or sl)),
                         "time_us": float(res.time_us) if ok else None, "wrong": int(res.wrong),
                         "stuck": res.stuck})
    return rows


def fits(rows: list[dict]) -> list[dict]:
    """One slope per (algorithm, size) over the rows that ran."""
    from hccc.compiler.passes.slicing import THIN_SLOT_SECONDS
    out = []
    for key in dict.fromkeys((r["algorithm"], r["bytes"]) for r in rows):
        good = [r for r in rows if (r["algorithm"], r["bytes"]) == key and r["time_us"] is not None]
        s = slope([r["slots"] for r in good], [r["time_us"] for r in good])
        out.append({"algorithm": key[0], "bytes": key[1], "slot_us": s,
                    "vs_model": None if s is None else s / (THIN_SLOT_SECONDS * 1e6)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None, help="cuda, hip or cpu (default: cuda where a GPU answers, else cpu)")
    ap.add_argument("--algorithms", default="ring_allgather_8,ring_allreduce_8")
    ap.add_argument("--sizes", default="4M,64M")
    ap.add_argument("--slices", default="64K,32K,16K,8K,4K")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from hccc.compiler.pipeline import CompileOptions, load_program
    from hccc.runtime import launcher
    from hccc.runtime.platform import PlatformError, get_platform

    backend = args.backend
    if backend is None:
        try:
            get_platform("cuda").close()
            backend = "cuda"
        except (PlatformError, ImportError):
            backend = "cpu"
    sizes, slices = _sizes(args.sizes), _sizes(args.slices)
    rows = []
    for name in (a for a in args.algorithms.split(",") if a):
        ir = load_program(str(ROOT / "examples" / f"{name}.rccl"), CompileOptions())
        nw = ir.nwarps
        while True:      # the most threads per block at which every block of the run is resident
            try:
                runner = launcher.Runner(ir, backend, "float32", "sum", nthreads=32 * nw)
                break
            except PlatformError as exc:
                if "resident" not in str(exc) or nw == 1:
                    raise
                nw //= 2
        with runner:
            rows += measure(name, ir, runner, sizes, slices, args.iters, args.warmup)
    fitted = fits(rows)
    if args.json:
        print(json.dumps({"backend": backend, "rows": rows, "fits": fitted}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"slot cost ({backend})")
        for c in ("algorithm", "size", "slice", "slots", "time us"):
            t.add_column(c, justify="right")
        for r in rows:
            t.add_row(r["algorithm"], str(r["bytes"]), str(r["slice"]), str(r["slots"]),
                      "-" if r["time_us"] is None else f"{r['time_us']:.1f}")
        Console().print(t)
        f = Table(title="slope of time against the busiest block's slots")
        for c in ("algorithm", "size", "slot us", "vs model"):
            f.add_column(c, justify="right")
        for r in fitted:
            f.add_row(r["algorithm"], str(r["bytes"]), "-" if r["slot_us"] is None else f"{r['slot_us']:.3f}",
                      "-" if r["vs_model"] is None else f"{r['vs_model']:.2f}")
        Console().print(f)
    return 0 if all(r["time_us"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
