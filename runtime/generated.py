"""A program's generated sources as both launchers use them: the cache of emitted sources
(:func:`generated_sources`) and :class:`GeneratedProgram`, what the single-process
:class:`~hccc.runtime.launcher.Runner` and the one-rank :class:`~hccc.runtime.communicator.Communicator`
read from one generation before their first call: the manifest, every rank's
:class:`~hccc.runtime.rank_memory.RankPlan`, a rank's kernel symbol and launch shape, and the
table mode's tables, each checked the same way for both.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import cache
from hccc.runtime.platform import PlatformError
from hccc.runtime.rank_memory import RankPlan

#: code-generation modes: a specialised kernel per rank, or generic kernels running tables
CODEGENS = ("specialized", "table")
#: direct mode of the generated kernels (:func:`hccc.compiler.backend.codegen.generate`)
DIRECT_MODES = ("auto", "off")

_TEMPLATES_DIGEST: str | None = None


def _templates_digest() -> str:
    """Digest of what renders the emitted sources: the templates and the code generator's modules
    (``hccc.compiler.backend``: the ABI facts the templates render among them)."""
    global _TEMPLATES_DIGEST
    if _TEMPLATES_DIGEST is None:
        parts = []
        for pkg, pattern in (("hccc.templates", "*"), ("hccc.compiler.backend", "*.py")):
            root = Path(str(resources.files(pkg)))
            files = [p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]
            parts.append(cache.files_digest(files, root))
        _TEMPLATES_DIGEST = cache.content_key("renderers", *parts)
    return _TEMPLATES_DIGEST


def check_codegen(codegen: str) -> None:
    """ValueError for a code-generation mode other than :data:`CODEGENS`."""
    if codegen not in CODEGENS:
        raise ValueError(f"unknown codegen {codegen!r} (expected one of {', '.join(CODEGENS)})")


def generated_sources(ir: ProgramIR, platform: str | list[str], cache_dir=None,
                      codegen: str = "specialized", direct: str = "auto") -> Path:
    """Directory with ``ir``'s emitted sources and manifest, from the cache (keyed by the IR JSON,
    the platforms, the code-generation mode, the templates and code generator (:func:`_templates_digest`)
    and the hccc version). ``platform``:
    "cuda" or "hip" for every rank, or one of them per rank (a mixed-vendor program).
    ``codegen``: "specialized" (a kernel per rank) or "table" (tables for the generic kernels).
    ``direct``: "auto" (direct mode for the receives proven safe) or "off" (the FIFO everywhere)."""
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.backend.table_codegen import generate_table

    check_codegen(codegen)
    per_rank = [platform] * ir.nranks if isinstance(platform, str) else [str(p) for p in platform]
    if len(per_rank) != ir.nranks:
        raise ValueError(f"{len(per_rank)} rank platforms for a program of {ir.nranks} ranks")
    text = ir.to_json()
    if direct not in DIRECT_MODES:
        raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
    key = cache.content_key("generated", codegen, ",".join(per_rank), _templates_digest(), text,
                            *(("direct=off",) if direct == "off" else ()))

    def make(tmp: Path) -> None:
        (generate_table if codegen == "table" else generate)(ir, tmp, platforms=per_rank, direct=direct)

    return cache.entry("gen", key, make, root=cache_dir)


def rank_blocks(manifest: dict, entry: dict) -> int:
    """Blocks of a rank's launch: ``nchannels`` x its thread blocks (manifest ``blocks``)."""
    return int(entry.get("blocks", max(1, int(manifest.get("nchannels", 1))) * int(entry["tbs"])))


