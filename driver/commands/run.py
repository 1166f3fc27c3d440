"""``hccc run ALGO --backend cpu|cuda``: compile, run the emitted kernels and check them.

ALGO is an algorithm (``.rccl``: verified, scheduled and lowered with --scheduler / --tb-alloc /
--chunk-size, like the compile command), a ProgramIR ``.json`` as written into OUTDIR (run exactly
as given, not re-verified), an MSCCL ``.xml``, or a compiled OUTDIR (or its ``manifest.json``):
its ProgramIR, each rank on the platform the manifest gives it. The kernels are built once per
(program, rank platforms, backend, dtype, op) and cached by content hash (``$HCCC_CACHE_DIR``,
default ``~/.cache/hccc``).

Mixed-vendor programs. Each rank runs on a platform: the manifest's, or with ``--topology T`` its
node's vendor (NVIDIA: CUDA, AMD: HIP), else CUDA (HIP with ``--backend hip``). ``--backend cpu`` emulates every platform on the
CPU: one library per platform present, built from exactly that platform's rank sources (``.cu``
for CUDA ranks, ``.hip`` for HIP ranks: the split the emitted build files make), every rank
launched from its platform's library. ``--backend cuda`` / ``--backend hip`` run programs whose
ranks are all of that platform; a mixed program is refused there (one process cannot give CUDA and
HIP kernels shared memory for the FIFOs), naming the ranks.

Every size runs ``--warmup`` + ``--iters`` times on fresh inputs; the outputs of the last run are
compared element by element with the reference executor (``hccc.runtime.reference``). The table
follows nccl-tests::

    #       size         count      type   redop     time   algbw   busbw  #wrong
    #        (B)    (elements)                       (us)  (GB/s)  (GB/s)

``size`` is the collective's full buffer, nccl-tests' S: the per-rank buffer of an AllReduce, the
per-rank *output* of an AllGather, the per-rank *input* of a ReduceScatter; ``count`` = size /
sizeof(type). algbw = size / time; busbw = algbw x 2(n-1)/n (AllReduce), (n-1)/n (AllGather,
ReduceScatter) or 1 (Broadcast, Reduce). Exit status 1 when an element is wrong or a run sticks (a deadlocked program is
reported as "rank R, TB T stuck in <primitive> for chunk C (micro-batch M)", never hangs: kernels
give up after --timeout seconds of waiting, and a host watchdog backs that up).

``--json`` prints ``{"algorithm", "collective", "nranks", "backend", "nthreads", "ok",
"rank_platform": [per-rank "cuda"/"hip"], "libraries": {platform: {"ranks", "backend", "library"}},
"results":
[{"bytes", "count", "dtype", "op", "inplace", "wrong", "time_us", "algbw_GBps", "busbw_GBps",
"stuck", "first_wrong", "collective_wrong", ...}]}`` (``time_us`` and the bandwidths are null for a
run that stuck).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from hccc.cli import parse_size

DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")
TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "int32": "int32"}
DEFAULT_BYTES = "4K,64K,1M"


def size_list(text: str) -> list[int]:
    """``4K,64K,1M`` -> byte counts (``0`` allowed)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise argparse.ArgumentTypeError(f"empty size in '{text}'")
        out.append(0 if part == "0" else parse_size(part))
    return out


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a non-negative number of seconds, got '{text}'")
    return v


def _count(text: str, low: int) -> int:
    if not text.isdigit() or int(text) < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got '{text}'")
    return int(text)


def add_program_options(parser: argparse.ArgumentParser, chunk_default: int = 1 << 20) -> None:
    """Options of the compile command that apply when ALGO is an algorithm file."""
    from hccc.cli import _positive_int
    parser.add_argument("--scheduler", choices=("hpds", "rr"), default="hpds",
                        help="for .rccl input: HPDS or the round-robin baseline")
    parser.add_argument("--tb-alloc", choices=("state", "connection"), default="state",
                        help="for .rccl input: state-based or connection-based thread blocks")
    parser.add_argument("--chunk-size", type=parse_size, default=chunk_default, metavar="BYTES",
                        help=f"for .rccl input: micro-batch slice (FIFO slot) size (default {chunk_default})")
    parser.add_argument("--max-transfers", type=_positive_int, default=10 ** 7, metavar="N",
                        help="for .rccl input: refuse programs with more transfers (default 10^7)")


def load(args):
    from hccc.compiler.pipeline import CompileOptions, load_program
    opts = CompileOptions(scheduler=args.scheduler, tb_alloc=args.tb_alloc,
                          chunk_bytes=args.chunk_size, max_transfers=args.max_transfers)
    return load_program(args.algo, opts)


