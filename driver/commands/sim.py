"""``hccc sim ALGO... --topology T [--sizes 1M,64M,1G | -b MIN -e MAX -f F] [--scheduler hpds,rr]
[--tb-alloc state|connection] [--execution task|algorithm] [--chunk-size B] [--channels K|auto]
[--block-bw GBPS] [-d D] [--json]
[--plot timeline.png [--ranks R,...]] [--plot-busbw busbw.png]``

Simulates the compiled program on a cluster under the alpha-beta-gamma model of
:mod:`hccc.runtime.simulator`, with the kernels' units and hops (every unit of a primitive pays its
op's fixed cost at the program's warps, every dependency between two blocks of a rank half a flag
round trip: :data:`hccc.compiler.passes.kernel_cost.SIM_COSTS`, the fifth GPU run's figures), and prints an nccl-tests-like table (one row per size: size, count,
type, redop, root, time, algbw, busbw, then the model's bound, slice, micro-batches and TB idle
ratios; closed by ``# Avg bus bandwidth``). Several algorithms, and a list of schedulers, give one
table each; ``--plot-busbw`` draws all of them on one figure, ``--plot`` the timeline of the first
at its largest size (``--ranks`` picks the ranks shown). The simulator does not tell in-place from
out-of-place runs, so there is one column group. With ``--json`` (one run; several give
``{"runs": [...]}``)::

    {"results": [{"bytes", "time_us", "algbw_GBps", "busbw_GBps", "chunk_bytes", ...}, ...],
     "chunk_bytes": ..., "slice": "auto" | "fixed",
     "tbs_per_rank_max": ..., "tb_idle_avg": ..., "tb_idle_max": ..., ...}

where the top-level idle ratios are those of the largest size. The micro-batch slice is the one
the launchers give each call of the program (the kernels' model over the program's critical path
and channels, within its header's ``nMicroBatches`` and ``MinSliceBytes``:
:func:`hccc.compiler.passes.slicing.program_slice_bytes`; so the programs of other schedulers or of
the algorithm-level baseline may get other slices), up to the FIFO slot capacity (1 MiB, or a given IR's ``chunk_bytes``); each result records the slice it used as ``chunk_bytes`` and the
top-level ``chunk_bytes`` is the slot capacity. ``--chunk-size B`` fixes slot and slice to ``B``
for every size (``"slice": "fixed"``). ALGO is a ``.rccl`` algorithm
(verified, then scheduled and lowered with the given options by the compiler's own passes, as
``hccc ALGO -o OUT --topology T`` does, with the simulator at the sizes simulated choosing the
thread-block allocation; fusion only with ``--fuse on``), a ProgramIR ``.json`` or an MSCCL
``.xml`` (run as given). ``--execution algorithm`` is the MSCCL-like baseline: for a ``.rccl``
the transfers run in step order on connection-based TBs (unless ``--tb-alloc`` says otherwise),
every micro-batch running the TB's whole primitive list; a given IR keeps its TBs, and by default
runs the way it was checked for (an MSCCL import that is only deadlock-free under MSCCL's
algorithm-level execution says so in its ``origin.execution``).

Channels: ``--channels K`` runs every thread block as K blocks (``auto``: as the compiler picks
for the cluster's GPUs, :mod:`hccc.compiler.passes.channels`); a block moves at most
``--block-bw`` GB/s beyond its units' fixed costs (default 49.3, the kernel cost model's rate of a
block of 16 warps on long units, in proportion for a program of fewer; 0: no limit), so a
connection runs at min(its share of the link, K x block-bw). The JSON records ``channels`` and
``block_gbps``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hccc.util import dtypes as dtypes_table
from hccc.args import (add_fuse_option, channels_arg, choice_list, comma_list, count_at_least, dtype_list, format_size,
                       nccl_type_name, op_list,
                       parse_size, positive_int)
from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS
from hccc.util.plural import plural
from hccc.progress import Progress
from hccc.sweep import (add_nccl_long_names, add_nccl_noop_options, add_rank_options, add_sweep_options, avg_busbw_line, instance_combos,
                        noop_notes, ranks_error, redop_column, say_notes, root_column, shift_field, sizes_error,
                        sweep_is_default, sweep_sizes, table_header, table_left)
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.util.limits import printable

#: bytes of each element type the kernels have, and their operators (hccc.util.dtypes)
DTYPE_BYTES = {d.name: d.bytes for d in dtypes_table.DTYPES}
OPS = dtypes_table.OP_NAMES
DEFAULT_SIZES = "1M,64M,1G"
PLOT_ROWS = 48  # TBs shown (and recorded) in the timeline


SUMMARY = "simulate an algorithm on a cluster (alpha-beta model)"
INPUTS = {"algo": "algorithm", "--topology": "cluster", "--counts": "counts matrix"}


def _chunk(text: str) -> int:
    v = parse_size(text)
    if v % 16 or v > (1 << 30):
        raise argparse.ArgumentTypeError(f"chunk size must be a multiple of 16 bytes of at most 1G, not '{text}'")
    return v


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", metavar="ALGO", nargs="+",
                   help="algorithm (.rccl), ProgramIR (.json) or MSCCL XML (.xml); several are simulated one "
                        "after the other (and drawn together by --plot-busbw)")
    p.add_argument("--topology", required=True, metavar="T",
                   help="cluster description (.topo, or a TACCL profile .json); -t is nccl-tests' thread count")
    add_sweep_options(p, DEFAULT_SIZES, zero_ok=False)
    p.add_argument("--scheduler", type=choice_list(("hpds", "rr"), "schedulers"), default="hpds",
                   metavar="hpds|rr[,...]",
                   help="HPDS or the round-robin baseline (task-level execution); a list (hpds,rr) "
                        "simulates each")
    p.add_argument("--tb-alloc", choices=("state", "connection"), default=None,
                   help="thread-block allocation (default: state for task-level, connection for algorithm-level)")
    p.add_argument("--execution", choices=("task", "algorithm"), default=None,
                   help="task-level (hccc's kernels) or algorithm-level (MSCCL-like baseline); default "
                        "task, or for a given IR / XML the execution it was checked for")
    p.add_argument("--chunk-size", type=_chunk, default=None, metavar="BYTES",
                   help="fixed micro-batch slice and FIFO slot size for every size (default: slots of 1M, "
                        "or a given IR's own, and a slice chosen per size)")
    p.add_argument("--channels", type=channels_arg, default=None, metavar="K|auto",
                   help="blocks per thread block (default: auto, i.e. the .rccl nChannels or a given IR's own, "
                        "else from the GPUs' SM count, thread blocks and slice)")
    p.add_argument("--block-bw", type=_block_bw, default=DEFAULT_BLOCK_GBPS, metavar="GBPS",
                   help=f"GB/s one block of 16 warps moves beyond its units' fixed costs, the per-block limit (fewer warps: as the kernel cost model scales it; default: {DEFAULT_BLOCK_GBPS:g}, the measured rate on long units; 0: none)")
    p.add_argument("-d", "--dtype", type=dtype_list(tuple(DTYPE_BYTES)), default="float32",
                   metavar="|".join(nccl_type_name(d) for d in DTYPE_BYTES) + "|all",
                   help="element type, nccl-tests' -d: its names (float, half, ...) or hccc's (float32, ...), "
                        "a comma list, or all (a table each); every size a whole number of elements")
    p.add_argument("-o", "--op", type=op_list(OPS, "sim"), default="sum", metavar="|".join(OPS) + "|all",
                   help="reduction operator shown in the redop column, nccl-tests' -o: one, a comma list or "
                        "all, a table each (the model's cost does not depend on it); the plots have options "
                        "of their own")
    nccl = p.add_argument_group("nccl-tests' options a model needs not")
    nccl.add_argument("-n", "--iters", type=count_at_least(1), default=None, metavar="N",
                      help="nccl-tests' timed iterations: accepted; the model's time is the same every iteration")
    nccl.add_argument("-w", "--warmup", type=count_at_least(0), default=None, metavar="N",
                      help="nccl-tests' warmup iterations: accepted; the model has nothing to warm up")
    nccl.add_argument("-c", "--check", type=count_at_least(0), default=None, metavar="N",
                      help="nccl-tests' check iterations: accepted; a model computes no data to check "
                           "(hccc run checks every element)")
    nccl.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=None, metavar="0|1|2|3",
                      help="nccl-tests' time over ranks (rank 0, mean, min, max): accepted; the model's time "
                           "is the collective's, the same on every rank")
    add_rank_options(nccl, "sim")
    add_nccl_noop_options(nccl, "sim", model=True)
    add_fuse_option(p, "for .rccl input, task-level execution: ")
    p.add_argument("--max-transfers", type=positive_int, default="10000000", metavar="N",
                   help="refuse programs with more transfers than this")
    p.add_argument("--counts", metavar="FILE", default=None,
                   help="an AllToAll program run as an AllToAllv: the call's counts matrix (one line per sending "
                        "rank of elements to each rank, docs/alltoallv.md); the table's one row is that call "
                        "(size: the mean per-rank send buffer, nccl-tests' alltoall busbw factor)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="write a timeline of the largest size (PNG, SVG or PDF, by extension)")
    p.add_argument("--ranks", type=comma_list(count_at_least(0, "a rank"), "ranks", max_items=1024),
                   default=None, metavar="R1,R2,...",
                   help=f"ranks whose thread blocks the timeline shows (default: the first {PLOT_ROWS} TBs)")
    p.add_argument("--plot-busbw", metavar="FILE", default=None,
                   help="write bus bandwidth against size, one line per algorithm and scheduler, each with "
                        "the busbw its lower bound allows dashed (sizes: " + PLOT_SIZES + " unless given)")
    p.epilog = "columns after nccl-tests':\n  " + COLUMN_LEGEND
    add_nccl_long_names(p)


def _block_bw(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 <= v < 1e6:
        raise argparse.ArgumentTypeError(f"block bandwidth must be a number of GB/s, 0 for no limit: {text!r}")
    return v


def _load(args, algo: str, scheduler: str, cluster, sizes):
    """The ProgramIR to simulate, the execution it runs with and the cost model that chose its
    allocation, or None (``cluster``: a ClusterSource)."""
    from hccc.compiler.pipeline import CompileOptions, reader_for
    from hccc.compiler.passes.slicing import DEFAULT_SLOT_BYTES
    from hccc.compiler.passes.verify import verify
    from hccc.runtime.simulator import build_for_execution

    path = Path(algo)
    execution = args.execution
    reader = reader_for(path)
    opts = CompileOptions(scheduler=scheduler, tb_alloc=args.tb_alloc or "state",
                          chunk_bytes=args.chunk_size or DEFAULT_SLOT_BYTES, max_transfers=args.max_transfers)
    if reader.gives == "program":
        ir = reader.read(path, opts)
        if args.chunk_size:
            ir.chunk_bytes = args.chunk_size
        if execution is None:  # an MSCCL import records whether it only runs algorithm-level
            execution = ir.origin.execution or "task"
        if ir.nranks != cluster.topology.nranks:      # said as every command says it
            from hccc.compiler.cluster.topology_check import check_ir_on_topology
            check_ir_on_topology(ir, cluster.topology, cluster.name, path)
        return _channels(args, ir, cluster.topology), execution, None
    execution = execution or "task"
    alg = reader.read(path, opts)
    if execution == "task" and cluster.topology.nranks == alg.header.nranks:
        ir, cost = _compiled(args, alg, opts, cluster, sizes)
        return ir, execution, cost
    verify(alg)           # the MSCCL-like baseline, or a cluster that does not fit
    topo = cluster.topology
    if topo.nranks != alg.header.nranks:      # located at the header, as every command says it
        from hccc.compiler.cluster.topology_check import check_on_topology
        check_on_topology(alg, topo, cluster.name)
    ir = build_for_execution(alg, execution, scheduler=scheduler, tb_alloc=args.tb_alloc,
                             chunk_bytes=args.chunk_size or DEFAULT_SLOT_BYTES, topology=topo, sizes=sizes,
                             fuse=getattr(args, "fuse", "auto") == "on" and execution == "task")
    return _channels(args, ir, topo, alg.header.nchannels if alg.header.nchannels_given else 0), execution, None


def _compiled(args, alg, opts, cluster, sizes):
    """A task-level program as the compiler makes it: its own passes (verify, the cluster fit,
    DAG, schedule, lowering, the thread-block allocation the simulator finds not slower, then
    channels) over one context, with the simulator at the sizes simulated as the cost model.
    Fusion only with ``--fuse on`` (the simulator does not charge the memory pass fusion saves)."""
    from dataclasses import replace

    from hccc.compiler.pipeline import Pass, run_passes
    from hccc.compiler.pipeline import compile as passes
    from hccc.runtime.simulator import SimulatedCost
    fuse = "on" if getattr(args, "fuse", "auto") == "on" else "off"
    cost = SimulatedCost(cluster.topology, sizes)
    ctx = passes.context_for(alg, replace(opts, fuse=fuse, channels=args.channels), cluster=cluster,
                             cost_model=cost)
    run_passes(ctx, [*passes.program_passes(), Pass("channels", passes.channels)])
    return ctx.ir, cost


def _channels(args, ir, topo, declared: int = 0):
    """``ir`` with the channels ``--channels`` asks for on the cluster's GPUs."""
    from hccc.compiler.pipeline import CompileOptions, apply_channels, platforms_for
    if topo.nranks != ir.nranks:
        return ir           # prepare() reports the mismatch
    return apply_channels(ir, CompileOptions(channels=args.channels), platforms_for(ir.nranks, "auto", topo),
                          declared=declared)


