"""SendRecv (MSCCL++'s ``sendrecv``, nccl-tests' sendrecv_perf): every rank sends its part to the
rank ``shift`` after it and receives the part of the rank ``shift`` before it. Its generators (one
direct hop, or forwarded along a ring through scratch) against a numpy oracle written here; the
``.rccl`` header's ``Shift`` and its located refusals; ``hccc check`` refusing wrong programs at
their place; ``hccc run`` on the kernels (CPU emulation, in and out of place) and ``hccc sim``
(nccl-tests' busbw: one part over the time); the MSCCL XML export refusing it; MSCCL++ plans: an
exported program read back with its shift, run by the independent plan interpreter, and a plan
whose ranks send to peers of different shifts refused, located."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mscclpp_interp import check_plan
from hccc.cli import main
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import Collective
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.interop.mscclpp_export import export_plan
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.runtime import reference
from hccc.testing import valid_programs
from hccc.util.diagnostics import CompileError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ring_sendrecv_8.rccl"
CLUSTERS = ROOT / "examples" / "clusters"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def sendrecv_oracle(inputs: list[np.ndarray], shift: int) -> list[np.ndarray]:
    """Rank ``r`` ends with rank ``(r - shift) % n``'s input."""
    n = len(inputs)
    return [inputs[(r - shift) % n] for r in range(n)]


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _computes_sendrecv(alg, count: int, inplace: bool) -> None:
    ir = build_program(alg, chunk_bytes=64)
    ins = reference.inputs_for(ir, count, "int32", seed=count)
    got = reference.execute(ir, [x.copy() for x in ins], op="sum", inplace=inplace)
    for r, (g, w) in enumerate(zip(got, sendrecv_oracle(ins, alg.header.root))):
        np.testing.assert_array_equal(g, w, err_msg=f"rank {r}")


# ------------------------------------------------------------------------------ generators
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 7), k=st.integers(1, 3), data=st.data())
def test_every_generator_is_a_sendrecv_of_its_shift(n, k, data):
    shift = data.draw(st.integers(0, n - 1))
    order = data.draw(st.permutations(list(range(n))))
    for alg in (gen.direct_sendrecv(n, shift, chunks_per_rank=k),
                gen.ring_sendrecv(n, shift, order, chunks_per_rank=k)):
        assert alg.header.collective is Collective.SENDRECV and alg.header.root == shift
        verify(alg)
        _computes_sendrecv(alg, 3 * n * k + n, inplace=data.draw(st.booleans()))
    # along the identity ring a part makes exactly ``shift`` hops, one a step
    ring = gen.ring_sendrecv(n, shift, chunks_per_rank=k)
    assert len(ring) == n * shift * k and (len(ring) == 0 or int(ring.step.max()) == shift - 1)


def test_the_example_is_the_text_generator_of_the_ring():
    alg = parse_rccl(EXAMPLE.read_text())
    want = gen.ring_sendrecv(8, 2, chunks_per_rank=2, name="ring_sendrecv_8")
    assert alg.header.root == 2 and sorted(alg.rows()) == sorted(want.rows())


def test_hccc_testing_draws_every_sendrecv_family_with_shifts():
    seen = set()

    @settings(max_examples=60, deadline=None)
    @given(valid_programs("sendrecv", max_ranks=5, min_ranks=2))
    def draw(alg):
        verify(alg)
        seen.add((alg.header.name.split("_")[0], alg.header.root))

    draw()
    assert {f for f, _ in seen} == {"ring", "direct"} and len({s for _, s in seen}) >= 3


@pytest.mark.parametrize("call,why", [
    (lambda: gen.direct_sendrecv(4, 4), "shift 4 is out of range for 4 ranks"),
    (lambda: gen.ring_sendrecv(4, -1), "shift -1 is out of range"),
    (lambda: gen.ring_sendrecv(3, 1, [0, 1, 1]), "permutation"),
    (lambda: gen.direct_sendrecv(2, 1, chunks_per_rank=0), "chunks_per_rank"),
])
def test_generators_refuse_bad_arguments(call, why):
    with pytest.raises(ValueError, match=why):
        call()


def test_verify_refuses_a_shift_out_of_range():
    from dataclasses import replace
    from hccc.compiler.passes.verify import VerifyError
    alg = gen.direct_sendrecv(4, 1)
    bad = type(alg)(replace(alg.header, root=4), alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.site,
                    alg.sites, alg.loop_values)
    with pytest.raises(VerifyError, match=r"Shift 4 is out of range \(nRanks=4: 0..3\)"):
        verify(bad)


def test_a_renaming_that_is_no_rotation_is_refused():
    from hccc.testing import relabel_ranks
    alg = gen.direct_sendrecv(4, 1)
    _computes_sendrecv(relabel_ranks(alg, [2, 3, 0, 1]), 8, False)
    with pytest.raises(ValueError, match="rotation"):
        relabel_ranks(alg, [1, 0, 2, 3])


