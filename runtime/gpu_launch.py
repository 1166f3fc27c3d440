"""Kernel launches of the GPU platform (:class:`GpuLaunches`, one per
:class:`hccc.runtime.gpu.GpuPlatform`): each launch checked and admitted (every block of the
kernels in flight on a device must be resident at once, since they spin on each other:
:func:`hccc.runtime.gpu_residency.check_residency`), passed to the driver, and remembered until the next
synchronize with its abort flag, so that a launch that fails can tell those in flight to stop.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from hccc.runtime.gpu_calls import call_error
from hccc.runtime.gpu_handles import GpuFunction, GpuStream
from hccc.runtime.gpu_residency import ResidentKernel, check_residency
from hccc.runtime.kernel_abi import Args
from hccc.runtime.platform import PlatformError

#: byte offset of ``abort_flag`` in the packed ``hccc_args``
ARGS_ABORT_OFFSET = Args.abort_flag.offset


class GpuLaunches:
    """The kernels launched on a platform (``pf``) since its last synchronize: per device, the
    latest kernel of each stream (kernels of one stream run one after another, so only one per
    stream must be resident) and the abort flags of every kernel launched; and the occupancy the
    driver reported per kernel, block size and device."""

    def __init__(self, pf):
        self.pf = pf
        self._inflight: dict[int, dict[int, tuple[GpuFunction, int, int]]] = {}
        self._abort_ptrs: set[int] = set()
        self._occupancy: dict[tuple[int, int, int], int] = {}

    def devices(self) -> set[int]:
        """The devices with kernels in flight."""
        return set(self._inflight)

    def clear(self) -> None:
        """Forget what was in flight (after a synchronize)."""
        self._inflight.clear()
        self._abort_ptrs.clear()

    def launch(self, fn: Any, grid: int, block: int, args: bytes, stream: Any) -> None:
        """One kernel of ``grid`` blocks on ``stream``, admitted first (:meth:`_admit`)."""
        if grid <= 0:
            self._check_launch(fn, stream)
            return                      # a rank without thread blocks has nothing to run
        args = bytes(args)
        dev, params, _buf = self._launch_params(fn, grid, block, args, stream)
        try:
            self.pf._driver.launchKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0, stream.handle,
                                         ctypes.addressof(params), 0)
        except Exception as exc:
            self._abort_inflight()
            raise PlatformError(f"launch of {fn.symbol} ({grid} x {block} threads) failed on GPU "
                                f"{dev}: {call_error(exc)}") from None
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
                self.pf._driver.launchCooperativeKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0,
                                                        stream.handle, ctypes.addressof(params))
            except NotImplementedError:
                # a runtime without module cooperative launches (HIP before ROCm 6): one plain
                # launch of a grid the occupancy check admitted; no other kernel of the run
                # competes for its blocks, only other processes' work could
                self.pf._driver.launchKernel(fn.handle(dev), grid, 1, 1, block, 1, 1, 0, stream.handle,
                                             ctypes.addressof(params), 0)
        except Exception as exc:
            self._abort_inflight()
            raise PlatformError(
                f"cooperative launch of {fn.symbol} ({grid} blocks of {block} threads, every rank "
                f"on {self.pf._device_name(dev)}) failed: {call_error(exc)}; the driver starts it only when "
                "every block fits on the GPU at once (other work on the GPU, or MPS limits, count "
                "too): use fewer ranks per GPU, fewer thread blocks per rank (--tb-alloc state) "
                "or fewer warps per block (nWarps)") from None
        self._inflight.setdefault(dev, {})[stream.handle] = (fn, grid, block)
        if abort_flag:    # the flag in the ranks' hccc_args (the grid's own argument holds none)
            self._abort_ptrs.add(int(abort_flag))

    def _check_launch(self, fn: Any, stream: Any) -> None:
        if not isinstance(fn, GpuFunction):
            raise PlatformError(f"not a {self.pf.api_name} kernel: {fn!r}")
        if not isinstance(stream, GpuStream):
            raise PlatformError(f"not a {self.pf.api_name} stream: {stream!r}")

    def _launch_params(self, fn: Any, grid: int, block: int, args: bytes, stream: Any):
        """Check and admit a launch on ``stream``'s device, make it current; returns (device, the
        driver's kernel-parameter array, the argument buffer it points at: keep it alive until the
        launch call returns)."""
        self._check_launch(fn, stream)
        dev = stream.device
        self._admit(dev, fn, grid, block, stream)
        self.pf.set_device(dev)
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
            check_residency(self.pf.sms(dev), kernels, device=self.pf._device_name(dev),
                            max_kernels=self.pf.max_kernels)
        except PlatformError:
            self._abort_inflight()
            raise

    def _resident(self, fn: GpuFunction, grid: int, block: int, dev: int) -> ResidentKernel:
        return ResidentKernel(fn.symbol, grid, self.per_sm(fn, block, dev), block)

    def per_sm(self, fn: GpuFunction, block: int, dev: int) -> int:
        """Blocks of ``fn`` of ``block`` threads one SM of ``dev`` holds at once (the driver's
        occupancy answer, asked once)."""
        key = (id(fn), block, dev)
        if key not in self._occupancy:
            self.pf.set_device(dev)
            try:
                self._occupancy[key] = int(self.pf._driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    fn.handle(dev), block, 0))
            except Exception as exc:
                raise PlatformError(f"occupancy query for {fn.symbol} failed: {call_error(exc)}") from None
        return self._occupancy[key]

    def _abort_inflight(self) -> None:
        """Raise the abort flag of every kernel launched since the last synchronize, so that those
        already spinning exit instead of waiting for their timeout."""
        one = struct.pack("<I", 1)
        for ptr in sorted(self._abort_ptrs):
            if self.pf.memory.is_host_flag(ptr):
                ctypes.c_uint32.from_address(ptr).value = 1    # a plain store: queues behind nothing
            elif ptr:
                try:
                    self.pf.memcpy_htod(ptr, one)
                except Exception:
                    pass
        self.pf.gate.open()
