"""AllToAllv: which block piece every primitive of an AllToAll program moves, and the proof that
the program runs correctly with any per-(source, destination) counts.

Why one proof covers every counts matrix. The verifier's AllToAll model (:mod:`hccc.compiler.ir.symbolic`)
gives every chunk of a rank's buffer a *value*: the id ``(s*N + d)*K + k`` of piece ``k`` of the
block rank ``s`` sends to rank ``d`` (``K`` pieces per block), or nothing. A primitive copies
values between slots and over connections and never combines them (an AllToAll has no
reduction), so each value moves whole: the postcondition (rank ``d``'s output slot ``s*K + k``
holds value ``(s*N + d)*K + k``) speaks only of which value ends where, not of how many elements
it has. If the kernels move, for every chunk of every primitive, exactly the elements of the piece
whose value that chunk carries (piece ``k`` of block ``(s, d)`` is elements ``[k*c/K, (k+1)*c/K)``
of the block's ``c = counts[s][d]``), a run with any counts ends where the proof says.

That holds when a piece lands only where its own elements fit:

* a scratch slot is a container of the largest piece (``hccc_args::vslot``), so any piece fits;
* an input or output slot is a fixed place of the caller's buffer, sized by the counts: input
  slot ``p*K + k`` of rank ``r`` is piece ``k`` of block ``(r, p)``, output slot ``p*K + k`` piece
  ``k`` of block ``(p, r)``. A program that parks another piece there (staging through the output
  buffer, a block split across two places) depends on every block having one size, and is
  refused for AllToAllv (:class:`VBlockError`, naming the primitive). In place the two buffers are
  one; slot ``p*K + k`` then holds block ``(r, p)`` or ``(p, r)``, which have one size and one place
  only when the counts are symmetric, which the runtime requires of an in-place AllToAllv.

:func:`vblock_map` follows the values in a happens-before order of the primitives (the one the
symbolic prover uses), records the value each chunk of each primitive carries (the kernels'
``hccc_args::vmap``, :data:`hccc.compiler.backend.abi.V_MAP`) and checks the rule above at every
input/output slot a primitive reads or writes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.frontend.collectives import spec_of
from hccc.compiler.ir.connections import describe_prim, match_connections
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op, ProgramIR

__all__ = ["VBlockError", "VBlockMap", "vblock_map", "rank_tables"]


class VBlockError(IRFormatError):
    """An AllToAll program that cannot run with per-pair counts; ``prims`` lists the primitive to
    point at (empty when the program as a whole is refused)."""

    def __init__(self, message: str, prims=()):
        super().__init__(message)
        self.prims = [int(p) for p in prims]


@dataclass(frozen=True)
class VBlockMap:
    """Per primitive (rows of the program as given), the block piece each of its chunks carries
    (``(s*N + d)*K + k``, -1: none): ``pieces[start[i]:start[i] + count[i]]``."""
    nranks: int
    k: int                       # pieces per block
    start: np.ndarray            # int64, per primitive
    pieces: np.ndarray           # int64
    uses_scratch: bool

    def of(self, i: int) -> np.ndarray:
        a = int(self.start[i])
        return self.pieces[a:a + int(self.start[i + 1]) - a]


def _piece_name(g: int, N: int, K: int) -> str:
    blk, k = divmod(int(g), K)
    s, d = divmod(blk, N)
    return f"piece {k} of the block rank {s} sends to rank {d}" if K > 1 else f"the block rank {s} sends to rank {d}"


def vblock_map(ir: ProgramIR, inplace: bool = False, order=None) -> VBlockMap:
    """The block piece every chunk of every primitive of ``ir`` carries, checked against the rule
    of the module docstring (:class:`VBlockError` otherwise). ``ir`` must have passed the
    structure checks; ``order``: primitives in a happens-before order (default: the prover's)."""
    from hccc.compiler.ir.symbolic import ProofError, prim_order
    spec = spec_of(ir.collective)
    if not spec.blockwise:   # AllToAllv is AllToAll's own variant: no other collective has one
        raise VBlockError(f"{ir.name} implements {spec.title}: per-pair counts apply to AllToAll programs only")
    N, C = int(ir.nranks), int(ir.nchunks)
    if N < 1 or C % N:
        raise VBlockError(f"{ir.name}: nchunks = {C} is not a whole number of pieces per block of {N} ranks")
    K = C // N
    p = ir.prims
    n = ir.nprims
    op = p["op"].astype(np.int64)
    red = np.isin(op, [int(o) for o in Op if Op(o).reduces])
    if red.any():
        i = int(np.flatnonzero(red)[0])
        raise VBlockError(f"{describe_prim(ir, i)} reduces: an AllToAll moves blocks whole", [i])
    if order is None:
        try:
            order = prim_order(ir)
        except ProofError as e:
            raise VBlockError(str(e), getattr(e, "prims", ())) from None
    cnt = p["count"].astype(np.int64)
    start = np.zeros(n + 1, np.int64)
    np.cumsum(cnt, out=start[1:])
    pieces = np.full(int(start[-1]), -1, np.int64)
    # values: per rank, buffer -> slot -> piece id (the precondition: input slot p*K + k of rank r
    # holds piece (r*N + p)*K + k); in place the input is the output
    bufs_per_rank = []
    for r in range(N):
        inp = list(range(r * C, r * C + C))
        out = inp if inplace else [-1] * int(ir.out_chunks)
        bufs_per_rank.append({int(Buf.INPUT): inp, int(Buf.OUTPUT): out,
                              int(Buf.SCRATCH): [-1] * int(ir.scratch_chunks)})
    s_m, r_m = match_connections(ir)
    sender = np.full(n, -1, np.int64)
    sender[r_m] = s_m
    rank = p["rank"].tolist()
    sb, so = p["src_buf"].tolist(), p["src_off"].tolist()
    db, do = p["dst_buf"].tolist(), p["dst_off"].tolist()
    opl, cntl, snd = op.tolist(), cnt.tolist(), sender.tolist()

    def designated(r: int, buf: int, slot: int, g: int) -> bool:
        peer, k = divmod(slot, K)
        mine = (r * N + peer) * K + k        # input: the block r sends to peer
        theirs = (peer * N + r) * K + k      # output: the block r receives from peer
        if inplace:
            return g in (mine, theirs)
        return g == (mine if buf == Buf.INPUT else theirs)

    def check(i: int, r: int, buf: int, off: int, vals, verb: str) -> None:
        if buf not in (Buf.INPUT, Buf.OUTPUT):
            return
        for j, g in enumerate(vals):
            if g >= 0 and not designated(r, buf, off + j, g):
                where = f"rank {r} {'input' if buf == Buf.INPUT else 'output'} chunk {off + j}"
                raise VBlockError(
                    f"{describe_prim(ir, i)} {verb} {where} holding {_piece_name(g, N, K)}: that place of the "
                    f"caller's buffer is sized for another block, so the program moves blocks by their size "
                    f"and cannot run with per-pair counts (AllToAllv)", [i])

    for i in np.asarray(order).tolist():
        o, c, r = opl[i], cntl[i], rank[i]
        if o == Op.NOP or c <= 0:
            continue
        b = bufs_per_rank[r]
        if Op(o).receives:
            vals = pieces[start[snd[i]]:start[snd[i]] + c].tolist() if snd[i] >= 0 else [-1] * c
        else:
            vals = b[sb[i]][so[i]:so[i] + c] if sb[i] != Buf.NONE else [-1] * c
            check(i, r, sb[i], so[i], vals, "reads")
        pieces[start[i]:start[i] + c] = vals
        if Op(o).writes_dst and db[i] != Buf.NONE:
            check(i, r, db[i], do[i], vals, "writes")
            b[db[i]][do[i]:do[i] + c] = list(vals)
    return VBlockMap(N, K, start, pieces, bool(int(ir.scratch_chunks) > 0))


def rank_tables(ir: ProgramIR, vm: VBlockMap) -> list[np.ndarray]:
    """Each rank's ``hccc_args::vmap`` (:data:`hccc.compiler.backend.abi.V_MAP`, int32) for ``ir``
    in canonical order (the order the kernels index a rank's primitives in): the row offsets of
    its primitives, then the rows."""
    rank = ir.prims["rank"].astype(np.int64)
    cnt = ir.prims["count"].astype(np.int64).clip(min=0)
    out = []
    for r in range(int(ir.nranks)):
        idx = np.flatnonzero(rank == r)
        head = len(idx) + 1
        offs = head + np.r_[0, np.cumsum(cnt[idx])]
        rows = [vm.pieces[vm.start[i]:vm.start[i] + cnt[i]] for i in idx]
        body = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        if len(body) and body.max() >= 2 ** 31:
            raise VBlockError(f"{ir.name}: {int(body.max())} block pieces do not fit the kernels' 32-bit table")
        out.append(np.concatenate([offs, body]).astype(np.int32))
    return out
