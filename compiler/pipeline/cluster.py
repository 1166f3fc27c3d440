"""Cluster descriptions as a compile reads them: ``.topo`` or a TACCL profile ``.json``
(:func:`load_cluster`), and the :class:`ClusterSource` a compile records in its manifest."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hccc.compiler.cluster.topology import Topology


@dataclass(frozen=True)
class ClusterSource:
    """A cluster description loaded for a compile: the model and the file it came from."""

    topology: "Topology"
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        """What diagnostics call the cluster: its file name."""
        return self.path.name

    def manifest_entry(self) -> dict:
        """The manifest's ``topology`` object (kept small: per-node facts and the vendor of each rank)."""
        t = self.topology
        return {
            "name": t.name,
            "file": self.path.name,
            "sha256": self.sha256,
            "nranks": int(t.nranks),
            "nodes": [{"name": nd.name, "first_rank": nd.offset, "ngpus": nd.ngpus, "vendor": nd.vendor,
                       "model": nd.model} for nd in t.nodes],
            "rank_vendor": list(t.rank_vendor),
        }


def read_cluster(path: str | Path) -> ClusterSource:
    """:func:`load_cluster` plus the file's SHA-256 (recorded in the manifest)."""
    from hccc.util.limits import read_input_bytes
    p = Path(path)
    topo = load_cluster(p)
    digest = hashlib.sha256(read_input_bytes(p)).hexdigest()
    return ClusterSource(topo, p, digest)


def load_cluster(path: str | Path):
    """Any cluster description as a :class:`~hccc.compiler.cluster.topology.Topology`, by extension:
    ``.topo`` (HeteCCL-style cluster DSL) or ``.json`` (a TACCL topology profile,
    ``hccc.compiler.interop.taccl.load_taccl``). Bad input raises a located :class:`CompileError`."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        from hccc.compiler.interop.taccl import load_taccl
        return load_taccl(p)
    from hccc.compiler.cluster.topo_parser import load_topology
    return load_topology(p)
