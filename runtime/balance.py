"""GPU-aware micro-batch balancing (HetCCL-SNU section 4.5).

Heterogeneous GPUs finish a training step only when the slowest one does. Given measured speeds
``s_i`` (tokens/s, samples/s: any unit, the same for all) and a total batch ``B``, each GPU gets
``b_i ~ B * s_i / sum(s)`` so that the compute times ``b_i / s_i`` are equal. Batches are integers:

    every b_i is the floor or the ceiling of its exact share B * s_i / S (so it stays proportional,
    within one unit), and among all such roundings that sum to B we take the one with the smallest
    step time max_i b_i / s_i: the ``B - sum(floor)`` extra units go to the GPUs whose time after
    one more unit, (min_each + floor_i + 1) / s_i, is smallest (ties: the lower index).

Choosing the k smallest (floor_i + 1) / s_i is optimal within that family because the step time of a
choice is the largest of the chosen values and of the unchanged floors (tested against brute force).
``min_each`` reserves that many for every GPU first (e.g. 1, so no GPU idles) and balances the rest.
"""
from __future__ import annotations

from fractions import Fraction


class BalanceError(ValueError):
    """Speeds or batch that admit no assignment; the message is for the user."""


def balance(speeds, batch: int, *, min_each: int = 0) -> list[int]:
    """Integer micro-batch sizes proportional to ``speeds`` that sum to ``batch`` (see module doc)."""
    sp = [Fraction(str(s)) if isinstance(s, float) else Fraction(s) for s in speeds]
    if not sp:
        raise BalanceError("no speeds given")
    for i, s in enumerate(sp):
        if s <= 0:
            raise BalanceError(f"speed {i} must be positive, got {float(s):g}")
    if isinstance(batch, bool) or int(batch) != batch or batch < 0:
        raise BalanceError(f"batch must be a non-negative integer, got {batch!r}")
    if min_each < 0:
        raise BalanceError("min_each must be non-negative")
    n = len(sp)
    if batch < n * min_each:
        raise BalanceError(f"batch {batch} cannot give each of {n} GPUs at least {min_each}")
    rest = batch - n * min_each
    total = sum(sp)
    share = [rest * s / total for s in sp]
    b = [int(x) for x in share]                      # floors (Fractions are exact)
    extra = rest - sum(b)                            # 0 <= extra < n
    order = sorted((i for i in range(n) if b[i] != share[i]), key=lambda i: (Fraction(b[i] + 1 + min_each) / sp[i], i))
    for i in order[:extra]:
        b[i] += 1
    return [x + min_each for x in b]


def step_time(sizes, speeds) -> float:
    """max_i sizes_i / speeds_i: the compute time of the slowest GPU."""
    return max(float(b) / float(s) for b, s in zip(sizes, speeds))
