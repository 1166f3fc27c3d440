"""The interface a network engine offers the cross-node connections of :mod:`hccc.runtime.net`:
registered memory, one-sided puts and small messages carried by a progress thread of its own, peer
failure reports.
UCX is the one engine built (:mod:`hccc.runtime.net_ucx`); another (libfabric for EFA, say) would
implement the same methods over its own C++ proxy."""
from __future__ import annotations

import abc


class TransportError(RuntimeError):
    """The transport cannot be built, loaded or connected (message for the user)."""


class Transport(abc.ABC):
    """A network engine under the proxy: registered memory, one-sided puts, a progress thread.
    UCX is the one built (:class:`hccc.runtime.net_ucx.UcxTransport`)."""

    name = "?"

    @abc.abstractmethod
    def address(self) -> bytes:
        """What a peer needs to connect to this process."""

    @abc.abstractmethod
    def register(self, ptr: int, nbytes: int, remote: bool = True) -> bytes:
        """Register memory; the packed remote key when ``remote`` (else b"")."""

    @abc.abstractmethod
    def connect(self, peer: int, address: bytes, keys: list[bytes]) -> None:
        """An endpoint to ``peer`` with its keys (control block, slot block)."""

    @abc.abstractmethod
    def add_send(self, peer: int, mslots: int, mtail: int, rslots: int, rtail: int,
                 slot_bytes: int, nslots: int, rconn: int = 0, am_bytes: int = 0,
                 head: int | None = None) -> None:
        """A send to a remote receiver: the FIFO and tail mirrors here, the receiver's FIFO and
        tail there, the receiver's index of the connection (``rconn``). A slot whose message
        holds at most ``am_bytes`` goes as one message that the receiver's proxy unpacks
        (:meth:`add_inbound`); larger ones as puts, a fence and a tail put. ``head``: this rank's
        head word of the send (host memory), where the receiver's credits arrive as messages
        (None: they arrive as puts)."""

    @abc.abstractmethod
    def add_inbound(self, conn: int, peer: int, slots: int, slot_bytes: int, nslots: int,
                    tail: int) -> None:
        """Receive connection ``conn`` of this rank (its FIFO and tail word, host memory) from
        remote ``peer`` accepts slots as messages: the proxy copies the data into the slot, then
        publishes the tail."""

    @abc.abstractmethod
    def add_recv(self, peer: int, mhead: int, rhead: int, tail: int | None = None,
                 nslots: int = 0, message: bool = False) -> None:
        """A receive from a remote sender: the mirror of its head here, its head there; ``tail``
        (this rank's tail word of the connection) and ``nslots`` let a credit wait briefly while
        the sender still has free slots (None: credits go at once); ``message``: the sender's
        head is host memory its proxy writes (credits go as messages, not puts)."""

    @abc.abstractmethod
    def add_watch(self, word: int) -> None:
        """A host-memory word of this process that peers' puts change and local (emulated) kernel
        threads may sleep on: the progress thread wakes them when it changes."""

    @abc.abstractmethod
    def set_segment(self, ptr: int, nbytes: int, stride: int, beat_offset: int,
                    mirrors: int) -> None:
        """This rank's host segment (``nbytes`` at ``ptr``; the heartbeat at ``beat_offset``),
        sent to every remote peer whenever it changes; ``mirrors``: where the peers' segments
        arrive (``stride`` bytes per rank)."""

    @abc.abstractmethod
    def set_shape(self, region_bytes: int, region_used: int, max_cnt: int) -> None: ...

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def set_stall(self, seconds: float) -> None:
        """Give up for good after a stop of this process longer than ``seconds`` (its peers have
        given up on it meanwhile); a transport that cannot tell ignores it."""

    def stalled_s(self) -> float:
        """How long the stop that made the transport give up lasted (0.0: it did not)."""
        return 0.0

    def drain(self, timeout_s: float) -> bool:
        """Everything published put and complete at its target, then the mirrors and sent
        counters to zero (the kernel has finished); False on timeout."""

    @abc.abstractmethod
    def reset(self, timeout_s: float) -> bool:
        """Mirrors and sent counters to zero (between calls); False on timeout."""

    @abc.abstractmethod
    def peer_error(self, peer: int) -> str | None:
        """Why the endpoint to ``peer`` failed, or None."""

    @abc.abstractmethod
    def counters(self) -> tuple[int, int]:
        """(operations, bytes) sent over the network so far: puts and messages."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the thread, close endpoints, release registrations (idempotent)."""


__all__ = ["Transport", "TransportError"]
