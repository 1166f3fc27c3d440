"""Code generation for every example algorithm: lowered with the real pipeline and compiled with
nvcc / hipcc (a subset of ranks per example to bound the time). Running every example's kernels on
the CPU emulation is in test_kernels_examples.py."""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from hccc.compiler.backend.codegen import generate

ROOT = pathlib.Path(__file__).resolve().parent.parent
# float32 / sum only (nvcc splits -D values at commas: use the HCCC_ENABLE_* switches)
ONE_INSTANCE = ["-DHCCC_ENABLE_FLOAT16=0", "-DHCCC_ENABLE_BFLOAT16=0", "-DHCCC_ENABLE_INT32=0",
                "-DHCCC_ENABLE_MAX=0", "-DHCCC_ENABLE_MIN=0"]
EXAMPLES = sorted((ROOT / "examples").glob("*.rccl"))
#: compiled by the default run, one example per compiler (nvcc: a reduction through forwarding
#: chains; hipcc: an AllToAll through scratch); every other compile is marked slow (``pytest -m
#: slow``, run by CI)
DEFAULT_RUN = {"cuda": "hm_allreduce_2x4", "hip": "hierarchical_alltoall_2x4"}


def _cases(platform):
    return [pytest.param(p, id=p.stem, marks=() if p.stem == DEFAULT_RUN[platform] else pytest.mark.slow)
            for p in EXAMPLES]


def _lower(path, chunk_bytes):
    try:
        from hccc.compiler.passes.build import build_program
        from hccc.compiler.frontend.load import load_rccl
    except ImportError as exc:  # pipeline not assembled yet
        pytest.skip(f"pipeline not available: {exc}")
    return build_program(load_rccl(path), chunk_bytes=chunk_bytes)


def _compile_subset(tmp_path, path, platform, compiler_cmd):
    ir = _lower(path, 1 << 20)
    gen = tmp_path / "gen"
    gen.mkdir()
    generate(ir, gen, platforms=[platform] * ir.nranks)
    man = json.loads((gen / "manifest.json").read_text())
    # a representative subset (first and last rank) in one translation unit, one (dtype, op)
    # instantiation: every instantiation is compiled by the hand-made-IR tests in test_codegen.py
    picks = sorted({0, ir.nranks - 1})
    tu = gen / f"subset.{ 'cu' if platform == 'cuda' else 'hip'}"
    tu.write_text("".join(f'#include "{man["ranks"][r]["source"]}"\n' for r in picks))
    res = subprocess.run(compiler_cmd + ["-I", str(gen), "-c", str(tu), "-o", str(tmp_path / "s.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr[-4000:]


@pytest.mark.parametrize("path", _cases("cuda"))
def test_example_compiles_nvcc(tmp_path, path, nvcc):
    _compile_subset(tmp_path, path, "cuda", [nvcc, "-std=c++17", "-arch=sm_90", *ONE_INSTANCE])


@pytest.mark.parametrize("path", _cases("hip"))
def test_example_compiles_hipcc(tmp_path, path, hipcc, monkeypatch):
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    _compile_subset(tmp_path, path, "hip", [hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Wall",
                                            *ONE_INSTANCE])
