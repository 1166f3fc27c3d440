"""Front end (bottom layer): diagnostics, the Algorithm (header + columnar transfer table), the lark
grammar, parser and bounded evaluator of .rccl programs, and generators that write algorithms as
ResCCLang text. Imports nothing else of hccc.
"""

from hccc.compiler.frontend.load import load_rccl, parse_rccl, parse_source

__all__ = ["load_rccl", "parse_rccl", "parse_source"]
