"""One AllToAllv call, for either launcher: what the single-process
:meth:`~hccc.runtime.launcher.Runner.run_v` and the one-rank
:meth:`~hccc.runtime.communicator.Communicator.all_to_all_v` both work out before a launch.

* the program's block-piece tables (:func:`block_tables`, :mod:`hccc.compiler.ir.vblocks`);
* the call's counts checked against the buffers (:func:`hccc.runtime.alltoallv.check_call`), the
  scratch slot (the largest block piece) and the equal-size stand-in that sizes the call's slice
  and protocol (:func:`hccc.runtime.alltoallv.equal_count`);
* the 64-bit digest of counts and displacements every rank of a job compares (:func:`counts_digest`);
* the ``hccc_args`` members of the call (:class:`VCall`: ``vcounts``, ``vdispls``, ``vmap``,
  ``vslot``), filled the same way by both launchers.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import alltoallv as av


def block_tables(ir: ProgramIR, inplace: bool):
    """(block-piece map, one int32 table per rank) of ``ir`` run as an AllToAllv in or out of
    place (:func:`hccc.compiler.ir.vblocks.vblock_map` on the program as generated: canonical);
    VBlockError when it cannot run with per-pair counts."""
    from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
    from hccc.compiler.ir.vblocks import rank_tables, vblock_map
    cir = ir if _is_canonical(ir) else _sorted_copy(ir)
    vm = vblock_map(cir, bool(inplace))
    return vm, rank_tables(cir, vm)


def counts_digest(counts: np.ndarray, displs: np.ndarray | None = None) -> int:
    """The odd 64-bit digest of a call's counts (and device displacements, when the call passes
    them) every rank compares at the call's barrier; 0 is kept for "not known on the host"."""
    blob = np.ascontiguousarray(counts, np.int64).tobytes()
    if displs is not None:
        blob += np.ascontiguousarray(displs, np.int64).tobytes()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") | 1


def buffer_lengths(counts: np.ndarray, sdispls=None, rdispls=None, send_lens=None, recv_lens=None,
                   inplace: bool = False) -> tuple[list[int], list[int]]:
    """Every rank's send and receive buffer lengths: as given, else just large enough for the
    call's blocks at their displacements (packed where None); in place, one buffer of both."""
    N = len(counts)
    psd, prd = av.packed_displs(counts)
    sdv = psd if sdispls is None else av.as_counts(sdispls, N, "send displacements")
    rdv = prd if rdispls is None else av.as_counts(rdispls, N, "receive displacements")
    need_s = [int((sdv[r] + counts[r]).max()) for r in range(N)]
    need_r = [int((rdv[r] + counts[:, r]).max()) for r in range(N)]
    if inplace:
        need_s = need_r = [max(a, b) for a, b in zip(need_s, need_r)]
    send = [int(n) for n in send_lens] if send_lens is not None else need_s
    recv = [int(n) for n in recv_lens] if recv_lens is not None else need_r
    return send, (send if inplace else recv)


@dataclass(frozen=True)
class HostCounts:
    """A call whose counts the host knows: the ``nranks x nranks`` matrix, the displacements
    (packed where the call gave none), whether the kernels get them (``given``), the scratch slot
    and the equal-size stand-in count of a program cutting blocks into ``k`` pieces."""
    counts: np.ndarray
    sd: np.ndarray
    rd: np.ndarray
    given: bool
    slot: int
    equal: int

    @classmethod
    def check(cls, counts, nranks: int, k: int, send_lens, recv_lens, sdispls=None, rdispls=None,
              inplace: bool = False, pass_displs: bool | None = None) -> "HostCounts":
        """The call checked (CountsError naming the entry): ``send_lens[r]`` / ``recv_lens[r]``
        are rank ``r``'s buffer lengths, None where this process does not know them."""
        c = av.as_counts(counts, nranks)
        sd, rd = av.check_call(c, send_lens, recv_lens, sdispls, rdispls, inplace)
        given = pass_displs if pass_displs is not None else (sdispls is not None or rdispls is not None)
        return cls(c, sd, rd, bool(given), av.scratch_slot(c, k), av.equal_count(c, k))

    @property
    def displs(self) -> np.ndarray | None:
        """``hccc_args::vdispls`` of the call, or None (the kernels take packed displacements)."""
        return av.device_displs(self.sd, self.rd) if self.given else None

    @property
    def digest(self) -> int:
        return counts_digest(self.counts, self.displs)


def gather_rows_counts(nranks: int, k: int) -> HostCounts:
    """The AllToAllv that gathers every rank's counts row into the whole matrix on every rank:
    block ``(s, d)`` is rank ``s``'s whole row of ``nranks`` counts (every send displacement 0:
    all blocks read the one row), received packed, so rank ``d``'s output is row ``s`` at
    ``s * nranks``. Its counts and displacements are constants every rank knows."""
    N = int(nranks)
    full = np.full((N, N), N, np.int64)
    sd = np.zeros((N, N), np.int64)
    _, rd = av.packed_displs(full)
    return HostCounts.check(full, N, k, [N] * N, [N * N] * N, sd, rd)


@dataclass(frozen=True)
class VCall:
    """An AllToAllv launch's ``hccc_args`` members: device pointers to the counts, the
    displacements (0: packed) and this rank's block-piece table, the scratch slot's elements and
    the digest the ranks compare (0: device counts, not known on the host)."""
    counts: int
    displs: int
    vmap: int
    slot: int
    digest: int = 0

    def apply(self, args, uses_scratch: bool) -> None:
        """Fill ``args`` (``hccc_args``) with the call's members; ``vslot`` is the scratch slot
        only where the program's pieces go through scratch."""
        args.vcounts, args.vdispls, args.vmap = self.counts, self.displs, self.vmap
        args.vslot = self.slot if uses_scratch else 0




class Staging:
    """Arrays a one-rank launcher keeps in its rank's memory for AllToAllv calls, one buffer per
    key (the counts, the displacements, the block-piece table, ...): grown as a call needs, or
    with ``keep`` uploaded once. Allocations are appended to ``allocs`` (the owner frees them)."""

    def __init__(self, platform, allocs: list):
        self.platform, self.allocs = platform, allocs
        self._bufs: dict = {}

    def put(self, key, data: np.ndarray, keep: bool = False) -> int:
        """``data`` in the buffer kept for ``key``; its device address."""
        data = np.ascontiguousarray(data)
        have = self._bufs.get(key)
        if have is not None and keep:
            return have[0]
        if have is None or have[1] < data.nbytes:
            if have is not None:
                self.allocs.remove(have[0])
                self.platform.free(have[0])
            size = max(data.nbytes, 16)
            have = self._bufs[key] = (self.platform.malloc(size), size)
            self.allocs.append(have[0])
        if data.nbytes:
            self.platform.memcpy_htod(have[0], data)
        return have[0]


__all__ = ["block_tables", "counts_digest", "buffer_lengths", "HostCounts", "gather_rows_counts", "VCall",
           "Staging"]
