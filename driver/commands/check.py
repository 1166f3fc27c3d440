"""``hccc check ALGO [--topology T] [--json]``: verify an algorithm and print a summary.

ALGO is anything a reader of :mod:`hccc.compiler.pipeline.readers` takes: a ``.rccl`` program
(parsed, evaluated and proven against its collective's postcondition by
:func:`hccc.compiler.passes.verify.verify`), an MSCCL ``.xml`` (imported, which proves the
collective symbolically and checks the thread blocks for deadlocks) or a ProgramIR ``.json`` (its
structure, FIFO order and deadlock freedom checked and the collective proven symbolically, in place
and out of place, :func:`hccc.compiler.ir.symbolic.prove`). With
``--topology T`` the program must also fit the cluster (nRanks = its GPU count, every transfer on
a link). ``--json`` prints ``{"valid", "collective", "nranks", "transfers", "steps"[, "topology"]}``
(on failure ``{"valid": false, "errors": [{"message", "file", "line", "col"}]}``). For an AllToAll
the summary also says whether the program runs as an AllToAllv (per-pair counts,
docs/alltoallv.md): ``"alltoallv": {"ok": true}`` when it moves every block whole to places of its
own size, else ``{"ok": false, "why": ...}`` naming the primitive that places a block by its size
(:func:`hccc.compiler.ir.vblocks.vblock_map`); such a program stays a valid AllToAll.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from hccc.args import add_topology_option, positive_int
from hccc.util.limits import printable
from hccc.util.plural import plural

SUMMARY = "verify an algorithm and print a summary"
INPUTS = {"algo": "algorithm", "--topology": "cluster"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("algo", metavar="ALGO", help="algorithm: .rccl, an MSCCL .xml or a ProgramIR .json")
    add_topology_option(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-transfers", type=positive_int, default="10000000", metavar="N",
                   help="refuse programs with more transfers than this")


def run(args) -> int:
    from hccc.compiler.pipeline import CompileOptions, reader_for
    from hccc.compiler.passes.verify import verify

    reader = reader_for(args.algo)
    if reader.gives == "program":
        return _check_program(args, reader)
    alg = reader.read(Path(args.algo), CompileOptions(max_transfers=args.max_transfers))
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
    if alg.header.collective.value == "alltoall":
        from hccc.compiler.passes.build import build_program
        summary["alltoallv"] = _alltoallv(build_program(alg))
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {alg.header.collective.dsl_name} on {plural(alg.header.nranks, 'rank')} "
              f"({plural(alg.ntransfers, 'transfer')}, {plural(report.steps, 'step')})")
        _print_alltoallv(summary)
        if cluster is not None:
            use = summary["topology"]
            by = ", ".join(f"{k} {v}" for k, v in use["transfers_by_class"].items()) or "none"
            print(f"  fits cluster {cluster.name}: {plural(use['pairs'], 'linked rank pair')} used; "
                  f"transfers by link class: {by}")
    return 0


def _alltoallv(ir) -> dict:
    """Whether an AllToAll program runs with per-pair counts, in every placement it is proven for."""
    from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
    from hccc.compiler.ir.vblocks import VBlockError, vblock_map
    ir = ir if _is_canonical(ir) else _sorted_copy(ir)
    for inplace in ir.placements:
        try:
            vblock_map(ir, inplace)
        except VBlockError as exc:
            return {"ok": False, "why": f"{'in place' if inplace else 'out of place'}: {exc}"}
    return {"ok": True}


def _print_alltoallv(summary: dict) -> None:
    v = summary.get("alltoallv")
    if v is None:
        return
    print("  runs as AllToAllv (per-pair counts): " + ("yes, every block moves whole" if v["ok"]
                                                       else f"no: {printable(v['why'])}"))


def _prove(path: str, ir) -> None:
    """A ProgramIR's checks (FIFO order, deadlock freedom) and its collective proven in both modes;
    a failure is located at the file."""
    from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
    from hccc.compiler.ir.check import check_deadlock, check_fifo_order
    from hccc.compiler.ir.program_ir import IRFormatError
    from hccc.compiler.ir.program_ir_json import key_position
    from hccc.compiler.ir.symbolic import MAX_PROOF_SLOTS, ProofError, proof_slots, prove

    slots = proof_slots(ir)
    if slots > MAX_PROOF_SLOTS:              # the proof holds a value per slot: refused before any
        src = SourceFile.read(path)
        sizes = (ir.in_chunks, ir.out_chunks, ir.scratch_chunks)
        raise CompileError([Diagnostic(
            f"{ir.nranks} ranks x {sum(sizes)} chunks each (input {sizes[0]}, output {sizes[1]}, scratch "
            f"{sizes[2]}) = {slots:,} chunk slots, more than the {MAX_PROOF_SLOTS:,} hccc proves a program with",
            Location(src, *key_position(src.text, "buffers")))])
    algorithm_level = ir.algorithm_level     # an imported MSCCL XML / MSCCL++ plan, as its origin says
    inplace = False
    try:
        check_fifo_order(ir)
        if algorithm_level:                   # checked as the import checked it, as `hccc run` runs it
            from hccc.compiler.ir.symbolic import check_deadlock_buffered
            from hccc.compiler.interop.msccl_format import MESSAGES_IN_FLIGHT
            check_deadlock_buffered(ir, None if ir.origin.source == "mscclpp-plan"
                                    else MESSAGES_IN_FLIGHT.get(ir.origin.proto, 1))
        else:
            check_deadlock(ir)
        for inplace in ir.placements:         # both for hccc's own programs; an import's declared ones
            prove(ir, inplace)
    except (IRFormatError, ProofError) as exc:
        mode = "" if isinstance(exc, IRFormatError) else " (in place)" if inplace else " (out of place)"
        raise CompileError([Diagnostic(f"the program does not implement {ir.collective}{mode}: {exc}",
                                       Location(SourceFile.read(path), 1, 1))]) from None
    ir.origin = replace(ir.origin, execution="algorithm" if algorithm_level else "task")


def _check_program(args, reader) -> int:
    """``hccc check X.xml`` / ``X.json``: read (an MSCCL import proves the collective symbolically and
    checks the TB pairs for deadlocks; a ProgramIR is checked and proven here) and summarise."""
    from hccc.compiler.pipeline import CompileOptions

    ir = reader.read(Path(args.algo), CompileOptions(max_transfers=args.max_transfers))
    if not reader.proven:
        _prove(args.algo, ir)
    summary = {"valid": True, "collective": ir.collective, "nranks": int(ir.nranks),
               "transfers": int(ir.stats.get("transfers", 0)), "format": reader.name,
               "execution": ir.origin.execution, "tbs_per_rank_max": int(max(ir.ntbs, default=0))}
    if args.topology is not None:
        from hccc.compiler.pipeline import read_cluster
        from hccc.compiler.cluster.topology_check import check_ir_on_topology
        cluster = read_cluster(args.topology)
        check_ir_on_topology(ir, cluster.topology, cluster.name, args.algo)
        summary["topology"] = {"name": cluster.topology.name, "file": cluster.name, "sha256": cluster.sha256}
    if ir.collective == "alltoall":
        summary["alltoallv"] = _alltoallv(ir)
    if ir.origin.note:                       # where an import's proof stops (message sizes it covers)
        summary["note"] = ir.origin.note
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{printable(str(args.algo))}: valid {ir.collective} on {plural(ir.nranks, 'rank')} ({reader.label}, "
              f"{plural(summary['transfers'], 'transfer')}, "
              f"{plural(summary['tbs_per_rank_max'], 'thread block')} per rank at most, "
              f"{summary['execution']}-level execution)")
        if "note" in summary:
            print(f"  note: {printable(summary['note'], limit=1000)}")
        _print_alltoallv(summary)
    return 0
