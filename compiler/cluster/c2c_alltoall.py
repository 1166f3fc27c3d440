"""C2C AllToAll for mixed-vendor clusters (HetCCL's hierarchical breakdown, applied to AllToAll).

Chunk ``(i*N + j)*K + k`` is piece ``k`` of the block rank ``i`` sends to rank ``j`` (the
AllToAll layout of :mod:`hccc.compiler.frontend.collectives`). With ``hier`` splitting the ranks
into homogeneous clusters, each with border ranks behind its NICs:

* a block inside one cluster goes straight to its destination (over the fewest intra-cluster hops
  when the two ranks have no direct link), from step 0;
* a block between clusters ``a`` and ``b`` is **gathered** to a border rank ``x`` of ``a`` (skipped
  when ``i`` is one), **exchanged** once from ``x`` to a border rank ``y`` of ``b``, and
  **scattered** from ``y`` to ``j``. Border ranks are chosen per (cluster pair, piece) by smooth
  weighted round robin in proportion to their NIC bandwidth, so a cluster's NICs share the
  exchange the way they share its bandwidth.

Every block between clusters crosses a cluster boundary exactly once: the cross-cluster traffic is
``sum over ordered cluster pairs of |a| * |b| * K`` chunks, the least any AllToAll can move
(:func:`min_cross_cluster_chunks`). Steps: gathers (and intra-cluster blocks) take their hop index,
the exchange happens at the step after the longest gather, the scatter hops follow it; a chunk is
written at most once per rank, so no step races.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from hccc.compiler.cluster.c2c import C2CError, _sanitize, swrr, _int_weights
from hccc.compiler.cluster.hierarchy import Hierarchy, hierarchy as build_hierarchy
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.frontend.algorithm import RECV, Algorithm, Collective, Header, TransferSite

PHASE_NAMES = ("intra", "gather", "exchange", "scatter")


@dataclass
class C2CAlltoall:
    """The generated program: transfers with their phase (index into :data:`PHASE_NAMES`)."""

    topology: Topology
    hierarchy: Hierarchy
    chunks_per_rank: int
    rows: np.ndarray        # int64 (M, 5): src, dst, step, chunk, op
    phase: np.ndarray       # int64 (M,)
    name: str

    @property
    def nranks(self) -> int:
        return self.hierarchy.nranks

    def header(self) -> Header:
        gpn = max((nd.ngpus for nd in self.topology.nodes), default=self.nranks)
        return Header(nranks=self.nranks, collective=Collective.ALLTOALL, name=self.name,
                      gpu_per_node=gpn, nic_per_node=0, chunks_per_rank=self.chunks_per_rank,
                      nchannels_given=True)      # (the text writes nChannels)

    def _text_order(self) -> np.ndarray:
        """The rows in the order :meth:`rccl` writes them: by step, phase, source, destination, chunk."""
        return np.lexsort((self.rows[:, 3], self.rows[:, 1], self.rows[:, 0], self.phase, self.rows[:, 2]))

    def algorithm(self) -> Algorithm:
        """The transfers as an :class:`Algorithm` (one anonymous site), in the order of
        :meth:`rccl`'s lines: what that text parses to, and so the same compiled program."""
        h = self.header()
        r = self.rows[self._text_order()]
        n = len(r)
        return Algorithm(header=h, src=r[:, 0].copy(), dst=r[:, 1].copy(), step=r[:, 2].copy(),
                         chunk=r[:, 3].copy(), op=r[:, 4].astype(np.uint8), site=np.zeros(n, np.int64),
                         sites=[TransferSite(None, ())], loop_values=[np.zeros((n, 0), np.int64)])

    def cross_cluster_chunks(self) -> int:
        rc = self.hierarchy.rank_cluster
        return int((rc[self.rows[:, 0]] != rc[self.rows[:, 1]]).sum())

    def summary(self) -> dict:
        return {"collective": "alltoall", "nranks": self.nranks, "name": self.name,
                "chunks_per_rank": self.chunks_per_rank, "transfers": int(len(self.rows)),
                "steps": int(np.unique(self.rows[:, 2]).size) if len(self.rows) else 0,
                "cross_cluster_chunks": self.cross_cluster_chunks(),
                "min_cross_cluster_chunks": min_cross_cluster_chunks(self.hierarchy, self.chunks_per_rank),
                "clusters": [c.summary() for c in self.hierarchy.clusters]}

    def rccl(self) -> str:
        h = self.header()
        s = self.summary()
        out = [f"# C2C AllToAll on {self.topology.name}: {len(self.hierarchy.clusters)} cluster(s), "
               f"{s['cross_cluster_chunks']} chunks cross clusters (the minimum is "
               f"{s['min_cross_cluster_chunks']})",
               "# chunk (i*nRanks + j)*nChunksPerRank + k: piece k of the block rank i sends to rank j",
               f'def ResCCLAlgo(nRanks={h.nranks}, nChannels=1, nWarps=16, AlgoName="{h.name}", '
               f'OpType="Alltoall", GPUPerNode={h.gpu_per_node}, NICPerNode=0, '
               f'nChunksPerRank={h.chunks_per_rank}):']
        order = self._text_order()
        last = None
        for i in order.tolist():
            src, dst, step, chunk, _ = (int(x) for x in self.rows[i])
            key = (step, int(self.phase[i]))
            if key != last:
                out.append(f"    # step {step}: {PHASE_NAMES[key[1]]}")
                last = key
            out.append(f"    transfer({src}, {dst}, {step}, {chunk}, recv)")
        if not len(order):
            out.append("    n = 0")
        return "\n".join(out) + "\n"


