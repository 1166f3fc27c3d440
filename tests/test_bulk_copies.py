"""Bulk copies (``-DHCCC_TMA=1``, ``HCCC_TMA=1``: sm_90's TMA, ``cp.async.bulk``), the copy engine's
opt-in path for pure copies, proven where this machine can prove it.

In a TMA build a copy's shared-memory vectors (a piece with one source and no scaling: a SEND, a
RECV, a COPY, a receive copied on) move as bulk copies issued by each warp's lane 0, into and out
of its lanes' own slots of the engine's buffer, on one mbarrier a warp; reductions, the head and
tail, misaligned pieces, HIP and CUDA before sm_90 keep the portable path. The CPU emulation models
the mbarrier (a phase's parity, its one arrival, the bytes it expects) and aborts where the
hardware would hang or be undefined, so its runs check the protocol as well as the bytes.

- The engine (``hccc_move``) in a TMA build against numpy, every dtype, shape, misalignment, thread
  count and warp width (1 and 4), property-tested: outputs equal numpy's, nothing outside them
  changes, and the bytes the bulk copies moved are exactly the shared-memory share of the whole
  warp blocks of a copy (counted here from the engine's shape, independently of the engine), none
  for a reduction or a misaligned piece.
- Programs in the emulation built with bulk copies, one thread a warp and warps of 4: ring
  AllReduce on 2 channels and ring AllGather 8, direct receives on and off, in and out of place,
  uneven counts, slices large enough for whole warp blocks: 0 wrong elements; and random valid
  programs of five collectives.
- The environment switch: ``HCCC_TMA=1`` adds ``-DHCCC_TMA=1`` to the CUDA and CPU builds (and to
  their cache keys), a value other than 0 or 1 is refused with a message.
- (slow, nvcc) sm_90: the TMA build of ring AllReduce 8 compiles to bulk copies (PTX
  ``cp.async.bulk`` and the mbarrier wait, SASS ``UBLKCP``) and the default build has none; the
  register budget is checked in ``tests/test_kernel_registers.py``.
"""
from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hccc.runtime.cpu as cpu
import hccc.runtime.cpu_build as cpu_build
from hccc.compiler.ir import engine_shape
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime.launcher import Runner
from hccc.runtime.platform import TMA_ENV, PlatformError, build_switches
from hccc.testing import valid_programs

from conftest import harness_library, require_tool
from copy_engine_harness import DTYPES, HARNESS, REDS
from copy_engine_harness import case_buffers

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

ROOT = Path(__file__).resolve().parent.parent
TMA = "-DHCCC_TMA=1"
#: the CPU emulation's shared-memory buffer holds this many data threads (hccc_cpu_emu.h)
EMU_ASYNC_THREADS = 16
#: emulated warp width -> optimisation level of its harness (as test_copy_engine.WARPS)
WARPS = {1: "-O0", 4: "-O2"}

COUNTER = r"""
extern "C" __attribute__((visibility("default"))) uint64_t hccc_test_bulk_bytes(int stored) {
  return stored ? hccc_cpu_bulk_stored.load() : hccc_cpu_bulk_loaded.load();
}
"""


@pytest.fixture(scope="module")
def bulk_engines(tmp_path_factory):
    """warp width -> the copy-engine harness built with bulk copies."""
    d = tmp_path_factory.mktemp("bulk-engine")
    libs = {}
    for w, opt in WARPS.items():
        lib, _ = harness_library(d, HARNESS + COUNTER, f"bulk_w{w}", warp=w, opt=opt, defines=(TMA,))
        lib.hccc_test_combine.restype = ctypes.c_int
        lib.hccc_test_combine.argtypes = [ctypes.c_int] * 5 + [ctypes.c_void_p] * 4 + [ctypes.c_uint64]
        lib.hccc_test_bulk_bytes.restype = ctypes.c_uint64
        lib.hccc_test_bulk_bytes.argtypes = [ctypes.c_int]
        libs[w] = lib
    return libs


