"""Run a ProgramIR's emitted kernels on a platform and check them against the reference executor.
:class:`Runner` is the N process ranks of a :class:`~hccc.runtime.local_job.LocalJob` (one
:class:`~hccc.runtime.communicator.Communicator` per rank over the in-process bootstrap: the path a
job of one rank per process takes) plus the oracle (:mod:`hccc.runtime.oracle`).

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
state: per rank the FIFOs it receives on (``NSLOTS`` slots each, in the receiver's memory, sized
for the largest call run so far: a slot holds a slice of each chunk a message carries, at most the
compiled ``chunk_bytes``; :meth:`~hccc.runtime.local_job.LocalJob.fit_fifos`), their head/tail counters, the progress counters of its TBs and its connection tables;
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

from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.busbw import busbw_factor
from hccc.runtime.checked_run import (DTYPES, ELEMENT_BYTES, OPS, RunResult, alltoallv_buffers, call_count,
                                      check_placement, check_program_memory, program_layout, run_inputs)
from hccc.runtime.communicator import CommunicatorError
from hccc.runtime.generated import CODEGENS, DIRECT_MODES, GeneratedProgram, check_codegen, generated_sources
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.kernel_errors import IGNORES_ABORT, describe_stuck
from hccc.runtime.local_job import LocalJob
from hccc.runtime.memory_limits import check_fifo_memory, out_of_memory_at
from hccc.runtime.platform import Platform, PlatformError
from hccc.runtime.rank_memory import RankMemory, RankPlan
from hccc.runtime.rank_platforms import rank_platforms
from hccc.util import dtypes as dtypes_table

# ============================================================================ the runner
class Runner:
    """One build of ``ir`` for its platforms and one instance, run at any number of sizes: the N
    ranks of a :class:`~hccc.runtime.local_job.LocalJob` (each with its :class:`RankMemory`,
    launched through the one per-call recipe of :mod:`hccc.runtime.rank_memory`) plus the oracle
    (:mod:`hccc.runtime.oracle`): :meth:`run` and :meth:`run_v` make a call's inputs, launch it and
    compare the outputs.

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
    ``fifo_capacity``: the slot capacity to allocate the FIFOs with before anything is built (the
    largest :attr:`~hccc.runtime.rank_memory.LaunchCall.slot_cap` the caller will run, as ``hccc
    run`` gives its sweep's; default the least slot): a call that needs larger slots reallocates
    them first (:meth:`~hccc.runtime.local_job.LocalJob.fit_fifos`, up to the compiled
    ``chunk_bytes``), :attr:`fifo_capacity` is what they hold now.

    Bookkeeping for callers and tests: :attr:`rank_platform` (manifest platform per rank),
    :attr:`platforms` (manifest platform -> Platform object), :attr:`libraries` (manifest platform
    -> the built module's path), :attr:`library_ranks` (manifest platform -> its ranks),
    :attr:`rank_library` (the library each rank's kernel was taken from); :attr:`platform` is rank
    0's Platform object; :attr:`block` the threads per block the ranks run and :attr:`threads_note`
    why they are fewer than emitted (or None); :attr:`proto_note` what the last run's protocol
    request changed (or None); :attr:`job` is the :class:`~hccc.runtime.local_job.LocalJob` whose
    ranks run (each rank's state: ``job.comms[r]``).
    """

    def __init__(self, ir: ProgramIR, backend="cpu", dtype: str = "float32", op: str = "sum", *,
                 platforms: list[str] | None = None, nthreads: int | None = None, cache_dir=None,
                 timeout_s: float = 10.0, watchdog_s: float | None = None, codegen: str = "specialized",
                 one_grid: bool | None = None, direct: str = "auto", fifo_capacity: int | None = None):
        check_codegen(codegen)
        if direct not in DIRECT_MODES:
            raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")
        if SPECS[ir.collective].reduces:
            dtypes_table.check_instance(dtype, op)
        else:
            op = "sum"   # a collective that reduces nothing runs the same kernels under every op
        if nthreads is not None and int(nthreads) < 1:
            raise ValueError("nthreads must be positive")
        self.ir, self.dtype, self.op, self.codegen, self.direct = ir, dtype, op, codegen, direct
        self.nranks = int(ir.nranks)
        self.job = None
        self._closed = False
        # the FIFOs start at the least slot the kernels run (one 16-byte share per region), or the
        # caller's, and grow with the calls
        least = 16 * max(1, int(ir.max_step_chunks))
        prog = GeneratedProgram(ir, rank_platforms(ir.nranks, backend, platforms), cache_dir, codegen, direct)
        capacity = min(prog.chunk_bytes, max(least, int(fifo_capacity or least)))
        # every rank's FIFOs within the run's memory limit before anything is built (FifoMemoryError
        # with what they all need: hccc run shrinks the slot by it)
        check_fifo_memory(ir.name, prog.plans_with_capacity(capacity, ir.max_step_chunks))
        try:
            self.job = LocalJob(ir, backend=backend, dtype=dtype, op=op, platforms=platforms, nthreads=nthreads,
                                cache_dir=cache_dir, kernel_timeout_s=timeout_s, watchdog_s=watchdog_s,
                                codegen=codegen, direct=direct, proto="simple",
                                fifo_capacity=capacity)
            usable = self.job.grid_usable(dtype, op)
            if one_grid and not usable:
                raise PlatformError(f"cannot run {ir.name} as one grid: {self._why_no_grid()}")
            self._one_grid = usable if one_grid is None else bool(one_grid)
        except CommunicatorError as exc:
            self.close()
            raise PlatformError(str(exc)) from None
        except BaseException:
            self.close()
            raise
        #: the compiled slot capacity
        self.chunk_bytes = self.job.comms[0].compiled_chunk_bytes

    def _why_no_grid(self) -> str:
        """Why the ranks cannot be one launch of the one-grid entry (``one_grid=True`` refused)."""
        job = self.job
        if len({(id(c._pf), c.device) for c in job.comms}) > 1:
            return "its ranks are not all on one device of one platform"
        try:
            job._grid_entry(self.dtype, self.op)
        except CommunicatorError as exc:
            return str(exc)
        k = job.comms[0]._pf.launch_residency()
        blocks = sum(c.grid for c in job.comms)
        return (f"the launch is cooperative (its {blocks} blocks wait on each other) but at most {k} "
                "are resident at once")

    # ------------------------------------------------------------------ bookkeeping
    @property
    def rank_platform(self) -> list[str]:
        return list(self.job.comms[0].rank_platform)

    @property
    def library_ranks(self) -> dict:
        from hccc.runtime.rank_platforms import ranks_by_platform
        return ranks_by_platform(self.rank_platform)

    @property
    def platforms(self) -> dict:
        out = {}
        for c in self.job.comms:
            out.setdefault(c.rank_platform[c.rank], c._pf)
        return out

    @property
    def platform(self):
        return self.job.comms[0]._pf

    @property
    def libraries(self) -> dict:
        out = {}
        for c in self.job.comms:
            out.setdefault(c.rank_platform[c.rank], c._kernel(self.dtype, self.op).module.path)
        return out

    @property
    def rank_library(self) -> list:
        libs = self.libraries
        return [libs[p] for p in self.rank_platform]

    @property
    def single_gpu(self) -> bool:
        return len({(id(c._pf), c.device) for c in self.job.comms}) == 1

    @property
    def grid_fn(self):
        return self.job._grid_entry(self.dtype, self.op).fn if self._one_grid else None

    @property
    def block(self) -> int:
        return max(c.block for c in self.job.comms)

    @property
    def blocks(self) -> list[int]:
        return [c.block for c in self.job.comms]

    @property
    def threads_note(self):
        return self.job.threads_note

    @property
    def proto_note(self):
        return self.job.proto_note

    @property
    def fifo_capacity(self) -> int:
        return self.job.fifo_capacity

    @property
    def timeout_s(self) -> float:
        """The kernels' spin-wait limit of the runs (every rank's ``kernel_timeout_s``)."""
        return self.job.comms[0].kernel_timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        for c in self.job.comms:
            c.kernel_timeout_s = float(value)

    @property
    def watchdog_s(self):
        return self.job.watchdog_s

    @watchdog_s.setter
    def watchdog_s(self, value) -> None:
        self.job.watchdog_s = value
        for c in self.job.comms:
            c.watchdog_s = value

    def default_watchdog(self, nbytes: int) -> float:
        return self.job.default_watchdog(nbytes)

    def direct_receives(self) -> int:
        return self.job.direct_receives()

    def stop_kernels(self) -> None:
        if self.job is not None:
            self.job.stop_kernels()

    def fit_fifos(self, capacity: int) -> None:
        self.job.fit_fifos(capacity)

    # ------------------------------------------------------------------ sizes
    def layout(self, count: int):
        """Per rank: (input length, output length, scratch length, input offset in output or
        -1, output offset in input or -1) in elements, for in-place aliasing
        (:func:`program_layout`)."""
        return program_layout(self.ir, count)

    def vblocks(self, inplace: bool = False):
        """The program's block-piece tables for AllToAllv (:func:`hccc.runtime.alltoallv_call.block_tables`),
        computed once per placement; VBlockError when the program cannot run with per-pair counts."""
        return self.job.vblocks(inplace)

    def _check_usable(self) -> None:
        if self._closed or self.job is None:
            raise PlatformError("runner is closed")
        for c in self.job.comms:
            if c._no_fifos:
                raise PlatformError(f"runner is unusable: {c._no_fifos}")
        for c in self.job.comms:
            if c._broken and IGNORES_ABORT in c._broken:
                raise PlatformError(f"the {c._pf.name} platform is unusable after an earlier run: {c._broken}")

    def _call(self, make):
        """``make()`` (a run of the job), its failures before any kernel said as the runner says
        them (PlatformError), and the job run again after Ctrl-C."""
        self._check_usable()
        try:
            return make()
        except CommunicatorError as exc:
            why = str(exc)
            raise PlatformError(why) from None
        except KeyboardInterrupt:
            with deferred_interrupts():
                try:
                    self.job.recover()
                except Exception:
                    pass
            raise

    # ------------------------------------------------------------------ one run
    def run(self, nbytes: int | None = None, *, count: int | None = None, inplace: bool = False,
            iters: int = 1, warmup: int = 0, seed: int = 0, timeout_s: float | None = None,
            nthreads: int | None = None, check: bool = True, inputs: list | None = None,
            keep_outputs: bool = False, slice_bytes: int | str = "auto", proto: str = "simple",
            checks: int = 1) -> RunResult:
        """Run at ``nbytes`` (the collective's full buffer, see the module docstring) or ``count``
        elements; returns a :class:`RunResult` (never raises for wrong results or stuck kernels):
        the job's :meth:`~hccc.runtime.local_job.LocalJob.run`, launched together."""
        es = ELEMENT_BYTES[self.dtype]
        n = call_count(self.ir, self.dtype, nbytes, count)
        with out_of_memory_at(f"running {self.ir.name} at {n * es} bytes"):
            return self._call(lambda: self.job.run(
                count=n, dtype=self.dtype, op=self.op, seed=seed, together=True,
                direct=self.direct == "auto", one_grid=self._one_grid, warmup=warmup, iters=iters,
                inplace=inplace, proto=proto, slice_bytes=slice_bytes, checks=checks,
                keep_outputs=keep_outputs, nthreads=nthreads, timeout_s=timeout_s, inputs=inputs,
                check=check))

    def run_v(self, counts, *, sdispls=None, rdispls=None, send_lens=None, recv_lens=None,
              inplace: bool = False, inputs: list | None = None, seed: int = 0, iters: int = 1,
              warmup: int = 0, timeout_s: float | None = None, slice_bytes: int | str = "auto",
              proto: str = "simple", pass_displs: bool | None = None, keep_outputs: bool = False) -> RunResult:
        """Run the AllToAll program as an AllToAllv (:meth:`~hccc.runtime.local_job.LocalJob.run_v`)."""
        with out_of_memory_at(f"running {self.ir.name} as an AllToAllv"):
            return self._call(lambda: self.job.run_v(
                counts, sdispls=sdispls, rdispls=rdispls, send_lens=send_lens, recv_lens=recv_lens,
                inplace=inplace, inputs=inputs, seed=seed, warmup=warmup, iters=iters,
                keep_outputs=keep_outputs, dtype=self.dtype, pass_displs=pass_displs, proto=proto,
                slice_bytes=slice_bytes, timeout_s=timeout_s, together=True,
                direct=self.direct == "auto", one_grid=self._one_grid))

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.job is not None:
            with deferred_interrupts():
                self.job.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_program(ir: ProgramIR, *, backend: str | Platform = "cpu", nbytes: int, dtype: str = "float32",
                op: str = "sum", inplace: bool = False, iters: int = 1, warmup: int = 0,
                timeout_s: float = 10.0, seed: int = 0, nthreads: int | None = None,
                cache_dir=None, codegen: str = "specialized") -> RunResult:
    """Build, run once at ``nbytes`` and check (see :class:`Runner` for many sizes)."""
    with Runner(ir, backend, dtype, op, nthreads=nthreads, cache_dir=cache_dir,
                timeout_s=timeout_s, codegen=codegen) as runner:
        return runner.run(nbytes, inplace=inplace, iters=iters, warmup=warmup, seed=seed)


__all__ = ["RunResult", "Runner", "RankPlan", "RankMemory", "program_layout", "check_placement", "call_count",
           "run_inputs", "alltoallv_buffers", "check_program_memory", "run_program",
           "busbw_factor", "generated_sources", "CODEGENS",
           "describe_stuck", "DTYPES", "OPS", "ELEMENT_BYTES"]
