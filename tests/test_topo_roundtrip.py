"""Property: random well-formed cluster specs, written with format_topology, parse back to exactly the
graph the spec describes (links, classes, bandwidths, lanes, alpha, shared groups, C(u,v))."""
from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                SharedSpec, format_topology, parse_topology)

BWS = [Fraction(x) for x in ("0.5", "8", "12.5", "16", "25", "48", "50", "100.25")]
ALPHA_DEFAULT = {"direct": Fraction("0.7"), "switch": Fraction(1), "internode": Fraction("1.7"),
                 "nic": Fraction("1.7")}


@st.composite
def cluster_specs(draw):
    nnodes = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 5)) for _ in range(nnodes)]
    use_nic = draw(st.booleans())
    nodes = []
    for g in sizes:
        direct = []
        pairs = [(a, b) for a in range(g) for b in range(g) if a != b]
        for a, b in draw(st.lists(st.sampled_from(pairs), unique=True, max_size=6)) if pairs else []:
            direct.append(LinkSpec(a, b, draw(st.sampled_from(BWS)), draw(st.integers(1, 4))))
        switch, used = [], set()
        for _ in range(draw(st.integers(0, 2)) if g > 1 else 0):
            perm = draw(st.permutations(range(g)))
            k = draw(st.integers(1, g - 1))
            a = tuple(perm[:k][:draw(st.integers(1, k))])
            b = tuple(perm[k:][:draw(st.integers(1, g - k))])
            links = {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}
            if links & used:
                continue
            used |= links
            switch.append(SharedSpec(a, b, draw(st.sampled_from(BWS)), draw(st.integers(1, 3))))
        bw = {}
        if direct:
            bw["direct"] = direct
        if switch:
            bw["switch"] = switch
        nics = None
        if use_nic:
            perm = draw(st.permutations(range(g)))
            cuts = sorted(set(draw(st.lists(st.integers(1, g), max_size=2)) + [g]))
            nics, start = [], 0
            for c in cuts:
                if c > start:
                    nics.append(NicSpec(tuple(perm[start:c]), draw(st.sampled_from(BWS)), draw(st.integers(1, 2))))
                    start = c
        lat = draw(st.one_of(st.none(), st.fixed_dictionaries({"direct": st.sampled_from(["0", "0.25", "3"])})))
        nodes.append(NodeSpec(g, bw or (None if draw(st.booleans()) else {}), latency=lat,
                              vendor=draw(st.sampled_from([None, "nvidia", "amd"])),
                              gpu=draw(st.sampled_from([None, "H20", "MI300X"])),
                              gamma=draw(st.sampled_from([None, 300, "12.5"])), nics=nics))
    names = [f"node{i + 1}" for i in range(nnodes)]
    ordered = [(x, y) for x in range(nnodes) for y in range(nnodes) if x != y]
    inters, used, nic_pairs = [], set(), set()
    for x, y in draw(st.lists(st.sampled_from(ordered), unique=True, max_size=4)) if ordered else []:
        if use_nic and draw(st.integers(0, 2)) > 0:
            if frozenset((x, y)) in nic_pairs:  # same links again with maybe another latency
                continue
            nic_pairs.add(frozenset((x, y)))
            inters.append(InternodeSpec((names[x], names[y]), "nic",
                                        latency=draw(st.sampled_from([None, {"nic": "2.5"}]))))
            continue
        entries = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                a, b = draw(st.integers(0, sizes[x] - 1)), draw(st.integers(0, sizes[y] - 1))
                key = (x, a, y, b)
                if key in used:
                    continue
                used.add(key)
                entries.append(LinkSpec(a, b, draw(st.sampled_from(BWS)), draw(st.integers(1, 2))))
            else:
                a = tuple(draw(st.lists(st.integers(0, sizes[x] - 1), min_size=1, max_size=3, unique=True)))
                b = tuple(draw(st.lists(st.integers(0, sizes[y] - 1), min_size=1, max_size=3, unique=True)))
                keys = {(x, i, y, j) for i in a for j in b} | {(y, j, x, i) for i in a for j in b}
                if keys & used:
                    continue
                used |= keys
                entries.append(SharedSpec(a, b, draw(st.sampled_from(BWS)), 1))
        inters.append(InternodeSpec((names[x], names[y]), {"switch": entries},
                                    latency=draw(st.sampled_from([None, {"internode": "5"}]))))
    if use_nic and nnodes > 1 and draw(st.integers(0, 3)) == 0:
        inters = [InternodeSpec("all", "nic")]
    glat = draw(st.one_of(st.none(), st.fixed_dictionaries({"switch": st.sampled_from(["0.5", "2"])})))
    chunk = draw(st.sampled_from([None, "1M", "4096", "3K"]))
    return ClusterSpec(nodes, inters, latency=glat, chunksize=chunk,
                       vendor=draw(st.sampled_from([None, "amd"])))


