"""nccl-tests' bus bandwidth: ``busbw = algbw * busbw_factor(collective, nranks)``.

``algbw = S / time`` with ``S`` the collective's full buffer (AllGather: the output; the others: the
input). The factor turns it into the bandwidth each link would need for the ring algorithm, so numbers
compare across collectives and rank counts: AllReduce ``2(n-1)/n``, AllGather, ReduceScatter
and AllToAll ``(n-1)/n``, Broadcast and Reduce 1. One definition for the launcher, the simulator, ``hccc sim``,
``hccc run`` and ``hccc synth``.
"""
from __future__ import annotations

__all__ = ["busbw_factor"]


def busbw_factor(collective: str, nranks: int) -> float:
    """The factor for ``collective`` (any case) over ``nranks`` ranks (0.0 for no ranks)."""
    n = int(nranks)
    c = str(getattr(collective, "value", collective)).lower()
    if c == "allreduce":
        f = 2.0 * (n - 1) / n if n > 0 else 0.0
    elif c in ("allgather", "reducescatter", "alltoall"):
        f = (n - 1) / n if n > 0 else 0.0
    elif c in ("broadcast", "reduce"):
        f = 1.0 if n > 0 else 0.0
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return f
