"""Table-mode code generation (``--codegen table``): ProgramIR -> binary tables, generic kernels.

Instead of one specialised source per rank, the output holds ``NAME.table`` (every rank's primitive
program, :mod:`hccc.compiler.backend.table_format`), the generic kernel sources ``hccc_table.cu`` /
``hccc_table.hip`` (one kernel per dtype x op; they do not depend on the algorithm, so their
library is built once and runs any table), the shared headers plus ``hccc_table.h``, the manifest
(``"codegen": "table"``) and build files for the generic library. No IR JSON is written: the
table holds everything needed to rebuild the ProgramIR
(:func:`hccc.compiler.backend.table_program.program_from_table`), so outputs stay small at scale.
"""
from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from hccc.compiler.backend import table_format as tf
from hccc.compiler.backend.codegen import (DTYPES, EXT, HEADERS, NSLOTS, PLATFORMS, REDOPS, VERSION, _template_env,
                                           analyse, buffer_bases, channel_count, manifest_text,
                                           prepare_output, program_stats, threads_per_tb)
from hccc.compiler.backend.prim_fields import PD_FIELDS, pd_columns
from hccc.compiler.backend.table_units import default_units
from hccc.compiler.ir.program_ir import ProgramIR

#: the table mode's headers (the specialised ones plus the table decoder)
TABLE_HEADERS = HEADERS + ("hccc_table.h",)
#: the generic kernel source of each platform, and the name its library gets
GENERIC_SOURCE = {pl: f"hccc_table.{EXT[pl]}" for pl in PLATFORMS}
GENERIC_LIBRARY = {pl: f"hccc_table_{pl}" for pl in PLATFORMS}
GENERIC_KERNEL = "hccc_table"
#: the libraries' translation units (``hccc_table_unit<i>.cu``: the generic source with a fixed set
#: of instances, without the one-grid entries; :mod:`hccc.compiler.backend.table_units`: every
#: instance in one unit, the units balanced by the device compiler's cost, the largest first), so
#: that ``make -jN`` builds in parallel to the end; a build compiles the units holding an instance it
#: enables (HCCC_DTYPES x HCCC_OPS)
UNITS = default_units()
LIBRARY_UNITS = {pl: tuple(u.source(pl) for u in UNITS) for pl in PLATFORMS}
#: the CMake function both CMake builds of the library choose their units with (the emitted
#: CMakeLists.txt and the package's hccc::table_<platform>)
UNITS_CMAKE = "hccc_table_units.cmake"
#: the generic one-grid entry (hccc_table_grid_args: every rank of a single-GPU run in one launch)
GRID_KERNEL = "hccc_table_grid"


def _unit_depends(platforms) -> list[str]:
    """What every library unit includes: the headers and the generic sources."""
    return list(TABLE_HEADERS) + [GENERIC_SOURCE[pl] for pl in PLATFORMS if pl in platforms]


def table_sections(ir: ProgramIR, col=None, direct: str = "auto") -> list[bytes]:
    """One encoded section per rank (``ir`` canonical and structurally checked); ``direct`` as
    :func:`hccc.compiler.backend.codegen.generate`'s."""
    from hccc.compiler.backend.direct_fields import direct_fields
    col = col if col is not None else analyse(ir)
    v = pd_columns(ir, col, direct_fields(ir, direct))
    p = ir.prims
    v["pipeline"] = np.asarray(p["pipeline"], np.int64)
    v["channel"] = np.asarray(p["channel"], np.int64)
    v["task2"] = np.asarray(p["task2"], np.int64)
    in_base, out_base = buffer_bases(ir)
    rank = np.asarray(p["rank"], np.int64)
    bounds = np.searchsorted(rank, np.arange(ir.nranks + 1))
    # dependency slots are grouped by waiting primitive in primitive order
    ndeps = v["ndeps"]
    dep_bounds = np.r_[0, np.cumsum(ndeps)][bounds]
    tb = np.asarray(p["tb"], np.int64)
    ntbs = np.asarray(ir.ntbs, np.int64)
    max_cnt = int(ir.max_step_chunks)    # a scan of the whole table: once, not once per rank
    out = []
    for r in range(ir.nranks):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        n_tb = int(ntbs[r]) if r < len(ntbs) else 0
        first = np.searchsorted(tb[lo:hi], np.arange(n_tb + 1)).astype(np.int64)
        t = tf.RankTable(
            consts={"rank": r, "nchunks": int(ir.nchunks), "in_base": int(in_base[r]),
                    "out_base": int(out_base[r]), "chunk_bytes": int(ir.chunk_bytes),
                    "max_cnt": max_cnt, "nch": channel_count(ir), "nsend": len(col.send_conns[r]),
                    "nrecv": len(col.recv_conns[r]), "nprog": int(col.nprogress[r]),
                    "nranks": int(ir.nranks)},
            ntbs=n_tb, tb_first=first, columns={k: v[k][lo:hi] for k in tf.COLUMNS},
            deps=col.dep_slots[int(dep_bounds[r]):int(dep_bounds[r + 1])])
        out.append(tf.encode_section(t))
    return out


