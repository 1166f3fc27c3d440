"""The ranks of a job as threads of one process: the in-process bootstrap
(:class:`hccc.runtime.bootstrap.LocalRendezvous`: every rank's data in rank order, a missing rank
named at the timeout, a failed rank's reason at once, nothing kept once every rank has read a
step) and :class:`hccc.runtime.local_job.LocalJob` (one Communicator per rank, the path a job of
one rank per process takes, in threads), whose outputs are compared with the collective's
definition (:func:`hccc.runtime.reference.expected`, computed from the inputs alone)."""
from __future__ import annotations

import dataclasses
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_program
from hccc.runtime import reference
from hccc.runtime.bootstrap import BootstrapError, LocalRendezvous, local_bootstraps
from hccc.runtime.communicator import CommunicatorError
from hccc.testing import valid_programs

from communicator_calls import no_leaks  # noqa: F401 (fixture: nothing left in /dev/shm)

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.rccl"))


def _threads(n: int, fn) -> list:
    """``fn(r)`` in a thread per rank: each rank's result or exception."""
    got = [None] * n

    def run(r):
        try:
            got[r] = fn(r)
        except Exception as exc:
            got[r] = exc
    ts = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return got


# ------------------------------------------------------------------------------ the rendezvous
@settings(max_examples=25)
@given(data=st.lists(st.lists(st.binary(max_size=8), min_size=1, max_size=4), min_size=1, max_size=6)
       .filter(lambda rows: len({len(r) for r in rows}) == 1))
def test_every_rank_gets_every_ranks_data_in_rank_order(data):
    """``data[r][s]``: what rank ``r`` gives at step ``s``; every rank gets column ``s`` whole."""
    n, steps = len(data), len(data[0])
    boots = local_bootstraps(n, timeout_s=10)
    got = _threads(n, lambda r: [boots[r].all_gather(data[r][s], f"step{s}") for s in range(steps)])
    for r in range(n):
        assert got[r] == [[data[q][s] for q in range(n)] for s in range(steps)]
    assert boots[0].rendezvous._steps == {}     # every step forgotten once all ranks read it


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                     max_leaves=8)


@settings(max_examples=25)
@given(values=st.lists(st.dictionaries(st.text(max_size=3), _json, max_size=3), min_size=1, max_size=5))
def test_an_exchange_gives_every_ranks_value_as_json_between_processes_and_as_itself_in_one(values):
    """:meth:`Bootstrap.exchange`: every rank gets every rank's value in rank order; a bootstrap
    that moves bytes (as between processes) sends them as JSON text, equal once read back, and
    the in-process bootstrap hands over the objects themselves."""
    from hccc.runtime.bootstrap import Bootstrap

    class Bytes(Bootstrap):          # moves bytes only: the exchange goes through JSON text
        def __init__(self, inner):
            self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size

        def all_gather(self, data, tag):
            return self.inner.all_gather(data, tag)

    n = len(values)
    boots = local_bootstraps(n, timeout_s=10)
    same = _threads(n, lambda r: boots[r].exchange(values[r], "objects"))
    assert all(got == values and all(g is v for g, v in zip(got, values)) for got in same)
    text = _threads(n, lambda r: Bytes(boots[r]).exchange(values[r], "text"))
    assert all(got == values for got in text)


@needs_gxx
def test_a_bootstrap_that_only_moves_bytes_sets_a_job_up(no_leaks):
    """A caller's bootstrap object without ``exchange`` (rank, world_size, all_gather of bytes):
    the set-up's values travel as JSON text through its all_gather, the ranks map each other's
    shared memory as separate processes do, and a call runs."""
    from hccc.runtime.bootstrap import exchange
    from hccc.runtime.communicator import Communicator

    class Bytes:
        def __init__(self, inner):
            self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size

        def all_gather(self, data, tag):
            return self.inner.all_gather(data, tag)

        def fail(self, reason):
            self.inner.fail(reason)

        def close(self):
            pass

    boots = local_bootstraps(2, timeout_s=20)
    assert _threads(2, lambda r: exchange(Bytes(boots[r]), {"r": [r]}, "t")) == [[{"r": [0]}, {"r": [1]}]] * 2
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    comms = _threads(2, lambda r: Communicator(ir, bootstrap=Bytes(boots[r]), timeout_s=20))
    try:
        assert all(isinstance(c, Communicator) for c in comms), comms
        assert all(c._owned.imported for c in comms)        # mapped by handle, not taken by address
        got = _threads(2, lambda r: comms[r].all_reduce(np.full(8, r + 1, np.float32)))
        assert all(np.array_equal(g, np.full(8, 3, np.float32)) for g in got), got
    finally:
        for c in comms:
            if isinstance(c, Communicator):
                c.close()


def test_a_rank_that_never_arrives_is_named():
    boots = local_bootstraps(3, timeout_s=0.3)
    got = _threads(2, lambda r: boots[r].all_gather(b"x", "handles"))
    for exc in got:
        assert isinstance(exc, BootstrapError)
        assert "rank 2 of 3 did not arrive within 0.3 s" in str(exc) and "'handles'" in str(exc)


def test_a_failed_rank_ends_every_peers_step_at_once_with_its_reason():
    boots = local_bootstraps(3, timeout_s=30)

    def rank(r):
        if r == 1:
            time.sleep(0.1)
            boots[1].fail("no kernel for you")
            return None
        return boots[r].all_gather(b"x", "program")
    t0 = time.monotonic()
    got = _threads(3, rank)
    assert time.monotonic() - t0 < 5
    for r in (0, 2):
        assert isinstance(got[r], BootstrapError)
        assert "the set-up failed on rank 1: no kernel for you" in str(got[r])
    with pytest.raises(BootstrapError, match="rank 1: no kernel"):      # a latecomer too
        boots[2].all_gather(b"y", "later")


def test_a_rank_cannot_take_part_in_a_step_twice():
    rv = LocalRendezvous(2, timeout_s=0.2)
    with pytest.raises(BootstrapError, match="did not arrive"):
        rv.all_gather(0, b"a", "t")
    with pytest.raises(BootstrapError, match="rank 0 took part in step 't' twice"):
        rv.all_gather(0, b"a", "t")


def test_bad_ranks_and_sizes_are_refused():
    with pytest.raises(BootstrapError, match="at least one rank"):
        LocalRendezvous(0)
    from hccc.runtime.bootstrap import LocalBootstrap
    with pytest.raises(BootstrapError, match=r"rank 2 is not in 0\.\.1"):
        LocalBootstrap(LocalRendezvous(2), 2)


# ------------------------------------------------------------------------------ the job in threads
def _check(ir, count: int, dtype: str, op: str, seed: int = 0, together: bool = False,
           direct: bool = False, one_grid: bool = False, **options) -> None:
    from hccc.runtime.local_job import LocalJob
    count = reference.alltoall_count(count, reference.count_unit(ir))
    inputs = reference.make_inputs(ir.collective, ir.nranks, count, dtype, nchunks=ir.nchunks, seed=seed)
    want = reference.expected(ir.collective, inputs, op, nchunks=ir.nchunks, root=ir.root)
    with LocalJob(ir, timeout_s=30, dtype=dtype, op=op, **options) as job:
        got = job.collective(inputs, count, op, together=together, direct=direct, one_grid=one_grid)
    for r, (g, w) in enumerate(zip(got, want)):
        if w is None:
            continue
        assert g.shape == w.shape and np.array_equal(g, w), f"{ir.name}: rank {r}: {g} != {w}"


@needs_gxx
@pytest.mark.parametrize("proto", ["simple", "ll"])
def test_an_allreduce_in_threads_is_the_collectives_definition(proto):
    _check(build_program(gen.ring_allreduce(4, [0, 2, 1, 3]), chunk_bytes=64), 1001, "float32", "sum",
           proto=proto)


