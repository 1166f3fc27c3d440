"""Lower bounds reported next to every synthesised schedule: steps and bandwidth.

**Cut bounds via max-flow** (ForestColl's argument). Every chunk that starts inside a set of ranks S
is needed by some rank outside S, so it crosses the cut: for any S that misses a rank,
``w(S) <= T * Cout(S)`` where ``w(S)`` counts chunks starting in S and ``Cout(S)`` is what can leave
S per step (or per second). Adding a source ``s`` with an edge ``s -> r`` of capacity ``w(r)`` turns
"for all S missing v" into one max-flow: ``maxflow(s -> v) >= W`` (all chunks) with link capacities
scaled by T. :func:`max_cut_ratio` finds ``max_S w(S) / Cout(S)`` exactly with Dinkelbach's iteration
(each violated min cut gives a larger ratio; the ratio of a cut is attained, so it converges).

Shared groups become *hub* vertices (in -> out with the group's capacity). A pair throttled by groups
g1, g2 runs ``u -> g1 -> g2 -> v`` (source-side groups such as a NIC's egress first, destination-side
ones last), and edges between consecutive hops carry the summed capacity of the pairs using them.
Every feasible step (or rate) maps to a flow in this network, so its cuts over-estimate what can
cross and the bounds stay valid; they are exact for the NIC/NVSwitch/UPI structures of the example
clusters.

* :func:`step_lower_bound` (chunks, steps): the cut bound; the *distribution* refinement for every
  part of the hierarchy (a chunk that first enters a part S at the last step must enter at every
  rank of S at once, so ``T >= 1 + ceil((F - floor(E/|S|)) / E)`` with F chunks to bring in and E
  the per-step entry capacity); and the largest hop distance from a chunk's origin to any rank.
* :func:`cut_bound_seconds` (bytes/s): ForestColl's ``T* = (M/N) max_S |S ∩ GPUs| / B+(S)`` for
  AllGather (with M the total output bytes), generalised to any chunk origins (Broadcast).
* :func:`collective_cut_bound_seconds`: the bound of every collective from first principles
  (docs/bounds.md): AllGather and Broadcast as above, ReduceScatter and Reduce on the transposed
  network, AllReduce ``M / min_S B+(S)`` (every cut carries the whole buffer each way, once reduced:
  :func:`min_cut_capacity`), not ReduceScatter + AllGather.
* :func:`packing_bound_seconds`: AllGather / ReduceScatter's least time in this model, the
  tree-packing LP's proven bound, at least the cut bound and above it where a shared group feeds
  ranks that must each get the data; :func:`collective_bound_seconds` is what ``synth`` reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.synth.problem import Network, Task, allgather_task, broadcast_task


# ---------------------------------------------------------------- hub graph
def _group_order(net: Network) -> np.ndarray:
    """Position of each group in a pair's hop chain: source-side groups first."""
    gp = net.group_pairs()
    key = np.zeros(net.ngroups)
    for g, pm in enumerate(gp):
        if pm.size:
            key[g] = np.unique(net.psrc[pm]).size - np.unique(net.pdst[pm]).size
    return key


def hub_graph(net: Network, pair_cap: np.ndarray, group_cap: np.ndarray):
    """Ranks 0..n-1, hub vertices ("g", id, "in"/"out"); capacities as given (per step or per second).
    A networkx DiGraph (imported here: max-flow is the only user)."""
    import networkx as nx

    G = nx.DiGraph()
    G.add_nodes_from(range(net.nranks))
    key = _group_order(net)
    acc: dict[tuple, float] = {}

    def add(a, b, c):
        acc[(a, b)] = acc.get((a, b), 0) + c

    for p in range(net.npairs):
        u, v, c = int(net.psrc[p]), int(net.pdst[p]), pair_cap[p]
        gs = sorted(net.groups_of(p).tolist(), key=lambda g: (key[g], g))
        hops = [u] + [x for g in gs for x in (("g", g, "in"), ("g", g, "out"))] + [v]
        for i in range(0, len(hops) - 1, 2):  # u->g1in, g1out->g2in, ..., gkout->v
            add(hops[i], hops[i + 1], c)
    for (a, b), c in acc.items():
        G.add_edge(a, b, capacity=c)
    for g in range(net.ngroups):
        if G.has_node(("g", g, "in")):
            G.add_edge(("g", g, "in"), ("g", g, "out"), capacity=group_cap[g])
    return G


def _cut_capacity(G, side: set) -> float:
    return sum(d["capacity"] for a, b, d in G.edges(data=True) if a in side and b not in side)


def max_cut_ratio(G, weight: dict[int, int], targets, *, exact: bool = True):
    """``max over vertex sets A (missing some target v) of w(A) / Cout(A)`` and the maximising A.

    ``weight[r]`` chunks start at rank r; ``targets`` are the ranks that need all of them. With
    ``exact`` capacities and weights are integers and the ratio a Fraction (the max-flows then run
    compiled on large graphs, :mod:`hccc.compiler.synth.maxflow`).
    """
    import networkx as nx

    W = sum(weight.values())
    if W == 0:
        return (Fraction(0) if exact else 0.0), set()
    best = Fraction(0) if exact else 0.0
    best_set: set = set()
    H = G.copy()
    for r, w in weight.items():
        if w:
            H.add_edge("__s__", r, capacity=w)
    base = {e: d["capacity"] for e, d in G.edges.items()}
    arrays = _flow_arrays(G, weight) if exact else None
    for v in targets:
        for _ in range(64):
            lam = best
            if lam == 0:
                # zero-capacity network: the cut isolates v alone
                side = set(H.nodes) - {v}
            else:
                # capacities c * lam against source edges w: scale by lam's denominator to stay integral
                num, den = (lam.numerator, lam.denominator) if exact else (lam, 1)
                cut = arrays(v, num, den) if arrays is not None else None
                if cut is not None:
                    value, side = cut
                else:
                    for (a, b), c in base.items():
                        H[a][b]["capacity"] = c * num
                    for r, w in weight.items():
                        if w:
                            H["__s__"][r]["capacity"] = w * den
                    value, (side, _) = nx.minimum_cut(H, "__s__", v)
                if value >= W * den - (0 if exact else 1e-9 * W):
                    break
            side = set(side) - {"__s__"}
            wa = sum(weight.get(x, 0) for x in side if isinstance(x, int))
            ca = _cut_capacity(G, side)
            if ca == 0:
                raise ValueError(f"rank {v} cannot be reached from the ranks holding its chunks")
            ratio = Fraction(wa) / Fraction(ca) if exact else wa / ca
            if ratio <= best:
                break
            best, best_set = ratio, side
    return best, best_set


