"""Longest-path levels (compiler/ir/levels.py) and the proofs built on them, held to independent
oracles: a memoised longest path over networkx's cycle structure, and brute-force reachability for
happens-before with narrow and wide levels mixed; a deep chain is proven with no numpy step per level."""
from __future__ import annotations

import functools

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend.algorithm import RECV, Algorithm, Header
from hccc.compiler.frontend.collectives import Collective
from hccc.compiler.ir import levels, symbolic
from hccc.compiler.ir.check import check_deadlock
from hccc.compiler.ir.levels import NARROW_LEVEL, graph_levels
from hccc.compiler.ir.symbolic import happens_before, prove
from hccc.compiler.pipeline import load_program

#: narrow-level thresholds the tests run under: every level wide (0), mixed, every level narrow
NARROWS = [0, 1, 2, 3, NARROW_LEVEL, 1 << 30]


def _oracle_levels(n, edges):
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    cyclic = {v for c in nx.strongly_connected_components(g) if len(c) > 1 for v in c}
    cyclic |= {u for u, v in edges if u == v}
    blocked = set(cyclic)
    for v in cyclic:
        blocked |= nx.descendants(g, v)

    @functools.lru_cache(maxsize=None)
    def longest(v):
        return max((longest(u) + 1 for u in g.predecessors(v)), default=0)

    return [-1 if v in blocked else longest(v) for v in range(n)]


@st.composite
def graphs(draw):
    n = draw(st.integers(0, 40))
    if not n:
        return 0, []
    m = draw(st.integers(0, 3 * n))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=m, max_size=m))
    if draw(st.booleans()):          # mostly acyclic: keep forward edges only
        edges = [(u, v) for u, v in edges if u < v]
    return n, edges


@given(graphs(), st.sampled_from(NARROWS))
@settings(max_examples=150)
def test_graph_levels_are_longest_paths(case, narrow):
    n, edges = case
    src = np.array([u for u, _ in edges], np.int64)
    dst = np.array([v for _, v in edges], np.int64)
    got = graph_levels(n, src, dst, narrow)
    assert got.tolist() == _oracle_levels(n, edges)


def _chain(steps):
    """An AllGather on 2 ranks whose chunk 0 goes back and forth ``steps`` times: a transfer per step."""
    rows = [(1, 0, 0, 1, RECV)] + [(s % 2, (s + 1) % 2, s, 0, RECV) for s in range(steps)]
    return Algorithm.from_rows(Header(nranks=2, collective=Collective.ALLGATHER), rows)


def test_deep_chain_is_proven_without_a_numpy_step_per_level(monkeypatch):
    """A 20,000-transfer chain has a level per primitive: every level is narrow, so the levels, the
    deadlock check and the happens-before clocks take no numpy step at all (before, each of the
    four loops took a few numpy operations per level: minutes for a 64 MB input)."""
    ir = load_program(_chain(20_000))
    steps = {"levels": 0, "clocks": 0}

    def count(name, fn):
        def counted(*a, **k):
            steps[name] += 1
            return fn(*a, **k)
        return counted

    monkeypatch.setattr(levels, "_wide_step", count("levels", levels._wide_step))
    monkeypatch.setattr(symbolic, "_wide_clock_step", count("clocks", symbolic._wide_clock_step))
    level = graph_levels(ir.nprims, *symbolic._edges(ir))
    assert level.max() + 1 >= 20_000           # deep: about a level per primitive
    check_deadlock(ir)
    prove(ir)
    assert steps == {"levels": 0, "clocks": 0}
