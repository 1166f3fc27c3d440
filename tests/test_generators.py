"""Tests of hccc.compiler.frontend.generators: builders verify, match independent formulas, and the .rccl
text generators parse to exactly the builders' transfer sets."""
from __future__ import annotations

import dataclasses
import time

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective
from hccc.compiler.passes.verify import verify
from hccc.testing import hm_shapes, ring_orders, trees

try:
    from hccc.compiler.frontend import parse_rccl
except ImportError:  # pragma: no cover - the parser is another module's job
    parse_rccl = None

needs_parser = pytest.mark.skipif(parse_rccl is None, reason="hccc.compiler.frontend.parse_rccl not available")


def sorted_rows(alg: Algorithm):
    return sorted(alg.rows())


# ---------------------------------------------------------------- independent oracles (plain loops)
def hm_allreduce_loops(nn, g):
    """The HM AllReduce, phase by phase, written as plain loops."""
    n = nn * g
    rows = []
    for node in range(nn):
        for r in range(g):
            s = g * node + r
            for o in range(g - 1):
                d = (r + o + 1) % g
                for b in range(nn):
                    rows.append((s, g * node + d, b * (g - 1) + o, d + g * b, RRC))
    for s in range(n):
        for k in range(nn - 1):
            rows.append((s, (s + g) % n, nn * (g - 1) + k, (s - k * g) % n, RRC))
            rows.append((s, (s + g) % n, nn * (g - 1) + nn - 1 + k, (s - (k + nn - 1) * g) % n, RECV))
    for s in range(n):
        node, r = divmod(s, g)
        for b in range(nn):
            for o in range(g - 1):
                rows.append((s, g * node + (r + o + 1) % g, nn * (g - 1) + 2 * nn - 2 + b, (s + b * g) % n, RECV))
    return sorted(rows)


def hm_allgather_loops(nn, g):
    n = nn * g
    rows = []
    for s in range(n):
        node, r = divmod(s, g)
        for k in range(nn - 1):
            rows.append((s, (s + g) % n, k, (s - k * g) % n, RECV))
        for t in range(nn):
            for peer in range(g):
                if peer != r:
                    rows.append((s, g * node + peer, t, (s - t * g) % n, RECV))
    return sorted(rows)


# ---------------------------------------------------------------- sizes from the design
def test_hm_allreduce_sizes():
    assert len(gen.hm_allreduce(4, 8)) == 1984
    t0 = time.perf_counter()
    big = gen.hm_allreduce(128, 8)
    dt = time.perf_counter() - t0
    assert len(big) == 2_095_104
    assert big.header.nranks == 1024 and big.header.collective is Collective.ALLREDUCE
    print(f"\n[perf] build HM AllReduce 128x8: {dt:.2f} s")


@pytest.mark.parametrize("nn,g", [(1, 1), (1, 4), (4, 1), (2, 4), (3, 2), (4, 8), (2, 3)])
def test_hm_matches_design_formulas(nn, g):
    assert sorted_rows(gen.hm_allreduce(nn, g)) == hm_allreduce_loops(nn, g)
    assert sorted_rows(gen.hm_allgather(nn, g)) == hm_allgather_loops(nn, g)


def test_hm_allgather_steps_and_single_writes():
    alg = gen.hm_allgather(4, 8)
    assert len(alg) == 32 * 7 * 4 + 32 * 3 and alg.nsteps == 4
    keys = alg.dst * 32 + alg.chunk
    assert len(np.unique(keys)) == len(keys)  # every (rank, chunk) written once: minimal


def test_fast_path_equals_from_rows():
    alg = gen.hm_allreduce(8, 8)
    assert len(alg) > 4096
    ref = Algorithm.from_rows(alg.header, list(alg.rows()))
    for col in ("src", "dst", "step", "chunk", "op", "site"):
        assert np.array_equal(getattr(alg, col), getattr(ref, col))
        assert getattr(alg, col).dtype == getattr(ref, col).dtype


