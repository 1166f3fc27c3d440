"""The synthesis model (HeteCCL sections 4-5): a cluster as chunk capacities, and a dissemination task.

A :class:`Network` is what the synthesizer sees of a :class:`~hccc.compiler.cluster.topology.Topology`:

* **pairs** ``u -> v`` (every connected ordered rank pair), each carrying at most ``cap[p] = C(u, v)``
  chunks per step, where ``C`` is HeteCCL's logical capacity (Eq. 1) of the link a transfer from u
  to v runs on: the pair's *best* link (``Topology.link_between``: highest C, then bandwidth), which
  is also the link the simulator uses;
* **shared groups** ``g`` (PCIe switch, UPI, NVSwitch port, NIC): at most ``gcap[g] = C_g`` chunks
  per step over all pairs whose link belongs to ``g`` (Eq. 5);
* a **hierarchy** of nested partitions of the ranks used by the greedy heuristic: nodes, then
  *islands* inside a node (ranks joined by pairs that no bottleneck group throttles), then single
  ranks. The hierarchy only steers the heuristic; constraints never depend on it.

A :class:`Task` is a dissemination problem over ``nchunks`` chunks: which rank holds which chunk at
step 0 (``origin``; AllGather: chunk ``k`` at rank ``k // chunks_per_rank``; Broadcast: all at the
root) and the requirement that every rank ends with every chunk. ``fanout_one`` adds HeteCCL's
Eq. 8 (a rank forwards a chunk to at most one peer per step), which makes the time-reversed schedule
a valid ReduceScatter (two reductions into one (rank, chunk) in one step would race).

A :class:`Schedule` is a transfer table ``(src, dst, step, chunk)`` (numpy columns) with its step
count. Steps are rounds: all transfers of a step read the state before the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.cluster.topology import Topology


@dataclass
class Network:
    """Rank pairs with chunk capacities, shared groups, and the heuristic hierarchy (see module doc)."""

    nranks: int
    psrc: np.ndarray          # int32 (P,), sorted by (src, dst)
    pdst: np.ndarray          # int32 (P,)
    cap: np.ndarray           # int32 (P,)  C(u, v)
    pg_ptr: np.ndarray        # int64 (P+1,) pair -> groups CSR
    pg_idx: np.ndarray        # int32
    gcap: np.ndarray          # int32 (G,)  C_g
    glabel: list[str]         # human-readable group names (counterexamples)
    levels: list[np.ndarray]  # partitions, coarse to fine: levels[i][rank] = part id (level 0 = nodes)
    name: str = "<network>"
    # optional bandwidth view (bytes/s) for the cut bound
    bw: np.ndarray | None = None       # float64 (P,) pair bandwidth (all parallel links)
    gbw: np.ndarray | None = None      # float64 (G,) group capacity in bytes/s
    _in_csr: tuple | None = field(default=None, repr=False)
    _out_csr: tuple | None = field(default=None, repr=False)
    _spread: tuple | None = field(default=None, repr=False)
    _self_transposed: bool | None = field(default=None, repr=False)

    @property
    def npairs(self) -> int:
        return int(self.psrc.size)

    @property
    def ngroups(self) -> int:
        return int(self.gcap.size)

    def pair_index(self, src, dst) -> np.ndarray:
        """Index of each (src, dst) among the pairs, -1 where unconnected."""
        n = self.nranks
        keys = self.psrc.astype(np.int64) * n + self.pdst
        want = np.asarray(src, np.int64) * n + np.asarray(dst, np.int64)
        pos = np.searchsorted(keys, want)
        posc = np.minimum(pos, max(keys.size - 1, 0))
        ok = (pos < keys.size) & (keys[posc] == want) if keys.size else np.zeros(want.shape, bool)
        return np.where(ok, pos, -1)

    def in_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, pair ids) of the pairs entering each rank."""
        if self._in_csr is None:
            order = np.argsort(self.pdst, kind="stable").astype(np.int32)
            ptr = np.searchsorted(self.pdst[order], np.arange(self.nranks + 1)).astype(np.int64)
            self._in_csr = (ptr, order)
        return self._in_csr

    def out_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, pair ids) of the pairs leaving each rank."""
        if self._out_csr is None:
            ptr = np.searchsorted(self.psrc, np.arange(self.nranks + 1)).astype(np.int64)
            self._out_csr = (ptr, np.arange(self.npairs, dtype=np.int32))
        return self._out_csr

    def pair_group_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(pair, group) for every membership (the CSR expanded)."""
        return np.repeat(np.arange(self.npairs), np.diff(self.pg_ptr)), self.pg_idx.astype(np.int64)

    def entry_capacity(self, part: np.ndarray, parent: np.ndarray | None = None, *,
                       pair_cap: np.ndarray | None = None, group_cap: np.ndarray | None = None,
                       outgoing: bool = False) -> np.ndarray:
        """Upper bound on what can enter each part per step (``outgoing``: leave it).

        Pairs into part c (from the rest of c's ``parent`` part; default: anywhere) count their own
        capacity, except that pairs throttled by a group whose pairs all end in c (c's NIC, switch
        port...) count that group's capacity once instead. Every transfer into c is charged to one
        of the counted resources, so this bounds the entries from above. Vectorised.
        """
        part = np.asarray(part, np.int64)
        npart = int(part.max()) + 1
        pc = self.cap if pair_cap is None else pair_cap
        gc = self.gcap if group_cap is None else group_cap
        a, b = (self.pdst, self.psrc) if outgoing else (self.psrc, self.pdst)
        par = np.zeros(self.nranks, np.int64) if parent is None else np.asarray(parent, np.int64)
        into = (part[a] != part[b]) & (par[a] == par[b])
        rp, rg = self.pair_group_rows()
        G = self.ngroups
        gmin = np.full(max(G, 1), np.iinfo(np.int64).max)
        gmax = np.full(max(G, 1), -1)
        if rp.size:
            np.minimum.at(gmin, rg, part[b[rp]])
            np.maximum.at(gmax, rg, part[b[rp]])
        gpart = np.where(gmin == gmax, gmax, -1)
        ing = into[rp] & (gpart[rg] == part[b[rp]]) if rp.size else np.zeros(0, bool)
        covered = np.zeros(self.npairs, bool)
        covered[rp[ing]] = True
        base = np.bincount(part[b[into & ~covered]], weights=pc[into & ~covered].astype(float),
                           minlength=npart).astype(float)
        # charge every covered pair to ONE of its qualifying groups; two ways to choose (the group
        # nearest the receivers, or nearest the senders), each a valid cover; keep the smaller sum
        nsrc, ndst = self.group_spread()
        if outgoing:
            nsrc, ndst = ndst, nsrc
        qp, qg = rp[ing], rg[ing]
        best = None
        for key in (ndst, nsrc):
            e = base.copy()
            if qp.size:
                order = np.lexsort((qg, key[qg], qp))
                first = np.ones(order.size, bool)
                first[1:] = qp[order][1:] != qp[order][:-1]
                gi = np.unique(qg[order][first])
                e += np.bincount(gpart[gi], weights=gc[gi].astype(float), minlength=npart)
            best = e if best is None else np.minimum(best, e)
        allpairs = np.bincount(part[b[into]], weights=pc[into].astype(float), minlength=npart)
        return np.minimum(best, allpairs)

    def group_spread(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct source ranks, distinct destination ranks) of every group's pairs (cached)."""
        if self._spread is None:
            rp, rg = self.pair_group_rows()
            n, G = self.nranks, self.ngroups
            if rp.size:
                nsrc = _distinct_per_group(rg, self.psrc[rp], G, n)
                ndst = _distinct_per_group(rg, self.pdst[rp], G, n)
            else:
                nsrc = ndst = np.zeros(G, np.int64)
            self._spread = (nsrc, ndst)
        return self._spread

    def groups_of(self, p: int) -> np.ndarray:
        return self.pg_idx[self.pg_ptr[p]:self.pg_ptr[p + 1]]

    def group_pairs(self) -> list[np.ndarray]:
        """Member pairs of every group."""
        gp = np.repeat(np.arange(self.npairs), np.diff(self.pg_ptr))
        order = np.argsort(self.pg_idx, kind="stable")
        starts = np.searchsorted(self.pg_idx[order], np.arange(self.ngroups + 1))
        return [gp[order[starts[g]:starts[g + 1]]] for g in range(self.ngroups)]

    def transposed(self) -> "Network":
        """The network with every pair reversed (u -> v becomes v -> u, same capacity and groups).

        A schedule valid on the transposed network, run backwards in time, is valid here: this is
        how ReduceScatter is derived from AllGather.
        """
        n = self.nranks
        key = self.pdst.astype(np.int64) * n + self.psrc
        order = np.argsort(key, kind="stable")
        ptr, idx = _csr_take(self.pg_ptr, self.pg_idx, order)
        return Network(n, self.pdst[order].copy(), self.psrc[order].copy(), self.cap[order].copy(), ptr,
                       idx.astype(np.int32), self.gcap.copy(), list(self.glabel),
                       [lv.copy() for lv in self.levels], self.name + " (transposed)",
                       None if self.bw is None else self.bw[order].copy(),
                       None if self.gbw is None else self.gbw.copy())

    def is_self_transposed(self) -> bool:
        """Whether reversing every pair gives this network again, up to the numbering of its
        groups: the same pairs with the same capacities and bandwidths, and every group's reversed
        pairs (with its capacity) a group of this network. A packing of out-trees here is then a
        packing of in-trees of :meth:`transposed` with the same loads, so ReduceScatter can use
        AllGather's trees. Cached."""
        if self._self_transposed is None:
            t = self.transposed()
            same = (np.array_equal(t.psrc, self.psrc) and np.array_equal(t.pdst, self.pdst)
                    and np.array_equal(t.cap, self.cap) and (self.bw is None) == (t.bw is None)
                    and (self.bw is None or np.array_equal(t.bw, self.bw)))
            if same:
                def groups(net: "Network") -> list:
                    gbw = net.gbw if net.gbw is not None else np.zeros(net.ngroups)
                    return sorted((int(net.gcap[g]), float(gbw[g]), tuple(np.sort(pairs).tolist()))
                                  for g, pairs in enumerate(net.group_pairs()))
                same = groups(t) == groups(self)
            self._self_transposed = bool(same)
        return self._self_transposed

    def subnetwork(self, ranks) -> tuple["Network", np.ndarray]:
        """The network induced by ``ranks`` (renumbered 0..len-1 in the given order).

        Groups keep their full capacity (the other members' traffic is not modelled: a pod solved
        alone). Returns (network, the original rank of each new rank).
        """
        ranks = np.asarray(ranks, np.int64)
        local = np.full(self.nranks, -1, np.int64)
        local[ranks] = np.arange(ranks.size)
        keep = (local[self.psrc] >= 0) & (local[self.pdst] >= 0)
        ps, pd = local[self.psrc[keep]], local[self.pdst[keep]]
        order = np.lexsort((pd, ps))
        pids = np.flatnonzero(keep)[order]
        ptr, idx = _csr_take(self.pg_ptr, self.pg_idx, pids)
        used = np.unique(idx)
        remap = np.full(max(self.ngroups, 1), -1, np.int64)
        remap[used] = np.arange(used.size)
        levels = []
        for lv in self.levels:
            _, inv = np.unique(lv[ranks], return_inverse=True)
            levels.append(inv.astype(np.int32))
        net = Network(int(ranks.size), ps[order].astype(np.int32), pd[order].astype(np.int32),
                      self.cap[pids].copy(), ptr, remap[idx].astype(np.int32), self.gcap[used].copy(),
                      [self.glabel[g] for g in used.tolist()], levels, self.name,
                      None if self.bw is None else self.bw[pids].copy(),
                      None if self.gbw is None else self.gbw[used].copy())
        return net, ranks

    def node_signature(self, ranks) -> tuple:
        """A hashable description of the sub-network on ``ranks`` (same signature = isomorphic
        under the given rank order): pairs, capacities and group memberships up to renaming."""
        net, _ = self.subnetwork(ranks)
        gsig = []
        first_seen: dict[int, int] = {}
        for p in range(net.npairs):
            gs = []
            for g in net.groups_of(p).tolist():
                first_seen.setdefault(g, len(first_seen))
                gs.append((first_seen[g], int(net.gcap[g])))
            gsig.append(tuple(sorted(gs)))
        return (net.nranks, tuple(net.psrc.tolist()), tuple(net.pdst.tolist()), tuple(net.cap.tolist()),
                tuple(gsig))


