"""Front ends: lark grammars, parsers and the bounded evaluator for .rccl programs."""

from hccc.compiler.frontend.load import load_rccl, parse_rccl, parse_source

__all__ = ["load_rccl", "parse_rccl", "parse_source"]
