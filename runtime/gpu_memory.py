"""The GPU platform's memory (:class:`GpuMemory`, one per :class:`hccc.runtime.gpu.GpuPlatform`):
device allocations (plain, for peers, shareable through IPC), pinned mapped host flags, peers'
memory mapped from IPC handles, and the copies and fills in and out of them, each checked to lie
inside one allocation (which also says the device to make current for it).
"""
from __future__ import annotations

import bisect
import ctypes
import struct
from typing import Any

import numpy as np

from hccc.runtime.gpu_calls import call_error, guard
from hccc.runtime.platform import DevicePtr, PlatformError

#: an exported GPU allocation: magic, platform name, size, the runtime's 64-byte IPC handle
_IPC_HANDLE = struct.Struct("<8s8sQ64s")
_IPC_MAGIC = b"HCCCIPC1"


class GpuMemory:
    """Every allocation of one platform by address: its size and device (own, and imported from
    peers), and its pinned host flags. The runtime, the current device and the IPC allocation hook
    (``_ipc_alloc``) are the platform's (``pf``)."""

    def __init__(self, pf):
        self.pf = pf
        self._allocs: dict[int, tuple[int, int]] = {}    # ptr -> (nbytes, device)
        self._host_flags: dict[int, int] = {}            # pinned mapped host memory: ptr -> nbytes
        self._alloc_keys: list[int] = []
        self._imported: set[int] = set()                 # mapped from peers' IPC handles

    def is_host_flag(self, ptr: int) -> bool:
        """Is ``ptr`` pinned host memory of :meth:`host_flags`?"""
        return ptr in self._host_flags

    def pointers(self) -> list[int]:
        """Every pointer still held: device allocations (own and imported), then host flags."""
        return list(self._allocs) + list(self._host_flags)

    def malloc(self, nbytes: int) -> DevicePtr:
        return self._device_alloc(nbytes, None)

    def malloc_peer(self, nbytes: int) -> DevicePtr:
        return self._device_alloc(nbytes, self.pf.peer_malloc_flags)

    def host_flags(self, nbytes: int) -> DevicePtr:
        size = max(int(nbytes), 8)
        if self.pf._current < 0:
            self.pf.set_device(0)
        try:   # cudaHostAllocMapped / hipHostMallocMapped; with unified addressing one address
            ptr = int(self.pf._runtime.hostAlloc(size, 2))
        except Exception as exc:
            raise PlatformError(f"cannot allocate {size} bytes of pinned host memory: {call_error(exc)}") from None
        ctypes.memset(ptr, 0, size)
        self._host_flags[ptr] = size
        return ptr

    def _device_alloc(self, nbytes: int, flags: int | None) -> DevicePtr:
        if flags is None:
            return self._track(nbytes, "", lambda size: int(self.pf._runtime.malloc(size)))
        return self._track(nbytes, "", lambda size: int(self.pf._runtime.extMallocWithFlags(size, flags)))

    def _track(self, nbytes: int, kind: str, alloc) -> DevicePtr:
        """``alloc(size)`` on the current device, recorded for free/IPC and zeroed."""
        if self.pf._current < 0:
            self.pf.set_device(0)
        dev = self.pf._current
        size = max(int(nbytes), 1)
        try:
            ptr = alloc(size)
        except Exception as exc:
            raise PlatformError(f"cannot allocate {size} {kind}bytes on GPU {dev}: {call_error(exc)}") from None
        self._allocs[ptr] = (size, dev)
        bisect.insort(self._alloc_keys, ptr)
        self.memset(ptr, 0, size)
        return ptr

    def free(self, ptr: DevicePtr) -> None:
        if ptr in self._host_flags:
            del self._host_flags[ptr]
            with guard("freeing pinned host memory"):
                self.pf._runtime.freeHost(ptr)
            return
        if ptr in self._imported:
            self.ipc_close(ptr)
            return
        if ptr not in self._allocs:
            raise PlatformError(f"free of a pointer this platform did not allocate: {ptr:#x}")
        _size, dev = self._allocs.pop(ptr)
        self._alloc_keys.remove(ptr)
        self.pf.set_device(dev)
        with guard(f"freeing GPU {dev} memory"):
            self.pf._runtime.free(ptr)

    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        return self._track(nbytes, "shareable ", self.pf._ipc_alloc)

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        if ptr not in self._allocs or ptr in self._imported:
            raise PlatformError(f"{ptr:#x} is not memory this process allocated for IPC")
        size, dev = self._allocs[ptr]
        self.pf.set_device(dev)
        with guard(f"exporting GPU {dev} memory"):
            raw = bytes(self.pf._runtime.ipcGetMemHandle(ptr))
        return _IPC_HANDLE.pack(_IPC_MAGIC, self.pf.name.encode(), size, raw)

    def ipc_import(self, handle: bytes) -> DevicePtr:
        if not isinstance(handle, (bytes, bytearray)) or len(handle) != _IPC_HANDLE.size:
            raise PlatformError("not a GPU IPC handle (wrong length)")
        magic, plat, size, raw = _IPC_HANDLE.unpack(bytes(handle))
        if magic != _IPC_MAGIC or plat.rstrip(b"\0").decode(errors="replace") != self.pf.name:
            raise PlatformError(f"not a {self.pf.api_name} IPC handle")
        if self.pf._current < 0:
            self.pf.set_device(0)
        dev = self.pf._current
        with guard(f"importing a peer's {self.pf.api_name} memory on GPU {dev}"):
            ptr = int(self.pf._runtime.ipcOpenMemHandle(raw, 1))   # lazy peer access
        self._allocs[ptr] = (int(size), dev)
        bisect.insort(self._alloc_keys, ptr)
        self._imported.add(ptr)
        return ptr

    def ipc_close(self, ptr: DevicePtr) -> None:
        if ptr not in self._imported:
            raise PlatformError(f"{ptr:#x} was not imported")
        self._imported.discard(ptr)
        _size, dev = self._allocs.pop(ptr)
        self._alloc_keys.remove(ptr)
        self.pf.set_device(dev)
        with guard(f"closing a peer's {self.pf.api_name} memory"):
            self.pf._runtime.ipcCloseMemHandle(ptr)

    def _owner(self, ptr: int, nbytes: int) -> int:
        """Device of the allocation holding [ptr, ptr + nbytes); PlatformError when out of bounds."""
        i = bisect.bisect_right(self._alloc_keys, ptr) - 1
        if i >= 0:
            base = self._alloc_keys[i]
            size, dev = self._allocs[base]
            if ptr + nbytes <= base + size:
                return dev
        raise PlatformError(f"{nbytes} bytes at {ptr:#x} are not inside memory this platform allocated")

    def _sync_legacy(self) -> None:
        self.pf._runtime.streamSynchronize(0)

    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        arr = _host_array(src)
        if arr.nbytes == 0:
            return
        self.pf.set_device(self._owner(dst, arr.nbytes))
        rt = self.pf._runtime
        with guard(f"copying {arr.nbytes} bytes to the GPU"):
            rt.memcpy(dst, arr.ctypes.data, arr.nbytes, rt.memcpyHostToDevice)
            self._sync_legacy()

    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise PlatformError("memcpy_dtoh needs a writable C-contiguous numpy array")
        if dst.nbytes == 0:
            return
        self.pf.set_device(self._owner(src, dst.nbytes))
        rt = self.pf._runtime
        with guard(f"copying {dst.nbytes} bytes from the GPU"):
            rt.memcpy(dst.ctypes.data, src, dst.nbytes, rt.memcpyDeviceToHost)
            self._sync_legacy()

    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.pf.set_device(self._owner(ptr, nbytes))
        with guard(f"setting {nbytes} bytes of GPU memory"):
            self.pf._runtime.memset(ptr, int(value), int(nbytes))
            self._sync_legacy()


def _host_array(src: Any) -> np.ndarray:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(src), dtype=np.uint8)
    if isinstance(src, np.ndarray):
        return np.ascontiguousarray(src)
    raise PlatformError(f"memcpy_htod needs a numpy array or bytes, not {type(src).__name__}")
