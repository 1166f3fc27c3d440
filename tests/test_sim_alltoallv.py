"""``hccc sim --counts FILE``: AllToAll programs simulated as AllToAllv, the counts file format and
its located errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_cluster, load_program
from hccc.runtime.sim_alltoallv import prepare_v, simulate_v
from hccc.runtime.simulator import prepare, simulate

ROOT = Path(__file__).resolve().parent.parent
TOPO1 = str(ROOT / "examples" / "clusters" / "a100_topo1.topo")      # 2 nodes x 4 GPUs
DIRECT8 = str(ROOT / "examples" / "direct_alltoall_8.rccl")


def sim(capsys, *args):
    rc = main(["sim", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("make", [lambda: gen.direct_alltoall(8), lambda: gen.hierarchical_alltoall(2, 4),
                                  lambda: gen.ring_alltoall(8, chunks_per_rank=2)])
def test_equal_counts_give_the_alltoall_of_the_same_size(make):
    """An oracle independent of the AllToAllv path: the simulator's own AllToAll at the same size."""
    topo = load_cluster(TOPO1)
    ir = build_program(make())
    block = 3 << 16
    v = simulate_v(prepare_v(ir, topo), topo, np.full((8, 8), block))
    e = simulate(prepare(ir, topo), topo, block * 8 * 4, slice_bytes="auto")
    assert v.time_us == pytest.approx(e.time_us) and v.busbw_GBps == pytest.approx(e.busbw_GBps)
    assert v.nbytes == e.nbytes


def test_zero_pairs_and_a_heavy_pair_change_the_time_as_the_bytes_do():
    topo = load_cluster(TOPO1)
    vp = prepare_v(build_program(gen.direct_alltoall(8)), topo)
    base = np.full((8, 8), 1 << 16)
    t0 = simulate_v(vp, topo, base).time_us
    zero = base.copy()
    zero[:, 7] = 0                           # nobody sends to rank 7: fewer bytes, not more time
    assert simulate_v(vp, topo, zero).time_us <= t0
    heavy = base.copy()
    heavy[0, 5] = 90 * base.sum()           # one pair with ~99 % of the bytes, across the nodes
    r = simulate_v(vp, topo, heavy)
    # the pair's own link sets the time: at least its bytes over the fastest inter-node rate modelled
    assert r.time_us > 10 * t0 and r.micro_batches > 1
    assert simulate_v(vp, topo, np.zeros((8, 8), np.int64)).time_us >= 0


def test_command_line_table_and_json(tmp_path, capsys):
    f = tmp_path / "counts.txt"
    c = np.arange(64).reshape(8, 8) * 1000
    f.write_text("# elements rank s sends to rank d\n" + "\n".join(", ".join(map(str, row)) for row in c) + "\n")
    rc, out, err = sim(capsys, DIRECT8, "--topology", TOPO1, "--counts", str(f))
    assert rc == 0, err
    rows = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert len(rows) == 1 and int(rows[0].split()[0]) == int(c.sum()) * 4 // 8
    rc, out, err = sim(capsys, DIRECT8, "--topology", TOPO1, "--counts", str(f), "--json")
    d = json.loads(out)
    r = d["results"][0]
    assert d["counts"] == str(f) and r["bytes"] == int(c.sum()) * 4 // 8
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)


@pytest.mark.parametrize("text, where, what", [
    ("1 2 3 4 5 6 7 8\n3 x\n", ":2:3:", "'x' is not a count"),
    ("1 2 3 4 5 6 7 8\n3\n", ":2:2:", "row 1 has 1 counts, but direct_alltoall_8 has 8 ranks"),
    ("1 -2\n3 4\n", ":1:3:", "'-2' is not a count"),
    ("# nothing\n\n", ":1:1:", "no counts"),
    ("1 2\n3 4\n", ":1:4:", "row 0 has 2 counts, but direct_alltoall_8 has 8 ranks: a 8 x 8 matrix is needed"),
    ("1 2 3 4 5 6 7 8 9\n", ":1:17:", "row 0 has more than 8 counts"),
    ("0 0 0 0 0 0 0 0\n" * 9, ":9:1:", "more than 8 rows"),
    ("0 0 0 0 0 0 0 0\n" * 7, ":8:1:", "the file ends after 7 rows"),
])
def test_bad_counts_files_are_located_errors(tmp_path, capsys, text, where, what):
    f = tmp_path / "c.txt"
    f.write_text(text)
    rc, out, err = sim(capsys, DIRECT8, "--topology", TOPO1, "--counts", str(f))
    assert rc == 1 and f"{f}{where} error: {what}" in err and "Traceback" not in err


def test_wrong_shape_and_wrong_collective_are_refused(tmp_path, capsys):
    f = tmp_path / "c.txt"
    f.write_text("1 2\n3 4\n")
    rc, out, err = sim(capsys, DIRECT8, "--topology", TOPO1, "--counts", str(f))
    assert rc == 1 and "row 0 has 2 counts, but direct_alltoall_8 has 8 ranks" in err
    f.write_text("\n".join(" ".join(["1"] * 8) for _ in range(8)))
    rc, out, err = sim(capsys, str(ROOT / "examples" / "ring_allgather_8.rccl"), "--topology", TOPO1, "--counts", str(f))
    assert rc == 1 and "per-pair counts apply to AllToAll programs only" in err
    rc, out, err = sim(capsys, DIRECT8, "--topology", TOPO1, "--counts", str(f), "--sizes", "1M")
    assert rc == 1 and "--counts gives the call's sizes" in err


