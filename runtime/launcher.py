"""Run a ProgramIR's emitted kernels on a platform and check them against the reference executor.

Platform-neutral: everything here goes through :class:`hccc.runtime.platform.Platform` (memory,
build/load, streams, launches, timers), so the CPU emulation and CUDA run the same code.

Mixed-vendor programs (HetCCL-SNU's device-code split). Every rank has a manifest platform
("cuda" for NVIDIA ranks, "hip" for AMD ranks; ``Runner(..., platforms=[...])``, e.g. from a
compile with ``--topology``). The runner maps each manifest platform present to a Platform object
(``backend``: ``"cpu"`` emulates every platform on the CPU, one :class:`~hccc.runtime.cpu.
CpuPlatform` per manifest platform; ``"cuda"`` / ``"hip"`` run a program of that platform only; a
dict ``{"cuda": P1, "hip": P2}`` names them explicitly), builds through each object one library
from exactly the sources of its ranks -- the split the emitted Makefile/CMake files make -- and
launches every rank's kernel from its platform's library, through its platform. A rank's buffers,
counters, connection tables and the FIFOs it receives on live in its platform's memory; senders of
the other platform write into them, so every pair of platforms of one run must share memory
(:meth:`Platform.shares_memory_with`: CPU-emulated platforms share the host's). A CUDA and a HIP
runtime in one process share none, and the runner refuses such a mapping, naming the ranks.

One :class:`Runner` holds one build (program x platforms x dtype x op) and the size-independent
state: per rank the FIFOs it receives on (``NSLOTS * chunk_bytes`` slot bytes, in the receiver's
memory), their head/tail counters, the progress counters of its TBs and its connection tables;
globally the abort flag and the error record. :meth:`Runner.run` then allocates the size-dependent
buffers (input, output, scratch), zeroes every counter, flag and the error record, uploads
inputs (outputs and scratch start as garbage: NaN / INT_MIN, so an element never written shows
up), launches every rank on its own stream, waits (with a host-side watchdog on top of the kernels'
own timeout), decodes the error record, reads the outputs back and compares them with
:func:`hccc.runtime.reference.execute` run on the same inputs (the oracle; exact comparison:
inputs are small integers, and the reference reduces in the program's own order, rounding
bfloat16 after every reduction like the kernels do). The oracle's outputs are also compared with
the collective's definition (:func:`~hccc.runtime.reference.expected`), which catches IRs
(hand-edited ``.json`` files are not re-verified) that do not implement their collective. A
program the reference executor refuses (it can deadlock with one FIFO slot, though the real FIFO
depth may hide that) is compared with the collective's definition directly
(:attr:`RunResult.oracle` says which).

Sizes: ``nbytes`` is the size of the collective's full buffer, nccl-tests' ``S``: the AllReduce
buffer of each rank, the AllGather *output* of each rank, the ReduceScatter *input* of each rank.
``count = nbytes / sizeof(dtype)`` elements; any count works (chunks then differ by one element,
and may be empty). algbw = S / time, busbw = algbw * :func:`busbw_factor` (nccl-tests'
PERFORMANCE.md).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field, fields

import numpy as np

from hccc.compiler.frontend.collectives import SPECS, spec_of
from hccc.util import dtypes as dtypes_table
from hccc.util.limits import printable
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.compiler.backend.codegen import buffer_bases

from hccc.runtime import alltoallv as av, oracle, reference
from hccc.runtime.busbw import busbw_factor
from hccc.compiler.backend import abi
from hccc.runtime.kernel_abi import (WAIT_COUNTS, WAIT_DATA, WAIT_DEP, WAIT_SLOT, Args, ErrorRecord, TableArgs,
                                     grid_first, op_name)
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.rank_kernels import RankKernels, fit_block_threads  # noqa: F401 (re-exported)
from hccc.runtime.run_buffers import RunBuffers
from hccc.runtime.alltoallv_call import HostCounts, VCall, block_tables, buffer_lengths
# re-exported: callers import these from here too
from hccc.runtime.generated import (CODEGENS, DIRECT_MODES, GeneratedProgram, check_codegen,  # noqa: F401
                                    generated_sources, rank_blocks)
from hccc.runtime.rank_platforms import (MANIFEST_PLATFORMS, rank_groups, rank_platforms,  # noqa: F401
                                         rank_ranges, resolve_platforms)
# the per-call recipe and what a rank owns (re-exported: callers import them from here too)
from hccc.runtime.rank_memory import (LaunchCall, LaunchFlags, RankMemory, RankPlan, check_slice,  # noqa: F401
                                      grid_argument, launch_proto, launch_slice_bytes,
                                      synchronize_in_background)
from hccc.runtime.platform import Platform, PlatformError

#: the least time kernels get to end after the abort flag is raised by an interrupt or an error
#: (the watchdog's own grace, :meth:`Runner._wait`: at least this, or twice the spin-wait timeout);
#: a kernel ends at its next wait, which comes within a primitive's copy of at most one slot
STOP_GRACE_S = 5.0

#: element types and reduction operators (the one table of them: hccc.util.dtypes)
DTYPES = dtypes_table.DTYPE_NAMES
OPS = dtypes_table.OP_NAMES
ELEMENT_BYTES = {d.name: d.bytes for d in dtypes_table.DTYPES}


def program_layout(ir: ProgramIR, count: int):
    """Per rank of ``ir`` at ``count`` elements: (input length, output length, scratch length,
    input offset in output or -1, output offset in input or -1) in elements, for in-place aliasing."""
    C = ir.nchunks
    bounds = reference.chunk_bounds(count, C)
    maxc = -(-count // C) if count else 0
    in_base, out_base = buffer_bases(ir)
    rows = []
    for r in range(ir.nranks):
        ib, ob = int(in_base[r]), int(out_base[r])
        i0, i1 = _chunk_lo(bounds, count, C, ib), _chunk_lo(bounds, count, C, ib + ir.in_chunks)
        o0, o1 = _chunk_lo(bounds, count, C, ob), _chunk_lo(bounds, count, C, ob + ir.out_chunks)
        in_in_out = o0 <= i0 and i1 <= o1
        out_in_in = i0 <= o0 and o1 <= i1
        rows.append((i1 - i0, o1 - o0, ir.scratch_chunks * maxc,
                     i0 - o0 if in_in_out else -1, o0 - i0 if out_in_in and not in_in_out else -1))
    return rows


def check_program_memory(ir: ProgramIR, nbytes: int, dtype: str) -> None:
    """:func:`check_run_memory` for running ``ir`` at ``nbytes`` of ``dtype`` (before building)."""
    es = ELEMENT_BYTES[dtype]
    lay = program_layout(ir, max(0, int(nbytes)) // es)
    check_run_memory(ir.name, nbytes, sum(a + b + c for a, b, c, _, _ in lay) * es)


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
        def human(n: int) -> str:
            for u, s in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if n >= s:
                    return f"{n / s:.1f} {u}"
            return f"{n} bytes"
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
    :func:`run_memory_limit` (``--channels`` x ``--chunk-size`` x connections can ask for more
    than the machine has) with :class:`FifoMemoryError`."""
    need = plans_memory_bytes(plans, ranks)
    limit = run_memory_limit()
    if need > limit:
        raise FifoMemoryError(f"{name}'s FIFOs need {need / (1 << 30):.1f} GiB ({len(plans)} ranks' "
                              f"connections x channels x {plans[0].nslots} slots of {plans[0].slot_bytes} "
                              f"bytes), over the limit of {limit / (1 << 30):.1f} GiB; use a smaller "
                              "--chunk-size or fewer --channels, or set HCCC_MAX_RUN_BYTES to change it",
                              need, limit)


