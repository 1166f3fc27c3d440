"""MSCCL++ plans with ``reuse_resources``: the plan's scratch is the executor's shared 64 MiB buffer.
While the plan's scratch fits it, every offset is a plain plan's: hccc proves the plan there (and
says up to which size), the independent interpreter runs it with the right result, and past that
size (where the executor folds scratch offsets) neither claims anything."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mscclpp_interp import InterpError, check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.compiler.interop.mscclpp_plan import SHARED_SCRATCH_BYTES
from mscclpp_plans import HAND, plan_pipelined_allreduce


def _reuse(plan, **kw):
    plan = dict(plan, reuse_resources=True, **kw)
    return plan


@pytest.mark.parametrize("make", HAND, ids=lambda f: f.__name__)
def test_reuse_plans_are_proven_and_run_right(make):
    plan = _reuse(make())
    for seed in range(2):
        check_plan(plan, 2 + seed, seed=seed, runs=2)
    ir = import_plan_text(json.dumps(plan), "reuse.json")
    assert ir.origin.source == "mscclpp-plan"


def test_the_proven_range_stops_where_the_scratch_outgrows_the_shared_buffer():
    plan = _reuse(plan_pipelined_allreduce())         # 1 scratch chunk, 2 input chunks, Simple
    for g in plan["gpus"]:
        g["scratch_chunks"] = 1 << 10
    ir = import_plan_text(json.dumps(plan), "reuse.json")
    top = SHARED_SCRATCH_BYTES // (1 << 10) // 16 * 16 * 2
    assert ir.origin.max_bytes == top and "reuse_resources" in ir.origin.note
    # the interpreter agrees on where the plain semantics end: one alignment step (16 bytes x 2
    # input chunks, check_plan's unit) past the proven size it refuses to run the plan
    check_plan(plan, 2)
    with pytest.raises(InterpError, match="shared buffer"):
        check_plan(plan, top // 32 + 1)


def test_a_plan_whose_least_size_is_past_the_shared_buffer_is_refused():
    plan = _reuse(plan_pipelined_allreduce(), min_message_size=1 << 40)
    with pytest.raises(CompileError) as exc:
        import_plan_text(json.dumps(plan, indent=1), "reuse.json")
    assert "min_message_size" in exc.value.diagnostics[0].message


def test_a_plans_uint64_bound_survives_the_outdir(tmp_path):
    """max_message_size is a uint64 (the DSL's default 2^64 - 1); the program's stats are int64."""
    from hccc.cli import main
    from hccc.compiler.ir.check import load_ir_json
    plan = dict(plan_pipelined_allreduce(), max_message_size=(1 << 64) - 1)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan))
    assert main([str(f), "-o", str(tmp_path / "out")]) == 0
    name = json.loads((tmp_path / "out" / "manifest.json").read_text())["algorithm"]
    load_ir_json((tmp_path / "out" / f"{name}.ir.json").read_text())


# ------------------------------------------------------------------ MSCCL++'s own plans (its DSL's output)
#: the plans MSCCL++'s DSL writes, in the repository (tests/mscclpp_corpus, written by its generate.py)
CORPUS = Path(__file__).resolve().parent / "mscclpp_corpus"


@pytest.mark.slow
def test_the_plans_mscclpp_installs_import(tmp_path, capsys):
    """`python -m mscclpp --install`'s plans (two- and four-node AllReduce, reuse_resources), as
    MSCCL++'s DSL writes them: proven, right in the interpreter, the two-node one on hccc's kernels
    in one process and through the Communicator across two emulated nodes."""
    files = sorted(CORPUS.glob("installed__*.json"))
    assert len(files) == 4
    for f in files:
        plan = json.loads(f.read_text())
        assert plan["reuse_resources"] and any("tbg_info" in o for g in plan["gpus"] for tb in g["threadblocks"]
                                               for o in tb["ops"])
        ir = import_plan_text(f.read_text(), f.name)          # proven (thread-block groups cut chunks)
        assert ir.nranks in (16, 32)
        # the interpreter at the least size of the plan's range where every group's parts are even
        unit = 16 * plan["gpus"][0]["input_chunks"] * 28
        mult = 28 * -(-plan["min_message_size"] // unit)
        check_plan(plan, mult, runs=1)                         # in place: one call
    two_node = CORPUS / "installed__allreduce_2nodes_1K_64K.json"
    # hccc's own kernels in CPU emulation (all 16 ranks in one process), in place as the plan says
    from hccc.cli import main
    assert main(["run", str(two_node), "--sizes", "56K", "-n", "1", "-w", "0"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out
    # and through the Communicator, one process a rank, ranks 0-7 on one emulated node and 8-15 on
    # another (the plan's memory channels say nodes of 8), two calls in a row (minutes on 2 cores)
    from net_ranks import TCP, have_ucx
    from communicator_calls import calls_for, check, require_torch
    from rank_pool import RankPool
    if not have_ucx():
        return
    require_torch()
    ir = import_plan_text(two_node.read_text(), two_node.name)
    assert ir.origin.gpus_per_node == 8
    calls, want, _ = calls_for(ir, (56 << 10) // 4, seed=5)
    calls = [[{k: v for k, v in c.items() if k != "out"} for c in cs] * 2 for cs in calls]     # in place
    pool = RankPool(16, tmp_path)
    try:
        replies = pool.run(ir.to_json(), 16, calls, nodes=["a"] * 8 + ["b"] * 8, env=TCP, timeout=120)
    finally:
        pool.close()
    check(replies, want, "allreduce_2nodes_1K_64K on two emulated nodes", 2)


#: MSCCL++'s hierarchical LL plans (its ``default_algos``) at 2 nodes x 2 GPUs, as the DSL writes
#: them with reuse_resources (the corpus' ``default_algos__NAME.json``): (name, in place)
TWO_NODE = [("allreduce_tbg1", True), ("allreduce_tbg2", True), ("reducescatter_tbg1", True),
            ("reducescatter_tbg2", True), ("allgather_in", True), ("allgather_out", False)]


@pytest.mark.slow
def test_two_node_plans_run_across_two_emulated_nodes(tmp_path):
    """MSCCL++'s two-node AllReduce, ReduceScatter and AllGather (LL, reuse_resources,
    thread-block groups), 2 nodes x 2 ranks: proven, right in the interpreter (a rank running
    ahead included), and run by hccc's kernels through the Communicator with ranks 0-1 on one
    emulated node and 2-3 on another (every cross-node step over the network transport, UCX over
    TCP), three calls in a row, in place or out of place as each plan declares: 0 wrong elements."""
    from net_ranks import TCP, have_ucx
    from communicator_calls import calls_for, check, require_torch
    from rank_pool import RankPool
    if not have_ucx():
        pytest.skip("UCX (libucx-dev) not installed")
    require_torch()
    pool = RankPool(4, tmp_path)
    try:
        for name, inplace in TWO_NODE:
            text = (CORPUS / f"default_algos__{name}.json").read_text()
            plan = json.loads(text)
            ir = import_plan_text(text, f"{name}.json")
            assert ir.origin.gpus_per_node == 2 and ir.placements == (inplace,)
            for ahead in (0, 3):
                check_plan(plan, 12, seed=ahead, runs=1 if inplace else 3, eager=ahead)
            count = ir.nchunks * 4 * 3
            calls, want, count = calls_for(ir, count, seed=7)
            if inplace:
                how = {"allreduce": lambda c: {k: v for k, v in c.items() if k != "out"},
                       "allgather": lambda c: dict(c, input_in_output=True),
                       "reducescatter": lambda c: dict(c, output_in_input=True)}[ir.collective]
                calls = [[how(c) for c in cs] for cs in calls]
            calls = [cs * 3 for cs in calls]
            replies = pool.run(ir.to_json(), 4, calls, nodes=["a", "a", "b", "b"], env=TCP)
            check(replies, want, f"{name} on two nodes", 3)
    finally:
        pool.close()
