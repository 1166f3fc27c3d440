"""AllToAllv through :class:`hccc.runtime.Communicator`, one rank per process (CPU emulation):
per-call counts on one communicator, in place, counts read by the kernels only (device counts),
and ranks that disagree on the counts: every rank errors, none hangs or returns a wrong result.
The oracle is a plain loop over the definition, written here."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import needs_torch

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program

from rank_pool import RankPool

# one process per rank, each building its kernel cold (about 30 s on two cores): the slow set
pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed"), pytest.mark.slow]

N = 3


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    needs_torch("torch.distributed")
    p = RankPool(N, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


def _ir():
    return build_program(gen.ring_alltoall(N)).to_json()


def _send(r, counts):
    return (np.arange(int(np.sum(counts[r])), dtype=np.float32) + 1000 * r)


def _want(d, counts):
    out = []
    for s in range(N):
        start = int(sum(counts[s][:d]))
        out += [1000 * s + start + e for e in range(int(counts[s][d]))]
    return out


COUNTS = [np.array([[0, 5, 1], [7, 0, 0], [2, 30, 4]]),
          np.zeros((N, N), np.int64),
          np.array([[1, 1, 90], [1, 1, 1], [1, 1, 1]])]     # one pair with 90 % of the elements


def test_per_call_counts_on_one_communicator(pool):
    calls = [[{"method": "all_to_all_v", "x": _send(r, c), "out": int(c[:, r].sum()),
               "kwargs": {"counts": c.tolist()}} for c in COUNTS] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=30.0)
    for r, rep in enumerate(replies):
        assert rep["ok"], rep.get("trace") or rep
        for c, got in zip(COUNTS, rep["outputs"]):
            assert got.tolist() == _want(r, c)


def test_in_place_and_device_counts(pool):
    sym = np.array([[2, 3, 0], [3, 1, 4], [0, 4, 5]])
    dev = COUNTS[0].astype(np.int64).ravel()
    calls = [[{"method": "all_to_all_v", "x": _send(r, sym), "kwargs": {"counts": sym.tolist()}},
              {"method": "all_to_all_v", "x": np.concatenate([_send(r, COUNTS[0]), np.zeros(40, np.float32)]),
               "out": 45, "kwargs": {"counts": dev, "device_counts": True}}] for r in range(N)]
    # device counts: every rank's buffers have one size (45 elements here)
    for r in range(N):
        calls[r][1]["x"] = calls[r][1]["x"][:45]
    replies = pool.run(_ir(), N, calls, timeout=30.0)
    for r, rep in enumerate(replies):
        assert rep["ok"], rep.get("trace") or rep
        inplace, device = rep["outputs"]
        assert inplace.tolist() == _want(r, sym)
        want = _want(r, COUNTS[0])
        assert device[:len(want)].tolist() == want


def test_disagreeing_counts_fail_on_every_rank(pool):
    c = COUNTS[0]
    other = c.copy()
    other[2, 1] += 1
    calls = [[{"method": "all_to_all_v", "x": _send(r, c), "out": int(c[:, r].sum()) + 1,
               "kwargs": {"counts": (other if r == 1 else c).tolist()}}] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=20.0)
    for r, rep in enumerate(replies):
        assert not rep["ok"], f"rank {r} ran: {rep}"
        assert "CommunicatorError" in rep["error"] and "AllToAllv counts" in rep["error"], rep["error"]


def test_counts_past_a_buffer_fail_on_every_rank(pool):
    c = COUNTS[0]
    calls = [[{"method": "all_to_all_v", "x": _send(r, c)[:-1] if r == 2 and len(_send(r, c)) else _send(r, c),
               "out": int(c[:, r].sum()), "kwargs": {"counts": c.tolist()}}] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=20.0)
    assert "rank 2's send buffer holds 35 elements" in replies[2]["error"], replies[2]["error"]
    for r, rep in enumerate(replies):
        assert not rep["ok"], f"rank {r} ran: {rep}"
        assert "rank 2" in rep["error"], rep["error"]


def test_each_rank_passes_its_row_only(pool):
    """send_counts: every rank gives its own row; the rows are exchanged at the call and every
    result equals the definition of the whole matrix, per call, zeros and a skewed pair included."""
    calls = [[{"method": "all_to_all_v", "x": _send(r, c), "out": int(c[:, r].sum()),
               "kwargs": {"send_counts": c[r].tolist()}} for c in COUNTS] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=30.0)
    for r, rep in enumerate(replies):
        assert rep["ok"], rep.get("trace") or rep
        for c, got in zip(COUNTS, rep["outputs"]):
            assert got.tolist() == _want(r, c)


def test_device_rows_are_gathered_on_the_device(pool):
    """send_counts with device_counts=True: each rank's row is an int64 array in the kernels'
    memory (the CPU emulation's: host memory), gathered by an AllToAllv of the program itself;
    the results equal the definition, call after call."""
    calls = [[{"method": "all_to_all_v",
               "x": np.concatenate([_send(r, c), np.zeros(100 - len(_send(r, c)), np.float32)]), "out": 100,
               "kwargs": {"send_counts": c[r].astype(np.int64), "device_counts": True}} for c in COUNTS]
             for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=60.0)
    for r, rep in enumerate(replies):
        assert rep["ok"], rep.get("trace") or rep
        for c, got in zip(COUNTS, rep["outputs"]):
            want = _want(r, c)
            assert got[:len(want)].tolist() == want


def test_rows_and_a_whole_matrix_mixed_or_a_bad_row_fail_on_every_rank(pool):
    c = COUNTS[0]
    calls = [[{"method": "all_to_all_v", "x": _send(r, c), "out": int(c[:, r].sum()),
               "kwargs": {"counts": c.tolist()} if r == 0 else {"send_counts": c[r].tolist()}}]
             for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=20.0)
    for r, rep in enumerate(replies):
        assert not rep["ok"] and "CommunicatorError" in rep["error"], f"rank {r}: {rep}"
    assert any("did not pass its counts row" in rep["error"] for rep in replies), replies
    bad = [0, -1, 3]
    calls = [[{"method": "all_to_all_v", "x": _send(r, c), "out": int(c[:, r].sum()),
               "kwargs": {"send_counts": bad if r == 1 else c[r].tolist()}}] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=20.0)
    assert "send_counts[1] = -1: a count must be >= 0" in replies[1]["error"], replies[1]["error"]
    for r, rep in enumerate(replies):
        assert not rep["ok"] and "rank 1" in rep["error"], f"rank {r}: {rep}"


def _device_call(r, counts, n, inplace=False):
    """Rank r's call with device counts (int64 in the kernels' memory) and buffers of n elements."""
    x = np.arange(n, dtype=np.float32) + 1000 * r
    call = {"method": "all_to_all_v", "x": x, "kwargs": {"counts": np.asarray(counts, np.int64).ravel(),
                                                        "device_counts": True}}
    if not inplace:
        call["out"] = n
    return call


@pytest.mark.parametrize("counts, n, inplace, refusal", [
    # column 1 sums to 27 past 10-element receive buffers: a write past rank 1's output
    ([[0, 9, 0], [0, 9, 0], [0, 9, 0]], 10, False,
     "rank 1's receive buffer holds 10 elements, but the block from rank 1 (counts[1][1] = 9 at element 9) "
     "does not fit in it"),
    # row 2 sums to 24 past 20-element send buffers: a read past rank 2's input, delivered to the peers
    ([[0, 5, 1], [7, 0, 0], [12, 12, 0]], 20, False,
     "rank 2's send buffer holds 20 elements, but the block to rank 1 (counts[2][1] = 12 at element 12) "
     "does not fit in it"),
    # one count past a whole buffer: the scratch slots (sized for a whole buffer) refuse it first
    ([[0, 5, 1], [7, 0, 0], [2, 30, 4]], 20, False,
     "counts[2][1] = 30 is negative or its block's pieces exceed the scratch slots"),
    # prefix sums that wrap in int64 (the scratch slots hold a whole buffer: refused there first)
    ([[2 ** 62, 2 ** 62, 0], [0, 0, 0], [0, 0, 0]], 10, False, "counts[0][0] = 4611686018427387904 is negative or "),
    # in place with an asymmetric matrix: refused by the host for host counts, by the kernels here
    ([[0, 5, 1], [7, 0, 0], [2, 30, 4]], 45, True,
     "an in-place AllToAllv needs symmetric counts: counts[0][1] = 5 but counts[1][0] = 7"),
])
def test_device_counts_past_the_buffers_fail_on_every_rank(pool, counts, n, inplace, refusal):
    """Device counts the host never reads, whose blocks leave the buffers they address: every
    rank's kernels refuse the same entry at launch, before anything moves, and every rank raises
    a CommunicatorError naming it."""
    calls = [[_device_call(r, counts, n, inplace)] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=30.0)
    for r, rep in enumerate(replies):
        assert not rep["ok"], f"rank {r} ran: {rep}"
        assert "CommunicatorError" in rep["error"] and refusal in rep["error"], (r, rep["error"])


def test_device_counts_with_buffers_of_other_sizes_fail_on_every_rank(pool):
    """Device counts are checked against every rank's buffers as this rank's: a rank whose buffers
    differ is told at the call's barrier, on every rank."""
    c = [[1, 1, 1], [1, 1, 1], [1, 1, 1]]
    calls = [[_device_call(r, c, 3 if r != 2 else 4)] for r in range(N)]
    replies = pool.run(_ir(), N, calls, timeout=30.0)
    for r, rep in enumerate(replies):
        assert not rep["ok"] and "buffer lengths" in rep["error"], (r, rep["error"])