#: what the simulator's own columns mean (printed under the table's header and in ``--help``)
COLUMN_LEGEND = (
    "progbound: the program's own bound, a lower bound on its time (every link and GPU carrying the "
    "bytes this program moves at full capacity, plus a link's latency, and every thread block its units' fixed costs "
    "and its bytes at its rate; a ring's equals its time without units); "
    "cutbound: the cluster's cut bound, which no program of the collective can beat (the bytes that "
    "must cross the cluster's narrowest cut at its bandwidth; hccc synth's bound, docs/bounds.md); slice: the micro-batch slice of each chunk; mbatch: "
    "micro-batches per chunk; idle avg / max: the share of the run a thread block waits (mean over "
    "the thread blocks, and the worst one)")
#: sizes of a --plot-busbw curve when no sizes are given (2 per octave is too coarse for a line)
PLOT_SIZES = "1M,2M,4M,8M,16M,32M,64M,128M,256M,512M,1G"

#: the simulator's columns after nccl-tests' (name, unit, width)
COLUMNS = [("time", "(us)", 11), ("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8), ("progbound", "(us)", 11),
           ("cutbound", "(us)", 11),
           ("slice", "(B)", 7), ("mbatch", "", 6), ("idle", "avg", 6), ("idle", "max", 6)]


def _simulate_one(args, cluster, algo: str, scheduler: str, sizes: list[int], progress):
    from hccc.runtime.sim_model import DEFAULT_ELEMENT_BYTES
    from hccc.runtime.simulator import SimulationError, prepare, simulate

    topo = cluster.topology
    with progress.phase(f"building {algo}" + (f" ({scheduler})" if len(args.scheduler) > 1 else "")):
        ir, execution, cost = _load(args, algo, scheduler, cluster, sizes)
        # the allocation choice may have simulated this very program as asked here already
        done = cost.simulated(ir) if cost is not None else None
        if done is not None and cost.block_gbps == (args.block_bw or None) and args.chunk_size is None \
                and DTYPE_BYTES[args.dtype] == DEFAULT_ELEMENT_BYTES:
            prog, done = done
        else:
            done = {}
            try:
                prog = prepare(ir, topo, args.block_bw or None)
            except SimulationError as exc:
                raise CompileError([Diagnostic(str(exc), None)]) from None
    why = ranks_error(args, ir.name, int(ir.nranks))
    if why:
        raise _UsageError(why)
    if args.ranks is not None:
        bad = [r for r in args.ranks if r >= ir.nranks]
        if bad:
            raise CompileError([Diagnostic(f"--ranks {bad[0]}: {ir.name} has ranks 0..{ir.nranks - 1}", None)])
    esize = DTYPE_BYTES[args.dtype]
    slice_mode = None if args.chunk_size else "auto"   # --chunk-size: slot and slice fixed
    if getattr(args, "counts_matrix", None) is not None:
        return _simulate_v(args, cluster, ir, execution, slice_mode, progress)
    largest = max(range(len(sizes)), key=lambda i: sizes[i])
    record = (True if args.ranks is not None else PLOT_ROWS) if args.plot else 0
    results = []
    task = progress.task(f"simulating {plural(len(sizes), 'size')} of {ir.name}", total=len(sizes), sizes=sizes)
    for i, size in enumerate(sizes):
        task.update(format_size(size))
        rec = record if i == largest else 0
        try:
            results.append(done[size] if size in done and not rec else
                           simulate(prog, topo, size, execution=execution, element_bytes=esize, record=rec,
                                    slice_bytes=slice_mode))
        except SimulationError as exc:
            raise CompileError([Diagnostic(str(exc), None)]) from None
        task.advance()
    task.finish()
    for r, cut in zip(results, _cut_bounds(topo, ir, sizes)):
        r.cut_bound_s = cut
    return ir, prog, execution, slice_mode, results, largest


def _simulate_v(args, cluster, ir, execution, slice_mode, progress):
    """``--counts``: one AllToAllv call of the file's matrix (:mod:`hccc.runtime.sim_alltoallv`)."""
    from hccc.compiler.ir.vblocks import VBlockError
    from hccc.runtime.alltoallv import CountsError, read_counts_file
    from hccc.runtime.sim_alltoallv import prepare_v, simulate_v
    from hccc.runtime.simulator import SimulationError
    topo = cluster.topology
    # read with the program's rank count: the first line that cannot fit stops the reading (once
    # per rank count)
    n = int(ir.nranks)
    if n not in args.counts_matrix:
        args.counts_matrix[n] = read_counts_file(args.counts, n, ir.name)
    counts = args.counts_matrix[n]
    try:
        vp = prepare_v(ir, topo, args.block_bw or None)
        with progress.phase(f"simulating {ir.name} as an AllToAllv"):
            res = simulate_v(vp, topo, counts, element_bytes=DTYPE_BYTES[args.dtype], execution=execution,
                             slice_bytes=slice_mode, record=PLOT_ROWS if args.plot else 0)
    except (VBlockError, CountsError, SimulationError) as exc:
        raise CompileError([Diagnostic(f"{ir.name} with the counts of {args.counts}: {exc}", None)]) from None
    res.cut_bound_s = None
    return vp.ir, vp.prog, execution, slice_mode, [res], 0


def _cut_bounds(topo, ir, sizes: list[int]) -> list[float | None]:
    """The cluster's cut bound on ``ir``'s collective at each size (seconds; None where the
    cluster has no bandwidth view for it): :func:`hccc.compiler.synth.bounds.collective_cut_bound_seconds`."""
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds
    try:
        net = network_from_topology(topo)
        return [collective_cut_bound_seconds(net, ir.collective, int(ir.nranks), 1, int(max(ir.root, 0)), float(s))
                for s in sizes]
    except (ValueError, KeyError, NotImplementedError):
        return [None] * len(sizes)


def run(args) -> int:
    """Every (element type, operator) asked for, a table each (the plots draw one: give one of
    each with them); the worst exit status."""
    dtypes = args.dtype if isinstance(args.dtype, list) else [args.dtype]
    ops = args.op if isinstance(args.op, list) else [args.op]
    if len(dtypes) * len(ops) > 1 and (args.plot or args.plot_busbw):
        sys.stderr.write("hccc sim: error: --plot and --plot-busbw draw one element type and operator: "
                         "give one -d and one -o with them\n")
        return 2
    combos, left_out = instance_combos(dtypes, ops)
    why = sizes_error(sweep_sizes(args), [dtype for dtype, _ in combos])
    if why:     # as hccc run refuses it: a size below one element printed a time for count 0
        sys.stderr.write(f"hccc sim: error: {why}\n")
        return 2
    say_notes("sim", noop_notes(args, "sim", model=True) + ([left_out] if left_out else []), json_mode=args.json)
    status = 0
    for dtype, op in combos:
        one = argparse.Namespace(**vars(args))
        one.dtype, one.op = dtype, op
        try:
            status = max(status, _run_one(one))
        except _UsageError as exc:
            sys.stderr.write(f"hccc sim: error: {exc}\n")
            return 2
        if status not in (0, 1):
            return status
    return status


class _UsageError(Exception):
    """An option that does not fit the input (exit status 2, as argparse's errors)."""


def _run_one(args) -> int:
    from hccc.compiler.pipeline import read_cluster

    if args.plot_busbw and sweep_is_default(args):
        args.sizes = comma_list(parse_size, "sizes")(PLOT_SIZES)    # a curve, not three points
    sweep = sweep_sizes(args)
    sizes = list(sweep.sizes)
    from hccc.compiler.backend.output_dir import check_output_file, figure_path
    for plot in (args.plot, args.plot_busbw):
        if plot:     # before the work: a new or regular file, none of the inputs
            check_output_file(figure_path(plot), [*args.algo, args.topology])
    args.counts_matrix = None
    if args.counts is not None:
        if not sweep_is_default(args) or args.plot_busbw:
            raise CompileError([Diagnostic("--counts gives the call's sizes: --sizes, -b/-e/-f and --plot-busbw "
                                           "do not apply", None)])
        args.counts_matrix = {}        # read per program, with its rank count (_simulate_v)
    cluster = read_cluster(args.topology)
    topo = cluster.topology
    runs = []
    with Progress("hccc sim", enabled=not args.json) as progress:
        for algo in args.algo:
            for scheduler in args.scheduler:
                runs.append((algo, scheduler, *_simulate_one(args, cluster, algo, scheduler, sizes, progress)))
        if args.plot:
            from hccc.runtime.sim_plot import plot_timeline
            algo, scheduler, ir, prog, execution, slice_mode, results, largest = runs[0]
            with progress.phase(f"plotting the timeline to {args.plot}"):
                try:
                    plot_timeline(results[largest], prog, args.plot, max_rows=PLOT_ROWS, ranks=args.ranks)
                except (OSError, ValueError) as exc:
                    raise CompileError([Diagnostic(f"cannot write the plot '{args.plot}': {exc}", None)]) from None
        if args.plot_busbw:
            from hccc.runtime.sim_plot import plot_busbw
            curves = {_label(args, r): ([x.nbytes for x in r[6]], [x.busbw_GBps for x in r[6]]) for r in runs}
            # the busbw a bound on the time allows: the same bytes in the bound's time; the program's
            # own bound per curve, the cluster's cut bound once (it is the collective's, on this cluster)
            def allowed(x, bound):
                return x.busbw_GBps * x.time_us * 1e-6 / bound if bound else float("nan")
            bounds = {_label(args, r): ([x.nbytes for x in r[6]], [allowed(x, x.lower_bound_s) for x in r[6]])
                      for r in runs}
            first = runs[0][6]
            cut = ([x.nbytes for x in first], [allowed(x, getattr(x, "cut_bound_s", None)) for x in first])
            title = (f"{runs[0][2].collective} on {topo.name}, scheduler {','.join(args.scheduler)}"
                     + (f", {runs[0][4]}-level execution" if runs[0][4] != "task" else ""))
            with progress.phase(f"plotting bus bandwidth to {args.plot_busbw}"):
                try:
                    plot_busbw(curves, args.plot_busbw, title=title, bounds=bounds, cut_bound=cut)
                except (OSError, ValueError) as exc:
                    raise CompileError([Diagnostic(f"cannot write the plot '{args.plot_busbw}': {exc}",
                                                   None)]) from None
    docs = [_report(args, topo, *r) for r in runs]
    if args.json:
        print(json.dumps(docs[0] if len(docs) == 1 else {"runs": docs}))
        return 0
    for i, r in enumerate(runs):
        if i:
            print()
        _print_table(args, topo, sweep, *r)
    if args.plot:
        print(f"# timeline of {format_size(runs[0][6][runs[0][7]].nbytes)}B ({_label(args, runs[0])}) "
              f"written to {printable(str(args.plot))}")
    if args.plot_busbw:
        print(f"# bus bandwidth against size written to {printable(str(args.plot_busbw))}")
    return 0


def _label(args, r) -> str:
    scheduler, ir = r[1], r[2]
    return ir.name + (f" ({scheduler})" if len(args.scheduler) > 1 else "")


def _report(args, topo, algo, scheduler, ir, prog, execution, slice_mode, results, largest) -> dict:
    st = ir.stats
    big = results[largest]
    return {
        "algorithm": ir.name, "collective": ir.collective, "nranks": int(ir.nranks),
        "topology": topo.name, "execution": execution, "scheduler": st.get("scheduler") or scheduler,
        "tb_alloc": ir.allocation.tb_alloc or args.tb_alloc, "chunk_bytes": int(ir.chunk_bytes),
        "slice": "fixed" if slice_mode is None else "auto", "dtype": args.dtype,
        "channels": int(ir.nchannels), "block_gbps": args.block_bw or None,
        "redop": redop_column(ir.collective, args.op), "root": root_column(ir.collective, ir.root),
        **shift_field(ir.collective, ir.root),
        "results": [dict(r.summary(), cut_bound_us=None if getattr(r, "cut_bound_s", None) is None
                         else r.cut_bound_s * 1e6) for r in results],
        "tbs_per_rank_max": big.tbs_per_rank_max, "tbs_total": big.ntbs,
        "tbs_state_based": ir.allocation.tbs_state_based, "tbs_connection_based": ir.allocation.tbs_connection_based,
        "tb_idle_avg": big.tb_idle_avg, "tb_idle_max": big.tb_idle_max, "comm_time": big.comm_time,
        "plot": args.plot,
        **({"counts": args.counts} if getattr(args, "counts", None) else {}),
    }


def _print_table(args, topo, sweep, algo, scheduler, ir, prog, execution, slice_mode, results, largest) -> None:
    st = ir.stats
    big = results[largest]
    esize = DTYPE_BYTES[args.dtype]
    print(f"# hccc sim: {ir.name} ({ir.collective}, {plural(int(ir.nranks), 'rank')}) on {topo.name}: "
          f"{execution}-level execution, scheduler {st.get('scheduler') or scheduler}, "
          f"{ir.allocation.tb_alloc or args.tb_alloc}-based TBs "
          f"({big.ntbs} in total, at most {big.tbs_per_rank_max} per rank), "
          f"{plural(int(ir.nchannels), 'channel')}"
          + (f" of <= {args.block_bw:g} GB/s per block, " if args.block_bw else " (no per-block limit), ")
          + f"{format_size(int(ir.chunk_bytes))}B slots, "
          f"{'slice per size' if slice_mode else 'fixed slice'}, {args.dtype}")
    if getattr(args, "counts_matrix", None) is not None:
        from hccc.runtime.alltoallv import exact_sum
        c = args.counts_matrix[int(ir.nranks)]
        print(f"# AllToAllv counts from {printable(str(args.counts))}: {len(c)} x {len(c)}, {exact_sum(c)} elements in "
              f"all, largest block {int(c.max())}; size = the mean per-rank send buffer")
    else:
        print(f"# minBytes {sweep.min_bytes} maxBytes {sweep.max_bytes} step: {sweep.step}")
    print("# " + COLUMN_LEGEND)
    print("#")
    for line in table_header([False], COLUMNS)[1:]:
        print(line)
    redop = redop_column(ir.collective, args.op)
    root = root_column(ir.collective, ir.root)
    for r in results:
        cut = getattr(r, "cut_bound_s", None)
        vals = (f"{r.time_us:.2f}", f"{r.algbw_GBps:.2f}", f"{r.busbw_GBps:.2f}", f"{r.lower_bound_s * 1e6:.2f}",
                "-" if cut is None else f"{cut * 1e6:.2f}", format_size(r.slice_bytes), str(r.micro_batches), f"{100 * r.tb_idle_avg:.1f}%",
                f"{100 * r.tb_idle_max:.1f}%")
        print(table_left(r.nbytes, r.nbytes // esize, args.dtype, redop, root)
              + "".join(f"  {v:>{w}}" for v, (_, _, w) in zip(vals, COLUMNS)))
    print(avg_busbw_line([r.busbw_GBps for r in results]))