# ---------------------------------------------------------------- every family verifies
FAMILIES = [
    lambda n: gen.direct_allgather(n), lambda n: gen.direct_reducescatter(n), lambda n: gen.direct_allreduce(n),
    lambda n: gen.ring_allgather(n), lambda n: gen.ring_reducescatter(n), lambda n: gen.ring_allreduce(n),
    lambda n: gen.tree_allgather(n, [(i, i + 1) for i in range(n - 1)]),
    lambda n: gen.tree_reducescatter(n, [(0, i) for i in range(1, n)]),
    lambda n: gen.tree_allreduce(n, [((i - 1) // 2, i) for i in range(1, n)]),
]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("family", range(len(FAMILIES)))
def test_families_verify(family, n):
    alg = FAMILIES[family](n)
    rep = verify(alg)
    assert rep.nranks == n


@pytest.mark.parametrize("n", [1, 2, 4, 8, 32])
def test_recursive_doubling(n):
    alg = gen.recursive_doubling_allgather(n)
    assert len(alg) == n * (n - 1) and alg.nsteps == n.bit_length() - 1
    verify(alg)


def test_counts():
    assert len(gen.ring_allreduce(8)) == 2 * 8 * 7 and gen.ring_allreduce(8).nsteps == 14
    assert len(gen.direct_allgather(8)) == 56 and gen.direct_allgather(8).nsteps == 1
    assert gen.direct_reducescatter(8).nsteps == 7


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: ring_orders(n)))
def test_rings_with_any_order_verify(order):
    n = len(order)
    for f in (gen.ring_allgather, gen.ring_reducescatter, gen.ring_allreduce):
        verify(f(n, order))


@settings(max_examples=40, deadline=None)
@given(hm_shapes(16))
def test_hm_any_shape_verifies(shape):
    for f in (gen.hm_allgather, gen.hm_reducescatter, gen.hm_allreduce):
        verify(f(*shape))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), trees(n))))
def test_trees_are_spanning_trees_and_tree_algorithms_verify(arg):
    n, edges = arg
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    assert nx.is_tree(g)  # independent oracle for the strategy
    for f in (gen.tree_allgather, gen.tree_reducescatter, gen.tree_allreduce):
        verify(f(n, edges))


def test_bad_arguments():
    with pytest.raises(ValueError):
        gen.recursive_doubling_allgather(6)
    with pytest.raises(ValueError):
        gen.ring_allgather(4, [0, 1, 1, 2])
    with pytest.raises(ValueError):
        gen.tree_allgather(4, [(0, 1), (1, 0), (2, 3)])
    with pytest.raises(ValueError):
        gen.hm_allreduce(0, 8)


def test_full_mesh_rows_block():
    rows = gen.full_mesh_rows([3, 5, 7], "dst", 4, RRC, stagger=True)
    assert sorted(map(tuple, rows.tolist())) == sorted(
        [(3, 5, 4, 5, 1), (3, 7, 5, 7, 1), (5, 7, 4, 7, 1), (5, 3, 5, 3, 1), (7, 3, 4, 3, 1), (7, 5, 5, 5, 1)])
    flat = gen.full_mesh_rows([0, 1, 2], "src", 2, RECV, stagger=False)
    assert set(flat[:, 2].tolist()) == {2} and len(flat) == 6


# ---------------------------------------------------------------- text generators
def test_text_is_deterministic_and_has_loops():
    for stem, (_, text) in gen.EXAMPLES.items():
        a, b = text(), text()
        assert a == b
        assert "for " in a and a.startswith("def ResCCLAlgo(")
        assert a.count("transfer(") <= 8, stem  # idiomatic: loops, not unrolled lists


def parse(text: str) -> Algorithm:
    return parse_rccl(text, "gen.rccl")


def same(parsed: Algorithm, built: Algorithm) -> None:
    assert sorted_rows(parsed) == sorted_rows(built)
    assert dataclasses.replace(parsed.header, location=None) == dataclasses.replace(built.header, location=None)


@needs_parser
@settings(max_examples=25, deadline=None)
@given(hm_shapes(24, min_nodes=1, min_gpus=1))
def test_hm_text_parses_to_builder(shape):
    same(parse(gen.hm_allreduce_rccl(*shape)), gen.hm_allreduce(*shape))
    same(parse(gen.hm_allgather_rccl(*shape)), gen.hm_allgather(*shape))


@needs_parser
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.one_of(st.none(), ring_orders(n)).map(lambda o, n=n: (n, o))))
def test_ring_text_parses_to_builder(arg):
    n, order = arg
    same(parse(gen.ring_allgather_rccl(n, order)), gen.ring_allgather(n, order))
    same(parse(gen.ring_reducescatter_rccl(n, order)), gen.ring_reducescatter(n, order))
    same(parse(gen.ring_allreduce_rccl(n, order)), gen.ring_allreduce(n, order))


@needs_parser
@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_direct_and_recursive_doubling_text(n):
    same(parse(gen.direct_allgather_rccl(n)), gen.direct_allgather(n))
    same(parse(gen.recursive_doubling_allgather_rccl(n)), gen.recursive_doubling_allgather(n))
