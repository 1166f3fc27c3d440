"""Test helper: jobs that run in separate processes, one rank each, under torch.distributed with the
``"hccc"`` backend (CPU emulation) or gloo, and :func:`spawn`, which runs one job on N fresh
processes and returns each rank's reply (or its error) within a time limit; and
:func:`ranks_in_threads`, which runs an HcccProcessGroup per rank in threads of this process."""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _entry(job, rank, world, url, args, q) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        q.put((rank, True, job(rank, world, url, *args)))
    except BaseException as exc:
        q.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def spawn(job, world: int, tmpdir, *args, wait_s: float = 600.0) -> list[tuple[bool, object]]:
    """Run ``job(rank, world, init_url, *args)`` on ``world`` fresh processes; returns
    ``(ok, reply or error text)`` per rank; a rank that died without replying gives
    ``(False, "died")``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    url = f"file://{tmpdir}/store-{time.monotonic_ns()}"
    procs = [ctx.Process(target=_entry, args=(job, r, world, url, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    replies: dict[int, tuple[bool, object]] = {}
    deadline = time.monotonic() + wait_s
    while len(replies) < world and time.monotonic() < deadline:
        try:
            r, ok, val = q.get(timeout=0.5)
            replies[r] = (ok, val)
        except Exception:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    return [replies.get(r, (False, "died")) for r in range(world)]


def init(backend: str, rank: int, world: int, url: str, timeout_s: float = 60.0, **kw) -> None:
    import torch.distributed as dist
    if "hccc" in backend:
        import hccc.torch  # noqa: F401
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)


# ------------------------------------------------------------------------------------ jobs
def collectives_job(rank: int, world: int, url: str, backend: str):
    """Every collective the backend serves, on inputs every rank can recompute; each result
    compared with its definition computed here from those inputs (torch arithmetic)."""
    import torch
    import torch.distributed as dist
    init(backend, rank, world, url)

    def inp(r, n, dtype=torch.float32):
        return (torch.arange(n) % 13 + 7 * r).to(dtype)

    n = 4 * 96
    checks = {}
    t = inp(rank, n)
    dist.all_reduce(t)
    checks["allreduce"] = torch.equal(t, sum(inp(r, n) for r in range(world)))
    t = inp(rank, n)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checks["allreduce max"] = torch.equal(t, inp(world - 1, n))
    t = inp(rank, n)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    checks["allreduce avg"] = torch.allclose(t, sum(inp(r, n) for r in range(world)) / world)
    w = dist.all_reduce(t2 := inp(rank, n, torch.int32), async_op=True)
    fut = w.get_future()
    got = fut.wait()
    checks["async allreduce"] = (w.is_completed() and torch.equal(t2, sum(inp(r, n, torch.int32)
                                                                          for r in range(world)))
                                 and got[0] is t2)
    out = torch.empty(world * n)
    dist.all_gather_into_tensor(out, inp(rank, n))
    checks["all_gather_into_tensor"] = torch.equal(out, torch.cat([inp(r, n) for r in range(world)]))
    out = torch.empty(world * n)
    out.chunk(world)[rank].copy_(inp(rank, n))
    dist.all_gather_into_tensor(out, out.chunk(world)[rank])     # in place, as FSDP calls it
    checks["all_gather_into_tensor in place"] = torch.equal(out, torch.cat([inp(r, n) for r in range(world)]))
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_gather(outs, inp(rank, n))
    checks["all_gather"] = all(torch.equal(outs[r], inp(r, n)) for r in range(world))
    full = [inp(r, world * n) for r in range(world)]
    o = torch.empty(n)
    dist.reduce_scatter_tensor(o, full[rank])
    checks["reduce_scatter_tensor"] = torch.equal(o, sum(full).chunk(world)[rank])
    o = torch.empty(n)
    dist.reduce_scatter(o, list(full[rank].chunk(world)), op=dist.ReduceOp.MIN)
    checks["reduce_scatter min"] = torch.equal(o, torch.stack(full).min(0).values.chunk(world)[rank])
    t = inp(rank, n)
    dist.broadcast(t, src=0)
    checks["broadcast"] = torch.equal(t, inp(0, n))
    t = inp(rank, n)
    dist.reduce(t, dst=0)
    checks["reduce"] = torch.equal(t, sum(inp(r, n) for r in range(world))) if rank == 0 \
        else torch.equal(t, inp(rank, n))
    a = inp(rank, world * n)
    b = torch.empty(world * n)
    dist.all_to_all_single(b, a)
    checks["all_to_all_single"] = torch.equal(
        b, torch.cat([inp(r, world * n).chunk(world)[rank] for r in range(world)]))
    dist.barrier()
    # float64 and int64 (DDP's start-up calls) are served by hccc's kernels; int8 is not (no kernel);
    # a non-contiguous tensor is (on a copy)
    for wide in (torch.float64, torch.int64):
        t = inp(rank, n, wide)
        dist.all_reduce(t)
        checks[f"{wide} allreduce"] = torch.equal(t, sum(inp(r, n, wide) for r in range(world)))
    t = inp(rank, n, torch.int8)
    dist.all_reduce(t)
    checks["int8 fallback"] = torch.equal(t, sum(inp(r, n, torch.int8) for r in range(world)))
    t = inp(rank, 2 * n).view(2, n)[:, ::2]
    dist.all_reduce(t)
    checks["non-contiguous"] = torch.equal(
        t, sum(inp(r, 2 * n).view(2, n)[:, ::2] for r in range(world)))
    import hccc.torch
    stats = hccc.torch.stats() if "hccc" in backend else {}
    # a subgroup of 2 ranks: its own process group; the catalog has no 2-rank algorithms
    sub = dist.new_group([0, 1])
    sub_stats = None
    if rank < 2:
        t = inp(rank, n)
        dist.all_reduce(t, group=sub)
        checks["subgroup allreduce"] = torch.equal(t, inp(0, n) + inp(1, n))
        sub_stats = hccc.torch.stats(sub) if "hccc" in backend else None
    dist.destroy_process_group()
    return {"checks": checks, "stats": stats, "sub_stats": sub_stats}


def train_job(rank: int, world: int, url: str, backend: str, mode: str, steps: int):
    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    import torch.distributed as dist
    from train_ddp import train
    snaps, losses = train(backend, steps, mode, rank=rank, world=world, init_method=url)
    stats = {}
    if "hccc" in backend:
        import hccc.torch
        stats = hccc.torch.stats()
    dist.destroy_process_group()
    return {"snaps": [s.numpy() for s in snaps], "losses": losses, "stats": stats}


def bad_input_job(rank: int, world: int, url: str, timeout_s: float):
    """Mismatched counts, mismatched dtypes, a tensor on a wrong device, then a rank that dies:
    each on a fresh group of every rank; returns (scenario, error text or None, seconds) per
    scenario as this rank saw it."""
    import torch
    import torch.distributed as dist
    init("hccc", rank, world, url, timeout_s=6 * timeout_s)   # the groups below time out first
    seen = []

    def attempt(name, fn):
        g = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=timeout_s))
        dist.all_reduce(torch.ones(8), group=g)           # the group's communicator exists
        t0 = time.monotonic()
        try:
            fn(g)
            err = None
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        seen.append((name, err, time.monotonic() - t0))
        if name != "dead rank":
            dist.barrier()      # on the default group (longer timeout): every rank is done with g

    attempt("count", lambda g: dist.all_reduce(torch.ones(8 if rank == 0 else 16), group=g))
    attempt("dtype", lambda g: dist.all_reduce(torch.ones(8, dtype=torch.float16 if rank == 1
                                                           else torch.float32), group=g))
    attempt("device", lambda g: dist.all_reduce(torch.ones(8, device="meta" if rank == 2 else "cpu"),
                                                group=g))

    def die(g):
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(8), group=g)
    attempt("dead rank", die)
    return seen


def builtin_job(rank: int, world: int, url: str):
    """No catalog and no environment: the built-in catalog carries the calls; each result against
    its definition (torch arithmetic on inputs every rank recomputes, the AVGs at values whose
    sum overflows the dtype); returns the stats."""
    import torch
    import torch.distributed as dist

    import hccc.torch
    init("hccc", rank, world, url)
    n = 64 * world
    checks = {}

    def inp(r, dtype=torch.float32, k=n):
        return (torch.arange(k) % 13 + 7 * r).to(dtype)
    t = inp(rank)
    dist.all_reduce(t)
    checks["allreduce"] = torch.equal(t, sum(inp(r) for r in range(world)))
    t = torch.full((n,), 40000.0 - 1000 * rank, dtype=torch.float16)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = torch.tensor(sum(40000.0 - 1000 * r for r in range(world)) / world).to(torch.float16)
    checks["allreduce avg float16"] = bool((t == want).all())
    big = torch.full((n,), 3e38, dtype=torch.float32)
    out = torch.empty(n // world)
    dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.AVG)
    checks["reduce_scatter avg float32"] = bool(torch.isclose(out, torch.tensor(3e38), rtol=1e-6).all())
    t = torch.full((n,), 3e38, dtype=torch.float32)
    dist.reduce(t, dst=0, op=dist.ReduceOp.AVG)
    checks["reduce avg float32"] = (rank != 0) or bool(torch.isclose(t, torch.tensor(3e38), rtol=1e-6).all())
    t = inp(rank, torch.int32)
    dist.all_reduce(t)
    checks["allreduce int32"] = torch.equal(t, sum(inp(r, torch.int32) for r in range(world)))
    t = inp(rank)
    dist.broadcast(t, src=world - 1)
    checks["broadcast"] = torch.equal(t, inp(world - 1))
    o = torch.empty(n * world)
    dist.all_gather_into_tensor(o, inp(rank))
    checks["allgather"] = torch.equal(o, torch.cat([inp(r) for r in range(world)]))
    dist.barrier()
    stats = hccc.torch.stats()
    # the last call: AVG on rank 0, SUM on the others, both on hccc's sum kernel
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(n), op=dist.ReduceOp.AVG if rank == 0 else dist.ReduceOp.SUM)
        mismatch = None
    except Exception as exc:
        mismatch = f"{type(exc).__name__}: {exc}"
    mismatch_s = time.monotonic() - t0
    # a new group: an all_reduce on rank 0, a broadcast on the others (two algorithms whose
    # communicators are not made yet: their set-ups would wait for each other)
    g = dist.new_group(list(range(world)))
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(n), group=g)
        else:
            dist.broadcast(torch.ones(n), src=0, group=g)
        apart = None
    except Exception as exc:
        apart = f"{type(exc).__name__}: {exc}"
    return {"checks": checks, "stats": stats, "mismatch": mismatch, "mismatch_s": mismatch_s,
            "apart": apart, "apart_s": time.monotonic() - t0}


def two_nodes_job(rank: int, world: int, url: str):
    """Ranks on two nodes (``HCCC_NODE``: the first half on node a, the rest on b) with no
    catalog: the built-in catalog's hierarchical algorithms, over the network transport."""
    import torch
    import torch.distributed as dist

    import hccc.torch
    os.environ["HCCC_NODE"] = "a" if rank < world // 2 else "b"
    os.environ.setdefault("UCX_TLS", "tcp")
    init("hccc", rank, world, url)
    n = 64 * world

    def inp(r):
        return (torch.arange(n) % 13 + 7 * r).to(torch.float32)
    t = inp(rank)
    dist.all_reduce(t)
    ok = torch.equal(t, sum(inp(r) for r in range(world)))
    return {"ok": ok, "stats": hccc.torch.stats()}


