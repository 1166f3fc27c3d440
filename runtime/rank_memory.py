"""One executor of rank memory: what a rank owns (:class:`RankPlan`, its sizes and offsets, and
:class:`RankMemory`, its allocations) and the one per-call recipe (:class:`LaunchCall`) that every
launcher follows.

The single-process :class:`~hccc.runtime.launcher.Runner` holds N ranks (one :class:`RankMemory`
each) and checks them against the oracle; a :class:`~hccc.runtime.communicator.Communicator` holds
one rank and reaches its peers through its bootstrap. Both launch a call through this module:

1. **Protocol** (:func:`launch_proto`): ``auto`` is LL up to ``abi.LL_AUTO_MAX_BYTES`` of full buffer,
   Simple above; LL falls back to Simple for a program proven with one micro-batch per chunk only
   (``ProgramIR.algorithm_level``, an MSCCL import), for a slot share under 16 bytes, and where the
   launcher cannot run LL at all (a Communicator across nodes).
2. **Slice** (:func:`launch_slice_bytes`, :func:`check_slice`): ``auto`` is the whole slot for an
   algorithm-level program (one micro-batch per chunk), else the slicing pass's choice within a
   chunk's share of a slot (LL's half of it under LL); a fixed slice is a positive multiple of 16 of
   at most the slot; an algorithm-level program refuses a slice that cuts its chunks.
   **Slot capacity** (:func:`call_slot_capacity`, ``hccc_args::slot_cap``): the Runner's launch
   uses the least slot that holds a slice of each chunk of the call's largest message (its FIFOs
   follow it, :meth:`~hccc.runtime.local_job.LocalJob.fit_fifos`); a Communicator's, the slot of
   its per-connection budget (:func:`fifo_budget_bytes`), fixed when its FIFOs were exported.
3. **LL epoch** (:class:`~hccc.runtime.ll_epoch.LLEpochs` from the call's bound on messages per
   connection, :func:`~hccc.runtime.ll_epoch.ll_messages_bound`): asked once per launch; it says
   whether the FIFO slots are zeroed before it (:meth:`RankMemory.reset`).
4. **Arguments** (:meth:`RankMemory.args`, :meth:`RankMemory.argument`): ``hccc_args`` filled
   from the rank's memory and the call, then, in table mode, the table's address after it
   (``hccc_table_args``); the one-grid entry takes every rank's argument in one device array and
   :func:`grid_argument` (``hccc_grid_args`` / ``hccc_table_grid_args``). Every layout is a record
   of :mod:`hccc.compiler.backend.abi` (:mod:`hccc.runtime.kernel_abi` packs it); nothing here
   writes a struct format by hand.

The C++ host API (``hccc_host.h``: ``hccc_host_proto``, ``hccc_host_reset``, ``hccc_host_args``)
is the same recipe for one rank with the slot's whole share as its slice.
"""
from __future__ import annotations

import ctypes
import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hccc.compiler.backend import abi
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.compiler.passes.slicing import FIFO_BUDGET_BYTES, program_slice_bytes, slot_share_bytes
from hccc.runtime.kernel_abi import PLACE, Args, ErrorRecord, GridArgs, TableArgs, TableGridArgs, conn_table
from hccc.runtime.ll_epoch import LLEpochs, ll_messages_bound

if TYPE_CHECKING:   # annotations only
    from hccc.runtime.platform import Platform


