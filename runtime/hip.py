"""The HIP platform: the emitted HIP kernels on AMD GPUs, through the HIP runtime (libamdhip64).

HIP mirrors the CUDA runtime and module APIs, so :class:`HipPlatform` is the shared GPU platform
(:mod:`hccc.runtime.gpu`: placement, residency check, timing gate, memory bookkeeping) driven by
:class:`HipApi`, a small ctypes binding that offers the calls the GPU platform makes under the
names CuPy gives them. No Python package is needed; the platform is usable when ``libamdhip64.so``
loads and reports a device, and raises :class:`PlatformError` with the reason otherwise.

Building: ``hipcc --genco --offload-arch=ARCH`` (ARCH: ``HCCC_HIP_ARCH``, else the first GPU that
``rocm_agent_enumerator`` lists, else ``gfx90a``) turns the emitted sources of the chosen ranks
plus the gate kernel into one code object (a clang offload bundle), cached like the cubins.

Queues: HIP maps streams onto ``GPU_MAX_HW_QUEUES`` hardware queues (4 by default) whose kernels
run in order, so rank kernels sharing a queue would wait on each other forever. The platform raises
the default to 16 (before the runtime starts) and refuses to run more concurrent rank kernels per
GPU than there are queues. Device attribute ids are those of ROCm 5 and 6
(``hipDeviceAttributeMultiprocessorCount`` = 63, ``hipDeviceAttributeClockInstructionRate`` =
10000, the rate of the ``clock64()`` counter the kernel timeouts are counted in).
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Iterable

from hccc.compiler.backend import abi
from hccc.runtime.gpu import GpuPlatform, compile_module, elf_symbols, find_compiler, select_ranks, translation_unit
from hccc.runtime.platform import Instance, PlatformError, register

ARCH_ENV = "HCCC_HIP_ARCH"
DEVICES_ENV = "HCCC_HIP_DEVICES"
DEFAULT_ARCH = "gfx90a"
QUEUES_ENV = "GPU_MAX_HW_QUEUES"
DEFAULT_QUEUES = 16
_ARCH = re.compile(r"gfx[0-9a-f]{3,4}(?::[a-z0-9+\-:]+)?")
_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


# ---------------------------------------------------------------------------------- building
def normalise_hip_arch(text: str, *, source: str = ARCH_ENV) -> str:
    t = text.strip().lower()
    if not _ARCH.fullmatch(t):
        raise PlatformError(f"{source}={text!r} is not an AMD GPU architecture (expected e.g. gfx90a)")
    return t


def detect_hip_arch() -> str | None:
    """The first GPU architecture ``rocm_agent_enumerator`` reports (None without one)."""
    tool = shutil.which("rocm_agent_enumerator")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.split():
        if _ARCH.fullmatch(line) and line != "gfx000":      # gfx000 is the CPU agent
            return line
    return None


def resolve_hip_arch(detected: str | None = None) -> str:
    env = os.environ.get(ARCH_ENV, "").strip()
    if env:
        return normalise_hip_arch(env)
    if detected:
        return normalise_hip_arch(detected, source="detected architecture")
    return DEFAULT_ARCH


def find_hipcc() -> str:
    return find_compiler("hipcc", ("ROCM_PATH",), "/opt/rocm", "install ROCm's hipcc (Debian: apt-get install hipcc)")


def build_hip_module(outdir: Path, manifest: dict, instance: Instance,
                     ranks: Iterable[int] | None = None, *, arch: str | None = None,
                     hipcc: str | None = None, single_gpu: bool = False) -> Path:
    """One code object with ``instance``'s HIP kernels of ``ranks`` (all when None) and the gate;
    ``single_gpu`` builds agent-scope memory ordering (every rank on one GPU)."""
    sel = select_ranks(manifest, ranks)
    arch = normalise_hip_arch(arch) if arch else resolve_hip_arch()
    tu = translation_unit(manifest, instance, sel, "hip")
    flags = hip_flags(arch, single_gpu)
    return compile_module(Path(outdir), manifest, tu, sel, "hip", hipcc or find_hipcc(), flags, ".co")


def hip_flags(arch: str, single_gpu: bool = False, *, output: tuple[str, ...] = ("--genco",)) -> list[str]:
    """hipcc flags of a kernel build (``output``: ``("--genco",)``, or
    ``("--cuda-device-only", "-S")`` for the device assembly, to inspect the code)."""
    return (["-std=c++17", "-O3", *output, f"--offload-arch={arch}"]
            + (["-DHCCC_SINGLE_GPU=1"] if single_gpu else []))


def offload_bundle_entries(data: bytes) -> list[tuple[str, bytes]]:
    """(target triple, image) of every entry of a clang offload bundle; a bare ELF image is one
    entry with an empty triple. PlatformError for anything else."""
    if data[:4] == b"\x7fELF":
        return [("", data)]
    if not data.startswith(_BUNDLE_MAGIC) or len(data) < 32:
        raise PlatformError("not a clang offload bundle or ELF code object")
    n, = struct.unpack_from("<Q", data, 24)
    pos, out = 32, []
    for _ in range(n):
        if pos + 24 > len(data):
            raise PlatformError("truncated offload bundle")
        off, size, tlen = struct.unpack_from("<QQQ", data, pos)
        triple = data[pos + 24:pos + 24 + tlen].decode("ascii", "replace")
        pos += 24 + tlen
        if off + size > len(data):
            raise PlatformError("truncated offload bundle")
        out.append((triple, data[off:off + size]))
    return out


def hip_module_symbols(path: Path | bytes) -> set[str]:
    """Kernels of a HIP code object: the global functions of its AMDGPU images."""
    data = path if isinstance(path, (bytes, bytearray)) else Path(path).read_bytes()
    syms: set[str] = set()
    for triple, image in offload_bundle_entries(bytes(data)):
        if image and (triple == "" or "amdgcn" in triple):
            syms |= elf_symbols(image)
    return syms


# ---------------------------------------------------------------------------------- the runtime
class HipError(RuntimeError):
    def __init__(self, status: int, call: str, text: str):
        super().__init__(f"{call}: {text} ({status})")
        self.status = status


_vp, _sz, _u, _i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int


class HipIpcMemHandle(ctypes.Structure):
    """``hipIpcMemHandle_t``: 64 opaque bytes, passed by value to ``hipIpcOpenMemHandle``."""
    _fields_ = [("reserved", ctypes.c_char * 64)]


#: hipExtMallocWithFlags flag: fine-grained (coherent across devices and processes) memory
HIP_DEVICE_MALLOC_FINEGRAINED = 0x1


_PROTOS = {
    "hipGetDeviceCount": [ctypes.POINTER(_i)],
    "hipSetDevice": [_i],
    "hipGetDevice": [ctypes.POINTER(_i)],
    "hipDeviceGetAttribute": [ctypes.POINTER(_i), _i, _i],
    "hipDeviceGetName": [ctypes.c_char_p, _i, _i],
    "hipDeviceSynchronize": [],
    "hipDeviceCanAccessPeer": [ctypes.POINTER(_i), _i, _i],
    "hipDeviceEnablePeerAccess": [_i, _u],
    "hipMalloc": [ctypes.POINTER(_vp), _sz],
    "hipFree": [_vp],
    "hipExtMallocWithFlags": [ctypes.POINTER(_vp), _sz, _u],
    "hipHostMalloc": [ctypes.POINTER(_vp), _sz, _u],
    "hipHostFree": [_vp],
    "hipMemcpy": [_vp, _vp, _sz, _i],
    "hipMemset": [_vp, _i, _sz],
    "hipStreamCreateWithFlags": [ctypes.POINTER(_vp), _u],
    "hipStreamDestroy": [_vp],
    "hipStreamSynchronize": [_vp],
    "hipStreamWaitEvent": [_vp, _vp, _u],
    "hipEventCreateWithFlags": [ctypes.POINTER(_vp), _u],
    "hipEventRecord": [_vp, _vp],
    "hipEventSynchronize": [_vp],
    "hipEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _vp, _vp],
    "hipEventDestroy": [_vp],
    "hipModuleLoad": [ctypes.POINTER(_vp), ctypes.c_char_p],
    "hipModuleUnload": [_vp],
    "hipIpcGetMemHandle": [ctypes.POINTER(HipIpcMemHandle), _vp],
    "hipIpcOpenMemHandle": [ctypes.POINTER(_vp), HipIpcMemHandle, _u],
    "hipIpcCloseMemHandle": [_vp],
    "hipModuleGetFunction": [ctypes.POINTER(_vp), _vp, ctypes.c_char_p],
    "hipModuleLaunchKernel": [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _vp, _vp],
    "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor": [ctypes.POINTER(_i), _vp, _i, _sz],
}


class HipApi:
    """The HIP calls the CUDA platform makes, named and shaped as CuPy's runtime/driver modules
    (values returned, failures raised as :class:`HipError` with ``status``)."""

    memcpyHostToDevice = 1
    memcpyDeviceToHost = 2
    streamNonBlocking = 1
    eventDisableTiming = 2

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        for name, args in _PROTOS.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = _i
        lib.hipGetErrorString.argtypes = [_i]
        lib.hipGetErrorString.restype = ctypes.c_char_p

    def _call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            text = self.lib.hipGetErrorString(status) or b"unknown error"
            raise HipError(status, name, text.decode(errors="replace"))

    def _out(self, name: str, ctype, *args):
        v = ctype()
        self._call(name, ctypes.byref(v), *args)
        return v.value

    # runtime
    def getDeviceCount(self) -> int:
        return self._out("hipGetDeviceCount", _i)

    def setDevice(self, d: int) -> None:
        self._call("hipSetDevice", d)

    def getDevice(self) -> int:
        return self._out("hipGetDevice", _i)

    def deviceGetAttribute(self, attr: int, d: int) -> int:
        return self._out("hipDeviceGetAttribute", _i, attr, d)

    def getDeviceProperties(self, d: int) -> dict:
        buf = ctypes.create_string_buffer(256)
        self._call("hipDeviceGetName", buf, len(buf), d)
        return {"name": buf.value}

    def deviceSynchronize(self) -> None:
        self._call("hipDeviceSynchronize")

    def deviceCanAccessPeer(self, a: int, b: int) -> int:
        return self._out("hipDeviceCanAccessPeer", _i, a, b)

    def deviceEnablePeerAccess(self, peer: int) -> None:
        self._call("hipDeviceEnablePeerAccess", peer, 0)

    def malloc(self, n: int) -> int:
        return self._out("hipMalloc", _vp, n) or 0

    def extMallocWithFlags(self, n: int, flags: int) -> int:
        return self._out("hipExtMallocWithFlags", _vp, n, flags) or 0

    def free(self, p: int) -> None:
        self._call("hipFree", p or None)

    def hostAlloc(self, n: int, flags: int) -> int:
        return self._out("hipHostMalloc", _vp, n, flags) or 0

    def freeHost(self, p: int) -> None:
        self._call("hipHostFree", p)

    def memcpy(self, dst: int, src: int, n: int, kind: int) -> None:
        self._call("hipMemcpy", dst, src, n, kind)

    # IPC (one rank per process): memory exported and imported by handle (fine-grained: extMallocWithFlags)
    def ipcGetMemHandle(self, p: int) -> bytes:
        h = HipIpcMemHandle()
        self._call("hipIpcGetMemHandle", ctypes.byref(h), p)
        return bytes(h.reserved)

    def ipcOpenMemHandle(self, raw: bytes, flags: int) -> int:
        h = HipIpcMemHandle()
        ctypes.memmove(ctypes.addressof(h), bytes(raw)[:64], 64)
        return self._out("hipIpcOpenMemHandle", _vp, h, flags) or 0

    def ipcCloseMemHandle(self, p: int) -> None:
        self._call("hipIpcCloseMemHandle", p)

    def memset(self, p: int, value: int, n: int) -> None:
        self._call("hipMemset", p, value, n)

    def streamCreateWithFlags(self, flags: int) -> int:
        return self._out("hipStreamCreateWithFlags", _vp, flags) or 0

    def streamDestroy(self, s: int) -> None:
        self._call("hipStreamDestroy", s)

    def streamSynchronize(self, s: int) -> None:
        self._call("hipStreamSynchronize", s or None)

    def streamWaitEvent(self, s: int, e: int, flags: int = 0) -> None:
        self._call("hipStreamWaitEvent", s, e, flags)

    def eventCreate(self) -> int:
        return self.eventCreateWithFlags(0)

    def eventCreateWithFlags(self, flags: int) -> int:
        return self._out("hipEventCreateWithFlags", _vp, flags) or 0

    def eventRecord(self, e: int, s: int) -> None:
        self._call("hipEventRecord", e, s or None)

    def eventSynchronize(self, e: int) -> None:
        self._call("hipEventSynchronize", e)

    def eventElapsedTime(self, a: int, b: int) -> float:
        return self._out("hipEventElapsedTime", ctypes.c_float, a, b)

    def eventDestroy(self, e: int) -> None:
        self._call("hipEventDestroy", e)

    # modules
    def moduleLoad(self, path: str) -> int:
        return self._out("hipModuleLoad", _vp, path.encode())

    def moduleUnload(self, m: int) -> None:
        self._call("hipModuleUnload", m)

    def moduleGetFunction(self, m: int, name: str) -> int:
        return self._out("hipModuleGetFunction", _vp, m, name.encode())

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) -> None:
        self._call("hipModuleLaunchKernel", f, gx, gy, gz, bx, by, bz, shmem, stream or None,
                   params or None, extra or None)

    def launchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params) -> None:
        """hipModuleLaunchCooperativeKernel (ROCm 6); NotImplementedError where the runtime lacks it."""
        fn = getattr(self.lib, "hipModuleLaunchCooperativeKernel", None)
        if fn is None:
            raise NotImplementedError("this HIP runtime has no hipModuleLaunchCooperativeKernel")
        fn.argtypes = [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _vp]
        fn.restype = _i
        self._call("hipModuleLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, shmem,
                   stream or None, params or None)

    def occupancyMaxActiveBlocksPerMultiprocessor(self, f: int, block: int, smem: int) -> int:
        return self._out("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", _i, f, block, smem)


def open_hip() -> HipApi:
    """The HIP runtime, or PlatformError saying why it cannot be used."""
    os.environ.setdefault(QUEUES_ENV, str(DEFAULT_QUEUES))
    last = None
    for name in ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"):
        try:
            return HipApi(ctypes.CDLL(name))
        except OSError as exc:
            last = exc
        except AttributeError as exc:     # a library without the calls used here
            raise PlatformError(f"the HIP runtime is too old: {exc}") from None
    raise PlatformError(f"the HIP runtime (libamdhip64) is not installed: {last}")


class HipPlatform(GpuPlatform):
    """HIP on AMD GPUs: the shared GPU platform with the HIP API, attribute ids and build."""

    name = "hip"
    source_platform = "hip"
    api_name = "HIP"
    devices_env = DEVICES_ENV
    arch_env = ARCH_ENV
    attr_sms = 63            # hipDeviceAttributeMultiprocessorCount
    attr_clock_khz = 10000   # hipDeviceAttributeClockInstructionRate (clock64() counter)
    #: hccc_clock() is wall_clock64() (s_memrealtime): a constant 100 MHz on CDNA and RDNA GPUs
    timer_ticks_per_us = abi.TIMER_TICKS_PER_US["hip"]
    #: hipExtMallocWithFlags flags of memory peers touch: hipDeviceMallocFinegrained (coherent
    #: across GPUs while kernels run, as RCCL allocates its FIFOs and flags)
    peer_malloc_flags = 0x1

    def _open_api(self):
        api = open_hip()
        q = os.environ.get(QUEUES_ENV, "")
        self.max_kernels = int(q) if q.isdigit() and int(q) > 0 else 4
        return api, api

    def _detect_arch(self) -> str:
        return resolve_hip_arch(detect_hip_arch())

    def _module_symbols(self, path: Path) -> set[str]:
        return hip_module_symbols(path)

    def _ipc_alloc(self, size: int) -> int:
        # peers spin on FIFOs and counters in this memory: fine-grained, so their stores are seen
        return int(self._runtime.extMallocWithFlags(size, HIP_DEVICE_MALLOC_FINEGRAINED))

    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False) -> Path:
        return build_hip_module(Path(outdir), manifest, instance, ranks, arch=self.arch,
                                single_gpu=single_gpu)


register("hip", HipPlatform)