def render_generic(env, platforms: list[str]) -> dict[str, str]:
    """The generic kernel sources and every header they need (algorithm-independent)."""
    ctx = dict(version=VERSION, nslots=NSLOTS, dtypes=DTYPES, ops=REDOPS)
    out = {
        "hccc_platform.h": env.get_template("common/hccc_platform.h.j2").render(**ctx),
        "hccc_prims.h": env.get_template("common/hccc_prims.h.j2").render(**ctx),
        "hccc_cpu_emu.h": env.get_template("common/hccc_cpu_emu.h.j2").render(**ctx),
        "hccc_table.h": env.get_template("common/hccc_table.h.j2").render(
            version=VERSION, table_format=tf.TABLE_FORMAT, section_magic=tf.SECTION_MAGIC,
            table_version=tf.VERSION, layout=tf.LAYOUT, columns=tf.COLUMNS,
            rank_consts=tf.RANK_CONSTS, pd_fields=PD_FIELDS, head_bytes=tf.HEAD.itemsize,
            col_bytes=tf.COL.itemsize, tb_bytes=tf.TB.itemsize),
    }
    tpl = env.get_template("common/table_kernels.j2")
    unit = env.get_template("common/table_unit.j2")
    ctypes = dict(DTYPES)
    for pl in platforms:
        out[GENERIC_SOURCE[pl]] = tpl.render(version=VERSION, source=GENERIC_SOURCE[pl], platform=pl)
        for u in UNITS:
            src = u.source(pl)
            out[src] = unit.render(version=VERSION, source=src, platform=pl, generic=GENERIC_SOURCE[pl],
                                   unit=u, nunits=len(UNITS), ctypes=ctypes,
                                   unit_dtypes=[d for d, _ in DTYPES if any(d == x for x, _ in u.instances)])
    out[UNITS_CMAKE] = env.get_template("build/table_units.cmake.j2").render(
        version=VERSION, units=UNITS, platforms=list(PLATFORMS), ext=EXT)
    return out


