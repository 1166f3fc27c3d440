"""Cluster descriptions shared by several test files (written here, not in examples/, so the
tests see clusters that the repository's examples do not cover)."""

# HeteCCL Fig. 10 / DESIGN.md section 4: a 2-GPU node and a 4-GPU node behind shared switches.
FIG10 = """\
define nodenum = 2
define node1 = 2
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define node2 = 4
define bandwidth = {switch => [(((0,1),(2,3)) >-> (16,1))], direct => [((0,1) -> (25,2)), ((1,0) -> (25,2)), ((2,3) -> (25,2)), ((3,2) -> (25,2))]}
define internode = (node1, node2)
define interbandwidth = {switch => [(((0,1),(0,1,2,3)) >-> (8,1))]}
"""

# NVIDIA, AMD, NVIDIA, AMD nodes of two GPUs each, one NIC per node, every pair of GPUs reachable
# (mixed-vendor compile and runtime tests).
MIXED_2X2 = """\
define nodenum = 4
define node1 = 2
define vendor = nvidia
define gpu = V100
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define nic = [((0,1) -> (25,1))]
define node2 = 2
define vendor = amd
define gpu = W7800
define bandwidth = {switch => [(((0),(1)) >-> (32,1))]}
define nic = [((0,1) -> (25,1))]
define node3 = 2
define vendor = nvidia
define nic = [((0,1) -> (25,1))]
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2))]}
define node4 = 2
define vendor = amd
define nic = [((0,1) -> (25,1))]
define bandwidth = {switch => [(((0),(1)) >-> (32,1))]}
define internode = all
define interbandwidth = nic
"""