def _csr_take(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR (ptr, idx) restricted to ``rows``, in that order (vectorised)."""
    rows = np.asarray(rows, np.int64)
    counts = (ptr[rows + 1] - ptr[rows]) if rows.size else np.zeros(0, np.int64)
    new_ptr = np.zeros(rows.size + 1, np.int64)
    np.cumsum(counts, out=new_ptr[1:])
    starts = np.repeat(ptr[rows] - new_ptr[:-1], counts)
    take = starts + np.arange(int(new_ptr[-1]))
    return new_ptr, idx[take]


def _best_links(topo: Topology) -> np.ndarray:
    """Per connected pair (sorted by src, dst) the id of its best link (as Topology.link_between)."""
    n = topo.nranks
    key = topo.link_src.astype(np.int64) * n + topo.link_dst
    total_bw = topo.link_bandwidth * topo.link_lanes
    order = np.lexsort((np.arange(key.size), topo.link_alpha, -total_bw, -topo.link_capacity, key))
    skey = key[order]
    first = np.ones(skey.size, bool)
    first[1:] = skey[1:] != skey[:-1]
    return order[first]


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` by sorting (numpy's hashing path is slow on arrays of millions)."""
    a = np.sort(np.asarray(a).ravel())
    if a.size:
        a = a[np.r_[True, a[1:] != a[:-1]]]
    return a


def _distinct_per_group(group: np.ndarray, value: np.ndarray, ngroups: int, nvalues: int) -> np.ndarray:
    """How many distinct ``value`` (``0 .. nvalues-1``) each group (``0 .. ngroups-1``) has."""
    group = np.asarray(group, np.int64)
    value = np.asarray(value, np.int64)
    if ngroups * nvalues <= 1 << 26:
        seen = np.zeros((ngroups, nvalues), bool)
        seen[group, value] = True
        return seen.sum(axis=1).astype(np.int64)
    return np.bincount(_sorted_unique(group * nvalues + value) // nvalues, minlength=ngroups)


def _scc_labels(n: int, src: np.ndarray, dst: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Strongly connected components of the graph (src -> dst) restricted to edges inside ``within``
    parts; labels are refined so that no component crosses a ``within`` part. Components are
    numbered in the order of their least rank."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    m = within[src] == within[dst]
    graph = coo_matrix((np.ones(int(m.sum())), (np.asarray(src)[m], np.asarray(dst)[m])), shape=(n, n))
    _, lab = connected_components(graph, directed=True, connection="strong")
    least = np.full(int(lab.max()) + 1 if n else 0, n, np.int64)
    np.minimum.at(least, lab, np.arange(n))
    rank = np.empty(least.size, np.int64)
    rank[np.argsort(least, kind="stable")] = np.arange(least.size)
    return rank[lab].astype(np.int32)


def network_from_topology(topo: Topology) -> Network:
    """The synthesis view of a cluster (see the module docstring)."""
    n = topo.nranks
    best = _best_links(topo)
    psrc = topo.link_src[best].astype(np.int32)
    pdst = topo.link_dst[best].astype(np.int32)
    cap = topo.link_capacity[best].astype(np.int32)
    # bandwidth of a pair: all parallel links (a valid over-estimate for the cut bound)
    key = topo.link_src.astype(np.int64) * n + topo.link_dst
    pkey = psrc.astype(np.int64) * n + pdst
    pos = np.searchsorted(pkey, key)
    bw = np.zeros(psrc.size)
    np.add.at(bw, pos, topo.link_bandwidth * topo.link_lanes)
    # groups of each best link
    link_to_pair = np.full(topo.nlinks, -1, np.int64)
    link_to_pair[best] = np.arange(best.size)
    if topo.groups:
        mem = [np.asarray(g.members, np.int64) for g in topo.groups]
        allp = link_to_pair[np.concatenate(mem)]
        allg = np.repeat(np.array([g.id for g in topo.groups], np.int64), [m.size for m in mem])
        keep = allp >= 0
        # distinct (pair, group) memberships, sorted by pair then group
        pg = _sorted_unique(allp[keep] * max(len(topo.groups), 1) + allg[keep])
        allp, allg = pg // max(len(topo.groups), 1), pg % max(len(topo.groups), 1)
    else:
        allp = np.zeros(0, np.int64)
        allg = np.zeros(0, np.int64)
    ptr = np.searchsorted(allp, np.arange(psrc.size + 1)).astype(np.int64)
    gcap = np.array([g.capacity for g in topo.groups], dtype=np.int32)
    gbw = np.array([g.capacity_bytes for g in topo.groups], dtype=float)
    glabel = [f"{g.kind} group {g.label or g.id} ({g.direction})" for g in topo.groups]
    # hierarchy: nodes (refined into strongly connected intra-node parts), then islands
    node = topo.rank_node.astype(np.int32)
    nodes = _scc_labels(n, psrc, pdst, node)
    # a bottleneck group has >= 2 distinct sources and >= 2 distinct destinations among its pairs
    G = len(topo.groups)
    nsrc = _distinct_per_group(allg, psrc[allp], G, n) if G else np.zeros(0, np.int64)
    ndst = _distinct_per_group(allg, pdst[allp], G, n) if G else np.zeros(0, np.int64)
    bottleneck_pair = np.zeros(psrc.size, bool)
    if G:
        bottleneck_pair[allp[((nsrc >= 2) & (ndst >= 2))[allg]]] = True
    free = ~bottleneck_pair
    islands = _scc_labels(n, psrc[free], pdst[free], nodes)
    levels = [nodes]
    if np.unique(islands).size != np.unique(nodes).size:
        levels.append(islands)
    return Network(n, psrc, pdst, cap, ptr, allg.astype(np.int32), gcap, glabel, levels, topo.name, bw, gbw)


@dataclass(frozen=True)
class Task:
    """A dissemination problem: chunk ``k`` starts at ``origin[k]``; every rank must end with all."""

    nranks: int
    nchunks: int
    origin: np.ndarray        # int64 (nchunks,)
    fanout_one: bool = False  # HeteCCL Eq. 8 (needed when the schedule is reversed into a ReduceScatter)
    kind: str = "allgather"   # allgather | broadcast (what the origins mean)
    chunks_per_rank: int = 1

    def initial(self) -> np.ndarray:
        has = np.zeros((self.nranks, self.nchunks), np.uint8)
        has[self.origin, np.arange(self.nchunks)] = 1
        return has

    @property
    def demand(self) -> int:
        """Transfers any schedule needs (each rank receives each chunk it lacks exactly once)."""
        return self.nranks * self.nchunks - self.nchunks


def allgather_task(nranks: int, chunks_per_rank: int = 1, *, fanout_one: bool = False) -> Task:
    k = int(chunks_per_rank)
    return Task(nranks, nranks * k, np.repeat(np.arange(nranks, dtype=np.int64), k), fanout_one,
                "allgather", k)


def broadcast_task(nranks: int, root: int, chunks_per_rank: int = 1) -> Task:
    k = int(chunks_per_rank)
    if not 0 <= root < nranks:
        raise ValueError(f"root {root} out of range 0..{nranks - 1}")
    return Task(nranks, nranks * k, np.full(nranks * k, root, np.int64), False, "broadcast", k)


@dataclass
class Schedule:
    """Transfers ``(src, dst, step, chunk)`` as numpy columns (int64)."""

    src: np.ndarray
    dst: np.ndarray
    step: np.ndarray
    chunk: np.ndarray

    @classmethod
    def empty(cls) -> "Schedule":
        z = np.zeros(0, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy())

    @classmethod
    def from_rows(cls, rows) -> "Schedule":
        a = np.asarray(rows, np.int64).reshape(-1, 4)
        return cls(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].copy())

    @classmethod
    def concat(cls, parts: list["Schedule"]) -> "Schedule":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("src", "dst", "step", "chunk")))

    def __len__(self) -> int:
        return int(self.src.size)

    @property
    def nsteps(self) -> int:
        return int(self.step.max()) + 1 if len(self) else 0

    def rows(self) -> np.ndarray:
        return np.stack([self.src, self.dst, self.step, self.chunk], axis=1)

    def before(self, t: int) -> "Schedule":
        m = self.step < t
        return Schedule(self.src[m], self.dst[m], self.step[m], self.chunk[m])

    def at(self, t: int) -> "Schedule":
        m = self.step == t
        return Schedule(self.src[m], self.dst[m], self.step[m], self.chunk[m])

    def shifted(self, dt: int) -> "Schedule":
        return Schedule(self.src, self.dst, self.step + int(dt), self.chunk)

    def sorted(self) -> "Schedule":
        o = np.lexsort((self.chunk, self.dst, self.src, self.step))
        return Schedule(self.src[o], self.dst[o], self.step[o], self.chunk[o])

    def compact(self) -> "Schedule":
        """Renumber steps 0..S-1 dropping empty steps."""
        if not len(self):
            return self
        _, inv = np.unique(self.step, return_inverse=True)
        return Schedule(self.src, self.dst, inv.astype(np.int64), self.chunk)

    def reversed(self) -> "Schedule":
        """Time reversal with every transfer turned around (AllGather -> ReduceScatter)."""
        T = self.nsteps
        return Schedule(self.dst.copy(), self.src.copy(), T - 1 - self.step, self.chunk.copy())

    def relabeled(self, rank_map: np.ndarray, chunk_map: np.ndarray) -> "Schedule":
        return Schedule(rank_map[self.src], rank_map[self.dst], self.step.copy(), chunk_map[self.chunk])


def replay(task: Task, sched: Schedule, upto: int | None = None) -> np.ndarray:
    """Holdings at the start of step ``upto`` (default: at the end), ignoring validity."""
    has = task.initial()
    m = np.ones(len(sched), bool) if upto is None else sched.step < upto
    has[sched.dst[m], sched.chunk[m]] = 1
    return has
