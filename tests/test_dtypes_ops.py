"""Element types and reduction operators: the one table (``hccc.util.dtypes``) every layer reads,
and what the kernels compute at the types' edges.

Oracles independent of the kernels: Python's unbounded integers reduced modulo 2**bits for the
integer types (wraparound), numpy's ``fmax`` / ``fmin`` for max / min with NaNs, closed forms for
``avg`` (an average that is representable never overflows: float16 40000 on 8 ranks, float32 3e38),
and the numpy reference executor (``reference.execute``, which reduces in the program's own order,
so even float sums that overflow or round compare exactly).

The default set builds a representative few (dtype, op) instances; the full matrix of every type
and operator, in and out of place at the types' edges, is in the slow set.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from hccc.compiler.backend import codegen
from hccc.compiler.frontend import generators as G
from hccc.compiler.passes.build import build_program
from hccc.runtime import launcher, platform, reference
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.launcher import Runner
from hccc.util import dtypes as T
from communicator_calls import pool  # noqa: F401  (the rank processes' fixture)

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


# ---------------------------------------------------------------------------- the one table
def test_every_layer_reads_the_one_table():
    names = T.DTYPE_NAMES
    assert names == ("float32", "float16", "bfloat16", "int32", "int64", "uint8", "float64")
    assert T.OP_NAMES == ("sum", "max", "min", "prod", "avg")
    assert [d for d, _ in codegen.DTYPES] == list(names) and tuple(codegen.REDOPS) == T.OP_NAMES
    assert tuple(platform.CTYPES) == names and tuple(platform.RED_CONSTS) == T.OP_NAMES
    assert launcher.DTYPES == names and launcher.OPS == T.OP_NAMES
    assert reference.DTYPES == names and reference.OPS == T.OP_NAMES
    from hccc.commands import run
    assert run.DTYPES == names and run.OPS == T.OP_NAMES
    # sizes agree with numpy's
    for d in T.DTYPES:
        assert launcher.ELEMENT_BYTES[d.name] == (2 if d.name == "bfloat16" else np.dtype(d.numpy).itemsize)


def test_emitted_headers_carry_the_table():
    """hccc_platform.h's operator constants are the table's codes, and hccc_prims.h instantiates
    exactly the table's (dtype, op) pairs: every one but an integer avg."""
    env = codegen._template_env()
    ctx = dict(version="t", nslots=8, dtypes=codegen.DTYPES, ops=codegen.REDOPS)
    plat = env.get_template("common/hccc_platform.h.j2").render(**ctx)
    enum = re.search(r"enum \{ (HCCC_SUM[^}]*) \};", plat).group(1)
    assert dict(x.split(" = ") for x in enum.split(", ")) == {o.const: str(o.code) for o in T.OPS}
    prims = env.get_template("common/hccc_prims.h.j2").render(**ctx)
    for d in T.DTYPES:
        line = re.search(rf"#define HCCC_DT_{d.name.upper()}_\(X\) (HCCC_OPS_\w+)\(X, {d.name}, {re.escape(d.ctype)}\)",
                         prims)
        assert line, d.name
        ops = re.search(rf"#define {line.group(1)}\(X, DT, T\)(.*)", prims).group(1)
        got = re.findall(r"HCCC_OP_(\w+)_", ops)
        assert got == [o.name.upper() for o in T.OPS if T.instance_error(d.name, o.name) is None]
    assert {(d.name, o.name) for d, o in T.instances()} == \
        {(d, o) for d in T.DTYPE_NAMES for o in T.OP_NAMES} - {("int32", "avg"), ("int64", "avg"), ("uint8", "avg")}


def test_integer_avg_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no kernel for the integer type int64"):
        T.check_instance("int64", "avg")
    with pytest.raises(platform.PlatformError, match="integer type uint8"):
        platform.instance_expansion(platform.Instance("uint8", "avg"))
    ir = build_program(G.ring_allreduce(3))
    with pytest.raises(ValueError, match="integer type int32"):
        Runner(ir, "cpu", "int32", "avg")
    assert T.dtype("double").name == "float64" and T.dtype("half").name == "float16"
    with pytest.raises(ValueError, match="expected one of"):
        T.dtype("complex64")


