"""Bandwidth-regime synthesis: AllGather, ReduceScatter and AllReduce from tree packings.

:func:`synthesize_trees` packs spanning trees (:mod:`.trees`) and returns the program, reported
like the search's :class:`~hccc.compiler.synth.collectives.SynthResult`, with
``detail["method"] = "trees"`` and the packing's figures (:class:`TreeProgram`, which
:func:`~hccc.compiler.synth.collectives.synthesize` wraps):

* AllGather: out-trees on the network, chunks broadcast down them (``recv``).
* ReduceScatter: out-trees on the *transposed* network, i.e. in-trees here, partial sums reduced
  up them (``rrc``): the time-reverse of an AllGather, so its throughput fraction equals the
  AllGather's on the transposed network.
* AllReduce: that ReduceScatter, then that AllGather of the reduced chunks.

How the trees become a program that runs at the packing's rate (in the simulator as on GPUs, a
thread block runs its primitives one after another, each for all of its micro-batches, and links
are shared max-min fairly between the flows on them):

* **A channel per stream.** A *stream* is one of the packing's chunks (``1/K`` of its root's
  data) on its way down its tree. Every transfer of a stream between a pair of ranks names the
  channel the stream takes on that pair (``transfer(..., channel)``; the streams using the pair
  are numbered 0, 1, ...), so each stream has connections and thread blocks of its own and the
  streams that share a link run side by side. On one channel a thread block would forward one
  stream after another: a stream arriving slowly (over a NIC) holds up everything queued behind
  it, and the rest is forwarded after it ends. All streams have the same planned rate, so a fair
  share of a link or shared group is never below what the packing plans for a stream on it: a
  tree that carries several chunks gets as many streams, and its weight in every fair share.
* **Fewer warps, then bundles, where blocks would not be resident.** A rank's kernel needs every
  thread block resident at once; when the busiest rank would need more blocks than its GPU holds
  (``max_blocks``, :func:`resident_blocks`), the program is first written with fewer warps per
  block (8, then 4: twice, four times the blocks resident, each moving that much less, which a
  stream's planned rate rarely needs: 512 H800s, one chunk per rank, 1,023 blocks at 8 warps);
  where even that is too many, the streams of each tree share channels in bundles
  of at most 2, 3, 4, ... streams (:func:`bundled`): a bundle's streams cross the same pairs and
  arrive one after another, so a rank still forwards each as it arrives, but a bundle takes one
  fair share of a link where its streams took one each, so the program is slower. Streams of
  different trees never share a channel: they arrive side by side, each at its planned rate, and
  a thread block forwarding one would keep the other waiting. With a simulator to choose, a
  bundled program's packing is also rounded again from its LP to fewer chunks per rank
  (:func:`rerounded`, :func:`chunks_to_fit`: the streams scaled to the blocks), every stream on a
  channel of its own: coarser rounding against bundles' lost shares, the faster kept.
* **Pipelined streams.** Each chunk is cut ``split`` ways (:func:`split_for`: at least 2, and at
  least :data:`SPLIT_TARGET` chunks per rank, unless that makes more than
  :data:`SPLIT_MAX_TRANSFERS` transfers), so a stream is a sequence of chunks flowing down its
  tree one behind the other; a rank forwards one while the next arrives.
* **Blocks per thread block** (``nChannels``): enough for a stream's planned rate at the
  per-block throughput (:func:`blocks_for`); ``hccc synth`` then keeps the fewest with which the
  simulated time is that of a run without the per-block limit.
* AllReduce: the AllGather's channels come after the ReduceScatter's, so the second phase's
  streams never queue behind the first's on a thread block.

ReduceScatter is built by the same recipe on the transposed network, so it is the time-reverse of
an AllGather: its streams, channels and chunks mirror the AllGather's.

Several shapes of the same packing (:data:`.tree_shapes.SHAPES`) are built; with a ``score`` (the
simulated time of a program, lower is better) the best is kept, otherwise the first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.compiler.frontend.algorithm import MAX_CHANNEL, RECV, RRC
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth import trees as tr
from hccc.compiler.synth.packing import Packing, transposed_pair_order
from hccc.compiler.synth.packing_lp import LP_TOL
from hccc.compiler.synth.rounding import CHUNK_CANDIDATES, ROUND_MILP_SECONDS
from hccc.compiler.synth.tree_rows import LoopRows, allgather_rows, loop_rows, reducescatter_rows
from hccc.compiler.synth.tree_shapes import SHAPES, shaped
from hccc.compiler.synth.selection import SelectionLoop

#: GB/s one block moves (the simulator's default per-block limit, :mod:`hccc.compiler.passes.channels`)
from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS, block_gbps_at
from hccc.util import clock


#: the fewest chunks per rank a tree program splits its trees into (:func:`split_for`)
SPLIT_TARGET = 8
#: the chunks per rank a finer split reaches where it stays within :data:`SPLIT_FINE_TRANSFERS`:
#: a stream's last pieces leave the links of its deep ranks idle for a piece's time each, so finer
#: pieces end closer to the bound (one MI250 node: 0.973 -> 0.986 of it at 12 -> 48 chunks)
SPLIT_FINE_TARGET = 32
#: the most transfers (of one collective) the finer split may lead to: more cost more to simulate
#: (every candidate is) and to compile than the few thousandths they win
SPLIT_FINE_TRANSFERS = 40_000
#: the fewest pieces a stream of a ReduceScatter (and so an AllReduce) is cut into: a rank sends
#: a piece of its partial sum once its last child's piece has reduced into it, so coarse pieces
#: leave the links after a join idle for up to a piece's time (:func:`split_for`)
REDUCE_SPLIT_LEAST = 4
#: a program simulated this much slower than its packing's time in the link model loses to its
#: pipelines' fill and drain, which grow with the streams on each link (each stream's pieces cross
#: a link at its share of it): the same LP rounded to half the chunks per rank is tried too, and
#: halved again while that gains (four MI250 nodes' ReduceScatter: 0.80 -> 0.87 of the bound; 32
#: GPUs in nodes of 8-GPU rings: 0.94 -> 0.97). Not for AllReduce: its simulations cost most and
#: gained nothing there (four MI250 nodes: 0.912 -> 0.895 of RS + AG's optimum)
FEWER_STREAMS_ABOVE = 0.02
#: the most transfers (of one collective) splitting may lead to (:func:`split_for`)
SPLIT_MAX_TRANSFERS = 100_000
#: the share of ``time_limit`` the packings may use: the rest is kept for building the program
#: (splitting, shaping, bundling) and for what the caller does with it (simulating, writing); a
#: packing stopped short of its LP loses more than the simulations it leaves time for can win
PACK_SHARE = 0.8


@dataclass
class TreeProgram:
    """What :func:`synthesize_trees` makes: transfer rows ``(src, dst, step, chunk, op, channel)``,
    their steps, the hop-distance step bound, chunks per rank and the report (``detail``)."""

    rows: np.ndarray
    steps: int
    lower_bound_steps: int
    chunks_per_rank: int
    detail: dict
    seconds: float
    #: the rows as loops over a symmetry (one :class:`.tree_rows.LoopRows` per part), or None
    loops: list | None = None


def _rows(rows4: np.ndarray, op: int, step0: int = 0, tree: np.ndarray | None = None) -> np.ndarray:
    """``(src, dst, step, chunk, op, channel)`` rows; ``tree``: the stream of every chunk id, the
    streams (or bundles) of each pair numbered as channels (:func:`pair_channels`; ``tree`` None:
    channel 0)."""
    if not len(rows4):
        return np.zeros((0, 6), np.int64)
    ch = np.zeros(len(rows4), np.int64) if tree is None else pair_channels(
        rows4[:, 0], rows4[:, 1], tree[rows4[:, 3]])
    return np.c_[rows4[:, 0], rows4[:, 1], rows4[:, 2] + step0, rows4[:, 3],
                 np.full(len(rows4), op), ch].astype(np.int64)


def pair_channels(src: np.ndarray, dst: np.ndarray, stream: np.ndarray) -> np.ndarray:
    """The channel of every transfer: the index of its ``stream`` (or bundle of streams, see
    :func:`bundles`) among those that use its pair ``(src, dst)``, in order (0, 1, ...)."""
    src, dst, stream = (np.asarray(a, np.int64) for a in (src, dst, stream))
    if not len(src):
        return np.zeros(0, np.int64)
    pair = src * (int(max(src.max(), dst.max())) + 1) + dst
    o = np.lexsort((stream, pair))
    ps, ss = pair[o], stream[o]
    new_pair = np.r_[True, ps[1:] != ps[:-1]]
    new_stream = new_pair | np.r_[True, ss[1:] != ss[:-1]]
    idx = np.cumsum(new_stream) - 1                     # distinct (pair, stream) in sorted order
    first = np.maximum.accumulate(np.where(new_pair, idx, 0))
    out = np.empty(len(src), np.int64)
    out[o] = idx - first
    return out


def fold_channels(channel: np.ndarray, most: int | None = None) -> np.ndarray:
    """``channel`` numbers folded onto ``0..most`` (default
    :data:`~hccc.compiler.frontend.algorithm.MAX_CHANNEL`) where any exceeds ``most``: channel ``c`` of
    ``0..top`` becomes ``c * (most + 1) // (top + 1)``, so neighbouring numbers share a channel
    (on a pair: streams next to each other in stream order), each channel takes at most
    ``ceil((top + 1) / (most + 1))`` of them, and the order of the numbers is kept (an AllReduce's
    ReduceScatter channels stay below its AllGather's). A function of the number alone, so the
    channels of a symmetric program's loops fold as their expansion does.

    Why it is needed: a pair of ranks carries a stream of every tree that crosses it, and on a
    cluster of many nodes every root's tree crosses each node's pairs, so the streams on one pair
    grow with the nodes (74 nodes of 8 H20s: 131 per half of an AllReduce; 65,536 GPUs: thousands),
    past what a transfer may name (:data:`~hccc.compiler.frontend.algorithm.MAX_CHANNEL`). A
    shared channel is correct (its transfers keep their step order on one connection) and slower
    only where its streams would have run side by side."""
    most = MAX_CHANNEL if most is None else int(most)
    ch = np.asarray(channel, np.int64)
    if not len(ch):
        return ch
    top = int(ch.max())
    if top <= int(most):
        return ch
    return ch * (int(most) + 1) // (top + 1)


def bundles(packing: Packing, split: int, most: int | None, trees=None) -> np.ndarray:
    """The channel bundle of every stream (indexed ``root * K + j``, ``K`` the packing's chunks
    per rank before splitting ``split`` ways): ``most`` None, a bundle per stream; otherwise the
    streams of one tree (which cross the same pairs at the same steps, so a bundle's streams
    arrive one after another on its channel and a rank forwards each as it arrives) are cut into
    bundles of at most ``most``, as equal as can be. ``trees``: the trees whose streams are
    numbered (default all; the representatives of a symmetric packing)."""
    K = packing.chunks_per_rank // int(split)
    n = packing.nranks
    out = np.arange(n * K, dtype=np.int64)
    if most is None:
        return out
    trees = range(len(packing.roots)) if trees is None else trees
    nxt: dict[int, int] = {}
    bid = n * K
    for t in trees:
        r, s_ = packing.roots[t], packing.counts[t] // int(split)
        j0 = nxt.get(r, 0)
        nxt[r] = j0 + s_
        if s_:
            g = -(-s_ // max(1, int(most)))
            out[r * K + j0:r * K + j0 + s_] = bid + np.arange(s_) * g // s_
            bid += g
    return out


def blocks_per_rank(rows: np.ndarray, nranks: int) -> np.ndarray:
    """Thread blocks every rank needs for ``rows`` (``src, dst, ..., channel`` in column 5): one
    per connection end, a connection per pair and channel, and one for local work; the compiler's
    allocation shares a thread block between connections whose spans do not overlap, so this is
    an upper bound."""
    if not len(rows):
        return np.ones(nranks, np.int64)
    src, dst, ch = (np.asarray(rows[:, c], np.int64) for c in (0, 1, 5))
    conn = np.unique((src * nranks + dst) * (int(ch.max()) + 1) + ch) // (int(ch.max()) + 1)
    return 1 + np.bincount(conn // nranks, minlength=nranks) + np.bincount(conn % nranks, minlength=nranks)


def stream_blocks(packs: dict, most: int | None = None) -> int:
    """The thread blocks of the busiest rank of the program of ``packs`` (name -> packing: one
    collective, or an AllReduce's halves) with a channel per stream (``most`` None) or per bundle
    of at most ``most`` streams of a tree (:func:`bundles`), from the trees alone: a connection
    per channel and arc, a thread block at each end, and one for local work (what
    :func:`blocks_per_rank` counts on the built rows; splitting adds no connection)."""
    ends = None
    for p in packs.values():
        n = p.nranks
        ends = np.ones(n, np.int64) if ends is None else ends
        for par, c in zip(p.parents, p.counts):
            par = np.asarray(par)
            ch = int(c) if most is None else -(-int(c) // max(1, int(most)))
            ends += ch * (np.bincount(par[par >= 0], minlength=n) + (par >= 0))
    return int(ends.max()) if ends is not None else 1


def split_for(chunks_per_rank: int, nranks: int = 0, least: int = 2) -> int:
    """How many ways every chunk of a packing with ``chunks_per_rank`` is cut: the least power of
    two, at least ``least`` (a power of two), giving at least :data:`SPLIT_TARGET` chunks per rank;
    halved while the program (``nranks (nranks - 1)`` transfers per chunk id of an AllGather) would
    have more than
    :data:`SPLIT_MAX_TRANSFERS` transfers, down to 1 (large clusters: the text, the compiler and
    the simulator grow with the transfers); then doubled towards :data:`SPLIT_FINE_TARGET` chunks
    per rank while that stays within :data:`SPLIT_FINE_TRANSFERS`."""
    K = max(1, int(chunks_per_rank))
    s = max(1, int(least))
    while s * K < SPLIT_TARGET:
        s *= 2
    per_split = max(1, int(nranks) * (int(nranks) - 1)) * K
    while s > 1 and s * per_split > SPLIT_MAX_TRANSFERS:
        s //= 2
    while s * K < SPLIT_FINE_TARGET and 2 * s * per_split <= SPLIT_FINE_TRANSFERS:
        s *= 2
    return s


def split_packing(packing: Packing, split: int) -> Packing:
    """``packing`` with every chunk cut into ``split`` (the same trees, ``split`` times the chunks)."""
    import dataclasses

    if split == 1:
        return packing
    return dataclasses.replace(packing, chunks_per_rank=packing.chunks_per_rank * split,
                               counts=[int(c) * split for c in packing.counts])


def stream_of_chunk(packing: Packing, split: int) -> np.ndarray:
    """The stream of every chunk id of a packing split ``split`` ways: the packing's chunk it was
    cut from (chunk ids ``r*K + j`` of root ``r``, as :func:`.tree_rows.allgather_rows` and
    :func:`.tree_rows.reducescatter_rows` number them, stay in order when cut)."""
    return np.arange(packing.nranks * packing.chunks_per_rank, dtype=np.int64) // int(split)


def stream_rows(packing: Packing, collective: str, split: int, step0: int = 0,
                bundle: np.ndarray | None = None) -> np.ndarray:
    """``(src, dst, step, chunk, op, channel)`` rows of ``packing``'s trees as ``collective``
    (allgather: out-trees, ``recv``; reducescatter: the trees turned around, ``rrc``), every chunk
    cut ``split`` ways (:func:`split_packing`), steps from ``step0``, every stream on a channel of
    its own on each pair it crosses (``bundle``: the bundle of every stream, :func:`bundles`;
    None: a channel per stream)."""
    sp = split_packing(packing, split)
    reduce = collective == "reducescatter"
    r4 = reducescatter_rows(sp) if reduce else allgather_rows(sp)
    bd = bundles(sp, split, None) if bundle is None else bundle
    return _rows(r4, RRC if reduce else RECV, step0, bd[stream_of_chunk(sp, split)])


def loop_channels(loops: LoopRows, split: int, bundle: np.ndarray | None = None) -> np.ndarray:
    """Channels of the representative rows of a symmetric program (``loops``) that are the same in
    every translate: the streams on a pair are the translates of the (stream, pair) combinations of
    the representative rows whose pair lies in that pair's orbit, one each (the symmetry acts
    freely on the ranks), so numbering the combinations within each pair orbit gives every stream
    on a pair a channel of its own, 0, 1, ..., on every pair of the orbit; ``bundle`` (of every
    ``root * K + j`` stream, :func:`bundles`): streams of one bundle share their channel."""
    r = loops.rows
    if not len(r):
        return np.zeros(0, np.int64)
    E = loops.symmetry.ranks
    n = E.shape[1]
    orbit = (E[:, r[:, 0]] * n + E[:, r[:, 1]]).min(axis=0)       # least pair of the pair's orbit
    unit = r[:, 3] * (loops.chunks_per_rank // int(split)) + r[:, 4] // int(split)
    if bundle is not None:
        unit = bundle[unit]
    combo = np.stack([orbit, unit, r[:, 0], r[:, 1]], axis=1)
    _, first, inv = np.unique(combo, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    keys = combo[first]                                          # sorted: by orbit, then the rest
    new_orbit = np.r_[True, keys[1:, 0] != keys[:-1, 0]]
    idx = np.arange(len(keys))
    start = np.maximum.accumulate(np.where(new_orbit, idx, 0))
    return (idx - start)[inv].astype(np.int64)


def blocks_for(packing: Packing, data_bytes_per_rank: float, seconds: float, *, block_gbps: float,
               streams: int = 1) -> int:
    """Blocks per thread block so that ``streams`` streams, at the rate the packing plans for a
    stream (``1/K`` of its root's data over ``seconds``), fit in their thread block's blocks."""
    if seconds <= 0 or not packing.counts:
        return 1
    return tr.blocks_at(data_bytes_per_rank / packing.chunks_per_rank / seconds * max(1, int(streams)), block_gbps)


#: bundle sizes :func:`bundled` tries, smallest first, while a program needs more blocks than resident
BUNDLE_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: warps per block of the tree programs (``nWarps``), and the fewest :func:`bundled` lowers it to
WARPS = 16
LEAST_WARPS = 4


def bundled(build: Callable, channels: Callable, connections: Callable[[int], int], nranks: int,
            max_blocks: int | None, resident: Callable[[int], int | None] | None = None):
    """The program ``build(most)`` with a channel per stream (``most`` None) or, when its busiest
    rank needs more than ``max_blocks`` blocks at :data:`WARPS` warps per block
    (:func:`blocks_per_rank` x blocks per thread block, ``channels(most, warps)``):

    1. with fewer warps per block (halved down to :data:`LEAST_WARPS`), where the blocks of a
       channel per stream fit what stays ``resident(warps)`` then, with blocks per thread block
       for the streams' planned rate at a block's slower rate: the streams keep their channels;
    2. else with every tree's streams in bundles of at most ``most`` (the least of
       :data:`BUNDLE_SIZES` within ``max_blocks``, else the one needing the fewest). A bundle's
       streams run on one thread block one after another, so the program gets slower (a bundle
       takes one fair share of a link where its streams took one each). ``connections(most)``
       counts the busiest rank's thread blocks of each bundle size from the trees
       (:func:`stream_blocks`), so only the size chosen is built.

    Every thread block of a rank must be resident at once for the program to run at all. Returns
    ``(rows, info, channels, most, blocks, warps, fits, own)``: ``fits`` whether the blocks are
    resident, ``own`` the blocks of the program with a channel per stream at :data:`WARPS`."""
    rows, info = build(None)
    ch = channels(None, WARPS)
    conns = int(blocks_per_rank(rows, nranks).max())
    blocks = own = conns * ch
    if max_blocks is None or blocks <= max_blocks:
        return rows, info, ch, None, blocks, WARPS, True, own
    w = WARPS // 2
    while resident is not None and w >= LEAST_WARPS:
        cap, chw = resident(w), channels(None, w)
        if cap is None or conns * chw <= cap:
            return rows, info, chw, None, conns * chw, w, True, own
        w //= 2
    best = (rows, info, ch, None, blocks)
    need = [connections(most) * channels(most, WARPS) for most in BUNDLE_SIZES]
    fit = [j for j, b in enumerate(need) if b <= max_blocks]
    j = fit[0] if fit else min(range(len(need)), key=lambda j: need[j])
    if need[j] < blocks:
        most = BUNDLE_SIZES[j]
        rows, info = build(most)
        ch = channels(most, WARPS)
        best = (rows, info, ch, most, int(blocks_per_rank(rows, nranks).max()) * ch)
    return best + (WARPS, best[4] <= max_blocks, own)


def rerounded(packs: dict, chunks: int, time_limit: float) -> dict | None:
    """``packs`` (name -> :class:`~.packing.Packing`: one collective, an AllReduce's halves, or its
    joint packing) rounded again from their LPs to at most ``chunks`` chunks per rank, the halves
    of an AllReduce to one count; None where a packing keeps no LP to round again."""
    if any(p.reround is None for p in packs.values()):
        return None
    names = list(packs)
    first = packs[names[0]]
    if first.stats.get("joint"):
        ag, rs = first.reround(chunks, time_limit)
        return {"allgather": ag, "reducescatter": rs}
    out = {name: packs[name].reround(chunks, time_limit / len(names))[0] for name in names}
    K = max(p.chunks_per_rank for p in out.values())
    for name, p in out.items():
        if p.chunks_per_rank != K:           # the halves share one chunk count
            out[name] = packs[name].reround(K, time_limit / len(names), min_chunks=K)[0]
    return out


def chunks_to_fit(chunks: int, own_blocks: int, max_blocks: int) -> int:
    """The most chunks per rank (of :data:`.rounding.CHUNK_CANDIDATES`, below ``chunks``) whose program,
    with a channel per stream, should stay within ``max_blocks`` blocks: a rank's connections grow
    with its streams, so ``own_blocks`` (the blocks of ``chunks`` per rank) scaled; 0 where none."""
    k = int(chunks) * int(max_blocks) / max(1, int(own_blocks))
    fit = [c for c in CHUNK_CANDIDATES if c < int(chunks) and c <= k]
    return max(fit) if fit else 0


def joint_chunks_resident(nranks: int, max_chunks: int | None, max_blocks: int | None,
                          resident: Callable[[int], int | None] | None) -> int | None:
    """The most chunks per rank (of :data:`.rounding.CHUNK_CANDIDATES`, at most ``max_chunks``) the
    joint AllReduce packing rounds to: with a channel per stream, its ``2 nranks K`` streams of
    ``nranks - 1`` arcs each give a rank ``4 K (nranks - 1)`` connection ends on average, a thread
    block each, so past what stays resident at the fewest warps (:data:`LEAST_WARPS`) its program
    could only run in bundles, which a re-rounding to fewer chunks at fewer warps beats
    (mixed_v100_w7800, 64 heterogeneous H20s), and rounding to such counts (MILPs at up to 32 chunks per rank, and an LP
    over every root where the classes round only at many) cost 64 heterogeneous V100s 14 s. Only
    where blocks of fewer warps are an option (``resident``): without it, bundles at more chunks
    may be all that fits."""
    least = resident(LEAST_WARPS) if resident is not None else None
    if not least or nranks < 2:
        return max_chunks
    fit = [c for c in CHUNK_CANDIDATES if 4 * c * (nranks - 1) <= least] or [1]
    return min(max(fit), max_chunks or max(fit))


def resident_blocks(vendors, nwarps: int = 16) -> int | None:
    """The most blocks a rank's kernel may have on every platform of ``vendors`` (one per rank:
    ``nvidia``, ``amd``) at ``nwarps`` warps per block (:func:`~hccc.compiler.passes.channels.max_blocks_per_rank`); None
    when no platform has a fixed limit."""
    import types

    from hccc.compiler.passes.channels import max_blocks_per_rank

    plats = sorted({"hip" if str(v).lower() == "amd" else "cuda" for v in vendors})
    caps = [c for c in (max_blocks_per_rank(types.SimpleNamespace(nwarps=int(nwarps)), p) for p in plats)
            if c is not None]
    return min(caps) if caps else None


def _steps(rows: np.ndarray) -> int:
    return int(rows[:, 2].max()) + 1 if len(rows) else 0


def _distance_bound(net: Network) -> int:
    """Steps any schedule needs by hop count alone (the farthest rank from some chunk's origin):
    tree programs move several chunks over a link in one step, so the step model's capacity
    bounds do not apply to them."""
    from hccc.compiler.synth.bounds import _distances

    if net.nranks < 2:
        return 0
    d = _distances(net, list(range(net.nranks)))
    if (d < 0).any():
        raise ValueError("some rank cannot be reached from another (the cluster is not strongly connected)")
    return int(d.max())


class PackSet:
    """The packings of one program (name -> :class:`~.packing.Packing`: one collective, an
    AllReduce's halves, or its joint packing), and what the selection loop did with them already
    (an object of its own: the loop's marks are its attributes, not lookups by identity)."""

    def __init__(self, by_name: dict):
        self.by_name = dict(by_name)
        self.refitted = False        # its bundled program was also tried with fewer chunks
        self.halved = False          # re-rounded to fewer streams (FEWER_STREAMS_ABOVE)
        self.alternated = False      # its integral trees' LP rounding was queued (Packing.alternative)
        self.integral_built = False  # its integral trees were built (unshaped, once)
        self.engine_refitted = False  # re-rounded to fewer chunks for the target engine (``engine``)
        #: the simulated seconds of the program it was re-rounded from to fewer streams: another
        #: halving only while each is faster than that
        self.thinned_from = np.inf

    def items(self):
        return self.by_name.items()

    def values(self):
        return self.by_name.values()

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __getitem__(self, name: str) -> Packing:
        return self.by_name[name]

    @property
    def joint(self) -> bool:
        return any(p.stats.get("joint") for p in self.values())

    @property
    def chunks(self) -> int:
        return max(p.chunks_per_rank for p in self.values())

    def model_time(self, of: str = "rounded_time") -> float:
        """Seconds per byte of a rank's data in the link model (``of``: the
        :class:`~.packing.Packing` attribute summed, or for a joint packing the larger: its rounded
        trees' time, their ``load_time`` as reshaped, or the ``lower_bound`` its LP proved)."""
        return (max if self.joint else sum)(getattr(p, of) for p in self.values())


class _Lazy:
    """A variant's packings made when its turn comes (once), by ``make()``."""

    def __init__(self, make: Callable[[], PackSet]):
        self._make, self._got = make, None

    def get(self) -> PackSet:
        if self._got is None:
            self._got = self._make()
        return self._got


@dataclass
class Job:
    """A program to build: its packings (or the maker of them) at ``chunks`` per rank, joint or
    not, reshaped by ``shape`` ("" unshaped); for a target engine, ``own_connections``: a
    connection per stream kept, at the most pieces the engine takes (:meth:`_Builder.engine_program`)."""

    chunks: int
    packs: PackSet | _Lazy
    joint: bool
    shape: str
    own_connections: bool = False


@dataclass
class Candidate:
    """A program built: its rank (not resident, seconds, blocks: least first), shape, rows, the
    split packings (``info``), chunks per rank, packings, blocks per thread block, split, streams
    per bundle, blocks of the busiest rank, warps and simulated seconds (None: not simulated)."""

    rank: tuple
    shape: str
    rows: np.ndarray
    info: dict
    chunks: int
    packs: PackSet
    channels: int
    split: int
    most: int | None
    blocks: int
    warps: int
    simulated: float | None

    @property
    def fits(self) -> bool:
        return not self.rank[0]

    def label(self) -> str:
        return (f"K={self.chunks} {self.shape or ('joint' if self.packs.joint else 'unshaped')}"
                + (f" bundles of {self.most}" if self.most else " one connection a pair" if self.most == 0 else "")
                + f" blocks {self.blocks}"
                + (f" of {self.warps} warps" if self.warps != WARPS else ""))


@dataclass
class _Setting:
    """What every stage of :func:`synthesize_trees` reads: the collective, the network (and its
    transpose per half), the bandwidths, the buffer, the limits and the clock's deadlines."""

    coll: str
    net: Network
    bw: np.ndarray
    per_rank: float
    block_gbps: float | None
    max_blocks: int | None
    resident: Callable[[int], int | None] | None
    max_chunks: int | None
    score: Callable | None
    t0: float
    deadline: float
    pack_deadline: float
    own_bw: bool = False         # ``bw`` is the network's own (no ``pair_bw`` given)
    #: the target engine's check of a program's rows on one channel: why it refuses them (None:
    #: it runs them), see :func:`synthesize_trees`
    engine: Callable[[np.ndarray], str | None] | None = None
    nets: dict = field(default_factory=dict)
    cut_by_limit: list = field(default_factory=list)   # what the time limit cut (``detail["time_limit_cut"]``)
    halves_s: float = 0.0        # what the packings of the halves took (:func:`_pack_halves`)
    halves_left: float = 0.0     # the packing time they left (``left()`` as they ended)

    def left(self, share: int = 1) -> float:
        """Seconds the next packing gets: its part (1 of ``share`` still to come) of the packing time."""
        return max(0.0, self.pack_deadline - clock.now()) / max(1, share)

    def half_bw(self, name: str) -> np.ndarray:
        """The pair bandwidths of half ``name``'s network (transposed for the ReduceScatter's)."""
        return self.bw if name == "allgather" else self.bw[transposed_pair_order(self.net)]

    def stopped(self, p: Packing, name: str) -> None:
        # the column generation ends at its LP optimum (within the tolerance) unless stopped
        if p.lp_time > p.lower_bound * (1 + LP_TOL):
            self.cut_by_limit.append(f"{name} packing stopped short of its LP optimum (proven bound "
                                     f"{p.lower_bound / p.lp_time:.4f} of its LP time)")
        self.clock_cut(p, name)

    def clock_cut(self, p: Packing, name: str) -> None:
        """Say where the clock, not a node limit, ended a rounding of ``p`` (what a slower machine
        may round otherwise: :meth:`.rounding._Rounding.clock_cut`), once per packing and count."""
        counts = p.stats.get("rounding_stopped_by_clock")
        if counts:
            note = (f"{name} rounding to {', '.join(map(str, counts))} chunks per rank stopped by the clock "
                    "before its node limit")
            if note not in self.cut_by_limit:
                self.cut_by_limit.append(note)


def _half_nets(st: _Setting) -> bool:
    """``st.nets``: the network each half of the collective packs its trees on, AllGather's own
    and ReduceScatter's transposed; True where reversing every pair gives the network again
    (bandwidths and groups alike: *mirror*), and ReduceScatter's in-trees are AllGather's
    out-trees on it (packed once, ReduceScatter then reaches AllGather's time in the link model;
    packed apart, the LP's ties fall another way)."""
    net, bw = st.net, st.bw
    mirror = net.is_self_transposed() and (st.own_bw or np.array_equal(bw, bw[transposed_pair_order(net)]))
    if st.coll in ("allgather", "allreduce"):
        st.nets["allgather"] = net
    if st.coll in ("reducescatter", "allreduce") and "reducescatter" not in st.nets:
        st.nets["reducescatter"] = net if mirror else net.transposed()
    return mirror


def _half_cut_bounds(st: _Setting) -> dict[str, float]:
    """The cut bound of each half of the collective (seconds per byte of a rank's data), on the
    network it packs its trees on (:func:`_half_nets`; a mirror's ReduceScatter has AllGather's)."""
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds

    mirror, n = _half_nets(st), st.net.nranks
    cut: dict[str, float] = {}
    for name in ("allgather", "reducescatter"):
        if name in st.nets:
            cut[name] = cut["allgather"] if mirror and "allgather" in cut else \
                collective_cut_bound_seconds(st.nets[name], "allgather", n, 1, 0, float(n))
    return cut


def _pack_halves(st: _Setting, joint_later: bool, cut: dict[str, float] | None = None) -> tuple[dict, dict]:
    """Stage 1: the AllGather and/or ReduceScatter packings, and the cut bound of each (seconds
    per byte of a rank's data; ``cut``: computed already, :func:`_half_cut_bounds`).
    ``joint_later``: an AllReduce's joint packing is still to be made (it shares the packing time
    with them). Sets ``st.halves_s``, the time they took."""
    t0 = clock.now()
    net, coll, bw = st.net, st.coll, st.bw
    later = int(joint_later and coll == "allreduce")
    mirror = _half_nets(st)
    cut = dict(cut) if cut is not None else _half_cut_bounds(st)
    packs: dict[str, Packing] = {}
    if coll in ("allgather", "allreduce"):
        packs["allgather"] = tr.pack_trees(net, pair_bw=bw, bound=cut["allgather"], max_chunks=st.max_chunks,
                                           time_limit=st.left(2 + later if coll == "allreduce" else 1))
        st.stopped(packs["allgather"], "AllGather")
    if coll in ("reducescatter", "allreduce"):
        if mirror and "allgather" in packs:
            packs["reducescatter"] = packs["allgather"]
        else:
            packs["reducescatter"] = tr.pack_trees(st.nets["reducescatter"],
                                                   pair_bw=bw if mirror else st.half_bw("reducescatter"),
                                                   bound=cut["reducescatter"], max_chunks=st.max_chunks,
                                                   time_limit=st.left(1 + later))
            st.stopped(packs["reducescatter"], "ReduceScatter")
    if net.bw is not None and np.allclose(bw, net.bw):
        # the packings' proven bounds (cut or Lagrangian) on the network's own bandwidths: above the
        # cut bound where trees must pay for what no cut sees (docs/bounds.md, the packing bound)
        for name, p in packs.items():
            cut[name] = max(cut[name], float(p.lower_bound))
    K = max(p.chunks_per_rank for p in packs.values())
    for name, p in list(packs.items()):
        if p.chunks_per_rank != K:
            # AllReduce: both halves with one chunk count (the larger one; re-rounded)
            packs[name] = tr.pack_trees(st.nets[name], pair_bw=st.half_bw(name), min_chunks=K, max_chunks=K,
                                        bound=p.lower_bound, time_limit=st.left())
            st.stopped(packs[name], {"allgather": "AllGather", "reducescatter": "ReduceScatter"}[name]
                       + f" ({K} chunks per rank, as the other half)")
    st.halves_s = clock.now() - t0
    st.halves_left = st.left()
    return packs, cut


def _joint(st: _Setting, share: int = 1) -> PackSet:
    """The joint AllReduce packing: both halves packed to run at once (their loads together within
    one time), in ``share`` of the packing time left; never slower in the link model, faster where
    their bottlenecks differ; unshaped (the shaping passes check one half's loads)."""
    jag, jrs = tr.pack_allreduce(st.net, pair_bw=st.bw, time_limit=st.left(share), max_chunks=joint_chunks_resident(
        st.net.nranks, st.max_chunks, st.max_blocks, st.resident))
    return PackSet({"allgather": jag, "reducescatter": jrs})


def _joint_first(st: _Setting) -> tuple[PackSet, dict, bool] | None:
    """Stage 1a, an AllReduce whose score can simulate a candidate ahead of the selection
    (``score.prefetch`` and ``score.run_ahead``): the halves' cut bounds and the joint packing
    made first, ``(joint, cut bounds, first)``. ``first``: the joint packing is faster in the link
    model than the halves' cut bounds together (on the network's own bandwidths no packing of the
    halves beats them), so it goes first in the selection loop (:func:`_variants`; so on the
    held-out 64-GPU clusters), and the loop starts on it while the halves are still to be packed
    (:class:`_Later`); should the halves, once packed, put it second after all (pair bandwidths
    other than the network's), the loop starts again in the usual order (:class:`_Restart`).
    Otherwise the halves are packed next, and the joint packing is not made again. Made first,
    it is a variant even where the time left would have skipped it after the halves
    (:func:`_variants`): its time is spent already. None (the usual order) where the score cannot
    simulate ahead or no packing time is left."""
    if not hasattr(st.score, "prefetch") or not hasattr(st.score, "run_ahead") or st.coll != "allreduce" or \
            st.left() <= 0:
        return None
    cut = _half_cut_bounds(st)
    joint = _joint(st, 3)
    return joint, cut, joint.model_time() < sum(cut.values()) * (1 - 1e-9)


class _Restart(Exception):
    """The halves packed, the joint packing does not go first after all (they beat it in the link
    model): the selection starts again from ``variants``, in their order (a simulation it ran
    ahead is taken where the same program is scored again)."""

    def __init__(self, variants: list, apart: PackSet):
        super().__init__("the joint packing goes after the halves")
        self.variants, self.apart = variants, apart


class _Later:
    """The halves of an AllReduce whose selection starts on its joint packing (:func:`_joint_first`),
    packed when the selection first needs them: at its first score, on another thread while the
    calling one runs that score's simulation (``overlap``: ``score.run_ahead``), or (without
    overlap) when its queue runs out or the time limit asks how many candidates are left.
    :meth:`make` returns the variants after the joint one and the packings apart, and keeps the
    halves' cut bounds (``cut``)."""

    def __init__(self, st: _Setting, joint: PackSet, cut: dict):
        self.st, self.joint, self.cut = st, joint, cut

    def make(self, overlap: Callable[[], None] | None = None) -> tuple[list, PackSet]:
        st = self.st
        if overlap is None:
            packs, self.cut = _pack_halves(st, False, self.cut)
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hccc-halves") as pool:
                halves = pool.submit(_pack_halves, st, False, self.cut)
                overlap()
                packs, self.cut = halves.result()
        apart = PackSet(packs)
        variants = _variants(st, apart, self.joint)
        if variants[0][1] is not self.joint:
            raise _Restart(variants, apart)
        return variants[1:], apart


def _one_chunk(st: _Setting, first: PackSet) -> PackSet:
    """``first``'s packings again at one chunk per rank (mirrored halves share one)."""
    made: list = []                 # (packing, its one-chunk packing)
    out = {}
    for name, p in first.items():
        got = next((q for o, q in made if o is p), None)
        if got is None:
            got = tr.pack_trees(st.nets[name], pair_bw=st.half_bw(name), max_chunks=1, bound=p.lower_bound,
                                time_limit=st.left(len(first.by_name)), exact=p.exact)
            made.append((p, got))
        out[name] = got
    return PackSet(out)


def _variants(st: _Setting, packs: PackSet, joint: PackSet | None = None) -> list[tuple[int, PackSet | _Lazy, bool]]:
    """Stage 2: the packings programs are built from, in the order they are tried: the packings
    apart, the joint AllReduce packing (``joint`` where :func:`_joint_first` made it), one chunk
    per rank (packed when its turn comes)."""
    K = packs.chunks
    variants = [(K, packs, False)]
    # a further packing only while the packing time the packings left (as they ended, whatever
    # ran since: an AllReduce's first simulation, :class:`_Later`) is at least what the halves
    # took (it solves an LP as large again): never where the limit binds. A joint packing made
    # already (:func:`_joint_first`) has cost its time: it is a variant whatever is left
    packed_s, left = st.halves_s, st.halves_left
    if st.coll == "allreduce" and joint is None and left < packed_s:
        st.cut_by_limit.append("AllReduce joint packing skipped")
    elif st.coll == "allreduce":
        if joint is None:
            joint = _joint(st)
            left = st.left()            # what the packings left: the halves and this one
        # simulated first where it is faster in the link model; where it is not (the halves'
        # bottlenecks are the same links), the halves apart first: a program at the bound then
        # ends the simulations before the other is simulated
        ahead = st.score is None or joint.model_time() < packs.model_time() * (1 - 1e-9)
        variants.insert(0 if ahead else 1, (joint.chunks, joint, True))
    if st.score is not None and K > 1 and left < packed_s:
        st.cut_by_limit.append("one-chunk packing skipped")
    elif st.score is not None and K > 1:
        # one chunk per rank too: rounding loses a little of the optimum in the link model, but a
        # thread block then has fewer transfers to run one after another (the simulator decides).
        # Packed when its turn comes, unless a program ran at what no packing beats by then
        variants.append((1, _Lazy(lambda: _one_chunk(st, packs)), False))
    return variants


class _Builder:
    """Stage 3: programs of packings (rows, channels, bundles, warps), the shaped packings kept
    (bundling rebuilds, never reshapes)."""

    def __init__(self, st: _Setting):
        self.st = st
        self._shapes: list = []      # (packing, shape, the shaped packing)

    def shaped(self, name: str, p: Packing, shape: str) -> Packing:
        """``p`` (half ``name``) reshaped by ``shape``, made once per packing and shape."""
        got = next((s for q, sh, s in self._shapes if q is p and sh == shape), None)
        if got is None:
            got = shaped(self.st.nets[name], p, shape)
            self._shapes.append((p, shape, got))
        return got

    def shaped_set(self, pk: PackSet, shape: str) -> dict:
        return {name: self.shaped(name, p, shape) for name, p in pk.items()}

    def channels_of(self, pk: PackSet, most: int | None = None, warps: int = WARPS) -> int:
        """Blocks per thread block of ``warps`` warps for the planned rate of a stream (of ``most``
        streams)."""
        st = self.st
        rate = block_gbps_at(st.block_gbps, warps) if st.block_gbps else 0.0
        return max(blocks_for(p, st.per_rank, p.rounded_time * st.per_rank, block_gbps=rate,
                              streams=most or 1) for p in pk.values())

    def resident_somewhere(self, tbs: int, pk: PackSet) -> bool:
        """A program of ``pk`` with ``tbs`` thread blocks on its busiest rank (a channel per
        stream) stays resident at some warps per block (as :func:`bundled` would run it)."""
        st = self.st
        w = WARPS
        while w >= LEAST_WARPS:
            cap = st.max_blocks if w == WARPS else st.resident(w) if st.resident is not None else None
            if (w == WARPS or st.resident is not None) and (cap is None or tbs * self.channels_of(pk, None, w) <= cap):
                return True
            w //= 2
        return False

    def build(self, shape: str, pk: PackSet, split: int, most: int | None = None) -> tuple[np.ndarray, dict]:
        """The rows of ``pk``'s program (ReduceScatter first), every chunk cut ``split`` ways,
        streams in bundles of at most ``most``; and the split packings (``info``, with the loops
        of a symmetric program)."""
        parts, step0, ch0, info, loops = [], 0, 0, {}, []
        for name in ("reducescatter", "allgather"):
            if name not in pk:
                continue
            op = RRC if name == "reducescatter" else RECV
            whole = self.shaped(name, pk[name], shape)
            sp = split_packing(whole, split)
            lp = loop_rows(sp, op, step0, reduce=name == "reducescatter")
            G = len(sp.symmetry) if lp is not None else 1
            bd = bundles(sp, split, most, trees=range(0, len(sp.roots), G))
            if lp is not None:
                # symmetric: channels alike in every translate, so the loops carry them
                lp.rows = np.c_[lp.rows, loop_channels(lp, split, bd) + ch0]
                rows = np.c_[lp.expand(), np.tile(lp.rows[:, 6], len(lp.symmetry))]
            else:
                rows = stream_rows(whole, name, split, step0, bd)
                rows[:, 5] += ch0
            loops.append(lp)
            step0 = _steps(rows)
            ch0 = int(rows[:, 5].max()) + 1 if len(rows) else ch0
            parts.append(rows)
            info[name] = sp
        rows = np.concatenate(parts)
        top = int(rows[:, 5].max()) if len(rows) else 0
        if top > MAX_CHANNEL:
            # more streams on a pair than a transfer may name channels: neighbours share (fold_channels)
            rows[:, 5] = fold_channels(rows[:, 5])
            for lp in loops:
                if lp is not None:
                    lp.rows[:, 6] = fold_channels(np.r_[lp.rows[:, 6], top])[:-1]
            info["channels_folded"] = top + 1
        info["loops"] = loops if all(lp is not None for lp in loops) else None
        return rows, info

    def program(self, job: Job, pk: PackSet):
        """``bundled``'s program of ``pk`` shaped ``job.shape``, and its split (for a target engine:
        :meth:`engine_program`)."""
        st = self.st
        split = split_for(job.chunks, st.net.nranks, REDUCE_SPLIT_LEAST if "reducescatter" in pk else 2)
        if st.engine is not None:
            return self.engine_program(job, pk, split)
        return split, bundled(
            lambda m: self.build(job.shape, pk, split, m), lambda m, w: self.channels_of(pk, m, w),
            lambda m: stream_blocks(self.shaped_set(pk, job.shape), m),
            st.net.nranks, st.max_blocks, st.resident)


    def engine_program(self, job: Job, pk: PackSet, split: int):
        """The program of ``pk`` as the target engine runs it: the first the engine's check
        (``st.engine``) accepts of every chunk cut ``split`` ways, then half as many, down to one,
        each with a connection per stream, then the streams of a tree in bundles of each of
        :data:`BUNDLE_SIZES` (a bundle's streams share a connection), then every stream of a pair
        on one connection. A connection is a thread block at each end in every engine, whose
        operations and steps are its transfers, so more connections and more pieces are what the
        engines' limits on thread blocks, operations and steps refuse, and what is given up first
        is the fewest of them. ``fits`` is whether the check accepts the program kept (no other
        residency applies: the engine's limit on thread blocks is in its check), one block per
        thread block (the engines copy a program per channel). With ``job.own_connections`` the
        streams keep a connection each and only the pieces are fewer. Returns what :meth:`program`
        does, ``most`` 0 where every stream of a pair shares its connection."""
        st = self.st
        while True:
            for most in (None,) if job.own_connections else (None,) + BUNDLE_SIZES + (0,):
                rows, info = self.build(job.shape, pk, split, most or None)
                if most == 0:
                    rows[:, 5] = 0         # every stream of a pair on one connection
                why = st.engine(rows)
                if why is None:
                    break
            if why is None or split == 1:
                break
            split //= 2
        if most is not None:
            info["loops"] = None           # the loops carry a channel per stream
        blocks = int(blocks_per_rank(rows, st.net.nranks).max())
        return split, (rows, info, 1, most, blocks, WARPS, why is None, blocks)


class _Selection(SelectionLoop):
    """Stage 4: synthesis's selection loop (:class:`~.selection.SelectionLoop`) over the programs
    of a queue of jobs, built (and, with a ``score``, simulated) best first, queueing further ones
    as the results ask (re-roundings to fewer chunks where the blocks do not fit or a program falls
    short of its packing, an integral packing's LP rounding), until the queue ends, no job can beat
    the best, or the deadline nears (the first candidate always; another only where it can be
    built well before the deadline, as long again for the caller's work on the program)."""

    def __init__(self, st: _Setting, builder: _Builder, variants: list, apart: PackSet | None,
                 later: _Later | None = None):
        self.st, self.builder, self.variants, self.apart, self.later = st, builder, variants, apart, later
        super().__init__(self._jobs(variants), st.deadline)
        self.not_needed = 0            # candidates not built (or not simulated): they cannot beat the best

    # ------------------------------------------------------------ the loop's parts
    def pending(self) -> bool:
        return self.later is not None

    def complete(self) -> None:
        self._complete()

    def cut(self, not_run: int, total: int) -> None:
        self.st.cut_by_limit.append(f"{not_run} of {total} candidate programs not built")

    def finish(self) -> None:
        if self.st.score is not None and all(not c.fits for c in self.candidates):
            self._score_unfit()

    def _complete(self, overlap: Callable[[], None] | None = None) -> None:
        """The variants still to come (:class:`_Later`) made and queued after the others."""
        if self.later is not None:
            later, self.later = self.later, None
            rest, self.apart = later.make(overlap)
            self.variants += rest
            self.queue.extend(self._jobs(rest))

    def _jobs(self, variants: list) -> list[Job]:
        shapes = SHAPES if self.st.score is not None else SHAPES[:1]
        return [Job(kv, pk, joint, shape) for kv, pk, joint in variants for shape in (("",) if joint else shapes)]

    def _score(self, *program) -> float:
        """The score of a program built; the first, where variants are still to come, simulated ahead
        here while they are made on another thread (:meth:`_complete`)."""
        if self.later is not None:
            self.st.score.prefetch(*program)
            self._complete(self.st.score.run_ahead)
        return self.st.score(*program)

    def _settled(self):
        return getattr(self.st.score, "settled", None)

    def beaten(self, floor: PackSet) -> bool:
        """The best fits and ran within the tolerance of the bound, or of the bound the LP of
        ``floor`` proved (no packing of trees beats it, so no program of this one, nor of a
        rounding or reshaping of it): this candidate cannot win."""
        settled = self._settled()
        return bool(self.candidates) and settled is not None and self._best_fits() and \
            settled(self.st.coll, floor.model_time("lower_bound") * self.st.per_rank)

    def _best_fits(self) -> bool:
        return not min(c.rank for c in self.candidates)[0]

    def _packs_of(self, job: Job) -> PackSet | None:
        """The job's packings (made now where still to be made), or None where it cannot win."""
        # a packing still to be made (fewer chunks of the same LP) is no better than the first
        # packings' bound, and once made, than its own
        lazy = isinstance(job.packs, _Lazy)
        if self.beaten(self.apart if lazy else job.packs):
            return None
        if lazy:
            job.packs = job.packs.get()
            if self.beaten(job.packs):
                return None
        return job.packs

    def step(self, job: Job) -> None:
        """Build (and score) one job's program; queue what its result asks for."""
        pk = self._packs_of(job)
        if pk is None:
            self.not_needed += 1
            return
        if any(p.stats.get("integral") for p in pk.values()):
            # integral trees (packing.Packing.alternative) fill their resources, so the shaping passes
            # have next to no room to move them: one candidate, unshaped
            if pk.integral_built and not job.own_connections:
                self.not_needed += 1
                return
            pk.integral_built = True
            job.shape = ""
        b0 = clock.now()
        split, (rows, info, ch, most, blocks, warps, fits, own) = self.builder.program(job, pk)
        if self.st.engine is not None:
            if not fits:
                self._refit_engine(job, pk)
            elif most is not None and not job.own_connections:
                # streams sharing connections at many pieces, or a connection each at fewer: the
                # simulator decides (12 H20s' ReduceScatter for MSCCL++: one connection per pair at
                # 32 chunks per rank ran at 0.59 of the bound)
                self.queue.appendleft(Job(job.chunks, pk, job.joint, job.shape, own_connections=True))
        elif (most is not None or warps < WARPS or not fits) and self.st.score is not None and not pk.refitted:
            if self._refit(job, pk, own):
                return
        st, settled = self.st, self._settled()
        if fits and self.candidates and settled is not None and self._best_fits() and \
                settled(st.coll, PackSet({k: v for k, v in info.items() if k in ("reducescatter", "allgather")}).model_time("load_time")
                        * st.per_rank, slack=False):
            # built (and any re-rounding of it queued): its trees' time in the link model (as
            # shaped) is no less than the best program's, so it cannot win
            self.not_needed += 1
            self.build_s = max(self.build_s, clock.now() - b0)
            return
        # a program whose blocks are not all resident ranks after every one that is: it is
        # simulated only where none is (below), so its simulation never takes the time of theirs
        sc = self._score(st.coll, rows, job.chunks * split, ch, warps) if st.score is not None and fits else None
        # without a simulator, the link model's time decides (then the fewest blocks)
        self.candidates.append(Candidate((not fits, sc if sc is not None else pk.model_time() * st.per_rank, blocks),
                                         job.shape, rows, info, job.chunks * split, pk, ch, split, most, blocks,
                                         warps, sc))
        self.build_s = max(self.build_s, clock.now() - b0)
        self._after(job, pk, sc)

    # ------------------------------------------------------------ what a result queues
    def _reround(self, pk: PackSet, k: int) -> PackSet | None:
        left_s = self.st.deadline - clock.now()
        got = rerounded(pk.by_name, k, min(ROUND_MILP_SECONDS, left_s / 4))
        return None if got is None else PackSet(got)

    def _refit_chunks(self, job: Job, pk: PackSet, own: int) -> PackSet | None:
        """The same LP rounded to the most chunks whose program fits resident blocks."""
        st = self.st
        k_fit = chunks_to_fit(job.chunks, own, (st.resident(LEAST_WARPS) if st.resident is not None else None)
                              or st.max_blocks)
        if k_fit == 1 and any(v[0] == 1 and v[2] == job.joint for v in self.variants):
            k_fit = 0                    # the one-chunk packing is a candidate already
        again = self._reround(pk, k_fit) if k_fit and st.deadline - clock.now() > 0 else None
        if k_fit and st.deadline - clock.now() <= 0:
            st.cut_by_limit.append(f"re-rounding to {k_fit} chunks per rank (resident blocks) skipped")
        # the scaling is an estimate (the trees of another rounding differ): more chunks
        # whose rounded trees still fit, counted exactly, are taken where there are such
        for k in sorted((c for c in CHUNK_CANDIDATES if max(1, k_fit) < c < job.chunks), reverse=True):
            if st.deadline - clock.now() <= 0:
                st.cut_by_limit.append(f"re-rounding to {k} chunks per rank (resident blocks) skipped")
                break
            more = self._reround(pk, k)
            if more is not None and more.chunks > (k_fit if again is None else again.chunks) and \
                    self.builder.resident_somewhere(stream_blocks(more.by_name), more):
                again = more
                break
        return again

    def _refit_engine(self, job: Job, pk: PackSet) -> None:
        """The target engine refuses ``job``'s program even with every chunk whole: the same LP
        rounded to the next fewer chunks per rank (of :data:`.rounding.CHUNK_CANDIDATES`) is built
        next, and so on while the engine refuses (a rank's transfers, and so the operations and
        steps of its connections, grow with the chunks per rank)."""
        if pk.engine_refitted:
            return
        pk.engine_refitted = True
        k = max((c for c in CHUNK_CANDIDATES if c < job.chunks), default=0)
        again = self._reround(pk, k) if k and self.st.deadline - clock.now() > 0 else None
        if k and self.st.deadline - clock.now() <= 0:
            # the time limit, not the engine, ended the fitting: the report says so
            self.st.cut_by_limit.append(f"re-rounding to {k} chunks per rank for the engine skipped")
        if again is not None and again.chunks < job.chunks:
            self.queue.appendleft(Job(again.chunks, again, job.joint, job.shape))

    def _refit(self, job: Job, pk: PackSet, own: int) -> bool:
        """Bundles cost rate (a bundle takes one fair share where its streams took one each), and
        so do many streams at once (each link's last pieces wait behind a piece of every other
        stream on it): the same LP rounded to fewer chunks, every stream on a channel of its own at
        full warps, is built and simulated too, the faster kept. Best first: a program never runs
        faster than its packing's time in the link model, so the one whose link-model time is less
        goes first (where the limit allows one simulation, the other may only be slower up to the
        difference); ties to the re-rounded one. True where ``job`` itself is queued again after."""
        st, b = self.st, self.builder
        pk.refitted = True
        if job.shape and b.resident_somewhere(stream_blocks(pk.by_name), pk):
            # shaping moved streams onto fewer forwarding ranks, which then hold more thread
            # blocks than stay resident: the packing's own trees fit (at fewer warps) with all
            # its chunks, which no re-rounding to fewer keeps; they go next
            self.queue.appendleft(Job(job.chunks, pk, job.joint, ""))
            return False
        again = self._refit_chunks(job, pk, own)
        if again is None:
            return False
        again.refitted = True
        shape_r = "" if job.joint else SHAPES[0]
        if shape_r and not b.resident_somewhere(stream_blocks(b.shaped_set(again, shape_r)), again):
            # shaping moves streams onto fewer forwarding ranks, which may then hold more
            # thread blocks than stay resident: unshaped where it does
            shape_r = ""
        cand = [Job(again.chunks, again, job.joint, shape_r)]
        # the re-rounding fits at the fewest warps; where fewer chunks would fit at full
        # warps (a block of LEAST_WARPS moves a quarter of one of WARPS), those are
        # simulated too (two MI250 nodes' ReduceScatter: 12 chunks per rank at 4 warps,
        # 751 blocks, 0.813 of the bound)
        k_full = chunks_to_fit(job.chunks, own, st.max_blocks) if st.max_blocks and st.resident is not None else 0
        if 0 < k_full < cand[0].chunks and st.deadline - clock.now() <= 0:
            st.cut_by_limit.append(f"re-rounding to {k_full} chunks per rank (full warps) skipped")
        elif 0 < k_full < cand[0].chunks:
            full = self._reround(pk, k_full)
            if full is not None and full.chunks < cand[0].chunks:
                full.refitted = True
                cand.append(Job(full.chunks, full, job.joint, ""))
        if again.model_time() <= pk.model_time() * (1 + 1e-9):
            self.queue.extendleft(reversed(cand + [Job(job.chunks, pk, job.joint, job.shape)]))
            return True
        self.queue.extendleft(reversed(cand))
        return False

    def _after(self, job: Job, pk: PackSet, sc: float | None) -> None:
        """A program short of its packing's link-model time queues the same LP at half the chunks,
        and integral trees their LP's rounding (AllGather / ReduceScatter, with time left)."""
        st = self.st
        short = sc is not None and not job.joint and st.coll != "allreduce" and \
            sc > pk.model_time() * st.per_rank * (1 + FEWER_STREAMS_ABOVE)
        would = short and ((not pk.halved and job.chunks > 1 and sc < pk.thinned_from) or
                           (not pk.alternated and all(p.alternative is not None for p in pk.values())))
        if would and clock.now() + 3 * self.build_s >= st.deadline:
            # what would follow a short program is left by the limit: the report says so
            st.cut_by_limit.append(f"the programs after one of {job.chunks} chunks per rank short of its "
                                   "packing not tried")
        if clock.now() + 3 * self.build_s >= st.deadline:
            short = False
        if short and not pk.halved and job.chunks > 1 and sc < pk.thinned_from:
            # the program falls short of its packing's time in the link model: the same LP rounded
            # to half the chunks (half the streams, each twice as fast) is built and simulated
            # next, and halved again while that gains (see FEWER_STREAMS_ABOVE)
            pk.halved = True
            k = max((c for c in CHUNK_CANDIDATES if c <= job.chunks // 2), default=0)
            fewer = self._reround(pk, k) if k else None
            if fewer is not None and fewer.chunks < job.chunks:
                fewer.thinned_from = sc
                self.queue.appendleft(Job(fewer.chunks, fewer, job.joint, job.shape))
        if short and not pk.alternated and all(p.alternative is not None for p in pk.values()):
            # integral trees (packing.Packing.alternative) that fall short of their link-model time:
            # they fill every resource, so they can grow deep and fill slowly; the LP's own trees
            # rounded, slower in the link model, are simulated next
            pk.alternated = True
            alt = PackSet({name: p.alternative for name, p in pk.items()})
            self.queue.appendleft(Job(alt.chunks, alt, job.joint, job.shape))

    def _score_unfit(self) -> None:
        """Nothing fits: the simulated times decide after all (best first in the link model, as
        far as the deadline allows)."""
        st = self.st
        for c in sorted(self.candidates, key=lambda c: c.rank[1]):
            c.simulated = st.score(st.coll, c.rows, c.chunks, c.channels, c.warps)
            c.rank = (True, c.simulated, c.blocks)


def _detail(st: _Setting, best: Candidate, candidates: list, cut: dict, not_needed: int) -> dict:
    """Stage 5: the report of the program kept (``TreeProgram.detail``)."""
    packs, info = best.packs, best.info
    detail = {
        "method": "trees",
        "channels": int(best.channels),
        "shape": best.shape or "-",
        "joint": packs.joint,
        "split": int(best.split),
        "streams_per_bundle": int(best.most or 1),
        "warps": int(best.warps),
        "blocks_per_rank": int(best.blocks),
        # what stays resident at the program's warps per block
        "max_blocks_per_rank": None if st.max_blocks is None else
        int(st.max_blocks) if best.warps == WARPS or st.resident is None else st.resident(best.warps),
        "model_seconds": packs.model_time() * st.per_rank,
        "cut_seconds_per_rank_byte": cut,      # the bound: cut, or the packing's where tighter
        "trees": {name: {"trees": len(p.roots), "chunks_per_rank": p.chunks_per_rank * best.split,
                         "lp_seconds_per_byte": p.lp_time, "bound_seconds_per_byte": p.lower_bound,
                         "model_fraction": p.fraction, "lp_iterations": p.iterations, "columns": p.columns,
                         "wall_s": round(p.seconds, 3), **info[name].stats}
                  for name, p in packs.items()},
    }
    if st.score is not None:
        # seconds each candidate took in the simulator, or (not simulated) its packing's time in
        # the link model, which no program of it beats
        detail["simulated_candidates"] = {c.label(): c.rank[1] for c in candidates}
        detail["candidates"] = _listed(st, best, candidates)
    for name, p in packs.items():          # re-rounded packings too (the clock's cuts of their roundings)
        st.clock_cut(p, {"allgather": "AllGather", "reducescatter": "ReduceScatter"}[name])
    if st.cut_by_limit:
        detail["time_limit_cut"] = st.cut_by_limit
    if not_needed:
        detail["candidates_not_built"] = not_needed
    detail["channels_per_pair"] = int(best.rows[:, 5].max()) + 1 if len(best.rows) else 1
    if st.engine is not None and best.fits:
        detail["engine_fitted"] = True     # built for the target engine, and its check accepts it
    if "channels_folded" in info:          # more streams on a pair than channels (fold_channels)
        detail["channels_folded_from"] = int(info["channels_folded"])
    return detail


def _listed(st: _Setting, best: Candidate, candidates: list) -> list:
    """What ``hccc synth --json`` lists: every program built (once: a packing reached again, as a
    re-rounding that gives the same counts, is built again but not simulated again), whether its
    blocks stay resident, its simulated seconds (None: not simulated, past the deadline or once a
    candidate ran within the tolerance of the bound), its packing's link-model seconds, and the one
    kept."""
    listed: dict = {}
    for c in candidates:
        key = (c.label(), c.rank[1])
        if key in listed:
            listed[key]["kept"] = listed[key]["kept"] or c is best
            continue
        listed[key] = {"program": c.label(), "chunks_per_rank": int(c.chunks), "blocks_per_rank": int(c.blocks),
                       "warps": int(c.warps), "resident": c.fits,
                       "simulated_seconds": float(c.simulated) if c.simulated is not None and np.isfinite(c.simulated)
                       else None,
                       "model_seconds": c.packs.model_time() * st.per_rank, "kept": c is best}
    return list(listed.values())


def synthesize_trees(net: Network, collective: str, *, pair_bw: np.ndarray | None = None,
                     total_bytes: float = float(1 << 30), time_limit: float = 60.0,
                     score: Callable[[str, np.ndarray, int, int, int], float] | None = None,
                     block_gbps: float | None = DEFAULT_BLOCK_GBPS, max_chunks: int | None = None,
                     max_blocks: int | None = None, resident: Callable[[int], int | None] | None = None,
                     engine: Callable[[np.ndarray], str | None] | None = None):
    """The tree-packing program of ``collective`` (allgather, reducescatter, allreduce) on ``net``.

    ``pair_bw``: bytes/s of every pair as the simulator runs it (default ``net.bw``);
    ``total_bytes``: the buffer (AllGather output, ReduceScatter/AllReduce input) the channels are
    sized for; ``score(collective, rows, chunks_per_rank, channels, warps)``: simulated seconds of
    a candidate program (None: keep the first shape; a ``score.settled(collective)`` attribute,
    true once a program ran so close to the bound that none is simulated any more, ends the
    building of candidates while the best one fits); ``max_blocks``: the blocks a rank keeps
    resident at once at :data:`WARPS` warps per block (None: no limit), ``resident(warps)`` at
    fewer (None: no fewer warps), see :func:`bundled`. ``engine(rows)``: the limits of the engine
    the program is for, as a check of a candidate's rows on one channel saying why the engine
    refuses them (None: it runs them): every candidate is then built on one channel, its chunks
    cut into fewer pieces and re-rounded to fewer chunks per rank while the check refuses
    (:meth:`_Builder.engine_program`, :meth:`_Selection._refit_engine`), and the candidates it
    accepts rank before the others, the fastest first.

    Stages: an AllReduce's joint packing first where it goes first (:func:`_joint_first`, the
    halves then packed beside its first simulation: :class:`_Later`), the packings
    (:func:`_pack_halves`), the variants programs are built from (:func:`_variants`), the
    selection loop building and scoring them (:class:`_Selection`, its programs by
    :class:`_Builder`), the report (:func:`_detail`)."""
    t0 = clock.now()
    coll = collective.lower()
    if coll not in tr.PACKED_COLLECTIVES:
        raise ValueError(f"tree packing builds {', '.join(tr.PACKED_COLLECTIVES)}, not {collective!r}")
    n = net.nranks
    # the packings end by their share of the limit (each LP keeps a feasible packing and a valid
    # bound when stopped); the rest is for building the program and the caller's work after it
    st = _Setting(coll, net, np.asarray(net.bw if pair_bw is None else pair_bw, float), float(total_bytes) / max(n, 1),
                  block_gbps, max_blocks, resident, max_chunks, score, t0, t0 + float(time_limit),
                  t0 + PACK_SHARE * float(time_limit), own_bw=pair_bw is None, engine=engine)
    builder = _Builder(st)
    joint, cut, first = _joint_first(st) or (None, None, False)
    if first:
        later = _Later(st, joint, cut)
        selection = _Selection(st, builder, [(joint.chunks, joint, True)], None, later)
        try:
            candidates = selection.run()
        except _Restart as again:
            selection = _Selection(st, builder, again.variants, again.apart)
            candidates = selection.run()
        cut = later.cut
    else:
        packs, cut = _pack_halves(st, joint_later=joint is None, cut=cut)
        apart = PackSet(packs)
        selection = _Selection(st, builder, _variants(st, apart, joint), apart)
        candidates = selection.run()
    best = min(candidates, key=lambda c: c.rank)
    loops = best.info.pop("loops")
    lb = sum(_distance_bound(st.nets[name]) for name in best.packs.by_name)
    detail = _detail(st, best, candidates, cut, selection.not_needed)
    return TreeProgram(best.rows, _steps(best.rows), lb, best.chunks, detail, clock.now() - t0, loops)
