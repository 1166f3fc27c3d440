#!/usr/bin/env python3
"""Regenerate the example clusters in this folder (deterministic: same output every run).

    python examples/clusters/generate.py            # (re)write the .topo files next to this script
    python examples/clusters/generate.py --check    # exit 1 if a file is missing or out of date
    python examples/clusters/generate.py --out DIR  # write somewhere else

Figures (GB/s = 10^9 bytes/s per direction unless said otherwise; 1 Gbps = 0.125 GB/s):
  H20  : NVSwitch, 900 GB/s bidirectional per GPU = 450 GB/s each way (9 x 50 GB/s ports);
         400 Gbps (50 GB/s) NICs, one per two GPUs.  4-GPU H20 nodes: NVLink mesh, 2 NICs.
  V100 : NVLink 25 GB/s per link; 8-GPU node = two 4-GPU NVLink islands joined by a 48 GB/s UPI;
         GPU pairs behind 16 GB/s PCIe switches (`define pcie`: cross-island and NIC traffic of a
         pair share its switch), each switch with a 100 Gbps (12.5 GB/s) NIC.
         4-GPU V100 nodes: NVLink mesh, NICs at 100 or 64 Gbps (12.5 or 8 GB/s), one per GPU pair.
  A100 : ResCCL testbed: NVSwitch (12 x 25 GB/s = 300 GB/s each way), 200 Gbps (25 GB/s) NICs,
         one NIC per two GPUs. 4-GPU A100 boards (HGX A100 4-GPU) have no NVSwitch: each GPU's 12
         NVLinks go 4 to each peer, the same 300 GB/s per GPU as a full mesh of 4 x 25 GB/s.
  Mixed: HetCCL testbed: 2 x 4 V100-PCIe (Gen3 x16, 16 GB/s) + 2 x 4 AMD W7800 (Gen4 x16,
         32 GB/s), one 200 Gbps HDR InfiniBand NIC per node. Every GPU-to-GPU copy and every NIC
         transfer of a GPU crosses its own PCIe link (`define pcie`, one GPU per entry), so a V100
         feeds the 25 GB/s NIC at 16 GB/s at most.
  gamma (reduction throughput) is a rough third of the GPU's memory bandwidth.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hccc.compiler.cluster.topo_parser import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                                SharedSpec, format_topology)

HERE = Path(__file__).resolve().parent


def _pairs(ngpus: int) -> list[tuple[int, ...]]:
    return [(g, g + 1) for g in range(0, ngpus, 2)]


def nvswitch(ngpus: int, port_gbps, ports: int) -> dict:
    """NVSwitch: every GPU reaches every other one; its ports (ports x port_gbps each way) are shared."""
    return {"switch": [SharedSpec((g,), tuple(h for h in range(ngpus) if h != g), port_gbps, ports)
                       for g in range(ngpus)]}


def nvlink_mesh(gpus: list[int], gbps, lanes: int) -> list[LinkSpec]:
    return [LinkSpec(a, b, gbps, lanes) for a in gpus for b in gpus if a != b]


def h20_node8() -> NodeSpec:
    return NodeSpec(8, nvswitch(8, 50, 9), vendor="nvidia", gpu="H20", gamma=1300,
                    nics=[NicSpec(p, 50) for p in _pairs(8)],
                    comment="H20 x8: NVSwitch 450 GB/s each way per GPU; 4 x 400 Gbps NICs, one per GPU pair")


def h20_node4() -> NodeSpec:
    return NodeSpec(4, {"direct": nvlink_mesh(list(range(4)), 50, 3)}, vendor="nvidia", gpu="H20", gamma=1300,
                    nics=[NicSpec(p, 50) for p in _pairs(4)],
                    comment="H20 x4: NVLink mesh (3 x 50 GB/s per pair); 2 x 400 Gbps NICs, one per GPU pair")


def v100_node8() -> NodeSpec:
    isl0, isl1 = [0, 1, 2, 3], [4, 5, 6, 7]
    return NodeSpec(8, {"direct": nvlink_mesh(isl0, 25, 2) + nvlink_mesh(isl1, 25, 2),
                        "switch": [SharedSpec(tuple(isl0), tuple(isl1), 48, 1)]},
                    vendor="nvidia", gpu="V100-SXM2-16GB", gamma=300,
                    nics=[NicSpec(p, "12.5") for p in _pairs(8)],
                    pcie=[NicSpec(p, 16) for p in _pairs(8)],
                    comment="V100 x8: two NVLink islands (0-3, 4-7; 2 x 25 GB/s per pair) joined by a 48 GB/s UPI;\n"
                            "GPU pairs sit behind 16 GB/s PCIe switches (carrying their cross-island and NIC\n"
                            "traffic), each switch with a 100 Gbps (12.5 GB/s) NIC")


def v100_node4(nic_gbps: int) -> NodeSpec:
    nic = {100: "12.5", 64: 8}[nic_gbps]
    return NodeSpec(4, {"direct": nvlink_mesh(list(range(4)), 25, 2)}, vendor="nvidia", gpu="V100-SXM2-16GB",
                    gamma=300, nics=[NicSpec(p, nic) for p in _pairs(4)],
                    comment=f"V100 x4: NVLink mesh (2 x 25 GB/s per pair); {nic_gbps} Gbps NICs, one per GPU pair")


def a100_node(ngpus: int) -> NodeSpec:
    if ngpus == 8:
        bw = nvswitch(8, 25, 12)
        what = "NVSwitch, 12 x 25 GB/s = 300 GB/s each way per GPU"
    else:
        bw = {"direct": nvlink_mesh(list(range(4)), 25, 4)}
        what = "NVLink mesh, 4 x 25 GB/s per pair"
    return NodeSpec(ngpus, bw, vendor="nvidia", gpu="A100-SXM4-80GB", gamma=650,
                    nics=[NicSpec(p, 25) for p in _pairs(ngpus)],
                    comment=f"A100 x{ngpus}: {what}; 200 Gbps (25 GB/s) NICs, one per GPU pair")


def pcie_node(vendor: str, gpu: str, gbps, gen: int) -> NodeSpec:
    """GPUs on their own PCIe x16 links: peer copies and NIC traffic of a GPU share that link."""
    links = [LinkSpec(a, b, gbps, 1) for a in range(4) for b in range(4) if a != b]
    return NodeSpec(4, {"switch": links}, vendor=vendor, gpu=gpu, nics=[NicSpec((0, 1, 2, 3), 25)],
                    pcie=[NicSpec((g,), gbps) for g in range(4)],
                    comment=f"{gpu} x4, each on a PCIe Gen{gen} x16 link ({gbps} GB/s each way) that carries its\n"
                            "peer copies and its NIC traffic; one 200 Gbps (25 GB/s) HDR NIC")


def cluster(nodes: list[NodeSpec], comment: str, **kw) -> ClusterSpec:
    inter = InternodeSpec("all", "nic", comment="every pair of nodes talks through the NICs of its GPUs")
    return ClusterSpec(nodes, [inter], chunksize="1M", comment=comment, **kw)


HETECCL = {  # name: list of node sizes, in the order of HeteCCL section 6.1's labels
    "4_8": [4, 8],
    "4x2_8": [4, 4, 8],
    "4x3": [4, 4, 4],
    "4x3_8": [4, 4, 4, 8],
    "8x2_4": [8, 8, 4],
    "4x2_8x2": [4, 4, 8, 8],
}


def clusters() -> dict[str, str]:
    out: dict[str, str] = {}
    fig10 = ClusterSpec(
        [NodeSpec(2, {"direct": [LinkSpec(0, 1, 25, 2), LinkSpec(1, 0, 25, 2)]}),
         NodeSpec(4, {"switch": [SharedSpec((0, 1), (2, 3), 16, 1)],
                      "direct": [LinkSpec(0, 1, 25, 2), LinkSpec(1, 0, 25, 2), LinkSpec(2, 3, 25, 2),
                                 LinkSpec(3, 2, 25, 2)]})],
        [InternodeSpec(("node1", "node2"), {"switch": [SharedSpec((0, 1), (0, 1, 2, 3), 8, 1)]})],
        comment="HeteCCL Appendix A, Fig. 10 (pure HeteCCL syntax, no extensions): a 2-GPU node and a 4-GPU\n"
                "node whose GPU pairs are NVLinked and joined by a 16 GB/s switch; 8 GB/s between the nodes.")
    out["heteccl_fig10"] = format_topology(fig10)
    for label, sizes in HETECCL.items():
        pretty = label.replace("_", " + ")
        h20 = [h20_node8() if g == 8 else h20_node4() for g in sizes]
        out[f"h20_{label}"] = format_topology(cluster(
            h20, f"HeteCCL section 6.1 topology ({pretty}), H20 flavour: {sum(sizes)} GPUs, 400 Gbps NICs"))
        v100, k = [], 0
        for g in sizes:
            if g == 8:
                v100.append(v100_node8())
            else:
                v100.append(v100_node4(64 if k % 2 == 0 else 100))
                k += 1
        out[f"v100_{label}"] = format_topology(cluster(
            v100, f"HeteCCL section 6.1 topology ({pretty}), V100 flavour: {sum(sizes)} GPUs; 8-GPU nodes on\n"
                  "100 Gbps NICs, 4-GPU nodes alternately on 64 and 100 Gbps NICs",
            latency={"direct": "0.7", "switch": 1, "internode": "1.7", "nic": "1.7"}))
    for i, (nn, g) in enumerate([(2, 4), (2, 8), (4, 4), (4, 8)], start=1):
        out[f"a100_topo{i}"] = format_topology(cluster(
            [a100_node(g) for _ in range(nn)],
            f"ResCCL Topo{i} (section 5.1 / Table 3): {nn} servers x {g} A100, {nn * g} GPUs"))
    mixed = [pcie_node("nvidia", "V100-PCIe", 16, 3), pcie_node("nvidia", "V100-PCIe", 16, 3),
             pcie_node("amd", "W7800", 32, 4), pcie_node("amd", "W7800", 32, 4)]
    out["mixed_v100_w7800"] = format_topology(cluster(
        mixed, "Mixed-vendor cluster (HetCCL testbed): 2 nodes x 4 NVIDIA V100 + 2 nodes x 4 AMD W7800,\n"
               "200 Gbps InfiniBand; reduction throughput per vendor",
        gamma={"nvidia": 300, "amd": 190}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--check", action="store_true", help="only check that the files are up to date")
    args = ap.parse_args(argv)
    stale = []
    for name, text in sorted(clusters().items()):
        path = args.out / f"{name}.topo"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
