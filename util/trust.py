"""The one rule for what hccc loads from disk caches: only the user's own, private files.

A cache holds things that are loaded into the process as code (the build cache's shared libraries,
whose constructors run on load; numba's cache, whose index and objects are unpickled), so a file
someone else could have written there would run as the user. Every cache hccc reads is held to
:class:`CacheTrust`'s rule before anything in it is read:

- the cache's directory, and every directory and file in it that is read, is a real directory /
  regular file (not a symbolic link), owned by the user and writable by nobody else (no other
  write bit, no group write bit unless the group is the user's private group:
  :func:`private_group`, as under the umask 002 of user-private-group systems);
- every directory above it (the whole path, symbolic links resolved) is owned by the user or by
  root, and is writable by others (so counted) only with the sticky bit (``/tmp``), so nobody else
  can rename a directory on the way and put one of their own in its place.

Anything else is refused with an error (the cache's :attr:`CacheTrust.error` class) that names the
path and the reason and says how to point the cache somewhere private. Nothing is unpickled from a
place that fails the rule: hccc's own parsers keep no disk cache at all (lark builds their tables
from the grammar text once per process).
"""
from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hccc.util.limits import printable


class UntrustedCacheError(Exception):
    """A cache path hccc refuses to read: not the user's, or writable by others."""


@dataclass(frozen=True)
class CacheTrust:
    """The trust rule applied to one cache: ``label`` names it in messages (``build cache``),
    ``variable`` is the environment variable that moves it, ``error`` the exception raised."""
    label: str
    variable: str
    error: type[Exception] = UntrustedCacheError

    def _refuse(self, text: str) -> Exception:
        return self.error(f"{self.label}: {text}; refusing to use it, since its contents would be "
                          f"loaded as code (remove it, or set {self.variable} to a directory of your own)")

    def owned(self, path: Path, what: str, *, directory: bool) -> os.stat_result:
        """``path`` (not followed if a symbolic link) is a directory / regular file of the user's,
        writable by nobody else; its stat."""
        st = os.lstat(path)
        shown = printable(str(path))
        kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
        if not kind_ok:
            raise self._refuse(f"{what} '{shown}' is not a {'directory' if directory else 'regular file'} "
                               "(a symbolic link or something else)")
        if st.st_uid != os.geteuid():
            raise self._refuse(f"{what} '{shown}' is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
        if writable_by_others(st):
            raise self._refuse(f"{what} '{shown}' is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                               f"(mode {stat.S_IMODE(st.st_mode):04o})")
        return st

    def path_above(self, path: Path) -> None:
        """Every directory above ``path`` (symbolic links resolved) is the user's or root's, and
        writable by others only with the sticky bit."""
        real = Path(os.path.realpath(path))
        for parent in real.parents:
            try:
                st = os.stat(parent)
            except OSError:
                continue
            shown = printable(str(parent))
            if writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
                raise self._refuse(f"the directory '{shown}' above '{printable(str(path))}' is writable by "
                                   f"{'others' if st.st_mode & 0o002 else 'its group'} without the sticky bit "
                                   f"(mode {stat.S_IMODE(st.st_mode):04o}), so they could replace what is below it")
            if st.st_uid not in (0, os.geteuid()):
                raise self._refuse(f"the directory '{shown}' above '{printable(str(path))}' is owned by uid "
                                   f"{st.st_uid}, neither you (uid {os.geteuid()}) nor root, who could replace "
                                   "what is below it")

    def tree(self, top: Path, what: str) -> None:
        """``top`` and every directory and file in it are the user's and writable by nobody else.
        What vanishes between the listing and its look (another of the user's processes renamed
        or removed it: a cache file replaced, an entry moved aside) holds nothing to load and is
        passed over; only the user can change what a checked directory holds."""
        self.owned(top, what, directory=True)
        for dirpath, dirnames, filenames in os.walk(top):
            for names, kind, directory in ((dirnames, "directory", True), (filenames, "file", False)):
                for name in names:
                    try:
                        self.owned(Path(dirpath) / name, f"{what} {kind}", directory=directory)
                    except FileNotFoundError:
                        continue

    @staticmethod
    def tighten(top: Path, *, files: bool = True) -> None:
        """Take the group and other write bits off ``top`` and (with ``files``) the regular files
        directly in it that are the user's (what a tool that writes with the user's umask, numba, left there;
        under a umask of 002 they would be group-writable). Others' files are left as they are:
        :meth:`directory` refuses them."""
        for path in [top] + ([Path(e.path) for e in _entries(top)] if files else []):
            try:
                st = os.lstat(path)
                if st.st_uid == os.geteuid() and st.st_mode & 0o022 and (stat.S_ISDIR(st.st_mode)
                                                                        or stat.S_ISREG(st.st_mode)):
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
            except OSError:
                continue

    def directory(self, top: Path, what: str) -> None:
        """The whole rule for the cache directory ``top``: the path above it, it, and everything
        in it."""
        self.path_above(top)
        self.tree(top, what)


def writable_by_others(st: os.stat_result) -> bool:
    """Someone besides the user may write the file or directory of ``st``: it is writable by
    others, or by a group that is not the user's private group (:func:`private_group`)."""
    return bool(st.st_mode & 0o002) or bool(st.st_mode & 0o020) and not private_group(st.st_gid)


@functools.lru_cache(maxsize=None)
def private_group(gid: int) -> bool:
    """``gid`` is the user's private group (the user-private-group scheme of many Linux systems,
    whose default umask 002 makes files group-writable): the user's own primary group, named as
    the user, with no member but the user (never root's group 0, whose members vary). Only such a
    group's write bit is not someone else's."""
    if gid == 0:
        return False
    try:
        import grp
        import pwd
        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError, OSError):
        return False
    return (gid == me.pw_gid and group.gr_name == me.pw_name
            and all(member == me.pw_name for member in group.gr_mem))


def _entries(top: Path) -> list:
    try:
        return list(os.scandir(top))
    except OSError:
        return []


__all__ = ["CacheTrust", "UntrustedCacheError", "writable_by_others", "private_group"]
