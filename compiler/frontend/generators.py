"""Algorithm generators: classic and hierarchical collective algorithms, as Algorithms and as .rccl text.

Every family has two forms that describe the same transfer set:

* a builder (``ring_allgather(8)``) returning an :class:`Algorithm` (columns built with numpy, so
  the 1,024-GPU HM AllReduce with 2,095,104 transfers takes well under a second);
* a text generator (``ring_allgather_rccl(8)``) returning idiomatic ResCCLang source with loops,
  which ``examples/generate.py`` writes to ``examples/*.rccl``.

Rank ``G*n + r`` is GPU ``r`` of node ``n`` in the hierarchical (HM) algorithms. Step numbers
follow the data model of :mod:`hccc.compiler.frontend.algorithm`; every generated algorithm verifies (see tests/test_generators.py).
"""
from __future__ import annotations

from typing import Sequence

import networkx as nx
import numpy as np

from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header

__all__ = [
    "full_mesh_rows", "direct_allgather", "direct_reducescatter", "direct_allreduce",
    "ring_allgather", "ring_reducescatter", "ring_allreduce",
    "recursive_doubling_allgather", "tree_allgather", "tree_reducescatter", "tree_allreduce",
    "hm_allgather", "hm_reducescatter", "hm_allreduce", "reversed_allgather", "hm_reversed_reducescatter",
    "ring_broadcast", "ring_reduce", "tree_broadcast", "tree_reduce", "direct_broadcast", "direct_reduce",
    "ring_gather", "tree_gather", "direct_gather", "ring_gather_rccl",
    "ring_scatter", "tree_scatter", "direct_scatter", "binomial_tree", "ring_scatter_rccl",
    "split_chunks", "ring_broadcast_rccl", "ring_reduce_rccl",
    "ring_allgather_rccl", "ring_reducescatter_rccl", "ring_allreduce_rccl", "direct_allgather_rccl", "direct_allreduce_rccl",
    "recursive_doubling_allgather_rccl", "hm_allgather_rccl", "hm_allreduce_rccl",
    "direct_alltoall", "ring_alltoall", "hierarchical_alltoall",
    "direct_alltoall_rccl", "ring_alltoall_rccl", "hierarchical_alltoall_rccl",
    "direct_sendrecv", "ring_sendrecv", "ring_sendrecv_rccl",
    "EXAMPLES",
]

_I64 = np.int64


# ====================================================================== helpers
def _algorithm(header: Header, cols: np.ndarray) -> Algorithm:
    """Algorithm from an ``(n, 5)`` int array of ``(src, dst, step, chunk, op)`` rows.

    Same result as :meth:`Algorithm.from_rows` (one anonymous site), without the per-row Python
    conversion that would dominate for millions of rows.
    """
    cols = np.asarray(cols, dtype=_I64).reshape(-1, 5)
    if len(cols) < 4096:
        return Algorithm.from_rows(header, cols.tolist())
    alg = Algorithm.from_rows(header, [])
    n = len(cols)
    return Algorithm(header=header, src=cols[:, 0].copy(), dst=cols[:, 1].copy(), step=cols[:, 2].copy(),
                     chunk=cols[:, 3].copy(), op=cols[:, 4].astype(np.uint8), site=np.zeros(n, dtype=_I64),
                     sites=alg.sites, loop_values=[np.zeros((n, 0), dtype=_I64)])


def _rows(*cols) -> np.ndarray:
    b = np.broadcast_arrays(*[np.asarray(c, dtype=_I64) for c in cols])
    return np.stack([x.ravel() for x in b], axis=1)


def _header(n: int, coll: Collective, name: str, gpn: int | None = None, nic: int | None = None,
            nchannels: int = 1, nwarps: int = 16, root: int = 0, chunks_per_rank: int = 1) -> Header:
    return Header(nranks=n, collective=coll, name=name, nchannels=nchannels, nwarps=nwarps,
                  gpu_per_node=n if gpn is None else gpn, nic_per_node=1 if nic is None else nic,
                  root=root, chunks_per_rank=chunks_per_rank)


def _check_root(n: int, root: int, chunks_per_rank: int, what: str = "root") -> None:
    """The rank count, the collective's rank parameter (a root, SendRecv's shift) and the chunks
    per rank a generator is given."""
    if n < 1:
        raise ValueError("need at least one rank")
    if not 0 <= root < n:
        raise ValueError(f"{what} {root} is out of range for {n} ranks (0..{n - 1})")
    if chunks_per_rank < 1:
        raise ValueError("chunks_per_rank must be at least 1")


def _check_order(n: int, order: Sequence[int] | None) -> np.ndarray:
    if n < 1:
        raise ValueError("need at least one rank")
    p = np.arange(n, dtype=_I64) if order is None else np.asarray(list(order), dtype=_I64)
    if sorted(p.tolist()) != list(range(n)):
        raise ValueError(f"ring order must be a permutation of 0..{n - 1}")
    return p


def _check_hm(nnodes: int, g: int) -> None:
    if nnodes < 1 or g < 1:
        raise ValueError("HM needs nNodes >= 1 and G >= 1")


# ====================================================================== full mesh
def full_mesh_rows(group: Sequence[int], chunk: str, step0: int, op: int, *, stagger: bool) -> np.ndarray:
    """The full-mesh building block: every member of ``group`` sends to every other member.

    ``chunk="src"`` sends the sender's own chunk (id = sender rank; AllGather-style),
    ``chunk="dst"`` sends the receiver's chunk (id = receiver rank; ReduceScatter-style).
    With ``stagger`` the member at position ``i`` reaches position ``(i + o + 1) % m`` at step
    ``step0 + o`` (each member receives from exactly one peer per step, which ``rrc`` needs);
    without it everything happens at ``step0``. Returns ``(src, dst, step, chunk, op)`` rows.
    """
    g = np.asarray(list(group), dtype=_I64)
    m = len(g)
    if m < 2:
        return np.zeros((0, 5), dtype=_I64)
    i = np.arange(m, dtype=_I64)[:, None]
    o = np.arange(m - 1, dtype=_I64)[None, :]
    s = g[np.broadcast_to(i, (m, m - 1))]
    d = g[(i + o + 1) % m]
    t = step0 + (o if stagger else 0 * o)
    c = s if chunk == "src" else d
    return _rows(s, d, t + 0 * s, c, op)


def direct_allgather(n: int, *, name: str = "direct_allgather") -> Algorithm:
    """One-step full-mesh AllGather: every rank sends its chunk to every other rank at step 0.

    The one-shot AllGather: one dependent hop whatever ``n`` (the ring takes ``n-1``, recursive
    doubling ``log2(n)``); the built-in catalog's small AllGather within a node."""
    return _algorithm(_header(n, Collective.ALLGATHER, name),
                      full_mesh_rows(range(n), "src", 0, RECV, stagger=False))


def direct_reducescatter(n: int, *, name: str = "direct_reducescatter") -> Algorithm:
    """Full-mesh ReduceScatter: at step ``o`` rank ``s`` reduces chunk ``d = (s+o+1)%n`` into ``d``."""
    return _algorithm(_header(n, Collective.REDUCESCATTER, name),
                      full_mesh_rows(range(n), "dst", 0, RRC, stagger=True))


