"""An independent interpreter of MSCCL++ execution plans for tests (shares no code with hccc).

Written from the format's documented semantics (the executor's plan loader and device kernel): it
re-implements the loader's load-time checks and its offset arithmetic, then runs every rank's
thread blocks on numpy buffers of float64 elements, one operation at a time, the next thread block
to move chosen at random. Memory channels pair up in order per peer (the k-th channel A lists to
B is the k-th B lists to A); ``signal`` raises the peer end's count, ``wait`` returns once that
count exceeds the waits already done there; device semaphores count (``sem_acquire`` waits for a
positive value); LL packets carry the launch's flag and a read waits for it. ``runs`` launches
follow each other per rank (rank A may start run 2 while B is still in run 1), which is how a
plan runs in a training loop. Operations run by the first threads only (waits, signals,
semaphores) must be separated from the data operations around them by a ``nop``, and data
operations touching the same bytes from each other: a plan that breaks this is refused (a wait or
semaphore acquire, then a data operation; a data operation, then a signal, semaphore release or
port-channel put; two data operations on the same bytes; ``barrier`` synchronises the whole block).

Switch (NVLS) channels bind one buffer (``buffer_type``) of every rank of a group (each of a
channel's ``rank_groups`` is one channel, as the loader makes them; a rank binds only groups it is
in, and members declare the groups they share in the same order); a reference
``{"switch_channel_id": k, ...}`` names the block's ``k``-th switch channel, the same chunks on every
member. ``glres`` adds the region over every member of its source channel's group (the multimem
load-reduce) and stores the sum on every member of its destination's; ``gstore`` stores a local
region on every member; ``gstorepkt`` reads LL packets of the rank's scratch (waiting for their
flags) and writes them with this call's flag into every member's scratch. As in the kernel, the
multimem address of a Simple operation carries no scratch half (the first half of a double scratch
buffer), while ``gstorepkt`` writes the half of its call.

A thread-block group's member moves its part of every range (the loader's ``calcOffset`` over the
range's alignment units); inside a pipeline each iteration is a slice of that part, as the kernel
cuts it, and an iteration that starts past the part (where the kernel's 32-bit size wraps) is refused.
Packet operations in a pipeline run whole in every iteration (their handlers take no offset).

Unsupported here (raises :class:`InterpError`): ``reuse_resources`` at sizes where the plan's scratch
outgrows the executor's shared scratch buffer (below that it is a plain plan).
"""
from __future__ import annotations

import random

import numpy as np

ELEM = 8                      # float64
OP_NAMES = {"nop", "barrier", "put", "pws", "pwsf", "get", "copy", "signal", "wait", "flush", "re", "res", "rre",
            "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt", "recpkt", "recspkt", "glres", "gstore",
            "gstorepkt", "rlxsignal", "rlxwait", "pipeline", "sem_acquire", "sem_release"}
CONTROL = {"signal", "wait", "rlxsignal", "rlxwait", "flush", "sem_acquire", "sem_release", "barrier"}
#: run by the first threads only: a later data operation must not start before they finished
ACQUIRE = {"wait", "rlxwait", "sem_acquire"}
#: run by the first threads only: they must not start before the data operations before them finished
RELEASE = {"signal", "rlxsignal", "sem_release", "flush"}
SWITCH = {"glres", "gstore", "gstorepkt"}
#: LL packet operations: the kernel runs them without a pipeline iteration's offset and unit
PACKET_OPS = {"ppkt", "rppkt", "respkt", "repkt", "recspkt", "recpkt", "upkt", "cpkt", "gstorepkt"}
MAX_OPERATION, MAX_CHANNEL, MAX_CHANNEL_PER_OPERATION, MAX_LOCAL_BUFFER = 64, 16, 8, 2
MAX_DEVICE_SEMAPHORES, MAX_DEVICE_SYNCERS = 16, 16
SHARED_SCRATCH = 1 << 26      # the executor's scratch for reuse_resources plans (execution_common.hpp)


class InterpError(AssertionError):
    pass


