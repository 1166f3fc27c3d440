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

Each operation is read once, through :meth:`~hccc.compiler.interop.mscclpp_ops.PlanOp.from_dict`,
into a :class:`~hccc.compiler.interop.mscclpp_ops.BlockOp` (:meth:`_Importer._scan`); the passes
after it (:meth:`_Importer._build`: where data goes, then the rows of every block in order) and the
checks of :mod:`hccc.compiler.interop.mscclpp_sync` read only those values.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

import numpy as np

from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.interop.mscclpp_operands import check_operation, check_thread_block, semaphore_inits
from hccc.compiler.interop.mscclpp_ops import BlockOp, PlanOp
from hccc.compiler.interop.mscclpp_plan import (BUF_OF_LETTER, BUFFER_ALIGNMENT, COLLECTIVES, MAX_PLAN_SLOTS, NO_MAX_SIZE,
                                                MAX_GROUP_PARTS, OP_NAMES, SHARED_SCRATCH_BYTES)
from hccc.compiler.interop.mscclpp_switch import SWITCH_OPS, SwitchChannels
from hccc.compiler.interop.mscclpp_sync import (check_counts, check_next_call, check_pipeline_iterations,
                                                check_races)
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, IRFormatError, Op, ProgramIR

#: operations that read packets from the rank's own scratch (which sources: from this one on)
_PACKET_READS = {"upkt": 0, "repkt": 1, "respkt": 1, "recpkt": 1, "recspkt": 1, "rppkt": 0}


# ---------------------------------------------------------------------------------------- locations
class _Found(Exception):
    pass


