"""What one slot (one primitive's micro-batch: a flag waited for and one posted) costs a thread
block on a GPU, beyond the bytes it moves: the per-unit cost of the slice policy's model
(``UNIT_SECONDS``, compiler/passes/slicing.py, which ``hccc synth`` weighs smaller slices with too).
What the v3 kernels measured: docs/archive/measurements-log.md#the-third-gpu-run-one-nvidia-h200-every-rank-on-it;
the model now holds the v4 kernels' target.

    python benchmarks/slot_cost.py [--backend cuda] [--algorithms ring_allgather_8,ring_allreduce_8]
                                   [--sizes 4M,64M] [--slices 64K,32K,16K,8K,4K] [--nwarps auto]
                                   [--direct auto] [--placement out] [--iters 10] [--json]
    python benchmarks/slot_cost.py --diagnose      # where the slot's time goes (below)

For each algorithm (examples/) and size (the collective's full buffer), the launcher runs the same
call with each fixed micro-batch slice (``Runner.run(slice_bytes=)``), every rank on one device,
out of place (``--placement in`` or ``out,in``: in place too), float32 sum, and checks the result
against the oracle. The bytes each rank moves
do not depend on the slice; the slots do: the busiest thread block handles (its primitives) x
(micro-batches per chunk) of them (:func:`hccc.compiler.passes.slicing.busiest_slots`' count). The
least-squares slope of time against the busiest block's slots is the cost of one slot as a thread
block sees it (fill and drain of the pipeline shrink with the slice too, so at small sizes the
slope is a lower bound). ``slot us`` is that slope; ``vs model`` is it over ``UNIT_SECONDS``.

An algorithm is an example's name (examples/NAME.rccl) or GENERATOR:N, a generated program on N
ranks (ring_allgather, ring_allreduce, direct_allgather: :mod:`hccc.compiler.frontend.generators`).
``--nwarps`` runs each at those warps per thread block (``auto``: the program's, halved until
every block is resident) and ``--direct`` with the sender writing the receiver's buffer where
proven safe (``auto``) or through the FIFO (``off``); every combination gets its own slope.

The same axes take apart a program that runs far slower than its slots explain (the H100's ring
Broadcast 8 and in-place HM AllReduce 4x8 at 32 MiB,
docs/measurements.md#every-example-on-a-gpu-one-nvidia-h100-every-rank-on-it): for example
``--algorithms ring_broadcast_8,ring_allgather_8 --sizes 1M,32M --slices 64K,256K --nwarps 16,4
--direct auto,off`` or ``--algorithms hm_allreduce_4x8 --sizes 4M,32M --placement out,in``.

``--diagnose`` asks the questions a slot's time answers, at 4 MiB with 64, 16 and 4 KiB slices:
does it grow with the ranks a slot's chain crosses (ring AllGather on 2 and on 8 ranks), with the
warps that each poll and fence (16, 4, 1 warps a block), and with the FIFO copy (direct on, off)?
A cost that stays with 2 ranks and 1 warp is the block's own per-message path; one that falls
with the warps is per-warp polling and fencing; one that grows with the ranks is the chain.

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
    from hccc.compiler.passes.slicing import busiest_tb_prims, micro_batches
    return busiest_tb_prims(ir) * micro_batches(nbytes, ir.nchunks, slice_bytes, element_bytes)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys against xs (None with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return None
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


#: the programs ``GENERATOR:N`` names
GENERATORS = ("ring_allgather", "ring_allreduce", "direct_allgather")
#: the run ``--diagnose`` makes
DIAGNOSE = dict(algorithms="ring_allgather:2,ring_allgather:8", sizes="4M", slices="64K,16K,4K",
                nwarps="16,4,1", direct="auto,off")
#: what a row's measurement is keyed by (one slope per key but the slice)
KEY = ("algorithm", "bytes", "nwarps", "direct", "inplace")
#: --placement's values: out of place, in place
PLACEMENTS = {"out": False, "in": True}


def program(name: str):
    """The ProgramIR ``name`` stands for: GENERATOR:N, or an example's name."""
    from hccc.compiler.pipeline import CompileOptions, load_program
    if ":" in name:
        from hccc.compiler.frontend import generators
        from hccc.compiler.passes.build import build_program
        gen, _, n = name.partition(":")
        if gen not in GENERATORS or not n.isdigit() or int(n) < 2:
            raise SystemExit(f"slot_cost: {name!r}: expected GENERATOR:N with GENERATOR one of "
                             f"{', '.join(GENERATORS)} and N >= 2")
        return build_program(getattr(generators, gen)(int(n)), chunk_bytes=CompileOptions().chunk_bytes)
    path = ROOT / "examples" / f"{name}.rccl"
    if not path.is_file():
        raise SystemExit(f"slot_cost: no example {name!r} (examples/{name}.rccl)")
    return load_program(str(path), CompileOptions())


def open_runner(launcher, ir, backend: str, nwarps: str, direct: str):
    """(Runner, warps a block): ``nwarps`` warps, or (``auto``) the most from the program's own
    count down at which every block of the run is resident."""
    from hccc.runtime.platform import PlatformError
    nw = ir.nwarps if nwarps == "auto" else int(nwarps)
    while True:
        try:
            return launcher.Runner(ir, backend, "float32", "sum", nthreads=32 * nw, direct=direct), nw
        except PlatformError as exc:
            if nwarps != "auto" or "resident" not in str(exc) or nw == 1:
                raise
            nw //= 2