def expected_bulk_bytes(shape: str, n: int, size: int, offs: list[int], nthreads: int, warp: int) -> int:
    """Bytes one output of a piece receives through bulk copies, from the engine's shape: the
    shared-memory vectors (ASYNC_VECTORS a thread) of every whole warp block of the vector body,
    where the piece is a copy whose pointers agree modulo 16 and every data thread has slots."""
    if shape not in ("copy", "copy2") or nthreads > EMU_ASYNC_THREADS:
        return 0
    used = [0, 2] + ([3] if shape == "copy2" else [])
    mis = {offs[k] * size % 16 for k in used}
    if len(mis) != 1:
        return 0                                   # the element-by-element path
    head = min(n, (16 - mis.pop()) % 16 // size)
    nv = (n - head) * size // 16
    nwarps = nthreads // warp
    per = (engine_shape.LOADS + engine_shape.ASYNC_VECTORS) * warp
    nblocks = nv // per if nwarps else 0
    return nblocks * engine_shape.ASYNC_VECTORS * warp * 16


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    lanes = 16 // np.dtype(DTYPES[dtype][1]).itemsize
    shared = draw(st.integers(0, lanes - 1))
    independent = draw(st.booleans()) and draw(st.booleans())
    offs = [draw(st.integers(0, lanes - 1)) if independent else shared for _ in range(4)]
    return {"dtype": dtype, "op": draw(st.sampled_from(sorted(REDS))),
            "shape": draw(st.sampled_from(["copy", "copy", "copy2", "reduce", "inplace"])), "offs": offs,
            "n": draw(st.one_of(st.integers(0, 200), st.integers(0, 6000), st.sampled_from([640, 641, 1280, 2559]))),
            "nthreads": draw(st.sampled_from([1, 3, 4, 5, 8, 13, 16, 17])),
            "warp": draw(st.sampled_from(sorted(WARPS))), "seed": draw(st.integers(0, 2**32 - 1))}


def _run(lib, case):
    """Run one piece; (outputs match, nothing else changed, bytes loaded and stored by bulk copies)."""
    dtype, op, shape, n = case["dtype"], case["op"], case["shape"], case["n"]
    code, npt = DTYPES[dtype]
    size = np.dtype(npt).itemsize
    rng = np.random.default_rng(case["seed"])
    hasb = shape in ("reduce", "inplace")
    nout = 2 if shape == "copy2" else 1
    bufs, a, b, want, before = case_buffers(rng, dtype, op, n, case["offs"], hasb)
    outs = [0] if shape == "inplace" else [2, 3][:nout]
    ptr = lambda k: bufs[k][0].ctypes.data + case["offs"][k] * size
    loaded, stored = lib.hccc_test_bulk_bytes(0), lib.hccc_test_bulk_bytes(1)
    lib.hccc_test_combine(code, REDS[op], int(hasb), nout, case["nthreads"], ptr(0), ptr(1) if hasb else None,
                          ptr(outs[0]), ptr(outs[1]) if nout == 2 else None, n)
    loaded, stored = lib.hccc_test_bulk_bytes(0) - loaded, lib.hccc_test_bulk_bytes(1) - stored
    for k, (arena, view) in enumerate(bufs):
        if k in outs:
            assert np.array_equal(view, want) or (dtype in ("float32", "float16") and
                                                  np.array_equal(view, want, equal_nan=True)), (k, case)
            lo = case["offs"][k] * size
            outside = np.r_[0:lo, lo + n * size:len(arena)]
            assert np.array_equal(arena[outside], before[k][outside]), ("outside", k, case)
        else:
            assert np.array_equal(arena, before[k]), ("input changed", k, case)
    return loaded, stored, nout


@settings(max_examples=120, deadline=None)
@given(case=cases())
def test_the_bulk_path_matches_numpy_and_moves_exactly_the_shared_memory_share(bulk_engines, case):
    loaded, stored, nout = _run(bulk_engines[case["warp"]], case)
    size = np.dtype(DTYPES[case["dtype"]][1]).itemsize
    want = expected_bulk_bytes(case["shape"], case["n"], size, case["offs"], case["nthreads"], case["warp"])
    assert (loaded, stored) == (want, want * nout), case


@pytest.mark.parametrize("warp", sorted(WARPS))
def test_whole_warp_blocks_go_through_bulk_copies(bulk_engines, warp):
    """Deterministic: copies of one, two and several warp blocks per warp (and one vector short),
    one and two outputs: the bulk copies carried data (the path is not vacuous) and it is right."""
    per = (engine_shape.LOADS + engine_shape.ASYNC_VECTORS) * warp * 4    # float32 elements a warp block
    moved = 0
    for nthreads in (warp, 2 * warp + 1, EMU_ASYNC_THREADS):
        for n in (per - 4, per, 2 * per + 3, 7 * per * max(1, nthreads // warp) + 1):
            for shape in ("copy", "copy2"):
                case = {"dtype": "float32", "op": "sum", "shape": shape, "offs": [1, 1, 1, 1], "n": n,
                        "nthreads": nthreads, "warp": warp, "seed": n}
                loaded, stored, nout = _run(bulk_engines[warp], case)
                want = expected_bulk_bytes(shape, n, 4, case["offs"], nthreads, warp)
                assert (loaded, stored) == (want, want * nout), case
                moved += loaded
    assert moved > 0


# ---------------------------------------------------------------------------------- programs
@pytest.fixture(scope="module", params=sorted(WARPS))
def tma_platform(request, tmp_path_factory):
    """A CPU platform whose kernels are built with bulk copies (warps of 1 or 4 threads)."""
    mp = pytest.MonkeyPatch()
    mp.setenv(TMA_ENV, "1")
    if request.param > 1:
        mp.setattr(cpu_build, "_CXX_FLAGS", [*cpu_build._CXX_FLAGS, f"-DHCCC_WARP_SIZE={request.param}"])
    plat = cpu.CpuPlatform(opt="-O0", cache_dir=tmp_path_factory.mktemp(f"tma-w{request.param}"))
    try:
        yield request.param, plat
    finally:
        plat.close()
        mp.undo()


def _programs():
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.frontend.load import load_rccl
    return [with_channels(build_program(gen.ring_allreduce(4), chunk_bytes=4096), 2),
            build_program(load_rccl(ROOT / "examples" / "ring_allgather_8.rccl"), chunk_bytes=4096)]


def test_programs_with_bulk_copies_match_the_oracle(tma_platform):
    """Ring AllReduce 4 on 2 channels and ring AllGather 8, direct receives where safe and none, in
    and out of place, uneven counts, slices of 2 and 4 KiB (several whole warp blocks a piece: 160
    bytes a block at one thread a warp, 640 at four), DATA_THREADS data threads (whole warps and a
    lane, all with slots): 0 wrong elements, every run completes."""
    warp, plat = tma_platform
    assert "-DHCCC_TMA=1" in build_switches()
    for ir in _programs():
        for direct in ("auto", "off"):
            with Runner(ir, plat, "float32", "sum", nthreads=warp + DATA_THREADS, direct=direct,
                        timeout_s=20.0) as runner:
                for inplace in (False, True):
                    for count, slice_bytes in ((ir.nranks * 3 * 700 + 5, 2048), (ir.nranks * 2048 + 3, 4096)):
                        res = runner.run(count=count, inplace=inplace, slice_bytes=slice_bytes)
                        assert res.ok and res.wrong == 0, (ir.name, direct, inplace, count, res.first_wrong,
                                                           res.stuck)


#: data threads of the program runs: 13, three whole warps of 4 and a lane, within the buffer's 16
DATA_THREADS = 13
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "alltoall")


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_random_programs_with_bulk_copies_match_the_oracle(tma_platform, data):
    warp, plat = tma_platform
    alg = data.draw(valid_programs(data.draw(st.sampled_from(COLLECTIVES), label="collective"), max_ranks=4),
                    label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([1024, 4096]), label="chunk_bytes"))
    with Runner(ir, plat, "float32", "sum", nthreads=warp * data.draw(st.integers(2, 5)) + 1,
                timeout_s=20.0) as runner:
        for inplace in (False, True):
            count = ir.nchunks * data.draw(st.integers(1, 400), label="per_chunk") + data.draw(st.integers(0, 7))
            res = runner.run(count=count, inplace=inplace)
            assert res.ok and res.wrong == 0, (ir.name, inplace, count, res.first_wrong, res.stuck)


# ---------------------------------------------------------------------------------- the switch
def test_the_switch_reaches_every_build_with_bulk_copies_and_is_checked(monkeypatch):
    from hccc.runtime.cuda import cuda_flags
    monkeypatch.delenv(TMA_ENV, raising=False)
    assert TMA not in cuda_flags("sm_90") and build_switches() == []
    monkeypatch.setenv(TMA_ENV, "0")
    assert TMA not in cuda_flags("sm_90")
    monkeypatch.setenv(TMA_ENV, "1")
    assert TMA in cuda_flags("sm_90") and build_switches() == [TMA]
    monkeypatch.setenv(TMA_ENV, "yes")
    with pytest.raises(PlatformError, match=r"HCCC_TMA='yes': expected 0 .* or 1"):
        cuda_flags("sm_90")


def test_bulk_copies_are_refused_a_program_whose_table_leaves_them_no_room(monkeypatch, tmp_path):
    """A table within the budget with the cells builds with bulk copies; one past it is refused by
    the runtime (naming the program and the sizes) and by the engine (its static_assert, for builds
    outside the runtime), never left to fail at ptxas."""
    from hccc.compiler.backend.prim_table import (BULK_CELL_BYTES, PTABLE_BUDGET_BYTES, SPRIM_BYTES,
                                                  TMA_PTABLE_BUDGET_BYTES)
    from hccc.runtime.cuda import cuda_flags
    assert TMA_PTABLE_BUDGET_BYTES == PTABLE_BUDGET_BYTES - BULK_CELL_BYTES and BULK_CELL_BYTES == 480 * 16
    monkeypatch.setenv(TMA_ENV, "1")
    fits = {"algorithm": "a", "stats": {"prim_table_bytes": TMA_PTABLE_BUDGET_BYTES // SPRIM_BYTES * SPRIM_BYTES}}
    big = {"algorithm": "big_one", "stats": {"prim_table_bytes": (TMA_PTABLE_BUDGET_BYTES // SPRIM_BYTES + 1)
                                              * SPRIM_BYTES}}
    assert build_switches(fits) == [TMA] and TMA in cuda_flags("sm_90", manifest=fits)
    with pytest.raises(PlatformError, match=r"big_one's table of .* leaves too little .* unset HCCC_TMA"):
        cuda_flags("sm_90", manifest=big)
    monkeypatch.delenv(TMA_ENV)
    assert build_switches(big) == []


# ---------------------------------------------------------------------------------- sm_90 code
@pytest.fixture(scope="module")
def sm90_builds(tmp_path_factory):
    """Ring AllReduce 8, rank 0, float32 sum, sm_90: {tma: (ptx, sass)} of the default and the TMA
    builds."""
    from kernel_asm import nvdisasm
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.cuda import cuda_flags
    from hccc.runtime.gpu import translation_unit
    from hccc.runtime.platform import Instance
    nvcc = require_tool("nvcc")
    dis = nvdisasm()
    if dis is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    d = tmp_path_factory.mktemp("sm90")
    ir = load_program(ROOT / "examples" / "ring_allreduce_8.rccl")
    generate(ir, d, platforms=["cuda"] * ir.nranks)
    man = json.loads((d / "manifest.json").read_text())
    (d / "r0.cu").write_text(translation_unit(man, Instance("float32", "sum"), [0], "cuda"))
    out = {}
    for tma in (False, True):
        extra = [TMA] if tma else []
        code = {}
        for kind in ("ptx", "cubin"):
            dst = d / f"r0_{int(tma)}.{kind}"
            flags = [f for f in cuda_flags("sm_90", output=f"-{kind}") if f != TMA] + extra
            res = subprocess.run([nvcc, *flags, "-I", str(d), "-o",
                                  str(dst), str(d / "r0.cu")], capture_output=True, text=True, timeout=900)
            assert res.returncode == 0, res.stderr[-3000:]
            code[kind] = dst.read_text() if kind == "ptx" else None
        sass = subprocess.run([dis, "-c", str(d / f"r0_{int(tma)}.cubin")], capture_output=True, text=True,
                              timeout=300)
        assert sass.returncode == 0, sass.stderr[-2000:]
        out[tma] = (code["ptx"], sass.stdout)
    return out


@pytest.mark.slow
def test_sm90_tma_build_compiles_to_bulk_copies_and_the_default_has_none(sm90_builds):
    ptx, sass = sm90_builds[True]
    for ins in ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                "cp.async.bulk.global.shared::cta.bulk_group", "cp.async.bulk.commit_group",
                "cp.async.bulk.wait_group.read", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx"):
        assert ins in ptx, ins
    assert re.search(r"\bUBLKCP\b", sass), "no bulk copy in the TMA build's machine code"
    # reductions keep the per-thread cp.async loads (LDGSTS) in the TMA build too
    assert re.search(r"\bLDGSTS\b", sass)
    ptx0, sass0 = sm90_builds[False]
    assert "cp.async.bulk" not in ptx0 and "mbarrier" not in ptx0
    assert not re.search(r"\bUBLKCP\b", sass0) and re.search(r"\bLDGSTS\b", sass0)


@pytest.mark.slow
def test_the_engine_refuses_bulk_copies_beside_a_table_that_leaves_them_no_room(tmp_path, nvcc):
    """A CUDA build outside the runtime (a module's source as the runtime writes it, through nvcc's
    front end, ``-cuda``): ring AllReduce 16's 30-entry table with HCCC_TMA=1 stops at the engine's
    static_assert; without the switch, and ring AllReduce 8's 14 entries with it, compile."""
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.gpu import translation_unit
    from hccc.runtime.platform import Instance

    def errors(n: int, *flags: str) -> str:
        d = tmp_path / f"r{n}"
        if not d.exists():
            d.mkdir()
            generate(build_program(gen.ring_allreduce(n), name=f"ring{n}"), d, platforms=["cuda"] * n)
            man = json.loads((d / "manifest.json").read_text())
            (d / "tu.cu").write_text(translation_unit(man, Instance("float32", "sum"), [0], "cuda", gate=False))
        res = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-cuda", *flags, "-I", str(d), str(d / "tu.cu"),
                              "-o", str(d / "tu.ii")], capture_output=True, text=True, timeout=300)
        return res.stdout + res.stderr if res.returncode else ""
    assert "this program's table leaves too little shared memory" in errors(16, "-DHCCC_TMA=1")
    assert errors(16) == "" and errors(8, "-DHCCC_TMA=1") == ""
