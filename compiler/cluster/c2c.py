"""C2C collectives for mixed-vendor clusters: HetCCL's hierarchical breakdown (Algorithm 1, Table 7).

A global collective over the clusters of a :class:`~hccc.compiler.cluster.hierarchy.Hierarchy` becomes

* **start**: an intra-cluster collective that brings each cluster's data to its border ranks,
* **c2c**: cluster-to-cluster transfers between border ranks on a *cluster ring* (cluster ``c`` only
  talks to ``c+1``; clusters in the order of their first rank), each chunk crossing to a border rank of
  the next cluster chosen in proportion to the border ranks' NIC bandwidth (c2cCpy = ``recv``,
  c2cRed = ``rrc``: our kernels reduce on receipt, so no vendor library is needed for the reduction),
* **end**: an intra-cluster collective that spreads what the border ranks received.

Per collective (``G`` ranks and chunks, ``C`` clusters, cluster ``c`` has ``N_c`` ranks; a chunk's
*holder* in a cluster is the border rank that sends / receives it across clusters):

* AllGather. start: AllGather of the cluster's own chunks; c2c: every cluster's chunks travel the
  ring for C-1 hops (``recv``); end: each received chunk is broadcast from its holder.
* ReduceScatter. start: every other cluster's chunk is reduced to its holder; c2c: the block of
  cluster ``o`` (its N_o chunks) starts at ``o+1`` and is reduced hop by hop until it reaches ``o``
  (``rrc``); end: ReduceScatter of the cluster's own chunks (rank ``r`` ends with chunk ``r``).
* AllReduce. start: every chunk is reduced to its holder; c2c: ring ReduceScatter (``rrc``) then ring
  AllGather (``recv``) over C nearly equal blocks of chunks; end: every chunk is broadcast from its
  holder.
* Broadcast (root ``R`` in cluster ``o``). start: Broadcast from ``R`` inside cluster ``o``; c2c: every
  chunk travels the cluster ring from ``o`` for C-1 hops (``recv``); end: each received chunk is
  broadcast from its holder.
* Reduce (root ``R`` in cluster ``o``). start: every cluster but ``o`` reduces every chunk to its
  holder; c2c: the partial sums travel the ring from ``o+1`` to ``o``, reduced hop by hop (``rrc``);
  end: Reduce inside cluster ``o`` onto ``R`` (the holders bring the other clusters' sums along).

Cross-cluster chunks sent / received by cluster ``c`` (``B_c`` = AllReduce block of cluster ``c``,
``G/C`` chunks rounded): AllGather ``G - N_{c+1}`` / ``G - N_c`` (Table 7: about ``G*n``); ReduceScatter
``G - N_c`` / ``G - N_{c-1}`` (Table 7: ``(G-N)*n`` / ``(C-1)*N*n``, equal when the clusters have equal
sizes or ``C = 2``); AllReduce ``2G - |B_c| - |B_{c+1}|`` / ``2G - |B_{c-1}| - |B_c|`` (Table 7: about
``2n(C-1)/C``); Broadcast ``G`` / ``G`` except that the last cluster on the ring from ``o`` sends
nothing and ``o`` receives nothing; Reduce ``G`` / ``G`` except that ``o`` sends nothing and ``o+1``
receives nothing (Table 7: ``n`` each). Every chunk crosses each cluster boundary at most once per ring
direction.

Intra-cluster building blocks run over the cluster's ring (a Hamiltonian cycle over the cluster's
links, natural rank order when it exists): a broadcast is a chain from the root along the ring, a
reduction a chain that ends at the root (``intra="ring"``, bandwidth-optimal, NCCL style); with
``intra="mesh"`` the root sends to / receives from every member directly (fewer steps, needs every pair
linked).

**Steps and pipelining (Fig. 9).** Every transfer belongs to a *stage*: stage 0 holds the start
collective, stage ``j`` the ``j``-th c2c hop, and the intra-cluster work is placed just in time around
the hops (a cluster reduces a block in the stage before the hop that needs it, and broadcasts a chunk
in the stage after it arrives), so hop ``j+1`` already overlaps the broadcast of hop ``j``'s data. An
AllGather chunk whose owner is its own border rank (every rank a border rank: Fig. 9's case) needs no
start collective before it crosses, so its hops move one stage earlier, next to the start. The
data is then split into ``K = pipeline`` *pieces* (every block cut into K runs of consecutive chunks;
for AllGather every border rank's share of its cluster's chunks; K is clamped so that no piece is
empty, since a chunk is the unit of data in ResCCLang) and piece ``k+1`` runs a stage
right after piece ``k`` leaves it: piece ``k+1``'s intra-cluster start overlaps piece ``k``'s
inter-cluster hop. Pieces are disjoint chunk sets, so the dependency DAG has no edge between pieces and
HPDS overlaps them at run time as well (and pipelines every chunk over micro-batches on top). Steps are
renumbered densely; ``K = 1`` is the plain stage sequence. Since hccc's kernels already slice every chunk
into micro-batches and let each task run ahead as soon as its own chunk allows, pieces change nothing
under task-level execution and only add steps under step-by-step (algorithm-level) execution: in the
simulator (``benchmarks/mixed_vendor.py``) K > 1 never helps, so the default is 1.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

from hccc.util.limits import printable
from hccc.compiler.frontend.algorithm import OP_NAMES, RECV, RRC, Algorithm, Collective, Header, TransferSite
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.cluster.hierarchy import Hierarchy, hierarchy as build_hierarchy, rank_ranges
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.frontend.collectives import SPECS

__all__ = ["C2CError", "C2CPlan", "plan_c2c", "c2c_algorithm", "c2c_rccl", "cross_cluster_chunks",
           "COLLECTIVES", "PHASES", "INTRA_ALGORITHMS"]

PHASES = ("start", "c2c", "end")
INTRA_ALGORITHMS = ("ring", "mesh")
START, C2C, END = 0, 1, 2


class C2CError(CompileError):
    """The C2C algorithm cannot be generated for this cluster / these options."""

    def __init__(self, message: str):
        super().__init__([Diagnostic(message, None)])


# ---------------------------------------------------------------------------------------- helpers
def _int_weights(values: Sequence[Fraction]) -> list[int]:
    """Positive rationals scaled to integers with the same ratios (exact)."""
    fr = [Fraction(v) for v in values]
    den = 1
    for f in fr:
        den = den * f.denominator // math.gcd(den, f.denominator)
    ints = [int(f * den) for f in fr]
    g = 0
    for i in ints:
        g = math.gcd(g, i)
    return [i // g for i in ints] if g else ints


def swrr(weights: Sequence[int], n: int) -> np.ndarray:
    """Smooth weighted round robin: ``n`` picks among ``len(weights)`` targets, proportional to the
    weights and spread evenly (every prefix of the sequence is close to proportional; equal weights
    give plain round robin starting at target 0)."""
    w = [int(x) for x in weights]
    total = sum(w)
    if not w or total <= 0:
        raise ValueError("swrr needs positive weights")
    cur = [0] * len(w)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        best = 0
        for j in range(len(w)):
            cur[j] += w[j]
            if cur[j] > cur[best]:
                best = j
        cur[best] -= total
        out[i] = best
    return out


def _ring_order(topo: Topology, ranks: Sequence[int], what: str, budget: int = 200_000) -> tuple[int, ...]:
    """A Hamiltonian cycle through ``ranks`` over directed links (natural order when it works)."""
    rs = sorted(int(r) for r in ranks)
    n = len(rs)
    if n <= 1:
        return tuple(rs)
    if all(topo.has_link(rs[i], rs[(i + 1) % n]) for i in range(n)):
        return tuple(rs)
    succ = {u: [v for v in rs if v != u and topo.has_link(u, v)] for u in rs}
    start = rs[0]
    path = [start]
    seen = {start}
    iters = [iter(succ[start])]
    steps = 0
    while iters:
        steps += 1
        if steps > budget:
            break
        nxt = next(iters[-1], None)
        if nxt is None:
            iters.pop()
            seen.discard(path.pop())
            continue
        if nxt in seen:
            continue
        path.append(nxt)
        seen.add(nxt)
        if len(path) == n:
            if topo.has_link(nxt, start):
                return tuple(path)
            seen.discard(path.pop())
            continue
        iters.append(iter(succ[nxt]))
    raise C2CError(f"no ring through the ranks of {what} ({rank_ranges(rs)}) over the cluster's links; "
                   f"use --intra mesh or describe the missing links")


def _sanitize(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not s or not (s[0].isalpha() or s[0] == "_"):
        s = "c2c_" + s
    return s[:64]


def cross_cluster_chunks(alg: Algorithm, hier: Hierarchy) -> tuple[np.ndarray, np.ndarray]:
    """Chunks each cluster sends to / receives from other clusters in ``alg`` (one per transfer)."""
    rc = hier.rank_cluster
    s, d = rc[alg.src], rc[alg.dst]
    cross = s != d
    C = hier.nclusters
    return (np.bincount(s[cross], minlength=C).astype(np.int64),
            np.bincount(d[cross], minlength=C).astype(np.int64))


# ---------------------------------------------------------------------------------------- the plan
@dataclass
class C2CPlan:
    """A generated C2C algorithm with everything that explains it.

    Per transfer (parallel arrays, in table order): ``src``, ``dst``, ``step``, ``chunk``, ``op`` and
    ``piece``, ``stage``, ``phase`` (0 start, 1 c2c, 2 end). Per chunk: ``piece_of`` and ``block_of``
    (the cluster whose block the chunk belongs to: its owner for AllGather / ReduceScatter, the cluster
    where the ring ReduceScatter completes it for AllReduce). ``holder[c, x]`` is the border rank of
    cluster ``c`` that sends / receives chunk ``x`` across clusters (-1: none).
    """

    topology: Topology
    hierarchy: Hierarchy
    collective: Collective
    intra: str
    pieces: int
    pieces_requested: int
    rings: tuple[tuple[int, ...], ...]
    holder: np.ndarray
    piece_of: np.ndarray
    block_of: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    step: np.ndarray
    chunk: np.ndarray
    op: np.ndarray
    piece: np.ndarray
    stage: np.ndarray
    phase: np.ndarray
    stage_lengths: tuple[int, ...]
    name: str = "c2c"
    root: int = 0                 # Broadcast / Reduce root
    _alg: Algorithm | None = field(default=None, repr=False)

    @property
    def nranks(self) -> int:
        return self.hierarchy.nranks

    @property
    def ntransfers(self) -> int:
        return len(self.src)

    @property
    def nsteps(self) -> int:
        return int(np.unique(self.step).size)

    def algorithm(self) -> Algorithm:
        """The transfers as an :class:`Algorithm` (one anonymous site), in the order of
        :meth:`rccl`'s lines: what that text parses to, and so the same compiled program."""
        if self._alg is None:
            h = self.header()
            n = self.ntransfers
            o = self._text_order()
            self._alg = Algorithm(
                header=h, src=self.src[o], dst=self.dst[o], step=self.step[o],
                chunk=self.chunk[o], op=self.op[o].astype(np.uint8), site=np.zeros(n, dtype=np.int64),
                sites=[TransferSite(None, ())], loop_values=[np.zeros((n, 0), dtype=np.int64)])
        return self._alg

    def header(self) -> Header:
        """``GPUPerNode`` / ``NICPerNode`` are informational: the largest node's GPU and border-rank counts."""
        topo = self.topology
        nics: dict[int, set] = {}
        for c in self.hierarchy.clusters:
            for b in c.border_ranks:
                nics.setdefault(int(topo.rank_node[b]), set()).add(c.nic_members.get(b, (b,)))
        return Header(nranks=self.nranks, collective=self.collective, name=self.name, nchannels=1,
                      nwarps=16, gpu_per_node=max(nd.ngpus for nd in topo.nodes),
                      nic_per_node=max((len(v) for v in nics.values()), default=0), root=self.root,
                      nchannels_given=True)      # (the text writes nChannels)

    def _text_order(self) -> np.ndarray:
        """The transfers in the order :meth:`rccl` writes them: by step, piece, stage, phase,
        source, destination, chunk."""
        return np.lexsort((self.chunk, self.dst, self.src, self.phase, self.stage, self.piece, self.step))

    def cross_cluster_chunks(self) -> tuple[np.ndarray, np.ndarray]:
        return cross_cluster_chunks(self.algorithm(), self.hierarchy)

    def overlap_steps(self) -> int:
        """Steps that run intra-cluster and inter-cluster transfers together (Fig. 9's overlap)."""
        rc = self.hierarchy.rank_cluster
        cross = rc[self.src] != rc[self.dst]
        inter = set(self.step[cross].tolist())
        intra = set(self.step[~cross].tolist())
        return len(inter & intra)

    def summary(self) -> dict:
        send, recv = self.cross_cluster_chunks()
        rc = self.hierarchy.rank_cluster
        cross = rc[self.src] != rc[self.dst]
        return {
            "name": self.name,
            "collective": self.collective.value,
            **({"root": self.root} if self.collective.rooted else {}),
            "topology": self.topology.name,
            "nranks": self.nranks,
            "nclusters": self.hierarchy.nclusters,
            "intra": self.intra,
            "pieces": self.pieces,
            "pieces_requested": self.pieces_requested,
            "transfers": self.ntransfers,
            "steps": self.nsteps,
            "inter_cluster_transfers": int(cross.sum()),
            "intra_cluster_transfers": int((~cross).sum()),
            "overlap_steps": self.overlap_steps(),
            "clusters": [{
                "name": c.name, "vendor": c.vendor, "model": c.model, "ranks": list(c.ranks),
                "border_ranks": list(c.border_ranks),
                "nic_gbps": {str(b): float(c.nic_gbps[b]) for b in c.border_ranks},
                "ring": list(self.rings[c.index]),
                "cross_cluster_chunks_sent": int(send[c.index]),
                "cross_cluster_chunks_received": int(recv[c.index]),
            } for c in self.hierarchy.clusters],
        }

    # ------------------------------------------------------------------ ResCCLang text
    def header_comment(self) -> list[str]:
        coll = self.collective
        hier = self.hierarchy
        C = hier.nclusters
        send, recv = self.cross_cluster_chunks()
        order = " -> ".join(f"C{c.index}" for c in hier.clusters) + (" -> C0" if C > 1 else "")
        lines = [f"HetCCL C2C {coll.dsl_name}{f' (root {self.root})' if coll.rooted else ''} for cluster "
                 f"'{self.topology.name}' ({self.nranks} ranks), generated by hccc gen c2c",
                 "Algorithm 1 breakdown (Table 7):"]
        for ph, text in zip(PHASES, _BREAKDOWNS[coll].phases):
            lines.append(f"  {ph:5s}: {text}")
        lines.append(f"clusters (ring {order}):")
        for c in hier.clusters:
            what = c.vendor + (f" {c.model}" if c.model else "")
            by_bw: dict = {}
            for b in c.border_ranks:
                by_bw.setdefault(c.nic_gbps[b], []).append(b)
            border = "; ".join(f"{rank_ranges(rs)} ({float(bw):g} GB/s{' each' if len(rs) > 1 else ''})"
                               for bw, rs in by_bw.items()) or "none"
            lines.append(f"  C{c.index} {c.name} ({what}): ranks {rank_ranges(c.ranks)}; border ranks {border}")
            lines.append(f"     intra-cluster ring: {' '.join(map(str, self.rings[c.index]))}")
        lines.append(f"pieces: {self.pieces} (asked for {self.pieces_requested}); intra-cluster algorithm: "
                     f"{self.intra}; stages of lengths {list(self.stage_lengths)}")
        lines.append(f"cross-cluster chunks (1 chunk = 1/{self.nranks} of the buffer): " + "; ".join(
            f"C{c.index} sends {int(send[c.index])}, receives {int(recv[c.index])}" for c in hier.clusters))
        ov = self.overlap_steps()
        lines.append(f"{self.ntransfers} transfers in {self.nsteps} steps ({ov} step{'s' if ov != 1 else ''} "
                     f"{'overlap' if ov != 1 else 'overlaps'} intra- and inter-cluster transfers)")
        return lines

    def rccl(self) -> str:
        """ResCCLang source: header comment, ``ResCCLAlgo`` header, one ``transfer`` per line, grouped
        by step with a comment naming the piece, stage and phase of each group."""
        h = self.header()
        # names in the comment come from the cluster file: one line each, no control characters
        out = ["# " + printable(ln, limit=1 << 16) for ln in self.header_comment()]
        root = f"Root={h.root}, " if h.collective.rooted else ""
        out.append(f'def ResCCLAlgo(nRanks={h.nranks}, nChannels={h.nchannels}, nWarps={h.nwarps}, '
                   f'AlgoName="{h.name}", OpType="{h.collective.dsl_name}", {root}GPUPerNode={h.gpu_per_node}, '
                   f'NICPerNode={h.nic_per_node}):')
        order = self._text_order()
        last = None
        text = _BREAKDOWNS[self.collective].phases
        for i in order.tolist():
            key = (int(self.step[i]), int(self.piece[i]), int(self.stage[i]), int(self.phase[i]))
            if key != last:
                st, pc, sg, ph = key
                hop = f", hop {sg}" if ph == C2C else ""
                out.append(f"    # step {st}: piece {pc}, stage {sg}, {PHASES[ph]}{hop}: {text[ph]}")
                last = key
            out.append(f"    transfer({int(self.src[i])}, {int(self.dst[i])}, {int(self.step[i])}, "
                       f"{int(self.chunk[i])}, {OP_NAMES[int(self.op[i])]})")
        if not len(order):
            out.append("    # nothing to transfer")
            out.append("    n = 0")
        return "\n".join(out) + "\n"


