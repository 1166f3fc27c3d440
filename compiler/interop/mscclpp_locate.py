"""Where a value of an MSCCL++ plan stands in its file, for located messages.

A plan is read as parsed JSON; its messages name the path of the value they are about
(``("gpus", 0, "threadblocks", 2, "ops", 5)``). :func:`positions` finds the offset of such a path
in the text (reading only as far as needed), :class:`PlanReader` turns it into a
:class:`~hccc.util.diagnostics.Location` and reads checked fields.
"""
from __future__ import annotations

from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile


class _Found(Exception):
    pass


def positions(text: str, target: tuple | None = None) -> dict[tuple, int]:
    """Offset of every JSON value by its path (keys and indices), for located messages; with a
    ``target`` path, only up to that value (a message about the start of a large plan is found
    without reading the rest)."""
    pos: dict[tuple, int] = {}
    n = len(text)

    def ws(i):
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    def string(i):
        i += 1
        out = []
        while text[i] != '"':
            if text[i] == "\\":
                out.append(text[i:i + 2])
                i += 2
            else:
                out.append(text[i])
                i += 1
        return "".join(out), i + 1

    def value(i, path):
        i = ws(i)
        pos[path] = i
        if path == target:
            raise _Found
        c = text[i]
        if c == "{":
            i = ws(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                k, i = string(ws(i))
                i = ws(i)
                i = value(i + 1, path + (k,))
                i = ws(i)
                if text[i] == "}":
                    return i + 1
                i += 1
        if c == "[":
            i = ws(i + 1)
            if text[i] == "]":
                return i + 1
            k = 0
            while True:
                i = value(i, path + (k,))
                k += 1
                i = ws(i)
                if text[i] == "]":
                    return i + 1
                i += 1
        if c == '"':
            return string(i)[1]
        while i < n and text[i] not in ",]} \t\r\n":
            i += 1
        return i

    try:
        value(0, ())
    except (IndexError, RecursionError, _Found):
        pass
    return pos


class PlanReader:
    """Located errors and checked fields of one plan: a JSON path (keys and indices) becomes the
    file, line and column of its value (of an operation's name, for an operation)."""

    def __init__(self, src: SourceFile):
        self.src = src
        self._pos = None

    def loc(self, path: tuple) -> Location:
        p = tuple(path)
        if self._pos is None:
            early = positions(self.src.text, p)          # read only up to the value itself
            if p in early:
                if self.src.text.startswith("{", early[p]):    # an operation: point at its name
                    named = positions(self.src.text, p + ("name",))
                    if p + ("name",) in named:
                        return self._offset(named[p + ("name",)])
                return self._offset(early[p])
            self._pos = positions(self.src.text)
        while p and p not in self._pos:
            p = p[:-1]
        if p + ("name",) in self._pos:       # an operation: point at its name
            p = p + ("name",)
        return self._offset(self._pos.get(p, 0))

    def _offset(self, off: int) -> Location:
        return self.src.location_at(off)

    def err(self, path, msg: str) -> CompileError:
        return CompileError([Diagnostic(msg, self.loc(path))])

    def get(self, obj, key, path, kind=None):
        if not isinstance(obj, dict) or key not in obj:
            raise self.err(path, f"missing '{key}'")
        v = obj[key]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise self.err(path + (key,), f"'{key}' must be a non-negative integer")
        if kind is list and not isinstance(v, list):
            raise self.err(path + (key,), f"'{key}' must be a list")
        if kind is str and not isinstance(v, str):
            raise self.err(path + (key,), f"'{key}' must be a string")
        return v


__all__ = ["PlanReader", "positions"]
