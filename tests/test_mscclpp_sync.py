"""The MSCCL++ executor's synchronisation checked on plans (compiler/interop/mscclpp_sync.py and
mscclpp_operands.py): waits no signal satisfies, cycles of waits, missing nops, undeclared
semaphores and operations without their operands are refused with located errors; and a fuzz of
mutated real plans against the independent interpreter (tests/mscclpp_interp.py): every mutation
the checker accepts runs right, without deadlock or race, in the interpreter."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from mscclpp_interp import InterpError, check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text
from mscclpp_plans import (HAND, NOP, corpus, refused, plan_direct_allgather, plan_forwarded_packets_allgather,
                           plan_packet_allgather, plan_pipelined_allreduce, plan_read_reduce_allreduce,
                           plan_semaphore_reducescatter, sync_op)



def _ops(plan, r, t=0):
    return plan["gpus"][r]["threadblocks"][t]["ops"]


# ------------------------------------------------------------------ item: waits and counts
def test_a_duplicated_wait_is_a_wait_no_signal_satisfies():
    plan = plan_read_reduce_allreduce()
    ops = _ops(plan, 1)
    ops.insert(1, copy.deepcopy(ops[1]))                  # the first wait, twice
    msg, line = refused(plan)
    assert "a wait no signal satisfies" in msg and "rank 1 thread block 0" in msg and '"wait"' in line
    with pytest.raises(InterpError, match="deadlock"):    # the interpreter agrees
        check_plan(plan, 1)


def test_a_dropped_signal_is_refused_where_its_wait_hangs():
    plan = plan_read_reduce_allreduce()
    del _ops(plan, 0)[0]                                  # rank 0's first signal
    msg, line = refused(plan)
    assert "deadlock under the executor" in msg and "rank 1" in msg and '"wait"' in line


def test_a_cycle_of_waits_is_a_deadlock_even_when_the_counts_match():
    plan = plan_read_reduce_allreduce()
    for r in range(2):                                    # both ranks wait before they signal
        ops = _ops(plan, r)
        ops[0], ops[1] = ops[1], ops[0]
    msg, _ = refused(plan)
    assert "a cycle of waits" in msg


def test_an_extra_signal_is_refused_it_would_satisfy_the_next_call_early():
    plan = plan_read_reduce_allreduce()
    _ops(plan, 0).append(sync_op("signal", [0]))
    msg, line = refused(plan)
    assert "next call early" in msg and '"signal"' in line
    with pytest.raises(InterpError, match="later call"):  # the interpreter agrees
        check_plan(plan, 1)


def test_a_barrier_short_of_its_thread_blocks_deadlocks():
    plan = plan_direct_allgather()
    for g in plan["gpus"]:
        g["threadblocks"][1]["ops"][-1]["num_threadblocks"] = 3
        g["threadblocks"][0]["ops"][-1]["num_threadblocks"] = 3
    msg, _ = refused(plan)
    assert "barrier 0 waits for 3 thread blocks" in msg


def test_a_semaphore_released_less_than_acquired_deadlocks():
    plan = plan_semaphore_reducescatter()
    del plan["gpus"][0]["threadblocks"][0]["ops"][-1]     # the release
    msg, line = refused(plan)
    assert "semaphore 0 is never released" in msg and '"sem_acquire"' in line


# ------------------------------------------------------------------ item: races and semaphores
def test_a_wait_then_a_data_operation_without_a_nop_races():
    plan = plan_read_reduce_allreduce()
    ops = _ops(plan, 0)
    assert ops[2] == NOP
    del ops[2]
    msg, line = refused(plan)
    assert "no 'nop'" in msg and "'rre' directly after 'wait'" in msg and '"rre"' in line
    with pytest.raises(InterpError, match="no nop"):
        check_plan(plan, 1)


def test_a_simple_plan_without_any_nop_isrefused():
    for make in HAND:
        plan = make()
        for g in plan["gpus"]:
            for tb in g["threadblocks"]:
                tb["ops"] = [o for o in tb["ops"] if o["name"] != "nop"]
                for o in tb["ops"]:
                    if o["name"] == "pipeline":
                        o["ops"] = [x for x in o["ops"] if x["name"] != "nop"]
        if plan["protocol"] == "LL":       # packets carry their own flags: no nop needed, none refused
            import_plan_text(json.dumps(plan), "p.json")
            check_plan(plan, 2)
            continue
        msg, _ = refused(plan)
        assert "no 'nop'" in msg, (make.__name__, msg)


def test_a_data_operation_then_a_signal_without_a_nop_races():
    plan = plan_read_reduce_allreduce()
    ops = _ops(plan, 1)
    assert ops[6] == NOP and ops[7]["name"] == "signal"
    del ops[6]
    msg, _ = refused(plan)
    assert "'signal' directly after 'put'" in msg


@pytest.mark.parametrize("sid", [1, -1, 7, "0", None])
def test_undeclared_or_negative_semaphores_arerefused(sid):
    for side in (0, -1):                                  # the release, the acquire
        plan = plan_semaphore_reducescatter()
        tbs = plan["gpus"][1]["threadblocks"]
        op = tbs[0]["ops"][-1] if side == -1 else tbs[1]["ops"][0]
        op["semaphore_ids"] = [sid]
        msg, line = refused(plan)
        assert "semaphore" in msg and ("not declared" in msg or "non-negative" in msg), msg


def test_a_negative_initial_semaphore_value_isrefused():
    plan = plan_semaphore_reducescatter()
    plan["gpus"][0]["semaphores"] = [{"init_value": -1}]
    msg, line = refused(plan)
    assert "init_value" in msg and "init_value" in line


# ------------------------------------------------------------------ item: operands from one table
OPERAND_CASES = [("copy", "src_buff"), ("copy", "dst_buff"), ("re", "src_buff"), ("rre", "dst_buff"),
                 ("put", "src_buff"), ("put", "dst_buff"), ("signal", "channel_ids"), ("wait", "channel_ids"),
                 ("ppkt", "src_buff"), ("upkt", "dst_buff"), ("cpkt", "src_buff"), ("rppkt", "dst_buff"),
                 ("sem_acquire", "semaphore_ids"), ("barrier", "barrier_id"), ("barrier", "num_threadblocks")]


@pytest.mark.parametrize("name,field", OPERAND_CASES)
def test_operations_without_their_operands_get_a_located_error(name, field, tmp_path, capsys):
    from hccc.cli import main
    plan = {"ppkt": _packet_plan, "upkt": _packet_plan, "cpkt": _forward_plan, "rppkt": _forward_plan,
            "sem_acquire": plan_semaphore_reducescatter, "barrier": plan_direct_allgather,
            "copy": plan_direct_allgather, "re": plan_semaphore_reducescatter}.get(name, plan_read_reduce_allreduce)()
    hits = [o for g in plan["gpus"] for tb in g["threadblocks"] for o in tb["ops"] if o["name"] == name]
    assert hits, name
    for value in (None, [], {}):
        bad = copy.deepcopy(plan)
        op = [o for g in bad["gpus"] for tb in g["threadblocks"] for o in tb["ops"] if o["name"] == name][0]
        if value is None:
            del op[field]
        else:
            op[field] = value
        f = tmp_path / "p.json"
        f.write_text(json.dumps(bad, indent=2))
        assert main(["check", str(f)]) == 1, (name, field, value)
        err = capsys.readouterr().err
        assert "p.json:" in err and "error:" in err and "Traceback" not in err and "internal error" not in err


def test_thread_blocks_without_their_tables_get_a_located_error():
    for key, field in (("remote_buffer_refs", "remote_buffer_ids"), ("channels", "channel_ids"),
                       ("remote_buffer_refs", "access_channel_type")):
        plan = plan_read_reduce_allreduce()
        del plan["gpus"][0]["threadblocks"][0][key][0][field]
        msg, _ = refused(plan)
        assert f"'{key}'" in msg


def _packet_plan():
    return plan_packet_allgather()


def _forward_plan():
    return plan_forwarded_packets_allgather()


# ------------------------------------------------------------------ item: fuzz against the interpreter
MUTATIONS = ("drop", "duplicate", "swap", "semaphore", "channel", "drop_kind", "group")


def _mutate(plan, data) -> str:
    """One mutation of ``plan`` in place, drawn from ``data``; returns what it did."""
    g = plan["gpus"][data.draw(st.integers(0, len(plan["gpus"]) - 1))]
    tbs = [tb for tb in g["threadblocks"] if tb["ops"]]
    tb = tbs[data.draw(st.integers(0, len(tbs) - 1))]
    ops = tb["ops"]
    kind = data.draw(st.sampled_from(MUTATIONS))
    if kind == "drop_kind":                 # drop one signal, wait or nop (the mutations)
        cands = [k for k, o in enumerate(ops) if o["name"] in ("signal", "wait", "nop", "sem_release", "sem_acquire")]
        if not cands:
            kind = "drop"
        else:
            k = data.draw(st.sampled_from(cands))
            return f"drop {ops.pop(k)['name']}"
    k = data.draw(st.integers(0, len(ops) - 1))
    if kind == "drop":
        return f"drop {ops.pop(k)['name']}"
    if kind == "duplicate":
        ops.insert(k, copy.deepcopy(ops[k]))
        return f"duplicate {ops[k]['name']}"
    if kind == "swap":
        j = min(k + 1, len(ops) - 1)
        ops[k], ops[j] = ops[j], ops[k]
        return f"swap {ops[k]['name']} {ops[j]['name']}"
    if kind == "semaphore":
        cands = [o for o in ops if "semaphore_ids" in o]
        if cands:
            o = data.draw(st.sampled_from(cands))
            o["semaphore_ids"] = [data.draw(st.integers(-1, 3))]
            return "semaphore id"
        return "none"
    if kind == "group":                     # a thread-block group's part moved, or the group dropped
        cands = [o for o in ops if "tbg_info" in o]
        if cands:
            o = data.draw(st.sampled_from(cands))
            size = o["tbg_info"]["tbg_size"]
            o["tbg_info"] = {"tb_id": data.draw(st.integers(0, size - 1)), "tbg_size": size}
            if data.draw(st.booleans()):
                del o["tbg_info"]
            return "group"
        return "none"
    cands = [o for o in ops if o.get("channel_ids")]
    if cands:
        o = data.draw(st.sampled_from(cands))
        o["channel_ids"] = [data.draw(st.integers(0, 3))]
        return "channel id"
    return "none"


@settings(max_examples=examples(40))
@given(data=st.data())
def test_every_mutation_the_checker_accepts_runs_right_in_the_interpreter(data):
    texts = corpus()
    plan = json.loads(texts[data.draw(st.integers(0, len(texts) - 1))])
    what = _mutate(plan, data)
    try:
        ir = import_plan_text(json.dumps(plan), "mutant.json")
    except CompileError:
        return                              # refused: nothing to run
    # a SendRecv plan does not state its shift: a mutant that sends to other peers, all of one
    # shift, is a SendRecv of that shift (the one the import proved)
    shift = ir.root if ir.collective == "sendrecv" else 1
    for seed in range(2):                   # accepted: it must run right, no deadlock, no race
        try:                                # (a rank running calls ahead of the others: no race between calls)
            check_plan(plan, 6, seed=seed, runs=1 if plan["inplace"] else 2,   # 6: groups of 2 and 3 cut evenly
                       eager=seed % len(plan["gpus"]), shift=shift)
        except InterpError as exc:
            raise AssertionError(f"the checker accepted a plan ({what}) the interpreter rejects: {exc}") from None


# ------------------------------------------------------------------ races between pipeline iterations
PIPELINE_CUTS = [(u, c) for u in (16, 32, 64) for c in (1, 2)]


def _pipelines(cuts) -> dict:
    """The pipelined AllReduce, rank r's pipeline cut as ``cuts[r]`` (unit size, chunks)."""
    plan = plan_pipelined_allreduce()
    for r, (u, c) in enumerate(cuts):
        plan["gpus"][r]["threadblocks"][0]["ops"][0]["iter_context"] = {"unit_size": u, "num_chunks": c}
    return plan


