"""The ranks of one job as threads of this process: one
:class:`~hccc.runtime.communicator.Communicator` per rank (its
:class:`~hccc.runtime.process_rank.ProcessRank`: kernel, memory, launch, wait, failure handling,
exactly the path a job of one rank per process takes), brought together through the in-process
bootstrap (:func:`~hccc.runtime.bootstrap.local_bootstraps`) instead of a torch.distributed store.

:class:`LocalJob` makes the communicators together (a rank whose set-up fails ends every peer's at
once, with its reason) and runs a step on every rank together (:meth:`LocalJob.each`, one thread
per rank); :meth:`LocalJob.collective` is one call of the program's collective on every rank's
array, the outputs returned in rank order for the caller's oracle, and :meth:`LocalJob.run` one
call on the oracle's inputs compared with it as the single-process runner compares
(:mod:`hccc.runtime.oracle`), a :class:`~hccc.runtime.launcher.RunResult`. The ranks take every
step of a job's set-up, barriers, calls and failure handling; only the handles travel in-process:
what a rank's peers reach of it (control block, FIFOs, flags, host segment) is this process's
memory, exchanged as objects and pointers through the bootstrap (:meth:`~hccc.runtime.bootstrap.
Bootstrap.exchange`), with nothing exported, named in ``/dev/shm`` or mapped (GPUs of one process
reach each other's peer memory by peer access). A call's arrays are the caller's host arrays: on a
GPU platform each rank's are copied through its device memory (:func:`rank_arrays`).

A call may also be launched together, as the single-process runner launches (:class:`GroupLaunch`):
each rank's thread takes its call through the job's steps up to the launch
(:meth:`~hccc.runtime.process_rank.ProcessRank._begin`: compared with the peers, counters reset,
arguments), one thread then launches every rank's kernel between one timer per rank's platform
(with direct mode's peers array, :mod:`hccc.runtime.direct_peers`, where asked), or the one-grid
entry once (every rank's argument in one array, rank 0's platform launching all their blocks so that
they are resident together, from a library of every rank, :class:`GridEntry`), and each rank waits
for its kernel watching its peers (:meth:`~hccc.runtime.process_rank.ProcessRank._wait`).
"""
from __future__ import annotations

import ctypes
import queue
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from hccc.compiler.frontend.collectives import SPECS
from hccc.runtime import alltoallv as av, oracle, shm
from hccc.runtime.alltoallv_call import buffer_lengths
from hccc.runtime.bootstrap import local_bootstraps
from hccc.runtime.call_buffers import Bfloat16Bits, DeviceArray, as_buf, device_kind
from hccc.runtime.communicator import Communicator, CommunicatorError, METHODS
from hccc.runtime.direct_peers import direct_receive_count, ll_note, peers_blob, peers_usable
from hccc.runtime.generated import DIRECT_MODES, GeneratedProgram
from hccc.runtime.gpu import grid_symbol
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.memory_limits import check_fifo_memory, check_run_memory
from hccc.runtime.kernel_abi import Args, grid_first
from hccc.runtime.kernel_watch import default_watchdog_s
from hccc.compiler.backend.abi import NSLOTS
from hccc.runtime.kernel_errors import IGNORES_ABORT, WATCHDOG, describe_stuck
from hccc.runtime.checked_run import (ELEMENT_BYTES, RunResult, alltoallv_buffers, call_count, check_placement,
                                     program_layout, run_inputs)
from hccc.runtime.platform import Instance, Platform, PlatformError, get_platform
from hccc.runtime.rank_residency import check_grid_residency, check_rank_residency
from hccc.runtime.rank_kernels import check_resident_together, fit_block_threads
from hccc.runtime.process_rank import _PLAN_CACHE_MAX
from hccc.runtime.rank_platforms import check_backend, rank_platforms, ranks_by_platform, resolve_platforms
from hccc.runtime.rank_memory import BackgroundSync, LaunchCall, grid_argument


class ThreadRank(Communicator):
    """A rank of a :class:`LocalJob`: its library holds every rank of its manifest platform,
    built once (the build cache's turn) and loaded by each rank, with the one-grid entry; on the
    CPU emulation, where every rank of the process runs on the one host, its memory is ordered
    at device scope, as the single-process runner's (system scope made hm_allreduce_4x8's 1 MiB
    launch ten times slower there). Its waits for its kernels synchronize through one thread kept
    for the job's life (:class:`~hccc.runtime.rank_memory.BackgroundSync`), not one per call. The
    ranks read the generated sources once (``programs``: the job's :class:`SharedPrograms`), and
    on the CPU emulation the ranks of one manifest platform run on one Platform object of the job,
    which loads their library once (as the single-process runner's ranks share theirs)."""

    def __init__(self, *args, programs: "SharedPrograms | None" = None, platforms: list[str] | None = None,
                 **kwargs):
        self._programs = programs
        #: the manifest platform of every rank where the caller names them (a mixed-vendor
        #: ProgramIR), else None: the compiled OUTDIR's, or the backend's own
        self._platforms_given = platforms
        super().__init__(*args, **kwargs)

    def _setup(self, ir, plats, *args, **kwargs):
        given = self._platforms_given
        if given is not None and plats is not None and list(plats) != list(given):
            raise CommunicatorError(f"the rank platforms given ({', '.join(given)}) are not "
                                    f"the compiled OUTDIR's ({', '.join(plats)})")
        return super()._setup(ir, plats if given is None else list(given), *args, **kwargs)

    def _generated(self, ir, cache_dir, codegen: str):
        if self._programs is None:
            return super()._generated(ir, cache_dir, codegen)
        return self._programs.get(ir, self.rank_platform, cache_dir, codegen)

    def _platform(self, backend, device, cache_dir):
        if self._programs is None or not (isinstance(backend, str) and backend == "cpu"):
            return super()._platform(backend, device, cache_dir)
        shared = self._programs.platform(self.rank_platform[self.rank], cache_dir)
        return super()._platform(shared, device, cache_dir)

    #: the job grows its ranks' FIFOs with its calls (:attr:`LocalJob.grow_fifos`): a call is
    #: planned through the compiled slot, as the single-process runner plans it
    grows = False

    def _plan_call(self, count: int, es: int):
        if self._programs is None:
            return super()._plan_call(count, es)
        key = ("call", count, es, self._proto, self._slice_request, self.chunk_bytes, self._ll_refused(), self.grows)
        return self._programs.memo(key, lambda: job_call(
            self.ir, count, es, self._proto, self._slice_request, self.compiled_chunk_bytes if self.grows else None,
            self.chunk_bytes, self._ll_refused()))

    def _layout(self, count: int) -> list:
        if self._programs is None:
            return super()._layout(count)
        return self._programs.memo(("layout", count), lambda: super(ThreadRank, self)._layout(count))

    def _load(self, lib):
        if self._programs is None:
            return super()._load(lib)
        return self._programs.loaded(self._pf, lib)

    def _build(self, inst, ranks, scope):
        ident = self._pf.build_identity()
        if self._programs is None or ident is None:
            return super()._build(inst, ranks, scope)
        key = (ident, id(self._prog), inst, tuple(ranks), tuple(sorted(scope.items())))
        return self._programs.module(key, self._prog, lambda: super(ThreadRank, self)._build(inst, ranks, scope))

    #: the launch together this rank's current call takes part in (:class:`GroupLaunch`), or
    #: None: the rank launches its own kernel
    group: "GroupLaunch | None" = None

    def _run(self, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None) -> None:
        if self.group is None:
            return super()._run(method, count, dtype, op, in_p, out_p, v)
        self.group.run(self.rank, method, count, dtype, op, in_p, out_p, v)

    def _allocate(self) -> None:
        super()._allocate()
        self._sync = BackgroundSync(f"hccc-rank-{self.rank}-wait")

    def _library(self) -> tuple[list[int], dict]:
        mine = self.rank_platform[self.rank]
        ranks = [r for r, p in enumerate(self.rank_platform) if p == mine]
        return ranks, ({"single_gpu": True} if self._pf.name == "cpu" else {})


