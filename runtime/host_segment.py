"""The host side of a one-rank-per-process job (:class:`~hccc.runtime.communicator.Communicator`):
every rank's host segment, a small block of POSIX shared memory its peers map (across nodes: a
mirror the network proxy keeps, :mod:`hccc.runtime.net`), and what the ranks do through them.

A segment holds 64-bit words (the process id, the barrier counter, the state, the call being made:
its number, collective, count, element type / op / protocol / LL epoch, the caller's tag and the
AllToAllv counts digest, and the last call this rank's kernel completed), then a failed rank's
reason and an AllToAllv counts row. :class:`HostSegments` holds this rank's and the mapped peers':

* :meth:`~HostSegments.barrier`: every rank reached the same point, watching the peers meanwhile;
* :meth:`~HostSegments.post_call` / :meth:`~HostSegments.call_mismatch`: every rank's call compared
  at its first barrier, so a mismatch is an error on every rank, not a hang;
* :meth:`~HostSegments.peer_problem`: a peer that died, closed or reported a failure;
* :meth:`~HostSegments.report_failure`: this rank's failure and its reason, for the peers to read;
* :meth:`~HostSegments.gather_rows`: every rank's AllToAllv counts row, assembled into the matrix.
"""
from __future__ import annotations

import os
import struct
import time

import numpy as np

from hccc.compiler.backend.abi import PROTOS
from hccc.runtime import shm
from hccc.util import dtypes as dtypes_table

# host segment: uint64 words
_H_MAGIC, _H_PID, _H_SEQ, _H_STATE, _H_CALL, _H_COLL, _H_COUNT, _H_TYPE, _H_DONE, _H_TAG, _H_VDIGEST = range(11)
# (word 15: the network proxy's heartbeat in multi-node jobs, hccc.runtime.net.BEAT_OFFSET)
_WORDS = 16
_MAGIC = 0x48434343434F4D31           # "HCCCCOM1"
RUNNING, FAILED, CLOSED = 0, 1, 2
#: the barrier's poll interval once its first millisecond has passed (peers usually arrive within it)
_POLL_S = 0.0005
#: how often a barrier looks at its peers' health while it waits
_WATCH_S = 0.02
_REASON_AT, _REASON_MAX = 128, 1024       # a failed rank's reason, in its host segment
#: a rank's AllToAllv counts row (``all_to_all_v(send_counts=)``), in its host segment after the
#: reason: the number of the call it belongs to, then ``nranks`` int64 counts
_ROW_AT = _REASON_AT + _REASON_MAX
_DTYPES, _OPS = dtypes_table.DTYPE_NAMES, dtypes_table.OP_NAMES
#: ``hccc_args::proto`` per protocol name
_PROTO_CODE = {name.lower(): code for name, code in PROTOS}


def host_segment_bytes(nranks: int) -> int:
    """A rank's host segment: the words, the failure reason and a counts row (at least a page)."""
    return max(4096, _ROW_AT + 8 * (1 + int(nranks)))


def call_type(dtype: str, op: str, proto: str, epoch: int = 0, zero: bool = False) -> int:
    """The host segment's word for a call's element type, op, FIFO protocol and LL flag epoch
    (with whether the call zeroes the slots first: :class:`~hccc.runtime.ll_epoch.LLEpochs`)."""
    return (_DTYPES.index(dtype) * 16 + _OPS.index(op) + 256 * _PROTO_CODE[proto] +
            (int(zero) << 16) + (int(epoch) << 17))


def describe_type(word: int) -> str:
    """``float32 (sum, ll) in LL epoch 3`` from a :func:`call_type` word."""
    epoch, word = divmod(word, 1 << 17)
    zero, word = divmod(word, 1 << 16)
    pr, rest = divmod(word, 256)
    pd, po = divmod(rest, 16)
    protos = {v: k for k, v in _PROTO_CODE.items()}
    return (f"{_DTYPES[pd] if pd < len(_DTYPES) else '?'} ({_OPS[po] if po < len(_OPS) else '?'}, "
            f"{protos.get(pr, '?')})" + (f" in LL epoch {epoch}{' (zeroing)' if zero else ''}" if pr else ""))


def words(seg) -> np.ndarray:
    """The 64-bit words of a host segment (this rank's, a mapped peer's or a mirror)."""
    return np.frombuffer(seg._map, dtype=np.uint64, count=_WORDS)


_WORD = struct.Struct("<Q")


def word(seg, index: int) -> int:
    """One 64-bit word of a host segment, read without a view of it (the polls of barriers and
    waits read one word of every peer many times a call)."""
    return _WORD.unpack_from(seg._map, 8 * index)[0]


def reason(seg) -> str:
    """The failure reason a rank wrote into its host segment."""
    raw = bytes(seg._map[_REASON_AT:_REASON_AT + _REASON_MAX])
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace") or "no reason given"