def generate_table(ir: ProgramIR, outdir: pathlib.Path, *, platforms: list,
                   timings: dict | None = None, manifest_extra: dict | None = None,
                   extra_files: tuple[str, ...] = (), direct: str = "auto",
                   structure_checked: bool = False) -> list[pathlib.Path]:
    """Write the table-mode output into ``outdir`` (existing, empty); arguments as
    :func:`hccc.compiler.backend.codegen.generate`. Returns the written paths, sorted."""
    tm = timings if timings is not None else {}
    t0 = time.perf_counter()
    ir, outdir, platforms = prepare_output(ir, outdir, platforms, structure_checked)
    env = _template_env()
    name = ir.name
    col = analyse(ir)
    t1 = time.perf_counter()
    table_file = f"{name}.table"
    written: dict[str, str | bytes] = {table_file: tf.encode_file(table_sections(ir, col, direct))}
    t2 = time.perf_counter()
    present = [pl for pl in PLATFORMS if any(pl in pls for pls in platforms)]
    written.update(render_generic(env, present))
    nthreads = {pl: threads_per_tb(ir.nwarps, pl) for pl in present}
    ntbs = [int(x) for x in ir.ntbs] + [0] * (ir.nranks - len(ir.ntbs))
    rank_entries = []
    for r in range(ir.nranks):
        pl = platforms[r][0]
        rank_entries.append(dict(
            rank=r, platform=pl, tbs=ntbs[r], blocks=channel_count(ir) * ntbs[r], kernel=GENERIC_KERNEL,
            source=GENERIC_SOURCE[pl],
            sources={q: GENERIC_SOURCE[q] for q in platforms[r]},
            send_conns=col.send_conns[r], recv_conns=col.recv_conns[r],
            progress_slots=int(col.nprogress[r])))
    libraries = {pl: GENERIC_LIBRARY[pl] for pl in present}
    sources = {pl: list(LIBRARY_UNITS[pl]) for pl in present}
    build_ctx = dict(version=VERSION, name=name, collective=ir.collective, nranks=ir.nranks,
                     platforms=present, libraries=libraries, sources=sources,
                     headers=_unit_depends(present), codegen="table", dtypes=DTYPES, ops=REDOPS,
                     units=UNITS, units_cmake=UNITS_CMAKE)
    written["CMakeLists.txt"] = env.get_template("build/CMakeLists.txt.j2").render(**build_ctx)
    written["Makefile"] = env.get_template("build/Makefile.j2").render(**build_ctx)
    written["manifest.json"] = manifest_text(
        ir, written, name=name, nthreads=nthreads, codegen="table", headers=TABLE_HEADERS, libraries=libraries,
        ranks=rank_entries, stats=program_stats(ir, col, ntbs, decode_table=False), extra_files=extra_files,
        manifest_extra=manifest_extra, ir=None,
        table={"file": table_file, "format": tf.TABLE_FORMAT, "layout": tf.LAYOUT},
        grid={pl: dict(kernel=GRID_KERNEL, source=GENERIC_SOURCE[pl], blocks=channel_count(ir) * int(sum(ntbs)))
              for pl in PLATFORMS if all(pl in pls for pls in platforms)})
    t3 = time.perf_counter()
    paths = []
    for fname in sorted(written):
        path = outdir / fname
        data = written[fname]
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        paths.append(path)
    tm["codegen_analyse"] = t1 - t0
    tm["codegen_table"] = t2 - t1
    tm["codegen_render"] = t3 - t2
    tm["codegen_write"] = time.perf_counter() - t3
    return sorted(paths)


def write_generic_kernels(outdir: pathlib.Path) -> list[pathlib.Path]:
    """Write the generic kernels of every platform, their headers and build files for their
    libraries (``hccc_table_cuda``, ``hccc_table_hip``) into ``outdir``. Files whose content is
    unchanged are left alone, so a build system that calls this at every configure rebuilds
    nothing. Returns the paths, sorted."""
    outdir = pathlib.Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    env = _template_env()
    files = render_generic(env, list(PLATFORMS))
    ctx = dict(version=VERSION, name="table", collective="any algorithm", nranks="any number of",
               platforms=list(PLATFORMS), libraries=dict(GENERIC_LIBRARY),
               sources={pl: list(LIBRARY_UNITS[pl]) for pl in PLATFORMS},
               headers=_unit_depends(PLATFORMS), codegen="table", dtypes=DTYPES, ops=REDOPS,
               units=UNITS, units_cmake=UNITS_CMAKE)
    files["CMakeLists.txt"] = env.get_template("build/CMakeLists.txt.j2").render(**ctx)
    files["Makefile"] = env.get_template("build/Makefile.j2").render(**ctx)
    paths = []
    for fname, text in sorted(files.items()):
        path = outdir / fname
        data = text.encode()
        if not path.is_file() or path.read_bytes() != data:
            tmp = path.with_name(f".{fname}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        paths.append(path)
    return paths


__all__ = ["generate_table", "write_generic_kernels", "table_sections", "render_generic", "TABLE_HEADERS", "GENERIC_SOURCE",
           "GENERIC_LIBRARY", "GENERIC_KERNEL", "LIBRARY_UNITS", "UNITS", "UNITS_CMAKE"]
