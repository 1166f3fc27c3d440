"""``hccc synth --band``: without ``--size``, every candidate scored at each size of a band, the one
whose worst ratio to the fastest at each size is least written (``compiler/synth/selection.py``
``band_ranked``, ``driver/synth_select.py`` ``_band``).

The rule is checked by its properties (the kept candidate's worst ratio is no worse than any
other's; ratios are 1 at the fastest and invariant under a size's unit of time; a candidate
fastest everywhere is kept), and the command's choice against the candidates' programs each
built and simulated here at every size of the band, not through the selection's numbers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import DEFAULT_BLOCK_GBPS
from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import to_algorithm
from hccc.compiler.synth.selection import SCORE_BAND, band_ranked
from hccc.runtime.simulator import prepare, simulate
from hccc.synth_api import synthesize_program
from hccc.util.diagnostics import CompileError

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"

_times = st.one_of(st.none(), st.floats(1e-6, 1.0))


@st.composite
def _tables(draw):
    n = draw(st.integers(1, 6))
    k = draw(st.integers(1, 5))
    rows = [[draw(_times) for _ in range(k)] for _ in range(n)]
    transfers = [draw(st.integers(1, 4)) for _ in range(n)]
    return [f"c{i}" for i in range(n)], transfers, rows


def _worst(rows, i) -> float:
    """The i-th candidate's worst ratio over the sizes, computed here from the table."""
    out = 0.0
    for j in range(len(rows[0])):
        timed = [r[j] for r in rows if r[j] is not None]
        if rows[i][j] is None:
            return math.inf
        out = max(out, rows[i][j] / min(timed))
    return out


