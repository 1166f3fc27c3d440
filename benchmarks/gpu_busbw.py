"""Bandwidth of the generated kernels on one GPU, against a device-to-device copy of the same bytes.

    python benchmarks/gpu_busbw.py [--sizes 64M,256M,1G] [--iters 10] [--warmup 3]
                                   [--chunk-size 1M] [--nwarps auto|N] [--launch grid|per-rank|both]
                                   [--channels 1,4] [--json]

For ring AllGather (8 ranks, examples/ring_allgather_8.rccl), ring AllReduce (8 ranks,
examples/ring_allreduce_8.rccl) and HM AllReduce (4 nodes x 8 GPUs, examples/hm_allreduce_4x8.rccl), compiled through ``hccc.compiler.pipeline``, every rank runs on one
GPU (the CUDA platform's single-GPU mode), out of place, float32 sum. For each size (the
collective's full buffer, as nccl-tests count it) the launcher runs ``warmup`` untimed and
``iters`` timed iterations, each timed with CUDA events from the moment all ranks are released
together to the moment the last one finishes, and checks the result against the numpy oracle.

Bytes the kernels move (B). The sum over every rank's primitives (ProgramIR) of
- the bytes it sends over a connection: SEND, RECV_COPY_SEND, RECV_REDUCE_SEND and
  RECV_REDUCE_COPY_SEND post the micro-batch slices of ``count`` consecutive chunks into the FIFO,
  i.e. the sizes of those chunks of the full buffer (the kernel's own geometry: chunk ``c`` is
  elements ``[c*n/nchunks, (c+1)*n/nchunks)``). A received byte is the other end of a sent byte
  and is not counted again;
- the bytes of each local COPY and REDUCE (a COPY whose source and destination coincide, as in
  place runs make some, moves nothing and is not counted).
So ring AllGather on N ranks moves (N-1) chunks per rank over connections plus one local copy: N
chunks per rank, B = N x (full buffer). Kernel bandwidth = B / kernel time.

Reference. A ``cudaMemcpyAsync`` device-to-device copy of the same B bytes (in pieces of at most
``--copy-buffer`` bytes when B does not fit), on one stream, timed with CUDA events over the same
number of warmup and timed iterations, in the same process right after the kernels' run. Ratio =
kernel bandwidth / copy bandwidth (the target is at least 0.85). Note that on one GPU every sent
byte is read, written into a FIFO slot, read again and written to its destination, twice the
memory traffic of a copy of the same byte.

HBM bound. The kernels' own HBM traffic H (every read and write, FIFO slots included:
:func:`hccc.runtime.kernel_traffic.traffic`, see benchmarks/kernel_model.py) at the HBM bandwidth
the reference copy reaches (it reads and writes each byte: 2 x copy bandwidth) takes
H / (2 x copy GB/s); "of bound" = that time / the kernels' time (the target is at least 0.70; ring
AllGather's ratio to the copy at least 0.40).

Launch. ``--launch grid`` (the default): every rank in one cooperative launch of the one-grid
entry (the runtime's single-GPU mode); ``per-rank``: a kernel per rank, each in its own stream
(what runs across GPUs; on one GPU it relies on the streams running concurrently); ``both``: a row
of each, side by side (column "launch").

Thread blocks. All ranks' thread blocks must be resident at once; ``--nwarps auto`` (the default)
starts from the algorithm's nWarps and halves it until the CUDA platform accepts the launch (HM
AllReduce 4x8 has 448 thread blocks; the kernels are built once and launched with fewer threads
per block). Without a usable GPU the script exits with status 2 and the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = {
    "ring_allgather_8": ROOT / "examples" / "ring_allgather_8.rccl",
    "ring_allreduce_8": ROOT / "examples" / "ring_allreduce_8.rccl",
    "hm_allreduce_4x8": ROOT / "examples" / "hm_allreduce_4x8.rccl",
}
ELEM_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}


# ------------------------------------------------------------------------------ bytes moved
@dataclass(frozen=True)
class Moved:
    sent: int      # bytes posted into FIFOs (over connections)
    local: int     # bytes of local COPY / REDUCE primitives

    @property
    def total(self) -> int:
        return self.sent + self.local


def bytes_moved(ir, nbytes: int, dtype: str = "float32", inplace: bool = False) -> Moved:
    """Bytes the kernels of ``ir`` move for a full buffer of ``nbytes`` bytes (module docstring)."""
    from hccc.compiler.backend.codegen import analyse, buffer_bases
    from hccc.compiler.ir.program_ir import Buf, Op

    esz = ELEM_SIZE[dtype]
    count = nbytes // esz
    p = ir.prims
    if ir.nprims == 0:
        return Moved(0, 0)
    anchor = analyse(ir).chunk.astype(np.int64)
    cnt = p["count"].astype(np.int64)
    n = np.int64(ir.nchunks)

    def lo(c):                     # first element of chunk c (exact integer arithmetic)
        return (c * count) // n

    elems = lo(anchor + cnt) - lo(anchor)
    op = p["op"].astype(np.int64)
    sends = np.isin(op, [Op.SEND, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND])
    local = np.isin(op, [Op.COPY, Op.REDUCE])
    if inplace:
        # where do source and destination live? In place, input and output are views of one
        # full buffer (AllGather input = output[rank], ReduceScatter output = input[rank]).
        in_base, out_base = buffer_bases(ir)
        rank = p["rank"].astype(np.int64)

        def where(buf, off):
            b, o = buf.astype(np.int64), off.astype(np.int64)
            full = np.where(b == Buf.INPUT, o + in_base[rank], o + out_base[rank])
            space = np.where(b == Buf.SCRATCH, 2, np.where(b == Buf.NONE, 3, 1))
            return space, np.where(b == Buf.SCRATCH, o, full)

        ss, so = where(p["src_buf"], p["src_off"])
        ds, do = where(p["dst_buf"], p["dst_off"])
        same = (ss == ds) & (so == do) & (op == Op.COPY)
        local &= ~same
    return Moved(int(elems[sends].sum()) * esz, int(elems[local].sum()) * esz)


# ------------------------------------------------------------------------------ reference copy
def copy_time_us(nbytes: int, iters: int, warmup: int, piece: int) -> float:
    """Mean device time of a device-to-device copy of ``nbytes`` bytes (cudaMemcpyAsync in pieces
    of at most ``piece`` bytes between two buffers), CUDA events, after ``warmup`` copies."""
    import cupy as cp
    from cupy.cuda import runtime as rt

    piece = max(1, min(piece, nbytes))
    src = cp.empty(piece, dtype=cp.uint8)
    dst = cp.empty(piece, dtype=cp.uint8)
    src.fill(1)
    stream = cp.cuda.Stream(non_blocking=True)
    full, rest = divmod(nbytes, piece)
    s_ptr, d_ptr = src.data.ptr, dst.data.ptr

    def one():
        for _ in range(full):
            rt.memcpyAsync(d_ptr, s_ptr, piece, rt.memcpyDeviceToDevice, stream.ptr)
        if rest:
            rt.memcpyAsync(d_ptr, s_ptr, rest, rt.memcpyDeviceToDevice, stream.ptr)

    for _ in range(warmup):
        one()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        one()
    end.record(stream)
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return ms * 1000.0 / iters


# ------------------------------------------------------------------------------ running
def nwarps_candidates(first: int) -> list[int]:
    out, w = [], max(1, first)
    while w >= 1:
        out.append(w)
        w //= 2
    return out


def open_runner(launcher, ir, args, nwarps: list[int], one_grid: bool | None = None):
    """A launcher Runner for ``ir`` on CUDA with the most warps per block (from ``nwarps``, largest
    first) whose thread blocks can all be resident at once; (runner, warps). ``one_grid``: the
    Runner's (None: one grid, every rank being on one GPU)."""
    from hccc.runtime.platform import PlatformError

    for nw in nwarps:
        try:
            return launcher.Runner(ir, "cuda", args.dtype, "sum", nthreads=32 * nw,
                                   timeout_s=args.timeout, one_grid=one_grid), nw
        except PlatformError as exc:
            if "resident" not in str(exc) or nw == nwarps[-1]:
                raise
    raise AssertionError("unreachable")


