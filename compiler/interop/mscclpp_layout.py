"""What an MSCCL++ plan declares before its operations: its collective and protocol, its GPUs and
their buffers, its channels (paired end to end) and remote buffers, as one :class:`PlanLayout`.

:func:`read_layout` checks each field at its place in the file and bounds the sizes the plan
declares before anything is built from them; :meth:`PlanLayout.region` resolves an operation's
buffer reference against the layout (what every later phase of the import reads data through).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.interop.mscclpp_groups import group_part
from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.interop.mscclpp_plan import (BUF_OF_LETTER, BUFFER_ALIGNMENT, COLLECTIVES, MAX_BUFFER_ALIGNMENT,
                                                MAX_GROUP_PARTS, MAX_PLAN_SLOTS, MAX_THREADS_PER_BLOCK, NO_MAX_SIZE,
                                                SHARED_SCRATCH_BYTES)
from hccc.compiler.interop.mscclpp_switch import SwitchChannels
from hccc.compiler.ir.program_ir import Buf


@dataclass
class PlanLayout:
    """A plan's declarations, checked: chunk counts are per rank, in the plan's chunks; ``F``
    cuts every chunk into parts so that a thread-block group's share of a range is whole parts."""
    coll: str
    proto: str                     # "Simple" or "LL"
    inplace: bool
    double: bool                   # use_double_scratch_buffer
    R: int                         # ranks
    ic: int                        # input chunks
    oc: int                        # output chunks
    C: int                         # chunks of the collective's full buffer
    F: int                         # parts per chunk (lcm of the thread-block group sizes)
    uneven: bool                   # a group cuts a range whose chunks its size does not divide
    scratch: list[int]             # rank -> scratch chunks
    PK: int                        # packets of scratch region q live in ProgramIR scratch slot PK + q
    served: tuple                  # (least, largest message size, why the largest is lower) proven
    chans: list[dict]              # rank -> channel type -> [peer] (rank-level channel ids)
    rbufs: list[list[tuple]]       # rank -> [(owner rank, buffer letter)]
    switch: SwitchChannels         # the switch (NVLS) channels
    pair: dict                     # (rank, type, channel) -> (partner channel on the peer, k)
    err: Callable                  # err(path, message) -> the located CompileError

    def region(self, op, ref, path, r):
        """(rank, Buf, chunk, count) of a buffer reference (a remote one through the op's channel
        type), in parts of chunks (a thread-block group member's part of it)."""
        idx, n = ref.index, ref.size        # integers, size at least 1 (checked as the operation was read)
        if ref.buffer_id is not None:
            ids = op.rbufs.get(op.t, [])
            b = ref.buffer_id
            if not 0 <= b < len(ids) or not 0 <= ids[b] < len(self.rbufs[r]):
                raise self.err(path + ("buffer_id",), "remote buffer id beyond the thread block's remote buffers")
            owner, letter = self.rbufs[r][ids[b]]
        else:
            owner, letter = r, ref.type
            if letter not in BUF_OF_LETTER:
                raise self.err(path, f"bad buffer type {letter!r}")
        buf = BUF_OF_LETTER[letter]
        limit = {Buf.INPUT: self.ic, Buf.OUTPUT: self.oc, Buf.SCRATCH: self.scratch[owner]}[buf]
        if idx + n > limit:
            raise self.err(path, f"chunks [{idx}, {idx + n}) of rank {owner}'s {letter} buffer: it has {limit}")
        # a thread-block group's member moves its part of the range (the executor's cut, mscclpp_groups)
        return (owner, buf) + group_part(idx, n, self.F, op.tbg)


def read_layout(rd: PlanReader, plan: dict) -> PlanLayout:
    """The plan's declarations, each checked where it stands (in the order the file is read)."""
    coll, proto, inplace, reuse, double = _flags(rd, plan)
    gpus = rd.get(plan, "gpus", (), list)
    R, ic, oc = _chunk_counts(rd, gpus)
    F, uneven = _refinement(rd, gpus)
    _bound_slots(rd, gpus, R, ic, oc, proto, F)
    # the full buffer's chunks: an AllGather's output, a ReduceScatter's input, every rank's part of
    # a SendRecv (a rank's chunk j is hccc's chunk r * ic + j), the input otherwise
    C = {"allgather": oc, "reducescatter": ic, "sendrecv": R * ic}.get(coll, ic)
    ok = {"allgather": oc == R * ic, "reducescatter": ic == R * oc, "allreduce": ic == oc,
          "alltoall": ic == oc and ic % R == 0, "sendrecv": ic == oc}[coll]
    if not ok or ic < 1 or oc < 1:
        raise rd.err(("gpus", 0, "input_chunks"), f"{coll} on {R} ranks with {ic} input and {oc} output "
                                                  f"chunks: the chunk counts do not fit the collective")
    served = _served_sizes(rd, plan, coll, proto, reuse, double, ic, oc, max(g["scratch_chunks"] for g in gpus))
    scratch = [g["scratch_chunks"] for g in gpus]
    chans, rbufs = _channels(rd, gpus, R)
    # switch (NVLS) channels: their operations become memory-channel ones (mscclpp_switch)
    limit = {"i": ic, "o": oc}
    switch = SwitchChannels(gpus, lambda m, x: limit.get(x, scratch[m]), rd.err, double)
    return PlanLayout(coll=coll, proto=proto, inplace=inplace, double=double, R=R, ic=ic, oc=oc, C=C, F=F,
                      uneven=uneven,
                      scratch=scratch, PK=max(scratch) * F if proto == "LL" else 0, served=served, chans=chans,
                      rbufs=rbufs, switch=switch, pair=_pairs(R, chans), err=rd.err)


