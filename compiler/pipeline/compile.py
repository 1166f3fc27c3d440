"""The compile as one list of passes over a :class:`~hccc.compiler.pipeline.context.CompileContext`
(:func:`compile_passes`), and its entries: :func:`compile` (any input into an OUTDIR),
:func:`build` (the program only, nothing written), :func:`compile_algorithm` and
:func:`compile_program`.

The stages (:data:`STAGES`), each a function from one representation to the next, its result
a typed field of the context::

    algorithm (Algorithm, verified)  -> dag (DependencyDAG)  -> schedule (Schedule)
      -> lowered (ProgramIR: lowered, thread blocks allocated, checked)
      -> program-ir (ProgramIR: the cost model's choices and the channel count applied)

An algorithm (``.rccl``) goes through every pass; a ProgramIR given as such (an MSCCL ``.xml``, a
ProgramIR ``.json``) skips those that make one (verify ... lower) and is emitted as given.
:func:`run_until` stops after a stage (``hccc ALGO --dump-after STAGE``,
:mod:`hccc.compiler.pipeline.dumps`).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from hccc.compiler.pipeline.context import CompileContext, Pass, StageTimes, run_passes
from hccc.compiler.pipeline.options import CompileOptions, resolve_channel_count


def _has_algorithm(ctx: CompileContext) -> bool:
    return ctx.algorithm is not None


# ---------------------------------------------------------------------------------- the passes
def verify_algorithm(ctx: CompileContext) -> None:
    """Prove the algorithm implements its collective (:func:`hccc.compiler.passes.verify.verify`)."""
    from hccc.compiler.passes.verify import verify
    verify(ctx.algorithm)


def fit_cluster(ctx: CompileContext) -> None:
    """The input must fit the cluster (rank count, a link under every transfer); the manifest
    records the cluster."""
    from hccc.compiler.cluster import topology_check
    c = ctx.cluster
    if ctx.algorithm is not None:
        topology_check.check_on_topology(ctx.algorithm, c.topology, c.name)
    else:
        topology_check.check_ir_on_topology(ctx.given, c.topology, c.name, ctx.inputs[0] if ctx.inputs else None)
    ctx.manifest["topology"] = c.manifest_entry()


def build_dag(ctx: CompileContext) -> None:
    from hccc.compiler.passes.dag import build_dag as dag_of
    ctx.dag = dag_of(ctx.algorithm)


def schedule(ctx: CompileContext) -> None:
    from hccc.compiler.passes import build
    ctx.schedule = build.schedule_algorithm(ctx.algorithm, ctx.dag, ctx.options.scheduler)


def lowered(ctx: CompileContext, *, tb_alloc: str, fuse: bool, check: bool = True, timings=None,
            phase_order: bool = True):
    """The scheduled algorithm lowered and its thread blocks allocated (the IR checks, with
    fusion's back-off, unless ``check=False``): a program the compile keeps or compares.
    ``phase_order=False``: TBs in the schedule's key order (the order choice's alternative)."""
    from hccc.compiler.passes import build
    ir = build.build_from_schedule(ctx.algorithm, ctx.dag, ctx.schedule, tb_alloc=tb_alloc,
                                   chunk_bytes=ctx.options.chunk_bytes, fuse=fuse, check=check, timings=timings,
                                   phase_order=phase_order)
    ir.stats["scheduler"] = build.scheduler_name(ctx.options.scheduler)
    return ir


def checks_beside(ctx: CompileContext) -> bool:
    """Whether the IR checks of the lowering run beside code generation (the ``checks`` pass): in
    a large compile, unless fusion's back-off needs them in the lowering or a cost model
    simulates the program."""
    return ctx.large and not ctx.options.fused and ctx.cost_model is None


def lower(ctx: CompileContext) -> dict:
    """Lower, allocate thread blocks, run the IR checks (or leave them to the ``checks`` pass,
    :func:`checks_beside`): the ``lowered`` program, which the choices and channels start from."""
    phases: dict[str, float] = {}
    ctx.lowered = lowered(ctx, tb_alloc=ctx.options.tb_alloc, fuse=ctx.options.fused, check=not checks_beside(ctx),
                          timings=phases)
    ctx.ir = ctx.lowered
    return phases


def check_ir(ctx: CompileContext) -> None:
    """The IR checks of an unfused lowering (structure, FIFO order, deadlock freedom)."""
    from hccc.compiler.passes import build
    build.check_program(ctx.lowered)


def _choosing(ctx: CompileContext) -> bool:
    return ctx.cost_model is not None and ctx.algorithm is not None and ctx.options.tb_alloc == "state"


def compared_channels(ctx: CompileContext) -> int:
    """The channel count the cost model compares programs at: the one the lowered program gets."""
    return resolve_channel_count(ctx.lowered, ctx.options, ctx.platforms, ctx.declared_channels,
                                 declared_at=ctx.header_location)


def choose_allocation(ctx: CompileContext) -> None:
    """State-based thread blocks only where sharing them costs no time on the cluster
    (:func:`~hccc.compiler.pipeline.cost_model.faster_allocation`), compared at the channel count
    the program gets."""
    from hccc.compiler.passes.channels import with_channels
    from hccc.compiler.pipeline.cost_model import faster_allocation
    fused = ctx.options.fused
    ctx.ir = faster_allocation(ctx.cost_model, with_channels(ctx.ir, compared_channels(ctx)),
                               partial(lowered, ctx, tb_alloc="connection", fuse=fused))


def choose_fusion(ctx: CompileContext) -> None:
    """Fusion (``fuse="auto"``) where the cost model finds it never slower
    (:func:`~hccc.compiler.pipeline.cost_model.faster_fusion`); the fused program with its own
    allocation choice."""
    from hccc.compiler.passes.channels import with_channels
    from hccc.compiler.pipeline.cost_model import faster_allocation, faster_fusion
    fused = with_channels(lowered(ctx, tb_alloc="state", fuse=True), compared_channels(ctx))
    fused = faster_allocation(ctx.cost_model, fused, partial(lowered, ctx, tb_alloc="connection", fuse=True))
    ctx.ir = faster_fusion(ctx.cost_model, ctx.ir, fused)


def _choosing_order(ctx: CompileContext) -> bool:
    return ctx.cost_model is not None and ctx.algorithm is not None and bool(ctx.ir.allocation.phase_order_moved)


def choose_order(ctx: CompileContext) -> None:
    """TBs in step order only where that costs no time on the cluster
    (:func:`~hccc.compiler.pipeline.cost_model.faster_order`), against the schedule's key order
    with the same allocation, fusion and channels."""
    from hccc.compiler.pipeline.cost_model import faster_order
    al = ctx.ir.allocation
    mode = "connection" if al.tb_alloc_kept == "connection" else ctx.options.tb_alloc
    ctx.ir = faster_order(ctx.cost_model, ctx.ir,
                          partial(lowered, ctx, tb_alloc=mode, fuse=bool(al.fusion), phase_order=False))


def channels(ctx: CompileContext) -> None:
    """Blocks per thread block: ``--channels``, or auto (the algorithm's declared count, else the
    hardware rule of :mod:`hccc.compiler.passes.channels`)."""
    from hccc.compiler.passes.channels import with_channels
    ctx.ir = with_channels(ctx.ir, resolve_channel_count(ctx.ir, ctx.options, ctx.platforms,
                                                         ctx.declared_channels, declared_at=ctx.header_location))


def codegen(ctx: CompileContext) -> dict:
    """The kernel emitter ``options.codegen`` into a fresh directory beside OUTDIR, then the
    exports' files; the directory replaces OUTDIR once every pass passed (:func:`run_passes`)."""
    from hccc.compiler.backend.output_dir import atomic_output_dir
    from hccc.compiler.pipeline.emitters import kernel_emitter
    emitter = kernel_emitter(ctx.options.codegen)
    ctx.staging = Path(ctx.output.enter_context(atomic_output_dir(ctx.outdir, _inputs(ctx))))
    files, phases = emitter.make(ctx, ctx.staging)
    for name, text in ctx.exports.items():
        path = ctx.staging / name
        path.write_text(text, encoding="utf-8")
        files = [*files, path]
    ctx.files = sorted(files)
    return phases