def load_with_platforms(args):
    """(ProgramIR, per-rank platforms) for ``hccc run``'s ALGO and ``--topology``."""
    from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
    from hccc.compiler.pipeline import load_manifest, manifest_path

    mpath = manifest_path(args.algo)
    if mpath is not None:
        if args.topology is not None:
            raise CompileError([Diagnostic(
                f"{args.algo} is compiled output: its manifest already gives every rank's platform "
                "(drop --topology, or pass the algorithm itself)", None)])
        return load_manifest(mpath)
    if args.topology is None:
        ir = load(args)       # one platform: HIP with --backend hip, else CUDA (as the compiler)
        return ir, ["hip" if args.backend == "hip" else "cuda"] * ir.nranks
    from hccc.compiler.pipeline import (IR_SUFFIXES, XML_SUFFIXES, CompileOptions, load_algorithm,
                                        platforms_for, read_cluster)
    cluster = read_cluster(args.topology)
    if Path(args.algo).suffix.lower() in IR_SUFFIXES + XML_SUFFIXES:
        from hccc.compiler.cluster.topology_check import check_ir_on_topology
        ir = load(args)
        check_ir_on_topology(ir, cluster.topology, cluster.name)
    else:
        from hccc.compiler.passes.build import build_program
        from hccc.compiler.cluster.topology_check import check_on_topology
        from hccc.compiler.passes.verify import verify
        alg = load_algorithm(args.algo, max_transfers=args.max_transfers)
        verify(alg)
        check_on_topology(alg, cluster.topology, cluster.name)
        opts = CompileOptions(scheduler=args.scheduler, tb_alloc=args.tb_alloc,
                              chunk_bytes=args.chunk_size, max_transfers=args.max_transfers)
        ir = build_program(alg, scheduler=opts.scheduler, tb_alloc=opts.tb_alloc,
                           chunk_bytes=opts.chunk_bytes, fuse=opts.fuse)
    return ir, [pls[0] for pls in platforms_for(ir.nranks, "auto", cluster.topology)]


