"""The built-in algorithm catalog of the ``"hccc"`` backend: what a job gets without ``HCCC_ALGO_DIR``,
and what fills the gaps of a catalog directory (:class:`hccc.catalog.FilledCatalog`: the
directory's entries first). It imports no torch (``hccc catalog --ranks`` lists it).

For a group of any size it offers hccc's own generators (:mod:`hccc.compiler.frontend.generators`):

============== =========================================================================
allreduce      ring; hierarchical (``hm``: intra-node, inter-node ring, intra-node) when
               the group spans nodes of equal size with contiguous ranks; within one node
               the one-shot program (:func:`hccc.compiler.ir.one_shot.one_shot_allreduce`:
               one hop) up to :func:`one_shot_bytes`, the all-pairs program
               (``direct_allreduce``) above it up to :data:`SMALL_BYTES` (none where the
               one-shot's band reaches it)
allgather      within one node the one-step program (``direct_allgather``: one hop) up to
               :data:`SMALL_BYTES`, recursive doubling instead from
               :data:`RD_ALLGATHER_MIN_RANKS` ranks (a power of two) and on groups that span
               nodes; ring above (hierarchical across nodes, as allreduce)
reducescatter  ring (hierarchical across nodes); within one node the all-pairs program
               (``direct_reducescatter``) up to :data:`SMALL_BYTES`
broadcast      ring from the call's root; within one node the root's one-step program
               (``direct_broadcast``: one hop) up to :data:`SMALL_BYTES`
reduce         ring to the call's root; within one node every rank into the root
               (``direct_reduce``) up to :data:`SMALL_BYTES`
alltoall       direct (hierarchical across nodes)
scatter        direct (linear) from the call's root; across nodes also the binomial tree
               (``tree_scatter`` over ``binomial_tree``), which the simulator picks where
               it is faster on the group's cluster description (see :func:`plan`)
============== =========================================================================

With a topology (``HCCC_TOPOLOGY`` or ``Options(topology=)``, a ``.topo`` or TACCL ``.json``) whose
GPUs are as many as the group's ranks, each of allreduce, allgather, reducescatter, alltoall and
broadcast also gets the program ``hccc synth`` makes for that topology (:func:`hccc.synthesize_program`,
within :data:`SYNTH_TIME_LIMIT_S`); the catalog's choice then times every entry on the topology
(the process group's tie-break cluster) and takes the fastest. A topology that synthesis refuses,
or one of another size, adds nothing (the reason is kept: :attr:`BuiltinCatalog.synth_notes`).

Nothing is built until a call asks for it: the first call of a collective (and root) builds its
entries, each ProgramIR kept in hccc's build cache (:mod:`hccc.runtime.cache`, kind
``torch_catalog``, keyed by the generator, the group's size and node layout and hccc's version; a
synthesized one by the topology's contents, the collective, root and time limit too), so later runs
read them instead of building (their kernels are cached by content as every Communicator's are).
Every rank derives the same entries from the same agreed inputs (the group's size, every rank's
node name, the topology's contents, hccc's version: the process group compares them when it is
made), so the ranks agree on the catalog without exchanging it. A synthesis bounded by its time
limit might end differently in two processes; the ranks of a group hccc carries share one host and
so one cache, whose per-entry lock lets one rank synthesize while the others wait for its result
(:func:`hccc.runtime.cache.entry`), so they read the same program. The choice between entries is the catalog's
(:meth:`hccc.catalog.Catalog.select`).
"""
from __future__ import annotations

from pathlib import Path

from hccc.catalog import Catalog, Entry
from hccc.compiler.synth.plan import COLLECTIVES

