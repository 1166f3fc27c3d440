"""A picture of a cluster for ``hccc topo T --plot graph.png`` (matplotlib, Agg backend).

:func:`layout` computes a deterministic :class:`Scene` (plain data: where every node box, GPU, shared
device and line goes), and :func:`draw` renders it. The picture reads like a rack diagram:

* nodes are boxes in rows of at most four, titled with name, GPU count, model and vendor; GPUs are
  circles filled by vendor (NVIDIA green, AMD red) and labelled with their global rank;
* links that belong to no shared group are lines coloured by link class (direct, switch, internode,
  nic), one line per connected GPU pair, thicker for more bandwidth;
* shared groups are drawn as the **devices** they model: the two directions of a ``>->`` device
  (``a->b`` / ``b->a``) or a NIC (``egress`` / ``ingress``) are one device; devices with the same kind
  and the same GPUs (e.g. the per-GPU NVSwitch port groups of one node), and one-GPU devices of one
  node with the same kind and capacity (per-GPU switch ports or PCIe links), are one marker labelled
  ``n x capacity``. Intra-node devices are diamonds in a row under the node's GPUs, NICs are squares
  under the node box, joined to a network bus when the cluster has NIC-class links; devices spanning
  nodes sit between the rows. Thin spokes join every device to its GPUs.

Clusters with more than :data:`DETAIL_LIMIT` GPUs are drawn compactly: node boxes and aggregated
node-to-node lines only.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hccc.compiler.cluster.topology import LINK_CLASSES, Topology
from hccc.util.plural import plural

DETAIL_LIMIT = 256
NODES_PER_ROW = 4
NODES_PER_ROW_COMPACT = 8
MAX_NODE_LINES = 256
CLASS_COLOR = {"direct": "#1f77b4", "switch": "#ff7f0e", "internode": "#9467bd", "nic": "#2ca02c"}
DEVICE_COLOR = {"pcie": "#8c564b"}  # group kinds that are not link classes
VENDOR_COLOR = {"nvidia": "#76b900", "amd": "#ed1c24"}
NIC_KINDS = ("nic",)

_DIR_SUFFIX = re.compile(r"\s*(a->b|b->a|egress|ingress)\s*$")


@dataclass
class Box:
    node: int
    x: float
    y: float  # bottom-left corner
    w: float
    h: float
    title: str


@dataclass
class Device:
    kind: str
    label: str
    x: float
    y: float
    ranks: tuple[int, ...]
    groups: tuple[int, ...]
    capacity_gbps: float
    copies: int = 1  # merged devices with the same kind and GPUs
    place: str = "intra"  # intra | nic | cross


@dataclass
class Line:
    u: int
    v: int
    cls: str
    total_gbps: float
    both: bool  # links in both directions


@dataclass
class NodeLine:
    a: int
    b: int
    cls: str
    links: int


@dataclass
class Scene:
    title: str
    boxes: list[Box]
    gpu_xy: np.ndarray  # (nranks, 2), NaN in compact mode
    devices: list[Device] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    node_lines: list[NodeLine] = field(default_factory=list)
    bus: list[tuple[float, float, float, float]] = field(default_factory=list)  # segments x0,y0,x1,y1
    bus_y: dict[int, float] = field(default_factory=dict)  # row -> y of the bus
    compact: bool = False
    width: float = 0.0
    height: float = 0.0


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if abs(x - round(x)) > 1e-9 else str(int(round(x)))


def _size(b: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def _device_ranks(topo: Topology, g) -> tuple[int, ...]:
    m = g.members
    if g.direction == "egress":
        r = topo.link_src[m]
    elif g.direction == "ingress":
        r = topo.link_dst[m]
    else:
        r = np.concatenate([topo.link_src[m], topo.link_dst[m]])
    return tuple(int(x) for x in np.unique(r))


def _collect_devices(topo: Topology) -> list[Device]:
    """Shared groups -> devices: both directions of one device together, identical devices merged."""
    by_key: dict[tuple, Device] = {}
    order: list[tuple] = []
    for g in topo.groups:
        base = _DIR_SUFFIX.sub("", g.label) or g.label
        key = (g.kind, base)
        ranks = _device_ranks(topo, g)
        cap = float(g.bandwidth_gbps * g.lanes)
        if key in by_key:
            d = by_key[key]
            d.ranks = tuple(sorted(set(d.ranks) | set(ranks)))
            d.groups = d.groups + (g.id,)
            d.capacity_gbps = max(d.capacity_gbps, cap)
        else:
            by_key[key] = Device(g.kind, base, 0.0, 0.0, ranks, (g.id,), cap)
            order.append(key)
    merged: dict[tuple, Device] = {}
    out: list[Device] = []
    for key in order:
        d = by_key[key]
        mk = (d.kind, d.ranks, d.capacity_gbps)
        if mk in merged and d.kind not in NIC_KINDS:
            merged[mk].copies += 1
            merged[mk].groups += d.groups
            continue
        merged[mk] = d
        out.append(d)
    # per-GPU ports of one fabric (TACCL's switch ports, one PCIe link per GPU): one hub per node,
    # kind and capacity, drawn with a spoke to each of its GPUs
    ports: dict[tuple, Device] = {}
    final: list[Device] = []
    for d in out:
        if len(d.ranks) == 1 and d.kind not in NIC_KINDS:
            key = (d.kind, int(topo.rank_node[d.ranks[0]]), d.capacity_gbps)
            if key in ports:
                hub = ports[key]
                hub.ranks = tuple(sorted(set(hub.ranks) | set(d.ranks)))
                hub.groups += d.groups
                hub.copies += d.copies
                continue
            ports[key] = d
        final.append(d)
    return final


def _spread(xs: list[float], lo: float, hi: float, gap: float) -> list[float]:
    """Positions near ``xs`` (kept in their order), at least ``gap`` apart, inside [lo, hi] if possible."""
    if not xs:
        return []
    order = sorted(range(len(xs)), key=lambda i: (xs[i], i))
    pos = [0.0] * len(xs)
    cur = -math.inf
    for i in order:
        cur = max(xs[i], cur + gap)
        pos[i] = cur
    span_hi = max(pos)
    if span_hi > hi:
        shift = min(span_hi - hi, min(pos) - lo) if min(pos) > lo else 0.0
        pos = [p - shift for p in pos]
    return pos


def layout(topo: Topology) -> Scene:
    """Deterministic placement of everything :func:`draw` renders (units: one GPU pitch)."""
    compact = topo.nranks > DETAIL_LIMIT
    devices = [] if compact else _collect_devices(topo)
    intra, nics, cross = _sort_devices(topo, devices)
    has_bus = bool(nics) or bool(np.any(topo.link_class == LINK_CLASSES.index("nic")))
    dims = _box_dims(topo, compact, intra, nics)
    rows = _place_boxes(topo, dims, compact, 2.2 if (has_bus or cross) else 1.2, has_bus)
    _place_devices(rows, dims, intra, nics, cross, topo.rank_node, has_bus)
    bus = []
    if has_bus:    # one horizontal segment per row, joined by a vertical trunk on the left
        for row, y in rows.bus_y.items():
            bus.append((-0.6, y, rows.max_w + 0.3, y))
        if rows.nrows > 1:
            bus.append((-0.6, rows.bus_y[0], -0.6, rows.bus_y[rows.nrows - 1]))
    lines: list[Line] = []
    node_lines: list[NodeLine] = []
    if compact:
        node_lines = _node_lines(topo)
    else:
        lines = _gpu_lines(topo, _drawn_links(topo, devices))
    boxes = rows.boxes
    lowest = min([b.y for b in boxes] + [y - 0.5 for y in rows.bus_y.values()] if has_bus else [b.y for b in boxes])
    lowest = min([lowest] + [d.y - 0.6 for d in devices])
    height = -lowest + 0.3
    return Scene(_title(topo), boxes, rows.gpu_xy, devices, lines, node_lines, bus, rows.bus_y, compact,
                 rows.max_w + 1.2, height)


def _title(topo: Topology) -> str:
    tau = "" if topo.tau_ref is None else f", tau_ref = {topo.tau_ref * 1e6:.2f} us"
    return (f"{topo.name}: {plural(len(topo.nodes), 'node')}, {plural(topo.nranks, 'GPU')}, "
            f"{plural(topo.nlinks, 'link')}, {plural(len(topo.groups), 'shared group')}"
            f" (chunk {_size(topo.chunk_size)}{tau})")


def _sort_devices(topo: Topology, devices: list[Device]):
    """Devices by where they go: inside one node (per node), a node's NICs (per node), across nodes."""
    intra: dict[int, list[Device]] = {}
    nics: dict[int, list[Device]] = {}
    cross: list[Device] = []
    for d in devices:
        owners = {int(topo.rank_node[r]) for r in d.ranks}
        if len(owners) == 1:
            (o,) = owners
            if d.kind in NIC_KINDS:
                d.place = "nic"
                nics.setdefault(o, []).append(d)
            else:
                intra.setdefault(o, []).append(d)
        else:
            d.place = "cross"
            cross.append(d)
    return intra, nics, cross


