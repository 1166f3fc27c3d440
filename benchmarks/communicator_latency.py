"""One rank per process on the CPU emulation: wall time of one ``Communicator.all_reduce`` call
(host barriers, counter reset, launch, wait) next to the same program's kernel time in the
single-process runner, measured side by side on this machine.

    python benchmarks/communicator_latency.py [--ranks 4] [--sizes 4K,64K,1M] [--iters 20]

Algorithm: ``generators.ring_allreduce(ranks)`` with 64 KiB slots. ``comm us`` is the mean wall time
of an ``all_reduce`` call on rank 0 after two warm-up calls (every rank in its own process,
bootstrapped through a torch ``FileStore``); ``runner us`` is the mean kernel time that
``hccc.runtime.launcher.Runner`` measures for the same program and size with every rank in one
process (no host barriers: that is the overhead the ratio shows). The CPU emulation runs every
GPU thread as an OS thread, so both numbers are host-thread timings, not GPU ones.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from hccc.args import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rank_processes import run_ranks, store_url  # noqa: E402


def _rank(rank: int, world: int, store_dir: str, sizes: list[int], iters: int) -> dict[int, float]:
    """This rank's mean wall time of one ``all_reduce`` per size, in us."""
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.communicator import Communicator

    ir = build_program(gen.ring_allreduce(world), chunk_bytes=1 << 16)
    out = {}
    with Communicator(ir, rank=rank, world_size=world, init_method=store_url(store_dir)) as comm:
        for nbytes in sizes:
            x = np.ones(nbytes // 4, dtype=np.float32)
            for _ in range(2):
                comm.all_reduce(x)
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(x)
            out[nbytes] = (time.perf_counter() - t0) / iters * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sizes", default="4K,64K,1M")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.launcher import Runner

    ir = build_program(gen.ring_allreduce(args.ranks), chunk_bytes=1 << 16)
    with Runner(ir, "cpu") as runner:
        single = {n: runner.run(n, iters=args.iters, warmup=2).time_us for n in sizes}

    res = run_ranks(_rank, args.ranks, (sizes, args.iters), timeout_s=1800)
    print(f"# ring AllReduce, {args.ranks} ranks, CPU emulation, {args.iters} calls per size")
    print(f"{'bytes':>10} {'comm us':>10} {'runner us':>10} {'ratio':>7}")
    for n in sizes:
        c, s = res[0][n], single[n]
        print(f"{n:>10} {c:>10.0f} {s:>10.0f} {c / s:>7.2f}")


if __name__ == "__main__":
    main()
