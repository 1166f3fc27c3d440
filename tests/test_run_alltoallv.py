"""``hccc run --counts FILE``: AllToAll programs run as AllToAllv in the CPU emulation, the file's
matrix as given (no sizes) or scaled at each size of a sweep, the alltoallv size and busbw
convention of ``hccc sim --counts``, #wrong from the numpy oracle, and located errors."""
from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hccc.cli import main
from hccc.commands.run import scaled_counts
from hccc.compiler.frontend import generators as gen

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

ASYM = np.array([[0, 5, 100, 3], [7, 0, 0, 1], [2, 2, 2, 2], [40, 0, 1, 9]])
SYM = np.array([[3, 5, 0, 8], [5, 1, 6, 0], [0, 6, 2, 4], [8, 0, 4, 7]])


@pytest.fixture(autouse=True)
def quick_builds(monkeypatch):
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")


@pytest.fixture
def direct4(tmp_path):
    p = tmp_path / "direct4.rccl"
    p.write_text(gen.direct_alltoall_rccl(4, name="direct4"))
    return p


def counts_file(tmp_path, c, name="c.txt"):
    f = tmp_path / name
    f.write_text("# rank s sends counts[s][d] elements to rank d\n" + "\n".join(", ".join(map(str, r)) for r in c) + "\n")
    return f


def run_cli(capsys, *argv):
    rc = main(["run", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def rows(out):
    return [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")
            and not ln.startswith("hccc run:")]


def test_the_files_matrix_as_given_one_row_with_the_alltoallv_convention(tmp_path, capsys, direct4):
    f = counts_file(tmp_path, ASYM)
    rc, out, err = run_cli(capsys, direct4, "--counts", f, "-n", "1", "-w", "0", "-d", "int32")
    assert rc == 0, out + err
    (row,) = rows(out)
    per_rank = int(ASYM.sum()) * 4 // 4                  # the mean per-rank send buffer
    assert row[:3] == [str(per_rank), str(per_rank // 4), "int32"] and row[-1] == "0"
    # asymmetric counts: an in-place call cannot take them, so only out of place runs, saying why
    assert "in-place: not run" in out and "counts[0][1] = 5 but counts[1][0] = 7" in out
    rc, out, err = run_cli(capsys, direct4, "--counts", f, "-n", "1", "-w", "0", "--json")
    d = json.loads(out)
    (r,) = d["results"]
    assert rc == 0 and d["ok"] and d["counts"] == str(f) and not d["counts_scaled"]
    assert r["bytes"] == per_rank and r["wrong"] == 0 and r["oracle"] == "alltoallv"
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 3 / 4)
    assert r["algbw_GBps"] == pytest.approx(per_rank / (r["time_us"] * 1e3))


def test_symmetric_counts_run_in_place_and_out_of_place(tmp_path, capsys, direct4):
    rc, out, err = run_cli(capsys, direct4, "--counts", counts_file(tmp_path, SYM), "-n", "1", "-w", "0",
                           "-d", "float16")
    assert rc == 0, out + err
    (row,) = rows(out)
    assert len(row) == 13 and row[8] == "0" and row[12] == "0"     # both placements, nothing wrong


def _scaled_oracle(c, nbytes, es):
    want = nbytes // es * len(c)
    return [[int(Fraction(int(x) * want, int(c.sum()))) for x in r] for r in c]


def test_a_sweep_scales_the_matrix_at_every_size(tmp_path, capsys, direct4):
    sizes = [256, 4096, 65536]
    rc, out, err = run_cli(capsys, direct4, "--counts", counts_file(tmp_path, ASYM), "--sizes",
                           ",".join(map(str, sizes)), "-n", "1", "-w", "0", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["counts_scaled"] and len(d["results"]) == 3
    for res, nbytes in zip(d["results"], sizes):
        want = np.array(_scaled_oracle(ASYM, nbytes, 4))
        assert res["bytes"] == int(want.sum()) * 4 // 4 <= nbytes and res["wrong"] == 0


@given(st.lists(st.integers(0, 1 << 40), min_size=9, max_size=9), st.integers(1, 1 << 30))
def test_scaling_is_exact_floor_of_the_proportional_share(vals, nbytes):
    c = np.array(vals, np.int64).reshape(3, 3)
    got = scaled_counts(c, nbytes, 2)
    if c.sum() == 0:
        assert not got.any()
        return
    assert got.tolist() == _scaled_oracle(c, nbytes, 2)
    want = nbytes // 2 * 3
    assert want - 9 < got.sum() <= want


@pytest.mark.parametrize("text, where, what", [
    ("1 2 3 4\n5 6 x 8\n", ":2:5:", "'x' is not a count"),
    ("1 2 3 4\n1 2 3\n1 2 3 4\n1 2 3 4\n", ":2:6:", "row 1 has 3 counts"),
    ("# nothing\n", ":1:1:", "no counts"),
])
def test_a_bad_counts_file_is_a_located_error(tmp_path, capsys, direct4, text, where, what):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    rc, out, err = run_cli(capsys, direct4, "--counts", f)
    assert rc == 1 and f"{f}{where} error: {what}" in err and "Traceback" not in err


def test_wrong_program_shape_and_placement_are_refused_before_anything_runs(tmp_path, capsys, direct4):
    ag = tmp_path / "ag4.rccl"
    ag.write_text(gen.ring_allgather_rccl(4, name="ag4"))
    f = counts_file(tmp_path, ASYM)
    rc, out, err = run_cli(capsys, ag, "--counts", f)
    assert rc == 1 and f"{f}: ag4 implements" in err and "AllToAll programs only" in err
    rc, out, err = run_cli(capsys, direct4, "--counts", counts_file(tmp_path, [[1, 2], [3, 4]], "two.txt"))
    assert rc == 1 and "row 0 has 2 counts, but direct4 has 4 ranks: a 4 x 4 matrix is needed" in err
    rc, out, err = run_cli(capsys, direct4, "--counts", f, "--inplace-only")
    assert rc == 1 and "an in-place AllToAllv needs symmetric counts" in err and "Traceback" not in err
    rc, out, err = run_cli(capsys, direct4, "--counts", counts_file(tmp_path, np.zeros((4, 4), int), "z.txt"),
                           "--sizes", "1K")
    assert rc == 1 and "every count is 0" in err and "Traceback" not in err


def test_counts_past_the_memory_limit_are_refused_before_any_buffer_exists(tmp_path, capsys, direct4):
    """A 2^40-element block: refused by the run's memory limit with the numbers, before the inputs
    or the oracle's buffers are made (not a MemoryError half-way)."""
    c = np.zeros((4, 4), np.int64)
    c[0, 1] = 1 << 40
    rc, out, err = run_cli(capsys, direct4, "--counts", counts_file(tmp_path, c), "-n", "1", "-w", "0")
    assert rc == 1 and "over the limit of" in err and "HCCC_MAX_RUN_BYTES" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "sim"])
def test_an_algorithm_given_as_the_counts_file_names_what_is_wanted(capsys, direct4, command):
    """--counts holding an algorithm (hccc run and hccc sim declare the counts matrix as an input
    kind): an error that names both kinds, not an internal error."""
    argv = [command, str(direct4), "--counts", str(direct4)]
    if command == "sim":
        argv[2:2] = ["--topology", str(Path(__file__).resolve().parent.parent / "examples" / "clusters" / "a100_topo1.topo")]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and f"{direct4} is an algorithm" in err and "reads a counts matrix" in err, err
    assert "internal error" not in err
