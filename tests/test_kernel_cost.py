"""The kernels' cost model (compiler/passes/kernel_cost.py), the recorded GPU runs it reads
(benchmarks/recorded/gpu_runs.json) and ``benchmarks/kernel_model.py --recorded / --predict``.

- the recorded data parses and says what docs/archive/measurements-log.md's GPU-run tables say (parsed from
  the doc here, not copied), and the model's constants are that data;
- the composition of units against oracles of their own: a hand-derived critical path of a 2-rank
  send/receive (with and without slot back-pressure), and a plain-Python longest path over units
  built from a program's own columns, for random valid programs;
- no second copy of a cost: the slice policy, channels and the simulator read the model's;
- ``--recorded --json``: its schema, and every row within 30 % or named unexplained with a
  hypothesis (and none named that is explained);
- bytes in flight per block against the vectors the emitted ``hccc_prims.h`` defines (parsed from
  the rendered header), the round trip derived from the fifth run, the prediction at the v4 shape
  giving back the measured rate, and ``benchmarks/bytes_in_flight.py`` (its rows and its refusals).
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import benchmark_script
from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes import kernel_cost as kc
from hccc.runtime import kernel_time as kt
from hccc.compiler.passes.build import build_program
from hccc.testing import valid_programs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "recorded" / "gpu_runs.json"
DOC = ROOT / "docs" / "archive" / "measurements-log.md"   # the GPU runs' tables, word for word


_script = benchmark_script


def _runs() -> dict:
    return {r["run"]: r for r in json.loads(DATA.read_text())["runs"]}


def _section(title: str) -> str:
    text = DOC.read_text()
    i = text.index("## " + title)
    j = text.find("\n## ", i + 3)
    return text[i:j if j > 0 else len(text)]


def _num(cell: str) -> list[float]:
    """The numbers of a table cell ("2,107 / 2,055", "543.9 (54.0)": only those outside brackets)."""
    cell = re.sub(r"\([^)]*\)", "", cell)
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", cell)]


def _table(section: str, header_start: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header row starts with ``header_start``."""
    lines = section.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.strip().startswith(header_start))
    rows = []
    for ln in lines[i + 2:]:
        s = ln.strip()
        if not s.startswith("|"):
            break
        rows.append([c.strip() for c in s.strip("|").split("|")])
    return rows


def _rows(run: dict) -> dict:
    return {(r["program"], r["bytes"], r["proto"], r["placement"], r.get("slice")): r["us"] for r in run["rows"]}


KiB, MiB = 1 << 10, 1 << 20


# ----------------------------------------------------------------------------- the recorded data
def test_recorded_data_parses_and_every_row_is_complete():
    runs = _runs()
    assert list(runs) == ["first", "second", "third", "fourth", "fifth"]
    for run in runs.values():
        assert run["kernels"] in ("v3", "v4") and run["card"] in ("H100", "H200") and run["sms"] == 132
        assert ("## " + run["section"]) in DOC.read_text()
        for r in run["rows"]:
            assert r["bytes"] > 0 and r["us"] > 0 and r["proto"] in ("simple", "ll") and r["placement"] in ("in", "out")
            assert r.get("not_in_repository") or (ROOT / "examples" / f"{r['program']}.rccl").exists()
        keys = [(r["program"], r["bytes"], r["proto"], r["placement"], r.get("slice")) for r in run["rows"]]
        assert len(keys) == len(set(keys)), run["run"]


def test_second_run_table_matches_the_doc():
    """Every example of the second run's table, at 4 KiB and 32 MiB out of and in place."""
    rows = _rows(_runs()["second"])
    table = _table(_section("The second GPU run"), "| example (ranks)")
    assert len(table) == 11
    for cells in table:
        name = cells[0].strip("*").split(" ")[0]
        small, (out, inp) = _num(cells[1])[0], _num(cells[2])
        assert rows[(name, 4 * KiB, "simple", "out", None)] == small
        assert rows[(name, 32 * MiB, "simple", "out", None)] == out
        assert rows[(name, 32 * MiB, "simple", "in", None)] == inp
    assert len(rows) == 3 * len(table)


def test_first_run_tables_match_the_doc():
    rows = _rows(_runs()["first"])
    sec = _section("The first GPU run")
    table = _table(sec, "| example | 4 KiB")
    assert len(table) == 6
    for cells in table:
        assert rows[(cells[0], 4 * KiB, "simple", "out", None)] == _num(cells[1])[0]
        assert rows[(cells[0], 32 * MiB, "simple", "out", None)] == _num(cells[2])[0]
    slots = _table(sec, "| program, size | slots")
    slopes = _runs()["first"]["units"]["slot_slope_us"]
    for cells in slots:
        prog, size = re.match(r"ring (AllGather|AllReduce) 8, (\d+) MiB", cells[0]).groups()
        name = f"ring_{prog.lower()}_8"
        t64, t4 = _num(cells[2].replace("->", " "))
        assert rows[(name, int(size) * MiB, "simple", "out", 64 * KiB)] == t64
        assert rows[(name, int(size) * MiB, "simple", "out", 4 * KiB)] == t4
        assert slopes[f"{name} {size}M"] == _num(cells[3])[0]
    assert len(rows) == 2 * len(table) + 2 * len(slots)


