"""MSCCL XML as located elements, and the reader of their attributes that the importer checks with.

Reading: the stdlib expat parser, with DOCTYPE and entity declarations refused (no entity
expansion, no external fetches) and every element's position kept (:func:`parse_elements`), so
each error points at the offending element or attribute as ``FILE:LINE:COL``
(:class:`ElementReader`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from hccc.util import safe_xml
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile, closest

INT_RE = re.compile(r"-?[0-9]{1,18}")
#: the element each element holds: <algo><gpu><tb><step>, nothing deeper
CHILD = {"algo": "gpu", "gpu": "tb", "tb": "step", "step": None}


@dataclass
class Element:
    tag: str
    attrs: dict
    line: int
    col: int
    byte: int             # offset of its start tag in the UTF-8 text
    children: list = field(default_factory=list)


def parse_elements(src: SourceFile, data: bytes) -> Element:
    """The root element of MSCCL XML ``data`` (the UTF-8 text of ``src``), its tree below it."""
    p = safe_xml.new_parser()
    stack: list[Element] = []
    root: list[Element] = []

    def start(name, attrs):
        line, col = safe_xml.position(p)
        if len(stack) >= len(CHILD):   # <algo><gpu><tb><step>: nothing deeper, refused at once
            raise safe_xml.XmlStop(f"unexpected <{name[:40]}> inside <{stack[-1].tag[:40]}> (MSCCL XML nests "
                                   "<algo>, <gpu>, <tb>, <step> and nothing deeper)", line, col)
        el = Element(name, dict(attrs), line, col, p.CurrentByteIndex)
        if stack:
            stack[-1].children.append(el)
        else:
            root.append(el)
        stack.append(el)

    def end(name):
        stack.pop()

    def text(data):
        if data.strip():
            raise safe_xml.XmlStop(f"unexpected text {data.strip()[:20]!r} (MSCCL XML has only elements and "
                                   "attributes)", *safe_xml.position(p))

    safe_xml.parse(p, src, data, "MSCCL XML", start=start, end=end, text=text)
    if not root:
        raise CompileError([Diagnostic("empty document: expected an <algo> element", Location(src, 1, 1))])
    return root[0]


class ElementReader:
    """Locations of elements and attributes, located errors, and checked attribute values."""

    def __init__(self, src: SourceFile, data: bytes):
        self.src = src
        self.data = data
        self._line_starts = None

    # -- locations ---------------------------------------------------------------------------------
    def _pos(self, byte: int) -> tuple[int, int]:
        if self._line_starts is None:
            self._line_starts = np.r_[0, np.flatnonzero(np.frombuffer(self.data, np.uint8) == 10) + 1]
        li = int(np.searchsorted(self._line_starts, byte, side="right")) - 1
        start = int(self._line_starts[li])
        col = len(self.data[start:byte].decode("utf-8", "replace")) + 1
        return li + 1, col

    def loc(self, el: Element | None, attr: str | None = None) -> Location:
        """Where ``el`` (or its attribute ``attr``, where it has one) starts; the file's start for None."""
        if el is None:
            return Location(self.src, 1, 1)
        if attr is not None:
            end = self.data.find(b">", el.byte)
            seg = self.data[el.byte:end if end >= 0 else len(self.data)]
            m = re.search(rb"\s" + re.escape(attr.encode()) + rb"\s*=", seg)
            if m:
                return Location(self.src, *self._pos(el.byte + m.start() + 1))
        return Location(self.src, el.line, el.col)

    def err(self, el, msg: str, attr: str | None = None, notes=()) -> CompileError:
        return CompileError([Diagnostic(msg, self.loc(el, attr), notes=tuple(notes))])

    # -- attributes --------------------------------------------------------------------------------
    def need(self, el: Element, names) -> None:
        missing = [a for a in names if a not in el.attrs]
        if missing:
            # an attribute it has that is no attribute of the element may be the missing one misspelt
            others = [a for a in el.attrs if a not in names]
            meant = [(o, m) for o in others for m in [closest(o, missing)] if m is not None]
            hint = "".join(f"; '{o}': did you mean '{m}'?" for o, m in meant)
            raise self.err(el, f"<{el.tag}> lacks attribute(s) {', '.join(missing)}{hint}")

    def int_(self, el: Element, name: str, lo: int | None = None, hi: int | None = None, what: str = "") -> int:
        v = el.attrs[name]
        if not INT_RE.fullmatch(v):
            raise self.err(el, f"{name}=\"{v}\" is not an integer", name)
        x = int(v)
        if lo is not None and x < lo:
            raise self.err(el, f"{name}={x} is out of range: {what or f'must be >= {lo}'}", name)
        if hi is not None and x > hi:
            raise self.err(el, f"{name}={x} is out of range: {what or f'must be <= {hi}'}", name)
        return x

    def children(self, el: Element) -> list[Element]:
        """``el``'s children, all of the one tag its own holds."""
        want = CHILD[el.tag]
        for ch in el.children:
            if ch.tag != want:
                raise self.err(ch, f"unexpected <{ch.tag}> inside <{el.tag}>"
                               + (f" (expected <{want}>)" if want else ""))
        return el.children


__all__ = ["Element", "ElementReader", "parse_elements", "INT_RE", "CHILD"]
