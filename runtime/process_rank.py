"""One rank of a job in this process (the :class:`~hccc.runtime.communicator.Communicator` is this
plus its bootstrap and the collective calls): its platform and kernel, the memory it owns
(:class:`~hccc.runtime.rank_memory.RankMemory`, every allocation of it in
:class:`~hccc.runtime.rank_allocations.RankAllocations`), its flags and host segment
(:class:`~hccc.runtime.host_segment.HostSegments`), and one launch of it: the call planned once per
shape through the one per-call recipe (:class:`~hccc.runtime.rank_memory.LaunchCall`), posted and
compared with every peer's at a host barrier, the counters reset, a second barrier (nobody sends
into a FIFO before its receiver has reset it), the launch, and the wait for the kernel while the
host watches its peers (:func:`~hccc.runtime.kernel_wait.wait_for_kernel`): a peer that died, closed
or failed raises this rank's abort flag, a failure of this rank raises every peer's, and every rank
then gets a :class:`CommunicatorError` naming the cause.
"""
from __future__ import annotations

import os

from hccc.compiler.backend.abi import resolve_proto
from hccc.compiler.frontend.collectives import SPECS
from hccc.runtime.alltoallv_call import RankAllToAllv, Staging
from hccc.runtime.host_segment import HostSegments, call_type
from hccc.runtime.kernel_errors import IGNORES_ABORT
from hccc.runtime.kernel_wait import wait_for_kernel
from hccc.runtime.checked_run import ELEMENT_BYTES, program_layout
from hccc.runtime.rank_kernels import fit_block_threads
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.memory_limits import refused_memory
from hccc.runtime.platform import Instance, Platform, PlatformError, get_platform
from hccc.runtime.rank_allocations import RankAllocations
from hccc.runtime.rank_memory import LaunchCall, RankMemory, launch_proto
from hccc.runtime.rank_residency import check_rank_residency

#: the collective each method runs (ProgramIR collective names)
METHODS = {name: spec.method for name, spec in SPECS.items()}
_COLL_CODE = {c: i + 1 for i, c in enumerate(sorted(METHODS))}
#: calls of distinct shapes whose plan (protocol, slice, layout) a communicator keeps: a training
#: job makes a handful of shapes (DDP's buckets, FSDP's shards), each planned once; planning a
#: call (the slice model) took about 0.3 ms of a 4 KiB AllReduce's 8 ms on the CPU emulation
_PLAN_CACHE_MAX = 256


class CommunicatorError(RuntimeError):
    """A collective or the set-up failed (message for the user); the communicator is unusable."""


