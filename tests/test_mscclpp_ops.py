"""MSCCL++ plan operations as values (compiler/interop/mscclpp_ops.py): every operation kind the
operand table names survives ``from_dict(to_dict(op))``; ``to_dict`` writes the keys in the order
hccc's plans have always had (checked against hand-written operation objects and, key order
included, on every operation of a real exported plan); a dict missing an operand is refused at its
location."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.interop.mscclpp_export import export_plan, plan_text
from hccc.compiler.interop.mscclpp_operands import CHANNEL_TYPES, OPERANDS
from hccc.compiler.interop.mscclpp_ops import BufRef, PlanOp, PlanOpError, local, remote
from hccc.compiler.interop.mscclpp_plan import MAX_DEVICE_SYNCERS
from hccc.compiler.interop.mscclpp_switch import SWITCH_OPS
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_algorithm
from mscclpp_plans import corpus

EX = Path(__file__).resolve().parent.parent / "examples"

KINDS = sorted(k for k, v in OPERANDS.items() if not v.body)
small = st.integers(0, 1 << 20)
ids = st.lists(st.integers(0, 15), min_size=1, max_size=4).map(tuple)
#: a signal, wait or flush names each channel once (thread t works on the t-th)
sync_ids = st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True).map(tuple)
ref = st.one_of(st.builds(local, st.sampled_from("ios"), small, st.integers(1, 1 << 20)),
                st.builds(remote, st.integers(0, 7), small, st.integers(1, 1 << 20)))


@st.composite
def plan_ops(draw, name):
    need = OPERANDS[name]
    kw = {}
    if need.src or draw(st.booleans()) and need.dst:
        kw["src"] = tuple(draw(st.lists(ref, min_size=need.src, max_size=need.src + 2)))
    if need.dst or "src" in kw:
        kw["dst"] = tuple(draw(st.lists(ref, min_size=need.dst, max_size=need.dst + 2)))
    if need.channels or (need.src and draw(st.booleans())):
        kw["channel_ids"] = draw(sync_ids if need.channels else ids)
        kw["channel_type"] = draw(st.sampled_from(CHANNEL_TYPES))
    if need.semaphores:
        kw["semaphore_ids"] = draw(ids)
    if need.barrier:
        kw["barrier_id"] = draw(st.integers(0, MAX_DEVICE_SYNCERS - 1))
        kw["num_threadblocks"] = draw(st.integers(1, 64))
    if need.src and draw(st.booleans()):
        size = draw(st.integers(1, 8))
        kw["tbg"] = (draw(st.integers(0, size - 1)), size)
    return PlanOp(name, **kw)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=examples(15))
@given(data=st.data())
def test_round_trip(kind, data):
    """Every single-operation kind, over its operands: the dict (through JSON) reads back to the
    same operation, and writing that again gives the same keys in the same order."""
    op = data.draw(plan_ops(kind))
    d = op.to_dict()
    assert PlanOp.from_dict(json.loads(json.dumps(d))) == op
    assert list(PlanOp.from_dict(d).to_dict().items()) == list(d.items())


# operation objects as the plans hccc has written have them, key order included
HAND = [
    (PlanOp("nop"), '{"name": "nop"}'),
    (PlanOp("signal", channel_ids=(0, 2), channel_type="memory"),
     '{"name": "signal", "channel_ids": [0, 2], "channel_type": "memory"}'),
    (PlanOp("sem_acquire", semaphore_ids=(3,)), '{"name": "sem_acquire", "semaphore_ids": [3]}'),
    (PlanOp("copy", src=(local("s", 4, 2),), dst=(local("o", 0, 2),)),
     '{"name": "copy", "src_buff": [{"type": "s", "index": 4, "size": 2}], '
     '"dst_buff": [{"type": "o", "index": 0, "size": 2}]}'),
    (PlanOp("pwsf", src=(local("i", 1, 1),), dst=(remote(0, 5, 1),), channel_type="port", channel_ids=(1,)),
     '{"name": "pwsf", "src_buff": [{"type": "i", "index": 1, "size": 1}], '
     '"dst_buff": [{"buffer_id": 0, "index": 5, "size": 1}], "channel_type": "port", "channel_ids": [1]}'),
    (PlanOp("barrier", barrier_id=1, num_threadblocks=4),
     '{"name": "barrier", "barrier_id": 1, "num_threadblocks": 4}'),
]


@pytest.mark.parametrize("op,text", HAND, ids=[t[0].name for t in HAND])
def test_to_dict_text(op, text):
    assert json.dumps(op.to_dict()) == text
    assert PlanOp.from_dict(json.loads(text)) == op


def test_exported_plan_operations_round_trip():
    """Every operation of an exported plan (Simple and LL) reads back and writes the same object."""
    ir = build_program(load_algorithm(EX / "ring_allreduce_8.rccl"))
    names = set()
    for proto in ("Simple", "LL"):
        plan = export_plan(ir, protocol=proto)
        for g in plan["gpus"]:
            for tb in g["threadblocks"]:
                for op in tb["ops"]:
                    names.add(op["name"])
                    assert list(PlanOp.from_dict(op).to_dict().items()) == list(op.items())
    assert {"put", "signal", "wait", "copy", "ppkt"} <= names


def _through_ops(ops: list) -> list:
    """Every operation read into a PlanOp and written back (a pipeline's body, the importer reads it
    operation by operation); switch operations, which the importer rewrites into memory-channel
    PlanOps instead (mscclpp_switch), as they are."""
    return [dict(o, ops=_through_ops(o["ops"])) if o["name"] == "pipeline" else
            o if o["name"] in SWITCH_OPS else PlanOp.from_dict(o).to_dict() for o in ops]


def test_every_corpus_plan_is_byte_identical_through_its_operations():
    """Each plan of the corpus (hand-written in the DSL's styles, thread-block groups and pipelines
    among them, and exported ones, LL included), every operation read as the importer reads it and
    written again: the same text, byte for byte."""
    exported = 0
    for text in corpus():
        plan = json.loads(text)
        for g in plan["gpus"]:
            for tb in g["threadblocks"]:
                tb["ops"] = _through_ops(tb["ops"])
        written = '"gpus": [\n' in text          # plan_text's layout: an exported plan
        exported += written
        assert (plan_text(plan) if written else json.dumps(plan)) == text, plan["name"]
    assert exported >= 4


def _located(d):
    where = []

    def err(path, msg):
        where.append(path)
        return PlanOpError(msg)
    with pytest.raises(PlanOpError) as exc:
        PlanOp.from_dict(d, ("ops", 3), err)
    return where[0], str(exc.value)


@pytest.mark.parametrize("kind", [k for k in KINDS if OPERANDS[k].src or OPERANDS[k].channels
                                  or OPERANDS[k].semaphores or OPERANDS[k].barrier])
def test_missing_operand_refused_located(kind):
    need = OPERANDS[kind]
    full = PlanOp(kind, src=(local("i", 0, 1),) * need.src or None, dst=(local("o", 0, 1),) * need.dst or None,
                  channel_ids=(0,) if need.channels else None, channel_type="memory" if need.channels else None,
                  semaphore_ids=(0,) if need.semaphores else None, barrier_id=0 if need.barrier else None,
                  num_threadblocks=1 if need.barrier else None).to_dict()
    PlanOp.from_dict(full)
    for key in [k for k in full if k != "name"]:
        d = {k: v for k, v in full.items() if k != key}
        path, msg = _located(d)
        assert path[:2] == ("ops", 3)
        assert f"'{kind}'" in msg


def test_unknown_name_and_bad_reference_located():
    path, msg = _located({"name": "jump"})
    assert path == ("ops", 3, "name") and msg == "invalid operation type 'jump'"
    path, msg = _located({"name": "copy", "src_buff": [{"type": "i", "index": 0}],
                          "dst_buff": [{"type": "o", "index": 0, "size": 1}]})
    assert path == ("ops", 3, "src_buff", 0) and "integer 'index' and 'size'" in msg


def test_pipeline_is_not_a_single_operation():
    with pytest.raises(ValueError):
        PlanOp("pipeline")
    assert BufRef(0, 1, type="s").to_dict() == {"type": "s", "index": 0, "size": 1}