def run_size(name: str, ir, size: int, args, runner, nwarps: int) -> dict:
    """One (algorithm, size, launch mode) row of the table."""
    moved = bytes_moved(ir, size, args.dtype, False)
    res = runner.run(size, inplace=False, iters=args.iters, warmup=args.warmup, seed=0)
    row = {"algorithm": name, "collective": ir.collective, "nranks": ir.nranks, "bytes": size,
           "launch": "grid" if getattr(runner, "grid_fn", None) is not None else "per-rank",
           "nwarps": nwarps, "channels": int(ir.nchannels), "chunk_bytes": ir.chunk_bytes,
           "moved_bytes": moved.total,
           "sent_bytes": moved.sent, "local_bytes": moved.local,
           "wrong": int(res.wrong), "stuck": res.stuck}
    if res.stuck or res.wrong or not res.iters:
        row.update(time_us=None, gbps=None, copy_us=None, copy_gbps=None, ratio=None, busbw=None,
                   hbm_bytes=None, bound_us=None, of_bound=None)
        return row
    t = float(res.time_us)
    copy_us = copy_time_us(moved.total, args.iters, args.warmup, args.copy_buffer)
    gbps = moved.total / t / 1e3
    copy_gbps = moved.total / copy_us / 1e3
    hbm = hbm_bytes(ir, size, args.dtype)
    bound_us = hbm / (2 * copy_gbps * 1e3)
    row.update(time_us=t, gbps=gbps, copy_us=copy_us, copy_gbps=copy_gbps, ratio=gbps / copy_gbps,
               hbm_bytes=hbm, bound_us=bound_us, of_bound=bound_us / t,
               algbw=float(res.algbw_GBps), busbw=float(res.busbw_GBps))
    return row