def scatter_job(rank: int, world: int, url: str, backend: str):
    """torch.distributed.scatter with no catalog and no environment (on hccc: the built-in
    catalog) at several dtypes, roots and sizes; on hccc also into a strided output (checked here)
    and from a root whose scatter_list is one tensor short. Returns every result (as lists), and on
    hccc whether the strided one is right, the error each rank got from the bad call and the stats."""
    import torch
    import torch.distributed as dist
    init(backend, rank, world, url, timeout_s=30.0)
    got = []
    for i, (dtype, root, n) in enumerate([(torch.float32, 0, 64), (torch.float16, world - 1, 5),
                                          (torch.bfloat16, 1 % world, 33), (torch.int32, 0, 1),
                                          (torch.int64, world - 1, 17), (torch.uint8, 0, 40),
                                          (torch.float64, 1 % world, 9)]):
        lst = ([(torch.arange(n) * (r + 2) + 3 * i + r).to(dtype) for r in range(world)]
               if rank == root else None)
        out = torch.full((n,), 7, dtype=dtype)
        dist.scatter(out, lst, src=root)
        got.append(out.to(torch.float64).numpy().tolist())
    if backend != "hccc":
        # gloo writes a strided output as if it were contiguous; its root refuses the short list
        # below, and the other ranks would wait for it
        return {"got": got}
    # a strided output: every other element of a buffer
    buf = torch.zeros(2 * 12)
    lst = [torch.arange(12, dtype=torch.float32) + 100 * r for r in range(world)] if rank == 0 else None
    dist.scatter(buf[::2], lst, src=0)
    want = torch.zeros(2 * 12)
    want[::2] = torch.arange(12, dtype=torch.float32) + 100 * rank
    strided = torch.equal(buf, want)
    import hccc.torch
    stats = hccc.torch.stats()
    try:
        lst = [torch.ones(4)] * (world - 1) if rank == 0 else None
        dist.scatter(torch.empty(4), lst, src=0)
        bad = None
    except Exception as exc:
        bad = f"{type(exc).__name__}: {exc}"
    return {"got": got, "strided": strided, "bad": bad, "stats": stats}