class _Rows:
    """Transfers under construction: (src, dst, chunk, op, piece, stage, sub-step, phase)."""

    def __init__(self) -> None:
        self.cols: list[list[int]] = [[] for _ in range(8)]

    def add(self, s: int, d: int, x: int, op: int, piece: int, stage: int, sub: int, phase: int) -> None:
        for col, v in zip(self.cols, (s, d, x, op, piece, stage, sub, phase)):
            col.append(int(v))

    def bcast(self, ring: Sequence[int], pos: dict[int, int], mesh: bool, root: int, x: int, piece: int,
              stage: int, phase: int) -> None:
        """Chunk ``x`` from ``root`` to every other member of the ring."""
        n = len(ring)
        p = pos[root]
        for i in range(n - 1):
            if mesh:
                self.add(root, ring[(p + i + 1) % n], x, RECV, piece, stage, 0, phase)
            else:
                self.add(ring[(p + i) % n], ring[(p + i + 1) % n], x, RECV, piece, stage, i, phase)

    def reduce(self, ring: Sequence[int], pos: dict[int, int], mesh: bool, root: int, x: int, piece: int,
               stage: int, phase: int) -> None:
        """Chunk ``x`` of every member reduced into ``root`` (one ``rrc`` into a location per sub-step)."""
        n = len(ring)
        p = pos[root]
        for i in range(n - 1):
            if mesh:
                self.add(ring[(p + 1 + i) % n], root, x, RRC, piece, stage, i, phase)
            else:
                self.add(ring[(p + 1 + i) % n], ring[(p + 2 + i) % n], x, RRC, piece, stage, i, phase)

    def arrays(self) -> list[np.ndarray]:
        return [np.asarray(c, dtype=np.int64) for c in self.cols]


