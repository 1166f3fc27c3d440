"""Automorphisms of clusters with several kinds of node (compiler/synth/symmetry.py) and the tree
packing's LP over their classes (compiler/synth/trees.py), against independent checks.

* Every element :func:`class_symmetry` returns is recomputed here to be an automorphism of the
  cluster as its ``.topo`` describes it (every link onto a link of equal bandwidth, every shared
  group onto a group of equal capacity), the elements form a group (closed under composition),
  and the orbits are those of the elements.
* The LP over the classes alone, and the packing seeded with its trees, reach the optimum computed
  from scratch by the flow LP of tests/test_synth_trees.py (the seeded LP over every root in one
  round), every rank gets K chunks on spanning trees rooted at it, and the
  packing's time, recomputed from its trees, is its own.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                format_topology, parse_topology)
from hccc.compiler.synth import network_from_topology
from hccc.compiler.synth.symmetry import class_symmetry
from hccc.compiler.synth.trees import pack_trees
from hccc.compiler.synth.packing import pair_bandwidth
from synth_oracles import M, optimum


@st.composite
def node_kinds(draw):
    """1-3 kinds of node (1-4 GPUs: a ring of links in both directions, random chords, NICs each
    shared by a run of GPUs, or one NIC per GPU pair so that rotating the node by two maps it onto
    itself), 1-3 nodes of each, in a random order, every pair of nodes through the NICs."""
    kinds = []
    for _ in range(draw(st.integers(1, 3))):
        g = draw(st.integers(1, 4))
        bw = draw(st.sampled_from([10, 25, 50]))
        links = []
        for a in range(g):
            for b in range(a + 1, g):
                if b == a + 1 or draw(st.booleans()):
                    w = bw if draw(st.booleans()) else draw(st.sampled_from([10, 25, 50]))
                    links += [LinkSpec(a, b, w, 1), LinkSpec(b, a, w, 1)]
        nic = draw(st.sampled_from([5, 10, 12.5, 25]))
        if g % 2 == 0 and draw(st.booleans()):
            nics = [NicSpec((i, i + 1), nic) for i in range(0, g, 2)]
        else:
            split = draw(st.integers(1, g))
            nics = [NicSpec(tuple(range(split)), nic)]
            if split < g:
                nics.append(NicSpec(tuple(range(split, g)), draw(st.sampled_from([5, 10, 12.5, 25]))))
        kinds.append(NodeSpec(g, {"direct": links} if links else None, nics=nics))
    nodes = []
    for kind in kinds:
        nodes += [kind] * draw(st.integers(1, 3))
    order = draw(st.permutations(range(len(nodes))))
    nodes = [nodes[i] for i in order]
    while sum(k.ngpus for k in nodes) > 9:           # the flow LP oracle stays small
        nodes.pop()
    if len(nodes) < 2:
        nodes.append(nodes[0])
    return parse_topology(format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")])), "kinds.topo")


def _automorphism(topo, sigma: np.ndarray) -> bool:
    """``sigma`` maps every link onto a link of equal bandwidth, and every shared group onto one of
    equal capacity, read from the topology's own links and groups."""
    links = {}
    for u in range(topo.nranks):
        for v in range(topo.nranks):
            link = topo.link_between(u, v) if u != v else None
            if link is not None:
                links[(u, v)] = link
    for (u, v), link in links.items():
        image = links.get((int(sigma[u]), int(sigma[v])))
        if image is None or image.total_bandwidth != pytest.approx(link.total_bandwidth):
            return False
    by_id = {link.id: key for key, link in links.items()}
    groups = {}
    for g in topo.groups:
        ends = frozenset(by_id[int(i)] for i in g.members.tolist() if int(i) in by_id)
        groups.setdefault(ends, []).append(g.capacity_bytes)
    for ends, caps in groups.items():
        image = frozenset((int(sigma[u]), int(sigma[v])) for u, v in ends)
        if sorted(groups.get(image, [])) != pytest.approx(sorted(caps)):
            return False
    return True


@settings(max_examples=examples(40), deadline=None)
@given(topo=node_kinds())
def test_class_symmetry_is_a_group_of_automorphisms(topo):
    net = network_from_topology(topo)
    sym = class_symmetry(net)
    if sym is None:
        return
    ranks = sym.ranks
    assert (ranks[0] == np.arange(topo.nranks)).all()
    assert len({e.tobytes() for e in ranks}) == len(ranks)                 # distinct elements
    elements = {e.tobytes() for e in ranks}
    for a in ranks[: 8]:
        assert _automorphism(topo, a)
        for b in ranks[: 8]:
            assert a[b].tobytes() in elements                              # closed under composition
    # every element maps a resource onto one of its orbit (pairs: by their ends)
    orbits = sym.orbits
    for e in ranks[: 8]:
        image = net.pair_index(e[net.psrc], e[net.pdst])
        assert (orbits[image] == orbits[: net.npairs]).all()


