"""Every allocation of one rank (a :class:`~hccc.runtime.process_rank.ProcessRank`'s, also each rank
of the single-process runner's job): the segments it
exports to its peers (its control block and receive FIFOs, and on the CPU emulation its
flags), the peers' segments it maps, its local memory (orphan FIFOs, connection tables, the error
record, the network proxy's memory), pinned host flags and the scratch buffer that grows with the
calls; the abort flag and error record of its launches; and their release, which leaves the
mappings of a kernel that ignores the abort flag in place.
"""
from __future__ import annotations

import ctypes

from hccc.runtime.kernel_abi import ErrorRecord
from hccc.runtime.rank_memory import LaunchFlags

#: the CPU emulation's shared flags block: the abort flag at 0, the error record at 64
FLAGS_BYTES = 64 + ctypes.sizeof(ErrorRecord)
#: the least scratch allocated (bytes): a call that needs none still passes a valid pointer
_SCRATCH_MIN = 16


class RankAllocations:
    """What rank memory ``pf`` (the rank's Platform object) gave this process, to give back.
    ``in_process``: every peer is a thread of this process (they exchange pointers, not handles)."""

    def __init__(self, pf, in_process: bool = False):
        self.pf = pf
        #: exported segments, imported mappings, local allocations, pinned host flags
        self.segments_own: list[int] = []
        self.imported: list[int] = []
        self.allocs: list[int] = []
        self.host_flag_ptrs: list[int] = []
        #: peer rank -> its abort flag mapped here (CPU emulation: shared memory)
        self.peer_flags: dict[int, int] = {}
        self.scratch: tuple[int, int] | None = None      # (pointer, bytes)
        self.shared_flags = pf.name == "cpu"
        #: with every peer in this process (the CPU emulation's or a GPU's), what the peers reach
        #: is this process's memory, taken by address: nothing exported, named or mapped (peer
        #: memory, :meth:`Platform.malloc_peer`; GPUs of one process reach each other's through
        #: peer access), so that FIFOs can be allocated anew while no kernel runs
        self.private = bool(in_process)
        self.flags_ptr = self.abort = self.error = None

    def exported(self, n: int) -> int:
        """``n`` zeroed bytes the peers map (:meth:`Platform.ipc_malloc`), or reach by address
        (:attr:`private`: :meth:`Platform.malloc_peer`, given back as local memory)."""
        if self.private:
            return self.local(n, peer=True)
        p = self.pf.ipc_malloc(n)
        self.segments_own.append(p)
        return p

    def local(self, n: int, peer: bool = False) -> int:
        """``n`` bytes of this rank's own (``peer``: touched by peers' kernels while it runs)."""
        p = self.pf.malloc_peer(n) if peer else self.pf.malloc(n)
        self.allocs.append(p)
        return p

    def host_flags(self, n: int) -> int:
        """``n`` bytes of pinned, mapped host memory the kernels read while the host writes it
        (:meth:`Platform.host_flags`)."""
        p = self.pf.host_flags(n)
        self.host_flag_ptrs.append(p)
        return p

    def free(self, p: int) -> None:
        """Give back one local allocation now (:meth:`local`), and forget it."""
        self.pf.free(p)
        self.allocs.remove(p)

    def import_segment(self, handle: bytes) -> int:
        """Map a peer's exported segment (:meth:`Platform.ipc_import`)."""
        p = self.pf.ipc_import(handle)
        self.imported.append(p)
        return p

    def launch_flags(self) -> LaunchFlags:
        """The abort flag and error record of this rank's launches: on the CPU emulation in one
        exported block every peer maps (:attr:`flags_ptr`), otherwise the abort flag in pinned,
        mapped host memory of this process and the error record in device memory."""
        if self.shared_flags:
            self.flags_ptr = self.exported(FLAGS_BYTES)
            self.abort, self.error = self.flags_ptr, self.flags_ptr + 64
        else:
            self.abort = self.host_flags(64)
            self.error = self.local(ctypes.sizeof(ErrorRecord))
            self.flags_ptr = None
        return LaunchFlags(self.pf, self.abort, self.error)

    def abort_peers(self) -> None:
        """Raise the peers' abort flags where they are mapped here (CPU emulation: shared
        memory). On CUDA / HIP they are not: every peer's host watch sees this rank's failed state
        in its host segment and raises its own flag."""
        for f in self.peer_flags.values():
            ctypes.c_uint32.from_address(f).value = 1

    def scratch_ptr(self, nbytes: int) -> int:
        """A scratch buffer of at least ``nbytes``, grown (never shrunk) as calls need."""
        if self.scratch is None or self.scratch[1] < nbytes:
            if self.scratch is not None:
                self.pf.free(self.scratch[0])
            self.scratch = (self.pf.malloc(max(nbytes, _SCRATCH_MIN)), max(nbytes, _SCRATCH_MIN))
        return self.scratch[0]

    def release(self, kernel_running: bool) -> None:
        """Give everything back, whatever fails; with ``kernel_running`` (a kernel that ignores the
        abort flag) only the exported segments' names go: the mappings stay with the kernel."""
        if not kernel_running:
            _quietly(self.pf.ipc_close, self.imported)
            _quietly(self.pf.free, self.segments_own + self.allocs + self.host_flag_ptrs
                     + ([self.scratch[0]] if self.scratch else []))
        else:
            _quietly(self.pf.ipc_seal, self.segments_own)
        self.imported, self.segments_own, self.allocs, self.scratch = [], [], [], None
        self.host_flag_ptrs = []


def _quietly(release, items) -> None:
    """``release(item)`` for each item, whatever fails (teardown gives back all it can)."""
    for p in items:
        try:
            release(p)
        except Exception:
            pass


__all__ = ["RankAllocations", "FLAGS_BYTES"]