@settings(max_examples=200, deadline=None)
@given(table=_tables(), scale=st.floats(1e-3, 1e3), col=st.integers(0, 4))
def test_the_band_rule_keeps_the_least_worst_ratio(table, scale, col):
    names, transfers, rows = table
    ranked = band_ranked(names, transfers, rows)
    assert sorted(b.name for b in ranked) == sorted(names)
    by = {b.name: b for b in ranked}
    for i, name in enumerate(names):
        b = by[name]
        assert b.seconds == tuple(rows[i])
        assert b.worst == pytest.approx(_worst(rows, i), rel=1e-12) or b.worst == _worst(rows, i) == math.inf
        assert all(r is None or r >= 1 - 1e-12 for r in b.ratios)
    for j in range(len(rows[0])):      # the fastest at each size timed there has ratio 1
        if any(r[j] is not None for r in rows):
            assert min(b.ratios[j] for b in ranked if b.ratios[j] is not None) == pytest.approx(1.0)
    # the kept one: no other has a lower worst ratio; among equal ones, no fewer transfers
    first = ranked[0]
    for b in ranked[1:]:
        assert first.worst <= b.worst
        if first.worst == b.worst:
            assert first.transfers <= b.transfers
            if first.transfers == b.transfers:
                assert names.index(first.name) < names.index(b.name)
    # a size's unit of time changes no ratio, so no choice
    if col < len(rows[0]):
        scaled = [[t * scale if j == col and t is not None else t for j, t in enumerate(r)] for r in rows]
        again = band_ranked(names, transfers, scaled)
        assert [b.worst for b in again] == pytest.approx([b.worst for b in ranked], rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(table=_tables())
def test_a_candidate_fastest_at_every_size_is_kept(table):
    names, transfers, rows = table
    rows = [[1.0 if t is None else t for t in r] for r in rows]
    rows.append([min(r[j] for r in rows) / 2 for j in range(len(rows[0]))])
    names, transfers = names + ["fastest"], transfers + [99]
    ranked = band_ranked(names, transfers, rows)
    assert ranked[0].name == "fastest" and ranked[0].worst == 1.0


def test_a_table_with_a_missing_size_is_refused():
    with pytest.raises(ValueError, match="one time"):
        band_ranked(["a", "b"], [1, 1], [[1.0, 2.0], [1.0]])


def _sim(result, topo, nbytes: int) -> float:
    alg = to_algorithm(result, topo)
    ir = build_program(alg)
    ir.nchannels = alg.header.nchannels
    return float(simulate(prepare(ir, topo, DEFAULT_BLOCK_GBPS), topo, nbytes, slice_bytes="auto").time_s)


def test_the_band_writes_the_candidate_of_least_worst_ratio_timed_here():
    """heteccl_fig10 AllReduce across the default band: each candidate the selection scored is
    simulated here at every size (its program as written, at its channels); the written one has
    the least worst ratio to the fastest at each size (within a part in 10^9), the report's times
    and per-size rows are those, and the same request writes the same bytes."""
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    prog = synthesize_program(topo, "allreduce", band=SCORE_BAND, time_limit=60.0)
    band = prog.summary["selection"]["band"]
    assert band["sizes"] == list(SCORE_BAND) and not band["not_timed"]
    times = {name: [_sim(res, topo, s) for s in SCORE_BAND] for name, res in prog.candidates}
    assert len(times) == len(prog.candidates) >= 4          # trees, the search, ring, all pairs
    best = [min(t[j] for t in times.values()) for j in range(len(SCORE_BAND))]
    worst = {name: max(t[j] / best[j] for j in range(len(SCORE_BAND))) for name, t in times.items()}
    kept = prog.summary["selection"]["kept"]
    assert kept == prog.summary["method"] and worst[kept] <= min(worst.values()) * (1 + 1e-9)
    assert band["worst_ratio"] == pytest.approx(worst[kept], rel=1e-9)
    for c in band["candidates"]:
        assert c["seconds"] == pytest.approx(times[c["candidate"]], rel=1e-9)
    for j, r in enumerate(band["per_size"]):
        assert r["kept_ratio"] == pytest.approx(times[kept][j] / best[j], rel=1e-9)
        assert times[r["best"]][j] == best[j]
        run = r["runner_up"]
        others = {n: t[j] for n, t in times.items() if n != kept}
        assert run["candidate"] == min(others, key=others.get)
        assert run["ratio"] == pytest.approx(min(others.values()) / times[kept][j], rel=1e-9)
        assert f"at {('4K', '64K', '1M', '64M', '1G')[j]}: fastest {r['best']}" in prog.text
    run = prog.summary["selection"]["runner_up"]
    assert run["ratio"] == pytest.approx(min(w for n, w in worst.items() if n != kept), rel=1e-9)
    assert "scored across the band (4K, 64K, 1M, 64M, 1G): kept the " in prog.text
    # one program cannot be the fastest at both ends: the report says by how much it is not
    assert max(r["kept_ratio"] for r in band["per_size"]) > 1.0
    again = synthesize_program(topo, "allreduce", band=SCORE_BAND, time_limit=60.0)
    assert again.text == prog.text


def test_the_command_says_the_band_and_refuses_it_with_a_size(tmp_path, capsys):
    """``hccc synth --band``: the band's rule and rows in ``--json``, the runner-up by the band's
    rule on stdout; with ``--size`` or another method: a one-line refusal, exit 1, nothing
    written. The API takes any band (``band=``), checked as the command checks sizes."""
    topo = CLUSTERS / "heteccl_fig10.topo"
    out = tmp_path / "ag.rccl"
    assert main(["synth", str(topo), "--collective", "allgather", "--band", "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    band = s["selection"]["band"]
    assert band["sizes"] == list(SCORE_BAND) and s["selection"]["rule"].startswith("across the band")
    assert [r["bytes"] for r in band["per_size"]] == list(SCORE_BAND)
    assert main(["synth", str(topo), "--collective", "allgather", "--band", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "across the band at most " in said and ", runner-up " in said
    for extra, says in ((["--size", "64K"], "--band applies without --size"),
                        (["--method", "trees"], "--band compares every candidate: it applies to --method auto")):
        bad = tmp_path / "bad.rccl"
        assert main(["synth", str(topo), "--collective", "allgather", "--band", "-o", str(bad)] + extra) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
        assert not bad.exists()
    two = synthesize_program(topo, "allgather", band=[64 << 10, 1 << 20], time_limit=60.0)
    assert two.summary["selection"]["band"]["sizes"] == [64 << 10, 1 << 20]
    assert "scored across the band (64K, 1M)" in two.text
    for band_, says in (([4 << 10, 4096], "--band: 4K is given twice"), ([0], "--band: expected whole numbers")):
        with pytest.raises(CompileError, match=says):
            synthesize_program(topo, "allgather", band=band_)


def test_a_band_nothing_compares_is_said_not_scored():
    """``--no-sim-select`` compares no candidate: the program says the band was not scored."""
    prog = synthesize_program(CLUSTERS / "heteccl_fig10.topo", "allgather", band=SCORE_BAND, sim_select=False,
                              time_limit=30.0)
    assert "band" not in prog.summary["selection"]
    assert "# not scored across the band: --no-sim-select: the candidates are not compared" in prog.text