@needs_gxx
@settings(max_examples=3)    # each program builds a kernel per rank
@given(alg=valid_programs(list(SPECS), max_ranks=4, min_ranks=2), count=st.integers(0, 300),
       dtype=st.sampled_from(["float32", "int32"]), op=st.sampled_from(["sum", "max", "min"]))
def test_random_programs_in_threads_are_their_collectives_definition(alg, count, dtype, op):
    _check(build_program(alg, chunk_bytes=64), count, dtype, op, seed=count)


@pytest.mark.slow     # a kernel per rank of every example (up to 32 ranks: more than the process pool starts)
@needs_gxx
@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_in_threads_are_their_collectives_definition(name):
    ir = load_program(ROOT / "examples" / name)
    _check(ir, 4 * ir.nchunks + 3, "float32", "sum", seed=ir.nranks)


@needs_gxx
def test_mismatched_calls_in_threads_are_an_error_on_every_rank():
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        with pytest.raises(CommunicatorError) as got:
            job.each(lambda r, comm: comm.all_reduce(np.ones(10 + 2 * r, np.float32)))
    text = str(got.value)
    assert text.count("every rank must make the same call") == 2, text
    assert "rank 0:" in text and "rank 1:" in text


def test_a_set_up_that_fails_names_every_ranks_failure_and_keeps_nothing():
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    with pytest.raises(ValueError, match="^dtype must be one of"):     # once, as every rank says it
        LocalJob(ir, timeout_s=5, dtype="float33")


# ------------------------------------------------------------------------------ launched together
def _slot_heads(job, slot_bytes: int) -> np.ndarray:
    """[rank, receive connection, slot]: 8 bytes of every FIFO slot of every rank, past its reserved header
    and alignment room (abi.SLOT_OVERHEAD), where every message through the slot writes data; the
    launch's slots are ``slot_bytes`` apart (its slot capacity's, within the FIFO's)."""
    from hccc.compiler.backend import abi
    out = []
    for r, comm in enumerate(job.comms):
        plan, mem, pf = comm._plans[r], comm._mem, comm._pf
        raw = np.zeros(plan.slots_bytes, np.uint8)
        pf.memcpy_dtoh(raw, mem.slots)
        out.append([[raw[j * plan.fifo_bytes + s * slot_bytes + abi.SLOT_OVERHEAD:][:8].view(np.uint64)[0]
                     for s in range(abi.NSLOTS)] for j in range(len(plan.recv_conns))])
    return np.array(out, np.uint64)


@needs_gxx
def test_ranks_launched_together_run_direct_mode_with_the_peers_array():
    """Ring AllReduce 4 has direct-mode receives (its AllGather half: the sender writes the
    receiver's output; :func:`~hccc.runtime.direct_peers.direct_receive_count`). Launched together
    with the peers array, those messages leave their FIFO slots untouched (6 messages per
    connection: 3 ReduceScatter through the FIFO, 3 AllGather direct); without it every message
    goes through its slot; the outputs are the collective's definition either way, and an LL call
    has no peers array."""
    from hccc.runtime.direct_peers import direct_receive_count
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1024)
    assert direct_receive_count(ir, ["cuda"] * 4, "auto") > 0
    count = 4 * 64
    inputs = reference.make_inputs("allreduce", 4, count, "float32", nchunks=ir.nchunks, seed=1)
    want = np.sum(np.stack(inputs), axis=0)
    mark = np.uint64(0xABABABABABABABAB)
    # the call's slots: its slot capacity through the compiled slot (the single-process runner's recipe)
    from hccc.compiler.backend.codegen import slot_bytes
    from hccc.runtime.rank_memory import LaunchCall
    launch_slot_bytes = slot_bytes(LaunchCall.plan(ir, count, 4, 1024).slot_cap, ir.max_step_chunks)
    with LocalJob(ir, timeout_s=30, proto="simple", nthreads=2) as job:
        for direct, untouched_slots in ((True, slice(3, 6)), (False, slice(0, 0))):
            for r, comm in enumerate(job.comms):
                comm._pf.memset(comm._mem.slots, 0xAB, comm._plans[r].slots_bytes)
            got = job.collective(inputs, count, together=True, direct=direct)
            assert all(np.array_equal(g, want) for g in got)
            assert job.last_time_us is not None and job.last_time_us > 0
            untouched = _slot_heads(job, launch_slot_bytes) == mark
            assert untouched[:, :, untouched_slots].all(), (direct, untouched)
            assert not np.delete(untouched[:, :, :6], np.arange(6)[untouched_slots], axis=2).any(), (direct, untouched)
        job.comms[0].proto = "ll"
        for comm in job.comms[1:]:
            comm.proto = "ll"
        got = job.collective(inputs, count, together=True, direct=True)
        assert all(np.array_equal(g, want) for g in got) and job.comms[0].last_proto == "ll"


@needs_gxx
@settings(max_examples=5)
@given(alg=valid_programs(list(SPECS), max_ranks=4, min_ranks=2), count=st.integers(0, 300),
       direct=st.booleans(), one_grid=st.booleans())
def test_random_programs_launched_together_are_their_collectives_definition(alg, count, direct, one_grid):
    _check(build_program(alg, chunk_bytes=64), count, "float32", "sum", seed=count,
           together=True, direct=direct, one_grid=one_grid)


@pytest.mark.parametrize("how", [{"direct": True}, {"one_grid": True}])
def test_direct_mode_and_one_grid_need_the_ranks_launched_together(how):
    from hccc.runtime.local_job import LocalJob
    job = LocalJob.__new__(LocalJob)
    job.nranks, job.ir = 1, None
    with pytest.raises(ValueError, match="launched together"):
        job.collective([np.zeros(1)], 1, **how)


