"""benchmarks/alltoallv.py: the Zipf router's counts and the model table (the measured section,
which spawns gloo ranks, is exercised by hand: see docs/alltoallv.md)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("alltoallv_bench", ROOT / "benchmarks" / "alltoallv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_router_counts_and_hot_rank():
    b = _bench()
    c = b.zipf_counts(8, 32, 500, 16, 1.2)
    assert (c.sum(axis=1) == 500 * 16).all() and (c % 16 == 0).all()
    # Zipf: the ranks holding the first experts receive the most
    assert c[:, 0].sum() > c[:, 7].sum()
    assert b.hot_rank(np.full((4, 4), 7)) == 1.0
    assert b.hot_rank(c) > 1.5


def test_model_table(capsys):
    b = _bench()
    assert b.main(["--ranks", "8", "--tokens", "64", "--hidden", "32", "--experts", "8"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith("8 ")]
    assert len(rows) == 4                       # 2 programs x dispatch, combine
    for r in rows:
        v, eq, ratio = float(r[7]), float(r[8]), float(r[9])
        assert v > 0 and eq > 0 and abs(v / eq - ratio) <= 0.06 * ratio   # (printed to 0.1 us)
