"""Thread-block groups (``tbg_info``) in MSCCL++ plans: the executor cuts an operation's range into
``tbg_size`` parts and block ``tb_id`` of the group moves its part; the import cuts every chunk into
parts (the least common multiple of the group sizes) so that each share is whole parts, proves the
plan at that granularity, and the independent interpreter (which cuts bytes as the executor does)
agrees. Also: the k-th pass of blocks through a barrier id meets the k-th of the others.

A group whose blocks synchronise per block (each block signals and waits on a channel of its own,
the case of MSCCL++'s executor test plan ``reduce_tbg``) is proven when every block reads what the
peer's same block wrote; when two operations of the group cut different ranges (a reduction chunk
by chunk after a copy of the chunks together), block ``b`` reads bytes another block of the peer
wrote: the import refuses it as a race naming the executor's lines, and the interpreter, with that
block slow (``lazy``), computes a wrong result. Packets carry their own flags: the same cut is no
race there."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runs import run_cli
from conftest import examples
from mscclpp_interp import InterpError, check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.runtime.reference import execute, expected_for, inputs_for
from mscclpp_plans import (NOP, grouped_copy_allgather, grouped_puts_allgather, grouped_quarters_allreduce,
                           grouped_reduce_allreduce, plan_direct_allgather, refused)


def _runs_right(ir, inplace=False):
    ins = inputs_for(ir, ir.nchunks * ir.nranks * 4, "float32", seed=3)
    outs = execute(ir, [x.copy() for x in ins], inplace=inplace)
    for r, (o, w) in enumerate(zip(outs, expected_for(ir, ins))):
        np.testing.assert_array_equal(o, w, err_msg=f"rank {r}")


@pytest.mark.parametrize("size", [2, 3])
def test_a_thread_block_group_is_proven_and_runs_right(size):
    plan = grouped_copy_allgather(size)
    for mult in (size, 2 * size):
        check_plan(plan, mult, seed=mult)
    ir = import_plan_text(json.dumps(plan), "tbg.json")
    assert ir.nchunks == 3 * size and ir.in_chunks == size         # chunks cut into `size` parts
    _runs_right(ir)


def test_a_group_missing_a_part_is_refused_and_wrong_in_the_interpreter():
    plan = grouped_copy_allgather(2)
    for g in plan["gpus"]:
        g["threadblocks"][2]["ops"][0] = NOP                      # part 1 of the copy never moves
    with pytest.raises(CompileError) as exc:
        import_plan_text(json.dumps(plan), "tbg.json")
    assert "does not implement allgather" in exc.value.diagnostics[0].message
    with pytest.raises(InterpError, match="wrong"):
        check_plan(plan, 2)


def test_mixed_group_sizes_cut_chunks_by_their_least_common_multiple():
    plan = grouped_copy_allgather(2)
    for g in plan["gpus"]:                                        # the puts of block 0 as a group of 3
        for op in g["threadblocks"][0]["ops"]:
            if op["name"] == "put":
                op["tbg_info"] = {"tb_id": 0, "tbg_size": 3}
    with pytest.raises(CompileError):                             # 2 of 3 parts never sent
        import_plan_text(json.dumps(plan), "tbg.json")
    plan = grouped_copy_allgather(2)
    plan["gpus"][0]["threadblocks"][1]["ops"][0]["tbg_info"] = {"tb_id": 0, "tbg_size": 6}
    with pytest.raises(CompileError) as exc:                      # rank 0 copies 1/6 + 1/2 of its chunk
        import_plan_text(json.dumps(plan), "tbg.json")
    assert "does not implement" in exc.value.diagnostics[0].message


@pytest.mark.parametrize("info", [{"tb_id": 2, "tbg_size": 2}, {"tb_id": 0}, {"tb_id": -1, "tbg_size": 2}, [0, 2],
                                  {"tb_id": 0, "tbg_size": 4096}])
def test_bad_group_info_is_a_located_error(info):
    plan = grouped_copy_allgather(2)
    plan["gpus"][1]["threadblocks"][1]["ops"][0]["tbg_info"] = info
    text = json.dumps(plan, indent=1)
    with pytest.raises(CompileError) as exc:
        import_plan_text(text, "tbg.json")
    d = exc.value.diagnostics[0]
    assert ("tbg" in d.message or "thread-block group" in d.message) and '"tbg_info"' in text.splitlines()[d.location.line - 1]


def test_the_kth_pass_through_a_barrier_meets_the_kth_of_the_others():
    plan = plan_direct_allgather()
    for g in plan["gpus"]:
        for tb in g["threadblocks"]:
            tb["ops"] = tb["ops"] + [NOP, copy.deepcopy(tb["ops"][-1])]    # the barrier, twice
    check_plan(plan, 2)
    import_plan_text(json.dumps(plan), "barriers.json")          # was a deadlock across passes


# MSCCL++'s own DSL plans (thread-block groups among them): tests/test_mscclpp_corpus.py


def test_a_groups_puts_are_announced_by_the_signal_after_its_barrier():
    plan = grouped_puts_allgather()
    check_plan(plan, 2)
    check_plan(plan, 4, seed=1)
    ir = import_plan_text(json.dumps(plan), "grouped_puts.json")      # was "puts ... without a signal"
    _runs_right(ir)
    # without the barrier between the put and the signal, nothing orders block 2's part before it
    bad = grouped_puts_allgather()
    for g in bad["gpus"]:
        for tb in g["threadblocks"]:
            tb["ops"] = [o for o in tb["ops"] if o.get("barrier_id") != 1]
    with pytest.raises(CompileError) as exc:
        import_plan_text(json.dumps(bad), "grouped_puts.json")
    assert "without a signal" in exc.value.diagnostics[0].message


# ---------------------------------------------------------------- per-block signals (reduce_tbg)
def _interp_runs(plan, size, mults):
    """For every block made slow in turn (and none), at each size: ``None`` when every run of the
    interpreter is right, else the first failure."""
    for mult in mults:
        for lazy in [None] + [(r, b) for r in range(2) for b in range(size)]:
            try:
                check_plan(plan, mult, seed=mult, lazy=lazy)
            except InterpError as e:
                return f"mult {mult}, lazy {lazy}: {e}"
    return None


@pytest.mark.parametrize("channel", ["memory", "port", "packets"])
@pytest.mark.parametrize("size", [2, 4])
def test_a_group_with_per_block_signals_over_like_ranges_is_proven_and_runs_right(channel, size):
    plan = grouped_reduce_allreduce(size, channel=channel)
    ir = import_plan_text(json.dumps(plan), "grouped_reduce.json")
    assert ir.in_chunks == 2 * size * size                        # chunks cut into `size` parts
    _runs_right(ir, inplace=True)
    # at sizes whose chunks are not a multiple of the parts too: the executor's cut by alignment units
    assert _interp_runs(plan, size, (1, 2, size, 3)) is None


@pytest.mark.parametrize("channel", ["memory", "port"])
@pytest.mark.parametrize("size,cuts", [(2, (1, 1)), (4, (1, 1, 1, 1)), (4, (2, 2)), (4, (1, 3))])
def test_a_group_with_per_block_signals_over_ranges_cut_apart_races(channel, size, cuts):
    """MSCCL++'s reduce_tbg (test/executor-tests/execution-plans at 1f5f065) in hccc's fixture: the
    copy of chunks [s, s + size) by the group, then the reduction chunk by chunk by the group."""
    plan = grouped_reduce_allreduce(size, cuts, channel)
    msg, line = refused(plan)
    assert "data race on rank" in msg and f"of {size})" in msg, msg
    assert "thread-block groups:" in msg and f"part 1 of {size} of chunks" in msg, msg
    for src in ("execution_plan.cc:541-545", "572-575", "621-627 (calcOffset)", "execution_kernel.hpp:83-99",
                "102-118 (handleWait)", "1f5f065"):
        assert src in msg, (src, msg)
    assert '"name"' in line                                       # located at an operation of the plan
    # the independent interpreter, one block slow, computes a wrong result: the race is real
    assert _interp_runs(plan, size, (size,)) is not None


@pytest.mark.parametrize("size,cuts", [(2, (1, 1)), (4, (1, 3))])
def test_packets_order_every_element_so_a_group_over_ranges_cut_apart_is_no_race(size, cuts):
    plan = grouped_reduce_allreduce(size, cuts, "packets")
    _runs_right(import_plan_text(json.dumps(plan), "grouped_reduce.json"), inplace=True)
    assert _interp_runs(plan, size, (1, size, 3)) is None


@settings(max_examples=examples(12), deadline=None)
@given(data=st.data())
def test_the_import_accepts_a_grouped_reduction_exactly_when_no_slow_block_breaks_it(data):
    """Random groups (2-4 blocks), cuts of the reduction and channels: the import's verdict is the
    interpreter's (which cuts bytes as the executor's loader does and runs every block slow in
    turn), at a size whose chunks are whole parts and at one whose chunks are not."""
    size = data.draw(st.integers(2, 4), label="size")
    cuts, left = [], size
    while left:
        k = data.draw(st.integers(1, left), label="run")
        cuts.append(k)
        left -= k
    channel = data.draw(st.sampled_from(["memory", "port", "packets"]), label="channel")
    plan = grouped_reduce_allreduce(size, tuple(cuts), channel)
    try:
        import_plan_text(json.dumps(plan), "grouped_reduce.json")
        accepted = True
    except CompileError as e:
        assert "data race" in e.diagnostics[0].message and "execution_plan.cc" in e.diagnostics[0].message
        accepted = False
    failure = _interp_runs(plan, size, (size, size + 1))
    assert accepted == (failure is None), failure


def test_a_group_over_chunks_its_size_does_not_divide_is_proven_only_at_sizes_of_whole_parts():
    """The executor's parts are whole alignment units: a group of 4 over 2 chunks and a group of 2
    over one chunk end their parts on the same unit only when a chunk is an even number of units.
    The import proves the plan at whole parts and says where the proof stops; the interpreter, one
    block slow, finds it wrong at 1, 3 and 5 units per chunk."""
    plan = grouped_quarters_allreduce()
    ir = import_plan_text(json.dumps(plan), "quarters.json")
    assert "proven at message sizes whose chunks are a multiple of 4 x the alignment" in ir.origin.note
    assert "execution_plan.cc:541-545" in ir.origin.note
    assert _interp_runs(plan, 4, (2, 4, 8)) is None
    for mult in (1, 3, 5):
        assert _interp_runs(plan, 4, (mult,)) is not None
    # a group over ranges its size divides is the executor's at every size: no note
    assert "note" not in import_plan_text(json.dumps(grouped_reduce_allreduce(2)), "g.json").stats


def test_hccc_check_says_where_a_groups_proof_stops_and_refuses_the_race_located(tmp_path):
    ok = tmp_path / "quarters.json"
    ok.write_text(json.dumps(grouped_quarters_allreduce(), indent=1))
    proc = run_cli("check", ok, cwd=tmp_path)
    assert proc.returncode == 0 and "note: thread-block groups: proven at message sizes whose chunks are a " \
        "multiple of 4 x the alignment" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("check", "--json", ok, cwd=tmp_path)
    assert "multiple of 4 x the alignment" in json.loads(proc.stdout)["note"]
    racy = tmp_path / "reduce_tbg.json"
    racy.write_text(json.dumps(grouped_reduce_allreduce(2, (1, 1)), indent=1))
    proc = run_cli("check", racy, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"{racy}:") and "error: the plan does not implement allreduce: data race" in proc.stderr
    assert "execution_plan.cc:541-545" in proc.stderr and "execution_kernel.hpp:83-99" in proc.stderr


def _copy_in_a_pipeline(unit_size, max_message_size):
    """The grouped reduction of 2 blocks, each block's copy of the peer's chunks in a pipeline."""
    plan = grouped_reduce_allreduce(2)
    plan["max_message_size"] = max_message_size
    for g in plan["gpus"]:
        for tb in g["threadblocks"]:
            tb["ops"][0] = {"name": "pipeline", "iter_context": {"unit_size": unit_size, "num_chunks": 2},
                            "ops": [tb["ops"][0], NOP]}
    return plan


def test_a_groups_operation_in_a_pipeline_of_several_iterations_is_refused():
    """The executor counts a pipeline's iterations over its whole chunks and cuts each from the
    block's part: past the part the 32-bit size wraps and the operation moves a whole unit beyond."""
    plan = _copy_in_a_pipeline(16, 1 << 40)
    msg, line = refused(plan)
    assert "thread-block group inside a pipeline of more than one iteration" in msg
    assert "execution_plan.cc:592-598" in msg and "execution_kernel.hpp:653-668" in msg and '"tbg_info"' in line
    with pytest.raises(InterpError, match="starts past the 32 bytes the block moves"):
        check_plan(plan, 2)                         # 2 chunks of 32 bytes, parts of 32, units of 16
    # a pipeline of one iteration at every size the plan serves is the copy itself
    one = _copy_in_a_pipeline(64, 128)              # chunks of at most 32 bytes, 2 of them
    _runs_right(import_plan_text(json.dumps(one), "one.json"), inplace=True)
    assert _interp_runs(one, 2, (1, 2)) is None
    assert "pipeline" in refused(_copy_in_a_pipeline(32, 128))[0]     # two iterations at 128 bytes