def _split_pieces(groups: list[list[int]], k: int, G: int) -> tuple[np.ndarray, int]:
    """Cut every group (a list of chunks) into ``k`` consecutive runs; piece index per chunk.
    Returns (piece_of, effective k): k is clamped to the longest group so that no piece is empty."""
    k = max(1, min(int(k), max((len(g) for g in groups), default=1)))
    piece = np.zeros(G, dtype=np.int64)
    for g in groups:
        for pi, run in enumerate(np.array_split(np.asarray(g, dtype=np.int64), k)):
            piece[run] = pi
    return piece, k


def _stage_steps(piece: np.ndarray, stage: np.ndarray, sub: np.ndarray, k: int) -> tuple[np.ndarray, tuple]:
    """Step of every transfer: piece ``p`` enters stage ``s`` once it has left stage ``s-1`` and piece
    ``p-1`` has left stage ``s`` (a software pipeline); then renumbered densely."""
    if not len(stage):
        return np.zeros(0, dtype=np.int64), ()
    S = int(stage.max()) + 1
    L = np.zeros(S, dtype=np.int64)
    np.maximum.at(L, stage, sub + 1)
    start = np.zeros((k, S), dtype=np.int64)
    for p in range(k):
        for s in range(S):
            t = 0
            if s > 0:
                t = start[p, s - 1] + L[s - 1]
            if p > 0:
                t = max(t, start[p - 1, s] + L[s])
            start[p, s] = t
    raw = start[piece, stage] + sub
    _, dense = np.unique(raw, return_inverse=True)
    return dense.astype(np.int64), tuple(int(x) for x in L)


