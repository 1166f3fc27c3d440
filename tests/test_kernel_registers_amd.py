"""Registers, spills, scratch and calls of the HIP kernels, from the device assembly (hipcc -S) for
gfx90a (CDNA2, wave64) and gfx1030 (RDNA2, wave32).

For ring AllReduce 8, HM AllReduce 4x8 and direct AllToAll 8 (its blocks' primitives decoded into
a table too), float32 sum and bfloat16 max, single-GPU and system-scope builds, every rank kernel
and the one-grid entry:

* no spill: the code object's metadata (``amdhsa.kernels``) gives ``.sgpr_spill_count`` and
  ``.vgpr_spill_count`` 0 for every kernel;
* a block of the manifest's threads (1,024: 16 wave64 on gfx90a, 32 wave32 on gfx1030) resident
  on a compute unit: the compiler's occupancy (``; Occupancy:``, waves per SIMD, which its register
  use sets) is at least what one block puts on each SIMD (:func:`waves_per_simd`). (Not NVIDIA's
  64 registers: the register files differ. gfx90a keeps 64 VGPRs and moves the rest to AGPRs,
  measured 96 in all, occupancy 5 of the 4 needed; gfx1030 120, occupancy 8 of 8.)
* the private segment (scratch) is the engine's call frame only, at most :data:`STACK_BYTES`
  (the kernels call the engine ``hccc_run``, which saves the registers it must keep across its
  own calls there): a kernel adds nothing of its own, since it passes the engine its argument's
  address in the kernarg segment (``hccc_kernel_arg``; ``&a`` made hipcc copy the 160-byte
  ``hccc_args`` into every rank kernel's frame, 176 bytes of it). Measured with ROCm 5.2: 64 bytes on gfx90a
  (100 with the fused LL chains' code, which every build here carries:
  ``ll_chains.CHAIN_PLATFORMS``), 32 on gfx1030 float32 sum, 176 on gfx1030 bfloat16 max;
* the per-unit path calls nothing but the once-per-primitive ``hccc_sprim_load`` (none where the
  block decodes its primitives into a table at launch, ``hccc_ptable_decode``) and, on a timeout,
  ``hccc_report_stuck`` (no ``s_swappc`` / ``s_call`` to anything else), and touches no
  scratch: no ``scratch_*`` or private ``buffer_*`` access in any block of the engine the
  compiler places in a loop (its own loop annotations: ``; in Loop:``, ``Loop Header``).

(Direct AllToAll 8 on gfx90a reloaded a 32-bit all-ones word from scratch on the sync lane's loop
until a unit's "no dependency polled yet" became 0: ``hccc_waits::dep_low_not``, where
``dep_low = ~0ull`` had the compiler keep ~0ull in a register across the loop and spill it.)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hccc.compiler.backend.codegen import generate
from hccc.compiler.pipeline import CompileOptions, load_program
from hccc.runtime.gpu import translation_unit
from hccc.runtime.hip import hip_flags
from hccc.runtime.platform import Instance

from conftest import require_tool
from kernel_asm import CALLEES

#: hipcc on the emitted kernels: seconds to a minute each on 2 cores
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: arch -> (lanes per wave, SIMDs a block's waves spread over: a gfx90a CU's 4; a gfx1030
#: workgroup processor's 4 SIMD32 in the default WGP mode)
ARCH = {"gfx90a": (64, 4), "gfx1030": (32, 4)}


def waves_per_simd(arch: str, threads: int) -> int:
    """Waves a resident block of ``threads`` puts on each SIMD."""
    lanes, simds = ARCH[arch]
    return -(-threads // lanes) // simds
#: the most private segment (bytes) a kernel may have: the engine's call frame
STACK_BYTES = 256
#: what the per-unit path may call (kernel_asm.CALLEES less the once-per-block hccc_launch_init,
#: which no loop calls)
LOOP_CALLEES = tuple(c for c in CALLEES if c != "hccc_launch_init")


def kernel_metadata(asm: str) -> dict[str, dict[str, str]]:
    """``amdhsa.kernels`` of the code object: kernel name -> its top-level keys."""
    out: dict[str, dict[str, str]] = {}
    at = asm.find("amdhsa.kernels:")
    assert at >= 0, "no kernel metadata"
    cur: dict[str, str] | None = None
    for line in asm[at:].splitlines()[1:]:
        if re.match(r"^\S", line):
            break                                  # the next top-level key
        if re.match(r"^  - ", line):
            cur = {}
            line = "    " + line[4:]
        m = re.match(r"^    \.(\w+):\s+(\S+)\s*$", line)
        if m and cur is not None:
            cur[m.group(1)] = m.group(2)
            if m.group(1) == "name":
                out[m.group(2)] = cur
    return out


def functions(asm: str) -> dict[str, list[str]]:
    """Function (global label) -> its lines."""
    out: dict[str, list[str]] = {}
    name = None
    for line in asm.splitlines():
        m = re.match(r"^([A-Za-z_]\w*):", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def loop_lines(lines: list[str]) -> list[int]:
    """Indices of the lines in the basic blocks the compiler annotates as in a loop (a label or
    ``; %bb.N:`` line with ``in Loop:`` or ``Loop Header``)."""
    out, inside = [], False
    for i, line in enumerate(lines):
        if re.match(r"^(?:\.LBB\w+:|; %bb\.\d+:)", line):
            inside = bool(re.search(r"in Loop:|Loop Header", line))
        elif inside:
            out.append(i)
    return out


SCRATCH = re.compile(r"\bscratch_(?:load|store)\w*|\bbuffer_(?:load|store)_\w+\s.*\bs\[0:3\]")
CALL = re.compile(r"\bs_(?:swappc|call)_b64\s+s\[\d+:\d+\],\s*s\[(\d+):\d+\]")


def call_target(lines: list[str], at: int) -> str:
    """The function the call at ``lines[at]`` goes to: the symbol whose address was last formed
    in the register pair it jumps through (``s_add_u32 sN, sN, SYMBOL@rel32@lo+4``)."""
    m = CALL.search(lines[at])
    assert m, lines[at]
    reg = m.group(1)
    for line in reversed(lines[:at]):
        d = re.search(rf"\bs_add_u32\s+s{reg},\s*s{reg},\s*(\w+)@(?:rel32|gotpcrel32)@lo", line)
        if d:
            return d.group(1)
    return "?"


def _build(tmp_path: Path, example: str, dtype: str, op: str, single: bool, arch: str,
           fuse: bool = False, defines: tuple[str, ...] = ()) -> tuple[str, dict]:
    tool = require_tool("hipcc")
    ir = load_program(ROOT / "examples" / f"{example}.rccl", CompileOptions(fuse="on" if fuse else "off"))
    if fuse and example.startswith("ring"):   # (chain rows: a build with chains on runs their code)
        from hccc.compiler.ir.ll_chains import chain_rows
        assert (chain_rows(ir) > 0).any()
    generate(ir, tmp_path, platforms=["hip"] * ir.nranks)
    man = json.loads((tmp_path / "manifest.json").read_text())
    src, out = tmp_path / "all.hip", tmp_path / "all.s"
    src.write_text(translation_unit(man, Instance(dtype, op), list(range(ir.nranks)), "hip"))
    res = subprocess.run([tool, *hip_flags(arch, single, output=("--cuda-device-only", "-S")), *defines, "-I", str(tmp_path),
                          "-o", str(out), str(src)], capture_output=True, text=True,
                         env=dict(os.environ, HIP_PLATFORM="amd"), timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    return out.read_text(), man


@pytest.mark.parametrize("arch", sorted(ARCH))
@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "max")])
@pytest.mark.parametrize("example", ["ring_allreduce_8", "hm_allreduce_4x8", "direct_alltoall_8"])
@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_amd_kernels_keep_a_block_resident_no_spill_no_scratch_on_the_loop(tmp_path, example, dtype, op, single,
                                                                             arch, fuse):
    asm, man = _build(tmp_path, example, dtype, op, single, arch, fuse)
    meta = kernel_metadata(asm)
    kernels = {k: v for k, v in meta.items() if k != "hccc_runtime_gate"}
    want = {f"{e['kernel']}_{dtype}_{op}" for e in man["ranks"]} | {f"{man['grid']['hip']['kernel']}_{dtype}_{op}"}
    assert set(kernels) == want, sorted(kernels)
    funcs = functions(asm)
    engines = [n for n in funcs if n.startswith("_Z8hccc_runI")]
    assert len(engines) == 1, engines               # one engine, every kernel calls it
    lines = funcs[engines[0]]
    for name, v in kernels.items():
        assert v["sgpr_spill_count"] == "0" and v["vgpr_spill_count"] == "0", (name, v)
        occ = re.findall(r"^; Occupancy: (\d+)", "\n".join(funcs[name]), flags=re.M)
        assert occ and int(occ[0]) >= waves_per_simd(arch, man["nthreads"]["hip"]), (name, occ, v["vgpr_count"])
    inside = loop_lines(lines)
    assert inside, "no loop found in the engine"
    called = set()
    for i in inside:
        assert not SCRATCH.search(lines[i]), lines[i]
        if CALL.search(lines[i]):
            target = call_target(lines, i)
            assert any(c in target for c in LOOP_CALLEES), (target, lines[i])
            called.add(target)
    # the sync lane's loop is among those read: with a decoded table (the manifest's prim_decode) it
    # reads each primitive from shared memory, calling nothing per primitive, and the block decodes
    # them once before the loops; else it loads each one through the call
    if man["stats"]["prim_decode"] == "table":
        assert not any("hccc_sprim_load" in t for t in called), called
        assert any(CALL.search(x) and "hccc_ptable_decode" in call_target(lines, i)
                   for i, x in enumerate(lines)), "no call to hccc_ptable_decode"
    else:
        assert any("hccc_sprim_load" in t for t in called), called
    # the private segment is the engine's frame alone (its ScratchSize, its callees' included): no
    # kernel adds a copy of its argument (hccc_kernel_arg), which took 176 bytes of every rank kernel's
    frame = engine_scratch(lines)
    for name, v in kernels.items():
        assert int(v["private_segment_fixed_size"]) == frame, (name, v, frame)
        assert int(v["private_segment_fixed_size"]) <= STACK_BYTES, (name, v)


def engine_scratch(lines: list[str]) -> int:
    """The engine's private segment (bytes, its callees' frames included): its ``; ScratchSize:``."""
    got = [int(m.group(1)) for x in lines if (m := re.match(r"^; ScratchSize: (\d+)", x))]
    assert len(got) == 1, got
    return got[0]


@pytest.mark.parametrize("arch", sorted(ARCH))
def test_hip_builds_run_fused_ll_chains_within_the_frame_bound(tmp_path, arch):
    """HIP builds carry the fused LL chains' code (HCCC_LL_CHAINS 1 from ll_chains.CHAIN_PLATFORMS,
    no define): ring AllReduce 8 fused (its chain rows marked), float32 sum, system scope, calls
    hccc_chain_enter from its engine, and every kernel keeps no spill and a private segment within
    STACK_BYTES. (Until the kernels passed their argument in place, a gfx90a rank kernel's frame
    with the chains was 276 bytes: the engine's 100 and 176 for a copy of the 160-byte hccc_args.)"""
    from hccc.compiler.ir.ll_chains import CHAIN_PLATFORMS
    assert "hip" in CHAIN_PLATFORMS
    asm, man = _build(tmp_path, "ring_allreduce_8", "float32", "sum", False, arch, True)
    funcs = functions(asm)
    engines = [n for n in funcs if n.startswith("_Z8hccc_runI")]
    assert len(engines) == 1, engines
    lines = funcs[engines[0]]
    assert any(CALL.search(x) and "hccc_chain_enter" in call_target(lines, i) for i, x in enumerate(lines)), \
        "the engine has no chain code"
    kernels = {k: v for k, v in kernel_metadata(asm).items() if k != "hccc_runtime_gate"}
    assert len(kernels) == len(man["ranks"]) + 1
    for name, v in kernels.items():
        assert v["sgpr_spill_count"] == "0" and v["vgpr_spill_count"] == "0", (name, v)
        assert int(v["private_segment_fixed_size"]) <= STACK_BYTES, (name, v)


@pytest.mark.parametrize("arch", sorted(ARCH))
def test_amd_table_kernels_have_the_engines_frame_alone(tmp_path, arch):
    """The table mode's generic kernels (ring AllReduce 8's table, float32 sum, system scope): the
    rank entry passes its hccc_table_args in place too (hccc_kernel_arg; with ``&a`` its frame was
    the engine's plus 176 bytes for a copy: 240 on gfx90a), so each entry's private segment is
    its engine's frame, and nothing spills."""
    tool = require_tool("hipcc")
    from hccc.compiler.backend.table_codegen import generate_table
    ir = load_program(ROOT / "examples" / "ring_allreduce_8.rccl")
    generate_table(ir, tmp_path, platforms=["hip"] * ir.nranks)
    man = json.loads((tmp_path / "manifest.json").read_text())
    src, out = tmp_path / "all.hip", tmp_path / "all.s"
    src.write_text(translation_unit(man, Instance("float32", "sum"), list(range(ir.nranks)), "hip"))
    res = subprocess.run([tool, *hip_flags(arch, False, output=("--cuda-device-only", "-S")), "-I", str(tmp_path),
                          "-o", str(out), str(src)], capture_output=True, text=True,
                         env=dict(os.environ, HIP_PLATFORM="amd"), timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    asm = out.read_text()
    kernels = {k: v for k, v in kernel_metadata(asm).items() if k != "hccc_runtime_gate"}
    assert set(kernels) == {"hccc_table_float32_sum", "hccc_table_grid_float32_sum"}, sorted(kernels)
    funcs = functions(asm)
    engines = [n for n in funcs if n.startswith("_Z8hccc_runI")]
    assert len(engines) == 1, engines
    frame = engine_scratch(funcs[engines[0]])
    for name, v in kernels.items():
        assert v["sgpr_spill_count"] == "0" and v["vgpr_spill_count"] == "0", (name, v)
        assert int(v["private_segment_fixed_size"]) == frame <= STACK_BYTES, (name, v, frame)


def test_the_parsers_on_a_sample():
    asm = """k:                                      ; @k
; %bb.0:
\ts_endpgm
; Occupancy: 5
_Z8hccc_runIfLi0E12hccc_programEvPK9hccc_argsT1_i:
; %bb.0:
\tbuffer_store_dword v40, off, s[0:3], s32 offset:8 ; 4-byte Folded Spill
.LBB3_6:                                ; =>This Loop Header: Depth=1
\ts_add_u32 s44, s44, _Z15hccc_sprim_loadI12hccc_programEvR11hccc_sharedT_jjjb@rel32@lo+4
\ts_swappc_b64 s[30:31], s[44:45]
; %bb.7:                                ;   in Loop: Header=BB3_6 Depth=1
\tbuffer_load_dword v1, off, s[0:3], s33 ; 4-byte Folded Reload
.LBB3_9:
\tbuffer_load_dword v63, off, s[0:3], s33
.Lfunc_end3:
; ScratchSize: 64
amdhsa.kernels:
  - .args:
      - .offset:         0
        .size:           160
    .name:           k
    .private_segment_fixed_size: 208
    .sgpr_spill_count: 0
    .vgpr_count:     96
amdhsa.target:   amdgcn-amd-amdhsa--gfx90a
"""
    assert kernel_metadata(asm) == {"k": {"name": "k", "private_segment_fixed_size": "208",
                                          "sgpr_spill_count": "0", "vgpr_count": "96"}}
    lines = functions(asm)["_Z8hccc_runIfLi0E12hccc_programEvPK9hccc_argsT1_i"]
    inside = loop_lines(lines)
    assert [lines[i].split()[0] for i in inside] == ["s_add_u32", "s_swappc_b64", "buffer_load_dword"]
    assert engine_scratch(lines) == 64
    assert call_target(lines, inside[1]) == "_Z15hccc_sprim_loadI12hccc_programEvR11hccc_sharedT_jjjb"
    assert [bool(SCRATCH.search(lines[i])) for i in inside] == [False, False, True]
    assert not SCRATCH.search("\tbuffer_load_dword v1, v2, s[8:11], 0 offen")   # a global buffer
    assert waves_per_simd("gfx90a", 1024) == 4 and waves_per_simd("gfx1030", 1024) == 8
