"""AllToAllv on the host side: a call's counts and displacements, their checks, the oracle, and
what the kernels get (:data:`hccc.compiler.backend.abi.V_DISPLS`, ``hccc_args::vcounts``).

A call of an AllToAll program with per-pair counts (``counts[s][d]`` elements go from rank ``s``
to rank ``d``; zeros allowed; a new matrix every call, the same program) moves block ``(s, d)``
from ``send[s][sd[s][d] : sd[s][d] + counts[s][d]]`` to ``recv[d][rd[d][s] : rd[d][s] +
counts[s][d]]``. Displacements default to packed (:func:`packed_displs`: blocks in rank order,
back to back). The kernels read the matrix from device memory and take the prefix sums
themselves; the program's block-piece table (:mod:`hccc.compiler.ir.vblocks`) tells them which
block every chunk of every primitive carries.

Every call is checked before anything runs (:func:`check_call`, :class:`CountsError` naming the
offending entry): counts are non-negative integers of the right shape, every block lies inside
its rank's send and receive buffers, no two blocks of a receive buffer overlap, and an in-place
call has symmetric counts and equal send and receive displacements (its one buffer then holds
block ``(r, p)`` where block ``(p, r)`` arrives, as MPI's in-place Alltoallv requires).
"""
from __future__ import annotations

import numpy as np

__all__ = ["CountsError", "as_counts", "packed_displs", "check_call", "scratch_slot", "equal_count",
           "expected", "device_displs", "read_counts_file", "MAX_FILE_RANKS", "MAX_FILE_COUNT"]


class CountsError(ValueError):
    """A counts matrix or displacements a call cannot run with (the message names the entry)."""


def as_counts(counts, nranks: int, what: str = "counts", *, row: bool = False) -> np.ndarray:
    """``counts`` as an ``nranks x nranks`` int64 array (with ``row``: one rank's row, ``nranks``
    counts); CountsError for another shape, a value that is not a non-negative integer, or one
    past 2**62."""
    try:
        a = np.asarray(counts)
    except Exception as e:   # ragged nested lists
        raise CountsError(f"{what}: not a {'row' if row else 'matrix'} ({e})") from None
    if row and a.shape != (nranks,):
        raise CountsError(f"{what}: {nranks} counts are needed (one per receiving rank), not shape {a.shape}")
    if not row and a.shape != (nranks, nranks):
        raise CountsError(f"{what}: a {nranks} x {nranks} matrix is needed (one row per sending rank), "
                          f"not shape {a.shape}")
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise CountsError(f"{what}: element counts must be integers, not {a.dtype}")

    def entry(mask) -> tuple[str, object]:
        at = tuple(int(i) for i in np.argwhere(mask)[0])
        return what + "".join(f"[{i}]" for i in at), a[at]

    if np.issubdtype(a.dtype, np.floating):
        bad = ~np.isfinite(a) | (a != np.floor(a))
        if bad.any():
            name, v = entry(bad)
            raise CountsError(f"{name} = {float(v)!r} is not a whole number of elements")
    neg = a < 0
    if neg.any():
        name, v = entry(neg)
        raise CountsError(f"{name} = {int(v)}: a count must be >= 0")
    big = a > 2 ** 62
    if big.any():
        name, v = entry(big)
        raise CountsError(f"{name} = {int(v)} is too large")
    return a.astype(np.int64)


def packed_displs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sd, rd)`` of packed buffers: ``sd[o][p]`` = sum of ``counts[o][j]`` for ``j < p`` (where
    rank ``o`` sends from), ``rd[o][p]`` = sum of ``counts[i][o]`` for ``i < p`` (where it receives)."""
    c = np.asarray(counts, np.int64)
    sd = np.cumsum(c, axis=1) - c
    rd = (np.cumsum(c, axis=0) - c).T.copy()
    return sd, rd


def check_call(counts: np.ndarray, send_lens, recv_lens, sd=None, rd=None, inplace: bool = False):
    """Check one call (see the module docstring) and return its ``(sd, rd)`` (packed where None).
    ``send_lens[r]`` / ``recv_lens[r]``: elements of rank ``r``'s buffers (None: not known here,
    e.g. a peer's in a one-rank-per-process call)."""
    N = len(counts)
    psd, prd = packed_displs(counts)
    sd = psd if sd is None else as_counts(sd, N, "send displacements")
    rd = prd if rd is None else as_counts(rd, N, "receive displacements")
    if inplace:
        asym = counts != counts.T
        if asym.any():
            s, d = np.argwhere(asym)[0]
            raise CountsError(f"an in-place AllToAllv needs symmetric counts (its one buffer holds the block "
                              f"rank r sends to p where the block from p arrives): counts[{s}][{d}] = "
                              f"{int(counts[s, d])} but counts[{d}][{s}] = {int(counts[d, s])}")
        diff = sd != rd
        if diff.any():
            o, p = np.argwhere(diff)[0]
            raise CountsError(f"an in-place AllToAllv needs equal send and receive displacements: rank {o} "
                              f"sends to {p} from element {int(sd[o, p])} but receives from {p} at {int(rd[o, p])}")
    for r in range(N):
        for what, lens, disp, row in (("send", send_lens, sd, counts[r]), ("receive", recv_lens, rd, counts[:, r])):
            n = None if lens is None else lens[r]
            if n is None:
                continue
            end = disp[r] + row
            over = np.flatnonzero((row > 0) & (end > int(n)))
            if len(over):
                p = int(over[0])
                blk = f"counts[{r}][{p}]" if what == "send" else f"counts[{p}][{r}]"
                raise CountsError(f"rank {r}'s {what} buffer holds {int(n)} elements, but the block "
                                  f"{'to' if what == 'send' else 'from'} rank {p} ({blk} = {int(row[p])} at "
                                  f"element {int(disp[r, p])}) ends at {int(end[p])}")
        # blocks that land in one receive buffer must not overlap (two writers of one element)
        live = np.flatnonzero(counts[:, r] > 0)
        if len(live) > 1:
            o = live[np.argsort(rd[r, live], kind="stable")]
            lo, hi = rd[r, o], rd[r, o] + counts[o, r]
            clash = np.flatnonzero(lo[1:] < hi[:-1])
            if len(clash):
                a, b = int(o[clash[0]]), int(o[clash[0] + 1])
                raise CountsError(f"rank {r} receives the blocks from ranks {a} and {b} into overlapping "
                                  f"elements ([{int(rd[r, a])}, {int(rd[r, a] + counts[a, r])}) and "
                                  f"[{int(rd[r, b])}, {int(rd[r, b] + counts[b, r])}))")
    return sd, rd


