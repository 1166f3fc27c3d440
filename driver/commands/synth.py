"""``hccc synth T.topo --collective C -o ALGO.rccl``: synthesise a schedule for a cluster.

    hccc synth T.topo --collective allgather|broadcast|reducescatter|allreduce|alltoall [--root R]
               [--chunks-per-rank K] [--time-limit S] [--pod-size M] [--variants N]
               [--select-size BYTES] [--no-sim-select] [--no-smt] [--exact] -o ALGO.rccl [--json]

HeteCCL's method (chunking with C(u,v) and shared-group capacities, greedy initial schedule, CEGIS
with z3 on the suffix after the earliest counterexample, step minimisation), hierarchical
composition over identical pods for large clusters. Several greedy variants are tried per phase; among
those with the fewest steps the alpha-beta simulator (``hccc.runtime.simulator``, when installed)
picks the fastest at ``--select-size``. The output is ResCCLang that ``hccc`` compiles
like any other program; it is proved by the verifier and checked against the cluster's links before
it is written. ``--json`` prints ``{"collective", "nranks", "steps", "lower_bound_steps", "seconds",
"output", "bandwidth_bound": {"bytes", "seconds", "busbw_GBps"}, ...}`` (the bandwidth bound is
ForestColl's cut bound for a buffer of ``--select-size`` bytes). ``--time-limit`` bounds the whole
command, the simulations after the search included (:class:`Simulations`); on the limit the best
schedule so far is written, with its gap to the bound, and what was not simulated is said
(``"not_simulated"``, ``"channels_fitted"`` in ``--json``); the proof and the text that follow the
search get their predicted time out of the limit (:mod:`hccc.compiler.synth.budget`), and
``"phase_seconds"`` says what each phase took (on the work clock, numba's compiling left out), and
``"command_seconds"`` the command's wall time from its start, ``"total"``, in parts that add up to
it (:mod:`hccc.timing`: start-up, synthesis, writing, and numba's compiling on a first run), also
said on stderr. docs/synthesis.md: how channels are chosen. The report's figure (``"fraction_of_bound"``)
is exact, or past its work budget estimated with its uncertainty (``"figure_estimated"``,
``"fraction_of_bound_interval"``, ``"figure"``; :mod:`hccc.synth_figure`); ``--exact`` simulates the
whole call for it, and the program written is the same either way. The limit counts from the
command's start; a tree program whose first making and proof, which cannot stop, would overrun it at
the machine's pace is refused up front.

Under ``--method auto`` every program it could write is a candidate (the tree packing, the step
search, hccc's generators that fit the cluster), timed by the simulator at the size; the fastest is
written, and the report names the runner-up and its ratio (``"selection"`` in ``--json``). With
``--band`` (no ``--size``) each candidate is timed at every size of the band (4K to 1G) and the one
whose worst ratio to the fastest at each size is least is written (``"selection"["band"]``).
The command only reads its options, wires the simulator and a progress display into the selection
loop (:func:`hccc.synth_select.synthesize_programs`) and writes what it returns:
:func:`hccc.synthesize` with the same options returns the same bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hccc.args import add_cluster_argument, comma_list, count_at_least, format_size, parse_size, positive_int, seconds
from hccc.util import clock
from hccc.util.plural import plural
from hccc.progress import Progress
from hccc import timing
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.backend.output_dir import check_output_file, write_text_atomically
from hccc.util.limits import printable
from hccc.compiler.synth.plan import AUTO_SEARCH_BELOW, COLLECTIVES, METHOD_CHOICES, SynthOptions
from hccc.compiler.synth.selection import SCORE_BAND
# the selection lives in hccc.synth_select; its names stay importable from here
from hccc.synth_select import (CHANNEL_STEPS, DEFAULT_MADE, FIT_TOLERANCE, SIMULATE_MAX_RANKS,  # noqa: F401
                                        THIN_CHOOSE_MOST,
                                        THIN_GAIN, THIN_REACH, THIN_SLICES_BELOW, THIN_WHILE_CHOOSING,
                                        TREES_MIN_PER_RANK, Simulations, _fit_channels, choose_method,
                                        resident_channels, simulated_score, synthesize_programs,
                                        tree_simulated_score, _thin_slices)

SUMMARY = "synthesise a schedule for a cluster (SMT + CEGIS)"
INPUTS = {"topology": "cluster"}


def configure(p: argparse.ArgumentParser) -> None:
    add_cluster_argument(p, "topology", "cluster description (.topo, or a TACCL profile .json)")
    p.add_argument("--collective", required=True, type=str.lower, choices=COLLECTIVES,
                   help="the collective to synthesise")
    p.add_argument("--root", type=count_at_least(0), default=None, metavar="R",
                   help="broadcast root (0 when not given; written as the program's Root)")
    p.add_argument("--chunks-per-rank", type=positive_int, default=None, metavar="K",
                   help="chunks per rank of the step search (written as the program's nChunksPerRank; default 1; "
                        "the tree packing picks its own, so giving K makes --method auto search)")
    p.add_argument("--time-limit", type=seconds(zero_ok=False), default=60.0, metavar="S",
                   help="seconds for the whole command from its start (several --size share it): the search or "
                        "packing, then the simulations that pick the tree shape and the channels and measure the "
                        "fraction of the bound, then the proof and the text, whose predicted time the search "
                        "leaves them; the best schedule so far is written then, saying what was not "
                        "simulated (measured on a clock that stands still while numba compiles its kernels, as it "
                        "does once after an install, so a first run decides as a later one); where what cannot "
                        "stop (a large cluster's first tree program and its proof, the AllToAll's scheduler) "
                        "would end past the limit + 10 %% + 2 s at the machine's pace, the command refuses up "
                        "front and says how much longer a limit it needs")
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
    p.add_argument("--method", type=str.lower, choices=METHOD_CHOICES, default="auto",
                   help="how the schedule is made: 'trees' (bandwidth-optimal spanning-tree packing; allgather, "
                        "reducescatter, allreduce, broadcast), 'search' (greedy + SMT/CEGIS step search), or 'auto': "
                        f"trees when the buffer gives every rank at least {TREES_MIN_PER_RANK >> 10} KiB (and the "
                        f"search as well when the simulator finds the best program under {AUTO_SEARCH_BELOW:g} of "
                        "the bound), else search beside the trees; hccc's generators that fit the cluster (ring, "
                        "all pairs, recursive doubling, hierarchical, C2C on mixed vendors) are candidates too, "
                        "and the fastest in the simulator at the size is written, the runner-up named")
    p.add_argument("--size", type=comma_list(parse_size, "sizes"), default=None, metavar="BYTES[,BYTES...]",
                   help="message size(s) the program is made for (default: --select-size); with several sizes "
                        "one program per size is written, named ALGO_<size>.rccl, each by the method its size picks")
    p.add_argument("--band", action="store_const", const=SCORE_BAND, default=None,
                   help="without --size: score every candidate at each size of the band ("
                        f"{', '.join(format_size(s) for s in SCORE_BAND)}) and write the one whose worst ratio to "
                        "the fastest at each size is least (ties: fewer transfers); the report gives, per size, the "
                        "fastest candidate, the written program's ratio to it and the runner-up. Without it the "
                        "candidates are compared at --select-size alone; with --size, at each size alone")
    p.add_argument("--for", dest="engine", choices=("hccc", "msccl", "mscclpp", "xml"), default=None,
                   help="the engine the program is for: 'hccc' (the default; the report names the other engines "
                        "that refuse the program and why), 'msccl' or 'xml' (the MSCCL executor, hccc xml) or "
                        "'mscclpp' (the MSCCL++ executor, hccc plan): that engine's limits (thread blocks per rank, "
                        "operations and steps per thread block, channels, XML elements, with its exporter's "
                        "defaults) are constraints of the tree packing's candidates (connections, pieces and "
                        "chunks per rank), the fastest in the simulator that fits kept, one block per thread "
                        "block; the program written is one the engine's exporter accepts: the step search is "
                        "tried where the tree program does not fit, and where none fits the command says why "
                        "and writes nothing")
    p.add_argument("--exact", action="store_true",
                   help="the report's figure (the program's simulated time as a fraction of the cut bound) from "
                        "a simulation of the whole call, whatever its work; without it, a time the selection "
                        "extrapolated from a few pipeline periods is simulated whole only within the figure's "
                        "work budget, and past it the report gives the estimate with its uncertainty. The program "
                        "written is the same either way (hccc sim always simulates the whole call)")
    p.add_argument("-o", "--output", required=True, metavar="ALGO.rccl", help="where to write the program")
    p.add_argument("--json", action="store_true",
                   help='print {"collective", "nranks", "steps", "lower_bound_steps", "seconds", "output", ...}')



def options(args, cluster_name: str) -> SynthOptions:
    """The command's options as the selection takes them."""
    return SynthOptions(collective=args.collective, root=args.root or 0, chunks_per_rank=args.chunks_per_rank,
                        time_limit=float(args.time_limit), pod_size=args.pod_size, smt=not args.no_smt,
                        variants=args.variants, select_size=int(args.select_size), sim_select=not args.no_sim_select,
                        method=args.method, sizes=tuple(args.size or ()), band=tuple(args.band or ()),
                        engine=args.engine, exact=bool(args.exact),
                        cluster_name=cluster_name)


