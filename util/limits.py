"""Input limits: how much of a user's input hccc reads before it refuses, checked before the work.

Everything here guards the *reading* of user input, so that a hostile or accidental input (a
multi-gigabyte file, ``/dev/zero``, a FIFO nobody writes to, a 4301-digit integer, JSON nested
200,000 deep, an absurd size on the command line) is refused with a clear message in well under a
second instead of exhausting memory or blocking:

- :func:`read_input_bytes` opens without blocking (``O_NONBLOCK``), refuses anything that is not a
  regular file, and refuses files over :func:`max_input_bytes` *before* reading them (and reads at
  most one byte past the cap, should the file grow meanwhile).
- :func:`loads_json` parses JSON with integers of at most :data:`MAX_JSON_INT_DIGITS` digits, no
  ``NaN``/``Infinity``, no key given twice in one object, and a bounded nesting depth, each
  refused with a located diagnostic.
- :func:`check_int_range` is the one range check for numbers given on the command line or in
  files (sizes, counts, timeouts); it names the offending option and the accepted range.
- :func:`printable` makes text read from inputs (names, paths) safe to print on a terminal or put
  in a generated comment: no control characters, no newlines, no escape sequences.

``HCCC_MAX_INPUT_BYTES`` raises (or lowers) the file-size cap, e.g. ``HCCC_MAX_INPUT_BYTES=512M``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import stat
from pathlib import Path

from hccc.util.sizes import human_size
from hccc.util.diagnostics import (DEFAULT_MAX_INPUT_BYTES, CompileError, Diagnostic, Location,
                                                 SourceFile, describe_mode, max_input_bytes, printable,
                                                 read_input_bytes)

#: integers in JSON inputs longer than this are refused (int64 has 19 digits)
MAX_JSON_INT_DIGITS = 24
#: JSON inputs nested deeper than this are refused (hccc's formats nest 4 levels at most)
MAX_JSON_DEPTH = 64

_LONG_INT = re.compile(r"-?\d{%d,}" % (MAX_JSON_INT_DIGITS + 1))
#: fractional numbers in JSON inputs: at most this many characters (a float's shortest repr has at
#: most 24) and a decimal exponent of at most this magnitude (a float64 spans 10**-324 .. 10**308).
#: Past them a reader that keeps the number exact (a TACCL profile's Decimals, made Fractions) would
#: build an integer of the exponent's digits: ``1e-999999999`` took minutes; a float reader would
#: silently read infinity or zero
MAX_JSON_NUMBER_CHARS = 64
MAX_JSON_EXPONENT = 400


def _located(src: SourceFile, offset: int, message: str) -> CompileError:
    return CompileError([Diagnostic(message, src.location_at(offset))])


class _TooLong(Exception):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _TooLong(text)
    return int(text)


def _no_constant(name: str):
    raise ValueError(name)


class _BadNumber(Exception):
    """A fractional number literal past :data:`MAX_JSON_NUMBER_CHARS` or :data:`MAX_JSON_EXPONENT`:
    (the literal, why)."""


def _bounded_float(parse_float):
    """``parse_float`` behind the bounds on a literal's length and exponent, checked on its text."""
    def parse(text: str):
        if len(text) > MAX_JSON_NUMBER_CHARS:
            raise _BadNumber(text, f"a number of more than {MAX_JSON_NUMBER_CHARS} characters")
        mantissa, _, exp = text.lower().partition("e")
        digits = mantissa.lstrip("-").replace(".", "")
        nonzero = digits.lstrip("0")
        # the decimal exponent of the number's leading digit (0 for zero)
        lead = (int(exp or 0) + len(mantissa.lstrip("-").split(".")[0]) - (len(digits) - len(nonzero)) - 1
                if nonzero else 0)
        if abs(lead) > MAX_JSON_EXPONENT:
            raise _BadNumber(text, f"a number outside 10^-{MAX_JSON_EXPONENT} .. 10^{MAX_JSON_EXPONENT}")
        return parse_float(text)
    return parse


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    """An object's members as a dict; a key given twice is an error (JSON parsers disagree on
    which one wins, so hccc takes neither)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _duplicate_key_offset(text: str, key: str) -> int:
    """The offset of the first key of ``text`` given twice in one object (``key``, the one the
    parser found), by a walk over the text's strings and brackets; 0 when it cannot tell."""
    from json.decoder import scanstring
    stack: list[set | None] = []          # per open container: the keys seen (None for arrays)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            stack.append(set())
        elif c == "[":
            stack.append(None)
        elif c in "]}":
            if stack:
                stack.pop()
        elif c == '"':
            try:
                s, end = scanstring(text, i + 1)
            except ValueError:
                return 0
            j = end
            while j < n and text[j] in " \t\r\n":
                j += 1
            if stack and stack[-1] is not None and j < n and text[j] == ":":
                if s in stack[-1]:
                    return i
                stack[-1].add(s)
            i = end
            continue
        i += 1
    return 0


