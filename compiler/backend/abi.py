"""The kernel ABI: every fact the emitted kernels and the host code that launches them must agree on.

This module is the one source of those facts. The templates render them (``hccc_prims.h``: the
version, the argument / connection / error-record structs, the primitive descriptor and the
macros that fill it; the launch arguments of the table mode and the one-grid entries,
:data:`LAUNCH_STRUCTS`, declared in ``hccc_prims.h`` / ``hccc_table.h`` and checked against these
records; ``hccc_host.h``: the control-block layout), code generation writes the
primitive calls in the macros' argument order (:func:`pd_call_fields`), and the runtime
(:mod:`hccc.runtime.kernel_abi`, :class:`hccc.runtime.rank_memory.RankPlan`) packs arguments and lays
out memory from the same tables. ``tests/test_kernel_abi_source.py`` compiles the rendered headers
against these tables, so a header or a host structure edited by hand fails.

What lives where (memory a rank owns, kernel protocol v3):

* **control block** (:data:`CTRL_REGIONS`, 64-bit words, in this order): the ``tail`` of each
  receive connection (the sender publishes messages there), the ``head`` of each send connection
  (the receiver frees slots there: each end polls its own memory), the ``head`` of each receive
  connection nobody sends on, then the progress counters (at least one word);
* **slot block**: receive connection ``j``'s FIFO (``NSLOTS`` slots of ``slot_bytes``) at ``j *
  NSLOTS * slot_bytes``; a slot holds one message: ``max_cnt`` regions, each a
  :data:`REGION_HEADER` -byte header (reserved) and its share of
  the chunk plus alignment room (:data:`SLOT_OVERHEAD` bytes per region in all);
* **orphan FIFO** (sends nobody receives, in the sender's own memory): an :data:`ORPHAN_HEADER`
  -byte header holding its ``tail`` in the first word, then the slots.

Changing any of these facts changes :data:`VERSION`; the manifest records it and loading an OUTDIR
written for another version is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from hccc.compiler.backend.prim_fields import PD_FIELDS
from hccc.compiler.ir.program_ir import Buf, Op

#: ``HCCC_ABI_VERSION`` and the manifest's ``abi_version``
VERSION = 10

#: FIFO slots per connection (``HCCC_NSLOTS``)
NSLOTS = 8
#: bytes of a slot region's header (reserved: the data's 0..15 byte offset is computed by both ends of a
#: message from its anchor chunk, ``hccc_region_offset``, so nothing reads or writes it)
REGION_HEADER = 16
#: bytes each region of a slot adds to its share: the header and 16 bytes of alignment room
SLOT_OVERHEAD = REGION_HEADER + 16
#: bytes of an orphan FIFO's header (its tail counter in the first 64-bit word)
ORPHAN_HEADER = 16
#: bytes of one control-block word
CTRL_WORD = 8

# ---------------------------------------------------------------------------- FIFO protocols
#: ``hccc_args::proto`` values (``HCCC_PROTO_*``): Simple (data in the slot, the sender publishes
#: ``tail`` with a release store, the receiver waits for it and acquires) and LL (low latency:
#: every 16-byte line of a region holds 8 bytes of data in two 8-byte words, each 4 data bytes
#: and the 4-byte flag, stored together by one 16-byte store: NCCL's LL layout)
PROTOS: tuple[tuple[str, int], ...] = (("SIMPLE", 0), ("LL", 1))
#: bytes of an LL line: two 8-byte words, each a data word (low 4 bytes) and the flag (high 4 bytes)
LL_LINE = 16
#: data bytes an LL line carries (bytes [8j, 8j + 8) of a region's part in line j)
LL_DATA = 8
#: the flag of every line of the k-th message on a connection (k = 0, 1, ...) in a launch of LL
#: epoch ``e`` (``hccc_args::ll_epoch``): :func:`ll_flag`, ``k + LL_FLAG_BASE + (e << LL_EPOCH_SHIFT)``
#: modulo 2**32, so a slot's lines left from message ``k - NSLOTS`` (or zeroed memory) never match
LL_FLAG_BASE = 1
#: the launch epoch sits above this bit of the flag: a launch's flags are ``e * 2**LL_EPOCH_SHIFT +
#: [1, 2**LL_EPOCH_SHIFT)`` while it posts at most :data:`LL_EPOCH_MESSAGES` messages on a connection,
#: so the flag ranges of epochs 0 .. LL_EPOCHS - 1 are disjoint and none holds 0 (zeroed memory)
LL_EPOCH_SHIFT = 20
#: epochs between two zeroings of the FIFOs (``e`` runs 0 .. LL_EPOCHS - 1; the launch after the last
#: zeroes the slots and starts again at 0): ``(LL_EPOCHS - 1) << LL_EPOCH_SHIFT`` plus the largest
#: message flag is ``2**32 - 1``, no flag wraps
LL_EPOCHS = 1 << (32 - LL_EPOCH_SHIFT)
#: messages one LL launch may post on a connection and still share the FIFOs with other epochs; a
#: launch that may post more (:func:`hccc.runtime.ll_epoch.ll_messages_bound`) zeroes the slots before
#: it and makes the next LL launch zero them too
LL_EPOCH_MESSAGES = (1 << LL_EPOCH_SHIFT) - LL_FLAG_BASE
#: when an LL launch zeroes the FIFO slots first and starts the epochs again at 0: when any of these
#: holds (name, meaning, the C expression ``hccc_host_reset`` tests). The one statement of the rule:
#: :class:`hccc.runtime.ll_epoch.LLEpochs` evaluates it through :func:`ll_zero`, and ``hccc_host.h``
#: is rendered with :func:`ll_zero_c`
LL_ZERO_WHEN: tuple[tuple[str, str, str], ...] = (
    ("dirty", "the slots may hold something other than LL lines of the epochs since the last zeroing "
              "(set-up, a Simple launch, a launch past LL_EPOCH_MESSAGES)", "c->ll_dirty"),
    ("wide", "this launch may post more than LL_EPOCH_MESSAGES messages on a connection", "wide"),
    ("wrapped", "every epoch since the last zeroing is taken", "c->ll_next >= HCCC_HOST_LL_EPOCHS"),
)
#: ``--proto auto`` runs LL up to this many bytes of the collective's full buffer, Simple above: the
#: kernel cost model's crossover (:func:`hccc.runtime.kernel_time.ll_ahead_up_to`: the largest
#: power of two up to which LL is ahead for the ring AllReduce and AllGather of 8 ranks, one rank a
#: GPU, the launchers' slices, at the fifth GPU run's units, ``kernel_cost.V4_H200``). LL's unit
#: costs a COPY unit's 2.07 us against Simple's 2.47-2.65 and waits for no flag word, but its
#: lines carry half their bytes: at 256 KiB the AllReduce takes 94.2 us under LL against 96.0,
#: at 512 KiB 119.6 against 107.9 (AllGather 51.5 against 52.8, 62.4 against 58.2).
#: tests/test_kernel_cost.py recomputes it and fails if the model moves it
LL_AUTO_MAX_BYTES = 256 * 1024


def ll_share_bytes(share: int) -> int:
    """Data bytes one chunk's region carries under LL, given its Simple share (``HCCC_SHARE_BYTES``):
    half of it, rounded down to 16 bytes; 0 when that half is under 16 bytes (the launch then keeps
    Simple: a slice is a multiple of 16 bytes, ``slicing.SLICE_ALIGN``, so a region carrying less
    holds no slice)."""
    half = int(share) // 2
    return half // 16 * 16 if half >= 16 else 0


def ll_flag(k: int, epoch: int) -> int:
    """The flag of every line of message ``k`` on a connection in a launch of LL epoch ``epoch``."""
    return (int(k) + LL_FLAG_BASE + (int(epoch) << LL_EPOCH_SHIFT)) % (1 << 32)


def ll_zero(**terms: bool) -> bool:
    """Whether an LL launch zeroes the slots first, given every term of :data:`LL_ZERO_WHEN` by
    name (KeyError when a term is missing or unknown: a caller cannot drift from the rule)."""
    names = [n for n, _, _ in LL_ZERO_WHEN]
    if sorted(terms) != sorted(names):
        raise KeyError(f"the LL zeroing rule takes {', '.join(names)}, not {', '.join(sorted(terms))}")
    return any(bool(terms[n]) for n in names)


def ll_zero_c() -> str:
    """:data:`LL_ZERO_WHEN` as one C condition (``hccc_host_reset``)."""
    return " || ".join(f"({c})" for _, _, c in LL_ZERO_WHEN)


def resolve_proto(proto: str, nbytes: int) -> str:
    """``"simple"`` or ``"ll"`` for a call of ``nbytes`` (the full buffer) under ``proto`` =
    ``"auto"`` | ``"simple"`` | ``"ll"``."""
    if proto == "auto":
        return "ll" if int(nbytes) <= LL_AUTO_MAX_BYTES else "simple"
    if proto not in ("simple", "ll"):
        raise ValueError(f"protocol must be 'auto', 'simple' or 'll', not {proto!r}")
    return proto
#: ticks of the kernels' ``hccc_clock()`` per microsecond, per platform (the unit of
#: ``hccc_args::timeout`` and ``hccc_error::waited``): CUDA ``%globaltimer`` nanoseconds, HIP
#: ``wall_clock64`` / ``s_memrealtime`` at a constant 100 MHz (CDNA and RDNA), the CPU emulation's
#: nanoseconds
TIMER_TICKS_PER_US = {"cuda": 1000.0, "hip": 100.0, "cpu": 1000.0}


@dataclass(frozen=True)
class CField:
    """One member of a C struct of the ABI: name, C type as declared, comment."""
    name: str
    ctype: str
    doc: str = ""


#: ``struct hccc_conn``: one connection end (both ends point to the same FIFO and counters)
CONN: tuple[CField, ...] = (
    CField("slots", "void*", "NSLOTS * slot_bytes bytes, 16-aligned (receiver's memory)"),
    CField("head", "uint64_t*", "slots consumed (written by the receiver, in the sender's memory)"),
    CField("tail", "uint64_t*", "slots published (written by the sender, in the receiver's memory)"),
    CField("place", "uint32_t", "where the other end runs and the FIFO lives: HCCC_PLACE_*"),
    CField("pad", "uint32_t", "0"),
)
#: ``hccc_conn::place`` (``HCCC_PLACE_*``): where a connection's other end runs and its memory lives,
#: seen from this rank; it sets the scope of the connection's posts (release) and waits (acquire).
#: ``GPU``: the peer runs on this rank's GPU and the FIFO and counters are that GPU's memory (or the
#: connection has no other end: an orphan FIFO, a head nobody posts), so GPU (agent) scope orders
#: them; ``NODE``: another GPU of the node, ``HOST``: host memory another agent writes (a network
#: proxy's mirror), both system scope. 0 (a record that says nothing) is taken as system scope: a
#: launcher that does not know may leave it, never narrows wrongly.
#: (name, value, what it means) -- :func:`hccc.runtime.rank_memory.conn_place` chooses one
PLACES: tuple[tuple[str, int, str], ...] = (
    ("GPU", 1, "the peer runs on this rank's GPU, the memory is that GPU's: GPU scope"),
    ("NODE", 2, "the peer runs on another GPU of the node: system scope"),
    ("HOST", 3, "the memory is host memory another agent writes (a network mirror): system scope"),
)

#: ``struct hccc_error``: "rank R, TB T stuck in <op> for chunk C (micro-batch M)"
ERROR: tuple[CField, ...] = (
    CField("claimed", "uint32_t", "0 = free; the first writer wins with a compare-and-swap"),
    CField("valid", "uint32_t", "1 once the fields below are complete"),
    CField("rank", "int32_t"),
    CField("tb", "int32_t"),
    CField("seq", "int32_t", "primitive index within the TB"),
    CField("op", "int32_t", "HCCC_SEND ... HCCC_NOP"),
    CField("wait", "int32_t", "HCCC_WAIT_*"),
    CField("chunk", "int32_t", "chunk index (in the collective's full buffer)"),
    CField("task", "int64_t", "originating transfer, -1 if none"),
    CField("microbatch", "uint64_t"),
    CField("waited", "uint64_t", "ticks spent waiting"),
)

#: ``struct hccc_args``: the kernels' single by-value argument
ARGS: tuple[CField, ...] = (
    CField("input", "void*", "in-place runs alias input / output as the collective dictates"),
    CField("output", "void*"),
    CField("scratch", "void*", "scratch_chunks * ceil(count / nchunks) elements"),
    CField("count", "uint64_t", "elements in the collective's full buffer"),
    CField("send_conns", "hccc_conn*"),
    CField("recv_conns", "hccc_conn*"),
    CField("progress", "uint64_t*", "per-rank cross-TB progress counters"),
    CField("abort_flag", "uint32_t*", "global: nonzero makes every TB exit"),
    CField("error", "hccc_error*"),
    CField("timeout", "uint64_t", "spin-wait limit in hccc_clock() ticks (nanoseconds), 0 = none"),
    CField("slice_bytes", "uint64_t", "micro-batch slice of this launch; 0 or > chunk_bytes: chunk_bytes"),
    CField("peers", "const struct hccc_args*", "every rank's hccc_args (direct mode), or nullptr"),
    CField("proto", "uint64_t", "FIFO protocol of this launch: HCCC_PROTO_SIMPLE or HCCC_PROTO_LL"),
    CField("ll_epoch", "uint32_t", "LL flag epoch of this launch (abi.ll_flag), 0 .. LL_EPOCHS - 1"),
    CField("vcounts", "const int64_t*", "AllToAllv: nranks x nranks element counts (row = source), or nullptr"),
    CField("vdispls", "const int64_t*", "AllToAllv: send then receive displacements (V_DISPLS), nullptr: packed"),
    CField("vmap", "const int32_t*", "AllToAllv: the rank's block-piece table (V_MAP)"),
    CField("vslot", "uint64_t", "AllToAllv: elements of one scratch slot (0: the program has no scratch)"),
    CField("vlens", "const int64_t*", "AllToAllv: every rank's buffer lengths (V_LENS), nullptr: the host checked the counts"),
    CField("slot_cap", "uint64_t", "slot capacity of this launch, as chunk_bytes (its slots are "
           "HCCC_SLOT_BYTES(slot_cap, max_cnt)); 0 or > chunk_bytes: chunk_bytes"),
)

# ---------------------------------------------------------------------------- AllToAllv
#: ``hccc_args::vdispls`` (AllToAllv, displacements in elements, both ``nranks x nranks`` int64
#: row-major): first ``sd[o][p]``, where rank ``o``'s send buffer holds the block it sends to ``p``,
#: then ``rd[o][p]``, where rank ``o``'s receive buffer holds the block it receives from ``p``.
#: Without it (nullptr) both are packed: the kernels take prefix sums of ``vcounts``
#: (``sd[o][p] = sum_{j<p} counts[o][j]``, ``rd[o][p] = sum_{i<p} counts[i][o]``).
V_DISPLS = ("sd", "rd")
#: ``hccc_args::vmap`` (AllToAllv, int32, one table per rank, :mod:`hccc.compiler.ir.vblocks`):
#: entry ``i`` (``i`` = 0 .. the rank's primitives) is where primitive ``i``'s row starts in the
#: table; the row holds, for each of the primitive's ``cnt`` chunks, the block piece it moves,
#: ``(s * nranks + d) * K + k`` (piece ``k`` of ``K`` of the block rank ``s`` sends to rank ``d``:
#: elements ``[k*c/K, (k+1)*c/K)`` of its ``c = counts[s][d]``), or -1 for a chunk that carries
#: no block (it moves nothing)
V_MAP = "offsets of each primitive's row, then the rows"
#: ``hccc_args::vlens`` (AllToAllv, int64, ``2 * nranks`` elements): every rank's send buffer length,
#: then every rank's receive buffer length (elements; in place both are the one buffer's). With it
#: the kernels check, at launch and before anything moves, that every block at its displacement
#: lies inside its sender's send buffer and its receiver's receive buffer (and the in-place and
#: overlap rules of :func:`hccc.runtime.alltoallv.check_call`); every rank checks the whole
#: matrix, so every rank refuses the same entry. nullptr: the host checked the counts
#: (:func:`hccc.runtime.alltoallv.check_call`) and the kernels do not.
V_LENS = ("send lengths", "receive lengths")
#: why the kernels refused an AllToAllv call at launch (``hccc_error::wait`` = ``COUNTS``,
#: ``hccc_error::op`` one of these, ``HCCC_VREF_*``): name, value, and what ``chunk`` (an entry
#: ``s * nranks + d`` of the matrix), ``task``, ``microbatch`` and ``waited`` hold
V_REFUSALS: tuple[tuple[str, int, str], ...] = (
    ("COUNT", 0, "counts[s][d] is negative or a piece of it exceeds the scratch slots: task = the count"),
    ("SEND", 1, "block (s, d) leaves rank s's send buffer: task = the count, microbatch = its "
                "displacement, waited = the buffer's length"),
    ("RECV", 2, "block (s, d) leaves rank d's receive buffer: task = the count, microbatch = its "
                "displacement, waited = the buffer's length"),
    ("OVERLAP", 3, "block (s, d) overlaps block (waited, d) in rank d's receive buffer: task = the "
                   "count, microbatch = its displacement"),
    ("ASYM", 4, "in place, counts[s][d] (task) differs from counts[d][s] (microbatch)"),
    ("DISPLS", 5, "in place, rank s sends to d from element task but receives from d at microbatch"),
)

STRUCTS: dict[str, tuple[CField, ...]] = {"hccc_conn": CONN, "hccc_error": ERROR, "hccc_args": ARGS}

# ---------------------------------------------------------------------------- launch arguments
#: ``struct hccc_table_args`` (``hccc_table.h``): the table mode's kernel argument, the rank's
#: ``hccc_args`` followed by the address of its table in its memory
TABLE_ARGS: tuple[CField, ...] = (
    CField("a", "hccc_args", "the rank's kernel arguments"),
    CField("table", "const hccc_table_head*", "the rank's table (a section of the .table file)"),
)
#: ``struct hccc_grid_args`` (``hccc_prims.h``): the one-grid entry's argument, every rank's
#: ``hccc_args`` in one device array (the entry has each rank's first block compiled in)
GRID_ARGS: tuple[CField, ...] = (
    CField("ranks", "const hccc_args*", "every rank's hccc_args, an array in device memory"),
    CField("nranks", "int64_t", "must equal the ranks the entry was generated for"),
)
#: ``struct hccc_table_grid_args`` (``hccc_table.h``): the table mode's one-grid argument, every
#: rank's ``hccc_table_args`` and the block table ``first`` (:data:`GRID_FIRST`) in device memory
TABLE_GRID_ARGS: tuple[CField, ...] = (
    CField("ranks", "const hccc_table_args*", "every rank's hccc_table_args, an array in device memory"),
    CField("first", "const int32_t*", "first block of each rank, nranks + 1 entries"),
    CField("nranks", "int64_t"),
)
#: C type of an entry of the one-grid block table (``hccc_grid_locate``'s ``first``: rank r's
#: blocks are ``first[r] .. first[r + 1] - 1``)
GRID_FIRST = "int32_t"
#: the arguments a launch passes by value or through device memory besides ``hccc_args``
LAUNCH_STRUCTS: dict[str, tuple[CField, ...]] = {
    "hccc_table_args": TABLE_ARGS, "hccc_grid_args": GRID_ARGS, "hccc_table_grid_args": TABLE_GRID_ARGS}

#: what a stuck TB was waiting for (``hccc_error::wait``)
WAITS: tuple[tuple[str, int], ...] = (("DATA", 1), ("SLOT", 2), ("DEP", 3), ("COUNTS", 4))
#: (``COUNTS``: not a wait: the kernels refused an AllToAllv counts matrix at the start, for the
#: reason :data:`V_REFUSALS` names in ``hccc_error::op``; ``hccc_error::chunk`` is the count's index
#: s*N+d, or -1 for counts given to a program that is not an AllToAll)

# ---------------------------------------------------------------------------- primitive descriptor
#: C type of each ``struct hccc_pd`` member (``int`` unless listed)
_PD_CTYPES = {"spos": "int64_t", "rpos": "int64_t", "task": "int64_t",
              # (two 16-bit fields, which keep struct hccc_pd at 96 bytes: a group's size is at most
              # GROUP_RECVS, a chain mark at most ll_chains.CHAIN_PRIMS)
              "nsrc": "int16_t", "chain": "int16_t"}
#: the macros' argument order: every row, then the number of awaited progress counters
#: (``HCCC_PW*``; the counters themselves are the rank's ``deps`` array, in primitive order), then
#: the direct-mode fields (``HCCC_P*X``); codegen writes its rows in this order
PD_CALL_BASE = ("seq", "op", "sconn", "spos", "rconn", "rpos", "sbuf", "soff", "dbuf", "doff", "cnt",
                "chunk", "post", "task")
PD_CALL_WAITS = ("ndeps",)
PD_CALL_DIRECT = ("direct", "dpeer", "pbuf", "poff", "pbase")
#: ... then a receive group's size and a fused LL chain's rows from this one on (``HCCC_P*G``: the
#: first row of a group the kernels reduce as one unit, compiler/ir/reduce_groups.py; a row of a
#: chain, compiler/ir/ll_chains.py)
PD_CALL_GROUP = ("nsrc", "chain")
#: the most receives a group holds (``HCCC_GROUP_RECVS``)
from hccc.compiler.ir.reduce_groups import GROUP_RECVS  # noqa: E402
#: fields given as an enumerator name at the call site (``SEND``, ``INPUT``): the prefix that makes
#: the C constant
PD_ENUM_PREFIX = {"op": "HCCC_", "sbuf": "HCCC_BUF_", "dbuf": "HCCC_BUF_", "pbuf": "HCCC_BUF_"}
#: value of a field a macro does not take
PD_DEFAULT = {"ndeps": "0", "direct": "0", "dpeer": "0", "pbuf": "NONE", "poff": "0", "pbase": "0", "nsrc": "0", "chain": "0"}


def pd_struct_fields() -> tuple[CField, ...]:
    """``struct hccc_pd``'s members in declaration order (names and order from
    :data:`~hccc.compiler.backend.prim_fields.PD_FIELDS`)."""
    return tuple(CField(f.name, _PD_CTYPES.get(f.name, "int"), f.doc) for f in PD_FIELDS)


def pd_call_fields(waits: bool, direct: bool, group: bool = False) -> tuple[str, ...]:
    """Arguments of ``HCCC_P`` / ``HCCC_PW`` / ``HCCC_PX`` / ``HCCC_PWX`` (and each with ``G``), in order."""
    return (PD_CALL_BASE + (PD_CALL_WAITS if waits else ()) + (PD_CALL_DIRECT if direct else ())
            + (PD_CALL_GROUP if group else ()))


def pd_macro_name(waits: bool, direct: bool, group: bool = False) -> str:
    return "HCCC_P" + ("W" if waits else "") + ("X" if direct else "") + ("G" if group else "")


def _wrapped(head: str, items: list[str], indent: int, end: str, width: int = 100) -> list[str]:
    """``head`` then ``items`` joined by ", ", broken into lines of at most ``width`` characters
    (a macro: every line ends with a backslash, aligned)."""
    lines, cur = [], head
    for k, it in enumerate(items):
        piece = it + (", " if k + 1 < len(items) else end)
        if len(cur) + len(piece.rstrip()) > width - 2 and cur.strip():
            lines.append(cur.rstrip())
            cur = " " * indent
        cur += piece
    lines.append(cur.rstrip())
    return lines


def pd_macros() -> str:
    """The eight row macros of a rank's program table: each is an ``hccc_pd`` initialiser (members
    in declaration order) made from its arguments."""
    out = []
    for waits, direct, group in ((w, d, g) for g in (False, True) for w in (False, True) for d in (False, True)):
        name = pd_macro_name(waits, direct, group)
        params = pd_call_fields(waits, direct, group)
        inits = []
        for f in pd_struct_fields():
            v = f.name if f.name in params else PD_DEFAULT[f.name]
            prefix = PD_ENUM_PREFIX.get(f.name)
            inits.append(f"{prefix}##{v}" if prefix else v)
        lines = _wrapped(f"#define {name}(", list(params), len(f"#define {name}("), ")")
        lines += _wrapped("  {", inits, 3, "}")
        width = max(len(ln) for ln in lines[:-1]) + 1
        out.append("\n".join(ln.ljust(width) + "\\" for ln in lines[:-1]) + "\n" + lines[-1])
    return "\n".join(out)


# ---------------------------------------------------------------------------- control block
#: the control block's regions in order: (name, the count of words it has, what a word holds);
#: the counts are ``nrecv``, ``nsend`` (connections of every channel) and ``nprogress``
CTRL_REGIONS: tuple[tuple[str, str, str], ...] = (
    ("tail", "nrecv", "tail of receive connection j: messages its sender published"),
    ("send_head", "nsend", "head of send connection k: slots its receiver freed"),
    ("unsent_head", "nrecv", "head of receive connection j when nobody sends on it"),
    ("progress", "nprogress", "cross-TB progress counters (at least one word)"),
)


def ctrl_offset(region: str, index: int, nrecv: int, nsend: int) -> int:
    """Byte offset of word ``index`` of ``region`` in a control block."""
    counts = {"nrecv": nrecv, "nsend": nsend}
    words = 0
    for name, count, _ in CTRL_REGIONS:
        if name == region:
            return CTRL_WORD * (words + int(index))
        words += counts[count]
    raise KeyError(region)


def ctrl_bytes(nrecv: int, nsend: int, nprogress: int) -> int:
    """Bytes of a control block (the progress region has at least one word)."""
    return ctrl_offset("progress", 0, nrecv, nsend) + CTRL_WORD * max(int(nprogress), 1)


def ctrl_offset_c(region: str, index: str, nrecv: str, nsend: str) -> str:
    """:func:`ctrl_offset` as a C expression over the given C expressions (``uint64_t``)."""
    counts = {"nrecv": nrecv, "nsend": nsend}
    terms = []
    for name, count, _ in CTRL_REGIONS:
        if name == region:
            terms.append(index)
            terms = [t for t in terms if t != "0"] or ["0"]
            return f"{CTRL_WORD}ull * (uint64_t)({' + '.join(terms)})"
        terms.append(f"({counts[count]})")
    raise KeyError(region)


def ctrl_layout_comment(prefix: str = "// ") -> str:
    """The control-block layout as comment lines."""
    lines = [f"{prefix}Control block ({CTRL_WORD}-byte words, in this order):"]
    for name, count, doc in CTRL_REGIONS:
        lines.append(f"{prefix}  {name:<12} x {count:<9} {doc}")
    return "\n".join(lines)


def manifest_abi_error(manifest: dict) -> str | None:
    """Why a parsed ``manifest.json`` cannot be run by this hccc's kernels (another ABI version),
    or None."""
    got = manifest.get("abi_version")
    if isinstance(got, int) and not isinstance(got, bool) and got == VERSION:
        return None
    return (f"the manifest's kernel ABI version is {got!r}, this hccc's kernels speak version {VERSION}: "
            "compile the algorithm again with this hccc")


# ---------------------------------------------------------------------------- C text
def c_struct(name: str) -> str:
    """The C declaration of one ABI struct (``hccc_pd`` and the launch structs included), one member
    per line."""
    fields = pd_struct_fields() if name == "hccc_pd" else {**STRUCTS, **LAUNCH_STRUCTS}[name]
    decls = [f"  {f.ctype} {f.name};" for f in fields]
    width = max(len(d) for d in decls) + 1
    body = "\n".join((d.ljust(width) + f"// {f.doc}").rstrip() if f.doc else d
                     for d, f in zip(decls, fields))
    return f"struct {name} {{\n{body}\n}};"


def c_enums() -> str:
    """The enumerations the ABI shares with ProgramIR: primitive operations, buffers, wait kinds."""
    ops = ",\n".join(f"  HCCC_{o.name} = {int(o)}" for o in Op)
    bufs = ", ".join(f"HCCC_BUF_{b.name} = {int(b)}" for b in Buf)
    waits = ", ".join(f"HCCC_WAIT_{n} = {v}" for n, v in WAITS)
    protos = ", ".join(f"HCCC_PROTO_{n} = {v}" for n, v in PROTOS)
    vrefs = ", ".join(f"HCCC_VREF_{n} = {v}" for n, v, _ in V_REFUSALS)
    places = ", ".join(f"HCCC_PLACE_{n} = {v}" for n, v, _ in PLACES)
    return ("// Primitive operations (values of ProgramIR's Op).\n"
            f"enum {{\n{ops}\n}};\n"
            "// Buffers (values of ProgramIR's Buf).\n"
            f"enum {{ {bufs} }};\n"
            "// What a stuck TB was waiting for (hccc_error::wait).\n"
            f"enum {{ {waits} }};\n"
            "// FIFO protocols (hccc_args::proto).\n"
            f"enum {{ {protos} }};\n"
            "// Why the kernels refused an AllToAllv call (hccc_error::op under HCCC_WAIT_COUNTS).\n"
            f"enum {{ {vrefs} }};\n"
            "// Where a connection's other end runs (hccc_conn::place): the scope of its posts and waits.\n"
            f"enum {{ {places} }};\n"
            f"#define HCCC_LL_LINE {LL_LINE}\n"
            f"#define HCCC_LL_DATA {LL_DATA}\n"
            f"#define HCCC_LL_FLAG_BASE {LL_FLAG_BASE}u\n"
            f"#define HCCC_LL_EPOCH_SHIFT {LL_EPOCH_SHIFT}")


__all__ = ["VERSION", "TIMER_TICKS_PER_US", "NSLOTS", "REGION_HEADER", "SLOT_OVERHEAD", "ORPHAN_HEADER", "CTRL_WORD", "CField",
           "PROTOS", "LL_LINE", "LL_DATA", "LL_FLAG_BASE", "LL_EPOCH_SHIFT", "LL_EPOCHS",
           "LL_EPOCH_MESSAGES", "ll_flag", "LL_ZERO_WHEN", "ll_zero", "ll_zero_c", "LL_AUTO_MAX_BYTES", "ll_share_bytes", "resolve_proto",
           "CONN", "PLACES", "ERROR", "ARGS", "STRUCTS", "V_DISPLS", "V_MAP", "V_LENS", "V_REFUSALS",
           "TABLE_ARGS", "GRID_ARGS", "TABLE_GRID_ARGS", "GRID_FIRST", "LAUNCH_STRUCTS", "WAITS", "PD_CALL_BASE", "PD_CALL_WAITS", "PD_CALL_DIRECT", "PD_CALL_GROUP", "GROUP_RECVS",
           "PD_ENUM_PREFIX", "PD_DEFAULT", "pd_struct_fields", "pd_call_fields", "pd_macro_name", "pd_macros",
           "CTRL_REGIONS", "ctrl_offset", "ctrl_bytes", "ctrl_offset_c", "ctrl_layout_comment", "c_struct",
           "c_enums", "manifest_abi_error"]
