"""Run a ProgramIR's emitted kernels on a platform and check them against the reference executor.
:class:`Runner` is the N ranks of a :class:`~hccc.runtime.rank_group.RankGroup` plus the oracle
(:mod:`hccc.runtime.oracle`).

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
compiled ``chunk_bytes``; :meth:`RankGroup.fit_fifos`), their head/tail counters, the progress counters of its TBs and its connection tables;
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

import math
from dataclasses import dataclass, field, fields

import numpy as np

from hccc.compiler.backend.codegen import buffer_bases
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import alltoallv as av, oracle, reference
from hccc.runtime.alltoallv_call import HostCounts, VCall, block_tables, buffer_lengths, device_lens
from hccc.runtime.busbw import busbw_factor
from hccc.runtime.platform import Platform
from hccc.runtime.rank_group import RankGroup
from hccc.util import dtypes as dtypes_table
from hccc.runtime.generated import CODEGENS, generated_sources
from hccc.runtime.memory_limits import check_run_memory, out_of_memory_at
from hccc.runtime.kernel_errors import describe_stuck
from hccc.runtime.rank_memory import LaunchCall, RankMemory, RankPlan

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
    #: micro-batch slice of the launch in bytes (:func:`~hccc.runtime.rank_memory.launch_slice_bytes`)
    slice_bytes: int = 0
    #: FIFO protocol the launch ran: "simple" or "ll" (:func:`~hccc.runtime.rank_memory.launch_proto`)
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


class Runner(RankGroup):
    """One build of ``ir`` for its platforms and one instance, run at any number of sizes: the N
    ranks of a :class:`~hccc.runtime.rank_group.RankGroup` (each with its :class:`RankMemory`,
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
    them first (:meth:`~hccc.runtime.rank_group.RankGroup.fit_fifos`, up to the compiled
    ``chunk_bytes``), :attr:`fifo_capacity` is what they hold now.

    Bookkeeping for callers and tests: :attr:`rank_platform` (manifest platform per rank),
    :attr:`platforms` (manifest platform -> Platform object), :attr:`libraries` (manifest platform
    -> the built module's path), :attr:`library_ranks` (manifest platform -> its ranks),
    :attr:`rank_library` (the library each rank's kernel was taken from); :attr:`platform` is rank
    0's Platform object; :attr:`block` the threads per block the ranks run and :attr:`threads_note`
    why they are fewer than emitted (or None); :attr:`proto_note` what the last run's protocol
    request changed (or None).
    """

    # ------------------------------------------------------------------ sizes
    def layout(self, count: int):
        """Per rank: (input length, output length, scratch length, input offset in output or
        -1, output offset in input or -1) in elements, for in-place aliasing
        (:func:`program_layout`)."""
        return program_layout(self.ir, count)

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
        :func:`~hccc.runtime.rank_memory.launch_proto` says when LL falls back, :attr:`RunResult.proto`
        what ran and :attr:`proto_note` why. ``checks`` (nccl-tests' ``-c N``, with ``check``): the outputs of the
        last timed launch are compared, then ``checks - 1`` more launches run, each from fresh
        inputs and compared; :attr:`RunResult.wrong` sums the wrong elements of all ``checks``."""
        self._check_usable()
        es = ELEMENT_BYTES[self.dtype]
        count = self._count_of(nbytes, count, es)
        # memory the system refuses (an address-space limit) is said as such, with the program and size
        with out_of_memory_at(f"running {self.ir.name} at {count * es} bytes"):
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
        """The call's element count (:func:`call_count`)."""
        return call_count(self.ir, self.dtype, nbytes, count)

    def _check_placement(self, inplace: bool, lay) -> None:
        """ValueError for a placement the program is not proven for or its buffers cannot take."""
        check_placement(self.ir, inplace, lay)

    def _inputs(self, inputs, lay, count: int, seed: int) -> list[np.ndarray]:
        """Every rank's input (:func:`run_inputs`)."""
        return run_inputs(self.ir, self.dtype, self.op, inputs, lay, count, seed)

    def _result(self, call: LaunchCall, nbytes: int, inplace: bool, times, stuck, wrong, first,
                **more) -> RunResult:
        return RunResult(bytes=nbytes, count=nbytes // call.element_bytes, dtype=self.dtype, op=self.op,
                         inplace=bool(inplace), wrong=int(wrong),
                         time_us=float(np.mean(times)) if times else float("nan"), stuck=stuck,
                         first_wrong=first, collective=self.ir.collective, nranks=self.nranks,
                         iters=len(times), slice_bytes=call.slice_bytes, proto=call.proto, **more)

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
        with out_of_memory_at(f"running {ir.name} as an AllToAllv"):
            if not SPECS[ir.collective].per_pair_counts:
                raise ValueError(f"{ir.name} is a {ir.collective}: per-pair counts need an AllToAll program")
            if bool(inplace) not in ir.placements:
                raise ValueError(f"{ir.name} is proven {'out of place' if inplace else 'in place'} only")
            c = av.as_counts(counts, N)
            send_lens, recv_lens = buffer_lengths(c, sdispls, rdispls, send_lens, recv_lens, inplace)
            vm, tables = self.vblocks(inplace)
            hc = HostCounts.check(c, N, vm.k, send_lens, recv_lens, sdispls, rdispls, inplace, pass_displs)
            es = ELEMENT_BYTES[self.dtype]
            call = LaunchCall.plan(ir, av.launch_count(hc.slot, vm.k, N), es, self.chunk_bytes, proto=proto,
                                   slice_bytes=slice_bytes)
            call.check(ir)
            scr_n = ir.scratch_chunks * hc.slot
            # before any buffer of the call exists, on the host (inputs, oracle) or the device
            check_run_memory(ir.name, sum(send_lens) * es,
                             (sum(send_lens) + (0 if inplace else sum(recv_lens)) + N * scr_n) * es)
            inputs, before = alltoallv_buffers(self.dtype, inputs, send_lens, recv_lens, inplace, seed)
            want = av.expected([np.array(x) for x in inputs], before, hc.counts, hc.sd, hc.rd)

            lens = device_lens(send_lens, recv_lens)

            def vcall(r, stage):   # (the kernels check the counts against every buffer too)
                return VCall(stage(np.ascontiguousarray(hc.counts.ravel())), stage(hc.displs),
                             stage(tables[r]), hc.slot, lens=stage(lens)), vm.uses_scratch

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


def run_inputs(ir: ProgramIR, dtype: str, op: str, inputs, lay, count: int, seed: int) -> list[np.ndarray]:
    """Every rank's input of a checked run at ``count`` elements (``lay``: the layout rows,
    :func:`program_layout`): the caller's ``inputs`` (one array per rank; float32 for bfloat16),
    checked against the layout (ValueError naming the rank), or small integers exact under every
    reduction order and type (:func:`hccc.runtime.oracle.make_inputs`, from ``seed``)."""
    N, coll = ir.nranks, ir.collective
    if inputs is None:
        inputs = oracle.make_inputs(ir, count, dtype, op, seed)
    else:
        npdt = np.dtype(dtypes_table.dtype(dtype).numpy)
        inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
        if len(inputs) != N:
            raise ValueError(f"expected {N} input arrays, got {len(inputs)}")
    for r in range(N):
        if len(inputs[r]) != lay[r][0]:
            raise ValueError(f"rank {r}: this program's input buffer holds {lay[r][0]} elements "
                             f"where a {coll} passes {len(inputs[r])}; the oracle cannot run it")
    return inputs


def alltoallv_buffers(dtype: str, inputs, send_lens, recv_lens, inplace: bool,
                      seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """An AllToAllv run's send buffers and what each rank's receive buffer holds before the call:
    the caller's ``inputs`` (one array per rank of its send length, ValueError otherwise) or small
    integers from ``seed``; in place the send buffer itself, else the oracle's garbage."""
    N = len(send_lens)
    npdt = np.dtype(dtypes_table.dtype(dtype).numpy)
    if inputs is None:
        rng = np.random.default_rng(seed)
        inputs = [rng.integers(-100, 101, size=int(n)).astype(npdt) for n in send_lens]
    else:
        inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
        if len(inputs) != N or any(len(x) != int(n) for x, n in zip(inputs, send_lens)):
            raise ValueError("inputs: one array per rank, of its send buffer's length")
    garbage = (oracle.GARBAGE[dtype], oracle.DEVICE_DTYPE[dtype])
    before = [np.array(inputs[r], copy=True) if inplace else
              oracle.from_device(np.full(int(recv_lens[r]), *garbage), dtype) for r in range(N)]
    return inputs, before


def call_count(ir: ProgramIR, dtype: str, nbytes: int | None, count: int | None) -> int:
    """A call's element count from exactly one of ``nbytes`` (a whole number of ``dtype``
    elements) and ``count`` (ValueError otherwise); an AllToAll's rounded to a whole number of
    equal blocks (:func:`hccc.runtime.reference.alltoall_count`)."""
    if (nbytes is None) == (count is None):
        raise ValueError("give exactly one of nbytes and count")
    if count is None:
        es = ELEMENT_BYTES[dtype]
        if nbytes < 0 or nbytes % es:
            raise ValueError(f"{nbytes} bytes is not a whole number of {dtype} elements "
                             f"({es} bytes each)")
        count = nbytes // es
    count = int(count)
    if count < 0:
        raise ValueError("count must be non-negative")
    return reference.alltoall_count(count, count_unit(ir))


def check_placement(ir: ProgramIR, inplace: bool, lay) -> None:
    """ValueError for a placement ``ir`` is not proven for or its buffers (``lay``: the layout rows
    of :func:`program_layout`) cannot take."""
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


def run_program(ir: ProgramIR, *, backend: str | Platform = "cpu", nbytes: int, dtype: str = "float32",
                op: str = "sum", inplace: bool = False, iters: int = 1, warmup: int = 0,
                timeout_s: float = 10.0, seed: int = 0, nthreads: int | None = None,
                cache_dir=None, codegen: str = "specialized") -> RunResult:
    """Build, run once at ``nbytes`` and check (see :class:`Runner` for many sizes)."""
    with Runner(ir, backend, dtype, op, nthreads=nthreads, cache_dir=cache_dir,
                timeout_s=timeout_s, codegen=codegen) as runner:
        return runner.run(nbytes, inplace=inplace, iters=iters, warmup=warmup, seed=seed)


__all__ = ["RunResult", "Runner", "RankPlan", "RankMemory", "program_layout", "check_placement", "call_count", "run_inputs", "alltoallv_buffers", "run_program",
           "busbw_factor", "generated_sources", "CODEGENS",
           "describe_stuck", "DTYPES", "OPS", "ELEMENT_BYTES"]
