"""Uneven ``all_to_all_single`` (split sizes) through the ``"hccc"`` backend: carried by the
built-in catalog's AllToAll program as an AllToAllv (the counters say so), results equal to gloo's,
a MoE training (token dispatch and combine) with parameters equal to gloo's after every step, and
ranks whose split sizes disagree all get an error (one process a rank: the slow set); the split
exchanges leave one store key per rank."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import needs_torch

torch = needs_torch()
needs_torch("torch.distributed")

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.fixture
def builtin(monkeypatch):
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)


def _ok(replies):
    for r, (ok, val) in enumerate(replies):
        assert ok, f"rank {r}: {val}"
    return [val for _, val in replies]


@pytest.mark.slow
@needs_gxx
def test_uneven_splits_equal_gloo_and_are_carried_by_hccc(tmp_path, builtin):
    from alltoallv_ranks import splits_job
    from torch_ranks import spawn
    ours = _ok(spawn(splits_job, 3, tmp_path, "hccc"))
    ref = _ok(spawn(splits_job, 3, tmp_path, "gloo"))
    for r in range(3):
        for a, b in zip(ours[r]["outs"], ref[r]["outs"]):
            np.testing.assert_array_equal(a, b)
        s = ours[r]["stats"]
        assert s["hccc"].get("alltoallv") == 6, s
        assert "alltoallv" not in s["fallback"], s["reasons"]


@pytest.mark.slow
@needs_gxx
def test_disagreeing_split_sizes_fail_on_every_rank(tmp_path, builtin):
    from alltoallv_ranks import splits_job
    from torch_ranks import spawn
    res = _ok(spawn(splits_job, 3, tmp_path, "hccc", 2))
    for r, rep in enumerate(res):
        assert rep["error"] and "rank 2 expects" in rep["error"], (r, rep["error"])


@pytest.mark.slow
@needs_gxx
def test_moe_training_equals_gloo_after_every_step(tmp_path, builtin):
    from alltoallv_ranks import moe_job
    from torch_ranks import spawn
    ours = _ok(spawn(moe_job, 4, tmp_path, "hccc", 6, 8))
    ref = _ok(spawn(moe_job, 4, tmp_path, "gloo", 6, 8))
    for r in range(4):
        assert ours[r]["splits"] == ref[r]["splits"]
        for step, (a, b) in enumerate(zip(ours[r]["snaps"], ref[r]["snaps"])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"rank {r}, step {step}")
        s = ours[r]["stats"]
        # dispatch and combine forward, the combine's reverse in backward: three uneven calls a step
        assert s["hccc"].get("alltoallv") == 3 * 6, s
        assert any(len(set(sp["in"])) > 1 for sp in ours[r]["splits"])      # really uneven


@pytest.mark.parametrize("world", [1])
def test_split_exchanges_leave_one_key_per_rank(world):
    """The uneven calls' split exchanges do not pile up keys in the group's store."""
    import types

    import torch.distributed as dist
    from hccc.runtime.bootstrap import StoreBootstrap
    from hccc.torch.forms import forget_split_keys as _forget_split_keys
    store = dist.HashStore()
    boot = StoreBootstrap(store, 0, world, name="entry/x")
    comm = types.SimpleNamespace(_boot=boot)
    for n in range(1, 4):
        tag = f"alltoallv/{n}"
        boot.all_gather(b"x", tag)
        _forget_split_keys(comm, tag)
        assert store.check([f"{boot.prefix}/{tag}/0"])
        if n > 1:
            assert not store.check([f"{boot.prefix}/alltoallv/{n - 1}/0"])
