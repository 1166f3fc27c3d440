"""Run generated kernels on the CPU: compile the very same sources with g++ and hccc_cpu_emu.h,
run every (rank, TB) as a thread, and compare with a numpy oracle of the collective.

The C++ driver below is test scaffolding (the runtime package has the real launcher); it builds the
connection table from manifest.json exactly as a runtime must.
"""
from __future__ import annotations

import json
import re
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from hccc.compiler.codegen import generate
from test_codegen_irs import _ir_from_rows, ring_allgather, ring_allreduce, ring_allreduce_fused
from hccc.compiler.program_ir import Buf, Op

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")

DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32}
OPS = ("sum", "max", "min")

DRIVER = r"""
#define HCCC_PLATFORM_CPU 1
#include "@UMBRELLA@"
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

typedef void (*kfn)(hccc_args);
static const int NR = @NRANKS@;
static const int NTBS[NR] = {@NTBS@};
// per rank: instance name ("float32_sum") -> kernel
@KERNELS@
// connections of each rank: {peer, channel}
static const std::vector<std::vector<std::pair<int, int>>> SENDC = {@SENDC@};
static const std::vector<std::vector<std::pair<int, int>>> RECVC = {@RECVC@};
static const int NPROG[NR] = {@NPROG@};

int main(int argc, char** argv) {
  if (argc < 11) return 4;
  const std::string inst = argv[1];
  const int dt = atoi(argv[2]);
  const uint64_t count = strtoull(argv[3], nullptr, 10);
  const uint64_t timeout = strtoull(argv[4], nullptr, 10);
  const uint64_t in_elems = strtoull(argv[5], nullptr, 10), out_elems = strtoull(argv[6], nullptr, 10);
  const uint64_t scr_elems = strtoull(argv[7], nullptr, 10);
  const size_t es = dt == 1 ? 2 : 4;
  const int inplace = atoi(argv[10]);
  std::vector<std::vector<char>> in(NR), out(NR), scr(NR);
  FILE* f = fopen(argv[8], "rb");
  for (int r = 0; r < NR; ++r) {
    in[r].resize(in_elems * es + 16);
    out[r].resize(out_elems * es + 16);
    scr[r].resize(scr_elems * es + 16);
    if (fread(in[r].data(), es, in_elems, f) != in_elems) return 3;
  }
  fclose(f);
  // one FIFO per connection (sender, receiver, channel), in the receiver's memory
  struct Fifo { std::vector<char> slots; uint64_t head = 0, tail = 0; };
  std::map<std::tuple<int, int, int>, Fifo*> fifos;
  auto fifo = [&](int s, int d, int ch) {
    auto key = std::make_tuple(s, d, ch);
    if (!fifos.count(key)) {
      Fifo* x = new Fifo();
      x->slots.resize((size_t)HCCC_NSLOTS * @CHUNK_BYTES@ + 64);
      fifos[key] = x;
    }
    return fifos[key];
  };
  auto align = [](char* p) { return (void*)(((uintptr_t)p + 15) & ~(uintptr_t)15); };
  std::vector<std::vector<hccc_conn>> sc(NR), rc(NR);
  std::vector<std::vector<uint64_t>> prog(NR);
  uint32_t abort_flag = 0;
  hccc_error err;
  memset(&err, 0, sizeof err);
  std::vector<hccc_args> args(NR);
  for (int r = 0; r < NR; ++r) {
    for (auto& pc : SENDC[r]) {
      Fifo* x = fifo(r, pc.first, pc.second);
      sc[r].push_back(hccc_conn{align(x->slots.data()), &x->head, &x->tail});
    }
    for (auto& pc : RECVC[r]) {
      Fifo* x = fifo(pc.first, r, pc.second);
      rc[r].push_back(hccc_conn{align(x->slots.data()), &x->head, &x->tail});
    }
    prog[r].assign(NPROG[r] + 1, 0);
    void* ip = align(in[r].data());
    void* op_ = align(out[r].data());
    if (inplace) op_ = ip;
    args[r] = hccc_args{ip, op_, align(scr[r].data()), count, sc[r].data(), rc[r].data(),
                        prog[r].data(), &abort_flag, &err, timeout};
  }
  std::vector<std::thread> th;
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NTBS[r]; ++b) {
      if (!KERNELS[r].count(inst)) return 5;
      kfn k = KERNELS[r].at(inst);
      hccc_args a = args[r];
      th.emplace_back([k, a, b]() { hccc_cpu_run_block(k, a, b); });
    }
  for (auto& t : th) t.join();
  if (err.valid) {
    printf("STUCK rank %d tb %d seq %d op %d wait %d chunk %d mb %llu\n", err.rank, err.tb, err.seq,
           err.op, err.wait, err.chunk, (unsigned long long)err.microbatch);
    return 2;
  }
  f = fopen(argv[9], "wb");
  for (int r = 0; r < NR; ++r) fwrite(inplace ? align(in[r].data()) : align(out[r].data()), es,
                                      inplace ? in_elems : out_elems, f);
  fclose(f);
  return 0;
}
"""


