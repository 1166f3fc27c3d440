"""The up-front check of the MSCCL++ executor's limits (compiler/interop/mscclpp_limits.py): it
refuses, before any thread block is built, programs whose plan must break a limit, and never a
program the exporter accepts (the exported plan's own counts are the oracle)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.frontend import generators
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop import mscclpp_export
from hccc.compiler.interop.mscclpp_export import export_plan, node_map
from hccc.compiler.interop.mscclpp_limits import check_plan_fits, check_transfers_fit, transfer_plan_blocks
from hccc.compiler.interop.mscclpp_ops import PlanOp, local
from hccc.compiler.interop.mscclpp_plan import PlanLimits
from hccc.compiler.passes.build import build_algorithm_level, build_program
from hccc.compiler.passes.verify import verify
from hccc.testing import valid_programs

COLLS = ["allgather", "allreduce", "reducescatter", "alltoall"]
VARIANTS = [dict(), dict(protocol="LL"), dict(instances=2), dict(micro_batches=2), dict(instances=2, micro_batches=3)]


def _fits_exactly(ir, nodes, kw):
    """Export, then check the program up front against limits set to what the plan really uses:
    a lower bound never refuses it."""
    plan = export_plan(ir, nodes=nodes, **kw)
    used = max(len(g["threadblocks"]) for g in plan["gpus"])
    F, M = kw.get("instances", 1), kw.get("micro_batches", 1)
    check_plan_fits(ir, PlanLimits(max_tbs=used), nodes=np.zeros(ir.nranks, np.int64) if nodes is None else nodes,
                    protocol=kw.get("protocol", "Simple"), copies=F * M, instances=F)
    return used


@settings(max_examples=examples(25))
@given(alg=valid_programs(COLLS, max_ranks=6), kw=st.sampled_from(VARIANTS), level=st.booleans(),
       gpn=st.integers(0, 3), max_ops=st.sampled_from([8, 12, 64]))
def test_the_up_front_bound_never_refuses_what_the_exporter_accepts(alg, kw, level, gpn, max_ops):
    ir = build_algorithm_level(alg) if level and "micro_batches" not in kw else build_program(alg)
    nodes = None if kw.get("protocol") == "LL" else node_map(ir.nranks, gpn)
    lim = PlanLimits(max_operations=max_ops, max_tbs=10_000)
    try:
        plan = export_plan(ir, nodes=nodes, limits=lim, **kw)
    except CompileError as exc:
        assert "one primitive needs" in str(exc) or "MAX_CHANNEL" in str(exc)
        return
    used = max(len(g["threadblocks"]) for g in plan["gpus"])
    F, M = kw.get("instances", 1), kw.get("micro_batches", 1)
    check_plan_fits(ir, lim.with_(max_tbs=used), nodes=np.zeros(ir.nranks, np.int64) if nodes is None else nodes,
                    protocol=kw.get("protocol", "Simple"), copies=F * M, instances=F)
    # every program thread block is one plan thread block at least, per instance
    most = max(len(set(ir.prims["tb"][ir.prims["rank"] == r].tolist())) for r in range(ir.nranks))
    if F * most > 1:
        with pytest.raises(CompileError, match=f"at most {F * most - 1} can be resident"):
            check_plan_fits(ir, lim.with_(max_tbs=F * most - 1), nodes=np.zeros(ir.nranks, np.int64),
                            copies=F * M, instances=F)


def _hm(nnodes, g):
    a = generators.hm_allreduce(nnodes, g)
    verify(a)
    return a, build_program(a)


def test_a_large_program_is_refused_before_any_thread_block_is_built(monkeypatch):
    # large for its limit: two nodes of eight, held to half the thread blocks its plan uses (the
    # refusal does not depend on the scale; an 8 x 8 program took a second more to export)
    a, ir = _hm(2, 8)
    nodes = node_map(ir.nranks, a.header.gpu_per_node)
    used = _fits_exactly(ir, nodes, {})

    def built(*_a, **_k):
        raise AssertionError("a plan thread block was built for a program that cannot fit")
    monkeypatch.setattr(mscclpp_export, "_prim_ops", built)
    monkeypatch.setattr(mscclpp_export, "_check_valid", built)
    with pytest.raises(CompileError, match=r"rank \d+ needs at least \d+ thread blocks .*MAX_OPERATION.* at most "
                                           rf"{used // 2} can be resident"):
        export_plan(ir, nodes=nodes, limits=PlanLimits(max_tbs=used // 2), instances=2)


@pytest.mark.slow
def test_a_thousand_gpu_compile_goes_on_without_the_plan(tmp_path, capsys):
    from hccc.cli import main
    src = tmp_path / "hm.rccl"
    src.write_text(generators.hm_allreduce_rccl(128, 8))
    assert main([str(src), "-o", str(tmp_path / "out")]) == 0
    assert "MSCCL++ plan not written (the kernels are): the program does not fit the MSCCL++ executor: rank" \
        in capsys.readouterr().err
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["mscclpp_plan"] is None and not list((tmp_path / "out").glob("*.mscclpp.json"))


def test_a_long_last_primitive_is_refused_not_left_too_long():
    """A thread block cut between primitives: where the piece after the last cut is one primitive
    too long for a block, that is said (as for a first primitive), not left to the executor."""
    lim = PlanLimits(max_operations=8)
    copy = PlanOp("copy", src=(local("i", 0, 1),), dst=(local("o", 0, 1),))
    ops = [copy] * 9
    with pytest.raises(CompileError, match="one primitive needs 7 operations"):
        mscclpp_export._segments(ops, [2, 9], lim, [0], 0, "rank 0 thread block 0")
    with pytest.raises(CompileError, match="one primitive needs 5 operations"):
        mscclpp_export._segments(ops, [5, 9], lim, [0], 0, "rank 0 thread block 0")
    segs = mscclpp_export._segments(ops, [3, 6, 9], lim, [0], 0, "rank 0 thread block 0")
    assert [sum(op.name == "copy" for op in s) for s in segs] == [3, 3, 3]


@settings(max_examples=examples(25))
@given(alg=valid_programs(COLLS, max_ranks=6), kw=st.sampled_from([dict(), dict(protocol="LL"), dict(instances=2)]),
       gpn=st.integers(0, 3), max_ops=st.sampled_from([8, 12, 64]))
def test_the_transfer_table_count_never_exceeds_the_exported_plans_thread_blocks(alg, kw, gpn, max_ops):
    """The thread blocks counted from the transfer table alone (what ``hccc plan`` and ``hccc
    synth`` refuse by before lowering the program) lie at or below every rank's thread blocks in
    the plan the exporter writes of the program lowered connection by connection (the oracle: the
    plan's own ``threadblocks``), so the table never refuses what the exporter accepts; and each
    rank's count is at least its connection ends (a send end and a receive end per peer)."""
    ir = build_algorithm_level(alg)
    nodes = node_map(ir.nranks, 0 if kw.get("protocol") == "LL" else gpn)
    lim = PlanLimits(max_operations=max_ops, max_tbs=10_000)
    F = kw.get("instances", 1)
    got = transfer_plan_blocks(alg.src, alg.dst, nodes, lim, channel=alg.channels, protocol=kw.get("protocol", "Simple"),
                               instances=F)
    n = ir.nranks
    moves = alg.src != alg.dst
    pairs = np.unique(alg.src[moves].astype(np.int64) * n + alg.dst[moves])
    ends = np.bincount(pairs // n, minlength=n) + np.bincount(pairs % n, minlength=n)
    assert (got >= F * ends).all()
    try:
        plan = export_plan(ir, nodes=nodes, limits=lim, **kw)
    except CompileError as exc:
        assert "one primitive needs" in str(exc) or "MAX_CHANNEL" in str(exc)
        return
    used = np.array([len(g["threadblocks"]) for g in plan["gpus"]])
    assert (got <= used).all(), (got.tolist(), used.tolist())
    check_transfers_fit(alg.src, alg.dst, lim.with_(max_tbs=int(used.max())), nodes=nodes, channel=alg.channels,
                        protocol=kw.get("protocol", "Simple"), instances=F)


def test_hccc_plan_refuses_from_the_transfer_table_before_lowering(tmp_path, capsys, monkeypatch):
    """A direct AllGather of 8 ranks has 14 connection ends a rank: ``hccc plan --max-tbs 13``
    refuses it, located at its header, before the program is lowered; ``--max-tbs 14`` writes it."""
    from hccc.cli import main
    from hccc.compiler.frontend.generators import direct_allgather_rccl
    from hccc.compiler.passes import build

    src = tmp_path / "d.rccl"
    src.write_text(direct_allgather_rccl(8))

    def lowered(*_a, **_k):
        raise AssertionError("the program was lowered though its transfer table refuses it")
    real = build.build_algorithm_level
    monkeypatch.setattr(build, "build_algorithm_level", lowered)
    assert main(["plan", str(src), "-o", str(tmp_path / "p.json"), "--max-tbs", "13"]) == 1
    err = capsys.readouterr().err
    assert f"{src}:" in err and "rank 0 needs at least 14 thread blocks" in err and "at most 13" in err
    assert "Traceback" not in err and not (tmp_path / "p.json").exists()
    monkeypatch.setattr(build, "build_algorithm_level", real)
    assert main(["plan", str(src), "-o", str(tmp_path / "p.json"), "--max-tbs", "14"]) == 0
