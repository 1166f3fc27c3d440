"""Micro-batch balancing: exact optimality against brute force, sums, proportionality, CLI."""
from __future__ import annotations

import itertools
import json
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from hccc.cli import main
from hccc.runtime.balance import BalanceError, balance

speeds_st = st.lists(st.integers(1, 40).map(lambda k: k / 8), min_size=1, max_size=4)


def brute_best(speeds, batch, min_each):
    """Smallest max_i b_i / s_i over every split whose parts are floor or ceil of the exact share
    (after reserving ``min_each``), by enumeration."""
    sp = [Fraction(str(s)) for s in speeds]
    best = None
    rest = batch - len(sp) * min_each
    shares = [rest * s / sum(sp) for s in sp]
    choices = [sorted({int(x), -(-x.numerator // x.denominator)}) for x in shares]
    for b in itertools.product(*choices):
        if sum(b) != rest:
            continue
        b = [x + min_each for x in b]
        t = max(Fraction(x) / s for x, s in zip(b, sp))
        best = t if best is None or t < best else best
    return best


@settings(max_examples=150)
@given(speeds_st, st.integers(0, 12), st.integers(0, 2))
def test_balance_is_optimal_and_sums(speeds, batch, min_each):
    if batch < len(speeds) * min_each:
        with pytest.raises(BalanceError):
            balance(speeds, batch, min_each=min_each)
        return
    b = balance(speeds, batch, min_each=min_each)
    assert sum(b) == batch and len(b) == len(speeds)
    assert all(x >= min_each for x in b)
    sp = [Fraction(str(s)) for s in speeds]
    got = max(Fraction(x) / s for x, s in zip(b, sp))
    assert got == brute_best(speeds, batch, min_each)


@settings(max_examples=200)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=16), st.integers(0, 10 ** 6))
def test_balance_close_to_proportional(speeds, batch):
    b = balance(speeds, batch)
    total = sum(speeds)
    for x, s in zip(b, speeds):
        share = Fraction(batch * s, total)
        assert share - 1 < x < share + 1   # floor or ceiling of the exact share


def test_balance_examples():
    assert balance([2, 1], 9) == [6, 3]
    assert balance([1, 1, 1], 4) == [2, 1, 1]          # ties go to the lower index
    assert balance([2.1, 1.0], 0) == [0, 0]
    with pytest.raises(BalanceError, match="positive"):
        balance([1, 0], 3)


def test_balance_cli(capsys):
    assert main(["balance", "--speeds", "2,1", "--batch", "9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sizes"] == [6, 3] and out["step_time"] == 3.0 and out["uniform_step_time"] == 4.0
    assert main(["balance", "--speeds", "1,1,1", "--batch", "2", "--min-each", "1"]) == 1
    assert "cannot give each" in capsys.readouterr().err
    assert main(["balance", "--speeds", "1,-2", "--batch", "2"]) == 2


def test_balance_cli_json_stays_json_at_extreme_speeds(capsys):
    """A speed so small that a step's time overflows a double printed ``Infinity`` (not JSON) and
    "infx faster": now refused with a message; speeds far apart that fit still give finite JSON."""
    assert main(["balance", "--speeds", "1e-320,1", "--batch", "5", "--json"]) == 1
    cap = capsys.readouterr()
    assert "Infinity" not in cap.out and "larger unit" in cap.err + cap.out
    assert main(["balance", "--speeds", "1e-300,1", "--batch", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert out["sizes"] == [0, 5] and out["step_time"] == 5.0
