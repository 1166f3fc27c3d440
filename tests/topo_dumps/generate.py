#!/usr/bin/env python3
"""Write the machine descriptions in this folder (deterministic: the same bytes every run).

    python tests/topo_dumps/generate.py            # (re)write them next to this script
    python tests/topo_dumps/generate.py --check    # exit 1 if a file is missing or differs

NCCL topology dumps (the XML ``NCCL_TOPO_DUMP_FILE`` writes, in NCCL's element and attribute order)
and saved ``nvidia-smi topo -m`` output (tab-separated, with its legends), of these machines:

* ``dgx_a100.xml`` / ``dgx_a100_smi.txt``: DGX A100, 8 x A100-SXM4-80GB, six NVSwitches (two
  NVLinks from each GPU to each), 2 x AMD EPYC 7742 (Zen 2), four PCIe Gen4 switch trees of two
  GPUs and two 200 Gbit/s HDR ports (the matrix also shows two storage ports no GPU is near);
* ``dgx_h100_node0.xml``, ``dgx_h100_node1.xml``: DGX H100 x 2 (ranks 0-7 and 8-15), 8 x H100-SXM5,
  18 NVLinks per GPU to four NVSwitches (5+4+4+5), 2 x Xeon 8480C (Sapphire Rapids), a Gen5 switch
  per GPU with a 400 Gbit/s ConnectX-7; node 1 as a virtual machine writes it, its NVSwitches
  unseen (``target="fffffff:ffff:ff"``);
* ``pcie_4gpu.xml`` / ``pcie_4gpu_smi.txt``: a PCIe-only box, 4 x L40S (no NVLink) behind two PCIe
  switches (the matrix: an older driver's format, SOC and an underlined header, two sockets);
* ``two_nics.xml``: 4 x A100-PCIE-40GB on two AMD EPYC 7763 sockets (Zen 3), NVLink bridges
  joining 0-1 and 2-3, one 200 Gbit/s NIC per socket;
* ``hgx_a100_4gpu_smi.txt``: HGX A100 4-GPU, an NVLink mesh (NV4 to each peer), two NICs.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def attrs(d):
    return "".join(f' {k}="{v}"' for k, v in d.items())


class E:
    """An element: tag, attributes in NCCL's order, children."""

    def __init__(self, tag, subs=(), **a):
        self.tag, self.a, self.subs = tag, a, list(subs)

    def dump(self, ind=0):
        pad = " " * ind
        if not self.subs:
            return f"{pad}<{self.tag}{attrs(self.a)}/>\n"
        s = f"{pad}<{self.tag}{attrs(self.a)}>\n"
        for x in self.subs:
            s += x.dump(ind + 2)
        return s + f"{pad}</{self.tag}>\n"


def pci(busid, cls, vendor, device, speed, width, subs=(), sv=None, sd=None):
    return E("pci", subs, busid=busid, **{"class": cls}, vendor=vendor, device=device,
             subsystem_vendor=sv or vendor, subsystem_device=sd or "0x0000", link_speed=speed, link_width=width)


def bridge(busid, speed, subs, vendor="0x1000", device="0xc010"):
    return pci(busid, "0x060400", vendor, device, speed, "16", subs, sd="0xa096")


def gpu_pci(busid, device, speed, dev, sm, rank, nvlinks):
    return pci(busid, "0x030200", "0x10de", device, speed, "16",
               [E("gpu", [E("nvlink", target=t, count=c, tclass=tc) for t, c, tc in nvlinks],
                  dev=dev, sm=sm, rank=rank, gdr="1")], sd="0x1463")


def nic_pci(busid, speed, nets, device="0x101b"):
    return pci(busid, "0x020700", "0x15b3", device, speed, "16",
               [E("nic", [E("net", name=n, dev=d, speed=sp, port="1", latency="0.000000", guid=g,
                            maxconn="131072", gdr="1") for n, d, sp, g in nets])], sd="0x0007")


