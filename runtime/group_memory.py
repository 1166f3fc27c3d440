"""The size-independent memory of a :class:`~hccc.runtime.rank_group.RankGroup`: every rank's
:class:`~hccc.runtime.rank_memory.RankMemory` (the FIFO slots it receives on and its control block
in memory its peers reach, its connection tables, its table in table mode), the LL flag epochs of
those FIFOs, the abort flag and error record every rank's kernels share, and the one-grid entry's
argument array; and what each launch writes into it: the counters and flags zeroed, the ranks'
packed arguments (:meth:`GroupMemory.arguments`). Every allocation is held by a
:class:`~hccc.runtime.rank_allocations.RankAllocations`, one per rank (as a one-rank-per-process
Communicator holds its own) and one for the flags, in the list the group releases when it closes.
"""
from __future__ import annotations

import ctypes

import numpy as np

from hccc.compiler.backend import abi
from hccc.runtime.kernel_abi import Args, ErrorRecord, TableArgs, grid_first
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.rank_allocations import RankAllocations
from hccc.runtime.rank_memory import LaunchFlags, RankMemory, grid_argument
from hccc.runtime.run_buffers import RunBuffers


class GroupMemory:
    """Allocate the memory of ``plans`` (one rank plan per rank) on ``rank_pf`` (each rank's
    Platform object) at ``placement`` (each rank's device); ``platform`` holds the flags,
    ``allocations`` receives the :class:`RankAllocations` of every rank, then the flags' (the
    caller releases them, also when this constructor fails half-way), ``tables`` (table mode) each
    rank's table, None otherwise. The same :class:`RankMemory` code allocates a
    one-rank-per-process Communicator's."""

    def __init__(self, plans, rank_pf: list, placement, platform, allocations: list, tables=None):
        self.rank_pf, self.placement, self.platform = rank_pf, placement, platform
        N = len(plans)
        #: each rank's allocations, and the flags'
        self.owned = [RankAllocations(pf) for pf in rank_pf[:N]]
        self.flags_owned = RankAllocations(platform)
        allocations.extend(self.owned + [self.flags_owned])
        self._tables = tables
        self._rank_memories(plans)
        # the abort flag: pinned, mapped host memory; the error record: rank 0's memory (every
        # rank's kernels reach it; the first to time out claims it with a CAS)
        self.abort_ptr = self.flags_owned.host_flags(64)
        platform.set_device(self.placement[0] if N else 0)
        self.error_ptr = self.flags_owned.local(ctypes.sizeof(ErrorRecord))
        self.flags = LaunchFlags(platform, self.abort_ptr, self.error_ptr)
        #: (abort flag, error record)
        self.flag_ptrs = (self.abort_ptr, self.error_ptr)
        self.grid_args_ptr = self.grid_first_ptr = None

    def _rank_memories(self, plans) -> None:
        """Every rank's :class:`RankMemory` of ``plans``, connected (and its table loaded in table
        mode), with fresh LL epochs, and the lists of its pointers."""
        N = len(plans)
        self.plans = list(plans)
        self.rank_mem = [RankMemory(plans[r], self.rank_pf[r], lambda n, r=r: self.malloc(r, n, peer=True),
                                    lambda n, r=r: self.malloc(r, n))
                         for r in range(N)]
        # one GPU: one Platform object and one device index (CPU-emulated platforms of one run are
        # distinct objects: their ranks are taken as on other GPUs)
        gpus = [(id(self.rank_pf[r]), int(self.placement[r])) for r in range(N)]
        for m in self.rank_mem:
            m.connect(plans, lambda peer: (self.rank_mem[peer].ctrl, self.rank_mem[peer].slots), gpus)
        #: LL flag epochs of these FIFOs (:mod:`hccc.runtime.ll_epoch`)
        self.ll_epochs = LLEpochs()
        self.ctrl = [m.ctrl for m in self.rank_mem]
        self.ctrl_bytes = [m.plan.ctrl_bytes for m in self.rank_mem]
        self.prog_ptr = [m.progress for m in self.rank_mem]
        self.slots_ptr = [m.slots for m in self.rank_mem]
        self.send_tab = [m.send_tab for m in self.rank_mem]
        self.recv_tab = [m.recv_tab for m in self.rank_mem]
        #: sends nobody receives: (rank, FIFO, header bytes), the FIFO in the sender's memory
        self.orphans = [(r, f, abi.ORPHAN_HEADER) for r, m in enumerate(self.rank_mem) for f in m.orphans]
        self.table_ptr: list[int] = []
        if self._tables is not None:
            self.table_ptr = [self.rank_mem[r].load_table(self._tables[r]) for r in range(N)]

    def refit(self, plans) -> None:
        """Replace every rank's memory by that of ``plans`` (FIFOs of another slot size; no kernel
        runs): the old blocks, orphan FIFOs, connection tables and tables are freed first."""
        for r, m in enumerate(self.rank_mem):
            for ptr in m.allocations:
                self.owned[r].free(ptr)
        epochs, self.rank_mem = self.ll_epochs, []
        self._rank_memories(plans)
        # the epochs go on (what was counted stays counted); the new slots hold no LL lines yet
        epochs.dirty, self.ll_epochs = True, epochs

    def malloc(self, rank: int, nbytes: int, *, peer: bool = False) -> int:
        """Memory on ``rank``'s platform and device (kept until the group closes); ``peer``: memory
        other ranks' kernels touch while running (:meth:`Platform.malloc_peer`)."""
        self.rank_pf[rank].set_device(self.placement[rank])
        return self.owned[rank].local(int(nbytes), peer=peer)

    def alloc_grid_args(self, grid) -> None:
        """The one-grid entry's memory: every rank's kernel argument in one device array (filled
        per launch); the table mode's entry also reads the first block of each rank from device
        memory (``grid``: the thread blocks of each rank)."""
        N = len(self.rank_mem)
        self.grid_args_ptr = self.malloc(0, N * ctypes.sizeof(TableArgs if self.table_ptr else Args))
        if self.table_ptr:
            first = grid_first(grid)
            self.grid_first_ptr = self.malloc(0, len(first))
            self.rank_pf[0].memcpy_htod(self.grid_first_ptr, np.frombuffer(first, np.uint8))

    def arguments(self, call, argv):
        """One launch's arguments: every launch of an LL run gets the next flag epoch (its
        arguments change with it); the packed ``hccc_args`` of every rank and, for the one-grid
        entry (:meth:`alloc_grid_args` made its array), its argument over them in device memory.
        Returns (whether the LL slots are zeroed, the ranks' packed arguments, the grid argument
        or None)."""
        epoch, zero = call.launch(self.ll_epochs)
        for a in argv:
            a.ll_epoch = epoch
        args = [m.argument(a) for m, a in zip(self.rank_mem, argv)]
        grid_arg = None
        if self.grid_args_ptr is not None:
            self.rank_pf[0].memcpy_htod(self.grid_args_ptr, np.frombuffer(b"".join(args), np.uint8))
            grid_arg = grid_argument(self.grid_args_ptr, len(argv),
                                     self.grid_first_ptr if self.table_ptr else None)
        return zero, args, grid_arg

    def prepare(self, bufs: RunBuffers, lay, dev_inputs, ll: bool = False) -> None:
        """Zero counters, flags and the error record (and, with ``ll``, the FIFO slots: an LL
        launch that :class:`~hccc.runtime.ll_epoch.LLEpochs` says must zero); outputs and scratch
        to garbage and inputs in (:meth:`RunBuffers.fill`)."""
        for m in self.rank_mem:
            m.reset(slots=ll)
        self.flags.clear()
        bufs.fill(lay, dev_inputs)


__all__ = ["GroupMemory"]
