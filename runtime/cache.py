"""Build cache keyed by content hash: generated sources and compiled modules are made once.

An entry is a directory ``ROOT/KIND/KEY`` whose name is the SHA-256 of everything that determines
its contents (IR JSON, templates, platform, instance, compiler and flags, hccc version). It is
built in a private temporary directory next to it and published with one atomic ``rename``.
Processes that want the same missing entry at once (the ranks of one job, each in its own process,
all needing the same launcher object and precompiled headers) take turns on a per-key lock file
(``KIND/.KEY.lock``): the first builds, the others wait for it and use its entry instead of
building copies of their own (after :data:`LOCK_WAIT_S` without the lock a process builds anyway;
one that still loses the race discards its copy and uses the winner's). Published entries are
never modified, so readers need no locks.

Integrity: the marker ``.complete``, written last, records the key and every file's size and
SHA-256, and the entry's files and directories are fsynced before the rename that publishes it
(the kind directory after it). Before an entry is used it is verified against its marker (hashed
once per process while its files keep their inodes, sizes and change times); one that differs (a
crash or power loss that left a file short, a file zeroed or changed, missing or extra, a damaged
or missing marker) is moved aside, removed and built again, so a damaged library is never loaded.

``ROOT`` is ``$HCCC_CACHE_DIR`` when set, else the platform's user cache directory for hccc as
``platformdirs`` gives it (``$XDG_CACHE_HOME/hccc``, by default ``~/.cache/hccc``, on Linux;
``~/Library/Caches/hccc`` on macOS).

Trust: an entry holds code that is loaded into the process (a shared library's constructors run
on load), so only the user's own entries are used, by the rule every cache of hccc follows
(:mod:`hccc.util.trust`). Directories are created 0700 and files 0600; before an entry is used,
the root, its kind directory, the entry and every file in it must be owned by the user and
writable by nobody else, and every directory above the root must be the user's or root's and not
let others replace what is below it (writable by others only with the sticky bit). Anything else
is refused with a :class:`CacheTrustError` that names the path and the reason; nothing in it is
loaded.

Temporary build directories are held under an ``flock`` while in use; those of killed runs (not
held, older than a few seconds, owned by the user) are removed the next time an entry is built.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import platformdirs

from hccc import __version__
from hccc.util.durable import fsync_path, sync_tree
from hccc.util.limits import printable
from hccc.util.trust import CacheTrust, UntrustedCacheError
from hccc.runtime.platform import PlatformError

#: marker written last into an entry: a directory without it is not a finished entry
_DONE = ".complete"


#: a temporary build directory younger than this is never taken for a killed run's leftover
STALE_AFTER_S = 1.0
#: how long a process waits for another's build of the same entry before building its own copy
LOCK_WAIT_S = 600.0


class CacheTrustError(PlatformError, UntrustedCacheError):
    """A cache path hccc refuses to use: not the user's, or writable by others."""


#: the rule every entry is held to before it is used (:mod:`hccc.util.trust`)
TRUST = CacheTrust("build cache", "HCCC_CACHE_DIR", CacheTrustError)


def _check_owned(path: Path, what: str, *, directory: bool) -> os.stat_result:
    """``path`` (not followed if a symbolic link) must be a directory / regular file of the user's,
    writable by nobody else."""
    return TRUST.owned(path, what, directory=directory)


def check_root(root: Path) -> None:
    """The cache root must be the user's and writable by nobody else, and nobody else may be able
    to replace it: every directory above it is the user's or root's, writable by others only with
    the sticky bit."""
    TRUST.owned(root, "cache directory", directory=True)
    TRUST.path_above(root)


def check_entry(final: Path) -> None:
    """Every part of the published entry ``final`` is the user's and writable by nobody else."""
    TRUST.tree(final, "cache entry")


def _usable(final: Path, key: str) -> bool:
    """The published entry ``final`` is trusted (:func:`check_entry`, whose refusal propagates) and
    whole (:func:`intact`). An entry that vanishes while it is looked at (moved aside by another
    process that found it damaged, which then builds it again in its turn) is not usable: the
    caller takes its turn and finds the new one, instead of failing on the missing file."""
    try:
        check_entry(final)
    except FileNotFoundError:
        return False
    return intact(final, key)


