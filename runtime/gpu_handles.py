"""The runtime objects a GPU platform (:mod:`hccc.runtime.gpu`) hands out: streams
(:class:`GpuStream`), modules loaded into each device that launches from them (:class:`GpuModule`)
and their kernels, resolved per device at first use (:class:`GpuFunction`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hccc.runtime.gpu_calls import call_error
from hccc.runtime.platform import Module, PlatformError


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
                raise PlatformError(f"kernel {self.symbol} not found in {self.module.path}: {call_error(exc)}") from None
        return self._ptr[device]

    def __repr__(self) -> str:
        return f"GpuFunction({self.symbol})"


class GpuModule(Module):
    """A cubin, loaded into the context of each device that launches from it."""

    def __init__(self, platform: Any, path: Path):
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
                raise PlatformError(f"cannot load {self.path} on GPU {device}: {call_error(exc)} (was it "
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
