"""The verifier: proves an :class:`~hccc.compiler.frontend.algorithm.Algorithm` implements its collective.

Every ``(rank, chunk)`` carries the set of ranks whose contribution it holds, stored as a bitset of
``ceil(N/64)`` uint64 words (state matrix of shape ``(nranks * nchunks, words)``, row
``rank * nchunks + chunk``). Steps are replayed in increasing order, each one vectorised with numpy:

* initial state: the collective's precondition (:mod:`hccc.compiler.frontend.collectives`):
  every holder of a chunk holds its own contribution ``{r}``, every other chunk is empty;
* ``recv`` copies the sender's set, ``rrc`` unions it into the receiver's (sets must be disjoint);
* all transfers of one step read the state before the step.

A copy-only program (every transfer ``recv``, a collective that does not reduce: AllGather,
Broadcast, AllToAll, Gather) is first proven over all its transfers at once (:func:`copies_hold`:
sorts and searches, no loop over steps and no table of every (rank, chunk)); the replay runs where
that proof does not accept the program, and it alone reports errors, so the diagnostics are the
replay's whatever the program.

Errors, in the order they are listed (and the order the tests' reference model uses):

1. static errors, by transfer index (at most one per transfer, first that applies): source rank out
   of range, destination rank out of range, chunk out of range, negative step, unknown operation,
   self transfer. These rows are left out of the replay.
2. dynamic errors, by step, then by kind (the order of :data:`DYNAMIC_KINDS`), then by transfer
   index. Per step: two writes to one ``(rank, chunk)`` (reported once per chunk, at the second
   writer) and a write plus a read of one ``(rank, chunk)`` (reported at the writer); every
   transfer touching a raced ``(rank, chunk)`` is left out of the step. Then, per remaining
   transfer, the first that applies: the sender does not hold the chunk, ``rrc`` into a chunk the
   receiver does not hold, ``rrc`` in a copy-only collective (Allgather, Broadcast; reported as
   ``allgather-reduction``), overlapping contribution sets (double
   counting). A transfer with an error does not change the state.
3. unmet postconditions (the collective's, from :mod:`hccc.compiler.frontend.collectives`:
   copy-only collectives need each required chunk as the one contribution it started with,
   reducing ones every rank's; an AllToAll block that misses its destination is located at the
   chunk's last transfer when it has one), only when there was no other error (otherwise they are mostly a
   consequence of the errors already listed), located at the header.

Errors of one kind at one place (a loop's line, every iteration failing alike; or, in a program
whose transfers have no location, the whole program) are one diagnostic at the first of them, its
last note counting the others and naming a few (``_Collector``), so thousands of transfers in
error list no more diagnostics than there are kinds at distinct places (and at most ``max_errors``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.frontend.algorithm import MAX_CHANNEL, RRC, Algorithm, Collective
from hccc.compiler.frontend.collectives import DEST
from hccc.util.diagnostics import CompileError, Diagnostic, Location
from hccc.util.plural import plural_noun
from hccc.util.sizes import human_size
from hccc.compiler.ir.sort_order import lexsort, stable_argsort

# Error kinds (machine-readable; VerifyError.kinds is parallel to VerifyError.diagnostics).
STATIC_KINDS = ("src-out-of-range", "dst-out-of-range", "chunk-out-of-range", "negative-step",
                "bad-op", "self-transfer", "channel-out-of-range")
DYNAMIC_KINDS = ("write-write-race", "read-write-race", "undefined-source", "undefined-target",
                 "allgather-reduction", "double-count")
POSTCONDITION = "postcondition"
POSTCONDITION_SUMMARY = "postcondition-summary"  # "K more (rank, chunk) pairs ..." line

#: how many unmet postconditions are listed one by one before the summary
POSTCONDITION_LISTED = 5
#: how many further transfers with the error of a listed one, at its place, its note names (the
#: rest it counts)
SAME_NAMED = 3

#: the proof's memory budget without ``HCCC_MAX_PROOF_BYTES``: the most bytes the replay's state
#: may take (a bit per rank in a row per (rank, chunk) it tracks; the replay runs where a program
#: is wrong or reduces). A 1,024-GPU AllReduce of one chunk per rank tracks 1,048,576 rows of 16
#: words, 128 MiB; an 8-rank AllGather whose header said nRanks=4096 asked for 8 GiB and 26 s
#: before its error
DEFAULT_PROOF_BYTES = 1 << 30
#: (rank, chunk) holdings the pre- and postcondition may name together per GiB of the budget
#: (each proof makes a few int64 arrays of them): at the default, 33.5 million. A 4,096-GPU ring
#: AllGather names 16.8 million (its 16.8 million transfers were proven over all at once,
#: :func:`copies_hold`, in 11.4 s of CPU and 3.1 GiB at most, the program included); 8,192 GPUs
#: would name 67 million. Past it, a header whose nRanks the transfers do not fill asked for
#: arrays of billions before any error was found
HOLDINGS_PER_GIB = 1 << 25
#: bytes of state rows the postcondition compares at a time (its copies stay this small)
POSTCONDITION_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class VerifyReport:
    """Summary of a successful verification."""

    collective: Collective
    nranks: int
    transfers: int
    steps: int  # number of distinct step values


class VerifyError(CompileError):
    """A :class:`CompileError` from the verifier; ``kinds[i]`` names ``diagnostics[i]``'s error class.

    ``total`` counts every error found, listed or not (every unmet (rank, chunk) pair counts once;
    the pairs beyond the first few are summarised in one diagnostic, not counted in ``more``).
    """

    def __init__(self, diagnostics: list[Diagnostic], kinds: list[str], more: int, total: int):
        super().__init__(diagnostics, more=more)
        self.kinds = list(kinds)
        self.total = total

    @property
    def first_kind(self) -> str:
        return self.kinds[0]


class _Collector:
    """Keeps the first ``limit`` diagnostics and counts the rest. Errors of one kind at one place
    (a loop's line, whose every iteration fails alike, or, where transfers have no location, the
    whole program) are one diagnostic, at the first of them, whose last note counts the others and
    names the next few (:data:`SAME_NAMED`): a program with thousands of transfers in error lists as
    many diagnostics as it has kinds of error at distinct places, at most ``limit``."""

    def __init__(self, alg: Algorithm, limit: int):
        self.alg = alg
        self.limit = max(1, int(limit))
        self.diags: list[Diagnostic] = []
        self.kinds: list[str] = []
        self.total = 0
        self.listed = 0  # listed diagnostics that count as errors (not summaries)
        self.summarised = 0  # errors counted in a summary diagnostic
        self._group: dict[tuple, int] = {}       # (kind, place) -> its diagnostic's index
        self._same: dict[int, list] = {}         # diagnostic index -> [count, names of the first few]

    @property
    def full(self) -> bool:
        return len(self.diags) >= self.limit

    def _suffix(self, i: int) -> str:
        d = self.alg.describe(int(i))
        return f" {d}" if d else ""

    def _where(self, i: int) -> str:
        loc = self.alg.location_of(int(i))
        return (f"{loc}" if loc is not None else f"transfer #{int(i)}") + self._suffix(i)

    def add(self, kind: str, i: int, message: str, other: int | None = None, other_what: str = "") -> None:
        """Record an error located at transfer ``i`` (message gets the loop-value suffix); one of
        the same kind at the same place as a listed one is counted in that one's last note."""
        self.total += 1
        loc = self.alg.location_of(int(i))
        key = (kind, None if loc is None else (str(loc.source.name), loc.line, loc.col))
        at = self._group.get(key)
        if at is not None:
            same = self._same.setdefault(at, [0, []])
            same[0] += 1
            if len(same[1]) < SAME_NAMED:
                same[1].append(self._where(i) if loc is None else (self._suffix(i).strip() or f"transfer #{int(i)}"))
            self.summarised += 1
            return
        if self.full:
            return
        notes: tuple[str, ...] = ()
        if other is not None:
            notes = (f"{other_what} {self._where(other)}",)
        self._group[key] = len(self.diags)
        self.diags.append(Diagnostic(message + self._suffix(i), loc, notes=notes))
        self.kinds.append(kind)
        self.listed += 1

    def finished(self) -> list[Diagnostic]:
        """The diagnostics, each that stands for others of its kind and place with the note that
        counts them."""
        out = list(self.diags)
        for at, (count, names) in self._same.items():
            d = out[at]
            more = f", {count - len(names)} more" if count > len(names) else ""
            here = "in the program" if d.location is None else "on this line"
            note = (f"{count} {plural_noun(count, 'other transfer')} {here} with the same error: "
                    f"{'; '.join(names)}{more}")
            out[at] = Diagnostic(d.message, d.location, d.severity, tuple(d.notes) + (note,))
        return out

    def add_at(self, kind: str, location: Location | None, message: str, notes=(), count: bool = True) -> None:
        if count:
            self.total += 1
            self.listed += 1
        self.diags.append(Diagnostic(message, location, notes=tuple(notes)))
        self.kinds.append(kind)


