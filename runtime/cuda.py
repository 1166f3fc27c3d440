"""The CUDA platform: runs the emitted CUDA kernels through CuPy (optional extra ``gpu``).

Placement (:meth:`CudaPlatform.placement`):
- *single GPU* (the test mode; with one visible GPU, or ``HCCC_CUDA_DEVICES=1``): every rank's
  kernel runs on one GPU, each rank on its own non-blocking stream (``CUDA_DEVICE_MAX_CONNECTIONS``
  defaults to 32 here so streams do not share hardware queues). The ranks' kernels spin on each
  other, so all of their thread blocks must be resident at once: :func:`hccc.runtime.gpu_residency.check_residency` is the
  rule (occupancy x SMs, from the compiled kernels), ``max_resident_blocks`` feeds the launcher's
  check, and :meth:`CudaPlatform.launch` refuses a launch that would break it (raising the abort
  flag of the kernels already running) instead of deadlocking.
- *several GPUs* (``HCCC_CUDA_DEVICES=N`` caps how many): ranks in contiguous blocks, one rank per
  GPU when there are enough. FIFOs live in the receiver's memory and are written by the sender
  through peer access, which :meth:`CudaPlatform.enable_peer_access` turns on, or refuses naming
  the pair of GPUs that cannot reach each other.

Building: :func:`build_cuda_module` compiles the emitted sources of the chosen ranks for one
(dtype, op) instance into one ``.cubin`` with ``nvcc -cubin -arch=ARCH``; ARCH is ``HCCC_CUDA_ARCH``
when set, else the visible GPU's compute capability, else ``sm_90``. Cubins are cached by a hash of
every input (sources, headers, flags, compiler version) under ``HCCC_CACHE_DIR`` (default
``~/.cache/hccc``). The module also holds ``hccc_runtime_gate``, a one-thread kernel that the timer
uses to start all ranks together (see :class:`hccc.runtime.gpu_timing.StartGate`).

Kernel launches go through the driver API (``cuLaunchKernel``) with the packed ``hccc_args`` bytes,
so no CuPy array types are involved. Importing this module never needs CuPy; creating the platform
raises :class:`PlatformError` with the reason (CuPy missing, no device, ...).

Everything but CuPy, nvcc and the CUDA attribute ids is shared with the HIP platform in
:mod:`hccc.runtime.gpu`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable


from hccc.compiler.backend import abi
from hccc.runtime.gpu import GpuPlatform, compile_module, find_compiler, select_ranks, translation_unit
from hccc.runtime.platform import Instance, PlatformError, build_switches, register

GPU_HINT = "CuPy is not installed: pip install 'hccc[gpu]'"
ARCH_ENV = "HCCC_CUDA_ARCH"
DEVICES_ENV = "HCCC_CUDA_DEVICES"
DEFAULT_ARCH = "sm_90"

def normalise_arch(text: str, *, source: str = ARCH_ENV) -> str:
    """``sm_90`` / ``sm_90a`` / ``compute_90`` / ``90`` / ``9.0`` -> ``sm_90`` (``sm_90a`` kept)."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3})([a-z]?)", t) or re.fullmatch(r"(\d+)\.(\d)()", t)
    if m is None:
        raise PlatformError(f"{source}={text!r} is not a CUDA architecture (expected e.g. sm_90)")
    return f"sm_{m.group(1)}{m.group(2)}"


def resolve_arch(detected: str | None = None) -> str:
    """The architecture to compile for: ``HCCC_CUDA_ARCH`` if set, else ``detected`` (the GPU's
    compute capability, e.g. ``"90"``), else :data:`DEFAULT_ARCH`."""
    env = os.environ.get(ARCH_ENV, "").strip()
    if env:
        return normalise_arch(env)
    if detected:
        return normalise_arch(str(detected), source="compute capability")
    return DEFAULT_ARCH



def find_nvcc() -> str:
    return find_compiler("nvcc", ("CUDA_PATH", "CUDA_HOME"), "/usr/local/cuda", "install the CUDA toolkit or put nvcc on PATH")


def build_cuda_module(outdir: Path, manifest: dict, instance: Instance,
                      ranks: Iterable[int] | None = None, *, arch: str | None = None,
                      nvcc: str | None = None, single_gpu: bool = False) -> Path:
    """One cubin with ``instance``'s kernels of ``ranks`` (all when None) and the gate kernel;
    ``single_gpu`` builds GPU-scope memory ordering (every rank on one GPU)."""
    sel = select_ranks(manifest, ranks)
    arch = normalise_arch(arch) if arch else resolve_arch()
    tu = translation_unit(manifest, instance, sel, "cuda")
    flags = cuda_flags(arch, single_gpu, output="-cubin", manifest=manifest)
    return compile_module(Path(outdir), manifest, tu, sel, "cuda", nvcc or find_nvcc(), flags, ".cubin")


def cuda_flags(arch: str, single_gpu: bool = False, *, output: str = "-cubin", manifest: dict | None = None) -> list[str]:
    """nvcc flags of a kernel build (``output``: ``-cubin``, or ``-ptx`` to inspect the code), with
    the switches the environment asks for (:func:`hccc.runtime.platform.build_switches`, checked
    against the program of ``manifest`` where given)."""
    return (["-std=c++17", "-O3", output, f"-arch={arch}"] + (["-DHCCC_SINGLE_GPU=1"] if single_gpu else [])
            + build_switches(manifest))



def _cupy():
    """(runtime, driver) modules of CuPy, or PlatformError."""
    try:
        import cupy  # noqa: F401  (initialises cupy.cuda; importing the submodules alone fails)
        from cupy.cuda import driver, runtime
    except ImportError:
        raise PlatformError(GPU_HINT) from None
    except Exception as exc:   # a broken installation (missing libraries, ...)
        raise PlatformError(f"CuPy cannot be imported: {exc}") from None
    return runtime, driver




class CudaPlatform(GpuPlatform):
    """CUDA through CuPy's runtime and driver bindings; see the module docstring."""

    name = "cuda"
    source_platform = "cuda"
    api_name = "CUDA"
    devices_env = DEVICES_ENV
    arch_env = ARCH_ENV
    attr_sms = 16            # cudaDevAttrMultiProcessorCount
    attr_clock_khz = 13      # cudaDevAttrClockRate
    #: hccc_clock() reads %globaltimer: nanoseconds
    timer_ticks_per_us = abi.TIMER_TICKS_PER_US["cuda"]
    #: concurrent kernels per device (compute capability 7.0 and later)
    max_kernels = 128

    def _open_api(self):
        # More hardware work queues than the default 8, so that up to 32 rank streams never share
        # one (must be set before the CUDA context exists; harmless afterwards).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
        return _cupy()

    def _detect_arch(self) -> str:
        rt = self._runtime
        cc = rt.deviceGetAttribute(75, 0) * 10 + rt.deviceGetAttribute(76, 0)   # major, minor
        return resolve_arch(str(cc))

    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False) -> Path:
        return build_cuda_module(Path(outdir), manifest, instance, ranks, arch=self.arch,
                                 single_gpu=single_gpu)


register("cuda", CudaPlatform)


def ptxas_report(text: str) -> dict[str, dict]:
    """``ptxas -v`` output -> function name -> {stack, spill_stores, spill_loads, registers,
    cumulative_stack} (the last two only for entries)."""
    out: dict[str, dict] = {}
    name = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name is not None:
            out[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name is not None:
            out[name]["registers"] = int(m.group(1))
            c = re.search(r"(\d+) bytes cumulative stack size", line)
            out[name]["cumulative_stack"] = int(c.group(1)) if c else 0   # (not printed when 0)
    return out