# ------------------------------------------------------------------------------ the header
def test_shift_defaults_to_one_and_the_body_reads_it():
    alg = parse_rccl('def ResCCLAlgo(nRanks=3, OpType="Sendrecv"):\n'
                     '    for r in range(0, nRanks):\n        transfer(r, (r + Shift) % nRanks, 0, r, recv)\n')
    assert alg.header.root == 1
    verify(alg)
    two = parse_rccl('def ResCCLAlgo(nRanks=3, OpType="SendRecv", Shift=2):\n'
                     '    for r in range(0, nRanks):\n        transfer(r, (r + Shift) % nRanks, 0, r, recv)\n')
    assert two.header.root == 2 and sorted(two.dst.tolist()) == [0, 1, 2]
    verify(two)


@pytest.mark.parametrize("head,value,what", [
    ('nRanks=4, OpType="Allgather", Shift=1', "1)", "header parameter 'Shift' applies to SendRecv, not Allgather"),
    ('nRanks=4, OpType="Sendrecv", Root=1', "1)", "header parameter 'Root' applies to Broadcast"),
    ('nRanks=4, OpType="Sendrecv", Shift=4', "4)", "Shift 4 is out of range (nRanks=4: 0..3)"),
    ('nRanks=4, OpType="Sendrecv", Shift=-1', "-1)", "error: "),
])
def test_header_refusals_are_located(tmp_path, capsys, head, value, what):
    """Each refusal points at the parameter's value."""
    f = tmp_path / "bad.rccl"
    line = f"def ResCCLAlgo({head}):"
    f.write_text(line + "\n    pass\n")
    rc, out, err = run_cli(capsys, "check", f)
    assert rc == 1 and "Traceback" not in err
    assert f"bad.rccl:1:{line.rindex(value) + 1}: error: " in err and what in err, err


@pytest.mark.parametrize("old,new,what", [
    # every part goes one hop short of its peer
    ("range(0, Shift)", "range(0, Shift - 1)", "does not hold chunk"),
    # a relay forwards a part in the step it receives it
    ("(a + h + 1) % N, h,", "(a + h + 1) % N, 0,", "at step 0"),
])
def test_check_refuses_a_wrong_sendrecv_at_its_place(tmp_path, capsys, old, new, what):
    text = EXAMPLE.read_text()
    assert old in text
    bad = tmp_path / "bad.rccl"
    bad.write_text(text.replace(old, new))
    rc, out, err = run_cli(capsys, "check", bad)
    assert rc == 1 and "Traceback" not in err and "bad.rccl:" in err and what in err, err
    rc, out, err = run_cli(capsys, "check", EXAMPLE)
    assert rc == 0 and "valid Sendrecv on 8 ranks" in out, out


# ------------------------------------------------------------------------------ run, sim, export
@needs_gxx
def test_run_on_the_kernels_has_no_wrong_element_and_nccl_tests_busbw(capsys, monkeypatch):
    """The size is every rank's part (the full buffer); busbw is one part over the time,
    nccl-tests' sendrecv busbw; in and out of place, no wrong element."""
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")
    rc, out, err = run_cli(capsys, "run", EXAMPLE, "--sizes", "0,64,4096,65536", "-n", "1", "-w", "0",
                           "--chunk-size", "256", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["collective"] == "sendrecv" and doc["redop"] == "none" and doc["ok"]
    assert doc["root"] == -1 and doc["shift"] == 2       # nccl-tests prints no root for it
    assert {(r["bytes"], r["inplace"]) for r in doc["results"]} == \
        {(b, p) for b in (0, 64, 4096, 65536) for p in (False, True)}
    for r in doc["results"]:
        assert r["wrong"] == 0 and r["stuck"] is None
        if r["bytes"]:
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 8)


