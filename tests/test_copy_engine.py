"""The copy/reduce engine of the kernels (``hccc_move`` in hccc_prims.h), run in the CPU emulation
against numpy.

``hccc_move`` is the one data path of every Simple and direct piece: o1 (and o2) := a, or a (+) b,
by the data threads of a block. It peels a
scalar head up to 16-byte alignment, moves the body in unrolled 16-byte vectors (warp-contiguous
blocks of HCCC_LOADS vectors per thread in registers and HCCC_ASYNC_VECTORS more through shared
memory where every data thread has its slots -- the CPU emulation's buffer holds 16 threads, so
thread counts on both sides of it run -- whole blocks first, then one vector per thread), a scalar
tail, and falls back to element-wise moves when the pointers disagree modulo 16; fp16 / bf16 reduce
two lanes per 32-bit word (the packed path). Property: for every dtype, operator, shape (one or two
sources, one or two outputs, reduce in place), element count, misalignment of each pointer, thread
count and warp width (1, and 4 where threads beyond the last whole warp exist), the outputs equal
numpy's element-wise result (fp16 through numpy's float16, bf16 rounded with the reference
executor's ``round_bf16``) and not one byte outside the outputs' ranges changes.

gfx90a has no bf16 arithmetic, so the HIP header reduces bf16 pairs with its own shift-and-float
code; that code is compiled for the host here and checked lane by lane against numpy as well.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.ir import engine_shape
from hccc.runtime.reference import round_bf16
from hccc.util import dtypes as dtypes_table

from conftest import harness_library
from copy_engine_harness import DTYPES, HARNESS, REDS
from copy_engine_harness import arena as _arena, case_buffers, oracle as _oracle, values as _values

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

#: emulated warp width -> the optimisation its harness is built with: 4 (threads beyond the last
#: whole warp exist) at -O2, where strict aliasing and vectorisation would break lane accesses that
#: are not aliasing-safe; 1 at -O0 (the test builds' level), the same source and checks at a third
#: of -O2's g++ time (1.7 s against 4.7 s of CPU)
WARPS = {1: "-O0", 4: "-O2"}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """warp width -> the harness library built against the emitted headers."""
    d = tmp_path_factory.mktemp("engine")
    libs = {}
    for w, opt in WARPS.items():
        lib, _ = harness_library(d, HARNESS, f"engine_w{w}", warp=w, opt=opt)
        lib.hccc_test_combine.restype = ctypes.c_int
        lib.hccc_test_combine.argtypes = [ctypes.c_int] * 5 + [ctypes.c_void_p] * 4 + [ctypes.c_uint64]
        assert lib.hccc_test_combine(0, 0, 0, 1, 1, None, None, None, None, 0) == w
        libs[w] = lib
    return libs


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    size = np.dtype(DTYPES[dtype][1]).itemsize
    lanes = 16 // size
    shape = draw(st.sampled_from(["copy", "copy2", "reduce", "reduce2", "inplace"]))
    # mostly a shared misalignment (the vector path), sometimes independent ones (the element path)
    shared = draw(st.integers(0, lanes - 1))
    independent = draw(st.booleans()) and draw(st.booleans())
    offs = [draw(st.integers(0, lanes - 1)) if independent else shared for _ in range(4)]
    n = draw(st.one_of(st.integers(0, 40), st.integers(0, 3000), st.sampled_from([511, 512, 513, 1023, 1024])))
    return {"dtype": dtype, "op": draw(st.sampled_from(sorted(REDS))), "shape": shape, "offs": offs, "n": n,
            "nthreads": draw(st.sampled_from([1, 2, 3, 4, 5, 8, 13, 16, 17, 24])), "warp": draw(st.sampled_from(sorted(WARPS))),
            "seed": draw(st.integers(0, 2**32 - 1))}


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_combine_matches_numpy_and_touches_only_its_outputs(engines, case):
    dtype, op, shape, n = case["dtype"], case["op"], case["shape"], case["n"]
    code, npt = DTYPES[dtype]
    size = np.dtype(npt).itemsize
    rng = np.random.default_rng(case["seed"])
    hasb = shape in ("reduce", "reduce2", "inplace")
    nout = 2 if shape in ("copy2", "reduce2") else 1
    bufs, a, b, want, before = case_buffers(rng, dtype, op, n, case["offs"], hasb)
    if shape == "inplace":             # o1 is a (HCCC_REDUCE: dst := dst (+) src)
        outs = [0]
    else:
        outs = [2, 3][:nout]
    ptr = lambda k: bufs[k][1].ctypes.data if bufs[k][1].size else bufs[k][0].ctypes.data + case["offs"][k] * size
    engines[case["warp"]].hccc_test_combine(
        code, REDS[op], int(hasb), nout, case["nthreads"], ptr(0), ptr(1) if hasb else None,
        ptr(outs[0]), ptr(outs[1]) if nout == 2 else None, n)
    for k, (arena, view) in enumerate(bufs):
        if k in outs:
            got = view
            if dtype in ("float32", "float16"):
                np.testing.assert_array_equal(got, want, err_msg=f"output {k}: {case}")
            else:
                assert np.array_equal(got, want), f"output {k}: {case}"
            lo = case["offs"][k] * size
            outside = np.r_[0:lo, lo + n * size:len(arena)]
            assert np.array_equal(arena[outside], before[k][outside]), f"bytes outside output {k} changed: {case}"
        else:
            assert np.array_equal(arena, before[k]), f"input {k} changed: {case}"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op", sorted(REDS))
def test_every_dtype_and_op_over_whole_blocks_and_ragged_ends(engines, dtype, op):
    """Deterministic sweep: counts around the vector block boundaries, every shared misalignment."""
    code, npt = DTYPES[dtype]
    size = np.dtype(npt).itemsize
    rng = np.random.default_rng(7)
    for w, lib in engines.items():
        for nthreads in (1, 6, 20):
            # elements of one warp block of a reduction: registers' and shared memory's vectors
            # (none of the latter past the buffer's 16 threads)
            vectors = engine_shape.LOADS_REDUCE + (engine_shape.ASYNC_VECTORS // 2 if nthreads <= 16 else 0)
            block = vectors * w * 16 // size
            for n in (block - 1, block, block + 1, 3 * block * max(1, nthreads // w) + 5):
                for off in range(16 // size):
                    arenas = [_arena((n + 64) * size) for _ in range(3)]
                    a, b, o = (x.view(npt)[off:off + n] for x in arenas)
                    a[:] = _values(rng, dtype, n)
                    b[:] = _values(rng, dtype, n)
                    lib.hccc_test_combine(code, REDS[op], 1, 1, nthreads, a.ctypes.data, b.ctypes.data,
                                          o.ctypes.data, None, n)
                    assert np.array_equal(o, _oracle(dtype, op, a, b)), (w, nthreads, n, off)


# ---------------------------------------------------------------------------------- gfx90a bf16
HIP_BF16_HARNESS = r"""
#include <stdint.h>
#define __device__
#define HCCC_FORCEINLINE inline
%(enum)s
%(part)s
extern "C" __attribute__((visibility("default"))) void pk_bf16(int red, const uint32_t* a,
                                                               const uint32_t* b, uint32_t* o, int n) {
  for (int i = 0; i < n; ++i)
    o[i] = red == HCCC_SUM ? hccc_pk_bf16<HCCC_SUM>(a[i], b[i])
         : red == HCCC_PROD ? hccc_pk_bf16<HCCC_PROD>(a[i], b[i])
         : red == HCCC_MAX ? hccc_pk_bf16<HCCC_MAX>(a[i], b[i]) : hccc_pk_bf16<HCCC_MIN>(a[i], b[i]);
}
"""
#: the reduction operators' C constants, as hccc_platform.h declares them (hccc.util.dtypes)
OP_ENUM = "enum { " + ", ".join(f"{o.const} = {o.code}" for o in dtypes_table.OPS) + " };"
OP_CODE = {o.name: o.code for o in dtypes_table.OPS}


@pytest.fixture(scope="module")
def hip_bf16(tmp_path_factory):
    """The gfx90a bf16 pair reduction of templates/hip/platform_hip.h.j2, compiled for the host."""
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "templates" / "hip" / "platform_hip.h.j2").read_text()
    part = text[text.index("#define HCCC_PACKED_BF16 1"):]
    d = tmp_path_factory.mktemp("hipbf16")
    (d / "h.cpp").write_text(HIP_BF16_HARNESS % {"enum": OP_ENUM, "part": part})
    subprocess.run(["g++", "-std=c++20", "-O2", "-fPIC", "-shared", str(d / "h.cpp"), "-o", str(d / "h.so")],
                   check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(d / "h.so"))
    lib.pk_bf16.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return lib


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), red=st.sampled_from(["max", "min", "prod", "sum"]))
def test_gfx90a_bf16_pairs_round_like_numpy(hip_bf16, seed, red):
    """Lanes: random bit patterns (any finite bf16: subnormals, huge values that overflow to inf,
    signed zeros, infinities; NaNs excluded) -- each lane equals round_bf16 of the float32 result."""
    rng = np.random.default_rng(seed)
    n = 4096
    bits = rng.integers(0, 1 << 16, (2, 2 * n), dtype=np.uint32)
    exp_all_ones = (bits & 0x7F80) == 0x7F80
    bits[exp_all_ones & ((bits & 0x7F) != 0)] &= 0xFF80          # NaN -> infinity
    a = (bits[0, ::2] | (bits[0, 1::2] << 16)).astype(np.uint32)
    b = (bits[1, ::2] | (bits[1, 1::2] << 16)).astype(np.uint32)
    out = np.zeros(n, np.uint32)
    hip_bf16.pk_bf16(OP_CODE[red], a.ctypes.data, b.ctypes.data, out.ctypes.data, n)
    for lane in (0, 1):
        fa = ((a >> (16 * lane)) & 0xFFFF).astype(np.uint32) << 16
        fb = ((b >> (16 * lane)) & 0xFFFF).astype(np.uint32) << 16
        x, y = fa.view(np.float32), fb.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            r = {"sum": x + y, "prod": x * y, "max": np.where(x > y, x, y), "min": np.where(x < y, x, y)}[red]
        want = round_bf16(r).view(np.uint32) >> 16
        got = (out >> (16 * lane)) & 0xFFFF
        nan = np.isnan(r)                                       # inf + -inf: any NaN will do
        assert np.array_equal(got[~nan], want[~nan]), red
        assert np.all((got[nan] & 0x7F80) == 0x7F80) and np.all(got[nan] & 0x7F)
