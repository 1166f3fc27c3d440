"""The AST of a parsed .rccl program as plain data, for comparing it with one written out."""
from __future__ import annotations


def ast_dump(x):
    """Every slot of every AST node (locations as line/column), as plain data."""
    from hccc.compiler.frontend import rccl_parser as rp
    if isinstance(x, list):
        return [ast_dump(y) for y in x]
    if isinstance(x, rp.Node):
        out = {"node": type(x).__name__}
        for cls in type(x).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot == "key":    # the evaluator's
                    continue
                v = getattr(x, slot)
                out[slot] = (v.line, v.col) if slot.endswith("loc") else ast_dump(v)
        return out
    return x
