"""How the GPU platform (:mod:`hccc.runtime.gpu`) and its parts report a failing runtime call: as a
PlatformError that says what was being done (:func:`guard`), with the runtime's own text
(:func:`call_error`)."""
from __future__ import annotations

import contextlib

from hccc.runtime.platform import PlatformError


def call_error(exc: BaseException) -> str:
    """The runtime's text of ``exc`` (its type's name where it has none)."""
    return str(exc).strip() or type(exc).__name__


@contextlib.contextmanager
def guard(what: str):
    """Turn a failing runtime call into a PlatformError that says what was being done."""
    try:
        yield
    except PlatformError:
        raise
    except Exception as exc:
        raise PlatformError(f"{what} failed: {call_error(exc)}") from None
