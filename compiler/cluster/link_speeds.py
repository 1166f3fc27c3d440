"""Link speeds the topology importers derive bandwidths from, each with the source of its figure.

Every figure is in GB/s (10^9 bytes/s) per direction, the unit of a ``.topo`` file, and is written as
a decimal string so that it reaches the file exactly (``Fraction("0.985")``).

* **NVLink**, per link, by the GPU's compute capability (NCCL's dump and NVML say ``sm``; a GPU name
  says its model, :func:`sm_of_model`). The figure per link is the vendor's bidirectional total per
  GPU, halved (one direction) and divided by the GPU's link count.
* **PCIe**, per lane, by the link's transfer rate (``16.0 GT/s PCIe`` in NCCL's dump; the generation
  in NVML): the data rate after line coding, one direction.
* **Between CPU sockets** (a PCIe path that crosses QPI/UPI/Infinity Fabric): the figures NCCL itself
  assumes for that hop.
* **NICs**: NCCL's dump says each port's speed in Mbit/s; ``nvidia-smi topo -m`` does not say it.
"""
from __future__ import annotations

import re
from fractions import Fraction

#: NVLink GB/s per link per direction, by compute capability (the newest entry at or below a GPU's
#: sm applies: sm 89 uses sm 86's, sm 103 sm 100's):
#: - 60 NVLink 1 (P100): 4 links, 160 GB/s bidirectional per GPU (NVIDIA Tesla P100 whitepaper)
#: - 70 NVLink 2 (V100): 6 links, 300 GB/s bidirectional (NVIDIA Tesla V100 GPU architecture whitepaper)
#: - 80 NVLink 3 (A100): 12 links, 600 GB/s bidirectional (NVIDIA A100 Tensor Core GPU architecture)
#: - 86 NVLink 3 bridge on GA102 (A40, RTX A6000): 4 links, 112.5 GB/s bidirectional (NVIDIA A40 data sheet)
#: - 90 NVLink 4 (H100, H200, H20): 18 links, 900 GB/s bidirectional (NVIDIA H100 Tensor Core GPU architecture)
#: - 100 NVLink 5 (B200): 18 links, 1.8 TB/s bidirectional (NVIDIA Blackwell architecture technical brief)
NVLINK_GBPS_BY_SM: dict[int, Fraction] = {
    60: Fraction("20"), 70: Fraction("25"), 80: Fraction("25"), 86: Fraction("14.0625"),
    90: Fraction("25"), 100: Fraction("50"),
}
#: NVLinks a GPU has, by compute capability (same sources as NVLINK_GBPS_BY_SM). A GPU whose NVLink
#: counts to its peers add up to more than this reaches them through NVSwitches (each peer then shows
#: the GPU's whole link count, ``NV12`` to every peer of a DGX A100 GPU)
NVLINKS_PER_GPU_BY_SM: dict[int, int] = {60: 4, 70: 6, 80: 12, 86: 4, 90: 18, 100: 18}
#: the link count assumed where the GPU's sm is unknown: the most any GPU has (NVLink 4 and 5)
MAX_NVLINKS_PER_GPU = 18

#: PCIe GB/s per lane per direction, by transfer rate in GT/s: PCI-SIG's base specifications,
#: data rate after line coding (8b/10b for 2.5 and 5 GT/s, 128b/130b for 8, 16 and 32 GT/s, FLIT mode
#: for 64 GT/s): Gen1 0.25, Gen2 0.5, Gen3 0.985, Gen4 1.969, Gen5 3.938, Gen6 7.563
PCIE_LANE_GBPS: dict[str, Fraction] = {
    "2.5": Fraction("0.25"), "5": Fraction("0.5"), "8": Fraction("0.985"), "16": Fraction("1.969"),
    "32": Fraction("3.938"), "64": Fraction("7.563"),
}
#: transfer rate in GT/s of each PCIe generation (what NVML reports as the link generation)
PCIE_GEN_RATE: dict[int, str] = {1: "2.5", 2: "5", 3: "8", 4: "16", 5: "32", 6: "64"}
#: lanes of a GPU's PCIe link where nothing says (every data-centre GPU's edge connector is x16;
#: NCCL assumes 16 as well when the width is unreadable)
DEFAULT_PCIE_WIDTH = 16
#: the PCIe generation assumed where neither the input nor the GPU model says it: Gen3, the rate NCCL
#: itself falls back to for an unreadable link speed (``kvDictPciGen``, src/graph/topo.cc)
FALLBACK_PCIE_GEN = 3

