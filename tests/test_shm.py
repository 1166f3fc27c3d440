"""POSIX shared-memory segments (``hccc.runtime.shm``) and the CPU platform's IPC calls."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from hccc.runtime import shm
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.platform import PlatformError


def test_segment_round_trip_and_unlink():
    seg = shm.create(100)
    try:
        assert seg.size >= 100 and seg.name in shm.ours()
        peer = shm.attach(seg.handle)
        ctypes.c_uint64.from_address(seg.address).value = 0xDEADBEEF
        assert ctypes.c_uint64.from_address(peer.address).value == 0xDEADBEEF
        seg.unlink()                       # the name goes, the mappings stay
        assert seg.name not in shm.ours()
        ctypes.c_uint64.from_address(peer.address + 8).value = 7
        assert ctypes.c_uint64.from_address(seg.address + 8).value == 7
        with pytest.raises(shm.ShmError, match="is gone"):
            shm.attach(seg.handle)
        peer.close()
    finally:
        seg.close()


@pytest.mark.parametrize("handle", [b"", b"x" * 80, shm._HANDLE.pack(b"HCCCSHM1", 10, b"/etc/passwd"),
                                    shm._HANDLE.pack(b"HCCCSHM1", 10, b"/hccc-1-../../x")])
def test_foreign_handles_are_refused(handle):
    with pytest.raises(shm.ShmError):
        shm.attach(handle)


def test_reap_stale_removes_segments_of_dead_processes():
    # a child creates a segment and exits without unlinking it (as a killed process would)
    code = ("from hccc.runtime import shm; s = shm.create(10); print(s.name, flush=True); "
            "import os; os._exit(0)")
    name = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert name in shm.ours()
    mine = shm.create(10)
    try:
        gone = shm.reap_stale()
        assert name in gone and name not in shm.ours()
        assert mine.name in shm.ours()          # a live process's segment stays
    finally:
        mine.close()


def test_process_alive():
    assert shm.process_alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not shm.process_alive(p.pid)


def test_cpu_platform_ipc():
    a, b = CpuPlatform(), CpuPlatform()
    p = a.ipc_malloc(4096)
    h = a.ipc_export(p)
    q = b.ipc_import(h)
    a.memcpy_htod(p, np.arange(4, dtype=np.uint32))
    out = np.zeros(4, np.uint32)
    b.memcpy_dtoh(out, q)
    assert out.tolist() == [0, 1, 2, 3]
    with pytest.raises(PlatformError, match="only its creator"):
        b.ipc_export(q)
    a.ipc_seal(p)
    b.ipc_close(q)
    a.free(p)
    assert not any(n.startswith(f"/hccc-{os.getpid()}-") for n in shm.ours())


def _fake_segment(name: str) -> str:
    """A segment named ``name`` as another process would have left it (created and closed)."""
    fd = shm._posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.close(fd)
    return name


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_reap_stale_removes_only_what_is_provably_ours_and_dead():
    ns, dead, me = shm.pid_namespace(), _dead_pid(), os.getpid()
    assert ns and shm.start_time(me) > 0
    tok = os.urandom(8).hex()
    mine = shm.start_time(me)
    cases = {   # name -> whether reap_stale may remove it
        f"/hccc-{dead}-{ns}-{mine}-{tok}": True,                 # this namespace, creator dead
        f"/hccc-{me}-{ns}-{mine + 1}-{tok}": False,              # this very process: never
        f"/hccc-1-{ns}-{shm.start_time(1) + 7}-{tok}": shm.process_alive(1) and shm.start_time(1) > 0,
        f"/hccc-{dead}-{ns + 1}-{mine}-{tok}": False,            # another PID namespace's job
        f"/hccc-{dead}-0-{mine}-{tok}": False,                   # namespace unknown
        f"/hccc-{dead}-{tok}": False,                            # an older hccc's name: unprovable
    }
    made = [_fake_segment(n) for n in cases]
    try:
        gone = set(shm.reap_stale())
        for name, reaped in cases.items():
            assert (name in gone) == reaped, name
            assert os.path.exists(shm.SHM_DIR + name) != reaped, name
    finally:
        for n in made:
            shm._unlink(n)


def test_a_segments_name_says_its_creator_read_once_per_process(monkeypatch):
    """Every segment's name carries its creating process's id, PID namespace and start time (what
    reap_stale proves a dead creator by), read from /proc once per process, and a forked child's
    segments carry the child's."""
    reads = []
    real = shm.start_time
    monkeypatch.setattr(shm, "start_time", lambda pid: reads.append(pid) or real(pid))
    monkeypatch.setattr(shm, "_CREATOR", None)
    me = os.getpid()
    segs = [shm.create(64) for _ in range(3)]
    try:
        want = f"/hccc-{me}-{shm.pid_namespace()}-{real(me)}-"
        assert all(s.name.startswith(want) for s in segs), [s.name for s in segs]
        assert reads == [me]
        r, w = os.pipe()
        child = os.fork()
        if child == 0:                 # the child: its own id and start time in its segment's name
            try:
                seg = shm.create(64)
                ok = seg.name.startswith(f"/hccc-{os.getpid()}-{shm.pid_namespace()}-{real(os.getpid())}-")
                seg.unlink()
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"1"
        os.close(r)
        os.waitpid(child, 0)
    finally:
        for s in segs:
            s.unlink()
            s.close()