class _Build:
    """One C2C generation under way: which rank holds each chunk in each cluster (``holder``), each
    chunk's block and piece, the transfers so far, and the building blocks every collective's
    breakdown (:data:`_BREAKDOWNS`) is written in."""

    def __init__(self, clusters, rings, mesh: bool, rank_cluster: np.ndarray, pipeline: int, root: int):
        self.clusters, self.rings, self.mesh, self.rc = clusters, rings, mesh, rank_cluster
        self.pos = [{r: i for i, r in enumerate(ring)} for ring in rings]
        self.C, self.G = len(clusters), len(rank_cluster)
        self.pipeline, self.root = int(pipeline), int(root)
        self.holder = np.full((self.C, self.G), -1, dtype=np.int64)
        self.rows = _Rows()
        # set by the breakdown: every chunk's block (the cluster whose ring it starts or ends on),
        # piece, and the effective number of pieces
        self.block = np.zeros(self.G, dtype=np.int64)
        self.piece = np.zeros(self.G, dtype=np.int64)
        self.k = 1

    def holders_of(self, c: int) -> tuple[list[int], list[int]]:
        cl = self.clusters[c]
        if self.C == 1:  # a single cluster: every rank takes part, equally
            return list(cl.ranks), [1] * cl.nranks
        return list(cl.border_ranks), _int_weights([cl.nic_gbps[b] for b in cl.border_ranks])

    def assign(self, c: int, seq: Sequence[int]) -> None:
        who, w = self.holders_of(c)
        pick = swrr(w, len(seq))
        self.holder[c, np.asarray(seq, dtype=np.int64)] = np.asarray(who, dtype=np.int64)[pick]

    def hop_first(self, c: int, o: int) -> int:
        """First c2c hop at which cluster ``c`` handles a block that starts its ring at cluster ``o+1``."""
        C = self.C
        d = (c - o) % C
        return 1 if d == 1 else (d - 1 if d >= 2 else max(C - 1, 1))

    def order_key(self, c: int, x: int) -> tuple:
        """Holder assignment order in cluster ``c``: by the hop that first needs the chunk, then block,
        then piece, so that every (block, piece) group is a contiguous run of the SWRR sequence."""
        o = int(self.block[x])
        return self.hop_first(c, o), (c - o) % self.C, int(self.piece[x]), x

    def copy_around(self, x: int, o: int, src: int) -> None:
        """AllGather / Broadcast of chunk ``x``: from ``src`` over cluster ``o``'s ring (start), then
        around the cluster ring (c2cCpy) and over each receiving cluster's ring (end)."""
        rows, rings, pos, mesh, holder, p = self.rows, self.rings, self.pos, self.mesh, self.holder, self.piece[x]
        rows.bcast(rings[o], pos[o], mesh, src, x, p, 0, START)
        # a chunk whose source is its own sender crosses at once, alongside the start collective
        # (Fig. 9: every rank a border rank); otherwise after it
        late = 0 if holder[o, x] == src else 1
        for j in range(1, self.C):
            a, b = (o + j - 1) % self.C, (o + j) % self.C
            rows.add(holder[a, x], holder[b, x], x, RECV, p, j - 1 + late, 0, C2C)
            rows.bcast(rings[b], pos[b], mesh, int(holder[b, x]), x, p, j + late, END)

    def reduce_around(self, x: int, o: int, dst: int) -> None:
        """ReduceScatter / Reduce of chunk ``x``: every other cluster reduces it to its holder
        (start), the partial sums go around the ring from ``o+1`` to ``o`` (c2cRed), and cluster
        ``o`` reduces onto ``dst`` (end)."""
        rows, rings, pos, mesh, holder, p, C = (self.rows, self.rings, self.pos, self.mesh, self.holder,
                                                self.piece[x], self.C)
        for c in range(C):
            if c != o:
                rows.reduce(rings[c], pos[c], mesh, int(holder[c, x]), x, p, self.hop_first(c, o) - 1, START)
        for j in range(1, C):
            a, b = (o + j) % C, (o + j + 1) % C
            rows.add(holder[a, x], holder[b, x], x, RRC, p, j, 0, C2C)
        rows.reduce(rings[o], pos[o], mesh, dst, x, p, C, END)


