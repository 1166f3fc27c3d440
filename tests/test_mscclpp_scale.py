"""The plan checker's work is near-linear in the plan's channels, a run of nops costs it little (and
imports as one nop), its rows are columns, and a plan declaring sizes that would take gigabytes is
refused from those sizes, before anything is allocated."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text

HCCC = Path(__file__).resolve().parent.parent


def _b(t, i):
    return {"type": t, "index": i, "size": 1}


def _rb(k, i):
    return {"buffer_id": k, "index": i, "size": 1}


def _sig(name, c):
    return {"name": name, "channel_ids": [c], "channel_type": "memory"}


def many_channels(K: int) -> dict:
    """A 2-rank AllReduce (a read-reduce, then a put) on channel 0, with ``K - 1`` more channels
    between the two ranks, each with a thread block of its own that signals and waits on it, and
    reads the peer's input into its scratch."""
    gpus = []
    for r in range(2):
        p = 1 - r
        ops = [_sig("signal", 0), _sig("wait", 0), {"name": "nop"},
               {"name": "rre", "src_buff": [_b("i", r), _rb(0, r)], "dst_buff": [_b("o", r)], "channel_type": "memory"},
               {"name": "nop"}, {"name": "put", "src_buff": [_b("o", r)], "dst_buff": [_rb(1, r)],
                                 "channel_type": "memory", "channel_ids": [0]},
               {"name": "nop"}, _sig("signal", 0), _sig("wait", 0)]
        refs = [{"access_channel_type": "memory", "remote_buffer_ids": [0, 1]}]
        tbs = [{"id": 0, "ops": ops, "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                "remote_buffer_refs": refs}]
        for k in range(1, K):
            tbs.append({"id": k, "ops": [_sig("signal", 0), _sig("wait", 0), {"name": "nop"},
                                         {"name": "get", "src_buff": [_rb(0, 0)], "dst_buff": [_b("s", k - 1)],
                                          "channel_type": "memory", "channel_ids": [0]},
                                         {"name": "nop"}, _sig("signal", 0), _sig("wait", 0)],
                        "channels": [{"channel_type": "memory", "channel_ids": [k]}], "remote_buffer_refs": refs})
        gpus.append({"id": r, "input_chunks": 2, "output_chunks": 2, "scratch_chunks": max(K - 1, 1),
                     "channels": [{"channel_type": "memory", "connected_to": [p] * K}],
                     "remote_buffers": [{"rank": p, "type": "i", "access_channel_types": ["memory"]},
                                        {"rank": p, "type": "o", "access_channel_types": ["memory"]}],
                     "threadblocks": tbs, "semaphores": []})
    return {"name": "many", "collective": "allreduce", "protocol": "Simple", "inplace": False,
            "reuse_resources": False, "num_threads_per_block": 1024, "use_double_scratch_buffer": False,
            "buffer_alignment": 16, "min_message_size": 0, "max_message_size": 1 << 40, "gpus": gpus}


def _work(text: str) -> int:
    """Python lines the checker runs (every loop iteration counts) in hccc's own modules."""
    count = 0
    root = str(HCCC)
    shadow = str(HCCC / ".shadow")

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def trace(frame, event, arg):
        f = frame.f_code.co_filename
        return local if f.startswith(root) or f.startswith(shadow) or "/hccc/" in f else None

    sys.settrace(trace)
    try:
        import_plan_text(text, "many.json")
    finally:
        sys.settrace(None)
    return count


def test_the_checkers_work_is_near_linear_in_the_channels():
    w = [_work(json.dumps(many_channels(k))) for k in (50, 100, 200)]
    # the work added by doubling the channels again: 2x when linear; the pairing of channels by a
    # scan of the peer's list (quadratic) made it 2.5x at these sizes and 4x in the limit
    growth = (w[2] - w[1]) / (w[1] - w[0])
    assert growth < 2.25, w


def test_a_thread_block_that_only_synchronises_is_accepted():
    plan = many_channels(3)
    for g in plan["gpus"]:
        for tb in g["threadblocks"][1:]:
            tb["ops"] = [o for o in tb["ops"] if o["name"] in ("signal", "wait")]
    ir = import_plan_text(json.dumps(plan), "sync_only.json")
    assert list(ir.ntbs) == [3, 3]


def _refused_within(plan: dict, budget: int):
    """The plan's refusal (its message and line), found holding at most ``budget`` bytes beyond
    the plan's own text (traced Python allocations, numpy's included)."""
    import tracemalloc
    text = json.dumps(plan, indent=1)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(CompileError) as exc:
            import_plan_text(text, "big.json")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    d = exc.value.diagnostics[0]
    assert peak < budget, peak
    return d.message, text.splitlines()[d.location.line - 1]


def test_a_plan_declaring_a_huge_scratch_is_refused_from_its_sizes():
    plan = many_channels(2)
    plan["gpus"][1]["scratch_chunks"] = 10 ** 8
    msg, line = _refused_within(plan, 16 << 20)
    assert "chunk slots" in msg and "files-and-limits" in msg and '"scratch_chunks": 100000000' in line


def test_twenty_thousand_empty_gpus_are_refused_from_their_sizes():
    R = 20_000
    gpus = [{"id": r, "input_chunks": 1, "output_chunks": R, "scratch_chunks": 0, "channels": [],
             "remote_buffers": [], "threadblocks": [], "semaphores": []} for r in range(R)]
    plan = {"name": "empty", "collective": "allgather", "protocol": "Simple", "inplace": False, "gpus": gpus}
    msg, line = _refused_within(plan, 64 << 20)
    assert f"{R} ranks" in msg and "chunk slots" in msg and '"output_chunks"' in line


def test_the_slot_limit_admits_a_thousand_gpu_allgather():
    from hccc.compiler.interop.mscclpp_plan import MAX_PLAN_SLOTS
    assert 1024 * (1 + 1024 + 1024) <= MAX_PLAN_SLOTS


def _with_nops(plan: dict, n: int) -> dict:
    """``plan`` with ``n`` more plain nops before rank 0's first thread block's operations."""
    out = json.loads(json.dumps(plan))
    out["gpus"][0]["threadblocks"][0]["ops"][:0] = [{"name": "nop"}] * n
    return out


def test_a_plans_nops_cost_little_work():
    """A run of plain nops is read as one: 3 M of them (51 MB, under the input cap) ran past 60 s at
    236 Python lines a nop; the work a nop adds is now the JSON hook's and two scans' (21 lines)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mscclpp_switch_plans import plan_switch_allreduce
    plan = plan_switch_allreduce(R=2)
    w = [_work(json.dumps(_with_nops(plan, n))) for n in (0, 5_000)]
    assert (w[1] - w[0]) / 5_000 < 30, w


def _dup_nops(obj, draw):
    """``obj`` (a plan, or part of one) with every plain nop in a list of operations made a run of
    1 to 4 of them."""
    if isinstance(obj, dict):
        return {k: _dup_nops(v, draw) for k, v in obj.items()}
    if isinstance(obj, list):
        out = []
        for x in obj:
            out.extend([x] * draw() if x == {"name": "nop"} else [_dup_nops(x, draw)])
        return out
    return obj


@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_runs_of_nops_import_as_the_plan_with_one(data):
    """The oracle: the same plan with one nop where it has a run (what the executor's threads do
    is the same, a nop being a __syncthreads()); the program imported is the same, every column,
    every dependency, every statistic."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mscclpp_plans import corpus
    text = data.draw(st.sampled_from(corpus()), label="plan")
    plan = json.loads(text)
    more = _dup_nops(plan, lambda: data.draw(st.integers(1, 4), label="nops"))
    assert import_plan_text(json.dumps(more), "more.json").to_json() == import_plan_text(text, "p.json").to_json()


def test_a_row_table_keeps_its_operations_once_and_says_what_each_row_does():
    """Rows as columns: one (path, description) per operation, a row's message written when asked
    for (the peer from the row's own columns), the channel of a put set after the fact."""
    from hccc.compiler.interop.mscclpp_rows import RowTable
    from hccc.compiler.ir.program_ir import Buf, Op
    t = RowTable()
    p, desc = ("gpus", 1, "threadblocks", 0, "ops", 3), "rank 1 thread block 0 operation 3 (put)"
    a = t.add(1, 0, Op.SEND, p, desc, sp=2, ch=-1, sb=Buf.INPUT, so=4, n=2, note=1)
    b = t.add(1, 0, Op.RECV, p, desc, rp=3, ch=7, db=Buf.OUTPUT, do=1, note=2)
    q, d2 = ("gpus", 1, "threadblocks", 0, "ops", 4), "rank 1 thread block 0 operation 4 (copy)"
    c = t.add(1, 0, Op.COPY, q, d2, sb=Buf.INPUT, db=Buf.OUTPUT)
    t.set_channel(a, 5)
    assert (a, b, c, len(t), len(t.ops)) == (0, 1, 2, 3, 2)
    assert [t.describe(i) for i in range(3)] == [desc + " sending to rank 2", desc + " receiving from rank 3", d2]
    assert [t.path(i) for i in range(3)] == [p, p, q]
    assert t.array().tolist() == [[1, 0, int(Op.SEND), 2, -1, 5, int(Buf.INPUT), 4, int(Buf.NONE), 0, 2],
                                  [1, 0, int(Op.RECV), -1, 3, 7, int(Buf.NONE), 0, int(Buf.OUTPUT), 1, 1],
                                  [1, 0, int(Op.COPY), -1, -1, 0, int(Buf.INPUT), 0, int(Buf.OUTPUT), 0, 1]]


#: traced bytes the import (JSON, reading, proof) may hold at its peak per transfer of a switch
#: plan: measured 1,350 to 1,460 (16 ranks, 2,400 to 28,800 transfers); 2,540 before the rows were
#: columns and the first pass's records slotted and let go before the proof (a 3.7 MB plan of
#: 576,000 transfers then peaked at 1.71 GB in hccc check, 0.94 GB after)
IMPORT_BYTES_PER_TRANSFER = 1_700


def test_the_imports_memory_is_bounded_per_transfer():
    """The peak of the import's Python and numpy allocations over its transfers, for a switch
    AllReduce on 16 ranks whose ``glres`` operations become 30 transfers each."""
    import tracemalloc
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mscclpp_switch_plans import plan_switch_allreduce
    k = 10
    text = json.dumps(plan_switch_allreduce(R=16, k=k, cuts=range(16 * k)))
    import_plan_text(text, "warm.json")          # modules and caches loaded outside the measure
    tracemalloc.start()
    try:
        ir = import_plan_text(text, "w.json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n = int(ir.stats["transfers"])
    assert n == 16 * k * 30
    assert peak < IMPORT_BYTES_PER_TRANSFER * n, (peak, n, peak / n)


def test_a_plan_past_the_work_budget_is_refused_where_it_passes_it(tmp_path, monkeypatch, capsys):
    """Operations are counted as they are read, one each and one per buffer each names, a switch
    operation as the memory-channel operation it becomes (``glres`` on R ranks: an ``rres`` naming
    the R - 1 peers' buffers twice and its own), a run of nops as one: the plan is refused at the
    operation that passes MAX_PLAN_WORK (located, exit 1, no traceback); one at the budget is read."""
    import hccc.compiler.interop.mscclpp_blocks as blocks
    from hccc.cli import main
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mscclpp_switch_plans import plan_switch_allreduce
    R = 4
    plan = _with_nops(plan_switch_allreduce(R=R), 1000)
    total = 0
    for g in plan["gpus"]:
        prev = None
        for o in g["threadblocks"][0]["ops"]:
            if not (o == {"name": "nop"} and prev == o):
                # glres: one operation reading its own and R - 1 peers' copies, writing R - 1 peers'
                total += 1 + (1 + 2 * (R - 1) + 1 if o.get("name") == "glres" else 0)
            prev = o
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan, indent=1))
    monkeypatch.setattr(blocks, "MAX_PLAN_WORK", total)
    assert main(["check", str(path)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(blocks, "MAX_PLAN_WORK", total - 1)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"error: the plan's operations and the buffers they name pass {total - 1:,} (MAX_PLAN_WORK" in err, err
    assert err.startswith(f"{path}:") and "Traceback" not in err
