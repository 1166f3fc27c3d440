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

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import alltoallv as av
from hccc.runtime.call_buffers import as_buf, call_arrays, device_kind, sync_caller
from hccc.util import dtypes as dtypes_table


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


def _end(disp: np.ndarray, row: np.ndarray, r: int, what: str) -> int:
    """Where rank ``r``'s last block of ``row`` at ``disp`` ends (its buffer's least length);
    CountsError naming the block that ends past :data:`~hccc.runtime.alltoallv.MAX_ELEMENTS`
    (compared as ``disp > MAX - count``: no sum wraps)."""
    over = np.flatnonzero(disp > av.MAX_ELEMENTS - row)
    if len(over):
        p = int(over[0])
        blk = f"counts[{r}][{p}]" if what == "send" else f"counts[{p}][{r}]"
        raise av.CountsError(f"the block {'to' if what == 'send' else 'from'} rank {p} ({blk} = {int(row[p])} "
                             f"at element {int(disp[p])}) ends at {int(disp[p]) + int(row[p])}: no {what} "
                             "buffer holds more than 2**62 elements")
    return int((disp + row).max()) if len(row) else 0


def buffer_lengths(counts: np.ndarray, sdispls=None, rdispls=None, send_lens=None, recv_lens=None,
                   inplace: bool = False) -> tuple[list[int], list[int]]:
    """Every rank's send and receive buffer lengths: as given, else just large enough for the
    call's blocks at their displacements (packed where None); in place, one buffer of both."""
    N = len(counts)
    psd, prd = av.packed_displs(counts)
    sdv = psd if sdispls is None else av.as_counts(sdispls, N, "send displacements")
    rdv = prd if rdispls is None else av.as_counts(rdispls, N, "receive displacements")
    need_s = [_end(sdv[r], counts[r], r, "send") for r in range(N)]
    need_r = [_end(rdv[r], counts[:, r], r, "receive") for r in range(N)]
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
    displacements (0: packed) and this rank's block-piece table, the scratch slot's elements, the
    digest the ranks compare and the device pointer to every rank's buffer lengths
    (:data:`hccc.compiler.backend.abi.V_LENS`: the kernels then check the counts against them;
    0: the host checked them)."""
    counts: int
    displs: int
    vmap: int
    slot: int
    digest: int = 0
    lens: int = 0

    def apply(self, args, uses_scratch: bool) -> None:
        """Fill ``args`` (``hccc_args``) with the call's members; ``vslot`` is the scratch slot
        only where the program's pieces go through scratch."""
        args.vcounts, args.vdispls, args.vmap = self.counts, self.displs, self.vmap
        args.vslot = self.slot if uses_scratch else 0
        args.vlens = self.lens


def device_lens(send_lens, recv_lens) -> np.ndarray:
    """``hccc_args::vlens`` (:data:`hccc.compiler.backend.abi.V_LENS`): every rank's send buffer
    length, then every rank's receive buffer length (elements)."""
    return np.array([int(n) for n in send_lens] + [int(n) for n in recv_lens], np.int64)




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


