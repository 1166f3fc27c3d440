"""This machine's GPUs through NVML (the ``pynvml`` module of nvidia-ml-py) -> :class:`MachineNode`.

What NVML is asked, per GPU: its name, compute capability, PCI bus id and PCIe link (the maximum
generation and width, not the current ones, which drop while a GPU idles); per NVLink: whether it
is up, the PCI bus id at its other end and what that device is (a GPU, an NVSwitch, a CPU); per GPU
pair: the nearest common PCIe ancestor (NVML's topology levels, the relations ``nvidia-smi topo
-m`` prints). NVML knows no NICs, so a detected node has none; NCCL's dump has them
(``hccc topo --from-nccl``).

:func:`detect` takes the NVML module as an argument, so that tests can hand it a stand-in.
"""
from __future__ import annotations

from hccc.compiler.cluster import link_speeds as speeds
from hccc.compiler.cluster.machine import Gpu, MachineNode, node_from_relations
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.util.limits import printable

#: NVML's topology levels (nvmlGpuTopologyLevel_t) as nvidia-smi names them
LEVEL_RELATION = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: NVML's NVLink remote device types (nvmlIntNvLinkDeviceType_t)
REMOTE_GPU, REMOTE_IBMNPU, REMOTE_SWITCH = 0, 1, 2
#: NVML_NVLINK_MAX_LINKS of NVML 12 (older modules have 12 or 18; the module's own constant wins)
DEFAULT_MAX_LINKS = 18


class DetectError(CompileError):
    """No NVML, no GPU, or NVML failing: one line, exit status 1."""

    def __init__(self, message: str):
        super().__init__([Diagnostic(message, None)])


def load_nvml():
    """The pynvml module, or a DetectError saying how to get it."""
    try:
        import pynvml
    except ImportError:
        raise DetectError("--detect needs NVML's Python bindings: pip install 'hccc[detect]' (nvidia-ml-py)") from None
    return pynvml


def _text(x) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _busid(x) -> tuple[int, ...] | None:
    """NVML writes 00000000:07:00.0 (8-digit domain); compare by numbers."""
    s = _text(x).strip().lower()
    try:
        dom, bus, rest = s.split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


def detect(nvml) -> MachineNode:
    """One node: this machine's GPUs as NVML reports them. Every failure is a DetectError."""
    err = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except err as exc:
        raise DetectError(f"NVML cannot start: {printable(str(exc), limit=120)} (no NVIDIA driver on this machine?)") from None
    except OSError as exc:
        raise DetectError(f"NVML cannot start: {printable(str(exc), limit=120)}") from None
    try:
        return _detect(nvml, err)
    except err as exc:
        raise DetectError(f"NVML failed: {printable(str(exc), limit=120)}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except err:
            pass


def _optional(fn, *args, err=Exception, default=None):
    try:
        return fn(*args)
    except err:
        return default


def _detect(nvml, err) -> MachineNode:
    n = int(nvml.nvmlDeviceGetCount())
    if n < 1:
        raise DetectError("NVML sees no GPU on this machine")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    notes: list[str] = []
    gpus, busids = _gpus(nvml, handles, err, notes)
    nv, ports = _nvlinks(nvml, handles, {b: i for i, b in enumerate(busids) if b is not None}, err, notes)
    rel = _pcie_relations(nvml, handles, err, notes)
    notes.append("NVML knows no NICs: this node has none (hccc topo --from-nccl reads them from NCCL's dump)")
    if len(ports) == 1:
        notes.append(f"GPU {next(iter(ports))} alone has NVLinks to an NVSwitch: left out")
        ports = {}
    node = node_from_relations("NVML", gpus, nv, rel, ports, [], notes, speeds.UNKNOWN_INTER_SOCKET_GBPS)
    if node.nvswitch and len(set(node.nvswitch.values())) > 1:
        node.notes.append("NVLinks to the NVSwitches per GPU: "
                          + ", ".join(f"GPU {g}: {p}" for g, p in sorted(node.nvswitch.items()))
                          + f"; the fabric is modelled at {node.fabric_ports} per GPU")
    fabric = (f"NVSwitch, {node.fabric_ports} NVLinks x {node.nvlink_gbps} GB/s per GPU" if node.nvswitch else
              f"{len(node.nvlinks)} NVLink pairs" if node.nvlinks else "no NVLink")
    node.describe = f"{n} x {node.model or 'GPU'}, {fabric}"
    return node


def detect_machine() -> MachineNode:
    """This machine through the installed pynvml."""
    return detect(load_nvml())


def detect_topology():
    """This machine as ``(.topo text, Topology)``, for callers that want the cluster itself (a
    backend choosing algorithms for the machine it runs on). Raises DetectError as detect() does."""
    from hccc.compiler.cluster.machine import write_topology
    return write_topology([detect_machine()], "detected by hccc through NVML", "detected.topo")


def _gpus(nvml, handles: list, err, notes: list[str]) -> tuple[list[Gpu], list]:
    """Every GPU (model, compute capability, PCIe link) and its PCI bus id."""
    gpus = []
    busids = []
    for i, h in enumerate(handles):
        name = _text(nvml.nvmlDeviceGetName(h))
        cc = _optional(nvml.nvmlDeviceGetCudaComputeCapability, h, err=err)
        sm = cc[0] * 10 + cc[1] if cc else speeds.sm_of_model(name)
        gen = _optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h, err=err)
        width = _optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, h, err=err)
        if gen not in speeds.PCIE_GEN_RATE:
            gen = speeds.pcie_gen_of_model(name) or speeds.FALLBACK_PCIE_GEN
            notes.append(f"GPU {i}: PCIe generation not reported, Gen{gen} assumed")
        if not width or not 1 <= int(width) <= 32:
            width = speeds.DEFAULT_PCIE_WIDTH
        bus = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
        busids.append(_busid(bus))
        gpus.append(Gpu(bus, speeds.model_name(name), sm, speeds.pcie_gbps(speeds.PCIE_GEN_RATE[gen], int(width))))
    return gpus, busids


