"""The packing LP and its column generation (see :mod:`.trees` for the method).

:class:`_Columns` is the LP's setting (resources, or their orbits under a symmetry, and the
representatives that get trees) and the trees generated so far; :func:`_columns` makes it for a
network, :func:`_initial_columns` seeds it, and :func:`_column_generation` prices new trees in
(:func:`.arborescence.min_arborescence` at the LP's duals, :meth:`_Columns.price`; rail trees
beside, :func:`_rails`) until the LP is within its tolerance of a lower bound: the fractional
packing, :class:`_LPSolution`. :func:`_support_translates` lists the translates of its trees, which
seed another LP.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.synth.arborescence import min_arborescence
from hccc.compiler.synth.master_lp import MasterLP
from hccc.compiler.synth.packing import (PRICED_PLAIN, PackingError, PackOptions, _resources, _translates,
                                         _tree_column, _tree_pairs, pair_cost_matrix, pair_incidence)
from hccc.compiler.synth.problem import Network
from hccc.compiler.synth.symmetry import Symmetry, class_symmetry, node_symmetry, period_symmetry
from hccc.util import clock


#: the LP stops when within this factor of its lower bound (Lagrangian or cut bound)
LP_TOL = 2e-4


def _rails(net: Network) -> tuple[np.ndarray, list] | None:
    """Every rank's node and its *rail peers*: the ranks at the same place (local index, in rank
    order) in every other node, where the nodes have as many ranks each (None otherwise, or with
    one node). Rails need no NIC of their own: they only name which rank of another node a rail
    tree enters it by (:meth:`_Columns.price`)."""
    node = np.asarray(net.levels[0], np.int64) if net.levels else np.zeros(net.nranks, np.int64)
    sizes = np.bincount(node)
    if sizes.size < 2 or (sizes != sizes[0]).any():
        return None
    local = np.zeros(net.nranks, np.int64)
    at = {}
    for v in range(net.nranks):
        local[v] = at.get(int(node[v]), 0)
        at[int(node[v])] = local[v] + 1
    where = {(int(node[v]), int(local[v])): v for v in range(net.nranks)}
    peer = [np.array([where[(b, int(local[v]))] for b in range(sizes.size) if b != node[v]], np.int64)
            for v in range(net.nranks)]
    return node, peer


@dataclass
class _Columns:
    """The LP's setting and the trees generated so far (one packing's solver state).

    Resources are the network's pairs then its shared groups (capacities normalised by ``scale``);
    with a symmetry the LP's rows are resource *orbits* (``orb``: resource -> orbit, ``ocap`` an
    orbit's capacity, ``mult`` the load on each member per tree member in it, ``csize`` a root's
    class size) and only the representatives ``reps`` get trees. A column is a tree as the
    resource orbits it occupies, with multiplicity; ``translate`` (representative -> rank
    permutations) makes a column a representative's tree with all its translates."""

    net: Network
    bw: np.ndarray
    cap: np.ndarray
    capn: np.ndarray
    scale: float
    inc: object
    group: Symmetry | None
    lp_only: bool
    seeding: bool
    perms: np.ndarray
    orb: np.ndarray
    reps: np.ndarray
    mult: np.ndarray
    csize: np.ndarray
    ocap: np.ndarray
    kinds: tuple
    rails: tuple | None
    cross: np.ndarray | None       # arcs between nodes (where there are rails)
    translate: dict | None
    pair_img: dict
    cols: list = field(default_factory=list)        # resource orbits per column, with multiplicity
    col_root: list = field(default_factory=list)    # the root's row key: r, or n + r for an in-tree
    col_par: list = field(default_factory=list)
    col_of: dict = field(default_factory=dict)      # (root, in-tree, parents) -> column
    priced_plain: int = PRICED_PLAIN                # trees priced plain before compiled (:data:`PRICED_PLAIN`)
    priced: int = 0                                 # trees priced so far
    _arcs: tuple = (None, None, None)               # prices, kind, their arc matrix (:meth:`arcs`)

    @property
    def n(self) -> int:
        return self.net.nranks

    @property
    def norbits(self) -> int:
        return int(self.orb.max()) + 1

    def arc_matrix(self, w: np.ndarray, rev: bool) -> np.ndarray:
        """:func:`pair_cost_matrix`, transposed for an in-tree (an out-tree of the transposed network)."""
        C = pair_cost_matrix(self.net, self.bw, w)
        return C.T.copy() if rev else C

    def arcs(self, pi_o: np.ndarray, rev: bool) -> np.ndarray:
        """The arc costs at the prices ``pi_o`` of a tree whose root's class has one member (the
        costs of every root are these times its class size); kept for the next call at the same
        prices (every root of a round, a tree and its rail tree)."""
        if self._arcs[0] is not pi_o or self._arcs[1] != rev:
            self._arcs = (pi_o, rev, self.arc_matrix(self.inc @ (pi_o * self.mult)[self.orb], rev))
        return self._arcs[2]

    def price(self, pi_o: np.ndarray, r: int, rev: bool = False, rail: bool = False,
              many: bool = False) -> tuple[float, np.ndarray | None]:
        """The cheapest tree of root ``r`` at the resource prices ``pi_o`` and its cost; ``rail``:
        the cheapest *rail tree* (None where there is none), whose only arcs between nodes are
        from the root to its rail peers (:func:`_rails`): each other node gets the root's data
        once, on the root's own rail, and spreads it inside. A rail tree is a spanning tree like
        any other and joins the columns only where it prices below the root's dual, so the LP's
        optimum is unchanged; but where every rank's NIC is tight (a 16 GB/s NIC per GCD on
        MI250 nodes) the LP's own trees send some roots' data through other ranks' NICs and
        round to whole chunks one chunk over on a NIC, where rail trees fill each NIC exactly."""
        if rail and self.rails is None:
            return np.inf, None
        self.priced += 1
        many = many or self.priced > self.priced_plain
        if self.translate is not None:     # the tree's cost with all its translates
            w = self.inc @ (pi_o * self.mult)[self.orb]
            C = self.arc_matrix((w * self.csize[r])[self.pair_img[r]].sum(axis=0), rev)
        else:
            C = self.arcs(pi_o, rev) * self.csize[r]
        if rail:
            peer = self.rails[1]
            keep = C[r, peer[r]].copy()
            C[self.cross] = np.inf
            C[r, peer[r]] = keep
        try:
            par = min_arborescence(C, r, many)
        except PackingError:
            if not rail:
                raise
            return np.inf, None           # a node its rail peer cannot span, or no rail
        v = np.flatnonzero(par >= 0)
        return float(C[par[v], v].sum()), par

    def add(self, r: int, par: np.ndarray, rev: bool = False) -> bool:
        """Tree ``par`` of root ``r`` (``rev``: an in-tree) as a new column; False if it is one."""
        net = self.net
        key = (r, rev, par.tobytes())
        if key in self.col_of:
            return False
        self.col_of[key] = len(self.col_par)
        self.col_par.append(par)
        self.col_root.append(r + self.n * rev)
        if rev:
            v = np.flatnonzero(par >= 0)
            pairs = net.pair_index(v, par[v])
            if (pairs < 0).any():
                raise PackingError("a tree uses an arc that is not a pair of the network")
        else:
            pairs = _tree_pairs(net, par, r)
        if self.translate is not None:
            pairs = self.pair_img[r][:, pairs].ravel()
        self.cols.append(self.orb[_tree_column(net, pairs)])
        return True

    def unit_of(self, j: int) -> np.ndarray:
        """The load of column ``j`` on every resource orbit, per unit of its root's data."""
        row = np.zeros(self.norbits)
        c = self.cols[j]
        np.add.at(row, c, self.mult[c] * self.csize[self.col_root[j] % self.n])
        return row

    def root_of(self, j: int) -> tuple[int, bool]:
        """Column ``j``'s root and whether it is an in-tree."""
        rev = self.col_root[j] >= self.n
        return self.col_root[j] - self.n * rev, rev


