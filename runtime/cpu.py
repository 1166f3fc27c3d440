"""CPU emulation platform: the emitted kernel sources compiled with g++ and ``hccc_cpu_emu.h``.

Build. One shared library per (generated sources, ranks, instance): each rank's own source is
compiled (``.cu`` for a CUDA rank, ``.hip`` for a HIP rank: both are the same kernels behind
``hccc_platform.h``, which selects the emulation under ``HCCC_PLATFORM_CPU``), so the CPU stands in
for either platform; a mixed-vendor program gets one library per platform, built from that
platform's ranks only (see :mod:`hccc.runtime.launcher`). The rank sources are split into
translation units of at least four ranks, at most one per CPU core, compiled in parallel (the
shared headers are parsed once per unit, not once per rank) with ``-DHCCC_FOR_EACH_INSTANCE(X)=
X(dtype, ctype, op, HCCC_OP)`` so only the requested instantiation is compiled, and linked with
``cpu_launcher.cpp`` (this package; its object is cached separately, it does not depend on the
program), each unit starting from ``hccc_prims.h`` precompiled once per flags (g++; cached too:
the headers are the same for every program and instance, and parsing them was most of a unit's
compile; with them the instance is a macro the unit defines first, :data:`INSTANCE_SELECTOR`);
the module is linked by gold where the compiler driver has it (:data:`FAST_LINKER`). Libraries are cached by content hash (:mod:`hccc.runtime.cache`). C++17 suffices.
Environment: ``HCCC_CXX`` (compiler, default ``g++``), ``HCCC_CPU_OPT`` (default ``-O1``),
``HCCC_CPU_JOBS`` (translation units compiled at once, default the number of CPUs,
:func:`build_jobs`), ``HCCC_CPU_MAX_THREADS`` (thread budget, default 16384 or half of the system's thread limits,
:func:`thread_budget`), ``HCCC_CPU_SANITIZE`` (``address``: the
AddressSanitizer build below).

AddressSanitizer (``CpuPlatform(sanitize="address")``, ``hccc run --sanitize``). The kernels and
the launcher are compiled with ``-fsanitize=address`` and every buffer (inputs, outputs, scratch,
FIFO slots, counters) is its own ``posix_memalign`` block, so ASan puts a poisoned redzone right
after its last byte: a kernel that touches one element past a chunk's buffer stops the process
with ASan's report. The ASan runtime must be the first library of the process
(``LD_PRELOAD=`` :func:`asan_runtime`); the platform refuses to start otherwise.

Execution. A launch creates ``grid x block`` OS threads (one per emulated GPU thread) and returns
at once; ``synchronize`` waits for every launch of every stream. Memory is host memory, 256-byte
aligned and zeroed (large blocks are anonymous mappings without huge pages, so FIFO slots sized
for whole chunks cost only what a run touches); pointers are plain addresses. Timers use the
steady clock (see :class:`CpuTimer`). Kernel timeouts are in nanoseconds.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import ctypes
import functools
import mmap
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hccc.runtime import cache, shm
from hccc.runtime.kernel_abi import Args
from hccc.util import dtypes as dtypes_table
from hccc.runtime.platform import (CTYPES, RED_CONSTS, DevicePtr, Instance, Module, Platform, PlatformError,
                                   Timer, instance_expansion, register)

ALIGN = 256
#: the emitted header every rank source includes first, precompiled for the units (``_prims_pch``)
PCH_HEADER = "hccc_prims.h"
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
#: allocations from this size up are page-aligned anonymous mappings
_MMAP_MIN = 1 << 16
_ABORT_OFFSET = Args.abort_flag.offset
#: threads per TB when the caller does not choose (the emitted kernels ask for 512 and more)
DEFAULT_BLOCK_THREADS = 2
_ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g",
               # instrumented frames are larger: give every emulated GPU thread 1 MiB of stack
               "-DHCCC_CPU_STACK_BYTES=(1024*1024)"]
SANITIZERS = ("address",)
#: -ffp-contract=off: avg's scaling ``x * (1/n)`` is rounded once and never fused into the add after
#: it, as on the GPUs (``hccc_mul_rn``) and in the numpy reference
_CXX_FLAGS = ["-std=c++17", "-fPIC", "-pthread", "-fvisibility=hidden", "-fno-gnu-unique",
              "-fno-strict-aliasing", "-ffp-contract=off", "-DHCCC_PLATFORM_CPU=1", "-Wall"]

#: the linker a module is linked with where the compiler driver has it: gold links a program's
#: module (its units, the launcher and the engine objects) in about a quarter of the CPU time of
#: the default BFD linker (0.02 s against 0.08 s for an 8-rank program, most of what a build
#: costs once the shared objects are cached; a cold test run links some 340 modules). Not for the
#: AddressSanitizer build, which keeps the toolchain's own linker.
FAST_LINKER = "-fuse-ld=gold"


@functools.lru_cache(maxsize=None)
def links_with(exe: str, flag: str) -> bool:
    """The compiler driver ``exe`` can link with ``flag`` (its linker is installed): probed once
    per process by asking that linker for its version."""
    try:
        res = subprocess.run([exe, flag, "-Wl,--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0


#: the most OS threads the emulation starts at once unless ``HCCC_CPU_MAX_THREADS`` says otherwise
#: (and less where the system allows fewer, :func:`thread_budget`): a thread holds a 256 KiB stack
#: (reserved, little of it touched) and some 40 KiB resident; a synthesised 20-GPU ReduceScatter of
#: 8,554 blocks ran in 348 MB at one thread per block (it was refused at the 8,192 this was before)
MAX_THREADS = 16384


def _system_thread_limits() -> list[int]:
    """Half of each limit the system puts on this user's threads (RLIMIT_NPROC, the kernel's
    ``threads-max``, a cgroup's ``pids.max``), the other half left to everything else."""
    out = []
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            out.append(int(soft) // 2)
    except (ImportError, AttributeError, ValueError, OSError):
        pass
    for path in ("/proc/sys/kernel/threads-max", "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            out.append(int(text) // 2)
    return out


def thread_budget() -> int:
    """The emulation's thread budget: ``HCCC_CPU_MAX_THREADS`` where set (a positive integer),
    else :data:`MAX_THREADS` or half of what the system allows, whichever is less (at least 64)."""
    v = _positive_env("HCCC_CPU_MAX_THREADS", "threads")
    return v if v is not None else max(64, min([MAX_THREADS, *_system_thread_limits()]))


def build_jobs() -> int:
    """How many translation units a build compiles at once: ``HCCC_CPU_JOBS`` where set (a
    positive integer), else the number of CPUs. Each unit beyond the first costs g++ a start and
    a load of the precompiled headers again, so where every core is busy anyway (the test suite's
    workers, one per core) one unit a build is the least CPU time."""
    v = _positive_env("HCCC_CPU_JOBS", "compiles")
    return v if v is not None else max(1, os.cpu_count() or 1)


def _positive_env(name: str, what: str) -> int | None:
    """The positive integer the environment variable ``name`` holds (None: unset or blank); any
    other value is a PlatformError saying it must be a positive number of ``what``."""
    env = os.environ.get(name)
    if env is None or not env.strip():
        return None
    try:
        v = int(env.strip())
    except ValueError:
        v = 0
    if v < 1:
        raise PlatformError(f"{name} must be a positive number of {what}, not {env!r}")
    return v


def asan_runtime(cxx: str | None = None) -> str | None:
    """Path of the compiler's ASan runtime (``libasan.so``) to preload, or None without one."""
    exe = shutil.which(cxx or os.environ.get("HCCC_CXX") or "g++")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-print-file-name=libasan.so"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


def asan_loaded() -> bool:
    """Is the ASan runtime mapped into this process?"""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any("libasan" in line for line in f)
    except OSError:
        return False


#: the engine over a specialised rank program (``hccc_program``, and an AllToAll program's
#: ``hccc_vprogram``), instantiated for the build's instance (dtype and op: ``HCCC_FOR_EACH_INSTANCE``
#: names one) in an object of its own (``CpuPlatform._engine_object``)
ENGINE_SOURCE = """#define HCCC_ENGINE_(DT, T, OPN, RED) \\
  template void hccc_run<T, RED, hccc_program>(const hccc_args*, const hccc_program, int); \\
  template void hccc_run<T, RED, hccc_vprogram>(const hccc_args*, const hccc_vprogram, int);
HCCC_FOR_EACH_INSTANCE(HCCC_ENGINE_)
"""
#: what each unit says first (after the prims header, which every unit and the engine take with
#: ``-include``): the engine is instantiated elsewhere, not in this unit
ENGINE_EXTERN = """#define HCCC_ENGINE_(DT, T, OPN, RED) \\
  extern template void hccc_run<T, RED, hccc_program>(const hccc_args*, const hccc_program, int); \\
  extern template void hccc_run<T, RED, hccc_vprogram>(const hccc_args*, const hccc_vprogram, int);
HCCC_FOR_EACH_INSTANCE(HCCC_ENGINE_)
#undef HCCC_ENGINE_
"""


def instance_define(instance: Instance) -> str:
    """The ``-D`` that compiles only ``instance``'s kernels (dtype, C type, op, reduction constant)."""
    return f"-DHCCC_FOR_EACH_INSTANCE(X)={instance_expansion(instance)}"


#: the macro that names a build's instance where the units start from the precompiled headers:
#: the headers are precompiled with ``HCCC_FOR_EACH_INSTANCE(X)`` defined as it (:data:`PCH_DEFINE`,
#: the same for every instance, so one precompiled header serves them all) and each unit defines
#: it first (:func:`instance_selector`). On the command line it would make g++ refuse the
#: precompiled header (a macro it names defined at use, not when precompiled).
INSTANCE_SELECTOR = "HCCC_CPU_INSTANCE_"
PCH_DEFINE = f"-DHCCC_FOR_EACH_INSTANCE(X)={INSTANCE_SELECTOR}(X)"


def instance_selector(instance: Instance) -> str:
    """The first line of a unit compiled with the precompiled headers: the build's instance."""
    return f"#define {INSTANCE_SELECTOR}(X) {instance_expansion(instance)}\n"


def _copy_headers(outdir: Path, headers: list[str], dest: Path) -> None:
    """The emitted headers, copied into a cache entry's build directory."""
    for h in headers:
        shutil.copyfile(outdir / h, dest / h)


def _launcher_source() -> str:
    return resources.files("hccc.runtime").joinpath("cpu_launcher.cpp").read_text()


@dataclass
class _Launch:
    module: "CpuModule"
    handle: int
    start_ns: int = 0
    end_ns: int | None = None


@dataclass
class CpuStream:
    """Launches not yet waited for, in order."""
    pending: list[_Launch] = field(default_factory=list)
    last: _Launch | None = None


@dataclass
class CpuKernel:
    module: "CpuModule"
    symbol: str
    address: int


class CpuModule(Module):
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
        except OSError as exc:
            raise PlatformError(f"cannot load the CPU module {self.path}: {exc}") from None
        lib = self.lib
        lib.hccc_cpu_abi.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        lib.hccc_cpu_abi.restype = None
        lib.hccc_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64]
        lib.hccc_cpu_launch.restype = ctypes.c_void_p
        lib.hccc_cpu_start.argtypes = [ctypes.c_void_p]
        lib.hccc_cpu_start.restype = None
        lib.hccc_cpu_wait.argtypes = [ctypes.c_void_p, ctypes.c_double]
        lib.hccc_cpu_wait.restype = ctypes.c_int
        lib.hccc_cpu_times.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(ctypes.c_uint64)]
        lib.hccc_cpu_times.restype = None
        lib.hccc_cpu_release.argtypes = [ctypes.c_void_p]
        lib.hccc_cpu_release.restype = None
        from hccc.runtime.kernel_abi import sizes
        out = (ctypes.c_uint64 * 4)()
        lib.hccc_cpu_abi(out)
        if tuple(out[:3]) != sizes():
            raise PlatformError(f"{self.path}: kernel ABI mismatch (struct sizes {tuple(out[:3])}, "
                                f"the host packs {sizes()})")
        self.nslots = int(out[3])

    def function(self, symbol: str) -> CpuKernel:
        try:
            fn = getattr(self.lib, symbol)
        except AttributeError:
            raise PlatformError(f"kernel {symbol} not found in {self.path.name}") from None
        return CpuKernel(self, symbol, ctypes.cast(fn, ctypes.c_void_p).value)


