"""The ``hccc`` command line (DESIGN.md section 10).

    hccc ALGO -o OUTDIR [--topology T] [--target auto|cuda|hip|all] [--scheduler hpds|rr]
                        [--tb-alloc state|connection] [--chunk-size BYTES] [--max-transfers N]
    hccc check ALGO [--topology T] [--json]
    hccc run | fuzz | topo | sim ...        one module each: ``hccc.commands.<name>``

Every subcommand module provides ``configure(parser)`` (adds its arguments to an
``argparse.ArgumentParser``) and ``run(args) -> int`` (the exit status); this file only dispatches and
turns errors into messages.

Bad input: ``FILE:LINE:COL: error: ...`` on stderr with the source line and a caret, exit status 1.
Usage errors: exit status 2. Never a Python traceback for bad input (set HCCC_DEBUG=1 to see one for
an internal error).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from hccc import __version__
from hccc.compiler.frontend.limits import check_size, option_int, printable

# name -> (module, one-line summary). "check" lives here; the others in hccc.commands.<name>.
SUBCOMMANDS = {
    "check": (None, "verify an algorithm and print a summary"),
    "run": ("hccc.commands.run", "compile, run the kernels (CPU emulation or CUDA) and check them"),
    "fuzz": ("hccc.commands.fuzz", "run random sizes/dtypes/ops through the kernels and the oracle"),
    "topo": ("hccc.commands.topo", "summarise a cluster description"),
    "sim": ("hccc.commands.sim", "simulate an algorithm on a cluster (alpha-beta model)"),
    "xml": ("hccc.commands.xml", "export an algorithm as MSCCL XML"),
    "synth": ("hccc.commands.synth", "synthesise a schedule for a cluster (SMT + CEGIS)"),
    "gen": ("hccc.commands.gen", "generate algorithms (c2c: mixed-vendor hierarchical collectives)"),
    "balance": ("hccc.commands.balance", "micro-batch sizes proportional to measured GPU speeds"),
}
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``1M``, ``1G`` (binary multiples; an optional trailing ``B``/``iB``)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SUFFIX and t[-1:] else ""
    num = t[:-1] if unit else t
    if not (num.isascii() and num.isdigit()) or len(num) > 24:
        raise argparse.ArgumentTypeError(f"invalid size '{printable(text, limit=40)}' (expected e.g. 4096, 64K, 1M, 1G)")
    value = int(num) * _SUFFIX[unit]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: '{text}'")
    return check_size(value)


def _positive_int(text: str) -> int:
    return option_int(text, 1, 1 << 62)


_TOPOLOGY_HELP = ("cluster description (.topo, or a TACCL profile .json): the algorithm's nRanks must equal its "
                  "GPU count and every transfer must use one of its links")


def _compile_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hccc",
        description="Compile a collective-communication algorithm into verified, scheduled CUDA/HIP kernels.",
        epilog="Other commands: " + "; ".join(f"'hccc {k}' {v[1]}" for k, v in SUBCOMMANDS.items())
        + ". Run 'hccc COMMAND -h' for a command's options.")
    p.add_argument("algo", metavar="ALGO", help="algorithm: .rccl, an MSCCL .xml, or a ProgramIR .json "
                   "(the last two are emitted as given, without scheduling)")
    p.add_argument("-o", "--output", metavar="OUTDIR", required=True, help="output directory (replaced atomically)")
    p.add_argument("--topology", metavar="T", help=_TOPOLOGY_HELP + "; ranks take their platform from their "
                   "node's vendor and the manifest records the cluster")
    p.add_argument("--target", choices=("auto", "cuda", "hip", "all"), default="auto",
                   help="platform of the emitted kernels (auto: each rank's vendor with --topology (NVIDIA -> "
                        "CUDA, AMD -> HIP), CUDA for every rank without one; cuda/hip/all override it)")
    p.add_argument("--scheduler", choices=("hpds", "rr"), default="hpds",
                   help="HPDS (ResCCL Algorithm 1) or the round-robin baseline")
    p.add_argument("--tb-alloc", choices=("state", "connection"), default="state",
                   help="state-based thread-block allocation or the connection-based baseline")
    p.add_argument("--chunk-size", type=parse_size, default=1 << 20, metavar="BYTES",
                   help="micro-batch slice size per chunk, e.g. 512K, 1M (default 1M)")
    p.add_argument("--max-transfers", type=_positive_int, default=10 ** 7, metavar="N",
                   help="refuse programs with more transfers than this (default 10^7)")
    p.add_argument("--fuse", action="store_true",
                   help="fuse a receive with the send that forwards it (recvCopySend, ...); off by default "
                        "because it serialises the TB's other connections")
    p.add_argument("--timings", action="store_true", help="print the time spent in each stage")
    from hccc.commands.xml import add_limit_arguments
    add_limit_arguments(p)
    p.add_argument("--version", action="version", version=f"hccc {__version__}")
    return p


def _check_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hccc check", description="Verify an algorithm and print a summary.")
    p.add_argument("algo", metavar="ALGO", help="algorithm: .rccl or an MSCCL .xml")
    p.add_argument("--topology", metavar="T", help=_TOPOLOGY_HELP)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-transfers", type=_positive_int, default=10 ** 7, metavar="N")
    return p


def cmd_compile(args) -> int:
    from hccc.commands.xml import limits_from_args
    from hccc.compiler.pipeline import (IR_SUFFIXES, XML_SUFFIXES, CompileOptions, StageTimes, compile_algorithm,
                                        compile_program, load_algorithm, load_program)

    times = StageTimes()
    opts = CompileOptions(scheduler=args.scheduler, tb_alloc=args.tb_alloc, chunk_bytes=args.chunk_size,
                          target=args.target, max_transfers=args.max_transfers, fuse=args.fuse)
    cluster = None
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        cluster = times.run("topology", read_cluster, args.topology)
    limits = limits_from_args(args)
    if os.path.splitext(args.algo)[1].lower() in IR_SUFFIXES + XML_SUFFIXES:
        ir = times.run("parse", load_program, args.algo, opts)
        ir, files, notes = compile_program(ir, args.output, opts, times, cluster=cluster, xml_limits=limits)
    else:
        alg = times.run("parse", load_algorithm, args.algo, max_transfers=args.max_transfers)
        ir, files, notes = compile_algorithm(alg, args.output, opts, times, cluster=cluster, xml_limits=limits)
    for note in notes:
        sys.stderr.write(f"hccc: warning: {note}\n")
    st = ir.stats
    print(f"hccc: {ir.name}: {ir.collective} on {ir.nranks} ranks, {st.get('transfers')} transfers, "
          f"{st.get('subpipelines', 'no')} sub-pipelines, TBs per rank <= {st.get('tbs_per_rank_max')} "
          f"({st.get('tbs_state_based')} state-based vs {st.get('tbs_connection_based')} connection-based "
          f"in total); {len(files)} files in {printable(str(args.output))}")
    if cluster is not None:
        from hccc.compiler.pipeline import platforms_for
        runs = [pls[0] for pls in platforms_for(ir.nranks, args.target, cluster.topology)]
        print(f"  cluster {cluster.name}: {len(cluster.topology.nodes)} node(s); ranks running "
              + ", ".join(f"{pl} {runs.count(pl)}" for pl in ("cuda", "hip") if pl in runs))
    if args.timings:
        for k, v in times.seconds.items():
            print(f"  {k:16s} {v:8.3f} s")
    return 0


def cmd_check(args) -> int:
    from hccc.compiler.pipeline import XML_SUFFIXES, load_algorithm
    from hccc.compiler.passes.verify import verify

    if os.path.splitext(args.algo)[1].lower() in XML_SUFFIXES:
        return _check_xml(args)
    alg = load_algorithm(args.algo, max_transfers=args.max_transfers)
    cluster = None
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        cluster = read_cluster(args.topology)
    report = verify(alg)
    summary = {"valid": True, "collective": alg.header.collective.value, "nranks": alg.header.nranks,
               "transfers": alg.ntransfers, "steps": report.steps}
    if cluster is not None:
        from hccc.compiler.cluster.topology_check import check_on_topology, link_usage
        check_on_topology(alg, cluster.topology, cluster.name)
        usage = link_usage(alg, cluster.topology)
        summary["topology"] = {"name": cluster.topology.name, "file": cluster.name, "sha256": cluster.sha256,
                               "pairs": usage["pairs"], "transfers_by_class": usage["transfers_by_class"]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {alg.header.collective.dsl_name} on {alg.header.nranks} ranks "
              f"({alg.ntransfers} transfers, {report.steps} steps)")
        if cluster is not None:
            use = summary["topology"]
            by = ", ".join(f"{k} {v}" for k, v in use["transfers_by_class"].items()) or "none"
            print(f"  fits cluster {cluster.name}: {use['pairs']} linked rank pairs used; transfers by link "
                  f"class: {by}")
    return 0


def _check_xml(args) -> int:
    """``hccc check X.xml``: import (which proves the collective symbolically and checks the TB
    pairs for deadlocks) and summarise."""
    from hccc.compiler.pipeline import load_program

    ir = load_program(args.algo)
    summary = {"valid": True, "collective": ir.collective, "nranks": int(ir.nranks),
               "transfers": int(ir.stats.get("transfers", 0)), "format": "msccl-xml",
               "execution": ir.stats.get("execution"), "tbs_per_rank_max": int(max(ir.ntbs, default=0))}
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        from hccc.compiler.cluster.topology_check import check_ir_on_topology
        cluster = read_cluster(args.topology)
        check_ir_on_topology(ir, cluster.topology, cluster.name)
        summary["topology"] = {"name": cluster.topology.name, "file": cluster.name, "sha256": cluster.sha256}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {ir.collective} on {ir.nranks} ranks (MSCCL XML, {summary['transfers']} "
              f"transfers, {summary['tbs_per_rank_max']} thread blocks per rank at most, "
              f"{summary['execution']}-level execution)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from hccc.compiler.frontend.diagnostics import CompileError, render_all

    json_mode = False
    try:
        if argv and argv[0] in SUBCOMMANDS:
            cmd, rest = argv[0], argv[1:]
            modname, summary = SUBCOMMANDS[cmd]
            if modname is None:
                args = _check_parser().parse_args(rest)
                json_mode = bool(getattr(args, "json", False))
                return cmd_check(args)
            import importlib
            mod = importlib.import_module(modname)
            parser = argparse.ArgumentParser(prog=f"hccc {cmd}", description=summary[0].upper() + summary[1:] + ".")
            mod.configure(parser)
            args = parser.parse_args(rest)
            json_mode = bool(getattr(args, "json", False))
            return mod.run(args)
        args = _compile_parser().parse_args(argv)
        return cmd_compile(args)
    except CompileError as err:
        sys.stderr.write(render_all(err) + "\n")
        if json_mode:
            print(json.dumps({"valid": False, "errors": [
                {"message": d.message,
                 "file": d.location.source.name if d.location else None,
                 "line": d.location.line if d.location else None,
                 "col": d.location.col if d.location else None} for d in err.diagnostics]}))
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("hccc: interrupted\n")
        return 130
    except MemoryError:
        sys.stderr.write("hccc: error: out of memory (try a smaller program or --max-transfers)\n")
        return 1
    except BrokenPipeError:
        return 1
    except Exception as exc:  # an hccc bug, not bad input: say so plainly
        if os.environ.get("HCCC_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"hccc: internal error: {type(exc).__name__}: {exc}\n"
                         "hccc: this is a bug in hccc; rerun with HCCC_DEBUG=1 for details\n")
        return 3


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
