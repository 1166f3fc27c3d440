"""``import hccc`` finds the installed package wherever Python runs, editable or regular: a folder
named ``hccc`` (no ``__init__.py``) beside a script, in the working directory of ``python -c``, does
not shadow it as an empty namespace package (``build_backend/hccc_build.py``).

Default set: a script and ``python -c`` run from a directory holding an empty ``hccc/`` folder,
against the install the tests run on; the build backend's change to an editable wheel (its
``.pth`` line added once, the RECORD's hash and size of the file right, a wheel without a finder
left alone) and that line, run as ``site`` runs it, putting hccc's finder first and keeping the
others' order. Slow set: a temporary venv with a copy of the package sources installed editable and
regular (no network: ``--no-build-isolation``, the interpreter's own setuptools), each run from
such a directory.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAIN = "import hccc\nprint('version', hccc.__version__)\n"


def _load_backend():
    spec = importlib.util.spec_from_file_location("hccc_build_under_test",
                                                  ROOT / "build_backend" / "hccc_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shadowed_dir(tmp_path: Path) -> Path:
    """A directory holding an empty ``hccc/`` folder and ``train.py`` (``import hccc``)."""
    d = tmp_path / "job"
    (d / "hccc").mkdir(parents=True)
    (d / "train.py").write_text(TRAIN)
    return d


def _version_from(python: str, d: Path) -> list[subprocess.CompletedProcess]:
    """``train.py`` and ``python -c`` (the working directory first on sys.path) run in ``d``."""
    return [subprocess.run([python, *argv], cwd=d, capture_output=True, text=True, timeout=120)
            for argv in (["train.py"], ["-c", TRAIN])]


def test_a_hccc_folder_beside_a_script_does_not_shadow_the_installed_package(tmp_path):
    d = _shadowed_dir(tmp_path)
    import hccc
    for p in _version_from(sys.executable, d):
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.split() == ["version", hccc.__version__], p.stdout


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel holding ``files`` and a RECORD of them (as a build backend writes it)."""
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
        for n, b in files.items()) + "hccc-0.1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr("hccc-0.1.0.dist-info/RECORD", record)
    return path


def test_the_editable_wheel_gets_the_finder_first_line_once_with_its_record(tmp_path):
    be = _load_backend()
    pth = b"import __editable___hccc_0_1_0_finder; __editable___hccc_0_1_0_finder.install()\n"
    w = _wheel(tmp_path / "hccc-0.1.0-0.editable-py3-none-any.whl",
               {"__editable__.hccc-0.1.0.pth": pth, "__editable___hccc_0_1_0_finder.py": b"# finder\n"})
    for _ in range(2):                   # a second pass adds nothing
        be.put_finder_first(w)
    with zipfile.ZipFile(w) as z:
        got = z.read("__editable__.hccc-0.1.0.pth")
        record = z.read("hccc-0.1.0.dist-info/RECORD").decode()
        assert z.read("__editable___hccc_0_1_0_finder.py") == b"# finder\n"
    assert got == pth + be.FINDER_FIRST.encode()
    rows = {line.split(",")[0]: line.split(",")[1:] for line in record.splitlines()}
    digest = base64.urlsafe_b64encode(hashlib.sha256(got).digest()).rstrip(b"=").decode()
    assert rows["__editable__.hccc-0.1.0.pth"] == [f"sha256={digest}", str(len(got))]
    assert rows["hccc-0.1.0.dist-info/RECORD"] == ["", ""]


def test_a_wheel_whose_pth_is_a_path_entry_is_left_alone(tmp_path):
    be = _load_backend()
    w = _wheel(tmp_path / "x.whl", {"__editable__.hccc-0.1.0.pth": b"/src\n"})
    before = w.read_bytes()
    be.put_finder_first(w)
    assert w.read_bytes() == before


def test_the_finder_first_line_moves_hccc_finders_first_and_keeps_the_others_order(monkeypatch):
    be = _load_backend()
    finders = [type(f"F{i}", (), {"__module__": m}) for i, m in enumerate(
        ["a", "__editable___hccc_0_1_0_finder", "b", "__editable___other_finder", "c"])]
    monkeypatch.setattr(sys, "meta_path", list(finders))
    line = be.FINDER_FIRST
    assert line.startswith("import ") and line.count("\n") == 1     # one line site executes
    exec(line, {}, {})                   # as site runs a .pth line: its own globals and locals
    assert [f.__module__ for f in sys.meta_path] == [
        "__editable___hccc_0_1_0_finder", "a", "b", "__editable___other_finder", "c"]


def test_the_finder_first_line_leaves_the_order_to_a_regular_hccc_on_the_path(monkeypatch, tmp_path):
    """A regular ``hccc`` package (an ``__init__.py``: a regular install, say in a venv that also
    sees a system-wide editable one) on ``sys.path`` as site runs the line: the finders keep
    Python's order, so that install is found first, as a regular package earlier on the path is;
    an empty ``hccc`` folder there (a namespace portion) still gets the editable finder first."""
    be = _load_backend()
    names = ["a", "__editable___hccc_0_1_0_finder", "b"]
    for regular, want in ((True, names), (False, [names[1], names[0], names[2]])):
        site = tmp_path / ("regular" if regular else "namespace") / "site-packages"
        (site / "hccc").mkdir(parents=True)
        if regular:
            (site / "hccc" / "__init__.py").write_text("__version__ = 'regular'\n")
        finders = [type(f"F{i}", (), {"__module__": m}) for i, m in enumerate(names)]
        monkeypatch.setattr(sys, "meta_path", list(finders))
        monkeypatch.setattr(sys, "path", [str(site)])
        exec(be.FINDER_FIRST, {}, {})
        assert [f.__module__ for f in sys.meta_path] == want, regular


def _venv_or_skip(tmp_path: Path) -> str:
    """A venv on the base interpreter's site-packages (its pip and setuptools, no network)."""
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([base, "-c", "from importlib.metadata import version; version('pip'); "
                            "print(int(version('setuptools').split('.')[0]))"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or int(probe.stdout.strip() or 0) < 68:
        pytest.skip("the base interpreter lacks pip or setuptools >= 68")
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _sources(tmp_path: Path) -> Path:
    """A copy of what a build reads: pyproject.toml, the backend and the package folders."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("build_backend", "driver", "compiler", "util", "runtime", "templates"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.mark.slow
@pytest.mark.parametrize("editable", [True, False], ids=["editable", "regular"])
def test_an_installed_hccc_is_found_beside_a_hccc_folder(tmp_path, editable):
    python = _venv_or_skip(tmp_path)
    src = _sources(tmp_path)
    p = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        *(["-e"] if editable else []), str(src)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    d = _shadowed_dir(tmp_path)
    for p in _version_from(python, d):
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.startswith("version "), p.stdout
    where = subprocess.run([python, "-c", "import hccc; print(hccc.__file__)"], cwd=d,
                           capture_output=True, text=True).stdout.strip()
    if editable:
        assert where == str(src / "driver" / "__init__.py"), where
    else:
        assert where.endswith("site-packages/hccc/__init__.py"), where