# ---------------------------------------------------------------------------- the numpy reference
def _wrap(v: int, bits: int, signed: bool) -> int:
    v %= 1 << bits
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


@pytest.mark.parametrize("dtype,bits,signed", [("int64", 64, True), ("uint8", 8, False), ("int32", 32, True)])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_reference_integers_wrap(dtype, bits, signed, op):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(bits)
    edges = np.array([info.max, info.min, -1 if signed else info.max - 1, 3, 0, 1, info.max // 3],
                     dtype=dtype)
    xs = [np.concatenate([np.roll(edges, r), rng.integers(info.min, info.max, 9, dtype=dtype, endpoint=True)])
          for r in range(4)]
    got = reference.expected("allreduce", xs, op)[0]
    for i in range(len(got)):
        vals = [int(x[i]) for x in xs]
        want = sum(vals) if op == "sum" else int(np.prod(np.array(vals, dtype=object)))
        assert int(got[i]) == _wrap(want, bits, signed), (i, vals)


def test_reference_max_min_nan_loses():
    nan = np.nan
    xs = [np.array([nan, 1.0, nan, -0.0, -np.inf], np.float32), np.array([2.0, nan, nan, 0.0, nan], np.float32),
          np.array([nan, -3.0, nan, 0.0, nan], np.float32)]
    mx = reference.expected("allreduce", xs, "max")[0]
    mn = reference.expected("allreduce", xs, "min")[0]
    np.testing.assert_array_equal(mx, [2.0, 1.0, nan, 0.0, -np.inf])
    np.testing.assert_array_equal(mn, [2.0, -3.0, nan, 0.0, -np.inf])


@pytest.mark.parametrize("dtype,value,n", [("float16", 40000.0, 8), ("float32", 3e38, 8), ("float64", 1.7e308, 6),
                                           ("bfloat16", 3e38, 4)])
def test_reference_avg_scales_first_and_never_overflows(dtype, value, n):
    np_dt = np.float32 if dtype == "bfloat16" else dtype
    x = np.full(5, value, np_dt)
    if dtype == "bfloat16":
        x = reference.round_bf16(x)
    got = reference.expected("allreduce", [x.copy() for _ in range(n)], "avg", bf16=dtype == "bfloat16")[0]
    assert np.isfinite(got).all()
    # a plain sum overflows: the scaling is what keeps it finite
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sum([x.astype(np_dt)] * n, axis=0, dtype=np_dt)).all()
    np.testing.assert_allclose(got.astype(np.float64), float(x[0]), rtol=n * float(np.finfo(np_dt).eps))


def test_reference_avg_rounds_each_scaled_contribution():
    """float16 on 3 ranks: 1/3 rounds to float16 first (0.33325...), each product is rounded to
    float16, then summed: the closed form of that, computed element by element in Python."""
    xs = [np.array([1.0, 2049.0, -7.0], np.float16), np.array([1.0, 3.0, 0.5], np.float16),
          np.array([1.0, -5.0, 65504.0], np.float16)]
    s = float(np.float16(1 / 3))
    got = reference.expected("allreduce", xs, "avg")[0]
    for i in range(3):
        parts = [np.float16(float(x[i]) * s) for x in xs]
        want = np.float16(np.float16(parts[0] + parts[1]) + parts[2])
        assert got[i] == want
    assert reference.expected("allgather", [np.ones(1, np.float32)] * 3, "avg", nchunks=3)[0].tolist() == [1.0] * 3


# ---------------------------------------------------------------------------- kernels at the edges
@pytest.fixture(scope="module")
def pf():
    p = CpuPlatform(opt="-O0")
    yield p
    p.close()


def _run(runner, xs, inplace):
    res = runner.run(count=len(xs[0]), inputs=xs, keep_outputs=True, inplace=inplace)
    assert res.stuck is None, res.stuck
    assert res.wrong == 0, res.first_wrong
    return res


