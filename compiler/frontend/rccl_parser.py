"""ResCCLang (.rccl) parser: lark LALR grammar + indentation lexer -> a small typed AST.

The AST is deliberately tiny (one class per construct, positions as :class:`Location`) and is
checked statically here: header parameters, reserved words, ``range()`` / ``transfer()`` arity,
transfer ops, string values outside the header, loop nesting and expression depth. Evaluation
lives in :mod:`evaluator`.

One parser: lark's LALR over ``rccl.lark``, whose lexer (:class:`_Lexer`) also does the
indentation and whose reductions build the AST as they go (lark's ``transformer=`` callbacks,
:class:`_Build`): no parse tree is made but the header's. Syntax errors are reported as the parse
meets them; the static checks then walk the AST in the program's order (:class:`_Checks`), so the
first error in the text is the one reported.
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

from hccc.compiler.frontend.algorithm import MAX_CHANNELS, RECV, RRC, Collective, Header
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


class _Lexer(BasicLexer):
    """lark's basic lexer for ``rccl.lark`` (the same terminals, the same combined regular
    expression, the same keyword handling) in one loop that also does the indentation, by Python's
    rules: ``_NL`` becomes ``_NL`` + ``_INDENT`` / ``_DEDENT``, newlines inside parentheses are
    joined, and tabs and spaces mixed inconsistently are an error (Python's TabError).

    Tokens that no AST node keeps (punctuation, newlines, indentation) are shared objects without
    positions, one allocation less per token; the others are real :class:`Token` objects with
    ``line``, ``column`` and ``start_pos``. Where the parser stops at a shared token,
    :meth:`located` makes the token it stood for from where it was matched. A character that no
    terminal matches raises lark's ``UnexpectedCharacters``, bad indentation a located
    :class:`CompileError`, both when the parser asks for that token (after every error before it)."""

    __future_interface__ = 2

    def __init__(self, conf, comparator=None) -> None:
        super().__init__(conf, comparator)
        self._setup: tuple | None = None
        self.shared: dict[str, Token] = {}     # set by _parser()
        self.source: SourceFile | None = None  # of the parse under way
        self.opened: list[int] = []            # where the open parentheses start
        self.last: list = [None]               # the match of the last shared token (None: end of file)

    def _prepare(self) -> tuple:
        scanner = self.scanner  # builds lark's scanner (and self.callback)
        if len(scanner._mres) != 1:  # pragma: no cover - a grammar of more than 100 terminals
            raise AssertionError("rccl.lark's terminals no longer fit one regular expression")
        keywords: dict[str, dict[str, str]] = {}
        for type_, cb in self.callback.items():
            terms = getattr(getattr(cb, "scanner", None), "terminals", None)
            if type(cb) is not UnlessCallback or terms is None or any(
                    type(t.pattern) is not PatternStr or t.pattern.flags for t in terms):
                raise AssertionError(f"rccl.lark: a lexer callback for {type_} that is not a keyword")  # pragma: no cover
            # an UnlessCallback re-types a token that fully matches one of these plain strings
            keywords[type_] = {t.pattern.value: t.name for t in terms}
        kinds = {}
        for t in self.terminals:
            n = t.name
            if n == "_NL":
                kinds[n] = _K_NL
            elif n in self.newline_types:
                kinds[n] = _K_MULTILINE
            elif n in self.ignore_types:
                kinds[n] = _K_IGNORE
            elif n in self.shared and n not in keywords:
                kinds[n] = _K_SHARED
            else:
                kinds[n] = _K_TOKEN
        self._setup = (scanner._mres[0], keywords, kinds)
        return self._setup

    def _error(self, line: int, col: int, msg: str) -> CompileError:
        return CompileError.at(Location(self.source, line, col), msg)

    def lex(self, lexer_state, parser_state):
        mre, keywords, kinds = self._setup or self._prepare()
        shared = self.shared
        text, end = lexer_state.text.text, lexer_state.text.end
        next_match = mre.scanner(text, 0, end).match    # each call matches where the last ended
        new_str = str.__new__
        line, line_start = 1, 0
        opened = self.opened = []   # open parentheses: newlines inside are joined
        last = self.last
        last[0] = None
        stack = [(0, 0)]            # indentation widths (tab size 8, tab size 1)
        widths = _widths
        nl_tok, indent_tok, dedent_tok = shared["_NL"], shared["_INDENT"], shared["_DEDENT"]
        lpar, rpar = shared["LPAR"], shared["RPAR"]
        pos = 0
        while True:
            m = next_match()
            if m is None:
                if pos != end:
                    raise UnexpectedCharacters(text, pos, line, pos - line_start + 1)
                break
            pos = m.end()
            type_ = m.lastgroup
            kind = kinds[type_]
            if kind == _K_SHARED:
                tok = shared[type_]
                last[0] = m
                if tok is lpar:
                    opened.append(m.start())
                elif tok is rpar and opened:
                    opened.pop()
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
                if opened:
                    continue
                last[0] = m
                yield nl_tok
                if not nls:
                    continue
                indent = value[line_start - start:]
                w = widths(indent)
                top = stack[-1]
                if w == top:
                    continue
                if w[0] > top[0] and w[1] > top[1]:
                    stack.append(w)
                    yield indent_tok
                    continue
                if (w[0] > top[0]) != (w[1] > top[1]) or (w[0] == top[0]) != (w[1] == top[1]):
                    raise self._error(line, 1, "inconsistent use of tabs and spaces in indentation")
                while stack[-1][0] > w[0]:
                    stack.pop()
                    yield dedent_tok
                if stack[-1] != w:
                    raise self._error(line, len(indent) + 1, "unindent does not match any outer indentation level")
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
            tok = new_str(Token, value)
            tok.type = type_
            tok.value = value
            tok.start_pos = start
            tok.line = tok_line
            tok.column = tok_col
            tok.end_line = tok.end_column = tok.end_pos = None
            yield tok
        last[0] = None
        while len(stack) > 1:
            stack.pop()
            yield dedent_tok

    def located(self, tok: Token) -> Token:
        """The token with its position: ``tok`` itself, or for a shared token the one it stood for
        (the last one the lexer gave: where the parser stopped)."""
        if tok is not self.shared.get(tok.type):
            return tok
        m = self.last[0]
        if m is None:               # the blocks closed at the end of the file
            return Token(tok.type, "", 0, 0, 0, 0, 0, 0)
        if tok.type in ("_INDENT", "_DEDENT"):   # at the end of the newline before
            pos = m.end()
            indent = m.group().rsplit("\n", 1)[1]
            line, col = m.string.count("\n", 0, pos) + 1, len(indent) + 1
            return Token(tok.type, indent, pos, line, col, line, col, pos)
        return Token(tok.type, m.group(), m.start(), *_line_col(m.string, m.start()))

    def open_parens(self) -> list[Token]:
        """The parentheses open where the lexer stopped, as tokens with their positions."""
        text = self.source.text if self.source is not None else ""
        return [Token("LPAR", "(", p, *_line_col(text, p)) for p in self.opened]


def _line_col(text: str, pos: int) -> tuple[int, int]:
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


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


# what _Lexer does with a terminal's match
_K_SHARED, _K_IGNORE, _K_NL, _K_MULTILINE, _K_TOKEN = range(5)


def _shared_tokens(lark: Lark) -> dict[str, Token]:
    """One position-less token per terminal that no AST node keeps (punctuation, ``_NL``, ...)."""
    kept = {"$END"}
    for rule in lark.rules:
        for sym in rule.expansion:
            if sym.is_term and (rule.options.keep_all_tokens or not sym.filter_out):
                kept.add(sym.name)
    names = {t.name for t in lark.terminals} | {"_INDENT", "_DEDENT", "_NL"}
    return {n: Token(n, "", 0, 0, 0, 0, 0, 0) for n in names - kept}


_PARSER: tuple | None = None    # (Lark, its _Build, its _Lexer)
_LOCK = threading.Lock()        # one parse at a time: the parser's _Build and _Lexer hold its state


def _parser() -> tuple:
    """The parser (made on first use, under :data:`_LOCK`): lark's LALR over ``rccl.lark`` whose
    reductions call :class:`_Build` (no parse tree; the header's rules, which it leaves alone,
    make the one small tree) and whose lexer is :class:`_Lexer`."""
    global _PARSER
    if _PARSER is None:
        # built from the grammar text once per process (about 20 ms), never from a disk cache:
        # lark's cache is a pickle, which would run whatever code someone planted in it
        text = _GRAMMAR.read_text(encoding="utf-8")
        build = _Build()
        lark = Lark(text, parser="lalr", lexer=_Lexer, transformer=build, maybe_placeholders=True)
        lexer = lark.parser.lexer
        if not isinstance(lexer, _Lexer):  # pragma: no cover - a lark that wraps the lexer
            raise AssertionError("lark wrapped rccl_parser's lexer")
        lexer.shared = _shared_tokens(lark)
        _PARSER = (lark, build, lexer)
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


def _syntax_error(exc: LarkError, source: SourceFile, opened: list[Token]) -> CompileError:
    """The located error of lark's ``exc`` (its token with its position); ``opened``: the
    parentheses open where the parse stopped."""
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
#: header parameters with an upper bound: nChannels, what the kernels' compile takes (a header that
#: checks must compile)
_PARAM_MAX = {"nChannels": (MAX_CHANNELS, "MAX_CHANNELS, the most blocks a thread block runs as")}
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


def _header(source: SourceFile, tree: Tree) -> Header:
    """The checked header of the program, from the parse tree of its ``header`` rule."""
    return _HeaderBuilder(source).header(tree)


class _HeaderBuilder:
    def __init__(self, source: SourceFile):
        self.source = source

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
            if name in _PARAM_MAX and v > _PARAM_MAX[name][0]:
                hi, why = _PARAM_MAX[name]
                raise CompileError.at(vloc, f"header parameter '{name}' must be at most {hi} ({why}), got {v}")
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



# ------------------------------------------------------------------- the AST, built while parsing
# lark calls a method of _Build for each rule (or alias) of rccl.lark it reduces, with the children
# a parse tree would have had; they return AST nodes bottom-up, so no tree is made. An error is
# never raised there: the parse reports its syntax errors first, and the static checks must find
# their errors in the order of the program (the header, then each statement top-down, each
# statement's parts in order), which a bottom-up build does not meet in that order. So what may be
# wrong stays as it was written -- a raw node (_Str, _OpWord, _BigInt, _Unary) in an expression, a
# _RawStmt for a statement with one, or with more operators than an expression may nest -- and
# _Checks, a walk of the finished AST in the program's order, checks those, reporting the first
# error, and replaces them by their AST nodes. Well-formed statements (nearly all) are built
# directly and only have their loops' variables and nesting set by that walk.

class _Str(Node):
    """A string where an integer expression goes (an error, unless it is transfer()'s op)."""

    __slots__ = ("tok",)

    def __init__(self, tok: Token):
        self.tok = tok


class _OpWord(_Str):
    """``recv`` / ``rrc`` as a transfer() argument (an error, unless it is the op)."""

    __slots__ = ()


class _BigInt(_Str):
    """An integer literal over :data:`INT_LIMIT` (an error)."""

    __slots__ = ()


class _Unary(Node):
    """Unary ``+`` (which leaves no node of its own once checked), or ``-`` over a raw operand."""

    __slots__ = ("tok", "operand")

    def __init__(self, tok: Token, operand: Node):
        self.tok, self.operand = tok, operand


class _RawStmt(Node):
    """An assignment or a transfer() to check: ``kind`` and its rule's children; ``site``: a
    transfer's call site, kept for it."""

    __slots__ = ("kind", "children", "site")

    def __init__(self, kind: str, children: list, site: int = -1):
        self.kind, self.children, self.site = kind, children, site


class _Build:
    """The in-parse callbacks (one per rule or alias of ``rccl.lark``; the header's rules and
    lark's internal list rules have none and make ordinary trees). State of one parse:
    ``transfers`` (by call site; None for a transfer left raw), ``folded`` (the negative literals
    folded into one Int, for the expression depth check: id -> (the Int, the '-' token, the Int
    it negated)), and the counts of the statement being parsed: raw nodes and operators."""

    def __init__(self) -> None:
        self.reset(None)

    def reset(self, source: SourceFile | None) -> None:
        self.source = source
        self.transfers: list = []
        self.folded: dict[int, tuple] = {}
        self._raw = 0    # raw nodes since the last statement
        self._ops = 0    # unary / binary operators since the last statement (a bound on the depth)

    def _clean(self) -> bool:
        """The statement just parsed needs no check (and the counts start again)."""
        clean = not self._raw and self._ops <= MAX_EXPR_DEPTH
        self._raw = self._ops = 0
        return clean

    # ---------------------------------------------------------------- expressions
    def int(self, ch):
        tok = ch[0]
        v = tok.value
        if len(v) > 18:             # over 18 characters it may exceed INT_LIMIT
            try:
                value = _parse_int_literal(tok, self.source)
            except CompileError:
                self._raw += 1
                return _BigInt(tok)
        else:
            value = int(v)
        return Int(value, Location(self.source, tok.line, tok.column))

    def var(self, ch):
        tok = ch[0]
        return Var(tok.value, Location(self.source, tok.line, tok.column))

    def string(self, ch):
        self._raw += 1
        return _Str(ch[0])

    def opword(self, ch):
        self._raw += 1
        return _OpWord(ch[0])

    def unary(self, ch):
        op_tok, inner = ch
        self._ops += 1
        t = type(inner)
        if op_tok.value == "+" or not (t is Int or t is Var or t is BinOp or t is Neg):
            self._raw += 1
            return _Unary(op_tok, inner)
        loc = Location(self.source, op_tok.line, op_tok.column)
        if t is Int:
            out = Int(-inner.value, loc)
            self.folded[id(out)] = (out, op_tok, inner)
            return out
        return Neg(inner, loc)

    def binop(self, ch):
        left, op_tok, right = ch
        self._ops += 1
        return BinOp(op_tok.value, left, right, Location(self.source, op_tok.line, op_tok.column))

    # ---------------------------------------------------------------- statements
    def assign(self, ch):
        name_tok, value = ch
        if not self._clean():
            return _RawStmt("assign", ch)
        return Assign(name_tok.value, value, Location(self.source, name_tok.line, name_tok.column))

    def pass_stmt(self, ch):
        tok = ch[0]
        self._clean()
        return Pass(Location(self.source, tok.line, tok.column))

    def transfer(self, ch):
        tok = ch[0]
        args = [a for a in ch[1:] if a is not None]
        op = _op_of(args[4]) if len(args) in (5, 6) else None
        if op is not None and isinstance(args[4], _Str):
            self._raw -= 1          # the op's string or word is in its place
        site = len(self.transfers)
        if not self._clean() or op is None:
            self.transfers.append(None)
            return _RawStmt("transfer", ch, site)
        del args[4]
        t = Transfer(args, op, site, (), Location(self.source, tok.line, tok.column))
        self.transfers.append(t)
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
        # range()'s arguments are checked by _Checks (few): their counts go to the body's first
        # statement, which is then at worst checked for nothing
        for_tok, var_tok, _in, range_tok, *rest = ch
        body = rest.pop()
        args = [a for a in rest if a is not None]
        return For(var_tok.value, args, body, Location(self.source, for_tok.line, for_tok.column),
                   Location(self.source, range_tok.line, range_tok.column))

    def start(self, ch):
        header, body = ch
        return header, body


def _op_of(a) -> int | None:
    """The transfer op that argument ``a`` names (recv, rrc, either as a name or a string in any
    case), or None."""
    t = type(a)
    if t is _OpWord:
        return RECV if a.tok.value == "recv" else RRC
    if t is Var:
        word = a.name.lower()
    elif t is _Str:
        word = _unquote(a.tok.value).lower()
    else:
        return None
    return RECV if word == "recv" else RRC if word == "rrc" else None


_TRANSFER_ARGS = ("src", "dst", "step", "chunk", "op", "channel")


class _Checks:
    """The static checks of the body, in the program's order (:class:`_Build`'s comment): sets
    each transfer's ``loop_vars`` and bounds the loop nesting; checks and builds every raw
    statement and range()'s arguments; raises the first error."""

    def __init__(self, source: SourceFile, transfers: list, folded: dict):
        self.source, self.transfers, self.folded = source, transfers, folded

    def loc(self, tok: Token) -> Location:
        return Location(self.source, tok.line, tok.column)

    def body(self, stmts: list, loop_vars: tuple, depth: int) -> None:
        for i, s in enumerate(stmts):
            t = type(s)
            if t is Transfer:
                s.loop_vars = loop_vars
            elif t is For:
                if depth + 1 > MAX_LOOP_NESTING:
                    raise CompileError.at(s.loc, f"loops nested too deeply (more than {MAX_LOOP_NESTING})")
                if not 1 <= len(s.args) <= 3:
                    raise CompileError.at(s.range_loc, f"range() takes 1 to 3 arguments, got {len(s.args)}")
                s.args = [self.expr(a, 0) for a in s.args]
                self.body(s.body, loop_vars + (s.var,), depth + 1)
            elif t is _RawStmt:
                stmts[i] = self.transfer(s, loop_vars) if s.kind == "transfer" else self.assign(s)

    def assign(self, s: _RawStmt) -> Assign:
        name_tok, exp = s.children
        return Assign(name_tok.value, self.expr(exp, 0), self.loc(name_tok))

    def transfer(self, s: _RawStmt, loop_vars: tuple) -> Transfer:
        tok = s.children[0]
        args = [a for a in s.children[1:] if a is not None]
        loc = self.loc(tok)
        if len(args) not in (5, 6):
            raise CompileError.at(loc, f"transfer() takes 5 or 6 arguments (src, dst, step, chunk, op"
                                       f"[, channel]), got {len(args)}")
        vals = []
        for i, a in enumerate(args):
            if i == 4:
                continue
            if type(a) is _OpWord:
                raise CompileError.at(self.loc(a.tok), f"'{a.tok.value}' is an operation; transfer() argument "
                                                       f"{i + 1} ({_TRANSFER_ARGS[i]}) must be an integer expression")
            vals.append(self.expr(a, 0))
        op = _op_of(args[4])
        if op is None:
            a = args[4]
            if type(a) is Var or type(a) is _Str:
                raw = a.name if type(a) is Var else a.tok.value
                word = raw if type(a) is Var else _unquote(raw)
                shown = raw if len(raw) <= 40 else raw[:37] + "..."
                raise CompileError.at(self.first_loc(a), f"unknown transfer op {shown}"
                                                         f"{did_you_mean(word, ('recv', 'rrc'))} (expected recv or rrc)")
            raise CompileError.at(self.first_loc(a), "transfer() argument 5 must be the operation recv or rrc")
        t = Transfer(vals, op, s.site, loop_vars, loc)
        self.transfers[s.site] = t
        return t

    def first_loc(self, e) -> Location:
        """Where expression ``e`` starts in the text (its first token)."""
        while type(e) is BinOp:
            e = e.left
        if isinstance(e, (_Str, _Unary)):
            return self.loc(e.tok)
        return e.loc

    def expr(self, e, depth: int):
        """``e`` checked (at ``depth`` operators below its statement) and with its raw nodes
        replaced: the same object where it had none."""
        if depth > MAX_EXPR_DEPTH:
            raise CompileError.at(self.first_loc(e), f"expression nested too deeply "
                                                     f"(more than {MAX_EXPR_DEPTH} levels)")
        t = type(e)
        if t is Var:
            return e
        if t is Int:
            neg = self.folded.get(id(e))
            if neg is not None and neg[0] is e:
                self.expr(neg[2], depth + 1)     # the literal under its '-' (only its depth can be wrong)
            return e
        if t is BinOp:
            for side in (e.left, e.right):
                if type(side) is _Str:
                    raise CompileError.at(e.loc, f"unsupported operand for '{e.op}': "
                                                 f"a string (arithmetic needs integers)")
            left, right = self.expr(e.left, depth + 1), self.expr(e.right, depth + 1)
            return e if left is e.left and right is e.right else BinOp(e.op, left, right, e.loc)
        if t is Neg:
            inner = self.expr(e.operand, depth + 1)
            return e if inner is e.operand else Neg(inner, e.loc)
        if t is _Unary:
            inner = self.expr(e.operand, depth + 1)
            if e.tok.value == "+":
                return inner
            if type(inner) is Int:
                return Int(-inner.value, self.loc(e.tok))
            return Neg(inner, self.loc(e.tok))
        if t is _BigInt:
            _parse_int_literal(e.tok, self.source)      # raises
        if t is _OpWord:
            raise CompileError.at(self.loc(e.tok), f"'{e.tok.value}' is a reserved word and cannot be used as a value")
        raise CompileError.at(self.loc(e.tok), "strings are only allowed in the header and as "
                                               "the transfer op; values are integers")


def parse_program(source: SourceFile) -> Program:
    """Parse and statically check ``source``; evaluation is :func:`evaluator.evaluate`."""
    text = _checked_text(source)
    with _LOCK, gc_paused():
        lark, build, lexer = _parser()
        build.reset(source)
        lexer.source = source
        try:
            header_tree, body = lark.parse(text)
        except LarkError as exc:
            if isinstance(exc, UnexpectedToken):
                exc.token = lexer.located(exc.token)
            raise _syntax_error(exc, source, lexer.open_parens()) from None
        finally:
            transfers, folded = build.transfers, build.folded
            build.reset(None)
            lexer.source = None
        header = _header(source, header_tree)
        _Checks(source, transfers, folded).body(body, (), 0)
    return Program(source, header, body, transfers)
