"""What ``hccc synth`` says of the engines that refuse the program it writes
(:func:`hccc.synth_engines.certain_refusals`): the MSCCL++ executor keeps every thread block of a
rank resident, at most ``PlanLimits().max_tbs`` (108) of them, and its plan gives every connection
end a thread block of its own; a program whose rank talks to more peers than that is refused, and
the report says so at synthesis time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cluster_texts import many_nodes_text
from hccc.cli import main
from hccc.compiler.frontend.generators import direct_allgather
from hccc.compiler.frontend.load import load_rccl
from hccc.compiler.interop.mscclpp_plan import PlanLimits
from hccc.synth_engines import PLAN_CHECK_MAX_TRANSFERS, certain_refusals


def _connection_ends(src, dst, n: int) -> int:
    """The most connection ends (distinct peers sent to plus distinct peers received from) of a rank."""
    pairs = np.unique(np.asarray(src, np.int64) * n + np.asarray(dst, np.int64))
    return int((np.bincount(pairs // n, minlength=n) + np.bincount(pairs % n, minlength=n)).max())


@pytest.mark.parametrize("n", [3, 54, 55, 56, 60])
def test_a_direct_allgather_is_refused_by_mscclpp_exactly_past_its_resident_blocks(n):
    """Each rank of a direct AllGather sends to and receives from every other: 2 (n - 1) thread
    blocks, refused past 108 (n = 56 on), accepted up to it (n = 55)."""
    alg = direct_allgather(n)
    ends = _connection_ends(alg.src, alg.dst, n)
    assert ends == 2 * (n - 1)
    got = certain_refusals(alg, None)
    refused = ends > PlanLimits().max_tbs
    assert ("mscclpp" in got) == refused, got
    if refused:
        assert f"{ends} thread blocks" in got["mscclpp"] and "108" in got["mscclpp"]
    assert "xml" not in got            # MSCCL's runtime takes 1,024 thread blocks a rank


def test_past_its_transfers_the_lowered_check_is_said_not_run_and_the_table_still_refuses(monkeypatch):
    """Past :data:`PLAN_CHECK_MAX_TRANSFERS` the program is not lowered for the check: a ring
    AllGather (two connection ends a rank, which the transfer table accepts) is said not checked; a
    direct AllGather of as many ranks (2 (n - 1) > 108 connection ends) is refused from its
    transfer table, without lowering it."""
    from hccc.compiler.frontend.generators import ring_allgather
    from hccc.compiler.passes import build

    n = next(n for n in range(2, 1000) if n * (n - 1) > PLAN_CHECK_MAX_TRANSFERS)
    assert certain_refusals(ring_allgather(n), None)["mscclpp"] is None

    def lowered(*_a, **_k):
        raise AssertionError("lowered for a check the transfer table settles")
    monkeypatch.setattr(build, "build_algorithm_level", lowered)
    assert f"{2 * (n - 1)} thread blocks" in certain_refusals(direct_allgather(n), None)["mscclpp"]
    assert "mscclpp" in certain_refusals(direct_allgather(n - 1), None)      # 2 (n - 2) > 108 blocks


def test_the_report_names_the_engine_that_refuses_the_program_written(tmp_path, capsys):
    """An AllToAll on 64 GPUs under a short limit: its ranks talk to more peers than MSCCL++ keeps
    resident; the summary and the program's comments say MSCCL++ refuses it and which ``--for``
    looks for one it runs; an engine the oracle does not see refusing is not named."""
    p = tmp_path / "n8.topo"
    p.write_text(many_nodes_text(8))
    out = tmp_path / "a.rccl"
    assert main(["synth", str(p), "--collective", "alltoall", "--time-limit", "3", "-o", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    alg = load_rccl(out)
    refused = _connection_ends(alg.src, alg.dst, 64) > PlanLimits().max_tbs
    assert ("mscclpp" in got["engines_refusing"]) == refused
    text = out.read_text()
    assert ("MSCCL++ executor (plan): refuses this program" in text) == refused
    assert ("hccc synth --for mscclpp looks for one it runs" in text) == refused
