"""Test helper: a pool of long-lived worker processes, one rank each, that run collectives through
:class:`hccc.runtime.Communicator` (CPU emulation, POSIX shared memory, a torch FileStore
bootstrap). Workers are spawned once and reused, so torch is imported once per process; every job
makes fresh communicators, exactly as separate jobs would.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
import uuid
from pathlib import Path

import numpy as np


def _note(comm, protos: list | None, epochs: list | None, slices: list | None = None) -> None:
    """After a call: the protocol it ran and why not the one asked for; its LL flag state (the
    epoch the next LL call would get, the slot zeroings so far); its micro-batch slice."""
    if protos is not None:
        protos.append((comm.last_proto, comm.proto_note))
    if epochs is not None:
        epochs.append((comm.ll_epochs.next, comm.ll_epochs.zeroings))
    if slices is not None:
        slices.append(comm.last_slice_bytes)


def _run_job(job: dict, protos: list | None = None, epochs: list | None = None, slices: list | None = None):
    refuse = job.get("refuse_mappings_from")
    if refuse is None:
        return _run_job_as_given(job, protos, epochs, slices)
    # the system refuses every mapping of at least this many bytes (ENOMEM, as under ulimit -v)
    import errno
    import mmap
    real = mmap.mmap

    def mapping(fd, size, *a, **k):
        if size >= refuse:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        return real(fd, size, *a, **k)
    mmap.mmap = mapping
    try:
        return _run_job_as_given(job, protos, epochs, slices)
    finally:
        mmap.mmap = real


def _run_job_as_given(job: dict, protos: list | None, epochs: list | None, slices: list | None):
    from hccc.compiler.ir.check import load_ir_json
    from hccc.runtime.communicator import Communicator

    ir = load_ir_json(job["ir"]) if isinstance(job["ir"], str) and job["ir"].lstrip().startswith("{") \
        else job["ir"]
    outs = []
    os.environ.update(job.get("env", {}))
    boot = {"init_method": job["url"]}
    if job.get("nodes"):
        boot["node"] = job["nodes"][job["rank"]]
    if job.get("process_group"):
        # torch.distributed initialised by the job (as under torchrun): no bootstrap argument
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=job["url"], rank=job["rank"],
                                world_size=job["world"])
        boot = {}
    with Communicator(ir, rank=job["rank"], world_size=job.get("world_override", job["world"]),
                      **boot,
                      timeout_s=job.get("timeout", 30.0), kernel_timeout_s=job.get("kernel_timeout", 10.0),
                      dtype=job.get("dtype", "float32"), op=job.get("op", "sum"),
                      **({"proto": job["proto"]} if "proto" in job else {})) as comm:
        for call in job["calls"]:
            if "proto" in call:                 # the protocol asked for from this call on
                comm.proto = call["proto"]
            method, x, out_len, kwargs = call["method"], call["x"], call.get("out"), call.get("kwargs", {})
            if call.get("die"):                 # before the call
                os.kill(os.getpid(), signal.SIGKILL)
            if call.get("die_in_kernel"):       # after meeting the peers, instead of launching
                def die(*_a, **_k):
                    os.kill(os.getpid(), signal.SIGKILL)
                comm._pf.launch = die
            if call.get("launch_refused"):      # the system refuses the launch's threads
                def refused(*_a, **_k):
                    raise RuntimeError("can't start new thread")
                comm._pf.launch = refused
            if call.get("stop_in_kernel"):      # stopped (SIGSTOP) instead of launching
                def stop(*_a, **_k):
                    os.kill(os.getpid(), signal.SIGSTOP)
                comm._pf.launch = stop
            if call.get("sever_in_kernel"):     # the network connections drop, then the launch
                launch = comm._pf.launch

                def sever(*a, **k):
                    comm._net.tx.close()
                    launch(*a, **k)
                comm._pf.launch = sever
            if call.get("poke_ports"):          # garbage into every TCP port this process listens on
                _poke_own_ports()
            x = np.array(x, copy=True)
            if call.get("input_in_output"):      # all_gather in place: x is this rank's block of out
                out = np.full(out_len, -1, dtype=x.dtype)
                block = out[job["rank"] * len(x):(job["rank"] + 1) * len(x)]
                block[:] = x
                outs.append(np.array(getattr(comm, method)(block, out, **kwargs), copy=True))
                _note(comm, protos, epochs, slices)
                continue
            oii = call.get("output_in_input")
            if oii is not None:   # in place: out is x[at : at + out] (True: this rank's block of x)
                at = job["rank"] * out_len if oii is True else oii
                outs.append(np.array(getattr(comm, method)(x, x[at:at + out_len], **kwargs), copy=True))
                _note(comm, protos, epochs, slices)
                continue
            if out_len is None:
                res = getattr(comm, method)(x, **kwargs)
            else:
                out = np.full(out_len, np.nan if x.dtype.kind == "f" else -1, dtype=x.dtype)
                if method in ("all_reduce", "broadcast", "reduce"):    # out= is keyword-only there
                    res = getattr(comm, method)(x, out=out, **kwargs)
                else:
                    res = getattr(comm, method)(x, out, **kwargs)
            outs.append(np.array(res, copy=True))
            _note(comm, protos, epochs, slices)
    return outs


def _own_listening_ports() -> list[tuple[str, int]]:
    """The TCP (address, port) pairs this process listens on (IPv4 and IPv6)."""
    import socket
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:          # LISTEN, ours
                addr, port = f[1].rsplit(":", 1)
                if len(addr) == 8:                        # IPv4, little-endian hex
                    host = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
                    host = "127.0.0.1" if host == "0.0.0.0" else host
                else:
                    host = "::1"
                ports.append((host, int(port, 16)))
    return sorted(set(ports))


def _poke_own_ports() -> None:
    import socket
    rng = np.random.default_rng(0)
    for host, port in _own_listening_ports():
        for payload in (b"", rng.integers(0, 256, 64, dtype=np.uint8).tobytes(),
                        rng.integers(0, 256, 65536, dtype=np.uint8).tobytes()):
            try:
                with socket.create_connection((host, port), timeout=2) as s:
                    s.sendall(payload)
            except OSError:
                pass


def resources(settle_s: float = 0.0) -> dict:
    """Threads and sockets of this process (leak checks); with ``settle_s``, the least of each
    seen within that many seconds (after a failed call a thread of the transport or of the kernel
    may still be on its way out when the error is raised; what stays is a leak all the same)."""
    import time

    def once() -> dict:
        socks = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                socks += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                pass
        return {"threads": len(os.listdir("/proc/self/task")), "sockets": socks}

    got = once()
    end = time.monotonic() + float(settle_s)
    while time.monotonic() < end:
        time.sleep(0.05)
        now = once()
        got = {k: min(got[k], now[k]) for k in got}
    return got


def _worker(conn, environ: dict, cwd: str) -> None:
    # the environment and directory of the test that started this rank, as a spawned process
    # would have them (a forked one has its server's, from the first pool of the test process)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    import torch.distributed  # noqa: F401  (imported once, before the first job)
    while True:
        job = conn.recv()
        if job is None:
            return
        protos, epochs, slices = [], [], []
        try:
            outputs = _run_job(job, protos, epochs, slices)
            # per call: (the protocol it ran, why not the one asked for or None), (the next LL
            # epoch, slot zeroings so far), its micro-batch slice
            conn.send({"ok": True, "outputs": outputs, "protos": protos, "epochs": epochs, "slices": slices,
                       "resources": resources()})
        except BaseException as exc:   # reported to the test
            # a job whose test checks for leaks after a failure asks for the threads and sockets
            # to settle (``settle_s``); others answer at once: each failed job waited 2 s before
            conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                       "trace": traceback.format_exc(), "resources": resources(settle_s=job.get("settle_s", 0.0))})


#: what the pool's processes import before a job: the server they are forked from imports it
#: once (torch.distributed alone is about 3 s of CPU, which every spawned rank paid again)
PRELOAD = ["numpy", "torch.distributed", "rank_pool"]


def rank_context():
    """The multiprocessing context of rank processes: ``forkserver``, its server preloading
    :data:`PRELOAD` (one per test process, started with the first pool). Each rank is still a
    process of its own, forked from a single-threaded server that has run nothing but those
    imports, so it starts as a spawned one would, without importing them again; it takes the
    environment and working directory of the test that starts it (:func:`_worker`), and what a
    job imports of hccc is its own, as before."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def stop_rank_server() -> None:
    """End the rank processes' server, if this process started one, and wait for it: the CPU
    of the server and of every rank it forked (which it reaps) then counts as this process's
    children's, as a spawned rank's did (``--cpu-durations``, ``/usr/bin/time``)."""
    from multiprocessing import forkserver
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


