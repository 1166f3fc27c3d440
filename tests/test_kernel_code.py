"""The compiled kernels, inspected: what the protocol promises for speed and for correctness on real
hardware shows in the code nvcc (PTX, sm_90) and hipcc (gfx90a assembly) emit.

- Copy/reduce loops: every unrolled loop of ``hccc_prim`` (and of the engine it calls) issues at least 4 independent 16-byte
  global loads (``ld.global.*.v4`` / ``global_load_dwordx4``, at least 4 outstanding at once)
  before its first store; 16-byte data accesses never use generic/flat addressing; on gfx90a no
  copy loop touches scratch (spills).
- fp16 / bf16 reductions use packed instructions (``add/max/min.f16x2``, ``.bf16x2``;
  ``v_pk_add/max/min_f16``) and no element-wise float conversion in the unrolled loops; gfx90a,
  which has no bf16 arithmetic, reduces bf16 pairs with shifts and float math (no conversion
  calls, no branches: the loops stay short).
- Sync: no sequentially consistent fence (``membar``, ``fence.sc``) anywhere in the hot path;
  single-GPU builds have no system-scope fence or release at all (gfx90a: no L2 writeback /
  invalidate); the spin loops poll without fences, acquire once after them, and sleep on gfx90a.
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

import pytest

from hccc.compiler.backend.codegen import generate
from hccc.compiler.pipeline import load_program
from hccc.runtime.cuda import cuda_flags
from hccc.runtime.gpu import CTYPES, GATE_ARGS, GATE_SYMBOL, RED_CONSTS, translation_unit
from hccc.runtime.kernel_abi import Args
from hccc.runtime.hip import hip_flags
from hccc.runtime.platform import Instance

from conftest import require_tool

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


def loops(lines: list[str], *, innermost: bool = False) -> list[list[str]]:
    """Bodies of the loops: from a label to a later branch back to it (``innermost``: only loops
    that hold no other loop)."""
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
    """Lines of hccc_prim<T, RED> for (dtype, op) and of the data path of a unit it calls
    (hccc_unit_data), followed by those of the copy / reduce engine's functions (CUDA builds keep
    hccc_combine out of line, HCCC_ENGINE)."""
    funcs = functions(compiled(sources, platform, single_gpu), FLAVOUR[platform])
    code = f"{TYPE_CODE[platform][dtype]}Li{OPS.index(op)}E"
    lines = list(function(funcs, f"hccc_primI{code}E")) + list(function(funcs, f"hccc_unit_dataI{code}E"))
    engine = f"hccc_combineI{code}"
    for name in sorted(funcs):
        if engine in name:
            lines += funcs[name]
    return lines


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


@pytest.mark.parametrize("platform", ["cuda", "hip"])
def test_16_byte_accesses_are_global_not_generic(sources, platform):
    prim = "\n".join(prim_of(sources, platform, "float32", "sum"))
    if platform == "cuda":
        assert len(re.findall(r"\bld\.global(?:\.\w+)*\.v4\.", prim)) >= 16
        assert not re.search(r"\b(?:ld|st)(?:\.(?:cg|cs|volatile|weak))*\.v4\.", prim), "generic 16-byte access"
    else:
        assert prim.count("global_load_dwordx4") >= 16
        # (flat 16-byte loads elsewhere read the kernel's own argument structures)
        for body in loops(prim_of(sources, "hip", "float32", "sum"), innermost=True):
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
def _hot(sources, platform, single_gpu):
    """(the primitive with its unit functions -- wait, data, arrival and posting --, the wait)."""
    funcs = functions(compiled(sources, platform, single_gpu), FLAVOUR[platform])
    unit = [x for part in ("hccc_unit_waitIfE", "hccc_unit_arriveIfE", "hccc_wait_posted")
            for x in function(funcs, part)]
    return prim_of(sources, platform, "float32", "sum", single_gpu) + unit, function(funcs, "hccc_wait_geq")


def test_cuda_hot_path_has_no_sequentially_consistent_fence(sources):
    """No sequentially consistent fence; the waits poll with no fence (the unit acquires once
    after them, in hccc_unit_wait) and a unit's posts are relaxed stores after one acq_rel fence;
    system scope only where ranks may span GPUs."""
    for single in (False, True):
        prim, wait = _hot(sources, "cuda", single)
        text = "\n".join(prim + wait)
        assert not re.search(r"\bmembar\b|\bfence\.sc\b", text)
        scope = "gpu" if single else "sys"
        assert not re.search(r"\bfence\b", "\n".join(wait)), "a fence in the wait: the unit acquires once"
        funcs = functions(compiled(sources, "cuda", single), "ptx")
        unit_wait = "\n".join(function(funcs, "hccc_unit_waitIfE"))
        assert re.search(rf"\bfence\.acq_rel\.{scope}\b", unit_wait), "no acquire after the waits"
        assert re.search(rf"\bst\.relaxed\.{scope}\.global\.u64\b", "\n".join(prim)), "posts are not flag stores"
        assert not re.search(r"\bst\.release\.\w+\.global\b", text), "a release store: a fence each"
        if single:
            assert not re.search(r"\b(?:fence|membar)[.\w]*\.sys\b|\bst\.(?:release|relaxed)\.sys\b", text), \
                "system scope in a single-GPU build"


def test_cuda_spin_loop_polls_relaxed_without_fences(sources):
    _prim, wait = _hot(sources, "cuda", False)
    spins = [b for b in loops(wait, innermost=True) if any(re.search(r"\bld\.relaxed\.\w+\.global\.u64\b", x) for x in b)]
    assert spins, "no polling loop"
    for body in spins:
        assert not any(re.search(r"\bfence\b|\bmembar\b|\bld\.acquire\b", x) for x in body)


def test_gfx90a_spin_loop_sleeps_and_acquires_once(sources):
    for single in (False, True):
        _prim, wait = _hot(sources, "hip", single)
        spins = [b for b in loops(wait, innermost=True) if any("s_sleep" in x for x in b)]
        assert spins, "the spin loop does not sleep"
        for body in spins:
            assert not any(re.search(r"\bbuffer_(?:wbinvl1|invl2|wbl2)", x) for x in body), "fence in the spin loop"
        # the acquire after the waits (hccc_unit_wait: one for all of a unit's counters), none in them
        text = "\n".join(function(functions(compiled(sources, "hip", single), "amd"), "hccc_unit_waitIfE"))
        assert not any(re.search(r"\bbuffer_(?:wbinvl1|invl2)", x) for x in wait), "an acquire in the wait"
        assert "buffer_wbinvl1_vol" in text
        # system scope invalidates L2 (peers on other GPUs); a single-GPU build never does
        assert ("buffer_invl2" in text) != single


def test_gfx90a_single_gpu_build_has_no_system_scope_cache_maintenance(sources):
    prim, wait = _hot(sources, "hip", True)
    assert not any(re.search(r"\bbuffer_(?:wbl2|invl2)\b", x) for x in prim + wait)
    prim, _ = _hot(sources, "hip", False)
    assert any(re.search(r"\bbuffer_wbl2\b", x) for x in prim), "system-scope release expected across GPUs"


# ---------------------------------------------------------------------------------- overlapped sync
#: the functions a message runs through (waits, data path, arrival / posting, LL lines, engine)
PER_MESSAGE = ("hccc_prim", "hccc_unit_wait", "hccc_unit_data", "hccc_unit_arrive", "hccc_wait_posted",
               "hccc_wait_geq", "hccc_ll_move", "hccc_ll_recv_line", "hccc_combine")
PTX_BLOCK_BARRIER = re.compile(r"\b(?:bar|barrier)(?:\.cta)?\.(?:sync|red|arrive)\b")
PTX_ORDERING = re.compile(r"\b(?:fence|membar)\b|\.(?:release|acquire|acq_rel)\b|\batom\.|\bred\.")


def _per_message(funcs: dict[str, list[str]], inlined: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Those functions, by name (``inlined``: parts the platform inlines into their callers)."""
    out = {n: b for n, b in funcs.items() if any(p in n for p in PER_MESSAGE)}
    assert {p for p in PER_MESSAGE if any(p in n for n in out)} == set(PER_MESSAGE) - set(inlined), sorted(out)
    return out


