"""The one safe reading of XML for hccc's readers (MSCCL XML, NCCL's topology dumps).

The stdlib expat parser with DOCTYPE and entity declarations refused, so no entity is ever expanded
and nothing external is fetched; a reader's own refusals (:class:`XmlStop`, raised from its
handlers) and expat's malformations both become located :class:`CompileError` s.
"""
from __future__ import annotations

import xml.parsers.expat as expat
from typing import Callable

from hccc.util.diagnostics import CompileError, Diagnostic, Location


class XmlStop(Exception):
    """A reader's refusal at ``line``, ``col`` (1-based), raised from its handlers."""

    def __init__(self, msg: str, line: int, col: int):
        super().__init__(msg)
        self.line, self.col = line, col


def new_parser():
    """An expat parser that never reads parameter entities."""
    p = expat.ParserCreate()
    p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    return p


def position(p) -> tuple[int, int]:
    """The parser's line and 1-based column."""
    return p.CurrentLineNumber, p.CurrentColumnNumber + 1


def parse(p, src, data: bytes, what: str, *, start: Callable, end: Callable, text: Callable,
          declared_at: Callable[[bytes], tuple[int, int]] | None = None, doctype_note: str = "") -> None:
    """Run ``p`` (:func:`new_parser`) over ``data`` (the bytes of ``src``) with the element
    handlers given. ``what`` names the format in the refusals of declarations ("MSCCL XML");
    ``declared_at(keyword)`` locates a declaration (default: where expat reports it)."""
    at = declared_at or (lambda _keyword: position(p))

    def doctype(*_a):
        raise XmlStop(f"DOCTYPE declarations are not accepted in {what}{doctype_note}", *at(b"<!DOCTYPE"))

    def entity(*_a):
        raise XmlStop(f"entity declarations are not accepted in {what}", *at(b"<!ENTITY"))

    p.StartElementHandler = start
    p.EndElementHandler = end
    p.CharacterDataHandler = text
    p.StartDoctypeDeclHandler = doctype
    p.EntityDeclHandler = entity
    p.ExternalEntityRefHandler = lambda *a: 0
    try:
        p.Parse(data, True)
    except XmlStop as exc:
        raise CompileError([Diagnostic(str(exc), Location(src, exc.line, exc.col))]) from None
    except expat.ExpatError as exc:
        raise CompileError([Diagnostic(f"malformed XML: {expat.ErrorString(exc.code)}",
                                       Location(src, exc.lineno, exc.offset + 1))]) from None


__all__ = ["XmlStop", "new_parser", "parse", "position"]
