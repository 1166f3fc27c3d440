"""Front end (bottom layer of the compiler, above hccc.util): the collectives' specs, the Algorithm (header + columnar transfer table), the lark
grammar, parser and bounded evaluator of .rccl programs, and generators that write algorithms as
ResCCLang text. Imports nothing of hccc but hccc.util.
"""

from hccc.compiler.frontend.load import load_rccl, parse_rccl, parse_source

__all__ = ["load_rccl", "parse_rccl", "parse_source"]
