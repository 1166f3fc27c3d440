"""Tests for hccc.compiler.passes.dag: the dependency DAG against an all-pairs oracle."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.frontend.algorithm import RECV, RRC
import hccc.compiler.passes.dag as dag_module
from hccc.compiler.passes.dag import build_dag
from dag_programs import hm_allreduce, make_alg, naive_relation, programs, ring_allgather


# ------------------------------------------------------------------ oracle
def closure(adj: np.ndarray) -> np.ndarray:
    reach = adj.copy()
    for k in range(len(adj)):
        reach |= reach[:, [k]] & reach[[k], :]
    return reach


def reduction_of(reach: np.ndarray) -> set[tuple[int, int]]:
    """Transitive reduction of a transitively closed DAG relation."""
    via = (reach.astype(np.int64) @ reach.astype(np.int64)) > 0
    red = reach & ~via
    return set(zip(*map(lambda x: x.tolist(), np.nonzero(red))))


def dag_adj(dag) -> np.ndarray:
    adj = np.zeros((dag.ntasks, dag.ntasks), bool)
    adj[dag.edge_src, dag.edge_dst] = True
    return adj


# ------------------------------------------------------------------ property tests
@settings(max_examples=examples(100))     # the thorough profile: ten times as many
@given(programs)
def test_reachability_equals_naive_relation_and_is_reduced(alg):
    dag = build_dag(alg)
    reach_naive = closure(naive_relation(alg))
    adj = dag_adj(dag)
    assert (closure(adj) == reach_naive).all()
    # No edge implied by another path: the edge set is exactly the (unique) transitive reduction.
    edges = set(zip(dag.edge_src.tolist(), dag.edge_dst.tolist()))
    assert edges == reduction_of(reach_naive)
    assert len(edges) == dag.nedges  # no duplicates


@st.composite
def channelled_tables(draw):
    """Transfer tables whose transfers name channels (0-2): several connections per pair."""
    nranks = draw(st.integers(2, 4))
    rows = draw(st.lists(st.tuples(st.integers(0, nranks - 1), st.integers(0, nranks - 1),
                                   st.integers(0, 4), st.integers(0, 2), st.sampled_from([RECV, RRC]),
                                   st.integers(0, 2)), min_size=1, max_size=30))
    return make_alg(rows, nranks)


@settings(max_examples=60)
@given(channelled_tables())
def test_channels_of_a_pair_are_links_of_their_own(alg):
    """A link is a connection: tasks share a link id exactly when their (src, dst, channel) agree
    (the channels of a pair have FIFOs and thread blocks of their own); link_src / link_dst still
    give every link's pair."""
    dag = build_dag(alg)
    key = list(zip(alg.src.tolist(), alg.dst.tolist(), alg.channels.tolist()))
    for a in range(len(alg)):
        for b in range(len(alg)):
            assert (key[a] == key[b]) == (dag.link[a] == dag.link[b])
    assert (dag.link_src[dag.link] == alg.src).all()
    assert (dag.link_dst[dag.link] == alg.dst).all()
    assert dag.nlinks == len(set(key))

@settings(max_examples=100)
@given(programs)
def test_csr_links_and_shape(alg):
    dag = build_dag(alg)
    n = len(alg)
    assert dag.ntasks == n
    assert dag.edge_src.dtype == np.int64 and dag.edge_dst.dtype == np.int64
    assert dag.link.dtype == np.int64
    # Edges sorted by (src, dst), step strictly increasing, same chunk.
    code = dag.edge_src * max(n, 1) + dag.edge_dst
    assert (np.diff(code) > 0).all()
    assert (alg.step[dag.edge_src] < alg.step[dag.edge_dst]).all()
    assert (alg.chunk[dag.edge_src] == alg.chunk[dag.edge_dst]).all()
    for t in range(n):
        succ = set(dag.successors(t).tolist())
        pred = set(dag.predecessors(t).tolist())
        assert succ == set(dag.edge_dst[dag.edge_src == t].tolist())
        assert pred == set(dag.edge_src[dag.edge_dst == t].tolist())
    assert (dag.indegree() == np.bincount(dag.edge_dst, minlength=n)).all()
    # Links: equal ids exactly when (src, dst, channel) equal; link_src/link_dst give the pair back.
    chan = alg.channels
    for a in range(n):
        for b in range(n):
            same = (alg.src[a], alg.dst[a], chan[a]) == (alg.src[b], alg.dst[b], chan[b])
            assert same == (dag.link[a] == dag.link[b])
    assert (dag.link_src[dag.link] == alg.src).all()
    assert (dag.link_dst[dag.link] == alg.dst).all()
    assert (dag.chunk_ids[dag.chunk_index] == alg.chunk).all()


