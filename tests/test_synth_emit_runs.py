"""Large synthesised programs without a symmetry to loop over are written with their runs folded
into loops (compiler/synth/emit.py ``_run_lines``): the text parses back to exactly the program's
transfers (channels included), with far fewer lines than transfers."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples

from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import emit, synthesize

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _sorted(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort(rows.T[::-1])]


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_runs_as_loops_parse_back_to_the_same_transfers(monkeypatch, collective):
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    res = synthesize(topo, collective, method="trees", time_limit=30)
    res.loops = None                                     # as on a cluster without symmetry
    monkeypatch.setattr(emit, "LOOPS_FROM_TRANSFERS", 1)
    text = emit.to_rccl(res, topo)
    assert "for p in range(0, " in text
    alg = parse_rccl(text, "t.rccl")
    back = np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.channels]
    rows = res.rows if res.rows.shape[1] > 5 else np.c_[res.rows, np.zeros(len(res.rows), np.int64)]
    assert np.array_equal(_sorted(back), _sorted(rows.astype(np.int64)))
    body = [ln for ln in text.splitlines() if ln.startswith("    ") and not ln.strip().startswith("#")]
    assert len(body) < len(rows) * 0.75, (len(body), len(rows))   # the pieces of a stream fold


def test_run_lines_on_hand_made_rows():
    """Runs with rising, falling and constant steps, runs broken by a gap, and single transfers,
    against the rows they were made from."""
    rows = np.array([[0, 1, 5, 10, 0, 0], [0, 1, 4, 11, 0, 0], [0, 1, 3, 12, 0, 0],     # step down
                     [0, 1, 3, 20, 0, 2], [0, 1, 3, 22, 0, 2],                         # step constant
                     [2, 3, 1, 0, 1, 0], [2, 3, 2, 1, 1, 0], [2, 3, 9, 7, 1, 0],       # run, then a jump
                     [3, 0, 7, 30, 0, 1]], np.int64)                                   # alone
    lines = emit._run_lines(rows)
    text = 'def ResCCLAlgo(nRanks=4, OpType="Allgather", AlgoName="t", nChunksPerRank=40):\n' + \
        "\n".join(lines) + "\n"
    assert len(re.findall(r"for p in range", text)) == 3
    assert "5 - 1 * p" in text and "10 + 1 * p" in text and "20 + 2 * p" in text
    alg = parse_rccl(text, "t.rccl")
    back = np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.channels]
    assert np.array_equal(_sorted(back), _sorted(rows))


def test_runs_of_runs_fold_again():
    """The streams of a pair, a channel each, whose pieces are runs: consecutive runs alike in count
    and advances whose first transfers advance evenly fold into a loop around the run's loop, and
    such loops again (three levels here), against the rows they were made from; a run that breaks
    the pattern (another count) stays a loop of its own."""
    rows = []
    for o in range(3):                   # three groups of streams, 20 chunks and 5 channels apart
        for q in range(4):               # four streams, a channel each
            for p in range(2):           # two pieces a stream, one step apart
                rows.append([5, 6, 2 + p, 100 + 20 * o + 4 * q + p, 0, 1 + 5 * o + q])
    rows += [[5, 6, 9, 500 + p, 0, 0] for p in range(3)]          # a run of another count
    rows = np.array(rows, np.int64)
    lines = emit._run_lines(rows)
    text = 'def ResCCLAlgo(nRanks=8, OpType="Allgather", AlgoName="t", nChunksPerRank=80):\n' + \
        "\n".join(lines) + "\n"
    assert "for u in range(0, 3):" in text and "for q in range(0, 4):" in text
    assert "transfer(5, 6, 2 + 1 * p, 100 + 20 * u + 4 * q + 1 * p, recv, 1 + 5 * u + 1 * q)" in text
    body = [ln for ln in lines if not ln.strip().startswith("#")]
    assert len(body) == 4 + 2                       # three loops and a transfer; a loop and a transfer
    alg = parse_rccl(text, "t.rccl")
    back = np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.channels]
    assert np.array_equal(_sorted(back), _sorted(rows))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 6), st.integers(0, 20),
                          st.integers(0, 1), st.integers(0, 3)), min_size=1, max_size=40),
       st.integers(1, 4), st.integers(1, 3))
def test_folded_text_parses_back_to_any_rows(base, copies, stride):
    """Any transfers (here with some laid out as strided copies, so that runs and runs of runs
    occur) parse back from the folded text to exactly the same multiset of rows."""
    rows = [list(r) for r in base]
    for c in range(1, copies):                    # shifted copies: steps, chunks and channels advance
        rows += [[r[0], r[1], r[2] + c * stride, r[3] + 21 * c, r[4], r[5] + 4 * c] for r in base]
    rows = np.array(rows, np.int64)
    text = 'def ResCCLAlgo(nRanks=4, OpType="Allgather", AlgoName="t", nChunksPerRank=40):\n' + \
        "\n".join(emit._run_lines(rows)) + "\n"
    alg = parse_rccl(text, "t.rccl")
    back = np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.channels]
    assert np.array_equal(_sorted(back), _sorted(rows))