@needs_gxx
@pytest.mark.parametrize("direct,codegen", [(False, "specialized"), (True, "specialized"), (True, "table")])
def test_ranks_launched_as_one_grid_make_one_launch_of_every_ranks_blocks(direct, codegen):
    """The one-grid entry launched once, by rank 0's platform, with every rank's blocks, and no
    rank's own launch step (counted by spies on the platforms and the ranks); every rank's output
    is the collective's definition. Table mode too: the generic kernels' entry finds each block's
    rank through the block table and runs that rank's table."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(4, [0, 2, 1, 3]), chunk_bytes=64)
    count = 1001
    inputs = reference.make_inputs(ir.collective, 4, count, "float32", nchunks=ir.nchunks, seed=3)
    want = reference.expected(ir.collective, inputs, "sum", nchunks=ir.nchunks)
    with LocalJob(ir, timeout_s=30, proto="simple", codegen=codegen) as job:
        seen = []
        for r, comm in enumerate(job.comms):
            real = comm._launch
            comm._launch = lambda *a, r=r, real=real, **k: (seen.append(("launch", r)), real(*a, **k))[1]
        # the ranks' platform objects (one, shared, on the CPU emulation): a launch names its owner
        for pf in {id(c._pf): c._pf for c in job.comms}.values():
            owners = [r for r, c in enumerate(job.comms) if c._pf is pf]
            pf.launch_grid = (lambda fn, grid, *a, owners=owners, real=pf.launch_grid, **k:
                              (seen.append(("grid", owners[0], grid)), real(fn, grid, *a, **k))[1])
        for _ in range(2):
            got = job.collective(inputs, count, together=True, one_grid=True, direct=direct)
            assert all(np.array_equal(g, w) for g, w in zip(got, want))
        assert seen == [("grid", 0, sum(c.grid for c in job.comms))] * 2, seen
        assert job.last_time_us > 0
        seen.clear()
        got = job.collective(inputs, count, together=True)       # per rank: each rank's own launch
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        assert sorted(seen) == [("launch", r) for r in range(4)], seen


@needs_gxx
def test_a_grid_whose_blocks_cannot_all_be_resident_is_refused_before_any_launch():
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    inputs = [np.ones(8, np.float32)] * 2
    with LocalJob(ir, timeout_s=30) as job:
        job.comms[0]._pf.max_threads = 1
        with pytest.raises(CommunicatorError, match=r"as one grid needs \d+ thread blocks of \d+ threads "
                                                    r"resident at once; at most 0 fit"):
            job.collective(inputs, 8, together=True, one_grid=True)
        job.comms[0]._pf.max_threads = 1 << 16
        got = job.collective(inputs, 8, together=True)        # the job is still usable
        assert all(np.array_equal(g, np.full(8, 2, np.float32)) for g in got)


# ------------------------------------------------------------------------------ host barriers of threads
def test_host_barriers_of_ranks_in_threads_wait_on_their_shared_condition():
    """Host segments of ranks in one process (``wake``: the in-process bootstrap's condition):
    every barrier passes once all ranks reach it, however late one comes; a rank that never comes
    is named at the timeout; ranks of this process are never taken for exited processes."""
    import os
    from hccc.runtime.host_segment import HostSegments
    wake = threading.Condition()
    segs = [HostSegments(r, 3, 2.0, wake=wake) for r in range(3)]
    try:
        for s in segs:
            for q in segs:
                if q is not s:
                    s.attach(q.rank, q.own.handle)
            s.know([os.getpid()] * 3, ["n"] * 3)
        for late in (0.0, 0.05, 0.2):
            def rank(r):
                if r == 2:
                    time.sleep(late)
                return segs[r].barrier(f"barrier after {late}")
            assert _threads(3, rank) == [None, None, None]
        assert all(s.peer_problem() is None for s in segs)
        got = _threads(2, lambda r: segs[r].barrier("the last one"))
        assert all("rank 2 did not reach the last one within 2 s" in g for g in got), got
    finally:
        for s in segs:
            s.close()


class _CountingCondition(threading.Condition):
    """A Condition that counts its notify_all calls."""

    def __init__(self):
        super().__init__()
        self.notified = 0

    def notify_all(self):
        self.notified += 1
        super().notify_all()


@settings(max_examples=6, deadline=None)
@given(n=st.integers(2, 6), rounds=st.integers(1, 4))
def test_only_the_rank_that_completes_a_barrier_wakes_the_others(n, rounds):
    """Ranks in threads meet at ``rounds`` barriers on a shared condition: each barrier passes
    for every rank, and the condition is notified once per barrier (by the rank that completes
    it), not once per arrival."""
    import os
    from hccc.runtime.host_segment import HostSegments
    wake = _CountingCondition()
    segs = [HostSegments(r, n, 5.0, wake=wake) for r in range(n)]
    try:
        for s in segs:
            for q in segs:
                if q is not s:
                    s.attach(q.rank, q.own.handle)
            s.know([os.getpid()] * n, ["n"] * n)
        for k in range(rounds):
            assert _threads(n, lambda r: segs[r].barrier(f"barrier {k}")) == [None] * n
        assert wake.notified == rounds
    finally:
        for s in segs:
            s.close()


@needs_gxx
def test_every_call_of_a_rank_runs_in_that_ranks_one_thread():
    """A job's steps run in one thread per rank, the same for every call from the set-up on (no
    thread started per call), and each rank's waits for its kernels synchronize in one kept thread of its own;
    closing the job ends them all."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    seen, waiters = [], []

    # (other jobs of this process, a runner kept for reuse among them, have wait threads of their own)
    others = {t for t in threading.enumerate() if re.fullmatch(r"hccc-rank-\d+-wait", t.name)}

    def wait_threads():
        return sorted((t for t in threading.enumerate() if re.fullmatch(r"hccc-rank-\d+-wait", t.name)
                       and t not in others), key=lambda t: t.name)
    with LocalJob(ir, timeout_s=30) as job:
        set_up = {t for t in threading.enumerate() if re.fullmatch(r"hccc-rank-\d+", t.name)}
        for together in (False, True, True):
            seen.append(job.each(lambda r, comm: threading.current_thread()))
            job.collective([np.ones(6, np.float32)] * 3, 6, together=together)
            waiters.append(wait_threads())
        threads = seen[0]
        assert seen == [threads] * 3
        assert set(threads) <= set_up            # the threads that set the ranks up
        assert len(set(map(id, threads))) == 3
        assert all(t.is_alive() for t in threads)
        assert [t.name for t in waiters[0]] == [f"hccc-rank-{r}-wait" for r in range(3)]
        assert waiters == [waiters[0]] * 3
    threads = threads + waiters[0]
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    job = LocalJob(ir, timeout_s=30)           # a job dropped unclosed ends its rank threads too
    threads = job.each(lambda r, comm: threading.current_thread())
    del job
    import gc
    gc.collect()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)


@needs_gxx
def test_ranks_launched_together_meet_at_one_host_barrier_per_call():
    """A call of ranks launched together passes one host barrier (the call compared), the launch's
    gate being the second (every rank has reset its counters before the one launch); a call of
    ranks launched each by its own thread passes both, and both are the collective's."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    x = [np.full(6, r + 1, np.float32) for r in range(3)]
    with LocalJob(ir, timeout_s=30) as job:
        for together, passed in ((True, 1), (False, 2), (True, 1)):
            before = [c._hosts._seq for c in job.comms]
            got = job.collective(x, 6, together=together)
            assert [c._hosts._seq - b for c, b in zip(job.comms, before)] == [passed] * 3
            assert all(np.array_equal(g, np.full(6, 6, np.float32)) for g in got)


@needs_gxx
def test_a_rank_that_fails_before_a_launch_together_is_named_by_every_peer():
    """A rank refused memory after the call's barrier, before the launch of ranks launched
    together: every peer's error names that rank's failure (as the host barrier the launch's gate
    stands for says it, or as a peer that saw it first relays it), and the job runs again."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    x = [np.ones(6, np.float32)] * 3
    with LocalJob(ir, timeout_s=30) as job:
        scratch = job.comms[1]._owned.scratch_ptr

        def refused(nbytes):
            raise MemoryError("refused for the test")
        job.comms[1]._owned.scratch_ptr = refused
        with pytest.raises(CommunicatorError) as err:
            job.collective(x, 6, together=True)
        text = str(err.value)
        assert "; rank 1: all_reduce #1: out of memory" in text, text
        for r in (0, 2):
            # (directly, or through a peer that reported it first: "rank 0 failed (rank 1 failed (...")
            assert re.search(rf"rank {r}: (?:rank [02] failed \()?rank 1 failed \(all_reduce #1: out of memory.*?"
                             r"\(all_reduce #1 \(counters reset\)\)", text), text
        assert "BrokenBarrier" not in text
        job.comms[1]._owned.scratch_ptr = scratch
        job.recover()
        assert all(np.array_equal(g, np.full(6, 3, np.float32)) for g in job.collective(x, 6, together=True))


# ------------------------------------------------------------------------------ the oracle on top
@needs_gxx
@settings(max_examples=4)
@given(alg=valid_programs(list(SPECS), max_ranks=4, min_ranks=2), count=st.integers(0, 300),
       dtype=st.sampled_from(["float32", "int32", "bfloat16"]), op=st.sampled_from(["sum", "max", "min"]),
       how=st.sampled_from([{}, {"direct": True}, {"one_grid": True}]),
       call=st.fixed_dictionaries({"inplace": st.booleans(), "proto": st.sampled_from(["simple", "ll"]),
                                   "slice_bytes": st.sampled_from(["auto", 16, 48]),
                                   "checks": st.integers(1, 2), "nthreads": st.sampled_from([None, 1, 3])}))
