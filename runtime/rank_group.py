"""N ranks of one program in one process (the :class:`~hccc.runtime.launcher.Runner` is this plus
the oracle): the Platform object of every rank (:mod:`hccc.runtime.rank_platforms`), the generated
sources (:class:`~hccc.runtime.generated.GeneratedProgram`), their placement and kernels
(:class:`~hccc.runtime.rank_kernels.RankKernels`), their memory
(:class:`~hccc.runtime.group_memory.GroupMemory`: every rank's :class:`RankMemory`, the flags and
the one-grid argument array), the streams, and one run of them all: each rank's buffers
(:class:`~hccc.runtime.run_buffers.RunBuffers`), its arguments through the one per-call recipe
(:mod:`hccc.runtime.rank_memory`), and the launches between timers under a host watchdog on top of
the kernels' own timeout (:class:`~hccc.runtime.rank_launches.RankLaunches`).

Mixed-vendor programs (HetCCL-SNU's device-code split): every rank has a manifest platform, every
manifest platform present maps to a Platform object, and each Platform object builds one library
from exactly the sources of its ranks and launches them. A rank's buffers, counters, connection
tables and the FIFOs it receives on live in its platform's memory and the senders of the other
platform write into them, so every pair of platforms of one run must share memory.
"""
from __future__ import annotations

from hccc.compiler.frontend.collectives import spec_of
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.direct_peers import direct_receive_count, ll_note, peers_blob, peers_usable
from hccc.runtime.generated import DIRECT_MODES, GeneratedProgram, check_codegen
from hccc.runtime.group_memory import GroupMemory
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.kernel_watch import default_watchdog_s
from hccc.runtime.memory_limits import check_fifo_memory, out_of_memory_at
from hccc.runtime.platform import Platform, PlatformError
from hccc.runtime.rank_kernels import RankKernels
from hccc.runtime.rank_launches import RankLaunches
from hccc.runtime.rank_memory import LaunchCall
from hccc.runtime.rank_platforms import ranks_by_platform, rank_platforms, resolve_platforms
from hccc.runtime.run_buffers import RunBuffers
from hccc.util import dtypes as dtypes_table

#: element types and reduction operators (the one table of them: hccc.util.dtypes)
DTYPES = dtypes_table.DTYPE_NAMES
OPS = dtypes_table.OP_NAMES


