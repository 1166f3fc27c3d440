"""Located diagnostics: ``FILE:LINE:COL: error: MESSAGE`` with the source line and a caret.

Every stage that rejects user input raises :class:`CompileError` carrying one or more
:class:`Diagnostic` objects; the command line prints them with :func:`render` and exits 1.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hccc.util.sizes import human_size


#: how alike a word and a known name must be for a "did you mean" (difflib's ratio; 0.6 is difflib's
#: own default, which takes ``transfr`` for ``transfer`` and ``rcc`` for ``rrc`` but not ``x`` for ``pass``)
SUGGEST_CUTOFF = 0.6


def closest(word: str, known) -> str | None:
    """The known name a misspelt ``word`` most likely meant (difflib's close match, else one that
    differs only in case), or None."""
    import difflib
    known = list(dict.fromkeys(known))
    close = difflib.get_close_matches(word, known, n=1, cutoff=SUGGEST_CUTOFF)
    if close:
        return close[0]
    return next((k for k in known if k.lower() == word.lower()), None)


def did_you_mean(word: str, known) -> str:
    """``"; did you mean 'X'?"`` for the closest known name (:func:`closest`), or empty: the end
    of an error about an unknown ``word``."""
    close = closest(word, known)
    return f"; did you mean '{close}'?" if close is not None and close != word else ""


def line_col(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of character ``offset`` of ``text``."""
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


@dataclass(frozen=True)
class SourceFile:
    """A user input file: the name shown in diagnostics and its decoded text."""

    name: str
    text: str

    @classmethod
    def read(cls, path: str | Path) -> "SourceFile":
        """Read a file as UTF-8; undecodable bytes become a located error, not a traceback.
        Regular files only, up to the input size cap (:func:`read_input_bytes`)."""
        p = Path(path)
        return cls.from_bytes(str(p), read_input_bytes(p))

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> "SourceFile":
        if b"\x00" in data:
            off = data.index(b"\x00")
            line = data.count(b"\n", 0, off) + 1
            col = off - (data.rfind(b"\n", 0, off) + 1) + 1
            raise CompileError([Diagnostic("file contains a NUL byte (binary input?)",
                                           Location(cls(name, ""), line, col))])
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            off = exc.start
            line = data.count(b"\n", 0, off) + 1
            col = off - (data.rfind(b"\n", 0, off) + 1) + 1
            raise CompileError([Diagnostic(f"invalid UTF-8 byte 0x{data[off]:02x} (binary input?)",
                                           Location(cls(name, ""), line, col))]) from None
        return cls(name, text)

    def location_at(self, offset: int) -> "Location":
        """The line and column of character ``offset`` of the text."""
        return Location(self, *line_col(self.text, offset))

    def line_text(self, line: int) -> str | None:
        lines = self.text.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return None


@dataclass(frozen=True)
class Location:
    """A 1-based line/column position in a :class:`SourceFile`."""

    source: SourceFile
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Diagnostic:
    message: str
    location: Location | None
    severity: str = "error"
    #: each a text about ``location``, or ``(Location, text)`` about another place
    notes: tuple = field(default_factory=tuple)