def _single_bits(rank_of_row: np.ndarray, words: int) -> np.ndarray:
    """State rows holding exactly the contribution ``rank_of_row[i]``."""
    out = np.zeros((len(rank_of_row), words), dtype=np.uint64)
    out[np.arange(len(rank_of_row)), rank_of_row // 64] = np.left_shift(
        np.uint64(1), (rank_of_row % 64).astype(np.uint64))
    return out


def _full_row(n: int, words: int) -> np.ndarray:
    row = np.full(words, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    rem = n % 64
    if rem:
        row[-1] = np.uint64((1 << rem) - 1)
    return row


def _popcount(row: np.ndarray) -> int:
    return int(np.unpackbits(np.ascontiguousarray(row).view(np.uint8)).sum())


def _ranks_in(row: np.ndarray, limit: int = 4) -> list[int]:
    bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)[:limit].tolist()


def initial_state(collective: Collective, nranks: int, nchunks: int | None = None,
                  root: int = 0) -> np.ndarray:
    """The precondition (:meth:`CollectiveSpec.start_holders
    <hccc.compiler.frontend.collectives.CollectiveSpec.start_holders>`) as a ``(nranks * nchunks,
    words)`` bitset matrix: each holder's own contribution; everything else is empty."""
    spec = collective.spec
    C = int(nchunks or nranks)
    words = (nranks + 63) // 64
    rank, ids, contrib = spec.start_holders(nranks, spec.full_chunks(nranks, C), root)
    if len(rank) == nranks * C:   # every (rank, chunk) holds something: rows in order
        return _single_bits(contrib, words)
    state = np.zeros((nranks * C, words), dtype=np.uint64)
    state[rank * C + ids] = _single_bits(contrib, words)
    return state


