"""Parser for the cluster DSL (``.topo``): HeteCCL's Appendix A syntax plus additive extensions.

Entry points: :func:`parse_topology` (text -> :class:`~hccc.compiler.cluster.topology.Topology`) and
:func:`load_topology` (path -> Topology).  Every malformed input raises
:class:`~hccc.util.diagnostics.CompileError` with a located diagnostic.

The inverse direction, :func:`format_topology`, writes a :class:`ClusterSpec` (plain dataclasses)
as ``.topo`` text; the example generator and the round-trip tests use it.

Scoping rule (HeteCCL's): a definition belongs to the most recent ``define nodeK = G`` or
``define internode = ...``; definitions before the first node are cluster-wide defaults.
``nodenum`` and ``chunksize`` are always cluster-wide.  Semantics of every statement are described
in ``examples/clusters/README.md``.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Union

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.util.limits import check_count, check_source_lines
from hccc.util.sizes import SIZE_RE as _SIZE_RE, SIZE_SUFFIX as _SUFFIX
from hccc.compiler.cluster.topology import (CLASS_CODE, DEFAULT_ALPHA_US, DEFAULT_CHUNK_SIZE, LINK_CLASSES,
                        MAX_LOGICAL_CAPACITY, CapacityError, DuplicateLinkError, Topology, TopologyBuilder)

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 1024
MAX_RANKS = 65536
#: links of one cluster (after every internode statement is expanded), counted before they are
#: built. Measured: 2,048 GPUs linked all-to-all through NICs (4.2M links) take 1.5 GB and about 30 s
#: in ``hccc topo``, so the limit keeps a cluster under about 3 GB; 2,828 GPUs all-to-all reach it
MAX_LINKS = 8_000_000
#: link entries (``->``, ``>->``) one file may write, counted before parsing (the parser's time grows
#: with them; a switch group ``>->`` describes any number of links in one entry)
MAX_LINK_ENTRIES = 32_768
#: lines of one cluster file, counted before parsing (every node takes a line or more)
MAX_TOPO_LINES = 8_192
MAX_LANES = 1 << 16
MAX_BANDWIDTH_GBPS = 10**9
#: the smallest bandwidth (GB/s, per lane) and GPU compute rate (gamma) accepted: 1 kB/s. Slower is no
#: interconnect hccc could schedule for, and every ratio of link speeds (the logical capacities,
#: :data:`~hccc.compiler.cluster.topology.MAX_LOGICAL_CAPACITY`) must stay representable
MIN_BANDWIDTH_GBPS = Fraction(1, 10**6)
MAX_LATENCY_US = 10**9
MAX_CHUNK_SIZE = 1 << 40

_GRAMMAR = Path(__file__).with_name("topo.lark")
_NODE_RE = re.compile(r"node([0-9]+)")
_STATEMENTS = ("nodenum", "nodeK", "bandwidth", "internode", "interbandwidth", "latency", "vendor", "gpu",
               "gamma", "nic", "pcie", "chunksize")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    from hccc.compiler.frontend.grammar_cache import lark_cache
    text = _GRAMMAR.read_text(encoding="utf-8")
    return Lark(text, parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=False,
                cache=lark_cache("topo", text))


# ---------------------------------------------------------------------------------------------
# spec dataclasses + writer
# ---------------------------------------------------------------------------------------------
Num = Union[int, str, Fraction]


@dataclass
class LinkSpec:
    """``(src,dst) -> (bw,lanes)``: a directed link (local ids; across nodes: src in X, dst in Y)."""

    src: int
    dst: int
    bandwidth: Num
    lanes: int = 1


@dataclass
class SharedSpec:
    """``((A),(B)) >-> (bw,lanes)``: every pair across A and B, both directions, one device."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    bandwidth: Num
    lanes: int = 1


@dataclass
class NicSpec:
    """``((gpus...) -> (bw,lanes))`` inside ``define nic = [...]``: GPUs sharing one NIC."""

    gpus: tuple[int, ...]
    bandwidth: Num
    lanes: int = 1


@dataclass
class NodeSpec:
    ngpus: int
    bandwidth: dict[str, list] | None = None  # {"direct": [...], "switch": [...]}
    latency: dict[str, Num] | None = None
    vendor: str | None = None
    gpu: str | None = None
    gamma: Num | None = None
    nics: list[NicSpec] | None = None
    pcie: list[NicSpec] | None = None  # PCIe switches: same entry form as a NIC
    comment: str | None = None
    name: str | None = None  # default node<index+1>


@dataclass
class InternodeSpec:
    pair: tuple[str, str] | str  # ("node1", "node2") or "all"
    bandwidth: dict[str, list] | str  # map, or "nic"
    latency: dict[str, Num] | None = None
    comment: str | None = None


@dataclass
class ClusterSpec:
    nodes: list[NodeSpec]
    internodes: list[InternodeSpec] = field(default_factory=list)
    latency: dict[str, Num] | None = None
    vendor: str | None = None
    gpu: str | None = None
    gamma: Num | dict[str, Num] | None = None
    chunksize: int | str | None = None
    comment: str | None = None
    nodenum: int | None = None  # default len(nodes)

    def node_names(self) -> list[str]:
        return [n.name or f"node{i + 1}" for i, n in enumerate(self.nodes)]