def _flags(rd: PlanReader, plan: dict) -> tuple[str, str, bool, bool, bool]:
    """The plan's collective, protocol, ``inplace``, ``reuse_resources`` and
    ``use_double_scratch_buffer``, each checked (``num_threads_per_block`` too, which hccc's
    kernels do not use but the executor launches with)."""
    coll = rd.get(plan, "collective", (), str)
    if coll not in COLLECTIVES:
        spec = SPECS.get(coll)
        if spec is not None and spec.rooted:   # one hccc has, which a plan cannot state
            raise rd.err(("collective",), f"unsupported collective '{coll}': an MSCCL++ plan has no "
                                          f"root, so it cannot express a {spec.title}; hccc reads "
                                          f"{', '.join(COLLECTIVES)} plans")
        raise rd.err(("collective",), f"unsupported collective '{coll}': hccc proves and runs "
                                      f"{', '.join(COLLECTIVES)}")
    proto = rd.get(plan, "protocol", (), str)
    if proto not in ("Simple", "LL"):
        raise rd.err(("protocol",), f"unknown protocol '{proto}' (Simple or LL)")
    inplace = rd.get(plan, "inplace", ())
    if not isinstance(inplace, bool):
        raise rd.err(("inplace",), "'inplace' must be true or false")
    reuse = plan.get("reuse_resources", False)
    if not isinstance(reuse, bool):
        raise rd.err(("reuse_resources",), "'reuse_resources' must be true or false")
    double = plan.get("use_double_scratch_buffer", False)
    if not isinstance(double, bool):
        raise rd.err(("use_double_scratch_buffer",), "'use_double_scratch_buffer' must be true or false")
    threads = plan.get("num_threads_per_block", MAX_THREADS_PER_BLOCK)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS_PER_BLOCK:
        raise rd.err(("num_threads_per_block",), f"'num_threads_per_block' must be an integer from 1 to "
                                                 f"{MAX_THREADS_PER_BLOCK} (a CUDA or HIP thread block's most)")
    return coll, proto, inplace, reuse, double


def _chunk_counts(rd: PlanReader, gpus: list) -> tuple[int, int, int]:
    """(ranks, input chunks, output chunks): every gpu numbered in order, all declaring the same
    counts, scratch chunks checked too."""
    R = len(gpus)
    if R < 1:
        raise rd.err(("gpus",), "no gpus")
    counts = set()
    for r, g in enumerate(gpus):
        gid = rd.get(g, "id", ("gpus", r), int)
        if gid != r:
            raise rd.err(("gpus", r, "id"), f"gpus[{r}] has id {gid}; ids must be 0..{R - 1} in order")
        counts.add((rd.get(g, "input_chunks", ("gpus", r), int), rd.get(g, "output_chunks", ("gpus", r), int)))
        rd.get(g, "scratch_chunks", ("gpus", r), int)
    if len(counts) != 1:
        raise rd.err(("gpus",), "the gpus declare different input/output chunk counts")
    ic, oc = counts.pop()
    return R, ic, oc


def _bound_slots(rd: PlanReader, gpus: list, R: int, ic: int, oc: int, proto: str, F: int) -> None:
    """Refuse a plan declaring more chunk slots than :data:`MAX_PLAN_SLOTS` (before anything is
    built from its sizes)."""
    big = max(range(R), key=lambda r: gpus[r]["scratch_chunks"])
    sc = gpus[big]["scratch_chunks"] * (2 if proto == "LL" else 1)
    slots = R * (ic + oc + sc) * F
    if slots > MAX_PLAN_SLOTS:
        at = ("gpus", big, "scratch_chunks") if sc > ic + oc else ("gpus", 0, "output_chunks" if oc > ic else
                                                                     "input_chunks")
        raise rd.err(at, f"the plan declares {R} ranks x ({ic} input + {oc} output + {sc} scratch"
                         + (" (LL: twice)" if proto == "LL" else "") + " chunks)"
                         + (f" x {F} parts (thread-block groups)" if F > 1 else "")
                         + f" = {slots:,} chunk slots: more "
                         f"than the {MAX_PLAN_SLOTS:,} hccc checks a plan with (docs/files-and-limits.md)")


