"""One job of N rank processes for the benchmarks that measure a process per rank
(``alltoallv.py``, ``communicator_latency.py``, ``torch_backend.py``, ``torch_gpu_check.py``,
``transport.py``).

:func:`run_ranks` spawns ``world`` processes, each calling ``fn(rank, world, store_dir, *args)``
with a fresh temporary directory ``store_dir`` that every rank shares (a torch ``FileStore`` lives
there: :func:`store_url`). Each rank's return value comes back; a rank that raises, dies without
answering or is still running at the time limit makes the job fail with every rank's reason
(:class:`RankJobError`), and the processes still running then are killed, so a benchmark never
waits on a dead peer. ``fn`` must be a module-level function (the processes are spawned, not
forked: the parent may hold threads).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable

POLL_S = 0.5          # how often the parent looks at dead ranks while it waits for replies
JOIN_GRACE_S = 5.0    # how long a rank may take to exit after its reply before it is killed


class RankJobError(RuntimeError):
    """Some rank did not return: ``reasons`` {rank: what happened}."""

    def __init__(self, reasons: dict[int, str]):
        self.reasons = reasons
        super().__init__("; ".join(f"rank {r}: {why}" for r, why in sorted(reasons.items())))


def store_url(store_dir: str, name: str = "store") -> str:
    """The ``file://`` init method of a store called ``name`` in the job's directory."""
    return f"file://{os.path.join(store_dir, name)}"


def _entry(fn: Callable, rank: int, world: int, store_dir: str, args: tuple, q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        q.put((rank, True, fn(rank, world, store_dir, *args)))
    except BaseException as exc:           # the rank's error is the job's reason
        q.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn: Callable[..., Any], world: int, args: tuple = (), timeout_s: float = 1800.0) -> list[Any]:
    """Every rank's return value of ``fn(rank, world, store_dir, *args)``, in rank order; the job
    ends at the first rank that fails, or at ``timeout_s``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hccc-ranks-") as store_dir:
        procs = [ctx.Process(target=_entry, args=(fn, r, world, store_dir, args, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        replies: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < world and time.monotonic() < deadline:
            try:
                r, ok, val = q.get(timeout=POLL_S)
                replies[r] = (ok, val)
                if not ok:                 # its peers would wait on it until their own timeouts
                    break
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
        for p in procs:
            p.join(JOIN_GRACE_S if len(replies) == world else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    failed = sorted(r for r, (ok, _) in replies.items() if not ok)
    reasons = {}
    for r in range(world):
        if r not in replies:
            exitcode = procs[r].exitcode
            if exitcode != -9:
                reasons[r] = f"exited with status {exitcode} without an answer"
            elif failed:
                reasons[r] = f"stopped after rank {failed[0]} failed"
            else:
                reasons[r] = f"no answer within {timeout_s:g} s"
        elif not replies[r][0]:
            reasons[r] = replies[r][1]
    if reasons:
        raise RankJobError(reasons)
    return [replies[r][1] for r in range(world)]