def test_fifth_run_tables_match_the_doc():
    run = _runs()["fifth"]
    rows = _rows(run)
    sec = _section("The fifth GPU run")
    units = _table(sec, "| op | 1 warp")
    u = run["units"]
    assert {c[0]: _num(c[1]) + _num(c[2]) + _num(c[3]) for c in units} == \
        {k: list(v) for k, v in u["unit_us"].items()}
    programs = _table(sec, "| program, size | v4")
    names = {"ring AllReduce 8": "ring_allreduce_8", "ring AllGather 8": "ring_allgather_8",
             "direct AllGather 8": "direct_allgather_8", "ring Broadcast 8": "ring_broadcast_8",
             "HM AllReduce 4x8": "hm_allreduce_4x8"}
    seen = 0
    for cells in programs:
        head = cells[0]
        if head.startswith("`hccc synth`"):
            assert rows[("synth h20_4_8 allgather (table mode)", 64 * MiB, "simple", "out", None)] == _num(cells[1])[0]
            seen += 1
            continue
        prog = names[next(k for k in names if head.startswith(k))]
        proto = "ll" if head.endswith("LL") else "simple"
        placement = "in" if "in place" in head else "out"
        slice_b = MiB if "1 MiB slices" in head else None
        sizes = [int(x) * (KiB if unit == "KiB" else MiB) for x, unit in re.findall(r"(\d+) (KiB|MiB)", head)
                 if not (slice_b and x == "1")]
        times = _num(cells[1])
        for size, t in zip(sizes, times):
            assert rows[(prog, size, proto, placement, slice_b)] == t, head
            seen += 1
    assert seen == len(rows)
    # the unit-level figures the model reads, as the doc prints them
    assert f"relaxed post 1.13" in sec and "v3's full `fence.acq_rel`\n  both sides 1.41" in sec
    copy = re.search(r"16 warps ([\d. /]+); 4 warps ([\d. /]+); 1 warp ([\d. /]+)", sec.replace("\n  ", " "))
    assert [[float(x) for x in g.strip(" .").split("/")] for g in copy.groups()] == \
        [list(u["copy_gbs"][w]) for w in ("16", "4", "1")]
    assert "4.3 TB/s" in sec and u["hbm_tbs"] == 4.3


def test_third_and_fourth_runs_match_the_doc():
    runs = _runs()
    third, fourth = _section("The third GPU run"), _section("The fourth GPU run")
    for r in runs["third"]["rows"]:
        us = f"{r['us']:,.0f}" if r["us"] < 1e6 else f"{r['us'] / 1e6:.2f}"   # "1.70 / 1.84 s"
        assert us in third, r
    for r in runs["fourth"]["rows"]:
        assert f"{r['us']:,.0f}" in fourth, r
    for cells in _table(third, "| program, size | slope now"):
        prog, size = re.match(r"ring (AllGather|AllReduce) 8, (\d+) MiB", cells[0]).groups()
        assert runs["third"]["units"]["slot_slope_us"][f"ring_{prog.lower()}_8 {size}M"] == _num(cells[1])[0]


def test_the_models_constants_are_the_recorded_figures():
    """Every measured constant of kernel_cost is the fifth run's figure in the data, and each
    derived one follows from them as its comment says."""
    u = _runs()["fifth"]["units"]
    assert kc.UNIT_WARPS == tuple(u["unit_warps"])
    assert {k: list(v) for k, v in kc.UNIT_US.items()} == {k: v for k, v in u["unit_us"].items() if k in kc.UNIT_US}
    assert kc.COPY_UNIT_KIB == tuple(u["copy_unit_kib"])
    assert {str(w): list(v) for w, v in kc.COPY_GBS.items()} == u["copy_gbs"]
    assert kc.FLAG_ROUND_TRIP_US == u["flag_round_trip_us"]["v4"]
    assert kc.HBM_BYTES_PER_SECOND == u["hbm_tbs"] * 1e12
    assert kc.UNIT_SECONDS == pytest.approx(2.56e-6) and kc.COPY_UNIT_SECONDS == pytest.approx(2.07e-6)
    t256, t512 = (k * KiB / (g * 1e9) for k, g in zip((256, 512), u["copy_gbs"]["16"][3:]))
    assert kc.BLOCK_BYTES_PER_SECOND == pytest.approx(256 * KiB / (t512 - t256), rel=1e-12)
    assert kc.SIM_BLOCK_GBPS == pytest.approx(256 * KiB / (t512 - t256) / 1e9, rel=1e-6)


