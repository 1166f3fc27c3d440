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

import codecs
import re
from pathlib import Path

import numpy as np

from hccc.util.diagnostics import (CompileError, Diagnostic, Location, SourceFile, printable,
                                   read_input_bytes)

__all__ = ["CountsError", "as_counts", "packed_displs", "check_call", "scratch_slot", "equal_count", "launch_count",
           "expected", "device_displs", "exact_sum", "read_counts_file", "MAX_ELEMENTS", "MAX_FILE_RANKS",
           "MAX_FILE_COUNT"]

#: the largest count, displacement or block end (elements) a call may name: 2**62, so that the sum
#: of any two fits in int64 (every check below is written not to form a larger sum at all), and
#: more elements than any memory holds
MAX_ELEMENTS = 1 << 62


class CountsError(ValueError):
    """A counts matrix or displacements a call cannot run with (the message names the entry)."""


def as_counts(counts, nranks: int, what: str = "counts", *, row: bool = False) -> np.ndarray:
    """``counts`` as an ``nranks x nranks`` int64 array (with ``row``: one rank's row, ``nranks``
    counts); CountsError for another shape, a value that is not a non-negative integer, or one
    past :data:`MAX_ELEMENTS`."""
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
    big = a > MAX_ELEMENTS
    if big.any():
        name, v = entry(big)
        raise CountsError(f"{name} = {int(v)} is too large (at most 2**62)")
    return a.astype(np.int64)


def _first_past(cum: np.ndarray):
    """The first index (row-major) where a running sum of counts (int64, each addend at most
    :data:`MAX_ELEMENTS`) passes :data:`MAX_ELEMENTS`, or None. The first sum past it is at most
    2**63, which int64 holds or wraps to -2**63: negative, while every earlier sum is not."""
    bad = (cum > MAX_ELEMENTS) | (cum < 0)
    return tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None


def exact_sum(counts) -> int:
    """The sum of non-negative int64 counts (each at most :data:`MAX_ELEMENTS`) as a Python
    integer, however many: the high and low 31 bits are summed apart (no int64 sum wraps below
    2**32 entries)."""
    c = np.asarray(counts, np.int64)
    return int((c >> 31).sum()) * (1 << 31) + int((c & ((1 << 31) - 1)).sum())


