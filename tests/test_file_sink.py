"""FileSink (background writes of the code generation's files) and the hccc process's allocator
policy."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.backend.file_sink import FileSink

names = st.sampled_from([f"f{i}.txt" for i in range(6)])
contents = st.one_of(st.text(alphabet="abc\n", max_size=40), st.binary(max_size=40))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(names, contents), max_size=12))
def test_sink_writes_what_a_dict_holds(tmp_path_factory, items):
    """Oracle: a plain dict, written file by file afterwards (the last assignment of a name wins)."""
    out = tmp_path_factory.mktemp("sink")
    oracle: dict = {}
    with FileSink(out) as sink:
        for name, data in items:
            sink[name] = data
            oracle[name] = data
        assert set(sink) == set(oracle) and len(sink) == len(oracle)
        assert all(n in sink for n in oracle)
        paths = sink.close()
    assert paths == sorted(out / n for n in oracle)
    assert sorted(os.listdir(out)) == sorted(oracle)
    for name, data in oracle.items():
        want = data.encode() if isinstance(data, str) else data
        assert (out / name).read_bytes() == want


def test_sink_raises_the_write_error(tmp_path):
    sink = FileSink(tmp_path)
    sink["ok.txt"] = "fine"
    sink["missing/dir.txt"] = "no such directory"
    with pytest.raises(FileNotFoundError):
        sink.close()
    assert (tmp_path / "ok.txt").read_text() == "fine"


def test_sink_leaves_nothing_when_the_block_fails(tmp_path):
    """An error inside the block: every queued write has finished when it propagates, and the
    files are gone (a user's file in the directory stays)."""
    (tmp_path / "mine.txt").write_text("the user's")
    with pytest.raises(RuntimeError):
        with FileSink(tmp_path) as sink:
            for i in range(50):
                sink[f"f{i}"] = b"x" * 10000
            raise RuntimeError("codegen failed")
    assert os.listdir(tmp_path) == ["mine.txt"]
    with pytest.raises(FileNotFoundError):
        with FileSink(tmp_path) as sink:
            sink["ok.txt"] = "fine"
            sink["missing/dir.txt"] = "no such directory"
    assert os.listdir(tmp_path) == ["mine.txt"]


_PROBE = ("from hccc.allocator import tune_allocator\n"
          "done = tune_allocator()\n"
          "from numpy._core.multiarray import _set_madvise_hugepage\n"
          "print(','.join(done) or '-', _set_madvise_hugepage(True))\n")


@pytest.mark.parametrize("setting", ["", "default"])
def test_allocator_policy(setting):
    """The policy turns numpy's huge-page advice off (and, on glibc, sets malloc's thresholds);
    HCCC_ALLOCATOR=default leaves the process as it is."""
    env = dict(os.environ, HCCC_ALLOCATOR=setting)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    done, previous = out
    if setting == "default":
        assert done == "-"                     # nothing changed
        return
    assert "numpy-hugepage" in done.split(",") and previous == "False"
    if os.confstr("CS_GNU_LIBC_VERSION"):
        assert "malloc" in done.split(",")


def test_sink_compute_makes_the_file_on_the_worker(tmp_path):
    """compute(name, make): the file holds make()'s contents (pieces joined); its error is raised."""
    import threading
    main = threading.get_ident()
    where = []

    def make():
        where.append(threading.get_ident())
        return ["head ", memoryview(b"0123456789")[2:5], b" tail"]

    with FileSink(tmp_path) as sink:
        sink.compute("made.txt", make)
        sink["plain.txt"] = "x"
        assert "made.txt" in sink
    assert (tmp_path / "made.txt").read_bytes() == b"head 234 tail"
    assert where and where[0] != main

    def broken():
        raise ValueError("cannot make it")

    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="cannot make it"):
        with FileSink(tmp_path / "b") as sink:
            sink.compute("never.txt", broken)
            sink["other.txt"] = "written, then removed"
    assert not any((tmp_path / "b").iterdir())
