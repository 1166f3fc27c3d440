"""Output files and directories: a failed run leaves nothing behind, a good run replaces only what
hccc itself wrote before, and nothing of the user's is ever lost.

Directories (:func:`atomic_output_dir`): everything is written into a fresh temporary sibling
``.NAME.tmp-XXXX`` first. Only when all of it succeeded is it published:

- OUTDIR missing: the temporary directory is renamed into place (one atomic step).
- OUTDIR exists: it must be empty or hold an hccc manifest (``manifest.json`` with hccc's manifest
  ``schema`` and ``generator``; a ``manifest.json`` of any other tool does not count). Its ``files``
  list names what that earlier run wrote; only those files are replaced or removed, file by file
  (each an atomic rename), everything else in the directory (a user's build outputs, notes) stays.
  A new file that would overwrite a file hccc did not write is refused before anything changes.
  The directory itself is never renamed, so ``-o .``, mount points and directories a shell sits in
  work. The manifest is replaced last; while files move, a provisional manifest lists the old and
  the new files, so a run killed half-way leaves a directory the next run can still clean.

Single files (:func:`write_text_atomically`, :func:`check_output_file`): the target must be a new
path or a regular file (never a device, FIFO, socket, directory or symbolic link: ``-o /dev/full``
is refused, not replaced); the text goes to a temporary sibling ``.NAME.tmp-XXXX`` that is renamed
into place.

Temporaries are held under an exclusive ``flock`` while in use; :func:`clean_stale_siblings`
removes those of killed runs (``.NAME.tmp-*`` / ``.NAME.old-*`` that nobody holds, owned by the
user) the next time the same output is written.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.util.durable import fsync_path, sync_parent, sync_tree
from hccc.util.limits import printable

MARKER = "manifest.json"
#: the ``schema`` of hccc's manifests (written by :mod:`hccc.compiler.backend.codegen`)
MANIFEST_SCHEMA = "hccc.manifest/1"
#: names hccc writes into an output directory: plain file names, no paths
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_MANIFEST_MAX_BYTES = 64 << 20


def _refuse(msg: str) -> CompileError:
    return CompileError([Diagnostic(msg, None)])


def _show(p) -> str:
    return printable(str(p))


# --------------------------------------------------------------------------- locks and stale files
def _lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _held(path: Path) -> bool:
    """True when some live process holds ``path`` (a temporary of a run in progress)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return True      # cannot tell: leave it alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)     # closing drops the probe's lock
    return False


def clean_stale_siblings(target: Path, *, kinds: tuple[str, ...] = ("tmp", "old")) -> list[Path]:
    """Remove ``.NAME.tmp-*`` / ``.NAME.old-*`` next to ``target`` that a killed run left: owned by
    this user and not locked by a live process. Returns what was removed."""
    parent = target.parent
    name = target.name
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    prefixes = tuple(f".{name}.{k}-" for k in kinds)
    for e in entries:
        if not e.name.startswith(prefixes):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.getuid() or stat.S_ISLNK(st.st_mode) or _held(Path(e.path)):
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            try:
                os.unlink(e.path)
            except OSError:
                continue
        removed.append(Path(e.path))
    return removed