def loads_json(src: SourceFile, *, parse_float=float):
    """Parse ``src`` as JSON; every way it can be unusable is a located :class:`CompileError`."""
    text = src.text
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_bounded_float(parse_float),
                          parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise CompileError([Diagnostic(f"not valid JSON: {exc.msg}",
                                       Location(src, exc.lineno, exc.colno))]) from None
    except _DuplicateKey as exc:
        key = str(exc.args[0])
        raise _located(src, _duplicate_key_offset(text, key),
                       f"key '{printable(key, limit=60)}' is given twice in one object") from None
    except _TooLong:
        m = _LONG_INT.search(text)
        raise _located(src, m.start() if m else 0,
                       f"integer with more than {MAX_JSON_INT_DIGITS} digits") from None
    except _BadNumber as exc:
        literal, why = exc.args
        raise _located(src, max(text.find(literal), 0),
                       f"'{printable(literal, limit=30)}' is {why}: hccc reads none") from None
    except ValueError as exc:   # NaN / Infinity / -Infinity
        off = text.find(str(exc)) if str(exc) else 0
        raise _located(src, max(off, 0), f"'{printable(str(exc))}' is not a number hccc accepts") from None
    except RecursionError:
        raise _located(src, 0, f"JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    _check_depth(src, data)
    return data


def _check_depth(src: SourceFile, data) -> None:
    """Refuse containers nested deeper than MAX_JSON_DEPTH (iteratively: no recursion to exhaust).
    Lists of scalars (the bulk of a ProgramIR) are skipped quickly."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []     # a bare scalar nests nothing
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _located(src, 0, f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
        items = obj.values() if isinstance(obj, dict) else obj
        for x in items:
            if isinstance(x, (dict, list)):
                stack.append((x, depth + 1))


def check_int_range(value, what: str, lo: int, hi: int, location: Location | None = None) -> int:
    """``value`` as an int in ``[lo, hi]``, else a CompileError naming ``what`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompileError([Diagnostic(f"{what} must be an integer, not {type(value).__name__}", location)])
    if not lo <= value <= hi:
        raise CompileError([Diagnostic(f"{what} must be between {lo} and {hi}, not {_short(value)}", location)])
    return value


def _short(value: int) -> str:
    s = str(value) if value.bit_length() < 200 else f"a {value.bit_length()}-bit integer"
    return s if len(s) <= 40 else s[:20] + "..." + s[-8:]


# --------------------------------------------------------------------------- source texts
#: default cap on the lines of one ``.rccl`` / ``.topo`` text, checked before it is parsed
DEFAULT_MAX_SOURCE_LINES = 100_000


def max_source_lines() -> int:
    """The line cap: ``HCCC_MAX_SOURCE_LINES`` or :data:`DEFAULT_MAX_SOURCE_LINES`."""
    text = os.environ.get("HCCC_MAX_SOURCE_LINES", "").strip()
    if not text:
        return DEFAULT_MAX_SOURCE_LINES
    if not (text.isascii() and text.isdigit()) or len(text) > 12 or int(text) <= 0:
        raise CompileError([Diagnostic(
            f"HCCC_MAX_SOURCE_LINES must be a positive number of lines, got {printable(text, limit=40)!r}", None)])
    return int(text)


def check_source_lines(src: SourceFile, what: str, hint: str, cap: int | None = None) -> None:
    """Refuse ``src`` when it has more lines than ``cap`` (default :func:`max_source_lines`; the
    environment variable raises either), before parsing: the parser's time grows with the text.
    ``hint`` says how to write it shorter."""
    cap = max_source_lines() if cap is None or os.environ.get("HCCC_MAX_SOURCE_LINES") else cap
    n = src.text.count("\n") + (0 if src.text.endswith("\n") else 1)
    if n > cap:
        off = 0
        for _ in range(cap):
            off = src.text.find("\n", off) + 1
        raise _located(src, off, f"{what} has {n} lines, over the {cap}-line limit ({hint}; set "
                                 "HCCC_MAX_SOURCE_LINES to raise it)")


def check_count(src: SourceFile, needle: str, cap: int, what: str) -> None:
    """Refuse ``src`` when ``needle`` occurs more than ``cap`` times (counted before parsing);
    located at the first occurrence past the cap."""
    if src.text.count(needle) <= cap:
        return
    off = -1
    for _ in range(cap + 1):
        off = src.text.find(needle, off + 1)
    raise _located(src, off, f"more than {cap} {what}, over the limit (checked before parsing)")


# --------------------------------------------------------------------------- synthesis size
#: the synthesiser's state holds one entry per (chunk, rank): nranks * nranks * chunks_per_rank of
#: them at most (2**24); checked before any work (the language's own cap, nRanks * nChunksPerRank
#: <= 2**24 chunks, is implied); used by :mod:`hccc.compiler.synth` and checked by ``hccc synth``
#: before the synthesiser is even loaded)
MAX_CHUNK_RANK_PAIRS = 1 << 24


def check_synth_size(nranks: int, chunks_per_rank: int) -> None:
    """Refuse (ValueError) a synthesis too large to hold, before anything is allocated."""
    n, k = int(nranks), int(chunks_per_rank)
    if k < 1:
        raise ValueError("chunks per rank must be at least 1")
    if n * n * k > MAX_CHUNK_RANK_PAIRS:
        most = max(1, MAX_CHUNK_RANK_PAIRS // max(1, n * n))
        raise ValueError(f"{k} chunks per rank on {n} ranks means {n * k} chunks, each tracked at every rank: "
                         f"{n * n * k} (chunk, rank) pairs, over the synthesiser's limit of {MAX_CHUNK_RANK_PAIRS}; "
                         f"use at most {most} chunk{'s' if most != 1 else ''} per rank")


# --------------------------------------------------------------------------- command-line numbers
#: the largest byte size accepted on the command line (sizes, chunk sizes): 1 TiB
MAX_OPTION_BYTES = 1 << 40
#: the largest count accepted on the command line (iterations, examples, chunks, ...)
MAX_OPTION_COUNT = 1 << 31
#: the longest time accepted on the command line: one week
MAX_OPTION_SECONDS = 7 * 24 * 3600.0


class OptionValueError(argparse.ArgumentTypeError, ValueError):
    """A command-line value hccc refuses (argparse reports it as a usage error)."""


def option_int(text: str, lo: int = 0, hi: int = MAX_OPTION_COUNT) -> int:
    """``text`` as a decimal integer in ``[lo, hi]``; short ASCII digits only (no 4301-digit
    monsters, no Unicode digits)."""
    t = text.strip()
    if not (t.isascii() and t.isdigit()) or len(t) > 24:
        raise OptionValueError(f"expected an integer >= {lo}, got '{printable(text, limit=40)}'")
    v = int(t)
    if not lo <= v <= hi:
        raise OptionValueError(f"expected an integer between {lo} and {hi}, got {_short(v)}")
    return v


def option_seconds(text: str, lo: float = 0.0, hi: float = MAX_OPTION_SECONDS, *,
                   allow_lo: bool = True) -> float:
    """``text`` as a finite number of seconds in ``[lo, hi]`` (``(lo, hi]`` without ``allow_lo``)."""
    t = text.strip()
    try:
        v = float(t) if len(t) <= 40 else float("nan")
    except ValueError:
        v = float("nan")
    if v != v:
        raise OptionValueError(f"expected a number of seconds, got '{printable(text, limit=40)}'")
    if not (lo <= v <= hi) or (v == lo and not allow_lo):
        rel = ">=" if allow_lo else ">"
        raise OptionValueError(f"expected seconds {rel} {lo:g} and at most {hi:g} (one week), "
                               f"got '{printable(text, limit=40)}'")
    return v


def check_size(value: int, what: str = "size", hi: int = MAX_OPTION_BYTES) -> int:
    """Refuse a byte size over ``hi`` (default 1 TiB) as an :class:`OptionValueError`."""
    if value > hi:
        raise OptionValueError(f"{what} {_short(value)} bytes is over the {human_size(hi)} limit")
    return value


__all__ = ["DEFAULT_MAX_INPUT_BYTES", "MAX_JSON_INT_DIGITS", "MAX_JSON_DEPTH", "MAX_JSON_NUMBER_CHARS",
           "MAX_JSON_EXPONENT", "max_input_bytes",
           "read_input_bytes", "describe_mode", "loads_json", "check_int_range", "printable",
           "MAX_OPTION_BYTES", "MAX_OPTION_COUNT", "MAX_OPTION_SECONDS", "OptionValueError", "option_int",
           "option_seconds", "check_size", "DEFAULT_MAX_SOURCE_LINES", "max_source_lines",
           "check_source_lines", "check_count", "MAX_CHUNK_RANK_PAIRS", "check_synth_size"]
