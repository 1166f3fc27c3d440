"""The built-in algorithm catalog of the ``"hccc"`` backend: what a job gets without ``HCCC_ALGO_DIR``.

For a group of any size it offers hccc's own generators (:mod:`hccc.compiler.frontend.generators`):

============== =========================================================================
allreduce      ring; hierarchical (``hm``: intra-node, inter-node ring, intra-node) when
               the group spans nodes of equal size with contiguous ranks
allgather      recursive doubling up to :data:`SMALL_BYTES` when the size is a power of
               two, ring above (hierarchical across nodes, as allreduce)
reducescatter  ring (hierarchical across nodes)
broadcast      ring from the call's root
reduce         ring to the call's root
alltoall       direct (hierarchical across nodes)
scatter        direct (linear) from the call's root; across nodes also the binomial tree
               (``tree_scatter`` over ``binomial_tree``), which the simulator picks where
               it is faster on the group's cluster description (see :func:`plan`)
============== =========================================================================

Nothing is built until a call asks for it: the first call of a collective (and root) builds its
entries, each ProgramIR kept in hccc's build cache (:mod:`hccc.runtime.cache`, kind
``torch_catalog``, keyed by the generator, the group's size and node layout and hccc's version), so
later runs read them instead of building (their kernels are cached by content as every
Communicator's are). Every rank derives the same entries from the same agreed inputs (the group's
size, every rank's node name, hccc's version: the process group compares them when it is made), so
the ranks agree on the catalog without exchanging it. The choice between entries is the catalog's
(:meth:`hccc.catalog.Catalog.select`).
"""
from __future__ import annotations

from pathlib import Path

from hccc.catalog import Catalog, Entry

#: the size band (full buffer, bytes) below which the latency-bound algorithms are preferred
#: (recursive doubling's log2(n) steps against the ring's n-1): on the CPU emulation a step costs
#: a host-barrier round (tens of microseconds) while 64 KiB moves in a few microseconds, so the
#: step count dominates below it
SMALL_BYTES = 64 << 10


def _layout(nodes: list[str]) -> tuple[int, int] | None:
    """(nodes, ranks per node) when the group spans several nodes of equal size whose ranks are
    contiguous (rank r on node r // g), else None."""
    order: list[str] = []
    for n in nodes:
        if not order or order[-1] != n:
            if n in order:
                return None              # a node's ranks are not contiguous
            order.append(n)
    if len(order) < 2:
        return None
    g = len(nodes) // len(order)
    if g < 2 or g * len(order) != len(nodes) or any(nodes.count(n) != g for n in order):
        return None
    return len(order), g


def plan(collective: str, world: int, nodes: list[str], root: int | None) -> list[tuple]:
    """The entries of one collective (and root): ``(name, generator, min_bytes, max_bytes)``."""
    from hccc.compiler.frontend import generators as gen
    hier = _layout(nodes)
    pow2 = world >= 2 and world & (world - 1) == 0
    out: list[tuple] = []
    if collective == "allreduce":
        if hier:
            out.append((f"hm_allreduce_{hier[0]}x{hier[1]}", lambda: gen.hm_allreduce(*hier), 0, None))
        else:
            out.append((f"ring_allreduce_{world}", lambda: gen.ring_allreduce(world), 0, None))
    elif collective == "allgather":
        if hier:
            out.append((f"hm_allgather_{hier[0]}x{hier[1]}", lambda: gen.hm_allgather(*hier), 0, None))
        else:
            if pow2:
                out.append((f"recursive_doubling_allgather_{world}",
                            lambda: gen.recursive_doubling_allgather(world), 0, SMALL_BYTES))
            out.append((f"ring_allgather_{world}", lambda: gen.ring_allgather(world), 0, None))
    elif collective == "reducescatter":
        if hier:
            out.append((f"hm_reducescatter_{hier[0]}x{hier[1]}", lambda: gen.hm_reducescatter(*hier),
                        0, None))
        else:
            out.append((f"ring_reducescatter_{world}", lambda: gen.ring_reducescatter(world), 0, None))
    elif collective == "broadcast" and root is not None and 0 <= root < world:
        out.append((f"ring_broadcast_{world}_root{root}", lambda: gen.ring_broadcast(world, root), 0, None))
    elif collective == "reduce" and root is not None and 0 <= root < world:
        out.append((f"ring_reduce_{world}_root{root}", lambda: gen.ring_reduce(world, root), 0, None))
    elif collective == "scatter" and root is not None and 0 <= root < world:
        # hccc sim (tests/test_scatter.py keeps the comparison): on one node the linear scatter is
        # the fastest at every size (8 A100s, 4 KiB to 256 MiB; the CPU emulation, 4 to 16 ranks);
        # across nodes the binomial tree wins above about 8 MiB on 4 servers (4 x 4 and 4 x 8
        # A100s) and loses at every size on 2 (2 x 8). Both serve every size across nodes: with a
        # cluster description the simulator chooses, without one the tie goes to the first name,
        # the linear one.
        out.append((f"direct_scatter_{world}_root{root}", lambda: gen.direct_scatter(world, root), 0, None))
        if len(set(nodes)) > 1 and world > 2:
            out.append((f"tree_scatter_binomial_{world}_root{root}",
                        lambda: gen.tree_scatter(world, gen.binomial_tree(world, root), root), 0, None))
    elif collective == "alltoall":
        if hier:
            out.append((f"hierarchical_alltoall_{hier[0]}x{hier[1]}",
                        lambda: gen.hierarchical_alltoall(*hier), 0, None))
        else:
            out.append((f"direct_alltoall_{world}", lambda: gen.direct_alltoall(world), 0, None))
    return out