class RankGroup:
    """Every rank of ``ir`` in this process, built for ``dtype`` / ``op`` and set up once, launched
    together at any size; see :class:`~hccc.runtime.launcher.Runner` for the arguments and the
    bookkeeping attributes."""

    def __init__(self, ir: ProgramIR, backend="cpu", dtype: str = "float32",
                 op: str = "sum", *, platforms: list[str] | None = None, nthreads: int | None = None,
                 cache_dir=None, timeout_s: float = 10.0, watchdog_s: float | None = None,
                 codegen: str = "specialized", one_grid: bool | None = None, direct: str = "auto",
                 fifo_capacity: int | None = None):
        check_codegen(codegen)
        #: the slot capacity the FIFOs are first allocated with (the largest call a caller will
        #: make, :attr:`LaunchCall.slot_cap`; None: the least); they grow with larger calls
        self._first_capacity = fifo_capacity
        if direct not in DIRECT_MODES:
            raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")
        if spec_of(ir.collective).reduces:
            dtypes_table.check_instance(dtype, op)
        else:
            op = "sum"   # a collective that reduces nothing runs the same kernels under every op
        if nthreads is not None and int(nthreads) < 1:
            raise ValueError("nthreads must be positive")
        self.ir, self.codegen, self.direct, self._one_grid = ir, codegen, direct, one_grid
        self.dtype, self.op = dtype, op
        self.timeout_s = float(timeout_s)
        self.watchdog_s = watchdog_s
        self.table_ptr: list[int] = []
        #: every rank's allocations and the flags' (:class:`~hccc.runtime.rank_allocations.RankAllocations`)
        self._allocations: list = []
        self._owned: list[Platform] = []
        self.launches: RankLaunches | None = None
        self.memory: GroupMemory | None = None
        self._closed = False
        #: why the FIFOs are gone (a reallocation that failed half-way), or None
        self._no_fifos: str | None = None
        #: what the last run's protocol request changed, or None: why LL ran Simple
        #: (:func:`~hccc.runtime.rank_memory.launch_proto`), or that its direct-mode receives went through the FIFO as LL lines
        self.proto_note = None
        self._direct_receives: int | None = None
        try:
            self.rank_platform = rank_platforms(ir.nranks, backend, platforms)
            self.library_ranks = ranks_by_platform(self.rank_platform)
            self.platforms = resolve_platforms(ir, backend, self.library_ranks, self._owned)
            self.rank_pf: list[Platform] = [self.platforms[p] for p in self.rank_platform]
            self.platform = self.rank_pf[0] if ir.nranks else next(iter(self.platforms.values()), None)
            self._setup(nthreads, cache_dir)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _setup(self, nthreads, cache_dir) -> None:
        """Generate (:class:`GeneratedProgram`), place and build (:class:`RankKernels`), allocate."""
        for pf in self.platforms.values():
            if cache_dir is not None and hasattr(pf, "cache_dir"):
                pf.cache_dir = cache_dir
        self.program = prog = GeneratedProgram(self.ir, self.rank_platform, cache_dir, self.codegen, self.direct)
        self.gendir, self.manifest = prog.gendir, prog.manifest
        self.nranks, self.nslots, self.chunk_bytes = prog.nranks, prog.nslots, prog.chunk_bytes
        # the FIFOs start at the least slot the kernels run (one 16-byte share per region) and grow
        # with the calls (fit_fifos): their memory follows the largest call, not the compiled slot
        least = 16 * max(1, int(self.ir.max_step_chunks))
        self.fifo_capacity = min(self.chunk_bytes, max(least, int(self._first_capacity or least)))
        self.rank_plans = self._plans_at(self.fifo_capacity)
        self.slot_bytes = self.rank_plans[0].slot_bytes if self.rank_plans else prog.slot_bytes
        check_fifo_memory(self.ir.name, self.rank_plans)     # the FIFOs fit before anything is built
        self.kernels = k = RankKernels(self.ir, prog, self.platforms, self.rank_platform, self.library_ranks,
                                       self.dtype, self.op, nthreads, self._one_grid)
        # what the launches read, and the bookkeeping of the class docstring
        self._distinct, self.placement, self.single_gpu, self.grid = k.distinct, k.placement, k.single_gpu, k.grid
        self.libraries, self.modules, self.fns, self.rank_library = k.libraries, k.modules, k.fns, k.rank_library
        self.module = self.modules[self.rank_platform[0]] if self.nranks else None
        self.grid_fn, self.block_of, self.blocks, self.block = k.grid_fn, k.block_of, k.blocks, k.block
        #: what was chosen instead of the emitted threads per block, and why (None: as emitted)
        self.threads_note = k.threads_note
        self._allocate()

    def _allocate(self) -> None:
        """The size-independent memory (:class:`GroupMemory`), the streams, the one-grid entry's
        arguments and the launches under the watchdog (:class:`RankLaunches`)."""
        tables = self.program.tables() if self.program.table_mode else None
        with out_of_memory_at(f"allocating {self.ir.name}'s FIFOs and control blocks"):
            self.memory = mem = GroupMemory(self.rank_plans, self.rank_pf, self.placement, self.platform,
                                            self._allocations, tables)
        self._mirror_memory()
        self.flags_pf, self.flags, self.abort_ptr, self.error_ptr = self.platform, mem.flags, *mem.flag_ptrs
        self.streams = []
        for r in range(self.nranks):
            self.rank_pf[r].set_device(self.placement[r])
            self.streams.append(self.rank_pf[r].stream())
        if self.grid_fn is not None:
            mem.alloc_grid_args(self.grid)
        self.launches = RankLaunches(self.ir, self.kernels, self.rank_pf, self._distinct, self.grid,
                                     self.streams, self.flags, self.flags_pf, self.timeout_s)

    def _plans_at(self, capacity: int) -> list:
        """Every rank's plan with slots of ``capacity`` (as ``chunk_bytes``)."""
        step_chunks = self.ir.max_step_chunks    # (computed from the primitives: once, not per plan)
        return [p.with_capacity(capacity, step_chunks) for p in self.program.plans]

    def fit_fifos(self, capacity: int) -> None:
        """Make the FIFOs hold slots of ``capacity`` (a call's :attr:`LaunchCall.slot_cap`, at most
        the compiled ``chunk_bytes``): reallocated larger, before the call's buffers, when the
        call needs more than they hold (checked against the run's memory limit first,
        :func:`~hccc.runtime.memory_limits.check_fifo_memory`); never shrunk."""
        capacity = min(int(capacity), self.chunk_bytes)
        if capacity <= self.fifo_capacity:
            return
        plans = self._plans_at(capacity)
        check_fifo_memory(self.ir.name, plans)
        try:
            with out_of_memory_at(f"reallocating {self.ir.name}'s FIFOs for slots of {capacity} bytes"):
                self.memory.refit(plans)
        except BaseException as exc:
            self._no_fifos = f"reallocating its FIFOs for slots of {capacity} bytes failed: {exc}"
            raise
        self.fifo_capacity, self.rank_plans, self.slot_bytes = capacity, plans, plans[0].slot_bytes
        self._mirror_memory()

    def _mirror_memory(self) -> None:
        """The attributes that name the memory's pointers (tests and reports read them)."""
        mem = self.memory
        self.rank_mem, self.ll_epochs, self.orphans = mem.rank_mem, mem.ll_epochs, mem.orphans
        self.table_ptr, self.ctrl, self.ctrl_bytes = mem.table_ptr, mem.ctrl, mem.ctrl_bytes
        self.prog_ptr, self.slots_ptr, self.send_tab, self.recv_tab = (mem.prog_ptr, mem.slots_ptr,
                                                                       mem.send_tab, mem.recv_tab)

    @property
    def _broken(self) -> str | None:
        """Why kernels of an earlier run still run (:attr:`RankLaunches.broken`), or None."""
        return self.launches.broken if self.launches is not None else None

    def default_watchdog(self, nbytes: int) -> float:
        """The host-side limit on a launch at ``nbytes`` when none is given
        (:func:`~hccc.runtime.kernel_watch.default_watchdog_s`)."""
        return default_watchdog_s(self.timeout_s, nbytes, self.nranks)

    # ------------------------------------------------------------------ one run of every rank
    def _execute(self, call: LaunchCall, lay, inplace: bool, dev_inputs, *, timeout_s, blocks,
                 warmup: int, iters: int, verify=None, checks: int = 1, keep: bool = False,
                 out_lens=None, vcall=None):
        """One run's launches of ``call``: allocate each rank's buffers (``lay``: layout rows,
        :func:`~hccc.runtime.launcher.program_layout`), fill every rank's arguments
        (``vcall(rank, stage)``: an AllToAllv call's :class:`~hccc.runtime.alltoallv_call.VCall`
        of the rank and whether its pieces use scratch, ``stage(array)`` putting an array in the
        rank's memory for this run), launch ``warmup + iters`` times, then read the outputs
        (``out_lens``: elements per rank, default the layout's) when asked to ``keep`` them or
        ``verify(outputs)`` them, the latter after ``checks`` launches each. Returns (times in us,
        why the last launch stuck or None, the first outputs read or None, the verdicts). The
        buffers are freed before it returns; kernels are stopped before that on any error."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        out_lens = [row[1] for row in lay] if out_lens is None else out_lens
        self.proto_note = call.note
        self.fit_fifos(call.slot_cap)
        bufs, outs, verdicts = RunBuffers(self.rank_pf, self.placement, self.dtype), None, []
        try:
            bufs.alloc(lay, inplace, call.element_bytes)
            argv = [m.args(call, input=bufs[r][0], output=bufs[r][1], scratch=bufs[r][2],
                           abort_flag=self.abort_ptr, error=self.error_ptr, timeout_s=timeout)
                    for r, m in enumerate(self.rank_mem)]
            if vcall is not None:
                for r, a in enumerate(argv):
                    v, uses_scratch = vcall(r, lambda h, r=r: bufs.stage(r, h))
                    v.apply(a, uses_scratch)
            self._direct(call, argv, bufs)
            limit = self.watchdog_s if self.watchdog_s is not None else self.default_watchdog(
                call.count * call.element_bytes)

            def launch():
                return self._launch_once(call, argv, bufs, lay, dev_inputs, blocks, limit)

            times, stuck = self.launches.timed(launch, warmup, iters)
            if stuck is None and (verify is not None or keep):
                outs = bufs.outputs(out_lens)
                if verify is not None:
                    verdicts.append(verify(outs))
                    for _ in range(checks - 1):     # nccl-tests' -c N: N checked launches
                        _, stuck = launch()
                        if stuck is not None:
                            break
                        verdicts.append(verify(bufs.outputs(out_lens)))
        except BaseException:
            # Ctrl-C (or any error) while kernels may still run: they stop before the buffers
            # they use are freed below
            self.stop_kernels()
            raise
        finally:
            self._free_buffers(bufs)
        return times, stuck, outs, verdicts

    def _direct(self, call: LaunchCall, argv: list, bufs: list) -> None:
        """Direct mode for a Simple launch: every rank's ``peers`` is the array of all ranks'
        ``hccc_args`` in its own memory, freed with the run's buffers, where the ranks share an
        address space (:mod:`hccc.runtime.direct_peers`); under LL every message goes through the
        FIFO as lines, which :attr:`proto_note` says."""
        if not self._peers_usable():
            return
        if call.proto != "ll":
            blob = peers_blob(argv)
            for r, a in enumerate(argv):
                a.peers = bufs.stage(r, blob)
        elif self.proto_note is None and self.direct_receives():
            self.proto_note = ll_note(self.ir.name, self.direct_receives())

    def _peers_usable(self) -> bool:
        """Whether :meth:`_direct` gives the ranks a peers array (direct mode can run)."""
        return peers_usable(self.rank_pf, self.placement)

    def direct_receives(self) -> int:
        """Receives of the program its kernels run in direct mode when the launch has a peers
        array (:func:`~hccc.runtime.direct_peers.direct_receive_count`)."""
        if self._direct_receives is None:
            self._direct_receives = direct_receive_count(self.ir, self.rank_platform, self.direct)
        return self._direct_receives

    def _free_buffers(self, bufs: RunBuffers) -> None:
        """Free one run's buffers unless the runner is broken (kernels may still use them); a
        Ctrl-C waits until done."""
        with deferred_interrupts():
            if not self._broken:
                bufs.free()

    def _check_usable(self) -> None:
        if self._closed:
            raise PlatformError("runner is closed")
        if self._no_fifos:
            raise PlatformError(f"runner is unusable: {self._no_fifos}")
        if self._broken:
            raise PlatformError(f"the {self.launches.names()} platform is unusable after an earlier "
                                f"run: {self._broken}")

    def _launch_once(self, call, argv, bufs, lay, dev_inputs, blocks, limit: float):
        """One launch of every rank from fresh inputs: (timers, why it stuck or None)."""
        zero, args, grid_arg = self.memory.arguments(call, argv)
        self.memory.prepare(bufs, lay, dev_inputs, ll=zero)
        timers = self.launches.launch_all(args, blocks, limit, grid_arg)
        stuck = self.launches.wait(limit)
        return timers, stuck if stuck is not None else self.launches.error_message()

    def stop_kernels(self) -> None:
        """Stop every kernel this runner launched before anything they use is freed (an interrupt
        or an error left them running; :meth:`RankLaunches.stop`). Kernels still running after the
        grace time mark the runner broken, and a broken runner never frees their memory."""
        if self.launches is not None:
            self.launches.stop()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self._closed:
            return
        with deferred_interrupts():
            self._release_all()

    def _release_all(self) -> None:
        self._closed = True
        if self._broken:
            return  # kernels may still use the memory: leave it
        for owned in self._allocations:
            owned.release(kernel_running=False)
        self._allocations.clear()
        for pf in self._owned:
            pf.close()
        self._owned.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["RankGroup"]
