"""Where the launcher puts what other ranks touch, and what HIP allocates it with.

- Every FIFO slot, head, tail and progress counter a rank's connection table names lies in memory
  the launcher asked for with :meth:`Platform.malloc_peer` (what peers read and write while the
  kernels run), and the program still runs correctly (CPU emulation, recorded allocations).
- On HIP, ``malloc_peer`` is ``hipExtMallocWithFlags(..., hipDeviceMallocFinegrained)`` (the flag
  value read from the installed HIP header when there is one), plain data buffers are
  ``hipMalloc``, and the abort flag is pinned mapped host memory (``hipHostMalloc`` with
  ``hipHostMallocMapped``): coarse-grained device memory is not coherent across GPUs during a
  kernel.
"""
from __future__ import annotations

import ctypes
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.hip import HipPlatform
from hccc.runtime.kernel_abi import Conn
from hccc.runtime.local_job import LocalJob


class RecordingCpu(CpuPlatform):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.peer: list[tuple[int, int]] = []

    def malloc_peer(self, nbytes):
        ptr = super().malloc_peer(nbytes)
        self.peer.append((ptr, int(nbytes)))
        return ptr


def _in_peer(pf: RecordingCpu, ptr: int, n: int) -> bool:
    return any(base <= ptr and ptr + n <= base + size for base, size in pf.peer)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("make", [lambda: gen.ring_allreduce(4), lambda: gen.ring_allgather(3)])
def test_everything_a_peer_touches_is_peer_memory(make):
    ir = build_program(make(), chunk_bytes=256)
    pf = RecordingCpu()
    with LocalJob(ir, backend=pf, kernel_timeout_s=20.0) as job:
        res = job.run(count=1000 + 7, proto="simple")
        assert res.ok, res
        for r in range(ir.nranks):
            mem = job.comms[r].memory
            plan = mem.plan
            assert mem.platform is pf
            for tab, n in ((mem.send_tab, len(plan.send_conns)), (mem.recv_tab, len(plan.recv_conns))):
                conns = (Conn * max(n, 1)).from_address(tab)
                for c in conns[:n]:
                    assert _in_peer(pf, c.slots, plan.nslots * plan.slot_bytes)
                    assert _in_peer(pf, c.head, 8) and _in_peer(pf, c.tail, 8)
            assert _in_peer(pf, mem.progress, 8)
            # the abort flag, which the peers raise, in the block they reach (the error record with it)
            assert _in_peer(pf, job.comms[r].flags.abort, 8)


class FakeHipApi:
    """The HIP runtime calls the platform makes to start and to allocate, logged."""

    def __init__(self):
        self.log: list[tuple] = []
        self.next = 1 << 32
        self.host: dict[int, ctypes.Array] = {}
        self.dev = 0

    def _take(self, n):
        p = self.next
        self.next += (n + 4095) // 4096 * 4096
        return p

    def getDeviceCount(self):
        return 1

    def setDevice(self, d):
        self.dev = d

    def getDevice(self):
        return self.dev

    def free(self, p):
        if p:
            self.log.append(("free", p))

    def deviceGetAttribute(self, attr, d):
        return {HipPlatform.attr_sms: 110, HipPlatform.attr_clock_khz: 100_000}[attr]

    def getDeviceProperties(self, d):
        return {"name": b"Fake MI250"}

    def malloc(self, n):
        p = self._take(n)
        self.log.append(("hipMalloc", p, n))
        return p

    def extMallocWithFlags(self, n, flags):
        p = self._take(n)
        self.log.append(("hipExtMallocWithFlags", p, n, flags))
        return p

    def memset(self, p, v, n):
        self.log.append(("memset", p, v, n))

    def deviceSynchronize(self):
        pass

    def streamSynchronize(self, s):
        pass

    def hostAlloc(self, n, flags):
        buf = ctypes.create_string_buffer(n)
        self.host[ctypes.addressof(buf)] = buf
        self.log.append(("hipHostMalloc", ctypes.addressof(buf), n, flags))
        return ctypes.addressof(buf)

    def freeHost(self, p):
        del self.host[p]


class FakeHip(HipPlatform):
    def __init__(self, api):
        self.api = api
        super().__init__()

    def _open_api(self):
        return self.api, self.api

    def _detect_arch(self):
        return "gfx90a"


def _header_constant(name: str) -> int | None:
    for inc in (Path("/opt/rocm/include/hip"), Path("/usr/include/hip")):
        h = inc / "hip_runtime_api.h"
        if h.is_file():
            m = re.search(rf"#define\s+{name}\s+(0x[0-9a-fA-F]+|\d+)", h.read_text(errors="replace"))
            if m:
                return int(m.group(1), 0)
    return None


def test_hip_peer_memory_is_fine_grained_and_flags_are_mapped_host_memory():
    api = FakeHipApi()
    pf = FakeHip(api)
    api.log.clear()
    peer = pf.malloc_peer(1000)
    plain = pf.malloc(1000)
    flag = pf.host_flags(64)
    calls = {e[1]: e for e in api.log if e[0] in ("hipMalloc", "hipExtMallocWithFlags", "hipHostMalloc")}
    fine = _header_constant("hipDeviceMallocFinegrained")
    assert calls[peer][0] == "hipExtMallocWithFlags" and calls[peer][3] == (1 if fine is None else fine)
    assert calls[plain][0] == "hipMalloc"
    mapped = _header_constant("hipHostMallocMapped")
    assert calls[flag][0] == "hipHostMalloc" and calls[flag][3] & (2 if mapped is None else mapped)
    # zeroed: counters and flags must start at 0
    assert ("memset", peer, 0, 1000) in api.log and ctypes.string_at(flag, 64) == bytes(64)
