"""What a synthesized program must fit to run on another engine (``hccc synth --for xml|mscclpp``).

The MSCCL executors run an exported XML, the MSCCL++ executor a plan; each has limits (steps per
thread block, thread blocks per rank, XML elements, channels: :mod:`hccc.compiler.interop.msccl_limits`,
:mod:`hccc.compiler.interop.mscclpp_limits`). A program synthesized for one of them is written the
way that engine expresses it without races (one channel: the engines give every channel its own
copy of the program, which the streams of a tree program do not split). The engine's limits are
constraints of the tree packing's candidates (:func:`transfers_check`, the up-front check of its
exporter on a candidate's transfers: chunks cut into fewer pieces, fewer chunks per rank, while it
refuses; the fastest candidate it accepts kept), and the program is kept only when the engine's own
exporter accepts it (:func:`export_refusal`): the very check ``hccc xml`` and ``hccc plan`` make,
with their default limits. Without ``--for``, the report names the engines
whose up-front checks certainly refuse the program written (:func:`certain_refusals`).
"""
from __future__ import annotations

import numpy as np

from hccc.util.diagnostics import CompileError, Diagnostic

#: the engines ``--for`` names, and what each is called in messages
ENGINES = {"xml": "the MSCCL executor (MSCCL XML)", "mscclpp": "the MSCCL++ executor (plan)"}


def for_engine(result) -> None:
    """``result`` (a :class:`~hccc.compiler.synth.collectives.SynthResult`) as every engine runs it:
    one channel (one block per thread block: the engines copy a program per channel), no loops
    over channels, and no per-stream channel column, unless the program was built for the engine
    (``detail["engine_fitted"]``: the tree packing's, whose connections the engine's check counted)."""
    result.detail["channels"] = 1
    result.detail["channels_fitted"] = None
    if result.rows.ndim == 2 and result.rows.shape[1] > 5 and not result.detail.get("engine_fitted"):
        result.rows = np.ascontiguousarray(result.rows[:, :5])
    result.loops = None


#: the most transfers of a program :func:`certain_refusals` checks against the MSCCL++ executor:
#: its check reads the program as the plan exporter lowers it (one thread block per connection
#: end, :func:`hccc.compiler.passes.build.build_algorithm_level`), which costs what a second
#: lowering does (:data:`PLAN_CHECK_SECONDS_PER_TRANSFER`); past this many (about 2 s on a loaded
#: 2-core machine) the report says it was not checked, and ``hccc plan`` checks it. A count of
#: the program, not a time, so that what the report says is the same on every machine
PLAN_CHECK_MAX_TRANSFERS = 20_000
#: seconds of that lowering per transfer, measured on a loaded 2-core machine: a 12-GPU V100
#: AllGather (4,224 transfers) 0.47 s, 111 us; a 512-GPU H20 AllGather (261,632) 23.7 s, 91 us;
#: rounded up. The closing phases' prediction counts it (``hccc synth --time-limit``)
PLAN_CHECK_SECONDS_PER_TRANSFER = 1.2e-4


def plan_check_seconds(ntransfers: int) -> float:
    """Predicted seconds of :func:`certain_refusals` on a program of ``ntransfers`` transfers."""
    m = max(0, int(ntransfers))
    return PLAN_CHECK_SECONDS_PER_TRANSFER * m if m <= PLAN_CHECK_MAX_TRANSFERS else 0.0


