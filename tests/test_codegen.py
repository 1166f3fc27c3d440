"""Unit and property tests of code generation (compiler/backend/codegen.py and templates/)."""
from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.backend import codegen
from hccc.compiler.backend.codegen import generate, threads_per_tb
from hccc.compiler.ir.program_ir import Op, ProgramIR
from hccc.compiler.ir.check import load_ir_json
from hccc.util.dtypes import DTYPES, OPS, instance_error
from codegen_irs import random_ir, ring_allgather, ring_allgather_fused, ring_allreduce, \
    ring_allreduce_fused

#: switches that leave out the element types and operators added after the original four and three
NEW_OFF = [f"-DHCCC_ENABLE_{x.name.upper()}=0" for x in DTYPES[4:] + OPS[3:]]

HEADERS = ("hccc_cpu_emu.h", "hccc_platform.h", "hccc_prims.h")


def gen(ir, path: pathlib.Path, platforms=None):
    path.mkdir(parents=True, exist_ok=True)
    files = generate(ir, path, platforms=platforms or ["cuda"] * ir.nranks)
    return files, json.loads((path / "manifest.json").read_text())


# ---------------------------------------------------------------------------- manifest & files
def test_manifest_and_file_set(tmp_path):
    ir = ring_allreduce(4)
    files, man = gen(ir, tmp_path, ["cuda", "hip", "cuda", "hip"])
    names = [f.name for f in files]
    assert names == sorted(names)
    assert set(names) == {"CMakeLists.txt", "Makefile", "manifest.json", "ring_ar.ir.json",
                          "ring_ar_cuda.cu", "ring_ar_hip.hip", "ring_ar_r0.cu", "ring_ar_r1.hip",
                          "ring_ar_r2.cu", "ring_ar_r3.hip", "hccc_host.h", *HEADERS}
    assert man["host_header"] == "hccc_host.h"
    assert man["schema"] == "hccc.manifest/1"
    assert man["algorithm"] == "ring_ar" and man["collective"] == "allreduce"
    assert man["nranks"] == 4 and man["chunk_bytes"] == ir.chunk_bytes
    assert man["ir"] == "ring_ar.ir.json"
    assert man["libraries"] == {"cuda": "hccc_ring_ar_cuda", "hip": "hccc_ring_ar_hip"}
    assert man["nthreads"] == {"cuda": 16 * 32, "hip": 1024}
    assert man["umbrella"] == {"cuda": "ring_ar_cuda.cu", "hip": "ring_ar_hip.hip"}
    for key in ("transfers", "subpipelines", "tbs_state_based", "tbs_connection_based"):
        assert key in man["stats"]
    for r, e in enumerate(man["ranks"]):
        assert e["rank"] == r
        assert e["platform"] == ["cuda", "hip"][r % 2]
        assert e["tbs"] == int(ir.ntbs[r]) == 2
        assert e["kernel"] == f"hccc_ring_ar_r{r}"
        assert e["source"] == f"ring_ar_r{r}.{['cu', 'hip'][r % 2]}"
        assert e["send_conns"] == [[(r + 1) % 4, 0]] and e["recv_conns"] == [[(r - 1) % 4, 0]]
        src = (tmp_path / e["source"]).read_text()
        assert f"{e['kernel']}_##DT##_##OPN" in src
        assert f"HCCC_LAUNCH_BOUNDS({man['nthreads'][e['platform']]})" in src
    # the IR file round-trips
    back = load_ir_json((tmp_path / man["ir"]).read_text())
    assert back.to_json() == ir.to_json()
    # umbrella sources include exactly their platform's ranks
    cu = (tmp_path / "ring_ar_cuda.cu").read_text()
    assert re.findall(r'#include "([^"]+)"', cu) == ["ring_ar_r0.cu", "ring_ar_r2.cu"]
    hp = (tmp_path / "ring_ar_hip.hip").read_text()
    assert re.findall(r'#include "([^"]+)"', hp) == ["ring_ar_r1.hip", "ring_ar_r3.hip"]