def _columns(net: Network, bw: np.ndarray, symmetry: bool, joint: bool, translate: dict | None,
             options: PackOptions) -> _Columns:
    """The LP's setting for ``net`` at the pair bandwidths ``bw`` (:class:`_Columns`, no columns yet):
    the symmetry whose classes it solves (:func:`_pack`)."""
    n, P = net.nranks, net.npairs
    cap = _resources(net, bw)
    R = cap.size
    ok = cap > 0
    scale = float(cap[ok].max())
    group = node_symmetry(net, bw) if symmetry else None
    lp_only = seeding = False
    if group is None and symmetry:
        group = period_symmetry(net, bw)       # the LP's classes only: the packing has no loops
        lp_only = group is not None
    if group is None and symmetry and translate is None:
        group = class_symmetry(net, bw)        # classes whose trees seed the LP of translates
        seeding = group is not None
    pair_img = {}
    if translate is not None:
        # a column: a representative's tree and its translates, loads per resource
        perms, orb = np.arange(n)[None, :], np.arange(R)
        reps = np.array(sorted(translate), np.int64)
        for r, E in translate.items():
            pair_img[r] = net.pair_index(E[:, net.psrc].ravel(), E[:, net.pdst].ravel()).reshape(len(E), P)
    elif group is not None:
        perms, orb = group.ranks, group.orbits
        reps = np.unique(perms.min(axis=0))
    else:
        perms, orb, reps = np.arange(n)[None, :], np.arange(R), np.arange(n)
    RO = int(orb.max()) + 1
    # load on each member of an orbit per tree member in it: the root's class size over the orbit's
    csize = np.bincount(perms.min(axis=0), minlength=n)[perms.min(axis=0)].astype(float)
    first = np.full(RO, -1, np.int64)
    first[orb[::-1]] = np.arange(R)[::-1]
    capn = np.where(ok, cap / scale, 0.0)        # normalised capacities (LP conditioning)
    rails = _rails(net) if options.rails else None
    return _Columns(net=net, bw=bw, cap=cap, capn=capn, scale=scale, inc=pair_incidence(net, R), group=group,
                    lp_only=lp_only, seeding=seeding, perms=perms, orb=orb, reps=reps,
                    mult=1.0 / np.bincount(orb, minlength=RO), csize=csize, ocap=capn[first],
                    kinds=(False, True) if joint else (False,), rails=rails,
                    cross=None if rails is None else rails[0][:, None] != rails[0][None, :], translate=translate,
                    pair_img=pair_img, priced_plain=options.priced_plain)


