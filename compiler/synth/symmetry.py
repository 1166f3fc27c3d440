"""Automorphisms of a cluster: rank permutations that map every pair, bandwidth and shared group
onto an equal one, for the tree packing's classes of equivalent ranks (:mod:`.trees`).

* :func:`node_symmetry`: every node identical; shifting every rank a node on (and a GPU on within
  its node, when that is one too). The packing keeps it to the end: its trees are translates and
  its program is written with loops.
* :func:`period_symmetry`: nodes of several kinds repeating in a pattern; shifts by the period.
* :func:`class_symmetry`: nodes of several kinds in any order; the nodes of each kind shifted
  among themselves and the GPUs of each kind's nodes rotated, every kind on its own. This group
  does not act freely (an element that moves one kind fixes the ranks of the others), so the
  packing LP weighs a tree by the size of its root's class (:mod:`.trees`).

Each is a :class:`Symmetry`: the rank permutation of every element and the orbit of every
resource (pairs, then groups).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.synth.problem import Network

#: the most elements :func:`class_symmetry` enumerates (each is held as a rank permutation)
CLASS_GROUP_MAX = 4096


def _shift_perm(net: Network, sigma: np.ndarray, bw: np.ndarray | None = None,
                groups: tuple | None = None) -> np.ndarray | None:
    """The permutation of resources (pairs, then groups) that the rank permutation ``sigma``
    induces, or None when ``sigma`` is no automorphism (a pair, a bandwidth -- ``net.bw`` and
    ``bw`` when given -- or a group that does not map onto an equal one). ``groups``:
    :func:`_group_index` of ``net``, when several permutations are tried."""
    P = net.npairs
    pp = net.pair_index(sigma[net.psrc], sigma[net.pdst])
    if (pp < 0).any() or not np.allclose(net.bw[pp], net.bw):
        return None
    if bw is not None and not np.allclose(np.asarray(bw, float)[pp], bw):
        return None
    flat, starts, sizes, index = groups or _group_index(net)
    if not sizes.size:
        return pp.astype(np.int64)
    gp = np.array([index.get(k, -1) for k in _set_keys(flat, starts, sizes, pp)], np.int64)
    if (gp < 0).any() or not np.allclose(net.gbw[gp], net.gbw):
        return None
    return np.r_[pp, P + gp].astype(np.int64)


def _group_index(net: Network) -> tuple:
    """Every group's pairs, concatenated, with each group's start and size, and the group of
    every pair set's key (:func:`_set_keys`)."""
    members = net.group_pairs()
    sizes = np.array([m.size for m in members], np.int64)
    flat = np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64)
    starts = np.cumsum(sizes) - sizes
    keys = _set_keys(flat, starts, sizes, np.arange(net.npairs))
    return flat, starts, sizes, {k: g for g, k in enumerate(keys)}


def _set_keys(flat: np.ndarray, starts: np.ndarray, sizes: np.ndarray, image: np.ndarray) -> list:
    """A key per group of the set of pairs its members map to under ``image``: the size and two
    sums of fixed random 64-bit words of the pairs (a pair set, whatever its order; two different
    sets share a key with probability about 2**-128)."""
    words = np.random.default_rng(0x5EED).integers(0, 2 ** 63, size=(2, image.size), dtype=np.uint64)
    img = image[flat]
    out = []
    full = np.flatnonzero(sizes > 0)
    for w in words:
        acc = np.zeros(sizes.size, np.uint64)
        if full.size:
            acc[full] = np.add.reduceat(w[img], starts[full])
        out.append(acc)
    return list(zip(sizes.tolist(), out[0].tolist(), out[1].tolist()))


@dataclass
class Symmetry:
    """Automorphisms of a cluster of ``nodes`` identical nodes of ``gpn`` GPUs each (see
    :func:`node_symmetry`): element ``a * gpu_shifts + b`` moves every rank ``a`` nodes on and ``b``
    GPUs on within its node, ``r -> ((r // gpn + a) % nodes) * gpn + (r % gpn + b) % gpn``
    (``gpu_shifts`` is 1 when only whole nodes shift). The group acts freely on the ranks."""

    nodes: int
    gpn: int
    gpu_shifts: int
    ranks: np.ndarray         # (|G|, n): the rank permutation of every element, element 0 the identity
    orbits: np.ndarray        # (R,): the orbit of every resource (pairs, then groups), numbered by least member
    #: (n,): the kind of node of every rank, for a group that is a product over kinds
    #: (:func:`class_symmetry`); None otherwise
    kind: np.ndarray | None = None

    def kind_elements(self, rank: int) -> np.ndarray:
        """The elements (rank permutations) that move only ranks of ``rank``'s kind: they act on its
        kind freely, so they translate a tree of ``rank`` onto every rank of its class once."""
        other = np.flatnonzero(self.kind != self.kind[rank])
        return self.ranks[(self.ranks[:, other] == other).all(axis=1)]

    def __len__(self) -> int:
        return int(self.ranks.shape[0])

    @property
    def norbits(self) -> int:
        return int(self.orbits.max()) + 1 if self.orbits.size else 0

    def shift(self, element: int) -> tuple[int, int]:
        """``(a, b)``: the nodes and the GPUs within a node that ``element`` shifts by."""
        return divmod(int(element), self.gpu_shifts)


