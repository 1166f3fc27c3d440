"""``hccc check ALGO [--topology T] [--json]``: verify an algorithm and print a summary.

ALGO is a ``.rccl`` program (parsed, evaluated and proven against its collective's
postcondition by :func:`hccc.compiler.passes.verify.verify`) or an MSCCL ``.xml`` (imported, which
proves the collective symbolically and checks the thread blocks for deadlocks). With
``--topology T`` the program must also fit the cluster (nRanks = its GPU count, every transfer on
a link). ``--json`` prints ``{"valid", "collective", "nranks", "transfers", "steps"[, "topology"]}``
(on failure ``{"valid": false, "errors": [{"message", "file", "line", "col"}]}``).
"""
from __future__ import annotations

import argparse
import json
import os

from hccc.args import add_topology_option, positive_int
from hccc.compiler.frontend.limits import printable
from hccc.compiler.frontend.plural import plural

SUMMARY = "verify an algorithm and print a summary"
INPUTS = {"algo": "algorithm", "--topology": "cluster"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", metavar="ALGO", help="algorithm: .rccl or an MSCCL .xml")
    add_topology_option(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-transfers", type=positive_int, default="10000000", metavar="N",
                   help="refuse programs with more transfers than this")


def run(args) -> int:
    from hccc.compiler.pipeline import XML_SUFFIXES, load_algorithm
    from hccc.compiler.passes.verify import verify

    if os.path.splitext(args.algo)[1].lower() in XML_SUFFIXES:
        return _check_xml(args)
    alg = load_algorithm(args.algo, max_transfers=args.max_transfers)
    cluster = None
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        cluster = read_cluster(args.topology)
    report = verify(alg)
    summary = {"valid": True, "collective": alg.header.collective.value, "nranks": alg.header.nranks,
               "transfers": alg.ntransfers, "steps": report.steps}
    if cluster is not None:
        from hccc.compiler.cluster.topology_check import check_on_topology, link_usage
        check_on_topology(alg, cluster.topology, cluster.name)
        usage = link_usage(alg, cluster.topology)
        summary["topology"] = {"name": cluster.topology.name, "file": cluster.name, "sha256": cluster.sha256,
                               "pairs": usage["pairs"], "transfers_by_class": usage["transfers_by_class"]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {alg.header.collective.dsl_name} on {plural(alg.header.nranks, 'rank')} "
              f"({plural(alg.ntransfers, 'transfer')}, {plural(report.steps, 'step')})")
        if cluster is not None:
            use = summary["topology"]
            by = ", ".join(f"{k} {v}" for k, v in use["transfers_by_class"].items()) or "none"
            print(f"  fits cluster {cluster.name}: {plural(use['pairs'], 'linked rank pair')} used; "
                  f"transfers by link class: {by}")
    return 0


def _check_xml(args) -> int:
    """``hccc check X.xml``: import (which proves the collective symbolically and checks the TB
    pairs for deadlocks) and summarise."""
    from hccc.compiler.pipeline import load_program

    ir = load_program(args.algo)
    summary = {"valid": True, "collective": ir.collective, "nranks": int(ir.nranks),
               "transfers": int(ir.stats.get("transfers", 0)), "format": "msccl-xml",
               "execution": ir.stats.get("execution"), "tbs_per_rank_max": int(max(ir.ntbs, default=0))}
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        from hccc.compiler.cluster.topology_check import check_ir_on_topology
        cluster = read_cluster(args.topology)
        check_ir_on_topology(ir, cluster.topology, cluster.name)
        summary["topology"] = {"name": cluster.topology.name, "file": cluster.name, "sha256": cluster.sha256}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {ir.collective} on {plural(ir.nranks, 'rank')} (MSCCL XML, "
              f"{plural(summary['transfers'], 'transfer')}, "
              f"{plural(summary['tbs_per_rank_max'], 'thread block')} per rank at most, "
              f"{summary['execution']}-level execution)")
    return 0