def direct_allreduce(n: int, *, name: str = "direct_allreduce") -> Algorithm:
    """Full-mesh ReduceScatter (steps 0..n-2) then one-step full-mesh AllGather (step n-1).

    ``n`` dependent hops (``n-1`` reductions into each chunk's owner, then one copy out; the ring
    takes ``2(n-1)``); the built-in catalog's small AllReduce within a node. A one-shot AllReduce
    (one hop: every rank sends its whole input to every peer and adds the ``n`` copies itself) is
    no transfer program: a ``(rank, chunk)`` is one cell, holding the rank's input and its result
    at once, with no scratch copy for a peer's contribution to land in; an ``rrc`` adds one peer's
    cell into it, two in one step race, and a cell written in a step may not be read in it, so the
    rank's own contribution cannot leave while it accumulates the others'. Every reduction of the
    contributions into one cell is a dependent hop of its own: ``n-1`` of them here, in the least
    units (a binomial tree per chunk takes ``ceil(log2(n))`` reduction steps but more units on its
    path, and the kernel cost model puts it behind this program on 4 to 16 ranks)."""
    rs = full_mesh_rows(range(n), "dst", 0, RRC, stagger=True)
    ag = full_mesh_rows(range(n), "src", max(n - 1, 0), RECV, stagger=False)
    return _algorithm(_header(n, Collective.ALLREDUCE, name), np.concatenate([rs, ag]))


# ====================================================================== rings
def _ring_ag_rows(p: np.ndarray, step0: int) -> np.ndarray:
    n = len(p)
    i = np.arange(n, dtype=_I64)[None, :]
    k = np.arange(n - 1, dtype=_I64)[:, None]
    return _rows(p[i + 0 * k], p[(i + 1) % n + 0 * k], step0 + k + 0 * i, p[(i - k) % n], RECV)


def _ring_rs_rows(p: np.ndarray, step0: int) -> np.ndarray:
    n = len(p)
    i = np.arange(n, dtype=_I64)[None, :]
    k = np.arange(n - 1, dtype=_I64)[:, None]
    return _rows(p[i + 0 * k], p[(i + 1) % n + 0 * k], step0 + k + 0 * i, p[(i - k - 1) % n], RRC)


def ring_allgather(n: int, order: Sequence[int] | None = None, *, name: str = "ring_allgather") -> Algorithm:
    """NCCL-style ring AllGather over ``order`` (default ``0..n-1``).

    At step ``k`` (0..n-2) the rank at ring position ``i`` forwards chunk ``order[(i-k) % n]`` to
    the next rank on the ring (``recv``). ``n*(n-1)`` transfers, ``n-1`` steps.
    """
    p = _check_order(n, order)
    return _algorithm(_header(n, Collective.ALLGATHER, name), _ring_ag_rows(p, 0))


def ring_reducescatter(n: int, order: Sequence[int] | None = None, *,
                       name: str = "ring_reducescatter") -> Algorithm:
    """NCCL-style ring ReduceScatter over ``order``.

    At step ``k`` (0..n-2) ring position ``i`` reduces chunk ``order[(i-k-1) % n]`` into the next
    rank (``rrc``); chunk ``order[j]`` ends complete on rank ``order[j]``.
    """
    p = _check_order(n, order)
    return _algorithm(_header(n, Collective.REDUCESCATTER, name), _ring_rs_rows(p, 0))


def ring_allreduce(n: int, order: Sequence[int] | None = None, *, name: str = "ring_allreduce") -> Algorithm:
    """NCCL-style ring AllReduce: ring ReduceScatter (steps 0..n-2) then ring AllGather (n-1..2n-3)."""
    p = _check_order(n, order)
    rows = np.concatenate([_ring_rs_rows(p, 0), _ring_ag_rows(p, n - 1)])
    return _algorithm(_header(n, Collective.ALLREDUCE, name), rows)


# ====================================================================== recursive doubling
def recursive_doubling_allgather(n: int, *, name: str = "recursive_doubling_allgather") -> Algorithm:
    """Recursive-doubling AllGather (``n`` a power of two).

    At step ``k`` rank ``s`` sends its block of ``2**k`` chunks (``(s >> k) << k`` onwards) to
    ``s xor 2**k``. ``log2(n)`` steps, ``n*(n-1)`` transfers.
    """
    if n < 1 or n & (n - 1):
        raise ValueError("recursive doubling needs a power-of-two number of ranks")
    parts = []
    s = np.arange(n, dtype=_I64)[:, None]
    k = 0
    while (1 << k) < n:
        h = 1 << k
        j = np.arange(h, dtype=_I64)[None, :]
        parts.append(_rows(s + 0 * j, (s ^ h) + 0 * j, k, (s >> k << k) + j, RECV))
        k += 1
    rows = np.concatenate(parts) if parts else np.zeros((0, 5), dtype=_I64)
    return _algorithm(_header(n, Collective.ALLGATHER, name), rows)


# ====================================================================== trees
def _tree_adjacency(n: int, edges: Sequence[tuple[int, int]]) -> nx.Graph:
    """The tree as a networkx graph whose every adjacency lists neighbours in ascending order (so
    traversals are deterministic)."""
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        nbrs[a].append(b)
        nbrs[b].append(a)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for u in range(n):
        g.add_edges_from((u, v) for v in sorted(nbrs[u]))
    return g


def _check_tree(n: int, edges) -> nx.Graph:
    edges = [(int(a), int(b)) for a, b in edges]
    if len(edges) != n - 1 or any(not (0 <= a < n and 0 <= b < n) or a == b for a, b in edges):
        raise ValueError("a spanning tree over n ranks has n-1 edges between distinct ranks")
    g = _tree_adjacency(n, edges)
    if not nx.is_tree(g):
        raise ValueError("edges do not form a spanning tree")
    return g


def _bfs(tree: nx.Graph, root: int) -> list[tuple[int, int, int]]:
    """(parent, child, depth-of-child) in BFS order from ``root``."""
    depth = {root: 0}
    out = []
    for u, v in nx.bfs_edges(tree, root):
        depth[v] = depth[u] + 1
        out.append((u, v, depth[v]))
    return out


def _postorder_edges(tree: nx.Graph, root: int) -> list[tuple[int, int]]:
    """(child, parent) edges in post-order of the tree rooted at ``root`` (children before parents)."""
    parent = nx.dfs_predecessors(tree, root)
    return [(u, parent[u]) for u in nx.dfs_postorder_nodes(tree, root) if u != root]


def _tree_ag_rows(adj, n: int, step0: int) -> list[tuple[int, int, int, int, int]]:
    return [(u, v, step0 + dep - 1, c, RECV) for c in range(n) for (u, v, dep) in _bfs(adj, c)]


def _tree_rs_rows(adj, n: int) -> list[tuple[int, int, int, int, int]]:
    return [(u, p, t, c, RRC) for c in range(n) for t, (u, p) in enumerate(_postorder_edges(adj, c))]


def tree_allgather(n: int, edges: Sequence[tuple[int, int]], *, name: str = "tree_allgather") -> Algorithm:
    """AllGather by broadcasting every chunk ``c`` from rank ``c`` down the spanning tree ``edges``
    (re-rooted at ``c``); a rank at depth ``h`` receives chunk ``c`` at step ``h-1``."""
    adj = _check_tree(n, edges)
    return _algorithm(_header(n, Collective.ALLGATHER, name), np.asarray(_tree_ag_rows(adj, n, 0), _I64))


def tree_reducescatter(n: int, edges: Sequence[tuple[int, int]], *,
                       name: str = "tree_reducescatter") -> Algorithm:
    """ReduceScatter by reducing every chunk ``c`` up the tree rooted at ``c``: the tree's edges in
    post-order, one step each (children before parents, one reduction into a rank per step)."""
    adj = _check_tree(n, edges)
    return _algorithm(_header(n, Collective.REDUCESCATTER, name), np.asarray(_tree_rs_rows(adj, n), _I64))


def tree_allreduce(n: int, edges: Sequence[tuple[int, int]], *, name: str = "tree_allreduce") -> Algorithm:
    """Tree ReduceScatter (steps 0..n-2) then tree AllGather (from step n-1)."""
    adj = _check_tree(n, edges)
    rows = _tree_rs_rows(adj, n) + _tree_ag_rows(adj, n, max(n - 1, 0))
    return _algorithm(_header(n, Collective.ALLREDUCE, name), np.asarray(rows, _I64))


