"""One AllToAllv call as both launchers prepare it (hccc.runtime.alltoallv_call): buffer lengths,
the checked counts, the digest the ranks compare, the arguments a call fills, and the call that
gathers every rank's counts row. Oracles: row and column sums of the matrix, and the AllToAllv
oracle (hccc.runtime.alltoallv.expected) moving the blocks one by one."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from hccc.runtime import alltoallv as av
from hccc.runtime.alltoallv_call import HostCounts, VCall, buffer_lengths, counts_digest, gather_rows_counts
from hccc.runtime.kernel_abi import Args


#: examples per property: each is a few numpy operations on a matrix of at most 5 x 5
_EXAMPLES = settings(max_examples=30)


def _matrices(max_n=5, max_count=9):
    return st.integers(1, max_n).flatmap(
        lambda n: hnp.arrays(np.int64, (n, n), elements=st.integers(0, max_count)))


@_EXAMPLES
@given(_matrices())
def test_packed_buffers_are_the_row_and_column_sums(c):
    send, recv = buffer_lengths(c)
    assert send == [int(x) for x in c.sum(axis=1)] and recv == [int(x) for x in c.sum(axis=0)]
    hc = HostCounts.check(c, len(c), 2, send, recv)
    assert not hc.given and hc.displs is None
    assert hc.slot == int(((c + 1) // 2).max()) and hc.equal == hc.slot * 2 * len(c)


@_EXAMPLES
@given(_matrices())
def test_in_place_buffers_hold_both_sides(c):
    c = c + c.T                                    # in place needs symmetric counts
    send, recv = buffer_lengths(c, inplace=True)
    assert recv == send
    assert send == [max(int(a), int(b)) for a, b in zip(c.sum(axis=1), c.sum(axis=0))]


@_EXAMPLES
@given(_matrices(), st.data())
def test_digest_tells_matrices_apart(c, data):
    d = counts_digest(c)
    assert d & 1 and d == counts_digest(c.copy())
    i, j = data.draw(st.integers(0, len(c) - 1)), data.draw(st.integers(0, len(c) - 1))
    other = c.copy()
    other[i, j] += 1
    assert counts_digest(other) != d
    sd, rd = av.packed_displs(c)
    assert counts_digest(c, av.device_displs(sd, rd)) != d   # displacements passed: another call


@_EXAMPLES
@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_gathering_rows_gives_every_rank_the_matrix(n, k, data):
    """Every rank sends its whole row to every rank; what each receives, moved block by block by
    the AllToAllv oracle, is the matrix of all rows."""
    rows = [np.array(data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), np.int64)
            for _ in range(n)]
    hc = gather_rows_counts(n, k)
    assert hc.given and hc.slot == -(-n // k)
    got = av.expected(rows, [np.zeros(n * n, np.int64) for _ in range(n)], hc.counts, hc.sd, hc.rd)
    for d in range(n):
        assert np.array_equal(got[d].reshape(n, n), np.stack(rows))


def test_a_call_fills_its_four_arguments():
    a = Args()
    VCall(counts=0x100, displs=0x200, vmap=0x300, slot=12, digest=5).apply(a, uses_scratch=True)
    assert (a.vcounts, a.vdispls, a.vmap, a.vslot) == (0x100, 0x200, 0x300, 12)
    VCall(counts=1, displs=0, vmap=2, slot=12).apply(a, uses_scratch=False)
    assert (a.vcounts, a.vdispls, a.vmap, a.vslot) == (1, 0, 2, 0)
