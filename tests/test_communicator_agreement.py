"""Ranks of one communicator that load different programs under one name (another ring order, other
channel counts or slot sizes, another program) get a :class:`CommunicatorError` on every rank
naming the first difference, before any peer memory is mapped: never wrong results or a crash."""
from __future__ import annotations

import copy
import itertools
import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.agreement import TERMS, first_difference, program_digest
from conftest import examples, needs_torch

from rank_pool import RankPool

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    needs_torch("torch.distributed")
    p = RankPool(4, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


def _ring(order=None, chunk_bytes=64, nchannels=1, name="ring"):
    ir = build_program(gen.ring_allreduce(4, order, name=name), chunk_bytes=chunk_bytes)
    ir.nchannels = nchannels
    return ir.to_json()


CALL = [{"method": "all_reduce", "x": np.ones(64, np.float32)}]


@pytest.mark.parametrize("irs, term", [
    ([_ring(), _ring(), _ring([3, 2, 1, 0]), _ring([3, 2, 1, 0])], "program"),    # the reversed ring
    # four processes each: one difference in the default set, the others with the slow tests
    pytest.param([_ring(), _ring(nchannels=8), _ring(), _ring()], "channels", marks=pytest.mark.slow),
    pytest.param([_ring(chunk_bytes=65536), _ring(chunk_bytes=4096), _ring(chunk_bytes=65536),
                  _ring(chunk_bytes=65536)], "chunk_bytes", marks=pytest.mark.slow),
])
def test_ranks_with_different_programs_all_fail_naming_the_difference(pool, irs, term):
    replies = pool.run(irs, 4, [CALL] * 4, timeout=20.0)
    for r, rep in enumerate(replies):
        assert not rep["ok"], f"rank {r} ran: {rep}"
        assert "CommunicatorError" in rep["error"] and "do not run the same program" in rep["error"], rep
        assert f"has {term} " in rep["error"], rep["error"]


def test_ranks_with_different_set_up_dtype_fail(pool):
    replies = pool.run(_ring(), 4, [CALL] * 4, per_rank={1: {"dtype": "int32"}}, timeout=20.0)
    for rep in replies:
        assert not rep["ok"] and "has dtype float32, rank 1 has dtype int32" in rep["error"], rep


# ---------------------------------------------------------------- the comparison, against an oracle
_terms = st.fixed_dictionaries({t: st.sampled_from(["a", "b", 1, 2]) for t in TERMS})


@given(st.lists(_terms, min_size=1, max_size=5))
@settings(max_examples=examples(60))
def test_first_difference_names_the_first_differing_term(ranks):
    found = first_difference(ranks)
    differing = [t for t in TERMS if len({json.dumps(r[t]) for r in ranks}) > 1]
    if not differing:
        assert found is None
        return
    term = differing[0]
    other = next(i for i, r in enumerate(ranks) if r[term] != ranks[0][term])
    assert found is not None and f"rank 0 has {term} " in found and f"rank {other} has {term} " in found


def test_program_digest_sees_every_primitive_column():
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    base = program_digest(ir)
    assert program_digest(copy.deepcopy(ir)) == base
    for col in ir.prims:
        other = copy.deepcopy(ir)
        other.prims[col] = other.prims[col].copy()
        other.prims[col][-1] += 1
        assert program_digest(other) != base, col
    ir.stats["compile_s"] = 1.0        # statistics are not the program
    assert program_digest(ir) == base


# ---------------------------------------------------------------- what a call passes
def test_all_gather_from_a_block_of_its_own_output(pool):
    """``all_gather(out[r*n:(r+1)*n], out)``: the collective's in-place layout runs in place."""
    ir = build_program(gen.ring_allgather(2, name="ag"), chunk_bytes=64)
    n = 8
    calls = [[{"method": "all_gather", "x": np.arange(n, dtype=np.float32) + 100 * r, "out": 2 * n,
               "input_in_output": True}] for r in range(2)]
    replies = pool.run(ir.to_json(), 2, calls, timeout=20.0)
    want = np.concatenate([np.arange(n, dtype=np.float32), np.arange(n, dtype=np.float32) + 100])
    for rep in replies:
        assert rep["ok"], rep
        np.testing.assert_array_equal(rep["outputs"][0], want)


def test_tensors_whose_memory_is_not_their_values_are_refused():
    torch = needs_torch()
    from hccc.runtime.call_buffers import as_buf as _as_buf
    x = torch.arange(4, dtype=torch.float32)
    assert _as_buf(x, "x").n == 4
    with pytest.raises(ValueError, match="lazily negated"):
        _as_buf(x._neg_view(), "input")
    with pytest.raises(TypeError, match="sparse_coo tensor.*to_dense"):
        _as_buf(x.to_sparse(), "input")


@pytest.mark.slow      # rank 1 builds its kernel before it fails (seconds, cold)
def test_a_rank_whose_set_up_fails_fails_its_peers_at_once_with_its_reason(pool):
    """Rank 1's node name is empty: its set-up fails after the ranks have met, and rank 0's fails
    at once naming rank 1's reason (not after the timeout with "did not arrive")."""
    import time
    ir = build_program(gen.ring_allreduce(2, name="ring2"), chunk_bytes=64)
    t0 = time.monotonic()
    replies = pool.run(ir.to_json(), 2, [CALL] * 2, per_rank={1: {"nodes": ["a", ""]}}, timeout=60.0)
    took = time.monotonic() - t0
    assert not replies[1]["ok"] and "node name ''" in replies[1]["error"], replies[1]
    assert not replies[0]["ok"], replies[0]
    assert "set-up failed on rank 1" in replies[0]["error"] and "node name ''" in replies[0]["error"], \
        replies[0]["error"]
    assert "did not arrive" not in replies[0]["error"]
    assert took < 60.0, took            # rank 1 builds its kernel first; nobody waits the timeout out