# ====================================================================== rooted (Broadcast, Reduce)
def _chain(n: int, root: int, order: Sequence[int] | None) -> np.ndarray:
    """The ring order rotated so that it starts at ``root``."""
    p = _check_order(n, order)
    i = int(np.flatnonzero(p == root)[0])
    return np.roll(p, -i)


def ring_broadcast(n: int, root: int = 0, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                   name: str = "ring_broadcast") -> Algorithm:
    """Pipelined chain Broadcast: the ring ``order`` opened at ``root``; chunk ``c`` crosses hop
    ``k`` (``0..n-2``) at step ``c + k``, so every hop carries one chunk per step."""
    _check_root(n, root, chunks_per_rank)
    p = _chain(n, root, order)
    C = n * chunks_per_rank
    c = np.arange(C, dtype=_I64)[:, None]
    k = np.arange(n - 1, dtype=_I64)[None, :]
    rows = _rows(p[k + 0 * c], p[k + 1 + 0 * c], c + k, c + 0 * k, RECV)
    return _algorithm(_header(n, Collective.BROADCAST, name, root=root, chunks_per_rank=chunks_per_rank), rows)


def ring_reduce(n: int, root: int = 0, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                name: str = "ring_reduce") -> Algorithm:
    """Pipelined chain Reduce: the ring ``order`` ending at ``root``; chunk ``c`` is reduced along
    hop ``k`` at step ``c + k`` and arrives complete at the root."""
    _check_root(n, root, chunks_per_rank)
    p = np.roll(_chain(n, root, order), -1)   # the ring from the root's successor, root last
    C = n * chunks_per_rank
    c = np.arange(C, dtype=_I64)[:, None]
    k = np.arange(n - 1, dtype=_I64)[None, :]
    rows = _rows(p[k + 0 * c], p[k + 1 + 0 * c], c + k, c + 0 * k, RRC)
    return _algorithm(_header(n, Collective.REDUCE, name, root=root, chunks_per_rank=chunks_per_rank), rows)


def tree_broadcast(n: int, edges: Sequence[tuple[int, int]], root: int = 0, *, chunks_per_rank: int = 1,
                   name: str = "tree_broadcast") -> Algorithm:
    """Pipelined tree Broadcast down the spanning tree ``edges`` rooted at ``root``: a rank at depth
    ``h`` receives chunk ``c`` at step ``c + h - 1``."""
    _check_root(n, root, chunks_per_rank)
    adj = _check_tree(n, edges)
    C = n * chunks_per_rank
    rows = [(u, v, c + d - 1, c, RECV) for c in range(C) for (u, v, d) in _bfs(adj, root)]
    return _algorithm(_header(n, Collective.BROADCAST, name, root=root, chunks_per_rank=chunks_per_rank),
                      np.asarray(rows, _I64).reshape(-1, 5))


def tree_reduce(n: int, edges: Sequence[tuple[int, int]], root: int = 0, *, chunks_per_rank: int = 1,
                name: str = "tree_reduce") -> Algorithm:
    """Pipelined tree Reduce up the tree rooted at ``root``: chunk ``c`` crosses the ``t``-th edge
    of the post-order (children before parents) at step ``c + t``."""
    _check_root(n, root, chunks_per_rank)
    adj = _check_tree(n, edges)
    C = n * chunks_per_rank
    post = _postorder_edges(adj, root)
    rows = [(u, q, c + t, c, RRC) for c in range(C) for t, (u, q) in enumerate(post)]
    return _algorithm(_header(n, Collective.REDUCE, name, root=root, chunks_per_rank=chunks_per_rank),
                      np.asarray(rows, _I64).reshape(-1, 5))


def direct_broadcast(n: int, root: int = 0, *, chunks_per_rank: int = 1,
                     name: str = "direct_broadcast") -> Algorithm:
    """One-step Broadcast: the root sends every chunk to every other rank at step 0."""
    _check_root(n, root, chunks_per_rank)
    C = n * chunks_per_rank
    d = np.array([r for r in range(n) if r != root], dtype=_I64)[:, None]
    c = np.arange(C, dtype=_I64)[None, :]
    return _algorithm(_header(n, Collective.BROADCAST, name, root=root, chunks_per_rank=chunks_per_rank),
                      _rows(root, d + 0 * c, 0, c + 0 * d, RECV))


def direct_reduce(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "direct_reduce") -> Algorithm:
    """Full-mesh Reduce: at step ``j`` the ``j``-th non-root rank reduces every chunk into the root
    (one reduction into each of the root's chunks per step)."""
    _check_root(n, root, chunks_per_rank)
    C = n * chunks_per_rank
    others = np.array([r for r in range(n) if r != root], dtype=_I64)
    j = np.arange(len(others), dtype=_I64)[:, None]
    c = np.arange(C, dtype=_I64)[None, :]
    return _algorithm(_header(n, Collective.REDUCE, name, root=root, chunks_per_rank=chunks_per_rank),
                      _rows(others[j] + 0 * c, root, j + 0 * c, c + 0 * j, RRC))


