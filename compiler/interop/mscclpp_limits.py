"""Up-front checks of the MSCCL++ executor's limits on a ProgramIR, before any plan is built.

The plan exporter (:mod:`hccc.compiler.interop.mscclpp_export`) checks every limit exactly on the
plan it builds, but building one operation dict per primitive, micro-batch and instance for a
program that cannot fit wastes minutes and gigabytes at a thousand GPUs. :func:`check_plan_fits`
refuses such programs from the IR's columns alone, with numpy, and :func:`check_transfers_fit` from the
transfer table, before the program is lowered (``hccc plan``, ``hccc synth``). Every quantity it compares is a lower
bound on what :func:`~hccc.compiler.interop.mscclpp_export.export_plan` produces, so it never
refuses a program the exporter would accept:

* operations other than ``nop`` per primitive and copy: with the Simple protocol a receive is a
  ``wait`` and at least one ``copy``/``re``, a send at least one ``put``/``pwsf`` and, on a memory
  channel, a ``signal``, a local reduce at least one ``re``; with LL a receive is at least one packet
  operation and a send another unless it is fused into ``respkt``;
* a plan thread block holds at most ``max_operations``, so a program thread block of L such
  operations becomes at least ``ceil(L / max_operations)`` plan thread blocks, per instance;
* a rank's scratch buffer is the program's scratch, the LL reduce temporaries and one slot per
  received chunk: exactly what the exporter allocates, so the 32-bit offset bound is exact.
"""
from __future__ import annotations

import numpy as np

from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.interop.connections import connections
from hccc.compiler.interop.mscclpp_plan import BUFFER_ALIGNMENT, MAX_BYTE_OFFSET, PlanLimits
from hccc.compiler.ir.program_ir import Op, ProgramIR


def _table(pred) -> np.ndarray:
    return np.array([bool(pred(o)) for o in Op], dtype=bool)


_SENDS = _table(lambda o: o.sends)
_RECEIVES = _table(lambda o: o.receives)
_FUSED_LL = _table(lambda o: o in (Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND))


