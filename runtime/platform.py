"""The platform layer: one interface for memory, modules and launches, with a
CPU-emulation, a CUDA and (where a HIP runtime is importable) a HIP implementation, chosen at start.

Everything above this layer (``hccc.runtime.launcher``: buffers, FIFOs, kernel arguments, checking)
is platform-neutral and speaks only the names below. Device memory is addressed by integer pointers
(``DevicePtr``), so argument structs can be packed the same way everywhere.

Model (CUDA's, which the CPU emulation follows):
- ``malloc(nbytes)`` returns 256-byte-aligned, zeroed memory; ``free`` releases it.
- ``memcpy_htod`` / ``memcpy_dtoh`` / ``memset`` are synchronous with respect to the host.
- ``build(outdir, manifest, instance, ranks)`` compiles the emitted sources of ``ranks`` (one module
  per call, cached by content hash) and ``load(path)`` returns a :class:`Module` whose
  ``function(symbol)`` gives a launchable kernel. A mixed-vendor program is built per manifest
  platform (the split the emitted build files make): the launcher calls ``build`` once per platform
  present, with that platform's ranks, on the Platform object that runs them.
- ``runs_sources(platform)`` says whether this platform can run the ranks the manifest gives to
  ``platform`` ("cuda"/"hip"); ``shares_memory_with(other)`` whether memory it allocates can be
  written by kernels of ``other`` (FIFOs live in the receiver's memory, so every pair of platforms
  of one run must share memory).
- ``launch(fn, grid, block, args, stream)`` starts a kernel asynchronously on ``stream``;
  ``synchronize()`` waits for every stream. Kernels of different streams run concurrently (the
  generated kernels of different ranks spin on each other, so they must).
- ``timer()`` measures device time between two points on a stream (CUDA events; host clock on CPU).
- ``max_resident_blocks(fn, block)`` says how many blocks of ``fn`` can be resident at once, so the
  launcher can refuse plainly instead of deadlocking; ``launch_residency()`` how many blocks of one
  per-rank launch are sure to run at once (None: all; a rank whose blocks wait on each other needs
  them all).
- IPC, for one rank per process (:mod:`hccc.runtime.communicator`): ``ipc_malloc`` allocates memory
  that other processes of this host can map, ``ipc_export(ptr)`` gives its handle as opaque bytes
  (the caller moves them through its bootstrap), ``ipc_import(handle)`` maps a peer's memory here,
  ``ipc_seal(ptr)`` says every peer has mapped it (names that could outlive a killed process are
  dropped), ``ipc_close(ptr)`` unmaps an imported pointer; ``free`` releases ``ipc_malloc``
  memory. CPU: POSIX shared memory; CUDA: ``cudaIpcGetMemHandle``; HIP: ``hipIpcGetMemHandle`` on
  fine-grained memory.
"""
from __future__ import annotations

import abc
import importlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hccc.util import dtypes as dtypes_table

DevicePtr = int


class PlatformError(RuntimeError):
    """A platform cannot be used (missing compiler or runtime, no device, ...); message for the user."""


@dataclass(frozen=True)
class Instance:
    """One kernel instantiation: element type and reduction operator."""

    dtype: str   # a name of hccc.util.dtypes.DTYPES
    op: str      # a name of hccc.util.dtypes.OPS


#: the C type of each dtype in the emitted kernels' instantiation macro (``HCCC_FOR_EACH_INSTANCE``)
CTYPES = {d.name: d.ctype for d in dtypes_table.DTYPES}
#: the reduction-operator constant of each op in the same macro
RED_CONSTS = {o.name: o.const for o in dtypes_table.OPS}


#: the environment variable that builds the kernels with bulk copies (``-DHCCC_TMA=1``: sm_90's
#: TMA, and the CPU emulation's model of it; no other platform has them): "1" on, "0" or unset off.
#: Off by default until a GPU run shows the bulk path wins (docs/kernel-protocol.md, *Bulk copies*;
#: ``benchmarks/gpu_validate.py --quick`` measures both).
TMA_ENV = "HCCC_TMA"


