"""MSCCL++ plans with ``reuse_resources``: the plan's scratch is the executor's shared 64 MiB buffer.
While the plan's scratch fits it, every offset is a plain plan's: hccc proves the plan there (and
says up to which size), the independent interpreter runs it with the right result, and past that
size (where the executor folds scratch offsets) neither claims anything."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mscclpp_interp import InterpError, check_plan
from test_mscclpp_import import HAND, plan_pipelined_allreduce
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.compiler.interop.mscclpp_plan import SHARED_SCRATCH_BYTES


def _reuse(plan, **kw):
    plan = dict(plan, reuse_resources=True, **kw)
    return plan


@pytest.mark.parametrize("make", HAND, ids=lambda f: f.__name__)
def test_reuse_plans_are_proven_and_run_right(make):
    plan = _reuse(make())
    for seed in range(2):
        check_plan(plan, 2 + seed, seed=seed, runs=2)
    ir = import_plan_text(json.dumps(plan), "reuse.json")
    assert ir.stats["source"] == "mscclpp-plan"


def test_the_proven_range_stops_where_the_scratch_outgrows_the_shared_buffer():
    plan = _reuse(plan_pipelined_allreduce())         # 1 scratch chunk, 2 input chunks, Simple
    for g in plan["gpus"]:
        g["scratch_chunks"] = 1 << 10
    ir = import_plan_text(json.dumps(plan), "reuse.json")
    top = SHARED_SCRATCH_BYTES // (1 << 10) // 16 * 16 * 2
    assert ir.stats["maxBytes"] == top and "reuse_resources" in ir.stats["note"]
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


# ------------------------------------------------------------------ MSCCL++'s own DSL, where available
DSL = os.environ.get("HCCC_MSCCLPP_DSL")          # MSCCL++'s python/ directory (its language package)


@pytest.mark.slow
@pytest.mark.skipif(not DSL, reason="set HCCC_MSCCLPP_DSL to MSCCL++'s python/ directory")
def test_the_plans_mscclpp_installs_import(tmp_path, capsys):
    """`python -m mscclpp --install`'s plans (two- and four-node AllReduce, reuse_resources),
    generated here by MSCCL++'s DSL."""
    import subprocess
    import sys
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import mscclpp.__main__ as M\n"
            "for c in M.default_algo_configs:\n"
            "    p = c['function'](c['spec'], **c.get('additional_kwargs', {}))\n"
            "    open(sys.argv[2] + '/' + c['filename'], 'w').write(p.to_json())\n")
    subprocess.run([sys.executable, "-c", code, DSL, str(tmp_path)], check=True, timeout=600)
    files = sorted(Path(tmp_path).glob("*.json"))
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
    # hccc's own kernels in CPU emulation (all 16 ranks in one process), in place as the plan says
    from hccc.cli import main
    assert main(["run", str(tmp_path / "allreduce_2nodes_1K_64K.json"), "--sizes", "56K", "-n", "1", "-w", "0"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out
