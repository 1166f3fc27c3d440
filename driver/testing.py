"""``hccc.testing``: hypothesis strategies and assertions for people testing collective algorithms.

Sections:

1. building blocks: :func:`ring_orders`, :func:`hm_shapes`, :func:`trees`, :func:`sizes`,
   :func:`dtypes`, :func:`ops`;
2. :func:`valid_programs`: random *valid* Algorithms of every collective (ring, tree, direct,
   recursive doubling and HM families, random rank relabelings and random validity-preserving
   step re-numberings);
3. :func:`mutations`: mutants of a valid Algorithm that every correct verifier must reject;
4. assertions: :func:`assert_implements` (static proof through the verifier and, with
   ``backend=``, the emitted kernels run against the oracle);
5. running emitted kernels (CPU emulation or a GPU) against the reference executor:
   :class:`KernelCase`, :func:`kernel_cases` (strategy), :func:`run_case`,
   :func:`assert_kernels_match`, :func:`fuzz_kernels` (what ``hccc fuzz`` runs).

Example::

    from hypothesis import given
    from hccc.testing import valid_programs, assert_implements

    @given(valid_programs("allreduce", max_ranks=8))
    def test_my_pass_keeps_programs_valid(alg):
        assert_implements(my_pass(alg))
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from hypothesis import assume, strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective
from hccc.util import dtypes as dtypes_table
from hccc.util.diagnostics import CompileError, render_all
from hccc.compiler.passes.slicing import slot_share_bytes
from hccc.compiler.passes.verify import final_rows, verify

__all__ = ["ring_orders", "hm_shapes", "trees", "sizes", "dtypes", "ops", "valid_programs",
           "relabel_ranks", "renumber_steps", "mutations", "live_transfers", "assert_implements",
           "KernelCase", "kernel_cases", "default_counts", "kernel_runner", "run_case",
           "assert_kernels_match", "fuzz_kernels", "FuzzReport"]

DTYPES = dtypes_table.DTYPE_NAMES
OPS = dtypes_table.OP_NAMES


# ====================================================================== 1. building blocks
def ring_orders(n: int) -> st.SearchStrategy[list[int]]:
    """Ring orders over ranks ``0..n-1`` (permutations)."""
    return st.permutations(list(range(n)))


def hm_shapes(max_ranks: int = 8, *, min_nodes: int = 1, min_gpus: int = 1) -> st.SearchStrategy[tuple[int, int]]:
    """``(nNodes, GPUs per node)`` with ``nNodes * G <= max_ranks``."""
    pairs = [(a, b) for a in range(min_nodes, max_ranks + 1) for b in range(min_gpus, max_ranks + 1)
             if a * b <= max_ranks]
    if not pairs:
        raise ValueError("no HM shape fits max_ranks")
    return st.sampled_from(pairs)


@st.composite
def trees(draw, n: int) -> list[tuple[int, int]]:
    """A random spanning tree over ranks ``0..n-1`` as ``n-1`` undirected ``(a, b)`` edges.

    Every labelled tree can be drawn: ranks are visited in a random order and each one attaches to
    a random, earlier-visited rank. Used by :func:`hccc.compiler.frontend.generators.tree_allgather` & co.
    """
    perm = draw(st.permutations(list(range(n))))
    edges = []
    for i in range(1, n):
        j = draw(st.integers(0, i - 1))
        edges.append((perm[j], perm[i]))
    return edges


def sizes(min_elements: int = 1, max_elements: int = 1 << 16) -> st.SearchStrategy[int]:
    """Buffer sizes in elements per rank, biased to awkward values (1, primes, non-multiples)."""
    special = [v for v in (1, 2, 3, 7, 8, 63, 64, 65, 1000, 1023, 4096, 65535, 65536)
               if min_elements <= v <= max_elements]
    ints = st.integers(min_elements, max_elements)
    return st.one_of(st.sampled_from(special), ints) if special else ints


def dtypes() -> st.SearchStrategy[str]:
    """Element types the runtime supports."""
    return st.sampled_from(DTYPES)


def ops() -> st.SearchStrategy[str]:
    """Reduction operators."""
    return st.sampled_from(OPS)


# ====================================================================== 2. valid programs
def _from_columns(alg: Algorithm, src, dst, step, chunk, op) -> Algorithm:
    rows = np.stack([np.asarray(x, dtype=np.int64) for x in (src, dst, step, chunk, op)], axis=1)
    return Algorithm.from_rows(alg.header, rows.tolist())


def relabel_ranks(alg: Algorithm, perm: Sequence[int]) -> Algorithm:
    """Rename rank ``r`` to ``perm[r]``, chunk ``c`` (the ``j``-th of rank ``c // K``'s ``K``) to
    ``perm[c // K] * K + j``, and the root to ``perm[root]``; AllToAll chunk ``(i*N + d)*K + j``
    to ``(perm[i]*N + perm[d])*K + j``.

    Validity is preserved: the preconditions (rank ``r`` owns chunks ``r*K..``, the root holds the
    data, or every rank holds its own contribution to every chunk) and postconditions are invariant
    under renaming ranks and chunk ids together, and races / holdings are renamed consistently.
    """
    p = np.asarray(list(perm), dtype=np.int64)
    h = alg.header
    K = h.chunks_per_rank
    spec, n = h.collective.spec, h.nranks
    src, dst, piece = spec.block_of(alg.chunk, n, n * K)
    chunk = spec.block_id(p[src], p[dst], piece, n, n * K)
    from dataclasses import replace
    if spec.parameter == "shift" and n and ((p - p[0]) % n != np.arange(n) % n).any():
        raise ValueError("a SendRecv keeps its shift only under a rotation of the ranks")
    renamed = replace(h, root=int(p[h.root])) if h.collective.rooted else h
    rows = np.stack([p[alg.src], p[alg.dst], alg.step, chunk, alg.op.astype(np.int64)], axis=1)
    return Algorithm.from_rows(renamed, rows.tolist())


def renumber_steps(alg: Algorithm, rnd) -> Algorithm:
    """Random step re-numbering that keeps a valid program valid.

    Each step is split into 1-3 consecutive sub-steps (transfers assigned at random) and the steps
    are spread apart by random gaps. In a valid program no ``(rank, chunk)`` is written twice or
    both written and read within one step, so every transfer of a step sees the same state whether
    the step runs at once or in any sequence; spreading keeps the relative order.
    """
    if not len(alg):
        return alg
    _, dense = np.unique(alg.step, return_inverse=True)
    nsteps = int(dense.max()) + 1
    splits = np.array([rnd.randint(1, 3) for _ in range(nsteps)], dtype=np.int64)
    gaps = np.array([rnd.randint(0, 2) for _ in range(nsteps)], dtype=np.int64)
    base = rnd.randint(0, 3) + np.concatenate([[0], np.cumsum(splits + gaps)[:-1]])
    sub = np.array([rnd.randrange(int(splits[t])) for t in dense.tolist()], dtype=np.int64)
    return _from_columns(alg, alg.src, alg.dst, base[dense] + sub, alg.chunk, alg.op)


#: algorithm families, in the order :func:`valid_programs` draws from them; a collective has the
#: ones :mod:`hccc.compiler.frontend.generators` defines for it (:func:`_generator`)
FAMILIES = ("ring", "tree", "direct", "recursive_doubling", "hm")


def _generator(family: str, coll: Collective):
    """The generator of ``family`` for ``coll`` (``ring_allgather``, ``hm_allreduce`` or
    ``hierarchical_alltoall`` ...), or None."""
    names = [f"{family}_{coll.value}"] + ([f"hierarchical_{coll.value}"] if family == "hm" else [])
    return next((getattr(gen, n) for n in names if callable(getattr(gen, n, None))), None)


#: the families of every collective (a collective with a spec and generators is drawn like any other)
_FAMILIES = {c: tuple(f for f in FAMILIES if _generator(f, c) is not None) for c in Collective}


@st.composite
def valid_programs(draw, collective: str | Collective | Sequence | None = None, max_ranks: int = 8,
                   min_ranks: int = 1, max_chunks_per_rank: int = 3) -> Algorithm:
    """Random valid Algorithms (of ``collective``, of one drawn from a list of them, or of any
    collective when ``None``).

    Families: ring (random order), tree (random spanning tree), direct (full mesh), recursive
    doubling (AllGather, power-of-two ranks), HM (random ``nNodes x G`` shape; for AllToAll the
    two-step hierarchical algorithm; AllToAll's ring relays blocks along the ring); the rooted
    collectives (Broadcast, Reduce, Gather, Scatter) from a random root, a tree one down or up a
    random spanning tree, a direct one straight from or to the root (Scatter's linear algorithm).
    Then, one time in four, every chunk split into 2.. ``max_chunks_per_rank`` chunks
    (``nChunksPerRank``); then optionally a random rank relabeling and a random
    validity-preserving step re-numbering.
    """
    if collective is None:
        coll = draw(st.sampled_from(list(Collective)))
    elif isinstance(collective, (list, tuple)):
        coll = Collective.parse(str(draw(st.sampled_from(list(collective)))))
        if coll is None:
            raise ValueError(f"unknown collective in {collective!r}")
    else:
        coll = collective if isinstance(collective, Collective) else Collective.parse(str(collective))
        if coll is None:
            raise ValueError(f"unknown collective {collective!r}")
    family = draw(st.sampled_from(_FAMILIES[coll]))
    if family == "hm":
        nnodes, g = draw(hm_shapes(max_ranks).filter(lambda s: s[0] * s[1] >= min_ranks))
        n = nnodes * g
        alg = _generator("hm", coll)(nnodes, g)
    elif family == "recursive_doubling":
        pows = [1 << k for k in range(0, 8) if min_ranks <= (1 << k) <= max_ranks]
        n = draw(st.sampled_from(pows or [1]))
        alg = _generator("recursive_doubling", coll)(n)
    elif coll.rooted:
        n = draw(st.integers(max(1, min_ranks), max_ranks))
        root = draw(st.integers(0, n - 1))
        if family == "ring":
            alg = _generator("ring", coll)(n, root, draw(ring_orders(n)))
        elif family == "tree":
            alg = _generator("tree", coll)(n, draw(trees(n)), root)
        else:
            alg = _generator("direct", coll)(n, root)
    elif coll.spec.parameter == "shift":   # SendRecv: to the rank ``shift`` after
        n = draw(st.integers(max(1, min_ranks), max_ranks))
        shift = draw(st.integers(min(1, n - 1), n - 1))   # shift 0 (no transfer) only on one rank
        if family == "ring":
            alg = _generator("ring", coll)(n, shift, draw(ring_orders(n)))
        else:
            alg = _generator("direct", coll)(n, shift)
    else:
        n = draw(st.integers(max(1, min_ranks), max_ranks))
        if family == "ring":
            order = draw(ring_orders(n))
            alg = _generator("ring", coll)(n, order)
        elif family == "tree":
            alg = _generator("tree", coll)(n, draw(trees(n)))
        else:
            alg = _generator("direct", coll)(n)
    if max_chunks_per_rank > 1 and draw(st.integers(0, 3)) == 0:
        alg = gen.split_chunks(alg, draw(st.integers(2, max_chunks_per_rank)))
    if draw(st.booleans()):
        if coll.spec.parameter == "shift":   # a renaming keeps "the rank shift after" only as a rotation
            a = draw(st.integers(0, n - 1))
            alg = relabel_ranks(alg, [(r + a) % n for r in range(n)])
        else:
            alg = relabel_ranks(alg, draw(st.permutations(list(range(n)))))
    if draw(st.booleans()):
        alg = renumber_steps(alg, draw(st.randoms(use_true_random=False)))
    return alg


# ====================================================================== 3. mutations
def _output_keys(alg: Algorithm) -> np.ndarray:
    h = alg.header
    return final_rows(h.collective, h.nranks, h.nchunks, h.root)


def live_transfers(alg: Algorithm) -> np.ndarray:
    """Boolean mask: transfers whose written value reaches a postcondition-checked (rank, chunk).

    Backward data-flow over the steps of a valid program: a ``(rank, chunk)`` is live when its
    current value is used by an output; a transfer is live when its destination is live right
    after its step; a live ``recv`` kills the destination's older value, a live ``rrc`` keeps it
    (it reduces into it); a live transfer makes its source live.
    """
    C = alg.header.nchunks
    live = np.zeros(alg.header.nranks * C, dtype=bool)
    live[_output_keys(alg)] = True
    out = np.zeros(len(alg), dtype=bool)
    if not len(alg):
        return out
    wk = alg.dst * C + alg.chunk
    rk = alg.src * C + alg.chunk
    order = np.argsort(alg.step, kind="stable")
    steps = alg.step[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(steps)) + 1, len(order)]
    for si in range(len(bounds) - 2, -1, -1):
        idx = order[bounds[si]:bounds[si + 1]]
        lv = live[wk[idx]]
        out[idx] = lv
        kill = idx[lv & (alg.op[idx] == RECV)]
        live[wk[kill]] = False
        live[rk[idx[lv]]] = True
    return out


def _describe(alg: Algorithm, i: int) -> str:
    s, d, t, c, o = (int(alg.src[i]), int(alg.dst[i]), int(alg.step[i]), int(alg.chunk[i]), int(alg.op[i]))
    return f"#{i} ({s}->{d} chunk {c} step {t} {'recv' if o == RECV else 'rrc'})"


def _mutation_candidates(alg: Algorithm) -> dict[str, list]:
    """Candidates per mutation kind; see :func:`mutations` for why each one must be rejected."""
    n = len(alg)
    C = alg.header.nchunks
    coll = alg.header.collective
    wk = (alg.dst * C + alg.chunk).tolist()
    rk = (alg.src * C + alg.chunk).tolist()
    step = alg.step.tolist()
    op = alg.op.tolist()
    writes: dict[int, list[int]] = {}
    reads: dict[int, list[int]] = {}
    for i in range(n):
        writes.setdefault(wk[i], []).append(i)
        reads.setdefault(rk[i], []).append(i)
    for d in (writes, reads):
        for lst in d.values():
            lst.sort(key=lambda i: (step[i], i))
    cands: dict[str, list] = {"duplicate": list(range(n)), "drop": [], "duplicate-rrc": [], "reorder": []}
    if not coll.reduces:   # Allgather, Broadcast, Gather, Scatter, Alltoall: copies only
        h = alg.header
        spec = coll.spec
        final = set(final_rows(coll, h.nranks, C, h.root).tolist())
        Cf = spec.full_chunks(h.nranks, C)
        for key, ws in writes.items():
            r, c = divmod(key, C)
            if spec.holds(spec.start, r, c, h.nranks, Cf, h.root):
                continue  # the holder's chunk is defined from the start
            first = ws[0]
            t1 = step[first]
            t_next = step[ws[1]] if len(ws) > 1 else None
            rs = [j for j in reads.get(key, []) if step[j] > t1 and (t_next is None or step[j] < t_next)]
            if rs or (t_next is None and key in final):
                cands["drop"].append(first)
            cands["reorder"].extend((first, j) for j in reads.get(key, []) if step[j] > t1)
        return cands
    live = live_transfers(alg).tolist()
    cands["drop"] = [i for i in range(n) if op[i] == RRC and live[i]]
    cands["duplicate-rrc"] = [i for i in range(n) if op[i] == RRC]
    # reorder (a -> b): a is an rrc into K, b is a live transfer reading K after a, and between the
    # two steps nothing else touches K or b's destination J, and nothing writes a's source P.
    step_arr = alg.step
    wk_arr = np.asarray(wk)
    rk_arr = np.asarray(rk)
    for a in range(n):
        if op[a] != RRC:
            continue
        K, P, t1 = wk[a], rk[a], step[a]
        later = [j for j in reads.get(K, []) if step[j] > t1]
        if not later:
            continue
        b = later[0]
        t2 = step[b]
        J = wk[b]
        if not live[b] or J == P:
            continue
        win = (step_arr > t1) & (step_arr <= t2)
        win[a] = win[b] = False
        touches = win & ((wk_arr == K) | (rk_arr == K) | (wk_arr == J) | (rk_arr == J) | (wk_arr == P))
        if touches.any():
            continue
        cands["reorder"].append((a, b))
    return cands


@st.composite
def mutations(draw, alg: Algorithm) -> tuple[str, Algorithm]:
    """``(description, mutant)`` for a *valid*, non-empty ``alg``; every mutant must be rejected.

    Kinds, and why the verifier's semantics (the data model of ``hccc.compiler.frontend.algorithm``) must reject each:

    * ``duplicate``: a copy of transfer ``i`` in the same step. Two writes to one (rank, chunk)
      in one step: a race.
    * ``duplicate-rrc``: a copy of an ``rrc`` in a new step right after it (steps doubled, copy at
      2t+1). Nothing happens in between and a valid step never writes what it reads, so the copy
      reduces the same nonempty set S into a chunk that already contains S: double counting.
    * ``drop`` (the copy-only collectives: Allgather, Broadcast, Gather, Scatter, Alltoall): the
      first write of a (rank, chunk) K that the precondition leaves empty, when K is read before
      its next write, or has no next write and the postcondition names K (not the copies a relay
      keeps on the way: Alltoall's, Gather's and Scatter's transit copies). Without it K is empty
      until then: a read of undefined data, or K misses its chunk at the end.
    * ``drop`` (Reducescatter/Allreduce): a *live* ``rrc`` (:func:`live_transfers`). Values are
      disjoint unions of contributions; removing the reduction removes its nonempty source set S
      from every output derived from it (S cannot arrive another way, it would overlap), so an
      output misses contributions.
    * ``reorder`` (Allgather): swap the steps of the first write ``a`` of a non-owner K and a later
      reader ``b`` of K. The state before ``a``'s step is unchanged and K is empty there, so ``b``
      now reads undefined data (or races).
    * ``reorder`` (Reducescatter/Allreduce): swap the steps of an ``rrc`` ``a`` (into K, from P)
      and the first later reader ``b`` of K when ``b`` is live and, between the two steps, nothing
      else touches K or ``b``'s destination J and nothing writes P. Then (unless a race appears)
      everything matches the original except that J lacks a's nonempty set S, and J's value
      reaches an output: that output misses S.
    """
    if not len(alg):
        raise ValueError("mutations() needs a non-empty valid program")
    cands = _mutation_candidates(alg)
    kinds = [k for k in ("drop", "duplicate", "duplicate-rrc", "reorder") if cands[k]]
    kind = draw(st.sampled_from(kinds))
    rows = np.stack([alg.src, alg.dst, alg.step, alg.chunk, alg.op.astype(np.int64)], axis=1)
    if kind == "drop":
        i = draw(st.sampled_from(cands["drop"]))
        new = np.delete(rows, i, axis=0)
        desc = f"drop {_describe(alg, i)}"
    elif kind == "duplicate":
        i = draw(st.sampled_from(cands["duplicate"]))
        new = np.insert(rows, i + 1, rows[i], axis=0)
        desc = f"duplicate {_describe(alg, i)} in the same step"
    elif kind == "duplicate-rrc":
        i = draw(st.sampled_from(cands["duplicate-rrc"]))
        new = rows.copy()
        new[:, 2] *= 2
        extra = new[i].copy()
        extra[2] += 1
        new = np.insert(new, i + 1, extra, axis=0)
        desc = f"repeat {_describe(alg, i)} right after its step"
    else:
        a, b = draw(st.sampled_from(cands["reorder"]))
        new = rows.copy()
        new[a, 2], new[b, 2] = rows[b, 2], rows[a, 2]
        desc = f"swap the steps of {_describe(alg, a)} and {_describe(alg, b)}"
    return desc, Algorithm.from_rows(alg.header, new.tolist())


# ====================================================================== 4. assertions
def assert_implements(alg: Algorithm, *, max_errors: int = 20, backend: str | None = None,
                      counts: Sequence[int] | None = None, dtypes: Sequence[str] = ("float32",),
                      ops: Sequence[str] = ("sum",), inplace: Sequence[bool] = (False, True),
                      chunk_bytes: int = 256, scheduler: str = "hpds", tb_alloc: str = "state",
                      nthreads: int | None = None, timeout_s: float = 10.0,
                      codegen: str = "specialized") -> None:
    """Assert that ``alg`` implements its collective.

    Always: the static proof of the verifier (``AssertionError`` with the rendered diagnostics).
    With ``backend`` (``"cpu"``, ``"cuda"``): also compile ``alg`` (``scheduler``, ``tb_alloc``,
    ``chunk_bytes``), run the *emitted kernels* for every combination of ``dtypes`` x ``ops`` x
    ``inplace`` at ``counts`` elements (default: sizes giving empty and one-element chunks, a
    remainder, one and several micro-batches, FIFO wrap-around) and compare every element with the
    reference executor (:func:`assert_kernels_match`); ``codegen`` picks the specialised kernels
    or the generic table kernels.
    """
    try:
        verify(alg, max_errors=max_errors)
    except CompileError as exc:
        raise AssertionError(f"{alg.header.name} does not implement {alg.header.collective.dsl_name}:\n"
                             + render_all(exc)) from None
    if backend is None:
        return
    from hccc.compiler.passes.build import build_program
    ir = build_program(alg, scheduler=scheduler, tb_alloc=tb_alloc, chunk_bytes=chunk_bytes)
    assert_kernels_match(ir, backend=backend, counts=counts, dtypes=dtypes, ops=ops, inplace=inplace,
                         nthreads=nthreads, timeout_s=timeout_s, codegen=codegen)


# ====================================================================== 5. running emitted kernels
@dataclass(frozen=True)
class KernelCase:
    """One run of a program's kernels: ``count`` elements of the full buffer, micro-batch slices of
    ``slice_bytes`` (0: the program's slot size, ``chunk_bytes``)."""
    count: int
    dtype: str = "float32"
    op: str = "sum"
    inplace: bool = False
    nthreads: int = 1
    slice_bytes: int = 0

    def describe(self) -> str:
        return (f"count={self.count} dtype={self.dtype} op={self.op} "
                f"{'in-place' if self.inplace else 'out-of-place'} threads/TB={self.nthreads}"
                + (f" slice={self.slice_bytes}B" if self.slice_bytes else ""))


def default_counts(ir, dtype: str = "float32") -> list[int]:
    """Sizes worth checking for ``ir``: empty and one-element chunks, a remainder, one micro-batch,
    several micro-batches with a ragged last one, and more micro-batches than FIFO slots."""
    from hccc.runtime.launcher import ELEMENT_BYTES
    C = ir.nchunks
    E = max(1, slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks) // ELEMENT_BYTES[dtype])
    return sorted({0, 1, C, C + 1, C * E - 1, C * 3 * E + C // 2 + 1, C * 9 * E + 3})


@st.composite
def kernel_cases(draw, ir, *, dtypes: Sequence[str] = DTYPES, ops: Sequence[str] = OPS,
                 max_microbatches: int = 20, threads: Sequence[int] = (1, 2, 3, 4),
                 inplace: Sequence[bool] = (False, True)) -> KernelCase:
    """Random :class:`KernelCase` for ``ir``: sizes from 0 elements to ``max_microbatches`` slices
    per chunk, biased to edges (empty, one-element and ragged chunks, exact multiples of the slice,
    the FIFO depth and one past it), remainders of the chunk split, every dtype / op, in-place and
    out-of-place, several threads per thread block, and slices of the slot size or any multiple of
    16 bytes below it (the per-launch slice; programs imported to run algorithm-level keep the slot
    size and one micro-batch per chunk)."""
    from hccc.compiler.backend.codegen import NSLOTS
    from hccc.runtime.launcher import ELEMENT_BYTES
    dtype = draw(st.sampled_from(list(dtypes)))
    # the operators with kernels for this type (integer types have no avg)
    fit = [o for o in ops if dtypes_table.instance_error(dtype, o) is None]
    assume(fit)
    op = draw(st.sampled_from(fit))
    C = ir.nchunks
    slice_b = 0
    if ir.algorithm_level:
        max_microbatches = 1
    elif ir.chunk_bytes >= 32:
        slice_b = draw(st.one_of(st.just(0), st.integers(1, ir.chunk_bytes // 16).map(lambda k: 16 * k)))
    share = slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
    E = max(1, min(slice_b or share, share) // ELEMENT_BYTES[dtype])
    edges = sorted(x for x in {0, 1, 2, E - 1, E, E + 1, 2 * E, NSLOTS * E, NSLOTS * E + 1,
                               max_microbatches * E} if x <= max_microbatches * E)
    # integers first: shrinking moves towards the first branch, so a failing edge size can still
    # shrink to the smallest failing size
    per_chunk = draw(st.one_of(st.integers(0, max_microbatches * E), st.sampled_from(edges)))
    rem = draw(st.one_of(st.just(0), st.integers(0, C - 1)))   # chunks of per_chunk or +1
    count = per_chunk * C + rem
    return KernelCase(count=count, dtype=dtype, op=op, inplace=draw(st.sampled_from(list(inplace))),
                      nthreads=draw(st.sampled_from(list(threads))), slice_bytes=slice_b)


_RUNNERS: "OrderedDict[tuple, object]" = OrderedDict()
_MAX_RUNNERS = 8


_PLATFORMS: dict[tuple, object] = {}


def _platform(backend):
    """The platform for test runs (one per backend name and build settings, shared by the cached
    runners): the CPU emulation builds without optimisation (quick to compile; small test sizes
    do not need fast kernels) unless ``HCCC_CPU_OPT`` says otherwise."""
    import os
    from hccc.runtime.platform import get_platform
    if not isinstance(backend, str):
        return backend
    opt = os.environ.get("HCCC_CPU_OPT") or "-O0"
    key = (backend, opt if backend == "cpu" else None)
    if key not in _PLATFORMS:
        if backend == "cpu":
            from hccc.runtime.cpu import CpuPlatform
            _PLATFORMS[key] = CpuPlatform(opt=opt)
        else:
            _PLATFORMS[key] = get_platform(backend)
    return _PLATFORMS[key]


def kernel_runner(ir, backend="cpu", dtype: str = "float32", op: str = "sum", *,
                  timeout_s: float = 10.0, codegen: str = "specialized", one_grid: bool | None = None):
    """A :class:`hccc.runtime.launcher.Runner` for ``ir``, kept for reuse within the process (the
    last few are cached, keyed by the IR's content, backend, instance, code-generation mode:
    ``"specialized"`` kernels per rank or the generic ``"table"`` kernels, and ``one_grid``: the
    Runner's choice of one launch for every rank, or a kernel per rank)."""
    import hashlib
    from hccc.runtime.launcher import Runner
    bname = backend if isinstance(backend, str) else f"{type(backend).__name__}@{id(backend)}"
    key = (hashlib.sha256(ir.to_json().encode()).hexdigest(), bname, dtype, op, codegen, one_grid)
    hit = _RUNNERS.get(key)
    if hit is not None:
        _RUNNERS.move_to_end(key)
        if isinstance(hit, BaseException):
            raise hit
        hit.timeout_s = timeout_s
        return hit
    try:
        runner = Runner(ir, _platform(backend), dtype, op, timeout_s=timeout_s, codegen=codegen,
                        one_grid=one_grid)
    except Exception as exc:  # remembered: a failing build is not retried for every example
        _RUNNERS[key] = exc
        raise
    _RUNNERS[key] = runner
    while len(_RUNNERS) > _MAX_RUNNERS:
        _, old = _RUNNERS.popitem(last=False)
        if not isinstance(old, BaseException):
            old.close()
    return runner


def run_case(ir, case: KernelCase, backend="cpu", *, timeout_s: float = 10.0, seed: int = 0,
             codegen: str = "specialized", one_grid: bool | None = None, proto: str = "simple"):
    """Run one :class:`KernelCase` through the emitted kernels (``codegen``: ``"specialized"`` or
    ``"table"``; ``one_grid`` as :class:`~hccc.runtime.launcher.Runner`'s; ``proto`` the FIFO
    protocol, as :meth:`~hccc.runtime.launcher.Runner.run`'s); the :class:`RunResult`."""
    runner = kernel_runner(ir, backend, case.dtype, case.op, timeout_s=timeout_s, codegen=codegen,
                           one_grid=one_grid)
    res = runner.run(count=case.count, inplace=case.inplace, nthreads=case.nthreads, seed=seed,
                     slice_bytes=case.slice_bytes or ir.chunk_bytes, proto=proto)
    if getattr(runner, "_broken", None):
        # kernels that ignore the abort flag still hold that platform: start afresh next time
        for cache in (_RUNNERS, _PLATFORMS):
            for k in [k for k, v in cache.items() if v is runner or v is runner.platform]:
                del cache[k]
    return res


def describe_failure(case: KernelCase, res) -> str:
    """One line: the case, then why it failed (stuck, wrong elements, or not the collective)."""
    if res.stuck is not None:
        return f"{case.describe()}: {res.stuck}"
    if res.wrong:
        why = (f"{res.wrong} {'element differs' if res.wrong == 1 else 'elements differ'} from the "
               "reference executor")
    elif res.collective_wrong > 0:
        why = (f"the program does not implement {res.collective}: {res.collective_wrong} element{'' if res.collective_wrong == 1 else 's'} "
               "of its reference run differ from the collective's definition")
    else:
        why = "failed"
    return f"{case.describe()}: {why}" + (f"; first: {res.first_wrong}" if res.first_wrong else "")


def assert_kernels_match(ir, *, backend="cpu", counts: Sequence[int] | None = None,
                         dtypes: Sequence[str] = ("float32",), ops: Sequence[str] = ("sum",),
                         inplace: Sequence[bool] = (False, True), nthreads: int | None = None,
                         timeout_s: float = 10.0, seed: int = 0, codegen: str = "specialized",
                         one_grid: bool | None = None) -> None:
    """Run ``ir``'s emitted kernels and assert that every output element equals the reference
    executor's, that no run sticks, and that the reference run implements the collective.
    ``counts`` default to :func:`default_counts`; ``nthreads`` to 2 threads per thread block;
    ``one_grid`` as :class:`~hccc.runtime.launcher.Runner`'s."""
    for dtype in dtypes:
        for op in ops:
            for count in (counts if counts is not None else default_counts(ir, dtype)):
                for ip in inplace:
                    case = KernelCase(int(count), dtype, op, bool(ip), int(nthreads or 2))
                    res = run_case(ir, case, backend, timeout_s=timeout_s, seed=seed, codegen=codegen,
                                   one_grid=one_grid)
                    if not res.ok:
                        raise AssertionError(f"{ir.name}: emitted kernels disagree with the oracle: "
                                             + describe_failure(case, res))


@dataclass
class FuzzReport:
    """What :func:`fuzz_kernels` found: ``failure`` is the minimal failing case (shrunk), if any."""
    cases: list = field(default_factory=list)      # (KernelCase, RunResult) of every run
    failure: tuple | None = None                   # (KernelCase, message)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None


def fuzz_kernels(ir, *, backend="cpu", examples: int = 50, seed: int = 0, timeout_s: float = 5.0,
                 dtypes: Sequence[str] = DTYPES, ops: Sequence[str] = OPS,
                 max_microbatches: int = 20, threads: Sequence[int] = (1, 2, 3, 4),
                 progress=None, codegen: str = "specialized") -> FuzzReport:
    """Hypothesis-driven runs of ``ir``'s emitted kernels against the oracle (:func:`kernel_cases`).

    A smoke run (several micro-batches, float32 / sum) goes first: a program that sticks there is
    reported at once instead of once per shrinking step. Otherwise the first failing case is shrunk
    by hypothesis and returned in :attr:`FuzzReport.failure`. ``progress(i, case, result)`` is
    called after every run. ``codegen``: run the ``"specialized"`` or the ``"table"`` kernels.
    """
    import time
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from hccc.compiler.backend.codegen import NSLOTS
    from hccc.runtime.launcher import ELEMENT_BYTES

    t0 = time.perf_counter()
    report = FuzzReport()

    def one(case: KernelCase):
        res = run_case(ir, case, backend, timeout_s=timeout_s, seed=seed, codegen=codegen)
        report.cases.append((case, res))
        if progress is not None:
            progress(len(report.cases), case, res)
        return res

    E = max(1, slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks) // ELEMENT_BYTES["float32"])
    # several micro-batches, more than the FIFO holds; one per chunk for an algorithm-level import
    nmb = 1 if ir.algorithm_level else NSLOTS + 1
    pairs = [(d, o) for d in dtypes for o in ops if dtypes_table.instance_error(d, o) is None]
    if not pairs:   # (every pair asked for is an integer avg)
        raise ValueError(dtypes_table.instance_error(dtypes[0], ops[0]))
    sd, so = ("float32", "sum") if ("float32", "sum") in pairs else pairs[0]
    smoke = KernelCase(ir.nchunks * nmb * E + (nmb > 1), sd, so, False, threads[0])
    res = one(smoke)
    if not res.ok:
        report.failure = (smoke, describe_failure(smoke, res))
        report.seconds = time.perf_counter() - t0
        return report

    failures: list[tuple] = []

    @hseed(seed)
    @settings(max_examples=max(1, int(examples)), database=None, deadline=None, derandomize=False,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(kernel_cases(ir, dtypes=dtypes, ops=ops, max_microbatches=max_microbatches,
                        threads=threads))
    def prop(case):
        r = one(case)
        if not r.ok:
            failures.append((case, describe_failure(case, r)))
            raise AssertionError(failures[-1][1])

    try:
        prop()
    except AssertionError:
        if not failures:
            raise
        report.failure = failures[-1]   # hypothesis replays the shrunk example last
    report.seconds = time.perf_counter() - t0
    return report