def build_switches(manifest: dict | None = None) -> list[str]:
    """The kernel build's switches the environment asks for (:data:`TMA_ENV`): compiler flags,
    part of every build's cache key; PlatformError for a value other than 0 or 1, and for bulk
    copies asked of a program (``manifest``) whose decoded table leaves them too little shared
    memory (:data:`hccc.compiler.backend.prim_table.TMA_PTABLE_BUDGET_BYTES`)."""
    v = os.environ.get(TMA_ENV, "").strip()
    if v in ("", "0"):
        return []
    if v != "1":
        raise PlatformError(f"{TMA_ENV}={v!r}: expected 0 (the portable copy path) or 1 (bulk copies)")
    from hccc.compiler.backend.prim_table import BULK_CELL_BYTES, TMA_PTABLE_BUDGET_BYTES
    m = manifest or {}
    table = int((m.get("stats") or {}).get("prim_table_bytes") or 0)
    if table > TMA_PTABLE_BUDGET_BYTES:
        raise PlatformError(f"{TMA_ENV}=1: bulk copies take {BULK_CELL_BYTES:,} bytes of a block's shared memory "
                            f"beside the decoded table, and {m.get('algorithm', 'this program')}'s table of "
                            f"{table:,} bytes leaves too little (at most {TMA_PTABLE_BUDGET_BYTES:,} with them); "
                            f"unset {TMA_ENV} to build it")
    return ["-DHCCC_TMA=1"]


def instance_expansion(instance: Instance) -> str:
    """What ``HCCC_FOR_EACH_INSTANCE(X)`` expands to so that only ``instance``'s kernels compile:
    ``X(dtype, C type, op, reduction constant)`` (the platforms check the instance first)."""
    why = dtypes_table.instance_error(instance.dtype, instance.op)
    if why:
        raise PlatformError(why)
    return f"X({instance.dtype}, {CTYPES[instance.dtype]}, {instance.op}, {RED_CONSTS[instance.op]})"


class Module(abc.ABC):
    @abc.abstractmethod
    def function(self, symbol: str) -> Any:
        """The kernel named ``symbol`` (raises PlatformError when absent)."""


class Timer(abc.ABC):
    @abc.abstractmethod
    def start(self, stream: Any = None) -> None: ...

    @abc.abstractmethod
    def stop(self, stream: Any = None) -> None: ...

    @abc.abstractmethod
    def elapsed_us(self) -> float:
        """Microseconds between start and stop (synchronises)."""


