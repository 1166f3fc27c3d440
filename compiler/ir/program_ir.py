"""ProgramIR: the lowered program, input of code generation, executors and the simulator.

Three dimensions (ResCCL section 4.5): rank -> thread block (TB) -> pipeline (sub-pipeline index).
The primitives are one columnar table (numpy arrays), sorted by ``(rank, tb, seq)``: a TB runs its
primitives in ``seq`` order, each one for every micro-batch before the next (task-level execution).

Buffers (MSCCL's model, so MSCCL XML fits): per rank an ``input`` buffer of ``in_chunks`` chunks,
an ``output`` buffer of ``out_chunks`` chunks and a ``scratch`` buffer of ``scratch_chunks`` chunks.
A chunk is ``1/nchunks`` of the collective's full buffer (for AllGather the output, for
ReduceScatter, AllReduce, Broadcast and Reduce the input); with ``count`` elements in the full buffer, chunk ``c`` is
elements ``[c*count//nchunks, (c+1)*count//nchunks)`` (uneven counts: sizes differ by at most one).
A buffer with fewer than ``nchunks`` slots (AllGather input, ReduceScatter output) holds only the
rank's own part, so its slot ``i`` is chunk ``rank*k + i`` for ``k`` slots; a scratch slot holds
``ceil(count/nchunks)`` elements, whatever chunk is put there. A primitive moves, for each of its
chunks, the elements of one chunk of the full buffer (its anchor, see
:mod:`hccc.compiler.ir.extents`, which proves that every input/output chunk it names has that size). In-place runs alias the buffers as the collective dictates:
AllGather ``input == output[rank]``, ReduceScatter ``output == input[rank]``, AllReduce,
Broadcast, Reduce and AllToAll ``input == output``; a COPY whose source and destination coincide
is then skipped. AllToAll: ``nchunks = in_chunks = out_chunks = nranks * K``; input slot
``j*K + k`` holds piece ``k`` of the block for rank ``j``, output slot ``i*K + k`` piece ``k`` of
the block from rank ``i``; its full buffer is one rank's buffer, so a block's pieces have equal
sizes on every rank exactly when ``count`` is a multiple of ``nranks`` (runners round down to one,
as nccl-tests does). Broadcast and Reduce have a ``root``: Broadcast reads only the root's input, Reduce writes
only the root's output (other ranks' partial results live in scratch).

Primitive semantics for one micro-batch slice (``x (+) y`` is the reduction op)::

    SEND                   send(src)                        to send_peer
    RECV                   dst := recv()                    from recv_peer
    RECV_REDUCE_COPY       dst := recv() (+) src
    RECV_COPY_SEND         v := recv(); dst := v; send(v)
    RECV_REDUCE_SEND       send(recv() (+) src)             (nothing stored)
    RECV_REDUCE_COPY_SEND  v := recv() (+) src; dst := v; send(v)
    COPY                   dst := src                       (local)
    REDUCE                 dst := dst (+) src               (local)
    NOP                    nothing; carries dependencies

Connections: the ``k``-th send on connection ``(sender, receiver, channel)`` is received by the
``k``-th receive on it (FIFO order). Every connection end belongs to exactly one TB.
``deps`` are cross-TB dependencies on the same rank: primitive ``dep_prim`` may run micro-batch
``m`` only after primitive ``dep_on`` finished micro-batch ``m``.

Channels (``nchannels = K``, header field since schema ``hccc.program/2``): every TB of every rank
runs as K blocks (replicas). Replica ``c`` moves only its part of every micro-batch slice, elements
``[lo_c, hi_c)`` of the slice window (:func:`channel_part`), over connections, FIFOs and progress
counters of its own; a cross-TB dependency waits for the same replica of the producer (an
element keeps its offset in its chunk through every primitive, so replica c reads only what replica
c wrote). The
``channel`` column above is something else: it names logical connections of the algorithm.
A schema ``hccc.program/1`` file (before channels) is refused with a message saying how to
regenerate it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from hccc.compiler.frontend.algorithm import MAX_CHANNELS  # re-exported: most blocks per TB (``nchannels``)
from hccc.compiler.frontend.collectives import NAMES, SPECS
from hccc.compiler.ir.sort_order import lexsort
from hccc.compiler.frontend.slice_policy import DEFAULT_MICRO_BATCHES, DEFAULT_MIN_SLICE_BYTES, SlicePolicy

SCHEMA = "hccc.program/2"
#: schemas of earlier versions, refused on load with a hint (what changed since)
OLD_SCHEMAS = {"hccc.program/1": "schema /2 added the header field 'nchannels' (blocks per connection)"}

#: What a ProgramIR name must look like: the only user text that reaches generated code and paths.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class Op(IntEnum):
    SEND = 0
    RECV = 1
    RECV_REDUCE_COPY = 2
    RECV_COPY_SEND = 3
    RECV_REDUCE_SEND = 4
    RECV_REDUCE_COPY_SEND = 5
    COPY = 6
    REDUCE = 7
    NOP = 8

    # what each op does, as sets of op codes (looked up by value: the properties are called per
    # primitive when an MSCCL XML is read or written)
    @property
    def sends(self) -> bool:
        return self._value_ in _SENDS

    @property
    def receives(self) -> bool:
        return self._value_ in _RECEIVES

    @property
    def reads_src(self) -> bool:
        return self._value_ in _READS_SRC

    @property
    def writes_dst(self) -> bool:
        return self._value_ in _WRITES_DST

    @property
    def reduces(self) -> bool:
        return self._value_ in _REDUCES


_SENDS = frozenset({Op.SEND, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND})
_RECEIVES = frozenset({Op.RECV, Op.RECV_REDUCE_COPY, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND,
                       Op.RECV_REDUCE_COPY_SEND})
_READS_SRC = frozenset({Op.SEND, Op.RECV_REDUCE_COPY, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND,
                        Op.COPY, Op.REDUCE})
_WRITES_DST = frozenset({Op.RECV, Op.RECV_REDUCE_COPY, Op.RECV_COPY_SEND, Op.RECV_REDUCE_COPY_SEND,
                         Op.COPY, Op.REDUCE})
_REDUCES = frozenset({Op.RECV_REDUCE_COPY, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND, Op.REDUCE})
_SENDS, _RECEIVES, _READS_SRC, _WRITES_DST, _REDUCES = (
    frozenset(int(o) for o in ops) for ops in (_SENDS, _RECEIVES, _READS_SRC, _WRITES_DST, _REDUCES))


class Buf(IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2
    SCRATCH = 3


_COMM_OPS = np.array([Op(o).sends or Op(o).receives for o in range(len(Op))])

#: Column name -> dtype of the primitive table, in serialisation order.
PRIM_COLUMNS: dict[str, type] = {
    "rank": np.int32,        # rank that executes the primitive
    "tb": np.int32,          # thread block within the rank (0..ntbs-1)
    "seq": np.int32,         # position within the TB
    "pipeline": np.int32,    # sub-pipeline index (ResCCL's pipeline dimension)
    "op": np.int8,           # Op
    "send_peer": np.int32,   # -1 when the primitive does not send
    "recv_peer": np.int32,   # -1 when the primitive does not receive
    "channel": np.int32,     # distinguishes several connections between one pair of ranks
    "src_buf": np.int8,      # Buf
    "src_off": np.int32,     # chunk offset in src_buf
    "dst_buf": np.int8,
    "dst_off": np.int32,
    "count": np.int32,       # number of consecutive chunks
    "task": np.int64,        # originating transfer (row of the Algorithm), -1 if none
    "task2": np.int64,       # second transfer of a fused primitive (the forwarded send), else -1
}


#: the collectives a ProgramIR can implement (``Collective`` values)
COLLECTIVES = NAMES
#: those with a root rank
ROOTED = tuple(name for name, spec in SPECS.items() if spec.rooted)
#: those with a rank parameter, and its name in the JSON document: "root", or SendRecv's "shift"
PARAMETERS = {name: spec.parameter for name, spec in SPECS.items() if spec.parameter}


@dataclass(frozen=True)
class Origin:
    """What the reader of an imported program (an MSCCL XML, an MSCCL++ plan) found and proved; a
    program hccc lowered records none of it (every field None: not recorded)."""

    source: str | None = None         #: the format read: "msccl-xml", "mscclpp-plan"
    execution: str | None = None      #: the order proven: "task" (hccc's kernels) or "algorithm" (MSCCL's only)
    gpus_per_node: int | None = None  #: ranks per node the program was written for
    inplace: bool | None = None       #: proven in place (None: both placements)
    outofplace: bool | None = None    #: proven out of place (None: both placements)
    note: str | None = None           #: where the import's proof stops (e.g. the message sizes it covers)
    proto: str | None = None          #: the runtime protocol it was written for ("Simple", "LL", "LL128")
    min_bytes: int | None = None      #: the message sizes it serves (full-buffer bytes; max 0: no bound)
    max_bytes: int | None = None


@dataclass(frozen=True)
class Allocation:
    """How the program's thread blocks were allocated and fused, and what the cost model kept (None:
    not recorded, e.g. a hand-written program)."""

    tb_alloc: str | None = None             #: the allocation asked for: "state" or "connection"
    tbs_state_based: int | None = None      #: TBs (all ranks) of the allocation kept
    tbs_connection_based: int | None = None  #: TBs (all ranks) with one per connection end
    tbs_per_rank_max: int | None = None
    fused: int | None = None                #: fused primitives
    fusion: bool | None = None              #: fusion on after the deadlock back-off
    phase_order_moved: int | None = None    #: primitives the step order moved in their TB
    tb_alloc_kept: str | None = None        #: the allocation the cost model kept (None: not compared)
    #: ranks whose thread-block sharing ran past its search budget, later units unshared there
    #: (:data:`hccc.compiler.passes.tb_alloc.SHARE_SEARCH_PER_PRIM`; None: none)
    tbs_search_cut: int | None = None


#: the typed fields' entries in the JSON form's (and the manifest's) ``stats``: field -> (key, type)
RECORD_KEYS: dict[type, dict[str, tuple[str, type]]] = {
    Origin: {"source": ("source", str), "execution": ("execution", str), "gpus_per_node": ("gpus_per_node", int),
             "inplace": ("msccl_inplace", bool), "outofplace": ("msccl_outofplace", bool), "note": ("note", str),
             "proto": ("proto", str), "min_bytes": ("minBytes", int), "max_bytes": ("maxBytes", int)},
    Allocation: {f: (f, t) for f, t in (("tb_alloc", str), ("tbs_state_based", int), ("tbs_connection_based", int),
                                          ("tbs_per_rank_max", int), ("fused", int), ("fusion", bool),
                                          ("phase_order_moved", int), ("tb_alloc_kept", str),
                                          ("tbs_search_cut", int))},
}
#: the values a typed string entry may take (others: any)
RECORD_CHOICES = {"execution": ("task", "algorithm"), "tb_alloc": ("state", "connection"),
                  "tb_alloc_kept": ("state", "connection")}


_KIND_WORDS = {str: "a string", int: "an integer", bool: "true or false"}


def record_entries(*records) -> dict:
    """The ``stats`` entries of typed records (:data:`RECORD_KEYS`; None fields left out)."""
    out: dict = {}
    for rec in records:
        for f, (key, _) in RECORD_KEYS[type(rec)].items():
            v = getattr(rec, f)
            if v is not None:
                out[key] = v
    return out


def split_stats(stats: dict) -> tuple[dict, Origin, Allocation]:
    """A ``stats`` object read back (a ProgramIR file, a manifest) as the statistics proper and the
    typed records; an entry of the wrong type is a :class:`ValueError` naming it."""
    rest = dict(stats)
    made = []
    for cls, keys in RECORD_KEYS.items():
        values = {}
        for f, (key, typ) in keys.items():
            v = rest.pop(key, None)
            if v is None:
                continue
            ok = isinstance(v, bool) if typ is bool else (isinstance(v, typ) and not isinstance(v, bool))
            if not ok:
                raise ValueError(f"'stats' entry '{key}' must be {_KIND_WORDS[typ]}, not {v!r:.40}")
            if key in RECORD_CHOICES and v not in RECORD_CHOICES[key]:
                raise ValueError(f"'stats' entry '{key}' must be one of {', '.join(RECORD_CHOICES[key])}, not {v!r:.40}")
            values[f] = v
        made.append(cls(**values))
    return rest, made[0], made[1]


@dataclass
class ProgramIR:
    name: str                  # sanitised identifier ([A-Za-z_][A-Za-z0-9_]*)
    collective: str            # one of COLLECTIVES
    nranks: int
    nchunks: int               # chunks in the collective's full buffer
    in_chunks: int
    out_chunks: int
    scratch_chunks: int
    prims: dict[str, np.ndarray]
    dep_prim: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dep_on: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nwarps: int = 16           # threads per TB = nwarps * warp size
    chunk_bytes: int = 1 << 20  # micro-batch slice size (FIFO slot) in bytes
    npipelines: int = 0        # number of sub-pipelines
    ntbs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # TBs per rank
    stats: dict = field(default_factory=dict)   # statistics only (counts, the cost model's times): nothing reads them to decide
    root: int = 0              # the collective's rank parameter: a root, SendRecv's shift (0 for the others)
    nchannels: int = 1         # blocks (replicas) per TB: each moves its part of every slice
    micro_batches: int = DEFAULT_MICRO_BATCHES      # the slice policy (compiler/frontend/slice_policy.py):
    min_slice_bytes: int = DEFAULT_MIN_SLICE_BYTES  # least micro-batches per chunk, least slice
    origin: Origin = field(default_factory=Origin)            # what an import found (none for hccc's own)
    allocation: Allocation = field(default_factory=Allocation)  # the TB allocation and fusion, and what was kept

    def record(self) -> dict:
        """``stats`` as the JSON form and the manifest write it: the statistics and the typed
        records' entries (:data:`RECORD_KEYS`)."""
        return {**self.stats, **record_entries(self.origin, self.allocation)}

    @property
    def slice_policy(self) -> SlicePolicy:
        return SlicePolicy(int(self.micro_batches), int(self.min_slice_bytes))

    @property
    def rooted(self) -> bool:
        return self.collective in ROOTED

    @property
    def placements(self) -> tuple[bool, ...]:
        """The buffer placements the program is proven for: ``False`` out of place, ``True`` in
        place. hccc's own programs serve both (the lowering maps one program onto either); an
        imported MSCCL XML serves the ones its ``inplace``/``outofplace`` attributes declare (an
        in-place-only algorithm is normalised with an input-to-output copy, so it serves both)."""
        o = self.origin
        return tuple(p for p, ok in ((False, o.outofplace), (True, o.inplace)) if ok is None or ok)

    @property
    def algorithm_level(self) -> bool:
        """Proven only under MSCCL's algorithm-level order (an imported MSCCL XML whose thread
        blocks must run their whole step list per micro-batch). hccc's kernels run task-level, so
        such a program runs correctly only with one micro-batch per chunk, where the orders agree."""
        return self.origin.execution == "algorithm"

    # ------------------------------------------------------------------ basic views
    @property
    def nprims(self) -> int:
        return len(self.prims["rank"])

    @property
    def max_step_chunks(self) -> int:
        """The most chunks one sending or receiving primitive moves (at least 1): a FIFO slot
        carries one micro-batch of one such primitive, so each chunk's slice gets
        ``chunk_bytes / max_step_chunks`` bytes of it (see ``hccc.compiler.passes.slicing``)."""
        op = self.prims["op"].astype(np.int64)
        if not len(op) or op.min() < 0 or op.max() >= len(Op):
            return 1
        comm = _COMM_OPS[op]
        return max(1, int(self.prims["count"][comm].max())) if comm.any() else 1

    def tb_slices(self) -> dict[tuple[int, int], slice]:
        """(rank, tb) -> slice of the primitive table (requires the canonical sort)."""
        r, t = self.prims["rank"], self.prims["tb"]
        if not len(r):
            return {}
        key = r.astype(np.int64) * (1 << 20) + t
        starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
        ends = np.r_[starts[1:], len(key)]
        return {(int(r[s]), int(t[s])): slice(int(s), int(e)) for s, e in zip(starts, ends)}

    def prim(self, i: int) -> dict:
        """Primitive ``i`` as a plain dict (debugging, small programs)."""
        return {k: int(v[i]) for k, v in self.prims.items()}

    def sort_canonical(self) -> None:
        """Sort primitives by (rank, tb, seq) and remap ``deps`` accordingly."""
        order = lexsort((self.prims["seq"], self.prims["tb"], self.prims["rank"]))
        if np.array_equal(order, np.arange(len(order))):
            return
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        self.prims = {k: v[order] for k, v in self.prims.items()}
        self.dep_prim = inv[self.dep_prim]
        self.dep_on = inv[self.dep_on]

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> str:
        """Deterministic, versioned, columnar JSON."""
        return "".join(p if isinstance(p, str) else str(p, "ascii") for p in self.to_json_pieces())

    def to_json_pieces(self) -> list:
        """:meth:`to_json`'s text as pieces (text, and the ASCII bytes of the long integer columns,
        uncopied) that a writer concatenates."""
        head = {
            "schema": SCHEMA,
            "name": self.name,
            "collective": self.collective,
            "nranks": int(self.nranks),
            "nchunks": int(self.nchunks),
            "buffers": {"input": int(self.in_chunks), "output": int(self.out_chunks),
                        "scratch": int(self.scratch_chunks)},
            "nwarps": int(self.nwarps),
            "chunk_bytes": int(self.chunk_bytes),
            "npipelines": int(self.npipelines),
            "nchannels": int(self.nchannels),
            "tbs_per_rank": [int(x) for x in self.ntbs],
            "ops": [o.name.lower() for o in Op],
            "buffer_names": [b.name.lower() for b in Buf],
            "stats": self.record(),
        }
        if self.collective in PARAMETERS:
            head[PARAMETERS[self.collective]] = int(self.root)
        if not self.slice_policy.is_default:      # absent: hccc's default (older manifests too)
            head["slicing"] = self.slice_policy.as_dict()
        from hccc.compiler.ir.int_text import join_ints_view
        parts: list = [json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "prims": {']
        for i, k in enumerate(PRIM_COLUMNS):
            parts += [("," if i else "") + f'\n  "{k}": [', join_ints_view(self.prims[k]), "]"]
        parts += ['\n },\n "deps": {\n  "prim": [', join_ints_view(self.dep_prim), '],\n  "on": [',
                  join_ints_view(self.dep_on), "]\n }\n}\n"]
        return parts


def int_list_text(a: np.ndarray) -> str:
    """``",".join(map(str, a))`` for an integer column, without a Python object per value
    (:func:`hccc.compiler.ir.int_text.join_ints`: compiled for long columns)."""
    from hccc.compiler.ir.int_text import join_ints
    return join_ints(np.asarray(a), ",")


#: value ranges a ProgramIR file must respect (checked on load, before anything is allocated)
MAX_RANKS = 1 << 16
MAX_CHUNKS = 1 << 24
MAX_WARPS = 1 << 62   # as .rccl nWarps; threads per TB are capped at 1024 when emitted
MAX_TBS_PER_RANK = 1 << 20
MAX_PRIMS = 1 << 26
CHUNK_ALIGN = 16
MAX_CHUNK_BYTES = 1 << 30


class IRFormatError(Exception):
    """A ProgramIR file that cannot be used, with a message for the user."""

    def __init__(self, message: str, line: int = 1, col: int = 1):
        super().__init__(message)
        self.line = line
        self.col = col


def channel_part(slice_elems: int, granule: int, nchannels: int, c: int) -> tuple[int, int]:
    """Replica ``c``'s part ``[lo, hi)`` of a micro-batch slice window of ``slice_elems`` elements
    (hccc_prims.h ``hccc_ctx_init`` computes the same): the window is cut into K contiguous parts
    at multiples of ``granule`` elements (16 bytes), as evenly as the granules allow. It depends
    only on the launch's slice, so every primitive of a launch (both ends of a connection, and
    every primitive touching one buffer element) gives an element to the same replica; a slice
    shorter than the window (a chunk's last one) keeps the parts' bounds, clipped to its length."""
    g = max(1, int(granule))
    k = max(1, int(nchannels))
    ng = -(-int(slice_elems) // g)
    lo = min(int(slice_elems), g * ((c * ng) // k))
    hi = min(int(slice_elems), g * (((c + 1) * ng) // k))
    return lo, hi


def empty_prims(n: int = 0) -> dict[str, np.ndarray]:
    return {k: np.zeros(n, dtype=dt) for k, dt in PRIM_COLUMNS.items()}