def test_across_two_emulated_nodes(tmp_path_factory):
    """2 nodes x 2 ranks (the network transport over UCX's TCP between the nodes): the hierarchical
    program, whose blocks cross the network once, as AllToAllv with per-call counts."""
    from net_ranks import TCP, have_ucx
    if not have_ucx():
        pytest.skip("UCX (libucx-dev) not installed")
    p = RankPool(4, tmp_path_factory.mktemp("stores"))
    try:
        n = 4
        ir = build_program(gen.hierarchical_alltoall(2, 2)).to_json()
        mats = [np.array([[3, 0, 9, 1], [2, 2, 0, 40], [0, 5, 1, 1], [7, 1, 1, 0]]), np.zeros((n, n), np.int64)]

        def send(r, c):
            return np.arange(int(c[r].sum()), dtype=np.float32) + 1000 * r

        def want(d, c):
            out = []
            for s in range(n):
                start = int(c[s][:d].sum())
                out += [1000 * s + start + e for e in range(int(c[s][d]))]
            return out
        calls = [[{"method": "all_to_all_v", "x": send(r, c), "out": int(c[:, r].sum()),
                   "kwargs": {"counts": c.tolist()}} for c in mats] for r in range(n)]
        replies = p.run(ir, n, calls, timeout=60.0, nodes=["a", "a", "b", "b"], env=TCP)
        for r, rep in enumerate(replies):
            assert rep["ok"], rep.get("trace") or rep
            for c, got in zip(mats, rep["outputs"]):
                assert got.tolist() == want(r, c)
    finally:
        p.close()
