"""The compiled kernels, inspected: what the protocol promises for speed and for correctness on real
hardware shows in the code nvcc (PTX and SASS, sm_90) and hipcc (gfx90a and gfx1030 assembly) emit.

Every kernel runs one engine per (dtype, op): ``hccc_run`` (hccc_prims.h), which calls nothing on
its per-unit path but the once-per-block ``hccc_launch_init`` and ``hccc_ptable_decode`` (a
program whose blocks decode their primitives into a shared-memory table at launch, as the example's)
or the once-per-primitive ``hccc_sprim_load`` (one over the table's budget), the once-per-chain
``hccc_chain_enter`` (a fused LL chain's links, read from the table) and, on a timeout,
``hccc_report_stuck``.

- Copy/reduce loops (in ``hccc_run``): every unrolled loop issues at least 4 independent 16-byte
  global loads (``ld.global.*.v4`` / ``global_load_dwordx4``, at least 4 outstanding at once)
  before its first store; 16-byte data accesses never use generic/flat addressing; on AMD no copy
  loop touches scratch (spills).
- fp16 / bf16 reductions use packed instructions (``add/max/min.f16x2``, ``.bf16x2``;
  ``v_pk_add/max/min_f16``) and no element-wise float conversion in the unrolled loops; gfx90a,
  which has no bf16 arithmetic, reduces bf16 pairs with shifts and float math (no conversion
  calls, no branches: the loops stay short).
- The per-unit path: no call (PTX and SASS) but the three above, and no 64-bit division (PTX
  ``div/rem.u64``, SASS calls of ``__cuda_sm20_div/rem``).
- The hop (SASS): between the data warps' own barrier after a unit (DATA) and the unit's first
  posted flag, at most HOP_MAX instructions, none a global or generic load, a call, an L1
  invalidation or another barrier; no local memory (LDL / STL) in any function of the kernels.
  The dependent global round trips from a unit's input becoming visible (the poll that sees its
  tail) to its post becoming visible, counted on every path of the machine code's control flow:
  at most ROUND_TRIPS (3: the poll, the data's loads, the post; no region header read between);
  through a fused LL chain (``--fuse``), at most FUSED_ROUND_TRIPS (2: the line in, the line out).
- Sync: the data threads and the sync lane meet at named barriers (``bar.sync`` / ``bar.arrive``),
  never at a block-wide barrier inside a loop; no sequentially consistent fence; on sm_90 the
  acquire and release fences are ``fence.acquire`` / ``fence.release`` (no full ``fence.acq_rel``),
  at GPU scope only in single-GPU builds (no system-scope fence, flag load or flag store there: only
  the abort flag and the error record, which the host reads, stay at system scope); the flags are
  relaxed stores after a release fence (no release store); the spin loops poll without fences; no
  fence or atomic in a copy loop; an LL line is one 16-byte volatile access.
- AMD: the release of a unit is the L2 writeback only across GPUs (none in single-GPU builds), its
  acquire invalidates without a writeback (gfx90a), the spin loops sleep; gfx1030 (RDNA, wave32) builds with the compiler's wavefront size (32) and waits
  for its stores (``s_waitcnt_vscnt``) before every barrier. On gfx90a and gfx1030 the engine calls
  (``s_swappc_b64``) only the functions the CUDA engine calls, and touches scratch memory only to
  save at its entry and restore at its return the register the calls clobber (no spill, no stack
  array on any loop).
- Timeouts read the global timers (``%globaltimer``, ``s_memrealtime``), never per-SM clocks.

The loop structure is recovered from the assembly (labels and backward branches), independently
of the sources.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
from pathlib import Path

import networkx as nx
import pytest

from hccc.compiler.backend import prim_table
from hccc.compiler.backend.codegen import generate
from hccc.compiler.pipeline import load_program
from hccc.runtime.cuda import cuda_flags
from hccc.runtime.gpu import CTYPES, GATE_SYMBOL, RED_CONSTS, translation_unit
from hccc.runtime.gpu_timing import GATE_ARGS
from hccc.runtime.kernel_abi import Args
from hccc.runtime.hip import hip_flags
from hccc.runtime.platform import Instance

from conftest import require_tool
from kernel_asm import CALLEES, SASS_LOCAL, most_on_a_path, sass_cfg, sass_functions
from kernel_asm import nvdisasm as _nvdisasm

#: compiles every instantiation for sm_90 and gfx90a to inspect the code (minutes on 2 cores): CI runs it
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ring_allreduce_8.rccl"


# ---------------------------------------------------------------------------------- assembly model
def functions(text: str, flavour: str) -> dict[str, list[str]]:
    """Function name -> its lines, for PTX (``.func`` / ``.entry``) or AMDGPU assembly (global
    labels)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if flavour == "ptx":
            m = re.match(r"^(?:\.visible\s+|\.weak\s+)?\.(?:func|entry)\s+(?:\([^)]*\)\s*)?(\w+)", line)
        else:
            m = re.match(r"^([A-Za-z_]\w*):", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return out


def function(funcs: dict[str, list[str]], part: str) -> list[str]:
    names = [n for n in funcs if part in n]
    assert len(names) == 1, f"expected one function named like {part!r}, found {names}"
    return funcs[names[0]]


#: the mangled program type of an engine ``hccc_run<T, RED, Prog>``: a program decoding its
#: primitives into a table at launch (``hccc_tprogram<N>``, as ring AllReduce 8's) or loading each
#: one (``hccc_program``)
ENGINE_PROGRAM = r"(?:12hccc_program|13hccc_tprogramILj\d+EE)"


def engine(funcs: dict[str, list[str]], code: str) -> list[str]:
    """The lines of the one engine ``hccc_run`` of (dtype, op) ``code`` (``fLi0E``: float32 sum)."""
    names = [n for n in funcs if re.search(rf"hccc_runI{code}{ENGINE_PROGRAM}", n)]
    assert len(names) == 1, f"expected one engine {code!r}, found {names}"
    return funcs[names[0]]


def loops(lines: list[str], *, innermost: bool = False, holding: str | None = None) -> list[list[str]]:
    """Bodies of the loops: from a label to a later branch back to it (``innermost``: only loops
    that hold no other loop; with ``holding``, a regular expression: only loops with a line that
    matches it and no other such loop inside)."""
    label_at = {}
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__\w+|\.LBB\w+):", line)
        if m:
            label_at[m.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        m = re.search(r"\b(?:bra(?:\.uni)?|s_branch|s_cbranch_\w+)\s+(\$L__\w+|\.LBB\w+)", line)
        if m and m.group(1) in label_at and label_at[m.group(1)] < i:
            spans.append((label_at[m.group(1)], i))
    if holding is not None:
        spans = [(a, b) for a, b in spans if any(re.search(holding, x) for x in lines[a:b + 1])]
    if innermost:
        spans = [(a, b) for a, b in spans
                 if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    return [lines[a:b + 1] for a, b in spans]


PTX_LD16 = re.compile(r"^\s*ld\.global(?:\.\w+)*\.v4\.(?:u32|b32|f32)\s+\{([^}]*)\},\s*\[(%\w+)")
PTX_ST16 = re.compile(r"^\s*st\.global(?:\.\w+)*\.v4\.")
AMD_LD16 = re.compile(r"^\s*global_load_dwordx4\s+v\[(\d+):(\d+)\],\s*v\[(\d+):\d+\]")
AMD_ST16 = re.compile(r"^\s*global_store_dwordx4\s")


def loads_before_first_store(body: list[str], flavour: str) -> list[tuple[set[str], set[str]]]:
    """(registers written, address registers) of each 16-byte load before the loop's first
    16-byte store."""
    ld, st = (PTX_LD16, PTX_ST16) if flavour == "ptx" else (AMD_LD16, AMD_ST16)
    out = []
    for line in body:
        if st.search(line):
            break
        m = ld.search(line)
        if m is None:
            continue
        if flavour == "ptx":
            out.append(({r.strip() for r in m.group(1).split(",")}, {m.group(2)}))
        else:
            lo, hi, addr = int(m.group(1)), int(m.group(2)), int(m.group(3))
            out.append(({f"v{k}" for k in range(lo, hi + 1)}, {f"v{addr}", f"v{addr + 1}"}))
    return out


def _dest(line: str) -> set[str]:
    """Registers an (ALU) instruction writes: its first operand."""
    m = re.match(r"^\s*[a-z_][\w.]*\s+(%\w+|v\d+|v\[\d+:\d+\])", line)
    if m is None:
        return set()
    r = m.group(1)
    rng = re.fullmatch(r"v\[(\d+):(\d+)\]", r)
    return {f"v{k}" for k in range(int(rng.group(1)), int(rng.group(2)) + 1)} if rng else {r}


def dependent_loads(body: list[str], flavour: str) -> int:
    """Loads before the first store whose address comes from another of those loads (a register
    whose latest definition is such a load)."""
    ld, st = (PTX_LD16, PTX_ST16) if flavour == "ptx" else (AMD_LD16, AMD_ST16)
    loaded: set[str] = set()
    bad = 0
    for line in body:
        if st.search(line):
            break
        got = loads_before_first_store([line], flavour)
        if got:
            written, addr = got[0]
            bad += bool(addr & loaded)
            loaded |= written
        else:
            loaded -= _dest(line)
    return bad


def max_in_flight(body: list[str]) -> int:
    """gfx90a: the most 16-byte loads outstanding at once before the first store (s_waitcnt
    vmcnt(N) leaves at most N memory operations outstanding)."""
    out = best = 0
    for line in body:
        if AMD_ST16.search(line):
            break
        if AMD_LD16.search(line):
            out += 1
            best = max(best, out)
        m = re.search(r"\bs_waitcnt\b.*\bvmcnt\((\d+)\)", line)
        if m:
            out = min(out, int(m.group(1)))
    return best


def copy_loops(lines: list[str], flavour: str) -> list[list[str]]:
    """Loops that both load and store 16-byte vectors."""
    ld, st = (PTX_LD16, PTX_ST16) if flavour == "ptx" else (AMD_LD16, AMD_ST16)
    return [b for b in loops(lines, innermost=True)
            if any(ld.search(x) for x in b) and any(st.search(x) for x in b)]


# ---------------------------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """platform -> (folder, manifest) of the example, emitted for that platform."""
    ir = load_program(EXAMPLE)
    out = {}
    for plat in ("cuda", "hip"):
        d = tmp_path_factory.mktemp(plat)
        generate(ir, d, platforms=[plat] * ir.nranks)
        out[plat] = (d, json.loads((d / "manifest.json").read_text()))
    return out


_BUILT: dict = {}
DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")
#: mangled template argument of each dtype's element type, per platform
TYPE_CODE = {"cuda": {"float32": "f", "float16": "6__half", "bfloat16": "13__nv_bfloat16", "int32": "i"},
             "hip": {"float32": "f", "float16": "6__half", "bfloat16": "12hip_bfloat16", "int32": "i"}}


def compiled(sources, platform: str, single_gpu: bool) -> str:
    """The device code of rank 0's kernels in one module: PTX for cuda, gfx90a assembly for hip;
    every (dtype, op), or float32 sum alone in single-GPU builds (the sync checks read only that)."""
    key = (platform, single_gpu)
    if key not in _BUILT:
        d, man = sources[platform]
        tu = translation_unit(man, Instance("float32", "sum"), [0], platform)
        pairs = [("float32", "sum")] if single_gpu else [(dt, op) for dt in DTYPES for op in OPS]
        every = " ".join(f"X({dt}, {CTYPES[dt]}, {op}, {RED_CONSTS[op]})" for dt, op in pairs)
        tu = re.sub(r"^#define HCCC_FOR_EACH_INSTANCE\(X\) .*$", f"#define HCCC_FOR_EACH_INSTANCE(X) {every}",
                    tu, count=1, flags=re.M)
        stem = f"all_{int(single_gpu)}"
        if platform == "cuda":
            tool = require_tool("nvcc")
            src, out = d / f"{stem}.cu", d / f"{stem}.ptx"
            flags = cuda_flags("sm_90", single_gpu, output="-ptx")
        else:
            tool = require_tool("hipcc")
            src, out = d / f"{stem}.hip", d / f"{stem}.s"
            flags = hip_flags("gfx90a", single_gpu, output=("--cuda-device-only", "-S"))
        src.write_text(tu)
        env = dict(os.environ, HIP_PLATFORM="amd")
        res = subprocess.run([tool, *flags, "-I", str(d), "-o", str(out), str(src)],
                             capture_output=True, text=True, env=env, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        _BUILT[key] = out.read_text()
    return _BUILT[key]


def prim_of(sources, platform: str, dtype: str, op: str, single_gpu: bool = False) -> list[str]:
    """Lines of the engine ``hccc_run<T, RED, hccc_program>`` for (dtype, op): the data threads'
    loop with the copy / reduce engine inlined, the sync lane's loop."""
    funcs = functions(compiled(sources, platform, single_gpu), FLAVOUR[platform])
    code = f"{TYPE_CODE[platform][dtype]}Li{OPS.index(op)}E"
    return list(engine(funcs, code))


FLAVOUR = {"cuda": "ptx", "hip": "amd"}


# ---------------------------------------------------------------------------------- copy loops
@pytest.mark.parametrize("platform", ["cuda", "hip"])
@pytest.mark.parametrize("dtype,op", [(d, o) for d in DTYPES for o in OPS])
def test_unrolled_copy_loops_issue_four_independent_16_byte_loads_before_storing(sources, platform,
                                                                                  dtype, op):
    fl = FLAVOUR[platform]
    prim = prim_of(sources, platform, dtype, op)
    cl = copy_loops(prim, fl)
    unrolled = [b for b in cl if len(loads_before_first_store(b, fl)) >= 4]
    # one per data-path shape at least: copy, reduce, copy to two outputs, reduce to two outputs
    assert len(unrolled) >= 4, [len(loads_before_first_store(b, fl)) for b in cl]
    for body in unrolled:
        assert dependent_loads(body, fl) == 0, "a load's address depends on another load of the group"
        if fl == "ptx":
            written = [w for w, _ in loads_before_first_store(body, fl)]
            assert all(not (a & b) for i, a in enumerate(written) for b in written[i + 1:]), \
                "two loads before the first store share a destination register"
        else:
            assert max_in_flight(body) >= 4, "fewer than 4 loads outstanding before the first store"
    # the remaining copy loops move one vector per thread (the remainder): nothing was left serial
    st = PTX_ST16 if fl == "ptx" else AMD_ST16
    for body in cl:
        if body not in unrolled:
            assert sum(1 for x in body if st.search(x)) <= 2, "a multi-store loop stores too early"


PTX_ASYNC16 = re.compile(r"^\s*cp\.async\.cg\.shared\.global\s")


@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bfloat16", "max")])
def test_cuda_copy_loops_hold_the_cost_models_bytes_in_flight(sources, dtype, op):
    """sm_90: the unrolled copy loops issue their shared-memory loads (cp.async, 16 bytes each) and
    their register loads before the first store, wait for the former (cp.async.wait_all) only after
    the registers' stores, and read them from shared memory; the loads before the first store, 16
    bytes each over a 512-thread block's 480 data threads, are the cost model's bytes in flight of
    a copy and of a reduction (kernel_cost.block_bytes_in_flight, counted from engine_shape)."""
    from hccc.compiler.passes import kernel_cost as kc
    prim = prim_of(sources, "cuda", dtype, op)
    found = set()
    for body in copy_loops(prim, "ptx"):
        first_st = next(i for i, x in enumerate(body) if PTX_ST16.search(x))
        asyncs = [i for i, x in enumerate(body) if PTX_ASYNC16.search(x)]
        if not asyncs:
            continue
        assert max(asyncs) < first_st, "a shared-memory load after the first store"
        wait = next(i for i, x in enumerate(body) if "cp.async.wait_all" in x)
        regs = len(loads_before_first_store(body, "ptx"))
        assert first_st < wait < next(i for i, x in enumerate(body) if re.search(r"\bld\.shared\.v4\.", x))
        found.add((regs, len(asyncs), (regs + len(asyncs)) * 16 * 480))
    want_copy = kc.block_bytes_in_flight(16)
    want_reduce = kc.block_bytes_in_flight(16, True)
    assert {b for _, _, b in found} == {want_copy, want_reduce} == {76800}, found
    # (a copy: 8 in registers, 2 through shared memory; a reduction: 4 + 1 a source)
    assert {(r, a) for r, a, _ in found} == {(8, 2)}, found


@pytest.mark.parametrize("platform", ["cuda", "hip"])
def test_16_byte_accesses_are_global_not_generic(sources, platform):
    prim = "\n".join(prim_of(sources, platform, "float32", "sum"))
    if platform == "cuda":
        assert len(re.findall(r"\bld\.global(?:\.\w+)*\.v4\.", prim)) >= 16
        assert not re.search(r"\b(?:ld|st)(?:\.(?:cg|cs|volatile|weak))*\.v4\.", prim), "generic 16-byte access"
    else:
        assert prim.count("global_load_dwordx4") >= 16
        # (flat 16-byte loads elsewhere read the program's and the connections' structures): the
        # loops that move data store 16-byte vectors, all of them through global addressing
        for body in loops(prim_of(sources, "hip", "float32", "sum"), innermost=True):
            if any(re.search(r"\b(?:global|flat)_store_dwordx4\b", x) for x in body):
                assert not any(re.search(r"\bflat_(?:load|store)_dwordx4\b", x) for x in body)


def test_gfx90a_copy_loops_do_not_spill(sources):
    for dtype, op in [(d, o) for d in DTYPES for o in OPS]:
        prim = prim_of(sources, "hip", dtype, op)
        for body in copy_loops(prim, "amd"):
            assert not any(re.search(r"\bbuffer_(?:load|store)_dword", x) for x in body), \
                f"scratch access in a copy loop ({dtype} {op})"


# ---------------------------------------------------------------------------------- packed math
PACKED_PTX = {"sum": r"\badd(?:\.rn)?\.{t}x2\b|\bfma\.rn\.{t}x2\b", "max": r"\bmax\.{t}x2\b",
              "min": r"\bmin\.{t}x2\b"}


@pytest.mark.parametrize("dtype,t", [("float16", "f16"), ("bfloat16", "bf16")])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_cuda_half_and_bf16_reductions_are_packed(sources, dtype, t, op):
    prim = prim_of(sources, "cuda", dtype, op)
    unrolled = [b for b in copy_loops(prim, "ptx") if len(loads_before_first_store(b, "ptx")) >= 8]
    reducing = [b for b in unrolled if any(re.search(PACKED_PTX[op].format(t=t), x) for x in b)]
    # reduce and reduce-to-two-outputs loops (at least two shapes), each fully packed
    assert len(reducing) >= 2
    for body in reducing:
        packed = sum(1 for x in body if re.search(PACKED_PTX[op].format(t=t), x))
        assert packed >= 4 * 4, packed     # HCCC_LOADS_REDUCE (4) vectors x 4 words, two lanes each
        assert not any(re.search(r"\bcvt\.f32\.(?:f16|bf16)\b", x) for x in body), "element-wise conversion"


@pytest.mark.parametrize("op,ins", [("sum", "v_pk_add_f16"), ("max", "v_pk_max_f16"), ("min", "v_pk_min_f16")])
def test_gfx90a_half_reductions_are_packed(sources, op, ins):
    prim = prim_of(sources, "hip", "float16", op)
    reducing = [b for b in copy_loops(prim, "amd") if any(ins in x for x in b)]
    assert len(reducing) >= 2
    for body in reducing:
        if len(loads_before_first_store(body, "amd")) >= 8:
            assert sum(1 for x in body if ins in x) >= 4 * 4
        assert not any("v_cvt_f32_f16" in x for x in body), "element-wise conversion"


# ---------------------------------------------------------------------------------- sync
PTX_BLOCK_BARRIER = re.compile(r"\b(?:bar|barrier)(?:\.cta)?\.(?:sync|red|arrive)(?:\.aligned)?\s+0\b|\bbar\.sync\s+0;|\b__syncthreads\b")
PTX_FENCE = re.compile(r"\b(?:fence|membar)\b")
PTX_ATOMIC = re.compile(r"\batom\.|\bred\.")


def _engine(sources, platform="cuda", single=False):
    return prim_of(sources, platform, "float32", "sum", single)


@pytest.mark.parametrize("single", [False, True])
def test_cuda_fences_are_split_and_scoped(sources, single):
    """sm_90: the acquire after the polls is ``fence.acquire``, the release before the posts
    ``fence.release`` (no full acq_rel fence, no sequentially consistent one); at GPU scope in
    single-GPU builds, where no flag is polled or posted at system scope either (only the abort
    flag and the error record stay at system scope: the host reads them)."""
    text = "\n".join(_engine(sources, single=single))
    peer = "gpu" if single else "sys"
    assert re.search(rf"\bfence\.acquire\.{peer}\b", text) and re.search(rf"\bfence\.release\.{peer}\b", text)
    assert re.search(r"\bfence\.acquire\.gpu\b", text) and re.search(r"\bfence\.release\.gpu\b", text)
    assert not re.search(r"\bfence\.acq_rel\b|\bfence\.sc\b|\bmembar\b", text)
    assert not re.search(r"\bst\.release\.\w+\.global\.u64\b", text), "a release store: a fence each"
    assert re.search(rf"\bst\.relaxed\.{peer}\.global\.u64\b", text), "tail / head are not relaxed flag stores"
    assert re.search(r"\bst\.relaxed\.gpu\.global\.u64\b", text), "the progress counter"
    if single:
        assert not re.search(r"\bfence\.\w+\.sys\b", text)
        assert not re.search(r"\b(?:ld|st)\.\w+\.sys\.global\.(?:u64|b64)\b", text), "a flag at system scope"
    # the abort flag read and the error record at system scope in every build
    funcs = functions(compiled(sources, "cuda", single), "ptx")
    report = "\n".join(function(funcs, "hccc_report_stuck"))
    assert re.search(r"\bst\.release\.sys\.global\.u32\b", report)
    assert re.search(r"\batom\.(?:\w+\.)?sys\.(?:global\.)?cas\.b32\b|\batom\.global\.sys\.cas\b|atom\.sys", report)


def test_cuda_spin_loops_poll_relaxed_without_fences(sources):
    body = _engine(sources)
    spins = [b for b in loops(body, innermost=True)
             if any(re.search(r"\bld\.relaxed\.\w+\.global\.u64\b", x) for x in b)]
    assert spins, "no polling loop"
    for b in spins:
        assert not any(PTX_FENCE.search(x) or re.search(r"\bld\.acquire\b", x) for x in b)


@pytest.mark.parametrize("single", [False, True])
def test_cuda_roles_meet_at_named_barriers_never_at_a_block_barrier_in_a_loop(sources, single):
    """The data threads wait (bar.sync) and arrive (bar.arrive) at named barriers, as does the
    sync lane; a one-warp block meets at the warp barrier; the one block-wide barrier of a kernel
    (after the launch set-up) is in no loop; no copy loop holds a fence or an atomic."""
    funcs = functions(compiled(sources, "cuda", single), "ptx")
    body = _engine(sources, single=single)
    text = "\n".join(body)
    assert re.search(r"\bbar(?:rier)?(?:\.cta)?\.sync(?:\.aligned)?\s+%r\d+,\s*%r\d+", text), "no named bar.sync"
    assert re.search(r"\bbar(?:rier)?(?:\.cta)?\.arrive(?:\.aligned)?\s+%r\d+,\s*%r\d+", text), "no bar.arrive"
    assert re.search(r"\bbar\.warp\.sync\b", text), "no warp barrier (one-warp blocks)"
    for name, lines in funcs.items():
        for lp in loops(lines):
            assert not any(PTX_BLOCK_BARRIER.search(x) for x in lp), f"block barrier in a loop of {name}"
    for lp in copy_loops(body, "ptx"):
        assert not any(PTX_FENCE.search(x) or PTX_ATOMIC.search(x) for x in lp), "ordering in a copy loop"


def test_cuda_ll_lines_are_single_16_byte_accesses(sources):
    text = "\n".join(_engine(sources))
    assert re.search(r"\bst\.volatile\.global\.v2\.u64\b", text), "no 16-byte LL line store"
    assert re.search(r"\bld\.volatile\.global\.v2\.u64\b", text), "no 16-byte LL line load"
    assert not re.search(r"\b(?:ld|st)\.local\b", text), "the engine touches the stack"




@pytest.mark.parametrize("single", [False, True])
def test_the_per_unit_path_calls_nothing_and_divides_nothing_in_ptx(sources, single):
    for dt, op in (("float32", "sum"),) + ((("bfloat16", "max"),) if not single else ()):
        body = prim_of(sources, "cuda", dt, op, single)
        text = "\n".join(body)
        targets = re.findall(r"^\s*call(?:\.uni)?\s+(?:\([^)]*\),\s*)?(\w+)", text, flags=re.M)
        assert targets and all(any(c in t for c in CALLEES) for t in targets), targets
        assert not re.search(r"\b(?:div|rem)\.[su]64\b", text), "a 64-bit division in the engine"


def test_the_per_unit_path_calls_nothing_and_divides_nothing_in_sass(sources, tmp_path):
    """The machine code of the engine (nvdisasm, sm_90): its CALLs go to the three functions
    above only, and none to the 64-bit division routines (``__cuda_sm20_div_u64`` and kin)."""
    tool = _nvdisasm()
    if tool is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    d, man = sources["cuda"]
    tu = translation_unit(man, Instance("float32", "sum"), [0], "cuda")
    src, cubin = d / "sass.cu", d / "sass.cubin"
    src.write_text(tu)
    res = subprocess.run([require_tool("nvcc"), *cuda_flags("sm_90", True, output="-cubin"), "-I", str(d),
                          "-o", str(cubin), str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    dis = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    assert dis.returncode == 0, dis.stderr[-2000:]
    funcs = sass_functions(dis.stdout)
    engines = {n: b for n, b in funcs.items() if "hccc_runI" in n}
    assert engines, sorted(funcs)[:20]
    for name, body in engines.items():
        calls = [re.search(r"CALL\S*\s+`?\(?([\w$]+)", x) for x in body if "CALL" in x]
        targets = [m.group(1) for m in calls if m]
        assert targets and all(any(c in t for c in CALLEES) for t in targets), (name, targets)
        assert not any(re.search(r"__cuda_sm20_(?:div|rem)", t) for t in targets), (name, targets)
    # the divisions that do exist are the per-primitive and per-block ones
    divs = [n for n, b in funcs.items() if any(re.search(r"__cuda_sm20_div", x) for x in b)]
    assert all(any(c in n for c in ("hccc_sprim_load", "hccc_ptable_decode", "hccc_launch_init", "hccc_v_round"))
               for n in divs), divs


def _engine_calls_in_sass(d: Path, man: dict) -> tuple[dict[str, list[str]], dict[str, int]]:
    """nvdisasm of rank 0's float32-sum kernels in folder ``d`` (sm_90, system scope): each engine's
    call targets, and each function's instruction count."""
    tool = _nvdisasm()
    if tool is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    src, cubin = d / "calls.cu", d / "calls.cubin"
    src.write_text(translation_unit(man, Instance("float32", "sum"), [0], "cuda"))
    res = subprocess.run([require_tool("nvcc"), *cuda_flags("sm_90", False, output="-cubin"), "-I", str(d),
                          "-o", str(cubin), str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    dis = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    assert dis.returncode == 0, dis.stderr[-2000:]
    funcs = sass_functions(dis.stdout)
    calls = {n: [m.group(1) for x in b if (m := re.search(r"CALL\S*\s+`?\(?([\w$]+)", x))]
             for n, b in funcs.items() if "hccc_runI" in n}
    return calls, {n: len(b) for n, b in funcs.items()}


def test_a_table_programs_engine_never_calls_the_primitive_load_and_a_fallbacks_does_in_sass(
        sources, tmp_path, monkeypatch):
    """sm_90 machine code: ring AllReduce 8's blocks (14 primitives, within the budget) decode
    their primitives once at launch (the engine calls hccc_ptable_decode, never hccc_sprim_load:
    no call once a primitive on the sync lane's loop); the same program over the budget (set below
    it) falls back to the per-primitive load (the engine calls hccc_sprim_load, and no decode)."""
    d, man = sources["cuda"]
    assert man["stats"]["prim_decode"] == "table"
    calls, sizes = _engine_calls_in_sass(d, man)
    assert calls, sorted(sizes)[:20]
    for name, targets in calls.items():
        assert any("hccc_ptable_decode" in t for t in targets), (name, targets)
        assert not any("hccc_sprim_load" in t for t in targets), (name, targets)
    assert not any("hccc_sprim_load" in n for n in sizes), sorted(sizes)
    monkeypatch.setattr(prim_table, "PTABLE_MAX_PRIMS", 0)
    ir = load_program(EXAMPLE)
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["stats"]["prim_decode"] == "load"
    calls, sizes = _engine_calls_in_sass(tmp_path, man)
    assert calls, sorted(sizes)[:20]
    for name, targets in calls.items():
        assert any("hccc_sprim_load" in t for t in targets), (name, targets)
        assert not any("hccc_ptable_decode" in t for t in targets), (name, targets)


#: SASS: a load from global (or generic) memory, an L1 invalidation, a call, local memory (the stack)
SASS_GLOBAL_LOAD = re.compile(r"\b(?:LDG|LD)(?:\.[\w.]+)?\s")
#: a posted flag: a strong 64-bit store to global memory (relaxed st at gpu / sys scope)
SASS_FLAG_STORE = re.compile(r"\bSTG\.E\.64\.STRONG\.(?:GPU|SYS)\b")


@pytest.fixture(scope="module")
def sass(sources):
    """nvdisasm of rank 0's kernels (float32 sum, sm_90, system scope): function -> instruction
    lines, and the engine's DATA barrier id (from the emitted header)."""
    tool = _nvdisasm()
    if tool is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    d, man = sources["cuda"]
    src, cubin = d / "hop.cu", d / "hop.cubin"
    src.write_text(translation_unit(man, Instance("float32", "sum"), [0], "cuda"))
    res = subprocess.run([require_tool("nvcc"), *cuda_flags("sm_90", False, output="-cubin"), "-I", str(d),
                          "-o", str(cubin), str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    dis = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    assert dis.returncode == 0, dis.stderr[-2000:]
    bar = re.search(r"#define HCCC_BAR_DATA (\d+)", (d / "hccc_prims.h").read_text())
    assert bar, "no DATA barrier in the engine"
    return sass_functions(dis.stdout), int(bar.group(1)), dis.stdout


def test_the_hop_posts_after_the_data_barrier_without_a_global_load_or_a_call_in_sass(sass):
    """The hop off the critical path (sm_90 machine code of ring AllReduce 8, rank 0): once the
    data warps meet at their own barrier (DATA) after moving a unit, the unit's flags are posted
    within a few dozen instructions that load only shared memory: no global or generic load (no
    counter, program row or region header read), no call, no L1 invalidation, no other barrier;
    and the engine touches no local memory (no spill, no stack) anywhere."""
    funcs, bar, _ = sass
    engines = {n: b for n, b in funcs.items() if "hccc_runI" in n}
    assert engines, sorted(funcs)[:20]
    for name, body in funcs.items():
        assert not any(SASS_LOCAL.search(x) for x in body), (name, [x for x in body if SASS_LOCAL.search(x)][:4])
    data_bar = re.compile(rf"\bBAR\.SYNC(?:\.DEFER_BLOCKING)?\s+{bar:#x}\b")
    for name, body in engines.items():
        at = [i for i, x in enumerate(body) if data_bar.search(x)]
        assert at, (name, "no DATA barrier")
        for i in at:
            end = next((j for j in range(i + 1, len(body)) if SASS_FLAG_STORE.search(body[j])), None)
            assert end is not None, (name, "no post after the DATA barrier")
            hop = body[i + 1:end]
            assert len(hop) <= HOP_MAX, (name, len(hop))
            bad = [x for x in hop if SASS_GLOBAL_LOAD.search(x) or re.search(r"\b(?:CALL|CCTL|BAR)\b", x)]
            assert not bad, (name, bad)
            assert any(re.search(r"\bMEMBAR\b", x) for x in hop), (name, "no release before the post")


#: instructions between the DATA barrier and the first post (42 in the text with nvcc 13.0:
#: shared-memory loads of the descriptor's posts and the abort word, the null tests, and the two
#: release fences, GPU and system scope, each on its own branch -- the posted connections' scope
#: picks one, hccc_post -- so a unit runs 31-34 of them)
HOP_MAX = 48

#: dependent global round trips from a unit's input becoming visible to its post becoming visible
#: (Simple protocol): the poll that sees the tail, the data's loads, the post
ROUND_TRIPS = 3
#: where the sync lane hands a unit to the data warps, or a one-warp block meets: a named barrier,
#: the warp barrier (WARPSYNC, or its divergence test where a converged warp needs no instruction)
SASS_MEETING = re.compile(r"\b(?:BAR\.|WARPSYNC|BRA\.DIV)")


def test_the_receive_to_post_path_has_at_most_three_dependent_round_trips_in_sass(sass):
    """The round trips of a hop, counted on the control flow of the engine's machine code (sm_90,
    ring AllReduce 8, rank 0): the poll that sees a unit's counters met (1), then, on every path
    from its acquire (the L1 invalidation, CCTL.IVALL) to the barrier that hands the unit to the
    data warps, no global or generic load: where the data of a received region starts comes from
    what both ends compute (hccc_region_offset), not from a header read after the poll; the
    data's loads (2); on every path from the data warps' own barrier (DATA) to the first posted
    flag, no global load; the post (3). A header load put back makes it 4 (or a loop of loads)."""
    _, bar, text = sass
    ins, labels = sass_cfg(text, "hccc_runI")
    assert ins, "no engine"
    load = lambda x: bool(SASS_GLOBAL_LOAD.search(x))
    acquires = [i for i, x in enumerate(ins) if re.search(r"\bCCTL\.IVALL\b", x)]
    assert acquires, "no acquire after the polls"
    after_poll = [most_on_a_path(ins, labels, i, SASS_MEETING.search, load, dead=lambda x: "CALL" in x)
                  for i in acquires]
    assert all(n is not None for n in after_poll), after_poll
    data_bar = re.compile(rf"\bBAR\.SYNC(?:\.DEFER_BLOCKING)?\s+{bar:#x}\b")
    hops = [most_on_a_path(ins, labels, i, SASS_FLAG_STORE.search, load,
                           dead=lambda x: bool(re.search(r"\b(?:BAR|WARPSYNC|CALL)\b", x)))
            for i, x in enumerate(ins) if data_bar.search(x)]
    assert hops and all(n is not None for n in hops), hops
    trips = 1 + max(after_poll) + 1 + max(hops) + 1
    assert trips <= ROUND_TRIPS, (trips, after_poll, hops)


#: dependent global round trips of a hop through a fused LL chain: the line that brings the data
#: with its flag (one 16-byte load), the line sent on with the next flag (one 16-byte store)
FUSED_ROUND_TRIPS = 2
#: SASS: an LL line's load and store (16-byte volatile accesses: STRONG.SYS in a system build)
SASS_LL_LINE_LOAD = re.compile(r"\bLDG\.E\.128\.STRONG\.SYS\b")
SASS_GLOBAL_STORE = re.compile(r"\b(?:STG|ST)(?:\.[\w.]+)?\s")


@pytest.fixture(scope="module")
def fused_sass(tmp_path_factory):
    """nvdisasm of rank 1's kernels (float32 sum, sm_90, system scope) of ring AllReduce 8 lowered
    with --fuse: its fused rows are marked as LL chains (hccc.compiler.ir.ll_chains), whose units
    the data threads run in the LL loop (hccc_ll_piece)."""
    from hccc.compiler.ir.ll_chains import chain_rows
    from hccc.compiler.pipeline import CompileOptions
    tool = _nvdisasm()
    if tool is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    ir = load_program(EXAMPLE, CompileOptions(fuse="on"))
    assert (chain_rows(ir) > 0).any()
    d = tmp_path_factory.mktemp("fused")
    generate(ir, d, platforms=["cuda"] * ir.nranks)
    man = json.loads((d / "manifest.json").read_text())
    src, cubin = d / "fused.cu", d / "fused.cubin"
    src.write_text(translation_unit(man, Instance("float32", "sum"), [1], "cuda"))
    # (CUDA builds run chains: hccc.compiler.ir.ll_chains.CHAIN_PLATFORMS)
    from hccc.compiler.ir.ll_chains import CHAIN_PLATFORMS
    assert "cuda" in CHAIN_PLATFORMS
    res = subprocess.run([require_tool("nvcc"), *cuda_flags("sm_90", False, output="-cubin"),
                          "-I", str(d), "-o", str(cubin), str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    dis = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    assert dis.returncode == 0, dis.stderr[-2000:]
    return dis.stdout


def test_a_fused_ll_hop_has_at_most_two_dependent_round_trips_in_sass(fused_sass):
    """A hop through a fused LL chain, counted on the control flow of the engine's machine code
    (sm_90, fused ring AllReduce 8, rank 1): from the load of a received line that brings its data
    with its flag (1), on every path to the first global store (the line sent on with the next
    message's flag, or the destination's copy), no global or generic load -- the source a
    reduce-forward adds is read before the line's wait -- then the store (2): no barrier, fence,
    call or header between (a spin that polls the line again, a wait that gives up, is not a hop).
    Reading the source after the wait makes it 3."""
    ins, labels = sass_cfg(fused_sass, "hccc_runI")
    assert ins, "no engine"
    lines = [i for i, x in enumerate(ins) if SASS_LL_LINE_LOAD.search(x)]
    assert lines, "no LL line load"
    load = lambda x: bool(SASS_GLOBAL_LOAD.search(x))
    after = [most_on_a_path(ins, labels, i, SASS_GLOBAL_STORE.search, load,
                            dead=lambda x: bool(SASS_LL_LINE_LOAD.search(x) or re.search(r"\b(?:CALL|BAR|WARPSYNC|EXIT|RET)\b", x)))
             for i in lines]
    assert all(n is not None for n in after), after
    trips = 1 + max(after) + 1
    assert trips <= FUSED_ROUND_TRIPS, (trips, after)


#: sm_90 probes: the platform's wait (relaxed polls, then hccc_acquire_peer) and post (one
#: hccc_release_peer, two relaxed flag stores) against the acquire load and release store forms
ORDER_PROBE = r"""
#include "hccc_platform.h"
#if HCCC_SINGLE_GPU
#define PS "gpu"
#else
#define PS "sys"
#endif
extern "C" __global__ void probe_wait_fence(const uint64_t* f, const hccc_v16* d, hccc_v16* o, uint64_t need) {
  while (hccc_poll_peer(f) < need) {}
  hccc_acquire_peer();
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
}
extern "C" __global__ void probe_wait_acquire_load(const uint64_t* f, const hccc_v16* d, hccc_v16* o,
                                                   uint64_t need) {
  for (;;) {
    uint64_t v;
    asm volatile("ld.acquire." PS ".global.u64 %0, [%1];" : "=l"(v) : "l"(f) : "memory");
    if (v >= need) break;
  }
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
}
extern "C" __global__ void probe_post_fence(const hccc_v16* d, hccc_v16* o, uint64_t* t, uint64_t* h, uint64_t v) {
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
  hccc_release_peer();
  hccc_post_peer(t, v);
  hccc_post_peer(h, v);
}
extern "C" __global__ void probe_post_release_stores(const hccc_v16* d, hccc_v16* o, uint64_t* t, uint64_t* h,
                                                     uint64_t v) {
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
  asm volatile("st.release." PS ".global.u64 [%0], %1;" :: "l"(t), "l"(v) : "memory");
  asm volatile("red.release." PS ".global.add.u64 [%0], %1;" :: "l"(h), "l"(v) : "memory");
}
"""


@pytest.mark.parametrize("single", [False, True])
def test_sm90_wait_and_post_are_the_narrowest_forms(sources, tmp_path, single):
    """The memory order's narrowest forms on sm_90 (docs/kernel-protocol.md, "The narrowest
    ordering"), on the platform's own functions: an acquire at GPU or system scope is an L1
    invalidation (CCTL.IVALL) whatever its form, so the relaxed polls and one fence pay one, after
    the spin, where an acquire load pays one on every poll; a release is a MEMBAR whatever its
    form, so one fence serves a unit's flags, where a release store or reduction pays one each.
    Peer scope: MEMBAR.SYS across GPUs, MEMBAR.GPU in single-GPU builds. The data's 16-byte loads
    bypass L1 (.cg: strong GPU-scope loads in SASS)."""
    tool = require_tool("nvcc")
    dis = _nvdisasm()
    if dis is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    d, _ = sources["cuda"]
    src = tmp_path / "probe.cu"
    src.write_text(ORDER_PROBE)
    cubin = tmp_path / "probe.cubin"
    res = subprocess.run([tool, *cuda_flags("sm_90", single), "-I", str(d), "-o", str(cubin), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([dis, "-c", str(cubin)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    funcs = sass_functions(out.stdout)
    count = lambda f, pat: sum(1 for x in funcs[f] if re.search(pat, x))
    fence_ins, acq_ins = funcs["probe_wait_fence"], funcs["probe_wait_acquire_load"]
    # the fence form: one invalidation, after the spin's last poll (none between the poll and its branch back)
    assert count("probe_wait_fence", r"\bCCTL\.IVALL\b") == 1
    poll = [i for i, x in enumerate(fence_ins) if re.search(r"\bLDG\.E\.64\.STRONG", x)]
    inval = [i for i, x in enumerate(fence_ins) if re.search(r"\bCCTL\.IVALL\b", x)]
    assert poll and inval[0] > max(poll), (poll, inval)
    # the acquire load: its invalidation is in the spin (before the branch back to the poll)
    apoll = [i for i, x in enumerate(acq_ins) if re.search(r"\bLDG\.E\.64\.STRONG", x)]
    ainval = [i for i, x in enumerate(acq_ins) if re.search(r"\bCCTL\.IVALL\b", x)]
    back = [i for i, x in enumerate(acq_ins) if re.search(r"@!?P\d\s+BRA\b", x)]
    assert apoll and ainval and back and any(apoll[0] < j < b for j in ainval for b in back), (apoll, ainval, back)
    # the data loads bypass L1 in both: strong GPU-scope 16-byte loads
    assert any(re.search(r"\bLDG\.E\.128\.STRONG\.GPU\b", x) for x in fence_ins)
    # posts: one MEMBAR at peer scope for two flags, against one per release store / reduction
    scope = "GPU" if single else "SYS"
    assert count("probe_post_fence", rf"\bMEMBAR\.\w+\.{scope}\b") == 1
    assert count("probe_post_fence", r"\bMEMBAR\b") == 1
    assert count("probe_post_release_stores", rf"\bMEMBAR\.\w+\.{scope}\b") == 2


@pytest.mark.parametrize("single", [False, True])
def test_gfx90a_release_writes_back_l2_only_across_gpus_and_spin_loops_sleep(sources, single):
    """gfx90a: a unit's release writes the L2 back (buffer_wbl2) only across GPUs, and its acquire
    never does (an invalidation alone); in a single-GPU build only the abort flag, a 32-bit store
    the host reads, is released at system scope; the spin loops sleep and do no cache
    maintenance; the copy loops neither, nor meet at a barrier."""
    body = _engine(sources, "hip", single)
    wbl2 = [i for i, x in enumerate(body) if re.search(r"\bbuffer_wbl2\b", x)]
    flag_store = re.compile(r"\b(?:flat|global)_store_dword\b(?!x)")
    if single:
        assert not any(re.search(r"\bbuffer_invl2\b", x) for x in body)
        for i in wbl2:
            assert any(flag_store.search(x) for x in body[i + 1:i + 4]), body[i:i + 4]
    else:
        assert any(not any(flag_store.search(x) for x in body[i + 1:i + 4]) for i in wbl2), \
            "no system-scope release of a unit"
        # the acquire after fresh polls invalidates (buffer_invl2, buffer_wbinvl1_vol) without
        # writing the L2 back first, as the compiler's system-scope acquire fence would
        invl2 = [i for i, x in enumerate(body) if re.search(r"\bbuffer_invl2\b", x)]
        assert invl2, "no system-scope acquire"
        for i in invl2:
            assert not any(re.search(r"\bbuffer_wbl2\b", x) for x in body[max(0, i - 4):i]), body[i - 4:i + 1]
    # the innermost loops that sleep (a spin loop may hold the dependencies' poll loop)
    spins = loops(body, innermost=True, holding=r"\bs_sleep\b")
    assert spins, "the spin loop does not sleep"
    for b in spins:
        assert not any(re.search(r"\bbuffer_(?:wbinvl1|invl2|wbl2)", x) for x in b), "cache maintenance in a spin"
    for lp in copy_loops(body, "amd"):
        assert not any(re.search(r"\bbuffer_(?:wbl2|invl2|wbinvl1)|\bs_barrier\b", x) for x in lp)


#: probes of the engine's own post (hccc_post, hccc_conn_sys): a unit's posts to a peer of this GPU,
#: to one of another GPU or host memory, and to a connection whose record says which at run time
POST_PROBE = r"""
#include "hccc_prims.h"
extern "C" __global__ void probe_post_gpu(const hccc_v16* d, hccc_v16* o, uint64_t* t, uint64_t* h, uint64_t v) {
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
  hccc_posts p{t, h, nullptr, v, v, 0};
  hccc_post(p, false);
}
extern "C" __global__ void probe_post_sys(const hccc_v16* d, hccc_v16* o, uint64_t* t, uint64_t* h, uint64_t v) {
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
  hccc_posts p{t, h, nullptr, v, v, 0};
  hccc_post(p, true);
}
extern "C" __global__ void probe_post_conn(const hccc_v16* d, hccc_v16* o, const hccc_conn* c, uint64_t v) {
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
  hccc_posts p{c->tail, nullptr, nullptr, v, v, 0};
  hccc_post(p, hccc_conn_sys(*c));
}
// the acquire after a fresh poll of a same-GPU peer's counter (bit 0) and another GPU's (bit 1)
extern "C" __global__ void probe_wait_gpu(const uint64_t* f, const hccc_v16* d, hccc_v16* o, uint64_t need) {
  while (hccc_poll_peer(f) < need) {}
  hccc_waits w{};
  w.fresh = 1u;
  hccc_waits_acquire(w);
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
}
extern "C" __global__ void probe_wait_sys(const uint64_t* f, const hccc_v16* d, hccc_v16* o, uint64_t need) {
  while (hccc_poll_peer(f) < need) {}
  hccc_waits w{};
  w.fresh = 2u;
  hccc_waits_acquire(w);
  hccc_st16(o + threadIdx.x, hccc_ld16(d + threadIdx.x));
}
"""


def _post_probe(sources, platform: str) -> dict[str, list[str]]:
    """POST_PROBE built against the emitted headers (system scope: a multi-GPU build): sm_90
    machine code (nvdisasm) or gfx90a assembly, function -> lines."""
    d, _ = sources[platform]
    if platform == "cuda":
        dis = _nvdisasm()
        if dis is None:
            pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
        src, out = d / "post_probe.cu", d / "post_probe.cubin"
        cmd = [require_tool("nvcc"), *cuda_flags("sm_90", False, output="-cubin")]
    else:
        src, out = d / "post_probe.hip", d / "post_probe.s"
        cmd = [require_tool("hipcc"), *hip_flags("gfx90a", False, output=("--cuda-device-only", "-S"))]
    src.write_text(POST_PROBE)
    res = subprocess.run([*cmd, "-I", str(d), "-o", str(out), str(src)], capture_output=True, text=True,
                         env=dict(os.environ, HIP_PLATFORM="amd"), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    if platform == "hip":
        return functions(out.read_text(), "amd")
    text = subprocess.run([dis, "-c", str(out)], capture_output=True, text=True, timeout=300, check=True).stdout
    return sass_functions(text)


def test_sm90_a_post_to_a_peer_of_this_gpu_releases_at_gpu_scope(sources):
    """sm_90, a multi-GPU build (docs/kernel-protocol.md, "The narrowest ordering"): a unit's
    posts to a peer of its own GPU are one MEMBAR at GPU scope, never .SYS; to another GPU's or
    host memory one MEMBAR.SYS; a connection's record (hccc_conn::place) picks one of the two at
    run time, each on its own path."""
    funcs = _post_probe(sources, "cuda")
    membars = {f: [x for x in funcs[f] if re.search(r"\bMEMBAR\b", x)]
               for f in ("probe_post_gpu", "probe_post_sys", "probe_post_conn")}
    assert len(membars["probe_post_gpu"]) == 1 and re.search(r"\bMEMBAR\.\w+\.GPU\b", membars["probe_post_gpu"][0])
    assert len(membars["probe_post_sys"]) == 1 and re.search(r"\bMEMBAR\.\w+\.SYS\b", membars["probe_post_sys"][0])
    conn = membars["probe_post_conn"]
    assert sorted(re.search(r"\bMEMBAR\.\w+\.(\w+)", x).group(1) for x in conn) == ["GPU", "SYS"], conn


def test_gfx90a_a_post_to_a_peer_of_this_gpu_writes_no_l2_back(sources):
    """gfx90a, a multi-GPU build: a unit's posts to a peer of its own GPU release at agent scope
    (no buffer_wbl2); to another GPU's or host memory one L2 writeback; a connection's record
    picks at run time: one buffer_wbl2 in all, on the system-scope path. The acquire after a fresh
    poll of a same-GPU peer's counter invalidates the L1 only (no buffer_invl2)."""
    funcs = _post_probe(sources, "hip")
    wbl2 = {f: sum(1 for x in funcs[f] if re.search(r"\bbuffer_wbl2\b", x))
            for f in ("probe_post_gpu", "probe_post_sys", "probe_post_conn")}
    assert wbl2 == {"probe_post_gpu": 0, "probe_post_sys": 1, "probe_post_conn": 1}, wbl2
    # the acquire of a same-GPU peer's counter invalidates the L1 alone; another GPU's, the L2's
    # non-coherent lines too -- and neither writes the L2 back
    has = lambda f, pat: any(re.search(pat, x) for x in funcs[f])
    assert has("probe_wait_gpu", r"\bbuffer_wbinvl1") and not has("probe_wait_gpu", r"\bbuffer_(?:invl2|wbl2)\b")
    assert has("probe_wait_sys", r"\bbuffer_invl2\b") and not has("probe_wait_sys", r"\bbuffer_wbl2\b")


@pytest.fixture(scope="module")
def rdna(sources):
    """gfx1030 (RDNA, wave32) assembly of rank 0, float32 sum, with a probe that the header's
    warp size is the compiler's."""
    tool = require_tool("hipcc")
    d, man = sources["hip"]
    tu = translation_unit(man, Instance("float32", "sum"), [0], "hip")
    tu += ("\n#if defined(__HIP_DEVICE_COMPILE__)\n"
           "static_assert(HCCC_WARP_SIZE == 32, \"gfx1030 runs wave32\");\n#endif\n")
    src, out = d / "rdna.hip", d / "rdna.s"
    src.write_text(tu)
    res = subprocess.run([tool, *hip_flags("gfx1030", False, output=("--cuda-device-only", "-S")), "-I", str(d),
                          "-o", str(out), str(src)], capture_output=True, text=True,
                         env=dict(os.environ, HIP_PLATFORM="amd"), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return out.read_text()


def test_gfx1030_builds_wave32_and_waits_for_its_stores_before_each_barrier(rdna):
    """RDNA: the kernels see the compiler's wavefront (32, checked at compile time above) and
    declare it; every workgroup barrier of the engine follows a wait for the wave's stores
    (gfx10 counts stores in vscnt, which vmcnt(0) does not cover)."""
    assert ".amdhsa_wavefront_size32 1" in rdna
    body = engine(functions(rdna, "amd"), "fLi0E")
    at = [i for i, x in enumerate(body) if re.search(r"\bs_barrier\b", x)]
    assert at, "no barrier"
    for i in at:
        before = body[max(0, i - 8):i]
        assert any(re.search(r"\bs_waitcnt_vscnt\b", x) for x in before), body[max(0, i - 8):i + 1]


#: AMDGPU: an access to scratch (the private segment: spills, stack arrays)
AMD_SCRATCH = re.compile(r"\bscratch_(?:load|store)|\bbuffer_(?:load|store)_\w+\b[^;]*\bs\[0:3\]")


def returns_from(body: list[str], i: int) -> bool:
    """Whether line ``i`` of an AMDGPU function is in the basic block that returns: the lines after
    it reach an ``s_setpc_b64`` with no branch target (a label, ``; %bb.N:``) or branch before it."""
    for y in body[i + 1:]:
        if re.search(r"\bs_setpc_b64\b", y):
            return True
        if re.match(r"^(?:\.LBB\w+:|; %bb\.\d+:)", y) or re.search(r"\bs_(?:c)?branch\w*\b", y):
            return False
    return False


def amd_calls_and_scratch(body: list[str]) -> tuple[list[str], list[int]]:
    """The functions an AMDGPU function calls (each ``s_swappc_b64``'s target: the symbol the
    register pair it jumps through was last set to, ``sym@rel32@lo``, earlier in the function) and
    the lines of its scratch accesses that are not the save of a register at the entry (before the
    first branch target) or its restore in the block that returns (no branch target nor branch
    between it and the ``s_setpc_b64``: the epilogue, which also reads back the SGPRs the entry
    parked in VGPR lanes, one line each)."""
    targets = []
    for i, x in enumerate(body):
        m = re.search(r"\bs_swappc_b64\s+s\[\d+:\d+\],\s*s\[(\d+):\d+\]", x)
        if not m:
            continue
        reg = m.group(1)
        sym = next((mm.group(1) for y in reversed(body[:i])
                    if (mm := re.search(rf"\bs_add_u32\s+s{reg},\s*s{reg},\s*(\w+)@rel32@lo", y))), None)
        targets.append(sym or "?")
    first_label = next((i for i, x in enumerate(body) if re.match(r"^\.LBB\w+:", x)), len(body))
    bad = []
    for i, x in enumerate(body):
        if not AMD_SCRATCH.search(x):
            continue
        saved = i < first_label and re.search(r"\bbuffer_store_dword\b", x)
        restored = re.search(r"\bbuffer_load_dword\b", x) and returns_from(body, i)
        if not (saved or restored):
            bad.append(i)
    return targets, bad


def test_the_amd_scratch_reader_on_a_sample():
    """amd_calls_and_scratch on a hand-written function: the entry's save and the returning block's
    restores (however many SGPR lanes it reads back before s_setpc_b64) pass; a reload on a loop,
    and one in a block that branches before the return, are found."""
    body = ["\tbuffer_store_dword v40, off, s[0:3], s32 offset:4 ; 4-byte Folded Spill",
            "\ts_add_u32 s16, s16, _Z15hccc_sprim_loadI12hccc_programEvR11hccc_sharedT_jjjb@rel32@lo+4",
            "\ts_swappc_b64 s[30:31], s[16:17]",
            ".LBB4_1:                                ; =>This Loop Header: Depth=1",
            "\tbuffer_load_dword v9, off, s[0:3], s33 offset:8 ; 4-byte Folded Reload",      # 4: on the loop
            "\ts_cbranch_scc1 .LBB4_1",
            "; %bb.2:",
            "\tbuffer_load_dword v42, off, s[0:3], s33 offset:12 ; 4-byte Folded Reload",    # 7: branches first
            "\ts_cbranch_execz .LBB4_3",
            ".LBB4_3:",
            "\tbuffer_load_dword v63, off, s[0:3], s33 ; 4-byte Folded Reload",              # 10: the epilogue
            *[f"\tv_readlane_b32 s{30 + k}, v40, {k}" for k in range(60)],
            "\tbuffer_load_dword v40, off, s[0:3], s32 offset:4 ; 4-byte Folded Reload",
            "\ts_setpc_b64 s[30:31]"]
    targets, bad = amd_calls_and_scratch(body)
    assert targets == ["_Z15hccc_sprim_loadI12hccc_programEvR11hccc_sharedT_jjjb"]
    assert bad == [4, 7]


def test_gfx90a_and_gfx1030_engines_call_only_the_per_primitive_block_and_timeout_functions_and_do_not_spill(
        sources, rdna):
    """AMD assembly (float32 sum): the engine's calls go to the launch set-up, the per-primitive
    load and the timeout report only (no call on the per-unit path, as in the CUDA engine), and its
    only scratch accesses are the entry's save and the return's restore of the one register those
    calls clobber: no spill and no stack array on any loop of the per-unit path."""
    for arch, text in (("gfx90a", compiled(sources, "hip", True)), ("gfx1030", rdna)):
        body = engine(functions(text, "amd"), "fLi0E")
        targets, bad = amd_calls_and_scratch(body)
        assert targets and all(any(c in t for c in CALLEES) for t in targets), (arch, targets)
        # (ring AllReduce 8 decodes its primitives at launch: no s_swappc to the per-primitive load)
        assert not any("hccc_sprim_load" in t for t in targets), (arch, targets)
        assert not bad, (arch, [body[i] for i in bad][:4])


# ---------------------------------------------------------------------------------- timers
def test_timeouts_use_global_timers(sources):
    ptx = compiled(sources, "cuda", False)
    assert "%globaltimer" in ptx and not re.search(r"%clock(?:64|_hi)?\b", ptx)
    amd = compiled(sources, "hip", False)
    assert "s_memrealtime" in amd and not re.search(r"\bs_memtime\b", amd)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_gfx90a_bf16_reductions_stay_branch_free_and_short(sources, op):
    prim = prim_of(sources, "hip", "bfloat16", op)
    # two sources: the reduce loops issue their 2 x HCCC_LOADS_REDUCE (8) loads before the first store
    unrolled = [b for b in copy_loops(prim, "amd") if len(loads_before_first_store(b, "amd")) >= 8]
    assert len(unrolled) >= 2                             # reduce, reduce to two outputs
    for body in unrolled:
        inner = [x for x in body[1:-1] if re.match(r"^\.LBB\w+:", x)]
        assert not inner, "branches inside a bf16 reduction loop"
        # at most 8 vectors x 8 lanes: a few instructions per lane, not a conversion routine per lane
        assert len(body) < 8 * 8 * 16, len(body)
        assert not any(re.search(r"\bs_swappc|\bs_setpc", x) for x in body), "a call in the loop"


# ---------------------------------------------------------------------------------- launch ABI
def test_every_kernel_entry_takes_one_parameter_of_the_packed_size(sources):
    """The launch (cuLaunchKernel / hipModuleLaunchKernel kernelParams, runtime/gpu.py) passes one
    pointer, to the packed argument bytes: every entry of a module, the timer's gate too, takes
    exactly one parameter, as large as what the host packs (a second parameter would be read
    through a pointer the host never wrote, and the driver refuses the launch)."""
    ptx = compiled(sources, "cuda", True)
    entries = dict(re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx, flags=re.S))
    assert GATE_SYMBOL in entries and len(entries) >= 2, sorted(entries)
    for name, params in entries.items():
        sizes = re.findall(r"\.param\b[^,]*?\[(\d+)\]", params)
        assert len(re.findall(r"\.param\b", params)) == 1 and len(sizes) == 1, (name, params)
        want = GATE_ARGS.size if name == GATE_SYMBOL else ctypes.sizeof(Args)
        assert int(sizes[0]) == want, (name, sizes, want)


# ---------------------------------------------------------------------------------- one grid
@pytest.mark.slow
def test_cuda_one_grid_entry_runs_the_one_engine(sources):
    """The single-GPU one-grid entry holds no copy loop and no 16-byte access of its own: it picks
    the block's rank's program and calls the engine, the same (not inlined) function every rank
    kernel calls, so the module has one copy of the engine per instance."""
    d, man = sources["cuda"]
    tu = translation_unit(man, Instance("float32", "sum"), list(range(len(man["ranks"]))), "cuda")
    src, out = d / "grid.cu", d / "grid.ptx"
    src.write_text(tu)
    res = subprocess.run([require_tool("nvcc"), *cuda_flags("sm_90", True, output="-ptx"), "-I", str(d),
                          "-o", str(out), str(src)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    funcs = functions(out.read_text(), "ptx")
    name = man["grid"]["cuda"]["kernel"]
    entry = funcs[f"{name}_float32_sum"]
    assert not any(PTX_LD16.search(x) or PTX_ST16.search(x) for x in entry) and not copy_loops(entry, "ptx")
    engines = [f for f in funcs if re.search(r"hccc_runIfLi0E", f)]
    assert len(engines) == 1, engines
    assert re.search(rf"\bcall(?:\.uni)?\b[^;]*\b{engines[0]}\b", "\n".join(entry))
    for r in range(len(man["ranks"])):
        kernel = "\n".join(funcs[f"{man['ranks'][r]['kernel']}_float32_sum"])
        assert re.search(rf"\bcall(?:\.uni)?\b[^;]*\b{engines[0]}\b", kernel)
