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
from hccc.compiler.frontend.algorithm import OP_NAMES
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



# ---------------------------------------------------------------- the oracle: the item-by-item folding
# (``_run_lines`` and ``_first_runs`` as they were before the transfers in no run were written over
# arrays: every run and every single transfer a Python item, folded and sorted one by one)
def _item_lines(rows: np.ndarray) -> list[str]:
    """Flat transfers as ResCCLang with their runs folded into loops: transfers of one pair and op
    whose steps, chunks and channels advance by the same amounts from one to the next (the pieces
    of a tree program's stream) become ``for p in range(0, n):`` over one ``transfer`` with
    ``step0 + ds * p``, ``chunk0 + dc * p`` (and ``channel0 + dh * p``); consecutive such loops of
    one pair and op, alike in their counts and advances, whose first transfers advance evenly (the
    streams of a pair, a channel each) fold again into ``for q in range(0, m):`` around them, and
    so on, up to :data:`emit.RUN_VARS` deep. A transfer in no run stays one line. The lines are ordered
    by the step of each loop's first transfer. Parses back to exactly ``rows``."""
    ops = dict(OP_NAMES)
    ch = rows[:, 5] if rows.shape[1] > 5 else np.zeros(len(rows), np.int64)
    order = np.lexsort((rows[:, 3], ch, rows[:, 4], rows[:, 1], rows[:, 0]))
    # an item: (its first transfer [src, dst, step, chunk, op, channel], its loops innermost first,
    # each (count, step advance, chunk advance, channel advance))
    items = _item_runs(np.c_[rows[order, :5], ch[order]].astype(np.int64))

    def alike(a, b) -> bool:
        return a[0][:2] == b[0][:2] and a[0][4] == b[0][4] and a[1] == b[1]

    def advance(a, b) -> tuple:
        return b[0][2] - a[0][2], b[0][3] - a[0][3], b[0][5] - a[0][5]

    for _ in emit.RUN_VARS[1:] if len(items) < len(rows) else ():
        folded, k = [], 0
        while k < len(items):
            m = 1
            if k + 1 < len(items) and alike(items[k], items[k + 1]):
                adv = advance(items[k], items[k + 1])
                m = 2
                while k + m < len(items) and alike(items[k], items[k + m]) and \
                        advance(items[k + m - 1], items[k + m]) == adv:
                    m += 1
            folded.append((items[k][0], items[k][1] + ((m,) + adv,)) if m > 1 else items[k])
            k += m
        if len(folded) == len(items):
            break
        items = folded

    def term(start: int, loops: tuple, col: int) -> str:
        text = str(start)
        for loop, var in reversed(list(zip(loops, emit.RUN_VARS))):      # outermost first
            d = loop[col]
            if d:
                text += f" + {d} * {var}" if d > 0 else f" - {-d} * {var}"
        return text

    groups = []
    for x, loops in items:
        if not loops:       # a single transfer (all of an AllToAll's at one chunk per block): no loop terms
            groups.append((x[2], x[0], x[1], x[3], 0, [f"    transfer({x[0]}, {x[1]}, {x[2]}, {x[3]}, {ops[x[4]]}"
                                                     f"{', ' + str(x[5]) if x[5] else ''})"]))
            continue
        depth = len(loops)
        text = [f"    {'    ' * lev}for {emit.RUN_VARS[depth - 1 - lev]} in range(0, {loops[depth - 1 - lev][0]}):"
                for lev in range(depth)]
        chan = term(x[5], loops, 3)
        text.append(f"    {'    ' * depth}transfer({x[0]}, {x[1]}, {term(x[2], loops, 1)}, {term(x[3], loops, 2)}, "
                    f"{ops[x[4]]}{'' if chan == '0' else ', ' + chan})")
        groups.append((x[2], x[0], x[1], x[3], depth, text))
    groups.sort(key=lambda t: t[:4])
    nloops = sum(1 for t in groups if t[4])
    out = [f"    # {len(rows)} transfers: runs of one pair whose steps, chunks and channels advance evenly "
           f"as loops, and runs of such runs ({nloops} loops, {len(groups) - nloops} single transfers)"]
    for t in groups:
        out.extend(t[5])
    return out


