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


# ------------------------------------------------------------------ MSCCL++'s own DSL, where available
import os  # noqa: E402

DSL = os.environ.get("HCCC_MSCCLPP_DSL")          # MSCCL++'s python/ directory (its language package)
#: the DSL's test programs and the arguments they are generated with (4 GPUs; nodes of 4)
DSL_PROGRAMS = [(f"single_node/{n}", ["--num_gpus", "4"]) for n in (
    "allgather_pkt", "allgather_pkt_rppkt", "allreduce", "allreduce_naivy", "allreduce_pkt", "alltoall/alltoall",
    "alltoall/alltoall_pipeline", "alltoall/alltoall_ring", "alltoall/alltoall_ring_oop",
    "alltoall/alltoall_ring_peers")] + [("single_node/allgather", []), ("single_node/allgather_tbg", [])] + [
    (f"multi_node/{n}", ["--gpus_per_node", "4"]) for n in (
        "allgather", "allgather_pkt", "reducescatter", "reducescatter_pkt")] + [
    ("multi_node/allgather_tbg", ["--num_gpus", "8", "--gpus_per_node", "4", "--tbg_size", "2"])]
#: what the import still refuses among them, and why
DSL_REFUSED: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.skipif(not DSL, reason="set HCCC_MSCCLPP_DSL to MSCCL++'s python/ directory")
@pytest.mark.parametrize("prog,args", DSL_PROGRAMS, ids=[p for p, _ in DSL_PROGRAMS])
def test_the_dsls_plans_are_proven_and_run_right(prog, args, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    script = Path(DSL) / "mscclpp" / "language" / "tests" / f"{prog}.py"
    out = subprocess.run([sys.executable, str(script), "--name", Path(prog).name] + args, check=True,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=DSL)).stdout
    plan = json.loads(out)
    try:
        import_plan_text(out, f"{Path(prog).name}.json")
    except CompileError as exc:
        assert prog in DSL_REFUSED and DSL_REFUSED[prog] in exc.diagnostics[0].message, exc.diagnostics[0].message
        return
    assert prog not in DSL_REFUSED
    check_plan(plan, 4, runs=1 if plan["inplace"] else 2)
    if not plan["inplace"]:              # calls in a row with one rank running ahead: no race between calls
        for ahead in (0, len(plan["gpus"]) - 1):
            check_plan(plan, 4, runs=3, eager=ahead, seed=ahead)


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