def _box_dims(topo: Topology, compact: bool, intra: dict, nics: dict) -> list[tuple[float, float, int, int]]:
    """(width, height, GPU columns, GPU rows) of each node's box."""
    dims = []
    for nd in topo.nodes:
        if compact:
            dims.append((3.0, 1.6, 0, 0))
            continue
        cols = min(nd.ngpus, 4) if nd.ngpus <= 8 else int(math.ceil(math.sqrt(nd.ngpus)))
        rows = int(math.ceil(nd.ngpus / cols))
        ndev = len(intra.get(nd.index, []))
        nnic = len(nics.get(nd.index, []))
        w = max(cols * 1.0 + 0.6, 0.9 * max(ndev, 1) + 0.6, 1.0 * nnic + 0.6, 3.0)
        h = rows * 1.0 + (0.9 if ndev else 0.0) + 0.9
        dims.append((w, h, cols, rows))
    return dims


@dataclass
class _Rows:
    """Node boxes in rows, their GPUs' positions and the y of each row's network bus."""

    boxes: list[Box]
    gpu_xy: np.ndarray
    row_of: dict[int, int]
    bus_y: dict[int, float]
    max_w: float
    nrows: int


def _place_boxes(topo: Topology, dims: list, compact: bool, row_gap: float, has_bus: bool) -> _Rows:
    nodes = topo.nodes
    gap_x = 1.4
    per_row = NODES_PER_ROW_COMPACT if compact else NODES_PER_ROW
    out = _Rows([], np.full((topo.nranks, 2), np.nan), {}, {}, 0.0, int(math.ceil(len(nodes) / per_row)))
    y_top = 0.0
    for row in range(out.nrows):
        members = list(range(row * per_row, min(len(nodes), (row + 1) * per_row)))
        rh = max(dims[i][1] for i in members)
        x = 0.0
        for i in members:
            w, h, cols, rows = dims[i]
            nd = nodes[i]
            what = f"{nd.ngpus} x {nd.model}" if nd.model else f"{nd.ngpus} GPU{'s' if nd.ngpus > 1 else ''}"
            out.boxes.append(Box(i, x, y_top - h, w, h, f"{nd.name}: {what} ({nd.vendor})"))
            out.row_of[i] = row
            if not compact:
                gx0 = x + (w - cols * 1.0) / 2 + 0.5
                for k in range(nd.ngpus):
                    out.gpu_xy[nd.offset + k] = (gx0 + (k % cols), y_top - 0.9 - 0.5 - (k // cols))
            x += w + gap_x
        out.max_w = max(out.max_w, x - gap_x)
        out.bus_y[row] = y_top - rh - (1.3 if has_bus else 0.6)
        y_top -= rh + row_gap
    return out


def _place_devices(rows: _Rows, dims: list, intra: dict, nics: dict, cross: list[Device], rank_node: np.ndarray,
                   has_bus: bool) -> None:
    """Intra-node devices in a row under the GPUs, NICs just under each box, devices across nodes
    between the rows above the bus; each near the mean x of its GPUs."""
    gpu_xy = rows.gpu_xy
    for b in rows.boxes:
        devs = intra.get(b.node, [])
        if not devs:
            continue
        y = b.y + b.h - 0.9 - dims[b.node][3] * 1.0 - 0.35
        xs = [float(np.mean(gpu_xy[list(d.ranks), 0])) for d in devs]
        for d, px in zip(devs, _spread(xs, b.x + 0.45, b.x + b.w - 0.45, 0.85)):
            d.x, d.y = px, y
    for b in rows.boxes:
        devs = nics.get(b.node, [])
        xs = [float(np.mean(gpu_xy[list(d.ranks), 0])) for d in devs]
        for d, px in zip(devs, _spread(xs, b.x + 0.3, b.x + b.w - 0.3, 1.0)):
            d.x, d.y = px, b.y - 0.55
    xs = [float(np.mean(gpu_xy[list(d.ranks), 0])) for d in cross]
    for d, px in zip(cross, _spread(xs, 0.0, max(rows.max_w, 1.0), 1.2)):
        first_row = min(rows.row_of[int(rank_node[r])] for r in d.ranks)
        d.x, d.y = px, rows.bus_y[first_row] + (0.55 if has_bus else 0.0)


def _drawn_links(topo: Topology, devices: list[Device]) -> np.ndarray:
    """Links that need no line of their own because a drawn device stands for them: a NIC (with the
    bus), or a device whose GPUs include both ends (a PCIe uplink of one GPU does not stand for its
    peer links)."""
    in_group = topo.link_class == LINK_CLASSES.index("nic")
    for d in devices:
        for gid in d.groups:
            m = topo.groups[gid].members
            if d.kind in NIC_KINDS:
                in_group[m] = True
            else:
                inside = np.zeros(topo.nranks, dtype=bool)
                inside[list(d.ranks)] = True
                in_group[m[inside[topo.link_src[m]] & inside[topo.link_dst[m]]]] = True
    return in_group


def _node_lines(topo: Topology) -> list[NodeLine]:
    """Compact drawings: one line per node pair and link class (none where there would be too many)."""
    rank_node = topo.rank_node
    cross_link = rank_node[topo.link_src] != rank_node[topo.link_dst]
    pairs: dict[tuple[int, int, str], int] = {}
    for i in np.flatnonzero(cross_link & (topo.link_class != LINK_CLASSES.index("nic"))).tolist():
        a, b = int(rank_node[topo.link_src[i]]), int(rank_node[topo.link_dst[i]])
        key = (min(a, b), max(a, b), LINK_CLASSES[int(topo.link_class[i])])
        pairs[key] = pairs.get(key, 0) + 1
    node_lines = [NodeLine(a, b, c, k) for (a, b, c), k in sorted(pairs.items())]
    if len(node_lines) > MAX_NODE_LINES:  # an all-to-all mesh of lines says nothing: leave it out
        return []
    return node_lines


def _gpu_lines(topo: Topology, in_group: np.ndarray) -> list[Line]:
    """One line per connected GPU pair and class among the links no device stands for."""
    seen: dict[tuple[int, int, str], Line] = {}
    for i in np.flatnonzero(~in_group).tolist():
        u, v = int(topo.link_src[i]), int(topo.link_dst[i])
        cls = LINK_CLASSES[int(topo.link_class[i])]
        key = (min(u, v), max(u, v), cls)
        tot = float(topo.link_bandwidth[i] * topo.link_lanes[i]) / 1e9
        if key in seen:
            ln = seen[key]
            ln.both = ln.both or (u, v) != (ln.u, ln.v)
            ln.total_gbps = max(ln.total_gbps, tot)
        else:
            seen[key] = Line(u, v, cls, tot, False)
    return [seen[k] for k in sorted(seen)]


def draw(topo: Topology, path: str | Path, scene: Scene | None = None) -> Path:
    """Render ``topo`` to a PNG at ``path`` (byte-identical for the same input and matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = scene or layout(topo)
    x0, x1 = -1.2, max(sc.width, 4.0)
    y0, y1 = -sc.height, 0.4
    scale = 0.9  # inches per GPU pitch; capped so huge clusters still give a sane image
    scale = min(scale, 60.0 / (x1 - x0), 60.0 / (y1 - y0))
    fig = plt.figure(figsize=((x1 - x0) * scale, (y1 - y0) * scale), dpi=100)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    ax.axis("off")
    _draw_boxes(ax, topo, sc)
    _draw_lines(ax, topo, sc)
    _draw_bus(ax, sc)
    _draw_devices(ax, sc)
    if not sc.compact:
        _draw_gpus(ax, topo, sc)
    ax.legend(handles=_legend(topo, sc), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=_FONT, frameon=False)
    ax.set_title(sc.title, fontsize=_FONT + 2)
    from hccc.compiler.backend.output_dir import save_figure
    try:
        return save_figure(fig, path, format="png", bbox_inches="tight", metadata={"Software": None})
    finally:
        plt.close(fig)


#: the font size of labels (points); titles are larger, small labels smaller
_FONT = 8


def _draw_boxes(ax, topo: Topology, sc: Scene) -> None:
    from matplotlib.patches import FancyBboxPatch

    for b in sc.boxes:
        nd = topo.nodes[b.node]
        ax.add_patch(FancyBboxPatch((b.x, b.y), b.w, b.h, boxstyle="round,pad=0.02,rounding_size=0.2",
                                    fc="#f4f4f4", ec=VENDOR_COLOR.get(nd.vendor, "#555555") if sc.compact else "#555555",
                                    lw=2.0 if sc.compact else 1.2, zorder=0))
        ax.text(b.x + b.w / 2, b.y + b.h - 0.3, b.title, ha="center", va="center", fontsize=_FONT, zorder=5,
                fontweight="bold")
        if sc.compact:
            ax.text(b.x + b.w / 2, b.y + b.h / 2 - 0.2, f"ranks {nd.offset}-{nd.offset + nd.ngpus - 1}",
                    ha="center", va="center", fontsize=_FONT - 1, color=VENDOR_COLOR.get(nd.vendor, "k"))


def _draw_lines(ax, topo: Topology, sc: Scene) -> None:
    """GPU-to-GPU lines (thicker for more bandwidth), or in compact drawings node-to-node lines."""
    bws = [ln.total_gbps for ln in sc.lines]
    lo, hi = (min(bws), max(bws)) if bws else (1.0, 1.0)

    def width(bw: float) -> float:
        if hi <= lo:
            return 2.0
        return 1.0 + 2.5 * (math.log(bw) - math.log(lo)) / (math.log(hi) - math.log(lo))

    for ln in sc.lines:
        (x0, y0), (x1, y1) = sc.gpu_xy[ln.u], sc.gpu_xy[ln.v]
        dist = abs(x0 - x1)
        curved = topo.rank_node[ln.u] == topo.rank_node[ln.v] and abs(y0 - y1) < 1e-9 and dist > 1.5
        # skip-one arcs bow one way, longer ones the other, so a row's full mesh stays legible
        rad = (0.35 if int(round(dist)) % 2 == 0 else -0.25) * (1 if x1 > x0 else -1)
        style = f"arc3,rad={rad}" if curved else "arc3"
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                    arrowprops=dict(arrowstyle="<|-|>" if ln.both else "-|>", color=CLASS_COLOR[ln.cls],
                                    lw=width(ln.total_gbps), shrinkA=9, shrinkB=9, connectionstyle=style,
                                    mutation_scale=8))
    centre = {b.node: (b.x + b.w / 2, b.y + b.h / 2) for b in sc.boxes}
    for nl in sc.node_lines:
        (x0, y0), (x1, y1) = centre[nl.a], centre[nl.b]
        ax.plot([x0, x1], [y0, y1], color=CLASS_COLOR[nl.cls], lw=1.5, zorder=0.5, alpha=0.6)
    if sc.compact and sc.bus_y:  # each node reaches the network through its NICs
        for b in sc.boxes:
            row_y = max((y for y in sc.bus_y.values() if y < b.y), default=None)
            if row_y is not None:
                ax.plot([b.x + b.w / 2] * 2, [b.y, row_y], color=CLASS_COLOR["nic"], lw=1.5, zorder=0.5)


def _draw_bus(ax, sc: Scene) -> None:
    for x0, y0, x1, y1 in sc.bus:
        ax.plot([x0, x1], [y0, y1], color=CLASS_COLOR["nic"], lw=4, solid_capstyle="round", zorder=0.5)
    if sc.bus:
        x0, y0 = sc.bus[0][0], sc.bus[0][1]
        ax.text(x0, y0 - 0.3, "network (nic links)", fontsize=_FONT - 1, color=CLASS_COLOR["nic"], va="top")


def _draw_devices(ax, sc: Scene) -> None:
    """Each device: spokes to its GPUs, its marker, its capacity, and a NIC's drop to the bus."""
    for d in sc.devices:
        color = CLASS_COLOR.get(d.kind) or DEVICE_COLOR.get(d.kind, "#7f7f7f")
        for r in d.ranks:
            gx, gy = sc.gpu_xy[r]
            ax.plot([d.x, gx], [d.y, gy], color=color, lw=0.7, ls=(0, (3, 2)) if d.place == "cross" else "-",
                    alpha=0.55, zorder=1.5)
        marker = "s" if d.place == "nic" else "D"
        ax.plot([d.x], [d.y], marker=marker, ms=9 if d.place == "nic" else 10, mfc="white", mec=color, mew=2,
                zorder=4)
        cap = _fmt(d.capacity_gbps)
        text = f"{d.copies} x {cap}" if d.copies > 1 else cap
        dy = -0.32
        ax.text(d.x, d.y + dy, f"{text} GB/s", ha="center", va="top", fontsize=_FONT - 2, color=color, zorder=5)
        if d.place == "nic" and sc.bus_y:
            row_y = min((y for y in sc.bus_y.values() if y < d.y), default=None, key=lambda y: d.y - y)
            if row_y is not None:
                ax.plot([d.x, d.x], [d.y - 0.15, row_y], color=CLASS_COLOR["nic"], lw=1.5, zorder=1)


def _draw_gpus(ax, topo: Topology, sc: Scene) -> None:
    import matplotlib.pyplot as plt

    for nd in topo.nodes:
        for k in range(nd.ngpus):
            r = nd.offset + k
            x, y = sc.gpu_xy[r]
            ax.add_patch(plt.Circle((x, y), 0.3, fc=VENDOR_COLOR.get(nd.vendor, "#999999"), ec="#222222",
                                    lw=1.0, zorder=3))
            ax.text(x, y, str(r), ha="center", va="center", fontsize=_FONT - 1, color="white",
                    fontweight="bold", zorder=6)


def _legend(topo: Topology, sc: Scene) -> list:
    """One entry per link class, vendor and kind of device drawn."""
    from matplotlib.lines import Line2D

    used_cls = sorted({ln.cls for ln in sc.lines} | {nl.cls for nl in sc.node_lines}
                      | {d.kind for d in sc.devices if d.kind in CLASS_COLOR} | ({"nic"} if sc.bus else set()),
                      key=LINK_CLASSES.index)
    handles = [Line2D([], [], color=CLASS_COLOR[c], lw=2.5, label=f"{c} link") for c in used_cls]
    for v in sorted({nd.vendor for nd in topo.nodes}):
        if sc.compact:
            handles.append(Line2D([], [], marker="s", ls="", mfc="#f4f4f4", mec=VENDOR_COLOR.get(v, "#999999"),
                                  ms=9, mew=2, label=f"{v} node"))
        else:
            handles.append(Line2D([], [], marker="o", ls="", mfc=VENDOR_COLOR.get(v, "#999999"), mec="#222222",
                                  ms=9, label=f"{v} GPU (rank)"))
    if any(d.place != "nic" and d.kind not in DEVICE_COLOR for d in sc.devices):
        handles.append(Line2D([], [], marker="D", ls="", mfc="white", mec="#555555", mew=2, ms=8,
                              label="shared device (group capacity)"))
    for kind in sorted({d.kind for d in sc.devices if d.kind in DEVICE_COLOR}):
        handles.append(Line2D([], [], marker="D", ls="", mfc="white", mec=DEVICE_COLOR[kind], mew=2, ms=8,
                              label=f"{kind} switch"))
    if any(d.place == "nic" for d in sc.devices):
        handles.append(Line2D([], [], marker="s", ls="", mfc="white", mec=CLASS_COLOR["nic"], mew=2, ms=8,
                              label="NIC (egress/ingress capacity)"))
    return handles
