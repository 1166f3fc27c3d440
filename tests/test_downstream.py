"""examples/downstream: a CMake project that finds hccc's CMake package (find_package(hccc)) and
declares its kernels with hccc_add_collective, in both code-generation modes, built with the CPU
emulation (g++), nvcc and hipcc."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from cli_runs import run_cli
from conftest import require_tool, shm_leaks

from hccc.util.dtypes import only_instance_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "downstream"
TRIM = " ".join(only_instance_flags("float32", "sum"))


def _hccc() -> str:
    """The hccc command of the interpreter running the tests (else the one on PATH)."""
    here = pathlib.Path(sys.executable).parent / "hccc"
    exe = str(here) if here.exists() else shutil.which("hccc")
    if exe is None:
        pytest.skip("the hccc command is not installed")
    return exe


def _run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res


def _cmake_dir() -> str:
    """The folder ``hccc --cmake-dir`` prints (in this process: the command itself is run by
    :func:`_configure`, and by CMake for the version)."""
    res = run_cli("--cmake-dir")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _configure(tmp_path, *defs):
    require_tool("cmake")
    hccc = _hccc()
    cmake_dir = _run([hccc, "--cmake-dir"]).stdout.strip()
    assert (pathlib.Path(cmake_dir) / "hccc-config.cmake").is_file()
    # python -m hccc prints the same folder
    assert _run([sys.executable, "-m", "hccc", "--cmake-dir"]).stdout.strip() == cmake_dir
    src = tmp_path / "src"
    shutil.copytree(PROJECT, src)
    build = tmp_path / "build"
    env = dict(os.environ, HCCC_CACHE_DIR=str(tmp_path / "cache"))
    _run(["cmake", "-S", src, "-B", build, f"-Dhccc_DIR={cmake_dir}", f"-DHCCC_EXECUTABLE={hccc}",
          *defs], env=env)
    return src, build, env


def _symbols(lib: pathlib.Path) -> str:
    assert lib.is_file(), lib
    return subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout


@pytest.mark.slow
@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_downstream_builds_and_regenerates_on_the_cpu_toolchain(tmp_path, codegen):
    require_tool("g++")
    src, build, env = _configure(tmp_path, "-DHCCC_EMULATE_ON_CPU=ON", f"-DDOWNSTREAM_CODEGEN={codegen}",
                                 "-DHCCC_DTYPES=float32;int32", "-DHCCC_OPS=sum")
    res = _run(["cmake", "--build", build, "-j2"], env=env)
    assert "hccc: generating ring_kernels" in res.stdout
    gen = build / "ring_kernels.hccc"
    assert '"nwarps": 16' in (gen / "manifest.json").read_text()
    assert (build / "libring_collectives.a").is_file()
    if codegen == "table":
        syms = _symbols(build / "libhccc_table_cuda.a")
        assert "hccc_table_float32_sum" in syms and "hccc_table_int32_sum" in syms
        assert "hccc_table_float16_sum" not in syms and "hccc_table_float32_max" not in syms
        assert (gen / "ring.table").is_file() and not list(gen.glob("ring_r*.cu"))
    else:
        syms = _symbols(build / "libring_kernels.a")
        for r in range(4):     # one object per rank, the configured instantiations only
            assert f"hccc_ring_r{r}_float32_sum" in syms and f"hccc_ring_r{r}_int32_sum" in syms
            assert f"hccc_ring_r{r}_float32_max" not in syms
        objs = _run(["ar", "t", build / "libring_kernels.a"]).stdout.split()
        assert sorted(objs) == [f"ring_r{r}.cu.o" for r in range(4)]

    # nothing changed: nothing regenerated
    res = _run(["cmake", "--build", build, "-j2"], env=env)
    assert "hccc: generating" not in res.stdout

    # the algorithm changes (here: its rank count and name too): the configure step asks hccc for
    # the new output list, hccc regenerates, and only what depends on the algorithm is rebuilt
    algo = src / "algo.rccl"
    text = algo.read_text().replace("nWarps=16", "nWarps=8")
    algo.write_text(text)
    res = _run(["cmake", "--build", build, "-j2"], env=env)
    assert "hccc: generating ring_kernels" in res.stdout
    assert '"nwarps": 8' in (gen / "manifest.json").read_text()
    if codegen == "table":
        assert not re.search(r"hccc_table\w*\.cu\.o", res.stdout)   # the generic kernels are not rebuilt
    else:
        assert "HCCC_LAUNCH_BOUNDS(256)" in (gen / "ring_r0.cu").read_text()
        assert "ring_r0.cu.o" in res.stdout
    from hccc.compiler.frontend import generators as g
    algo.write_text(g.ring_allreduce_rccl(6, name="ring6"))
    res = _run(["cmake", "--build", build, "-j2"], env=env)
    assert "hccc: generating ring_kernels" in res.stdout
    if codegen == "specialized":
        assert "hccc_ring6_r5_float32_sum" in _symbols(build / "libring_kernels.a")
    else:
        assert (gen / "ring6.table").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_downstream_builds_with_nvcc(tmp_path, nvcc, codegen):
    _, build, env = _configure(tmp_path, f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DDOWNSTREAM_CODEGEN={codegen}")
    _run(["cmake", "--build", build, "-j2"], env=env)
    lib = build / ("libhccc_table_cuda.a" if codegen == "table" else "libring_kernels.a")
    syms = _symbols(lib)
    want = ["hccc_table_float32_sum"] if codegen == "table" else [f"hccc_ring_r{r}_float32_sum" for r in range(4)]
    assert all(w in syms for w in want)
    assert "float16" not in syms                    # HCCC_DTYPES=float32 (the project's default)
    assert (build / "libring_collectives.a").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_downstream_builds_with_hipcc(tmp_path, hipcc, codegen):
    _, build, env = _configure(tmp_path, "-DDOWNSTREAM_PLATFORM=hip", f"-DDOWNSTREAM_CODEGEN={codegen}")
    _run(["cmake", "--build", build, "-j2"], env=env)
    lib = build / ("libhccc_table_hip.a" if codegen == "table" else "libring_kernels.a")
    syms = _symbols(lib)
    want = ["hccc_table_float32_sum"] if codegen == "table" else [f"hccc_ring_r{r}_float32_sum" for r in range(4)]
    assert all(w in syms for w in want), syms[:2000]


def test_find_package_checks_the_version(tmp_path):
    require_tool("cmake")
    hccc = _hccc()
    cmake_dir, version = _cmake_dir(), run_cli("--version").stdout.split()[-1]
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(v LANGUAGES NONE)\n"
        "find_package(hccc ${WANT} REQUIRED)\nmessage(STATUS \"found hccc ${hccc_VERSION}\")\n")
    major = version.split(".")[0]
    res = _run(["cmake", "-S", tmp_path, "-B", tmp_path / "ok", f"-Dhccc_DIR={cmake_dir}",
                f"-DHCCC_EXECUTABLE={hccc}", f"-DWANT={major}.0"])
    assert f"found hccc {version}" in res.stdout
    res = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "bad"), f"-Dhccc_DIR={cmake_dir}",
                          f"-DHCCC_EXECUTABLE={hccc}", f"-DWANT={int(major) + 1}.0"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "version" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("codegen", ["table", "specialized"])
def test_hccc_add_collective_on_a_mixed_cluster(tmp_path, codegen):
    """TOPOLOGY of NVIDIA and AMD nodes: a CUDA and a HIP library (or both table libraries) under
    one target, built with the CPU toolchain."""
    require_tool("cmake")
    require_tool("g++")
    hccc = _hccc()
    cmake_dir = _run([hccc, "--cmake-dir"]).stdout.strip()
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "examples" / "c2c" / "c2c_allreduce_mixed_v100_w7800.rccl", src / "algo.rccl")
    shutil.copy(ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo", src / "cluster.topo")
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(mixed LANGUAGES CXX)\nfind_package(hccc REQUIRED)\n"
        f"hccc_add_collective(k algo.rccl TOPOLOGY cluster.topo CODEGEN {codegen} DTYPES float32 OPS sum)\n"
        "get_target_property(d k HCCC_OUTPUT_DIR)\nmessage(STATUS \"hccc output: ${d}\")\n")
    build = tmp_path / "build"
    env = dict(os.environ, HCCC_CACHE_DIR=str(tmp_path / "cache"))
    res = _run(["cmake", "-S", src, "-B", build, f"-Dhccc_DIR={cmake_dir}", f"-DHCCC_EXECUTABLE={hccc}",
                "-DHCCC_EMULATE_ON_CPU=ON"], env=env)
    assert f"hccc output: {build / 'k.hccc'}" in res.stdout
    _run(["cmake", "--build", build, "-j2", "--target", "k_generate"], env=env)
    import json
    man = json.loads((build / "k.hccc" / "manifest.json").read_text())
    plats = [e["platform"] for e in man["ranks"]]
    assert set(plats) == {"cuda", "hip"} and man["topology"]["name"]
    if codegen == "table":
        _run(["cmake", "--build", build, "-j2", "--target", "hccc_table_cuda", "hccc_table_hip"], env=env)
        for pl in ("cuda", "hip"):
            assert "hccc_table_float32_sum" in _symbols(build / f"libhccc_table_{pl}.a")
    else:
        _run(["cmake", "--build", build, "-j2", "--target", "k_cuda", "k_hip"], env=env)
        for pl in ("cuda", "hip"):
            syms = _symbols(build / f"libk_{pl}.a")
            mine = [r for r, p in enumerate(plats) if p == pl]
            assert all(f"_r{r}_float32_sum" in syms for r in mine)
            assert not any(f"_r{r}_float32_sum" in syms for r in range(len(plats)) if r not in mine)


@pytest.mark.slow
# ---------------------------------------------------------------------------- one rank per process
def test_downstream_multiprocess_program_on_the_cpu_emulation(tmp_path):
    """The CMake project with -DHCCC_EMULATE_ON_CPU=ON builds hccc_multiprocess (the emitted
    hccc_host.h over the CPU emulation) and runs every rank in its own process: handles exchanged
    as bytes through files, three AllReduce calls at uneven sizes, every element checked."""
    from hccc.runtime import shm

    require_tool("g++")
    _, build, env = _configure(tmp_path, "-DHCCC_EMULATE_ON_CPU=ON", "-DDOWNSTREAM_CODEGEN=specialized")
    _run(["cmake", "--build", build, "-j2"], env=env)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    before = set(shm.ours())
    res = subprocess.run([str(build / "hccc_multiprocess"), str(exchange), "30"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == [f"rank {r}: OK (3 calls)" for r in range(4)]
    assert shm_leaks(before) == set()      # every name was dropped after connecting


def _host_tu(tmp_path, target: str) -> pathlib.Path:
    from hccc.compiler.pipeline import CompileOptions, compile_program, load_program

    gen = tmp_path / f"gen_{target}"
    compile_program(load_program(PROJECT / "algo.rccl"), gen, CompileOptions(target=target))
    ext = "cu" if target == "cuda" else "hip"
    tu = tmp_path / f"host_api.{ext}"
    tu.write_text(f'#include "ring_{target}.{ext}"\n#include "{PROJECT / "multiprocess.cpp"}"\n')
    return tu


@pytest.mark.slow
def test_host_api_compiles_with_nvcc(tmp_path, nvcc):
    """The CUDA path of hccc_host.h (cudaIpcGetMemHandle / cudaIpcOpenMemHandle, cudaLaunchKernel)
    compiles with the kernels; it needs a GPU to run."""
    tu = _host_tu(tmp_path, "cuda")
    res = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-I",
                          str(tu.parent / "gen_cuda"), *TRIM.split(), "-c", str(tu), "-o",
                          str(tmp_path / "a.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.slow
def test_host_api_compiles_with_hipcc(tmp_path, hipcc):
    """The HIP path (hipExtMallocWithFlags fine-grained memory, hipIpc*) compiles for gfx90a."""
    tu = _host_tu(tmp_path, "hip")
    env = dict(os.environ, HIP_PLATFORM="amd")
    res = subprocess.run([hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Werror", "-I",
                          str(tu.parent / "gen_hip"), *TRIM.split(), "-c", str(tu), "-o",
                          str(tmp_path / "a.o")], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-4000:]


def test_a_path_with_a_list_separator_is_refused_clearly(tmp_path):
    """CMake splits ``a;b.rccl`` into two arguments: hccc_add_collective says so instead."""
    require_tool("cmake")
    hccc = _hccc()
    cmake_dir = _cmake_dir()
    shutil.copy(ROOT / "examples" / "ring_allreduce_8.rccl", tmp_path / "a;b.rccl")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(p LANGUAGES CXX)\nfind_package(hccc REQUIRED)\n"
        "hccc_add_collective(ring \"${CMAKE_CURRENT_SOURCE_DIR}/a\\;b.rccl\")\n")
    res = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "b"), f"-Dhccc_DIR={cmake_dir}",
                          f"-DHCCC_EXECUTABLE={hccc}", "-DHCCC_EMULATE_ON_CPU=ON"], capture_output=True, text=True)
    assert res.returncode != 0 and "contains ';'" in res.stderr, res.stderr[-2000:]
