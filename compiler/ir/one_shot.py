"""The one-shot AllReduce: every rank sends its whole input to every peer at once and adds the ``n``
copies itself, so a call's data crosses one dependent hop (NCCL's symmetric small-message kernels
do the same through peer pointers).

No transfer program expresses it (:func:`hccc.compiler.frontend.generators.direct_allreduce` says
why: a rank's chunk is one cell, holding its input and its result at once), so it is built here as
a :class:`~hccc.compiler.ir.program_ir.ProgramIR`, the lowered form every launcher, the kernels'
code generation and the symbolic prover (:func:`hccc.compiler.ir.symbolic.prove`, which
:func:`one_shot_allreduce` runs in both placements before it returns) read.

Rank ``r`` runs ``n`` thread blocks: block ``n - 1`` first copies its input to scratch (``n``
chunks), then receives rank ``(r - o) % n``'s input for ``o = 1 .. n-1`` in turn, reducing each
into the output (the first one with the rank's own input; the kernels run these receives as one
N-source unit a micro-batch where a unit round holds the ``n`` chunks, 3 to 8 ranks:
:mod:`hccc.compiler.ir.reduce_groups`); block ``o - 1`` (``o = 1 .. n-1``)
sends the scratch copy to rank ``(r + o) % n``, micro-batch by micro-batch after the copy (a
dependency on the same rank, not a hop). The sends read the copy, never the input, so in place
(where the output is the input) the reductions may overwrite the input while the sends still
run, and no rank's reductions wait on its sends: a rank's receives then drain each peer's
messages whatever the other ranks do (the deadlock check proves it). Every message is
``n`` chunks: the call moves ``n - 1`` whole buffers out of each rank, against ``2(n-1)/n`` of
one for the ring, so it pays only where a hop costs more than the bytes (the built-in catalog's
:func:`hccc.builtin_catalog.one_shot_bytes`).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, Op, ProgramIR

__all__ = ["EXAMPLES", "one_shot_allreduce"]


def one_shot_allreduce(n: int, *, name: str = "one_shot_allreduce", chunk_bytes: int = 1 << 20,
                       nwarps: int = 16) -> ProgramIR:
    """The one-shot AllReduce on ``n >= 2`` ranks (module docstring), proven in and out of place."""
    from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure
    from hccc.compiler.ir.symbolic import prove
    if n < 2:
        raise ValueError("a one-shot AllReduce needs at least 2 ranks")
    r = np.repeat(np.arange(n, dtype=np.int64), n - 1)
    o = np.tile(np.arange(1, n, dtype=np.int64), n)
    m = n * (n - 1)
    ranks = np.arange(n, dtype=np.int64)
    full = np.full
    prims = {k: np.zeros(n + 2 * m, dtype=dt) for k, dt in PRIM_COLUMNS.items()}
    # rows [0, n): the copies; [n, n + m): the sends; [n + m, n + 2m): the receives
    prims["rank"][:] = np.r_[ranks, r, r]
    prims["tb"][:] = np.r_[full(n, n - 1), o - 1, full(m, n - 1)]
    prims["seq"][:] = np.r_[np.zeros(n + m, np.int64), o]
    prims["op"][:] = np.r_[full(n, int(Op.COPY)), full(m, int(Op.SEND)), full(m, int(Op.RECV_REDUCE_COPY))]
    prims["send_peer"][:] = np.r_[full(n, -1), (r + o) % n, full(m, -1)]
    prims["recv_peer"][:] = np.r_[full(n + m, -1), (r - o) % n]
    prims["src_buf"][:] = np.r_[full(n, int(Buf.INPUT)), full(m, int(Buf.SCRATCH)),
                                np.where(o == 1, int(Buf.INPUT), int(Buf.OUTPUT))]
    prims["dst_buf"][:] = np.r_[full(n, int(Buf.SCRATCH)), full(m, int(Buf.NONE)), full(m, int(Buf.OUTPUT))]
    prims["count"][:] = n
    prims["task"][:] = -1
    prims["task2"][:] = -1
    ir = ProgramIR(name=name, collective="allreduce", nranks=n, nchunks=n, in_chunks=n, out_chunks=n,
                   scratch_chunks=n, prims=prims, dep_prim=n + np.arange(m), dep_on=r,
                   nwarps=nwarps, chunk_bytes=chunk_bytes, npipelines=1, ntbs=np.full(n, n, np.int32),
                   stats={"generator": "one_shot_allreduce"})
    ir.sort_canonical()
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)
    for inplace in (False, True):
        prove(ir, inplace)
    return ir


#: the shipped examples (``examples/generate.py`` writes each as ``examples/<name>.json``)
EXAMPLES = {"one_shot_allreduce_8": lambda: one_shot_allreduce(8, name="one_shot_allreduce_8")}
