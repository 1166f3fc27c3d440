"""Small synthesis networks for the bound tests: :func:`unit_network` builds a
:class:`hccc.compiler.synth.problem.Network` from pairs and groups, :func:`tiny_networks` draws random
ones in GB/s, :func:`two_nic_nodes` is two meshed nodes each behind one NIC."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                format_topology, parse_topology)
from hccc.compiler.synth.problem import Network

#: bytes in a GB (the .topo files' bandwidths are in GB/s)
GB = 1e9


def unit_network(n, pairs, caps, groups, gcaps) -> Network:
    """A :class:`Network` of ``n`` ranks from its pairs (any order), their capacities, and groups
    of pair indices with theirs: the pairs sorted as the package sorts them, names ``g0``..."""
    order = sorted(range(len(pairs)), key=lambda i: pairs[i])
    pairs = [pairs[i] for i in order]
    caps = [caps[i] for i in order]
    inv = {old: new for new, old in enumerate(order)}
    members = [[] for _ in pairs]
    for g, mem in enumerate(groups):
        for old in mem:
            members[inv[old]].append(g)
    ptr = np.zeros(len(pairs) + 1, np.int64)
    ptr[1:] = np.cumsum([len(m) for m in members])
    idx = np.array([g for m in members for g in sorted(m)], np.int32)
    return Network(n, np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32),
                   np.array(caps, np.int32), ptr, idx, np.array(gcaps, np.int32),
                   [f"g{g}" for g in range(len(groups))], [np.zeros(n, np.int32)], "tiny")


def gb_network(n, pairs, bws, groups, gbws) -> Network:
    """:func:`unit_network` with bandwidths in GB/s, in its pair order."""
    order = sorted(range(len(pairs)), key=lambda i: pairs[i])
    net = unit_network(n, pairs, [1] * len(pairs), groups, [1] * len(groups))
    return replace(net, bw=np.array([bws[i] for i in order], float) * GB, gbw=np.array(gbws, float) * GB)


@st.composite
def tiny_networks(draw, max_groups: int = 2):
    """2-4 ranks joined at least by a ring, random extra pairs, up to ``max_groups`` shared groups."""
    n = draw(st.integers(2, 4))
    all_pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    keep = draw(st.lists(st.booleans(), min_size=len(all_pairs), max_size=len(all_pairs)))
    pairs = [p for p, k in zip(all_pairs, keep) if k]
    for a in range(n):  # strongly connected: a ring
        if (a, (a + 1) % n) not in pairs:
            pairs.append((a, (a + 1) % n))
    bws = [draw(st.integers(1, 5)) for _ in pairs]
    groups, gbws = [], []
    for _ in range(draw(st.integers(0, max_groups))):
        groups.append(draw(st.lists(st.integers(0, len(pairs) - 1), min_size=2, max_size=len(pairs),
                                    unique=True)))
        gbws.append(draw(st.integers(1, 5)))
    return gb_network(n, pairs, bws, groups, gbws)


def two_nic_nodes(g1: int, g2: int, nic_gbps: float, intra_gbps: int = 100):
    """Two nodes of ``g1`` and ``g2`` meshed GPUs, each node behind one NIC of ``nic_gbps``."""
    nodes = [NodeSpec(g, {"direct": [LinkSpec(a, b, intra_gbps, 2) for a in range(g) for b in range(g) if a != b]},
                      nics=[NicSpec(tuple(range(g)), nic_gbps)]) for g in (g1, g2)]
    return parse_topology(format_topology(ClusterSpec(nodes, [InternodeSpec("all", "nic")])), "two.topo")
