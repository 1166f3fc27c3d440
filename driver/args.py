"""Argument types and shared options of the ``hccc`` command line: one size parser, one comma-list
parser, one help formatter and the options several commands share (program options, topology,
MSCCL XML limits).

Every subcommand module imports its argument machinery from here (never from :mod:`hccc.cli`,
which only dispatches). Argument types raise :class:`argparse.ArgumentTypeError`, which argparse
turns into ``hccc CMD: error: argument --X: ...`` with exit status 2.

Sizes use the ``.topo`` language's syntax (:mod:`hccc.util.sizes`): ``4096``,
``64K``, ``1.5M``, ``1G``, ``1MiB``. Defaults are shown one way, by :class:`HelpFormatter`:
``(default: X)`` at the end of the option's help; size defaults are given as text (``"1M"``) so
the help shows them as the user would type them (argparse converts a text default with the
option's type).
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Sequence

from hccc.util.limits import check_size, option_int, option_seconds, printable
from hccc.util.sizes import format_size, size_value

__all__ = ["Every", "CommandParser", "HelpFormatter", "op_choice", "parse_size", "size_or_zero", "positive_int", "count_at_least", "seconds",
           "comma_list", "choice_list", "add_program_options", "add_topology_option",
           "add_xml_limit_arguments", "xml_limits_from_args", "add_cluster_argument", "missing_cluster",
           "add_fuse_option", "format_size", "program_options"]

#: most items one comma-separated option takes (bounds the work a command line can ask for)
MAX_LIST_ITEMS = 64


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs keep their line breaks; every option with a default ends its help
    with ``(default: X)`` (nothing for flags, options without a default, or help that already
    names its default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text is argparse.SUPPRESS or "%(default)" in text or "(default" in text:
            return text
        default = action.default
        if default is None or default is False or default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(default, (list, tuple)):
            shown = ",".join(str(v) for v in default)
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})" if text else f"(default: {shown.replace('%', '%%')})"


class CommandParser(argparse.ArgumentParser):
    """argparse with hccc's usage errors: a mistyped option gets "did you mean" with the closest
    option of the command (as a mistyped command does), whatever error argparse reports first (a
    missing required option, an unrecognised one); hidden aliases (``help=SUPPRESS``) are accepted
    but never suggested."""

    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        import sys
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _hints(self) -> list[str]:
        import difflib
        known = [o for a in self._actions for o in a.option_strings]
        shown = [o for a in self._actions if a.help is not argparse.SUPPRESS
                 for o in a.option_strings if o.startswith("--")]
        hints = []
        for word in self._argv:
            if word == "--":
                break
            flag = word.split("=", 1)[0]
            if not flag.startswith("--") or flag in known or any(k.startswith(flag) for k in known):
                continue
            close = difflib.get_close_matches(flag, shown, n=1, cutoff=0.6) or \
                difflib.get_close_matches(flag.replace("_", "-"), shown, n=1, cutoff=0.6)
            hints.append(f"'{flag}': did you mean '{close[0]}'?" if close else f"'{flag}' is not an option")
        return hints

    def error(self, message: str):
        """A usage error: one line first (``hccc CMD: error: ...``), the usage after, exit status 2."""
        import sys
        hints = self._hints()
        if hints and "did you mean" in " ".join(hints):
            message += " (" + "; ".join(hints) + ")"
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        self.print_usage(sys.stderr)
        sys.exit(2)


def warn_deprecated(prog: str, old: str, new: str, why: str = "") -> None:
    """The warning of a deprecated option spelling (still accepted)."""
    import sys
    sys.stderr.write(f"{prog}: warning: {old} is deprecated{why}; use {new}\n")


def deprecated_alias(new: str, why: str = "") -> type[argparse.Action]:
    """An argparse action for an old option spelling kept working: it stores as the option it
    stands for does and warns, naming ``new`` (the spelling to use). Hidden from the help."""

    class Alias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            warn_deprecated(parser.prog, option_string, new, why)
            setattr(namespace, self.dest, True if self.nargs == 0 else values)

    return Alias


def add_deprecated_flag(parser, old: str, new: str, dest: str, why: str = "") -> None:
    """``old``: a hidden, warned spelling of the flag ``new`` (``store_true`` into ``dest``)."""
    parser.add_argument(old, dest=dest, nargs=0, action=deprecated_alias(new, why), help=argparse.SUPPRESS)


#: every protocol name an engine may have, in hccc's one spelling (any case is accepted)
PROTOCOL_NAMES = ("auto", "simple", "ll", "ll128")


def proto_choice(engine: str, spellings: dict[str, str]) -> Callable[[str], str]:
    """Type of ``--proto``, spelled one way on every command, in any case: ``auto``, ``simple``,
    ``ll``, ``ll128``. ``spellings`` maps the names ``engine`` has to the value the command uses
    (e.g. ``{"simple": "Simple", "ll": "LL"}``); a protocol the engine lacks is an error saying
    which it has."""
    def parse(text: str) -> str:
        name = text.strip().lower()
        if name in spellings:
            return spellings[name]
        has = "|".join(spellings)
        if name in PROTOCOL_NAMES:
            raise argparse.ArgumentTypeError(f"{engine} has no '{name}' protocol (it has {has})")
        raise argparse.ArgumentTypeError(f"'{printable(text, limit=40)}' is not a protocol ({has})")
    parse.__name__ = "protocol"
    return parse


def proto_metavar(spellings: dict[str, str]) -> str:
    return "|".join(spellings)


def op_choice(ops: Sequence[str], command: str) -> Callable[[str], str]:
    """Type of ``-o/--op``, the reduction operator (nccl-tests' ``-o``). A value that is no
    operator, e.g. a folder, gets an error saying what ``-o`` means on ``command`` and how to
    write compiled output instead."""
    def parse(text: str) -> str:
        if text.strip().lower() in ops:
            return text.strip().lower()
        if text.strip().lower() in NCCL_OPS:
            raise argparse.ArgumentTypeError(f"hccc's kernels have no '{text.strip().lower()}' reduction "
                                             f"(they have {', '.join(ops)})")
        looks_like_path = "/" in text or "." in text or text.endswith(os.sep)
        raise argparse.ArgumentTypeError(
            f"'{printable(text, limit=40)}' is not a reduction operator ({', '.join(ops)})"
            + (f": on hccc {command}, -o/--op is the reduction, as nccl-tests' -o; {command} writes no "
               "output folder (compile to one with 'hccc ALGO -o OUTDIR', then pass OUTDIR here)"
               if looks_like_path else ""))
    parse.__name__ = "reduction operator"
    return parse


#: nccl-tests' names of the element types (its ``-d``), as hccc's tables name them; hccc's own names
#: are accepted too, and ``all`` is every type hccc's kernels have
NCCL_TYPE_NAMES = {"int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                   "uint64": "uint64", "half": "float16", "float": "float32", "double": "float64",
                   "bfloat16": "bfloat16"}
#: nccl-tests' reduction operators (its ``-o``)
NCCL_OPS = ("sum", "prod", "min", "max", "avg")


class Every(list):
    """The list ``all`` gives (every element type or operator of the kernels' table), told apart from
    one the user spelt out: a command leaves the (type, operator) pairs the kernels lack out of
    ``all`` (:func:`hccc.sweep.instance_combos`) but refuses one named explicitly."""


def nccl_type_name(dtype: str) -> str:
    """nccl-tests' name of one of hccc's element types (the kernels' table, hccc.util.dtypes), or of
    another type nccl-tests knows; the name itself where neither has it."""
    from hccc.util import dtypes
    try:
        return dtypes.dtype(dtype).nccl
    except ValueError:
        return next((k for k, v in NCCL_TYPE_NAMES.items() if v == dtype), dtype)


def dtype_list(known: Sequence[str]) -> Callable[[str], list[str]]:
    """Type of ``-d/--dtype`` (nccl-tests' ``-d``): one element type, a comma list, or ``all``
    (every type in ``known``, the kernels' table), each by nccl-tests' name (``float``, ``half``,
    ``bfloat16``, ``double``, ...) or hccc's (``float32``, ...), in any case."""
    def one(text: str) -> str:
        name = text.strip().lower()
        dtype = NCCL_TYPE_NAMES.get(name, name)
        if dtype in known:
            return dtype
        has = ", ".join(f"{nccl_type_name(d)} ({d})" if nccl_type_name(d) != d else d for d in known)
        if dtype in NCCL_TYPE_NAMES.values():
            raise argparse.ArgumentTypeError(f"hccc's kernels have no {dtype} type (they have {has}, or all)")
        raise argparse.ArgumentTypeError(f"'{printable(text, limit=40)}' is not an element type ({has}, or all)")

    def parse(text: str) -> list[str]:
        if text.strip().lower() == "all":
            return Every(known)
        return list(dict.fromkeys(comma_list(one, "element types")(text)))
    parse.__name__ = "element type"
    return parse


def dtype_one(known: Sequence[str], command: str) -> Callable[[str], str]:
    """Type of ``-d/--dtype`` where a command takes one element type (any name of
    :func:`dtype_list`)."""
    many = dtype_list(known)

    def parse(text: str) -> str:
        got = many(text)
        if len(got) != 1:
            raise argparse.ArgumentTypeError(f"hccc {command} takes one element type at a time, got '{text}'")
        return got[0]
    parse.__name__ = "element type"
    return parse


def op_list(ops: Sequence[str], command: str) -> Callable[[str], list[str]]:
    """Type of ``-o/--op`` where it is a list (nccl-tests' ``-o``): one reduction operator, a
    comma list or ``all`` (every operator in ``ops``, the kernels' table), any case; a value that
    is no operator gets :func:`op_choice`'s error."""
    single = op_choice(ops, command)

    def parse(text: str) -> list[str]:
        if text.strip().lower() == "all":
            return Every(ops)
        if "," not in text:
            return [single(text)]
        return list(dict.fromkeys(comma_list(single, "operators")(text)))
    parse.__name__ = "reduction operator"
    return parse


def _whole_bytes(text: str, *, zero_ok: bool) -> int:
    value = size_value(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"invalid size '{printable(text, limit=40)}' (expected e.g. 4096, 64K, 1.5M, 1G)")
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(f"size '{printable(text, limit=40)}' is not a whole number of bytes")
    if value < 0 or (value == 0 and not zero_ok):
        raise argparse.ArgumentTypeError(f"size must be positive: '{printable(text, limit=40)}'")
    return check_size(int(value))


def parse_size(text: str) -> int:
    """A positive number of bytes: ``4096``, ``64K``, ``1.5M``, ``1G`` (binary multiples; an
    optional ``B``/``iB``), the ``.topo`` language's syntax."""
    return _whole_bytes(text, zero_ok=False)


def size_or_zero(text: str) -> int:
    """A number of bytes, 0 allowed."""
    return _whole_bytes(text, zero_ok=True)


def count_at_least(low: int, what: str = "an integer") -> Callable[[str], int]:
    """Type of an integer option with a lower bound."""
    def parse(text: str) -> int:
        t = text.strip()
        if not (t.isascii() and t.isdigit()) or len(t) > 18 or int(t) < low:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low}, got '{printable(text, limit=40)}'")
        return option_int(t, low)      # and at most MAX_OPTION_COUNT
    parse.__name__ = f"integer>={low}"
    return parse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return count_at_least(1)(text)


def seconds(*, zero_ok: bool = True) -> Callable[[str], float]:
    """Type of a duration option in seconds (finite; 0 allowed unless ``zero_ok`` is False)."""
    def parse(text: str) -> float:
        return option_seconds(text, 0.0, allow_lo=zero_ok)     # finite, at most a week
    parse.__name__ = "seconds"
    return parse


def comma_list(item: Callable[[str], object], what: str = "values", *,
               max_items: int = MAX_LIST_ITEMS) -> Callable[[str], list]:
    """Type of a comma-separated option (``4K,64K,1M``): each item through ``item``; empty items,
    an empty list and more than ``max_items`` items are errors."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got '{text}'")
        if len(parts) > max_items:
            raise argparse.ArgumentTypeError(f"at most {max_items} {what}, got {len(parts)}")
        return [item(p) for p in parts]
    parse.__name__ = f"list of {what}"
    return parse


def choice_list(allowed: Sequence[str], what: str = "values") -> Callable[[str], list[str]]:
    """Type of a comma-separated subset of ``allowed`` (``float32,int32``)."""
    def one(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"'{text}' is not one of {','.join(allowed)}")
        return text
    return comma_list(one, what)


TOPOLOGY_HELP = ("cluster description (.topo, or a TACCL profile .json): the algorithm's nRanks must equal its "
                 "GPU count and every transfer must use one of its links")


#: the warning of ``-t`` where it still names the cluster
T_DEPRECATED = " for the cluster (hccc run, sim and fuzz take -t as nccl-tests' thread count)"


def add_topology_option(parser: argparse.ArgumentParser, *, required: bool = False, extra: str = "",
                        help: str | None = None, short: bool = True) -> None:
    """``--topology T``; with ``short``, ``-t T`` too, a hidden spelling that warns (``-t`` is
    nccl-tests' thread count on the commands that take nccl-tests' options, which pass
    ``short=False``)."""
    parser.add_argument("--topology", metavar="T", required=required, help=(help or TOPOLOGY_HELP) + extra)
    if short:
        parser.add_argument("-t", dest="topology", metavar="T", help=argparse.SUPPRESS,
                            action=deprecated_alias("--topology", T_DEPRECATED))


def add_cluster_argument(parser: argparse.ArgumentParser, dest: str, help: str) -> None:
    """The cluster a command is about, as its positional ``T`` or as ``--topology T`` (the
    spelling of every other command; ``-t T`` still read, with a warning); :func:`missing_cluster`
    says when neither was given."""
    parser.add_argument(dest, metavar="T", nargs="?", default=argparse.SUPPRESS, help=help + " (or --topology T)")
    parser.add_argument("--topology", dest=dest, metavar="T", default=None, help=argparse.SUPPRESS)
    parser.add_argument("-t", dest=dest, metavar="T", default=None, help=argparse.SUPPRESS,
                        action=deprecated_alias("--topology", T_DEPRECATED))
    parser.set_defaults(cluster_dest=dest)


def missing_cluster(args) -> str | None:
    """The usage error of a command of :func:`add_cluster_argument` given no cluster, or None."""
    dest = getattr(args, "cluster_dest", None)
    if dest and getattr(args, dest, None) is None:
        return "the following arguments are required: T (a cluster description, .topo or TACCL .json; or --topology T)"
    return None


FUSE_HELP = ("fuse a receive with the send that forwards it (recvCopySend, ...; one pass over memory less "
             "per forwarded byte; fused traffic runs on logical connections and TBs of its own). auto: "
             "with --topology, fused where the simulator finds it never slower there (see "
             "benchmarks/fusion.py), else off; --fuse alone means on (default: auto)")


def add_fuse_option(parser, prefix: str = "") -> None:
    """``--fuse [auto|on|off]``: the same option on every command that lowers an algorithm."""
    parser.add_argument("--fuse", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),
                        help=prefix + FUSE_HELP)


def channels_arg(text: str) -> int | None:
    """``--channels``: ``auto`` (None) or a channel count."""
    from hccc.compiler.passes.channels import parse_channels
    try:
        return parse_channels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_program_options(parser: argparse.ArgumentParser, *, chunk_default: str | None = "1M",
                        chunk_help: str | None = None, tb_alloc_default: str | None = "state",
                        prefix: str = "", fuse: bool = False) -> None:
    """How an algorithm becomes a program: ``--scheduler``, ``--tb-alloc``, ``--chunk-size``,
    ``--max-transfers``, ``--channels`` and, with ``fuse``, ``--fuse`` (``prefix``, e.g. "for .rccl
    input: ", starts every help)."""
    if fuse:
        add_fuse_option(parser, prefix)
    parser.add_argument("--scheduler", choices=("hpds", "rr"), default="hpds",
                        help=prefix + "HPDS (ResCCL Algorithm 1) or the round-robin baseline")
    parser.add_argument("--tb-alloc", choices=("state", "connection"), default=tb_alloc_default,
                        help=prefix + "state-based thread-block allocation or the connection-based baseline")
    parser.add_argument("--chunk-size", type=parse_size, default=chunk_default, metavar="BYTES",
                        help=prefix + (chunk_help or "micro-batch slice (FIFO slot) size per chunk, e.g. 512K, 1.5M"))
    parser.add_argument("--max-transfers", type=positive_int, default="10000000", metavar="N",
                        help=prefix + "refuse programs with more transfers than this")
    parser.add_argument("--channels", type=channels_arg, default=None, metavar="K|auto",
                        help="blocks per thread block: each moves 1/K of every slice over FIFOs of its "
                             "own (default: auto, i.e. the CPU emulation 1; CUDA/HIP the .rccl header's "
                             "nChannels where it writes one, 1 included, else from the SM count, thread "
                             "blocks and slice size)")


def program_options(args, **overrides):
    """The :class:`CompileOptions` that :func:`add_program_options`' options ask for."""
    from hccc.compiler.pipeline import CompileOptions

    kw = dict(scheduler=args.scheduler, tb_alloc=args.tb_alloc or "state",
              max_transfers=args.max_transfers, channels=getattr(args, "channels", None),
              fuse=getattr(args, "fuse", "auto"))
    if args.chunk_size is not None:      # else CompileOptions' slot: an IR always has a slot size
        kw["chunk_bytes"] = args.chunk_size
    kw.update(overrides)
    return CompileOptions(**kw)


def add_xml_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The MSCCL runtime-limit options (the compile command and ``hccc xml`` both write XML)."""
    g = parser.add_argument_group("MSCCL XML runtime limits (defaults: MSCCL executor / RCCL)")
    g.add_argument("--xml-legacy", action="store_true",
                   help="target the older msccl executor (256 steps per thread block, 216 thread blocks)")
    g.add_argument("--xml-max-steps", type=positive_int, metavar="N", help="steps per thread block (64)")
    g.add_argument("--xml-max-count", type=positive_int, metavar="N", help="chunks per step (71)")
    g.add_argument("--xml-max-tbs-per-channel", type=positive_int, metavar="N",
                   help="send-peer (and recv-peer) thread blocks per channel (32)")
    g.add_argument("--xml-max-channels", type=positive_int, metavar="N", help="channels (32)")
    g.add_argument("--xml-max-elements", type=positive_int, metavar="N",
                   help="XML elements per rank the runtime's loader holds (4096)")
    g.add_argument("--instances", type=positive_int, default=1, metavar="K",
                   help="K instances of the program on their own thread blocks and channels, each moving "
                        "1/K of every chunk (msccl-tools' instances)")
    g.add_argument("--xml-fuse", action="store_true",
                   help="fuse a receive with the send forwarding it into one rcs/rrcs/rrs step where the two "
                        "connection ends can share a thread block (fewer steps; their thread blocks then run "
                        "in series, which can cost a few percent)")
    g.add_argument("--xml-order", choices=("step", "kernel"), default="step",
                   help="export an algorithm in its step order with one thread block per connection end, "
                        "the way the MSCCL runtimes run best (step), or the order and thread "
                        "blocks of hccc's kernels (kernel: --scheduler, --tb-alloc)")


def add_selection_band(parser, what: str, top: str) -> None:
    """``--select-min-bytes`` / ``--select-max-bytes``: the message sizes an exported file tells
    its runtime to choose it for (MSCCL's minBytes/maxBytes, MSCCL++'s message size range). Not a
    sweep: ``-b``/``--min-bytes`` and ``-e``/``--max-bytes`` are the sizes ``hccc run`` and
    ``hccc sim`` sweep, so here those spellings are deprecated aliases that warn."""
    parser.add_argument("--select-min-bytes", dest="min_bytes", type=size_or_zero, default="0", metavar="BYTES",
                        help=f"smallest message size {what}")
    parser.add_argument("--select-max-bytes", dest="max_bytes", type=size_or_zero, default="0", metavar="BYTES",
                        help=f"largest message size {what} ({top})")
    why = " here (run and sim sweep sizes with it)"
    parser.add_argument("--min-bytes", dest="min_bytes", type=size_or_zero, help=argparse.SUPPRESS,
                        action=deprecated_alias("--select-min-bytes", why))
    parser.add_argument("--max-bytes", dest="max_bytes", type=size_or_zero, help=argparse.SUPPRESS,
                        action=deprecated_alias("--select-max-bytes", why))


def check_selection_band(parser, args) -> None:
    """A usage error where the band is empty."""
    lo, hi = getattr(args, "min_bytes", 0), getattr(args, "max_bytes", 0)
    if lo and hi and hi < lo:
        parser.error(f"--select-max-bytes {format_size(hi)} is below --select-min-bytes {format_size(lo)}")


def add_direct_option(p) -> None:
    """``--direct auto|off`` (the compile command and ``hccc run``)."""
    p.add_argument("--direct", choices=("auto", "off"), default="auto",
                   help="direct mode: for every receive the compiler proves may take its data straight "
                        "from the sender (no other access of its destination can fall between), the "
                        "sender writes the receiver's destination instead of the FIFO slot (one HBM pass "
                        "less). Used by single-process launches; the multi-process Communicator and the "
                        "C++ host API keep the FIFO. off: the FIFO everywhere (default: auto)")


def xml_limits_from_args(args):
    """The :class:`XmlLimits` the options of :func:`add_xml_limit_arguments` (and ``hccc xml``'s
    ``--proto``, ``--min-bytes``, ``--max-bytes`` where present) ask for."""
    from hccc.compiler.interop.msccl_format import LEGACY_LIMITS, XmlLimits

    lim = LEGACY_LIMITS if args.xml_legacy else XmlLimits()
    changes = {k: getattr(args, k) for k in ("proto", "min_bytes", "max_bytes") if hasattr(args, k)}
    # (``--select-min-bytes``/``--select-max-bytes`` store as min_bytes/max_bytes)
    for opt, field in (("xml_max_steps", "max_steps"), ("xml_max_count", "max_count"),
                       ("xml_max_tbs_per_channel", "max_tbs_per_channel"), ("xml_max_channels", "max_channels"),
                       ("xml_max_elements", "max_xml_nodes")):
        v = getattr(args, opt)
        if v is not None:
            changes[field] = v
    return lim.with_(**changes)
