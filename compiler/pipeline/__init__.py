"""The whole compile: any input read by its reader, passes over one context, emitters into OUTDIR.

- :mod:`.readers`: the input formats (``.rccl``, MSCCL ``.xml``, MSCCL++ plan and ProgramIR
  ``.json``), registered once; every command finds its reader there.
- :mod:`.context`: :class:`CompileContext` (what one compile was given and the typed
  representation each stage made), :class:`Pass` and the runner that times the passes and runs a
  large compile's second thread.
- :mod:`.compile`: THE list of passes (:func:`compile_passes`), the stages (:data:`STAGES`,
  :func:`run_until`) and the entries.
- :mod:`.dumps`: a stage's representation as text (``hccc ALGO --dump-after STAGE``).
- :mod:`.cost_model`: the cost-model choices (thread-block allocation, fusion) as passes.
- :mod:`.emitters`: what is written (specialised or table kernels, the MSCCL XML, the MSCCL++
  plan), registered.
- :mod:`.options`, :mod:`.cluster`, :mod:`.manifest`: what a compile is asked for, the cluster it
  reads, compiled output read back.

The command line is a thin layer over these functions; tests and build systems can call them too
(``hccc.compile`` is the entry the command line uses, with the simulator as cost model).
"""
from __future__ import annotations

from pathlib import Path

from hccc.compiler.pipeline.cluster import ClusterSource, load_cluster, read_cluster
from hccc.compiler.pipeline.compile import (STAGES, build, compile_algorithm, compile_passes, compile_program,
                                            context_for, program_passes, run_until)
from hccc.compiler.pipeline.context import BESIDE_FROM, CompileContext, Pass, StageTimes, run_passes
from hccc.compiler.pipeline.manifest import load_manifest, manifest_codegen, manifest_path
from hccc.compiler.pipeline.options import (TARGETS, VENDOR_PLATFORM, CompileOptions, apply_channels,
                                            platforms_for, xml_instances)
from hccc.compiler.pipeline.readers import Reader, load_algorithm, read_input, reader_for, register_reader


def load_program(path, opts: CompileOptions | None = None):
    """Any runnable input (a path, or an Algorithm already read) as a ProgramIR: a program format (a ProgramIR ``.json``, taken exactly as
    given: structure is validated on load, the collective is *not* re-verified, so hand-edited IRs
    can be tried; an MSCCL ``.xml``, proven on import) as read, an algorithm verified, scheduled and
    lowered with ``opts`` (:func:`~hccc.compiler.pipeline.compile.build`, no cost model). Raises
    :class:`CompileError` with a located message for bad input."""
    opts = opts or CompileOptions()
    src = read_input(path, opts) if isinstance(path, (str, Path)) else path
    if hasattr(src, "prims"):
        return src
    return build(context_for(src, opts))


def output_list(path: str | Path, opts: CompileOptions, cluster: ClusterSource | None = None,
                which: str = "all") -> list[str]:
    """The files ``hccc ALGO -o OUTDIR`` writes for ``path`` with ``opts``, as the registered
    emitters declare them (:func:`~hccc.compiler.pipeline.emitters.planned_files`: the kernel
    emitter ``opts.codegen`` and the exports that know their files in advance, so not the MSCCL
    XML), found without scheduling: an algorithm file is only parsed (its header names the program
    and its ranks). ``which``: ``all``, or ``cuda`` / ``hip`` for the translation units of that
    platform's library only."""
    from hccc.compiler.passes.build import sanitize_identifier
    from hccc.compiler.pipeline.emitters import planned_files

    src = read_input(path, opts)
    if hasattr(src, "prims"):
        name, nranks = src.name, src.nranks
    else:
        name, nranks = sanitize_identifier(src.header.name), src.header.nranks
    topo = cluster.topology if cluster is not None else None
    plats = platforms_for(nranks, opts.target, topo)
    return planned_files(opts.codegen, name, plats, which)


__all__ = ["BESIDE_FROM", "STAGES", "TARGETS", "VENDOR_PLATFORM", "ClusterSource", "CompileContext", "CompileOptions",
           "Pass", "Reader", "StageTimes", "apply_channels", "build", "compile_algorithm", "compile_passes",
           "compile_program", "context_for", "load_algorithm", "load_cluster", "load_manifest", "load_program",
           "manifest_codegen", "manifest_path", "output_list", "platforms_for", "program_passes", "read_cluster",
           "read_input", "reader_for", "register_reader", "run_passes", "run_until", "xml_instances"]
