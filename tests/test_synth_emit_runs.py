"""Large synthesised programs without a symmetry to loop over are written with their runs folded
into loops (compiler/synth/emit.py ``_run_lines``): the text parses back to exactly the program's
transfers (channels included), with far fewer lines than transfers, and, read back by the parser
line by line, its loops are the runs the specification takes (a plain greedy scan), folded and
ordered as specified."""
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



# ---------------------------------------------------------------- the oracle: the specification, read back
def _spec_runs(rows: np.ndarray) -> list[list[tuple]]:
    """The runs ``_run_lines`` must find, from its specification in plain Python: the rows in
    (src, dst, op, channel, chunk) order, taken greedily from the first: a run is a row and the
    rows after it of its pair and op while their step, chunk and channel advance by the first
    advance (a row in no run is a run of one)."""
    rows = sorted(map(tuple, rows.tolist()), key=lambda r: (r[0], r[1], r[4], r[5], r[3]))
    runs, k = [], 0
    while k < len(rows):
        run = [rows[k]]
        k += 1
        if k < len(rows) and rows[k][:2] == run[0][:2] and rows[k][4] == run[0][4]:
            adv = _advance(run[0], rows[k])
            while k < len(rows) and rows[k][:2] == run[0][:2] and rows[k][4] == run[0][4] and \
                    _advance(run[-1], rows[k]) == adv:
                run.append(rows[k])
                k += 1
        runs.append(run)
    return runs


def _advance(a: tuple, b: tuple) -> tuple:
    return b[2] - a[2], b[3] - a[3], b[5] - a[5]


def _check_folding(rows: np.ndarray) -> None:
    """The lines ``_run_lines`` writes for ``rows`` (``src, dst, step, chunk, op, channel``), read
    back by the parser (each transfer with its line and loop values): exactly ``rows``; each line
    one pair and op; its innermost loops exactly the specification's runs (:func:`_spec_runs`),
    single transfers included; the runs a line's outer loops fold alike (one count, one advance)
    and consecutive in the specification's order, their first transfers advancing evenly; and the
    lines in the order of their first transfers' (step, src, dst, chunk)."""
    lines = emit._run_lines(rows)
    nranks = int(rows[:, :2].max()) + 1
    text = (f'def ResCCLAlgo(nRanks={nranks}, OpType="Allgather", AlgoName="t", '
            f'nChunksPerRank={int(rows[:, 3].max()) + 1}):\n' + "\n".join(lines) + "\n")
    alg = parse_rccl(text, "t.rccl")
    back = np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op, alg.channels]
    assert np.array_equal(_sorted(back), _sorted(rows))
    got = [tuple(r) for r in back.tolist()]
    # the innermost runs: one line's transfers at one value of its outer loop variables
    inner: dict[tuple, list] = {}
    site_of: dict[tuple, int] = {}
    for i, r in enumerate(got):
        b = alg.loop_bindings(i)
        key = (int(alg.site[i]), tuple(sorted((k, v) for k, v in b.items() if k != emit.RUN_VARS[0])))
        inner.setdefault(key, []).append(r)
        site_of[key] = int(alg.site[i])
    spec = _spec_runs(rows)
    assert sorted(map(sorted, inner.values())) == sorted(map(sorted, spec))
    # every line: one pair and op; its runs alike, consecutive in the spec's order, evenly apart
    place: dict[tuple, list[int]] = {}
    for j, run in enumerate(spec):
        place.setdefault(tuple(sorted(run)), []).append(j)
    by_site: dict[int, list] = {}
    for key, run in inner.items():
        by_site.setdefault(site_of[key], []).append(place[tuple(sorted(run))].pop())
    for site, js in by_site.items():
        js.sort()
        assert js == list(range(js[0], js[0] + len(js))), site
        runs = [spec[j] for j in js]
        assert len({(r[0][0], r[0][1], r[0][4]) for r in runs}) == 1
        assert len({(len(r), _advance(r[0], r[1]) if len(r) > 1 else None) for r in runs}) == 1
        assert len({_advance(a[0], b[0]) for a, b in zip(runs, runs[1:])}) <= 1
    # the lines in the order of their first transfers
    firsts = []
    for i, r in enumerate(got):
        if not any(alg.loop_bindings(i).values()) and (not firsts or firsts[-1][0] != int(alg.site[i])):
            firsts.append((int(alg.site[i]), (r[2], r[0], r[1], r[3])))
    assert [f[0] for f in firsts] == sorted(by_site)
    assert [f[1] for f in firsts] == sorted(f[1] for f in firsts)


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 6), st.integers(0, 30),
                          st.integers(0, 1), st.sampled_from([0, 0, 0, 1, 7])), min_size=1, max_size=50),
       st.integers(1, 4), st.integers(1, 3), st.booleans())
def test_lines_fold_as_specified(base, copies, stride, thin):
    """Any rows (runs, runs of runs, single transfers between them, ties; ``thin``: one row per pair
    and op, as an AllToAll's): the lines fold them as specified (:func:`_check_folding`)."""
    rows = [list(r) for r in base]
    for c in range(1, copies):
        rows += [[r[0], r[1], r[2] + c * stride, r[3] + 31 * c, r[4], r[5] + 8 * c] for r in base]
    rows = np.array(rows, np.int64)
    if thin:
        rows = rows[np.unique(rows[:, [0, 1, 4]], axis=0, return_index=True)[1]]
    _check_folding(rows)


def test_a_synthesized_alltoall_is_folded_as_specified():
    """A 32-GPU AllToAll (relayed blocks make a few runs among the single transfers) and a program
    of single transfers only: folded as specified, and its whole text parses back to its transfers."""
    from hccc.compiler.cluster.topo_parser import parse_topology
    from cluster_texts import many_nodes_text

    topo = parse_topology(many_nodes_text(4), "n4.topo")
    res = synthesize(topo, "alltoall", time_limit=1.0)
    rows = emit._sorted_rows(res)
    rows6 = rows if rows.shape[1] > 5 else np.c_[rows, np.zeros(len(rows), np.int64)]
    _check_folding(rows6)
    one = rows6[np.unique(rows6[:, [0, 1]], axis=0, return_index=True)[1]]
    _check_folding(one)
    alg = parse_rccl(emit.to_rccl(res, topo), "a.rccl")
    assert np.array_equal(_sorted(np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op]), _sorted(rows))
