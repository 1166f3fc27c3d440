"""The GPU IPC path of one rank per process (CUDA: ``cudaIpcGetMemHandle``): 2 and 4 processes on
the visible GPU(s) run an AllReduce through :class:`hccc.runtime.Communicator` on CuPy arrays.
Skipped without a CUDA GPU and CuPy (``HCCC_REQUIRE_GPU=1`` makes that a failure)."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from conftest import cuda_platform_or_skip


@pytest.fixture
def cuda_visible():
    cuda_platform_or_skip().close()
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        pytest.skip("torch (the 'dist' extra) is not installed")


def _rank(rank: int, world: int, url: str, count: int, q) -> None:
    try:
        import cupy as cp

        from hccc.compiler.frontend import generators as gen
        from hccc.compiler.passes.build import build_program
        from hccc.runtime.communicator import Communicator

        ir = build_program(gen.ring_allreduce(world), chunk_bytes=1 << 16)
        with Communicator(ir, rank=rank, world_size=world, init_method=url, backend="cuda",
                          device=0, timeout_s=60) as comm:
            x = cp.arange(count, dtype=cp.float32) % 13 + rank
            comm.all_reduce(x)
            want = (np.arange(count, dtype=np.float32) % 13) * world + world * (world - 1) / 2
            q.put((rank, int((cp.asnumpy(x) != want).sum())))
    except BaseException as exc:  # reported to the test
        q.put((rank, f"{type(exc).__name__}: {exc}"))


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_over_cuda_ipc(cuda_visible, tmp_path, world):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    url = f"file://{tmp_path}/store"
    procs = [ctx.Process(target=_rank, args=(r, world, url, 1 << 20 | 5, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    assert res == {r: 0 for r in range(world)}, res
