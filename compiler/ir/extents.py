"""Extents: how many elements every primitive moves, proven for every element count.

Element layout (the one the kernels, the reference executor and the launcher share). The
collective's full buffer of ``count`` elements is cut into ``nchunks`` chunks; chunk ``c`` covers
``[c*count//nchunks, (c+1)*count//nchunks)`` (so sizes differ by one element when ``count`` does not
divide evenly). Input and output slot ``j`` of a rank is chunk ``j + base`` of the full buffer
(:func:`buffer_bases`: a buffer holding only the rank's part starts at its first chunk). Scratch
slot ``j`` is a container of ``ceil(count/nchunks)`` elements at element ``j*ceil(count/nchunks)``:
it holds whatever chunk was put there, whatever the file's scratch size.

Anchors. For each of its ``cnt`` chunks a primitive moves the elements of one chunk of the full
buffer, its *anchor* ``a`` plus ``i`` (the kernels' ``chunk`` argument). :func:`chunk_anchors`
derives the anchor from the input/output chunks the primitive names, from its send/receive
partners (a chain ``send -> forward -> ... -> receive`` moves one message, so all its primitives
share one anchor) and from the scratch slots it touches: a scratch slot holds chunks of one size
class for the whole program (flow-insensitive, so a program that reuses one slot for chunks of
different sizes is refused), so a primitive that moves scratch to scratch takes the chunk its
slots hold. A group of primitives and slots that names no input/output chunk at all moves garbage
and gets an arbitrary, consistent anchor (any choice is in bounds: a scratch slot holds the
largest chunk).

What is proven. Every input/output chunk a primitive names has the anchor's size for *every*
element count the program admits (:func:`count_unit`: any count, or a multiple of ``nranks``
for AllToAll), so the kernels touch exactly the elements of the chunks they name, on both sides,
and a sender and its receiver agree on the message length. Two chunks ``a`` and ``b`` have equal
sizes for every admissible count exactly when their size *signatures* over one period of counts
agree (:func:`same_size`); the check decides that exactly rather than comparing indices (chunks 1
and 3 of 5 always have equal sizes). A program that breaks this (``COPY output[1] -> input[0]``
of a 2-rank AllGather: chunk 1 has one element more than chunk 0 at odd counts) is refused with
:class:`ExtentError` naming the primitive and a count at which the sizes differ.

Whether a scratch slot holds the very chunk the reader expects (not just one of its size) is a
question of values, not bounds; the symbolic prover (:mod:`hccc.compiler.ir.symbolic`) answers it
for programs that come without a proof.
"""
from __future__ import annotations

from math import gcd
from typing import Callable

import numpy as np

from hccc.compiler.frontend.collectives import spec_of
from hccc.compiler.ir.connections import describe_prim, match_connections
from hccc.compiler.ir.program_ir import Buf, IRFormatError, Op, ProgramIR
from hccc.compiler.ir.sort_order import lexsort, unique_inverse

_READS = np.array([Op(o).reads_src for o in range(len(Op))])
_WRITES = np.array([Op(o).writes_dst for o in range(len(Op))])


class ExtentError(IRFormatError):
    """A primitive names chunks whose sizes differ for some element count; ``prims`` lists the
    primitives involved (the first is the one to point at)."""

    def __init__(self, message: str, prims=()):
        super().__init__(message)
        self.prims = [int(p) for p in prims]


def count_unit(ir: ProgramIR) -> int:
    """Element counts the program admits are the multiples of this. AllToAll: ``nranks`` (every
    rank sends every other the same number of elements); ``nchunks`` for an imported MSCCL
    AllToAll that uses scratch, which may park any piece in any slot, so all pieces must have
    one size. Every other collective: any count (1)."""
    unit = spec_of(ir.collective).count_unit(ir.nranks)
    if unit == 1:
        return 1
    if ir.origin.source == "msccl-xml" and ir.scratch_chunks:
        return max(1, int(ir.nchunks))
    return unit


