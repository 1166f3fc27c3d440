"""ResCCLang (.rccl) parser: lark LALR grammar + indentation post-lexer -> a small typed AST.

The AST is deliberately tiny (one class per construct, positions as :class:`Location`) and is
checked statically here: header parameters, reserved words, ``range()`` / ``transfer()`` arity,
transfer ops, string values outside the header, loop nesting and expression depth. Evaluation
lives in :mod:`evaluator`.

Two paths build the AST. The reference path (:func:`parse_tree` + :class:`_Builder`) makes lark's
parse tree and walks it, and is the one that reports every error. :func:`parse_program` first
tries the fast path: a second lark parser over the same grammar that builds the AST during the
parse (lark's ``transformer=`` callbacks, :class:`_Reduce`) from a lexer that also does the
indentation (:class:`_FastLexer`); it gives up on anything but a well-formed program, and the
reference path then runs instead, so diagnostics do not depend on the path.
"""
from __future__ import annotations

import gc
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lark import Lark, Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedToken
from lark.lexer import BasicLexer, PatternStr, UnlessCallback

from hccc.compiler.frontend.algorithm import RECV, RRC, Collective, Header
from hccc.compiler.frontend.collectives import DSL_NAMES, SPECS, one_of
from hccc.compiler.frontend.slice_policy import DEFAULT_MICRO_BATCHES, DEFAULT_MIN_SLICE_BYTES, SLICE_ALIGN, SlicePolicy
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile, closest, did_you_mean
from hccc.util.limits import check_source_lines

# Bounds that are static properties of the text.
MAX_LOOP_NESTING = 64
MAX_EXPR_DEPTH = 200
INT_LIMIT = 2 ** 62  # |x| <= INT_LIMIT for every integer the program handles

RESERVED = frozenset({"def", "ResCCLAlgo", "for", "in", "range", "transfer", "recv", "rrc", "pass"})
_KEYWORD_TYPES = {"DEF", "RESCCLALGO", "FOR", "IN", "RANGE", "TRANSFER", "RECV", "RRC", "PASS"}
_UNSUPPORTED_PY = frozenset({
    "if", "elif", "else", "while", "return", "import", "from", "class", "with", "try", "except",
    "break", "continue", "lambda", "print", "yield", "global", "del", "assert", "raise",
})


# ---------------------------------------------------------------------------------------- AST
class Node:
    __slots__ = ("loc",)


class Expr(Node):
    """An expression. ``key`` is filled in by the evaluator's analysis: equal keys, equal
    expressions (same structure, names and literals)."""

    __slots__ = ("key",)


class Int(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int, loc: Location):
        self.value, self.loc = value, loc


class Var(Expr):
    __slots__ = ("name",)

    def __init__(self, name: str, loc: Location):
        self.name, self.loc = name, loc


class BinOp(Expr):
    """``left op right``; ``op`` as written (``/`` and ``//`` both floor-divide)."""

    __slots__ = ("op", "left", "right")

    def __init__(self, op: str, left: Node, right: Node, loc: Location):
        self.op, self.left, self.right, self.loc = op, left, right, loc


class Neg(Expr):
    __slots__ = ("operand",)

    def __init__(self, operand: Node, loc: Location):
        self.operand, self.loc = operand, loc


class Assign(Node):
    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Node, loc: Location):
        self.name, self.value, self.loc = name, value, loc


class For(Node):
    """``for var in range(args): body``. ``carried`` etc. are filled in by the evaluator's analysis."""

    __slots__ = ("var", "args", "body", "range_loc", "carried", "trip_known_positive",
                 "direct_transfers")

    def __init__(self, var: str, args: list, body: list, loc: Location, range_loc: Location):
        self.var, self.args, self.body, self.loc, self.range_loc = var, args, body, loc, range_loc
        self.carried = False
        self.trip_known_positive = False
        self.direct_transfers: list = []


class Transfer(Node):
    __slots__ = ("args", "op", "site", "loop_vars", "needs_key")

    def __init__(self, args: list, op: int, site: int, loop_vars: tuple, loc: Location):
        self.args, self.op, self.site, self.loop_vars, self.loc = args, op, site, loop_vars, loc
        self.needs_key = False


class Pass(Node):
    __slots__ = ()

    def __init__(self, loc: Location):
        self.loc = loc


@dataclass
class Program:
    """A parsed ``.rccl`` file: header, body statements and the transfer call sites in order."""

    source: SourceFile
    header: Header
    body: list
    transfers: list  # Transfer nodes, index == site id


# ------------------------------------------------------------------------- lark + indentation
_GRAMMAR = Path(__file__).with_name("rccl.lark")
_PARSER: Lark | None = None


