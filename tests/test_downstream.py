"""examples/downstream: a CMake project that runs hccc at build time and builds a static library."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "downstream"
TRIM = "-DHCCC_ENABLE_FLOAT16=0 -DHCCC_ENABLE_BFLOAT16=0 -DHCCC_ENABLE_INT32=0 " \
       "-DHCCC_ENABLE_MAX=0 -DHCCC_ENABLE_MIN=0"


def _hccc_works() -> str | None:
    exe = shutil.which("hccc")
    if exe is None:
        return None
    res = subprocess.run([exe, "check", str(PROJECT / "algo.rccl")], capture_output=True, text=True)
    return exe if res.returncode == 0 else None


def test_downstream_cmake_build_and_regenerate(tmp_path, nvcc):
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    hccc = _hccc_works()
    if hccc is None:
        pytest.skip("the `hccc` command is not installed or cannot compile algo.rccl yet")
    src = tmp_path / "src"
    shutil.copytree(PROJECT, src)
    build = tmp_path / "build"
    env = dict(os.environ)
    res = subprocess.run(["cmake", "-S", str(src), "-B", str(build), f"-DHCCC_EXECUTABLE={hccc}",
                          f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCMAKE_CUDA_FLAGS={TRIM}"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "hccc: generating" in res.stdout
    lib = build / "libring_collectives.a"
    assert lib.exists()
    syms = subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
    for r in range(4):
        assert f"hccc_ring_r{r}_float32_sum" in syms
    manifest = (build / "gen" / "manifest.json").read_text()
    assert '"nwarps": 16' in manifest

    # nothing changed: no regeneration
    res = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert res.returncode == 0 and "hccc: generating" not in res.stdout

    # the .rccl changes: hccc reruns and the library is rebuilt with the new kernels
    algo = src / "algo.rccl"
    algo.write_text(algo.read_text().replace("nWarps=16", "nWarps=8"))
    res = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "hccc: generating" in res.stdout
    assert '"nwarps": 8' in (build / "gen" / "manifest.json").read_text()
    assert "HCCC_LAUNCH_BOUNDS(256)" in (build / "gen" / "ring_r0.cu").read_text()


# ---------------------------------------------------------------------------- one rank per process
def test_downstream_multiprocess_program_on_the_cpu_emulation(tmp_path):
    """The CMake project with -DHCCC_CPU_EMULATION=ON builds hccc_multiprocess (the emitted
    hccc_host.h over the CPU emulation) and runs every rank in its own process: handles exchanged
    as bytes through files, three AllReduce calls at uneven sizes, every element checked."""
    from hccc.runtime import shm

    if shutil.which("cmake") is None or shutil.which("g++") is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail("cmake and g++ are required (HCCC_REQUIRE_COMPILERS is set)")
        pytest.skip("cmake or g++ not installed")
    hccc = _hccc_works()
    if hccc is None:
        pytest.skip("the `hccc` command is not installed or cannot compile algo.rccl yet")
    build = tmp_path / "build"
    res = subprocess.run(["cmake", "-S", str(PROJECT), "-B", str(build), f"-DHCCC_EXECUTABLE={hccc}",
                          "-DHCCC_CPU_EMULATION=ON"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    before = set(shm.ours())
    res = subprocess.run([str(build / "hccc_multiprocess"), str(exchange), "30"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n")[:-1]) == [f"rank {r}: OK (3 calls)" for r in range(4)]
    assert set(shm.ours()) - before == set()      # every name was dropped after connecting


def _host_tu(tmp_path, target: str) -> pathlib.Path:
    from hccc.compiler.pipeline import CompileOptions, compile_program, load_program

    gen = tmp_path / f"gen_{target}"
    compile_program(load_program(PROJECT / "algo.rccl"), gen, CompileOptions(target=target))
    ext = "cu" if target == "cuda" else "hip"
    tu = tmp_path / f"host_api.{ext}"
    tu.write_text(f'#include "ring_{target}.{ext}"\n#include "{PROJECT / "multiprocess.cpp"}"\n')
    return tu


def test_host_api_compiles_with_nvcc(tmp_path, nvcc):
    """The CUDA path of hccc_host.h (cudaIpcGetMemHandle / cudaIpcOpenMemHandle, cudaLaunchKernel)
    compiles with the kernels; it needs a GPU to run."""
    tu = _host_tu(tmp_path, "cuda")
    res = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-I",
                          str(tu.parent / "gen_cuda"), *TRIM.split(), "-c", str(tu), "-o",
                          str(tmp_path / "a.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


def test_host_api_compiles_with_hipcc(tmp_path, hipcc):
    """The HIP path (hipExtMallocWithFlags fine-grained memory, hipIpc*) compiles for gfx90a."""
    tu = _host_tu(tmp_path, "hip")
    env = dict(os.environ, HIP_PLATFORM="amd")
    res = subprocess.run([hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Werror", "-I",
                          str(tu.parent / "gen_hip"), *TRIM.split(), "-c", str(tu), "-o",
                          str(tmp_path / "a.o")], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
