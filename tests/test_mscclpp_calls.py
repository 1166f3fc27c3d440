"""MSCCL++ plans run call after call: the executor orders a rank's calls (stream order) but not one
rank's next call after another rank's current one. A write into a peer's scratch in call k+1
(k+2 with a double scratch buffer) must come after the peer is done with those bytes in call k;
the import proves it from the plan's synchronisation, the independent interpreter finds the race
by letting one rank run ahead (``eager``). Also: what the plan's channels say about nodes, and the
thread mapping of packet operations (one thread moves payload t of every buffer)."""
from __future__ import annotations

import json

import pytest

from mscclpp_interp import InterpError, check_plan
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.util.diagnostics import CompileError
from mscclpp_plans import (EX, HAND, NOP, gpu_entry, mem_buffer_refs, mem_channels, plan_obj,
                           plan_packet_allgather, plan_semaphore_reducescatter, remote_buf)


def _refused(plan) -> tuple[str, str]:
    text = json.dumps(plan, indent=1)
    with pytest.raises(CompileError) as exc:
        import_plan_text(text, "calls.json")
    d = exc.value.diagnostics[0]
    return d.message, text.splitlines()[d.location.line - 1]


def test_a_next_call_that_overtakes_the_peers_reduction_is_refused_and_races_in_the_interpreter():
    racy = plan_semaphore_reducescatter(ready=False)
    msg, line = _refused(racy)
    assert "race between calls" in msg and "'put' of call k+1" in msg and "'re'" in msg
    assert '"put"' in line                                     # located at the racing write
    for ahead in (0, 1):
        with pytest.raises(InterpError, match="race between calls"):
            check_plan(racy, 2, runs=2, eager=ahead)
    # the same plan with the peer's "scratch free" word first: proven, and no schedule races
    safe = plan_semaphore_reducescatter()
    import_plan_text(json.dumps(safe), "calls.json")
    for ahead in (None, 0, 1):
        check_plan(safe, 2, runs=3, eager=ahead)


def test_a_double_scratch_buffer_moves_the_race_two_calls_on():
    """Packets into the peer's scratch, unpacked after the block's own packets went out: with a
    double buffer call k+2 writes the half call k used, and by then the peer's call k+1 (so its
    call k) has run; with one buffer call k+1 may overwrite packets not yet unpacked."""
    plan = plan_packet_allgather()
    assert plan["use_double_scratch_buffer"]
    import_plan_text(json.dumps(plan), "calls.json")
    for ahead in (0, 1):
        check_plan(plan, 2, runs=3, eager=ahead)
    single = dict(plan, use_double_scratch_buffer=False)
    msg, line = _refused(single)
    assert "race between calls" in msg and "'ppkt' of call k+1" in msg and '"ppkt"' in line
    with pytest.raises(InterpError, match="race between calls"):
        check_plan(single, 2, runs=2, eager=0)


@pytest.mark.parametrize("make", HAND, ids=lambda f: f.__name__)
def test_the_hand_written_plans_do_not_race_when_a_rank_runs_ahead(make):
    for ahead in range(len(make()["gpus"])):
        check_plan(make(), 2, runs=3, eager=ahead, seed=ahead)


# ------------------------------------------------------------------ packets: one thread per payload
def unpack_own_packets_allreduce(echo: bool = True):
    """2 ranks, LL, 4 chunks (rank r owns chunks 2r and 2r + 1): the peer's two chunks arrive as
    packets; ``recpkt`` adds them to the rank's own into its output and packs the sums into its
    scratch; directly after it, the same block unpacks the second packed chunk back onto the
    bytes it was packed from (``echo``; otherwise the first packed chunk onto the second chunk's
    place: other values, moved by other threads), another block the rest; the packets go on to
    the peer (``rppkt``), which unpacks them into place."""
    gpus = []
    for r in range(2):
        p = 1 - r

        def b(t, i, n=1):
            return {"type": t, "index": i, "size": n}
        first, second = (3, 2) if echo else (2, 3)
        tb0 = {"id": 0, "ops": [{"name": "ppkt", "src_buff": [b("i", 2 * p, 2)], "dst_buff": [remote_buf(0, 0, 2)],
                                 "channel_type": "memory", "channel_ids": [0]}],
               "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}
        tb1 = {"id": 1, "ops": [{"name": "recpkt", "src_buff": [b("i", 2 * r, 2), b("s", 0, 2)],
                                 "dst_buff": [b("o", 2 * r, 2), b("s", 2, 2)]},
                                {"name": "upkt", "src_buff": [b("s", first)], "dst_buff": [b("o", 2 * r + 1)]},
                                {"name": "rppkt", "src_buff": [b("s", 2, 2)], "dst_buff": [remote_buf(0, 4, 2)],
                                 "channel_type": "memory", "channel_ids": [0]}],
               "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}
        tb2 = {"id": 2, "ops": [{"name": "upkt", "src_buff": [b("s", second)], "dst_buff": [b("o", 2 * r)]}, NOP,
                                {"name": "upkt", "src_buff": [b("s", 4, 2)], "dst_buff": [b("o", 2 * p, 2)]}]}
        gpus.append(gpu_entry(r, 4, 4, 6, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "s", "access_channel_types": ["memory"]}], [tb0, tb1, tb2]))
    return plan_obj("allreduce", gpus, proto="LL")


