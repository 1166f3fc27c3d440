"""``hccc sim``: the nccl-tests-like table, the JSON schema, the timeline plot and the errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hccc.cli import main
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_algorithm, load_cluster
from hccc.runtime.simulator import simulate
from random_programs import sharing_rs4
from cli_runs import run_cli

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
TOPO1 = str(EX / "clusters" / "a100_topo1.topo")
HM_AR = str(EX / "hm_allreduce_2x4.rccl")


def sim(capsys, *args):
    rc = main(["sim", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_has_one_row_per_size(capsys):
    rc, out, err = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "1M,64M")
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert len(rows) == 2
    fields = rows[1].split()
    assert fields[0] == str(64 << 20) and fields[1] == str((64 << 20) // 4) and fields[2] == "float32"
    assert fields[3:5] == ["sum", "-1"]                                        # redop, root (nccl-tests)
    alg = load_algorithm(HM_AR)
    # the step order (phase_order): with the kernels' unit and hop costs the simulator charges,
    # the cost model finds it faster than the schedule's key order on this cluster (65 against 94 us
    # at 1 MiB; 1,639 against 1,619 at 64 MiB)
    ir = build_program(alg, phase_order=True)
    ir.nchannels = alg.header.nchannels      # --channels auto on GPUs: the .rccl's own nChannels
    assert ir.nchannels == 4 and "4 channels" in out
    ref = simulate(ir, load_cluster(TOPO1), 64 << 20, slice_bytes="auto")
    assert float(fields[5]) == pytest.approx(ref.time_us, abs=0.01)
    assert float(fields[7]) == pytest.approx(ref.busbw_GBps, abs=0.01)
    # slice column: the model's slice for this program (CP(m) = 17, 19, 23, 35 units at m = 1, 2,
    # 4, 8; 4 channels; a unit 2.56 us and a block 49 GB/s, compiler/passes/kernel_cost.py): 64M's
    # 8 MiB chunks at the slot's 1 MiB (16 micro-batches would halve the parts but nearly double
    # the units), 1M's 128 KiB chunks whole (two micro-batches: two more units for half the bytes a
    # unit, 55.0 us against 54.8)
    assert float(fields[8]) == pytest.approx(ref.lower_bound_s * 1e6, abs=0.01)     # progbound
    # cutbound: the cluster's, independent of the program: an AllReduce moves the whole buffer over
    # every cut (docs/bounds.md), here a100_topo1's two nodes of 4 GPUs behind 2 NICs of 12.5 GB/s
    # each (two 100 Gb/s NICs a node, as the .topo declares)
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds
    cut = collective_cut_bound_seconds(network_from_topology(load_cluster(TOPO1)), "allreduce", 8, 1, 0, 64 << 20)
    assert float(fields[9]) == pytest.approx(cut * 1e6, abs=0.01) and float(fields[9]) <= float(fields[5])
    assert "progbound: the program's own bound" in out and "cutbound: the cluster's cut bound" in out
    assert fields[10] == "1M" and int(fields[11]) == ref.micro_batches == 8
    assert rows[0].split()[10] == "128K"
    assert "state-based TBs" in out and "a100_topo1" in out and "slice per size" in out
    avg = out.splitlines()[-1]
    busbw = [float(r.split()[7]) for r in rows]
    assert avg.startswith("# Avg bus bandwidth    : ")
    assert float(avg.split(":")[1]) == pytest.approx(sum(busbw) / 2, rel=1e-3)


@pytest.mark.slow   # a size sweep of simulations
def test_nccl_tests_sweep_and_several_runs(capsys, tmp_path):
    """-b/-e/-f sweep like nccl-tests; two algorithms x two schedulers give four tables and one
    busbw figure; the timeline shows the chosen ranks only."""
    ring = str(EX / "ring_allreduce_8.rccl")
    png, bw = tmp_path / "tl.png", tmp_path / "bw.png"
    rc, out, err = sim(capsys, HM_AR, ring, "--topology", TOPO1, "-b", "1M", "-e", "16M", "-f", "4",
                       "--scheduler", "hpds,rr", "--plot", str(png), "--ranks", "3", "--plot-busbw", str(bw))
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert [int(r.split()[0]) for r in rows] == [1 << 20, 4 << 20, 16 << 20] * 4
    assert out.count("# Avg bus bandwidth") == 4 and out.count("step: 4(factor)") == 4
    assert png.stat().st_size > 1000 and bw.stat().st_size > 1000
    rc, out, _ = sim(capsys, HM_AR, ring, "--topology", TOPO1, "-b", "1M", "-e", "4M", "--json")
    doc = json.loads(out)
    assert [d["algorithm"] for d in doc["runs"]] == ["hm_allreduce_2x4", "ring_allreduce_8"]
    assert all([r["bytes"] for r in d["results"]] == [1 << 20, 2 << 20, 4 << 20] for d in doc["runs"])


def test_timeline_ranks_pick_thread_blocks():
    from hccc.runtime.sim_plot import timeline_tbs
    from hccc.runtime.simulator import prepare
    prog = prepare(build_program(load_algorithm(HM_AR)), load_cluster(TOPO1))
    for ranks in ([0], [3, 5], [7]):
        tbs = timeline_tbs(prog, ranks)
        assert len(tbs) and set(prog.tb_rank[tbs].tolist()) == set(ranks)
        assert len(tbs) == sum(int(prog.tb_rank[g]) in ranks for g in range(prog.ntbs))
    assert list(timeline_tbs(prog, None, 5)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("args, msg", [(["-b", "4M", "-e", "1M"], "below"), (["--sizes", "1M", "-b", "1M"], "not both"),
                                       (["-b", "1M", "-f", "2", "-i", "1K"], "exclude"),
                                       (["--ranks", "8", "--plot", "x.png"], "ranks 0..7")])
def test_sweep_and_rank_errors(capsys, args, msg):
    rc, _, err = sim(capsys, HM_AR, "--topology", TOPO1, *args)
    assert msg in err and "Traceback" not in err
    if msg != "ranks 0..7":      # contradictory sizes are usage errors: one line first, then the usage
        assert rc == 2 and msg in err.splitlines()[0] and err.splitlines()[1].startswith("usage: hccc sim")
    else:
        assert rc == 1


def test_json_schema_and_values(capsys):
    rc, out, _ = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "1M,64M,1G", "--json")
    assert rc == 0
    d = json.loads(out)
    assert [r["bytes"] for r in d["results"]] == [1 << 20, 64 << 20, 1 << 30]
    for r in d["results"]:
        assert {"bytes", "time_us", "algbw_GBps", "busbw_GBps"} <= set(r)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 7 / 8)
        assert r["time_us"] >= r["lower_bound_us"] * (1 - 1e-12)
    assert d["tbs_per_rank_max"] == max(1, d["tbs_per_rank_max"])
    assert 0 <= d["tb_idle_avg"] <= d["tb_idle_max"] <= 1
    assert d["tb_idle_avg"] == d["results"][-1]["tb_idle_avg"]
    assert d["collective"] == "allreduce" and d["nranks"] == 8 and d["execution"] == "task"
    assert d["tbs_state_based"] <= d["tbs_connection_based"]
    from hccc.compiler.passes.slicing import program_slice_bytes
    from hccc.compiler.pipeline import load_program
    assert d["slice"] == "auto" and d["chunk_bytes"] == 1 << 20
    ir = load_program(HM_AR)
    ir.nchannels = d["channels"]
    assert [r["chunk_bytes"] for r in d["results"]] == [program_slice_bytes(ir, r["bytes"], 1 << 20)
                                                        for r in d["results"]]
    # the model's slices with the header's 4 channels: 128 KiB chunks whole, then the slot's share
    assert [r["chunk_bytes"] for r in d["results"]] == [128 << 10, 1 << 20, 1 << 20]
    assert all(r["slot_bytes"] == 1 << 20 for r in d["results"])


@pytest.mark.parametrize("extra", [["--scheduler", "rr"], ["--tb-alloc", "connection"],
                                   ["--execution", "algorithm"], ["--chunk-size", "256K"],
                                   ["--dtype", "float16"]])
def test_options(capsys, extra):
    rc, out, err = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "8M", "--json", *extra)
    assert rc == 0, err
    d = json.loads(out)
    if "--execution" in extra:
        assert d["execution"] == "algorithm" and d["tb_alloc"] == "connection" and d["scheduler"] == "step"
        assert d["tbs_total"] == d["tbs_connection_based"]
    if "--scheduler" in extra:
        assert d["scheduler"] == "rr"
    if "--chunk-size" in extra:
        assert d["chunk_bytes"] == 256 << 10 and d["results"][0]["micro_batches"] == 4
        assert d["slice"] == "fixed" and d["results"][0]["chunk_bytes"] == 256 << 10
    if "--dtype" in extra:
        assert d["dtype"] == "float16"


def test_every_execution_gets_its_programs_slice(capsys):
    """Each program at the slice the launchers would give it (``program_slice_bytes``: the model
    over its own critical path): the algorithm-level baseline's and round-robin's programs are
    other programs than HPDS's, so their slices may differ (the comparison of schedules at one
    slice: tests/test_sim_policy.py)."""
    from hccc.cli import command_parser
    from hccc.commands import sim as cmd
    from hccc.compiler.passes.slicing import program_slice_bytes, slot_share_bytes
    from hccc.compiler.pipeline import read_cluster
    sizes = [8 << 20, 64 << 20]
    cluster = read_cluster(TOPO1)
    for extra in ([], ["--execution", "algorithm"], ["--scheduler", "rr"]):
        _, o, _ = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "8M,64M", "--json", *extra)
        args = command_parser("sim").parse_args([HM_AR, "--topology", TOPO1, "--sizes", "8M,64M", *extra])
        ir, _, _ = cmd._load(args, HM_AR, args.scheduler[0], cluster, sizes)
        share = slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
        assert [r["chunk_bytes"] for r in json.loads(o)["results"]] == \
            [program_slice_bytes(ir, n, share) for n in sizes], extra


def test_algorithm_level_is_not_faster_than_hpds_here(capsys):
    _, a, _ = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "256M", "--json", "--execution", "algorithm")
    _, t, _ = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "256M", "--json")
    assert json.loads(t)["results"][0]["time_us"] <= json.loads(a)["results"][0]["time_us"]


def test_ir_json_input(capsys, tmp_path):
    ir = build_program(load_algorithm(HM_AR), chunk_bytes=1 << 19)
    p = tmp_path / "prog.json"
    p.write_text(ir.to_json())
    rc, out, err = sim(capsys, str(p), "--topology", TOPO1, "--sizes", "16M,1G", "--json")
    assert rc == 0, err
    d = json.loads(out)
    # the IR's 512 KiB slots bound the slice: 2 MiB chunks in the 4 slices a full slot gives (one
    # channel: a unit's part is the whole slice; at 2.56 us a unit, compiler/passes/kernel_cost.py,
    # the program's fill no longer pays for more), 128 MiB chunks in 256
    assert d["chunk_bytes"] == 1 << 19
    assert [(r["chunk_bytes"], r["micro_batches"]) for r in d["results"]] == [(1 << 19, 4), (1 << 19, 256)]
    rc, out, err = sim(capsys, str(p), "--topology", TOPO1, "--sizes", "16M", "--json", "--chunk-size", "1M")
    d = json.loads(out)
    assert d["chunk_bytes"] == 1 << 20 and d["results"][0]["micro_batches"] == 2


@pytest.mark.slow
def test_plot_writes_an_image(capsys, tmp_path):
    png = tmp_path / "timeline.png"
    rc, out, err = sim(capsys, HM_AR, "--topology", TOPO1, "--sizes", "1M,16M", "--plot", str(png))
    assert rc == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "timeline of 16MB" in out


def test_rank_mismatch_is_a_clean_error(capsys, tmp_path):
    """A cluster of another GPU count: located at the .rccl header, with the cluster's node sizes,
    as compile, run and check say it (for a ProgramIR, which has no header line, unlocated)."""
    rc, out, err = sim(capsys, str(EX / "hm_allreduce_4x8.rccl"), "--topology", TOPO1)
    assert rc == 1
    assert re.search(r"hm_allreduce_4x8\.rccl:2:1: error: the algorithm has nRanks=32 but cluster "
                     r"'a100_topo1\.topo' has 8 GPUs \(", err), err
    assert "Traceback" not in err
    ir = tmp_path / "k"
    assert run_cli(EX / "ring_allreduce_8.rccl", "-o", ir).returncode == 0
    rc, out, err = sim(capsys, str(ir / "ring_allreduce_8.ir.json"), "--topology", str(EX / "clusters" / "h20_4x2_8.topo"))
    assert rc == 1
    assert "error: the program has 8 ranks but cluster 'h20_4x2_8.topo' has 16 GPUs (node1: 4, node2: 4, node3: 8)" \
        in err, err


@pytest.mark.parametrize("make, key", [
    (lambda d: run_cli(EX / "ring_allreduce_8.rccl", "-o", d) and d / "ring_allreduce_8.ir.json", '"nranks"'),
    (lambda d: EX / "msccl" / "allreduce_ring_4.xml", "ngpus="),
    (lambda d: Path(__file__).parent / "mscclpp_corpus" / "default_algos__allgather_in.json", '"gpus"'),
], ids=["programir", "msccl-xml", "mscclpp-plan"])
@pytest.mark.parametrize("command", ["sim", "check", "compile"])
def test_a_program_file_of_another_rank_count_is_located_where_it_gives_its_ranks(tmp_path, make, key, command):
    """A ProgramIR, an MSCCL XML or an MSCCL++ plan against a cluster of another GPU count: every
    command's error is located at what gives the file's rank count."""
    path = make(tmp_path / "k")
    topo = str(EX / "clusters" / "h20_4x2_8.topo")
    argv = {"sim": ["sim", path, "--topology", topo, "--sizes", "1M"], "check": ["check", path, "--topology", topo],
            "compile": [path, "-o", tmp_path / "out", "--topology", topo]}[command]
    r = run_cli(*argv)
    assert r.returncode == 1
    m = re.search(rf"^{re.escape(str(path))}:(\d+):(\d+): error: the program has \d+ ranks but cluster "
                  r"'h20_4x2_8\.topo' has 16 GPUs", r.stderr, re.M)
    assert m, r.stderr
    line = Path(path).read_text().splitlines()[int(m[1]) - 1]
    assert line[int(m[2]) - 1:].startswith(key)


def test_missing_link_is_a_clean_error(capsys, tmp_path):
    topo = tmp_path / "line.topo"
    topo.write_text("define nodenum = 1\ndefine node1 = 3\n"
                    "define bandwidth = {direct => [((0,1) -> (25,1)), ((1,2) -> (25,1))]}\n")
    algo = tmp_path / "ring3.rccl"
    algo.write_text('def ResCCLAlgo(nRanks=3, nChannels=1, nWarps=16, AlgoName="r3", OpType="Allgather", '
                    'GPUPerNode=3, NICPerNode=0):\n    for s in range(0, 2):\n        for r in range(3):\n'
                    '            transfer(r, (r + 1) % 3, s, (r - s + 3) % 3, recv)\n')
    rc, out, err = sim(capsys, str(algo), "--topology", str(topo))
    assert rc == 1
    # the compiler's own cluster check (sim builds through the compile's passes): located
    assert re.search(r"ring3\.rccl:4:13: error: no link from rank 2 .* to rank 0 .* in cluster 'line\.topo'", err), err
    assert "Traceback" not in err


def test_bad_topology_file_is_located(capsys, tmp_path):
    topo = tmp_path / "bad.topo"
    topo.write_text("define nodenum = 1\ndefine node1 = two\n")
    rc, _, err = sim(capsys, HM_AR, "--topology", str(topo))
    assert rc == 1
    assert re.search(r"bad\.topo:2:\d+: error:", err), err


@pytest.mark.parametrize("args", [["--sizes", "12Q"], ["--chunk-size", "100"], ["--execution", "stage"]])
def test_usage_errors_exit_2(capsys, args):
    assert main(["sim", HM_AR, "--topology", TOPO1, *args]) == 2


@pytest.mark.parametrize("dtype, size", [("int64", "4"), ("int64", "12"), ("float16", "1"), ("int32", "1M,1026"),
                                         ("all", "4")])
def test_sizes_of_no_whole_element_are_refused_as_run_refuses_them(capsys, dtype, size):
    """A size that is not a whole number of elements (4 bytes of int64: nccl-tests' count 0) is
    refused by sim as by run, the same message, exit 2, before any table (sim printed a time for
    count 0 where run refused)."""
    rc, out, err = sim(capsys, HM_AR, "--topology", TOPO1, "-d", dtype, "--sizes", size)
    assert rc == 2 and "#" not in out and "Traceback" not in err, err
    assert err.startswith("hccc sim: error: size ") and "is not a whole number of" in err, err
    assert main(["run", HM_AR, "-d", dtype, "--sizes", size]) == 2
    assert capsys.readouterr().err.replace("hccc run", "hccc sim") == err
    # a whole number of elements is simulated, its count the size over the element's bytes
    rc, out, err = sim(capsys, HM_AR, "--topology", TOPO1, "-d", "int64", "--sizes", "16")
    assert rc == 0 and re.search(r"^\s+16\s+2\s+int64\b", out, re.M), out


def test_topology_is_required(capsys):
    assert main(["sim", HM_AR]) == 2


def test_msccl_xml_runs_the_way_it_was_checked_for(capsys, tmp_path):
    """An MSCCL ring that is deadlock-free only under MSCCL's algorithm-level execution is simulated
    that way by default; forced task-level, the simulator finds the FIFO deadlock the kernels would hit."""
    topo = tmp_path / "mesh4.topo"
    links = ", ".join(f"(({a},{b}) -> (25,2))" for a in range(4) for b in range(4) if a != b)
    topo.write_text(f"define nodenum = 1\ndefine node1 = 4\ndefine bandwidth = {{direct => [{links}]}}\n")
    xml = EX / "msccl" / "allreduce_ring_4.xml"
    from hccc.compiler.pipeline import load_program

    ir = load_program(xml)
    if ir.origin.execution != "algorithm":
        pytest.skip("this example also passes the task-level check")
    rc, out, err = sim(capsys, str(xml), "--topology", str(topo), "--sizes", "64M", "--json")
    assert rc == 0, err
    assert json.loads(out)["execution"] == "algorithm"
    rc, out, err = sim(capsys, str(xml), "--topology", str(topo), "--sizes", "64M", "--execution", "task")
    assert rc == 1 and "simulation deadlock" in err and "waits for a free FIFO slot" in err


@pytest.mark.parametrize("extra", [[], ["--dtype", "float16"], ["--block-bw", "0"], ["--chunk-size", "256K"]])
def test_the_kept_allocation_is_not_simulated_twice(capsys, tmp_path, monkeypatch, extra):
    """Where the allocation choice simulated both allocations at the sizes asked, ``hccc sim``
    reports the kept program's results from that choice instead of simulating it again (two
    simulations per size, not three), and they are those of a fresh simulation of that program;
    with another element size, block limit or a fixed slice it simulates again."""
    import hccc.runtime.simulator as S
    from hccc.compiler.pipeline import read_cluster
    from hccc.runtime.sim_model import prepare
    src, topo = sharing_rs4(tmp_path)
    calls = []
    real = S.simulate
    monkeypatch.setattr(S, "simulate", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    rc, out, err = sim(capsys, src, "--topology", topo, "--sizes", "1M,64M", "--json", *extra)
    assert rc == 0, err
    d = json.loads(out)
    # both allocations at both sizes for the choice, and only with other settings the kept one again
    assert sorted(calls) == sorted([1 << 20, 64 << 20] * (2 if not extra else 3))
    # a fresh simulation of the program kept, as hccc sim asks for it
    from hccc.commands import sim as cmd
    import argparse
    p = argparse.ArgumentParser()
    cmd.configure(p)
    args = p.parse_args([src, "--topology", topo, "--sizes", "1M,64M", *extra])
    (args.dtype,), (args.op,) = args.dtype, args.op          # one table's (hccc sim runs one per pair)
    cluster = read_cluster(topo)
    ir, execution, _ = cmd._load(args, src, "hpds", cluster, [1 << 20, 64 << 20])
    prog = prepare(ir, cluster.topology, args.block_bw or None)
    esize = cmd.DTYPE_BYTES[args.dtype]
    for r, size in zip(d["results"], [1 << 20, 64 << 20]):
        fresh = real(prog, cluster.topology, size, execution=execution, element_bytes=esize,
                     slice_bytes=None if args.chunk_size else "auto")
        assert {k: v for k, v in r.items() if k != "cut_bound_us"} == fresh.summary()


def test_side_by_side_predictions_equal_one_by_one(tmp_path, monkeypatch):
    """The cost model simulates the programs it compares on threads of their own when they are
    large (forced here): the predictions are those of one simulation after the other."""
    import concurrent.futures as cf

    import hccc.runtime.simulator as S
    from hccc.compiler.pipeline import load_algorithm, read_cluster
    src, topo = sharing_rs4(tmp_path)
    alg = load_algorithm(src)
    irs = [build_program(alg, tb_alloc=m, chunk_bytes=1 << 16, fuse=False) for m in ("state", "connection")]
    cluster = read_cluster(topo)
    sizes = [1 << 20, 64 << 20]
    alone = [S.SimulatedCost(cluster.topology, sizes).times(ir) for ir in irs]
    pools = []
    real_pool = cf.ThreadPoolExecutor
    monkeypatch.setattr(cf, "ThreadPoolExecutor", lambda *a, **k: pools.append(1) or real_pool(*a, **k))
    monkeypatch.setattr(S, "SIDE_BY_SIDE_UNITS", 0)
    cost = S.SimulatedCost(cluster.topology, sizes)
    assert cost.times_of(irs) == alone and pools == [1]
    assert all(cost.simulated(ir) is not None for ir in irs)
