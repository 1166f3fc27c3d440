"""hccc as a torch.distributed backend: ``import hccc.torch`` registers ``"hccc"``.

    import torch.distributed as dist
    import hccc.torch                              # registers the backend
    dist.init_process_group("hccc")                # or "cpu:hccc,cuda:hccc", "cpu:gloo,cuda:hccc"

Every collective a training job makes (DDP, FSDP ``fully_shard``, tensor parallelism) is served
by an algorithm of the catalog (:mod:`hccc.catalog`: the directory ``HCCC_ALGO_DIR``, or
``pg_options=hccc.torch.Options(catalog=DIR)``; without one, the built-in catalog of hccc's
generators, :mod:`hccc.builtin_catalog`) through :class:`hccc.runtime.Communicator`, or,
where no algorithm serves it, by a delegate backend (gloo for CPU tensors, nccl -- RCCL on ROCm --
for GPU tensors), each such fallback logged once per job with its reason. :func:`stats` counts which
calls took which route. The process group: :mod:`hccc.torch.process_group`.
"""
from __future__ import annotations

from hccc.torch.ledger import CallMismatch
from hccc.torch.capture import CaptureError, capture_active
from hccc.torch.options import Options
from hccc.torch.process_group import HcccProcessGroup, register, stats

register()

__all__ = ["CallMismatch", "CaptureError", "HcccProcessGroup", "Options", "capture_active", "register", "stats"]