class CpuTimer(Timer):
    """Host steady clock.

    ``start(stream)`` reads the clock and ``stop(stream)`` refers to the end of that stream's last
    launch. Without a stream the timer spans every stream: ``start()`` holds back the launches that
    follow (their threads are created but wait), ``stop()`` lets them all go at once and refers to
    the end of the last launch of every stream; thread creation is thus not part of the time.
    """

    def __init__(self, platform: "CpuPlatform"):
        self.platform = platform
        self.t0: int | None = None
        self.until: list[_Launch] | None = None
        self.t1: int | None = None
        self.spans_all = False

    def start(self, stream: Any = None) -> None:
        self.until, self.t1 = None, None
        self.spans_all = not isinstance(stream, CpuStream)
        if self.spans_all:
            self.platform._hold()
        self.t0 = time.monotonic_ns()

    def stop(self, stream: Any = None) -> None:
        if self.t0 is None:
            raise PlatformError("timer stopped before it was started")
        if self.spans_all:
            released = self.platform._release()
            if released is not None:
                self.t0 = released
        streams = [stream] if isinstance(stream, CpuStream) else list(self.platform._streams)
        self.until = [s.last for s in streams if s.last is not None and s.last.end_ns is None]
        self.t1 = time.monotonic_ns()

    def elapsed_us(self) -> float:
        if self.t0 is None or self.t1 is None:
            raise PlatformError("timer read before it was started and stopped")
        if self.until:
            if any(x.end_ns is None for x in self.until):
                self.platform.synchronize()
            self.t1 = max(x.end_ns for x in self.until)
            self.until = None
        return max(0.0, (self.t1 - self.t0) / 1000.0)