def cpu(numaid, affinity, vendor, fam, model, subs, host="0x4c0d0e7f2a91b3c5"):
    return E("cpu", subs, host_hash=host, numaid=numaid, affinity=affinity, arch="x86_64", vendor=vendor,
             familyid=fam, modelid=model)


# ---- DGX A100: 8 x A100-SXM4-80GB, 6 NVSwitches (2 links from each GPU), 2 x AMD EPYC 7742 (Rome),
# 4 PCIe switch trees of 2 GPUs + 2 HDR NICs, Gen4
def dgx_a100(rank0):
    g4 = "16.0 GT/s PCIe"
    nvs = [f"0000:c{i}:00.0" for i in range(4, 10)]
    links = [(t, "2", "0x068000") for t in nvs]
    trees = [("0000:01:00.0", "0000:07:00.0", "0000:0f:00.0", "0000:0c:00.0", "0000:12:00.0", 0, "0-15,128-143", 3),
             ("0000:41:00.0", "0000:47:00.0", "0000:4e:00.0", "0000:4b:00.0", "0000:54:00.0", 2, "16-31,144-159", 1),
             ("0000:81:00.0", "0000:87:00.0", "0000:90:00.0", "0000:8d:00.0", "0000:94:00.0", 4, "64-79,192-207", 7),
             ("0000:b1:00.0", "0000:b7:00.0", "0000:bd:00.0", "0000:ba:00.0", "0000:c1:00.0", 6, "80-95,208-223", 5)]
    cpus = []
    for i, (top, ga, gb, na, nb, g0, aff, numa) in enumerate(trees):
        sw = bridge(top, g4, [
            bridge(top[:5] + f"{int(top[5:7],16)+2:02x}" + top[7:], g4, [
                bridge(ga[:5] + f"{int(ga[5:7],16)-2:02x}" + ga[7:], g4,
                       [gpu_pci(ga, "0x20b2", g4, g0, "80", rank0 + g0, links)]),
                bridge(gb[:5] + f"{int(gb[5:7],16)-2:02x}" + gb[7:], g4,
                       [gpu_pci(gb, "0x20b2", g4, g0 + 1, "80", rank0 + g0 + 1, links)]),
            ]),
            nic_pci(na, g4, [(f"mlx5_{2*i}", str(2*i), "200000", f"0x0c42a10300{2*i:02x}6a1e")]),
            nic_pci(nb, g4, [(f"mlx5_{2*i+1}", str(2*i+1), "200000", f"0x0c42a10300{2*i+1:02x}6a1e")]),
        ])
        cpus.append(cpu(str(numa), aff, "AuthenticAMD", "23", "49", [sw]))
    return E("system", cpus, version="1")