def failed_row(name: str, ir, size: int, channels: int, launch: str, exc: BaseException) -> dict:
    """A row for a size that could not run (the reason in ``error``): the other rows still print."""
    row = {"algorithm": name, "collective": getattr(ir, "collective", ""), "nranks": getattr(ir, "nranks", 0),
           "bytes": size, "launch": launch, "nwarps": getattr(ir, "nwarps", 0), "channels": channels,
           "moved_bytes": 0, "wrong": 0, "stuck": None, "error": " ".join(str(exc).split())[:200]}
    row.update(time_us=None, gbps=None, copy_us=None, copy_gbps=None, ratio=None, busbw=None,
               hbm_bytes=None, bound_us=None, of_bound=None)
    return row


def hbm_bytes(ir, nbytes: int, dtype: str = "float32") -> int:
    """HBM bytes (reads + writes) the kernels of ``ir`` move for a full buffer of ``nbytes``."""
    from hccc.runtime.kernel_traffic import traffic
    return traffic(ir, nbytes, ELEM_SIZE[dtype]).hbm


def print_table(rows: list[dict], device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"hccc kernels vs device-to-device copy, all ranks on {device}")
    for col in ("algorithm", "launch", "size", "nwarps", "ch", "moved", "time", "GB/s", "copy GB/s", "ratio",
                "HBM", "of bound", "busbw"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in rows:
        if r["time_us"] is None:
            status = (f"NOT RUN: {r['error']}" if r.get("error") else f"STUCK: {r['stuck']}" if r["stuck"]
                      else f"WRONG ({r['wrong']} elements)")
            table.add_row(r["algorithm"], r["launch"], _size(r["bytes"]), str(r["nwarps"]), str(r["channels"]),
                          _size(r["moved_bytes"]), status, "", "", "", "", "", "")
            continue
        table.add_row(r["algorithm"], r["launch"], _size(r["bytes"]), str(r["nwarps"]), str(r["channels"]),
                      _size(r["moved_bytes"]),
                      f"{r['time_us']:.1f} us", f"{r['gbps']:.1f}", f"{r['copy_gbps']:.1f}",
                      f"{r['ratio']:.2f}", _size(r["hbm_bytes"]), f"{r['of_bound']:.2f}", f"{r['busbw']:.1f}")
    Console().print(table)


def _size(b: int) -> str:
    """1G, 1.50G, 64M, 512B."""
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k:
            return f"{b // k}{unit}" if b % k == 0 else f"{b / k:.2f}{unit}"
    return f"{b}B"


def _sizes(text: str) -> list[int]:
    from hccc.args import parse_size
    return [parse_size(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=_sizes, default=_sizes("64M,256M,1G"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=sorted(ELEM_SIZE), default="float32")
    ap.add_argument("--chunk-size", type=_sizes, default=[1 << 20],
                    help="micro-batch slice / FIFO slot size (default 1M)")
    ap.add_argument("--nwarps", default="auto", help="warps per thread block, or auto (default)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help=f"comma-separated subset of {', '.join(ALGORITHMS)}")
    ap.add_argument("--copy-buffer", type=lambda t: _sizes(t)[0], default=1 << 30,
                    help="largest single piece of the reference copy (default 1G)")
    ap.add_argument("--timeout", type=float, default=60.0, help="kernel spin-wait timeout, seconds")
    ap.add_argument("--launch", choices=("grid", "per-rank", "both"), default="grid",
                    help="one grid for every rank (default), a kernel per rank, or both side by side")
    ap.add_argument("--channels", default="1",
                    help="blocks per thread block, a comma-separated list: one set of rows per count")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    names = [x.strip() for x in args.algorithms.split(",") if x.strip()]
    unknown = [x for x in names if x not in ALGORITHMS]
    if unknown:
        ap.error(f"unknown algorithm {unknown[0]!r} (known: {', '.join(ALGORITHMS)})")
    if args.nwarps != "auto" and not (args.nwarps.isdigit() and int(args.nwarps) > 0):
        ap.error("--nwarps must be a positive integer or auto")

    os.environ["HCCC_CUDA_DEVICES"] = "1"        # single-GPU mode: every rank on GPU 0
    from hccc.util.diagnostics import CompileError
    from hccc.compiler.pipeline import CompileOptions, load_program
    from hccc.runtime.platform import PlatformError, get_platform

    try:
        pf = get_platform("cuda")
        device = getattr(pf, "device_name", "GPU 0")
        pf.close()
    except (PlatformError, ImportError) as exc:
        print(f"gpu_busbw: cannot run: {exc}", file=sys.stderr)
        return 2
    try:
        from hccc.runtime import launcher
    except ImportError as exc:
        print(f"gpu_busbw: the runtime launcher is not available: {exc}", file=sys.stderr)
        return 1

    rows = []
    from hccc.compiler.passes.channels import with_channels
    for name, k in ((n, int(k)) for n in names for k in args.channels.split(",")):
        try:
            ir = with_channels(load_program(ALGORITHMS[name], CompileOptions(chunk_bytes=args.chunk_size[0])), k)
        except (CompileError, ValueError) as exc:
            rows += [failed_row(name, None, size, k, "compile", exc) for size in args.sizes]
            continue
        nw = nwarps_candidates(ir.nwarps) if args.nwarps == "auto" else [int(args.nwarps)]
        modes = {"grid": [True], "per-rank": [False], "both": [True, False]}[args.launch]
        for one_grid in modes:
            launch = "grid" if one_grid else "per-rank"
            try:
                runner, warps = open_runner(launcher, ir, args, nw, one_grid)
            except PlatformError as exc:     # this algorithm cannot run: its rows say why, the rest run
                rows += [failed_row(name, ir, size, k, launch, exc) for size in args.sizes]
                continue
            with runner:
                for size in args.sizes:
                    try:
                        rows.append(run_size(name, ir, size, args, runner, warps))
                    except (PlatformError, MemoryError) as exc:   # e.g. more memory than the run may use
                        rows.append(failed_row(name, ir, size, k, launch, exc))
                    if not args.json:
                        print(f"{name} {rows[-1]['launch']} {_size(size)}: "
                              f"{'done' if rows[-1].get('error') is None else rows[-1]['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"device": device, "dtype": args.dtype, "iters": args.iters,
                          "warmup": args.warmup, "rows": rows}, indent=1))
    else:
        print_table(rows, device)
    return 0 if all(r["time_us"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
