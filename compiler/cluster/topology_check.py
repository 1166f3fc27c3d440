"""An algorithm against a cluster: the rank counts agree and every transfer has a link to run on.

:func:`check_on_topology` is what ``hccc ALGO --topology T`` and ``hccc check ALGO --topology T`` run
after the verifier: a transfer ``src -> dst`` is accepted when the cluster has at least one link
``src -> dst`` (of any class). Failures are located at the ``transfer(...)`` call that produced the
transfer, name both ranks with their node and local GPU id, and carry the loop values of the call.

:func:`link_usage` summarises which link classes an accepted algorithm uses (for the summaries).
Everything is vectorised over the transfer table, so million-transfer programs stay cheap.
"""
from __future__ import annotations

import re

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.compiler.cluster.topology import LINK_CLASSES, Topology
from hccc.util.plural import plural

#: Diagnostics listed for missing links (one per distinct rank pair); the rest are counted.
MAX_LISTED = 10


def describe_rank(topo: Topology, rank: int) -> str:
    """``rank 5 (node2 GPU 1)``."""
    nd = topo.node_of(rank)
    return f"rank {rank} ({nd.name} GPU {rank - nd.offset})"


def _node_sizes(topo: Topology) -> str:
    parts = [f"{nd.name}: {nd.ngpus}" for nd in topo.nodes[:8]]
    if len(topo.nodes) > 8:
        parts.append("...")
    return ", ".join(parts)


