"""Hierarchical topology abstraction of a mixed-vendor cluster (HetCCL section 4.2.1).

HetCCL groups the GPUs of a heterogeneous cluster into homogeneous *clusters*: sets of GPUs on which one
vendor library can run a collective by itself (same vendor, here also the same GPU model, and joined by
their own links). Inside a cluster, the ranks closest to an RDMA NIC are its *border ranks*; every
other rank is an *internal rank*. Cluster-to-cluster traffic goes through border ranks only,
split between them in proportion to their NIC bandwidth.

How hccc reads this from a :class:`~hccc.compiler.cluster.topology.Topology`:

* **Clusters.** Nodes with the same key (``by="model"``: vendor and GPU model; ``by="vendor"``: vendor
  only) that are linked to each other (directly, or through other nodes of the same key) form one
  cluster: the connected components of the node graph restricted to one key. Clusters are numbered in
  the order of their first node. ``nodes_per_cluster=M`` splits every cluster into consecutive groups
  of at most ``M`` nodes (HetCCL's sub-clusters, e.g. its "2+2" split of four homogeneous nodes);
  ``partition`` names the clusters explicitly (lists of node names or indices, one vendor each).
* **Border ranks.** HetCCL: the ranks with the minimum NUMA distance to an RDMA NIC. A NIC here is an
  egress shared group of kind ``nic`` (``define nic = [((0,1) -> (50,1))]``): the GPUs listed behind it
  share it and are equally close to it, so with ``border="nic"`` (default) *every* GPU behind a NIC is a
  border rank, with an equal share of the NIC's bandwidth (per-lane bandwidth x lanes / GPUs behind it).
  ``border="one-per-nic"`` keeps only the lowest GPU behind each NIC, with the whole NIC (HetCCL's
  Fig. 20 picture: a NIC attached to one GPU of a pair). A node without NIC groups (plain HeteCCL
  syntax) has as border ranks the GPUs with a link leaving their cluster, each at the bandwidth of its
  best such link capped by the shared groups the link belongs to. Every other rank is internal.

Everything here is plain data; :meth:`Hierarchy.summary` is JSON-serialisable and
:meth:`Hierarchy.describe` renders it as text (what ``hccc topo`` prints).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Sequence

import numpy as np
from networkx.utils import UnionFind

from hccc.compiler.cluster.topology import GB, Topology

__all__ = ["VendorCluster", "Hierarchy", "hierarchy", "HierarchyError", "BORDER_RULES"]


class HierarchyError(ValueError):
    """The requested clustering does not fit the topology (bad partition, unknown node, ...)."""


@dataclass(frozen=True)
class VendorCluster:
    """One homogeneous cluster of the hierarchy.

    ``nic_gbps[b]`` is the NIC bandwidth (GB/s, exact) available to border rank ``b`` (its share of a
    NIC shared with other border ranks); ``nic_members[b]`` are the ranks behind the same NIC (``b``
    included). Rank tuples are ascending.
    """

    index: int
    name: str
    vendor: str
    model: str | None            # None when the nodes' models differ (or are not given)
    nodes: tuple[str, ...]       # node names, in definition order
    ranks: tuple[int, ...]
    border_ranks: tuple[int, ...]
    internal_ranks: tuple[int, ...]
    nic_gbps: Mapping[int, Fraction] = field(default_factory=dict)
    nic_members: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    border_source: str = "nic"   # "nic" (NIC groups), "links" (fallback), "mixed" or "none"

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    @property
    def nic_bandwidth(self) -> dict[int, float]:
        """Border rank -> NIC bandwidth in bytes/s."""
        return {r: float(bw * GB) for r, bw in self.nic_gbps.items()}

    @property
    def total_nic_gbps(self) -> Fraction:
        return sum(self.nic_gbps.values(), Fraction(0))

    def summary(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "vendor": self.vendor,
            "model": self.model,
            "nodes": list(self.nodes),
            "ranks": list(self.ranks),
            "border_ranks": list(self.border_ranks),
            "internal_ranks": list(self.internal_ranks),
            "nic_gbps": {str(r): float(self.nic_gbps[r]) for r in self.border_ranks},
            "nic_members": {str(r): list(self.nic_members.get(r, (r,))) for r in self.border_ranks},
            "total_nic_gbps": float(self.total_nic_gbps),
            "border_source": self.border_source,
        }


@dataclass(frozen=True)
class Hierarchy:
    """Clusters of a topology; ``rank_cluster[r]`` is the index of rank ``r``'s cluster."""

    topology_name: str
    nranks: int
    clusters: tuple[VendorCluster, ...]
    rank_cluster: np.ndarray = field(compare=False, repr=False)
    by: str = "model"

    @property
    def nclusters(self) -> int:
        return len(self.clusters)

    @property
    def mixed_vendor(self) -> bool:
        return len({c.vendor for c in self.clusters}) > 1

    def cluster_of(self, rank: int) -> VendorCluster:
        return self.clusters[int(self.rank_cluster[int(rank)])]

    def summary(self) -> dict:
        """Plain data (JSON-serialisable) for ``hccc topo --json`` and ``hccc gen``."""
        return {
            "topology": self.topology_name,
            "nranks": self.nranks,
            "by": self.by,
            "nclusters": self.nclusters,
            "mixed_vendor": self.mixed_vendor,
            "clusters": [c.summary() for c in self.clusters],
        }

    def describe(self) -> str:
        """Human-readable lines, one block per cluster."""
        lines = [f"hierarchy: {self.nclusters} homogeneous cluster{'s' if self.nclusters != 1 else ''}"
                 f" ({'mixed vendors' if self.mixed_vendor else 'one vendor'}; grouped by {self.by})"]
        for c in self.clusters:
            what = c.vendor + (f" {c.model}" if c.model else "")
            lines.append(f"  {c.name}: {what}, {c.nranks} rank{'s' if c.nranks != 1 else ''} "
                         f"({rank_ranges(c.ranks)}) on {', '.join(c.nodes)}")
            if c.border_ranks:
                parts = []
                for b in c.border_ranks:
                    mem = c.nic_members.get(b, (b,))
                    behind = f" for {rank_ranges(mem)}" if len(mem) > 1 else ""
                    parts.append(f"{b} ({_num(c.nic_gbps[b])} GB/s{behind})")
                lines.append(f"    border ranks: {', '.join(parts)}; NIC total {_num(c.total_nic_gbps)} GB/s")
            else:
                lines.append("    border ranks: none (no NIC or link leaves this cluster)")
            lines.append(f"    internal ranks: {rank_ranges(c.internal_ranks) if c.internal_ranks else 'none'}")
        return "\n".join(lines)