@dataclass
class _LPSolution:
    """Where the column generation ended: the LP's value (normalised time), its weights per column,
    its duals (resource prices ``pi``, root rows ``lam``), the best lower bound proven and rounds."""

    value: float
    y: np.ndarray
    pi: np.ndarray
    lam: np.ndarray
    lower_bound: float
    rounds: int


def _root_rows(cs: _Columns) -> np.ndarray:
    """The LP row of every root key (``r``, or ``n + r`` for an in-tree), -1 for none."""
    n = cs.n
    root_row = np.full(2 * n, -1, np.int64)
    for k, rev in enumerate(cs.kinds):
        root_row[cs.reps + n * rev] = np.arange(cs.reps.size) + k * cs.reps.size
    return root_row


def _initial_columns(cs: _Columns, seed: list | None) -> None:
    """The cheapest tree (and rail tree) of every root by 1/bandwidth, then the ``seed`` trees."""
    okc = cs.ocap > 0
    pi0 = np.where(okc, 1.0 / np.where(okc, cs.ocap, 1.0), 0.0) / cs.mult
    for rev in cs.kinds:
        for r in cs.reps.tolist():
            cs.add(r, cs.price(pi0, r, rev)[1], rev)
            par_r = cs.price(pi0, r, rev, rail=True)[1]
            if par_r is not None:
                cs.add(r, par_r, rev)
    for r, par, rev in seed or ():
        cs.add(int(r), np.asarray(par, np.int64), bool(rev))