def _pair_index(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Index of (src[i], dst[i]) among ``topo.pairs()`` (sorted), or -1 when the pair has no link."""
    n = topo.nranks
    psrc, pdst = topo.pairs()
    keys = psrc.astype(np.int64) * n + pdst.astype(np.int64)
    want = src.astype(np.int64) * n + dst.astype(np.int64)
    pos = np.searchsorted(keys, want)
    pos_c = np.minimum(pos, max(keys.size - 1, 0))
    found = (pos < keys.size) & (keys[pos_c] == want) if keys.size else np.zeros(want.size, bool)
    return np.where(found, pos, -1)


def check_on_topology(alg: Algorithm, topo: Topology, cluster_name: str | None = None) -> None:
    """Raise a located :class:`CompileError` unless ``alg`` fits ``topo``.

    Checks, in order: ``nRanks`` equals the cluster's GPU count (located at the header), then every
    transfer uses a rank pair the cluster links (located at the transfer). ``cluster_name`` is what
    the messages call the cluster (default: the topology's name).
    """
    name = cluster_name or topo.name
    h = alg.header
    if h.nranks != topo.nranks:
        raise CompileError([Diagnostic(
            f"the algorithm has nRanks={h.nranks} but cluster '{name}' has {plural(topo.nranks, 'GPU')} "
            f"({_node_sizes(topo)})", h.location,
            notes=(f"the algorithm's GPUPerNode is {h.gpu_per_node}",) if h.gpu_per_node else ())])
    if alg.ntransfers == 0:
        return
    src = np.asarray(alg.src, dtype=np.int64)
    dst = np.asarray(alg.dst, dtype=np.int64)
    n = topo.nranks
    in_range = (src >= 0) & (src < n) & (dst >= 0) & (dst < n)
    idx = np.full(src.size, -1, dtype=np.int64)
    idx[in_range] = _pair_index(topo, src[in_range], dst[in_range])
    bad = np.flatnonzero(idx < 0)
    if bad.size == 0:
        return
    # one diagnostic per distinct rank pair, at its first transfer in table order
    key = src[bad] * max(n, 1) + dst[bad]
    _, first = np.unique(key, return_index=True)
    firsts = np.sort(bad[first])
    diags = []
    for i in firsts[:MAX_LISTED].tolist():
        s, d = int(src[i]), int(dst[i])
        where = alg.describe(i)
        if not (0 <= s < n and 0 <= d < n):
            msg = f"transfer {s} -> {d} names a rank outside cluster '{name}' (ranks 0..{n - 1})"
        else:
            msg = (f"no link from {describe_rank(topo, s)} to {describe_rank(topo, d)} in cluster '{name}'")
        if where:
            msg += f" {where}"
        diags.append(Diagnostic(msg, alg.location_of(i)))
    nbad_pairs = int(firsts.size)
    if diags:
        note = (f"{plural(int(bad.size), 'transfer')} over {plural(nbad_pairs, 'unconnected rank pair')}; a transfer needs a "
                f"link src -> dst ('hccc topo' lists the cluster's links)")
        d0 = diags[0]
        diags[0] = Diagnostic(d0.message, d0.location, d0.severity, d0.notes + (note,))
    raise CompileError(diags, more=max(0, nbad_pairs - MAX_LISTED))


def link_usage(alg: Algorithm, topo: Topology) -> dict:
    """Which links an algorithm that passed :func:`check_on_topology` runs on.

    Returns ``{"pairs": distinct (src, dst) pairs used, "transfers_by_class": {class: transfers}}``,
    where a transfer counts for the class of the best link between its ranks
    (:meth:`Topology.link_between`).
    """
    src = np.asarray(alg.src, dtype=np.int64)
    dst = np.asarray(alg.dst, dtype=np.int64)
    if src.size == 0:
        return {"pairs": 0, "transfers_by_class": {}}
    idx = _pair_index(topo, src, dst)
    if np.any(idx < 0):
        raise ValueError("link_usage needs an algorithm that passed check_on_topology")
    used, counts = np.unique(idx, return_counts=True)
    psrc, pdst = topo.pairs()
    by_class: dict[str, int] = {}
    for p, c in zip(used.tolist(), counts.tolist()):
        cls = topo.link_between(int(psrc[p]), int(pdst[p])).cls
        by_class[cls] = by_class.get(cls, 0) + int(c)
    return {"pairs": int(used.size),
            "transfers_by_class": {c: by_class[c] for c in LINK_CLASSES if c in by_class}}


#: where a file read as a ProgramIR gives its rank count: a ProgramIR's key, an MSCCL XML's
#: attribute, an MSCCL++ plan's list of GPUs (the first that the text has)
_RANK_COUNT_AT = (re.compile(r'"nranks"\s*:'), re.compile(r'\bngpus\s*='), re.compile(r'"gpus"\s*:'))


def _rank_count_location(path) -> Location | None:
    """The place in the file at ``path`` that gives its program's rank count (None: no file, or it
    cannot be read again)."""
    if path is None:
        return None
    try:
        src = SourceFile.read(path)
    except (CompileError, OSError):
        return None
    m = next((m for m in (r.search(src.text) for r in _RANK_COUNT_AT) if m), None)
    return src.location_at(m.start() if m else 0)


def check_ir_on_topology(ir, topo: Topology, cluster_name: str | None = None, path=None) -> None:
    """A ProgramIR (read from IR JSON, MSCCL XML or an MSCCL++ plan, so there are no source lines)
    against a cluster: the rank counts agree (located, where the file ``path`` it was read from is
    given, at what gives its rank count) and every connection ``rank -> send_peer`` has a link."""
    where = f" of cluster {cluster_name}" if cluster_name else ""
    if ir.nranks != topo.nranks:
        cluster = f"cluster '{cluster_name}'" if cluster_name else "the cluster"
        raise CompileError([Diagnostic(
            f"the program has {plural(ir.nranks, 'rank')} but {cluster} has {plural(topo.nranks, 'GPU')} "
            f"({_node_sizes(topo)})", _rank_count_location(path))])
    sp = ir.prims["send_peer"]
    m = sp >= 0
    src = ir.prims["rank"][m].astype(np.int64)
    dst = sp[m].astype(np.int64)
    if not src.size:
        return
    keys = np.unique(src * topo.nranks + dst)
    us, vs = keys // topo.nranks, keys % topo.nranks
    missing = np.flatnonzero(_pair_index(topo, us, vs) < 0)
    if missing.size:
        diags = [Diagnostic(f"no link{where} from {describe_rank(topo, int(us[i]))} to "
                            f"{describe_rank(topo, int(vs[i]))}, which the program sends over", None)
                 for i in missing[:MAX_LISTED]]
        raise CompileError(diags, more=max(0, int(missing.size) - MAX_LISTED))
