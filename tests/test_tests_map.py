"""tests/README.md maps every module of the package to the test files that cover it: no module
without a row, no row for a module that is gone, and no test file named there that does not exist.
The map is parsed as its markdown table; a failure says which row to add or fix and how."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from source_modules import import_statements

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
README = TESTS / "README.md"
#: the folders whose ``.py`` files are the package's modules (driver/ is installed as ``hccc``)
SOURCE_FOLDERS = ("driver", "compiler", "runtime", "util")
#: the heading of the section whose table must hold a row per module
MODULES_HEADING = "## Modules"

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")
_TEST_FILE = re.compile(r"\btest_\w+\.py\b")


def package_modules(root: Path = ROOT) -> list[str]:
    """Every module of the package as a path from the repository root, e.g. ``driver/cli.py``."""
    out = []
    for folder in SOURCE_FOLDERS:
        for path in (root / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def import_name(module: str) -> str:
    """``compiler/synth/trees.py`` -> ``hccc.compiler.synth.trees``; ``driver/cli.py`` -> ``hccc.cli``."""
    parts = list(Path(module).with_suffix("").parts)
    if parts[0] == "driver":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["hccc", *parts])


def section(text: str, heading: str) -> list[tuple[int, str]]:
    """The (line number, line) pairs of the section under ``heading``, up to the next heading of
    the same or a higher level."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    out, inside = [], False
    for number, line in enumerate(lines, 1):
        if line.strip() == heading:
            inside = True
            continue
        if inside and line.startswith("#") and len(line) - len(line.lstrip("#")) <= level:
            break
        if inside:
            out.append((number, line))
    return out


def map_rows(text: str) -> list[tuple[int, str, list[str]]]:
    """The Modules table's rows: (line number, module path, test files named)."""
    rows = []
    for number, line in section(text, MODULES_HEADING):
        m = _ROW.match(line)
        if m:
            rows.append((number, m.group(1), _TEST_FILE.findall(m.group(2))))
    return rows


def _add_row_hint(module: str) -> str:
    return (f"tests/README.md: module {module} has no row in its '{MODULES_HEADING}' table; add\n"
            f"    | `{module}` | test_<name>.py (what it checks) |\n"
            f"  in path order, naming the test files that cover it (those that import it: "
            f"grep -l '{import_name(module)}' tests/test_*.py, or run its command)")


def map_problems(text: str, modules: list[str], test_files: set[str]) -> list[str]:
    """What is wrong with the map ``text`` for these modules and existing test file names."""
    rows = map_rows(text)
    if not rows:
        return [f"tests/README.md: no '{MODULES_HEADING}' section with a table of `module` | tests rows"]
    problems, seen = [], {}
    for number, module, tests in rows:
        where = f"tests/README.md:{number}"
        if module in seen:
            problems.append(f"{where}: module {module} has a second row (the first is line {seen[module]}); "
                            f"merge them")
        seen.setdefault(module, number)
        if module not in modules:
            problems.append(f"{where}: {module} is not a module of the package (moved or deleted?); "
                            f"remove or correct the row")
        if not tests:
            problems.append(f"{where}: the row of {module} names no test file (test_*.py)")
        for name in tests:
            if name not in test_files:
                problems.append(f"{where}: the row of {module} names {name}, which is not in tests/ "
                                f"(renamed?); correct the name")
    problems += [_add_row_hint(m) for m in modules if m not in seen]
    return problems


def test_every_module_is_mapped_to_existing_tests():
    test_files = {p.name for p in TESTS.glob("test_*.py")}
    problems = map_problems(README.read_text(), package_modules(), test_files)
    assert not problems, "\n".join(problems)


def test_other_subjects_name_existing_tests():
    """The rows below the Modules table (templates, docs, benchmarks) name test files that exist."""
    test_files = {p.name for p in TESTS.glob("test_*.py")}
    text = README.read_text()
    missing = [f"tests/README.md:{n}: {name}" for n, line in enumerate(text.splitlines(), 1)
               for name in _TEST_FILE.findall(line) if name not in test_files]
    assert not missing, "test files named in tests/README.md that do not exist:\n" + "\n".join(missing)


_SAMPLE = """# Map

## Modules

| module | tests |
|---|---|
| `driver/cli.py` | test_cli.py, test_gone.py |
| `compiler/old.py` | test_cli.py |
| `driver/cli.py` | test_cli.py |
| `runtime/x.py` | no test named |

## Other

| `driver/args.py` | test_cli.py |
"""


def test_problems_name_the_row_and_the_fix():
    """Each kind of fault in a map is found and located; a row outside the Modules section does not
    count as a module's row."""
    modules = ["driver/args.py", "driver/cli.py", "runtime/x.py", "compiler/synth/new.py"]
    problems = map_problems(_SAMPLE, modules, {"test_cli.py"})
    assert problems == [
        "tests/README.md:7: the row of driver/cli.py names test_gone.py, which is not in tests/ "
        "(renamed?); correct the name",
        "tests/README.md:8: compiler/old.py is not a module of the package (moved or deleted?); "
        "remove or correct the row",
        "tests/README.md:9: module driver/cli.py has a second row (the first is line 7); merge them",
        "tests/README.md:10: the row of runtime/x.py names no test file (test_*.py)",
        _add_row_hint("driver/args.py"),
        _add_row_hint("compiler/synth/new.py"),
    ]
    assert "grep -l 'hccc.compiler.synth.new' tests/test_*.py" in problems[-1]
    assert "| `compiler/synth/new.py` | test_<name>.py" in problems[-1]
    assert map_problems("# nothing here\n", modules, set())[0].startswith("tests/README.md: no '## Modules'")


def test_import_names():
    assert import_name("driver/cli.py") == "hccc.cli"
    assert import_name("driver/__init__.py") == "hccc"
    assert import_name("driver/torch/ledger.py") == "hccc.torch.ledger"
    assert import_name("compiler/synth/__init__.py") == "hccc.compiler.synth"
    assert import_name("util/clock.py") == "hccc.util.clock"


# ---------------------------------------------------------------- no test imports another test module


def imported_test_modules(path: Path) -> set[str]:
    """The ``test_*`` modules ``path`` imports, at any depth (``import test_x``, ``from test_x import``)."""
    found = set()
    for node in import_statements(path):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0].startswith("test_")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0].startswith("test_"):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.test_"):
            found.add(node.module)
    return found


def test_no_test_file_imports_another():
    """Shared helpers live in helper modules or conftest.py, never in a test file another imports."""
    problems = []
    for path in sorted(TESTS.glob("*.py")):          # helper modules too: none may lean on a test file
        for module in sorted(imported_test_modules(path)):
            problems.append(f"tests/{path.name} imports {module}: move what it uses into a helper module "
                            f"(a tests/*.py not named test_*) or conftest.py and import it from there")
    assert not problems, "\n".join(problems)


def test_test_imports_are_found(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("import os\nimport test_a as a\nfrom test_b import x\nfrom conftest import examples\n"
                      "def f():\n    from test_c import y\n    from tests.test_d import z\n")
    assert imported_test_modules(sample) == {"test_a", "test_b", "test_c", "tests.test_d"}
