"""Every thread block of an MSCCL++ plan read into its operations, in the order they run.

Each operation is read once, through :meth:`~hccc.compiler.interop.mscclpp_ops.PlanOp.from_dict`,
into a :class:`~hccc.compiler.interop.mscclpp_ops.BlockOp` resolved against its block's channel and
remote-buffer tables (rank-level channel ids). A ``pipeline``'s body stands in place of the
pipeline (it runs once over the whole ranges); switch (NVLS) operations are rewritten into the
memory-channel operations that do the same (:mod:`hccc.compiler.interop.mscclpp_switch`). A channel
end several blocks use must be handed from one to the next by a semaphore chain.

A run of plain ``nop``\\ s (``{"name": "nop"}``, one after another in one list of operations) is read
as its first: a ``nop`` is the block's ``__syncthreads()``, and a second one right after it orders
nothing more. So a plan's ``nop``\\ s cost the reader one comparison each and the later phases
nothing (a plan of millions of them is read in seconds; the positions the messages name,
``operation k``, count the run as one operation).
"""
from __future__ import annotations

from dataclasses import dataclass

from hccc.compiler.interop.mscclpp_groups import pipeline_past_part
from hccc.compiler.interop.mscclpp_layout import PlanLayout
from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.interop.mscclpp_operands import check_operation, check_thread_block, semaphore_inits
from hccc.compiler.interop.mscclpp_ops import NOP, BlockOp, PlanOp
from hccc.compiler.interop.mscclpp_plan import (EXECUTOR_COMMIT, MAX_PLAN_WORK, OP_NAMES, PACKET_HANDLER_LINES,
                                                PACKET_OPS)
from hccc.compiler.interop.mscclpp_switch import SWITCH_OPS


def _plain_nop(op) -> bool:
    """Whether an operation object is a ``nop`` with no other field (read without checks)."""
    return isinstance(op, dict) and len(op) == 1 and op.get("name") == "nop"


#: operations that count on a channel end (signals raise the partner's count, waits consume)
_CHANNEL_SYNC = ("signal", "wait", "rlxsignal", "rlxwait", "pws", "pwsf")


@dataclass
class PlanBlocks:
    """The plan's thread blocks as read."""
    tbs: list                      # [(rank, tb id, [(path, BlockOp)])], ranks and blocks in order
    tb_chans: dict                 # (rank, tb) -> channel type -> the block's channels (rank-level ids)
    sem_init: list                 # rank -> the declared initial value of each semaphore
    pipelines: dict                # a pipeline's path -> (unit_size, num_chunks) of its iterations


def read_blocks(rd: PlanReader, layout: PlanLayout, gpus: list) -> PlanBlocks:
    """Every thread block of every rank, then the channel ends several blocks share checked."""
    reader = _BlockReader(rd, layout, [semaphore_inits(g, ("gpus", r), rd.err) for r, g in enumerate(gpus)])
    for r, g in enumerate(gpus):
        for ti, tb in enumerate(rd.get(g, "threadblocks", ("gpus", r), list)):
            reader.block(r, ti, tb)
    reader.check_shared_ends()
    return PlanBlocks(reader.tbs, reader.tb_chans, reader.sem_init, reader.pipelines)