def job_call(ir, count: int, es: int, proto: str, slice_bytes, compiled: int | None, capacity: int,
             ll_refused: str | None = None) -> LaunchCall:
    """The :class:`LaunchCall` of a job's call of ``count`` elements of ``es`` bytes. Where the
    FIFOs grow with the calls (``compiled``: the compiled slot; :attr:`LocalJob.grow_fifos`), it
    is the single-process runner's recipe: protocol, slice and slot capacity chosen through the
    compiled slot, whatever the FIFOs hold now, so that a call runs alike whatever calls came
    before it (an MSCCL import keeps its one micro-batch per chunk); the FIFOs were grown to its
    :attr:`~LaunchCall.slot_cap` first. A call the FIFOs were not grown for (a rank's own method
    called directly), and every call where they cannot grow (``compiled`` None), goes through
    the slots the FIFOs hold now (``capacity``), as a rank of its own process does."""
    if compiled is not None:
        call = LaunchCall.plan(ir, count, es, compiled, proto=proto, slice_bytes=slice_bytes, ll_refused=ll_refused)
        if call.slot_cap <= capacity:
            return call
    return LaunchCall.plan(ir, count, es, capacity, proto=proto, slice_bytes=slice_bytes, ll_refused=ll_refused,
                           fit_slot=False)


