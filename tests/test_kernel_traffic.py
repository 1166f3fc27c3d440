"""HBM and link traffic of the kernels (hccc.runtime.kernel_traffic) and benchmarks/kernel_model.py.

Oracles: closed forms counted by hand from the ring algorithms (per rank: which primitives move
which chunk, each primitive's reads and writes per byte), and, for random programs, the benchmark's
own independent count of sent bytes (benchmarks/gpu_busbw.py bytes_moved).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import benchmark_script
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.kernel_traffic import traffic
from hccc.testing import valid_programs

ROOT = Path(__file__).resolve().parent.parent


_script = benchmark_script


@pytest.mark.parametrize("n", [3, 4, 8])
def test_ring_allgather_closed_form(n):
    """Per rank: copy its input chunk (1 read + 1 write), send n-1 chunks (source -> slot) and
    receive n-1 (slot -> output), 2 bytes per byte each: (2 + 4(n-1)) chunks; chunk = S/n. Direct
    mode drops the receives' 2 bytes. Links carry (n-1) chunks per rank."""
    ir = build_program(gen.ring_allgather(n), chunk_bytes=1 << 16)
    S = n * 3 * 1024
    t = traffic(ir, S)
    assert t.hbm == (4 * n - 2) * S and t.hbm_read == t.hbm_write == (2 * n - 1) * S
    assert t.link == (n - 1) * S
    assert traffic(ir, S, direct=True).hbm == (2 * n) * S


@pytest.mark.parametrize("n", [3, 5, 8])
def test_ring_allreduce_closed_form(n):
    """Per rank, chunk = S/n. ReduceScatter: 1 SEND (2), n-2 x (RECV_REDUCE_COPY 3 + SEND 2), one
    final RECV_REDUCE_COPY (3); AllGather: 1 SEND (2), n-2 x (RECV 2 + SEND 2), 1 RECV (2):
    9(n-1) chunks. Direct mode: the n-1 RECVs move nothing: 7(n-1)."""
    ir = build_program(gen.ring_allreduce(n), chunk_bytes=1 << 16)
    S = n * 4 * 1000
    assert traffic(ir, S).hbm == 9 * (n - 1) * S
    assert traffic(ir, S, direct=True).hbm == 7 * (n - 1) * S
    assert traffic(ir, S).link == 2 * (n - 1) * S


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce"])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_link_bytes_match_the_benchmarks_count(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=256)
    nbytes = 4 * data.draw(st.integers(0, 5000), label="count")
    bench = _script("gpu_busbw")
    t = traffic(ir, nbytes)
    assert t.link == bench.bytes_moved(ir, nbytes).sent
    # every sent byte is read once and lands in a slot; direct mode never costs more
    assert t.hbm_read >= t.link and t.hbm_write >= t.link
    assert traffic(ir, nbytes, direct=True).hbm <= t.hbm
    assert sum(t.per_tb_reads.values()) == t.hbm_read


def test_kernel_model_prints_before_and_after(capsys, monkeypatch):
    # the script's main in this process (its entry is sys.exit(main())); the folder it puts on
    # sys.path for a checkout is taken off again
    monkeypatch.setattr(sys, "path", list(sys.path))
    model = _script("kernel_model")
    assert model.main(["--sizes", "64M"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for alg in ("ring_allgather_8", "ring_allreduce_8", "hm_allreduce_4x8"):
        rows = {l.split()[2]: l for l in lines if l.startswith(alg)}
        assert {"v1", "v2"} <= set(rows), lines
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / "ring_allgather_8.rccl")
    rows = {r["design"]: r for r in model.model(ir, 64 << 20, latency_ns=700, hbm_gbs=3350, channels=4)}
    v1, v2 = rows["v1 (before)"], rows["v2 (as built)"]
    assert v2["block_gbs"] == pytest.approx(8 * v1["block_gbs"])     # 8 loads in flight instead of 1
    assert v2["block_bound_busbw"] > v1["block_bound_busbw"]
    assert rows["v2 + direct"]["hbm_per_byte"] == 16 and v2["hbm_per_byte"] == 30     # closed forms above
    # 4 channels: a block loads a quarter (its sync per message stays), so the block bound rises,
    # by less than 4x; channel, fused and direct rows are all the kernels as built
    ch4 = rows["v2 + 4 channels"]
    assert v2["block_bound_busbw"] < ch4["block_bound_busbw"] < 4 * v2["block_bound_busbw"]
    assert not any(r["model_only"] for r in rows.values())
    assert model.main(["--sizes", "x"]) == 1
    assert "bad --sizes 'x'" in capsys.readouterr().err


def test_gpu_benchmark_hbm_bound_uses_the_traffic_model():
    bench = _script("gpu_busbw")
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / "ring_allgather_8.rccl")
    assert "ring_allreduce_8" in bench.ALGORITHMS
    assert bench.hbm_bytes(ir, 8 << 20) == 30 * (8 << 20)          # (4n - 2) S, n = 8
    assert bench.hbm_bytes(ir, 8 << 20, "float16") == 30 * (8 << 20)