def oracle(spec: ClusterSpec):
    """Independent reading of a spec: {(u, v, cls): (bw, lanes, alpha_us)} and groups as
    {(kind, frozenset(members), bw*lanes)} (multiset as a sorted list)."""
    offs, o = [], 0
    for n in spec.nodes:
        offs.append(o)
        o += n.ngpus
    idx = {name: i for i, name in enumerate(spec.node_names())}
    glat = spec.latency or {}
    links, groups = {}, []

    def put(u, v, cls, bw, lanes, alpha):
        val = (Fraction(bw), lanes, Fraction(alpha))
        assert links.get((u, v, cls), val) == val
        links[(u, v, cls)] = val

    for i, n in enumerate(spec.nodes):
        lat = n.latency or {}
        for cls, entries in (n.bandwidth or {}).items():
            alpha = lat.get(cls, glat.get(cls, ALPHA_DEFAULT[cls]))
            for e in entries:
                if isinstance(e, LinkSpec):
                    put(offs[i] + e.src, offs[i] + e.dst, cls, e.bandwidth, e.lanes, alpha)
                else:
                    ab = [(offs[i] + a, offs[i] + b) for a in e.a for b in e.b]
                    for u, v in ab:
                        put(u, v, cls, e.bandwidth, e.lanes, alpha)
                        put(v, u, cls, e.bandwidth, e.lanes, alpha)
                    cap = Fraction(e.bandwidth) * e.lanes
                    groups.append((cls, frozenset((u, v, cls) for u, v in ab), cap))
                    groups.append((cls, frozenset((v, u, cls) for u, v in ab), cap))
    nic_of = {}
    for i, n in enumerate(spec.nodes):
        for k, nic in enumerate(n.nics or []):
            for g in nic.gpus:
                nic_of[offs[i] + g] = (i, k, Fraction(nic.bandwidth), nic.lanes)
    def internode_links(it, x, y):
        lat = it.latency or {}
        if it.bandwidth == "nic":
            alpha = lat.get("nic", glat.get("nic", ALPHA_DEFAULT["nic"]))
            for a in range(spec.nodes[x].ngpus):
                for b in range(spec.nodes[y].ngpus):
                    u, v = offs[x] + a, offs[y] + b
                    bw = min(nic_of[u][2], nic_of[v][2])
                    ln = min(nic_of[u][3], nic_of[v][3])
                    put(u, v, "nic", bw, ln, alpha)
                    put(v, u, "nic", bw, ln, alpha)
            return
        alpha = lat.get("internode", glat.get("internode", ALPHA_DEFAULT["internode"]))
        for e in it.bandwidth["switch"]:
            if isinstance(e, LinkSpec):
                put(offs[x] + e.src, offs[y] + e.dst, "internode", e.bandwidth, e.lanes, alpha)
            else:
                ab = [(offs[x] + a, offs[y] + b) for a in e.a for b in e.b]
                for u, v in ab:
                    put(u, v, "internode", e.bandwidth, e.lanes, alpha)
                    put(v, u, "internode", e.bandwidth, e.lanes, alpha)
                cap = Fraction(e.bandwidth) * e.lanes
                groups.append(("internode", frozenset((u, v, "internode") for u, v in ab), cap))
                groups.append(("internode", frozenset((v, u, "internode") for u, v in ab), cap))
    for it in spec.internodes:
        if it.pair == "all":
            node_pairs = [(x, y) for x in range(len(spec.nodes)) for y in range(x + 1, len(spec.nodes))]
        else:
            node_pairs = [(idx[it.pair[0]], idx[it.pair[1]])]
        for x, y in node_pairs:
            internode_links(it, x, y)

    node_of = {offs[i] + g: i for i, n in enumerate(spec.nodes) for g in range(n.ngpus)}
    for i, n in enumerate(spec.nodes):
        for k, nic in enumerate(n.nics or []):
            mine = {offs[i] + g for g in nic.gpus}
            cap = Fraction(nic.bandwidth) * nic.lanes
            out = frozenset(key for key in links if key[2] in ("internode", "nic") and key[0] in mine
                            and node_of[key[1]] != i)
            inn = frozenset(key for key in links if key[2] in ("internode", "nic") and key[1] in mine
                            and node_of[key[0]] != i)
            for members in (out, inn):
                if members:
                    groups.append(("nic", members, cap))
    return links, sorted(groups, key=repr)