def _interpreter_fails(plan) -> bool:
    """Whether the independent interpreter, at several sizes, with every rank running ahead in
    turn and three calls in a row, finds a wrong element, a deadlock or a race between calls."""
    for mult in (1, 2, 4, 8):
        for ahead in (None, 0, 1):
            try:
                check_plan(plan, mult, eager=ahead, seed=mult, runs=3)
            except InterpError:
                return True
    return False


def test_pipelines_that_cut_iterations_differently_are_refused_naming_both():
    """Rank 0 pipelines its puts into rank 1's scratch in 16-byte iterations, rank 1 reduces what
    lands in 32-byte ones: one signal per iteration on each side, so rank 1's first reduction reads
    bytes rank 0's second iteration has not put yet. A body counted once hides it."""
    plan = _pipelines([(16, 1), (32, 1)])
    msg, line = refused(plan)
    assert "pipelined 'put' (rank 0 thread block 0)" in msg and "pipelined 're' (rank 1 thread block 0" in msg
    assert "race between iterations" in msg and '"name": "put"' in line
    assert _interpreter_fails(plan)


def test_a_pipeline_over_other_chunks_than_its_ranges_isrefused():
    msg, _ = refused(_pipelines([(32, 2), (32, 2)]))
    assert "pipeline over 2 chunks" in msg
    assert _interpreter_fails(_pipelines([(32, 2), (32, 2)]))