class _BlockReader:
    """Reads thread blocks one by one, keeping what the check of shared channel ends needs."""

    def __init__(self, rd: PlanReader, layout: PlanLayout, sem_init: list):
        self.rd, self.layout, self.sem_init = rd, layout, sem_init
        self.tbs: list = []
        self.tb_chans: dict = {}
        self.pipelines: dict = {}
        self.owner: dict = {}             # (rank, type, channel, waits) -> [(tb, path)] using that channel end
        self.chain_in: dict = {}          # (rank, semaphore) -> the block starting by acquiring it
        self.chain_out: dict = {}         # (rank, tb) -> the semaphores the block ends by releasing
        self.work = 0                     # operations and buffers they name so far (MAX_PLAN_WORK)

    def check_shared_ends(self) -> None:
        """A channel end used by several thread blocks: they must run one after the other (each
        starting on a semaphore the one before releases as its last operation), in id order."""
        for (r, t, c, waits), users in self.owner.items():
            for (a, _), (b, p) in zip(users, users[1:]):
                if b not in {self.chain_in.get((r, sid)) for sid in self.chain_out.get((r, a), [])}:
                    raise self.rd.err(p, f"{t} channel {c} of rank {r} is used by thread blocks {a} and {b}, "
                                         f"which may run at the same time: the order of its signals is not fixed")

    def operation(self, r, op, p):
        """Operation object ``op`` at ``p`` of rank ``r`` as a :class:`PlanOp` (``"pipeline"`` for
        a pipeline, its body read by the caller); what hccc does not model is refused."""
        rd = self.rd
        name = rd.get(op, "name", p, str)
        if name not in OP_NAMES:
            raise rd.err(p + ("name",), f"invalid operation type '{name}'")
        if name in SWITCH_OPS:
            return name               # rewritten by the caller (mscclpp_switch)
        if name == "pipeline":
            check_operation(op, p, rd.err, len(self.sem_init[r]))
            return name
        return PlanOp.from_dict(op, p, rd.err, len(self.sem_init[r]))

    def read_list(self, objs, base: tuple, read) -> list:
        """``read(path, object)`` of each operation object of the list ``objs`` at ``base`` (each a
        list of ``(path, PlanOp, table)``), a run of plain ``nop``\\ s read as its first."""
        out: list = []
        after_nop = False
        for k, o in enumerate(objs):
            if _plain_nop(o):
                if not after_nop:
                    out.extend(self.counted(base + (k,), [(base + (k,), NOP, None)]))
                after_nop = True
                continue
            after_nop = False
            out.extend(read(base + (k,), o))
        return out

    def counted(self, p, ops: list) -> list:
        """``ops``, read at ``p``, counted against :data:`MAX_PLAN_WORK`: one each and one per
        buffer each names."""
        self.work += sum(1 + len(op.src or ()) + len(op.dst or ()) for _, op, _ in ops)
        if self.work > MAX_PLAN_WORK:
            raise self.rd.err(p, f"the plan's operations and the buffers they name pass {MAX_PLAN_WORK:,} "
                                 "(MAX_PLAN_WORK: an operation counts one and one per buffer it names, a switch "
                                 "operation as the memory-channel operation it becomes, which names every member's "
                                 "buffer, a run of nops as one): more than hccc checks a plan with "
                                 "(docs/files-and-limits.md)")
        return ops

    def expand(self, r, o, p, tb_switch):
        """One operation as ``[(path, PlanOp, remote-buffer table or None)]``: a switch operation
        as the memory-channel operations it is rewritten into (with their own table)."""
        parsed = self.operation(r, o, p)
        if parsed in SWITCH_OPS:
            out = [(p, x, table) for x, table in self.layout.switch.expand(r, o, p, tb_switch, self.layout.rbufs[r])]
        else:
            out = [(p, parsed, None)]
        return self.counted(p, out)

    def block_ops(self, r, tb, base) -> list[tuple[tuple, PlanOp, dict | None]]:
        """A thread block's operations in order, with their paths (and the remote-buffer table of
        an operation a switch operation was rewritten into, ``None`` for the block's own); a
        pipeline's body in place of the pipeline (it runs once over the whole ranges)."""
        # the block's switch channels (the loader concatenates every entry of that type)
        tb_switch = [c for e in tb.get("channels", []) if e.get("channel_type") == "switch"
                     for c in e.get("channel_ids", [])]
        def read(p, op):
            if isinstance(op, dict) and op.get("name") == "pipeline":
                return self.pipeline_body(r, op, p, tb_switch)
            return self.expand(r, op, p, tb_switch)
        return self.read_list(self.rd.get(tb, "ops", base, list), base + ("ops",), read)

    def pipeline_body(self, r, op, p, tb_switch):
        """A pipeline's operations, which must all move the sizes its iterations cut."""
        rd = self.rd
        self.operation(r, op, p)
        self.pipelines[p] = (op["iter_context"]["unit_size"], op["iter_context"]["num_chunks"])
        def read(q, o):
            if isinstance(o, dict) and o.get("name") == "pipeline":
                raise rd.err(q, "a pipeline inside a pipeline")
            if isinstance(o, dict) and o.get("name") in PACKET_OPS:
                raise rd.err(q + ("name",),
                             f"'{o['name']}' inside a pipeline: the executor runs a packet operation whole "
                             f"in every iteration (its handler takes no iteration offset: "
                             f"{PACKET_HANDLER_LINES} at MSCCL++ {EXECUTOR_COMMIT}), which hccc does not "
                             f"model; move it out of the pipeline")
            return self.expand(r, o, q, tb_switch)
        inner = self.read_list(op["ops"], p + ("ops",), read)
        sizes = {ref.size for _, o, _ in inner for ref in (o.src or ()) + (o.dst or ())}
        if len(sizes) > 1:
            raise rd.err(p, "a pipeline whose operations move different sizes: its iterations "
                            "would cut different elements in different operations")
        if sizes and sizes != {op["iter_context"]["num_chunks"]}:
            raise rd.err(p + ("iter_context", "num_chunks"),
                         f"a pipeline over {op['iter_context']['num_chunks']} chunks whose operations move "
                         f"{sizes.pop()}: its iterations would not cover its operations' ranges exactly")
        lay = self.layout
        largest_chunk = lay.served[1] // (lay.oc if lay.coll == "allgather" else lay.ic)
        for q, o, _ in inner:
            if o.tbg and o.tbg[1] > 1:
                why = pipeline_past_part(op["iter_context"]["num_chunks"], op["iter_context"]["unit_size"],
                                         largest_chunk)
                if why:
                    raise rd.err(q + ("tbg_info",), why)
        return inner

    def block(self, r, ti, tb):
        """Thread block ``ti`` of rank ``r``: its operations resolved against its channel and
        remote-buffer tables, the channel ends it uses, the semaphores that chain it."""
        rd = self.rd
        base = ("gpus", r, "threadblocks", ti)
        tid = rd.get(tb, "id", base, int)
        if tid != ti:
            raise rd.err(base + ("id",), f"thread block {ti} has id {tid}")
        check_thread_block(tb, base, rd.err)
        tch = {c["channel_type"]: c["channel_ids"] for c in tb.get("channels", [])}
        self.tb_chans[(r, ti)] = tch
        trb = {c["access_channel_type"]: c["remote_buffer_ids"] for c in tb.get("remote_buffer_refs", [])}
        resolved = []
        for p, op, table in self.block_ops(r, tb, base):
            t = op.channel_type or "memory"
            if t == "switch":
                raise rd.err(p, f"'{op.name}' does not work over a switch channel (only glres, gstore and "
                                f"gstorepkt do)")
            ids = self.channel_ids(r, ti, p, op, t, tch, base)
            resolved.append((p, BlockOp(op, p, t, tuple(ids), trb if table is None else table)))
        self.tbs.append((r, ti, resolved))
        if resolved and resolved[0][1].name == "sem_acquire":
            for sid in resolved[0][1].semaphore_ids:
                self.chain_in[(r, sid)] = ti
        if resolved and resolved[-1][1].name == "sem_release":
            self.chain_out[(r, ti)] = resolved[-1][1].semaphore_ids

    def channel_ids(self, r, ti, p, op, t, tch, base) -> list[int]:
        """The rank-level ids of the channels an operation names (block-level ids), noting the
        channel ends it signals or waits on."""
        ids = []
        for c in op.channel_ids or ():
            if t not in tch or not isinstance(c, int) or not 0 <= c < len(tch[t]):
                raise self.rd.err(p + ("channel_ids",), "channel id beyond the thread block's channels")
            g_c = tch[t][c]
            if not 0 <= g_c < len(self.layout.chans[r][t]):
                raise self.rd.err(base + ("channels",), "channel id beyond the gpu's channels")
            if g_c in ids:
                # as one channel named twice (mscclpp_operands): thread t works on the t-th channel
                first = op.channel_ids[ids.index(g_c)]
                raise self.rd.err(p + ("channel_ids",), f"'{op.name}' names channels {first} and {c} of its "
                                  f"thread block, which are both the rank's {t} channel {g_c}: the executor's "
                                  "threads would signal or wait on it at the same time (a race on its counts)")
            ids.append(g_c)
            if op.name in _CHANNEL_SYNC:
                users = self.owner.setdefault((r, t, g_c, op.name in ("wait", "rlxwait")), [])
                if ti not in (u for u, _ in users):
                    users.append((ti, p))
        return ids


__all__ = ["PlanBlocks", "read_blocks"]
