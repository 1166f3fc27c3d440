"""MSCCL++ execution plans read by hccc: exported plans round-trip, hand-written plans in the DSL's
styles (remote reads, direct puts, packets, pipelines, barriers) are proven, refusals are located.
Every hand-written plan is also run by the independent interpreter (tests/mscclpp_interp.py), so the
plans themselves are right by the format's semantics, not only by hccc's reading of them."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import examples
from hccc.testing import valid_programs

from mscclpp_interp import check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
from hccc.compiler.interop.mscclpp_import import import_plan, import_plan_text
from hccc.compiler.passes.build import build_algorithm_level, build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.pipeline import load_algorithm, load_program
from hccc.runtime.reference import execute, expected_for, inputs_for
from mscclpp_plans import (HAND, plan_direct_allgather, plan_forwarded_packets_allgather,
                           plan_read_reduce_allreduce)

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"


def _alg(name):
    a = load_algorithm(EX / f"{name}.rccl")
    verify(a)
    return a


def _runs_right(ir, inplace=False, count=None):
    """The imported program computes its collective on numpy buffers (hccc's reference executor)."""
    count = count or ir.nchunks * ir.nranks * 3
    ins = inputs_for(ir, count, "float32", seed=1)
    outs = execute(ir, [x.copy() for x in ins], inplace=inplace)
    want = expected_for(ir, ins)
    for r, (o, w) in enumerate(zip(outs, want)):
        if w is not None:
            np.testing.assert_array_equal(o, w, err_msg=f"rank {r}")


# the AllToAll of the default set relays through the border ranks of two nodes; the 6-rank ring's
# (blocks relayed over up to five hops, two seconds of CPU) in the slow set
@pytest.mark.parametrize("name", ["ring_allreduce_8", "hm_allgather_2x4", "ring_reducescatter_8",
                                  "hierarchical_alltoall_2x4", pytest.param("ring_alltoall_6", marks=pytest.mark.slow),
                                  "hm_allreduce_2x4", "recursive_doubling_allgather_8"])
def test_exported_plans_round_trip(name):
    a = _alg(name)
    for ir in (build_algorithm_level(a), build_program(a)):
        for kw in (dict(), dict(inplace=True), dict(protocol="LL"), dict(instances=2), dict(micro_batches=2)):
            if "micro_batches" in kw and ir.stats.get("scheduler") == "step":
                continue
            nodes = None if kw.get("protocol") == "LL" else node_map(ir.nranks, a.header.gpu_per_node)
            back = import_plan_text(plan_text(export_plan(ir, nodes=nodes, **kw)), f"{name}.json")
            k = kw.get("instances", 1) * kw.get("micro_batches", 1)
            assert (back.collective, back.nranks, back.nchunks) == (ir.collective, ir.nranks, ir.nchunks * k)
            assert back.placements == ((True,) if kw.get("inplace") else (False,))
            assert back.origin.source == "mscclpp-plan" and back.origin.proto == kw.get("protocol", "Simple")
            if kw.get("inplace"):
                continue
            _runs_right(back)


@settings(max_examples=examples(12), deadline=None)
@given(alg=valid_programs(["allgather", "allreduce", "reducescatter", "alltoall"], max_ranks=5),
       kw=st.sampled_from([dict(), dict(protocol="LL"), dict(instances=2)]), level=st.booleans())
def test_random_exported_plans_import_to_programs_that_compute_their_collective(alg, kw, level):
    """The import (rows as columns, the first pass's records, nop runs read as one) on random
    programs' plans, two runs of nops where the exporter writes one: the program it builds computes
    the collective on numpy buffers (the oracle: the collective's definition, hccc's reference
    executor), with the exported program's ranks and chunks."""
    ir = build_algorithm_level(alg) if level else build_program(alg)
    plan = json.loads(plan_text(export_plan(ir, **kw)))
    for g in plan["gpus"]:
        for tb in g["threadblocks"]:
            tb["ops"] = [x for op in tb["ops"] for x in ([op, op] if op == {"name": "nop"} else [op])]
    back = import_plan_text(json.dumps(plan), "random.json")
    assert (back.collective, back.nranks, back.nchunks) == (ir.collective, ir.nranks,
                                                            ir.nchunks * kw.get("instances", 1))
    _runs_right(back)


# ------------------------------------------------------------------ hand-written plans
@pytest.mark.parametrize("make", HAND, ids=lambda f: f.__name__)
def test_hand_written_plans_are_right_and_proven(make, tmp_path):
    plan = make()
    for seed in range(3):
        check_plan(plan, 2 + seed, seed=seed, runs=2)       # right by the format's semantics
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan, indent=2))
    ir = load_program(f)                                   # told apart from a ProgramIR by its content
    assert ir.origin.source == "mscclpp-plan"
    _runs_right(ir, count=ir.nchunks * 8)


def _error(plan, tmp_path):
    f = tmp_path / "bad.json"
    text = json.dumps(plan, indent=2)
    f.write_text(text)
    with pytest.raises(CompileError) as exc:
        import_plan(f)
    d = exc.value.diagnostics[0]
    return d.message, text.splitlines()[d.location.line - 1] if d.location else ""