def final_state(collective: Collective, nranks: int, nchunks: int, root: int = 0):
    """The postcondition (:meth:`CollectiveSpec.end_holders
    <hccc.compiler.frontend.collectives.CollectiveSpec.end_holders>`): the state rows it
    constrains (``rank * nchunks + chunk``, ascending) and what each must hold (the contributing
    rank, or :data:`~hccc.compiler.frontend.collectives.ALL`); the other rows may hold anything."""
    spec = collective.spec
    C = int(nchunks)
    rank, ids, want = spec.end_holders(nranks, spec.full_chunks(nranks, C), root)
    return rank * C + ids, want


def final_rows(collective: Collective, nranks: int, nchunks: int, root: int = 0) -> np.ndarray:
    """The state rows the postcondition constrains (:func:`final_state`)."""
    return final_state(collective, nranks, nchunks, root)[0]


def _alltoall_unmet(col: _Collector, alg: Algorithm, rank: int, chunk: int, n: int) -> None:
    """An AllToAll block that does not reach its destination: located at the last transfer of
    that chunk (it delivered the block to the wrong rank, or moved it last before it got lost),
    or at the header when the block never moves."""
    h = alg.header
    src_rank = int(h.owner(chunk))
    _, pos = h.block_slot(chunk)
    msg = (f"rank {rank} does not hold chunk {chunk} at the end (the block rank {src_rank} sends to "
           f"rank {rank}, for its output position {int(pos)})")
    moves = np.flatnonzero(np.asarray(alg.chunk) == chunk)
    if not len(moves):
        notes = ("postcondition of Alltoall", f"no transfer moves chunk {chunk}")
        if n == 0:
            notes += ("the program has no transfers",)
        col.add_at(POSTCONDITION, h.location, msg, notes)
        return
    steps = np.asarray(alg.step)[moves]
    last = int(moves[lexsort((moves, steps))[-1]])
    to = int(alg.dst[last])
    col.add_at(POSTCONDITION, alg.location_of(last) or h.location, msg + col._suffix(last),
               ("postcondition of Alltoall",
                f"its last transfer (step {int(alg.step[last])}) delivers it to rank {to}"
                + (f", not to rank {rank}" if to != rank else "")))