# ---------------------------------------------------------------------------- counts files, streamed
def _lines(rows, seps, notes):
    """The text of a counts file with ``rows`` (lists of counts), each line's tokens joined by its
    separator, a comment or blank line before some; and, as the oracle, each row's line number and
    the column every token starts at (1-based)."""
    text, where, ln = [], [], 0
    for row, sep, note in zip(rows, seps, notes):
        if note:
            text.append(note)
            ln += 1
        cols, col = [], 1
        for k, v in enumerate(row):
            cols.append(col)
            col += len(str(v)) + (len(sep) if k + 1 < len(row) else 0)
        text.append(sep.join(str(v) for v in row) + ("  # a comment" if len(row) % 2 else ""))
        ln += 1
        where.append((ln, cols, col))
    return "\n".join(text) + "\n", where


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(lambda w: st.tuples(
    st.just(w), st.lists(st.lists(st.integers(0, 10 ** 6), min_size=w, max_size=w), min_size=1, max_size=6),
    st.integers(1, 6), st.data())))
def test_a_counts_file_stops_at_the_first_line_that_cannot_fit(tmp_path_factory, case):
    """A file of R rows of W counts read for a program of n ranks: the matrix when R == W == n;
    else a located error at the first line that cannot fit (a row of W > n counts at its count
    n + 1, W < n at its end, row n + 1 at its first count, R < n at the end), from the line and
    column oracle of how the file was written."""
    from hccc.runtime.alltoallv import read_counts_file
    from hccc.util.diagnostics import CompileError
    w, rows, n, data = case
    seps = data.draw(st.lists(st.sampled_from([" ", ", ", "\t", " ,  "]), min_size=len(rows), max_size=len(rows)))
    notes = data.draw(st.lists(st.sampled_from(["", "# rank s", "   "]), min_size=len(rows), max_size=len(rows)))
    text, where = _lines(rows, seps, notes)
    f = tmp_path_factory.mktemp("counts") / "c.txt"
    f.write_text(text)
    if w != n:
        ln, cols, end = where[0]
        want = (ln, cols[n]) if w > n else (ln, end)
    elif len(rows) > n:
        ln, cols, _ = where[n]
        want = (ln, cols[0])
    elif len(rows) < n:
        want = (where[-1][0] + 1, 1)
    else:
        assert read_counts_file(f, n, "p").tolist() == rows
        return
    with pytest.raises(CompileError) as exc:
        read_counts_file(f, n, "p")
    loc = exc.value.diagnostics[0].location
    assert (loc.line, loc.col) == want, (str(exc.value.diagnostics[0].message), text)
    assert "p has" in exc.value.diagnostics[0].message


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.sampled_from([2 ** 40, 2 ** 55, 2 ** 61, 2 ** 62])),
                max_size=3),
       st.integers(0, 300), st.sampled_from([1, 2, 4, 8]))
def test_simulated_counts_never_overflow(huge, base, es):
    """Counts up to 2**62 of any element size: the simulation runs, or refuses the call (a
    CountsError naming an entry, or the simulator's own size limits), and never overflows."""
    from hccc.runtime.alltoallv import CountsError
    from hccc.runtime.simulator import SimulationError
    c = np.full((8, 8), base, np.int64)
    for s, d, v in huge:
        c[s, d] = v
    topo = load_cluster(TOPO1)
    vp = _VP or _VP.append(prepare_v(load_program(DIRECT8), topo)) or _VP
    try:
        res = simulate_v(vp[0], topo, c, element_bytes=es)
    except CountsError as exc:
        assert "counts[" in str(exc), str(exc)
    except SimulationError:
        pass
    else:
        assert res.time_us >= 0 and res.nbytes == sum(int(v) for v in c.ravel()) * es // 8


_VP: list = []


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="0123456789 ,\t\n\r#x\u00e9\u2028", max_size=40), st.lists(st.integers(0, 60), max_size=4))
def test_a_counts_file_reads_the_same_in_any_blocks(text, cuts):
    """The streaming reader fed a file's bytes in blocks cut anywhere (inside a CRLF, a token, a
    multi-byte character) answers as when fed them whole: the same matrix or the same located
    error; and a text whose lines are N counts each reads as those lines split by hand."""
    from hccc.runtime.alltoallv import _CountsReader
    from hccc.util.diagnostics import CompileError
    data = text.encode()

    def read(points):
        r = _CountsReader("c.txt", 2, "p")
        prev = 0
        try:
            for c in sorted(min(p, len(data)) for p in points) + [len(data)]:
                r.feed(data[prev:c])
                prev = c
            return r.finish().tolist()
        except CompileError as exc:
            d = exc.diagnostics[0]
            return d.location.line, d.location.col, d.message

    whole = read([])
    assert read(cuts) == whole
    rows = [ln.split("#", 1)[0].replace(",", " ").split() for ln in text.splitlines()]
    rows = [r for r in rows if r]
    if isinstance(whole, list):
        assert whole == [[int(v) for v in r] for r in rows]
