"""The documentation's links resolve: every relative link of README.md and docs/ names a tracked
file, and every ``#section`` it names is a heading of that page (as GitHub turns headings into
anchors). The sources' citations of the results page (``docs/measurements.md#section`` in a
docstring or comment) name a section it has, and none cites the page without its section: a
section renamed or moved to the archive fails here with the file and line that cite it.

docs/archive/ is left out of the first check: its log is kept word for word, its links as they
were written from docs/."""
from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: a markdown link's target: ``[text](target)``
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
#: a citation of a docs page's section in the sources: ``docs/measurements.md#the-section``
CITATION = re.compile(r"(docs/[\w/.-]+\.md)#([\w-]+)")
#: the results page, which the sources cite by section only
RESULTS_PAGE = "docs/measurements.md"
#: folders whose text files are sources (their comments and docstrings)
SOURCE_FOLDERS = ("compiler", "runtime", "driver", "util", "templates", "benchmarks", "tests", "examples")
#: the tests of the pages themselves, whose made-up citations must not count
PAGE_TESTS = ("tests/test_docs_links.py", "tests/test_docs_results.py")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped (letters,
    digits, ``_`` and ``-`` kept), spaces as ``-``."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a markdown page's headings (a repeated one also as ``-1``, ``-2``...);
    fenced code is not headings."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6} (.+)", line)
        if fenced or not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


@functools.cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return tuple(p for p in out if (ROOT / p).is_file())


@functools.cache
def page_anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors(path.read_text()))


def broken_links(page: Path, text: str) -> list[str]:
    """``page:line: target`` for each relative link of ``text`` whose file or section is missing."""
    bad = []
    for i, line in enumerate(text.split("\n"), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}:{i}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in page_anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}:{i}: {target} (no such section)")
    return bad


def doc_pages() -> list[str]:
    files = tracked()
    if not files:
        pytest.skip("not a git checkout")
    return [p for p in files if p.endswith(".md") and (p == "README.md" or p.startswith("docs/"))
            and not p.startswith("docs/archive/")]


def source_files() -> list[str]:
    return [p for p in tracked() if p.split("/", 1)[0] in SOURCE_FOLDERS and p not in PAGE_TESTS
            and p.endswith((".py", ".j2", ".h", ".cpp", ".cu", ".lark", ".cmake"))]


def test_every_link_of_the_docs_resolves():
    bad = [b for p in doc_pages() for b in broken_links(ROOT / p, (ROOT / p).read_text())]
    assert not bad, "links to a missing file or section:\n" + "\n".join(bad)


def test_every_cited_section_exists():
    bad = []
    for p in source_files():
        for i, line in enumerate((ROOT / p).read_text(errors="replace").split("\n"), 1):
            for page, anchor in CITATION.findall(line):
                if not (ROOT / page).is_file() or anchor not in page_anchors(ROOT / page):
                    bad.append(f"{p}:{i}: {page}#{anchor}")
    assert not bad, "citations of a missing section:\n" + "\n".join(bad)


def test_the_results_page_is_cited_by_section():
    """The results page changes as figures are measured again; a citation names the section
    (``docs/measurements.md#...``), so that it fails here when the section goes."""
    bad = []
    for p in source_files():
        for i, line in enumerate((ROOT / p).read_text(errors="replace").split("\n"), 1):
            for m in re.finditer(r"(?<![\w/])(?:docs/)?measurements\.md(?!#)", line):
                bad.append(f"{p}:{i}: {line.strip()}")
    assert not bad, "citations of docs/measurements.md without a #section:\n" + "\n".join(bad)


@pytest.mark.parametrize("heading, anchor", [
    ("The torch backend's per-call overhead (CPU emulation)", "the-torch-backends-per-call-overhead-cpu-emulation"),
    ("Synthesis: the design log behind docs/synthesis.md (moved from it, November 2026)",
     "synthesis-the-design-log-behind-docssynthesismd-moved-from-it-november-2026"),
    ("AllToAll under --time-limit: every phase", "alltoall-under---time-limit-every-phase"),
    ("`hccc` in the test process instead of a subprocess", "hccc-in-the-test-process-instead-of-a-subprocess"),
    ("GPU kernels (v4): one NVIDIA H200, every rank on it", "gpu-kernels-v4-one-nvidia-h200-every-rank-on-it"),
])
def test_slug_is_githubs(heading, anchor):
    """Headings whose anchors GitHub renders as shown (the cases the pages have: an apostrophe,
    a path, a double hyphen, code marks)."""
    assert slug(heading) == anchor


def test_the_checks_catch_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## A section\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    text = ("[ok](a.md#a-section) [ok](a.md) [ok](#here) [web](https://example.com/x#y)\n"
            "[bad](a.md#no-section) [bad](c.md) [bad](a.md#not-a-heading)\n## Here\n")
    page.write_text(text)
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        bad = broken_links(page, text)
    finally:
        ROOT = root
    assert [b.split(": ", 1)[1] for b in bad] == ["a.md#no-section (no such section)", "c.md (no such file)",
                                                  "a.md#not-a-heading (no such section)"]
