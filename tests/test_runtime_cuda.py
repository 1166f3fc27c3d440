"""CUDA platform (runtime/cuda.py) and the GPU bandwidth benchmark.

Without a GPU: the platform refuses cleanly (CuPy missing / no device), the nvcc build step produces
cubins holding exactly the kernels the manifest names (checked against readelf), the architecture
choice, the residency rule (against a brute-force block placement on synthetic SMs), rank
placement, and the benchmark's byte count (against the algorithm's transfer table).
Tests marked ``gpu`` need a visible CUDA device (and CuPy) and are skipped otherwise, unless
HCCC_REQUIRE_GPU is set.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hccc.runtime.kernel_abi import Args
from hccc.runtime.rank_memory import launch_slice_bytes
from hccc.compiler.backend.codegen import generate
from hccc.compiler.pipeline import CompileOptions, load_algorithm, load_program
from hccc.runtime import cuda
from hccc.runtime.cuda import build_cuda_module, normalise_arch, resolve_arch
import hccc.runtime.gpu as gpu_module
from hccc.runtime.gpu import GATE_SYMBOL, elf_symbols, grid_symbol, kernel_symbol, placement_for, translation_unit
from hccc.runtime.gpu_residency import ResidentKernel, check_residency, residency_capacity
from hccc.runtime.platform import Instance, PlatformError, get_platform
from conftest import cuda_platform_or_skip


ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _cupy_importable() -> bool:
    return importlib.util.find_spec("cupy") is not None


def _gpu_visible() -> bool:
    try:
        get_platform("cuda").close()
        return True
    except PlatformError:
        return False


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cuda.ARCH_ENV, raising=False)


@pytest.fixture(scope="module")
def ring8(tmp_path_factory):
    """examples/ring_allgather_8.rccl generated into a folder: (outdir, manifest, ir)."""
    out = tmp_path_factory.mktemp("ring8")
    ir = load_program(EXAMPLES / "ring_allgather_8.rccl")
    generate(ir, out, platforms=["cuda"] * ir.nranks)
    return out, json.loads((out / "manifest.json").read_text()), ir


# ---------------------------------------------------------------------------------- refusing
def test_no_cupy_is_a_clear_platform_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)      # import cupy -> ImportError
    with pytest.raises(PlatformError) as exc:
        get_platform("cuda")
    assert str(exc.value) == "CuPy is not installed: pip install 'hccc[gpu]'"


@pytest.mark.skipif(not _cupy_importable(), reason="CuPy not installed")
def test_no_device_is_a_clear_platform_error():
    if _gpu_visible():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(PlatformError, match=r"^no CUDA device visible"):
        get_platform("cuda")


def test_cuda_is_registered_without_cupy(monkeypatch):
    from hccc.runtime.platform import available
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert "cuda" in available()


def test_benchmark_without_gpu_exits_with_a_message():
    if _gpu_visible():
        pytest.skip("a CUDA device is visible")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_busbw.py"), "--sizes", "1M"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("gpu_busbw: cannot run: ")
    assert "Traceback" not in res.stderr and res.stdout == ""


# ---------------------------------------------------------------------------------- arch
@pytest.mark.parametrize("text,want", [("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"),
                                       ("compute_80", "sm_80"), ("SM_90a", "sm_90a"),
                                       ("10.0", "sm_100"), (" sm_120 ", "sm_120")])
def test_normalise_arch(text, want):
    assert normalise_arch(text) == want


@pytest.mark.parametrize("text", ["", "sm90", "gfx90a", "sm_9", "9", "90;rm -rf", "sm_90 -O0"])
def test_bad_arch_is_refused(text):
    with pytest.raises(PlatformError, match="is not a CUDA architecture"):
        normalise_arch(text)


def test_arch_precedence(monkeypatch):
    assert resolve_arch() == "sm_90"
    assert resolve_arch("86") == "sm_86"
    monkeypatch.setenv(cuda.ARCH_ENV, "sm_80")
    assert resolve_arch("86") == "sm_80"
    monkeypatch.setenv(cuda.ARCH_ENV, "bogus")
    with pytest.raises(PlatformError, match="HCCC_CUDA_ARCH='bogus'"):
        resolve_arch("86")


# ---------------------------------------------------------------------------------- symbols
def test_kernel_symbol_follows_the_manifest_pattern(ring8):
    _out, man, _ir = ring8
    assert kernel_symbol(man, 3, Instance("float16", "max")) == "hccc_ring_allgather_8_r3_float16_max"
    bad = dict(man, kernel_symbol="{kernel}-{dtype}")
    with pytest.raises(PlatformError, match="not an identifier"):
        kernel_symbol(bad, 0, Instance("float32", "sum"))
    with pytest.raises(PlatformError, match="no rank 8"):
        kernel_symbol(man, 8, Instance("float32", "sum"))
    with pytest.raises(PlatformError, match="unknown dtype"):
        kernel_symbol(man, 0, Instance("int8", "sum"))


def _readelf_global_funcs(path: Path) -> set[str]:
    """Independent oracle: binutils' view of the defined global functions."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not installed")
    out = subprocess.run([readelf, "-Ws", str(path)], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name (Vis may read "DEFAULT [<other>: 10]")
        if len(f) >= 8 and f[3] == "FUNC" and f[4] == "GLOBAL" and f[-2] != "UND":
            names.add(f[-1])
    return names


@given(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True), min_size=1, max_size=12,
                unique=True),
       st.lists(st.booleans(), min_size=12, max_size=12))