# ============================================================================ results
@dataclass
class RunResult:
    bytes: int
    count: int
    dtype: str
    op: str
    inplace: bool
    wrong: int            # elements differing from the oracle (all ranks)
    time_us: float        # mean time of the timed iterations (nan when none completed)
    stuck: str | None     # "rank R, TB T stuck in <op> for chunk C (micro-batch M)" or None
    first_wrong: str | None  # e.g. "rank 3, output element 17: got 1.0, expected 2.0"
    collective: str = ""
    nranks: int = 0
    iters: int = 0
    #: elements where the oracle itself differs from the collective's definition (an IR that does
    #: not implement its collective); -1 when not checked
    collective_wrong: int = 0
    nthreads: int = 0     # threads per thread block
    algbw_GBps: float = field(default=float("nan"))
    busbw_GBps: float = field(default=float("nan"))
    #: what the outputs were compared with: "reference" (the reference executor run of the
    #: program), "definition" (the collective's definition, for programs the reference executor
    #: refuses as possibly deadlocking), None when not checked
    oracle: str | None = None
    #: every rank's output buffer (``Runner.run(keep_outputs=True)``; bfloat16 as float32)
    outputs: list | None = field(default=None, repr=False, compare=False)
    #: micro-batch slice of the launch in bytes (:func:`launch_slice_bytes`)
    slice_bytes: int = 0
    #: FIFO protocol the launch ran: "simple" or "ll" (:func:`launch_proto`)
    proto: str = "simple"
    #: launches whose outputs were compared (nccl-tests' -c N; 0 when not checked)
    checks: int = 0

    def __post_init__(self):
        if self.time_us and self.time_us > 0 and math.isfinite(self.time_us):
            self.algbw_GBps = self.bytes / (self.time_us * 1e3)
            self.busbw_GBps = self.algbw_GBps * busbw_factor(self.collective, self.nranks)

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and self.stuck is None and self.collective_wrong <= 0

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "outputs"}
        for k in ("time_us", "algbw_GBps", "busbw_GBps"):
            if not math.isfinite(d[k]):
                d[k] = None
        return d