def _slice(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    v = parse_size(text)
    if v <= 0 or v % 16:
        raise argparse.ArgumentTypeError(f"slice size must be 'auto' or a positive multiple of 16 bytes: {text!r}")
    return v


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Compile ALGO, run its kernels (CPU emulation, CUDA or HIP) at each size and "
                          "check every element against the reference executor; prints an "
                          "nccl-tests-style table. Exit status 1 when an element is wrong or a run "
                          "sticks.")
    parser.add_argument("algo", metavar="ALGO",
                        help="algorithm (.rccl), ProgramIR (.json, run as given), MSCCL XML (.xml), "
                             "or a compiled OUTDIR / its manifest.json (ranks on the manifest's platforms)")
    parser.add_argument("--backend", choices=("cpu", "cuda", "hip"), default="cpu",
                        help="cpu: every rank's emitted source (.cu or .hip) compiled with g++ and "
                             "the emulation header, one library per platform of a mixed program "
                             "(every thread block is a group of OS threads); cuda: a CUDA program on "
                             "a GPU through CuPy; hip: a HIP program on an AMD GPU (default cpu)")
    parser.add_argument("--topology", metavar="T", default=None,
                        help="cluster (.topo or TACCL .json): the program must fit it, and each "
                             "rank runs on its node's vendor's platform (NVIDIA: CUDA, AMD: HIP)")
    parser.add_argument("--bytes", type=size_list, default=size_list(DEFAULT_BYTES), metavar="N[,N...]",
                        help="sizes in bytes (K/M/G suffixes): the collective's full buffer, as "
                             "nccl-tests' size: AllReduce per-rank buffer, AllGather per-rank "
                             "output, ReduceScatter per-rank input; a multiple of the element size "
                             f"(default {DEFAULT_BYTES})")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    parser.add_argument("--op", choices=OPS, default="sum", help="reduction operator (default sum)")
    parser.add_argument("--inplace", action="store_true",
                        help="in-place: AllReduce input == output, AllGather input inside the output, "
                             "ReduceScatter output inside the input")
    parser.add_argument("--iters", type=lambda t: _count(t, 1), default=3, metavar="N",
                        help="timed runs per size (default 3)")
    parser.add_argument("--warmup", type=lambda t: _count(t, 0), default=1, metavar="N",
                        help="untimed runs per size first (default 1)")
    parser.add_argument("--timeout", type=_positive_float, default=10.0, metavar="SECONDS",
                        help="a thread block that waits this long gives up and reports where it is "
                             "stuck (default 10; 0 = never, the host watchdog still applies)")
    parser.add_argument("--threads", type=lambda t: _count(t, 1), default=None, metavar="N",
                        help="threads per thread block (default: the emitted kernels' count on a "
                             "GPU, 2 on the CPU)")
    parser.add_argument("--seed", type=lambda t: _count(t, 0), default=0, help="input data seed")
    parser.add_argument("--slice-size", type=_slice, default="auto", metavar="BYTES|auto",
                        help="micro-batch slice per launch (default auto: sized for each --bytes so a "
                             "chunk gets about 32 micro-batches, at most the compiled --chunk-size)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_program_options(parser)


def _row(res) -> str:
    if res.stuck is not None:
        t = f"{'stuck':>9s}  {'-':>6s}  {'-':>6s}  {'-':>6s}"
    else:
        t = f"{res.time_us:9.1f}  {res.algbw_GBps:6.2f}  {res.busbw_GBps:6.2f}  {res.wrong:6d}"
    return (f"{res.bytes:12d}  {res.count:12d}  {TYPE_NAMES[res.dtype]:>8s}  {res.op:>6s}  {t}")


def run(args) -> int:
    from hccc.runtime.launcher import ELEMENT_BYTES, Runner, rank_ranges
    from hccc.runtime.platform import PlatformError

    es = ELEMENT_BYTES[args.dtype]
    bad = [b for b in args.bytes if b % es]
    if bad:
        sys.stderr.write(f"hccc run: error: --bytes {bad[0]} is not a whole number of {args.dtype} "
                         f"elements ({es} bytes each)\n")
        return 2
    ir, plats = load_with_platforms(args)
    if ir.algorithm_level:
        # An MSCCL import proven only under the MSCCL runtimes' algorithm-level order (every micro-batch
        # runs the whole step list). hccc's kernels run each primitive for all micro-batches first;
        # with a single micro-batch per chunk the two orders coincide, so make the slot hold a chunk.
        most = max(args.bytes) * max(1, ir.nranks) // es
        per_chunk = -(-most // max(1, ir.nchunks)) * es
        ir.chunk_bytes = max(ir.chunk_bytes, -(-per_chunk // 16) * 16)
    tty = sys.stderr.isatty() and not args.json
    if tty:
        sys.stderr.write(f"hccc: building {ir.name} for {args.backend} ({args.dtype}, {args.op})...\n")
    results = []
    try:
        with Runner(ir, args.backend, args.dtype, args.op, platforms=plats, nthreads=args.threads,
                    timeout_s=args.timeout) as runner:
            libraries = {pl: {"ranks": rs, "backend": runner.platforms[pl].name,
                              "library": str(runner.libraries[pl])}
                         for pl, rs in runner.library_ranks.items()}
            if not args.json:
                print(f"# hccc run: {ir.name}: {ir.collective} on {ir.nranks} ranks, backend "
                      f"{args.backend}, {runner.block} thread(s) per thread block, "
                      f"{'in-place' if args.inplace else 'out-of-place'}, chunk size {ir.chunk_bytes} B")
                if len(libraries) > 1 or plats[0] != "cuda":
                    print("# " + "; ".join(
                        f"{pl.upper()} ranks {rank_ranges(v['ranks'])} from the {pl} library "
                        f"({v['backend']})" for pl, v in libraries.items()))
                print("#")
                print(f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'time':>9s}  "
                      f"{'algbw':>6s}  {'busbw':>6s}  {'#wrong':>6s}")
                print(f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'(us)':>9s}  "
                      f"{'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>6s}")
            for nbytes in args.bytes:
                res = runner.run(nbytes, inplace=args.inplace, iters=args.iters, warmup=args.warmup,
                                 seed=args.seed, slice_bytes=args.slice_size)
                results.append(res)
                if not args.json:
                    print(_row(res), flush=True)
                    if res.stuck is not None:
                        print(f"#   {res.stuck}", flush=True)
                    elif res.wrong:
                        print(f"#   first wrong: {res.first_wrong}", flush=True)
                    elif res.collective_wrong > 0:
                        print(f"#   {ir.name} does not implement {ir.collective}: {res.collective_wrong} "
                              f"element(s) of its reference run differ from the definition; first: "
                              f"{res.first_wrong}", flush=True)
                if res.stuck is not None and "host watchdog" in res.stuck:
                    break   # the platform may be unusable now
            nthreads, pname = runner.block, args.backend
    except PlatformError as exc:
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    except ValueError as exc:
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    ok = all(r.ok for r in results)
    if args.json:
        print(json.dumps({"algorithm": ir.name, "collective": ir.collective, "nranks": ir.nranks,
                          "backend": pname, "nthreads": nthreads, "ok": ok,
                          "rank_platform": plats, "libraries": libraries,
                          "results": [r.to_json() for r in results]}))
    else:
        good = [r for r in results if r.stuck is None and math.isfinite(r.busbw_GBps)]
        avg = sum(r.busbw_GBps for r in good) / len(good) if good else float("nan")
        wrong = sum(max(r.wrong, 0) for r in results)
        stuck = sum(r.stuck is not None for r in results)
        notcoll = sum(r.collective_wrong > 0 for r in results)
        print(f"# wrong elements: {wrong}, stuck runs: {stuck}"
              + (f", runs whose reference result is not the collective: {notcoll}" if notcoll else "")
              + f"  {'OK' if ok else 'FAILED'}")
        print(f"# avg bus bandwidth: {avg:.4g} GB/s")
    return 0 if ok else 1
