"""What hccc publishes by a rename is on disk before the rename (util/durable.py): ``hccc ALGO -o
OUTDIR`` into a new and into an existing directory, a single output file, and the build cache's
entries. Every ``os.fsync`` and every rename is recorded in order, the fsynced descriptor named by
the path it has open, and each published file's data must have been synced (under the name it had
then) before the rename that made it visible, and the directory that holds it after."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ring_allgather_8.rccl"


@pytest.fixture
def journal(monkeypatch):
    events = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(src, dst, *a, **k):
        events.append(("rename", os.path.realpath(src), os.path.realpath(dst)))
        return real_replace(src, dst, *a, **k)

    def rename(src, dst, *a, **k):
        events.append(("rename", os.path.realpath(src), os.path.realpath(dst)))
        return real_rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)
    return events


def _synced_before(events, path: str, index: int) -> bool:
    return ("fsync", path) in events[:index]


def _check_published(events, out: Path) -> None:
    """Every file now in ``out`` was synced before the rename that put it (or its folder) there,
    and ``out``'s parent (a folder renamed into place) or ``out`` itself (files renamed into it)
    was synced after."""
    renames = [(i, e[1], e[2]) for i, e in enumerate(events) if e[0] == "rename"]
    assert renames
    for f in sorted(out.iterdir()):
        dst = os.path.realpath(f)
        hit = [(i, src) for i, src, d in renames if d == dst]
        if hit:                                   # a file renamed into place
            i, src = hit[-1]
            assert _synced_before(events, src, i), f"{f.name} renamed before its data was synced"
            assert ("fsync", os.path.realpath(out)) in events[i + 1:], f"{out} not synced after {f.name}"
        else:                                     # its folder renamed into place
            (i, src), = [(i, s) for i, s, d in renames if d == os.path.realpath(out)]
            assert _synced_before(events, os.path.join(src, f.name), i), f"{f.name} not synced before publish"
            assert _synced_before(events, src, i)
            assert ("fsync", os.path.realpath(out.parent)) in events[i + 1:]


def test_compiled_outputs_are_durable_before_they_are_published(tmp_path, journal):
    from hccc.cli import main
    out = tmp_path / "kernels"
    assert main([str(EXAMPLE), "-o", str(out)]) == 0            # a new directory: one rename
    _check_published(journal, out)
    journal.clear()
    assert main([str(EXAMPLE), "-o", str(out)]) == 0            # an existing one: file by file
    _check_published(journal, out)


def test_a_single_output_file_is_durable_before_it_is_published(tmp_path, journal):
    from hccc.compiler.backend.output_dir import write_text_atomically
    target = tmp_path / "algo.xml"
    target.write_text("old")
    write_text_atomically(target, "new text\n")
    assert target.read_text() == "new text\n"
    (i, src, dst), = [(i, e[1], e[2]) for i, e in enumerate(journal) if e[0] == "rename"]
    assert dst == os.path.realpath(target) and _synced_before(journal, src, i)
    assert ("fsync", os.path.realpath(tmp_path)) in journal[i + 1:]


def test_sync_tree_reaches_every_file_and_folder(tmp_path, journal):
    from hccc.util.durable import sync_tree
    (tmp_path / "a" / "b").mkdir(parents=True)
    for p in ("x", "a/y", "a/b/z"):
        (tmp_path / p).write_text(p)
    os.symlink(tmp_path / "x", tmp_path / "a" / "link")             # links are not followed
    sync_tree(tmp_path)
    synced = [e[1] for e in journal if e[0] == "fsync"]
    want = {os.path.realpath(tmp_path / p) for p in ("x", "a/y", "a/b/z", "a", "a/b", ".")}
    assert set(synced) == want and len(synced) == len(want)
    assert synced.index(os.path.realpath(tmp_path / "a/b/z")) < synced.index(os.path.realpath(tmp_path / "a/b"))
