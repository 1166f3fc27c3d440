"""Where the lark parsers keep their grammar analysis between runs (lark's ``cache`` option).

Building the LALR tables of a grammar takes longer than parsing a small program, so lark can store
them; its default file lives in the shared temporary directory and is unpickled on load, which
anyone who can write there could abuse. hccc keeps the file in the user's own cache directory
instead (``$HCCC_CACHE_DIR``, else ``$XDG_CACHE_HOME/hccc`` or ``~/.cache/hccc``; the same root
``hccc run`` caches kernels under), named by a digest of the grammar, lark's version and Python's,
and turns caching off when that directory cannot be made.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def lark_cache(name: str, grammar: str) -> str | bool:
    """The ``cache`` argument for ``Lark(grammar, ...)``: a private file path, or ``False``."""
    import lark

    if os.environ.get("HCCC_CACHE_DIR"):
        root = Path(os.environ["HCCC_CACHE_DIR"])
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(base) / "hccc"
    digest = hashlib.sha256("\0".join([grammar, lark.__version__, str(sys.version_info[:2])]).encode()).hexdigest()
    folder = root / "lark"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return False
    return str(folder / f"{name}-{digest[:32]}.lark")


__all__ = ["lark_cache"]
