"""What the CUDA and HIP platforms share (DESIGN.md section 7): both runtimes have the same module,
stream, event and launch calls, so one :class:`GpuPlatform` drives either through an API object that
offers them under the names CuPy gives them (``hccc.runtime.cuda`` passes CuPy's runtime and driver
modules, ``hccc.runtime.hip`` a ctypes binding of libamdhip64). What differs per runtime is gathered
in class attributes and the ``_open_api`` / ``_detect_arch`` / ``_module_symbols`` / ``build`` hooks.

Also here, as plain functions: kernel symbols, the translation unit of a set of ranks, the compile
cache, the ELF symbol reader and the residency rule (every rank's thread blocks must be resident at
once, since they spin on each other); placement of ranks on devices.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from hccc.runtime import cache
from hccc.runtime.kernel_abi import Args
from hccc.util import dtypes as dtypes_table
from hccc.runtime.platform import (CTYPES, RED_CONSTS, DevicePtr, Instance, Module, Platform, PlatformError,
                                   Timer, instance_expansion)

GATE_SYMBOL = "hccc_runtime_gate"

#: an exported GPU allocation: magic, platform name, size, the runtime's 64-byte IPC handle
_IPC_HANDLE = struct.Struct("<8s8sQ64s")
_IPC_MAGIC = b"HCCCIPC1"

#: the gate kernel's one argument, ``hccc_gate_args``: the flag's address and the timeout in clock ticks
GATE_ARGS = struct.Struct("<QQ")

#: byte offset of ``abort_flag`` in the packed ``hccc_args``
ARGS_ABORT_OFFSET = Args.abort_flag.offset

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")

# ---------------------------------------------------------------------------------- naming
def kernel_symbol(manifest: dict, rank: int, instance: Instance) -> str:
    """The ``extern "C"`` name of ``rank``'s kernel for ``instance``, from the manifest's
    ``kernel_symbol`` pattern (``{kernel}_{dtype}_{op}``)."""
    _check_instance(instance)
    entry = _rank_entry(manifest, rank)
    pattern = manifest.get("kernel_symbol", "{kernel}_{dtype}_{op}")
    if not isinstance(pattern, str):
        raise PlatformError("manifest.json: kernel_symbol must be a string")
    sym = (pattern.replace("{kernel}", str(entry.get("kernel", "")))
           .replace("{dtype}", instance.dtype).replace("{op}", instance.op))
    if not _IDENT.fullmatch(sym):
        raise PlatformError(f"manifest.json: rank {rank} kernel symbol {sym!r} is not an identifier")
    return sym



# ---------------------------------------------------------------------------------- building
def _check_instance(instance: Instance) -> None:
    if instance.dtype not in CTYPES:
        raise PlatformError(f"unknown dtype '{instance.dtype}' (known: {', '.join(CTYPES)})")
    if instance.op not in RED_CONSTS:
        raise PlatformError(f"unknown op '{instance.op}' (known: {', '.join(RED_CONSTS)})")
    why = dtypes_table.instance_error(instance.dtype, instance.op)
    if why:
        raise PlatformError(why)


def _rank_entry(manifest: dict, rank: int) -> dict:
    ranks = manifest.get("ranks")
    if not isinstance(ranks, list) or not 0 <= rank < len(ranks) or not isinstance(ranks[rank], dict):
        raise PlatformError(f"manifest.json has no rank {rank}")
    return ranks[rank]


def rank_source(manifest: dict, rank: int, platform: str) -> str:
    """File name of ``rank``'s ``platform`` source (validated: a plain name inside OUTDIR)."""
    entry = _rank_entry(manifest, rank)
    src = (entry.get("sources") or {}).get(platform)
    if src is None and entry.get("platform") == platform:
        src = entry.get("source")
    if src is None:
        raise PlatformError(f"rank {rank} has no {platform} source in manifest.json "
                            f"(regenerate with --target {platform} or --target all)")
    if not isinstance(src, str) or not _FILENAME.fullmatch(src):
        raise PlatformError(f"manifest.json: rank {rank} source {src!r} is not a plain file name")
    return src


def grid_source(manifest: dict, platform: str, ranks: Sequence[int]) -> str | None:
    """File name of the one-grid entry's ``platform`` source (manifest ``grid``), when ``ranks`` is
    every rank of the program and the manifest has one; else None (the entry calls every rank's
    block function, so it compiles only next to all of them)."""
    entry = (manifest.get("grid") or {}).get(platform)
    if entry is None or sorted(ranks) != list(range(len(manifest.get("ranks") or []))):
        return None
    src = entry.get("source") if isinstance(entry, dict) else None
    if not isinstance(src, str) or not _FILENAME.fullmatch(src):
        raise PlatformError(f"manifest.json: grid source {src!r} is not a plain file name")
    return src


def grid_symbol(manifest: dict, platform: str, instance: Instance) -> str | None:
    """The ``extern "C"`` name of the one-grid entry for ``instance`` (the ``kernel_symbol``
    pattern over manifest ``grid``'s kernel), or None when the manifest has none for ``platform``."""
    _check_instance(instance)
    entry = (manifest.get("grid") or {}).get(platform)
    if not isinstance(entry, dict):
        return None
    pattern = manifest.get("kernel_symbol", "{kernel}_{dtype}_{op}")
    sym = (str(pattern).replace("{kernel}", str(entry.get("kernel", "")))
           .replace("{dtype}", instance.dtype).replace("{op}", instance.op))
    if not _IDENT.fullmatch(sym):
        raise PlatformError(f"manifest.json: grid kernel symbol {sym!r} is not an identifier")
    return sym