class Platform(abc.ABC):
    #: "cpu", "cuda" or "hip" (the manifest's platform names; "cpu" runs the "cuda" sources)
    name: str = ""
    #: manifest platform whose sources this platform compiles
    source_platform: str = ""
    #: the kernel timeout is counted in these ticks per microsecond (hccc_clock(): nanoseconds on
    #: CUDA and the CPU, wall_clock64 ticks on HIP)
    ticks_per_us: float = 1000.0

    # ---------------------------------------------------------------- memory
    @abc.abstractmethod
    def malloc(self, nbytes: int) -> DevicePtr: ...

    @abc.abstractmethod
    def free(self, ptr: DevicePtr) -> None: ...

    def malloc_peer(self, nbytes: int) -> DevicePtr:
        """Device memory that kernels of other devices read and write while running (FIFO slots
        and counters): coherent across GPUs during a kernel. Freed with :meth:`free`. The default
        is :meth:`malloc` (CUDA peer memory is coherent); HIP allocates fine-grained memory."""
        return self.malloc(nbytes)

    def host_flags(self, nbytes: int) -> DevicePtr:
        """Zeroed host memory that kernels read and write (pinned and mapped: one address on the
        host and the devices) and that the host writes with plain stores (``ctypes``) while
        kernels run. Freed with :meth:`free`. The CPU emulation's memory is host memory."""
        return self.malloc(nbytes)

    @abc.abstractmethod
    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        """Copy a contiguous numpy array (or bytes) to device memory."""

    @abc.abstractmethod
    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        """Fill a contiguous numpy array from device memory."""

    @abc.abstractmethod
    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None: ...

    # ---------------------------------------------------------------- code
    @abc.abstractmethod
    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False) -> Path:
        """Compile the emitted sources of ``ranks`` (all when None) for ``instance``; returns the
        path of a loadable module (a shared library, cubin, ...). Cached by content hash.
        ``single_gpu``: every rank of the run is on one device, so the kernels may order memory at
        GPU scope instead of system scope (``-DHCCC_SINGLE_GPU=1``)."""

    def build_identity(self) -> tuple | None:
        """What :meth:`build`'s result depends on beyond its arguments, where two platform objects
        with equal identities build the same module from the same arguments (so that ranks of one
        process may build once), or None: nothing promised (each object builds its own)."""
        return None

    @abc.abstractmethod
    def load(self, path: Path) -> Module: ...

    # ---------------------------------------------------------------- execution
    @abc.abstractmethod
    def stream(self) -> Any: ...

    @abc.abstractmethod
    def launch(self, fn: Any, grid: int, block: int, args: bytes, stream: Any) -> None:
        """Start ``fn`` with ``grid`` blocks of ``block`` threads; ``args`` is the packed argument
        struct (the kernels take one ``hccc_args`` by value)."""

    def launch_grid(self, fn: Any, grid: int, block: int, args: bytes, stream: Any, *,
                    abort_flag: int = 0) -> None:
        """Start a one-grid entry (every rank of a single-device run in one launch, ``args`` a
        packed ``hccc_grid_args``) so that all ``grid`` blocks are resident at once, or raise
        PlatformError saying why they cannot be (``abort_flag``: the ranks' abort flag, raised
        when a failing launch leaves other kernels waiting). Here: a plain launch (the CPU emulation runs every
        block as its own threads, so all of them run together); the GPU platforms launch
        cooperatively."""
        self.launch(fn, grid, block, args, stream)

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    @abc.abstractmethod
    def timer(self) -> Timer: ...

    @abc.abstractmethod
    def max_resident_blocks(self, fn: Any, block: int) -> int: ...

    def launch_residency(self) -> int | None:
        """How many blocks of one per-rank launch are sure to be resident at once: None when all of
        them are once the launch is admitted (the rule of :meth:`max_resident_blocks`); a number
        where fewer may be (the CPU emulation's partial-residency mode), so that a rank whose
        blocks wait on each other is refused before it is launched
        (:func:`hccc.runtime.rank_residency.check_rank_residency`)."""
        return None

    def block_threads(self, emitted: int) -> int:
        """Threads per block to launch when the caller does not choose; ``emitted`` is what the
        kernels were generated for (manifest ``nthreads``). The CPU emulation launches fewer."""
        return int(emitted)

    def residency_advice(self, need: int, block: int) -> str:
        """What the user can do when ``need`` blocks of ``block`` threads on one device would not be
        resident at once (the end of the launcher's refusal)."""
        return ("compile the program into fewer blocks per rank (--channels 1, --tb-alloc state), "
                "or place fewer ranks on each device")

    def least_block_threads(self, flavour: str) -> int:
        """The fewest threads per block a kernel of ``flavour`` (``"cuda"``, ``"hip"``) may be
        launched with here, when too many blocks would otherwise not be resident at once: on a
        GPU the sync warp (wavefront) and two data warps
        (:func:`hccc.compiler.passes.kernel_cost.least_block_threads`: a block of one data warp
        moves its units at a fraction of the rate, so a program is better packed into fewer
        blocks); the CPU emulation runs any count."""
        from hccc.compiler.backend.codegen import WARP_SIZE
        from hccc.compiler.passes.kernel_cost import least_block_threads
        return least_block_threads(WARP_SIZE[flavour]) if flavour in WARP_SIZE else 1

    # ---------------------------------------------------------------- devices (one rank per GPU)
    def device_count(self) -> int:
        """Devices this platform places ranks on (1: every rank on one device)."""
        return 1

    def placement(self, nranks: int) -> list[int]:
        """Device of each rank. A launcher calls ``set_device(placement[r])`` before allocating
        rank ``r``'s buffers and the FIFOs it receives on, and before creating its stream."""
        return [0] * nranks

    def set_device(self, index: int) -> None:
        """Make device ``index`` current for the following malloc / stream calls."""
        if index != 0:
            raise PlatformError(f"{self.name or 'this platform'} has a single device, not {index}")

    def enable_peer_access(self, devices: list[int]) -> None:
        """Let each of ``devices`` write the others' memory (FIFOs live in the receiver's memory);
        PlatformError naming the pair when impossible. Nothing to do with one device."""

    # ---------------------------------------------------------------- mixed-vendor programs
    def runs_sources(self, platform: str) -> bool:
        """Whether this platform can build and run the ranks a manifest gives to ``platform``
        ("cuda" or "hip"). A GPU platform runs its own sources only; the CPU emulation runs both."""
        return platform == self.source_platform

    def shares_memory_with(self, other: "Platform") -> bool:
        """Whether kernels launched through ``other`` can read and write memory allocated here (and
        the reverse). Two objects of one GPU runtime are not assumed to share; the CPU emulation
        allocates host memory, which every CPU-emulated kernel reaches."""
        return other is self

    # ---------------------------------------------------------------- IPC (one rank per process)
    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        """Zeroed memory that other processes of this host can map (see :meth:`ipc_export`)."""
        raise PlatformError(f"the {self.name or 'this'} platform cannot share memory between processes")

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        """Opaque handle of memory from :meth:`ipc_malloc`, for :meth:`ipc_import` in a peer."""
        raise PlatformError(f"the {self.name or 'this'} platform cannot share memory between processes")

    def ipc_import(self, handle: bytes) -> DevicePtr:
        """Map a peer's exported memory into this process; its address here."""
        raise PlatformError(f"the {self.name or 'this'} platform cannot share memory between processes")

    def ipc_seal(self, ptr: DevicePtr) -> None:
        """Every peer has imported ``ptr``: drop what could outlive a killed process (names)."""

    def ipc_close(self, ptr: DevicePtr) -> None:
        """Unmap memory mapped by :meth:`ipc_import`."""
        raise PlatformError(f"the {self.name or 'this'} platform cannot share memory between processes")

    def close(self) -> None:
        """Release what the platform holds (modules, memory pools)."""