def run(args) -> int:
    # the whole command's (see --time-limit), from its start: the interpreter's start-up and the
    # imports, which a loaded machine stretches to seconds, are the user's wait too
    deadline = clock.Deadline(timing.started_on_work_clock() + float(args.time_limit))
    from hccc.compiler.pipeline import load_cluster

    out = Path(args.output)
    if out.is_dir():
        raise CompileError([Diagnostic(f"output '{printable(str(out))}' is a directory (expected a .rccl file "
                                       "name)", None)])
    check_output_file(out, [args.topology])   # before the work: never a device, FIFO, symlink or the input
    if args.root is not None and args.collective != "broadcast":
        raise CompileError([Diagnostic(f"--root applies to --collective broadcast, not {args.collective}", None)])
    spans = timing.Spans()
    with Progress("hccc synth", enabled=not args.json) as prog:
        topo = load_cluster(args.topology)
        opts = options(args, Path(args.topology).name)
        sizes = opts.program_sizes
        outs = [out] if len(sizes) == 1 else [out.with_name(f"{out.stem}_{format_size(sz)}{out.suffix}")
                                              for sz in sizes]
        for o in outs:
            check_output_file(o, [args.topology])
        spans.mark("start-up")
        try:
            programs = synthesize_programs(topo, opts, deadline=deadline,
                                           phases=lambda title, limit_s: prog.phase(title, limit_s=limit_s))
        except ValueError as exc:
            raise CompileError([Diagnostic(f"{args.topology}: {exc}", None)]) from None
        spans.mark("synthesis")
        for p, o in zip(programs, outs):
            write_text_atomically(o, p.text, [args.topology])
        spans.mark("writing")
    took = _command_seconds(spans)
    summaries = [dict(p.summary, output=str(o), command_seconds=took) for p, o in zip(programs, outs)]
    if args.json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else {"programs": summaries}))
    else:
        for p, summary, o in zip(programs, summaries, outs):
            _say(p, summary, o)
        _say_time(programs, took)
    return 0


