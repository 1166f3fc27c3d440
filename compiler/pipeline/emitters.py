"""What a compile writes into OUTDIR, as registered emitters.

Two kinds:

- a **kernel emitter** (``kind="kernels"``) writes the kernels, the manifest, the ProgramIR and
  the build files; ``CompileOptions.codegen`` names the one a compile runs (``specialized``: a
  kernel per rank; ``table``: generic kernels and binary tables).
- an **export** (``kind="export"``) makes further files from the compiled context (the MSCCL
  XML): ``make(ctx)`` returns ``{file name: text}`` before the kernels are written, and each file
  is named in the manifest under the export's ``manifest_key``. An export that refuses (a
  :class:`~hccc.util.diagnostics.CompileError`, e.g. past a runtime limit) writes
  nothing, records ``null`` under its key and leaves a warning; the kernels are still written.
  Every export whose ``when(ctx)`` holds runs, in registration order, as a pass of its own
  (its ``--timings`` line is its name).

Each emitter also says which files it will write before anything is compiled (``planned``, what
``hccc ALGO --list-outputs`` prints): ``planned(name, platforms, which)`` gives the file names for
a program ``name`` whose rank ``r`` gets the sources ``platforms[r]``, ``which`` being ``all`` or a
platform (``cuda``, ``hip``: the translation units of that platform's library only). An export
whose files only the compile can tell (the MSCCL XML, written only when the program fits the
runtimes' limits; the MSCCL++ plan, written only for a program the plan format can express) has
no ``planned`` and is not listed.

Adding an export is a registration::

    register_emitter(Emitter("my_plan", "export", make_my_plan, manifest_key="my_plan",
                             refusal="my plan not written (the kernels are)"))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hccc.util.diagnostics import CompileError


@dataclass(frozen=True)
class Emitter:
    name: str                    #: kernels: the ``codegen`` mode; export: its ``--timings`` line
    kind: str                    #: "kernels" or "export"
    make: Callable               #: kernels: ``make(ctx, outdir) -> (files, phases)``; export: ``make(ctx) -> {name: text}``
    manifest_key: str | None = None   #: export: the manifest field naming its file (null when refused)
    refusal: str = ""            #: export: the warning's start when it refuses
    when: Callable = lambda ctx: True   #: export: whether it runs for this compile
    planned: Callable | None = None     #: ``planned(name, platforms, which) -> [file name]``; None: not known before compiling

    def __post_init__(self):
        if self.kind not in ("kernels", "export"):
            raise ValueError(f"an emitter's kind is 'kernels' or 'export', not {self.kind!r}")
        if self.kind == "export" and not self.manifest_key:
            raise ValueError("an export names its manifest field (manifest_key)")
        if self.kind == "kernels" and self.planned is None:
            raise ValueError("a kernel emitter says which files it writes (planned)")


_EMITTERS: dict[str, Emitter] = {}


def register_emitter(emitter: Emitter) -> Emitter:
    """Add ``emitter`` (replacing one of the same name)."""
    _EMITTERS[emitter.name] = emitter
    return emitter


def kernel_emitter(codegen: str) -> Emitter:
    e = _EMITTERS.get(codegen)
    if e is None or e.kind != "kernels":
        modes = ", ".join(n for n, x in _EMITTERS.items() if x.kind == "kernels")
        raise ValueError(f"unknown code generation {codegen!r} (expected one of {modes})")
    return e


def exports() -> list[Emitter]:
    """The export emitters, in registration order."""
    return [e for e in _EMITTERS.values() if e.kind == "export"]


def planned_files(codegen: str, name: str, platforms: list, which: str = "all") -> list[str]:
    """The files a compile with the kernel emitter ``codegen`` writes, as the emitters declare
    them: the kernel emitter's, and (``which="all"``) every export's that knows them in advance."""
    files = list(kernel_emitter(codegen).planned(name, platforms, which))
    if which == "all":
        for e in exports():
            if e.planned is not None:
                files += e.planned(name, platforms, which)
    return sorted(set(files))


def run_export(ctx, emitter: Emitter) -> None:
    """One export's pass: its files into ``ctx.exports``, its manifest entry into ``ctx.manifest``."""
    try:
        files = emitter.make(ctx)
    except CompileError as exc:
        ctx.manifest[emitter.manifest_key] = None
        ctx.notes.append(f"{emitter.refusal}: " + "; ".join(d.message for d in exc.diagnostics[:3])
                         + (" ..." if len(exc.diagnostics) > 3 else ""))
        return
    ctx.exports.update(files)
    names = list(files)
    ctx.manifest[emitter.manifest_key] = names[0] if len(names) == 1 else names


