"""User files are never lost: output directories replace only what hccc wrote (its manifest lists
it), foreign directories and ``manifest.json`` files of other tools are refused, single-file outputs
refuse anything but new paths and regular files (and the command's own input under any name), stale
temporaries of killed runs are cleaned.

The property tests compare :func:`atomic_output_dir` with a model written here (a dict of file
names to contents): what a publish must leave, or that it must refuse and change nothing.
"""
from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.backend.output_dir import (MANIFEST_SCHEMA, MARKER, atomic_output_dir, check_output_file,
                                              clean_stale_siblings, write_text_atomically)
from hccc.util.diagnostics import CompileError

from cli_runs import run_cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
HCCC = [sys.executable, "-m", "hccc.cli"]


def snapshot(d: Path) -> dict[str, bytes]:
    """Every regular file under ``d`` (relative name -> bytes); directories as ``name/``."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        out[rel + ("/" if p.is_dir() and not p.is_symlink() else "")] = \
            p.read_bytes() if p.is_file() and not p.is_symlink() else b""
    return out


def hccc_manifest(files: list[str], **extra) -> str:
    return json.dumps({"schema": MANIFEST_SCHEMA, "generator": "hccc 0.1.0", "files": sorted(files), **extra})


def publish(out: Path, new: dict[str, str]) -> None:
    with atomic_output_dir(out) as tmp:
        for name, text in new.items():
            (tmp / name).write_text(text)


def run_hccc(*args, cwd=None):
    """hccc in this process, HCCC_DEBUG unset (an internal error reads as a user sees it)."""
    return run_cli(*args, cwd=cwd, env={"HCCC_DEBUG": None})


def run_hccc_process(*args, timeout):
    """hccc in a subprocess, where a regression would block (opening a FIFO for writing waits for a
    reader): ``timeout`` turns that hang into a failure."""
    env = dict(os.environ, HCCC_DEBUG="")
    return subprocess.run([*HCCC, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


NAMES = st.sampled_from(["a.cu", "b.cu", "k_r0.cu", "k_r1.cu", "x.h", "CMakeLists.txt", "Makefile", "ir.json",
                         "notes.txt", "build.log", "k.xml"])


@settings(max_examples=60)
@given(old=st.sets(NAMES, max_size=6), user=st.sets(NAMES, max_size=4), new=st.sets(NAMES, min_size=1, max_size=6),
       user_dir=st.booleans())
def test_republish_replaces_only_what_hccc_wrote(tmp_path_factory, old, user, new, user_dir):
    """Model: the directory holds hccc's earlier files ``old`` (listed in its manifest) and the
    user's files ``user``. A new run writing ``new`` must leave exactly the user's files (unchanged)
    plus ``new`` (and its manifest), or, when a new name collides with a user's file, refuse and
    change nothing."""
    user = user - old
    base = tmp_path_factory.mktemp("case")
    out = base / "out"
    out.mkdir()
    for n in old:
        (out / n).write_text("old " + n)
    for n in user:
        (out / n).write_text("user " + n)
    if user_dir:
        (out / "build").mkdir()
        (out / "build" / "lib.so").write_text("user lib")
    (out / MARKER).write_text(hccc_manifest(sorted(old) + [MARKER]))
    before = snapshot(out)
    new_files = {n: "new " + n for n in new} | {MARKER: hccc_manifest(sorted(new) + [MARKER])}
    if new & user:
        with pytest.raises(CompileError, match="did not write"):
            publish(out, new_files)
        assert snapshot(out) == before
    else:
        publish(out, new_files)
        expect = {n: ("user " + n).encode() for n in user} | {n: v.encode() for n, v in new_files.items()}
        if user_dir:
            expect |= {"build/": b"", "build/lib.so": b"user lib"}
        assert snapshot(out) == expect
    assert [p.name for p in base.iterdir()] == ["out"]   # no temporaries left beside it


@settings(max_examples=30)
@given(doc=st.one_of(
    st.dictionaries(st.sampled_from(["schema", "generator", "files", "name"]),
                    st.one_of(st.text(max_size=12), st.integers(), st.none(), st.lists(st.text(max_size=5)))),
    st.lists(st.integers(), max_size=3), st.text(max_size=20)))
def test_foreign_manifest_is_not_hccc_s(tmp_path_factory, doc):
    """A ``manifest.json`` of another tool (any JSON that is not hccc's schema) does not make a
    directory hccc's: writing into it is refused and nothing changes."""
    is_hccc = isinstance(doc, dict) and doc.get("schema") == MANIFEST_SCHEMA \
        and str(doc.get("generator", "")).startswith("hccc ")
    out = tmp_path_factory.mktemp("foreign")
    (out / MARKER).write_text(json.dumps(doc))
    (out / "main.c").write_text("int main(){}")
    before = snapshot(out)
    if is_hccc:
        return
    with pytest.raises(CompileError, match="not written by hccc|not an hccc manifest|malformed"):
        publish(out, {"k.cu": "x", MARKER: hccc_manifest(["k.cu", MARKER])})
    assert snapshot(out) == before


def test_manifest_lists_paths_outside_is_harmless(tmp_path):
    """A manifest naming ``../x`` or absolute paths cannot make hccc remove files outside."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(hccc_manifest(["../victim.txt", str(victim), ".", "..", MARKER]))
    publish(out, {"k.cu": "x", MARKER: hccc_manifest(["k.cu", MARKER])})
    assert victim.read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["k.cu", MARKER]


def test_failed_run_changes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.cu").write_text("old")
    (out / MARKER).write_text(hccc_manifest(["a.cu", MARKER]))
    before = snapshot(out)
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out) as tmp:
            (tmp / "a.cu").write_text("new")
            raise RuntimeError("codegen failed")
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("kind", ["tmp", "old"])
def test_stale_siblings_of_killed_runs_are_cleaned(tmp_path, kind):
    out = tmp_path / "out"
    stale_dir = tmp_path / f".out.{kind}-abc123"
    stale_dir.mkdir()
    (stale_dir / "k.cu").write_text("half")
    stale_file = tmp_path / f".out.{kind}-zz"
    stale_file.write_text("x")
    held = tmp_path / f".out.{kind}-held"
    held.mkdir()
    other = tmp_path / ".other.tmp-1"        # not this output's: left alone
    other.mkdir()
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)       # a live run holds it
        publish(out, {"k.cu": "x", MARKER: hccc_manifest(["k.cu", MARKER])})
    finally:
        os.close(fd)
    assert not stale_dir.exists() and not stale_file.exists()
    assert held.exists() and other.exists()


def test_stale_single_file_temporaries_are_cleaned(tmp_path):
    target = tmp_path / "algo.xml"
    stale = tmp_path / ".algo.xml.tmp-1234"
    stale.write_text("partial")
    write_text_atomically(target, "<algo/>")
    assert target.read_text() == "<algo/>" and not stale.exists()
    assert clean_stale_siblings(target) == []


# ----------------------------------------------------------------------------- single-file outputs
def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"special_{kind}"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "symlink":
        (tmp_path / "target.txt").write_text("the user's file")
        p.symlink_to(tmp_path / "target.txt")
    elif kind == "dangling":
        p.symlink_to(tmp_path / "nowhere.txt")
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root")
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 7))     # the same device as /dev/full
    elif kind == "socket":
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    return p


KINDS = ["fifo", "dir", "symlink", "dangling", "chardev", "socket"]


@pytest.mark.parametrize("kind", KINDS)
def test_single_file_output_refuses_non_regular(tmp_path, kind):
    p = _special(tmp_path, kind)
    mode = os.lstat(p).st_mode
    with pytest.raises(CompileError):
        write_text_atomically(p, "text")
    assert os.lstat(p).st_mode == mode                      # still the same kind of thing
    if kind == "symlink":
        assert (tmp_path / "target.txt").read_text() == "the user's file"
    if kind == "dangling":
        assert not (tmp_path / "nowhere.txt").exists()
    assert [q.name for q in tmp_path.iterdir() if ".tmp-" in q.name] == []


def test_single_file_output_new_and_regular(tmp_path):
    assert check_output_file(tmp_path / "new.xml") == tmp_path / "new.xml"
    (tmp_path / "old.xml").write_text("old")
    write_text_atomically(tmp_path / "old.xml", "new")
    assert (tmp_path / "old.xml").read_text() == "new"
    with pytest.raises(CompileError, match="does not exist"):
        check_output_file(tmp_path / "missing" / "x.xml")


PLOTS = {
    "topo --plot": ["topo", EXAMPLES / "clusters" / "a100_topo1.topo", "--plot"],
    "sim --plot": ["sim", EXAMPLES / "hm_allreduce_2x4.rccl", "--topology", EXAMPLES / "clusters" / "a100_topo1.topo",
                   "--sizes", "1M", "--plot"],
    "sim --plot-busbw": ["sim", EXAMPLES / "hm_allreduce_2x4.rccl", "--topology",
                         EXAMPLES / "clusters" / "a100_topo1.topo", "--sizes", "1M,2M", "--plot-busbw"],
}


@pytest.mark.parametrize("command", sorted(PLOTS))
@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev"])
def test_plots_are_single_file_outputs(tmp_path, kind, command):
    """A plot is written as every single-file output is (matplotlib once wrote the path it was
    given, a device, a FIFO or a symbolic link's target included): refused before the work,
    exit 1, no traceback, the special file unchanged, no temporaries; a regular file is replaced."""
    pytest.importorskip("matplotlib")
    p = _special(tmp_path, kind).rename(tmp_path / f"{kind}.png")
    mode = os.lstat(p).st_mode
    r = run_hccc_process(*PLOTS[command], p, timeout=120) if kind == "fifo" else run_hccc(*PLOTS[command], p)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "writes only new or regular files" in r.stderr or "is a symbolic link" in r.stderr, r.stderr
    assert os.lstat(p).st_mode == mode
    assert sorted(q.name for q in tmp_path.iterdir() if q.name.startswith(".")) == []
    if kind == "symlink":
        assert (tmp_path / "target.txt").read_text() == "the user's file"
    good = tmp_path / "good.png"
    good.write_text("old")
    r = run_hccc(*PLOTS[command], good)
    assert r.returncode == 0, r.stderr
    assert good.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("step, fails, words", [
    ("mkstemp", "tempfile.mkstemp", "cannot create a temporary file in"),
    ("write", "os.fsync", "cannot write the temporary file"),
    ("rename", "os.replace", "cannot rename the temporary file"),
])
def test_a_failed_single_file_write_names_the_step_that_failed(tmp_path, monkeypatch, step, fails, words):
    """A file system that refuses the temporary file beside the output (/proc) once read "cannot
    write '/proc/self/mem': No such file or directory" of a file that exists: each step's failure
    names the step; the output stays as it was, no temporary is left."""
    import errno
    import tempfile

    out = tmp_path / "old.xml"
    out.write_text("old")

    def refuse(*a, **k):
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    mod, name = fails.split(".")
    monkeypatch.setattr({"os": os, "tempfile": tempfile}[mod], name, refuse)
    with pytest.raises(CompileError) as exc:
        write_text_atomically(out, "new")
    monkeypatch.undo()
    msg = str(exc.value)
    assert f"cannot write '{out}': {words}" in msg and msg.endswith("No such file or directory"), msg
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["old.xml"]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc")
def test_xml_to_proc_self_mem_says_what_failed():
    r = run_hccc("xml", EXAMPLES / "ring_allgather_8.rccl", "-o", "/proc/self/mem")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write '/proc/self/mem': cannot create a temporary file in '/proc/self'" in r.stderr, r.stderr


COMMANDS = {
    "xml": ["xml", EXAMPLES / "ring_allgather_8.rccl", "-o"],
    "synth": ["synth", EXAMPLES / "clusters" / "v100_4_8.topo", "--collective", "allgather", "-o"],
    "gen": ["gen", "c2c", EXAMPLES / "clusters" / "mixed_v100_w7800.topo", "--collective", "allgather", "-o"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev"])
def test_single_file_commands_refuse_special_output_before_work(tmp_path, kind, command):
    """``hccc xml|synth|gen ... -o F``: the same refusal through the command line, exit 1, no
    traceback, no temporaries, the special file unchanged (``-o /dev/full`` must never replace the
    device)."""
    p = _special(tmp_path, kind)
    mode = os.lstat(p).st_mode
    r = run_hccc_process(*COMMANDS[command], p, timeout=120) if kind == "fifo" else run_hccc(*COMMANDS[command], p)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "error" in r.stderr
    assert os.lstat(p).st_mode == mode
    assert sorted(q.name for q in tmp_path.iterdir() if q.name.startswith(".")) == []


def test_an_output_that_is_an_input_is_refused_under_any_name(tmp_path):
    """The same file as an input, by its name, another spelling, a hard link or a symbolic link
    to it, is refused; other files, new paths, ``-`` and None are not inputs that collide."""
    inp = tmp_path / "c.topo"
    inp.write_text("the user's cluster")
    (tmp_path / "hard.rccl").hardlink_to(inp)
    (tmp_path / "sym.topo").symlink_to(inp)
    for out, given in ((inp, inp), (tmp_path / "." / "c.topo", inp), (tmp_path / "hard.rccl", inp),
                       (inp, tmp_path / "sym.topo")):
        with pytest.raises(CompileError, match="is the input"):
            check_output_file(out, [given])
        with pytest.raises(CompileError, match="is the input"):
            write_text_atomically(out, "a program", [given])
    assert inp.read_text() == "the user's cluster"
    (tmp_path / "other.rccl").write_text("old")
    assert check_output_file(tmp_path / "other.rccl", [inp, "-", None]) == tmp_path / "other.rccl"
    assert check_output_file(tmp_path / "new.rccl", [inp, tmp_path / "missing.topo"]) == tmp_path / "new.rccl"


INPUT_AS_OUTPUT = {
    "xml": (EXAMPLES / "ring_allgather_8.rccl", ["xml", "{input}", "-o", "{input}"]),
    "plan": (EXAMPLES / "ring_allgather_8.rccl", ["plan", "{input}", "-o", "{input}"]),
    "synth": (EXAMPLES / "clusters" / "v100_4_8.topo", ["synth", "{input}", "--collective", "allgather", "-o",
                                                          "{input}"]),
    "synth --size": (EXAMPLES / "clusters" / "v100_4_8.topo", ["synth", "--topology", "{input}", "--collective", "allgather",
                                                                 "--size", "4K,1M", "-o", "{input}"]),
    "gen": (EXAMPLES / "clusters" / "mixed_v100_w7800.topo", ["gen", "c2c", "{input}", "--collective", "allgather",
                                                               "-o", "{input}"]),
    "topo --plot": (EXAMPLES / "clusters" / "v100_4_8.topo", ["topo", "{input}", "--plot", "{input}"]),
    "sim --plot-busbw": (EXAMPLES / "clusters" / "a100_topo1.topo", ["sim", EXAMPLES / "ring_allgather_8.rccl", "--topology",
                                                                      "{input}", "--plot-busbw", "{input}"]),
}


@pytest.mark.parametrize("command", sorted(INPUT_AS_OUTPUT))
def test_single_file_commands_never_write_over_their_input(tmp_path, command):
    """``hccc synth c.topo -o c.topo`` replaced the cluster by the program (``hccc xml``/``plan`` an
    algorithm by its export, ``hccc topo c.topo --plot c.topo`` the cluster by its drawing): now
    exit 1 before any work, a located message, the input intact, nothing else written."""
    src, argv = INPUT_AS_OUTPUT[command]
    inp = tmp_path / src.name
    inp.write_bytes(src.read_bytes())
    r = run_hccc(*[str(a).format(input=inp.name) for a in argv], cwd=tmp_path)
    assert r.returncode == 1, r.stderr + r.stdout
    assert "Traceback" not in r.stderr and f"output '{inp.name}' is the input" in r.stderr, r.stderr
    assert inp.read_bytes() == src.read_bytes()
    assert sorted(q.name for q in tmp_path.iterdir()) == [inp.name]


# ----------------------------------------------------------------------------- the compile command
def test_recompile_keeps_user_files_and_dot_output(tmp_path):
    """End to end: ``hccc ALGO -o .`` into a fresh directory, the user adds files, a different
    algorithm is compiled into the same directory: the user's files stay, the first algorithm's
    files are gone, no temporaries are left next to the directory."""
    work = tmp_path / "kernels"
    work.mkdir()
    r = run_hccc(EXAMPLES / "ring_allgather_8.rccl", "-o", ".", cwd=work)
    assert r.returncode == 0, r.stderr
    first = json.loads((work / MARKER).read_text())
    assert set(first["files"]) == {p.name for p in work.iterdir()}
    (work / "notes.txt").write_text("my notes")
    (work / "build").mkdir()
    (work / "build" / "libalgo.so").write_bytes(b"\x7fELF")
    r = run_hccc(EXAMPLES / "ring_reducescatter_8.rccl", "-o", ".", cwd=work)
    assert r.returncode == 0, r.stderr
    second = json.loads((work / MARKER).read_text())
    names = {p.name for p in work.iterdir()}
    assert names == set(second["files"]) | {"notes.txt", "build"}
    assert (work / "notes.txt").read_text() == "my notes"
    assert (work / "build" / "libalgo.so").read_bytes() == b"\x7fELF"
    assert not any("ring_allgather_8" in n for n in names)
    assert [p.name for p in tmp_path.iterdir()] == ["kernels"]
    # a user's file with the name of a file hccc is about to write: refused, nothing changes
    clash = second["files"][0] if second["files"][0] != MARKER else second["files"][1]
    (work / clash).unlink()
    (work / clash).write_text("mine")
    doc = json.loads((work / MARKER).read_text())
    doc["files"] = [f for f in doc["files"] if f != clash]
    (work / MARKER).write_text(json.dumps(doc))
    before = snapshot(work)
    r = run_hccc(EXAMPLES / "ring_reducescatter_8.rccl", "-o", ".", cwd=work)
    assert r.returncode == 1 and "did not write" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(work) == before


def test_compile_refuses_directory_with_foreign_manifest(tmp_path):
    out = tmp_path / "proj"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"name": "my-npm-package", "version": "1.0.0"}))
    (out / "index.js").write_text("x")
    before = snapshot(out)
    r = run_hccc(EXAMPLES / "ring_allgather_8.rccl", "-o", out)
    assert r.returncode == 1 and "not an hccc manifest" in r.stderr
    assert snapshot(out) == before


@pytest.mark.parametrize("dies_after", [1, 2, 4])
@pytest.mark.parametrize("start", ["empty", "hccc"])
def test_run_killed_while_publishing_leaves_a_cleanable_directory(tmp_path, monkeypatch, dies_after, start):
    """A run that dies while its files move into an existing directory (``-o .``) leaves a
    directory whose manifest lists everything hccc may have put there: the next run replaces all of
    it and keeps the user's file."""
    import hccc.compiler.backend.output_dir as od
    out = tmp_path / "out"
    out.mkdir()
    if start == "hccc":
        (out / "old.cu").write_text("old")
        (out / MARKER).write_text(hccc_manifest(["old.cu", MARKER]))
        (out / "user.txt").write_text("mine")
    new = {f"k{i}.cu": f"v{i}" for i in range(5)} | {MARKER: hccc_manifest([f"k{i}.cu" for i in range(5)] + [MARKER])}
    calls = {"n": 0}
    real = os.replace

    def dying_replace(a, b):
        if str(b).endswith(".cu"):
            calls["n"] += 1
            if calls["n"] > dies_after:
                raise KeyboardInterrupt("killed")
        return real(a, b)

    monkeypatch.setattr(od.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        publish(out, new)
    monkeypatch.setattr(od.os, "replace", real)
    publish(out, new)
    expect = {n: v.encode() for n, v in new.items()}
    if start == "hccc":
        expect["user.txt"] = b"mine"
    assert snapshot(out) == expect


@pytest.mark.parametrize("command,suffix", [("xml", ".xml"), ("plan", ".mscclpp.json")])
def test_an_export_to_a_folder_names_a_file_to_give_and_writes_nothing(tmp_path, command, suffix):
    """`hccc xml|plan ALGO -o DIR`: one located refusal that suggests DIR/<name><suffix>, nothing
    written into the folder; `-o -` writes the export to standard output and no file."""
    algo = ROOT / "examples" / "ring_allreduce_8.rccl"
    p = run_hccc(command, str(algo), "-o", str(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "is a directory; give a file name such as" in p.stderr and f"ring_allreduce_8{suffix}" in p.stderr
    assert list(tmp_path.iterdir()) == []
    p = run_hccc(command, str(algo), "-o", "-", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.lstrip().startswith("<" if command == "xml" else "{")
    assert list(tmp_path.iterdir()) == []
