"""The tree packing's master LP kept between rounds (compiler/synth/master_lp.py) against scipy's
``linprog`` solving the same LP from scratch (an independent formulation: its own sparse matrices,
its own HiGHS call), round after round of added columns."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("highspy")
scipy_opt = pytest.importorskip("scipy.optimize")

from hccc.compiler.synth.master_lp import MasterLP  # noqa: E402


def _from_scratch(cap, roots, columns):
    """min T over the columns (rows, values, root) as scipy's linprog solves it in one go."""
    J = len(columns)
    R = cap.size
    A_ub = np.zeros((R, J + 1))
    A_eq = np.zeros((len(roots), J + 1))
    for j, (rows, vals, root) in enumerate(columns):
        np.add.at(A_ub[:, j], rows, vals)
        A_eq[root, j] = 1.0
    A_ub[:, J] = -cap
    c = np.zeros(J + 1)
    c[J] = 1.0
    res = scipy_opt.linprog(c, A_ub=A_ub, b_ub=np.zeros(R), A_eq=A_eq, b_eq=np.ones(len(roots)),
                            bounds=[(0, None)] * (J + 1), method="highs")
    assert res.status == 0
    return res, A_ub, A_eq


@st.composite
def lps(draw):
    R = draw(st.integers(2, 8))
    nroots = draw(st.integers(1, 4))
    cap = np.array(draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=R, max_size=R)))
    rounds = []
    for k in range(draw(st.integers(1, 4))):
        cols = []
        # the first round gives every root a column, so that the LP is feasible
        for root in (range(nroots) if k == 0 else [draw(st.integers(0, nroots - 1))
                                                   for _ in range(draw(st.integers(1, 4)))]):
            rows = draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=6))   # repeats allowed
            vals = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=len(rows), max_size=len(rows)))
            cols.append((np.array(rows), np.array(vals), root))
        rounds.append(cols)
    return cap, list(range(nroots)), rounds


@settings(max_examples=60, deadline=None)
@given(lps())
def test_each_round_solves_the_lp_of_every_column_so_far(lp):
    cap, roots, rounds = lp
    master = MasterLP(cap, len(roots))
    seen = []
    for cols in rounds:
        for rows, vals, root in cols:
            master.add(rows, vals, root)
        seen += cols
        got = master.solve()
        ref, A_ub, A_eq = _from_scratch(cap, roots, seen)
        assert got.status == 0
        assert got.fun == pytest.approx(ref.fun, rel=1e-7, abs=1e-9)
        # the weights are feasible and give the objective
        x = np.r_[got.y, got.fun]
        assert (got.y >= -1e-9).all()
        assert (A_ub @ x <= 1e-7).all()
        assert A_eq @ x == pytest.approx(np.ones(len(roots)))
        # the duals are optimal ones: feasible (each column's reduced cost >= 0, resource duals <= 0,
        # T's column priced at its cost) and their objective (the root rows' right-hand sides are
        # 1) equals the primal's
        assert (got.ineq <= 1e-9).all()
        reduced = np.r_[np.zeros(len(seen)), 1.0] - (A_ub.T @ got.ineq + A_eq.T @ got.eq)
        assert (reduced >= -1e-7).all()
        assert got.eq.sum() == pytest.approx(got.fun, rel=1e-7, abs=1e-9)
    # solved again from scratch: the same optimum (another optimal vertex, maybe), duals optimal
    again = master.solve_fresh()
    assert again.status == 0 and again.fun == pytest.approx(ref.fun, rel=1e-7, abs=1e-9)
    assert again.eq.sum() == pytest.approx(again.fun, rel=1e-7, abs=1e-9)
    assert (np.r_[np.zeros(len(seen)), 1.0] - (A_ub.T @ again.ineq + A_eq.T @ again.eq) >= -1e-7).all()


def test_a_column_on_no_capacity_makes_the_lp_infeasible_not_a_crash():
    master = MasterLP(np.array([0.0, 1.0]), 1)
    master.add(np.array([0]), np.array([1.0]), 0)        # a tree over a resource of no capacity
    got = master.solve()
    assert got.status == 2 and got.message


def test_the_solver_writes_nothing_to_standard_output(capfd):
    master = MasterLP(np.array([1.0, 2.0]), 2)
    master.add(np.array([0, 1]), np.array([1.0, 1.0]), 0)
    master.add(np.array([1]), np.array([1.0]), 1)
    assert master.solve().status == 0
    out, _ = capfd.readouterr()
    assert out == ""
