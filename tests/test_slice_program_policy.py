"""A program's own slice policy (``nMicroBatches``, ``MinSliceBytes`` in its ``.rccl`` header; ``slicing``
in its IR): carried from the header to the IR, its JSON and back, refused with a located error where out
of range, followed by the simulator and the CPU emulation's launches, and chosen by ``hccc synth`` for
programs of thin streams (compiler/passes/slicing.py: ``thin_policy``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.ir.program_ir import IRFormatError
from hccc.compiler.ir.program_ir_json import decode_json
from hccc.compiler.passes import slicing
from hccc.compiler.frontend.slice_policy import DEFAULT_MICRO_BATCHES, DEFAULT_MIN_SLICE_BYTES
from hccc.compiler.passes.slicing import (SlicePolicy, busiest_slots, critical_path, slot_share_bytes, thin_policies,
                                          thin_policy)
import slice_oracle as oracle
from cli_runs import run_cli
from hccc.compiler.pipeline import load_cluster, load_program
from hccc.commands.synth import THIN_GAIN, THIN_SLICES_BELOW

REPO = Path(__file__).resolve().parent.parent
KiB, MiB = 1 << 10, 1 << 20


def _ring_text(n: int, extra: str = "") -> str:
    """A ring AllGather on ``n`` ranks, written out transfer by transfer (one chunk per rank)."""
    lines = [f'def ResCCLAlgo(nRanks={n}, AlgoName="ring", OpType="Allgather"{extra}):']
    for step in range(n - 1):
        for r in range(n):
            lines.append(f"    transfer({r}, {(r + 1) % n}, {step}, {(r - step) % n}, recv)")
    return "\n".join(lines) + "\n"


def _program(tmp_path, text: str, name: str = "p.rccl"):
    path = tmp_path / name
    path.write_text(text)
    return load_program(str(path))


# ----------------------------------------------------------------------------- header -> IR -> JSON
def test_the_header_policy_reaches_the_program_and_its_json(tmp_path):
    ir = _program(tmp_path, _ring_text(4, ", nMicroBatches=128, MinSliceBytes=16384"))
    assert ir.slice_policy == SlicePolicy(128, 16384)
    d = json.loads(ir.to_json())
    assert d["slicing"] == {"micro_batches": 128, "min_slice_bytes": 16384}
    back = decode_json(ir.to_json())
    assert back.slice_policy == SlicePolicy(128, 16384)
    plain = _program(tmp_path, _ring_text(4), "q.rccl")
    assert plain.slice_policy == SlicePolicy(DEFAULT_MICRO_BATCHES, DEFAULT_MIN_SLICE_BYTES) == SlicePolicy(1, 16)
    assert "slicing" not in json.loads(plain.to_json())          # default: the JSON as before
    assert decode_json(plain.to_json()).slice_policy.is_default


@pytest.mark.parametrize("param, value, says", [
    ("nMicroBatches", "0", "at least 1"),
    ("nMicroBatches", "5000", "1 to 4096"),
    ("MinSliceBytes", "1000", "multiple of 16"),
    ("MinSliceBytes", "8", "at least 16"),
    ("MinSliceBytes", '"big"', "must be an integer"),
])
def test_a_bad_policy_is_a_located_error(tmp_path, param, value, says):
    path = tmp_path / "bad.rccl"
    path.write_text(_ring_text(4, f", {param}={value}"))
    proc = run_cli("check", path)
    assert proc.returncode == 1
    col = path.read_text().splitlines()[0].index(f"{param}=") + len(param) + 2
    assert f"bad.rccl:1:{col}: error: " in proc.stderr and says in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("slicing_field, says", [
    ({"micro_batches": 0, "min_slice_bytes": 16384}, "micro_batches"),
    ({"micro_batches": 64, "min_slice_bytes": 1000}, "multiple of 16"),
    ({"micro_batches": 64}, "min_slice_bytes"),
    ([64, 16384], "slicing"),
])
def test_a_bad_slicing_field_is_refused(tmp_path, slicing_field, says):
    d = json.loads(_program(tmp_path, _ring_text(3)).to_json())
    d["slicing"] = slicing_field
    with pytest.raises(IRFormatError, match=says):
        decode_json(json.dumps(d))


# ----------------------------------------------------------------------------- who follows it
def test_the_simulator_follows_the_programs_policy(tmp_path):
    from hccc.runtime.simulator import simulate
    topo = load_cluster(str(REPO / "examples" / "clusters" / "a100_topo1.topo"))
    thin = _program(tmp_path, _ring_text(8, ", nMicroBatches=128, MinSliceBytes=16384"), "thin.rccl")
    plain = _program(tmp_path, _ring_text(8), "plain.rccl")
    # 1 MiB chunks: by default the model's 512 KiB (a ring's fill is one unit from two
    # micro-batches on: CP(m) = 8 m + 1), here at least 128 micro-batches down to 16 KiB
    size = 8 * MiB
    a = simulate(plain, topo, size, slice_bytes="auto")
    b = simulate(thin, topo, size, slice_bytes="auto")
    assert (a.slice_bytes, a.micro_batches) == (512 * KiB, 2)
    assert (b.slice_bytes, b.micro_batches) == (16 * KiB, 64)
    # the same as the default program given that slice by hand: the policy only picks the slice
    assert simulate(plain, topo, size, slice_bytes=16 * KiB).time_s == b.time_s
    assert b.stats["instants"] > a.stats["instants"]


def _mesh(n: int):
    from hccc.compiler.cluster.topo_parser import parse_topology
    links = ", ".join(f"(({u},{v}) -> (25,2))" for u in range(n) for v in range(n) if u != v)
    return parse_topology(f"define nodenum = 1\ndefine node1 = {n}\ndefine bandwidth = {{direct => [{links}]}}\n",
                          "mesh.topo")


def _launchers_agree(runner, ir, counts) -> None:
    """The Runner's launches, the one rule (``launch_slice_bytes``, which the Communicator calls)
    and the simulator give a call the same slice: Simple, and under LL (no simulator) a slice
    within LL's share, never larger than Simple's; with 2 channels too (the rule and the
    simulator)."""
    from hccc.compiler.backend import abi
    from hccc.compiler.passes.channels import with_channels
    from hccc.runtime.rank_memory import launch_slice_bytes
    from hccc.runtime.simulator import simulate
    topo = _mesh(ir.nranks)
    share = slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
    for count in counts:
        simple = runner.run(count=count, proto="simple")
        ll = runner.run(count=count, proto="ll")
        assert simple.ok and ll.ok and (simple.proto, ll.proto) == ("simple", "ll")
        assert simple.slice_bytes == launch_slice_bytes(ir, 4 * count, 4, ir.chunk_bytes, "simple")
        assert simple.slice_bytes == simulate(ir, topo, 4 * count, slice_bytes="auto").slice_bytes
        assert ll.slice_bytes == launch_slice_bytes(ir, 4 * count, 4, ir.chunk_bytes, "ll")
        assert ll.slice_bytes <= min(simple.slice_bytes, abi.ll_share_bytes(share))
        two = with_channels(ir, 2)
        assert launch_slice_bytes(two, 4 * count, 4, two.chunk_bytes, "simple") == \
            simulate(two, topo, 4 * count, slice_bytes="auto").slice_bytes


def test_the_emulated_launch_follows_the_programs_policy(tmp_path):
    pytest.importorskip("hccc.runtime.launcher")
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline import load_algorithm
    from hccc.runtime.launcher import Runner
    path = tmp_path / "ring.rccl"
    path.write_text(_ring_text(3, ", nMicroBatches=8, MinSliceBytes=32"))
    ir = build_program(load_algorithm(str(path)), chunk_bytes=1024)
    count = 3 * 100                      # 100 floats a chunk: 400 bytes = 13 slices of 32 bytes
    with Runner(ir, "cpu", "float32", "sum", nthreads=2) as runner:
        res = runner.run(count=count)
        assert res.ok
        assert res.slice_bytes == 64     # ceil(400 / 8) = 50 -> 64 (16-byte multiples), above the floor
        _launchers_agree(runner, ir, [count, 3 * 1000, 3 * 5])
    path.write_text(_ring_text(3))
    plain = build_program(load_algorithm(str(path)), chunk_bytes=1024)
    with Runner(plain, "cpu", "float32", "sum", nthreads=2) as runner:
        res = runner.run(count=count)
        assert res.ok and res.slice_bytes == 400    # the default floor: the whole chunk in one slice


# ----------------------------------------------------------------------------- the rule synth applies
def _slots_oracle(ir, policy: SlicePolicy, nbytes: int) -> int:
    """Primitives of the busiest (rank, tb), counted by hand, times the micro-batches a chunk gets
    (counted as tests/slice_oracle.py counts them) at the slice the policy picks within
    ``policy``'s bounds (that pick is checked against its oracle in tests/test_slice_model.py)."""
    per_tb: dict = {}
    for r, t in zip(ir.prims["rank"].tolist(), ir.prims["tb"].tolist()):
        per_tb[(r, t)] = per_tb.get((r, t), 0) + 1
    share = (ir.chunk_bytes // ir.max_step_chunks) // 16 * 16
    sl = slicing.auto_slice_bytes(nbytes, ir.nchunks, share, 4, path=critical_path(ir), nchannels=ir.nchannels,
                                  policy=policy)
    lo, hi = oracle.bounds(nbytes, ir.nchunks, share, 4, policy.micro_batches, policy.min_slice)
    assert lo <= sl <= hi
    return max(per_tb.values()) * oracle.micro_batches(nbytes, ir.nchunks, sl, 4)


@given(nbytes=st.integers(1 << 20, 1 << 32), seconds=st.floats(1e-5, 1.0))
@settings(max_examples=40, deadline=None)
def test_thin_policy_is_what_the_slot_budget_affords(tmp_path_factory, nbytes, seconds):
    nbytes -= nbytes % 64
    ir = _program(tmp_path_factory.mktemp("p"), _ring_text(6))
    got = thin_policy(ir, nbytes, seconds, ir.chunk_bytes)
    for p in thin_policies():
        assert busiest_slots(ir, p, nbytes, ir.chunk_bytes) == _slots_oracle(ir, p, nbytes)
        affordable = _slots_oracle(ir, p, nbytes) * slicing.UNIT_SECONDS <= slicing.THIN_SLOT_SHARE * seconds
        assert (p in got) == affordable
    assert got == [p for p in thin_policies() if p in got]                # smallest slice first
    assert all(p in slicing.THIN_POLICIES and not p.is_default for p in got)
    # a longer call affords at least as much
    assert set(got) <= set(thin_policy(ir, nbytes, 2 * seconds, ir.chunk_bytes))


# ----------------------------------------------------------------------------- synth chooses it
def _synth(tmp_path, capsys, name: str) -> tuple[dict, Path]:
    out = tmp_path / f"{name}.rccl"
    assert main(["synth", str(REPO / "examples" / "clusters" / "a100_topo1.topo"), "--collective", "allgather",
                 "--method", "trees", "--size", "16M", "-o", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out), out


@pytest.mark.usefixtures("design_target_costs", "alpha_beta_costs")
def test_synth_keeps_smaller_slices_where_they_are_faster_and_affordable(tmp_path, capsys, monkeypatch):
    """At 16 MiB the tree program's chunks are 64 KiB, one slice each by the model (a unit costs
    as much as moving 50 KB, and the trees' fill is a few units): a pipeline fill the size cannot
    hide. Where the units of smaller slices are not affordable (the share they may take of the
    call made tiny), the default stands; at UNIT_SECONDS they are (132 units on the busiest thread
    block at 16 KiB, 66 us of a 170 us call, within THIN_SLOT_SHARE), so the smallest slices are
    simulated, found faster and written into the header, and the fraction reported is what the
    written program simulates at."""
    from hccc.runtime.simulator import simulate
    topo = load_cluster(str(REPO / "examples" / "clusters" / "a100_topo1.topo"))
    with monkeypatch.context() as m:
        m.setattr(slicing, "THIN_SLOT_SHARE", 1e-6)                    # no smaller slices affordable
        plain, out = _synth(tmp_path, capsys, "plain")
    assert plain["slicing"] == {"micro_batches": DEFAULT_MICRO_BATCHES, "min_slice_bytes": DEFAULT_MIN_SLICE_BYTES}
    assert "nMicroBatches" not in out.read_text()
    assert plain["fraction_of_bound"] < THIN_SLICES_BELOW       # so smaller slices were considered
    thin, out2 = _synth(tmp_path, capsys, "thin")
    assert thin["slicing"] == {"micro_batches": 128, "min_slice_bytes": 16 * KiB}
    assert "nMicroBatches=128, MinSliceBytes=16384" in out2.read_text()
    assert thin["fraction_of_bound"] > plain["fraction_of_bound"] * (1 + THIN_GAIN)
    prog = load_program(str(out2))
    prog.nchannels = thin["channels"]
    assert slicing.busiest_slots(prog, prog.slice_policy, 16 * MiB, prog.chunk_bytes) * slicing.UNIT_SECONDS <= \
        slicing.THIN_SLOT_SHARE * thin["bandwidth_bound"]["seconds"] / plain["fraction_of_bound"]
    for got, path in ((plain, out), (thin, out2)):
        prog = load_program(str(path))
        prog.nchannels = got["channels"]          # the header's nChannels, as hccc sim takes it
        from hccc.runtime import sim_model
        t = simulate(prog, topo, 16 * MiB, slice_bytes="auto", block_gbps=sim_model.DEFAULT_BLOCK_GBPS).time_s
        assert got["fraction_of_bound"] == pytest.approx(got["bandwidth_bound"]["seconds"] / t, rel=1e-12)
    assert main(["synth", str(REPO / "examples" / "clusters" / "a100_topo1.topo"), "--collective", "allgather",
                 "--method", "trees", "--size", "16M", "-o", str(tmp_path / "said.rccl")]) == 0
    assert ", slices of at least 16K)" in capsys.readouterr().out
    # the same transfers as the default program: only the header differs
    strip = out2.read_text().replace("nMicroBatches=128, MinSliceBytes=16384, ", "")
    assert [ln for ln in strip.splitlines() if not ln.startswith("#")] == \
        [ln for ln in out.read_text().splitlines() if not ln.startswith("#")]



@pytest.mark.usefixtures("alpha_beta_costs")     # where thin slices win (conftest)
def test_a_thin_simulation_that_would_outlast_the_limit_is_not_started(monkeypatch):
    """``_thin_slices`` scales the default program's simulation by the slots; where that would end
    past the deadline it starts nothing and keeps the default."""
    from hccc.commands import synth as cmd  # noqa: F401
    import hccc.synth_select as select
    from hccc.compiler.synth import synthesize
    from hccc.util import clock
    topo = load_cluster(str(REPO / "examples" / "clusters" / "a100_topo1.topo"))
    result = synthesize(topo, "allgather", method="trees", time_limit=60, bandwidth_bound_bytes=16 * MiB)
    monkeypatch.setattr(slicing, "THIN_SLOT_SHARE", 1e12)               # every policy affordable
    bound = {"seconds": float(result.detail["cut_bound_seconds"])}

    class Phase:
        def update(self, _):
            pass

    for took, kept in ((1e6, False), (None, True)):
        sims = cmd.Simulations(topo, 16 * MiB, clock.now() + 600)
        channels = int(result.detail.get("channels", 1))
        t = sims.seconds(result, channels)
        if took is not None:                                               # as if it had taken 11 days
            sims.walls[sims._key(result) + (channels,)] = took
        f = cmd._thin_slices(result, sims, bound, bound["seconds"] / t, Phase())
        assert (len(sims.times) > 1) == kept
        assert (f > bound["seconds"] / t) == kept
        assert result.slice_policy.is_default != kept
        result.detail.pop("slicing", None)


def _synth_mixed_123(tmp_path, capsys, name: str) -> tuple[dict, Path, Path]:
    """``hccc synth --json`` of AllGather on benchmarks/synth_quality.py's mixed cluster 123."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from synth_quality import mixed_text

    topo_path = tmp_path / "mixed_123.topo"
    topo_path.write_text(mixed_text(123))
    out = tmp_path / f"{name}.rccl"
    assert main(["synth", str(topo_path), "--collective", "allgather", "--method", "trees",
                 "-o", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out), out, topo_path


# 8.5 s of synthesis and simulations at 1 GiB: the slices simulated, kept where faster and reported as the
# written program simulates are test_synth_keeps_smaller_slices_where_they_are_faster_and_affordable's,
# the kept candidate the fastest simulated test_synth_cli.py's test_json_lists_the_tree_candidates_and_the_one_kept
@pytest.mark.slow
@pytest.mark.usefixtures("alpha_beta_costs")     # where thin slices win (conftest)
@pytest.mark.xfail(strict=False, reason="since the selection over every candidate the reported fraction "
                   "(0.9906) differs from the written program's at slice auto (0.9910): not yet taken apart")
def test_synth_scores_each_candidate_at_its_own_slices(tmp_path, capsys):
    """benchmarks/synth_quality.py's mixed cluster 123 (an NVIDIA node of 6 and an AMD node of 4,
    AllGather at 1 GiB): the integral trees lead the LP's rounding at hccc's default slices, but
    their thread blocks cannot afford smaller ones, while the rounding's can, and then leads. Each
    candidate short of the bound is scored at the slices it would be written with: the kept one is
    the fastest so scored, reported at what the written program simulates at, 0.98 of the bound
    or more (the next test: 0.968 where only the program chosen is)."""
    from hccc.runtime.simulator import simulate

    got, out, topo_path = _synth_mixed_123(tmp_path, capsys, "each")
    kept = [c for c in got["candidates"] if c["kept"]]
    timed = [c["simulated_seconds"] for c in got["candidates"] if c["simulated_seconds"] is not None]
    assert len(kept) == 1 and kept[0]["simulated_seconds"] == min(timed)
    assert not SlicePolicy(got["slicing"]["micro_batches"], got["slicing"]["min_slice_bytes"]).is_default
    prog = load_program(str(out))
    prog.nchannels = got["channels"]
    t = simulate(prog, load_cluster(str(topo_path)), 1 << 30, slice_bytes="auto").time_s
    assert got["fraction_of_bound"] == pytest.approx(got["bandwidth_bound"]["seconds"] / t, rel=1e-12)
    assert got["fraction_of_bound"] >= 0.98


@pytest.mark.slow
def test_scoring_only_the_chosen_program_at_smaller_slices_gains_nothing_over_scoring_each(tmp_path, capsys,
                                                                                         monkeypatch):
    """Mixed cluster 123 again, with candidates scored at hccc's default slices only
    (``THIN_CHOOSE_MOST`` 0) and the program chosen then thinned where it can be: the program kept
    is the fastest of those simulated at the default slices, and it is not faster, at its own
    slices, than what scoring each candidate at its own slices keeps (beyond the gain that counts).
    Where the program fastest at the default slices is not the one that gains most from smaller
    ones, scoring each is what finds the faster program: on this cluster, before the tree packing's
    LP was kept between its rounds (compiler/synth/master_lp.py), its column generation ended on
    another optimal vertex, and the program chosen first ran at 0.968 of the bound against 0.981;
    both now keep a program at 0.990."""
    from hccc.commands import synth as cmd  # noqa: F401
    import hccc.synth_select as select

    each, _, _ = _synth_mixed_123(tmp_path, capsys, "each")
    monkeypatch.setattr(select, "THIN_CHOOSE_MOST", 0)
    chosen_first, _, _ = _synth_mixed_123(tmp_path, capsys, "chosen_first")
    timed = [c["simulated_seconds"] for c in chosen_first["candidates"] if c["simulated_seconds"] is not None]
    kept = [c for c in chosen_first["candidates"] if c["kept"]]
    assert len(kept) == 1 and kept[0]["simulated_seconds"] == min(timed)
    assert chosen_first["fraction_of_bound"] <= each["fraction_of_bound"] * (1 + THIN_GAIN)
