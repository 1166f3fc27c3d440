"""Train a small mixture-of-experts layer whose tokens travel between ranks with uneven
``all_to_all_single`` calls (token dispatch and combine), through any torch.distributed backend --
``hccc`` included, which carries the uneven calls on its AllToAll program run as an AllToAllv:

    torchrun --standalone --nproc-per-node 4 examples/torch/moe_alltoallv.py --backend hccc

Every rank holds ``--experts / world`` experts (two-layer MLPs) and a replicated router. A step:
the router sends each of the rank's tokens to its top-1 expert (a Zipf-skewed preference, as real
routers show), the rank sorts its tokens by destination rank and exchanges the per-rank token
counts (an even ``all_to_all_single`` of one count per rank), dispatches the tokens (uneven
``all_to_all_single``: input split sizes = tokens per destination, output split sizes = the
counts received), runs its experts, combines (the reverse uneven call), and trains the router
and the experts; the router's gradients are averaged with ``all_reduce``. Backward moves the
gradients through the same uneven calls, reversed. Rank 0 prints the loss and, under hccc, the
calls hccc carried (``alltoallv``) and which fell back.
"""
from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist

#: tokens per rank and step, token width, hidden width of an expert
TOKENS, WIDTH, HIDDEN = 64, 16, 32


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with split sizes; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        back = g.new_empty((sum(in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(back, g.contiguous(), in_splits, out_splits)
        return back, None, None


def _zipf_bias(experts: int, s: float = 1.2) -> torch.Tensor:
    """A router bias that makes expert k about 1/(k+1)^s as popular as expert 0."""
    return -s * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))


class MoE(torch.nn.Module):
    def __init__(self, experts: int, world: int, rank: int):
        super().__init__()
        torch.manual_seed(0)
        self.router = torch.nn.Linear(WIDTH, experts)
        with torch.no_grad():
            self.router.bias.copy_(_zipf_bias(experts))
        self.world, self.rank, self.per = world, rank, experts // world
        self.experts = torch.nn.ModuleList()
        for e in range(experts):   # every rank draws every expert, keeps its own (same init anywhere)
            m = torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH))
            if e // self.per == rank:
                self.experts.append(m)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        probs = torch.softmax(self.router(x), dim=-1)
        weight, expert = probs.max(dim=-1)
        order = torch.argsort(expert, stable=True)
        dest = expert[order] // self.per
        send = torch.bincount(dest, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)                       # counts: one per rank
        in_splits, out_splits = send.tolist(), recv.tolist()
        # which local expert each token goes to travels with it (as one more column)
        payload = torch.cat([x[order], (expert[order] % self.per).unsqueeze(1).to(x.dtype)], dim=1)
        got = _AllToAll.apply(payload, out_splits, in_splits)    # dispatch
        tokens, local = got[:, :-1], got[:, -1].round().long()
        # in the graph on every rank, also where no token reached a local expert: every rank's
        # backward then makes the combine's reverse call (collectives must match across ranks)
        y = tokens.new_zeros(tokens.shape) + 0.0 * sum(p.sum() for p in self.experts.parameters())
        for k, m in enumerate(self.experts):
            sel = local == k
            if sel.any():
                y = y.index_put((sel.nonzero().squeeze(1),), m(tokens[sel]))
        back = _AllToAll.apply(y, in_splits, out_splits)        # combine
        out = torch.empty_like(back)
        out = out.index_put((order,), back)
        return out * weight.unsqueeze(1), {"in": in_splits, "out": out_splits}


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(TOKENS, WIDTH, generator=g)
    return x, torch.tanh(x.flip(1))


def snapshot(model: MoE) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def train(backend: str, steps: int, experts: int = 8, rank: int | None = None, world: int | None = None,
          init_method: str | None = None, timeout_s: float = 60.0, lr: float = 0.05):
    """Train ``steps`` steps; returns (parameter snapshots after every step, losses, splits)."""
    if "hccc" in backend:
        import hccc.torch  # noqa: F401  (registers the "hccc" backend)
    kw = {} if init_method is None else {"init_method": init_method, "rank": rank, "world_size": world}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    rank, world = dist.get_rank(), dist.get_world_size()
    if experts % world:
        raise SystemExit(f"--experts {experts} must be a multiple of the {world} ranks")
    model = MoE(experts, world, rank)
    snaps, losses, splits = [], [], []
    for step in range(steps):
        x, y = batch(step, rank)
        out, sp = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.router.parameters():         # replicated: average its gradient
                dist.all_reduce(p.grad)
                p.grad /= world
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
        snaps.append(snapshot(model))
        losses.append(loss.item())
        splits.append(sp)
    return snaps, losses, splits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="hccc")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--experts", type=int, default=8)
    a = ap.parse_args()
    snaps, losses, splits = train(a.backend, a.steps, a.experts)
    if dist.get_rank() == 0:
        for s, (l, sp) in enumerate(zip(losses, splits)):
            print(f"step {s:3d}  loss {l:.5f}  tokens sent per rank {sp['in']}")
        if "hccc" in a.backend:
            import hccc.torch
            st = hccc.torch.stats()
            print("hccc carried:", st["hccc"], " fell back:", st["fallback"], st["reasons"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
