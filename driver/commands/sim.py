"""``hccc sim ALGO --topology T [--sizes 1M,64M,1G] [--scheduler hpds|rr] [--tb-alloc state|connection]
[--execution task|algorithm] [--chunk-size B] [--dtype D] [--json] [--plot timeline.png]``

Simulates the compiled program on a cluster under the alpha-beta-gamma model of
:mod:`hccc.runtime.simulator` and prints an nccl-tests-like table (one row per size), or with
``--json``::

    {"results": [{"bytes", "time_us", "algbw_GBps", "busbw_GBps", "chunk_bytes", ...}, ...],
     "chunk_bytes": ..., "slice": "auto" | "fixed",
     "tbs_per_rank_max": ..., "tb_idle_avg": ..., "tb_idle_max": ..., ...}

where the top-level idle ratios are those of the largest size. The micro-batch slice follows the
size (:func:`hccc.compiler.passes.slicing.auto_slice_bytes`, up to the FIFO slot capacity: 1 MiB, or a
given IR's ``chunk_bytes``); each result records the slice it used as ``chunk_bytes`` and the
top-level ``chunk_bytes`` is the slot capacity. ``--chunk-size B`` fixes slot and slice to ``B``
for every size (``"slice": "fixed"``). ALGO is a ``.rccl`` algorithm
(verified, then scheduled and lowered with the given options), a ProgramIR ``.json`` or an MSCCL
``.xml`` (run as given). ``--execution algorithm`` is the MSCCL-like baseline: for a ``.rccl``
the transfers run in step order on connection-based TBs (unless ``--tb-alloc`` says otherwise),
every micro-batch running the TB's whole primitive list; a given IR keeps its TBs, and by default
runs the way it was checked for (an MSCCL import that is only deadlock-free under MSCCL's
algorithm-level execution says so in ``stats["execution"]``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
from hccc.compiler.frontend.limits import printable

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
DEFAULT_SIZES = "1M,64M,1G"
PLOT_ROWS = 48  # TBs shown (and recorded) in the timeline


def _sizes(text: str) -> list[int]:
    from hccc.cli import parse_size

    parts = [s for s in text.split(",") if s.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected sizes such as 1M,64M,1G")
    out = [parse_size(s) for s in parts]
    if len(out) > 64:
        raise argparse.ArgumentTypeError("at most 64 sizes")
    return out


def _chunk(text: str) -> int:
    from hccc.cli import parse_size

    v = parse_size(text)
    if v % 16 or v > (1 << 30):
        raise argparse.ArgumentTypeError(f"chunk size must be a multiple of 16 bytes of at most 1G, not '{text}'")
    return v


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", metavar="ALGO", help="algorithm (.rccl), ProgramIR (.json) or MSCCL XML (.xml)")
    p.add_argument("--topology", "-t", required=True, metavar="T",
                   help="cluster description (.topo, or a TACCL profile .json)")
    p.add_argument("--sizes", type=_sizes, default=_sizes(DEFAULT_SIZES), metavar="S1,S2,...",
                   help=f"buffer sizes (nccl-tests' size: the full buffer), K/M/G suffixes (default {DEFAULT_SIZES})")
    p.add_argument("--scheduler", choices=("hpds", "rr"), default="hpds",
                   help="HPDS or the round-robin baseline (task-level execution)")
    p.add_argument("--tb-alloc", choices=("state", "connection"), default=None,
                   help="thread-block allocation (default: state for task-level, connection for algorithm-level)")
    p.add_argument("--execution", choices=("task", "algorithm"), default=None,
                   help="task-level (hccc's kernels) or algorithm-level (MSCCL-like baseline); default "
                        "task, or for a given IR / XML the execution it was checked for")
    p.add_argument("--chunk-size", type=_chunk, default=None, metavar="BYTES",
                   help="fixed micro-batch slice and FIFO slot size for every size (default: slots of 1M, "
                        "or a given IR's own, and a slice chosen per size)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32",
                   help="element type (sizes are rounded down to whole elements; default float32)")
    p.add_argument("--max-transfers", type=int, default=10 ** 7, metavar="N",
                   help="refuse programs with more transfers than this (default 10^7)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="write a timeline of the largest size (PNG, SVG or PDF, by extension)")


def _progress(args, text: str) -> None:
    if not args.json and sys.stderr.isatty():
        sys.stderr.write(f"hccc sim: {text}\n")
        sys.stderr.flush()


def _load(args):
    """The ProgramIR to simulate; sets ``args.execution`` when it was left to the input."""
    from hccc.compiler.pipeline import CompileOptions, load_algorithm, load_program
    from hccc.compiler.passes.slicing import DEFAULT_SLOT_BYTES
    from hccc.compiler.passes.verify import verify
    from hccc.runtime.simulator import build_for_execution

    path = Path(args.algo)
    if path.suffix.lower() in (".json", ".xml"):
        opts = CompileOptions(scheduler=args.scheduler, tb_alloc=args.tb_alloc or "state",
                              chunk_bytes=args.chunk_size or DEFAULT_SLOT_BYTES,
                              max_transfers=args.max_transfers)
        ir = load_program(path, opts)
        if args.chunk_size:
            ir.chunk_bytes = args.chunk_size
        if args.execution is None:  # an MSCCL import records whether it only runs algorithm-level
            ex = ir.stats.get("execution")
            args.execution = ex if ex in ("task", "algorithm") else "task"
        return ir
    if args.execution is None:
        args.execution = "task"
    alg = load_algorithm(path, max_transfers=args.max_transfers)
    verify(alg)
    return build_for_execution(alg, args.execution, scheduler=args.scheduler, tb_alloc=args.tb_alloc,
                               chunk_bytes=args.chunk_size or DEFAULT_SLOT_BYTES)


def _human(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def run(args) -> int:
    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime.simulator import SimulationError, prepare, simulate

    topo = load_cluster(args.topology)
    _progress(args, f"building {args.algo}")
    ir = _load(args)
    try:
        prog = prepare(ir, topo)
    except SimulationError as exc:
        raise CompileError([Diagnostic(str(exc), None)]) from None
    esize = DTYPE_BYTES[args.dtype]
    slice_mode = None if args.chunk_size else "auto"   # --chunk-size: slot and slice fixed
    sizes = list(args.sizes)
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    results = []
    for i, size in enumerate(sizes):
        _progress(args, f"simulating {_human(size)}")
        try:
            results.append(simulate(prog, topo, size, execution=args.execution, element_bytes=esize,
                                    record=PLOT_ROWS if args.plot and i == largest else 0,
                                    slice_bytes=slice_mode))
        except SimulationError as exc:
            raise CompileError([Diagnostic(str(exc), None)]) from None
    st = ir.stats
    big = results[largest]
    tb_alloc = st.get("tb_alloc") or args.tb_alloc
    scheduler = st.get("scheduler") or args.scheduler
    if args.plot:
        from hccc.runtime.sim_plot import plot_timeline
        try:
            plot_timeline(big, prog, args.plot, max_rows=PLOT_ROWS)
        except (OSError, ValueError) as exc:
            raise CompileError([Diagnostic(f"cannot write the plot '{args.plot}': {exc}", None)]) from None
    if args.json:
        print(json.dumps({
            "algorithm": ir.name, "collective": ir.collective, "nranks": int(ir.nranks),
            "topology": topo.name, "execution": args.execution, "scheduler": scheduler,
            "tb_alloc": tb_alloc, "chunk_bytes": int(ir.chunk_bytes),
            "slice": "fixed" if slice_mode is None else "auto", "dtype": args.dtype,
            "results": [r.summary() for r in results],
            "tbs_per_rank_max": big.tbs_per_rank_max, "tbs_total": big.ntbs,
            "tbs_state_based": st.get("tbs_state_based"), "tbs_connection_based": st.get("tbs_connection_based"),
            "tb_idle_avg": big.tb_idle_avg, "tb_idle_max": big.tb_idle_max, "comm_time": big.comm_time,
            "plot": args.plot,
        }))
        return 0
    print(f"# hccc sim: {ir.name} ({ir.collective}, {ir.nranks} ranks) on {topo.name}: "
          f"{args.execution}-level execution, scheduler {scheduler}, {tb_alloc}-based TBs "
          f"({big.ntbs} in total, at most {big.tbs_per_rank_max} per rank), "
          f"{_human(int(ir.chunk_bytes))}B slots, "
          f"{'slice per size' if slice_mode else 'fixed slice'}, {args.dtype}")
    print("#")
    head = (f"{'size':>12} {'count':>11} {'type':>8} {'time(us)':>11} {'algbw(GB/s)':>12} "
            f"{'busbw(GB/s)':>12} {'bound(us)':>11} {'slice':>7} {'mbatch':>7} {'idle avg':>9} "
            f"{'idle max':>9}")
    print("#" + head[1:])
    for r in results:
        print(f"{r.nbytes:>12} {r.nbytes // esize:>11} {args.dtype:>8} {r.time_us:>11.2f} "
              f"{r.algbw_GBps:>12.2f} {r.busbw_GBps:>12.2f} {r.lower_bound_s * 1e6:>11.2f} "
              f"{_human(r.slice_bytes):>7} {r.micro_batches:>7} {100 * r.tb_idle_avg:>8.1f}% "
              f"{100 * r.tb_idle_max:>8.1f}%")
    if args.plot:
        print(f"# timeline of {_human(big.nbytes)}B written to {printable(str(args.plot))}")
    return 0
