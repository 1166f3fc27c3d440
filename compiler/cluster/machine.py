"""What the topology importers learn about a machine, and how it becomes a ``.topo`` file.

The three importers (NCCL's topology dump, ``nvidia-smi topo -m``, NVML) each describe every node
as a :class:`MachineNode`: its GPUs, the NVLinks between them (direct, or to an NVSwitch fabric),
the PCIe paths of the pairs NVLink does not join, the PCIe switches whose uplinks GPUs share, and
the NICs each GPU uses. :func:`cluster_spec` turns a list of nodes into a
:class:`~hccc.compiler.cluster.topo_parser.ClusterSpec`, and :func:`write_topology` into ``.topo``
text that is parsed back before it is returned (what hccc writes, hccc reads).

How each part is written (see ``examples/clusters/README.md`` for the statements):

* direct NVLinks: ``direct`` links ``(a,b) -> (bw, n)`` both ways, ``n`` the links between the pair;
* an NVSwitch fabric: one ``((g),(others)) >-> (bw, ports)`` per GPU (its ports are shared by all its
  peers), ``ports`` the fewest NVLinks any GPU of the fabric has to it (a link is one set of
  parameters; a GPU with fewer links up is noted in the file's comments);
* GPU pairs with no NVLink path: ``switch`` links at the PCIe path's bandwidth (its slowest hop), and,
  where the node has no NVSwitch, ``define pcie`` with the PCIe switches GPUs share (their uplinks)
  and each GPU directly on a CPU root port (its own link);
* NICs: ``define nic`` with the GPUs that use each port; nodes of a cluster of several are joined by
  ``internode = all`` / ``interbandwidth = nic``, which needs every GPU to have a NIC.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from hccc.compiler.cluster.topo_format import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, SharedSpec,
                                               format_topology)
from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.cluster.topology import Topology
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.util.limits import printable

#: PCIe relations between two devices, nearest first (nvidia-smi's legend; NVML's topology levels)
PCIE_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
#: most per-pair links (one entry each, both directions of every GPU pair written out) one node may
#: need: half the 32,768 link entries the .topo parser reads, so that the lines they take (four
#: entries a line) stay within its 8,192-line limit next to the rest of the file. Checked before
#: the pairs are worked out: the work grows with the square of the GPUs
MAX_PAIR_LINKS = 16_384


def check_pair_links(source: str, ngpus: int, joined_pairs: int) -> None:
    """Refuse a node whose GPU pairs need more links than a .topo file holds, before any work on
    them. ``joined_pairs``: pairs an NVSwitch fabric joins (one entry per GPU covers them)."""
    pairs = ngpus * (ngpus - 1) // 2 - joined_pairs
    if 2 * pairs > MAX_PAIR_LINKS:
        raise CompileError([Diagnostic(
            f"{printable(source)}: {ngpus} GPUs with {pairs} pairs outside an NVSwitch fabric would need "
            f"{2 * pairs} links, over the {MAX_PAIR_LINKS} a cluster file holds per node", None)])


@dataclass
class Gpu:
    label: str                     # how the input names it: a PCI bus id, "GPU3"
    model: str | None = None       # a .topo name (link_speeds.model_name), or None
    sm: int | None = None          # compute capability, 80 for 8.0
    pcie_gbps: Fraction | None = None   # its own PCIe link, GB/s one direction


@dataclass
class Nic:
    name: str
    gbps: Fraction                 # one direction
    gpus: tuple[int, ...]          # local GPU ids that use it


@dataclass
class MachineNode:
    """One node: GPUs by local id (0..n-1) and how they are joined. Pairs are ``(a, b)`` with a < b."""

    source: str                                   # the input it came from (a file name, "NVML")
    gpus: list[Gpu]
    nvlink_gbps: Fraction | None = None           # per NVLink, one direction
    nvlinks: dict[tuple[int, int], int] = field(default_factory=dict)     # direct NVLinks per pair
    nvswitch: dict[int, int] = field(default_factory=dict)                # GPU -> NVLinks to the fabric
    pcie: dict[tuple[int, int], Fraction] = field(default_factory=dict)   # pairs without NVLink: GB/s
    pcie_groups: list[tuple[tuple[int, ...], Fraction, str]] = field(default_factory=list)  # GPUs, uplink, what
    nics: list[Nic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    describe: str = ""                            # one line: what the node is

    @property
    def ngpus(self) -> int:
        return len(self.gpus)

    def nvlink_joined(self, a: int, b: int) -> bool:
        pair = (min(a, b), max(a, b))
        return pair in self.nvlinks or (a in self.nvswitch and b in self.nvswitch)

    @property
    def fabric_ports(self) -> int:
        return min(self.nvswitch.values()) if self.nvswitch else 0

    @property
    def model(self) -> str | None:
        models = {g.model for g in self.gpus}
        return models.pop() if len(models) == 1 else None


def _link_list(node: MachineNode) -> dict[str, list]:
    direct = []
    for (a, b), n in sorted(node.nvlinks.items()):
        direct += [LinkSpec(a, b, node.nvlink_gbps, n), LinkSpec(b, a, node.nvlink_gbps, n)]
    switch: list = []
    if node.nvswitch:
        fabric = sorted(node.nvswitch)
        switch += [SharedSpec((g,), tuple(h for h in fabric if h != g), node.nvlink_gbps, node.fabric_ports)
                   for g in fabric]
    for (a, b), bw in sorted(node.pcie.items()):
        switch += [LinkSpec(a, b, bw, 1), LinkSpec(b, a, bw, 1)]
    out = {}
    if direct:
        out["direct"] = direct
    if switch:
        out["switch"] = switch
    return out


def node_comment(node: MachineNode) -> str:
    lines = [f"{node.source}: {node.describe}" if node.describe else node.source]
    lines += node.notes
    return "\n".join(printable(s, limit=300) for s in lines)


def cluster_spec(nodes: list[MachineNode], title: str) -> ClusterSpec:
    """The cluster of ``nodes`` (definition order = rank order). Several nodes need a NIC for every
    GPU (:class:`CompileError` naming the node otherwise)."""
    specs = []
    for node in nodes:
        links = _link_list(node)
        pcie = None
        if node.pcie_groups and not node.nvswitch:
            pcie = [NicSpec(tuple(gpus), bw, 1) for gpus, bw, _ in node.pcie_groups]
        nics = [NicSpec(nic.gpus, nic.gbps, 1) for nic in node.nics if nic.gpus] or None
        specs.append(NodeSpec(node.ngpus, links or None, vendor="nvidia", gpu=node.model, nics=nics, pcie=pcie,
                              comment=node_comment(node)))
    internodes = []
    if len(nodes) > 1:
        for node in nodes:
            covered = {g for nic in node.nics for g in nic.gpus}
            if len(covered) < node.ngpus:
                missing = sorted(set(range(node.ngpus)) - covered)
                raise CompileError([Diagnostic(
                    f"{printable(node.source)}: GPU {missing[0]} has no NIC, and the nodes of a cluster are "
                    "joined through their GPUs' NICs (import a dump that lists the node's network devices, or "
                    "import this node alone)", None)])
        internodes.append(InternodeSpec("all", "nic", comment="every pair of nodes talks through the NICs of its GPUs"))
    return ClusterSpec(specs, internodes, comment=title)


def write_topology(nodes: list[MachineNode], title: str, name: str = "<imported>") -> tuple[str, Topology]:
    """The ``.topo`` text of ``nodes`` and the :class:`Topology` parsed back from it. A cluster the
    parser refuses (over its limits) is a CompileError about the inputs, not about text the user
    never saw."""
    text = format_topology(cluster_spec(nodes, title))
    try:
        topo = parse_topology(text, name)
    except CompileError as exc:
        msg = exc.diagnostics[0].message if exc.diagnostics else str(exc)
        raise CompileError([Diagnostic(f"the imported cluster cannot be written as a .topo file: {msg}", None)]) from None
    return text, topo


# ---------------------------------------------------------------------------------------------
# nodes from a relation matrix (nvidia-smi topo -m, NVML)
# ---------------------------------------------------------------------------------------------
def assign_nics(ngpus: int, nic_relation: list[list[str]], nic_names: list[str], nic_gbps: Fraction) -> list[Nic]:
    """Each GPU uses its nearest NIC (nearest PCIe relation; ties go to the NIC with the fewest GPUs
    so far, then the first): ``nic_relation[g][k]`` is GPU g's relation to NIC k."""
    users: list[list[int]] = [[] for _ in nic_names]
    if not nic_names:
        return []
    for g in range(ngpus):
        best = min(range(len(nic_names)), key=lambda k: (PCIE_RELATIONS.index(nic_relation[g][k]), len(users[k]), k))
        users[best].append(g)
    return [Nic(name, nic_gbps, tuple(u)) for name, u in zip(nic_names, users)]


