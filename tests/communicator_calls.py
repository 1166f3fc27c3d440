"""Helpers for running collectives through :class:`hccc.runtime.Communicator` one rank per process:
the rank pool fixture, the autouse check that no shared memory outlives a test, each rank's calls
with the collective's expected outputs (from :mod:`hccc.runtime.reference`), and the comparison."""
from __future__ import annotations

import time

import numpy as np
import pytest

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.collectives import SPECS
from hccc.runtime import reference, shm
from hccc.runtime.launcher import program_layout

from conftest import needs_torch, shm_leaks
from rank_pool import RankPool


def require_torch():
    """Skip the test where torch.distributed (the bootstrap) is missing; fail where it is required
    (:func:`conftest.needs_torch`)."""
    needs_torch("torch.distributed")


POOL_SIZE = 8


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    require_torch()
    p = RankPool(POOL_SIZE, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def no_leaks():
    before = set(shm.ours())
    yield
    # segments are unlinked once every rank has mapped them: none may outlive a test
    deadline = time.monotonic() + 5
    while shm_leaks(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert shm_leaks(before) == set(), "shared memory left in /dev/shm"


METHOD = {name: spec.method for name, spec in SPECS.items()}


def takes_out(method: str) -> bool:
    """The Communicator method takes its output array as a required positional argument (an
    all_to_all always does, although its in-place form overlays the whole buffer)."""
    import inspect

    from hccc.runtime.communicator import Communicator
    p = inspect.signature(getattr(Communicator, method)).parameters.get("out")
    return p is not None and p.default is inspect.Parameter.empty and p.kind != p.KEYWORD_ONLY


def calls_for(ir, count: int, dtype: str = "float32", op: str = "sum", seed: int = 0):
    """(per-rank call lists, inputs, expected outputs) for one collective call of ``count``."""
    coll = ir.collective
    N = ir.nranks
    count = reference.alltoall_count(count, reference.count_unit(ir))   # AllToAll, SendRecv: equal blocks
    inputs = reference.make_inputs(coll, N, count, dtype, nchunks=ir.nchunks, seed=seed)
    want = reference.expected(coll, inputs, op, nchunks=ir.nchunks, root=ir.root)
    spec = SPECS[coll]
    layout = program_layout(ir, count)
    calls = []
    for r in range(N):
        c = {"method": METHOD[coll], "x": inputs[r]}
        if spec.alias != "same" or takes_out(METHOD[coll]):   # a separate output array
            c["out"] = layout[r][1]
        if spec.reduces:
            c["kwargs"] = {"op": op}
        calls.append([c])
    return calls, want, count


def check(replies, want, what: str, ncalls: int = 1) -> None:
    for r, rep in enumerate(replies):
        assert rep["ok"], f"{what}: rank {r}: {rep['error']}\n{rep.get('trace', '')}"
        assert len(rep["outputs"]) == ncalls
        if want[r] is None:
            continue
        got = rep["outputs"][-1]
        assert got.shape == want[r].shape, f"{what}: rank {r}: {got.shape} vs {want[r].shape}"
        bad = np.flatnonzero(got != want[r])
        assert len(bad) == 0, (f"{what}: rank {r}: {len(bad)} wrong elements, first at {bad[0]}: "
                               f"{got[bad[0]]} != {want[r][bad[0]]}")


def run(pool, ir, count, dtype="float32", op="sum", seed=0):
    calls, want, count = calls_for(ir, count, dtype, op, seed)
    replies = pool.run(ir.to_json(), ir.nranks, calls, dtype=dtype, op=op)
    check(replies, want, f"{ir.name} ({ir.collective}, {ir.nranks} ranks, {count} x {dtype} {op})")


PROGRAMS = {
    "allreduce": lambda: gen.ring_allreduce(4, [0, 2, 1, 3]),
    "allgather": lambda: gen.ring_allgather(3),
    "reducescatter": lambda: gen.ring_reducescatter(4),
    "broadcast": lambda: gen.ring_broadcast(3, root=1),
    "reduce": lambda: gen.ring_reduce(4, root=2),
    "alltoall": lambda: gen.ring_alltoall(3),
    "gather": lambda: gen.ring_gather(4, root=1, chunks_per_rank=2),
    "scatter": lambda: gen.tree_scatter(5, gen.binomial_tree(5, 2), root=2, chunks_per_rank=2),
    "sendrecv": lambda: gen.ring_sendrecv(4, 2, [0, 2, 1, 3], chunks_per_rank=2),
}


#: one kernel instance per collective (each rank builds its own kernel: keep the builds few)
INSTANCE = {"allreduce": ("float32", "sum"), "allgather": ("int32", "sum"),
            "reducescatter": ("int32", "max"), "broadcast": ("float32", "sum"),
            "reduce": ("float32", "min"), "alltoall": ("float32", "sum"), "gather": ("int32", "sum"),
            "scatter": ("float32", "sum"), "sendrecv": ("int32", "sum")}