class HostSegments:
    """Rank ``rank``'s host segment (created here, :attr:`own`) and the ones of its peers
    (:attr:`peers`, mapped by :meth:`attach` or given as the network's mirrors), with the peers'
    process ids and nodes (:meth:`know`) and the network link of a job across nodes (:attr:`net`,
    or None) for telling whether a peer is alive. ``timeout_s``: how long a barrier waits.
    ``wake``: the condition every rank of a job whose ranks are threads of this process shares
    (:attr:`hccc.runtime.bootstrap.Bootstrap.wake`), or None: a rank that reaches a barrier
    notifies it, and a waiting rank sleeps on it instead of polling. ``in_process``: every peer
    is a thread of this process, and this rank's segment is this process's memory
    (:func:`hccc.runtime.shm.private`), which they take as an object (:meth:`attach`), not POSIX
    shared memory they map by name."""

    def __init__(self, rank: int, nranks: int, timeout_s: float, wake=None, in_process: bool = False):
        self.rank, self.nranks, self.timeout_s = int(rank), int(nranks), float(timeout_s)
        self.wake = wake
        self._pid = os.getpid()
        self.own = (shm.private if in_process else shm.create)(host_segment_bytes(nranks))
        self.mine = words(self.own)
        self.mine[_H_PID] = os.getpid()
        self.mine[_H_MAGIC] = _MAGIC
        self.peers: dict = {}
        self.pids: list[int] = []
        self.nodes: list[str] = []
        self.net = None
        self._seq = 0

    def know(self, pids: list[int], nodes: list[str]) -> None:
        """Every rank's process id and node (from the bootstrap's exchange)."""
        self.pids, self.nodes = [int(p) for p in pids], list(nodes)

    def attach(self, rank: int, handle: bytes | None = None, mirror=None, segment=None) -> None:
        """Map peer ``rank``'s segment from its ``handle``, or take the network's ``mirror`` of it,
        or the ``segment`` itself (a peer in this process: :func:`hccc.runtime.shm.private`)."""
        if segment is not None:
            if not isinstance(segment, shm.PrivateSegment):
                raise shm.ShmError(f"rank {rank}'s host segment is not memory of this process")
            self.peers[rank] = segment
            return
        self.peers[rank] = mirror if mirror is not None else shm.attach(handle)

    # ------------------------------------------------------------------ health
    def peer_problem(self, call: int | None = None, watch=None) -> str | None:
        """Why a peer cannot take part any more (died, closed, failed), or None. During call
        ``call`` a peer whose kernel completed that call may close, exit or fail later: it owes
        nothing more to this call. Dead peers are named before peers that report a failure (the
        cause before its echoes). ``watch``: the caller's own check, asked first (a reason or None)."""
        failed = None
        if watch is not None and (why := watch()):
            return why
        for r, seg in self.peers.items():
            if call is not None and word(seg, _H_DONE) >= call:
                continue
            state = word(seg, _H_STATE)
            if state == FAILED:
                failed = failed or f"rank {r} failed ({reason(seg)})"
            elif state == CLOSED:
                return f"rank {r} closed its communicator"
            elif self.net is not None and (lost := self.net.peer_problem(r, words(seg))):
                return lost         # across nodes: connection lost, heartbeat stopped
            elif ((self.net is None or r not in self.net.remote) and self.pids[r] != self._pid
                  and not shm.process_alive(self.pids[r])):     # (a rank of this process runs)
                where = f" on node {self.nodes[r]}" if self.net is not None else ""
                return f"rank {r} (process {self.pids[r]}{where}) exited"
        return failed

    def report_failure(self, why: str) -> None:
        """This rank failed: its reason and state, for the peers to read."""
        text = why.encode("utf-8")[:_REASON_MAX - 1] + b"\0"
        self.own._map[_REASON_AT:_REASON_AT + len(text)] = text
        self.mine[_H_STATE] = FAILED

    def rejoin(self, seq: int) -> None:
        """This rank runs again after a failure every rank of an in-process job has seen (its
        peers rejoin with it): the state running, the reason gone, and ``seq`` barriers passed
        (the most any rank of the job passed)."""
        self.own._map[_REASON_AT:_REASON_AT + _REASON_MAX] = bytes(_REASON_MAX)
        self._seq = int(seq)
        self.mine[_H_SEQ] = self._seq
        self.mine[_H_STATE] = RUNNING

    def mark_closed(self) -> None:
        self.mine[_H_STATE] = CLOSED

    def mark_done(self, call: int) -> None:
        """This rank's kernel completed call ``call``."""
        self.mine[_H_DONE] = call

    # ------------------------------------------------------------------ barriers and calls
    def barrier(self, what: str, watch=None) -> str | None:
        """Wait until every peer reached this barrier (the ``n``-th of every rank), watching the
        peers; None, or why it failed (a peer's problem, or the timeout) for the caller to raise."""
        self._seq += 1
        target = self._seq
        self.mine[_H_SEQ] = target
        if self.wake is not None:
            # only the rank that completes the barrier wakes the others (every waiter checks under
            # this lock before it sleeps, and the last to arrive sees every peer's counter here):
            # one wake-up per waiter, not one per waiter and arrival
            with self.wake:
                if self._arrived(self.peers, target):
                    self.wake.notify_all()
        start = time.monotonic()
        deadline = start + self.timeout_s
        waiting = list(self.peers)
        last_check = start
        while waiting:
            waiting = [r for r in waiting if word(self.peers[r], _H_SEQ) < target]
            if not waiting:
                break
            now = time.monotonic()
            if now - last_check > _WATCH_S:
                last_check = now
                bad = self.peer_problem(watch=watch)
                if bad:
                    return f"{bad} ({what})"
            if now > deadline:
                return (f"rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} did not "
                        f"reach {what} within {self.timeout_s:g} s")
            if self.wake is None:
                # yield for the first millisecond (peers usually arrive within it), then sleep
                time.sleep(0 if now - start < 1e-3 else _POLL_S)
                continue
            with self.wake:     # checked under the lock the peers notify with: no arrival is missed
                if not self._arrived(waiting, target):
                    self.wake.wait(_WATCH_S)
        return None

    def _arrived(self, ranks, target: int) -> bool:
        """Whether every rank of ``ranks`` (peers) has reached barrier ``target``."""
        return all(word(self.peers[r], _H_SEQ) >= target for r in ranks)

    def post_call(self, call: int, collective: int, count: int, type_word: int, tag: int = 0,
                  digest: int = 0) -> None:
        """The call this rank is making, for every peer to compare (:meth:`call_mismatch`)."""
        w = self.mine
        w[_H_CALL], w[_H_COLL], w[_H_COUNT] = call, collective, count
        w[_H_TYPE] = type_word
        w[_H_TAG] = int(tag) & ((1 << 64) - 1)
        w[_H_VDIGEST] = digest

    def call_mismatch(self, what: str) -> str | None:
        """After the call's first barrier: why some peer's posted call differs from this rank's
        (counts digest, caller's tag, count or type), or None. Every rank compares with every
        peer, so a rank whose call differs is seen by all."""
        mine = self.mine
        count, typ, tag, dig = (int(mine[i]) for i in (_H_COUNT, _H_TYPE, _H_TAG, _H_VDIGEST))
        for r, seg in self.peers.items():
            w = words(seg)
            if int(w[_H_VDIGEST]) != dig:
                return (f"{what}: rank {r}'s AllToAllv counts (and displacements; with device counts, "
                        f"its buffer lengths) differ from this rank's (digest {int(w[_H_VDIGEST]):#018x}, "
                        f"this rank {dig:#018x}); every rank must pass the same counts matrix (with "
                        "device counts, buffers of one size)")
            if int(w[_H_TAG]) != tag and int(w[_H_COUNT]) == count and int(w[_H_TYPE]) == typ:
                return (f"{what}: rank {r}'s call differs from this rank's in what its caller asked "
                        f"for (call tag {int(w[_H_TAG]):#x}, this rank {tag:#x}); every rank must make "
                        "the same call")
            if int(w[_H_COUNT]) != count or int(w[_H_TYPE]) != typ:
                return (f"{what}: rank {r} passes {int(w[_H_COUNT])} elements of "
                        f"{describe_type(int(w[_H_TYPE]))}, this rank {count} elements of "
                        f"{describe_type(typ)}; every rank must make the same call")
        return None

    def post_row(self, call: int, row: np.ndarray) -> None:
        """This rank's AllToAllv counts row for call ``call``: the row, then the stamp (a peer that
        sees the stamp sees the row)."""
        w = np.frombuffer(self.own._map, dtype=np.int64, count=1 + self.nranks, offset=_ROW_AT)
        w[1:] = row
        w[0] = call

    def rows(self, call: int, mine: np.ndarray) -> tuple[np.ndarray | None, int | None]:
        """After a barrier that follows :meth:`post_row`: (the counts matrix, None), or (None, the
        first peer whose row is not stamped with call ``call``: it made another call). Each rank
        finished reading before any rank can pass the next call's first barrier and overwrite its
        row."""
        c = np.empty((self.nranks, self.nranks), np.int64)
        c[self.rank] = mine
        for r, seg in self.peers.items():
            w = np.frombuffer(seg._map, dtype=np.int64, count=1 + self.nranks, offset=_ROW_AT)
            if int(w[0]) != call:
                return None, r
            c[r] = w[1:]
        return c, None

    def close(self) -> None:
        """Unmap the peers' segments and this rank's own."""
        for seg in self.peers.values():
            seg.close()
        self.peers.clear()
        self.own.close()


__all__ = ["RUNNING", "FAILED", "CLOSED", "host_segment_bytes", "call_type", "describe_type", "words",
           "reason", "HostSegments"]
