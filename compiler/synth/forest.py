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

Several shapes of the same packing (:data:`.trees.SHAPES`) are built; with a ``score`` (the
simulated time of a program, lower is better) the best is kept, otherwise the first. The program
asks for the channels its busiest connection needs (:func:`.trees.channels_for`) so the
simulator's per-block limit does not bind where the link could carry more.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hccc.compiler.frontend.algorithm import RECV, RRC
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth import trees as tr

#: GB/s one block moves (the simulator's default per-block limit, :mod:`hccc.compiler.passes.channels`)
from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS


@dataclass
class TreeProgram:
    """What :func:`synthesize_trees` makes: transfer rows ``(src, dst, step, chunk, op)``, their
    steps, the hop-distance step bound, chunks per rank and the report (``detail``)."""

    rows: np.ndarray
    steps: int
    lower_bound_steps: int
    chunks_per_rank: int
    detail: dict
    seconds: float
    #: the rows as loops over a symmetry (one :class:`.trees.LoopRows` per part), or None
    loops: list | None = None


def _rows(rows4: np.ndarray, op: int, step0: int = 0) -> np.ndarray:
    if not len(rows4):
        return np.zeros((0, 5), np.int64)
    return np.c_[rows4[:, 0], rows4[:, 1], rows4[:, 2] + step0, rows4[:, 3],
                 np.full(len(rows4), op)].astype(np.int64)


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


def synthesize_trees(net: Network, collective: str, *, pair_bw: np.ndarray | None = None,
                     total_bytes: float = float(1 << 30), time_limit: float = 60.0,
                     score: Callable[[str, np.ndarray, int, int], float] | None = None,
                     block_gbps: float | None = DEFAULT_BLOCK_GBPS, max_chunks: int | None = None):
    """The tree-packing program of ``collective`` (allgather, reducescatter, allreduce) on ``net``.

    ``pair_bw``: bytes/s of every pair as the simulator runs it (default ``net.bw``);
    ``total_bytes``: the buffer (AllGather output, ReduceScatter/AllReduce input) the channels are
    sized for; ``score(collective, rows, chunks_per_rank, channels)``: simulated seconds of a
    candidate program (None: keep the first shape)."""
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds

    t0 = time.perf_counter()
    coll = collective.lower()
    if coll not in tr.TREE_COLLECTIVES:
        raise ValueError(f"tree packing builds {', '.join(tr.TREE_COLLECTIVES)}, not {collective!r}")
    n = net.nranks
    bw = np.asarray(net.bw if pair_bw is None else pair_bw, float)
    deadline = t0 + float(time_limit)
    per_rank = float(total_bytes) / max(n, 1)
    packs: dict[str, tr.Packing] = {}
    nets: dict[str, Network] = {}
    cut: dict[str, float] = {}         # the cut bound, seconds per byte of each rank's data
    if coll in ("allgather", "allreduce"):
        bound = cut["allgather"] = collective_cut_bound_seconds(net, "allgather", n, 1, 0, float(n))
        packs["allgather"] = tr.pack_trees(net, pair_bw=bw, bound=bound, max_chunks=max_chunks,
                                           time_limit=max(1.0, deadline - time.perf_counter()))
        nets["allgather"] = net
    if coll in ("reducescatter", "allreduce"):
        tnet = net.transposed()
        bound = cut["reducescatter"] = collective_cut_bound_seconds(tnet, "allgather", n, 1, 0, float(n))
        packs["reducescatter"] = tr.pack_trees(tnet, pair_bw=bw[tr.transposed_pair_order(net)], bound=bound,
                                               max_chunks=max_chunks,
                                               time_limit=max(1.0, deadline - time.perf_counter()))
        nets["reducescatter"] = tnet
    K = max(p.chunks_per_rank for p in packs.values())
    if len({p.chunks_per_rank for p in packs.values()}) > 1:
        # AllReduce: both halves with one chunk count (the larger one; re-rounded)
        for name, p in list(packs.items()):
            if p.chunks_per_rank != K:
                packs[name] = tr.pack_trees(nets[name], pair_bw=bw if name == "allgather" else
                                            bw[tr.transposed_pair_order(net)], min_chunks=K, max_chunks=K,
                                            bound=p.lower_bound, time_limit=max(1.0, deadline - time.perf_counter()))
    variants = [(K, packs)]
    if score is not None and K > 1 and time.perf_counter() < deadline:
        # one chunk per rank too: rounding loses a little of the optimum in the link model, but a
        # thread block then has fewer transfers to run one after another (the simulator decides)
        ones = {name: tr.pack_trees(nets[name], pair_bw=bw if name == "allgather" else
                                    bw[tr.transposed_pair_order(net)], max_chunks=1, bound=p.lower_bound,
                                    time_limit=max(1.0, deadline - time.perf_counter()))
                for name, p in packs.items()}
        variants.append((1, ones))

    def channels_of(pk: dict) -> int:
        """The busiest pair's planned rate at the packing's time, in blocks."""
        ch = 1
        for name, p in pk.items():
            ch = max(ch, tr.channels_for(nets[name], p, per_rank, p.rounded_time * per_rank,
                                         block_gbps=block_gbps or 0.0))
        return ch

    def build(shape: str, pk: dict) -> tuple[np.ndarray, dict]:
        parts, step0, info, loops = [], 0, {}, []
        for name in ("reducescatter", "allgather"):
            if name not in pk:
                continue
            sp = tr.shaped(nets[name], pk[name], shape)
            r4 = tr.reducescatter_rows(sp) if name == "reducescatter" else tr.allgather_rows(sp)
            rows = _rows(r4, RRC if name == "reducescatter" else RECV, step0)
            loops.append(tr.loop_rows(sp, RRC if name == "reducescatter" else RECV, step0,
                                      reduce=name == "reducescatter"))
            step0 = _steps(rows)
            parts.append(rows)
            info[name] = sp
        info["loops"] = loops if all(lp is not None for lp in loops) else None
        return np.concatenate(parts), info

    candidates = []
    for kv, pk in variants:
        ch = channels_of(pk)
        for shape in tr.SHAPES if score is not None else tr.SHAPES[:1]:
            rows, info = build(shape, pk)
            sc = score(coll, rows, kv, ch) if score is not None else None
            candidates.append((sc if sc is not None else 0.0, shape, rows, info, kv, pk, ch))
            if time.perf_counter() > deadline:
                break
    best = min(candidates, key=lambda c: c[0])
    _, shape, rows, info, K, packs, channels = best
    loops = info.pop("loops")
    steps = _steps(rows)
    lb = sum(_distance_bound(nets[name]) for name in packs)
    model_s = sum(p.rounded_time for p in packs.values()) * per_rank
    detail = {
        "method": "trees",
        "channels": int(channels),
        "shape": shape,
        "model_seconds": model_s,
        "cut_seconds_per_rank_byte": cut,
        "trees": {name: {"trees": len(p.roots), "chunks_per_rank": p.chunks_per_rank,
                         "lp_seconds_per_byte": p.lp_time, "bound_seconds_per_byte": p.lower_bound,
                         "model_fraction": p.fraction, "lp_iterations": p.iterations, "columns": p.columns,
                         "wall_s": round(p.seconds, 3), **info[name].stats}
                  for name, p in packs.items()},
    }
    if score is not None:
        detail["simulated_candidates"] = {f"K={c[4]} {c[1]}": c[0] for c in candidates}
    return TreeProgram(rows, steps, lb, K, detail, time.perf_counter() - t0, loops)