# ---------------------------------------------------------------------------------- breakdowns
# One function per collective the generator implements (the module docstring's Algorithm 1
# breakdowns): each sets the chunks' blocks and pieces, assigns the holders and adds the transfers.
def _build_allgather(b: _Build) -> None:
    C, G, clusters = b.C, b.G, b.clusters
    b.block = b.rc.copy()  # chunk x belongs to its owner's cluster
    # senders of the own chunks first (so that a border rank sends its own chunk when it can)
    groups = []
    for c in range(C):
        own = list(clusters[c].ranks)
        b.assign(c, own)
        for h in b.holders_of(c)[0]:
            groups.append([x for x in own if b.holder[c, x] == h])
    b.piece, b.k = _split_pieces(groups, b.pipeline, G)
    for c in range(C):
        inc = [x for x in range(G) if b.block[x] != c]
        inc.sort(key=lambda x: ((c - b.block[x]) % C, b.piece[x], x))
        if inc:
            b.assign(c, inc)
    for x in range(G):
        b.copy_around(x, int(b.block[x]), x)


def _build_reducescatter(b: _Build) -> None:
    b.block = b.rc.copy()
    b.piece, b.k = _split_pieces([list(c.ranks) for c in b.clusters], b.pipeline, b.G)
    if b.C > 1:
        for c in range(b.C):
            b.assign(c, sorted(range(b.G), key=lambda x: b.order_key(c, x)))
    for x in range(b.G):
        b.reduce_around(x, int(b.block[x]), x)


