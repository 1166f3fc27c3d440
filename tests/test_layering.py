"""The package layering of docs/architecture.md, checked on the source: every ``import`` statement,
at module level or inside a function, goes down the layers, and no modules import each other in a
circle. A new module lands in a layer by the folder it is put in."""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from source_modules import MODULES, import_statements

ROOT = Path(__file__).resolve().parent.parent

#: layer of every hccc package; an import may only reach the same or a lower layer (same-layer
#: imports are allowed only inside one package)
LAYERS = {
    "hccc.util": -1,
    "hccc.compiler.frontend": 0,
    "hccc.compiler.cluster": 1,
    "hccc.compiler.ir": 2,
    "hccc.compiler.passes": 3,
    "hccc.compiler.backend": 4,
    "hccc.compiler.interop": 4,
    "hccc.compiler.synth": 4,
    "hccc.compiler.pipeline": 5,
    "hccc.templates": 5,
    "hccc.compiler": 5,
    "hccc.runtime": 6,
    "hccc": 7,
}


def _package(mod: str) -> str:
    """The layered package a module belongs to (longest prefix in LAYERS)."""
    best = ""
    for pkg in LAYERS:
        if (mod == pkg or mod.startswith(pkg + ".")) and len(pkg) > len(best):
            best = pkg
    return best


def _imports(mod: str, path: Path) -> list[tuple[str, int]]:
    """hccc modules imported by ``mod`` (anywhere in the file), with line numbers."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in import_statements(path):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # "from pkg import submodule" imports the submodule
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t.startswith("hccc") and t != mod:
                out.append((t, node.lineno))
    return out


@functools.cache
def _graph() -> nx.DiGraph:
    """The import graph of the package, parsed once per test process (the tests only read it)."""
    g = nx.DiGraph()
    for mod, path in MODULES.items():
        g.add_node(mod)
        for target, line in _imports(mod, path):
            g.add_edge(mod, target, line=line)
    return g


def test_imports_go_down_the_layers():
    bad = []
    for a, b, data in _graph().edges(data=True):
        if b == "hccc":   # the root package: its version only (it imports nothing eagerly, below)
            continue
        pa, pb = _package(a), _package(b)
        if pa != pb and LAYERS[pb] >= LAYERS[pa]:
            bad.append(f"{MODULES[a].relative_to(ROOT)}:{data['line']}: {a} ({pa}) imports {b} ({pb})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycles():
    """No module of the package (compiler, runtime, driver and its commands) imports one that imports
    it back, directly or not, counting imports inside functions."""
    g = _graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"modules that import each other in a circle: {cycles}"


def test_commands_never_import_the_dispatcher():
    g = _graph()
    # hccc.__main__ is the other entry point (python -m hccc), like the console script
    users = [m for m in g.predecessors("hccc.cli") if m != "hccc.__main__"]
    assert not users, "hccc.cli dispatches; nothing but the entry points may import it"
    assert g.has_edge("hccc.commands.run", "hccc.args")


def test_every_module_has_a_layer():
    assert all(_package(m) for m in MODULES)
    for pkg in LAYERS:
        if pkg.count(".") == 2 and pkg not in ("hccc.compiler.pipeline",):
            assert pkg in MODULES, f"{pkg} is in LAYERS but not in the tree"
            doc = ast.get_docstring(ast.parse(MODULES[pkg].read_text()))
            assert doc and len(doc) > 80, f"{pkg} needs a docstring saying what it holds and may import"


@pytest.mark.parametrize("a, b", [("hccc.compiler.passes.hpds", "hccc.compiler.frontend.algorithm"),
                                  ("hccc.runtime.launcher", "hccc.compiler.ir.program_ir")])
def test_the_graph_sees_known_imports(a, b):
    assert _graph().has_edge(a, b)


def test_root_package_is_light_and_its_api_resolves():
    tree = ast.parse(MODULES["hccc"].read_text())
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
             and any(a.name.startswith("hccc") for a in n.names) | (getattr(n, "module", "") or "").startswith("hccc")]
    assert not eager, "hccc/__init__ must load its API lazily (runtime modules read hccc.__version__)"
    code = ("import sys, hccc; assert not any(m.startswith('hccc.') for m in sys.modules), sorted(sys.modules); "
            "missing = [n for n in hccc.__all__ if getattr(hccc, n, None) is None]; assert not missing, missing")
    subprocess.run([sys.executable, "-c", code], check=True)


#: third-party modules that `hccc check` must not load (start-up time: each costs tens of ms)
HEAVY = ("networkx", "z3", "numba", "jinja2", "scipy", "matplotlib", "cupy", "rich")


@pytest.mark.parametrize("args", [["check", "examples/ring_allreduce_8.rccl"],
                                  ["check", "examples/hm_allreduce_2x4.rccl", "--json"]])
def test_check_does_not_import_heavy_modules(args):
    # the command as a user runs it, in a fresh interpreter; the modules it loaded are listed
    code = ("import runpy, sys\n"
            f"sys.argv = ['hccc'] + {args!r}\n"
            "try:\n    runpy.run_module('hccc', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('MODULES', ' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    loaded = set(out.rsplit("MODULES", 1)[1].split())
    assert "numpy" in loaded and "hccc" in loaded     # the listing itself works
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