# ------------------------------------------------------------------ the loader's arithmetic
def _calc_offset(size, index, slices, align):
    nelems = size // align
    return (index * (nelems // slices) + min(index, nelems % slices)) * align


class _Sizes:
    def __init__(self, gpu, in_bytes, out_bytes, align):
        self.ic, self.oc, self.sc = gpu["input_chunks"], gpu["output_chunks"], gpu["scratch_chunks"]
        self.align = align
        if self.ic == 0 and self.oc == 0:
            raise InterpError("input or output chunks must be positive")
        if self.ic and self.oc and in_bytes // self.ic != out_bytes // self.oc:
            raise InterpError("size per chunk inconsistent between input and output")
        self.size, self.n = (in_bytes, self.ic) if self.ic else (out_bytes, self.oc)

    def offset(self, index):
        return _calc_offset(self.size, index, self.n, self.align)

    def span(self, index, count):
        lo = self.offset(index)
        return lo, self.offset(index + count) - lo


def check_load(plan: dict, in_bytes: int, out_bytes: int) -> None:
    """The executor's load-time checks (and the device plan's fixed-size tables) for one size."""
    for key in ("name", "collective", "protocol", "inplace", "gpus"):
        if key not in plan:
            raise InterpError(f"plan has no '{key}'")
    align = plan.get("buffer_alignment", 16)
    size = out_bytes if plan["collective"] == "allgather" else in_bytes
    if not plan.get("min_message_size", 0) <= size <= plan.get("max_message_size", (1 << 64) - 1):
        raise InterpError("message size outside the plan's range")
    if plan.get("reuse_resources"):
        # the plan's scratch is the executor's shared buffer (PREDFINED_SCRATCH_SIZE, half per call
        # with a double buffer): offsets are a plain plan's while its scratch fits there; past that
        # the executor folds pipelined scratch offsets, which this interpreter does not run
        room = SHARED_SCRATCH // (2 if plan.get("use_double_scratch_buffer") else 1)
        for g in plan["gpus"]:
            n = g["input_chunks"] or g["output_chunks"]
            per_chunk = -(-((in_bytes if g["input_chunks"] else out_bytes) // align) // n) * align
            if per_chunk * g["scratch_chunks"] * (2 if plan["protocol"] == "LL" else 1) > room:
                raise InterpError("reuse_resources: the scratch does not fit the shared buffer at this size "
                                  "(folded offsets are not modelled)")
    nswitch = _check_switch_channels(plan)
    for r, g in enumerate(plan["gpus"]):
        if g["id"] != r:
            raise InterpError(f"gpus[{r}] has id {g['id']}")
        ic, oc = g["input_chunks"], g["output_chunks"]
        if in_bytes % align or out_bytes % align or (ic and (in_bytes // align) % ic) or \
                (oc and (out_bytes // align) % oc):
            raise InterpError("input or output size is not aligned with buffer alignment or chunks")
        sz = _Sizes(g, in_bytes, out_bytes, align)
        nch = {"memory": 0, "port": 0}
        for ch in g.get("channels", []):
            if ch["channel_type"] not in ("memory", "port", "switch"):
                raise InterpError(f"rank {r}: bad channel type {ch['channel_type']}")
            if ch["channel_type"] != "switch":
                for p in ch["connected_to"]:
                    if not 0 <= p < len(plan["gpus"]) or p == r:
                        raise InterpError(f"rank {r}: channel to bad peer {p}")
                nch[ch["channel_type"]] += len(ch["connected_to"])
        for rb in g.get("remote_buffers", []):
            if rb["type"] not in "ios" or not 0 <= rb["rank"] < len(plan["gpus"]):
                raise InterpError(f"rank {r}: bad remote buffer {rb}")
        nsw = nswitch[r]
        nsem = len(g.get("semaphores", []))
        for tb in g["threadblocks"]:
            where = f"rank {r} thread block {tb['id']}"
            tch = {c["channel_type"]: c["channel_ids"] for c in tb.get("channels", [])}
            for t, ids in tch.items():
                if len(ids) > MAX_CHANNEL:
                    raise InterpError(f"{where}: more than MAX_CHANNEL {t} channels")
                if any(not 0 <= i < (nsw if t == "switch" else nch[t]) for i in ids):
                    raise InterpError(f"{where}: channel id out of range")
            for ref in tb.get("remote_buffer_refs", []):
                if len(ref["remote_buffer_ids"]) > MAX_CHANNEL:
                    raise InterpError(f"{where}: more than MAX_CHANNEL remote buffers")
                if any(not 0 <= i < len(g.get("remote_buffers", [])) for i in ref["remote_buffer_ids"]):
                    raise InterpError(f"{where}: remote buffer id out of range")
            count = 0
            for op in tb["ops"]:
                inner = op.get("ops", []) if op["name"] == "pipeline" else []
                count += 1 + len(inner)
                for o in [op] + inner:
                    _check_op(o, where, tch, tb, nsem, sz)
            if count > MAX_OPERATION:
                raise InterpError(f"{where}: {count} operations, more than MAX_OPERATION {MAX_OPERATION}")


def _switch_groups(g) -> list:
    """A rank's switch channels as the loader makes them: one per rank group, in order."""
    return [(tuple(grp["ranks"]), ch["buffer_type"]) for ch in g.get("channels", [])
            if ch["channel_type"] == "switch" for grp in ch["rank_groups"]]


def _check_switch_channels(plan) -> list[int]:
    """The connection of every rank's switch channels: each group is of distinct ranks and
    includes its rank (connectNvlsCollective refuses a rank outside its group), and for every
    other member m the groups rank r shares with m come in the order m declares the groups it
    shares with r (the members handshake group by group). Returns each rank's switch channels."""
    R = len(plan["gpus"])
    groups = [_switch_groups(g) for g in plan["gpus"]]
    for r, mine in enumerate(groups):
        for ranks, letter in mine:
            if letter not in ("i", "o", "s"):
                raise InterpError(f"rank {r}: switch channel over bad buffer {letter!r}")
            if r not in ranks or len(set(ranks)) != len(ranks) or any(not 0 <= m < R for m in ranks):
                raise InterpError(f"rank {r}: switch channel group {list(ranks)} is not a group of distinct "
                                  f"ranks with rank {r} in it")
    for r, mine in enumerate(groups):
        for m in {m for ranks, _ in mine for m in ranks if m != r}:
            a = [(frozenset(x), b) for x, b in mine if m in x]
            theirs = [(frozenset(x), b) for x, b in groups[m] if r in x]
            if a != theirs:
                raise InterpError(f"switch channels ranks {r} and {m} share differ: {a} and {theirs}")
    return [len(x) for x in groups]


def _check_op(op, where, tch, tb, nsem, sz):
    if op["name"] not in OP_NAMES:
        raise InterpError(f"{where}: invalid operation type {op['name']}")
    if len(op.get("channel_ids", [])) > MAX_CHANNEL_PER_OPERATION:
        raise InterpError(f"{where}: more than MAX_CHANNEL_PER_OPERATION channels in one operation")
    if op.get("channel_ids") and len(tch.get(op.get("channel_type"), [])) <= max(op["channel_ids"]):
        raise InterpError(f"{where}: operation channel id beyond the thread block's channels")
    for side in ("src_buff", "dst_buff"):
        refs = op.get(side, [])
        if len(refs) > MAX_LOCAL_BUFFER + MAX_CHANNEL_PER_OPERATION:
            raise InterpError(f"{where}: too many buffers in one operation")
        for ref in refs:
            if "type" in ref and ref["type"] not in "ios":
                raise InterpError(f"{where}: invalid buffer type")
            lo, n = sz.span(ref["index"], ref["size"])
            if lo + n > 0xFFFFFFFF or n > 0xFFFFFFFF:
                raise InterpError(f"{where}: byte offset beyond 32 bits")
    ids = op.get("semaphore_ids", [])
    if len(ids) > MAX_DEVICE_SEMAPHORES or any(not 0 <= i < nsem for i in ids):
        raise InterpError(f"{where}: bad semaphore ids {ids}")
    if "barrier_id" in op and not 0 <= op["barrier_id"] < MAX_DEVICE_SYNCERS:
        raise InterpError(f"{where}: barrier id out of range")


# ------------------------------------------------------------------ execution
class _Rank:
    def __init__(self, plan, r, inp, out, in_bytes, out_bytes):
        g = plan["gpus"][r]
        self.g = g
        self.sz = _Sizes(g, in_bytes, out_bytes, plan.get("buffer_alignment", 16))
        ll = plan["protocol"] == "LL"
        per_chunk = -(-self.sz.size // self.sz.n)
        scratch = per_chunk * g["scratch_chunks"] * (2 if ll else 1)
        self.halves = 2 if plan.get("use_double_scratch_buffer") else 1
        self.bufs = {"i": inp, "o": out}
        self.scratch = [np.full(scratch // ELEM + 1, np.nan) for _ in range(self.halves)]
        self.pk_val = [np.full(scratch // ELEM + 1, np.nan) for _ in range(self.halves)]
        self.pk_flag = [np.zeros(scratch // ELEM + 1, np.int64) for _ in range(self.halves)]
        self.chans = {"memory": [], "port": []}
        for ch in g.get("channels", []):
            if ch["channel_type"] in self.chans:
                self.chans[ch["channel_type"]].extend(ch["connected_to"])
        self.switch = _switch_groups(g)
        self.inbound = {t: [0] * len(v) for t, v in self.chans.items()}
        self.expected = {t: [0] * len(v) for t, v in self.chans.items()}
        self.sems = [s["init_value"] for s in g.get("semaphores", [])]
        self.barriers: dict[int, int] = {}
        self.run = 0
        self.left = 0
        self.live: list = []      # this run's thread blocks


class _Tb:
    def __init__(self, rank, tb):
        self.rank = rank
        self.tb = tb
        self.ch = {c["channel_type"]: c["channel_ids"] for c in tb.get("channels", [])}
        self.rb = {c["access_channel_type"]: c["remote_buffer_ids"] for c in tb.get("remote_buffer_refs", [])}
        self.sw = [i for c in tb.get("channels", []) if c["channel_type"] == "switch" for i in c["channel_ids"]]
        self.steps = [(op, 0, None) for op in tb["ops"]]      # pipelines expanded at launch
        self.pc = 0
        self.prev = None          # the last operation since a nop: (name, reads, writes)
        self.barrier_target = None


def _pipeline_steps(rk: _Rank, op):
    """Every iteration's operations: a slice of each range, but packet operations, whose kernel
    handlers take no offset, whole in every iteration."""
    ctx = op["iter_context"]
    sz = rk.sz
    ub = -(-(sz.size // sz.align) // sz.n) * sz.align
    n_iter = -(-(ctx["num_chunks"] * ub) // ctx["unit_size"])
    return [(inner, 0, None) if inner["name"] in PACKET_OPS else (inner, i * ctx["unit_size"], ctx["unit_size"])
            for i in range(n_iter) for inner in op["ops"]]


def run_plan(plan: dict, inputs: list[np.ndarray], out_elems: int, *, seed: int = 0, runs: int = 1,
             check_sync: bool = True, eager: int | None = None,
             lazy: tuple[int, int] | None = None) -> list[np.ndarray]:
    """Run ``plan`` ``runs`` times on float64 ``inputs`` (one array per rank); returns the outputs
    (of the last run; every run computes the same). Raises :class:`InterpError` on a deadlock, a
    load-time check, a missing ``nop``, an unsupported operation, or a write into a peer's scratch
    by a later run while an operation of the peer's earlier run that touches those bytes has not
    run yet (a race between calls). ``eager``: a rank that moves as far as it can before the
    others take each of their random steps (a schedule that lets it run calls ahead). ``lazy``:
    ``(rank, thread block id)`` of a block that moves only when no other block can (a slow block:
    what it writes arrives late and what it reads is read late, so an operation that touches its
    bytes without waiting for it, through the synchronisation of another block, gets the wrong
    value or overwrites its source; the executor gives a block no order with the others but the
    plan's signals, semaphores, barriers and packets)."""
    R = len(plan["gpus"])
    in_bytes = len(inputs[0]) * ELEM
    out_bytes = out_elems * ELEM
    check_load(plan, in_bytes, out_bytes)
    coll = plan["collective"]
    ranks = []
    for r in range(R):
        out = np.full(out_elems, np.nan)
        inp = np.array(inputs[r], dtype=np.float64)
        if plan["inplace"]:
            if coll == "allgather":
                n = len(inp)
                out[r * n:(r + 1) * n] = inp
                inp = out[r * n:(r + 1) * n]
            elif coll == "reducescatter":
                out = inp[r * out_elems:(r + 1) * out_elems]
            else:
                out = inp
        ranks.append(_Rank(plan, r, inp, out, in_bytes, out_bytes))
    _pair_channels(ranks)
    rng = random.Random(seed)
    live: list[_Tb] = []

    def launch(r):
        rk = ranks[r]
        rk.run += 1
        tbs = [_Tb(r, tb) for tb in rk.g["threadblocks"]]
        for t in tbs:
            steps = []
            for op, _, _ in t.steps:
                steps.extend(_pipeline_steps(rk, op) if op["name"] == "pipeline" else [(op, 0, None)])
            t.steps = steps
        rk.left = len(tbs)
        rk.live = tbs
        live.extend(tbs)
        if not tbs and rk.run < runs:
            launch(r)

    for r in range(R):
        launch(r)
    def finish(k, t):
        live[k] = None
        rk = ranks[t.rank]
        rk.left -= 1
        if rk.left == 0 and rk.run < runs:
            launch(t.rank)

    while live:
        while eager is not None:
            ahead = False
            for k, t in enumerate(list(live)):
                if t is not None and t.rank == eager and (t.pc == len(t.steps) or _step(ranks, t, plan, check_sync)):
                    ahead = True
                    if t.pc == len(t.steps):
                        finish(k, t)
            live[:] = [t for t in live if t is not None]
            if not ahead:
                break
        order = list(range(len(live)))
        rng.shuffle(order)
        moved = False
        for slow in (False, True):
            if slow and moved:
                break                   # the lazy block moves only when no other block could
            for k in order:
                t = live[k]
                if t is None or (lazy is not None and (t.rank, t.tb["id"]) == tuple(lazy)) != slow:
                    continue
                if t.pc == len(t.steps) or _step(ranks, t, plan, check_sync):
                    moved = True
                    if t.pc == len(t.steps):
                        finish(k, t)
        live[:] = [t for t in live if t is not None]
        if live and not moved:
            stuck = "; ".join(f"rank {t.rank} tb {t.tb['id']} at op {t.pc} ({t.steps[t.pc][0]['name']})"
                              for t in live[:4])
            raise InterpError(f"deadlock: {stuck}")
    # every call must leave the counts as it found them: a signal (or semaphore release) nobody
    # consumed satisfies a wait (an acquire) of the next call before its data is there
    for r, rk in enumerate(ranks):
        for t in rk.inbound:
            for c, (got, used) in enumerate(zip(rk.inbound[t], rk.expected[t])):
                if got != used:
                    raise InterpError(f"rank {r}'s {t} channel {c}: {got} signals arrived over {runs} calls, "
                                      f"{used} waited for: the rest satisfy a later call's waits early")
        init = [s["init_value"] for s in rk.g.get("semaphores", [])]
        if rk.sems != init:
            raise InterpError(f"rank {r}'s semaphores end at {rk.sems}, not at their initial {init}")
    return [rk.bufs["o"] for rk in ranks]


def _pair_channels(ranks):
    for r, rk in enumerate(ranks):
        rk.partner = {}
        for t, peers in rk.chans.items():
            seen: dict[int, int] = {}
            for k, p in enumerate(peers):
                m = seen.get(p, 0)
                seen[p] = m + 1
                theirs = [j for j, q in enumerate(ranks[p].chans[t]) if q == r]
                if m >= len(theirs):
                    raise InterpError(f"rank {r}'s {t} channel {k} to rank {p} has no partner")
                rk.partner[(t, k)] = theirs[m]


def _span(rk, op, ref, offset, unit, tb, chan_type):
    """(rank, buffer letter, byte lo, byte size) of a buffer reference: the block's part of the
    range (thread-block groups), then a pipeline iteration's slice of that part."""
    lo, n = _iteration(op, *_tbg(op, *rk.sz.span(ref["index"], ref["size"]), rk.sz.align), offset, unit)
    if "buffer_id" in ref:
        gid = tb.rb[chan_type][ref["buffer_id"]]
        rb = rk.g["remote_buffers"][gid]
        return rb["rank"], rb["type"], lo, n
    return None, ref["type"], lo, n


def _view(ranks, owner, letter, lo, n, half):
    rk = ranks[owner]
    if lo % ELEM or n % ELEM:
        raise InterpError("access not aligned to the element size")
    if letter == "s":
        arr = rk.scratch[half]
    else:
        arr = rk.bufs[letter]
    if lo // ELEM + n // ELEM > len(arr):
        raise InterpError(f"rank {owner} buffer {letter} access [{lo}, {lo + n}) beyond its {len(arr) * ELEM} bytes")
    return arr[lo // ELEM:(lo + n) // ELEM]


def _iteration(op, lo, n, offset, unit):
    """A pipeline iteration's slice ``[offset, offset + unit)`` of a block's range (the whole range
    outside a pipeline). The loader cuts a group's part at load time and counts the iterations
    over the whole range (``num_chunks`` chunks), and the kernel takes ``min(size - offset,
    unitSize)`` in 32-bit unsigned arithmetic: an iteration past a group member's part would wrap
    and move ``unitSize`` bytes beyond it, which is refused here."""
    if unit is None:
        return lo, n
    if offset > n:
        part = " (its part of its thread-block group's range)" if op.get("tbg_info") else ""
        raise InterpError(f"'{op['name']}' in a pipeline: the iteration at byte {offset} starts past the "
                          f"{n} bytes the block moves{part}: the executor would move {unit} bytes beyond them")
    return lo + offset, min(n - offset, unit)


def _tbg(op, lo, n, align):
    info = op.get("tbg_info")
    if not info:
        return lo, n
    a = _calc_offset(n, info["tb_id"], info["tbg_size"], align)
    b = _calc_offset(n, info["tb_id"] + 1, info["tbg_size"], align)
    return lo + a, b - a


def _step(ranks, t: _Tb, plan, check_sync) -> bool:
    """Run ``t``'s next operation if it can; False when it must wait."""
    op, offset, unit = t.steps[t.pc]
    rk = ranks[t.rank]
    r = t.rank
    name = op["name"]
    half = (rk.run & 1) if rk.halves == 2 else 0
    flag = rk.run
    ctype = op.get("channel_type", "memory")
    align = rk.sz.align

    def chan(i):
        return t.ch[ctype][op["channel_ids"][i]]

    def refs(side):
        out = []
        for ref in op.get(side, []):
            owner, letter, lo, n = _span(rk, op, ref, offset, unit, t, ctype)
            out.append((r if owner is None else owner, letter, lo, n, owner is not None))
        return out

    def pk(owner, lo, n):
        k = ranks[owner]
        a, b = lo // ELEM, (lo + n) // ELEM
        return k.pk_val[half], k.pk_flag[half], a, b

    # ---- waits first (no effect when they block)
    if name in ("wait", "rlxwait"):
        for i in range(len(op["channel_ids"])):
            c = chan(i)
            if rk.inbound[ctype][c] <= rk.expected[ctype][c]:
                return False
        for i in range(len(op["channel_ids"])):
            rk.expected[ctype][chan(i)] += 1
        return _done(t, name, [], [], check_sync)
    if name == "sem_acquire":
        ids = op["semaphore_ids"]
        if any(rk.sems[s] < ids.count(s) for s in ids):      # atomic counters: named twice, taken twice
            return False
        for s in ids:
            rk.sems[s] -= 1
        return _done(t, name, [], [], check_sync)
    if name == "barrier":
        if t.barrier_target is None:
            b = op["barrier_id"]
            cur = rk.barriers.get(b, 0)
            t.barrier_target = (cur // op["num_threadblocks"] + 1) * op["num_threadblocks"]
            rk.barriers[b] = cur + 1
        if rk.barriers[op["barrier_id"]] < t.barrier_target:
            return False
        t.barrier_target = None
        return _done(t, name, [], [], check_sync)
    packet_reads = []
    if name in ("upkt", "repkt", "respkt", "recpkt", "recspkt", "rppkt"):
        srcs = refs("src_buff")
        start = 0 if name in ("upkt", "rppkt") else 1
        for (_, letter, lo, n, _) in srcs[start:]:
            val, fl, a, b = pk(r, lo, n)
            if (fl[a:b] != flag).any():
                return False
            packet_reads.append(val[a:b].copy())
    # ---- the rest always completes
    if name == "nop":
        t.prev = None
        t.pc += 1
        return True
    if name in SWITCH:
        return _switch_step(ranks, t, op, offset, unit, half, flag, check_sync)
    if any("switch_channel_id" in ref for side in ("src_buff", "dst_buff") for ref in op.get(side, [])):
        raise InterpError(f"{name} names a switch channel: only glres, gstore and gstorepkt do")
    if name in ("signal", "rlxsignal"):
        for i in range(len(op["channel_ids"])):
            _signal(ranks, r, ctype, chan(i))
        return _done(t, name, [], [], check_sync)
    if name == "flush":
        return _done(t, name, [], [], check_sync)
    if name == "sem_release":
        for s in op["semaphore_ids"]:
            rk.sems[s] += 1
        return _done(t, name, [], [], check_sync)
    src, dst = refs("src_buff"), refs("dst_buff")
    for o, letter, lo, n, remote in dst:
        if remote and letter == "s":
            _no_overtaking(ranks, r, o, lo, n, half, name)
    packed = None              # (plain region, start of the packets) a local packing wrote
    reads = [(o, l, lo, n) for o, l, lo, n, _ in src]
    writes = [(o, l, lo, n) for o, l, lo, n, _ in dst]
    if name in ("put", "pws", "pwsf"):
        for i, (o, l, lo, n, remote) in enumerate(dst):
            if not remote:
                raise InterpError("put to a local buffer")
            s = src[i] if i < len(src) else src[0]
            if ctype == "port" and ranks[r].chans["port"][chan(i)] != o:
                raise InterpError("port put through a channel to another rank than the buffer's")
            _view(ranks, o, l, lo, n, half)[:] = _view(ranks, r, s[1], s[2], n, half)
            if name in ("pws", "pwsf") and ctype == "port":
                _signal(ranks, r, ctype, chan(i))
    elif name == "get":
        for (o, l, lo, n, _), (o2, l2, lo2, n2, _) in zip(src, dst):
            _view(ranks, o2, l2, lo2, n, half)[:] = _view(ranks, o, l, lo, n, half)
    elif name == "copy":
        (o, l, lo, n, _), (o2, l2, lo2, _, _) = src[0], dst[0]
        _view(ranks, o2, l2, lo2, n, half)[:] = _view(ranks, o, l, lo, n, half)
    elif name in ("re", "res", "rre", "rres"):
        o, l, lo, n, _ = src[0]
        acc = _view(ranks, o, l, lo, n, half).copy()
        for (o, l, lo, _, remote) in src[1:]:
            if name in ("re", "res") and remote:
                raise InterpError("re reads local buffers only")
            acc += _view(ranks, o, l, lo, n, half)
        o, l, lo, _, _ = dst[0]
        _view(ranks, o, l, lo, n, half)[:] = acc
        if name in ("res", "rres"):
            for (o, l, lo, _, _) in dst[1:]:
                _view(ranks, o, l, lo, n, half)[:] = acc
    elif name == "ppkt" and ctype == "port":
        # the source is already packets (the rank's scratch): they are put as they are
        for i, (o, l, lo, n, _) in enumerate(dst):
            s = src[i] if i < len(src) else src[0]
            if s[1] != "s":
                raise InterpError("port ppkt from a buffer other than scratch is not modelled")
            val, fl, a, b = pk(r, s[2], n)
            val2, fl2, a2, b2 = pk(o, lo, n)
            val2[a2:b2], fl2[a2:b2] = val[a:b], fl[a:b]
        writes = []
    elif name == "ppkt":
        for i, (o, l, lo, n, _) in enumerate(dst):
            s = src[i] if i < len(src) else src[0]
            val, fl, a, b = pk(o, lo, n)
            val[a:b] = _view(ranks, r, s[1], s[2], n, half)
            fl[a:b] = flag
        writes = []
    elif name == "cpkt":
        (o, l, lo, n, _), (o2, l2, lo2, _, _) = src[0], dst[0]
        val, fl, a, b = pk(r, lo2, n)
        val[a:b] = _view(ranks, o, l, lo, n, half)
        fl[a:b] = flag
        writes = []
        packed = ((o, l, lo, n), lo2)
    elif name == "upkt":
        o, l, lo, n, _ = dst[0]
        _view(ranks, o, l, lo, n, half)[:] = packet_reads[0]
        reads = []
        # unpacking, into the very bytes they were packed from, packets the operation just before
        # packed: each packet is written after its bytes were, and read before they are written
        # again, so every thread's store puts the same value there (a benign overlap)
        got = t.prev[5] if t.prev is not None else None
        if got is not None:
            (po, pl, plo, pn), kpk = got
            s_lo = src[0][2]
            if (po, pl) == (o, l) and kpk <= s_lo and s_lo + n <= kpk + pn and lo - plo == s_lo - kpk:
                writes = []
    elif name == "rppkt":
        for (o, l, lo, n, _) in dst:
            val, fl, a, b = pk(o, lo, n)
            val[a:b] = packet_reads[0]
            fl[a:b] = flag
        reads, writes = [], []
    elif name in ("repkt", "respkt", "recpkt", "recspkt"):
        o, l, lo, n, _ = src[0]
        acc = _view(ranks, o, l, lo, n, half).copy()
        for v in packet_reads:
            acc += v
        o, l, lo, _, _ = dst[0]
        _view(ranks, o, l, lo, n, half)[:] = acc
        rest = dst[1:]
        if name in ("recpkt", "recspkt"):
            o, l, lo, _, _ = dst[1]
            val, fl, a, b = pk(r, lo, n)
            val[a:b], fl[a:b] = acc, flag
            rest = dst[2:]
            packed = (writes[0], lo)
        if name in ("respkt", "recspkt"):
            for (o, l, lo, _, _) in rest:
                val, fl, a, b = pk(o, lo, n)
                val[a:b], fl[a:b] = acc, flag
        reads, writes = reads[:1], writes[:1]
    else:
        raise InterpError(f"operation {name} is not modelled")
    return _done(t, name, reads, writes, check_sync, packed)


def _switch_ref(rk: _Rank, t: _Tb, op, ref, offset, unit):
    """(members, buffer letter, byte lo, byte size) of a reference through a switch channel."""
    members, letter = rk.switch[t.sw[ref["switch_channel_id"]]]
    lo, n = _iteration(op, *_tbg(op, *rk.sz.span(ref["index"], ref["size"]), rk.sz.align), offset, unit)
    return members, letter, lo, n


def _switch_step(ranks, t: _Tb, op, offset, unit, half, flag, check_sync) -> bool:
    """glres, gstore, gstorepkt (see the module's doc); False while gstorepkt's packets are not there."""
    rk, r, name = ranks[t.rank], t.rank, op["name"]
    dm, dl, dlo, dn = _switch_ref(rk, t, op, op["dst_buff"][0], offset, unit)
    if name == "gstorepkt":
        src = op["src_buff"][0]
        if src.get("type") != "s":
            raise InterpError("gstorepkt reads packets of a buffer other than the scratch")
        _, _, lo, n = _span(rk, op, src, offset, unit, t, "switch")
        a, b = lo // ELEM, (lo + n) // ELEM
        if (rk.pk_flag[half][a:b] != flag).any():
            return False
        vals = rk.pk_val[half][a:b].copy()
        if dl != "s":
            raise InterpError("gstorepkt through a switch channel over a buffer other than the scratch")
        for m in dm:
            if m != r:
                _no_overtaking(ranks, r, m, dlo, n, half, name)
            k = ranks[m]
            a2, b2 = dlo // ELEM, (dlo + n) // ELEM
            k.pk_val[half][a2:b2], k.pk_flag[half][a2:b2] = vals, flag
        return _done(t, name, [], [], check_sync)
    if name == "glres":
        sm, sl, slo, n = _switch_ref(rk, t, op, op["src_buff"][0], offset, unit)
        val = sum(_view(ranks, m, sl, slo, n, 0).copy() for m in sm)
        reads = [(m, sl, slo, n) for m in sm]
    else:
        src = op["src_buff"][0]
        _, sl, slo, n = _span(rk, op, src, offset, unit, t, "switch")
        val = _view(ranks, r, sl, slo, n, half).copy()
        reads = [(r, sl, slo, n)]
    writes = []
    for m in dm:
        if m != r and dl == "s":
            _no_overtaking(ranks, r, m, dlo, n, 0, name)
        _view(ranks, m, dl, dlo, n, 0)[:] = val
        writes.append((m, dl, dlo, n))
    return _done(t, name, reads, writes, check_sync)


def _touches(rk: _Rank, t: _Tb, step) -> list:
    """The (rank, letter, lo, n) regions one step of a thread block names."""
    op, offset, unit = step
    ctype = op.get("channel_type", "memory")
    out = []
    for side in ("src_buff", "dst_buff"):
        for ref in op.get(side, []):
            if "switch_channel_id" in ref:
                members, letter, lo, n = _switch_ref(rk, t, op, ref, offset, unit)
                out.extend((m, letter, lo, n) for m in members)
                continue
            owner, letter, lo, n = _span(rk, op, ref, offset, unit, t, ctype)
            out.append((t.rank if owner is None else owner, letter, lo, n))
    return out


def _no_overtaking(ranks, r, o, lo, n, half, name):
    """A write by rank r into rank o's scratch half ``half``: refused while an operation of an
    earlier run of rank o that touches those bytes (of that half) is still to run."""
    peer = ranks[o]
    if peer.run >= ranks[r].run or (peer.halves == 2 and (peer.run & 1) != half):
        return
    for t in peer.live:
        for step in t.steps[t.pc:]:
            for owner, letter, lo2, n2 in _touches(peer, t, step):
                if owner == o and letter == "s" and lo2 < lo + n and lo < lo2 + n2:
                    raise InterpError(f"race between calls: rank {r}'s {name} of call {ranks[r].run} writes rank "
                                      f"{o}'s scratch [{lo}, {lo + n}) while rank {o}'s call {peer.run} has still "
                                      f"to run {step[0]['name']} on those bytes")


def _signal(ranks, r, t, c):
    p = ranks[r].chans[t][c]
    ranks[p].inbound[t][ranks[r].partner[(t, c)]] += 1


#: packet operations whose thread t moves payload t, t + blockDim, ... of each of its buffers,
#: counted from the buffer's start (the kernel's upkt, repkt, respkt, recpkt, recspkt loops and
#: copyToPackets under cpkt and a memory-channel ppkt)
PER_PAYLOAD = {"upkt", "repkt", "respkt", "recpkt", "recspkt", "cpkt", "ppkt"}


def _overlap(a, b, same_thread=False):
    """Regions of a and b sharing bytes; with same_thread, not those that start at the same byte
    (one thread moves those bytes in both per-payload operations)."""
    return any(x[0] == y[0] and x[1] == y[1] and x[2] < y[2] + y[3] and y[2] < x[2] + x[3]
               and not (same_thread and x[2] == y[2]) for x in a for y in b)


def _per_payload(op) -> bool:
    return op["name"] in PER_PAYLOAD and not (op["name"] == "ppkt" and op.get("channel_type") == "port")


def _kind(op) -> str:
    """acquire / release (first threads only, see ACQUIRE and RELEASE), sync (the whole block:
    nop, barrier) or data. A put over a port channel is posted by the first threads to the proxy."""
    name = op["name"]
    if name in ("nop", "barrier"):
        return "sync"
    if name in ACQUIRE:
        return "acquire"
    if name in RELEASE or (name in ("put", "pws", "pwsf") and op.get("channel_type") == "port"):
        return "release"
    return "data"


def _done(t: _Tb, name, reads, writes, check_sync, packed=None) -> bool:
    op = t.steps[t.pc][0]
    kind = _kind(op)
    if check_sync and t.prev is not None:
        pkind, preads, pwrites, pname, pper, _ = t.prev
        same = pper and _per_payload(op)
        where = f"rank {t.rank} thread block {t.tb['id']} operation {t.pc} ({name} after {pname})"
        if pkind == "acquire" and kind == "data":
            raise InterpError(f"{where}: no nop between a wait of the first threads and the data operation after it")
        if pkind == "data" and kind == "release":
            raise InterpError(f"{where}: no nop between a data operation and the signal after it")
        if pkind == "data" and kind == "data" and (_overlap(pwrites, reads + writes, same)
                                                  or _overlap(preads, writes, same)):
            raise InterpError(f"{where}: no nop between data operations on the same bytes")
    t.prev = None if kind == "sync" else (kind, reads, writes, name, _per_payload(op), packed)
    t.pc += 1
    return True


# ------------------------------------------------------------------ the collective's postcondition
def oracle(coll: str, inputs: list[np.ndarray], out_elems: int, shift: int = 1) -> list[np.ndarray]:
    """Every rank's output. ``shift``: a SendRecv's, which the plan does not state; MSCCL++'s
    executor test checks rank ``r`` against the input of rank ``r - (split_mask + 1)``, its DSL's
    default split mask being 0."""
    R = len(inputs)
    if coll == "sendrecv":
        return [np.array(inputs[(r - shift) % R], copy=True) for r in range(R)]
    if coll == "allgather":
        full = np.concatenate(inputs)
        return [full.copy() for _ in range(R)]
    if coll == "allreduce":
        s = np.sum(inputs, axis=0)
        return [s.copy() for _ in range(R)]
    if coll == "reducescatter":
        s = np.sum(inputs, axis=0)
        return [s[r * out_elems:(r + 1) * out_elems].copy() for r in range(R)]
    if coll == "alltoall":
        b = len(inputs[0]) // R
        return [np.concatenate([inputs[j][r * b:(r + 1) * b] for j in range(R)]) for r in range(R)]
    raise InterpError(f"no oracle for {coll}")


def _calls_in_place(coll: str, inputs: list[np.ndarray], out_elems: int, runs: int,
                    shift: int = 1) -> list[np.ndarray]:
    """The outputs after ``runs`` in-place calls in a row: each call's input is the buffer the call
    before left (an in-place AllReduce sums again what it summed; an AllGather's input, the rank's
    part of its output, is what it was)."""
    ins = [np.array(x, dtype=np.float64) for x in inputs]
    outs = ins
    for _ in range(runs):
        outs = oracle(coll, ins, out_elems, shift)
        if coll == "allgather":
            n = len(ins[0])
            ins = [o[r * n:(r + 1) * n].copy() for r, o in enumerate(outs)]
        elif coll == "reducescatter":
            if runs > 1:      # the call may leave anything in the rest of its input
                raise InterpError("in-place ReduceScatter calls in a row have no defined result")
        else:
            ins = [o.copy() for o in outs]
    return outs


def check_plan(plan: dict, mult: int = 1, *, seed: int = 0, runs: int = 2, eager: int | None = None,
               shift: int = 1, lazy: tuple[int, int] | None = None) -> None:
    """Run the plan at the size ``mult`` x (alignment x chunks) on random integer data and compare
    every rank's output with the collective's (in place: after ``runs`` calls, each on what the one
    before left); raises :class:`InterpError` naming the first wrong element. ``eager``, ``lazy``:
    see :func:`run_plan`."""
    R = len(plan["gpus"])
    g = plan["gpus"][0]
    align = plan.get("buffer_alignment", 16)
    unit = align * max(g["input_chunks"], 1) * mult
    in_elems = unit // ELEM
    in_bytes = unit
    out_bytes = in_bytes * g["output_chunks"] // g["input_chunks"]
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-1000, 1000, in_elems).astype(np.float64) for _ in range(R)]
    outs = run_plan(plan, inputs, out_bytes // ELEM, seed=seed, runs=runs, eager=eager, lazy=lazy)
    want = (_calls_in_place(plan["collective"], inputs, out_bytes // ELEM, runs, shift) if plan["inplace"]
            else oracle(plan["collective"], inputs, out_bytes // ELEM, shift))
    for r in range(R):
        bad = np.flatnonzero(~(outs[r] == want[r]))
        if len(bad):
            e = int(bad[0])
            raise InterpError(f"rank {r} output element {e}: {outs[r][e]} (expected {want[r][e]}); "
                              f"{len(bad)} wrong")
