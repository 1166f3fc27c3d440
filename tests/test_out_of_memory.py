"""Memory the system refuses is an error of its own, not a bug: under an address-space limit
(``ulimit -v``) ``hccc run`` refuses a run that cannot fit before it starts, and memory still
refused as it is allocated (``mmap`` ENOMEM, numpy's MemoryError, a thread that cannot start,
a shared segment that cannot be mapped) is the located out-of-memory message, exit status 1, no
traceback and nothing left in /dev/shm. (The Communicator's set-up refused: test_communicator.py.)"""
from __future__ import annotations

import errno
import mmap
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hccc.runtime import shm
from hccc.runtime.cpu_memory import CpuMemory
from hccc.runtime.memory_limits import (OutOfMemoryError, address_space_limit, out_of_memory, out_of_memory_at,
                                        refused_memory)

ROOT = Path(__file__).resolve().parents[1]
ALGO = ROOT / "examples" / "ring_allgather_8.rccl"

#: the address-space limit of the end-to-end runs: room for hccc itself (about 2.4 GiB of address
#: space reached the run phase in the reproduction), not for 8 ranks of 512 MiB buffers
LIMIT = 3 << 30

_LIMITED = """
import resource, sys, runpy
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
sys.argv = ["hccc"] + sys.argv[1:]
runpy.run_module("hccc.cli", run_name="__main__")
"""


def _hccc_limited(args: list[str], env: dict, limit: int = LIMIT) -> tuple[subprocess.CompletedProcess, int]:
    """``hccc ARGS`` in a process whose address space is limited to ``limit`` bytes; its result
    and its process id."""
    # few malloc arenas (64 MiB of address space each, up to 8 per core): hccc itself stays well
    # inside the limit on machines of many cores too
    env = dict(env, MALLOC_ARENA_MAX="2")
    p = subprocess.Popen([sys.executable, "-c", _LIMITED.format(limit=limit), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid


@pytest.fixture(scope="module")
def built():
    """The program's CPU build in the cache the tests share (made without a limit: g++ is not
    under test)."""
    env = dict(os.environ, HCCC_DEBUG="")
    env.pop("HCCC_MAX_RUN_BYTES", None)
    out = subprocess.run([sys.executable, "-m", "hccc.cli", "run", str(ALGO), "-b", "4K", "-e", "4K"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return env


def _left_by(*pids: int) -> list[str]:
    """The hccc segments in /dev/shm that the processes ``pids`` created (their names carry the
    creator's process id; other processes of the machine may hold segments of their own)."""
    return [n for n in shm.ours() if int(n.split("-")[1]) in pids]


def test_run_over_the_address_space_limit_is_refused_before_it_starts(built):
    """Without HCCC_MAX_RUN_BYTES the run limit is at most half the address-space limit: the run
    is refused up front with the existing located message, which says where the limit comes from."""
    out, pid = _hccc_limited(["run", str(ALGO), "-b", "512M", "-e", "512M"], built)
    assert out.returncode == 1, out.stderr
    assert "running ring_allgather_8 at 536870912 bytes needs about" in out.stderr
    assert "address-space limit, ulimit -v" in out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert _left_by(pid) == []


@pytest.mark.slow     # (the longest of the README's command: in the slow set)
def test_memory_refused_as_it_is_allocated_is_located(built):
    """With the up-front check lifted (HCCC_MAX_RUN_BYTES far above the limit) the allocation
    itself fails (mmap ENOMEM or numpy's MemoryError): exit 1, the program and size, the
    address-space limit, no traceback, no internal error, no segment left in /dev/shm."""
    env = dict(built, HCCC_MAX_RUN_BYTES="1T")
    out, pid = _hccc_limited(["run", str(ALGO), "-b", "512M", "-e", "512M"], env)
    assert out.returncode == 1, out.stderr
    assert "hccc: error: running ring_allgather_8 at 536870912 bytes: out of memory: the system refused" in out.stderr
    assert "this process's address space is limited to 3.0 GiB (ulimit -v)" in out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert _left_by(pid) == []


def test_run_limit_follows_the_address_space_limit(tmp_path):
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31)); "
            "from hccc.runtime.memory_limits import run_memory_limit, address_space_limit; "
            "print(address_space_limit(), run_memory_limit())")
    env = {k: v for k, v in os.environ.items() if k != "HCCC_MAX_RUN_BYTES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    limit, run = map(int, out.stdout.split())
    assert limit == 1 << 31 and run == 1 << 30


# ---------------------------------------------------------------- each allocation site, refused

def _enomem(*_a, **_k):
    raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))


