"""Where each connection's other end runs (``hccc_conn::place``, compiler/backend/abi.py ``PLACES``):
the records every launcher writes, and runs whose connections mix scopes.

The oracle for a record's place finds the connection's other end from the addresses alone: each
rank's memory is a distinct address range of a fake platform, so the range the far counter of a
record lies in (a send's tail, a receive's head) names the rank that owns it -- the rank itself for
a FIFO nobody receives and a head nobody posts -- and the test's own map of ranks to GPUs says
whether that rank shares this rank's GPU."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime import kernel_abi, net
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.launcher import Runner
from hccc.runtime.rank_memory import RankMemory, RankPlan

GPU, NODE, HOST = (dict((n, v) for n, v, _ in abi.PLACES)[k] for k in ("GPU", "NODE", "HOST"))
_SPAN = 1 << 32          # each rank's fake memory: [(r + 1) * _SPAN, (r + 2) * _SPAN)


class _Memory:
    """Fake device memory: rank r's allocations in its own address range; uploads recorded."""
    name, ticks_per_us = "fake", 1000.0

    def __init__(self):
        self.next: dict[int, int] = {}
        self.copies: dict[int, bytes] = {}

    def malloc_of(self, rank: int):
        def malloc(n):
            at = self.next.get(rank, (rank + 1) * _SPAN)
            self.next[rank] = at + max(int(n), 8) + 4096
            return at
        return malloc

    def memcpy_htod(self, ptr, blob):
        self.copies[ptr] = bytes(np.frombuffer(blob, np.uint8)) if not isinstance(blob, bytes) else blob


def _records(pf: _Memory, ptr: int, n: int) -> list[kernel_abi.Conn]:
    """The ``hccc_conn`` records uploaded at ``ptr``, read back through the ABI's struct."""
    blob = pf.copies.get(ptr, b"")
    size = ctypes.sizeof(kernel_abi.Conn)
    assert len(blob) == n * size
    return [kernel_abi.Conn.from_buffer_copy(blob, i * size) for i in range(n)]


def _owner(addr: int) -> int:
    return addr // _SPAN - 1


def _want(gpus, me: int, owner: int) -> int:
    if owner == me:          # no other end (the tests draw no connection of a rank with itself)
        return GPU
    return GPU if gpus[me] is not None and gpus[me] == gpus[owner] else NODE


@st.composite
def _programs(draw):
    """Plans of 2-5 ranks whose sends and receives are drawn independently: some pair up, some
    are FIFOs nobody receives, some receives nobody sends on; and each rank's GPU (None: unknown)."""
    n = draw(st.integers(2, 5))
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, 2))
    plans = []
    for r in range(n):
        sends = draw(st.lists(pair.filter(lambda e, r=r: e[0] != r), max_size=5, unique=True))
        recvs = draw(st.lists(pair.filter(lambda e, r=r: e[0] != r), max_size=5, unique=True))
        plans.append(RankPlan(rank=r, recv_conns=tuple(recvs), send_conns=tuple(sends), progress_slots=1,
                              nslots=abi.NSLOTS, slot_bytes=64))
    gpus = draw(st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=n, max_size=n))
    return plans, gpus


@given(_programs())
def test_every_record_carries_its_peer_s_place(prog):
    """RankMemory.connect (what both launchers call): GPU where the far end is this rank's own
    memory or a rank of the same GPU, NODE for another GPU or a GPU not known; the records read
    back through the ABI's struct, their pad zero."""
    plans, gpus = prog
    pf = _Memory()
    mems = [RankMemory(p, pf, pf.malloc_of(p.rank)) for p in plans]
    for m in mems:
        m.connect(plans, lambda peer: (mems[peer].ctrl, mems[peer].slots), gpus)
    for me, m in enumerate(mems):
        for c in _records(pf, m.send_tab, len(plans[me].send_conns)):
            assert (c.place, c.pad) == (_want(gpus, me, _owner(c.tail)), 0)
            assert _owner(c.head) == me
        for c in _records(pf, m.recv_tab, len(plans[me].recv_conns)):
            assert (c.place, c.pad) == (_want(gpus, me, _owner(c.head)), 0)
            assert _owner(c.tail) == me


def test_connect_refuses_a_gpu_list_of_another_length():
    plan = RankPlan(rank=0, recv_conns=(), send_conns=(), progress_slots=1, nslots=abi.NSLOTS, slot_bytes=64)
    pf = _Memory()
    with pytest.raises(ValueError, match="1 GPUs given for 2 ranks"):
        RankMemory(plan, pf, pf.malloc_of(0)).connect([plan, plan], lambda p: (0, 0), [0])


@pytest.mark.parametrize("entry", [(1, 2, 3), (1, 2, 3, 0), (1, 2, 3, 7)])
def test_conn_table_refuses_an_unplaced_record(entry):
    """No record leaves the runtime without a place the kernels know (0 would read as system
    scope in the kernels, but a launcher that forgot the place is a bug to name)."""
    with pytest.raises(ValueError, match=r"connection 0: .* is not \(slots, head, tail, place\)"):
        kernel_abi.conn_table([entry])
    assert len(kernel_abi.conn_table([(1, 2, 3, GPU)])) == ctypes.sizeof(kernel_abi.Conn) == 32


