"""Mixed-vendor programs at run time: per platform, one library from that platform's ranks.

A program compiled against a cluster of NVIDIA and AMD nodes gives CUDA sources to the NVIDIA ranks
and HIP sources to the AMD ranks. The runner builds one library per platform from exactly the
sources of its ranks (the split the emitted build files make) and launches every rank from the
library of its platform, through its platform's object. Checked here with the CPU standing in for
both platforms: the runner's bookkeeping, ``nm`` on the two libraries, the launches each platform
object saw, the memory each rank lives in, and the outputs against the collective's definition
(:func:`hccc.runtime.reference.expected`). CUDA and HIP together in one process are refused
(naming the ranks); the HIP sources of a mixed program compile with hipcc, the CUDA ones with nvcc.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.frontend.generators import hm_allgather_rccl, hm_allreduce_rccl, ring_allreduce_rccl
from hccc.compiler.pipeline import load_program
from hccc.runtime import reference
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.launcher import Runner
from hccc.runtime.local_job import LocalJob
from hccc.runtime.rank_allocations import FLAGS_BYTES
from hccc.runtime.rank_platforms import rank_ranges
from hccc.runtime.platform import Instance, Platform, PlatformError

from cluster_texts import MIXED_2X2  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

PLATFORMS = ["cuda", "cuda", "hip", "hip", "cuda", "cuda", "hip", "hip"]
CUDA_RANKS, HIP_RANKS = [0, 1, 4, 5], [2, 3, 6, 7]
PROGRAMS = {"hm_allreduce_4x2": hm_allreduce_rccl(4, 2), "hm_allgather_4x2": hm_allgather_rccl(4, 2),
            "ring_allreduce": ring_allreduce_rccl(8)}


@pytest.fixture(autouse=True)
def quick_builds(monkeypatch):
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """name -> (OUTDIR, manifest, ProgramIR) of each program compiled with ``--topology``."""
    root = tmp_path_factory.mktemp("mixed")
    topo = root / "mixed.topo"
    topo.write_text(MIXED_2X2)
    out = {}
    for name, text in PROGRAMS.items():
        algo = root / f"{name}.rccl"
        algo.write_text(text)
        outdir = root / name
        # 256-byte slices: the sizes below give several micro-batches per chunk
        # --fuse off: the fusion choice simulates the program twice more (tests/test_fused_channels.py)
        assert main([str(algo), "-o", str(outdir), "--topology", str(topo), "--chunk-size", "256",
                     "--fuse", "off"]) == 0
        man = json.loads((outdir / "manifest.json").read_text())
        out[name] = (outdir, man, load_program(outdir / man["ir"]))
    return out


def defined_kernels(lib: Path) -> set[str]:
    """Kernel symbols (``hccc_<algorithm>_r<rank>_<dtype>_<op>``) a CPU module defines, by ``nm``
    (the launcher's own exports, ``hccc_cpu_*``, left out)."""
    res = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in res.stdout.splitlines() if line.strip()}
    return {n for n in names if n.startswith("hccc_") and not n.startswith("hccc_cpu_")}


def symbol(man: dict, rank: int, dtype: str, op: str) -> str:
    return f"{man['ranks'][rank]['kernel']}_{dtype}_{op}"


