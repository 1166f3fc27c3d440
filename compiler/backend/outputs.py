"""The files a kernel emitter writes into OUTDIR, known before compiling (``hccc ALGO
--list-outputs`` asks the registered emitters, :func:`hccc.compiler.pipeline.emitters.planned_files`,
and the kernel emitters answer from here).

Build systems ask for this list at configure time to declare the generated sources of a library
without hard-coding the algorithm's name or rank count. It depends only on the program's name,
its rank platforms and the code-generation mode; the test suite compares it with what the code
generators actually write. The exports (the MSCCL XML ``NAME.xml``, the MSCCL++ plan) are not
listed: each is written only when the program fits its format, which takes the whole compile to know.
"""
from __future__ import annotations

from hccc.compiler.backend.codegen import EXT, HEADERS, HOST_HEADER, PLATFORMS

CODEGENS = ("specialized", "table")


def planned_outputs(name: str, platforms: list, codegen: str = "specialized") -> list[str]:
    """Sorted file names ``generate`` (specialised) or ``generate_table`` (table) writes for a
    program ``name`` whose rank ``r`` gets the sources ``platforms[r]`` (a name or a tuple)."""
    from hccc.compiler.backend.table_codegen import GENERIC_SOURCE, LIBRARY_UNITS, TABLE_HEADERS, UNITS_CMAKE

    if codegen not in CODEGENS:
        raise ValueError(f"unknown codegen {codegen!r} (expected one of {', '.join(CODEGENS)})")
    plats = [(pl,) if isinstance(pl, str) else tuple(pl) for pl in platforms]
    present = [pl for pl in PLATFORMS if any(pl in pls for pls in plats)]
    files = ["manifest.json", "CMakeLists.txt", "Makefile"]
    if codegen == "table":
        files += list(TABLE_HEADERS) + [f"{name}.table", UNITS_CMAKE] + [GENERIC_SOURCE[pl] for pl in present]
        files += [src for pl in present for src in LIBRARY_UNITS[pl]]
    else:
        files += list(HEADERS) + [HOST_HEADER, f"{name}.ir.json"]
        files += [f"{name}_{pl}.{EXT[pl]}" for pl in present]
        files += [f"{name}_r{r}.{EXT[pl]}" for r, pls in enumerate(plats) for pl in pls]
        # the one-grid entry of each platform every rank has (codegen.grid_entries)
        files += [f"{name}_grid.{EXT[pl]}" for pl in PLATFORMS if plats and all(pl in pls for pls in plats)]
    return sorted(set(files))


def planned_sources(name: str, platforms: list, codegen: str, platform: str) -> list[str]:
    """The translation units of ``platform``'s library among :func:`planned_outputs`: one per
    rank of that platform (specialised; the umbrella source that includes them all is left out, and
    so is the one-grid entry, which compiles only in one unit after every rank's source: the
    runtime's single-GPU module) or the generic kernels' units (table: :mod:`hccc.compiler.backend.table_units`)."""
    from hccc.compiler.backend.table_codegen import LIBRARY_UNITS

    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}")
    plats = [(pl,) if isinstance(pl, str) else tuple(pl) for pl in platforms]
    ranks = [r for r, pls in enumerate(plats) if platform in pls]
    if not ranks:
        return []
    if codegen == "table":
        return list(LIBRARY_UNITS[platform])
    return [f"{name}_r{r}.{EXT[platform]}" for r in ranks]


__all__ = ["CODEGENS", "planned_outputs", "planned_sources"]
