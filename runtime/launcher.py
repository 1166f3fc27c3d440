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
import json
import math
import threading
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

import numpy as np

from hccc.compiler.frontend.collectives import SPECS, spec_of
from hccc.util import dtypes as dtypes_table
from hccc.util.limits import printable
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import IRFormatError, ProgramIR
from hccc.compiler.backend.codegen import WARP_SIZE, buffer_bases
from hccc.util.plural import plural

from hccc.runtime import cache, reference
from hccc.runtime.busbw import busbw_factor
from hccc.compiler.backend import abi
from hccc.runtime.kernel_abi import (WAIT_COUNTS, WAIT_DATA, WAIT_DEP, WAIT_SLOT, Args, ErrorRecord, TableArgs,
                                     grid_first, op_name)
from hccc.runtime.gpu import grid_symbol
from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.ll_epoch import LLEpochs
# the per-call recipe and what a rank owns (re-exported: callers import them from here too)
from hccc.runtime.rank_memory import (LaunchCall, RankMemory, RankPlan, check_slice, grid_argument,
                                      launch_proto, launch_slice_bytes)
from hccc.runtime.platform import Instance, Platform, PlatformError, get_platform

#: the least time kernels get to end after the abort flag is raised by an interrupt or an error
#: (the watchdog's own grace, :meth:`Runner._wait`: at least this, or twice the spin-wait timeout);
#: a kernel ends at its next wait, which comes within a primitive's copy of at most one slot
STOP_GRACE_S = 5.0

#: element types and reduction operators (the one table of them: hccc.util.dtypes)
DTYPES = dtypes_table.DTYPE_NAMES
OPS = dtypes_table.OP_NAMES
ELEMENT_BYTES = {d.name: d.bytes for d in dtypes_table.DTYPES}
#: how the host holds a device buffer's elements (bfloat16: its bit patterns)
_DEVICE_DTYPE = {d.name: (np.uint16 if d.name == "bfloat16" else np.dtype(d.numpy).type)
                 for d in dtypes_table.DTYPES}
#: what out-of-place outputs and scratch start as (a NaN, the most negative integer, 0xA5 for
#: uint8), so that an element never written shows up
_GARBAGE = {d.name: (np.uint16(0x7FC0) if d.name == "bfloat16" else np.dtype(d.numpy).type(np.nan)
                     if d.floating else np.dtype(d.numpy).type(0xA5 if d.kind == "uint" else np.iinfo(d.numpy).min))
            for d in dtypes_table.DTYPES}
#: largest magnitude every partial sum of the inputs may reach and stay exact in the type
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


_EXACT = {d.name: d.exact for d in dtypes_table.DTYPES}


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


# ============================================================================ generation cache
_TEMPLATES_DIGEST: str | None = None


def _templates_digest() -> str:
    """Digest of what renders the emitted sources: the templates and the code generator's modules
    (``hccc.compiler.backend``: the ABI facts the templates render among them)."""
    global _TEMPLATES_DIGEST
    if _TEMPLATES_DIGEST is None:
        parts = []
        for pkg, pattern in (("hccc.templates", "*"), ("hccc.compiler.backend", "*.py")):
            root = Path(str(resources.files(pkg)))
            files = [p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts]
            parts.append(cache.files_digest(files, root))
        _TEMPLATES_DIGEST = cache.content_key("renderers", *parts)
    return _TEMPLATES_DIGEST


def generated_sources(ir: ProgramIR, platform: str | list[str], cache_dir=None,
                      codegen: str = "specialized", direct: str = "auto") -> Path:
    """Directory with ``ir``'s emitted sources and manifest, from the cache (keyed by the IR JSON,
    the platforms, the code-generation mode, the templates and code generator (:func:`_templates_digest`)
    and the hccc version). ``platform``:
    "cuda" or "hip" for every rank, or one of them per rank (a mixed-vendor program).
    ``codegen``: "specialized" (a kernel per rank) or "table" (tables for the generic kernels).
    ``direct``: "auto" (direct mode for the receives proven safe) or "off" (the FIFO everywhere)."""
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.backend.table_codegen import generate_table

    if codegen not in CODEGENS:
        raise ValueError(f"unknown codegen {codegen!r} (expected one of {', '.join(CODEGENS)})")

    per_rank = [platform] * ir.nranks if isinstance(platform, str) else [str(p) for p in platform]
    if len(per_rank) != ir.nranks:
        raise ValueError(f"{len(per_rank)} rank platforms for a program of {ir.nranks} ranks")
    text = ir.to_json()
    if direct not in DIRECT_MODES:
        raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
    key = cache.content_key("generated", codegen, ",".join(per_rank), _templates_digest(), text,
                            *(("direct=off",) if direct == "off" else ()))

    def make(tmp: Path) -> None:
        (generate_table if codegen == "table" else generate)(ir, tmp, platforms=per_rank, direct=direct)

    return cache.entry("gen", key, make, root=cache_dir)


