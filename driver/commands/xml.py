"""``hccc xml ALGO -o FILE.xml``: write an algorithm as MSCCL XML for the MSCCL executor and RCCL.

ALGO is anything :func:`hccc.compiler.pipeline.load_program` reads (``.rccl``, a ProgramIR
``.json``, another MSCCL ``.xml``). An algorithm is verified and exported in its step order with one
thread block per connection end (:func:`hccc.compiler.interop.msccl_export.export_algorithm`, the
runtime limits checked on the transfer table first); with ``--xml-order kernel`` it is scheduled and
lowered as for hccc's kernels (``--scheduler``, ``--tb-alloc``) and that program exported. A ProgramIR
or XML is exported as given (:func:`hccc.compiler.interop.msccl_xml.export_xml`). ``--xml-fuse``
and ``--instances K`` apply to both. The defaults target the current
runtimes' limits (64 steps per thread block, ...); ``--xml-legacy`` targets the older msccl
executor (256 steps), and each limit has its own option. ``-o -`` writes to standard output.
The file is replaced atomically: a failed export leaves an existing file untouched.
"""
from __future__ import annotations

import sys
from pathlib import Path


def configure(parser) -> None:
    from hccc.cli import _positive_int, parse_size
    from hccc.compiler.interop.msccl_format import PROTOCOLS

    parser.add_argument("algo", metavar="ALGO", help="algorithm (.rccl, ProgramIR .json, MSCCL .xml)")
    parser.add_argument("-o", "--output", metavar="FILE.xml", required=True, help="output file ('-': stdout)")
    parser.add_argument("--scheduler", choices=("hpds", "rr"), default="hpds", help="with --xml-order kernel")
    parser.add_argument("--tb-alloc", choices=("state", "connection"), default="state",
                        help="with --xml-order kernel")
    parser.add_argument("--chunk-size", type=parse_size, default=1 << 20, metavar="BYTES")
    parser.add_argument("--max-transfers", type=_positive_int, default=10 ** 7, metavar="N")
    parser.add_argument("--proto", choices=PROTOCOLS, default="Simple", help="protocol the runtime uses")
    parser.add_argument("--min-bytes", type=_size_or_zero, default=0, metavar="BYTES",
                        help="smallest message size the runtime may choose this algorithm for")
    parser.add_argument("--max-bytes", type=_size_or_zero, default=0, metavar="BYTES",
                        help="largest message size (0: no limit)")
    add_limit_arguments(parser)


def add_limit_arguments(parser) -> None:
    """The runtime-limit options (shared with the compile command, which also writes the XML)."""
    from hccc.cli import _positive_int

    g = parser.add_argument_group("MSCCL XML runtime limits (defaults: MSCCL executor / RCCL)")
    g.add_argument("--xml-legacy", action="store_true",
                   help="target the older msccl executor (256 steps per thread block, 216 thread blocks)")
    g.add_argument("--xml-max-steps", type=_positive_int, metavar="N", help="steps per thread block (64)")
    g.add_argument("--xml-max-count", type=_positive_int, metavar="N", help="chunks per step (71)")
    g.add_argument("--xml-max-tbs-per-channel", type=_positive_int, metavar="N",
                   help="send-peer (and recv-peer) thread blocks per channel (32)")
    g.add_argument("--xml-max-channels", type=_positive_int, metavar="N", help="channels (32)")
    g.add_argument("--xml-max-elements", type=_positive_int, metavar="N",
                   help="XML elements per rank the runtime's loader holds (4096)")
    g.add_argument("--instances", type=_positive_int, default=1, metavar="K",
                   help="K instances of the program on their own thread blocks and channels, each moving "
                        "1/K of every chunk (msccl-tools' instances; default 1)")
    g.add_argument("--xml-fuse", action="store_true",
                   help="fuse a receive with the send forwarding it into one rcs/rrcs/rrs step where the two "
                        "connection ends can share a thread block (fewer steps; their thread blocks then run "
                        "in series, which can cost a few percent)")
    g.add_argument("--xml-order", choices=("step", "kernel"), default="step",
                   help="export an algorithm in its step order with one thread block per connection end, "
                        "the way the MSCCL runtimes run best (step, default), or the order and thread "
                        "blocks of hccc's kernels (kernel: --scheduler, --tb-alloc)")


def _size_or_zero(text: str) -> int:
    from hccc.cli import parse_size
    return 0 if text.strip() == "0" else parse_size(text)


def limits_from_args(args):
    """The :class:`XmlLimits` the options ask for."""
    from hccc.compiler.interop.msccl_format import LEGACY_LIMITS, XmlLimits

    lim = LEGACY_LIMITS if args.xml_legacy else XmlLimits()
    changes = {k: getattr(args, k) for k in ("proto", "min_bytes", "max_bytes") if hasattr(args, k)}
    for opt, field in (("xml_max_steps", "max_steps"), ("xml_max_count", "max_count"),
                       ("xml_max_tbs_per_channel", "max_tbs_per_channel"), ("xml_max_channels", "max_channels"),
                       ("xml_max_elements", "max_xml_nodes")):
        v = getattr(args, opt)
        if v is not None:
            changes[field] = v
    return lim.with_(**changes)


def run(args) -> int:
    from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic
    from hccc.compiler.interop.msccl_export import export_summary, export_xml
    from hccc.compiler.pipeline import CompileOptions, load_program

    opts = CompileOptions(scheduler=args.scheduler, tb_alloc=args.tb_alloc, chunk_bytes=args.chunk_size,
                          max_transfers=args.max_transfers)
    if args.min_bytes and args.max_bytes and args.max_bytes < args.min_bytes:
        raise CompileError([Diagnostic(f"--max-bytes {args.max_bytes} is below --min-bytes {args.min_bytes}", None)])
    lim = limits_from_args(args)
    if Path(args.algo).suffix.lower() not in (".json", ".xml") and args.xml_order == "step":
        from hccc.compiler.interop.msccl_export import export_algorithm
        from hccc.compiler.pipeline import load_algorithm
        from hccc.compiler.passes.verify import verify
        alg = load_algorithm(args.algo, max_transfers=args.max_transfers)
        verify(alg)
        ir, text = export_algorithm(alg, lim, fuse=args.xml_fuse, instances=args.instances,
                                    chunk_bytes=args.chunk_size)
    else:
        ir = load_program(args.algo, opts)
        text = export_xml(ir, lim, fuse=args.xml_fuse, instances=args.instances)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.is_dir():
        raise CompileError([Diagnostic(f"'{out}' is a directory; give a file name such as {out}/{ir.name}.xml",
                                       None)])
    if not out.parent.exists() and str(out.parent):
        raise CompileError([Diagnostic(f"cannot write '{out}': directory '{out.parent}' does not exist", None)])
    from hccc.compiler.backend.output_dir import write_text_atomically
    write_text_atomically(out, text)
    s = export_summary(text)
    print(f"hccc: wrote {out}: {ir.name}, {ir.collective} on {ir.nranks} ranks, {s['tbs']} thread blocks, "
          f"{s['steps']} steps ({s['nops']} nops)")
    return 0
