"""The C++ host API's AllToAllv call (``hccc_host_args_v`` in ``hccc_host.h``): AllToAll programs
built with g++ in the CPU emulation, one process per rank, the counts matrix (and displacements)
read by the kernels from each rank's own memory, every receive buffer compared with a numpy
oracle; counts past the scratch bound refused on every rank; programs that cannot run as an
AllToAllv say so in the header and refuse the call."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.backend.codegen import generate
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.alltoallv_call import block_tables

from alltoallv_fit import fit_verdict
from hccc.util.dtypes import only_instance_flags

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
ROOT = Path(__file__).resolve().parent.parent
TRIM = only_instance_flags("float32", "sum")
WAIT_COUNTS = dict(abi.WAITS)["COUNTS"]
VREF = {name: value for name, value, _ in abi.V_REFUSALS}


def build(tmp_path, ir, sanitize: bool = False) -> Path:
    """The test program with ``ir``'s kernels (``sanitize``: under AddressSanitizer, every access
    past a buffer the program allocates aborts it with ASan's report)."""
    d = tmp_path / "gen"
    d.mkdir()
    generate(ir, d, platforms=["cuda"] * ir.nranks)
    tu = tmp_path / "ranks.cpp"
    tu.write_text(f'#include "{ir.name}_cuda.cu"\n#include "{ROOT / "tests" / "host_alltoallv_ranks.cpp"}"\n')
    exe = tmp_path / "ranks"
    san = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"] if sanitize else []
    res = subprocess.run(["g++", "-std=c++17", "-O0", *san, "-DHCCC_PLATFORM_CPU=1", f"-I{d}", *TRIM, "-pthread",
                          str(tu), "-o", str(exe), "-lrt"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return exe


def oracle(c, sd, rd, inplace):
    """Every rank's receive buffer, from the definition (numpy slices of the send buffers)."""
    n = len(c)
    send_len = [max([sd[r, p] + c[r, p] for p in range(n) if c[r, p]], default=0) for r in range(n)]
    recv_len = [max([rd[r, p] + c[p, r] for p in range(n) if c[p, r]], default=0) for r in range(n)]
    if inplace:
        send_len = recv_len = [max(a, b) for a, b in zip(send_len, recv_len)]
    sends = [np.arange(send_len[r], dtype=np.float32) + r * 100000 + 1 for r in range(n)]
    outs = [sends[r].copy() if inplace else np.full(recv_len[r], -1, np.float32) for r in range(n)]
    for s in range(n):
        for d in range(n):
            k = int(c[s, d])
            outs[d][rd[d, s]:rd[d, s] + k] = sends[s][sd[s, d]:sd[s, d] + k]
    return outs


def packed(c):
    return np.cumsum(c, axis=1) - c, (np.cumsum(c, axis=0) - c).T


def run(exe, tmp_path, mats, displs=None, mode="oop", max_count=None, lens=None):
    out = tmp_path / f"out_{mode}_{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    cf = out / "counts.bin"
    np.concatenate([np.asarray(m, np.int64).ravel() for m in mats]).tofile(cf)
    df = "-"
    if displs is not None:
        df = out / "displs.bin"
        np.concatenate([np.concatenate([np.asarray(a, np.int64).ravel(), np.asarray(b, np.int64).ravel()])
                        for a, b in displs]).tofile(df)
    mx = max(int(np.max(m)) for m in mats) if max_count is None else max_count
    extra = []
    if lens is not None:
        extra = [str(out / "lens.bin")]
        np.concatenate([np.asarray(x, np.int64).ravel() for x in lens]).tofile(extra[0])
    res = subprocess.run([str(exe), str(out), str(cf), str(df), mode, str(mx), *extra], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1"})
    return res, out


def check(out, mats, displs=None, inplace=False):
    for k, c in enumerate(mats):
        c = np.asarray(c)
        sd, rd = packed(c) if displs is None else displs[k]
        want = oracle(c, np.asarray(sd), np.asarray(rd), inplace)
        for r, w in enumerate(want):
            got = np.fromfile(out / f"r{r}_c{k}.bin", np.float32)
            assert np.array_equal(got, w), (k, r, got, w)


@pytest.mark.parametrize("make", [pytest.param(lambda: gen.direct_alltoall(4), marks=pytest.mark.slow),
                                  lambda: gen.ring_alltoall(4, chunks_per_rank=2)], ids=["direct", "ring_k2"])
def test_host_alltoallv_calls_match_the_oracle(tmp_path, make):
    """Random, skewed and zero counts, a new matrix every call, the same program; packed, with
    displacements that leave gaps, and in place with symmetric counts. The ring relays through
    scratch: a call with a count past the scratch bound fails on every rank before anything moves."""
    ir = build_program(make(), chunk_bytes=1024)
    exe = build(tmp_path, ir)
    rng = np.random.default_rng(74)
    skew = np.ones((4, 4), np.int64)
    skew[1, 3] = 900                                       # one pair carries ~98 %
    mats = [rng.integers(0, 300, (4, 4)), skew, np.zeros((4, 4), np.int64),
            np.where(rng.random((4, 4)) < 0.5, 0, rng.integers(1, 50, (4, 4)))]
    res, out = run(exe, tmp_path, mats)
    assert res.returncode == 0, res.stdout + res.stderr
    check(out, mats)
    # explicit displacements: blocks in reverse rank order with gaps of 3 elements
    disp = []
    for c in mats[:2]:
        sd = np.zeros((4, 4), np.int64)
        rd = np.zeros((4, 4), np.int64)
        for o in range(4):
            at_s = at_r = 0
            for p in reversed(range(4)):
                sd[o, p], rd[o, p] = at_s, at_r
                at_s += int(c[o, p]) + 3
                at_r += int(c[p, o]) + 3
        disp.append((sd, rd))
    res, out = run(exe, tmp_path, mats[:2], disp)
    assert res.returncode == 0, res.stdout + res.stderr
    check(out, mats[:2], disp)
    sym = rng.integers(0, 40, (4, 4))
    sym = sym + sym.T
    res, out = run(exe, tmp_path, [sym], mode="inplace")
    assert res.returncode == 0, res.stdout + res.stderr
    check(out, [sym], inplace=True)
    if not ir.scratch_chunks:
        return
    c = np.full((4, 4), 5, np.int64)
    c[2, 1] = 64
    res, out = run(exe, tmp_path, [c], max_count=8)
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.splitlines())
    assert lines == sorted(f"rank {r} call 0 error wait {WAIT_COUNTS} entry {2 * 4 + 1} why {VREF['COUNT']}"
                           for r in range(4))


# ---------------------------------------------------------------------------- hostile counts
@pytest.fixture(scope="module")
def asan_direct(tmp_path_factory):
    if not shutil.which("g++"):
        pytest.skip("g++ not installed")
    tmp = tmp_path_factory.mktemp("asan_v")
    ir = build_program(gen.direct_alltoall(4), chunk_bytes=1024)
    vm, _ = block_tables(ir, False)
    assert vm.uses_scratch and vm.k == 1 and block_tables(ir, True)[0].k == 1   # (the oracle's k)
    return build(tmp, ir, sanitize=True), tmp


_HUGE = [2 ** 62, 2 ** 63 - 1, 2 ** 62 + 1, 2 ** 61]


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_device_counts_are_refused_on_every_rank_under_asan(asan_direct, data):
    """Device counts the host never reads, drawn to break the buffers: row sums past a send buffer
    (the sender would read past it and deliver that memory), column sums past a receive buffer
    (writes past it), counts near 2**63 (refused: past the scratch slots), negative counts, in
    place with an asymmetric matrix. Every rank's buffers are exactly as long as given (ASan's redzone
    right after), so any access past one aborts the program; every call either matches the numpy
    oracle or is refused by every rank for the same entry the oracle of what fits names."""
    exe, tmp = asan_direct
    n = 4
    inplace = data.draw(st.booleans(), label="inplace")
    c = np.array(data.draw(st.lists(st.lists(st.integers(0, 12), min_size=n, max_size=n), min_size=n,
                                        max_size=n), label="counts"), dtype=np.int64)
    if inplace and data.draw(st.booleans(), label="symmetric"):
        c = np.triu(c) + np.triu(c, 1).T
    if data.draw(st.integers(0, 3), label="hostile entry") == 0:
        at = data.draw(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), label="at")
        c[at] = data.draw(st.one_of(st.sampled_from(_HUGE), st.integers(-3, -1)), label="value")
    # buffers near what the blocks need: a few elements short or to spare
    need_s = [max(int(np.clip(c[r], 0, 64).sum()), 0) for r in range(n)]
    need_r = [max(int(np.clip(c[:, r], 0, 64).sum()), 0) for r in range(n)]
    if inplace:
        need_s = need_r = [max(a, b) for a, b in zip(need_s, need_r)]
    slack = st.lists(st.integers(-3, 2), min_size=n, max_size=n)
    send_len = [max(0, a + b) for a, b in zip(need_s, data.draw(slack, label="send slack"))]
    recv_len = send_len if inplace else [max(0, a + b) for a, b in zip(need_r, data.draw(slack, label="receive slack"))]
    want = fit_verdict(c, send_len, recv_len, inplace, 1, 64)   # (a piece fits the scratch of max_count)
    res, out = run(exe, tmp, [c], mode="inplace" if inplace else "oop", max_count=64,
                   lens=[list(send_len) + list(recv_len)])
    assert "AddressSanitizer" not in res.stderr, res.stderr[-4000:]
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    lines = sorted(res.stdout.splitlines())
    if want is None:
        assert lines == [], lines
        sd, rd = packed(c)
        sends = [np.arange(send_len[r], dtype=np.float32) + r * 100000 + 1 for r in range(n)]
        for r in range(n):
            got = np.fromfile(out / f"r{r}_c0.bin", np.float32)
            w = sends[r].copy() if inplace else np.full(recv_len[r], -1, np.float32)
            for s in range(n):
                k = int(c[s, r])
                w[rd[r, s]:rd[r, s] + k] = sends[s][sd[s, r]:sd[s, r] + k]
            assert np.array_equal(got, w), (r, got, w)
    else:
        why, at = want
        assert lines == sorted(f"rank {r} call 0 error wait {WAIT_COUNTS} entry {at} why {VREF[why]}"
                               for r in range(n)), (want, lines)


def test_programs_that_cannot_run_as_alltoallv_say_why(tmp_path):
    ir = build_program(gen.ring_allgather(3))
    d = tmp_path / "g"
    d.mkdir()
    generate(ir, d, platforms=["cuda"] * 3)
    h = (d / "hccc_host.h").read_text()
    assert "#define HCCC_HOST_V_K 0" in h and "#define HCCC_HOST_V_OUT_OF_PLACE 0" in h
    assert "per-pair counts apply to AllToAll programs only" in h


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_the_alltoallv_host_program_compiles_for_gpus(tmp_path, target):
    """The CUDA and HIP paths of hccc_host.h's AllToAllv call (the tables copied with cudaMemcpy /
    hipMemcpy) compile with the kernels of an AllToAll program, warnings as errors; a GPU is
    needed to run them."""
    import os
    from conftest import require_tool
    tool = require_tool("nvcc" if target == "cuda" else "hipcc")
    ir = build_program(gen.ring_alltoall(4), chunk_bytes=1024)
    d = tmp_path / "gen"
    d.mkdir()
    generate(ir, d, platforms=[target] * ir.nranks)
    ext = "cu" if target == "cuda" else "hip"
    tu = tmp_path / f"ranks.{ext}"
    tu.write_text(f'#include "{ir.name}_{target}.{ext}"\n#include "{ROOT / "tests" / "host_alltoallv_ranks.cpp"}"\n')
    flags = (["-arch=sm_90", "-Werror", "all-warnings"] if target == "cuda" else ["--offload-arch=gfx90a", "-Werror"])
    res = subprocess.run([tool, "-std=c++17", *flags, f"-I{d}", *TRIM, "-c", str(tu), "-o", str(tmp_path / "a.o")],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, HIP_PLATFORM="amd"))
    assert res.returncode == 0, res.stderr[-4000:]
