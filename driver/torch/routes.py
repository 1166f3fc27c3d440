"""A call's route through the torch backend: torch's names for the call's op and dtype, the names
hccc's kernels give them, the choice between an algorithm of the catalog and the delegate
(:func:`choose_route`), and the once-per-job log of fallbacks."""
from __future__ import annotations

import functools
import logging

import torch
import torch.distributed as dist

from hccc.torch.averages import avg_plan

log = logging.getLogger("hccc.torch")

#: torch's reduction operations by the names the calls are described with (and the runtime's op
#: names where it has the op: :data:`hccc.runtime.launcher.OPS`)
_TORCH_OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "AVG": "avg", "PRODUCT": "prod",
              "BAND": "band", "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}
#: the same by torch's ReduceOp kind (``ReduceOp.op``), for the look-up every call makes
_OP_NAMES = {getattr(dist.ReduceOp.RedOpType, m): n for m, n in _TORCH_OPS.items()
             if hasattr(dist.ReduceOp.RedOpType, m)}
#: distinct call signatures whose routes a group remembers; past this the memory starts afresh
#: (a job has a few dozen signatures: its tensors' sizes, dtypes and ops; this bounds a job that
#: makes a new size every call)
ROUTE_CACHE_MAX = 4096
#: (delegate, reason) pairs this process has logged: a fallback is logged once per job, by the
#: rank 0 of a group (every rank counts it: :func:`hccc.torch.process_group.stats`)
_LOGGED: set[tuple[str, str]] = set()


def log_fallback(rank: int, coll: str, delegate: str, why: str) -> None:
    if rank != 0 or (delegate, why) in _LOGGED:
        return
    _LOGGED.add((delegate, why))
    log.warning("hccc: %s falls back to %s: %s", coll, delegate, why)


@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name without the module (``float32``), made once per dtype (every call's
    counters name it)."""
    return str(dtype).replace("torch.", "")


@functools.cache
def kernel_dtype(dtype: torch.dtype) -> str | None:
    """The runtime's name of a torch dtype its kernels implement (:data:`hccc.runtime.launcher.
    DTYPES`: whatever the kernels gain is carried), else None; looked up once per dtype."""
    from hccc.runtime.launcher import DTYPES
    name = dtype_name(dtype)
    return name if name in DTYPES else None


def kernel_op(op: str) -> str | None:
    """The runtime's name of a torch-level op its kernels implement (:data:`hccc.runtime.launcher.
    OPS`), else None (``prod`` may be spelt ``product`` there)."""
    from hccc.runtime.launcher import OPS
    for name in ((op, "product") if op == "prod" else (op,)):
        if name in OPS:
            return name
    return None



def op_name(opts) -> str:
    """torch's operation of a call as a stable name (never an object's text: a PREMUL_SUM op is an
    object whose text holds its address)."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    name = _OP_NAMES.get(getattr(op, "op", None))    # a ReduceOp's kind: one look-up per call
    if name is not None:
        return name
    for member, name in _TORCH_OPS.items():
        kind = getattr(dist.ReduceOp.RedOpType, member, None)
        if kind is not None and op == kind:
            return name
    return "an unknown reduction"


def choose_route(coll: str, dtype: torch.dtype, element_size: int, nbytes: int, op: str, *,
                 size: int, root: int | None, extra: str, contiguous: bool,
                 delegate_to: str | None, disabled: str | None, catalog, cluster) -> tuple:
    """The route of a call: ``("hccc", entry, kernel op, sum dtype, prescale)`` or
    ``("fallback" | "delegated", reason, None, None, None)``. ``coll`` on ``size`` ranks, ``nbytes``
    of ``dtype`` tensors, torch's ``op`` (an AVG runs as a SUM in the dtype and with the scaling
    :func:`~hccc.torch.averages.avg_plan` gives), ``root``; ``extra``: why the call's tensors do
    not fit a collective (""); ``delegate_to``: ``"<device> to <backend>"`` where the device map
    gives the tensors' device to another backend than hccc; ``disabled``: why the group runs every call on the delegate."""
    def fallback(why: str, kind: str = "fallback") -> tuple:
        return (kind, why, None, None, None)
    if delegate_to is not None:
        return fallback(f"the device map gives {delegate_to}", "delegated")
    if extra:
        return fallback(extra)
    if disabled:
        return fallback(disabled)
    if not catalog.entries and not getattr(catalog, "lazy", False):
        return fallback("no algorithm catalog (set HCCC_ALGO_DIR or Options(catalog=))")
    if not contiguous:
        return fallback("a non-contiguous tensor")
    if nbytes == 0:
        return fallback("an empty tensor")
    from hccc.runtime.launcher import DTYPES, OPS
    name = dtype_name(dtype)
    acc, pre, kop = None, False, kernel_op(op)
    if op == "avg":
        plan = avg_plan(dtype, DTYPES)
        if plan is None:
            return fallback(f"op avg of {name} (torch averages no {name} tensors)")
        kop = kernel_op("sum")
        acc, pre = plan
        nbytes = nbytes // element_size * acc.itemsize
    kdtype = kernel_dtype(acc if acc is not None else dtype)
    if kdtype is None:
        return fallback(f"dtype {name} has no hccc kernel (hccc: {', '.join(DTYPES)})")
    if kop is None:
        return fallback(f"op {op} has no hccc kernel (hccc: {', '.join(OPS)})")
    entry, why = catalog.select(coll, size, nbytes, kdtype, kop, root, cluster)
    return ("hccc", entry, kop, acc, pre) if entry is not None else fallback(why)