@pytest.mark.parametrize("single", [False, True])
def test_cuda_no_block_barrier_per_message(sources, single):
    """The overlapped sync: no function a message runs through has a block barrier (bar.sync /
    barrier.sync); the warps of a block meet only at warp barriers and votes, and the one block
    barrier of a kernel (hccc_ctx_init's, at the start) is in no loop."""
    funcs = functions(compiled(sources, "cuda", single), "ptx")
    for name, body in _per_message(funcs).items():
        assert not any(PTX_BLOCK_BARRIER.search(x) for x in body), f"block barrier in {name}"
    prim = function(funcs, "hccc_primIfLi0EE")
    assert any(re.search(r"\bbar\.warp\.sync\b", x) for x in prim), "no warp barrier"
    assert any(re.search(r"\bvote(?:\.sync)?\.all\b", x) for x in prim), "no warp vote"
    for name, body in funcs.items():
        for lp in loops(body):
            assert not any(PTX_BLOCK_BARRIER.search(x) for x in lp), f"block barrier in a loop of {name}"


@pytest.mark.parametrize("single", [False, True])
def test_cuda_posting_is_one_release_fence_after_a_block_scope_arrival(sources, single):
    """A unit's arrival is one acq_rel add on a shared counter at block (cta) scope; the posting
    warp then issues one release fence -- at peer scope (gpu in single-GPU builds) where it posts
    tail or head, else at gpu scope for the progress counter alone: two fences in the code, one on
    each path -- and stores tail and head relaxed at peer scope, the progress counter relaxed at
    gpu scope, and `posted` with a cta release: no release store to global memory (each would be
    a fence of its own), no other ordering."""
    funcs = functions(compiled(sources, "cuda", single), "ptx")
    body = function(funcs, "hccc_unit_arriveIfE")
    arrive = "\n".join(body)
    assert len(re.findall(r"\batom\.acq_rel\.cta\.shared(?:::cta)?\.add\.u32\b", arrive)) == 1
    peer = "gpu" if single else "sys"
    fences = re.findall(r"\bfence\.acq_rel\.(\w+)\b", arrive)
    assert sorted(fences) == sorted([peer, "gpu"]), fences
    stores = re.findall(r"\bst\.relaxed\.(\w+)\.global\.u64\b", arrive)
    assert sorted(stores) == sorted([peer] * 2 + ["gpu"]), stores
    releases = re.findall(r"\bst\.release\.(\w+)\.(global|shared(?:::cta)?)\.(u64|u32)\b", arrive)
    assert releases == [("cta", "shared", "u32")], releases
    assert not re.search(r"\bmembar\b", arrive)
    # the add, the two fences (a fence and its .acq_rel: two matches each) and `posted`'s release
    assert len(PTX_ORDERING.findall(arrive)) == 1 + 2 * 2 + 1
    # every flag store comes after a fence in the code (the fences precede the posts)
    first_store = min(i for i, x in enumerate(body) if re.search(r"\bst\.relaxed\.\w+\.global\b", x))
    assert all(i < first_store for i, x in enumerate(body) if re.search(r"\bfence\.acq_rel\b", x))