def _price_round(cs: _Columns, pi: np.ndarray, lam: np.ndarray) -> tuple[int, float]:
    """Every root's cheapest tree and rail tree at the prices ``pi``, added where below its dual
    ``lam``: the trees added and the sum of the cheapest costs (the Lagrangian's numerator)."""
    added, lag = 0, 0.0
    for k, rev in enumerate(cs.kinds):
        for i0, r in enumerate(cs.reps.tolist()):
            i = i0 + k * cs.reps.size
            below = lam[i] - 1e-9 * max(1.0, abs(lam[i]))
            cost, par = cs.price(pi, r, rev)
            lag += cost
            if cost < below:
                added += cs.add(r, par, rev)
            cost_r, par_r = cs.price(pi, r, rev, rail=True)
            if par_r is not None and cost_r < below:
                added += cs.add(r, par_r, rev)
    return added, lag


def _feed(lp: MasterLP, cs: _Columns, root_row: np.ndarray, fed: int) -> int:
    """The columns of ``cs`` from ``fed`` on join the LP; how many it has."""
    for j in range(fed, len(cs.cols)):
        lp.add(cs.cols[j], cs.mult[cs.cols[j]] * cs.csize[cs.col_root[j] % cs.n], int(root_row[cs.col_root[j]]))
    return len(cs.cols)


def _column_generation(cs: _Columns, bound: float | None, tol: float, deadline: float) -> _LPSolution:
    """The packing LP over the trees of ``cs``, new trees priced in until none improves it, it is
    within ``tol`` of a lower bound (Lagrangian, or ``bound``), or ``deadline``: the fractional
    packing (the module docstring)."""
    root_row = _root_rows(cs)
    lp = MasterLP(cs.ocap, cs.reps.size * len(cs.kinds))
    fed = 0                      # columns handed to the LP so far
    best_lb = 0.0 if bound is None else float(bound) * cs.scale
    lp_val, y, it = np.inf, None, 0
    while True:
        it += 1
        J = fed = _feed(lp, cs, root_row, fed)
        # a round after the first gets only the time left: stopped, the last round's packing stays
        res = lp.solve(None if y is None else deadline - clock.now())
        if res.status == 1 and y is not None:
            break
        if res.status != 0:
            raise PackingError(f"the packing LP failed: {res.message}")
        lp_val, y, pi, lam = float(res.fun), res.y[:J], res.prices, res.eq
        denom = float(pi @ cs.ocap)
        added, lag = _price_round(cs, pi, lam)
        if denom > 0:
            best_lb = max(best_lb, lag / denom)
        if not added or lp_val <= best_lb * (1 + tol) or clock.now() > deadline:
            break
    if lp.solves > 1 and clock.now() < deadline:
        # the last LP (the last round's columns too) solved from scratch: a vertex on fewer trees,
        # which round to whole chunks better than the warm-started one (:mod:`.master_lp`)
        _feed(lp, cs, root_row, fed)
        again = lp.solve_fresh(deadline - clock.now())
        if again.status == 0:
            lp_val, y, pi, lam = float(again.fun), again.y, again.prices, again.eq
    return _LPSolution(lp_val, y, pi, lam, best_lb, it)


def _support_translates(cs: _Columns, y: np.ndarray, perms_of) -> list:
    """``(root, parents, in-tree)`` of every translate (by ``perms_of(root)``) of the LP's trees of
    positive weight ``y``, each once."""
    out, got = [], set()
    for j in np.flatnonzero(y > 1e-9).tolist():
        r, rev = cs.root_of(j)
        roots, tps = _translates(perms_of(r), r, cs.col_par[j])
        for x, tp in zip(roots.tolist(), tps):
            key = (int(x), rev, tp.tobytes())
            if key not in got:
                got.add(key)
                out.append((int(x), tp, rev))
    return out
