"""MSCCL++ execution plans written by hccc, run by an independent interpreter of the format
(tests/mscclpp_interp.py: the executor's load-time checks and kernel semantics on numpy buffers)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from mscclpp_interp import InterpError, check_load, check_plan
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_summary, plan_text
from hccc.compiler.interop.mscclpp_plan import PlanLimits
from hccc.compiler.passes.build import build_algorithm_level, build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.pipeline import load_algorithm
from hccc.testing import valid_programs

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
SMALL = ["ring_allreduce_8", "ring_allgather_8", "ring_reducescatter_8", "ring_alltoall_6",
         "recursive_doubling_allgather_8", "direct_allgather_8", "direct_alltoall_8", "hm_allreduce_2x4",
         "hm_allgather_2x4", "hierarchical_alltoall_2x4"]
LARGE = ["hm_allreduce_2x8", "hm_allgather_2x8", "hm_allreduce_4x4", "hm_allgather_4x4", "hm_allreduce_4x8",
         "hm_allgather_4x8", "hierarchical_alltoall_2x8"]


def _alg(name):
    a = load_algorithm(EX / f"{name}.rccl")
    verify(a)
    return a


def _nodes(a, ir):
    return node_map(ir.nranks, a.header.gpu_per_node)


VARIANTS = [dict(), dict(inplace=True), dict(protocol="LL"), dict(instances=2), dict(micro_batches=2)]


def _run_variants(a, ir, mults=(1, 3)):
    for kw in VARIANTS:
        nodes = None if kw.get("protocol") == "LL" else _nodes(a, ir)
        plan = export_plan(ir, nodes=nodes, **kw)
        plan = json.loads(plan_text(plan))          # what is written is what runs
        for m in mults:
            check_plan(plan, m, seed=m, runs=1 if kw.get("inplace") else 2)


# the 6-rank ring AllToAll (a second and a half of CPU) in the slow set: the default set's relaying
# AllToAll is hierarchical_alltoall_2x4, and random AllToAll programs (rings of up to six ranks among
# them) run in test_random_programs_compute_their_collective
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "ring_alltoall_6" else n
                                  for n in SMALL])
def test_examples_compute_their_collective(name):
    a = _alg(name)
    _run_variants(a, build_program(a), mults=(3,))
    _run_variants(a, build_algorithm_level(a), mults=(1,))


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large_examples_compute_their_collective(name):
    a = _alg(name)
    _run_variants(a, build_program(a), mults=(1,))


def test_cross_node_connections_are_port_channels_and_intra_node_memory():
    a = _alg("hm_allreduce_2x4")
    ir = build_program(a)
    plan = export_plan(ir, nodes=_nodes(a, ir))
    gpn = a.header.gpu_per_node
    seen = set()
    for g in plan["gpus"]:
        for ch in g["channels"]:
            for p in ch["connected_to"]:
                same = p // gpn == g["id"] // gpn
                assert ch["channel_type"] == ("memory" if same else "port")
                seen.add(ch["channel_type"])
        names = {op["name"] for tb in g["threadblocks"] for op in tb["ops"]}
        assert "re" in names
    assert seen == {"memory", "port"}
    one_node = export_plan(ir)
    assert {ch["channel_type"] for g in one_node["gpus"] for ch in g["channels"]} == {"memory"}


def test_dependencies_become_semaphores_and_long_blocks_are_chained():
    a = _alg("ring_allreduce_8")
    ir = build_algorithm_level(a)
    lim = PlanLimits(max_operations=16)
    plan = export_plan(ir, limits=lim)
    assert max(len(tb["ops"]) for g in plan["gpus"] for tb in g["threadblocks"]) <= 16
    assert any(g["semaphores"] for g in plan["gpus"])
    check_plan(plan, 2)
    with pytest.raises(InterpError, match="MAX_OPERATION"):
        check_load(export_plan(ir, limits=PlanLimits(max_operations=200)), 16 * 8 * 2, 16 * 8 * 2)


def test_limits_are_refused_up_front_naming_the_limit():
    a = _alg("hm_allreduce_2x4")
    ir = build_program(a)
    with pytest.raises(CompileError, match=r"at most 3 can be resident"):
        export_plan(ir, limits=PlanLimits(max_tbs=3))
    plan = export_plan(ir)
    with pytest.raises(CompileError, match=rf"largest message this plan can serve is {plan['max_message_size']}"):
        export_plan(ir, max_bytes=plan["max_message_size"] + 1)
    with pytest.raises(CompileError, match="port channel"):
        export_plan(ir, nodes=_nodes(a, ir), protocol="LL")
    with pytest.raises(CompileError, match="collective 'broadcast'"):
        export_plan(build_program(_alg("ring_broadcast_8")))


def test_largest_size_is_the_32_bit_bound():
    a = _alg("ring_allreduce_8")
    ir = build_program(a)
    plan = export_plan(ir)
    g = plan["gpus"][0]
    hi = plan["max_message_size"]
    chunk = hi // g["input_chunks"]
    ends = max(x["scratch_chunks"] for x in plan["gpus"])
    assert chunk * max(ends, g["input_chunks"]) <= (1 << 32) - 1
    assert (chunk + 16) * max(ends, g["input_chunks"]) > (1 << 32) - 1
    check_load(plan, hi, hi)
    with pytest.raises(InterpError, match="range"):
        check_load(plan, hi + 16 * g["input_chunks"], hi + 16 * g["input_chunks"])


def test_the_interpreter_catches_broken_plans():
    ir = build_program(_alg("ring_allreduce_8"))
    plan = export_plan(ir)
    check_plan(plan, 1)
    # a missing wait: the receiver reads its slot before the data is there (or deadlocks later)
    bad = copy.deepcopy(plan)
    for tb in bad["gpus"][3]["threadblocks"]:
        ops = tb["ops"]
        k = next((i for i, op in enumerate(ops) if op["name"] == "wait" and i > 2), None)
        if k is not None:
            del ops[k:k + 2]
            break
    with pytest.raises(InterpError):
        for seed in range(4):
            check_plan(bad, 1, seed=seed)
    # a missing nop between a wait and the data operation after it
    bad = copy.deepcopy(plan)
    tb = next(tb for tb in bad["gpus"][0]["threadblocks"] if any(op["name"] == "wait" for op in tb["ops"][2:]))
    k = next(i for i, op in enumerate(tb["ops"]) if op["name"] == "wait" and i > 2)
    assert tb["ops"][k + 1]["name"] == "nop"
    del tb["ops"][k + 1]
    with pytest.raises(InterpError, match="no nop"):
        check_plan(bad, 1)
    # a wrong chunk index
    bad = copy.deepcopy(plan)
    op = next(op for tb in bad["gpus"][5]["threadblocks"] for op in tb["ops"] if op["name"] == "re")
    op["dst_buff"][0]["index"] = (op["dst_buff"][0]["index"] + 1) % bad["gpus"][5]["output_chunks"]
    with pytest.raises(InterpError):
        check_plan(bad, 1)


def test_plan_text_is_deterministic_json():
    ir = build_program(_alg("hm_allgather_2x4"))
    a, b = plan_text(export_plan(ir)), plan_text(export_plan(ir))
    assert a == b
    doc = json.loads(a)
    assert doc["gpus"][1]["id"] == 1 and doc["protocol"] == "Simple" and doc["inplace"] is False
    s = plan_summary(doc)
    assert s["tbs"] == sum(len(g["threadblocks"]) for g in doc["gpus"]) and s["ops"] > s["nops"] > 0


COLLS = ["allgather", "allreduce", "reducescatter", "alltoall"]


@settings(max_examples=examples(25))
@given(alg=valid_programs(COLLS, max_ranks=6), kw=st.sampled_from(VARIANTS),
       level=st.booleans(), mult=st.integers(1, 5), seed=st.integers(0, 3))
def test_random_programs_compute_their_collective(alg, kw, level, mult, seed):
    ir = build_algorithm_level(alg) if level and "micro_batches" not in kw else build_program(alg)
    plan = export_plan(ir, **kw)
    check_plan(plan, mult, seed=seed, runs=1 if kw.get("inplace") else 2)


@settings(max_examples=examples(10))
@given(alg=valid_programs(COLLS, max_ranks=6), gpn=st.integers(1, 3))
def test_random_programs_across_nodes(alg, gpn):
    ir = build_program(alg)
    check_plan(export_plan(ir, nodes=node_map(ir.nranks, gpn)), 2)


def test_plan_command_and_outdir(tmp_path, capsys):
    from hccc.cli import main
    out = tmp_path / "p.json"
    assert main(["plan", str(EX / "hm_allreduce_2x4.rccl"), "-o", str(out), "--instances", "2",
                 "--max-bytes", "1M"]) == 0
    plan = json.loads(out.read_text())
    assert plan["max_message_size"] == 1 << 20 and plan["gpus"][0]["input_chunks"] == 2 * 8
    assert {ch["channel_type"] for g in plan["gpus"] for ch in g["channels"]} == {"memory", "port"}
    assert "hccc: wrote" in capsys.readouterr().out
    check_plan(plan, 1)
    assert main(["plan", str(EX / "hm_allreduce_2x4.rccl"), "-o", str(out), "--proto", "LL"]) == 1
    assert "port channel" in capsys.readouterr().err
    assert json.loads(out.read_text()) == plan          # a refused export leaves the file as it was
    outdir = tmp_path / "od"
    assert main([str(EX / "ring_allgather_8.rccl"), "-o", str(outdir)]) == 0
    man = json.loads((outdir / "manifest.json").read_text())
    assert man["mscclpp_plan"] == "ring_allgather_8.mscclpp.json"
    check_plan(json.loads((outdir / man["mscclpp_plan"]).read_text()), 2)


def test_micro_batches_unroll_the_task_level_pipeline():
    """Each primitive for every micro-batch before the next, and a dependency per micro-batch: a
    forwarding block may put part 0 on while part 1 still arrives."""
    ir = build_program(_alg("ring_allgather_8"))
    one, three = export_plan(ir), export_plan(ir, micro_batches=3)
    assert three["gpus"][0]["input_chunks"] == 3 * ir.in_chunks
    deps1 = sum(len(g["semaphores"]) for g in one["gpus"])
    assert deps1 > 0 and sum(len(g["semaphores"]) for g in three["gpus"]) >= 3 * deps1
    check_plan(three, 1)
    check_plan(three, 2, seed=1)
