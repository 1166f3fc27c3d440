"""Connections between nodes: what a :class:`~hccc.runtime.communicator.Communicator` uses for the
peers it cannot map (see ``docs/transport.md``).

**Nodes.** A rank's node is ``Communicator(..., node=)``, else the ``HCCC_NODE`` environment
variable, else its host name (:func:`node_name`). Ranks on one node map each other's memory (CUDA /
HIP IPC, POSIX shared memory); ranks on different nodes reach each other through a
:class:`Transport`, whose one engine is UCX (:mod:`hccc.runtime.net_ucx`).

**Mirrors.** The kernels keep their FIFO protocol and never learn which peers are remote.
:class:`NetLink` rewrites this rank's connection tables: a send to a remote receiver writes a local
mirror of the receiver's FIFO and ``tail``; a receive from a remote sender frees slots into a local
mirror of the sender's ``head``. The transport's progress thread (C++, not Python per message)
carries what the kernel published to the peer: a small slot as one message that the peer's
thread unpacks (data into the slot, then the tail), a large one as puts into the peer's
registered memory, then (ordered after them) the tail (:func:`am_bytes_limit` draws the line);
heads as credits (a message into a sender's host memory, which its thread writes; a put into a
GPU sender's memory). Direct mode needs the peer's destination buffer mapped, so the
Communicator, which launches kernels without peer buffer pointers, never uses it, on one node or
across nodes: every cross-node connection goes through the FIFO.

**Host side.** Each rank's host segment (barrier counter, call record, state, failure reason,
heartbeat) goes to every remote peer as a message whenever it changes (its thread writes it into
the peer's mirror of this rank; a peer's messages are applied in the order they were sent), so
the Communicator's barriers, call checks and failure reports read a remote peer exactly as a local
one. A remote peer is gone when its endpoint fails (connection closed or reset: the process died,
or the link dropped) and stopped when its heartbeat (stamped every 100 ms by its progress thread)
has not moved for ``stale_s``.

**Safety.** Worker addresses and remote keys travel only through the job's bootstrap; a process
that did not get them cannot address this rank's memory, and UCX drops connections that do not
speak its wire-up protocol; a slot message that does not fit the connection it names is dropped.
Memory per cross-node connection: one FIFO mirror on the sending side (``nslots`` slots), two
words and ``nslots`` arrival marks on the receiving side, at most ``nslots + 1`` sends in flight.
"""
from __future__ import annotations

import json
import mmap
import os
import socket
import time
from pathlib import Path

import numpy as np

from hccc.compiler.cluster.hierarchy import rank_ranges
from hccc.runtime.net_transport import Transport, TransportError

#: environment variable naming this process's node
NODE_ENV = "HCCC_NODE"
#: bytes of a host segment mirrored to remote peers (words, then the failure reason)
MIRROR_BYTES = 128 + 1024
#: host segment stride in a mirror block (one per rank)
SEGMENT_STRIDE = 4096
#: the heartbeat word of a host segment (the progress thread's clock, in ms)
BEAT_OFFSET = 120
#: environment variable: the largest slot message (bytes) sent as one active message that the
#: receiver's proxy unpacks (data, then tail); larger ones go as puts, a fence and a tail put;
#: 0: always puts
AM_BYTES_ENV = "HCCC_NET_AM_BYTES"
#: its default where UCX may use an RDMA transport (puts are zero-copy there)
AM_BYTES = 65536
#: ... and where ``UCX_TLS`` keeps UCX on TCP (a message is faster at every size measured)
AM_BYTES_TCP = 1 << 62
#: UCX_TLS names that leave no RDMA transport (TCP, intra-node ones, UCX's modifiers)
_TCP_ONLY = {"tcp", "self", "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem"}