# ------------------------------------------------------------------------------ kernel emitters
def _kernels(generate):
    def make(ctx, outdir):
        phases: dict[str, float] = {}
        # a program the compile lowered had its structure checked there (or beside, by the
        # checks pass, before anything is committed); a given one is checked here
        files = generate(ctx.ir, outdir, platforms=ctx.platforms, manifest_extra=ctx.manifest or None,
                         extra_files=tuple(ctx.exports), timings=phases, direct=ctx.options.direct,
                         structure_checked=ctx.lowered is not None)
        return files, {k.removeprefix("codegen_"): v for k, v in phases.items()}
    return make


def _specialized(ctx, outdir):
    from hccc.compiler.backend.codegen import generate
    return _kernels(generate)(ctx, outdir)


def _table(ctx, outdir):
    from hccc.compiler.backend.table_codegen import generate_table
    return _kernels(generate_table)(ctx, outdir)


def _planned(codegen: str):
    def planned(name: str, platforms: list, which: str) -> list[str]:
        from hccc.compiler.backend.outputs import planned_outputs, planned_sources
        if which == "all":
            return planned_outputs(name, platforms, codegen)
        return planned_sources(name, platforms, codegen, which)
    return planned


register_emitter(Emitter("specialized", "kernels", _specialized, planned=_planned("specialized")))
register_emitter(Emitter("table", "kernels", _table, planned=_planned("table")))


# ------------------------------------------------------------------------------ exports
def _msccl_xml(ctx) -> dict[str, str]:
    """The MSCCL XML: an algorithm in its step order (``xml_order="step"``, the program MSCCL's
    algorithm-level execution runs best, built from the compile's DAG), else the compiled
    program (or the ProgramIR given)."""
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.pipeline.options import xml_instances
    opts = ctx.options
    limits = ctx.xml_limits or XmlLimits()
    instances = xml_instances(opts, ctx.declared_channels if ctx.algorithm is not None
                              else ctx.given.nchannels)
    if ctx.algorithm is not None and opts.xml_order == "step":
        from hccc.compiler.interop.msccl_export import export_algorithm
        _, text = export_algorithm(ctx.algorithm, limits, fuse=opts.xml_fuse, instances=instances,
                                   chunk_bytes=opts.chunk_bytes, name=ctx.ir.name, dag=ctx.dag)
    else:
        from hccc.compiler.interop.msccl_export import export_xml
        text = export_xml(ctx.ir, limits, fuse=opts.xml_fuse, instances=instances)
    return {f"{ctx.ir.name}.xml": text}


register_emitter(Emitter("msccl_xml", "export", _msccl_xml, manifest_key="msccl_xml",
                         refusal="MSCCL XML not written (the kernels are)"))


def _mscclpp_plan(ctx) -> dict[str, str]:
    """The MSCCL++ execution plan of the compiled program (out of place, Simple); connections
    between the cluster's nodes (else the algorithm's GPUPerNode) are port channels."""
    from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
    topo = ctx.cluster.topology if ctx.cluster is not None else None
    gpn = ctx.algorithm.header.gpu_per_node if ctx.algorithm is not None else 0
    plan = export_plan(ctx.ir, nodes=node_map(ctx.ir.nranks, gpn, topo))
    return {f"{ctx.ir.name}.mscclpp.json": plan_text(plan)}


register_emitter(Emitter("mscclpp_plan", "export", _mscclpp_plan, manifest_key="mscclpp_plan",
                         refusal="MSCCL++ plan not written (the kernels are)"))


__all__ = ["Emitter", "register_emitter", "kernel_emitter", "exports", "planned_files", "run_export"]