def test_threads_per_tb():
    assert threads_per_tb(16, "cuda") == 512 and threads_per_tb(16, "hip") == 1024
    assert threads_per_tb(64, "cuda") == 1024 and threads_per_tb(40, "hip") == 1024
    assert threads_per_tb(0, "cuda") == 32 and threads_per_tb(1, "hip") == 64


def test_single_platform_has_no_other_platform_files(tmp_path):
    _, man = gen(ring_allgather(3), tmp_path, ["hip"] * 3)
    assert man["libraries"] == {"hip": "hccc_ring_ag_hip"}
    assert not list(tmp_path.glob("*.cu"))
    cm = (tmp_path / "CMakeLists.txt").read_text()
    assert "enable_language(CUDA)" not in cm and "hccc_ring_ag_hip" in cm


def test_deterministic_byte_identical(tmp_path):
    for k, ir_fn in enumerate((lambda: ring_allreduce(4), lambda: ring_allgather(3))):
        fa, _ = gen(ir_fn(), tmp_path / f"a{k}", ["cuda", "hip", "cuda", "hip"][:ir_fn().nranks])
        fb, _ = gen(ir_fn(), tmp_path / f"b{k}", ["cuda", "hip", "cuda", "hip"][:ir_fn().nranks])
        assert [f.name for f in fa] == [f.name for f in fb]
        for x, y in zip(fa, fb):
            assert x.read_bytes() == y.read_bytes(), x.name


def test_headers_are_rank_and_algorithm_independent(tmp_path):
    gen(ring_allreduce(4), tmp_path / "a", ["cuda", "cuda", "hip", "hip"])
    gen(ring_allgather(3, name="zz_other_algo"), tmp_path / "b")
    for h in HEADERS:
        a = (tmp_path / "a" / h).read_text()
        assert a == (tmp_path / "b" / h).read_text(), h
        assert "ring_ar" not in a and "zz_other_algo" not in a
        assert not re.search(r"hccc_\w+_r\d", a)