def am_bytes_limit(value: int | None = None) -> int:
    """The active-message limit: ``value``, else ``$HCCC_NET_AM_BYTES`` (a size: ``16K``), else
    :data:`AM_BYTES_TCP` when ``UCX_TLS`` names only TCP and intra-node transports, else
    :data:`AM_BYTES`."""
    if value is None:
        raw = os.environ.get(AM_BYTES_ENV, "").strip()
        if not raw:
            tls = [t.strip().lstrip("^\\").lower() for t in os.environ.get("UCX_TLS", "").split(",")]
            tls = [t for t in tls if t]
            tcp = bool(tls) and not os.environ.get("UCX_TLS", "").strip().startswith("^") and \
                all(t in _TCP_ONLY for t in tls)
            return AM_BYTES_TCP if tcp else AM_BYTES
        from hccc.util.sizes import size_value
        parsed = size_value(raw)
        if parsed is None or parsed.denominator != 1 or parsed < 0:
            raise ValueError(f"{AM_BYTES_ENV}={raw!r}: a size in bytes is expected (0, 4096, 64K)")
        value = int(parsed)
    if int(value) < 0:
        raise ValueError(f"active-message limit {value}: must be >= 0")
    return int(value)


def node_name(node: str | None = None) -> str:
    """This process's node: ``node``, else ``$HCCC_NODE``, else the host name."""
    name = node if node is not None else os.environ.get(NODE_ENV) or socket.gethostname()
    name = str(name)
    if not name or len(name) > 255 or any(c.isspace() for c in name):
        raise ValueError(f"node name {name!r}: a non-empty word without spaces is expected")
    return name