class _Indenter:
    """Turns ``_NL`` tokens into ``_NL`` + ``_INDENT`` / ``_DEDENT`` (Python rules, incl. TabError).

    The reference path's post-lexer; :meth:`_FastLexer.lex` repeats the same rules inline."""

    always_accept = ("_NL",)

    def __init__(self) -> None:
        self.source: SourceFile | None = None
        self.open_parens: list[Token] = []

    @staticmethod
    def _widths(indent: str) -> tuple[int, int]:
        """Width with tab size 8 and with tab size 1 (Python's consistency check)."""
        w8 = w1 = 0
        for ch in indent:
            if ch == "\t":
                w8 = (w8 // 8 + 1) * 8
                w1 += 1
            elif ch == " ":
                w8 += 1
                w1 += 1
        return w8, w1

    def _err(self, line: int, col: int, msg: str) -> CompileError:
        return CompileError.at(Location(self.source, line, col), msg)

    def process(self, stream):
        stack = [(0, 0)]
        opened = self.open_parens = []
        for tok in stream:
            t = tok.type
            if t == "LPAR":
                opened.append(tok)
            elif t == "RPAR" and opened:
                opened.pop()
            if t != "_NL":
                yield tok
                continue
            if opened:
                continue  # implicit line joining inside parentheses
            yield tok
            if "\n" not in tok.value:
                continue
            indent = tok.value.rsplit("\n", 1)[1]
            line = tok.end_line
            col = len(indent) + 1
            w = self._widths(indent)
            top = stack[-1]
            if w == top:
                continue
            if w[0] > top[0] and w[1] > top[1]:
                stack.append(w)
                yield Token("_INDENT", indent, tok.end_pos, line, col, line, col, tok.end_pos)
                continue
            if (w[0] > top[0]) != (w[1] > top[1]) or (w[0] == top[0]) != (w[1] == top[1]):
                raise self._err(line, 1, "inconsistent use of tabs and spaces in indentation")
            while stack[-1][0] > w[0]:
                stack.pop()
                yield Token("_DEDENT", indent, tok.end_pos, line, col, line, col, tok.end_pos)
            if stack[-1] != w:
                raise self._err(line, col, "unindent does not match any outer indentation level")
        while len(stack) > 1:
            stack.pop()
            yield Token("_DEDENT", "", 0, 0, 0, 0, 0, 0)


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        # built from the grammar text once per process (about 20 ms), never from a disk cache:
        # lark's cache is a pickle, which would run whatever code someone planted in it
        text = _GRAMMAR.read_text(encoding="utf-8")
        _PARSER = Lark(text, parser="lalr", lexer="basic", postlex=_Indenter(), maybe_placeholders=True)
    return _PARSER


_TERMINAL_NAMES = {
    "_NL": "end of line", "_INDENT": "an indented block", "_DEDENT": "end of the indented block",
    "$END": "end of file", "NAME": "an identifier", "INT": "an integer", "STRING": "a string",
    "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='",
    "SEMICOLON": "';'", "ADDOP": "'+' or '-'", "MULOP": "'*', '/', '//' or '%'",
    "DEF": "'def'", "RESCCLALGO": "'ResCCLAlgo'", "FOR": "'for'", "IN": "'in'",
    "RANGE": "'range'", "TRANSFER": "'transfer'", "RECV": "'recv'", "RRC": "'rrc'",
    "PASS": "'pass'",
}
_EXPR_START = {"NAME", "INT", "LPAR", "ADDOP", "STRING"}
_STMT_START = {"NAME", "FOR", "TRANSFER", "PASS"}


def _describe_token(tok: Token) -> str:
    if tok.type in ("$END", "_DEDENT") and not tok.value:
        return "end of file"
    if tok.type == "_NL":
        return "end of line"
    if tok.type == "_INDENT":
        return "indent"
    if tok.type == "_DEDENT":
        return "end of the indented block"
    if tok.type in _KEYWORD_TYPES:
        return f"keyword '{tok.value}'"
    if tok.type == "NAME":
        return f"identifier '{tok.value}'"
    if tok.type == "INT":
        return f"integer {tok.value}"
    if tok.type == "STRING":
        v = tok.value if len(tok.value) <= 40 else tok.value[:37] + "..."
        return f"string {v}"
    return f"'{tok.value}'"


def _describe_expected(expected: set[str]) -> str:
    exp = set(expected)
    parts: list[str] = []
    if _EXPR_START - {"STRING"} <= exp:
        exp -= _EXPR_START | {"RECV", "RRC"}
        parts.append("an expression")
    if {"FOR", "TRANSFER", "NAME"} <= exp:
        exp -= _STMT_START
        parts.append("a statement")
    if exp & {"ADDOP", "MULOP"}:
        exp -= {"ADDOP", "MULOP"}
        parts.append("an operator")
    exp.discard("SEMICOLON")
    names = sorted({_TERMINAL_NAMES.get(e, e.lower()) for e in exp})
    parts.extend(names)
    if not parts:
        return ""
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " or " + parts[-1]


#: the keywords by terminal (what a misspelt word is matched against where the parser expects one)
_KEYWORDS = {"DEF": "def", "FOR": "for", "IN": "in", "RANGE": "range", "TRANSFER": "transfer", "RECV": "recv",
             "RRC": "rrc", "PASS": "pass"}
#: the words a statement starts with, besides an assignment's name
_STATEMENT_WORDS = ("transfer", "for", "pass")
#: the one call that is a statement
_STATEMENT_CALLS = ("transfer",)
#: ResCCLang's only calls: transfer(...), a statement, and range(...), in a for loop's head
_CALLS = ("transfer", "range")
_WORD_BEFORE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[\t \f]*$")
_FIRST_WORD = re.compile(r"[\t \f]*([A-Za-z_][A-Za-z0-9_]*)")


def _misspelt_word(source: SourceFile, tok: Token, loc: Location, line_text: str,
                   expected: set[str]) -> CompileError | None:
    """The error of a name the parser cannot place, where it names what was meant: an unknown
    function (``transfr(`` says "unknown function 'transfr'; did you mean 'transfer'?", not
    "unexpected '('"), or a statement that starts with a misspelt keyword (``fro i in ...``,
    ``pas``); located at the name. None for every other syntax error."""
    if loc.line != (tok.line or 0):
        return None
    before = line_text[:loc.col - 1]
    if tok.type == "LPAR":
        m = _WORD_BEFORE.search(before)
        if m is None or m.group(1) in _KEYWORDS.values() or m.group(1) == "ResCCLAlgo":
            return None
        name, at = m.group(1), Location(source, loc.line, m.start(1) + 1)
        ahead = before[:m.start(1)].rstrip()
        if not ahead or ahead[-1] in ";:":            # the name starts a statement
            return CompileError.at(at, f"unknown function '{name}'{did_you_mean(name, _STATEMENT_CALLS)} "
                                       "(a statement is NAME = EXPRESSION, transfer(...), "
                                       "for NAME in range(...): or pass)")
        return CompileError.at(at, f"unknown function '{name}'{did_you_mean(name, _CALLS)} (expressions "
                                   "call no functions: transfer(...) is a statement and range(...) "
                                   "belongs in a for loop's head)")
    m = _FIRST_WORD.match(line_text)
    if m is None or tok.type == "EQUAL" or "EQUAL" not in expected or line_text[m.end(1):loc.col - 1].strip():
        return None        # not the token right after a statement's first word
    word = m.group(1)
    hint = did_you_mean(word, _STATEMENT_WORDS)
    if not hint:
        return None
    return CompileError.at(Location(source, loc.line, m.start(1) + 1),
                           f"unknown statement '{word}'{hint} (a statement is NAME = EXPRESSION, "
                           "transfer(...), for NAME in range(...): or pass)")


def _end_location(source: SourceFile) -> Location:
    lines = source.text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines = lines[:-1]
    return Location(source, max(1, len(lines)), len(lines[-1]) + 1 if lines else 1)


def _syntax_error(exc: LarkError, source: SourceFile) -> CompileError:
    text = source.text
    if isinstance(exc, UnexpectedCharacters):
        loc = Location(source, exc.line, exc.column)
        ch = text[exc.pos_in_stream] if 0 <= exc.pos_in_stream < len(text) else exc.char
        if ch in "\"'":
            return CompileError.at(loc, "unterminated string literal")
        if ch == "." and exc.pos_in_stream > 0 and text[exc.pos_in_stream - 1].isdigit():
            return CompileError.at(loc, "floating-point numbers are not supported (integers only)")
        if ch == "\r":
            return CompileError.at(loc, "stray carriage return (use \\n or \\r\\n line endings)")
        shown = repr(ch) if ch.isprintable() and ch not in " " else f"U+{ord(ch):04X}"
        hint = ""
        if ch in "<>!":
            hint = " (comparisons and conditionals are not part of ResCCLang)"
        elif ch in "[]{}":
            hint = " (lists and dicts are not part of ResCCLang)"
        return CompileError.at(loc, f"unexpected character {shown}{hint}")
    if isinstance(exc, UnexpectedEOF):
        return CompileError.at(_end_location(source), "unexpected end of file")
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END" or (tok.type == "_DEDENT" and not tok.line):
            loc = _end_location(source)
        else:
            loc = Location(source, tok.line or 1, tok.column or 1)
        expected = set(exc.expected or ())
        line_text = source.line_text(loc.line) or ""
        first_word = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", line_text)
        if first_word and first_word.group(1) in _UNSUPPORTED_PY and first_word.group(1) not in RESERVED:
            w = first_word.group(1)
            return CompileError.at(Location(source, loc.line, first_word.start(1) + 1),
                                   f"'{w}' is not supported in ResCCLang (statements: assignment, "
                                   f"for ... in range(...), transfer(...))")
        if tok.type == "_INDENT":
            return CompileError.at(loc, "unexpected indent")
        if "_INDENT" in expected and tok.type != "_INDENT":
            return CompileError.at(loc, "expected an indented block")
        if tok.type in _KEYWORD_TYPES and "NAME" in expected:
            return CompileError.at(loc, f"'{tok.value}' is a reserved word and cannot be used as a name")
        if tok.type == "NAME" and "RESCCLALGO" in expected:
            return CompileError.at(loc, f"expected the 'ResCCLAlgo(...)' header, found identifier "
                                        f"'{tok.value}'{did_you_mean(str(tok.value), ('ResCCLAlgo', 'def'))}")
        if "RESCCLALGO" in expected:
            return CompileError.at(loc, f"expected the 'ResCCLAlgo(...)' header, found "
                                        f"{_describe_token(tok)}")
        kw = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)", line_text)
        if kw and kw.group(1) in RESERVED and (tok.type == "EQUAL" or tok.type in _KEYWORD_TYPES):
            return CompileError.at(Location(source, loc.line, kw.start(1) + 1),
                                   f"'{kw.group(1)}' is a reserved word and cannot be assigned")
        if tok.type == "MULOP" and tok.value == "*" and text_at(source, tok, -1) == "*":
            return CompileError.at(Location(source, loc.line, max(1, loc.col - 1)),
                                   "the power operator '**' is not supported")
        if tok.type == "EQUAL" and text_at(source, tok, -1) == "=":
            return CompileError.at(Location(source, loc.line, max(1, loc.col - 1)),
                                   "comparisons ('==') are not part of ResCCLang")
        if tok.type == "EQUAL" and "EQUAL" not in expected:
            return CompileError.at(loc, "unexpected '=' (only 'name = expression' assignments are "
                                        "supported)")
        opened = _parser().options.postlex.open_parens  # type: ignore[union-attr]
        if tok.type in ("$END", "_DEDENT") and opened:
            p = opened[-1]
            return CompileError.at(Location(source, p.line, p.column), "'(' was never closed")
        if tok.type == "$END" and expected == {"_DEDENT"}:
            return CompileError.at(loc, "unexpected end of file")
        if expected == {"$END"}:
            return CompileError.at(loc, f"unexpected {_describe_token(tok)} after the algorithm "
                                        f"body (statements must be indented under the header)")
        misspelt = _misspelt_word(source, tok, loc, line_text, expected)
        if misspelt is not None:
            return misspelt
        if not opened and "_NL" in expected:  # LALR lookaheads merged from other contexts
            expected -= {"RPAR", "COMMA"}
        want = _describe_expected(expected)
        msg = f"unexpected {_describe_token(tok)}"
        # a misspelt keyword where one is expected: 'rnge' for 'range'
        meant = closest(str(tok.value), [_KEYWORDS[e] for e in expected if e in _KEYWORDS]) \
            if tok.type == "NAME" else None
        if meant is not None:
            msg += f"; did you mean '{meant}'?" + (f" (expected {want})" if want and want != f"'{meant}'" else "")
        elif want:
            msg += f"; expected {want}"
        notes: tuple[str, ...] = ()
        if opened and opened[-1].line < loc.line:
            p = opened[-1]
            notes = (f"the '(' at line {p.line}, column {p.column} is not closed",)
        return CompileError([Diagnostic(msg, loc, notes=notes)])
    return CompileError.at(Location(source, 1, 1), f"syntax error: {exc}")


