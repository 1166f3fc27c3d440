"""The table mode's library builds: translation units of balanced cost, every instance in one.

The emitted Makefile / CMakeLists.txt (and the CMake package's ``hccc::table_<platform>``) compile
``hccc_table_unit<i>.cu`` / ``.hip``, each the generic source ``hccc_table.cu`` with a fixed set of
(dtype, op) instances and without the one-grid entries, dealt out by the device compiler's measured
cost (``hccc.compiler.backend.table_units``) so that ``make -j2`` keeps both cores busy to the end.
Checked against the dtype table (``hccc.util.dtypes``: which (dtype, op) pairs have kernels) and the
preprocessed units, not against the templates: the units together define every per-rank kernel the
build enables, each once, and nothing else; the Makefile builds the units that define one, and no
other; the CMake package knows every element type and operator; the units' modelled costs are
balanced (recomputed from the cost table). A rare instance the default build leaves to the runtime
(which compiles the one instance a run asks for, on first use, into its cache) runs in the CPU
emulation against the reference.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.backend import table_units
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
#: a unit of the generic library, as the output names it
UNIT_FILE = re.compile(r"hccc_table_unit\d+\.(cu|hip)")


def _valid(dtypes, ops) -> set[tuple[str, str]]:
    return {(d, o) for d in dtypes for o in ops if dtypes_table.instance_error(d, o) is None}


@pytest.fixture(scope="module")
def table_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("units") / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table", "--target", "all"]) == 0
    return out


def _units(out: Path, ext: str) -> list[str]:
    """The unit files in ``out`` (by name, not from the code that writes them)."""
    return sorted(p.name for p in out.iterdir() if UNIT_FILE.fullmatch(p.name) and p.suffix == f".{ext}")


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


def test_every_platform_has_the_same_units_each_including_the_generic_source(table_out):
    cu, hip = _units(table_out, "cu"), _units(table_out, "hip")
    assert len(cu) == table_units.UNITS and [Path(u).stem for u in cu] == [Path(u).stem for u in hip]
    for ext, units in (("cu", cu), ("hip", hip)):
        for u in units:
            assert f'#include "hccc_table.{ext}"' in (table_out / u).read_text()


def test_every_default_instance_is_in_exactly_one_unit(table_out):
    """Over every unit, with no flag (every instance of the dtype table enabled): each (dtype, op)
    pair with a kernel once, nothing else; and no unit is empty."""
    seen: list[str] = []
    for u in _units(table_out, "cu"):
        got = _kernels(table_out, u, [])
        assert got, u
        seen += got
    assert sorted(seen) == sorted(f"hccc_table_{d}_{o}" for d, o in _valid(DTYPES, OPS))


@settings(max_examples=4, deadline=None)
@given(dtypes=st.sets(st.sampled_from(DTYPES), min_size=1), ops=st.sets(st.sampled_from(OPS), min_size=1))
def test_the_units_define_each_enabled_rank_kernel_once_and_nothing_else(table_out, dtypes, ops):
    """Over the units, with the build's flags: every (dtype, op) pair of the dtype table in the
    selection is one per-rank kernel; no one-grid entry; no pair twice (the static library links
    them all)."""
    flags = _enable_flags(dtypes, ops)
    seen: list[str] = []
    for u in _units(table_out, "cu"):
        seen += _kernels(table_out, u, flags)
    assert sorted(seen) == sorted(f"hccc_table_{d}_{o}" for d, o in _valid(dtypes, ops))


def test_a_unit_with_nothing_enabled_is_empty_and_grid_entries_are_asked_for(table_out):
    units = _units(table_out, "hip")
    alone = [u for u in units if _kernels(table_out, u, _enable_flags({"uint8"}, {"prod"}))]
    assert len(alone) == 1
    others = [u for u in units if u != alone[0]]
    assert all(_kernels(table_out, u, _enable_flags({"uint8"}, {"prod"})) == [] for u in others)
    got = _kernels(table_out, alone[0], ["-DHCCC_TABLE_GRID_KERNELS=1"] + _enable_flags({"uint8"}, {"prod"}))
    assert sorted(got) == ["hccc_table_grid_uint8_prod", "hccc_table_uint8_prod"]


def test_the_generic_source_keeps_every_kernel_and_grid_entry_for_the_runtime(table_out):
    got = _kernels(table_out, "hccc_table.cu", [])
    want = _valid(DTYPES, OPS)
    assert sorted(got) == sorted([f"hccc_table_{d}_{o}" for d, o in want]
                                 + [f"hccc_table_grid_{d}_{o}" for d, o in want])


def _make_n(out: Path, *args: str) -> subprocess.CompletedProcess:
    make = require_tool("make")
    return subprocess.run([make, "-n", "-C", str(out), *args], capture_output=True, text=True, timeout=60)


def _made_units(res: subprocess.CompletedProcess) -> list[str]:
    assert res.returncode == 0, res.stderr
    nvcc = [ln for ln in res.stdout.splitlines() if ln.startswith("nvcc ")]
    return [re.search(r"-c (\S+)", ln).group(1) for ln in nvcc]


@settings(max_examples=4, deadline=None)
@given(dtypes=st.sets(st.sampled_from(DTYPES), min_size=1), ops=st.sets(st.sampled_from(OPS), min_size=1))
def test_make_compiles_the_units_that_define_an_enabled_kernel_and_no_other(table_out, dtypes, ops):
    res = _make_n(table_out, f"HCCC_DTYPES={' '.join(sorted(dtypes))}", f"HCCC_OPS={' '.join(sorted(ops))}")
    flags = _enable_flags(dtypes, ops)
    want = [u for u in _units(table_out, "cu") if _kernels(table_out, u, flags)]
    assert sorted(_made_units(res)) == want
    assert all(all(f in ln for f in flags) for ln in res.stdout.splitlines() if ln.startswith("nvcc "))


def test_make_compiles_every_unit_by_default_the_costliest_first(table_out):
    made = _made_units(_make_n(table_out))
    assert sorted(made) == _units(table_out, "cu")
    cost = {u: sum(table_units.INSTANCE_COST_S[(d, o)] for d, o in _valid(DTYPES, OPS)
                   if f"hccc_table_{d}_{o}" in _kernels(table_out, u, [])) for u in made}
    assert [cost[u] for u in made] == sorted(cost.values(), reverse=True)
    res = _make_n(table_out, "HCCC_DTYPES=float32 float128")
    assert res.returncode != 0 and "unknown HCCC_DTYPES/HCCC_OPS entry 'float128'" in res.stderr


def test_the_default_units_are_balanced_by_the_measured_costs():
    """The longest-processing-time bound, recomputed from the cost table: no unit's instances cost
    more than the cheapest unit's plus the costliest instance; every instance has a measured cost."""
    inst = sorted(_valid(DTYPES, OPS))
    assert sorted(table_units.INSTANCE_COST_S) == inst
    loads = [sum(table_units.INSTANCE_COST_S[i] for i in u.instances) for u in table_units.default_units()]
    assert max(loads) - min(loads) <= max(table_units.INSTANCE_COST_S.values()) + 1e-9
    assert sum(loads) == pytest.approx(sum(table_units.INSTANCE_COST_S.values()))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_plan_units_partitions_and_balances_any_instances(n, data):
    """Any subset of the instances, any unit count: a partition (each once, none lost), at most
    ``n`` non-empty units numbered by cost, the largest first, each listing its instances in the
    given order, the greedy bound (max - min load <= the costliest instance)."""
    everything = sorted(table_units.INSTANCE_COST_S)
    chosen = data.draw(st.lists(st.sampled_from(everything), min_size=1, unique=True))
    units = table_units.plan_units(chosen, n)
    assert len(units) == min(n, len(chosen)) and [u.index for u in units] == list(range(len(units)))
    flat = [i for u in units for i in u.instances]
    assert sorted(flat) == sorted(chosen)
    for u in units:
        assert u.instances and list(u.instances) == [i for i in chosen if i in u.instances]
    loads = [sum(table_units.INSTANCE_COST_S[i] for i in u.instances) for u in units]
    assert loads == sorted(loads, reverse=True)
    assert [u.cost_s for u in units] == pytest.approx([table_units.UNIT_COST_S + x for x in loads])
    assert loads[0] - loads[-1] <= max(table_units.INSTANCE_COST_S[i] for i in chosen) + 1e-9


