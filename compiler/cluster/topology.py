"""The cluster model: GPUs (global ranks), links, shared resource groups and HeteCCL chunking.

A :class:`Topology` describes a heterogeneous GPU cluster the way HeteCCL (section 4.1) sees it:

* ranks ``0 .. nranks-1``; global rank = node offset + local GPU id, nodes in definition order;
* directed **links** ``u -> v`` with a class (``direct`` | ``switch`` | ``internode`` | ``nic``),
  a bandwidth per lane (bytes/s), a lane count, latency ``alpha`` (s) and ``beta = 1/bandwidth``
  (s/byte).  Parallel links of different classes between one pair may coexist (a multigraph);
* **shared resource groups** ``g = (E_g, C_g)``: links that contend for one device (PCIe switch, UPI,
  NVSwitch port, NIC), with the device's bandwidth per lane, lanes and capacity in bytes/s;
* **chunking** (HeteCCL Eq. 1).  How we read it, exactly:

  - ``tau(p) = alpha(p) + S_c / bw(p)`` is the time to move one chunk of ``S_c`` bytes over *one lane*
    of a link (or group) ``p`` whose per-lane bandwidth is ``bw(p)``;
  - ``tau_ref = max over all links of tau(link)`` (the slowest link's one-lane chunk time);
  - ``C(u, v) = ceil(tau_ref / tau(u, v)) * lanes(u, v)`` for every link, and likewise
    ``C_g = ceil(tau_ref / tau(g)) * lanes(g)`` for every group (``tau(g)`` uses the group's own
    per-lane bandwidth and the latency of the group's link class).

  The arithmetic is exact (``fractions.Fraction`` over the decimal values written in the input), so
  ``ceil`` never rounds up a ratio that is mathematically an integer.

Links are stored column-wise (numpy arrays), so clusters of thousands of GPUs with a million
inter-node links stay cheap; the networkx :class:`~networkx.MultiDiGraph` view (:attr:`Topology.graph`)
is built on first use.  Everything here is plain data: no printing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from hccc.util.limits import printable

LINK_CLASSES: tuple[str, ...] = ("direct", "switch", "internode", "nic")
CLASS_CODE: dict[str, int] = {c: i for i, c in enumerate(LINK_CLASSES)}
VENDORS: tuple[str, ...] = ("nvidia", "amd")

#: Latency per link class in microseconds when the input does not say (TACCL-style profiles:
#: NVLink ~0.7 us, PCIe/UPI through a switch ~1 us, InfiniBand/RoCE ~1.7 us).
DEFAULT_ALPHA_US: dict[str, Fraction] = {
    "direct": Fraction("0.7"),
    "switch": Fraction("1"),
    "internode": Fraction("1.7"),
    "nic": Fraction("1.7"),
}
#: HeteCCL's example chunk size S_c (1 MiB).
DEFAULT_CHUNK_SIZE = 1 << 20

GB = 10**9  # bandwidths are written in GB/s, 1 GB = 10^9 bytes
#: the largest logical capacity C = ceil(tau_ref / tau) * lanes of one link or shared group. Every
#: consumer (the synthesiser's flows, the simulator's per-step counts, the topology summary) holds
#: it in int32 / int64 arithmetic; real clusters stay below 10**6 (link speeds within 10**3 of one
#: another, at most a few dozen lanes), so a larger one means speeds apart by about 10**9 or more:
#: a typing slip, refused at the link instead of overflowing later.
MAX_LOGICAL_CAPACITY = (1 << 31) - 1
US = Fraction(1, 10**6)


def _frac(x) -> Fraction:
    if isinstance(x, Fraction):
        return x
    if isinstance(x, float):
        return Fraction(repr(x))
    return Fraction(x)


def _ceil_frac(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def chunk_time(alpha_us: Fraction, bandwidth_gbps: Fraction, chunk_size: int) -> Fraction:
    """tau = alpha + S_c * beta, in seconds, exactly (one chunk over one lane)."""
    return _frac(alpha_us) * US + Fraction(int(chunk_size)) / (_frac(bandwidth_gbps) * GB)


def logical_capacity(tau_ref: Fraction, tau: Fraction, lanes: int) -> int:
    """HeteCCL Eq. 1: ceil(tau_ref / tau) * lanes."""
    return _ceil_frac(Fraction(tau_ref) / Fraction(tau)) * int(lanes)


@dataclass(frozen=True)
class LinkParams:
    """The parameters shared by a family of links (one entry of the parameter table)."""

    cls: str
    bandwidth_gbps: Fraction  # per lane
    lanes: int
    alpha_us: Fraction


@dataclass(frozen=True)
class NodeInfo:
    name: str
    index: int
    offset: int  # global rank of local GPU 0
    ngpus: int
    vendor: str = "nvidia"
    model: str | None = None
    gamma_gbps: Fraction | None = None  # reduction throughput, None = not modelled

    @property
    def ranks(self) -> range:
        return range(self.offset, self.offset + self.ngpus)


@dataclass(frozen=True)
class Link:
    """A read-only view of one link of a :class:`Topology`."""

    id: int
    src: int
    dst: int
    cls: str
    bandwidth: float  # bytes/s per lane
    lanes: int
    alpha: float  # seconds
    capacity: int  # C(u, v): parallel chunks per step
    groups: tuple[int, ...]

    @property
    def beta(self) -> float:
        return 1.0 / self.bandwidth

    @property
    def bandwidth_gbps(self) -> float:
        return self.bandwidth / GB

    @property
    def total_bandwidth(self) -> float:
        return self.bandwidth * self.lanes


@dataclass(frozen=True)
class SharedGroup:
    """A shared resource group: member links contend for ``capacity_bytes`` bytes/s."""

    id: int
    kind: str  # link class of the device ("switch", "internode", "direct") or "nic"
    direction: str  # "a->b", "b->a", "egress" or "ingress"
    label: str
    members: np.ndarray = field(compare=False, repr=False)  # link ids, ascending
    bandwidth_gbps: Fraction = Fraction(0)  # per lane
    lanes: int = 1
    alpha_us: Fraction = Fraction(0)
    capacity: int = 0  # C_g, chunks per step

    @property
    def capacity_bytes(self) -> float:
        return float(self.bandwidth_gbps * self.lanes * GB)


class DuplicateLinkError(ValueError):
    """Two declarations produced the same (src, dst, class) link and they cannot be merged."""

    def __init__(self, first: int, second: int):
        super().__init__(f"links {first} and {second} are the same (src, dst, class)")
        self.first = first
        self.second = second


class CapacityError(ValueError):
    """A link parameter entry (``kind`` "param", its index in the builder's parameters) or a shared
    group (``kind`` "group", its index) whose logical capacity exceeds :data:`MAX_LOGICAL_CAPACITY`;
    ``ref``: the parameter index of the slowest link (the one that sets tau_ref)."""

    def __init__(self, kind: str, index: int, capacity: int, ref: int):
        self.kind, self.index, self.capacity, self.ref = kind, index, capacity, ref
        super().__init__(f"{kind} {index}: logical capacity {capacity} is over {MAX_LOGICAL_CAPACITY}")


class TopologyBuilder:
    """Incremental construction of a :class:`Topology` (used by the .topo parser and importers).

    Links are added in blocks that share one :class:`LinkParams`; ``mergeable`` links (those declared
    through a shared device) that are declared again with identical parameters collapse into one link
    that belongs to every group that named it; any other repeat of (src, dst, class) is an error.
    """

    def __init__(self, name: str = "<topology>"):
        self.name = name
        self.nodes: list[NodeInfo] = []
        self._params: list[LinkParams] = []
        self._param_index: dict[LinkParams, int] = {}
        self._src: list[np.ndarray] = []
        self._dst: list[np.ndarray] = []
        self._pid: list[np.ndarray] = []
        self._merge: list[np.ndarray] = []
        self._nlinks = 0
        self._groups: list[tuple[str, str, str, np.ndarray, LinkParams]] = []

    @property
    def nranks(self) -> int:
        last = self.nodes[-1] if self.nodes else None     # offsets are cumulative: O(1)
        return last.offset + last.ngpus if last is not None else 0

    @property
    def nlinks(self) -> int:
        return self._nlinks

    def add_node(self, name: str, ngpus: int, vendor: str = "nvidia", model: str | None = None,
                 gamma_gbps=None) -> NodeInfo:
        if ngpus < 1:
            raise ValueError("a node needs at least one GPU")
        if vendor not in VENDORS:
            raise ValueError(f"unknown vendor {vendor!r}")
        node = NodeInfo(name, len(self.nodes), self.nranks, int(ngpus), vendor, model,
                        None if gamma_gbps is None else _frac(gamma_gbps))
        self.nodes.append(node)
        return node

    def params(self, cls: str, bandwidth_gbps, lanes: int, alpha_us) -> int:
        if cls not in CLASS_CODE:
            raise ValueError(f"unknown link class {cls!r}")
        p = LinkParams(cls, _frac(bandwidth_gbps), int(lanes), _frac(alpha_us))
        if p.bandwidth_gbps <= 0 or p.lanes < 1 or p.alpha_us < 0:
            raise ValueError(f"invalid link parameters {p}")
        pid = self._param_index.get(p)
        if pid is None:
            pid = self._param_index[p] = len(self._params)
            self._params.append(p)
        return pid

    def add_links(self, src, dst, param_id, mergeable: bool = False) -> np.ndarray:
        """Add links src[i] -> dst[i]; ``param_id`` is a scalar or an array. Returns their ids."""
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        if src.shape != dst.shape:
            raise ValueError("src and dst differ in length")
        n = self.nranks
        if src.size and (src.min() < 0 or dst.min() < 0 or src.max() >= n or dst.max() >= n):
            raise ValueError("link endpoint out of range")
        if np.any(src == dst):
            raise ValueError("self link")
        pid = np.broadcast_to(np.asarray(param_id, dtype=np.int64), src.shape).copy()
        ids = np.arange(self._nlinks, self._nlinks + src.size, dtype=np.int64)
        self._src.append(src)
        self._dst.append(dst)
        self._pid.append(pid)
        self._merge.append(np.full(src.size, bool(mergeable)))
        self._nlinks += src.size
        return ids

    def add_group(self, kind: str, direction: str, label: str, members, bandwidth_gbps, lanes: int,
                  alpha_us) -> int:
        members = np.asarray(members, dtype=np.int64).ravel()
        p = LinkParams(kind if kind in CLASS_CODE else "nic", _frac(bandwidth_gbps), int(lanes), _frac(alpha_us))
        if p.bandwidth_gbps <= 0 or p.lanes < 1:
            raise ValueError("invalid group parameters")
        self._groups.append((kind, direction, label, members, p))
        return len(self._groups) - 1

    def link_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, class code) of every link added so far (before de-duplication)."""
        src = np.concatenate(self._src) if self._src else np.zeros(0, np.int64)
        dst = np.concatenate(self._dst) if self._dst else np.zeros(0, np.int64)
        pid = np.concatenate(self._pid) if self._pid else np.zeros(0, np.int64)
        codes = np.array([CLASS_CODE[p.cls] for p in self._params], dtype=np.int64)
        return src, dst, codes[pid] if pid.size else pid

    def build(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> "Topology":
        if not self.nodes:
            raise ValueError("a topology needs at least one node")
        if int(chunk_size) < 1:
            raise ValueError("chunk size must be positive")
        n = self.nranks
        src, dst, cls = self.link_arrays()
        pid = np.concatenate(self._pid) if self._pid else np.zeros(0, np.int64)
        merge = np.concatenate(self._merge) if self._merge else np.zeros(0, bool)
        # --- de-duplicate (src, dst, class) ---------------------------------------------------
        key = (src * n + dst) * len(LINK_CLASSES) + cls
        order = np.argsort(key, kind="stable")
        skey = key[order]
        same = np.zeros(order.size, dtype=bool)
        if order.size > 1:
            same[1:] = skey[1:] == skey[:-1]
        remap = np.arange(src.size, dtype=np.int64)
        if same.any():
            # first occurrence (in declaration order) of each key is the canonical link
            first_pos = np.maximum.accumulate(np.where(~same, np.arange(order.size), 0))
            canon = order[first_pos]
            dup = np.nonzero(same)[0]
            a, b = canon[dup], order[dup]
            bad = ~(merge[a] & merge[b] & (pid[a] == pid[b]))
            if bad.any():
                # report the earliest offending second declaration
                k = np.argmin(np.where(bad, b, np.iinfo(np.int64).max))
                raise DuplicateLinkError(int(a[k]), int(b[k]))
            remap[order] = canon
        keep = remap == np.arange(src.size)
        new_id = np.cumsum(keep) - 1
        final = new_id[remap]
        src, dst, pid = src[keep], dst[keep], pid[keep]
        groups = []
        for kind, direction, label, members, p in self._groups:
            m = np.unique(final[members]) if members.size else members
            groups.append((kind, direction, label, m, p))
        return Topology(self.name, tuple(self.nodes), src, dst, pid, tuple(self._params), groups,
                        int(chunk_size))


class Topology:
    """A heterogeneous cluster: see the module docstring for the model and Eq. 1."""

    def __init__(self, name: str, nodes: tuple[NodeInfo, ...], src: np.ndarray, dst: np.ndarray,
                 param_id: np.ndarray, params: tuple[LinkParams, ...],
                 groups: Sequence[tuple[str, str, str, np.ndarray, LinkParams]], chunk_size: int):
        # names come from files (a TACCL profile's "name", a file name): one printable line
        self.name = printable(str(name))
        self.nodes = nodes
        self.nranks = sum(nd.ngpus for nd in nodes)
        self.chunk_size = int(chunk_size)
        self.params = params
        self.rank_node = np.repeat(np.arange(len(nodes), dtype=np.int32),
                                   [nd.ngpus for nd in nodes]).astype(np.int32)
        self.link_src = np.ascontiguousarray(src, dtype=np.int32)
        self.link_dst = np.ascontiguousarray(dst, dtype=np.int32)
        self.link_param = np.ascontiguousarray(param_id, dtype=np.int32)
        taus = [chunk_time(p.alpha_us, p.bandwidth_gbps, self.chunk_size) for p in params]
        pcap, ref = self._chunking(taus)
        self._link_columns(taus, pcap)
        self.groups: tuple[SharedGroup, ...] = self._shared_groups(groups, ref)
        self._index_groups()
        self._index_pairs()

    def _chunking(self, taus: list[Fraction]) -> tuple[list[int], int]:
        """HeteCCL's Eq. 1, exactly, per parameter entry: sets ``tau_ref_exact`` and returns every
        entry's logical capacity and the entry of the slowest link (-1 without links)."""
        used = np.unique(self.link_param)
        self.tau_ref_exact: Fraction | None = max((taus[i] for i in used), default=None)
        if self.tau_ref_exact is None:
            return [p.lanes for p in self.params], -1
        pcap = [logical_capacity(self.tau_ref_exact, t, p.lanes) for t, p in zip(taus, self.params)]
        ref = next(i for i in used.tolist() if taus[i] == self.tau_ref_exact)
        for i in used.tolist():
            if pcap[i] > MAX_LOGICAL_CAPACITY:
                raise CapacityError("param", i, pcap[i], ref)
        return pcap, ref

    def _link_columns(self, taus: list[Fraction], pcap: list[int]) -> None:
        """Per-link arrays of the parameter entries' class, speed, latency and capacity."""
        params = self.params
        codes = np.array([CLASS_CODE[p.cls] for p in params] or [0], dtype=np.int8)
        bws = np.array([float(p.bandwidth_gbps * GB) for p in params] or [1.0])
        lanes = np.array([p.lanes for p in params] or [1], dtype=np.int32)
        alphas = np.array([float(p.alpha_us * US) for p in params] or [0.0])
        caps = np.array(pcap or [1], dtype=np.int64)
        ptau = np.array([float(t) for t in taus] or [0.0])
        self.link_class = codes[self.link_param]
        self.link_bandwidth = bws[self.link_param]  # bytes/s per lane
        self.link_lanes = lanes[self.link_param]
        self.link_alpha = alphas[self.link_param]  # s
        self.link_beta = 1.0 / self.link_bandwidth if self.link_param.size else np.zeros(0)
        self.link_capacity = caps[self.link_param]  # C(u, v)
        self.link_tau = ptau[self.link_param]

    def _shared_groups(self, groups: Sequence[tuple[str, str, str, np.ndarray, LinkParams]],
                       ref: int) -> tuple[SharedGroup, ...]:
        """The shared groups with their logical capacities ``C_g``."""
        glist: list[SharedGroup] = []
        for gid, (kind, direction, label, members, p) in enumerate(groups):
            tau_g = chunk_time(p.alpha_us, p.bandwidth_gbps, self.chunk_size)
            cg = (logical_capacity(self.tau_ref_exact, tau_g, p.lanes)
                  if self.tau_ref_exact is not None else p.lanes)
            if cg > MAX_LOGICAL_CAPACITY:
                raise CapacityError("group", gid, cg, ref)
            glist.append(SharedGroup(gid, kind, direction, label, np.asarray(members, np.int64),
                                     p.bandwidth_gbps, p.lanes, p.alpha_us, cg))
        return tuple(glist)

    def _index_groups(self) -> None:
        """link -> groups (CSR)."""
        glist = self.groups
        if glist:
            gm = np.concatenate([g.members for g in glist])
            gg = np.repeat(np.arange(len(glist)), [g.members.size for g in glist])
        else:
            gm = np.zeros(0, np.int64)
            gg = np.zeros(0, np.int64)
        order = np.lexsort((gg, gm))
        self._lg_groups = gg[order].astype(np.int32)
        self._lg_ptr = np.searchsorted(gm[order], np.arange(self.link_src.size + 1)).astype(np.int64)

    def _index_pairs(self) -> None:
        """Sorted (u, v) keys -> the best link per pair, all its links and their summed capacity."""
        key = self.link_src.astype(np.int64) * self.nranks + self.link_dst
        total_bw = self.link_bandwidth * self.link_lanes
        order = np.lexsort((np.arange(key.size), self.link_alpha, -total_bw, -self.link_capacity, key))
        skey = key[order]
        first = np.ones(skey.size, dtype=bool)
        first[1:] = skey[1:] != skey[:-1]
        self._pair_keys = skey[first]
        self._pair_best = order[first].astype(np.int64)
        self._pair_order = order
        self._pair_start = np.nonzero(first)[0]
        self._pair_cap = np.add.reduceat(self.link_capacity[order], self._pair_start) \
            if order.size else np.zeros(0, np.int64)

    # ------------------------------------------------------------------ ranks
    @property
    def nlinks(self) -> int:
        return int(self.link_src.size)

    @property
    def tau_ref(self) -> float | None:
        """The slowest link's one-lane chunk time, seconds (None without links)."""
        return None if self.tau_ref_exact is None else float(self.tau_ref_exact)

    def node_of(self, rank: int) -> NodeInfo:
        return self.nodes[int(self.rank_node[self._rank(rank)])]

    def vendor_of(self, rank: int) -> str:
        return self.node_of(rank).vendor

    def model_of(self, rank: int) -> str | None:
        return self.node_of(rank).model

    @property
    def rank_vendor(self) -> tuple[str, ...]:
        return tuple(nd.vendor for nd in self.nodes for _ in range(nd.ngpus))

    @property
    def rank_gamma(self) -> np.ndarray:
        """Reduction throughput per rank in bytes/s (inf where the input does not model it)."""
        g = [math.inf if nd.gamma_gbps is None else float(nd.gamma_gbps * GB) for nd in self.nodes]
        return np.repeat(np.array(g, dtype=float), [nd.ngpus for nd in self.nodes])

    def _rank(self, r: int) -> int:
        r = int(r)
        if not 0 <= r < self.nranks:
            raise IndexError(f"rank {r} out of range 0..{self.nranks - 1}")
        return r

    # ------------------------------------------------------------------ links
    def link(self, i: int) -> Link:
        i = int(i)
        return Link(i, int(self.link_src[i]), int(self.link_dst[i]),
                    LINK_CLASSES[int(self.link_class[i])], float(self.link_bandwidth[i]),
                    int(self.link_lanes[i]), float(self.link_alpha[i]), int(self.link_capacity[i]),
                    tuple(int(g) for g in self._lg_groups[self._lg_ptr[i]:self._lg_ptr[i + 1]]))

    def links(self) -> Iterable[Link]:
        return (self.link(i) for i in range(self.nlinks))

    def groups_of_link(self, i: int) -> tuple[int, ...]:
        return tuple(int(g) for g in self._lg_groups[self._lg_ptr[i]:self._lg_ptr[i + 1]])

    def _pair(self, u: int, v: int) -> int:
        k = self._rank(u) * self.nranks + self._rank(v)
        j = int(np.searchsorted(self._pair_keys, k))
        if j < self._pair_keys.size and self._pair_keys[j] == k:
            return j
        return -1

    def has_link(self, u: int, v: int) -> bool:
        return self._pair(u, v) >= 0

    def link_between(self, u: int, v: int) -> Link | None:
        """The best link u -> v: highest C(u, v), then bandwidth*lanes, then lowest alpha."""
        j = self._pair(u, v)
        return None if j < 0 else self.link(int(self._pair_best[j]))

    def links_between(self, u: int, v: int) -> list[Link]:
        j = self._pair(u, v)
        if j < 0:
            return []
        end = self._pair_start[j + 1] if j + 1 < self._pair_start.size else self._pair_order.size
        return [self.link(int(i)) for i in self._pair_order[self._pair_start[j]:end]]

    def capacity(self, u: int, v: int) -> int:
        """Parallel chunks per step from u to v over all parallel links (0 when not connected)."""
        j = self._pair(u, v)
        return 0 if j < 0 else int(self._pair_cap[j])

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of every connected ordered pair, sorted."""
        return (self._pair_keys // self.nranks).astype(np.int32), (self._pair_keys % self.nranks).astype(np.int32)

    # ------------------------------------------------------------------ views
    @cached_property
    def graph(self):
        """networkx MultiDiGraph of ranks; edge key = link id, with all link attributes."""
        import networkx as nx

        g = nx.MultiDiGraph(name=self.name, chunk_size=self.chunk_size, tau_ref=self.tau_ref)
        for nd in self.nodes:
            for local in range(nd.ngpus):
                g.add_node(nd.offset + local, node=nd.name, local=local, vendor=nd.vendor, model=nd.model,
                           gamma=None if nd.gamma_gbps is None else float(nd.gamma_gbps * GB))
        src, dst = self.link_src.tolist(), self.link_dst.tolist()
        cls, bw, ln = self.link_class.tolist(), self.link_bandwidth.tolist(), self.link_lanes.tolist()
        al, cap = self.link_alpha.tolist(), self.link_capacity.tolist()
        g.add_edges_from(
            (src[i], dst[i], i, {"cls": LINK_CLASSES[cls[i]], "bandwidth": bw[i], "lanes": ln[i],
                                 "alpha": al[i], "beta": 1.0 / bw[i], "capacity": cap[i],
                                 "groups": self.groups_of_link(i)})
            for i in range(len(src)))
        return g

    def summary(self) -> dict:
        """Plain-data description (JSON-serialisable) for ``hccc topo --json``."""
        return _summary(self)

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, nodes={len(self.nodes)}, ranks={self.nranks}, links={self.nlinks}, "
                f"groups={len(self.groups)})")


def _link_classes_summary(topo: Topology) -> dict[str, dict]:
    """Links per class, and each class's variants (parameter entries) with their chunk time and capacity."""
    classes: dict[str, dict] = {}
    counts = np.bincount(topo.link_param, minlength=len(topo.params)) if topo.params else []
    for pid, p in enumerate(topo.params):
        if not counts[pid]:
            continue
        entry = classes.setdefault(p.cls, {"links": 0, "variants": []})
        entry["links"] += int(counts[pid])
        tau = chunk_time(p.alpha_us, p.bandwidth_gbps, topo.chunk_size)
        entry["variants"].append({
            "bandwidth_gbps": float(p.bandwidth_gbps), "lanes": p.lanes, "alpha_us": float(p.alpha_us),
            "tau_s": float(tau),
            "capacity": logical_capacity(topo.tau_ref_exact, tau, p.lanes),
            "links": int(counts[pid])})
    for entry in classes.values():
        entry["variants"].sort(key=lambda d: (d["bandwidth_gbps"], d["lanes"], d["alpha_us"]))
    return {c: classes[c] for c in LINK_CLASSES if c in classes}


def _summary(topo: Topology) -> dict:
    vendors: dict[str, int] = {}
    for nd in topo.nodes:
        vendors[nd.vendor] = vendors.get(nd.vendor, 0) + nd.ngpus
    kinds: dict[str, int] = {}
    for g in topo.groups:
        kinds[g.kind] = kinds.get(g.kind, 0) + 1
    return {
        "name": topo.name,
        "nranks": topo.nranks,
        "nnodes": len(topo.nodes),
        "chunk_size": topo.chunk_size,
        "tau_ref_s": topo.tau_ref,
        "nodes": [{"name": nd.name, "first_rank": nd.offset, "ngpus": nd.ngpus, "vendor": nd.vendor,
                   "model": nd.model,
                   "gamma_gbps": None if nd.gamma_gbps is None else float(nd.gamma_gbps)}
                  for nd in topo.nodes],
        "vendors": dict(sorted(vendors.items())),
        "links": topo.nlinks,
        "link_classes": _link_classes_summary(topo),
        "shared_groups": {
            "count": len(topo.groups),
            "by_kind": dict(sorted(kinds.items())),
            "groups": [{"id": g.id, "kind": g.kind, "direction": g.direction, "label": g.label,
                        "links": int(g.members.size), "bandwidth_gbps": float(g.bandwidth_gbps),
                        "lanes": g.lanes, "capacity_gbps": float(g.bandwidth_gbps * g.lanes),
                        "capacity": g.capacity} for g in topo.groups],
        },
    }
