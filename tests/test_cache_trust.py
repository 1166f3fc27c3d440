"""The build cache loads only the user's own, private entries (their shared libraries run code when
loaded): entries are created 0700/0600, anything owned by someone else or writable by others is
refused with a message naming it, and temporaries of killed builds are removed."""
from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.runtime import cache
from hccc.util.trust import private_group

ROOT = Path(__file__).resolve().parents[1]

FILES = st.dictionaries(st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6})?(\.so|\.o|\.cu)?", fullmatch=True),
                        st.tuples(st.binary(max_size=16), st.sampled_from([0o644, 0o666, 0o755, 0o777, 0o600])),
                        min_size=1, max_size=5)


def _build_tree(files):
    def build(tmp: Path) -> None:
        for name, (data, mode) in files.items():
            p = tmp / name
            if p.parent.exists() and not p.parent.is_dir():
                continue
            if p.is_dir():
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, mode)
            os.chmod(p.parent, 0o777)
    return build


@settings(max_examples=25)
@given(files=FILES)
def test_entries_are_private(tmp_path_factory, files):
    """Whatever modes a build leaves, the published entry is the user's, directories 0700 and files
    0600 (0700 when executable), and it is accepted on the next look-up."""
    root = tmp_path_factory.mktemp("cache")
    key = cache.content_key(repr(sorted(files)))
    final = cache.entry("k", key, _build_tree(files), root=root)
    for dirpath, dirnames, filenames in os.walk(final):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700
        for f in filenames:
            st_ = os.stat(os.path.join(dirpath, f))
            assert st_.st_uid == os.geteuid()
            assert stat.S_IMODE(st_.st_mode) in (0o600, 0o700)
    assert stat.S_IMODE(os.stat(root / "k").st_mode) == 0o700
    again = cache.entry("k", key, lambda tmp: pytest.fail("rebuilt a good entry"), root=root)
    assert again == final


def _entry(root: Path) -> tuple[Path, str]:
    key = cache.content_key("trust")

    def build(tmp: Path) -> None:
        (tmp / "sub").mkdir()
        (tmp / "module.so").write_bytes(b"\x7fELF code")
        (tmp / "sub" / "x.h").write_text("header")
    return cache.entry("k", key, build, root=root), key


@pytest.mark.parametrize("part", ["root", "kind", "entry", "file", "subdir", "nested"])
@pytest.mark.parametrize("bits", [0o002, 0o020])
def test_entries_writable_by_others_are_refused(tmp_path, part, bits):
    root = tmp_path / "cache"
    final, key = _entry(root)
    target = {"root": root, "kind": root / "k", "entry": final, "file": final / "module.so",
              "subdir": final / "sub", "nested": final / "sub" / "x.h"}[part]
    if bits == 0o020 and private_group(os.stat(target).st_gid):
        pytest.skip("the user's private group may write (util/trust.py): needs another group")
    os.chmod(target, stat.S_IMODE(os.stat(target).st_mode) | bits)
    with pytest.raises(cache.CacheTrustError, match="writable by (others|its group).*refusing") as info:
        cache.entry("k", key, lambda tmp: pytest.fail("must not rebuild over it"), root=root)
    assert str(target) in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("part", ["root", "entry", "file"])
def test_entries_of_other_users_are_refused(tmp_path, part):
    root = tmp_path / "cache"
    final, key = _entry(root)
    target = {"root": root, "entry": final, "file": final / "module.so"}[part]
    os.chown(target, 65534, 65534)
    with pytest.raises(cache.CacheTrustError, match="owned by uid 65534, not by you"):
        cache.entry("k", key, lambda tmp: pytest.fail("must not rebuild over it"), root=root)


def test_symlinked_entry_is_refused(tmp_path):
    root = tmp_path / "cache"
    elsewhere = tmp_path / "planted"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / ".complete").write_text("x")
    (elsewhere / "module.so").write_bytes(b"evil")
    key = cache.content_key("symlink")
    (root / "k").mkdir(parents=True, mode=0o700)
    (root / "k" / key).symlink_to(elsewhere)
    with pytest.raises(cache.CacheTrustError, match="not a directory"):
        cache.entry("k", key, lambda tmp: None, root=root)


def test_shared_parent_without_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)     # someone else's world-writable directory
    else:
        pytest.skip("needs a directory owned by another user")
    with pytest.raises(cache.CacheTrustError, match="without the sticky bit"):
        cache.cache_root(shared / "hccc")


def test_new_root_is_private(tmp_path):
    root = cache.cache_root(tmp_path / "a" / "hccc")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def test_stale_build_directories_are_removed(tmp_path):
    root = tmp_path / "cache"
    _entry(root)
    base = root / "k"
    old = base / ".deadbeef00000000-killed"
    old.mkdir()
    (old / "half.o").write_bytes(b"x")
    past = time.time() - 60
    os.utime(old, (past, past))
    young = base / ".deadbeef00000000-young"       # a build that just started
    young.mkdir()
    held = base / ".deadbeef00000000-held"         # a build in progress
    held.mkdir()
    os.utime(held, (past, past))
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        cache.entry("k", cache.content_key("another"), lambda tmp: (tmp / "m").write_text("m"), root=root)
    finally:
        os.close(fd)
    assert not old.exists()
    assert young.exists() and held.exists()


@pytest.mark.slow   # a minute of the default run went to a few CLI and random-cluster runs
def test_run_command_refuses_untrusted_entry(tmp_path):
    """End to end: a compiled CPU module that others can write is not loaded; ``hccc run`` says
    why, exit 1, no traceback."""
    env = dict(os.environ, HCCC_CACHE_DIR=str(tmp_path / "cache"), HCCC_DEBUG="")
    algo = ROOT / "examples" / "ring_allgather_8.rccl"
    cmd = [sys.executable, "-m", "hccc.cli", "run", str(algo), "--backend", "cpu", "--bytes", "4K"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    modules = list((tmp_path / "cache" / "cpu").glob("*/module.so"))
    assert len(modules) == 1
    os.chmod(modules[0], 0o666)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 1
    assert "writable by others" in second.stderr and str(modules[0]) in second.stderr
    assert "Traceback" not in second.stderr


@settings(max_examples=30, deadline=None)
@given(names=st.lists(st.sampled_from(["a.so", "b.o", "c.json", "d.gch"]), min_size=1, max_size=4, unique=True),
       gone=st.sets(st.integers(0, 3)), bad=st.sets(st.integers(0, 3)))
def test_the_trust_walk_passes_over_what_vanishes_and_still_refuses_what_stays(tmp_path_factory, names, gone, bad):
    """A file renamed or removed between the walk's listing and its look (another of the user's
    processes replacing a cache file) holds nothing to load: the walk passes over it; a file
    writable by others that is still there is refused all the same."""
    from hccc.util.trust import CacheTrust, UntrustedCacheError
    top = tmp_path_factory.mktemp("tree")
    os.chmod(top, 0o700)
    for i, name in enumerate(names):
        (top / name).write_bytes(b"x")
        os.chmod(top / name, 0o666 if i in bad else 0o600)
    vanish = {top / n for i, n in enumerate(names) if i in gone}
    trust = CacheTrust("test cache", "TEST_DIR")
    real = CacheTrust.owned

    def owned(self, path, what, *, directory):
        if Path(path) in vanish:
            os.unlink(path)
        return real(self, path, what, directory=directory)
    refused = any(i in bad and i not in gone for i in range(len(names)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CacheTrust, "owned", owned)
        if refused:
            with pytest.raises(UntrustedCacheError, match="writable by others"):
                trust.tree(top, "cache entry")
        else:
            trust.tree(top, "cache entry")
