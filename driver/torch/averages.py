"""An AVG as a SUM (every AVG of the torch backend, on hccc's kernels or on a delegate without
AVG), and the tensor helpers its adapters share: whether two tensors overlap, a contiguous view
copied back."""
from __future__ import annotations

import torch


def avg_plan(dtype: torch.dtype, sum_dtypes) -> tuple[torch.dtype, bool] | None:
    """How an AVG of ``dtype`` tensors runs as a SUM over the ranks: (the dtype the sum runs in,
    whether each rank scales its input by 1/n first); None for a dtype torch averages not (bool,
    complex). ``sum_dtypes``: the runtime dtype names a sum can run in (None: any).

    A sum in the tensor's own dtype followed by a divide overflows where the average is
    representable (float16 40000 + 40000, float32 3e38 + 3e38), so floating types are summed in
    float32 at least (float16 then divides after the sum: float32 holds any sum of float16 values
    exactly enough and none overflows) and scaled by 1/n first where the sum could still overflow
    (bfloat16, float32, float64: as NCCL's floating-point AVG does). Integers are summed in int64
    where it is available (the sum does not wrap) and divided after, truncating toward zero (C's
    integer division, NCCL's integer AVG)."""
    def have(d):
        return sum_dtypes is None or str(d).replace("torch.", "") in sum_dtypes
    if dtype == torch.bool or dtype.is_complex:
        return None
    if dtype.is_floating_point:
        if dtype == torch.float16:
            return (torch.float32, False) if have(torch.float32) else (dtype, True)
        if dtype == torch.bfloat16:
            return (torch.float32, True) if have(torch.float32) else (dtype, True)
        return dtype, True
    return (torch.int64, False) if have(torch.int64) else (dtype, False)


def avg_input(x: torch.Tensor, acc: torch.dtype, pre: bool, n: int, *, inplace: bool) -> torch.Tensor:
    """The tensor the SUM of an AVG runs on: ``x`` in ``acc`` (``x`` itself when ``inplace`` and it
    is already of that dtype), scaled by 1/n when ``pre``."""
    if x.dtype == acc and inplace:
        y = x
    else:
        y = x.to(acc, copy=True)
    if pre:
        y.mul_(1.0 / n)
    return y


def avg_output(y: torch.Tensor, out: torch.Tensor, pre: bool, n: int) -> None:
    """The AVG from the summed ``y`` into ``out`` (divided by n unless scaled before)."""
    if not pre:
        if y.dtype.is_floating_point:
            y.div_(n)
        else:
            y = torch.div(y, n, rounding_mode="trunc")
    if y is not out:
        out.copy_(y.view_as(out))


def avg_sum(x: torch.Tensor, out: torch.Tensor, plan, n: int, *, inplace: bool, receives: bool,
             run_sum) -> None:
    """An AVG as a SUM (every AVG of the backend, on hccc's kernels or a delegate without AVG):
    ``x``'s values in ``plan`` = (the dtype the sum runs in, whether each rank scales by 1/n
    first: :func:`avg_plan` over the kernels' dtypes; None: over every dtype, for a delegate),
    summed by ``run_sum(y, res)`` into ``res`` (None: in place in ``y``,
    where ``out`` is ``x``: the collective's input and output are one buffer), then averaged into
    ``out`` where this rank ``receives`` the result. ``inplace``: ``x`` itself may be summed in
    (its dtype is the sum's)."""
    acc, pre = plan if plan is not None else (avg_plan(x.dtype, None) or (x.dtype, False))
    y = avg_input(x, acc, pre, n, inplace=inplace)
    if out is x:
        res = y
        run_sum(y, None)
    else:
        res = out if out.dtype == y.dtype and not overlap(x, out) \
            else torch.empty(out.numel(), dtype=y.dtype, device=out.device)
        run_sum(y, res)
    if receives:
        avg_output(res, out, pre, n)


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share memory."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


class contiguous:
    """``with contiguous(t) as c``: ``t`` itself when contiguous, else a contiguous copy that is
    copied back into ``t`` at the end."""

    def __init__(self, t: torch.Tensor):
        self.t = t
        self.c = t if t.is_contiguous() else t.contiguous()

    def __enter__(self) -> torch.Tensor:
        return self.c

    def __exit__(self, *exc) -> None:
        if self.c is not self.t and exc[0] is None:
            self.t.copy_(self.c)
