"""What one run may allocate: its buffers (with the host copies that check them) and its FIFOs and
control blocks, each refused before anything is allocated or built when it would not fit
:func:`run_memory_limit` (``HCCC_MAX_RUN_BYTES``, else half of this machine's physical memory).
"""
from __future__ import annotations

from hccc.runtime.platform import PlatformError
from hccc.util.limits import printable


def run_memory_limit() -> int:
    """Bytes of buffers one run may allocate: ``HCCC_MAX_RUN_BYTES`` (K/M/G/T suffixes) or half
    of this machine's physical memory."""
    import os
    from hccc.util.diagnostics import env_size
    try:
        cap = env_size("HCCC_MAX_RUN_BYTES")
    except ValueError as exc:
        raise PlatformError(f"HCCC_MAX_RUN_BYTES must be a positive size such as 16G, not "
                            f"'{printable(str(exc), limit=40)}'") from None
    if cap is not None:
        return cap
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 1 << 34


def check_run_memory(name: str, nbytes: int, buffer_bytes: int) -> None:
    """Refuse (before allocating anything) a run whose buffers, with the host copies that check
    them (inputs, the oracle's buffers, the results), would not fit :func:`run_memory_limit`."""
    need = 4 * int(buffer_bytes)
    limit = run_memory_limit()
    if need > limit:
        from hccc.util.sizes import human_size as human
        raise PlatformError(f"running {name} at {nbytes} bytes needs about {human(need)} of memory "
                            f"(its buffers, scratch included, are {human(buffer_bytes)}, checked against "
                            f"host copies), over the limit of {human(limit)}; set HCCC_MAX_RUN_BYTES to "
                            "change it")


def plans_memory_bytes(plans, ranks=None) -> int:
    """Bytes of the size-independent memory of ``ranks`` (default: every rank) of the
    :class:`RankPlan` list ``plans``: control blocks, the FIFO slots each rank receives on, and the
    FIFOs of sends nobody receives (what :class:`RankMemory` allocates)."""
    received = {(q.rank, peer, ch) for q in plans for peer, ch in q.recv_conns}
    total = 0
    for r in (range(len(plans)) if ranks is None else ranks):
        p = plans[r]
        orphans = sum(1 for peer, ch in p.send_conns if (peer, p.rank, ch) not in received)
        total += p.ctrl_bytes + p.slots_bytes + orphans * p.orphan_bytes
    return total


class FifoMemoryError(PlatformError):
    """FIFOs and control blocks over :func:`run_memory_limit`: ``need`` and ``limit`` in bytes."""

    def __init__(self, message: str, need: int, limit: int):
        super().__init__(message)
        self.need, self.limit = int(need), int(limit)


def check_fifo_memory(name: str, plans, ranks=None) -> None:
    """Refuse (before allocating or building anything) FIFOs and control blocks that would not fit
    :func:`run_memory_limit` (``--channels`` x the slot a call uses x connections can ask for more
    than the machine has) with :class:`FifoMemoryError`. The single-process Runner sizes its
    slots by the call (at most ``--chunk-size``), a Communicator by its per-connection budget
    (``HCCC_FIFO_BYTES``)."""
    from hccc.util.sizes import human_size as human
    need = plans_memory_bytes(plans, ranks)
    limit = run_memory_limit()
    if need > limit:
        raise FifoMemoryError(f"{name}'s FIFOs need {human(need)} ({len(plans)} ranks' "
                              f"connections x channels x {plans[0].nslots} slots of {plans[0].slot_bytes} "
                              f"bytes), over the limit of {human(limit)}; use a smaller "
                              "--chunk-size or fewer --channels, or set HCCC_MAX_RUN_BYTES to change it",
                              need, limit)


__all__ = ["run_memory_limit", "check_run_memory", "plans_memory_bytes", "FifoMemoryError", "check_fifo_memory"]
