"""nccl-tests' bus bandwidth: ``busbw = algbw * busbw_factor(collective, nranks)``.

``algbw = S / time`` with ``S`` the collective's full buffer (AllGather: the output; the others: the
input). The factor turns it into the bandwidth each link would need for the ring algorithm, so numbers
compare across collectives and rank counts: AllReduce ``2(n-1)/n``, AllGather, ReduceScatter
and AllToAll ``(n-1)/n``, Broadcast and Reduce 1; each collective's factor is part of its spec
(:mod:`hccc.compiler.frontend.collectives`). One definition for the launcher, the simulator,
``hccc sim``, ``hccc run`` and ``hccc synth``.
"""
from __future__ import annotations

from hccc.compiler.frontend.collectives import spec_of

__all__ = ["busbw_factor"]


def busbw_factor(collective: str, nranks: int) -> float:
    """The factor for ``collective`` (any case) over ``nranks`` ranks (0.0 for no ranks)."""
    spec = spec_of(collective)
    n = int(nranks)
    return float(spec.busbw(n)) if n > 0 else 0.0