class BuiltinCatalog(Catalog):
    """The built-in catalog of a group (see the module docstring); entries are made on first use."""

    #: entries appear as calls ask for them (the process group routes to it while it is empty)
    lazy = True

    def __init__(self, world: int, nodes: list[str], cache_dir=None):
        from hccc.runtime.cache import content_key
        self.world = int(world)
        self.nodes = list(nodes)
        self._cache_dir = cache_dir
        # what every rank derives its entries from (content_key adds hccc's version)
        super().__init__(None, [], content_key("builtin catalog", self.world, "\0".join(self.nodes)))
        self._made: dict[tuple[str, int | None], list[Entry]] = {}

    def _entries(self, collective: str, root: int | None) -> list[Entry]:
        got = self._made.get((collective, root))
        if got is None:
            got = self._made[(collective, root)] = [self._entry(collective, root, *p) for p in
                                                    plan(collective, self.world, self.nodes, root)]
            self.entries.extend(got)
        return got

    def _entry(self, collective: str, root, name: str, make, lo: int, hi: int | None) -> Entry:
        from hccc.compiler.ir.program_ir import ProgramIR
        from hccc.compiler.passes.build import build_program
        from hccc.runtime import cache
        from hccc.runtime.launcher import DTYPES, OPS
        key = cache.content_key("torch-catalog", name, self.world, collective, root)

        def build(tmp: Path) -> None:
            (tmp / f"{name}.json").write_text(build_program(make(), name=name).to_json())
        path = cache.entry("torch_catalog", key, build, root=self._cache_dir) / f"{name}.json"
        ir = ProgramIR.decode_json(path.read_text())
        return Entry(name=name, path=path, collective=ir.collective, nranks=int(ir.nranks),
                     root=int(ir.root) if root is not None else None, dtypes=tuple(DTYPES),
                     ops=tuple(OPS), min_bytes=lo, max_bytes=hi, ir=ir, outdir=False)

    def select(self, collective: str, world: int, nbytes: int, dtype: str, op: str,
               root: int | None = None, cluster=None):
        if world != self.world:
            return None, f"the built-in catalog is for the group's {self.world} ranks, not {world}"
        if self.world < 2:
            return None, "a group of one rank (nothing to exchange)"
        entries = self._entries(collective, root)
        if not entries:
            return None, f"the built-in catalog has no {collective} algorithm" + (
                f" for root {root}" if root is not None else "")
        sub = Catalog(None, entries, self.fingerprint)
        sub._sim_cache = self._sim_cache
        return sub.select(collective, world, nbytes, dtype, op, root, cluster)


__all__ = ["BuiltinCatalog", "SMALL_BYTES", "plan"]
