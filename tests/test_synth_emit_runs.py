"""Large synthesised programs without a symmetry to loop over are written with their runs folded
into loops (compiler/synth/emit.py ``_run_lines``): the text parses back to exactly the program's
transfers (channels included), with far fewer lines than transfers."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

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
