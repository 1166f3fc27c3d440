"""The host side of a one-rank-per-process job (hccc.runtime.host_segment): two ranks' host
segments mapped in one process, compared with what each rank posted, without any kernel.

The oracle is the posted values themselves: a mismatch is reported exactly where the two ranks'
posted words differ, a counts row comes back as the row the peer posted, and a peer's failure
reason as the text it wrote."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hccc.runtime.host_segment import (HostSegments, call_type, describe_type, host_segment_bytes)
from hccc.util.dtypes import DTYPE_NAMES, OP_NAMES


@pytest.fixture(params=["processes", "threads"])
def pair(request):
    """Ranks 0 and 1 of a two-rank job, each mapping the other's segment (POSIX shared memory,
    as ranks in separate processes), or taking it as an object (ranks that are threads of one
    process): every test below holds for both."""
    threads = request.param == "threads"
    a, b = (HostSegments(r, 2, timeout_s=5.0, in_process=threads) for r in (0, 1))
    if threads:
        a.attach(1, segment=b.own)
        b.attach(0, segment=a.own)
    else:
        a.attach(1, b.own.handle)
        b.attach(0, a.own.handle)
    for h in (a, b):
        h.know([os.getpid(), os.getpid()], ["n", "n"])
    yield a, b
    for h in (a, b):
        h.close()
        h.own.unlink()


def test_segment_holds_the_words_the_reason_and_a_counts_row():
    assert host_segment_bytes(2) == 4096
    big = 10_000
    assert host_segment_bytes(big) >= 128 + 1024 + 8 * (1 + big)


@given(st.sampled_from(DTYPE_NAMES), st.sampled_from(OP_NAMES), st.sampled_from(["simple", "ll"]),
       st.integers(0, 255), st.booleans())
def test_call_type_word_describes_what_was_posted(dtype, op, proto, epoch, zero):
    text = describe_type(call_type(dtype, op, proto, epoch, zero))
    assert text.startswith(f"{dtype} ({op}, {proto})")
    assert (f"LL epoch {epoch}" in text) == (proto == "ll")
    assert ("zeroing" in text) == (proto == "ll" and zero)


def test_calls_that_agree_pass_and_a_difference_is_named(pair):
    a, b = pair
    word = call_type("float32", "sum", "simple")
    a.post_call(1, 3, 1000, word, tag=7)
    b.post_call(1, 3, 1000, word, tag=7)
    assert a.call_mismatch("x") is None and b.call_mismatch("x") is None
    b.post_call(1, 3, 999, word, tag=7)
    assert "rank 1 passes 999 elements" in a.call_mismatch("all_reduce #1")
    assert "rank 0 passes 1000 elements" in b.call_mismatch("all_reduce #1")
    b.post_call(1, 3, 1000, word, tag=8)
    assert "call tag 0x8, this rank 0x7" in a.call_mismatch("x")
    b.post_call(1, 3, 1000, word, tag=7, digest=5)
    assert "AllToAllv counts" in a.call_mismatch("x")


def test_barrier_meets_the_peer_and_times_out_without_it(pair):
    a, b = pair
    other = threading.Thread(target=lambda: b.barrier("first"))
    other.start()
    assert a.barrier("first") is None
    other.join()
    a.timeout_s = 0.2
    why = a.barrier("second")                    # rank 1 never comes
    assert why == "rank 1 did not reach second within 0.2 s"


def test_a_failed_peer_is_reported_with_its_reason(pair):
    a, b = pair
    assert a.peer_problem() is None
    b.report_failure("its kernel timed out")
    assert a.peer_problem() == "rank 1 failed (its kernel timed out)"
    b.mark_done(4)                               # it completed call 4: owes nothing more to it
    assert a.peer_problem(call=4) is None
    assert a.peer_problem(watch=lambda: "asked to stop") == "asked to stop"
    b.mark_closed()
    assert a.peer_problem() == "rank 1 closed its communicator"


def test_counts_rows_are_gathered_by_call_stamp(pair):
    a, b = pair
    ra, rb = np.array([0, 5], np.int64), np.array([7, 0], np.int64)
    a.post_row(3, ra)
    b.post_row(3, rb)
    got, missing = a.rows(3, ra)
    assert missing is None and np.array_equal(got, np.stack([ra, rb]))
    got, missing = a.rows(4, ra)                  # rank 1's row is for another call
    assert got is None and missing == 1


def test_ranks_in_one_process_share_their_segments_as_objects_named_nowhere():
    """An in-process host segment is memory of this process: no name in /dev/shm, no handle to
    map it by; a peer takes the object itself (nothing else), and the memory stays readable to
    the peer after its owner closed (it goes with its last holder)."""
    from hccc.runtime import shm
    before = set(shm.ours())
    a, b = (HostSegments(r, 2, timeout_s=5.0, in_process=True) for r in (0, 1))
    assert set(shm.ours()) == before
    with pytest.raises(shm.ShmError, match="no handle"):
        a.own.handle
    with pytest.raises(shm.ShmError, match="not memory of this process"):
        a.attach(1, segment=object())
    plain = HostSegments(1, 2, timeout_s=5.0)
    try:
        with pytest.raises(shm.ShmError, match="not memory of this process"):
            a.attach(1, segment=plain.own)
    finally:
        plain.close()
    a.attach(1, segment=b.own)
    assert a.peers[1] is b.own
    b.report_failure("gone wrong")
    b.close()
    a.know([os.getpid(), os.getpid()], ["n", "n"])
    assert a.peer_problem() == "rank 1 failed (gone wrong)"
    a.close()
