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

from contextlib import contextmanager
from pathlib import Path

from hccc.args import (add_program_options, add_selection_band, add_xml_limit_arguments, program_options, proto_choice,
                       proto_metavar, xml_limits_from_args)


SUMMARY = "export an algorithm as MSCCL XML"
INPUTS = {"algo": "algorithm"}


@contextmanager
def located(path: str, alg=None):
    """An export's refusal (a limit of the target runtime, which is about the whole program)
    located at the algorithm's header where the input is an algorithm, else named by the input
    file: never a bare ``hccc: error``."""
    from hccc.util.diagnostics import CompileError, Diagnostic
    from hccc.util.limits import printable
    try:
        yield
    except CompileError as err:
        if all(d.location is not None for d in err.diagnostics):
            raise
        where = getattr(getattr(alg, "header", None), "location", None)
        raise CompileError([d if d.location is not None else
                            Diagnostic(d.message if where is not None else f"{printable(path)}: {d.message}",
                                       where, d.severity, d.notes)
                            for d in err.diagnostics]) from None


def configure(parser) -> None:
    from hccc.compiler.interop.msccl_format import PROTOCOLS

    parser.add_argument("algo", metavar="ALGO", help="algorithm (.rccl, ProgramIR .json, MSCCL .xml)")
    parser.add_argument("-o", "--output", metavar="FILE.xml", required=True, help="output file ('-': stdout)")
    add_program_options(parser)
    protocols = {p.lower(): p for p in PROTOCOLS}
    parser.add_argument("--proto", type=proto_choice("MSCCL XML", protocols), default="simple",
                        metavar=proto_metavar(protocols), help="protocol the runtime uses (any case)")
    add_selection_band(parser, "the runtime may choose this algorithm for", "0: no limit")
    add_xml_limit_arguments(parser)


def run(args) -> int:
    from hccc.compiler.interop.msccl_export import export_summary, export_xml
    from hccc.compiler.pipeline import load_program

    from hccc.compiler.pipeline import xml_instances
    opts = program_options(args, xml_instances=args.instances)
    from hccc.compiler.backend.output_dir import check_output_file, write_export
    from hccc.util.limits import printable
    if args.output != "-" and not Path(args.output).is_dir():
        check_output_file(args.output, [args.algo])   # before the work: never a device, FIFO, symlink or input
    lim = xml_limits_from_args(args)
    from hccc.compiler.pipeline import read_input
    src = read_input(args.algo, opts)
    if not hasattr(src, "prims") and args.xml_order == "step":
        from hccc.compiler.interop.msccl_export import export_algorithm
        from hccc.compiler.passes.verify import verify
        alg = src
        verify(alg)
        # each channel is an MSCCL instance (hccc.compiler.pipeline.xml_instances)
        with located(args.algo, alg):
            ir, text = export_algorithm(alg, lim, fuse=args.xml_fuse, chunk_bytes=args.chunk_size,
                                        instances=xml_instances(opts, alg.header.nchannels))
    else:
        ir = src if hasattr(src, "prims") else load_program(src, opts)
        with located(args.algo, None if hasattr(src, "prims") else src):
            text = export_xml(ir, lim, fuse=args.xml_fuse, instances=xml_instances(opts, ir.nchannels))
    out = write_export(args.output, text, args.algo, f"{ir.name}.xml")
    if out is None:
        return 0
    s = export_summary(text)
    print(f"hccc: wrote {printable(str(out))}: {ir.name}, {ir.collective} on {ir.nranks} ranks, {s['tbs']} thread blocks, "
          f"{s['steps']} steps ({s['nops']} nops)")
    return 0
