"""TACCL topology profiles (JSON) as :class:`~hccc.compiler.cluster.topology.Topology`.

A TACCL profile describes one node and its measured link costs::

    {"name": "NDv2_1MB", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.3,
     "node_betas_list": [23, 46], "node_invbws_list": [23, 46],
     "remote_alpha": 2.6, "remote_beta": 105, "remote_invbw": 107}

``alpha`` values are latencies in microseconds; a *beta* is the time in microseconds to move one
chunk of the profile's chunk size over the link (TACCL: beta in us/MB times the chunk size in MB),
so a link's bandwidth is ``chunk_size / beta``. TACCL picks the node's wiring from its command line
(``DGX2``, ``NDv2``, ``HubAndSpoke``, ``custom``) and the node count from a sketch file; a profile
read on its own therefore takes these hccc keys (all optional):

* ``"topology"``: ``"NDv2"`` | ``"DGX2"`` | ``"HubAndSpoke"`` | ``"custom"``. Default: ``custom``
  when the profile has a ``links`` matrix, else ``NDv2`` / ``DGX2`` when ``name`` starts so, else
  ``HubAndSpoke`` for a one-entry ``node_betas_list``.
* ``"nnodes"`` (default 1): copies of the node, joined through their NICs.
* ``"chunk_size"`` in bytes (default: the size in the name, e.g. ``_1MB``, ``-32KB``; else 1 MiB);
  sizes are binary (1 MB = 2^20 bytes), as everywhere in hccc.
* ``"vendor"`` (``nvidia`` | ``amd``, default nvidia) and ``"gpu"`` (model name).

Mapping onto hccc's model:

* ``HubAndSpoke`` / ``DGX2`` (NVSwitch): every GPU pair is linked (class ``switch``, bandwidth
  ``S / node_betas_list[0]``, latency ``alpha``); each GPU's outgoing links form one *egress* and its
  incoming links one *ingress* shared group of that bandwidth (one switch port each way, TACCL's
  switch constraint). DGX2 has 16 GPUs and 8 NICs.
* ``NDv2`` (DGX-1 hybrid cube mesh, 8 GPUs, 1 NIC): the NVLink pairs of the cube mesh, class
  ``direct``; pairs with two NVLinks use ``node_betas_list[0]`` (the smaller beta), pairs with one
  ``node_betas_list[1]``.
* ``custom``: ``links[dst][src]`` lanes (TACCL indexes its matrices destination first) with
  per-lane bandwidth ``S / betas[dst][src]``, class ``direct``.
* More than one node: every GPU pair on different nodes is linked (class ``nic``, bandwidth
  ``S / remote_beta``, latency ``remote_alpha``); the node's GPUs are split evenly over its
  ``nics_per_node`` NICs (GPU g uses NIC ``g // (gpus_per_node / nics_per_node)``) and each NIC is an
  egress and an ingress shared group of that bandwidth.

``node_invbws_list`` / ``remote_invbw`` / ``invbws`` (TACCL's alpha + beta as used by its ILP) are
read but not needed. Malformed JSON, missing keys and bad values raise
:class:`~hccc.util.diagnostics.CompileError` located at the offending key.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np

from hccc.util.limits import loads_json
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.compiler.cluster.topo_limits import MAX_BANDWIDTH_GBPS, MAX_LATENCY_US, MIN_BANDWIDTH_GBPS
from hccc.compiler.cluster.topology import MAX_LOGICAL_CAPACITY, CapacityError, Topology, TopologyBuilder
from hccc.util.plural import plural

MAX_GPUS_PER_NODE = 1024
MAX_NODES = 1024
MAX_RANKS = 16384
KNOWN = {"ndv2": "NDv2", "dgx2": "DGX2", "hubandspoke": "HubAndSpoke", "custom": "custom"}

#: NDv2 / DGX-1 hybrid cube mesh: GPU pairs joined by two NVLinks and by one.
NDV2_DOUBLE = ((0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7))
NDV2_SINGLE = ((0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6))

_SIZE_IN_NAME = re.compile(r"(?:^|[_\-.])([0-9]+)\s*([KMG])i?B?$", re.IGNORECASE)
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class _Profile:
    def __init__(self, src: SourceFile, data: dict):
        self.src = src
        self.d = data

    def loc(self, key: str | None) -> Location:
        if key is not None:
            m = re.search(r'"' + re.escape(key) + r'"\s*:', self.src.text)
            if m:
                return self.src.location_at(m.start())
        return Location(self.src, 1, 1)

    def err(self, key: str | None, msg: str) -> CompileError:
        return CompileError([Diagnostic(msg, self.loc(key))])

    def has(self, key: str) -> bool:
        return key in self.d

    def need(self, key: str, why: str = ""):
        if key not in self.d:
            raise self.err(None, f"the profile lacks \"{key}\"{why}")
        return self.d[key]

    def integer(self, key: str, lo: int, hi: int, default=None, why: str = "") -> int:
        if default is not None and key not in self.d:
            return default
        v = self.need(key, why)
        if isinstance(v, bool) or not isinstance(v, (int, Decimal)) or int(v) != v:
            raise self.err(key, f"\"{key}\" must be an integer, not {json.dumps(_plain(v))}")
        v = int(v)
        if not lo <= v <= hi:
            raise self.err(key, f"\"{key}\" = {v} is out of range ({lo}..{hi})")
        return v

    def number(self, key: str, value=None, *, positive: bool, what: str | None = None,
               hi: int = 10 ** 12) -> Fraction:
        v = self.need(key) if value is None else value
        what = what or f"\"{key}\""
        if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
            raise self.err(key, f"{what} must be a number, not {json.dumps(_plain(v))}")
        f = Fraction(v)
        if positive and f <= 0:
            raise self.err(key, f"{what} must be > 0, got {v}")
        if not positive and f < 0:
            raise self.err(key, f"{what} must be >= 0, got {v}")
        if f > hi:
            raise self.err(key, f"{what} = {v} is too large (at most {hi})")
        return f

    def string(self, key: str, default: str | None = None) -> str | None:
        if key not in self.d:
            return default
        v = self.d[key]
        if not isinstance(v, str) or not v or len(v) > 128:
            raise self.err(key, f"\"{key}\" must be a non-empty string of at most 128 characters")
        return v

    def matrix(self, key: str, n: int, *, lanes: bool) -> list[list]:
        m = self.need(key, " (a custom topology gives links and betas matrices)")
        if not isinstance(m, list) or len(m) != n or not all(isinstance(r, list) and len(r) == n for r in m):
            raise self.err(key, f"\"{key}\" must be a {n} x {n} matrix (gpus_per_node = {n})")
        out = []
        for dst, row in enumerate(m):
            r = []
            for src, v in enumerate(row):
                what = f"\"{key}\"[{dst}][{src}]"
                if lanes:
                    if isinstance(v, bool) or not isinstance(v, (int, Decimal)) or int(v) != v or not 0 <= v <= 1 << 16:
                        raise self.err(key, f"{what} must be a link count 0..65536, not {json.dumps(_plain(v))}")
                    r.append(int(v))
                else:
                    r.append(self.number(key, v, positive=False, what=what))
            out.append(r)
        return out


def _plain(v):
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (list, dict)):
        return type(v).__name__
    return v


def _chunk_from_name(name: str | None) -> int | None:
    if not name:
        return None
    m = _SIZE_IN_NAME.search(name.strip())
    if not m:
        return None
    return int(m.group(1)) * _UNIT[m.group(2).upper()]


def _bandwidth(p: _Profile, key: str, beta: Fraction, chunk: int, what: str) -> Fraction:
    """GB/s moving ``chunk`` bytes in ``beta`` microseconds."""
    if beta <= 0:
        raise p.err(key, f"{what} must be > 0 (a beta is the time to move one chunk)")
    bw = Fraction(chunk) / (beta * 1000)
    if not MIN_BANDWIDTH_GBPS <= bw <= MAX_BANDWIDTH_GBPS:
        side = "more" if bw > MAX_BANDWIDTH_GBPS else "less"
        raise p.err(key, f"{what} = {_plain(Decimal(beta.numerator) / beta.denominator)} us per {chunk}-byte "
                         f"chunk gives {side} bandwidth than a link may have ({float(MIN_BANDWIDTH_GBPS):g} .. "
                         f"{MAX_BANDWIDTH_GBPS:g} GB/s, as in a .topo cluster)")
    return bw


@dataclass
class _Node:
    """What a profile says of its node and of how its copies are joined."""

    name: str
    gpus: int                    # G: GPUs per node
    nnodes: int
    kind: str                    # NDv2 | DGX2 | HubAndSpoke | custom
    chunk: int                   # bytes a beta moves
    alpha: Fraction
    vendor: str
    model: str | None
    betas: list                  # node_betas_list (none for custom)
    nics: int = 0                # NICs per node (several nodes only)
    r_alpha: Fraction = Fraction(0)
    r_beta: Fraction = Fraction(0)


def parse_taccl(text: str, name: str = "<input>") -> Topology:
    """A TACCL profile (JSON text) as a Topology; see the module docstring."""
    p = _profile(text, name)
    node = _read_node(p, name)
    G = node.gpus
    b = TopologyBuilder(node.name)
    for k in range(node.nnodes):
        b.add_node(f"node{k + 1}", G, node.vendor, node.model)
    sw_groups = []
    for k in range(node.nnodes):
        if node.kind in ("DGX2", "HubAndSpoke"):
            sw_groups += _switch_links(p, b, node, k)
        elif node.kind == "NDv2":
            _ndv2_links(p, b, node, k * G)
        else:
            _custom_links(p, b, node, k * G)
    for label, direction, members, bw in sw_groups:
        b.add_group("switch", direction, label, members, bw, 1, node.alpha)
    if node.nnodes > 1:
        _nic_links(p, b, node)
    try:
        return b.build(node.chunk)
    except CapacityError as exc:
        raise CompileError([Diagnostic(
            f"the profile's link speeds are too far apart: one link holds {exc.capacity} chunks in the "
            f"slowest link's chunk time (its logical capacity), over the limit of {MAX_LOGICAL_CAPACITY}",
            Location(p.src, 1, 1))]) from None


def _profile(text: str, name: str) -> _Profile:
    src = SourceFile(name, text)
    data = loads_json(src, parse_float=Decimal)
    if not isinstance(data, dict):
        raise CompileError([Diagnostic("a TACCL profile is a JSON object", Location(src, 1, 1))])
    return _Profile(src, data)


def _read_node(p: _Profile, name: str) -> _Node:
    """The node's values, checked in the order the profile is read, and the remote link's."""
    pname = p.string("name", Path(name).stem if not name.startswith("<") else "taccl")
    G = p.integer("gpus_per_node", 1, MAX_GPUS_PER_NODE)
    nnodes = p.integer("nnodes", 1, MAX_NODES, default=1)
    if G * nnodes > MAX_RANKS:
        raise p.err("nnodes", f"{nnodes} nodes x {G} GPUs is more than {MAX_RANKS} GPUs")
    kind = _wiring(p, pname)
    chunk = p.integer("chunk_size", 1, 1 << 40, default=_chunk_from_name(pname) or (1 << 20))
    alpha = p.number("alpha", positive=False, hi=MAX_LATENCY_US)
    vendor = (p.string("vendor", "nvidia") or "nvidia").lower()
    if vendor not in ("nvidia", "amd"):
        raise p.err("vendor", f"unknown vendor '{vendor}' (expected nvidia or amd)")
    model = p.string("gpu")
    if kind in ("NDv2", "DGX2"):
        want = 8 if kind == "NDv2" else 16
        if G != want:
            raise p.err("gpus_per_node", f"an {kind} node has {want} GPUs, but gpus_per_node = {G}")
    node = _Node(pname, G, nnodes, kind, chunk, alpha, vendor, model, _read_betas(p, kind))
    if nnodes > 1:
        node.nics = p.integer("nics_per_node", 1, G, default={"NDv2": 1, "DGX2": 8}.get(kind),
                              why=" (needed to join several nodes)")
        if G % node.nics:
            raise p.err("nics_per_node", f"{G} GPUs cannot be split evenly over {node.nics} NICs")
        node.r_alpha = p.number("remote_alpha", positive=False, hi=MAX_LATENCY_US)
        node.r_beta = p.number("remote_beta", positive=True)
    return node


def _wiring(p: _Profile, pname: str) -> str:
    """The node's wiring: named, or told from the profile's keys and name."""
    kind = p.string("topology")
    if kind is not None:
        if kind.lower() not in KNOWN:
            raise p.err("topology", f"unknown topology '{kind}' (expected NDv2, DGX2, HubAndSpoke or custom)")
        return KNOWN[kind.lower()]
    if p.has("links"):
        return "custom"
    if pname.lower().startswith("ndv2"):
        return "NDv2"
    if pname.lower().startswith("dgx2"):
        return "DGX2"
    if isinstance(p.d.get("node_betas_list"), list) and len(p.d["node_betas_list"]) == 1:
        return "HubAndSpoke"
    raise p.err("node_betas_list", "cannot tell the node's wiring: add \"topology\": \"NDv2\", \"DGX2\", "
                                   "\"HubAndSpoke\" or \"custom\" (with links and betas matrices)")


def _read_betas(p: _Profile, kind: str) -> list[Fraction]:
    """``node_betas_list`` of a wiring that has one (none for custom)."""
    nbetas = {"NDv2": 2, "DGX2": 1, "HubAndSpoke": 1}.get(kind)
    if nbetas is None:
        return []
    lst = p.need("node_betas_list")
    if not isinstance(lst, list) or len(lst) != nbetas:
        raise p.err("node_betas_list", f"\"node_betas_list\" of an {kind} node lists {plural(nbetas, 'beta')}"
                                       + (" (two-NVLink pairs, one-NVLink pairs)" if kind == "NDv2" else ""))
    return [p.number("node_betas_list", v, positive=True, what=f"\"node_betas_list\"[{i}]")
            for i, v in enumerate(lst)]


def _switch_links(p: _Profile, b: TopologyBuilder, node: _Node, k: int) -> list[tuple]:
    """Node ``k``'s GPU pairs through its switch; returns its switch ports as shared groups
    (label, direction, links, bandwidth)."""
    G, off = node.gpus, k * node.gpus
    bw = _bandwidth(p, "node_betas_list", node.betas[0], node.chunk, "\"node_betas_list\"[0]")
    pid = b.params("switch", bw, 1, node.alpha)
    groups = []
    if G > 1:
        src = np.repeat(np.arange(G), G - 1)
        dst = np.array([h for g in range(G) for h in range(G) if h != g])
        ids = b.add_links(off + src, off + dst, pid)
        for g in range(G):
            groups.append((f"node{k + 1} GPU {g} switch port egress", "egress", ids[src == g], bw))
            groups.append((f"node{k + 1} GPU {g} switch port ingress", "ingress", ids[dst == g], bw))
    return groups


def _ndv2_links(p: _Profile, b: TopologyBuilder, node: _Node, off: int) -> None:
    """The NVLink pairs of a hybrid cube mesh whose first GPU is ``off``."""
    for pairs, beta, what in ((NDV2_DOUBLE, node.betas[0], "[0]"), (NDV2_SINGLE, node.betas[1], "[1]")):
        bw = _bandwidth(p, "node_betas_list", beta, node.chunk, f"\"node_betas_list\"{what}")
        pid = b.params("direct", bw, 1, node.alpha)
        a = np.array([x for x, y in pairs] + [y for x, y in pairs])
        c = np.array([y for x, y in pairs] + [x for x, y in pairs])
        b.add_links(off + a, off + c, pid)


def _custom_links(p: _Profile, b: TopologyBuilder, node: _Node, off: int) -> None:
    """The links of the ``links`` and ``betas`` matrices (destination first), for the node whose
    first GPU is ``off``."""
    G = node.gpus
    links = p.matrix("links", G, lanes=True)
    bmat = p.matrix("betas", G, lanes=False)
    for dst in range(G):
        for s in range(G):
            if links[dst][s] <= 0:
                continue
            if s == dst:
                raise p.err("links", f"\"links\"[{dst}][{s}] links GPU {s} to itself")
            beta = bmat[dst][s]
            bw = _bandwidth(p, "betas", beta, node.chunk, f"\"betas\"[{dst}][{s}] (GPU {s} -> {dst})")
            pid = b.params("direct", bw, links[dst][s], node.alpha)
            b.add_links([off + s], [off + dst], pid)


def _nic_links(p: _Profile, b: TopologyBuilder, node: _Node) -> None:
    """Every GPU pair on different nodes, through the NICs (each an egress and an ingress group)."""
    G, nics = node.gpus, node.nics
    bw = _bandwidth(p, "remote_beta", node.r_beta, node.chunk, "\"remote_beta\"")
    pid = b.params("nic", bw, 1, node.r_alpha)
    N = G * node.nnodes
    rank = np.arange(N)
    src = np.repeat(rank, N)
    dst = np.tile(rank, N)
    cross = (src // G) != (dst // G)
    src, dst = src[cross], dst[cross]
    ids = b.add_links(src, dst, pid)
    per = G // nics
    nic_of = (rank // G) * nics + (rank % G) // per
    for n_id in range(node.nnodes * nics):
        nd, local = divmod(n_id, nics)
        label = f"node{nd + 1} nic{local} (GPUs {local * per}..{local * per + per - 1})"
        b.add_group("nic", "egress", label + " egress", ids[nic_of[src] == n_id], bw, 1, node.r_alpha)
        b.add_group("nic", "ingress", label + " ingress", ids[nic_of[dst] == n_id], bw, 1, node.r_alpha)


def load_taccl(path: str | Path) -> Topology:
    """Read a TACCL topology profile (``.json``); see :func:`parse_taccl`."""
    src = SourceFile.read(path)
    return parse_taccl(src.text, src.name)


__all__ = ["load_taccl", "parse_taccl", "NDV2_DOUBLE", "NDV2_SINGLE"]