def test_a_jobs_run_is_the_runners_run(alg, count, dtype, op, how, call):
    """One call through the job's path (every rank a Communicator, in threads) and through the
    single-process runner, on the same inputs, with the same per-call options (in place,
    protocol, slice, checked calls): both checked by the oracle, their outputs equal; a placement
    the program cannot take refused by both alike."""
    from hccc.runtime.launcher import Runner
    from hccc.runtime.local_job import LocalJob
    ir = build_program(alg, chunk_bytes=64)
    with Runner(ir, "cpu", dtype, op) as runner:
        try:
            want = runner.run(count=count, seed=count, keep_outputs=True, **call)
        except ValueError as exc:
            refused = str(exc)
        else:
            refused = None
    with LocalJob(ir, timeout_s=30, dtype=dtype, op=op) as job:
        blocks = [c.block for c in job.comms]
        if refused is not None:
            with pytest.raises(ValueError) as err:
                job.run(count, dtype=dtype, op=op, seed=count, **call, **how)
            assert str(err.value) == refused
            return
        got = job.run(count, dtype=dtype, op=op, seed=count, warmup=1, iters=2, **call, **how)
        assert all(c.proto == "auto" and c._slice_request == "auto" for c in job.comms)   # (for this run only)
        assert [c.block for c in job.comms] == blocks
    assert got.ok, (got.stuck, got.first_wrong)
    assert got.iters == 2 and got.time_us > 0 and got.checks == want.checks == call["checks"]
    assert want.ok and want.count == got.count and got.inplace == call["inplace"]
    assert (got.proto, got.slice_bytes, got.nthreads) == (want.proto, want.slice_bytes, want.nthreads)
    for r, (g, w) in enumerate(zip(got.outputs, want.outputs)):
        assert np.array_equal(g, w, equal_nan=dtype != "int32"), f"rank {r}"


@needs_gxx
@pytest.mark.parametrize("how", [{"together": False}, {"one_grid": True}])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_jobs_bfloat16_run_hands_the_ranks_bit_patterns_and_is_the_runners(how, inplace):
    """bfloat16, which numpy cannot hold: the ranks get the bit patterns (a uint16 array as
    ``Bfloat16Bits``, no torch needed), the outputs come back as the oracle sees them (float32),
    right, and equal to the runner's; anything but a writable uint16 array is refused as bits."""
    from hccc.runtime.call_buffers import Bfloat16Bits, as_buf
    from hccc.runtime.launcher import Runner
    b = as_buf(Bfloat16Bits(np.zeros(5, np.uint16)), "x")
    assert (b.n, b.dtype, b.device) == (5, "bfloat16", "cpu")
    with pytest.raises(TypeError, match="x: bfloat16 bit patterns are a uint16 numpy array"):
        as_buf(Bfloat16Bits(np.zeros(5, np.float32)), "x")
    ro = np.zeros(5, np.uint16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        as_buf(Bfloat16Bits(ro), "x")
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30, dtype="bfloat16") as job:
        got = job.run(101, dtype="bfloat16", seed=5, inplace=inplace, **how)
    with Runner(ir, "cpu", "bfloat16", "sum") as runner:
        want = runner.run(count=101, seed=5, inplace=inplace, keep_outputs=True)
    assert got.ok and want.ok, (got.stuck, got.first_wrong)
    assert all(g.dtype == np.float32 and np.array_equal(g, w) for g, w in zip(got.outputs, want.outputs))


@needs_gxx
def test_a_jobs_run_chooses_the_one_grid_launch_where_it_can_as_the_runner_does():
    """``one_grid=None``: ranks of one platform on one device launch as one grid (one launch of
    every rank's blocks, counted by a spy); a mixed-vendor job, and a platform that keeps fewer
    blocks of a launch resident than the grid has, launch a kernel per rank; the runs are the
    collective's definition either way."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)

    def grids(job) -> list:
        seen = []
        for pf in {id(c._pf): c._pf for c in job.comms}.values():
            pf.launch_grid = (lambda fn, grid, *a, real=pf.launch_grid, **k:
                              (seen.append(grid), real(fn, grid, *a, **k))[1])
        return seen
    with LocalJob(ir, timeout_s=30) as job:
        seen = grids(job)
        assert job.grid_usable("float32", "sum")
        res = job.run(99, one_grid=None)
        assert res.ok and seen == [sum(c.grid for c in job.comms)], (res.stuck, seen)
        job.comms[0]._pf.resident_blocks = 1            # partial residency: a launch per rank
        assert not job.grid_usable("float32", "sum")
        job.comms[0]._pf.resident_blocks = None
    with LocalJob(ir, timeout_s=30, platforms=["cuda", "hip", "cuda"]) as job:
        seen = grids(job)
        assert not job.grid_usable("float32", "sum")
        res = job.run(99, one_grid=None)
        assert res.ok and seen == [], (res.stuck, seen)


@needs_gxx
def test_a_jobs_direct_mode_off_generates_every_primitive_through_the_fifo():
    """``direct="off"``, as the runner takes it: the ranks' sources have no direct-mode write
    (the ones "auto" has, for a program whose receives are proven safe), and the runs launched
    with the peers array are the collective's definition either way; an unknown mode is refused."""
    from hccc.runtime.local_job import LocalJob
    ir = load_program(Path(__file__).resolve().parent.parent / "examples" / "ring_allgather_8.rccl")

    def writes(job):
        gendir = job.comms[0]._prog.gendir
        return sum(f.read_text().count(m) for f in gendir.iterdir() if f.suffix in (".cu", ".hip")
                   for m in ("HCCC_PX(", "HCCC_PWX("))
    for mode, some in (("auto", True), ("off", False)):
        with LocalJob(ir, timeout_s=30, direct=mode) as job:
            assert (writes(job) > 0) == some, mode
            res = job.run(8 * 64, proto="simple", direct=True)
            assert res.ok, (mode, res.stuck, res.first_wrong)
    with pytest.raises(ValueError, match="unknown direct mode 'on'"):
        LocalJob(ir, timeout_s=30, direct="on")


@needs_gxx
def test_a_jobs_run_takes_the_callers_inputs_and_may_leave_the_outputs_unchecked():
    """``inputs`` (one array per rank, laid out as the runner takes them) replace the oracle's:
    the outputs are the collective's definition on them (a sum over the ranks) and the runner's;
    inputs that do not fit the layout are refused naming the rank; ``check=False`` compares
    nothing, as the runner's run(check=False) says it."""
    from hccc.runtime.launcher import Runner
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    x = [np.random.default_rng(r).integers(-50, 50, 99).astype(np.float32) for r in range(3)]
    with LocalJob(ir, timeout_s=30) as job, Runner(ir, "cpu", "float32", "sum") as runner:
        got = job.run(99, inputs=x)
        want = runner.run(count=99, inputs=x, keep_outputs=True)
        assert got.ok and want.ok, (got.stuck, got.first_wrong)
        assert all(np.array_equal(g, sum(x)) and np.array_equal(g, w) for g, w in zip(got.outputs, want.outputs))
        with pytest.raises(ValueError, match="rank 1: this program's input buffer holds 99 elements"):
            job.run(99, inputs=[x[0], x[1][:98], x[2]])
        with pytest.raises(ValueError, match="expected 3 input arrays, got 2"):
            job.run(99, inputs=x[:2])
        got, want = job.run(99, check=False), runner.run(count=99, check=False)
        assert got.stuck is None and got.ok == want.ok
        assert (got.collective_wrong, got.oracle, got.checks, got.wrong) == (
            want.collective_wrong, want.oracle, want.checks, want.wrong) == (-1, None, 0, 0)


