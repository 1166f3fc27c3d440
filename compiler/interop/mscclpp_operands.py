"""What every MSCCL++ plan operation must carry, from one table, checked before anything reads it.

:data:`OPERANDS` says per operation name the fields the executor's loader reads for it (buffer
lists with their least lengths, channels, semaphores, a barrier's id and size, a pipeline's body);
:func:`check_operation` refuses an operation missing one or carrying a value of the wrong kind, and
:func:`check_thread_block` the same for a thread block's channel and remote-buffer tables, so the
importer and the synchronisation checker only ever read well-formed operations. The least lengths
are what the operation's semantics index (``recpkt`` writes its result to ``dst_buff[0]`` and its
packets to ``dst_buff[1]``), never more, so no plan the executor runs is refused here.
"""
from __future__ import annotations

from dataclasses import dataclass

from hccc.compiler.interop.mscclpp_plan import MAX_DEVICE_SYNCERS


@dataclass(frozen=True)
class Operands:
    src: int = 0              #: least ``src_buff`` length (0: not read)
    dst: int = 0              #: least ``dst_buff`` length
    channels: bool = False    #: ``channel_ids`` (at least one) and a ``channel_type``
    semaphores: bool = False  #: ``semaphore_ids`` (at least one, each declared)
    barrier: bool = False     #: ``barrier_id`` and ``num_threadblocks``
    body: bool = False        #: a pipeline: ``ops`` and ``iter_context``


_SYNC_ON_CHANNELS = Operands(channels=True)
#: the fields each operation needs (the executor loader's reading of an operation)
OPERANDS: dict[str, Operands] = {
    "nop": Operands(),
    "barrier": Operands(barrier=True),
    "signal": _SYNC_ON_CHANNELS, "wait": _SYNC_ON_CHANNELS, "rlxsignal": _SYNC_ON_CHANNELS,
    "rlxwait": _SYNC_ON_CHANNELS, "flush": _SYNC_ON_CHANNELS,
    "sem_acquire": Operands(semaphores=True), "sem_release": Operands(semaphores=True),
    "put": Operands(1, 1), "pws": Operands(1, 1), "pwsf": Operands(1, 1), "get": Operands(1, 1),
    "copy": Operands(1, 1),
    "re": Operands(1, 1), "res": Operands(1, 1), "rre": Operands(1, 1), "rres": Operands(1, 1),
    "ppkt": Operands(1, 1), "rppkt": Operands(1, 1), "cpkt": Operands(1, 1), "upkt": Operands(1, 1),
    "repkt": Operands(1, 1), "respkt": Operands(1, 1), "recpkt": Operands(1, 2), "recspkt": Operands(1, 2),
    "glres": Operands(), "gstore": Operands(), "gstorepkt": Operands(),
    "pipeline": Operands(body=True),
}

CHANNEL_TYPES = ("memory", "port", "switch")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v, least: int = 0) -> bool:
    return isinstance(v, list) and len(v) >= least and all(_int(x) and x >= 0 for x in v)