@pytest.mark.parametrize("single", [False, True])
def test_cuda_one_warp_polls_a_unit_the_others_wait_in_shared_memory(sources, single):
    """hccc_unit_wait: one relaxed block-scope exchange claims the unit; the warp that loses it
    waits for `ready` (hccc_wait_posted, shared memory) and returns, and only the winner calls the
    global polls (hccc_wait_geq, relaxed, no fence), acquires them with one fence (peer scope
    where it polled a peer's counter, else gpu scope: one on each path) and publishes `ready`
    with one cta release: a unit's polls and fences do not grow with the block's warps, nor its
    fences with its counters."""
    funcs = functions(compiled(sources, "cuda", single), "ptx")
    body = function(funcs, "hccc_unit_waitIfE")
    text = "\n".join(body)
    exch = [i for i, x in enumerate(body) if re.search(r"\batom\.(?:relaxed\.)?(?:shared\.cta|cta\.shared)(?:::cta)?\.exch\.b32\b", x)]
    assert len(exch) == 1, text
    calls = [(i, "geq" if "hccc_wait_geq" in x else "posted") for i, x in enumerate(body)
             if "hccc_wait_geq" in x or "hccc_wait_posted" in x]
    # the ring wait before the claim; after it, the loser's wait for `ready`, then the winner's polls
    assert [k for i, k in calls if i < exch[0]] == ["posted"], calls
    after = [k for i, k in calls if i > exch[0]]
    assert after[0] == "posted" and after.count("posted") == 1 and set(after[1:]) == {"geq"}, calls
    peer = "gpu" if single else "sys"
    fences = [(i, m.group(1)) for i, x in enumerate(body) for m in [re.search(r"\bfence\.acq_rel\.(\w+)\b", x)] if m]
    assert sorted(f for _, f in fences) == sorted([peer, "gpu"]), fences
    last_geq = max(i for i, k in calls if k == "geq")
    assert all(i > last_geq for i, _ in fences), "an acquire before the last poll"
    assert not re.search(r"\bmembar\b", text)
    assert len(re.findall(r"\bst\.release\.cta\.shared(?:::cta)?\.u32\b", text)) == 1