def _nvlinks(nvml, handles: list, index: dict, err, notes: list[str]) -> tuple[list[list[int]], dict[int, int]]:
    """NVLinks per GPU pair (the fewer of the two ends' counts) and per GPU to an NVSwitch."""
    n = len(handles)
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS))
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    remote_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    nv = [[0] * n for _ in range(n)]
    ports: dict[int, int] = {}
    for a, h in enumerate(handles):
        for link in range(max_links):
            state = _optional(nvml.nvmlDeviceGetNvLinkState, h, link, err=err)
            if state is None:           # no such link (or no NVLink at all): NVML says NOT_SUPPORTED
                continue
            if state != enabled:
                continue
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link, err=err)
            rb = _busid(remote.busId) if remote is not None else None
            kind = _optional(remote_type, h, link, err=err) if remote_type is not None else None
            if rb in index and index[rb] != a and kind in (None, REMOTE_GPU):
                nv[a][index[rb]] += 1
            elif kind == REMOTE_SWITCH or (kind is None and rb not in index):
                ports[a] = ports.get(a, 0) + 1
            elif kind == REMOTE_IBMNPU:
                notes.append(f"GPU {a}: NVLink {link} to the CPU is not modelled")
    for a in range(n):
        for b in range(a + 1, n):
            if nv[a][b] != nv[b][a]:
                notes.append(f"GPUs {a} and {b} count {nv[a][b]} and {nv[b][a]} NVLinks to each other: the fewer taken")
                nv[a][b] = nv[b][a] = min(nv[a][b], nv[b][a])
    return nv, ports


def _pcie_relations(nvml, handles: list, err, notes: list[str]) -> list[list[str]]:
    """The PCIe relation (PIX .. SYS) of every GPU pair, SYS where NVML does not say."""
    n = len(handles)
    rel = [["PIX"] * n for _ in range(n)]
    unknown = 0
    for a in range(n):
        for b in range(a + 1, n):
            level = _optional(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b], err=err)
            if level is None:           # not reported (some virtual machines): the farthest assumed
                unknown += 1
            rel[a][b] = rel[b][a] = LEVEL_RELATION.get(int(level), "SYS") if level is not None else "SYS"
    if unknown:
        notes.append(f"NVML did not say the PCIe path of {unknown} GPU pairs: taken as SYS (across the sockets)")
    if any(rel[a][b] == "SYS" for a in range(n) for b in range(n)):
        notes.append(f"SYS pairs cross the CPU sockets' link, taken at {speeds.UNKNOWN_INTER_SOCKET_GBPS} GB/s")
    return rel
