"""``hccc gen GENERATOR ...``: write an algorithm generated from a cluster description.

    hccc gen c2c T.topo --collective allgather|reducescatter|allreduce|broadcast|reduce|alltoall [--root R]
                 [--pipeline K] [--intra ring|mesh] [--group-by model|vendor]
                 [--nodes-per-cluster M] [--border nic|one-per-nic] -o ALGO.rccl [--json]

``c2c`` is HetCCL's hierarchical breakdown for mixed-vendor clusters (``hccc.compiler.cluster.c2c``): start
intra-cluster collective, cluster-to-cluster ring between border ranks (data split in proportion to
their NIC bandwidth), end intra-cluster collective, pipelined over K pieces. The program is verified
before it is written; the file is replaced atomically. AllToAll (``hccc.compiler.cluster.c2c_alltoall``):
intra-cluster gather to border ranks, one cluster-to-cluster exchange per block, intra-cluster
scatter; ``--pipeline K`` splits every block into K pieces. ``-o -`` writes to standard output.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hccc.args import add_cluster_argument, count_at_least, positive_int
from hccc.util.diagnostics import CompileError, Diagnostic

GENERATORS = ("c2c",)


SUMMARY = "generate algorithms (c2c: mixed-vendor hierarchical collectives)"
INPUTS = {"cluster": "cluster"}


def configure(p: argparse.ArgumentParser) -> None:
    from hccc.compiler.cluster.c2c import COLLECTIVES, INTRA_ALGORITHMS

    p.add_argument("generator", choices=GENERATORS,
                   help="c2c: HetCCL cluster-to-cluster breakdown for mixed-vendor clusters")
    add_cluster_argument(p, "cluster", "cluster description (.topo, or a TACCL profile .json)")
    p.add_argument("--collective", required=True, choices=COLLECTIVES + ("alltoall",), type=str.lower,
                   help="collective to generate")
    p.add_argument("--root", type=count_at_least(0, 'a rank'), default=None, metavar="R", help="root rank (broadcast, reduce)")
    p.add_argument("--pipeline", type=positive_int, default=1, metavar="K",
                   help="split the data into K pieces whose intra- and inter-cluster stages overlap "
                        "(clamped so that every piece holds at least one chunk)")
    p.add_argument("--intra", choices=INTRA_ALGORITHMS, default="ring",
                   help="intra-cluster algorithm: ring chains or direct full mesh")
    p.add_argument("--group-by", choices=("model", "vendor"), default="model",
                   help="homogeneous clusters: same vendor and GPU model, or same vendor")
    p.add_argument("--nodes-per-cluster", type=positive_int, default=None, metavar="M",
                   help="split every homogeneous cluster into sub-clusters of at most M nodes")
    p.add_argument("--border", choices=("nic", "one-per-nic"), default="nic",
                   help="border ranks: every GPU behind a NIC, sharing it (nic), or one GPU per NIC")
    p.add_argument("--name", default=None, help="AlgoName of the program (sanitised; default c2c_COLL_CLUSTER)")
    p.add_argument("-o", "--output", required=True, metavar="ALGO.rccl",
                   help="output file (replaced atomically), or - for standard output")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of a line of text (on stderr with -o -)")


def run(args) -> int:
    from hccc.compiler.cluster.c2c import plan_c2c
    from hccc.compiler.backend.output_dir import check_output_file, write_text_atomically
    from hccc.util.limits import printable
    from hccc.compiler.cluster.hierarchy import HierarchyError, hierarchy
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.passes.verify import verify

    if args.output != "-":
        check_output_file(args.output, [args.cluster])   # before the work: never a device, FIFO, symlink or input
    topo = load_cluster(args.cluster)
    if args.root is not None and args.root >= topo.nranks:
        raise CompileError([Diagnostic(f"root rank {args.root} is out of range (the cluster has ranks "
                                       f"0..{topo.nranks - 1})", None)])
    try:
        hier = hierarchy(topo, by=args.group_by, nodes_per_cluster=args.nodes_per_cluster, border=args.border)
    except HierarchyError as exc:
        raise CompileError([Diagnostic(str(exc), None)]) from None
    if args.collective == "alltoall":
        if args.root is not None:
            raise CompileError([Diagnostic("--root applies to broadcast and reduce, not alltoall", None)])
        from hccc.compiler.cluster.c2c_alltoall import plan_c2c_alltoall
        plan = plan_c2c_alltoall(topo, hier=hier, chunks_per_rank=args.pipeline, name=args.name)
        verify(plan.algorithm())
        return _write(args, plan.rccl(), plan.summary(),
                      f"C2C AllToAll on {plan.nranks} ranks, {len(plan.hierarchy.clusters)} clusters, "
                      f"{len(plan.rows)} transfers, {plan.cross_cluster_chunks()} chunks across clusters "
                      f"(minimum {plan.summary()['min_cross_cluster_chunks']})")
    plan = plan_c2c(topo, args.collective, pipeline=args.pipeline, intra=args.intra, hier=hier,
                    root=args.root, name=args.name)
    verify(plan.algorithm())
    text = plan.rccl()
    to_stdout = args.output == "-"
    if to_stdout:
        sys.stdout.write(text)
    else:
        write_text_atomically(Path(args.output), text, [args.cluster])
    summary = plan.summary()
    if args.json:
        summary["output"] = None if to_stdout else str(args.output)
        print(json.dumps(summary, sort_keys=True), file=sys.stderr if to_stdout else sys.stdout)
        return 0
    clusters = "; ".join(f"{printable(str(c['name']))} border {','.join(map(str, c['border_ranks']))}"
                         for c in summary["clusters"])
    line = (f"hccc: {'wrote ' + printable(str(args.output)) if not to_stdout else 'generated'}: C2C "
            f"{plan.collective.dsl_name} on {plan.nranks} ranks, {plan.hierarchy.nclusters} clusters ({clusters}), "
            f"{plan.pieces} piece{'s' if plan.pieces != 1 else ''}, {plan.ntransfers} transfers, "
            f"{plan.nsteps} steps, {summary['inter_cluster_transfers']} cross-cluster chunks")
    print(line, file=sys.stderr if to_stdout else sys.stdout)
    return 0


def _write(args, text: str, summary: dict, line: str) -> int:
    """Write ``text`` where ``-o`` says and report (AllToAll's C2C program)."""
    from hccc.compiler.backend.output_dir import write_text_atomically
    to_stdout = args.output == "-"
    if to_stdout:
        sys.stdout.write(text)
    else:
        write_text_atomically(Path(args.output), text, [args.cluster])
    if args.json:
        summary["output"] = None if to_stdout else str(args.output)
        print(json.dumps(summary, sort_keys=True), file=sys.stderr if to_stdout else sys.stdout)
        return 0
    print(f"hccc: {'wrote ' + str(args.output) if not to_stdout else 'generated'}: {line}",
          file=sys.stderr if to_stdout else sys.stdout)
    return 0
