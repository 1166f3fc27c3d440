"""What one run may allocate: its buffers (with the host copies that check them) and its FIFOs and
control blocks, each refused before anything is allocated or built when it would not fit
:func:`run_memory_limit` (``HCCC_MAX_RUN_BYTES``, else half of this machine's physical memory, or
half of the process's address-space limit where that is lower: ``ulimit -v``, as on many HPC login
nodes).

Memory the system still refuses as it is allocated (``mmap`` failing with ENOMEM under that limit,
numpy's ``MemoryError``, a thread whose stack cannot be mapped, a full ``/dev/shm``) is the same
kind of error, not a bug: :class:`OutOfMemoryError`, made by :func:`out_of_memory` (what was being
allocated, how much, the limits that apply), and located by :meth:`OutOfMemoryError.at` with the
program and the size being run.
"""
from __future__ import annotations

from contextlib import contextmanager

from hccc.runtime.platform import PlatformError
from hccc.util.limits import printable


def run_memory_limit() -> int:
    """Bytes of buffers one run may allocate: ``HCCC_MAX_RUN_BYTES`` (K/M/G/T suffixes) or half
    of this machine's physical memory, or of the process's address-space limit where lower."""
    return _run_memory_limit()[0]


def _run_memory_limit() -> tuple[int, str]:
    """:func:`run_memory_limit` and where it comes from, for messages."""
    import os
    from hccc.util.diagnostics import env_size
    try:
        cap = env_size("HCCC_MAX_RUN_BYTES")
    except ValueError as exc:
        raise PlatformError(f"HCCC_MAX_RUN_BYTES must be a positive size such as 16G, not "
                            f"'{printable(str(exc), limit=40)}'") from None
    if cap is not None:
        return cap, "HCCC_MAX_RUN_BYTES"
    try:
        half = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        half = 1 << 34
    limit = address_space_limit()
    if limit is not None and limit // ADDRESS_SPACE_SHARE < half:
        return limit // ADDRESS_SPACE_SHARE, f"1/{ADDRESS_SPACE_SHARE} of this process's address-space limit, ulimit -v"
    return half, "half of this machine's memory"


#: the default run limit is at most 1/N of the process's address-space limit, as it is 1/2 of the
#: physical memory: the rest holds the interpreter, numpy, the compiled kernels, the allocator's
#: arenas and a stack per emulated thread (a policy, not a measurement: a run that still does not
#: fit is refused as it allocates, :class:`OutOfMemoryError`)
ADDRESS_SPACE_SHARE = 2


def address_space_limit() -> int | None:
    """The soft limit on this process's address space (``ulimit -v``, RLIMIT_AS) in bytes, or
    None where there is none."""
    try:
        import resource
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


class OutOfMemoryError(PlatformError):
    """Memory the system refused as it was allocated: ``what`` and ``nbytes`` (None: unknown)."""

    def __init__(self, message: str, what: str, nbytes: int | None, where: str | None = None):
        super().__init__(message)
        self.what, self.nbytes, self.where = what, nbytes, where

    def at(self, where: str) -> "OutOfMemoryError":
        """The same error located: ``where`` (``running ring_8 at 65536 bytes``) said first (an
        error located already keeps its place)."""
        if self.where is not None:
            return self
        return OutOfMemoryError(f"{where}: {self}", self.what, self.nbytes, where)


def out_of_memory(what: str, nbytes: int | None = None, detail: str = "") -> OutOfMemoryError:
    """The error for ``nbytes`` of ``what`` that the system would not allocate, naming the limits
    that apply (the address-space limit, ``HCCC_MAX_RUN_BYTES``) and what to do."""
    from hccc.util.sizes import human_size as human
    size = f" ({human(nbytes)})" if nbytes else ""
    text = f"out of memory: the system refused {what}{size}"
    if detail:
        text += f" ({printable(detail, limit=200)})"
    limit = address_space_limit()
    if limit is not None:
        text += f"; this process's address space is limited to {human(limit)} (ulimit -v)"
    try:
        run_limit = human(run_memory_limit())
    except PlatformError:
        run_limit = "unset"
    return OutOfMemoryError(f"{text}; run smaller sizes or fewer ranks, raise the limit, or set "
                            f"HCCC_MAX_RUN_BYTES (now {run_limit}) below what this process can allocate "
                            "so that such runs are refused before they start", what, nbytes)


def refused_memory(exc: BaseException) -> OutOfMemoryError | None:
    """``exc`` as an :class:`OutOfMemoryError` where it says the system refused memory (numpy's
    ``MemoryError``, an ``OSError`` with ENOMEM, a thread that could not start); None otherwise."""
    import errno
    if isinstance(exc, OutOfMemoryError):
        return exc
    if isinstance(exc, MemoryError):
        return out_of_memory("host memory", None)
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return out_of_memory("memory", None, exc.strerror or str(exc))
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return out_of_memory("a thread", None, str(exc))
    return None


@contextmanager
def out_of_memory_at(where: str):
    """Memory the system refuses inside the block (:func:`refused_memory`) raised as a located
    :class:`OutOfMemoryError`: ``where`` (``running ring_8 at 65536 bytes``) said first."""
    try:
        yield
    except (OutOfMemoryError, MemoryError, OSError, RuntimeError) as exc:
        refused = refused_memory(exc)
        if refused is None:
            raise
        raise refused.at(where) from None


def check_run_memory(name: str, nbytes: int, buffer_bytes: int) -> None:
    """Refuse (before allocating anything) a run whose buffers, with the host copies that check
    them (inputs, the oracle's buffers, the results), would not fit :func:`run_memory_limit`."""
    need = 4 * int(buffer_bytes)
    limit, source = _run_memory_limit()
    if need > limit:
        from hccc.util.sizes import human_size as human
        raise PlatformError(f"running {name} at {nbytes} bytes needs about {human(need)} of memory "
                            f"(its buffers, scratch included, are {human(buffer_bytes)}, checked against "
                            f"host copies), over the limit of {human(limit)} ({source}); set "
                            "HCCC_MAX_RUN_BYTES to change it")


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
    limit, source = _run_memory_limit()
    if need > limit:
        raise FifoMemoryError(f"{name}'s FIFOs need {human(need)} ({len(plans)} ranks' "
                              f"connections x channels x {plans[0].nslots} slots of {plans[0].slot_bytes} "
                              f"bytes), over the limit of {human(limit)} ({source}); use a smaller "
                              "--chunk-size or fewer --channels, or set HCCC_MAX_RUN_BYTES to change it",
                              need, limit)


__all__ = ["run_memory_limit", "address_space_limit", "ADDRESS_SPACE_SHARE", "OutOfMemoryError", "out_of_memory",
           "refused_memory", "out_of_memory_at", "check_run_memory", "plans_memory_bytes", "FifoMemoryError", "check_fifo_memory"]