def test_the_simulators_costs_are_the_models_two_named_instances():
    """The simulator charges the measured calibration by default (SIM_COSTS is V4_H200) and the
    design targets are the v4 figures the worked examples were written at: 0.5 us a unit, 0.2 us a
    COPY unit, 100 GB/s a block, no hop."""
    from hccc.runtime import sim_model
    assert kc.SIM_COSTS is kc.V4_H200
    d = kc.DESIGN_TARGETS
    for warps in (1, 4, 8, 16, 32):
        assert d.fixed_seconds("SEND", warps) == pytest.approx(0.5e-6, rel=1e-12)
        assert d.fixed_seconds("RECV_REDUCE_COPY", warps) == pytest.approx(0.5e-6, rel=1e-12)
        assert d.fixed_seconds("COPY", warps) == pytest.approx(0.2e-6, rel=1e-12)
        assert d.peak_bytes_per_second(warps) == 100e9
    assert d.hop_seconds() == 0.0
    assert sim_model.MODEL_COSTS == "model"


def test_one_copy_of_each_cost():
    """The slice policy, channels and the simulator read the model's constants, not copies."""
    from hccc.compiler.passes import channels, slicing
    from hccc.commands import sim as sim_cmd
    from hccc.runtime import sim_model
    assert slicing.UNIT_SECONDS is kc.UNIT_SECONDS and slicing.BLOCK_BYTES_PER_SECOND is kc.BLOCK_BYTES_PER_SECOND
    assert slicing.COPY_UNIT_SECONDS is kc.COPY_UNIT_SECONDS and slicing.LL_UNIT_SECONDS is kc.LL_UNIT_SECONDS
    assert slicing.LL_DATA_FRACTION is kc.LL_DATA_FRACTION
    assert channels.DEFAULT_BLOCK_GBPS is kc.SIM_BLOCK_GBPS and sim_model.DEFAULT_BLOCK_GBPS is kc.SIM_BLOCK_GBPS
    assert channels.block_gbps_at is kc.block_gbps_at and sim_model.block_gbps_at is kc.block_gbps_at
    assert sim_cmd.DEFAULT_BLOCK_GBPS is kc.SIM_BLOCK_GBPS


def test_launch_constant_is_the_fifth_runs_calibration():
    model = _script("kernel_model")
    runs = model.load_recorded()
    row = next(r for r in runs["fifth"]["rows"] if (r["program"], r["bytes"]) == model.LAUNCH_ROW)
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / "direct_allgather_8.rccl")
    t = model.predict(ir, row["bytes"], model.run_costs(runs["fifth"], runs), kernels="v4", sms=132,
                      slice_costs=model.V4_SLICE_COSTS["simple"])
    per_block = (row["us"] * 1e-6 - t.total) / t.blocks
    assert kc.LAUNCH_SECONDS_PER_BLOCK == pytest.approx(per_block, rel=0.01)


# ----------------------------------------------------------------------------- unit costs
@given(st.sampled_from(sorted(kc.COPY_GBS)), st.sampled_from(kc.COPY_UNIT_KIB))
def test_copy_rate_is_the_table_at_its_points(warps, kib):
    assert kc.V4_H200.copy_rate(kib * KiB, warps) == pytest.approx(
        kc.COPY_GBS[warps][kc.COPY_UNIT_KIB.index(kib)] * 1e9, rel=1e-12)


@given(st.integers(1, 32), st.integers(0, 4 << 20), st.integers(0, 4 << 20))
def test_a_unit_costs_more_with_more_bytes_and_fewer_warps(warps, a, b):
    c = kc.V4_H200
    lo, hi = sorted((a, b))
    assert 0 <= c.bytes_seconds(lo, warps) <= c.bytes_seconds(hi, warps)
    assert c.bytes_seconds(hi, min(32, warps * 2)) <= c.bytes_seconds(hi, warps) * (1 + 1e-12)
    assert kc.block_gbps_at(20.0, warps) <= 20.0 and kc.block_gbps_at(20.0, 16) == 20.0


def test_ll_unit_is_a_copy_units_fixed_cost_with_half_the_payload():
    c = kc.V4_H200
    s = 64 * KiB
    assert kt.unit_seconds(c, int(Op.SEND), s, 16, "ll") == pytest.approx(
        c.fixed_seconds("COPY", 16) + c.bytes_seconds(2 * s, 16), rel=1e-12)
    # a reduction loads twice what it moves
    assert kt.unit_seconds(c, int(Op.RECV_REDUCE_COPY), s, 16) == pytest.approx(
        c.fixed_seconds("RECV_REDUCE_COPY", 16) + c.bytes_seconds(2 * s, 16), rel=1e-12)