def test_kernel_model_v3_terms():
    """v3: threads halved until every block is resident (1,024 threads of 64 registers per SM),
    launch and fill counted, the sync term per message, and an LL crossover inside the range."""
    model = _script("kernel_model")
    from hccc.compiler.pipeline import load_program
    assert model.v3_threads(128, 132) == 512 and model.v3_threads(448, 132) == 256
    assert model.v3_threads(600, 132) == 128 and model.v3_threads(10 ** 6, 132) == 32
    ir = load_program(ROOT / "examples" / "ring_allreduce_8.rccl")
    kw = dict(latency_ns=700, hbm_gbs=3000, sms=132, sync_us=1.0, launch_us=5.0)
    small, big = model.v3(ir, 4 << 10, **kw), model.v3(ir, 1 << 30, **kw)
    assert small["time_us"] > 5.0 + small["fill_us"] and small["limit"] == "blocks"
    assert big["limit"] == "HBM" and 0.9 < big["of_hbm_bound"] <= 1.0
    # no sync cost: the block term shrinks by exactly messages x sync
    nosync = model.v3(ir, 4 << 10, **dict(kw, sync_us=0.0))
    msgs = small["messages_per_block"]
    assert small["block_us"] - nosync["block_us"] == pytest.approx(msgs * 1.0, rel=1e-6)
    ll = model.v3(ir, 4 << 10, ll=True, **kw)
    assert ll["model_only"] and ll["time_us"] < small["time_us"]
    cross = model.ll_crossover(ir, **kw)
    assert 4 << 10 <= cross < 1 << 30
    assert model.v3(ir, 2 * cross, ll=True, **kw)["time_us"] >= model.v3(ir, 2 * cross, **kw)["time_us"]


def test_kernel_model_overlapped_sync_term():
    """The overlapped sync (per-warp waits, a block-shared arrival counter, no block barrier): what
    a message costs a block and does not hide stays under 0.5 us in every v3 row the model prints
    (threads as the runtime picks them), grows as a block has fewer warps to hide a poll and a
    release behind, and is below the lock-step 1.0 us even for one warp's worth of hiding less;
    a message's latency (the fill) still pays the whole chain."""
    model = _script("kernel_model")
    from hccc.compiler.pipeline import load_program
    kw = dict(latency_ns=700, hbm_gbs=3000, sms=132, launch_us=5.0)
    for name, path in model.ALGORITHMS.items():
        ir = load_program(path)
        for n in (4 << 10, 1 << 20, 1 << 30):
            row = model.v3(ir, n, **kw)
            assert row["sync_us"] < 0.5, (name, n, row)
            fixed = model.v3(ir, n, sync_us=1.0, **kw)
            assert row["block_us"] < fixed["block_us"]
    costs = [model.overlapped_sync_us(t) for t in (1024, 512, 256, 128, 64, 32)]
    assert costs == sorted(costs) and costs[1] < 0.5 and costs[3] < 0.5
    ir = load_program(model.ALGORITHMS["ring_allreduce_8"])
    small = model.v3(ir, 4 << 10, **kw)
    hidden = model.v3(ir, 4 << 10, sync_us=small["sync_us"], **kw)
    assert small["fill_us"] > hidden["fill_us"]          # latency is not overlapped


