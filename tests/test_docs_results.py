"""docs/measurements.md, the results page: its generated tables are what docs/results/generate.py
draws from the benchmarks' JSON in docs/results/ (so a table cannot drift from the run it
reports), each table's numbers read back from the page equal the JSON's at the digits shown, the
check catches a page edited by hand, and the page stays a page of current figures (at most
:data:`MAX_LINES` lines; the dated log is docs/archive/measurements-log.md)."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "measurements.md"
RESULTS = ROOT / "docs" / "results"
spec = importlib.util.spec_from_file_location("docs_results_generate", RESULTS / "generate.py")
gen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gen          # its dataclasses look their module up
spec.loader.exec_module(gen)

#: the results page's length limit: current figures, not a log
MAX_LINES = 800
#: the archive's opening, which says what it is
ARCHIVE = ROOT / "docs" / "archive" / "measurements-log.md"


def _table(text: str, name: str) -> list[list[str]]:
    """The cells of generated table ``name``'s body rows, read from the page's markdown."""
    body = text.split(f"<!-- table: {name} (docs/results/generate.py) -->\n", 1)[1]
    body = body.split(f"<!-- end table: {name} -->", 1)[0]
    rows = [line for line in body.split("\n") if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def _close(cell: str, value: float) -> bool:
    """``cell`` shows ``value`` at the digits it has (half a unit of its last place)."""
    digits = len(cell.partition(".")[2])
    return abs(float(cell.replace(",", "")) - value) <= 0.5 * 10 ** -digits + 1e-12


def _bytes(cell: str) -> int:
    """``'64 KiB'`` or ``'149,808 B'`` -> bytes."""
    n, unit = cell.split()
    return int(n.replace(",", "")) * (1024 if unit == "KiB" else 1)


def test_page_is_up_to_date_with_its_json():
    text = PAGE.read_text()
    assert gen.render(text) == text, "docs/measurements.md is out of date: run python docs/results/generate.py"
    assert gen.main(["--check"]) == 0


def test_every_table_is_on_the_page_and_every_json_is_used():
    on_page = gen.names_on(PAGE.read_text())
    assert sorted(on_page) == sorted(gen.TABLES)
    assert sorted(p.stem for p in RESULTS.glob("*.json")) == sorted(gen.TABLES)


def test_mscclpp_plan_table_reads_back_as_its_json():
    rows = json.loads((RESULTS / "mscclpp_plan.json").read_text())["rows"]
    cells = _table(PAGE.read_text(), "mscclpp_plan")
    assert len(cells) == len(rows) > 0
    for c, r in zip(cells, rows):
        assert c[:2] == [r["algorithm"], r["cluster"]]
        assert _close(c[2], r["program_GBps"]) and _close(c[3], r["plan_GBps"])
        assert _close(c[4], r["plan_GBps"] / r["program_GBps"])      # the ratio, from its two parts
        assert abs(int(c[5]) * 1024 - r["bytes"]) <= 512
        assert [int(x) for x in c[6:]] == [r["tbs"], r["ops"], r["nops"], r["max_ops"], r["port_channels"]]


def test_rs_ag_gap_table_reads_back_as_its_json():
    rows = json.loads((RESULTS / "rs_ag_gap.json").read_text())
    cells = _table(PAGE.read_text(), "rs_ag_gap")
    assert len(cells) == len(rows) > 0
    for c, r in zip(cells, rows):
        assert c[0] == r["cluster"] and int(c[1]) == r["N"] and int(c[2]) == r["chunks"]
        ag, rs = c[3].split(" / ")
        assert (_bytes(ag), _bytes(rs)) == (r["slice AG"], r["slice RS"])
        assert _close(c[4], r["model"]) and _close(c[5], r["AG"]) and _close(c[6], r["RS"])
        assert _close(c[7], r["AG"] / r["RS"])       # RS/AG of times is AG/RS of the bound's fractions


def test_the_check_catches_a_table_edited_by_hand():
    text = PAGE.read_text()
    cells = _table(text, "mscclpp_plan")
    edited = text.replace(f"| {cells[0][2]} |", "| 99.99 |", 1)
    assert edited != text and gen.render(edited) == text      # drawn again, the edit is gone


def test_a_page_with_broken_markers_is_refused_with_its_line():
    text = PAGE.read_text()
    no_end = text.replace("<!-- end table: rs_ag_gap -->", "")
    with pytest.raises(gen.PageError, match=r"docs/measurements\.md:\d+: table 'rs_ag_gap' has no line"):
        gen.render(no_end)
    unknown = "a\n<!-- table: nosuch (docs/results/generate.py) -->\n<!-- end table: nosuch -->\n"
    with pytest.raises(gen.PageError, match=r"docs/measurements\.md:2: no generated table named 'nosuch'"):
        gen.render(unknown)


def test_page_is_current_figures_and_the_archive_says_what_it_is():
    lines = PAGE.read_text().split("\n")
    assert len(lines) <= MAX_LINES, f"docs/measurements.md has {len(lines)} lines: move history to the archive"
    opening = ARCHIVE.read_text().split("\n\n", 2)[1]
    assert "word for word" in opening and "measurements.md" in opening


def test_every_section_says_its_machine_and_date():
    """Each section of figures names its machine (a GPU card or the development machine) and a
    date, or points to the page that holds them."""
    sections = re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]
    month = re.compile(r"\b(January|February|March|April|May|June|July|August|September|October|November|"
                       r"December) 20\d\d\b")
    machine = re.compile(r"NVIDIA H\d00|2-core development machine")
    bare = []
    for s in sections:
        title, _, body = s.partition("\n")
        if "](" in body and len(body.strip().split("\n")) <= 4:         # a pointer to another page
            continue
        if title.startswith(("On a lent GPU", "The kernel cost model")):
            continue
        if not (month.search(s) and machine.search(s)):
            bare.append(title)
    assert not bare, f"sections of docs/measurements.md without their machine and date: {bare}"