def test_sim_reports_sendrecv_bandwidths(capsys):
    rc, out, err = run_cli(capsys, "sim", EXAMPLE, "--topology", CLUSTERS / "a100_topo1.topo", "--sizes", "1M,64M",
                           "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["collective"] == "sendrecv" and doc["redop"] == "none" and doc["shift"] == 2
    for r in doc["results"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 8) and r["time_us"] > 0
        assert 0 < r["cut_bound_us"] <= r["time_us"]      # the cluster's cut bound for the shift


def test_msccl_xml_refuses_it_with_the_reason(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "xml", EXAMPLE, "-o", tmp_path / "x.xml")
    assert rc == 1 and "MSCCL XML has no SendRecv collective" in err and "Traceback" not in err
    assert not (tmp_path / "x.xml").exists()


# ------------------------------------------------------------------------------ MSCCL++ plans
@settings(max_examples=12, deadline=None)
@given(n=st.integers(2, 6), k=st.integers(1, 2), inplace=st.booleans(), data=st.data())
def test_an_exported_plan_reads_back_with_its_shift_and_runs_right(n, k, inplace, data):
    """The plan does not write the shift: the import reads it from the data flow; the independent
    interpreter runs the plan against the oracle of that shift, calls in a row."""
    shift = data.draw(st.integers(0, n - 1))
    order = data.draw(st.permutations(list(range(n))))
    ir = build_program(gen.ring_sendrecv(n, shift, order, chunks_per_rank=k), chunk_bytes=64)
    plan = export_plan(ir, inplace=inplace)
    text = json.dumps(plan)
    assert plan["collective"] == "sendrecv" and "shift" not in plan
    back = import_plan_text(text, "sr.json")
    assert back.collective == "sendrecv" and back.root == shift
    check_plan(plan, 2, runs=2, shift=shift)


def _direct_plan(n: int, peers: list[int]) -> dict:
    """A one-block plan in the DSL's send_recv style: rank r puts its input into rank peers[r]'s
    output with a port channel, announcing it; rank r waits on the rank that sends to it (over the
    same channel where the two are one peer)."""
    senders = {p: r for r, p in enumerate(peers)}
    gpus = []
    for r in range(n):
        to, frm = peers[r], senders[r]
        ends = [to] if to == frm else [to, frm]
        gpus.append({
            "id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
            "channels": [{"channel_type": "port", "connected_to": ends}],
            "remote_buffers": [{"rank": to, "type": "o", "access_channel_types": ["port"]}],
            "semaphores": [],
            "threadblocks": [{"id": 0, "ops": [
                {"name": "pws", "src_buff": [{"type": "i", "index": 0, "size": 1}],
                 "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}], "channel_ids": [0],
                 "channel_type": "port"},
                {"name": "wait", "channel_ids": [len(ends) - 1], "channel_type": "port"}],
                "channels": [{"channel_type": "port", "channel_ids": list(range(len(ends)))}],
                "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0]}]}]})
    return {"name": "sr", "collective": "sendrecv", "protocol": "Simple", "inplace": False,
            "reuse_resources": False, "gpus": gpus, "num_threads_per_block": 1024,
            "use_double_scratch_buffer": False, "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": 2 ** 64 - 1}


@pytest.mark.parametrize("n,shift", [(4, 1), (4, 3), (6, 2)])
def test_a_hand_written_plan_of_any_shift_is_read_with_it(n, shift):
    plan = _direct_plan(n, [(r + shift) % n for r in range(n)])
    ir = import_plan_text(json.dumps(plan), "sr.json")
    assert ir.root == shift
    check_plan(plan, 1, runs=2, shift=shift)


def test_a_plan_whose_ranks_send_to_peers_of_different_shifts_is_refused_located():
    """A permutation that is no shift (ranks 0 and 1 swap, 2 and 3 swap) is no SendRecv of hccc's:
    refused with the rank whose output misses its part."""
    plan = _direct_plan(4, [1, 0, 3, 2])
    with pytest.raises(CompileError) as exc:
        import_plan_text(json.dumps(plan, indent=1), "perm.json")
    diag = exc.value.diagnostics[0]
    assert diag.location.source.name == "perm.json" and diag.location.line > 1
    assert "does not implement sendrecv" in diag.message and "must hold chunk" in diag.message, diag.message


def test_a_plans_message_sizes_are_a_ranks_part_and_hccc_serves_every_ranks():
    """MSCCL++ sizes a SendRecv message by one rank's buffer; hccc's size (a catalog's band, the
    full buffer) is every rank's part: the imported band is the plan's times the ranks."""
    plan = _direct_plan(4, [1, 2, 3, 0])
    plan["min_message_size"], plan["max_message_size"] = 1024, 8192
    ir = import_plan_text(json.dumps(plan), "sr.json")
    assert (ir.origin.min_bytes, ir.origin.max_bytes) == (4 * 1024, 4 * 8192)


@pytest.mark.slow   # about a minute: four rank processes building their kernels, UCX over TCP
def test_mscclpps_two_node_sendrecv_runs_across_two_emulated_nodes(tmp_path):
    """MSCCL++'s send_recv at 2 nodes x 2 GPUs (port channels between the nodes) through the
    Communicator, one process a rank, ranks 0-1 on one emulated node and 2-3 on another (UCX over
    TCP), three calls in a row out of place (the plan's placement): 0 wrong elements."""
    from communicator_calls import calls_for, check, require_torch
    from net_ranks import TCP, have_ucx
    from rank_pool import RankPool
    if not have_ucx():
        pytest.skip("UCX (libucx-dev) not installed")
    require_torch()
    path = ROOT / "tests" / "mscclpp_corpus" / "multi_node__send_recv__nodes2_g2_i1.json"
    ir = import_plan_text(path.read_text(), path.name)
    assert ir.collective == "sendrecv" and ir.root == 1 and ir.placements == (False,)
    from hccc.runtime.launcher import program_layout
    calls, want, count = calls_for(ir, 4 * 1000, "float32", seed=3)
    layout = program_layout(ir, count)
    calls = [[dict(c, out=layout[r][1]) for c in cs] for r, cs in enumerate(calls)]   # out of place
    pool = RankPool(4, tmp_path)
    try:
        replies = pool.run(ir.to_json(), 4, [cs * 3 for cs in calls], nodes=["a", "a", "b", "b"],
                           env=TCP, timeout=120)
    finally:
        pool.close()
    check(replies, want, "send_recv on two emulated nodes", 3)