def verify(alg: Algorithm, *, max_errors: int = 20) -> VerifyReport:
    """Check that ``alg`` implements its collective; raise :class:`VerifyError` otherwise.

    At most ``max_errors`` diagnostics are listed; ``more`` on the error counts the rest. A
    copy-only program (recv only, a collective that does not reduce) is proven at once over all its
    transfers (:func:`copies_hold`); any other, or one that proof does not accept, is replayed step
    by step (:func:`replay`), which finds and locates every error.
    """
    _check_header(alg)
    _check_holdings(alg)
    if copies_hold(alg):
        return _report(alg)
    return replay(alg, max_errors=max_errors)


def _check_header(alg: Algorithm) -> int:
    """The header's rank count (returned) and rank parameter (a root, SendRecv's shift) in range."""
    h = alg.header
    N = int(h.nranks)
    if N < 1:
        raise VerifyError([Diagnostic(f"nRanks must be at least 1, got {N}", h.location)],
                          ["bad-header"], 0, 1)
    param = h.collective.spec.parameter
    if param and not 0 <= h.root < N:
        raise VerifyError([Diagnostic(f"{param.capitalize()} {h.root} is out of range (nRanks={N}: "
                                      f"{'ranks ' if param == 'root' else ''}0..{N - 1})",
                                      h.location)], ["bad-header"], 0, 1)
    return N


def proof_budget() -> int:
    """The proof's memory budget: ``HCCC_MAX_PROOF_BYTES`` (K/M/G/T suffixes) or
    :data:`DEFAULT_PROOF_BYTES`."""
    from hccc.util.diagnostics import env_size
    from hccc.util.limits import printable
    try:
        cap = env_size("HCCC_MAX_PROOF_BYTES")
    except ValueError as exc:
        raise CompileError([Diagnostic(f"HCCC_MAX_PROOF_BYTES must be a positive size such as 8G, not "
                                       f"'{printable(str(exc), limit=40)}'", None)]) from None
    return DEFAULT_PROOF_BYTES if cap is None else cap


def _too_large(alg: Algorithm, what: str) -> VerifyError:
    """The proof refused for its size, located at the header (with the ranks the transfers use,
    where they are fewer than the header's: the usual cause is an nRanks the program does not fill)."""
    h = alg.header
    N = int(h.nranks)
    used = int(max(np.max(alg.src, initial=-1), np.max(alg.dst, initial=-1))) + 1 if len(alg) else 0
    notes = (f"the transfers use ranks 0..{used - 1} of the header's {N}",) if 0 < used < N else ()
    return VerifyError([Diagnostic(f"nRanks={N}: {what} (HCCC_MAX_PROOF_BYTES raises it)", h.location, notes=notes)],
                       ["too-large"], 0, 1)


def _check_holdings(alg: Algorithm) -> None:
    """Refuse, before any array of them is made, a program whose pre- and postcondition name more
    (rank, chunk) holdings than :data:`HOLDINGS_PER_GIB` per GiB of :func:`proof_budget`."""
    h = alg.header
    N, spec = int(h.nranks), h.collective.spec
    full = spec.full_chunks(N, int(h.nchunks))
    n = spec.holdings(spec.start, N, full) + spec.holdings(spec.end, N, full)
    most = HOLDINGS_PER_GIB * proof_budget() // (1 << 30)
    if n > most:
        raise _too_large(alg, f"its collective's pre- and postcondition name {n:,} (rank, chunk) holdings, "
                              f"more than the {most:,} hccc proves")


def _report(alg: Algorithm) -> VerifyReport:
    h = alg.header
    return VerifyReport(collective=h.collective, nranks=int(h.nranks), transfers=len(alg), steps=alg.nsteps)