def _positions(text: str, target: tuple | None = None) -> dict[tuple, int]:
    """Offset of every JSON value by its path (keys and indices), for located messages; with a
    ``target`` path, only up to that value (a message about the start of a large plan is found
    without reading the rest)."""
    pos: dict[tuple, int] = {}
    n = len(text)

    def ws(i):
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    def string(i):
        i += 1
        out = []
        while text[i] != '"':
            if text[i] == "\\":
                out.append(text[i:i + 2])
                i += 2
            else:
                out.append(text[i])
                i += 1
        return "".join(out), i + 1

    def value(i, path):
        i = ws(i)
        pos[path] = i
        if path == target:
            raise _Found
        c = text[i]
        if c == "{":
            i = ws(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                k, i = string(ws(i))
                i = ws(i)
                i = value(i + 1, path + (k,))
                i = ws(i)
                if text[i] == "}":
                    return i + 1
                i += 1
        if c == "[":
            i = ws(i + 1)
            if text[i] == "]":
                return i + 1
            k = 0
            while True:
                i = value(i, path + (k,))
                k += 1
                i = ws(i)
                if text[i] == "]":
                    return i + 1
                i += 1
        if c == '"':
            return string(i)[1]
        while i < n and text[i] not in ",]} \t\r\n":
            i += 1
        return i

    try:
        value(0, ())
    except (IndexError, RecursionError, _Found):
        pass
    return pos


class _Reader:
    def __init__(self, src: SourceFile):
        self.src = src
        self._pos = None

    def loc(self, path: tuple) -> Location:
        p = tuple(path)
        if self._pos is None:
            early = _positions(self.src.text, p)          # read only up to the value itself
            if p in early:
                if self.src.text.startswith("{", early[p]):    # an operation: point at its name
                    named = _positions(self.src.text, p + ("name",))
                    if p + ("name",) in named:
                        return self._offset(named[p + ("name",)])
                return self._offset(early[p])
            self._pos = _positions(self.src.text)
        while p and p not in self._pos:
            p = p[:-1]
        if p + ("name",) in self._pos:       # an operation: point at its name
            p = p + ("name",)
        return self._offset(self._pos.get(p, 0))

    def _offset(self, off: int) -> Location:
        line = self.src.text.count("\n", 0, off) + 1
        col = off - (self.src.text.rfind("\n", 0, off) + 1) + 1
        return Location(self.src, line, col)

    def err(self, path, msg: str) -> CompileError:
        return CompileError([Diagnostic(msg, self.loc(path))])

    def get(self, obj, key, path, kind=None):
        if not isinstance(obj, dict) or key not in obj:
            raise self.err(path, f"missing '{key}'")
        v = obj[key]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise self.err(path + (key,), f"'{key}' must be a non-negative integer")
        if kind is list and not isinstance(v, list):
            raise self.err(path + (key,), f"'{key}' must be a list")
        if kind is str and not isinstance(v, str):
            raise self.err(path + (key,), f"'{key}' must be a string")
        return v


# ---------------------------------------------------------------------------------------- import
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
    return _Importer(_Reader(src), plan).run()


class _Importer:
    def __init__(self, rd: _Reader, plan: dict):
        self.rd = rd
        self.plan = plan

    # -- reading
    def run(self) -> ProgramIR:
        rd, plan = self.rd, self.plan
        coll, proto, inplace, reuse, double = self._flags()
        gpus = rd.get(plan, "gpus", (), list)
        R = len(gpus)
        if R < 1:
            raise rd.err(("gpus",), "no gpus")
        self.R = R
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
        #: every chunk is cut into F parts, so that a thread-block group's share of a range is whole parts
        self.F = self._refinement(gpus)
        # the sizes the plan declares, bounded before anything is built from them
        big = max(range(R), key=lambda r: gpus[r]["scratch_chunks"])
        sc = gpus[big]["scratch_chunks"] * (2 if proto == "LL" else 1)
        slots = R * (ic + oc + sc) * self.F
        if slots > MAX_PLAN_SLOTS:
            at = ("gpus", big, "scratch_chunks") if sc > ic + oc else ("gpus", 0, "output_chunks" if oc > ic else
                                                                         "input_chunks")
            raise rd.err(at, f"the plan declares {R} ranks x ({ic} input + {oc} output + {sc} scratch"
                             + (" (LL: twice)" if proto == "LL" else "") + " chunks)"
                             + (f" x {self.F} parts (thread-block groups)" if self.F > 1 else "")
                             + f" = {slots:,} chunk slots: more "
                             f"than the {MAX_PLAN_SLOTS:,} hccc checks a plan with (docs/files-and-limits.md)")
        C = {"allgather": oc, "reducescatter": ic}.get(coll, ic)
        ok = {"allgather": oc == R * ic, "reducescatter": ic == R * oc, "allreduce": ic == oc,
              "alltoall": ic == oc and ic % R == 0}[coll]
        if not ok or ic < 1 or oc < 1:
            raise rd.err(("gpus", 0, "input_chunks"), f"{coll} on {R} ranks with {ic} input and {oc} output "
                                                      f"chunks: the chunk counts do not fit the collective")
        self.coll, self.proto, self.inplace, self.double = coll, proto, inplace, double
        self.served = self._served_sizes(plan, reuse, double, ic, oc, max(g["scratch_chunks"] for g in gpus))
        self.ic, self.oc, self.C = ic, oc, C
        self.scratch = [g["scratch_chunks"] for g in gpus]
        #: packets of a rank's own scratch region q live in ProgramIR scratch slot PK + q
        self.PK = max(self.scratch) * self.F if proto == "LL" else 0
        self._channels(gpus)
        self._scan(gpus)
        return self._build(plan)

    def _flags(self) -> tuple[str, str, bool, bool, bool]:
        """The plan's collective, protocol, ``inplace``, ``reuse_resources`` and
        ``use_double_scratch_buffer``, each checked."""
        rd, plan = self.rd, self.plan
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
        return coll, proto, inplace, reuse, double

    def _refinement(self, gpus) -> int:
        """The least common multiple of the plan's thread-block group sizes (1: none), bounded by
        :data:`MAX_GROUP_PARTS`; every operation's ``tbg_info`` checked on the way."""
        rd = self.rd
        F = 1
        for r, g in enumerate(gpus):
            tbs = g.get("threadblocks")
            for ti, tb in enumerate(tbs if isinstance(tbs, list) else ()):
                ops = tb.get("ops") if isinstance(tb, dict) else None
                todo = [(("gpus", r, "threadblocks", ti, "ops", k), o)
                        for k, o in enumerate(ops if isinstance(ops, list) else ())]
                while todo:
                    p, op = todo.pop()
                    if not isinstance(op, dict):
                        continue
                    if isinstance(op.get("ops"), list):
                        todo.extend((p + ("ops", j), o) for j, o in enumerate(op["ops"]))
                    if "tbg_info" not in op:
                        continue
                    info = op["tbg_info"]
                    if not isinstance(info, dict) or not all(isinstance(info.get(k), int) and not isinstance(info[k], bool)
                                                             for k in ("tb_id", "tbg_size")) \
                            or not 0 <= info["tb_id"] < info["tbg_size"]:
                        raise rd.err(p + ("tbg_info",), "'tbg_info' needs integers 'tb_id' and 'tbg_size', "
                                                        "0 <= tb_id < tbg_size")
                    F = math.lcm(F, info["tbg_size"])
                    if F > MAX_GROUP_PARTS:
                        raise rd.err(p + ("tbg_info",), f"the plan's thread-block group sizes cut a chunk into "
                                                        f"{F} parts: hccc models at most {MAX_GROUP_PARTS}")
        return F

    def _served_sizes(self, plan, reuse, double, ic, oc, scratch) -> tuple[int, int, str | None]:
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
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise self.rd.err((key,), f"'{key}' must be a non-negative integer")
        if not reuse or not scratch:
            return lo, hi, None
        align = plan.get("buffer_alignment", BUFFER_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align < 1:
            raise self.rd.err(("buffer_alignment",), "'buffer_alignment' must be a positive integer")
        room = SHARED_SCRATCH_BYTES // (2 if double else 1)
        chunk = room // (scratch * (2 if self.proto == "LL" else 1)) // align * align
        nchunks = oc if self.coll == "allgather" else ic
        top = chunk * nchunks
        if top < lo:
            raise self.rd.err(("min_message_size",), f"with reuse_resources the plan's {scratch} scratch chunks "
                                                     f"fit the executor's shared {SHARED_SCRATCH_BYTES >> 20} MiB "
                                                     f"scratch only up to {top} bytes, below its min_message_size")
        if top < hi:
            return lo, top, (f"reuse_resources: proven up to {top} bytes, where the {scratch} scratch chunks "
                             f"fill the executor's shared scratch buffer")
        return lo, hi, None

    def _channels(self, gpus):
        rd = self.rd
        self.chans = []          # rank -> type -> [peer]
        self.rbufs = []
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
                    if not isinstance(p, int) or not 0 <= p < self.R or p == r:
                        raise rd.err(("gpus", r, "channels", k, "connected_to", j), f"bad peer {p!r}")
                    lists[t].append(p)
            self.chans.append(lists)
            bufs = []
            for k, b in enumerate(g.get("remote_buffers", [])):
                p = rd.get(b, "rank", ("gpus", r, "remote_buffers", k), int)
                letter = rd.get(b, "type", ("gpus", r, "remote_buffers", k), str)
                if p >= self.R or letter not in BUF_OF_LETTER:
                    raise rd.err(("gpus", r, "remote_buffers", k), "bad remote buffer")
                bufs.append((p, letter))
            self.rbufs.append(bufs)
        # switch (NVLS) channels: their operations become memory-channel ones (mscclpp_switch)
        limit = {"i": self.ic, "o": self.oc}
        self.switch = SwitchChannels(gpus, lambda m, x: limit.get(x, self.scratch[m]), rd.err, self.double)
        # the k-th channel of a type from A to B is the k-th from B to A
        # (linear in the channels: each rank's channels grouped by peer once)
        towards = defaultdict(list)          # (rank, type, peer) -> the rank's channels to peer, in order
        for r in range(self.R):
            for t, peers in self.chans[r].items():
                for c, p in enumerate(peers):
                    towards[(r, t, p)].append(c)
        self.pair = {}
        for (r, t, p), mine in towards.items():
            theirs = towards.get((p, t, r), ())
            for m, c in enumerate(mine[:len(theirs)]):
                self.pair[(r, t, c)] = (theirs[m], m)

    def _node_size(self) -> int:
        """The ranks per node the plan's channels imply, 0 where they imply none. A memory channel
        maps the peer's memory, so its two ends share a node; a port channel may cross nodes. When
        the ranks joined by memory channels fall into two or more groups of one size G >= 2, rank r
        in group r // G, the plan is for nodes of G ranks (the runtime's placement check then
        reports a job that splits a group over nodes)."""
        parent = list(range(self.R))

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a
        for r in range(self.R):
            for p in self.chans[r]["memory"]:
                parent[find(r)] = find(p)
        for ranks in self.switch.members():          # the switch maps its group's memory
            for p in ranks:
                parent[find(ranks[0])] = find(p)
        groups: dict[int, list[int]] = defaultdict(list)
        for r in range(self.R):
            groups[find(r)].append(r)
        sizes = {len(m) for m in groups.values()}
        if len(groups) < 2 or len(sizes) != 1:
            return 0
        g = sizes.pop()
        if g < 2 or any(m != list(range(m[0], m[0] + g)) or m[0] % g for m in groups.values()):
            return 0
        return g

    # -- pass 1: operations in order, signals and waits counted per channel
    def _scan(self, gpus):
        rd = self.rd
        self.tbs = []             # (rank, tb id, [(path, op)])
        self.owner = {}           # (rank, type, channel, waits) -> [(tb, path)] using that channel end
        self.sig_tb = defaultdict(list)   # (rank, type, channel) -> thread block of each signal
        self.tb_chans = {}                # (rank, tb) -> type -> the block's channels (rank-level ids)
        self.chain_in, self.chain_out = {}, {}
        self.sem_init = [semaphore_inits(g, ("gpus", r), rd.err) for r, g in enumerate(gpus)]
        self.pipelines = {}               # a pipeline's path -> (unit_size, num_chunks) of its iterations
        for r, g in enumerate(gpus):
            for ti, tb in enumerate(rd.get(g, "threadblocks", ("gpus", r), list)):
                self._scan_block(r, ti, tb)
        # a channel end used by several thread blocks: they must run one after the other (each
        # starting on a semaphore the one before releases as its last operation), in id order
        for (r, t, c, waits), users in self.owner.items():
            for (a, _), (b, p) in zip(users, users[1:]):
                if b not in {self.chain_in.get((r, sid)) for sid in self.chain_out.get((r, a), [])}:
                    raise rd.err(p, f"{t} channel {c} of rank {r} is used by thread blocks {a} and {b}, which may "
                                    f"run at the same time: the order of its signals is not fixed")
        # the executor's synchronisation: no block races inside, every wait satisfied, no deadlock
        check_races(self.tbs, self._ref, rd.err)
        order: list = []
        check_counts(self.tbs, self.pair, self.chans, self._ref, self.sem_init, rd.err, order)
        check_next_call(self.tbs, order, self._ref, lambda b: b == Buf.SCRATCH, self.double, rd.err)
        check_pipeline_iterations(self.tbs, self.pipelines, self._ref, lambda b: b == Buf.SCRATCH, rd.err)

    def _operation(self, r, op, p):
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

    def _block_ops(self, r, tb, base) -> list[tuple[tuple, PlanOp, dict | None]]:
        """A thread block's operations in order, with their paths (and the remote-buffer table of
        an operation a switch operation was rewritten into, ``None`` for the block's own); a
        pipeline's body in place of the pipeline (it runs once over the whole ranges)."""
        rd = self.rd
        # the block's switch channels (the loader concatenates every entry of that type)
        tb_switch = [c for e in tb.get("channels", []) if e.get("channel_type") == "switch"
                     for c in e.get("channel_ids", [])]

        def expand(o, p):
            parsed = self._operation(r, o, p)
            if parsed in SWITCH_OPS:
                return [(p, x, table) for x, table in self.switch.expand(r, o, p, tb_switch, self.rbufs[r])]
            return [(p, parsed, None)]
        ops = []
        for k, op in enumerate(rd.get(tb, "ops", base, list)):
            p = base + ("ops", k)
            if not (isinstance(op, dict) and op.get("name") == "pipeline"):
                ops.extend(expand(op, p))
                continue
            self._operation(r, op, p)
            self.pipelines[p] = (op["iter_context"]["unit_size"], op["iter_context"]["num_chunks"])
            inner = []
            for j, o in enumerate(op["ops"]):
                if isinstance(o, dict) and o.get("name") == "pipeline":
                    raise rd.err(p + ("ops", j), "a pipeline inside a pipeline")
                inner.extend(expand(o, p + ("ops", j)))
            sizes = {ref.size for _, o, _ in inner for ref in (o.src or ()) + (o.dst or ())}
            if len(sizes) > 1:
                raise rd.err(p, "a pipeline whose operations move different sizes: its iterations "
                                "would cut different elements in different operations")
            if sizes and sizes != {op["iter_context"]["num_chunks"]}:
                raise rd.err(p + ("iter_context", "num_chunks"),
                             f"a pipeline over {op['iter_context']['num_chunks']} chunks whose operations move "
                             f"{sizes.pop()}: its iterations would not cover its operations' ranges exactly")
            ops.extend(inner)
        return ops

    def _scan_block(self, r, ti, tb):
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
        for p, op, table in self._block_ops(r, tb, base):
            t = op.channel_type or "memory"
            if t == "switch":
                raise rd.err(p, f"'{op.name}' does not work over a switch channel (only glres, gstore and "
                                f"gstorepkt do)")
            ids = []
            for c in op.channel_ids or ():
                if t not in tch or not isinstance(c, int) or not 0 <= c < len(tch[t]):
                    raise rd.err(p + ("channel_ids",), "channel id beyond the thread block's channels")
                g_c = tch[t][c]
                if not 0 <= g_c < len(self.chans[r][t]):
                    raise rd.err(base + ("channels",), "channel id beyond the gpu's channels")
                ids.append(g_c)
                if op.name in ("signal", "wait", "rlxsignal", "rlxwait", "pws", "pwsf"):
                    users = self.owner.setdefault((r, t, g_c, op.name in ("wait", "rlxwait")), [])
                    if ti not in (u for u, _ in users):
                        users.append((ti, p))
            resolved.append((p, BlockOp(op, p, t, tuple(ids), trb if table is None else table)))
        self.tbs.append((r, ti, resolved))
        if resolved and resolved[0][1].name == "sem_acquire":
            for sid in resolved[0][1].semaphore_ids:
                self.chain_in[(r, sid)] = ti
        if resolved and resolved[-1][1].name == "sem_release":
            self.chain_out[(r, ti)] = resolved[-1][1].semaphore_ids

    # -- pass 2: primitives
    def _ref(self, op, ref, path, r):
        """(rank, Buf, chunk, count) of a buffer reference (a remote one through the op's channel type)."""
        rd = self.rd
        idx, n = ref.index, ref.size        # integers, size at least 1 (checked as the operation was read)
        if ref.buffer_id is not None:
            ids = op.rbufs.get(op.t, [])
            b = ref.buffer_id
            if not 0 <= b < len(ids) or not 0 <= ids[b] < len(self.rbufs[r]):
                raise rd.err(path + ("buffer_id",), "remote buffer id beyond the thread block's remote buffers")
            owner, letter = self.rbufs[r][ids[b]]
        else:
            owner, letter = r, ref.type
            if letter not in BUF_OF_LETTER:
                raise rd.err(path, f"bad buffer type {letter!r}")
        buf = BUF_OF_LETTER[letter]
        limit = {Buf.INPUT: self.ic, Buf.OUTPUT: self.oc, Buf.SCRATCH: self.scratch[owner]}[buf]
        if idx + n > limit:
            raise rd.err(path, f"chunks [{idx}, {idx + n}) of rank {owner}'s {letter} buffer: it has {limit}")
        F = self.F
        group = op.tbg
        if group and group[1] > 1:
            # the executor cuts the operation's range into tbg_size equal parts (at sizes that are a
            # multiple of the alignment x chunks x F) and this block moves part tb_id
            part = n * F // group[1]
            return owner, buf, idx * F + group[0] * part, part
        return owner, buf, idx * F, n * F

    def _build(self, plan) -> ProgramIR:
        """The plan's primitives, in two passes over every thread block's operations: first where
        data goes (sends, signal groups, waits, packet regions, remote reads), then the rows in each
        block's order with the dependencies semaphores, barriers and packet flags carry."""
        self._start_build()
        for r, ti, ops in self.tbs:
            for pos, (p, op) in enumerate(ops):
                self._place(r, ti, pos, p, op)
        self._cut_packet_writes()
        self._count_packet_readers()
        self._announce_across_barriers(self.pending, self.mem_signals, self.bar_pass, self.bar_members)
        for key, lst in self.pending.items():
            if lst:
                raise self.rd.err(lst[0]["path"], f"rank {key[0]} puts into rank {lst[0]['peer']} without a signal "
                                                  f"after it: the peer cannot know when the data is there")
        self._attach_reads()
        self._start_rows()
        for r, ti, ops in self.tbs:
            for pos, (p, op) in enumerate(ops):
                self._rows_of(r, ti, pos, p, op)
            if not self.tb_rows.get((r, ti)):
                # a block that only synchronises (or has no operations) moves no data: a NOP keeps
                # its place, so the program's thread blocks stay the plan's
                at = ops[0][0] if ops else ("gpus", r, "threadblocks", ti)
                self._add(r, ti, Op.NOP, at, f"rank {r} thread block {ti}")
        self._set_put_channels()
        self._sync_deps()
        return self._finish(self.rows, self.deps, self.tb_rows)

    def _start_build(self):
        """The state of pass A (where data goes)."""
        self.rows: list[list] = []      # rank, tb, op, send_peer, recv_peer, channel, sb, so, db, do, cnt
        self.where: list[str] = []
        self.paths: list[tuple] = []
        # signal groups: (rank, type, channel) -> [list of (send row, dst region)] per signal
        self.pending = defaultdict(list)
        self.mem_signals = defaultdict(list)     # (rank, tb) -> [(pos, peer, channel, its group)]
        self.bar_pass = defaultdict(list)        # (rank, tb) -> [(pos, (barrier id, k-th pass))]
        self.bar_members = defaultdict(list)     # (rank, barrier id, k) -> blocks passing it
        self.bar_uses = defaultdict(int)
        self.groups = defaultdict(list)
        self.nsig = defaultdict(int)
        self.nwait = defaultdict(int)
        self.emit_at: dict[tuple, list] = defaultdict(list)  # (rank, tb, op position) -> rows to emit there
        self.packet_writes = defaultdict(list)               # receiver -> [(lo, n, send)]
        self.packet_reads = defaultdict(set)                 # reader -> boundaries of the packet regions it reads
        self.local_pk = defaultdict(list)                    # rank -> packets it writes into its own scratch
        self.pk_readers = defaultdict(list)
        self.local_pk_by = {}                                # (rank, tb, op) -> its local packet write
        self.pk_deps = []                                    # (reader row, packet write): flags order them
        self.reads = []                                      # remote reads: (rank, tb, pos, peer, wait key, region)
        self.last_wait = {}
        self.waits_of = defaultdict(dict)                    # (rank, tb) -> {peer: its latest wait towards it}
        self.sem_waits = defaultdict(list)                   # (rank, semaphore) -> waits handed over per release
        self.sem_acquired = defaultdict(int)
        self.chan_no: dict[tuple, int] = {}
        self.chans_between: dict[tuple, int] = defaultdict(int)   # (sender, receiver) -> connections so far

    # -- pass A: sends (puts and packets), signal groups; waits counted
    def _place(self, r, ti, pos, p, op):
        """Where one operation's data goes, and the synchronisation it counts."""
        name, t, ids = op.name, op.t, op.ids
        if name in ("put", "pws", "pwsf", "res", "rres", "ppkt", "respkt", "recspkt", "rppkt"):
            first_remote = {"res": 1, "rres": 1, "respkt": 1, "recspkt": 2}.get(name, 0)
            for j, ref in enumerate(op.dst[first_remote:], start=first_remote):
                self._put(r, ti, pos, p, op, j, first_remote, ref)
            if name in ("pws", "pwsf") and t == "port":
                for c in ids:
                    self._signal(r, t, c, self.pending, self.groups, self.nsig, ti)
        if name in ("signal", "rlxsignal"):
            for c in ids:
                self._signal(r, t, c, self.pending, self.groups, self.nsig, ti)
                if t == "memory":
                    self.mem_signals[(r, ti)].append((pos, self.chans[r][t][c], c, self.groups[(r, t, c)][-1]))
        if name in ("sem_release", "sem_acquire"):
            self._hand_over_waits(r, ti, op)
        if name == "barrier":
            bkey = (op.barrier_id, self.bar_uses[(r, ti, op.barrier_id)])
            self.bar_uses[(r, ti, op.barrier_id)] += 1
            self.bar_pass[(r, ti)].append((pos, bkey))
            self.bar_members[(r,) + bkey].append(ti)
        if name in ("wait", "rlxwait"):
            for c in ids:
                k = self.nwait[(r, t, c)]
                self.nwait[(r, t, c)] += 1
                self.last_wait[(r, ti, self.chans[r][t][c])] = (t, c, k)
                self.waits_of[(r, ti)][self.chans[r][t][c]] = (t, c, k)
                self.emit_at[(r, ti, pos)].append(("wait", (t, c, k)))
        self._packet_places(r, ti, pos, p, op)

    def _hand_over_waits(self, r, ti, op):
        """A block's waits so far count for a block that acquires a semaphore it releases (the
        ``k``-th acquire after the ``k``-th release): that block may read the peers the waits were
        towards (a pipeline's reduce after a copy block's signal and wait)."""
        for s in op.semaphore_ids:
            if op.name == "sem_release":
                self.sem_waits[(r, s)].append(dict(self.waits_of[(r, ti)]))
                continue
            k = self.sem_acquired[(r, s)] - self.sem_init[r][s]
            self.sem_acquired[(r, s)] += 1
            if 0 <= k < len(self.sem_waits[(r, s)]):
                for peer, w in self.sem_waits[(r, s)][k].items():
                    self.last_wait.setdefault((r, ti, peer), w)
                    self.waits_of[(r, ti)].setdefault(peer, w)

    def _put(self, r, ti, pos, p, op, j, first_remote, ref):
        """The send of one remote destination ``j`` of a put or packet operation."""
        rd, name, t, ids = self.rd, op.name, op.t, op.ids
        dsts, srcs = op.dst, op.src
        if ref.buffer_id is None:
            raise rd.err(p + ("dst_buff", j), f"'{name}' writes a peer's buffer: a buffer_id is needed")
        peer, buf, idx, n = self._ref(op, ref, p + ("dst_buff", j), r)
        port_pkt = name == "ppkt" and t == "port"
        if port_pkt and (not srcs or srcs[0].type != "s"):
            raise rd.err(p, "a port-channel ppkt sends packets already in the source buffer: "
                            "only packets of the rank's scratch are modelled")
        if name == "rppkt" or port_pkt:       # forwards the packets of its own scratch region
            _, _, qi, qn = self._ref(op, srcs[0], p + ("src_buff", 0), r)
            sb, so, sn = Buf.SCRATCH, self.PK + qi, qn
            if sn != n:
                raise rd.err(p, "source and destination sizes differ")
        elif name in ("put", "pws", "pwsf", "ppkt"):
            s = srcs[j] if j < len(srcs) else srcs[0] if srcs else None
            if s is None:
                raise rd.err(p, f"'{name}' without a source")
            _, sb, so, sn = self._ref(op, s, p + ("src_buff", min(j, len(srcs) - 1)), r)
            if sn != n:
                raise rd.err(p, "source and destination sizes differ")
        else:
            _, sb, so, sn = self._ref(op, dsts[0], p + ("dst_buff", 0), r)
        c = self._channel_to(r, t, ids, j - first_remote, peer, p, ti)
        send = {"rank": r, "tb": ti, "pos": pos, "sb": sb, "so": so, "n": n, "peer": peer,
                "dst": (buf, idx, n), "path": p}
        self.emit_at[(r, ti, pos)].append(("send", send))
        if name in ("ppkt", "respkt", "recspkt", "rppkt"):
            if t != "memory" and name not in ("rppkt", "ppkt"):
                raise rd.err(p, f"'{name}' over a port channel is not modelled")
            self.packet_writes[peer].append((idx, n, send))
        else:
            # a memory put is announced by the block's next signal to that peer (the
            # signal's fence publishes every earlier write of the block); a port put
            # by the next signal on its own channel (the proxy keeps one order per channel)
            self.pending[(r, ti, peer) if t == "memory" else (r, ti, peer, c)].append(send)

    def _packet_places(self, r, ti, pos, p, op):
        """The packet regions an operation reads, the packets it writes into its own scratch, and
        its reads of a peer's buffer (after the block's latest wait towards that peer)."""
        rd, name, t = self.rd, op.name, op.t
        if name in _PACKET_READS or (name == "ppkt" and t == "port"):
            srcs = op.src
            name = "rppkt" if name == "ppkt" else name
            for j in range(_PACKET_READS[name], min(len(srcs), _PACKET_READS[name] + (1 if name == "rppkt"
                                                                                        else len(srcs)))):
                _, _, idx, n = self._ref(op, srcs[j], p + ("src_buff", j), r)
                self.packet_reads[r].update((idx, idx + n))
                self.pk_readers[r].append((idx, idx + n))
        if name in ("cpkt", "recpkt", "recspkt"):
            k = 0 if name == "cpkt" else 1
            _, _, idx, n = self._ref(op, op.dst[k], p + ("dst_buff", k), r)
            w = {"rank": r, "local": True, "path": p, "tb": ti}
            self.local_pk[r].append((idx, n, w))
            self.local_pk_by[(r, ti, pos)] = w
        if name in ("get", "rre", "rres"):
            srcs = op.src
            first = 0 if name == "get" else 1
            for j, ref in enumerate(srcs[first:], start=first):
                if ref.buffer_id is None:
                    raise rd.err(p + ("src_buff", j), f"'{name}' reads a peer's buffer: a buffer_id is needed")
                peer, buf, idx, n = self._ref(op, ref, p + ("src_buff", j), r)
                w = self.last_wait.get((r, ti, peer))
                if w is None:
                    raise rd.err(p, f"rank {r} reads rank {peer}'s buffer without first waiting for a "
                                    f"signal from it in this thread block")
                self.reads.append({"rank": r, "tb": ti, "pos": pos, "peer": peer, "wait": w, "src": (buf, idx, n),
                                   "path": p, "j": j})

    def _cut_packet_writes(self):
        """A packet write read in parts (by several operations) is sent in those parts; packet
        writes into one region by two operations are refused."""
        rd = self.rd
        for peer, writes in list(self.packet_writes.items()):
            cuts = sorted(self.packet_reads.get(peer, set()))
            parts = []
            for lo, n, send in writes:
                bounds = [lo] + cuts[bisect_right(cuts, lo):bisect_left(cuts, lo + n)] + [lo + n]
                if len(bounds) == 2:
                    parts.append((lo, n, send))
                    continue
                pieces = []
                for a, b in zip(bounds, bounds[1:]):
                    piece = dict(send, so=send["so"] + (a - lo), n=b - a, dst=(send["dst"][0], a, b - a))
                    pieces.append(piece)
                    parts.append((a, b - a, piece))
                at = self.emit_at[(send["rank"], send["tb"], send["pos"])]
                k = next(i for i, e in enumerate(at) if e[1] is send)
                at[k:k + 1] = [("send", x) for x in pieces]
            parts += self.local_pk.pop(peer, [])
            parts.sort(key=lambda x: x[0])
            for (a, n, s1), (b, _, s2) in zip(parts, parts[1:]):
                if b < a + n:
                    raise rd.err(s2["path"], f"rank {s2['rank']} puts packets into rank {peer}'s scratch where rank "
                                             f"{s1['rank']} puts packets too: which one a read sees is not fixed")
            self.packet_writes[peer] = parts
        for peer, parts in self.local_pk.items():
            self.packet_writes[peer] = sorted(parts, key=lambda x: x[0])

    def _count_packet_readers(self):
        # a packet region read by one operation is received into that operation's place; one read
        # by several is received into the scratch (at self.PK + index) by the first and read there
        # (parts never straddle a read's bounds, which cut them: the parts a read covers are
        # those starting inside it)
        self.pk_los = {}
        for peer, parts in self.packet_writes.items():
            los = [lo for lo, _, _ in parts]
            self.pk_los[peer] = los
            for _, _, w in parts:
                w["readers"] = 0
            for a, b in self.pk_readers.get(peer, []):
                for k in range(bisect_left(los, a), bisect_left(los, b)):
                    lo, n, w = parts[k]
                    if lo + n <= b:
                        w["readers"] += 1

    def _channel_no(self, key):
        # one ProgramIR connection per (kind, sender, receiver, type, channel, sending and
        # receiving thread blocks): a subsequence of the channel's messages, in their order
        if key not in self.chan_no:
            self.chan_no[key] = self.chans_between[key[1:3]]
            self.chans_between[key[1:3]] += 1
        return self.chan_no[key]

    def _attach_reads(self):
        """The signal a read belongs to: the peer's k-th signal on the partner channel."""
        rd = self.rd
        self.sig_reads = defaultdict(list)
        self.reads_at = defaultdict(list)            # (rank, tb, op position) -> its remote reads, in order
        for x in self.reads:
            self.reads_at[(x["rank"], x["tb"], x["pos"])].append(x)
        for rd_ in self.reads:
            t, c, k = rd_["wait"]
            partner = self.pair.get((rd_["rank"], t, c))
            if partner is None:
                raise rd.err(rd_["path"], "the channel of the wait before this read has no partner")
            sigs = self.sig_tb.get((rd_["peer"], t, partner[0]), [])
            if k >= len(sigs):
                raise rd.err(rd_["path"], f"rank {rd_['rank']} reads rank {rd_['peer']}'s buffer after a wait "
                                          f"rank {rd_['peer']} never signals")
            rd_["channel"] = self._channel_no(("read", rd_["peer"], rd_["rank"], t, partner[0], sigs[k], rd_["tb"]))
            self.sig_reads[(rd_["peer"], t, partner[0], k)].append(rd_)

    # -- pass B: rows in every thread block's order
    def _start_rows(self):
        self.deps = []
        self.sem_rel = defaultdict(list)
        self.sem_acq = defaultdict(list)
        self.barriers = defaultdict(list)
        self.barrier_uses = defaultdict(int)
        self.nsig2 = defaultdict(int)
        self.tb_rows: dict[tuple, list[int]] = defaultdict(list)

    def _add(self, r, ti, op, path, desc, sp=-1, rp=-1, ch=0, sb=Buf.NONE, so=0, db=Buf.NONE, do=0, n=1):
        self.rows.append([r, ti, int(op), sp, rp, ch, int(sb), so, int(db), do, n])
        self.where.append(desc)
        self.paths.append(path)
        self.tb_rows[(r, ti)].append(len(self.rows) - 1)
        return len(self.rows) - 1

    def _rows_of(self, r, ti, pos, p, op):
        """One operation's rows: receives its waits announce, sends of data peers read at its
        signals, its local data movement, its own sends, NOPs where it passes a semaphore or barrier."""
        name = op.name
        desc = f"rank {r} thread block {ti} operation {pos} ({name})"
        self._receives_at_wait(r, ti, pos, p, desc)
        # sends reading a peer's announced data at its signal
        if name in ("signal", "rlxsignal") or (name in ("pws", "pwsf") and op.t == "port"):
            for c in op.ids:
                t = op.t
                k = self.nsig2[(r, t, c)]
                self.nsig2[(r, t, c)] += 1
                for rr in self.sig_reads.get((r, t, c, k), []):
                    b, i, n = rr["src"]
                    rr["send_row"] = self._add(r, ti, Op.SEND, p, desc + f" sending to rank {rr['rank']}",
                                               sp=rr["rank"], ch=rr["channel"], sb=b, so=i, n=n)
        self._local(r, ti, pos, p, op, desc)
        for kind, what in self.emit_at.get((r, ti, pos), []):
            if kind == "send":
                s = what
                s["row"] = self._add(r, ti, Op.SEND, p, desc + f" sending to rank {s['peer']}", sp=s["peer"],
                                     ch=-1, sb=s["sb"], so=s["so"], n=s["n"])
        self._sync_rows(r, ti, p, op, desc)

    def _receives_at_wait(self, r, ti, pos, p, desc):
        """Receives announced by a wait."""
        rd = self.rd
        for kind, what in self.emit_at.get((r, ti, pos), []):
            if kind == "wait":
                t, c, k = what
                partner = self.pair.get((r, t, c))
                if partner is None:
                    raise rd.err(p, f"rank {r}'s {t} channel {c} has no partner channel on rank "
                                    f"{self.chans[r][t][c]}")
                peer = self.chans[r][t][c]
                grp = self.groups.get((peer, t, partner[0]), [])
                if k < len(grp):
                    for s in grp[k]:
                        b, i, n = s["dst"]
                        ch = self._channel_no(s["key"] + (s["tb"], ti))
                        s["channel"] = ch
                        self._add(r, ti, Op.RECV, p, desc + f" receiving from rank {peer}", rp=peer, ch=ch,
                                  db=b, do=i, n=n)

    def _sync_rows(self, r, ti, p, op, desc):
        """The order operations carry: a NOP stands where a semaphore or barrier is passed."""
        name = op.name
        if name == "sem_acquire":
            at = self._add(r, ti, Op.NOP, p, desc)
            for s in op.semaphore_ids:
                self.sem_acq[(r, s)].append((ti, at, p))
        if name == "sem_release":
            at = self._add(r, ti, Op.NOP, p, desc)
            for s in op.semaphore_ids:
                self.sem_rel[(r, s)].append((ti, at, p))
        if name == "barrier":
            arrive = self._add(r, ti, Op.NOP, p, desc)
            depart = self._add(r, ti, Op.NOP, p, desc)
            # the k-th pass of a block through barrier b meets the k-th of the others
            bkey = (r, op.barrier_id)
            k = self.barrier_uses[(bkey, ti)]
            self.barrier_uses[(bkey, ti)] += 1
            self.barriers[bkey + (k,)].append((ti, arrive, depart, p))

    def _set_put_channels(self):
        """Put-message channels (set when their receive was placed)."""
        rd = self.rd
        for r, ti, ops in self.tbs:
            for pos, (p, op) in enumerate(ops):
                for kind, s in self.emit_at.get((r, ti, pos), []):
                    if kind == "send":
                        if "channel" not in s:
                            raise rd.err(s["path"], f"rank {r} sends to rank {s['peer']}, but rank {s['peer']} "
                                                    f"never receives it (no matching wait or packet read)")
                        self.rows[s["row"]][5] = s["channel"]

    def _sync_deps(self):
        """Semaphores: the k-th acquire after the k-th release; barriers: everyone before everyone;
        packet reads after the packet writes whose flags they wait for."""
        rd = self.rd
        for key, acqs in self.sem_acq.items():
            rels = self.sem_rel.get(key, [])
            sems = self.plan["gpus"][key[0]].get("semaphores", [])
            if key[1] >= len(sems) or not isinstance(sems[key[1]], dict):
                raise rd.err(acqs[0][2], f"semaphore {key[1]} of rank {key[0]} is not declared")
            init = sems[key[1]].get("init_value", 0)
            for side in (acqs, rels):
                if len({x[0] for x in side}) > 1:
                    raise rd.err(side[0][2], f"semaphore {key[1]} of rank {key[0]} is used by several thread "
                                             f"blocks on one side: which release an acquire waits for is not fixed")
            for k, (ti, at, p) in enumerate(acqs):
                kk = k - init
                if kk < 0:
                    continue
                if kk >= len(rels):
                    raise rd.err(p, f"semaphore {key[1]} of rank {key[0]} is acquired more often than released")
                self.deps.append((at, rels[kk][1]))
        for key, arr in self.barriers.items():
            for ti, _, depart, p in arr:
                for tj, arrive, _, _ in arr:
                    if tj != ti:
                        self.deps.append((depart, arrive))
        for row, w in self.pk_deps:
            if w.get("pk_row") is None:
                raise rd.err(w["path"], "packets read before anything writes them")
            self.deps.append((row, w["pk_row"]))

    def _channel_to(self, r, t, ids, j, peer, p, ti):
        """The channel an operation writing ``peer``'s buffer goes through: the one it names (which
        must lead to ``peer``), else for a memory channel none is needed, for a port channel the
        thread block's only one to ``peer``."""
        if j < len(ids):
            c = ids[j]
            if self.chans[r][t][c] != peer:
                raise self.rd.err(p + ("channel_ids",), f"{t} channel {c} of rank {r} leads to rank "
                                                        f"{self.chans[r][t][c]}, not to rank {peer} whose buffer "
                                                        f"the operation writes")
            return c
        if t == "memory":
            return None
        cands = {c for c in self.tb_chans[(r, ti)].get(t, []) if self.chans[r][t][c] == peer}
        if len(cands) != 1:
            raise self.rd.err(p, f"which {t} channel to rank {peer} this operation uses is not said")
        return cands.pop()

    def _announce_across_barriers(self, pending, mem_signals, bar_pass, bar_members):
        """Memory-channel puts a block never signals itself (a thread-block group's parts): the
        first barrier the block passes after the put orders it before what the other blocks of
        that barrier do after it, so the signal to the same peer that one other block sends first
        after the barrier announces it (the signal's fence publishes what the barrier ordered
        before it). Several blocks signalling that peer after the barrier: which one announces
        the put is not fixed, and it stays unannounced (refused)."""
        for key in [k for k, lst in pending.items() if lst and len(k) == 3]:
            r, ti, peer = key
            left = []
            for snd in pending[key]:
                after = [(pos, bk) for pos, bk in bar_pass.get((r, ti), []) if pos > snd["pos"]]
                if not after:
                    left.append(snd)
                    continue
                bk = after[0][1]
                found = []
                for tj in bar_members.get((r,) + bk, []):
                    if tj == ti:
                        continue
                    at = next(pos for pos, k in bar_pass[(r, tj)] if k == bk)
                    sig = next((x for x in mem_signals.get((r, tj), []) if x[0] > at and x[1] == peer), None)
                    if sig is not None:
                        found.append(sig)
                if len(found) != 1:
                    left.append(snd)
                    continue
                _, _, c, group = found[0]
                snd["key"] = ("put", r, peer, "memory", c)
                group.append(snd)
            pending[key] = left

    def _signal(self, r, t, c, pending, groups, nsig, ti):
        peer = self.chans[r][t][c]
        sent = pending.pop((r, ti, peer) if t == "memory" else (r, ti, peer, c), [])
        for s in sent:
            s["key"] = ("put", r, peer, t, c)
        groups[(r, t, c)].append(sent)
        nsig[(r, t, c)] += 1
        self.sig_tb[(r, t, c)].append(ti)

    def _local(self, r, ti, pos, p, op, desc):
        """Local data operations, remote reads and packet reads of one operation."""
        rd = self.rd
        name = op.name
        if name in ("copy",):
            s = self._ref(op, op.src[0], p + ("src_buff", 0), r)
            d = self._ref(op, op.dst[0], p + ("dst_buff", 0), r)
            self._add(r, ti, Op.COPY, p, desc, sb=s[1], so=s[2], db=d[1], do=d[2], n=s[3])
            return
        if name in ("re", "res"):
            srcs = [self._ref(op, s, p + ("src_buff", j), r) for j, s in enumerate(op.src)]
            d = self._ref(op, op.dst[0], p + ("dst_buff", 0), r)
            if any(s[0] != r for s in srcs):
                raise rd.err(p, f"'{name}' reduces local buffers only")
            self._reduce_local(r, ti, p, desc, srcs, d)
            return
        if name in ("get", "rre", "rres"):
            self._remote_reads(r, ti, pos, p, op, desc)
            return
        if name == "cpkt":
            sr = self._ref(op, op.src[0], p + ("src_buff", 0), r)
            q = self._ref(op, op.dst[0], p + ("dst_buff", 0), r)
            self.local_pk_by[(r, ti, pos)]["pk_row"] = self._add(r, ti, Op.COPY, p, desc, sb=sr[1], so=sr[2],
                                                                 db=Buf.SCRATCH, do=self.PK + q[2], n=sr[3])
            return
        if name == "ppkt" and op.t == "port":
            name = "rppkt"            # packets of its own scratch, put as they are
        if name in _PACKET_READS:
            self._packet_reads(r, ti, pos, p, op, desc, name)

    def _remote_reads(self, r, ti, pos, p, op, desc):
        """``get`` receives what it reads; ``rre``/``rres`` reduce each peer's region into place."""
        mine = self.reads_at.get((r, ti, pos), [])
        if op.name == "get":
            for x in mine:
                d = self._ref(op, op.dst[x["j"]], p + ("dst_buff", x["j"]), r)
                self._add(r, ti, Op.RECV, p, desc + f" reading rank {x['peer']}", rp=x["peer"], ch=x["channel"],
                          db=d[1], do=d[2], n=d[3])
            return
        s0 = self._ref(op, op.src[0], p + ("src_buff", 0), r)
        d = self._ref(op, op.dst[0], p + ("dst_buff", 0), r)
        acc = s0
        for x in mine:
            self._add(r, ti, Op.RECV_REDUCE_COPY, p, desc + f" reading rank {x['peer']}", rp=x["peer"],
                      ch=x["channel"], sb=acc[1], so=acc[2], db=d[1], do=d[2], n=d[3])
            acc = d

    def _packet_reads(self, r, ti, pos, p, op, desc, name):
        """An operation reading packets of its own scratch (``name``: ``rppkt`` for a port ppkt):
        each source region in the pieces packets were written in, received, copied or reduced."""
        srcs = op.src
        first_pk = _PACKET_READS[name]
        last = first_pk + 1 if name == "rppkt" else len(srcs)
        d = None if name == "rppkt" else self._ref(op, op.dst[0], p + ("dst_buff", 0), r)
        acc = None if first_pk == 0 else self._ref(op, srcs[0], p + ("src_buff", 0), r)
        for j in range(first_pk, last):
            q = self._ref(op, srcs[j], p + ("src_buff", j), r)
            for lo, n, s in self._packet_pieces(r, q, p + ("src_buff", j)):
                self._read_piece(r, ti, p, desc, lo - q[2], self.PK + lo, n, s, d, acc)
            if d is not None and acc is not None:
                acc = d
        if name in ("recpkt", "recspkt"):
            q = self._ref(op, op.dst[1], p + ("dst_buff", 1), r)
            self.local_pk_by[(r, ti, pos)]["pk_row"] = self._add(r, ti, Op.COPY, p, desc, sb=d[1], so=d[2],
                                                                 db=Buf.SCRATCH, do=self.PK + q[2], n=d[3])

    def _packet_pieces(self, r, q, path):
        """The packet writes that make up region ``q`` of rank ``r``'s packet scratch, in order;
        a region that is not exactly such writes is refused at ``path``."""
        lst, los = self.packet_writes.get(r, []), self.pk_los.get(r, [])
        end = q[2] + q[3]
        pieces = []
        # the writes are disjoint and sorted: only the one before the first that starts
        # inside the read may reach into it
        for lo, n, s in lst[max(bisect_left(los, q[2]) - 1, 0):bisect_left(los, end)]:
            if lo + n <= q[2]:
                continue
            if lo >= q[2] and lo + n <= end:
                pieces.append((lo, n, s))
            elif s.get("local"):
                # part of packets this rank wrote itself (a thread-block group's share of
                # them): each packet's own flag makes the read wait for it
                a, b = max(lo, q[2]), min(lo + n, end)
                pieces.append((a, b - a, s))
        cover = q[2]
        for lo, n, s in pieces:
            if lo != cover:
                break
            cover += n
        if cover != q[2] + q[3]:
            raise self.rd.err(path, f"packets [{q[2]}, {q[2] + q[3]}) of rank {r}'s scratch are "
                                    f"not exactly the regions packets are written into")
        return pieces

    def _read_piece(self, r, ti, p, desc, off, slot, n, s, d, acc):
        """One packet write ``s`` read at offset ``off`` of the read (its packets in scratch
        ``slot``): received where first read (into its place when one operation reads it), waited
        for where another block wrote it, then copied or reduced into ``d`` (with ``acc``)."""
        if not s.get("local") and not s.get("received"):
            s["channel"] = self._channel_no(("pkt", s["rank"], r, id(s)))      # packets: a connection each
            s["received"] = True
            if d is not None and s.get("readers", 1) == 1:
                if acc is None:
                    self._add(r, ti, Op.RECV, p, desc + f" from rank {s['rank']}", rp=s["rank"],
                              ch=s["channel"], db=d[1], do=d[2] + off, n=n)
                else:
                    self._add(r, ti, Op.RECV_REDUCE_COPY, p, desc + f" from rank {s['rank']}", rp=s["rank"],
                              ch=s["channel"], sb=acc[1], so=acc[2] + off, db=d[1], do=d[2] + off, n=n)
                return
            s["pk_row"] = self._add(r, ti, Op.RECV, p, desc + f" from rank {s['rank']}", rp=s["rank"],
                                    ch=s["channel"], db=Buf.SCRATCH, do=slot, n=n)
            s["tb_in"] = ti
        elif s.get("tb_in", s.get("tb") if s.get("local") else None) != ti:
            # packets another block wrote here: their flags make this read wait for them
            self.pk_deps.append((self._add(r, ti, Op.NOP, p, desc), s))
        if d is None:
            return            # rppkt: its sends read the slot
        if acc is None:
            self._add(r, ti, Op.COPY, p, desc, sb=Buf.SCRATCH, so=slot, db=d[1], do=d[2] + off, n=n)
        else:
            self._reduce_local(r, ti, p, desc, [(r, acc[1], acc[2] + off, n), (r, Buf.SCRATCH, slot, n)],
                               (r, d[1], d[2] + off, n))

    def _reduce_local(self, r, ti, p, desc, srcs, d):
        """dst := src0 (+) src1 (+) ... as COPY / REDUCE primitives."""
        n = srcs[0][3]
        others = list(srcs)
        if any(s[1:3] == d[1:3] for s in srcs):
            others.remove(next(s for s in srcs if s[1:3] == d[1:3]))
        else:
            first = others.pop(0)
            self._add(r, ti, Op.COPY, p, desc, sb=first[1], so=first[2], db=d[1], do=d[2], n=n)
        for s in others:
            self._add(r, ti, Op.REDUCE, p, desc, sb=s[1], so=s[2], db=d[1], do=d[2], n=n)

    def _finish(self, rows, deps, tb_rows) -> ProgramIR:
        R = self.R
        dp = [a for a, _ in deps]
        do = [b for _, b in deps]
        rows_arr = np.asarray(rows, dtype=np.int64).reshape(-1, 11)
        N = len(rows_arr)
        rank, tb = rows_arr[:, 0], rows_arr[:, 1]
        seq = np.zeros(N, np.int64)
        for (r, ti), lst in tb_rows.items():
            seq[lst] = np.arange(len(lst))
        cols = {"rank": rank, "tb": tb, "seq": seq, "pipeline": np.zeros(N), "op": rows_arr[:, 2],
                "send_peer": rows_arr[:, 3], "recv_peer": rows_arr[:, 4], "channel": rows_arr[:, 5],
                "src_buf": rows_arr[:, 6], "src_off": rows_arr[:, 7], "dst_buf": rows_arr[:, 8],
                "dst_off": rows_arr[:, 9], "count": rows_arr[:, 10], "task": np.full(N, -1), "task2": np.full(N, -1)}
        # no task ids: a plan's messages are matched by their order on a connection, and a send and
        # its receive are different rows (ids per row made every matched pair disagree once written)
        cols = {k: np.asarray(v).astype(PRIM_COLUMNS[k]) for k, v in cols.items()}
        ntbs = np.zeros(R, np.int32)
        for r, ti, _ in self.tbs:
            ntbs[r] = max(ntbs[r], ti + 1)
        from hccc.compiler.passes.build import sanitize_identifier
        plan = self.plan
        ir = ProgramIR(name=sanitize_identifier(str(plan.get("name", "mscclpp_plan"))[:64] or "mscclpp_plan"),
                       collective=self.coll, nranks=R, nchunks=self.C * self.F, in_chunks=self.ic * self.F,
                       out_chunks=self.oc * self.F, scratch_chunks=max(self.scratch) * self.F + self.PK, prims=cols, dep_prim=np.asarray(dp, np.int64),
                       dep_on=np.asarray(do, np.int64), npipelines=1, ntbs=ntbs,
                       stats={"source": "mscclpp-plan", "proto": self.proto, "msccl_inplace": self.inplace,
                              "msccl_outofplace": not self.inplace,
                              "minBytes": self.served[0],
                              # (0: no bound; stats hold 64-bit integers, a plan's bound is uint64)
                              "maxBytes": min(self.served[1], (1 << 63) - 1)
                              if "max_message_size" in plan or self.served[2] else 0,
                              "transfers": int((cols["send_peer"] >= 0).sum()),
                              "tbs_per_rank_max": int(ntbs.max()), "tbs_connection_based": int(ntbs.sum()),
                              "tbs_state_based": int(ntbs.sum())})
        if self.served[2]:
            ir.stats["note"] = self.served[2]
        g = self._node_size()
        if g:
            ir.stats["gpus_per_node"] = g
        ir.sort_canonical()
        return self._checked(ir, seq, tb, rank)

    def _checked(self, ir, seq, tb, rank) -> ProgramIR:
        """``ir`` checked like an imported XML (structure, deadlock freedom, the collective's
        postcondition, every access in bounds), each refusal located at its operation."""
        rd = self.rd
        self.order_where = None
        from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_fifo_order, check_structure
        from hccc.compiler.ir.extents import ExtentError, check_extents
        from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered, prove
        order = np.lexsort((seq, tb, rank))
        where = [self.where[i] for i in order.tolist()]
        paths = [self.paths[i] for i in order.tolist()]

        def describe(i):
            return where[i]

        def fail(exc, prefix=""):
            at = paths[exc.prims[0]] if getattr(exc, "prims", None) else ()
            raise CompileError([Diagnostic(prefix + str(exc), rd.loc(at))]) from None

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
            ir.stats["execution"] = "task"
        except DeadlockError:
            ir.stats["execution"] = "algorithm"
        try:
            prove(ir, self.inplace, describe)
        except ProofError as exc:
            fail(exc, f"the plan does not implement {self.coll}: ")
        try:
            check_extents(ir, describe)
        except ExtentError as exc:
            fail(exc)
        return ir


__all__ = ["import_plan", "import_plan_text", "import_plan_obj"]