def text_at(source: SourceFile, tok: Token, offset: int) -> str:
    """The character ``offset`` places after the start of ``tok`` (empty past the end)."""
    pos = (tok.start_pos or 0) + offset
    return source.text[pos] if 0 <= pos < len(source.text) else ""


@contextmanager
def gc_paused():
    """No cyclic garbage collection inside (restored after). The front end allocates about one
    object per token and per AST node and makes no reference cycles: collection passes during a
    parse or an evaluation would only rescan those objects, and cost as much as the work."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_BLANK = re.compile(r"\A(\s*(#[^\n]*)?(\n|\Z))*\Z")


def _checked_text(source: SourceFile) -> str:
    """The checks made before lark sees ``source``; returns the text to parse (ending in a newline)."""
    text = source.text
    check_source_lines(source, "the program", "express repetition with for loops")
    if _BLANK.match(text):
        raise CompileError.at(Location(source, 1, 1),
                              "empty program: expected a 'ResCCLAlgo(...)' header")
    m = re.match(r"\A(?:[ \t\f]*(?:#[^\n]*)?\r?\n)*([ \t\f]+)\S", text)
    if m:
        line = text.count("\n", 0, m.end(1)) + 1
        raise CompileError.at(Location(source, line, 1), "unexpected indent")
    if not text.endswith("\n"):
        text += "\n"
    return text


def parse_tree(source: SourceFile) -> Tree:
    """Run the lark parser; all syntax errors become located :class:`CompileError`."""
    text = _checked_text(source)
    parser = _parser()
    parser.options.postlex.source = source  # type: ignore[union-attr]
    try:
        return parser.parse(text)
    except CompileError:
        raise
    except LarkError as exc:
        raise _syntax_error(exc, source) from None


# ---------------------------------------------------------------------------- tree -> AST
_PARAMS = {
    # name: (kind, required, default)
    "nRanks": ("int", True, None),
    "OpType": ("optype", True, None),
    "nChannels": ("int", False, 1),
    "nWarps": ("int", False, 16),
    "AlgoName": ("str", False, "algo"),
    "GPUPerNode": ("int", False, 0),
    "NICPerNode": ("int", False, 0),
    "Root": ("int", False, 0),            # extension: Broadcast / Reduce root
    "Shift": ("int", False, 1),           # extension: SendRecv: each rank sends to the rank Shift after it
    "nChunksPerRank": ("int", False, 1),  # extension: chunks each rank owns (nChunks = nRanks * this)
    "nMicroBatches": ("int", False, DEFAULT_MICRO_BATCHES),   # extension: the slice policy's least micro-batches per chunk
    "MinSliceBytes": ("int", False, DEFAULT_MIN_SLICE_BYTES),  # extension: the slice policy's least slice (bytes)
}
_PARAM_MIN = {"nRanks": 1, "nChannels": 1, "nWarps": 1, "GPUPerNode": 0, "NICPerNode": 0, "Root": 0, "Shift": 0,
              "nChunksPerRank": 1, "nMicroBatches": 1, "MinSliceBytes": SLICE_ALIGN}
#: upper bound on nRanks * nChunksPerRank (the verifier's state has nRanks * nChunks rows)
MAX_CHUNKS = 1 << 24
# Header integers that the body may read as predefined variables.
HEADER_VARS = ("nRanks", "nChannels", "nWarps", "GPUPerNode", "NICPerNode", "Root", "nChunksPerRank",
               "nChunks", "Shift")

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


def _unquote(s: str) -> str:
    body = s[1:-1]
    if "\\" not in body:
        return body
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _parse_int_literal(tok: Token, source: SourceFile, negative: bool = False) -> int:
    digits = tok.value.replace("_", "")
    # 2**62 has 19 digits: longer literals (even past Python's 4300-digit conversion limit) are
    # refused before converting
    if len(digits.lstrip("0")) > 19 or abs(v := int(digits)) > INT_LIMIT:
        shown = tok.value if len(tok.value) <= 40 else f"{tok.value[:20]}... ({len(digits)} digits)"
        raise CompileError.at(Location(source, tok.line, tok.column),
                              f"integer literal {shown} is too large (|x| must be at most 2**62)")
    return -v if negative else v


class _Builder:
    def __init__(self, source: SourceFile):
        self.source = source
        self.transfers: list[Transfer] = []

    def loc(self, tok: Token) -> Location:
        return Location(self.source, tok.line, tok.column)

    def tree_loc(self, tree: Tree) -> Location:
        """Where ``tree`` starts: its first token (the parser keeps positions on tokens only)."""
        node = tree
        while isinstance(node, Tree):
            node = next(k for k in node.children if k is not None)
        return self.loc(node)

    def node_loc(self, node) -> Location:
        return self.loc(node) if isinstance(node, Token) else self.tree_loc(node)

    # ---------------------------------------------------------------- header
    def header(self, tree: Tree) -> Header:
        kids = [k for k in tree.children]
        head_tok = next(k for k in kids if isinstance(k, Token))
        loc = self.loc(head_tok)
        seen: dict[str, object] = {}
        params: dict[str, Tree] = {}
        for p in kids:
            if not isinstance(p, Tree) or p.data != "param":
                continue
            name_tok, val = p.children
            name = str(name_tok)
            if name not in _PARAMS:
                hint = did_you_mean(name, _PARAMS) or f" (known: {', '.join(_PARAMS)})"
                raise CompileError.at(self.loc(name_tok), f"unknown header parameter '{name}'{hint}")
            if name in seen:
                raise CompileError.at(self.loc(name_tok), f"duplicate header parameter '{name}'")
            seen[name] = self.param_value(name, val)
            params[name] = val
        for name, (_, required, _) in _PARAMS.items():
            if required and name not in seen:
                raise CompileError.at(loc, f"missing required header parameter '{name}'")
        coll, nranks = seen["OpType"], seen["nRanks"]
        for pname, kind in (("Root", "root"), ("Shift", "shift")):
            if pname not in seen:
                continue
            rloc = self.tree_loc(params[pname])
            if coll.spec.parameter != kind:
                takers = one_of([s.title for s in SPECS.values() if s.parameter == kind], "and")
                raise CompileError.at(rloc, f"header parameter '{pname}' applies to {takers}, "
                                            f"not {coll.dsl_name}")
            if seen[pname] >= nranks:
                raise CompileError.at(rloc, f"{pname} {seen[pname]} is out of range (nRanks={nranks}: "
                                            f"0..{nranks - 1})")
        # the collective's rank parameter (Header.root): its root, or SendRecv's shift (1 unless given)
        param = seen.get("Shift", 1 % nranks) if coll.spec.parameter == "shift" else seen.get("Root", 0)
        # AllToAll: one block per (source, destination); the verifier's state has nRanks rows per chunk
        blocks = nranks * nranks if coll.blockwise else 1
        if nranks * blocks * seen.get("nChunksPerRank", 1) > MAX_CHUNKS * (4 if coll.blockwise else 1):
            where = self.tree_loc(params["nChunksPerRank"]) if "nChunksPerRank" in params else loc
            what = "nRanks**3 * nChunksPerRank (AllToAll)" if coll.blockwise else "nRanks * nChunksPerRank"
            raise CompileError.at(where, f"{what} must be at most "
                                         f"{MAX_CHUNKS * (4 if coll.blockwise else 1)}")
        policy = SlicePolicy(seen.get("nMicroBatches", DEFAULT_MICRO_BATCHES),
                             seen.get("MinSliceBytes", DEFAULT_MIN_SLICE_BYTES))
        for pname, one in (("nMicroBatches", SlicePolicy(micro_batches=policy.micro_batches)),
                           ("MinSliceBytes", SlicePolicy(min_slice=policy.min_slice))):
            if pname in params:          # each checked alone, so the error points at its value
                try:
                    one.check()
                except ValueError as exc:
                    raise CompileError.at(self.tree_loc(params[pname]), f"header parameter '{pname}': {exc}") from None
        return Header(
            nranks=seen["nRanks"], collective=seen["OpType"],
            name=seen.get("AlgoName", "algo"),
            nchannels=seen.get("nChannels", 1), nwarps=seen.get("nWarps", 16),
            gpu_per_node=seen.get("GPUPerNode", 0), nic_per_node=seen.get("NICPerNode", 0),
            location=loc, root=param, chunks_per_rank=seen.get("nChunksPerRank", 1),
            micro_batches=policy.micro_batches, min_slice_bytes=policy.min_slice,
            nchannels_given="nChannels" in seen,
        )

    def param_value(self, name: str, val: Tree):
        kind = _PARAMS[name][0]
        vloc = self.tree_loc(val)
        if val.data == "pint" or val.data == "pint_signed":
            if kind != "int":
                want = "a string" if kind == "str" else "a collective name"
                raise CompileError.at(vloc, f"header parameter '{name}' must be {want}, not an integer")
            if val.data == "pint":
                v = _parse_int_literal(val.children[0], self.source)
            else:
                sign, itok = val.children
                v = _parse_int_literal(itok, self.source, negative=(sign == "-"))
            lo = _PARAM_MIN[name]
            if v < lo:
                raise CompileError.at(vloc, f"header parameter '{name}' must be at least {lo}, got {v}")
            return v
        if val.data == "pstring":
            text = _unquote(str(val.children[0]))
        else:  # bare word
            text = str(val.children[0])
            if kind == "str":
                raise CompileError.at(vloc, f"header parameter '{name}' must be a quoted string")
        if kind == "int":
            raise CompileError.at(vloc, f"header parameter '{name}' must be an integer, not a "
                                        f"{'string' if val.data == 'pstring' else 'name'}")
        if kind == "optype":
            c = Collective.parse(text)
            if c is None:
                shown = text if len(text) <= 40 else text[:37] + "..."
                raise CompileError.at(vloc, f"unknown OpType '{shown}'{did_you_mean(text, DSL_NAMES)} "
                                            f"(expected {one_of(DSL_NAMES)})")
            return c
        return text

    # ---------------------------------------------------------------- statements
    def suite(self, tree: Tree, loop_vars: tuple, depth: int) -> list:
        out: list = []
        for ch in tree.children:
            if isinstance(ch, Tree):
                self.stmt(ch, loop_vars, depth, out)
        return out

    def stmt(self, tree: Tree, loop_vars: tuple, depth: int, out: list) -> None:
        d = tree.data
        if d == "simple_stmt":
            for ch in tree.children:
                if isinstance(ch, Tree):
                    self.stmt(ch, loop_vars, depth, out)
        elif d == "assign":
            name_tok, exp = tree.children
            out.append(Assign(str(name_tok), self.expr(exp, 0), self.loc(name_tok)))
        elif d == "pass_stmt":
            out.append(Pass(self.loc(tree.children[0])))
        elif d == "transfer":
            out.append(self.transfer(tree, loop_vars))
        elif d == "for_stmt":
            for_tok, var_tok, _in, range_tok, *rest = tree.children
            body = rest[-1]
            args = [a for a in rest[:-1] if a is not None]
            loc = self.loc(for_tok)
            if depth + 1 > MAX_LOOP_NESTING:
                raise CompileError.at(loc, f"loops nested too deeply (more than {MAX_LOOP_NESTING})")
            if not 1 <= len(args) <= 3:
                raise CompileError.at(self.loc(range_tok),
                                      f"range() takes 1 to 3 arguments, got {len(args)}")
            eargs = [self.expr(a, 0) for a in args]
            var = str(var_tok)
            node = For(var, eargs, [], loc, self.loc(range_tok))
            node.body = self.suite(body, loop_vars + (var,), depth + 1)
            out.append(node)
        else:  # pragma: no cover - grammar and builder out of sync
            raise AssertionError(f"unknown statement {d}")

    def transfer(self, tree: Tree, loop_vars: tuple) -> Transfer:
        tok = tree.children[0]
        args = [a for a in tree.children[1:] if a is not None]
        loc = self.loc(tok)
        if len(args) not in (5, 6):
            raise CompileError.at(loc, f"transfer() takes 5 or 6 arguments (src, dst, step, chunk, op"
                                       f"[, channel]), got {len(args)}")
        names = ("src", "dst", "step", "chunk", "op", "channel")
        vals = []
        for i, a in enumerate(args):
            if i == 4:
                continue
            if isinstance(a, Tree) and a.data == "opword":
                raise CompileError.at(self.tree_loc(a), f"'{a.children[0]}' is an operation; "
                                                        f"transfer() argument {i + 1} ({names[i]}) "
                                                        f"must be an integer expression")
            vals.append(self.expr(a, 0))
        op = self.op_arg(args[4])
        site = len(self.transfers)
        t = Transfer(vals, op, site, loop_vars, loc)
        self.transfers.append(t)
        return t

    def op_arg(self, a) -> int:
        if isinstance(a, Tree):
            if a.data == "opword":
                return RECV if a.children[0] == "recv" else RRC
            if a.data in ("var", "string"):
                raw = str(a.children[0])
                word = _unquote(raw) if a.data == "string" else raw
                if word.lower() == "recv":
                    return RECV
                if word.lower() == "rrc":
                    return RRC
                shown = raw if len(raw) <= 40 else raw[:37] + "..."
                raise CompileError.at(self.tree_loc(a), f"unknown transfer op {shown}"
                                                        f"{did_you_mean(word, ('recv', 'rrc'))} (expected recv or rrc)")
        raise CompileError.at(self.node_loc(a), "transfer() argument 5 must be the operation "
                                                "recv or rrc")

    # ---------------------------------------------------------------- expressions
    def expr(self, t, depth: int) -> Node:
        if depth > MAX_EXPR_DEPTH:
            raise CompileError.at(self.node_loc(t), f"expression nested too deeply "
                                                    f"(more than {MAX_EXPR_DEPTH} levels)")
        if isinstance(t, Token):  # pragma: no cover - every atom is wrapped by an alias
            raise AssertionError(f"bare token {t!r}")
        d = t.data
        if d == "int":
            tok = t.children[0]
            return Int(_parse_int_literal(tok, self.source), self.loc(tok))
        if d == "var":
            tok = t.children[0]
            return Var(str(tok), self.loc(tok))
        if d == "string":
            raise CompileError.at(self.tree_loc(t), "strings are only allowed in the header and as "
                                                    "the transfer op; values are integers")
        if d == "unary":
            op_tok, operand = t.children
            inner = self.expr(operand, depth + 1)
            if op_tok == "+":
                return inner
            if isinstance(inner, Int):
                return Int(-inner.value, self.loc(op_tok))
            return Neg(inner, self.loc(op_tok))
        if d == "binop":
            left, op_tok, right = t.children
            for side in (left, right):
                if isinstance(side, Tree) and side.data == "string":
                    raise CompileError.at(self.loc(op_tok), f"unsupported operand for '{op_tok}': "
                                                            f"a string (arithmetic needs integers)")
            return BinOp(str(op_tok), self.expr(left, depth + 1), self.expr(right, depth + 1),
                         self.loc(op_tok))
        if d == "opword":
            raise CompileError.at(self.tree_loc(t), f"'{t.children[0]}' is a reserved word and "
                                                    f"cannot be used as a value")
        raise AssertionError(f"unknown expression {d}")  # pragma: no cover


# ------------------------------------------------------------------- fast path (in-parse AST)
# ``parse_program`` first tries a second lark parser over the same grammar and LALR tables that
# builds the AST while it parses (lark's ``transformer=`` option), with a lexer that also does the
# indentation (:class:`_FastLexer`). It handles well-formed programs only: at the first sign of
# anything else (a syntax error, a failed static check, a construct it leaves to the reference path)
# it gives up with :class:`_Fallback`, and the reference path above (parse tree + :class:`_Builder`)
# runs from the start and reports exactly what it always reported. On success both paths build the
# same AST; tests compare them.

class _Fallback(Exception):
    """The fast path declines this input; the reference path decides (and reports) instead."""


class _FastLexer(BasicLexer):
    """lark's basic lexer (same terminals, same regular expression, same keyword handling) in one
    tight loop that also turns ``_NL`` into ``_NL`` / ``_INDENT`` / ``_DEDENT`` like
    :class:`_Indenter` (which the fast parser does not use). Tokens that the parse tree drops
    (punctuation, newlines, indentation) are shared objects without positions; the others are
    real :class:`Token` objects with ``line`` and ``column`` (and ``start_pos``). Indentation
    errors and characters no terminal matches raise :class:`_Fallback`."""

    __future_interface__ = 2

    def __init__(self, conf, comparator=None) -> None:
        super().__init__(conf, comparator)
        self._setup = None

    def _prepare(self):
        scanner = self.scanner  # builds lark's scanner (and self.callback)
        if len(scanner._mres) != 1:
            raise _Fallback("scanner split over several regular expressions")
        keywords: dict[str, dict[str, str]] = {}
        for type_, cb in self.callback.items():
            terms = getattr(getattr(cb, "scanner", None), "terminals", None)
            if type(cb) is not UnlessCallback or terms is None or any(
                    type(t.pattern) is not PatternStr or t.pattern.flags for t in terms):
                raise _Fallback(f"unsupported lexer callback for {type_}")
            # an UnlessCallback re-types a token that fully matches one of these plain strings
            keywords[type_] = {t.pattern.value: t.name for t in terms}
        self._setup = (scanner._mres[0], keywords)
        return self._setup

    def lex(self, lexer_state, parser_state):
        mre, keywords = self._setup or self._prepare()
        shared = self.shared_tokens
        kinds = self._kinds(keywords)
        slice_ = lexer_state.text
        text, end = slice_.text, slice_.end
        if slice_.start != 0:
            raise _Fallback("text slices are not supported")
        next_match = mre.scanner(text, 0, end).match    # each call matches where the last ended
        new_str = str.__new__
        line, line_start = 1, 0
        depth = 0                   # open parentheses: newlines inside are joined
        stack = [(0, 0)]            # indentation widths (tab size 8, tab size 1)
        widths = _Indenter._widths
        nl_tok, indent_tok, dedent_tok = shared["_NL"], shared["_INDENT"], shared["_DEDENT"]
        lpar, rpar = shared.get("LPAR"), shared.get("RPAR")
        m = None
        while True:
            prev, m = m, next_match()
            if m is None:
                if (prev.end() if prev is not None else 0) != end:
                    raise _Fallback("no terminal matches")
                break
            type_ = m.lastgroup
            kind = kinds[type_]
            if kind == _K_SHARED:
                tok = shared[type_]
                if tok is lpar:
                    depth += 1
                elif tok is rpar and depth:
                    depth -= 1
                yield tok
                continue
            if kind == _K_IGNORE:
                continue
            if kind == _K_NL:
                value = m.group()
                nls = value.count("\n")
                if nls:
                    start = m.start()
                    line += nls
                    line_start = start + value.rindex("\n") + 1
                if depth:
                    continue
                yield nl_tok
                if not nls:
                    continue
                w = widths(value[line_start - start:])
                top = stack[-1]
                if w == top:
                    continue
                if w[0] > top[0] and w[1] > top[1]:
                    stack.append(w)
                    yield indent_tok
                    continue
                if (w[0] > top[0]) != (w[1] > top[1]) or (w[0] == top[0]) != (w[1] == top[1]):
                    raise _Fallback("inconsistent tabs and spaces")
                while stack[-1][0] > w[0]:
                    stack.pop()
                    yield dedent_tok
                if stack[-1] != w:
                    raise _Fallback("unindent does not match")
                continue
            value = m.group()
            start = m.start()
            tok_line, tok_col = line, start - line_start + 1
            if kind == _K_MULTILINE:    # may hold newlines (positions as lark's LineCounter)
                nls = value.count("\n")
                if nls:
                    line += nls
                    line_start = start + value.rindex("\n") + 1
                if type_ in self.ignore_types:
                    continue
            kw = keywords.get(type_)
            if kw is not None:
                type_ = kw.get(value, type_)
            tok = shared.get(type_)
            if tok is None:
                tok = new_str(Token, value)
                tok.type = type_
                tok.value = value
                tok.start_pos = start
                tok.line = tok_line
                tok.column = tok_col
                tok.end_line = tok.end_column = tok.end_pos = None
            elif tok is lpar:
                depth += 1
            elif tok is rpar and depth:
                depth -= 1
            yield tok
        while len(stack) > 1:
            stack.pop()
            yield dedent_tok

    def _kinds(self, keywords) -> dict[str, int]:
        kinds = {}
        for t in self.terminals:
            n = t.name
            if n == "_NL":
                kinds[n] = _K_NL
            elif n in self.newline_types:
                kinds[n] = _K_MULTILINE
            elif n in self.ignore_types:
                kinds[n] = _K_IGNORE
            elif n in self.shared_tokens and n not in keywords:
                kinds[n] = _K_SHARED
            else:
                kinds[n] = _K_TOKEN
        return kinds


# what _FastLexer does with a terminal's match
_K_SHARED, _K_IGNORE, _K_NL, _K_MULTILINE, _K_TOKEN = range(5)


def _shared_tokens(lark: Lark) -> dict[str, Token]:
    """One position-less token per terminal that no tree keeps (punctuation, ``_NL``, ...)."""
    kept = {"$END"}
    for rule in lark.rules:
        for sym in rule.expansion:
            if sym.is_term and (rule.options.keep_all_tokens or not sym.filter_out):
                kept.add(sym.name)
    names = {t.name for t in lark.terminals} | {"_INDENT", "_DEDENT", "_NL"}
    return {n: Token(n, "", 0, 0, 0, 0, 0, 0) for n in names - kept}


class _Reduce:
    """lark in-parse callbacks (one per rule or alias of ``rccl.lark``; lark passes the children
    the tree would have had) that build :class:`_Builder`'s AST bottom-up, doing its checks as
    conditions only: whatever it would report raises :class:`_Fallback`. Rules without a method
    here (the header, lark's internal list rules) build ordinary trees.

    Differences from the top-down builder, all resolved after the parse or conservatively:
    ``Transfer.loop_vars`` and the loop nesting bound (:func:`_nest`), and the expression depth
    bound (counted as the number of operators in the statement, an upper bound on the depth).
    """

    def __init__(self) -> None:
        self._source: SourceFile | None = None
        self._transfers: list[Transfer] = []
        self._ops = 0    # unary / binary operators since the last statement

    def _reset(self, source: SourceFile) -> None:
        self._source, self._transfers, self._ops = source, [], 0

    def _stmt_done(self) -> None:
        if self._ops > MAX_EXPR_DEPTH:
            raise _Fallback("expression may be nested too deeply")
        self._ops = 0

    # ---------------------------------------------------------------- expressions
    def int(self, ch):
        tok = ch[0]
        v = tok.value
        value = int(v) if len(v) <= 18 else _parse_int_literal(tok, self._source)
        return Int(value, Location(self._source, tok.line, tok.column))

    def var(self, ch):
        tok = ch[0]
        return Var(tok.value, Location(self._source, tok.line, tok.column))

    def unary(self, ch):
        op_tok, inner = ch
        self._ops += 1
        if type(inner) is Tree:
            raise _Fallback("string or operation in an expression")
        if op_tok.value == "+":
            return inner
        if type(inner) is Int:
            return Int(-inner.value, Location(self._source, op_tok.line, op_tok.column))
        return Neg(inner, Location(self._source, op_tok.line, op_tok.column))

    def binop(self, ch):
        left, op_tok, right = ch
        self._ops += 1
        if type(left) is Tree or type(right) is Tree:
            raise _Fallback("string or operation in an expression")
        return BinOp(op_tok.value, left, right, Location(self._source, op_tok.line, op_tok.column))

    # ---------------------------------------------------------------- statements
    def assign(self, ch):
        name_tok, value = ch
        if type(value) is Tree:
            raise _Fallback("string value")
        self._stmt_done()
        return Assign(name_tok.value, value, Location(self._source, name_tok.line, name_tok.column))

    def pass_stmt(self, ch):
        tok = ch[0]
        self._stmt_done()
        return Pass(Location(self._source, tok.line, tok.column))

    def transfer(self, ch):
        tok = ch[0]
        args = [a for a in ch[1:] if a is not None]
        if len(args) not in (5, 6):
            raise _Fallback("transfer() arity")
        op_arg = args.pop(4)
        for a in args:
            if type(a) is Tree:
                raise _Fallback("string or operation as a transfer() value")
        if type(op_arg) is Tree:     # recv / rrc, or a string
            raw = op_arg.children[0].value
            word = _unquote(raw).lower() if op_arg.data == "string" else raw
        elif type(op_arg) is Var:
            word = op_arg.name.lower()
        else:
            raise _Fallback("transfer() operation")
        if word == "recv":
            op = RECV
        elif word == "rrc":
            op = RRC
        else:
            raise _Fallback("unknown transfer() operation")
        self._stmt_done()
        t = Transfer(args, op, len(self._transfers), (), Location(self._source, tok.line, tok.column))
        self._transfers.append(t)
        return t

    def simple_stmt(self, ch):
        return ch

    def suite(self, ch):
        out: list = []
        for s in ch:
            if type(s) is list:
                out.extend(s)
            else:
                out.append(s)
        return out

    def for_stmt(self, ch):
        for_tok, var_tok, _in, range_tok, *rest = ch
        body = rest.pop()
        args = [a for a in rest if a is not None]
        if not 1 <= len(args) <= 3:
            raise _Fallback("range() arity")
        for a in args:
            if type(a) is Tree:
                raise _Fallback("string range() argument")
        return For(var_tok.value, args, body, Location(self._source, for_tok.line, for_tok.column),
                   Location(self._source, range_tok.line, range_tok.column))

    def start(self, ch):
        self._stmt_done()
        header, body = ch
        return header, body


def _nest(stmts: list, loop_vars: tuple, depth: int) -> None:
    """Sets ``Transfer.loop_vars`` (the enclosing loops' variables) and checks the nesting bound."""
    for s in stmts:
        if type(s) is Transfer:
            s.loop_vars = loop_vars
        elif type(s) is For:
            if depth >= MAX_LOOP_NESTING:
                raise _Fallback("loops nested too deeply")
            _nest(s.body, loop_vars + (s.var,), depth + 1)


_FAST: tuple | None = None   # (reference Lark it was made beside, fast Lark or None, _Reduce)


def _fast_parser() -> tuple:
    global _FAST
    base = _parser()
    if _FAST is None or _FAST[0] is not base:
        text = _GRAMMAR.read_text(encoding="utf-8")
        reducer = _Reduce()
        lark = Lark(text, parser="lalr", lexer=_FastLexer, transformer=reducer, maybe_placeholders=True)
        lexer = lark.parser.lexer
        if isinstance(lexer, _FastLexer):
            lexer.shared_tokens = _shared_tokens(lark)
        else:  # pragma: no cover - lark wrapped the lexer: keep to the reference path
            lark = None
        _FAST = (base, lark, reducer)
    return _FAST[1], _FAST[2]


_FAST_LOCK = threading.Lock()   # the fast parser keeps the program being built in its _Reduce


def _parse_fast(source: SourceFile, text: str) -> Program:
    with _FAST_LOCK:
        lark, reducer = _fast_parser()
        if lark is None:
            raise _Fallback("no fast parser")
        reducer._reset(source)
        try:
            header_tree, body = lark.parse(text)
            transfers = reducer._transfers
        finally:
            reducer._reset(None)  # type: ignore[arg-type]
    _nest(body, (), 0)
    header = _Builder(source).header(header_tree)
    return Program(source, header, body, transfers)


def parse_program(source: SourceFile) -> Program:
    """Parse and statically check ``source``; evaluation is :func:`evaluator.evaluate`."""
    text = _checked_text(source)
    try:
        with gc_paused():
            return _parse_fast(source, text)
    except Exception:  # noqa: BLE001 - anything unusual: the reference path decides and reports
        pass
    return _parse_reference(source)


def _parse_reference(source: SourceFile) -> Program:
    tree = parse_tree(source)
    header_tree = next(c for c in tree.children if isinstance(c, Tree) and c.data == "header")
    suite_tree = next(c for c in tree.children if isinstance(c, Tree) and c.data == "suite")
    b = _Builder(source)
    header = b.header(header_tree)
    body = b.suite(suite_tree, (), 0)
    return Program(source, header, body, b.transfers)