# ============================================================================ the per-call recipe
def launch_proto(ir: ProgramIR, proto: str, nbytes: int, chunk_bytes: int,
                 ll_refused: str | None = None) -> tuple[str, str | None]:
    """The FIFO protocol a launch of ``nbytes`` (full buffer) runs under ``proto`` = ``"auto"`` |
    ``"simple"`` | ``"ll"`` (:func:`hccc.compiler.backend.abi.resolve_proto`), and why LL fell back to
    Simple when it did (None otherwise). LL halves what a slot carries, so an MSCCL import proven only
    with one micro-batch per chunk keeps Simple, and so does a slot whose share's half is under 16
    bytes (no 16-byte slice fits it: :func:`hccc.compiler.backend.abi.ll_share_bytes`).
    The one rule for every launcher (:class:`~hccc.runtime.launcher.Runner`, :class:`~hccc.runtime.communicator.Communicator`;
    the C++ host API's ``hccc_host_proto`` is its transcription). An LL launch runs without direct
    mode (:meth:`~hccc.runtime.launcher.Runner.run`): a direct write lands in the receiver's own buffer, which has no room
    for LL's flag words. ``ll_refused``: why this launcher cannot run LL at all (a Communicator
    across nodes), or None."""
    want = abi.resolve_proto(proto, nbytes)
    if want == "simple":
        return "simple", None
    if ll_refused:
        return "simple", ll_refused
    if ir.algorithm_level:
        return "simple", (f"{ir.name} is proven with one micro-batch per chunk only (an MSCCL import): "
                          "LL's half-size slots would cut it, so it runs Simple")
    if abi.ll_share_bytes(slot_share_bytes(chunk_bytes, ir.max_step_chunks)) == 0:
        return "simple", (f"a slot share of {slot_share_bytes(chunk_bytes, ir.max_step_chunks)} bytes "
                          f"leaves LL under 16 bytes, no whole slice: {ir.name} runs Simple")
    return "ll", None


def launch_slice_bytes(ir: ProgramIR, nbytes: int, element_bytes: int, chunk_bytes: int, proto: str) -> int:
    """The micro-batch slice (bytes) of an ``"auto"`` launch of ``nbytes`` (full buffer) of
    ``element_bytes``-byte elements through slots of ``chunk_bytes`` under ``proto`` (``"simple"``
    or ``"ll"``, :func:`launch_proto`): the slot capacity for a program proven only with one
    micro-batch per chunk (:attr:`ProgramIR.algorithm_level`), else
    :func:`hccc.compiler.passes.slicing.program_slice_bytes` within a chunk's share of a slot
    (LL's half of it under LL, which the kernels cap the slice at). The one rule for every
    launcher (:class:`~hccc.runtime.launcher.Runner`, :class:`~hccc.runtime.communicator.Communicator`); the simulator
    takes the same slice for a Simple call of a task-level program
    (:func:`hccc.runtime.simulator.resolve_slice`; its algorithm-level baseline models MSCCL's own
    runtime, which pipelines micro-batches, so it cuts an MSCCL import by the model too)."""
    if ir.algorithm_level:
        return int(chunk_bytes)
    share = slot_share_bytes(chunk_bytes, ir.max_step_chunks)
    if proto == "ll":
        share = abi.ll_share_bytes(share) or share
    return program_slice_bytes(ir, int(nbytes), share, int(element_bytes), "ll" if proto == "ll" else "simple")