def test_unpacking_what_the_block_just_packed_needs_no_nop():
    """Was refused ("'upkt' directly after 'recpkt' ... on the same bytes"): MSCCL++'s own
    hierarchical ReduceScatter unpacks a group's share of packets right after packing them."""
    plan = unpack_own_packets_allreduce()
    for seed in range(3):
        check_plan(plan, 2, seed=seed, runs=2)
    ir = import_plan_text(json.dumps(plan), "unpack.json")
    assert ir.origin.source == "mscclpp-plan"


def test_unpacking_onto_other_bytes_than_were_packed_still_races():
    plan = unpack_own_packets_allreduce(echo=False)
    msg, line = _refused(plan)
    assert "'upkt' directly after 'recpkt' on the same bytes" in msg and '"upkt"' in line
    with pytest.raises(InterpError, match="no nop between data operations on the same bytes"):
        check_plan(plan, 2)


# ------------------------------------------------------------------ nodes from the channels
def test_memory_channels_say_which_ranks_share_a_node():
    from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline import load_algorithm
    from hccc.runtime.net import declared_nodes, placement_problems
    a = load_algorithm(EX / "hm_allreduce_2x4.rccl")
    ir = build_program(a)
    back = import_plan_text(plan_text(export_plan(ir, nodes=node_map(8, 4))), "hm.json")
    assert back.origin.gpus_per_node == 4                    # memory channels within 0-3 and 4-7
    assert declared_nodes(None, back) == ([0] * 4 + [1] * 4, "gpus_per_node=4")
    assert placement_problems([f"n{r // 4}" for r in range(8)], ["cpu"] * 8,
                              assumed=declared_nodes(None, back)) == []
    assert placement_problems([f"n{r % 2}" for r in range(8)], ["cpu"] * 8, assumed=declared_nodes(None, back))
    # one node's plan (memory channels everywhere) says nothing about nodes
    one = import_plan_text(plan_text(export_plan(ir)), "hm1.json")
    assert one.origin.gpus_per_node is None


@pytest.mark.slow
def test_an_exported_two_node_plan_runs_across_two_emulated_nodes(tmp_path):
    """hccc's own 2 x 2 hierarchical AllReduce written as an MSCCL++ plan (port channels between
    the nodes, LL and Simple), read back and run by the Communicator with ranks 0-1 on one
    emulated node and 2-3 on another (UCX over TCP), three calls in a row: 0 wrong elements."""
    import shutil
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
    from hccc.compiler.passes.build import build_program
    from rank_pool import RankPool
    from communicator_calls import calls_for, check, require_torch
    from net_ranks import TCP, have_ucx
    if shutil.which("g++") is None or not have_ucx():
        pytest.skip("needs g++ and UCX")
    require_torch()
    ir = build_program(gen.hm_allreduce(2, 2))
    pool = RankPool(4, tmp_path)
    try:
        for proto in ("Simple", "LL"):
            plan = export_plan(ir, nodes=node_map(4, 2) if proto == "Simple" else None, protocol=proto)
            back = import_plan_text(plan_text(plan), "hm.json")
            calls, want, _ = calls_for(back, back.nchunks * 4 * 5 + 16, seed=3)
            replies = pool.run(back.to_json(), 4, [cs * 3 for cs in calls], nodes=["a", "a", "b", "b"], env=TCP)
            check(replies, want, f"the {proto} plan on two nodes", 3)
    finally:
        pool.close()