def topology_job(rank: int, world: int, url: str):
    """No catalog, a topology (``HCCC_TOPOLOGY``, set by the caller): 1 MiB calls, where the
    programs synthesized for the topology are the fastest the simulator finds; each result against
    its definition; returns the checks and the stats."""
    import torch
    import torch.distributed as dist

    import hccc.torch
    init("hccc", rank, world, url, timeout_s=120.0)
    n = (1 << 20) // 4

    def inp(r, k=n):
        return (torch.arange(k) % 29 + 3 * r).to(torch.float32)
    checks = {}
    t = inp(rank)
    dist.all_reduce(t)
    checks["allreduce"] = torch.equal(t, sum(inp(r) for r in range(world)))
    o = torch.empty(n)
    dist.all_gather_into_tensor(o, inp(rank, n // world))
    checks["allgather"] = torch.equal(o, torch.cat([inp(r, n // world) for r in range(world)]))
    return {"checks": checks, "stats": hccc.torch.stats()}


def root_with_a_bad_list(between):
    """Jobs for :func:`ranks_in_threads` (``job(rank)``, two ranks): a good scatter from root 1,
    then (both ranks past ``between``, a ``threading.Barrier(2)``) a root whose scatter_list is of
    the wrong dtype: the root's call is refused, rank 0 waits in the delegate until told that the
    calls differ."""
    import torch
    import torch.distributed as dist

    def job(rank):
        def run(pg):
            opts = dist.ScatterOptions()
            opts.rootRank = 1
            lists = [[torch.arange(3.0) + 10 * r for r in range(2)]] if rank == 1 else []
            pg.scatter([torch.zeros(3)], lists, opts).wait()
            between.wait(timeout=30)
            wrong = [[torch.ones(3, dtype=torch.int32)] * 2] if rank == 1 else []
            pg.scatter([torch.zeros(3)], wrong, opts).wait()
        return run
    return job


def ranks_in_threads(jobs, options=None, timeout_s=20.0, world=None):
    """Make a ``world``-rank HcccProcessGroup in one thread per rank on one store, then run
    ``jobs[r](pg)`` on rank r; each rank's (result or exception, seconds the job took)."""
    import torch.distributed as dist

    from hccc.torch import HcccProcessGroup, Options
    world = world or len(jobs)
    store = dist.HashStore()
    out = [None] * world

    def run(r):
        pg = None
        t0 = time.monotonic()
        try:
            opt = options[r] if isinstance(options, list) else options
            pg = HcccProcessGroup(store, r, world, datetime.timedelta(seconds=timeout_s),
                                  opt if opt is not None else Options())
            t0 = time.monotonic()
            out[r] = (jobs[r](pg), time.monotonic() - t0)
        except Exception as exc:
            out[r] = (exc, time.monotonic() - t0)
        finally:
            if pg is not None:
                pg.shutdown()
    ts = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(3 * timeout_s)
    return out


def ledgers(kind: str, world: int) -> list:
    """One call ledger per rank of a ``world``-rank group in this process: ``"shm"`` (shared
    segments each rank attaches to the others') or ``"store"`` (one HashStore, every look going to
    it), for tests that drive the ledger directly."""
    import torch.distributed as dist
    from hccc.torch.ledger import ShmLedger, StoreLedger
    if kind == "store":
        store = dist.HashStore()
        ls = [StoreLedger(store, r, world) for r in range(world)]
        for led in ls:
            led.conflict_every_s = 0.0            # every look goes to the store
        return ls
    ls = [ShmLedger(r, world) for r in range(world)]
    for led in ls:
        led.attach([x.handle for x in ls])
    for led in ls:
        led.mapped()
    return ls