def check_slice(ir: ProgramIR, count: int, element_bytes: int, slice_bytes: int) -> None:
    """Refuse (ValueError) a micro-batch slice a program cannot run with: a program proven only
    under the algorithm-level order (an MSCCL import, ``ProgramIR.algorithm_level``) runs in the
    kernels' task-level order only with one micro-batch per chunk, so the slice must hold a whole
    chunk of ``count`` elements; with more micro-batches its ranks would wait for each other."""
    if not ir.algorithm_level or count <= 0:
        return
    from hccc.compiler.passes.slicing import micro_batches
    m = micro_batches(count * element_bytes, ir.nchunks, slice_bytes, element_bytes)
    if m > 1:
        need = -(-count // max(1, ir.nchunks)) * element_bytes
        raise ValueError(
            f"{ir.name} is proven only under the MSCCL runtimes' algorithm-level order, which hccc's "
            f"kernels follow with one micro-batch per chunk; a slice of {slice_bytes} bytes cuts the "
            f"{need}-byte chunks of a {count}-element call into {m} micro-batches, which would stick: "
            f"it needs a slice and FIFO slot (--chunk-size) of at least {-(-need // 16) * 16} bytes")


def call_slot_capacity(ir: ProgramIR, count: int, element_bytes: int, chunk_bytes: int, slice_bytes: int,
                       proto: str, largest_chunk: int | None = None) -> int:
    """The slot capacity (as ``chunk_bytes``: slots of ``HCCC_SLOT_BYTES(capacity, max_cnt)``) a
    launch of ``count`` elements needs, at most ``chunk_bytes``: a region never holds more than one
    slice (``slice_bytes``) of the call's largest chunk (``largest_chunk`` elements, default
    ``ceil(count / nchunks)``; an AllToAllv call's largest block piece), rounded up to 16 bytes,
    twice that under LL (half of a region's share carries data). The share it gives,
    ``slot_share_bytes(capacity, max_step_chunks)``, is exactly that, never under 16 bytes, so
    the slice, the micro-batches and the protocol of the call are those it has with ``chunk_bytes``
    (the kernels' ``hccc_launch_init`` takes it from ``hccc_args::slot_cap``)."""
    mc = max(1, int(ir.max_step_chunks))
    chunk = int(largest_chunk) if largest_chunk is not None else -(-max(0, int(count)) // max(1, int(ir.nchunks)))
    need = min(int(slice_bytes), max(1, chunk) * int(element_bytes))
    need = max(16, -(-need // 16) * 16) * (2 if proto == "ll" else 1)
    return min(int(chunk_bytes), mc * need)


def fifo_budget_bytes(given: int | None = None) -> int:
    """Bytes of data one connection's FIFO may hold in a one-rank-per-process launcher (the
    :class:`~hccc.runtime.communicator.Communicator`, which exports its FIFOs before any call size
    is known): ``given`` (its ``fifo_bytes`` option), else ``HCCC_FIFO_BYTES`` (K/M/G suffixes),
    else :data:`~hccc.compiler.passes.slicing.FIFO_BUDGET_BYTES`. ValueError naming the option or
    variable for anything but a positive whole number of bytes."""
    from hccc.util.diagnostics import env_size
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, np.integer)) or int(given) <= 0:
            from hccc.util.limits import printable
            raise ValueError(f"fifo_bytes must be a positive whole number of bytes, not "
                             f"{printable(repr(given), limit=40)}")
        return int(given)
    try:
        got = env_size("HCCC_FIFO_BYTES")
    except ValueError as exc:
        raise ValueError(f"HCCC_FIFO_BYTES must be a positive size such as 8M, not '{exc}'") from None
    return FIFO_BUDGET_BYTES if got is None else int(got)


@dataclass(frozen=True)
class LaunchCall:
    """The values of one call, computed once (steps 1-3 of the module's recipe): ``count``
    elements of ``element_bytes`` bytes under protocol ``proto`` (``"simple"`` or ``"ll"``; ``note``
    says why a request for LL ran Simple), micro-batch slice ``slice_bytes`` and at most
    ``messages`` messages per connection (what :class:`LLEpochs` needs)."""
    count: int
    element_bytes: int
    proto: str
    note: str | None
    slice_bytes: int
    messages: int
    slot_cap: int

    @classmethod
    def plan(cls, ir: ProgramIR, count: int, element_bytes: int, chunk_bytes: int, *,
             proto: str = "simple", slice_bytes: int | str = "auto",
             ll_refused: str | None = None, fit_slot: bool = True,
             largest_chunk: int | None = None) -> "LaunchCall":
        """The call of ``count`` elements of ``ir`` through slots of ``chunk_bytes`` under the
        requested ``proto`` and ``slice_bytes`` (``"auto"`` or bytes; ValueError for a fixed slice
        that is not a positive multiple of 16 of at most the slot). ``ll_refused``: see
        :func:`launch_proto`. The slice is not checked against an algorithm-level program here:
        :meth:`check` does that, where the caller refuses the call. The launch's slot capacity
        (:attr:`slot_cap`) is :func:`call_slot_capacity` with ``fit_slot`` (FIFOs allocated for
        the call: ``largest_chunk`` as there), else ``chunk_bytes`` (FIFOs allocated before the
        call, whose layout the launch keeps)."""
        count, es, chunk_bytes = int(count), int(element_bytes), int(chunk_bytes)
        run, note = launch_proto(ir, proto, count * es, chunk_bytes, ll_refused)
        if slice_bytes == "auto":
            # an MSCCL import proven only under the algorithm-level order gets one micro-batch per
            # chunk (the slot size its caller chose), where that order and the kernels' coincide
            slice_b = launch_slice_bytes(ir, count * es, es, chunk_bytes, run)
        else:
            slice_b = int(slice_bytes)
            if slice_b <= 0 or slice_b % 16 or slice_b > chunk_bytes:
                raise ValueError(f"slice of {slice_b} bytes: must be a positive multiple of 16 of at most "
                                 f"the slot size {chunk_bytes}")
        cap = (call_slot_capacity(ir, count, es, chunk_bytes, slice_b, run, largest_chunk) if fit_slot
               else chunk_bytes)
        msgs = ll_messages_bound(ir.nprims, count, ir.nchunks, es, cap,
                                 slot_share_bytes(cap, ir.max_step_chunks), slice_b)
        return cls(count, es, run, note, slice_b, msgs, cap)

    @property
    def proto_code(self) -> int:
        """``hccc_args::proto`` of the call (``HCCC_PROTO_*``)."""
        return dict(abi.PROTOS)[self.proto.upper()]

    def check(self, ir: ProgramIR) -> None:
        """ValueError when the slice cuts the chunks of a program proven with one micro-batch per
        chunk only (:func:`check_slice`)."""
        check_slice(ir, self.count, self.element_bytes, self.slice_bytes)

    def launch(self, epochs: LLEpochs) -> tuple[int, bool]:
        """(LL epoch, zero the slots first) of the next launch of this call."""
        return epochs.launch(self.proto, self.messages)


def grid_argument(ranks: int, nranks: int, first: int | None = None) -> bytes:
    """The one-grid entry's argument: ``hccc_grid_args`` over the device array ``ranks`` of every
    rank's ``hccc_args``, or with ``first`` (table mode: the block table,
    :func:`~hccc.runtime.kernel_abi.grid_first`, in device memory) ``hccc_table_grid_args`` over
    the array of every rank's ``hccc_table_args``."""
    if first is None:
        return bytes(GridArgs(ranks=ranks, nranks=nranks))
    return bytes(TableGridArgs(ranks=ranks, first=first, nranks=nranks))


# ============================================================================ what a rank owns
@dataclass(frozen=True)
class RankPlan:
    """The size-independent memory rank ``rank`` owns, as sizes and offsets: the same numbers in
    every process (they come from the manifest), so a peer can locate a FIFO or a counter inside
    memory it mapped from this rank.

    Layout (:mod:`hccc.compiler.backend.abi`, the one source of it; both blocks in memory the
    peers reach): a control block of :attr:`ctrl_bytes` (``abi.CTRL_REGIONS``: the tail of each
    receive connection, the head of each send connection, the head of each receive connection
    nobody sends on, the progress counters) and a slot block: receive connection ``j``'s ``nslots
    * slot_bytes`` bytes at ``j *`` :attr:`fifo_bytes`. Sends nobody receives go to a FIFO of the
    sender's own (:attr:`orphan_bytes`: an ``abi.ORPHAN_HEADER``-byte header holding its
    ``tail``, then the slots). Counters and orphan headers must be zero at launch
    (:meth:`RankMemory.reset`).

    Channels (manifest ``nchannels`` = K): the connections and progress counters here are every
    channel's, the manifest's one-channel lists K times (channel ``c``'s copy names its channel
    ``channel + c * stride``, :func:`~hccc.compiler.backend.codegen.replicated_conns`), in the
    order the kernels index them."""

    rank: int
    recv_conns: tuple[tuple[int, int], ...]    # (sending peer, channel), manifest order
    send_conns: tuple[tuple[int, int], ...]    # (receiving peer, channel), manifest order
    progress_slots: int
    nslots: int
    slot_bytes: int                            # one FIFO slot (manifest ``slot_bytes``)

    @classmethod
    def from_manifest(cls, manifest: dict, rank: int) -> "RankPlan":
        from hccc.compiler.backend.codegen import channel_stride, replicated_conns
        e = manifest["ranks"][rank]
        nch = max(1, int(manifest.get("nchannels", 1)))
        stride = 1
        if nch > 1:   # the manifest's own, else computed (one scan of every rank's connections)
            stride = int(manifest.get("channel_stride") or channel_stride(manifest["ranks"]))
        return cls(rank=rank,
                   recv_conns=tuple(replicated_conns(e["recv_conns"], nch, stride)),
                   send_conns=tuple(replicated_conns(e["send_conns"], nch, stride)),
                   progress_slots=nch * int(e["progress_slots"]),
                   nslots=int(manifest["nslots"]),
                   slot_bytes=int(manifest.get("slot_bytes", manifest["chunk_bytes"])))

    @property
    def fifo_bytes(self) -> int:
        """Bytes of one connection's slots."""
        return self.nslots * self.slot_bytes

    @property
    def ctrl_bytes(self) -> int:
        return abi.ctrl_bytes(len(self.recv_conns), len(self.send_conns), self.progress_slots)

    @property
    def slots_bytes(self) -> int:
        """Bytes of the slot block (at least one connection's, so it is never empty)."""
        return max(len(self.recv_conns), 1) * self.fifo_bytes

    @property
    def orphan_bytes(self) -> int:
        return abi.ORPHAN_HEADER + self.fifo_bytes

    def _ctrl(self, region: str, i: int) -> int:
        return abi.ctrl_offset(region, i, len(self.recv_conns), len(self.send_conns))

    @property
    def progress_offset(self) -> int:
        return self._ctrl("progress", 0)

    def tail_offset(self, j: int) -> int:
        return self._ctrl("tail", j)

    def send_head_offset(self, k: int) -> int:
        return self._ctrl("send_head", k)

    def unsent_head_offset(self, j: int) -> int:
        return self._ctrl("unsent_head", j)

    def recv_index(self, peer: int, channel: int) -> int | None:
        """Index of the receive connection from ``peer`` on ``channel`` (None: not received)."""
        try:
            return self.recv_conns.index((int(peer), int(channel)))
        except ValueError:
            return None

    def send_index(self, peer: int, channel: int) -> int | None:
        """Index of the send connection to ``peer`` on ``channel`` (None: nothing sent)."""
        try:
            return self.send_conns.index((int(peer), int(channel)))
        except ValueError:
            return None

    def peers(self) -> set[int]:
        """Ranks whose memory this rank's connection tables point into."""
        return {p for p, _ in self.recv_conns} | {p for p, _ in self.send_conns}

    def with_capacity(self, capacity: int, max_step_chunks: int) -> "RankPlan":
        """This plan with slots of capacity ``capacity`` (as ``chunk_bytes``) for a program whose
        messages carry up to ``max_step_chunks`` chunks: ``HCCC_SLOT_BYTES(capacity, max_cnt)``."""
        from dataclasses import replace
        from hccc.compiler.backend.codegen import slot_bytes
        return replace(self, slot_bytes=slot_bytes(int(capacity), int(max_step_chunks)))


# ============================================================================ connection placement
def abi_place(name: str) -> int:
    """The ``hccc_conn::place`` value named ``name`` (``"GPU"``, ``"NODE"``, ``"HOST"``)."""
    return PLACE[name]


def conn_place(gpus, me: int, peer: int) -> int:
    """``hccc_conn::place`` of rank ``me``'s connection with ``peer`` (its FIFO and counters in the
    receiver's and the sender's memory): ``GPU`` where both run on one GPU -- ``gpus[r]`` names the
    GPU rank ``r`` runs on (any value: equal names are one GPU; None: not known) -- else ``NODE``
    (system scope). A connection whose memory is host memory another agent writes (a network
    proxy's mirror) is ``HOST``: :meth:`hccc.runtime.net.NetLink.wire` marks those."""
    a, b = gpus[me], gpus[peer]
    return abi_place("GPU") if a is not None and a == b else abi_place("NODE")


class RankMemory:
    """Allocates and connects what one rank owns: its control block and slot block (through
    ``malloc``: memory the peers reach, e.g. :meth:`Platform.malloc_peer` or memory another
    process maps), the FIFOs of sends nobody receives (through ``malloc_orphan``, default
    ``malloc``) and its two connection tables (through ``malloc_local``, default ``malloc``; by
    :meth:`connect`). The single-process :class:`~hccc.runtime.launcher.Runner` makes one per rank; a one-rank-per-process
    :class:`~hccc.runtime.communicator.Communicator` makes its own and reaches its peers through
    memory mapped from them."""

    def __init__(self, plan: RankPlan, platform: Platform, malloc, malloc_local=None,
                 malloc_orphan=None):
        self.plan, self.platform = plan, platform
        #: every pointer this rank's memory allocated (what a reallocation of its FIFOs frees)
        self.allocations: list[int] = []

        def kept(alloc):
            def allocate(n):
                ptr = alloc(n)
                self.allocations.append(ptr)
                return ptr
            return allocate

        malloc = kept(malloc)
        self._malloc_local = kept(malloc_local) if malloc_local else malloc
        self._malloc_orphan = kept(malloc_orphan) if malloc_orphan else malloc
        self.ctrl = malloc(plan.ctrl_bytes)
        self.slots = malloc(plan.slots_bytes)
        self.progress = self.ctrl + plan.progress_offset
        self.orphans: list[int] = []      # FIFOs of unreceived sends: a header, then slots
        self.send_tab: int | None = None
        self.recv_tab: int | None = None
        #: the connection records as written: (slots, head, tail, place) each
        self.send_conns: list[tuple[int, int, int, int]] = []
        self.recv_conns: list[tuple[int, int, int, int]] = []
        #: the rank's table in its memory (table mode, :meth:`load_table`), else None
        self.table: int | None = None

    def connect(self, plans, locate, gpus) -> None:
        """Write and upload the connection tables. ``plans``: every rank's :class:`RankPlan`;
        ``locate(peer)`` gives the (control block, slot block) addresses of ``peer``'s memory in
        this process (called for the peers of :meth:`RankPlan.peers` only; for this rank itself
        the own blocks are used); ``gpus``: the GPU each rank runs on, one entry a rank
        (:func:`conn_place`: what sets each record's ``place``)."""
        plan, me = self.plan, self.plan.rank
        if len(gpus) != len(plans):
            raise ValueError(f"{len(gpus)} GPUs given for {len(plans)} ranks")

        def blocks(r: int) -> tuple[int, int]:
            return (self.ctrl, self.slots) if r == me else tuple(int(x) for x in locate(r))

        own = abi_place("GPU")
        recv = []
        for j, (peer, ch) in enumerate(plan.recv_conns):
            k = plans[peer].send_index(me, ch)
            head = (blocks(peer)[0] + plans[peer].send_head_offset(k) if k is not None
                    else self.ctrl + plan.unsent_head_offset(j))
            recv.append((self.slots + j * plan.fifo_bytes, head, self.ctrl + plan.tail_offset(j),
                         conn_place(gpus, me, peer) if k is not None else own))
        send = []
        for k, (peer, ch) in enumerate(plan.send_conns):
            head = self.ctrl + plan.send_head_offset(k)
            j = plans[peer].recv_index(me, ch)
            if j is not None:
                ctrl, slots = blocks(peer)
                send.append((slots + j * plans[peer].fifo_bytes, head,
                             ctrl + plans[peer].tail_offset(j), conn_place(gpus, me, peer)))
            else:
                fifo = self._malloc_orphan(plan.orphan_bytes)
                self.orphans.append(fifo)
                send.append((fifo + abi.ORPHAN_HEADER, head, fifo, own))
        self.send_conns, self.recv_conns = send, recv
        tabs = []
        for conns in (send, recv):
            blob = conn_table(conns)
            ptr = self._malloc_local(max(len(blob), 8))
            if blob:
                self.platform.memcpy_htod(ptr, blob)
            tabs.append(ptr)
        self.send_tab, self.recv_tab = tabs

    def load_table(self, section: bytes) -> int:
        """Copy this rank's table (table mode: its section of the ``.table`` file, checked against
        the manifest) into its memory (``malloc_local``); its address is :attr:`table`. At least 8
        bytes are allocated, as for the connection tables: a 0-byte allocation is a null pointer
        on CUDA / HIP, and the generic kernel's argument must point at memory of this rank."""
        blob = bytes(section)
        self.table = self._malloc_local(max(len(blob), 8))
        if blob:
            self.platform.memcpy_htod(self.table, blob)
        return self.table

    def args(self, call: "LaunchCall", *, input: int, output: int, scratch: int, abort_flag: int,
             error: int, timeout_s: float, epoch: int = 0, peers: int = 0) -> Args:
        """This rank's ``hccc_args`` for ``call`` (step 3 of the module's recipe): its buffers,
        its connection tables and progress counters, the job's abort flag and error record, the
        kernels' spin-wait limit in this platform's clock ticks (0: none), the call's slice and
        protocol and the launch's LL epoch."""
        ticks = self.platform.ticks_per_us
        return Args(input=input, output=output, scratch=scratch, count=call.count,
                    send_conns=self.send_tab, recv_conns=self.recv_tab, progress=self.progress,
                    abort_flag=abort_flag, error=error,
                    timeout=int(timeout_s * 1e6 * ticks) if timeout_s > 0 else 0,
                    slice_bytes=call.slice_bytes, proto=call.proto_code, ll_epoch=int(epoch),
                    peers=peers, slot_cap=call.slot_cap)

    def argument(self, args: Args) -> bytes:
        """The bytes this rank's kernel takes by value (step 4 of the recipe): ``hccc_args``, or in
        table mode ``hccc_table_args`` (``hccc_args`` and the table's address)."""
        if self.table is None:
            return bytes(args)
        return bytes(TableArgs(a=args, table=self.table))

    def reset(self, slots: bool = False) -> None:
        """Zero what the kernels need zeroed at launch: the control block (tails, heads, progress
        counters) and the orphan FIFOs' headers; with ``slots`` the FIFO slots too, which an LL
        launch needs only when :class:`~hccc.runtime.ll_epoch.LLEpochs` says so (the first LL
        launch, one after Simple launches, and when the flag epochs wrap)."""
        self.platform.memset(self.ctrl, 0, self.plan.ctrl_bytes)
        if slots:
            self.platform.memset(self.slots, 0, self.plan.slots_bytes)
        for fifo in self.orphans:
            self.platform.memset(fifo, 0, abi.ORPHAN_HEADER + (self.plan.fifo_bytes if slots else 0))


# ============================================================================ a launch's flags
class LaunchFlags:
    """The abort flag and the error record the kernels of a launch share: the abort flag at
    ``abort``, host memory the host raises with a plain store (a copy could queue behind the
    spinning kernels), and the error record (:class:`~hccc.runtime.kernel_abi.ErrorRecord`, the
    first rank to give up claims it) at ``error`` in ``platform``'s memory. Both launchers clear
    them before every launch and read them after it."""

    def __init__(self, platform: "Platform", abort: int, error: int):
        self.platform, self.abort, self.error = platform, int(abort), int(error)

    def clear(self) -> None:
        """Lower the abort flag and zero the error record (before a launch)."""
        ctypes.c_uint32.from_address(self.abort).value = 0
        self.platform.memset(self.error, 0, ctypes.sizeof(ErrorRecord))

    def raise_abort(self) -> None:
        """Raise the abort flag: a plain store, which no queued copy or kernel can hold back."""
        ctypes.c_uint32.from_address(self.abort).value = 1

    @property
    def aborted(self) -> bool:
        return ctypes.c_uint32.from_address(self.abort).value != 0

    def record(self) -> ErrorRecord:
        """The error record as the kernels left it."""
        raw = np.zeros(ctypes.sizeof(ErrorRecord), dtype=np.uint8)
        self.platform.memcpy_dtoh(raw, self.error)
        return ErrorRecord.from_buffer_copy(raw.tobytes())


def synchronize_in_background(platforms, name: str):
    """Wait for every launch on ``platforms`` in a daemon thread, so that the caller can watch a
    deadline (and its peers) meanwhile: (an Event set when done, the list that receives the
    exception a synchronize raised, the thread)."""
    done = threading.Event()
    failure: list[BaseException] = []
    thread = threading.Thread(target=_synchronize, args=(platforms, done, failure), name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:
        if "can't start new thread" not in str(exc):
            raise
        # no thread to spare (no memory for its stack): the kernels already run and must finish
        # before their memory is freed, so wait for them here (their own timeout still holds)
        _synchronize(platforms, done, failure)
        thread = _Finished()
    return done, failure, thread


class _Finished:
    """Stands for the waiter thread where none could be started (it has run in the caller)."""

    @staticmethod
    def join(timeout=None) -> None:
        return None


class BackgroundSync:
    """:func:`synchronize_in_background` through one thread kept for many waits (``name``): a
    rank of a job whose ranks are threads of this process waits for every call's kernel, and a
    thread started per rank and call took the CPU from the running kernels of the CPU emulation.
    :meth:`start` returns what :func:`synchronize_in_background` returns (the handle's ``join``
    waits for that wait's end); while an earlier wait has not ended (kernels that ignore the abort
    flag) it falls back to a thread of its own. :meth:`close` ends the thread after its wait."""

    def __init__(self, name: str):
        self.name = name
        self._tasks: queue.SimpleQueue | None = None
        self._busy: threading.Event | None = None

    def start(self, platforms, name: str | None = None):
        if self._busy is not None and not self._busy.is_set():
            return synchronize_in_background(platforms, name or self.name)
        if self._tasks is None:
            self._tasks = queue.SimpleQueue()
            threading.Thread(target=_sync_tasks, args=(self._tasks,), name=self.name, daemon=True).start()
        done, failure = threading.Event(), []
        self._busy = done
        self._tasks.put((list(platforms), done, failure))
        return done, failure, _Waited(done)

    def close(self) -> None:
        if self._tasks is not None:
            self._tasks.put(None)
            self._tasks = None


def _synchronize(platforms, done: threading.Event, failure: list) -> None:
    """Every platform of ``platforms`` synchronized, then ``done`` set; what failed appended to
    ``failure`` (reported by the caller, in its own thread)."""
    try:
        for pf in platforms:
            pf.synchronize()
    except BaseException as exc:
        failure.append(exc)
    finally:
        done.set()


def _sync_tasks(tasks: queue.SimpleQueue) -> None:
    """:class:`BackgroundSync`'s thread: each task's platforms synchronized, its Event set."""
    while (task := tasks.get()) is not None:
        _synchronize(*task)
        del task                         # (nothing of a wait held until the next)


class _Waited:
    """A :class:`BackgroundSync` wait's handle: ``join`` waits for that wait's end."""

    def __init__(self, done: threading.Event):
        self._done = done

    def join(self, timeout=None) -> None:
        self._done.wait(timeout)


__all__ = ["launch_proto", "launch_slice_bytes", "check_slice", "call_slot_capacity", "fifo_budget_bytes",
           "LaunchCall", "grid_argument",
           "RankPlan", "abi_place", "conn_place", "RankMemory", "LaunchFlags", "synchronize_in_background", "BackgroundSync"]