def test_non_canonical_order_is_sorted_first(tmp_path):
    ir = ring_allgather(3)
    gen(ir, tmp_path / "a")
    perm = np.random.default_rng(1).permutation(ir.nprims)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))
    shuffled = ProgramIR(**{**ir.__dict__, "prims": {k: v[perm] for k, v in ir.prims.items()},
                            "dep_prim": inv[ir.dep_prim], "dep_on": inv[ir.dep_on]})
    gen(shuffled, tmp_path / "b")
    for f in ("ring_ag_r0.cu", "ring_ag_r1.cu", "ring_ag_r2.cu", "manifest.json"):
        assert (tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()


@pytest.mark.parametrize("bad", ["", "1abc", "a-b", "a b", "x" * 65, "a;system()", "é"])
def test_rejects_unsanitised_names(tmp_path, bad):
    ir = ring_allgather(2)
    ir.name = bad
    with pytest.raises(ValueError):
        generate(ir, tmp_path, platforms=["cuda", "cuda"])
    assert not list(tmp_path.iterdir())


def test_rejects_bad_platforms_and_chunk_bytes(tmp_path):
    ir = ring_allgather(2)
    with pytest.raises(ValueError):
        generate(ir, tmp_path, platforms=["cuda"])
    with pytest.raises(ValueError):
        generate(ir, tmp_path, platforms=["cuda", "opencl"])
    ir.chunk_bytes = 100
    with pytest.raises(ValueError):
        generate(ir, tmp_path, platforms=["cuda", "cuda"])


# ---------------------------------------------------------------------------- independent parse
_CALL = re.compile(r"^\s*HCCC_P(W?)(X?)(G?)\(([^)]*)\)")
_TB = re.compile(r"^\s*// TB (\d+):")
_DEPS = re.compile(r"\bdeps\[\d+\] = \{([^}]*)\};")


def parse_rank_source(text: str):
    """tb -> list of primitive dicts, read back from a generated rank source (its program table's
    rows, and each row's awaited counters taken in turn from the rank's deps array)."""
    out, tb = {}, None
    m = _DEPS.search(text)
    assert m, "no deps array"
    deps = [int(x) for x in m.group(1).split(",")]
    taken = 0
    for line in text.splitlines():
        m = _TB.search(line)
        if m:
            tb = int(m.group(1))
            out[tb] = []
            continue
        m = _CALL.search(line)
        if m:
            a = [x.strip() for x in m.group(4).split(",")]
            d = dict(seq=int(a[0]), op=Op[a[1]], sconn=int(a[2]), spos=int(a[3]),
                     rconn=int(a[4]), rpos=int(a[5]), sbuf=a[6], soff=int(a[7]), dbuf=a[8],
                     doff=int(a[9]), count=int(a[10]), chunk=int(a[11]), post=int(a[12]),
                     task=int(a[13]), waits=[], direct=0)
            if m.group(1):
                nw = int(a[14])
                assert nw > 0
                d["waits"] = deps[taken:taken + nw]
                taken += nw
            if m.group(2):   # direct-mode fields last: direct, dpeer, pbuf, poff, pbase
                x = a[15:] if m.group(1) else a[14:]
                d.update(direct=int(x[0]), dpeer=int(x[1]), pbuf=x[2], poff=int(x[3]), pbase=int(x[4]))
                assert d["direct"] in (1, 2, 3)
            if m.group(3):   # a receive group's size and a fused LL chain's mark, last of all
                d.update(nsrc=int(a[-2]), chain=int(a[-1]))
            out[tb].append(d)
    assert taken == len(deps) or (taken == 0 and deps == [0]), "deps array and rows disagree"
    return out


def check_against_ir(ir: ProgramIR, outdir: pathlib.Path, man: dict) -> None:
    """Compare generated sources with the IR using oracles computed here, independently."""
    p = {k: v.tolist() for k, v in ir.prims.items()}
    n = ir.nprims
    parsed = {}
    for e in man["ranks"]:
        parsed[e["rank"]] = parse_rank_source((outdir / e["source"]).read_text())
    # row lookup by (rank, tb, seq)
    where = {(p["rank"][i], p["tb"][i], p["seq"][i]): i for i in range(n)}
    gen_of = {}
    for r, tbs in parsed.items():
        for tb, prims in tbs.items():
            assert [x["seq"] for x in prims] == sorted(x["seq"] for x in prims)
            for x in prims:
                gen_of[where[(r, tb, x["seq"])]] = x
    assert len(gen_of) == n
    fifo_send, fifo_recv = {}, {}        # (s, d, ch) -> list of (pos, count) in FIFO order
    pos = {}
    dep_on_of = {}
    for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        dep_on_of.setdefault(a, set()).add(b)
    order = sorted(range(n), key=lambda i: (p["rank"][i], p["tb"][i], p["seq"][i]))
    posts = {}
    for i in order:
        g, op, r = gen_of[i], Op(p["op"][i]), p["rank"][i]
        assert g["op"] == op and g["count"] == p["count"][i] and g["task"] == p["task"][i]
        assert g["sbuf"] == ("NONE", "INPUT", "OUTPUT", "SCRATCH")[p["src_buf"][i]]
        assert g["dbuf"] == ("NONE", "INPUT", "OUTPUT", "SCRATCH")[p["dst_buf"][i]]
        assert g["soff"] == p["src_off"][i] and g["doff"] == p["dst_off"][i]
        assert 0 <= g["chunk"] <= ir.nchunks - max(p["count"][i], 0)
        if op.sends:
            key = (r, p["send_peer"][i], p["channel"][i])
            assert man["ranks"][r]["send_conns"][g["sconn"]] == [key[1], key[2]]
            assert g["spos"] == pos.get(("s",) + key, 0)
            pos[("s",) + key] = g["spos"] + 1   # one FIFO message per primitive
            fifo_send.setdefault(key, []).append((g["spos"], p["count"][i]))
        else:
            assert g["sconn"] == -1
        if op.receives:
            key = (p["recv_peer"][i], r, p["channel"][i])
            assert man["ranks"][r]["recv_conns"][g["rconn"]] == [key[0], key[2]]
            assert g["rpos"] == pos.get(("r",) + key, 0)
            pos[("r",) + key] = g["rpos"] + 1
            fifo_recv.setdefault(key, []).append((g["rpos"], p["count"][i]))
        else:
            assert g["rconn"] == -1
        if g["post"] >= 0:
            assert 0 <= g["post"] < man["ranks"][r]["progress_slots"]
            assert (r, g["post"]) not in posts
            posts[(r, g["post"])] = i
    # every awaited slot is posted by exactly the primitives the IR names
    for i in range(n):
        want = {gen_of[j]["post"] for j in dep_on_of.get(i, ())}
        assert set(gen_of[i]["waits"]) == want
        assert all(x >= 0 for x in want)
    posted = {i for i in range(n) if gen_of[i]["post"] >= 0}
    assert posted == set(ir.dep_on.tolist())
    # both ends of a connection agree on the FIFO positions (when the IR is matched)
    for key, sends in fifo_send.items():
        if key in fifo_recv and [c for _, c in sends] == [c for _, c in fifo_recv[key]]:
            assert sends == fifo_recv[key]
    # direct mode: the k-th send of a connection is marked direct exactly when its k-th receive
    # is, and names that receive's destination; only copy-only receives are
    ends: dict = {}
    for i in order:
        op = Op(p["op"][i])
        if op.sends:
            ends.setdefault(("s", p["rank"][i], p["send_peer"][i], p["channel"][i]), []).append(i)
        if op.receives:
            ends.setdefault(("r", p["recv_peer"][i], p["rank"][i], p["channel"][i]), []).append(i)
    for (kind, a, b, ch), lst in ends.items():
        if kind != "s":
            continue
        for s_i, r_i in zip(lst, ends.get(("r", a, b, ch), [])):
            gs, gr = gen_of[s_i], gen_of[r_i]
            assert bool(gs["direct"] & 1) == bool(gr["direct"] & 2)
            if gr["direct"] & 2:
                assert Op(p["op"][r_i]) in (Op.RECV, Op.RECV_COPY_SEND)
                assert (gs["dpeer"], gs["pbuf"], gs["poff"]) == (b, gr["dbuf"], gr["doff"])


@pytest.mark.parametrize("make", [lambda: ring_allreduce(4), lambda: ring_allgather(5),
                                  lambda: ring_allreduce_fused(3), lambda: ring_allgather_fused(4)])
def test_hand_irs_match_their_source(tmp_path, make):
    ir = make()
    _, man = gen(ir, tmp_path)
    check_against_ir(ir, tmp_path, man)


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1))
def test_random_irs_match_their_source(seed):
    import tempfile
    ir = random_ir(np.random.default_rng(seed))
    with tempfile.TemporaryDirectory() as d:
        _, man = gen(ir, pathlib.Path(d))
        check_against_ir(ir, pathlib.Path(d), man)
        assert sum(e["tbs"] for e in man["ranks"]) >= len({(a, b) for a, b in
                                                           zip(ir.prims["rank"], ir.prims["tb"])})


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@settings(max_examples=4)
@given(st.integers(0, 2**32 - 1))
def test_random_irs_compile_with_cpu_emulation(seed):
    import tempfile
    ir = random_ir(np.random.default_rng(seed))
    with tempfile.TemporaryDirectory() as d:
        gen(ir, pathlib.Path(d))
        res = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra",
                              "-DHCCC_PLATFORM_CPU", "-x", "c++", "-I", d,
                              f"{d}/{ir.name}_cuda.cu"], capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr[-3000:]


