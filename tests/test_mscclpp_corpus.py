"""MSCCL++'s own plans, as its DSL writes them (``tests/mscclpp_corpus``, written by its
``generate.py`` from an MSCCL++ checkout): every test program of the DSL at 2, 4 and 8 GPUs and
across nodes, the plans ``python -m mscclpp --install`` installs, and its multi-node builders.

Each plan of a collective hccc has is imported (proven on the way in), computes its collective in
hccc's reference executor, and runs right in the independent interpreter of the plan
(``mscclpp_interp``: it executes the JSON as MSCCL++'s executor does, not hccc's IR), out of place
twice in a row where the plan is out of place. What is refused is refused for a reason no executor
of hccc's could carry out, and the reason is the one listed here."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from mscclpp_interp import check_plan
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.runtime.reference import execute, expected_for, inputs_for
from hccc.util.diagnostics import CompileError

CORPUS = Path(__file__).resolve().parent / "mscclpp_corpus"
INDEX = json.loads((CORPUS / "index.json").read_text())
FILES = sorted(e["file"] for e in INDEX["plans"] if "file" in e)

#: what hccc refuses among MSCCL++'s plans, and the reason it gives: the DSL's unit tests are
#: operation tests (collective ``test``: no collective to compute; the switch unit tests among
#: them). Plans over switch (NVLS) channels are imported like the others (their multimem
#: operations read as memory-channel ones), and ``sendrecv`` plans as hccc's SendRecv
REFUSED = {"test": "unsupported collective 'test'"}
#: how many plans of the corpus each reason refuses, and how many are imported
COUNTS = {"test": 37, "imported": 67}
#: the SendRecv plans' shift, from the DSL program's arguments (``--split_mask``, 0 unless given:
#: each rank sends to the rank ``split_mask + 1`` after it), the interpreter's oracle
SENDRECV_SHIFT = {e["file"]: int(dict(zip(e["arguments"][::2], e["arguments"][1::2])).get("--split_mask", "0"), 0) + 1
                  for e in INDEX["plans"] if "file" in e and e["program"].endswith("send_recv")}
#: a plan this large (JSON bytes) or this wide (ranks) runs in the slow set: its import and
#: interpretation take 1-4 s on 2 cores (the 8-GPU ring AllToAlls, the 4-node installed AllReduce)
SLOW_BYTES, SLOW_RANKS = 300_000, 32
#: the interpreter's size multiple: whole parts for thread-block groups of up to 4 blocks
GROUP_PARTS = 4


def _refusal(plan: dict) -> str | None:
    return REFUSED.get(plan["collective"])


def _size_multiple(plan: dict) -> int:
    """The least multiple of GROUP_PARTS whose input size lies in the plan's message-size range."""
    g = plan["gpus"][0]
    unit = plan.get("buffer_alignment", 16) * max(g["input_chunks"], 1) * GROUP_PARTS
    return GROUP_PARTS * max(1, -(-int(plan.get("min_message_size", 0)) // unit))


def test_the_corpus_covers_every_kind_of_plan_the_dsl_writes_and_the_counts_are_documented():
    plans = [json.loads((CORPUS / f).read_text()) for f in FILES]
    assert len(plans) >= 90
    kinds = {(p["collective"], p["protocol"], p["inplace"]) for p in plans}
    for coll in ("allgather", "allreduce", "reducescatter", "alltoall"):
        assert {k[1] for k in kinds if k[0] == coll} >= {"Simple", "LL"} or coll == "alltoall", coll
    assert any(p["reuse_resources"] for p in plans)
    assert any("tbg_info" in o for p in plans for g in p["gpus"] for tb in g["threadblocks"] for o in tb["ops"])
    assert {len(p["gpus"]) for p in plans} >= {2, 4, 8, 16, 32}
    switch = [p for p in plans if _switch(p)]
    assert {(p["collective"], p["protocol"]) for p in switch} >= {("allgather", "Simple"), ("allgather", "LL"),
                                                                  ("allreduce", "Simple"), ("test", "Simple")}
    # the counts of imported and refused plans are the documented ones
    got = {"imported": sum(_refusal(p) is None for p in plans)}
    got.update({k: sum(p["collective"] == k for p in plans) for k in REFUSED})
    assert got == COUNTS
    doc = " ".join((CORPUS.parents[1] / "docs" / "mscclpp.md").read_text().split())
    assert f"the {COUNTS['imported']} plans of a collective hccc has" in doc
    assert f"the {COUNTS['test']} unit tests" in doc
    assert len(SENDRECV_SHIFT) == sum(p["collective"] == "sendrecv" for p in plans) >= 4
    assert set(SENDRECV_SHIFT.values()) >= {1, 2, 4}


@functools.lru_cache(maxsize=None)
def _facts(name: str) -> tuple[int, str, bool]:
    """(ranks, collective, in place) of a plan of the corpus, read once per test process: three
    parametrisations choose their plans by them while tests are collected (each pytest-xdist
    worker collects them all; the corpus is 6 MB of JSON)."""
    plan = json.loads((CORPUS / name).read_text())
    return len(plan["gpus"]), plan["collective"], bool(plan["inplace"])


def _cases(names):
    out = []
    for n in names:
        slow = (CORPUS / n).stat().st_size > SLOW_BYTES or _facts(n)[0] >= SLOW_RANKS
        out.append(pytest.param(n, marks=[pytest.mark.slow] if slow else [], id=n))
    return out


@pytest.mark.parametrize("name", _cases(FILES))
def test_a_plan_of_mscclpps_is_proven_and_runs_right_or_refused_for_its_reason(name):
    text = (CORPUS / name).read_text()
    plan = json.loads(text)
    why = _refusal(plan)
    if why is not None:
        with pytest.raises(CompileError) as exc:
            import_plan_text(text, name)
        assert why in exc.value.diagnostics[0].message
        return
    ir = import_plan_text(text, name)
    assert ir.nranks == len(plan["gpus"]) and ir.collective == plan["collective"]
    shift = SENDRECV_SHIFT.get(name, 1)
    if ir.collective == "sendrecv":     # the shift the import read from the data flow: MSCCL++'s
        assert ir.root == shift         # verifier's (receive from rank r - split_mask - 1)
    # hccc's reference executor on the imported program, as the plan places its buffers
    ins = inputs_for(ir, ir.nchunks * ir.nranks * 2, "float32", seed=1)
    outs = execute(ir, [x.copy() for x in ins], inplace=plan["inplace"])
    for r, (o, w) in enumerate(zip(outs, expected_for(ir, ins))):
        if w is not None:
            np.testing.assert_array_equal(o, w, err_msg=f"{name}: rank {r}")
    # the plan itself in the interpreter: calls in a row where its buffers allow, each end rank
    # in turn running its calls ahead of the others (no write of a later call into scratch a peer
    # still reads for an earlier one)
    mult = _size_multiple(plan)
    check_plan(plan, mult, runs=1 if plan["inplace"] else 2, shift=shift)
    if not plan["inplace"] or _switch(plan):
        # (in place, each call on what the one before left: the NVLS plans here; every in-place
        # plan of a collective where that is defined in the slow set)
        for ahead in (0, len(plan["gpus"]) - 1):
            check_plan(plan, mult, runs=3, eager=ahead, seed=ahead, shift=shift)


def _switch(plan) -> bool:
    return any(c["channel_type"] == "switch" for g in plan["gpus"] for c in g["channels"])


def _calls_in_place_defined(name) -> bool:
    """An imported in-place plan whose calls in a row have a defined result (not a ReduceScatter,
    which may leave anything in the rest of its input)."""
    _, collective, inplace = _facts(name)
    return collective not in REFUSED and inplace and collective != "reducescatter"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FILES if _calls_in_place_defined(n)])
def test_an_in_place_plan_of_mscclpps_runs_right_call_after_call(name):
    """Three in-place calls in a row, each on what the one before left, with the first or the
    last rank running its calls ahead: no call reaches into one a peer has not finished."""
    plan = json.loads((CORPUS / name).read_text())
    for ahead in (0, len(plan["gpus"]) - 1):
        check_plan(plan, _size_multiple(plan), runs=3, eager=ahead, seed=ahead)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in FILES if _facts(n)[1] not in REFUSED])
def test_a_plan_of_mscclpps_runs_right_on_hcccs_kernels_in_cpu_emulation(name, tmp_path, capsys, monkeypatch):
    """``hccc run`` of the plan file: hccc's kernels, every rank in one process, the plan's own
    placement, at a size inside its message-size range."""
    from hccc.cli import main
    plan = json.loads((CORPUS / name).read_text())
    g = plan["gpus"][0]
    size = plan.get("buffer_alignment", 16) * max(g["input_chunks"], 1) * _size_multiple(plan)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(CORPUS / name), "--sizes", str(size), "-n", "1", "-w", "0"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out
