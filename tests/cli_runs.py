"""``hccc`` run in this process through :func:`hccc.cli.main`, with what a subprocess run gives a test:
the exit status and the text of stdout and stderr (a :class:`subprocess.CompletedProcess`). It saves
each call the interpreter's start-up and hccc's imports (about 0.3 s of CPU).

A test that needs a real process keeps one (:mod:`capped_runs` for the memory and CPU caps): signals,
the exit status of a crash, import-time behaviour, output compared across fresh processes, the
``python -m hccc`` and ``hccc`` entries themselves.

The run leaves this process as it found it: the working directory and the environment variables
``env`` sets are restored, stdout and stderr are the caller's again.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
from pathlib import Path

from hccc.cli import main


def _text_stream() -> io.TextIOWrapper:
    """A text stream with a byte buffer behind it (``sys.stdout.buffer`` works, as in a process)."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    # universal newlines, as subprocess.run(text=True) decodes a child's output
    return io.TextIOWrapper(io.BytesIO(stream.buffer.getvalue()), encoding="utf-8", errors="replace").read()


@contextlib.contextmanager
def _environment(env: dict[str, str | None] | None):
    """``env``'s variables set (None: unset) for the run, the old values back afterwards."""
    old = {k: os.environ.get(k) for k in env or {}}
    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_cli(*args, cwd: str | Path | None = None,
            env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``hccc ARGS`` in this process, in directory ``cwd`` (default: this one), with the environment
    variables ``env`` changed for the run; returns its status, stdout and stderr as text."""
    argv = [str(a) for a in args]
    out, err = _text_stream(), _text_stream()
    here = os.getcwd()
    try:
        with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cwd is not None:
                os.chdir(cwd)
            status = main(argv)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["hccc", *argv], status, _read(out), _read(err))
