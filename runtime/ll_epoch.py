"""LL flag epochs: which epoch an LL launch runs in, and when its FIFO slots must be zeroed first.

Under LL the receiver takes a line of a slot once its flag is the one it awaits
(:func:`hccc.compiler.backend.abi.ll_flag`: the message's index ``k`` on its connection plus
``LL_FLAG_BASE`` plus the launch's epoch ``e`` times ``2**LL_EPOCH_SHIFT``). Message indices start
at 0 in every launch, so without the epoch a line left in a slot by an earlier launch could carry
the flag a later launch awaits. The rule every launcher follows (:class:`LLEpochs`; when to zero
is :data:`hccc.compiler.backend.abi.LL_ZERO_WHEN`, which the C++ host API's ``hccc_host_reset`` is
rendered from):

* every LL launch gets the next epoch, 0, 1, ..., ``LL_EPOCHS - 1``; a launch that posts at most
  ``LL_EPOCH_MESSAGES`` messages on a connection writes flags in ``e * 2**LL_EPOCH_SHIFT + [1,
  2**LL_EPOCH_SHIFT)``, a range no other epoch's flags and no zeroed word share, so a line of any
  earlier launch since the last zeroing never matches;
* the slots are zeroed before an LL launch when the epochs wrap (the launch after epoch
  ``LL_EPOCHS - 1`` starts again at 0), when the slots may hold Simple data (set-up, or any Simple
  launch since the last LL one: Simple writes the payload itself into the slots, and a payload word
  can equal any flag), and around a launch that may post more than ``LL_EPOCH_MESSAGES`` messages
  on a connection (:func:`ll_messages_bound`): before it, and before the next LL launch, since its
  flags run into other epochs' ranges.

Every rank of a job makes the same sequence of calls with the same protocols and sizes (the
Communicator compares them per call), so every rank derives the same epochs and zeroes together.
"""
from __future__ import annotations

from hccc.compiler.backend import abi


def ll_messages_bound(nprims: int, count: int, nchunks: int, element_bytes: int, slot_bytes: int,
                      share_bytes: int, slice_bytes: int) -> int:
    """An upper bound on the messages an LL launch of ``count`` elements posts on one connection:
    every primitive of the program (``nprims``, any rank) times the micro-batches per chunk, as
    ``hccc_ctx_init`` cuts them (the slice: ``slice_bytes`` when below the slot, else the slot,
    capped at LL's share of the smallest ``share_bytes`` of a slot)."""
    es = max(1, int(element_bytes))
    sb = int(slice_bytes) if 0 < int(slice_bytes) < int(slot_bytes) else int(slot_bytes)
    share = abi.ll_share_bytes(share_bytes) or int(share_bytes)
    per = max(1, min(sb, share) // es)
    maxc = -(-max(0, int(count)) // max(1, int(nchunks)))
    return max(1, int(nprims)) * max(1, -(-maxc // per))


class LLEpochs:
    """The epoch state of one launcher (one FIFO set): :meth:`launch` is asked before every launch.
    ``epochs`` (the wrap point) is :data:`~hccc.compiler.backend.abi.LL_EPOCHS`; tests lower it."""

    def __init__(self, epochs: int = abi.LL_EPOCHS):
        if not 1 <= int(epochs) <= abi.LL_EPOCHS:
            raise ValueError(f"epochs must be 1 .. {abi.LL_EPOCHS}")
        self.epochs = int(epochs)
        #: the epoch the next LL launch runs in when it need not zero
        self.next = 0
        #: the slots may hold something other than LL lines of epochs below ``next`` (set-up, a
        #: Simple launch, a launch past LL_EPOCH_MESSAGES): the next LL launch zeroes them
        self.dirty = True
        #: zeroings so far (what tests and reports read)
        self.zeroings = 0

    def launch(self, proto: str, messages: int = 0) -> tuple[int, bool]:
        """(epoch, zero the slots first) for a launch of ``proto`` (``"simple"`` or ``"ll"``) that
        posts at most ``messages`` messages on a connection. A Simple launch runs in epoch 0 (its
        kernels read no flags) and never zeroes; it marks the slots dirty."""
        if proto != "ll":
            self.dirty = True
            return 0, False
        wide = int(messages) > abi.LL_EPOCH_MESSAGES
        zero = abi.ll_zero(dirty=self.dirty, wide=wide, wrapped=self.next >= self.epochs)
        if zero:
            self.next = 0
            self.zeroings += 1
        epoch = self.next
        self.next += 1
        self.dirty = wide
        return epoch, zero


__all__ = ["ll_messages_bound", "LLEpochs"]