@pytest.mark.parametrize("cuts", [((u, 1), (u, 1)) for u in (16, 32, 64)])
def test_pipelines_cut_alike_are_accepted_and_run_right(cuts):
    plan = _pipelines(cuts)
    import_plan_text(json.dumps(plan), "p.json")
    assert not _interpreter_fails(plan)


@settings(max_examples=examples(30))
@given(a=st.sampled_from(PIPELINE_CUTS), b=st.sampled_from(PIPELINE_CUTS))
def test_pipeline_check_agrees_with_the_interpreter(a, b):
    """Random cuts of the two ranks' pipelines: hccc accepts exactly the plans on which the
    independent interpreter (which runs every iteration, ranks running ahead) finds nothing wrong."""
    plan = _pipelines([a, b])
    try:
        import_plan_text(json.dumps(plan), "p.json")
        accepted = True
    except CompileError:
        accepted = False
    assert accepted == (not _interpreter_fails(plan)), (a, b)


def test_pipelined_ranges_that_start_apart_race_between_iterations():
    """Two blocks' pipelines cut alike, one writing scratch chunks [0, 2), the other reading
    [1, 3): iteration i + 1 of the writer reaches the bytes iteration i of the reader reads
    (parts cut from each range's own start). The same ranges starting together, or apart without
    sharing bytes, or both only reading: no race."""
    from hccc.compiler.interop.mscclpp_ops import BlockOp, PlanOp, local
    from hccc.compiler.interop.mscclpp_sync import check_pipeline_iterations

    def block(tb, src, dst):
        p = ("gpus", 0, "threadblocks", tb, "ops", 0, "ops", 0)
        return (0, tb, [(p, BlockOp(PlanOp("copy", src=(src,), dst=(dst,)), p, "memory", (), {}))])

    def region(op, ref, path, r):
        return r, ref.type, ref.index, ref.size

    def err(path, msg):
        return ValueError(f"{'/'.join(map(str, path))}: {msg}")

    cuts = {("gpus", 0, "threadblocks", tb, "ops", 0): (32, 2) for tb in (0, 1)}

    def check(w, rd):
        check_pipeline_iterations([block(0, local("i", 0, 2), w), block(1, rd, local("o", 0, 2))], cuts, region,
                                  lambda b: b == "s", err)
    with pytest.raises(ValueError, match="start at different chunks") as exc:
        check(local("s", 0, 2), local("s", 1, 2))
    assert str(exc.value).startswith("gpus/0/threadblocks/0/ops/0/ops/0: pipelined 'copy'")
    check(local("s", 0, 2), local("s", 0, 2))
    check(local("s", 0, 2), local("s", 2, 2))
    check(local("o", 2, 2), local("s", 1, 2))