#: the PCIe generation of each GPU model's host interface (NVIDIA's data sheets); matched by
#: :func:`model_key`
PCIE_GEN_BY_MODEL: dict[str, int] = {
    "P100": 3, "V100": 3, "T4": 3, "A100": 4, "A800": 4, "A30": 4, "A40": 4, "A10": 4, "A6000": 4,
    "L40": 4, "L40S": 4, "L4": 4, "H100": 5, "H800": 5, "H200": 5, "H20": 5, "GH200": 5, "B200": 5,
    "B100": 5,
}
#: compute capability of each GPU model (NVIDIA's CUDA GPU list); matched by :func:`model_key`
SM_BY_MODEL: dict[str, int] = {
    "P100": 60, "V100": 70, "T4": 75, "A100": 80, "A800": 80, "A30": 80, "A40": 86, "A10": 86,
    "A6000": 86, "L40": 89, "L40S": 89, "L4": 89, "H100": 90, "H800": 90, "H200": 90, "H20": 90,
    "GH200": 90, "B200": 100, "B100": 100,
}

#: GB/s one direction between two CPU sockets: the figures NCCL itself assumes for that hop
#: (src/graph/topo.h: BDW_QPI_BW 6, SKL_QPI_BW 10, SRP_QPI_BW 22, ERP_QPI_BW 40, AMD_ZEN12_BW 16,
#: AMD_ZEN34_BW 24, AMD_ZEN5_BW 32, P9_BW 32, ARM_BW 6)
INTER_SOCKET_GBPS: dict[str, Fraction] = {
    "intel-broadwell": Fraction(6), "intel-skylake": Fraction(10), "intel-sapphire-rapids": Fraction(22),
    "intel-emerald-rapids": Fraction(40), "amd-zen1-2": Fraction(16), "amd-zen3-4": Fraction(24),
    "amd-zen5": Fraction(32), "power9": Fraction(32), "arm": Fraction(6),
}
#: the inter-socket figure where the CPU is not known (``nvidia-smi topo -m``'s SYS, NVML's
#: SYSTEM): NCCL's figure for Intel Skylake-class UPI, below every newer CPU's
UNKNOWN_INTER_SOCKET_GBPS = INTER_SOCKET_GBPS["intel-skylake"]
#: Intel x86 family 6 models from which each generation's figure applies, as NCCL's topology reads
#: the dump's modelid (src/graph/topo.cc): Skylake-SP 0x55, Sapphire Rapids 0x8F, Emerald Rapids 0xCF
INTEL_MODELS = ((0xCF, "intel-emerald-rapids"), (0x8F, "intel-sapphire-rapids"), (0x55, "intel-skylake"))
#: AMD x86 families (the dump's familyid): 0x17 Zen 1-2, 0x19 Zen 3-4, 0x1A Zen 5
AMD_FAMILIES = {0x17: "amd-zen1-2", 0x19: "amd-zen3-4", 0x1A: "amd-zen5"}
_CPU_NAMES = {"intel-skylake": "Skylake", "intel-sapphire-rapids": "Sapphire Rapids",
              "intel-emerald-rapids": "Emerald Rapids", "amd-zen1-2": "Zen 1-2", "amd-zen3-4": "Zen 3-4",
              "amd-zen5": "Zen 5"}

#: NIC port speed assumed where the input does not say it (``nvidia-smi topo -m``, NVML): 200 Gbit/s,
#: HDR InfiniBand, the ConnectX-6 of DGX A100 (NVIDIA DGX A100 user guide); ``--nic-gbit`` overrides
DEFAULT_NIC_GBIT = 200

