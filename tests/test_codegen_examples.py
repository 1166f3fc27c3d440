"""Code generation for every example algorithm: lowered with the real pipeline and compiled with
nvcc / hipcc (a subset of ranks per example to bound the time). Running every example's kernels on
the CPU emulation is in test_kernels_examples.py.

The default run compiles one example per compiler on its own (its sources must be self-contained);
the slow set compiles every example's subset, all in one translation unit per compiler (a
compiler's fixed cost paid once instead of per example: seconds instead of many minutes)."""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from hccc.compiler.backend.codegen import generate
from hccc.util.dtypes import only_instance_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
# float32 / sum only (nvcc splits -D values at commas: use the HCCC_ENABLE_* switches)
ONE_INSTANCE = only_instance_flags("float32", "sum")
EXAMPLES = sorted((ROOT / "examples").glob("*.rccl"))
#: compiled on its own by the default run, one example per compiler (nvcc: a reduction through
#: forwarding chains; hipcc: an AllToAll through scratch)
DEFAULT_RUN = {"cuda": "hm_allreduce_2x4", "hip": "hierarchical_alltoall_2x4"}
FLAGS = {"cuda": ["-std=c++17", "-arch=sm_90", *ONE_INSTANCE],
         "hip": ["-std=c++17", "--offload-arch=gfx90a", "-Wall", *ONE_INSTANCE]}


def _lower(path, chunk_bytes):
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.frontend.load import load_rccl
    return build_program(load_rccl(path), chunk_bytes=chunk_bytes)


def _subset_includes(gen, path, platform, ranks=("first", "last")):
    """Generate ``path``'s kernels into ``gen``; the ``#include`` lines of a representative subset
    (``ranks``: the first rank, the last or both), one (dtype, op) instantiation: every
    instantiation is compiled by the hand-made-IR tests in test_codegen.py."""
    ir = _lower(path, 1 << 20)
    gen.mkdir()
    generate(ir, gen, platforms=[platform] * ir.nranks)
    man = json.loads((gen / "manifest.json").read_text())
    which = {"first": 0, "last": ir.nranks - 1}
    return [f'#include "{gen.name}/{man["ranks"][r]["source"]}"\n' for r in sorted({which[k] for k in ranks})]


def _compile(tmp_path, includes, platform, compiler):
    tu = tmp_path / f"subset.{'cu' if platform == 'cuda' else 'hip'}"
    tu.write_text("".join(includes))
    res = subprocess.run([compiler, *FLAGS[platform], "-I", str(tmp_path), "-c", str(tu), "-o", str(tmp_path / "s.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr[-4000:]


# nvcc pays about 1.7 s of CPU a rank source (hipcc's cost is its fixed one): the default run
# compiles the first rank's source on its own, the slow set the last rank's (and every example's
# first and last ranks in one unit, below)
@pytest.mark.parametrize("rank", ["first", pytest.param("last", marks=pytest.mark.slow)])
def test_example_compiles_nvcc(tmp_path, nvcc, rank):
    path = ROOT / "examples" / f"{DEFAULT_RUN['cuda']}.rccl"
    _compile(tmp_path, _subset_includes(tmp_path / "gen", path, "cuda", (rank,)), "cuda", nvcc)


def test_example_compiles_hipcc(tmp_path, hipcc, monkeypatch):
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    path = ROOT / "examples" / f"{DEFAULT_RUN['hip']}.rccl"
    _compile(tmp_path, _subset_includes(tmp_path / "gen", path, "hip"), "hip", hipcc)


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["cuda", "hip"])
def test_every_example_compiles_in_one_unit(tmp_path, platform, request, monkeypatch):
    compiler = request.getfixturevalue("nvcc" if platform == "cuda" else "hipcc")
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    includes = [line for p in EXAMPLES for line in _subset_includes(tmp_path / p.stem, p, platform)]
    assert len(includes) >= len(EXAMPLES)
    _compile(tmp_path, includes, platform, compiler)
