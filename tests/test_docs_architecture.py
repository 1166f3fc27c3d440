"""docs/architecture.md, the map of the tree, checked against the tree so that it cannot go stale
silently: every source file it names exists, every dotted name it writes in backticks resolves to a
module, a module's attribute or a class's member, and every code name it writes in backticks
occurs in the source. A file renamed, split or removed without the page following fails here."""
from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

import pytest

from source_modules import MODULES

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"

#: the suffixes of the source files the page names (the emitted ``hccc_host.h`` is not in the tree)
SOURCE_SUFFIXES = ("py", "lark", "j2", "cpp", "cmake")
#: a path or a file name with one of those suffixes, not part of a longer word or path
FILE_NAME = re.compile(r"(?<![\w./<-])((?:[\w-]+/)*[\w-]+\.(?:%s))(?![\w/])" % "|".join(SOURCE_SUFFIXES))
#: a dotted name (``hccc.runtime``, ``abi.ll_zero_c``, ``RankMemory.args``)
DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/.-])")
#: a span that is one identifier, or one called: ``Runner``, ``compile_passes()``, ``reader_for(path)``
IDENTIFIER = re.compile(r"([A-Za-z_]\w*)(?:\(.*\))?")
#: folders whose text the page's code names may come from
CODE_FOLDERS = ("compiler", "runtime", "driver", "util", "templates", "tests", "benchmarks", "examples")


def code_spans(text: str) -> list[str]:
    """The page's inline code spans (the pictures' file names are read by :func:`file_names`)."""
    return re.findall(r"`([^`\n]+)`", text)


def file_names(text: str) -> set[str]:
    """Every source file name or path the page writes, in code spans or in the pictures."""
    return set(FILE_NAME.findall(text))


def dotted_names(text: str) -> set[str]:
    """Every dotted name in the page's code spans that is not a file name."""
    names = set()
    for span in code_spans(text):
        for name in DOTTED.findall(span):
            if name.rpartition(".")[2] not in SOURCE_SUFFIXES + ("h", "md", "json", "xml", "topo", "rccl"):
                names.add(name)
    return names


def identifiers(text: str) -> set[str]:
    """Every code span of the page that is one identifier (or one call)."""
    out = set()
    for span in code_spans(text):
        m = IDENTIFIER.fullmatch(span.strip())
        if m:
            out.add(m.group(1))
    return out


@functools.cache
def tracked_files() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(out.split())


def file_exists(name: str, files=None) -> bool:
    """``name`` is a tracked file's path from the repository root or the tail of one
    (``passes/verify.py``, ``cuda.py``)."""
    files = tracked_files() if files is None else files
    return any(f == name or f.endswith("/" + name) for f in files)


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text())


