"""A tree packing's types, and the resources a tree occupies on a network.

:class:`Packing` (trees per root with integral chunk counts, and the LP's figures), the options a
caller may set (:class:`PackOptions`, their defaults the constants below, where their measurements
are written) and :class:`PackingError`; the resources (the network's pairs, then its shared groups)
and a tree's column over them (:func:`_tree_column`), the pair matrices, the translates of a tree
under rank permutations, and every pair's bandwidth as the simulator runs it. The packing itself is
:mod:`.trees`, which describes the method.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.symmetry import Symmetry


#: seconds the rounding's program (:func:`.rounding._milp_counts`) may spend on one chunk count: a
#: guard only, the node limit (:data:`.rounding.ROUND_MILP_NODES`) decides, so that the counts do not depend on the machine's speed or
#: load (where the guard ends a program first, the report says so: ``time_limit_cut``). Where it
#: finds counts at all it does so within a few hundredths of a second; proving that none fits takes
#: up to 2.5 s of CPU at the node limit (64 heterogeneous V100s, ``synth_scale.py``'s POD64, joint
#: AllReduce at 6 and 8 chunks per rank: 2.2 and 2.5 s of CPU, 16 and 21 s of wall time on a
#: loaded 2-core machine), so the former 0.5 s ended such programs by the clock on any machine
ROUND_MILP_EACH = 5.0

#: the exponents (times the LP time) of the regrowing's load prices, one sweep each
#: (:meth:`.rounding._Rounding._regrown`; the passes each may make: :data:`.balancing.REGROW_PASSES`)
REGROW_ALPHAS = (16.0, 64.0)

#: trees a packing prices with the numpy formulation of Chu-Liu/Edmonds on matrices below
#: :data:`~hccc.compiler.synth.edmonds_kernel.MIN_COMPILED_RANKS` ranks; the rest run compiled
#: (a 32-rank matrix: 80-600 us numpy, about 10 us compiled; loading the kernel costs about what these
#: numpy calls do, and two MI250 nodes price 19,000 trees)
PRICED_PLAIN = 256

#: with classes of several kinds of node, the LP over every root is also rounded where the LP of
#: translates needs more chunks per rank than this, or has at most :data:`EVERY_ROOT_RANKS` ranks
#: (and more than one chunk per rank, or none within the rounding tolerance), where that LP takes
#: well under a second
SEED_EVERY_ROOT_ABOVE = 8
EVERY_ROOT_RANKS = 32


@dataclass(frozen=True)
class PackOptions:
    """The choices of a packing a caller may set instead of the module's defaults (each field's
    default is its module constant, read when the options are made, where its measurement is
    written): the regrowing's exponents (``()``: no regrowing), the trees priced with the plain
    formulation before the compiled one, the MILP's seconds per chunk count, when a classes'
    packing is also rounded over every root, whether rail trees join the columns, and whether
    integral trees (:mod:`.branchings`) are sought where the LP's trees round badly."""

    regrow_alphas: tuple = field(default_factory=lambda: REGROW_ALPHAS)
    priced_plain: int = field(default_factory=lambda: PRICED_PLAIN)
    round_milp_each: float = field(default_factory=lambda: ROUND_MILP_EACH)
    seed_every_root_above: int = field(default_factory=lambda: SEED_EVERY_ROOT_ABOVE)
    every_root_ranks: int = field(default_factory=lambda: EVERY_ROOT_RANKS)
    rails: bool = True
    integral: bool = True


class PackingError(ValueError):
    """The network admits no spanning tree from some rank (it is not strongly connected)."""