def select_ranks(manifest: dict, ranks: Iterable[int] | None) -> list[int]:
    n = len(manifest.get("ranks") or [])
    if n == 0:
        raise PlatformError("manifest.json lists no ranks")
    sel = list(range(n)) if ranks is None else sorted(set(int(r) for r in ranks))
    bad = [r for r in sel if not 0 <= r < n]
    if bad:
        raise PlatformError(f"rank {bad[0]} is out of range (the program has {n} ranks)")
    return sel


def translation_unit(manifest: dict, instance: Instance, ranks: Sequence[int], platform: str,
                     *, gate: bool = True) -> str:
    """Source of one module: ``instance``'s kernels of every rank in ``ranks`` (the emitted sources
    are included, so they compile exactly as written), the one-grid entry when ``ranks`` is every
    rank (:func:`grid_source`), plus the timer's gate kernel."""
    _check_instance(instance)
    lines = [f"// hccc runtime module: {instance.dtype}_{instance.op}, {platform}, ranks "
             + ",".join(map(str, ranks)),
             f"#define HCCC_FOR_EACH_INSTANCE(X) {instance_expansion(instance)}"]
    # (table mode: every rank names the same generic source, included once)
    # ... and, with every rank, the one-grid entry (it calls their block functions)
    srcs = [rank_source(manifest, r, platform) for r in ranks] + [grid_source(manifest, platform, ranks)]
    lines += [f'#include "{src}"' for src in dict.fromkeys(s for s in srcs if s)]
    if gate:
        lines += [
            "// Spins until the host sets *flag (or the timeout passes): holds queued kernels back",
            "// so that every rank starts together.",
            "// One parameter, a struct, like every hccc kernel: the launch passes one pointer to",
            "// the packed argument bytes (cuLaunchKernel / hipModuleLaunchKernel kernelParams).",
            "struct hccc_gate_args { const uint32_t* flag; uint64_t timeout; };",
            f'extern "C" HCCC_GLOBAL void {GATE_SYMBOL}(hccc_gate_args g) {{',
            "  const uint64_t t0 = hccc_clock();",
            "  while (hccc_load_u32(g.flag) == 0u) {",
            "    if (g.timeout != 0 && hccc_clock() - t0 > g.timeout) break;",
            "    hccc_spin_pause();",
            "  }",
            "}",
        ]
    return "\n".join(lines) + "\n"


_VERSIONS: dict[str, str] = {}


def find_compiler(tool: str, env_roots: Sequence[str], default_root: str, install_hint: str) -> str:
    """The path of ``tool``: on PATH, else in ``bin/`` under the first of the folders the
    environment variables ``env_roots`` name, then ``default_root``; a PlatformError saying how to
    install it where none has it."""
    import shutil

    path = shutil.which(tool)
    if path is not None:
        return path
    for root in (*(os.environ.get(v) for v in env_roots), default_root):
        if root and os.access(os.path.join(root, "bin", tool), os.X_OK):
            return os.path.join(root, "bin", tool)
    raise PlatformError(f"{tool} not found: {install_hint}")


def compiler_version(tool: str) -> str:
    """``tool --version`` output (cached per process; part of the build cache key)."""
    if tool not in _VERSIONS:
        try:
            res = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
            _VERSIONS[tool] = res.stdout + res.stderr
        except (OSError, subprocess.SubprocessError) as exc:
            raise PlatformError(f"cannot run {tool}: {exc}") from None
    return _VERSIONS[tool]


def compile_module(outdir: Path, manifest: dict, tu: str, ranks: Sequence[int], platform: str,
                   tool: str, flags: list[str], suffix: str) -> Path:
    """Compile the translation unit ``tu`` (which includes ``ranks``' ``platform`` sources from
    ``outdir``) with ``tool FLAGS -I OUTDIR -o OUT TU``; returns OUT, an entry of the build cache
    (:mod:`hccc.runtime.cache`) keyed by the sources, headers, flags and compiler version."""
    outdir = Path(outdir).resolve()
    names = {rank_source(manifest, r, platform) for r in ranks} | {grid_source(manifest, platform, ranks)} - {None}
    names |= {x for x in manifest.get("headers", []) if isinstance(x, str) and _FILENAME.fullmatch(x)}
    try:
        digest = cache.files_digest([outdir / n for n in sorted(names)], outdir)
    except OSError as exc:
        raise PlatformError(f"cannot read the generated sources in {outdir}: {exc}") from None
    key = cache.content_key(platform, tool, " ".join(flags), compiler_version(tool), tu, digest)
    out_name = f"module{suffix}"

    def build(tmp: Path) -> None:
        src = tmp / ("module.hip" if platform == "hip" else "module.cu")
        src.write_text(tu)
        env = dict(os.environ)
        if platform == "hip":
            env.setdefault("HIP_PLATFORM", "amd")
        cmd = [tool, *flags, "-I", str(outdir), "-o", str(tmp / out_name), str(src)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        except OSError as exc:
            raise PlatformError(f"cannot run {tool}: {exc.strerror}") from None
        if res.returncode != 0 or not (tmp / out_name).is_file():
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-20:])
            if platform == "hip" and "invalid target ID 'gfx94" in tail:   # MI300 (CDNA 3)
                tail += ("\n(gfx940 / gfx941 / gfx942, the MI300 series, need ROCm 6.0 or later: its "
                         "clang knows the targets; ROCm 5.x compilers such as Debian's hipcc 5.2 do not)")
            raise PlatformError(f"{Path(tool).name} failed to compile the {platform} kernels of "
                                f"{outdir} (ranks {ranks[0]}..{ranks[-1]}):\n{tail}")

    try:
        return cache.entry(f"{platform}_module", key, build) / out_name
    except OSError as exc:
        raise PlatformError(f"build cache: {exc} (set HCCC_CACHE_DIR to a writable folder)") from None



