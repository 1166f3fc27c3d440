"""Links and shared groups of a ``.topo`` file as they are declared: :class:`DeclaredLinks` adds
them to a :class:`~hccc.compiler.cluster.topology.TopologyBuilder` and remembers where each was
written, so that what the builder refuses (a link defined twice, a link too fast for the slowest)
is reported at the statement that declared it."""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

import numpy as np
from lark import Token, Tree

from hccc.compiler.cluster.topo_format import format_ids
from hccc.compiler.cluster.topo_limits import MAX_LINKS
from hccc.compiler.cluster.topo_scopes import NodeScope
from hccc.compiler.cluster.topo_values import ValueReader
from hccc.compiler.cluster.topology import (LINK_CLASSES, MAX_LOGICAL_CAPACITY, CapacityError, DuplicateLinkError,
                                            Topology, TopologyBuilder)
from hccc.util.diagnostics import CompileError, Diagnostic, Location


class DeclaredLinks:
    """A topology under construction and where each of its links, link parameters and groups was
    declared."""

    def __init__(self, builder: TopologyBuilder, values: ValueReader):
        self.b = builder
        self.v = values
        # the first link id each declaration added, and (where, "link" | "shared" | "nic") of it
        self._origin_start: list[int] = []
        self._origin_loc: list[tuple[Location, str]] = []
        # where each link parameter entry and shared group was first declared (capacity errors)
        self._param_loc: dict[int, Location] = {}
        self._group_loc: dict[int, Location] = {}

    # -- recording -------------------------------------------------------------------------------
    def params(self, cls: str, bw, lanes: int, alpha, at: Location) -> int:
        pid = self.b.params(cls, bw, lanes, alpha)
        self._param_loc.setdefault(pid, at)
        return pid

    def group(self, kind: str, direction: str, label: str, members, bw, lanes: int, alpha, at: Location) -> int:
        gid = self.b.add_group(kind, direction, label, members, bw, lanes, alpha)
        self._group_loc[gid] = at
        return gid

    def note_origin(self, at: Location, desc: str) -> None:
        """The links added next come from the declaration at ``at``."""
        self._origin_start.append(self.b.nlinks)
        self._origin_loc.append((at, desc))
        if self.b.nlinks > MAX_LINKS:
            raise self.v.err(at, f"the cluster has more than {MAX_LINKS} links")

    def check_room(self, at: Location, adding: int) -> None:
        if self.b.nlinks + adding > MAX_LINKS:
            raise self.v.err(at, f"the cluster has more than {MAX_LINKS} links")

    # -- one entry of a bandwidth list -----------------------------------------------------------
    def entry(self, e: Tree, cls: str, x: NodeScope, y: NodeScope, offx: int, offy: int,
              alpha: Callable[[str], Fraction], intra: bool) -> None:
        """``((a,b) -> (bw,lanes))`` or ``(((A),(B)) >-> (bw,lanes))`` from GPUs of ``x`` to GPUs of ``y``."""
        if e.data == "link":
            self._link(e, cls, x, y, offx, offy, alpha, intra)
        else:
            self._shared(e, cls, x, y, offx, offy, alpha, intra)

    def _link(self, e: Tree, cls: str, x: NodeScope, y: NodeScope, offx: int, offy: int, alpha, intra: bool) -> None:
        at = self.v.loc(e)
        ids_tree, spec_tree = e.children
        toks = [t for t in ids_tree.children if isinstance(t, Token)]
        if len(toks) != 2:
            raise self.v.err(ids_tree, f"a link is (src,dst) -> (bandwidth, lanes); got {len(toks)} GPU id(s)")
        a = self.v.gpu(toks[0], x.ngpus, x.name)
        c = self.v.gpu(toks[1], y.ngpus, y.name)
        if intra and a == c:
            raise self.v.err(toks[1], f"link from GPU {a} to itself")
        bw, lanes = self.v.spec(spec_tree)
        pid = self.params(cls, bw, lanes, alpha(cls), at)
        self.note_origin(at, "link")
        self.b.add_links([offx + a], [offy + c], pid, mergeable=False)

    def _shared(self, e: Tree, cls: str, x: NodeScope, y: NodeScope, offx: int, offy: int, alpha,
                intra: bool) -> None:
        """Every pair across groups A and B, both directions, one device: a group each way."""
        at = self.v.loc(e)
        ga_tree, gb_tree, spec_tree = e.children
        ga = self.v.ids(ga_tree, x.ngpus, x.name)
        gb = self.v.ids(gb_tree, y.ngpus, y.name)
        if intra:
            common = sorted(set(ga) & set(gb))
            if common:
                raise self.v.err(gb_tree, f"GPU {common[0]} is in both groups of a shared connection")
        bw, lanes = self.v.spec(spec_tree)
        pid = self.params(cls, bw, lanes, alpha(cls), at)
        A = offx + np.array(ga, dtype=np.int64)
        B = offy + np.array(gb, dtype=np.int64)
        s_ab, d_ab = np.repeat(A, B.size), np.tile(B, A.size)
        self.note_origin(at, "shared")
        self.check_room(at, 2 * s_ab.size)
        ab = self.b.add_links(s_ab, d_ab, pid, mergeable=True)
        ba = self.b.add_links(d_ab, s_ab, pid, mergeable=True)
        where = x.name if intra else f"{x.name}/{y.name}"
        label = f"{where} {cls} ({format_ids(ga)},{format_ids(gb)})"
        self.group(cls, "a->b", label + " a->b", ab, bw, lanes, alpha(cls), at)
        self.group(cls, "b->a", label + " b->a", ba, bw, lanes, alpha(cls), at)

    # -- the end ---------------------------------------------------------------------------------
    def build(self, chunk: int, chunk_at: Location | None) -> Topology:
        """The topology, or the builder's refusal located at the declaration it concerns
        (``chunk_at``: where the chunk size is defined, if it is)."""
        try:
            return self.b.build(chunk)
        except DuplicateLinkError as exc:
            raise self._duplicate(exc) from None
        except CapacityError as exc:
            raise self._capacity(exc, chunk_at) from None

    def _describe_rank(self, r: int) -> str:
        for nd in self.b.nodes:
            if nd.offset <= r < nd.offset + nd.ngpus:
                return f"{nd.name} GPU {r - nd.offset}"
        return f"rank {r}"

    def _duplicate(self, exc: DuplicateLinkError) -> CompileError:
        src, dst, cls = self.b.link_arrays()
        starts = np.array(self._origin_start, dtype=np.int64)
        first = self._origin_loc[int(np.searchsorted(starts, exc.first, side="right")) - 1]
        second = self._origin_loc[int(np.searchsorted(starts, exc.second, side="right")) - 1]
        u, v, c = int(src[exc.second]), int(dst[exc.second]), LINK_CLASSES[int(cls[exc.second])]
        what = (f"link {self._describe_rank(u)} -> {self._describe_rank(v)} ({c})")
        if first[1] != "link" and second[1] != "link":
            msg = f"{what} is declared again with a different bandwidth or lane count (first at {first[0]})"
        else:
            msg = f"{what} is defined twice (first at {first[0]})"
        return CompileError([Diagnostic(msg, second[0])])

    def _capacity(self, exc: CapacityError, chunk_at: Location | None) -> CompileError:
        """A link or group whose speed is too far from the slowest link's (located at it, with a note
        at the slowest link)."""
        first = chunk_at if chunk_at is not None else Location(self.v.src, 1, 1)
        locs = self._param_loc if exc.kind == "param" else self._group_loc
        at = locs.get(exc.index, first)
        ref = self._param_loc.get(exc.ref)
        what = "this link" if exc.kind == "param" else "this shared connection"
        return CompileError([Diagnostic(
            f"{what} is so much faster than the slowest link that one chunk time of the slowest holds "
            f"{exc.capacity} chunks of it (its logical capacity, ceil(tau_ref / tau) * lanes), over the "
            f"limit of {MAX_LOGICAL_CAPACITY}: link speeds of one cluster must be within about 10**9 of "
            "one another", at, notes=(f"the slowest link (tau_ref) is declared at {ref}",) if ref else ())])
