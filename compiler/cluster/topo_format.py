"""A cluster as plain data (:class:`ClusterSpec` and its parts) and :func:`format_topology`, which
writes one as ``.topo`` text (HeteCCL's Appendix A syntax plus the extensions it uses). The
importers (:mod:`~hccc.compiler.cluster.machine`), the example generator and the round-trip tests
build clusters this way; :mod:`~hccc.compiler.cluster.topo_parser` reads the text back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union

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


def format_number(x: Num) -> str:
    """A number as .topo writes it: an integer, or its exact finite decimal form."""
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


def format_ids(ids) -> str:
    """GPU ids as a .topo group: ``(0,1,2)``."""
    return "(" + ",".join(str(int(i)) for i in ids) + ")"


def _fmt_entry(e) -> str:
    if isinstance(e, LinkSpec):
        return f"(({e.src},{e.dst}) -> ({format_number(e.bandwidth)},{e.lanes}))"
    if isinstance(e, SharedSpec):
        return f"(({format_ids(e.a)},{format_ids(e.b)}) >-> ({format_number(e.bandwidth)},{e.lanes}))"
    if isinstance(e, NicSpec):
        return f"({format_ids(e.gpus)} -> ({format_number(e.bandwidth)},{e.lanes}))"
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
    return "{" + ", ".join(f"{k} => {format_number(v)}" for k, v in m.items()) + "}"


def _fmt_comment(c: str | None) -> list[str]:
    if not c:
        return []
    return ["# " + line if line else "#" for line in c.splitlines()]


def format_topology(spec: ClusterSpec) -> str:
    """Write ``spec`` as .topo text (HeteCCL syntax plus the extensions it uses)."""
    out = _fmt_comment(spec.comment)
    out.append(f"define nodenum = {spec.nodenum if spec.nodenum is not None else len(spec.nodes)}")
    gamma = spec.gamma
    out += _defines(("chunksize", spec.chunksize, str, spec.chunksize is not None),
                    ("latency", spec.latency, _fmt_scalar_map, bool(spec.latency)),
                    ("vendor", spec.vendor, str, bool(spec.vendor)),
                    ("gpu", spec.gpu, str, bool(spec.gpu)),
                    ("gamma", gamma, _fmt_scalar_map if isinstance(gamma, dict) else format_number, gamma is not None))
    for name, node in zip(spec.node_names(), spec.nodes):
        out.append("")
        out.extend(_fmt_comment(node.comment))
        out.append(f"define {name} = {node.ngpus}")
        out += _defines(("vendor", node.vendor, str, bool(node.vendor)),
                        ("gpu", node.gpu, str, bool(node.gpu)),
                        ("gamma", node.gamma, format_number, node.gamma is not None),
                        ("bandwidth", node.bandwidth, _fmt_bwmap, node.bandwidth is not None),
                        ("latency", node.latency, _fmt_scalar_map, bool(node.latency)),
                        ("nic", node.nics, _fmt_list, bool(node.nics)),
                        ("pcie", node.pcie, _fmt_list, bool(node.pcie)))
    for inter in spec.internodes:
        out.append("")
        out.extend(_fmt_comment(inter.comment))
        pair = inter.pair if isinstance(inter.pair, str) else f"({inter.pair[0]}, {inter.pair[1]})"
        out.append(f"define internode = {pair}")
        bw = inter.bandwidth if isinstance(inter.bandwidth, str) else _fmt_bwmap(inter.bandwidth)
        out.append(f"define interbandwidth = {bw}")
        out += _defines(("latency", inter.latency, _fmt_scalar_map, bool(inter.latency)))
    return "\n".join(out) + "\n"


def _defines(*statements) -> list[str]:
    """``define KEY = VALUE`` for each ``(key, value, how it is written, whether it is written)``."""
    return [f"define {key} = {fmt(value)}" for key, value, fmt, present in statements if present]