class LocalJob:
    """The ``ir.nranks`` ranks of ``ir`` (a ProgramIR) as communicators in threads of this
    process; ``timeout_s`` bounds the set-up and every call as for a Communicator, ``watchdog_s``
    each kernel's run (:attr:`~hccc.runtime.process_rank.ProcessRank.watchdog_s`), ``platforms``
    the manifest platform ("cuda" or "hip") of every rank of a mixed-vendor ProgramIR (as the
    single-process runner takes them: on the CPU emulation the ranks of each platform share one
    CpuPlatform of the job; default: a compiled OUTDIR's, else the backend's own), ``direct`` the
    sources' direct mode (``"auto"``: the receives proven safe written by their senders, ``"off"``:
    every primitive through the FIFO; as the single-process runner's), and every other
    keyword (``backend``, ``dtype``, ``op``, ``proto``, ``kernel_timeout_s``, ``codegen``,
    ``fifo_bytes``, ...) is given to each rank's :class:`Communicator`. Raises
    :class:`CommunicatorError` naming each rank's failure when a set-up fails (a failure every rank
    met alike once, as the ranks raised it: :func:`_setup_error`); nothing stays
    allocated then."""

    def __init__(self, ir, *, timeout_s: float = 60.0, watchdog_s: float | None = None,
                 platforms: list[str] | None = None, direct: str = "auto", fifo_capacity: int | None = None,
                 **communicator_options):
        if direct not in DIRECT_MODES:
            raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
        self.ir, self.nranks = ir, int(ir.nranks)
        backend = communicator_options.get("backend", "cpu")
        if platforms is not None or not isinstance(backend, str):
            # ValueError naming the rank, before any rank is made; a Platform object's or a dict's
            # own platform by default, as the single-process runner takes them
            platforms = rank_platforms(self.nranks, backend, platforms)
        if fifo_capacity is not None:
            if communicator_options.get("fifo_bytes") is not None:
                raise ValueError("give fifo_capacity or fifo_bytes, not both")
            # FIFOs of at most that capacity at set-up (NSLOTS slots each), grown to it below
            communicator_options["fifo_bytes"] = NSLOTS * max(1, int(fifo_capacity))
        #: the element type the ranks' kernels are built for at set-up (others on first use)
        self.dtype = str(communicator_options.get("dtype", "float32"))
        #: the time of the last call launched together (:meth:`collective`), in microseconds
        self.last_time_us: float | None = None
        #: what the last :meth:`run` / :meth:`run_v`'s protocol request changed, or None: why LL ran
        #: Simple (:func:`~hccc.runtime.rank_memory.launch_proto`), or that its direct-mode receives
        #: went through the FIFO as LL lines (:func:`~hccc.runtime.direct_peers.ll_note`), as the
        #: single-process runner says it
        self.proto_note: str | None = None
        #: (dtype, op) -> the one-grid entry (:class:`GridEntry`), built on first use
        self._grids: dict = {}
        #: one thread per rank that runs every call's step of that rank (:class:`RankThreads`),
        #: ended on close or when the job is collected unclosed
        self._threads = RankThreads(self.nranks)
        weakref.finalize(self, self._threads.close)
        shm.reap_stale()     # once for the job (its ranks name no segments of their own)
        boots = local_bootstraps(self.nranks, timeout_s=timeout_s)
        programs = self._programs = SharedPrograms(direct)
        #: the ranks' communicators, in rank order
        self.comms: list[ThreadRank] = []
        #: the platforms this job made for a backend given per manifest platform (closed with it)
        self._made_platforms: list = []
        try:
            per_rank = self._rank_backends(backend, platforms, communicator_options.get("cache_dir"))
            flavours = platforms or rank_platforms(self.nranks, backend, None)
            self._check_residency_waits(per_rank, flavours, communicator_options.get("cache_dir"))
            devices = (None if communicator_options.get("device") is not None
                       else self._placement(per_rank, flavours, communicator_options.get("cache_dir")))
        except BaseException:
            self.close()
            raise

        def make(r):
            options = dict(communicator_options, backend=per_rank[r])
            if devices is not None and devices[r] is not None:
                options["device"] = devices[r]
            return ThreadRank(ir, bootstrap=boots[r], timeout_s=timeout_s, programs=programs,
                              platforms=platforms, **options)
        made = _together(self.nranks, make, threads=self._threads)
        self.comms = [c for c, _ in made if c is not None]
        errors = [e for _, e in made]
        if any(e is not None for e in errors):
            self.close()
            raise _setup_error(errors)
        #: the host-side limit on each kernel's run; None: :meth:`run` sets one from the call's
        #: size (:meth:`default_watchdog`), a rank's own calls take its default
        self.watchdog_s = watchdog_s
        for c in self.comms:
            c.watchdog_s = watchdog_s
        #: :meth:`run` grows the FIFOs to what each call needs (:meth:`fit_fifos`) where they can
        #: grow: every rank's memory taken by address (every rank a thread of this process)
        self.grow_fifos = all(c._owned.private for c in self.comms)
        for c in self.comms:
            c.grows = self.grow_fifos
        try:
            self._enable_peer_access()
        except BaseException:
            self.close()
            raise
        #: why the ranks run fewer threads per block than emitted (or None: as emitted), the
        #: first rank's that says so
        self.threads_note = next((c.threads_note for c in self.comms if c.threads_note), None)
        try:
            self._fit_together(communicator_options.get("nthreads") is None, self.dtype,
                               str(communicator_options.get("op", "sum")))
        except BaseException:
            self.close()
            raise
        if fifo_capacity is not None and self.grow_fifos:
            try:
                self.fit_fifos(fifo_capacity)
            except BaseException:
                self.close()
                raise

    def _check_residency_waits(self, per_rank: list, flavours: list[str], cache_dir) -> None:
        """Where a platform keeps only some blocks of a launch resident at once (the CPU
        emulation's partial-residency mode, :meth:`Platform.launch_residency`), the ranks it runs
        must have no wait that a block not yet resident could leave unmet: refused once, for all
        of them, before any rank is made (:func:`~hccc.runtime.rank_residency.check_rank_residency`,
        as the single-process runner refuses them; PlatformError naming the waits)."""
        groups: dict = {}
        for r, b in enumerate(per_rank):
            pf = (self._programs.platform(flavours[r], cache_dir) if isinstance(b, str) and b == "cpu"
                  else b if isinstance(b, Platform) else None)
            if pf is not None:
                groups.setdefault(id(pf), (pf, []))[1].append(r)
        for pf, ranks in groups.values():
            check_rank_residency(self.ir, pf.launch_residency(), ranks)

    def _placement(self, per_rank: list, flavours: list[str], cache_dir) -> list:
        """The device of every rank where its Platform object is known before the ranks are made
        (a Platform object, the job's CPU emulation, a registered backend): each Platform object
        places the ranks it runs (:meth:`Platform.placement`: on GPUs contiguous blocks of ranks
        per device), as the single-process runner places them; None for a rank to choose its own
        (``LOCAL_RANK``, else its rank)."""
        pfs = []
        for r, b in enumerate(per_rank):
            if isinstance(b, Platform):
                pfs.append(b)
            elif isinstance(b, str) and b == "cpu":
                pfs.append(self._programs.platform(flavours[r], cache_dir))
            else:
                try:
                    pfs.append(get_platform(str(b)))
                except PlatformError:      # (the rank's own set-up says why)
                    pfs.append(None)
        devices: list = [None] * self.nranks
        groups: dict = {}
        for r, pf in enumerate(pfs):
            if pf is not None:
                groups.setdefault(id(pf), (pf, []))[1].append(r)
        for pf, ranks in groups.values():
            for r, d in zip(ranks, pf.placement(len(ranks))):
                devices[r] = int(d)
        return devices

    def _enable_peer_access(self) -> None:
        """GPU ranks of this process reach each other's memory by pointer (their FIFOs live in the
        receiver's memory): where the ranks of one platform kind sit on several devices, every
        one of those devices may write the others' (:meth:`Platform.enable_peer_access`, as the
        single-process runner enables it; PlatformError naming the pair that cannot), before any
        call. Nothing to do on the CPU emulation or on one device."""
        kinds: dict[str, list] = {}
        for c in self.comms:
            kinds.setdefault(c._pf.name, []).append(c)
        for cs in kinds.values():
            devices = sorted({int(c.device) for c in cs})
            if len(devices) > 1:
                cs[0]._pf.enable_peer_access(devices)

    def _together_on(self) -> list[list]:
        """The ranks (with blocks to launch) that share a device of one Platform object: their
        kernels run at once there."""
        groups: dict = {}
        for c in self.comms:
            if c.grid > 0:
                groups.setdefault((id(c._pf), c.device), []).append(c)
        return list(groups.values())

    def _fit_together(self, auto: bool, dtype: str, op: str, block: int | None = None) -> None:
        """Every block of the ranks on one device of one platform resident at once, as the
        single-process runner requires of its ranks (each rank's set-up checked its own only):
        with ``auto`` threads (no ``nthreads`` given) the ranks there go down to the most threads
        per block for which they all fit (:func:`~hccc.runtime.rank_kernels.fit_block_threads`,
        :attr:`threads_note` says so); else, or when nothing fits, PlatformError naming what the
        ranks need (:func:`~hccc.runtime.rank_kernels.check_resident_together`). ``block``: the
        threads per block of a run that gives them, checked only."""
        op = op if SPECS[self.ir.collective].reduces else "sum"
        for cs in self._together_on():
            pf, need = cs[0]._pf, sum(c.grid for c in cs)
            fns = [c._kernel(dtype, op) for c in cs]

            def cap(b: int) -> int:
                return min(pf.max_resident_blocks(fn, b) for fn in fns)
            b = max(c.block for c in cs) if block is None else int(block)
            if auto and block is None and need > cap(b):
                flavour = cs[0].rank_platform[cs[0].rank]
                least = pf.least_block_threads(flavour)
                fit, note = fit_block_threads(b, flavour, lambda t: need <= cap(t), least=least)
                if note is not None:
                    for c in cs:
                        c.block = fit
                    b, self.threads_note = fit, note
                else:          # nothing fits: refused at the fewest threads tried
                    while b // 2 >= least:
                        b //= 2
            check_resident_together(self.ir.name, pf, cs[0].device, len(cs), need, b, cap(b))

    def _rank_backends(self, backend, platforms, cache_dir) -> list:
        """What each rank's communicator runs on: the backend as given (a Platform object, or
        ``"cpu"``: each rank's platform's shared CPU emulation), or for a GPU backend's name or a
        dict from manifest platform to a name or a Platform object (the single-process runner's
        form) the rank's platform's entry, each name made once for the job (``"cpu"``: the job's shared
        CPU emulation of those sources) and every pair of platforms checked to share memory
        (:func:`~hccc.runtime.rank_platforms.resolve_platforms`: a sender writes the receiver's
        FIFOs), PlatformError otherwise, before any rank is made."""
        platforms = platforms or rank_platforms(self.nranks, backend, None)
        if not isinstance(backend, dict):
            # a backend that cannot run some ranks' sources: refused once, naming them, before any rank
            check_backend(self.ir, backend, ranks_by_platform(platforms))
            if not (isinstance(backend, str) and backend != "cpu"):
                return [backend] * self.nranks
            # a GPU backend by name: one Platform object of the job for all its ranks, as one
            # process has one runtime (ranks sharing a device are then fitted together by it)
            backend = {p: backend for p in ranks_by_platform(platforms)}
        groups = ranks_by_platform(platforms)
        spec = {p: v for p, v in backend.items()}
        for p, v in spec.items():
            if isinstance(v, str) and v == "cpu" and p in groups:
                spec[p] = self._programs.platform(p, cache_dir)
        pfs = resolve_platforms(self.ir, spec, groups, self._made_platforms)
        return [pfs[p] for p in platforms]

    def each(self, step) -> list:
        """``step(rank, communicator)`` on every rank at once, one thread each; the results in rank
        order, or :class:`CommunicatorError` naming every rank that raised (a failed call leaves
        every communicator unusable, as in separate processes). A rank whose step raises tells its
        peers at once (:meth:`_failed_in_step`): they do not wait out their timeout for it."""
        def one(r: int):
            try:
                return step(r, self.comms[r])
            except BaseException as exc:
                self._failed_in_step(r, exc)
                raise
        try:
            got = _together(self.nranks, one, self._interrupt, self._threads)
        finally:
            # every rank's step has ended: a peer that gave up is failed (recover() runs the job
            # again), one that met no barrier (all ranks refused the call alike) is as it was
            for c in self.comms:
                if getattr(c.watch, "step_failure", False):
                    c.watch = None
        errors = [e for _, e in got]
        if any(e is not None for e in errors):
            raise _job_error(errors, "in a call")
        return [x for x, _ in got]

    def collective(self, inputs: list, count: int, op: str = "sum", *, together: bool = False,
                   direct: bool = False, one_grid: bool = False, inplace: bool = False,
                   bfloat16: bool = False) -> list[np.ndarray]:
        """One call of the program's collective at ``count`` elements of full buffer (nccl-tests'
        S), ``inputs[r]`` rank ``r``'s array (copied; out of place, into an output of the
        program's layout at that count): every rank's output, in rank order. ``together``: the
        ranks' kernels launched by one thread (:class:`GroupLaunch`; the call's time in
        :attr:`last_time_us`), with ``direct`` direct mode's peers array for a Simple call and with
        ``one_grid`` as one launch of the one-grid entry (:class:`GridEntry`). ``inplace``: each
        rank's input placed in its output where the program's layout overlays them (or its output
        in its input), the collective's in-place form (ValueError where the program is not proven
        in place or its buffers do not overlay, :func:`~hccc.runtime.launcher.check_placement`).
        ``bfloat16``: the arrays hold bfloat16 bit patterns (uint16, as the device holds them:
        :func:`hccc.runtime.oracle.to_device`), handed to the ranks as such
        (:class:`~hccc.runtime.call_buffers.Bfloat16Bits`: numpy has no bfloat16), the outputs
        returned as bit patterns too."""
        if len(inputs) != self.nranks:
            raise ValueError(f"expected {self.nranks} input arrays, got {len(inputs)}")
        if (direct or one_grid) and not together:
            raise ValueError("direct mode's peers array and the one-grid launch need the ranks launched together")
        spec, method = SPECS[self.ir.collective], METHODS[self.ir.collective]
        rows = self._programs.memo(("layout", int(count)), lambda: program_layout(self.ir, int(count)))
        if inplace:
            check_placement(self.ir, True, rows)
        kwargs = {"op": op} if spec.reduces else {}
        dtype = "bfloat16" if bfloat16 else as_buf(np.asarray(inputs[0]), f"{method}: input").dtype
        # outputs start as garbage (a NaN, the most negative integer), so an element never written shows up
        garbage = oracle.GARBAGE[dtype]

        def step(r, comm):
            x, out = _call_buffers(np.asarray(inputs[r]), rows[r], garbage, inplace)
            with rank_arrays(comm, [x, out], dtype) as (kx, kout):
                getattr(comm, method)(kx, out=kout, **kwargs)
            return np.array(out, copy=True)
        return self._each_call(step, together, direct, self._grid_entry(dtype, op) if one_grid else None)

    def _each_call(self, step, together: bool, direct: bool = False, grid: "GridEntry | None" = None) -> list:
        """:meth:`each` of ``step(rank, communicator)``, one call of every rank; ``together``: their
        kernels launched by one thread (:class:`GroupLaunch`, with ``direct`` mode's peers array,
        as the ``grid`` launch), the call's time in :attr:`last_time_us`."""
        if not together:
            return self.each(step)
        group = GroupLaunch(self.comms, direct, grid)
        try:
            got = self.each(lambda r, comm: group.call(r, lambda: step(r, comm)))
            #: the last call launched together: microseconds from its launch to its last kernel's end
            self.last_time_us = group.time_us()
            return got
        finally:
            group.free()

    def _failed_in_step(self, rank: int, exc: BaseException) -> None:
        """Rank ``rank``'s step raised ``exc`` (before its call reached its peers, or in it): every
        other rank's host barriers and waits give up at once with the reason
        (:attr:`~hccc.runtime.process_rank.ProcessRank.watch`; :meth:`recover` clears it), as a
        rank of another process that fails is seen gone by its peers."""
        said = str(exc) or type(exc).__name__
        said = said[len(f"rank {rank}: "):] if said.startswith(f"rank {rank}: ") else said
        why = f"rank {rank} failed ({said})"      # (as a host barrier says a peer's failure)

        def watch() -> str:
            return why
        watch.step_failure = True
        for c in self.comms:
            if c.rank != rank and c.watch is None:
                c.watch = watch

    def _interrupt(self) -> None:
        """Ctrl-C during a call: every rank gives up at once (its host barrier or the wait for its
        kernel polls the reason, :attr:`~hccc.runtime.process_rank.ProcessRank.watch`) and its
        kernel is aborted; the call fails on every rank (:meth:`recover` runs the job again)."""
        for c in self.comms:
            c.watch = lambda: "interrupted (Ctrl-C)"
            c.flags.raise_abort()

    def _why_stuck(self, exc: CommunicatorError) -> str:
        """A failed run's ``stuck``: where the ranks' own kernels stuck, each rank's error record
        once (:func:`~hccc.runtime.kernel_errors.describe_stuck`, as the single-process runner
        says it), in rank order; where no kernel recorded one (a watchdog, a refused call), the
        job's error. A rank whose kernel the host watchdog aborted says that first, in the words
        the runner says it (:func:`~hccc.runtime.kernel_errors.watchdog_aborted`)."""
        for c in self.comms:
            at = (c._broken or "").find(WATCHDOG)
            if at >= 0:
                return c._broken[at:]
        said = []
        for c in self.comms:
            try:
                rec = c.flags.record()
            except Exception:         # (a rank whose memory is gone says nothing more)
                continue
            if rec.valid:
                said.append(describe_stuck(c.ir, rec, c._pf.ticks_per_us))
        return "; ".join(dict.fromkeys(said)) if said else str(exc)

    def recover(self) -> None:
        """After a failed call (:meth:`each`, :meth:`collective`): every rank forgets the failure
        and the job runs again, as the single-process runner runs again after a stuck launch
        (:meth:`~hccc.runtime.process_rank.ProcessRank._rejoin`; every rank's wait has ended when
        the call returns). :class:`CommunicatorError` where a rank's kernel ignores the abort flag."""
        seq = max(c._hosts._seq for c in self.comms)
        calls = max(c._calls for c in self.comms)
        for c in self.comms:
            c.watch = None
            c._rejoin(seq, calls)

    def run(self, count: int | None = None, *, nbytes: int | None = None, dtype: str = "float32",
            op: str = "sum", seed: int = 0,
            together: bool = True, direct: bool = False, one_grid: bool | None = False, warmup: int = 0,
            iters: int = 1, inplace: bool = False, proto: str | None = None,
            slice_bytes: int | str = "auto", checks: int = 1, keep_outputs: bool = True,
            nthreads: int | None = None, timeout_s: float | None = None, inputs: list | None = None,
            check: bool = True) -> RunResult:
        """``warmup + iters`` calls at ``count`` elements of full buffer, each on the oracle's
        inputs (:func:`hccc.runtime.oracle.make_inputs`, from ``seed``; or the caller's ``inputs``,
        one array per rank laid out as the runner takes them, checked against the program's layout:
        :func:`~hccc.runtime.launcher.run_inputs`) into garbage outputs
        (``inplace``: the collective's in-place form, as :meth:`collective` places it), launched as
        :meth:`collective` launches (the mean time of the timed ones when launched together), the
        last compared as the single-process runner compares (:func:`hccc.runtime.oracle.compare`),
        then ``checks - 1`` more calls on the same inputs, each compared (nccl-tests' ``-c N``:
        ``wrong`` sums them): a :class:`RunResult` whose ``stuck`` says why a call failed (where
        each rank's kernel stuck, :meth:`_why_stuck`, else the job's error; the job then runs
        again, :meth:`recover`, as the runner stays usable after a stuck launch) and whose ``outputs`` are every rank's (of the first compared call; None without
        ``keep_outputs``). ``proto`` (``"simple"``, ``"ll"``, ``"auto"``; None: the ranks' own)
        and ``slice_bytes`` (``"auto"`` or a fixed micro-batch slice, a positive multiple of 16 of
        at most the slot) hold for these calls only, on every rank alike; ValueError for either
        before any call. So do ``nthreads`` (threads per block; None: each rank's own), refused
        before any call where a rank's blocks would not all be resident at once
        (:meth:`check_threads`), and ``timeout_s`` (the kernels' own spin-wait limit; None: the
        ranks' ``kernel_timeout_s``). The FIFOs first grow to the slots the call needs where
        they hold less (:attr:`grow_fifos`, :meth:`fit_fifos`), as the single-process runner's.
        ``check=False``: nothing compared (``collective_wrong`` -1, no oracle, no further checked
        calls), as the runner's ``run(check=False)``. ``one_grid=None``: the one-grid launch where
        the job can make it (:meth:`grid_usable`), as the runner chooses by default. The size is
        ``count`` elements or ``nbytes`` (exactly one; :func:`~hccc.runtime.launcher.call_count`).
        Without a job-wide :attr:`watchdog_s`, each kernel's run is limited by the call's size
        (:meth:`default_watchdog`)."""
        if iters < 1 or warmup < 0 or checks < 1:
            raise ValueError("iters and checks must be >= 1 and warmup >= 0")
        spec = SPECS[self.ir.collective]
        op = op if spec.reduces else "sum"
        count = call_count(self.ir, dtype, nbytes, count)
        c0 = self.comms[0]
        proto = c0.proto if proto is None else proto
        es, memo = ELEMENT_BYTES[dtype], self._programs.memo
        self._plan_ahead(count, es, proto, slice_bytes)
        if one_grid is None:
            one_grid = together and self.grid_usable(dtype, op)
        if nthreads is not None:
            self.check_threads(int(nthreads), dtype, op, one_grid)
        rows = memo(("layout", count), lambda: program_layout(self.ir, count))
        # the call's buffers within the run's memory limit, and the placement, before any rank makes it
        check_run_memory(self.ir.name, count * es, sum(a + b + c for a, b, c, _, _ in rows) * es)
        check_placement(self.ir, inplace, rows)
        inputs = run_inputs(self.ir, dtype, op, inputs, rows, count, seed)
        device = [oracle.to_device(x, dtype) for x in inputs]
        outs, stuck, times, verdicts = None, None, [], []
        kept = self._set_call_options(proto, slice_bytes, nthreads, timeout_s, count * es)

        def call():
            outs = self.collective(device, count, op, together=together, direct=direct, one_grid=one_grid,
                                   inplace=inplace, bfloat16=dtype == "bfloat16")
            return [oracle.from_device(o, dtype) for o in outs]
        try:
            for it in range(warmup + iters):
                outs = call()
                if together and it >= warmup:
                    times.append(self.last_time_us)
            if check:
                verdicts.append(oracle.compare(self.ir, dtype, op, outs, inputs, inplace))
                for _ in range(checks - 1):
                    verdicts.append(oracle.compare(self.ir, dtype, op, call(), inputs, inplace))
        except CommunicatorError as exc:
            outs, stuck = None, self._why_stuck(exc)
            self.recover()
        finally:
            self._restore_call_options(kept)
        self.proto_note = self._proto_note(together and direct)
        wrong = sum(v[0] for v in verdicts)
        first = next((v[1] for v in verdicts if v[1] is not None), None)
        coll_wrong, used = (verdicts[0][2], verdicts[0][3]) if verdicts else (-1, None)
        return RunResult(bytes=count * ELEMENT_BYTES[dtype], count=count, dtype=dtype, op=op, inplace=bool(inplace),
                         wrong=int(wrong), time_us=float(np.mean(times)) if times else float("nan"),
                         stuck=stuck, first_wrong=first, collective=self.ir.collective,
                         nranks=self.nranks, iters=len(times) if together else 0,
                         collective_wrong=int(coll_wrong), nthreads=c0.block if nthreads is None else int(nthreads),
                         oracle=used, outputs=outs if keep_outputs and stuck is None else None,
                         slice_bytes=int(c0.last_slice_bytes or 0), proto=c0.last_proto or "simple",
                         checks=len(verdicts))

    def _proto_note(self, direct: bool) -> str | None:
        """The last call's :attr:`proto_note`: rank 0's (why LL ran Simple), else, for an LL call
        launched with direct mode's peers array where the ranks can take one, that its direct-mode
        receives went through the FIFO as LL lines."""
        c0 = self.comms[0]
        if c0.proto_note is not None or c0.last_proto != "ll" or not direct:
            return c0.proto_note
        if not peers_usable([c._pf for c in self.comms], [c.device for c in self.comms]):
            return None
        n = self.direct_receives()
        return ll_note(self.ir.name, n) if n else None

    def _plan_ahead(self, count: int, es: int, proto: str, slice_bytes) -> None:
        """Before any rank makes a call of ``count`` elements of ``es`` bytes: the FIFOs grown to
        the slot capacity it is planned with through the compiled slot (where they grow,
        :func:`job_call`; :meth:`fit_fifos` never shrinks), as the single-process runner's, and
        its protocol and slice checked (ValueError), the plan every rank then takes
        (:meth:`ThreadRank._plan_call`'s)."""
        c0, memo = self.comms[0], self._programs.memo
        compiled = c0.compiled_chunk_bytes if self.grow_fifos else None
        if self.grow_fifos:
            self.fit_fifos(memo(("fit", count, es, proto, slice_bytes), lambda: LaunchCall.plan(
                self.ir, count, es, compiled, proto=proto, slice_bytes=slice_bytes)).slot_cap)
        call = memo(("call", count, es, proto, slice_bytes, c0.chunk_bytes, c0._ll_refused(), self.grow_fifos),
                    lambda: job_call(self.ir, count, es, proto, slice_bytes, compiled, c0.chunk_bytes,
                                     c0._ll_refused()))
        call.check(self.ir)        # (a slice that cuts the chunks of an import: refused by every rank)

    def _set_call_options(self, proto: str, slice_bytes, nthreads, timeout_s, nbytes: int) -> list:
        """Every rank's protocol, slice, threads per block (None: its own), kernel spin-wait limit
        (None: its own) and, without a job-wide :attr:`watchdog_s`, watchdog for the calls of one
        run of ``nbytes``; what they were, for :meth:`_restore_call_options`."""
        kept = [(c.proto, c._slice_request, c.block, c.kernel_timeout_s, c.watchdog_s) for c in self.comms]
        for c in self.comms:
            c.proto, c._slice_request = proto, slice_bytes
            c.block = c.block if nthreads is None else int(nthreads)
            c.kernel_timeout_s = c.kernel_timeout_s if timeout_s is None else float(timeout_s)
            if self.watchdog_s is None:
                c.watchdog_s = default_watchdog_s(c.kernel_timeout_s, nbytes, self.nranks)
        return kept

    def _restore_call_options(self, kept: list) -> None:
        for c, (p, sl, b, t, w) in zip(self.comms, kept):
            c.proto, c._slice_request, c.block, c.kernel_timeout_s, c.watchdog_s = p, sl, b, t, w

    def default_watchdog(self, nbytes: int) -> float:
        """The host-side limit on each kernel's run of a call of ``nbytes`` (full buffer) when the
        job has no :attr:`watchdog_s` (:func:`~hccc.runtime.kernel_watch.default_watchdog_s`)."""
        return default_watchdog_s(self.comms[0].kernel_timeout_s, nbytes, self.nranks)

    def layout(self, count: int) -> list:
        """Per rank: (input length, output length, scratch length, input offset in output or -1,
        output offset in input or -1) in elements at ``count``
        (:func:`~hccc.runtime.launcher.program_layout`)."""
        return self._programs.memo(("layout", int(count)), lambda: program_layout(self.ir, int(count)))

    def vblocks(self, inplace: bool = False):
        """The program's block-piece map and per-rank tables for AllToAllv
        (:func:`hccc.runtime.alltoallv_call.block_tables`), computed once per placement (the
        ranks' own); VBlockError when the program cannot run with per-pair counts."""
        return self.comms[0]._vcalls.tables(bool(inplace))

    def direct_receives(self) -> int:
        """Receives of the program its kernels run in direct mode when a launch has a peers array
        (:func:`~hccc.runtime.direct_peers.direct_receive_count`)."""
        c0 = self.comms[0]
        return self._programs.memo(("direct receives",), lambda: direct_receive_count(
            self.ir, c0.rank_platform, self._programs.direct))

    def stop_kernels(self) -> None:
        """Stop every rank's kernel now (its abort flag raised; each rank's wait then reports the
        call failed, :meth:`recover` runs the job again)."""
        for c in self.comms:
            c.flags.raise_abort()

    @property
    def fifo_capacity(self) -> int:
        """The slot capacity the ranks' FIFOs hold now (as ``chunk_bytes``)."""
        return self.comms[0].chunk_bytes

    def fit_fifos(self, capacity: int) -> None:
        """Make every rank's FIFOs hold slots of ``capacity`` (at most the compiled ``chunk_bytes``):
        reallocated larger on every rank together where they hold less
        (:meth:`~hccc.runtime.communicator.Communicator._refit`: the ranks' memory taken by
        address), never shrunk; the memory limit checked first
        (:class:`~hccc.runtime.memory_limits.FifoMemoryError`, nothing changed)."""
        capacity = min(int(capacity), self.comms[0].compiled_chunk_bytes)
        if capacity <= self.fifo_capacity:
            return
        check_fifo_memory(self.ir.name, self.comms[0]._prog.plans_with_capacity(capacity, self.ir.max_step_chunks))
        self.each(lambda r, comm: comm._refit(capacity))

    def _grid_entry(self, dtype: str, op: str) -> "GridEntry":
        """The one-grid entry for ``dtype`` / ``op`` (:class:`GridEntry`), built on first use."""
        key = (dtype, op if SPECS[self.ir.collective].reduces else "sum")
        return self._grids.get(key) or self._grids.setdefault(key, GridEntry(self.comms, *key))

    def grid_usable(self, dtype: str, op: str) -> bool:
        """Whether a call of ``dtype`` / ``op`` can be the one-grid launch (:class:`GridEntry`:
        the specialised kernels of ranks of one platform on one device, with the entry in their
        sources, every block resident at once), as the single-process runner launches by
        default; not where a platform keeps only some blocks of a launch resident and the grid's
        would not all be (the launch is cooperative: a launch per rank instead)."""
        op = op if SPECS[self.ir.collective].reduces else "sum"
        k = self.comms[0]._pf.launch_residency()
        if k is not None and sum(c.grid for c in self.comms) > k:
            return False
        try:
            self._grid_entry(dtype, op)
        except CommunicatorError:
            return False
        return True

    def check_threads(self, block: int, dtype: str, op: str, one_grid: bool = False) -> None:
        """ValueError unless every rank's blocks of ``block`` threads (its kernel for ``dtype`` /
        ``op``) are all resident at once on its platform: they wait on each other (the one-grid
        launch: every rank's blocks together, on rank 0's platform)."""
        if block < 1:
            raise ValueError("nthreads must be positive")
        if one_grid:
            try:
                self._grid_entry(dtype, op)._check_fit(block)
            except CommunicatorError as exc:
                raise ValueError(str(exc)) from None
            return
        for c in self.comms:
            fit = c._pf.max_resident_blocks(c._kernel(dtype, op), block)
            if c.grid > fit:
                raise ValueError(f"rank {c.rank}'s kernel needs {c.grid} thread blocks of {block} threads "
                                 f"resident at once; at most {fit} fit")
        try:                 # and the ranks that share a device, together
            self._fit_together(False, dtype, op, block)
        except PlatformError as exc:
            raise ValueError(str(exc)) from None

    def run_v(self, counts, *, sdispls=None, rdispls=None, send_lens=None, recv_lens=None,
              inplace: bool = False, inputs: list | None = None, seed: int = 0, warmup: int = 0,
              iters: int = 1, keep_outputs: bool = True, dtype: str | None = None,
              pass_displs: bool | None = None, proto: str | None = None, slice_bytes: int | str = "auto",
              timeout_s: float | None = None, together: bool = False, direct: bool = False,
              one_grid: bool | None = False) -> RunResult:
        """The AllToAll program as an AllToAllv (:mod:`hccc.runtime.alltoallv`), as the
        single-process runner's ``run_v`` takes it: ``counts[s][d]`` elements from rank ``s`` to
        rank ``d``, displacements ``sdispls[s][d]`` / ``rdispls[d][s]`` (None: packed), buffers of
        ``send_lens[r]`` / ``recv_lens[r]`` elements (None: just large enough); ``inputs`` (one
        array per rank, of its send buffer's length) or small integers from ``seed``, of ``dtype``
        (default the job's, :attr:`dtype`; bfloat16 inputs hold float32 values, rounded, handed to
        the ranks as bit patterns as :meth:`collective` hands them, the outputs compared
        as float32). ``pass_displs``: the kernels take the displacements from memory (True; packed
        where None are given) or take packed ones (False); None: where displacements are given, as
        the single-process runner's ``run_v``. ``warmup + iters`` calls of every rank's
        :meth:`~hccc.runtime.communicator.Communicator.all_to_all_v` (each rank's counts checked
        by the ranks themselves, compared at the call's barrier), the last one's receive buffers
        compared with :func:`hccc.runtime.alltoallv.expected`; ``together`` (with ``direct`` and
        ``one_grid`` as for :meth:`run`): launched together and timed (``time_us``, the mean of
        the ``iters`` timed calls), else not timed (nan). ``proto``, ``slice_bytes`` and
        ``timeout_s`` hold for these calls only, as for :meth:`run`.
        ValueError (CountsError naming the entry) before any call for counts the buffers cannot
        take; a failed call is the result's ``stuck`` (:meth:`_why_stuck`) and the job runs again
        (:meth:`recover`). The
        FIFOs first grow to what the call needs, as for :meth:`run`: its launch count
        (:func:`~hccc.runtime.alltoallv.launch_count`, the ranks' own)."""
        ir, N = self.ir, self.nranks
        if not SPECS[ir.collective].per_pair_counts:
            raise ValueError(f"{ir.name} is a {ir.collective}: per-pair counts need an AllToAll program")
        if bool(inplace) not in ir.placements:
            raise ValueError(f"{ir.name} is proven {'out of place' if inplace else 'in place'} only")
        if iters < 1 or warmup < 0:
            raise ValueError("iters must be >= 1 and warmup >= 0")
        c = av.as_counts(counts, N)
        send_lens, recv_lens = buffer_lengths(c, sdispls, rdispls, send_lens, recv_lens, inplace)
        sd, rd = av.check_call(c, send_lens, recv_lens, sdispls, rdispls, inplace)
        dtype = self.dtype if dtype is None else dtype
        given = pass_displs if pass_displs is not None else (sdispls is not None or rdispls is not None)
        # the displacements the ranks pass: the checked ones (packed where None), or None (packed)
        s_pass, r_pass = (sd, rd) if given else (None, None)
        es = ELEMENT_BYTES[dtype]
        c0 = self.comms[0]
        proto = c0.proto if proto is None else proto
        k = self.vblocks(inplace)[0].k
        slot = av.scratch_slot(c, k)
        # the call's buffers within the run's memory limit before any of them exists, on the host
        # (inputs, oracle) or the device, as the single-process runner refuses them
        check_run_memory(ir.name, sum(send_lens) * es, (sum(send_lens) + (0 if inplace else sum(recv_lens))
                                                       + N * ir.scratch_chunks * slot) * es)
        self._plan_ahead(av.launch_count(slot, k, N), es, proto, slice_bytes)
        if one_grid is None:
            one_grid = together and self.grid_usable(dtype, "sum")
        inputs, before = alltoallv_buffers(dtype, inputs, send_lens, recv_lens, inplace, seed)
        want = av.expected([np.array(x) for x in inputs], before, c, sd, rd)

        def step(r, comm):
            x = oracle.to_device(inputs[r], dtype).copy()
            out = None if inplace else oracle.to_device(before[r], dtype).copy()
            with rank_arrays(comm, [x, out], dtype) as (kx, kout):
                comm.all_to_all_v(kx, kout, c, sdispls=s_pass, rdispls=r_pass)
            return oracle.from_device(x if inplace else out, dtype)
        grid = self._grid_entry(dtype, "sum") if one_grid else None
        outs, stuck, times = None, None, []
        kept = self._set_call_options(proto, slice_bytes, None, timeout_s, int(c.sum()) * es)
        try:
            for it in range(warmup + iters):
                outs = self._each_call(step, together, direct, grid)
                if together and it >= warmup:
                    times.append(self.last_time_us)
        except CommunicatorError as exc:
            outs, stuck = None, self._why_stuck(exc)
            self.recover()
        finally:
            self._restore_call_options(kept)
        self.proto_note = self._proto_note(together and direct)
        wrong, first = oracle.count_wrong(ir.collective, outs, want) if outs is not None else (0, None)
        per_rank = int(c.sum()) * es // max(N, 1)
        return RunResult(bytes=per_rank, count=per_rank // es, dtype=dtype, op="sum", inplace=bool(inplace),
                         wrong=int(wrong), time_us=float(np.mean(times)) if times else float("nan"), stuck=stuck,
                         first_wrong=first, collective=ir.collective, nranks=N, iters=len(times),
                         collective_wrong=0, nthreads=c0.block, oracle="alltoallv",
                         outputs=outs if keep_outputs else None,
                         slice_bytes=int(c0.last_slice_bytes or 0), proto=c0.last_proto or "simple",
                         checks=1 if outs is not None else 0)

    def close(self) -> None:
        """Close every rank's communicator (together: a peer that closes first is not a failure).
        Where a rank's kernel ignores the abort flag, no rank frees its memory: the ranks reach
        each other's memory as it is (no mapping of their own keeps it), and that kernel may
        still touch any of it."""
        comms, self.comms = self.comms, []
        running = next((c._broken for c in comms if c._broken and IGNORES_ABORT in c._broken), None)
        if running is not None:
            for c in comms:
                c._broken = running
        _together(len(comms), lambda r: comms[r].close(), threads=self._threads)
        self._threads.close()
        if running is None:              # a kernel still running keeps the memory it may touch
            self._programs.close()
            made, self._made_platforms = getattr(self, "_made_platforms", []), []
            for pf in made:
                pf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SharedPrograms:
    """The generated sources a job's ranks read (:class:`~hccc.runtime.generated.GeneratedProgram`,
    read-only once made): made by the first rank to ask for a program, manifest platforms, cache
    and code generation, and given to every rank, instead of each rank hashing the program's
    text and reading the manifest itself; and the modules built from them
    (:meth:`Platform.build`'s paths) for platforms of equal :meth:`~Platform.build_identity`,
    built (or found in the build cache) by the first rank only; and on the CPU emulation one
    :class:`~hccc.runtime.cpu.CpuPlatform` per manifest platform for all the ranks of the job
    (:meth:`platform`, closed with the job: :meth:`close`) with each module it loads loaded once
    (:meth:`loaded`). ``direct``: the direct mode every program is generated with."""

    def __init__(self, direct: str = "auto"):
        #: the direct mode the sources are generated with (:data:`~hccc.runtime.generated.DIRECT_MODES`)
        self.direct = direct
        self._lock = threading.Lock()
        self._made: dict = {}
        self._modules: dict = {}
        #: (manifest platform, cache directory) -> the CpuPlatform of those ranks
        self._platforms: dict = {}
        #: (id of the platform, module path) -> (platform, the module it loaded)
        self._loaded: dict = {}
        #: what every rank of the job's one program computes alike from a call's shape (its
        #: LaunchCall, the layout rows), computed by the first rank to ask (:meth:`memo`)
        self._memo: dict = {}

    def memo(self, key: tuple, make):
        """``make()`` for ``key``, once for the job's ranks (the ranks plan the same calls of the
        one program; at most :data:`~hccc.runtime.process_rank._PLAN_CACHE_MAX` kept, as a
        rank keeps its own): immutable values only."""
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        value = make()               # (outside the lock: a rank that plans blocks no other rank)
        with self._lock:
            if len(self._memo) >= _PLAN_CACHE_MAX:
                self._memo.clear()
            return self._memo.setdefault(key, value)

    def platform(self, flavour: str, cache_dir):
        """The job's CPU emulation of ``flavour`` ("cuda" or "hip") sources, made by the first
        rank to ask."""
        key = (flavour, None if cache_dir is None else str(cache_dir))
        with self._lock:
            pf = self._platforms.get(key)
            if pf is None:
                from hccc.runtime.cpu import CpuPlatform
                pf = self._platforms[key] = CpuPlatform(source_platform=flavour, cache_dir=cache_dir)
            return pf

    def loaded(self, pf, lib):
        """``pf.load(lib)``, once per platform and path."""
        key = (id(pf), str(lib))
        with self._lock:
            got = self._loaded.get(key)
            if got is None or got[0] is not pf:
                got = self._loaded[key] = (pf, pf.load(lib))
            return got[1]

    def close(self) -> None:
        """Close the platforms made here (after every rank has released its memory)."""
        with self._lock:
            pfs, self._platforms, self._loaded = list(self._platforms.values()), {}, {}
        for pf in pfs:
            pf.close()

    def module(self, key: tuple, prog: GeneratedProgram, build):
        """The path ``build()`` returns for ``key`` (a build of ``prog``'s sources), built once
        (a build that raises is not kept: the next rank to ask builds again)."""
        with self._lock:
            got = self._modules.get(key)
            if got is None or got[0] is not prog:
                got = self._modules[key] = (prog, build())
            return got[1]

    def get(self, ir, rank_platform: list[str], cache_dir, codegen: str) -> GeneratedProgram:
        key = (id(ir), tuple(rank_platform), None if cache_dir is None else str(cache_dir), codegen)
        with self._lock:
            got = self._made.get(key)
            if got is None or got[0] is not ir:
                got = self._made[key] = (ir, GeneratedProgram(ir, rank_platform, cache_dir, codegen, self.direct))
            return got[1]


