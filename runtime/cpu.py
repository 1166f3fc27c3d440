"""CPU emulation platform: the emitted kernel sources compiled with g++ and ``hccc_cpu_emu.h``.

Build: :mod:`hccc.runtime.cpu_build` (:class:`~hccc.runtime.cpu_build.CpuToolchain`); memory:
:mod:`hccc.runtime.cpu_memory` (:class:`~hccc.runtime.cpu_memory.CpuMemory`); the platform joins
them to the execution below.
Environment: ``HCCC_CXX`` (compiler, default ``g++``), ``HCCC_CPU_OPT`` (default ``-O1``),
``HCCC_CPU_JOBS`` (translation units compiled at once, default the number of CPUs,
:func:`build_jobs`), ``HCCC_CPU_MAX_THREADS`` (budget of emulated threads, default 16384 or half
of what the system's limit on memory mappings leaves room for, :func:`thread_budget`), ``HCCC_CPU_WORKERS`` (OS threads that run
them, default the cores available, :func:`worker_count`), ``HCCC_CPU_RESIDENT_BLOCKS`` (the
partial-residency mode below), ``HCCC_CPU_SANITIZE`` (``address``: the AddressSanitizer build
below).

AddressSanitizer (``CpuPlatform(sanitize="address")``, ``hccc run --sanitize``). The kernels and
the launcher are compiled with ``-fsanitize=address`` and every buffer (inputs, outputs, scratch,
FIFO slots, counters) is its own ``posix_memalign`` block, so ASan puts a poisoned redzone right
after its last byte: a kernel that touches one element past a chunk's buffer stops the process
with ASan's report. The ASan runtime must be the first library of the process
(``LD_PRELOAD=`` :func:`asan_runtime`); the platform refuses to start otherwise.

Execution (this module). A launch creates ``grid x block`` fibers (one per emulated GPU thread,
``cpu_launcher.cpp``), run by a pool of at most :attr:`CpuPlatform.workers` OS threads per module
(each fiber runs until it waits; every wait of the emulation yields to the pool, and the workers
run at the same time), and returns at once; ``synchronize`` waits for every launch of every
stream. Memory is host memory (:mod:`hccc.runtime.cpu_memory`); pointers are plain addresses.
Timers use the steady clock (see :class:`CpuTimer`). Kernel timeouts are in nanoseconds.

Partial residency (``CpuPlatform(resident_blocks=K)``, ``HCCC_CPU_RESIDENT_BLOCKS=K``, ``hccc run
--resident-blocks K``): a launch runs at most K of its blocks at once, admitted in block order as a
GPU dispatches them, a block's place taken by the next when it returns, as on a GPU whose SMs are
held by other kernels. A block that waits on a block of its own launch not yet admitted then
waits until its timeout (the run is reported stuck, naming the block): this mode finds such
waits. The runtime refuses before launch what would wait so (:meth:`CpuPlatform.launch_residency`,
:func:`hccc.runtime.rank_residency.check_rank_residency`), and a one-grid launch, cooperative,
whenever its grid exceeds K.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hccc.runtime.cpu_build import CpuToolchain
from hccc.runtime.cpu_memory import CpuMemory
from hccc.runtime.kernel_abi import Args
from hccc.runtime.memory_limits import out_of_memory
from hccc.runtime.platform import DevicePtr, Instance, Module, Platform, PlatformError, Timer, register

_ABORT_OFFSET = Args.abort_flag.offset
#: how the launcher (cpu_launcher.cpp) begins the message of a launch the system has no memory or
#: threads for (``new`` failing, ``pthread_create`` failing with EAGAIN)
_NO_RESOURCES = ("out of memory", "cannot start")
#: threads per TB when the caller does not choose (the emitted kernels ask for 512 and more)
DEFAULT_BLOCK_THREADS = 2
SANITIZERS = ("address",)


#: the most emulated threads (fibers) the emulation holds at once unless ``HCCC_CPU_MAX_THREADS``
#: says otherwise (and less where the system allows fewer, :func:`thread_budget`): a fiber holds a
#: 256 KiB stack (reserved, little of it touched) and some 40 KiB resident; a synthesised 20-GPU
#: ReduceScatter of 8,554 blocks ran in 348 MB at one thread per block (then OS threads)
MAX_THREADS = 16384
#: memory mappings a fiber's stack takes: the stack and its guard page below it
MAPPINGS_PER_FIBER = 2


def _system_thread_limits() -> list[int]:
    """Half of the fibers the system's limit on a process's memory mappings leaves room for
    (``vm.max_map_count``, :data:`MAPPINGS_PER_FIBER` a fiber), the other half left to
    everything else. (The fibers run on a few OS threads: the limits on threads do not bound them.)"""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            text = f.read().strip()
    except OSError:
        return []
    return [int(text) // MAPPINGS_PER_FIBER // 2] if text.isdigit() and int(text) > 0 else []


def thread_budget() -> int:
    """The emulation's thread budget: ``HCCC_CPU_MAX_THREADS`` where set (a positive integer),
    else :data:`MAX_THREADS` or half of what the system allows, whichever is less (at least 64)."""
    v = _positive_env("HCCC_CPU_MAX_THREADS", "threads")
    return v if v is not None else max(64, min([MAX_THREADS, *_system_thread_limits()]))


def worker_count() -> int:
    """OS threads that run a module's fibers: ``HCCC_CPU_WORKERS`` where set (a positive integer),
    else the cores this process may run on (more would only take turns on them)."""
    v = _positive_env("HCCC_CPU_WORKERS", "threads")
    if v is not None:
        return v
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def residency_limit() -> int | None:
    """The partial-residency mode's blocks per launch: ``HCCC_CPU_RESIDENT_BLOCKS`` where set (a
    positive integer), else None (every block of a launch resident)."""
    return _positive_env("HCCC_CPU_RESIDENT_BLOCKS", "blocks")


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
        lib.hccc_cpu_configure.argtypes = [ctypes.c_int]
        lib.hccc_cpu_configure.restype = None
        lib.hccc_cpu_os_threads.argtypes = []
        lib.hccc_cpu_os_threads.restype = ctypes.c_int
        lib.hccc_cpu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_uint64]
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

    def os_threads(self) -> int:
        """Worker threads this module runs now (0 when no launch of it is running)."""
        return int(self.lib.hccc_cpu_os_threads())

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
    """The CPU emulation: modules built by its :class:`~hccc.runtime.cpu_build.CpuToolchain`,
    buffers held by its :class:`~hccc.runtime.cpu_memory.CpuMemory`, and launches run as fibers
    on ``workers`` OS threads per module (this class); ``resident_blocks``: the partial-residency
    mode (module docstring)."""
    name = "cpu"
    source_platform = "cuda"
    ticks_per_us = 1000.0

    def __init__(self, *, cxx: str | None = None, opt: str | None = None, jobs: int | None = None,
                 cache_dir: str | os.PathLike | None = None, max_threads: int | None = None,
                 source_platform: str = "cuda", sanitize: str | None = None,
                 workers: int | None = None, resident_blocks: int | None = None):
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
        #: the sources emitted when a homogeneous program is generated for this platform
        self.source_platform = source_platform
        #: the compiler, its flags and the objects shared by every build
        self.toolchain = CpuToolchain(cxx or os.environ.get("HCCC_CXX") or "g++",
                                      opt or os.environ.get("HCCC_CPU_OPT") or "-O1",
                                      max(1, jobs or build_jobs()), sanitize)
        self.cache_dir = cache_dir
        self.max_threads = max_threads or thread_budget()
        for name, v in (("workers", workers), ("resident_blocks", resident_blocks)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise PlatformError(f"{name} must be a positive integer, not {v!r}")
        #: OS threads that run a module's fibers
        self.workers = workers or worker_count()
        #: the partial-residency mode: at most this many blocks of a launch at once (None: all)
        self.resident_blocks = resident_blocks if resident_blocks is not None else residency_limit()
        #: every allocation, own and imported
        self.memory = CpuMemory(bool(sanitize))
        self._streams: list[CpuStream] = []
        self._sync_lock = threading.Lock()
        self._held: list[_Launch] | None = None    # launches waiting for CpuTimer.stop()

    @property
    def cxx(self) -> str:
        return self.toolchain.cxx

    @property
    def opt(self) -> str:
        return self.toolchain.opt

    @property
    def jobs(self) -> int:
        return self.toolchain.jobs

    # ---------------------------------------------------------------- memory (CpuMemory)
    def malloc(self, nbytes: int) -> DevicePtr:
        return self.memory.malloc(nbytes)

    def free(self, ptr: DevicePtr) -> None:
        self.memory.free(ptr)

    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        return self.memory.ipc_malloc(nbytes)

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        return self.memory.ipc_export(ptr)

    def ipc_import(self, handle: bytes) -> DevicePtr:
        return self.memory.ipc_import(handle)

    def ipc_seal(self, ptr: DevicePtr) -> None:
        self.memory.ipc_seal(ptr)

    def ipc_close(self, ptr: DevicePtr) -> None:
        self.memory.ipc_close(ptr)

    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        self.memory.memcpy_htod(dst, src)

    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        self.memory.memcpy_dtoh(dst, src)

    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None:
        self.memory.memset(ptr, value, nbytes)

    # ---------------------------------------------------------------- code (CpuToolchain)
    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False) -> Path:
        return self.toolchain.build(outdir, manifest, instance, ranks, single_gpu=single_gpu,
                                    cache_dir=self.cache_dir)

    def build_identity(self) -> tuple:
        """The toolchain (compiler, its flags), the cache and what the sources are emulated as:
        all a build depends on beyond its arguments."""
        tc = self.toolchain
        return ("cpu", tc.cxx, tc.opt, tc.sanitize, self.source_platform,
                None if self.cache_dir is None else str(self.cache_dir))

    def load(self, path: Path) -> CpuModule:
        module = CpuModule(Path(path))
        module.lib.hccc_cpu_configure(int(self.workers))
        return module

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
                                          int(self.resident_blocks or 0), 0 if hold else 1, err, len(err))
        if not h:
            # the ranks already launched would wait for this one until their timeout: abort them
            if len(args) >= _ABORT_OFFSET + 8:
                flag = int.from_bytes(bytes(args)[_ABORT_OFFSET:_ABORT_OFFSET + 8], "little")
                if flag:
                    ctypes.c_uint32.from_address(flag).value = 1
            self._release()
            why = err.value.decode(errors="replace")
            if why.startswith(_NO_RESOURCES):
                # no memory for the threads' stacks (an address-space limit) or no threads left
                raise out_of_memory(f"the {grid} x {block} threads of {fn.symbol}", None, why)
            raise PlatformError(f"launch of {fn.symbol} failed: {why}")
        rec = _Launch(fn.module, h)
        if hold:
            self._held.append(rec)
        stream.pending.append(rec)
        stream.last = rec

    def launch_grid(self, fn: Any, grid: int, block: int, args: bytes, stream: Any, *,
                    abort_flag: int = 0) -> None:
        """The one-grid entry: a plain launch whose blocks all run at once, refused in the
        partial-residency mode when they cannot (a one-grid launch is cooperative: its ranks'
        blocks wait on each other)."""
        k = self.resident_blocks
        if k is not None and grid > k:
            raise PlatformError(f"cannot launch {getattr(fn, 'symbol', 'the one-grid entry')} cooperatively: "
                                f"its {grid} blocks wait on each other but at most {k} are resident at once "
                                f"(HCCC_CPU_RESIDENT_BLOCKS={k}); launch each rank on its own (--launch per-rank)")
        self.launch(fn, grid, block, args, stream)

    def launch_residency(self) -> int | None:
        """Blocks of one launch resident at once: the partial-residency mode's K, else None (all)."""
        return self.resident_blocks

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
        """The emulation's limit is its thread budget (every block is ``block`` fibers): a larger
        budget, where the machine allows that many stacks, runs the program as it is."""
        more = (f"raise the emulation's thread budget of {self.max_threads} with HCCC_CPU_MAX_THREADS="
                f"{int(need) * int(block)} where the machine allows that many fiber stacks (one per thread "
                "of a block: 256 KiB reserved each, two memory mappings, vm.max_map_count)")
        return more if int(block) <= 1 else "use fewer threads per block, or " + more

    def runs_sources(self, platform: str) -> bool:
        return platform in ("cuda", "hip")

    def shares_memory_with(self, other: Platform) -> bool:
        return isinstance(other, CpuPlatform)     # host memory, one address space

    def close(self) -> None:
        if any(s.pending for s in self._streams):
            return  # kernels still running (a stuck launch): their memory must stay
        self.memory.close()


register("cpu", CpuPlatform)

__all__ = ["CpuPlatform", "CpuModule", "CpuKernel", "CpuStream", "CpuTimer"]