class RankPool:
    """Up to ``size`` worker processes; :meth:`run` runs one job on the first ``world`` of them.
    ``lazy``: a worker is started when a job first needs it (a module's shared pool whose tests
    run on 2-4 ranks starts 4 processes, not ``size``: each imports torch.distributed, about 3 s
    of CPU); otherwise all ``size`` start at once (for tests that talk to :attr:`workers` directly)."""

    def __init__(self, size: int, tmpdir: Path, *, lazy: bool = False):
        self.ctx = rank_context()
        self.tmpdir = Path(tmpdir)
        self.size = size
        self.workers = []
        if not lazy:
            self.start(size)

    def start(self, n: int) -> None:
        """The first ``n`` workers running (those not started yet start now, together)."""
        if n > self.size:
            raise ValueError(f"the pool has {self.size} workers, {n} needed")
        while len(self.workers) < n:
            parent, child = self.ctx.Pipe()
            p = self.ctx.Process(target=_worker, args=(child, dict(os.environ), os.getcwd()), daemon=True)
            p.start()
            self.workers.append((p, parent))

    def run(self, ir_json, world: int, calls_per_rank, *, timeout: float = 30.0,
            wait_s: float = 600.0, per_rank: dict | None = None, **extra) -> list[dict]:
        """Run ``calls_per_rank[r]`` (a list of call dicts) on rank r of ``world``; returns each
        rank's reply (``ok`` and ``outputs``, or ``error``). ``ir_json``: one program for every
        rank, or a list of one per rank; ``per_rank``: rank -> job fields of that rank only."""
        self.start(world)
        url = "file://" + str(self.tmpdir / f"store-{uuid.uuid4().hex}")
        for r in range(world):
            job = {"ir": ir_json[r] if isinstance(ir_json, list) else ir_json, "rank": r, "world": world,
                   "url": url, "calls": calls_per_rank[r], "timeout": timeout, **extra}
            job.update((per_rank or {}).get(r, {}))
            self.workers[r][1].send(job)
        replies = []
        for r in range(world):
            conn = self.workers[r][1]
            if not conn.poll(wait_s):
                raise TimeoutError(f"rank {r} did not answer within {wait_s} s")
            replies.append(conn.recv())
        return replies

    def close(self) -> None:
        for p, conn in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, _ in self.workers:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def run_fresh(ir_json: str, world: int, calls_per_rank, tmpdir: Path, *, timeout: float = 20.0,
              wait_s: float = 300.0, **extra) -> list[dict | None]:
    """Like :meth:`RankPool.run` in ``world`` fresh processes (for jobs that kill a rank); a rank
    that died answers None."""
    pool = RankPool(world, tmpdir)
    try:
        url = "file://" + str(Path(tmpdir) / f"store-{uuid.uuid4().hex}")
        for r in range(world):
            pool.workers[r][1].send({"ir": ir_json, "rank": r, "world": world, "url": url,
                                     "calls": calls_per_rank[r], "timeout": timeout, **extra})
        replies = []
        for r in range(world):
            p, conn = pool.workers[r]
            try:
                replies.append(conn.recv() if conn.poll(wait_s) else {"ok": False, "error": "no answer"})
            except EOFError:
                replies.append(None)          # the process died
        return replies
    finally:
        pool.close()
