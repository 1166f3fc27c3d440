"""The micro-batch slice of a call: the slice that minimises a model of the kernels' time.

The generated kernels cut every chunk of the buffer into micro-batch *slices* and stream them
through FIFOs of ``NSLOTS`` slots per connection (``templates/common/hccc_prims.h.j2``). The slot
capacity (``ProgramIR.chunk_bytes``, the manifest's ``chunk_bytes``) is fixed when the FIFOs are
allocated; a chunk's share of a slot (:func:`slot_share_bytes`; half of it under the LL protocol,
``abi.ll_share_bytes``) caps the slice, and the slice actually used may be any multiple of 16 bytes
up to it, chosen per call. A *unit* is one micro-batch of one primitive on one thread block: wait
for its flags, move its slice, post its flags. With ``nchannels = K`` every thread block runs as K
blocks and channel ``c`` moves part ``c`` of every slice (the slice cut into K parts at 16-byte
granules, :func:`hccc.compiler.ir.program_ir.channel_part`), so a block's unit moves about
``slice / K`` bytes; every block runs every unit.

**The model.** A slice of ``s`` bytes gives ``m(s)`` micro-batches a chunk (:func:`micro_batches`)
and a block ``s_K`` bytes a unit (the largest channel's part: ``16 * ceil(s / 16 / K)``). A unit
costs a block ``c + s_K / B``: :data:`UNIT_SECONDS` (``c``; :data:`LL_UNIT_SECONDS` under LL)
whatever it moves, and its bytes at the block's copy bandwidth :data:`BLOCK_BYTES_PER_SECOND`
(``B``; under LL, :data:`LL_DATA_FRACTION` of it: a line carries data and flags). The call takes
as long as its critical path: the most units one chain of dependencies crosses, ``CP(m)``
(:class:`CriticalPath`), each at that cost::

    T(s) = CP(m(s)) * (c + s_K(s) / B)

For a chain of ``D`` dependent primitives on different thread blocks ``CP(m) = m + D - 1``: the
``(m + D - 1)`` slice times of a pipeline's fill; for a thread block of ``P`` primitives, which
runs each over all its micro-batches before the next (task-level execution), ``CP(m) = P m``: its
units times the per-unit cost plus its bytes over the block's bandwidth. A program mixes both:
``CP(m) = a m + (D(m) - 1)``, ``a`` the most primitives one path runs whole one after the other
(the busiest thread block's primitives unless thread blocks feed each other's runs), and
``D(m) - 1`` the fill, which falls from ``CP(1) - a`` at one micro-batch (the longest chain of
dependent primitives) to what the busiest path's own fill is at many. Few large slices pay the
fill in large units; many small ones pay ``c`` per unit: :func:`auto_slice_bytes` returns the
slice of least ``T`` (the smallest one of those, on a tie; candidates compared in exact
arithmetic), exactly: the best slice giving at most ``m`` micro-batches is the smallest one that
does, and no slice with more than ``(T_best - a chunk / (K B)) / (a c)`` micro-batches can beat
``T_best`` (``T >= CP(m) c + a chunk / (K B)`` and ``CP(m) >= a m``), so it evaluates the model
at those counts and nowhere else. What provably follows (tests/test_slice_model.py): the slice
depends on ``c`` and ``B`` only through ``c B`` and never shrinks as that grows; LL's never
exceeds Simple's; a longer fill never gives a larger slice; raising the bounds never lowers it.
More channels may give a smaller slice: the 16-byte granules make ``s_K`` step unevenly in ``K``.

*Where D comes from.* :func:`critical_path` computes ``CP(m)`` on the program's dependency graph
of primitives: a thread block's order (the next primitive's first micro-batch follows this one's
last), cross-thread-block dependencies and FIFO messages (micro-batch ``i`` follows micro-batch
``i``): a path that runs ``R + 1`` primitives of one thread block after another and crosses ``n``
primitives in all has ``(R + 1)(m - 1) + n`` units. That is a maximum of lines in ``m``, convex,
with breakpoints below the longest chain ``L1 = CP(1)``; it is computed exactly (one longest-path
pass over the graph, every sample at once) at ``m = 1, 2, 4, ...`` up to twice the first power of
two at or above ``L1``, linear between them (an upper bound, convex) and with slope ``a`` past
them (exact there). Neither the longest chain alone (ring AllGather 8: 15 primitives, though its
thread blocks' own runs hide all but one of them at many micro-batches) nor the busiest block
alone (a broadcast chain: one primitive a block) is the fill; the graph gives both ends. The
sub-pipelines' depth (ResCCL's schedule) counts steps of the schedule, not the primitives a
micro-batch waits for in the kernels' order, so it is not used.

*What the model leaves out.* Links: a unit on a link slower than a block (a network, PCIe) takes
longer than the model says, so the fill of a program of thin streams costs more than it thinks;
``hccc sim`` models the links, and ``hccc synth`` gives such programs their own bounds
(:func:`thin_policy`). Primitives of several chunks move several parts a unit; COPY and NOP
units cost less than :data:`UNIT_SECONDS` (:data:`COPY_UNIT_SECONDS`); every unit is counted at the
full cost and one slice part here.

**A program's own policy** (``nMicroBatches = M``, ``MinSliceBytes = F`` in its header,
:class:`~hccc.compiler.frontend.slice_policy.SlicePolicy`) bounds the search: no slice below ``F``
(or the whole chunk, rounded up to 16 bytes, when that is smaller), none above a chunk's ``M``-th
part rounded up to 16 bytes (the floor wins), none above the slot share. hccc's default bounds
nothing. The result is a multiple of 16 bytes, at least 16, at most the share, and a pure
function of its arguments: the launcher, the communicator and the simulator compute it alike
(:func:`program_slice_bytes`).

**Constants**: the kernels' cost model's (:mod:`hccc.compiler.passes.kernel_cost`, measured on
the fifth GPU run: a unit 2.56 us, a COPY or LL unit 2.07 us, a block 49 GB/s on long units). With
``c B`` = 126 KB, a unit's fixed cost is the time a block takes to move 126 KB: a program without
fill takes the largest slice, one whose fill is ``D - 1`` units about ``sqrt((D-1) chunk /
(a K c B))`` micro-batches a chunk. Before the v4 kernels the policy was about 32 micro-batches
a chunk and none below 64 KiB, tuned in the simulator, which leaves a unit's cost out; the v3
kernels' unit measured 4.6-7.0 us (``benchmarks/slot_cost.py``, docs/archive/measurements-log.md), the v4
design targets were 0.5 us a unit and 100 GB/s a block (the fifth run's slices).
"""
from __future__ import annotations