# ============================================================================ the runner
def _chunk_lo(bounds: np.ndarray, count: int, nchunks: int, j: int) -> int:
    """First element of chunk slot ``j`` (slots past ``nchunks`` wrap into a further copy)."""
    return (j // nchunks) * count + int(bounds[j % nchunks])


MANIFEST_PLATFORMS = ("cuda", "hip")
#: code-generation modes: a specialised kernel per rank, or generic kernels running tables
CODEGENS = ("specialized", "table")
#: direct mode of the generated kernels (:func:`hccc.compiler.backend.codegen.generate`)
DIRECT_MODES = ("auto", "off")


def rank_ranges(ranks) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    rs = sorted(set(int(r) for r in ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(f"{rs[i]}" if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def _platform_label(backend) -> str:
    return backend if isinstance(backend, str) else (getattr(backend, "name", "") or type(backend).__name__)


# ============================================================================ what one rank owns
def fit_block_threads(block: int, platform: str, fits, least: int | None = None) -> tuple[int, str | None]:
    """The most threads per block, from ``block`` halving down to ``least`` (default: one warp of
    ``platform``, "cuda" / "hip"; the running platform's :meth:`Platform.least_block_threads`),
    for which ``fits(threads)`` holds, and a note saying so when that is fewer than ``block``;
    ``(block, None)`` when ``block`` fits or nothing does (the caller refuses)."""
    b = int(block)
    floor = WARP_SIZE.get(platform, 32) if least is None else int(least)
    while not fits(b) and b // 2 >= floor:
        b //= 2
    if b == block or not fits(b):
        return int(block), None
    return b, (f"{plural(b, 'thread')} per thread block instead of the emitted {block}, so that every block "
               "of the kernel is resident at once")


def rank_blocks(manifest: dict, entry: dict) -> int:
    """Blocks of a rank's launch: ``nchannels`` x its thread blocks (manifest ``blocks``)."""
    return int(entry.get("blocks", max(1, int(manifest.get("nchannels", 1))) * int(entry["tbs"])))


class Runner:
    """One build of ``ir`` for its platforms and one instance, run at any number of sizes.

    ``backend``: ``"cpu"`` (every manifest platform emulated on the CPU, one
    :class:`~hccc.runtime.cpu.CpuPlatform` per platform present), ``"cuda"`` / ``"hip"`` (a
    program whose ranks are all of that platform), a :class:`Platform` object (used for every
    platform it :meth:`~Platform.runs_sources`), or a dict from manifest platform to a name or a
    Platform object, e.g. ``{"cuda": CpuPlatform(), "hip": CpuPlatform()}``.
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
        if codegen not in CODEGENS:
            raise ValueError(f"unknown codegen {codegen!r} (expected one of {', '.join(CODEGENS)})")
        self.codegen = codegen
        if direct not in DIRECT_MODES:
            raise ValueError(f"unknown direct mode {direct!r} (expected one of {', '.join(DIRECT_MODES)})")
        self.direct = direct
        self._one_grid = one_grid
        self.table_ptr: list[int] = []
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
        self.ir = ir
        self.dtype, self.op = dtype, op
        self.timeout_s = float(timeout_s)
        self.watchdog_s = watchdog_s
        self._allocs: list[tuple[Platform, int]] = []
        self._owned: list[Platform] = []
        self._broken: str | None = None
        self._closed = False
        try:
            self.rank_platform = self._rank_platforms(backend, platforms)
            self.platforms = self._resolve(backend)
            N = ir.nranks
            self.rank_pf: list[Platform] = [self.platforms[p] for p in self.rank_platform]
            self.platform = self.rank_pf[0] if N else next(iter(self.platforms.values()), None)
            self._setup(nthreads, cache_dir)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ platforms
    def _rank_platforms(self, backend, platforms) -> list[str]:
        N = self.ir.nranks
        if platforms is None:
            if isinstance(backend, dict):
                keys = sorted(backend)
                if len(keys) != 1:
                    raise ValueError("a backend per platform needs the rank platforms "
                                     "(Runner(..., platforms=[...]))")
                default = keys[0]
            elif isinstance(backend, str):
                default = "hip" if backend == "hip" else "cuda"
            else:
                default = backend.source_platform or "cuda"
            return [default] * N
        out = [str(p) for p in platforms]
        if len(out) != N:
            raise ValueError(f"{len(out)} rank platforms for a program of {N} ranks")
        bad = [r for r, p in enumerate(out) if p not in MANIFEST_PLATFORMS]
        if bad:
            raise ValueError(f"rank {bad[0]}: unknown platform {out[bad[0]]!r} "
                             f"(expected {' or '.join(MANIFEST_PLATFORMS)})")
        return out

    def _ranks_of(self) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for r, p in enumerate(self.rank_platform):
            groups.setdefault(p, []).append(r)
        return dict(sorted(groups.items()))

    def _resolve(self, backend) -> dict[str, Platform]:
        """Manifest platform -> Platform object for every platform present; refuses mappings that
        cannot run (a platform that cannot run those sources, platforms without shared memory)."""
        groups = self._ranks_of()
        if isinstance(backend, dict):
            unknown = sorted(set(backend) - set(MANIFEST_PLATFORMS))
            if unknown:
                raise ValueError(f"backend keys are manifest platforms ({', '.join(MANIFEST_PLATFORMS)}), "
                                 f"not {unknown[0]!r}")
            missing = [p for p in groups if p not in backend]
            if missing:
                raise PlatformError(f"no backend for the {missing[0]} ranks "
                                    f"{rank_ranges(groups[missing[0]])} of {self.ir.name}")
            spec = {p: backend[p] for p in groups}
        elif isinstance(backend, str) and backend == "cpu":
            spec = {p: "cpu" for p in groups}
        else:
            if isinstance(backend, str) and backend not in MANIFEST_PLATFORMS:
                backend = get_platform(backend)       # a registered platform (or: unknown backend)
                self._owned.append(backend)
            spec = {p: backend for p in groups}
        # one platform kind may serve several manifest platforms only if it runs their sources
        if not isinstance(backend, dict) and not (isinstance(backend, str) and backend == "cpu"):
            label = _platform_label(backend)
            for p, rs in groups.items():
                own = backend if isinstance(backend, str) else backend.source_platform
                ok = (p == own) if isinstance(backend, str) else backend.runs_sources(p)
                if not ok:
                    raise PlatformError(
                        f"{self.ir.name}: ranks {rank_ranges(rs)} are {p.upper()} ranks and the {label} "
                        f"backend runs {str(own).upper()} programs only; run a mixed program with the "
                        "cpu backend (every platform emulated on the CPU) or compile it for one "
                        "platform (--target cuda|hip)")
        # memory: FIFOs live in the receiver's memory, flags in rank 0's: every pair must share it
        # (named backends of different kinds are refused before any of them is started)
        if len({v for v in spec.values() if isinstance(v, str)}) > 1:
            self._refuse_unshared(groups, {p: _platform_label(v) for p, v in spec.items()})
        out: dict[str, Platform] = {}
        made: dict[str, Platform] = {}
        for p, v in spec.items():
            if isinstance(v, str):
                if v == "cpu":
                    from hccc.runtime.cpu import CpuPlatform
                    pf = CpuPlatform(source_platform=p)
                    self._owned.append(pf)
                elif v in made:
                    pf = made[v]
                else:
                    pf = made[v] = get_platform(v)
                    self._owned.append(pf)
            else:
                pf = v
            if not pf.runs_sources(p):
                raise PlatformError(f"{self.ir.name}: the {pf.name} platform cannot run the {p.upper()} "
                                    f"ranks {rank_ranges(groups[p])}")
            out[p] = pf
        pfs = list(out.items())
        for i, (p, a) in enumerate(pfs):
            for q, b in pfs[i + 1:]:
                if not (a.shares_memory_with(b) and b.shares_memory_with(a)):
                    self._refuse_unshared(groups, {p: a.name, q: b.name})
        return out

    def _refuse_unshared(self, groups: dict[str, list[int]], names: dict[str, str]) -> None:
        """PlatformError naming the ranks of each platform and the connections that cross them."""
        plat = {r: p for p, rs in groups.items() for r in rs}
        p = self.ir.prims
        cross = sorted({(int(s), int(d)) for s, d in zip(p["rank"].tolist(), p["send_peer"].tolist())
                        if d >= 0 and s in plat and d in plat and plat[s] != plat[d]})
        sides = "; ".join(f"{pl.upper()} ranks {rank_ranges(groups[pl])} on {names[pl]}" for pl in names)
        what = ", ".join(f"rank {s} ({plat[s]}) -> rank {d} ({plat[d]})" for s, d in cross[:4])
        more = f" and {len(cross) - 4} more" if len(cross) > 4 else ""
        raise PlatformError(
            f"cannot run {self.ir.name} in one process with {sides}: these runtimes share no memory, "
            "and a sender writes its FIFO slots and counters into the receiver's memory"
            + (f" ({what}{more})" if cross else " (the abort flag and error record are shared too)")
            + "; use the cpu backend (every platform emulated on the CPU, host memory) or run the "
            "ranks of each platform in their own process")

    # ------------------------------------------------------------------ setup
    def _setup(self, nthreads, cache_dir) -> None:
        ir = self.ir
        distinct: list[Platform] = []
        for pf in self.platforms.values():
            if not any(pf is q for q in distinct):
                distinct.append(pf)
        self._distinct = distinct
        for pf in distinct:
            if cache_dir is not None and hasattr(pf, "cache_dir"):
                pf.cache_dir = cache_dir
        self.gendir = generated_sources(ir, self.rank_platform, cache_dir, self.codegen, self.direct)
        self.manifest = man = json.loads((self.gendir / "manifest.json").read_text())
        self.nranks = N = int(man["nranks"])
        self.nslots = int(man["nslots"])
        self.chunk_bytes = int(man["chunk_bytes"])
        ranks = man["ranks"]
        if [e["platform"] for e in ranks] != self.rank_platform:
            raise PlatformError("generated manifest disagrees with the rank platforms")
        # the FIFOs must fit before anything is built
        self.slot_bytes = int(man.get("slot_bytes", self.chunk_bytes))
        self.rank_plans = [RankPlan.from_manifest(man, r) for r in range(N)]
        check_fifo_memory(self.ir.name, self.rank_plans)
        #: blocks per rank: channels x thread blocks
        self.grid = [rank_blocks(man, e) for e in ranks]
        self.library_ranks = self._ranks_of()
        self.block_of: dict[str, int] = {}
        for p, pf in self.platforms.items():
            emitted = int(man["nthreads"].get(p, 1))
            self.block_of[p] = int(nthreads) if nthreads is not None else max(1, pf.block_threads(emitted))
        self.blocks = [self.block_of[p] for p in self.rank_platform]
        #: threads per thread block (the largest when the platforms differ)
        self.block = max(self.blocks) if self.blocks else 1
        # devices: each Platform object places the ranks it runs
        self.placement = [0] * N
        for pf in distinct:
            rs = [r for r in range(N) if self.rank_pf[r] is pf]
            for r, d in zip(rs, pf.placement(len(rs))):
                self.placement[r] = int(d)
            devices = sorted({self.placement[r] for r in rs})
            if len(devices) > 1:
                pf.enable_peer_access(devices)

        #: every rank on one device of one platform: the kernels order memory at GPU scope
        self.single_gpu = len(distinct) == 1 and len(set(self.placement)) <= 1
        # one library per manifest platform, from exactly that platform's ranks, through its platform
        inst = Instance(self.dtype, self.op)
        self.libraries: dict[str, Path] = {}
        self.modules = {}
        for p, rs in self.library_ranks.items():
            pf = self.platforms[p]
            scope = {"single_gpu": True} if self.single_gpu else {}   # system scope: the default
            self.libraries[p] = Path(pf.build(self.gendir, man, inst, ranks=rs, **scope))
            self.modules[p] = pf.load(self.libraries[p])
        self.module = self.modules[self.rank_platform[0]] if N else None
        pattern = man.get("kernel_symbol", "{kernel}_{dtype}_{op}")
        self.fns = []
        self.rank_library: list[Path] = []
        for r, e in enumerate(ranks):
            sym = (pattern.replace("{kernel}", e["kernel"]).replace("{dtype}", self.dtype)
                   .replace("{op}", self.op))
            p = self.rank_platform[r]
            self.fns.append(self.modules[p].function(sym))
            self.rank_library.append(self.libraries[p])
        self.grid_fn = self._grid_function(man, inst)
        self._fit_threads(nthreads is None)

        # size-independent memory (kernel protocol v2, see RankPlan): per rank, in memory its
        # peers reach (Platform.malloc_peer), the FIFO slots it receives on and a control block
        # [tail of each receive connection | head of each send connection | head of each receive
        # connection nobody sends on | progress counters]: tail lives with the receiver and head
        # with the sender, so each end polls locally. The same code allocates a one-rank-per-
        # process Communicator's memory.
        self.rank_mem = [RankMemory(self.rank_plans[r], self.rank_pf[r],
                                    lambda n, r=r: self._malloc(r, n, peer=True),
                                    lambda n, r=r: self._malloc(r, n))
                         for r in range(N)]
        for r in range(N):
            self.rank_mem[r].connect(self.rank_plans,
                                     lambda peer: (self.rank_mem[peer].ctrl, self.rank_mem[peer].slots))
        #: LL flag epochs of these FIFOs (:mod:`hccc.runtime.ll_epoch`): the slots are zeroed only
        #: before the first LL launch, after Simple ones and when the epochs wrap
        self.ll_epochs = LLEpochs()
        self.ctrl = [m.ctrl for m in self.rank_mem]
        self.ctrl_bytes = [m.plan.ctrl_bytes for m in self.rank_mem]
        self.prog_ptr = [m.progress for m in self.rank_mem]
        self.slots_ptr = [m.slots for m in self.rank_mem]
        self.send_tab = [m.send_tab for m in self.rank_mem]
        self.recv_tab = [m.recv_tab for m in self.rank_mem]
        #: sends nobody receives: (rank, FIFO, header bytes), the FIFO in the sender's memory
        self.orphans = [(r, f, abi.ORPHAN_HEADER) for r, m in enumerate(self.rank_mem) for f in m.orphans]
        if man.get("codegen") == "table":
            self._upload_tables(man)
        # The abort flag: pinned, mapped host memory, which the host raises with a plain store
        # (a copy could queue behind the spinning kernels). The error record: rank 0's memory
        # (every rank's kernels reach it; the first to time out claims it with a CAS).
        self.flags_pf = self.platform
        self.abort_ptr = self.flags_pf.host_flags(64)
        self._allocs.append((self.flags_pf, self.abort_ptr))
        self.error_ptr = self._malloc(0 if N else None, ctypes.sizeof(ErrorRecord))
        self.streams = []
        for r in range(N):
            self.rank_pf[r].set_device(self.placement[r])
            self.streams.append(self.rank_pf[r].stream())
        if self.grid_fn is not None:
            # the one-grid entry's argument: every rank's kernel argument, in one array on the
            # device (filled per run); the table mode's entry also reads the first block of
            # each rank from device memory (the specialised entry has it compiled in)
            self._grid_arg_bytes = ctypes.sizeof(TableArgs if self.table_ptr else Args)
            self.grid_args_ptr = self._malloc(0, N * self._grid_arg_bytes)
            if self.table_ptr:
                first = grid_first(self.grid)
                self.grid_first_ptr = self._malloc(0, len(first))
                self.rank_pf[0].memcpy_htod(self.grid_first_ptr, np.frombuffer(first, np.uint8))

    def _grid_function(self, man: dict, inst: Instance):
        """The one-grid entry to launch (see the class docstring's ``one_grid``), or None."""
        if self._one_grid is False or not self.nranks:
            return None
        p = self.rank_platform[0]
        sym = grid_symbol(man, p, inst) if self.single_gpu else None
        fn = None
        if sym is not None:
            try:
                fn = self.modules[p].function(sym)
            except PlatformError:
                fn = None
        if fn is None and self._one_grid:
            why = ("its ranks are not all on one device of one platform" if not self.single_gpu
                   else "the generated sources have no one-grid entry (regenerate them)")
            raise PlatformError(f"cannot run {self.ir.name} as one grid: {why}")
        return fn

    def _upload_tables(self, man: dict) -> None:
        """Check every rank's table against the manifest and copy it to the rank's memory."""
        from hccc.compiler.backend.table_format import TableFormatError
        from hccc.compiler.backend.table_program import load_tables, read_table
        try:
            path, data = read_table(self.gendir, man)
            tables = load_tables(data, man, None, path.name)
        except (OSError, TableFormatError) as exc:
            raise PlatformError(f"cannot use the tables of {self.ir.name}: {exc}") from None
        for r in range(self.nranks):
            self.table_ptr.append(self.rank_mem[r].load_table(tables[r][1]))

    def _fit_threads(self, auto: bool) -> None:
        """Check that every block of the run can be resident at once; with ``auto`` threads (no
        ``nthreads`` given), halve the threads per block (down to one warp on a GPU, one thread on
        the CPU emulation: :meth:`Platform.least_block_threads`) until they can, and say
        so in :attr:`threads_note` (the kernels take any block size up to the emitted one)."""
        #: what was chosen instead of the emitted threads per block, and why (None: as emitted)
        self.threads_note = None
        #: what the last run's protocol request changed, or None: why LL ran Simple
        #: (:func:`launch_proto`), or that its direct-mode receives went through the FIFO as LL lines
        self.proto_note = None
        self._direct_receives: int | None = None
        first = dict(self.block_of)
        while True:
            try:
                self._check_residency()
                break
            except PlatformError as exc:
                smaller = {p: b // 2 if b // 2 >= self.platforms[p].least_block_threads(p) else b
                           for p, b in self.block_of.items()}
                if not auto or smaller == self.block_of:
                    raise
                why = str(exc)
                self.block_of = smaller
                self.blocks = [self.block_of[p] for p in self.rank_platform]
                self.block = max(self.blocks) if self.blocks else 1
        if self.block_of != first:
            self.threads_note = (
                f"{plural(self.block, 'thread')} per thread block instead of the emitted {max(first.values())}, so "
                f"that every block of the run is resident at once ({why.split(': ', 1)[-1]})")

    def _check_residency(self, block: int | None = None) -> None:
        """Every TB of every rank must be resident at once (they spin on each other)."""
        by_dev: dict[tuple[int, int], list[int]] = {}
        for r, d in enumerate(self.placement):
            if self.grid[r] > 0:
                by_dev.setdefault((id(self.rank_pf[r]), d), []).append(r)
        for (_, d), rs in by_dev.items():
            pf = self.rank_pf[rs[0]]
            pf.set_device(d)
            blk = {r: (self.blocks[r] if block is None else block) for r in rs}
            need = sum(self.grid[r] for r in rs)
            b = max(blk.values())
            if self.grid_fn is not None:     # one launch: the entry's own occupancy counts
                cap = pf.max_resident_blocks(self.grid_fn, b)
            else:
                cap = min(pf.max_resident_blocks(self.fns[r], blk[r]) for r in rs)
            if need > cap:
                raise PlatformError(
                    f"cannot run {self.ir.name} on {pf.name}: its {len(rs)} ranks on "
                    f"device {d} need {need} thread blocks of {b} threads resident at once, "
                    f"but at most {cap} fit; {pf.residency_advice(need, b)}")

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
        count = reference.alltoall_count(count, count_unit(self.ir))  # AllToAll: equal blocks
        if iters < 1 or warmup < 0 or checks < 1:
            raise ValueError("iters and checks must be >= 1 and warmup >= 0")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        # the call's protocol, slice and message bound: the one recipe (hccc.runtime.rank_memory)
        call = LaunchCall.plan(self.ir, count, es, self.chunk_bytes, proto=proto, slice_bytes=slice_bytes)
        proto_run, slice_b, self.proto_note = call.proto, call.slice_bytes, call.note
        call.check(self.ir)
        block = self.block if nthreads is None else int(nthreads)
        if block < 1:
            raise ValueError("nthreads must be positive")
        blocks = self.blocks if nthreads is None else [block] * self.nranks
        if nthreads is not None and blocks != self.blocks:
            self._check_residency(block)
        ir, N = self.ir, self.nranks
        coll = ir.collective
        lay = self.layout(count)
        check_run_memory(self.ir.name, count * es, sum(a + b + c for a, b, c, _, _ in lay) * es)
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

        # inputs (small integers: exact under every reduction order and type)
        if inputs is None:
            bound = max(1, min(8, _EXACT[self.dtype] // max(N, 1)))
            if self.op == "prod":   # every partial product exact: bound ** N within the range
                bound = max(1, min(8, int(_EXACT[self.dtype] ** (1.0 / max(N, 1)))))
            inputs = reference.make_inputs(coll, N, count, self.dtype, nchunks=ir.nchunks,
                                           seed=seed, low=-bound, high=bound + 1)
        else:
            npdt = np.dtype(dtypes_table.dtype(self.dtype).numpy)
            inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
            if len(inputs) != N:
                raise ValueError(f"expected {N} input arrays, got {len(inputs)}")
        for r in range(N):
            if len(inputs[r]) != lay[r][0]:
                raise ValueError(f"rank {r}: this program's input buffer holds {lay[r][0]} elements "
                                 f"where a {coll} passes {len(inputs[r])}; the oracle cannot run it")
        dev_inputs = [_to_device(x, self.dtype) for x in inputs]

        # size-dependent buffers
        bufs = []
        try:
            self._alloc_buffers(bufs, lay, inplace, es)
            argv = [m.args(call, input=bufs[r][0], output=bufs[r][1], scratch=bufs[r][2],
                           abort_flag=self.abort_ptr, error=self.error_ptr, timeout_s=timeout)
                    for r, m in enumerate(self.rank_mem)]
            if proto_run == "ll":
                # LL: every message through the FIFO as lines (no peers array, so the kernels'
                # direct-marked primitives take the FIFO path; both ends of a message agree)
                if self.proto_note is None and self._peers_usable() and self.direct_receives():
                    n = self.direct_receives()
                    self.proto_note = (f"{n} direct-mode receive{'s' if n != 1 else ''} of {ir.name} "
                                       "run through the FIFO as LL lines (a direct write lands in the "
                                       "receiver's buffer, which has no room for LL's flags)")
            else:
                self._set_peers(argv, bufs)
            limit = self.watchdog_s if self.watchdog_s is not None else self.default_watchdog(count * es)

            def launch():
                return self._launch_once(call, argv, bufs, lay, dev_inputs, blocks, limit)

            def outputs():
                return self._read_outputs(bufs, [row[1] for row in lay])

            times, stuck = self._timed_launches(launch, warmup, iters)

            wrong, first, coll_wrong, outs, oracle, checked = 0, None, 0, None, None, 0
            if stuck is None and (check or keep_outputs):
                outs = outputs()
                if check:
                    wrong, first, coll_wrong, oracle = self._compare(outs, inputs, inplace)
                    checked = 1
                    # nccl-tests' -c N: N checked launches (the first is the last timed one)
                    for _ in range(checks - 1):
                        _, stuck = launch()
                        if stuck is not None:
                            break
                        w, f, _, _ = self._compare(outputs(), inputs, inplace)
                        wrong += w
                        checked += 1
                        first = first if first is not None else f
        except BaseException:
            # Ctrl-C (or any error) while kernels may still run: they stop before the buffers
            # they use are freed below
            self.stop_kernels()
            raise
        finally:
            self._free_buffers(bufs)
        return RunResult(bytes=count * es, count=count, dtype=self.dtype, op=self.op,
                         inplace=bool(inplace), wrong=int(wrong),
                         time_us=float(np.mean(times)) if times else float("nan"), stuck=stuck,
                         first_wrong=first, collective=coll, nranks=N, iters=len(times),
                         collective_wrong=int(coll_wrong) if check else -1, nthreads=block,
                         outputs=outs if keep_outputs else None, oracle=oracle, slice_bytes=slice_b,
                         proto=proto_run, checks=checked)

    # ------------------------------------------------------------------ AllToAllv
    def vblocks(self, inplace: bool = False):
        """The program's block-piece tables for AllToAllv (:func:`hccc.compiler.ir.vblocks.vblock_map`,
        one int32 table per rank), computed once per placement; VBlockError when the program cannot
        run with per-pair counts."""
        from hccc.compiler.ir.vblocks import rank_tables, vblock_map
        cache_ = self.__dict__.setdefault("_vblocks", {})
        key = bool(inplace)
        if key not in cache_:
            ir = self.ir
            from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
            cir = ir if _is_canonical(ir) else _sorted_copy(ir)
            vm = vblock_map(cir, inplace)
            cache_[key] = (vm, rank_tables(cir, vm))
        return cache_[key]

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
        from hccc.runtime import alltoallv as av
        self._check_usable()
        ir, N = self.ir, self.nranks
        if not SPECS[ir.collective].per_pair_counts:
            raise ValueError(f"{ir.name} is a {ir.collective}: per-pair counts need an AllToAll program")
        if bool(inplace) not in ir.placements:
            raise ValueError(f"{ir.name} is proven {'out of place' if inplace else 'in place'} only")
        counts = av.as_counts(counts, N)
        psd, prd = av.packed_displs(counts)
        need_s = [int((psd[r] + counts[r]).max()) if N else 0 for r in range(N)]
        need_r = [int((prd[r] + counts[:, r]).max()) if N else 0 for r in range(N)]
        if sdispls is not None:
            sdv = av.as_counts(sdispls, N, "send displacements")
            need_s = [int((sdv[r] + counts[r]).max()) for r in range(N)]
        if rdispls is not None:
            rdv = av.as_counts(rdispls, N, "receive displacements")
            need_r = [int((rdv[r] + counts[:, r]).max()) for r in range(N)]
        if inplace:
            need_s = need_r = [max(a, b) for a, b in zip(need_s, need_r)]
        send_lens = list(send_lens) if send_lens is not None else need_s
        recv_lens = list(recv_lens) if recv_lens is not None else need_r
        if inplace:
            recv_lens = send_lens
        sd, rd = av.check_call(counts, send_lens, recv_lens, sdispls, rdispls, inplace)
        vm, tables = self.vblocks(inplace)
        es = ELEMENT_BYTES[self.dtype]
        K = vm.k
        piece = av.scratch_slot(counts, K)
        eq = av.equal_count(counts, K)
        call = LaunchCall.plan(ir, eq, es, self.chunk_bytes, proto=proto, slice_bytes=slice_bytes)
        call.check(ir)
        proto_run, slice_b = call.proto, call.slice_bytes
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        npdt = np.dtype(dtypes_table.dtype(self.dtype).numpy)
        scr_n = ir.scratch_chunks * piece
        # before any buffer of the call exists, on the host (inputs, oracle) or the device
        check_run_memory(ir.name, sum(send_lens) * es,
                         (sum(send_lens) + (0 if inplace else sum(recv_lens)) + N * scr_n) * es)
        if inputs is None:
            rng = np.random.default_rng(seed)
            inputs = [rng.integers(-100, 101, size=int(n)).astype(npdt) for n in send_lens]
        else:
            inputs = [np.ascontiguousarray(x, dtype=npdt) for x in inputs]
            if len(inputs) != N or any(len(x) != int(n) for x, n in zip(inputs, send_lens)):
                raise ValueError("inputs: one array per rank, of its send buffer's length")
        g = _GARBAGE[self.dtype]
        ddt = np.dtype(_DEVICE_DTYPE[self.dtype])
        before = [np.array(inputs[r], copy=True) if inplace else
                  _from_device(np.full(int(recv_lens[r]), g, dtype=ddt), self.dtype) for r in range(N)]
        give_displs = pass_displs if pass_displs is not None else (sdispls is not None or rdispls is not None)
        # the buffers as run's layout rows: in place, one buffer at offset 0 of both
        lay = [(int(send_lens[r]), int(recv_lens[r]), scr_n, 0 if inplace else -1, -1) for r in range(N)]
        dev_inputs = [_to_device(x, self.dtype) for x in inputs]
        bufs, stuck, times = [], None, []
        try:
            self._alloc_buffers(bufs, lay, inplace, es)
            vtabs = []        # each rank's counts, displacements (or 0) and piece map, in its memory
            for r in range(N):
                pf = self.rank_pf[r]
                pf.set_device(self.placement[r])
                host = [np.ascontiguousarray(counts.ravel()), av.device_displs(sd, rd) if give_displs else None,
                        tables[r]]
                ptrs = []
                for h in host:
                    ptr = 0 if h is None else pf.malloc(max(h.nbytes, 16))
                    if ptr:
                        bufs[r][3].append(ptr)
                        if h.nbytes:
                            pf.memcpy_htod(ptr, h)
                    ptrs.append(ptr)
                vtabs.append(ptrs)
            argv = []
            for r, m in enumerate(self.rank_mem):
                a = m.args(call, input=bufs[r][0], output=bufs[r][1], scratch=bufs[r][2],
                           abort_flag=self.abort_ptr, error=self.error_ptr, timeout_s=timeout)
                a.vcounts, a.vdispls, a.vmap = vtabs[r]
                a.vslot = piece if vm.uses_scratch else 0
                argv.append(a)
            if proto_run != "ll":
                self._set_peers(argv, bufs)
            limit = self.watchdog_s if self.watchdog_s is not None else self.default_watchdog(eq * es)
            times, stuck = self._timed_launches(
                lambda: self._launch_once(call, argv, bufs, lay, dev_inputs, self.blocks, limit),
                warmup, iters)
            wrong, first, outs = 0, None, None
            if stuck is None:
                outs = self._read_outputs(bufs, recv_lens)
                want = av.expected([np.array(x) for x in inputs], before, counts, sd, rd)
                wrong, first = self._count(outs, want, _same, "")
        except BaseException:
            self.stop_kernels()
            raise
        finally:
            self._free_buffers(bufs)
        # nccl-tests' alltoall convention with the mean per-rank send buffer as the size (as hccc sim
        # --counts, hccc.runtime.sim_alltoallv): busbw = size / time * (n - 1) / n
        per_rank = int(counts.sum()) * es // max(N, 1)
        return RunResult(bytes=per_rank, count=per_rank // es, dtype=self.dtype, op=self.op,
                         inplace=bool(inplace), wrong=int(wrong),
                         time_us=float(np.mean(times)) if times else float("nan"), stuck=stuck,
                         first_wrong=first, collective=ir.collective, nranks=N, iters=len(times),
                         collective_wrong=0, nthreads=self.block, oracle="alltoallv",
                         outputs=outs if keep_outputs else None, slice_bytes=slice_b, proto=proto_run)

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
            pf = self.rank_pf[r]
            pf.set_device(self.placement[r])
            ptr = pf.malloc(max(len(blob), 16))
            bufs[r][3].append(ptr)
            pf.memcpy_htod(ptr, blob)
            argv[r].peers = ptr

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
            if grid_arg is not None and sum(self.grid) > 0:
                pf = self.rank_pf[0]
                pf.set_device(self.placement[0])
                pf.launch_grid(self.grid_fn, sum(self.grid), blocks[0], grid_arg, self.streams[0],
                               abort_flag=self.abort_ptr)
            for r in range(self.nranks if grid_arg is None else 0):
                if self.grid[r] > 0:
                    pf = self.rank_pf[r]
                    pf.set_device(self.placement[r])
                    pf.launch(self.fns[r], self.grid[r], blocks[r], args[r], self.streams[r])
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

    def _free_buffers(self, bufs) -> None:
        """Free each rank's buffers of one run (``bufs[r][3]``: what the run allocated for rank r),
        unless the runner is broken (kernels may still use them); a Ctrl-C waits until done."""
        with deferred_interrupts():
            if not self._broken:
                for r, b in enumerate(bufs):
                    for ptr in b[3]:
                        self.rank_pf[r].free(ptr)

    def _check_usable(self) -> None:
        if self._closed:
            raise PlatformError("runner is closed")
        if self._broken:
            raise PlatformError(f"the {self._names()} platform is unusable after an earlier "
                                f"run: {self._broken}")

    def _alloc_buffers(self, bufs: list, lay, inplace: bool, es: int) -> None:
        """Each rank's input, output and scratch for one run, appended to ``bufs`` as they are
        allocated (``(input, output, scratch, [what to free])``; a failure leaves in ``bufs`` what
        :meth:`_free_buffers` must free). ``lay``: :meth:`layout`'s rows (elements in, out,
        scratch; in place, the input's or the output's offset in the other, or -1)."""
        for r in range(self.nranks):
            pf = self.rank_pf[r]
            pf.set_device(self.placement[r])
            n_in, n_out, n_scr, in_off, out_off = lay[r]
            if inplace and in_off >= 0:
                out_p = pf.malloc(max(n_out * es, 16))
                in_p, own = out_p + in_off * es, [out_p]
            elif inplace:
                in_p = pf.malloc(max(n_in * es, 16))
                out_p, own = in_p + out_off * es, [in_p]
            else:
                in_p = pf.malloc(max(n_in * es, 16))
                out_p = pf.malloc(max(n_out * es, 16))
                own = [in_p, out_p]
            bufs.append((in_p, out_p, 0, own))          # freed as allocated, should the next fail
            scr_p = pf.malloc(max(n_scr * es, 16))
            own.append(scr_p)
            bufs[-1] = (in_p, out_p, scr_p, own)

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

    def _read_outputs(self, bufs, lens) -> list[np.ndarray]:
        """Each rank's output buffer (``lens[r]`` elements) back on the host, as the oracle sees it."""
        ddt = np.dtype(_DEVICE_DTYPE[self.dtype])
        got = []
        for r in range(self.nranks):
            pf = self.rank_pf[r]
            pf.set_device(self.placement[r])
            host = np.empty(int(lens[r]), dtype=ddt)
            pf.memcpy_dtoh(host, bufs[r][1])
            got.append(_from_device(host, self.dtype))
        return got

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

    def _prepare(self, bufs, lay, dev_inputs, ll: bool = False) -> None:
        """Zero counters, flags and the error record (and, with ``ll``, the FIFO slots: an LL
        launch that :class:`~hccc.runtime.ll_epoch.LLEpochs` says must zero); outputs and scratch
        to garbage; inputs in (after the output's garbage: in place, they overlay)."""
        g = _GARBAGE[self.dtype]
        ddt = np.dtype(_DEVICE_DTYPE[self.dtype])
        for m in self.rank_mem:
            m.reset(slots=ll)
        ctypes.c_uint32.from_address(self.abort_ptr).value = 0
        self.flags_pf.memset(self.error_ptr, 0, ctypes.sizeof(ErrorRecord))
        for r in range(self.nranks):
            pf = self.rank_pf[r]
            in_p, out_p, scr_p, _ = bufs[r]
            n_in, n_out, n_scr = lay[r][:3]
            if n_out:
                pf.memcpy_htod(out_p, np.full(n_out, g, dtype=ddt))
            if n_scr:
                pf.memcpy_htod(scr_p, np.full(n_scr, g, dtype=ddt))
            if n_in:
                pf.memcpy_htod(in_p, dev_inputs[r])

    def _wait(self, limit: float) -> str | None:
        """Synchronize under the host watchdog; None when every kernel finished."""
        done = threading.Event()
        failure: list[BaseException] = []

        def waiter():
            try:
                for pf in self._distinct:
                    pf.synchronize()
            except BaseException as exc:  # reported below, in the caller's thread
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=waiter, name="hccc-synchronize", daemon=True).start()
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
        if self._broken or not hasattr(self, "abort_ptr"):
            return
        with deferred_interrupts():
            try:
                self._raise_abort()
            except Exception:
                pass
            done = threading.Event()

            def waiter():
                try:
                    for pf in self._distinct:
                        pf.synchronize()
                except BaseException:        # an aborted kernel's error: it has stopped all the same
                    pass
                finally:
                    done.set()

            threading.Thread(target=waiter, name="hccc-stop", daemon=True).start()
            if not done.wait(max(STOP_GRACE_S, 2.0 * self.timeout_s)):
                self._broken = "kernels still running after an interrupt ignore the abort flag"

    def _raise_abort(self) -> None:
        """Raise the abort flag: a plain store into pinned host memory, which no queued copy or
        kernel can hold back."""
        ctypes.c_uint32.from_address(self.abort_ptr).value = 1

    def _error_message(self) -> str | None:
        raw = np.zeros(ctypes.sizeof(ErrorRecord), dtype=np.uint8)
        self.flags_pf.memcpy_dtoh(raw, self.error_ptr)
        aborted = ctypes.c_uint32.from_address(self.abort_ptr).value != 0
        e = ErrorRecord.from_buffer_copy(raw.tobytes())
        if not e.valid:
            return "aborted without an error record" if aborted else None
        # the waited time is counted in the ticks of the reporting rank's platform
        pf = self.rank_pf[e.rank] if 0 <= e.rank < self.nranks else self.flags_pf
        return describe_stuck(self.ir, e, pf.ticks_per_us)

    def _compare(self, outs, inputs, inplace):
        """(wrong, first wrong, collective_wrong, oracle name) for the kernels' outputs."""
        ir = self.ir
        bf16 = self.dtype == "bfloat16"
        coll = reference.expected_for(ir, [np.array(x) for x in inputs], self.op, bf16=bf16)
        # ranks whose output the collective leaves unspecified (a Reduce's non-root ranks) are
        # not compared at all
        coll = list(coll)
        unspecified = {r for r, c in enumerate(coll) if c is None}
        try:
            want = reference.execute(ir, [np.array(x) for x in inputs], op=self.op, inplace=inplace,
                                     bf16=bf16)
        except IRFormatError:
            # The reference executor refuses programs that can deadlock under its worst-case model
            # (one FIFO slot); they may still run with the real FIFO depth. Compare with the
            # collective's definition instead.
            wrong, first = self._count(outs, coll, self._close, "")
            return wrong, first, 0, "definition"
        want = [None if r in unspecified else w for r, w in enumerate(want)]
        wrong, first = self._count(outs, want, _same, "")
        coll_wrong, coll_first = self._count(want, coll, self._close, "reference run")
        return wrong, first or coll_first, coll_wrong, "reference"

    def _count(self, got, want, same, what: str):
        """Elements of ``got`` differing from ``want`` (all ranks) and a line about the first.
        Ranks whose ``want`` (or ``got``) is None have no specified output: nothing is wrong there."""
        total, first = 0, None
        coll = self.ir.collective
        for r in range(self.nranks):
            if want[r] is None or got[r] is None:
                continue
            a, b = np.asarray(got[r]), np.asarray(want[r])
            if len(a) != len(b):
                total += max(len(a), len(b))
                first = first or f"rank {r}: {len(a)} output elements where {len(b)} are expected"
                continue
            bad = ~same(a, b)
            n = int(bad.sum())
            if n and first is None:
                i = int(np.flatnonzero(bad)[0])
                if what:
                    first = (f"rank {r}, output element {i}: the {what} gives {_fmt(a[i])}, "
                             f"{coll} needs {_fmt(b[i])}")
                else:
                    first = f"rank {r}, output element {i}: got {_fmt(a[i])}, expected {_fmt(b[i])}"
            total += n
        return total, first

    def _close(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise agreement of the reference run with the collective's definition: exact
        for int32 (and for the generated small-integer data, which every order sums exactly);
        floats within the rounding that a different reduction order may cause."""
        if not np.issubdtype(np.asarray(b).dtype, np.floating):
            return _same(a, b)
        eps = float(np.finfo(np.float32 if self.dtype == "bfloat16" else self.dtype).eps)
        if self.dtype == "bfloat16":
            eps = 2.0 ** -7
        tol = 4 * max(self.nranks, 1) * eps
        fin = np.abs(b[np.isfinite(b)]).astype(np.float64)   # (infinities compare as equals)
        scale = float(fin.max()) if fin.size else 0.0
        return np.isclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True)

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


def _to_device(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        bits = reference.round_bf16(np.asarray(x, np.float32)).view(np.uint32)
        return (bits >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, dtype=_DEVICE_DTYPE[dtype])


def _from_device(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    eq = a == b
    if np.issubdtype(a.dtype, np.floating):
        eq |= np.isnan(a) & np.isnan(b)
    return eq


def _fmt(v) -> str:
    return repr(v.item()) if hasattr(v, "item") else repr(v)


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
