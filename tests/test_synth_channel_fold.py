"""Channels of tree programs on large clusters (compiler/synth/forest.py ``fold_channels``).

A pair of ranks carries a stream of every tree that crosses it, so the streams on one pair grow
with the cluster; a transfer names at most ``MAX_CHANNEL`` + 1 channels, so past that neighbouring
streams share a channel. Checked here: the fold against its definition (an independent oracle,
not the code), tree programs whose channels were folded (the limit lowered) proven by the
verifier with every channel in range, loops and all; and, slow, the 74-node x 8-GPU AllReduce
written by ``hccc synth`` and accepted by ``hccc check`` on its cluster.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cluster_texts import h20_nodes_text
from conftest import examples
from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.synth import forest, synthesize, to_algorithm, to_rccl

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"


@settings(max_examples=examples(200), deadline=None)
@given(ch=st.lists(st.integers(0, 5000), max_size=60), most=st.integers(0, 1100))
def test_fold_keeps_channels_in_range_order_and_shares_evenly(ch, most):
    got = forest.fold_channels(np.array(ch, np.int64), most)
    assert len(got) == len(ch)
    if not ch or max(ch) <= most:
        assert got.tolist() == ch                          # nothing to fold: unchanged
        return
    top = max(ch)
    assert got.min() >= 0 and got.max() <= most
    for a, b in zip(ch, got.tolist()):                     # a function of the number alone ...
        for c, d in zip(ch, got.tolist()):
            if a < c:
                assert b <= d                              # ... keeping the order
            if a == c:
                assert b == d
    # every channel of 0..most takes at most ceil((top + 1) / (most + 1)) numbers of 0..top
    whole = forest.fold_channels(np.arange(top + 1), most)
    assert np.bincount(whole).max() <= math.ceil((top + 1) / (most + 1))
    assert set(whole.tolist()) == set(range(most + 1))    # and none is left unused


@pytest.mark.parametrize("cluster,collective", [
    ("h20_4x2_8.topo", "allreduce"),              # no symmetry: rows
    ("a100_topo1.topo", "allreduce"),             # 2 identical nodes: loops over the node shifts
])
def test_folded_tree_programs_are_proven_with_every_channel_in_range(monkeypatch, cluster, collective):
    topo = parse_topology((CLUSTERS / cluster).read_text(), cluster)
    plain = synthesize(topo, collective, method="trees", time_limit=20)
    top = int(plain.rows[:, 5].max())
    assert top > 2, "the cluster must have more channels on a pair than the lowered limit"
    monkeypatch.setattr(forest, "MAX_CHANNEL", 2)
    res = synthesize(topo, collective, method="trees", time_limit=20)
    assert int(res.rows[:, 5].max()) <= 2
    assert res.detail["channels_folded_from"] > 3
    alg = to_algorithm(res, topo)
    assert int(np.max(alg.channels)) <= 2
    verify(alg)
    # the text (loops over the symmetry where there is one) names the same folded channels
    back = parse_rccl(to_rccl(res, topo), "folded.rccl")
    key = lambda a: np.lexsort((a.channels, a.chunk, a.step, a.dst, a.src))   # noqa: E731
    assert np.array_equal(np.asarray(back.channels)[key(back)], np.asarray(alg.channels)[key(alg)])
    verify(back)
    # and it compiles: connections per (pair, channel), thread blocks, the IR's checks (deadlock
    # freedom included) on the shared channels
    build_program(alg)


@pytest.mark.slow     # about 10 s of CPU for the synthesis and 4 s for the check (loaded: 30 s and 16 s wall)
def test_allreduce_on_74_nodes_of_8_gpus_is_accepted_by_check(tmp_path):
    topo = tmp_path / "h20_74x8.topo"
    topo.write_text(h20_nodes_text(74))
    out = tmp_path / "ar.rccl"
    hccc = [sys.executable, "-m", "hccc"]
    got = subprocess.run(hccc + ["synth", str(topo), "--collective", "allreduce", "--time-limit", "120",
                                 "-o", str(out), "--json"], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    summary = json.loads(got.stdout)
    assert summary["nranks"] == 592 and summary["method"] == "trees"
    chk = subprocess.run(hccc + ["check", str(out), "--topology", str(topo), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert chk.returncode == 0, chk.stdout[-2000:] + chk.stderr[-2000:]
    assert json.loads(chk.stdout)["valid"] is True