__all__ = ["UNIT_SECONDS", "COPY_UNIT_SECONDS", "LL_UNIT_SECONDS", "BLOCK_BYTES_PER_SECOND", "LL_DATA_FRACTION", "PROTOS",
           "unit_seconds", "block_bytes_per_second", "SLICE_ALIGN", "DEFAULT_SLOT_BYTES", "FIFO_BUDGET_BYTES", "budget_slot_capacity", "MAX_MICRO_BATCHES",
           "THIN_SLICE_BYTES", "THIN_POLICIES", "THIN_SLOT_SHARE", "SlicePolicy", "CriticalPath", "critical_path",
           "slice_range", "model_seconds", "auto_slice_bytes", "program_slice_bytes", "micro_batches",
           "slot_share_bytes", "primitive_graph", "matched_messages", "thin_policies", "busiest_tb_prims", "busiest_slots", "thin_policy"]

import threading
import weakref
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from hccc.compiler.frontend.slice_policy import MAX_MICRO_BATCHES, SLICE_ALIGN, SlicePolicy
from hccc.compiler.ir.levels import NARROW_LEVEL, graph_levels
from hccc.compiler.passes import kernel_cost

# ---------------------------------------------------------------------------------------------
# the model's costs: the kernels' cost model's (compiler/passes/kernel_cost.py, each constant there
# naming the GPU run and table it comes from), re-exported under the names the policy uses
# ---------------------------------------------------------------------------------------------
#: What one unit (one micro-batch of one primitive) costs a thread block beyond the bytes it moves
#: (Simple): :data:`hccc.compiler.passes.kernel_cost.UNIT_SECONDS` (2.56 us, the fifth GPU run's
#: units at 16 warps). ``hccc synth`` weighs smaller slices with it too (:func:`thin_policy`).
UNIT_SECONDS = kernel_cost.UNIT_SECONDS
#: What a COPY unit costs a block beyond its bytes: :data:`hccc.compiler.passes.kernel_cost.COPY_UNIT_SECONDS`
#: (2.07 us). ``benchmarks/kernel_model.py`` counts copies at it; the slice policy counts every
#: Simple unit at :data:`UNIT_SECONDS` (it errs toward fewer units).
COPY_UNIT_SECONDS = kernel_cost.COPY_UNIT_SECONDS
#: What a unit costs a block under the LL protocol beyond its bytes: a COPY unit's (its lines carry
#: their flags, so it waits for no flag word): :data:`hccc.compiler.passes.kernel_cost.LL_UNIT_SECONDS`.
LL_UNIT_SECONDS = kernel_cost.LL_UNIT_SECONDS
#: Bytes a second one thread block's copy moves on long units (Simple):
#: :data:`hccc.compiler.passes.kernel_cost.BLOCK_BYTES_PER_SECOND` (49 GB/s, the fifth run's
#: copy-engine curve at 16 warps between its 256 and 512 KiB units).
BLOCK_BYTES_PER_SECOND = kernel_cost.BLOCK_BYTES_PER_SECOND
#: Data bytes per byte of an LL line (:data:`hccc.compiler.passes.kernel_cost.LL_DATA_FRACTION`):
#: under LL a block moves this share of :data:`BLOCK_BYTES_PER_SECOND` as payload.
LL_DATA_FRACTION = kernel_cost.LL_DATA_FRACTION
#: the FIFO protocols the model knows (``hccc run --proto``)
PROTOS = ("simple", "ll")

