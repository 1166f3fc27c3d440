"""The benchmark scripts' building blocks (the scripts themselves are run by hand: see each one;
communicator_latency.py also runs here, small and marked slow)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.passes.verify import verify

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_mixed_vendor_compares_ring_c2c_and_synthesis():
    mv = _load("mixed_vendor")
    topo = load_topology(ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo")
    for coll in ("allgather", "allreduce"):
        algs = mv.algorithms(topo, coll, None, synth_time=60.0)   # a cap (about 3 s here): 5 s failed on a loaded machine
        labels = [a[0] for a in algs]
        assert labels[0] == "flat ring" and any(lb.startswith("c2c") for lb in labels)
        assert labels[-1].startswith("synth") and algs[-1][3] is not None
        for _, alg, hier, _ in algs:
            assert verify(alg).collective.value == coll and hier.nclusters == 2
        assert [a[0] for a in mv.algorithms(topo, coll, None, synth_time=None)] == labels[:-1]


@pytest.mark.slow
def test_alltoall_benchmark_compares_direct_hierarchical_c2c_and_synthesis():
    a2a = _load("alltoall")
    topo = load_topology(ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo")
    algs = a2a.algorithms(topo, synth_time=60.0)   # a cap, not the time it takes
    labels = [a[0] for a in algs]
    assert labels[:3] == ["direct", "hierarchical", "c2c"] and labels[-1].startswith("synth")
    for _, alg, _ in algs:
        assert verify(alg).collective.value == "alltoall"
    rows = a2a.run([1 << 20], ["mixed_v100_w7800"], synth_time=None)
    assert [r["algorithm"] for r in rows] == labels[:-1]
    # no schedule beats the cut bound
    assert all(0 < r["of_cut_bound"][str(1 << 20)] <= 1.0 + 1e-9 for r in rows)


@pytest.mark.slow   # simulates every example program at several sizes (numba's compile, cold)
def test_xml_export_benchmark_rows_and_reference_column(tmp_path):
    xb = _load("xml_export")
    from hccc.compiler.interop.msccl_export import export_algorithm
    from hccc.compiler.pipeline import load_algorithm

    ref = tmp_path / "ref.xml"   # any MSCCL XML file serves as the reference column
    ref.write_text(export_algorithm(load_algorithm(ROOT / "examples" / "ring_allreduce_8.rccl"), fuse=True)[1])
    rows = xb.run([("ring_allreduce_8", "a100_topo1")], 8 << 20, [1, 2], {"ring_allreduce_8": ref})
    (row,) = rows
    assert {(e["instances"], e["fused"]) for e in row["exports"]} == {(1, False), (1, True), (2, False), (2, True)}
    plain = next(e for e in row["exports"] if (e["instances"], e["fused"]) == (1, False))
    assert plain["ratio"] >= 0.98 and plain["steps"] == 224
    assert row["msccl_tools"]["steps"] == 120 and row["msccl_tools"]["ratio"] > 0
    checks = xb.check_times([(2, 4), (128, 8)])
    assert checks[0]["verdict"] == "fits" and checks[-1]["verdict"] != "fits"


def test_mscclpp_plan_benchmark_rows():
    mb = _load("mscclpp_plan")
    (row,) = mb.run([("hm_allreduce_2x4", "a100_topo1")], 8 << 20)
    assert row["ratio"] >= 0.98 and row["port_channels"] > 0 and row["max_ops"] <= 64
    assert row["ops"] > row["nops"] > 0 and row["tbs"] >= 8


@pytest.mark.slow   # builds kernels with nvcc/hipcc
def test_build_time_builds_the_generic_and_per_rank_kernels(tmp_path):
    """build_time's building blocks: the hccc compile in both modes (sizes), a g++ build of the
    table kernels with only the chosen instantiation, and a per-rank build of the specialised ones."""
    import shutil
    import subprocess
    import pytest
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    bt = _load("build_time")
    algo = tmp_path / "ring4.rccl"
    algo.write_text(bt.ring_allreduce_rccl(4, name="ring4"))
    sp = bt.hccc_compile(algo, tmp_path / "sp", "specialized")
    tb = bt.hccc_compile(algo, tmp_path / "tb", "table")
    assert sp["manifest"]["codegen"] == "specialized" and tb["manifest"]["codegen"] == "table"
    assert 0 < tb["bytes"] and 0 < sp["bytes"] and tb["xml_bytes"] == sp["xml_bytes"] > 0
    flags = bt.instance_flags(["int32"], ["max"])
    secs, size = bt.build("g++", [tmp_path / "tb" / "hccc_table.cu"], tmp_path / "tb",
                          tmp_path / "lib" / "t.a", flags, 1)
    syms = subprocess.run(["nm", str(tmp_path / "lib" / "t.a")], capture_output=True, text=True).stdout
    assert secs > 0 and size > 0
    assert "hccc_table_int32_max" in syms and "hccc_table_float32_sum" not in syms
    ranks = [tmp_path / "sp" / f"ring4_r{r}.cu" for r in range(4)]
    bt.build("g++", ranks, tmp_path / "sp", tmp_path / "lib" / "p.a", flags, 2)
    objs = subprocess.run(["ar", "t", str(tmp_path / "lib" / "p.a")], capture_output=True, text=True).stdout.split()
    assert len(objs) == 4
    syms = subprocess.run(["nm", str(tmp_path / "lib" / "p.a")], capture_output=True, text=True).stdout
    assert all(f"hccc_ring4_r{r}_int32_max" in syms for r in range(4))


@pytest.mark.slow
def test_communicator_latency_benchmark_prints_its_table():
    """The one-rank-per-process latency benchmark runs end to end (2 ranks, one size, few calls)."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        pytest.skip("torch (the 'dist' extra) is not installed")
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "communicator_latency.py"),
                          "--ranks", "2", "--sizes", "4K", "--iters", "2"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [ln.split() for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    assert rows[0] == ["bytes", "comm", "us", "runner", "us", "ratio"]
    assert len(rows) == 2 and rows[1][0] == "4096" and float(rows[1][1]) > 0 and float(rows[1][2]) > 0


def test_job_setup_benchmark_times_both_launchers(capsys):
    """benchmarks/job_setup.py: for each rank count, a row per launcher with positive times, and
    the job's set-up as a multiple of the runner's."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    _load("job_setup").main(["--ranks", "2", "--reps", "1"])
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert rows[0][:2] == ["ranks", "launcher"]
    assert [r[:2] for r in rows[1:3]] == [["2", "Runner"], ["2", "LocalJob"]]
    assert all(float(x) > 0 for r in rows[1:3] for x in r[2:])
    assert rows[3][:2] == ["2", "job/runner"] and rows[3][3].endswith("x")


def test_job_setup_benchmark_workload_times_both_launchers(capsys, monkeypatch):
    """benchmarks/job_setup.py --workload: a row per launcher with positive times and the job's
    as a multiple of the runner's (one small program here)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    js = _load("job_setup")
    monkeypatch.setattr(js, "WORKLOAD", [(js.gen.ring_allreduce, 2)])
    js.main(["--workload", "--reps", "1"])
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["launcher", "wall", "s", "CPU", "s"]
    assert [r[0] for r in rows[1:3]] == ["Runner", "LocalJob"]
    assert all(float(x) > 0 for r in rows[1:3] for x in r[1:])
    assert rows[3][0] == "job/runner:" and rows[3][1].endswith("x")


def test_fusion_benchmark_rows(capsys):
    """benchmarks/fusion.py: side-by-side rows; fusion never adds HBM traffic and saves some on a
    ring broadcast (every forward fused)."""
    fb = _load("fusion")
    assert fb.main(["--only", "ring_broadcast_8", "--sizes", "1M", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["program"] == "ring_broadcast_8" for r in rows)
    for r in rows:
        plain, fused = r["hbm_per_byte"]
        assert r["fused"] > 0 and fused < plain
        assert len(r["busbw"]) == 1 and r["auto"] in ("fused", "unfused")


@pytest.mark.slow   # several simulations
@pytest.mark.usefixtures("alpha_beta_costs")     # the link model: a block's folded rate, no units
def test_channels_benchmark_rises_with_channels_to_the_link_model():
    ch = _load("channels")
    rows = ch.run(["ring_allreduce_8:a100_topo1"], [64 << 20], [1, 2, 4], 20.0)
    bw = [r["busbw"][str(64 << 20)] for r in rows]
    link = rows[0]["link_model_busbw"][str(64 << 20)]
    assert [r["channels"] for r in rows] == [1, 2, 4]
    assert bw[0] < bw[1] <= bw[2] * (1 + 1e-9) and bw[2] == pytest.approx(link, rel=1e-9)
    assert bw[0] == pytest.approx(20.0, rel=0.01)      # one block per connection: the block rate


@pytest.mark.slow   # many timed subprocess starts
def test_startup_benchmark_times_both_entry_points_and_msccl(tmp_path):
    """startup.py times ``python -m hccc`` (and the console script where one is installed) and an
    msccl-tools script given to it; a stand-in script plays msccl-tools here."""
    fake = tmp_path / "allreduce_ring.py"
    fake.write_text("import sys\nprint(len(sys.argv))\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--runs", "2",
                          "--msccl-script", str(fake), "--msccl-args", "8 1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "python -m hccc check ring_allreduce_8.rccl" in out.stdout
    assert "msccl-tools allreduce_ring.py 8 1" in out.stdout
    assert "python -m hccc / msccl-tools:" in out.stdout
    if (Path(sys.executable).with_name("hccc")).is_file():
        assert "(console script)" in out.stdout


def test_xml_scale_phases_are_the_export(tmp_path):
    """xml_scale's phase-by-phase export writes what export_algorithm writes (same steps), and its
    phases cover the export."""
    xs = _load("xml_scale")
    from hccc.compiler.frontend.generators import hm_allreduce_rccl
    from hccc.compiler.interop.msccl_export import export_algorithm
    from hccc.compiler.interop.msccl_format import XmlLimits
    from hccc.compiler.pipeline import load_algorithm

    src = tmp_path / "hm.rccl"
    src.write_text(hm_allreduce_rccl(2, 4))
    for k in (1, 3):
        row = xs.export_phases(src, k)
        assert set(row["phases"]) == set(xs.PHASES) and all(v >= 0 for v in row["phases"].values())
        text = export_algorithm(load_algorithm(src), XmlLimits(**xs.RELAXED), instances=k)[1]
        assert row["steps"] == text.count("<step ") > 0


@pytest.mark.slow
def test_sim_speed_compares_two_trees_on_one_program():
    """benchmarks/sim_speed.py end to end on 16 GPUs of both flavours, this checkout against
    itself: the same simulated time in both (the table says "yes")."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_speed.py"), "--gpus", "16",
                          "--flavours", "h20,v100", "--compare", str(ROOT)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    for flavour in ("h20", "v100"):
        row = next(ln for ln in out.stdout.splitlines() if f"{flavour} 16 GPUs" in ln)
        assert "allgather" in row and row.rstrip(" │").endswith("yes")


def test_sim_speed_runs_the_trees_in_turn_and_takes_the_median_of_every_round(monkeypatch):
    """sim_speed.py's ``--rounds``: the trees' processes in turn, the order reversed every other
    round, and each tree's wall the median of all its calls (a stand-in for the processes)."""
    ss = _load("sim_speed")
    calls = []

    def fake(tree, algo, topo, repeats):
        calls.append(tree)
        walls = [float(len(calls))] * repeats
        return {"time_s": 1.0, "events": 1, "share_flows": 1, "walls": walls, "wall_s": walls[0]}

    monkeypatch.setattr(ss, "simulate_in", fake)
    this, other = ss.in_turn(["A", "B"], None, None, 2, 3)
    assert calls == ["A", "B", "B", "A", "A", "B"]
    assert this["walls"] == [1.0, 1.0, 4.0, 4.0, 5.0, 5.0] and this["wall_s"] == 4.0
    assert other["walls"] == [2.0, 2.0, 3.0, 3.0, 6.0, 6.0] and other["wall_s"] == 3.0


def test_slot_cost_counts_the_busiest_blocks_slots_and_fits_a_slope(capsys):
    """slot_cost.py: its slot count is slicing.busiest_slots' (by hand for the ring: each of its
    two thread blocks per rank runs 8 and 7 primitives), its slope is least squares, and a CPU
    run prints a row per slice with the oracle's verdict."""
    sc = _load("slot_cost")
    from hccc.compiler.frontend.slice_policy import SlicePolicy
    from hccc.compiler.passes.slicing import busiest_slots
    from hccc.compiler.pipeline import CompileOptions, load_program

    ir = load_program(str(ROOT / "examples" / "ring_allgather_8.rccl"), CompileOptions())
    # 4 MiB over 8 chunks = 512 KiB each: 8 slices of 64 KiB, 32 of 16 KiB; the busiest TB runs 8
    assert sc.slots_of(ir, 4 << 20, 64 << 10) == 8 * 8 and sc.slots_of(ir, 4 << 20, 16 << 10) == 8 * 32
    assert sc.slots_of(ir, 4 << 20, 16 << 10) == busiest_slots(ir, SlicePolicy(128, 16 << 10), 4 << 20, 1 << 20)
    assert sc.slope([1, 2, 3], [10, 12, 14]) == pytest.approx(2.0) and sc.slope([5, 5], [1, 2]) is None
    # one warp a block: the slots are the program's, whatever the warps (8 ranks of the program's own
    # 16 warps, the default, cost some 6 s of CPU in the emulation; the default is run below, small)
    assert sc.main(["--backend", "cpu", "--algorithms", "ring_allgather_8", "--sizes", "64K",
                    "--slices", "4K,2K", "--nwarps", "1", "--iters", "1", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["slice"], r["slots"], r["wrong"]) for r in out["rows"]] == [(4096, 16, 0), (2048, 32, 0)]
    assert out["fits"][0]["slot_us"] is not None and out["backend"] == "cpu"
    # the default warps (auto): the program's own count, where every block is resident
    assert sc.main(["--backend", "cpu", "--algorithms", "ring_allgather:2", "--sizes", "8K", "--slices", "4K",
                    "--iters", "1", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["nwarps"], r["slots"], r["wrong"]) for r in out["rows"]] == \
        [(sc.program("ring_allgather:2").nwarps, 2, 0)]
    # the diagnostic axes: a generated program, warps, direct mode; one slope per combination
    assert sc.program("ring_allgather:2").nranks == 2 and sc.program("ring_allreduce:3").collective == "allreduce"
    for bad in ("ring_allgather:1", "nosuch:4", "no_such_example"):
        with pytest.raises(SystemExit, match="slot_cost"):
            sc.program(bad)
    with pytest.raises(SystemExit, match="--nwarps"):
        sc.main(["--backend", "cpu", "--nwarps", "0"])
    assert sc.main(["--backend", "cpu", "--algorithms", "ring_allgather:2", "--sizes", "32K", "--slices",
                    "4K,2K", "--nwarps", "2,1", "--direct", "auto,off", "--iters", "1", "--warmup", "0",
                    "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(f["nwarps"], f["direct"]) for f in out["fits"]} == {(2, "auto"), (2, "off"), (1, "auto"), (1, "off")}
    assert all(r["wrong"] == 0 and r["time_us"] is not None for r in out["rows"]) and len(out["rows"]) == 8
    # in place too: a row and a slope per placement, each checked by the oracle
    assert sc.main(["--backend", "cpu", "--algorithms", "ring_allreduce:3", "--sizes", "24K", "--slices",
                    "4K,2K", "--placement", "out,in", "--nwarps", "1", "--iters", "1", "--warmup", "0",
                    "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["inplace"], r["slice"], r["wrong"]) for r in out["rows"]] == \
        [(False, 4096, 0), (False, 2048, 0), (True, 4096, 0), (True, 2048, 0)]
    assert [f["inplace"] for f in out["fits"]] == [False, True]
    with pytest.raises(SystemExit, match="--placement"):
        sc.main(["--backend", "cpu", "--placement", "sideways"])


@pytest.mark.slow     # (the longest of the README's command: in the slow set)
def test_rs_ag_gap_simulates_both_halves_of_one_packing(capsys):
    """rs_ag_gap.py: the ReduceScatter it writes is its AllGather turned around (the same chunk on
    every pair reversed, a channel per stream each), both verify as their collectives, and both
    run within the cut bound (at most 1.0 of it) with RS/AG the ratio of their times."""
    gap = _load("rs_ag_gap")
    from hccc.compiler.synth import forest as fo
    from hccc.compiler.synth import to_algorithm
    from hccc.compiler.synth import trees as tr
    from hccc.compiler.synth.packing import pair_bandwidth
    from hccc.compiler.synth.collectives import SynthResult
    from hccc.compiler.synth.problem import network_from_topology

    topo = load_topology(ROOT / "examples" / "clusters" / "a100_topo1.topo")
    net = network_from_topology(topo)
    pk = tr.pack_trees(net, pair_bw=pair_bandwidth(topo), max_chunks=2)
    ag, rs = fo.stream_rows(pk, "allgather", 2), fo.stream_rows(pk, "reducescatter", 2)
    assert sorted(map(tuple, ag[:, [0, 1, 3]].tolist())) == sorted(map(tuple, rs[:, [1, 0, 3]].tolist()))
    for rows in (ag, rs):
        # a stream (a chunk before the split) keeps one channel on a pair; the chunks cut from it share it
        key = {}
        for s, d, c, ch in rows[:, [0, 1, 3, 5]].tolist():
            assert key.setdefault((s, d, c // 2), ch) == ch
    for coll, rows in (("allgather", ag), ("reducescatter", rs)):
        res = SynthResult(coll, net.nranks, pk.chunks_per_rank * 2, None, rows, 0, 0, [], 0.0, topo.name)
        assert verify(to_algorithm(res, topo)).collective.value == coll
    row = gap.measure(topo, 1, None, 16 << 20, None)
    assert 0.5 < row["AG"] <= 1 + 1e-9 and 0.5 < row["RS"] <= 1 + 1e-9
    assert row["RS/AG"] == pytest.approx(row["AG"] / row["RS"])
    assert 0 < row["busy AG"] <= 1 + 1e-9 and row["chunks"] == 1 and row["split AG"] >= 2 and row["split RS"] >= 4
    assert gap.main(["--clusters", "a100_topo1", "--mi250", "", "--chunks", "1", "--size", "16M",
                     "--slices", "auto,16K"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("a100_topo1")]
    assert len(lines) == 2 and " 16K/16K " in lines[1] and row["slice AG"] > 0
    with pytest.raises(SystemExit, match="no example cluster"):
        gap.clusters("no_such_cluster", "")


def test_jit_compile_counts_top_level_compiles_per_kernel_and_library_functions_inclusive(tmp_path):
    jc = _load("jit_compile")
    log = [["hccc.runtime.sim_engine", "_share", 1.0, 1],           # nested in run_engine: in its line
           ["numba.np.arrayobj", "ol_np_zeros.<locals>.impl", 0.5, 2],
           ["hccc.runtime.sim_engine", "run_engine", 4.0, 0],
           ["hccc.compiler.synth.greedy", "_fill_steps", 2.0, 0],
           ["hccc.runtime.sim_engine", "run_engine", 3.0, 0]]       # a second signature adds up
    top, lib, wall = jc.summary({"wall": 12.5, "log": log})
    assert top == {"sim_engine.run_engine": 7.0, "greedy._fill_steps": 2.0} and wall == 12.5
    assert lib == {"ol_np_zeros": 0.5}
    for cmd in jc.commands(ROOT, tmp_path):          # the workload's inputs are the checkout's
        assert all(Path(a).exists() for a in cmd if a.startswith(str(ROOT)))


@pytest.mark.slow   # synthesises, simulates and compiles (numba as the cache has it)
def test_jit_compile_workload_runs_and_reports_as_json(tmp_path, capsys):
    jc = _load("jit_compile")
    jc.child(ROOT)
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["wall"] > 0 and all(len(entry) == 4 for entry in res["log"])
    # hccc's kernels by their plain names (their twins' qualified names carry a digest of the
    # sources, util/jit.py, which would keep two trees' rows apart under --compare)
    import importlib
    for mod, name, _, _ in res["log"]:
        if mod.startswith("hccc"):
            assert callable(getattr(importlib.import_module(mod), name, None)), (mod, name)


def test_torch_backend_overhead_statistic_cancels_load_drift_and_bursts():
    """benchmarks/torch_backend.py's overhead rounds: with calls whose cost the machine's load
    scales (tripling over the run) and bursts that stall a call of each kind in every round
    fifty-fold, every round's ratio is still the backend's true 1.05 (interleaved pairs meet the
    same load; medians count a burst once); the percentile is the nearest-rank one."""
    tb = _load("torch_backend")
    now = [0.0]
    calls = [0]
    bursts = [True]
    total = 2 * 10 * 8                      # calls in the run: 8 rounds of 10 pairs

    def timed(cost):
        def call():
            calls[0] += 1
            load = 1.0 + 2.0 * calls[0] / total
            burst = 50.0 if bursts[0] and calls[0] % 20 in (7, 8) else 1.0    # a backend call, then a direct one
            now[0] += cost * load * burst
        return call
    got = tb.interleaved(timed(1e-3), timed(1.05e-3), iters=10, rounds=8, clock=lambda: now[0])
    assert calls[0] == total and len(got["ratios"]) == 8
    assert all(abs(r - 1.05) < 0.01 for r in got["ratios"]), got["ratios"]
    assert 1.0e3 < got["direct_us"] < 3.0e3 and abs(got["backend_us"] / got["direct_us"] - 1.05) < 0.02
    # blocks of ten calls each, one kind after the other (what the benchmark did before), read the
    # drift alone as overhead
    now[0], calls[0], bursts[0] = 0.0, 0, False
    d, b = timed(1e-3), timed(1.05e-3)
    t0 = now[0]
    for _ in range(10):
        d()
    t1 = now[0]
    for _ in range(10):
        b()
    assert (now[0] - t1) / (t1 - t0) > 1.1
    assert tb.percentile(range(1, 11), 90) == 9 and tb.percentile([5.0], 90) == 5.0
    assert tb.percentile([4, 1, 3, 2], 50) == 2 and tb.percentile([4, 1, 3, 2], 100) == 4


def test_cpu_builds_counts_the_cpu_of_a_cold_build_and_what_it_caches(capsys):
    """cpu_builds.py: one program for one instance from an empty cache is one module, one engine
    object, one precompiled header and one launcher object, and costs some CPU time."""
    cb = _load("cpu_builds")
    assert cb.main(["--programs", "1", "--instances", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["builds"] == 1 and got["cpu_s"] > 0
    assert got["entries"] == {"cpu": 1, "cpu_engine": 1, "cpu_pch": 1, "cpu_launcher": 1}
    with pytest.raises(SystemExit):
        cb.main(["--programs", "0"])


@pytest.mark.slow          # four hccc processes on 8 GPUs: about 20 s
def test_synth_scale_end_to_end_synthesises_then_compiles_each_collective(tmp_path):
    """benchmarks/synth_scale.py --end-to-end on one node of 8 H20s: AllGather and AllReduce each
    written by ``hccc synth`` and compiled by ``hccc``, the compile's kernels on disk, the seconds
    of both commands summed, the CPU seconds against the target."""
    mod = _load("synth_scale")
    rows = mod.end_to_end([1], tmp_path)
    assert [(r["gpus"], r["collective"]) for r in rows] == [(8, "allgather"), (8, "allreduce")]
    for r in rows:
        assert r["synth_rc"] == 0 and r["compile_rc"] == 0, r
        assert r["transfers"] >= 8 * 7 * (2 if r["collective"] == "allreduce" else 1)
        assert r["total_wall_s"] == pytest.approx(r["synth_wall_s"] + r["compile_wall_s"], abs=0.11)
        assert r["total_cpu_s"] == pytest.approx(r["synth_cpu_s"] + r["compile_cpu_s"], abs=0.11)
        assert r["within_target"] == (r["total_cpu_s"] <= mod.END_TO_END_TARGET)
        assert any((tmp_path / f"{r['collective']}_8").iterdir())


@pytest.mark.slow
def test_table_build_times_each_unit_of_the_make(tmp_path):
    """table_build's build: the Makefile's compiler wrapped in a timer, one row per unit compiled
    (here the one unit holding uint8 prod), its modelled cost beside it."""
    from rich.console import Console
    from hccc.compiler.backend.table_units import default_units
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    tb = _load("table_build")
    r = tb.build(ROOT / "examples" / "ring_allreduce_8.rccl", "cuda", 2, tmp_path, Console(quiet=True),
                 ("HCCC_DTYPES=uint8", "HCCC_OPS=prod"))
    holder = [u for u in default_units() if ("uint8", "prod") in u.instances]
    assert list(r["units"]) == [holder[0].source("cuda")]
    unit = r["units"][holder[0].source("cuda")]
    assert unit["cpu_s"] > 0 and unit["model_s"] == round(holder[0].cost_s, 2)
    assert r["cpu_s"] >= unit["cpu_s"] and r["wall_s"] > 0