def test_cuda_data_path_and_ll_lines_carry_no_ordering(sources):
    """The data of a message (hccc_unit_data, the engine, the LL lines) has no fence, release,
    acquire or atomic: ordering is the arrival's and the posts' alone. An LL line is one 8-byte
    volatile (or relaxed) store, received by polling one 8-byte volatile (or relaxed) load, with no
    fence in the LL path at all."""
    funcs = functions(compiled(sources, "cuda", False), "ptx")
    for name, body in funcs.items():
        if any(p in name for p in ("hccc_unit_data", "hccc_combine", "hccc_ll_move", "hccc_ll_recv_line")):
            assert not any(PTX_ORDERING.search(x) for x in body), f"ordering instruction in {name}"
    ll_store = re.compile(r"\bst\.(?:volatile|relaxed\.\w+)\.global\.(?:u64|b64|v2\.(?:u32|b32))\b")
    ll_load = re.compile(r"\bld\.(?:volatile|relaxed\.\w+)\.global\.(?:u64|b64|v2\.(?:u32|b32))\b")
    for dt in DTYPES:
        move = function(funcs, f"hccc_ll_moveI{TYPE_CODE['cuda'][dt]}Li0E")
        assert sum(1 for x in move if ll_store.search(x)) == 1, dt     # one line store
        assert not any(re.search(r"\bst\.global\.(?:u32|b32|u16|b16|f32)\b", x) and "[%" in x
                       for x in move if ll_store.search(x)), dt
    recv = function(funcs, "hccc_ll_recv_line")
    assert any(ll_load.search(x) for x in recv)
    assert not any(ll_load.search(x) for x in recv if re.search(r"\.v4\.", x))


@pytest.mark.parametrize("single", [False, True])
def test_gfx90a_no_workgroup_barrier_per_message_and_arrivals_drain_the_wave(sources, single):
    """gfx90a: no s_barrier in any function a message runs through; an arrival is one LDS atomic
    add after the wave's memory accesses completed (s_waitcnt vmcnt(0)); the L2 writeback of a
    system-scope release (buffer_wbl2) happens only where a unit is posted, and not at all in
    single-GPU builds; the data path has no cache maintenance."""
    funcs = functions(compiled(sources, "hip", single), "amd")
    for name, body in _per_message(funcs, inlined=("hccc_combine",)).items():
        assert not any(re.search(r"\bs_barrier\b", x) for x in body), f"s_barrier in {name}"
    arrive = function(funcs, "hccc_unit_arriveIfE")
    at = [i for i, x in enumerate(arrive) if re.search(r"\bds_add_rtn_u32\b", x)]
    assert len(at) == 1, "one LDS arrival"
    assert any(re.search(r"\bs_waitcnt\b.*\bvmcnt\(0\)", x) for x in arrive[:at[0]])
    assert any(re.search(r"\bbuffer_wbl2\b", x) for x in arrive) != single
    for part in ("hccc_primIfLi0EE", "hccc_unit_dataIfLi0EE", "hccc_ll_moveIfLi0EE"):
        body = function(funcs, part)
        assert not any(re.search(r"\bbuffer_(?:wbl2|invl2|wbinvl1)", x) for x in body), part
    move = function(funcs, "hccc_ll_moveIfLi0EE")
    assert any(re.search(r"\b(?:global|flat)_store_dwordx2\b", x) for x in move), "no 8-byte LL store"


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
def test_cuda_one_grid_entry_only_dispatches_to_the_rank_block_functions(sources):
    """The single-GPU one-grid entry holds no copy loop and no 16-byte access of its own: it calls
    each rank's block function, the same (not inlined) function the rank's own kernel calls, so
    the module has one copy of every rank's primitive code."""
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
    body = "\n".join(entry)
    assert not any(PTX_LD16.search(x) or PTX_ST16.search(x) for x in entry) and not copy_loops(entry, "ptx")
    nranks = len(man["ranks"])
    for r in range(nranks):
        block_fn = [f for f in funcs if re.search(rf"{man['ranks'][r]['kernel']}_block_float32_sum", f)]
        assert len(block_fn) == 1, block_fn                       # one copy of the rank's code
        assert re.search(rf"\bcall(?:\.uni)?\b[^;]*\b{block_fn[0]}\b", body), f"rank {r} not dispatched"
        kernel = "\n".join(funcs[f"{man['ranks'][r]['kernel']}_float32_sum"])
        assert re.search(rf"\bcall(?:\.uni)?\b[^;]*\b{block_fn[0]}\b", kernel)