def size_period(ir: ProgramIR) -> int:
    """``P``: chunks ``c`` and ``c + P`` have equal sizes at every admissible count (``P`` divides
    ``nchunks``; chunk indices past ``nchunks`` wrap around the same way)."""
    C = max(1, int(ir.nchunks))
    return C // gcd(count_unit(ir), C)


def chunk_size(chunk: int, count: int, nchunks: int) -> int:
    """Elements of chunk ``chunk`` (any integer: it wraps around) of a full buffer of ``count``."""
    c = int(chunk) % int(nchunks)
    return (c + 1) * count // nchunks - c * count // nchunks


def size_witness(ir: ProgramIR, a: int, b: int) -> int | None:
    """The smallest admissible element count at which chunks ``a`` and ``b`` differ in size, or
    None when their sizes agree at every admissible count (checked over one full period)."""
    P = size_period(ir)
    a, b = int(a) % P, int(b) % P
    if a == b:
        return None
    u, C = count_unit(ir), max(1, int(ir.nchunks))
    # count = u*t: the sizes are periodic in t with period P (see size_period)
    t = np.arange(1, P + 1, dtype=np.int64)
    cnt = u * t
    sa = (a + 1) * cnt // C - a * cnt // C
    sb = (b + 1) * cnt // C - b * cnt // C
    diff = np.flatnonzero(sa != sb)
    return int(cnt[diff[0]]) if len(diff) else None


def same_size(ir: ProgramIR, a, b) -> np.ndarray:
    """Vectorised: do chunks ``a[k]`` and ``b[k]`` have equal sizes at every admissible count?"""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    P = size_period(ir)
    ok = (a - b) % P == 0
    idx = np.flatnonzero(~ok)
    if len(idx):
        pairs = np.unique(np.stack([a[idx] % P, b[idx] % P], axis=1), axis=0)
        good = {(int(x), int(y)) for x, y in pairs if size_witness(ir, int(x), int(y)) is None}
        if good:
            ok[idx] = [(int(x) % P, int(y) % P) in good for x, y in zip(a[idx], b[idx])]
    return ok