def _item_runs(base: np.ndarray) -> list:
    """The first folding of :func:`_run_lines` over arrays: ``base`` (``src, dst, step, chunk, op,
    channel`` rows, in pair, op, channel and chunk order) as its items, each a row and its loop
    or none, taken greedily from the first row: a run is a row and the following ones of its pair
    and op while their steps, chunks and channels advance by the first advance. (The rows of a
    tree program are mostly in runs: only their first rows become Python lists.)"""
    n = len(base)
    if n < 2:
        return [(x, ()) for x in base.tolist()]
    same = (base[1:, 0] == base[:-1, 0]) & (base[1:, 1] == base[:-1, 1]) & (base[1:, 4] == base[:-1, 4])
    adv = base[1:][:, [2, 3, 5]] - base[:-1][:, [2, 3, 5]]
    # a run from row k has 2 + (how many advances after advance k repeat it) rows
    even = same[:-1] & same[1:] & (adv[:-1] == adv[1:]).all(axis=1)
    at = np.arange(len(even))
    repeat = np.r_[np.minimum.accumulate(np.where(even, len(even), at)[::-1])[::-1] - at, 0]
    length = np.r_[np.where(same, 2 + repeat, 1), 1].tolist()
    starts, k = [], 0
    while k < n:
        starts.append(k)
        k += length[k]
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(length, np.int64)[starts]
    folds = np.flatnonzero(counts > 1)
    loops = [()] * len(starts)
    for j, loop in zip(folds.tolist(), np.c_[counts[folds], adv[starts[folds]]].tolist()):
        loops[j] = (tuple(loop),)
    return list(zip(base[starts].tolist(), loops))


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 6), st.integers(0, 30),
                          st.integers(0, 1), st.sampled_from([0, 0, 0, 1, 7])), min_size=1, max_size=50),
       st.integers(1, 4), st.integers(1, 3), st.booleans())
def test_lines_are_the_item_foldings(base, copies, stride, thin):
    """Any rows (runs, runs of runs, single transfers between them, ties; ``thin``: one row per pair
    and op, as an AllToAll's): the very lines the item-by-item folding writes."""
    rows = [list(r) for r in base]
    for c in range(1, copies):
        rows += [[r[0], r[1], r[2] + c * stride, r[3] + 31 * c, r[4], r[5] + 8 * c] for r in base]
    rows = np.array(rows, np.int64)
    if thin:
        rows = rows[np.unique(rows[:, [0, 1, 4]], axis=0, return_index=True)[1]]
    assert emit._run_lines(rows) == _item_lines(rows)


def test_a_synthesized_alltoall_is_written_as_the_item_folding_writes_it():
    """A 32-GPU AllToAll (relayed blocks make a few runs among the single transfers) and a program
    of single transfers only: the item folding's text, parsed back to the same transfers."""
    from hccc.compiler.cluster.topo_parser import parse_topology
    from cluster_texts import many_nodes_text

    topo = parse_topology(many_nodes_text(4), "n4.topo")
    res = synthesize(topo, "alltoall", time_limit=1.0)
    rows = emit._sorted_rows(res)
    assert emit._run_lines(rows) == _item_lines(rows)
    one = rows[np.unique(rows[:, [0, 1]], axis=0, return_index=True)[1]]
    assert emit._run_lines(one) == _item_lines(one)
    alg = parse_rccl(emit.to_rccl(res, topo), "a.rccl")
    assert np.array_equal(_sorted(np.c_[alg.src, alg.dst, alg.step, alg.chunk, alg.op]), _sorted(rows))