def test_refusals_are_located(tmp_path):
    plan = plan_read_reduce_allreduce()
    bad = copy.deepcopy(plan)
    bad["gpus"][1]["threadblocks"][0]["ops"][3]["dst_buff"][0]["index"] = 0     # reduces the wrong chunk
    msg, line = _error(bad, tmp_path)
    assert "does not implement allreduce" in msg
    bad = copy.deepcopy(plan)
    del bad["gpus"][0]["threadblocks"][0]["ops"][7]                              # the put's signal
    msg, line = _error(bad, tmp_path)
    assert "a wait no signal satisfies" in msg and '"name": "wait"' in line
    bad = copy.deepcopy(plan)
    bad["gpus"][1]["channels"].append({"channel_type": "switch", "buffer_type": "o",
                                       "rank_groups": [{"size": 2, "ranks": [0, 1]}]})
    msg, line = _error(bad, tmp_path)
    # a switch channel only one member declares: the members connect each group together
    assert "switch (NVLS) channel over ranks [0, 1] (buffer 'o') has no partner on rank 0" in msg
    assert '"ranks"' in line
    bad = copy.deepcopy(plan)
    bad["gpus"][0]["threadblocks"][0]["ops"][3]["tbg_info"] = {"tb_id": 0, "tbg_size": 2}
    msg, line = _error(bad, tmp_path)                     # a group of one: half the chunk reduced
    assert "does not implement allreduce" in msg
    bad = copy.deepcopy(plan)
    bad["gpus"][0]["output_chunks"] = 3
    msg, _ = _error(bad, tmp_path)
    assert "different input/output chunk counts" in msg
    bad = copy.deepcopy(plan)
    bad["collective"] = "broadcast"
    msg, line = _error(bad, tmp_path)
    assert "unsupported collective 'broadcast'" in msg and '"collective"' in line
    assert "an MSCCL++ plan has no root, so it cannot express a Broadcast" in msg
    bad["collective"] = "scatter"
    msg, line = _error(bad, tmp_path)
    assert "cannot express a Scatter; hccc reads allgather" in msg and '"collective"' in line
    bad = copy.deepcopy(plan)
    bad["gpus"][0]["threadblocks"][0]["ops"][3]["src_buff"][1]["index"] = 9
    msg, line = _error(bad, tmp_path)
    assert "chunks [9, 10)" in msg


def test_check_command_reads_a_plan(tmp_path, capsys):
    from hccc.cli import main
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan_direct_allgather()))
    assert main(["check", str(f)]) == 0
    assert "valid allgather on 3 ranks (MSCCL++ plan" in capsys.readouterr().out
    ir_json = tmp_path / "ir.json"
    ir_json.write_text(build_program(_alg("ring_allgather_8")).to_json())
    assert load_program(ir_json).origin.source != "mscclpp-plan"


def test_sim_reads_a_plan(tmp_path, capsys):
    from hccc.cli import main
    f = tmp_path / "p.json"
    f.write_text(plan_text(export_plan(build_algorithm_level(_alg("hm_allgather_2x4")), nodes=node_map(8, 4))))
    assert main(["sim", str(f), "--topology", str(EX / "clusters" / "a100_topo1.topo"), "--sizes", "1M"]) == 0
    assert "1048576" in capsys.readouterr().out


@pytest.mark.slow
def test_run_executes_a_plan_in_cpu_emulation(tmp_path, capsys):
    """hccc run: the imported plan compiled into kernels, run in CPU emulation, every element checked."""
    from hccc.cli import main
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan_forwarded_packets_allgather()))
    assert main(["run", str(f), "--sizes", "64K", "-n", "1", "-w", "0"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out


def _packet_reduce_allreduce(piped):
    """2 ranks, LL, in place: each puts its input as packets into the peer's scratch and reduces the
    peer's packets into its input (``repkt``), in a pipeline of 16-byte units when ``piped``."""
    from mscclpp_plans import NOP, buf, gpu_entry, mem_buffer_refs, plan_obj, remote_buf
    gpus = []
    for r in range(2):
        red = {"name": "repkt", "src_buff": [buf("i", 0), buf("s", 0)], "dst_buff": [buf("i", 0)], "reduce_op": "sum"}
        ops = [{"name": "ppkt", "src_buff": [buf("i", 0)], "dst_buff": [remote_buf(0, 0)], "channel_type": "memory"},
               NOP, {"name": "pipeline", "iter_context": {"unit_size": 16, "num_chunks": 1}, "ops": [red]}
               if piped else red]
        gpus.append(gpu_entry(r, 1, 1, 1, [], [{"rank": 1 - r, "type": "s", "access_channel_types": ["memory"]}],
                              [{"id": 0, "ops": ops, "remote_buffer_refs": mem_buffer_refs([0])}]))
    return plan_obj("allreduce", gpus, proto="LL", inplace=True)


def test_a_packet_operation_in_a_pipeline_is_refused_it_runs_whole_in_every_iteration():
    """The kernel calls the packet handlers without the iteration's offset: an in-place reduction
    of packets in a pipeline of two iterations adds the peer's packets twice (the interpreter, which
    runs it as the kernel does); the import refuses it, located, naming the executor's lines."""
    from mscclpp_interp import InterpError
    from mscclpp_plans import refused
    plain = _packet_reduce_allreduce(False)
    import_plan_text(json.dumps(plain), "plain.json")
    check_plan(plain, 2, runs=1)
    piped = _packet_reduce_allreduce(True)
    msg, line = refused(piped)
    assert "'repkt' inside a pipeline" in msg and "execution_kernel.hpp:742-768" in msg and '"repkt"' in line
    check_plan(piped, 1, runs=1)                  # one iteration: the same
    with pytest.raises(InterpError, match="wrong"):
        check_plan(piped, 2, runs=1)              # two: the packets reduced twice