@needs_gxx
def test_int64_prod_wraps_without_undefined_behaviour(pf):
    """Signed 64-bit products that overflow wrap modulo 2**64 (computed unsigned in the kernels),
    in and out of place, against Python's integers."""
    n = 4
    ir = build_program(G.ring_allreduce(n), chunk_bytes=64)
    info = np.iinfo(np.int64)
    edges = np.array([info.max, info.min, -1, (1 << 32) + 1, 3, 0, info.max // 3, -(1 << 62)], np.int64)
    rng = np.random.default_rng(5)
    xs = [np.concatenate([np.roll(edges, r), rng.integers(info.min, info.max, 61, dtype=np.int64)])
          for r in range(n)]
    want = [_wrap(int(np.prod(np.array([int(x[i]) for x in xs], dtype=object))), 64, True) for i in range(len(xs[0]))]
    with Runner(ir, pf, "int64", "prod", nthreads=2) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for x in xs], inplace)
            for r in range(n):
                assert [int(v) for v in res.outputs[r]] == want


@needs_gxx
def test_float16_avg_of_40000_on_8_ranks_stays_finite(pf):
    """40000 on every one of 8 ranks: a sum would overflow float16 (65504) at the second rank; avg
    scales first and stays finite, within the rounding of its 8 additions of 40000 (the partial
    sums of 5000 are not all halves: 25000 is not), as does the largest half 65504; where every
    partial sum is a half the result is exact (32768, 1.0), 2**-24 / 8 underflows to 0 and -0.0
    keeps its sign. In and out of place, over several micro-batches and a ragged tail."""
    n = 8
    ir = build_program(G.ring_allreduce(n), chunk_bytes=128)
    base = np.array([40000.0, 65504.0, -0.0, -65504.0, 1.0, 2.0 ** -24, 32768.0], np.float16)
    count = 7 * 50 + 5
    x = np.resize(base, count).astype(np.float16)
    want = np.resize(base, count).astype(np.float64)
    want[5::7] = 0.0
    exact = np.resize(np.array([0, 0, 1, 0, 1, 1, 1], bool), count)
    with Runner(ir, pf, "float16", "avg", nthreads=2) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for _ in range(n)], inplace)
            assert res.collective_wrong == 0
            for r in range(n):
                out = res.outputs[r]
                assert np.isfinite(out).all()
                np.testing.assert_allclose(out.astype(np.float64), want, rtol=n * 2.0 ** -10)
                np.testing.assert_array_equal(out[exact], want[exact])
                assert (np.signbit(out) == np.signbit(want)).all()


@needs_gxx
def test_float32_avg_near_the_top_and_an_in_place_copy_onto_itself(pf):
    """3e38 and FLT_MAX averaged over 4 ranks stay finite and exact (1/4 is exact). The all-pairs
    MSCCL program copies each rank's own chunk from input to output (``cpy``): in place that copy
    lands on itself, and must still scale the contribution."""
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml")
    fmax = float(np.finfo(np.float32).max)
    rng = np.random.default_rng(2)
    xs = [np.concatenate([np.array([3e38, fmax, -fmax, -0.0], np.float32),
                          rng.integers(-9, 10, 196).astype(np.float32)]) for _ in range(4)]
    for r in range(4):
        xs[r][4:] += r
    want = reference.expected("allreduce", xs, "avg")[0]
    assert np.isfinite(want).all() and want[0] == np.float32(3e38) and want[1] == fmax
    with Runner(ir, pf, "float32", "avg", nthreads=2) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for x in xs], inplace)
            for r in range(4):
                np.testing.assert_array_equal(res.outputs[r], want)
                assert np.signbit(res.outputs[r][3])


@needs_gxx
def test_float64_max_nan_loses(pf):
    """max: a NaN loses to any number (maxNum), NaN only where every rank has one; infinities and
    the largest doubles; in and out of place, against numpy's fmax."""
    n = 3
    ir = build_program(G.ring_allreduce(n), chunk_bytes=64)
    big = np.finfo(np.float64).max
    rng = np.random.default_rng(4)
    count = 203
    xs = [rng.standard_normal(count) * 1e300 for _ in range(n)]
    pick = rng.integers(0, 4, (n, count))
    for r in range(n):
        xs[r][pick[r] == 0] = np.nan
        xs[r][pick[r] == 1] = [big, -big, np.inf, -np.inf][r % 4]
    xs[0][:3] = xs[1][:3] = xs[2][:3] = np.nan
    want = np.fmax.reduce(np.stack(xs), axis=0)
    assert np.isnan(want[:3]).all() and not np.isnan(want[3:]).all()
    with Runner(ir, pf, "float64", "max", nthreads=2) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for x in xs], inplace)
            for r in range(n):
                np.testing.assert_array_equal(res.outputs[r], want)