@settings(max_examples=examples(25), deadline=None)
@given(topo=node_kinds())
def test_the_packing_over_classes_reaches_the_independent_optimum(topo):
    net = network_from_topology(topo)
    n = net.nranks
    bw = pair_bandwidth(topo)
    got = pack_trees(net, pair_bw=bw)
    opt = optimum(net)
    assert got.lp_time * M / n == pytest.approx(opt, rel=1e-3)
    if "class_lp_time" in got.stats:
        # the classes' LP alone reaches the optimum; seeded with its trees the LP over every root
        # stops after its first round
        assert got.stats["class_lp_time"] * M / n == pytest.approx(opt, rel=1e-3)
        assert got.iterations == 1
    per_root = np.zeros(n, np.int64)
    for r, par, c in zip(got.roots, got.parents, got.counts):
        assert par[r] == -1
        for v in range(n):                               # every rank reaches the root
            x, hops = v, 0
            while x != r:
                x, hops = int(par[x]), hops + 1
                assert x >= 0 and hops <= n
        per_root[r] += c
    assert (per_root == got.chunks_per_rank).all()
    assert _packing_time(net, bw, got) == pytest.approx(got.rounded_time, rel=1e-6)
    assert got.fraction >= 0.98
    # and against the independent flow LP: the trees' loads (recomputed above) within 2 % of it
    assert opt / (_packing_time(net, bw, got) * M / n) >= 0.98


def _pod64():
    """benchmarks/synth_scale.py's 64 H20 GPUs in 4 nodes of 4 and 6 of 8."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_quality import hetero_text

    return parse_topology(hetero_text("h20"), "pod64.topo")


def _packing_time(net, bw, got) -> float:
    """The packing's time recomputed from its trees: the most loaded pair or group."""
    load = np.zeros(net.npairs)
    for r, par, c in zip(got.roots, got.parents, got.counts):
        v = np.flatnonzero(par >= 0)
        load[net.pair_index(par[v], v)] += c / got.chunks_per_rank
    t = float((load / bw).max())
    for g, m in enumerate(net.group_pairs()):
        t = max(t, float(load[m].sum() / net.gbw[g]))
    return t


def test_a_group_over_the_limit_drops_its_rotations_then_itself(monkeypatch):
    """The 64-GPU cluster's group (192 elements) under a limit of 30: without the GPU rotations, 24
    elements (every one an automorphism of the .topo, closed under composition) and the packing
    still at the cut bound; under a limit of 20: no group, the LP over every root."""
    from hccc.compiler.synth import symmetry
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds

    topo = _pod64()
    net = network_from_topology(topo)
    monkeypatch.setattr(symmetry, "CLASS_GROUP_MAX", 30)
    sym = class_symmetry(net)
    assert len(sym) == 24
    elements = {e.tobytes() for e in sym.ranks}
    for a in sym.ranks:
        assert _automorphism(topo, a)
        assert all(a[b].tobytes() in elements for b in sym.ranks)
    bw = pair_bandwidth(topo)
    got = pack_trees(net, pair_bw=bw)
    assert got.stats["symmetry"] == 24 and got.stats["classes"] == 16 // 4 + 48 // 6
    cut = collective_cut_bound_seconds(net, "allgather", 64, 1, 0, 64.0)
    assert _packing_time(net, bw, got) == pytest.approx(cut, rel=1e-6)
    monkeypatch.setattr(symmetry, "CLASS_GROUP_MAX", 20)
    assert class_symmetry(net) is None


def test_a_64_gpu_cluster_of_two_kinds_solves_four_classes_at_the_cut_bound():
    """benchmarks/synth_scale.py's 64 H20s (4 nodes of 4, 6 of 8, a NIC per GPU pair): 4 classes of
    equivalent ranks, and the packing's time, recomputed from its trees, is the cut bound."""
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds

    topo = _pod64()
    net = network_from_topology(topo)
    bw = pair_bandwidth(topo)
    got = pack_trees(net, pair_bw=bw)
    assert got.stats["classes"] == 4 and got.stats["symmetry"] == 192
    cut = collective_cut_bound_seconds(net, "allgather", 64, 1, 0, 64.0)
    assert _packing_time(net, bw, got) == pytest.approx(cut, rel=1e-6)


