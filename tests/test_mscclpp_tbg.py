"""Thread-block groups (``tbg_info``) in MSCCL++ plans: the executor cuts an operation's range into
``tbg_size`` parts and block ``tb_id`` of the group moves its part; the import cuts every chunk into
parts (the least common multiple of the group sizes) so that each share is whole parts, proves the
plan at that granularity, and the independent interpreter (which cuts bytes as the executor does)
agrees. Also: the k-th pass of blocks through a barrier id meets the k-th of the others."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from mscclpp_interp import InterpError, check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.runtime.reference import execute, expected_for, inputs_for
from mscclpp_plans import NOP, grouped_copy_allgather, grouped_puts_allgather, plan_direct_allgather


def _runs_right(ir):
    ins = inputs_for(ir, ir.nchunks * ir.nranks * 4, "float32", seed=3)
    outs = execute(ir, [x.copy() for x in ins])
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
