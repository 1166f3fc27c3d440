"""``hccc ALGO -o OUTDIR`` (also ``hccc compile ALGO -o OUTDIR``): compile an algorithm into
verified, scheduled CUDA/HIP kernels, a manifest, the ProgramIR as JSON, build files and the MSCCL
XML export.

ALGO is a ``.rccl`` program (verified, scheduled with ``--scheduler``, lowered, thread blocks
allocated with ``--tb-alloc``), an MSCCL ``.xml`` or a ProgramIR ``.json`` (both emitted as given,
without scheduling). OUTDIR is replaced atomically: a failed compile leaves it untouched.

``--dump-after STAGE`` stops after a stage of the compile (algorithm, dag, schedule, lowered,
program-ir: :data:`hccc.compiler.pipeline.compile.STAGES`) and writes what it made into the file
``-o`` names instead (``-``: standard output), as :mod:`hccc.compiler.pipeline.dumps` says: the
algorithm as ResCCLang, the DAG and the schedule as JSON, the lowered program and the final
one as ProgramIR JSON, which ``hccc`` compiles to the same kernels (given ``--channels`` at its
``nchannels``: ``auto`` takes a ProgramIR's own count only above 1).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hccc.args import add_direct_option, add_program_options, add_topology_option, add_xml_limit_arguments, program_options
from hccc.util.limits import printable
from hccc.util.plural import plural
from hccc.progress import Progress

SUMMARY = "compile an algorithm into kernels (the default command: 'hccc ALGO -o OUTDIR')"
INPUTS = {"algo": "algorithm", "--topology": "cluster"}
#: programs with more transfers than this take seconds to compile: show progress
BIG_TRANSFERS = 100_000


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", metavar="ALGO", help="algorithm: .rccl, an MSCCL .xml, or a ProgramIR .json "
                   "(the last two are emitted as given, without scheduling)")
    p.add_argument("-o", "--output", metavar="OUTDIR", required=True,
                   help="output directory (replaced atomically); with --dump-after, the dump's file ('-': standard output)")
    add_topology_option(p, extra="; ranks take their platform from their node's vendor and the manifest "
                                  "records the cluster")
    p.add_argument("--target", choices=("auto", "cuda", "hip", "all"), default="auto",
                   help="platform of the emitted kernels (auto: each rank's vendor with --topology (NVIDIA -> "
                        "CUDA, AMD -> HIP), CUDA for every rank without one; cuda/hip/all override it)")
    add_program_options(p, fuse=True)
    add_direct_option(p)
    p.add_argument("--codegen", choices=("specialized", "table"), default="specialized",
                   help="specialized: one kernel source per rank, its primitives compiled in; "
                        "table: binary tables run by generic kernels that are built once for every "
                        "algorithm (no kernel compile per algorithm, small output at scale)")
    p.add_argument("--list-outputs", nargs="?", const="all", choices=("all", "cuda", "hip"),
                   metavar="all|cuda|hip",
                   help="print the files the compile would write into OUTDIR, one per line, and stop "
                        "(the algorithm is only parsed; the MSCCL XML export is not listed); cuda or "
                        "hip: only the translation units of that platform's library")
    p.add_argument("--depfile", metavar="FILE",
                   help="also write a Make-style depfile: OUTDIR/manifest.json depends on ALGO, the "
                        "topology and hccc's own compiler and template files")
    from hccc.compiler.pipeline.compile import STAGES
    p.add_argument("--dump-after", metavar="STAGE", choices=tuple(STAGES),
                   help="stop after STAGE (" + ", ".join(STAGES) + ") and write what it made into the file -o "
                        "names instead of an OUTDIR: the algorithm as ResCCLang, the DAG and the schedule as JSON, "
                        "the lowered program and the final ProgramIR as ProgramIR JSON (an input again: with "
                        "--channels at its nchannels it compiles to the same kernels); a program given as input "
                        "has the program-ir stage only")
    p.add_argument("--timings", action="store_true",
                   help="print the time spent in each stage and phase, then the wall time from the command's start")
    add_xml_limit_arguments(p)


def _warn_op_named_output(output: str) -> None:
    """``hccc ALGO -o sum``: -o is the output folder here but the reduction operator of run, sim
    and fuzz (nccl-tests' -o); a folder named like an operator is most likely that mix-up."""
    from hccc.args import NCCL_OPS
    name = Path(output).name
    if name.lower() in NCCL_OPS + ("all",):
        sys.stderr.write(f"hccc: warning: writing the output folder '{printable(name)}', named like a reduction "
                         f"operator: -o is the output folder of a compile (hccc run's -o {printable(name)} is "
                         "the reduction)\n")


def run(args) -> int:
    from hccc.args import xml_limits_from_args
    from hccc.compiler.pipeline import StageTimes, compile as passes
    from hccc.runtime import compile as hccc_compile

    from hccc.compiler.backend.output_dir import check_not_an_input, check_output_dir
    inputs = [args.algo] + ([args.topology] if args.topology else [])
    if args.dump_after:
        clash = [o for o, v in (("--list-outputs", args.list_outputs), ("--depfile", args.depfile),
                                ("--timings", args.timings)) if v]
        if clash:
            sys.stderr.write(f"hccc: error: --dump-after writes one stage's file: {', '.join(clash)} does not apply\n")
            return 1
        return _dump(args, inputs)
    if not args.list_outputs:         # before any work: never write over, or remove, what is read
        check_output_dir(args.output, inputs)
        if args.depfile:
            check_not_an_input(args.depfile, inputs)
    _warn_op_named_output(args.output)
    times = StageTimes()
    opts = program_options(args, target=args.target, fuse=args.fuse, codegen=args.codegen, direct=args.direct,
                           xml_order=args.xml_order, xml_fuse=args.xml_fuse, xml_instances=args.instances)
    cluster = times.run("topology", hccc_compile.cluster_of, args.topology) if args.topology is not None else None
    if args.list_outputs:
        from hccc.compiler.pipeline import output_list
        try:
            names = output_list(args.algo, opts, cluster, args.list_outputs)
        except ValueError as exc:
            sys.stderr.write(f"hccc: error: {exc}\n")
            return 1
        out = Path(args.output)
        sys.stdout.write("".join(f"{out / n}\n" for n in names))
        return 0
    # the compile hccc.compile runs (the simulator as cost model with a cluster)
    ctx = hccc_compile.context(args.algo, opts, topology=cluster, xml_limits=xml_limits_from_args(args), times=times)
    n = ctx.algorithm.ntransfers if ctx.algorithm is not None else 0
    with Progress("hccc", enabled=n > BIG_TRANSFERS) as prog, \
            prog.phase(f"compiling {args.algo} ({plural(n, 'transfer')})"):
        passes.compile(ctx, args.output)
    ir, files, notes = ctx.ir, ctx.files, ctx.notes
    for note in notes:
        sys.stderr.write(f"hccc: warning: {note}\n")
    if args.depfile:
        from hccc.compiler.backend.depfile import write_depfile
        write_depfile(args.depfile, Path(args.output) / "manifest.json", inputs)
    st, al = ir.stats, ir.allocation
    subp = st.get("subpipelines")
    print(f"hccc: {ir.name}: {ir.collective} on {plural(ir.nranks, 'rank')}, "
          f"{plural(int(st.get('transfers') or 0), 'transfer')}, "
          f"{plural(subp, 'sub-pipeline') if subp is not None else 'no sub-pipelines'}, "
          f"TBs per rank <= {al.tbs_per_rank_max} "
          f"({al.tbs_state_based} state-based vs {al.tbs_connection_based} connection-based "
          f"in total), {plural(int(ir.nchannels), 'channel')} (blocks per TB); "
          f"{plural(len(files), 'file')} in {printable(str(args.output))}")
    if cluster is not None:
        from hccc.compiler.pipeline import platforms_for
        runs = [pls[0] for pls in platforms_for(ir.nranks, args.target, cluster.topology)]
        print(f"  cluster {cluster.name}: {plural(len(cluster.topology.nodes), 'node')}; ranks running "
              + ", ".join(f"{pl} {runs.count(pl)}" for pl in ("cuda", "hip") if pl in runs))
    if args.timings:
        for k, v in times.seconds.items():
            note = f"  (beside {times.beside[k]}, on a second thread)" if k in times.beside else ""
            print(f"  {k:16s} {v:8.3f} s{note}")
            for ph, pv in times.phases.items():
                if ph.startswith(k + "/"):
                    print(f"    {ph:30s} {pv:8.3f} s")
        _print_total()
    return 0


def _dump(args, inputs) -> int:
    """``--dump-after STAGE``: the compile through STAGE, its representation into ``-o``'s file."""
    from hccc.args import xml_limits_from_args
    from hccc.compiler.backend.output_dir import check_not_an_input, write_export
    from hccc.compiler.pipeline.compile import run_until
    from hccc.compiler.pipeline.dumps import dump
    from hccc.runtime import compile as hccc_compile

    if args.output != "-":
        check_not_an_input(args.output, inputs)        # before any work
    opts = program_options(args, target=args.target, fuse=args.fuse, codegen=args.codegen, direct=args.direct,
                           xml_order=args.xml_order, xml_fuse=args.xml_fuse, xml_instances=args.instances)
    cluster = hccc_compile.cluster_of(args.topology) if args.topology is not None else None
    ctx = hccc_compile.context(args.algo, opts, topology=cluster, xml_limits=xml_limits_from_args(args))
    text = dump(run_until(ctx, args.dump_after), args.dump_after)
    from hccc.compiler.passes.build import sanitize_identifier
    name = sanitize_identifier(ctx.algorithm.header.name) if ctx.algorithm is not None else ctx.given.name
    suffix = ".rccl" if args.dump_after == "algorithm" else ".json"
    write_export(args.output, text, args.algo, f"{name}.{args.dump_after}{suffix}")
    return 0


def _print_total() -> None:
    """``--timings``' last line: the wall time from the command's start (start-up and writing
    included), numba's compiling in it named (:mod:`hccc.timing`)."""
    from hccc import timing
    spans = timing.Spans()
    spans.mark("command")
    compiling = spans.parts().get(timing.COMPILING)
    print(f"  {'total':16s} {spans.total():8.3f} s  (wall time from the command's start"
          + (f"; {timing.COMPILING} {compiling:.3f} s of it" if compiling else "") + ")")