def _agree(ir: ProgramIR, a: np.ndarray, b: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Vectorised: do chunks ``a + k`` and ``b + k`` have one size at every admissible count, for
    every ``k < cnt``?"""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    cnt = np.maximum(np.asarray(cnt, np.int64), 1)
    P = size_period(ir)
    ok = (a - b) % P == 0
    idx = np.flatnonzero(~ok)
    if len(idx):
        c = cnt[idx]
        k = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
        each = same_size(ir, np.repeat(a[idx], c) + k, np.repeat(b[idx], c) + k)
        ok[idx] = np.logical_and.reduceat(each, np.cumsum(c) - c)
    return ok


def _first_difference(ir: ProgramIR, a: int, b: int, cnt: int) -> tuple[int, int]:
    """``(k, count)``: the first chunk ``k`` of a step whose chunks ``a + k`` and ``b + k`` differ in
    size, and an admissible element count where they do."""
    for k in range(max(1, int(cnt))):
        w = size_witness(ir, a + k, b + k)
        if w is not None:
            return k, w
    raise AssertionError("the chunks agree in size")


def _differ_text(ir: ProgramIR, a: int, b: int, cnt: int) -> str:
    C = max(1, int(ir.nchunks))
    k, w = _first_difference(ir, a, b, cnt)
    step = f"their chunk {k} of the step (chunks {a + k} and {b + k} of the full buffer) " if k else ""
    return (f"{step}differ in size at {_elements(w)} ({chunk_size(a + k, w, C)} vs "
            f"{chunk_size(b + k, w, C)})")


def buffer_bases(ir: ProgramIR) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: chunk of the full buffer held by chunk 0 of input / of output (a buffer of ``k``
    slots with ``k * nranks == nchunks`` holds the rank's own part; any other starts at chunk 0)."""
    ranks = np.arange(ir.nranks, dtype=np.int64)
    out = []
    for nb in (ir.in_chunks, ir.out_chunks):
        if 0 < nb < ir.nchunks and nb * ir.nranks == ir.nchunks:
            out.append(ranks * nb)
        else:
            out.append(np.zeros(ir.nranks, np.int64))
    return out[0], out[1]


def _side_chunks(ir: ProgramIR, side: str, uses: np.ndarray) -> np.ndarray:
    """Full-buffer chunk of each primitive's ``side`` slot (input/output only), else -1."""
    p = ir.prims
    rank = p["rank"].astype(np.int64)
    b = p[f"{side}_buf"].astype(np.int64)
    off = p[f"{side}_off"].astype(np.int64)
    in_base, out_base = buffer_bases(ir)
    out = np.full(len(rank), -1, np.int64)
    m = uses & (b == Buf.INPUT)
    out[m] = off[m] + in_base[rank[m]]
    m = uses & (b == Buf.OUTPUT)
    out[m] = off[m] + out_base[rank[m]]
    return out


def _elements(w: int) -> str:
    return f"{w} element{'' if w == 1 else 's'}"


def _side_text(ir: ProgramIR, i: int, side: str, chunk: int) -> str:
    b = Buf(int(ir.prims[f"{side}_buf"][i])).name.lower()
    off = int(ir.prims[f"{side}_off"][i])
    return f"{b} chunk {off} (chunk {chunk} of the full buffer)"


def chunk_anchors(ir: ProgramIR, describe: Callable[[int], str] | None = None) -> np.ndarray:
    """Per primitive the anchor chunk (in ``[0, nchunks)``) whose size each of its chunks moves:
    chunk ``i`` of the primitive moves as many elements as chunk ``anchor + i`` of the full buffer.
    Raises :class:`ExtentError` when a primitive, or a send/receive chain, names input/output
    chunks whose sizes differ at some admissible count. Assumes the structure is valid
    (:func:`hccc.compiler.ir.check.check_structure`)."""
    describe = describe or (lambda i: describe_prim(ir, i))
    p = ir.prims
    n = ir.nprims
    C = max(1, int(ir.nchunks))
    if n == 0:
        return np.zeros(0, np.int64)
    op = p["op"].astype(np.int64)
    src = _side_chunks(ir, "src", _READS[op])
    dst = _side_chunks(ir, "dst", _WRITES[op])
    cnt = p["count"].astype(np.int64)
    # 1. both sides of one primitive
    both = np.flatnonzero((src >= 0) & (dst >= 0))
    if len(both):
        ok = _agree(ir, src[both], dst[both], cnt[both])
        if not ok.all():
            i = int(both[np.flatnonzero(~ok)[0]])
            raise ExtentError(
                f"{describe(i)}: copies between chunks of different sizes: "
                f"{_side_text(ir, i, 'src', int(src[i]))} and {_side_text(ir, i, 'dst', int(dst[i]))} "
                f"{_differ_text(ir, int(src[i]), int(dst[i]), int(cnt[i]))}; every chunk a primitive "
                f"names must have the size of the chunk it moves", [i])
    own = np.where(dst >= 0, dst, src)
    s, r = match_connections(ir)
    if ir.scratch_chunks and ((_READS[op] & (p["src_buf"] == Buf.SCRATCH)).any()
                              | (_WRITES[op] & (p["dst_buf"] == Buf.SCRATCH)).any()):
        anchor = _anchors_through_scratch(ir, own, s, r, describe)
        return np.where(anchor >= 0, anchor, 0) % C
    # 2. chains: a receive takes its sender's message; pointer jumping finds each chain's head
    head = np.arange(n, dtype=np.int64)
    head[r] = s
    while True:
        nxt = head[head]
        if np.array_equal(nxt, head):
            break
        head = nxt
    known = np.flatnonzero(own >= 0)
    rep = np.full(n, -1, np.int64)
    rep_prim = np.full(n, -1, np.int64)
    rep[head[known]] = own[known]          # some input/output chunk of the chain (last one wins)
    rep_prim[head[known]] = known
    if len(known):
        ok = _agree(ir, own[known], rep[head[known]], cnt[known])
        if not ok.all():
            i = int(known[np.flatnonzero(~ok)[0]])
            _chain_conflict(ir, i, int(rep_prim[head[i]]), int(own[i]), int(rep[head[i]]), own, describe)
    anchor = np.where(own >= 0, own, rep[head])
    return np.where(anchor >= 0, anchor, 0) % C


def _static_text(ir: ProgramIR, i: int, chunk: int) -> str:
    op = Op(int(ir.prims["op"][i]))
    side = "dst" if op.writes_dst and ir.prims["dst_buf"][i] != Buf.SCRATCH else "src"
    return _side_text(ir, i, side, chunk)


def _chain_conflict(ir, i, j, a, b, own, describe, via: str = "on the same send/receive chain"):
    raise ExtentError(
        f"{describe(i)}: it moves {_static_text(ir, i, a)}, but {describe(j)} {via} moves "
        f"{_static_text(ir, j, b)}; they {_differ_text(ir, a, b, int(ir.prims['count'][i]))}, so one "
        f"message cannot fit both", [i, j])


def _anchors_through_scratch(ir: ProgramIR, own: np.ndarray, s: np.ndarray, r: np.ndarray,
                             describe) -> np.ndarray:
    """Anchors when scratch is used. Unknowns: the anchor ``A`` of every primitive and the chunk
    ``A`` every scratch slot holds; equations ``A[recv] = A[send]`` along every match and
    ``A[slot] = A[p] + k`` where chunk ``k`` of primitive ``p`` is that slot (a slot holds chunks of
    one size class for the whole program). Connected components and potentials (``A[x] =
    A[root] + pot[x]``) come from hooking roots under smaller roots and pointer jumping, in numpy; every
    equation is then checked modulo :func:`size_period`, and each component takes its value from an
    input/output chunk named in it, which every other one must agree with (:func:`same_size`)."""
    p = ir.prims
    n = ir.nprims
    P = size_period(ir)
    S = int(ir.scratch_chunks)
    op = p["op"].astype(np.int64)
    rank = p["rank"].astype(np.int64)
    cnt = p["count"].astype(np.int64)
    # scratch accesses, one per chunk: (primitive, chunk k, global slot key)
    acc_p, acc_k, acc_key = [], [], []
    for side, uses in (("src", _READS[op]), ("dst", _WRITES[op])):
        idx = np.flatnonzero(uses & (p[f"{side}_buf"] == Buf.SCRATCH))
        c = cnt[idx]
        k = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
        pp = np.repeat(idx, c)
        acc_p.append(pp)
        acc_k.append(k)
        acc_key.append(rank[pp] * S + p[f"{side}_off"].astype(np.int64)[pp] + k)
    acc_p, acc_k, acc_key = (np.concatenate(x) for x in (acc_p, acc_k, acc_key))
    keys, slot = unique_inverse(acc_key)
    M = n + len(keys)
    # equations A[ea] = A[eb] + ed
    ea = np.concatenate([np.asarray(r, np.int64), n + slot])
    eb = np.concatenate([np.asarray(s, np.int64), acc_p])
    ed = np.concatenate([np.zeros(len(r), np.int64), acc_k])
    label = np.arange(M, dtype=np.int64)      # every node's root (roots: label[x] == x)
    pot = np.zeros(M, dtype=np.int64)
    while True:
        ra, rb = label[ea], label[eb]
        # hook the larger root of every equation that joins two trees under the smaller one:
        # A[a] = A[ra] + pot[a], A[b] = A[rb] + pot[b], A[a] = A[b] + d
        diff = pot[eb] + ed - pot[ea]             # A[ra] - A[rb]
        m = ra != rb
        if not m.any():
            break
        hi = np.where(ra > rb, ra, rb)[m]
        lo = np.where(ra > rb, rb, ra)[m]
        off = np.where(ra > rb, diff, -diff)[m]   # A[hi] = A[lo] + off
        o = lexsort((lo, hi))
        first = np.r_[True, hi[o][1:] != hi[o][:-1]]
        h, l, f = hi[o][first], lo[o][first], off[o][first]
        label[h] = l
        pot[h] = f
        while True:                               # pointer jumping: point every node at its root
            up = label[label]
            if np.array_equal(up, label):
                break
            pot = pot + pot[label]
            label = up
    # every equation must hold
    bad = np.flatnonzero((pot[ea] - pot[eb] - ed) % P != 0)
    if len(bad):
        e = int(bad[0])
        who = int(eb[e])
        slot_node = int(ea[e]) if ea[e] >= n else -1
        if slot_node < 0:
            # a match closed a cycle through scratch: name a slot on it, the first of the component
            cand = np.flatnonzero(label[n:] == label[who])
            slot_node = n + int(cand[0]) if len(cand) else -1
        key = int(keys[slot_node - n]) if slot_node >= 0 else -1
        srank, sj = divmod(key, S) if key >= 0 else (int(rank[who]), -1)
        touch = acc_p[acc_key == key]
        other = int(touch[touch != who][0]) if (touch != who).any() else who
        raise ExtentError(
            f"{describe(who)}: scratch chunk {sj} of rank {srank} holds chunks of different sizes "
            f"here and at {describe(other)} (a scratch chunk must hold chunks of one size for every "
            f"element count)", [who, other])
    # each component's value from an input/output chunk named in it
    known = np.flatnonzero(own[:n] >= 0)
    value = np.full(M, np.iinfo(np.int64).min, np.int64)
    vprim = np.full(M, -1, np.int64)
    value[label[known]] = own[known] - pot[known]
    vprim[label[known]] = known
    has = value[label[:n]] != np.iinfo(np.int64).min
    if len(known):
        want = value[label[known]] + pot[known]
        ok = _agree(ir, want, own[known], cnt[known])
        if not ok.all():
            i = int(known[np.flatnonzero(~ok)[0]])
            j = int(vprim[label[i]])
            w = int(value[label[i]] + pot[i])
            raise ExtentError(
                f"{describe(i)}: it moves {_static_text(ir, i, int(own[i]))}, but its sends, receives "
                f"and scratch chunks link it to {describe(j)}, which moves "
                f"{_static_text(ir, j, int(own[j]))}: that makes this step move chunk {w} of the "
                f"full buffer, and the two {_differ_text(ir, int(own[i]), w, int(cnt[i]))}", [i, j])
    anchor = np.where(has, value[label[:n]] + pot[:n], pot[:n])
    return np.where(own[:n] >= 0, own[:n], anchor)


def check_extents(ir: ProgramIR, describe: Callable[[int], str] | None = None) -> None:
    """Raise :class:`ExtentError` unless every access of ``ir`` is in bounds and exact for every
    admissible element count (see the module docstring), and a FIFO slot of ``chunk_bytes`` can
    carry its largest step (at least 16 bytes of each of its chunks)."""
    chunk_anchors(ir, describe)
    most = ir.max_step_chunks
    if isinstance(ir.chunk_bytes, int) and 0 < ir.chunk_bytes < 16 * most:
        raise ExtentError(f"chunk_bytes {ir.chunk_bytes} is too small for steps of {most} chunks: a FIFO "
                          f"slot carries one slice of each chunk of a step, at least 16 bytes each "
                          f"(use chunk_bytes >= {16 * most})")


__all__ = ["ExtentError", "buffer_bases", "check_extents", "chunk_anchors", "chunk_size", "count_unit",
           "same_size", "size_period", "size_witness"]
