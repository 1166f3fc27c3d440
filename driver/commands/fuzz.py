"""``hccc fuzz ALGO [--examples N] [--backend cpu] [--seed S]``: random runs of the emitted kernels.

ALGO is compiled once with a small chunk size (``--chunk-size``, default 256 bytes), so the random
sizes give anything from empty chunks to many micro-batches per chunk and FIFO wrap-around. Each
example draws a size (biased to edges: empty and one-element chunks, remainders of the chunk split,
exact multiples of the slice and of the FIFO depth), a dtype, a reduction operator, in-place or
out-of-place, and the threads per thread block, runs the kernels (:func:`hccc.testing.fuzz_kernels`)
and compares every element with the reference executor. The first failing case is shrunk by
hypothesis and printed with a ``hccc run`` command that reproduces it (exit status 1); otherwise a
summary (exit status 0). A ProgramIR ``.json`` keeps its own chunk size.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from hccc.args import add_program_options, count_at_least, dtype_list, op_list, program_options, seconds
from hccc.commands.run import DTYPES, OPS
from hccc.util.plural import plural
from hccc.progress import Progress
from hccc.sweep import add_nccl_long_names, add_rank_options, ranks_error

SUMMARY = "run random sizes/dtypes/ops through the kernels and the oracle"
INPUTS = {"algo": "algorithm"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run random sizes, dtypes, reduction operators, in-place/out-of-place "
                          "and threads per block through ALGO's emitted kernels and the reference "
                          "executor; report the first failing case, shrunk.")
    parser.add_argument("algo", metavar="ALGO",
                        help="algorithm (.rccl), ProgramIR (.json) or MSCCL XML (.xml)")
    parser.add_argument("--examples", type=count_at_least(1), default=50, metavar="N",
                        help="random cases to run")
    parser.add_argument("--backend", choices=("cpu", "cuda", "hip"), default="cpu",
                        help="where the kernels run (as hccc run's --backend)")
    parser.add_argument("--seed", type=count_at_least(0), default=0, metavar="S",
                        help="seed of the case generator and of the data")
    parser.add_argument("-d", "--dtype", dest="dtypes", type=dtype_list(DTYPES), default="all",
                        metavar="T[,T...]|all", help="element types to draw from (hccc run's -d/--dtype: "
                                                     "nccl-tests' names or hccc's, a list, or all)")
    parser.add_argument("-o", "--op", dest="ops", type=op_list(OPS, "fuzz"), default="all",
                        metavar="OP[,OP...]|all", help="reduction operators to draw from (hccc run's -o/--op, a "
                                                       "list, or all)")
    parser.add_argument("--dtypes", dest="dtypes", type=dtype_list(DTYPES), help=argparse.SUPPRESS)
    parser.add_argument("--ops", dest="ops", type=op_list(OPS, "fuzz"), help=argparse.SUPPRESS)
    parser.add_argument("--max-microbatches", type=count_at_least(1), default=20, metavar="M",
                        help="largest size, in micro-batches per chunk")
    parser.add_argument("-T", "--timeout", type=seconds(), default=5.0, metavar="SECONDS",
                        help="kernel wait limit per run (nccl-tests' -T: a stuck run ends)")
    add_rank_options(parser.add_argument_group("nccl-tests' options"), "fuzz")
    parser.add_argument("--codegen", choices=("specialized", "table"), default="specialized",
                        help="run the specialised kernels or the generic table kernels")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    add_program_options(parser, chunk_default="256", prefix="for .rccl input: ", fuse=True,
                        chunk_help="micro-batch slice size to compile with (a ProgramIR keeps its own)")
    add_nccl_long_names(parser)


def _load(args):
    from hccc.compiler.pipeline import apply_channels, load_program
    ir = load_program(args.algo, program_options(args))
    plat = "cpu" if args.backend == "cpu" else args.backend
    return apply_channels(ir, program_options(args), [plat])


def _repro(args, ir, case) -> str:
    from hccc.runtime.launcher import ELEMENT_BYTES
    cmd = ["hccc", "run", args.algo, "--backend", args.backend,
           "--sizes", str(case.count * ELEMENT_BYTES[case.dtype]), "--dtype", case.dtype,
           "--op", case.op, "--threads", str(case.nthreads), "--seed", str(args.seed),
           "--iters", "1", "--warmup", "0"]
    from hccc.compiler.pipeline import reader_for
    if reader_for(args.algo).gives == "algorithm":
        cmd += ["--chunk-size", str(ir.chunk_bytes)]
    cmd.append("--inplace-only" if case.inplace else "--out-of-place-only")
    cmd += ["--slice-size", str(case.slice_bytes or ir.chunk_bytes)]
    if args.channels is not None:
        cmd += ["--channels", str(args.channels)]
    if args.scheduler != "hpds":
        cmd += ["--scheduler", args.scheduler]
    if args.tb_alloc != "state":
        cmd += ["--tb-alloc", args.tb_alloc]
    if args.codegen != "specialized":
        cmd += ["--codegen", args.codegen]
    return " ".join(shlex.quote(c) for c in cmd)


def run(args) -> int:
    from hccc.runtime.platform import PlatformError
    from hccc.testing import fuzz_kernels

    ir = _load(args)
    why = ranks_error(args, ir.name, ir.nranks)
    if why:
        sys.stderr.write(f"hccc fuzz: error: {why}\n")
        return 2
    with Progress("hccc fuzz", enabled=not args.json) as prog:
        task = prog.task(f"{ir.name} ({ir.collective}, {plural(ir.nranks, 'rank')}, chunk size {ir.chunk_bytes} B): "
                         f"{plural(args.examples, 'random case')} on {args.backend}; kernels are built on "
                         "first use", total=args.examples, sizes=[1], cycles=args.examples)

        def progress(i, case, res):
            task.advance()
            task.update(f"case {i}: {case.describe()}")

        try:
            rep = fuzz_kernels(ir, backend=args.backend, examples=args.examples, seed=args.seed,
                               timeout_s=args.timeout, dtypes=args.dtypes, ops=args.ops,
                               max_microbatches=args.max_microbatches, progress=progress,
                               codegen=args.codegen)
        except (PlatformError, ValueError) as exc:
            sys.stderr.write(f"hccc: error: {exc}\n")
            return 1
    cases = [c for c, _ in rep.cases]
    counts = [c.count for c in cases]
    summary = {
        "algorithm": ir.name, "collective": ir.collective, "nranks": ir.nranks,
        "chunk_bytes": ir.chunk_bytes, "channels": int(ir.nchannels), "backend": args.backend, "seed": args.seed,
        "codegen": args.codegen,
        "cases": len(cases), "seconds": round(rep.seconds, 3), "ok": rep.ok,
        "dtypes": sorted({c.dtype for c in cases}), "ops": sorted({c.op for c in cases}),
        "inplace_cases": sum(c.inplace for c in cases), "threads": sorted({c.nthreads for c in cases}),
        "min_count": min(counts) if counts else None, "max_count": max(counts) if counts else None,
    }
    if not rep.ok:
        case, message = rep.failure
        summary["failure"] = {"count": case.count, "dtype": case.dtype, "op": case.op,
                              "inplace": case.inplace, "nthreads": case.nthreads,
                              "message": message, "repro": _repro(args, ir, case)}
    if args.json:
        print(json.dumps(summary))
    elif rep.ok:
        print(f"hccc fuzz: {ir.name}: {plural(len(cases), 'case')} passed in {rep.seconds:.1f} s "
              f"({summary['min_count']}..{summary['max_count']} elements, chunk size "
              f"{ir.chunk_bytes} B; dtypes {','.join(summary['dtypes'])}; ops "
              f"{','.join(summary['ops'])}; {summary['inplace_cases']} in-place; threads per "
              f"block {','.join(map(str, summary['threads']))})")
    else:
        print(f"hccc fuzz: {ir.name}: FAILED after {plural(len(cases), 'case')}; minimal failing case:")
        print(f"  {summary['failure']['message']}")
        print(f"  reproduce: {summary['failure']['repro']}")
    return 0 if rep.ok else 1