def test_a_class_rounding_is_rounded_over_every_root_too_and_the_better_kept(monkeypatch):
    """mixed_v100_w7800's AllReduce (both halves packed together, 16 ranks: at most
    EVERY_ROOT_RANKS): the LP over every root, seeded with every translate of the classes' trees,
    is rounded beside the translates' rounding, and of the two the one within the rounding
    tolerance, then with fewer chunks per rank, then faster, is kept. Both are at the same LP
    optimum, and every rank gets K chunks on spanning trees. (Which one wins depends on the LP's
    vertex, i.e. on the LP solver's version: the rule is what is tested.)"""
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth import trees
    from hccc.compiler.synth.packing import PackOptions
    from hccc.compiler.synth.rounding import ROUND_TOL

    topo = load_cluster(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "mixed_v100_w7800.topo")
    net = network_from_topology(topo)
    bw = pair_bandwidth(topo)
    made = {}                     # "translates" / "every root" -> the AllGather half of each rounding
    real = trees._pack

    def spy(*a, **kw):
        out = real(*a, **kw)
        if kw.get("seed") is not None:
            made["translates" if kw.get("translate") is not None else "every root"] = out[0]
        return out

    monkeypatch.setattr(trees, "_pack", spy)
    ag, rs = trees.pack_allreduce(net, pair_bw=bw)
    assert set(made) == {"translates", "every root"}

    def rank(p):
        return (p.rounded_time > p.lp_time * (1 + ROUND_TOL), p.chunks_per_rank, p.rounded_time)
    kept = min(made, key=lambda how: (rank(made[how]), how != "translates"))   # ties keep the translates
    assert ag.stats["rounded_over"] == kept and ag is made[kept]
    assert made["every root"].lp_time == pytest.approx(made["translates"].lp_time, rel=1e-6)
    assert ag.fraction >= 0.99
    for p in (ag, rs):
        per_root = np.zeros(topo.nranks, np.int64)
        for r, par, c in zip(p.roots, p.parents, p.counts):
            assert par[r] == -1 and (par >= 0).sum() == topo.nranks - 1
            per_root[r] += c
        assert (per_root == p.chunks_per_rank).all()
    made.clear()
    # the classes' rounding alone
    alone = trees.pack_allreduce(net, pair_bw=bw, options=PackOptions(seed_every_root_above=10 ** 6,
                                                                             every_root_ranks=0))[0]
    assert alone.stats["rounded_over"] == "translates" and set(made) == {"translates"}
    assert alone.lp_time == pytest.approx(ag.lp_time, rel=1e-6)


def test_nodes_that_differ_only_in_their_nics_are_kinds_of_their_own():
    """Four 2-GPU nodes alike inside, their NICs 8, 8, 12.5 and 12.5 GB/s: two kinds (the groups a
    node sends and receives through tell them apart, not the other nodes' NICs its pairs also
    reach), each with its node swap and GPU swap: 16 elements, one class per kind. Taken as one
    kind, the four nodes' cyclic shift is no automorphism and nothing would be left."""
    def node(nic):
        return NodeSpec(2, {"direct": [LinkSpec(0, 1, 50, 1), LinkSpec(1, 0, 50, 1)]}, nics=[NicSpec((0, 1), nic)])

    topo = parse_topology(format_topology(ClusterSpec([node(8), node(8), node(12.5), node(12.5)],
                                                      [InternodeSpec("all", "nic")])), "nics.topo")
    net = network_from_topology(topo)
    sym = class_symmetry(net)
    assert sym is not None and len(sym) == 4 * 4        # per kind: the node swap and the GPU swap
    assert sorted(np.bincount(sym.kind).tolist()) == [4, 4]
    assert np.unique(sym.ranks.min(axis=0)).size == 2   # one class per kind
    for e in sym.ranks:
        assert _automorphism(topo, e)


def test_the_quality_benchmark_writes_the_heterogeneous_clusters():
    """benchmarks/synth_quality.py --hetero: the 64 GPUs of synth_scale.py (4 nodes of 4, 6 of 8) in
    either flavour, as .topo text hccc reads; the two flavours differ (their NICs)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_quality import hetero_text

    texts = {f: hetero_text(f) for f in ("h20", "v100")}
    assert texts["h20"] != texts["v100"]
    for f, text in texts.items():
        topo = parse_topology(text, f"hetero64_{f}.topo")
        net = network_from_topology(topo)
        assert topo.nranks == 64
        assert sorted(np.bincount(np.asarray(net.levels[0])).tolist()) == [4] * 4 + [8] * 6
