"""The second pass over a ``.topo`` file: its scopes (:mod:`~hccc.compiler.cluster.topo_scopes`)
built into a :class:`~hccc.compiler.cluster.topology.Topology`, phase by phase: the cluster-wide
defaults, the nodes, the links inside each node, the links between nodes (counted before any is
built), the NICs and the PCIe switches. Every value is read, and every refusal located, by
:class:`~hccc.compiler.cluster.topo_values.ValueReader`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from fractions import Fraction

from lark import Token, Tree

from hccc.compiler.cluster.topo_devices import nic_devices, pcie_groups
from hccc.compiler.cluster.topo_limits import MAX_BANDWIDTH_GBPS, MAX_LATENCY_US, MAX_LINKS, MIN_BANDWIDTH_GBPS
from hccc.compiler.cluster.topo_links import DeclaredLinks
from hccc.compiler.cluster.topo_scopes import Defs, InterScope, NodeScope, Scopes
from hccc.compiler.cluster.topo_values import ValueReader
from hccc.compiler.cluster.topology import DEFAULT_ALPHA_US, DEFAULT_CHUNK_SIZE, Topology, TopologyBuilder
from hccc.util.diagnostics import Location, did_you_mean

#: the link classes a latency map may name, by where it stands
_CLUSTER_LATENCY = ("direct", "switch", "internode", "nic")
_NODE_LATENCY = ("direct", "switch")
_INTER_LATENCY = ("internode", "nic")


@dataclass
class _Defaults:
    """What the statements before the first node say for the whole cluster."""

    latency: dict[str, Fraction] = field(default_factory=dict)
    vendor: str = "nvidia"
    model: str | None = None
    gamma: Fraction | None = None
    gamma_by_vendor: dict[str, Fraction] = field(default_factory=dict)

    def alpha(self, cls: str, local: dict[str, Fraction]) -> Fraction:
        """The latency of a link class: the scope's own, else the cluster's, else the default."""
        return local.get(cls, self.latency.get(cls, DEFAULT_ALPHA_US[cls]))


def build_topology(scopes: Scopes, values: ValueReader, name: str) -> Topology:
    """The topology the scopes describe; a value or combination that cannot be built is a located error."""
    links = DeclaredLinks(TopologyBuilder(name), values)
    defaults = _defaults(scopes.globals, values)
    offsets = _add_nodes(links.b, scopes, values, defaults)
    _intra_links(links, scopes, defaults, offsets)
    # inter-node links: counted first, so that a cluster over the link limit is refused before
    # any of its node pairs is built
    check_internode_links(scopes, values, links.b.nlinks)
    nic_pairs = _inter_links(links, scopes, defaults, offsets)
    nic_devices(links, scopes, offsets, defaults.latency, nic_pairs)
    pcie_groups(links, scopes, offsets, defaults.latency)
    chunk = scopes.chunksize[1] if scopes.chunksize else DEFAULT_CHUNK_SIZE
    return links.build(chunk, scopes.chunksize[0] if scopes.chunksize else None)


def _latency(values: ValueReader, defs: Defs, keys: tuple[str, ...]) -> dict[str, Fraction]:
    if "latency" not in defs:
        return {}
    loc, v = defs["latency"]
    return values.scalar_map(loc, v, keys, "latency", nonneg=True, maximum=MAX_LATENCY_US)


def _defaults(defs: Defs, values: ValueReader) -> _Defaults:
    d = _Defaults(latency=_latency(values, defs, _CLUSTER_LATENCY))
    if "vendor" in defs:
        d.vendor = values.vendor(defs["vendor"][1])
    if "gpu" in defs:
        d.model = values.model(defs["gpu"][1])
    if "gamma" in defs:
        loc, v = defs["gamma"]
        if isinstance(v, Tree) and v.data == "map":
            d.gamma_by_vendor = values.scalar_map(loc, v, ("nvidia", "amd"), "gamma", maximum=MAX_BANDWIDTH_GBPS,
                                                  minimum=MIN_BANDWIDTH_GBPS)
        else:
            d.gamma = values.rate(v)
    return d


def _add_nodes(b: TopologyBuilder, scopes: Scopes, values: ValueReader, defaults: _Defaults) -> dict[str, int]:
    """Every node with its vendor, GPU model and compute rate; returns each node's first rank."""
    offsets = {}
    for nd in scopes.nodes:
        vendor = values.vendor(nd.defs["vendor"][1]) if "vendor" in nd.defs else defaults.vendor
        model = values.model(nd.defs["gpu"][1]) if "gpu" in nd.defs else defaults.model
        if "gamma" in nd.defs:
            gamma = values.rate(nd.defs["gamma"][1])
        else:
            gamma = defaults.gamma_by_vendor.get(vendor, defaults.gamma)
        offsets[nd.name] = b.add_node(nd.name, nd.ngpus, vendor, model, gamma).offset
    return offsets