class RecordingCpu(CpuPlatform):
    """A CPU platform that records what it builds, allocates and launches."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.builds: list[list[int] | None] = []
        self.launched: list[tuple[str, Path]] = []
        self.owned: set[int] = set()

    def build(self, outdir, manifest, instance, ranks=None, **kw):
        self.builds.append(None if ranks is None else list(ranks))
        return super().build(outdir, manifest, instance, ranks, **kw)

    def malloc(self, nbytes):
        ptr = super().malloc(nbytes)
        self.owned.add(ptr)
        return ptr

    def launch(self, fn, grid, block, args, stream):
        self.launched.append((fn.symbol, fn.module.path))
        super().launch(fn, grid, block, args, stream)


# ---------------------------------------------------------------------------- the manifest split
def test_compiling_with_the_cluster_gives_each_vendor_its_platform(compiled):
    for outdir, man, ir in compiled.values():
        assert [e["platform"] for e in man["ranks"]] == PLATFORMS
        for e in man["ranks"]:
            assert e["source"].endswith(".cu" if e["platform"] == "cuda" else ".hip")
            assert (outdir / e["source"]).is_file()


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cpu_stand_in_builds_one_library_per_platform(compiled, name):
    outdir, man, ir = compiled[name]
    dtype, op = "float32", "sum"
    with Runner(ir, "cpu", dtype, op, platforms=PLATFORMS) as runner:
        assert runner.rank_platform == PLATFORMS
        assert runner.library_ranks == {"cuda": CUDA_RANKS, "hip": HIP_RANKS}
        cuda_pf, hip_pf = runner.platforms["cuda"], runner.platforms["hip"]
        assert isinstance(cuda_pf, CpuPlatform) and isinstance(hip_pf, CpuPlatform) and cuda_pf is not hip_pf
        assert (cuda_pf.source_platform, hip_pf.source_platform) == ("cuda", "hip")
        libs = runner.libraries
        assert set(libs) == {"cuda", "hip"} and libs["cuda"] != libs["hip"]
        for r in range(ir.nranks):
            assert runner.rank_library[r] == libs[PLATFORMS[r]]   # the kernel object came from there
        # nm: each library defines exactly its own ranks' kernels (for the instance built)
        for pl, lib in libs.items():
            own = {symbol(man, r, dtype, op) for r in range(ir.nranks) if PLATFORMS[r] == pl}
            assert defined_kernels(lib) == own, pl
        res = runner.run(count=8 * 37)
        assert res.ok, (res.stuck, res.first_wrong)


def test_each_platform_object_builds_allocates_and_launches_its_own_ranks(compiled):
    outdir, man, ir = compiled["hm_allreduce_4x2"]
    a, b = RecordingCpu(), RecordingCpu()
    with LocalJob(ir, backend={"cuda": a, "hip": b}, dtype="int32", op="max", platforms=PLATFORMS) as job:
        res = job.run(count=8 * 50, dtype="int32", op="max", iters=2, warmup=1, proto="simple")
        assert res.ok, (res.stuck, res.first_wrong)
        assert a.builds == [CUDA_RANKS] and b.builds == [HIP_RANKS]
        libs = set()
        for pf, ranks in ((a, CUDA_RANKS), (b, HIP_RANKS)):
            want = {symbol(man, r, "int32", "max") for r in ranks if man["ranks"][r]["tbs"] > 0}
            assert {s for s, _ in pf.launched} == want
            lib = {p for _, p in pf.launched}                    # one library per platform object
            assert len(lib) == 1
            libs |= lib
            assert len(pf.launched) == 3 * len(want)             # warmup + 2 timed runs
            for r in ranks:
                # the FIFOs a rank receives on, its counters and its connection tables are its
                # platform's memory (senders of the other platform write into them: host memory),
                # and so are its abort flag and error record
                mem = job.comms[r].memory
                for ptr in (mem.slots, mem.ctrl, mem.send_tab, mem.recv_tab):
                    assert ptr in pf.owned
                flags = job.comms[r].flags         # one block: the abort flag, then the error record
                assert flags.abort in pf.owned and 0 < flags.error - flags.abort < FLAGS_BYTES
        assert len(libs) == 2


def test_one_cpu_platform_object_may_serve_both_platforms(compiled):
    """A single CPU platform object still builds two libraries (one per manifest platform)."""
    outdir, man, ir = compiled["hm_allgather_4x2"]
    pf = RecordingCpu()
    with Runner(ir, pf, "float16", "min", platforms=PLATFORMS) as runner:
        assert runner.platforms == {"cuda": pf, "hip": pf}
        assert sorted(pf.builds) == [CUDA_RANKS, HIP_RANKS]      # one library each (built in any order)
        assert runner.libraries["cuda"] != runner.libraries["hip"]
        res = runner.run(count=8 * 21, inplace=True)
        assert res.ok, (res.stuck, res.first_wrong)


# ---------------------------------------------------------------------------- outputs
def definition(ir, inputs, op):
    return reference.expected(ir.collective, [np.array(x) for x in inputs], op, nchunks=ir.nchunks)


@pytest.mark.parametrize("name,dtype,op", [("hm_allreduce_4x2", "float32", "sum"),
                                           ("hm_allgather_4x2", "int32", "sum"),
                                           ("ring_allreduce", "int32", "min")])
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_mixed_outputs_equal_the_collective(compiled, name, dtype, op, inplace):
    outdir, man, ir = compiled[name]
    rng = np.random.default_rng(len(name) + inplace)
    with Runner(ir, "cpu", dtype, op, platforms=PLATFORMS) as runner:
        for count in (0, 8, 8 * 13 + 5, 8 * 64 * 3):       # empty, 1 per chunk, remainders, many slices
            inputs = reference.make_inputs(ir.collective, ir.nranks, count, dtype, nchunks=ir.nchunks,
                                           seed=int(rng.integers(1 << 30)), low=-20, high=21)
            res = runner.run(count=count, inputs=inputs, inplace=inplace, keep_outputs=True)
            assert res.stuck is None and res.wrong == 0 and res.collective_wrong == 0, res.first_wrong
            want = definition(ir, inputs, op)
            for r in range(ir.nranks):
                np.testing.assert_array_equal(res.outputs[r], want[r], err_msg=f"{name} count {count} rank {r}")


@settings(max_examples=4, deadline=None)
@given(plats=st.lists(st.sampled_from(["cuda", "hip"]), min_size=4, max_size=4).filter(lambda p: len(set(p)) == 2),
       count=st.integers(0, 200))
def test_any_split_of_ranks_over_platforms_runs_correctly(plats, count):
    """Whatever the vendors of the ranks, each library holds exactly its ranks' kernels and the
    result is the collective."""
    ir = load_program_text(ring_allreduce_rccl(4, name="ring_ar_4"))
    with Runner(ir, "cpu", "int32", "sum", platforms=plats) as runner:
        groups = {pl: [r for r in range(4) if plats[r] == pl] for pl in sorted(set(plats))}
        assert runner.library_ranks == groups
        for pl, lib in runner.libraries.items():
            assert {s.split("_r")[-1].split("_")[0] for s in defined_kernels(lib)} == {str(r) for r in groups[pl]}
        inputs = reference.make_inputs("allreduce", 4, count, "int32", nchunks=ir.nchunks, seed=count,
                                       low=-9, high=10)
        res = runner.run(count=count, inputs=inputs, keep_outputs=True)
        assert res.ok, (res.stuck, res.first_wrong)
        want = definition(ir, inputs, "sum")
        for r in range(4):
            np.testing.assert_array_equal(res.outputs[r], want[r])


_IRS: dict[str, object] = {}


def load_program_text(text: str):
    """ProgramIR of ResCCLang text (cached: hypothesis draws the same program many times)."""
    if text not in _IRS:
        from hccc.compiler.passes.build import build_program
        from hccc.compiler.frontend import parse_rccl
        from hccc.compiler.passes.verify import verify
        alg = parse_rccl(text, "ring.rccl")
        verify(alg)
        _IRS[text] = build_program(alg, chunk_bytes=64)
    return _IRS[text]


# ---------------------------------------------------------------------------- refusals
class FakeGpu(Platform):
    """A GPU platform that is never started: the refusals happen before anything is built."""

    def __init__(self, name: str):
        self.name = self.source_platform = name

    def _no(self, *a, **k):
        raise AssertionError("the runner should have refused before using the platform")

    malloc = free = memcpy_htod = memcpy_dtoh = memset = build = load = stream = launch = _no
    synchronize = timer = max_resident_blocks = _no


def test_cuda_and_hip_in_one_process_are_refused_naming_the_ranks(compiled):
    outdir, man, ir = compiled["ring_allreduce"]
    with pytest.raises(PlatformError) as exc:
        Runner(ir, {"cuda": FakeGpu("cuda"), "hip": FakeGpu("hip")}, platforms=PLATFORMS)
    msg = str(exc.value)
    assert "CUDA ranks 0-1, 4-5 on cuda" in msg and "HIP ranks 2-3, 6-7 on hip" in msg
    assert "share no memory" in msg
    # the ring's connections that cross platforms are named (1 -> 2, 3 -> 4, 5 -> 6, 7 -> 0)
    assert "rank 1 (cuda) -> rank 2 (hip)" in msg and "rank 3 (hip) -> rank 4 (cuda)" in msg
    # by name: refused before either runtime is started (so also without GPUs)
    with pytest.raises(PlatformError, match=r"share no memory"):
        Runner(ir, {"cuda": "cuda", "hip": "hip"}, platforms=PLATFORMS)


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_a_gpu_backend_runs_its_own_platform_only(compiled, backend):
    outdir, man, ir = compiled["ring_allreduce"]
    other = "HIP" if backend == "cuda" else "CUDA"
    ranks = "2-3, 6-7" if backend == "cuda" else "0-1, 4-5"
    with pytest.raises(PlatformError, match=fr"ranks {ranks} are {other} ranks and the {backend} backend"):
        Runner(ir, backend, platforms=PLATFORMS)
    with pytest.raises(PlatformError, match=fr"ranks {ranks} are {other} ranks"):
        Runner(ir, FakeGpu(backend), platforms=PLATFORMS)


def test_bad_rank_platform_lists(compiled):
    outdir, man, ir = compiled["ring_allreduce"]
    with pytest.raises(ValueError, match="7 rank platforms for a program of 8"):
        Runner(ir, "cpu", platforms=PLATFORMS[:7])
    with pytest.raises(ValueError, match="rank 3: unknown platform 'rocm'"):
        Runner(ir, "cpu", platforms=PLATFORMS[:3] + ["rocm"] + PLATFORMS[4:])
    with pytest.raises(ValueError, match="needs the rank platforms"):
        Runner(ir, {"cuda": "cpu", "hip": "cpu"})
    with pytest.raises(PlatformError, match="no backend for the hip ranks 2-3, 6-7"):
        Runner(ir, {"cuda": "cpu"}, platforms=PLATFORMS)


@settings(max_examples=50)
@given(st.sets(st.integers(0, 40)))
def test_rank_ranges_lists_every_rank_once(ranks):
    text = rank_ranges(ranks)
    back: list[int] = []
    for part in filter(None, text.split(", ")):
        lo, _, hi = part.partition("-")
        back += range(int(lo), int(hi or lo) + 1)
    assert back == sorted(ranks)
    assert text.count(", ") == max(0, sum(1 for r in ranks if r - 1 not in ranks) - 1)


# ---------------------------------------------------------------------------- the command line
def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_hccc_run_on_compiled_output_uses_the_manifest_platforms(compiled, capsys):
    outdir, man, ir = compiled["hm_allreduce_4x2"]
    for target in (outdir, outdir / "manifest.json"):
        rc, out, err = run_cli(capsys, "run", target, "--backend", "cpu", "--bytes", "1K,12K", "--iters", "1",
                               "--warmup", "0", "--json")
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["ok"] and doc["rank_platform"] == PLATFORMS and doc["backend"] == "cpu"
        assert {pl: v["ranks"] for pl, v in doc["libraries"].items()} == {"cuda": CUDA_RANKS, "hip": HIP_RANKS}
        for pl, v in doc["libraries"].items():
            assert v["backend"] == "cpu"
            own = {symbol(man, r, "float32", "sum") for r in range(8) if PLATFORMS[r] == pl}
            assert defined_kernels(Path(v["library"])) == own
        assert [(r["bytes"], r["inplace"], r["wrong"]) for r in doc["results"]] == [
            (1024, False, 0), (1024, True, 0), (12288, False, 0), (12288, True, 0)]
    rc, out, err = run_cli(capsys, "run", outdir, "--bytes", "4K", "--iters", "1", "--inplace")
    assert rc == 0, err
    assert "# CUDA ranks 0-1, 4-5 from the cuda library (cpu); HIP ranks 2-3, 6-7 from the hip library (cpu)" in out


def test_hccc_run_with_topology_splits_like_the_compiler(compiled, capsys, tmp_path):
    topo = tmp_path / "mixed.topo"
    topo.write_text(MIXED_2X2)
    algo = tmp_path / "hm.rccl"
    algo.write_text(hm_allgather_rccl(4, 2))
    # the default chunk size: at 256-byte chunks the compile's fusion choice simulates 64 MiB calls
    # of 256-byte chunks (some 4 s of CPU), which the split does not depend on
    rc, out, err = run_cli(capsys, "run", algo, "--topology", topo, "--bytes", "2K", "--iters", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["rank_platform"] == PLATFORMS
    # without a cluster every rank is a CUDA rank: one library
    rc, out, err = run_cli(capsys, "run", algo, "--bytes", "2K", "--iters", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["rank_platform"] == ["cuda"] * 8 and list(doc["libraries"]) == ["cuda"]
    # a program that does not fit the cluster: located error
    bad = tmp_path / "ring4.rccl"
    bad.write_text(ring_allreduce_rccl(4))
    rc, out, err = run_cli(capsys, "run", bad, "--topology", topo)
    assert rc == 1 and "ring4.rccl:1:" in err and "nRanks=4" in err and "Traceback" not in err


def test_hccc_run_refusals(compiled, capsys, tmp_path):
    outdir, man, ir = compiled["ring_allreduce"]
    rc, out, err = run_cli(capsys, "run", outdir, "--backend", "cuda")
    assert rc == 1 and "ranks 2-3, 6-7 are HIP ranks and the cuda backend runs CUDA programs only" in err
    rc, out, err = run_cli(capsys, "run", outdir, "--topology", tmp_path / "x.topo")
    assert rc == 1 and "manifest already gives every rank's platform" in err
    broken = tmp_path / "broken"
    shutil.copytree(outdir, broken)
    m = json.loads((broken / "manifest.json").read_text())
    m["ranks"][5]["platform"] = "metal"
    (broken / "manifest.json").write_text(json.dumps(m))
    rc, out, err = run_cli(capsys, "run", broken)
    assert rc == 1 and "rank 5: platform 'metal' is neither 'cuda' nor 'hip'" in err and "Traceback" not in err
    m["ranks"][5]["platform"] = "cuda"
    m["ir"] = "../../etc/passwd"
    (broken / "manifest.json").write_text(json.dumps(m))
    rc, out, err = run_cli(capsys, "run", broken / "manifest.json")
    assert rc == 1 and "'ir' must name the ProgramIR file" in err


@pytest.mark.slow
# ---------------------------------------------------------------------------- real compilers
def test_hip_sources_of_a_mixed_program_compile_with_hipcc(compiled, hipcc, monkeypatch):
    """HipPlatform.build on the AMD ranks: one code object with exactly their kernels."""
    from hccc.runtime.gpu import GATE_SYMBOL
    from hccc.runtime.hip import build_hip_module, hip_module_symbols
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    outdir, man, ir = compiled["hm_allreduce_4x2"]
    inst = Instance("float32", "sum")
    path = build_hip_module(outdir, man, inst, ranks=HIP_RANKS, hipcc=hipcc, arch="gfx90a")
    assert hip_module_symbols(path) == {symbol(man, r, "float32", "sum") for r in HIP_RANKS} | {GATE_SYMBOL}


@pytest.mark.slow
def test_cuda_sources_of_a_mixed_program_compile_with_nvcc(compiled, nvcc):
    """CudaPlatform.build on the NVIDIA ranks: one cubin with exactly their kernels."""
    from hccc.runtime.cuda import build_cuda_module
    from hccc.runtime.gpu import GATE_SYMBOL, elf_symbols
    outdir, man, ir = compiled["hm_allreduce_4x2"]
    inst = Instance("float32", "sum")
    path = build_cuda_module(outdir, man, inst, ranks=CUDA_RANKS, nvcc=nvcc, arch="sm_90")
    assert elf_symbols(path) == {symbol(man, r, "float32", "sum") for r in CUDA_RANKS} | {GATE_SYMBOL}