def _num(x: Fraction) -> str:
    return str(int(x)) if x.denominator == 1 else f"{float(x):g}"


def rank_ranges(ranks: Sequence[int]) -> str:
    """``0-3, 8, 10-11``."""
    out = []
    rs = sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


# ---------------------------------------------------------------------------------------- clustering
def _node_adjacency(topo: Topology) -> set[tuple[int, int]]:
    """Unordered pairs of node indices joined by at least one link."""
    a = topo.rank_node[topo.link_src].astype(np.int64)
    b = topo.rank_node[topo.link_dst].astype(np.int64)
    m = a != b
    lo, hi = np.minimum(a[m], b[m]), np.maximum(a[m], b[m])
    key = np.unique(lo * len(topo.nodes) + hi)
    return {(int(k) // len(topo.nodes), int(k) % len(topo.nodes)) for k in key}


def _components(members: list[int], adj: set[tuple[int, int]]) -> list[list[int]]:
    uf = UnionFind(members)
    for u, v in adj:
        if u in uf.parents and v in uf.parents:
            uf.union(u, v)
    return sorted((sorted(g) for g in uf.to_sets()), key=lambda g: g[0])


def _node_index(topo: Topology, item) -> int:
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        if 0 <= int(item) < len(topo.nodes):
            return int(item)
        raise HierarchyError(f"node index {item} out of range (the cluster has {len(topo.nodes)} nodes)")
    for nd in topo.nodes:
        if nd.name == str(item):
            return nd.index
    raise HierarchyError(f"unknown node '{item}' (nodes: {', '.join(nd.name for nd in topo.nodes)})")


def _node_groups(topo: Topology, by: str, nodes_per_cluster: int | None,
                 partition: Sequence[Sequence] | None) -> list[list[int]]:
    if partition is not None:
        groups = [[_node_index(topo, x) for x in part] for part in partition]
        flat = [i for g in groups for i in g]
        if any(not g for g in groups):
            raise HierarchyError("a cluster of the partition has no nodes")
        if sorted(flat) != list(range(len(topo.nodes))):
            dup = sorted({i for i in flat if flat.count(i) > 1})
            missing = sorted(set(range(len(topo.nodes))) - set(flat))
            what = (f"node {topo.nodes[dup[0]].name} is in two clusters" if dup
                    else f"node {topo.nodes[missing[0]].name} is in no cluster")
            raise HierarchyError(f"the partition must name every node exactly once: {what}")
        for g in groups:
            vendors = {topo.nodes[i].vendor for i in g}
            if len(vendors) > 1:
                raise HierarchyError(f"a cluster must be homogeneous, but nodes "
                                     f"{', '.join(topo.nodes[i].name for i in g)} mix vendors "
                                     f"{', '.join(sorted(vendors))}")
        groups = [sorted(g) for g in groups]
        groups.sort(key=lambda g: g[0])
    else:
        if by not in ("model", "vendor"):
            raise HierarchyError(f"unknown grouping {by!r} (expected 'model' or 'vendor')")
        keys: dict[tuple, list[int]] = {}
        for nd in topo.nodes:
            key = (nd.vendor, nd.model) if by == "model" else (nd.vendor,)
            keys.setdefault(key, []).append(nd.index)
        adj = _node_adjacency(topo)
        groups = []
        for members in keys.values():
            groups.extend(_components(members, adj))
        groups.sort(key=lambda g: g[0])
    if nodes_per_cluster is not None:
        if int(nodes_per_cluster) < 1:
            raise HierarchyError("nodes_per_cluster must be at least 1")
        m = int(nodes_per_cluster)
        groups = [g[i:i + m] for g in groups for i in range(0, len(g), m)]
    return groups


# ---------------------------------------------------------------------------------------- border ranks
def _nic_devices(topo: Topology) -> dict[int, list[tuple[tuple[int, ...], Fraction]]]:
    """Node index -> NICs of that node as (GPUs behind it, bandwidth GB/s), from egress NIC groups."""
    out: dict[int, list[tuple[tuple[int, ...], Fraction]]] = {}
    for g in topo.groups:
        if g.kind != "nic" or g.direction != "egress" or not g.members.size:
            continue
        gpus = tuple(sorted(set(topo.link_src[g.members].tolist())))
        node = int(topo.rank_node[gpus[0]])
        out.setdefault(node, []).append((gpus, g.bandwidth_gbps * g.lanes))
    for v in out.values():
        v.sort()
    return out


def _link_gbps(topo: Topology, i: int) -> Fraction:
    """Bandwidth of link ``i`` (all lanes), capped by the capacity of each shared group it is in."""
    p = topo.params[int(topo.link_param[i])]
    bw = p.bandwidth_gbps * p.lanes
    for gid in topo.groups_of_link(i):
        g = topo.groups[gid]
        bw = min(bw, g.bandwidth_gbps * g.lanes)
    return bw


BORDER_RULES = ("nic", "one-per-nic")


def hierarchy(topology: Topology, *, by: str = "model", nodes_per_cluster: int | None = None,
              partition: Sequence[Sequence] | None = None, border: str = "nic") -> Hierarchy:
    """The homogeneous clusters of ``topology`` with their border and internal ranks (module docstring).

    Raises :class:`HierarchyError` for a partition that does not fit the topology or an unknown option.
    """
    if border not in BORDER_RULES:
        raise HierarchyError(f"unknown border-rank rule {border!r} (expected 'nic' or 'one-per-nic')")
    groups = _node_groups(topology, by, nodes_per_cluster, partition)
    nics = _nic_devices(topology)
    rank_cluster = np.full(topology.nranks, -1, dtype=np.int64)
    for ci, g in enumerate(groups):
        for ni in g:
            rank_cluster[list(topology.nodes[ni].ranks)] = ci
    # fallback border ranks (nodes without NICs only): best link leaving the cluster, per rank
    no_nic = np.array([nd.index not in nics for nd in topology.nodes], dtype=bool)
    leaving = (rank_cluster[topology.link_src] != rank_cluster[topology.link_dst]) \
        & no_nic[topology.rank_node[topology.link_src]]
    best_out: dict[int, Fraction] = {}
    for i in np.flatnonzero(leaving).tolist():
        s = int(topology.link_src[i])
        bw = _link_gbps(topology, i)
        if bw > best_out.get(s, Fraction(-1)):
            best_out[s] = bw

    bases = []
    for g in groups:
        models = {topology.nodes[i].model for i in g}
        model = models.pop() if len(models) == 1 else None
        vendor = topology.nodes[g[0]].vendor  # one vendor per group (checked above)
        bases.append((vendor, model, vendor + (f"-{model}" if model else "")))
    clusters = []
    same_base: dict[str, list[int]] = {}          # clusters of each base name, in order (linear time)
    position: dict[int, int] = {}
    for ci, b in enumerate(bases):
        position[ci] = len(same_base.setdefault(b[2], []))
        same_base[b[2]].append(ci)
    for ci, g in enumerate(groups):
        nds = [topology.nodes[i] for i in g]
        vendor, model, base = bases[ci]
        same = same_base[base]
        name = base if len(same) == 1 else f"{base}-{position[ci]}"
        ranks = sorted(r for nd in nds for r in nd.ranks)
        nic_gbps: dict[int, Fraction] = {}
        members: dict[int, tuple[int, ...]] = {}
        sources = set()
        for nd in nds:
            if nd.index in nics:
                sources.add("nic")
                for gpus, bw in nics[nd.index]:
                    chosen = gpus if border == "nic" else gpus[:1]
                    for b in chosen:  # a GPU behind two NICs gets both shares
                        nic_gbps[b] = nic_gbps.get(b, Fraction(0)) + bw / len(chosen)
                        members[b] = tuple(sorted(set(members.get(b, ())) | set(gpus)))
            else:
                found = [r for r in nd.ranks if r in best_out]
                if found:
                    sources.add("links")
                for r in found:
                    nic_gbps[r] = best_out[r]
                    members[r] = (r,)
        border_ranks = tuple(sorted(nic_gbps))
        source = "none" if not sources else (sources.pop() if len(sources) == 1 else "mixed")
        clusters.append(VendorCluster(
            index=ci, name=name, vendor=vendor, model=model, nodes=tuple(nd.name for nd in nds),
            ranks=tuple(ranks), border_ranks=border_ranks,
            internal_ranks=tuple(r for r in ranks if r not in nic_gbps),
            nic_gbps={b: nic_gbps[b] for b in border_ranks}, nic_members={b: members[b] for b in border_ranks},
            border_source=source))
    return Hierarchy(topology.name, topology.nranks, tuple(clusters), rank_cluster, by)