# ---- DGX H100: 8 x H100-SXM5-80GB, 4 NVSwitches (5,4,4,5 links), 2 x Xeon Platinum 8480C (Sapphire
# Rapids, family 6 model 143), one Gen5 switch per GPU with a ConnectX-7 400G NIC
def dgx_h100(rank0, host, vm=False):
    g5 = "32.0 GT/s PCIe"
    nvs = [("0000:05:00.0", "5"), ("0000:06:00.0", "4"), ("0000:07:00.0", "4"), ("0000:08:00.0", "5")]
    if vm:     # inside a VM the NVSwitches are not visible: one target for all 18 links
        nvs = [("fffffff:ffff:ff", "18")]
    links = [(t, c, "0x068000") for t, c in nvs]
    buses = [("18", "1a", "19"), ("3d", "40", "3f"), ("4c", "53", "52"), ("5c", "5e", "5d"),
             ("9a", "9b", "9c"), ("b8", "bb", "ba"), ("cb", "cc", "cd"), ("da", "db", "dc")]
    cpus = [[], []]
    for g, (sw, gb, nb) in enumerate(buses):
        tree = bridge(f"0000:{sw}:00.0", g5, [
            gpu_pci(f"0000:{gb}:00.0", "0x2330", g5, g, "90", rank0 + g, links),
            nic_pci(f"0000:{nb}:00.0", g5, [(f"mlx5_{g}", str(g), "400000", f"0x946dae0300{g:02x}5c48")], device="0x1021"),
        ], device="0xc030")
        cpus[g // 4].append(tree)
    return E("system", [cpu("0", "00000000,00000000,0000ffff,ffffffff", "GenuineIntel", "6", "143", cpus[0], host),
                        cpu("1", "ffffffff,ffff0000,00000000,00000000", "GenuineIntel", "6", "143", cpus[1], host)],
             version="1")


# ---- PCIe-only 4-GPU box: 4 x L40S (sm 89, no NVLink), one Xeon (Ice Lake, model 106), two Broadcom
# PEX switches of 2 GPUs each, one 100 GbE ConnectX-6 Dx on a root port
def pcie_4gpu():
    g4 = "16.0 GT/s PCIe"
    sws = []
    for s, (up, a, b) in enumerate([("0000:17:00.0", "0000:1a:00.0", "0000:1b:00.0"),
                                    ("0000:65:00.0", "0000:68:00.0", "0000:69:00.0")]):
        sws.append(bridge(up, g4, [gpu_pci(a, "0x26b9", g4, 2 * s, "89", 2 * s, []),
                                   gpu_pci(b, "0x26b9", g4, 2 * s + 1, "89", 2 * s + 1, [])], device="0xc030"))
    sws.append(nic_pci("0000:ca:00.0", g4, [("mlx5_0", "0", "100000", "0x1070fd03004c8f2a")], device="0x101d"))
    return E("system", [cpu("0", "ffffffff,ffffffff", "GenuineIntel", "6", "106", sws)], version="1")


# ---- a 2-socket node with 2 NICs: 4 x A100-PCIE-40GB, NVLink bridges joining 0-1 and 2-3 (12 links
# each), two GPUs and one 200G NIC per socket on root ports, AMD EPYC 7763 (Milan, family 25)
def two_nics():
    g4 = "16.0 GT/s PCIe"
    def gp(bus, peer, dev):
        return gpu_pci(bus, "0x20f1", g4, dev, "80", dev, [(peer, "12", "0x030200")])
    s0 = [gp("0000:21:00.0", "0000:41:00.0", 0), gp("0000:41:00.0", "0000:21:00.0", 1),
          nic_pci("0000:31:00.0", g4, [("mlx5_0", "0", "200000", "0x1070fd0300a1b2c3")])]
    s1 = [gp("0000:a1:00.0", "0000:c1:00.0", 2), gp("0000:c1:00.0", "0000:a1:00.0", 3),
          nic_pci("0000:b1:00.0", g4, [("mlx5_1", "1", "200000", "0x1070fd0300a1b2c4")])]
    return E("system", [cpu("0", "00000000,ffffffff", "AuthenticAMD", "25", "1", s0),
                        cpu("1", "ffffffff,00000000", "AuthenticAMD", "25", "1", s1)], version="1")

T = "\t"


def matrix(devs, cell, extra_cols, extra, nic_legend=None, underline=False, smi_l=None):
    head = T + T.join(devs) + T + T.join(extra_cols)
    if underline:
        head = "\x1b[4m" + head + "\x1b[0m"
    out = [head]
    for i, d in enumerate(devs):
        cells = [" X " if i == j else cell(i, j) for j in range(len(devs))]
        row = d + T + T.join(cells)
        if d.startswith("GPU"):
            row += T + T.join(extra(i))
        out.append(row)
    out += ["", "Legend:", "",
            "  X    = Self",
            "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
            "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
            "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
            "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
            "  PIX  = Connection traversing at most a single PCIe bridge",
            "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if nic_legend:
        out += ["", "NIC Legend:", ""] + [f"  NIC{k}: {n}" for k, n in enumerate(nic_legend)]
    text = "\n".join(out) + "\n"
    if smi_l:
        text = "".join(f"GPU {k}: {n} (UUID: GPU-{k:08x}-5a1c-4e2b-9d3f-0c7e6b1a2f{k:02d})\n" for k, n in enumerate(smi_l)) + "\n" + text
    return text


# DGX A100: 8 GPUs NV12 (NVSwitch), 10 NICs (8 compute, 2 storage), GPU NUMA ID column (driver 535+)
def dgx_a100_smi():
    gpus = [f"GPU{i}" for i in range(8)]
    nics = [f"NIC{k}" for k in range(10)]
    numa = [3, 3, 1, 1, 7, 7, 5, 5]
    aff = {3: "48-63,176-191", 1: "16-31,144-159", 7: "112-127,240-255", 5: "80-95,208-223"}
    # NIC k (k<8) sits in GPU k//2*2's PCIe switch tree; NIC8/9 (storage) on NUMA 2/6
    nic_numa = [3, 3, 1, 1, 7, 7, 5, 5, 2, 6]
    devs = gpus + nics
    def cell(i, j):
        a, b = devs[i], devs[j]
        if a.startswith("GPU") and b.startswith("GPU"):
            return "NV12"
        ta = i // 2 if i < 8 else (i - 8) // 2 if i < 16 else None
        tb = j // 2 if j < 8 else (j - 8) // 2 if j < 16 else None
        if ta is not None and ta == tb:
            return "PXB"
        na = numa[i] if i < 8 else nic_numa[i - 8]
        nb = numa[j] if j < 8 else nic_numa[j - 8]
        return "NODE" if na // 4 == nb // 4 else "SYS"
    names = [f"mlx5_{k}" for k in range(10)]
    return matrix(devs, cell, ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
                  lambda i: [aff[numa[i]], str(numa[i]), "N/A"], nic_legend=names,
                  smi_l=["NVIDIA A100-SXM4-80GB"] * 8)


# PCIe-only 4 GPUs: older driver: SOC, NIC columns named mlx5_0 directly, underlined header, no GPU NUMA ID
def pcie_4gpu_smi():
    devs = ["GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0"]
    def cell(i, j):
        if i == 4 or j == 4:
            g = j if i == 4 else i
            return "PHB" if g < 2 else "SOC"
        return "PIX" if i // 2 == j // 2 else "SOC"
    return matrix(devs, cell, ["CPU Affinity"], lambda i: ["0-19" if i < 2 else "20-39"], underline=True)


# HGX A100 4-GPU: NVLink mesh NV4 between every pair, 2 NICs, one per GPU pair; model from --gpu
def hgx_a100_4gpu():
    devs = ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1"]
    def cell(i, j):
        if i < 4 and j < 4:
            return "NV4"
        g, k = (i, j - 4) if i < 4 else (j, i - 4)
        if i >= 4 and j >= 4:
            return "SYS"
        return "PXB" if g // 2 == k else "SYS"
    return matrix(devs, cell, ["CPU Affinity", "NUMA Affinity"], lambda i: ["0-63" if i < 2 else "64-127", str(i // 2)],
                  nic_legend=["mlx5_0", "mlx5_1"])


def files() -> dict[str, str]:
    return {"dgx_a100.xml": dgx_a100(0).dump(), "dgx_h100_node0.xml": dgx_h100(0, "0x8f3a5c21d4e6b701").dump(),
            "dgx_h100_node1.xml": dgx_h100(8, "0x2b7e91c04f5d3a68", vm=True).dump(),
            "pcie_4gpu.xml": pcie_4gpu().dump(), "two_nics.xml": two_nics().dump(),
            "dgx_a100_smi.txt": dgx_a100_smi(), "pcie_4gpu_smi.txt": pcie_4gpu_smi(),
            "hgx_a100_4gpu_smi.txt": hgx_a100_4gpu()}


def main(argv: list[str]) -> int:
    stale = [n for n, text in files().items() if not (HERE / n).is_file() or (HERE / n).read_text() != text]
    if "--check" in argv:
        for n in stale:
            print(f"tests/topo_dumps/{n} is out of date (run python tests/topo_dumps/generate.py)")
        return 1 if stale else 0
    for n, text in files().items():
        (HERE / n).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
