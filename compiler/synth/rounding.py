"""A fractional packing rounded to whole chunks per rank (see :mod:`.trees` for the method).

:class:`_Rounding` runs one loop over chunk counts (:data:`CHUNK_CANDIDATES`, and the common
denominator of the LP's weights, :func:`_lp_denominator`), each trying its strategies in turn:
largest remainder (:func:`_round_counts`) repaired, regrowing (:mod:`.balancing`), the MILP over
the LP's trees (:func:`_milp_counts`); integral trees (:mod:`.branchings`) where none is within the
tolerance. It makes the :class:`.packing.Packing` of the count kept, and keeps what it found per
count, so that rounding again to fewer chunks (a packing's ``reround``) reuses it.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.synth.balancing import REGROW_PASSES, _Regrowth, _regrow_pass, _repair, _time_of
from hccc.compiler.synth.packing import (Packing, PackOptions, _translates, _tree_column, _tree_pairs,
                                         transposed_pair_order)
from hccc.compiler.synth.packing_lp import _Columns, _LPSolution, _root_rows
from hccc.util import clock
from hccc.util.native_output import silenced


#: chunk counts tried when rounding, smallest first
CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)

#: rounded packings within this factor of the LP time are accepted
ROUND_TOL = 5e-3

#: seconds the integral rounding (:func:`_milp_counts`) may spend over all chunk counts tried: a
#: guard only, as :data:`.packing.ROUND_MILP_EACH`
ROUND_MILP_SECONDS = 30.0

#: branch-and-bound nodes the rounding's program may explore per chunk count (deterministic)
ROUND_MILP_NODES = 40

#: the most generated trees the rounding's program chooses among
MILP_COLUMNS = 300


class _Rounding:
    """The fractional packing ``sol`` over the trees of ``cs`` rounded to whole chunks: for each
    chunk count tried, the rounding strategies (:attr:`strategies`) run in turn until one is within
    ``round_tol`` of the LP; where none is, integral trees (:mod:`.branchings`) where faster.
    Keeps what it found per chunk count, so that rounding again to fewer chunks (:meth:`reround`,
    a packing's ``reround``) reuses it."""

    def __init__(self, cs: _Columns, sol: _LPSolution, *, joint: bool, round_tol: float, deadline: float,
                 exact: dict, lp_s: float, options: PackOptions):
        self.cs, self.sol, self.joint, self.round_tol, self.options = cs, sol, joint, round_tol, options
        self.deadline, self.exact, self.lp_s = deadline, exact, lp_s
        n = cs.n
        # integral chunk counts (columns added in the last round have no weight yet)
        self.y = np.r_[sol.y, np.zeros(len(cs.cols) - sol.y.size)]
        self.load_unit = np.array([cs.unit_of(j) for j in range(len(cs.cols))]).reshape(len(cs.cols), cs.norbits)
        self.croot = np.array(cs.col_root)
        self.exact_k = _lp_denominator(self.y)
        root_row = _root_rows(cs)
        rc = self.load_unit @ sol.pi - sol.lam[root_row[np.array(cs.col_root)]]     # reduced costs at the last duals
        # the MILP's trees: past MILP_COLUMNS generated ones, those of the LP's support and the
        # cheapest others by their last reduced cost (the rest rarely help and slow it down)
        keep = np.ones(len(cs.cols), bool)
        if len(cs.cols) > MILP_COLUMNS:
            keep = self.y > 1e-9
            rest = np.flatnonzero(~keep)
            keep[rest[np.argsort(rc[rest], kind="stable")[:max(0, MILP_COLUMNS - int(keep.sum()))]]] = True
        self.keep_cols = keep
        self.target = sol.value * (1 + round_tol)   # a rounding this close to the LP is accepted
        self.rounded: dict[int, tuple] = {}    # K -> round_to's (time, counts, seconds): a re-rounding reuses them
        self.nroots = 2 * n
        #: after the largest remainders repaired, each tried while the counts miss the target
        self.strategies = (self._regrown, self._milp)

    # ------------------------------------------------------------ one chunk count
    def round_to(self, K: int, left: float) -> tuple[float, np.ndarray, float]:
        """Counts of K chunks per rank: largest remainders repaired, then each of
        :attr:`strategies` while the counts miss the LP by more than ``round_tol`` (``left``
        seconds for the MILP); and the seconds with which the rounding would end the same
        (infinity: the MILP ended before its time, by its node limit, or was not needed)."""
        counts = _repair(_round_counts(self.y, self.croot, self.nroots, K), self.croot, self.load_unit,
                         self.cs.ocap, K)
        t = _time_of(counts, self.load_unit, self.cs.ocap, K)
        same_within = np.inf
        for strategy in self.strategies:
            if t <= self.target or K <= 1:
                break
            counts, t, same_within = strategy(K, counts, t, left)
        return t, counts, same_within

    def _milp(self, K: int, counts: np.ndarray, t: float, left: float):
        """The MILP's counts over the kept columns (:func:`_milp_counts`) where better, given ``left``
        seconds; with the seconds with which it would end the same."""
        if left <= 0.05:
            return counts, t, 0.0              # no MILP run
        m0 = clock.now()
        sub = np.flatnonzero(self.keep_cols)
        got = _milp_counts(self.croot[sub], self.load_unit[sub], self.cs.ocap, K, left, target=self.target,
                           gap=self.round_tol, nodes=ROUND_MILP_NODES, floor=self.sol.value)
        if got is not None:
            exact = np.zeros(len(self.croot), np.int64)
            exact[sub] = got
            te = _time_of(exact, self.load_unit, self.cs.ocap, K)
            if te < t:
                counts, t = exact, te
        # its time guard may have ended it: more time may find more
        return counts, t, (left if clock.now() - m0 > 0.9 * left else np.inf)

    def _regrown(self, K: int, counts: np.ndarray, t: float, left: float):
        """Counts of K chunks per rank that the LP's trees could not round well, improved by moving
        one chunk at a time onto the cheapest tree of its root at prices that grow exponentially
        with each resource's load (a new tree where none generated is cheaper): the rounding's
        own column generation, against the integral loads rather than the LP's duals."""
        cs = self.cs
        okr = cs.ocap > 0
        inv = np.where(okr, 1.0 / np.where(okr, cs.ocap, 1.0), 0.0) / K
        grow = _Regrowth(list(self.load_unit * inv[None, :]), counts.tolist(), counts @ self.load_unit * inv,
                         (t, counts.tolist()), len(cs.cols))
        for alpha in self.options.regrow_alphas:
            moved = True
            for _ in range(REGROW_PASSES):
                if not moved or grow.best[0] <= self.target:
                    break
                moved = _regrow_pass(self.cs, grow, alpha / self.sol.value, inv, okr, self.sol.value)
        new = len(cs.cols) - grow.first_new
        if new:
            self.load_unit = np.vstack([self.load_unit] + [cs.unit_of(i) for i in range(grow.first_new, len(cs.cols))])
            self.croot = np.r_[self.croot, np.array(cs.col_root[grow.first_new:], np.int64)]
            self.y = np.r_[self.y, np.zeros(new)]
            self.keep_cols = np.r_[self.keep_cols, np.zeros(new, bool)]
        tb, cb = grow.best
        return np.r_[np.array(cb, np.int64), np.zeros(len(cs.cols) - len(cb), np.int64)], tb, np.inf

    # ------------------------------------------------------------ integral trees
    def integral_at(self, K: int, until: float) -> tuple[float, np.ndarray] | None:
        """The least time of K trees per root and the pair multiplicities that attain it
        (:func:`.branchings.integral_arcs`; the trees themselves are grown only for the count
        kept) as ``(normalised time, multiplicities)``, where the network is small enough and the
        time allows (:data:`.branchings.SECONDS` in all, across every K, and the packing's time limit); None otherwise.
        Out-trees only (a joint packing's halves share their resources)."""
        from hccc.compiler.synth import branchings as br

        exact, net = self.exact, self.cs.net
        if self.joint or not self.options.integral or K > br.MAX_CHUNKS:
            return None
        if "sized" not in exact:
            exact["sized"] = br.sized(net, exact["perms"])
        if not exact["sized"]:
            return None
        if K not in exact["found"]:
            b0 = clock.now()
            until = min(until, b0 + br.SECONDS - exact["spent"])
            got = br.integral_arcs(net, K, self.cs.cap, until, exact["sets"], exact["perms"]) if until > b0 else None
            exact["spent"] += clock.now() - b0
            if got is None and clock.now() >= until:
                exact.setdefault("clock_cut", set()).add(K)      # the clock, not a node limit, ended it
            exact["found"][K] = None if got is None else (got[0] * self.cs.scale, got[1])
        return exact["found"][K]

    def integral_trees(self, K: int, t_round: float, mult: np.ndarray, r0: float) -> Packing | None:
        """The Packing of the integral trees on the multiplicities ``mult`` (K per root, no
        symmetry: every tree listed) with the LP's figures; None where growing them runs out of
        time."""
        from hccc.compiler.synth import branchings as br

        cs, sol, exact, net = self.cs, self.sol, self.exact, self.cs.net
        if K not in exact["grown"]:
            exact["grown"][K] = br.trees_on(net, mult, K, clock.now() + br.SECONDS)
        trees = exact["grown"][K]
        if trees is None:
            exact.setdefault("clock_cut", set()).add(K)          # growing them ran out of time
            return None
        load = np.zeros(cs.cap.size)
        for r, par, c in trees:
            np.add.at(load, _tree_column(net, _tree_pairs(net, par, r)), c / K)
        return Packing(cs.n, K, [int(r) for r, _, _ in trees], [np.asarray(par) for _, par, _ in trees],
                       [int(c) for _, _, c in trees], sol.value / cs.scale, sol.lower_bound / cs.scale,
                       t_round / cs.scale, sol.rounds, len(cs.cols), self.lp_s + clock.now() - r0,
                       load[:net.npairs].copy(),
                       {"lp_trees": int((self.y > 1e-9).sum()), "symmetry": 1, "classes": int(cs.reps.size),
                        "lp_rows": cs.norbits, "integral": True, **self.clock_cut()}, load, cs.capn * t_round, None, self.reround, None)

    # ------------------------------------------------------------ the loop over chunk counts
    def _tried(self, kmax: int, min_k: int, round_deadline: float) -> tuple[tuple, list]:
        """Every chunk count from ``min_k`` to ``kmax`` rounded, fewest first, until one is within
        the tolerance: the best ``(time, K, counts)`` and all those tried."""
        best, tried = None, []
        tries = sorted({k for k in CHUNK_CANDIDATES + ((self.exact_k,) if self.exact_k else ()) if min_k <= k <= kmax})
        for K in tries or [min_k]:
            left = min(round_deadline - clock.now(), self.options.round_milp_each)
            if not (K in self.rounded and self.rounded[K][2] >= left):
                self.rounded[K] = self.round_to(K, left)   # else rounded before, and more time would not change it
            t, counts = self.rounded[K][:2]
            tried.append((t, K, counts))
            if best is None or t < best[0] * (1 - 1e-12):
                best = (t, K, counts)
            if t <= self.target:
                break
        return best, tried

    def _with_integral(self, best: tuple, tried: list) -> tuple:
        """No count rounds the LP's trees within the tolerance: the best K trees per root at
        every count (:mod:`.branchings`), where faster, the fewest counts first; bounded by the
        packing's own time limit, not the rounding's (so the counts tried, and the result, do not
        depend on how fast the rounding ran). Edits ``tried``."""
        for j, (t, K, _) in enumerate(tried):
            got = self.integral_at(K, self.deadline)
            if got is not None and got[0] < t * (1 - 1e-12):
                tried[j] = (got[0], K, got[1])      # (time, multiplicities)
                if got[0] < best[0] * (1 - 1e-12):
                    best = tried[j]
                if got[0] <= self.target:
                    break
        return best

    def finish(self, kmax: int, min_k: int, round_deadline: float, integral: bool = True):
        """The LP's trees rounded to integral counts of at most ``kmax`` chunks per rank, or
        (``integral``: where no count rounds within the tolerance, and they are faster) integral
        trees at that count."""
        r0 = clock.now()
        best, tried = self._tried(kmax, min_k, round_deadline)
        if integral and best[0] > self.target:
            best = self._with_integral(best, tried)
        # where no count is within the tolerance of the LP, the fewest chunks within it of the
        # best rounding (more chunks are more streams and thread blocks for a sliver of rate)
        t_round, K, counts = next(c for c in tried if c[0] <= best[0] * (1 + self.round_tol))
        found = self.exact["found"].get(K)
        if integral and not self.joint and found is not None and counts is found[1]:
            # integral trees: grown now (where that runs out of time, the LP's rounding stands)
            plain = self.finish(kmax, min_k, round_deadline, integral=False)[0]     # its roundings are cached
            exact_p = self.integral_trees(K, t_round, counts, r0)
            if exact_p is None:
                return (plain,)
            exact_p.alternative = plain
            exact_p.exact = self.exact
            return (exact_p,)
        return self._packings(K, t_round, np.r_[counts, np.zeros(len(self.cs.col_root) - counts.size, np.int64)], r0)

    def clock_cut(self) -> dict:
        """``{"rounding_stopped_by_clock": [K, ...]}``: the chunk counts whose rounding the clock
        ended (its MILP's seconds guard, or no seconds left for it) rather than its node limit
        (:meth:`round_to`'s seconds, finite only then), or whose integral packing
        (:mod:`.branchings`, :meth:`integral_at`) its seconds ended; empty where none was. Only
        these roundings may come out otherwise on a slower or busier machine."""
        cut = sorted({K for K, got in self.rounded.items() if np.isfinite(got[2])}
                     | set((self.exact or {}).get("clock_cut", ())))
        return {"rounding_stopped_by_clock": cut} if cut else {}

    def _support(self) -> list | None:
        """With translates: the LP's trees of positive weight, every translate listed."""
        cs = self.cs
        if cs.translate is None:
            return None
        support = []
        for j in np.flatnonzero(self.y > 1e-9).tolist():
            r, rev = cs.root_of(j)
            got_roots, tp = _translates(cs.translate[r], r, cs.col_par[j])
            support += [(int(x), t, rev) for x, t in zip(got_roots.tolist(), tp)]
        return support

    def _packings(self, K: int, t_round: float, counts: np.ndarray, r0: float) -> tuple:
        """The :class:`Packing` of every kind (out-trees; with a joint packing, in-trees too) of
        ``counts`` chunks on the columns, every translate of a representative's tree listed."""
        cs, sol, net = self.cs, self.sol, self.cs.net
        n, P = cs.n, net.npairs
        support = self._support()
        # the translates load every member of an orbit alike: the orbit's load per member
        load = ((counts[:, None] * self.load_unit).sum(axis=0) / K)[cs.orb]
        limit = cs.capn * t_round
        col_root = np.array(cs.col_root)
        out = []
        for rev in cs.kinds:
            keep = np.flatnonzero((counts > 0) & ((col_root >= n) == rev))
            order = keep[np.lexsort((keep, col_root[keep]))]
            roots, parents, cnts = [], [], []
            for j in order.tolist():           # every translate of a representative's tree
                r = cs.col_root[j] - n * rev
                got_roots, tp = _translates(cs.perms if cs.translate is None else cs.translate[r], r, cs.col_par[j])
                roots.extend(got_roots.tolist())
                parents.extend(tp)
                cnts.extend([int(counts[j])] * len(tp))
            lo, li = load, limit
            if rev:     # the in-trees' packing is read on the transposed network: its pair order
                tord = transposed_pair_order(net)
                lo, li = np.r_[load[:P][tord], load[P:]], np.r_[limit[:P][tord], limit[P:]]
            out.append(Packing(n, K, roots, parents, cnts, sol.value / cs.scale, sol.lower_bound / cs.scale,
                               t_round / cs.scale, sol.rounds, len(cs.cols), self.lp_s + clock.now() - r0,
                               lo[:P].copy(),
                               {"lp_trees": int((self.y > 1e-9).sum()), "symmetry": cs.perms.shape[0],
                                "classes": int(cs.reps.size), "lp_rows": cs.norbits,
                                **({"joint": True} if self.joint else {}), **self.clock_cut()}, lo, li,
                               None if cs.lp_only else cs.group, self.reround, support, exact=self.exact))
        return tuple(out)

    def reround(self, kmax: int, time_limit: float = ROUND_MILP_SECONDS, min_chunks: int = 1):
        """The same LP's trees rounded again to at most ``kmax`` chunks per rank (at least
        ``min_chunks``) within ``time_limit`` seconds."""
        return self.finish(max(1, int(kmax)), max(1, min(int(min_chunks), int(kmax))),
                           clock.now() + max(0.0, float(time_limit)))


def _round_counts(y: np.ndarray, root: np.ndarray, n: int, K: int) -> np.ndarray:
    """Per column a count, ``sum over a root's columns = K``, nearest to ``K * y`` (largest remainder)."""
    counts = np.zeros(y.size, np.int64)
    for r in np.unique(root).tolist():
        js = np.flatnonzero(root == r)
        w = np.maximum(y[js], 0.0)
        w = w / w.sum() if w.sum() > 0 else np.full(js.size, 1.0 / js.size)
        f = w * K
        base = np.floor(f + 1e-9).astype(np.int64)
        rest = K - int(base.sum())
        if rest > 0:
            base[np.argsort(-(f - base), kind="stable")[:rest]] += 1
        counts[js] = base
    return counts


def _lp_denominator(y: np.ndarray, most: int = CHUNK_CANDIDATES[-1]) -> int | None:
    """The least ``K <= most`` with every LP weight a multiple of ``1/K`` (an LP vertex's weights
    are often fractions such as sixteenths or seventeenths), or None."""
    import math
    from fractions import Fraction

    K = 1
    for w in y[y > 1e-9].tolist():
        f = Fraction(w).limit_denominator(most)
        if abs(float(f) - w) > 1e-7:
            return None
        K = K * f.denominator // math.gcd(K, f.denominator)
        if K > most:
            return None
    return K


def _milp_counts(root: np.ndarray, load_unit: np.ndarray, capn: np.ndarray, K: int,
                 time_limit: float, target: float = np.inf, gap: float = 1e-4,
                 nodes: int | None = None, floor: float = 0.0) -> np.ndarray | None:
    """Integral chunk counts over the generated trees (``K`` per root row) whose most loaded
    resource is least: a small mixed-integer program (scipy's HiGHS) over the LP's columns, stopped
    after ``nodes`` branch-and-bound nodes (deterministic; ``time_limit`` seconds as a guard) with
    the best counts found, or once within ``gap`` of its relaxation
    (None: none found, or none with the most loaded resource's time at most ``target``, in the
    units of ``capn``). Where largest-remainder
    rounding of the LP's weights misses (an LP vertex whose weights are thirds or sevenths of a
    chunk), another combination of the same trees often fits ``K`` chunks exactly.

    ``floor``: a lower bound of the least most-loaded time (the LP's): a resource that no choice
    of counts loads past it (every root's ``K`` chunks on its tree loading it most) can never be
    the most loaded one above it, so it is left out of the program, which has the same optimum
    (on 64 heterogeneous GPUs 63 of 1,528 resources stay)."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    J = root.size
    ok = (capn > 0) & (load_unit.sum(axis=0) > 0)
    if J == 0 or not ok.any():
        return None
    U = load_unit[:, ok] / (capn[ok] * K)           # utilisation per chunk on each column
    rows, ridx = np.unique(root, return_inverse=True)
    most = np.zeros((rows.size, U.shape[1]))
    np.maximum.at(most, ridx.reshape(-1), U)
    can = K * most.sum(axis=0) > float(floor)       # resources some counts load past ``floor``
    U = U[:, can] if can.any() else U[:, :1]
    A_eq = sparse.csr_matrix((np.ones(J), (np.searchsorted(rows, root), np.arange(J))), shape=(rows.size, J + 1))
    A_ub = sparse.hstack([sparse.csr_matrix(U.T), sparse.csr_matrix(-np.ones((U.shape[1], 1)))]).tocsr()
    c = np.zeros(J + 1)
    c[-1] = 1.0
    try:
        with silenced():
            res = milp(c, constraints=[LinearConstraint(A_eq, K, K), LinearConstraint(A_ub, -np.inf, 0.0)],
                       integrality=np.r_[np.ones(J), 0.0], bounds=Bounds(np.zeros(J + 1), np.r_[np.full(J, K), target]),
                       options={"time_limit": float(time_limit), "mip_rel_gap": float(gap), "disp": False,
                                **({"node_limit": int(nodes)} if nodes else {})})
    except ValueError:
        return None
    if res.x is None:
        return None
    counts = np.round(res.x[:J]).astype(np.int64)
    per_row = np.bincount(np.searchsorted(rows, root), weights=counts, minlength=rows.size)
    return counts if (per_row == K).all() and (counts >= 0).all() else None