def placement_problems(nodes: list[str], platforms: list[str], gpus_per_node: int = 0, *,
                       assumed: tuple[list[int], str] | None = None) -> list[str]:
    """What is wrong with running ranks on ``nodes`` (one name per rank): an algorithm that
    assumes its ranks on other nodes -- ``assumed`` (the node index of every rank, and what says
    so: :func:`declared_nodes`), or ``gpus_per_node`` ranks per node (ranks ``[k*G, (k+1)*G)``;
    0: unknown) -- whose node groups are split or merged, and nodes whose ranks are of different
    vendors (``platforms``: manifest platform per rank) although each node of a mixed cluster has
    one vendor. Empty: fine."""
    out = []
    groups: dict[str, list[int]] = {}
    for r, n in enumerate(nodes):
        groups.setdefault(n, []).append(r)
    for n, rs in groups.items():
        kinds = sorted({platforms[r] for r in rs})
        if len(kinds) > 1:
            out.append(f"node {n} holds ranks of {' and '.join(k.upper() for k in kinds)} "
                       f"({rank_ranges(rs)}); a mixed-vendor algorithm puts each vendor on nodes of "
                       "its own")
    if assumed is None and gpus_per_node > 0:
        assumed = ([r // gpus_per_node for r in range(len(nodes))], f"GPUPerNode={gpus_per_node}")
    if assumed is not None and len(groups) > 1:
        want, why = assumed
        for n, rs in groups.items():
            parts = sorted({want[r] for r in rs})
            if len(parts) > 1:
                out.append(f"node {n} holds ranks {rank_ranges(rs)}, which the algorithm "
                           f"({why}) places on {len(parts)} nodes: its "
                           "intra-node steps will cross the network")
                break
        for k in sorted(set(want)):
            rs = [r for r in range(len(nodes)) if want[r] == k]
            where = sorted({nodes[r] for r in rs})
            if len(where) > 1:
                out.append(f"the algorithm ({why}) puts ranks {rank_ranges(rs)} "
                           f"on one node; this job spreads them over {', '.join(where)}: their "
                           "intra-node steps cross the network")
                break
    return out


def declared_gpus_per_node(algo) -> int:
    """The ``GPUPerNode`` an algorithm file's header declares (a ResCCLang ``.rccl`` path), else 0."""
    if not isinstance(algo, (str, os.PathLike)) or not str(algo).endswith(".rccl"):
        return 0
    try:
        from hccc.compiler.frontend import parse_rccl
        from hccc.util.diagnostics import SourceFile
        src = SourceFile.read(algo)        # the input checks: a FIFO or device is never read
        return int(parse_rccl(src.text, str(algo)).header.gpu_per_node or 0)
    except Exception:       # the Communicator reports a bad file when it loads it
        return 0


def _outdir_topology(algo) -> dict:
    """The cluster a compiled OUTDIR was compiled for (its manifest's ``topology``), else {}."""
    if not isinstance(algo, (str, os.PathLike)):
        return {}
    p = Path(algo)
    p = p / "manifest.json" if p.is_dir() else p
    if p.name != "manifest.json":
        return {}
    from hccc.util.diagnostics import CompileError, SourceFile
    from hccc.util.limits import loads_json
    try:
        topo = loads_json(SourceFile.read(p)).get("topology")
    except (CompileError, AttributeError):
        return {}
    return topo if isinstance(topo, dict) else {}


def declared_nodes(algo, ir) -> tuple[list[int], str] | None:
    """The node (an index) of every rank of ``ir`` as the input ``algo`` says, and what says so;
    None when it says nothing. In order: the cluster an OUTDIR was compiled for (its manifest's
    ``topology``: nodes of any sizes, a mixed or synthesised cluster), the ProgramIR's
    ``gpus_per_node`` (kept in its JSON; an MSCCL XML ``<algo nnodes=...>`` sets it), an
    algorithm file's ``GPUPerNode`` (the ranks in nodes of that many; a value that does not divide
    the ranks -- a program generated for a cluster of uneven nodes names its largest node there --
    says nothing)."""
    n = int(ir.nranks)
    topo = _outdir_topology(algo)
    if topo.get("nodes"):
        want = [-1] * n
        for k, nd in enumerate(topo["nodes"]):
            first, count = int(nd.get("first_rank", 0)), int(nd.get("ngpus", 0))
            for r in range(first, min(first + count, n)):
                want[r] = k
        if -1 not in want:
            return want, f"the nodes of cluster {topo.get('name') or topo.get('file') or '?'}"
    g = ir.origin.gpus_per_node
    how = "gpus_per_node={}"
    if g is None or g <= 0:
        g, how = declared_gpus_per_node(algo), "GPUPerNode={}"
    if g > 0 and n % g == 0:
        return [r // g for r in range(n)], how.format(g)
    return None


def get_transport(rank: int, world: int, cache_dir=None) -> Transport:
    """The transport ``$HCCC_TRANSPORT`` names (default and only: ``ucx``)."""
    kind = os.environ.get("HCCC_TRANSPORT", "ucx")
    if kind != "ucx":
        raise TransportError(f"HCCC_TRANSPORT={kind!r}: the one network transport is 'ucx'")
    from hccc.runtime.net_ucx import UcxTransport
    return UcxTransport(rank, world, cache_dir=cache_dir)


class _Mirror:
    """A remote peer's host segment as this process sees it (the part the peer pushes): what the
    Communicator reads through ``_map``, like a mapped :class:`~hccc.runtime.shm.Segment`."""

    def __init__(self, view: memoryview):
        self._map = view

    def close(self) -> None:
        pass


class NetLink:
    """This rank's cross-node connections: transport, mirrors, rewritten connection tables.

    ``nodes``: node per rank; ``plans``: every rank's :class:`~hccc.runtime.rank_memory.RankPlan`;
    ``mem``: this rank's :class:`~hccc.runtime.rank_memory.RankMemory` (before ``connect``);
    ``host_seg``: address of this rank's host segment; ``exchange(data, tag)``: the bootstrap's
    all-gather; ``alloc_slots`` / ``alloc_words``: memory for the FIFO mirrors (the kernel writes
    them) and the mirror words (the kernel and the progress thread both touch them)."""

    def __init__(self, rank: int, nodes: list[str], plans, mem, host_seg: int, exchange,
                 alloc_slots, alloc_words, *, stale_s: float = 5.0, cache_dir=None,
                 am_bytes: int | None = None):
        self.rank, self.nodes, self.plans, self.mem = rank, list(nodes), plans, mem
        # slots arrive as messages only into FIFOs the proxy can write (host memory)
        self.am_bytes = am_bytes_limit(am_bytes) if mem.platform.name == "cpu" else 0
        self.world = len(nodes)
        self.remote = [r for r in range(self.world) if nodes[r] != nodes[rank]]
        self.stale_s = float(stale_s)
        self._mirrors = mmap.mmap(-1, SEGMENT_STRIDE * self.world)
        self._views: dict[int, memoryview] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._sends: list[tuple[int, int]] = []     # (send index k, peer)
        self._recvs: list[tuple[int, int]] = []     # (recv index j, peer)
        self.tx: Transport | None = None
        self._clean = True          # mirrors and counts are zero (no launch since the last drain)
        try:
            self._setup(exchange, alloc_slots, alloc_words, host_seg, cache_dir)
        except BaseException:
            self.close()
            raise

    def _setup(self, exchange, alloc_slots, alloc_words, host_seg, cache_dir) -> None:
        rank, plans, mem = self.rank, self.plans, self.mem
        plan = plans[rank]
        self.tx = tx = get_transport(rank, self.world, cache_dir)
        ctrl_key = tx.register(mem.ctrl, plan.ctrl_bytes)
        slots_key = tx.register(mem.slots, plan.slots_bytes)
        base = np.frombuffer(self._mirrors, dtype=np.uint8)
        mirror_addr = int(base.ctypes.data)
        del base
        # "host": this rank's control block is host memory its proxy writes (credits come as
        # messages); "am": the largest slot message its proxy unpacks
        me = {"addr": tx.address().hex(), "ctrl": mem.ctrl, "slots": mem.slots,
              "keys": [ctrl_key.hex(), slots_key.hex()], "am": self.am_bytes,
              "host": mem.platform.name == "cpu"}
        infos = [json.loads(b) for b in exchange(json.dumps(me).encode(), "net")]
        self.info = infos
        for r in self.remote:
            p = infos[r]
            tx.connect(r, bytes.fromhex(p["addr"]), [bytes.fromhex(k) for k in p["keys"]])
            self._views[r] = memoryview(self._mirrors)[r * SEGMENT_STRIDE:(r + 1) * SEGMENT_STRIDE]
        # mirrors of the remote ends this rank's kernel writes
        remote = set(self.remote)
        self._sends = [(k, peer) for k, (peer, ch) in enumerate(plan.send_conns)
                       if peer in remote and plans[peer].recv_index(rank, ch) is not None]
        self._recvs = [(j, peer) for j, (peer, ch) in enumerate(plan.recv_conns)
                       if peer in remote and plans[peer].send_index(rank, ch) is not None]
        fifo = plan.fifo_bytes
        step = (fifo + 255) // 256 * 256
        self.mslots = alloc_slots(max(step * len(self._sends), 256))
        tx.register(self.mslots, max(step * len(self._sends), 256), remote=False)
        self.mwords = alloc_words(8 * max(len(self._sends) + len(self._recvs), 1))
        tx.set_segment(host_seg, MIRROR_BYTES, SEGMENT_STRIDE, BEAT_OFFSET, mirror_addr)

    def host_mirror(self, peer: int) -> _Mirror:
        """The local mirror of remote ``peer``'s host segment."""
        return _Mirror(self._views[peer])

    def wire(self) -> None:
        """Point this rank's connection tables at the mirrors (after ``RankMemory.connect``),
        tell the transport what to carry, and start it."""
        from hccc.runtime.kernel_abi import PLACE, conn_table
        mem, plan, plans, tx, me = self.mem, self.plans[self.rank], self.plans, self.tx, self.rank
        send, recv = list(mem.send_conns), list(mem.recv_conns)
        # a cross-node connection's far end is this node's proxy, through host memory (the mirrors)
        # or this rank's memory the proxy writes: system scope (hccc_conn::place HOST)
        host = PLACE["HOST"]
        step = (plan.fifo_bytes + 255) // 256 * 256
        for i, (k, peer) in enumerate(self._sends):
            j = plans[peer].recv_index(me, plan.send_conns[k][1])
            mslots, mtail = self.mslots + i * step, self.mwords + 8 * i
            send[k] = (mslots, send[k][1], mtail, host)
            info = self.info[peer]
            tx.add_send(peer, mslots, mtail, int(info["slots"]) + j * plans[peer].fifo_bytes,
                        int(info["ctrl"]) + plans[peer].tail_offset(j), plans[peer].slot_bytes,
                        plans[peer].nslots, j, min(self.am_bytes, int(info.get("am", 0))),
                        send[k][1] if mem.platform.name == "cpu" else None)
        for i, (j, peer) in enumerate(self._recvs):
            if self.am_bytes > 0:           # the sender may send its slots as messages
                tx.add_inbound(j, peer, recv[j][0], plan.slot_bytes, plan.nslots, recv[j][2])
            k = plans[peer].send_index(me, plan.recv_conns[j][1])
            mhead = self.mwords + 8 * (len(self._sends) + i)
            recv[j] = (recv[j][0], mhead, recv[j][2], host)
            tx.add_recv(peer, mhead, int(self.info[peer]["ctrl"]) + plans[peer].send_head_offset(k),
                        recv[j][2], plan.nslots, bool(self.info[peer].get("host")))
        if mem.platform.name == "cpu":
            # the words the peers' puts change (the tails of remote senders' FIFOs, the heads of
            # remote receivers) are what this rank's kernel threads sleep on: the thread wakes them
            for k, _ in self._sends:
                tx.add_watch(send[k][1])
            for j, _ in self._recvs:
                tx.add_watch(recv[j][2])
        for conns, tab in ((send, mem.send_tab), (recv, mem.recv_tab)):
            blob = conn_table(conns)
            if blob:
                mem.platform.memcpy_htod(tab, blob)
        mem.send_conns, mem.recv_conns = send, recv
        tx.start()
        # a stop of this process as long as the peers wait for a silent heartbeat: they have given
        # up on it, and the transport must not serve what they left in the sockets
        tx.set_stall(self.stale_s)

    # ------------------------------------------------------------------ per call
    def shape(self, slot_bytes: int, max_cnt: int, slice_bytes: int) -> None:
        """The bytes of a slot this launch uses: ``max_cnt`` regions of at most 32 + slice (set
        right before the launch: from here on the mirrors are in use)."""
        self._clean = False
        mc = max(1, int(max_cnt))
        if slot_bytes % mc:
            self.tx.set_shape(0, 0, 1)          # unknown layout: whole slots
            return
        region = slot_bytes // mc
        self.tx.set_shape(region, min(region, 32 + int(slice_bytes)), mc)

    def reset(self, timeout_s: float) -> bool:
        """Mirrors and counts to zero before a launch: already done when this rank's last call
        ended with a drain (the drain resets them once the puts are complete)."""
        if self._clean:
            return True
        self._clean = self.tx.reset(timeout_s)
        return self._clean

    def drain(self, timeout_s: float) -> bool:
        """This rank's kernel has finished: everything it published put and complete at its
        target, then the mirrors and counts reset for the next call."""
        self._clean = self.tx.drain(timeout_s)
        return self._clean

    def where(self, rank: int) -> str:
        return f"node {self.nodes[rank]}"

    def peer_problem(self, peer: int, words) -> str | None:
        """Why ``peer`` cannot take part (a remote peer's connection lost; any peer's heartbeat
        stopped), or None. ``words``: the peer's host segment words (mapped or mirrored)."""
        stalled = self.tx.stalled_s() if self.tx is not None else 0.0
        if stalled:
            return (f"this rank's process was stopped for {stalled:.1f} s, longer than its peers wait "
                    f"for a heartbeat ({self.stale_s:g} s): they have given up on it")
        if peer in self.remote:
            err = self.tx.peer_error(peer) if self.tx is not None else "transport closed"
            if err:
                return (f"rank {peer} on node {self.nodes[peer]}: connection lost ({err}; the "
                        "process died or the network dropped)")
        beat = int(words[BEAT_OFFSET // 8])
        now = time.monotonic()
        last = self._beats.get(peer)
        if last is None or last[0] != beat:
            self._beats[peer] = (beat, now)
            return None
        if now - last[1] > self.stale_s:
            return (f"rank {peer} on node {self.nodes[peer]} stopped responding (no heartbeat for "
                    f"{now - last[1]:.1f} s: the process is stopped or the network is down)")
        return None

    def close(self) -> None:
        if self.tx is not None:
            self.tx.close()
            self.tx = None
        for v in self._views.values():
            v.release()
        self._views.clear()
        if self._mirrors is not None:
            try:
                self._mirrors.close()
            except BufferError:
                pass
            self._mirrors = None


__all__ = ["AM_BYTES", "AM_BYTES_ENV", "AM_BYTES_TCP", "NODE_ENV", "NetLink", "Transport", "TransportError", "declared_gpus_per_node", "declared_nodes",
           "am_bytes_limit", "get_transport", "node_name", "placement_problems"]
