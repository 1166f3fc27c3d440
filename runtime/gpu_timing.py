"""Timing on the GPU platform: :class:`GpuTimer` (device time between two points, with the runtime's
events) and the start gate it holds every stream behind (:class:`StartGate`: one kernel of one
thread on a control stream that waits for a pinned host flag), so that all ranks start together
and the host's launch loop is not part of the time.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from hccc.runtime.gpu_calls import call_error, guard
from hccc.runtime.gpu_handles import GpuFunction, GpuStream
from hccc.runtime.platform import PlatformError, Timer

#: the gate kernel's one argument, ``hccc_gate_args``: the flag's address and the timeout in clock ticks
GATE_ARGS = struct.Struct("<QQ")
#: the longest the gate holds kernels back: 60 s, in the kernels' clock ticks (a timer that is never
#: stopped must not hold the run forever)
GATE_TIMEOUT_US = 60 * 1_000_000


class StartGate:
    """The gate kernel (``fn``: found in the first module loaded that has it; None: no gate) and
    its pinned host flags: the one closed now, those released (a gate kernel may still read them),
    and those free again after a synchronize. The runtime and devices are the platform's (``pf``)."""

    def __init__(self, pf: Any):
        self.pf = pf
        self.fn: GpuFunction | None = None
        self._gate: tuple[int, GpuFunction] | None = None   # (host flag pointer, kernel)
        self._released_flags: list[int] = []
        self._free_flags: list[int] = []

    def close(self, ctl: GpuStream) -> None:
        """Queue the gate kernel on the control stream (no-op without a module holding it)."""
        self.open()
        if self.fn is None:
            return
        rt = self.pf._runtime
        self.pf.set_device(ctl.device)
        if self._free_flags:
            flag = self._free_flags.pop()
        else:
            flag = int(rt.hostAlloc(8, 2))       # cudaHostAllocMapped; UVA: same address on device
        ctypes.c_uint32.from_address(flag).value = 0
        timeout = int(GATE_TIMEOUT_US * self.pf.ticks_per_us)     # never hold kernels back > 60 s
        args = GATE_ARGS.pack(flag, timeout)
        buf = (ctypes.c_char * len(args)).from_buffer_copy(args)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        try:
            self.pf._driver.launchKernel(self.fn.handle(ctl.device), 1, 1, 1, 1, 1, 1, 0, ctl.handle,
                                      ctypes.addressof(params), 0)
        except Exception as exc:
            self._free_flags.append(flag)
            raise PlatformError(f"cannot start the timing gate: {call_error(exc)}") from None
        self._gate = (flag, self.fn)

    def open(self) -> None:
        if self._gate is None:
            return
        flag, _fn = self._gate
        ctypes.c_uint32.from_address(flag).value = 1
        self._gate = None
        self._released_flags.append(flag)     # reused after the next synchronize

    def recycle(self) -> None:
        """After a synchronize: every gate kernel has finished, its flags may be reused."""
        self._free_flags += self._released_flags
        self._released_flags = []

    def free_flags(self) -> None:
        """Every flag given back to the runtime (on close)."""
        rt = self.pf._runtime
        for flag in self._released_flags + self._free_flags:
            try:
                rt.freeHost(flag)
            except Exception:
                pass
        self._released_flags, self._free_flags = [], []


class GpuTimer(Timer):
    """Device time between two points, with the runtime's events.

    ``start(stream)`` / ``stop(stream)`` with a stream time that stream alone. With no stream the
    timer spans *every* stream the platform created (create the streams first): ``start()`` queues
    the gate kernel on a control stream, records the start event behind it and makes every stream
    wait for that event, so kernels launched afterwards stay queued; ``stop()`` records an event on
    every stream, joins them on the control stream, records the stop event, then opens the gate.
    All ranks thus start together and the host's launch loop is not part of the time.
    """

    def __init__(self, platform: Any):
        self.pf = platform
        self._start: int | None = None
        self._stop: int | None = None
        self._dev = 0

    def start(self, stream: GpuStream | None = None) -> None:
        with guard("starting the timer"):
            self._start_(stream)

    def stop(self, stream: GpuStream | None = None) -> None:
        if self._start is None:
            raise PlatformError("timer stopped before it was started")
        with guard("stopping the timer"):
            self._stop_(stream)

    def elapsed_us(self) -> float:
        if self._start is None or self._stop is None:
            raise PlatformError("timer read before it was started and stopped")
        self.pf.gate.open()
        rt = self.pf._runtime
        with guard("reading the timer"):
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
        self.pf.gate.close(ctl)
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
        self.pf.gate.open()

    def _new_event(self) -> int:
        ev = self.pf._runtime.eventCreate()
        self.pf._events.append((self.pf._current, ev))
        return ev