# --------------------------------------------------------------------------- hccc's manifests
def manifest_files(outdir: Path) -> tuple[set[str] | None, str]:
    """The files an earlier hccc run wrote into ``outdir``, from its manifest, or ``(None, why)``
    when ``outdir/manifest.json`` is not an hccc manifest."""
    from hccc.util.limits import loads_json, read_input_bytes
    from hccc.util.diagnostics import SourceFile

    mpath = outdir / MARKER
    try:
        if not stat.S_ISREG(os.lstat(mpath).st_mode):
            return None, f"its {MARKER} is not a regular file"
        data = loads_json(SourceFile.from_bytes(str(mpath), read_input_bytes(mpath, limit=_MANIFEST_MAX_BYTES)))
    except FileNotFoundError:
        return None, f"it has no {MARKER}"
    except (OSError, CompileError):
        return None, f"its {MARKER} is not readable JSON"
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA \
            or not str(data.get("generator", "")).startswith("hccc "):
        return None, f"its {MARKER} is not an hccc manifest (schema '{MANIFEST_SCHEMA}')"
    files = data.get("files")
    if files is None:   # manifests of earlier versions: the names the manifest mentions
        files = list(_strings(data)) + ["CMakeLists.txt", "Makefile"]
    elif not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None, f"its {MARKER} has a malformed 'files' list"
    owned = {f for f in files if _PLAIN.fullmatch(f) and f not in (".", "..")}
    owned.add(MARKER)
    return owned, ""


def _strings(obj, depth: int = 0):
    if depth > 8:
        return
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v, depth + 1)


def _entries(d: Path) -> dict[str, os.stat_result]:
    return {e.name: e.stat(follow_symlinks=False) for e in os.scandir(d)}


