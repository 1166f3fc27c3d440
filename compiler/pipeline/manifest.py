"""Compiled output read back: an OUTDIR or its ``manifest.json`` as (ProgramIR, per-rank platforms),
in either code-generation mode."""
from __future__ import annotations

import re
from pathlib import Path

from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile

_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def manifest_path(algo: str | Path) -> Path | None:
    """``ALGO``'s manifest when ALGO is a compiled OUTDIR or a manifest (``schema`` hccc.manifest/N)."""
    p = Path(algo)
    if p.is_dir():
        return p / "manifest.json"
    if p.suffix.lower() == ".json" and p.is_file():
        from hccc.util.limits import loads_json
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
    from hccc.compiler.backend.table_program import program_from_table, read_table

    try:
        tpath, data = read_table(path.parent, man)
        ir = program_from_table(man, data, tpath.name)
    except TableFormatError as exc:
        fail(str(exc))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        fail(f"cannot read the table-mode program: {exc}")
    return ir


def manifest_codegen(path: Path) -> str:
    """The code-generation mode (``specialized`` or ``table``) of the compiled OUTDIR whose
    manifest is ``path``."""
    from hccc.util.limits import loads_json
    man = loads_json(SourceFile.read(path))
    return "table" if isinstance(man, dict) and man.get("codegen") == "table" else "specialized"


def load_manifest(path: Path):
    """(ProgramIR, per-rank platforms) of a compiled OUTDIR's ``manifest.json`` (either
    code-generation mode: a table-mode program is read back from its tables)."""
    from hccc.util.limits import loads_json

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
    from hccc.compiler.pipeline.readers import read_input
    ir = read_input(path.parent / irname)
    if not hasattr(ir, "prims"):
        fail(f"'ir' must name a ProgramIR file, got {irname!r}")
    if ir.nranks != len(plats):
        fail(f"the manifest lists {len(plats)} ranks, its ProgramIR {irname} has {ir.nranks}")
    return ir, plats