# ============================================================================ the runner
def _chunk_lo(bounds: np.ndarray, count: int, nchunks: int, j: int) -> int:
    """First element of chunk slot ``j`` (slots past ``nchunks`` wrap into a further copy)."""
    return (j // nchunks) * count + int(bounds[j % nchunks])


class Runner:
    """One build of ``ir`` for its platforms and one instance, run at any number of sizes: N ranks
    in this process, each with its :class:`RankMemory`, launched through the one per-call recipe
    (:mod:`hccc.runtime.rank_memory`) and checked against the oracle (:mod:`hccc.runtime.oracle`).

    ``backend``: ``"cpu"`` (every manifest platform emulated on the CPU, one
    :class:`~hccc.runtime.cpu.CpuPlatform` per platform present), ``"cuda"`` / ``"hip"`` (a
    program whose ranks are all of that platform), a :class:`Platform` object (used for every
    platform it :meth:`~Platform.runs_sources`), or a dict from manifest platform to a name or a
    Platform object, e.g. ``{"cuda": CpuPlatform(), "hip": CpuPlatform()}``
    (:mod:`hccc.runtime.rank_platforms`).
    ``platforms``: the manifest platform ("cuda" or "hip") of each rank; default: every rank on the
    backend's own platform (CUDA for ``"cpu"``), or the dict's only key.
    ``nthreads``: threads per thread block (default: each platform's choice for its emitted
    kernels, see :meth:`Platform.block_threads`). ``timeout_s``: kernel spin-wait limit (0 =
    none). ``watchdog_s``: host-side limit per launch (default: generous, from timeout and size).
    ``codegen``: ``"specialized"`` (each rank's own kernel) or ``"table"`` (the generic kernels,
    built once for every algorithm, each rank running its table from device memory).
    ``one_grid``: run every rank in one launch of the one-grid entry (block index -> (rank, thread
    block)), launched so that all its blocks are resident together (:meth:`Platform.launch_grid`),
    instead of one kernel per rank in its own stream, which only progresses if the GPU happens to
    run those kernels concurrently. None (default): whenever every rank is on one device of one
    platform (:attr:`single_gpu`) and the manifest has the entry; True: that or PlatformError;
    False: a kernel per rank. :attr:`grid_fn` is the entry in use, or None. ``direct``: "auto"
    (default) generates direct mode for the receives :mod:`hccc.compiler.ir.direct` proves safe
    (the sender writes the receiver's destination), "off" keeps the FIFO for every primitive.

    Bookkeeping for callers and tests: :attr:`rank_platform` (manifest platform per rank),
    :attr:`platforms` (manifest platform -> Platform object), :attr:`libraries` (manifest platform
    -> the built module's path), :attr:`library_ranks` (manifest platform -> its ranks),
    :attr:`rank_library` (the library each rank's kernel was taken from); :attr:`platform` is rank
    0's Platform object.
    """

    def __init__(self, ir: ProgramIR, backend="cpu", dtype: str = "float32",
                 op: str = "sum", *, platforms: list[str] | None = None, nthreads: int | None = None,
                 cache_dir=None, timeout_s: float = 10.0, watchdog_s: float | None = None,
                 codegen: str = "specialized", one_grid: bool | None = None, direct: str = "auto"):
        check_codegen(codegen)
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
        self._allocs: list[tuple[Platform, int]] = []
        self._owned: list[Platform] = []
        self._broken: str | None = None
        self._closed = False
        #: what the last run's protocol request changed, or None: why LL ran Simple
        #: (:func:`launch_proto`), or that its direct-mode receives went through the FIFO as LL lines
        self.proto_note = None
        self._direct_receives: int | None = None
        try:
            self.rank_platform = rank_platforms(ir.nranks, backend, platforms)
            self.library_ranks = rank_groups(self.rank_platform)
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
        self.slot_bytes, self.rank_plans = prog.slot_bytes, prog.plans
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
        """The size-independent memory: every rank's :class:`RankMemory` (the FIFO slots it
        receives on and its control block in memory its peers reach, :meth:`Platform.malloc_peer`;
        its connection tables, its table in table mode), the flags, the streams and the one-grid
        entry's argument array. The same code allocates a one-rank-per-process Communicator's."""
        N = self.nranks
        self.rank_mem = [RankMemory(self.rank_plans[r], self.rank_pf[r],
                                    lambda n, r=r: self._malloc(r, n, peer=True),
                                    lambda n, r=r: self._malloc(r, n))
                         for r in range(N)]
        for m in self.rank_mem:
            m.connect(self.rank_plans, lambda peer: (self.rank_mem[peer].ctrl, self.rank_mem[peer].slots))
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
        if self.program.table_mode:
            tables = self.program.tables()
            self.table_ptr = [self.rank_mem[r].load_table(tables[r]) for r in range(N)]
        # the abort flag: pinned, mapped host memory; the error record: rank 0's memory (every
        # rank's kernels reach it; the first to time out claims it with a CAS)
        self.flags_pf = self.platform
        self.abort_ptr = self.flags_pf.host_flags(64)
        self._allocs.append((self.flags_pf, self.abort_ptr))
        self.error_ptr = self._malloc(0 if N else None, ctypes.sizeof(ErrorRecord))
        self.flags = LaunchFlags(self.flags_pf, self.abort_ptr, self.error_ptr)
        self.streams = []
        for r in range(N):
            self.rank_pf[r].set_device(self.placement[r])
            self.streams.append(self.rank_pf[r].stream())
        if self.grid_fn is not None:
            # every rank's kernel argument in one device array (filled per launch); the table
            # mode's entry also reads the first block of each rank from device memory
            self.grid_args_ptr = self._malloc(0, N * ctypes.sizeof(TableArgs if self.table_ptr else Args))
            if self.table_ptr:
                first = grid_first(self.grid)
                self.grid_first_ptr = self._malloc(0, len(first))
                self.rank_pf[0].memcpy_htod(self.grid_first_ptr, np.frombuffer(first, np.uint8))

    def _malloc(self, rank: int | None, nbytes: int, *, peer: bool = False) -> int:
        """Memory on ``rank``'s platform and device (kept until :meth:`close`); ``peer``: memory
        other ranks' kernels touch while running (:meth:`Platform.malloc_peer`)."""
        pf = self.rank_pf[rank] if rank is not None else self.platform
        pf.set_device(self.placement[rank] if rank is not None else 0)
        ptr = pf.malloc_peer(int(nbytes)) if peer else pf.malloc(int(nbytes))
        self._allocs.append((pf, ptr))
        return ptr

    # ------------------------------------------------------------------ sizes
    def layout(self, count: int):
        """Per rank: (input length, output length, scratch length, input offset in output or
        -1, output offset in input or -1) in elements, for in-place aliasing
        (:func:`program_layout`)."""
        return program_layout(self.ir, count)

    def default_watchdog(self, nbytes: int) -> float:
        total = nbytes * max(self.nranks, 1) * 4
        return max(30.0, 3.0 * self.timeout_s) + total / 20e6

    # ------------------------------------------------------------------ one run
    def run(self, nbytes: int | None = None, *, count: int | None = None, inplace: bool = False,
            iters: int = 1, warmup: int = 0, seed: int = 0, timeout_s: float | None = None,
            nthreads: int | None = None, check: bool = True, inputs: list | None = None,
            keep_outputs: bool = False, slice_bytes: int | str = "auto", proto: str = "simple",
            checks: int = 1) -> RunResult:
        """Run at ``nbytes`` (the collective's full buffer, see the module docstring) or ``count``
        elements; returns a :class:`RunResult` (never raises for wrong results or stuck kernels).
        ``nthreads`` overrides the runner's threads per thread block for this run. ``inputs``
        (one array per rank, as :func:`hccc.runtime.reference.make_inputs` lays them out; float32
        for bfloat16) replaces the generated small-integer data. ``keep_outputs`` stores every
        rank's output (as the oracle sees it) in :attr:`RunResult.outputs`. ``slice_bytes`` is the
        micro-batch slice: ``"auto"`` sizes it for ``nbytes`` (:mod:`hccc.compiler.passes.slicing`), an
        int fixes it (a multiple of 16 of at most the compiled slot size). ``proto`` is the FIFO protocol:
        ``"simple"``, ``"ll"`` or ``"auto"`` (LL up to :data:`hccc.compiler.backend.abi.LL_AUTO_MAX_BYTES`);
        :func:`launch_proto` says when LL falls back, :attr:`RunResult.proto` what ran and
        :attr:`proto_note` why. ``checks`` (nccl-tests' ``-c N``, with ``check``): the outputs of the
        last timed launch are compared, then ``checks - 1`` more launches run, each from fresh
        inputs and compared; :attr:`RunResult.wrong` sums the wrong elements of all ``checks``."""
        self._check_usable()
        es = ELEMENT_BYTES[self.dtype]
        count = self._count_of(nbytes, count, es)
        if iters < 1 or warmup < 0 or checks < 1:
            raise ValueError("iters and checks must be >= 1 and warmup >= 0")
        # the call's protocol, slice and message bound: the one recipe (hccc.runtime.rank_memory)
        call = LaunchCall.plan(self.ir, count, es, self.chunk_bytes, proto=proto, slice_bytes=slice_bytes)
        call.check(self.ir)
        block = self.block if nthreads is None else int(nthreads)
        if block < 1:
            raise ValueError("nthreads must be positive")
        blocks = self.blocks if nthreads is None else [block] * self.nranks
        if nthreads is not None and blocks != self.blocks:
            self.kernels.check_residency(block)
        lay = self.layout(count)
        check_run_memory(self.ir.name, count * es, sum(a + b + c for a, b, c, _, _ in lay) * es)
        self._check_placement(inplace, lay)
        inputs = self._inputs(inputs, lay, count, seed)

        times, stuck, outs, verdicts = self._execute(
            call, lay, inplace, [oracle.to_device(x, self.dtype) for x in inputs],
            timeout_s=timeout_s, blocks=blocks, warmup=warmup, iters=iters,
            verify=(lambda outs: self._compare(outs, inputs, inplace)) if check else None, checks=checks,
            keep=keep_outputs)
        wrong = sum(v[0] for v in verdicts)
        first = next((v[1] for v in verdicts if v[1] is not None), None)
        coll_wrong, used = (verdicts[0][2], verdicts[0][3]) if verdicts else (0, None)
        return self._result(call, count * es, inplace, times, stuck, wrong, first,
                            collective_wrong=int(coll_wrong) if check else -1, nthreads=block,
                            outputs=outs if keep_outputs else None, oracle=used, checks=len(verdicts))

    def _compare(self, outs, inputs, inplace: bool):
        """The oracle's verdict on one launch's outputs: (wrong, first wrong, collective_wrong,
        oracle name) (:func:`hccc.runtime.oracle.compare`)."""
        return oracle.compare(self.ir, self.dtype, self.op, outs, inputs, inplace)

    def _count_of(self, nbytes, count, es: int) -> int:
        """The call's element count from exactly one of ``nbytes`` and ``count`` (AllToAll: a whole
        number of equal blocks)."""
        if (nbytes is None) == (count is None):
            raise ValueError("give exactly one of nbytes and count")
        if count is None:
            if nbytes < 0 or nbytes % es:
                raise ValueError(f"{nbytes} bytes is not a whole number of {self.dtype} elements "
                                 f"({es} bytes each)")
            count = nbytes // es
        count = int(count)
        if count < 0:
            raise ValueError("count must be non-negative")
        return reference.alltoall_count(count, count_unit(self.ir))

    def _check_placement(self, inplace: bool, lay) -> None:
        """ValueError for a placement the program is not proven for or its buffers cannot take."""
        ir = self.ir
        if bool(inplace) not in ir.placements:
            raise ValueError(f"{ir.name} is proven {'out of place' if inplace else 'in place'} only (its MSCCL "
                             f"XML declares inplace=\"{int(True in ir.placements)}\" outofplace="
                             f"\"{int(False in ir.placements)}\"): it cannot run "
                             f"{'in place' if inplace else 'out of place'}")
        if inplace:
            bad = [r for r, row in enumerate(lay) if row[3] < 0 and row[4] < 0]
            if bad:
                raise ValueError(f"in-place is not defined for this program's buffers (rank {bad[0]}: "
                                 "input and output do not overlay)")

    def _inputs(self, inputs, lay, count: int, seed: int) -> list[np.ndarray]:
        """Every rank's input: the caller's, checked against the layout, or small integers exact
        under every reduction order and type (:func:`hccc.runtime.oracle.make_inputs`)."""
        N, coll = self.nranks, self.ir.collective
        if inputs is None:
            inputs = oracle.make_inputs(self.ir, count, self.dtype, self.op, seed)
        else:
            npdt = np.dtype(dtypes_table.dtype(self.dtype).numpy)
            inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
            if len(inputs) != N:
                raise ValueError(f"expected {N} input arrays, got {len(inputs)}")
        for r in range(N):
            if len(inputs[r]) != lay[r][0]:
                raise ValueError(f"rank {r}: this program's input buffer holds {lay[r][0]} elements "
                                 f"where a {coll} passes {len(inputs[r])}; the oracle cannot run it")
        return inputs

    def _result(self, call: LaunchCall, nbytes: int, inplace: bool, times, stuck, wrong, first,
                **more) -> RunResult:
        return RunResult(bytes=nbytes, count=nbytes // call.element_bytes, dtype=self.dtype, op=self.op,
                         inplace=bool(inplace), wrong=int(wrong),
                         time_us=float(np.mean(times)) if times else float("nan"), stuck=stuck,
                         first_wrong=first, collective=self.ir.collective, nranks=self.nranks,
                         iters=len(times), slice_bytes=call.slice_bytes, proto=call.proto, **more)

    def _execute(self, call: LaunchCall, lay, inplace: bool, dev_inputs, *, timeout_s, blocks,
                 warmup: int, iters: int, verify=None, checks: int = 1, keep: bool = False,
                 out_lens=None, vcall=None):
        """One run's launches of ``call``: allocate each rank's buffers (``lay``: :meth:`layout`'s
        rows), fill every rank's arguments (``vcall(rank, stage)``: an AllToAllv call's
        :class:`~hccc.runtime.alltoallv_call.VCall` of the rank, ``stage(array)`` putting an array
        in the rank's memory for this run), launch ``warmup + iters`` times, then read the outputs
        (``out_lens``: elements per rank, default the layout's) when asked to ``keep`` them or
        ``verify(outputs)`` them, the latter after ``checks`` launches each. Returns (times in us,
        why the last launch stuck or None, the first outputs read or None, the verdicts). The
        buffers are freed before it returns; kernels are stopped before that on any error."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        out_lens = [row[1] for row in lay] if out_lens is None else out_lens
        self.proto_note = call.note
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

            times, stuck = self._timed_launches(launch, warmup, iters)
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
        """Direct mode for a Simple launch (:meth:`_set_peers`); under LL every message goes
        through the FIFO as lines (no peers array, so the kernels' direct-marked primitives take
        the FIFO path; both ends of a message agree), which :attr:`proto_note` says."""
        if call.proto != "ll":
            self._set_peers(argv, bufs)
        elif self.proto_note is None and self._peers_usable() and self.direct_receives():
            n = self.direct_receives()
            self.proto_note = (f"{n} direct-mode receive{'s' if n != 1 else ''} of {self.ir.name} "
                               "run through the FIFO as LL lines (a direct write lands in the "
                               "receiver's buffer, which has no room for LL's flags)")

    # ------------------------------------------------------------------ AllToAllv
    def vblocks(self, inplace: bool = False):
        """The program's block-piece tables for AllToAllv (:func:`hccc.runtime.alltoallv_call.block_tables`),
        computed once per placement; VBlockError when the program cannot run with per-pair counts."""
        cache_ = self.__dict__.setdefault("_vblocks", {})
        if bool(inplace) not in cache_:
            cache_[bool(inplace)] = block_tables(self.ir, inplace)
        return cache_[bool(inplace)]

    def run_v(self, counts, *, sdispls=None, rdispls=None, send_lens=None, recv_lens=None,
              inplace: bool = False, inputs: list | None = None, seed: int = 0, iters: int = 1,
              warmup: int = 0, timeout_s: float | None = None, slice_bytes: int | str = "auto",
              proto: str = "simple", pass_displs: bool | None = None, keep_outputs: bool = False) -> RunResult:
        """Run the AllToAll program as an AllToAllv (:mod:`hccc.runtime.alltoallv`): ``counts[s][d]``
        elements from rank ``s`` to rank ``d``, send / receive displacements ``sdispls[s][d]`` /
        ``rdispls[d][s]`` (None: packed), buffers of ``send_lens[r]`` / ``recv_lens[r]`` elements
        (None: just large enough). The kernels read the counts (and the displacements when given,
        or with ``pass_displs``) from device memory and take the prefix sums themselves. The receive
        buffers are compared with the oracle (:func:`hccc.runtime.alltoallv.expected`). CountsError
        (a ValueError) before anything runs for counts the buffers cannot take."""
        self._check_usable()
        ir, N = self.ir, self.nranks
        if not SPECS[ir.collective].per_pair_counts:
            raise ValueError(f"{ir.name} is a {ir.collective}: per-pair counts need an AllToAll program")
        if bool(inplace) not in ir.placements:
            raise ValueError(f"{ir.name} is proven {'out of place' if inplace else 'in place'} only")
        c = av.as_counts(counts, N)
        send_lens, recv_lens = buffer_lengths(c, sdispls, rdispls, send_lens, recv_lens, inplace)
        vm, tables = self.vblocks(inplace)
        hc = HostCounts.check(c, N, vm.k, send_lens, recv_lens, sdispls, rdispls, inplace, pass_displs)
        es = ELEMENT_BYTES[self.dtype]
        call = LaunchCall.plan(ir, hc.equal, es, self.chunk_bytes, proto=proto, slice_bytes=slice_bytes)
        call.check(ir)
        scr_n = ir.scratch_chunks * hc.slot
        # before any buffer of the call exists, on the host (inputs, oracle) or the device
        check_run_memory(ir.name, sum(send_lens) * es,
                         (sum(send_lens) + (0 if inplace else sum(recv_lens)) + N * scr_n) * es)
        npdt = np.dtype(dtypes_table.dtype(self.dtype).numpy)
        if inputs is None:
            rng = np.random.default_rng(seed)
            inputs = [rng.integers(-100, 101, size=int(n)).astype(npdt) for n in send_lens]
        else:
            inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
            if len(inputs) != N or any(len(x) != int(n) for x, n in zip(inputs, send_lens)):
                raise ValueError("inputs: one array per rank, of its send buffer's length")
        garbage = (oracle.GARBAGE[self.dtype], oracle.DEVICE_DTYPE[self.dtype])
        before = [np.array(inputs[r], copy=True) if inplace else
                  oracle.from_device(np.full(recv_lens[r], *garbage), self.dtype) for r in range(N)]
        want = av.expected([np.array(x) for x in inputs], before, hc.counts, hc.sd, hc.rd)

        def vcall(r, stage):
            return VCall(stage(np.ascontiguousarray(hc.counts.ravel())), stage(hc.displs),
                         stage(tables[r]), hc.slot), vm.uses_scratch

        # the buffers as run's layout rows: in place, one buffer at offset 0 of both
        lay = [(send_lens[r], recv_lens[r], scr_n, 0 if inplace else -1, -1) for r in range(N)]
        times, stuck, outs, verdicts = self._execute(
            call, lay, inplace, [oracle.to_device(x, self.dtype) for x in inputs], timeout_s=timeout_s,
            blocks=self.blocks, warmup=warmup, iters=iters, out_lens=recv_lens, vcall=vcall,
            verify=lambda outs: oracle.count_wrong(ir.collective, outs, want))
        wrong, first = verdicts[0] if verdicts else (0, None)
        # nccl-tests' alltoall convention with the mean per-rank send buffer as the size (as hccc sim
        # --counts, hccc.runtime.sim_alltoallv): busbw = size / time * (n - 1) / n
        per_rank = int(hc.counts.sum()) * es // max(N, 1)
        return self._result(call, per_rank, inplace, times, stuck, wrong, first, collective_wrong=0,
                            nthreads=self.block, oracle="alltoallv",
                            outputs=outs if keep_outputs else None)

    def _set_peers(self, argv: list, bufs: list) -> None:
        """Direct mode: give every rank the array of all ranks' ``hccc_args`` (``peers``), in its
        own device memory, when all ranks run on one platform (one address space: the CPU
        emulation, or GPUs of one process that reach each other's memory as they reach the FIFOs).
        Not on HIP across several GPUs: the data buffers are ordinary (coarse-grained) device
        memory there, which a peer GPU's writes need not reach coherently before the kernel ends
        (the FIFOs are fine-grained). Otherwise ``peers`` stays 0 and every primitive uses the
        FIFO. The arrays are freed with the run's buffers (appended to each rank's ``own`` list)."""
        N = len(argv)
        if N == 0 or not self._peers_usable():
            return
        blob = np.frombuffer(b"".join(bytes(a) for a in argv), np.uint8)
        for r in range(N):
            argv[r].peers = bufs.stage(r, blob)

    def _peers_usable(self) -> bool:
        """Whether :meth:`_set_peers` gives the ranks a peers array (direct mode can run)."""
        if not self.rank_pf or len({pf.name for pf in self.rank_pf}) != 1:
            return False
        return not (self.rank_pf[0].name == "hip" and len(set(self.placement)) > 1)

    def direct_receives(self) -> int:
        """Receives of the program its kernels run in direct mode when the launch has a peers
        array (``direct="auto"``: those :mod:`hccc.compiler.ir.direct` proves safe; 0 with
        ``direct="off"``)."""
        if self._direct_receives is None:
            from hccc.compiler.backend.codegen import prepare_output
            from hccc.compiler.backend.direct_fields import direct_fields
            ir = prepare_output(self.ir, ".", self.rank_platform)[0]   # canonical, as generated
            dx = direct_fields(ir, self.direct)
            self._direct_receives = 0 if dx is None else int(((dx["direct"] & 2) != 0).sum())
        return self._direct_receives

    def _launch_all(self, args, blocks, limit, grid_arg: bytes | None = None) -> list:
        """Launch every rank's kernel through its own platform, or with ``grid_arg`` the one-grid
        entry once (every rank, ``sum(grid)`` blocks), between the start and the stop of one timer
        per platform object; returns the timers."""
        users = [pf for pf in self._distinct if any(self.rank_pf[r] is pf and self.grid[r] > 0
                                                       for r in range(self.nranks))]
        timers = []
        try:
            for pf in users:
                timers.append(pf.timer())
                timers[-1].start()
            self.kernels.launch(args, blocks, self.streams, grid_arg, self.abort_ptr)
        except BaseException:
            # ranks already launched (or held back by a timer) wait for the others: abort them
            try:
                self._raise_abort()
                for t in timers:
                    t.stop()
                self._wait(limit)
            except Exception:
                pass
            raise
        for t in timers:
            t.stop()
        return timers

    def _names(self) -> str:
        return "+".join(sorted({pf.name for pf in self._distinct})) or "no"

    def _free_buffers(self, bufs: RunBuffers) -> None:
        """Free one run's buffers unless the runner is broken (kernels may still use them); a
        Ctrl-C waits until done."""
        with deferred_interrupts():
            if not self._broken:
                bufs.free()

    def _check_usable(self) -> None:
        if self._closed:
            raise PlatformError("runner is closed")
        if self._broken:
            raise PlatformError(f"the {self._names()} platform is unusable after an earlier "
                                f"run: {self._broken}")

    def _launch_once(self, call, argv, bufs, lay, dev_inputs, blocks, limit: float):
        """One launch of every rank from fresh inputs: (timers, why it stuck or None)."""
        zero, args, grid_arg = self._launch_arguments(call, argv)
        self._prepare(bufs, lay, dev_inputs, ll=zero)
        timers = self._launch_all(args, blocks, limit, grid_arg)
        stuck = self._wait(limit)
        return timers, stuck if stuck is not None else self._error_message()

    @staticmethod
    def _timed_launches(launch, warmup: int, iters: int):
        """``warmup + iters`` launches (``launch()``: timers and why it stuck), until one sticks:
        (the timed launches' times in us, why the last stuck or None). Platforms hold their
        launches until their timer stops (all ranks start together): a launch takes as long as
        its slowest platform's part."""
        times, stuck = [], None
        for it in range(warmup + iters):
            timers, stuck = launch()
            if stuck is not None:
                break
            if it >= warmup:
                times.append(max(t.elapsed_us() for t in timers))
        return times, stuck

    def _launch_arguments(self, call, argv):
        """One launch's arguments: every launch of an LL run gets the next flag epoch (its
        arguments change with it); the packed ``hccc_args`` of every rank and, for the one-grid
        entry, its argument over them in device memory. Returns (whether the LL slots are zeroed,
        the ranks' packed arguments, the grid argument or None)."""
        epoch, zero = call.launch(self.ll_epochs)
        for a in argv:
            a.ll_epoch = epoch
        args = [m.argument(a) for m, a in zip(self.rank_mem, argv)]
        grid_arg = None
        if self.grid_fn is not None:
            self.rank_pf[0].memcpy_htod(self.grid_args_ptr, np.frombuffer(b"".join(args), np.uint8))
            grid_arg = grid_argument(self.grid_args_ptr, len(argv),
                                     self.grid_first_ptr if self.table_ptr else None)
        return zero, args, grid_arg

    def _prepare(self, bufs: RunBuffers, lay, dev_inputs, ll: bool = False) -> None:
        """Zero counters, flags and the error record (and, with ``ll``, the FIFO slots: an LL
        launch that :class:`~hccc.runtime.ll_epoch.LLEpochs` says must zero); outputs and scratch
        to garbage and inputs in (:meth:`RunBuffers.fill`)."""
        for m in self.rank_mem:
            m.reset(slots=ll)
        self.flags.clear()
        bufs.fill(lay, dev_inputs)

    def _wait(self, limit: float) -> str | None:
        """Synchronize under the host watchdog; None when every kernel finished."""
        done, failure, _ = synchronize_in_background(self._distinct, "hccc-synchronize")
        if done.wait(limit):
            if failure:
                raise failure[0]
            return None
        self._raise_abort()
        grace = max(STOP_GRACE_S, 2.0 * self.timeout_s)
        if done.wait(grace):
            rec = self._error_message()
            return (f"host watchdog: kernels still running after {limit:.0f} s; aborted"
                    + (f" ({rec})" if rec else " (no thread block reported a timeout)"))
        self._broken = (f"kernels still running {limit + grace:.0f} s after launch and ignore the "
                        "abort flag")
        return f"host watchdog: {self._broken}"

    def stop_kernels(self) -> None:
        """Stop every kernel this runner launched before anything they use is freed (an interrupt
        or an error left them running): raise the abort flag and wait for every platform, with
        Ctrl-C held back. Kernels still running after the grace time mark the runner broken, and a
        broken runner never frees their memory."""
        if self._broken or not hasattr(self, "flags"):
            return
        with deferred_interrupts():
            try:
                self._raise_abort()
            except Exception:
                pass
            # (an aborted kernel's error is ignored: it has stopped all the same)
            done, _, _ = synchronize_in_background(self._distinct, "hccc-stop")
            if not done.wait(max(STOP_GRACE_S, 2.0 * self.timeout_s)):
                self._broken = "kernels still running after an interrupt ignore the abort flag"

    def _raise_abort(self) -> None:
        """Raise the abort flag: a plain store into pinned host memory, which no queued copy or
        kernel can hold back."""
        self.flags.raise_abort()

    def _error_message(self) -> str | None:
        e = self.flags.record()
        if not e.valid:
            return "aborted without an error record" if self.flags.aborted else None
        # the waited time is counted in the ticks of the reporting rank's platform
        pf = self.rank_pf[e.rank] if 0 <= e.rank < self.nranks else self.flags_pf
        return describe_stuck(self.ir, e, pf.ticks_per_us)

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
        for pf, p in self._allocs:
            try:
                pf.free(p)
            except Exception:
                pass
        self._allocs.clear()
        for pf in self._owned:
            pf.close()
        self._owned.clear()

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



# ============================================================================ helpers
def describe_stuck(ir: ProgramIR, e: ErrorRecord, ticks_per_us: float) -> str:
    """"rank R, TB T stuck in <op> for chunk C (micro-batch M)" plus what it waited for."""
    msg = (f"rank {e.rank}, TB {e.tb} stuck in {op_name(e.op)} for chunk {e.chunk} "
           f"(micro-batch {e.microbatch})")
    p = ir.prims
    hit = np.flatnonzero((p["rank"] == e.rank) & (p["tb"] == e.tb) & (p["seq"] == e.seq))
    peer = None
    if len(hit):
        i = int(hit[0])
        if e.wait == WAIT_DATA:
            peer = int(p["recv_peer"][i])
        elif e.wait == WAIT_SLOT:
            peer = int(p["send_peer"][i])
    what = {WAIT_DATA: f"waiting for data from rank {peer}" if peer is not None else "waiting for data",
            WAIT_SLOT: (f"waiting for a free FIFO slot towards rank {peer}" if peer is not None
                        else "waiting for a free FIFO slot"),
            WAIT_DEP: "waiting for another thread block of its rank"}.get(e.wait, "waiting")
    if e.wait == WAIT_COUNTS and e.chunk < 0:
        return (f"rank {e.rank}'s kernels refused the AllToAllv counts: they are not an AllToAll "
                "program's, and have no AllToAllv path")
    if e.wait == WAIT_COUNTS:
        N = max(1, int(ir.nranks))
        s, d = divmod(int(e.chunk), N)
        return (f"rank {e.rank}'s kernels refused the AllToAllv counts matrix: counts[{s}][{d}] is negative "
                "or its block's pieces exceed the scratch slots the call allocated")
    extra = [what, f"primitive {e.seq}"]
    if e.task >= 0:
        extra.append(f"task {e.task}")
    if ticks_per_us > 0:
        extra.append(f"gave up after {e.waited / ticks_per_us / 1e6:.3g} s")
    return msg + ": " + ", ".join(extra)


def run_program(ir: ProgramIR, *, backend: str | Platform = "cpu", nbytes: int, dtype: str = "float32",
                op: str = "sum", inplace: bool = False, iters: int = 1, warmup: int = 0,
                timeout_s: float = 10.0, seed: int = 0, nthreads: int | None = None,
                cache_dir=None, codegen: str = "specialized") -> RunResult:
    """Build, run once at ``nbytes`` and check (see :class:`Runner` for many sizes)."""
    with Runner(ir, backend, dtype, op, nthreads=nthreads, cache_dir=cache_dir,
                timeout_s=timeout_s, codegen=codegen) as runner:
        return runner.run(nbytes, inplace=inplace, iters=iters, warmup=warmup, seed=seed)


__all__ = ["RunResult", "Runner", "RankPlan", "RankMemory", "program_layout", "run_program",
           "busbw_factor", "generated_sources", "CODEGENS",
           "describe_stuck", "DTYPES", "OPS", "ELEMENT_BYTES"]
