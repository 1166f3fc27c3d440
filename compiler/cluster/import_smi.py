"""``nvidia-smi topo -m`` (its text, saved to a file) -> :class:`MachineNode`.

The matrix names how every pair of devices is joined::

            GPU0    GPU1    GPU2    GPU3    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV4     NV4     NV4     PXB     0-31            0               N/A
    ...
    NIC0    PXB     PXB     SYS     SYS      X

    Legend:
      X    = Self
      SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
      NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
      PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
      PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
      PIX  = Connection traversing at most a single PCIe bridge
      NV#  = Connection traversing a bonded set of # NVLinks

    NIC Legend:
      NIC0: mlx5_0

Older drivers write ``SOC`` for ``SYS`` and name NIC columns ``mlx5_0`` directly; a terminal's
underline escapes in the header are ignored. The matrix does not name the GPUs: lines of
``nvidia-smi -L`` in the same file (``GPU 0: NVIDIA A100-SXM4-80GB (UUID: ...)``) do, else
``--gpu MODEL`` says the model. From the model come the NVLink speed and the PCIe generation
(:mod:`~hccc.compiler.cluster.link_speeds`); without one the file's comments say what was assumed.
NIC speeds are not in the matrix either: ``nic_gbit`` (default
:data:`~hccc.compiler.cluster.link_speeds.DEFAULT_NIC_GBIT`).
"""
from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from hccc.compiler.cluster import link_speeds as speeds
from hccc.compiler.cluster.machine import PCIE_RELATIONS, Gpu, MachineNode, assign_nics, node_from_relations
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.util.limits import printable
from hccc.util.plural import plural

#: most lines a saved ``nvidia-smi topo -m`` may have (a 1,024-device matrix and its legends)
MAX_LINES = 10_000
#: most devices (GPU and NIC columns) of one matrix
MAX_DEVICES = 1024

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU = re.compile(r"GPU([0-9]{1,4})")
_NV = re.compile(r"NV([0-9]{1,4})")
_SMI_L = re.compile(r"\s*GPU ([0-9]{1,4}): (.+?)(?: \(UUID: [^)]*\))?\s*$")
_NIC_LEGEND = re.compile(r"\s*(NIC[0-9]{1,4}):\s*(\S+)\s*$")
_AFFINITY_WORDS = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
#: a CPU or NUMA affinity cell (a device cell never starts with a digit)
_AFFINITY = re.compile(r"[0-9][0-9,-]*|N/A")
_RELATION_ALIASES = {"SOC": "SYS", "CPU": "PHB"}


def _tokens(line: str) -> list[tuple[str, int]]:
    """Whitespace-separated tokens with their 1-based columns."""
    return [(m.group(0), m.start() + 1) for m in re.finditer(r"\S+", line)]


def read_smi_topo(src: SourceFile, gpu_model: str | None = None, nic_gbit: Fraction | int | None = None) -> MachineNode:
    """One node from the saved output of ``nvidia-smi topo -m`` (and, optionally, ``nvidia-smi -L``)."""
    lines = [_ANSI.sub("", ln).replace("\t", " ").replace("\ufeff", " ") for ln in src.text.splitlines()]
    if len(lines) > MAX_LINES:
        raise _err(src, MAX_LINES + 1, 1, f"more than {MAX_LINES} lines: not the output of nvidia-smi topo -m")
    header_at = _header_line(src, lines)
    columns = _columns(src, header_at, _tokens(lines[header_at]))
    gpu_cols = [k for k, c in enumerate(columns) if _GPU.fullmatch(c)]
    if [int(_GPU.fullmatch(columns[k]).group(1)) for k in gpu_cols] != list(range(len(gpu_cols))):
        raise _err(src, header_at + 1, 1, "the GPU columns are not GPU0, GPU1, ... in order")
    nic_cols = [k for k in range(len(columns)) if k not in gpu_cols]
    m = _Matrix(src, columns)
    names, nic_names = m.read_rows(lines, header_at)
    for c in (columns[k] for k in gpu_cols):
        if c not in m.rows:
            raise _err(src, header_at + 1, 1, f"the matrix has no row for {c}")
    n = len(gpu_cols)
    nv, rel = m.gpu_pairs(gpu_cols)
    notes: list[str] = []
    gpus, model = _gpus(n, names, gpu_model, nv, rel, notes)
    nic_labels = [nic_names.get(columns[k], columns[k]) for k in nic_cols]
    nic_rel = m.nic_relations(gpu_cols, nic_cols)
    gbit = Fraction(speeds.DEFAULT_NIC_GBIT if nic_gbit is None else nic_gbit)
    nics = assign_nics(n, nic_rel, nic_labels, gbit / 8)
    if nic_cols:
        notes.append(f"NIC speed not in the matrix: {gbit} Gbit/s per port ({'--nic-gbit' if nic_gbit else 'default'})")
    node = node_from_relations(Path(src.name).name, gpus, nv, rel, None, nics, notes, speeds.UNKNOWN_INTER_SOCKET_GBPS)
    fabric = (f"NVSwitch, {node.fabric_ports} NVLinks x {node.nvlink_gbps} GB/s per GPU" if node.nvswitch else
              f"{len(node.nvlinks)} NVLink pairs" if node.nvlinks else "no NVLink")
    used = [x for x in nics if x.gpus]
    if len(used) < len(nics):
        node.notes.append("NIC ports no GPU is nearest to, left out: "
                          + ", ".join(printable(x.name, limit=40) for x in nics if not x.gpus))
    node.describe = f"{n} x {model or 'GPU'}, {fabric}; {plural(len(used), 'NIC port')}"
    return node


