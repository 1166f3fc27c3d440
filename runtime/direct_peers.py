"""Direct mode's peers array at launch: every rank's ``hccc_args`` in rank order, copied into each
rank's own memory and passed as its ``peers``, so that a sender writes the receiver's destination
for the receives :mod:`hccc.compiler.ir.direct` proves safe. Only ranks that share one address
space have it: all on one platform (the CPU emulation, or GPUs of one process that reach each other's
memory as they reach the FIFOs), never HIP across several GPUs (its data buffers are coarse-grained
device memory, which a peer GPU's writes need not reach coherently before the kernel ends). Under LL
every message goes through the FIFO as lines (no peers array, so both ends of a message take the FIFO
path): :func:`ll_note` says so. The single-process runner and the ranks of a job in one process
(:class:`~hccc.runtime.local_job.LocalJob`) give their launches the array through these functions.
"""
from __future__ import annotations

import numpy as np


def peers_usable(rank_pf: list, placement) -> bool:
    """Whether ranks on ``rank_pf`` (each rank's Platform object) at ``placement`` (each rank's
    device) can be given a peers array (direct mode can run)."""
    if not rank_pf or len({pf.name for pf in rank_pf}) != 1:
        return False
    return not (rank_pf[0].name == "hip" and len(set(placement)) > 1)


def peers_blob(argv: list) -> np.ndarray:
    """The peers array of one launch: every rank's ``hccc_args`` (``argv``, in rank order), packed."""
    return np.frombuffer(b"".join(bytes(a) for a in argv), np.uint8)


def direct_receive_count(ir, rank_platform: list[str], direct: str) -> int:
    """Receives of ``ir`` its kernels run in direct mode when the launch has a peers array
    (``direct="auto"``: those :mod:`hccc.compiler.ir.direct` proves safe; 0 with ``"off"``)."""
    from hccc.compiler.backend.codegen import prepare_output
    from hccc.compiler.backend.direct_fields import direct_fields
    canonical = prepare_output(ir, ".", rank_platform)[0]   # canonical, as generated
    dx = direct_fields(canonical, direct)
    return 0 if dx is None else int(((dx["direct"] & 2) != 0).sum())


def ll_note(name: str, n: int) -> str:
    """Why ``n`` direct-mode receives of program ``name`` ran through the FIFO in an LL launch."""
    return (f"{n} direct-mode receive{'s' if n != 1 else ''} of {name} run through the FIFO as LL "
            "lines (a direct write lands in the receiver's buffer, which has no room for LL's flags)")


__all__ = ["peers_usable", "peers_blob", "direct_receive_count", "ll_note"]