class ProcessRank:
    """This process's rank of a job: what :class:`~hccc.runtime.communicator.Communicator` sets up
    through its bootstrap (``ir``, ``rank``, ``world_size``, the generated program, the peers'
    host segments) and launches on every collective call; see the module docstring. Made with
    the FIFO protocol asked for (``proto``), how long barriers and calls wait for the peers
    (``timeout_s``) and the kernel's own spin-wait limit (``kernel_timeout_s``); nothing is
    allocated until the set-up calls :meth:`_allocate`."""

    #: the micro-batch slice of the calls: ``"auto"`` (the slice model), or bytes that a job whose
    #: ranks are threads of this process sets on every rank alike for a call
    #: (:meth:`~hccc.runtime.local_job.LocalJob.run`)
    _slice_request: int | str = "auto"
    #: the host's limit on a kernel's run in seconds (its abort flag raised then), or None:
    #: ``timeout_s + 2 * kernel_timeout_s`` (:func:`~hccc.runtime.kernel_wait.wait_for_kernel`)
    watchdog_s: float | None = None

    def __init__(self, proto: str, timeout_s: float, kernel_timeout_s: float):
        self.proto = proto                # ValueError for anything but auto / simple / ll
        #: the FIFO protocol the last call ran ("simple" or "ll"; None before the first call)
        self.last_proto: str | None = None
        #: why the last call's protocol is not the one ``proto`` asked for, or None
        self.proto_note: str | None = None
        #: the micro-batch slice (bytes) of the last call (None before the first call)
        self.last_slice_bytes: int | None = None
        self._closed, self._broken, self._owned_pf = False, None, False
        self._net = self._pf = self._mem = self._hosts = None
        #: the condition the ranks of an in-process job share for their host barriers, or None
        #: (:attr:`~hccc.runtime.bootstrap.Bootstrap.wake`, set by the bootstrap)
        self._wake = None
        #: every peer is a thread of this process (an in-process bootstrap): the handles of this
        #: rank's memory and host segment travel as objects (set by the bootstrap)
        self._in_process = False
        #: what release() gives back (:class:`RankAllocations`; made with the memory)
        self._owned: RankAllocations | None = None
        #: (count, element bytes, protocol asked) -> (LaunchCall, this rank's layout row)
        self._call_plans: dict = {}
        self.timeout_s = float(timeout_s)
        self.kernel_timeout_s = float(kernel_timeout_s)
        #: a word the caller sets before a call that every rank's call must match (0: none): what
        #: the caller was asked for beyond this call's collective, count, dtype and op (the torch
        #: backend's description of the call: AVG and SUM run the same kernel)
        self.call_tag = 0
        #: the kept thread the waits for this rank's kernels synchronize through
        #: (:class:`~hccc.runtime.rank_memory.BackgroundSync`), or None: a thread per wait, which
        #: has ended when the call returns
        self._sync = None
        #: a callable the waits poll (host barriers, the kernel's run): a reason to give up (a peer
        #: that is making another call elsewhere), or None
        self.watch = None

    def _platform(self, backend, device, cache_dir) -> Platform:
        """The Platform object of this rank, its device chosen (:func:`open_rank_platform`)."""
        pf, self._owned_pf, self.device = open_rank_platform(backend, self.rank_platform[self.rank],
                                                             self.rank, device, cache_dir)
        return pf

    def _allocate(self) -> None:
        """What this rank owns (:class:`RankMemory`: the control block and receive FIFOs exported
        to the peers, orphan FIFOs and connection tables local; its table in table mode), its
        flags, its host segment and its stream."""
        pf = self._pf
        self._owned = own = RankAllocations(pf, in_process=self._in_process)
        self._mem = mem = RankMemory(self._plans[self.rank], pf, own.exported, own.local,
                                     lambda n: own.local(n, peer=True))
        self.flags = own.launch_flags()
        if self.codegen == "table":
            try:
                mem.load_table(self._prog.tables([self.rank])[self.rank])
            except PlatformError as exc:
                raise CommunicatorError(f"rank {self.rank}: {exc}") from None
        self._hosts = HostSegments(self.rank, self.world_size, self.timeout_s, wake=self._wake,
                                   in_process=self._in_process)
        self._stream = pf.stream()
        self._vcalls = RankAllToAllv(
            self.ir, self.rank, self.world_size, pf, Staging(pf, own.allocs), self._hosts, run=self._run,
            fail=lambda why: self._fail(why, abort_peers=False), barrier=self._barrier,
            next_call=lambda: self._calls + 1, remote=lambda: bool(self._net is not None and self._net.remote),
            error=CommunicatorError)
        self._calls = self._seq = 0
        #: the FIFOs' reallocations so far (:meth:`_refit`)
        self._refits = 0
        #: why this rank's FIFOs are gone (a reallocation that failed half-way), or None
        self._no_fifos: str | None = None
        #: LL flag epochs of this rank's FIFOs: every rank derives the same from the same calls
        #: (compared per call), so the slots are zeroed only at the first LL call, after Simple
        #: calls and when the epochs wrap (:mod:`hccc.runtime.ll_epoch`)
        self.ll_epochs = LLEpochs()

    def _kernel(self, dtype: str, op: str):
        key = (dtype, op)
        if key not in self._kernels:
            pf, prog = self._pf, self._prog
            ranks, scope = self._library()
            lib = self._build(Instance(dtype, op), ranks, scope)
            fn = self._load(lib).function(prog.kernel_symbol(self.rank, dtype, op))
            if self._auto_threads and self.grid > 0:   # fewer threads per block until the grid fits
                flavour = self.rank_platform[self.rank]
                self.block, note = fit_block_threads(
                    self.block, flavour, lambda b: self.grid <= pf.max_resident_blocks(fn, b),
                    least=pf.least_block_threads(flavour))
                self.threads_note = note or self.threads_note
            if self.grid > 0 and self.grid > pf.max_resident_blocks(fn, self.block):
                raise CommunicatorError(
                    f"rank {self.rank}'s kernel needs {self.grid} thread blocks of {self.block} "
                    f"threads resident at once; at most {pf.max_resident_blocks(fn, self.block)} fit")
            try:   # only some blocks of a rank resident at once: none of its may wait on one not resident
                check_rank_residency(self.ir, pf.launch_residency(), [self.rank])
            except PlatformError as exc:
                raise CommunicatorError(f"rank {self.rank}: {exc}") from None
            self._kernels[key] = fn
        return self._kernels[key]

    def _build(self, inst: Instance, ranks: list[int], scope: dict):
        """The module of ``ranks``' kernels for ``inst`` (:meth:`Platform.build`)."""
        return self._pf.build(self._prog.gendir, self._prog.manifest, inst, ranks=ranks, **scope)

    def _load(self, lib):
        """The module at ``lib`` (a :meth:`_build` path), loaded by this rank's platform."""
        return self._pf.load(lib)

    def _library(self) -> tuple[list[int], dict]:
        """The ranks whose kernels this rank's library holds and its memory scope
        (:meth:`Platform.build`'s keywords): this rank's only, ordered at system scope (its peers
        are other processes)."""
        return [self.rank], {}

    # ------------------------------------------------------------------ failure detection
    def _fail(self, why: str, *, abort_peers: bool = True) -> CommunicatorError:
        """Mark this communicator broken, tell the peers (state and reason; abort flags when they
        may be waiting for this rank's kernel), return the error."""
        self._broken = why
        if self._hosts is not None:
            self._hosts.report_failure(why)
        if abort_peers:
            self._owned.abort_peers()
        return CommunicatorError(f"rank {self.rank}: {why}")

    def _barrier(self, what: str) -> None:
        """Host barrier through the host segments, watching the peers (:meth:`HostSegments.barrier`)."""
        why = self._hosts.barrier(what, self._watching)
        if why:
            raise self._fail(why, abort_peers=False)

    def _watching(self) -> str | None:
        """:attr:`watch`'s reason to give up, asked as it is at each poll (it may be set while a
        call waits), or None."""
        return self.watch() if self.watch is not None else None

    def _check_usable(self) -> None:
        if self._closed:
            raise CommunicatorError("the communicator is closed")
        if self._broken:
            raise CommunicatorError(f"rank {self.rank}: the communicator is unusable after an earlier "
                                    f"failure: {self._broken}")

    def _rejoin(self, seq: int, calls: int) -> None:
        """After a failed call of a job whose ranks are threads of this process, once every rank's
        wait has ended (each rank's kernel stopped): forget the failure and go on from barrier
        ``seq`` and call ``calls``, the most any rank reached, with the LL slots zeroed at the
        next LL call (the failed call may have left anything in them). A kernel that ignores the
        abort flag may still run: that rank stays unusable."""
        if self._closed or (self._broken and IGNORES_ABORT in self._broken) or self._no_fifos:
            raise CommunicatorError(f"rank {self.rank}: cannot run again: "
                                    f"{self._no_fifos or self._broken or 'the communicator is closed'}")
        self._broken = None
        self._hosts.rejoin(seq)
        self._calls = int(calls)
        self.ll_epochs.next, self.ll_epochs.dirty = 0, True

    # ------------------------------------------------------------------ one collective
    def _run(self, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None) -> None:
        """One launch of ``count`` elements (the full buffer), the one per-call recipe
        (:mod:`hccc.runtime.rank_memory`); ``v``: an AllToAllv call's
        :class:`~hccc.runtime.alltoallv_call.VCall` (``count`` is then its equal-size stand-in,
        which sizes slice and protocol). Its steps: :meth:`_begin` (the call compared with the
        peers', the counters reset, the arguments), :meth:`_launch`, :meth:`_wait`."""
        fn, args, call, what = self._begin(method, count, dtype, op, in_p, out_p, v)
        self._launch(fn, args, call, what)
        self._wait(method)

    def _begin(self, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None, *,
               meet_after_reset: bool = True):
        """Everything of :meth:`_run` before the launch: the call planned, posted and compared with
        every peer's at a host barrier, the counters reset, the scratch and the arguments, and the
        second barrier (nobody sends into a stale FIFO; ``meet_after_reset=False`` leaves it to the
        caller, as ranks launched together by one thread meet before that launch). Returns (the kernel, its
        :class:`~hccc.runtime.kernel_abi.Args`, the :class:`LaunchCall`, the call's name)."""
        ir = self.ir
        fn = self._kernel(dtype, op)
        es = ELEMENT_BYTES[dtype]
        call, lay = self._plan(count, es)
        self.last_proto, self.proto_note, self.last_slice_bytes = call.proto, call.note, call.slice_bytes
        epoch, zero = call.launch(self.ll_epochs)
        self._calls += 1
        what = f"{method} #{self._calls}"
        self._hosts.post_call(self._calls, _COLL_CODE[ir.collective], count,
                              call_type(dtype, op, call.proto, epoch, zero), self.call_tag,
                              v.digest if v is not None else 0)
        self._barrier(what)       # every rank finished its previous call
        why = self._hosts.call_mismatch(what)
        if why:
            raise self._fail(why, abort_peers=False)
        self._mem.reset(slots=zero)     # LL: zeroes only when no epoch keeps old lines apart
        if self._net is not None and not self._net.reset(self.timeout_s):
            raise self._fail("the network proxy did not reset its mirrors", abort_peers=False)
        self.flags.clear()
        try:
            scr = self._owned.scratch_ptr((ir.scratch_chunks * v.slot if v is not None else lay[2]) * es)
        except Exception as exc:
            raise self._refused(exc, what) from None
        try:           # every rank makes this call (compared above): every rank refuses it
            call.check(ir)
        except ValueError as exc:
            budget = ""
            if self.chunk_bytes < self.compiled_chunk_bytes:
                budget = (f" (this communicator's FIFO slots hold {self.chunk_bytes} bytes, not the compiled "
                          f"{self.compiled_chunk_bytes}: HCCC_FIFO_BYTES, {self.fifo_bytes} bytes per "
                          "connection, bounds them)")
            raise CommunicatorError(f"rank {self.rank}: {what}: {exc}{budget}") from None
        args = self._mem.args(call, input=in_p, output=out_p, scratch=scr, abort_flag=self.flags.abort,
                              error=self.flags.error, timeout_s=self.kernel_timeout_s, epoch=epoch)
        if v is not None:
            v.apply(args, ir.scratch_chunks > 0)
        if meet_after_reset:
            self._barrier(f"{what} (counters reset)")  # nobody sends into a stale FIFO
        return fn, args, call, what

    def _launch(self, fn, args, call: LaunchCall, what: str) -> None:
        """This rank's kernel launched on its stream with ``args`` (after :meth:`_begin`)."""
        if self._net is not None:
            self._net.shape(self.slot_bytes, self.ir.max_step_chunks, call.slice_bytes)
        if self.grid > 0:
            try:
                # (on this rank's device: a job's ranks may be launched together by one thread)
                self._pf.set_device(self.device)
                self._pf.launch(fn, self.grid, self.block, self._mem.argument(args), self._stream)
            except Exception as exc:
                raise self._refused(exc, what) from None

    def _refused(self, exc: Exception, what: str) -> Exception:
        """Memory or threads the system refused during call ``what`` (:func:`refused_memory`):
        the peers, which may already wait for this rank's kernel, are told and aborted, and the
        error says it is out of memory; any other ``exc`` is returned as it is."""
        refused = refused_memory(exc)
        if refused is None:
            return exc
        return self._fail(f"{what}: {refused}")

    def _plan(self, count: int, es: int):
        """The call's protocol, slice and message bound (the one recipe:
        :meth:`hccc.runtime.rank_memory.LaunchCall.plan`) and this rank's layout row, planned once
        per call shape: every input to them is the shape, the protocol asked for and what the
        communicator fixed when it was made."""
        key = (count, es, self._proto, self._slice_request)
        got = self._call_plans.get(key)
        if got is None:
            got = self._remember(key, (self._plan_call(count, es), self._layout_row(count)))
        return got

    def _plan_call(self, count: int, es: int) -> LaunchCall:
        """The :class:`LaunchCall` of a call of ``count`` elements of ``es`` bytes now."""
        # the FIFOs were exported at set-up with slots of this capacity: every launch keeps it
        return LaunchCall.plan(self.ir, count, es, self.chunk_bytes, proto=self._proto,
                               slice_bytes=self._slice_request, ll_refused=self._ll_refused(), fit_slot=False)

    def _layout(self, count: int) -> list:
        """Every rank's layout row at ``count`` (:func:`~hccc.runtime.launcher.program_layout`)."""
        return program_layout(self.ir, count)

    def _layout_row(self, count: int):
        """This rank's (input, output, scratch elements, input offset, output offset) at ``count``."""
        got = self._call_plans.get(("layout", count))
        return got if got is not None else self._remember(("layout", count), self._layout(count)[self.rank])

    def _remember(self, key, value):
        if len(self._call_plans) >= _PLAN_CACHE_MAX:
            self._call_plans.clear()
        self._call_plans[key] = value
        return value

    @property
    def memory(self) -> RankMemory | None:
        """This rank's :class:`RankMemory` (its plan, its platform and the pointers of its control
        block, FIFOs and connection tables; reports and tests read them), None before set-up."""
        return self._mem

    @property
    def proto(self) -> str:
        """The FIFO protocol asked for: ``"auto"``, ``"simple"`` or ``"ll"`` (see the class)."""
        return self._proto

    @proto.setter
    def proto(self, value: str) -> None:
        resolve_proto(value, 0)           # ValueError for anything else
        self._proto = value

    def _choose_proto(self, nbytes: int) -> str:
        """The FIFO protocol of a call of ``nbytes`` (full buffer) under :attr:`proto`; sets
        :attr:`last_proto` and :attr:`proto_note`. Every rank computes it from the same call and
        the same job, and the call check compares it."""
        proto, note = launch_proto(self.ir, self.proto, nbytes, self.chunk_bytes, self._ll_refused())
        self.last_proto, self.proto_note = proto, note
        return proto

    def _ll_refused(self) -> str | None:
        """Why this job cannot run LL at all, or None."""
        if self._net is None:
            return None
        return ("a job across nodes runs Simple: the network proxy forwards a FIFO slot when its tail "
                "advances, and LL messages post no tail")

    def _wait(self, method: str, pf: Platform | None = None) -> None:
        """Wait for this rank's kernel, watching the peers (:func:`wait_for_kernel`); raise on any
        failure (a kernel that ignores the abort flag leaves the communicator broken). ``pf``: the
        platform that launched it, when not this rank's own (ranks of one process launched as one
        grid by a peer's platform)."""
        got = wait_for_kernel(pf or self._pf, self.flags, self._hosts, self._net, self.ir, call=self._calls,
                              watch=self._watching, timeout_s=self.timeout_s,
                              kernel_timeout_s=self.kernel_timeout_s,
                              abort_peers=self._owned.abort_peers, method=method, sync=self._sync,
                              limit_s=self.watchdog_s)
        if got is None:
            return
        why, kernel_running = got
        if kernel_running:
            self._broken = why
            raise CommunicatorError(f"rank {self.rank}: {method}: {why}")
        raise self._fail(why)

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        pf = self._pf
        if self._net is not None:         # the proxy stops before the memory it reads goes
            self._net.drain(0.5 if self._broken else 2.0)   # the last state reaches the peers
            self._net.close()
            self._net = None
        if self._hosts is not None:
            self._hosts.close()
            self._hosts = None
        kernel_running = bool(self._broken and IGNORES_ABORT in self._broken)
        if self._sync is not None:
            self._sync.close()
        if self._owned is not None:
            self._owned.release(kernel_running)     # then only names go: the mappings stay
        if pf is not None and not kernel_running and self._owned_pf:
            pf.close()

    def close(self) -> None:
        """Release this rank's memory and mappings (peers see the communicator closed)."""
        if self._closed:
            return
        self._closed = True
        if self._hosts is not None and not self._broken:
            self._hosts.mark_closed()
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def open_rank_platform(backend, flavour: str, rank: int, device, cache_dir):
    """The Platform object that runs ``rank`` (manifest platform ``flavour``) on ``backend``, its
    device chosen (``device``, else ``LOCAL_RANK``, else the rank, modulo the devices present):
    (the Platform object, whether it was made here and is closed with the rank, the device)."""
    if isinstance(backend, Platform):
        pf = backend
    elif backend == "cpu":
        from hccc.runtime.cpu import CpuPlatform
        pf = CpuPlatform(source_platform=flavour, cache_dir=cache_dir)
    else:
        pf = get_platform(str(backend))
    if not pf.runs_sources(flavour):
        raise CommunicatorError(f"rank {rank} is a {flavour.upper()} rank; the {pf.name} "
                                "platform cannot run it")
    if device is None:
        lr = os.environ.get("LOCAL_RANK", "")
        device = int(lr) if lr.isdigit() else rank
    device = int(device) % max(1, pf.device_count())
    pf.set_device(device)
    return pf, pf is not backend, device


__all__ = ["ProcessRank", "CommunicatorError", "METHODS"]