def _intra_links(links: DeclaredLinks, scopes: Scopes, defaults: _Defaults, offsets: dict[str, int]) -> None:
    """``define bandwidth = {...}`` of every node."""
    for nd in scopes.nodes:
        off = offsets[nd.name]
        lat = _latency(links.v, nd.defs, _NODE_LATENCY)
        if "bandwidth" in nd.defs:
            for cls, entries in links.v.bwmap(nd.defs["bandwidth"][1], "bandwidth"):
                for e in entries:
                    links.entry(e, cls, nd, nd, off, off, lambda c: defaults.alpha(c, lat), intra=True)


def _node_pairs(values: ValueReader, scopes: Scopes, it: InterScope, seen: dict[tuple[str, str], Location]):
    """The node pairs an internode statement joins (each named pair at most once in a file)."""
    if it.pair is None:
        return itertools.combinations(scopes.nodes, 2)
    nodes = []
    for tok in it.pair:
        if str(tok) not in scopes.node_by_name:
            raise values.err(tok, f"internode names an undefined node '{tok}'")
        nodes.append(scopes.node_by_name[str(tok)])
    if nodes[0] is nodes[1]:
        raise values.err(it.pair[1], f"internode connects {nodes[0].name} to itself")
    key = (nodes[0].name, nodes[1].name)
    if key in seen:
        raise values.err(it.loc, f"internode ({key[0]}, {key[1]}) is already defined at {seen[key]}")
    seen[key] = it.loc
    return [(nodes[0], nodes[1])]


def _inter_links(links: DeclaredLinks, scopes: Scopes, defaults: _Defaults,
                 offsets: dict[str, int]) -> list[tuple[NodeScope, NodeScope, Fraction, Location]]:
    """The links of every internode statement with a bandwidth map; returns the node pairs joined
    through their NICs (``interbandwidth = nic``), built once the NICs are read."""
    v = links.v
    seen_pairs: dict[tuple[str, str], Location] = {}
    nic_pairs: list[tuple[NodeScope, NodeScope, Fraction, Location]] = []
    for it in scopes.inters:
        lat = _latency(v, it.defs, _INTER_LATENCY)
        pairs = _node_pairs(v, scopes, it, seen_pairs)
        bv = it.defs["interbandwidth"][1]
        if isinstance(bv, Tree) and bv.data == "name":
            if str(bv.children[0]) != "nic":
                raise v.err(bv, "interbandwidth expects a map {direct => [...], switch => [...]} or 'nic'"
                            + did_you_mean(str(bv.children[0]), ("nic",)))
            for x, y in pairs:
                nic_pairs.append((x, y, defaults.alpha("nic", lat), v.loc(bv)))
            continue
        classes = v.bwmap(bv, "interbandwidth")
        for x, y in pairs:
            for _cls, entries in classes:
                for e in entries:
                    links.entry(e, "internode", x, y, offsets[x.name], offsets[y.name],
                                lambda c: defaults.alpha(c, lat), intra=False)
    return nic_pairs


def check_internode_links(scopes: Scopes, values: ValueReader, nlinks: int) -> None:
    """Refuse, before building them, inter-node statements that would take the cluster past
    :data:`MAX_LINKS` (``nlinks``: the links built so far): ``internode = all`` with
    ``interbandwidth = nic`` links every GPU to every GPU of every other node (with G GPUs in all and
    g_k on node k: G**2 - sum g_k**2 links), and a map's entries repeat for every node pair."""
    total = nlinks
    sizes = [nd.ngpus for nd in scopes.nodes]
    everyone = sum(sizes) ** 2 - sum(g * g for g in sizes)     # ordered GPU pairs across nodes
    for it in scopes.inters:
        bv = it.defs["interbandwidth"][1]
        if it.pair is None:
            npairs = len(sizes) * (len(sizes) - 1) // 2
        elif all(str(t) in scopes.node_by_name for t in it.pair):
            npairs = 1
        else:
            continue                       # the build reports the undefined node, located
        if isinstance(bv, Tree) and bv.data == "name":
            if it.pair is None:
                adds = everyone
            else:
                x, y = (scopes.node_by_name[str(t)] for t in it.pair)
                adds = 2 * x.ngpus * y.ngpus
        elif isinstance(bv, Tree) and bv.data == "map":
            adds = npairs * _links_per_pair(bv)
        else:
            continue                       # the build reports the malformed value, located
        total += adds
        if total > MAX_LINKS:
            what = ("internode = all" if it.pair is None else "this internode") + (
                " with interbandwidth = nic links every GPU to every GPU of the other node(s)"
                if isinstance(bv, Tree) and bv.data == "name" else "")
            raise values.err(it.loc, f"{what}: the cluster would have {total} links or more, over the "
                                     f"limit of {MAX_LINKS} (checked before any is built)")


def _links_per_pair(bwmap: Tree) -> int:
    """The links an interbandwidth map's entries make between one pair of nodes (as written,
    before any value is checked)."""
    per_pair = 0
    for item in bwmap.children:
        lst = item.children[1]
        for e in (lst.children if isinstance(lst, Tree) and lst.data == "list" else ()):
            if isinstance(e, Tree) and e.data == "link":
                per_pair += 1
            elif isinstance(e, Tree) and len(e.children) == 3:
                na, nb = (sum(isinstance(t, Token) for t in g.children) for g in e.children[:2])
                per_pair += 2 * na * nb
    return per_pair