def size_of(chunk):
    if chunk is None:
        return 1 << 20
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(chunk[:-1]) * mult[chunk[-1]] if chunk[-1] in mult else int(chunk)


@settings(max_examples=examples(40))     # the thorough profile: ten times as many
@given(cluster_specs())
def test_roundtrip_matches_spec(spec):
    text = format_topology(spec)
    topo = parse_topology(text, "rt.topo")
    links, groups = oracle(spec)
    got = {(l.src, l.dst, l.cls): l for l in topo.links()}
    assert set(got) == set(links)
    for key, (bw, lanes, alpha) in links.items():
        l = got[key]
        assert l.bandwidth == float(bw * 10**9) and l.lanes == lanes
        assert math.isclose(l.alpha, float(alpha) * 1e-6, rel_tol=1e-12, abs_tol=0)
    tg = sorted(((g.kind, frozenset((int(topo.link_src[i]), int(topo.link_dst[i]),
                                     ("direct", "switch", "internode", "nic")[topo.link_class[i]])
                                    for i in g.members), g.bandwidth_gbps * g.lanes) for g in topo.groups), key=repr)
    # multisets: the repr order of a frozenset depends on string hashing, so sorted-by-repr lists may differ
    assert Counter(tg) == Counter(groups)
    # ranks, vendors
    assert topo.nranks == sum(n.ngpus for n in spec.nodes)
    for n, info in zip(spec.nodes, topo.nodes):
        assert info.vendor == (n.vendor or spec.vendor or "nvidia")
        assert info.model == n.gpu
    # chunking, from first principles
    S = size_of(spec.chunksize)
    if links:
        tau = {k: alpha / 10**6 + Fraction(S) / (bw * 10**9) for k, (bw, lanes, alpha) in links.items()}
        ref = max(tau.values())
        for k, (bw, lanes, alpha) in links.items():
            assert got[k].capacity == math.ceil(ref / tau[k]) * lanes
    # pair queries agree with the link set
    pairs = {(u, v) for (u, v, _c) in links}
    for u in range(topo.nranks):
        for v in range(topo.nranks):
            assert topo.has_link(u, v) == ((u, v) in pairs)
            if (u, v) in pairs:
                best = topo.link_between(u, v)
                cands = [got[k] for k in got if k[:2] == (u, v)]
                assert best.capacity == max(c.capacity for c in cands)
                assert topo.capacity(u, v) == sum(c.capacity for c in cands)
    # determinism
    assert format_topology(spec) == text
    again = parse_topology(text, "rt.topo")
    assert again.summary() == topo.summary()
