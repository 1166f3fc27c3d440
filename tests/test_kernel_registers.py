"""Registers and spills of the CUDA kernels, from ``ptxas -v`` (sm_90): every rank kernel and
one-grid entry keeps to 64 registers per thread, so two 512-thread blocks fit on an SM (65,536
registers) and the runtime can keep every thread block of a run resident; the copy / reduce engine,
compiled on its own at that budget, does not spill at all (its loops keep their vectors in
registers). What remains in the call tree are the register saves of the calls between the block
function, ``hccc_prim``, its unit functions and the engine (reported as spill bytes): bounded here.
``hccc_prim`` itself spilled 560 bytes (140 stored, 420 loaded) with the lock-step sync, whose
one function held the waits, the data path and the posts; split into the unit loop and its
functions (wait, data, arrival) it keeps at most PRIM_SPILL_BYTES (measured 118-134, nvcc 13),
and the whole per-message call chain (hccc_prim and its unit functions) at most
CHAIN_SPILL_BYTES (measured 324-384), under what hccc_prim alone spilled before."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from hccc.compiler.backend.codegen import generate
from hccc.compiler.pipeline import load_program
from hccc.runtime.cuda import cuda_flags
from hccc.runtime.gpu import translation_unit
from hccc.runtime.platform import Instance

from conftest import require_tool

#: nvcc on the emitted kernels: tens of seconds each on 2 cores
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: registers per thread the kernels keep to (two 512-thread blocks per SM)
BUDGET = 64
#: spill bytes (stores + loads) ptxas may report for hccc_prim, and for hccc_prim with its unit
#: functions (hccc_unit_wait / _data / _arrive) together (module docstring)
PRIM_SPILL_BYTES = 160
CHAIN_SPILL_BYTES = 448


def ptxas_report(text: str) -> dict[str, dict]:
    """``ptxas -v`` output -> function name -> {stack, spill_stores, spill_loads, registers}
    (registers only for entries)."""
    out: dict[str, dict] = {}
    name = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name is not None:
            out[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name is not None:
            out[name]["registers"] = int(m.group(1))
    return out


def test_report_parser():
    text = ("ptxas info    : Function properties for k\n"
            "    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n"
            "ptxas info    : Used 64 registers, used 1 barriers\n"
            "ptxas info    : Function properties for _Z1fv\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
    assert ptxas_report(text) == {"k": {"stack": 16, "spill_stores": 4, "spill_loads": 8, "registers": 64},
                                  "_Z1fv": {"stack": 0, "spill_stores": 0, "spill_loads": 0}}


def _ptxas(tool, src: Path, inc: Path, single_gpu=False) -> dict[str, dict]:
    res = subprocess.run([tool, *cuda_flags("sm_90", single_gpu), "-Xptxas", "-v", "-I", str(inc),
                          "-o", str(src.with_suffix(".cubin")), str(src)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return ptxas_report(res.stderr)


@pytest.mark.parametrize("example,dtype,op", [("ring_allreduce_8", "float32", "sum"),
                                              ("hm_allreduce_4x8", "bfloat16", "max")])
def test_rank_kernels_keep_to_64_registers(tmp_path, example, dtype, op):
    tool = require_tool("nvcc")
    ir = load_program(ROOT / "examples" / f"{example}.rccl")
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["nthreads"]["cuda"] == 512
    src = tmp_path / "r0.cu"
    src.write_text(translation_unit(man, Instance(dtype, op), [0], "cuda"))
    rep = _ptxas(tool, src, tmp_path)
    entries = {k: v for k, v in rep.items() if "registers" in v and k != "hccc_runtime_gate"}
    assert entries, rep
    for name, v in entries.items():
        assert v["registers"] <= BUDGET, (name, v)
        assert v["spill_stores"] == 0 and v["spill_loads"] == 0, (name, v)
    spill = {n: v["spill_stores"] + v["spill_loads"] for n, v in rep.items() if "spill_stores" in v}
    prim = [b for n, b in spill.items() if "hccc_prim" in n]
    chain = [b for n, b in spill.items() if re.search(r"hccc_prim|hccc_unit_(?:wait|data|arrive)", n)]
    assert len(prim) == 1 and len(chain) == 4, sorted(spill)
    assert prim[0] <= PRIM_SPILL_BYTES, spill
    assert sum(chain) <= CHAIN_SPILL_BYTES, spill


def test_engine_does_not_spill_at_the_budget(tmp_path):
    """Every instantiation of the copy / reduce engine, as the kernel of a 512-thread block with
    two blocks per SM: no spill, no stack."""
    tool = require_tool("nvcc")
    ir = load_program(ROOT / "examples" / "ring_allreduce_8.rccl")
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    lines = ['#include "hccc_prims.h"']
    n = 0
    for ctype in ("float", "hccc_half", "hccc_bf16", "int32_t"):
        for red in ("HCCC_SUM", "HCCC_MAX"):
            for hasb, nout in (("false", 1), ("false", 2), ("true", 1), ("true", 2)):
                lines.append(f'extern "C" __global__ void HCCC_LAUNCH_BOUNDS(512) e{n}(const {ctype}* a, '
                             f'const {ctype}* b, {ctype}* o1, {ctype}* o2, uint64_t len) {{ '
                             f'hccc_combine<{ctype}, {red}, {hasb}, {nout}>(a, b, o1, o2, len, '
                             f'hccc_tid(), hccc_nthreads()); }}')
                n += 1
    src = tmp_path / "engine.cu"
    src.write_text("\n".join(lines) + "\n")
    rep = _ptxas(tool, src, tmp_path)
    for k in range(n):
        v = rep[f"e{k}"]
        assert v["registers"] <= BUDGET and v["spill_stores"] == 0 and v["spill_loads"] == 0 \
            and v["stack"] == 0, (k, v)
    for name, v in rep.items():
        if name.startswith("_Z12hccc_combine"):
            assert v["spill_stores"] == 0 and v["spill_loads"] == 0, (name, v)