#: the size band (full buffer, bytes) below which the latency-bound algorithms are preferred
#: (the one-step and all-pairs programs within a node, recursive doubling's log2(n) steps, against
#: the ring's n-1): on the CPU emulation a step costs a host-barrier round (tens of microseconds)
#: while 64 KiB moves in a few microseconds, so the step count dominates below it. The kernel cost
#: model (:func:`hccc.runtime.kernel_time.program_time`, one rank per GPU, ``--proto
#: auto``) puts the direct (all-pairs, one-step) programs of AllReduce, AllGather,
#: ReduceScatter, Broadcast and Reduce ahead of the ring at every size up to it on 3 to 16 ranks
#: (8 ranks at 4 KiB: 40.8 us against 75.4 for AllReduce, 21.8 against 40.5 for AllGather, 35.5
#: against 38.5 for ReduceScatter, 28.8 against 55.1 for Broadcast, 42.5 against 53.0 for
#: Reduce) and sets no crossover above it: it charges no link bandwidth, which an
#: all-pairs program spreads over N-1 peers at once. Nor does the simulator, which charges the
#: links and the same units and hops (:data:`hccc.compiler.passes.kernel_cost.SIM_COSTS`): on one
#: NVSwitch node of 8 GPUs (450 GB/s each way a GPU, one channel a program) the direct programs
#: lead the ring at every power of two from 4 KiB to 64 MiB (AllReduce 32.3 us against 94.7 at
#: 64 KiB, 418 against 2,663 at 64 MiB; Broadcast, the closest, 1,540 against 1,725 at 64 MiB).
#: So the band is not a crossover of the kernel cost model: it stays where the step count is what
#: a call pays on the emulation (tests/test_one_shot.py recomputes the choice below it)
SMALL_BYTES = 64 << 10
#: the size band (full buffer, bytes) of the one-shot AllReduce within one node on groups
#: :data:`ONE_SHOT_BANDS` does not list: the largest power of two at which the kernel cost model
#: (as for :data:`SMALL_BYTES`) puts it ahead of the all-pairs program on every group of 9 to 16
#: ranks, whose n chunks a message are more than one unit round holds, so its receives run one
#: unit each (9 ranks: 40.6 us against 45.7 at 16 KiB, 52.6 against 46.1 at 32 KiB): its messages
#: carry the whole buffer, n - 1 of them a rank, so above it the bytes cost more than the hops it
#: saves
ONE_SHOT_BYTES = 16 << 10
#: the one-shot AllReduce's band by group size where the model sets another (2 to 8 ranks; from 3
#: ranks its receives run as one N-source unit, :mod:`hccc.compiler.ir.reduce_groups`): the
#: largest power of two, up to :data:`SMALL_BYTES`, at which the kernel cost model (as for
#: :data:`SMALL_BYTES`) puts it ahead of the all-pairs program (8 ranks: 41.7 us against 43.8 at
#: 64 KiB, 17.0 against 40.8 at 4 KiB, the ring 75.4; 5 ranks: 21.2 against 27.7 at 32 KiB, 30.5
#: against 30.4 at 64 KiB; 2 ranks: 13.9 against 14.4 at 32 KiB); tests/test_one_shot.py
#: recomputes every entry
ONE_SHOT_BANDS = {2: 32 << 10, 3: 32 << 10, 4: 32 << 10, 5: 32 << 10, 6: 64 << 10, 7: 64 << 10, 8: 64 << 10}


def one_shot_bytes(world: int) -> int:
    """The one-shot AllReduce's size band on ``world`` ranks within one node (full buffer, bytes):
    :data:`ONE_SHOT_BANDS`' entry, else :data:`ONE_SHOT_BYTES`."""
    return ONE_SHOT_BANDS.get(int(world), ONE_SHOT_BYTES)
#: the largest element (bytes) of the catalog's dtypes (float64, int64): a band's largest chunk is
#: counted in it, which bounds every smaller element's (their chunks round up less)
WIDEST_ELEMENT = 8
#: the default slot share of an entry without a band (``build_program``'s ``chunk_bytes``)
DEFAULT_CHUNK_BYTES = 1 << 20