class CpuPlatform(Platform):
    name = "cpu"
    source_platform = "cuda"
    ticks_per_us = 1000.0

    def __init__(self, *, cxx: str | None = None, opt: str | None = None, jobs: int | None = None,
                 cache_dir: str | os.PathLike | None = None, max_threads: int | None = None,
                 source_platform: str = "cuda", sanitize: str | None = None):
        if source_platform not in ("cuda", "hip"):
            raise PlatformError(f"the CPU emulation runs cuda or hip sources, not {source_platform!r}")
        if sanitize is None:
            sanitize = os.environ.get("HCCC_CPU_SANITIZE") or None
        if sanitize is not None and sanitize not in SANITIZERS:
            raise PlatformError(f"unknown sanitizer {sanitize!r} (expected one of {', '.join(SANITIZERS)})")
        if sanitize == "address" and not asan_loaded():
            lib = asan_runtime(cxx)
            raise PlatformError("the AddressSanitizer build needs the ASan runtime loaded first: run "
                                f"with LD_PRELOAD={lib or 'libasan.so'} (and ASAN_OPTIONS=detect_leaks=0)")
        #: ``"address"`` for the AddressSanitizer build, else None
        self.sanitize = sanitize
        self._libc = ctypes.CDLL(None) if sanitize else None
        #: the sources emitted when a homogeneous program is generated for this platform
        self.source_platform = source_platform
        self.cxx = cxx or os.environ.get("HCCC_CXX") or "g++"
        self.opt = opt or os.environ.get("HCCC_CPU_OPT") or "-O1"
        self.jobs = max(1, jobs or build_jobs())
        self.cache_dir = cache_dir
        self.max_threads = max_threads or thread_budget()
        self._allocs: dict[int, Any] = {}          # aligned address -> backing array or mmap
        self._starts: list[int] = []               # sorted aligned addresses
        self._sizes: dict[int, int] = {}
        self._imported: set[int] = set()           # addresses mapped from peers' segments
        self._streams: list[CpuStream] = []
        self._cxx_id: str | None = None
        self._cxx_exe: str | None = None
        self._sync_lock = threading.Lock()
        self._held: list[_Launch] | None = None    # launches waiting for CpuTimer.stop()

    # ---------------------------------------------------------------- memory
    def malloc(self, nbytes: int) -> DevicePtr:
        n = max(int(nbytes), 1)
        if self.sanitize:
            # one heap block per buffer: ASan poisons the bytes right after it
            out = ctypes.c_void_p()
            if self._libc.posix_memalign(ctypes.byref(out), ctypes.c_size_t(ALIGN), ctypes.c_size_t(n)):
                raise PlatformError(f"out of memory allocating {n} bytes")
            ptr = int(out.value)
            ctypes.memset(ptr, 0, n)
            backing: Any = None
        elif n >= _MMAP_MIN:
            # Anonymous pages, zeroed by the kernel when first touched, without transparent huge
            # pages: FIFO slots are sized for whole chunks but small runs touch a few bytes of each,
            # and zeroing a 2 MiB page per touched slot would dominate the run.
            m = mmap.mmap(-1, n)
            if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
                m.madvise(mmap.MADV_NOHUGEPAGE)
            ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            backing = m
        else:
            raw = np.zeros(n + ALIGN, dtype=np.uint8)
            ptr = (raw.ctypes.data + ALIGN - 1) // ALIGN * ALIGN
            backing = raw
        self._allocs[ptr] = backing
        self._sizes[ptr] = n
        bisect.insort(self._starts, ptr)
        return ptr

    def free(self, ptr: DevicePtr) -> None:
        if ptr not in self._allocs or ptr in self._imported:
            raise PlatformError(f"free of unknown pointer {ptr:#x}")
        backing = self._allocs.pop(ptr)
        if isinstance(backing, shm.Segment):
            backing.close()
        elif self.sanitize:
            self._libc.free(ctypes.c_void_p(ptr))
        elif isinstance(backing, mmap.mmap):
            try:
                backing.close()
            except BufferError:
                pass  # still exported (a ctypes view alive): the mapping goes with its last user
        del self._sizes[ptr]
        self._starts.pop(bisect.bisect_left(self._starts, ptr))

    def _register(self, ptr: int, backing: Any, n: int) -> None:
        self._allocs[ptr] = backing
        self._sizes[ptr] = n
        bisect.insort(self._starts, ptr)

    # ---------------------------------------------------------------- IPC: POSIX shared memory
    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        try:
            seg = shm.create(nbytes)
        except shm.ShmError as exc:
            raise PlatformError(str(exc)) from None
        self._register(seg.address, seg, seg.size)
        return seg.address

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
        try:
            seg = shm.attach(handle)
        except shm.ShmError as exc:
            raise PlatformError(str(exc)) from None
        self._register(seg.address, seg, seg.size)
        self._imported.add(seg.address)
        return seg.address

    def ipc_seal(self, ptr: DevicePtr) -> None:
        self._segment(ptr).unlink()

    def ipc_close(self, ptr: DevicePtr) -> None:
        if ptr not in self._imported:
            raise PlatformError(f"{ptr:#x} was not imported")
        self._imported.discard(ptr)
        seg = self._allocs.pop(ptr)
        del self._sizes[ptr]
        self._starts.pop(bisect.bisect_left(self._starts, ptr))
        seg.close()

    def _check(self, ptr: int, nbytes: int) -> None:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if nbytes == 0:
            return
        if i < 0 or ptr + nbytes > self._starts[i] + self._sizes[self._starts[i]]:
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

    # ---------------------------------------------------------------- code
    def _compiler_id(self) -> str:
        if self._cxx_id is None:
            exe = shutil.which(self.cxx)
            if exe is None:
                raise PlatformError(f"the CPU backend needs a C++ compiler: '{self.cxx}' not found "
                                    "(install g++, or set HCCC_CXX)")
            try:
                out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                raise PlatformError(f"cannot run {exe}: {exc}") from None
            self._cxx_exe = exe
            self._cxx_id = exe + " " + (out.stdout.splitlines()[0] if out.stdout else "")
        return self._cxx_id

    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False) -> Path:
        outdir = Path(outdir)
        if instance.dtype not in CTYPES or instance.op not in RED_CONSTS:
            raise PlatformError(f"no kernels for {instance.dtype}/{instance.op}")
        why = dtypes_table.instance_error(instance.dtype, instance.op)
        if why:
            raise PlatformError(why)
        entries = manifest["ranks"]
        if ranks is not None:
            wanted = set(ranks)
            entries = [e for e in entries if e["rank"] in wanted]
        sources = []
        for e in entries:
            # the rank's own platform's source (the one the emitted build files compile for it)
            srcs = e.get("sources") or {}
            sources.append(srcs.get(e.get("platform")) or e["source"])
        # with every rank of one platform: the one-grid entry too (it calls their block functions)
        if ranks is None or sorted(set(ranks)) == list(range(len(manifest["ranks"]))):
            plats = {e.get("platform") for e in entries}
            grid = (manifest.get("grid") or {}).get(next(iter(plats))) if len(plats) == 1 else None
            if isinstance(grid, dict):
                sources.append(grid.get("source"))
        sources = list(dict.fromkeys(sources))     # table mode: one generic source for every rank
        headers = list(manifest.get("headers", []))
        for name in sources + headers:
            if not isinstance(name, str) or not _FILENAME.fullmatch(name):
                raise PlatformError(f"manifest.json: {name!r} is not a plain file name")
        compiler = self._compiler_id()
        exe = self._cxx_exe
        define = instance_define(instance)
        flags = ([*_CXX_FLAGS, self.opt, *(_ASAN_FLAGS if self.sanitize else [])]
                 + (["-DHCCC_SINGLE_GPU=1"] if single_gpu else []))
        # the launcher and the precompiled headers depend on the headers, not on the program
        headers_digest = cache.files_digest([outdir / h for h in headers], outdir)
        launcher_obj = self._launcher_object(outdir, headers, headers_digest, flags)
        pch = self._prims_pch(outdir, headers, headers_digest, flags)
        engine_obj = self._engine_object(outdir, headers, headers_digest, flags, instance, pch)
        link = [FAST_LINKER] if not self.sanitize and links_with(exe, FAST_LINKER) else []
        key = cache.content_key(
            "cpu-module", compiler, " ".join(flags + link), define, launcher_obj.read_bytes(),
            engine_obj.read_bytes() if engine_obj is not None else b"",
            cache.files_digest([outdir / f for f in sources + headers], outdir))
        # translation units: a few ranks each (the headers are parsed once per unit), in parallel
        ngroups = max(1, min(self.jobs, len(sources) // 4))
        groups = [sources[i::ngroups] for i in range(ngroups)] if sources else []

        def make(tmp: Path) -> None:
            units = []
            for i, grp in enumerate(groups):
                tu = tmp / f"unit{i}.cpp"
                tu.write_text((instance_selector(instance) if pch is not None else "")
                              + (ENGINE_EXTERN if engine_obj is not None else "")
                              + "".join(f'#include "{f}"\n' for f in grp))
                units.append(tu)

            def compile_unit(tu: Path):
                # with the precompiled shared headers: found through the first -I, in front of the
                # unit (the sources' own #include of it is then a no-op); run in the unit's
                # directory, which -include searches first and which holds no header
                pre = (["-I", str(pch), "-include", PCH_HEADER] if pch is not None
                       else ["-include", PCH_HEADER] if engine_obj is not None else [])
                cmd = [exe, *flags, PCH_DEFINE if pch is not None else define, *pre, "-I", str(outdir), "-c", str(tu),
                       "-o", str(tu.with_suffix(".o"))]
                return subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp))

            with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as ex:
                results = list(ex.map(compile_unit, units))
            for tu, res in zip(units, results):
                if res.returncode != 0:
                    raise PlatformError(f"g++ failed on the emitted sources ({tu.name}):\n"
                                        + res.stderr[-4000:])
            objs = [str(tu.with_suffix(".o")) for tu in units] + [str(launcher_obj)] + \
                ([str(engine_obj)] if engine_obj is not None else [])
            san = ["-fsanitize=address"] if self.sanitize else []
            res = subprocess.run([exe, "-shared", "-pthread", *san, *link, *objs, "-o", str(tmp / "module.so")],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise PlatformError("linking the CPU module failed:\n" + res.stderr[-4000:])
            for tu in units:
                os.unlink(tu.with_suffix(".o"))

        return cache.entry("cpu", key, make, root=self.cache_dir) / "module.so"

    def _prims_pch(self, outdir: Path, headers: list[str], headers_digest: str, flags: list[str]) -> Path | None:
        """The directory holding ``hccc_prims.h.gch``: the emitted headers precompiled by g++ with
        the build's flags (cached: like the launcher, it depends on the headers and the flags only,
        so every program and every instance of one hccc version shares it: the instance is
        :data:`INSTANCE_SELECTOR`, which the units define after it; one per instance cost a cold
        test run some 30 s of g++). Parsing the
        headers is most of what a unit of a few ranks costs g++; the object code is the same with
        and without it. None (units parse the headers themselves) for the AddressSanitizer build
        (its debug information would name the headers where they were precompiled), for a
        compiler that is not GCC (``HCCC_CXX=clang++``: its precompiled headers work otherwise), and
        when g++ cannot precompile them (the units' own compile then reports what is wrong). g++
        checks that a precompiled header matches the flags it is used with and falls back to the
        header itself where not."""
        if self.sanitize or PCH_HEADER not in headers or "clang" in self._compiler_id().lower():
            return None
        exe = self._cxx_exe
        key = cache.content_key("cpu-pch", self._compiler_id(), " ".join(flags), PCH_DEFINE, headers_digest)

        def make(tmp: Path) -> None:
            src = tmp / "src"
            src.mkdir()
            _copy_headers(outdir, headers, src)
            res = subprocess.run([exe, *flags, PCH_DEFINE, "-x", "c++-header", str(src / PCH_HEADER),
                                  "-o", str(tmp / f"{PCH_HEADER}.gch")], capture_output=True, text=True)
            shutil.rmtree(src)
            if res.returncode != 0:
                raise PlatformError("g++ could not precompile the headers:\n" + res.stderr[-4000:])

        try:
            return cache.entry("cpu_pch", key, make, root=self.cache_dir)
        except PlatformError:
            return None

    def _engine_object(self, outdir: Path, headers: list[str], headers_digest: str, flags: list[str],
                       instance: Instance, pch: Path | None) -> Path | None:
        """The engine (``hccc_run`` for the instance's dtype and op over a rank program) compiled
        once into an object (cached: it depends on the headers, the flags and the instance only,
        so every program of one hccc version shares it). The units declare it ``extern template``
        (:data:`ENGINE_EXTERN`), so a program's build compiles its ranks' tables and kernel entries
        only: the engine was most of what a unit cost g++ (each unit instantiated it again). None
        where the emitted headers have no engine (not hccc's prims header)."""
        if PCH_HEADER not in headers:
            return None
        exe = self._cxx_exe
        define = instance_define(instance)
        key = cache.content_key("cpu-engine", self._compiler_id(), " ".join(flags), define, headers_digest,
                                ENGINE_SOURCE)

        def make(tmp: Path) -> None:
            src = tmp / "src"
            src.mkdir()
            _copy_headers(outdir, headers, src)
            if pch is not None:     # the instance named after the precompiled headers (_prims_pch)
                (src / "engine.cpp").write_text(instance_selector(instance) + ENGINE_SOURCE)
                pre = [PCH_DEFINE, "-I", str(pch), "-include", PCH_HEADER]
            else:
                (src / "engine.cpp").write_text(ENGINE_SOURCE)
                pre = [define, "-include", PCH_HEADER]
            res = subprocess.run([exe, *flags, *pre, "-I", str(src), "-c", str(src / "engine.cpp"),
                                  "-o", str(tmp / "engine.o")], capture_output=True, text=True, cwd=str(src))
            shutil.rmtree(src)
            if res.returncode != 0:
                raise PlatformError("g++ failed on the engine:\n" + res.stderr[-4000:])

        return cache.entry("cpu_engine", key, make, root=self.cache_dir) / "engine.o"

    def _launcher_object(self, outdir: Path, headers: list[str], headers_digest: str,
                         flags: list[str]) -> Path:
        """``cpu_launcher.cpp`` compiled against the emitted headers (cached: it depends on the
        headers and flags only, not on the program)."""
        exe = self._cxx_exe
        launcher = _launcher_source()
        key = cache.content_key("cpu-launcher", self._compiler_id(), " ".join(flags), launcher, headers_digest)

        def make(tmp: Path) -> None:
            _copy_headers(outdir, headers, tmp)
            (tmp / "launcher.cpp").write_text(launcher)
            res = subprocess.run([exe, *flags, "-I", str(tmp), "-c", str(tmp / "launcher.cpp"), "-o",
                                  str(tmp / "launcher.o")], capture_output=True, text=True)
            if res.returncode != 0:
                raise PlatformError("g++ failed on the CPU launcher:\n" + res.stderr[-4000:])

        return cache.entry("cpu_launcher", key, make, root=self.cache_dir) / "launcher.o"

    def load(self, path: Path) -> CpuModule:
        return CpuModule(Path(path))

    # ---------------------------------------------------------------- execution
    def stream(self) -> CpuStream:
        s = CpuStream()
        self._streams.append(s)
        return s

    def block_threads(self, emitted: int) -> int:
        return min(int(emitted), DEFAULT_BLOCK_THREADS)

    def least_block_threads(self, flavour: str) -> int:
        return 1

    def launch(self, fn: Any, grid: int, block: int, args: bytes, stream: Any) -> None:
        if not isinstance(fn, CpuKernel):
            raise PlatformError("not a CPU kernel")
        if not isinstance(stream, CpuStream):
            raise PlatformError("not a CPU stream")
        if grid == 0:
            return
        err = ctypes.create_string_buffer(512)
        hold = self._held is not None
        h = fn.module.lib.hccc_cpu_launch(fn.address, int(grid), int(block), bytes(args), len(args),
                                          0 if hold else 1, err, len(err))
        if not h:
            # the ranks already launched would wait for this one until their timeout: abort them
            if len(args) >= _ABORT_OFFSET + 8:
                flag = int.from_bytes(bytes(args)[_ABORT_OFFSET:_ABORT_OFFSET + 8], "little")
                if flag:
                    ctypes.c_uint32.from_address(flag).value = 1
            self._release()
            raise PlatformError(f"launch of {fn.symbol} failed: {err.value.decode(errors='replace')}")
        rec = _Launch(fn.module, h)
        if hold:
            self._held.append(rec)
        stream.pending.append(rec)
        stream.last = rec

    def _hold(self) -> None:
        self._release()
        self._held = []

    def _release(self) -> int | None:
        """Start the held launches; returns the clock at that moment (None if none was held)."""
        if self._held is None:
            return None
        held, self._held = self._held, None
        t = time.monotonic_ns()
        for rec in held:
            rec.module.lib.hccc_cpu_start(rec.handle)
        return t

    def synchronize(self) -> None:
        self._release()
        with self._sync_lock:
            self._synchronize()

    def _synchronize(self) -> None:
        for s in self._streams:
            while s.pending:
                rec = s.pending[0]
                lib = rec.module.lib
                lib.hccc_cpu_wait(rec.handle, -1.0)
                t0, t1 = ctypes.c_uint64(), ctypes.c_uint64()
                lib.hccc_cpu_times(rec.handle, ctypes.byref(t0), ctypes.byref(t1))
                lib.hccc_cpu_release(rec.handle)
                rec.start_ns, rec.end_ns = t0.value, t1.value
                s.pending.pop(0)

    def timer(self) -> CpuTimer:
        return CpuTimer(self)

    def max_resident_blocks(self, fn: Any, block: int) -> int:
        return max(0, self.max_threads // max(1, int(block)))

    def residency_advice(self, need: int, block: int) -> str:
        """The emulation's limit is its thread budget (every block is ``block`` OS threads): a larger
        budget, where the machine allows that many threads, runs the program as it is."""
        more = (f"raise the emulation's thread budget of {self.max_threads} with HCCC_CPU_MAX_THREADS="
                f"{int(need) * int(block)} where the machine allows that many OS threads (one per thread of a block)")
        return more if int(block) <= 1 else "use fewer threads per block, or " + more

    def runs_sources(self, platform: str) -> bool:
        return platform in ("cuda", "hip")

    def shares_memory_with(self, other: Platform) -> bool:
        return isinstance(other, CpuPlatform)     # host memory, one address space

    def close(self) -> None:
        if any(s.pending for s in self._streams):
            return  # kernels still running (a stuck launch): their memory must stay
        for backing in self._allocs.values():
            if isinstance(backing, shm.Segment):
                backing.close()
        self._imported.clear()
        self._allocs.clear()
        self._sizes.clear()
        self._starts.clear()


register("cpu", CpuPlatform)

__all__ = ["CpuPlatform", "CpuModule", "CpuKernel", "CpuStream", "CpuTimer"]
