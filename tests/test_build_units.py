"""The table mode's library builds: one translation unit per element type.

The emitted Makefile / CMakeLists.txt (and the CMake package's ``hccc::table_<platform>``) compile
``hccc_table_<dtype>.cu`` / ``.hip``, each the generic source ``hccc_table.cu`` with that element
type alone enabled and without the one-grid entries, so that ``make -jN`` compiles them in
parallel. Checked against the dtype table (``hccc.util.dtypes``: which (dtype, op) pairs have
kernels), not against the templates: the units together define every per-rank kernel the build
enables, each once, and nothing else; the Makefile builds one object per enabled element type;
the CMake package knows every element type and operator. A rare instance the default build
leaves to the runtime (which compiles the one instance a run asks for, on first use, into its
cache) runs in the CPU emulation against the reference.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.frontend.load import load_rccl
from hccc.compiler.passes.build import build_program
from hccc.testing import assert_kernels_match, default_counts
from hccc.util import dtypes as dtypes_table

from conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent
RING = ROOT / "examples" / "ring_allreduce_8.rccl"
DTYPES = [d.name for d in dtypes_table.DTYPES]
OPS = [o.name for o in dtypes_table.OPS]
#: a kernel defined in a preprocessed unit: extern "C" ... name(
KERNEL_DEF = re.compile(r'extern "C"[^;{]*?\bvoid\s+(hccc_table_\w+)\s*\(')


def _valid(dtypes, ops) -> set[tuple[str, str]]:
    return {(d, o) for d in dtypes for o in ops if dtypes_table.instance_error(d, o) is None}


@pytest.fixture(scope="module")
def table_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("units") / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table", "--target", "all"]) == 0
    return out


def _kernels(out: Path, unit: str, defines: list[str]) -> list[str]:
    """The kernels ``unit`` defines (g++ -E with the CPU platform, as the emulation compiles it)."""
    gxx = require_tool("g++")
    res = subprocess.run([gxx, "-std=c++17", "-E", "-x", "c++", "-DHCCC_PLATFORM_CPU=1", *defines,
                          "-I", str(out), str(out / unit)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return KERNEL_DEF.findall(res.stdout)


def _enable_flags(dtypes, ops) -> list[str]:
    """The -D flags the Makefile passes for HCCC_DTYPES / HCCC_OPS."""
    return ([f"-DHCCC_ENABLE_{d.upper()}={int(d in dtypes)}" for d in DTYPES]
            + [f"-DHCCC_ENABLE_{o.upper()}={int(o in ops)}" for o in OPS])


def test_every_platform_has_a_unit_per_element_type_that_includes_the_generic_source(table_out):
    for ext in ("cu", "hip"):
        for d in DTYPES:
            text = (table_out / f"hccc_table_{d}.{ext}").read_text()
            assert f'#include "hccc_table.{ext}"' in text


@settings(max_examples=4, deadline=None)
@given(dtypes=st.sets(st.sampled_from(DTYPES), min_size=1), ops=st.sets(st.sampled_from(OPS), min_size=1))
def test_the_units_define_each_enabled_rank_kernel_once_and_nothing_else(table_out, dtypes, ops):
    """Over the units a build compiles (those of HCCC_DTYPES), with the build's flags: every
    (dtype, op) pair of the dtype table in the selection is one per-rank kernel, in its dtype's
    unit; no one-grid entry; no pair twice (the static library links them all)."""
    flags = _enable_flags(dtypes, ops)
    seen: list[str] = []
    for d in sorted(dtypes):
        got = _kernels(table_out, f"hccc_table_{d}.cu", flags)
        assert all(k.startswith(f"hccc_table_{d}_") for k in got), (d, got)
        seen += got
    assert sorted(seen) == sorted(f"hccc_table_{d}_{o}" for d, o in _valid(dtypes, ops))


def test_a_unit_of_a_disabled_dtype_is_empty_and_grid_entries_are_asked_for(table_out):
    assert _kernels(table_out, "hccc_table_uint8.cu", _enable_flags({"float32"}, OPS)) == []
    got = _kernels(table_out, "hccc_table_float64.hip", ["-DHCCC_TABLE_GRID_KERNELS=1"])
    want = {(d, o) for d, o in _valid(["float64"], OPS)}
    assert sorted(got) == sorted([f"hccc_table_{d}_{o}" for d, o in want]
                                 + [f"hccc_table_grid_{d}_{o}" for d, o in want])


def test_the_generic_source_keeps_every_kernel_and_grid_entry_for_the_runtime(table_out):
    got = _kernels(table_out, "hccc_table.cu", [])
    want = _valid(DTYPES, OPS)
    assert sorted(got) == sorted([f"hccc_table_{d}_{o}" for d, o in want]
                                 + [f"hccc_table_grid_{d}_{o}" for d, o in want])


def _make_n(out: Path, *args: str) -> subprocess.CompletedProcess:
    make = require_tool("make")
    return subprocess.run([make, "-n", "-C", str(out), *args], capture_output=True, text=True, timeout=60)


def test_make_compiles_one_object_per_enabled_dtype(table_out):
    res = _make_n(table_out, "HCCC_DTYPES=float32 uint8 float64", "HCCC_OPS=sum prod")
    assert res.returncode == 0, res.stderr
    nvcc = [ln for ln in res.stdout.splitlines() if ln.startswith("nvcc ")]
    units = sorted(re.search(r"-c (\S+)", ln).group(1) for ln in nvcc)
    assert units == ["hccc_table_float32.cu", "hccc_table_float64.cu", "hccc_table_uint8.cu"]
    assert all("-DHCCC_ENABLE_PROD=1" in ln and "-DHCCC_ENABLE_MAX=0" in ln for ln in nvcc)
    res = _make_n(table_out)                   # the default: every element type
    assert sum(ln.startswith("nvcc ") for ln in res.stdout.splitlines()) == len(DTYPES)
    res = _make_n(table_out, "HCCC_DTYPES=float32 float128")
    assert res.returncode != 0 and "unknown HCCC_DTYPES/HCCC_OPS entry 'float128'" in res.stderr


def test_the_cmake_package_knows_every_dtype_and_op():
    text = (ROOT / "driver" / "cmake" / "hccc-config.cmake").read_text()
    for var, names in (("HCCC_KNOWN_DTYPES", DTYPES), ("HCCC_KNOWN_OPS", OPS)):
        m = re.search(rf"^set\({var} ([^)]*)\)", text, re.M)
        assert m is not None and m.group(1).split() == names, var


@pytest.mark.slow
def test_make_builds_the_library_of_a_rare_instance_without_grid_entries(tmp_path):
    """nvcc through the emitted Makefile, one instance: the unit's object only, its per-rank
    kernel, no one-grid entry."""
    require_tool("nvcc")
    out = tmp_path / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table"]) == 0
    res = subprocess.run(["make", "-j2", "-C", str(out), "HCCC_DTYPES=uint8", "HCCC_OPS=prod"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    lib = out / "libhccc_table_cuda.a"
    assert subprocess.run(["ar", "t", str(lib)], capture_output=True, text=True).stdout.split() == \
        ["hccc_table_uint8.cu.o"]
    syms = subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
    assert re.search(r" T hccc_table_uint8_prod$", syms, re.M) and "hccc_table_grid_" not in syms


@pytest.mark.parametrize("dtype,op", [("uint8", "prod"), ("float64", "avg")])
def test_a_rare_instance_runs_in_the_table_mode_on_the_cpu_emulation(dtype, op):
    """What the default build of a library would leave out the runtime builds on first use."""
    require_tool("g++")
    ir = build_program(load_rccl(RING), chunk_bytes=64)
    counts = default_counts(ir, dtype)
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts[1::4] + counts[-1:],
                         inplace=(False, True), codegen="table")
