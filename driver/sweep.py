"""nccl-tests conventions shared by ``hccc run`` and ``hccc sim``: the size sweep (``-b``/``-e``
with ``-f`` or ``-i``, or an explicit ``--sizes`` list), the ``redop`` and ``root`` columns, and the
table layout with out-of-place and in-place column groups side by side, closed by the
``# Avg bus bandwidth`` line.

nccl-tests (``all_reduce_perf -b 8 -e 128M -f 2``) sweeps sizes from minBytes to maxBytes,
multiplying by the step factor (or adding step bytes with ``-i``); every size runs out of place
and in place, and the table prints the two as column groups of one row::

    #                                                    out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)

``redop`` is ``none`` for collectives that reduce nothing (AllGather, Broadcast, AllToAll) and
``root`` is ``-1`` for collectives without a root.

nccl-tests' vocabulary beyond the sweep: ``-d``/``-o`` lists and ``all``, a table per (type,
operator) pair, ``all`` leaving out the pairs the kernels lack in one note (:func:`instance_combos`);
``-t`` threads per process and ``-g`` GPUs per thread, whose product must be the program's ranks
(:func:`add_rank_options`, :func:`ranks_error`); the options that change nothing here, accepted and
said to (:func:`nccl_noop_flags`, :func:`noop_notes`); nccl-tests' long names
(:data:`NCCL_LONG_NAMES`).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from hccc.args import (check_selection_band, comma_list, count_at_least, format_size, missing_cluster, parse_size,
                       size_or_zero)
from hccc.util.limits import printable
from hccc.util.plural import plural
from hccc.compiler.frontend.collectives import SPECS, spec_of
from hccc.util.diagnostics import CompileError, Diagnostic

#: most sizes one sweep may produce
MAX_SIZES = 64
#: collectives whose result reduces contributions (others print redop "none")
REDUCING = tuple(name for name, spec in SPECS.items() if spec.reduces)
#: collectives with a root (others print root -1)
ROOTED = tuple(name for name, spec in SPECS.items() if spec.rooted)


def add_sweep_options(p: argparse.ArgumentParser, default_sizes: str, *, zero_ok: bool) -> None:
    """``--sizes LIST`` or ``-b MIN -e MAX [-f FACTOR | -i STEP]``."""
    item = size_or_zero if zero_ok else parse_size
    g = p.add_argument_group("sizes (nccl-tests: the collective's full buffer, e.g. AllReduce's per-rank "
                             "buffer, AllGather's per-rank output; SendRecv's every rank's part)")
    g.add_argument("--sizes", type=comma_list(item, "sizes", max_items=MAX_SIZES), default=None,
                   metavar="S1,S2,...",
                   help=f"explicit sizes (4096, 64K, 1.5M, 1G); not with -b/-e (default: {default_sizes})")
    p.set_defaults(sweep_default=comma_list(item, "sizes")(default_sizes))
    # the old name of --sizes in `hccc run`, still read
    p.add_argument("--bytes", dest="sizes", type=comma_list(item, "sizes", max_items=MAX_SIZES),
                   help=argparse.SUPPRESS)
    g.add_argument("-b", "--min-bytes", dest="minbytes", type=item, default=None, metavar="BYTES",
                   help="smallest size of a sweep (nccl-tests' -b); -e defaults to it")
    g.add_argument("-e", "--max-bytes", dest="maxbytes", type=item, default=None, metavar="BYTES",
                   help="largest size of a sweep (nccl-tests' -e); -b defaults to it")
    g.add_argument("-f", "--step-factor", dest="stepfactor", type=_factor, default=None, metavar="F",
                   help="multiply the size by F from -b up to -e (nccl-tests' -f; 2 unless -i is given)")
    g.add_argument("-i", "--step-bytes", dest="stepbytes", type=parse_size, default=None, metavar="BYTES",
                   help="add BYTES from -b up to -e instead (nccl-tests' -i)")
    # nccl-tests' long spellings, kept working
    for old, dest, typ in (("--minbytes", "minbytes", item), ("--maxbytes", "maxbytes", item),
                           ("--stepfactor", "stepfactor", _factor), ("--stepbytes", "stepbytes", parse_size)):
        p.add_argument(old, dest=dest, type=typ, default=None, help=argparse.SUPPRESS)


def thread_count(text: str) -> int:
    """Type of ``-t`` on ``hccc run``, ``sim`` and ``fuzz``: nccl-tests' thread count (``-t,
    --nthreads``). ``-t`` once named the cluster there, so a value that is no count, e.g. a
    ``.topo`` file, gets the option to use instead."""
    t = text.strip()
    if t.isascii() and t.isdigit() and len(t) <= 6 and int(t) >= 1:
        return int(t)
    hint = (f": did you mean --topology {printable(text, limit=60)}? (-t is nccl-tests' thread count; the "
            "cluster is --topology)") if not t.lstrip("-").isdigit() else ""
    raise argparse.ArgumentTypeError(f"expected a thread count >= 1 (nccl-tests' -t), got "
                                     f"'{printable(text, limit=40)}'{hint}")


def add_rank_options(group, command: str) -> None:
    """nccl-tests' ``-t`` (threads per process) and ``-g`` (GPUs per thread): their product is the
    ranks of one process; ``hccc COMMAND`` drives every rank of the program itself, so the product
    must be its nRanks (:func:`ranks_error`)."""
    group.add_argument("-t", "--nthreads", type=thread_count, default=None, metavar="N",
                       help=f"nccl-tests' -t, threads per process: with -g, N x GPUS must be the program's "
                            f"nRanks (hccc {command} drives every rank itself); the cluster is --topology")
    group.add_argument("-g", "--ngpus", type=count_at_least(1), default=None, metavar="GPUS",
                       help=f"nccl-tests' -g, GPUs per thread: with -t, N x GPUS must be the program's nRanks "
                            f"(hccc {command} drives every rank of the program itself)")


def ranks_error(args, name: str, nranks: int) -> str | None:
    """Why ``-t``/``-g`` do not fit a program of ``nranks`` ranks, or None (both absent, or their
    product, each 1 when absent, is ``nranks``)."""
    t, g = getattr(args, "nthreads", None), getattr(args, "ngpus", None)
    if (t is None and g is None) or (t or 1) * (g or 1) == nranks:
        return None
    given = " ".join(f"-{k} {v}" for k, v in (("t", t), ("g", g)) if v is not None)
    return (f"{given}: {name} runs on {plural(nranks, 'rank')} (its nRanks), and nccl-tests runs -t x -g ranks "
            f"per process: give -t and -g whose product is {nranks}, or leave them out")


@dataclass(frozen=True)
class NcclFlag:
    """One nccl-tests option a command accepts without an effect: its letter, long name, default,
    what it does in nccl-tests and why it changes nothing here."""
    short: str
    long: str
    default: int
    meaning: str
    why: str


def nccl_noop_flags(command: str, *, model: bool) -> tuple[NcclFlag, ...]:
    """nccl-tests' options that change nothing on ``hccc COMMAND`` (``model``: a simulation, where
    timing and run options do not apply either)."""
    flags = [
        NcclFlag("-m", "--agg-iters", 1, "collectives aggregated per iteration",
                 "every timed iteration is one launch of the program" if not model else
                 "the model times one collective"),
        NcclFlag("-p", "--parallel-init", 0, "initialise the communicators from threads",
                 "every rank is set up in this process, in order" if not model else "nothing is initialised"),
        NcclFlag("-z", "--blocking", 0, "wait for each collective before the next",
                 "every launch is waited for already" if not model else "the model runs one collective"),
        NcclFlag("-y", "--stream-null", 0, "launch on the default stream",
                 "the kernels run on the platform's own streams" if not model else "nothing is launched"),
        NcclFlag("-G", "--cudagraph", 0, "capture the iterations as a CUDA graph and replay it N times",
                 "hccc's ranks meet at host barriers, which a graph replay cannot repeat" if not model
                 else "nothing is launched"),
        NcclFlag("-C", "--report-cputime", 0, "report CPU time instead of latency",
                 "the time column is the kernels' time" if not model else "the time column is the model's"),
        NcclFlag("-R", "--local-register", 0, "register the send/recv buffers (1 local, 2 symmetric)",
                 "the buffers are hccc's own allocations, mapped for every rank already" if not model
                 else "the model has no buffers"),
    ]
    if model:
        flags += [NcclFlag("-N", "--run-cycles", 1, "repeat the sweep N times",
                           "the model gives the same table every cycle"),
                  NcclFlag("-T", "--timeout", 0, "end a test after N seconds",
                           "a model does not hang")]
    return tuple(flags)


def add_nccl_noop_options(group, command: str, *, model: bool = False) -> None:
    """:func:`nccl_noop_flags` as options (an integer >= 0 each); :func:`noop_notes` says what a
    given one did not do."""
    for f in nccl_noop_flags(command, model=model):
        group.add_argument(f.short, f.long, dest="nccl_" + f.long[2:].replace("-", "_"), type=count_at_least(0),
                           default=None, metavar="N",
                           help=f"nccl-tests' {f.short}, {f.meaning}: accepted, no effect on hccc {command} "
                                f"({f.why})")


def noop_notes(args, command: str, *, model: bool = False) -> list[str]:
    """One line for each no-op nccl-tests option given a value other than nccl-tests' default."""
    notes = []
    for f in nccl_noop_flags(command, model=model):
        v = getattr(args, "nccl_" + f.long[2:].replace("-", "_"), None)
        if v is not None and v != f.default:
            notes.append(f"nccl-tests' {f.short} {v} ({f.meaning}): no effect on hccc {command}: {f.why}")
    return notes


