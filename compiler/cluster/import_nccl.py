"""NCCL's topology dump (the XML ``NCCL_TOPO_DUMP_FILE`` writes) -> :class:`MachineNode`.

One dump describes the node of the rank that wrote it (``NCCL_TOPO_DUMP_FILE_RANK``, default rank
0); a cluster of several nodes is read from one dump per node, in rank order. What the dump says::

    <system version="1">
      <cpu numaid="0" affinity="..." arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
        <pci busid="0000:17:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">  a PCIe switch
          <pci busid="0000:19:00.0" class="0x030200" vendor="0x10de" device="0x2330" ...>      a GPU's PCIe function
            <gpu dev="0" sm="90" rank="0" gdr="1">
              <nvlink target="0000:05:00.0" count="4" tclass="0x068000"/>                      NVLinks to an NVSwitch
            </gpu>
          </pci>
          <pci busid="0000:1a:00.0" class="0x020700" ...><nic><net name="mlx5_0" speed="400000" .../></nic></pci>
        </pci>
      </cpu>
    </system>

How it is read:

* GPUs in the order of their ``rank`` (``dev`` where ranks are missing or repeated); the model from
  the PCI device id (:data:`~hccc.compiler.cluster.link_speeds.NVIDIA_DEVICE_IDS`), the NVLink speed
  from ``sm``;
* ``<nvlink>`` to another GPU of the dump: direct NVLinks; to ``tclass="0x068000"`` (an NVSwitch,
  also ``target="fffffff:ffff:ff"``, an NVSwitch a virtual machine cannot see, and a target without
  a class that is no GPU of the dump, as NCCL reads them): ports on the node's NVSwitch fabric
  (NCCL, too, joins every NVSwitch of a node into one); to a CPU
  (``0x068001``, POWER9) or a GPU outside the dump: noted and left out;
* GPU pairs without NVLink: their PCIe path, at its slowest hop (each ``<pci>`` states its link to
  its parent); a path between two ``<cpu>`` elements also crosses the sockets' link
  (:func:`~hccc.compiler.cluster.link_speeds.inter_socket_gbps`);
* PCIe switches: the topmost ``<pci>`` bridge under a CPU holds the GPUs below it, which share its
  uplink; a GPU directly under a CPU has its own root port;
* NICs: every ``<net>`` is a port of ``speed`` Mbit/s; each GPU uses its nearest port (a shared
  PCIe switch before the same CPU before another CPU, then fewer hops, then the port with the fewest
  GPUs so far, as NCCL spreads GPUs over NICs).

Reading is strict and safe: the stdlib expat parser with DOCTYPE and entity declarations refused
(no entity expansion, no external fetches), at most :data:`MAX_ELEMENTS` elements nested at most
:data:`MAX_DEPTH` deep, only the elements NCCL writes (an unknown one is refused where it stands:
a file that is not NCCL's topology is not read as one), and every error located ``FILE:LINE:COL``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from hccc.compiler.cluster import link_speeds as speeds
from hccc.compiler.cluster.machine import PCIE_RELATIONS, Gpu, MachineNode, Nic, check_pair_links
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.util import safe_xml
from hccc.util.limits import printable

#: most elements one dump may hold: a 72-GPU NVLink domain's fused dump has about 3,000
MAX_ELEMENTS = 100_000
#: deepest nesting accepted: system > cpu > a few PCIe switch levels > pci > gpu > nvlink (NCCL's
#: own reader stops at 1024; real dumps nest under 12)
MAX_DEPTH = 64
#: most GPUs one dump may describe (the .topo parser's limit per node)
MAX_GPUS = 1024
#: NCCL's PCI class codes (src/graph/topo.cc, kvDictPciClass)
CLASS_BRIDGE = "0x0604"
CLASS_NVSWITCH = "0x068000"
CLASS_CPU_NVLINK = "0x068001"
#: the NVLink target NCCL writes for an NVSwitch a virtual machine cannot see (src/graph/xml.cc)
NVSWITCH_HIDDEN = "fffffff:ffff:ff"

#: element -> the elements NCCL nests inside it (src/graph/xml.cc, its loaders)
CHILDREN: dict[str, tuple[str, ...]] = {
    "system": ("cpu",),
    "cpu": ("pci", "nic"),
    "pci": ("pci", "gpu", "nic", "pcilink"),
    "gpu": ("nvlink", "c2c"),
    "nic": ("net",),
    "net": (), "nvlink": (), "c2c": (), "pcilink": (),
}

_INT = re.compile(r"[0-9]{1,9}")
_HEX = re.compile(r"0x[0-9a-fA-F]{1,8}")
_BUSID = re.compile(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")
_SPEED = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


@dataclass
class El:
    tag: str
    attrs: dict
    line: int
    col: int
    parent: "El | None" = None
    children: list = field(default_factory=list)


def parse_xml(src: SourceFile) -> El:
    """The element tree of an NCCL topology dump; every refusal is a located CompileError."""
    body = src.text.lstrip("\ufeff \t\r\n")       # a byte-order mark an editor wrote, whitespace
    if body and not body.startswith("<"):
        raise CompileError([Diagnostic("not XML: NCCL's topology dump begins with <system> (the saved output of "
                                       "nvidia-smi topo -m is read by --from-smi)",
                                       src.location_at(len(src.text) - len(body)))])
    p = safe_xml.new_parser()
    stack: list[El] = []
    root: list[El] = []
    count = [0]
    data = src.text.encode("utf-8")

    def here():
        return safe_xml.position(p)

    def start(name, attrs):
        line, col = here()
        count[0] += 1
        if count[0] > MAX_ELEMENTS:
            raise safe_xml.XmlStop(f"more than {MAX_ELEMENTS} elements: not a topology dump NCCL writes", line, col)
        if len(stack) >= MAX_DEPTH:
            raise safe_xml.XmlStop(f"elements nested more than {MAX_DEPTH} deep", line, col)
        shown = printable(name, limit=40)
        if not stack:
            if root:
                raise safe_xml.XmlStop(f"a second top-level element <{shown}>", line, col)
            if name != "system":
                raise safe_xml.XmlStop(f"<{shown}> is not an NCCL topology dump (expected <system>, the root of the XML "
                            "NCCL_TOPO_DUMP_FILE writes)", line, col)
        else:
            allowed = CHILDREN[stack[-1].tag]
            if name == "xgmi":
                raise safe_xml.XmlStop("<xgmi> is RCCL's (AMD GPUs): only NCCL's dumps of NVIDIA GPUs are read", line, col)
            if name not in allowed:
                inside = ", ".join(f"<{a}>" for a in allowed) or "nothing"
                raise safe_xml.XmlStop(f"unexpected <{shown}> inside <{stack[-1].tag}> (NCCL's topology has {inside} there)",
                            line, col)
        el = El(name, dict(attrs), line, col, stack[-1] if stack else None)
        (stack[-1].children if stack else root).append(el)
        stack.append(el)

    def end(name):
        stack.pop()

    def text(data):
        if data.strip():
            line, col = here()
            raise safe_xml.XmlStop(f"unexpected text {printable(data.strip(), limit=20)!r} (NCCL's topology has only "
                        "elements and attributes)", line, col)

    def at_keyword(word: bytes):
        """Where the declaration that expat is reporting begins (it reports past its opening)."""
        off = data.rfind(word, 0, max(p.CurrentByteIndex, 0) + len(word))
        if off < 0:
            return here()
        line = data.count(b"\n", 0, off) + 1
        return line, len(data[data.rfind(b"\n", 0, off) + 1:off].decode("utf-8", "replace")) + 1

    try:
        safe_xml.parse(p, src, data, "a topology dump", start=start, end=end, text=text, declared_at=at_keyword,
                       doctype_note=" (no entities, no external references)")
    except RecursionError:       # not reachable under MAX_DEPTH; kept as a located refusal all the same
        raise CompileError([Diagnostic("elements nested too deep", Location(src, 1, 1))]) from None
    if not root:
        raise CompileError([Diagnostic("empty document: expected <system>, the root of NCCL's topology dump",
                                       Location(src, 1, 1))])
    return root[0]


class _Reader:
    def __init__(self, src: SourceFile):
        self.src = src

    def err(self, el: El, msg: str) -> CompileError:
        return CompileError([Diagnostic(msg, Location(self.src, el.line, el.col))])

    def attr(self, el: El, name: str, required: bool = True) -> str | None:
        v = el.attrs.get(name)
        if v is None and required:
            raise self.err(el, f"<{el.tag}> lacks the attribute {name}")
        return v

    def int_attr(self, el: El, name: str, required: bool = True, lo: int = 0, hi: int = 10**9) -> int | None:
        v = self.attr(el, name, required)
        if v is None:
            return None
        if not _INT.fullmatch(v.strip()) or not lo <= int(v) <= hi:
            raise self.err(el, f"{name}=\"{printable(v, limit=30)}\" is not an integer from {lo} to {hi}")
        return int(v)

    def busid(self, el: El, name: str) -> tuple[int, int, int, int]:
        v = self.attr(el, name)
        m = _BUSID.fullmatch(v.strip())
        if not m:
            raise self.err(el, f"{name}=\"{printable(v, limit=30)}\" is not a PCI bus id (DOMAIN:BUS:DEVICE.FUNCTION)")
        return tuple(int(x, 16) for x in m.groups())

    def hex_attr(self, el: El, name: str) -> int | None:
        v = el.attrs.get(name)
        if v is None or not _HEX.fullmatch(v.strip()):
            return None
        return int(v, 16)

    # -- PCIe ------------------------------------------------------------------------------------
    def link_gbps(self, el: El, notes: list[str]) -> Fraction:
        """The link of a <pci> element to its parent, GB/s one direction."""
        speed = el.attrs.get("link_speed")
        width = el.attrs.get("link_width")
        rate = None
        if speed is not None:
            m = _SPEED.match(speed)
            if m:
                value = m.group(1)
                rate = value[:-2] if value.endswith(".0") else value
                if rate not in speeds.PCIE_LANE_GBPS:
                    rate = None
        if rate is None:
            rate = speeds.PCIE_GEN_RATE[speeds.FALLBACK_PCIE_GEN]
            if speed is not None and "Unknown" not in speed:
                notes.append(f"line {el.line}: link_speed \"{printable(speed, limit=30)}\" read as "
                             f"{rate} GT/s (PCIe Gen{speeds.FALLBACK_PCIE_GEN})")
        lanes = speeds.DEFAULT_PCIE_WIDTH
        if width is not None and _INT.fullmatch(width.strip()) and 1 <= int(width) <= 32:
            lanes = int(width)
        return speeds.pcie_gbps(rate, lanes)


def _ancestors(el: El) -> list[El]:
    out = []
    while el is not None:
        out.append(el)
        el = el.parent
    return out


def _cpu_of(el: El) -> El | None:
    for a in _ancestors(el):
        if a.tag == "cpu":
            return a
    return None


def read_nccl_dump(src: SourceFile) -> MachineNode:
    """One node from the text of one NCCL topology dump."""
    root = parse_xml(src)
    r = _Reader(src)
    r.int_attr(root, "version", lo=0, hi=1000)
    notes: list[str] = []
    gpu_els, sms = _gpu_elements(r, root)
    node, local = _node(r, src, gpu_els, sms, notes)
    _nvlinks(r, node, gpu_els, local, notes)
    fabric_size = len(node.nvswitch)     # the pairs' count is checked before any path is worked out
    check_pair_links(node.source, len(node.gpus), fabric_size * (fabric_size - 1) // 2)
    paths = [_ancestors(g.parent) for g in gpu_els]
    speeds_of = _PathSpeeds(r, notes)
    _pcie_paths(r, node, gpu_els, paths, speeds_of, notes)
    _pcie_switches(node, gpu_els, paths, speeds_of)
    _nics(r, root, node, paths, notes)
    hosts = {el.attrs.get("host_hash") for el in root.children if el.attrs.get("host_hash")}
    if len(hosts) > 1:
        notes.append(f"CPUs of {len(hosts)} hosts (host_hash) in one dump, NCCL's view of an NVLink domain "
                     "across hosts: modelled as one node")
    node.notes = list(dict.fromkeys(notes))      # once each, in the order found
    fabric = (f"NVSwitch, {node.fabric_ports} NVLinks x {_n(node.nvlink_gbps)} GB/s per GPU" if node.nvswitch else
              f"{len(node.nvlinks)} NVLink pairs" if node.nvlinks else "no NVLink")
    nic_text = ", ".join(f"{n.name} {_n(n.gbps)} GB/s" for n in node.nics if n.gpus) or "no NIC"
    node.describe = f"{len(node.gpus)} x {node.model or 'GPU'} (sm {min(sms)}), {fabric}; {nic_text}"
    return node


def _gpu_elements(r: _Reader, root: El) -> tuple[list[El], list[int]]:
    """The ``<gpu>`` elements in rank order (``dev`` order where ranks are missing or repeated, else
    the file's), and the compute capability of each."""
    gpu_els = [el for el in _walk(root) if el.tag == "gpu"]
    if not gpu_els:
        raise r.err(root, "the dump lists no <gpu>: NCCL writes the GPUs of the ranks on its node")
    if len(gpu_els) > MAX_GPUS:
        raise r.err(gpu_els[MAX_GPUS], f"more than {MAX_GPUS} GPUs in one dump")
    for g in gpu_els:
        if g.parent.tag != "pci":
            raise r.err(g, "<gpu> outside a <pci> element: its PCI bus id is unknown")
    ranks = [r.int_attr(g, "rank", required=False) for g in gpu_els]
    devs = [r.int_attr(g, "dev", required=False) for g in gpu_els]
    sms = [r.int_attr(g, "sm", required=True, lo=10, hi=10_000) for g in gpu_els]
    for key in (ranks, devs):
        if None not in key and len(set(key)) == len(key):
            order = sorted(range(len(gpu_els)), key=lambda i: key[i])
            break
    else:
        order = list(range(len(gpu_els)))
    return [gpu_els[i] for i in order], [sms[i] for i in order]


def _node(r: _Reader, src: SourceFile, gpu_els: list[El], sms: list[int],
          notes: list[str]) -> tuple[MachineNode, dict[tuple, int]]:
    """The node and its GPUs (model from the PCI device id, PCIe link to the parent), and each
    GPU's local id by PCI bus id."""
    busids = [r.busid(g.parent, "busid") for g in gpu_els]
    local = {b: i for i, b in enumerate(busids)}
    if len(local) < len(busids):
        dup = next(i for i, b in enumerate(busids) if busids.index(b) != i)
        raise r.err(gpu_els[dup].parent, "two GPUs with one PCI bus id")
    gpus = []
    for g, sm in zip(gpu_els, sms):
        pci = g.parent
        device = r.hex_attr(pci, "device")
        vendor = r.hex_attr(pci, "vendor")
        if vendor is not None and vendor != 0x10DE:
            raise r.err(pci, f"a GPU of PCI vendor 0x{vendor:04x}: only NVIDIA GPUs (0x10de) are read from NCCL's dump")
        name = speeds.NVIDIA_DEVICE_IDS.get(device) if device is not None else None
        gpus.append(Gpu(pci.attrs["busid"], name, sm, r.link_gbps(pci, notes)))
    node = MachineNode(Path(src.name).name, gpus, notes=notes)
    node.nvlink_gbps = speeds.nvlink_gbps(min(sms))
    return node, local


def _nvlinks(r: _Reader, node: MachineNode, gpu_els: list[El], local: dict[tuple, int], notes: list[str]) -> None:
    """NVLinks as each GPU lists them: to another GPU of the dump (both ends' counts reconciled), to
    the node's NVSwitch fabric, or noted and left out."""
    listed: dict[tuple[int, int], int] = {}
    for a, g in enumerate(gpu_els):
        for link in g.children:
            _nvlink(r, node, a, link, local, listed, notes)
    for (a, b), n in listed.items():
        if a > b and (b, a) in listed:
            continue
        back = listed.get((b, a))
        pair = (min(a, b), max(a, b))
        if back is None:
            notes.append(f"GPU {a} lists {n} NVLinks to GPU {b}, GPU {b} none back: taken as {n} both ways")
            node.nvlinks[pair] = n
        else:
            if back != n:
                notes.append(f"GPUs {a} and {b} list {n} and {back} NVLinks to each other: the fewer taken")
            node.nvlinks[pair] = min(n, back)
    if node.nvswitch and len(set(node.nvswitch.values())) > 1:
        notes.append("NVLinks to the NVSwitches per GPU: "
                     + ", ".join(f"GPU {g}: {p}" for g, p in sorted(node.nvswitch.items()))
                     + f"; the fabric is modelled at {node.fabric_ports} per GPU")
    if len(node.nvswitch) == 1:     # one GPU on a fabric reaches nobody through it
        node.nvswitch.clear()


def _nvlink(r: _Reader, node: MachineNode, a: int, link: El, local: dict[tuple, int],
            listed: dict[tuple[int, int], int], notes: list[str]) -> None:
    """One ``<nvlink>`` (or ``<c2c>``) of GPU ``a``."""
    if link.tag == "c2c":
        notes.append(f"line {link.line}: GPU {a}'s C2C link to its CPU is not modelled")
        return
    text = r.attr(link, "target")
    m = _BUSID.fullmatch(text.strip())
    target = tuple(int(x, 16) for x in m.groups()) if m else None
    count = r.int_attr(link, "count", lo=1, hi=1024)
    tclass = (link.attrs.get("tclass") or "").strip().lower()
    if target is None and tclass != CLASS_NVSWITCH and text.strip().lower() != NVSWITCH_HIDDEN:
        raise r.err(link, f"target=\"{printable(text, limit=30)}\" is not a PCI bus id "
                          "(DOMAIN:BUS:DEVICE.FUNCTION)")
    if not tclass and target not in local:
        tclass = CLASS_NVSWITCH     # NCCL's rule: a remote end it cannot see is an NVSwitch
    if target in local and local[target] != a:
        b = local[target]
        listed[(a, b)] = listed.get((a, b), 0) + count
    elif tclass == CLASS_NVSWITCH:
        node.nvswitch[a] = node.nvswitch.get(a, 0) + count
    elif tclass == CLASS_CPU_NVLINK or tclass.startswith("0x0600"):
        notes.append(f"line {link.line}: GPU {a}'s {count} NVLinks to its CPU are not modelled")
    elif tclass.startswith("0x03"):
        notes.append(f"line {link.line}: GPU {a}'s {count} NVLinks to {link.attrs['target']} "
                     "(a GPU outside this dump) are left out")
    else:
        raise r.err(link, f"NVLink target {printable(link.attrs['target'], limit=30)} is not a GPU of this "
                          f"dump, and its tclass \"{printable(tclass, limit=20)}\" is not an NVSwitch "
                          f"({CLASS_NVSWITCH}) or a CPU ({CLASS_CPU_NVLINK})")


class _PathSpeeds:
    """The link of each ``<pci>`` element to its parent, read once (a note about it is made once)."""

    def __init__(self, r: _Reader, notes: list[str]):
        self.r, self.notes = r, notes
        self._gbps: dict[int, Fraction] = {}

    def __call__(self, el: El) -> Fraction:
        key = id(el)
        if key not in self._gbps:
            self._gbps[key] = self.r.link_gbps(el, self.notes)
        return self._gbps[key]


def _pcie_paths(r: _Reader, node: MachineNode, gpu_els: list[El], paths: list[list[El]], speed: _PathSpeeds,
                notes: list[str]) -> None:
    """The PCIe path of every pair NVLink does not join, at its slowest hop (and the CPU sockets'
    link where it crosses it)."""
    gpus = node.gpus
    socket_notes = set()
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            if node.nvlink_joined(a, b):
                continue
            pa, pb = paths[a], paths[b]
            ids_b = {id(x) for x in pb}
            common = next(x for x in pa if id(x) in ids_b)
            hops = [x for x in pa[:pa.index(common)] if x.tag == "pci"] + \
                   [x for x in pb[:[id(y) for y in pb].index(id(common))] if x.tag == "pci"]
            bw = min(speed(x) for x in hops) if hops else gpus[a].pcie_gbps
            if common.tag == "system":
                sock, what = _inter_socket(r, gpu_els[a])
                socket_notes.add(f"PCIe paths between the CPU sockets cross the {what} at {sock} GB/s")
                bw = min(bw, sock)
            node.pcie[(a, b)] = bw
    notes.extend(sorted(socket_notes))


def _inter_socket(r: _Reader, gpu_el: El) -> tuple[Fraction, str]:
    """The link between the CPU sockets, as the CPU above ``gpu_el`` names it."""
    cpu = _cpu_of(gpu_el)
    fam = r.int_attr(cpu, "familyid", required=False, hi=10**6) if cpu is not None else None
    mod = r.int_attr(cpu, "modelid", required=False, hi=10**6) if cpu is not None else None
    return speeds.inter_socket_gbps(cpu.attrs.get("vendor") if cpu else None,
                                    cpu.attrs.get("arch") if cpu else None, fam, mod)


def _pcie_switches(node: MachineNode, gpu_els: list[El], paths: list[list[El]], speed: _PathSpeeds) -> None:
    """The topmost bridge under a CPU holds the GPUs below it, which share its uplink; a GPU right
    under a CPU has its own root port."""
    groups: dict[int, list[int]] = {}
    top_of: dict[int, El] = {}
    for a, path in enumerate(paths):
        pcis = [x for x in path if x.tag == "pci"]
        top = pcis[-1]
        if top is gpu_els[a].parent or not (top.attrs.get("class") or "").lower().startswith(CLASS_BRIDGE):
            key = id(gpu_els[a].parent)
            top = gpu_els[a].parent
        else:
            key = id(top)
        top_of[key] = top
        groups.setdefault(key, []).append(a)
    for key, members in sorted(groups.items(), key=lambda kv: kv[1]):
        top = top_of[key]
        what = "PCIe switch" if len(members) > 1 or top is not gpu_els[members[0]].parent else "root port"
        node.pcie_groups.append((tuple(members), speed(top), what))


def _nics(r: _Reader, root: El, node: MachineNode, paths: list[list[El]], notes: list[str]) -> None:
    """Every ``<net>`` a NIC port; each GPU on its nearest (a shared PCIe switch before the same CPU
    before another CPU, then fewer hops, then the port with the fewest GPUs so far)."""
    nic_list: list[tuple[str, Fraction, El]] = []
    for net in (el for el in _walk(root) if el.tag == "net"):
        mbit = r.int_attr(net, "speed", lo=1, hi=10**8)
        name = printable(net.attrs.get("name") or f"net{len(nic_list)}", limit=40)
        nic_list.append((name, Fraction(mbit, 8000), net.parent.parent))   # <net> in <nic> in <pci>/<cpu>
    if not nic_list:
        return
    users: list[list[int]] = [[] for _ in nic_list]
    holder_paths = [_ancestors(holder) for _, _, holder in nic_list]
    for a, path in enumerate(paths):
        ids = [id(x) for x in path]

        def distance(k):
            hp = holder_paths[k]
            common = next((x for x in hp if id(x) in ids), None)
            i_a, i_n = ids.index(id(common)), [id(x) for x in hp].index(id(common))
            level = PCIE_RELATIONS.index("PXB") if common.tag == "pci" else \
                PCIE_RELATIONS.index("PHB") if common.tag == "cpu" else PCIE_RELATIONS.index("SYS")
            return level, i_a + i_n, len(users[k]), k

        users[min(range(len(nic_list)), key=distance)].append(a)
    node.nics = [Nic(name, gbps, tuple(u)) for (name, gbps, _), u in zip(nic_list, users)]
    unused = [name for (name, _, _), u in zip(nic_list, users) if not u]
    if unused:
        notes.append(f"NIC ports no GPU is nearest to, left out: {', '.join(unused)}")


def _n(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def _walk(el: El):
    stack = [el]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(e.children))


def load_nccl_dump(path) -> MachineNode:
    """Read one dump file (regular files within the input size cap, UTF-8)."""
    return read_nccl_dump(SourceFile.read(path))