class RankThreads:
    """One thread per rank of a job, started on first use and kept for every call, instead of a
    thread started per rank and call: :meth:`start` hands rank ``r``'s thread one task.
    :meth:`close` ends them."""

    def __init__(self, n: int):
        self.n = int(n)
        self._queues: list[queue.SimpleQueue] = []
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self, r: int, task) -> threading.Thread:
        """Run ``task()`` in rank ``r``'s thread (started now if it is not running; once closed, in
        a thread of the task's own); the thread."""
        if self._closed:
            t = threading.Thread(target=task, name=f"hccc-rank-{r}", daemon=True)
            t.start()
            return t
        while len(self._threads) <= r:
            q: queue.SimpleQueue = queue.SimpleQueue()
            t = threading.Thread(target=_serve, args=(q,), name=f"hccc-rank-{len(self._threads)}", daemon=True)
            t.start()                      # (RuntimeError where the system has no thread to spare)
            self._queues.append(q)
            self._threads.append(t)
        self._queues[r].put(task)
        return self._threads[r]

    def close(self) -> None:
        """End every thread once its task is done."""
        self._closed = True
        for q in self._queues:
            q.put(None)
        self._queues, self._threads = [], []


def _serve(tasks: queue.SimpleQueue) -> None:
    """A :class:`RankThreads` thread: its tasks, one after another, until None (holding none
    between them: a task may hold its job, which must stay collectable)."""
    while (task := tasks.get()) is not None:
        task()
        del task


