"""Per-call agreement of an ``"hccc"`` process group: every rank's calls, compared.

torch requires every rank of a group to make the same collective calls in the same order, and
nothing below the backend can check all of it: AVG and SUM run the same kernel, a barrier and a
one-element all_reduce the same algorithm, and two calls that take different routes (two catalog
entries, an entry and the delegate) never meet at all. So the process group numbers its calls (the
n-th call of the group, the same number on every rank) and describes each with everything the
caller asked for: the call's kind (a barrier is its own kind), torch's operation, dtype, element
counts, root, device type (:func:`describe`). Before the call runs, the rank posts
``(number, digest, text)`` into its slot of a ring every peer can read (:class:`ShmLedger`, shared
memory, for a group on one host; :class:`StoreLedger`, the group's store, for a group across
hosts). Then

- while the call waits (a Communicator's host barrier or kernel, or the delegate's work), the rank
  compares its call with every peer's call of the same number (:meth:`Ledger.conflict`): a peer
  that made another call is an error at once, on both ranks, instead of a hang until the timeout;
  so is a peer whose call of that number failed after it was posted, or whose group became
  unusable at an earlier call (its error, which it records next to its ring: :meth:`Ledger.fail`),
  which the waiting rank would otherwise wait out;
- after a delegate's call the rank waits until every peer has posted that number and compares
  (:meth:`Ledger.settle`): two calls that completed although they differ (two delegate calls with
  different ops) are an error on every rank too. (A call that completed on one of hccc's
  algorithms needs no such look: every rank's call met it there, and the Communicator compared
  their digests before its kernel ran.)

The digest also goes into the Communicator's own per-call check (its ``call_tag``), so two ranks
whose different calls reach the same algorithm are refused before the kernel touches their data.
"""
from __future__ import annotations

import hashlib
import struct
import time

#: slots in each rank's ring: a peer can be at most a call or two ahead of a rank still comparing
#: (a collective completes only once every rank has posted it); 64 leaves a wide margin, and a
#: slot that was already reused is simply not compared
RING = 64
#: bytes of one slot: number, digest, then the call's text (NUL-padded)
SLOT_BYTES = 128
_HEAD = struct.Struct("<QQ")
TEXT_BYTES = SLOT_BYTES - _HEAD.size
#: bytes of a rank's failure record, after its ring: the number of the call that failed, whether
#: every later call fails too (the group is unusable there), then why (NUL-padded): room for a
#: one-line error message; a longer one is cut
FAIL_BYTES = 512
FAIL_TEXT_BYTES = FAIL_BYTES - 16
#: how often a waiting rank looks at its peers' calls through a store (a network round trip per
#: peer; shared memory is read on every poll of the wait loops instead)
STORE_POLL_S = 0.05


#: call texts whose slot bytes a ledger keeps (a job makes a handful of call shapes)
TEXT_CACHE_MAX = 256


class CallMismatch(RuntimeError):
    """Two ranks made different calls as the same call of their group."""


def describe(kind: str, *, op: str | None = None, dtype=None, counts=(), root: int | None = None,
             device: str = "cpu", extra: str = "") -> str:
    """The text of one call: ``allreduce(op=avg, float32, 1024 elements, cpu)``."""
    parts = []
    if op is not None:
        parts.append(f"op={op}")
    if dtype is not None:
        parts.append(str(dtype).replace("torch.", ""))
    if counts:
        parts.append("elements " + "/".join(str(int(c)) for c in counts))
    if root is not None:
        parts.append(f"root {int(root)}")
    parts.append(device)
    if extra:
        parts.append(extra)
    return f"{kind}({', '.join(parts)})"