def _flow_arrays(G, weight: dict[int, int]):
    """``cut(v, num, den)`` for :func:`max_cut_ratio`'s exact iteration by the compiled max-flow:
    the flow value from a source feeding rank r ``weight[r] * den`` into ``G`` with its
    capacities times ``num``, to ``v``, and the source side of the minimum cut (None where the
    scaled capacities do not fit 64 bits); None for the whole graph where networkx runs."""
    from hccc.compiler.synth.maxflow import LIMIT, compiled_max_flow, fits

    flow = compiled_max_flow(G.number_of_edges())
    if flow is None:
        return None
    nodes = list(G.nodes) + ["__s__"]
    index = {x: i for i, x in enumerate(nodes)}
    caps = [d["capacity"] for _, _, d in G.edges(data=True)]
    if not fits(caps):
        return None
    caps = [int(c) for c in caps]
    feed = [(r, int(w)) for r, w in weight.items() if w]
    eu = np.array([index[a] for a, _ in G.edges()] + [index["__s__"]] * len(feed), np.int64)
    ev = np.array([index[b] for _, b in G.edges()] + [index[r] for r, _ in feed], np.int64)
    total_c, total_w = sum(caps), sum(w for _, w in feed)
    base = np.array(caps + [0] * len(feed), np.int64)
    fed = np.array([0] * len(caps) + [w for _, w in feed], np.int64)
    sink = np.zeros(len(nodes), np.bool_)

    def cut(v, num: int, den: int):
        if total_c * int(num) >= LIMIT or total_w * int(den) >= LIMIT:
            return None
        value = flow(len(nodes), eu, ev, base * int(num) + fed * int(den), index["__s__"], index[v], sink)
        return int(value), {x for x, i in index.items() if not sink[i]}

    return cut


# ---------------------------------------------------------------- steps
@dataclass(frozen=True)
class StepBound:
    steps: int
    cut: int
    distribution: int
    distance: int
    witness: str  # what attains the bound

    def as_dict(self) -> dict:
        return {"steps": self.steps, "cut": self.cut, "distribution": self.distribution,
                "distance": self.distance, "witness": self.witness}


def _origin_weights(task: Task) -> dict[int, int]:
    w = np.bincount(task.origin, minlength=task.nranks)
    return {r: int(c) for r, c in enumerate(w.tolist()) if c}


