"""hccc's cross-node path against UCX itself, and a 2-node AllReduce against torch.distributed's gloo.

    python benchmarks/transport.py [--tls tcp] [--sizes 4K,64K,1M,4M] [--lat-iters 2000]
                                   [--bw-bytes 64M] [--allreduce 64K,1M,8M] [--json]

1. **Path** (two processes on two nodes, ``UCX_TLS`` as given): a 2-rank communicator is set up,
   then its cross-node connections are driven from the host exactly as the kernels drive them
   (a message written into the FIFO mirror, ``tail`` stored; the receiver polls its ``tail``,
   copies the message out and stores ``head``), so what is timed is the proxy: the progress
   thread that puts the slot, fences, puts the tail, and returns the credit.
   *Latency*: ping-pong of one message, half the round trip, against ``ucx_perftest -t
   ucp_put_lat`` (also half a round trip of puts) at the same size. *Bandwidth*: a stream of
   messages (``--bw-bytes`` worth, 16 to 4,000 of them) through the FIFO's slots, against
   ``ucx_perftest -t ucp_put_bw`` with as many messages. MiB/s both (UCX's
   "MB/s" is 2^20 bytes per second).
2. **AllReduce** (2 nodes x 2 ranks, four processes, one torch.distributed gloo group): hccc's ring
   AllReduce through :class:`~hccc.runtime.Communicator` (CPU emulation, cross-node connections
   over UCX) against ``torch.distributed.all_reduce`` on gloo, same processes, same float32
   tensors; median of the calls, ratio gloo time / hccc time (above 1: hccc is faster).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np

from hccc.args import parse_size


# ------------------------------------------------------------------------------ ucx_perftest
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(test: str, size: int, iters: int, tls: str) -> dict:
    """One ``ucx_perftest`` run (server and client on this machine): latency (us), MiB/s."""
    exe = shutil.which("ucx_perftest")
    if exe is None:
        raise SystemExit("ucx_perftest not found (Debian/Ubuntu: apt-get install ucx-utils)")
    env = {**os.environ, "UCX_TLS": tls}
    port = str(_free_port())
    args = ["-t", test, "-s", str(size), "-n", str(iters), "-p", port]
    server = subprocess.Popen([exe, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.5)
        for _ in range(20):
            res = subprocess.run([exe, "127.0.0.1", *args], env=env, capture_output=True, text=True,
                                 timeout=300)
            if "Final:" in res.stdout:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"ucx_perftest {test} failed:\n{res.stdout}\n{res.stderr}")
    finally:
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Final:"))
    f = re.split(r"\s+", line.strip())
    # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
    return {"lat_us": float(f[3]), "mib_s": float(f[6])}


# ------------------------------------------------------------------------------ hccc's path
def _stream_count(m: int, bw_bytes: int) -> int:
    """Messages of a bandwidth point: ``bw_bytes`` worth, between 16 and 4,000."""
    return max(16, min(bw_bytes // m, 4000))


def _path_rank(rank, url, tls, sizes, lat_iters, bw_bytes, q):
    os.environ["UCX_TLS"] = tls
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.communicator import Communicator
    slot = max(sizes) + 64
    ir = build_program(gen.ring_allgather(2), chunk_bytes=(slot + 15) // 16 * 16)
    comm = Communicator(ir, rank=rank, world_size=2, init_method=url, node="ab"[rank],
                        timeout_s=120)
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(128, dtype=np.float32)
    comm.all_gather(x, out)                       # connected and right
    assert out[64 * rank:64 * (rank + 1)].tolist() == x.tolist()
    net, mem, plan = comm._net, comm._mem, comm._plans[rank]
    mslots, shead, mtail = mem.send_conns[0]
    rslots, mhead, rtail = mem.recv_conns[0]
    nslots, slot_bytes = plan.nslots, plan.slot_bytes
    u64 = ctypes.c_uint64
    t_tail, t_mtail = u64.from_address(rtail), u64.from_address(mtail)
    t_head, t_mhead = u64.from_address(shead), u64.from_address(mhead)
    res = {}
    phase = [0]

    def sync(tag):
        comm._all_gather(b"", tag)

    def reset(m: int):
        net.drain(30)                             # the last credits have landed
        phase[0] += 1
        sync(f"pre-{phase[0]}")
        mem.reset()
        net.reset(30)
        net.shape(slot_bytes, ir.max_step_chunks, m)
        sync(f"post-{phase[0]}")

    def slot_view(base, k, m):
        return np.frombuffer((ctypes.c_char * m).from_address(base + (k % nslots) * slot_bytes + 16),
                             dtype=np.uint8)

    for m in sizes:
        src = np.full(m, rank + 1, dtype=np.uint8)
        dst = np.empty(m, dtype=np.uint8)
        # latency: ping-pong
        reset(m)
        iters = max(10, lat_iters if m <= 65536 else lat_iters // 10)
        t0 = time.perf_counter()
        for i in range(iters):
            if rank == 0:
                slot_view(mslots, i, m)[:] = src
                t_mtail.value = i + 1
                while t_tail.value < i + 1:
                    os.sched_yield()
                dst[:] = slot_view(rslots, i, m)
                t_mhead.value = i + 1
            else:
                while t_tail.value < i + 1:
                    os.sched_yield()
                dst[:] = slot_view(rslots, i, m)
                t_mhead.value = i + 1
                slot_view(mslots, i, m)[:] = src
                t_mtail.value = i + 1
        lat = (time.perf_counter() - t0) / iters / 2 * 1e6
        assert int(dst[0]) == 2 - rank, "wrong bytes"
        # bandwidth: a stream from rank 0 to rank 1
        reset(m)
        n = _stream_count(m, bw_bytes)
        t0 = time.perf_counter()
        for i in range(n):
            if rank == 0:
                while t_head.value + nslots < i + 1:
                    os.sched_yield()
                slot_view(mslots, i, m)[:] = src
                t_mtail.value = i + 1
            else:
                while t_tail.value < i + 1:
                    os.sched_yield()
                dst[:] = slot_view(rslots, i, m)
                t_mhead.value = i + 1
        if rank == 0:
            while t_head.value < n:
                os.sched_yield()
        el = time.perf_counter() - t0
        res[m] = {"lat_us": lat, "mib_s": n * m / el / 2**20}
    sync("end")
    comm.close()
    q.put((rank, res))


def hccc_path(sizes, lat_iters, bw_bytes, tls) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    url = "file://" + tempfile.mktemp(prefix="hccc-bench-")
    ps = [ctx.Process(target=_path_rank, args=(r, url, tls, sizes, lat_iters, bw_bytes, q))
          for r in range(2)]
    for p in ps:
        p.start()
    out = dict(q.get(timeout=1800) for _ in ps)
    for p in ps:
        p.join(60)
    return out[1]           # the receiver's bandwidth, the ping-pong's latency (same on both)


# ------------------------------------------------------------------------------ AllReduce vs gloo
def _ar_rank(rank, url, tls, sizes, iters, q):
    os.environ["UCX_TLS"] = tls
    import torch
    import torch.distributed as dist
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.communicator import Communicator
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=4)
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1 << 18)
    comm = Communicator(ir, node="ab"[rank // 2], timeout_s=300, kernel_timeout_s=120)
    res = {}
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1))
        times = {}
        for name in ("hccc", "gloo"):
            ts = []
            for i in range(iters + 1):
                x.fill_(float(rank + 1))
                dist.barrier()
                t0 = time.perf_counter()
                if name == "hccc":
                    comm.all_reduce(x)
                else:
                    dist.all_reduce(x)
                ts.append(time.perf_counter() - t0)
                assert float(x[0]) == 10.0 and float(x[-1]) == 10.0, f"{name}: wrong sum"
            times[name] = float(np.median(ts[1:]))
        res[nbytes] = times
    comm.close()
    dist.destroy_process_group()
    q.put((rank, res))


def allreduce(sizes, iters, tls) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    url = "file://" + tempfile.mktemp(prefix="hccc-bench-")
    ps = [ctx.Process(target=_ar_rank, args=(r, url, tls, sizes, iters, q)) for r in range(4)]
    for p in ps:
        p.start()
    out = dict(q.get(timeout=3600) for _ in ps)
    for p in ps:
        p.join(60)
    # a collective takes as long as its slowest rank
    return {s: {k: max(out[r][s][k] for r in out) for k in ("hccc", "gloo")} for s in sizes}


def _fmt(n: int) -> str:
    for unit, f in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tls", default="tcp", help="UCX_TLS for both (default tcp)")
    ap.add_argument("--sizes", default="8,4K,64K,1M,4M", help="message sizes of the path table")
    ap.add_argument("--lat-iters", type=int, default=2000)
    ap.add_argument("--bw-bytes", default="64M", help="bytes streamed per bandwidth point")
    ap.add_argument("--allreduce", default="64K,1M,8M", help="AllReduce buffer sizes (bytes)")
    ap.add_argument("--ar-iters", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    bw_bytes = parse_size(a.bw_bytes)
    rows = []
    ours = hccc_path(sizes, a.lat_iters, bw_bytes, a.tls)
    for m in sizes:
        lat = perftest("ucp_put_lat", m, max(100, a.lat_iters if m <= 65536 else a.lat_iters // 10),
                       a.tls)
        bw = perftest("ucp_put_bw", m, _stream_count(m, bw_bytes), a.tls)
        rows.append({"bytes": m, "hccc_lat_us": ours[m]["lat_us"], "ucx_lat_us": lat["lat_us"],
                     "hccc_mib_s": ours[m]["mib_s"], "ucx_mib_s": bw["mib_s"]})
    ar_sizes = [parse_size(s) for s in a.allreduce.split(",")] if a.allreduce else []
    ar = allreduce(ar_sizes, a.ar_iters, a.tls) if ar_sizes else {}
    if a.json:
        print(json.dumps({"tls": a.tls, "path": rows,
                          "allreduce": [{"bytes": s, **v} for s, v in ar.items()]}, indent=1))
        return 0
    print(f"Cross-node path, two processes, UCX_TLS={a.tls} (latency: half a round trip; "
          "bandwidth: MiB/s)")
    print(f"{'size':>6} {'hccc us':>9} {'UCX us':>9} {'lat x':>6} {'hccc MiB/s':>11} "
          f"{'UCX MiB/s':>10} {'bw %':>6}")
    for r in rows:
        print(f"{_fmt(r['bytes']):>6} {r['hccc_lat_us']:9.1f} {r['ucx_lat_us']:9.1f} "
              f"{r['hccc_lat_us'] / r['ucx_lat_us']:6.2f} {r['hccc_mib_s']:11.1f} "
              f"{r['ucx_mib_s']:10.1f} {100 * r['hccc_mib_s'] / r['ucx_mib_s']:5.0f}%")
    if ar:
        print(f"\nAllReduce, 2 nodes x 2 ranks (float32, median of {a.ar_iters} calls, slowest rank)")
        print(f"{'size':>6} {'hccc ms':>9} {'gloo ms':>9} {'gloo/hccc':>10}")
        for s, v in ar.items():
            print(f"{_fmt(s):>6} {v['hccc'] * 1e3:9.2f} {v['gloo'] * 1e3:9.2f} "
                  f"{v['gloo'] / v['hccc']:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
