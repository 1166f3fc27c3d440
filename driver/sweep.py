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
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from hccc.args import check_selection_band, comma_list, format_size, missing_cluster, parse_size, size_or_zero
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