def transfers_check(engine: str, topo):
    """``check(rows) -> why | None``: ``engine``'s limits, with its exporter's defaults, weighed on a
    program's transfer rows (``src, dst, step, chunk, op[, channel]``) without building the
    program: the MSCCL executor's up-front check
    (:func:`hccc.compiler.interop.msccl_limits.check_transfers_fit`: steps, channels, thread
    blocks, XML elements) and the ids its dependencies may name
    (:func:`hccc.compiler.interop.msccl_limits.connection_refusal`), the MSCCL++ executor's thread blocks as its plan would have them
    (:func:`hccc.compiler.interop.mscclpp_limits.estimate_refusal`); why the engine refuses them
    (one line), or None. What ``--for`` gives the tree packing as the engine's limits
    (:func:`hccc.compiler.synth.forest.synthesize_trees`); the exporter decides on the program
    kept (:func:`export_refusal`)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})")
    n = int(topo.nranks)
    if engine == "xml":
        from hccc.compiler.interop.msccl_format import XmlLimits
        from hccc.compiler.interop.msccl_limits import check_transfers_fit as xml_fits, connection_refusal

        lim = XmlLimits()

        def fits(rows):
            channel = rows[:, 5] if rows.shape[1] > 5 else None
            xml_fits(rows[:, 0], rows[:, 1], n, lim, channel=channel)
            why = connection_refusal(rows[:, 0], rows[:, 1], channel, n, lim)
            if why is not None:
                raise CompileError([Diagnostic("the algorithm does not fit the MSCCL runtime: " + why, None)])
    else:
        from hccc.compiler.interop.mscclpp_export import node_map
        from hccc.compiler.interop.mscclpp_limits import estimate_refusal
        from hccc.compiler.interop.mscclpp_plan import PlanLimits

        lim, nodes = PlanLimits(), node_map(n, topology=topo)

        def fits(rows):
            why = estimate_refusal(rows[:, 0], rows[:, 1], lim, nodes=nodes,
                                   channel=rows[:, 5] if rows.shape[1] > 5 else None)
            if why is not None:
                raise CompileError([Diagnostic("the program does not fit the MSCCL++ executor: " + why, None)])

    def check(rows) -> str | None:
        try:
            fits(np.asarray(rows))
        except CompileError as exc:
            d = exc.diagnostics[0] if getattr(exc, "diagnostics", None) else None
            return (d.message if d is not None else str(exc)).splitlines()[0]
        return None
    return check


def certain_refusals(alg, topo) -> dict[str, str | None]:
    """``{engine: why}`` for each engine of :data:`ENGINES` whose exporter certainly refuses
    ``alg`` (a verified program on ``topo``) with its default limits: the up-front checks ``hccc
    xml`` and ``hccc plan`` make before building anything (:mod:`hccc.compiler.interop.msccl_limits`,
    :mod:`hccc.compiler.interop.mscclpp_limits`), which never refuse what the exporter accepts but
    may accept what it refuses (only the export itself is exact). Cheap: numpy over the transfers
    (the MSCCL++ plan's thread blocks first from the transfer table, :func:`plan_table_refusal`, at
    any size; where that does not refuse, the program lowered as the plan exporter lowers it, up to
    :data:`PLAN_CHECK_MAX_TRANSFERS` transfers only; ``"mscclpp"`` then maps to None: not checked)."""
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.interop.msccl_limits import check_algorithm_fits
    from hccc.compiler.interop.mscclpp_export import node_map
    from hccc.compiler.interop.mscclpp_limits import check_plan_fits
    from hccc.compiler.interop.mscclpp_plan import PlanLimits
    from hccc.compiler.passes.build import build_algorithm_level

    def first(exc: CompileError) -> str:
        d = exc.diagnostics[0] if getattr(exc, "diagnostics", None) else None
        return (d.message if d is not None else str(exc)).splitlines()[0]

    out: dict[str, str | None] = {}
    try:
        check_algorithm_fits(alg, XmlLimits())
    except CompileError as exc:
        out["xml"] = first(exc)
    nodes = node_map(alg.header.nranks, topology=topo)
    why = plan_table_refusal(alg, nodes)
    if why is not None:
        out["mscclpp"] = why
    elif len(alg.src) > PLAN_CHECK_MAX_TRANSFERS:
        out["mscclpp"] = None
    else:
        try:
            check_plan_fits(build_algorithm_level(alg), PlanLimits(), nodes=nodes)
        except CompileError as exc:
            out["mscclpp"] = first(exc)
    return out


def plan_table_refusal(alg, nodes) -> str | None:
    """Why the MSCCL++ plan of ``alg`` (rank -> node: ``nodes``) certainly has too many thread
    blocks, from its transfer table alone, before anything is built
    (:func:`hccc.compiler.interop.mscclpp_limits.check_transfers_fit`, with the exporter's default
    limits), or None."""
    from hccc.compiler.interop.mscclpp_limits import check_transfers_fit
    from hccc.compiler.interop.mscclpp_plan import PlanLimits
    try:
        check_transfers_fit(alg.src, alg.dst, PlanLimits(), nodes=nodes, channel=alg.channels)
    except CompileError as exc:
        d = exc.diagnostics[0] if getattr(exc, "diagnostics", None) else None
        return (d.message if d is not None else str(exc)).splitlines()[0]
    return None


def export_refusal(result, topo, engine: str) -> str | None:
    """Why ``engine``'s exporter refuses ``result``'s program (its first reason, one line), or None
    where it exports."""
    from hccc.compiler.passes.build import build_algorithm_level
    from hccc.compiler.passes.verify import verify
    from hccc.compiler.synth.emit import to_algorithm

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})")
    alg = to_algorithm(result, topo)
    if engine == "mscclpp":
        # the plan's thread blocks counted from the transfer table: nothing lowered to be refused
        from hccc.compiler.interop.mscclpp_export import node_map
        why = plan_table_refusal(alg, node_map(alg.header.nranks, topology=topo))
        if why is not None:
            return why
    verify(alg)
    try:
        if engine == "xml":
            from hccc.compiler.interop.msccl_export import export_algorithm
            export_algorithm(alg)
        else:
            from hccc.compiler.interop.mscclpp_export import export_plan, node_map
            export_plan(build_algorithm_level(alg), nodes=node_map(alg.header.nranks, topology=topo),
                        micro_batches=1)
    except CompileError as exc:
        first = exc.diagnostics[0] if getattr(exc, "diagnostics", None) else None
        return (first.message if first is not None else str(exc)).splitlines()[0]
    return None


__all__ = ["ENGINES", "PLAN_CHECK_MAX_TRANSFERS", "PLAN_CHECK_SECONDS_PER_TRANSFER", "certain_refusals", "export_refusal", "for_engine", "plan_check_seconds",
           "plan_table_refusal", "transfers_check"]
