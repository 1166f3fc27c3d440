"""The first pass over a parsed ``.topo`` file: its statements sorted into scopes.

HeteCCL's scoping rule: a definition belongs to the most recent ``define nodeK = G`` or
``define internode = ...``; definitions before the first node are cluster-wide defaults.
``nodenum`` and ``chunksize`` are always cluster-wide. This pass checks where each statement may
stand and that none is defined twice in its scope; what the values mean is read by the build
(:mod:`~hccc.compiler.cluster.topo_build`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from lark import Token, Tree

from hccc.compiler.cluster.topo_limits import MAX_CHUNK_SIZE, MAX_GPUS_PER_NODE, MAX_NODES, MAX_RANKS
from hccc.compiler.cluster.topo_values import ValueReader
from hccc.util.diagnostics import Location, did_you_mean

_NODE_RE = re.compile(r"node([0-9]+)")
STATEMENTS = ("nodenum", "nodeK", "bandwidth", "internode", "interbandwidth", "latency", "vendor", "gpu",
              "gamma", "nic", "pcie", "chunksize")

#: a scope's definitions: statement name -> (where it is defined, its value tree)
Defs = dict[str, tuple[Location, object]]


@dataclass
class NodeScope:
    """``define nodeK = G`` and the definitions after it."""

    name: str
    index: int  # definition order
    ngpus: int
    loc: Location
    defs: Defs = field(default_factory=dict)


@dataclass
class InterScope:
    """``define internode = (nodeX, nodeY)`` or ``= all`` and the definitions after it."""

    pair: tuple[Token, Token] | None  # None = all
    loc: Location
    defs: Defs = field(default_factory=dict)


@dataclass
class Scopes:
    """Every statement of a file in its scope."""

    nodenum: tuple[Location, int] | None = None
    chunksize: tuple[Location, int] | None = None
    globals: Defs = field(default_factory=dict)
    nodes: list[NodeScope] = field(default_factory=list)
    node_by_name: dict[str, NodeScope] = field(default_factory=dict)
    inters: list[InterScope] = field(default_factory=list)
    ngpus: int = 0  # running total of the nodes' GPUs


def read_scopes(tree: Tree, values: ValueReader) -> Scopes:
    """Sort the statements of ``tree`` into scopes; a misplaced or repeated one is a located error."""
    reader = _ScopeReader(values)
    for stmt in tree.children:
        reader.statement(*stmt.children)
    reader.check_complete()
    return reader.scopes


class _ScopeReader:
    def __init__(self, values: ValueReader):
        self.v = values
        self.scopes = Scopes()
        self.ctx: NodeScope | InterScope | None = None   # the scope of the statements that follow

    def statement(self, _define: Token, name_tok: Token, value) -> None:
        key = str(name_tok)
        m = _NODE_RE.fullmatch(key)
        if key == "nodenum":
            self.nodenum(name_tok, value)
        elif m is not None:
            self.node(name_tok, int(m.group(1)), value)
        elif key == "chunksize":
            self.chunksize(name_tok, value)
        elif key == "internode":
            self.internode(name_tok, value)
        elif key in ("interbandwidth", "bandwidth", "nic", "pcie", "vendor", "gpu", "gamma", "latency"):
            self.scoped(key, name_tok, value)
        else:
            known = [k for k in STATEMENTS if k != "nodeK"] + [f"node{len(self.scopes.nodes) + 1}"]
            raise self.v.err(name_tok, f"unknown definition '{key}'{did_you_mean(key, known)}",
                             notes=("known: " + ", ".join(STATEMENTS),))

    def nodenum(self, name_tok: Token, value) -> None:
        sc = self.scopes
        if sc.nodenum is not None:
            raise self.v.err(name_tok, f"nodenum is defined twice (first at {sc.nodenum[0]})")
        if sc.nodes:
            raise self.v.err(name_tok, "nodenum must be defined before the first node")
        tok = self.v.expect(value, "number", "nodenum").children[0]
        sc.nodenum = (self.v.loc(name_tok), self.v.number(tok, "nodenum", integer=True, maximum=MAX_NODES))

    def node(self, name_tok: Token, k: int, value) -> None:
        sc, key = self.scopes, str(name_tok)
        if sc.nodenum is None:
            raise self.v.err(name_tok, f"{key} is defined before 'define nodenum = N'")
        if not 1 <= k <= sc.nodenum[1]:
            raise self.v.err(name_tok, f"{key} is out of range: nodenum = {sc.nodenum[1]} allows "
                                       f"node1..node{sc.nodenum[1]}")
        if key in sc.node_by_name:
            raise self.v.err(name_tok, f"{key} is defined twice (first at {sc.node_by_name[key].loc})")
        tok = self.v.expect(value, "number", key).children[0]
        g = self.v.number(tok, f"the GPU count of {key}", integer=True, maximum=MAX_GPUS_PER_NODE)
        self.ctx = NodeScope(key, len(sc.nodes), g, self.v.loc(name_tok))
        sc.nodes.append(self.ctx)
        sc.node_by_name[key] = self.ctx
        sc.ngpus += g
        if sc.ngpus > MAX_RANKS:
            raise self.v.err(name_tok, f"the cluster has more than {MAX_RANKS} GPUs")

    def chunksize(self, name_tok: Token, value) -> None:
        sc = self.scopes
        if sc.chunksize is not None:
            raise self.v.err(name_tok, f"chunksize is defined twice (first at {sc.chunksize[0]})")
        tok = self.v.expect(value, "number", "chunksize").children[0]
        sc.chunksize = (self.v.loc(name_tok), self.v.number(tok, "chunksize", integer=True, suffix=True,
                                                            maximum=MAX_CHUNK_SIZE))

    def internode(self, name_tok: Token, value) -> None:
        here = self.v.loc(name_tok)
        if isinstance(value, Tree) and value.data == "name":
            if str(value.children[0]) != "all":
                raise self.v.err(value, "internode expects (nodeX, nodeY) or 'all'"
                                        + did_you_mean(str(value.children[0]), ("all",)))
            self.ctx = InterScope(None, here)
        else:
            pair = self.v.expect(value, "nodepair", "internode")
            self.ctx = InterScope((pair.children[0], pair.children[1]), here)
        self.scopes.inters.append(self.ctx)

    def scoped(self, key: str, name_tok: Token, value) -> None:
        """A definition that belongs to the scope it stands in (which scopes take it: HeteCCL's rule)."""
        ctx = self.ctx
        if key == "interbandwidth":
            if not isinstance(ctx, InterScope):
                raise self.v.err(name_tok, "interbandwidth must follow 'define internode = (nodeX, nodeY)'")
        elif key in ("bandwidth", "nic", "pcie"):
            if not isinstance(ctx, NodeScope):
                raise self.v.err(name_tok, f"{key} must follow a node definition 'define nodeK = G'")
        elif key in ("vendor", "gpu", "gamma") and isinstance(ctx, InterScope):
            raise self.v.err(name_tok, f"{key} belongs to a node (after 'define nodeK = G') or to the "
                                       "whole cluster (before the first node), not to an internode")
        defs = self.scopes.globals if ctx is None else ctx.defs
        if key in defs:
            raise self.v.err(name_tok, f"{key} is defined twice in this scope (first at {defs[key][0]})")
        defs[key] = (self.v.loc(name_tok), value)

    def check_complete(self) -> None:
        """Every node ``nodenum`` promises is defined, and every internode says how it is linked."""
        sc = self.scopes
        if sc.nodenum is None:
            raise self.v.err(Location(self.v.src, 1, 1), "missing 'define nodenum = N'")
        if len(sc.nodes) != sc.nodenum[1]:
            missing = [f"node{k}" for k in range(1, sc.nodenum[1] + 1) if f"node{k}" not in sc.node_by_name]
            raise self.v.err(sc.nodenum[0], f"nodenum = {sc.nodenum[1]} but {len(sc.nodes)} node(s) are "
                                            f"defined (missing: {', '.join(missing[:8])}"
                                            f"{', ...' if len(missing) > 8 else ''})")
        for it in sc.inters:
            if "interbandwidth" not in it.defs:
                raise self.v.err(it.loc, "internode has no 'define interbandwidth = ...' after it")