CORPUS = Path(__file__).resolve().parent / "mscclpp_corpus"


@pytest.mark.parametrize("name", ["single_node__allgather_tbg__default", "default_algos__allreduce_tbg2",
                                  "default_algos__reducescatter_tbg2", "multi_node__allgather_tbg__g4_n2_t2"])
def test_the_dsls_group_plans_hccc_accepts_are_right_with_every_block_slow(name):
    """MSCCL++'s DSL plans with thread-block groups (the corpus), each block slow in turn, at a size
    whose chunks are whole parts (F alignment units) and one whose chunks are not (F + 1)."""
    plan = json.loads((CORPUS / f"{name}.json").read_text())
    ir = import_plan_text(json.dumps(plan), f"{name}.json")
    F = ir.in_chunks // plan["gpus"][0]["input_chunks"]
    assert F > 1
    runs = 1 if plan["inplace"] and plan["collective"] == "reducescatter" else 2
    for mult in (F, F + 1):
        for lazy in [(r, tb["id"]) for r, g in enumerate(plan["gpus"]) for tb in g["threadblocks"]]:
            check_plan(plan, mult, seed=mult, lazy=lazy, runs=runs)


@pytest.mark.slow
@pytest.mark.parametrize("size,channel", [(2, "memory"), (4, "port")])
def test_a_grouped_reduction_runs_right_on_hcccs_kernels_in_cpu_emulation(size, channel, tmp_path, capsys,
                                                                         monkeypatch):
    """``hccc run`` of the plan file (hccc's kernels, both ranks in one process, in place)."""
    from hccc.cli import main
    path = tmp_path / "grouped_reduce.json"
    path.write_text(json.dumps(grouped_reduce_allreduce(size, channel=channel), indent=1))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(path), "--sizes", str(16 * 2 * size * size * 3), "-n", "1", "-w", "0"]) == 0
    out = capsys.readouterr().out
    assert "Out of bounds values : 0 OK" in out, out