def packed_displs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(sd, rd)`` of packed buffers: ``sd[o][p]`` = sum of ``counts[o][j]`` for ``j < p`` (where
    rank ``o`` sends from), ``rd[o][p]`` = sum of ``counts[i][o]`` for ``i < p`` (where it receives).
    CountsError naming the entry where a rank's blocks pass :data:`MAX_ELEMENTS` in all (no
    buffer holds them; the sums would wrap in int64)."""
    c = np.asarray(counts, np.int64)
    rows, cols = np.cumsum(c, axis=1), np.cumsum(c, axis=0)
    at = _first_past(rows)
    if at is not None:
        s, d = at
        raise CountsError(f"rank {s}'s blocks to ranks 0..{d} (counts[{s}][0..{d}]) hold more than 2**62 "
                          "elements: no send buffer holds them")
    at = _first_past(cols.T)
    if at is not None:
        d, s = at
        raise CountsError(f"rank {d}'s blocks from ranks 0..{s} (counts[0..{s}][{d}]) hold more than 2**62 "
                          "elements: no receive buffer holds them")
    return rows - c, (cols - c).T.copy()


def _block_end(disp: int, count: int) -> int:
    """Where a block ends (a Python integer: no wrap)."""
    return int(disp) + int(count)


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
            # (a buffer's length as given; the blocks are compared with it, never summed past it:
            # a block of c elements at x fits n elements when c <= n and x <= n - c)
            n = MAX_ELEMENTS if n is None else min(max(int(n), 0), MAX_ELEMENTS)
            over = np.flatnonzero((row > 0) & ((row > n) | (disp[r] > n - row)))
            if len(over):
                p = int(over[0])
                blk = f"counts[{r}][{p}]" if what == "send" else f"counts[{p}][{r}]"
                held = (f"rank {r}'s {what} buffer holds {n} elements" if lens is not None and lens[r] is not None
                        else f"no {what} buffer holds more than 2**62 elements")
                raise CountsError(f"{held}, but the block {'to' if what == 'send' else 'from'} rank {p} "
                                  f"({blk} = {int(row[p])} at element {int(disp[r, p])}) ends at "
                                  f"{_block_end(disp[r, p], row[p])}")
        # blocks that land in one receive buffer must not overlap (two writers of one element);
        # every block ends by 2**63 (checked above): no sum wraps
        live = np.flatnonzero(counts[:, r] > 0)
        if len(live) > 1:
            o = live[np.argsort(rd[r, live], kind="stable")]
            lo, hi = rd[r, o], rd[r, o] + counts[o, r]
            clash = np.flatnonzero(lo[1:] < hi[:-1])
            if len(clash):
                a, b = int(o[clash[0]]), int(o[clash[0] + 1])
                raise CountsError(f"rank {r} receives the blocks from ranks {a} and {b} into overlapping "
                                  f"elements ([{int(rd[r, a])}, {_block_end(rd[r, a], counts[a, r])}) and "
                                  f"[{int(rd[r, b])}, {_block_end(rd[r, b], counts[b, r])}))")
    return sd, rd


def scratch_slot(counts: np.ndarray, k: int) -> int:
    """Elements of the largest block piece (``K`` pieces a block): a scratch slot's size."""
    c = np.asarray(counts, np.int64)
    return -(-int(c.max()) // int(k)) if c.size else 0


def equal_count(counts: np.ndarray, k: int) -> int:
    """The element count of the equal-size AllToAll whose every piece is as large as the call's
    largest: what sizes the call's slice and protocol (the largest block gets the micro-batches
    the model picks for its size; smaller blocks ride in the same units)."""
    c = np.asarray(counts)
    return scratch_slot(c, k) * int(k) * len(c)     # (Python integers: no wrap)


def launch_count(slot: int, k: int, nranks: int) -> int:
    """The element count an AllToAllv call is launched, planned and its FIFOs sized as (both
    launchers alike): the equal-size AllToAll whose every piece is a scratch slot of ``slot``
    elements (:func:`scratch_slot`; at least one, so that a call whose counts are all zero, or
    are known only on the device, still has a slice, a protocol and a slot to launch with), ``k``
    pieces a block, ``nranks`` blocks. A program's AllToAll buffer is ``k * nranks`` chunks, so
    its largest chunk at that count is exactly the largest piece."""
    return max(int(slot), 1) * int(k) * int(nranks)


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


#: what ends a line of a counts file (the breaks of ``str.splitlines``: a located error's line is
#: the line an editor shows), a ``#`` comment, a token
_SCAN = re.compile(r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]|#|[^\s,#]+")
_BREAK = re.compile(r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
#: a token longer than this is refused as it streams in (a count has at most 15 digits)
_TOKEN_MAX = 64
#: characters of the offending line a located error shows
_SHOWN = 200


class _Shown(SourceFile):
    """The one line of a counts file a located error shows (the file is never held whole)."""

    def __init__(self, name: str, line: int, text: str | None):
        super().__init__(name, "")
        object.__setattr__(self, "_line", (line, text))

    def line_text(self, line: int) -> str | None:
        at, text = self._line
        return text if line == at else None


class _CountsReader:
    """A counts file read as it streams in (:func:`read_counts_file`): one line at a time, the
    matrix filled row by row, the first line that cannot fit the expected shape refused at once."""

    def __init__(self, name: str, nranks: int | None, owner: str | None):
        self.name, self.n, self.owner = name, nranks, owner
        self.mat = None if nranks is None else np.zeros((nranks, nranks), np.int64)
        self.rows = 0
        self.row: list[int] = []
        self.ln, self.line_start, self.total = 1, 0, 0
        self.comment = False
        self.carry, self.base = "", 0
        self.tok_end = 1        # the column after the last token of the line
        self.dec = codecs.getincrementaldecoder("utf-8")()

    # ------------------------------------------------------------------ errors
    def fail(self, col: int, message: str, buf: str | None = None):
        text = None
        if buf is not None and self.line_start >= self.base:
            rest = buf[self.line_start - self.base:]
            m = _BREAK.search(rest)
            text = (rest[:m.start()] if m else rest)[:_SHOWN]
        shown = text if text is not None and col <= len(text) + 1 else None
        raise CompileError.at(Location(_Shown(self.name, self.ln, shown), self.ln, col), message)

    def _needed(self) -> str:
        n = self.n
        who = f"{self.owner} has {n} ranks" if self.owner else f"row 0 has {n} counts"
        return f"{who}: a {n} x {n} matrix is needed"

    # ------------------------------------------------------------------ bytes and text
    def feed(self, block: bytes) -> None:
        try:
            text = self.dec.decode(block)
        except UnicodeDecodeError as exc:
            good = bytes(exc.object[:exc.start]).decode("utf-8", errors="replace")
            self._text(good, stop=True)
            self.fail(self.total - self.line_start + 1,
                      f"invalid UTF-8 byte 0x{exc.object[exc.start]:02x} (binary input?)")
        nul = text.find("\x00")
        if nul >= 0:
            self._text(text[:nul], stop=True)
            self.fail(self.total - self.line_start + 1, "file contains a NUL byte (binary input?)")
        self._text(text)

    def feed_end(self) -> None:
        """The end of the file: a truncated UTF-8 sequence is refused, the last token scanned."""
        try:
            tail = self.dec.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            self._text("", stop=True)
            self.fail(self.total - self.line_start + 1,
                      f"invalid UTF-8 byte 0x{exc.object[exc.start]:02x} (binary input?)")
        self._text(tail, stop=True)

    def _text(self, text: str, stop: bool = False) -> None:
        buf = self.carry + text
        self.base, self.carry = self.total - len(self.carry), ""
        self.total += len(text)
        self._scan(buf, final=stop)

    def _scan(self, buf: str, final: bool) -> None:
        i, end = 0, len(buf)
        while i < end:
            if self.comment:
                m = _BREAK.search(buf, i)
                if m is None:
                    return
                if m.group() == "\r" and m.end() == end and not final:
                    self.carry = "\r"        # (maybe the first half of a \r\n)
                    return
                self.comment = False
                i = m.start()
                continue
            m = _SCAN.search(buf, i)
            if m is None:
                return
            tok = m.group()
            brk = _BREAK.fullmatch(tok) is not None
            if m.end() == end and not final and (tok == "\r" or (tok != "#" and not brk and len(tok) <= _TOKEN_MAX)):
                self.carry = tok        # (the rest of it may come with the next block)
                return
            i = m.end()
            if tok == "#":
                self.comment = True
            elif brk:
                self._end_line(buf)
                self.ln += 1
                self.line_start = self.base + m.end()
                self.tok_end = 1
            else:
                self._token(tok, self.base + m.start() - self.line_start + 1, buf)

    def _token(self, tok: str, col: int, buf: str) -> None:
        if not re.fullmatch(r"[0-9]+", tok):
            self.fail(col, f"'{tok[:40]}' is not a count: counts are non-negative whole numbers of elements", buf)
        v = int(tok) if len(tok) <= 20 else MAX_FILE_COUNT + 1
        if v > MAX_FILE_COUNT:
            self.fail(col, f"count {tok[:40]} is larger than {MAX_FILE_COUNT}", buf)
        if not self.row:
            if self.n is not None and self.rows >= self.n:
                self.fail(col, f"more than {self.n} rows, but {self._needed()}", buf)
            if self.rows >= MAX_FILE_RANKS:
                self.fail(col, f"more than {MAX_FILE_RANKS} rows (ranks)", buf)
        width = self.n if self.n is not None else MAX_FILE_RANKS
        if len(self.row) >= width:
            if self.n is None:
                self.fail(col, f"more than {MAX_FILE_RANKS} counts in a row (ranks)", buf)
            self.fail(col, f"row {self.rows} has more than {self.n} counts, but {self._needed()}", buf)
        self.row.append(v)
        self.tok_end = col + len(tok)

    def _end_line(self, buf: str | None) -> None:
        if not self.row:
            return
        if self.n is None:                  # no rank count given: the first row's
            self.n = len(self.row)
            self.mat = np.zeros((self.n, self.n), np.int64)
        if len(self.row) != self.n:
            self.fail(self.tok_end, f"row {self.rows} has {len(self.row)} counts, but {self._needed()}", buf)
        self.mat[self.rows] = self.row
        self.rows += 1
        self.row = []

    def finish(self) -> np.ndarray:
        self.feed_end()
        self._end_line(None)
        if self.rows == 0:
            self.ln = 1
            self.fail(1, "no counts: expected one line of counts per sending rank")
        if self.rows != self.n:
            self.fail(1, f"the file ends after {self.rows} row{'s' if self.rows != 1 else ''}, but "
                         f"{self._needed()}")
        return self.mat


def read_counts_file(path, nranks: int | None = None, owner: str | None = None) -> np.ndarray:
    """A counts matrix from a text file (``hccc sim --counts``, ``hccc run --counts``): one line per
    sending rank ``s``, holding ``counts[s][0] .. counts[s][N-1]`` (elements, non-negative decimal
    integers) separated by spaces, tabs or commas; ``#`` starts a comment; blank lines are
    skipped. ``nranks``: the program's rank count ``N`` (``owner``: the program's name, for the
    messages), else ``N`` is the first row's width. The file is read as it streams in and checked
    line by line: reading stops at the first line that cannot fit an ``N x N`` matrix (a row of
    another width, a row past ``N``), so memory is the ``N x N`` matrix and one block of the file,
    whatever the file holds. Errors are :class:`~hccc.util.diagnostics.CompileError` located at the
    line and column of the offending entry."""
    if nranks is not None and not 1 <= int(nranks) <= MAX_FILE_RANKS:
        raise CompileError([Diagnostic(f"{printable(str(path))}: a counts file describes at most "
                                       f"{MAX_FILE_RANKS} ranks, not {int(nranks)}", None)])
    reader = _CountsReader(str(Path(path)), None if nranks is None else int(nranks), owner)
    read_input_bytes(path, sink=reader.feed)
    return reader.finish()
