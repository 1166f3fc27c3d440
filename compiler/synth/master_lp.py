"""The tree packing's master LP, kept in one HiGHS model between column-generation rounds.

:func:`hccc.compiler.synth.trees._pack` prices trees against the duals of

    minimise T   s.t.   sum_j a_ej y_j - cap_e T <= 0      for every resource row e
                        sum_{j of root r} y_j = 1          for every root row r

and adds the trees that price below their root's dual as columns. Solving that LP from scratch
every round (scipy's ``linprog``) repeats the work of the rounds before: on a 32-GPU cluster of five
different nodes the joint AllReduce LP took 76 rounds, 14 s of its 17. Here the model lives in one
``highspy.Highs`` object: a round adds its columns (nonbasic at zero, so the last optimal basis stays
primal feasible) and the primal simplex goes on from that basis, a few hundred pivots where a fresh
solve takes thousands (:meth:`MasterLP.solve`).

The vertex a warm-started primal simplex ends on is optimal but often spread over more trees than
the one HiGHS's default method finds from scratch, and the packing rounds the LP's weights to whole
chunks, which goes better with few trees (a 64-GPU V100 cluster's AllReduce: 0.875 of its bound
from the warm-started vertex, 0.903 from a fresh one). So once the rounds are done the last LP is
solved once more from scratch (:meth:`MasterLP.solve_fresh`), a single solve of the final LP.

The duals are HiGHS's own (the objective's derivatives in each row's bound: at most zero on the
resource rows of a minimisation), exactly what scipy's ``linprog`` reports as ``marginals``.
HiGHS writes a banner and diagnostics of its own to standard output, so its model is made and
solved inside :func:`hccc.util.native_output.silenced` with its log switched off.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.util.native_output import silenced

#: HiGHS's ``simplex_strategy`` values: its own choice (the dual simplex, mostly), the primal simplex
SIMPLEX_DEFAULT = 1
SIMPLEX_PRIMAL = 4


@dataclass
class Solution:
    """One round's LP: ``status`` 0 optimal, 1 stopped at its time limit (``y`` and the duals are
    then HiGHS's last iterate, not to be used), 2 anything else (infeasible, say); ``fun`` the
    objective (``T``); ``y`` the columns' weights in the order they were added; ``ineq`` and ``eq``
    the duals of the resource and root rows; ``message`` HiGHS's model status in words."""

    status: int
    fun: float
    y: np.ndarray
    ineq: np.ndarray
    eq: np.ndarray
    message: str

    @property
    def prices(self) -> np.ndarray:
        """The resources' prices the trees are priced at: the resource rows' duals, sign turned
        (at least zero)."""
        return np.maximum(-self.ineq, 0.0)


class MasterLP:
    """``minimise T`` over the resource rows (capacities ``cap``, ``<= 0``) and ``nroots`` root rows
    (``= 1``), with columns added by :meth:`add` and solved by :meth:`solve`, each solve starting from
    the basis of the one before."""

    def __init__(self, cap: np.ndarray, nroots: int):
        import highspy

        cap = np.asarray(cap, float)
        self.nres = int(cap.size)
        self.nroots = int(nroots)
        with silenced():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        inf = h.getInfinity()
        R = self.nres + self.nroots
        lower = np.r_[np.full(self.nres, -inf), np.ones(self.nroots)]
        upper = np.r_[np.zeros(self.nres), np.ones(self.nroots)]
        h.addRows(R, lower, upper, 0, np.zeros(R, np.int32), np.zeros(0, np.int32), np.zeros(0))
        self._h = h
        self._inf = inf
        self._cap = cap
        self._t = -1            # T's column: added after the first solve's columns (:meth:`solve`)
        self._pending: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.solves = 0

    def add(self, res_rows: np.ndarray, values: np.ndarray, root_row: int) -> None:
        """A column: ``values`` on the resource rows ``res_rows`` (repeated rows summed) and 1 on root
        row ``root_row``; it joins the model at the next :meth:`solve`."""
        rows = np.asarray(res_rows, np.int64)
        vals = np.asarray(values, float)
        uniq, inv = np.unique(rows, return_inverse=True)
        summed = np.bincount(inv, weights=vals, minlength=uniq.size)
        self._pending.append((uniq, summed, int(root_row)))

    def _flush(self) -> None:
        if not self._pending:
            return
        starts, idx, vals = [], [], []
        at = 0
        for rows, v, root in self._pending:
            starts.append(at)
            idx.append(rows)
            idx.append(np.array([self.nres + root]))
            vals.append(v)
            vals.append(np.ones(1))
            at += rows.size + 1
        k = len(self._pending)
        self._h.addCols(k, np.zeros(k), np.zeros(k), np.full(k, self._inf), at, np.array(starts, np.int32),
                        np.concatenate(idx).astype(np.int32), np.concatenate(vals))
        self._pending = []

    def solve_fresh(self, time_limit: float | None = None) -> Solution:
        """Solve again from scratch, by HiGHS's default method, forgetting the basis (the vertex it
        ends on, see the module docstring); later solves keep that method."""
        self._h.clearSolver()
        self._h.setOptionValue("simplex_strategy", SIMPLEX_DEFAULT)
        return self.solve(time_limit)

    def solve(self, time_limit: float | None = None) -> Solution:
        """Solve from the last basis (the first time: from scratch), within ``time_limit`` seconds
        of this solve (None: none)."""
        import highspy

        self._flush()
        h = self._h
        if self._t < 0:
            # the first solve is the LP as scipy's ``linprog`` is given it (the columns, then T: cost 1,
            # -cap on every resource row), by HiGHS's default method, from scratch; every later solve
            # starts from the basis before, which the columns it adds (nonbasic at zero) leave
            # primal feasible: the primal simplex goes on from there (measured on a 32-GPU joint
            # AllReduce LP of 76 rounds: 2.8 s, against 9.5 s with the dual simplex from the same
            # bases and 14.4 s solving every round from scratch)
            cap = self._cap
            rows = np.flatnonzero(cap != 0).astype(np.int32)
            self._t = h.getNumCol()
            h.addCols(1, np.ones(1), np.zeros(1), np.full(1, self._inf), rows.size, np.zeros(1, np.int32), rows,
                      -cap[rows])
        elif self.solves == 1:
            h.setOptionValue("simplex_strategy", SIMPLEX_PRIMAL)
        # HiGHS's time limit counts the model's whole run time, every solve before this one included
        limit = self._inf if time_limit is None else h.getRunTime() + max(0.01, float(time_limit))
        h.setOptionValue("time_limit", float(limit))
        with silenced():
            h.run()
        self.solves += 1
        ms = h.getModelStatus()
        message = h.modelStatusToString(ms)
        if ms == highspy.HighsModelStatus.kOptimal:
            status = 0
        elif ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kIterationLimit):
            status = 1
        else:
            status = 2
        sol = h.getSolution()
        x = np.asarray(sol.col_value, float)
        dual = np.asarray(sol.row_dual, float)
        t = self._t
        y = np.r_[x[:t], x[t + 1:]] if x.size else np.zeros(0)
        fun = float(x[t]) if x.size else np.inf
        return Solution(status, fun, y, dual[:self.nres].copy(), dual[self.nres:].copy(), message)
