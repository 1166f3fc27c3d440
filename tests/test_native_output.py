"""A native library's writes to standard output are kept out of hccc's own output
(hccc.util.native_output: HiGHS printed a line of its own into ``hccc synth --json``)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hccc.util.native_output import silenced

CHILD = textwrap.dedent("""
    import ctypes, sys
    from hccc.util.native_output import silenced
    libc = ctypes.CDLL(None)
    libc.printf(b"native first\\n")           # C stdio's stdout set up on the pipe, then flushed
    libc.fflush(None)
    print("first")                          # Python's buffer: must come out before the block
    sys.stdout.write("second ")
    with silenced():
        libc.printf(b"native noise, buffered by C stdio ")
        libc.puts(b"and a whole line")
        sys.stdout.write("")
    libc.printf(b"after ")                  # fd 1 is back: a native write after the block shows
    libc.fflush(None)
    print("third")
""")


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_native_write_inside_the_block_never_reaches_stdout_and_nothing_else_is_lost(buffered):
    # stdout a pipe: C stdio is fully buffered there (unless Python runs unbuffered, which makes
    # C stdio unbuffered too), so the noise sits in libc's buffer when the block ends and must be
    # flushed to the null device, not later to the real stdout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, env=env).stdout
    assert out == "native first\nfirst\nsecond after third\n"


def test_python_output_around_the_block_keeps_its_order(capfd):
    print("before", flush=False)
    with silenced():
        pass
    print("after")
    assert capfd.readouterr().out == "before\nafter\n"


def test_the_block_restores_stdout_after_an_exception(capfd):
    try:
        with silenced():
            raise RuntimeError("solver failed")
    except RuntimeError:
        pass
    print("still here")
    assert capfd.readouterr().out == "still here\n"