def test_kernel_model_v4_terms(monkeypatch, capsys):
    """v4 (every cost a constant of compiler/passes/slicing.py, the kernel cost model's): the slice is the
    launchers'; the fill is the critical path's units beyond its whole runs at a unit's full cost
    and bytes; a block's steady time is the longer of its units' costs and its loads (the sync warp
    off the data path), not their sum; LL moves half its bandwidth as data in 16-byte lines of 8;
    the constants move the rows; the table and JSON print them."""
    model = _script("kernel_model")
    from hccc.compiler.passes import slicing
    from hccc.compiler.passes.channels import with_channels
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.rank_memory import launch_slice_bytes
    kw = dict(hbm_gbs=3000, sms=132, launch_us=5.0)
    ir = load_program(model.ALGORITHMS["ring_allreduce_8"])
    small = model.v4(ir, 4 << 10, **kw)
    prog = with_channels(ir, small["channels"])
    assert small["slice"] == launch_slice_bytes(prog, 4 << 10, 4, prog.chunk_bytes, "simple")
    part = 16 * -(-(small["slice"] // 16) // small["channels"])
    cp = slicing.critical_path(prog)
    assert small["fill_us"] == pytest.approx(cp.fill(small["micro_batches"]) * (
        slicing.UNIT_SECONDS + part / slicing.BLOCK_BYTES_PER_SECOND) * 1e6, rel=1e-9)
    # 4 KiB: its units bound the blocks (14 primitives, one micro-batch, a unit's cost each)
    assert small["limit"] == "blocks" and small["sync_bound"]
    assert small["block_us"] == pytest.approx(14 * slicing.UNIT_SECONDS * 1e6, rel=1e-9)
    assert small["time_us"] == pytest.approx(5.0 + small["fill_us"] + small["block_us"], rel=1e-9)
    # 1 GiB: HBM-bound; its blocks' loads outlast their units, which the sync warp hides
    big = model.v4(ir, 1 << 30, **kw)
    assert big["limit"] == "HBM" and not big["sync_bound"] and 0.9 < big["of_hbm_bound"] <= 1.0
    units = 14 * big["micro_batches"] * slicing.UNIT_SECONDS * 1e6
    assert units < big["block_us"] < units + big["block_us"]           # max, not the sum
    ll = model.v4(ir, 4 << 10, proto="ll", **kw)
    assert ll["block_gbs"] == pytest.approx(small["block_gbs"] * slicing.LL_DATA_FRACTION)
    assert ll["unit_us"] == pytest.approx(slicing.LL_UNIT_SECONDS * 1e6) and ll["time_us"] < small["time_us"]
    assert ll["hbm_per_byte"] > small["hbm_per_byte"]                   # slot bytes twice over
    cross = model.v4_ll_crossover(ir, **kw)
    assert 4 << 10 <= cross < 1 << 30
    assert model.v4(ir, 2 * cross, proto="ll", **kw)["time_us"] >= model.v4(ir, 2 * cross, **kw)["time_us"]
    monkeypatch.setattr(slicing, "UNIT_SECONDS", 2 * slicing.UNIT_SECONDS)   # one constant, read where it is
    assert model.v4(ir, 4 << 10, **kw)["block_us"] == pytest.approx(2 * small["block_us"], rel=1e-9)
    monkeypatch.undo()
    monkeypatch.setattr(sys, "path", list(sys.path))       # the script's main, in this process
    capsys.readouterr()
    assert model.main(["--sizes", "4K", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["v4"]["unit_us"] == pytest.approx(slicing.UNIT_SECONDS * 1e6) and d["v4"]["measured"] is True
    assert {r["design"] for r in d["v4_rows"]} == {"v4 simple (model)", "v4 ll (model)"}
    assert d["predictions"]["v4_ll_crossover_bytes"] == cross