def unreachable(net: Network, collective: str, root: int = 0, node_of=None) -> str | None:
    """Why ``collective`` cannot run on ``net`` for want of paths (None where it can): a broadcast
    needs every rank reachable from ``root``; the other collectives every rank from every other.
    Said once, before any synthesis, naming one rank that no path reaches and where from;
    ``node_of`` (each rank's node, where the cluster has nodes) adds a hint where no link joins
    two nodes."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import breadth_first_order

    n = net.nranks
    if n < 2:
        return None
    src, dst = np.asarray(net.psrc), np.asarray(net.pdst)
    adj = coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    node = np.zeros(n, np.int64) if node_of is None else np.asarray(node_of)
    hint = ""
    if not len(src):
        hint = " (the cluster has no link at all"
    elif (node[src] == node[dst]).all() and len(set(node.tolist())) > 1:
        hint = " (no link joins two nodes"
    if hint:
        hint += "; nodes are joined only where the .topo declares 'internode')"
    start = int(root) if collective == "broadcast" else 0
    seen = np.zeros(n, bool)
    seen[breadth_first_order(adj, start, directed=True, return_predecessors=False)] = True
    if not seen.all():
        return f"rank {int(np.flatnonzero(~seen)[0])} cannot be reached from rank {start}{hint}"
    if collective != "broadcast":
        seen[:] = False
        seen[breadth_first_order(adj.T.tocsr(), 0, directed=True, return_predecessors=False)] = True
        if not seen.all():
            return f"rank 0 cannot be reached from rank {int(np.flatnonzero(~seen)[0])}{hint}"
    return None


def _distances(net: Network, sources) -> np.ndarray:
    """Hop distances from each source to every rank (BFS on the pair CSR; -1: unreachable). Up to
    :data:`DENSE_BFS_RANKS` ranks all sources advance together, a level per product with the dense
    adjacency matrix."""
    sources = [int(s) for s in sources]
    n = net.nranks
    if n <= DENSE_BFS_RANKS and sources:
        adj = np.zeros((n, n), np.float32)
        adj[net.psrc, net.pdst] = 1.0
        dist = np.full((len(sources), n), -1, np.int64)
        front = np.zeros((len(sources), n), np.float32)
        front[np.arange(len(sources)), sources] = 1.0
        dist[np.arange(len(sources)), sources] = 0
        d = 0
        while front.any():
            d += 1
            new = ((front @ adj) > 0) & (dist < 0)
            dist[new] = d
            front = new.astype(np.float32)
        return dist
    ptr, pairs = net.out_csr()
    dst = net.pdst
    out = []
    for s in sources:
        dist = np.full(net.nranks, -1, np.int64)
        dist[s] = 0
        frontier = np.array([s])
        d = 0
        while frontier.size:
            d += 1
            nxt = np.concatenate([dst[pairs[ptr[u]:ptr[u + 1]]] for u in frontier.tolist()])
            nxt = np.unique(nxt[dist[nxt] < 0])
            dist[nxt] = d
            frontier = nxt
        out.append(dist)
    return np.array(out)


#: :func:`_distances` runs one dense breadth-first search for all sources up to this many ranks
DENSE_BFS_RANKS = 2048

#: above this many ranks the cut bounds use the hierarchy's parts (nodes, islands, ranks) instead
#: of max-flow over all cuts: still valid, computed in vectorised numpy
EXACT_LIMIT = 128


def _part_cuts(net: Network, task: Task, pair_cap, group_cap):
    """(ratio, part ranks, distribution bound, what) over the hierarchy's parts and single ranks:
    chunks starting in S must leave it, chunks missing from S must enter it."""
    n = task.nranks
    held = task.initial()
    origin_w = np.bincount(task.origin, minlength=n).astype(float)
    best, best_ranks, dist_best, dist_what = 0.0, [], 0, ""
    for lv in list(net.levels) + [np.arange(n)]:
        lv = np.asarray(lv, np.int64)
        npart = int(lv.max()) + 1
        ein = net.entry_capacity(lv, pair_cap=pair_cap, group_cap=group_cap)
        eout = net.entry_capacity(lv, pair_cap=pair_cap, group_cap=group_cap, outgoing=True)
        size = np.bincount(lv, minlength=npart)
        w = np.bincount(lv, weights=origin_w, minlength=npart)
        part_has = np.zeros((npart, task.nchunks), bool)
        np.logical_or.at(part_has, lv, held.astype(bool))
        F = (~part_has).sum(axis=1).astype(float)
        for c in range(npart):
            if size[c] == n:
                continue
            for num, den in ((w[c], eout[c]), (F[c], ein[c])):
                if num > 0:
                    if den <= 0:
                        raise ValueError("a part of the cluster cannot be reached")
                    if num / den > best:
                        best, best_ranks = num / den, np.flatnonzero(lv == c).tolist()
            if size[c] >= 2 and F[c] > 0 and pair_cap is None:
                E = int(ein[c])
                T = 1 + max(0, -(-(int(F[c]) - E // int(size[c])) // E))
                if T > dist_best:
                    dist_best = T
                    dist_what = f"ranks {_ranges(np.flatnonzero(lv == c).tolist())} receive {int(F[c])} chunks at {E} per step"
    return best, best_ranks, dist_best, dist_what


def rank_classes(net: Network, task: Task | None = None) -> list[int]:
    """One representative rank per symmetry class (same node structure, same position in the node,
    same links and groups to the outside, same chunk origins). Max-flow cut bounds only need a
    target per class: ranks related by an automorphism give the same value, and leaving targets out
    can only lower the maximum, so the bound stays valid whatever the classes are."""
    node = np.asarray(net.levels[0], np.int64)
    sigs: dict[int, int] = {}
    node_sig = {}
    for c in np.unique(node).tolist():
        members = np.flatnonzero(node == c)
        node_sig[c] = sigs.setdefault(hash(net.node_signature(members)), len(sigs))
    rp, rg = net.pair_group_rows()
    gsum = np.zeros(net.npairs, np.int64)
    np.add.at(gsum, rp, net.gcap[rg].astype(np.int64) * 1000 + np.diff(net.pg_ptr)[rp])
    inter = node[net.psrc] != node[net.pdst]
    out_sig: dict[int, list] = {}
    in_sig: dict[int, list] = {}
    for p in np.flatnonzero(inter).tolist():
        out_sig.setdefault(int(net.psrc[p]), []).append((int(net.cap[p]), int(gsum[p]), node_sig[int(node[net.pdst[p]])]))
        in_sig.setdefault(int(net.pdst[p]), []).append((int(net.cap[p]), int(gsum[p]), node_sig[int(node[net.psrc[p]])]))
    first = np.zeros(int(node.max()) + 1, np.int64)
    for c in range(first.size):
        first[c] = np.flatnonzero(node == c)[0]
    weights = (np.bincount(task.origin, minlength=net.nranks) if task is not None
               else np.zeros(net.nranks, np.int64))
    seen: dict = {}
    for r in range(net.nranks):
        key = (node_sig[int(node[r])], r - int(first[node[r]]), tuple(sorted(out_sig.get(r, []))),
               tuple(sorted(in_sig.get(r, []))), int(weights[r]))
        seen.setdefault(key, r)
    return sorted(seen.values())


def step_lower_bound(net: Network, task: Task) -> StepBound:
    """A lower bound on the steps of any schedule for ``task`` on ``net`` (see the module doc)."""
    n = task.nranks
    if n <= 1:
        return StepBound(0, 0, 0, 0, "one rank")
    if n > EXACT_LIMIT:
        ratio, ranks, dbest, dwhat = _part_cuts(net, task, None, None)
        cut = int(np.ceil(ratio - 1e-9))
        origins = np.unique(task.origin)[:64]
        dist = _distances(net, origins.tolist())
        if (dist < 0).any():
            raise ValueError("some rank cannot be reached from a chunk's origin")
        dd = int(dist.max())
        steps = max(cut, dbest, dd)
        what = (f"cut: {ratio:.4g} chunks per unit of capacity cross the boundary of ranks {_ranges(ranks)}"
                if steps == cut else ("distribution: " + dwhat if steps == dbest else "distance"))
        return StepBound(steps, cut, dbest, dd, what)
    G = hub_graph(net, net.cap.astype(np.int64), net.gcap.astype(np.int64))
    weight = _origin_weights(task)
    ratio, side = max_cut_ratio(G, weight, rank_classes(net, task))
    cut = int(-((-ratio.numerator) // ratio.denominator))
    cut_ranks = sorted(x for x in side if isinstance(x, int))
    best_dist = 0
    dist = _distances(net, sorted(set(task.origin.tolist())))
    if (dist < 0).any():
        raise ValueError("some rank cannot be reached from a chunk's origin")
    best_dist = int(dist.max())
    # distribution refinement over the parts of the hierarchy
    held0 = task.initial()
    dbest, dwhat = 0, ""
    entry = [net.entry_capacity(lv) for lv in net.levels]
    for li, lv in enumerate(net.levels):
        for c in np.unique(lv).tolist():
            members = np.flatnonzero(lv == c)
            if members.size < 2 or members.size == n:
                continue
            F = int((held0[members].max(axis=0) == 0).sum())
            if F == 0:
                continue
            E = int(entry[li][c])
            if E <= 0:
                raise ValueError("a part of the cluster cannot be reached")
            x = E // members.size
            T = 1 + max(0, -(-(F - x) // E))
            if T > dbest:
                dbest, dwhat = T, f"ranks {members[0]}..{members[-1]} receive {F} chunks at {E} per step"
    steps = max(cut, dbest, best_dist)
    if steps == cut:
        what = (f"cut: {int(ratio.numerator)}/{int(ratio.denominator)} chunks per unit of capacity "
                f"leave ranks {_ranges(cut_ranks)}")
    elif steps == dbest:
        what = "distribution: " + dwhat
    else:
        what = "distance"
    return StepBound(steps, cut, dbest, best_dist, what)


def _ranges(rs: list[int]) -> str:
    if not rs:
        return "{}"
    parts, a, b = [], rs[0], rs[0]
    for r in rs[1:]:
        if r == b + 1:
            b = r
        else:
            parts.append(f"{a}" if a == b else f"{a}-{b}")
            a = b = r
    parts.append(f"{a}" if a == b else f"{a}-{b}")
    return "{" + ",".join(parts) + "}"


# ---------------------------------------------------------------- bandwidth
def cut_bound_seconds(net: Network, task: Task, total_bytes: float) -> float:
    """ForestColl's cut bound: the least time any schedule needs to move ``total_bytes`` (the whole
    collective buffer, ``task.nchunks`` equal chunks) given link and group bandwidths."""
    if net.bw is None or net.gbw is None:
        raise ValueError("the network has no bandwidth view")
    if task.nranks < 2:
        return 0.0              # one rank: no byte leaves it
    key = (_network_digest(net), np.asarray(task.origin).tobytes(), task.nranks, task.nchunks, task.kind)
    ratio = _CUT_RATIOS.get(key)
    if ratio is None:
        if task.nranks > EXACT_LIMIT:
            ratio = float(_part_cuts(net, task, net.bw, net.gbw)[0])
        else:
            G = hub_graph(net, net.bw, net.gbw)
            # whole bytes per second (as clusters give them): exact, and compiled on large graphs
            from hccc.compiler.synth.maxflow import fits

            exact = fits(d["capacity"] for _, _, d in G.edges(data=True))
            if exact:
                for _, _, d in G.edges(data=True):
                    d["capacity"] = int(d["capacity"])
            targets = _symmetric_targets(net, task, rank_classes(net, task))
            ratio = float(max_cut_ratio(G, _origin_weights(task), targets, exact=exact)[0])
        if len(_CUT_RATIOS) >= 64:
            _CUT_RATIOS.clear()
        _CUT_RATIOS[key] = ratio
    return ratio * total_bytes / task.nchunks


#: cut ratios already computed, by network and task (and AllReduce's least cut capacity, by
#: network): ``synth`` asks for the same bound where it packs trees and where it simulates (0.7 s
#: each at 64 GPUs; the least cut 0.3 s, asked twice by an AllReduce)
_CUT_RATIOS: dict = {}


def _network_digest(net: Network) -> bytes:
    """What a cut bound depends on: the pairs, their and the groups' bandwidths, the groups' pairs
    and the partition levels."""
    import hashlib

    h = hashlib.sha256()
    for a in (net.psrc, net.pdst, net.bw, net.gbw, net.pg_ptr, net.pg_idx, *net.levels):
        arr = np.ascontiguousarray(a)
        h.update(str((arr.dtype, arr.shape)).encode())
        h.update(arr.tobytes())
    return h.digest()


def _symmetric_targets(net: Network, task: Task, targets: list[int]) -> list[int]:
    """``targets`` less those that an automorphism of the bandwidths (the node and GPU shifts of
    :func:`hccc.compiler.synth.symmetry.node_symmetry`) maps onto another target: when every rank holds
    as many chunks, such targets have the same max-flow value, so one per orbit suffices."""
    w = np.bincount(task.origin, minlength=task.nranks)
    if not targets or (w != w[0]).any():
        return targets
    from hccc.compiler.synth.symmetry import node_symmetry

    sym = node_symmetry(net)
    if sym is None:
        return targets
    least = sym.ranks.min(axis=0)        # the least rank of every rank's orbit
    return sorted({int(least[t]) for t in targets})


def min_cut_capacity(net: Network, pair_cap: np.ndarray, group_cap: np.ndarray) -> float:
    """The least capacity leaving any set of ranks that holds some rank and misses another.

    A directed global min cut: fixing rank 0, every such set either holds 0 and misses some v
    (``maxflow(0 -> v)``) or misses 0 and holds some u (``maxflow(u -> 0)``), so 2(n-1) max-flows
    on the hub graph find it. Past :data:`EXACT_LIMIT` ranks only the hierarchy's parts and single
    ranks are tried (entering and leaving); a minimum over fewer cuts is larger, so ``M`` over it
    still bounds from below."""
    n = net.nranks
    if n <= 1:
        return float("inf")
    if n > EXACT_LIMIT:
        best = float("inf")
        for lv in list(net.levels) + [np.arange(n)]:
            lv = np.asarray(lv, np.int64)
            size = np.bincount(lv)
            proper = (size > 0) & (size < n)
            for out in (False, True):
                e = net.entry_capacity(lv, pair_cap=pair_cap, group_cap=group_cap, outgoing=out)
                if proper.any():
                    best = min(best, float(e[proper].min()))
        return best
    import networkx as nx

    G = hub_graph(net, pair_cap, group_cap)
    flow = _integer_max_flow(G)
    if flow is not None:
        return float(min(min(flow(0, v), flow(v, 0)) for v in range(1, n)))
    best = float("inf")
    for v in range(1, n):
        best = min(best, nx.maximum_flow_value(G, 0, v), nx.maximum_flow_value(G, v, 0))
    return float(best)


def _integer_max_flow(G):
    """``flow(s, t)``: the max-flow value between vertices ``s`` and ``t`` of the hub graph ``G``
    by scipy's compiled max-flow, exact: the capacities (bytes/s or chunks per step: whole numbers)
    are divided by their greatest common divisor, and the value multiplied back. None when a
    capacity is not a whole number or the scaled ones could overflow scipy's 32-bit capacities
    (networkx's max-flow then)."""
    import math

    try:
        from scipy import sparse
        from scipy.sparse.csgraph import maximum_flow
    except ImportError:
        return None
    index = {v: i for i, v in enumerate(G.nodes())}
    edges = [(index[a], index[b], d["capacity"]) for a, b, d in G.edges(data=True)]
    caps = [c for _, _, c in edges]
    if not caps or not all(isinstance(c, (int, float, np.integer, np.floating)) and math.isfinite(c) and c >= 0
                           and float(c).is_integer() and c < 2 ** 62 for c in caps):
        return None
    whole = [int(c) for c in caps]
    unit = 0
    for c in whole:
        unit = math.gcd(unit, c)
    if unit == 0 or sum(whole) // unit >= 2 ** 31 - 1:
        return None
    a = np.array([e[0] for e in edges], np.int64)
    b = np.array([e[1] for e in edges], np.int64)
    m = sparse.csr_array((np.array([c // unit for c in whole], np.int32), (a, b)), shape=(len(index),) * 2)

    def flow(s, t) -> float:
        return float(int(maximum_flow(m, index[s], index[t]).flow_value) * unit)

    return flow


#: the collectives :func:`collective_cut_bound_seconds` knows: every one (its demand per cut, from
#: the spec's pre- and postconditions, is in docs/bounds.md)
BOUND_COLLECTIVES = tuple(SPECS)


def collective_cut_bound_seconds(net: Network, collective: str, nranks: int, chunks_per_rank: int,
                                 root: int, total_bytes: float) -> float:
    """The least time any schedule of ``collective`` needs on ``net`` for a buffer of ``total_bytes``
    (AllGather's output, ReduceScatter's input, the Broadcast/Reduce/AllReduce buffer).

    For every set S of ranks (both S and its complement non-empty) with ``B+(S)`` the bandwidth
    leaving S (docs/bounds.md):

    * AllGather: the ``|S| M/N`` bytes that start in S must leave it.
    * ReduceScatter: each of the ``|S^c|`` chunks owned outside S needs S's contributions, which S
      can pre-reduce to one chunk: ``|S^c| M/N`` bytes leave S (AllGather on the transposed network).
    * Broadcast (root in S): the whole buffer leaves S. Reduce (root outside S): S's contributions
      to every chunk, pre-reduced, leave S: ``M`` bytes (Broadcast on the transposed network).
    * AllReduce: every rank outside S ends with every chunk, which depends on S's contributions:
      ``M`` bytes leave S, for every S, so ``T >= M / min_S B+(S)``. It dominates the
      ReduceScatter and AllGather terms of the same cut (``|S| <= N``); their sum is no bound.
    * AllToAll (``total_bytes``: one rank's buffer): :func:`alltoall_cut_bound_seconds`.
    * Scatter (root in S) and Gather (root outside S): the blocks (``M/N`` each) of the ranks on
      the far side of the cut from the root cross it: :func:`rooted_cut_ratio`.
    * SendRecv (``root``: its shift; ``total_bytes``: every rank's part): the part (``M/N``) of
      every rank in S whose peer is outside S crosses the cut: :func:`shift_cut_ratio`.
    """
    if net.bw is None or net.gbw is None:
        raise ValueError("the network has no bandwidth view")
    coll = collective.lower()
    n, k = int(nranks), int(chunks_per_rank)
    if coll == "alltoall":   # total_bytes: one rank's buffer (nranks blocks)
        return alltoall_cut_bound_seconds(net, total_bytes)[0]
    if coll in ("scatter", "gather"):   # total_bytes: the root's whole buffer (nranks blocks)
        if n <= 1:
            return 0.0
        return rooted_cut_ratio(net, net.bw, net.gbw, int(root), toward_root=coll == "gather") * total_bytes / n
    if coll == "sendrecv":   # total_bytes: every rank's part
        if n <= 1:
            return 0.0
        return shift_cut_ratio(net, net.bw, net.gbw, int(root) % n) * total_bytes / n
    if coll == "allgather":
        return cut_bound_seconds(net, allgather_task(n, k), total_bytes)
    if coll == "reducescatter":
        return cut_bound_seconds(net.transposed(), allgather_task(n, k), total_bytes)
    if coll == "broadcast":
        return cut_bound_seconds(net, broadcast_task(n, root, k), total_bytes)
    if coll == "reduce":
        return cut_bound_seconds(net.transposed(), broadcast_task(n, root, k), total_bytes)
    if coll == "allreduce":
        if n <= 1:
            return 0.0
        key = (_network_digest(net), "min_cut")        # asked for by the packing, the report and the bounds
        cap = _CUT_RATIOS.get(key)
        if cap is None:
            cap = min_cut_capacity(net, net.bw, net.gbw)
            if len(_CUT_RATIOS) >= 64:
                _CUT_RATIOS.clear()
            _CUT_RATIOS[key] = cap
        if cap <= 0:
            raise ValueError("the cluster is not strongly connected")
        return float(total_bytes) / cap
    raise ValueError(f"no cut bound for collective {collective!r}; known: {', '.join(BOUND_COLLECTIVES)}")


#: seconds :func:`collective_bound_seconds` lets the packing LP run (its bound is valid when stopped)
PACKING_BOUND_SECONDS = 10.0


def packing_bound_seconds(net: Network, collective: str, total_bytes: float, *, time_limit: float = 60.0) -> float:
    """The least time of any AllGather (ReduceScatter: on the transposed network) of ``total_bytes``
    whose data moves between ranks over pairs, at least the cut bound and often equal to it
    (docs/bounds.md, *The packing bound*).

    Every byte of rank ``r``'s data reaches every other rank; the first arrival at each rank comes
    from a rank that already had the byte, so the bytes of ``r``'s data on the pairs form a
    fractional packing of spanning out-trees rooted at ``r``. The least time over such packings is
    the tree-packing LP (:func:`hccc.compiler.synth.trees.pack_trees`); its column generation's
    Lagrangian bound (``sum_r min_t pi(t) / sum_e pi_e cap_e`` for the duals ``pi >= 0``, valid for
    any ``pi``) is what is returned, never the LP's own value. A cut counts every pair leaving a
    set and a shared group's capacity once, whatever the trees inside need: where a group (a NIC
    shared by several GPUs) feeds ranks that must each get the data, the trees pay for what the cut
    does not see and the LP lies above the cut bound (three GPUs on a line behind one NIC: 11 %)."""
    from hccc.compiler.synth.packing import transposed_pair_order
    from hccc.compiler.synth.trees import pack_trees

    coll = collective.lower()
    if coll not in ("allgather", "reducescatter"):
        raise ValueError(f"the packing bound is for allgather and reducescatter, not {collective!r}")
    if net.bw is None or net.gbw is None:
        raise ValueError("the network has no bandwidth view")
    n = net.nranks
    if n < 2:
        return 0.0
    cut = collective_cut_bound_seconds(net, coll, n, 1, 0, float(n))   # seconds per byte of each rank's data
    if coll == "reducescatter":
        pk = pack_trees(net.transposed(), pair_bw=net.bw[transposed_pair_order(net)], bound=cut, max_chunks=1,
                        time_limit=time_limit)
    else:
        pk = pack_trees(net, pair_bw=net.bw, bound=cut, max_chunks=1, time_limit=time_limit)
    return max(cut, float(pk.lower_bound)) * float(total_bytes) / n


def collective_bound_seconds(net: Network, collective: str, nranks: int, chunks_per_rank: int, root: int,
                             total_bytes: float, *, time_limit: float | None = None) -> float:
    """The bandwidth bound ``hccc`` reports: :func:`packing_bound_seconds` for AllGather and
    ReduceScatter up to :data:`EXACT_LIMIT` ranks (the cut bound where the packing meets it),
    :func:`collective_cut_bound_seconds` otherwise (valid, possibly below the packing bound). The
    packing LP gets :data:`PACKING_BOUND_SECONDS` (or ``time_limit`` where less); stopped early,
    its Lagrangian bound is still one."""
    if collective.lower() in ("allgather", "reducescatter") and int(nranks) == net.nranks <= EXACT_LIMIT:
        limit = PACKING_BOUND_SECONDS if time_limit is None else min(PACKING_BOUND_SECONDS, float(time_limit))
        return packing_bound_seconds(net, collective, total_bytes, time_limit=limit)
    return collective_cut_bound_seconds(net, collective, nranks, chunks_per_rank, root, total_bytes)


def allreduce_volume_bound_seconds(net: Network, total_bytes: float) -> float:
    """AllReduce's traffic bound: ``2 (N-1) M / C`` with ``C`` the most bytes/s all transfers
    together can move (docs/bounds.md).

    For every element, the first rank to hold its full sum needs every other rank's contribution,
    so each of the other N-1 ranks sends a message carrying that element before then; after then,
    each of them must still receive one (no rank but the first held the full sum before). That is
    2(N-1) distinct transfers per element, 2(N-1) M bytes in all, whatever the schedule (reductions
    happen at ranks; a message carries at most one value per element). ``C`` is at most the sum
    over ranks of what can leave each rank alone, and of what can enter it: the smaller sum is used.

    The same holds for the parts of every hierarchy level (nodes, islands) in place of ranks, a
    part knowing what any of its ranks received: the first part to know an element's full sum
    needs a message from each of the k-1 others before then, and each of them one from outside it
    after then, so ``2 (k-1) M / C_k`` with ``C_k`` the smaller sum of what can leave and enter
    each part; the largest of these is returned (on 8 nodes whose NICs are the bottleneck it is
    ReduceScatter + AllGather's optimum, where the rank bound is far below it).

    And with the ranks of one part P (a node) as units and the rest of the cluster as one more
    (:func:`_part_partitions`): ``2 |P| M / C_P``. On two nodes whose NICs are the narrowest cut
    this is what the cut misses: every element still moves 2(|P|-1) times inside P or through its
    NICs, which the NICs, busy with the cut's own traffic, cannot relieve (docs/bounds.md).
    """
    n = net.nranks
    if n <= 1:
        return 0.0
    if net.bw is None or net.gbw is None:
        raise ValueError("the network has no bandwidth view")
    best = 0.0
    levels = [np.unique(np.asarray(lv), return_inverse=True)[1] for lv in net.levels]
    for part in [np.arange(n)] + levels + _part_partitions(net, levels):
        k = int(part.max()) + 1
        if k < 2:
            continue
        out = net.entry_capacity(part, pair_cap=net.bw, group_cap=net.gbw, outgoing=True)
        inn = net.entry_capacity(part, pair_cap=net.bw, group_cap=net.gbw)
        cap = float(min(out.sum(), inn.sum()))
        if cap <= 0:
            raise ValueError("the cluster is not strongly connected")
        best = max(best, 2.0 * (k - 1) * float(total_bytes) / cap)
    return best


#: pair visits the parts' partitions of the traffic bound may cost in all: each partition is two
#: vectorised capacity sums over every pair (0.56 s for the 1,047,552 pairs of 1,024 GPUs on a loaded
#: 2-core machine), so 4 M visits are about two partitions there, about what the rank and level
#: partitions cost beside them, and every kind of node up to a few hundred GPUs. A budget of work,
#: not of seconds, so every machine computes the same bound (valid with any subset of partitions)
PART_PARTITIONS_PAIR_VISITS = 4_000_000
#: partitions computed whatever the budget (the slowest kinds of node inside)
PART_PARTITIONS_LEAST = 2


def _part_partitions(net: Network, levels: list[np.ndarray]) -> list[np.ndarray]:
    """For each level and each kind of its parts P, the partition whose units are P's ranks one by
    one and the rest of the cluster as one: the traffic argument over these ``|P| + 1`` units gives
    ``2 |P| M / C``. Parts of one kind (the same size and, rank by rank in order, the same rates
    inside the part, out of it and into it, and of the groups on its ranks' pairs) count once; the
    kinds slowest inside first (where the bound is tightest), as many as
    :data:`PART_PARTITIONS_PAIR_VISITS` allows. Parts of one rank add nothing beyond the rank level;
    a level with one part has no rest."""
    n = net.nranks
    bw = np.asarray(net.bw, float)
    gbw = np.asarray(net.gbw, float) if net.gbw is not None else np.zeros(0)
    rp, rg = net.pair_group_rows()
    kinds: dict = {}
    for lv in levels:
        if int(lv.max()) < 1:
            continue
        inside = lv[net.psrc] == lv[net.pdst]
        rate_in = np.bincount(net.psrc[inside], weights=bw[inside], minlength=n)
        rate_out = np.bincount(net.psrc[~inside], weights=bw[~inside], minlength=n)
        rate_into = np.bincount(net.pdst[~inside], weights=bw[~inside], minlength=n)
        rate_groups = np.bincount(net.psrc[rp], weights=gbw[rg], minlength=n) if rg.size else np.zeros(n)
        order = np.argsort(lv, kind="stable")
        bounds = np.searchsorted(lv[order], np.arange(int(lv.max()) + 2))
        for p in range(int(lv.max()) + 1):
            members = order[bounds[p]:bounds[p + 1]]
            if members.size < 2:
                continue
            key = (members.size, np.round(np.c_[rate_in[members], rate_out[members], rate_into[members],
                                                rate_groups[members]], 6).tobytes())
            if key not in kinds:
                kinds[key] = (float(rate_in[members].sum()) / members.size, len(kinds), members)
    most = max(PART_PARTITIONS_LEAST, PART_PARTITIONS_PAIR_VISITS // max(1, 2 * net.npairs))
    out: list[np.ndarray] = []
    for _, _, members in sorted(kinds.values(), key=lambda k: k[:2])[:most]:
        unit = np.full(n, members.size, np.int64)
        unit[members] = np.arange(members.size)
        out.append(unit)
    return out


def allreduce_bound_seconds(net: Network, total_bytes: float) -> float:
    """The least time any AllReduce of ``total_bytes`` needs: the larger of the cut bound (the
    buffer crosses the narrowest cut, :func:`collective_cut_bound_seconds`) and the traffic bound
    (:func:`allreduce_volume_bound_seconds`)."""
    return max(collective_cut_bound_seconds(net, "allreduce", net.nranks, 1, 0, total_bytes),
               allreduce_volume_bound_seconds(net, total_bytes))


# ---------------------------------------------------------------- AllToAll
#: beyond this many top-level parts (nodes), only single parts and their complements are cut
ALLTOALL_SUBSET_LIMIT = 10
#: up to this many ranks every rank subset is cut (the bound is then the exact maximum)
ALLTOALL_ALL_SUBSETS = 10


def alltoall_cut_sets(net: Network) -> list[frozenset]:
    """Rank sets whose cuts the AllToAll bounds examine: every rank alone, every part of every
    hierarchy level (nodes, islands, ...), and every union of top-level parts (nodes) while there
    are at most :data:`ALLTOALL_SUBSET_LIMIT` of them; with their complements. Up to
    :data:`ALLTOALL_ALL_SUBSETS` ranks, simply every proper subset."""
    n = net.nranks
    if n <= ALLTOALL_ALL_SUBSETS:
        return [frozenset(r for r in range(n) if m >> r & 1) for m in range(1, (1 << n) - 1)]
    sets = {frozenset([r]) for r in range(n)}
    for lev in net.levels:
        for p in np.unique(lev).tolist():
            sets.add(frozenset(np.flatnonzero(lev == p).tolist()))
    if net.levels:
        parts = np.unique(net.levels[0]).tolist()
        if len(parts) <= ALLTOALL_SUBSET_LIMIT:
            members = [np.flatnonzero(net.levels[0] == p).tolist() for p in parts]
            for mask in range(1, 1 << len(parts)):
                sets.add(frozenset(r for i, m in enumerate(members) if mask >> i & 1 for r in m))
    everyone = frozenset(range(n))
    sets |= {everyone - s for s in sets}
    return sorted((s for s in sets if 0 < len(s) < n), key=lambda s: (len(s), sorted(s)))


def _set_cut(G, side: frozenset, n: int) -> float:
    """Least capacity of any cut separating ``side`` from the other ranks (hubs on either side)."""
    import networkx as nx

    H = G.copy()
    for r in range(n):
        if r in side:
            H.add_edge("__s__", r)          # no capacity attribute: infinite
        else:
            H.add_edge(r, "__t__")
    return float(nx.maximum_flow_value(H, "__s__", "__t__"))


def _hub_arrays(net: Network, pair_cap, group_cap) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`hub_graph` as arrays, built without a loop over pairs: ``(vertices, a, b, cap)``
    with ranks ``0..n-1`` and group ``g``'s hub ``n + 2g`` (in) and ``n + 2g + 1`` (out); parallel
    edges merged (their capacities summed), as the graph's are."""
    n = net.nranks
    pc = np.asarray(pair_cap, np.float64)
    rp, rg = net.pair_group_rows()
    key = _group_order(net)
    order = np.lexsort((rg, key[rg] if rg.size else rg, rp))
    rp, rg = rp[order], rg[order]
    first = np.ones(rp.size, bool)
    first[1:] = rp[1:] != rp[:-1]
    last = np.ones(rp.size, bool)
    last[:-1] = rp[1:] != rp[:-1]
    bare = np.flatnonzero(np.diff(net.pg_ptr) == 0)
    a = np.concatenate([net.psrc[bare], net.psrc[rp[first]], n + 2 * rg[:-1][~last[:-1]] + 1,
                        n + 2 * rg[last] + 1]).astype(np.int64)
    b = np.concatenate([net.pdst[bare], n + 2 * rg[first], n + 2 * rg[1:][~first[1:]],
                        net.pdst[rp[last]]]).astype(np.int64)
    c = np.concatenate([pc[bare], pc[rp[first]], pc[rp[:-1][~last[:-1]]], pc[rp[last]]])
    used = np.unique(rg)
    a = np.concatenate([a, n + 2 * used])
    b = np.concatenate([b, n + 2 * used + 1])
    c = np.concatenate([c, np.asarray(group_cap, np.float64)[used]])
    nv = n + 2 * max(net.ngroups, 0)
    edge, inv = np.unique(a * nv + b, return_inverse=True)
    return nv, edge // nv, edge % nv, np.bincount(inv.ravel(), weights=c, minlength=edge.size)


def _set_cuts(net: Network, pair_cap, group_cap):
    """``cut(side)``: :func:`_set_cut` by scipy's compiled max-flow on the hub graph's arrays
    (:func:`_hub_arrays`), built once, with a source feeding every rank of ``side`` and a sink fed
    by every other rank. The source's edge into rank r carries what can leave r and the sink's
    edge out of r what can enter r: no flow through r exceeds either, so they bind no cut (they
    stand for the infinite edges of :func:`_set_cut`). Capacities are divided by their greatest
    common divisor, so the value is exact. None where a capacity is not a whole number or the
    scaled ones could overflow scipy's 32-bit capacities (:func:`_set_cut` then)."""
    try:
        from scipy import sparse
        from scipy.sparse.csgraph import maximum_flow
    except ImportError:
        return None
    n = net.nranks
    nv, a, b, caps = _hub_arrays(net, pair_cap, group_cap)
    if not (np.isfinite(caps).all() and (caps >= 0).all() and (caps < 2 ** 62).all()
            and (caps == np.round(caps)).all()):
        return None
    whole = caps.astype(np.int64)
    unit = int(np.gcd.reduce(whole[whole > 0])) if (whole > 0).any() else 0
    if unit == 0 or 3 * (int(whole.sum()) // unit) >= 2 ** 31 - 1:
        return None
    keep = whole > 0
    a, b, c = a[keep], b[keep], whole[keep] // unit
    ranks = np.arange(n)
    leave = np.bincount(a, weights=c, minlength=nv)[:n].astype(np.int64)
    enter = np.bincount(b, weights=c, minlength=nv)[:n].astype(np.int64)
    s, t = nv, nv + 1

    def cut(side: frozenset) -> float:
        inside = np.zeros(n, bool)
        inside[sorted(side)] = True
        src = np.concatenate([a, np.full(int(inside.sum()), s), ranks[~inside]])
        dst = np.concatenate([b, ranks[inside], np.full(int((~inside).sum()), t)])
        cap = np.concatenate([c, leave[inside], enter[~inside]]).astype(np.int32)
        m = sparse.csr_array((cap, (src, dst)), shape=(nv + 2,) * 2)
        return float(int(maximum_flow(m, s, t).flow_value) * unit)

    return cut


def _alltoall_priority(net: Network, sets: list[frozenset]) -> list[int]:
    """The order in which :func:`alltoall_cut_ratio` examines ``sets`` (indices): the parts of the
    hierarchy (nodes, islands) and their complements first, since the scarce links (NICs) sit
    between parts; then the unions of top-level parts; then single ranks and theirs. A deadline
    that stops the examination early then has the cuts most likely to bind."""
    n = net.nranks
    everyone = frozenset(range(n))
    parts = set()
    for lev in net.levels:
        for q in np.unique(lev).tolist():
            part = frozenset(np.flatnonzero(lev == q).tolist())
            parts |= {part, everyone - part}

    def rank(i: int) -> tuple:
        s = sets[i]
        return (0 if s in parts else 2 if min(len(s), n - len(s)) == 1 else 1, i)

    return sorted(range(len(sets)), key=rank)


def alltoall_cut_ratio(net: Network, pair_cap, group_cap, *, deadline=None) -> tuple[float, frozenset]:
    """``max over examined rank sets S`` of ``|S| * |V - S| / cut(S -> V - S)``: blocks (one per
    ordered pair of ranks) that must leave ``S``, per unit of the capacity leaving it. Every block
    from a rank in S to one outside crosses that cut at least once, so any schedule needs at least
    that ratio in time units (a valid lower bound for each set examined; the maximum over them is
    what is reported). ``deadline`` (a :class:`hccc.util.clock.Deadline`): the sets are examined
    in :func:`_alltoall_priority`'s order, at least one, and none once it has passed: the maximum
    over those examined is still a bound (a weaker one)."""
    n = net.nranks
    sets = alltoall_cut_sets(net)
    fast = _set_cuts(net, pair_cap, group_cap)
    G = hub_graph(net, pair_cap, group_cap) if fast is None else None
    best, arg, at = 0.0, frozenset(), len(sets)
    for k, i in enumerate(_alltoall_priority(net, sets)):
        if k and deadline is not None and deadline.passed():
            break
        s = sets[i]
        demand = len(s) * (n - len(s))
        cap = fast(s) if fast is not None else _set_cut(G, s, n)
        if cap <= 0:
            raise ValueError(f"ranks {_ranges(sorted(s))} cannot reach the other ranks")
        r = demand / cap
        if r > best or (r == best and i < at):      # ties: the first set in the examined order of old
            best, arg, at = r, s, i
    return best, arg


def rooted_cut_ratio(net: Network, pair_cap, group_cap, root: int, *, toward_root: bool) -> float:
    """``max over examined rank sets S`` of the blocks that must cross ``cut(S -> V - S)``, per unit
    of its capacity, for a collective that moves one block between the root and every other rank:
    Scatter (``toward_root`` False) over the sets holding the root, whose blocks for the ``|V - S|``
    ranks outside leave S; Gather (True) over the sets without it, whose ``|S|`` blocks leave S for
    the root. The sets are :func:`alltoall_cut_sets`' (every proper subset up to
    :data:`ALLTOALL_ALL_SUBSETS` ranks): each gives a valid bound, so their maximum is one."""
    n = net.nranks
    if not 0 <= int(root) < n:
        raise ValueError(f"root {root} is not a rank of the {n}-rank network")
    fast = _set_cuts(net, pair_cap, group_cap)
    G = hub_graph(net, pair_cap, group_cap) if fast is None else None
    best = 0.0
    for side in alltoall_cut_sets(net):
        if (int(root) in side) == toward_root:
            continue
        demand = len(side) if toward_root else n - len(side)
        cap = fast(side) if fast is not None else _set_cut(G, side, n)
        if cap <= 0:
            raise ValueError(f"ranks {_ranges(sorted(side))} cannot reach the other ranks")
        best = max(best, demand / cap)
    return best


def shift_cut_ratio(net: Network, pair_cap, group_cap, shift: int) -> float:
    """``max over examined rank sets S`` of the parts that must cross ``cut(S -> V - S)``, per unit of
    its capacity, for a SendRecv of ``shift``: one part for every rank of S whose peer
    ``(r + shift) % N`` lies outside S. The sets are :func:`alltoall_cut_sets`' (every proper subset
    up to :data:`ALLTOALL_ALL_SUBSETS` ranks): each gives a valid bound, so their maximum is one."""
    n = net.nranks
    fast = _set_cuts(net, pair_cap, group_cap)
    G = hub_graph(net, pair_cap, group_cap) if fast is None else None
    best = 0.0
    for side in alltoall_cut_sets(net):
        demand = sum((r + int(shift)) % n not in side for r in side)
        if not demand:
            continue
        cap = fast(side) if fast is not None else _set_cut(G, side, n)
        if cap <= 0:
            raise ValueError(f"ranks {_ranges(sorted(side))} cannot reach the other ranks")
        best = max(best, demand / cap)
    return best


def alltoall_cut_bound_seconds(net: Network, total_bytes: float, *, deadline=None) -> tuple[float, str]:
    """AllToAll's cut bound for ``total_bytes`` per rank (``nranks`` blocks of
    ``total_bytes / nranks``): max over cuts of the bytes that must cross it over its capacity.
    Returns (seconds, the maximising cut's rank set as text); ``deadline``: see
    :func:`alltoall_cut_ratio`."""
    if net.bw is None or net.gbw is None:
        raise ValueError("the network has no bandwidth view")
    n = net.nranks
    if n < 2:
        return 0.0, "{}"
    ratio, side = alltoall_cut_ratio(net, net.bw, net.gbw, deadline=deadline)
    return ratio * total_bytes / n, _ranges(sorted(side))


def alltoall_step_bound(net: Network, chunks_per_rank: int, *, deadline=None) -> int:
    """Steps any AllToAll schedule needs with ``chunks_per_rank`` chunks per block: the cut ratio in
    chunk capacities C(u, v) (rounded up), and at least one step when there are two ranks;
    ``deadline``: see :func:`alltoall_cut_ratio`."""
    n = net.nranks
    if n < 2:
        return 0
    ratio, _ = alltoall_cut_ratio(net, net.cap.astype(np.float64), net.gcap.astype(np.float64), deadline=deadline)
    return max(1, int(np.ceil(ratio * chunks_per_rank - 1e-9)))