# ---------------------------------------------------------------------------- build files
def test_instantiation_trimming_removes_kernels(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    gen(ring_allgather(2), tmp_path)
    obj = tmp_path / "x.o"
    subprocess.run(["g++", "-std=c++17", "-c", "-DHCCC_PLATFORM_CPU", "-DHCCC_ENABLE_FLOAT16=0",
                    "-DHCCC_ENABLE_MIN=0", *NEW_OFF, "-x", "c++", "-I", str(tmp_path),
                    str(tmp_path / "ring_ag_cuda.cu"), "-o", str(obj)], check=True)
    syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    got = set(re.findall(r"hccc_ring_ag_r[01]_(\w+)", syms))
    want = {f"{d}_{o}" for d in ("float32", "bfloat16", "int32") for o in ("sum", "max")}
    # the kernels, and the rank programs they share with the one-grid entry (C++ names)
    assert {g for g in got if not g.startswith("program")} == want
    # one engine per instantiation (C++ name hccc_run<T, RED, hccc_tprogram<N>>: a table of N
    # decoded primitives, HCCC_PTABLE_MAX_PRIMS on the CPU)
    assert len(set(re.findall(r"\b_Z8hccc_runI(\w+?)E13hccc_tprogramILj\d+EE", syms))) == len(want)


def test_makefile_dry_run(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    gen(ring_allreduce(4), tmp_path, ["cuda", "hip", "cuda", "hip"])
    res = subprocess.run(["make", "-n"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "nvcc -std=c++17 -O3 -arch=sm_90" in out
    assert "hipcc -std=c++17 -O3 --offload-arch=gfx90a" in out
    # one object per rank, each rank's platform only, then one library per platform
    for r, (pl, ext) in enumerate([("cuda", "cu"), ("hip", "hip")] * 2):
        assert f"-c ring_ar_r{r}.{ext} -o ring_ar_r{r}.{ext}.o" in out
        other = "hip" if ext == "cu" else "cu"
        assert f"ring_ar_r{r}.{other}" not in out
    assert "ar rcs libhccc_ring_ar_cuda.a ring_ar_r0.cu.o ring_ar_r2.cu.o" in out
    assert "ar rcs libhccc_ring_ar_hip.a ring_ar_r1.hip.o ring_ar_r3.hip.o" in out
    assert "ring_ar_cuda.cu" not in out         # the umbrella source is for single-TU builds
    assert "-DHCCC_ENABLE_FLOAT16=1" in out and "-DHCCC_ENABLE_MIN=1" in out
    # instantiations chosen when building
    res = subprocess.run(["make", "-n", "HCCC_DTYPES=float32 int32", "HCCC_OPS=sum"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "-DHCCC_ENABLE_FLOAT32=1" in res.stdout and "-DHCCC_ENABLE_INT32=1" in res.stdout
    assert "-DHCCC_ENABLE_FLOAT16=0" in res.stdout and "-DHCCC_ENABLE_MAX=0" in res.stdout
    res = subprocess.run(["make", "-n", "HCCC_DTYPES=complex64"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode != 0 and "complex64" in res.stderr


@pytest.mark.slow   # a CMake configure with nvcc
def test_cmake_configures(tmp_path, nvcc):
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    gen(ring_allreduce(4), tmp_path / "src", ["cuda", "hip", "cuda", "hip"])
    build = tmp_path / "build"
    build.mkdir()
    res = subprocess.run(["cmake", "-S", str(tmp_path / "src"), "-B", str(build),
                          f"-DCMAKE_CUDA_COMPILER={nvcc}"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    targets = subprocess.run(["cmake", "--build", str(build), "--target", "help"],
                             capture_output=True, text=True).stdout
    assert "hccc_ring_ar_cuda" in targets and "hccc_ring_ar_hip" in targets


# ---------------------------------------------------------------------------- real compilers
def _compile(cmd, cwd):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "warning" not in res.stderr.lower(), res.stderr[-4000:]


@pytest.mark.slow
def test_nvcc_compiles_every_instantiation(tmp_path, nvcc):
    gen(ring_allreduce(4), tmp_path, ["cuda", "hip", "cuda", "hip"])
    _compile([nvcc, "-std=c++17", "-arch=sm_90", "-Xcompiler", "-Wall,-Wextra", "-c",
              "ring_ar_cuda.cu", "-o", "cuda.o"], tmp_path)
    syms = subprocess.run(["nm", "cuda.o"], cwd=tmp_path, capture_output=True, text=True).stdout
    for r in (0, 2):
        for d in DTYPES:
            for o in OPS:
                # every (dtype, op) of the table but an integer avg (instance_error)
                assert (f"hccc_ring_ar_r{r}_{d.name}_{o.name}" in syms) == (instance_error(d.name, o.name) is None)


@pytest.mark.slow
def test_hipcc_compiles_every_instantiation(tmp_path, hipcc, monkeypatch):
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    gen(ring_allreduce(4), tmp_path, ["cuda", "hip", "cuda", "hip"])
    _compile([hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Wall", "-Wextra", "-c",
              "ring_ar_hip.hip", "-o", "hip.o"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: ring_allgather_fused(3), lambda: random_ir(np.random.default_rng(7))])
def test_nvcc_and_hipcc_other_irs(tmp_path, make, nvcc, hipcc, monkeypatch):
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    ir = make()
    plats = ["cuda" if r % 2 == 0 else "hip" for r in range(ir.nranks)]
    gen(ir, tmp_path, plats)
    # (nvcc splits -D values at commas, so trim with the HCCC_ENABLE_* switches)
    one = ["-DHCCC_ENABLE_FLOAT32=0", "-DHCCC_ENABLE_BFLOAT16=0", "-DHCCC_ENABLE_MIN=0", *NEW_OFF]
    _compile([nvcc, "-std=c++17", "-arch=sm_90", *one, "-c", f"{ir.name}_cuda.cu", "-o", "c.o"],
             tmp_path)
    if "hip" in plats:
        _compile([hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Wall", *one, "-c",
                  f"{ir.name}_hip.hip", "-o", "h.o"], tmp_path)


# ---------------------------------------------------------------------------- scale
def test_codegen_speed_on_a_large_program(tmp_path):
    """Code generation of ~1M primitives (HM AllReduce over 16 x 8 GPUs) writes every file."""
    try:
        from hccc.compiler.frontend import generators
        from hccc.compiler.passes.build import build_program
    except ImportError as exc:
        pytest.skip(f"pipeline not available: {exc}")
    ir = build_program(generators.hm_allreduce(16, 8))
    tm = {}
    t0 = time.perf_counter()
    files = generate(ir, tmp_path, platforms=["cuda"] * ir.nranks, timings=tm)
    dt = time.perf_counter() - t0
    # rank sources, IR JSON + umbrella, headers, CMakeLists + Makefile + manifest, one-grid entry,
    # the host API (hccc_host.h)
    assert len(files) == ir.nranks + 2 + len(HEADERS) + 3 + 1 + 1
    assert set(tm) == {"codegen_analyse", "codegen_lines", "codegen_render", "codegen_write"}
    print(f"codegen of {ir.nprims} primitives: {dt:.2f}s, IR JSON included "
          "(speed is measured by benchmarks/compile_scale.py)")


def test_source_checker_detects_corruption(tmp_path):
    """The independent checker is not vacuous: a wrong FIFO position or wait set is caught."""
    ir = ring_allgather(3)
    _, man = gen(ir, tmp_path)
    f = tmp_path / "ring_ag_r1.cu"
    good = f.read_text()
    bad = re.sub(r"(HCCC_PX?\(1, RECV, -1, 0, 0, )1,", r"\g<1>2,", good)
    assert bad != good
    f.write_text(bad)
    with pytest.raises(AssertionError):
        check_against_ir(ir, tmp_path, man)
    # a receive marked direct whose sender is not (the direct bits of one message disagree)
    bad = re.sub(r"(HCCC_PX\(1, RECV, [^)]*, )2, 0, NONE, 0, 0\)", r"\g<1>0, 0, NONE, 0, 0)", good)
    assert bad != good
    f.write_text(bad)
    with pytest.raises(AssertionError):
        check_against_ir(ir, tmp_path, man)
    bad = re.sub(r"(deps\[\d+\] = \{)(\d+), (\d+)", r"\g<1>\3, \2", good)   # counters awaited by others
    assert bad != good
    f.write_text(bad)
    with pytest.raises(AssertionError):
        check_against_ir(ir, tmp_path, man)
    f.write_text(good)
    check_against_ir(ir, tmp_path, man)


@given(st.integers(0, 2 ** 32 - 1))
@settings(max_examples=30, deadline=None)
def test_tb_pipeline_ranges_match_per_tb_unique(seed):
    """The one-sort computation of each TB's sub-pipeline list equals np.unique per TB."""
    ir = random_ir(np.random.default_rng(seed))
    if not codegen._is_canonical(ir):
        ir = codegen._sorted_copy(ir)
    slices = ir.tb_slices()
    got = codegen._tb_pipeline_ranges(ir, slices)
    want = {sl.start: codegen._ranges(np.unique(ir.prims["pipeline"][sl]).tolist()) for sl in slices.values()}
    assert got == want