def _make_private(tmp: Path) -> None:
    """Directories 0700, files 0600 (executables keep an owner-only execute bit)."""
    for dirpath, dirnames, filenames in os.walk(tmp):
        os.chmod(dirpath, 0o700)
        for f in filenames:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, 0o700 if st.st_mode & 0o100 else 0o600)


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def clean_stale_builds(base: Path, *, min_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary build directories (``.KEY-XXXX``) that killed runs left in ``base``:
    the user's, not held by a live build, older than ``min_age_s``. Returns what was removed."""
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith("."):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < min_age_s
                or _held(Path(e.path))):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(Path(e.path))
    return removed


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """The cache root (created 0700 if missing; checked: see the module docstring)."""
    if override is not None:
        root = Path(override)
    elif os.environ.get("HCCC_CACHE_DIR"):
        root = Path(os.environ["HCCC_CACHE_DIR"])
    else:
        root = Path(platformdirs.user_cache_dir("hccc", appauthor=False))
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
    check_root(root)
    return root


def content_key(*parts: str | bytes | int | float | None) -> str:
    """SHA-256 over ``parts`` (each length-prefixed, so boundaries cannot be confused) and the
    hccc version."""
    h = hashlib.sha256()
    for part in (f"hccc {__version__}",) + parts:
        b = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def files_digest(paths: Iterable[Path], root: Path | None = None) -> str:
    """SHA-256 of the names (relative to ``root``) and contents of ``paths``, order-independent."""
    h = hashlib.sha256()
    items = []
    for p in paths:
        p = Path(p)
        name = str(p.relative_to(root)) if root is not None else p.name
        items.append((name, p))
    for name, p in sorted(items):
        data = p.read_bytes()
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


_COMPILER_DIGEST: list[str] = []


def compiler_digest() -> str:
    """SHA-256 of the compiler's Python sources (the ``compiler`` package, read once a process):
    part of the key of a cached *program* (a ProgramIR the compiler wrote, such as the torch
    backend's built-in catalog entries), so that a changed compiler never reuses a program an
    older one wrote under the same version number (a development tree, an editable install)."""
    if not _COMPILER_DIGEST:
        import hccc.compiler as compiler
        top = Path(compiler.__file__).resolve().parent
        _COMPILER_DIGEST.append(files_digest(sorted(top.rglob("*.py")) + sorted(top.rglob("*.lark")), root=top))
    return _COMPILER_DIGEST[0]


def entry(kind: str, key: str, build: Callable[[Path], None], *,
          root: str | os.PathLike | None = None) -> Path:
    """The directory of cache entry ``kind/key``, running ``build(tmpdir)`` to fill it if missing.

    ``build`` writes into an empty private directory; exceptions propagate and leave nothing behind.
    """
    if not key or any(c not in "0123456789abcdef" for c in key):
        raise ValueError("cache keys are lower-case hex digests")
    if not kind.isidentifier():
        raise ValueError(f"bad cache kind {kind!r}")
    base = cache_root(root) / kind
    final = base / key
    if os.path.lexists(base):
        _check_owned(base, "cache directory", directory=True)
    if (os.path.lexists(final / _DONE) or os.path.islink(final)) and _usable(final, key):
        return final
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    _check_owned(base, "cache directory", directory=True)
    turn = _take_turn(base / f".{key}.lock")
    try:
        if os.path.lexists(final):
            if _usable(final, key):
                # built by the process whose turn it was while this one waited
                return final
            # damaged (a crash or power loss before its files reached the disk, a file cut short
            # or changed) or never finished: moved aside, removed, and built again
            _discard(base, key, final)
        return _build(base, key, final, build)
    finally:
        if turn is not None:
            _end_turn(base / f".{key}.lock", turn)


#: the entries this process has verified, by path: what their files' stats were then (an entry
#: is hashed once per process while its files keep their inodes, sizes and change times)
_VERIFIED: dict[str, tuple] = {}
#: a marker larger than this is not one hccc wrote (its manifest is a line per file)
MAX_MARKER_BYTES = 1 << 22