# ----------------------------------------------------------------------------- composition
def _flat(c_copy, c_send, c_recv, hop_us, per_block=0.0):
    """Costs with no bytes term to speak of (a flat rate of 1e9 GB/s) and the given fixed costs."""
    return kc.KernelCosts(unit_us={"COPY": (c_copy,), "SEND": (c_send,), "RECV": (c_recv,),
                                   "RECV_REDUCE_COPY": (c_recv,)},
                          warps=(16,), flag_round_trip_us=2 * hop_us, launch_per_block_s=per_block,
                          hbm_bytes_per_s=1e30, flat_gbs=1e9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.floats(0.1, 5), st.floats(0.1, 5), st.floats(0.1, 5), st.floats(0.0, 3),
       st.sampled_from([0, 1, 2, 3]))
def test_two_ranks_send_and_receive_hand_derived(m, c_copy, c_send, c_recv, hop, nslots):
    """Ring AllGather 2: on each rank a COPY then a SEND on one block, a RECV on another. By hand,
    send i and receive i end at (us, h a hop, w slots a connection, 0: no limit):
    S_i = max(S_(i-1), R_(i-w) + h) + c_send (S_(-1) = m c_copy), R_i = max(S_i + h, R_(i-1)) + c_recv;
    in closed form without a limit m c_copy + h + max(m c_send + c_recv, c_send + m c_recv), and with
    one slot m c_copy + m (c_send + c_recv + 2 h) - h."""
    ir = build_program(gen.ring_allgather(2))
    costs = _flat(c_copy, c_send, c_recv, hop, per_block=1e-6)
    n = 2 * 16 * m                           # 2 chunks of m 16-byte slices
    t = kt.program_time(ir, n, costs, slice_bytes=16, warps=16, nslots=nslots, direct=False)
    assert t.micro_batches == m and t.blocks == 4 and t.launch == pytest.approx(4e-6)
    s_prev, R = m * c_copy, []
    for i in range(m):
        s_prev = max(s_prev, R[i - nslots] + hop if nslots and i >= nslots else 0.0) + c_send
        R.append(max(s_prev + hop, R[-1] if R else 0.0) + c_recv)
    assert t.path * 1e6 == pytest.approx(R[-1], rel=1e-9)
    if nslots == 0 or m <= nslots:
        assert R[-1] == pytest.approx(m * c_copy + hop + max(m * c_send + c_recv, c_send + m * c_recv), rel=1e-12)
    if nslots == 1:
        assert R[-1] == pytest.approx(m * c_copy + m * (c_send + c_recv + 2 * hop) - hop, rel=1e-12)


def _oracle_path(program, nbytes: int, m: int, nslots: int, costs, groups=None, proto: str = "simple") -> float:
    """The longest path over units (seconds), built from the program's own columns in plain Python:
    a block's primitives in ``seq`` order, each over its micro-batches; dependencies and messages
    micro-batch by micro-batch, one hop each; a connection's message k + nslots after the receive
    of its message k, one hop. Relaxed to a fixed point (the graph is acyclic). ``groups``: lists
    of rows that run as one unit a micro-batch (an N-source unit: its node is its first row's,
    charged as one unit of that many sources); ``proto``: the units' protocol."""
    from hccc.runtime.kernel_traffic import prim_bytes
    p = program.prims
    n = len(p["rank"])
    k = max(1, int(getattr(program, "nchannels", 1) or 1))
    nbytes_unit = prim_bytes(program, nbytes, 4).astype(float) / m / k
    owner = {i: i for i in range(n)}
    sources = {i: 1 for i in range(n)}
    for rows in groups or []:
        for i in rows:
            owner[i] = rows[0]
        sources[rows[0]] = len(rows)
    cost = [kt.unit_seconds(costs, int(p["op"][i]), nbytes_unit[i], 16, proto, sources=sources[i]) for i in range(n)]
    hop = costs.flag_round_trip_us / 2 * 1e-6
    preds: dict = {}

    def edge(a, b, w):
        a, b = (owner[a[0]], a[1]), (owner[b[0]], b[1])
        preds.setdefault(b, []).append((a, w))
    blocks: dict = {}
    for i in range(n):
        blocks.setdefault((int(p["rank"][i]), int(p["tb"][i])), []).append(i)
    for prims in blocks.values():
        prims.sort(key=lambda i: int(p["seq"][i]))
        for a, b in zip(prims, prims[1:]):
            if owner[a] != owner[b]:
                edge((a, m - 1), (b, 0), 0.0)
    for i in range(n):
        for j in range(1, m):
            edge((i, j - 1), (i, j), 0.0)
    for d, on in zip(program.dep_prim.tolist(), program.dep_on.tolist()):
        for j in range(m):
            edge((on, j), (d, j), hop)
    sends: dict = {}
    recvs: dict = {}
    for i in range(n):
        o = Op(int(p["op"][i]))
        if o.sends:
            sends.setdefault((int(p["rank"][i]), int(p["send_peer"][i]), int(p["channel"][i])), []).append(i)
        if o.receives:
            recvs.setdefault((int(p["recv_peer"][i]), int(p["rank"][i]), int(p["channel"][i])), []).append(i)
    for key, ss in sends.items():
        rr = recvs.get(key, [])
        ss = sorted(ss, key=lambda i: (int(p["tb"][i]), int(p["seq"][i])))
        rr = sorted(rr, key=lambda i: (int(p["tb"][i]), int(p["seq"][i])))
        msgs_s = [(s, j) for s in ss for j in range(m)]
        msgs_r = [(r, j) for r in rr for j in range(m)]
        for s, r in zip(ss, rr):
            for j in range(m):
                edge((s, j), (r, j), hop)
        if nslots:
            for q in range(len(msgs_r)):
                if q + nslots < len(msgs_s):
                    edge(msgs_r[q], msgs_s[q + nslots], hop)
    finish: dict = {}

    def end(u):
        if u not in finish:
            start = max((end(a) + w for a, w in preds.get(u, [])), default=0.0)
            finish[u] = start + cost[u[0]]
        return finish[u]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    return max(end((owner[i], j)) for i in range(n) for j in range(m))



