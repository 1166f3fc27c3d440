"""Atomic output directories: a failed run leaves nothing behind, a good run replaces the old output.

Single files (``write_text_atomically``) follow the same rule: written beside the target, renamed into
place, removed on failure. Files are written into a fresh temporary sibling of OUTDIR; only when everything succeeded is it renamed
into place. An existing OUTDIR is replaced only when it is empty or was written by hccc (it holds
``manifest.json``), so a typo in ``-o`` cannot wipe an unrelated directory.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from hccc.compiler.frontend.diagnostics import CompileError, Diagnostic

MARKER = "manifest.json"


def _refuse(msg: str) -> CompileError:
    return CompileError([Diagnostic(msg, None)])


@contextmanager
def atomic_output_dir(outdir: str | Path):
    """Yield a temporary directory; on success it becomes ``outdir``, on any error it is removed."""
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise _refuse(f"output path '{out}' exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise _refuse(f"output directory '{out}' is not empty and was not written by hccc "
                      f"(no {MARKER}); refusing to overwrite it")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as exc:
        raise _refuse(f"cannot create output directory '{out}': {exc.strerror or exc}") from None
    try:
        yield tmp
        for f in tmp.rglob("*"):  # nothing may escape the directory (defence in depth)
            if f.is_symlink() or not f.resolve().is_relative_to(tmp.resolve()):
                raise _refuse(f"refusing to publish '{f.name}': it points outside the output directory")
        os.chmod(tmp, 0o755)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "d")
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old / "d", out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and a rename: a failed write leaves an
    existing file untouched and no partial file behind. Failures are CompileErrors for the user."""
    path = Path(path).resolve()
    if not path.parent.is_dir():
        raise CompileError([Diagnostic(f"cannot write '{path}': directory '{path.parent}' does not exist", None)])
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise CompileError([Diagnostic(f"cannot write '{path}': {exc.strerror or exc}", None)]) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CompileError([Diagnostic(f"cannot write '{path}': {exc.strerror or exc}", None)]) from None
        raise