def _build_rooted(b: _Build, around) -> None:
    """Broadcast, Reduce: every chunk starts (ends) in the root's cluster."""
    G = b.G
    b.block = np.full(G, int(b.rc[b.root]), dtype=np.int64)
    b.piece, b.k = _split_pieces([list(range(G))], b.pipeline, G)
    if b.C > 1:
        for c in range(b.C):
            b.assign(c, sorted(range(G), key=lambda x: (b.piece[x], x)))
    for x in range(G):
        around(x, int(b.block[x]), b.root)


def _build_broadcast(b: _Build) -> None:
    _build_rooted(b, b.copy_around)


def _build_reduce(b: _Build) -> None:
    _build_rooted(b, b.reduce_around)


def _build_allreduce(b: _Build) -> None:
    C, G, rows, rings, pos, mesh, holder = b.C, b.G, b.rows, b.rings, b.pos, b.mesh, b.holder
    b.block = np.zeros(G, dtype=np.int64)
    blocks = [bl.tolist() for bl in np.array_split(np.arange(G, dtype=np.int64), C)]
    for bi, bl in enumerate(blocks):
        b.block[bl] = bi
    b.piece, b.k = _split_pieces(blocks, b.pipeline, G)
    piece = b.piece
    for c in range(C):
        b.assign(c, sorted(range(G), key=lambda x: b.order_key(c, x)))
    for x in range(G):
        o = int(b.block[x])
        for c in range(C):
            rows.reduce(rings[c], pos[c], mesh, int(holder[c, x]), x, piece[x], b.hop_first(c, o) - 1, START)
        for j in range(1, C):  # ring ReduceScatter: the block completes at cluster o
            s, d = (o + j) % C, (o + j + 1) % C
            rows.add(holder[s, x], holder[d, x], x, RRC, piece[x], j, 0, C2C)
        rows.bcast(rings[o], pos[o], mesh, int(holder[o, x]), x, piece[x], C, END)
        for j in range(1, C):  # ring AllGather of the completed block
            s, d = (o + j - 1) % C, (o + j) % C
            rows.add(holder[s, x], holder[d, x], x, RECV, piece[x], C - 1 + j, 0, C2C)
            rows.bcast(rings[d], pos[d], mesh, int(holder[d, x]), x, piece[x], C + j, END)