def test_ring_of_three_against_the_oracle():
    """Ring AllGather 3 (a dependency chain around the ring) at 1, 4 and 12 micro-batches, with
    slots to spare and with one or two a connection, against the plain-Python longest path."""
    ir = build_program(gen.ring_allgather(3))
    costs = _flat(0.3, 1.1, 0.7, 0.4)
    for m in (1, 4, 12):
        n = 3 * 64 * m
        for nslots in (0, 1, 2, 8):
            t = kt.program_time(ir, n, costs, slice_bytes=64, warps=16, nslots=nslots, direct=False)
            assert t.micro_batches == m
            assert t.path == pytest.approx(_oracle_path(ir, n, m, nslots, costs), rel=1e-12), (m, nslots)


@settings(max_examples=25, deadline=None)
@given(valid_programs(max_ranks=4), st.integers(1, 5), st.sampled_from([0, 1, 2, 8]))
def test_random_programs_against_the_oracle(alg, m, nslots):
    """Random valid programs (every family, up to 4 ranks), 1-5 micro-batches, no slot limit or
    1, 2 or 8 slots a connection: the model's longest path is the plain-Python oracle's."""
    ir = build_program(alg)
    costs = kc.V4_H200
    n = ir.nchunks * 16 * m
    try:
        t = kt.program_time(ir, n, costs, slice_bytes=16, warps=16, nslots=nslots, direct=False)
    except ValueError as e:                  # too few slots for the program's order: the oracle agrees
        assert "cycle" in str(e)
        with pytest.raises(RecursionError):
            _oracle_path(ir, n, m, nslots, costs)
        return
    assert t.path == pytest.approx(_oracle_path(ir, n, m, nslots, costs), rel=1e-12)
    assert t.total >= t.launch + max(t.path, t.hbm) * (1 - 1e-12)


@pytest.mark.parametrize("n", [3, 5])
def test_n_source_units_against_the_oracle(n):
    """The one-shot AllReduce, whose receives the GPU kernels run as one N-source unit a
    micro-batch under LL: the model's longest path is the plain-Python oracle's with each rank's
    receives (the RECV_REDUCE_COPY rows of its block, written out here) one unit; at one
    micro-batch, by hand, a copy, a hop, a send, a hop and the unit (each at a COPY unit's fixed
    cost under LL). Under Simple, and in the table mode's generic kernels, the GPU kernels run the
    rows one by one, and so does the model: the oracle without groups."""
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    ir = one_shot_allreduce(n)
    p = ir.prims
    groups = [[i for i in range(ir.nprims) if int(p["rank"][i]) == r and int(p["op"][i]) == int(Op.RECV_REDUCE_COPY)]
              for r in range(n)]
    costs = _flat(0.3, 1.1, 0.7, 0.4)
    for m in (1, 4, 12):
        nb = n * 16 * m
        for nslots in (0, 1, 2, 8):
            t = kt.program_time(ir, nb, costs, slice_bytes=16, warps=16, nslots=nslots, direct=False, proto="ll")
            assert t.micro_batches == m
            assert t.path == pytest.approx(_oracle_path(ir, nb, m, nslots, costs, groups, "ll"), rel=1e-12), (m, nslots)
            if m == 1:
                assert t.path * 1e6 == pytest.approx(0.3 + 0.4 + 0.3 + 0.4 + 0.3, rel=1e-9)
                assert t.units == 3 and t.hops == 2
            for proto, table in (("simple", False), ("ll", True)):
                r = kt.program_time(ir, nb, costs, slice_bytes=16, warps=16, nslots=nslots, direct=False,
                                    proto=proto, table=table)
                assert r.path == pytest.approx(_oracle_path(ir, nb, m, nslots, costs, None, proto), rel=1e-12), \
                    (proto, table, m, nslots)
                if m == 1:
                    assert r.units == 2 + n - 1, (proto, table)
    # the unit loads its n - 1 regions and its source: n reads a byte, where a row loads 2
    c = kc.V4_H200
    one = kt.unit_seconds(c, int(Op.RECV_REDUCE_COPY), 4096, 16)
    many = kt.unit_seconds(c, int(Op.RECV_REDUCE_COPY), 4096, 16, sources=n - 1)
    assert many - c.fixed_seconds("RECV_REDUCE_COPY", 16) == pytest.approx(c.bytes_seconds(4096 * n, 16))
    assert one - c.fixed_seconds("RECV_REDUCE_COPY", 16) == pytest.approx(c.bytes_seconds(4096 * 2, 16))


