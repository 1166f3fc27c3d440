"""``hccc fuzz`` and :func:`hccc.testing.fuzz_kernels`: random cases through the emitted kernels,
failures shrunk to a minimal case with a command that reproduces it."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import hccc.testing as ht
from hccc.cli import main
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.ir.program_ir import Buf, Op
from codegen_irs import stuck_ir

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.fixture(autouse=True)
def quick_builds(monkeypatch):
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")


def test_fuzz_an_example_passes(capsys):
    # one operator: a kernel build for each (dtype, op) drawn; every operator is the kernel tests'
    rc = main(["fuzz", f"{REPO}/examples/ring_reducescatter_8.rccl", "--examples", "8", "--seed", "3",
               "--dtypes", "int32,float16", "--ops", "max", "--json"])
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True
    assert doc["cases"] == 9                      # the smoke run and 8 random cases
    assert doc["chunk_bytes"] == 256 and set(doc["dtypes"]) <= {"int32", "float16"} and doc["ops"] == ["max"]


def test_fuzz_text_summary(capsys, tmp_path):
    algo = tmp_path / "ag.rccl"
    algo.write_text(gen.ring_allgather_rccl(3, name="ag3"))
    rc = main(["fuzz", str(algo), "--examples", "5", "--ops", "sum", "--dtypes", "int32"])   # one build
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("hccc fuzz: ag3: 6 cases passed")


def test_fuzz_reports_a_stuck_program_at_once(capsys, tmp_path):
    p = tmp_path / "stuck.json"
    ir = stuck_ir(copies=False)
    ir.chunk_bytes = 64
    p.write_text(ir.to_json())
    rc = main(["fuzz", str(p), "--timeout", "0.3"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED after 1 case;" in out and "stuck in recv" in out
    assert "reproduce: hccc run " in out and "--chunk-size" not in out   # an IR keeps its chunks


@pytest.mark.slow   # hypothesis shrinking runs the kernels dozens of times
def test_failures_are_shrunk_to_a_minimal_case(monkeypatch):
    """A (simulated) kernel bug that appears from 100 int32 elements on: hypothesis shrinks the
    failing case to the simplest operator, out-of-place, one thread, and a size at (or, when the
    first failure drew an edge size, near) the threshold, never above the first failure found."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    real = ht.run_case

    def buggy(ir_, case, *a, **k):
        res = real(ir_, case, *a, **k)
        if case.dtype == "int32" and case.count >= 100:
            res = dataclasses.replace(res, wrong=1, first_wrong="rank 0, output element 0: injected")
        return res

    monkeypatch.setattr(ht, "run_case", buggy)
    rep = ht.fuzz_kernels(ir, examples=60, seed=1, dtypes=["float32", "int32"])
    assert not rep.ok
    case, msg = rep.failure
    assert (case.dtype, case.op, case.inplace, case.nthreads) == ("int32", "sum", False, 1)
    first = next(c for c, r in rep.cases if not r.ok)
    assert 100 <= case.count <= min(first.count, 128)     # 128: 2 slices per chunk, an edge size
    assert "1 element differs" in msg and "injected" in msg


def test_fuzz_reports_a_program_that_is_not_its_collective(capsys, tmp_path):
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    i = [k for k in range(ir.nprims) if ir.prims["op"][k] == Op.RECV_REDUCE_COPY][0]
    ir.prims["op"][i] = Op.RECV
    ir.prims["src_buf"][i] = Buf.NONE
    ir.prims["src_off"][i] = 0
    p = tmp_path / "bad.json"
    p.write_text(ir.to_json())
    rc = main(["fuzz", str(p), "--examples", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and not doc["ok"]
    assert "does not implement allreduce" in doc["failure"]["message"]
    assert doc["failure"]["repro"].startswith("hccc run ")


def test_fuzz_runs_an_algorithm_level_msccl_import(capsys):
    """An MSCCL import proven only in MSCCL's algorithm-level order is fuzzed with one micro-batch
    per chunk (any more and the kernels' task-level order may deadlock it); slices vary otherwise.
    Two element sizes and one operator (a kernel build each): the micro-batches depend on the sizes
    in bytes, not on the operator. Four cases: test_msccl_import's samples run this and the other
    MSCCL samples at a size the slice would otherwise cut into many micro-batches."""
    xml = Path(__file__).resolve().parent.parent / "examples" / "msccl" / "allreduce_ring_4.xml"
    assert main(["fuzz", str(xml), "--examples", "4", "--dtypes", "int32,float16", "--ops", "sum"]) == 0
    assert "cases passed" in capsys.readouterr().out