@dataclass(frozen=True)
class _Breakdown:
    """A collective the generator implements: what each phase does (for comments and summaries)
    and the function that builds it."""

    phases: tuple[str, str, str]
    build: Callable[[_Build], None]


_BREAKDOWNS: dict[Collective, _Breakdown] = {
    Collective.ALLGATHER: _Breakdown(
        ("intra-cluster AllGather of the cluster's own chunks",
         "cluster ring copy between border ranks (c2cCpy)",
         "intra-cluster Broadcast of received chunks from their border rank"), _build_allgather),
    Collective.REDUCESCATTER: _Breakdown(
        ("intra-cluster Reduce of other clusters' chunks to border ranks",
         "cluster ring ReduceScatter between border ranks (c2cRed)",
         "intra-cluster ReduceScatter of the cluster's own chunks"), _build_reducescatter),
    Collective.ALLREDUCE: _Breakdown(
        ("intra-cluster Reduce of every chunk to a border rank",
         "cluster ring ReduceScatter (c2cRed) then AllGather (c2cCpy) between border ranks",
         "intra-cluster Broadcast of every chunk from its border rank"), _build_allreduce),
    Collective.BROADCAST: _Breakdown(
        ("intra-cluster Broadcast from the root in the root's cluster",
         "cluster ring copy from the root's cluster between border ranks (c2cCpy)",
         "intra-cluster Broadcast of received chunks from their border rank"), _build_broadcast),
    Collective.REDUCE: _Breakdown(
        ("intra-cluster Reduce of every chunk to a border rank (clusters other than the root's)",
         "cluster ring reduction towards the root's cluster between border ranks (c2cRed)",
         "intra-cluster Reduce onto the root in the root's cluster"), _build_reduce),
}


def _check_breakdowns() -> tuple[str, ...]:
    """The collectives :data:`_BREAKDOWNS` implements, each checked against its spec: a known
    collective, not blockwise (AllToAll has its own generator, :mod:`.c2c_alltoall`), a rooted one
    exactly where the spec has a root, three phases."""
    for coll, bd in _BREAKDOWNS.items():
        spec = SPECS.get(coll.value)
        if spec is None or spec.blockwise or len(bd.phases) != len(PHASES):
            raise ValueError(f"c2c: the breakdown of {coll.value} does not fit its spec")
        if (bd.build in (_build_broadcast, _build_reduce)) != spec.rooted:
            raise ValueError(f"c2c: the breakdown of {coll.value} disagrees with its spec on a root")
    return tuple(c.value for c in _BREAKDOWNS)


