"""MSCCL++ execution plan -> ProgramIR, proven to implement its collective (like an imported XML).

The plan's data movement becomes hccc's primitives (see :mod:`hccc.compiler.interop.mscclpp_plan`
for the format):

* a ``put`` (``pws``, ``pwsf``, the remote outputs of ``res``/``rres``) from rank A into rank B's
  buffer is a SEND on A where it runs and a RECV on B into the region it names, placed where B
  learns of it: B's wait that matches the signal following the put on A's channel (the ``k``-th
  signal on a channel is the ``k``-th wait on its partner: channels pair up in order per peer);
* a read of B's buffer (``get``, the remote inputs of ``rre``/``rres``) is a SEND on B at the
  signal matching the reader's latest wait towards B, and a receive on the reader where it reads;
* packets (``ppkt``, the remote outputs of ``respkt``) are received where B reads the packet region
  (``upkt``, ``repkt``, ``respkt``): the flags are the synchronisation;
* local ``copy`` and ``re`` are COPY and REDUCE (``re`` of two regions into a third: a COPY then a
  REDUCE); a received slot read once by the next operation of the block is received into its
  final place (RECV into the copy's target, RECV_REDUCE_COPY for a reduction), as hccc's kernels
  receive;
* device semaphores (the ``k``-th acquire after the ``k``-th release), barriers and the chain of
  operations in a thread block carry the order; a ``pipeline`` runs its body once over the whole
  ranges (its iterations cut the same elements the same way in every operation of the body; where
  pipelined operations of two blocks share scratch bytes they must be cut alike, see
  :func:`hccc.compiler.interop.mscclpp_sync.check_pipeline_iterations`).

The result is checked like an imported XML: structure, deadlock freedom, the collective's
postcondition (:func:`hccc.compiler.ir.symbolic.prove`) in the placement the plan declares, every
access in bounds. Writes into a peer are modelled where the peer synchronises on them: a plan
that writes into a region its peer still reads (a race in the plan) is not detected. Refused with a
located reason: collectives hccc has no plan form of, channels shared by thread blocks that may
run at once, signals nobody waits for, puts nothing announces (docs/mscclpp.md lists them).

Switch (NVLS) operations (``glres``, ``gstore``, ``gstorepkt``) are rewritten, as each thread block
is read, into the memory-channel operations above that do the same on every member's copy of the
buffer (:mod:`hccc.compiler.interop.mscclpp_switch`), with remote buffers of their own; a block
that acquires a semaphore another block releases may read the peers that block waited for.

The import runs in phases, each in its own module, each handing the next what it found:

1. :mod:`~hccc.compiler.interop.mscclpp_layout`: the plan's declarations (collective, protocol,
   GPUs and buffers, channels paired end to end, remote buffers) as a ``PlanLayout``;
2. :mod:`~hccc.compiler.interop.mscclpp_blocks`: every thread block's operations, each read once
   through :meth:`~hccc.compiler.interop.mscclpp_ops.PlanOp.from_dict` into a
   :class:`~hccc.compiler.interop.mscclpp_ops.BlockOp`;
3. :mod:`~hccc.compiler.interop.mscclpp_sync`: the executor's synchronisation run on them;
4. :mod:`~hccc.compiler.interop.mscclpp_flow`: where data goes (sends, signal groups, packet
   regions, remote reads);
5. :mod:`~hccc.compiler.interop.mscclpp_rows` (with :mod:`~hccc.compiler.interop.mscclpp_order`):
   the rows of every block in order and the dependencies its synchronisation carries;
6. here: the ProgramIR, proven (located messages through
   :mod:`~hccc.compiler.interop.mscclpp_locate`; a race on bytes a thread-block group moves named
   in the plan's chunks with the executor's lines that make it one,
   :mod:`~hccc.compiler.interop.mscclpp_groups`).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from hccc.util.diagnostics import CompileError, Diagnostic, SourceFile
from hccc.compiler.interop.mscclpp_blocks import PlanBlocks, read_blocks
from hccc.compiler.interop.mscclpp_flow import Connections, trace_data
from hccc.compiler.interop.mscclpp_groups import describe_part, explain_group_race, uneven_groups_note
from hccc.compiler.interop.mscclpp_layout import PlanLayout, node_size, read_layout
from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.interop.mscclpp_rows import RowTable, write_rows
from hccc.compiler.interop.mscclpp_sync import (check_counts, check_next_call, check_pipeline_iterations,
                                                check_races)
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Allocation, Buf, IRFormatError, Origin, ProgramIR


def import_plan(path: str | Path) -> ProgramIR:
    """Read an MSCCL++ execution plan as a ProgramIR proven to implement its collective; bad input is
    a :class:`CompileError` located in the file."""
    src = SourceFile.read(path)
    from hccc.util.limits import loads_json
    return import_plan_obj(loads_json(src), src)


def import_plan_text(text: str, name: str = "<input>") -> ProgramIR:
    from hccc.util.limits import loads_json
    src = SourceFile(name, text)
    return import_plan_obj(loads_json(src), src)


def import_plan_obj(plan: dict, src: SourceFile) -> ProgramIR:
    rd = PlanReader(src)
    layout = read_layout(rd, plan)
    gpus = plan["gpus"]
    blocks = read_blocks(rd, layout, gpus)
    check_synchronisation(rd, layout, blocks)
    conns = Connections()
    flow = trace_data(rd, layout, blocks, conns)
    table, deps = write_rows(rd, layout, blocks, flow, conns, gpus)
    del flow, conns
    ir, order = _program(plan, layout, blocks, table, deps)
    # the proof needs the program and the rows' messages only: what found them is let go before it
    # (a record per operation and transfer, as much again as the proof at half a million
    # transfers), the blocks kept only to explain a race of a thread-block group's parts
    del deps
    if layout.F == 1:
        blocks = None
    return _checked(rd, layout, blocks, table, ir, order)


def check_synchronisation(rd: PlanReader, layout: PlanLayout, blocks: PlanBlocks) -> None:
    """The executor's synchronisation (:mod:`hccc.compiler.interop.mscclpp_sync`): no block races
    inside, every wait satisfied, no deadlock, the next call and pipeline iterations ordered."""
    def is_scratch(b):
        return b == Buf.SCRATCH
    check_races(blocks.tbs, layout.region, rd.err)
    order: list = []
    check_counts(blocks.tbs, layout.pair, layout.chans, layout.region, blocks.sem_init, rd.err, order)
    check_next_call(blocks.tbs, order, layout.region, is_scratch, layout.double, rd.err)
    check_pipeline_iterations(blocks.tbs, blocks.pipelines, layout.region, is_scratch, rd.err)


def _program(plan: dict, layout: PlanLayout, blocks: PlanBlocks, table: RowTable, deps: list):
    """The rows and dependencies as a ProgramIR in canonical order, with the plan's statistics, and
    which row of the table each of its primitives is."""
    R = layout.R
    dp = [a for a, _ in deps]
    do = [b for _, b in deps]
    rows_arr = table.array()
    N = len(rows_arr)
    rank, tb = rows_arr[:, 0], rows_arr[:, 1]
    # a row's place in its block: its rank among the block's rows in the order they were made
    by_block = np.lexsort((np.arange(N), tb, rank))
    new_block = np.ones(N, bool)
    new_block[1:] = (rank[by_block][1:] != rank[by_block][:-1]) | (tb[by_block][1:] != tb[by_block][:-1])
    starts = np.maximum.accumulate(np.where(new_block, np.arange(N), 0))
    seq = np.empty(N, np.int64)
    seq[by_block] = np.arange(N) - starts
    cols = {"rank": rank, "tb": tb, "seq": seq, "pipeline": np.zeros(N), "op": rows_arr[:, 2],
            "send_peer": rows_arr[:, 3], "recv_peer": rows_arr[:, 4], "channel": rows_arr[:, 5],
            "src_buf": rows_arr[:, 6], "src_off": rows_arr[:, 7], "dst_buf": rows_arr[:, 8],
            "dst_off": rows_arr[:, 9], "count": rows_arr[:, 10], "task": np.full(N, -1), "task2": np.full(N, -1)}
    # no task ids: a plan's messages are matched by their order on a connection, and a send and
    # its receive are different rows (ids per row made every matched pair disagree once written)
    cols = {k: np.asarray(v).astype(PRIM_COLUMNS[k]) for k, v in cols.items()}
    ntbs = np.zeros(R, np.int32)
    for r, ti, _ in blocks.tbs:
        ntbs[r] = max(ntbs[r], ti + 1)
    from hccc.compiler.passes.build import sanitize_identifier
    parts = SPECS[layout.coll].parts_in_full(R)
    ir = ProgramIR(name=sanitize_identifier(str(plan.get("name", "mscclpp_plan"))[:64] or "mscclpp_plan"),
                   collective=layout.coll, nranks=R, nchunks=layout.C * layout.F, in_chunks=layout.ic * layout.F,
                   out_chunks=layout.oc * layout.F, scratch_chunks=max(layout.scratch) * layout.F + layout.PK,
                   prims=cols, dep_prim=np.asarray(dp, np.int64),
                   dep_on=np.asarray(do, np.int64), npipelines=1, ntbs=ntbs,
                   stats={"transfers": int((cols["send_peer"] >= 0).sum())},
                   allocation=Allocation(tbs_per_rank_max=int(ntbs.max()), tbs_connection_based=int(ntbs.sum()),
                                         tbs_state_based=int(ntbs.sum())))
    notes = [layout.served[2]] if layout.served[2] else []
    if layout.uneven:
        notes.append(uneven_groups_note(layout.F))
    ir.origin = Origin(source="mscclpp-plan", proto=layout.proto, inplace=layout.inplace, outofplace=not layout.inplace,
                       # hccc's full-buffer bytes: a plan's message is a SendRecv rank's part
                       min_bytes=layout.served[0] * parts,
                       # (0: no bound; stats hold 64-bit integers, a plan's bound is uint64)
                       max_bytes=min(layout.served[1] * parts, (1 << 63) - 1)
                       if "max_message_size" in plan or layout.served[2] else 0,
                       note="; ".join(notes) if notes else None, gpus_per_node=node_size(layout) or None)
    ir.sort_canonical()
    return ir, np.lexsort((seq, tb, rank))


def _checked(rd: PlanReader, layout: PlanLayout, blocks: PlanBlocks | None, table: RowTable, ir: ProgramIR,
             order) -> ProgramIR:
    """``ir`` checked like an imported XML (structure, deadlock freedom, the collective's
    postcondition, every access in bounds), each refusal located at its operation (a race on bytes
    a thread-block group moves in the plan's chunks, with the executor's lines that make it one)."""
    from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_fifo_order, check_structure
    from hccc.compiler.ir.extents import ExtentError, check_extents
    from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered, prove
    def describe(i):
        return table.describe(int(order[i]))

    def fail(exc, prefix=""):
        at = table.path(int(order[exc.prims[0]])) if getattr(exc, "prims", None) else ()
        text = str(exc)
        if getattr(exc, "kind", None) == "race" and exc.slot is not None and layout.F > 1:
            text = _group_race(layout, blocks, ir, exc.slot, text)
        raise CompileError([Diagnostic(prefix + text, rd.loc(at))]) from None

    try:
        check_structure(ir)
        check_fifo_order(ir)         # what reading the program back from its .ir.json checks too
    except IRFormatError as exc:
        raise CompileError([Diagnostic(f"the plan is not a well-formed program: {exc}", rd.loc(()))]) from None
    try:
        check_deadlock_buffered(ir, None, describe)
    except ProofError as exc:
        fail(exc)
    try:
        check_deadlock(ir)
        ir.origin = replace(ir.origin, execution="task")
    except DeadlockError:
        ir.origin = replace(ir.origin, execution="algorithm")
    if SPECS[ir.collective].parameter == "shift":
        ir.root = shift_of(ir, layout.inplace)
    try:
        prove(ir, layout.inplace, describe)
    except ProofError as exc:
        fail(exc, f"the plan does not implement {layout.coll}: ")
    try:
        check_extents(ir, describe)
    except ExtentError as exc:
        fail(exc)
    return ir


def _group_race(layout: PlanLayout, blocks: PlanBlocks, ir: ProgramIR, slot: int, text: str) -> str:
    """A race message of a plan with thread-block groups: its slot named in the plan's chunks (and
    the part of one), and, when operations of a group move those bytes, which ones and the
    executor's lines that make it a race (:func:`~hccc.compiler.interop.mscclpp_groups.explain_group_race`)."""
    from hccc.compiler.ir.symbolic import Slots
    slots = Slots(ir, layout.inplace)
    name = slots.name(slot)
    head, _, num = name.rpartition("chunk ")
    if not (head.endswith("scratch ") and int(num) >= layout.PK > 0):     # not an LL packet slot
        text = text.replace(f"data race on {name}", f"data race on {head}{describe_part(int(num), layout.F)}", 1)
    accesses = []
    for r, ti, ops in blocks.tbs:
        for p, op in ops:
            for side, verb, refs in (("src_buff", "reads", op.src), ("dst_buff", "writes", op.dst)):
                for j, ref in enumerate(refs):
                    owner, buf, lo, n = layout.region(op, ref, p + (side, j), r)
                    first = int(slots.phys(owner, int(buf), lo))
                    accesses.append((f"rank {r} thread block {ti}'s {op.switch or op.name} {verb}",
                                     first, first + n, ref.index, ref.size, op.tbg))
    return text + (explain_group_race(slot, accesses) or "")


def shift_of(ir: ProgramIR, inplace: bool) -> int:
    """A SendRecv plan's shift, which the plan does not write: where rank 0's part ends, read from
    a symbolic run of the program (``(r - owner) % N`` for the part rank ``r``'s first output
    chunk ends with; MSCCL++'s default, 1, where that chunk ends empty). The proof that follows
    checks every rank against it, so a plan whose ranks disagree is refused there, located."""
    from hccc.compiler.ir.symbolic import simulate
    val, _, slots = simulate(ir, inplace)
    N, K = ir.nranks, max(1, ir.nchunks // max(1, ir.nranks))
    for r in range(N):
        got = val[int(slots.phys(np.array([r]), np.array([int(Buf.OUTPUT)]), np.array([0]))[0])]
        if isinstance(got, tuple):
            return (r - got[0] // K) % N
    return 1 % N


__all__ = ["import_plan", "import_plan_text", "import_plan_obj", "check_synchronisation", "shift_of"]
