"""The state of one compile (:class:`CompileContext`), the passes that change it (:class:`Pass`) and
the runner that times them and runs the large compile's second thread (:func:`run_passes`).

A pass is a function of the context. It reads the representations earlier passes left there (the
algorithm, the DAG, the schedule, the lowered program, the ProgramIR) and leaves its own; ``when`` says whether it applies
to this compile. The runner records every pass's seconds under its stage (``--timings``), so no
pass times itself. A pass with ``beside=STAGE`` runs on a second thread, beside the passes of
``STAGE``, when the program has :data:`BESIDE_FROM` transfers or more (numpy work on whole columns,
mostly without the GIL); it is joined when ``STAGE`` is over. Errors keep their order: when a pass
fails, the passes running beside are joined first and their error is the one reported; nothing is
committed into the output directory before every pass, beside ones included, has passed.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Union

from hccc.compiler.pipeline.options import CompileOptions, platforms_for

if TYPE_CHECKING:
    from hccc.compiler.frontend.algorithm import Algorithm
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.ir.program_ir import ProgramIR
    from hccc.compiler.passes.dag import DependencyDAG
    from hccc.compiler.passes.schedule import Schedule
    from hccc.compiler.pipeline.cluster import ClusterSource
    from hccc.compiler.pipeline.cost_model import CostModel

#: transfers from which a compile runs verification beside scheduling and lowering, and the IR
#: checks beside code generation, each on a second thread (numpy work on whole columns, which runs
#: mostly without the GIL). Errors keep their order: a verification error is the one reported even
#: when scheduling failed too, and a check error wins over what code generation made of the
#: program; nothing is written unless both passed.
BESIDE_FROM = 100_000


@dataclass
class StageTimes:
    """Seconds per stage (``seconds``), and per phase inside a stage (``phases``, ``stage/phase``).
    ``beside[stage]`` names the stage it ran beside, on a second thread (:data:`BESIDE_FROM`): its
    seconds overlap that stage's."""

    seconds: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    beside: dict[str, str] = field(default_factory=dict)

    def add(self, stage: str, seconds: float, phase: str | None = None) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        if phase is not None:
            key = f"{stage}/{phase}"
            self.phases[key] = self.phases.get(key, 0.0) + seconds

    def run(self, name, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds added to stage ``name`` (for work outside the pass
        list, e.g. reading the cluster)."""
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:   # a stage that refuses (e.g. the XML export past a limit) took time too
            self.add(name, time.perf_counter() - t0)


#: a value of the manifest (what a pass adds to it is written as JSON)
JsonValue = Union[str, int, float, bool, None, list["JsonValue"], dict[str, "JsonValue"]]


@dataclass
class CompileContext:
    """One compile: what it was given, the representation each stage made, and how long each took.

    Given: ``options``, the input (``algorithm``, an Algorithm the stages verify, schedule and
    lower; or ``given``, a ProgramIR taken as it is), ``cluster``, ``cost_model`` (chooses
    allocation, fusion and order on the cluster), ``xml_limits``, ``outdir``, ``inputs``.

    Made by the stages, each from the one before (:data:`~hccc.compiler.pipeline.compile.STAGES`):
    ``dag`` (from the algorithm), ``schedule`` (from the DAG), ``lowered`` (the program the
    schedule lowers to, thread blocks allocated), ``ir`` (the program the output is made from:
    the lowered one or the one given, the cost model's choices and the channel count applied).
    Made by the emitters: ``exports`` (file name -> text), ``manifest`` (entries they add),
    ``files`` (written, sorted), ``notes`` (warnings for the user).

    Nothing here is a flag a pass sets for a later one: what a pass decides from is the options
    and the representations (e.g. whether the IR checks run beside code generation,
    :func:`~hccc.compiler.pipeline.compile.checks_beside`)."""

    options: CompileOptions = field(default_factory=CompileOptions)
    algorithm: "Algorithm | None" = None
    given: "ProgramIR | None" = None
    cluster: "ClusterSource | None" = None
    cost_model: "CostModel | None" = None
    xml_limits: "XmlLimits | None" = None
    outdir: Path | None = None
    inputs: list[Path] = field(default_factory=list)     #: the files read (never replaced or removed)
    times: StageTimes = field(default_factory=StageTimes)
    dag: "DependencyDAG | None" = None
    schedule: "Schedule | None" = None
    lowered: "ProgramIR | None" = None
    ir: "ProgramIR | None" = None
    exports: dict[str, str] = field(default_factory=dict)
    manifest: dict[str, JsonValue] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    output: ExitStack = field(default_factory=ExitStack)   #: the open output directory
    staging: Path | None = None                              #: where the emitters write, until committed

    @property
    def large(self) -> bool:
        """Whether this compile runs passes beside others (:data:`BESIDE_FROM`)."""
        return self.algorithm is not None and self.algorithm.ntransfers >= BESIDE_FROM

    @property
    def declared_channels(self) -> int:
        """The channel count the input declares: the ``.rccl`` header's nChannels where it is
        written (1 included), else 0 (none: ``auto`` follows the hardware rule; a ProgramIR's own
        count is in the program)."""
        h = self.algorithm.header if self.algorithm is not None else None
        return int(h.nchannels) if h is not None and h.nchannels_given else 0

    @property
    def header_location(self):
        """Where the input's ``.rccl`` header is (None for other inputs)."""
        return self.algorithm.header.location if self.algorithm is not None else None

    @property
    def nranks(self) -> int:
        """The input's rank count."""
        return int(self.algorithm.header.nranks if self.algorithm is not None else self.given.nranks)

    @cached_property
    def platforms(self) -> list[tuple[str, ...]]:
        """Each rank's platforms (:func:`~hccc.compiler.pipeline.options.platforms_for`), once the
        input fits the cluster."""
        topo = self.cluster.topology if self.cluster is not None else None
        return platforms_for(self.nranks, self.options.target, topo)


@dataclass(frozen=True)
class Pass:
    """One step of the compile: ``run(ctx)`` where ``when(ctx)``. ``stage``: the ``--timings``
    line it counts under (default its name; a pass of a stage shows as ``stage/name``, unless it
    reports phases of its own by returning ``{phase: seconds}``). ``beside``: the stage it may run
    beside, on a second thread, in a large compile."""

    name: str
    run: Callable[[CompileContext], "dict[str, float] | None"]
    when: Callable[[CompileContext], bool] = lambda ctx: True
    stage: str | None = None
    beside: str | None = None

    @property
    def group(self) -> str:
        return self.stage or self.name


def _timed(ctx: CompileContext, p: Pass) -> None:
    t0 = time.perf_counter()
    phases = None
    try:
        phases = p.run(ctx)
    finally:
        dt = time.perf_counter() - t0
        if isinstance(phases, dict) and phases:       # the pass's own phases
            ctx.times.add(p.group, dt)
            for k, v in phases.items():
                key = f"{p.group}/{k}"
                ctx.times.phases[key] = ctx.times.phases.get(key, 0.0) + v
        else:
            ctx.times.add(p.group, dt, p.name if p.stage is not None else None)


def run_passes(ctx: CompileContext, passes) -> CompileContext:
    """Run ``passes`` over ``ctx`` in order (see the module's docstring)."""
    beside_pool = None
    running: list[list] = []            # [future, stage it runs beside, that stage seen]

    def join(entries) -> None:
        for e in entries:
            running.remove(e)
        for e in entries:
            e[0].result()               # the first error, in the order they started

    try:
        for p in passes:
            if not p.when(ctx):
                continue
            for e in [e for e in running if e[2] and e[1] != p.group]:
                join([e])
            if p.beside is not None and ctx.large:
                if beside_pool is None:
                    from concurrent.futures import ThreadPoolExecutor
                    beside_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hccc-beside")
                ctx.times.beside[p.group] = p.beside
                ctx.times.seconds.setdefault(p.group, 0.0)      # (printed in pass order)
                running.append([beside_pool.submit(_timed, ctx, p), p.beside, False])
                continue
            try:
                _timed(ctx, p)
            except BaseException:
                join(list(running))     # an error of a pass beside wins: it began first
                raise
            for e in running:
                if e[1] == p.group:
                    e[2] = True
        join(list(running))
    except BaseException as exc:
        ctx.output.__exit__(type(exc), exc, exc.__traceback__)   # nothing half-written
        raise
    finally:
        if beside_pool is not None:
            beside_pool.shutdown(wait=True)
    ctx.output.close()
    return ctx