def check_operation(op, path: tuple, err, nsem: int) -> None:
    """Refuse (``err(path, message)`` is raised) an operation whose fields do not fit
    :data:`OPERANDS`; ``nsem`` is the number of semaphores its rank declares."""
    name = op["name"]
    need = OPERANDS[name]
    for side, least in (("src_buff", need.src), ("dst_buff", need.dst)):
        refs = op.get(side, [])
        if not isinstance(refs, list) or len(refs) < least:
            raise err(path, f"'{name}' needs '{side}' with at least {least} buffer reference"
                            + ("s" if least > 1 else ""))
        for j, ref in enumerate(refs):
            where = path + (side, j)
            if not isinstance(ref, dict) or not _int(ref.get("index")) or not _int(ref.get("size")):
                raise err(where, "a buffer reference needs integer 'index' and 'size'")
            if ref["index"] < 0 or ref["size"] < 1:
                raise err(where, "a buffer reference's index must be non-negative and its size at least 1")
            if "buffer_id" in ref:
                if not _int(ref["buffer_id"]) or ref["buffer_id"] < 0:
                    raise err(where + ("buffer_id",), "'buffer_id' must be a non-negative integer")
            elif ref.get("type") not in ("i", "o", "s"):
                raise err(where, "a buffer reference needs a 'type' (i, o or s) or a 'buffer_id'")
    if "channel_type" in op and op["channel_type"] not in CHANNEL_TYPES:
        raise err(path + ("channel_type",), f"'channel_type' must be one of {', '.join(CHANNEL_TYPES)}")
    if "channel_ids" in op and not _ints(op["channel_ids"]):
        raise err(path + ("channel_ids",), "'channel_ids' must be a list of non-negative integers")
    if need.channels:
        if not _ints(op.get("channel_ids"), 1):
            raise err(path, f"'{name}' needs 'channel_ids': the channels it works on")
        if "channel_type" not in op:
            raise err(path, f"'{name}' needs a 'channel_type'")
        twice = [c for k, c in enumerate(op["channel_ids"]) if c in op["channel_ids"][:k]]
        if twice:
            # thread t works on the t-th channel: two threads would move one channel's counters at once
            raise err(path + ("channel_ids",), f"'{name}' names channel {twice[0]} twice: the executor's threads "
                                               f"would signal or wait on it at the same time (a race on its counts)")
    if need.semaphores or "semaphore_ids" in op:
        ids = op.get("semaphore_ids")
        if not _ints(ids, 1 if need.semaphores else 0):
            raise err(path + (("semaphore_ids",) if "semaphore_ids" in op else ()),
                      f"'{name}' needs 'semaphore_ids': a list of non-negative integers")
        bad = [s for s in ids if s >= nsem]
        if bad:
            raise err(path + ("semaphore_ids",), f"semaphore {bad[0]} is not declared: the rank declares "
                                                 f"{nsem} ('semaphores')")
    if need.barrier:
        b, n = op.get("barrier_id"), op.get("num_threadblocks")
        if not _int(b) or not 0 <= b < MAX_DEVICE_SYNCERS:
            raise err(path, f"'barrier' needs a 'barrier_id' in 0..{MAX_DEVICE_SYNCERS - 1} (MAX_DEVICE_SYNCERS)")
        if not _int(n) or n < 1:
            raise err(path, "'barrier' needs 'num_threadblocks', a positive integer")
    if "tbg_info" in op:
        g = op["tbg_info"]
        if not isinstance(g, dict) or not _int(g.get("tb_id")) or not _int(g.get("tbg_size")) \
                or not 0 <= g["tb_id"] < g["tbg_size"]:
            raise err(path + ("tbg_info",), "'tbg_info' needs integers 'tb_id' and 'tbg_size', 0 <= tb_id < tbg_size")
    if need.body:
        ctx = op.get("iter_context")
        if not isinstance(op.get("ops"), list):
            raise err(path, "'pipeline' needs 'ops', its body")
        if not isinstance(ctx, dict) or not all(_int(ctx.get(k)) and ctx[k] > 0 for k in ("unit_size", "num_chunks")):
            raise err(path, "'pipeline' needs 'iter_context' with positive integers 'unit_size' and 'num_chunks'")


def check_thread_block(tb, path: tuple, err) -> None:
    """Refuse a thread block whose channel or remote-buffer tables are malformed."""
    for key, kind, ids in (("channels", "channel_type", "channel_ids"),
                           ("remote_buffer_refs", "access_channel_type", "remote_buffer_ids")):
        lst = tb.get(key, [])
        if not isinstance(lst, list):
            raise err(path + (key,), f"'{key}' must be a list")
        for k, c in enumerate(lst):
            if not isinstance(c, dict) or c.get(kind) not in CHANNEL_TYPES:
                raise err(path + (key, k), f"each of '{key}' needs a '{kind}' (one of {', '.join(CHANNEL_TYPES)})")
            if not _ints(c.get(ids)):
                raise err(path + (key, k), f"each of '{key}' needs '{ids}', a list of non-negative integers")


def semaphore_inits(gpu, path: tuple, err) -> list[int]:
    """The declared semaphores' initial values (non-negative integers)."""
    sems = gpu.get("semaphores", [])
    if not isinstance(sems, list):
        raise err(path + ("semaphores",), "'semaphores' must be a list")
    out = []
    for k, s in enumerate(sems):
        v = s.get("init_value", 0) if isinstance(s, dict) else None
        if not _int(v) or v < 0:
            raise err(path + ("semaphores", k, "init_value"), "a semaphore needs a non-negative integer 'init_value'")
        out.append(v)
    return out


__all__ = ["OPERANDS", "Operands", "check_operation", "check_thread_block", "semaphore_inits"]
