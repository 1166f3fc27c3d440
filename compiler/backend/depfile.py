"""Make-style dependency files for build systems that run hccc (``hccc ALGO -o OUT --depfile F``).

The target (OUTDIR/manifest.json) depends on the algorithm, the cluster description and every file
of hccc that shapes its output (the compiler's modules and grammars, the templates), so CMake's
``DEPFILE`` (or make's ``-include``) regenerates the kernels when any of them changes.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from hccc.compiler.backend.output_dir import write_text_atomically

_SUFFIXES = (".py", ".lark", ".j2", ".h", ".cpp")


def hccc_inputs() -> list[Path]:
    """hccc's own files that determine what a compile writes (sorted, absolute)."""
    out: list[Path] = []
    for pkg in ("hccc.compiler", "hccc.templates"):
        root = Path(str(resources.files(pkg)))
        out += [p.resolve() for p in root.rglob("*")
                if p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts]
    return sorted(set(out))


def _escape(path: Path | str) -> str:
    return str(path).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


def depfile_text(target: Path | str, inputs: list[Path | str]) -> str:
    deps = [Path(os.path.abspath(p)) for p in inputs] + hccc_inputs()
    lines = [f"{_escape(os.path.abspath(target))}:"] + [f" {_escape(d)}" for d in deps]
    return " \\\n".join(lines) + "\n"


def write_depfile(path: Path | str, target: Path | str, inputs: list[Path | str]) -> None:
    """Write the depfile atomically (never over one of the ``inputs``)."""
    write_text_atomically(Path(path), depfile_text(target, inputs), inputs)


__all__ = ["hccc_inputs", "depfile_text", "write_depfile"]