@needs_gxx
@pytest.mark.parametrize("one_grid", [False, True])
def test_a_run_whose_blocks_cannot_all_be_resident_is_refused_before_any_call(one_grid):
    """Threads per block asked for one run: where a rank's blocks (or the one grid's) would not all
    fit at once, the run is refused before any call, naming what is needed and what fits."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        fit = job.comms[0]._pf.max_threads
        calls = []
        job.collective = lambda *a, **k: calls.append(a)
        with pytest.raises(ValueError, match="resident at once; at most 0 fit"):
            job.run(8, nthreads=fit + 1, one_grid=one_grid)
        with pytest.raises(ValueError, match="nthreads must be positive"):
            job.run(8, nthreads=0)
        assert calls == []


@needs_gxx
def test_a_kernel_past_the_jobs_watchdog_is_aborted_and_a_runs_timeout_is_the_kernels_own():
    """A deadlock whose kernels would spin for a minute: the host's limit per kernel run
    (``watchdog_s``) aborts them within it and says so; a run's ``timeout_s`` (the kernels' own
    spin-wait limit, for that run only) makes them report where they stuck; the job runs again."""
    from codegen_irs import stuck_ir
    from hccc.runtime.local_job import LocalJob
    with LocalJob(stuck_ir(), timeout_s=20, kernel_timeout_s=60, nthreads=2, watchdog_s=0.5) as job:
        t0 = time.monotonic()
        res = job.run(16)
        assert time.monotonic() - t0 < 15 and not res.ok
        assert res.stuck.startswith("host watchdog: kernel still running after 0.5 s; aborted ("), res.stuck  # as the runner says
        job.watchdog_s = None          # the size-based default from now on (generous: 30 s at least)
        assert job.default_watchdog(16 * 4) >= 30
        res = job.run(16, timeout_s=0.3)
        assert [c.kernel_timeout_s for c in job.comms] == [60, 60]
        assert re.search(r"rank [01], TB 0 stuck in recv for chunk [01] \(micro-batch 0\)", res.stuck), res.stuck


@needs_gxx
@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_a_jobs_fifos_grow_on_every_rank_and_its_calls_go_on(codegen):
    """FIFOs made small (a per-connection budget of 32-byte slots) and grown for larger
    slots: every rank's FIFOs and connection tables are new, each rank's tables point into its
    peers' new FIFOs, calls before and after (Simple and LL, which zeroes the new slots) are the
    collective's definition; growth never shrinks and stops at the compiled slot."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1024)
    x = [np.arange(300, dtype=np.float32) * (r + 1) for r in range(3)]
    want = sum(x)
    with LocalJob(ir, timeout_s=30, fifo_bytes=256, codegen=codegen) as job:
        small = job.fifo_capacity
        assert small < 1024
        assert all(np.array_equal(g, want) for g in job.collective(x, 300))
        before = [(c._mem.ctrl, c._mem.slots) for c in job.comms]
        job.fit_fifos(small)                      # (already so: nothing happens)
        assert [(c._mem.ctrl, c._mem.slots) for c in job.comms] == before
        job.fit_fifos(10 ** 6)                    # (the compiled slot at most)
        assert job.fifo_capacity == 1024 and all(c.chunk_bytes == 1024 for c in job.comms)
        for c in job.comms:
            for j, (peer, ch) in enumerate(c._plans[c.rank].send_conns):
                k = job.comms[peer]._plans[peer].recv_index(c.rank, ch)
                if k is not None:   # a send's FIFO is the receiver's new one
                    assert c._mem.send_conns[j][0] == job.comms[peer]._mem.slots + k * c._plans[peer].fifo_bytes
        for proto in ("simple", "ll", "simple"):
            res = job.run(300, proto=proto)
            assert res.ok and res.proto == proto, (res.stuck, res.first_wrong)
        assert all(np.array_equal(g, want) for g in job.collective(x, 300, together=True))


