"""The test suite's own configuration: README's test command is deterministic by default (the
derandomised hypothesis profile, unless the user asks for another), and .ci/run runs exactly it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
from hypothesis import given, settings, strategies as st
from conftest import examples
def test_profile():
    print("PROFILE", settings._current_profile, settings.default.derandomize, settings.default.database,
          examples(40))
'''


def _profile(tmp_path, *args, env_profile=None) -> str:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    if env_profile:
        env["HYPOTHESIS_PROFILE"] = env_profile
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                        str(tmp_path / "test_probe.py"), *args], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"PROFILE (.*)", r.stdout).group(1)


def test_default_profile_is_derandomised(tmp_path):
    assert _profile(tmp_path) == "ci True None 40"


@pytest.mark.slow
def test_random_profiles_on_request(tmp_path):
    assert _profile(tmp_path, "--hypothesis-profile", "dev").startswith("dev False")
    assert _profile(tmp_path, env_profile="dev").startswith("dev False")
    got = _profile(tmp_path, "--hypothesis-profile", "thorough", env_profile="dev")
    assert got.startswith("thorough False") and got.endswith(" 400")


def test_ci_runs_the_readme_commands():
    """.ci/run installs system packages only (apt-get), then runs README's two quick-start
    commands exactly as written, then the slow set: the install is README's."""
    readme = (ROOT / "README.md").read_text()
    quick = re.search(r"## Quick start\n\n```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    install_cmd, test_cmd = (line.strip() for line in quick)
    assert test_cmd == "pytest -n 2"
    assert install_cmd.startswith("pip install -e '.[test") and "-o kernels/" in install_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(install_cmd)}\n{re.escape(test_cmd)}$", ci, re.M)
    # nothing else installs Python packages: the quick start alone must do
    assert [line for line in ci.splitlines() if re.search(r"\bpip\b", line)
            and not line.lstrip().startswith("#")] == [install_cmd]
    # then the slow set, right after README's test command (CI runs both)
    assert re.search(rf"^{re.escape(test_cmd)}\n(#.*\n)*{re.escape(test_cmd)} -m slow$", ci, re.M)
    assert "HCCC_REQUIRE_COMPILERS=1" in ci
    assert "-m slow" in readme
    assert "unset HYPOTHESIS_PROFILE" in ci and "HYPOTHESIS_PROFILE=" not in ci


@pytest.mark.parametrize("args, dist", [(("-n", "2"), "worksteal"), (("-n", "2", "--dist", "load"), "load"),
                                        (("-n", "2", "--dist=loadfile"), "loadfile"), ((), "no")])
def test_readme_command_steals_work_unless_told_otherwise(tmp_path, args, dist):
    """README's ``-n 2`` schedules by work stealing (a module's tests stay together on a worker); a
    ``--dist`` the user gives wins, and a run without workers distributes nothing. The conftest
    is asked directly (``pytest_configure`` on a stand-in config), not through worker processes."""
    import conftest
    from types import SimpleNamespace
    numprocesses = int(args[1]) if args else None
    given = [a for a in args if a.startswith("--dist")]
    mode = args[args.index("--dist") + 1] if "--dist" in args else \
        (given[0].split("=", 1)[1] if given else ("load" if numprocesses else "no"))
    config = SimpleNamespace(option=SimpleNamespace(dist=mode, distload=False, numprocesses=numprocesses),
                             invocation_params=SimpleNamespace(args=tuple(args)))
    conftest._steal_work(config)
    assert config.option.dist == dist


def test_workers_are_told_to_steal_work_before_xdist_reads_the_mode(tmp_path):
    """The hook order the choice above relies on, end to end: a real ``-n 1`` run schedules by
    work stealing (the conftest's ``pytest_configure`` ran before pytest-xdist's)."""
    (tmp_path / "test_probe.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "1",
                        str(tmp_path / "test_probe.py")], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WorkStealingScheduling" in r.stdout