def _together(n: int, fn, interrupted=None, threads: RankThreads | None = None
              ) -> list[tuple[object, BaseException | None]]:
    """``fn(r)`` for every ``r`` below ``n``, each in its own thread (rank ``r``'s of ``threads``,
    else one started for it), all at once: (result, None) or (None, the exception) per rank. Every
    call is bounded by the communicators' own timeouts, so the threads are waited for without one.
    Ctrl-C meanwhile (or a thread the system refuses): ``interrupted()`` tells the ranks to give
    up, the steps started end (further presses held back), then the KeyboardInterrupt (or the
    refusal) goes on."""
    got: list = [(None, None)] * n
    # each step's end, waited for on an Event: a Thread.join that Ctrl-C interrupts may take the
    # thread for ended while it runs (CPython 3.11's join releases the lock the thread holds)
    ended = [threading.Event() for _ in range(n)]

    def run(r):
        try:
            got[r] = (fn(r), None)
        except BaseException as exc:   # reported per rank, never lost in a thread
            got[r] = (None, exc)
        finally:
            ended[r].set()
    started = []
    try:
        for r in range(n):
            if threads is not None:
                threads.start(r, lambda r=r: run(r))
            else:
                t = threading.Thread(target=run, args=(r,), name=f"hccc-rank-{r}", daemon=True)
                t.start()
            started.append(r)
        for e in ended:
            e.wait()
    except BaseException:    # Ctrl-C, or no thread to spare: the ranks started give up and end
        with deferred_interrupts():
            if interrupted is not None:
                interrupted()
            for r in started:
                ended[r].wait()
        raise
    return got