class CompileError(Exception):
    """Bad user input. Carries located diagnostics; never a bug in hccc itself."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic, more: int = 0):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        self.more = more  # further errors of the same run that were not listed
        super().__init__(self.diagnostics[0].message if self.diagnostics else "error")

    @classmethod
    def at(cls, location: Location | None, message: str) -> "CompileError":
        return cls([Diagnostic(message, location)])


def _printable(s: str) -> str:
    return "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in s)


def render(diag: Diagnostic) -> str:
    """Format one diagnostic the way compilers do: header line, source line, caret."""
    msg = _printable(diag.message)
    if diag.location is None:
        out = [f"hccc: {diag.severity}: {msg}"]
    else:
        loc = diag.location
        out = [f"{_printable(loc.source.name)}:{loc.line}:{loc.col}: {diag.severity}: {msg}"]
        src = loc.source.line_text(loc.line)
        if src is not None:
            src = _printable(src.expandtabs(1))
            if len(src) > 200:  # keep absurd lines readable
                start = max(0, loc.col - 100)
                src = src[start:start + 200]
                caret_col = loc.col - start
            else:
                caret_col = loc.col
            out.append("    " + src)
            out.append("    " + " " * max(0, caret_col - 1) + "^")
    for note in diag.notes:
        # a note is text about the diagnostic's own place, or (Location, text) about another place;
        # either way it is located the way editors' problem matchers read it
        at, text = note if isinstance(note, tuple) else (diag.location, note)
        where = f"{_printable(at.source.name)}:{at.line}:{at.col}" if at is not None else "hccc"
        out.append(f"{where}: note: {_printable(text)}")
    return "\n".join(out)


def render_all(err: CompileError) -> str:
    parts = [render(d) for d in err.diagnostics]
    if err.more:
        parts.append(f"hccc: note: {err.more} more {'error' if err.more == 1 else 'errors'} not shown")
    return "\n".join(parts)


# --------------------------------------------------------------------------- reading input files
#: default cap on the size of one input file (``.rccl``, ``.topo``, XML, JSON)
DEFAULT_MAX_INPUT_BYTES = 64 << 20
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def env_size(name: str) -> int | None:
    """A positive byte count from the environment variable ``name`` (digits with an optional
    binary K/M/G/T suffix and ``B``), or None when it is unset or empty; ValueError (whose message
    is the printable text) when it is not such a size."""
    text = os.environ.get(name, "").strip().upper().removesuffix("B")
    if not text:
        return None
    unit = text[-1] if text[-1:] in _UNITS else ""
    digits = text[:-1] if unit else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 15 or int(digits) <= 0:
        raise ValueError(printable(text))
    return int(digits) * _UNITS.get(unit, 1)


def max_input_bytes() -> int:
    """The input-file size cap: ``HCCC_MAX_INPUT_BYTES`` (bytes, K/M/G/T suffixes) or 64 MiB."""
    try:
        cap = env_size("HCCC_MAX_INPUT_BYTES")
    except ValueError as exc:
        raise CompileError([Diagnostic(
            f"HCCC_MAX_INPUT_BYTES must be a positive size such as 128M, got {str(exc)!r}", None)]) from None
    return DEFAULT_MAX_INPUT_BYTES if cap is None else cap


def describe_mode(mode: int) -> str:
    """What a non-regular file is, in words (for refusals)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_input_bytes(path: str | Path, *, limit: int | None = None, head: int | None = None,
                     sink=None) -> bytes:
    """The bytes of the user's input file ``path``, or a :class:`CompileError` saying why not.

    Never blocks (FIFOs are refused, not read), never reads more than ``limit`` (default
    :func:`max_input_bytes`) plus one byte. ``head``: only the first ``head`` bytes are wanted
    (a format sniff), whatever the file's size; it must still be a regular file. ``sink``: each
    block read is handed to it instead of kept (a hash of the file in bounded memory); returns b"".
    """
    p = Path(path)
    cap = max_input_bytes() if limit is None else limit
    shown = printable(str(p))
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CompileError([Diagnostic(f"cannot read '{shown}': {exc.strerror or exc}", None)]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CompileError([Diagnostic(
                f"cannot read '{shown}': it is {describe_mode(st.st_mode)}; hccc reads regular files only", None)])
        if head is not None:
            os.set_blocking(fd, True)
            return os.read(fd, max(0, head))
        if st.st_size > cap:
            raise CompileError([Diagnostic(
                f"'{shown}' is {human_size(st.st_size)}, over the {human_size(cap)} input limit "
                "(set HCCC_MAX_INPUT_BYTES to raise it)", None)])
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= cap:
            b = os.read(fd, min(1 << 20, cap + 1 - total))
            if not b:
                break
            total += len(b)
            if total > cap:
                break
            if sink is None:
                chunks.append(b)
            else:
                sink(b)
        if total > cap:
            raise CompileError([Diagnostic(
                f"'{shown}' grew past the {human_size(cap)} input limit while being read", None)])
        return b"".join(chunks)
    except OSError as exc:
        raise CompileError([Diagnostic(f"cannot read '{shown}': {exc.strerror or exc}", None)]) from None
    finally:
        os.close(fd)


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: str, *, limit: int = 200) -> str:
    """``text`` made safe for a terminal line or a one-line comment in generated code: control
    characters (newlines, ESC, ...), bidi overrides and other non-printables become ``\\xNN`` /
    ``\\uNNNN``; ``*/`` cannot close a C comment; overlong text is cut with ``...``."""
    def esc(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    out = _UNSAFE.sub(esc, text)
    out = "".join(ch if ch.isprintable() or ch in "\\" else f"\\u{ord(ch):04x}" for ch in out)
    out = out.replace("*/", "*\\/")
    if len(out) > limit:
        out = out[:limit - 3] + "..."
    return out