#: The slot capacity compiled in by default (``--chunk-size``, CompileOptions.chunk_bytes).
DEFAULT_SLOT_BYTES = 1 << 20
#: The data one connection's FIFO holds in the one-rank-per-process launchers (the Python
#: Communicator, unless ``HCCC_FIFO_BYTES`` or its ``fifo_bytes`` say otherwise; the C++ host API,
#: unless ``HCCC_HOST_FIFO_DATA_BYTES`` is defined), which set their FIFOs up before any call size
#: is known: 8 slots (``abi.NSLOTS``, the FIFO's) of the default compile's slot capacity, so a program compiled
#: with the defaults keeps its slots. Larger calls pipeline through it in more micro-batches, as
#: NCCL's per-connection buffer (``NCCL_BUFFSIZE``, 4 MiB over its 8 steps) bounds its memory by
#: channels and peers, not by the message.
FIFO_BUDGET_BYTES = 8 * DEFAULT_SLOT_BYTES
#: The smallest floor :data:`THIN_POLICIES` offers a program: 16 KiB.
THIN_SLICE_BYTES = 16 << 10
#: The policies of smaller slices ``hccc synth`` may give a program of thin streams, smallest slice
#: first: at least 128 micro-batches a chunk down to 16 KiB, or 64 down to 32 KiB (the ladder
#: measured with the simulator on the MI250 clusters, docs/synthesis.md).
THIN_POLICIES = (SlicePolicy(128, THIN_SLICE_BYTES), SlicePolicy(64, 2 * THIN_SLICE_BYTES))
#: The share of a call's time the busiest thread block's units may take (:func:`thin_policy`)
THIN_SLOT_SHARE = 0.5


def unit_seconds(proto: str = "simple") -> float:
    """What a unit costs a block beyond its bytes under ``proto``: :data:`UNIT_SECONDS`, or
    :data:`LL_UNIT_SECONDS` under LL (ValueError for an unknown protocol)."""
    _check_proto(proto)
    return float(LL_UNIT_SECONDS if proto == "ll" else UNIT_SECONDS)


def block_bytes_per_second(proto: str = "simple") -> float:
    """Payload bytes a second one block moves under ``proto``: :data:`BLOCK_BYTES_PER_SECOND`,
    times :data:`LL_DATA_FRACTION` under LL."""
    _check_proto(proto)
    return float(BLOCK_BYTES_PER_SECOND) * (float(LL_DATA_FRACTION) if proto == "ll" else 1.0)


def _check_proto(proto: str) -> None:
    if proto not in PROTOS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOS)}, not {proto!r}")