def _fmt_num(x: Num) -> str:
    if isinstance(x, bool):
        raise TypeError("bool is not a number")
    if isinstance(x, int):
        return str(x)
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        x = Fraction(repr(x))
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d != 1:
        raise ValueError(f"{x} has no finite decimal form")
    digits = max(twos, fives)
    scaled = x * 10**digits
    sign = "-" if scaled < 0 else ""
    s = str(abs(scaled.numerator)).rjust(digits + 1, "0")
    return f"{sign}{s[:-digits]}.{s[-digits:]}".rstrip("0").rstrip(".")


def _fmt_ids(ids) -> str:
    return "(" + ",".join(str(int(i)) for i in ids) + ")"


def _fmt_entry(e) -> str:
    if isinstance(e, LinkSpec):
        return f"(({e.src},{e.dst}) -> ({_fmt_num(e.bandwidth)},{e.lanes}))"
    if isinstance(e, SharedSpec):
        return f"(({_fmt_ids(e.a)},{_fmt_ids(e.b)}) >-> ({_fmt_num(e.bandwidth)},{e.lanes}))"
    if isinstance(e, NicSpec):
        return f"({_fmt_ids(e.gpus)} -> ({_fmt_num(e.bandwidth)},{e.lanes}))"
    raise TypeError(f"not a topology entry: {e!r}")


def _fmt_list(entries, per_line: int = 4) -> str:
    parts = [_fmt_entry(e) for e in entries]
    if len(parts) <= per_line:
        return "[" + ", ".join(parts) + "]"
    rows = [", ".join(parts[i:i + per_line]) for i in range(0, len(parts), per_line)]
    return "[" + (",\n    ").join(rows) + "]"


def _fmt_bwmap(m: dict[str, list]) -> str:
    return "{" + ",\n    ".join(f"{k} => {_fmt_list(v)}" for k, v in m.items()) + "}"


def _fmt_scalar_map(m: dict[str, Num]) -> str:
    return "{" + ", ".join(f"{k} => {_fmt_num(v)}" for k, v in m.items()) + "}"


def _fmt_comment(c: str | None) -> list[str]:
    if not c:
        return []
    return ["# " + line if line else "#" for line in c.splitlines()]