# ---------------------------------------------------------------------------------- ELF symbols
def elf_symbols(data: bytes | str | Path) -> set[str]:
    """Names of the defined global functions in a 64-bit little-endian ELF image (a cubin or
    an AMDGPU code object): the kernels a module can launch. PlatformError when not such an ELF."""
    if not isinstance(data, (bytes, bytearray)):
        data = Path(data).read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise PlatformError("not a 64-bit little-endian ELF image")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    if e_shentsize < 64 or e_shoff + e_shnum * e_shentsize > len(data):
        raise PlatformError("truncated ELF image")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    out: set[str] = set()
    for _name, sh_type, _fl, _addr, off, size, link, _info, _al, entsize in sections:
        if sh_type not in (2, 11) or entsize < 24 or link >= e_shnum:   # SHT_SYMTAB, SHT_DYNSYM
            continue
        str_off, str_size = sections[link][4], sections[link][5]
        if off + size > len(data) or str_off + str_size > len(data):
            raise PlatformError("truncated ELF image")
        for k in range(size // entsize):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off + k * entsize)
            if (st_info & 0xF) != 2 or (st_info >> 4) != 1 or st_shndx == 0:
                continue   # not STT_FUNC, not STB_GLOBAL, or undefined
            end = data.find(b"\0", str_off + st_name, str_off + str_size)
            if end < 0:
                raise PlatformError("truncated ELF string table")
            out.add(data[str_off + st_name:end].decode("utf-8", "replace"))
    return out


# ---------------------------------------------------------------------------------- residency
@dataclass(frozen=True)
class ResidentKernel:
    """One kernel that must be resident together with the others on one GPU."""

    name: str
    blocks: int        # grid size (thread blocks)
    per_sm: int        # blocks of it one SM holds at once (the occupancy calculator's answer)
    threads: int       # threads per block


def residency_capacity(sms: int, kernels: Sequence[ResidentKernel]) -> int:
    """Blocks that are guaranteed to be resident at once: ``sms * min(per_sm)`` over the kernels
    that launch blocks. Sufficient because a block of any kernel uses at most ``1/per_sm_k <=
    1/min(per_sm)`` of every SM resource, so an SM with fewer than ``min(per_sm)`` blocks accepts
    any further block; exact when all kernels have the same occupancy."""
    used = [k.per_sm for k in kernels if k.blocks > 0]
    return sms * min(used) if used else 0


def check_residency(sms: int, kernels: Sequence[ResidentKernel], *, device: str = "the GPU",
                    max_kernels: int = 128) -> None:
    """Raise PlatformError, with the numbers and what to change, unless every block of every
    kernel can be resident at the same time (the kernels spin on each other)."""
    live = [k for k in kernels if k.blocks > 0]
    if not live:
        return
    if len(live) > max_kernels:
        raise PlatformError(f"cannot run {len(live)} rank kernels at once on {device}: it runs at "
                            f"most {max_kernels} kernels concurrently; spread the ranks over more GPUs")
    dead = [k for k in live if k.per_sm <= 0]
    if dead:
        k = dead[0]
        raise PlatformError(f"kernel {k.name} cannot run on {device}: not one block of {k.threads} "
                            "threads fits on an SM (too many registers or threads); lower nWarps")
    need = sum(k.blocks for k in live)
    cap = residency_capacity(sms, live)
    if need > cap:
        worst = min(live, key=lambda k: k.per_sm)
        raise PlatformError(
            f"cannot run all ranks at once on {device}: their kernels need {need} thread blocks "
            f"resident together but it holds at most {cap} ({sms} SMs x {worst.per_sm} blocks of "
            f"{worst.threads} threads per SM for {worst.name}); the ranks spin on each other, so "
            "they would deadlock. Use more GPUs, fewer ranks, fewer thread blocks per rank "
            "(--tb-alloc state) or fewer warps per block (nWarps)")


def placement_for(nranks: int, ndevices: int) -> list[int]:
    """Device of each rank: all on device 0 with one device; otherwise contiguous blocks of
    ``ceil(nranks / ndevices)`` ranks (one rank per GPU when there are enough GPUs)."""
    if nranks <= 0:
        return []
    if ndevices <= 1:
        return [0] * nranks
    per = -(-nranks // ndevices)
    return [r // per for r in range(nranks)]


# ---------------------------------------------------------------------------------- runtime objects

def _err(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


@contextlib.contextmanager
def _guard(what: str):
    """Turn a failing runtime call into a PlatformError that says what was being done."""
    try:
        yield
    except PlatformError:
        raise
    except Exception as exc:
        raise PlatformError(f"{what} failed: {_err(exc)}") from None


class GpuStream:
    """A non-blocking stream on one device."""

    def __init__(self, handle: int, device: int):
        self.handle = handle
        self.device = device

    def __repr__(self) -> str:
        return f"GpuStream(device={self.device})"


class GpuFunction:
    """A kernel of a loaded module; resolved per device at first use."""

    def __init__(self, module: "GpuModule", symbol: str):
        self.module = module
        self.symbol = symbol
        self._ptr: dict[int, int] = {}

    def handle(self, device: int) -> int:
        if device not in self._ptr:
            pf = self.module.platform
            mod = self.module.handle(device)
            pf.set_device(device)
            try:
                self._ptr[device] = pf._driver.moduleGetFunction(mod, self.symbol)
            except Exception as exc:
                raise PlatformError(f"kernel {self.symbol} not found in {self.module.path}: {_err(exc)}") from None
        return self._ptr[device]

    def __repr__(self) -> str:
        return f"GpuFunction({self.symbol})"


class GpuModule(Module):
    """A cubin, loaded into the context of each device that launches from it."""

    def __init__(self, platform: "GpuPlatform", path: Path):
        self.platform = platform
        self.path = Path(path)
        try:
            self.symbols = platform._module_symbols(self.path)
        except OSError as exc:
            raise PlatformError(f"cannot read {self.path}: {exc.strerror}") from None
        self._handles: dict[int, int] = {}
        self._functions: dict[str, GpuFunction] = {}

    def handle(self, device: int) -> int:
        if device not in self._handles:
            self.platform.set_device(device)
            try:
                self._handles[device] = self.platform._driver.moduleLoad(str(self.path))
            except Exception as exc:
                raise PlatformError(f"cannot load {self.path} on GPU {device}: {_err(exc)} (was it "
                                    f"built for this GPU's architecture? see "
                                    f"{self.platform.arch_env})") from None
        return self._handles[device]

    def function(self, symbol: str) -> GpuFunction:
        if symbol not in self.symbols:
            raise PlatformError(f"kernel {symbol} is not in {self.path.name} "
                                f"(it has {len(self.symbols)} kernels)")
        if symbol not in self._functions:
            self._functions[symbol] = GpuFunction(self, symbol)
        return self._functions[symbol]

    def unload(self) -> None:
        for dev, h in self._handles.items():
            try:
                self.platform.set_device(dev)
                self.platform._driver.moduleUnload(h)
            except Exception:
                pass
        self._handles.clear()


class GpuTimer(Timer):
    """Device time between two points, with the runtime's events.

    ``start(stream)`` / ``stop(stream)`` with a stream time that stream alone. With no stream the
    timer spans *every* stream the platform created (create the streams first): ``start()`` queues
    the gate kernel on a control stream, records the start event behind it and makes every stream
    wait for that event, so kernels launched afterwards stay queued; ``stop()`` records an event on
    every stream, joins them on the control stream, records the stop event, then opens the gate.
    All ranks thus start together and the host's launch loop is not part of the time.
    """

    def __init__(self, platform: "GpuPlatform"):
        self.pf = platform
        self._start: int | None = None
        self._stop: int | None = None
        self._dev = 0

    def start(self, stream: GpuStream | None = None) -> None:
        with _guard("starting the timer"):
            self._start_(stream)

    def stop(self, stream: GpuStream | None = None) -> None:
        if self._start is None:
            raise PlatformError("timer stopped before it was started")
        with _guard("stopping the timer"):
            self._stop_(stream)

    def elapsed_us(self) -> float:
        if self._start is None or self._stop is None:
            raise PlatformError("timer read before it was started and stopped")
        self.pf._open_gate()
        rt = self.pf._runtime
        with _guard("reading the timer"):
            self.pf.set_device(self._dev)
            rt.eventSynchronize(self._stop)
            return float(rt.eventElapsedTime(self._start, self._stop)) * 1000.0

    def _start_(self, stream: GpuStream | None) -> None:
        rt = self.pf._runtime
        self._stop = None
        if stream is not None:
            self._dev = stream.device
            self.pf.set_device(stream.device)
            self._start = self._new_event()
            rt.eventRecord(self._start, stream.handle)
            return
        ctl = self.pf._control_stream()
        self._dev = ctl.device
        self.pf._close_gate(ctl)
        self.pf.set_device(ctl.device)
        self._start = self._new_event()
        rt.eventRecord(self._start, ctl.handle)
        for s in self.pf._streams:
            if s is not ctl:
                self.pf.set_device(s.device)
                rt.streamWaitEvent(s.handle, self._start, 0)

    def _stop_(self, stream: GpuStream | None) -> None:
        rt = self.pf._runtime
        if stream is not None:
            self.pf.set_device(stream.device)
            self._stop = self._new_event()
            rt.eventRecord(self._stop, stream.handle)
            return
        ctl = self.pf._control_stream()
        for s in self.pf._streams:
            if s is not ctl:
                self.pf.set_device(s.device)
                ev = rt.eventCreateWithFlags(rt.eventDisableTiming)
                rt.eventRecord(ev, s.handle)
                self.pf.set_device(ctl.device)
                rt.streamWaitEvent(ctl.handle, ev, 0)
                rt.eventDestroy(ev)       # released once it completes
        self.pf.set_device(ctl.device)
        self._stop = self._new_event()
        rt.eventRecord(self._stop, ctl.handle)
        self.pf._open_gate()

    def _new_event(self) -> int:
        ev = self.pf._runtime.eventCreate()
        self.pf._events.append((self.pf._current, ev))
        return ev



class GpuPlatform(Platform):
    """A GPU runtime with CUDA's API (CUDA through CuPy, HIP through its ctypes binding); see the
    module docstring. Subclasses set the class attributes below and the ``_open_api`` /
    ``_detect_arch`` / ``build`` hooks (``_module_symbols`` reads ELF symbols unless overridden).
    """

    name = ""
    source_platform = ""
    api_name = ""
    devices_env = ""
    arch_env = ""
    #: device attribute ids: multiprocessor count, clock64() rate in kHz
    attr_sms = -1
    attr_clock_khz = -1
    #: concurrent kernels per device
    max_kernels = 1
    #: ticks of the kernels' hccc_clock() per microsecond (None: the attr_clock_khz clock)
    timer_ticks_per_us: float | None = None
    #: flags of the runtime's extMallocWithFlags for memory peers touch (None: plain malloc)
    peer_malloc_flags: int | None = None

    def __init__(self, max_devices: int | None = None):
        self._runtime, self._driver = self._open_api()
        rt = self._runtime
        try:
            count = int(rt.getDeviceCount())
        except Exception as exc:
            raise PlatformError(f"no {self.api_name} device visible ({_err(exc)})") from None
        if count <= 0:
            raise PlatformError(f"no {self.api_name} device visible")
        env = os.environ.get(self.devices_env, "").strip()
        if max_devices is None and env:
            if not env.isdigit() or int(env) < 1:
                raise PlatformError(f"{self.devices_env}={env!r} must be a positive number of GPUs")
            max_devices = int(env)
        self.ndevices = min(count, max_devices) if max_devices else count
        self._current = -1
        self._streams: list[GpuStream] = []
        self._ctl: GpuStream | None = None
        self._events: list[tuple[int, int]] = []
        self._allocs: dict[int, tuple[int, int]] = {}    # ptr -> (nbytes, device)
        self._host_flags: dict[int, int] = {}            # pinned mapped host memory: ptr -> nbytes
        self._alloc_keys: list[int] = []
        self._imported: set[int] = set()                 # mapped from peers' IPC handles
        self._modules: list[GpuModule] = []
        # since the last synchronize: per device, the latest kernel of each stream (kernels of one
        # stream run one after another, so only one per stream must be resident), and the abort
        # flags of every kernel launched
        self._inflight: dict[int, dict[int, tuple[GpuFunction, int, int]]] = {}
        self._abort_ptrs: set[int] = set()
        self._gate: tuple[int, GpuFunction] | None = None   # (host flag pointer, kernel)
        self._gate_fn: GpuFunction | None = None
        # pinned host flags of the timing gate: released ones (a gate kernel may still read them)
        # become free again after a synchronize
        self._released_flags: list[int] = []
        self._free_flags: list[int] = []
        self._sms: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self._occupancy: dict[tuple[int, int, int], int] = {}
        try:
            self.set_device(0)
            self.sms(0)
            self.arch = self._detect_arch()
            clocks = [int(rt.deviceGetAttribute(self.attr_clock_khz, d)) for d in range(self.ndevices)]
            self.device_name = self._device_name(0)
        except PlatformError:
            raise
        except Exception as exc:
            raise PlatformError(f"cannot use {self.api_name} device 0: {_err(exc)}") from None
        if self.timer_ticks_per_us is not None:
            self.ticks_per_us = float(self.timer_ticks_per_us)
        else:   # clock64() ticks: the fastest clock, so a timeout is never shorter than asked for
            self.ticks_per_us = max(clocks) / 1000.0 if max(clocks) > 0 else 2000.0

    def _open_api(self):
        """(runtime, driver) objects offering the CUDA runtime/driver calls; PlatformError if absent."""
        raise NotImplementedError

    def _detect_arch(self) -> str:
        raise NotImplementedError

    def _module_symbols(self, path: Path) -> set[str]:
        return elf_symbols(path)

    def _device_name(self, dev: int) -> str:
        if dev not in self._names:
            self._names[dev] = self._query_name(dev)
        return self._names[dev]

    def _query_name(self, dev: int) -> str:
        try:
            props = self._runtime.getDeviceProperties(dev)
            name = props.get("name", b"")
            name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            return f"GPU {dev} ({name})" if name else f"GPU {dev}"
        except Exception:
            return f"GPU {dev}"

    # ---------------------------------------------------------------- devices
    def device_count(self) -> int:
        return self.ndevices

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.ndevices:
            raise PlatformError(f"GPU {index} is not visible ({self.ndevices} visible)")
        if index != self._current or self._runtime.getDevice() != index:
            try:
                self._runtime.setDevice(index)
                self._runtime.free(0)      # makes the primary context current for the driver API
            except Exception as exc:
                raise PlatformError(f"cannot use GPU {index}: {_err(exc)}") from None
            self._current = index

    def placement(self, nranks: int) -> list[int]:
        return placement_for(nranks, self.ndevices)

    def enable_peer_access(self, devices: Sequence[int]) -> None:
        devs = sorted(set(int(d) for d in devices))
        rt = self._runtime
        for a in devs:
            for b in devs:
                if a == b:
                    continue
                try:
                    ok = rt.deviceCanAccessPeer(a, b)
                except Exception as exc:
                    raise PlatformError(f"cannot query peer access GPU {a} -> GPU {b}: {_err(exc)}") from None
                if not ok:
                    raise PlatformError(
                        f"GPU {a} cannot access GPU {b}'s memory (no peer access between them), "
                        "and one-rank-per-GPU runs write FIFOs in the receiver's memory; run all "
                        f"ranks on one GPU ({self.devices_env}=1) or use GPUs with peer-to-peer access")
                self.set_device(a)
                try:
                    rt.deviceEnablePeerAccess(b)
                except Exception as exc:
                    if getattr(exc, "status", None) != 704:    # already enabled
                        raise PlatformError(f"cannot enable peer access GPU {a} -> GPU {b}: {_err(exc)}") from None

    def sms(self, device: int) -> int:
        if device not in self._sms:
            self._sms[device] = int(self._runtime.deviceGetAttribute(self.attr_sms, device))
        return self._sms[device]

    # ---------------------------------------------------------------- memory
    def malloc(self, nbytes: int) -> DevicePtr:
        return self._device_alloc(nbytes, None)

    def malloc_peer(self, nbytes: int) -> DevicePtr:
        return self._device_alloc(nbytes, self.peer_malloc_flags)

    def host_flags(self, nbytes: int) -> DevicePtr:
        size = max(int(nbytes), 8)
        if self._current < 0:
            self.set_device(0)
        try:   # cudaHostAllocMapped / hipHostMallocMapped; with unified addressing one address
            ptr = int(self._runtime.hostAlloc(size, 2))
        except Exception as exc:
            raise PlatformError(f"cannot allocate {size} bytes of pinned host memory: {_err(exc)}") from None
        ctypes.memset(ptr, 0, size)
        self._host_flags[ptr] = size
        return ptr

    def _device_alloc(self, nbytes: int, flags: int | None) -> DevicePtr:
        if flags is None:
            return self._track(nbytes, "", lambda size: int(self._runtime.malloc(size)))
        return self._track(nbytes, "", lambda size: int(self._runtime.extMallocWithFlags(size, flags)))

    def _track(self, nbytes: int, kind: str, alloc) -> DevicePtr:
        """``alloc(size)`` on the current device, recorded for free/IPC and zeroed."""
        if self._current < 0:
            self.set_device(0)
        dev = self._current
        size = max(int(nbytes), 1)
        try:
            ptr = alloc(size)
        except Exception as exc:
            raise PlatformError(f"cannot allocate {size} {kind}bytes on GPU {dev}: {_err(exc)}") from None
        self._allocs[ptr] = (size, dev)
        bisect.insort(self._alloc_keys, ptr)
        self.memset(ptr, 0, size)
        return ptr

    def free(self, ptr: DevicePtr) -> None:
        if ptr in self._host_flags:
            del self._host_flags[ptr]
            with _guard("freeing pinned host memory"):
                self._runtime.freeHost(ptr)
            return
        if ptr in self._imported:
            self.ipc_close(ptr)
            return
        if ptr not in self._allocs:
            raise PlatformError(f"free of a pointer this platform did not allocate: {ptr:#x}")
        _size, dev = self._allocs.pop(ptr)
        self._alloc_keys.remove(ptr)
        self.set_device(dev)
        with _guard(f"freeing GPU {dev} memory"):
            self._runtime.free(ptr)

    # ---------------------------------------------------------------- IPC (one rank per process)
    def _ipc_alloc(self, size: int) -> int:
        """Raw exportable device memory (CUDA: any cudaMalloc; HIP overrides: fine-grained)."""
        return int(self._runtime.malloc(size))

    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        return self._track(nbytes, "shareable ", self._ipc_alloc)

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        if ptr not in self._allocs or ptr in self._imported:
            raise PlatformError(f"{ptr:#x} is not memory this process allocated for IPC")
        size, dev = self._allocs[ptr]
        self.set_device(dev)
        with _guard(f"exporting GPU {dev} memory"):
            raw = bytes(self._runtime.ipcGetMemHandle(ptr))
        return _IPC_HANDLE.pack(_IPC_MAGIC, self.name.encode(), size, raw)

    def ipc_import(self, handle: bytes) -> DevicePtr:
        if not isinstance(handle, (bytes, bytearray)) or len(handle) != _IPC_HANDLE.size:
            raise PlatformError("not a GPU IPC handle (wrong length)")
        magic, plat, size, raw = _IPC_HANDLE.unpack(bytes(handle))
        if magic != _IPC_MAGIC or plat.rstrip(b"\0").decode(errors="replace") != self.name:
            raise PlatformError(f"not a {self.api_name} IPC handle")
        if self._current < 0:
            self.set_device(0)
        dev = self._current
        with _guard(f"importing a peer's {self.api_name} memory on GPU {dev}"):
            ptr = int(self._runtime.ipcOpenMemHandle(raw, 1))   # lazy peer access
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
        self.set_device(dev)
        with _guard(f"closing a peer's {self.api_name} memory"):
            self._runtime.ipcCloseMemHandle(ptr)

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
        self._runtime.streamSynchronize(0)

    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        arr = _host_array(src)
        if arr.nbytes == 0:
            return
        self.set_device(self._owner(dst, arr.nbytes))
        rt = self._runtime
        with _guard(f"copying {arr.nbytes} bytes to the GPU"):
            rt.memcpy(dst, arr.ctypes.data, arr.nbytes, rt.memcpyHostToDevice)
            self._sync_legacy()

    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        if not isinstance(dst, np.ndarray) or not dst.flags.c_contiguous or not dst.flags.writeable:
            raise PlatformError("memcpy_dtoh needs a writable C-contiguous numpy array")
        if dst.nbytes == 0:
            return
        self.set_device(self._owner(src, dst.nbytes))
        rt = self._runtime
        with _guard(f"copying {dst.nbytes} bytes from the GPU"):
            rt.memcpy(dst.ctypes.data, src, dst.nbytes, rt.memcpyDeviceToHost)
            self._sync_legacy()

    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.set_device(self._owner(ptr, nbytes))
        with _guard(f"setting {nbytes} bytes of GPU memory"):
            self._runtime.memset(ptr, int(value), int(nbytes))
            self._sync_legacy()

    # ---------------------------------------------------------------- code
    def load(self, path: Path) -> GpuModule:
        mod = GpuModule(self, Path(path))
        self._modules.append(mod)
        if GATE_SYMBOL in mod.symbols and self._gate_fn is None:
            self._gate_fn = mod.function(GATE_SYMBOL)
        return mod

    # ---------------------------------------------------------------- execution
    def stream(self) -> GpuStream:
        if self._current < 0:
            self.set_device(0)
        try:
            h = int(self._runtime.streamCreateWithFlags(self._runtime.streamNonBlocking))
        except Exception as exc:
            raise PlatformError(f"cannot create a stream on GPU {self._current}: {_err(exc)}") from None
        s = GpuStream(h, self._current)
        self._streams.append(s)
        return s

    def _control_stream(self) -> GpuStream:
        if self._ctl is None:
            self.set_device(0)
            with _guard("creating the control stream"):
                h = int(self._runtime.streamCreateWithFlags(self._runtime.streamNonBlocking))
            self._ctl = GpuStream(h, 0)
        return self._ctl

    def block_threads(self, emitted: int) -> int:
        """Threads per block to launch a kernel emitted for ``emitted`` threads with: all of them."""
        return int(emitted)

    def launch(self, fn: Any, grid: int, block: int, args: bytes, stream: Any) -> None:
        if grid <= 0:
            self._check_launch(fn, stream)
            return                      # a rank without thread blocks has nothing to run
        args = bytes(args)
        dev, params, _buf = self._launch_params(fn, grid, block, args, stream)
        try:
            self._driver.launchKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0, stream.handle,
                                      ctypes.addressof(params), 0)
        except Exception as exc:
            self._abort_inflight()
            raise PlatformError(f"launch of {fn.symbol} ({grid} x {block} threads) failed on GPU "
                                f"{dev}: {_err(exc)}") from None
        self._inflight.setdefault(dev, {})[stream.handle] = (fn, grid, block)
        if len(args) >= ARGS_ABORT_OFFSET + 8:
            self._abort_ptrs.add(struct.unpack_from("<Q", args, ARGS_ABORT_OFFSET)[0])

    def launch_grid(self, fn: Any, grid: int, block: int, args: bytes, stream: Any, *,
                    abort_flag: int = 0) -> None:
        """The one-grid entry, launched cooperatively (``cuLaunchCooperativeKernel`` /
        ``hipModuleLaunchCooperativeKernel``). A cooperative launch is the one launch the driver
        starts only when every block of the grid can be resident at once (else it fails instead of
        queueing blocks behind spinning ones), whatever else shares the GPU (MPS clients, a
        profiler, CUDA_LAUNCH_BLOCKING, other processes' work): co-residency is the launch's
        guarantee, not the stream scheduler's habit. The occupancy check runs first (as for every
        launch, :meth:`_admit`), so the usual case of too many blocks gets a message with the
        numbers rather than the driver's error code."""
        if grid <= 0:
            self._check_launch(fn, stream)
            return
        dev, params, _buf = self._launch_params(fn, grid, block, bytes(args), stream)
        try:
            try:
                self._driver.launchCooperativeKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0,
                                                     stream.handle, ctypes.addressof(params))
            except NotImplementedError:
                # a runtime without module cooperative launches (HIP before ROCm 6): one plain
                # launch of a grid the occupancy check admitted; no other kernel of the run
                # competes for its blocks, only other processes' work could
                self._driver.launchKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0, stream.handle,
                                          ctypes.addressof(params), 0)
        except Exception as exc:
            self._abort_inflight()
            raise PlatformError(
                f"cooperative launch of {fn.symbol} ({grid} blocks of {block} threads, every rank "
                f"on {self._device_name(dev)}) failed: {_err(exc)}; the driver starts it only when "
                "every block fits on the GPU at once (other work on the GPU, or MPS limits, count "
                "too): use fewer ranks per GPU, fewer thread blocks per rank (--tb-alloc state) "
                "or fewer warps per block (nWarps)") from None
        self._inflight.setdefault(dev, {})[stream.handle] = (fn, grid, block)
        if abort_flag:    # the flag in the ranks' hccc_args (the grid's own argument holds none)
            self._abort_ptrs.add(int(abort_flag))

    def _check_launch(self, fn: Any, stream: Any) -> None:
        if not isinstance(fn, GpuFunction):
            raise PlatformError(f"not a {self.api_name} kernel: {fn!r}")
        if not isinstance(stream, GpuStream):
            raise PlatformError(f"not a {self.api_name} stream: {stream!r}")

    def _launch_params(self, fn: Any, grid: int, block: int, args: bytes, stream: Any):
        """Check and admit a launch on ``stream``'s device, make it current; returns (device, the
        driver's kernel-parameter array, the argument buffer it points at: keep it alive until the
        launch call returns)."""
        self._check_launch(fn, stream)
        dev = stream.device
        self._admit(dev, fn, grid, block, stream)
        self.set_device(dev)
        buf = (ctypes.c_char * max(len(args), 1)).from_buffer_copy(args or b"\0")
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        return dev, params, buf

    def _admit(self, dev: int, fn: GpuFunction, grid: int, block: int, stream: GpuStream) -> None:
        """Refuse a launch whose blocks could not be resident together with the kernels already
        launched on ``dev``'s other streams (the launcher should have checked first; this turns a
        deadlock into an error)."""
        others = {h: k for h, k in self._inflight.get(dev, {}).items() if h != stream.handle}
        kernels = [self._resident(f, g, b, dev) for f, g, b in others.values()]
        kernels.append(self._resident(fn, grid, block, dev))
        try:
            check_residency(self.sms(dev), kernels, device=self._device_name(dev),
                            max_kernels=self.max_kernels)
        except PlatformError:
            self._abort_inflight()
            raise

    def _resident(self, fn: GpuFunction, grid: int, block: int, dev: int) -> ResidentKernel:
        return ResidentKernel(fn.symbol, grid, self._per_sm(fn, block, dev), block)

    def _per_sm(self, fn: GpuFunction, block: int, dev: int) -> int:
        key = (id(fn), block, dev)
        if key not in self._occupancy:
            self.set_device(dev)
            try:
                self._occupancy[key] = int(self._driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    fn.handle(dev), block, 0))
            except Exception as exc:
                raise PlatformError(f"occupancy query for {fn.symbol} failed: {_err(exc)}") from None
        return self._occupancy[key]

    def _abort_inflight(self) -> None:
        """Raise the abort flag of every kernel launched since the last synchronize, so that those
        already spinning exit instead of waiting for their timeout."""
        one = struct.pack("<I", 1)
        for ptr in sorted(self._abort_ptrs):
            if ptr in self._host_flags:
                ctypes.c_uint32.from_address(ptr).value = 1    # a plain store: queues behind nothing
            elif ptr:
                try:
                    self.memcpy_htod(ptr, one)
                except Exception:
                    pass
        self._open_gate()

    def synchronize(self) -> None:
        self._open_gate()
        devs = sorted({s.device for s in self._streams} | set(self._inflight) | {max(self._current, 0)}
                      | ({self._ctl.device} if self._ctl else set()))
        try:
            for d in devs:
                self.set_device(d)
                self._runtime.deviceSynchronize()
        except PlatformError:
            raise
        except Exception as exc:
            raise PlatformError(f"a kernel failed: {_err(exc)}") from None
        finally:
            self._inflight.clear()
            self._abort_ptrs.clear()
        self._free_flags += self._released_flags     # every gate kernel has finished
        self._released_flags = []

    def timer(self) -> GpuTimer:
        return GpuTimer(self)

    def max_resident_blocks(self, fn: Any, block: int) -> int:
        if not isinstance(fn, GpuFunction):
            raise PlatformError(f"not a {self.api_name} kernel: {fn!r}")
        dev = max(self._current, 0)
        return self._per_sm(fn, block, dev) * self.sms(dev)

    # ---------------------------------------------------------------- the start gate
    def _close_gate(self, ctl: GpuStream) -> None:
        """Queue the gate kernel on the control stream (no-op without a module holding it)."""
        self._open_gate()
        if self._gate_fn is None:
            return
        rt = self._runtime
        self.set_device(ctl.device)
        if self._free_flags:
            flag = self._free_flags.pop()
        else:
            flag = int(rt.hostAlloc(8, 2))       # cudaHostAllocMapped; UVA: same address on device
        ctypes.c_uint32.from_address(flag).value = 0
        timeout = int(60 * 1_000_000 * self.ticks_per_us)     # never hold kernels back > 60 s
        args = GATE_ARGS.pack(flag, timeout)
        buf = (ctypes.c_char * len(args)).from_buffer_copy(args)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        try:
            self._driver.launchKernel(self._gate_fn.handle(ctl.device), 1, 1, 1, 1, 1, 1, 0, ctl.handle,
                                      ctypes.addressof(params), 0)
        except Exception as exc:
            self._free_flags.append(flag)
            raise PlatformError(f"cannot start the timing gate: {_err(exc)}") from None
        self._gate = (flag, self._gate_fn)

    def _open_gate(self) -> None:
        if self._gate is None:
            return
        flag, _fn = self._gate
        ctypes.c_uint32.from_address(flag).value = 1
        self._gate = None
        self._released_flags.append(flag)     # reused after the next synchronize

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        rt = self._runtime
        try:
            self.synchronize()
        except PlatformError:
            pass
        for flag in self._released_flags + self._free_flags:
            try:
                rt.freeHost(flag)
            except Exception:
                pass
        self._released_flags, self._free_flags = [], []
        for dev, ev in self._events:
            try:
                self.set_device(dev)
                rt.eventDestroy(ev)
            except Exception:
                pass
        self._events.clear()
        for s in self._streams + ([self._ctl] if self._ctl else []):
            try:
                self.set_device(s.device)
                rt.streamDestroy(s.handle)
            except Exception:
                pass
        self._streams.clear()
        self._ctl = None
        for ptr in list(self._allocs) + list(self._host_flags):
            try:
                self.free(ptr)
            except Exception:
                pass
        for m in self._modules:
            m.unload()
        self._modules.clear()
        self._gate_fn = None



def _host_array(src: Any) -> np.ndarray:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(src), dtype=np.uint8)
    if isinstance(src, np.ndarray):
        return np.ascontiguousarray(src)
    raise PlatformError(f"memcpy_htod needs a numpy array or bytes, not {type(src).__name__}")