def test_a_parallel_runs_modules_are_prepared_once_before_its_workers_start(tmp_path, request):
    """What ``-n N``'s controller does before its workers start (``conftest.prepare_imports``): a
    test module's asserts rewritten into the pyc pytest's import looks for (loading it gives the
    rewritten assert's message, where a plain one has none), a helper of the tests and a module of
    the package compiled to their bytecode; a second run finds them all current and prepares none."""
    import importlib.util

    import conftest
    from _pytest.assertion import rewrite
    tests, package = tmp_path / "tests", tmp_path / "package"
    tests.mkdir()
    package.mkdir()
    (tests / "test_probe.py").write_text("def test_probe():\n    got = [1, 2]\n    assert got == [1, 3]\n")
    (tests / "probe_helper.py").write_text("X = 1\n")
    (package / "module.py").write_text("Y = 2\n")
    assert conftest.prepare_imports(request.config, tests, [package], 2) == 3
    probe = tests / "test_probe.py"
    code = rewrite._read_pyc(probe, rewrite.get_cache_dir(probe) / ("test_probe" + rewrite.PYC_TAIL))
    assert code is not None
    space: dict = {}
    exec(code, space)
    with pytest.raises(AssertionError, match=r"assert \[1, 2\] == \[1, 3\]"):
        space["test_probe"]()
    for module in (tests / "probe_helper.py", package / "module.py"):
        assert Path(importlib.util.cache_from_source(str(module))).is_file(), module
    assert conftest.prepare_imports(request.config, tests, [package], 2) == 0


def _imports_torch(node) -> bool:
    names = ([a.name for a in node.names] if isinstance(node, __import__("ast").Import)
             else [node.module or ""] if isinstance(node, __import__("ast").ImportFrom) else [])
    return any(n in ("torch", "hccc.torch") or n.startswith(("torch.", "hccc.torch.")) for n in names)


def _unguarded_torch_imports(path: Path) -> list[str]:
    """``file:line`` of each top-level import of torch (or hccc.torch) in ``path`` that no earlier
    top-level ``needs_torch()`` call guards."""
    import ast
    bad, guarded = [], False
    for node in ast.parse(path.read_text()).body:
        call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "needs_torch":
            guarded = True
        if guarded or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        bad += [f"{path.name}:{n.lineno}" for n in ast.walk(node) if _imports_torch(n)]
    return bad


def test_no_test_module_imports_torch_at_its_top_unguarded():
    """The suite collects without torch: a test module's top-level import of torch (or of
    hccc.torch, which imports it) comes after a top-level ``needs_torch()`` call, which skips the
    module naming the extra; every other import of torch sits inside a function."""
    bad = [b for path in sorted((ROOT / "tests").glob("*.py")) for b in _unguarded_torch_imports(path)]
    assert bad == []


def test_the_module_import_check_finds_an_unguarded_torch_import(tmp_path):
    """The check above against modules that import torch at their top, guarded or not."""
    import ast
    assert _imports_torch(ast.parse("import torch.distributed as dist").body[0])
    assert _imports_torch(ast.parse("from hccc.torch.builtin import plan").body[0])
    assert not _imports_torch(ast.parse("from torch_ranks import spawn").body[0])
    assert not _imports_torch(ast.parse("import torchvision").body[0])
    assert not _imports_torch(ast.parse("from hccc.torch_calls import TORCH_CALLS").body[0])
    cases = {"import pytest\nimport torch\n": ["m.py:2"],
             "try:\n    import torch\nexcept ImportError:\n    torch = None\n": ["m.py:2"],
             "from conftest import needs_torch\nneeds_torch()\nimport torch\n": [],
             "from conftest import needs_torch\ndist = needs_torch('torch.distributed')\n"
             "from hccc.torch import Options\n": [],
             "def f():\n    import torch\n": []}
    for text, want in cases.items():
        (tmp_path / "m.py").write_text(text)
        assert _unguarded_torch_imports(tmp_path / "m.py") == want, text