def program_passes() -> list[Pass]:
    """The passes that make the program: everything before channels and output."""
    return [
        Pass("verify", verify_algorithm, when=_has_algorithm, beside="schedule+lower"),
        Pass("topology", fit_cluster, when=lambda ctx: ctx.cluster is not None),
        Pass("dag", build_dag, when=_has_algorithm, stage="schedule+lower"),
        Pass("schedule", schedule, when=_has_algorithm, stage="schedule+lower"),
        Pass("lower", lower, when=_has_algorithm, stage="schedule+lower"),
        Pass("checks", check_ir, when=lambda ctx: _has_algorithm(ctx) and checks_beside(ctx), beside="codegen"),
        Pass("allocation", choose_allocation, when=_choosing, stage="tb_alloc choice"),
        Pass("fusion", choose_fusion, when=lambda ctx: _choosing(ctx) and ctx.options.fuse == "auto",
             stage="tb_alloc choice"),
        Pass("order", choose_order, when=_choosing_order, stage="tb_alloc choice"),
    ]


def compile_passes() -> list[Pass]:
    """The whole compile, in order: the program's passes, channels, every export emitter, then
    the kernel emitter (:mod:`hccc.compiler.pipeline.emitters`)."""
    from hccc.compiler.pipeline.emitters import exports, run_export
    return [
        *program_passes(),
        Pass("channels", channels),
        *[Pass(e.name, partial(run_export, emitter=e), when=e.when) for e in exports()],
        Pass("codegen", codegen),
    ]