def build_driver(ir, tmp: pathlib.Path, instances=None, opt: str = "-O1") -> pathlib.Path:
    """Generate ``ir`` and compile it with a test driver. ``instances``: (dtype, op) pairs to
    instantiate (all when None), passed through HCCC_FOR_EACH_INSTANCE to bound compile time."""
    gen = tmp / "gen"
    gen.mkdir()
    generate(ir, gen, platforms=["cuda"] * ir.nranks)
    man = json.loads((gen / "manifest.json").read_text())
    kern = "".join(f"#define K{r['rank']}_(DT, T, OPN, RED) {{#DT \"_\" #OPN, {r['kernel']}_##DT##_##OPN}},\n"
                   for r in man["ranks"])
    kern += "static const std::vector<std::map<std::string, kfn>> KERNELS = {" + ",".join(
        f"{{HCCC_FOR_EACH_INSTANCE(K{r['rank']}_)}}" for r in man["ranks"]) + "};"

    def conns(key):
        return ",".join("{" + ",".join(f"{{{p},{c}}}" for p, c in r[key]) + "}" for r in man["ranks"])

    src = (DRIVER.replace("@UMBRELLA@", man["umbrella"]["cuda"])
           .replace("@NRANKS@", str(ir.nranks))
           .replace("@NTBS@", ",".join(str(r["tbs"]) for r in man["ranks"]))
           .replace("@KERNELS@", kern).replace("@SENDC@", conns("send_conns"))
           .replace("@RECVC@", conns("recv_conns"))
           .replace("@NPROG@", ",".join(str(r["progress_slots"]) for r in man["ranks"]))
           .replace("@CHUNK_BYTES@", str(man["chunk_bytes"])))
    (gen / "driver.cpp").write_text(src)
    exe = tmp / "driver"
    ctype = {"float32": "float", "float16": "hccc_half", "bfloat16": "hccc_bf16", "int32": "int32_t"}
    defs = []
    if instances is not None:
        defs = ["-DHCCC_FOR_EACH_INSTANCE(X)=" + " ".join(
            f"X({d}, {ctype[d]}, {o}, HCCC_{o.upper()})" for d, o in instances)]
    res = subprocess.run([GXX, "-std=c++17", opt, "-Wall", "-Wextra", "-pthread", *defs, "-x", "c++",
                          "-I", str(gen), str(gen / "driver.cpp"), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr, res.stderr[-4000:]
    return exe


def run_driver(exe, ir, inputs: np.ndarray, dtype: str, op: str, count: int, tmp,
               timeout_ns: int = 20_000_000_000, inplace: bool = False):
    """inputs: (nranks, in_elems). Returns outputs (nranks, out_elems) or the STUCK line."""
    maxc = -(-count // ir.nchunks)
    in_elems = inputs.shape[1]
    out_elems = count if ir.out_chunks == ir.nchunks else maxc
    (tmp / "in.bin").write_bytes(np.ascontiguousarray(inputs).tobytes())
    dt_idx = 1 if dtype == "float16" else 0
    res = subprocess.run([str(exe), f"{dtype}_{op}", str(dt_idx), str(count), str(timeout_ns),
                          str(in_elems), str(out_elems), str(ir.scratch_chunks * maxc),
                          str(tmp / "in.bin"), str(tmp / "out.bin"), str(int(inplace))],
                         capture_output=True, text=True, timeout=120)
    if res.returncode == 2:
        return res.stdout.strip()
    assert res.returncode == 0, res.stdout + res.stderr
    n = in_elems if inplace else out_elems
    return np.frombuffer((tmp / "out.bin").read_bytes(), dtype=DTYPES[dtype]).reshape(ir.nranks, n)


def bounds(count, nchunks):
    return [c * count // nchunks for c in range(nchunks + 1)]


@pytest.mark.parametrize("n", [2, 4])
def test_ring_allreduce_cpu(tmp_path, n):
    ir = ring_allreduce(n)
    ir.chunk_bytes = 64          # 16 float32 per slice: many micro-batches, FIFO wrap-around
    exe = build_driver(ir, tmp_path)
    rng = np.random.default_rng(n)
    for count, dtype, op in [(1000, "float32", "sum"), (997, "int32", "max"), (3, "int32", "sum"),
                             (333, "float16", "min"), (n * 16 * 9, "int32", "min")]:
        x = rng.integers(-50, 50, size=(n, count)).astype(DTYPES[dtype])
        out = run_driver(exe, ir, x, dtype, op, count, tmp_path)
        red = {"sum": np.sum, "max": np.max, "min": np.min}[op](x, axis=0)
        assert isinstance(out, np.ndarray), out
        for r in range(n):
            np.testing.assert_array_equal(out[r], red.astype(DTYPES[dtype]), err_msg=f"{count} {dtype} {op} r{r}")
    # in place: input == output
    x = rng.integers(-50, 50, size=(n, 500)).astype(np.int32)
    out = run_driver(exe, ir, x, "int32", "sum", 500, tmp_path, inplace=True)
    for r in range(n):
        np.testing.assert_array_equal(out[r], x.sum(axis=0))


@pytest.mark.parametrize("n", [2, 3])
def test_ring_allreduce_fused_cpu(tmp_path, n):
    """Fused primitives (recvReduceSend, recvReduceCopySend, recvCopySend) with nmb < NSLOTS."""
    ir = ring_allreduce_fused(n, name="fused")
    ir.chunk_bytes = 64
    exe = build_driver(ir, tmp_path)
    rng = np.random.default_rng(n)
    for count, dtype, op in [(n * 16 * 7, "int32", "sum"), (100, "float32", "max"), (7, "float16", "sum")]:
        x = rng.integers(-9, 9, size=(n, count)).astype(DTYPES[dtype])
        out = run_driver(exe, ir, x, dtype, op, count, tmp_path)
        red = {"sum": np.sum, "max": np.max, "min": np.min}[op](x, axis=0)
        assert isinstance(out, np.ndarray), out
        for r in range(n):
            np.testing.assert_array_equal(out[r], red.astype(DTYPES[dtype]))


def test_ring_allgather_cpu_with_cross_tb_dep(tmp_path):
    n = 3
    ir = ring_allgather(n)
    ir.chunk_bytes = 32
    exe = build_driver(ir, tmp_path)
    rng = np.random.default_rng(0)
    for count in (300, 301, 2, 96):
        b = bounds(count, n)
        maxc = -(-count // n)
        x = np.zeros((n, maxc), np.float32)
        full = rng.standard_normal(count).astype(np.float32)
        for r in range(n):
            x[r, :b[r + 1] - b[r]] = full[b[r]:b[r + 1]]
        out = run_driver(exe, ir, x, "float32", "sum", count, tmp_path)
        assert isinstance(out, np.ndarray), out
        for r in range(n):
            np.testing.assert_array_equal(out[r], full)


def test_deadlock_times_out_reports_and_aborts(tmp_path):
    """Both ranks receive before they send: the timeout names rank, TB, primitive and chunk, and
    every TB exits (the driver returns)."""
    rows = []
    for r in range(2):
        rows.append(dict(rank=r, tb=0, seq=0, op=Op.RECV, recv_peer=1 - r, dst_buf=Buf.OUTPUT,
                         dst_off=1 - r, task=1 - r))
        rows.append(dict(rank=r, tb=0, seq=1, op=Op.SEND, send_peer=1 - r, src_buf=Buf.INPUT,
                         src_off=0, task=r))
        rows.append(dict(rank=r, tb=1, seq=0, op=Op.COPY, src_buf=Buf.INPUT, src_off=0,
                         dst_buf=Buf.OUTPUT, dst_off=r))
    ir = _ir_from_rows("stuck", "allgather", 2, 2, 1, 2, 0, rows)
    exe = build_driver(ir, tmp_path, instances=[("float32", "sum")], opt="-O0")
    x = np.ones((2, 8), np.float32)
    out = run_driver(exe, ir, x, "float32", "sum", 16, tmp_path, timeout_ns=50_000_000)
    assert isinstance(out, str)
    m = re.fullmatch(r"STUCK rank ([01]) tb 0 seq 0 op 1 wait 1 chunk ([01]) mb 0", out)
    assert m and int(m.group(2)) == 1 - int(m.group(1)), out


# ---------------------------------------------------------------------------- generic oracle
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def check_collective_cpu(exe, ir, count: int, dtype: str, op: str, tmp, seed: int = 0):
    """Run the compiled driver on random data and compare with the collective's definition."""
    n, nch = ir.nranks, ir.nchunks
    b = bounds(count, nch)
    maxc = -(-count // nch)
    rng = np.random.default_rng(seed)
    npdt = DTYPES[dtype]
    if ir.collective == "allgather":
        full = rng.integers(-100, 100, size=count).astype(npdt)
        if ir.in_chunks == nch:
            x = np.zeros((n, count), npdt)
            for r in range(n):
                x[r, b[r]:b[r + 1]] = full[b[r]:b[r + 1]]
        else:
            x = np.zeros((n, maxc), npdt)
            for r in range(n):
                x[r, :b[r + 1] - b[r]] = full[b[r]:b[r + 1]]
        want = [full] * n
    else:
        x = rng.integers(-100, 100, size=(n, count)).astype(npdt)
        red = REDUCE[op](x, axis=0).astype(npdt)
        if ir.collective == "allreduce":
            want = [red] * n
        else:
            want = [red[b[r]:b[r + 1]] for r in range(n)]
    out = run_driver(exe, ir, x, dtype, op, count, tmp)
    assert isinstance(out, np.ndarray), out
    for r in range(n):
        got = out[r] if ir.out_chunks == nch else out[r, :b[r + 1] - b[r]]
        np.testing.assert_array_equal(got, want[r], err_msg=f"rank {r}, count {count}, {dtype} {op}")