class GroupLaunch:
    """One call of every rank of ``comms`` (the job's communicators, in rank order) launched by one
    thread (see the module docstring); ``direct``: with direct mode's peers array for a Simple call
    where the ranks share an address space; ``grid``: as one launch of that one-grid entry. Each
    rank's thread runs :meth:`call`."""

    def __init__(self, comms: list, direct: bool = False, grid: "GridEntry | None" = None):
        self.comms, self.direct, self.grid = comms, direct, grid
        self._pending: list = [None] * len(comms)
        self._timers: list = []
        #: (communicator, pointer) of every rank's peers array, freed after the call
        self._staged: list = []
        self.gate = threading.Barrier(len(comms), action=self._launch_all)

    def call(self, rank: int, step) -> object:
        """Rank ``rank``'s part: ``step()``, the rank's call made through its communicator's own
        method (checked and routed as any call), whose launch (:meth:`run`) joins this one; a
        rank that fails before the launch lets its peers go at once."""
        comm = self.comms[rank]
        comm.group = self
        try:
            return step()
        except BaseException:
            self.gate.abort()          # the peers stop waiting for this rank's launch
            raise
        finally:
            comm.group = None

    def run(self, rank: int, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None) -> None:
        """Rank ``rank``'s launch of its call (in place of
        :meth:`~hccc.runtime.process_rank.ProcessRank._run`): taken up to the launch, the launch
        left to the last rank to arrive, then its wait."""
        comm = self.comms[rank]
        # the gate below is the second barrier: no kernel is launched before every rank has reset
        self._pending[rank] = comm._begin(method, count, dtype, op, in_p, out_p, v, meet_after_reset=False)
        try:
            self.gate.wait()
        except BaseException as exc:
            # the launch failed or a peer gave up before it: kernels already launched stop
            comm.flags.raise_abort()
            comm._owned.abort_peers()
            try:
                comm._wait(method, self._launcher(rank))
            except CommunicatorError:
                pass
            why = comm._hosts.peer_problem(watch=comm._watching)
            if isinstance(exc, threading.BrokenBarrierError) and why:
                # a peer failed before the launch: said as the host barrier the gate stands for says it
                raise comm._fail(f"{why} ({self._pending[rank][3]} (counters reset))", abort_peers=False) from None
            raise
        comm._wait(method, self._launcher(rank))

    def _launcher(self, rank: int):
        """The platform that launched ``rank``'s kernel: rank 0's for the one-grid launch."""
        return self.comms[0 if self.grid is not None else rank]._pf

    def _launch_all(self) -> None:
        """Every rank's kernel between the start and the stop of one timer per rank's platform."""
        comms, pending = self.comms, self._pending
        call = pending[0][2]
        if (self.direct and call.proto != "ll"
                and peers_usable([c._pf for c in comms], [c.device for c in comms])):
            blob = peers_blob([p[1] for p in pending])
            for c, p in zip(comms, pending):
                ptr = c._owned.local(max(blob.nbytes, 16))
                self._staged.append((c, ptr))
                c._pf.memcpy_htod(ptr, blob)
                p[1].peers = ptr
        if self.grid is not None:
            self._timers = [comms[0]._pf.timer()]
            arg = self.grid.argument([c._mem.argument(p[1]) for c, p in zip(comms, pending)])
            self._timers[0].start()
            try:
                self.grid.launch(arg)
            finally:
                self._timers[0].stop()
            return
        # one timer per platform object (the ranks of a job may share one: a CPU timer holds back
        # every launch of its platform until it stops)
        self._timers = [pf.timer() for pf in {id(c._pf): c._pf for c in comms}.values()]
        for t in self._timers:
            t.start()
        try:
            for c, (fn, args, call, what) in zip(comms, pending):
                c._launch(fn, args, call, what)
        finally:
            for t in self._timers:
                t.stop()

    def time_us(self) -> float:
        """From the launch to the end of the last rank's kernel, in microseconds."""
        return max((t.elapsed_us() for t in self._timers), default=float("nan"))

    def free(self) -> None:
        """Give back the peers arrays (after every rank's wait)."""
        for c, ptr in self._staged:
            c._owned.free(ptr)
        self._staged = []


