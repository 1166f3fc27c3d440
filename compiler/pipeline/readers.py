"""The input readers, registered once: every command that reads an algorithm finds its reader here
(:func:`reader_for`), so a format added here is read by all of them.

A :class:`Reader` names the suffixes it reads, what it gives (``"algorithm"``: an
:class:`~hccc.compiler.frontend.algorithm.Algorithm` that the compile verifies and schedules;
``"program"``: a :class:`~hccc.compiler.ir.program_ir.ProgramIR` taken as given) and, where
two formats share a suffix (a ProgramIR and an MSCCL++ plan are both ``.json``), a ``claims``
test on the file's first bytes. Readers are asked in registration order, those with a ``claims``
test first; the last reader of a suffix without one takes what no other claimed. Adding a format::

    register_reader(Reader("myformat", (".myf",), "a MyFormat program", "program", read_myformat))

where ``read_myformat(path, options)`` returns the ProgramIR, or raises a located
:class:`~hccc.util.diagnostics.CompileError` for bad input.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile, read_input_bytes

#: bytes a ``claims`` test sees (the start of the file)
HEAD_BYTES = 4096


@dataclass(frozen=True)
class Reader:
    """One input format."""

    name: str                    #: short name, also the ``format`` of ``hccc check --json``
    suffixes: tuple[str, ...]    #: file suffixes (lower case, with the dot; ``""``: no suffix)
    describe: str                #: what the file holds, for messages ("an MSCCL XML algorithm")
    gives: str                   #: "algorithm" (verified and scheduled by the compile) or "program"
    read: Callable               #: ``read(path, options) -> Algorithm | ProgramIR``
    claims: Callable[[bytes], bool] | None = None   #: takes the file by its first bytes
    label: str = ""              #: how a summary names the format ("MSCCL XML"); default ``name``
    proven: bool = False         #: a program format whose reading proves the collective (``hccc check`` need not)
    as_written: bool = False     #: a compiled program, run exactly as written (its slot size is not re-chosen)

    def __post_init__(self):
        if self.gives not in ("algorithm", "program"):
            raise ValueError(f"a reader gives an 'algorithm' or a 'program', not {self.gives!r}")


_READERS: list[Reader] = []


def register_reader(reader: Reader) -> Reader:
    """Add ``reader`` (a name registered before is replaced in place)."""
    for i, r in enumerate(_READERS):
        if r.name == reader.name:
            _READERS[i] = reader
            return reader
    _READERS.append(reader)
    return reader


def readers() -> tuple[Reader, ...]:
    """Every registered reader, in registration order."""
    return tuple(_READERS)


def algorithm_suffixes() -> tuple[str, ...]:
    """Suffixes some reader takes (``""`` left out), in registration order."""
    out: list[str] = []
    for r in _READERS:
        out += [s for s in r.suffixes if s and s not in out]
    return tuple(out)


def _head(path: Path) -> bytes:
    """The first bytes of ``path`` through the input checks (a FIFO or device is never opened
    for a blocking read: the sniff sees nothing and the reader's own read refuses it)."""
    try:
        return read_input_bytes(path, head=HEAD_BYTES)
    except CompileError:
        return b""      # the reader's own read reports it


def reader_for(path: str | Path) -> Reader:
    """The reader of ``path``, by suffix and, where formats share one, by content. A file no
    reader takes is a :class:`CompileError` listing what can be read."""
    p = Path(path)
    suffix = p.suffix.lower()
    cands = [r for r in _READERS if suffix in r.suffixes]
    testing = [r for r in cands if r.claims is not None]
    if testing:
        head = _head(p)
        for r in testing:
            if r.claims(head):
                return r
    plain = [r for r in cands if r.claims is None]
    if plain:
        return plain[-1]
    kinds = ", ".join(f"{'/'.join(s for s in r.suffixes if s)} ({r.describe})" for r in _READERS)
    raise CompileError([Diagnostic(f"don't know how to read '{p.name}': expected {kinds}", None)])


def read_input(path: str | Path, opts=None):
    """``path`` read by its reader: an Algorithm or a ProgramIR (:attr:`Reader.gives`)."""
    from hccc.compiler.pipeline.options import CompileOptions
    return reader_for(path).read(Path(path), opts or CompileOptions())


# ------------------------------------------------------------------------------ the formats
def _read_rccl(path: Path, opts):
    from hccc.compiler.frontend import parse_rccl
    src = SourceFile.read(path)
    return parse_rccl(src.text, str(path), max_transfers=opts.max_transfers)


def _read_msccl_xml(path: Path, opts):
    from hccc.compiler.interop.msccl_xml import import_xml
    return import_xml(path)


def _read_program_ir(path: Path, opts):
    from hccc.compiler.ir.check import load_ir_json
    from hccc.compiler.ir.program_ir import IRFormatError
    src = SourceFile.read(path)
    try:
        return load_ir_json(src.text)
    except IRFormatError as exc:
        raise CompileError([Diagnostic(str(exc), Location(src, exc.line, exc.col))]) from None


register_reader(Reader("rccl", (".rccl", ".resccl", ""), "a ResCCLang program", "algorithm", _read_rccl,
                       label="ResCCLang"))
register_reader(Reader("msccl-xml", (".xml",), "an MSCCL XML algorithm", "program", _read_msccl_xml,
                       label="MSCCL XML", proven=True))
def _read_mscclpp_plan(path: Path, opts):
    from hccc.compiler.interop.mscclpp_import import import_plan
    return import_plan(path)


def _claims_mscclpp_plan(head: bytes) -> bool:
    """An MSCCL++ execution plan names its protocol and placement at the top (a ProgramIR has
    neither key)."""
    return b'"protocol"' in head and b'"inplace"' in head


register_reader(Reader("mscclpp-plan", (".json",), "an MSCCL++ execution plan", "program", _read_mscclpp_plan,
                       claims=_claims_mscclpp_plan, label="MSCCL++ plan", proven=True))
register_reader(Reader("program-ir", (".json",), "a ProgramIR", "program", _read_program_ir,
                       label="ProgramIR", as_written=True))


def load_algorithm(path: str | Path, *, max_transfers: int = 10 ** 7):
    """Read an algorithm file (a format whose reader gives an Algorithm: ``.rccl``)."""
    from hccc.compiler.pipeline.options import CompileOptions
    p = Path(path)
    r = reader_for(p)
    if r.gives != "algorithm":
        raise CompileError([Diagnostic(
            f"'{p.name}' is {r.describe}, not an algorithm file (.rccl): it is read as a program", None)])
    return r.read(p, CompileOptions(max_transfers=max_transfers))


__all__ = ["Reader", "register_reader", "readers", "reader_for", "read_input", "load_algorithm",
           "algorithm_suffixes", "HEAD_BYTES"]