#: the stages, in order, each with the pass that completes its representation (what ``--dump-after``
#: names): the lowered program is complete once its IR checks ran (in a large compile they would
#: otherwise run beside code generation); a given program has the last stage only.
STAGES: dict[str, str] = {"algorithm": "topology", "dag": "dag", "schedule": "schedule", "lowered": "checks",
                          "program-ir": "channels"}


def run_until(ctx: CompileContext, stage: str) -> CompileContext:
    """Run the compile's passes through ``stage`` (:data:`STAGES`), nothing written: ``ctx`` then
    holds that stage's representation (:func:`hccc.compiler.pipeline.dumps.dump`). A given
    program (no algorithm) has no stage before ``program-ir``: a :class:`CompileError`."""
    from hccc.util.diagnostics import CompileError, Diagnostic
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})")
    if ctx.algorithm is None and stage != "program-ir":
        what = f"'{ctx.inputs[0].name}'" if ctx.inputs else "the input"
        raise CompileError([Diagnostic(f"{what} is a program, not an algorithm: it has no '{stage}' stage "
                                       "(only 'program-ir' can be dumped)", None)])
    passes = compile_passes()
    last = next(i for i, p in enumerate(passes) if p.name == STAGES[stage])
    return run_passes(ctx, passes[:last + 1])


# ---------------------------------------------------------------------------------- entries
def context_for(source, opts: CompileOptions | None = None, *, cluster=None, cost_model=None,
                xml_limits=None, times: StageTimes | None = None) -> CompileContext:
    """A context for ``source``: a path (read by its reader, :mod:`hccc.compiler.pipeline.readers`;
    the ``parse`` stage), an Algorithm or a ProgramIR."""
    ctx = CompileContext(options=opts or CompileOptions(), cluster=cluster, cost_model=cost_model,
                         xml_limits=xml_limits, times=times or StageTimes())
    if isinstance(source, (str, Path)):
        from hccc.compiler.pipeline.readers import read_input
        ctx.inputs.append(Path(source))
        source = ctx.times.run("parse", read_input, source, ctx.options)
    if hasattr(source, "prims"):
        ctx.given = ctx.ir = source
    else:
        ctx.algorithm = source
    return ctx


def compile(ctx: CompileContext, outdir: str | Path) -> CompileContext:   # noqa: A001
    """Run :func:`compile_passes` over ``ctx`` into ``outdir`` (replaced atomically: a failed
    compile leaves it untouched). ``ctx.ir``, ``ctx.files`` and ``ctx.notes`` (warnings for the
    user, e.g. an export refused past a runtime limit: the kernels are still written) hold the
    outcome."""
    from hccc.compiler.backend.output_dir import check_output_dir
    check_output_dir(outdir, _inputs(ctx))      # before any pass: never replace or remove an input
    ctx.outdir = Path(outdir)
    return run_passes(ctx, compile_passes())


def _inputs(ctx: CompileContext) -> list[Path]:
    """The files the compile read: the algorithm's path and the cluster's."""
    return [*ctx.inputs, *([ctx.cluster.path] if ctx.cluster is not None else [])]


def build(ctx: CompileContext):
    """The program of ``ctx`` (:func:`program_passes`; nothing written)."""
    run_passes(ctx, program_passes())
    return ctx.ir


def compile_algorithm(alg, outdir: str | Path, opts: CompileOptions, times: StageTimes | None = None,
                      cluster=None, xml_limits=None, cost_model=None):
    """Verify, schedule, lower and emit ``alg`` into ``outdir`` atomically. Returns (ir, files, notes).

    With a ``cluster``, the algorithm must also fit it (:func:`~hccc.compiler.cluster.topology_check.
    check_on_topology`: rank count, a link under every transfer), ranks take their platform from their
    node's vendor (unless ``opts.target`` forces one) and the manifest records the cluster. With a
    ``cost_model`` (``hccc.compile`` gives the simulator's for a cluster) the allocation and fusion
    are chosen by it."""
    ctx = compile(context_for(alg, opts, cluster=cluster, cost_model=cost_model, xml_limits=xml_limits,
                              times=times), outdir)
    return ctx.ir, ctx.files, ctx.notes


def compile_program(ir, outdir: str | Path, opts: CompileOptions, times: StageTimes | None = None,
                    cluster=None, xml_limits=None):
    """Emit a ProgramIR into ``outdir`` atomically: kernels, manifest, IR JSON, build files and the
    exports (the MSCCL XML ``<name>.xml``). Returns (ir, files, notes). With a ``cluster``, every
    connection of the IR must be a link of it."""
    ctx = compile(context_for(ir, opts, cluster=cluster, xml_limits=xml_limits, times=times), outdir)
    return ctx.ir, ctx.files, ctx.notes


__all__ = ["STAGES", "compile_passes", "program_passes", "context_for", "compile", "build", "compile_algorithm",
           "compile_program", "lowered", "run_until"]