def _command_seconds(spans: timing.Spans) -> dict:
    """The command's wall time from its start, ``"total"``, and its parts, which add up to it:
    ``"start-up"`` (the interpreter, the imports, the cluster), ``"synthesis"``, ``"writing"``
    and, where numba compiled hccc's kernels (once after an install), that compiling."""
    return {"total": round(spans.total(), 3), **{k: round(v, 3) for k, v in spans.parts().items()}}


def _say(p, summary: dict, out: Path) -> None:
    """The human summary line on stdout (the same for the same synthesis), the time on stderr."""
    result, bound, fraction = p.result, summary["bandwidth_bound"], summary["fraction_of_bound"]
    gap = "optimal in steps" if result.gap == 0 else f"gap {result.gap}"
    if fraction is None:
        frac = (f", fraction of the cluster's cut bound not simulated "
                f"({summary['not_simulated'] or summary.get('figure') or 'not simulated'})")
    elif summary.get("figure_estimated"):
        low, high = summary["fraction_of_bound_interval"]
        frac = (f", {fraction:.3f} +- {max(high - fraction, fraction - low):.3f} of the cluster's cut bound at "
                f"{format_size(p.plan.size)} ({summary['figure']})")
    else:
        frac = f", {fraction:.3f} of the cluster's cut bound at {format_size(p.plan.size)}"
    if "fraction_of_allreduce_bound" in bound:     # the cut bound alone can lie far below it
        frac += f" ({bound['fraction_of_allreduce_bound']:.3f} of the AllReduce bound)"
    why = summary.get("not_fitted_because")
    shape = (f"{plural(result.chunks_per_rank, 'chunk')} per rank, {plural(summary['channels'], 'channel')}"
             + (f" (not fitted: {why})" if why else "")
             + ("" if p.plan.slicing.is_default else f", slices of at least {format_size(p.plan.slicing.min_slice)}")
             if summary["method"] != "search" else f"lower bound {result.lower_bound_steps}, {gap}")
    selection = summary.get("selection") or {}
    run = selection.get("runner_up")
    band = selection.get("band")
    if band is not None:
        frac += (f"; across the band at most {band['worst_ratio']:.3f}x the fastest at each size"
                 if band["worst_ratio"] is not None else "; across the band: not timed at every size")
        if run is not None and run["ratio"] is not None:
            frac += f", runner-up {run['candidate']} at most {run['ratio']:.3f}x"
    elif run is not None and run["ratio"] is not None:
        frac += f"; runner-up {run['candidate']} at {run['ratio']:.3f}x its time"
    if selection.get("time_limit_cut"):
        frac += f"; time limit: {plural(len(selection['time_limit_cut']), 'candidate')} not scored"
    print(f"hccc synth: {result.collective} on {plural(result.nranks, 'GPU')} by {summary['method']}: {result.steps} steps "
          f"({shape}), {result.ntransfers} transfers{frac}"
          f"{' (time limit reached)' if result.timed_out or summary.get('figure_limit_bound') else ''} -> {printable(str(out))}")



def _say_time(programs, took: dict) -> None:
    """The command's time on stderr (standard output, like the file, is the same for the same
    synthesis): the wall time from its start and its parts, which add up to it, with what each
    program's synthesis spent in its phases (the work clock: numba's compiling apart)."""
    parts = [f"{k} {v:.2f} s" + (" (once after an install)" if k == timing.COMPILING else "")
             for k, v in took.items() if k != "total"]
    print(f"hccc synth: {took['total']:.2f} s from the command's start: {', '.join(parts)}", file=sys.stderr)
    for p in programs:
        phases = p.summary.get("phase_seconds") or {}
        if not phases:
            continue
        inner = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in phases.items()
                          if k not in ("search", "proof", "text", "closing_predicted", DEFAULT_MADE))
        print(f"hccc synth: synthesis of {p.result.collective}"
              + (f" for {format_size(p.plan.size)}" if len(programs) > 1 else "")
              + f": search and simulations {phases['search']:.2f} s" + (f" ({inner})" if inner else "")
              + f", proof {phases['proof']:.2f} s, text {phases['text']:.2f} s"
              + (f"; before it, the default program (a candidate) {phases[DEFAULT_MADE]:.2f} s"
                 if DEFAULT_MADE in phases else ""), file=sys.stderr)