def scratch_slot(counts: np.ndarray, k: int) -> int:
    """Elements of the largest block piece (``K`` pieces a block): a scratch slot's size."""
    c = np.asarray(counts, np.int64)
    return int(((c + k - 1) // k).max()) if c.size else 0


def equal_count(counts: np.ndarray, k: int) -> int:
    """The element count of the equal-size AllToAll whose every piece is as large as the call's
    largest: what sizes the call's slice and protocol (the largest block gets the micro-batches
    the model picks for its size; smaller blocks ride in the same units)."""
    c = np.asarray(counts)
    return scratch_slot(c, k) * k * len(c)


def expected(sends: list[np.ndarray], recvs_before: list[np.ndarray], counts: np.ndarray, sd, rd) -> list[np.ndarray]:
    """The oracle: every rank's receive buffer after the call (elements no block lands on keep
    their value)."""
    N = len(counts)
    out = [np.array(x, copy=True) for x in recvs_before]
    for s in range(N):
        for d in range(N):
            c = int(counts[s, d])
            if c:
                out[d][int(rd[d, s]):int(rd[d, s]) + c] = sends[s][int(sd[s, d]):int(sd[s, d]) + c]
    return out


def device_displs(sd: np.ndarray, rd: np.ndarray) -> np.ndarray:
    """``hccc_args::vdispls`` (:data:`hccc.compiler.backend.abi.V_DISPLS`): ``sd`` then ``rd``."""
    return np.concatenate([np.asarray(sd, np.int64).ravel(), np.asarray(rd, np.int64).ravel()])


# ---------------------------------------------------------------------------- counts files
#: the most ranks a counts file may describe (a 4096 x 4096 matrix: 16 M entries)
MAX_FILE_RANKS = 4096
#: the largest count a counts file may give (elements of one block; 2**48 is 256 TiB of bytes)
MAX_FILE_COUNT = 1 << 48


def read_counts_file(path) -> np.ndarray:
    """A counts matrix from a text file (``hccc sim --counts``): one line per sending rank ``s``,
    holding ``counts[s][0] .. counts[s][N-1]`` (elements, non-negative decimal integers) separated
    by spaces, tabs or commas; ``#`` starts a comment; blank lines are skipped. Every row must
    have ``N`` entries for ``N`` rows. Errors are :class:`~hccc.util.diagnostics.CompileError`
    located at the line and column of the offending entry."""
    import re

    from hccc.util.diagnostics import CompileError, Location, SourceFile
    src = SourceFile.read(path)
    rows, where = [], []
    for ln, line in enumerate(src.text.splitlines(), start=1):
        body = line.split("#", 1)[0]
        toks = [(m.group(), m.start() + 1) for m in re.finditer(r"[^\s,]+", body)]
        if not toks:
            continue
        row = []
        for tok, col in toks:
            if not re.fullmatch(r"[0-9]+", tok):
                raise CompileError.at(Location(src, ln, col), f"'{tok[:40]}' is not a count: counts are "
                                                              "non-negative whole numbers of elements")
            v = int(tok) if len(tok) <= 20 else MAX_FILE_COUNT + 1
            if v > MAX_FILE_COUNT:
                raise CompileError.at(Location(src, ln, col), f"count {tok[:40]} is larger than {MAX_FILE_COUNT}")
            row.append(v)
        if len(rows) >= MAX_FILE_RANKS:
            raise CompileError.at(Location(src, ln, 1), f"more than {MAX_FILE_RANKS} rows (ranks)")
        rows.append(row)
        where.append((ln, toks))
    if not rows:
        raise CompileError.at(Location(src, 1, 1), "no counts: expected one line of counts per sending rank")
    n = len(rows)
    for i, (row, (ln, toks)) in enumerate(zip(rows, where)):
        if len(row) != n:
            col = toks[n][1] if len(row) > n else len(src.text.splitlines()[ln - 1].split("#", 1)[0].rstrip()) + 1
            raise CompileError.at(Location(src, ln, col), f"row {i} has {len(row)} counts, but the "
                                                          f"file has {n} rows: a {n} x {n} matrix is needed")
    return np.array(rows, dtype=np.int64)