def _round_up(x: int, a: int) -> int:
    return -(-int(x) // a) * a


# ---------------------------------------------------------------------------------------------
# the kernels' arithmetic
# ---------------------------------------------------------------------------------------------
def micro_batches(nbytes: int, nchunks: int, slice_bytes: int, element_bytes: int = 4) -> int:
    """Micro-batches per chunk as the kernels count them: ``max(1, ceil(ceil(count/nchunks) /
    (slice_bytes // element_bytes)))`` with ``count = nbytes // element_bytes``."""
    if nchunks < 1 or element_bytes < 1 or slice_bytes < 1 or nbytes < 0:
        raise ValueError("sizes must be positive")
    count = int(nbytes) // int(element_bytes)
    maxc = -(-count // int(nchunks))
    per = max(1, int(slice_bytes) // int(element_bytes))
    return max(1, -(-maxc // per))


def budget_slot_capacity(program, chunk_bytes: int, budget: int, nslots: int) -> int:
    """The slot capacity (as ``chunk_bytes``) whose ``nslots`` slots (``abi.NSLOTS``) carry at
    most ``budget`` bytes of data for ``program`` (its ``max_step_chunks`` regions a slot):
    ``chunk_bytes`` where its share fits, else ``budget / nslots`` cut to whole 16-byte shares of
    the regions, at least one 16-byte share per region (the least slot the kernels run)."""
    mc = max(1, int(program.max_step_chunks))
    share = max(SLICE_ALIGN, int(budget) // max(1, int(nslots)) // mc // SLICE_ALIGN * SLICE_ALIGN)
    if slot_share_bytes(chunk_bytes, mc) <= share:
        return int(chunk_bytes)          # the compiled slot is within the budget: kept as it is
    return mc * share


def slot_share_bytes(slot_bytes: int, max_step_chunks: int = 1) -> int:
    """The largest slice (bytes) the kernels use with FIFO slots of ``slot_bytes``: a slot carries
    one micro-batch of one primitive, a slice of each of its chunks, so a program whose primitives
    move up to ``max_step_chunks`` chunks (``ProgramIR.max_step_chunks``) gives each chunk
    ``slot_bytes // max_step_chunks``, rounded down to 16 bytes when that is at least 16 (the same
    arithmetic as ``hccc_ctx_init`` in ``hccc_prims.h``)."""
    share = int(slot_bytes) // max(1, int(max_step_chunks))
    return share - share % SLICE_ALIGN if share >= SLICE_ALIGN else share


# ---------------------------------------------------------------------------------------------
# the critical path
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CriticalPath:
    """``CP(m)``, the most units one chain of dependencies of a program crosses when each of its
    primitives runs ``m`` micro-batches (module docstring): exactly ``units[i]`` at ``m =
    samples[i]`` (increasing, the first 1), linear between samples, ``slope`` more per micro-batch
    past the last. ``units[i] >= slope * samples[i]`` (a path runs ``slope`` primitives whole)."""

    samples: tuple[int, ...]
    units: tuple[int, ...]
    slope: int

    def __post_init__(self):
        s, u, a = self.samples, self.units, int(self.slope)
        if not s or len(s) != len(u) or int(s[0]) != 1 or any(int(y) <= int(x) for x, y in zip(s, s[1:])):
            raise ValueError("samples must be increasing integers from 1, one units value each")
        if a < 1 or any(int(v) < a * int(m) for m, v in zip(s, u)):
            raise ValueError("the slope must be at least 1 and units[i] >= slope * samples[i]")

    @classmethod
    def chain(cls, units_per_micro_batch: int = 1, depth: int = 1) -> "CriticalPath":
        """``CP(m) = a m + depth - 1`` with ``a = units_per_micro_batch``: a chain of ``depth``
        dependent primitives (``a = 1``: the ``(m + D - 1)`` of a pipeline's fill) or a thread
        block of ``a`` primitives (``depth = 1``)."""
        a, d = int(units_per_micro_batch), int(depth)
        if a < 1 or d < 1:
            raise ValueError("units per micro-batch and depth must be at least 1")
        return cls((1,), (a + d - 1,), a)

    @property
    def longest_chain(self) -> int:
        """``CP(1)``: the most primitives one chain of dependencies crosses."""
        return int(self.units[0])

    def at(self, m):
        """``CP(m)`` (float; ``m`` a number or an array of them, each at least 1)."""
        m = np.asarray(m, dtype=np.float64)
        xs = np.asarray(self.samples, dtype=np.float64)
        ys = np.asarray(self.units, dtype=np.float64)
        inside = np.interp(m, xs, ys)
        return np.where(m > xs[-1], ys[-1] + self.slope * (m - xs[-1]), inside)

    def exact(self, m: int) -> Fraction:
        """``CP(m)`` in exact arithmetic (``m`` an integer, at least 1)."""
        m, xs, ys = int(m), self.samples, self.units
        if m >= xs[-1]:
            return Fraction(int(ys[-1]) + int(self.slope) * (m - int(xs[-1])))
        i = max(j for j in range(len(xs)) if int(xs[j]) <= m)
        return Fraction(int(ys[i])) + Fraction((int(ys[i + 1]) - int(ys[i])) * (m - int(xs[i])),
                                               int(xs[i + 1]) - int(xs[i]))

    def fill(self, m) -> float:
        """``D(m) - 1 = CP(m) - slope m``: the units the critical path adds to its whole runs."""
        return float(self.at(m)) - self.slope * float(m)


#: id(rank column) -> (weak references to the columns read, result) (see :func:`critical_path`)
_PATHS: dict[int, tuple] = {}
_PATHS_LOCK = threading.Lock()
_PATH_COLUMNS = ("rank", "tb", "seq", "op", "channel", "send_peer", "recv_peer")


def critical_path(program) -> CriticalPath:
    """:class:`CriticalPath` of ``program`` (a ProgramIR), computed on its graph of primitives
    (module docstring) and remembered for the very arrays it was computed from (hccc never
    changes a program's columns in place). A program without primitives: ``chain(1, 1)``; one
    whose graph has a cycle (a deadlock :mod:`hccc.compiler.ir.check` refuses): its busiest
    thread block alone."""
    arrays = [program.prims[c] for c in _PATH_COLUMNS] + [program.dep_prim, program.dep_on]
    key = id(arrays[0])
    with _PATHS_LOCK:
        hit = _PATHS.get(key)
        if hit is not None and all(w() is a for w, a in zip(hit[0], arrays)):
            return hit[1]
    result = _critical_path(program)
    with _PATHS_LOCK:
        try:
            refs = tuple(weakref.ref(a, lambda _, k=key: _PATHS.pop(k, None)) for a in arrays)
        except TypeError:           # not weakly referenceable: not remembered
            return result
        _PATHS[key] = (refs, result)
    return result


def _matched(program) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(send primitives, their matched receives, the connection of each pair) of ``program``:
    only the pairs of one connection (an unbalanced program pairs nothing else)."""
    from hccc.compiler.ir.connections import match_connections

    p = program.prims
    rank = p["rank"].astype(np.int64)
    s, r = match_connections(program)
    k = min(len(s), len(r))
    s, r = np.asarray(s[:k], np.int64), np.asarray(r[:k], np.int64)
    skey = np.zeros(0, np.int64)
    if k:
        N = max(1, int(program.nranks))
        ch = p["channel"].astype(np.int64)
        nch = int(ch.max()) + 1
        skey = (rank[s] * N + p["send_peer"][s].astype(np.int64)) * nch + ch[s]
        rkey = (p["recv_peer"][r].astype(np.int64) * N + rank[r]) * nch + ch[r]
        same = skey == rkey
        s, r, skey = s[same], r[same], skey[same]
    return s, r, skey


def matched_messages(program) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per connection of ``program``, its send primitives in the sender's order and the receive
    each is matched with (the FIFO's messages, one per micro-batch of each pair)."""
    s, r, key = _matched(program)
    seq = program.prims["seq"].astype(np.int64)
    out = []
    for c in np.unique(key):
        idx = np.flatnonzero(key == c)
        idx = idx[np.argsort(seq[s[idx]], kind="stable")]
        out.append((s[idx], r[idx]))
    return out


def primitive_graph(program) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(primitives, edge sources, edge targets, edge is a thread block's order) of ``program``: a
    thread block's order, its dependencies and its matched sends and receives (module docstring)."""
    return _graph(program)


def _graph(program) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(primitives, edge sources, edge targets, edge is a thread block's order) of ``program``."""
    p = program.prims
    n = int(len(p["rank"]))
    rank = p["rank"].astype(np.int64)
    tb = p["tb"].astype(np.int64)
    order = np.lexsort((p["seq"].astype(np.int64), tb, rank))
    key = rank[order] * (1 << 32) + tb[order]
    nxt = np.flatnonzero(key[1:] == key[:-1])
    tb_src, tb_dst = order[nxt], order[nxt + 1]
    dep_src = np.asarray(program.dep_on, dtype=np.int64)
    dep_dst = np.asarray(program.dep_prim, dtype=np.int64)
    s, r, _ = _matched(program)
    src = np.concatenate([tb_src, dep_src, s])
    dst = np.concatenate([tb_dst, dep_dst, r])
    is_tb = np.zeros(len(src), dtype=bool)
    is_tb[:len(tb_src)] = True
    return n, src, dst, is_tb


def _critical_path(program) -> CriticalPath:
    n, src, dst, is_tb = _graph(program)
    if n == 0:
        return CriticalPath.chain(1, 1)
    # topological levels (linear: hccc.compiler.ir.levels), the edges taken a level of their
    # sources at a time in the pass below
    level = graph_levels(n, src, dst)
    if (level < 0).any():     # a cycle: no schedule runs it (the checks refuse it); its busiest block alone
        return CriticalPath.chain(max(1, busiest_tb_prims(program)), 1)
    depth = int(level.max()) + 1
    o = np.argsort(level[src], kind="stable")
    e_src, e_dst, e_tb = src[o], dst[o], is_tb[o]
    bounds = np.searchsorted(level[e_src], np.arange(depth + 1)).tolist()
    # samples 1, 2, 4, ... up to twice the first power of two >= the longest chain (depth): the
    # lines' breakpoints all lie below it, so the last two samples' slope is the asymptotic one
    top = 1
    while top < depth:
        top *= 2
    ms = np.array([1 << i for i in range(top.bit_length() + 1)], dtype=np.int64)
    # val[v, j]: the most R (m_j - 1) + n over paths ending at v (R thread-block order edges, n
    # primitives); a path's units are that plus m_j - 1
    val = np.ones((n, len(ms)), dtype=np.int64)
    step = ms - 1
    for lv in range(depth):
        e0, e1 = bounds[lv], bounds[lv + 1]
        if e1 - e0 < NARROW_LEVEL:      # a narrow level: a row operation per edge
            for u, v, tbe in zip(e_src[e0:e1].tolist(), e_dst[e0:e1].tolist(), e_tb[e0:e1].tolist()):
                row = val[v]
                np.maximum(row, val[u] + (1 + step if tbe else 1), out=row)
            continue
        u, v, tbe = e_src[e0:e1], e_dst[e0:e1], e_tb[e0:e1]
        cand = val[u] + 1 + np.where(tbe[:, None], step[None, :], 0)
        np.maximum.at(val, v, cand)
    units = val.max(axis=0) + step
    slope = int((units[-1] - units[-2]) // (ms[-1] - ms[-2]))
    return CriticalPath(tuple(int(x) for x in ms), tuple(int(x) for x in units), max(1, slope))


# ---------------------------------------------------------------------------------------------
# the policy
# ---------------------------------------------------------------------------------------------
def _check_sizes(nbytes: int, nchunks: int, share: int, element_bytes: int) -> None:
    if nbytes < 0:
        raise ValueError("nbytes must be non-negative")
    if nchunks < 1 or element_bytes < 1:
        raise ValueError("nchunks and element_bytes must be positive")
    if element_bytes > SLICE_ALIGN or SLICE_ALIGN % element_bytes:
        raise ValueError(f"element size {element_bytes} does not divide {SLICE_ALIGN}")
    if share < SLICE_ALIGN:
        raise ValueError(f"slot share {share} is below {SLICE_ALIGN} bytes")


def slice_range(nbytes: int, nchunks: int, share: int, element_bytes: int = 4,
                policy: SlicePolicy | None = None) -> tuple[int, int]:
    """``(lo, hi)``: the least and the largest slice (bytes, multiples of 16) a call of ``nbytes``
    in ``nchunks`` chunks may take through slot shares of ``share`` bytes under ``policy``
    (module docstring: the floor, or the whole chunk when smaller; at most the chunk's
    ``micro_batches``-th part unless the floor is more; at most the share)."""
    nbytes, nchunks, share, element_bytes = int(nbytes), int(nchunks), int(share), int(element_bytes)
    _check_sizes(nbytes, nchunks, share, element_bytes)
    pol = policy or SlicePolicy()
    if int(pol.micro_batches) < 1:
        raise ValueError("the policy's micro-batches must be at least 1")
    cap = share // SLICE_ALIGN * SLICE_ALIGN
    maxc = -(-(nbytes // element_bytes) // nchunks)
    chunk = max(1, maxc) * element_bytes
    lo = min(_round_up(max(int(pol.min_slice), 1), SLICE_ALIGN), _round_up(chunk, SLICE_ALIGN))
    hi = max(lo, _round_up(-(-chunk // int(pol.micro_batches)), SLICE_ALIGN))
    return min(lo, cap), min(hi, cap)


def _costs(proto: str, costs: tuple[float, float] | None) -> tuple[float, float]:
    c, b = (unit_seconds(proto), block_bytes_per_second(proto)) if costs is None else (float(costs[0]), float(costs[1]))
    if costs is not None:
        _check_proto(proto)
    if not (c > 0 and b > 0 and np.isfinite(c) and np.isfinite(b)):
        raise ValueError("the model's unit cost and block bandwidth must be positive and finite")
    return c, b


def _part(s, k: int):
    """Bytes of the largest of ``k`` channels' parts of slices of ``s`` bytes (multiples of 16)."""
    return SLICE_ALIGN * (-(-(s // SLICE_ALIGN) // k))


def _seconds(s: np.ndarray, maxc: int, element_bytes: int, path: CriticalPath, k: int, c: float,
             b: float) -> np.ndarray:
    """The model's ``T`` for every slice of ``s`` (bytes, multiples of 16), in floating point."""
    per = np.maximum(1, s // element_bytes)
    m = np.maximum(1, -(-maxc // per))
    return path.at(m) * (c + _part(s, k) / b)


def _exact_seconds(s: int, maxc: int, element_bytes: int, path: CriticalPath, k: int, c: float,
                   b: float) -> Fraction:
    """:func:`_seconds` of one slice in exact arithmetic (``c`` and ``b`` as the floats they are)."""
    m = max(1, -(-maxc // max(1, s // element_bytes)))
    return path.exact(m) * (Fraction(c) + Fraction(int(_part(s, k))) / Fraction(b))


def model_seconds(slice_bytes: int, nbytes: int, nchunks: int, element_bytes: int = 4, *,
                  path: CriticalPath, nchannels: int = 1, proto: str = "simple",
                  costs: tuple[float, float] | None = None) -> float:
    """The model's time (seconds) of a call of ``nbytes`` in ``nchunks`` chunks cut into slices of
    ``slice_bytes`` (a multiple of 16) with ``nchannels`` channels under ``proto``: ``CP(m) (c +
    s_K / B)`` (module docstring); ``costs``: ``(c, B)`` instead of the protocol's constants."""
    s = int(slice_bytes)
    if s < SLICE_ALIGN or s % SLICE_ALIGN:
        raise ValueError(f"a slice is a positive multiple of {SLICE_ALIGN} bytes, not {s}")
    _check_sizes(int(nbytes), int(nchunks), s, int(element_bytes))
    c, b = _costs(proto, costs)
    maxc = -(-(int(nbytes) // int(element_bytes)) // int(nchunks))
    return float(_seconds(np.array([s], np.int64), maxc, int(element_bytes), path, max(1, int(nchannels)), c, b)[0])


#: the most candidate micro-batch counts :func:`auto_slice_bytes` evaluates at once
_BATCH = 1 << 16
#: candidates within this relative distance of the least time in floating point are compared
#: again in exact arithmetic (rounding is some 1e-16 of a time)
_NEAR = 1e-9


def auto_slice_bytes(nbytes: int, nchunks: int, share: int = DEFAULT_SLOT_BYTES, element_bytes: int = 4, *,
                     path: CriticalPath, nchannels: int = 1, proto: str = "simple",
                     policy: SlicePolicy | None = None, costs: tuple[float, float] | None = None) -> int:
    """The slice (bytes) for one call of ``nbytes`` (the collective's full buffer) cut into
    ``nchunks`` chunks, streamed through slot shares of ``share`` bytes (a chunk's share of a slot
    under ``proto``: :func:`slot_share_bytes`, halved under LL), by a program of critical path
    ``path`` (:func:`critical_path`) running ``nchannels`` channels: the slice of least
    :func:`model_seconds` within :func:`slice_range` under ``policy`` (hccc's default when None),
    the smallest of them on a tie (times compared in exact arithmetic). A multiple of 16 bytes
    (hence of any element size up to 16), at least 16, at most ``share``; pure and deterministic.
    ``costs``: ``(c, B)`` instead of the protocol's constants (what-if models)."""
    nbytes, nchunks, es = int(nbytes), int(nchunks), int(element_bytes)
    lo, hi = slice_range(nbytes, nchunks, int(share), es, policy)
    c, b = _costs(proto, costs)
    k = max(1, int(nchannels))
    maxc = -(-(nbytes // es) // nchunks)
    if lo == hi or maxc <= 0:                       # one choice, or nothing to move: one micro-batch
        return int(lo)

    def m_of(s: int) -> int:
        return max(1, -(-maxc // max(1, s // es)))

    def slice_of(mu: np.ndarray) -> np.ndarray:
        # the smallest slice within [lo, hi] giving at most ``mu`` micro-batches
        s = -(-(-(-maxc // mu) * es) // SLICE_ALIGN) * SLICE_ALIGN
        return np.clip(s, lo, hi)

    near: list[tuple[np.ndarray, np.ndarray]] = []

    def consider(s: np.ndarray) -> float:
        s = np.unique(s)
        t = _seconds(s, maxc, es, path, k, c, b)
        least = float(t.min())
        keep = t <= least * (1 + _NEAR)
        near.append((s[keep], t[keep]))
        return least

    mu_lo, mu_hi = m_of(hi), m_of(lo)
    # a first bound from a spread of counts, then every count that could beat it
    grid = np.geomspace(mu_lo, mu_hi, num=min(64, mu_hi - mu_lo + 1)).round().astype(np.int64)
    best = consider(slice_of(np.r_[grid, mu_lo, mu_hi]))
    a, chunk = float(path.slope), maxc * es
    # T(s) >= CP(m) c + CP(m) chunk / (m K B) >= a m c + a chunk / (K B) for m = m(s)
    reach = (best * (1 + _NEAR) - a * chunk / (k * b)) / (a * c)
    mu_top = int(min(mu_hi, max(mu_lo, np.floor(reach) + 1)))
    for first in range(mu_lo, mu_top + 1, _BATCH):
        best = min(best, consider(slice_of(np.arange(first, min(mu_top, first + _BATCH - 1) + 1, dtype=np.int64))))
    # the candidates the floating point cannot tell apart, compared exactly (smallest slice on a tie)
    pool = sorted({int(x) for s, t in near for x in s[t <= best * (1 + _NEAR)]})
    return min(pool, key=lambda x: (_exact_seconds(x, maxc, es, path, k, c, b), x))


def program_slice_bytes(program, nbytes: int, share: int, element_bytes: int = 4, proto: str = "simple") -> int:
    """:func:`auto_slice_bytes` for ``program`` (a ProgramIR): its critical path, its channels
    (``nchannels``) and its own policy (``ProgramIR.slice_policy``); ``share``: a chunk's share of
    a slot under ``proto``. The slice the launcher, the communicator and the simulator use."""
    return auto_slice_bytes(nbytes, program.nchunks, share, element_bytes, path=critical_path(program),
                            nchannels=max(1, int(getattr(program, "nchannels", 1) or 1)), proto=proto,
                            policy=program.slice_policy)


# ---------------------------------------------------------------------------------------------
# smaller slices for thin streams (hccc synth)
# ---------------------------------------------------------------------------------------------
def thin_policies() -> list[SlicePolicy]:
    """:data:`THIN_POLICIES`, smallest slice first."""
    return list(THIN_POLICIES)


def busiest_tb_prims(program) -> int:
    """Primitives of the thread block of ``program`` (a ProgramIR) that runs the most (0 without any)."""
    r, t = program.prims["rank"], program.prims["tb"]
    if not len(r):
        return 0
    key = r.astype("int64") * (1 << 20) + t.astype("int64")
    return int(np.unique(key, return_counts=True)[1].max())


def busiest_slots(program, policy: SlicePolicy, nbytes: int, slot_bytes: int, element_bytes: int = 4) -> int:
    """Units (one per primitive and micro-batch, each a flag to wait for and one to post) the
    busiest thread block of ``program`` (a ProgramIR) runs in one call of ``nbytes`` with slots of
    ``slot_bytes`` when its policy is ``policy`` (the slice :func:`auto_slice_bytes` then picks)."""
    share = slot_share_bytes(slot_bytes, program.max_step_chunks)
    slice_b = auto_slice_bytes(nbytes, program.nchunks, share, element_bytes, path=critical_path(program),
                               nchannels=max(1, int(getattr(program, "nchannels", 1) or 1)), policy=policy)
    return busiest_tb_prims(program) * micro_batches(nbytes, program.nchunks, slice_b, element_bytes)


def thin_policy(program, nbytes: int, seconds: float, slot_bytes: int = DEFAULT_SLOT_BYTES,
                element_bytes: int = 4) -> list[SlicePolicy]:
    """The :func:`thin_policies` that ``program`` (a ProgramIR running a call of ``nbytes`` in
    about ``seconds``) can afford, smallest slice first: those whose busiest thread block's units
    (:func:`busiest_slots`), at :data:`UNIT_SECONDS` each (what a unit costs on a GPU beyond the
    bytes it moves, which the simulator leaves out), take at most :data:`THIN_SLOT_SHARE` of
    ``seconds``. A stream that carries a small share of its links waits for its data most of
    the time, so such costs hide there; a program whose thread blocks are busy moving bytes is
    not offered smaller slices at all."""
    budget = float(seconds) * THIN_SLOT_SHARE / unit_seconds("simple")
    return [p for p in thin_policies() if busiest_slots(program, p, nbytes, slot_bytes, element_bytes) <= budget]