def measure(name: str, ir, runner, sizes: list[int], slices: list[int], iters: int, warmup: int,
            nwarps: int = 0, direct: str = "auto", placements: tuple[bool, ...] = (False,)) -> list[dict]:
    rows = []
    for size in sizes:
        for inplace in placements:
            for sl in slices:
                res = runner.run(size, slice_bytes=sl, iters=iters, warmup=warmup, seed=0, inplace=inplace)
                ok = not res.stuck and not res.wrong and res.iters
                ran = int(res.slice_bytes or sl)
                rows.append({"algorithm": name, "bytes": size, "nwarps": nwarps, "direct": direct,
                             "inplace": bool(inplace), "slice": ran, "slots": slots_of(ir, size, ran),
                             "time_us": float(res.time_us) if ok else None, "wrong": int(res.wrong),
                             "stuck": res.stuck})
    return rows


def fits(rows: list[dict]) -> list[dict]:
    """One slope per (algorithm, size, warps, direct mode) over the rows that ran."""
    from hccc.compiler.passes.slicing import UNIT_SECONDS
    out = []
    for key in dict.fromkeys(tuple(r[k] for k in KEY) for r in rows):
        good = [r for r in rows if tuple(r[k] for k in KEY) == key and r["time_us"] is not None]
        s = slope([r["slots"] for r in good], [r["time_us"] for r in good])
        out.append(dict(zip(KEY, key), slot_us=s, vs_model=None if s is None else s / (UNIT_SECONDS * 1e6)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None, help="cuda, hip or cpu (default: cuda where a GPU answers, else cpu)")
    ap.add_argument("--algorithms", default="ring_allgather_8,ring_allreduce_8")
    ap.add_argument("--sizes", default="4M,64M")
    ap.add_argument("--slices", default="64K,32K,16K,8K,4K")
    ap.add_argument("--nwarps", default="auto", help="warps a block, comma-separated, or auto")
    ap.add_argument("--direct", default="auto", help="auto, off or both, comma-separated")
    ap.add_argument("--placement", default="out", help="out (of place), in (place) or both, comma-separated")
    ap.add_argument("--diagnose", action="store_true", help="the runs that say where a slot's time goes")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.diagnose:
        for k, v in DIAGNOSE.items():
            setattr(args, k, v)

    from hccc.runtime import launcher
    from hccc.runtime.generated import DIRECT_MODES
    from hccc.runtime.platform import PlatformError, get_platform

    backend = args.backend
    if backend is None:
        try:
            get_platform("cuda").close()
            backend = "cuda"
        except (PlatformError, ImportError):
            backend = "cpu"
    sizes, slices = _sizes(args.sizes), _sizes(args.slices)
    warps = [w for w in args.nwarps.split(",") if w]
    directs = [d for d in args.direct.split(",") if d]
    places = [p for p in args.placement.split(",") if p]
    bad = [w for w in warps if w != "auto" and not (w.isdigit() and int(w) >= 1)] + \
          [d for d in directs if d not in DIRECT_MODES] + [p for p in places if p not in PLACEMENTS]
    if bad or not places:
        raise SystemExit(f"slot_cost: {bad[0] if bad else args.placement!r}: --nwarps takes auto or counts, "
                         f"--direct {' or '.join(DIRECT_MODES)}, --placement out or in")
    rows = []
    for name in (a for a in args.algorithms.split(",") if a):
        ir = program(name)
        for w in warps:
            for d in directs:
                runner, nw = open_runner(launcher, ir, backend, w, d)
                with runner:
                    rows += measure(name, ir, runner, sizes, slices, args.iters, args.warmup, nw, d,
                                    tuple(dict.fromkeys(PLACEMENTS[p] for p in places)))
    fitted = fits(rows)
    if args.json:
        print(json.dumps({"backend": backend, "rows": rows, "fits": fitted}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"slot cost ({backend})")
        for c in ("algorithm", "size", "warps", "direct", "place", "slice", "slots", "time us"):
            t.add_column(c, justify="right")
        for r in rows:
            t.add_row(r["algorithm"], str(r["bytes"]), str(r["nwarps"]), r["direct"],
                      "in" if r["inplace"] else "out", str(r["slice"]),
                      str(r["slots"]), "-" if r["time_us"] is None else f"{r['time_us']:.1f}")
        Console().print(t)
        f = Table(title="slope of time against the busiest block's slots")
        for c in ("algorithm", "size", "warps", "direct", "place", "slot us", "vs model"):
            f.add_column(c, justify="right")
        for r in fitted:
            f.add_row(r["algorithm"], str(r["bytes"]), str(r["nwarps"]), r["direct"], "in" if r["inplace"] else "out",
                      "-" if r["slot_us"] is None else f"{r['slot_us']:.3f}",
                      "-" if r["vs_model"] is None else f"{r['vs_model']:.2f}")
        Console().print(f)
    return 0 if all(r["time_us"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