def say_notes(command: str, notes: list[str], *, json_mode: bool) -> None:
    """Notes about the options, above a command's tables: ``# ...`` lines on standard output, or
    ``hccc COMMAND: note: ...`` on standard error where standard output is JSON."""
    for note in notes:
        if json_mode:
            sys.stderr.write(f"hccc {command}: note: {note}\n")
        else:
            print(f"# {note}", flush=True)


#: nccl-tests' long option names that hccc spells otherwise (its underscores, its ``--datatype``),
#: read as hccc's spelling, hidden from the help
NCCL_LONG_NAMES = {"--datatype": "--dtype", "--warmup_iters": "--warmup", "--agg_iters": "--agg-iters",
                   "--run_cycles": "--run-cycles", "--parallel_init": "--parallel-init",
                   "--stream_null": "--stream-null", "--report_cputime": "--report-cputime",
                   "--local_register": "--local-register"}


def add_nccl_long_names(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' long names (:data:`NCCL_LONG_NAMES`) of the options ``parser`` has, as hidden
    spellings of them (call after every option is added)."""
    for theirs, ours in NCCL_LONG_NAMES.items():
        action = parser._option_string_actions.get(ours)
        if action is not None:
            parser.add_argument(theirs, dest=action.dest, type=action.type, metavar=action.metavar,
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _factor(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 2 or len(text.strip()) > 6:
        raise argparse.ArgumentTypeError(f"step factor must be an integer >= 2, got '{text}'")
    return int(text)


@dataclass(frozen=True)
class Sweep:
    sizes: list[int]
    min_bytes: int
    max_bytes: int
    step: str            # "2(factor)", "1024(bytes)" or "list"


def sizes_error(sweep: Sweep, dtypes) -> str | None:
    """Why a size of the sweep cannot be used with one of ``dtypes`` (not a whole number of its
    elements: nccl-tests' count would be rounded, 0 for a size below one element), or None. The one
    check ``hccc run`` and ``hccc sim`` make, before any table."""
    from hccc.util.dtypes import DTYPES
    nbytes = {d.name: d.bytes for d in DTYPES}
    for dtype in dict.fromkeys(dtypes):
        es = nbytes[dtype]
        bad = [b for b in sweep.sizes if b % es]
        if bad:
            return f"size {bad[0]} is not a whole number of {dtype} elements ({es} bytes each)"
    return None


def sweep_is_default(args) -> bool:
    """Whether the command line gave no sizes (neither --sizes nor a -b/-e sweep)."""
    return args.sizes is None and all(getattr(args, k) is None
                                      for k in ("minbytes", "maxbytes", "stepfactor", "stepbytes"))


def sweep_sizes(args) -> Sweep:
    """The sizes the options ask for; a :class:`CompileError` for contradictory options."""
    ranged = any(getattr(args, k) is not None for k in ("minbytes", "maxbytes", "stepfactor", "stepbytes"))
    if not ranged:
        sizes = list(args.sizes if args.sizes is not None else args.sweep_default)
        return Sweep(sizes, min(sizes), max(sizes), "list")
    if args.sizes is not None:
        raise CompileError([Diagnostic("give sizes either as --sizes LIST or as a -b/-e sweep, not both", None)])
    if args.stepfactor is not None and args.stepbytes is not None:
        raise CompileError([Diagnostic("-f (step factor) and -i (step bytes) exclude each other", None)])
    lo = args.minbytes if args.minbytes is not None else args.maxbytes
    hi = args.maxbytes if args.maxbytes is not None else lo
    if lo is None:
        raise CompileError([Diagnostic("-f/-i need -b MINBYTES and/or -e MAXBYTES", None)])
    if hi < lo:
        raise CompileError([Diagnostic(f"-e {format_size(hi)} is below -b {format_size(lo)}", None)])
    sizes = [lo]
    if args.stepbytes is not None:
        step = f"{args.stepbytes}(bytes)"
        while sizes[-1] + args.stepbytes <= hi:
            sizes.append(sizes[-1] + args.stepbytes)
            _bound(sizes)
    else:
        factor = args.stepfactor or 2
        step = f"{factor}(factor)"
        if lo == 0 and hi > 0:
            raise CompileError([Diagnostic("a factor sweep cannot start at -b 0 (use -i, or -b > 0)", None)])
        while lo and sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
            _bound(sizes)
    return Sweep(sizes, lo, hi, step)


def _bound(sizes: list[int]) -> None:
    if len(sizes) > MAX_SIZES:
        raise CompileError([Diagnostic(f"the sweep gives more than {MAX_SIZES} sizes; use a larger step", None)])


def instance_combos(dtypes: list[str], ops: list[str]) -> tuple[list[tuple[str, str]], str | None]:
    """The (element type, operator) pairs a command runs, a table each, and the note of those left
    out. A pair the kernels have no instance for (:func:`hccc.util.dtypes.instance_error`: an
    integer avg) is left out where ``all`` asked for it (:class:`hccc.args.Every` on either side),
    said in one note line; a pair the user named on both sides is refused (a :class:`CompileError`
    with the reason), before anything runs."""
    from hccc.args import Every
    from hccc.util.dtypes import instance_error
    pairs = [(d, o) for d in dtypes for o in ops]
    lacking = [(d, o) for d, o in pairs if instance_error(d, o)]
    if not lacking:
        return pairs, None
    if not (isinstance(dtypes, Every) or isinstance(ops, Every)):
        d, o = lacking[0]
        raise CompileError([Diagnostic(f"-d {d} -o {o}: {instance_error(d, o)}", None)])
    kept = [p for p in pairs if p not in lacking]
    if not kept:
        d, o = lacking[0]
        raise CompileError([Diagnostic(f"-d {d} -o {o}: {instance_error(d, o)}", None)])
    by_op: dict[str, list[str]] = {}
    for d, o in lacking:
        by_op.setdefault(o, []).append(d)
    left = "; ".join(f"-o {o} with -d {','.join(ds)}" for o, ds in by_op.items())
    return kept, (f"left out of all: {left} (the kernels' {'/'.join(by_op)} is for floating types; "
                  "for integers, run sum and divide by the number of ranks)")


def redop_column(collective: str, op: str) -> str:
    return op if collective.lower() in REDUCING else "none"


def root_column(collective: str, root: int) -> int:
    return int(root) if collective.lower() in ROOTED else -1


def shift_field(collective: str, param: int) -> dict:
    """``{"shift": S}`` for a SendRecv (the JSON reports' field beside ``root``, which nccl-tests
    prints -1 for it), nothing for the others."""
    return {"shift": int(param)} if spec_of(collective).parameter == "shift" else {}


def placements(args) -> list[bool]:
    """``[False, True]`` (out of place, then in place) unless one was chosen."""
    if getattr(args, "inplace", False):
        return [True]
    if getattr(args, "out_of_place", False):
        return [False]
    return [False, True]


GROUP = {False: "out-of-place", True: "in-place"}
_LEFT = ("size", "count", "type", "redop", "root")
_LEFT_W = (12, 12, 8, 6, 6)


def table_header(groups: list[bool], columns: list[tuple[str, str, int]]) -> list[str]:
    """The three ``#`` header lines: the group names over their columns, the column names, the
    units. ``columns``: (name, unit, width) of one group's columns."""
    left = "  ".join(f"{n:>{w}}" for n, w in zip(_LEFT, _LEFT_W))
    units = "  ".join(f"{u:>{w}}" for u, w in zip(("(B)", "(elements)", "", "", ""), _LEFT_W))
    gw = sum(w + 2 for _, _, w in columns)
    line0 = " " * len(left) + "".join(f"{GROUP[g]:>{gw}}" for g in groups)
    line1 = left + "".join("".join(f"  {n:>{w}}" for n, _, w in columns) for _ in groups)
    line2 = units + "".join("".join(f"  {u:>{w}}" for _, u, w in columns) for _ in groups)
    return ["#" + line[1:].rstrip() for line in (line0, line1, line2)]


def table_left(size: int, count: int, type_name: str, redop: str, root: int) -> str:
    vals = (str(size), str(count), type_name, redop, str(root))
    return "  ".join(f"{v:>{w}}" for v, w in zip(vals, _LEFT_W))


def avg_busbw_line(values: list[float]) -> str:
    """nccl-tests' closing line: the mean bus bandwidth over every cell that has one."""
    good = [v for v in values if math.isfinite(v)]
    avg = sum(good) / len(good) if good else float("nan")
    return f"# Avg bus bandwidth    : {avg:.6g}"


def usage_checks(parser, args) -> None:
    """The usage errors argparse cannot see, each one line then the usage, exit status 2: no
    cluster (:func:`missing_cluster`), an empty selection band, a contradictory size sweep
    (``-b 8K -e 4K``)."""
    if missing_cluster(args):
        parser.error(missing_cluster(args))
    check_selection_band(parser, args)
    if hasattr(args, "sweep_default"):
        try:
            sweep_sizes(args)
        except CompileError as exc:
            parser.error(exc.diagnostics[0].message)