@pytest.mark.parametrize("nbytes", [100, 1 << 20])
def test_cpu_memory_refused_is_out_of_memory(monkeypatch, nbytes):
    """Both of CpuMemory's paths (numpy below 64 KiB, an anonymous mapping above)."""
    monkeypatch.setattr(mmap, "mmap", _enomem)

    def no_memory(*_a, **_k):
        raise MemoryError()
    monkeypatch.setattr(np, "zeros", no_memory)
    with pytest.raises(OutOfMemoryError, match="out of memory: the system refused host memory") as info:
        CpuMemory(sanitize=False).malloc(nbytes)
    assert info.value.nbytes == nbytes


def test_other_mapping_errors_stay_what_they_are(monkeypatch):
    def einval(*_a, **_k):
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(mmap, "mmap", einval)
    with pytest.raises(OSError) as info:
        CpuMemory(sanitize=False).malloc(1 << 20)
    assert not isinstance(info.value, OutOfMemoryError) and info.value.errno == errno.EINVAL


@pytest.mark.parametrize("code", [errno.ENOMEM, errno.ENOSPC])
def test_shared_segment_refused_is_out_of_memory_and_left_nowhere(monkeypatch, code):
    """A segment whose mapping is refused (address space) or whose size is (a full /dev/shm) is
    out of memory, and its name is gone from /dev/shm."""
    def refuse(*_a, **_k):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(shm.mmap, "mmap", refuse)
    mem = CpuMemory(sanitize=False)
    with pytest.raises(OutOfMemoryError, match="out of memory: the system refused shared memory"):
        mem.ipc_malloc(1 << 20)
    assert _left_by(os.getpid()) == []


def test_attaching_a_segment_refused_is_out_of_memory(monkeypatch):
    seg = shm.create(1 << 16)
    try:
        monkeypatch.setattr(shm.mmap, "mmap", _enomem)
        with pytest.raises(OutOfMemoryError, match="shared memory"):
            CpuMemory(sanitize=False).ipc_import(seg.handle)
    finally:
        monkeypatch.undo()
        seg.close()


def test_waiter_thread_refused_waits_in_the_caller(monkeypatch):
    """With no thread to spare, the background synchronize waits in the caller (the kernels run
    and must finish before their memory is freed), and the caller can still join it."""
    from hccc.runtime.rank_memory import synchronize_in_background

    class Pf:
        synced = 0

        def synchronize(self):
            Pf.synced += 1

    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    done, failure, thread = synchronize_in_background([Pf(), Pf()], "test")
    assert done.is_set() and failure == [] and Pf.synced == 2
    thread.join(1.0)


# ---------------------------------------------------------------- the classification

KINDS = st.sampled_from(["memory", "enomem", "thread", "oom", "eacces", "runtime", "value"])


def _exception(kind: str) -> BaseException:
    return {"memory": MemoryError(), "enomem": OSError(errno.ENOMEM, "Cannot allocate memory"),
            "thread": RuntimeError("can't start new thread"), "oom": out_of_memory("x", 5),
            "eacces": OSError(errno.EACCES, "Permission denied"), "runtime": RuntimeError("other"),
            "value": ValueError("Cannot allocate memory")}[kind]


@given(kind=KINDS, where=st.text(min_size=1, max_size=20))
def test_refused_memory_and_its_location(kind, where):
    """Exactly the system's refusals become OutOfMemoryError; located once, they keep that place."""
    exc = _exception(kind)
    refused = refused_memory(exc)
    assert (refused is not None) == (kind in ("memory", "enomem", "thread", "oom"))
    try:
        with out_of_memory_at(where):
            raise exc
    except OutOfMemoryError as got:
        assert refused is not None
        assert str(got).startswith(f"{where}: out of memory: the system refused")
        assert got.at("elsewhere") is got
    except BaseException as got:
        assert refused is None and got is exc


def test_message_names_the_limits():
    text = str(out_of_memory("host memory", 3 << 20))
    assert "host memory (3.0 MiB)" in text and "HCCC_MAX_RUN_BYTES" in text
    assert ("ulimit -v" in text) == (address_space_limit() is not None)


def test_cli_reports_refused_memory_anywhere(monkeypatch, capsys):
    """A refusal no allocation site names (here: a thread that cannot start inside ``hccc
    check``) still leaves hccc as out of memory, exit 1, not as an internal error."""
    from hccc import cli
    from hccc.commands import check

    def refuse(_args):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(check, "run", refuse)
    assert cli.main(["check", str(ALGO)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hccc: error: out of memory: the system refused a thread")
    assert "internal error" not in err