def _slot_need(ir, count: int, es: int, slice_bytes: int, proto: str, compiled: int) -> int:
    """The slot capacity a call needs, by this test's own arithmetic: a FIFO region holds one
    slice of one chunk (the chunk at most: ceil(count / nchunks) elements), in whole 16-byte
    units, twice that under LL (half of each line is data), one region per chunk a primitive
    moves at once; never more than the compiled slot."""
    chunk = max(1, -(-count // ir.nchunks)) * es
    need = -(-min(slice_bytes, chunk) // 16) * 16
    return min(compiled, max(1, ir.max_step_chunks) * need * (2 if proto == "ll" else 1))


@needs_gxx
@settings(max_examples=6, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(1, 1500), st.sampled_from(["simple", "ll", "auto"]),
                                st.sampled_from(["auto", 16, 64])), min_size=1, max_size=4))
def test_a_jobs_fifos_grow_with_its_runs_to_what_each_call_needs(calls):
    """FIFOs made small grow with each run by themselves to the largest slot capacity a call so
    far needed (:func:`_slot_need` of the call's reported slice and protocol), never shrink; and a
    call runs alike whatever the FIFOs held before it: its protocol and slice are those of the
    same call on a job whose FIFOs hold the compiled slot from the start. Every run is the
    collective's definition."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1024)
    with LocalJob(ir, timeout_s=30, fifo_bytes=256) as job, LocalJob(ir, timeout_s=30) as full:
        small = job.fifo_capacity
        assert job.grow_fifos and small < 1024 and full.fifo_capacity == 1024
        want_cap = small
        for count, proto, slice_bytes in calls:
            res = job.run(count, proto=proto, slice_bytes=slice_bytes, keep_outputs=False)
            ref = full.run(count, proto=proto, slice_bytes=slice_bytes, keep_outputs=False)
            assert res.ok and ref.ok, (res.stuck, ref.stuck)
            assert (res.proto, res.slice_bytes) == (ref.proto, ref.slice_bytes), (count, proto, slice_bytes)
            want_cap = max(want_cap, _slot_need(ir, count, 4, res.slice_bytes, res.proto, 1024))
            assert job.fifo_capacity == want_cap, (count, proto, slice_bytes)
            assert all(c.chunk_bytes == want_cap for c in job.comms)


@needs_gxx
def test_an_import_proven_one_micro_batch_per_chunk_keeps_it_through_small_fifos():
    """An MSCCL import (proven under the algorithm-level order only) runs one micro-batch per
    chunk: through FIFOs made small, the job grows them to the whole chunk and runs the call with
    the compiled slot as its slice, as the single-process runner does, instead of refusing a
    slice that cuts the chunks."""
    from hccc.runtime.local_job import LocalJob
    ir = load_program(ROOT / "examples" / "msccl" / "allreduce_ring_4.xml")
    assert ir.algorithm_level and ir.nchunks == 4 and ir.max_step_chunks == 1
    with LocalJob(ir, timeout_s=30, fifo_bytes=256) as job:
        assert job.fifo_capacity < 4000
        res = job.run(4000)                # chunks of 1000 elements: 4000 bytes a region
        assert res.ok, (res.stuck, res.first_wrong)
        assert res.slice_bytes == ir.chunk_bytes and job.fifo_capacity == 4000


@needs_gxx
def test_a_mixed_vendor_job_runs_each_platforms_ranks_from_its_own_sources():
    """A ProgramIR with CUDA and HIP ranks (``platforms``, as the runner takes them): the ranks of
    each platform share one CPU emulation of that platform's sources, their library holds their
    kernels only, and the job's runs are the collective's definition; platforms that do not fit
    the program are refused before any rank is made, naming the entry."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    plats = ["cuda", "hip", "hip", "cuda"]
    x = [np.arange(50, dtype=np.float32) * (r + 1) for r in range(4)]
    with LocalJob(ir, timeout_s=30, platforms=plats) as job:
        assert [c.rank_platform[c.rank] for c in job.comms] == plats
        assert [c._pf.source_platform for c in job.comms] == plats
        assert len({id(c._pf) for c in job.comms}) == 2
        assert job.comms[0]._pf is job.comms[3]._pf and job.comms[1]._pf is job.comms[2]._pf
        libs = [c._kernels[("float32", "sum")].module.path for c in job.comms]
        assert libs[0] == libs[3] != libs[1] == libs[2]
        assert all(np.array_equal(g, sum(x)) for g in job.collective(x, 50))
        for proto in ("simple", "ll"):
            res = job.run(300, proto=proto)
            assert res.ok and res.proto == proto, (res.stuck, res.first_wrong)
    with pytest.raises(ValueError, match="rank 2: unknown platform 'rocm'"):
        LocalJob(ir, timeout_s=30, platforms=["cuda", "hip", "rocm", "cuda"])
    with pytest.raises(ValueError, match="3 rank platforms for a program of 4 ranks"):
        LocalJob(ir, timeout_s=30, platforms=["cuda"] * 3)


@needs_gxx
def test_a_jobs_run_counts_what_the_oracle_does_not_expect():
    """A receive that drops a contribution: the job's run reports the wrong elements as the
    runner's does (the reference run of the IR is not the collective)."""
    from codegen_irs import ring_allreduce
    from hccc.compiler.ir.program_ir import Buf, Op
    from hccc.runtime.local_job import LocalJob
    ir = ring_allreduce(3)
    ir.chunk_bytes = 64
    i = int(np.flatnonzero(ir.prims["op"] == Op.RECV_REDUCE_COPY)[0])
    ir.prims["op"][i] = Op.RECV
    ir.prims["src_buf"][i] = Buf.NONE
    ir.prims["src_off"][i] = 0
    with LocalJob(ir, timeout_s=30, dtype="int32") as job:
        res = job.run(99, dtype="int32")
    assert res.stuck is None and res.wrong == 0 and res.collective_wrong > 0 and not res.ok
    assert "allreduce needs" in res.first_wrong


@needs_gxx
def test_a_stuck_run_is_reported_and_the_job_runs_again():
    """Two ranks that each receive before they send: every rank's kernel times out and the run
    says where each stuck (as the runner's does, from each rank's error record, once: not the
    peers' relays of it), and the job stays usable; after a
    call the ranks disagree on, a good call runs."""
    from codegen_irs import stuck_ir
    from hccc.runtime.local_job import LocalJob
    with LocalJob(stuck_ir(), timeout_s=20, kernel_timeout_s=0.5, nthreads=2) as job:
        for count in (16, 40):
            res = job.run(count)
            assert res.stuck is not None and not res.ok
            # each rank's own error record once, in rank order, in the runner's words
            said = res.stuck.split("; ")
            assert len(said) == 2, res.stuck
            for r, text in enumerate(said):
                assert re.match(rf"rank {r}, TB 0 stuck in recv for chunk {1 - r} \(micro-batch 0\): waiting for "
                                rf"data from rank {1 - r}, primitive 0, task {1 - r}, gave up after", text), res.stuck
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    with LocalJob(ir, timeout_s=20) as job:
        with pytest.raises(CommunicatorError, match="every rank must make the same call"):
            job.each(lambda r, comm: comm.all_reduce(np.ones(10 + 2 * r, np.float32)))
        with pytest.raises(CommunicatorError, match="unusable after an earlier failure"):
            job.collective([np.ones(8, np.float32)] * 2, 8)
        job.recover()
        for proto in ("simple", "ll"):
            for comm in job.comms:
                comm.proto = proto
            assert job.run(100 + len(proto)).ok


@needs_gxx
def test_ranks_in_threads_reach_each_others_memory_without_mapping_it(monkeypatch):
    """In-process ranks exchange pointers and objects: nothing is exported, named in /dev/shm or
    mapped (shared memory refused outright during the set-up and the calls), every rank takes
    each peer's host segment as the peer's own object and its flags by address, and the calls
    run."""
    from hccc.runtime import shm
    from hccc.runtime.local_job import LocalJob

    def refused(*args, **kwargs):
        raise AssertionError("ranks in one process made or mapped POSIX shared memory")
    monkeypatch.setattr(shm, "create", refused)
    monkeypatch.setattr(shm, "attach", refused)
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        assert all(c._owned.imported == [] and c._owned.segments_own == [] for c in job.comms)
        assert all(set(c._owned.peer_flags) == {0, 1, 2} - {c.rank} for c in job.comms)
        assert all(c._owned.peer_flags[p.rank] == p._owned.flags_ptr
                   for c in job.comms for p in job.comms if p is not c)
        assert all(c._hosts.peers[p.rank] is p._hosts.own for c in job.comms for p in job.comms if p is not c)
        got = job.collective([np.full(30, r + 1, np.float32) for r in range(3)], 30)
        assert all(np.array_equal(g, np.full(30, 6, np.float32)) for g in got)


@needs_gxx
def test_no_rank_frees_memory_a_peers_runaway_kernel_may_touch():
    """A rank whose kernel ignores the abort flag keeps every rank's memory (they reach each
    other's memory as it is): closing the job gives back none of it."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    job = LocalJob(ir, timeout_s=30)
    freed = []
    for c in job.comms:
        c._owned.release = lambda kernel_running, r=c.rank: freed.append((r, kernel_running))
    job.comms[1]._broken = "host watchdog: kernel still running after 1 s; the kernel ignores the abort flag"
    job.close()
    assert sorted(freed) == [(0, True), (1, True)]


@needs_gxx
def test_ctrl_c_during_a_call_stops_every_rank_at_once_and_the_job_runs_again():
    """Ctrl-C while the ranks' kernels wait on each other (a deadlock with a long spin-wait
    limit): every rank gives up and its kernel is aborted within seconds, the KeyboardInterrupt
    goes on, and the job runs again after :meth:`recover` (a stuck call, then reported)."""
    import os
    import signal
    from codegen_irs import stuck_ir
    from hccc.runtime.local_job import LocalJob
    with LocalJob(stuck_ir(), timeout_s=60, kernel_timeout_s=60, nthreads=2) as job:
        def step(r, comm):
            if r == 0:
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            comm.all_gather(np.ones(8, np.float32), np.zeros(16, np.float32))
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            job.each(step)
        assert time.monotonic() - t0 < 15
        assert all(c._broken and "interrupted (Ctrl-C)" in c._broken for c in job.comms), \
            [c._broken for c in job.comms]
        job.recover()
        for c in job.comms:
            c.kernel_timeout_s = 0.5
        res = job.run(16)
        assert res.stuck is not None and "stuck in recv" in res.stuck, res.stuck


@needs_gxx
def test_a_jobs_ranks_build_their_library_once_where_their_platforms_build_alike(monkeypatch):
    """Ranks whose platforms promise the same builds (equal :meth:`Platform.build_identity`: the
    CPU emulation's toolchain, cache and source platform) build, or find in the cache, their one
    library once for the job, and run on one platform object of the job, which loads it once.
    Platforms that differ in a build input differ
    in identity; a platform that promises nothing has none."""
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import Platform
    assert CpuPlatform(opt="-O1").build_identity() == CpuPlatform(opt="-O1").build_identity()
    assert CpuPlatform(opt="-O1").build_identity() != CpuPlatform(opt="-O0").build_identity()
    assert (CpuPlatform(source_platform="hip").build_identity()
            != CpuPlatform(source_platform="cuda").build_identity())
    assert Platform.build_identity(CpuPlatform()) is None
    builds = []
    real = CpuPlatform.build

    def counted(self, *args, **kwargs):
        builds.append(self)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(CpuPlatform, "build", counted)
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        assert len(builds) == 1
        assert len({c._kernels[("float32", "sum")].module.path for c in job.comms}) == 1
        assert len({id(c._pf) for c in job.comms}) == 1        # one platform, the module loaded once
        assert len({id(c._kernels[("float32", "sum")].module) for c in job.comms}) == 1
        got = job.collective([np.full(6, r + 1, np.float32) for r in range(3)], 6, together=True)
        assert all(np.array_equal(g, np.full(6, 6, np.float32)) for g in got)


@needs_gxx
def test_the_ranks_of_a_job_in_threads_load_one_library_with_the_one_grid_entry():
    """One library of every rank (device scope on the CPU emulation), from the generated sources
    the ranks read once, built once and loaded by each rank, which the one-grid launch takes its entry from too; a job of separate processes
    builds each rank's own (:meth:`ProcessRank._library`)."""
    from hccc.runtime.communicator import Communicator
    from hccc.runtime.local_job import GridEntry, LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        paths = {c._kernels[("float32", "sum")].module.path for c in job.comms}
        assert len(paths) == 1
        assert len({id(c._prog) for c in job.comms}) == 1     # the generated sources read once
        assert GridEntry(job.comms, "float32", "sum").fn.module.path in paths
        assert [c._library() for c in job.comms] == [([0, 1, 2], {"single_gpu": True})] * 3
        assert Communicator._library(job.comms[1]) == ([1], {})


# ------------------------------------------------------------------------------ the runner's API on the job
@needs_gxx
def test_a_jobs_run_takes_the_size_as_bytes_or_elements():
    """``nbytes`` (a whole number of elements) or ``count``, exactly one, as the runner takes them."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        res = job.run(nbytes=400)
        assert res.ok and (res.count, res.bytes) == (100, 400)
        assert job.run(nbytes=400, dtype="bfloat16").count == 200
        for bad, text in (({}, "give exactly one of nbytes and count"),
                          ({"count": 4, "nbytes": 16}, "give exactly one of nbytes and count"),
                          ({"nbytes": 6}, "6 bytes is not a whole number of float32 elements (4 bytes each)"),
                          ({"count": -1}, "count must be non-negative")):
            with pytest.raises(ValueError) as err:
                job.run(**bad)
            assert str(err.value) == text


@needs_gxx
def test_a_job_says_its_layout_block_pieces_and_direct_receives():
    """The bookkeeping callers read: every rank's buffer lengths at a count (an AllGather of 3
    ranks: a third of the count in, the count out, the input inside the output at its rank's
    third), an AllToAll's block pieces (``k`` a block, ``k * nranks`` chunks), and the direct-mode
    receives (none when the sources keep every primitive on the FIFO)."""
    from hccc.runtime.direct_peers import direct_receive_count
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allgather(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        assert [row[:2] for row in job.layout(30)] == [(10, 30)] * 3
        assert [row[3] for row in job.layout(30)] == [0, 10, 20]
    ar = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    with LocalJob(ar, timeout_s=30) as job:
        assert job.direct_receives() == direct_receive_count(ar, ["cuda"] * 4, "auto") > 0
    with LocalJob(ar, timeout_s=30, direct="off") as job:
        assert job.direct_receives() == 0
    a2a = load_program(ROOT / "examples" / "ring_alltoall_6.rccl")
    with LocalJob(a2a, timeout_s=30) as job:
        vm, tables = job.vblocks()
        assert vm.k * 6 == a2a.nchunks and len(tables) == 6


@needs_gxx
def test_a_jobs_fifos_start_at_the_capacity_asked_for():
    """``fifo_capacity`` at set-up: the FIFOs hold that slot capacity from the start (at least
    the least slot, at most the compiled one), as the runner's; with ``fifo_bytes`` too, refused."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1024)
    for asked, held in ((64, 64), (10 ** 6, 1024), (1, 16 * max(1, ir.max_step_chunks))):
        with LocalJob(ir, timeout_s=30, fifo_capacity=asked) as job:
            assert job.fifo_capacity == held and all(c.chunk_bytes == held for c in job.comms)
            assert job.run(300).ok
    with pytest.raises(ValueError, match="give fifo_capacity or fifo_bytes, not both"):
        LocalJob(ir, timeout_s=30, fifo_capacity=64, fifo_bytes=512)


