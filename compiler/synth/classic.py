"""The classic programs that fit a cluster: hccc's generators as candidates of synthesis.

``hccc synth`` writes the fastest program it could have written (docs/synthesis.md, *Choosing
among programs*): besides the tree packing and the step search, the generators of
:mod:`hccc.compiler.frontend.generators` and the cluster-to-cluster breakdown of
:mod:`hccc.compiler.cluster.c2c` are candidates wherever they fit the cluster's ranks, the
collective and its vendors:

============== ====================================================================
ring           every collective (rank order; a Broadcast's chain from its root)
direct         every collective (all pairs; every pair must be linked)
rd             recursive doubling: AllGather on a power of two of ranks
hm             hierarchical mesh: AllGather, ReduceScatter, AllReduce on two or more
               equal nodes (intra-node mesh, inter-node ring of same-place GPUs)
hm_reversed    ReduceScatter as hm's AllGather time-reversed (its intra-node reductions
               overlap the ring, where hm's ReduceScatter runs them first)
hier_a2a       hierarchical AllToAll on two or more equal nodes
binomial       a Broadcast down the binomial tree from its root
c2c            HetCCL's cluster-to-cluster breakdown on mixed vendors
============== ====================================================================

:func:`classic_candidates` gives each as a :class:`~.collectives.SynthResult` (``detail["method"]``
its name above), so the selection scores, fits and writes it as it does a synthesized program;
one a cluster cannot carry (a transfer on a pair the cluster does not link) is left out, with the
reason, in :attr:`Classics.dropped`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.compiler.synth.collectives import SynthResult

#: the names of the classic candidates, in the order they are made (and listed)
CLASSIC_METHODS = ("ring", "direct", "rd", "hm", "hm_reversed", "hier_a2a", "binomial", "c2c")
#: what each is, as the report and the program's first comment say it
DESCRIPTIONS = {"ring": "ring (hccc's generator)", "direct": "all pairs (hccc's generator)",
                "rd": "recursive doubling (hccc's generator)",
                "hm": "hierarchical mesh: intra-node mesh, inter-node ring (hccc's generator)",
                "hm_reversed": "hierarchical mesh AllGather time-reversed: intra-node reductions beside "
                               "the inter-node ring (hccc's generator)",
                "hier_a2a": "hierarchical AllToAll (hccc's generator)",
                "binomial": "binomial tree (hccc's generator)",
                "c2c": "HetCCL's cluster-to-cluster breakdown (hccc gen c2c)"}


@dataclass
class Classics:
    """The classic candidates made for one cluster and collective: ``made`` (name, result) in
    :data:`CLASSIC_METHODS`' order, ``dropped`` (name, why) for those the cluster cannot carry."""

    made: list = field(default_factory=list)
    dropped: list = field(default_factory=list)


def equal_nodes(topo) -> tuple[int, int] | None:
    """``(nodes, GPUs per node)`` where the cluster is two or more nodes of as many GPUs each (the
    hierarchical generators' layout: rank ``G * n + r`` is GPU ``r`` of node ``n``), else None."""
    sizes = {nd.ngpus for nd in topo.nodes}
    if len(topo.nodes) < 2 or len(sizes) != 1:
        return None
    g = sizes.pop()
    return (len(topo.nodes), g) if g >= 2 else None


def _makers(topo, collective: str, root: int) -> list[tuple[str, Callable]]:
    """``(name, make)`` of every classic program of ``collective`` whose shape fits ``topo``."""
    from hccc.compiler.frontend import generators as gen

    n = topo.nranks
    grid = equal_nodes(topo)
    out: list[tuple[str, Callable]] = []
    if collective == "allgather":
        out += [("ring", lambda: gen.ring_allgather(n)), ("direct", lambda: gen.direct_allgather(n))]
        if n & (n - 1) == 0:
            out.append(("rd", lambda: gen.recursive_doubling_allgather(n)))
        if grid:
            out.append(("hm", lambda: gen.hm_allgather(*grid)))
    elif collective == "reducescatter":
        out += [("ring", lambda: gen.ring_reducescatter(n)), ("direct", lambda: gen.direct_reducescatter(n))]
        if grid:
            out.append(("hm", lambda: gen.hm_reducescatter(*grid)))
            out.append(("hm_reversed", lambda: gen.hm_reversed_reducescatter(*grid)))
    elif collective == "allreduce":
        out += [("ring", lambda: gen.ring_allreduce(n)), ("direct", lambda: gen.direct_allreduce(n))]
        if grid:
            out.append(("hm", lambda: gen.hm_allreduce(*grid)))
    elif collective == "broadcast":
        out += [("ring", lambda: gen.ring_broadcast(n, root)), ("direct", lambda: gen.direct_broadcast(n, root)),
                ("binomial", lambda: gen.tree_broadcast(n, gen.binomial_tree(n, root), root))]
    elif collective == "alltoall":
        out += [("ring", lambda: gen.ring_alltoall(n)), ("direct", lambda: gen.direct_alltoall(n))]
        if grid:
            out.append(("hier_a2a", lambda: gen.hierarchical_alltoall(*grid)))
    if len(set(topo.rank_vendor)) > 1:
        out.append(("c2c", lambda: _c2c(topo, collective, root)))
    return out


def _c2c(topo, collective: str, root: int):
    if collective == "alltoall":
        from hccc.compiler.cluster.c2c_alltoall import plan_c2c_alltoall
        return plan_c2c_alltoall(topo).algorithm()
    from hccc.compiler.cluster.c2c import c2c_algorithm
    return c2c_algorithm(topo, collective, root=root if collective == "broadcast" else None)


def as_result(alg, name: str, cluster: str, lower_bound_steps: int = 0) -> SynthResult:
    """A generator's :class:`Algorithm` as the selection's candidate (``detail["method"]`` is
    ``name``; ``lower_bound_steps``: the cluster's step bound where known, else 0)."""
    cols = [alg.src, alg.dst, alg.step, alg.chunk, alg.op]
    if alg.channel is not None:
        cols.append(alg.channel)
    rows = np.stack([np.asarray(c, np.int64) for c in cols], axis=1) if alg.ntransfers else \
        np.zeros((0, len(cols)), np.int64)
    h = alg.header
    steps = int(rows[:, 2].max()) + 1 if len(rows) else 0
    return SynthResult(h.collective.value, int(h.nranks), int(h.chunks_per_rank),
                       int(h.root) if h.collective.rooted else None, rows, steps,
                       min(int(lower_bound_steps), steps), [], 0.0, cluster, detail={"method": name})


def classic_candidates(topo, collective: str, root: int = 0, lower_bound_steps: int = 0) -> Classics:
    """The classic programs of ``collective`` that fit ``topo`` (see the module docstring)."""
    from hccc.compiler.cluster.topology_check import check_on_topology
    from hccc.util.diagnostics import CompileError

    got = Classics()
    if topo.nranks < 2:
        return got
    for name, make in _makers(topo, collective, root):
        try:
            alg = make()
            check_on_topology(alg, topo)
        except CompileError as exc:
            first = exc.diagnostics[0].message if getattr(exc, "diagnostics", None) else str(exc)
            got.dropped.append((name, first.splitlines()[0]))
            continue
        except ValueError as exc:           # a generator's or C2C's refusal of this cluster
            got.dropped.append((name, str(exc).splitlines()[0]))
            continue
        got.made.append((name, as_result(alg, name, topo.name, lower_bound_steps)))
    return got


__all__ = ["CLASSIC_METHODS", "Classics", "DESCRIPTIONS", "as_result", "classic_candidates", "equal_nodes"]