def band_chunk_bytes(max_bytes: int, nchunks: int, max_step_chunks: int = 1) -> int:
    """The ``chunk_bytes`` (FIFO slot size) of an entry whose band ends at ``max_bytes`` (full
    buffer): the smallest whose every chunk's share holds one chunk of the band's largest call in
    one micro-batch under LL too (an LL line carries half its bytes: ``abi.ll_share_bytes``), so a
    call in the band runs the fewest micro-batches and the run-time channel rule
    (:func:`hccc.compiler.passes.channels.device_channels`: no channel with less than 16 KiB of a
    full slice) gives it channels by the band's size, not by a 1 MiB slot's; at least 16 bytes a
    chunk of a step, at most :data:`DEFAULT_CHUNK_BYTES`."""
    from hccc.compiler.passes.slicing import SLICE_ALIGN
    n, w = max(1, int(nchunks)), WIDEST_ELEMENT
    chunk = -(-(-(-int(max_bytes) // w)) // n) * w            # ceil(ceil(bytes / w) / n) elements of w
    chunk = -(-chunk // SLICE_ALIGN) * SLICE_ALIGN
    steps = max(1, int(max_step_chunks))
    return int(min(DEFAULT_CHUNK_BYTES, max(SLICE_ALIGN * steps, 2 * chunk * steps)))


def build_entry(make, name: str, max_bytes: int | None):
    """The ProgramIR of a catalog entry: ``make()`` (an Algorithm, built and proven here, or a
    ProgramIR built whole; ``make(chunk_bytes=...)`` for the latter) with the default slot, and
    with :func:`band_chunk_bytes` where the entry has a band (``max_bytes``) that needs less."""
    from hccc.compiler.ir.program_ir import ProgramIR
    from hccc.compiler.passes.build import build_program
    made = make()
    ir = made if isinstance(made, ProgramIR) else build_program(made, name=name)
    if max_bytes is not None:
        cb = band_chunk_bytes(max_bytes, int(ir.nchunks), int(ir.max_step_chunks))
        if cb < int(ir.chunk_bytes):
            ir = make(chunk_bytes=cb) if isinstance(made, ProgramIR) else \
                build_program(made, name=name, chunk_bytes=cb)
    ir.name = name
    return ir


#: the least group (a power of two) whose small AllGathers within one node take recursive doubling
#: instead of the one-step program: the kernel cost model (as for :data:`SMALL_BYTES`) puts the
#: one-step program ahead up to 8 ranks (21.8 us against 23.7 at 4 KiB) and recursive doubling
#: ahead on 16 (33.0 against 38.9), where the one-step program launches 30 blocks a rank to its 8
RD_ALLGATHER_MIN_RANKS = 16

#: the time limit of a synthesis for the built-in catalog (seconds, ``hccc synth --time-limit``): it
#: delays the first call of a collective once per topology (later runs read the cache). A 2 x 2
#: AllReduce synthesizes in about 2.6 s here, an AllGather in 0.1 s; ``hccc synth``'s own default
#: is 60 s, halved so that a first call stays well inside torch's default collective timeout
SYNTH_TIME_LIMIT_S = 30.0
#: the collectives :func:`hccc.synthesize` makes programs for (reduce is not among them)
SYNTH_COLLECTIVES = COLLECTIVES


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
    one_node = len(set(nodes)) == 1
    out: list[tuple] = []
    if collective == "allreduce":
        if hier:
            out.append((f"hm_allreduce_{hier[0]}x{hier[1]}", lambda: gen.hm_allreduce(*hier), 0, None))
        else:
            if one_node and world >= 2:
                from hccc.compiler.ir.one_shot import one_shot_allreduce
                out.append((f"one_shot_allreduce_{world}", lambda **kw: one_shot_allreduce(world, **kw), 0,
                            one_shot_bytes(world)))
                if one_shot_bytes(world) < SMALL_BYTES:    # (else the one-shot serves the whole band)
                    out.append((f"direct_allreduce_{world}", lambda: gen.direct_allreduce(world), 0, SMALL_BYTES))
            out.append((f"ring_allreduce_{world}", lambda: gen.ring_allreduce(world), 0, None))
    elif collective == "allgather":
        if hier:
            out.append((f"hm_allgather_{hier[0]}x{hier[1]}", lambda: gen.hm_allgather(*hier), 0, None))
        else:
            if one_node and not (pow2 and world >= RD_ALLGATHER_MIN_RANKS):
                out.append((f"direct_allgather_{world}", lambda: gen.direct_allgather(world), 0, SMALL_BYTES))
            elif pow2:
                out.append((f"recursive_doubling_allgather_{world}",
                            lambda: gen.recursive_doubling_allgather(world), 0, SMALL_BYTES))
            out.append((f"ring_allgather_{world}", lambda: gen.ring_allgather(world), 0, None))
    elif collective == "reducescatter":
        if hier:
            out.append((f"hm_reducescatter_{hier[0]}x{hier[1]}", lambda: gen.hm_reducescatter(*hier),
                        0, None))
        else:
            if one_node:
                out.append((f"direct_reducescatter_{world}", lambda: gen.direct_reducescatter(world), 0,
                            SMALL_BYTES))
            out.append((f"ring_reducescatter_{world}", lambda: gen.ring_reducescatter(world), 0, None))
    elif collective == "broadcast" and root is not None and 0 <= root < world:
        if one_node:
            out.append((f"direct_broadcast_{world}_root{root}", lambda: gen.direct_broadcast(world, root), 0,
                        SMALL_BYTES))
        out.append((f"ring_broadcast_{world}_root{root}", lambda: gen.ring_broadcast(world, root), 0, None))
    elif collective == "reduce" and root is not None and 0 <= root < world:
        if one_node:
            out.append((f"direct_reduce_{world}_root{root}", lambda: gen.direct_reduce(world, root), 0, SMALL_BYTES))
        out.append((f"ring_reduce_{world}_root{root}", lambda: gen.ring_reduce(world, root), 0, None))
    elif collective == "scatter" and root is not None and 0 <= root < world:
        # hccc sim (tests/test_scatter.py keeps the comparison): on one node the linear scatter was
        # the fastest at every size in the alpha-beta model (8 A100s, 4 KiB to 256 MiB; the CPU
        # emulation, 4 to 16 ranks); across nodes the binomial tree wins at 64 MiB on 2 and 4
        # servers since the simulator charges the kernels' units (it lost on 2 before). Both serve
        # every size across nodes: with a cluster description the simulator chooses, without one
        # the tie goes to the first name, the linear one.
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

    def __init__(self, world: int, nodes: list[str], cache_dir=None, topology=None,
                 topology_digest: str | None = None):
        from hccc.runtime.cache import compiler_digest, content_key
        self.world = int(world)
        self.nodes = list(nodes)
        self._cache_dir = cache_dir
        self.topology = topology
        #: the topology file's SHA-256 (its contents, not its path, key the synthesized entries)
        self.topology_digest = "" if topology is None else topology_digest or _digest(topology)
        #: why a collective has no synthesized entry (a topology of another size, a refusal)
        self.synth_notes: dict[str, str] = {}
        # what every rank derives its entries from (content_key adds hccc's version; the compiler's
        # sources too: ranks whose compilers differ would build different programs)
        super().__init__(None, [], content_key("builtin catalog", self.world, "\0".join(self.nodes),
                                               self.topology_digest, compiler_digest()))
        self._made: dict[tuple[str, int | None], list[Entry]] = {}
        self._topo = None

    def _entries(self, collective: str, root: int | None) -> list[Entry]:
        got = self._made.get((collective, root))
        if got is None:
            got = [self._entry(collective, root, *p) for p in plan(collective, self.world, self.nodes, root)]
            if got and self.topology is not None and collective in SYNTH_COLLECTIVES:
                got += self._synthesized(collective, root)
            self._made[(collective, root)] = got
            self.entries.extend(got)
        return got

    def _synthesized(self, collective: str, root: int | None) -> list[Entry]:
        """The program synthesis makes for the topology (built once per topology, collective and
        root, then read from the cache), or nothing, with the reason in :attr:`synth_notes`."""
        from hccc.compiler.ir.program_ir_json import decode_json
        from hccc.runtime import cache
        if self._topo is None:
            from hccc.compiler.pipeline import load_cluster
            self._topo = load_cluster(self.topology)
        ngpus = sum(int(n.ngpus) for n in self._topo.nodes)
        if ngpus != self.world:
            self.synth_notes[collective] = (f"the topology {self.topology} has {ngpus} GPUs, the group "
                                            f"{self.world} ranks")
            return []
        name = f"synth_{collective}_{self.world}" + (f"_root{root}" if collective == "broadcast" else "")
        key = cache.content_key("torch-catalog-synth", name, self.topology_digest, collective, root,
                                SYNTH_TIME_LIMIT_S, cache.compiler_digest())

        def build(tmp: Path) -> None:
            from hccc import synthesize_program
            from hccc.compiler.passes.build import build_program
            from hccc.util.diagnostics import CompileError, render_all
            try:
                prog = synthesize_program(self.topology, collective, root=root or 0, time_limit=SYNTH_TIME_LIMIT_S)
                # the text, kept for whoever reads the cache; the compiler takes the Algorithm it parses to
                (tmp / f"{name}.rccl").write_text(prog.text)
                ir = build_program(prog.algorithm, name=name)
            except CompileError as exc:
                # (kept, so that later runs do not try again)
                (tmp / "refused.txt").write_text(render_all(exc))
                return
            (tmp / f"{name}.json").write_text(ir.to_json())
        where = cache.entry("torch_catalog", key, build, root=self._cache_dir)
        if (where / "refused.txt").exists():
            self.synth_notes[collective] = "synthesis refused the topology: " + \
                (where / "refused.txt").read_text().strip().splitlines()[0]
            return []
        from hccc.runtime.launcher import DTYPES, OPS
        ir = decode_json((where / f"{name}.json").read_text())
        return [Entry(name=name, path=where / f"{name}.json", collective=ir.collective, nranks=int(ir.nranks),
                      root=int(ir.root) if root is not None else None, dtypes=tuple(DTYPES), ops=tuple(OPS),
                      min_bytes=0, max_bytes=None, ir=ir, outdir=False)]

    def _entry(self, collective: str, root, name: str, make, lo: int, hi: int | None) -> Entry:
        from hccc.compiler.ir.program_ir_json import decode_json
        from hccc.runtime import cache
        from hccc.runtime.launcher import DTYPES, OPS
        # (this module's own source too: its band rule sizes the program's slots)
        key = cache.content_key("torch-catalog", name, self.world, collective, root, hi,
                                cache.files_digest([Path(__file__).resolve()], root=Path(__file__).resolve().parent),
                                cache.compiler_digest())

        def build(tmp: Path) -> None:
            (tmp / f"{name}.json").write_text(build_entry(make, name, hi).to_json())
        path = cache.entry("torch_catalog", key, build, root=self._cache_dir) / f"{name}.json"
        ir = decode_json(path.read_text())
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


def _digest(path) -> str:
    """SHA-256 of a topology file, read through the input checks every reader uses."""
    import hashlib
    from hccc.util.diagnostics import read_input_bytes
    return hashlib.sha256(read_input_bytes(path)).hexdigest()


__all__ = ["BuiltinCatalog", "DEFAULT_CHUNK_BYTES", "WIDEST_ELEMENT", "band_chunk_bytes", "build_entry", "ONE_SHOT_BYTES", "ONE_SHOT_BANDS", "one_shot_bytes", "RD_ALLGATHER_MIN_RANKS", "SMALL_BYTES", "SYNTH_COLLECTIVES", "SYNTH_TIME_LIMIT_S", "plan"]
