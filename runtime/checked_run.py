"""What a checked run of a program is, whichever launcher runs it (the single-process
:class:`~hccc.runtime.launcher.Runner`, a :class:`~hccc.runtime.local_job.LocalJob`, a rank's
:class:`~hccc.runtime.process_rank.ProcessRank`): the element types and operators, a call's element
count, every rank's buffer layout and in-place placement, the oracle's inputs, and the
:class:`RunResult`. It imports no launcher (each of them imports it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from hccc.compiler.backend.codegen import buffer_bases
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import oracle, reference
from hccc.runtime.busbw import busbw_factor
from hccc.runtime.memory_limits import check_run_memory
from hccc.util import dtypes as dtypes_table

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


def _chunk_lo(bounds: np.ndarray, count: int, nchunks: int, j: int) -> int:
    """First element of chunk slot ``j`` (slots past ``nchunks`` wrap into a further copy)."""
    return (j // nchunks) * count + int(bounds[j % nchunks])



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


__all__ = ["DTYPES", "OPS", "ELEMENT_BYTES", "RunResult", "program_layout", "check_program_memory",
           "run_inputs", "alltoallv_buffers", "call_count", "check_placement"]