def _refinement(rd: PlanReader, gpus: list) -> tuple[int, bool]:
    """The least common multiple of the plan's thread-block group sizes (1: none), bounded by
    :data:`MAX_GROUP_PARTS`, every operation's ``tbg_info`` checked on the way; and whether a group
    cuts a range of ``n`` chunks with ``tbg_size`` not dividing ``n`` (the executor's parts, whole
    alignment units, then fall on the import's parts only at sizes whose chunks are a multiple of
    the parts: :func:`~hccc.compiler.interop.mscclpp_groups.group_part`)."""
    F = 1
    uneven = False
    for r, g in enumerate(gpus):
        tbs = g.get("threadblocks")
        for ti, tb in enumerate(tbs if isinstance(tbs, list) else ()):
            ops = tb.get("ops") if isinstance(tb, dict) else None
            # (path of a list of operations, the list): paths are made only for an operation read
            # further, so a long list of plain operations costs no tuple per operation
            todo = [(("gpus", r, "threadblocks", ti, "ops"), ops if isinstance(ops, list) else ())]
            while todo:
                at, lst = todo.pop()
                for k, op in enumerate(lst):
                    if isinstance(op, dict) and len(op) > 1 and (isinstance(op.get("ops"), list)
                                                                 or "tbg_info" in op):
                        F, uneven = _group_sizes(rd, at + (k,), op, F, uneven, todo)
    return F, uneven


def _group_sizes(rd: PlanReader, p: tuple, op: dict, F: int, uneven: bool, todo: list) -> tuple[int, bool]:
    """:func:`_refinement`'s reading of one operation at ``p``: its body queued on ``todo``, its
    ``tbg_info`` checked and joined to ``F`` and ``uneven``."""
    if isinstance(op.get("ops"), list):
        todo.append((p + ("ops",), op["ops"]))
    if "tbg_info" not in op:
        return F, uneven
    info = op["tbg_info"]
    if not isinstance(info, dict) or not all(isinstance(info.get(k), int) and not isinstance(info[k], bool)
                                             for k in ("tb_id", "tbg_size")) \
            or not 0 <= info["tb_id"] < info["tbg_size"]:
        raise rd.err(p + ("tbg_info",), "'tbg_info' needs integers 'tb_id' and 'tbg_size', "
                                        "0 <= tb_id < tbg_size")
    F = math.lcm(F, info["tbg_size"])
    uneven = uneven or any(isinstance(ref, dict) and isinstance(ref.get("size"), int)
                           and ref["size"] % info["tbg_size"]
                           for side in ("src_buff", "dst_buff")
                           for ref in (op.get(side) if isinstance(op.get(side), list) else ()))
    if F > MAX_GROUP_PARTS:
        raise rd.err(p + ("tbg_info",), f"the plan's thread-block group sizes cut a chunk into "
                                        f"{F} parts: hccc models at most {MAX_GROUP_PARTS}")
    return F, uneven