@settings(max_examples=40)
@given(programs)
def test_deterministic_and_row_order_independent(alg):
    d1, d2 = build_dag(alg), build_dag(alg)
    assert np.array_equal(d1.edge_src, d2.edge_src) and np.array_equal(d1.edge_dst, d2.edge_dst)
    # Permuting the rows permutes the edges and nothing else.
    n = len(alg)
    perm = np.random.default_rng(n).permutation(n)
    alg2 = make_alg([tuple(r) for r in np.stack([alg.src, alg.dst, alg.step, alg.chunk,
                                                 alg.op.astype(np.int64)], 1)[perm]],
                    alg.header.nranks)
    d3 = build_dag(alg2)
    e1 = set(zip(d1.edge_src.tolist(), d1.edge_dst.tolist()))
    e3 = {(int(perm[a]), int(perm[b])) for a, b in zip(d3.edge_src.tolist(), d3.edge_dst.tolist())}
    assert e1 == e3


@settings(max_examples=40)
@given(programs)
def test_sparse_ids_and_multikey_sort_give_the_same_dag(alg):
    """Huge, sparse step and chunk ids (sort path), the multi-key sort and bitset freeing."""
    d1 = build_dag(alg)
    alg2 = make_alg([(s, d, t * 10**12 - 5, c * 10**9 + 7, o) for s, d, t, c, o in alg.rows()],
                    alg.header.nranks)
    d2 = build_dag(alg2)
    old = dag_module._KEY_LIMIT, dag_module._KEEP_ALL_BITSETS
    dag_module._KEY_LIMIT = 0          # multi-key sort
    dag_module._KEEP_ALL_BITSETS = 0   # free ancestor bitsets early
    try:
        d3 = build_dag(alg)
    finally:
        dag_module._KEY_LIMIT, dag_module._KEEP_ALL_BITSETS = old
    for d in (d2, d3):
        assert np.array_equal(d1.edge_src, d.edge_src) and np.array_equal(d1.edge_dst, d.edge_dst)
        assert np.array_equal(d1.link, d.link)
    assert (d2.chunk_ids[d2.chunk_index] == alg2.chunk).all()


# ------------------------------------------------------------------ hand-checked examples
def test_ring_allgather_chains():
    dag = build_dag(ring_allgather([0, 1, 2, 3]))
    # Row (k, i) = 4k + i sends chunk (i - k) % 4 from rank i; the chunk then moves on from i + 1.
    expected = {(4 * k + i, 4 * (k + 1) + (i + 1) % 4) for k in range(2) for i in range(4)}
    assert set(zip(dag.edge_src.tolist(), dag.edge_dst.tolist())) == expected
    assert dag.nlinks == 4


def test_war_and_redundant_waw():
    # t0 writes (1,0); t1 reads (1,0) and writes (2,0); t2 overwrites (1,0).
    # t2 depends on t0 (WAW) and on t1 (WAR); t0 -> t1 -> t2 makes t0 -> t2 redundant.
    alg = make_alg([(0, 1, 0, 0, RECV), (1, 2, 1, 0, RECV), (3, 1, 2, 0, RECV)], 4)
    dag = build_dag(alg)
    assert set(zip(dag.edge_src.tolist(), dag.edge_dst.tolist())) == {(0, 1), (1, 2)}


def test_rrc_reads_destination():
    # t1 (rrc into 2) reads (2, 0), which t0 wrote; a recv in its place would not (WAW is
    # still a dependency, so the edge exists either way); t2's later read of (2,0) follows t1 only.
    alg = make_alg([(0, 2, 0, 0, RECV), (1, 2, 1, 0, RRC), (2, 3, 2, 0, RECV)], 4)
    dag = build_dag(alg)
    assert set(zip(dag.edge_src.tolist(), dag.edge_dst.tolist())) == {(0, 1), (1, 2)}


def test_same_step_accesses_are_unordered_and_chunks_independent():
    alg = make_alg([(0, 1, 0, 0, RECV), (2, 1, 0, 0, RECV), (1, 3, 1, 0, RECV),
                    (0, 1, 0, 1, RECV), (1, 2, 1, 1, RECV)], 4)
    dag = build_dag(alg)
    # The racy writes 0 and 1 both precede the read 2; chunk 1 has its own edge 3 -> 4.
    assert set(zip(dag.edge_src.tolist(), dag.edge_dst.tolist())) == {(0, 2), (1, 2), (3, 4)}


def test_empty_algorithm():
    dag = build_dag(make_alg([], 2))
    assert dag.ntasks == 0 and dag.nedges == 0 and len(dag.link) == 0
    assert list(dag.succ_ptr) == [0] and list(dag.pred_ptr) == [0]


def test_hm_allreduce_4x8_shape():
    alg = hm_allreduce(4, 8)
    assert len(alg) == 1984
    dag = build_dag(alg)
    # 4 nodes x 8 GPUs: 8*7 intra links per node + 32 ring links.
    assert dag.nlinks == 4 * 56 + 32
    # Edges per chunk, by hand: phase 1 = 4 node chains of 7 rrc (6 edges each) = 24; phase 2 =
    # 3 ring rrc, each after its sender's value and its receiver's chain tail = 6; phase 3 = 3
    # ring recv, each after the previous ring transfer only (the WAW/WAR edges to earlier writers
    # and readers are implied through the ring) = 3; phase 4 = 28 recv, each after the holder's
    # final write only (WAR on the peers' phase-1 reads is implied) = 28. 61 * 32 chunks.
    assert dag.nedges == 61 * 32
    assert (alg.step[dag.edge_src] < alg.step[dag.edge_dst]).all()
