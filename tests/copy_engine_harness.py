"""The copy engine's test harness (``hccc_move`` of hccc_prims.h, one thread block in the CPU
emulation, driven through ctypes) and the numpy side of its checks: shared by test_copy_engine.py
(the portable path) and test_bulk_copies.py (the bulk copies)."""
from __future__ import annotations

import numpy as np

from hccc.runtime.reference import round_bf16

HARNESS = r"""
#include "hccc_prims.h"
#include <thread>
#include <vector>

struct job { void *a, *b, *o1, *o2; uint64_t n; };
template <typename T, int RED, bool HASB, int NOUT> static void body(const job& j) {
  // SC 0: no AVG scaling (the scaled pieces are tested with every type in test_dtypes_ops.py)
  hccc_move<T, RED, HASB, NOUT == 2, 0>((const T*)j.a, (const T*)j.b, (T*)j.o1, (T*)j.o2, (uint32_t)j.n,
                                      (uint32_t)hccc_tid(), (uint32_t)hccc_nthreads(), hccc_avg_scale{});
}
template <typename T, int RED> static void (*pick_shape(int hasb, int nout))(const job&) {
  if (hasb) return nout == 2 ? body<T, RED, true, 2> : body<T, RED, true, 1>;
  return nout == 2 ? body<T, RED, false, 2> : body<T, RED, false, 1>;
}
template <typename T> static void (*pick_red(int red, int hasb, int nout))(const job&) {
  if (red == HCCC_SUM) return pick_shape<T, HCCC_SUM>(hasb, nout);
  if (red == HCCC_MAX) return pick_shape<T, HCCC_MAX>(hasb, nout);
  return pick_shape<T, HCCC_MIN>(hasb, nout);
}
// dtype: 0 float32, 1 float16, 2 bfloat16, 3 int32. Runs one thread block of nthreads threads.
extern "C" __attribute__((visibility("default"))) int hccc_test_combine(
    int dtype, int red, int hasb, int nout, int nthreads, void* a, void* b, void* o1, void* o2,
    uint64_t n) {
  void (*fn)(const job&) = dtype == 0 ? pick_red<float>(red, hasb, nout)
                         : dtype == 1 ? pick_red<hccc_half>(red, hasb, nout)
                         : dtype == 2 ? pick_red<hccc_bf16>(red, hasb, nout)
                                      : pick_red<int32_t>(red, hasb, nout);
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, nthreads);
  const job j{a, b, o1, o2, n};
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t) ts.emplace_back([&, t] { hccc_cpu_run_thread(fn, j, &blk, t); });
  for (auto& t : ts) t.join();
  return HCCC_WARP_SIZE;
}
"""

DTYPES = {"float32": (0, np.float32), "float16": (1, np.float16), "bfloat16": (2, np.uint16),
          "int32": (3, np.int32)}
REDS = {"sum": 0, "max": 1, "min": 2}


def arena(nbytes: int) -> np.ndarray:
    """A byte array whose first byte is 64-byte aligned (so offsets set the alignment)."""
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 64
    return raw[skip:skip + nbytes]


def values(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """Element values as stored (bf16: the bit patterns, as uint16)."""
    if dtype == "int32":
        return rng.integers(-1000, 1000, n, dtype=np.int32)
    f = (rng.standard_normal(n) * 50).astype(np.float32)
    if dtype == "float32":
        return f
    if dtype == "float16":
        return f.astype(np.float16)
    return (round_bf16(f).view(np.uint32) >> 16).astype(np.uint16)


def oracle(dtype: str, op: str, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    if b is None:
        return a.copy()
    f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    if dtype == "bfloat16":
        fa = (a.astype(np.uint32) << 16).view(np.float32)
        fb = (b.astype(np.uint32) << 16).view(np.float32)
        return (round_bf16(f(fa, fb)).view(np.uint32) >> 16).astype(np.uint16)
    if dtype == "float16":
        return f(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return f(a, b).astype(a.dtype)


def case_buffers(rng: np.random.Generator, dtype: str, op: str, n: int, offs, hasb: bool):
    """One case's buffers: (``bufs``: (arena, its n-element view at its offset) per offset, garbage
    around each range; ``a`` and ``b`` (None without a second source) filled with values; the
    oracle's result; a copy of every arena before the engine runs)."""
    npt = DTYPES[dtype][1]
    span = (n + 64) * np.dtype(npt).itemsize
    bufs = []
    for off in offs:
        a_ = arena(span)
        a_[:] = rng.integers(0, 256, span, dtype=np.uint8)      # garbage around the range
        bufs.append((a_, a_.view(npt)[off:off + n]))
    a = bufs[0][1]
    a[:] = values(rng, dtype, n)
    b = None
    if hasb:
        b = bufs[1][1]
        b[:] = values(rng, dtype, n)
    return bufs, a, b, oracle(dtype, op, a, b), [x.copy() for x, _ in bufs]
