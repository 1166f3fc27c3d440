"""No command replaces or removes one of its inputs, whatever path names it: compiling a file of an
OUTDIR back into that OUTDIR (whose earlier files are each replaced or removed as stale) is refused
before any work and leaves every file as it was, for a direct path, another spelling, a symbolic
link or a hard link; a depfile is never written over an input either."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hccc
from hccc.cli import main
from hccc.compiler.backend.output_dir import manifest_files
from hccc.util.diagnostics import CompileError

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "examples" / "direct_allgather_8.rccl"
#: the files of an OUTDIR a reader takes as input (an algorithm or program)
READABLE = (".mscclpp.json", ".ir.json", ".xml", "manifest.json")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "OUT"
    assert main([str(RING), "-o", str(out)]) == 0
    return out


def _snapshot(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _readable(out: Path) -> list[str]:
    owned, _ = manifest_files(out)
    return sorted(n for n in owned if n.endswith(READABLE))


def test_every_readable_file_of_an_outdir_is_one_it_owns(built):
    """The cases below cover every kind of file a reader takes (else the test would not see them)."""
    names = _readable(built)
    assert {next(s for s in READABLE if n.endswith(s)) for n in names} == set(READABLE)


@pytest.mark.parametrize("suffix", READABLE)
def test_compiling_an_outdir_file_into_its_outdir_is_refused(built, tmp_path, capsys, suffix):
    out = tmp_path / "OUT"
    shutil.copytree(built, out)
    name = next(n for n in _readable(out) if n.endswith(suffix))
    before = _snapshot(out)
    assert main([str(out / name), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "is an input of this command" in err and "Traceback" not in err
    assert _snapshot(out) == before


_HOW = st.sampled_from(["direct", "dotdot", "relative", "symlink", "hardlink", "symlink-to-dir"])


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=_HOW, data=st.data())
def test_any_name_of_an_owned_file_is_refused(built, tmp_path_factory, how, data):
    """Whatever names the input (oracle: the file's inode, compared here by the test itself), the
    compile is refused and the directory's bytes do not change."""
    base = tmp_path_factory.mktemp("any")
    out = base / "OUT"
    shutil.copytree(built, out)
    name = data.draw(st.sampled_from(_readable(out)))
    target = out / name
    if how == "direct":
        given_path = str(target)
    elif how == "dotdot":
        given_path = str(out / ".." / "OUT" / "." / name)
    elif how == "relative":
        given_path = os.path.relpath(target)
    elif how == "symlink":
        given_path = str(base / ("link" + name))
        os.symlink(target, given_path)
    elif how == "hardlink":
        given_path = str(base / ("hard" + name))
        os.link(target, given_path)
    else:
        os.symlink(out, base / "alias")
        given_path = str(base / "alias" / name)
    assert os.stat(given_path).st_ino == os.stat(target).st_ino
    before = _snapshot(out)
    assert main([given_path, "-o", str(out)]) == 1
    assert _snapshot(out) == before


def test_a_copy_outside_may_be_compiled_into_the_outdir(built, tmp_path):
    """The refusal is about the file, not its name or contents: a copy beside the directory
    compiles into it, replacing the earlier run's files."""
    out = tmp_path / "OUT"
    shutil.copytree(built, out)
    copy = tmp_path / "direct_allgather_8.ir.json"
    shutil.copy(out / "direct_allgather_8.ir.json", copy)
    assert main([str(copy), "-o", str(out)]) == 0


def test_the_python_api_refuses_too(built, tmp_path):
    out = tmp_path / "OUT"
    shutil.copytree(built, out)
    before = _snapshot(out)
    with pytest.raises(CompileError, match="is an input"):
        hccc.compile(str(out / "direct_allgather_8.xml"), out)
    assert _snapshot(out) == before


def test_a_depfile_never_replaces_an_input(tmp_path, capsys):
    algo = tmp_path / "a.rccl"
    shutil.copy(RING, algo)
    text = algo.read_text()
    assert main([str(algo), "-o", str(tmp_path / "OUT"), "--depfile", str(algo)]) == 1
    assert "is the input" in capsys.readouterr().err
    assert algo.read_text() == text and not (tmp_path / "OUT").exists()
