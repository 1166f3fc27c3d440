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