def format_topology(spec: ClusterSpec) -> str:
    """Write ``spec`` as .topo text (HeteCCL syntax plus the extensions it uses)."""
    out = _fmt_comment(spec.comment)
    out.append(f"define nodenum = {spec.nodenum if spec.nodenum is not None else len(spec.nodes)}")
    if spec.chunksize is not None:
        out.append(f"define chunksize = {spec.chunksize}")
    if spec.latency:
        out.append(f"define latency = {_fmt_scalar_map(spec.latency)}")
    if spec.vendor:
        out.append(f"define vendor = {spec.vendor}")
    if spec.gpu:
        out.append(f"define gpu = {spec.gpu}")
    if spec.gamma is not None:
        g = _fmt_scalar_map(spec.gamma) if isinstance(spec.gamma, dict) else _fmt_num(spec.gamma)
        out.append(f"define gamma = {g}")
    for name, node in zip(spec.node_names(), spec.nodes):
        out.append("")
        out.extend(_fmt_comment(node.comment))
        out.append(f"define {name} = {node.ngpus}")
        if node.vendor:
            out.append(f"define vendor = {node.vendor}")
        if node.gpu:
            out.append(f"define gpu = {node.gpu}")
        if node.gamma is not None:
            out.append(f"define gamma = {_fmt_num(node.gamma)}")
        if node.bandwidth is not None:
            out.append(f"define bandwidth = {_fmt_bwmap(node.bandwidth)}")
        if node.latency:
            out.append(f"define latency = {_fmt_scalar_map(node.latency)}")
        if node.nics:
            out.append(f"define nic = {_fmt_list(node.nics)}")
        if node.pcie:
            out.append(f"define pcie = {_fmt_list(node.pcie)}")
    for inter in spec.internodes:
        out.append("")
        out.extend(_fmt_comment(inter.comment))
        pair = inter.pair if isinstance(inter.pair, str) else f"({inter.pair[0]}, {inter.pair[1]})"
        out.append(f"define internode = {pair}")
        bw = inter.bandwidth if isinstance(inter.bandwidth, str) else _fmt_bwmap(inter.bandwidth)
        out.append(f"define interbandwidth = {bw}")
        if inter.latency:
            out.append(f"define latency = {_fmt_scalar_map(inter.latency)}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------------
@dataclass
class _Node:
    name: str
    index: int  # definition order
    ngpus: int
    loc: Location
    defs: dict[str, tuple[Location, object]] = field(default_factory=dict)  # key -> (loc, value tree)


@dataclass
class _Inter:
    pair: tuple[Token, Token] | None  # None = all
    loc: Location
    defs: dict[str, tuple[Location, object]] = field(default_factory=dict)


class _Walker:
    def __init__(self, source: SourceFile):
        self.src = source
        self.nodenum: tuple[Location, int] | None = None
        self.chunksize: tuple[Location, int] | None = None
        self.globals: dict[str, tuple[Location, object]] = {}
        self.nodes: list[_Node] = []
        self.node_by_name: dict[str, _Node] = {}
        self.inters: list[_Inter] = []
        # link origins for duplicate reporting
        self._origin_start: list[int] = []
        self._origin_loc: list[tuple[Location, str]] = []
        # where each link parameter entry and shared group was first declared (capacity errors)
        self._param_loc: dict[int, Location] = {}
        self._group_loc: dict[int, Location] = {}

    # -- helpers -------------------------------------------------------------------------------
    def loc(self, item) -> Location:
        if isinstance(item, Token):
            return Location(self.src, item.line or 1, item.column or 1)
        if isinstance(item, Tree) and not item.meta.empty:
            return Location(self.src, item.meta.line, item.meta.column)
        if isinstance(item, Tree):
            for ch in item.children:
                if isinstance(ch, (Token, Tree)):
                    return self.loc(ch)
        return Location(self.src, 1, 1)

    def err(self, item, msg: str, notes: tuple[str, ...] = ()) -> CompileError:
        at = item if isinstance(item, Location) else self.loc(item)
        return CompileError([Diagnostic(msg, at, notes=notes)])

    def number(self, tok: Token, what: str, *, integer: bool = False, positive: bool = True,
               nonneg: bool = False, maximum=None, minimum=None, suffix: bool = False) -> Fraction | int:
        m = _SIZE_RE.fullmatch(str(tok))
        if m is None:  # the lexer guarantees the shape; stay defensive
            raise self.err(tok, f"malformed number '{tok}'")
        if m.group(2) and not suffix:
            raise self.err(tok, f"{what} takes a plain number, not '{tok}' (size suffixes are for chunksize)")
        if len(m.group(1)) > 40:
            raise self.err(tok, f"{what} '{tok}' is too long")
        val = Fraction(m.group(1)) * _SUFFIX[(m.group(2) or "")[:1].lower()]
        if integer and val.denominator != 1:
            raise self.err(tok, f"{what} must be an integer, got '{tok}'")
        if positive and val <= 0:
            raise self.err(tok, f"{what} must be > 0, got '{tok}'")
        if nonneg and val < 0:
            raise self.err(tok, f"{what} must be >= 0, got '{tok}'")
        if maximum is not None and val > maximum:
            raise self.err(tok, f"{what} {tok} is too large (at most {maximum})")
        if minimum is not None and val < minimum and not (nonneg and val == 0):
            raise self.err(tok, f"{what} {tok} is too small (at least {_fmt_num(minimum)})")
        return int(val) if integer else val

    def expect(self, value, kind: str, what: str):
        if not isinstance(value, Tree) or value.data != kind:
            forms = {"number": "a number", "name": "a name", "nodepair": "a pair (nodeX, nodeY)",
                     "map": "a map {key => ...}", "list": "a list [...]"}
            raise self.err(value, f"{what} expects {forms[kind]}")
        return value

    # -- pass 1: statements and scopes ------------------------------------------------------------
    def walk(self, tree: Tree) -> None:
        ctx: _Node | _Inter | None = None
        for stmt in tree.children:
            _define, name_tok, value = stmt.children
            key = str(name_tok)
            here = self.loc(name_tok)
            m = _NODE_RE.fullmatch(key)
            if key == "nodenum":
                if self.nodenum is not None:
                    raise self.err(name_tok, f"nodenum is defined twice (first at {self.nodenum[0]})")
                if self.nodes:
                    raise self.err(name_tok, "nodenum must be defined before the first node")
                tok = self.expect(value, "number", "nodenum").children[0]
                self.nodenum = (here, self.number(tok, "nodenum", integer=True, maximum=MAX_NODES))
            elif m is not None:
                if self.nodenum is None:
                    raise self.err(name_tok, f"{key} is defined before 'define nodenum = N'")
                k = int(m.group(1))
                if not 1 <= k <= self.nodenum[1]:
                    raise self.err(name_tok, f"{key} is out of range: nodenum = {self.nodenum[1]} allows "
                                             f"node1..node{self.nodenum[1]}")
                if key in self.node_by_name:
                    raise self.err(name_tok, f"{key} is defined twice (first at {self.node_by_name[key].loc})")
                tok = self.expect(value, "number", key).children[0]
                g = self.number(tok, f"the GPU count of {key}", integer=True, maximum=MAX_GPUS_PER_NODE)
                ctx = _Node(key, len(self.nodes), g, here)
                self.nodes.append(ctx)
                self.node_by_name[key] = ctx
                self.ngpus_total = getattr(self, "ngpus_total", 0) + g   # running total: linear time
                if self.ngpus_total > MAX_RANKS:
                    raise self.err(name_tok, f"the cluster has more than {MAX_RANKS} GPUs")
            elif key == "chunksize":
                if self.chunksize is not None:
                    raise self.err(name_tok, f"chunksize is defined twice (first at {self.chunksize[0]})")
                tok = self.expect(value, "number", "chunksize").children[0]
                self.chunksize = (here, self.number(tok, "chunksize", integer=True, suffix=True,
                                                    maximum=MAX_CHUNK_SIZE))
            elif key == "internode":
                if isinstance(value, Tree) and value.data == "name":
                    if str(value.children[0]) != "all":
                        raise self.err(value, "internode expects (nodeX, nodeY) or 'all'")
                    ctx = _Inter(None, here)
                else:
                    pair = self.expect(value, "nodepair", "internode")
                    ctx = _Inter((pair.children[0], pair.children[1]), here)
                self.inters.append(ctx)
            elif key == "interbandwidth":
                if not isinstance(ctx, _Inter):
                    raise self.err(name_tok, "interbandwidth must follow 'define internode = (nodeX, nodeY)'")
                self._once(ctx.defs, key, name_tok, value)
            elif key in ("bandwidth", "nic", "pcie"):
                if not isinstance(ctx, _Node):
                    raise self.err(name_tok, f"{key} must follow a node definition 'define nodeK = G'")
                self._once(ctx.defs, key, name_tok, value)
            elif key in ("vendor", "gpu", "gamma"):
                if isinstance(ctx, _Inter):
                    raise self.err(name_tok, f"{key} belongs to a node (after 'define nodeK = G') or to the "
                                             "whole cluster (before the first node), not to an internode")
                self._once(self.globals if ctx is None else ctx.defs, key, name_tok, value)
            elif key == "latency":
                self._once(self.globals if ctx is None else ctx.defs, key, name_tok, value)
            else:
                raise self.err(name_tok, f"unknown definition '{key}'",
                               notes=("known: " + ", ".join(_STATEMENTS),))
        if self.nodenum is None:
            at = Location(self.src, 1, 1)
            raise self.err(at, "missing 'define nodenum = N'")
        if len(self.nodes) != self.nodenum[1]:
            missing = [f"node{k}" for k in range(1, self.nodenum[1] + 1) if f"node{k}" not in self.node_by_name]
            raise self.err(self.nodenum[0], f"nodenum = {self.nodenum[1]} but {len(self.nodes)} node(s) are "
                                            f"defined (missing: {', '.join(missing[:8])}"
                                            f"{', ...' if len(missing) > 8 else ''})")
        for it in self.inters:
            if "interbandwidth" not in it.defs:
                raise self.err(it.loc, "internode has no 'define interbandwidth = ...' after it")

    def _once(self, defs: dict, key: str, tok: Token, value) -> None:
        if key in defs:
            raise self.err(tok, f"{key} is defined twice in this scope (first at {defs[key][0]})")
        defs[key] = (self.loc(tok), value)

    # -- value readers ------------------------------------------------------------------------------
    def ids(self, tree: Tree, ngpus: int, owner: str, what: str = "GPU group") -> tuple[int, ...]:
        toks = [t for t in tree.children if isinstance(t, Token)]
        if not toks:
            raise self.err(tree, f"empty {what}")
        out = []
        for t in toks:
            g = self.gpu(t, ngpus, owner)
            if g in out:
                raise self.err(t, f"GPU {g} appears twice in the {what}")
            out.append(g)
        return tuple(out)

    def gpu(self, tok: Token, ngpus: int, owner: str) -> int:
        m = _SIZE_RE.fullmatch(str(tok))
        if m is None or m.group(2) or "." in m.group(1) or len(m.group(1)) > 12:
            raise self.err(tok, f"GPU id must be an integer, got '{tok}'")
        g = int(m.group(1))
        if not 0 <= g < ngpus:
            raise self.err(tok, f"GPU id {g} is out of range: {owner} has {ngpus} GPU(s) (ids 0..{ngpus - 1})")
        return g

    def spec(self, tree: Tree) -> tuple[Fraction, int]:
        bw_tok, lanes_tok = tree.children
        bw = self.number(bw_tok, "bandwidth", maximum=MAX_BANDWIDTH_GBPS, minimum=MIN_BANDWIDTH_GBPS)
        lanes = self.number(lanes_tok, "the lane count", integer=True, maximum=MAX_LANES)
        return bw, lanes

    def scalar_map(self, loc: Location, value, keys: tuple[str, ...], what: str, *, nonneg=False,
                   maximum=None, minimum=None) -> dict[str, Fraction]:
        tree = self.expect(value, "map", what)
        out: dict[str, Fraction] = {}
        for item in tree.children:
            ktok, v = item.children
            k = str(ktok)
            if k not in keys:
                raise self.err(ktok, f"'{k}' is not valid in {what} here (expected one of: {', '.join(keys)})")
            if k in out:
                raise self.err(ktok, f"'{k}' appears twice in {what}")
            vt = self.expect(v, "number", f"{what} '{k}'").children[0]
            out[k] = self.number(vt, f"{what} '{k}'", positive=not nonneg, nonneg=nonneg, maximum=maximum,
                                 minimum=minimum)
        return out

    def vendor(self, value) -> str:
        tok = self.expect(value, "name", "vendor").children[0]
        v = str(tok).lower()
        if v not in ("nvidia", "amd"):
            raise self.err(tok, f"unknown vendor '{tok}' (expected nvidia or amd)")
        return v

    def model(self, value) -> str:
        tok = self.expect(value, "name", "gpu").children[0]
        if len(str(tok)) > 64:
            raise self.err(tok, "GPU model name is too long (at most 64 characters)")
        return str(tok)

    # -- pass 2: build ------------------------------------------------------------------------------
    def build(self, name: str) -> Topology:
        b = TopologyBuilder(name)
        glat: dict[str, Fraction] = {}
        if "latency" in self.globals:
            loc, v = self.globals["latency"]
            glat = self.scalar_map(loc, v, ("direct", "switch", "internode", "nic"), "latency", nonneg=True,
                                   maximum=MAX_LATENCY_US)
        gvendor = self.vendor(self.globals["vendor"][1]) if "vendor" in self.globals else "nvidia"
        gmodel = self.model(self.globals["gpu"][1]) if "gpu" in self.globals else None
        ggamma: Fraction | None = None
        ggamma_map: dict[str, Fraction] = {}
        if "gamma" in self.globals:
            loc, v = self.globals["gamma"]
            if isinstance(v, Tree) and v.data == "map":
                ggamma_map = self.scalar_map(loc, v, ("nvidia", "amd"), "gamma", maximum=MAX_BANDWIDTH_GBPS,
                                             minimum=MIN_BANDWIDTH_GBPS)
            else:
                ggamma = self.number(self.expect(v, "number", "gamma").children[0], "gamma",
                                     maximum=MAX_BANDWIDTH_GBPS, minimum=MIN_BANDWIDTH_GBPS)

        def alpha(c: str, local: dict[str, Fraction]) -> Fraction:
            return local.get(c, glat.get(c, DEFAULT_ALPHA_US[c]))

        offsets = {}
        for nd in self.nodes:
            vendor = self.vendor(nd.defs["vendor"][1]) if "vendor" in nd.defs else gvendor
            model = self.model(nd.defs["gpu"][1]) if "gpu" in nd.defs else gmodel
            if "gamma" in nd.defs:
                gamma = self.number(self.expect(nd.defs["gamma"][1], "number", "gamma").children[0], "gamma",
                                    maximum=MAX_BANDWIDTH_GBPS, minimum=MIN_BANDWIDTH_GBPS)
            else:
                gamma = ggamma_map.get(vendor, ggamma)
            info = b.add_node(nd.name, nd.ngpus, vendor, model, gamma)
            offsets[nd.name] = info.offset

        # intra-node links
        for nd in self.nodes:
            off = offsets[nd.name]
            lat: dict[str, Fraction] = {}
            if "latency" in nd.defs:
                loc, v = nd.defs["latency"]
                lat = self.scalar_map(loc, v, ("direct", "switch"), "latency", nonneg=True, maximum=MAX_LATENCY_US)
            if "bandwidth" in nd.defs:
                loc, v = nd.defs["bandwidth"]
                for cls, entries in self.bwmap(v, "bandwidth"):
                    for e in entries:
                        self.entry(b, e, cls, nd, nd, off, off, lambda c: alpha(c, lat), intra=True)
        # inter-node links: counted first, so that a cluster over the link limit is refused before
        # any of its node pairs is built
        self.check_internode_links(b)
        seen_pairs: dict[tuple[str, str], Location] = {}
        nic_pairs: list[tuple[_Node, _Node, Fraction, Location]] = []
        for it in self.inters:
            lat: dict[str, Fraction] = {}
            if "latency" in it.defs:
                loc, v = it.defs["latency"]
                lat = self.scalar_map(loc, v, ("internode", "nic"), "latency", nonneg=True, maximum=MAX_LATENCY_US)
            if it.pair is None:
                pairs = itertools.combinations(self.nodes, 2)
            else:
                nodes = []
                for tok in it.pair:
                    if str(tok) not in self.node_by_name:
                        raise self.err(tok, f"internode names an undefined node '{tok}'")
                    nodes.append(self.node_by_name[str(tok)])
                if nodes[0] is nodes[1]:
                    raise self.err(it.pair[1], f"internode connects {nodes[0].name} to itself")
                key = (nodes[0].name, nodes[1].name)
                if key in seen_pairs:
                    raise self.err(it.loc, f"internode ({key[0]}, {key[1]}) is already defined at {seen_pairs[key]}")
                seen_pairs[key] = it.loc
                pairs = [(nodes[0], nodes[1])]
            bloc, bv = it.defs["interbandwidth"]
            if isinstance(bv, Tree) and bv.data == "name":
                if str(bv.children[0]) != "nic":
                    raise self.err(bv, "interbandwidth expects a map {direct => [...], switch => [...]} or 'nic'")
                for x, y in pairs:
                    nic_pairs.append((x, y, alpha("nic", lat), self.loc(bv)))
                continue
            classes = self.bwmap(bv, "interbandwidth")
            for x, y in pairs:
                for _cls, entries in classes:
                    for e in entries:
                        self.entry(b, e, "internode", x, y, offsets[x.name], offsets[y.name],
                                   lambda c: alpha(c, lat), intra=False)
        # NICs
        nic_of, nic_rows = self.device_table(b.nranks, offsets, "nic", "NIC group", "NIC")
        nic_table = [(nd.name, idx, gpus, bw, lanes) for nd, idx, gpus, bw, lanes in nic_rows]
        for x, y, a, at in nic_pairs:
            self.nic_links(b, x, y, offsets, nic_of, nic_table, a, at)
        # NIC groups: egress/ingress over every link that leaves/enters the node through the NIC
        if nic_table and b.nlinks:
            src, dst, cls = b.link_arrays()
            cross = (cls == CLASS_CODE["internode"]) | (cls == CLASS_CODE["nic"])
            nic_alpha = glat.get("nic", DEFAULT_ALPHA_US["nic"])
            self.device_groups(b, "nic", nic_of[src], nic_of[dst], cross, nic_rows, [nic_alpha] * len(nic_rows))
        self.pcie_groups(b, offsets, glat)
        chunk = self.chunksize[1] if self.chunksize else DEFAULT_CHUNK_SIZE
        try:
            return b.build(chunk)
        except DuplicateLinkError as exc:
            raise self.duplicate(b, exc) from None
        except CapacityError as exc:
            raise self.capacity(b, exc) from None

    def capacity(self, b: TopologyBuilder, exc: CapacityError) -> CompileError:
        """A link or group whose speed is too far from the slowest link's (located at it, with a note
        at the slowest link)."""
        first = self.chunksize[0] if self.chunksize else Location(self.src, 1, 1)
        locs = self._param_loc if exc.kind == "param" else self._group_loc
        at = locs.get(exc.index, first)
        ref = self._param_loc.get(exc.ref)
        what = "this link" if exc.kind == "param" else "this shared connection"
        return CompileError([Diagnostic(
            f"{what} is so much faster than the slowest link that one chunk time of the slowest holds "
            f"{exc.capacity} chunks of it (its logical capacity, ceil(tau_ref / tau) * lanes), over the "
            f"limit of {MAX_LOGICAL_CAPACITY}: link speeds of one cluster must be within about 10**9 of "
            "one another", at, notes=(f"the slowest link (tau_ref) is declared at {ref}",) if ref else ())])

    def check_internode_links(self, b: TopologyBuilder) -> None:
        """Refuse, before building them, inter-node statements that would take the cluster past
        :data:`MAX_LINKS`: ``internode = all`` with ``interbandwidth = nic`` links every GPU to every
        GPU of every other node (with G GPUs in all and g_k on node k: G**2 - sum g_k**2 links), and
        a map's entries repeat for every node pair."""
        total = b.nlinks
        sizes = [nd.ngpus for nd in self.nodes]
        everyone = sum(sizes) ** 2 - sum(g * g for g in sizes)     # ordered GPU pairs across nodes
        for it in self.inters:
            _bloc, bv = it.defs["interbandwidth"]
            if it.pair is None:
                npairs = len(sizes) * (len(sizes) - 1) // 2
            elif all(str(t) in self.node_by_name for t in it.pair):
                npairs = 1
            else:
                continue                       # the build reports the undefined node, located
            if isinstance(bv, Tree) and bv.data == "name":
                if it.pair is None:
                    adds = everyone
                else:
                    x, y = (self.node_by_name[str(t)] for t in it.pair)
                    adds = 2 * x.ngpus * y.ngpus
            elif isinstance(bv, Tree) and bv.data == "map":
                per_pair = 0
                for item in bv.children:
                    lst = item.children[1]
                    for e in (lst.children if isinstance(lst, Tree) and lst.data == "list" else ()):
                        if isinstance(e, Tree) and e.data == "link":
                            per_pair += 1
                        elif isinstance(e, Tree) and len(e.children) == 3:
                            na, nb = (sum(isinstance(t, Token) for t in g.children) for g in e.children[:2])
                            per_pair += 2 * na * nb
                adds = npairs * per_pair
            else:
                continue                       # the build reports the malformed value, located
            total += adds
            if total > MAX_LINKS:
                what = ("internode = all" if it.pair is None else "this internode") + (
                    " with interbandwidth = nic links every GPU to every GPU of the other node(s)"
                    if isinstance(bv, Tree) and bv.data == "name" else "")
                raise self.err(it.loc, f"{what}: the cluster would have {total} links or more, over the "
                                       f"limit of {MAX_LINKS} (checked before any is built)")

    def device_table(self, nranks: int, offsets: dict[str, int], key: str, group_what: str, device: str):
        """``define <key> = [((gpus...) -> (bw, lanes)), ...]`` of every node: the shared devices (NICs,
        PCIe switches) a GPU sits behind, at most one each. Returns (device index per rank, -1 for none;
        rows ``(node, index in its node, gpus, bw, lanes)``)."""
        owner = np.full(nranks, -1, dtype=np.int64)
        rows: list = []
        for nd in self.nodes:
            if key not in nd.defs:
                continue
            loc, v = nd.defs[key]
            lst = self.expect(v, "list", key)
            off = offsets[nd.name]
            idx = 0
            for e in lst.children:
                if e.data != "link":
                    raise self.err(e, f"a {key} entry is ((gpus...) -> (bandwidth, lanes))")
                ids_tree, spec_tree = e.children
                gpus = self.ids(ids_tree, nd.ngpus, nd.name, group_what)
                bw, lanes = self.spec(spec_tree)
                for g in gpus:
                    if owner[off + g] >= 0:
                        other = rows[owner[off + g]]
                        raise self.err(ids_tree, f"GPU {g} of {nd.name} is already behind {device} {other[1]} "
                                                 f"({_fmt_ids(other[2])})")
                    owner[off + g] = len(rows)
                rows.append((nd, idx, gpus, bw, lanes))
                idx += 1
        return owner, rows

    def device_groups(self, b: TopologyBuilder, kind: str, src_owner: np.ndarray, dst_owner: np.ndarray,
                      through: np.ndarray, rows: list, alphas: list) -> None:
        """One egress and one ingress shared group per device of ``rows`` over the links selected by
        ``through`` that leave (``src_owner``) / enter (``dst_owner``) its GPUs."""
        for direction, owner in (("egress", src_owner), ("ingress", dst_owner)):
            ids = np.nonzero(through & (owner >= 0))[0]
            own = owner[ids]
            order = np.argsort(own, kind="stable")
            ids, own = ids[order], own[order]
            bounds = np.searchsorted(own, np.arange(len(rows) + 1))
            for k, (nd, idx, gpus, bw, lanes) in enumerate(rows):
                members = ids[bounds[k]:bounds[k + 1]]
                if members.size:
                    gid = b.add_group(kind, direction, f"{nd.name} {kind}{idx} {_fmt_ids(gpus)} {direction}",
                                      members, bw, lanes, alphas[k])
                    self._group_loc[gid] = nd.defs[kind][0]

    def pcie_groups(self, b: TopologyBuilder, offsets: dict[str, int], glat: dict[str, Fraction]) -> None:
        """``define pcie = [((gpus...) -> (bw, lanes)), ...]``: the GPUs behind one PCIe switch share its
        uplink. Each switch becomes an egress and an ingress group over every link that is not ``direct``
        (NVLink bypasses PCIe) and leaves / enters the switch's GPUs for a GPU outside them."""
        sw_of, rows = self.device_table(b.nranks, offsets, "pcie", "PCIe switch group", "PCIe switch")
        if not rows or not b.nlinks:
            return
        alphas = []
        for nd, *_ in rows:
            lat: dict[str, Fraction] = {}
            if "latency" in nd.defs:
                lat = self.scalar_map(nd.defs["latency"][0], nd.defs["latency"][1], ("direct", "switch"), "latency",
                                      nonneg=True, maximum=MAX_LATENCY_US)
            alphas.append(lat.get("switch", glat.get("switch", DEFAULT_ALPHA_US["switch"])))
        src, dst, cls = b.link_arrays()
        s_own, d_own = sw_of[src], sw_of[dst]
        self.device_groups(b, "pcie", s_own, d_own, (cls != CLASS_CODE["direct"]) & (s_own != d_own), rows, alphas)

    def bwmap(self, value, what: str) -> list[tuple[str, list]]:
        tree = self.expect(value, "map", what)
        out: list[tuple[str, list]] = []
        seen: set[str] = set()
        for item in tree.children:
            ktok, v = item.children
            k = str(ktok)
            if k not in ("direct", "switch"):
                hint = " (use 'define interbandwidth = nic' for NIC links)" if k == "nic" else ""
                raise self.err(ktok, f"unknown connection type '{k}' in {what} (expected direct or switch){hint}")
            if k in seen:
                raise self.err(ktok, f"connection type '{k}' appears twice in {what}")
            seen.add(k)
            out.append((k, self.expect(v, "list", f"{what} '{k}'").children))
        return out

    def _note_origin(self, b: TopologyBuilder, at: Location, desc: str) -> None:
        self._origin_start.append(b.nlinks)
        self._origin_loc.append((at, desc))
        if b.nlinks > MAX_LINKS:
            raise self.err(at, f"the cluster has more than {MAX_LINKS} links")

    def entry(self, b: TopologyBuilder, e: Tree, cls: str, x: _Node, y: _Node, offx: int, offy: int, alpha,
              intra: bool) -> None:
        at = self.loc(e)
        if e.data == "link":
            ids_tree, spec_tree = e.children
            toks = [t for t in ids_tree.children if isinstance(t, Token)]
            if len(toks) != 2:
                raise self.err(ids_tree, f"a link is (src,dst) -> (bandwidth, lanes); got {len(toks)} GPU id(s)")
            a = self.gpu(toks[0], x.ngpus, x.name)
            c = self.gpu(toks[1], y.ngpus, y.name)
            if intra and a == c:
                raise self.err(toks[1], f"link from GPU {a} to itself")
            bw, lanes = self.spec(spec_tree)
            pid = b.params(cls, bw, lanes, alpha(cls))
            self._param_loc.setdefault(pid, at)
            self._note_origin(b, at, "link")
            b.add_links([offx + a], [offy + c], pid, mergeable=False)
            return
        ga_tree, gb_tree, spec_tree = e.children
        ga = self.ids(ga_tree, x.ngpus, x.name)
        gb = self.ids(gb_tree, y.ngpus, y.name)
        if intra:
            common = sorted(set(ga) & set(gb))
            if common:
                raise self.err(gb_tree, f"GPU {common[0]} is in both groups of a shared connection")
        bw, lanes = self.spec(spec_tree)
        pid = b.params(cls, bw, lanes, alpha(cls))
        self._param_loc.setdefault(pid, at)
        A = offx + np.array(ga, dtype=np.int64)
        B = offy + np.array(gb, dtype=np.int64)
        s_ab, d_ab = np.repeat(A, B.size), np.tile(B, A.size)
        self._note_origin(b, at, "shared")
        if b.nlinks + 2 * s_ab.size > MAX_LINKS:
            raise self.err(at, f"the cluster has more than {MAX_LINKS} links")
        ab = b.add_links(s_ab, d_ab, pid, mergeable=True)
        ba = b.add_links(d_ab, s_ab, pid, mergeable=True)
        where = x.name if intra else f"{x.name}/{y.name}"
        label = f"{where} {cls} ({_fmt_ids(ga)},{_fmt_ids(gb)})"
        kind = cls
        self._group_loc[b.add_group(kind, "a->b", label + " a->b", ab, bw, lanes, alpha(cls))] = at
        self._group_loc[b.add_group(kind, "b->a", label + " b->a", ba, bw, lanes, alpha(cls))] = at

    def nic_links(self, b: TopologyBuilder, x: _Node, y: _Node, offsets, nic_of, nic_table, a: Fraction,
                  at: Location) -> None:
        ox, oy = offsets[x.name], offsets[y.name]
        # link parameters of every NIC pair, memoised by what they depend on (node pairs repeat them)
        memo = b.__dict__.setdefault("_nic_params", {})
        kinds = b.__dict__.setdefault("_nic_kinds", {})
        ux, ki, ix = self._node_nics(b, x, ox, nic_of, nic_table, at, kinds)
        uy, kj, iy = self._node_nics(b, y, oy, nic_of, nic_table, at, kinds)
        ka = kinds.setdefault(("alpha", a), len(kinds))
        small = np.zeros((ux.size, uy.size), dtype=np.int64)
        for ii, i in enumerate(ux.tolist()):
            for jj, j in enumerate(uy.tolist()):
                key = (ki[ii], kj[jj], ka)
                pid = memo.get(key)
                if pid is None:
                    bw = min(nic_table[i][3], nic_table[j][3])
                    lanes = min(nic_table[i][4], nic_table[j][4])
                    pid = memo[key] = b.params("nic", bw, lanes, a)
                    self._param_loc.setdefault(pid, at)
                small[ii, jj] = pid
        pm = small[np.ix_(ix, iy)]
        src = np.repeat(np.arange(ox, ox + x.ngpus), y.ngpus)
        dst = np.tile(np.arange(oy, oy + y.ngpus), x.ngpus)
        self._note_origin(b, at, "nic")
        if b.nlinks + 2 * src.size > MAX_LINKS:
            raise self.err(at, f"the cluster has more than {MAX_LINKS} links")
        b.add_links(src, dst, pm.ravel(), mergeable=True)
        b.add_links(dst, src, pm.ravel(), mergeable=True)

    def _node_nics(self, b: TopologyBuilder, nd: _Node, off: int, nic_of, nic_table, at: Location, kinds: dict):
        """A node's distinct NICs, their parameter kinds and each GPU's index among them, once per node
        (``internode = all`` asks for every node once per other node)."""
        cache = b.__dict__.setdefault("_node_nics", {})
        got = cache.get(nd.name)
        if got is None:
            arr = nic_of[off:off + nd.ngpus]
            missing = np.nonzero(arr < 0)[0]
            if missing.size:
                raise self.err(at, f"'interbandwidth = nic' needs a NIC for every GPU, but GPU {int(missing[0])} "
                                   f"of {nd.name} has none (add 'define nic = [...]' after {nd.name})")
            u = np.unique(arr)
            k = [kinds.setdefault((nic_table[i][3], nic_table[i][4]), len(kinds)) for i in u.tolist()]
            got = cache[nd.name] = (u, k, np.searchsorted(u, arr))
        return got

    def describe_rank(self, b: TopologyBuilder, r: int) -> str:
        for nd in b.nodes:
            if nd.offset <= r < nd.offset + nd.ngpus:
                return f"{nd.name} GPU {r - nd.offset}"
        return f"rank {r}"

    def duplicate(self, b: TopologyBuilder, exc: DuplicateLinkError) -> CompileError:
        src, dst, cls = b.link_arrays()
        starts = np.array(self._origin_start, dtype=np.int64)
        first = self._origin_loc[int(np.searchsorted(starts, exc.first, side="right")) - 1]
        second = self._origin_loc[int(np.searchsorted(starts, exc.second, side="right")) - 1]
        u, v, c = int(src[exc.second]), int(dst[exc.second]), LINK_CLASSES[int(cls[exc.second])]
        what = (f"link {self.describe_rank(b, u)} -> {self.describe_rank(b, v)} ({c})")
        if first[1] != "link" and second[1] != "link":
            msg = f"{what} is declared again with a different bandwidth or lane count (first at {first[0]})"
        else:
            msg = f"{what} is defined twice (first at {first[0]})"
        return CompileError([Diagnostic(msg, second[0])])


def _syntax_error(source: SourceFile, exc: UnexpectedInput) -> CompileError:
    line = getattr(exc, "line", None) or 1
    col = getattr(exc, "column", None) or 1
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = source.text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        msg = "unexpected end of input"
    elif isinstance(exc, UnexpectedCharacters):
        ch = source.text[exc.pos_in_stream] if exc.pos_in_stream < len(source.text) else "?"
        msg = f"unexpected character {ch!r}"
    elif isinstance(exc, UnexpectedToken):
        msg = f"unexpected '{exc.token}'"
    else:
        msg = "syntax error"
    expected = getattr(exc, "expected", None) or getattr(exc, "allowed", None)
    notes: tuple[str, ...] = ()
    if expected:
        pretty = sorted({_PRETTY.get(t, t) for t in expected})
        if len(pretty) <= 8:
            notes = ("expected " + " or ".join(pretty),)
    return CompileError([Diagnostic(msg, Location(source, line, col), notes=notes)])


_PRETTY = {"LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQUAL": "'='", "LBRACE": "'{'", "RBRACE": "'}'",
           "LSQB": "'['", "RSQB": "']'", "NUMBER": "a number", "NAME": "a name", "DEFINE": "'define'",
           "$END": "end of input"}


def parse_topology(text: str, name: str = "<input>") -> Topology:
    """Parse .topo text into a :class:`Topology`; bad input raises a located CompileError."""
    source = SourceFile(name, text)
    check_source_lines(source, "the cluster description", "describe GPU groups with switch entries '>->'",
                       cap=MAX_TOPO_LINES)
    check_count(source, "->", MAX_LINK_ENTRIES, "link entries ('->' and '>->')")
    if "\x00" in text:
        SourceFile.from_bytes(name, text.encode("utf-8", "replace"))  # raises the located NUL error
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(source, exc) from None
    w = _Walker(source)
    w.walk(tree)
    return w.build(Path(name).stem if name and not name.startswith("<") else name)


def load_topology(path: str | Path) -> Topology:
    """Read and parse a .topo file (undecodable bytes are located errors too)."""
    source = SourceFile.read(path)
    return parse_topology(source.text, source.name)
