"""``hccc plan ALGO -o FILE.json``: write an algorithm as an MSCCL++ execution plan.

The plan is what the MSCCL++ executor and its NCCL-API shim load (docs/mscclpp.md says how to
point each at it). ALGO is anything :func:`hccc.compiler.pipeline.load_program` reads; an algorithm
file is verified and exported in its step order with one thread block per connection end
(:func:`hccc.compiler.passes.build.build_algorithm_level`, what the executor's once-per-run
execution runs best); a ProgramIR, MSCCL XML or MSCCL++ plan is exported as given. Connections
between nodes (the algorithm's ``GPUPerNode``, or ``--gpus-per-node``) become port channels, the
others memory channels. Every executor limit is checked before anything is written (an
algorithm's thread blocks from its transfer table before it is lowered:
:func:`hccc.compiler.interop.mscclpp_limits.check_transfers_fit`); ``-o -``
writes to standard output, a file is replaced atomically.
"""
from __future__ import annotations

from pathlib import Path

from hccc.args import (add_deprecated_flag, add_program_options, add_selection_band, positive_int, program_options,
                       proto_choice, proto_metavar)

SUMMARY = "export an algorithm as an MSCCL++ execution plan"
INPUTS = {"algo": "algorithm"}


def configure(parser) -> None:
    from hccc.compiler.interop.mscclpp_plan import PROTOCOLS

    parser.add_argument("algo", metavar="ALGO", help="algorithm (.rccl, ProgramIR .json, MSCCL .xml, plan .json)")
    parser.add_argument("-o", "--output", metavar="FILE.json", required=True, help="output file ('-': stdout)")
    add_program_options(parser)
    protocols = {p.lower(): p for p in PROTOCOLS}
    parser.add_argument("--proto", type=proto_choice("the MSCCL++ executor", protocols), default="simple",
                        metavar=proto_metavar(protocols),
                        help="simple (put + signal) or ll (packets with flags, one node only); any case")
    parser.add_argument("--for-inplace", dest="inplace", action="store_true",
                        help="a plan for in-place calls (input inside output)")
    add_deprecated_flag(parser, "--inplace", "--for-inplace", "inplace",
                        " on hccc plan (hccc run's --inplace-only runs in place only)")
    parser.add_argument("--instances", type=positive_int, default=1, metavar="K",
                        help="K copies of every thread block on channels of their own, each moving 1/K of every chunk")
    parser.add_argument("--micro-batches", type=positive_int, default=1, metavar="M",
                        help="the task-level pipeline unrolled: every chunk cut into M parts, each primitive run "
                             "for every part before the next (needs a program deadlock-free that way)")
    add_selection_band(parser, "the executor may choose this plan for",
                       "0: the largest the plan's 32-bit offsets reach")
    parser.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="N",
                        help="GPUs per node (default: the algorithm's GPUPerNode; none: one node)")
    parser.add_argument("--max-tbs", type=positive_int, default=108, metavar="N",
                        help="thread blocks per rank resident at once on the target GPU (108: A100)")


def run(args) -> int:
    from hccc.compiler.backend.output_dir import check_output_file, write_export
    from hccc.util.limits import printable
    from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_summary, plan_text
    from hccc.compiler.interop.mscclpp_plan import PlanLimits
    from hccc.compiler.pipeline import load_program

    if args.output != "-" and not Path(args.output).is_dir():
        check_output_file(args.output, [args.algo])
    from hccc.commands.xml import located
    gpn = args.gpus_per_node or 0
    alg = None
    if Path(args.algo).suffix.lower() not in (".json", ".xml"):
        from hccc.compiler.passes.build import build_algorithm_level
        from hccc.compiler.passes.verify import verify
        from hccc.compiler.pipeline import load_algorithm
        alg = load_algorithm(args.algo, max_transfers=args.max_transfers)
        verify(alg)
        gpn = gpn or alg.header.gpu_per_node
        # the plan's thread blocks counted from the transfer table first: a program that cannot
        # fit is refused before it is lowered
        from hccc.compiler.interop.mscclpp_limits import check_transfers_fit
        with located(args.algo, alg):
            check_transfers_fit(alg.src, alg.dst, PlanLimits(max_tbs=args.max_tbs),
                                nodes=node_map(alg.header.nranks, gpn), channel=alg.channels, protocol=args.proto,
                                instances=args.instances, micro_batches=args.micro_batches)
        ir = build_algorithm_level(alg, chunk_bytes=args.chunk_size)
    else:
        ir = load_program(args.algo, program_options(args))
        gpn = gpn or (ir.origin.gpus_per_node or 0)
    with located(args.algo, alg):
        plan = export_plan(ir, nodes=node_map(ir.nranks, gpn), protocol=args.proto, inplace=args.inplace,
                           instances=args.instances, micro_batches=args.micro_batches, min_bytes=args.min_bytes,
                           max_bytes=args.max_bytes,
                           limits=PlanLimits(max_tbs=args.max_tbs))
    text = plan_text(plan)
    out = write_export(args.output, text, args.algo, f"{ir.name}.mscclpp.json")
    if out is None:
        return 0
    s = plan_summary(plan)
    print(f"hccc: wrote {printable(str(out))}: {ir.name}, {ir.collective} on {ir.nranks} ranks, {args.proto}, "
          f"{s['tbs']} thread blocks, {s['ops']} operations ({s['nops']} nops), messages "
          f"{plan['min_message_size']}..{plan['max_message_size']} bytes")
    return 0
