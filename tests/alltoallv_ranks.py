"""Test helper: uneven ``all_to_all_single`` jobs for :mod:`torch_ranks`' ``spawn`` (one process a
rank, under the ``"hccc"`` backend on its built-in catalog, or gloo)."""
from __future__ import annotations

import sys
from pathlib import Path

from torch_ranks import ROOT, init


def splits_job(rank: int, world: int, url: str, backend: str, bad_rank: int = -1):
    """Uneven calls (random, one pair with 90 %, zero rows; float32 and int32, 1-D and 2-D);
    returns every output and the stats. ``bad_rank``: that rank's output splits disagree with the
    senders' on the last call (its error text is returned then)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    init(backend, rank, world, url)
    rng = np.random.default_rng(11)
    mats = [rng.integers(0, 9, (world, world)), np.zeros((world, world), np.int64)]
    skew = np.ones((world, world), np.int64)
    skew[1, 0] = 9 * world * world
    mats.append(skew)
    outs = []
    for k, m in enumerate(mats):
        for dtype, width in ((torch.float32, 1), (torch.int32, 3)):
            ins, os_ = m[rank].tolist(), m[:, rank].tolist()
            x = (torch.arange(sum(ins) * width) + 1000 * rank + 100 * k).to(dtype).reshape(-1, width)
            out = torch.full((sum(os_), width), -1).to(dtype)
            dist.all_to_all_single(out, x, os_, ins)
            outs.append(out.numpy())
    err = None
    if bad_rank >= 0:
        m = mats[0]
        ins, os_ = m[rank].tolist(), m[:, rank].tolist()
        if rank == bad_rank:
            os_ = os_[::-1] if os_ != os_[::-1] else [os_[0] + 1] + os_[1:]
        x = torch.ones(sum(ins))
        out = torch.zeros(sum(os_))
        try:
            dist.all_to_all_single(out, x, os_, ins)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
    stats = {}
    if "hccc" in backend:
        import hccc.torch
        stats = hccc.torch.stats()
    if err is None:
        dist.destroy_process_group()
    return {"outs": outs, "stats": stats, "error": err}


def moe_job(rank: int, world: int, url: str, backend: str, steps: int, experts: int):
    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    import torch.distributed as dist
    from moe_alltoallv import train
    snaps, losses, splits = train(backend, steps, experts, rank=rank, world=world, init_method=url)
    stats = {}
    if "hccc" in backend:
        import hccc.torch
        stats = hccc.torch.stats()
    dist.destroy_process_group()
    return {"snaps": [s.numpy() for s in snaps], "losses": losses, "splits": splits, "stats": stats}
