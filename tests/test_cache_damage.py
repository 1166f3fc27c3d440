"""A damaged build-cache entry is never loaded: each entry's marker records every file's size and
SHA-256, an entry whose files differ (cut short by a crash, zeroed, changed, missing, extra, its
marker damaged) is rebuilt by the next look-up, and entries reach the disk before they are
published."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.runtime import cache

ROOT = Path(__file__).resolve().parents[1]

FILES = st.dictionaries(st.sampled_from(["module.so", "engine.o", "sub/x.h", "sub/deep/y.gch", "d.json"]),
                        st.binary(min_size=1, max_size=4096), min_size=1, max_size=4)
DAMAGE = st.sampled_from(["truncate", "zero", "flip", "delete", "extra", "marker-garbage", "marker-empty", "marker-delete",
                          "marker-other-key", "marker-drop-file"])


def _builder(files: dict[str, bytes], calls: list):
    def build(tmp: Path) -> None:
        calls.append(1)
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
    return build


def _damage(final: Path, files: dict[str, bytes], how: str, pick: int) -> None:
    victim = final / sorted(files)[pick % len(files)]
    data = victim.read_bytes()
    marker = final / ".complete"
    if how == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    elif how == "zero":
        victim.write_bytes(b"")
    elif how == "flip":
        i = pick % len(data)
        victim.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    elif how == "delete":
        victim.unlink()
    elif how == "extra":
        (final / "planted.so").write_bytes(b"x")
        os.chmod(final / "planted.so", 0o600)
    elif how == "marker-garbage":
        marker.write_bytes(b"\x00{not json")
    elif how == "marker-delete":          # the rename reached the disk, the marker did not
        marker.unlink()
    elif how == "marker-empty":
        marker.write_bytes(b"")
    elif how == "marker-other-key":
        record = json.loads(marker.read_text())
        record["key"] = "0" * 64
        marker.write_text(json.dumps(record))
    elif how == "marker-drop-file":
        record = json.loads(marker.read_text())
        del record["files"][victim.relative_to(final).as_posix()]
        marker.write_text(json.dumps(record))


def _contents(final: Path) -> dict[str, bytes]:
    return {p.relative_to(final).as_posix(): p.read_bytes() for p in final.rglob("*")
            if p.is_file() and p.name != ".complete"}


@settings(max_examples=40, deadline=None)
@given(files=FILES, how=DAMAGE, pick=st.integers(0, 1 << 16), fresh_process=st.booleans())
def test_damaged_entries_are_rebuilt(tmp_path_factory, files, how, pick, fresh_process):
    """Whatever part of an entry is damaged, the next look-up (in this process, or in a new one,
    which has verified nothing yet) rebuilds it, and the entry then holds exactly what the build
    wrote; an undamaged entry is never rebuilt."""
    root = tmp_path_factory.mktemp("cache")
    key = cache.content_key("damage", repr(sorted(files.items())))
    calls: list = []
    final = cache.entry("k", key, _builder(files, calls), root=root)
    assert cache.entry("k", key, _builder(files, calls), root=root) == final and len(calls) == 1
    _damage(final, files, how, pick)
    if fresh_process:
        cache._VERIFIED.clear()
    again = cache.entry("k", key, _builder(files, calls), root=root)
    assert again == final and len(calls) == 2, how
    assert _contents(final) == files
    assert cache.intact(final, key)
    assert [p.name for p in (root / "k").iterdir() if p.name.startswith(".")] == []   # nothing left aside


@settings(max_examples=25, deadline=None)
@given(files=FILES, pick=st.integers(0, 1 << 16), fresh_process=st.booleans())
def test_an_entry_moved_aside_while_it_is_checked_is_built_again(tmp_path_factory, files, pick,
                                                                  fresh_process):
    """Another process that found the entry damaged moves it aside (and builds it again in its
    turn) while this one walks it for the trust check: the look-up takes its turn and returns a
    whole entry holding what the build wrote, instead of failing on the file that vanished (the
    ranks of one job sharing the built-in torch catalog's entries)."""
    from hccc.util.trust import CacheTrust
    root = tmp_path_factory.mktemp("cache")
    key = cache.content_key("moved aside", repr(sorted(files.items())))
    calls: list = []
    final = cache.entry("k", key, _builder(files, calls), root=root)
    if fresh_process:
        cache._VERIFIED.clear()
    victim = final / sorted(files)[pick % len(files)]
    real = CacheTrust.owned
    moved = []

    def owned(self, path, what, *, directory):
        if Path(path) == victim and not moved:       # listed, then gone before its look
            cache._discard(root / "k", key, final)
            moved.append(path)
        return real(self, path, what, directory=directory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CacheTrust, "owned", owned)
        again = cache.entry("k", key, _builder(files, calls), root=root)
    assert moved and again == final and len(calls) == 2
    assert _contents(final) == files and cache.intact(final, key)
    assert [p.name for p in (root / "k").iterdir() if p.name.startswith(".")] == []


def test_marker_records_every_file(tmp_path):
    """The marker lists each file with its size and SHA-256, computed here independently."""
    files = {"module.so": b"\x7fELF" + bytes(range(256)) * 9, "sub/x.h": b"#pragma once\n"}
    key = cache.content_key("marker")
    final = cache.entry("k", key, _builder(files, []), root=tmp_path / "c")
    record = json.loads((final / ".complete").read_text())
    assert record["key"] == key
    assert record["files"] == {name: [len(data), hashlib.sha256(data).hexdigest()] for name, data in files.items()}


def test_entries_are_fsynced_before_they_are_published(tmp_path, monkeypatch):
    """Every file and directory of the entry is fsynced before the rename that publishes it, and
    the kind directory after it."""
    events: list = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(a, b):
        events.append(("rename", str(a), str(b)))
        return real_rename(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    files = {"module.so": b"abc", "sub/x.h": b"h"}
    key = cache.content_key("fsync")
    final = cache.entry("k", key, _builder(files, []), root=tmp_path / "c")
    published = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(final))
    tmp = events[published][1]
    synced_before = {e[1] for e in events[:published] if e[0] == "fsync"}
    for rel in ("module.so", "sub/x.h", ".complete", "sub", ""):
        assert os.path.normpath(os.path.join(tmp, rel)) in synced_before, rel
    assert ("fsync", str(final.parent)) in events[published:]


@pytest.mark.slow   # three CPU builds of one program (about 10 s each on two cores)
def test_run_rebuilds_a_damaged_module(tmp_path):
    """End to end, as a crash would leave it: ``hccc run``'s compiled module cut to 20 KB (which
    made dlopen die of SIGBUS), to 0 bytes (which failed every later run with "file too short")
    and with a byte changed: each next run rebuilds it and passes."""
    env = dict(os.environ, HCCC_CACHE_DIR=str(tmp_path / "cache"), HCCC_DEBUG="")
    cmd = [sys.executable, "-m", "hccc.cli", "run", str(ROOT / "examples" / "ring_allgather_8.rccl"),
           "--backend", "cpu", "--bytes", "4K"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    [module] = list((tmp_path / "cache" / "cpu").glob("*/module.so"))
    whole = module.read_bytes()
    assert len(whole) > 20_000
    for damage in (whole[:20_000], b"", whole[:-1] + bytes([whole[-1] ^ 0xFF])):
        module.write_bytes(damage)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, (len(damage), out.returncode, out.stderr)
        assert module.read_bytes() == whole or len(module.read_bytes()) > 20_000
        assert "Traceback" not in out.stderr
