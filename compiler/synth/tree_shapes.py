"""A packing's trees reshaped without loading its saturated resources more.

:func:`shaped` runs the passes named by a :data:`SHAPES` order: :func:`_consolidate` (a forwarding
rank receives the chunks it forwards from one sender) and :func:`_flatten` (trees made shallower),
every move checked against the packing's limits by :class:`_Loads` (per resource orbit with a
symmetry, every move made in all the translates of a representative tree at once).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.synth.packing import Packing, _pair_matrix, _tree_column
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.symmetry import Symmetry
from hccc.compiler.synth.tree_rows import _depths


#: the orders of the shaping passes tried (``c``: consolidate, ``f``: flatten); the first is the default
SHAPES = ("cfc", "cf", "f")


def shaped(net: Network, packing: Packing, order: str = SHAPES[0]) -> Packing:
    """A copy of ``packing`` with its trees reshaped by :func:`_consolidate` (``c``) and
    :func:`_flatten` (``f``) in ``order``. The loads of the saturated resources never grow, so the
    packing's time (:attr:`Packing.rounded_time`, kept) is an upper bound of the reshaped trees'
    (:attr:`Packing.load_time`: lower where a move lightened the most loaded resource, e.g. a
    one-chunk packing of a100_topo2's ReduceScatter, 0.960 -> 1.000 of the bound); what changes
    besides is how the compiled program's thread blocks overlap (see those functions). With a
    symmetry only the representative trees are reshaped, every move made in all their translates
    at once (:class:`_Loads`), so the result keeps the symmetry."""
    import dataclasses

    sym = packing.symmetry
    G = len(sym) if sym is not None else 1
    parents = [p.copy() for p in packing.parents]
    loads = _Loads(net, packing)
    K = packing.chunks_per_rank
    moves = {"consolidated": 0, "flattened": 0}
    own = range(0, len(parents), G)            # the trees reshaped (representatives)
    for step in order:
        if step == "c":
            moves["consolidated"] += _consolidate(net, packing.roots, parents, packing.counts, K, loads, own)
        elif step == "f":
            moves["flattened"] += _flatten(net, packing.roots, parents, packing.counts, K, loads, own)
        else:
            raise ValueError(f"unknown shaping pass {step!r} (c or f)")
        if sym is not None:
            _retranslate(sym, parents)
    load = loads.full()
    return dataclasses.replace(packing, parents=parents, pair_load=load[:net.npairs].copy(), res_load=load,
                               stats={**packing.stats, "shape": order, **moves})


def _retranslate(sym: Symmetry, parents: list) -> None:
    """Make every tree the translate of its run's representative again (in place)."""
    G = len(sym)
    E = sym.ranks
    rows = np.arange(G)[:, None]
    for j in range(0, len(parents), G):
        par = parents[j]
        v = np.flatnonzero(par >= 0)
        tp = np.full((G, par.size), -1, np.int64)
        tp[rows, E[:, v]] = E[:, par[v]]
        parents[j:j + G] = list(tp)


class _Loads:
    """The resource loads the shaping passes keep, against the packing's limits: per resource, or,
    with a symmetry, per resource orbit (a move made in a representative tree and all its translates
    adds to every member of an orbit alike: ``|G| / |O|`` per member for each of the orbit's
    resources the moved pair occupies)."""

    def __init__(self, net: Network, packing: Packing):
        self.net = net
        self.pairs = _pair_matrix(net)
        sym = packing.symmetry
        if sym is None:
            self.of = None
            self.load = packing.res_load.copy()
            self.limit = packing.res_limit
            self.mult = None
        else:
            O = sym.norbits
            first = np.full(O, -1, np.int64)
            first[sym.orbits[::-1]] = np.arange(sym.orbits.size)[::-1]
            self.of = sym.orbits
            self.load = packing.res_load[first].copy()
            self.limit = packing.res_limit[first]
            self.mult = len(sym) / np.bincount(sym.orbits, minlength=O)
        self._ids: dict = {}
        self.start_pass()

    def start_pass(self) -> None:
        """Room and saturation as they stand at the start of a shaping pass."""
        self.slack = self.limit * (1 + 1e-9) - self.load
        self.tight = (self.limit > 0) & (self.load >= self.limit * (1 - 1e-6))

    def ids(self, pair: int) -> list:
        """The resources (resource orbits, with a symmetry) ``pair`` occupies, with multiplicity
        (worked out once per pair: the passes ask again and again)."""
        got = self._ids.get(pair)
        if got is None:
            ids = _tree_column(self.net, np.array([pair]))
            got = self._ids[pair] = (ids if self.of is None else self.of[ids]).tolist()
        return got

    def try_move(self, p_old: int, p_new: int, w: float) -> bool:
        """Move load ``w`` from pair ``p_old`` to ``p_new`` when every resource has room for it."""
        delta: dict = {}
        mult = self.mult
        for x, pair in ((w, p_new), (-w, p_old)):
            for r in self.ids(pair):
                v = x if mult is None else x * float(mult[r])
                delta[r] = delta[r] + v if r in delta else v
        slack, load = self.slack, self.load
        for r, d in delta.items():
            if not d <= slack[r] + 1e-15:
                return False
        for r, d in delta.items():
            slack[r] -= d
            load[r] += d
        return True

    def full(self) -> np.ndarray:
        return self.load.copy() if self.of is None else self.load[self.of]


def _is_ancestor(par: np.ndarray, a: int, v: int) -> bool:
    """Whether ``a`` lies on the path from ``v`` up to the root (``a == v`` included)."""
    while v >= 0:
        if v == a:
            return True
        v = int(par[v])
    return False


def _consolidate(net: Network, roots, parents, counts, K: int, loads: _Loads, own) -> int:
    """Let every forwarding rank receive the chunks it forwards from one sender: where trees bring
    chunks that ``v`` passes on from several senders, move them to the sender that already brings
    the most, when that pair exists, has room, and is not below ``v`` in the tree. A thread block
    runs its transfers one after another, so a rank forwarding streams that arrive side by side
    (each at a fraction of the link) queues all but one of them until they have arrived; one
    connection brings them chunk after chunk at the full rate, each forwarded while it streams.
    Edits the trees ``own`` of ``parents`` and ``loads``; returns the moves made."""
    n = net.nranks
    P = net.npairs
    pm = loads.pairs
    par_all = np.array(parents, np.int64).reshape(len(parents), n)
    w_all = np.asarray(counts, float) / K
    has_child = np.zeros(par_all.shape, bool)
    t_idx, v_idx = np.nonzero(par_all >= 0)
    has_child[t_idx, par_all[t_idx, v_idx]] = True
    fw = has_child[t_idx, v_idx]
    fwd_load = np.bincount(pm[par_all[t_idx[fw], v_idx[fw]], v_idx[fw]], weights=w_all[t_idx[fw]], minlength=P)
    # every rank's preferred sender: the pair into it with the most forwarded load (the first such pair)
    cand = np.flatnonzero(fwd_load > 0)
    pref = np.full(n, -1, np.int64)
    if cand.size:
        o = cand[np.lexsort((cand, -fwd_load[cand], net.pdst[cand]))]
        head = np.ones(o.size, bool)
        head[1:] = net.pdst[o][1:] != net.pdst[o][:-1]
        pref[net.pdst[o[head]]] = net.psrc[o[head]]
    moves = 0
    loads.start_pass()
    for t in own:
        par = parents[t]
        w = counts[t] / K
        hc = np.zeros(n, bool)
        hc[par[par >= 0]] = True
        for v in np.flatnonzero(hc & (par >= 0)).tolist():
            u, u2 = int(par[v]), int(pref[v])
            if u2 < 0 or u2 == u or _is_ancestor(par, v, u2):
                continue
            new = int(pm[u2, v])
            if new < 0:
                continue
            if loads.try_move(int(pm[u, v]), new, w):
                par[v] = u2
                moves += 1
    return moves


def _flatten(net: Network, roots, parents, counts, K: int, loads: _Loads, own) -> int:
    """Make trees shallower without raising any resource above ``limit`` (the rounded packing's
    time x capacity): a vertex whose parent is not the root moves up to its grandparent when that
    pair exists and has room (its load moves from the old arc to the new one). Shallow trees
    forward less: a chunk that reaches a rank late (over a slow link) is passed on by fewer ranks,
    each on a connection of its own. Edits the trees ``own`` of ``parents`` and ``loads``; returns
    the moves made."""
    moves = 0
    pm = loads.pairs
    loads.start_pass()
    tight = loads.tight
    for t in own:
        r, par = roots[t], parents[t]
        w = counts[t] / K
        changed = True
        while changed:
            changed = False
            d = _depths(par)
            for v in np.argsort(d, kind="stable").tolist():
                p = int(par[v])
                if p < 0 or p == r:
                    continue
                g = int(par[p])
                new = int(pm[g, v])
                if new < 0:
                    continue
                if any(tight[r] for r in loads.ids(new)):
                    continue          # never onto a saturated resource (see _consolidate)
                if loads.try_move(int(pm[p, v]), new, w):
                    par[v] = g
                    moves += 1
                    changed = True
    return moves