def _served_sizes(rd: PlanReader, plan: dict, coll: str, proto: str, reuse: bool, double: bool, ic: int, oc: int,
                  scratch: int) -> tuple[int, int, str | None]:
    """(least, largest message size, why the largest is below the plan's) the proof covers.

    With ``reuse_resources`` the executor gives the plan its shared scratch buffer of
    :data:`SHARED_SCRATCH_BYTES` (half of it per call with a double buffer) instead of one
    sized for the message. While the scratch the plan uses (its scratch chunks of the
    message's chunk size, twice with LL packets) fits that buffer, every offset is the one of a
    plan without reuse: the plan is the same program. Past that size the executor folds the
    scratch offsets of pipelined operations into shorter scratch chunks (modulo), which hccc
    does not model: the proof, and the range hccc serves it for, stops there."""
    lo = plan.get("min_message_size", 0)
    hi = plan.get("max_message_size", NO_MAX_SIZE)
    for key, v in (("min_message_size", lo), ("max_message_size", hi)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= NO_MAX_SIZE:
            raise rd.err((key,), f"'{key}' must be an integer from 0 to {NO_MAX_SIZE} (the loader's uint64)")
    if lo > hi:
        raise rd.err(("min_message_size",), f"min_message_size={lo} is more than max_message_size={hi}: "
                                            f"the plan would serve no size")
    align = plan.get("buffer_alignment", BUFFER_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or not 1 <= align <= MAX_BUFFER_ALIGNMENT:
        raise rd.err(("buffer_alignment",), f"'buffer_alignment' must be an integer from 1 to "
                                            f"{MAX_BUFFER_ALIGNMENT}")
    if not reuse or not scratch:
        return lo, hi, None
    room = SHARED_SCRATCH_BYTES // (2 if double else 1)
    chunk = room // (scratch * (2 if proto == "LL" else 1)) // align * align
    nchunks = oc if coll == "allgather" else ic
    top = chunk * nchunks
    if top < lo:
        raise rd.err(("min_message_size",), f"with reuse_resources the plan's {scratch} scratch chunks "
                                            f"fit the executor's shared {SHARED_SCRATCH_BYTES >> 20} MiB "
                                            f"scratch only up to {top} bytes, below its min_message_size")
    if top < hi:
        return lo, top, (f"reuse_resources: proven up to {top} bytes, where the {scratch} scratch chunks "
                         f"fill the executor's shared scratch buffer")
    return lo, hi, None


def _channels(rd: PlanReader, gpus: list, R: int) -> tuple[list[dict], list[list[tuple]]]:
    """Each rank's memory and port channels (their peers, in order) and remote buffers."""
    chans = []          # rank -> type -> [peer]
    rbufs = []
    for r, g in enumerate(gpus):
        for key in ("channels", "remote_buffers"):
            if not isinstance(g.get(key, []), list):
                raise rd.err(("gpus", r, key), f"'{key}' must be a list")
        lists = {"memory": [], "port": []}
        for k, ch in enumerate(g.get("channels", [])):
            t = rd.get(ch, "channel_type", ("gpus", r, "channels", k), str)
            if t == "switch":
                continue                 # read by SwitchChannels
            if t not in lists:
                raise rd.err(("gpus", r, "channels", k, "channel_type"), f"unknown channel type '{t}'")
            for j, p in enumerate(rd.get(ch, "connected_to", ("gpus", r, "channels", k), list)):
                if not isinstance(p, int) or not 0 <= p < R or p == r:
                    raise rd.err(("gpus", r, "channels", k, "connected_to", j), f"bad peer {p!r}")
                lists[t].append(p)
        chans.append(lists)
        bufs = []
        for k, b in enumerate(g.get("remote_buffers", [])):
            p = rd.get(b, "rank", ("gpus", r, "remote_buffers", k), int)
            letter = rd.get(b, "type", ("gpus", r, "remote_buffers", k), str)
            if p >= R or letter not in BUF_OF_LETTER:
                raise rd.err(("gpus", r, "remote_buffers", k), "bad remote buffer")
            bufs.append((p, letter))
        rbufs.append(bufs)
    return chans, rbufs


def _pairs(R: int, chans: list[dict]) -> dict:
    """The k-th channel of a type from A to B is the k-th from B to A: ``(rank, type, channel)`` ->
    ``(the partner channel on the peer, k)`` (linear in the channels: each rank's channels grouped
    by peer once)."""
    towards = defaultdict(list)          # (rank, type, peer) -> the rank's channels to peer, in order
    for r in range(R):
        for t, peers in chans[r].items():
            for c, p in enumerate(peers):
                towards[(r, t, p)].append(c)
    pair = {}
    for (r, t, p), mine in towards.items():
        theirs = towards.get((p, t, r), ())
        for m, c in enumerate(mine[:len(theirs)]):
            pair[(r, t, c)] = (theirs[m], m)
    return pair


def node_size(layout: PlanLayout) -> int:
    """The ranks per node the plan's channels imply, 0 where they imply none. A memory channel
    maps the peer's memory, so its two ends share a node; a port channel may cross nodes. When
    the ranks joined by memory channels fall into two or more groups of one size G >= 2, rank r
    in group r // G, the plan is for nodes of G ranks (the runtime's placement check then
    reports a job that splits a group over nodes)."""
    import networkx as nx
    joined = nx.Graph()
    joined.add_nodes_from(range(layout.R))
    joined.add_edges_from((r, p) for r in range(layout.R) for p in layout.chans[r]["memory"])
    for ranks in layout.switch.members():          # the switch maps its group's memory
        joined.add_edges_from((ranks[0], p) for p in ranks)
    groups = [sorted(c) for c in nx.connected_components(joined)]
    sizes = {len(m) for m in groups}
    if len(groups) < 2 or len(sizes) != 1:
        return 0
    g = sizes.pop()
    if g < 2 or any(m != list(range(m[0], m[0] + g)) or m[0] % g for m in groups):
        return 0
    return g


__all__ = ["PlanLayout", "read_layout", "node_size"]
