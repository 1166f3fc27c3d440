"""Shared devices of a ``.topo`` file: NICs (``define nic``, and the links ``interbandwidth = nic``
makes through them) and PCIe switches (``define pcie``). Each device becomes an egress and an
ingress shared group over the links that leave and enter its GPUs through it."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from hccc.compiler.cluster.topo_format import format_ids
from hccc.compiler.cluster.topo_limits import MAX_LATENCY_US
from hccc.compiler.cluster.topo_links import DeclaredLinks
from hccc.compiler.cluster.topo_scopes import NodeScope, Scopes
from hccc.compiler.cluster.topology import CLASS_CODE, DEFAULT_ALPHA_US
from hccc.util.diagnostics import Location

#: one device: (its node, its index in the node, its GPUs, bandwidth per lane, lanes)
DeviceRow = tuple[NodeScope, int, tuple[int, ...], Fraction, int]


def device_table(links: DeclaredLinks, scopes: Scopes, offsets: dict[str, int], key: str, group_what: str,
                 device: str) -> tuple[np.ndarray, list[DeviceRow]]:
    """``define <key> = [((gpus...) -> (bw, lanes)), ...]`` of every node: the shared devices (NICs,
    PCIe switches) a GPU sits behind, at most one each. Returns (device index per rank, -1 for none;
    the devices' rows)."""
    v = links.v
    owner = np.full(links.b.nranks, -1, dtype=np.int64)
    rows: list[DeviceRow] = []
    for nd in scopes.nodes:
        if key not in nd.defs:
            continue
        lst = v.expect(nd.defs[key][1], "list", key)
        off = offsets[nd.name]
        for idx, e in enumerate(lst.children):
            if e.data != "link":
                raise v.err(e, f"a {key} entry is ((gpus...) -> (bandwidth, lanes))")
            ids_tree, spec_tree = e.children
            gpus = v.ids(ids_tree, nd.ngpus, nd.name, group_what)
            bw, lanes = v.spec(spec_tree)
            for g in gpus:
                if owner[off + g] >= 0:
                    other = rows[owner[off + g]]
                    raise v.err(ids_tree, f"GPU {g} of {nd.name} is already behind {device} {other[1]} "
                                          f"({format_ids(other[2])})")
                owner[off + g] = len(rows)
            rows.append((nd, idx, gpus, bw, lanes))
    return owner, rows


def device_groups(links: DeclaredLinks, kind: str, src_owner: np.ndarray, dst_owner: np.ndarray,
                  through: np.ndarray, rows: list[DeviceRow], alphas: list) -> None:
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
                links.group(kind, direction, f"{nd.name} {kind}{idx} {format_ids(gpus)} {direction}",
                            members, bw, lanes, alphas[k], nd.defs[kind][0])


def pcie_groups(links: DeclaredLinks, scopes: Scopes, offsets: dict[str, int], glat: dict[str, Fraction]) -> None:
    """``define pcie = [((gpus...) -> (bw, lanes)), ...]``: the GPUs behind one PCIe switch share its
    uplink. Each switch becomes an egress and an ingress group over every link that is not ``direct``
    (NVLink bypasses PCIe) and leaves / enters the switch's GPUs for a GPU outside them."""
    sw_of, rows = device_table(links, scopes, offsets, "pcie", "PCIe switch group", "PCIe switch")
    if not rows or not links.b.nlinks:
        return
    alphas = []
    for nd, *_ in rows:
        lat: dict[str, Fraction] = {}
        if "latency" in nd.defs:
            lat = links.v.scalar_map(nd.defs["latency"][0], nd.defs["latency"][1], ("direct", "switch"), "latency",
                                     nonneg=True, maximum=MAX_LATENCY_US)
        alphas.append(lat.get("switch", glat.get("switch", DEFAULT_ALPHA_US["switch"])))
    src, dst, cls = links.b.link_arrays()
    s_own, d_own = sw_of[src], sw_of[dst]
    device_groups(links, "pcie", s_own, d_own, (cls != CLASS_CODE["direct"]) & (s_own != d_own), rows, alphas)


class NicLinks:
    """The links ``interbandwidth = nic`` makes: every GPU of one node to every GPU of the other,
    at the slower of their two NICs. Link parameters are worked out once per pair of NIC kinds and
    each node's NICs once per node (``internode = all`` asks for every node once per other node)."""

    def __init__(self, links: DeclaredLinks, offsets: dict[str, int], nic_of: np.ndarray, rows: list[DeviceRow]):
        self.links = links
        self.offsets = offsets
        self.nic_of = nic_of                   # NIC index per rank, -1 for none
        self.rows = rows
        self._params: dict[tuple, int] = {}    # (NIC kind, NIC kind, alpha kind) -> parameter id
        self._kinds: dict[tuple, int] = {}     # (bw, lanes) of a NIC, or ("alpha", a) -> kind
        self._node_nics: dict[str, tuple] = {}

    def add(self, x: NodeScope, y: NodeScope, a: Fraction, at: Location) -> None:
        b = self.links.b
        ox, oy = self.offsets[x.name], self.offsets[y.name]
        ux, ki, ix = self._nics(x, ox, at)
        uy, kj, iy = self._nics(y, oy, at)
        ka = self._kinds.setdefault(("alpha", a), len(self._kinds))
        small = np.zeros((ux.size, uy.size), dtype=np.int64)
        for ii, i in enumerate(ux.tolist()):
            for jj, j in enumerate(uy.tolist()):
                key = (ki[ii], kj[jj], ka)
                pid = self._params.get(key)
                if pid is None:
                    bw = min(self.rows[i][3], self.rows[j][3])
                    lanes = min(self.rows[i][4], self.rows[j][4])
                    pid = self._params[key] = self.links.params("nic", bw, lanes, a, at)
                small[ii, jj] = pid
        pm = small[np.ix_(ix, iy)]
        src = np.repeat(np.arange(ox, ox + x.ngpus), y.ngpus)
        dst = np.tile(np.arange(oy, oy + y.ngpus), x.ngpus)
        self.links.note_origin(at, "nic")
        self.links.check_room(at, 2 * src.size)
        b.add_links(src, dst, pm.ravel(), mergeable=True)
        b.add_links(dst, src, pm.ravel(), mergeable=True)

    def _nics(self, nd: NodeScope, off: int, at: Location):
        """A node's distinct NICs, their parameter kinds and each GPU's index among them."""
        got = self._node_nics.get(nd.name)
        if got is None:
            arr = self.nic_of[off:off + nd.ngpus]
            missing = np.nonzero(arr < 0)[0]
            if missing.size:
                raise self.links.v.err(at, f"'interbandwidth = nic' needs a NIC for every GPU, but GPU "
                                           f"{int(missing[0])} of {nd.name} has none (add 'define nic = [...]' "
                                           f"after {nd.name})")
            u = np.unique(arr)
            k = [self._kinds.setdefault((self.rows[i][3], self.rows[i][4]), len(self._kinds)) for i in u.tolist()]
            got = self._node_nics[nd.name] = (u, k, np.searchsorted(u, arr))
        return got


def nic_devices(links: DeclaredLinks, scopes: Scopes, offsets: dict[str, int], glat: dict[str, Fraction],
                nic_pairs: list[tuple[NodeScope, NodeScope, Fraction, Location]]) -> None:
    """``define nic`` of every node, the links of the node pairs joined through NICs, and each NIC's
    egress/ingress group over every link that leaves/enters the node through it."""
    nic_of, rows = device_table(links, scopes, offsets, "nic", "NIC group", "NIC")
    nics = NicLinks(links, offsets, nic_of, rows)
    for x, y, a, at in nic_pairs:
        nics.add(x, y, a, at)
    if rows and links.b.nlinks:
        src, dst, cls = links.b.link_arrays()
        cross = (cls == CLASS_CODE["internode"]) | (cls == CLASS_CODE["nic"])
        nic_alpha = glat.get("nic", DEFAULT_ALPHA_US["nic"])
        device_groups(links, "nic", nic_of[src], nic_of[dst], cross, rows, [nic_alpha] * len(rows))
