"""The whole compile, stage by stage: load -> verify -> build ProgramIR -> generate into OUTDIR.

The command line is a thin layer over these functions; tests and build systems can call them too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .algorithm import Algorithm
from .diagnostics import CompileError, Diagnostic, Location, SourceFile

TARGETS = ("auto", "cuda", "hip", "all")


@dataclass
class CompileOptions:
    scheduler: str = "hpds"          # hpds | rr
    tb_alloc: str = "state"          # state | connection
    chunk_bytes: int = 1 << 20       # micro-batch slice (FIFO slot) size
    target: str = "auto"             # auto | cuda | hip | all
    max_transfers: int = 10 ** 7


@dataclass
class StageTimes:
    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, name, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        return out


def load_algorithm(path: str | Path, *, max_transfers: int = 10 ** 7) -> Algorithm:
    """Read an algorithm file, choosing the front end by extension (``.rccl``)."""
    p = Path(path)
    src = SourceFile.read(p)
    suffix = p.suffix.lower()
    if suffix in (".rccl", ".resccl", ""):
        from .frontend import parse_rccl
        return parse_rccl(src.text, str(p), max_transfers=max_transfers)
    raise CompileError([Diagnostic(
        f"don't know how to read '{p.name}': expected a .rccl (ResCCLang) file", None)])


def platforms_for(nranks: int, target: str) -> list[tuple[str, ...]]:
    """Platforms emitted for each rank (the first is the one it runs on).

    Without a cluster description every rank is CUDA; ``all`` emits CUDA and HIP for every rank.
    """
    if target in ("auto", "cuda"):
        return [("cuda",)] * nranks
    if target == "hip":
        return [("hip",)] * nranks
    if target == "all":
        return [("cuda", "hip")] * nranks
    raise ValueError(f"unknown target {target!r}")


def compile_algorithm(alg: Algorithm, outdir: str | Path, opts: CompileOptions,
                      times: StageTimes | None = None):
    """Verify, schedule, lower and emit ``alg`` into ``outdir`` atomically. Returns (ir, files)."""
    from .build import build_program
    from .codegen import generate
    from .output_dir import atomic_output_dir
    from .verify import verify

    times = times or StageTimes()
    times.run("verify", verify, alg)
    ir = times.run("schedule+lower", build_program, alg, scheduler=opts.scheduler,
                   tb_alloc=opts.tb_alloc, chunk_bytes=opts.chunk_bytes)
    with atomic_output_dir(outdir) as tmp:
        files = times.run("codegen", generate, ir, tmp, platforms=platforms_for(ir.nranks, opts.target))
    return ir, files


IR_SUFFIXES = (".json",)
XML_SUFFIXES = (".xml",)


def load_program(path: str | Path, opts: CompileOptions | None = None):
    """Any runnable input as a ProgramIR.

    - ``.json``: a ProgramIR as written into OUTDIR; taken exactly as given (structure is validated on
      load, the collective is *not* re-verified), so hand-edited IRs can be tried.
    - ``.xml``: an MSCCL XML algorithm (``hccc.compiler.msccl_xml.import_xml``).
    - anything else: an algorithm file, verified, scheduled and lowered with ``opts``.
    Raises :class:`CompileError` with a located message for bad input.
    """
    from .build import build_program
    from .verify import verify

    opts = opts or CompileOptions()
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in IR_SUFFIXES:
        from .program_ir import IRFormatError, ProgramIR
        src = SourceFile.read(p)
        try:
            return ProgramIR.from_json(src.text)
        except IRFormatError as exc:
            raise CompileError([Diagnostic(str(exc), Location(src, exc.line, exc.col))]) from None
    if suffix in XML_SUFFIXES:
        from .msccl_xml import import_xml
        return import_xml(p)
    alg = load_algorithm(p, max_transfers=opts.max_transfers)
    verify(alg)
    return build_program(alg, scheduler=opts.scheduler, tb_alloc=opts.tb_alloc,
                         chunk_bytes=opts.chunk_bytes)


def load_cluster(path: str | Path):
    """Any cluster description as a :class:`~hccc.compiler.topology.Topology`, by extension:
    ``.topo`` (HeteCCL-style cluster DSL) or ``.json`` (a TACCL topology profile,
    ``hccc.compiler.taccl.load_taccl``). Bad input raises a located :class:`CompileError`."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        from .taccl import load_taccl
        return load_taccl(p)
    from .frontend.topo_parser import load_topology
    return load_topology(p)