def _err(src: SourceFile, line: int, col: int, msg: str) -> CompileError:
    return CompileError([Diagnostic(msg, Location(src, line, col))])


def _header_line(src: SourceFile, lines: list[str]) -> int:
    """The index of the matrix's header: the first line of columns starting ``GPU0``."""
    for i, ln in enumerate(lines):
        toks = [t for t, _ in _tokens(ln)]
        if toks and toks[0] == "GPU0" and (len(toks) == 1 or toks[1] != "X"):
            return i
    if src.text.lstrip().startswith("<"):
        raise _err(src, 1, 1, "this is XML, not the output of nvidia-smi topo -m (NCCL's topology dump is read by "
                              "--from-nccl)")
    raise _err(src, 1, 1, "no matrix header (a line of columns starting 'GPU0'): not the output of nvidia-smi topo -m")


def _columns(src: SourceFile, header_at: int, head: list[tuple[str, int]]) -> list[str]:
    """The device columns of the header, up to the affinity columns."""
    columns: list[str] = []
    for i, (word, _) in enumerate(head):
        if any(tuple(t for t, _ in head[i:i + len(words)]) == words for words in _AFFINITY_WORDS):
            break                      # the affinity columns close the device columns
        columns.append(word)
    if len(columns) > MAX_DEVICES:
        raise _err(src, header_at + 1, head[MAX_DEVICES][1], f"more than {MAX_DEVICES} devices in the matrix")
    if len(set(columns)) < len(columns):
        dup = next(c for k, c in enumerate(columns) if columns.index(c) != k)
        raise _err(src, header_at + 1, head[columns.index(dup, columns.index(dup) + 1)][1],
                   f"column {printable(dup)} appears twice")
    return columns


