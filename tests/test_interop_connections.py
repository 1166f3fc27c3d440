"""compiler/interop/connections.py: a program's connections from its transfers, against a plain count
of (sender, receiver, channel) triples."""
from collections import Counter

import numpy as np
from hypothesis import given, strategies as st

from hccc.compiler.interop.connections import connections


@given(n=st.integers(1, 6), data=st.data())
def test_connections_are_the_sender_receiver_channel_triples_counted(n, data):
    k = data.draw(st.integers(0, 40))
    src = data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    dst = data.draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    chan = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=k, max_size=k)))
    pair, count = connections(np.array(src, np.int64), np.array(dst, np.int64),
                              None if chan is None else np.array(chan, np.int64), n)
    want = Counter(zip(src, dst, chan if chan is not None else [0] * k))
    # one row per triple, in (sender, receiver, channel) order, the pair named sender * n + receiver
    assert [(int(p) // n, int(p) % n) for p in pair] == [(s, d) for s, d, _ in sorted(want)]
    assert count.tolist() == [want[t] for t in sorted(want)]
    assert int(count.sum()) == k
