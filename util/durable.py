"""Durable publishing: files and directories flushed to disk before the rename that publishes them.

A rename is atomic but not durable by itself: after a crash or a power loss, a file renamed into
place may be there with no data (the rename reached the disk, the data blocks did not). Everything
hccc publishes by a rename (the build cache's entries, ``hccc ... -o OUTDIR``, single output
files) is therefore fsynced first, and the directory that holds the new name after.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def fsync_path(path: str | os.PathLike, directory: bool = False) -> None:
    """``path`` (a regular file, or a directory with ``directory``) flushed to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(top: str | os.PathLike) -> None:
    """Every regular file and directory under ``top`` (and ``top``) flushed to disk, deepest first."""
    for dirpath, _dirs, filenames in os.walk(top, topdown=False):
        for f in filenames:
            p = os.path.join(dirpath, f)
            if stat.S_ISREG(os.lstat(p).st_mode):
                fsync_path(p)
        fsync_path(dirpath, directory=True)


def sync_parent(path: str | os.PathLike) -> None:
    """The directory holding ``path`` flushed to disk (after a rename into it)."""
    fsync_path(Path(os.path.abspath(path)).parent, directory=True)
