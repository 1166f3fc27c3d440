"""Broadcast by out-trees of its root, packed at the optimum: the tree method for ``broadcast``.

A Broadcast moves the root's whole buffer to every rank. Split over spanning out-trees ``t`` of the
root with weights ``y_t`` (summing to 1), a resource ``e`` (a pair, or a shared group: the same
resources as the AllGather packing of :mod:`.trees`) carries ``sum_t a_te y_t`` bytes per byte of
the buffer (``a_te``: how often tree ``t`` crosses ``e``), so a call takes at least

    minimise T   s.t.   sum_t a_te y_t - cap_e T <= 0   for every resource e,    sum_t y_t = 1

seconds per byte of the buffer. The LP is solved by column generation (:class:`.master_lp.MasterLP`,
one root row): at the resources' prices a tree costs the sum of its arcs' prices, the cheapest is a
minimum arborescence of the root (:func:`.arborescence.min_arborescence`), and one cheaper than the root
row's dual joins the LP. Without shared groups the optimum is the buffer over the least max-flow
from the root to any rank (Edmonds' branching theorem), the cut bound ``synth`` reports.

A link's bandwidth goes to the streams on it in equal shares (the simulator's max-min fairness, a
thread block each on a GPU), so the program cuts the buffer into ``S`` streams of equal size and
gives each tree a whole number of them, about its weight times ``S`` (:func:`streams_for`: the
fewest streams whose rounding comes within :data:`.rounding.ROUND_TOL` of the LP and whose thread
blocks stay resident; rounded by largest remainders and single moves, regrown on trees priced by
the rounded loads (:func:`regrow`), and given the MILP over the trees found). Where no count rounds
that well, ``k`` arc-disjoint trees in integral arc multiplicities are sought for the fewest ``k``
that reach the LP (:func:`integral_streams`: Edmonds' theorem, exact). The ``nRanks * K`` chunks
(``K`` chunks per rank, the most whose transfers stay within :data:`TRANSFERS` and whose count the
streams divide) go to the streams in runs; a stream's chunks follow its tree down, a rank forwarding
a chunk at the step after the one it receives it in, and every stream has a channel of its own on
each pair it crosses, so the chunks of one stream pipeline through one chain of thread blocks while
the streams run side by side.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.algorithm import RECV
from hccc.compiler.synth import trees as tr
from hccc.compiler.synth.arborescence import min_arborescence
from hccc.compiler.synth.balancing import _repair
from hccc.compiler.synth.packing import ROUND_MILP_EACH, PackingError, PackOptions, _tree_column, _tree_pairs
from hccc.compiler.synth.packing_lp import LP_TOL, _columns
from hccc.compiler.synth.rounding import CHUNK_CANDIDATES, ROUND_MILP_NODES, ROUND_TOL, _milp_counts
from hccc.compiler.synth.tree_rows import _depths
from hccc.compiler.synth.master_lp import MasterLP
from hccc.compiler.synth.problem import Network
from hccc.util import clock

#: the most GPUs a tree Broadcast is packed for. Past 64 a program gets few chunks per rank within
#: :data:`TRANSFERS` (128 GPUs: 2), so its streams round coarsely (128 multi-rail H800s: 0.71 of
#: the bound simulated, 96: 0.86, eight MI250 nodes: 0.49), yet far above the step search (128
#: multi-rail H800s: 0.05 of the bound, 60 s); past 128 the trees' loads (a dense row of every
#: pair and group each) outgrow the memory (512 GPUs: 15 GB) and the program the compiler's input
#: limit (101,977 lines)
MAX_RANKS = 128
#: the most transfers the program may have (chunks x the ranks each reaches): more cost more to
#: simulate and to compile than the finer pipelining gains (the AllGather packing's finer split)
TRANSFERS = 40_000
#: the most streams tried (:func:`stream_counts`): the buffer is cut into that many of equal size, each
#: following one tree on channels of its own (the simulator and the kernels share a link equally
#: among the streams on it, so equal streams give every tree the share of the links its weight asks)
MAX_STREAMS = 128
#: the potentials' steepness :func:`regrow` tries, in order, and the moves it makes per stream at most
REGROW_ALPHAS = (16.0, 64.0)
REGROW_MOVES = 4
#: the largest exponent a potential takes (exp of more overflows a float; such a move never wins)
EXP_MAX = 600.0
#: stream counts up to which every count tried is regrown (above it, the count kept only)
REGROW_STREAMS = 32
#: the most streams an integral packing is sought for (:func:`integral_streams`), and the seconds
#: its integer programs may take in all (a guard: each is solved to a node limit; 24 GPUs of mixed
#: nodes solved 24 counts in 19 s before one came within the tolerance)
INTEGRAL_STREAMS = 32
INTEGRAL_SECONDS = 8.0
#: trees seeded per rank before the LP's first round (multiplicative weights: each priced by the
#: loads of those before, ``exp(steepness * load / the most loaded's)``), and the share of the
#: packing's time they may take
SEED_TREES_PER_RANK = 4
SEED_STEEPNESS = 8.0
SEED_SHARE = 0.25
#: LP rounds at most (each adds the cheapest tree, if it prices in)
MAX_ROUNDS = 2_000


def pack_broadcast(net: Network, root: int, *, pair_bw: np.ndarray | None = None, time_limit: float = 10.0,
                   tol: float = LP_TOL) -> dict:
    """The LP of the module docstring on ``net`` for ``root``: ``parents`` (every tree generated),
    ``weights`` (the LP's, summing to 1), ``loads`` (trees x resources: crossings), ``cap``
    (bytes/s per resource), ``lp_time`` (seconds per byte of the buffer), ``lower_bound`` (the best
    Lagrangian bound proven, same unit), ``rounds`` and ``columns``. PackingError where a rank
    cannot be reached from the root."""
    t0 = clock.now()
    n = net.nranks
    bw = np.asarray(net.bw if pair_bw is None else pair_bw, float)
    # the general packing's setting and columns (:class:`.packing_lp._Columns`), with the one root's row
    cs = _columns(net, bw, False, False, None, PackOptions(rails=False))
    cap, capn, scale, ok = cs.cap, cs.capn, cs.scale, cs.cap > 0
    cols, pars = cs.cols, cs.col_par
    lp = MasterLP(capn, 1)

    def arc_costs(pi: np.ndarray) -> np.ndarray:
        """``C[u, v]``: what pair ``u -> v`` costs at the prices ``pi`` (its own and its groups')."""
        return cs.arc_matrix(cs.inc @ pi, False)

    def column(par: np.ndarray) -> np.ndarray:
        return _tree_column(net, _tree_pairs(net, par, root))

    def add(par: np.ndarray) -> bool:
        """Tree ``par`` joins the columns and the LP (False: it is one)."""
        if not cs.add(root, par):
            return False
        lp.add(cols[-1], np.ones(cols[-1].size), 0)
        return True

    # the first columns: the cheapest tree by 1/bandwidth, then trees priced by the loads of the
    # ones before (multiplicative weights): the LP starts near its optimum rather than one tree a
    # round from it (64 GPUs, multi-rail: 411 rounds, 3.6 s, from one tree)
    inv = np.where(ok, 1.0 / np.where(ok, capn, 1.0), 0.0)
    deadline = t0 + float(time_limit)
    load = np.zeros(cap.size)
    for _ in range(SEED_TREES_PER_RANK * n):
        par = min_arborescence(arc_costs(inv * np.exp(SEED_STEEPNESS * load / max(load.max(), 1e-300))), root)
        col = column(par)
        np.add.at(load, col, inv[col])
        add(par)
        if clock.now() > t0 + (deadline - t0) * SEED_SHARE:
            break
    best_lb = 0.0
    rounds = 0
    sol = None
    while rounds < MAX_ROUNDS:
        rounds += 1
        res = lp.solve(None if sol is None else max(0.01, deadline - clock.now()))
        if res.status != 0:
            if sol is not None and res.status == 1:
                break
            raise PackingError(f"the broadcast packing LP failed: {res.message}")
        sol = res
        pi = res.prices
        C = arc_costs(pi)
        par = min_arborescence(C, root)
        v = np.flatnonzero(par >= 0)
        cost = float(C[par[v], v].sum())
        denom = float(pi @ capn)
        if denom > 0:
            best_lb = max(best_lb, cost / denom)      # Lagrangian: any tree costs at least this
        lam = float(res.eq[0])
        if cost >= lam - 1e-9 * max(1.0, abs(lam)) or res.fun <= best_lb * (1 + tol) \
                or clock.now() > deadline or not add(par):
            break
    if lp.solves > 1 and clock.now() < deadline:
        again = lp.solve_fresh(max(0.01, deadline - clock.now()))    # a vertex on fewer trees
        if again.status == 0:
            sol = again
    # the last round's tree has no weight where the LP stopped before solving it again
    y = np.maximum(np.r_[sol.y[:len(pars)], np.zeros(max(0, len(pars) - sol.y.size))], 0.0)
    y[y <= 1e-9] = 0.0
    loads = np.zeros((len(pars), cap.size))
    for i, col in enumerate(cols):
        np.add.at(loads[i], col, 1.0)

    def cheapest(prices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cheapest tree at per-resource ``prices`` and its crossings per resource."""
        par = min_arborescence(arc_costs(prices), root)
        row = np.zeros(cap.size)
        np.add.at(row, column(par), 1.0)
        return par, row

    return {"parents": pars, "weights": y / y.sum(), "loads": loads, "cap": cap, "cheapest": cheapest,
            "lp_time": float(sol.fun) / scale, "lower_bound": best_lb / scale, "rounds": rounds,
            "columns": len(pars), "seconds": clock.now() - t0}


def round_counts(weights: np.ndarray, loads: np.ndarray, cap: np.ndarray, nchunks: int) -> np.ndarray:
    """Chunks (or streams) per tree, ``nchunks`` in all: the largest remainders of ``weights *
    nchunks``, then single ones moved off the most loaded resource while it gets lighter (the
    AllGather packing's repair, all trees of one root)."""
    w = np.asarray(weights, float)
    exact = w * nchunks
    counts = np.floor(exact).astype(np.int64)
    short = int(nchunks - counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    ok = cap > 0
    scale = float(cap[ok].max()) if ok.any() else 1.0
    return _repair(counts, np.zeros(len(w), np.int64), loads, cap / scale, int(nchunks), rounds=4 * int(nchunks))


def regrow(pk: dict, counts: np.ndarray, alphas=REGROW_ALPHAS) -> tuple[list, np.ndarray, np.ndarray]:
    """``counts`` streams per tree improved one stream at a time: each resource priced by how full
    it is (``exp(alpha * load / the LP's load)``, the gradient of that potential), the cheapest tree
    at those prices (a new one where none generated is cheaper) takes a stream off the tree whose
    move lowers the potential most, while one does. Returns the trees, their crossings and counts
    (new trees appended; the LP's left as they were)."""
    parents = list(pk["parents"])
    loads = pk["loads"]
    cap = pk["cap"]
    ok = cap > 0
    inv = np.where(ok, 1.0 / np.where(ok, cap, 1.0), 0.0)
    S = int(np.sum(counts))
    counts = np.asarray(counts, np.int64).copy()
    lp = pk["lp_time"]
    if S < 1 or lp <= 0:
        return parents, loads, counts
    for alpha in alphas:
        for _ in range(REGROW_MOVES * S):
            A = loads * inv / S / lp                  # a stream's share of the LP's time per resource
            L = counts @ A
            grad = np.exp(alpha * (L - L.max()))      # scaled: only its direction prices trees
            par, row = pk["cheapest"](grad * inv)
            a_new = row * inv / S / lp
            on = np.flatnonzero(counts > 0)
            top = float(L.max())                      # the potentials shifted alike (no overflow)
            before = np.exp(alpha * (L - top)).sum()
            after = np.exp(np.minimum(alpha * ((L - top)[None, :] - A[on] + a_new[None, :]), EXP_MAX)).sum(axis=1)
            k = int(after.argmin())
            if after[k] >= before * (1 - 1e-9):
                break
            key = par.tobytes()
            u = next((i for i, q in enumerate(parents) if q.tobytes() == key), None)
            if u is None:
                parents.append(par)
                loads = np.vstack([loads, row])
                counts = np.r_[counts, 0]
                u = len(parents) - 1
            if u == on[k]:
                break
            counts[on[k]] -= 1
            counts[u] += 1
    return parents, loads, counts


def rounded_time(counts: np.ndarray, loads: np.ndarray, cap: np.ndarray) -> float:
    """Seconds per byte of the buffer with ``counts`` chunks per tree: the most loaded resource's."""
    nchunks = int(np.sum(counts))
    if nchunks == 0:
        return 0.0
    ok = cap > 0
    return float(((np.asarray(counts, float) @ loads)[ok] / cap[ok]).max()) / nchunks


def broadcast_rows(parents: list, streams: np.ndarray, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst, step, chunk)`` rows of the trees, tree ``t`` carrying ``streams[t]`` streams of
    ``pieces`` consecutive chunk ids each, and the stream of every chunk id."""
    rows = []
    at = 0
    for t, par in enumerate(parents):
        c = int(streams[t]) * int(pieces)
        if c == 0:
            continue
        d = _depths(par)
        v = np.flatnonzero(par >= 0)
        for j in range(at, at + c):
            rows.append(np.stack([par[v], v, d[v] - 1, np.full(v.size, j)], axis=1))
        at += c
    r4 = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 4), np.int64)
    return r4, np.arange(at, dtype=np.int64) // max(1, int(pieces))


def stream_blocks(parents: list, counts: np.ndarray, nranks: int) -> np.ndarray:
    """Thread blocks every rank needs with ``counts[t]`` streams on tree ``t``, each on channels of
    its own: one per stream and tree arc at the rank, and one for local work (an upper bound, as
    :func:`.forest.blocks_per_rank`)."""
    deg = np.zeros((len(parents), nranks))
    for t, par in enumerate(parents):
        v = np.flatnonzero(par >= 0)
        np.add.at(deg[t], v, 1.0)
        np.add.at(deg[t], par[v], 1.0)
    return 1 + np.asarray(counts, float) @ deg


def stream_counts(nranks: int) -> list:
    """The stream counts that cut ``nranks * K`` chunks into equal streams for some chunks per rank
    ``K`` within :func:`most_chunks_per_rank`, up to :data:`MAX_STREAMS`, fewest first."""
    kmax = most_chunks_per_rank(nranks)
    return [S for S in range(1, MAX_STREAMS + 1) if any((nranks * k) % S == 0 for k in range(1, kmax + 1))]


def streams_for(pk: dict, nranks: int, max_blocks: int | None = None,
                tol: float = ROUND_TOL) -> tuple[int, np.ndarray, float, list]:
    """The fewest streams (:func:`stream_counts`) whose rounding is within ``tol`` of the LP, else
    the count that rounds best, among those whose thread blocks stay within ``max_blocks`` where
    any do. A count rounds by :func:`round_counts`, then (up to :data:`REGROW_STREAMS` streams, and
    for the count kept) :func:`regrow`, whose new trees join the pool the next counts round over,
    then (for the count kept) the MILP over the pool where better. Returns ``(streams, streams per
    tree, seconds per byte, the trees the counts are of)``."""
    cap = pk["cap"]
    target = pk["lp_time"] * (1 + tol)
    pool = dict(pk)

    def fits(counts: np.ndarray) -> bool:
        return max_blocks is None or float(stream_blocks(pool["parents"], counts, nranks).max()) <= max_blocks

    def regrown(counts: np.ndarray, t: float) -> tuple[np.ndarray, float]:
        nonlocal pool
        pars, loads, got = regrow(pool, counts)
        t2 = rounded_time(got, loads, cap)
        if t2 >= t:
            return counts, t
        pool = dict(pool, parents=pars, loads=loads,
                    weights=np.r_[pool["weights"], np.zeros(len(pars) - len(pool["weights"]))])
        return got, t2

    def padded(counts: np.ndarray) -> np.ndarray:
        return np.r_[counts, np.zeros(len(pool["parents"]) - len(counts), np.int64)]

    tried = []
    for S in stream_counts(nranks):
        counts = round_counts(pool["weights"], pool["loads"], cap, S)
        t = rounded_time(counts, pool["loads"], cap)
        if t > target and 1 < S <= REGROW_STREAMS:
            counts, t = regrown(counts, t)
        ok = fits(counts)
        tried.append((not ok, t > target, S if t <= target else 0, t, S, counts))
        if ok and t <= target:
            break
    _, _, _, t, S, counts = min(tried, key=lambda x: x[:4])
    counts = padded(counts)
    if t > target and S > REGROW_STREAMS:
        got, t2 = regrown(counts, t)
        if t2 < t and fits(got):
            counts, t = got, t2
        counts = padded(counts)
    if t > target and S > 1:
        # another combination of the pool's trees may fit S streams better (the AllGather
        # packing's MILP, with one root row; capacities scaled as its LP's)
        scale = float(cap.max())
        loads = pool["loads"]
        got = _milp_counts(np.zeros(len(counts), np.int64), loads, cap / scale, S, ROUND_MILP_EACH,
                              target=t * scale * (1 - 1e-9), gap=tol, nodes=ROUND_MILP_NODES,
                              floor=pk["lp_time"] * scale)
        if got is not None and rounded_time(got, loads, cap) < t and fits(got):
            counts, t = got, rounded_time(got, loads, cap)
    return S, counts, t, pool["parents"]


def integral_streams(net: Network, root: int, pk: dict, max_blocks: int | None, deadline: float,
                     most: int = INTEGRAL_STREAMS) -> tuple[int, np.ndarray, float, list] | None:
    """The fewest streams ``k`` (of :func:`stream_counts`, up to ``most``) at which ``k`` arc-
    disjoint out-trees of the root in integral arc multiplicities reach the LP's time within
    :data:`.rounding.ROUND_TOL` (:func:`.branchings.integral_arcs` and :func:`.branchings.trees_on`
    with a root: Edmonds' theorem, exact), else the fastest such packing found, as
    ``(streams, streams per tree, seconds per byte, trees)``; None on networks too large for them
    (:func:`.branchings.sized`), or where none is found before ``deadline``. Where the LP's weights
    round badly at every stream count a program can afford (an 8-GPU mesh: a vertex of 42 trees
    whose best rounding at 116 streams is 0.975 of the LP, where 7 trees of one stream each are
    exact), this finds the exact one."""
    from hccc.compiler.synth import branchings as br

    n = net.nranks
    if n > br.MAX_RANKS or not br.sized(net):
        return None
    cap, lp = pk["cap"], pk["lp_time"]
    # a pair carries at most floor(k cap T) of k streams in the time T = the LP's within the
    # tolerance; every rank but the root must be entered, and the root left, by k of them: a k
    # short of that at a single rank cannot be exact and is not solved for
    share = cap[:net.npairs] * lp * (1 + ROUND_TOL)
    ends = [net.pdst == v for v in range(n) if v != root] + [net.psrc == root]
    sets: list = []
    best = None
    for k in stream_counts(n):
        if k > most or clock.now() > deadline:
            break
        whole = np.floor(k * share + 1e-9)
        if any(whole[e].sum() < k for e in ends):
            continue
        got = br.integral_arcs(net, k, cap, deadline, sets, root=int(root))
        if got is None:
            continue
        t, mult = got
        if best is not None and t >= best[2]:
            continue
        trees = br.trees_on(net, mult, k, deadline, root=int(root))
        if trees is None:
            continue
        parents = [par for _, par, _ in trees]
        counts = np.array([c for _, _, c in trees], np.int64)
        if max_blocks is not None and float(stream_blocks(parents, counts, n).max()) > max_blocks:
            continue
        best = (k, counts, t, parents)
        if t <= lp * (1 + ROUND_TOL):
            break
    return best


def most_chunks_per_rank(nranks: int) -> int:
    """The most chunks per rank (at most the largest of :data:`.rounding.CHUNK_CANDIDATES`) whose
    transfers stay within :data:`TRANSFERS` (at least one)."""
    return max(1, min(max(CHUNK_CANDIDATES), TRANSFERS // max(1, nranks * (nranks - 1))))


def chunks_per_rank(nranks: int, streams: int) -> int:
    """Chunks per rank for ``streams`` equal streams: the most within :func:`most_chunks_per_rank`
    whose ``nranks`` times is a multiple of ``streams`` (``streams`` where none is)."""
    fit = [k for k in range(1, most_chunks_per_rank(nranks) + 1) if (nranks * k) % streams == 0]
    return max(fit) if fit else int(streams)


def synthesize_broadcast_trees(net: Network, root: int, *, pair_bw: np.ndarray | None = None,
                               total_bytes: float = float(1 << 30), time_limit: float = 60.0,
                               block_gbps: float | None = None, max_blocks: int | None = None):
    """The Broadcast from ``root`` of the module docstring as a :class:`.forest.TreeProgram` (rows
    ``(src, dst, step, chunk, op, channel)``). ``max_blocks``: thread blocks a rank keeps resident;
    where a channel per stream would need more, the streams share the pairs' channels."""
    from hccc.compiler.synth import forest

    t0 = clock.now()
    n = net.nranks
    if n > MAX_RANKS:
        raise ValueError(f"the tree Broadcast packs at most {MAX_RANKS} GPUs, not {n} (use --method search)")
    gbps = forest.DEFAULT_BLOCK_GBPS if block_gbps is None else float(block_gbps)
    pk = pack_broadcast(net, int(root), pair_bw=pair_bw, time_limit=float(time_limit) * forest.PACK_SHARE)
    S, counts, t_round, trees = streams_for(pk, n, max_blocks)
    integral = False
    if t_round > pk["lp_time"] * (1 + ROUND_TOL):
        got = integral_streams(net, int(root), pk, max_blocks,
                               min(t0 + float(time_limit) * forest.PACK_SHARE, clock.now() + INTEGRAL_SECONDS))
        if got is not None and got[2] < t_round * (1 - 1e-9):
            S, counts, t_round, trees = got
            integral = True
    K = chunks_per_rank(n, S)
    pieces = n * K // S
    used = np.flatnonzero(counts > 0)
    parents = [trees[t] for t in used.tolist()]
    counts = counts[used]
    r4, stream = broadcast_rows(parents, counts, pieces)
    rows = forest._rows(r4, RECV, 0, stream)
    rows[:, 5] = forest.fold_channels(rows[:, 5])     # at most MAX_CHANNEL + 1 channels on a pair
    shared = False
    if max_blocks is not None and len(rows) and int(forest.blocks_per_rank(rows, n).max()) > max_blocks:
        rows[:, 5] = 0                    # the streams share each pair's one channel
        shared = True
    # blocks per channel: a stream's planned rate on a pair (the streams of a shared one's) over
    # what one block moves
    seconds = t_round * float(total_bytes)
    rate = float(total_bytes) / S / seconds if seconds > 0 else 0.0
    if shared:
        rate *= S
    channels = tr.blocks_at(rate, gbps)
    lb_steps = int(np.max(_hops(net, int(root)))) if n > 1 else 0
    steps = forest._steps(rows)
    detail = {
        "method": "trees",
        "channels": channels,
        "warps": forest.WARPS,
        "blocks_per_rank": int(forest.blocks_per_rank(rows, n).max()) if len(rows) else 1,
        "max_blocks_per_rank": None if max_blocks is None else int(max_blocks),
        "model_seconds": seconds,
        "channels_per_pair": int(rows[:, 5].max()) + 1 if len(rows) else 1,
        "trees": {"broadcast": {"trees": len(parents), "streams": int(S), "chunks_per_rank": K,
                                "lp_seconds_per_byte": pk["lp_time"], "bound_seconds_per_byte": pk["lower_bound"],
                                "model_fraction": pk["lp_time"] / t_round if t_round > 0 else 1.0,
                                "lp_iterations": pk["rounds"], "columns": pk["columns"],
                                "wall_s": round(pk["seconds"], 3), "shared_channels": shared,
                                "integral": integral}},
    }
    return forest.TreeProgram(rows, steps, lb_steps, K, detail, clock.now() - t0)


def _hops(net: Network, root: int) -> np.ndarray:
    """Hop distances from ``root`` (every rank reachable: the caller checked)."""
    from hccc.compiler.synth.bounds import _distances

    return _distances(net, [root])[0]
