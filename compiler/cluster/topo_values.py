"""Reading the values of ``.topo`` statements: numbers, GPU ids and groups, link specs and maps,
each checked against :mod:`~hccc.compiler.cluster.topo_limits` and refused with a diagnostic
located at the value (``file:line:col``)."""
from __future__ import annotations

from fractions import Fraction

from lark import Token, Tree

from hccc.compiler.cluster.topo_format import format_number
from hccc.compiler.cluster.topo_limits import MAX_BANDWIDTH_GBPS, MAX_LANES, MIN_BANDWIDTH_GBPS
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile, did_you_mean
from hccc.util.sizes import SIZE_RE as _SIZE_RE, SIZE_SUFFIX as _SUFFIX

#: how a diagnostic names each value form the grammar knows
_FORMS = {"number": "a number", "name": "a name", "nodepair": "a pair (nodeX, nodeY)",
          "map": "a map {key => ...}", "list": "a list [...]"}


class ValueReader:
    """Reads the value trees of one source file; every refusal is a located :class:`CompileError`."""

    def __init__(self, source: SourceFile):
        self.src = source

    # -- where -----------------------------------------------------------------------------------
    def loc(self, item) -> Location:
        if isinstance(item, Token):
            return Location(self.src, item.line or 1, item.column or 1)
        if isinstance(item, Tree) and not item.meta.empty:
            return Location(self.src, item.meta.line, item.meta.column)
        if isinstance(item, Tree):
            for ch in item.children:
                if isinstance(ch, (Token, Tree)):
                    return self.loc(ch)
        return Location(self.src, 1, 1)

    def err(self, item, msg: str, notes: tuple[str, ...] = ()) -> CompileError:
        at = item if isinstance(item, Location) else self.loc(item)
        return CompileError([Diagnostic(msg, at, notes=notes)])

    # -- scalars ---------------------------------------------------------------------------------
    def number(self, tok: Token, what: str, *, integer: bool = False, positive: bool = True,
               nonneg: bool = False, maximum=None, minimum=None, suffix: bool = False) -> Fraction | int:
        m = _SIZE_RE.fullmatch(str(tok))
        if m is None:  # the lexer guarantees the shape; stay defensive
            raise self.err(tok, f"malformed number '{tok}'")
        if m.group(2) and not suffix:
            raise self.err(tok, f"{what} takes a plain number, not '{tok}' (size suffixes are for chunksize)")
        if len(m.group(1)) > 40:
            raise self.err(tok, f"{what} '{tok}' is too long")
        val = Fraction(m.group(1)) * _SUFFIX[(m.group(2) or "")[:1].lower()]
        if integer and val.denominator != 1:
            raise self.err(tok, f"{what} must be an integer, got '{tok}'")
        if positive and val <= 0:
            raise self.err(tok, f"{what} must be > 0, got '{tok}'")
        if nonneg and val < 0:
            raise self.err(tok, f"{what} must be >= 0, got '{tok}'")
        if maximum is not None and val > maximum:
            raise self.err(tok, f"{what} {tok} is too large (at most {maximum})")
        if minimum is not None and val < minimum and not (nonneg and val == 0):
            raise self.err(tok, f"{what} {tok} is too small (at least {format_number(minimum)})")
        return int(val) if integer else val

    def expect(self, value, kind: str, what: str):
        if not isinstance(value, Tree) or value.data != kind:
            raise self.err(value, f"{what} expects {_FORMS[kind]}")
        return value

    def vendor(self, value) -> str:
        tok = self.expect(value, "name", "vendor").children[0]
        v = str(tok).lower()
        if v not in ("nvidia", "amd"):
            raise self.err(tok, f"unknown vendor '{tok}'{did_you_mean(v, ('nvidia', 'amd'))} (expected nvidia or amd)")
        return v

    def model(self, value) -> str:
        tok = self.expect(value, "name", "gpu").children[0]
        if len(str(tok)) > 64:
            raise self.err(tok, "GPU model name is too long (at most 64 characters)")
        return str(tok)

    def rate(self, value) -> Fraction:
        """A GPU's compute rate ``gamma`` written as one number."""
        return self.number(self.expect(value, "number", "gamma").children[0], "gamma",
                           maximum=MAX_BANDWIDTH_GBPS, minimum=MIN_BANDWIDTH_GBPS)

    # -- GPUs and links --------------------------------------------------------------------------
    def gpu(self, tok: Token, ngpus: int, owner: str) -> int:
        m = _SIZE_RE.fullmatch(str(tok))
        if m is None or m.group(2) or "." in m.group(1) or len(m.group(1)) > 12:
            raise self.err(tok, f"GPU id must be an integer, got '{tok}'")
        g = int(m.group(1))
        if not 0 <= g < ngpus:
            raise self.err(tok, f"GPU id {g} is out of range: {owner} has {ngpus} GPU(s) (ids 0..{ngpus - 1})")
        return g

    def ids(self, tree: Tree, ngpus: int, owner: str, what: str = "GPU group") -> tuple[int, ...]:
        toks = [t for t in tree.children if isinstance(t, Token)]
        if not toks:
            raise self.err(tree, f"empty {what}")
        out = []
        for t in toks:
            g = self.gpu(t, ngpus, owner)
            if g in out:
                raise self.err(t, f"GPU {g} appears twice in the {what}")
            out.append(g)
        return tuple(out)

    def spec(self, tree: Tree) -> tuple[Fraction, int]:
        """``(bandwidth, lanes)`` of a link, a shared device or a NIC."""
        bw_tok, lanes_tok = tree.children
        bw = self.number(bw_tok, "bandwidth", maximum=MAX_BANDWIDTH_GBPS, minimum=MIN_BANDWIDTH_GBPS)
        lanes = self.number(lanes_tok, "the lane count", integer=True, maximum=MAX_LANES)
        return bw, lanes

    # -- maps ------------------------------------------------------------------------------------
    def scalar_map(self, loc: Location, value, keys: tuple[str, ...], what: str, *, nonneg=False,
                   maximum=None, minimum=None) -> dict[str, Fraction]:
        tree = self.expect(value, "map", what)
        out: dict[str, Fraction] = {}
        for item in tree.children:
            ktok, v = item.children
            k = str(ktok)
            if k not in keys:
                raise self.err(ktok, f"'{k}' is not valid in {what} here{did_you_mean(k, keys)} "
                                     f"(expected one of: {', '.join(keys)})")
            if k in out:
                raise self.err(ktok, f"'{k}' appears twice in {what}")
            vt = self.expect(v, "number", f"{what} '{k}'").children[0]
            out[k] = self.number(vt, f"{what} '{k}'", positive=not nonneg, nonneg=nonneg, maximum=maximum,
                                 minimum=minimum)
        return out

    def bwmap(self, value, what: str) -> list[tuple[str, list]]:
        """``{direct => [...], switch => [...]}``: (connection type, its entries) in the file's order."""
        tree = self.expect(value, "map", what)
        out: list[tuple[str, list]] = []
        seen: set[str] = set()
        for item in tree.children:
            ktok, v = item.children
            k = str(ktok)
            if k not in ("direct", "switch"):
                hint = " (use 'define interbandwidth = nic' for NIC links)" if k == "nic" else ""
                raise self.err(ktok, f"unknown connection type '{k}' in {what}"
                                     f"{'' if hint else did_you_mean(k, ('direct', 'switch'))} (expected direct or switch){hint}")
            if k in seen:
                raise self.err(ktok, f"connection type '{k}' appears twice in {what}")
            seen.add(k)
            out.append((k, self.expect(v, "list", f"{what} '{k}'").children))
        return out