@settings(max_examples=6)
def test_elf_symbols_matches_readelf_on_host_objects(tmp_path_factory, names, static):
    """Any ELF64 object: the global (not static) defined functions, as readelf lists them."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler")
    tmp = tmp_path_factory.mktemp("elf")
    src = "\n".join(f"{'static ' if s else ''}int f_{n}(int x) {{ return x + {i}; }}\n"
                    f"int (*keep_{n})(int) = f_{n};" for i, (n, s) in enumerate(zip(names, static)))
    src += "\nextern int undefined_elsewhere(int);\nint call(int x) { return undefined_elsewhere(x); }\n"
    (tmp / "a.c").write_text(src)
    subprocess.run([gcc, "-c", "-O0", "-o", str(tmp / "a.o"), str(tmp / "a.c")], check=True)
    got = elf_symbols(tmp / "a.o")
    want = {f"f_{n}" for n, s in zip(names, static) if not s} | {"call"}
    assert got == want == _readelf_global_funcs(tmp / "a.o")


@pytest.mark.parametrize("data", [b"", b"not an elf at all", b"\x7fELF" + b"\x01" * 60,
                                  b"\x7fELF\x02\x01" + b"\xff" * 100])
def test_elf_symbols_rejects_garbage(data):
    with pytest.raises(PlatformError):
        elf_symbols(data)


# ---------------------------------------------------------------------------------- nvcc build
def _cubin_sm(path: Path) -> int:
    """SM version a cubin was built for (ELF e_flags; layout of ELF ABI version 8 and later)."""
    data = path.read_bytes()
    flags = int.from_bytes(data[0x30:0x34], "little")
    return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


@pytest.mark.slow
def test_nvcc_builds_one_cubin_with_every_rank_kernel(ring8, nvcc):
    out, man, ir = ring8
    inst = Instance("float32", "sum")
    path = build_cuda_module(out, man, inst, nvcc=nvcc)
    # every rank: the one-grid entry too
    want = ({kernel_symbol(man, r, inst) for r in range(ir.nranks)} | {GATE_SYMBOL}
            | {grid_symbol(man, "cuda", inst)})
    assert grid_symbol(man, "cuda", inst) == "hccc_ring_allgather_8_grid_float32_sum"
    assert elf_symbols(path) == want
    assert _readelf_global_funcs(path) == want
    assert _cubin_sm(path) == 90
    # cached: the same inputs give the same file without compiling again
    mtime = path.stat().st_mtime_ns
    assert build_cuda_module(out, man, inst, nvcc=nvcc) == path
    assert path.stat().st_mtime_ns == mtime


def test_cache_hit_does_not_run_the_compiler(ring8, nvcc, monkeypatch):
    out, man, _ir = ring8
    inst = Instance("int32", "min")
    first = build_cuda_module(out, man, inst, ranks=[1], nvcc=nvcc)
    calls = []
    real = subprocess.run

    def spy(cmd, *a, **k):
        calls.append(cmd)
        return real(cmd, *a, **k)

    monkeypatch.setattr(gpu_module.subprocess, "run", spy)
    assert build_cuda_module(out, man, inst, ranks=[1], nvcc=nvcc) == first
    assert not any("-cubin" in c for c in calls)


@pytest.mark.slow
def test_nvcc_subset_of_ranks_other_instance_and_arch(ring8, nvcc, monkeypatch):
    out, man, _ir = ring8
    monkeypatch.setenv(cuda.ARCH_ENV, "sm_80")
    inst = Instance("bfloat16", "max")
    path = build_cuda_module(out, man, inst, ranks=[5, 2, 5], nvcc=nvcc)
    assert elf_symbols(path) == {"hccc_ring_allgather_8_r2_bfloat16_max",
                                 "hccc_ring_allgather_8_r5_bfloat16_max", GATE_SYMBOL}
    assert _cubin_sm(path) == 80
    other = build_cuda_module(out, man, inst, ranks=[2, 5], nvcc=nvcc, arch="sm_90")
    assert other != path and _cubin_sm(other) == 90


def test_translation_unit_includes_only_validated_sources(ring8):
    _out, man, _ir = ring8
    tu = translation_unit(man, Instance("float16", "sum"), [0, 7], "cuda")
    assert re.findall(r'#include "([^"]+)"', tu) == ["ring_allgather_8_r0.cu", "ring_allgather_8_r7.cu"]
    assert "X(float16, hccc_half, sum, HCCC_SUM)" in tu
    # with every rank, the one-grid entry follows the rank sources (it calls their block functions)
    tu = translation_unit(man, Instance("float16", "sum"), list(range(8)), "cuda")
    assert re.findall(r'#include "([^"]+)"', tu) == [f"ring_allgather_8_r{r}.cu" for r in range(8)] + [
        "ring_allgather_8_grid.cu"]
    evil = json.loads(json.dumps(man))
    evil["ranks"][0]["sources"]["cuda"] = "../../etc/passwd"
    with pytest.raises(PlatformError, match="not a plain file name"):
        translation_unit(evil, Instance("float32", "sum"), [0], "cuda")
    with pytest.raises(PlatformError, match="no hip source"):
        translation_unit(man, Instance("float32", "sum"), [0], "hip")
    with pytest.raises(PlatformError, match="rank 9 is out of range"):
        build_cuda_module(_out, man, Instance("float32", "sum"), ranks=[9], nvcc="nvcc")


def test_nvcc_failure_is_a_platform_error_with_the_compiler_message(ring8, nvcc, tmp_path):
    out, man, _ir = ring8
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    src = broken / man["ranks"][0]["source"]
    src.write_text(src.read_text() + "\nthis is not C++;\n")
    with pytest.raises(PlatformError, match=r"nvcc failed to compile the cuda kernels[\s\S]*error"):
        build_cuda_module(broken, man, Instance("float32", "sum"), ranks=[0], nvcc=nvcc)
    # nothing half-built is left in the cache
    entries = list((tmp_path / "cache").rglob("module.cubin"))
    assert all(e.stat().st_size > 0 for e in entries)


def test_missing_nvcc_is_a_platform_error(ring8, monkeypatch):
    out, man, _ir = ring8
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(cuda.os, "access", lambda *a: False)
    with pytest.raises(PlatformError, match="nvcc not found"):
        build_cuda_module(out, man, Instance("float32", "sum"))


# ---------------------------------------------------------------------------------- residency
def _occupancy(sm: dict, k: dict) -> int:
    """The occupancy calculator: blocks of one kernel an SM holds, limited by every resource."""
    per = [sm["slots"], sm["threads"] // k["threads"], sm["regs"] // (k["threads"] * k["regs"])]
    if k["smem"]:
        per.append(sm["smem"] // k["smem"])
    return max(0, min(per))


def _first_fit(sm: dict, nsms: int, blocks: list[dict]) -> bool:
    """Place blocks one by one on the first SM with room for every resource (a block scheduler)."""
    used = [dict(slots=0, threads=0, regs=0, smem=0) for _ in range(nsms)]
    for b in blocks:
        need = dict(slots=1, threads=b["threads"], regs=b["threads"] * b["regs"], smem=b["smem"])
        for u in used:
            if all(u[r] + need[r] <= sm[r] for r in need):
                for r in need:
                    u[r] += need[r]
                break
        else:
            return False
    return True


sm_model = st.fixed_dictionaries(dict(slots=st.integers(1, 32), threads=st.sampled_from([1024, 1536, 2048]),
                                      regs=st.sampled_from([32768, 65536]),
                                      smem=st.sampled_from([65536, 102400, 233472])))
kernel_model = st.fixed_dictionaries(dict(threads=st.sampled_from([32, 64, 128, 256, 512, 1024]),
                                          regs=st.sampled_from([16, 32, 40, 64, 128, 255]),
                                          smem=st.sampled_from([0, 4, 1024, 49152]),
                                          blocks=st.integers(0, 40)))


@given(sm_model, st.integers(1, 8), st.lists(kernel_model, min_size=1, max_size=6), st.randoms())
@settings(max_examples=200)
def test_residency_accepts_only_what_a_block_scheduler_can_place(sm, nsms, kernels, rnd):
    rk = [ResidentKernel(f"k{i}", k["blocks"], _occupancy(sm, k), k["threads"]) for i, k in enumerate(kernels)]
    blocks = [k for k in kernels for _ in range(k["blocks"])]
    try:
        check_residency(nsms, rk)
        ok = True
    except PlatformError:
        ok = False
    event("accepted" if ok else "refused")
    if ok:
        # sufficient: every arrival order places every block
        for _ in range(3):
            rnd.shuffle(blocks)
            assert _first_fit(sm, nsms, blocks)
    live = [k for k in kernels if k["blocks"]]
    if live and all(k == live[0] | {"blocks": k["blocks"]} for k in live) and _occupancy(sm, live[0]) > 0:
        # identical blocks: the rule is exact
        event("identical kernels")
        assert ok == _first_fit(sm, nsms, blocks)
        assert ok == (len(blocks) <= nsms * _occupancy(sm, live[0]))


@given(st.integers(1, 200), st.lists(st.tuples(st.integers(0, 50), st.integers(1, 32)), min_size=1, max_size=40))
def test_residency_capacity_closed_form(sms, ks):
    rk = [ResidentKernel(f"k{i}", b, p, 256) for i, (b, p) in enumerate(ks)]
    live = [p for b, p in ks if b > 0]
    assert residency_capacity(sms, rk) == (sms * min(live) if live else 0)


def test_residency_message_names_the_numbers_and_the_remedies():
    ks = [ResidentKernel(f"hccc_hm_r{r}_float32_sum", 14, 2, 512) for r in range(32)]
    with pytest.raises(PlatformError) as exc:
        check_residency(132, ks, device="GPU 0 (NVIDIA H100)")
    msg = str(exc.value)
    assert "need 448 thread blocks resident together" in msg
    assert "at most 264 (132 SMs x 2 blocks of 512 threads per SM" in msg
    assert "GPU 0 (NVIDIA H100)" in msg and "nWarps" in msg and "more GPUs" in msg
    check_residency(132, [ResidentKernel(k.name, 14, 4, 256) for k in ks])     # 448 <= 528
    with pytest.raises(PlatformError, match="not one block of 1024 threads fits"):
        check_residency(132, [ResidentKernel("big", 1, 0, 1024)])
    with pytest.raises(PlatformError, match="at most 128 kernels concurrently"):
        check_residency(1000, [ResidentKernel(f"k{i}", 1, 8, 32) for i in range(129)])
    check_residency(1, [ResidentKernel("idle", 0, 0, 1024)])      # nothing launched: nothing to check


# ---------------------------------------------------------------------------------- placement
@given(st.integers(0, 300), st.integers(1, 64))
def test_placement(nranks, ndev):
    p = placement_for(nranks, ndev)
    assert len(p) == nranks
    assert p == sorted(p) and all(0 <= d < ndev for d in p)
    if nranks:
        per = -(-nranks // ndev) if ndev > 1 else nranks
        assert max(np.bincount(p)) <= per
    if ndev >= nranks:
        assert p == list(range(nranks)) or ndev == 1
    if ndev == 1:
        assert p == [0] * nranks


# ---------------------------------------------------------------------------------- benchmark
def _bench():
    """benchmarks/gpu_busbw.py as a module (it is a script, not part of the package)."""
    if "gpu_busbw" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_busbw", ROOT / "benchmarks" / "gpu_busbw.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gpu_busbw"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gpu_busbw"]


def _transfer_bytes(path: Path, nbytes: int, esz: int) -> int:
    """Oracle: the sizes of the chunks every transfer of the algorithm moves (its source table)."""
    alg = load_algorithm(path)
    count = nbytes // esz
    n = alg.header.nranks
    chunks = alg.chunk.astype(np.int64)
    return int(((chunks + 1) * count // n - chunks * count // n).sum()) * esz


@pytest.mark.parametrize("name", ["ring_allgather_8", "hm_allreduce_4x8", "ring_allreduce_8"])
@pytest.mark.parametrize("nbytes", [64 << 20, 1 << 30, 4 * 1000 + 12])
def test_bytes_moved_counts_every_transfer_once(name, nbytes):
    bench = _bench()
    path = EXAMPLES / f"{name}.rccl"
    ir = load_program(path)
    moved = bench.bytes_moved(ir, nbytes, "float32")
    assert moved.sent == _transfer_bytes(path, nbytes, 4)
    if name == "ring_allgather_8":
        # out of place, each rank copies its own part into its output: one full buffer in all
        assert moved.local == (nbytes // 4) * 4
        assert moved.total == 8 * (nbytes // 4) * 4 if nbytes % 32 == 0 else True
        # in place the own part already sits in the output: nothing local to move
        assert bench.bytes_moved(ir, nbytes, "float32", inplace=True).local == 0


def test_bytes_moved_closed_forms():
    bench = _bench()
    ring = load_program(EXAMPLES / "ring_allgather_8.rccl")
    assert bench.bytes_moved(ring, 1 << 30).sent == 7 * (1 << 30)        # N-1 chunks per rank
    hm = load_program(EXAMPLES / "hm_allreduce_4x8.rccl")
    assert bench.bytes_moved(hm, 1 << 30).sent == 1984 * (1 << 30) // 32    # 1,984 transfers
    assert bench.bytes_moved(hm, 1 << 30, "float16").sent == 1984 * (1 << 30) // 32


def test_benchmark_size_formatting():
    bench = _bench()
    assert [bench._size(b) for b in (512, 1 << 20, 64 << 20, 1 << 30, 3 << 29)] == \
        ["512B", "1M", "64M", "1G", "1.50G"]
    assert bench.nwarps_candidates(16) == [16, 8, 4, 2, 1]


# ---------------------------------------------------------------------------------- on a GPU
@pytest.fixture
def gpu():
    pf = cuda_platform_or_skip()
    yield pf
    pf.close()


@pytest.mark.gpu
def test_gpu_memory_round_trip(gpu):
    x = np.arange(1 << 20, dtype=np.float32)
    p = gpu.malloc(x.nbytes)
    y = np.full_like(x, -1)
    gpu.memcpy_dtoh(y, p)
    assert not y.any()                      # malloc zeroes
    gpu.memcpy_htod(p, x)
    gpu.memcpy_dtoh(y, p)
    np.testing.assert_array_equal(x, y)
    gpu.memset(p + 4, 0xFF, 8)
    gpu.memcpy_dtoh(y, p)
    assert y.view(np.uint32)[1] == y.view(np.uint32)[2] == 0xFFFFFFFF and y[3] == 3
    with pytest.raises(PlatformError, match="not inside memory"):
        gpu.memcpy_dtoh(y, p + 4)
    gpu.free(p)


@pytest.mark.gpu
def test_gpu_load_launch_gate_and_refuse_oversubscription(gpu, ring8):
    out, man, _ir = ring8
    inst = Instance("float32", "sum")
    mod = gpu.load(gpu.build(out, man, inst))
    with pytest.raises(PlatformError, match="not in"):
        mod.function("no_such_kernel")
    gate = mod.function(GATE_SYMBOL)
    flag = gpu.malloc(8)
    gpu.memcpy_htod(flag, np.array([1, 0], np.uint32))
    s = gpu.stream()
    t = gpu.timer()
    t.start(s)
    gpu.launch(gate, 1, 32, flag.to_bytes(8, "little") + (0).to_bytes(8, "little"), s)
    t.stop(s)
    gpu.synchronize()
    assert t.elapsed_us() >= 0
    k = mod.function(kernel_symbol(man, 0, inst))
    cap = gpu.max_resident_blocks(k, 512)
    assert cap >= gpu.sms(0)
    with pytest.raises(PlatformError, match="resident together"):
        gpu.launch(k, cap + 1, 512, bytes(ctypes.sizeof(Args)), s)


@pytest.mark.gpu
def test_gpu_runs_the_examples_against_the_oracle(gpu):
    launcher = pytest.importorskip("hccc.runtime.launcher")
    for name, nbytes in [("ring_allgather_8", 8 << 20), ("ring_allreduce_8", (1 << 20) + 44)]:
        ir = load_program(EXAMPLES / f"{name}.rccl", CompileOptions(chunk_bytes=1 << 16))
        for inplace in (False, True):
            res = launcher.run_program(ir, backend="cuda", nbytes=nbytes, dtype="float32", op="sum",
                                       inplace=inplace, iters=2, warmup=1, timeout_s=30, seed=1)
            assert res.ok, (name, inplace, res)
            assert res.time_us > 0 and res.iters == 2


@pytest.mark.gpu
def test_gpu_benchmark_prints_a_table(gpu):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_busbw.py"), "--sizes", "16M",
                          "--iters", "3", "--warmup", "1", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert {r["algorithm"] for r in rows} == {"ring_allgather_8", "ring_allreduce_8", "hm_allreduce_4x8"}
    assert all(r["wrong"] == 0 and r["ratio"] > 0 and 0 < r["of_bound"] for r in rows)


# ---------------------------------------------------------------------------------- HIP
def test_hip_without_runtime_or_device_is_a_clear_platform_error(monkeypatch):
    from hccc.runtime import hip
    try:
        pf = get_platform("hip")
    except PlatformError as exc:
        assert re.match(r"(no HIP device visible|the HIP runtime \(libamdhip64\) is not installed)",
                        str(exc)), str(exc)
    else:
        pf.close()
        pytest.skip("a HIP device is visible")
    monkeypatch.setattr(hip.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(f"{name}: nope")))
    with pytest.raises(PlatformError, match=r"^the HIP runtime \(libamdhip64\) is not installed"):
        get_platform("hip")


@pytest.mark.parametrize("text,ok", [("gfx90a", True), ("GFX942", True), ("gfx1100", True),
                                     ("gfx90a:xnack-", True), ("sm_90", False), ("gfx", False),
                                     ("gfx90a;ls", False)])
def test_hip_arch_names(text, ok, monkeypatch):
    from hccc.runtime.hip import ARCH_ENV, normalise_hip_arch, resolve_hip_arch
    if ok:
        assert normalise_hip_arch(text) == text.lower()
        monkeypatch.setenv(ARCH_ENV, text)
        assert resolve_hip_arch("gfx1030") == text.lower()
    else:
        with pytest.raises(PlatformError, match="not an AMD GPU architecture"):
            normalise_hip_arch(text)
    monkeypatch.delenv(ARCH_ENV, raising=False)
    assert resolve_hip_arch(None) == "gfx90a" and resolve_hip_arch("gfx1030") == "gfx1030"


@pytest.mark.slow
def test_hipcc_builds_a_code_object_with_the_rank_kernels(tmp_path, hipcc):
    from hccc.runtime.hip import build_hip_module, hip_module_symbols, offload_bundle_entries
    ir = load_program(EXAMPLES / "ring_allgather_8.rccl")
    out = tmp_path / "gen"
    out.mkdir()
    generate(ir, out, platforms=[("cuda", "hip")] * ir.nranks)
    man = json.loads((out / "manifest.json").read_text())
    inst = Instance("float16", "max")
    path = build_hip_module(out, man, inst, ranks=[6, 1], hipcc=hipcc, arch="gfx908")
    want = {kernel_symbol(man, r, inst) for r in (1, 6)} | {GATE_SYMBOL}
    assert hip_module_symbols(path) == want
    entries = offload_bundle_entries(path.read_bytes())
    gpu_images = [(t, img) for t, img in entries if "amdgcn" in t]
    assert [t for t, _ in gpu_images] == ["hipv4-amdgcn-amd-amdhsa--gfx908"]
    (tmp_path / "image.elf").write_bytes(gpu_images[0][1])
    assert _readelf_global_funcs(tmp_path / "image.elf") == want
    bundler = sorted(Path("/usr/lib").glob("llvm-*/bin/clang-offload-bundler"))
    if bundler:      # clang's own reading of the bundle agrees
        listed = subprocess.run([str(bundler[-1]), "--list", "--type=o", f"--input={path}"],
                                capture_output=True, text=True, check=True).stdout.split()
        assert listed == [t for t, _ in entries]


@pytest.mark.slow
def test_hipcc_builds_the_one_grid_entry_for_gfx90a(tmp_path, hipcc):
    """Every rank on one AMD GPU: the code object holds the one-grid entry next to the rank kernels."""
    from hccc.runtime.hip import build_hip_module, hip_module_symbols
    ir = load_program(EXAMPLES / "hm_allreduce_2x4.rccl")
    out = tmp_path / "gen"
    out.mkdir()
    generate(ir, out, platforms=["hip"] * ir.nranks)
    man = json.loads((out / "manifest.json").read_text())
    inst = Instance("bfloat16", "sum")
    path = build_hip_module(out, man, inst, hipcc=hipcc, arch="gfx90a", single_gpu=True)
    assert hip_module_symbols(path) == ({kernel_symbol(man, r, inst) for r in range(ir.nranks)}
                                        | {GATE_SYMBOL, "hccc_hm_allreduce_2x4_grid_bfloat16_sum"})


@pytest.mark.parametrize("data", [b"", b"junk", b"__CLANG_OFFLOAD_BUNDLE__" + (5).to_bytes(8, "little"),
                                  b"__CLANG_OFFLOAD_BUNDLE__" + (1).to_bytes(8, "little")
                                  + (10 ** 6).to_bytes(8, "little") * 3])
def test_offload_bundle_garbage_is_refused(data):
    from hccc.runtime.hip import hip_module_symbols
    with pytest.raises(PlatformError):
        hip_module_symbols(data)


# ---------------------------------------------------------------------------------- platform logic
class FakeCudaError(RuntimeError):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


class FakeCuda:
    """A stand-in for CuPy's runtime + driver modules with ``ndev`` devices: device memory is
    emulated (so copies and memsets can be checked), launches and stream/event calls are logged,
    and every launch's kernel argument is read back through the parameter pointer array exactly as
    cuLaunchKernel would."""

    memcpyHostToDevice, memcpyDeviceToHost = 1, 2
    streamNonBlocking, eventDisableTiming = 1, 2

    def __init__(self, ndev=1, sms=4, per_sm=2, clock_khz=1_500_000, peer=None):
        self.ndev, self.sms, self.per_sm, self.clock = ndev, sms, per_sm, clock_khz
        self.peer = peer or (lambda a, b: True)
        self._tls = threading.local()     # the current device is per thread, as the runtime's
        self.mem: dict[int, tuple[int, bytearray]] = {}
        self.next = 1 << 32
        self.log: list[tuple] = []
        self.host: dict[int, object] = {}
        self.handles = 100

    def _h(self):
        self.handles += 1
        return self.handles

    def _find(self, ptr, n):
        for base, (dev, buf) in self.mem.items():
            if base <= ptr and ptr + n <= base + len(buf):
                return buf, ptr - base
        raise FakeCudaError(1, "invalid device pointer")

    # runtime
    def getDeviceCount(self):
        return self.ndev

    @property
    def dev(self):
        return getattr(self._tls, "dev", 0)

    def setDevice(self, d):
        self._tls.dev = d

    def getDevice(self):
        return self.dev

    def deviceGetAttribute(self, attr, d):
        return {16: self.sms, 13: self.clock, 75: 9, 76: 0}[attr]

    def getDeviceProperties(self, d):
        return {"name": b"Fake GPU"}

    def malloc(self, n):
        p = self.next
        self.next += (n + 255) // 256 * 256 + 256
        self.mem[p] = (self.dev, bytearray(b"\xAB" * n))
        return p

    def free(self, p):
        if p:
            del self.mem[p]

    def memcpy(self, dst, src, n, kind):
        if kind == self.memcpyHostToDevice:
            buf, off = self._find(dst, n)
            buf[off:off + n] = ctypes.string_at(src, n)
        else:
            buf, off = self._find(src, n)
            ctypes.memmove(dst, bytes(buf[off:off + n]), n)

    def memset(self, p, v, n):
        buf, off = self._find(p, n)
        buf[off:off + n] = bytes([v & 0xFF]) * n

    def streamSynchronize(self, s):
        self.log.append(("streamSynchronize", s))

    def deviceSynchronize(self):
        self.log.append(("deviceSynchronize", self.dev))

    def streamCreateWithFlags(self, flags):
        h = self._h()
        self.log.append(("stream", h, self.dev, flags))
        return h

    def streamDestroy(self, s):
        self.log.append(("streamDestroy", s))

    def eventCreate(self):
        return self._h()

    def eventCreateWithFlags(self, flags):
        return self._h()

    def eventRecord(self, e, s):
        self.log.append(("record", e, s))

    def streamWaitEvent(self, s, e, flags=0):
        self.log.append(("wait", s, e))

    def eventSynchronize(self, e):
        pass

    def eventElapsedTime(self, a, b):
        return 1.25

    def eventDestroy(self, e):
        pass

    def hostAlloc(self, n, flags):
        buf = ctypes.create_string_buffer(n)
        self.host[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def freeHost(self, p):
        del self.host[p]

    def deviceCanAccessPeer(self, a, b):
        return int(self.peer(a, b))

    def deviceEnablePeerAccess(self, b):
        self.log.append(("peer", self.dev, b))
        if ("peer", self.dev, b) in self.log[:-1]:
            raise FakeCudaError(704, "peer access is already enabled")

    # driver
    def moduleLoad(self, path):
        return self._h()

    def moduleUnload(self, m):
        pass

    def moduleGetFunction(self, m, name):
        h = self._h()
        self.log.append(("function", m, name, h))
        return h

    def occupancyMaxActiveBlocksPerMultiprocessor(self, f, block, smem):
        return self.per_sm(block) if callable(self.per_sm) else self.per_sm

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        arg0 = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0]
        size = 16 if bx == 1 else ctypes.sizeof(Args)  # the gate takes (flag, timeout); rank kernels hccc_args
        self.log.append(("launch", f, gx, bx, stream, ctypes.string_at(arg0, size), self.dev))

    def launchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params):
        # the driver refuses a cooperative grid whose blocks cannot all be resident at once
        if gx > self.sms * (self.per_sm(bx) if callable(self.per_sm) else self.per_sm):
            raise FakeCudaError(720, "too many blocks in cooperative launch")
        arg0 = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0]
        self.log.append(("coop", f, gx, bx, stream, ctypes.string_at(arg0, 16), self.dev))


class FakeCudaPlatform(cuda.CudaPlatform):
    def __init__(self, fake, **kw):
        self.fake = fake
        super().__init__(**kw)

    def _open_api(self):
        return self.fake, self.fake


#: every call and constant of the runtime/driver modules the CUDA platform uses
API = sorted(n for n, v in vars(FakeCuda).items() if not n.startswith("_") and not isinstance(v, property))


def test_hip_api_offers_every_call_the_cuda_platform_makes():
    from hccc.runtime.hip import HipApi
    assert [n for n in API if not hasattr(HipApi, n)] == []


def test_fake_platform_memory_and_errors():
    fake = FakeCuda(clock_khz=1_980_000)
    pf = FakeCudaPlatform(fake)
    # the kernels time out by %globaltimer (nanoseconds), whatever the SM clock
    assert pf.ticks_per_us == 1000.0 and pf.arch == "sm_90" and pf.device_name == "GPU 0 (Fake GPU)"
    p = pf.malloc(100)
    got = np.full(100, 7, np.uint8)
    pf.memcpy_dtoh(got, p)
    assert not got.any()                                  # zeroed
    pf.memcpy_htod(p + 10, np.arange(20, dtype=np.uint8))
    pf.memcpy_dtoh(got, p)
    assert list(got[10:30]) == list(range(20)) and not got[:10].any() and not got[30:].any()
    pf.memset(p + 12, 0xFF, 2)
    pf.memcpy_dtoh(got, p)
    assert list(got[10:15]) == [0, 1, 255, 255, 4]
    with pytest.raises(PlatformError, match="not inside memory"):
        pf.memcpy_htod(p + 90, np.zeros(20, np.uint8))
    with pytest.raises(PlatformError, match="did not allocate"):
        pf.free(p + 1)
    with pytest.raises(PlatformError, match="writable C-contiguous"):
        pf.memcpy_dtoh(np.zeros((4, 4), np.uint8)[:, 1], p)
    pf.free(p)
    assert fake.mem == {}
    pf.close()


def test_fake_platform_refuses_without_devices_and_bad_device_counts(monkeypatch):
    with pytest.raises(PlatformError, match="^no CUDA device visible$"):
        FakeCudaPlatform(FakeCuda(ndev=0))
    monkeypatch.setenv(cuda.DEVICES_ENV, "two")
    with pytest.raises(PlatformError, match="HCCC_CUDA_DEVICES='two' must be a positive number"):
        FakeCudaPlatform(FakeCuda(ndev=4))
    monkeypatch.setenv(cuda.DEVICES_ENV, "2")
    pf = FakeCudaPlatform(FakeCuda(ndev=4))
    assert pf.device_count() == 2 and pf.placement(8) == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(PlatformError, match="GPU 2 is not visible"):
        pf.set_device(2)
    monkeypatch.delenv(cuda.DEVICES_ENV)
    assert FakeCudaPlatform(FakeCuda(ndev=4)).placement(4) == [0, 1, 2, 3]


def test_fake_platform_peer_access():
    fake = FakeCuda(ndev=3, peer=lambda a, b: {a, b} != {1, 2})
    pf = FakeCudaPlatform(fake)
    pf.enable_peer_access([0, 1])
    pf.enable_peer_access([1, 0])          # again: "already enabled" is fine
    assert {e for e in fake.log if e[0] == "peer"} == {("peer", 0, 1), ("peer", 1, 0)}
    with pytest.raises(PlatformError, match=r"GPU 1 cannot access GPU 2's memory .*HCCC_CUDA_DEVICES=1"):
        pf.enable_peer_access([2, 0, 1])


def _build_ring8_module(ring8, nvcc):
    out, man, _ir = ring8
    return build_cuda_module(out, man, Instance("float32", "sum"), nvcc=nvcc)


@pytest.mark.slow
def test_fake_platform_launch_passes_the_argument_bytes_and_refuses_oversubscription(ring8, nvcc):
    out, man, _ir = ring8
    fake = FakeCuda(sms=4, per_sm=2)                      # 8 blocks resident at most
    pf = FakeCudaPlatform(fake)
    mod = pf.load(_build_ring8_module(ring8, nvcc))
    k0 = mod.function(kernel_symbol(man, 0, Instance("float32", "sum")))
    k1 = mod.function(kernel_symbol(man, 1, Instance("float32", "sum")))
    s0, s1 = pf.stream(), pf.stream()
    assert [e[3] for e in fake.log if e[0] == "stream"] == [1, 1]       # non-blocking streams
    flag = pf.malloc(8)
    # sizeof(hccc_args) (152 under ABI 9), the abort flag's pointer at its offset 56
    from hccc.runtime import kernel_abi
    args = bytes(range(56)) + flag.to_bytes(8, "little") + bytes(range(64, kernel_abi.sizes()[0]))
    pf.launch(k0, 5, 512, args, s0)
    launches = [e for e in fake.log if e[0] == "launch"]
    assert launches[-1][2:6] == (5, 512, s0.handle, args)
    pf.launch(k0, 5, 512, args, s0)                       # same stream: runs after the first
    with pytest.raises(PlatformError, match=r"need 9 thread blocks resident together but it holds at "
                                            r"most 8 \(4 SMs x 2 blocks of 512 threads"):
        pf.launch(k1, 4, 512, args, s1)
    # the kernels already launched were told to abort
    got = np.zeros(2, np.uint32)
    pf.memcpy_dtoh(got, flag)
    assert list(got) == [1, 0]
    assert len([e for e in fake.log if e[0] == "launch"]) == 2
    pf.synchronize()
    pf.launch(k1, 4, 512, args, s1)                       # after a synchronize nothing is in flight
    assert pf.max_resident_blocks(k1, 512) == 8
    with pytest.raises(PlatformError, match="not in"):
        mod.function("hccc_nope")
    pf.close()


@pytest.mark.slow
def test_fake_platform_timer_gates_every_stream(ring8, nvcc):
    fake = FakeCuda()
    pf = FakeCudaPlatform(fake)
    pf.load(_build_ring8_module(ring8, nvcc))
    streams = [pf.stream() for _ in range(3)]
    t = pf.timer()
    fake.log.clear()
    t.start()
    gate = [e for e in fake.log if e[0] == "launch"]
    assert len(gate) == 1 and gate[0][2:4] == (1, 1)            # one block, one thread
    flag = int.from_bytes(gate[0][5][:8], "little")
    ctl = gate[0][4]
    assert ctypes.c_uint32.from_address(flag).value == 0        # closed: kernels stay queued
    start_ev = [e for e in fake.log if e[0] == "record"][0]
    assert start_ev[2] == ctl
    assert {e[1] for e in fake.log if e[0] == "wait" and e[2] == start_ev[1]} == {s.handle for s in streams}
    for s in streams:
        fake.log.append(("launch-rank", s.handle))
    t.stop()
    assert ctypes.c_uint32.from_address(flag).value == 1        # opened after the join
    joins = [e for e in fake.log if e[0] == "wait" and e[1] == ctl]
    assert len(joins) == 3
    stop_ev = [e for e in fake.log if e[0] == "record"][-1]
    assert stop_ev[2] == ctl and fake.log.index(stop_ev) > max(fake.log.index(j) for j in joins)
    assert t.elapsed_us() == 1250.0
    pf.synchronize()
    t2 = pf.timer()
    t2.start()                                                  # the flag is reused once synced
    assert int.from_bytes([e for e in fake.log if e[0] == "launch"][-1][5][:8], "little") == flag
    t2.stop()
    pf.close()
    assert fake.host == {}


@pytest.mark.slow   # an nvcc build
def test_fake_platform_under_the_launcher(nvcc):
    """The launcher drives the CUDA platform end to end (build, load, residency, FIFOs, streams,
    gated timing, launches); the fake runs no kernel, so only the plumbing is checked here."""
    from hccc.runtime.kernel_abi import Args
    from hccc.runtime.launcher import Runner
    ir = load_program(EXAMPLES / "ring_allgather_8.rccl", CompileOptions(chunk_bytes=4096))
    fake = FakeCuda(sms=132, per_sm=2)
    pf = FakeCudaPlatform(fake)
    with Runner(ir, pf, "float32", "sum", timeout_s=2.0) as runner:
        log_all = list(fake.log)
        fake.log.clear()
        res = runner.run(8 * 1024 * 4, iters=2, warmup=1)
        assert res.stuck is None and res.iters == 2 and res.time_us == 1250.0
        # every rank on one GPU: one cooperative launch of the one-grid entry per run, whose
        # blocks are every rank's thread blocks; no kernel per rank
        assert [e for e in fake.log if e[0] == "launch" and e[3] != 1] == []
        launches = [e for e in fake.log if e[0] == "coop"]
        assert len(launches) == 3
        assert {e[2] for e in launches} == {sum(int(t) for t in ir.ntbs)} and {e[3] for e in launches} == {512}
        assert ("hccc_ring_allgather_8_grid_float32_sum", launches[0][1]) in {
            (e[2], e[3]) for e in log_all if e[0] == "function"}
        rank_args = []
        for e in launches:
            table, nranks = struct.unpack("<QQ", e[5])
            assert nranks == ir.nranks
            buf, off = fake._find(table, nranks * ctypes.sizeof(Args))     # device memory
            rank_args += [bytes(buf[off + r * ctypes.sizeof(Args):off + (r + 1) * ctypes.sizeof(Args)])
                          for r in range(nranks)]
        assert len({Args.from_buffer_copy(b).send_conns for b in rank_args[:ir.nranks]}) == ir.nranks
        for raw in rank_args:
            a = Args.from_buffer_copy(raw)
            assert a.count == 8 * 1024 and a.timeout == int(2.0 * 1e6 * pf.ticks_per_us)
            assert a.slice_bytes == launch_slice_bytes(ir, 8 * 1024 * 4, 4, ir.chunk_bytes, "simple")
            for ptr in (a.send_conns, a.recv_conns, a.progress, a.error):
                fake._find(ptr, 8)          # inside an allocation the runner still holds
            # the abort flag is pinned, mapped host memory (the host raises it with a plain store)
            assert a.abort_flag in fake.host
        gates = [e for e in fake.log if e[0] == "launch" and e[3] == 1]
        assert len(gates) == 3                                         # one per timed iteration
    # 16 thread blocks of 512 threads cannot all be resident on 4 SMs x 1 block
    with pytest.raises(PlatformError, match="resident"):
        Runner(ir, FakeCudaPlatform(FakeCuda(sms=4, per_sm=1)), "float32", "sum")


@pytest.mark.slow
def test_fake_platform_launches_a_kernel_per_rank_across_gpus_or_when_asked(nvcc):
    """Ranks on several GPUs (and one_grid=False) keep one kernel per rank, each in its own stream."""
    from hccc.runtime.launcher import Runner
    ir = load_program(EXAMPLES / "ring_allgather_8.rccl", CompileOptions(chunk_bytes=4096))
    for fake, kw in ((FakeCuda(ndev=2, sms=132), {}), (FakeCuda(sms=132), {"one_grid": False})):
        pf = FakeCudaPlatform(fake)
        with Runner(ir, pf, "float32", "sum", timeout_s=2.0, **kw) as runner:
            assert runner.grid_fn is None
            fake.log.clear()
            runner.run(8 * 1024 * 4)
            launches = [e for e in fake.log if e[0] == "launch" and e[3] != 1]
            assert [e for e in fake.log if e[0] == "coop"] == []
            assert sorted(e[2] for e in launches) == sorted(int(t) for t in ir.ntbs)
            assert len({e[4] for e in launches}) == ir.nranks
            assert {e[6] for e in launches} == ({0, 1} if fake.ndev == 2 else {0})
    with pytest.raises(PlatformError, match="as one grid: its ranks are not all on one device"):
        Runner(ir, FakeCudaPlatform(FakeCuda(ndev=2, sms=132)), "float32", "sum", one_grid=True)


@pytest.mark.slow
def test_fake_platform_refuses_a_grid_that_cannot_be_resident(nvcc):
    """The one grid's blocks must all fit at once: the runner's occupancy check refuses with the
    numbers, the platform's own check refuses a launch, and the driver's cooperative refusal (here:
    a device that shrank between check and launch) is a PlatformError that says why."""
    from hccc.runtime.launcher import Runner
    ir = load_program(EXAMPLES / "ring_allgather_8.rccl", CompileOptions(chunk_bytes=4096))
    total = sum(int(t) for t in ir.ntbs)
    # the runner halves the emitted 512 threads per block while the half keeps the sync warp and
    # two data warps (96 threads): 256, then 128, and refuses there, saying what to change
    assert ir.nwarps * 32 == 512
    with pytest.raises(PlatformError, match=rf"need {total} thread blocks of 128 threads resident at "
                                            rf"once, but at most {total - 1} fit; compile the program "
                                            rf"into fewer blocks per rank \(--channels 1"):
        Runner(ir, FakeCudaPlatform(FakeCuda(sms=total - 1, per_sm=1)), "float32", "sum")
    fake = FakeCuda(sms=total, per_sm=1)
    pf = FakeCudaPlatform(fake)
    with Runner(ir, pf, "float32", "sum", timeout_s=2.0) as runner:
        assert runner.run(8 * 1024 * 4).stuck is None
        with pytest.raises(PlatformError, match=rf"need {total + 1} thread blocks resident together "
                                                rf"but it holds at most {total}"):
            pf.launch_grid(runner.grid_fn, total + 1, 512, b"\0" * 16, pf.stream())
        fake.per_sm = 0.5            # the occupancy answer stays cached; the driver now refuses
        with pytest.raises(PlatformError, match=r"cooperative launch of hccc_ring_allgather_8_grid_float32_sum "
                                                rf"\({total} blocks of 512 threads.*every block fits"):
            pf.launch_grid(runner.grid_fn, total, 512, b"\0" * 16, pf.stream())


@pytest.mark.slow
def test_benchmark_halves_the_warps_until_every_block_fits(nvcc, monkeypatch):
    """HM AllReduce 2x4 has 64 thread blocks: on 24 SMs of 65,536 registers, 64 registers per
    thread, 512-thread blocks give 48 resident blocks (refused), 256-thread blocks 96."""
    from hccc.runtime import launcher, platform
    bench = _bench()
    fake = FakeCuda(sms=24, per_sm=lambda block: min(32, 2048 // block, 65536 // (block * 64)))
    monkeypatch.setitem(platform._FACTORIES, "cuda", lambda: FakeCudaPlatform(fake))
    ir = load_program(EXAMPLES / "hm_allreduce_2x4.rccl", CompileOptions(chunk_bytes=4096))
    assert sum(int(t) for t in ir.ntbs) == 64 and ir.nwarps == 16
    args = bench.argparse.Namespace(dtype="float32", timeout=5.0)
    runner, warps = bench.open_runner(launcher, ir, args, bench.nwarps_candidates(ir.nwarps))
    with runner:
        assert warps == 8 and runner.block == 256
    with pytest.raises(PlatformError, match="resident"):
        bench.open_runner(launcher, ir, args, [16])


@pytest.mark.slow
def test_runtime_without_module_cooperative_launch_gets_one_plain_launch_of_the_admitted_grid(nvcc):
    """HIP before ROCm 6 has no hipModuleLaunchCooperativeKernel: the grid the occupancy check
    admitted is launched once, plainly; a grid it refuses is still refused."""
    from hccc.runtime.launcher import Runner

    class NoCoop(FakeCuda):
        def launchCooperativeKernel(self, *a):
            raise NotImplementedError("no module cooperative launch")

    ir = load_program(EXAMPLES / "ring_allgather_8.rccl", CompileOptions(chunk_bytes=4096))
    total = sum(int(t) for t in ir.ntbs)
    fake = NoCoop(sms=total, per_sm=1)
    with Runner(ir, FakeCudaPlatform(fake), "float32", "sum", timeout_s=2.0) as runner:
        fake.log.clear()
        assert runner.run(8 * 1024 * 4).stuck is None
        launches = [e for e in fake.log if e[0] == "launch" and e[3] != 1]
        assert [e[2] for e in launches] == [total]
    with pytest.raises(PlatformError, match="resident"):
        Runner(ir, FakeCudaPlatform(NoCoop(sms=total - 1, per_sm=1)), "float32", "sum")


def test_benchmark_keeps_measured_rows_when_a_size_cannot_run(monkeypatch, capsys):
    """A size the run-memory check refuses becomes a row saying so; the rows measured before and
    after it still print (the defaults once printed nothing when the largest size was refused)."""
    import types
    from hccc.runtime import launcher, platform as platform_mod
    from hccc.runtime.platform import PlatformError
    bench = _bench()

    class FakeRunner:
        def __init__(self, ir, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, size, **k):
            if size >= 1 << 30:
                raise PlatformError("running ring at 1 GiB needs about 64.0 GiB of memory, over the limit")
            return types.SimpleNamespace(wrong=0, stuck=None, iters=2, time_us=100.0, algbw_GBps=1.0,
                                         busbw_GBps=1.0)

    monkeypatch.setattr(platform_mod, "get_platform", lambda name: types.SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(launcher, "Runner", FakeRunner)
    monkeypatch.setattr(bench, "copy_time_us", lambda *a: 50.0)
    rc = bench.main(["--sizes", "64M,1G,256M", "--algorithms", "ring_allgather_8", "--json", "--nwarps", "4"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r["bytes"] for r in out["rows"]] == [64 << 20, 1 << 30, 256 << 20]
    assert out["rows"][0]["time_us"] == 100.0 and out["rows"][2]["time_us"] == 100.0
    assert out["rows"][1]["time_us"] is None and "64.0 GiB" in out["rows"][1]["error"]