#: collectives ``hccc gen c2c`` knows: those :data:`_BREAKDOWNS` implements
COLLECTIVES = _check_breakdowns()


def plan_c2c(topology: Topology, collective: str | Collective, *, pipeline: int = 1, intra: str = "ring",
             hier: Hierarchy | None = None, root: int | None = None, name: str | None = None) -> C2CPlan:
    """Generate the C2C algorithm of ``collective`` for ``topology`` (see the module docstring).

    ``hier`` defaults to :func:`hccc.compiler.cluster.hierarchy.hierarchy` of the topology. ``root`` is for
    broadcast / reduce (default 0). Raises :class:`C2CError` when a cluster has no border rank, a
    cluster has no ring over its links, or a needed link does not exist.
    """
    text = str(getattr(collective, "value", collective)).strip().lower()
    coll = collective if isinstance(collective, Collective) else Collective.parse(text)
    if coll is None or coll.value not in COLLECTIVES:
        raise C2CError(f"unknown collective '{collective}' (expected one of {', '.join(COLLECTIVES)}; "
                       f"AllToAll: hccc.compiler.cluster.c2c_alltoall)")
    if root is not None and not coll.rooted:
        raise C2CError(f"a root applies to broadcast and reduce, not {coll.value}")
    R = int(root or 0)
    if not 0 <= R < topology.nranks:
        raise C2CError(f"root {R} is not a rank of '{topology.name}' (ranks 0..{topology.nranks - 1})")
    if intra not in INTRA_ALGORITHMS:
        raise C2CError(f"unknown intra-cluster algorithm '{intra}' (expected ring or mesh)")
    if int(pipeline) < 1:
        raise C2CError(f"the pipeline depth must be at least 1, got {pipeline}")
    hier = hier if hier is not None else build_hierarchy(topology)
    if hier.nranks != topology.nranks:
        raise C2CError("the hierarchy does not belong to this topology")
    G = topology.nranks
    C = hier.nclusters
    mesh = intra == "mesh"
    clusters = hier.clusters
    for c in clusters:
        if C > 1 and not c.border_ranks:
            raise C2CError(f"cluster {c.name} (ranks {rank_ranges(c.ranks)}) has no border rank: no NIC and no "
                           f"link to another cluster")
    rings = tuple((_ring_order(topology, c.ranks, f"cluster {c.name}") if not mesh else tuple(c.ranks))
                  for c in clusters)
    rc = hier.rank_cluster

    b = _Build(clusters, rings, mesh, rc, pipeline, R)
    _BREAKDOWNS[coll].build(b)
    holder, block, piece, k = b.holder, b.block, b.piece, b.k

    src, dst, chunk, op, pc, stage, sub, phase = b.rows.arrays()
    step, lengths = _stage_steps(pc, stage, sub, k)
    # every transfer must ride an existing link
    ps, pd = topology.pairs()
    have = np.sort(ps.astype(np.int64) * G + pd)
    want = src * G + dst
    if len(want):
        j = np.searchsorted(have, want)
        ok = (j < len(have)) & (have[np.minimum(j, max(len(have) - 1, 0))] == want) if len(have) else \
            np.zeros(len(want), dtype=bool)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            s_, d_ = int(src[bad]), int(dst[bad])
            where = "between clusters" if rc[s_] != rc[d_] else f"inside cluster {clusters[int(rc[s_])].name}"
            raise C2CError(f"the C2C {coll.dsl_name} needs a link from rank {s_} to rank {d_} ({where}), "
                           f"which the cluster description does not have")
    nm = _sanitize(name if name else f"c2c_{coll.value}_{topology.name}")
    return C2CPlan(topology=topology, hierarchy=hier, collective=coll, intra=intra, pieces=k,
                   pieces_requested=int(pipeline), rings=rings, holder=holder, piece_of=piece,
                   block_of=block, src=src, dst=dst, step=step, chunk=chunk, op=op, piece=pc, stage=stage,
                   phase=phase, stage_lengths=lengths, name=nm, root=R if coll.rooted else 0)


def c2c_algorithm(topology: Topology, collective: str | Collective, **kwargs) -> Algorithm:
    """:func:`plan_c2c` as an :class:`Algorithm`."""
    return plan_c2c(topology, collective, **kwargs).algorithm()


def c2c_rccl(topology: Topology, collective: str | Collective, **kwargs) -> str:
    """:func:`plan_c2c` as ResCCLang text."""
    return plan_c2c(topology, collective, **kwargs).rccl()
