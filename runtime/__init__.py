"""hccc runtime: reference executor, simulator, emulation and GPU back ends, and one rank per
process (``hccc.runtime.Communicator``, loaded on first use)."""
from __future__ import annotations

import importlib

_API = {"Communicator": "hccc.runtime.communicator", "CommunicatorError": "hccc.runtime.communicator"}


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'hccc.runtime' has no attribute {name!r}")
