"""Helpers for ranks on several nodes through the network transport: whether UCX is installed, the
environment that keeps UCX on TCP, and :func:`run_ranks`, which runs one fresh process per rank."""
from __future__ import annotations

import os
from pathlib import Path


def have_ucx() -> bool:
    """UCX's headers are installed (or HCCC_UCX_HOME names them): the network transport can build."""
    return Path("/usr/include/ucp/api/ucp.h").exists() or bool(os.environ.get("HCCC_UCX_HOME"))


#: the environment that keeps UCX on TCP (one machine runs every "node")
TCP = {"UCX_TLS": "tcp"}


def _entry(target, environ: dict, cwd: str, rank: int, url: str, args: tuple, q) -> None:
    # the environment and directory of the test that started this rank, as a spawned process
    # would have them (a forked one has those of the server, from the test process's first pool)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    target(rank, url, *args, q)


def run_ranks(target, nranks: int, url: str, *args, timeout: float, join: float) -> dict:
    """Each rank in a fresh process running ``target(rank, url, *args, queue)``, which puts
    ``(rank, result)`` on the queue (a string: what went wrong); the results by rank, every
    process joined (killed if it outlives ``join`` seconds). The processes come from
    :func:`rank_pool.rank_context`'s server, which has imported torch.distributed once (a spawned
    rank paid its 2-3 s of CPU again)."""
    from rank_pool import rank_context
    ctx = rank_context()
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(target, dict(os.environ), os.getcwd(), r, url, args, q))
             for r in range(nranks)]
    for p in procs:
        p.start()
    try:
        return dict(q.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(join)
            if p.is_alive():
                p.kill()