def _stats(final: Path) -> tuple:
    """(relative path, inode, size, change time) of every file in the entry, sorted (the change
    time moves with every write, and nobody can set it back)."""
    out = []
    for dirpath, _dirs, filenames in os.walk(final):
        for f in filenames:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            out.append((os.path.relpath(p, final), st.st_ino, st.st_size, st.st_ctime_ns))
    return tuple(sorted(out))


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(tmp: Path) -> dict[str, list]:
    """Every file of a built entry: relative path -> [size, SHA-256]."""
    files = {}
    for dirpath, _dirs, filenames in os.walk(tmp):
        for f in filenames:
            p = os.path.join(dirpath, f)
            files[os.path.relpath(p, tmp)] = [os.lstat(p).st_size, _file_sha256(p)]
    return files


def intact(final: Path, key: str) -> bool:
    """The published entry ``final`` is whole: its marker names ``key`` and lists exactly the
    entry's files, each of the size and SHA-256 recorded when it was built."""
    try:
        stats = _stats(final)
        if _VERIFIED.get(str(final)) == stats:
            return True
        marker = final / _DONE
        if os.lstat(marker).st_size > MAX_MARKER_BYTES:
            return False
        record = json.loads(marker.read_text(encoding="utf-8"))
        files = record["files"]
        if record.get("key") != key or not isinstance(files, dict):
            return False
        present = {rel: size for rel, _ino, size, _ctime in stats if rel != _DONE}
        if set(present) != set(files):
            return False
        for rel, size in present.items():
            want = files[rel]
            if not (isinstance(want, list) and len(want) == 2 and want[0] == size):
                return False
        for rel in present:
            if _file_sha256(str(final / rel)) != files[rel][1]:
                return False
        if _stats(final) != stats:
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    _VERIFIED[str(final)] = stats
    return True


def _discard(base: Path, key: str, final: Path) -> None:
    """Move the damaged entry ``final`` out of the way (one rename: nobody finds half of it) and
    remove it."""
    _VERIFIED.pop(str(final), None)
    aside = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=base))
    try:
        os.rename(final, aside / "damaged")
    except FileNotFoundError:
        pass
    shutil.rmtree(aside, ignore_errors=True)


def _take_turn(path: Path) -> int | None:
    """The per-key lock file ``path`` opened and locked (the caller builds, or uses what the
    previous holder built); None where it cannot be had: not a regular file of the user's, or
    still held by another build after :data:`LOCK_WAIT_S` (then the caller builds a copy)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    deadline = time.monotonic() + LOCK_WAIT_S
    pause = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _end_turn(path: Path, fd: int) -> None:
    """Remove the lock file (a waiter that opened it before finds the entry published, or builds
    it itself if the build failed) and release it."""
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def _build(base: Path, key: str, final: Path, build: Callable[[Path], None]) -> Path:
    """Build the entry in a private temporary directory and publish it as ``final``."""
    clean_stale_builds(base)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=base))
    lock = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        build(tmp)
        _make_private(tmp)
        marker = tmp / _DONE
        if os.path.lexists(marker):
            raise ValueError(f"a build of cache kind {base.name} wrote its own {_DONE}")
        record = json.dumps({"key": key, "files": _manifest(tmp)}, sort_keys=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(record + "\n")
        # durable before it is visible: a crash or power loss after the rename finds every file
        # whole (and a damaged entry is rebuilt anyway: :func:`intact`)
        sync_tree(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # another process published the same key first (rename onto a non-empty directory
            # fails): use the winner's entry
            if not os.path.lexists(final / _DONE):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            if not _usable(final, key):
                raise PlatformError(f"build cache: the entry '{printable(str(final))}' another process "
                                    "published is damaged; remove it and run again") from None
            return final
        fsync_path(base, directory=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    return final


__all__ = ["cache_root", "content_key", "files_digest", "entry", "intact", "CacheTrustError", "check_root",
           "check_entry", "clean_stale_builds", "STALE_AFTER_S", "LOCK_WAIT_S"]
