"""CUDA graph capture: hccc's collectives meet their peers at host barriers, which a graph replay
cannot repeat, so a call issued during a capture is refused before anything is queued."""
from __future__ import annotations

import torch


class CaptureError(RuntimeError):
    """A collective was issued while a CUDA graph was being captured."""


def capture_active() -> bool:
    """Whether the current CUDA stream is being captured into a graph (False without CUDA, and
    before CUDA is initialised: a capture needs it, and the check costs nothing then)."""
    try:
        return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False
