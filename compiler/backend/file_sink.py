"""The files of one code generation, written by a background thread while the next are made.

A large program's output is hundreds of MiB of kernel text and IR JSON; writing it costs the
kernel seconds of page-cache work that the code generation can overlap (file writes release the
GIL, and so do the compiled text kernels). :class:`FileSink` takes ``sink[name] = contents``
(text, bytes, or a list of text / bytes-like pieces that the file is the concatenation of),
queues the write on one worker thread (files are written in the order given, each as soon as it
is complete; :meth:`FileSink.compute` makes a file's contents there too) and drops its reference
to the data once written. :meth:`FileSink.close` waits for
every write and raises the first error; it is called on every exit of the ``with`` block, so no
write outlives it, and a block that fails (or a write that fails) removes the files it was given:
a failed code generation leaves its output directory as it found it.
"""
from __future__ import annotations

import pathlib
from concurrent.futures import Future, ThreadPoolExecutor


def _write(path: pathlib.Path, data) -> None:
    if isinstance(data, list):             # pieces, written one after the other (no joined copy)
        with open(path, "wb") as f:
            for piece in data:
                f.write(piece.encode() if isinstance(piece, str) else piece)
        return
    path.write_bytes(data.encode() if isinstance(data, str) else data)


class FileSink:
    """``name -> contents`` written into ``outdir`` (an existing directory) in the background.
    Iterating and ``in`` see the names given so far (for the manifest's file list)."""

    def __init__(self, outdir: pathlib.Path) -> None:
        self.outdir = pathlib.Path(outdir)
        self._names: dict[str, None] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hccc-write")
        self._pending: list[Future] = []

    def __setitem__(self, name: str, data) -> None:
        self._names[name] = None
        self._pending.append(self._pool.submit(_write, self.outdir / name, data))

    def compute(self, name: str, make) -> None:
        """The file ``name`` holds what ``make()`` returns (contents as for ``sink[name]``), made on
        the worker thread before the files given after it are written: work that releases the GIL
        (the compiled text kernels) overlaps the caller's."""
        self._names[name] = None
        self._pending.append(self._pool.submit(lambda: _write(self.outdir / name, make())))

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def close(self) -> list[pathlib.Path]:
        """Wait for every write; raise the first one's error. Returns the written paths, sorted."""
        self._pool.shutdown(wait=True)
        for f in self._pending:
            f.result()
        self._pending = []
        return sorted(self.outdir / n for n in self._names)

    def __enter__(self) -> "FileSink":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True)      # on an error too: nothing writes after the block
        if exc[0] is None:
            try:
                self.close()
            except BaseException:
                self._remove()
                raise
        else:
            self._remove()

    def _remove(self) -> None:
        """A failed generation leaves nothing behind: the files given so far are removed."""
        for n in self._names:
            try:
                (self.outdir / n).unlink()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass


__all__ = ["FileSink"]