def digest(text: str) -> int:
    """A non-zero 64-bit digest of a call's text."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


class Ledger:
    """Posts this rank's calls and reads its peers' (see the module docstring)."""

    rank: int
    size: int
    #: seconds between looks at a peer's slot while :meth:`settle` waits
    poll_s = 0.0002

    def post(self, seq: int, text: str, tag: int) -> None:
        raise NotImplementedError

    def peer(self, r: int, seq: int) -> tuple[int, int, str] | None:
        """Rank ``r``'s post for call ``seq``: (seq, digest, text) as found in its slot (an older
        or newer call's when it has not posted this one yet or already reused the slot)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def fail(self, seq: int, why: str, onward: bool = False) -> None:
        """Record that this rank's call ``seq`` (posted) failed, and why -- ``onward``: and every
        later call, the group being unusable here: peers waiting for it are told at once
        (:meth:`conflict`) instead of at the timeout. A rank keeps its latest record."""
        raise NotImplementedError

    def record(self, r: int) -> tuple[int, bool, str] | None:
        """Rank ``r``'s failure record: (call number, onward, why), or None."""
        raise NotImplementedError

    def failure(self, r: int, seq: int) -> tuple[int, str] | None:
        """(number of the failed call, why) when rank ``r`` recorded that its call ``seq`` failed,
        or an earlier call after which every call fails; else None."""
        got = self.record(r)
        if got is None or not (got[0] == seq or (got[1] and 0 < got[0] < seq)):
            return None
        return got[0], got[2]

    def head(self, r: int, seq: int) -> tuple[int, int] | None:
        """(seq, digest) of rank ``r``'s slot for call ``seq``, without the text."""
        got = self.peer(r, seq)
        return None if got is None else (got[0], got[1])

    def _differs(self, r: int, seq: int, tag: int, text: str, head) -> str | None:
        if head is None or head[0] != seq or head[1] == tag:
            return None
        got = self.peer(r, seq)
        if got is None or got[0] != seq:
            return None
        return (f"call #{seq} of the group: rank {r} made {got[2]}, rank {self.rank} made {text}; "
                "every rank must make the same calls in the same order")

    def conflict(self, seq: int, text: str, tag: int) -> str | None:
        """The first peer whose call ``seq`` differs from this rank's, described; else the first
        peer whose call ``seq`` failed, or whose group is unusable since an earlier call, with its
        error; or None."""
        peers = [r for r in range(self.size) if r != self.rank]
        for r in peers:
            why = self._differs(r, seq, tag, text, self.head(r, seq))
            if why:
                return why
        for r in peers:
            got = self.failure(r, seq)
            if got is None:
                continue
            at, why = got
            if at == seq:
                return (f"call #{seq} of the group, {text}, failed on rank {r}: {why}; the call "
                        "cannot complete without it")
            return self._unusable(r, seq, text, at, why)
        return None

    @staticmethod
    def _unusable(r: int, seq: int, text: str, at: int, why: str) -> str:
        return (f"call #{seq} of the group, {text}, cannot complete: rank {r}'s group is "
                f"unusable since its call #{at}: {why}")

    def settle(self, seq: int, text: str, tag: int, timeout_s: float) -> None:
        """After call ``seq`` completed here: wait until every peer has posted it and compare
        (CallMismatch on a difference). A peer that is past it already (its slot reused) or does not
        post within ``timeout_s`` is not compared: completing the call needed its part. A peer's
        failure of this call is not looked at (the call completed here), but a peer whose group is
        unusable since an earlier call is a CallMismatch: what completed here met a call that peer
        gave up on."""
        pending = [r for r in range(self.size) if r != self.rank]
        deadline = time.monotonic() + timeout_s
        while pending:
            left = []
            for r in pending:
                got = self.head(r, seq)
                if got is not None and got[0] >= seq:
                    why = self._differs(r, seq, tag, text, got)
                    if why:
                        raise CallMismatch(why)
                    continue
                failed = self.failure(r, seq)
                if failed is not None and failed[0] < seq:
                    raise CallMismatch(self._unusable(r, seq, text, *failed))
                left.append(r)
            pending = left
            if not pending or time.monotonic() > deadline:
                return
            time.sleep(self.poll_s)