#: NVIDIA PCI device ids (vendor 0x10de) of data-centre GPUs -> model, from the PCI ID repository
#: (pci-ids.ucw.cz); NCCL's dump names a GPU only by these
NVIDIA_DEVICE_IDS: dict[int, str] = {
    0x15F8: "P100-PCIE-16GB", 0x15F9: "P100-SXM2-16GB", 0x1DB1: "V100-SXM2-16GB", 0x1DB4: "V100-PCIE-16GB",
    0x1DB5: "V100-SXM2-32GB", 0x1DB6: "V100-PCIE-32GB", 0x1EB8: "T4", 0x20B0: "A100-SXM4-40GB",
    0x20B2: "A100-SXM4-80GB", 0x20B5: "A100-PCIE-80GB", 0x20F1: "A100-PCIE-40GB", 0x20B7: "A30",
    0x2235: "A40", 0x2236: "A10", 0x26B5: "L40", 0x26B9: "L40S", 0x27B8: "L4", 0x2330: "H100-SXM5-80GB",
    0x2331: "H100-PCIE-80GB", 0x2335: "H200-SXM-141GB",
}


def _floor_key(table: dict, sm: int):
    keys = sorted(table)
    below = [k for k in keys if k <= sm]
    return table[below[-1] if below else keys[0]]


def nvlink_gbps(sm: int) -> Fraction:
    """GB/s per NVLink per direction for a GPU of compute capability ``sm`` (e.g. 80)."""
    return _floor_key(NVLINK_GBPS_BY_SM, sm)


def nvlinks_per_gpu(sm: int | None) -> int:
    """How many NVLinks a GPU of compute capability ``sm`` has (the most any has where unknown)."""
    return MAX_NVLINKS_PER_GPU if sm is None else _floor_key(NVLINKS_PER_GPU_BY_SM, sm)


def pcie_gbps(rate: str, width: int) -> Fraction:
    """GB/s one direction of a PCIe link of ``width`` lanes at ``rate`` GT/s (a PCIE_LANE_GBPS key)."""
    return PCIE_LANE_GBPS[rate] * width


_MODEL_TOKEN = re.compile(r"[A-Z]+[0-9]+[A-Z]?")


def model_key(name: str | None) -> str | None:
    """The key of SM_BY_MODEL / PCIE_GEN_BY_MODEL a GPU name names ("NVIDIA A100-SXM4-80GB" ->
    "A100", "NVIDIA H200" -> "H200", "NVIDIA RTX A6000" -> "A6000"), or None."""
    if not name:
        return None
    for token in _MODEL_TOKEN.findall(name.upper()):
        for cand in (token, token[:-1]):          # "A100X": A100
            if cand in SM_BY_MODEL:
                return cand
    return None


def sm_of_model(name: str | None) -> int | None:
    key = model_key(name)
    return None if key is None else SM_BY_MODEL[key]


def pcie_gen_of_model(name: str | None) -> int | None:
    key = model_key(name)
    return None if key is None else PCIE_GEN_BY_MODEL.get(key)


def inter_socket_gbps(vendor: str | None, arch: str | None, family: int | None, model: int | None) -> tuple[Fraction, str]:
    """The inter-socket figure for a CPU as NCCL's dump describes it, and what the link is."""
    v = (vendor or "").lower()
    a = (arch or "").lower()
    if a in ("ppc64", "ppc64le", "power"):
        return INTER_SOCKET_GBPS["power9"], "POWER9 X-Bus"
    if a in ("arm64", "aarch64", "arm"):
        return INTER_SOCKET_GBPS["arm"], "Arm socket link"
    if "amd" in v:
        key = AMD_FAMILIES.get(family, "amd-zen1-2")
        return INTER_SOCKET_GBPS[key], f"AMD Infinity Fabric ({_CPU_NAMES[key]})"
    if "intel" in v:
        for first, key in INTEL_MODELS:
            if family == 6 and model is not None and model >= first:
                return INTER_SOCKET_GBPS[key], f"Intel UPI ({_CPU_NAMES[key]})"
        return INTER_SOCKET_GBPS["intel-broadwell"], "Intel QPI (Broadwell)"
    return UNKNOWN_INTER_SOCKET_GBPS, "inter-socket link (CPU not named)"


def model_name(name: str) -> str | None:
    """A GPU name as a ``.topo`` name (``define gpu = ...``): "NVIDIA H100 80GB HBM3" ->
    "H100-80GB-HBM3"; None when nothing usable is left."""
    s = re.sub(r"^\s*NVIDIA\s+", "", name.strip(), flags=re.I)
    s = re.sub(r"[^A-Za-z0-9_.+-]+", "-", s).strip("-")
    s = re.sub(r"^[^A-Za-z_]+", "", s)
    return s[:64] or None
