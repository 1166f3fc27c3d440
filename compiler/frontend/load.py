"""Public entry points of the ``.rccl`` front end: text or file -> :class:`Algorithm`."""
from __future__ import annotations

from pathlib import Path

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.util.diagnostics import SourceFile
from hccc.compiler.frontend.eval_budget import DEFAULT_MAX_ITERATIONS, DEFAULT_MAX_TRANSFERS
from hccc.compiler.frontend.evaluator import evaluate
from hccc.compiler.frontend.rccl_parser import parse_program


def parse_source(source: SourceFile, *, max_transfers: int = DEFAULT_MAX_TRANSFERS,
                 max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Algorithm:
    """Parse, check and evaluate one ResCCLang source file."""
    return evaluate(parse_program(source), max_transfers=max_transfers,
                    max_iterations=max_iterations)


def parse_rccl(text: str, name: str = "<input>", *, max_transfers: int = DEFAULT_MAX_TRANSFERS,
               max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Algorithm:
    """Compile ResCCLang ``text`` (shown as ``name`` in diagnostics) into an Algorithm.

    Raises :class:`~hccc.util.diagnostics.CompileError` with a located diagnostic for any
    bad input (syntax, header, undefined names, bounds, division by zero, ...).
    """
    return parse_source(SourceFile(name, text), max_transfers=max_transfers,
                        max_iterations=max_iterations)


def load_rccl(path: str | Path, *, max_transfers: int = DEFAULT_MAX_TRANSFERS,
              max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Algorithm:
    """Read a ``.rccl`` file (UTF-8; binary or undecodable input is a located error)."""
    return parse_source(SourceFile.read(path), max_transfers=max_transfers,
                        max_iterations=max_iterations)
