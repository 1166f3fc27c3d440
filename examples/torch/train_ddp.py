"""Train a small MLP with DistributedDataParallel (or FSDP ``fully_shard``) on synthetic data,
through any torch.distributed backend -- ``hccc`` included -- without changing the training code:

    HCCC_ALGO_DIR=examples/torch/catalog4 \\
        torchrun --standalone --nproc-per-node 4 examples/torch/train_ddp.py --backend hccc

``--backend`` is anything ``init_process_group`` takes (``hccc``, ``gloo``, ``cpu:hccc,cuda:hccc``,
``cpu:gloo,cuda:hccc``). Rank 0 prints the loss per step and, with hccc, which calls the catalog's
algorithms carried and which fell back. ``--dump FILE`` writes every rank-0 parameter snapshot
(one per step) for comparisons between backends.
"""
from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist


def mlp(width: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 8))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's synthetic batch of ``step`` (a fixed target function plus noise)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 32, generator=g)
    y = torch.sin(x[:, :8]) + 0.1 * torch.randn(16, 8, generator=g)
    return x, y


def snapshot(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, flattened (FSDP's sharded parameters gathered first)."""
    parts = []
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        parts.append(full.detach().reshape(-1).clone())
    return torch.cat(parts)


def train(backend: str, steps: int, mode: str = "ddp", rank: int | None = None,
          world: int | None = None, init_method: str | None = None,
          timeout_s: float = 60.0) -> tuple[list[torch.Tensor], list[float]]:
    """Train ``steps`` steps; returns the parameter snapshots after every step and the losses."""
    if "hccc" in backend:
        import hccc.torch  # noqa: F401  (registers the "hccc" backend)
    kw = {} if init_method is None else {"init_method": init_method, "rank": rank, "world_size": world}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    rank = dist.get_rank()
    model = mlp()
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    snaps, losses = [], []
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        snaps.append(snapshot(model))
        losses.append(float(loss))
    return snaps, losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="hccc")
    ap.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dump", help="write rank 0's parameter snapshots here (torch.save)")
    args = ap.parse_args()
    snaps, losses = train(args.backend, args.steps, args.mode)
    if dist.get_rank() == 0:
        for i, loss in enumerate(losses):
            print(f"step {i:3d}  loss {loss:.5f}")
        if "hccc" in args.backend:
            import hccc.torch
            s = hccc.torch.stats()
            print("hccc:", s["hccc"], "fallback:", s["fallback"])
            for why, n in s["reasons"].items():
                print(f"  fell back {n}x: {why}")
        if args.dump:
            torch.save(snaps, args.dump)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