class _Matrix:
    """The matrix's rows (each with its line and cells, located) and what a cell says."""

    def __init__(self, src: SourceFile, columns: list[str]):
        self.src = src
        self.columns = columns
        self.rows: dict[str, tuple[int, list[tuple[str, int]]]] = {}

    def read_rows(self, lines: list[str], header_at: int) -> tuple[dict[int, str], dict[str, str]]:
        """Every row of the matrix; returns the GPU names of ``nvidia-smi -L`` lines and the NIC legend."""
        names: dict[int, str] = {}
        nic_names: dict[str, str] = {}
        for ln_no, ln in enumerate(lines):
            if ln_no == header_at:
                continue
            m = _SMI_L.match(ln)
            if m:
                names[int(m.group(1))] = m.group(2).strip()
                continue
            m = _NIC_LEGEND.match(ln)
            if m:
                nic_names[m.group(1)] = m.group(2)
                continue
            toks = _tokens(ln)
            if not toks or toks[0][0] not in self.columns or ln_no < header_at:
                continue
            self._row(ln_no, ln, toks)
        return names, nic_names

    def _row(self, ln_no: int, ln: str, toks: list[tuple[str, int]]) -> None:
        if toks[0][0] in self.rows:
            raise _err(self.src, ln_no + 1, toks[0][1], f"a second row for {printable(toks[0][0])}")
        cells = []
        for tok in toks[1:1 + len(self.columns)]:
            if _AFFINITY.fullmatch(tok[0]):     # the affinity columns came early: a short row
                break
            cells.append(tok)
        if len(cells) < len(self.columns):
            raise _err(self.src, ln_no + 1, len(ln) + 1, f"row {printable(toks[0][0])} has {len(cells)} of the "
                                                         f"{len(self.columns)} columns")
        self.rows[toks[0][0]] = (ln_no + 1, cells)

    def cell_err(self, row: str, k: int, msg: str) -> CompileError:
        line, cells = self.rows[row]
        return _err(self.src, line, cells[k][1], msg)

    def relation(self, row: str, k: int) -> tuple[str, int]:
        """(PIX..SYS or 'NV', NVLink count) of a cell."""
        line, cells = self.rows[row]
        text, col = cells[k]
        text = _RELATION_ALIASES.get(text, text)
        m = _NV.fullmatch(text)
        if m:
            return "NV", int(m.group(1))
        if text in PCIE_RELATIONS:
            return text, 0
        if text == "X" and row == self.columns[k]:
            return "X", 0
        raise _err(self.src, line, col, f"'{printable(text, limit=20)}' is not a link kind nvidia-smi writes "
                                        "between two devices (X on the diagonal, NV#, PIX, PXB, PHB, NODE, SYS)")

    def gpu_pairs(self, gpu_cols: list[int]) -> tuple[list[list[int]], list[list[str]]]:
        """NVLinks per GPU pair and the PCIe relation of every pair (the matrix must be symmetric)."""
        n = len(gpu_cols)
        nv = [[0] * n for _ in range(n)]
        rel = [["PIX"] * n for _ in range(n)]
        for a in range(n):
            for b in range(n):
                kind, count = self.relation(f"GPU{a}", gpu_cols[b])
                if (kind == "X") != (a == b):
                    raise self.cell_err(f"GPU{a}", gpu_cols[b], "X stands only on the diagonal (a GPU with itself)")
                if a == b:
                    continue
                back_kind, back = self.relation(f"GPU{b}", gpu_cols[a])
                if (kind, count) != (back_kind, back):
                    raise self.cell_err(f"GPU{a}", gpu_cols[b],
                                        f"GPU{a} -> GPU{b} is {kind if kind != 'NV' else f'NV{count}'} "
                                        f"but GPU{b} -> GPU{a} is {back_kind if back_kind != 'NV' else f'NV{back}'}: "
                                        "the matrix is not symmetric")
                nv[a][b] = count
                # NVLink pairs: the PCIe relation is not shown; a shared switch is not assumed
                rel[a][b] = kind if kind != "NV" else "PHB"
        return nv, rel

    def nic_relations(self, gpu_cols: list[int], nic_cols: list[int]) -> list[list[str]]:
        """The PCIe relation of every GPU to every NIC."""
        nic_rel = [[None] * len(nic_cols) for _ in range(len(gpu_cols))]
        for a in range(len(gpu_cols)):
            for j, k in enumerate(nic_cols):
                kind, _ = self.relation(f"GPU{a}", k)
                if kind not in PCIE_RELATIONS:
                    raise self.cell_err(f"GPU{a}", k, f"GPU{a} -> {printable(self.columns[k])} must be a PCIe "
                                                      "relation (PIX .. SYS)")
                nic_rel[a][j] = kind
        return nic_rel


def _gpus(n: int, names: dict[int, str], gpu_model: str | None, nv: list[list[int]], rel: list[list[str]],
          notes: list[str]) -> tuple[list[Gpu], str | None]:
    """The GPUs, their speeds from the model (``--gpu``, else ``nvidia-smi -L``), and what was assumed."""
    model_text = gpu_model or (names.get(0) if names else None)
    if names and len(set(names.values())) > 1:
        notes.append("GPU models differ (" + ", ".join(sorted(set(names.values()))) + "); the first one's speeds are used")
    sm = speeds.sm_of_model(model_text)
    gen = speeds.pcie_gen_of_model(model_text)
    if sm is None and any(nv[a][b] for a in range(n) for b in range(n)):
        notes.append(f"GPU model {'unknown' if not model_text else printable(model_text, limit=40) + ' not known'}: "
                     f"NVLink taken at {speeds.nvlink_gbps(80)} GB/s per link (NVLink 2-4; --gpu names the model)")
    if gen is None:
        gen = speeds.FALLBACK_PCIE_GEN
        notes.append(f"PCIe generation unknown: Gen{gen} x{speeds.DEFAULT_PCIE_WIDTH} assumed for every GPU")
    gpu_pcie = speeds.pcie_gbps(speeds.PCIE_GEN_RATE[gen], speeds.DEFAULT_PCIE_WIDTH)
    model = speeds.model_name(model_text) if model_text else None
    gpus = [Gpu(f"GPU{g}", model, sm, gpu_pcie) for g in range(n)]
    if any(rel[a][b] == "SYS" for a in range(n) for b in range(n)):
        notes.append(f"SYS pairs cross the CPU sockets' link, taken at {speeds.UNKNOWN_INTER_SOCKET_GBPS} GB/s")
    return gpus, model


def load_smi_topo(path, gpu_model: str | None = None, nic_gbit=None) -> MachineNode:
    return read_smi_topo(SourceFile.read(path), gpu_model, nic_gbit)