@needs_gxx
@pytest.mark.parametrize("op", ["max", "min"])
def test_float64_max_min_through_whole_warp_blocks(pf, op):
    """float64 max / min move whole warps' blocks two vectors a source (hccc_costly_reduce, as
    int64 products do): 96 threads (two whole data warps) over chunks of thousands of elements,
    NaNs mixed in, in and out of place, against numpy's fmax / fmin."""
    n = 4
    ir = build_program(G.ring_allreduce(n), chunk_bytes=16 * 1024)
    rng = np.random.default_rng(7)
    count = 8 * 1024 + 13
    xs = [rng.standard_normal(count) * 1e10 for _ in range(n)]
    for r in range(n):
        xs[r][rng.integers(0, 5, count) == 0] = np.nan
    want = (np.fmax if op == "max" else np.fmin).reduce(np.stack(xs), axis=0)
    with Runner(ir, pf, "float64", op, nthreads=96) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for x in xs], inplace)
            for r in range(n):
                np.testing.assert_array_equal(res.outputs[r], want)

# ---------------------------------------------------------------------------- the whole matrix
def _edge_inputs(dtype: str, op: str, n: int, count: int, seed: int) -> list[np.ndarray]:
    """Random values over the type's whole range with its edges mixed in (max, min, -0.0, NaN and
    infinities for max / min)."""
    d = T.dtype(dtype)
    rng = np.random.default_rng(seed)
    if not d.floating:
        info = np.iinfo(d.numpy)
        xs = [rng.integers(info.min, info.max, count, dtype=d.numpy, endpoint=True) for _ in range(n)]
        for r, x in enumerate(xs):
            x[r::7] = info.max
            x[r + 1::11] = info.min
        return xs
    np_dt = np.float32 if dtype == "bfloat16" else np.dtype(d.numpy)
    top = float(np.finfo(np.float32).max) / 4 if dtype == "bfloat16" else float(np.finfo(np_dt).max)
    xs = []
    for r in range(n):
        scale = top if op in ("max", "min", "avg") else (8.0 if op == "prod" else top / (2 * n))
        x = (rng.uniform(-1, 1, count) * scale).astype(np_dt)
        x[r::9] = -0.0
        if op in ("max", "min"):
            x[r::5] = np.nan
            x[r + 2::13] = np.inf if r % 2 else -np.inf
            x[0] = np.nan
        xs.append(reference.round_bf16(x) if dtype == "bfloat16" else x)
    return xs


#: the matrix pairs the default set runs (the others, and every pair here, in the slow set)
DEFAULT_PAIRS = {("uint8", "sum")}


@needs_gxx
@pytest.mark.parametrize("dtype,op", [pytest.param(d.name, o.name, marks=() if (d.name, o.name) in DEFAULT_PAIRS
                                                   else pytest.mark.slow)
                                      for d, o in T.instances()])
def test_every_type_and_op_at_the_edges(pf, dtype, op):
    """Every instance on a 3-rank ring (avg's 1/3 is inexact), in and out of place, at the type's
    edges, against the reference executor element for element (it reduces in the program's order,
    so even sums that round or overflow agree exactly); integer results also against the
    collective's definition."""
    n = 3
    ir = build_program(G.ring_allreduce(n), chunk_bytes=64)
    count = 3 * 64 + 7
    xs = _edge_inputs(dtype, op, n, count, seed=len(dtype) * 7 + len(op))
    with Runner(ir, pf, dtype, op, nthreads=2) as runner:
        for inplace in (False, True):
            res = _run(runner, [x.copy() for x in xs], inplace)
            if not T.dtype(dtype).floating or op in ("max", "min"):
                assert res.collective_wrong == 0, res.first_wrong


# ---------------------------------------------------------------------------- the Communicator
@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("dtype,op", [("int64", "sum"), ("float64", "avg"), ("uint8", "prod"), ("float16", "avg")])
def test_communicator_runs_the_new_types_and_ops(pool, dtype, op):
    """One process per rank, numpy arrays of the new types through the Communicator, against the
    collective's definition (reference.expected)."""
    from communicator_calls import run
    run(pool, build_program(G.ring_allreduce(4, [0, 2, 1, 3])), 1001, dtype, op)
