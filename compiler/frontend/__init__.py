"""Front ends: lark grammars, parsers and the bounded evaluator for .rccl programs."""
