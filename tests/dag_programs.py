"""Transfer programs for the dependency-DAG and scheduler tests: builders (ring and direct AllGather,
ring and hierarchical AllReduce), hypothesis strategies of arbitrary and structured programs, and the
all-pairs dependency relation straight from its definition (the DAG's oracle)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header, TransferSite


def make_alg(rows, nranks: int, coll=Collective.ALLGATHER) -> Algorithm:
    return Algorithm.from_rows(Header(nranks=nranks, collective=coll), rows)


def from_array(arr: np.ndarray, nranks: int, coll: Collective, gpn: int = 0) -> Algorithm:
    n = len(arr)
    h = Header(nranks=nranks, collective=coll, name="HM", gpu_per_node=gpn)
    return Algorithm(h, arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy(),
                     arr[:, 4].astype(np.uint8), np.zeros(n, np.int64), [TransferSite(None, ())],
                     [np.zeros((n, 0), np.int64)])


def hm_allreduce(nodes: int, G: int) -> Algorithm:
    """HM AllReduce, built directly with numpy."""
    N = nodes * G
    s = np.arange(N)
    o = np.arange(G - 1)
    b = np.arange(nodes)
    k = np.arange(nodes - 1)
    S, O, B = np.meshgrid(s, o, b, indexing="ij")
    peer = (S // G) * G + (S % G + O + 1) % G
    rrc = np.full_like(S, RRC)
    recv = np.full_like(S, RECV)
    p1 = np.stack([S, peer, B * (G - 1) + O, peer % G + G * B, rrc], -1).reshape(-1, 5)
    p4 = np.stack([S, peer, nodes * (G - 1) + 2 * nodes - 2 + B, (S + B * G) % N, recv],
                  -1).reshape(-1, 5)
    S2, K = np.meshgrid(s, k, indexing="ij")
    nxt = (S2 + G) % N
    p2 = np.stack([S2, nxt, nodes * (G - 1) + K, (S2 - K * G) % N, np.full_like(S2, RRC)],
                  -1).reshape(-1, 5)
    p3 = np.stack([S2, nxt, nodes * (G - 1) + nodes - 1 + K, (S2 - (K + nodes - 1) * G) % N,
                   np.full_like(S2, RECV)], -1).reshape(-1, 5)
    arr = np.concatenate([p1, p2, p3, p4]).astype(np.int64)
    return from_array(arr, N, Collective.ALLREDUCE, G)


def ring_allgather(order: list[int]) -> Algorithm:
    """Ring AllGather along the rank permutation ``order``."""
    N = len(order)
    rows = []
    for k in range(N - 1):
        for i in range(N):
            rows.append((order[i], order[(i + 1) % N], k, order[(i - k) % N], RECV))
    return make_alg(rows, N)


def ring_allreduce(order: list[int]) -> Algorithm:
    N = len(order)
    rows = []
    for k in range(2 * (N - 1)):
        op = RRC if k < N - 1 else RECV
        for i in range(N):
            rows.append((order[i], order[(i + 1) % N], k, order[(i - k) % N], op))
    return make_alg(rows, N, Collective.ALLREDUCE)


def direct_allgather(N: int) -> Algorithm:
    return make_alg([(r, d, 0, r, RECV) for r in range(N) for d in range(N) if d != r], N)


@st.composite
def random_tables(draw):
    """Arbitrary transfer tables (races, self-transfers and all): the DAG must still be exact."""
    nranks = draw(st.integers(2, 5))
    nchunks = draw(st.integers(1, 3))
    rows = draw(st.lists(st.tuples(st.integers(0, nranks - 1), st.integers(0, nranks - 1),
                                   st.integers(0, 6), st.integers(0, nchunks - 1),
                                   st.sampled_from([RECV, RRC])), min_size=0, max_size=40))
    return make_alg(rows, nranks)


@st.composite
def structured_programs(draw):
    kind = draw(st.sampled_from(["ring_ag", "ring_ar", "hm", "direct"]))
    if kind == "hm":
        return hm_allreduce(draw(st.integers(2, 3)), draw(st.integers(2, 3)))
    if kind == "direct":
        return direct_allgather(draw(st.integers(2, 5)))
    order = draw(st.permutations(list(range(draw(st.integers(2, 6))))))
    return ring_allgather(order) if kind == "ring_ag" else ring_allreduce(order)


#: any program the DAG must handle: arbitrary tables and the structured builders' programs
programs = st.one_of(random_tables(), structured_programs())


def naive_relation(alg: Algorithm) -> np.ndarray:
    """dep[a, b]: b depends directly on a (all pairs, straight from the definition)."""
    rows = list(alg.rows())
    n = len(rows)
    dep = np.zeros((n, n), bool)
    for a, (s1, d1, t1, c1, o1) in enumerate(rows):
        r1 = {s1} | ({d1} if o1 == RRC else set())
        for b, (s2, d2, t2, c2, o2) in enumerate(rows):
            if c1 != c2 or t1 >= t2:
                continue
            r2 = {s2} | ({d2} if o2 == RRC else set())
            if d1 in r2 or d2 in r1 or d1 == d2:
                dep[a, b] = True
    return dep
