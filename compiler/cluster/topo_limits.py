"""What one cluster file (``.topo``) may hold: the limits its reader checks, each where it applies
(the lines and link entries before parsing, the values as they are read, the GPUs and links as the
cluster is built)."""
from __future__ import annotations

from fractions import Fraction

#: nodes, GPUs per node and GPUs of one cluster (docs/files-and-limits.md). The GPUs of a cluster
#: are the ranks of a program: a ProgramIR holds at most 2**16
#: (:data:`~hccc.compiler.ir.program_ir.MAX_RANKS`); the importers refuse a node of more GPUs than
#: a node here holds
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 1024
MAX_RANKS = 65536
#: links of one cluster (after every internode statement is expanded), counted before they are
#: built. Measured: 2,048 GPUs linked all-to-all through NICs (4.2M links) take 1.5 GB and about 30 s
#: in ``hccc topo``, so the limit keeps a cluster under about 3 GB; 2,828 GPUs all-to-all reach it
MAX_LINKS = 8_000_000
#: link entries (``->``, ``>->``) one file may write, counted before parsing (the parser's time grows
#: with them; a switch group ``>->`` describes any number of links in one entry)
MAX_LINK_ENTRIES = 32_768
#: lines of one cluster file, counted before parsing (every node takes a line or more)
MAX_TOPO_LINES = 8_192
#: lanes of one link or device, and the largest bandwidth (GB/s per lane) and compute rate: far above
#: any interconnect (one NVLink 4 link moves 25 GB/s each way), so that a typing slip is refused where it
#: stands instead of skewing every logical capacity of the cluster
MAX_LANES = 1 << 16
MAX_BANDWIDTH_GBPS = 10**9
#: the smallest bandwidth (GB/s, per lane) and GPU compute rate (gamma) accepted: 1 kB/s. Slower is no
#: interconnect hccc could schedule for, and every ratio of link speeds (the logical capacities,
#: :data:`~hccc.compiler.cluster.topology.MAX_LOGICAL_CAPACITY`) must stay representable
MIN_BANDWIDTH_GBPS = Fraction(1, 10**6)
#: the largest latency (us, 1,000 s) and chunk size (1 TiB): bounds that keep Eq. 1's exact fractions
#: small, far past any real link or buffer
MAX_LATENCY_US = 10**9
MAX_CHUNK_SIZE = 1 << 40
