"""The torch backend on device tensors: N processes on one GPU (or the CPU emulation), each call
through backend "hccc" checked against the same call through gloo on CPU copies, in one run.

    python benchmarks/torch_gpu_check.py [--device cuda|cpu] [--ranks 2] [--sizes 4K,1M] [--iters 5]
                                         [--timeout 120] [--json FILE]

Every rank runs in its own process (spawned; a torch ``FileStore``), all of them on device 0 when
``--device cuda`` (the torch backend's communicator then runs its CUDA kernels across processes on
one GPU). The default group is ``"cpu:gloo,cuda:hccc"`` (``cpu:hccc`` with ``--device cpu``), so
the reference group is gloo over the same store. Per size (bytes of each rank's f32 input):

- ``all_reduce`` (sum) of a rank-dependent tensor: hccc on the device tensor, gloo on its CPU copy;
- ``all_to_all_single`` with uneven splits (rank ``r`` sends ``(r + 2 * p + 1) * k`` elements to
  rank ``p``, the counts every rank derives the same way): hccc on device tensors, gloo on CPU
  copies.

A row: the collective, the size, the largest difference from gloo's answer (an exact match is
expected for all_to_all_single and for all_reduce of integers held in f32), the median time of
``--iters`` timed calls of each backend on rank 0 (synchronised; the first call, which makes the
communicator and builds its kernels, is not timed), and "ok" or what failed. Exit status 0 when
every row matched, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_common as common  # noqa: E402
from rank_processes import RankJobError, run_ranks, store_url  # noqa: E402

COLLECTIVES = ("all_reduce", "all_to_all_single")


def a2a_splits(world: int, rank: int, unit: int) -> tuple[list, list]:
    """(input splits, output splits) of ``rank``: it sends ``(rank + 2 * p + 1) * unit`` elements
    to rank ``p`` and receives ``(p + 2 * rank + 1) * unit`` from it (uneven in both directions)."""
    return ([(rank + 2 * p + 1) * unit for p in range(world)], [(p + 2 * rank + 1) * unit for p in range(world)])


def _sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(torch, dist, dev, fn, iters: int) -> list:
    out = []
    for _ in range(iters):
        dist.barrier()
        _sync(torch, dev)
        t0 = time.perf_counter()
        fn()
        _sync(torch, dev)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def rank_job(rank: int, world: int, store_dir: str, device: str, sizes: list, iters: int, timeout_s: float) -> list:
    """One rank's rows (module docstring)."""
    import torch
    import torch.distributed as dist

    import hccc.torch  # noqa: F401  (registers the backend)
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    backend = "cpu:gloo,cuda:hccc" if device == "cuda" else "cpu:hccc"
    dist.init_process_group(backend, init_method=store_url(store_dir), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    ref = dist.new_group(backend="gloo")
    rows = []
    try:
        for nbytes in sizes:
            n = max(1, nbytes // 4)
            # all_reduce: small integers in f32, so every order of summation gives the same bits
            x = (torch.arange(n, dtype=torch.float32) % 251 + rank * 3).to(dev)
            want = x.cpu().clone()
            dist.all_reduce(want, group=ref)
            got = x.clone()
            dist.all_reduce(got)
            _sync(torch, dev)
            diff = float((got.cpu() - want).abs().max())
            t_h = _timed(torch, dist, dev, lambda: dist.all_reduce(x.clone()), iters)
            xc = x.cpu()
            t_g = _timed(torch, dist, torch.device("cpu"), lambda: dist.all_reduce(xc.clone(), group=ref), iters)
            rows.append({"collective": "all_reduce", "bytes": n * 4, "max_diff": diff,
                         "hccc_us": statistics.median(t_h), "gloo_us": statistics.median(t_g)})
            # all_to_all_single with uneven splits
            unit = max(1, n // (world * world))
            ins, outs = a2a_splits(world, rank, unit)
            src = (torch.arange(sum(ins), dtype=torch.float32) + 1000 * rank).to(dev)
            want = torch.empty(sum(outs), dtype=torch.float32)
            dist.all_to_all_single(want, src.cpu(), outs, ins, group=ref)
            got = torch.empty(sum(outs), dtype=torch.float32, device=dev)
            dist.all_to_all_single(got, src, outs, ins)
            _sync(torch, dev)
            diff = float((got.cpu() - want).abs().max()) if want.numel() else 0.0
            t_h = _timed(torch, dist, dev, lambda: dist.all_to_all_single(got, src, outs, ins), iters)
            sc = src.cpu()
            t_g = _timed(torch, dist, torch.device("cpu"),
                         lambda: dist.all_to_all_single(want, sc, outs, ins, group=ref), iters)
            rows.append({"collective": "all_to_all_single", "bytes": sum(ins) * 4, "max_diff": diff,
                         "hccc_us": statistics.median(t_h), "gloo_us": statistics.median(t_g)})
    finally:
        dist.destroy_process_group()
    return rows


def run(device: str, world: int, sizes: list, iters: int, timeout_s: float) -> dict:
    """Every rank's rows, rank 0's reported; ``{"rows", "ok", "error"}``."""
    try:
        rows, errors = run_ranks(rank_job, world, (device, sizes, iters, timeout_s), timeout_s=timeout_s)[0], []
    except RankJobError as exc:
        rows, errors = [], [f"rank {r}: {why}" for r, why in sorted(exc.reasons.items())]
    for row in rows:
        row["status"] = "ok" if row["max_diff"] == 0.0 else f"differs from gloo by {row['max_diff']}"
    ok = not errors and bool(rows) and all(r["status"] == "ok" for r in rows)
    return {"device": device, "ranks": world, "rows": rows, "ok": ok,
            "error": common.tail(errors[0], 3, 400) if errors else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="4K,1M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole check")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from hccc.args import parse_size
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except Exception:
        sizes = []
    if not sizes or any(s <= 0 for s in sizes) or args.ranks < 2 or args.iters < 1 or args.timeout <= 0:
        print("torch_gpu_check: error: --sizes must be sizes such as 4K,1M; --ranks at least 2; "
              "--iters and --timeout positive", file=sys.stderr)
        return 2
    out = run(args.device, args.ranks, sizes, args.iters, args.timeout)
    print(f"torch backend on {args.device}, {args.ranks} processes: "
          + ("every call matches gloo" if out["ok"] else f"FAILED {out['error'] or ''}"))
    print(f"{'collective':<20}{'bytes':>10}{'hccc (us)':>12}{'gloo (us)':>12}  status")
    for r in out["rows"]:
        print(f"{r['collective']:<20}{r['bytes']:>10}{r['hccc_us']:>12.1f}{r['gloo_us']:>12.1f}  {r['status']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
