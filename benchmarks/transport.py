"""hccc's cross-node path against UCX itself, and a 2-node AllReduce against torch.distributed's gloo.

    python benchmarks/transport.py [--tls tcp] [--sizes 8,4K,64K,1M,4M] [--lat-iters 1000]
                                   [--bw-bytes 32M] [--repeats 3] [--call-iters 10]
                                   [--allreduce 64K,1M,8M] [--ar-iters 5] [--stages 2000]
                                   [--reader poll|sleep] [--json]

1. **Path** (two processes as two nodes, ``UCX_TLS`` as given). A 2-rank communicator is set up
   and wired; then its cross-node connections are driven exactly as the kernels drive them, by a
   small compiled driver (no interpreter on the data path): a message written into the FIFO
   mirror and the ``tail`` stored; the receiver polls its ``tail``, copies the message out and
   stores ``head``. The receiver waits as a GPU kernel does (``--reader poll``: it polls and
   never sleeps, yielding the core between polls since a CPU stands in for the GPU), or as the
   CPU emulation's kernel threads do (``--reader sleep``: 8 yields, then a futex sleep that a
   post wakes). What is timed is the transport: the progress threads that carry the slot (one
   active message that the receiving proxy unpacks, or puts, a fence and a tail put above
   ``HCCC_NET_AM_BYTES``) and return the credit. *Latency*: ping-pong of one message, half the round trip,
   against ``ucx_perftest -t ucp_put_lat`` (also half a round trip of puts): ``p50`` the median
   round trip (ucx_perftest's "typical"), ``avg`` the mean. On a shared machine the mean of
   either side is mostly the time slices it lost to other jobs; the median is what one message
   costs when both sides are running. *Bandwidth*: a stream
   of messages (``--bw-bytes`` worth, 64 to 20,000 of them) through the FIFO's slots, against
   ``ucx_perftest -t ucp_put_bw`` with as many messages; MiB/s both (UCX's "MB/s" is 2^20 bytes
   per second). Each hccc number is taken right before the UCX number it is compared with, and
   the table shows medians over ``--repeats`` rounds (of the values and of the per-round ratios),
   so a loaded machine slows both sides of a ratio alike.
   *Steps* (``--stages``): an 8 B ping-pong with both progress threads recording what they do
   (``UcxTransport.trace``) and the driver its stores and sightings, on one clock: per message the
   writer's store to its proxy seeing it, the slot sent (message, or puts and tail put), the
   peer's proxy writing the tail, the reader seeing it; medians over both directions, beside
   ``ucx_perftest``'s typical one-way latency taken right after.
   *Through the kernels* (``call us``): one 2-rank AllGather call of the size each way through
   the CPU-emulated kernels, everything a call costs (host barriers, launch of the emulated
   thread blocks, the kernels, the proxy, the drain): what an application sees, which
   ``ucx_perftest`` has no counterpart for.
2. **AllReduce** (2 nodes x 2 ranks, four processes, one torch.distributed gloo group): hccc's ring
   AllReduce through :class:`~hccc.runtime.Communicator` (CPU emulation, cross-node connections
   over UCX) against ``torch.distributed.all_reduce`` on gloo, same processes, same float32
   tensors, calls alternating; median of the calls, ratio gloo time / hccc time (above 1: hccc
   is faster).
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
import sys
import tempfile
import time

import numpy as np

from hccc.args import parse_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rank_processes import run_ranks, store_url  # noqa: E402


# ------------------------------------------------------------------------------ ucx_perftest
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(test: str, size: int, iters: int, tls: str) -> dict:
    """One ``ucx_perftest`` run (server and client on this machine): typical (p50) and average
    latency (us), MiB/s."""
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
    return {"p50_us": float(f[2]), "lat_us": float(f[3]), "mib_s": float(f[6])}


# ------------------------------------------------------------------------------ hccc's path
# The slot writer / reader of the transport-only measurement, in C so that no interpreter sits on
# the data path: it writes a message into a FIFO mirror and publishes the tail, or waits for a tail,
# copies the message out and posts the head -- what a kernel's send and receive do -- and waits and
# posts the way a GPU kernel does (poll) or the CPU emulation's kernels do (yield the core, then
# sleep on the word; a post wakes).
_DRIVER = r"""
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
static uint64_t now_ns(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
/* hb_sleep 1, the CPU emulation's wait (hccc_spin_pause): the first 8 pauses of a streak yield the
   core, later ones sleep on the word's low 32 bits (futex, at most 1 ms); a post is a release store
   and a wake (hccc_post_peer). The progress thread wakes a word a put from the other node changed.
   hb_sleep 0, a GPU kernel's wait: it polls the word and never sleeps (between polls it yields the
   core, which a CPU standing in for the GPU shares with the progress threads). */
static int hb_sleep = 1;
void hb_set_sleep(int sleep) { hb_sleep = sleep; }
static int wait_ge(const uint64_t* p, uint64_t v, uint64_t deadline) {
  unsigned pauses = 0;
  for (;;) {
    const uint64_t seen = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    if (seen >= v) return 0;
    if (!hb_sleep) {
      sched_yield();
      if ((++pauses & 1023) == 0 && now_ns() > deadline) return 1;
      continue;
    }
    if (++pauses <= 8) { sched_yield(); continue; }
    struct timespec ts = {0, 1000000};
    syscall(SYS_futex, p, FUTEX_WAIT_PRIVATE, (uint32_t)seen, &ts, NULL, 0);
    if ((pauses & 63) == 0 && now_ns() > deadline) return 1;
  }
}
static void post(uint64_t* p, uint64_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
  syscall(SYS_futex, p, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
#define SLOT(base, k) ((base) + ((k) % nslots) * slot_bytes + 16)
/* ping-pong of `iters` messages of m bytes; returns the elapsed seconds (negative: timed out).
   marks[2i], marks[2i+1] (CLOCK_MONOTONIC ns): rank 0 stores message i's tail, sees the reply's;
   rank 1 sees message i's tail, stores the reply's. */
double hb_pingpong(int rank, long iters, long m, char* mslots, uint64_t* mtail, const char* rslots,
                   const uint64_t* rtail, uint64_t* mhead, long nslots, long slot_bytes,
                   const char* src, char* dst, double timeout_s, uint64_t* marks) {
  const uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(timeout_s * 1e9);
  for (long i = 0; i < iters; ++i) {
    if (rank == 0) {
      memcpy(SLOT(mslots, i), src, m);
      marks[2 * i] = now_ns();
      post(mtail, (uint64_t)i + 1);
      if (wait_ge(rtail, i + 1, deadline)) return -1;
      marks[2 * i + 1] = now_ns();
      memcpy(dst, SLOT(rslots, i), m);
      post(mhead, (uint64_t)i + 1);
    } else {
      if (wait_ge(rtail, i + 1, deadline)) return -1;
      marks[2 * i] = now_ns();
      memcpy(dst, SLOT(rslots, i), m);
      post(mhead, (uint64_t)i + 1);
      memcpy(SLOT(mslots, i), src, m);
      marks[2 * i + 1] = now_ns();
      post(mtail, (uint64_t)i + 1);
    }
  }
  return 1e-9 * (double)(now_ns() - t0);
}
/* a stream of n messages from rank 0 to rank 1 through the FIFO's nslots slots (the sender waits
   for credits); returns the elapsed seconds at the receiver (negative: timed out) */
double hb_stream(int rank, long n, long m, char* mslots, uint64_t* mtail, const uint64_t* shead,
                 const char* rslots, const uint64_t* rtail, uint64_t* mhead, long nslots,
                 long slot_bytes, const char* src, char* dst, double timeout_s) {
  const uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(timeout_s * 1e9);
  for (long i = 0; i < n; ++i) {
    if (rank == 0) {
      if (i >= nslots && wait_ge(shead, i + 1 - nslots, deadline)) return -1;
      memcpy(SLOT(mslots, i), src, m);
      post(mtail, (uint64_t)i + 1);
    } else {
      if (wait_ge(rtail, i + 1, deadline)) return -1;
      memcpy(dst, SLOT(rslots, i), m);
      post(mhead, (uint64_t)i + 1);
    }
  }
  const double el = 1e-9 * (double)(now_ns() - t0);
  if (rank == 0 && wait_ge(shead, n, deadline)) return -1;   /* every credit back */
  return el;
}
"""


def _driver():
    """The compiled slot driver (built with the C++ compiler, cached by content hash)."""
    from hccc.runtime import cache
    cxx = shutil.which(os.environ.get("HCCC_CXX") or "g++")
    if cxx is None:
        raise SystemExit("g++ not found (the driver and hccc's network proxy are built with it)")
    key = cache.content_key("bench-transport-driver", cxx, _DRIVER)

    def make(tmp):
        (tmp / "d.c").write_text(_DRIVER)
        subprocess.run([cxx, "-x", "c", "-O2", "-fPIC", "-shared", str(tmp / "d.c"), "-o",
                        str(tmp / "d.so")], check=True)

    lib = ctypes.CDLL(str(cache.entry("bench_driver", key, make) / "d.so"))
    vp, lng, d = ctypes.c_void_p, ctypes.c_long, ctypes.c_double
    lib.hb_pingpong.restype = d
    lib.hb_pingpong.argtypes = [ctypes.c_int, lng, lng, vp, vp, vp, vp, vp, lng, lng, vp, vp, d, vp]
    lib.hb_stream.restype = d
    lib.hb_stream.argtypes = [ctypes.c_int, lng, lng, vp, vp, vp, vp, vp, vp, lng, lng, vp, vp, d]
    lib.hb_set_sleep.argtypes = [ctypes.c_int]
    return lib


def _stream_count(m: int, bw_bytes: int) -> int:
    """Messages of a bandwidth point: ``bw_bytes`` worth, between 64 and 20,000."""
    return max(64, min(bw_bytes // m, 20000))


def _lat_iters(m: int, lat_iters: int) -> int:
    return max(20, lat_iters if m <= 65536 else lat_iters // 10)


def _path_rank(rank, url, tls, max_size, conn, reader="poll"):
    """One of the two processes: a 2-rank communicator on two nodes, then measurements on
    command (``conn``: ("lat" | "bw" | "call" | "stages", size, count) -> result; None: finish)."""
    os.environ["UCX_TLS"] = tls
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.communicator import Communicator
    drv = _driver()
    drv.hb_set_sleep(1 if reader == "sleep" else 0)
    ir = build_program(gen.ring_allgather(2), chunk_bytes=(max_size + 64 + 15) // 16 * 16)
    comm = Communicator(ir, rank=rank, world_size=2, init_method=url, node="ab"[rank],
                        timeout_s=120)
    net, mem, plan = comm._net, comm._mem, comm._plans[rank]
    phase = [0]

    def sync(tag):
        comm._all_gather(b"", tag)

    def reset(m: int):
        net.drain(30)                             # the last credits have landed
        phase[0] += 1
        sync(f"pre-{phase[0]}")
        mem.reset()
        net.reset(30)
        net.shape(plan.slot_bytes, ir.max_step_chunks, m)
        sync(f"post-{phase[0]}")

    def call(m: int, iters: int) -> float:
        """A 2-rank AllGather through the kernels: m bytes each way per call; median seconds."""
        x = np.full(m // 4, rank + 1, dtype=np.float32)
        out = np.zeros(2 * (m // 4), dtype=np.float32)
        ts = []
        for _ in range(iters + 1):
            sync("call")
            t0 = time.perf_counter()
            comm.all_gather(x, out)
            ts.append(time.perf_counter() - t0)
        assert out[0] == 1 and out[-1] == 2, "wrong AllGather"
        return float(np.median(ts[1:]))

    conn.send(("ready", net.am_bytes))
    while (cmd := conn.recv()) is not None:
        what, m, count = cmd
        if what == "call":
            conn.send(call(m, count))
            continue
        # mirrors and FIFOs as the connection tables hold them after wiring (the kernels' view)
        mslots, shead, mtail, _ = mem.send_conns[0]   # (slots, head, tail, place)
        rslots, mhead, rtail, _ = mem.recv_conns[0]
        src = np.full(m, rank + 1, dtype=np.uint8)
        dst = np.zeros(m, dtype=np.uint8)
        reset(m)
        if what in ("lat", "stages"):           # ping-pong: half the round trip
            marks = np.zeros(2 * count, dtype=np.uint64)
            if what == "stages":
                net.tx.trace(8 * count)
            el = drv.hb_pingpong(rank, count, m, mslots, mtail, rslots, rtail, mhead, plan.nslots,
                                 plan.slot_bytes, src.ctypes.data, dst.ctypes.data, 60.0,
                                 marks.ctypes.data)
            assert el > 0, "ping-pong timed out"
            assert int(dst[0]) == 2 - rank and int(dst[-1]) == 2 - rank, "wrong bytes"
            if what == "stages":
                # the progress thread's steps; its watched words are the sends' heads, then the
                # receives' tails (NetLink.wire), so this connection's tail is watch len(sends)
                steps = net.tx.trace_take()
                net.tx.trace(0)
                conn.send((marks, steps, len(net._sends)))
            else:
                rtt = (marks[1::2] - marks[0::2]).astype(np.float64)
                conn.send((float(np.median(rtt)) / 2e3, el / count / 2 * 1e6))
        else:                                     # a stream from rank 0 to rank 1
            el = drv.hb_stream(rank, count, m, mslots, mtail, shead, rslots, rtail, mhead,
                               plan.nslots, plan.slot_bytes, src.ctypes.data, dst.ctypes.data,
                               120.0)
            assert el > 0, "stream timed out"
            assert rank == 0 or (int(dst[0]) == 1 and int(dst[-1]) == 1), "wrong bytes"
            conn.send(count * m / el / 2**20)
        reset(m)                                  # the counters back to what a call expects
    sync("end")
    comm.close()


class PathPair:
    """The two processes of the path measurements (two nodes), driven one command at a time so
    that each hccc number is taken right next to the ``ucx_perftest`` number it is compared with."""

    def __init__(self, max_size: int, tls: str, reader: str = "poll"):
        ctx = mp.get_context("spawn")
        url = "file://" + tempfile.mktemp(prefix="hccc-bench-")
        self.conns, self.procs = [], []
        for r in range(2):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_path_rank, args=(r, url, tls, max_size, there, reader))
            p.start()
            self.conns.append(here)
            self.procs.append(p)
        self.am_bytes = None
        for c in self.conns:
            if not c.poll(600) or (msg := c.recv())[0] != "ready":
                raise RuntimeError("the path processes did not start")
            self.am_bytes = msg[1] if self.am_bytes is None else min(self.am_bytes, msg[1])

    def run(self, what: str, m: int, count: int) -> list:
        for c in self.conns:
            c.send((what, m, count))
        out = []
        for c in self.conns:
            if not c.poll(600):
                raise RuntimeError(f"path measurement {what} {m} timed out")
            out.append(c.recv())
        return out

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(60)


# ------------------------------------------------------------------------------ AllReduce vs gloo
def _ar_rank(rank: int, world: int, store_dir: str, tls: str, sizes: list[int], iters: int) -> dict:
    """This rank's median seconds of one all_reduce per size and path: {bytes: {path: s}}."""
    os.environ["UCX_TLS"] = tls
    import torch
    import torch.distributed as dist
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.communicator import Communicator
    dist.init_process_group("gloo", init_method=store_url(store_dir), rank=rank, world_size=world)
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1 << 18)
    # the same program twice: on two nodes (the ring crosses them twice, over UCX) and, for
    # comparison, as if the four processes were one node (shared memory, no transport)
    comms = {"hccc": Communicator(ir, node="ab"[rank // 2], name="ar-two-nodes", timeout_s=300,
                                  kernel_timeout_s=120),
             "one_node": Communicator(ir, node="one", name="ar-one-node", timeout_s=300,
                                      kernel_timeout_s=120)}
    res = {}
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1))
        ts = {"hccc": [], "one_node": [], "gloo": []}
        for i in range(iters + 1):            # alternating, so all see the same machine
            for name in ts:
                x.fill_(float(rank + 1))
                dist.barrier()
                t0 = time.perf_counter()
                if name == "gloo":
                    dist.all_reduce(x)
                else:
                    comms[name].all_reduce(x)
                ts[name].append(time.perf_counter() - t0)
                assert float(x[0]) == 10.0 and float(x[-1]) == 10.0, f"{name}: wrong sum"
        res[nbytes] = {k: float(np.median(v[1:])) for k, v in ts.items()}
    for c in comms.values():
        c.close()
    dist.destroy_process_group()
    return res


def allreduce(sizes, iters, tls) -> dict:
    out = dict(enumerate(run_ranks(_ar_rank, 4, (tls, sizes, iters), timeout_s=3600)))
    # a collective takes as long as its slowest rank
    return {s: {k: max(out[r][s][k] for r in out) for k in ("hccc", "one_node", "gloo")}
            for s in sizes}


def stages(pair: "PathPair", m: int, count: int) -> dict:
    """Where one message's time goes: a ping-pong of ``count`` messages of ``m`` bytes with both
    progress threads recording their steps; per step the median over both directions (us)."""
    (marks0, steps0, w0), (marks1, steps1, w1) = pair.run("stages", m, count)

    def at(steps, kind, index):
        sel = steps[(steps[:, 1] == kind) & (steps[:, 2] == index)]
        return dict(zip(sel[:, 3].tolist(), sel[:, 0].tolist()))

    out = {k: [] for k in ("seen", "issued", "delivered", "woken", "one_way")}
    # direction 0 -> 1: rank 0 stores tail i+1 at marks0[2i], rank 1 sees it at marks1[2i];
    # direction 1 -> 0: rank 1 stores at marks1[2i+1], rank 0 sees it at marks0[2i+1]
    for src_marks, dst_marks, src_steps, dst_steps, w_dst, off in (
            (marks0, marks1, steps0, steps1, w1, 0), (marks1, marks0, steps1, steps0, w0, 1)):
        seen, issued = at(src_steps, 1, 0), at(src_steps, 2, 0)
        landed = at(dst_steps, 3, w_dst)
        for i in range(count):
            v = i + 1
            if v not in seen or v not in issued or v not in landed:
                continue                # several tails seen at once: not one message's steps
            post, got = int(src_marks[2 * i + off]), int(dst_marks[2 * i + off])
            out["seen"].append(seen[v] - post)
            out["issued"].append(issued[v] - seen[v])
            out["delivered"].append(landed[v] - seen[v])
            out["woken"].append(got - landed[v])
            out["one_way"].append(got - post)
    return {k: (float(np.median(v)) / 1e3 if v else float("nan")) for k, v in out.items()} | \
        {"messages": len(out["one_way"])}


def _fmt(n: int) -> str:
    for unit, f in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def _median(xs):
    return float(np.median(xs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tls", default="tcp", help="UCX_TLS for both (default tcp)")
    ap.add_argument("--sizes", default="8,4K,64K,1M,4M", help="message sizes of the path table")
    ap.add_argument("--lat-iters", type=int, default=1000,
                    help="ping-pongs per latency point up to 64K (a tenth above)")
    ap.add_argument("--bw-bytes", default="32M", help="bytes streamed per bandwidth point")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of the path table (each ratio taken side by side; medians shown)")
    ap.add_argument("--call-iters", type=int, default=10,
                    help="AllGather calls per size through the kernels (0: skip)")
    ap.add_argument("--allreduce", default="64K,1M,8M", help="AllReduce buffer sizes (bytes)")
    ap.add_argument("--ar-iters", type=int, default=5)
    ap.add_argument("--stages", type=int, default=2000,
                    help="ping-pongs of 8 B with both progress threads recording their steps, for "
                         "where a message's time goes (0: skip)")
    ap.add_argument("--reader", choices=("poll", "sleep"), default="poll",
                    help="how the driver standing in for the kernels waits for a word: poll (a GPU "
                         "kernel's wait: poll, yielding the core between polls, never sleep) or sleep "
                         "(the CPU emulation's: yield 8 times, then sleep on the word until a post "
                         "wakes it)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    bw_bytes = parse_size(a.bw_bytes)
    samples = {m: {k: [] for k in ("hp", "up", "hl", "ul", "hb", "ub", "call")} for m in sizes}
    steps = None
    pair = PathPair(max(sizes), a.tls, a.reader)
    am_bytes = pair.am_bytes
    try:
        for _ in range(max(1, a.repeats)):
            for m in sizes:
                s = samples[m]
                iters, n = _lat_iters(m, a.lat_iters), _stream_count(m, bw_bytes)
                p50, avg = pair.run("lat", m, iters)[0]
                ucx = perftest("ucp_put_lat", m, iters, a.tls)
                s["hp"].append(p50)
                s["up"].append(ucx["p50_us"])
                s["hl"].append(avg)
                s["ul"].append(ucx["lat_us"])
                s["hb"].append(pair.run("bw", m, n)[1])       # the receiver's rate
                s["ub"].append(perftest("ucp_put_bw", m, n, a.tls)["mib_s"])
        if a.stages > 0:
            steps = stages(pair, 8, a.stages)
            steps["ucx_p50_us"] = perftest("ucp_put_lat", 8, a.stages, a.tls)["p50_us"]
        if a.call_iters > 0:
            for m in sizes:
                if m >= 8:
                    samples[m]["call"].append(max(pair.run("call", m, a.call_iters)) * 1e6)
    finally:
        pair.close()
    rows = []
    for m in sizes:
        s = samples[m]
        rows.append({"bytes": m, "hccc_p50_us": _median(s["hp"]), "ucx_p50_us": _median(s["up"]),
                     "p50_ratio": _median([h / u for h, u in zip(s["hp"], s["up"])]),
                     "hccc_lat_us": _median(s["hl"]), "ucx_lat_us": _median(s["ul"]),
                     "lat_ratio": _median([h / u for h, u in zip(s["hl"], s["ul"])]),
                     "hccc_mib_s": _median(s["hb"]), "ucx_mib_s": _median(s["ub"]),
                     "bw_ratio": _median([h / u for h, u in zip(s["hb"], s["ub"])]),
                     "call_us": s["call"][0] if s["call"] else None})
    ar_sizes = [parse_size(s) for s in a.allreduce.split(",")] if a.allreduce else []
    ar = allreduce(ar_sizes, a.ar_iters, a.tls) if ar_sizes else {}
    if a.json:
        print(json.dumps({"tls": a.tls, "repeats": a.repeats, "am_bytes": am_bytes, "reader": a.reader,
                          "path": rows, "stages": steps,
                          "allreduce": [{"bytes": s, **v} for s, v in ar.items()]}, indent=1))
        return 0
    print(f"Cross-node path, two processes as two nodes, UCX_TLS={a.tls}: the proxy moving FIFO "
          f"slots (transport only)\nagainst ucx_perftest, medians of {a.repeats} side-by-side "
          "rounds; latency: half a round trip (us), p50: the\nmedian round trip (ucx_perftest's "
          "'typical'), avg: the mean; bandwidth: MiB/s")
    how = ("every slot as puts, a fence and a tail put" if am_bytes == 0 else
           "every slot as one active message" if am_bytes >= 1 << 40 else
           f"slots of up to {_fmt(am_bytes)} bytes as one active message, larger as puts")
    print(f"hccc sends {how} (HCCC_NET_AM_BYTES); the reader "
          + ("polls as a GPU kernel does (--reader poll)" if a.reader == "poll" else
             "sleeps as the CPU emulation's kernels do (--reader sleep)"))
    print(f"{'size':>6} {'hccc p50':>9} {'UCX p50':>8} {'p50 x':>6} {'hccc avg':>9} {'UCX avg':>8} "
          f"{'avg x':>6} {'hccc MiB/s':>11} {'UCX MiB/s':>10} {'bw %':>6} {'call us':>8}")
    for r in rows:
        call = f"{r['call_us']:8.0f}" if r["call_us"] is not None else f"{'-':>8}"
        print(f"{_fmt(r['bytes']):>6} {r['hccc_p50_us']:9.1f} {r['ucx_p50_us']:8.1f} "
              f"{r['p50_ratio']:6.2f} {r['hccc_lat_us']:9.1f} {r['ucx_lat_us']:8.1f} "
              f"{r['lat_ratio']:6.2f} {r['hccc_mib_s']:11.1f} {r['ucx_mib_s']:10.1f} "
              f"{100 * r['bw_ratio']:5.0f}% {call}")
    if a.call_iters > 0:
        print("call us: one 2-rank AllGather through the CPU-emulated kernels (the size each way: "
              "barriers, launch,\nkernel, proxy, drain), median of "
              f"{a.call_iters} calls, slower rank")
    if steps is not None:
        print(f"\nOne 8 B message, step by step (median us over both directions of {a.stages} "
              f"ping-pongs, {steps['messages']} messages whose steps were apart)")
        for key, what in (("seen", "writer's tail store -> its progress thread sees it"),
                          ("issued", "  seen -> slot sent (one message, or puts + tail put)"),
                          ("delivered", "seen -> the peer's progress thread has written the tail"),
                          ("woken", "written -> the reader sees it"),
                          ("one_way", "one way in all (writer's store -> reader)")):
            print(f"  {what:58s} {steps[key]:8.1f}")
        print(f"  {'ucx_perftest ucp_put_lat, typical one way, right after':58s} "
              f"{steps['ucx_p50_us']:8.1f}")
    if ar:
        print(f"\nAllReduce, 2 nodes x 2 ranks (float32, median of {a.ar_iters} calls, slowest rank)")
        print(f"{'size':>6} {'hccc ms':>9} {'gloo ms':>9} {'gloo/hccc':>10} {'1 node ms':>10}")
        for s, v in ar.items():
            print(f"{_fmt(s):>6} {v['hccc'] * 1e3:9.2f} {v['gloo'] * 1e3:9.2f} "
                  f"{v['gloo'] / v['hccc']:10.2f} {v['one_node'] * 1e3:10.2f}")
        print("1 node: the same hccc program and processes as one node (shared memory, no "
              "transport):\nthe CPU-emulated kernels' share of the hccc time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