def _defined(body) -> set[str]:
    """Names a module or class body defines: functions, classes, assignments, imports, and the
    string keys of a dict literal it assigns (``hccc``'s lazily loaded API)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            if isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant)
                             and isinstance(k.value, str))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            names |= _defined(getattr(node, "body", [])) | _defined(getattr(node, "orelse", []))
    return names


def module_defines(module: str, name: str) -> bool:
    return name in _defined(_tree(module).body) or f"{module}.{name}" in MODULES


@functools.cache
def class_members(cls: str) -> set[str] | None:
    """The members defined in the body of every class named ``cls`` in the tree (None: no class
    of that name)."""
    members = None
    for module, path in MODULES.items():
        if f"class {cls}" not in path.read_text():      # parse only the modules that may hold it
            continue
        for node in _tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                members = (members or set()) | _defined(node.body)
    return members


def resolves(name: str) -> bool:
    """A dotted name of the page is real: ``hccc.X.Y`` a module and what it defines; ``stem.attr``
    an attribute of a module of that file name (``abi.ll_zero_c``); ``Class.member`` a member of a
    class of the tree (``RankMemory.args``)."""
    parts = name.split(".")
    if parts[0] == "hccc":
        i = len(parts)
        while i > 0 and ".".join(parts[:i]) not in MODULES:
            i -= 1
        if i == 0:
            return False
        return i == len(parts) or module_defines(".".join(parts[:i]), parts[i])
    head, attr = parts[0], parts[1]
    stems = [m for m in MODULES if m.rpartition(".")[2] == head]
    if stems:
        return any(module_defines(m, attr) for m in stems)
    members = class_members(head)
    return members is not None and attr in members


@functools.cache
def code_words() -> frozenset[str]:
    """Every word of the tracked source under :data:`CODE_FOLDERS` (this file excepted: its
    made-up names must not count)."""
    words: set[str] = set()
    for name in tracked_files():
        path = ROOT / name
        if (name.split("/", 1)[0] in CODE_FOLDERS and path.suffix in (".py", ".j2", ".lark", ".cpp", ".cmake")
                and path != Path(__file__).resolve()):
            words.update(re.findall(r"\w+", path.read_text(errors="replace")))
    return frozenset(words)


def occurs(word: str) -> bool:
    return word in code_words()


PAGE_TEXT = PAGE.read_text()


def test_every_file_the_page_names_exists():
    missing = sorted(n for n in file_names(PAGE_TEXT) if not file_exists(n))
    assert not missing, f"docs/architecture.md names files the tree does not have: {missing}"


def test_every_dotted_name_resolves():
    bad = sorted(n for n in dotted_names(PAGE_TEXT) if not resolves(n))
    assert not bad, f"docs/architecture.md names what the code does not define: {bad}"


def test_every_code_name_occurs_in_the_source():
    bad = sorted(n for n in identifiers(PAGE_TEXT) if not occurs(n))
    assert not bad, f"docs/architecture.md names identifiers found nowhere in the source: {bad}"


def test_every_module_is_on_the_map():
    """Every module of the tree is named on the page, by its file (``runtime/local_job.py``,
    ``cuda.py``) or its import name (``hccc.testing``); the subcommands are named by their pattern,
    ``driver/commands/<name>.py``. A new module gets its line on the map."""
    named = {n.rpartition("/")[2] for n in file_names(PAGE_TEXT)}
    missing = sorted(str(p.relative_to(ROOT)) for m, p in MODULES.items()
                     if p.suffix == ".py" and p.name != "__init__.py" and p.name not in named
                     and f"`{m}`" not in PAGE_TEXT and not m.startswith("hccc.commands."))
    assert not missing, f"modules docs/architecture.md does not name (add one line for each): {missing}"


def test_every_package_folder_is_on_the_map():
    """Each source package (``compiler/synth``, ``driver/torch``, ...) is named on the page."""
    folders = {str(p.parent.relative_to(ROOT)) for m, p in MODULES.items() if p.name == "__init__.py"}
    missing = sorted(f for f in folders if f not in PAGE_TEXT and f.split("/", 1)[-1] not in PAGE_TEXT)
    assert not missing, missing


@pytest.mark.parametrize("line, why", [
    ("`runtime/launcher.py`", None),
    ("`runtime/lancher.py`", "file"),                  # a misspelt module
    ("`compiler/passes/slicer.py` and `cuda.py`", "file"),
    ("`hccc.runtime.rank_memory`", None),
    ("`hccc.runtime.rank_memories`", "dotted"),        # a module that is not there
    ("`hccc.compile`", None),                          # the lazily loaded API
    ("`hccc.compile_everything`", "dotted"),
    ("`abi.ll_zero_c`", None),
    ("`abi.ll_zero_cpp`", "dotted"),                   # an attribute its module lacks
    ("`RankMemory.args`", None),
    ("`RankMemory.argz`", "dotted"),                   # a member its class lacks
    ("`Nowhere.thing`", "dotted"),
    ("`compile_passes()`", None),
    ("`compile_every_pass()`", "name"),                # a function found nowhere
])
def test_the_checks_catch_made_up_names(line, why):
    """Each check on a made-up line: the real names pass, the invented ones fail."""
    bad_file = any(not file_exists(n) for n in file_names(line))
    bad_dotted = any(not resolves(n) for n in dotted_names(line))
    bad_name = any(not occurs(n) for n in identifiers(line))
    assert (bad_file, bad_dotted, bad_name) == (why == "file", why == "dotted", why == "name")


def test_no_text_cites_a_design_document_outside_the_repository():
    """Docstrings, comments and pages point at documents a reader of the repository can open: the
    sources, docs/ and README.md. A citation of a design document kept elsewhere (``DESIGN.md``,
    which is not in the tree) sends a newcomer nowhere."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    citing = [p for p in tracked if p.endswith((".py", ".md", ".j2", ".h", ".cpp", ".lark", ".toml"))
              and not (ROOT / p).is_symlink() and "DESIGN.md" in (ROOT / p).read_text(errors="replace")
              and p != "tests/test_docs_architecture.py"]
    assert not (ROOT / "DESIGN.md").exists() and citing == []