class GridEntry:
    """The one-grid entry of the ranks ``comms`` (a job's communicators in one process, in rank
    order, all of one manifest platform on one device) for ``dtype`` / ``op``: built once, through
    rank 0's platform, into a library of every rank (the entry calls their block functions), and
    refused at once where its blocks cannot all be resident together (they wait on each other)."""

    def __init__(self, comms: list, dtype: str, op: str):
        first = comms[0]
        flavours = {c.rank_platform[c.rank] for c in comms}
        if len(flavours) > 1:
            raise CommunicatorError("one grid runs the kernels of ranks of one platform"
                                    f" (this job: {', '.join(sorted(flavours))})")
        #: table mode: the entry finds each block's rank through the first block of every rank
        #: (:func:`~hccc.runtime.kernel_abi.grid_first`) and takes every rank's table argument
        self.table = first.codegen == "table"
        self.comms, self.pf, prog = comms, first._pf, first._prog
        inst = Instance(dtype, op)
        sym = grid_symbol(prog.manifest, first.rank_platform[0], inst)
        if sym is None:
            raise CommunicatorError(f"{first.ir.name}: the generated sources have no one-grid entry")
        if len({(c._pf.name, c.device) for c in comms}) != 1:
            raise CommunicatorError(f"{first.ir.name}: one grid needs every rank on one device of one platform")
        # every rank in one launch on one device: memory ordered at device scope, as the
        # single-process runner builds its one grid (system scope cost ten times the kernel time
        # of hm_allreduce_4x8 at 1 MiB on the CPU emulation: 2.6 s against 0.21 s)
        self.blocks = sum(c.grid for c in comms)
        try:
            check_grid_residency(first.ir.name, self.blocks, self.pf.launch_residency())
        except PlatformError as exc:
            raise CommunicatorError(str(exc)) from None
        lib = self.pf.build(prog.gendir, prog.manifest, inst, ranks=list(range(len(comms))), single_gpu=True)
        self.fn = self.pf.load(lib).function(sym)
        self._check_fit(self.block)
        #: the buffers :meth:`argument` writes: name -> (pointer in rank 0's memory, bytes)
        self._kept: dict[str, tuple[int, int]] = {}

    @property
    def block(self) -> int:
        """Threads per block of the launch: the most any rank runs now."""
        return max(c.block for c in self.comms)

    def _check_fit(self, block: int) -> None:
        fit = self.pf.max_resident_blocks(self.fn, block)
        if self.blocks > fit:
            raise CommunicatorError(f"{self.comms[0].ir.name} as one grid needs {self.blocks} thread blocks "
                                    f"of {block} threads resident at once; at most {fit} fit")

    def argument(self, packed: list[bytes]) -> bytes:
        """The entry's argument over every rank's packed kernel argument (``packed``: ``hccc_args``,
        or ``hccc_table_args`` in table mode, with the block table of every rank's first block),
        copied into rank 0's memory: into buffers the entry keeps for the job's life (rank 0's own
        allocations, freed with its memory), written again by each call (the previous call's
        kernels have ended), so that a launch allocates nothing."""
        owner = self.comms[0]

        def put(what: str, data: bytes, least: int) -> int:
            blob = np.frombuffer(data, np.uint8)
            ptr, size = self._kept.get(what, (0, 0))
            if size < blob.nbytes or not ptr:
                if ptr:
                    owner._owned.free(ptr)
                    del self._kept[what]
                size = max(blob.nbytes, least)
                ptr = owner._owned.local(size)
                self._kept[what] = (ptr, size)
            self.pf.memcpy_htod(ptr, blob)
            return ptr
        ranks = put("ranks", b"".join(packed), ctypes.sizeof(Args))
        if not self.table:
            return grid_argument(ranks, len(packed))
        return grid_argument(ranks, len(packed), first=put("first", grid_first([c.grid for c in self.comms]), 16))

    def launch(self, arg: bytes) -> None:
        """Every rank's blocks in one launch on rank 0's stream."""
        owner = self.comms[0]
        self._check_fit(self.block)
        self.pf.set_device(owner.device)
        self.pf.launch_grid(self.fn, self.blocks, self.block, arg, owner._stream, abort_flag=owner.flags.abort)


