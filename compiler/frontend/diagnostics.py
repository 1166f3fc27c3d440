"""Located diagnostics: ``FILE:LINE:COL: error: MESSAGE`` with the source line and a caret.

Every stage that rejects user input raises :class:`CompileError` carrying one or more
:class:`Diagnostic` objects; the command line prints them with :func:`render` and exits 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    """A user input file: the name shown in diagnostics and its decoded text."""

    name: str
    text: str

    @classmethod
    def read(cls, path: str | Path) -> "SourceFile":
        """Read a file as UTF-8; undecodable bytes become a located error, not a traceback."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise CompileError([Diagnostic(f"cannot read '{p}': {exc.strerror or exc}", None)]) from None
        return cls.from_bytes(str(p), data)

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