def ring_gather(n: int, root: int = 0, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                name: str = "ring_gather") -> Algorithm:
    """Chain Gather: the ring ``order`` from the root's successor, ending at ``root``; every rank
    forwards what it has towards the root, chunk ``j`` of each rank crossing hop ``h`` at step
    ``h + j`` (a rank's chunks join the chain at its own hop)."""
    _check_root(n, root, chunks_per_rank)
    p = np.roll(_chain(n, root, order), -1)   # root last
    K = chunks_per_rank
    rows = [(p[h], p[h + 1], h + j, p[i] * K + j, RECV)
            for i in range(n - 1) for h in range(i, n - 1) for j in range(K)]
    return _algorithm(_header(n, Collective.GATHER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def tree_gather(n: int, edges: Sequence[tuple[int, int]], root: int = 0, *, chunks_per_rank: int = 1,
                name: str = "tree_gather") -> Algorithm:
    """Tree Gather up the spanning tree ``edges`` rooted at ``root``: the ``t``-th edge of the
    post-order (children before parents) carries every chunk of the child's subtree at step ``t``."""
    _check_root(n, root, chunks_per_rank)
    adj = _check_tree(n, edges)
    K = chunks_per_rank
    post = _postorder_edges(adj, root)
    below: dict[int, list[int]] = {u: [u] for u in range(n)}   # the ranks of each subtree
    for u, q in post:                                         # children are complete first
        below[q] = below[q] + below[u]
    rows = [(u, q, t, w * K + j, RECV) for t, (u, q) in enumerate(post) for w in sorted(below[u])
            for j in range(K)]
    return _algorithm(_header(n, Collective.GATHER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def direct_gather(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "direct_gather") -> Algorithm:
    """One-step Gather: every other rank sends its chunks to the root at step 0."""
    _check_root(n, root, chunks_per_rank)
    K = chunks_per_rank
    rows = [(r, root, 0, r * K + j, RECV) for r in range(n) if r != root for j in range(K)]
    return _algorithm(_header(n, Collective.GATHER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def ring_gather_rccl(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "ring_gather") -> str:
    """ResCCLang text of :func:`ring_gather` (identity ring order, ending at the root)."""
    _check_root(n, root, chunks_per_rank)
    return (_rooted_head(n, Collective.GATHER, name, root, chunks_per_rank)
            + "    # chain ending at the root: the rank at position i (Root + 1 + i) sends its chunks,\n"
            + "    # hop h (from Root + 1 + h) forwards chunk j of every rank at step h + j\n"
            + "    for i in range(0, nRanks - 1):\n"
            + "        for h in range(i, nRanks - 1):\n"
            + "            for j in range(0, nChunksPerRank):\n"
            + "                transfer((Root + 1 + h) % nRanks, (Root + 2 + h) % nRanks, h + j, "
              "((Root + 1 + i) % nRanks) * nChunksPerRank + j, recv)\n")


def ring_scatter(n: int, root: int = 0, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                 name: str = "ring_scatter") -> Algorithm:
    """Chain Scatter: the ring ``order`` opened at ``root``; the root sends the chunks of every
    other rank down the chain, chunk ``j`` of the rank at position ``i`` crossing hop ``h``
    (``0..i-1``, from position ``h`` to ``h + 1``) at step ``h + j`` (Gather's chain, reversed)."""
    _check_root(n, root, chunks_per_rank)
    p = _chain(n, root, order)   # root first
    K = chunks_per_rank
    rows = [(p[h], p[h + 1], h + j, p[i] * K + j, RECV)
            for i in range(1, n) for h in range(i) for j in range(K)]
    return _algorithm(_header(n, Collective.SCATTER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def tree_scatter(n: int, edges: Sequence[tuple[int, int]], root: int = 0, *, chunks_per_rank: int = 1,
                 name: str = "tree_scatter") -> Algorithm:
    """Tree Scatter down the spanning tree ``edges`` rooted at ``root``: the edge into a rank at
    depth ``d`` carries the chunks of every rank of its subtree at step ``d - 1``."""
    _check_root(n, root, chunks_per_rank)
    adj = _check_tree(n, edges)
    K = chunks_per_rank
    below: dict[int, list[int]] = {u: [u] for u in range(n)}   # the ranks of each subtree
    for u, q in _postorder_edges(adj, root):                  # children are complete first
        below[q] = below[q] + below[u]
    rows = [(u, v, d - 1, w * K + j, RECV) for (u, v, d) in _bfs(adj, root) for w in sorted(below[v])
            for j in range(K)]
    return _algorithm(_header(n, Collective.SCATTER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def direct_scatter(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "direct_scatter") -> Algorithm:
    """Linear Scatter: the root sends every other rank its chunks at step 0."""
    _check_root(n, root, chunks_per_rank)
    K = chunks_per_rank
    rows = [(root, r, 0, r * K + j, RECV) for r in range(n) if r != root for j in range(K)]
    return _algorithm(_header(n, Collective.SCATTER, name, root=root, chunks_per_rank=K),
                      np.asarray(rows, _I64).reshape(-1, 5))


def binomial_tree(n: int, root: int = 0) -> list[tuple[int, int]]:
    """The binomial spanning tree rooted at ``root`` as ``(parent, child)`` edges: the rank at
    distance ``v`` (``1..n-1``) after the root hangs under the one at ``v`` with its highest set bit
    cleared, so it lies as many edges deep as ``v`` has set bits, at most ``ceil(log2 n)`` (the tree
    of MPI's binomial broadcast and scatter; for :func:`tree_scatter` and the other tree builders)."""
    _check_root(n, root, 1)
    return [((root + (v & ~(1 << (v.bit_length() - 1)))) % n, (root + v) % n) for v in range(1, n)]


def ring_scatter_rccl(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "ring_scatter") -> str:
    """ResCCLang text of :func:`ring_scatter` (identity ring order, opened at the root)."""
    _check_root(n, root, chunks_per_rank)
    return (_rooted_head(n, Collective.SCATTER, name, root, chunks_per_rank)
            + "    # chain from the root: chunk j of the rank at position i (Root + i) crosses\n"
            + "    # hop h (from Root + h) at step h + j\n"
            + "    for i in range(1, nRanks):\n"
            + "        for h in range(0, i):\n"
            + "            for j in range(0, nChunksPerRank):\n"
            + "                transfer((Root + h) % nRanks, (Root + h + 1) % nRanks, h + j, "
              "((Root + i) % nRanks) * nChunksPerRank + j, recv)\n")


# ====================================================================== SendRecv

def direct_sendrecv(n: int, shift: int = 1, *, chunks_per_rank: int = 1,
                    name: str = "direct_sendrecv") -> Algorithm:
    """One-step SendRecv: every rank sends its chunks straight to the rank ``shift`` after it
    (no transfer at all for shift 0: every rank's output is its own input)."""
    _check_root(n, shift, chunks_per_rank, "shift")
    K = chunks_per_rank
    r = np.arange(n, dtype=_I64)[:, None] if shift else np.zeros((0, 1), _I64)
    j = np.arange(K, dtype=_I64)[None, :]
    return _algorithm(_header(n, Collective.SENDRECV, name, root=shift, chunks_per_rank=K),
                      _rows(r + 0 * j, (r + shift) % n + 0 * j, 0, r * K + j, RECV))


def ring_sendrecv(n: int, shift: int = 1, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                  name: str = "ring_sendrecv") -> Algorithm:
    """SendRecv along a ring: rank ``r``'s chunks travel forward along ``order`` from ``r`` to
    ``(r + shift) % n``, one hop a step, forwarded by every rank between (which keeps them in
    scratch); with ``order`` the identity, each part makes ``shift`` hops."""
    _check_root(n, shift, chunks_per_rank, "shift")
    p = _check_order(n, order)
    pos = np.empty(n, _I64)
    pos[p] = np.arange(n, dtype=_I64)
    K, rows = chunks_per_rank, []
    for r in range(n):
        hops = int((pos[(r + shift) % n] - pos[r]) % n)
        at = [int(p[(pos[r] + h) % n]) for h in range(hops + 1)]
        for h in range(hops):
            rows += [(at[h], at[h + 1], h, r * K + j, RECV) for j in range(K)]
    return _algorithm(_header(n, Collective.SENDRECV, name, root=shift, chunks_per_rank=K),
                      np.asarray(rows, dtype=_I64).reshape(-1, 5))


def split_chunks(alg: Algorithm, k: int) -> Algorithm:
    """The same algorithm over ``k`` times as many chunks: every transfer of chunk ``c`` becomes ``k``
    transfers of chunks ``c*k .. c*k+k-1`` at the same step. Rank ``r``'s chunks ``r*K..`` become
    ``r*K*k..``, so the result implements the same collective with ``chunks_per_rank * k``."""
    if k < 1:
        raise ValueError("k must be at least 1")
    h = alg.header
    j = np.arange(k, dtype=_I64)[None, :]
    rows = _rows(alg.src[:, None] + 0 * j, alg.dst[:, None] + 0 * j, alg.step[:, None] + 0 * j,
                 alg.chunk[:, None] * k + j, alg.op.astype(_I64)[:, None] + 0 * j)
    from dataclasses import replace
    return _algorithm(replace(h, chunks_per_rank=h.chunks_per_rank * k), rows)


# ====================================================================== hierarchical mesh (HM)
def _hm_grid(nnodes: int, g: int):
    nn = np.arange(nnodes, dtype=_I64)[:, None]
    rr = np.arange(g, dtype=_I64)[None, :]
    return (g * nn + rr).ravel()  # every rank, in (n, r) order


def _hm_phase1(nnodes: int, g: int) -> np.ndarray:
    """Intra-node full-mesh ReduceScatter: rank (n, r) reduces chunks d + G*b into local peer d
    = (r+o+1) % G at step b*(G-1)+o."""
    s = _hm_grid(nnodes, g)[:, None, None]
    b = np.arange(nnodes, dtype=_I64)[None, :, None]
    o = np.arange(g - 1, dtype=_I64)[None, None, :]
    r = s % g
    d = (r + o + 1) % g
    return _rows(s, s - r + d, b * (g - 1) + o, d + g * b, RRC)


def _hm_ring(nnodes: int, g: int, step0: int, chunk_shift: int, op: int) -> np.ndarray:
    """Inter-node ring over ring-aligned peers: for k in 0..nNodes-2, rank s sends chunk
    (s - (k + chunk_shift)*G) mod N to (s + G) mod N at step step0 + k."""
    n = nnodes * g
    s = _hm_grid(nnodes, g)[:, None]
    k = np.arange(nnodes - 1, dtype=_I64)[None, :]
    return _rows(s, (s + g) % n, step0 + k, (s - (k + chunk_shift) * g) % n, op)


def _hm_intra_ag(nnodes: int, g: int, step0: int) -> np.ndarray:
    """Intra-node full-mesh AllGather: for b in 0..nNodes-1, rank s sends chunk (s + b*G) mod N to
    every local peer at step step0 + b."""
    n = nnodes * g
    s = _hm_grid(nnodes, g)[:, None, None]
    b = np.arange(nnodes, dtype=_I64)[None, :, None]
    o = np.arange(g - 1, dtype=_I64)[None, None, :]
    r = s % g
    return _rows(s, s - r + (r + o + 1) % g, step0 + b, (s + b * g) % n, RECV)


def hm_allreduce(nnodes: int, g: int, *, name: str | None = None) -> Algorithm:
    """HM AllReduce (ResCCL Appendix A) over ``nnodes`` nodes of ``g`` GPUs.

    Phases: intra full-mesh ReduceScatter (rrc, steps 0..nNodes*(G-1)-1), inter ring
    ReduceScatter (rrc), inter ring AllGather (recv), intra full-mesh AllGather (recv).
    ``2*N*(G-1)*nNodes + 2*N*(nNodes-1)`` transfers: 1,984 at 4x8, 2,095,104 at 128x8.
    """
    _check_hm(nnodes, g)
    n = nnodes * g
    base = nnodes * (g - 1)
    rows = np.concatenate([
        _hm_phase1(nnodes, g),
        _hm_ring(nnodes, g, base, 0, RRC),
        _hm_ring(nnodes, g, base + nnodes - 1, nnodes - 1, RECV),
        _hm_intra_ag(nnodes, g, base + 2 * nnodes - 2),
    ])
    return _algorithm(_header(n, Collective.ALLREDUCE, name or f"hm_allreduce_{nnodes}x{g}", g, g, 4, 16), rows)


def hm_reducescatter(nnodes: int, g: int, *, name: str | None = None) -> Algorithm:
    """HM ReduceScatter: HM AllReduce's first two phases, the ring shifted by one hop so that rank
    ``s`` (not ``s+G``) ends with chunk ``s`` complete (ring chunk (s - (k+1)*G) mod N at step k)."""
    _check_hm(nnodes, g)
    rows = np.concatenate([_hm_phase1(nnodes, g), _hm_ring(nnodes, g, nnodes * (g - 1), 1, RRC)])
    return _algorithm(_header(nnodes * g, Collective.REDUCESCATTER,
                              name or f"hm_reducescatter_{nnodes}x{g}", g, g, 4, 16), rows)


def hm_allgather(nnodes: int, g: int, *, name: str | None = None) -> Algorithm:
    """HM AllGather (ResCCL Appendix A): inter-node ring broadcast among ring-aligned peers plus
    intra-node full-mesh rebroadcast, pipelined.

    Ring: for k in 0..nNodes-2, rank s forwards chunk (s - k*G) mod N to (s+G) mod N at step k.
    Mesh: for t in 0..nNodes-1, rank s sends chunk (s - t*G) mod N (its own chunk for t = 0, the
    chunk the ring delivered at step t-1 otherwise) to every local peer at step t, alongside the
    ring forwarding of the same chunk. ``nNodes`` steps; every (rank, chunk) is written once.
    """
    _check_hm(nnodes, g)
    n = nnodes * g
    s = _hm_grid(nnodes, g)[:, None, None]
    t = np.arange(nnodes, dtype=_I64)[None, :, None]
    o = np.arange(g - 1, dtype=_I64)[None, None, :]
    r = s % g
    mesh = _rows(s, s - r + (r + o + 1) % g, t, (s - t * g) % n, RECV)
    rows = np.concatenate([_hm_ring(nnodes, g, 0, 0, RECV), mesh])
    return _algorithm(_header(n, Collective.ALLGATHER, name or f"hm_allgather_{nnodes}x{g}", g, g, 4, 16), rows)


def reversed_allgather(alg: Algorithm, *, name: str | None = None) -> Algorithm:
    """The ReduceScatter that is ``alg``'s time-reverse: every transfer of the AllGather ``alg``
    (receives only) turned around and made a reduce-receive (``rrc``), its step counted from the
    end. A chunk's AllGather tree out of its owner becomes an in-tree of partial sums into it, so
    rank ``r`` ends with chunks ``r*K..r*K+K-1`` reduced over every rank.

    Where the AllGather sends one chunk from a rank to several at one step (a fan-out), the
    reverse reduces several into one ``(rank, chunk)``: those are put one after another in steps
    of their own within the reversed step (nearest sender ``(src - dst) mod N`` first), since two
    writes of one element at one step race. A reversed step takes as many steps as its widest
    fan-in; the order of the reversed steps is kept."""
    h = alg.header
    if h.collective != Collective.ALLGATHER:
        raise ValueError(f"only an AllGather can be reversed into a ReduceScatter, not {h.collective.value}")
    if alg.ntransfers and np.any(alg.op != RECV):
        raise ValueError("an AllGather to reverse must have receives only (a reduce-receive has no reverse)")
    from dataclasses import replace
    n = h.nranks
    T = int(alg.step.max()) + 1 if alg.ntransfers else 0
    src, dst, back, chunk = (np.asarray(c, _I64) for c in (alg.dst, alg.src, T - 1 - alg.step, alg.chunk))
    order = np.lexsort(((src - dst) % n, chunk, dst, back))
    src, dst, back, chunk = src[order], dst[order], back[order], chunk[order]
    key = np.stack([back, dst, chunk], axis=1)
    first = np.ones(len(key), bool)
    first[1:] = np.any(key[1:] != key[:-1], axis=1)
    starts = np.flatnonzero(first)
    within = np.arange(len(key), dtype=_I64) - starts[np.cumsum(first) - 1]     # place in its fan-in
    width = np.zeros(T, _I64)
    np.maximum.at(width, back, within + 1)
    offset = np.concatenate([[0], np.cumsum(width)[:-1]]).astype(_I64)
    rows = _rows(src, dst, offset[back] + within, chunk, RRC) if len(key) else np.zeros((0, 5), _I64)
    return _algorithm(replace(h, collective=Collective.REDUCESCATTER,
                              name=name or f"{h.name}_reversed"), rows)


def hm_reversed_reducescatter(nnodes: int, g: int, *, name: str | None = None) -> Algorithm:
    """HM ReduceScatter as the time-reverse of :func:`hm_allgather` (:func:`reversed_allgather`):
    every ring-aligned peer's intra-node reductions and the inter-node ring's partial sums
    overlap, as the AllGather's ring and mesh do, where :func:`hm_reducescatter` runs its
    intra-node phase before its ring."""
    return reversed_allgather(hm_allgather(nnodes, g), name=name or f"hm_reversed_reducescatter_{nnodes}x{g}")


# ====================================================================== .rccl text
def _head(n: int, coll: Collective, name: str, gpn: int, nic: int, nchannels: int = 1, nwarps: int = 16) -> str:
    return (f'def ResCCLAlgo(nRanks={n}, nChannels={nchannels}, nWarps={nwarps}, AlgoName="{name}", '
            f'OpType="{coll.dsl_name}", GPUPerNode={gpn}, NICPerNode={nic}):\n')


def _ring_body(kind: str, n: int, order: Sequence[int] | None, step0: str) -> list[str]:
    """Loop (identity order) or unrolled lines (any other order) for one ring phase."""
    p = _check_order(n, order)
    if np.array_equal(p, np.arange(n)):
        if kind == "ag":
            return ["    for k in range(0, N - 1):",
                    "        for r in range(0, N):",
                    f"            transfer(r, (r + 1) % N, {step0}k, (r + N - k) % N, recv)"]
        return ["    for k in range(0, N - 1):",
                "        for r in range(0, N):",
                f"            transfer(r, (r + 1) % N, {step0}k, (r + 2 * N - k - 1) % N, rrc)"]
    rows = _ring_ag_rows(p, 0) if kind == "ag" else _ring_rs_rows(p, 0)
    lines = [f"    # ring order {' '.join(map(str, p.tolist()))} (no list type in ResCCLang: unrolled)"]
    for s, d, k, c, o in rows.tolist():
        lines.append(f"    transfer({s}, {d}, {step0}{k}, {c}, {'recv' if o == RECV else 'rrc'})")
    return lines


def ring_allgather_rccl(n: int, order: Sequence[int] | None = None, *, name: str = "ring_allgather") -> str:
    """ResCCLang text of :func:`ring_allgather`."""
    out = [_head(n, Collective.ALLGATHER, name, n, 1).rstrip("\n"), f"    N = {n}",
           "    # NCCL-style ring: at step k every rank forwards the chunk it received at step k-1"]
    out += _ring_body("ag", n, order, "")
    return "\n".join(out) + "\n"


def ring_reducescatter_rccl(n: int, order: Sequence[int] | None = None, *,
                            name: str = "ring_reducescatter") -> str:
    """ResCCLang text of :func:`ring_reducescatter`."""
    out = [_head(n, Collective.REDUCESCATTER, name, n, 1).rstrip("\n"), f"    N = {n}",
           "    # NCCL-style ring: chunk c starts at rank c+1 and ends, reduced over all ranks, at rank c"]
    out += _ring_body("rs", n, order, "")
    return "\n".join(out) + "\n"


def ring_allreduce_rccl(n: int, order: Sequence[int] | None = None, *, name: str = "ring_allreduce") -> str:
    """ResCCLang text of :func:`ring_allreduce`."""
    out = [_head(n, Collective.ALLREDUCE, name, n, 1).rstrip("\n"), f"    N = {n}",
           "    # phase 1: ring ReduceScatter (steps 0 .. N-2)"]
    out += _ring_body("rs", n, order, "")
    out += ["    # phase 2: ring AllGather of the reduced chunks (steps N-1 .. 2*N-3)",
            "    base = N - 1"]
    out += _ring_body("ag", n, order, "base + ")
    return "\n".join(out) + "\n"


def _rooted_head(n: int, coll: Collective, name: str, root: int, k: int) -> str:
    return (f'def ResCCLAlgo(nRanks={n}, nChannels=1, nWarps=16, AlgoName="{name}", '
            f'OpType="{coll.dsl_name}", Root={root}, nChunksPerRank={k}, GPUPerNode={n}, NICPerNode=1):\n')


def ring_broadcast_rccl(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "ring_broadcast") -> str:
    """ResCCLang text of :func:`ring_broadcast` (identity ring order)."""
    _check_root(n, root, chunks_per_rank)
    return (_rooted_head(n, Collective.BROADCAST, name, root, chunks_per_rank)
            + "    # pipelined chain from the root: chunk c crosses hop k at step c + k\n"
            + "    for c in range(0, nChunks):\n"
            + "        for k in range(0, nRanks - 1):\n"
            + "            transfer((Root + k) % nRanks, (Root + k + 1) % nRanks, c + k, c, recv)\n")


def ring_reduce_rccl(n: int, root: int = 0, *, chunks_per_rank: int = 1, name: str = "ring_reduce") -> str:
    """ResCCLang text of :func:`ring_reduce` (identity ring order, reduced towards the root)."""
    _check_root(n, root, chunks_per_rank)
    return (_rooted_head(n, Collective.REDUCE, name, root, chunks_per_rank)
            + "    # pipelined chain ending at the root: rank Root-1-k reduces into Root-k... at step c + k\n"
            + "    for c in range(0, nChunks):\n"
            + "        for k in range(0, nRanks - 1):\n"
            + "            transfer((Root + k + 1) % nRanks, (Root + k + 2) % nRanks, c + k, c, rrc)\n")


def direct_allgather_rccl(n: int, *, name: str = "direct_allgather") -> str:
    """ResCCLang text of :func:`direct_allgather`."""
    return (_head(n, Collective.ALLGATHER, name, n, 1)
            + f"    N = {n}\n"
            + "    # full mesh: every rank sends its own chunk to every other rank, all at step 0\n"
            + "    for r in range(0, N):\n"
            + "        for o in range(0, N - 1):\n"
            + "            transfer(r, (r + o + 1) % N, 0, r, recv)\n")


def direct_allreduce_rccl(n: int, *, name: str = "direct_allreduce") -> str:
    """ResCCLang text of :func:`direct_allreduce`."""
    return (_head(n, Collective.ALLREDUCE, name, n, 1)
            + f"    N = {n}\n"
            + "    # full-mesh ReduceScatter: at step o rank r reduces the chunk of rank (r + o + 1) % N into it\n"
            + "    for r in range(0, N):\n"
            + "        for o in range(0, N - 1):\n"
            + "            transfer(r, (r + o + 1) % N, o, (r + o + 1) % N, rrc)\n"
            + "    # then every rank sends its reduced chunk to every other rank, all at step N - 1\n"
            + "    for r in range(0, N):\n"
            + "        for o in range(0, N - 1):\n"
            + "            transfer(r, (r + o + 1) % N, N - 1, r, recv)\n")


def recursive_doubling_allgather_rccl(n: int, *, name: str = "recursive_doubling_allgather") -> str:
    """ResCCLang text of :func:`recursive_doubling_allgather` (one block per doubling step, since
    ResCCLang has no power or xor operator: ``s xor h`` is ``s + h - 2*h*((s/h) % 2)``)."""
    if n < 1 or n & (n - 1):
        raise ValueError("recursive doubling needs a power-of-two number of ranks")
    out = [_head(n, Collective.ALLGATHER, name, n, 1).rstrip("\n"), f"    N = {n}",
           "    # at step k rank s swaps its block of h = 2**k chunks with rank s xor h"]
    k = 0
    while (1 << k) < n:
        out += [f"    h = {1 << k}",
                "    for s in range(0, N):",
                "        for j in range(0, h):",
                f"            transfer(s, s + h - 2 * h * ((s / h) % 2), {k}, (s / h) * h + j, recv)"]
        k += 1
    return "\n".join(out) + "\n"


def hm_allreduce_rccl(nnodes: int, g: int, *, name: str | None = None) -> str:
    """ResCCLang text of :func:`hm_allreduce` (the ResCCL Fig. 16 program, reconstructed)."""
    _check_hm(nnodes, g)
    name = name or f"hm_allreduce_{nnodes}x{g}"
    return (_head(nnodes * g, Collective.ALLREDUCE, name, g, g, 4, 16)
            + f"    nNodes = {nnodes}\n"
            + f"    G = {g}\n"
            + "    N = nNodes * G\n"
            + "    # 1. intra-node ReduceScatter, full mesh: GPU r reduces chunks d + G*b into local peer d\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            for b in range(0, nNodes):\n"
            + "                for o in range(0, G - 1):\n"
            + "                    transfer(G*n + r, G*n + (r + o + 1) % G, b*(G - 1) + o, (r + o + 1) % G + G*b, rrc)\n"
            + "    # 2. inter-node ReduceScatter, ring over the GPUs with the same local id\n"
            + "    base = nNodes * (G - 1)\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            for k in range(0, nNodes - 1):\n"
            + "                transfer(G*n + r, (G*n + r + G) % N, base + k, (G*n + r + N - k*G) % N, rrc)\n"
            + "    # 3. inter-node AllGather on the same ring\n"
            + "    base = base + nNodes - 1\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            for k in range(0, nNodes - 1):\n"
            + "                transfer(G*n + r, (G*n + r + G) % N, base + k, (G*n + r + G + N - k*G) % N, recv)\n"
            + "    # 4. intra-node AllGather, full mesh: GPU r sends every chunk it owns to its local peers\n"
            + "    base = base + nNodes - 1\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            for b in range(0, nNodes):\n"
            + "                for o in range(0, G - 1):\n"
            + "                    transfer(G*n + r, G*n + (r + o + 1) % G, base + b, (G*n + r + b*G) % N, recv)\n")


def hm_allgather_rccl(nnodes: int, g: int, *, name: str | None = None) -> str:
    """ResCCLang text of :func:`hm_allgather`."""
    _check_hm(nnodes, g)
    name = name or f"hm_allgather_{nnodes}x{g}"
    return (_head(nnodes * g, Collective.ALLGATHER, name, g, g, 4, 16)
            + f"    nNodes = {nnodes}\n"
            + f"    G = {g}\n"
            + "    N = nNodes * G\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            # broadcast 1, inter-node: ring among the GPUs with the same local id;\n"
            + "            # at step k forward the chunk that arrived at step k-1 (own chunk at k = 0)\n"
            + "            for k in range(0, nNodes - 1):\n"
            + "                transfer(G*n + r, (G*n + r + G) % N, k, (G*n + r + N - k*G) % N, recv)\n"
            + "            # broadcast 1 and 2, intra-node full mesh: at step t send the same chunk to every\n"
            + "            # local peer (own chunk at t = 0, then each chunk the ring delivered)\n"
            + "            for t in range(0, nNodes):\n"
            + "                for o in range(0, G - 1):\n"
            + "                    transfer(G*n + r, G*n + (r + o + 1) % G, t, (G*n + r + N - t*G) % N, recv)\n")


# ====================================================================== AllToAll
# Chunk (i*N + j)*K + k is piece k of the block rank i sends to rank j (the AllToAll layout of :mod:`hccc.compiler.frontend.collectives`).
def direct_alltoall(n: int, *, chunks_per_rank: int = 1, name: str = "direct_alltoall") -> Algorithm:
    """All-pairs AllToAll: at step ``o - 1`` (``o = 1..n-1``) rank ``i`` sends its block for rank
    ``(i + o) % n`` straight there (every rank sends to one peer and receives from one per step)."""
    _check_root(n, 0, chunks_per_rank)
    K = chunks_per_rank
    i = np.arange(n, dtype=_I64)[:, None, None]
    o = np.arange(1, n, dtype=_I64)[None, :, None]
    k = np.arange(K, dtype=_I64)[None, None, :]
    j = (i + o) % n
    return _algorithm(_header(n, Collective.ALLTOALL, name, chunks_per_rank=K),
                      _rows(i + 0 * o + 0 * k, j + 0 * k, o - 1 + 0 * i + 0 * k, (i * n + j) * K + k, RECV))


def ring_alltoall(n: int, order: Sequence[int] | None = None, *, chunks_per_rank: int = 1,
                  name: str = "ring_alltoall") -> Algorithm:
    """Ring-relay AllToAll: every block travels forward along the ring ``order`` (default
    ``0..n-1``) from its source to its destination, ``d`` hops for a destination ``d`` places
    ahead; hop ``h`` happens at step ``h``, so at step ``h`` each rank forwards the ``n-1-h``
    blocks still in transit. Only neighbour links are used; intermediate ranks keep blocks in
    scratch."""
    p = _check_order(n, order)
    _check_root(n, 0, chunks_per_rank)
    K = chunks_per_rank
    rows = []
    for d in range(1, n):
        a = np.arange(n, dtype=_I64)[:, None, None]
        h = np.arange(d, dtype=_I64)[None, :, None]
        k = np.arange(K, dtype=_I64)[None, None, :]
        c = (p[a] * n + p[(a + d) % n]) * K + k
        rows.append(_rows(p[(a + h) % n] + 0 * k, p[(a + h + 1) % n] + 0 * k, h + 0 * a + 0 * k,
                          c + 0 * h, RECV))
    rows = np.concatenate(rows) if rows else np.zeros((0, 5), _I64)
    return _algorithm(_header(n, Collective.ALLTOALL, name, chunks_per_rank=K), rows)


def hierarchical_alltoall(nnodes: int, g: int, *, chunks_per_rank: int = 1,
                          name: str | None = None) -> Algorithm:
    """Two-step hierarchical AllToAll for ``nNodes x G`` ranks (rank ``G*n + r``), as RCCL's 2-D
    algorithms: every block crosses the network exactly once, and each inter-node link carries one
    aggregated exchange per node pair.

    1. intra-node AllToAll by local id: at step ``o - 1`` (``o = 1..G-1``) rank ``(n, r)`` sends
       every block it has for a rank with local id ``r' = (r + o) % G`` (on any node) to its local
       peer ``(n, r')`` (a block for ``(n, r')`` itself is then delivered);
    2. inter-node exchange among ranks with the same local id: at step ``G - 1 + q - 1``
       (``q = 1..nNodes-1``) rank ``(n, r')`` sends the ``G`` blocks node ``n`` has for rank
       ``(m, r')``, ``m = (n + q) % nNodes``, straight there.
    """
    _check_hm(nnodes, g)
    K = chunks_per_rank
    if K < 1:
        raise ValueError("chunks_per_rank must be at least 1")
    N = nnodes * g
    name = name or f"hierarchical_alltoall_{nnodes}x{g}"
    # rows in the order of the loops of :func:`hierarchical_alltoall_rccl` (the order is the
    # compiled program's: examples/hierarchical_alltoall_*.rccl are that text)
    # phase 1, axes (n, r, o, m, k): (n, r) -> (n, r2 = (r + o) % G), every block of (n, r) for (m, r2)
    nn, r, o, m, k = np.ix_(np.arange(nnodes), np.arange(g), np.arange(1, g), np.arange(nnodes), np.arange(K))
    r2 = (r + o) % g
    src = g * nn + r
    p1 = _rows(src, g * nn + r2, o - 1, (src * N + g * m + r2) * K + k, RECV)
    # phase 2, axes (n, s, q, r, k): (n, s) -> (m = (n + q) % nNodes, s), the G blocks of node n's ranks for (m, s)
    nn, s, q, r, k = np.ix_(np.arange(nnodes), np.arange(g), np.arange(1, nnodes), np.arange(g), np.arange(K))
    m = (nn + q) % nnodes
    p2 = _rows(g * nn + s, g * m + s, g - 2 + q, ((g * nn + r) * N + g * m + s) * K + k, RECV)
    rows = np.concatenate([p1, p2])
    return _algorithm(_header(N, Collective.ALLTOALL, name, gpn=g, nic=g, chunks_per_rank=K), rows)


def _k_loop(K: int, indent: str) -> tuple[str, str]:
    """``for k`` line and the chunk-id suffix for ``K`` pieces per block (nothing for ``K = 1``)."""
    if K == 1:
        return "", ""
    return f"{indent}for k in range(0, nChunksPerRank):\n", " * nChunksPerRank + k"


def _a2a_head(n: int, name: str, gpn: int, nic: int, K: int) -> str:
    extra = f", nChunksPerRank={K}" if K > 1 else ""
    return (f'def ResCCLAlgo(nRanks={n}, nChannels=1, nWarps=16, AlgoName="{name}", '
            f'OpType="Alltoall", GPUPerNode={gpn}, NICPerNode={nic}{extra}):\n')


def direct_alltoall_rccl(n: int, *, chunks_per_rank: int = 1, name: str = "direct_alltoall") -> str:
    """ResCCLang text of :func:`direct_alltoall`."""
    _check_root(n, 0, chunks_per_rank)
    kl, ks = _k_loop(chunks_per_rank, "            ")
    body = "                " if kl else "            "
    return (_a2a_head(n, name, n, 1, chunks_per_rank)
            + f"    N = {n}\n"
            + "    # chunk (i*N + j) is the block rank i sends to rank j; at step o-1 it goes straight there\n"
            + "    for i in range(0, N):\n"
            + "        for o in range(1, N):\n"
            + kl
            + f"{body}transfer(i, (i + o) % N, o - 1, (i * N + (i + o) % N){ks}, recv)\n")


def ring_alltoall_rccl(n: int, *, chunks_per_rank: int = 1, name: str = "ring_alltoall") -> str:
    """ResCCLang text of :func:`ring_alltoall` (identity ring order)."""
    _check_root(n, 0, chunks_per_rank)
    kl, ks = _k_loop(chunks_per_rank, "                ")
    body = "                    " if kl else "                "
    return (_a2a_head(n, name, n, 1, chunks_per_rank)
            + f"    N = {n}\n"
            + "    # the block of rank a for rank a + d travels d hops forward, hop h at step h\n"
            + "    for d in range(1, N):\n"
            + "        for a in range(0, N):\n"
            + "            for h in range(0, d):\n"
            + kl
            + f"{body}transfer((a + h) % N, (a + h + 1) % N, h, (a * N + (a + d) % N){ks}, recv)\n")


def hierarchical_alltoall_rccl(nnodes: int, g: int, *, chunks_per_rank: int = 1,
                               name: str | None = None) -> str:
    """ResCCLang text of :func:`hierarchical_alltoall`."""
    _check_hm(nnodes, g)
    name = name or f"hierarchical_alltoall_{nnodes}x{g}"
    K = chunks_per_rank
    kl1, ks = _k_loop(K, "                    ")
    kl2, _ = _k_loop(K, "                    ")
    b = "                        " if kl1 else "                    "
    return (_a2a_head(nnodes * g, name, g, g, K)
            + f"    nNodes = {nnodes}\n"
            + f"    G = {g}\n"
            + "    N = nNodes * G\n"
            + "    # 1. intra-node: GPU (n, r) hands every block for local id (r + o) % G to that local peer\n"
            + "    for n in range(0, nNodes):\n"
            + "        for r in range(0, G):\n"
            + "            for o in range(1, G):\n"
            + "                for m in range(0, nNodes):\n"
            + kl1
            + f"{b}transfer(G*n + r, G*n + (r + o) % G, o - 1, ((G*n + r) * N + G*m + (r + o) % G){ks}, recv)\n"
            + "    # 2. inter-node: GPU (n, s) sends node n's G blocks for GPU (m, s) there, one node pair per step\n"
            + "    for n in range(0, nNodes):\n"
            + "        for s in range(0, G):\n"
            + "            for q in range(1, nNodes):\n"
            + "                for r in range(0, G):\n"
            + kl2
            + f"{b}transfer(G*n + s, G*((n + q) % nNodes) + s, G - 2 + q, "
              f"((G*n + r) * N + G*((n + q) % nNodes) + s){ks}, recv)\n")


#: example file stem -> (builder, text generator), used by examples/generate.py and the tests
def ring_sendrecv_rccl(n: int, shift: int = 1, *, chunks_per_rank: int = 1, name: str = "ring_sendrecv") -> str:
    """ResCCLang text of :func:`ring_sendrecv` (identity ring order)."""
    _check_root(n, shift, chunks_per_rank, "shift")
    kl, ks = _k_loop(chunks_per_rank, "            ")
    body = "                " if kl else "            "
    extra = f", nChunksPerRank={chunks_per_rank}" if chunks_per_rank > 1 else ""
    return (f'def ResCCLAlgo(nRanks={n}, nChannels=1, nWarps=16, AlgoName="{name}", '
            f'OpType="{Collective.SENDRECV.dsl_name}", Shift={shift}, GPUPerNode={n}, NICPerNode=1{extra}):\n'
            + f"    N = {n}\n"
            + "    # rank a's part travels Shift hops forward, hop h at step h (kept in scratch on the way)\n"
            + "    for a in range(0, N):\n"
            + "        for h in range(0, Shift):\n"
            + kl
            + f"{body}transfer((a + h) % N, (a + h + 1) % N, h, a{ks}, recv)\n")


EXAMPLES = {
    **{f"hm_allreduce_{a}x{b}": (lambda a=a, b=b: hm_allreduce(a, b), lambda a=a, b=b: hm_allreduce_rccl(a, b))
       for a, b in ((2, 4), (2, 8), (4, 4), (4, 8))},
    **{f"hm_allgather_{a}x{b}": (lambda a=a, b=b: hm_allgather(a, b), lambda a=a, b=b: hm_allgather_rccl(a, b))
       for a, b in ((2, 4), (2, 8), (4, 4), (4, 8))},
    "ring_allgather_8": (lambda: ring_allgather(8, name="ring_allgather_8"),
                         lambda: ring_allgather_rccl(8, name="ring_allgather_8")),
    "ring_reducescatter_8": (lambda: ring_reducescatter(8, name="ring_reducescatter_8"),
                             lambda: ring_reducescatter_rccl(8, name="ring_reducescatter_8")),
    "ring_allreduce_8": (lambda: ring_allreduce(8, name="ring_allreduce_8"),
                         lambda: ring_allreduce_rccl(8, name="ring_allreduce_8")),
    "direct_allreduce_8": (lambda: direct_allreduce(8, name="direct_allreduce_8"),
                           lambda: direct_allreduce_rccl(8, name="direct_allreduce_8")),
    "direct_allgather_8": (lambda: direct_allgather(8, name="direct_allgather_8"),
                           lambda: direct_allgather_rccl(8, name="direct_allgather_8")),
    "recursive_doubling_allgather_8": (
        lambda: recursive_doubling_allgather(8, name="recursive_doubling_allgather_8"),
        lambda: recursive_doubling_allgather_rccl(8, name="recursive_doubling_allgather_8")),
    "ring_broadcast_8": (lambda: ring_broadcast(8, 3, chunks_per_rank=2, name="ring_broadcast_8"),
                         lambda: ring_broadcast_rccl(8, 3, chunks_per_rank=2, name="ring_broadcast_8")),
    "ring_reduce_8": (lambda: ring_reduce(8, 3, chunks_per_rank=2, name="ring_reduce_8"),
                      lambda: ring_reduce_rccl(8, 3, chunks_per_rank=2, name="ring_reduce_8")),
    "ring_gather_8": (lambda: ring_gather(8, 3, chunks_per_rank=2, name="ring_gather_8"),
                      lambda: ring_gather_rccl(8, 3, chunks_per_rank=2, name="ring_gather_8")),
    "ring_scatter_8": (lambda: ring_scatter(8, 3, chunks_per_rank=2, name="ring_scatter_8"),
                       lambda: ring_scatter_rccl(8, 3, chunks_per_rank=2, name="ring_scatter_8")),
    "direct_alltoall_8": (lambda: direct_alltoall(8, name="direct_alltoall_8"),
                          lambda: direct_alltoall_rccl(8, name="direct_alltoall_8")),
    "ring_alltoall_6": (lambda: ring_alltoall(6, chunks_per_rank=2, name="ring_alltoall_6"),
                        lambda: ring_alltoall_rccl(6, chunks_per_rank=2, name="ring_alltoall_6")),
    "ring_sendrecv_8": (lambda: ring_sendrecv(8, 2, chunks_per_rank=2, name="ring_sendrecv_8"),
                        lambda: ring_sendrecv_rccl(8, 2, chunks_per_rank=2, name="ring_sendrecv_8")),
    **{f"hierarchical_alltoall_{a}x{b}": (lambda a=a, b=b: hierarchical_alltoall(a, b),
                                          lambda a=a, b=b: hierarchical_alltoall_rccl(a, b))
       for a, b in ((2, 4), (2, 8))},
}