def test_plan_units_names_what_it_cannot_place():
    with pytest.raises(KeyError, match=r"no measured compile cost for the instance \(float128, sum\)"):
        table_units.plan_units([("float128", "sum")], 2)
    with pytest.raises(ValueError, match="at least 1"):
        table_units.plan_units([("float32", "sum")], 0)


def test_the_cmake_package_knows_every_dtype_and_op():
    text = (ROOT / "driver" / "cmake" / "hccc-config.cmake").read_text()
    for var, names in (("HCCC_KNOWN_DTYPES", DTYPES), ("HCCC_KNOWN_OPS", OPS)):
        m = re.search(rf"^set\({var} ([^)]*)\)", text, re.M)
        assert m is not None and m.group(1).split() == names, var


@pytest.mark.parametrize("dtypes,ops", [(DTYPES, OPS), (["float32", "uint8"], ["prod", "avg"])])
def test_the_cmake_unit_choice_is_the_makefiles(table_out, tmp_path, dtypes, ops):
    """hccc_table_units.cmake (the emitted CMakeLists.txt's and the package's) picks the units the
    Makefile does, in its order."""
    cmake = require_tool("cmake")
    script = tmp_path / "units.cmake"
    script.write_text(f'include({table_out}/hccc_table_units.cmake)\n'
                      f'hccc_table_units(u cuda "{";".join(dtypes)}" "{";".join(ops)}")\n'
                      'message(STATUS "units=${u}")\n')
    res = subprocess.run([cmake, "-P", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = re.search(r"units=(.*)", res.stdout).group(1).split(";")
    made = _made_units(_make_n(table_out, f"HCCC_DTYPES={' '.join(dtypes)}", f"HCCC_OPS={' '.join(ops)}"))
    assert got == made


@pytest.mark.slow
def test_make_builds_the_library_of_a_rare_instance_without_grid_entries(tmp_path):
    """nvcc through the emitted Makefile, one instance: the one unit that holds it, its per-rank
    kernel, no one-grid entry."""
    require_tool("nvcc")
    out = tmp_path / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table"]) == 0
    res = subprocess.run(["make", "-j2", "-C", str(out), "HCCC_DTYPES=uint8", "HCCC_OPS=prod"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    lib = out / "libhccc_table_cuda.a"
    holder = [u for u in _units(out, "cu") if _kernels(out, u, _enable_flags({"uint8"}, {"prod"}))]
    assert subprocess.run(["ar", "t", str(lib)], capture_output=True, text=True).stdout.split() == \
        [f"{u}.o" for u in holder]
    syms = subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
    assert re.search(r" T hccc_table_uint8_prod$", syms, re.M) and "hccc_table_grid_" not in syms


@pytest.mark.slow
def test_make_j2_builds_a_kernel_of_every_default_instance(tmp_path):
    """nvcc through the emitted Makefile, every default instance (``make -j2``): the library
    defines one kernel per (dtype, op) pair of the dtype table, and no one-grid entry."""
    require_tool("nvcc")
    out = tmp_path / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table", "--target", "cuda"]) == 0
    res = subprocess.run(["make", "-j2", "-C", str(out)], capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    syms = subprocess.run(["nm", str(out / "libhccc_table_cuda.a")], capture_output=True, text=True).stdout
    got = re.findall(r" T (hccc_table_\w+)$", syms, re.M)
    assert sorted(got) == sorted(f"hccc_table_{d}_{o}" for d, o in _valid(DTYPES, OPS))


@pytest.mark.parametrize("dtype,op", [("uint8", "prod"), ("float64", "avg")])
def test_a_rare_instance_runs_in_the_table_mode_on_the_cpu_emulation(dtype, op):
    """What the default build of a library would leave out the runtime builds on first use."""
    require_tool("g++")
    ir = build_program(load_rccl(RING), chunk_bytes=64)
    counts = default_counts(ir, dtype)
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts[1::4] + counts[-1:],
                         inplace=(False, True), codegen="table")