class RankAllToAllv:
    """The AllToAllv calls of one rank of a job (:meth:`Communicator.all_to_all_v
    <hccc.runtime.communicator.Communicator.all_to_all_v>`): rank ``rank`` of ``nranks`` running
    ``ir`` on ``platform``, its arrays put in device memory through ``staging``
    (:class:`Staging`) and its host segments ``hosts``
    (:class:`~hccc.runtime.host_segment.HostSegments`) carrying counts rows. What it asks of its
    rank, passed in: ``run(method, count, dtype, op, in_p, out_p, v)`` (one launch, the call's
    barriers and comparison included), ``fail(why)`` (mark the rank failed; returns the error to
    raise), ``barrier(what)``, ``next_call()`` (the number of the call about to be made) and
    ``remote()`` (whether some peer is on another node). ``error``: the exception type of calls
    the program cannot make."""

    def __init__(self, ir: ProgramIR, rank: int, nranks: int, platform, staging: Staging, hosts, *,
                 run, fail, barrier, next_call, remote, error=RuntimeError):
        self.ir, self.rank, self.nranks, self.platform = ir, int(rank), int(nranks), platform
        self.staging, self.hosts, self.error = staging, hosts, error
        self._run, self._fail, self._barrier = run, fail, barrier
        self._next_call, self._remote = next_call, remote
        self._tables: dict = {}

    def call(self, x, out=None, counts=None, *, sdispls=None, rdispls=None, device_counts: bool = False,
             send_counts=None) -> None:
        """One call (the arguments of :meth:`~hccc.runtime.communicator.Communicator.all_to_all_v`)."""
        method = "all_to_all_v"
        self._check_arguments(method, counts, sdispls, rdispls, device_counts, send_counts)
        if send_counts is not None and not device_counts:
            counts = self.gather_rows(send_counts, method)
        inplace = out is None
        if inplace and True not in self.ir.placements:
            raise self.error(f"{self.ir.name} is proven out of place only; pass out=")
        bx, bo = call_arrays(method, x, out, self.platform.name, same_buffer=inplace)
        if not inplace and bx.overlaps(bo, dtypes_table.dtype(bx.dtype).bytes):
            raise ValueError(f"{method}: input and output overlap; pass out=None for an in-place call")
        vm, tables = self.tables(inplace)
        map_p = self.staging.put(("map", inplace), tables[self.rank], keep=True)
        if device_counts:
            cnt_p = (self.gather_rows_on_device(send_counts, method) if send_counts is not None
                     else self._device_array(counts, self.nranks ** 2, f"{method}: counts", "device counts"))
            # every rank's buffers have this rank's lengths (the digest of the lengths is compared
            # at the call's barrier), and the kernels check every block against them
            lens = device_lens([bx.n] * self.nranks, [bo.n] * self.nranks)
            vcall = VCall(cnt_p, 0, map_p, -(-max(bx.n, bo.n) // vm.k),   # no piece exceeds a buffer
                          counts_digest(lens), self.staging.put("lens", lens))
        else:
            try:           # the peers' buffers are not known here
                hc = HostCounts.check(counts, self.nranks, vm.k, self._only_mine(bx.n), self._only_mine(bo.n),
                                      sdispls, rdispls, inplace)
            except av.CountsError as exc:
                # the peers are told (this rank's state), so they fail at the call's barrier at once
                # instead of waiting for a rank that will not come
                raise self._fail(f"{method} #{self._next_call()}: {exc}") from None
            vcall = VCall(self.staging.put("counts", hc.counts.ravel()),
                          self.staging.put("displs", hc.displs) if hc.given else 0, map_p, hc.slot, hc.digest)
        if self.platform.name != "cpu":
            sync_caller(x)
        self._run(method, av.launch_count(vcall.slot, vm.k, self.nranks), bx.dtype, "sum", bx.ptr, bo.ptr, vcall)

    def _only_mine(self, n: int) -> list:
        return [n if r == self.rank else None for r in range(self.nranks)]

    def _check_arguments(self, method, counts, sdispls, rdispls, device_counts, send_counts) -> None:
        """The combinations of a call's counts arguments, and an AllToAll program."""
        if send_counts is not None:
            if counts is not None:
                raise ValueError(f"{method}: pass counts (the whole matrix) or send_counts (this rank's "
                                 "row), not both")
            if sdispls is not None or rdispls is not None:
                raise ValueError(f"{method}: send_counts takes packed displacements only")
            if not device_counts and (hasattr(send_counts, "__cuda_array_interface__")
                                      or getattr(send_counts, "is_cuda", False)):
                raise ValueError(f"{method}: send_counts lives on the GPU: pass device_counts=True (the rows "
                                 "are gathered on the device), or a host row")
        if not SPECS[self.ir.collective].per_pair_counts:
            raise self.error(f"{self.ir.name} implements {self.ir.collective}, not an AllToAll: "
                             "all_to_all_v needs an AllToAll program")
        if device_counts and (sdispls is not None or rdispls is not None):
            raise ValueError(f"{method}: device counts take packed displacements only")

    def _device_array(self, a, n: int, what: str, name: str) -> int:
        """The address of ``a``, ``n`` int64 elements in the memory the kernels run in."""
        kind = device_kind(self.platform.name)
        b = as_buf(a, what)
        if b.dtype != "int64" or b.n != n or b.device != kind:
            raise ValueError(f"{what.split(':')[0]}: {name} must be {n} int64 elements on "
                             f"{'the host' if kind == 'cpu' else 'the GPU'}, not {b.n} {b.dtype} on {b.device}")
        return b.ptr

    def gather_rows(self, row, method: str) -> np.ndarray:
        """The counts matrix of a call with ``send_counts=row``: every rank posts its row in its
        host segment, stamped with the call's number, and after a barrier reads every peer's
        (:meth:`HostSegments.rows`). A peer whose row is not stamped with this call made another
        call: every rank fails. A row this rank cannot use fails the call here (the peers see the
        failure at the barrier)."""
        call = self._next_call()
        if self._remote():
            raise self.error(f"rank {self.rank}: {method}: send_counts needs every rank on one node "
                             "(the rows travel in the host segments, whose mirrors across nodes "
                             "do not carry them); pass the whole counts matrix")
        try:
            mine = av.as_counts(row, self.nranks, "send_counts", row=True)
        except av.CountsError as exc:
            raise self._fail(f"{method} #{call}: {exc}") from None
        self.hosts.post_row(call, mine)
        self._barrier(f"{method} #{call} (counts rows)")
        c, missing = self.hosts.rows(call, mine)
        if c is None:
            raise self._fail(f"{method} #{call}: rank {missing} did not pass its counts row for this call "
                             "(every rank must pass send_counts=, or every rank the whole matrix)")
        return c

    def gather_rows_on_device(self, row, method: str) -> int:
        """The counts matrix of a call with ``send_counts=row, device_counts=True``, in device
        memory, assembled with no host read of any row: one AllToAllv call of the program itself
        (int64 kernels) that gathers every rank's row into the whole matrix on every rank
        (:func:`gather_rows_counts`: constants every rank knows, uploaded once)."""
        N = self.nranks
        row_p = self._device_array(row, N, f"{method}: send_counts", "device send_counts")
        vm, tables = self.tables(False)
        hc = gather_rows_counts(N, vm.k)
        put = self.staging.put
        vcall = VCall(put("rows counts", hc.counts.ravel(), keep=True), put("rows displs", hc.displs, keep=True),
                      put(("map", False), tables[self.rank], keep=True), hc.slot, hc.digest)
        mat_p = put("rows matrix", np.zeros(N * N, np.int64), keep=True)
        if self.platform.name != "cpu":
            sync_caller(row)
        self._run(f"{method} (gathering the counts rows)", hc.equal, "int64", "sum", row_p, mat_p, vcall)
        return mat_p

    def tables(self, inplace: bool):
        """The program's block-piece tables (:func:`block_tables`), once per placement."""
        from hccc.compiler.ir.vblocks import VBlockError
        if inplace not in self._tables:
            try:
                self._tables[inplace] = block_tables(self.ir, inplace)
            except VBlockError as exc:
                raise self.error(f"{self.ir.name} cannot run as an AllToAllv: {exc}") from None
        return self._tables[inplace]


__all__ = ["block_tables", "counts_digest", "buffer_lengths", "HostCounts", "gather_rows_counts", "VCall",
           "device_lens",
           "Staging", "RankAllToAllv"]
