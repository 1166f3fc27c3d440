"""The distribution ships every module and data file: CI and users install hccc without ``-e``, so a
package missing from pyproject's list, or a data file no ``package-data`` pattern matches, works in a
checkout and fails after ``pip install .``."""
from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from source_modules import import_statements

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folders() -> dict[str, Path]:
    """Import name -> folder of every package under the mapped source folders."""
    out = {}
    for name, folder in CONFIG["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base).parts
            out[".".join([name, *rel])] = init.parent
    return out


def test_every_package_is_listed():
    missing = sorted(set(_folders()) - set(CONFIG["packages"]))
    assert not missing, f"packages missing from pyproject's [tool.setuptools] packages: {missing}"


def test_listed_packages_exist():
    assert not sorted(set(CONFIG["packages"]) - set(_folders()))


def test_every_data_file_is_shipped():
    """Every non-Python file inside a package folder matches a package-data pattern of the package
    that holds it (or of a parent package, through a relative pattern)."""
    folders = _folders()
    data = CONFIG.get("package-data", {})
    unshipped = []
    for name, folder in folders.items():
        for path in folder.iterdir():
            if not path.is_file() or path.suffix in (".py", ".pyc"):
                continue
            shipped = False
            for pkg, patterns in data.items():
                base = folders.get(pkg)
                if base is None:
                    continue
                try:
                    rel = path.relative_to(base).as_posix()
                except ValueError:
                    continue
                if any(fnmatch.fnmatch(rel, p) for p in patterns):
                    shipped = True
            if not shipped:
                unshipped.append(path.relative_to(ROOT).as_posix())
    # folders without an __init__.py that hold data (templates/common, driver/cmake) are checked
    # through their parent package's patterns
    for name, folder in folders.items():
        for sub in folder.iterdir():
            if sub.is_dir() and sub.name != "__pycache__" and not (sub / "__init__.py").exists():
                for path in sub.rglob("*"):
                    if path.is_file() and "__pycache__" not in path.parts:
                        rel = path.relative_to(folder).as_posix()
                        if not any(fnmatch.fnmatch(rel, p) for p in data.get(name, [])):
                            unshipped.append(path.relative_to(ROOT).as_posix())
    assert not unshipped, f"files no package-data pattern ships: {sorted(unshipped)}"


#: import name -> distribution name, where they differ
_DIST = {"z3": "z3-solver", "cupy": "cupy-cuda13x", "yaml": "pyyaml", "pynvml": "nvidia-ml-py"}


def _requirement_names(reqs) -> set[str]:
    import re
    return {re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower() for r in reqs}


def test_every_third_party_import_is_installable_by_a_user():
    """A module the shipped code imports (at the top of a file or inside a function) that is not
    part of Python is a dependency, or in an extra other than ``test``: one only the test extra
    brought in works in CI and fails for a user who installed ``hccc[synth]``."""
    import ast
    import sys

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    offered = _requirement_names(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        if extra != "test":
            offered |= _requirement_names(reqs)
    own = {name.split(".")[0] for name in CONFIG["package-dir"]} | {"hccc"}
    missing = set()
    for folder in _folders().values():
        for path in folder.glob("*.py"):
            for node in import_statements(path):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in own or top.startswith("_"):
                        continue
                    if _DIST.get(top, top).lower() not in offered:
                        missing.add(f"{path.relative_to(ROOT)}: {top}")
    assert not missing, "imports no dependency or user-facing extra provides:\n" + "\n".join(sorted(missing))