def min_cross_cluster_chunks(hier: Hierarchy, chunks_per_rank: int = 1) -> int:
    """Chunks any AllToAll must move between clusters: one per piece of every block whose ranks
    sit in different clusters."""
    sizes = np.array([c.nranks for c in hier.clusters], np.int64)
    return int((sizes.sum() ** 2 - (sizes ** 2).sum()) * chunks_per_rank)


def _intra_paths(topo: Topology, ranks) -> dict[int, dict[int, list[int]]]:
    """Fewest-hop paths inside one cluster (BFS over its links), per source: dst -> rank list."""
    ps, pd = topo.pairs()
    members = set(int(r) for r in ranks)
    adj: dict[int, list[int]] = {r: [] for r in members}
    for a, b in zip(ps.tolist(), pd.tolist()):
        if a in members and b in members:
            adj[a].append(b)
    g = nx.DiGraph()
    g.add_nodes_from(sorted(members))
    for a in sorted(members):
        g.add_edges_from((a, b) for b in adj[a])
    return {s: nx.single_source_shortest_path(g, s) for s in members}


def plan_c2c_alltoall(topology: Topology, *, hier: Hierarchy | None = None, chunks_per_rank: int = 1,
                      name: str | None = None) -> C2CAlltoall:
    """Generate the C2C AllToAll (see the module docstring); :class:`C2CError` when a cluster has
    no border rank, two ranks of a cluster cannot reach each other inside it, or two clusters'
    border ranks have no link."""
    K = int(chunks_per_rank)
    if K < 1:
        raise C2CError(f"the pipeline depth must be at least 1, got {chunks_per_rank}")
    hier = hier if hier is not None else build_hierarchy(topology)
    N = topology.nranks
    clusters = hier.clusters
    C = len(clusters)
    for c in clusters:
        if C > 1 and not c.border_ranks:
            raise C2CError(f"cluster {c.name} has no border rank: no NIC and no link to another cluster")
    paths = {}
    for c in clusters:
        paths.update(_intra_paths(topology, c.ranks))
    ps, pd = topology.pairs()
    linked = set(zip(ps.tolist(), pd.tolist()))
    legs = []
    for a in range(C):
        for b in range(C):
            if a == b:
                legs += _intra_legs(clusters[a], paths, N, K)
            else:
                legs += _cross_legs(clusters[a], clusters[b], paths, linked, N, K)
    arr, phase = _rows(legs)
    nm = _sanitize(name if name else f"c2c_alltoall_{topology.name}")
    return C2CAlltoall(topology, hier, K, arr, np.asarray(phase, np.int64), nm)


#: one block's route: (chunk, [ranks of the gather ... x], (x, y) across clusters or None, [y ... j])
Leg = tuple[int, list[int], "tuple[int, int] | None", list[int]]


def _path(paths: dict, a: int, b: int) -> list[int]:
    p = paths.get(a, {}).get(b)
    if p is None:
        raise C2CError(f"rank {b} cannot be reached from rank {a} inside their cluster")
    return p


def _intra_legs(ca, paths: dict, N: int, K: int) -> list[Leg]:
    """Blocks between two ranks of one cluster: its shortest path."""
    legs = []
    for i in ca.ranks:
        for j in ca.ranks:
            if i != j:
                for k in range(K):
                    legs.append(((i * N + j) * K + k, _path(paths, i, j), None, [j]))
    return legs


def _cross_legs(ca, cb, paths: dict, linked: set, N: int, K: int) -> list[Leg]:
    """Blocks from cluster ``ca`` to ``cb``: gathered to a border rank of ``ca`` (spread by NIC
    speed), across to one of ``cb``, scattered to their ranks."""
    legs = []
    wa = _int_weights([ca.nic_gbps.get(x, 1) or 1 for x in ca.border_ranks])
    wb = _int_weights([cb.nic_gbps.get(y, 1) or 1 for y in cb.border_ranks])
    blocks = [(i, j, k) for k in range(K) for i in ca.ranks for j in cb.ranks]
    xs = np.asarray(ca.border_ranks)[swrr(wa, len(blocks))]
    ys = np.asarray(cb.border_ranks)[swrr(wb, len(blocks))]
    for (i, j, k), x, y in zip(blocks, xs.tolist(), ys.tolist()):
        if i in ca.border_ranks:
            x = i    # a border rank sends its own blocks itself
        if j in cb.border_ranks:
            y = j    # and receives its own
        if (x, y) not in linked:
            alt = [yy for yy in cb.border_ranks if (x, yy) in linked]
            if not alt:
                raise C2CError(f"border rank {x} of cluster {ca.name} has no link to cluster {cb.name}")
            y = alt[(i + j + k) % len(alt)]
        legs.append(((i * N + j) * K + k, _path(paths, i, x), (x, y), _path(paths, y, j)))
    return legs


def _rows(legs: list[Leg]) -> tuple[np.ndarray, list[int]]:
    """The transfers (src, dst, step, chunk, RECV) of every leg, and each one's phase."""
    longest_gather = max((len(g) - 1 for _, g, ex, _ in legs if ex is not None), default=0)
    rows, phase = [], []
    for c, g, ex, s in legs:
        intra = ex is None
        for h in range(len(g) - 1):
            rows.append((g[h], g[h + 1], h, c, RECV))
            phase.append(0 if intra else 1)
        if intra:
            continue
        rows.append((ex[0], ex[1], longest_gather, c, RECV))
        phase.append(2)
        for h in range(len(s) - 1):
            rows.append((s[h], s[h + 1], longest_gather + 1 + h, c, RECV))
            phase.append(3)
    return np.asarray(rows, np.int64).reshape(-1, 5), phase


__all__ = ["C2CAlltoall", "plan_c2c_alltoall", "min_cross_cluster_chunks", "PHASE_NAMES"]