# ---------------------------------------------------------------------------- network connections
class _Transport:
    """A transport that records what NetLink asks of it and moves nothing."""

    def __init__(self):
        self.calls: list[str] = []

    def register(self, ptr, n, remote=True):
        return b"k"

    def address(self):
        return b"a"

    def connect(self, *a):
        pass

    def set_segment(self, *a):
        pass

    def add_send(self, *a):
        self.calls.append("send")

    def add_recv(self, *a):
        self.calls.append("recv")

    def start(self):
        pass

    def set_stall(self, s):
        pass

    def close(self):
        pass


def test_cross_node_connections_are_host_placed(monkeypatch):
    """A rank of node a, ring of 4 over nodes a, a, b, b: its connections with rank 1 (same node)
    keep what connect wrote, those with the other node point at the proxy's mirrors (host memory
    the proxy reads and writes) and are HOST."""
    tx = _Transport()
    monkeypatch.setattr(net, "get_transport", lambda rank, world, cache_dir=None: tx)
    n = 4
    plans = [RankPlan(rank=r, recv_conns=(((r - 1) % n, 0), ((r + 1) % n, 0)),
                      send_conns=(((r + 1) % n, 0), ((r - 1) % n, 0)), progress_slots=1,
                      nslots=abi.NSLOTS, slot_bytes=64) for r in range(n)]
    pf = _Memory()
    mems = [RankMemory(p, pf, pf.malloc_of(p.rank)) for p in plans]
    infos = [{"addr": "61", "ctrl": m.ctrl, "slots": m.slots, "keys": ["6b", "6b"], "am": 0, "host": False}
             for m in mems]
    import json
    link = net.NetLink(0, ["a", "a", "b", "b"], plans, mems[0], 0,
                       lambda data, tag: [json.dumps(i).encode() for i in infos],
                       pf.malloc_of(0), pf.malloc_of(0))
    try:
        gpus = [0, 1, 0, 1]        # rank 2 shares device index 0 with rank 0, but on another node
        mems[0].connect(plans, lambda peer: (mems[peer].ctrl, mems[peer].slots),
                        [("a", g) if r < 2 else ("b", g) for r, g in enumerate(gpus)])
        link.wire()
    finally:
        link.close()
    assert sorted(tx.calls) == ["recv", "send"]
    send = _records(pf, mems[0].send_tab, 2)
    recv = _records(pf, mems[0].recv_tab, 2)
    # send 0 goes to rank 1 (node a, another GPU), send 1 to rank 3 (node b); receive 0 comes from
    # rank 3, receive 1 from rank 1
    assert [c.place for c in send] == [NODE, HOST] and [c.place for c in recv] == [HOST, NODE]
    assert [c[3] for c in mems[0].send_conns] == [NODE, HOST]


# ---------------------------------------------------------------------------- a run of mixed scopes
class _TwoDeviceCpu(CpuPlatform):
    """The CPU emulation presenting two devices (one address space, as the emulation has): the
    ranks are placed in two halves, so a run has connections of both scopes."""

    def device_count(self) -> int:
        return 2

    def placement(self, nranks: int) -> list[int]:
        return [2 * r // nranks for r in range(nranks)]

    def set_device(self, index: int) -> None:
        if index not in (0, 1):
            raise ValueError(index)


@pytest.mark.parametrize("proto,codegen,direct,one_grid", [
    ("simple", "specialized", "auto", None), ("ll", "specialized", "auto", None),
    ("simple", "table", "off", False), ("ll", "table", "auto", None)])
def test_a_run_of_mixed_scopes_matches_the_oracle(proto, codegen, direct, one_grid):
    """A ring AllReduce of 4 ranks on two emulated devices (ranks 0, 1 and 2, 3): the connections
    inside a device are GPU-placed, those across NODE-placed, and the kernels (posting and waiting at
    each connection's scope) match the oracle: both code generations, direct mode and the FIFOs,
    one launch of every rank (the one-grid entry) and one launch each."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    with Runner(ir, _TwoDeviceCpu(), "float32", "sum", nthreads=2, codegen=codegen, direct=direct,
                one_grid=one_grid) as runner:
        res = runner.run(count=1000, proto=proto)
        assert res.ok, res
    # the runner's ranks (a LocalJob, launched together as the runner launches): each rank's
    # connection records, from its own memory
    from hccc.runtime.local_job import LocalJob
    with LocalJob(ir, backend=_TwoDeviceCpu(), nthreads=2, codegen=codegen, direct=direct) as job:
        dev = [c.device for c in job.comms]
        assert dev == [0, 0, 1, 1]                  # placed by the platform, as the runner places them
        res = job.run(count=1000, proto=proto, direct=direct == "auto", one_grid=one_grid)
        assert res.ok, res
        plans = [c.memory.plan for c in job.comms]
        for r, comm in enumerate(job.comms):
            for (peer, _), c in zip(plans[r].send_conns, comm.memory.send_conns):
                if plans[peer].recv_index(r, _) is not None:
                    assert c[3] == (GPU if dev[peer] == dev[r] else NODE), (r, peer)


def test_a_local_job_places_its_ranks_on_their_gpu():
    """Ranks that are threads of one process on one device (a LocalJob on the CPU emulation): every
    connection GPU-placed, from the handles each rank exchanged (host, process, platform, device)."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=256)
    with LocalJob(ir, timeout_s=30) as job:
        assert all(c[3] == GPU for comm in job.comms for c in comm._mem.send_conns + comm._mem.recv_conns)
        assert all(comm._gpus == job.comms[0]._gpus for comm in job.comms)
        assert job.run(300).ok