def largest_input(in_fine: int, end: int) -> int:
    """The largest input size (bytes) whose every byte offset into a buffer of ``end`` chunks fits
    the device plan's 32 bits, for ``in_fine`` input chunks (0: none)."""
    step = BUFFER_ALIGNMENT * in_fine
    return (MAX_BYTE_OFFSET * in_fine // end) // step * step


#: operations of the plan per send and per receive of a program's transfer, as the exporter writes
#: them for a program lowered connection by connection (:func:`hccc.compiler.passes.build.build_algorithm_level`):
#: the data operation and its ``wait`` or ``signal``, the ``nop`` between data operations and the
#: semaphores between the thread blocks a forwarded chunk crosses (which :func:`check_plan_fits`
#: does not count, so that its bound stays a bound). Measured on tree programs' plans: 12 V100s'
#: AllReduce (8,448 transfers, a connection per stream), 12 H20s' AllGather (4,224, a connection
#: per stream) and ReduceScatter (4,224, a connection per pair): at 6 and 6 the estimate misses the
#: exporter's thread blocks of some rank by up to 17, 0 and 4; at 7 and 6 it lies 5 to 22 above on
#: every rank of the three, so that a program the estimate accepts is one the exporter accepts
#: where the programs are alike (the exporter decides: ``hccc synth --for mscclpp`` exports the
#: program it keeps)
PLAN_OPS_PER_SEND = 7
PLAN_OPS_PER_RECEIVE = 6


def estimate_plan_blocks(src, dst, nodes: np.ndarray, lim: PlanLimits, channel=None) -> np.ndarray:
    """Every rank's plan thread blocks estimated for the program of the transfers ``src[i] ->
    dst[i]`` on channel ``channel[i]`` (None: one channel), Simple protocol, lowered one program
    thread block per connection end: a connection's ``c`` transfers (a pair's on one channel) are
    ``c`` sends at its sender and ``c`` receives at its receiver, of :data:`PLAN_OPS_PER_SEND` and
    :data:`PLAN_OPS_PER_RECEIVE` operations, each end cut into segments of at most
    ``max_operations``. An estimate (the exporter counts exactly), from the transfers alone, so a
    program is weighed before it is built."""
    R = int(np.asarray(nodes).size)
    out = np.zeros(R, np.int64)
    pair, c = connections(src, dst, channel, R)
    if not pair.size:
        return out
    m = int(lim.max_operations)
    out += np.bincount(pair // R, weights=-(-(PLAN_OPS_PER_SEND * c) // m), minlength=R).astype(np.int64)
    out += np.bincount(pair % R, weights=-(-(PLAN_OPS_PER_RECEIVE * c) // m), minlength=R).astype(np.int64)
    return out


def estimate_refusal(src, dst, lim: PlanLimits, *, nodes: np.ndarray, channel=None) -> str | None:
    """Why the plan of the transfers ``src[i] -> dst[i]`` (on channel ``channel[i]``) would have more
    thread blocks on a rank than ``lim.max_tbs`` by :func:`estimate_plan_blocks` (None: it would
    not). ``hccc synth --for mscclpp`` weighs its candidates so."""
    per_rank = estimate_plan_blocks(src, dst, nodes, lim, channel)
    if not per_rank.size:
        return None
    r = int(np.argmax(per_rank))
    if per_rank[r] <= lim.max_tbs:
        return None
    return (f"rank {r} would need about {int(per_rank[r])} thread blocks (its connections' operations cut "
            f"into segments of at most {lim.max_operations}, MAX_OPERATION), but at most {lim.max_tbs} can be "
            "resident at once")


def transfer_plan_blocks(src, dst, nodes: np.ndarray, lim: PlanLimits, *, channel=None, protocol: str = "Simple",
                         instances: int = 1, micro_batches: int = 1) -> np.ndarray:
    """Every rank's plan thread blocks counted from the transfers ``src[i] -> dst[i]`` on channel
    ``channel[i]`` (None: one channel) alone, as :func:`check_plan_fits` counts them on the program
    lowered connection by connection (:func:`hccc.compiler.passes.build.build_algorithm_level`,
    what ``hccc plan`` and ``hccc synth`` export): every transfer is a send primitive at its sender
    and a receive at its receiver (no fusion there), in the thread block of its connection end, one
    per (rank, peer, direction, channel); with the Simple protocol a send is at least one operation
    (two on a memory channel: same node) and a receive at least two, with LL one each; a thread
    block of ``L`` operations per copy is at least ``ceil(L x micro_batches / max_operations)`` plan
    thread blocks per instance. A lower bound on the count :func:`check_plan_fits` makes of the
    built program (the local copies and reductions it adds only add to it), so a rank over
    ``lim.max_tbs`` here is refused there, and nothing need be built to know it."""
    nodes = np.asarray(nodes, np.int64)
    R = int(nodes.size)
    src = np.asarray(src, np.int64)
    dst = np.asarray(dst, np.int64)
    moves = src != dst
    ch = None if channel is None else np.asarray(channel, np.int64)[moves]
    src, dst = src[moves], dst[moves]
    out = np.zeros(R, np.int64)
    if not src.size:
        return out
    m, M = int(lim.max_operations), int(micro_batches)
    if protocol == "LL":
        send_ops, recv_ops = np.ones(src.size, np.int64), np.ones(src.size, np.int64)
    else:
        send_ops = 1 + (nodes[src] == nodes[dst]).astype(np.int64)
        recv_ops = np.full(src.size, 2, np.int64)
    C = 1 if ch is None else int(ch.max()) + 1
    key = (src * R + dst) * C + (0 if ch is None else ch)
    ends, inv = np.unique(key, return_inverse=True)
    pair = ends // C
    for ops, rank in ((send_ops, pair // R), (recv_ops, pair % R)):
        L = np.bincount(inv, weights=ops, minlength=ends.size).astype(np.int64)
        segs = np.maximum(1, -(-(L * M) // m)) * int(instances)
        out += np.bincount(rank, weights=segs, minlength=R).astype(np.int64)
    return out


def check_transfers_fit(src, dst, lim: PlanLimits, *, nodes: np.ndarray, channel=None, protocol: str = "Simple",
                        instances: int = 1, micro_batches: int = 1) -> None:
    """Raise :class:`CompileError` where the plan of the transfers ``src[i] -> dst[i]`` (on channel
    ``channel[i]``), lowered connection by connection, certainly has more thread blocks on a rank
    than ``lim.max_tbs`` (:func:`transfer_plan_blocks`); return quietly otherwise. The MSCCL++
    plan's refusal from the transfer table, before anything is built, as the MSCCL XML's is
    (:func:`hccc.compiler.interop.msccl_limits.check_algorithm_fits`)."""
    per_rank = transfer_plan_blocks(src, dst, nodes, lim, channel=channel, protocol=protocol, instances=instances,
                                    micro_batches=micro_batches)
    if not per_rank.size:
        return
    r = int(np.argmax(per_rank))
    if per_rank[r] <= lim.max_tbs:
        return
    raise CompileError([Diagnostic(
        f"the program does not fit the MSCCL++ executor: rank {r} needs at least {int(per_rank[r])} thread blocks "
        f"(one per connection end, its operations cut into segments of at most {lim.max_operations}, "
        f"MAX_OPERATION" + (f", for {instances} instances" if instances > 1 else "")
        + f"), but at most {lim.max_tbs} can be resident at once (one 1,024-thread block per SM; the blocks of a "
        "rank wait on each other)", None)])


def check_plan_fits(ir: ProgramIR, lim: PlanLimits, *, nodes: np.ndarray, protocol: str = "Simple",
                    copies: int = 1, instances: int = 1) -> None:
    """Raise :class:`CompileError` naming the executor limits ``ir``'s plan must exceed with
    ``copies`` = instances x micro-batches copies of every primitive; return quietly when none is
    certain to be exceeded."""
    R = int(ir.nranks)
    if not R or not len(ir.prims["op"]):
        return
    op = np.asarray(ir.prims["op"], np.int64)
    rank = np.asarray(ir.prims["rank"], np.int64)
    tb = np.asarray(ir.prims["tb"], np.int64)
    count = np.asarray(ir.prims["count"], np.int64)
    sends, recvs = _SENDS[op], _RECEIVES[op]
    msgs: list[str] = []
    nodes = np.asarray(nodes, np.int64)
    # ---- operations (nop aside) per primitive copy
    if protocol == "LL":
        per = recvs.astype(np.int64) + (sends & ~(recvs & _FUSED_LL[op]))
    else:
        peer = np.where(sends, np.asarray(ir.prims["send_peer"], np.int64), rank)
        memory = sends & (nodes[rank] == nodes[np.clip(peer, 0, R - 1)])
        per = 2 * recvs + sends + memory
    per = per + (op == int(Op.REDUCE))
    ntb = int(tb.max()) + 1
    key = rank * ntb + tb
    used, first = np.unique(key, return_index=True)
    L = np.bincount(np.searchsorted(used, key), weights=per, minlength=len(used)).astype(np.int64) * int(copies // instances)
    segs = np.maximum(1, -(-L // lim.max_operations)) * int(instances)
    per_rank = np.bincount(used // ntb, weights=segs, minlength=R).astype(np.int64)
    r = int(np.argmax(per_rank))
    if per_rank[r] > lim.max_tbs:
        w = int(np.argmax(np.where(used // ntb == r, L, -1)))
        msgs.append(f"rank {r} needs at least {int(per_rank[r])} thread blocks ({int((used // ntb == r).sum())} "
                    f"program thread blocks" + (f" for {instances} instances" if instances > 1 else "")
                    + f"; thread block {int(used[w] % ntb)} alone has at least {int(L[w])} operations, cut into "
                    f"segments of at most {lim.max_operations}, MAX_OPERATION), but at most {lim.max_tbs} can be "
                    f"resident at once (one 1,024-thread block per SM; the blocks of a rank wait on each other)")
    # ---- scratch: the program's, LL reduce temporaries, one slot per received chunk (exact)
    slots = np.bincount(rank, weights=count * recvs, minlength=R).astype(np.int64)
    if protocol == "LL":
        slots += np.bincount(rank, weights=count * (op == int(Op.RECV_REDUCE_SEND)), minlength=R).astype(np.int64)
    scratch = (int(ir.scratch_chunks) + slots) * int(copies) * (2 if protocol == "LL" else 1)
    end = max(int(scratch.max()), int(ir.in_chunks) * copies, int(ir.out_chunks) * copies, 1)
    in_fine = int(ir.in_chunks) * int(copies)
    if largest_input(in_fine, end) < BUFFER_ALIGNMENT * in_fine:
        r = int(np.argmax(scratch))
        where = (f"rank {r}'s scratch buffer ({int(scratch[r])} chunks)" if scratch[r] == end
                 else f"the input/output buffers ({end} chunks)")
        msgs.append(f"{where} does not fit 32-bit byte offsets even at the smallest message size")
    if msgs:
        raise CompileError([Diagnostic("the program does not fit the MSCCL++ executor: " + m, None) for m in msgs])


__all__ = ["PLAN_OPS_PER_RECEIVE", "PLAN_OPS_PER_SEND", "check_plan_fits", "check_transfers_fit", "estimate_plan_blocks",
           "estimate_refusal", "largest_input", "transfer_plan_blocks"]
