"""The CPU emulation's memory (:class:`CpuMemory`, which :class:`hccc.runtime.cpu.CpuPlatform`
allocates with): host memory, 256-byte aligned and zeroed (large blocks are anonymous mappings
without huge pages, so FIFO slots sized for whole chunks cost only what a run touches); pointers
are plain addresses. Shared memory between processes is POSIX shared memory (:mod:`hccc.runtime.shm`).

The ranks of an in-process job share one platform, so the book of allocations is kept under a
lock: rank threads allocate, free and copy at once.

Under AddressSanitizer every buffer (inputs, outputs, scratch, FIFO slots, counters) is its own
``posix_memalign`` block, so ASan puts a poisoned redzone right after its last byte.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import threading
from typing import Any

import numpy as np

from hccc.runtime import shm
from hccc.runtime.memory_limits import out_of_memory
from hccc.runtime.platform import DevicePtr, PlatformError

ALIGN = 256
#: allocations from this size up are page-aligned anonymous mappings
_MMAP_MIN = 1 << 16


class CpuMemory:
    """Every allocation of one platform (its own and those mapped from peers' segments), by
    aligned address, and the copies in and out of them, checked against their bounds."""

    def __init__(self, sanitize: bool):
        self.sanitize = sanitize
        self._libc = ctypes.CDLL(None) if sanitize else None
        self._allocs: dict[int, Any] = {}          # aligned address -> backing array or mmap
        self._starts: list[int] = []               # sorted aligned addresses
        self._sizes: dict[int, int] = {}
        self._imported: set[int] = set()           # addresses mapped from peers' segments
        #: guards the four above (the ranks of an in-process job share the platform)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- own memory
    def malloc(self, nbytes: int) -> DevicePtr:
        n = max(int(nbytes), 1)
        if self.sanitize:
            # one heap block per buffer: ASan poisons the bytes right after it
            out = ctypes.c_void_p()
            if self._libc.posix_memalign(ctypes.byref(out), ctypes.c_size_t(ALIGN), ctypes.c_size_t(n)):
                raise out_of_memory("host memory", n)
            ptr = int(out.value)
            ctypes.memset(ptr, 0, n)
            backing: Any = None
        elif n >= _MMAP_MIN:
            # Anonymous pages, zeroed by the kernel when first touched, without transparent huge
            # pages: FIFO slots are sized for whole chunks but small runs touch a few bytes of each,
            # and zeroing a 2 MiB page per touched slot would dominate the run.
            try:
                m = mmap.mmap(-1, n)
            except OSError as exc:
                if exc.errno != errno.ENOMEM:
                    raise
                raise out_of_memory("host memory", n) from None
            if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
                m.madvise(mmap.MADV_NOHUGEPAGE)
            ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            backing = m
        else:
            try:
                raw = np.zeros(n + ALIGN, dtype=np.uint8)
            except MemoryError:
                raise out_of_memory("host memory", n) from None
            ptr = (raw.ctypes.data + ALIGN - 1) // ALIGN * ALIGN
            backing = raw
        self._register(ptr, backing, n)
        return ptr

    def free(self, ptr: DevicePtr) -> None:
        with self._lock:
            if ptr not in self._allocs or ptr in self._imported:
                raise PlatformError(f"free of unknown pointer {ptr:#x}")
            backing = self._allocs.pop(ptr)
            del self._sizes[ptr]
            self._starts.pop(bisect.bisect_left(self._starts, ptr))
        if isinstance(backing, shm.Segment):
            backing.close()
        elif self.sanitize:
            self._libc.free(ctypes.c_void_p(ptr))
        elif isinstance(backing, mmap.mmap):
            try:
                backing.close()
            except BufferError:
                pass  # still exported (a ctypes view alive): the mapping goes with its last user

    def _register(self, ptr: int, backing: Any, n: int) -> None:
        with self._lock:
            self._allocs[ptr] = backing
            self._sizes[ptr] = n
            bisect.insort(self._starts, ptr)

    # ---------------------------------------------------------------- IPC: POSIX shared memory
    def _mapped(self, make) -> "shm.Segment":
        """The segment ``make()`` creates or attaches, registered as this platform's memory."""
        try:
            seg = make()
        except shm.ShmNoMemory as exc:
            raise out_of_memory("shared memory", exc.nbytes, str(exc)) from None
        except shm.ShmError as exc:
            raise PlatformError(str(exc)) from None
        self._register(seg.address, seg, seg.size)
        return seg

    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        return self._mapped(lambda: shm.create(nbytes)).address

    def _segment(self, ptr: DevicePtr) -> "shm.Segment":
        seg = self._allocs.get(ptr)
        if not isinstance(seg, shm.Segment):
            raise PlatformError(f"{ptr:#x} is not shared memory of this platform")
        return seg

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        seg = self._segment(ptr)
        if not seg.owner:
            raise PlatformError(f"{ptr:#x} was imported from a peer; only its creator exports it")
        return seg.handle

    def ipc_import(self, handle: bytes) -> DevicePtr:
        seg = self._mapped(lambda: shm.attach(handle))
        with self._lock:
            self._imported.add(seg.address)
        return seg.address

    def ipc_seal(self, ptr: DevicePtr) -> None:
        self._segment(ptr).unlink()

    def ipc_close(self, ptr: DevicePtr) -> None:
        with self._lock:
            if ptr not in self._imported:
                raise PlatformError(f"{ptr:#x} was not imported")
            self._imported.discard(ptr)
            seg = self._allocs.pop(ptr)
            del self._sizes[ptr]
            self._starts.pop(bisect.bisect_left(self._starts, ptr))
        seg.close()

    # ---------------------------------------------------------------- copies
    def _check(self, ptr: int, nbytes: int) -> None:
        if nbytes == 0:
            return
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            end = self._starts[i] + self._sizes[self._starts[i]] if i >= 0 else 0
        if i < 0 or ptr + nbytes > end:
            raise PlatformError(f"memory access [{ptr:#x}, +{nbytes}) outside every allocation")

    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        if isinstance(src, (bytes, bytearray)):
            self._check(dst, len(src))
            ctypes.memmove(dst, bytes(src), len(src))
            return
        a = np.ascontiguousarray(src)
        self._check(dst, a.nbytes)
        ctypes.memmove(dst, a.ctypes.data, a.nbytes)

    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        if not (isinstance(dst, np.ndarray) and dst.flags.c_contiguous and dst.flags.writeable):
            raise PlatformError("memcpy_dtoh needs a writable contiguous numpy array")
        self._check(src, dst.nbytes)
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None:
        self._check(ptr, nbytes)
        ctypes.memset(ptr, value, nbytes)

    def close(self) -> None:
        """Every shared segment closed and every allocation forgotten (the platform's own
        memory goes with its last reference)."""
        with self._lock:
            backings = list(self._allocs.values())
            self._imported.clear()
            self._allocs.clear()
            self._sizes.clear()
            self._starts.clear()
        for backing in backings:
            if isinstance(backing, shm.Segment):
                backing.close()


__all__ = ["CpuMemory", "ALIGN"]