def copies_hold(alg: Algorithm) -> bool:
    """True where ``alg`` is a copy-only program (every transfer ``recv``, of a collective that does
    not reduce) that :func:`replay` accepts; False where it is not copy-only or has any error.
    Exact for copy-only programs, and over all transfers at once (sorts and searches: no loop over
    steps), so a 512-GPU AllToAll of 261,632 transfers and 2,016 steps is proven in a fraction of a
    second where the replay takes seconds.

    Without an error every transfer takes effect, and a ``recv`` copies one contribution set: a
    (rank, chunk) holds the set it started with or the set its last write before the step copied
    (which in turn is the set its sender held then). So the program is correct iff (1) no row has
    a static error; (2) no (rank, chunk) is written twice in one step, nor written and read in one
    step (the races); (3) every sender holds its chunk: it held it at the start or it was written
    at an earlier step (a write copies a held set, which is never empty); (4) every row the
    postcondition constrains ends with the set it wants: the set its last write carries (traced
    back through the writes to the holding it started from) or, never written, its own start."""
    h = alg.header
    coll = h.collective
    N, C, n = int(h.nranks), int(h.nchunks), len(alg)
    if coll.reduces or n == 0 or N < 1 or (coll.rooted and not 0 <= h.root < N):
        return False
    src = np.asarray(alg.src, dtype=np.int64)
    dst = np.asarray(alg.dst, dtype=np.int64)
    step = np.asarray(alg.step, dtype=np.int64)
    chunk = np.asarray(alg.chunk, dtype=np.int64)
    if (np.asarray(alg.op) != 0).any() or (src < 0).any() or (src >= N).any() or (dst < 0).any() or \
            (dst >= N).any() or (chunk < 0).any() or (chunk >= C).any() or (step < 0).any() or \
            (src == dst).any():
        return False
    if alg.channel is not None and ((alg.channel < 0).any() or (alg.channel > MAX_CHANNEL).any()):
        return False
    S = int(step.max()) + 1
    if N * C * S >= 1 << 62:          # (state row, step) as one int64 key
        return False
    wk = dst * C + chunk               # the state row each transfer writes ...
    rk = src * C + chunk               # ... and the one it reads
    wkey = wk * S + step
    worder = np.argsort(wkey, kind="stable")
    ws = wkey[worder]
    if (ws[1:] == ws[:-1]).any():     # a row written twice in one step
        return False
    rkey = rk * S + step
    at = np.searchsorted(ws, rkey)
    if (ws[np.minimum(at, n - 1)] == rkey).any():   # a row written and read in one step
        return False
    spec = coll.spec
    start_rank, start_id, start_set = spec.start_holders(N, spec.full_chunks(N, C), h.root)
    start_row = start_rank * C + start_id            # ascending (sorted by rank, then id)

    def held(rows: np.ndarray) -> np.ndarray:
        """The contributor each of ``rows`` starts with (-1: none). By search, not a table of every
        row: an AllToAll's rows are ``N * N * N * K`` (134 million on 512 GPUs)."""
        i = np.minimum(np.searchsorted(start_row, rows), len(start_row) - 1)
        return np.where(start_row[i] == rows, start_set[i], -1) if len(start_row) else np.full(len(rows), -1)
    # the write each transfer reads: the last one to its row before its step (ws[at - 1] where it is
    # that row's; -1: none, the row's start)
    prev = at - 1
    has = prev >= 0
    has[has] = ws[prev[has]] // S == rk[has]
    parent = np.where(has, worder[np.maximum(prev, 0)], -1)
    if (held(rk[~has]) < 0).any():     # a sender that never held its chunk
        return False
    # every transfer's set: the start of the row its chain of writes began at (pointer jumping)
    root = np.where(parent >= 0, parent, np.arange(n))
    while True:
        nxt = root[root]
        if (nxt == root).all():
            break
        root = nxt
    carried = held(rk[root])
    # the postcondition: the rows it constrains end with their last write's set, or their start
    rows, want = final_state(coll, N, C, h.root)
    final = held(rows)
    last = np.r_[ws[1:] // S != ws[:-1] // S, True]    # each written row's last write in ``ws``
    lrow = ws[last] // S
    pos = np.searchsorted(lrow, rows)
    written = pos < len(lrow)
    written[written] = lrow[pos[written]] == rows[written]
    final[written] = carried[worder[last][pos[written]]]
    return bool((final == want).all())


def replay(alg: Algorithm, *, max_errors: int = 20) -> VerifyReport:
    """:func:`verify` by replaying the steps in order (the module docstring): every error found,
    in the documented order, each located; at most ``max_errors`` listed."""
    h = alg.header
    N = _check_header(alg)
    col = _Collector(alg, max_errors)
    arrays = tuple(np.asarray(a, dtype=np.int64) for a in (alg.src, alg.dst, alg.step, alg.chunk, alg.op))
    bad = _static_checks(alg, *arrays, col)
    state = _Replay(alg, *arrays, np.flatnonzero(~bad), col)
    state.run()
    if col.total == 0:
        state.postcondition()
    if col.diags:
        raise VerifyError(col.finished(), col.kinds, max(0, col.total - col.listed - col.summarised), col.total)
    return VerifyReport(collective=h.collective, nranks=N, transfers=len(alg), steps=alg.nsteps)


def _static_checks(alg: Algorithm, src, dst, step, chunk, op, col: _Collector) -> np.ndarray:
    """The transfers that name something out of range (a rank, chunk, step, operation or
    channel) or send to their own rank, each an error (the lowest kind of :data:`STATIC_KINDS`
    that applies); returns which transfers are bad."""
    N, C = int(alg.header.nranks), int(alg.header.nchunks)
    checks = (
        (src < 0) | (src >= N),
        (dst < 0) | (dst >= N),
        (chunk < 0) | (chunk >= C),
        step < 0,
        (op != 0) & (op != 1),
        src == dst,
        (alg.channels < 0) | (alg.channels > MAX_CHANNEL),
    )
    kind_code = np.full(len(alg), -1, dtype=np.int64)
    for k in range(len(checks) - 1, -1, -1):  # lowest k wins
        kind_code[checks[k]] = k
    bad = kind_code >= 0
    for i in np.flatnonzero(bad).tolist():
        k = int(kind_code[i])
        s, d, c, t, o = int(src[i]), int(dst[i]), int(chunk[i]), int(step[i]), int(op[i])
        if col.full:
            col.total += 1
            continue
        if k == 0:
            msg = f"source rank {s} is out of range (nRanks={N}: ranks 0..{N - 1})"
        elif k == 1:
            msg = f"destination rank {d} is out of range (nRanks={N}: ranks 0..{N - 1})"
        elif k == 2:
            msg = f"chunk {c} is out of range (each rank holds chunks 0..{C - 1})"
        elif k == 3:
            msg = f"step {t} is negative"
        elif k == 4:
            msg = f"unknown transfer operation {o} (expected recv or rrc)"
        elif k == 5:
            msg = f"rank {s} sends chunk {c} to itself at step {t}"
        else:
            msg = f"channel {int(alg.channels[i])} is out of range (channels 0..{MAX_CHANNEL})"
        col.add(STATIC_KINDS[k], i, msg)
    return bad


class _Replay:
    """The replay of the well-formed transfers ``keep``, step by step: which ranks' contributions
    each (rank, chunk) holds (a bit row per (rank, chunk) the program or the collective names, not
    for all N * C of them: an AllToAll's C is N * N * K, 134 million rows on 512 GPUs), the races
    within a step, and the transfers that read or reduce what is not there."""

    def __init__(self, alg: Algorithm, src, dst, step, chunk, op, keep, col: _Collector):
        h = alg.header
        self.alg, self.col = alg, col
        self.coll, self.N, self.C = h.collective, int(h.nranks), int(h.nchunks)
        N, C = self.N, self.C
        self.words = (N + 63) // 64
        self.is_ag = not self.coll.reduces  # copy-only collectives (Allgather, Broadcast): no reductions
        start_rank, start_id, start_set = self.coll.spec.start_holders(N, self.coll.spec.full_chunks(N, C), h.root)
        self.rows, self.want = final_state(self.coll, N, C, h.root)
        # ``ids`` numbers the keys in ascending order, so sorting ids sorts the keys
        universe = np.sort(np.concatenate([dst[keep] * C + chunk[keep], src[keep] * C + chunk[keep],
                                           start_rank * C + start_id, self.rows]))
        self.universe = universe[np.r_[True, universe[1:] != universe[:-1]]] if len(universe) else universe
        need, budget = len(self.universe) * self.words * 8, proof_budget()
        if need > budget:
            raise _too_large(alg, f"the replay that checks this program step by step would keep "
                                  f"{human_size(need)} of state ({len(self.universe):,} (rank, chunk) rows of "
                                  f"{N} ranks' bits), more than the {human_size(budget)} it may")
        self.state = np.zeros((len(self.universe), self.words), dtype=np.uint64)
        self.state[self.ids(start_rank * C + start_id)] = _single_bits(start_set, self.words)
        self.order = keep[stable_argsort(step[keep])] if len(keep) else keep
        o = self.order
        self.S, self.D, self.T, self.K, self.O = src[o], dst[o], step[o], chunk[o], op[o]
        self.rstamp = np.full(len(self.universe), -1, dtype=np.int64)
        self.race_stamp = np.full(len(self.universe), -1, dtype=np.int64)

    def ids(self, keys):
        return np.searchsorted(self.universe, keys)

    def run(self) -> None:
        if not len(self.order):
            return
        C = self.C
        WI, RI = self.ids(self.D * C + self.K), self.ids(self.S * C + self.K)
        bounds = np.r_[0, np.flatnonzero(np.diff(self.T)) + 1, len(self.order)]
        for si in range(len(bounds) - 1):
            a, b = int(bounds[si]), int(bounds[si + 1])
            tr = (self.order[a:b], self.S[a:b], self.D[a:b], self.K[a:b], self.O[a:b], WI[a:b], RI[a:b])
            if b - a > 1:
                rest = self._races(si, int(self.T[a]), *tr)
                if rest is not None:
                    tr = tuple(x[rest] for x in tr)
                    if not len(tr[0]):
                        continue
            self._apply(int(self.T[a]), *tr)

    def _races(self, si: int, t: int, idx, s, d, c, o, wi, ri):
        """The write/write and read/write races of step ``t`` (the ``si``-th), each an error;
        returns which of the step's transfers are not in one (None: no race)."""
        C, col = self.C, self.col
        wk, rk = d * C + c, s * C + c
        self.rstamp[ri] = si
        srt = stable_argsort(wk)
        sw = wk[srt]
        dup_sorted = np.zeros(len(sw), dtype=bool)
        dup_sorted[1:] = sw[1:] == sw[:-1]
        ww_keys = sw[dup_sorted]    # sorted: distinct keys without np.unique (imports numpy.ma)
        ww_keys = ww_keys[np.r_[True, ww_keys[1:] != ww_keys[:-1]]] if len(ww_keys) else ww_keys
        wr_writer = self.rstamp[wi] == si  # writers whose key is also read in this step
        if not len(ww_keys) and not wr_writer.any():
            return None
        self.race_stamp[self.ids(ww_keys)] = si
        self.race_stamp[wi[wr_writer]] = si
        involved = (self.race_stamp[wi] == si) | (self.race_stamp[ri] == si)
        errs: list[tuple[int, int, int, int]] = []  # (kind, index, other, key)
        if len(ww_keys):
            # second writer of each key: first duplicate in the sorted run
            first_dup = dup_sorted.copy()
            first_dup[2:] &= ~dup_sorted[1:-1]
            pos2 = srt[first_dup]
            first_of_run = np.zeros(len(sw), dtype=bool)
            first_of_run[0] = True
            first_of_run[1:] = ~dup_sorted[1:]
            first_pos = {int(kk): int(p) for kk, p in zip(sw[first_of_run], srt[first_of_run])}
            for p in pos2.tolist():
                errs.append((0, int(idx[p]), int(idx[first_pos[int(wk[p])]]), int(wk[p])))
        # write/read races on keys written once
        single = wr_writer.copy()
        if len(ww_keys):
            single &= ~np.isin(wk, ww_keys)
        if single.any():
            readers = np.flatnonzero(np.isin(rk, wk[single]))
            rkeys, first_r = np.unique(rk[readers], return_index=True)
            first_reader = dict(zip(rkeys.tolist(), readers[first_r].tolist()))
            for p in np.flatnonzero(single).tolist():
                errs.append((1, int(idx[p]), int(idx[first_reader[int(wk[p])]]), int(wk[p])))
        errs.sort()
        for kind, i, other, key in errs:
            r_, c_ = divmod(key, C)
            if kind == 0:
                col.add("write-write-race", i, f"rank {r_} chunk {c_} is written twice at step {t}",
                        other, "the other write is at")
            else:
                col.add("read-write-race", i, f"rank {r_} chunk {c_} is written and read at step {t}",
                        other, "it is read at")
        return ~involved

    def _apply(self, t: int, idx, s, d, c, o, wi, ri) -> None:
        """Step ``t``'s race-free transfers: the ones that read an empty chunk, reduce into one,
        reduce in a copy-only collective or count a contribution twice are errors; the others
        move (recv) or merge (rrc) their source's contributions into their destination."""
        sv, dv = self.state[ri], self.state[wi]
        src_empty = ~sv.any(axis=1)
        rrc = o == RRC
        dst_empty = rrc & ~src_empty & ~dv.any(axis=1)
        if self.is_ag:
            ag_red = rrc & ~src_empty & ~dst_empty
            overlap = np.zeros(len(idx), dtype=bool)
        else:
            ag_red = np.zeros(len(idx), dtype=bool)
            overlap = rrc & ~src_empty & ~dst_empty & (sv & dv).any(axis=1)
        errmask = src_empty | dst_empty | ag_red | overlap
        if errmask.any():
            for kind_i, m in enumerate((src_empty, dst_empty, ag_red, overlap)):
                for p in np.flatnonzero(m).tolist():
                    self._transfer_error(kind_i, t, int(idx[p]), int(s[p]), int(d[p]), int(c[p]),
                                         sv[p] & dv[p])
            ok = ~errmask
            wi, sv, dv, rrc = wi[ok], sv[ok], dv[ok], rrc[ok]
        if len(wi):
            newv = sv.copy()
            if rrc.any():
                newv[rrc] |= dv[rrc]
            self.state[wi] = newv

    def _transfer_error(self, kind_i: int, t: int, i: int, s_: int, d_: int, c_: int, both) -> None:
        col = self.col
        if col.full:
            col.total += 1
            return
        if kind_i == 0:
            col.add("undefined-source", i,
                    f"rank {s_} does not hold chunk {c_} at step {t} (it sends it to rank {d_})")
        elif kind_i == 1:
            col.add("undefined-target", i,
                    f"rrc into rank {d_} chunk {c_} at step {t}, which holds no data yet "
                    f"(reduction into undefined data)")
        elif kind_i == 2:
            what = self.coll.dsl_name
            col.add("allgather-reduction", i,
                    f"reduction (rrc) of chunk {c_} from rank {s_} into rank {d_} at step {t} "
                    f"in {'an' if what[0] in 'AEIOU' else 'a'} {what}; use recv")
        else:
            ranks = _ranks_in(both)
            cnt = _popcount(both)
            lst = ", ".join(map(str, ranks)) + (", ..." if cnt > len(ranks) else "")
            col.add("double-count", i,
                    f"rrc of chunk {c_} from rank {s_} into rank {d_} at step {t} counts "
                    f"the contribution of {plural_noun(cnt, 'rank')} {lst} twice")

    def postcondition(self) -> None:
        """The (rank, chunk) pairs that do not end as the collective says, the first few listed
        and the rest summarised."""
        col, rows, C, N, alg = self.col, self.rows, self.C, self.N, self.alg
        met = np.empty(len(rows), dtype=bool)
        full = None if self.is_ag else _full_row(N, self.words)
        block = max(1, POSTCONDITION_BLOCK_BYTES // (8 * self.words))
        for a in range(0, len(rows), block):     # in blocks: the compared copies stay small
            held = self.state[self.ids(rows[a:a + block])]
            # copy-only: the one contribution the chunk started with; reducing: every rank's
            goal = _single_bits(self.want[a:a + block], self.words) if self.is_ag else full
            met[a:a + block] = (held == goal).all(axis=1)
        unmet = rows[~met]
        if not len(unmet):
            return
        listed = min(POSTCONDITION_LISTED, col.limit)
        if len(unmet) == listed + 1:  # list it rather than summarise a single pair
            listed += 1
        what = self.coll.dsl_name
        n = len(alg)
        for row in unmet[:listed].tolist():
            r_, c_ = divmod(row, C)
            if self.coll.spec.end == DEST:   # one destination per id: name the block it is
                _alltoall_unmet(col, alg, r_, c_, n)
                continue
            if self.is_ag:  # copy-only holdings are {owner} or empty: recv only copies
                msg = f"rank {r_} does not hold chunk {c_} at the end"
            else:
                msg = (f"rank {r_} does not hold chunk {c_} at the end "
                       f"(has contributions from {_popcount(self.state[self.ids(row)])} of {N} ranks)")
            notes = (f"postcondition of {what}",)
            if n == 0:
                notes += ("the program has no transfers",)
            col.add_at(POSTCONDITION, alg.header.location, msg, notes)
        if len(unmet) > listed:
            col.add_at(POSTCONDITION_SUMMARY, alg.header.location,
                       f"{len(unmet) - listed} more (rank, chunk) pairs do not meet the {what} postcondition "
                       f"({len(unmet)} of {len(rows)} in total)",
                       count=False)
            col.total += len(unmet) - listed
            col.summarised += len(unmet) - listed