def test_more_slots_never_slow_a_program():
    ir = build_program(gen.ring_allreduce(4))
    prev = math.inf
    for nslots in (1, 2, 4, 8, 0):
        t = kt.program_time(ir, 4 * 16 * 10, kc.V4_H200, slice_bytes=16, warps=16, nslots=nslots, direct=False).path
        assert t <= prev * (1 + 1e-12)
        prev = t


# ----------------------------------------------------------------------------- the benchmark
@pytest.fixture(scope="module")
def recorded_rows():
    return _script("kernel_model").recorded()


def test_recorded_json_schema(recorded_rows, capsys, monkeypatch):
    model = _script("kernel_model")
    monkeypatch.setattr(model, "recorded", lambda: recorded_rows)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert model.main(["--recorded", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) == {"rows"}
    total = sum(len(r["rows"]) for r in _runs().values())
    assert len(d["rows"]) == total
    for r in d["rows"]:
        assert {"run", "program", "bytes", "measured_us", "predicted_us", "verdict"} <= set(r)
        assert isinstance(r["bytes"], int) and r["measured_us"] > 0
        assert r["predicted_us"] is None or r["predicted_us"] > 0


def test_every_recorded_row_is_explained_or_named(recorded_rows):
    """Within 30 %, or unexplained with a hypothesis; a row's verdict follows its ratio both ways;
    every hypothesis the benchmark holds names a row it does not explain (none stale)."""
    model = _script("kernel_model")
    used = set()
    for r in recorded_rows:
        if r["verdict"] == "not predicted":
            assert r["predicted_us"] is None and r["hypothesis"]
            continue
        ratio = r["predicted_us"] / r["measured_us"]
        if r["verdict"] == "calibration":
            assert (r["program"], r["bytes"]) == model.LAUNCH_ROW and ratio == pytest.approx(1, abs=0.01)
        elif r["verdict"] == "explained":
            assert abs(ratio - 1) <= model.EXPLAINED_WITHIN + 1e-3
        else:
            assert r["verdict"] == "unexplained" and abs(ratio - 1) > model.EXPLAINED_WITHIN - 1e-3
            assert r["hypothesis"] and r["hypothesis"] != "none recorded"
            used.add(r["hypothesis"])
    assert used == set(model.HYPOTHESES.values())
    assert sum(r["verdict"] == "calibration" for r in recorded_rows) == len(_runs())


def test_predict_prints_the_next_runs_targets(capsys, monkeypatch):
    model = _script("kernel_model")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert model.main(["--predict", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["predictions"]
    whats = [r["what"] for r in d]
    assert whats[0].startswith("per hop") and any("4 KiB" in w for w in whats)
    assert any("256 MiB" in w for w in whats) and any("4x8" in w for w in whats)
    from hccc.compiler.backend import abi
    from hccc.builtin_catalog import SMALL_BYTES
    cross = {r["what"].split()[0]: r for r in d if r["predicted_us"] is None}
    assert cross["LL"]["in_force_bytes"] == abi.LL_AUTO_MAX_BYTES
    assert cross["recursive"]["in_force_bytes"] == SMALL_BYTES
    from hccc.compiler.pipeline import load_program
    ar = load_program(model.ALGORITHMS["ring_allreduce_8"])
    ag = load_program(model.ALGORITHMS["ring_allgather_8"])
    n = cross["LL"]["predicted_bytes"]
    assert n & (n - 1) == 0 and n >= 4 * KiB        # a power of two at which LL wins, and not at twice it
    assert n == kt.ll_ahead_up_to([ar, ag], kc.V4_H200) == abi.LL_AUTO_MAX_BYTES
    for r in d:
        assert r["target"]
        if r["predicted_us"] is None:
            continue
        assert r["predicted_us"] > 0
        if "of_bound" in r:
            assert 0 < r["of_bound"] <= 1 and r["hbm_bound_us"] <= r["predicted_us"]
    hop = next(r for r in d if r["what"].startswith("per hop"))
    assert hop["predicted_us"] == pytest.approx((kc.FLAG_ROUND_TRIP_US / 2 + kc.UNIT_US["RECV"][-1]), rel=1e-6)


def test_a_graph_past_the_bound_is_refused(monkeypatch):
    ir = build_program(gen.ring_allgather(3))
    monkeypatch.setattr(kt, "MAX_UNITS", 15 * 5)         # 15 primitives, 5 micro-batches fit
    kt.program_time(ir, 3 * 16 * 5, kc.V4_H200, slice_bytes=16, warps=16)
    with pytest.raises(ValueError, match=r"ring_allgather: 15 primitives x 6 micro-batches = 90 units"):
        kt.program_time(ir, 3 * 16 * 6, kc.V4_H200, slice_bytes=16, warps=16)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_one_rank_per_gpu_launches_the_busiest_ranks_blocks_and_shares_the_hbm(n):
    """``one_gpu=False``: the launch is the most blocks one rank has (its ``ntbs``), the HBM bound
    one rank's share; the path is the same program's."""
    ir = build_program(gen.direct_allreduce(n))
    c = kc.V4_H200
    one = kt.program_time(ir, 1 << 20, c, slice_bytes=4096, warps=16)
    per = kt.program_time(ir, 1 << 20, c, slice_bytes=4096, warps=16, one_gpu=False)
    assert one.launch == pytest.approx(c.launch_seconds(int(ir.ntbs.sum())))
    assert per.launch == pytest.approx(c.launch_seconds(int(ir.ntbs.max())))
    assert per.hbm == pytest.approx(one.hbm / n) and per.path == one.path


# ----------------------------------------------------------------------------- bytes in flight
def _rendered_loads() -> dict[str, int]:
    """HCCC_LOADS, HCCC_LOADS_REDUCE, HCCC_LOADS_SCALE, HCCC_ASYNC_VECTORS, HCCC_ASYNC_THREADS as the
    emitted hccc_prims.h defines them."""
    from hccc.compiler.backend import codegen
    text = codegen._template_env().get_template("common/hccc_prims.h.j2").render(
        version="t", nslots=8, dtypes=codegen.DTYPES, ops=codegen.REDOPS)
    got = dict(re.findall(r"^#define (HCCC_(?:LOADS|LOADS_REDUCE|LOADS_SCALE|ASYNC_VECTORS|ASYNC_THREADS)) (\d+)$",
                          text, flags=re.M))
    assert len(got) == 5, got
    return {k: int(v) for k, v in got.items()}


@given(st.integers(2, 32), st.booleans())
def test_bytes_in_flight_count_the_emitted_engines_vectors(warps, async_loads):
    """Every warp but the sync warp, 32 threads, the header's vectors a source (and its shared-memory
    ones where the buffer holds every data thread), 16 B a vector."""
    d = _rendered_loads()
    data_threads = (warps - 1) * 32
    extra = async_loads and data_threads <= d["HCCC_ASYNC_THREADS"]
    copy = d["HCCC_LOADS"] + (d["HCCC_ASYNC_VECTORS"] if extra else 0)
    red = d["HCCC_LOADS_REDUCE"] + (d["HCCC_ASYNC_VECTORS"] // 2 if extra else 0)
    kw = dict(async_loads=async_loads)
    assert kc.block_bytes_in_flight(warps, **kw) == data_threads * copy * 16
    assert kc.block_bytes_in_flight(warps, True, **kw) == data_threads * red * 2 * 16
    assert kc.block_bytes_per_round(warps, **kw) == data_threads * copy * 16
    assert kc.block_bytes_per_round(warps, True, **kw) == data_threads * red * 16
    assert kc.block_bytes_in_flight(warps, **kw) >= kc.block_bytes_in_flight(warps, async_loads=False)


def test_bytes_in_flight_hand_derived():
    """The issue's figures for the v4 engine: 16 warps move 60 KiB a round copying, 30 KiB reducing
    (60 KiB of loads); with two vectors a thread through shared memory 75 KiB and 37.5 KiB; 32
    warps' 992 data threads have no room in the buffer; a one-warp block's 31 data lanes one
    vector each."""
    v4 = dict(async_loads=False)
    assert kc.block_bytes_in_flight(16, **v4) == 60 * KiB and kc.block_bytes_per_round(16, **v4) == 60 * KiB
    assert kc.block_bytes_in_flight(16, True, **v4) == 60 * KiB and kc.block_bytes_per_round(16, True, **v4) == 30 * KiB
    assert kc.block_bytes_in_flight(16) == 75 * KiB and kc.block_bytes_per_round(16, True) == 75 * KiB // 2
    assert kc.block_bytes_in_flight(32) == kc.block_bytes_in_flight(32, **v4) == 31 * 32 * 8 * 16
    assert kc.block_bytes_in_flight(1) == 31 * 16 and kc.block_bytes_in_flight(1, True) == 2 * 31 * 16


def test_round_trip_is_the_fifth_runs_rate_at_the_v4_shape():
    """1.25 us: 61,440 B over the fifth run's 16-warp copy slope; the prediction at the v4 shape
    gives the measured rate back, and it grows with the bytes of a round."""
    u = _runs()["fifth"]["units"]
    t256, t512 = (k * KiB / (g * 1e9) for k, g in zip((256, 512), u["copy_gbs"]["16"][3:]))
    assert kc.LOAD_ROUND_TRIP_SECONDS == pytest.approx(61440 * (t512 - t256) / (256 * KiB), rel=1e-12)
    assert kc.LOAD_ROUND_TRIP_SECONDS == pytest.approx(1.25e-6, abs=0.01e-6)
    assert kc.predicted_block_bytes_per_second(61440) == pytest.approx(kc.BLOCK_BYTES_PER_SECOND, rel=1e-12)
    assert kc.predicted_block_bytes_per_second(76800) == pytest.approx(1.25 * kc.BLOCK_BYTES_PER_SECOND)


def test_async_threads_of_the_runtimes_modules():
    """HCCC_ASYNC_THREADS of a module: the emitted block's data threads, at most the buffer's 480."""
    from hccc.compiler.ir.engine_shape import ASYNC_THREADS, async_threads
    assert ASYNC_THREADS == _rendered_loads()["HCCC_ASYNC_THREADS"] == 480
    assert [async_threads(n, 32) for n in (32, 64, 96, 512, 1024)] == [0, 32, 64, 480, 480]
    assert async_threads(256, 64) == 192
    from hccc.runtime.gpu import translation_unit
    from hccc.runtime.platform import Instance
    for threads, want in ((512, 480), (32, 0)):
        man = {"nthreads": {"cuda": threads}, "ranks": [], "grid": {}}
        tu = translation_unit(man, Instance("float32", "sum"), [], "cuda", gate=False)
        assert f"#define HCCC_ASYNC_THREADS {want}\n" in tu


def test_bytes_in_flight_script(capsys):
    script = _script("bytes_in_flight")
    assert script.main(["--warps", "4,16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["engine"], r["warps"], r["moves"]) for r in rows] == [
        (e, w, m) for e in ("v4", "v5") for w in (4, 16) for m in ("copy", "reduce")]
    v4, v5 = rows[2], rows[6]
    assert v4["bytes_in_flight"] == 61440 and v5["bytes_in_flight"] == 76800 and rows[7]["bytes_per_round"] == 38400
    assert v4["predicted_gbs"] == round(kc.BLOCK_BYTES_PER_SECOND / 1e9, 1)
    assert script.main(["--warps", "16"]) == 0
    assert "a prediction" in capsys.readouterr().out
    for bad in ("x", "0", "33", ""):
        assert script.main(["--warps", bad]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: --warps") and "Traceback" not in err


# ----------------------------------------------------------------------------- thresholds the model sets
def test_proto_autos_switch_is_the_models_crossover():
    """``abi.LL_AUTO_MAX_BYTES`` is the largest power of two up to which the model puts LL ahead of
    Simple for the ring AllReduce and AllGather of 8 ranks (one rank a GPU, the launchers'
    slices, the measured units), recomputed here: LL ahead at it, behind at twice it."""
    from hccc.compiler.backend import abi
    progs = [build_program(gen.ring_allreduce(8)), build_program(gen.ring_allgather(8))]
    assert kt.ll_ahead_up_to(progs, kc.V4_H200) == abi.LL_AUTO_MAX_BYTES
    n = abi.LL_AUTO_MAX_BYTES
    for p in progs:
        assert kt.call_time(p, n, kc.V4_H200, "ll").total < kt.call_time(p, n, kc.V4_H200, "simple").total
    assert any(kt.call_time(p, 2 * n, kc.V4_H200, "ll").total >= kt.call_time(p, 2 * n, kc.V4_H200, "simple").total
               for p in progs)


def test_ll_ahead_up_to_stops_at_the_first_size_ll_is_behind():
    """The crossover of hand-made times: LL ahead at 4 and 8 KiB, behind at 16, ahead again at 32
    (ignored: the switch is one size), and none where LL is behind at the smallest."""
    class Fake:
        pass

    def fake_time(p, n, costs, proto):
        t = Fake()
        ahead = {4096: True, 8192: True, 16384: False, 32768: True}[n]
        t.total = (1.0 if ahead else 3.0) if proto == "ll" else 2.0
        return t
    import pytest as _pytest
    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(kt, "call_time", fake_time)
        assert kt.ll_ahead_up_to([None], kc.V4_H200, (4096, 8192, 16384, 32768)) == 8192
        assert kt.ll_ahead_up_to([None], kc.V4_H200, (16384, 32768)) == 0