@contextmanager
def rank_arrays(comm: Communicator, arrays: list, dtype: str):
    """A rank's call arrays (host numpy arrays of ``dtype``'s device form, bfloat16 as uint16 bit
    patterns: :func:`hccc.runtime.oracle.to_device`; None passed through) as the rank's backend
    takes them: on the CPU emulation the arrays themselves (bfloat16 as
    :class:`~hccc.runtime.call_buffers.Bfloat16Bits`: numpy has no bfloat16, and torch's import
    would cost every job seconds); on a GPU platform copies in the rank's device memory
    (:class:`~hccc.runtime.call_buffers.DeviceArray`), one per array the others are views of, so
    an in-place call's input and output alias there as on the host, copied back into the host
    arrays when the call returns. They are freed then, or after a failed call, unless the rank's
    kernel may still run (it ignored the abort flag: :data:`~hccc.runtime.kernel_errors.IGNORES_ABORT`)."""
    pf = comm._pf
    if device_kind(pf.name) == "cpu":
        yield [None if a is None else Bfloat16Bits(a) if dtype == "bfloat16" else a for a in arrays]
        return
    bases = {}
    for a in arrays:
        if a is not None:
            b = a if a.base is None else a.base
            bases.setdefault(id(b), b)
    pf.set_device(comm.device)
    dev: dict[int, int] = {}
    try:
        for k, b in bases.items():
            dev[k] = pf.malloc(max(b.nbytes, 16))
            if b.nbytes:
                pf.memcpy_htod(dev[k], b)

        def on_device(a):
            b = a if a.base is None else a.base
            return DeviceArray(dev[id(b)] + (a.ctypes.data - b.ctypes.data), a.size, dtype)
        yield [None if a is None else on_device(a) for a in arrays]
        for k, b in bases.items():
            if b.nbytes:
                pf.memcpy_dtoh(b, dev[k])
    finally:
        if not (comm._broken and IGNORES_ABORT in comm._broken):
            for p in dev.values():
                pf.free(p)


def _call_buffers(x: np.ndarray, row, garbage, inplace: bool) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) of one rank's call of layout row ``row``
    (:func:`~hccc.runtime.launcher.program_layout`) on a copy of ``x``: out of place an output of
    ``garbage``; in place one buffer, the input at its offset in the output (the rest garbage),
    or the output a view of the input at its offset."""
    n_in, n_out, _scratch, in_off, out_off = row
    if not inplace:
        return np.array(x, copy=True), np.full(n_out, garbage, dtype=x.dtype)
    if in_off >= 0:
        buf = np.full(max(n_out, in_off + n_in), garbage, dtype=x.dtype)
        buf[in_off:in_off + n_in] = x
        return buf[in_off:in_off + n_in], buf[:n_out]
    buf = np.array(x, copy=True)
    return buf, buf[out_off:out_off + n_out]


def _setup_error(errors: list) -> BaseException:
    """The error of a set-up that failed (``errors``: each rank's exception or None), in the words
    the single-process runner says it: a failure every rank met alike that is not a
    :class:`CommunicatorError` (a ValueError for an option, a PlatformError for a backend) raised
    once as the ranks raised it; else one :class:`CommunicatorError` naming each rank's failure
    (:func:`_job_error`)."""
    if (len(errors) > 1 and all(e is not None for e in errors)
            and len({(type(e), str(e)) for e in errors}) == 1 and not isinstance(errors[0], CommunicatorError)):
        return errors[0]
    return _job_error(errors, None)


def _job_error(errors: list, doing: str | None) -> CommunicatorError:
    """One error naming every rank's failure (each message names its rank); where every rank
    failed alike (the same message but for its rank), that message once, for every rank.
    ``doing``: what the job was doing, said first ("the job failed in a call: ..."); None for a
    set-up, said in the words the ranks (and the single-process runner) say it, with nothing
    before them."""
    lines = [str(e) if isinstance(e, CommunicatorError) else f"rank {r}: {type(e).__name__}: {e}"
             for r, e in enumerate(errors) if e is not None]
    alike = {line[len(f"rank {r}: "):] if line.startswith(f"rank {r}: ") else None
             for r, line in zip((r for r, e in enumerate(errors) if e is not None), lines)}
    if len(errors) > 1 and all(e is not None for e in errors) and len(alike) == 1 and None not in alike:
        said = alike.pop()
        return CommunicatorError(said if doing is None else f"the job failed {doing}: every rank: {said}")
    return CommunicatorError("; ".join(lines) if doing is None else f"the job failed {doing}: " + "; ".join(lines))


__all__ = ["LocalJob", "ThreadRank", "GroupLaunch", "GridEntry", "RankThreads", "SharedPrograms"]
