"""Single-GPU runs as one grid: the one-grid entry (``NAME_grid.cu``/``.hip``, and the table mode's
``hccc_table_grid_<dtype>_<op>``) runs every rank's thread blocks in one launch.

Checked here without a GPU: the block -> (rank, thread block) map of ``hccc_grid_locate`` against a
numpy oracle (compiled with g++ through the emitted headers); the manifest's ``grid`` field and the
emitted source; that the CPU emulation runs the entry (one launch per run, total blocks = the sum
of the ranks' thread blocks) and that its results equal the reference executor's for every dtype
and operator, uneven sizes, in place and out of place, the specialised and the table kernels, and
random programs; that the per-rank launches (what runs across GPUs) stay correct. The entry's use
of the examples at edge sizes is in test_kernels_examples.py (the CPU default is one grid); the
CUDA launch path (cooperative launch, residency refusal) is in test_runtime_cuda.py.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.backend.codegen import generate
from hccc.compiler.backend.table_codegen import generate_table
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.launcher import Runner
from hccc.testing import (assert_kernels_match, describe_failure, kernel_cases, kernel_runner, run_case,
                          valid_programs)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")


# ---------------------------------------------------------------------------- the block map
_LOCATE_MAIN = r"""
#include "hccc_prims.h"
#include <stdio.h>
int main() {
  int n;
  while (scanf("%d", &n) == 1) {
    int32_t first[1100];
    for (int i = 0; i <= n; ++i) scanf("%d", &first[i]);
    for (int b = -1; b <= first[n]; ++b) {
      int tb = -7;
      const int r = hccc_grid_locate(first, n, b, &tb);
      printf("%d %d\n", r, r < 0 ? -7 : tb);
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def locate_exe(tmp_path_factory):
    d = tmp_path_factory.mktemp("locate")
    generate(build_program(gen.ring_allgather(2), chunk_bytes=64), d, platforms=["cuda"] * 2)
    (d / "main.cpp").write_text(_LOCATE_MAIN)
    subprocess.run(["g++", "-std=c++17", "-DHCCC_PLATFORM_CPU=1", "-I", str(d), str(d / "main.cpp"),
                    "-o", str(d / "locate"), "-pthread"], check=True)
    return d / "locate"


@settings(max_examples=25)
@given(ntbs=st.lists(st.integers(0, 9), min_size=1, max_size=40))
def test_grid_locate_maps_every_block_to_its_rank_and_thread_block(locate_exe, ntbs):
    """Every block in [0, total) maps to the rank owning it and its index among that rank's
    blocks (ranks without blocks are skipped); blocks outside map to no rank."""
    first = np.r_[0, np.cumsum(ntbs)]
    text = f"{len(ntbs)} " + " ".join(map(str, first.tolist())) + "\n"
    out = subprocess.run([str(locate_exe)], input=text, capture_output=True, text=True, check=True).stdout
    got = [tuple(map(int, line.split())) for line in out.splitlines()]
    # oracle: the owner of block b is the rank whose [first[r], first[r+1]) holds it
    owner = np.repeat(np.arange(len(ntbs)), ntbs)
    want = [(-1, -7)] + [(int(owner[b]), int(b - first[owner[b]])) for b in range(int(first[-1]))] + [(-1, -7)]
    assert got == want


# ---------------------------------------------------------------------------- emitted entry
def test_manifest_names_the_entry_of_each_platform_every_rank_has(tmp_path):
    ir = build_program(gen.hm_allreduce(2, 3), chunk_bytes=64)
    ntbs = [int(t) for t in ir.ntbs]
    (tmp_path / "one").mkdir()
    generate(ir, tmp_path / "one", platforms=[("cuda", "hip")] * ir.nranks)
    man = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert man["grid"] == {pl: {"kernel": f"hccc_{ir.name}_grid", "source": f"{ir.name}_grid.{ext}",
                                "blocks": sum(ntbs)} for pl, ext in (("cuda", "cu"), ("hip", "hip"))}
    src = (tmp_path / "one" / f"{ir.name}_grid.cu").read_text()
    first = np.r_[0, np.cumsum(ntbs)].tolist()
    assert f"first[{ir.nranks + 1}] = {{{', '.join(map(str, first))}}}" in src
    # each rank with blocks: its own program (the rank's source has it); one call of the engine;
    # no primitive rows of its own
    for r in range(ir.nranks):
        assert src.count(f"case {r}: return hccc_{ir.name}_r{r}_program();") == (1 if ntbs[r] else 0)
    assert src.count("hccc_run<T, RED>(") == 1
    assert "HCCC_P(" not in src
    # mixed platforms: no rank set shares one platform's source, so no entry
    (tmp_path / "mixed").mkdir()
    generate(ir, tmp_path / "mixed", platforms=["cuda", "hip"] * (ir.nranks // 2))
    man = json.loads((tmp_path / "mixed" / "manifest.json").read_text())
    assert man["grid"] == {} and not list((tmp_path / "mixed").glob("*_grid.*"))
    (tmp_path / "table").mkdir()
    generate_table(ir, tmp_path / "table", platforms=["hip"] * ir.nranks)
    man = json.loads((tmp_path / "table" / "manifest.json").read_text())
    assert man["grid"] == {"hip": {"kernel": "hccc_table_grid", "source": "hccc_table.hip",
                                   "blocks": sum(ntbs)}}


# ---------------------------------------------------------------------------- CPU emulation
class _CountingCpu(CpuPlatform):
    """The CPU platform, recording every launch: (kind, kernel, blocks)."""

    def __init__(self):
        super().__init__()
        self.launches = []

    def launch(self, fn, grid, block, args, stream):
        self.launches.append(("launch", fn.symbol, grid))
        super().launch(fn, grid, block, args, stream)

    def launch_grid(self, fn, grid, block, args, stream, *, abort_flag=0):
        self.launches.append(("grid", fn.symbol, grid))
        super().launch(fn, grid, block, args, stream)


@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_cpu_runs_every_rank_in_one_launch_by_default(codegen):
    ir = build_program(gen.hm_allreduce(2, 2), chunk_bytes=64)
    pf = _CountingCpu()
    with Runner(ir, pf, "int32", "sum", nthreads=2, codegen=codegen) as runner:
        assert runner.single_gpu and runner.grid_fn is not None
        res = runner.run(count=1001, iters=2, warmup=1)
        assert res.ok, res.stuck
        sym = f"hccc_{ir.name}_grid_int32_sum" if codegen == "specialized" else "hccc_table_grid_int32_sum"
        assert pf.launches == [("grid", sym, sum(int(t) for t in ir.ntbs))] * 3
    pf.launches.clear()
    with Runner(ir, pf, "int32", "sum", nthreads=2, codegen=codegen, one_grid=False) as runner:
        assert runner.grid_fn is None
        assert runner.run(count=1001).ok
        assert sorted(g for kind, _, g in pf.launches if kind == "launch") == sorted(int(t) for t in ir.ntbs)
        assert all(kind == "launch" for kind, _, _ in pf.launches)
    pf.close()


#: every dtype with every op (a build each): by default float32 with every op and each other dtype
#: with one op, so every dtype and every op runs through the one grid; the rest of the matrix in
#: the slow set
DTYPE_OPS = [pytest.param(d, o, marks=() if d == "float32" or o == OPS[i % len(OPS)] else pytest.mark.slow)
             for i, d in enumerate(DTYPES) for o in OPS]


@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
def test_one_grid_matches_oracle_for_every_dtype_and_op(dtype, op):
    """Uneven sizes (remainders, empty and one-element chunks), in place and out of place."""
    ir = build_program(gen.ring_allreduce(5, [0, 3, 1, 4, 2]), chunk_bytes=64)
    counts = [1, 7, 5 * 5 * 16 + 3, 5 * 64 * 3 + 11]
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts, inplace=(False, True),
                         nthreads=2, one_grid=True)
    assert kernel_runner(ir, "cpu", dtype, op, one_grid=True).grid_fn is not None     # the build just run


def test_one_grid_table_kernels_match_oracle():
    ir = build_program(gen.hm_allgather(2, 3), chunk_bytes=64)
    assert_kernels_match(ir, dtypes=["bfloat16"], ops=["max"], counts=[5, 6 * 16 * 2 + 1, 1000],
                         inplace=(False, True), nthreads=3, codegen="table", one_grid=True)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                        "alltoall"])
# two programs a collective by default (the channel and direct-mode files draw one grid or a
# kernel per rank for random programs too); the thorough profile ten times that
@settings(max_examples=examples(2))
@given(data=st.data())
def test_random_programs_one_grid_and_per_rank_match_oracle(collective, data):
    """The same random program and size through the one grid and through a kernel per rank."""
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes"))
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    op = data.draw(st.sampled_from(OPS), label="op")
    case = data.draw(kernel_cases(ir, dtypes=[dtype], ops=[op], max_microbatches=12), label="case")
    for one_grid in (True, False):
        res = run_case(ir, case, one_grid=one_grid)
        assert res.ok, (f"{alg.header.name} ({'one grid' if one_grid else 'per rank'}): "
                        + describe_failure(case, res))


def test_a_stuck_grid_times_out_and_names_the_rank_and_its_own_thread_block():
    """Ranks that receive before they send: the grid's blocks time out and exit, and the report
    names the rank and its thread block in the rank's numbering (rank 1's TB 0 is block 2)."""
    from codegen_irs import stuck_ir
    ir = stuck_ir()
    with Runner(ir, "cpu", "float32", "sum", nthreads=2, timeout_s=0.2) as runner:
        assert runner.grid_fn is not None and [int(n) * ir.nchannels for n in ir.ntbs] == [2, 2]
        res = runner.run(count=16)
    assert res.stuck is not None
    assert re.match(r"rank [01], TB 0 stuck in recv for chunk [01] \(micro-batch 0\): waiting for data "
                    r"from rank [01]", res.stuck), res.stuck