@needs_gxx
def test_a_job_takes_a_backend_per_manifest_platform_or_a_platform_object():
    """The runner's backend forms: a Platform object (its own sources' platform for every rank
    by default), a dict from manifest platform to a name or a Platform object; a platform the
    dict leaves out is refused before any rank is made, naming its ranks."""
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    hip = CpuPlatform(source_platform="hip")
    try:
        with LocalJob(ir, timeout_s=30, backend=hip) as job:
            assert [c.rank_platform[c.rank] for c in job.comms] == ["hip"] * 4
            assert all(c._pf is hip for c in job.comms) and job.run(50).ok
        plats = ["cuda", "hip", "hip", "cuda"]
        with LocalJob(ir, timeout_s=30, backend={"cuda": "cpu", "hip": hip}, platforms=plats) as job:
            assert [c._pf.source_platform for c in job.comms] == plats
            assert job.comms[1]._pf is hip and job.comms[0]._pf is job.comms[3]._pf is not hip
            assert job.run(50).ok
        with pytest.raises(PlatformError, match=r"no backend for the hip ranks 1-2 of"):
            LocalJob(ir, timeout_s=30, backend={"cuda": "cpu"}, platforms=plats)
    finally:
        hip.close()


@needs_gxx
def test_stopping_a_jobs_kernels_fails_the_running_call_and_the_job_runs_again():
    """``stop_kernels`` during a call whose kernels would spin for a minute: the call ends at
    once, failed on every rank (the kernels saw the abort flag), and the job runs again."""
    from codegen_irs import stuck_ir
    from hccc.runtime.local_job import LocalJob
    with LocalJob(stuck_ir(), timeout_s=20, kernel_timeout_s=60, nthreads=2) as job:
        timer = threading.Timer(0.5, job.stop_kernels)
        timer.start()
        t0 = time.monotonic()
        res = job.run(16)
        timer.join()
        assert time.monotonic() - t0 < 15 and not res.ok and res.stuck, res
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    with LocalJob(ir, timeout_s=30) as job:
        job.stop_kernels()                 # (nothing running: the next call clears the flag)
        assert job.run(30).ok


@needs_gxx
def test_the_ranks_on_one_device_fit_their_blocks_together():
    """Ranks on one device of one platform run at once and spin on each other: every block of
    all of them must be resident together, not each rank's alone (Ring AllReduce 4: 2 blocks a
    rank, 8 in all, against an emulation's thread budget). Without ``nthreads`` the ranks go
    down to 1 thread per block and say so; with it, or below what fits at 1 thread, the job is
    refused naming the budget that runs it; a run's ``nthreads`` is checked the same way."""
    from codegen_irs import ring_allreduce
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = ring_allreduce(4)
    ir.chunk_bytes = 64
    for budget, nthreads, refused in ((8, None, None), (7, None, "HCCC_CPU_MAX_THREADS=8 "),
                                      (15, 2, "use fewer threads per block, or .*HCCC_CPU_MAX_THREADS=16 ")):
        pf = CpuPlatform(max_threads=budget)
        try:
            if refused is not None:
                with pytest.raises(PlatformError, match=refused) as err:
                    LocalJob(ir, timeout_s=30, backend=pf, nthreads=nthreads)
                assert f"its 4 ranks on device 0 need 8 thread blocks of {nthreads or 1} threads" in str(err.value)
                continue
            with LocalJob(ir, timeout_s=30, backend=pf) as job:
                assert [c.block for c in job.comms] == [1] * 4
                assert "1 thread per thread block instead of the emitted 2" in job.threads_note
                assert job.run(1000).ok
                with pytest.raises(ValueError, match="need 8 thread blocks of 2 threads resident at once"):
                    job.run(1000, nthreads=2)
        finally:
            pf.close()


