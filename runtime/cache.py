"""Build cache keyed by content hash: generated sources and compiled modules are made once.

An entry is a directory ``ROOT/KIND/KEY`` whose name is the SHA-256 of everything that determines
its contents (IR JSON, templates, platform, instance, compiler and flags, hccc version). It is
built in a private temporary directory next to it and published with one atomic ``rename``; a
process that loses the race (another pytest-xdist worker published the same key first) discards
its copy and uses the winner's. Published entries are never modified, so readers need no locks.

``ROOT`` is ``$HCCC_CACHE_DIR`` when set, else the platform's user cache directory for hccc as
``platformdirs`` gives it (``$XDG_CACHE_HOME/hccc``, by default ``~/.cache/hccc``, on Linux;
``~/Library/Caches/hccc`` on macOS).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import platformdirs

from hccc import __version__

#: marker written last into an entry: a directory without it is not a finished entry
_DONE = ".complete"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """The cache root (created if missing)."""
    if override is not None:
        root = Path(override)
    elif os.environ.get("HCCC_CACHE_DIR"):
        root = Path(os.environ["HCCC_CACHE_DIR"])
    else:
        root = Path(platformdirs.user_cache_dir("hccc", appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
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
    if (final / _DONE).is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=base))
    try:
        build(tmp)
        (tmp / _DONE).write_text(key + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            # another process published the same key first (rename onto a non-empty directory
            # fails): use the winner's entry
            if not (final / _DONE).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


__all__ = ["cache_root", "content_key", "files_digest", "entry"]
