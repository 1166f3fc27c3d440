"""What the CUDA and HIP platforms share: both runtimes have the same module,
stream, event and launch calls, so one :class:`GpuPlatform` drives either through an API object that
offers them under the names CuPy gives them (``hccc.runtime.cuda`` passes CuPy's runtime and driver
modules, ``hccc.runtime.hip`` a ctypes binding of libamdhip64). What differs per runtime is gathered
in class attributes and the ``_open_api`` / ``_detect_arch`` / ``_module_symbols`` / ``build`` hooks.

The platform's parts, each a module named for what it holds: its memory (:mod:`hccc.runtime.gpu_memory`),
its launches and what is in flight (:mod:`hccc.runtime.gpu_launch`, admitted by the residency rule of
:mod:`hccc.runtime.gpu_residency`: every rank's thread blocks must be resident at once, since they
spin on each other), its timers and their start gate (:mod:`hccc.runtime.gpu_timing`), the streams,
modules and kernels it hands out (:mod:`hccc.runtime.gpu_handles`); this class holds the devices,
streams and teardown.

Also here, as plain functions: kernel symbols, the translation unit of a set of ranks, the compile
cache, the ELF symbol reader; placement of ranks on devices.
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

from hccc.compiler.backend.codegen import WARP_SIZE
from hccc.compiler.ir.engine_shape import async_threads
from hccc.runtime import cache
from hccc.util import dtypes as dtypes_table
from hccc.runtime.gpu_calls import call_error, guard
from hccc.runtime.gpu_handles import GpuFunction, GpuModule, GpuStream
from hccc.runtime.gpu_launch import GpuLaunches
from hccc.runtime.gpu_memory import GpuMemory
from hccc.runtime.gpu_timing import GpuTimer, StartGate
from hccc.runtime.platform import (CTYPES, RED_CONSTS, DevicePtr, Instance, Platform, PlatformError,
                                   instance_expansion)

GATE_SYMBOL = "hccc_runtime_gate"

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
    # the copy engine's shared-memory loads: room for the emitted block's data threads, no more
    # (a small block then costs no more shared memory than it uses: residency as its registers allow)
    threads = (manifest.get("nthreads") or {}).get(platform)
    if threads:
        lines.append(f"#define HCCC_ASYNC_THREADS {async_threads(int(threads), WARP_SIZE[platform])}")
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


def placement_for(nranks: int, ndevices: int) -> list[int]:
    """Device of each rank: all on device 0 with one device; otherwise contiguous blocks of
    ``ceil(nranks / ndevices)`` ranks (one rank per GPU when there are enough GPUs)."""
    if nranks <= 0:
        return []
    if ndevices <= 1:
        return [0] * nranks
    per = -(-nranks // ndevices)
    return [r // per for r in range(nranks)]


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
            raise PlatformError(f"no {self.api_name} device visible ({call_error(exc)})") from None
        if count <= 0:
            raise PlatformError(f"no {self.api_name} device visible")
        env = os.environ.get(self.devices_env, "").strip()
        if max_devices is None and env:
            if not env.isdigit() or int(env) < 1:
                raise PlatformError(f"{self.devices_env}={env!r} must be a positive number of GPUs")
            max_devices = int(env)
        self.ndevices = min(count, max_devices) if max_devices else count
        #: the device made current by :meth:`set_device`, per thread, as the runtime keeps it
        #: (the ranks of one process may share this object from threads of their own)
        self._tls = threading.local()
        self._streams: list[GpuStream] = []
        self._ctl: GpuStream | None = None
        self._events: list[tuple[int, int]] = []
        self._modules: list[GpuModule] = []
        #: every allocation (:mod:`hccc.runtime.gpu_memory`)
        self.memory = GpuMemory(self)
        #: the kernels in flight since the last synchronize (:mod:`hccc.runtime.gpu_launch`)
        self.launches = GpuLaunches(self)
        #: the timing gate and its host flags (:mod:`hccc.runtime.gpu_timing`)
        self.gate = StartGate(self)
        self._sms: dict[int, int] = {}
        self._names: dict[int, str] = {}
        try:
            self.set_device(0)
            self.sms(0)
            self.arch = self._detect_arch()
            clocks = [int(rt.deviceGetAttribute(self.attr_clock_khz, d)) for d in range(self.ndevices)]
            self.device_name = self._device_name(0)
        except PlatformError:
            raise
        except Exception as exc:
            raise PlatformError(f"cannot use {self.api_name} device 0: {call_error(exc)}") from None
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

    @property
    def _current(self) -> int:
        """The calling thread's current device as :meth:`set_device` made it (-1: never set)."""
        return getattr(self._tls, "device", -1)

    @_current.setter
    def _current(self, index: int) -> None:
        self._tls.device = index

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.ndevices:
            raise PlatformError(f"GPU {index} is not visible ({self.ndevices} visible)")
        if index != self._current or self._runtime.getDevice() != index:
            try:
                self._runtime.setDevice(index)
                self._runtime.free(0)      # makes the primary context current for the driver API
            except Exception as exc:
                raise PlatformError(f"cannot use GPU {index}: {call_error(exc)}") from None
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
                    raise PlatformError(f"cannot query peer access GPU {a} -> GPU {b}: {call_error(exc)}") from None
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
                        raise PlatformError(f"cannot enable peer access GPU {a} -> GPU {b}: {call_error(exc)}") from None

    def sms(self, device: int) -> int:
        if device not in self._sms:
            self._sms[device] = int(self._runtime.deviceGetAttribute(self.attr_sms, device))
        return self._sms[device]

    # ---------------------------------------------------------------- memory (GpuMemory)
    def malloc(self, nbytes: int) -> DevicePtr:
        return self.memory.malloc(nbytes)

    def malloc_peer(self, nbytes: int) -> DevicePtr:
        return self.memory.malloc_peer(nbytes)

    def host_flags(self, nbytes: int) -> DevicePtr:
        return self.memory.host_flags(nbytes)

    def free(self, ptr: DevicePtr) -> None:
        self.memory.free(ptr)

    def _ipc_alloc(self, size: int) -> int:
        """Raw exportable device memory (CUDA: any cudaMalloc; HIP overrides: fine-grained)."""
        return int(self._runtime.malloc(size))

    def ipc_malloc(self, nbytes: int) -> DevicePtr:
        return self.memory.ipc_malloc(nbytes)

    def ipc_export(self, ptr: DevicePtr) -> bytes:
        return self.memory.ipc_export(ptr)

    def ipc_import(self, handle: bytes) -> DevicePtr:
        return self.memory.ipc_import(handle)

    def ipc_close(self, ptr: DevicePtr) -> None:
        self.memory.ipc_close(ptr)

    def memcpy_htod(self, dst: DevicePtr, src: Any) -> None:
        self.memory.memcpy_htod(dst, src)

    def memcpy_dtoh(self, dst: Any, src: DevicePtr) -> None:
        self.memory.memcpy_dtoh(dst, src)

    def memset(self, ptr: DevicePtr, value: int, nbytes: int) -> None:
        self.memory.memset(ptr, value, nbytes)

    # ---------------------------------------------------------------- code
    def load(self, path: Path) -> GpuModule:
        mod = GpuModule(self, Path(path))
        self._modules.append(mod)
        if GATE_SYMBOL in mod.symbols and self.gate.fn is None:
            self.gate.fn = mod.function(GATE_SYMBOL)
        return mod

    # ---------------------------------------------------------------- execution
    def stream(self) -> GpuStream:
        if self._current < 0:
            self.set_device(0)
        try:
            h = int(self._runtime.streamCreateWithFlags(self._runtime.streamNonBlocking))
        except Exception as exc:
            raise PlatformError(f"cannot create a stream on GPU {self._current}: {call_error(exc)}") from None
        s = GpuStream(h, self._current)
        self._streams.append(s)
        return s

    def _control_stream(self) -> GpuStream:
        if self._ctl is None:
            self.set_device(0)
            with guard("creating the control stream"):
                h = int(self._runtime.streamCreateWithFlags(self._runtime.streamNonBlocking))
            self._ctl = GpuStream(h, 0)
        return self._ctl

    def block_threads(self, emitted: int) -> int:
        """Threads per block to launch a kernel emitted for ``emitted`` threads with: all of them."""
        return int(emitted)

    # launches (GpuLaunches)
    def launch(self, fn: Any, grid: int, block: int, args: bytes, stream: Any) -> None:
        self.launches.launch(fn, grid, block, args, stream)

    def launch_grid(self, fn: Any, grid: int, block: int, args: bytes, stream: Any, *,
                    abort_flag: int = 0) -> None:
        """The one-grid entry, launched cooperatively once admitted (:meth:`GpuLaunches.launch_grid
        <hccc.runtime.gpu_launch.GpuLaunches.launch_grid>`)."""
        self.launches.launch_grid(fn, grid, block, args, stream, abort_flag=abort_flag)

    def synchronize(self) -> None:
        self.gate.open()
        devs = sorted({s.device for s in self._streams} | self.launches.devices() | {max(self._current, 0)}
                      | ({self._ctl.device} if self._ctl else set()))
        try:
            for d in devs:
                self.set_device(d)
                self._runtime.deviceSynchronize()
        except PlatformError:
            raise
        except Exception as exc:
            raise PlatformError(f"a kernel failed: {call_error(exc)}") from None
        finally:
            self.launches.clear()
        self.gate.recycle()     # every gate kernel has finished

    def timer(self) -> GpuTimer:
        return GpuTimer(self)

    def max_resident_blocks(self, fn: Any, block: int) -> int:
        if not isinstance(fn, GpuFunction):
            raise PlatformError(f"not a {self.api_name} kernel: {fn!r}")
        dev = max(self._current, 0)
        return self.launches.per_sm(fn, block, dev) * self.sms(dev)

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        rt = self._runtime
        try:
            self.synchronize()
        except PlatformError:
            pass
        self.gate.free_flags()
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
        for ptr in self.memory.pointers():
            try:
                self.free(ptr)
            except Exception:
                pass
        for m in self._modules:
            m.unload()
        self._modules.clear()
        self.gate.fn = None
