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


# ---------------------------------------------------------------------------- overflow-free checks
_BIG = [2 ** 62, 2 ** 62 - 1, 2 ** 61, 2 ** 61 + 1, 3 * 2 ** 60]


def _fits_oracle(c, sd, rd, send_lens, recv_lens):
    """Whether every non-empty block lies inside its buffers and no two blocks of a receive buffer
    overlap, in Python integers (no sum wraps); packed displacements (None) as Python sums; a
    length None is any buffer: at most 2**62 elements."""
    n = len(c)
    c = [[int(v) for v in row] for row in c]
    sd = [[sum(c[o][:p]) for p in range(n)] for o in range(n)] if sd is None else [[int(v) for v in r] for r in sd]
    rd = [[sum(c[i][o] for i in range(p)) for p in range(n)] for o in range(n)] if rd is None else \
        [[int(v) for v in r] for r in rd]
    limit = 2 ** 62
    for o in range(n):
        ns = limit if send_lens[o] is None else min(int(send_lens[o]), limit)
        nr = limit if recv_lens[o] is None else min(int(recv_lens[o]), limit)
        blocks = []
        for p in range(n):
            if c[o][p] and sd[o][p] + c[o][p] > ns:
                return False
            if c[p][o]:
                if rd[o][p] + c[p][o] > nr:
                    return False
                blocks.append((rd[o][p], rd[o][p] + c[p][o]))
        blocks.sort()
        if any(b[0] < a[1] for a, b in zip(blocks, blocks[1:])):
            return False
    return True


def _entries():
    return st.one_of(st.integers(0, 6), st.sampled_from(_BIG))


@settings(max_examples=200)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    hnp.arrays(np.int64, (n, n), elements=_entries()),
    st.none() | hnp.arrays(np.int64, (n, n), elements=_entries()),
    st.none() | hnp.arrays(np.int64, (n, n), elements=_entries()),
    st.lists(st.none() | st.integers(0, 12) | st.sampled_from(_BIG + [2 ** 63 - 1]), min_size=n, max_size=n),
    st.lists(st.none() | st.integers(0, 12) | st.sampled_from(_BIG + [2 ** 63 - 1]), min_size=n, max_size=n))))
def test_counts_checks_never_wrap(case):
    """Counts and displacements up to 2**62 each (so that a block's end, or a rank's prefix sum,
    passes int64): check_call accepts exactly the calls whose blocks fit (the oracle in Python
    integers), refuses the others with a CountsError naming an entry, and never raises anything
    else; buffer_lengths and the slot arithmetic stay exact."""
    c, sd, rd, send_lens, recv_lens = case
    want = _fits_oracle(c, sd, rd, send_lens, recv_lens)
    try:
        got_sd, got_rd = av.check_call(c, send_lens, recv_lens, sd, rd)
    except av.CountsError as exc:
        assert not want, str(exc)
        assert "counts[" in str(exc) or "receives the blocks from ranks" in str(exc), str(exc)
    else:
        assert want
        if sd is None:
            n = len(c)
            assert got_sd.tolist() == [[sum(int(v) for v in c[o][:p]) for p in range(n)] for o in range(n)]
    k = 3
    assert av.scratch_slot(c, k) == max(-(-int(v) // k) for v in c.ravel())
    assert av.equal_count(c, k) == av.scratch_slot(c, k) * k * len(c)
    assert av.exact_sum(c) == sum(int(v) for v in c.ravel())
    try:
        send, recv = buffer_lengths(c, sd, rd)
    except av.CountsError as exc:
        assert "counts[" in str(exc), str(exc)
    else:
        assert all(0 <= x <= 2 ** 62 for x in send + recv)


def test_a_block_of_2_62_at_2_62_does_not_fit_four_elements():
    """The reproduction: disp + count = 2**63 wrapped in int64 and passed as inside the buffer."""
    import pytest
    c = np.array([[2 ** 62, 0], [0, 0]])
    sd = np.array([[2 ** 62, 0], [0, 0]])
    with pytest.raises(av.CountsError, match=r"rank 0's send buffer holds 4 elements, but the block to rank 0 "
                                             r"\(counts\[0\]\[0\] = 4611686018427387904 at element "
                                             r"4611686018427387904\) ends at 9223372036854775808"):
        av.check_call(c, [4, 4], [2 ** 62, 2 ** 62], sd, None)
    with pytest.raises(av.CountsError, match=r"counts\[0\]\[0\] = 4611686018427387904 at element 4611686018427387904"):
        buffer_lengths(c, sd, None)
    with pytest.raises(av.CountsError, match=r"rank 0's blocks to ranks 0..1 \(counts\[0\]\[0..1\]\)"):
        av.check_call(np.array([[2 ** 62, 2 ** 62], [0, 0]]), [None, None], [None, None])
