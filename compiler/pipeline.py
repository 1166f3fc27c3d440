"""The whole compile, stage by stage: load -> verify -> build ProgramIR -> generate into OUTDIR.

The command line is a thin layer over these functions; tests and build systems can call them too.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic, Location, SourceFile

if TYPE_CHECKING:
    from concurrent.futures import Future

    from hccc.compiler.cluster.topology import Topology

TARGETS = ("auto", "cuda", "hip", "all")


@dataclass
class CompileOptions:
    scheduler: str = "hpds"          # hpds | rr
    tb_alloc: str = "state"          # state | connection
    chunk_bytes: int = 1 << 20       # micro-batch slice (FIFO slot) size
    target: str = "auto"             # auto | cuda | hip | all
    max_transfers: int = 10 ** 7
    fuse: bool = False               # fused recv+send primitives (see build.build_program)
    xml_order: str = "step"          # MSCCL XML from the algorithm's step order (step) or the kernels' IR (kernel)
    xml_fuse: bool = False           # rcs / rrcs / rrs steps in the MSCCL XML
    xml_instances: int = 1           # instances of the program in the MSCCL XML (msccl-tools' instances)
    codegen: str = "specialized"     # specialized (a kernel per rank) | table (generic kernels + tables)
    direct: str = "auto"             # direct mode for proven receives (auto) or the FIFO everywhere (off)
    channels: int | None = None      # blocks per thread block; None = auto (passes/channels.py)


@dataclass
class StageTimes:
    """Seconds per stage (``seconds``), and per phase inside a stage (``phases``, ``stage/phase``).
    ``beside[stage]`` names the stage it ran beside, on a second thread (:data:`BESIDE_FROM`): its
    seconds overlap that stage's."""

    seconds: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    beside: dict[str, str] = field(default_factory=dict)

    def run(self, name, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:   # a stage that refuses (e.g. the XML export past a limit) took time too
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


def load_algorithm(path: str | Path, *, max_transfers: int = 10 ** 7) -> Algorithm:
    """Read an algorithm file, choosing the front end by extension (``.rccl``)."""
    p = Path(path)
    src = SourceFile.read(p)
    suffix = p.suffix.lower()
    if suffix in (".rccl", ".resccl", ""):
        from hccc.compiler.frontend import parse_rccl
        return parse_rccl(src.text, str(p), max_transfers=max_transfers)
    raise CompileError([Diagnostic(
        f"don't know how to read '{p.name}': expected a .rccl (ResCCLang) file", None)])


VENDOR_PLATFORM = {"nvidia": "cuda", "amd": "hip"}

#: transfers from which a compile runs verification beside scheduling and lowering, and the IR
#: checks beside code generation, each on a second thread (numpy work on whole columns, which runs
#: mostly without the GIL). Errors keep their order: a verification error is the one reported even
#: when scheduling failed too, and a check error wins over what code generation made of the
#: program; nothing is written unless both passed.
BESIDE_FROM = 100_000


@dataclass(frozen=True)
class ClusterSource:
    """A cluster description loaded for a compile: the model and the file it came from."""

    topology: "Topology"
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        """What diagnostics call the cluster: its file name."""
        return self.path.name

    def manifest_entry(self) -> dict:
        """The manifest's ``topology`` object (kept small: per-node facts and the vendor of each rank)."""
        t = self.topology
        return {
            "name": t.name,
            "file": self.path.name,
            "sha256": self.sha256,
            "nranks": int(t.nranks),
            "nodes": [{"name": nd.name, "first_rank": nd.offset, "ngpus": nd.ngpus, "vendor": nd.vendor,
                       "model": nd.model} for nd in t.nodes],
            "rank_vendor": list(t.rank_vendor),
        }


def read_cluster(path: str | Path) -> ClusterSource:
    """:func:`load_cluster` plus the file's SHA-256 (recorded in the manifest)."""
    from hccc.compiler.frontend.limits import read_input_bytes
    p = Path(path)
    topo = load_cluster(p)
    digest = hashlib.sha256(read_input_bytes(p)).hexdigest()
    return ClusterSource(topo, p, digest)


def platforms_for(nranks: int, target: str, topology=None) -> list[tuple[str, ...]]:
    """Platforms emitted for each rank (the first is the one it runs on).

    ``auto`` takes each rank's platform from its node's vendor when a ``topology`` is given (NVIDIA ->
    CUDA, AMD -> HIP) and is CUDA for every rank otherwise; ``cuda`` / ``hip`` force one platform;
    ``all`` emits CUDA and HIP for every rank (the vendor's platform first with a topology).
    """
    if topology is not None and target in ("auto", "all"):
        if topology.nranks != nranks:
            raise ValueError(f"topology has {topology.nranks} ranks, the program {nranks}")
        own = [VENDOR_PLATFORM[v] for v in topology.rank_vendor]
        if target == "auto":
            return [(p,) for p in own]
        return [(p,) + tuple(q for q in ("cuda", "hip") if q != p) for p in own]
    if target in ("auto", "cuda"):
        return [("cuda",)] * nranks
    if target == "hip":
        return [("hip",)] * nranks
    if target == "all":
        return [("cuda", "hip")] * nranks
    raise ValueError(f"unknown target {target!r}")


def compile_algorithm(alg: Algorithm, outdir: str | Path, opts: CompileOptions,
                      times: StageTimes | None = None, cluster: ClusterSource | None = None,
                      xml_limits=None, choose_allocation=None):
    """Verify, schedule, lower and emit ``alg`` into ``outdir`` atomically. Returns (ir, files, notes).

    With a ``cluster``, the algorithm must also fit it (:func:`~hccc.compiler.cluster.topology_check.
    check_on_topology`: rank count, a link under every transfer), ranks take their platform from their
    node's vendor (unless ``opts.target`` forces one) and the manifest records the cluster.
    ``choose_allocation(alg, ir) -> ir``, given by a caller that has a cost model (the command
    line passes the simulator's :func:`~hccc.runtime.simulator.faster_allocation` with
    ``--topology``), may replace the state-based allocation by a faster one.
    """
    from hccc.compiler.passes.verify import verify

    times = times or StageTimes()
    if alg.ntransfers < BESIDE_FROM:
        times.run("verify", verify, alg)
        if cluster is not None:
            _check_on_cluster(alg, cluster, times)
        ir = _build(alg, opts, times, check=True)
        return _emit(alg, ir, outdir, opts, times, cluster, xml_limits, choose_allocation, None)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hccc-beside") as beside:
        # verification beside scheduling; its error (before the cluster's) is the one reported
        times.beside["verify"] = "schedule+lower"
        times.seconds.setdefault("verify", 0.0)        # (printed in pipeline order)
        verified = beside.submit(times.run, "verify", verify, alg)
        # the IR checks run inline where fusion's back-off needs them or a cost model simulates
        # the program; else beside the XML export and code generation
        inline = opts.fuse or choose_allocation is not None
        try:
            if cluster is not None:
                _check_on_cluster(alg, cluster, times)
            ir = _build(alg, opts, times, check=inline)
        except BaseException:
            verified.result()
            raise
        verified.result()
        checked = None
        if not inline:
            from hccc.compiler.passes.build import check_program
            times.beside["checks"] = "codegen"
            times.seconds.setdefault("checks", 0.0)
            checked = beside.submit(times.run, "checks", check_program, ir)
        try:
            return _emit(alg, ir, outdir, opts, times, cluster, xml_limits, choose_allocation, checked)
        except BaseException:
            if checked is not None:
                checked.result()      # an internal error of the checks first
            raise


def _check_on_cluster(alg: Algorithm, cluster: "ClusterSource", times: StageTimes) -> None:
    from hccc.compiler.cluster.topology_check import check_on_topology
    times.run("topology", check_on_topology, alg, cluster.topology, cluster.name)


def _build(alg: Algorithm, opts: CompileOptions, times: StageTimes, *, check: bool):
    """The ``schedule+lower`` stage; ``check=False`` leaves the IR checks to the caller."""
    from hccc.compiler.passes.build import build_program
    phases: dict[str, float] = {}
    ir = times.run("schedule+lower", build_program, alg, scheduler=opts.scheduler,
                   tb_alloc=opts.tb_alloc, chunk_bytes=opts.chunk_bytes, fuse=opts.fuse, timings=phases,
                   check=check)
    times.phases.update({f"schedule+lower/{k}": v for k, v in phases.items()})
    return ir


def _emit(alg, ir, outdir, opts, times, cluster, xml_limits, choose_allocation, checked: Future | None):
    """:func:`compile_algorithm` after schedule+lower: channels, the allocation choice, the XML
    export and code generation (``checked``: the IR checks, still running beside)."""
    plats = platforms_for(ir.nranks, opts.target, cluster.topology if cluster else None)
    ir = apply_channels(ir, opts, plats, declared=alg.header.nchannels)
    if choose_allocation is not None and opts.tb_alloc == "state":
        # compared with the channels chosen above; the kept program's blocks are checked again
        # (auto resolves again for it: a fused program has more thread blocks per rank)
        ir = times.run("tb_alloc choice", choose_allocation, alg, ir)
        ir = apply_channels(ir, opts, plats, declared=alg.header.nchannels)
    xml = None
    if opts.xml_order == "step":
        from hccc.compiler.interop.msccl_export import export_algorithm
        from hccc.compiler.interop.msccl_format import XmlLimits
        try:
            _, text = times.run("msccl_xml", lambda: export_algorithm(
                alg, xml_limits or XmlLimits(), fuse=opts.xml_fuse,
                instances=xml_instances(opts, alg.header.nchannels),
                chunk_bytes=opts.chunk_bytes, name=ir.name))
            xml = (text, None)
        except CompileError as exc:
            xml = (None, exc)
    return compile_program(ir, outdir, opts, times, cluster=cluster, xml_limits=xml_limits, checked=True, xml=xml,
                           declared=alg.header.nchannels, structure_checked=True, pending_checks=checked)


def compile_program(ir, outdir: str | Path, opts: CompileOptions, times: StageTimes | None = None,
                    cluster: ClusterSource | None = None, xml_limits=None, checked: bool = False, xml=None,
                    declared: int | None = None, structure_checked: bool = False,
                    pending_checks: Future | None = None):
    """Emit a ProgramIR into ``outdir`` atomically: kernels, manifest, IR JSON, build files and the
    MSCCL XML export (``<name>.xml``). Returns (ir, files, notes); ``notes`` are warnings for the
    user (e.g. the XML export skipped because the program exceeds a runtime limit: the kernels are
    still written).

    ``checked``: the caller already checked the program against ``cluster``; otherwise every
    connection of the IR must be a link of the cluster. ``xml``: the export already made by the
    caller, ``(text, None)`` or ``(None, CompileError)``; otherwise ``ir`` itself is exported.
    ``declared``: the channel count the algorithm declares (default: the program's own), for the
    XML's instances (:func:`xml_instances`).
    ``structure_checked``: ``ir`` passed :func:`~hccc.compiler.ir.check.check_structure` (built by
    :func:`~hccc.compiler.passes.build.build_program`), so code generation does not check it again.
    ``pending_checks``: that program's IR checks, still running (:data:`BESIDE_FROM`): the output
    directory is committed only once they passed, and their error wins over code generation's.
    """
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.backend.table_codegen import generate_table
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.interop.msccl_export import export_xml
    from hccc.compiler.backend.output_dir import atomic_output_dir

    times = times or StageTimes()
    extra: dict = {}
    topo = None
    if cluster is not None:
        topo = cluster.topology
        if not checked:
            from hccc.compiler.cluster.topology_check import check_ir_on_topology
            times.run("topology", check_ir_on_topology, ir, topo, cluster.name)
        extra["topology"] = cluster.manifest_entry()
    notes: list[str] = []
    xml_text = None
    platforms = platforms_for(ir.nranks, opts.target, topo)
    if declared is None:
        declared = int(ir.nchannels)      # a given program's own count (before auto)
    if not checked:   # compile_algorithm chose the channels already
        ir = apply_channels(ir, opts, platforms)
    try:
        if xml is None:
            xml_text = times.run("msccl_xml", export_xml, ir, xml_limits or XmlLimits(), fuse=opts.xml_fuse,
                                 instances=xml_instances(opts, declared))
        elif xml[1] is not None:
            raise xml[1]
        else:
            xml_text = xml[0]
        extra["msccl_xml"] = f"{ir.name}.xml"
    except CompileError as exc:
        extra["msccl_xml"] = None
        notes.append("MSCCL XML not written (the kernels are): "
                     + "; ".join(d.message for d in exc.diagnostics[:3])
                     + (" ..." if len(exc.diagnostics) > 3 else ""))
    with atomic_output_dir(outdir) as tmp:
        phases: dict[str, float] = {}
        gen = generate_table if opts.codegen == "table" else generate
        try:
            files = times.run("codegen", gen, ir, tmp, platforms=platforms, manifest_extra=extra or None,
                              extra_files=(f"{ir.name}.xml",) if xml_text is not None else (), timings=phases,
                              direct=opts.direct, structure_checked=structure_checked)
        finally:
            if pending_checks is not None:
                pending_checks.result()     # raises the checks' error (before code generation's)
        times.phases.update({f"codegen/{k.removeprefix('codegen_')}": v for k, v in phases.items()})
        if xml_text is not None:
            xml_path = Path(tmp) / f"{ir.name}.xml"
            xml_path.write_text(xml_text, encoding="utf-8")
            files = sorted([*files, xml_path])
    return ir, files, notes


def apply_channels(ir, opts: CompileOptions, platforms, declared: int = 1, ranks_per_device: int = 1):
    """``ir`` with the channel count ``opts.channels`` asks for on ``platforms`` (per-rank tuples
    as :func:`platforms_for` gives, or names), :func:`hccc.compiler.passes.channels.resolve_channels`;
    ``declared``: the algorithm's own request (the ``.rccl`` header's nChannels), taken by ``auto``
    for GPU code; ``ranks_per_device``: ranks sharing one device. A count that cannot run is a
    :class:`CompileError`."""
    from hccc.compiler.passes.channels import ChannelError, resolve_channels, with_channels
    names = [p[0] if isinstance(p, tuple) else p for p in platforms]
    try:
        k = resolve_channels(opts.channels, ir, names, declared=declared, ranks_per_device=ranks_per_device)
    except ChannelError as exc:
        raise CompileError([Diagnostic(f"--channels: {exc}", None)]) from None
    return with_channels(ir, k)


def xml_instances(opts: CompileOptions, declared: int = 1) -> int:
    """MSCCL XML instances: ``--xml-instances`` x the channels asked for (``--channels K``) or, with
    ``auto``, declared by the program (the ``.rccl`` nChannels, a ProgramIR's ``nchannels``). An
    MSCCL instance is what an hccc channel is: a copy of every thread block on channels of its
    own, moving its share of every chunk (the XML's ``nchannels`` counts them). The hardware rule
    of ``auto`` applies to hccc's kernels only: an MSCCL runtime picks its own parallelism."""
    k = opts.channels if opts.channels is not None else max(1, int(declared))
    return max(1, int(opts.xml_instances)) * int(k)


IR_SUFFIXES = (".json",)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
XML_SUFFIXES = (".xml",)


def output_list(path: str | Path, opts: CompileOptions, cluster: ClusterSource | None = None,
                which: str = "all") -> list[str]:
    """The files ``hccc ALGO -o OUTDIR`` writes for ``path`` with ``opts`` (without the MSCCL XML,
    see :mod:`hccc.compiler.backend.outputs`), found without scheduling: an algorithm file is only
    parsed (its header names the program and its ranks). ``which``: ``all``, or ``cuda`` / ``hip``
    for the translation units of that platform's library only."""
    from hccc.compiler.backend.outputs import planned_outputs, planned_sources
    from hccc.compiler.passes.build import sanitize_identifier

    p = Path(path)
    if p.suffix.lower() in IR_SUFFIXES + XML_SUFFIXES:
        ir = load_program(p, opts)
        name, nranks = ir.name, ir.nranks
    else:
        alg = load_algorithm(p, max_transfers=opts.max_transfers)
        name, nranks = sanitize_identifier(alg.header.name), alg.header.nranks
    topo = cluster.topology if cluster is not None else None
    plats = platforms_for(nranks, opts.target, topo)
    if which == "all":
        return planned_outputs(name, plats, opts.codegen)
    return planned_sources(name, plats, opts.codegen, which)


def load_program(path: str | Path, opts: CompileOptions | None = None):
    """Any runnable input as a ProgramIR.

    - ``.json``: a ProgramIR as written into OUTDIR; taken exactly as given (structure is validated on
      load, the collective is *not* re-verified), so hand-edited IRs can be tried.
    - ``.xml``: an MSCCL XML algorithm (``hccc.compiler.interop.msccl_xml.import_xml``).
    - anything else: an algorithm file, verified, scheduled and lowered with ``opts``.
    Raises :class:`CompileError` with a located message for bad input.
    """
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.passes.verify import verify

    opts = opts or CompileOptions()
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in IR_SUFFIXES:
        from hccc.compiler.ir.check import load_ir_json
        from hccc.compiler.ir.program_ir import IRFormatError
        src = SourceFile.read(p)
        try:
            return load_ir_json(src.text)
        except IRFormatError as exc:
            raise CompileError([Diagnostic(str(exc), Location(src, exc.line, exc.col))]) from None
    if suffix in XML_SUFFIXES:
        from hccc.compiler.interop.msccl_xml import import_xml
        return import_xml(p)
    alg = load_algorithm(p, max_transfers=opts.max_transfers)
    verify(alg)
    return build_program(alg, scheduler=opts.scheduler, tb_alloc=opts.tb_alloc,
                         chunk_bytes=opts.chunk_bytes, fuse=opts.fuse)


def manifest_path(algo: str | Path) -> Path | None:
    """``ALGO``'s manifest when ALGO is a compiled OUTDIR or a manifest (``schema`` hccc.manifest/N)."""
    p = Path(algo)
    if p.is_dir():
        return p / "manifest.json"
    if p.suffix.lower() == ".json" and p.is_file():
        from hccc.compiler.frontend.limits import loads_json
        try:
            head = loads_json(SourceFile.read(p))
        except CompileError:
            return None          # load_program reports it, located
        if isinstance(head, dict) and str(head.get("schema", "")).startswith("hccc.manifest/"):
            return p
    return None


def _program_of_tables(path: Path, man: dict, fail):
    """The ProgramIR of a table-mode OUTDIR: read back from the binary tables, which are checked
    against the manifest on the way."""
    from hccc.compiler.backend.table_format import TableFormatError
    from hccc.compiler.backend.table_program import program_from_table, table_path

    try:
        tpath = table_path(path.parent, man)
        ir = program_from_table(man, tpath.read_bytes(), tpath.name)
    except TableFormatError as exc:
        fail(str(exc))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        fail(f"cannot read the table-mode program: {exc}")
    return ir


def manifest_codegen(path: Path) -> str:
    """The code-generation mode (``specialized`` or ``table``) of the compiled OUTDIR whose
    manifest is ``path``."""
    from hccc.compiler.frontend.limits import loads_json
    man = loads_json(SourceFile.read(path))
    return "table" if isinstance(man, dict) and man.get("codegen") == "table" else "specialized"


def load_manifest(path: Path):
    """(ProgramIR, per-rank platforms) of a compiled OUTDIR's ``manifest.json`` (either
    code-generation mode: a table-mode program is read back from its tables)."""
    from hccc.compiler.frontend.limits import loads_json

    src = SourceFile.read(path)

    def fail(msg: str):
        raise CompileError([Diagnostic(msg, Location(src, 1, 1))])

    man = loads_json(src)
    if not isinstance(man, dict) or not str(man.get("schema", "")).startswith("hccc.manifest/"):
        fail("not an hccc manifest (no 'schema': 'hccc.manifest/1')")
    from hccc.compiler.backend.abi import manifest_abi_error
    if (why := manifest_abi_error(man)) is not None:
        fail(why)
    ranks = man.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(e, dict) for e in ranks):
        fail("'ranks' must be a list of rank objects")
    plats = [e.get("platform") for e in ranks]
    bad = [r for r, pl in enumerate(plats) if pl not in ("cuda", "hip")]
    if bad:
        fail(f"rank {bad[0]}: platform {plats[bad[0]]!r} is neither 'cuda' nor 'hip'")
    if man.get("codegen") == "table":
        return _program_of_tables(path, man, fail), plats
    irname = man.get("ir")
    if not isinstance(irname, str) or not _PLAIN_NAME.fullmatch(irname):
        fail(f"'ir' must name the ProgramIR file next to the manifest, got {irname!r}")
    ir = load_program(path.parent / irname)
    if ir.nranks != len(plats):
        fail(f"the manifest lists {len(plats)} ranks, its ProgramIR {irname} has {ir.nranks}")
    return ir, plats


def load_cluster(path: str | Path):
    """Any cluster description as a :class:`~hccc.compiler.cluster.topology.Topology`, by extension:
    ``.topo`` (HeteCCL-style cluster DSL) or ``.json`` (a TACCL topology profile,
    ``hccc.compiler.interop.taccl.load_taccl``). Bad input raises a located :class:`CompileError`."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        from hccc.compiler.interop.taccl import load_taccl
        return load_taccl(p)
    from hccc.compiler.cluster.topo_parser import load_topology
    return load_topology(p)
