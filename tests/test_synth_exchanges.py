"""Exchanges between trees (compiler/synth/exchanges.py): every arc keeps its multiplicity, every
tree stays a spanning tree of its root, and no tree ends deeper than the deepest was; checked
against depths and arc counts computed here by walking the trees."""
from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.synth import exchanges as ex
from synth_oracles import walk_depths


def _arcs(parents, counts) -> Counter:
    """Every arc's multiplicity: a tree's arcs, each as many times as the tree's count."""
    c: Counter = Counter()
    for par, k in zip(parents, counts):
        for v, p in enumerate(par):
            if p >= 0:
                c[(int(p), v)] += int(k)
    return c


@st.composite
def forests(draw):
    """Random spanning trees of one set of ranks: each tree a random root, every other rank hung
    under a rank placed before it in a random order; counts 1 or 2; parts a random partition."""
    n = draw(st.integers(3, 9))
    T = draw(st.integers(2, 10))
    parents, counts = [], []
    for _ in range(T):
        order = draw(st.permutations(range(n)))
        par = [-1] * n
        for i, v in enumerate(order[1:], start=1):
            par[v] = order[draw(st.integers(0, i - 1))]
        parents.append(np.array(par, np.int64))
        counts.append(draw(st.sampled_from([1, 1, 2])))
    labels = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    parts = [np.flatnonzero(np.array(labels) == x) for x in set(labels)]
    return parents, counts, parts


@settings(max_examples=examples(60), deadline=None)
@given(forests())
def test_exchanges_keep_every_arc_and_every_tree_and_never_deepen(forest):
    parents, counts, parts = forest
    out, made = ex.shallower(parents, counts, parts)
    assert len(out) == len(parents)
    for old, new in zip(parents, out):
        assert int(np.flatnonzero(new < 0)[0]) == int(np.flatnonzero(old < 0)[0]) and (new < 0).sum() == 1
        assert walk_depths(new) is not None, "an exchange made a cycle"
    assert _arcs(out, counts) == _arcs(parents, counts)
    before = max(max(walk_depths(p)) for p in parents)
    after = max(max(walk_depths(p)) for p in out)
    assert after <= before
    if made == 0:
        assert all((a == b).all() for a, b in zip(parents, out))


@settings(max_examples=examples(40), deadline=None)
@given(forests())
def test_pointer_jumping_depths_are_the_walked_ones(forest):
    parents, _, _ = forest
    d, ok = ex.depths(np.array(parents))
    assert ok.all()
    assert d.tolist() == [walk_depths(p) for p in parents]
    # a cycle: a rank two levels down made its parent's parent
    par = np.array(parents[0])
    deep = [v for v in range(len(par)) if par[v] >= 0 and par[int(par[v])] >= 0]
    if deep:
        bad = par.copy()
        bad[int(par[deep[0]])] = deep[0]
        assert walk_depths(bad) is None and not ex.depths(bad[None, :])[1][0]


def test_a_chain_and_a_star_trade_a_parent():
    """Two trees of rank 0 on the arcs 0->1, 1->2, 2->3 and 0->1, 0->2, 0->3: the chain takes the
    star's arc into 2 and the star the chain's (or the like), three levels become two."""
    chain = np.array([-1, 0, 1, 2])
    star = np.array([-1, 0, 0, 0])
    out, made = ex.shallower([chain, star], [1, 1], [])
    assert made >= 1
    assert max(max(walk_depths(p)) for p in out) == 2
    assert _arcs(out, [1, 1]) == _arcs([chain, star], [1, 1])


def test_trees_of_different_counts_do_not_trade():
    chain = np.array([-1, 0, 1, 2])
    star = np.array([-1, 0, 0, 0])
    out, made = ex.shallower([chain, star], [2, 1], [])
    assert made == 0 and (out[0] == chain).all() and (out[1] == star).all()


def test_a_part_trades_whole():
    """Ranks 3 and 4 form a part. Tree A (root 0: 0 -> 1 -> 2 -> 3 -> 4) enters it from 2, two
    levels down; tree B (root 2: 2 -> 1 -> 0 -> 4 -> 3) from 0, two levels down. No single rank can
    trade its parent (each trade makes a cycle), but the part can: A takes B's entry from 0 and B's
    arc inside the part, B takes A's, and both trees end two levels deep instead of four."""
    a = np.array([-1, 0, 1, 2, 3])
    b = np.array([1, 2, -1, 4, 0])
    assert ex.shallower([a, b], [1, 1], [])[1] == 0
    out, made = ex.shallower([a, b], [1, 1], [np.array([3, 4])])
    assert made == 1
    assert out[0].tolist() == [-1, 0, 1, 4, 0] and out[1].tolist() == [1, 2, -1, 2, 3]
    assert _arcs(out, [1, 1]) == _arcs([a, b], [1, 1])


def _random_cluster(seed: int):
    """benchmarks/synth_quality.py's random cluster of ``seed``."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_quality import random_text

    from hccc.compiler.cluster.topo_parser import parse_topology
    return random_text, parse_topology(random_text(seed), f"random_{seed}.topo")


def test_the_benchmarks_random_clusters_are_seeded():
    random_text, topo = _random_cluster(3)
    assert random_text(3) == random_text(3) and random_text(3) != random_text(4)
    assert topo.nranks == 24


def test_integral_trees_on_a_random_cluster_keep_the_integer_programs_arcs_and_are_shallower():
    """Three trees per root on benchmarks/synth_quality.py's random cluster 3 (3 nodes of 8 AMD
    GPUs): the trees ``trees_on`` returns use every arc as often as the trees grown without
    exchanges do (within the integer program's multiplicities), and are shallower."""
    from hccc.compiler.synth import branchings as br
    from hccc.compiler.synth import network_from_topology
    from hccc.util import clock

    _, topo = _random_cluster(3)
    net = network_from_topology(topo)
    cap = np.r_[np.asarray(net.bw, float), np.asarray(net.gbw if net.gbw is not None else [], float)]
    k = 3
    got = br.integral_arcs(net, k, cap, clock.now() + 60)
    assert got is not None
    n = net.nranks
    arcs = np.zeros((n, n), np.int64)
    arcs[net.psrc, net.pdst] = got[1]
    grown = br.branchings(n, arcs, k, clock.now() + 60)
    final = br.trees_on(net, got[1], k, clock.now() + 60)
    used = [_arcs([p for _, p, _ in t], [c for _, _, c in t]) for t in (grown, final)]
    assert used[1] == used[0]
    assert all(m <= arcs[u, v] for (u, v), m in used[0].items())
    assert sorted((r, c) for r, _, c in final) == sorted((r, c) for r, _, c in grown)
    deepest = [max(max(walk_depths(p)) for _, p, _ in t) for t in (grown, final)]
    total = [sum(max(walk_depths(p)) for _, p, _ in t) for t in (grown, final)]
    assert deepest[1] <= deepest[0] and total[1] < total[0], (deepest, total)