@dataclass
class Packing:
    """Trees per root with integral chunk counts (``counts[i]`` of ``chunks_per_rank`` chunks of
    ``roots[i]`` follow ``parents[i]``), and the LP's figures (times for a unit of data per rank:
    multiply by the bytes per rank, ``M/N``)."""

    nranks: int
    chunks_per_rank: int
    roots: list[int]
    parents: list[np.ndarray]
    counts: list[int]
    lp_time: float            # LP optimum, seconds per byte of each rank's data
    lower_bound: float        # the best lower bound proven (cut bound or Lagrangian), same unit
    rounded_time: float       # with the integral chunk counts, same unit
    iterations: int
    columns: int
    seconds: float
    pair_load: np.ndarray = field(repr=False, default=None)  # bytes per pair per byte of each rank's data
    stats: dict = field(default_factory=dict)
    res_load: np.ndarray = field(repr=False, default=None)   # per resource (pairs, groups), normalised
    res_limit: np.ndarray = field(repr=False, default=None)  # time x capacity per resource, normalised
    #: the symmetry the trees follow (None: none): trees come in runs of ``len(symmetry)``, the
    #: translates of a representative by every element in order, with equal counts
    symmetry: Symmetry | None = field(repr=False, default=None)
    #: ``reround(max_chunks)``: the same LP's trees rounded to at most ``max_chunks`` chunks per
    #: rank, without solving the LP again (a tuple: the AllGather and ReduceScatter packings of a
    #: joint packing, else one packing); None where not kept
    reround: Callable | None = field(repr=False, default=None, compare=False)
    #: the LP's trees of positive weight as ``(root, parents, in-tree)`` for every root, where the
    #: LP was over representatives and their translates (they seed the LP over every root)
    lp_support: list | None = field(repr=False, default=None, compare=False)
    #: where the trees are integral ones (:mod:`.branchings`, ``stats["integral"]``): the LP's own
    #: trees rounded (what the packing is without them), which can run faster where the integral
    #: trees, filling every resource, grow deep (the simulator decides; see ``forest``)
    alternative: "Packing | None" = field(repr=False, default=None, compare=False)
    #: the integral packings found while rounding (``_pack``'s cache: per chunk count, the cut
    #: conditions, the time spent), for another packing of the same network (:func:`pack_trees`)
    exact: dict | None = field(repr=False, default=None, compare=False)

    @property
    def load_time(self) -> float:
        """The time of the trees' loads in the link model, same unit: :attr:`rounded_time`, or less
        where :func:`shaped` made the most loaded resource lighter."""
        if self.res_load is None or self.res_limit is None:
            return self.rounded_time
        ok = self.res_limit > 0
        if not ok.any():
            return self.rounded_time
        return self.rounded_time * float((self.res_load[ok] / self.res_limit[ok]).max())

    @property
    def fraction(self) -> float:
        """Bound / rounded time: the share of the optimum the integral packing reaches (model)."""
        return self.lower_bound / self.rounded_time if self.rounded_time > 0 else 1.0


def _resources(net: Network, pair_bw: np.ndarray):
    """Resource capacities (pairs then groups, bytes/s) and the pair -> groups CSR."""
    gbw = net.gbw if net.gbw is not None else np.zeros(net.ngroups)
    cap = np.concatenate([np.asarray(pair_bw, float), np.asarray(gbw, float)])
    return cap


def pair_incidence(net: Network, nres: int):
    """The sparse (pairs x resources) incidence of :func:`_resources`' resources: every pair on
    itself and on each of its shared groups (a pair's price is ``incidence @ prices``)."""
    from scipy import sparse

    P = net.npairs
    rp, rg = net.pair_group_rows()
    return sparse.csr_matrix((np.ones(P + rp.size), (np.r_[np.arange(P), rp], np.r_[np.arange(P), P + rg])),
                             shape=(P, nres))


def pair_cost_matrix(net: Network, bw: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``C[u, v]``: the cost ``w`` of pair ``u -> v`` (infinite where there is none or it has no
    bandwidth ``bw``), for :func:`min_arborescence`."""
    n = net.nranks
    C = np.full((n, n), np.inf)
    C[net.psrc, net.pdst] = np.where(bw > 0, w, np.inf)
    return C


def _tree_pairs(net: Network, parent: np.ndarray, root: int) -> np.ndarray:
    v = np.flatnonzero(parent >= 0)
    idx = net.pair_index(parent[v], v)
    if (idx < 0).any():
        raise PackingError("a tree uses an arc that is not a pair of the network")
    return idx


def _tree_column(net: Network, pairs: np.ndarray) -> np.ndarray:
    """Resource ids a tree's pairs occupy, with multiplicity (a group counted once per pair): the
    pairs, then their groups in pair order."""
    pairs = np.asarray(pairs, np.int64)
    lo = net.pg_ptr[pairs]
    cnt = net.pg_ptr[pairs + 1] - lo
    tot = int(cnt.sum())
    if not tot:
        return pairs.copy()
    start = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
    return np.concatenate([pairs, net.npairs + net.pg_idx[start + np.arange(tot)].astype(np.int64)])


def _pair_matrix(net: Network) -> np.ndarray:
    """``m[u, v]``: the index of pair ``u -> v``, -1 where there is none."""
    m = np.full((net.nranks, net.nranks), -1, np.int64)
    m[net.psrc, net.pdst] = np.arange(net.npairs)
    return m


def _translates(E: np.ndarray, root: int, par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tree ``par`` rooted at ``root`` moved by every rank permutation in ``E``: the roots and
    the parent arrays of the images."""
    v = np.flatnonzero(par >= 0)
    tp = np.full((len(E), par.size), -1, np.int64)
    tp[np.arange(len(E))[:, None], E[:, v]] = E[:, par[v]]
    return E[:, root], tp


def transposed_pair_order(net: Network) -> np.ndarray:
    """Index into ``net``'s pairs of every pair of ``net.transposed()`` (same order as it)."""
    n = net.nranks
    return np.argsort(net.pdst.astype(np.int64) * n + net.psrc, kind="stable")


def pair_bandwidth(topo) -> np.ndarray:
    """Bytes/s of every pair of ``network_from_topology(topo)`` as the simulator runs it: the pair's
    best link only (``Topology.link_between``), bandwidth x lanes."""
    from hccc.compiler.synth.problem import _best_links

    best = _best_links(topo)
    return (topo.link_bandwidth[best] * topo.link_lanes[best]).astype(float)
