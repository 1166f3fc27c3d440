"""What hccc knows about each collective, in one place: :data:`SPECS`, one :class:`CollectiveSpec` each.

Every layer reads a collective from here instead of spelling it out: the verifier and the symbolic
prover take the precondition and postcondition from :meth:`CollectiveSpec.start` and
:meth:`CollectiveSpec.end`, the lowering and the executors the buffer layouts
(:meth:`CollectiveSpec.slot`) and the chunk model's facts (:meth:`~CollectiveSpec.block_of`,
:meth:`~CollectiveSpec.id_at`, :meth:`~CollectiveSpec.count_unit`,
:attr:`~CollectiveSpec.crossed_overlay` ..., asked instead of testing for a collective by name),
the reference executor the semantics, the simulator and the runners the bus-bandwidth factor, the
Communicator its method names, the nccl-tests sweep the ``redop``/``root`` columns, the MSCCL XML
layers the ``coll`` names, and the command line and ``hccc.testing`` the list of collectives. docs/architecture.md ("Adding a collective") says what a
new entry needs besides this module.

Chunk model. A run moves one *full buffer* of ``count`` elements (nccl-tests' ``S``: the output of a
collective whose input is the rank's own part, the input otherwise) split into ``C`` chunks; with
``N`` ranks, rank ``r`` owns chunks ``r*K .. r*K+K-1`` (``K = C / N``). A collective's *chunk ids*
are ``0 .. C-1``; a blockwise collective (AllToAll) has ``N*C`` of them, id ``(i*N + j)*K + k`` being
piece ``k`` of the block rank ``i`` sends to rank ``j``. The precondition says which ranks hold
each id at the start (:data:`EVERY` rank, its :data:`OWNER`, the :data:`ROOT`), each as its own
contribution; the postcondition where each id must be at the end (also :data:`DEST`, a block's
destination) and with which contributions: all ranks' for a reducing collective, the one rank that
held it at the start for the others. Buffers: a rank's input holds the ids it starts with, its
output the ids it must end with, laid out as :data:`OWN` (``K`` slots, id ``r*K + j`` at slot
``j``), :data:`FULL` (``C`` slots, id ``c`` at slot ``c``), :data:`TO` (AllToAll input: slot
``j*K + k`` for the block to rank ``j``) or :data:`FROM` (AllToAll output: slot ``i*K + k`` for the
block from rank ``i``). In-place runs overlay the two buffers: the same layout is one buffer; an
:data:`OWN` buffer lies at chunk ``r*K`` of the :data:`FULL` one.

SendRecv (each rank sends its part to the rank ``shift`` after it and receives the part of the rank
``shift`` before it, MSCCL++'s ``sendrecv``) has one parameter besides the ranks, its ``shift``; it
travels where a rooted collective's ``root`` does (:attr:`CollectiveSpec.parameter` names it), so
every method taking ``root`` takes the shift for SendRecv. Its full buffer is every rank's part in
rank order (``C = N*K`` chunks, as AllGather's output), its input the rank's own part (:data:`OWN`)
and its output the peer's (:data:`FROM_PEER`); nccl-tests' ``S`` for it is one rank's part, so its
bus-bandwidth factor is ``1/N`` of the full buffer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import reduce as _fold
from typing import Callable

import numpy as np

# where a chunk id is (precondition / postcondition)
EVERY = "every rank"
OWNER = "owner"          # rank c // K (blockwise: the block's source)
ROOT = "root"
DEST = "destination"     # blockwise: the block's destination rank
PEER = "peer"            # the rank ``shift`` after the owner (SendRecv: ``(owner + shift) % N``)
# buffer layouts
OWN = "own"
FULL = "full"
TO = "by destination"
FROM = "by source"
FROM_PEER = "peer's part"   # SendRecv output: ``K`` slots, id ``p*K + j`` at slot ``j``, ``p = (r - shift) % N``
#: layouts of ``K`` slots (a rank's part of the full buffer)
PARTS = (OWN, FROM_PEER)
#: ``want`` of :meth:`CollectiveSpec.end` for a chunk that must hold every rank's contribution
ALL = -1


def _ring(n: int) -> float:
    return (n - 1) / n


def _twice_ring(n: int) -> float:
    return 2.0 * (n - 1) / n


def _one(n: int) -> float:
    return 1.0


def _per_rank(n: int) -> float:
    # the full buffer is n parts and nccl-tests' sendrecv counts one: busbw = algbw of one part
    return 1.0 / n


def _int64(x):
    """An int stays an int; anything else becomes an int64 array (no overflow of narrower ids)."""
    return int(x) if isinstance(x, (int, np.integer)) else np.asarray(x, dtype=np.int64)


def _bounds(count: int, nchunks: int) -> np.ndarray:
    return np.arange(nchunks + 1, dtype=np.int64) * count // nchunks


# ---------------------------------------------------------------------------------- semantics
# Each takes (inputs, reduce, nchunks, root) and gives every rank's output, or None where the
# collective leaves a rank's output unspecified; written from the definition, not from the
# chunk model above, so that the reference executor is checked against an independent oracle.
def _allgather(inputs, red, nchunks, root):
    full = np.concatenate([np.asarray(x) for x in inputs])
    return [full.copy() for _ in inputs]


def _reducescatter(inputs, red, nchunks, root):
    total = _fold(red, [np.asarray(x) for x in inputs])
    b, k = _bounds(len(total), nchunks), nchunks // len(inputs)
    return [total[b[r * k]:b[r * k + k]].copy() for r in range(len(inputs))]


def _allreduce(inputs, red, nchunks, root):
    total = _fold(red, [np.asarray(x) for x in inputs])
    return [total.copy() for _ in inputs]


def _broadcast(inputs, red, nchunks, root):
    return [np.array(inputs[root], copy=True) for _ in inputs]


def _reduce(inputs, red, nchunks, root):
    total = _fold(red, [np.asarray(x) for x in inputs])
    return [total.copy() if r == root else None for r in range(len(inputs))]


def _alltoall(inputs, red, nchunks, root):
    # rank i's input is N equal blocks, block j for rank j; rank j's output is block j of every
    # rank, in rank order
    N, count = len(inputs), len(inputs[0])
    if count % N:
        raise ValueError(f"an AllToAll of {count} elements per rank is not {N} equal blocks")
    b = count // N
    return [np.concatenate([np.asarray(x)[j * b:(j + 1) * b] for x in inputs]) for j in range(N)]


def _gather(inputs, red, nchunks, root):
    full = np.concatenate([np.asarray(x) for x in inputs])
    return [full if r == root else None for r in range(len(inputs))]


def _scatter(inputs, red, nchunks, root):
    # the root's input is the ranks' blocks in rank order (nccl-tests' split of the full buffer:
    # chunk boundaries at c * count // nchunks); rank r receives block r, the other inputs are unread
    full = np.asarray(inputs[root])
    b, k = _bounds(len(full), nchunks), nchunks // len(inputs)
    return [full[b[r * k]:b[r * k + k]].copy() for r in range(len(inputs))]


def _sendrecv(inputs, red, nchunks, shift):
    # rank r receives the whole input of rank r - shift (mod N)
    N = len(inputs)
    return [np.array(inputs[(r - int(shift)) % N], copy=True) for r in range(N)]


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective (see the module docstring for the chunk model)."""

    name: str                      # Collective value, ProgramIR.collective, manifests, --collective
    title: str                     # for people: "AllGather"
    start: str                     # EVERY | OWNER | ROOT: who holds each chunk id first
    end: str                       # EVERY | OWNER | ROOT | DEST: who must hold it at the end
    reduces: bool                  # the result combines every rank's contribution (rrc allowed)
    input: str                     # OWN | FULL | TO: the input buffer's layout
    output: str                    # OWN | FULL | FROM: the output buffer's layout
    busbw: Callable[[int], float]  # nccl-tests' bus-bandwidth factor over n > 0 ranks
    method: str                    # Communicator / torch.distributed method name
    semantics: Callable            # (inputs, reduce, nchunks, root) -> outputs (None: unspecified)
    msccl: str | None = None       # MSCCL XML ``coll`` attribute, None when MSCCL XML cannot express it
    msccl_aliases: tuple[str, ...] = ()   # other ``coll`` spellings real tools write
    blockwise: bool = False        # AllToAll: N*C chunk ids (see the module docstring)

    # ------------------------------------------------------------------ names
    @property
    def dsl_name(self) -> str:
        """Spelling in ResCCLang headers (``OpType="Allreduce"``)."""
        return self.name.capitalize()

    @property
    def names(self) -> tuple[str, ...]:
        """Spellings accepted for it (``OpType``, ``--collective``; any case, ``_``/``-`` ignored)."""
        return tuple(dict.fromkeys((self.name, self.method.replace("_", ""))))

    @property
    def rooted(self) -> bool:
        """It has a root rank (Broadcast, Reduce, Gather, Scatter)."""
        return ROOT in (self.start, self.end)

    @property
    def parameter(self) -> str | None:
        """The name of the collective's one rank parameter: ``"root"`` (rooted collectives),
        ``"shift"`` (SendRecv: :data:`PEER`), None for the others. It is carried as ``root``
        in the IR and the methods below."""
        if self.rooted:
            return "root"
        return "shift" if PEER in (self.start, self.end) else None

    def parts_in_full(self, nranks: int) -> int:
        """How many times the buffer nccl-tests measures (:attr:`full_buffer`) fits in hccc's full
        buffer: ``nranks`` for SendRecv (nccl-tests and MSCCL++ size it by one rank's part, hccc by
        every rank's), 1 for the others."""
        layout = self.input if self.full_buffer == "input" else self.output
        return max(1, int(nranks)) if layout in PARTS and self.input in PARTS and self.output in PARTS else 1

    @property
    def full_buffer(self) -> str:
        """``"input"`` or ``"output"``: the buffer nccl-tests' size ``S`` measures."""
        return "output" if self.input == OWN and self.output not in PARTS else "input"

    @property
    def msccl_refusal(self) -> str:
        """Why the MSCCL XML export refuses it ("" when it does not)."""
        if self.msccl:
            return ""
        if self.rooted:
            return f"an MSCCL <algo> has no root attribute, so it cannot express a {self.title}"
        return f"MSCCL XML has no {self.title} collective"

    # ------------------------------------------------------------------ chunk model
    def nids(self, nranks: int, nchunks: int) -> int:
        """Chunk ids for a full buffer of ``nchunks`` chunks."""
        return int(nranks) * int(nchunks) if self.blockwise else int(nchunks)

    @staticmethod
    def chunks(nranks: int, nids: int, blockwise: bool) -> int:
        """The full buffer's chunks for ``nids`` chunk ids (inverse of :meth:`nids`)."""
        return int(nids) // max(1, int(nranks)) if blockwise else int(nids)

    def full_chunks(self, nranks: int, nids: int) -> int:
        """The full buffer's chunks for ``nids`` chunk ids (inverse of :meth:`nids`)."""
        return self.chunks(nranks, nids, self.blockwise)

    def block_of(self, ids, nranks: int, nchunks: int):
        """``(source, destination, piece)`` of chunk ``ids`` (int or array) over a full buffer of
        ``nchunks`` chunks: blockwise, id ``(i*N + j)*K + k`` is piece ``k`` of the block rank ``i``
        sends to rank ``j``; otherwise id ``r*K + k`` is piece ``k`` of rank ``r``'s part, and
        ``source == destination == r``."""
        ids = _int64(ids)
        C = int(nchunks)
        K = max(1, C // int(nranks))
        if self.blockwise:
            return ids // C, (ids // K) % int(nranks), ids % K
        return ids // K, ids // K, ids % K

    def block_id(self, source, destination, piece, nranks: int, nchunks: int):
        """The chunk id of ``(source, destination, piece)`` (inverse of :meth:`block_of`)."""
        K = max(1, int(nchunks) // int(nranks))
        source, destination, piece = _int64(source), _int64(destination), _int64(piece)
        if self.blockwise:
            return (source * int(nranks) + destination) * K + piece
        return source * K + piece

    def count_unit(self, nranks: int) -> int:
        """A run's per-rank element count must be a multiple of this: ``nranks`` for a blockwise
        collective (every rank sends every other the same number of elements; nccl-tests rounds
        its AllToAll sizes down the same way) and for SendRecv (every rank's part is one size, so a
        rank's output is laid out as its input), 1 (any count) otherwise."""
        return max(1, int(nranks)) if self.blockwise or self.output == FROM_PEER else 1

    @property
    def per_pair_counts(self) -> bool:
        """Its programs also run with a count per pair of ranks (an AllToAllv,
        :mod:`hccc.runtime.alltoallv`): each rank's buffers are blocks, one per peer
        (:attr:`blockwise`), whose sizes the kernels can read at run time."""
        return self.blockwise

    def segment_chunks(self, nranks: int, in_chunks: int, out_chunks: int) -> int:
        """Chunks of the smallest unit the two buffers are laid out in: a block of a buffer laid out
        by destination or source (:data:`TO`, :data:`FROM`: ``chunks / nranks``), else the whole
        buffer (a rank's own part is its whole input or output); the lesser of the two."""
        def unit(layout, chunks):
            return int(chunks) // max(1, int(nranks)) if layout in (TO, FROM) else int(chunks)
        return min(unit(self.input, in_chunks), unit(self.output, out_chunks))

    @property
    def split_by_rank(self) -> bool:
        """A buffer is laid out by rank (:data:`OWN`, :data:`TO`, :data:`FROM`), so the full
        buffer's chunks must be a multiple of the ranks."""
        return any(layout in (OWN, TO, FROM) for layout in (self.input, self.output))

    def place(self, where: str, ids: np.ndarray, nranks: int, nchunks: int, root: int = 0):
        """``(rank, id)`` arrays: the ranks ``where`` names for each of ``ids``, rank-major."""
        ids = np.asarray(ids, dtype=np.int64)
        N, C = int(nranks), int(nchunks)
        if where == EVERY:
            return np.repeat(np.arange(N, dtype=np.int64), len(ids)), np.tile(ids, N)
        if where == ROOT:
            return np.full(len(ids), int(root), np.int64), ids
        if where == OWNER:
            rank = self.block_of(ids, N, C)[0]
        elif where == PEER:
            rank = (self.block_of(ids, N, C)[0] + int(root)) % N
        elif where == DEST:
            rank = self.block_of(ids, N, C)[1]
        else:
            raise ValueError(f"unknown placement {where!r}")
        if len(rank) > 1 and (rank[1:] < rank[:-1]).any():   # ids ascend: keep their order per rank
            o = np.argsort(rank, kind="stable")
            rank, ids = rank[o], ids[o]
        return rank, ids

    def holdings(self, where: str, nranks: int, nchunks: int) -> int:
        """How many ``(rank, id)`` pairs :meth:`place` gives for ``where`` over a full buffer of
        ``nchunks`` chunks, counted without making them."""
        ids = self.nids(nranks, nchunks)
        return int(nranks) * ids if where == EVERY else ids

    def start_holders(self, nranks: int, nchunks: int, root: int = 0):
        """The precondition: ``(rank, id, contributor)`` arrays, every holding its holder's own
        contribution, sorted by ``(rank, id)``."""
        ids = np.arange(self.nids(nranks, nchunks), dtype=np.int64)
        r, c = self.place(self.start, ids, nranks, nchunks, root)
        return r, c, r

    def origin(self, ids, nranks: int, nchunks: int, root: int = 0) -> np.ndarray:
        """For a copy-only collective (one start holder per id): the rank each id comes from."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.start == ROOT:
            return np.full(len(ids), int(root), np.int64)
        if self.start != OWNER:
            raise ValueError(f"{self.title}: every rank holds every chunk at the start")
        return self.block_of(ids, nranks, nchunks)[0]

    def end_holders(self, nranks: int, nchunks: int, root: int = 0):
        """The postcondition: ``(rank, id, want)`` arrays sorted by ``(rank, id)``; ``want`` is
        :data:`ALL` (every rank's contribution) or the one rank whose contribution it holds."""
        ids = np.arange(self.nids(nranks, nchunks), dtype=np.int64)
        r, c = self.place(self.end, ids, nranks, nchunks, root)
        want = np.full(len(c), ALL, np.int64) if self.reduces else self.origin(c, nranks, nchunks, root)
        return r, c, want

    # ------------------------------------------------------------------ buffers
    def slots(self, buffer: str, nranks: int, nchunks: int) -> int:
        """Chunk slots of a rank's ``"input"`` or ``"output"`` buffer."""
        layout = self.input if buffer == "input" else self.output
        return max(1, int(nchunks) // int(nranks)) if layout in PARTS else int(nchunks)

    def slot(self, buffer: str, rank, ids, nranks: int, nchunks: int):
        """Slot of chunk ``ids`` (int or array) in ``rank``'s ``"input"`` or ``"output"`` buffer
        (meaningful where the rank holds that id at the start, or must at the end)."""
        layout = self.input if buffer == "input" else self.output
        C = int(nchunks)
        K = max(1, C // int(nranks))
        if layout == OWN:
            return ids - rank * K
        if layout == FROM_PEER:
            return ids % K
        if layout == FULL:
            return ids if not self.blockwise else ids % C
        src, dst, piece = self.block_of(ids, nranks, C)
        if layout == TO:
            return dst * K + piece
        return src * K + piece   # FROM

    def id_at(self, buffer: str, rank, slot, nranks: int, nchunks: int, root: int = 0):
        """The chunk id that ``slot`` (int or array) of ``rank``'s ``"input"`` or ``"output"``
        buffer holds (inverse of :meth:`slot`; ``root``: SendRecv's shift)."""
        layout = self.input if buffer == "input" else self.output
        C = int(nchunks)
        K = max(1, C // int(nranks))
        rank, slot = _int64(rank), _int64(slot)
        if layout == OWN:
            return rank * K + slot
        if layout == FROM_PEER:
            return ((rank - int(root)) % int(nranks)) * K + slot
        if layout == FULL:
            return slot
        if layout == TO:
            return self.block_id(rank, slot // K, slot % K, nranks, C)
        return self.block_id(slot // K, rank, slot % K, nranks, C)   # FROM

    @property
    def crossed_overlay(self) -> bool:
        """In place, a rank's output slot of a chunk id is its input slot of a *different* id (the
        two buffers are one but laid out differently: AllToAll's block from rank ``i`` lands where
        its block to rank ``i`` was), so an arrival must wait for the departure it overwrites."""
        return self.alias == "same" and self.input != self.output

    def holds(self, where: str, rank, ids, nranks: int, nchunks: int, root: int = 0):
        """Boolean (array): ``rank`` is among the ranks ``where`` names for chunk ``ids``."""
        rank = np.asarray(rank, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        if where == EVERY:
            return np.ones(np.broadcast(rank, ids).shape, bool)
        if where == ROOT:
            return rank == int(root)
        src, dst, _ = self.block_of(ids, nranks, nchunks)
        if where == PEER:
            return (src + int(root)) % int(nranks) == rank
        return (src if where == OWNER else dst) == rank    # DEST: the block's destination

    @property
    def scratch(self) -> bool:
        """Writes of chunks a rank does not keep go to scratch (the postcondition leaves out some
        (rank, id) pairs, and they must not land in the output); a crossed overlay's lowering
        (AllToAll, SendRecv) sizes its own scratch."""
        return self.end != EVERY and not self.crossed_overlay

    def buffer_sizes(self, nranks: int, chunks_per_rank: int = 1) -> tuple[int, int, int]:
        """``(in_chunks, out_chunks, scratch_chunks)`` of a lowered program (AllToAll's and SendRecv's scratch is
        sized by its lowering)."""
        C = int(nranks) * int(chunks_per_rank)
        return (self.slots("input", nranks, C), self.slots("output", nranks, C),
                C if self.scratch else 0)

    @property
    def alias(self) -> str:
        """In-place overlay: ``"same"`` (input is output), ``"input in output"`` (the input is the
        rank's part of the output) or ``"output in input"``."""
        if self.input in PARTS and self.output not in PARTS:
            return "input in output"
        if self.output in PARTS and self.input not in PARTS:
            return "output in input"
        return "same"


SPECS: dict[str, CollectiveSpec] = {s.name: s for s in (
    CollectiveSpec("allgather", "AllGather", start=OWNER, end=EVERY, reduces=False,
                   input=OWN, output=FULL, busbw=_ring, method="all_gather",
                   semantics=_allgather, msccl="allgather"),
    CollectiveSpec("reducescatter", "ReduceScatter", start=EVERY, end=OWNER, reduces=True,
                   input=FULL, output=OWN, busbw=_ring, method="reduce_scatter",
                   semantics=_reducescatter, msccl="reducescatter",
                   msccl_aliases=("reduce_scatter",)),
    CollectiveSpec("allreduce", "AllReduce", start=EVERY, end=EVERY, reduces=True,
                   input=FULL, output=FULL, busbw=_twice_ring, method="all_reduce",
                   semantics=_allreduce, msccl="allreduce"),
    CollectiveSpec("broadcast", "Broadcast", start=ROOT, end=EVERY, reduces=False,
                   input=FULL, output=FULL, busbw=_one, method="broadcast",
                   semantics=_broadcast),
    CollectiveSpec("reduce", "Reduce", start=EVERY, end=ROOT, reduces=True,
                   input=FULL, output=FULL, busbw=_one, method="reduce", semantics=_reduce),
    CollectiveSpec("alltoall", "AllToAll", start=OWNER, end=DEST, reduces=False,
                   input=TO, output=FROM, busbw=_ring, method="all_to_all",
                   semantics=_alltoall, msccl="alltoall", blockwise=True),
    CollectiveSpec("gather", "Gather", start=OWNER, end=ROOT, reduces=False,
                   input=OWN, output=FULL, busbw=_ring, method="gather", semantics=_gather),
    CollectiveSpec("scatter", "Scatter", start=ROOT, end=OWNER, reduces=False,
                   input=FULL, output=OWN, busbw=_ring, method="scatter", semantics=_scatter),
    CollectiveSpec("sendrecv", "SendRecv", start=OWNER, end=PEER, reduces=False,
                   input=OWN, output=FROM_PEER, busbw=_per_rank, method="send_recv",
                   semantics=_sendrecv),
)}


class Collective(str, Enum):
    """The collectives, one member per :data:`SPECS` entry (``Collective.ALLGATHER`` ...); a
    member's properties come from its spec."""

    _ignore_ = ["_s"]
    for _s in SPECS:
        vars()[_s.upper()] = _s

    @property
    def spec(self) -> CollectiveSpec:
        return SPECS[self.value]

    @property
    def rooted(self) -> bool:
        """It has a root rank; the others treat every rank alike."""
        return self.spec.rooted

    @property
    def reduces(self) -> bool:
        """Its chunks combine contributions (``rrc`` transfers)."""
        return self.spec.reduces

    @property
    def dsl_name(self) -> str:
        """Spelling used in ResCCLang headers (``OpType="Allreduce"``)."""
        return self.spec.dsl_name

    @property
    def blockwise(self) -> bool:
        """AllToAll: every (source, destination) pair has its own block, so chunk ids run over
        ``nranks * nranks * K``."""
        return self.spec.blockwise

    @classmethod
    def parse(cls, text: str) -> "Collective | None":
        """Case-insensitive lookup of any of a spec's :attr:`~CollectiveSpec.names`; ``None``
        when ``text`` names no supported collective."""
        t = str(text).strip().lower().replace("_", "").replace("-", "")
        for s in SPECS.values():
            if t in s.names:
                return cls(s.name)
        return None


def spec_of(collective) -> CollectiveSpec:
    """The spec of a :class:`Collective`, or of a name any :meth:`Collective.parse` accepts;
    ``ValueError`` for an unknown one."""
    c = collective if isinstance(collective, Collective) else Collective.parse(
        str(getattr(collective, "value", collective)))
    if c is None:
        raise ValueError(f"unknown collective {collective!r}")
    return SPECS[c.value]


#: every collective name, in spec order
NAMES: tuple[str, ...] = tuple(SPECS)
#: the OpType spellings, for messages: "Allgather, Reducescatter, ..."
DSL_NAMES: tuple[str, ...] = tuple(s.dsl_name for s in SPECS.values())


def one_of(names, last: str = "or") -> str:
    """``"a, b or c"`` (``last="and"``: ``"a, b and c"``)."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {last} " + names[-1]


__all__ = ["CollectiveSpec", "Collective", "SPECS", "NAMES", "DSL_NAMES", "spec_of", "one_of",
           "EVERY", "OWNER", "ROOT", "DEST", "PEER", "OWN", "FULL", "TO", "FROM", "FROM_PEER", "PARTS", "ALL"]