def node_from_relations(source: str, gpus: list[Gpu], nv: list[list[int]], rel: list[list[str]],
                        switch_ports: dict[int, int] | None, nics: list[Nic], notes: list[str],
                        inter_socket: Fraction) -> MachineNode:
    """A node from pairwise facts: ``nv[a][b]`` NVLinks a GPU pair shows, ``rel[a][b]`` its PCIe
    relation (PIX .. SYS). ``switch_ports`` (GPU -> NVLinks to NVSwitches) where the input says so
    (NVML); else a GPU whose NVLink counts add up to more links than its model has is on an NVSwitch
    fabric with as many ports as its largest count (``nvidia-smi topo -m`` prints the fabric's links
    for every peer)."""
    from hccc.compiler.cluster.link_speeds import nvlink_gbps, nvlinks_per_gpu

    n = len(gpus)
    check_pair_links(source, n, 0 if switch_ports is None else len(switch_ports) * (len(switch_ports) - 1) // 2)
    node = MachineNode(source, gpus, notes=list(notes))
    sms = [g.sm for g in gpus if g.sm is not None]
    node.nvlink_gbps = nvlink_gbps(min(sms)) if sms else nvlink_gbps(80)
    if switch_ports is None:
        switch_ports = {}
        for a in range(n):
            counts = [nv[a][b] for b in range(n) if b != a]
            if sum(counts) > nvlinks_per_gpu(gpus[a].sm):
                switch_ports[a] = max(counts)
    node.nvswitch = {g: p for g, p in switch_ports.items() if p > 0}
    for a in range(n):
        for b in range(a + 1, n):
            if a in node.nvswitch and b in node.nvswitch:
                continue
            if nv[a][b] > 0:
                node.nvlinks[(a, b)] = nv[a][b]
    for a in range(n):
        for b in range(a + 1, n):
            if node.nvlink_joined(a, b):
                continue
            bws = [g.pcie_gbps for g in (gpus[a], gpus[b])]
            bw = min(bws)
            if rel[a][b] == "SYS":
                bw = min(bw, inter_socket)
            node.pcie[(a, b)] = bw
    # PCIe switches: GPUs joined by PIX/PXB share a switch whose uplink is a GPU link wide (the input
    # does not say more); a GPU alone is on a root port of its own
    import networkx as nx
    switched = nx.Graph()
    switched.add_nodes_from(range(n))
    switched.add_edges_from((a, b) for a in range(n) for b in range(a + 1, n) if rel[a][b] in ("PIX", "PXB"))
    for members in sorted(sorted(c) for c in nx.connected_components(switched)):
        bw = min(gpus[g].pcie_gbps for g in members)
        what = "PCIe switch" if len(members) > 1 else "root port"
        node.pcie_groups.append((tuple(members), bw, what))
    node.nics = nics
    return node
