"""The ``.rccl`` evaluator is bounded by its total work, not only by loop iterations: nested loops
whose iterations stay under the iteration limit but would run for hours are refused, located at
the construct that would exceed the budget, in about a second; the same holds where a catalog
reads a program."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import parse_rccl
from hccc.compiler.frontend.eval_budget import DEFAULT_MAX_WORK, STATEMENT_COST
from hccc.util.diagnostics import CompileError, render_all

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "direct_allgather_8.rccl"
HCCC = [sys.executable, "-m", "hccc.cli"]
#: a refusal needs the interpreter's start-up and about a second of evaluation; the old evaluator
#: ran the programs below for minutes to hours. This is the hang guard, not a timing claim.
GUARD_S = 40
H = ('def ResCCLAlgo(nRanks=8, nChannels=1, nWarps=16, AlgoName="w", OpType="Allgather", '
     'GPUPerNode=8, NICPerNode=1):\n')
#: seven lines: 10**8 iterations of a carried counter (under the 10**8 + 10**4 iteration limit
#: only by the outer loop's count; each one a Python-level step)
NESTED_SEQUENTIAL = H + ("    s = 0\n"
                         "    for i in range(10000):\n"
                         "        for j in range(9999):\n"
                         "            s = s + 1\n"
                         "    transfer(0, 1, 0, 0, recv)\n")
#: vectorised rows: 9000 * 9000 expanded rows, several operations each
NESTED_EXPANDED = H + ("    for i in range(9000):\n"
                       "        for j in range(9000):\n"
                       "            x = i * j + 3\n"
                       "            y = x % 7 + j\n"
                       "    transfer(0, 1, 0, 0, recv)\n")
WORK = re.compile(r"^\S+\.rccl:(\d+):(\d+): error: evaluation work limit exceeded", re.M)


def _cli(*args, env=None):
    r = subprocess.run([*HCCC, *map(str, args)], capture_output=True, text=True, timeout=GUARD_S,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, HCCC_DEBUG="", **(env or {})))
    return r.returncode, r.stderr + r.stdout


def test_work_bound_refuses_nested_sequential_loops(tmp_path):
    """The default budget, end to end: a located error (at the inner loop), exit 1."""
    p = tmp_path / "nested.rccl"
    p.write_text(NESTED_SEQUENTIAL)
    code, out = _cli("check", p)
    assert code == 1, out
    m = WORK.search(out)
    assert m and int(m.group(1)) in (4, 5), out
    assert "Traceback" not in out and "HCCC_MAX_RCCL_WORK" in out


def test_work_bound_refuses_nested_expanded_loops():
    t0 = time.process_time()
    with pytest.raises(CompileError) as ei:
        parse_rccl(NESTED_EXPANDED, "nested.rccl")
    assert time.process_time() - t0 < 4.0
    m = WORK.search(render_all(ei.value))
    assert m and int(m.group(1)) in (3, 4, 5), render_all(ei.value)


def test_work_bound_applies_in_catalogs(tmp_path):
    d = tmp_path / "cat"
    d.mkdir()
    (d / "nested.rccl").write_text(NESTED_SEQUENTIAL)
    code, out = _cli("catalog", d, env={"HCCC_MAX_RCCL_WORK": "10000000"})
    assert code == 1 and WORK.search(out), out


def test_budget_from_environment(monkeypatch):
    text = EXAMPLE.read_text()
    assert parse_rccl(text, "small.rccl").ntransfers > 0
    monkeypatch.setenv("HCCC_MAX_RCCL_WORK", "10")
    with pytest.raises(CompileError) as ei:
        parse_rccl(text, "small.rccl")
    assert WORK.search(render_all(ei.value)), render_all(ei.value)
    monkeypatch.setenv("HCCC_MAX_RCCL_WORK", "lots")
    with pytest.raises(CompileError, match="HCCC_MAX_RCCL_WORK must be"):
        parse_rccl(text, "small.rccl")


def test_examples_fit_well_inside_the_budget():
    """The shipped programs (the largest, the C2C ones, need about 2.4 * 10**5 units) are far from
    the default budget, so it refuses only runaway programs."""
    root = Path(__file__).resolve().parents[1] / "examples"
    from hccc.compiler.frontend import evaluator as ev
    from hccc.compiler.frontend.rccl_parser import parse_program
    from hccc.util.diagnostics import SourceFile
    for f in sorted(root.rglob("*.rccl")):
        ev.evaluate(parse_program(SourceFile.read(f)), max_work=DEFAULT_MAX_WORK // 100)


_PROGRAM = st.builds(
    lambda outer, inner, carried: H + (
        "    s = 0\n" if carried else "") + f"    for i in range({outer}):\n" + (
        f"        for j in range({inner}):\n" + ("            s = s + j\n" if carried else "            x = i + j\n")
        + "        transfer(i % 8, (i + 1) % 8, 0, i % 8, recv)\n"),
    st.integers(0, 30), st.integers(0, 30), st.booleans())


@settings(max_examples=40)
@given(text=_PROGRAM, budget=st.integers(1, 60 * STATEMENT_COST))
def test_a_budget_either_holds_the_program_or_refuses_it(text, budget):
    """Under any budget the result is either the unbounded result or the work error (never a
    different result), and a budget that suffices keeps sufficing when it grows."""
    full = parse_rccl(text, "p.rccl")
    try:
        got = _eval(text, budget)
    except CompileError as exc:
        assert "evaluation work limit exceeded" in render_all(exc)
        return
    assert got.src.tolist() == full.src.tolist() and got.dst.tolist() == full.dst.tolist()
    assert _eval(text, budget * 2).src.tolist() == full.src.tolist()


def _eval(text: str, budget: int):
    from hccc.compiler.frontend.evaluator import evaluate
    from hccc.compiler.frontend.rccl_parser import parse_program
    from hccc.util.diagnostics import SourceFile
    return evaluate(parse_program(SourceFile("p.rccl", text)), max_work=budget)