class GeneratedProgram:
    """One generation of ``ir`` for the manifest platforms ``rank_platform`` (one per rank), read
    once: :attr:`gendir`, :attr:`manifest` (its platforms checked against ``rank_platform``),
    :attr:`plans` (every rank's :class:`RankPlan`) and the FIFO geometry."""

    def __init__(self, ir: ProgramIR, rank_platform: list[str], cache_dir=None,
                 codegen: str = "specialized", direct: str = "auto"):
        self.ir = ir
        self.gendir = generated_sources(ir, rank_platform, cache_dir, codegen, direct)
        self.manifest = man = json.loads((self.gendir / "manifest.json").read_text())
        if [e["platform"] for e in man["ranks"]] != list(rank_platform):
            raise PlatformError("generated manifest disagrees with the rank platforms")
        self.nranks = int(man["nranks"])
        self.nslots = int(man["nslots"])
        self.chunk_bytes = int(man["chunk_bytes"])
        self.slot_bytes = int(man.get("slot_bytes", self.chunk_bytes))
        self.plans = [RankPlan.from_manifest(man, r) for r in range(self.nranks)]
        #: (slot capacity, chunks a message carries) -> every rank's plan with those slots, and
        #: the program's digest (:func:`~hccc.runtime.agreement.program_digest`): made once for
        #: every rank that reads this program (the ranks of a job in one process share it)
        self._capacity_plans: dict = {}
        self._digest: str | None = None

    def plans_with_capacity(self, capacity: int, max_step_chunks: int) -> list[RankPlan]:
        """Every rank's plan with slots of ``capacity`` (:meth:`RankPlan.with_capacity`), made
        once per capacity (read-only: the plans are frozen)."""
        key = (int(capacity), int(max_step_chunks))
        got = self._capacity_plans.get(key)
        if got is None:
            got = self._capacity_plans[key] = [p.with_capacity(*key) for p in self.plans]
        return got

    @property
    def digest(self) -> str:
        """The program's digest (:func:`~hccc.runtime.agreement.program_digest`), computed once."""
        if self._digest is None:
            from hccc.runtime.agreement import program_digest
            self._digest = program_digest(self.ir)
        return self._digest

    @property
    def table_mode(self) -> bool:
        """Whether the generic kernels run tables (``--codegen table``)."""
        return self.manifest.get("codegen") == "table"

    def blocks(self, rank: int) -> int:
        """Blocks of ``rank``'s launch (:func:`rank_blocks`)."""
        return rank_blocks(self.manifest, self.manifest["ranks"][rank])

    def emitted_threads(self, platform: str) -> int:
        """Threads per block the sources of manifest platform ``platform`` were emitted for."""
        return int(self.manifest["nthreads"].get(platform, 1))

    def threads(self, platform: str, pf, nthreads: int | None) -> int:
        """Threads per block of a launch on ``pf``: ``nthreads`` as given, else the platform's
        choice for the emitted kernels (:meth:`Platform.block_threads`)."""
        if nthreads is not None:
            return int(nthreads)
        return max(1, pf.block_threads(self.emitted_threads(platform)))

    def kernel_symbol(self, rank: int, dtype: str, op: str) -> str:
        """The symbol of ``rank``'s kernel for ``dtype`` and ``op`` (manifest ``kernel_symbol``)."""
        pattern = self.manifest.get("kernel_symbol", "{kernel}_{dtype}_{op}")
        return (pattern.replace("{kernel}", self.manifest["ranks"][rank]["kernel"])
                .replace("{dtype}", dtype).replace("{op}", op))

    def tables(self, ranks=None) -> dict[int, bytes]:
        """Table mode: rank -> its section of the ``.table`` file (``ranks``: all when None), each
        checked against the manifest; PlatformError naming the program otherwise."""
        from hccc.compiler.backend.table_format import TableFormatError
        from hccc.compiler.backend.table_program import load_tables, read_table
        try:
            path, data = read_table(self.gendir, self.manifest)
            tables = load_tables(data, self.manifest, ranks, path.name)
        except (OSError, TableFormatError) as exc:
            raise PlatformError(f"cannot use the tables of {self.ir.name}: {exc}") from None
        return {r: bytes(t[1]) for r, t in tables.items()}


__all__ = ["CODEGENS", "DIRECT_MODES", "check_codegen", "generated_sources", "rank_blocks", "GeneratedProgram"]
