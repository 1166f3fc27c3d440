"""The exported MSCCL XML passes the executors' load-time checks (``msccl_loader``, a
re-implementation of what msccl-executor-nccl and RCCL's MSCCL check when they read a file): the
multi-node route of a job runs these files (docs/msccl-xml.md, "Multi-node")."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.collectives import spec_of
from hccc.compiler.interop.msccl_export import export_xml
from hccc.compiler.interop.msccl_format import LEGACY_LIMITS, XmlLimits
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_program
from hccc.testing import valid_programs

from msccl_loader import load_time_errors

ROOT = Path(__file__).resolve().parent.parent
EXPORTABLE = ("allgather", "allreduce", "reducescatter", "alltoall")
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.rccl"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_exportable_example_loads(name):
    ir = load_program(ROOT / "examples" / name)
    if ir.collective not in EXPORTABLE:
        pytest.skip(f"{ir.collective}: not exported ({spec_of(ir.collective).msccl_refusal})")
    text = export_xml(ir, XmlLimits(min_bytes=1 << 20, max_bytes=1 << 30))
    assert load_time_errors(text) == []


@settings(max_examples=10)
@given(alg=valid_programs(list(EXPORTABLE), max_ranks=8, min_ranks=2))
def test_random_programs_export_loadable_xml(alg):
    text = export_xml(build_program(alg))
    assert load_time_errors(text) == []


def test_legacy_export_loads_under_the_older_limits():
    ir = build_program(gen.hm_allreduce(2, 4))
    assert load_time_errors(export_xml(ir, LEGACY_LIMITS), max_steps=256, max_tbs=216) == []


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t.replace('proto="Simple"', 'proto="Fast"'), "proto"),
    (lambda t: t.replace('cnt="1"', 'cnt="72"', 1), "cnt=72"),
    (lambda t: t.replace('<tb id="1"', '<tb id="5"', 1), "thread block ids"),
    (lambda t: t.replace('chan="0"', 'chan="3"', 1), "chan=3"),
    (lambda t: t.replace('srcbuf="i"', 'srcbuf="x"', 1), "srcbuf"),
    (lambda t: t.replace('<gpu id="1"', '<gpu id="7"', 1), "<gpu> ids"),
])
def test_the_checks_catch_what_the_executors_refuse(edit, reason):
    text = export_xml(build_program(gen.ring_allreduce(4)))
    assert load_time_errors(text) == []
    bad = edit(text)
    assert bad != text
    errs = load_time_errors(bad)
    assert any(reason in e for e in errs), errs