def _input_ids(inputs) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(device, inode) of every file among ``inputs`` (symbolic links followed), and of every
    directory among them (an OUTDIR read as an input: every file in it is read)."""
    files, dirs = set(), set()
    for inp in inputs or ():
        if inp is None or str(inp) == "-":
            continue
        try:
            st = os.stat(inp)
        except (OSError, ValueError):
            continue
        (dirs if stat.S_ISDIR(st.st_mode) else files).add((st.st_dev, st.st_ino))
    return files, dirs


def _check_inputs_kept(out: Path, owned: set[str], inputs) -> None:
    """Refuse when a file the run would replace or remove (``owned``: every file the earlier hccc
    run wrote, each replaced by the new one of the same name or removed as stale) is one of the
    command's ``inputs``, under any name: a hard link, a symbolic link, another spelling."""
    files, dirs = _input_ids(inputs)
    if not files and not dirs:
        return
    try:
        ost = os.stat(out)
    except OSError:
        return
    if (ost.st_dev, ost.st_ino) in dirs and owned:
        raise _refuse(f"output directory '{_show(out)}' is an input of this command; hccc does not "
                      "replace or remove what it reads (choose another output directory)")
    for name in sorted(owned):
        try:
            st = os.lstat(out / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in files:
            raise _refuse(f"'{_show(out / name)}' is an input of this command and a file the earlier hccc "
                          f"run wrote into '{_show(out)}', which this run replaces or removes; hccc does "
                          "not replace or remove what it reads (choose another output directory, or move "
                          "the input out of it first)")


def check_output_dir(outdir: str | Path, inputs=()) -> None:
    """Before any work: refuse an output directory hccc may not write into (a file, a foreign
    non-empty directory) or whose writing would replace or remove one of ``inputs``."""
    out = Path(os.path.abspath(outdir))
    try:
        st = os.stat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _refuse(f"cannot use output path '{_show(outdir)}': {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(f"output path '{_show(outdir)}' exists and is not a directory")
    _plan(out, set(), inputs)


def _plan(out: Path, new: set[str], inputs=()) -> set[str]:
    """Check that ``new`` files may be published into the existing directory ``out``; returns the
    names the earlier hccc run owns there (to be replaced or removed). Raises before any change,
    also when one of them is one of the command's ``inputs``."""
    try:
        present = _entries(out)
    except OSError as exc:
        raise _refuse(f"cannot read output directory '{_show(out)}': {exc.strerror or exc}") from None
    if not present:
        return set()
    owned, why = manifest_files(out)
    if owned is None:
        raise _refuse(f"output directory '{_show(out)}' is not empty and was not written by hccc ({why}); "
                      "refusing to write into it")
    _check_inputs_kept(out, owned & set(present), inputs)
    for name in sorted(new):
        st = present.get(name)
        if st is None:
            continue
        if name not in owned:
            raise _refuse(f"output directory '{_show(out)}' already has '{_show(name)}', which the earlier "
                          f"hccc run did not write (its {MARKER} does not list it); refusing to replace it")
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(f"'{_show(out / name)}' is not a regular file; refusing to replace it")
    return {n for n in owned if n in present and stat.S_ISREG(present[n].st_mode)}


def _publish_into(tmp: Path, out: Path, new: set[str], owned: set[str]) -> None:
    """Move ``tmp``'s files into ``out`` one by one, the manifest last; remove owned leftovers."""
    man = tmp / MARKER
    if man.is_file():   # first: a run killed while files move leaves a directory the next run can clean
        try:
            provisional = json.loads(man.read_text(encoding="utf-8"))
            provisional["files"] = sorted(owned | new)
            fd, ptmp = tempfile.mkstemp(prefix=f".{MARKER}.tmp-", dir=out)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(provisional, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(ptmp, 0o644)
            os.replace(ptmp, out / MARKER)
        except (OSError, ValueError) as exc:
            raise _refuse(f"cannot update '{_show(out / MARKER)}': {getattr(exc, 'strerror', None) or exc}") from None
    for name in sorted(new - {MARKER}):
        os.replace(tmp / name, out / name)
    for name in sorted(owned - new):
        try:
            if stat.S_ISREG(os.lstat(out / name).st_mode):
                os.unlink(out / name)
        except OSError:
            pass
    if MARKER in new:
        os.replace(tmp / MARKER, out / MARKER)


@contextmanager
def atomic_output_dir(outdir: str | Path, inputs=()):
    """Yield a temporary directory; on success its files are published into ``outdir`` (see the
    module docstring); on any error it is removed and ``outdir`` is untouched. ``inputs``: the
    paths the command read; no file of the earlier run that is one of them is replaced or removed
    (refused, before any change)."""
    out = Path(os.path.abspath(outdir))
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _refuse(f"cannot use output path '{_show(outdir)}': {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise _refuse(f"output path '{_show(outdir)}' exists and is not a directory")
    if st is not None:
        _plan(out, set(), inputs)  # refuse a foreign directory, or one holding an input, before any work
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        clean_stale_siblings(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as exc:
        raise _refuse(f"cannot create output directory '{_show(outdir)}': {exc.strerror or exc}") from None
    lock = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        _lock(lock)
        yield tmp
        new = set()
        for f in tmp.iterdir():   # nothing may escape the directory (defence in depth)
            if f.is_symlink() or not f.is_file():
                raise _refuse(f"refusing to publish '{_show(f.name)}': not a regular file")
            new.add(f.name)
        os.chmod(tmp, 0o755)
        sync_tree(tmp)                  # the files' data on disk before any rename publishes them
        if os.path.isdir(out):
            owned = _plan(out, new, inputs)
            _publish_into(tmp, out, new, owned)
            fsync_path(out, directory=True)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.rename(tmp, out)
            sync_parent(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _refuse(f"cannot write output directory '{_show(outdir)}': {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)


# --------------------------------------------------------------------------- single files
def check_output_file(path: str | Path, inputs=()) -> Path:
    """Refuse an output file path that is not a new path or a regular file, or that is one of the
    command's ``inputs`` (paths it reads; ``-`` and None are skipped) under any name (before any
    work is done for it: ``hccc synth c.topo -o c.topo`` would replace the cluster by the program).
    Returns the absolute path."""
    p = Path(os.path.abspath(path))
    check_not_an_input(path, inputs)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _refuse(f"cannot write '{_show(path)}': {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(f"'{_show(path)}' is a symbolic link; refusing to replace it (write to its "
                          "target directly, or remove it)")
        if not stat.S_ISREG(st.st_mode):
            from hccc.util.limits import describe_mode
            raise _refuse(f"'{_show(path)}' is {describe_mode(st.st_mode)}; hccc writes only new or "
                          "regular files")
    if not p.parent.is_dir():
        raise _refuse(f"cannot write '{_show(path)}': directory '{_show(p.parent)}' does not exist")
    return p


def check_not_an_input(path: str | Path, inputs) -> None:
    """Refuse ``path`` where it names the same file as one of ``inputs`` (links and other
    spellings included)."""
    for inp in inputs:
        if inp is None or str(inp) == "-":
            continue
        try:
            same = os.path.samefile(path, inp)
        except (OSError, ValueError):        # either does not exist (yet): not the same file
            continue
        if same:
            raise _refuse(f"output '{_show(path)}' is the input '{_show(inp)}'; hccc does not write over what "
                          "it reads (choose another output file)")


def write_text_atomically(path: str | Path, text: str, inputs=()) -> None:
    """Write ``text`` (UTF-8) to ``path`` as :func:`write_bytes_atomically` writes bytes."""
    write_bytes_atomically(path, text.encode("utf-8"), inputs)


def write_bytes_atomically(path: str | Path, data: bytes, inputs=()) -> None:
    """Write ``data`` to ``path`` through a temporary sibling and a rename: a failed write leaves an
    existing file untouched and no partial file behind. ``path`` must be new or a regular file, and
    none of ``inputs`` (:func:`check_output_file`). Failures are CompileErrors for the user, naming
    the step that failed."""
    path = check_output_file(path, inputs)
    clean_stale_siblings(path, kinds=("tmp",))
    # each step's failure names the step: a file system that takes no new file beside the output
    # (/proc) fails at the temporary file, not at the output, which may well exist
    step = f"cannot create a temporary file in '{_show(path.parent)}' (hccc writes the new file there, then renames it)"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as exc:
        raise _refuse(f"cannot write '{_show(path)}': {step}: {exc.strerror or exc}") from None
    try:
        _lock(fd)
        step = f"cannot write the temporary file '{_show(tmp)}'"
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())        # the data on disk before the rename publishes it
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        check_output_file(path)        # the target may have changed meanwhile
        step = f"cannot rename the temporary file '{_show(tmp)}' over it"
        os.replace(tmp, path)
        step = f"cannot sync directory '{_show(path.parent)}'"
        sync_parent(path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _refuse(f"cannot write '{_show(path)}': {step}: {exc.strerror or exc}") from None
        raise
    finally:
        os.close(fd)


def figure_path(path: str | Path, fmt: str | None = None) -> Path:
    """The file a figure saved to ``path`` is written to, as matplotlib names it: ``path`` itself,
    or with ``.png`` added where it has no suffix and no format is given."""
    p = Path(path)
    return p if fmt or p.suffix else p.with_name(p.name + ".png")


def save_figure(fig, path: str | Path, inputs=(), **savefig) -> Path:
    """A matplotlib figure written as a single output file (:func:`write_bytes_atomically`: never
    into a device, a FIFO or over a symbolic link, never half-written) in the format ``savefig``
    names or the file's suffix says (PNG where it has none: :func:`figure_path`); the path
    written."""
    import io
    out = figure_path(path, savefig.get("format"))
    savefig.setdefault("format", out.suffix[1:].lower())
    buf = io.BytesIO()
    fig.savefig(buf, **savefig)     # an unknown format: matplotlib's ValueError, nothing written
    write_bytes_atomically(out, buf.getvalue(), inputs)
    return out


def write_export(output: str, text: str, algo: str, example_name: str) -> Path | None:
    """Write an export's ``text`` where ``-o`` says: standard output for ``-``, else the file
    ``output`` (atomically, never over ``algo``); None for standard output. A folder given where a
    file is wanted is refused with ``example_name`` as the file name to give."""
    if output == "-":
        sys.stdout.write(text)
        return None
    out = Path(output)
    if out.is_dir():
        raise _refuse(f"'{_show(out)}' is a directory; give a file name such as {_show(out)}/{example_name}")
    write_text_atomically(out, text, [algo])
    return out