def node_symmetry(net: Network, bw: np.ndarray | None = None) -> Symmetry | None:
    """Automorphisms of a cluster of identical nodes (:class:`Symmetry`): shifting every rank to
    the next node (when all nodes have the same size and the shift maps pairs, bandwidths and groups
    onto equal ones), and also shifting every rank to the next GPU of its node when that is one too.
    None without such a symmetry. The resource orbits come from the generators' resource
    permutations (connected components), so no element's permutation of all resources is held."""
    node = np.asarray(net.levels[0], np.int64) if net.levels else np.zeros(net.nranks, np.int64)
    n = net.nranks
    sizes = np.bincount(node)
    if sizes.size < 2 or (sizes != sizes[0]).any() or not (np.diff(node) >= 0).all() or net.bw is None:
        return None
    g = int(sizes[0])
    r = np.arange(n)
    gens = []
    gpu_shifts = 1
    for k, sigma in enumerate(((r + g) % n, (r // g) * g + (r % g + 1) % g)):
        if (sigma == r).all():
            continue
        res = _shift_perm(net, sigma, bw)
        if res is None:
            if k == 0:
                return None      # no node shift: no symmetry used
            continue
        gens.append(res)
        if k == 1:
            gpu_shifts = g
    nodes = n // g
    a = np.arange(nodes).repeat(gpu_shifts)[:, None]
    b = np.tile(np.arange(gpu_shifts), nodes)[:, None]
    ranks = ((r[None, :] // g + a) % nodes) * g + (r[None, :] % g + b) % g
    orbits = _orbits_of(net.npairs + net.ngroups, gens)
    return Symmetry(nodes, g, gpu_shifts, ranks.astype(np.int64), orbits)


def _orbits_of(R: int, gens: list) -> np.ndarray:
    """Resource orbits (numbered by least member) of the group the resource permutations ``gens``
    generate: the connected components of their graph."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    src = np.concatenate([np.arange(R)] * len(gens))
    dst = np.concatenate(gens)
    _, lab = connected_components(coo_matrix((np.ones(src.size), (src, dst)), shape=(R, R)), directed=True,
                                  connection="weak")
    least = np.full(lab.max() + 1, R, np.int64)
    np.minimum.at(least, lab, np.arange(R))
    return np.argsort(np.argsort(least, kind="stable"), kind="stable")[lab].astype(np.int64)


def period_symmetry(net: Network, bw: np.ndarray | None = None) -> Symmetry | None:
    """Shifts of every rank by ``p`` nodes, for the least ``p`` (a proper divisor of the node count,
    above 1) whose shift is an automorphism: clusters whose nodes repeat in a pattern (two kinds of
    node alternating). Used by the packing LP only (one root per class of equivalent ranks), where
    :func:`node_symmetry` finds no single-node shift; the trees of the other roots are the
    translates. None without such a shift."""
    node = np.asarray(net.levels[0], np.int64) if net.levels else np.zeros(net.nranks, np.int64)
    n = net.nranks
    sizes = np.bincount(node)
    if sizes.size < 4 or (sizes != sizes[0]).any() or not (np.diff(node) >= 0).all() or net.bw is None:
        return None
    g, nodes = int(sizes[0]), int(sizes.size)
    r = np.arange(n)
    for p in range(2, nodes // 2 + 1):
        if nodes % p:
            continue
        res = _shift_perm(net, (r + p * g) % n, bw)
        if res is None:
            continue
        shifts = nodes // p
        ranks = (r[None, :] + (np.arange(shifts) * p * g)[:, None]) % n
        return Symmetry(shifts, g * p, 1, ranks.astype(np.int64), _orbits_of(net.npairs + net.ngroups, [res]))
    return None


def _node_signatures(net: Network, bw: np.ndarray, node: np.ndarray, members: list) -> list:
    """What two nodes must share to be swapped, per node: their size, the bandwidths among their
    GPUs in local order, and the capacities of the groups all of whose pairs leave from the node
    (its NICs' egress) and of those all of whose pairs arrive at it (ingress)."""
    egress: dict = {}
    ingress: dict = {}
    for g, m in enumerate(net.group_pairs()):
        src, dst = np.unique(node[net.psrc[m]]), np.unique(node[net.pdst[m]])
        if m.size and src.size == 1 and not (dst.size == 1 and dst[0] == src[0]):
            egress.setdefault(int(src[0]), []).append(float(net.gbw[g]))
        if m.size and dst.size == 1 and not (src.size == 1 and src[0] == dst[0]):
            ingress.setdefault(int(dst[0]), []).append(float(net.gbw[g]))
    local = np.zeros(net.nranks, np.int64)
    for m in members:
        local[m] = np.arange(m.size)
    same = node[net.psrc] == node[net.pdst]
    out = []
    for k, m in enumerate(members):
        mat = np.zeros((m.size, m.size))
        q = np.flatnonzero(same & (node[net.psrc] == k))
        mat[local[net.psrc[q]], local[net.pdst[q]]] = np.asarray(bw, float)[q]
        out.append((m.size, mat.round(9).tobytes(), tuple(np.round(sorted(egress.get(k, [])), 9).tolist()),
                    tuple(np.round(sorted(ingress.get(k, [])), 9).tolist())))
    return out


def class_symmetry(net: Network, bw: np.ndarray | None = None) -> Symmetry | None:
    """Automorphisms of a cluster whose nodes come in several kinds, in any order: for every kind
    (nodes of equal size, internal bandwidths and groups, :func:`_node_signatures`) the cyclic shift
    of its nodes in rank order (GPU ``j`` to GPU ``j``) and the least rotation of the GPUs of
    every node of the kind (``j -> j + s``) that is an automorphism, each kind on its own. The
    generators commute, so the group is their product, enumerated as rank permutations (element 0
    the identity). It does not act freely: an element moving one kind fixes the others' ranks; the
    elements of one kind (:meth:`Symmetry.kind_elements`) act on that kind's ranks freely.
    Without the rotations when the product has over :data:`CLASS_GROUP_MAX` elements; None when
    no generator is an automorphism or the group is still too large (the LPs over classes hold a
    row per resource and a column per tree with all its translates: at 512 GPUs of several kinds
    that no longer fits in memory)."""
    bw = net.bw if bw is None else np.asarray(bw, float)
    if net.bw is None or not net.levels:
        return None
    node = np.asarray(net.levels[0], np.int64)
    n = net.nranks
    members = [np.flatnonzero(node == k) for k in range(int(node.max()) + 1)]
    kinds: dict = {}
    for k, sig in enumerate(_node_signatures(net, bw, node, members)):
        if members[k].size:
            kinds.setdefault(sig, []).append(k)
    kind = np.zeros(n, np.int64)
    for i, nodes in enumerate(kinds.values()):
        for k in nodes:
            kind[members[k]] = i
    shifts, rotations = [], []           # (order, rank permutation, resource permutation)
    groups = _group_index(net)
    r = np.arange(n)
    for nodes in kinds.values():
        rows = np.stack([members[k] for k in nodes])           # (nodes of the kind, GPUs per node)
        if len(nodes) > 1:
            sigma = r.copy()
            sigma[rows.ravel()] = np.roll(rows, -1, axis=0).ravel()
            res = _shift_perm(net, sigma, bw, groups)
            if res is not None:
                shifts.append((len(nodes), sigma, res))
        g = rows.shape[1]
        for s in range(1, g):
            if g % s:
                continue
            sigma = r.copy()
            sigma[rows.ravel()] = np.roll(rows, -s, axis=1).ravel()
            res = _shift_perm(net, sigma, bw, groups)
            if res is not None:
                rotations.append((g // s, sigma, res))
                break
    gens = shifts + rotations
    if np.prod([o for o, _, _ in gens]) > CLASS_GROUP_MAX:
        gens = shifts
    order = int(np.prod([o for o, _, _ in gens])) if gens else 1
    if not 1 < order <= CLASS_GROUP_MAX:
        return None
    ranks = r[None, :]
    for o, sigma, _ in gens:
        powers = [r]
        for _ in range(o - 1):
            powers.append(sigma[powers[-1]])
        ranks = np.concatenate([p[ranks] for p in powers])     # every element so far, then sigma^i
    return Symmetry(len(ranks), 0, 1, ranks.astype(np.int64),
                    _orbits_of(net.npairs + net.ngroups, [res for _, _, res in gens]), kind)