@needs_gxx
def test_a_run_the_program_or_the_limits_cannot_take_is_refused_before_any_call(monkeypatch):
    """As the runner refuses them, before any rank makes the call: a slice that cuts an MSCCL
    import's chunks (it would stick), a placement the program is not proven for, buffers over
    the run's memory limit (HCCC_MAX_RUN_BYTES); no call is counted on any rank."""
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = load_program(ROOT / "examples" / "msccl" / "allreduce_ring_4.xml")
    with LocalJob(ir, timeout_s=30) as job:
        with pytest.raises(ValueError, match="a slice of 16 bytes cuts the 4000-byte chunks"):
            job.run(4000, slice_bytes=16)
        assert [c._calls for c in job.comms] == [0] * 4
    ag = build_program(gen.ring_allgather(3), chunk_bytes=64)
    with LocalJob(ag, timeout_s=30) as job:
        job.ir.origin = dataclasses.replace(job.ir.origin, inplace=False)     # an import declared out of place
        try:
            with pytest.raises(ValueError, match="is proven out of place only"):
                job.run(30, inplace=True)
        finally:
            job.ir.origin = dataclasses.replace(job.ir.origin, inplace=None)
        monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "1000")
        with pytest.raises(PlatformError, match="over the limit of .*HCCC_MAX_RUN_BYTES"):
            job.run(3000)
        assert [c._calls for c in job.comms] == [0] * 3
        monkeypatch.delenv("HCCC_MAX_RUN_BYTES")
        assert job.run(30).ok


@needs_gxx
def test_a_backend_that_cannot_run_the_ranks_is_refused_once():
    """A backend named for one manifest platform, given ranks of the other, is refused before any
    rank is made, naming those ranks (as the runner refuses it); a failure every rank meets alike
    is said once, for every rank, not once per rank."""
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    with pytest.raises(PlatformError, match=r"ranks 1-2 are HIP ranks and the cuda backend runs CUDA programs only"):
        LocalJob(ir, timeout_s=30, backend="cuda", platforms=["cuda", "hip", "hip", "cuda"])
    with pytest.raises(PlatformError) as err:
        LocalJob(ir, timeout_s=30, backend="tpu")
    text = str(err.value)
    assert text.startswith("unknown backend 'tpu'"), text          # the runner's words
    assert text.count("unknown backend") == 1, text


def test_every_built_in_backend_is_known_also_after_one_of_them_was_imported():
    """The registry of platforms imports every built-in implementation once, also where one of
    them was imported before (it had registered only itself, so that the others were called
    unknown) and where threads ask at once (the others saw a half-filled registry): a backend
    missing here says it is not available, never that it is unknown."""
    import subprocess
    import sys
    code = ("import threading, hccc.runtime.cpu\n"
            "from hccc.runtime.platform import get_platform, PlatformError\n"
            "out = []\n"
            "def ask():\n"
            "    try: get_platform('cuda')\n"
            "    except PlatformError as e: out.append(str(e))\n"
            "    else: out.append('ok')\n"
            "ts = [threading.Thread(target=ask) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print(sum('unknown backend' in o for o in out), len(set(out)))\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.stdout.split() == ["0", "1"], (got.stdout, got.stderr)


@needs_gxx
def test_ranks_on_several_devices_of_one_process_may_write_each_others_memory():
    """Ranks of one process on several devices reach each other's FIFOs by pointer: the job turns
    on peer access among those devices once, before any call, as the single-process runner does
    (a stand-in platform of two devices on the CPU emulation, its requests recorded), and its runs
    are the collective's definition; a job on one device asks for none."""
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.gpu import placement_for
    from hccc.runtime.local_job import LocalJob

    class TwoDevices(CpuPlatform):
        def device_count(self) -> int:
            return 2

        def placement(self, nranks: int) -> list[int]:     # as a GPU platform of two devices
            return placement_for(nranks, 2)

        def set_device(self, index: int) -> None:
            assert index in (0, 1)

        def enable_peer_access(self, devices) -> None:
            self.asked.append(list(devices))
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=64)
    pf = TwoDevices()
    pf.asked = []
    try:
        with LocalJob(ir, timeout_s=30, backend=pf) as job:
            assert [c.device for c in job.comms] == [0, 0, 1, 1]     # the platform's placement
            assert pf.asked == [[0, 1]]
            assert job.run(40).ok
            assert pf.asked == [[0, 1]]
    finally:
        pf.close()
    one = TwoDevices()
    one.asked, one.device_count = [], lambda: 1
    try:
        with LocalJob(ir, timeout_s=30, backend=one) as job:
            assert [c.device for c in job.comms] == [0] * 4 and one.asked == []
    finally:
        one.close()


@needs_gxx
def test_a_job_on_a_platform_of_partial_residency_refuses_waits_once_and_a_grid_that_cannot_fit():
    """The CPU emulation keeping one block of a launch resident at a time: a program whose blocks
    wait on each other is refused before any rank is made, once, naming a wait (as the runner
    refuses it), and with every block resident it runs; a one-grid launch of more blocks than
    stay resident is refused as cooperative, and the job then launches each rank's own."""
    from codegen_irs import ring_allgather, ring_allreduce
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = ring_allgather(3)           # TB 0 waits on TB 1's receives and TB 2's copy
    ir.chunk_bytes = 32
    one, two, three = (CpuPlatform(workers=2, resident_blocks=k) for k in (1, 2, 3))
    try:
        with pytest.raises(PlatformError) as err:
            LocalJob(ir, timeout_s=30, backend=one, nthreads=1)
        msg = str(err.value)
        assert msg.startswith("cannot run ring_ag with at most 1 block of a rank resident at once: "), msg
        assert msg.count("cannot run") == 1 and "HCCC_CPU_RESIDENT_BLOCKS" in msg
        with LocalJob(ir, timeout_s=30, backend=three, nthreads=1) as job:
            assert job.run(300).ok
        ar = ring_allreduce(4)
        ar.chunk_bytes = 64
        with LocalJob(ar, timeout_s=30, backend=two, nthreads=1) as job:
            with pytest.raises(CommunicatorError, match="as one grid: the launch is cooperative"):
                job.collective([np.ones(8, np.float32)] * 4, 8, together=True, one_grid=True)
            assert not job.grid_usable("float32", "sum")
            assert job.run(40, one_grid=None).ok
    finally:
        for pf in (one, two, three):
            pf.close()


@needs_gxx
def test_fifos_that_could_not_grow_fail_the_call_at_once_and_the_job_says_why_after():
    """A reallocation of the FIFOs that fails half-way on one rank (out of memory): every rank's
    call fails at once with that reason (not after the peers' timeout), and every later call is
    refused saying why the job cannot run again (not run on FIFOs half gone), as the runner says
    it; closing the job frees what it holds."""
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=1 << 16)
    with LocalJob(ir, timeout_s=30, fifo_capacity=64) as job:
        assert job.run(48).ok

        def out_of_memory(*_a, **_k):
            raise PlatformError("out of memory allocating 1 bytes")
        job.comms[1]._owned.exported = out_of_memory
        t0 = time.monotonic()
        with pytest.raises(CommunicatorError) as err:
            job.run(1 << 15)
        assert time.monotonic() - t0 < 10, "the peers waited for the failed rank"
        text = str(err.value)
        for r in range(3):
            assert f"rank {r}: reallocating its FIFOs for slots of " in text, text
        assert "out of memory allocating 1 bytes" in text
        with pytest.raises(CommunicatorError, match="cannot run again: reallocating its FIFOs for slots of .* "
                                                    "failed: .*out of memory"):
            job.run(48)
