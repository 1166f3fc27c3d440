"""``hccc synth T.topo --collective C -o ALGO.rccl``: synthesise a schedule for a cluster.

    hccc synth T.topo --collective allgather|broadcast|reducescatter|allreduce|alltoall [--root R]
               [--chunks-per-rank K] [--time-limit S] [--pod-size M] [--variants N]
               [--select-size BYTES] [--no-sim-select] [--no-smt] -o ALGO.rccl [--json]

HeteCCL's method (chunking with C(u,v) and shared-group capacities, greedy initial schedule, CEGIS
with z3 on the suffix after the earliest counterexample, step minimisation), hierarchical
composition over identical pods for large clusters. Several greedy variants are tried per phase; among
those with the fewest steps the alpha-beta simulator (``hccc.runtime.simulator``, when installed)
picks the fastest at ``--select-size``. The output is ResCCLang that ``hccc`` compiles
like any other program; it is proved by the verifier and checked against the cluster's links before
it is written. ``--json`` prints ``{"collective", "nranks", "steps", "lower_bound_steps", "seconds",
"output", "bandwidth_bound": {"bytes", "seconds", "busbw_GBps"}, ...}`` (the bandwidth bound is
ForestColl's cut bound for a buffer of ``--select-size`` bytes). On the time limit the best schedule so far is written, with its gap to the bound.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hccc.args import count_at_least, parse_size, positive_int, seconds
from hccc.compiler.frontend.plural import plural
from hccc.progress import Progress
from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
from hccc.compiler.backend.output_dir import check_output_file, write_text_atomically
from hccc.compiler.frontend.limits import printable

COLLECTIVES = ("allgather", "broadcast", "reducescatter", "allreduce", "alltoall")


SUMMARY = "synthesise a schedule for a cluster (SMT + CEGIS)"
INPUTS = {"topology": "cluster"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", metavar="T", help="cluster description (.topo, or a TACCL profile .json)")
    p.add_argument("--collective", required=True, type=str.lower, choices=COLLECTIVES,
                   help="the collective to synthesise")
    p.add_argument("--root", type=count_at_least(0), default=None, metavar="R",
                   help="broadcast root (0 when not given; written as the program's Root)")
    p.add_argument("--chunks-per-rank", type=positive_int, default=1, metavar="K",
                   help="chunks per rank (written as the program's nChunksPerRank)")
    p.add_argument("--time-limit", type=seconds(zero_ok=False), default=60.0, metavar="S",
                   help="seconds for the search; the best schedule so far is written then (numba's first "
                        "compile of a kernel after an install is not counted)")
    p.add_argument("--pod-size", type=positive_int, default=None, metavar="M",
                   help="compose hierarchically over identical pods of M GPUs (default: automatic; "
                        "clusters of up to 64 GPUs are solved flat)")
    p.add_argument("--no-smt", action="store_true", help="greedy heuristic only (no z3 repair or minimisation)")
    p.add_argument("--variants", type=positive_int, default=3, metavar="N",
                   help="greedy variants tried per phase; among those with the fewest steps the "
                        "one the alpha-beta simulator finds fastest is kept")
    p.add_argument("--select-size", type=parse_size, default="1G", metavar="BYTES",
                   help="buffer size at which variants are compared in the simulator and the bandwidth lower "
                        "bound is reported")
    p.add_argument("--no-sim-select", action="store_true",
                   help="do not use the simulator to choose among variants (keep the first)")
    p.add_argument("-o", "--output", required=True, metavar="ALGO.rccl", help="where to write the program")
    p.add_argument("--json", action="store_true",
                   help='print {"collective", "nranks", "steps", "lower_bound_steps", "seconds", "output", ...}')


#: how synthesis events read in the progress display
EVENTS = {"bound": "lower bound {steps} steps",
          "greedy": "greedy schedule: {steps} steps",
          "cegis": "CEGIS iteration {iteration}: checkpoint step {checkpoint}, {learned} groups learned, {steps} steps",
          "minimise": "z3 shortened the schedule to {steps} steps (window {window})",
          "pod": "pod of {ranks} GPUs: {steps} steps",
          "select": "simulator chose greedy variant {variant}",
          "inter-pod": "inter-pod schedule over {pods} pods: {steps} steps"}


def describe_event(event: str, info: dict) -> str:
    try:
        return EVENTS.get(event, event).format(**info)
    except (KeyError, IndexError):
        return event


def simulated_score(topo, nbytes: int = 1 << 30, *, root: int = 0, chunks_per_rank: int = 1):
    """``score(collective, rows)`` for :func:`hccc.compiler.synth.synthesize`: the completion time of
    a candidate program in the alpha-beta simulator on ``topo`` at ``nbytes`` (None when the
    simulator is not available)."""
    try:
        from hccc.runtime.simulator import simulate
    except ImportError:
        return None
    import numpy as np

    from hccc.compiler.frontend.algorithm import Algorithm, Collective, Header
    from hccc.compiler.passes.build import build_program

    def score(phase: str, rows) -> float:
        coll = Collective.parse(phase)
        if coll is None:
            return 0.0
        head = Header(topo.nranks, coll, f"candidate_{phase}", root=root if coll.rooted else 0,
                      chunks_per_rank=chunks_per_rank)
        alg = Algorithm.from_rows(head, np.asarray(rows).tolist())
        return float(simulate(build_program(alg), topo, int(nbytes), slice_bytes="auto").time_s)

    return score


def _bandwidth_bound(result, nbytes: int) -> dict:
    """ForestColl's cut bound for the collective's full buffer of ``nbytes``, also as nccl-tests busbw."""
    from hccc.runtime.busbw import busbw_factor

    t = float(result.detail["cut_bound_seconds"])
    n = result.nranks
    factor = busbw_factor(result.collective, n)
    out = {"bytes": int(nbytes), "seconds": t, "busbw_GBps": (nbytes / t / 1e9 * factor) if t > 0 else 0.0}
    if "cut_bound_set" in result.detail:   # AllToAll: the cut that attains the bound
        out["cut"] = result.detail["cut_bound_set"]
    return out


def run(args) -> int:
    from hccc.compiler.frontend.limits import check_synth_size
    from hccc.compiler.pipeline import load_cluster

    out = Path(args.output)
    if out.is_dir():
        raise CompileError([Diagnostic(f"output '{printable(str(out))}' is a directory (expected a .rccl file "
                                       "name)", None)])
    check_output_file(out)   # before the work: never a device, FIFO or symlink
    topo = load_cluster(args.topology)
    if args.root is not None and args.collective != "broadcast":
        raise CompileError([Diagnostic(f"--root applies to --collective broadcast, not {args.collective}", None)])
    args.root = args.root or 0
    if args.collective == "broadcast" and not 0 <= args.root < topo.nranks:
        raise CompileError([Diagnostic(f"--root {args.root} is not a rank of '{topo.name}' "
                                       f"(ranks 0..{topo.nranks - 1})", None)])
    try:
        check_synth_size(topo.nranks, args.chunks_per_rank)   # before any work is sized by it
    except ValueError as exc:
        raise CompileError([Diagnostic(f"--chunks-per-rank: {exc}", None)]) from None
    from hccc.compiler.synth import synthesize, to_algorithm, to_rccl
    from hccc.compiler.synth.emit import dsl_collective
    from hccc.compiler.cluster.topology_check import check_on_topology
    from hccc.compiler.passes.verify import verify
    dsl_collective(args.collective)  # refuse early what ResCCLang cannot express
    title = f"{args.collective} on {printable(Path(args.topology).name)} ({plural(topo.nranks, 'GPU')})"
    with Progress("hccc synth", enabled=not args.json) as prog, prog.phase(title, limit_s=args.time_limit) as phase:

        def progress(event: str, info: dict) -> None:
            phase.update(describe_event(event, info))

        try:
            score = None if args.no_sim_select or args.variants == 1 else simulated_score(
                topo, args.select_size, root=args.root, chunks_per_rank=args.chunks_per_rank)
            result = synthesize(topo, args.collective, root=args.root, chunks_per_rank=args.chunks_per_rank,
                                time_limit=args.time_limit, progress=progress, pod_ranks=args.pod_size,
                                use_smt=not args.no_smt, variants=args.variants, score=score,
                                bandwidth_bound_bytes=args.select_size)
        except ValueError as exc:
            raise CompileError([Diagnostic(f"{args.topology}: {exc}", None)]) from None
    alg = to_algorithm(result, topo)
    verify(alg)
    check_on_topology(alg, topo)
    bound = _bandwidth_bound(result, args.select_size)
    write_text_atomically(out, to_rccl(result, topo, cluster=Path(args.topology).name, extra_comments=[
        f"bandwidth lower bound (ForestColl cut bound) at {bound['bytes']} bytes: {bound['seconds'] * 1e6:.1f} us, "
        f"busbw <= {bound['busbw_GBps']:.2f} GB/s"]))
    summary = {"collective": result.collective, "nranks": result.nranks, "steps": result.steps,
               "lower_bound_steps": result.lower_bound_steps, "seconds": round(result.seconds, 3),
               "output": str(out), "gap": result.gap, "transfers": result.ntransfers,
               "timed_out": result.timed_out, "bandwidth_bound": bound,
               "phases": result.summary()["phases"], "composed": result.composed}
    if args.json:
        print(json.dumps(summary))
    else:
        gap = "optimal in steps" if result.gap == 0 else f"gap {result.gap}"
        print(f"hccc synth: {result.collective} on {result.nranks} GPUs: {result.steps} steps "
              f"(lower bound {result.lower_bound_steps}, {gap}), {result.ntransfers} transfers, "
              f"{result.seconds:.2f} s{' (time limit reached)' if result.timed_out else ''} -> {printable(str(out))}")
    return 0