class ShmLedger(Ledger):
    """Rings in POSIX shared memory, one per rank, every rank mapping every ring (one host); each
    rank's failure record follows its ring."""

    def __init__(self, rank: int, size: int):
        from hccc.runtime import shm
        self.rank, self.size = int(rank), int(size)
        self._own = shm.create(RING * SLOT_BYTES + FAIL_BYTES)
        self._slot_text: dict[str, bytes] = {}
        self._rings: dict[int, object] = {self.rank: self._own}

    @property
    def handle(self) -> bytes:
        return self._own.handle

    def attach(self, handles: list[bytes]) -> None:
        """Map every peer's ring (``handles`` in rank order), then drop this ring's name."""
        from hccc.runtime import shm
        for r, h in enumerate(handles):
            if r != self.rank:
                self._rings[r] = shm.attach(h)

    def mapped(self) -> None:
        self._own.unlink()

    def post(self, seq: int, text: str, tag: int) -> None:
        m = self._own._map
        at = (seq % RING) * SLOT_BYTES
        raw = self._slot_text.get(text)
        if raw is None:                 # a call's text, as its slot holds it, made once per text
            if len(self._slot_text) >= TEXT_CACHE_MAX:
                self._slot_text.clear()
            raw = self._slot_text[text] = _padded(text, TEXT_BYTES)
        m[at + _HEAD.size:at + SLOT_BYTES] = raw
        m[at + 8:at + 16] = tag.to_bytes(8, "little")
        m[at:at + 8] = seq.to_bytes(8, "little")          # the number last: the slot is complete

    def head(self, r: int, seq: int):
        return _HEAD.unpack_from(self._rings[r]._map, (seq % RING) * SLOT_BYTES)

    def fail(self, seq: int, why: str, onward: bool = False) -> None:
        m = self._own._map
        at = RING * SLOT_BYTES
        m[at:at + 8] = bytes(8)                            # incomplete while it is written
        m[at + 16:at + FAIL_BYTES] = _padded(why, FAIL_TEXT_BYTES)
        m[at + 8:at + 16] = int(onward).to_bytes(8, "little")
        m[at:at + 8] = seq.to_bytes(8, "little")           # the number last: the record is complete

    def record(self, r: int):
        m = self._rings[r]._map
        at = RING * SLOT_BYTES
        seq, onward = _HEAD.unpack_from(m, at)
        if not seq:
            return None
        why = bytes(m[at + 16:at + FAIL_BYTES]).split(b"\0", 1)[0].decode("utf-8", "replace")
        if _HEAD.unpack_from(m, at) != (seq, onward):      # rewritten while being read
            return None
        return seq, bool(onward), why

    def peer(self, r: int, seq: int):
        m = self._rings[r]._map
        at = (seq % RING) * SLOT_BYTES
        got, tag = _HEAD.unpack_from(m, at)
        if got != seq:
            return (got, tag, "")
        text = bytes(m[at + _HEAD.size:at + SLOT_BYTES]).split(b"\0", 1)[0].decode("utf-8", "replace")
        if int.from_bytes(m[at:at + 8], "little") != seq:       # reused while being read
            return None
        return (got, tag, text)

    def close(self) -> None:
        for seg in self._rings.values():
            try:
                seg.close()
            except Exception:
                pass
        self._rings.clear()


def _padded(text: str, size: int) -> bytes:
    """``text`` as ``size`` bytes of UTF-8, cut or NUL-padded (a reader decodes a character cut in
    two as a replacement character)."""
    raw = text.encode()[:size]
    return raw + b"\0" * (size - len(raw))


class StoreLedger(Ledger):
    """Rings as keys of the group's store (a group across hosts): ``call/<slot>/<rank>``; a rank's
    failure record ``failed/<rank>``."""

    poll_s = 0.005

    def __init__(self, store, rank: int, size: int):
        self.store, self.rank, self.size = store, int(rank), int(size)
        self._last_poll = 0.0

    def post(self, seq: int, text: str, tag: int) -> None:
        self.store.set(f"call/{seq % RING}/{self.rank}", f"{seq}|{tag}|{text}".encode())

    def fail(self, seq: int, why: str, onward: bool = False) -> None:
        self.store.set(f"failed/{self.rank}",
                       f"{seq}|{int(onward)}|".encode() + why.encode()[:FAIL_TEXT_BYTES])

    def record(self, r: int):
        key = f"failed/{r}"
        if not self.store.check([key]):
            return None
        s, onward, why = bytes(self.store.get(key)).split(b"|", 2)
        return int(s), onward == b"1", why.decode("utf-8", "replace")

    def peer(self, r: int, seq: int):
        key = f"call/{seq % RING}/{r}"
        if not self.store.check([key]):
            return None
        s, t, text = bytes(self.store.get(key)).decode("utf-8", "replace").split("|", 2)
        return int(s), int(t), text

    #: seconds between two looks of :meth:`conflict` at the store (the wait loops poll it often)
    conflict_every_s = STORE_POLL_S

    def conflict(self, seq: int, text: str, tag: int) -> str | None:
        now = time.monotonic()
        if now - self._last_poll < self.conflict_every_s:
            return None
        self._last_poll = now
        return super().conflict(seq, text, tag)


__all__ = ["CallMismatch", "Ledger", "ShmLedger", "StoreLedger", "describe", "digest", "RING"]