_FACTORIES: dict[str, Callable[[], Platform]] = {}


def register(name: str, factory: Callable[[], Platform]) -> None:
    _FACTORIES[name] = factory


def available() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def get_platform(name: str) -> Platform:
    """The platform named ``name`` ("cpu", "cuda", "hip"); PlatformError with the reason when it
    cannot be used here."""
    _load_builtin()
    if name not in _FACTORIES:
        raise PlatformError(f"unknown backend '{name}' (known: {', '.join(sorted(_FACTORIES))})")
    return _FACTORIES[name]()


#: built-in implementations, found by module name (each registers itself when imported)
_BUILTIN = {"cpu": "hccc.runtime.cpu", "cuda": "hccc.runtime.cuda", "hip": "hccc.runtime.hip"}


#: the built-in implementations were imported (each registered, or registered as missing)
_BUILTIN_LOADED = threading.Event()
_BUILTIN_LOCK = threading.Lock()


def _load_builtin() -> None:
    """Import every built-in implementation once (ranks in threads ask at once: the first imports,
    the others wait), also where one of them was imported before (it registered only itself)."""
    if _BUILTIN_LOADED.is_set():
        return
    with _BUILTIN_LOCK:
        if _BUILTIN_LOADED.is_set():
            return
        for name, module in _BUILTIN.items():
            try:
                importlib.import_module(module)
            except ImportError as exc:
                if name == "cpu":
                    raise
                if name not in _FACTORIES:
                    _register_missing(name, str(exc))
        _BUILTIN_LOADED.set()


def _register_missing(name: str, reason: str) -> None:
    def _missing() -> Platform:
        raise PlatformError(f"the {name.upper()} backend is not available in this installation ({reason})")
    register(name, _missing)
