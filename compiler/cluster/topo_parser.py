"""Parser for the cluster DSL (``.topo``): HeteCCL's Appendix A syntax plus additive extensions.

Entry points: :func:`parse_topology` (text -> :class:`~hccc.compiler.cluster.topology.Topology`) and
:func:`load_topology` (path -> Topology).  Every malformed input raises
:class:`~hccc.util.diagnostics.CompileError` with a located diagnostic.

Reading goes in phases, each in a module of its own: the limits on the text
(:mod:`~hccc.compiler.cluster.topo_limits`), the grammar (``topo.lark``), the statements sorted
into scopes (:mod:`~hccc.compiler.cluster.topo_scopes`), and the build of the topology from them
(:mod:`~hccc.compiler.cluster.topo_build`, with :mod:`~hccc.compiler.cluster.topo_links` and
:mod:`~hccc.compiler.cluster.topo_devices`); every value is read by
:mod:`~hccc.compiler.cluster.topo_values`.

The inverse direction, :func:`format_topology`, writes a :class:`ClusterSpec` (plain dataclasses,
:mod:`~hccc.compiler.cluster.topo_format`) as ``.topo`` text; both are re-exported here, so that
the format's two directions are imported from one place. Semantics of every statement are described
in ``examples/clusters/README.md``.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from hccc.compiler.cluster.topo_build import build_topology
from hccc.compiler.cluster.topo_format import (ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec,
                                               SharedSpec, format_topology)
from hccc.compiler.cluster.topo_limits import (MAX_BANDWIDTH_GBPS, MAX_CHUNK_SIZE, MAX_GPUS_PER_NODE,
                                               MAX_LANES, MAX_LATENCY_US, MAX_LINK_ENTRIES, MAX_LINKS, MAX_NODES,
                                               MAX_RANKS, MAX_TOPO_LINES, MIN_BANDWIDTH_GBPS)
from hccc.compiler.cluster.topo_scopes import read_scopes
from hccc.compiler.cluster.topo_values import ValueReader
from hccc.compiler.cluster.topology import Topology
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile, did_you_mean
from hccc.util.limits import check_count, check_source_lines

__all__ = ["parse_topology", "load_topology", "format_topology", "ClusterSpec", "InternodeSpec", "LinkSpec",
           "NicSpec", "NodeSpec", "SharedSpec", "MAX_BANDWIDTH_GBPS", "MAX_CHUNK_SIZE", "MAX_GPUS_PER_NODE",
           "MAX_LANES", "MAX_LATENCY_US", "MAX_LINK_ENTRIES", "MAX_LINKS", "MAX_NODES", "MAX_RANKS",
           "MAX_TOPO_LINES", "MIN_BANDWIDTH_GBPS"]

_GRAMMAR = Path(__file__).with_name("topo.lark")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    # built from the grammar text once per process (about 10 ms), never from lark's disk cache (a
    # pickle: it would run whatever code someone planted in it)
    text = _GRAMMAR.read_text(encoding="utf-8")
    return Lark(text, parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=False)


def _syntax_error(source: SourceFile, exc: UnexpectedInput) -> CompileError:
    line = getattr(exc, "line", None) or 1
    col = getattr(exc, "column", None) or 1
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = source.text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        msg = "unexpected end of input"
    elif isinstance(exc, UnexpectedCharacters):
        ch = source.text[exc.pos_in_stream] if exc.pos_in_stream < len(source.text) else "?"
        msg = f"unexpected character {ch!r}"
    elif isinstance(exc, UnexpectedToken):
        msg = f"unexpected '{exc.token}'"
        if "DEFINE" in (exc.expected or ()):      # a misspelt 'define' (the only keyword a line starts with)
            msg += did_you_mean(str(exc.token), ("define",))
    else:
        msg = "syntax error"
    expected = getattr(exc, "expected", None) or getattr(exc, "allowed", None)
    notes: tuple[str, ...] = ()
    if expected:
        pretty = sorted({_PRETTY.get(t, t) for t in expected})
        if len(pretty) <= 8:
            notes = ("expected " + " or ".join(pretty),)
    return CompileError([Diagnostic(msg, Location(source, line, col), notes=notes)])


_PRETTY = {"LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQUAL": "'='", "LBRACE": "'{'", "RBRACE": "'}'",
           "LSQB": "'['", "RSQB": "']'", "NUMBER": "a number", "NAME": "a name", "DEFINE": "'define'",
           "$END": "end of input"}


def parse_topology(text: str, name: str = "<input>") -> Topology:
    """Parse .topo text into a :class:`Topology`; bad input raises a located CompileError."""
    source = SourceFile(name, text)
    check_source_lines(source, "the cluster description", "describe GPU groups with switch entries '>->'",
                       cap=MAX_TOPO_LINES)
    check_count(source, "->", MAX_LINK_ENTRIES, "link entries ('->' and '>->')")
    if "\x00" in text:
        SourceFile.from_bytes(name, text.encode("utf-8", "replace"))  # raises the located NUL error
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(source, exc) from None
    values = ValueReader(source)
    scopes = read_scopes(tree, values)
    return build_topology(scopes, values, Path(name).stem if name and not name.startswith("<") else name)


def load_topology(path: str | Path) -> Topology:
    """Read and parse a .topo file (undecodable bytes are located errors too)."""
    source = SourceFile.read(path)
    return parse_topology(source.text, source.name)
