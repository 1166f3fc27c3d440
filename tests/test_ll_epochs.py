"""LL flag epochs (:mod:`hccc.runtime.ll_epoch`): every LL launch gets the next epoch, so the FIFO
slots are zeroed only at the first LL launch, after Simple launches and when the epochs wrap.

* the rule, against an oracle that tracks which flags the slots may hold (intervals of 32-bit
  values written since the last zeroing, or "anything" after a Simple launch) and checks that no
  launch that does not zero awaits one of them;
* a job of every rank in this process (:class:`~hccc.runtime.local_job.LocalJob`, the ranks the
  single-process runner runs) in the CPU emulation: repeated LL runs (and iterations of one run)
  with no zeroing between them, lines of the previous launch with their data corrupted left in
  the slots, the wrap of the epochs, and Simple / LL alternation, every output compared with the
  reference; the slots read back (each rank's :attr:`~hccc.runtime.process_rank.ProcessRank.memory`)
  carry the epoch in their flags.

The Communicator and the C++ host API are checked in tests/test_ll_launchers.py.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime import launcher
from hccc.runtime.local_job import LocalJob
from hccc.runtime.ll_epoch import LLEpochs, ll_messages_bound

from conftest import examples

SHIFT = 20              # the documented layout: epoch above bit 20, message index + 1 below
TOP = 1 << 32


def _flags(epoch: int, messages: int) -> tuple[int, int]:
    """(first flag, how many) of a launch of ``messages`` messages per connection in ``epoch``:
    message k's lines carry k + 1 + epoch * 2**20, modulo 2**32 (the documented formula)."""
    return (epoch * (1 << SHIFT) + 1) % TOP, messages


def _meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Do two runs of consecutive 32-bit values (start, length), modulo 2**32, share a value?"""
    (s1, n1), (s2, n2) = a, b
    return (s2 - s1) % TOP < n1 or (s1 - s2) % TOP < n2


@settings(max_examples=examples(150), deadline=None)
@given(epochs=st.sampled_from([1, 2, 3, abi.LL_EPOCHS]), start=st.integers(0, 5),
       calls=st.lists(st.tuples(st.sampled_from(["ll", "ll", "ll", "simple"]),
                                st.sampled_from([1, 7, abi.LL_EPOCH_MESSAGES, abi.LL_EPOCH_MESSAGES + 1,
                                                 3 * abi.LL_EPOCH_MESSAGES])),
                      max_size=40))
def test_no_launch_that_keeps_the_slots_awaits_a_flag_they_may_hold(epochs, start, calls):
    state = LLEpochs(epochs)
    # the oracle's view of the slots: None = anything (set-up or Simple data), else the runs of
    # flags written since the last zeroing (zeroed memory: the flag 0)
    held: list | None = None
    for i, (proto, messages) in enumerate(calls):
        if i == start and proto == "ll":          # the wrap, reached without thousands of calls
            state.next = max(state.next, epochs - 2)
        epoch, zero = state.launch(proto, messages)
        if proto != "ll":
            assert (epoch, zero) == (0, False)
            held = None
            continue
        assert 0 <= epoch < epochs
        if zero:
            held = [(0, 1)]
        awaited = _flags(epoch, messages)
        assert held is not None, "an LL launch kept slots that may hold Simple data"
        if not zero:
            assert not any(_meet(awaited, h) for h in held), (epoch, messages, held)
        # within the launch its own flags run up from k = 0: only past 2**32 - 1 messages
        # would one repeat, which no launch of these sizes reaches
        held.append(awaited)


def test_the_rule_written_out():
    """First LL launch zeroes (epoch 0), the next ones count up without zeroing, a Simple launch
    makes the next LL one zero again, the launch after the last epoch zeroes and starts at 0, and
    a launch past LL_EPOCH_MESSAGES zeroes before itself and before the next."""
    s = LLEpochs(4)
    seq = [s.launch(p, m) for p, m in [("ll", 1), ("ll", 1), ("simple", 1), ("ll", 1), ("ll", 1),
                                       ("ll", 1), ("ll", 1), ("ll", 1),
                                       ("ll", abi.LL_EPOCH_MESSAGES + 1), ("ll", 1), ("ll", 1)]]
    assert seq == [(0, True), (1, False), (0, False), (0, True), (1, False), (2, False), (3, False),
                   (0, True), (0, True), (0, True), (1, False)]
    assert s.zeroings == 5
    with pytest.raises(ValueError):
        LLEpochs(abi.LL_EPOCHS + 1)


def test_the_zeroing_rule_has_one_statement(tmp_path, monkeypatch):
    """When to zero is abi.LL_ZERO_WHEN: LLEpochs evaluates it and hccc_host_reset is rendered from
    it (the emitted header holds its C condition; a term added to the rule changes the header and
    stops LLEpochs, which does not give it, rather than letting the two drift)."""
    from hccc.compiler.backend.codegen import generate
    ir = build_program(gen.ring_allgather(2), chunk_bytes=1024)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    generate(ir, tmp_path / "a", platforms=["cuda"] * 2)
    host = (tmp_path / "a" / "hccc_host.h").read_text()
    assert f"ll = {abi.ll_zero_c()};" in host
    assert abi.ll_zero_c() == "(c->ll_dirty) || (wide) || (c->ll_next >= HCCC_HOST_LL_EPOCHS)"
    with pytest.raises(KeyError):
        abi.ll_zero(dirty=True, wide=False)
    monkeypatch.setattr(abi, "LL_ZERO_WHEN", abi.LL_ZERO_WHEN + (("cold", "planted", "c->cold"),))
    generate(ir, tmp_path / "b", platforms=["cuda"] * 2)
    assert "(c->cold)" in (tmp_path / "b" / "hccc_host.h").read_text()
    with pytest.raises(KeyError, match="cold"):
        LLEpochs().launch("ll", 1)


def test_message_bound_covers_the_kernels_micro_batches():
    """ll_messages_bound: primitives x micro-batches, the slice capped at LL's half share."""
    # 4 primitives, 1000 float32 over 2 chunks (500 each), 1024-byte slot of one chunk's share:
    # LL carries 512 bytes = 128 elements per slice -> 4 micro-batches
    assert ll_messages_bound(4, 1000, 2, 4, 1024, 1024, 1024) == 16
    # a 64-byte slice (under the share) -> 16 elements per slice -> 32 micro-batches
    assert ll_messages_bound(4, 1000, 2, 4, 1024, 1024, 64) == 128
    assert ll_messages_bound(3, 0, 2, 4, 1024, 1024, 1024) == 3


# ---------------------------------------------------------------------------- the ranks of a job
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.fixture()
def slot_zeroings(monkeypatch):
    """Every RankMemory.reset call's ``slots`` argument, in order."""
    seen = []
    orig = launcher.RankMemory.reset

    def reset(self, slots=False):
        seen.append(bool(slots))
        return orig(self, slots)
    monkeypatch.setattr(launcher.RankMemory, "reset", reset)
    return seen


def _job(ir) -> LocalJob:
    return LocalJob(ir, nthreads=32, direct="off")


def _epochs(job: LocalJob) -> set:
    """(next epoch, zeroings) of every rank's LL epochs: one pair, every rank derives the same."""
    return {(c.ll_epochs.next, c.ll_epochs.zeroings) for c in job.comms}


def _slots(job: LocalJob, rank: int) -> tuple[np.ndarray, object]:
    """Rank ``rank``'s FIFO slots read back, and its memory."""
    mem = job.comms[rank].memory
    slots = np.zeros(mem.plan.slots_bytes, np.uint8)
    mem.platform.memcpy_dtoh(slots, mem.slots)
    return slots, mem


def _flags_in_slot0(job: LocalJob, rank: int, nlines: int) -> np.ndarray:
    slots, _ = _slots(job, rank)
    return slots[:nlines * 8].view(np.uint64) >> np.uint64(32)


@needs_gxx
def test_repeated_ll_runs_reuse_the_slots_without_zeroing(slot_zeroings):
    """Ring AllReduce 4 (several messages per connection), LL, 6 runs of 3 launches each at
    different inputs and uneven counts: the slots are zeroed before the first launch only, every
    output is right, and the lines left in a slot carry the last launch's epoch."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    with _job(ir) as job:
        for i, count in enumerate([1000, 37, 1000, 515, 8, 999]):
            res = job.run(count=count, proto="ll", seed=i, iters=2, warmup=1, inplace=bool(i % 2))
            assert res.ok and res.proto == "ll" and res.wrong == 0, (i, res.stuck, res.first_wrong)
        assert _epochs(job) == {(18, 1)}
        # one reset per rank and launch; only the first launch's zero the slots
        assert slot_zeroings == [True] * 4 + [False] * (17 * 4)
        flags = _flags_in_slot0(job, 0, 2)          # a message of the last launch
        assert (flags >> np.uint64(SHIFT) == 17).all() and (flags % (1 << SHIFT) > 0).all(), flags


@needs_gxx
def test_stale_lines_with_corrupted_data_are_not_taken():
    """After an LL run, every line left in every slot keeps its flag but gets garbage data; the
    next LL run (the next epoch, no zeroing) still gives the reference's result, at a count whose
    messages reuse those very lines."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    with _job(ir) as job:
        for i in range(3):
            res = job.run(count=1000, proto="ll", seed=i)
            assert res.ok and res.wrong == 0
            for r in range(4):
                slots, mem = _slots(job, r)
                lines = slots.view(np.uint64)
                flagged = (lines >> np.uint64(32)) != 0
                lines[flagged] = (lines[flagged] & np.uint64(0xFFFFFFFF00000000)) | np.uint64(0x7FC00001)
                mem.platform.memcpy_htod(mem.slots, slots)
        assert {c.ll_epochs.zeroings for c in job.comms} == {1}


@needs_gxx
def test_the_epochs_wrap_with_one_zeroing(slot_zeroings):
    """Forced to the last epochs: epochs LL_EPOCHS - 2 and - 1 run on the lines of epoch 0 without
    zeroing (their flags end at 2**32 - 1), the next launch zeroes and runs in epoch 0 again, every
    output right."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    with _job(ir) as job:
        assert job.run(count=1000, proto="ll", seed=0).wrong == 0
        for c in job.comms:                # every rank alike (the call check compares them)
            c.ll_epochs.next = abi.LL_EPOCHS - 2
        got = []
        for i in range(4):
            res = job.run(count=1000 - i, proto="ll", seed=i + 1)
            assert res.ok and res.wrong == 0, (i, res.stuck)
            got.append(int(_flags_in_slot0(job, 1, 1)[0]) >> SHIFT)
        assert got == [abi.LL_EPOCHS - 2, abi.LL_EPOCHS - 1, 0, 1]
        assert slot_zeroings == [True] * 4 + [False] * 8 + [True] * 4 + [False] * 4
        assert {c.ll_epochs.zeroings for c in job.comms} == {2}


@needs_gxx
def test_simple_and_ll_alternate(slot_zeroings):
    """Simple, LL, Simple, LL, LL (the slots hold Simple's raw data before each LL launch that
    follows one): the LL launch after a Simple one zeroes, the one after an LL one does not; every
    output right."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    with _job(ir) as job:
        protos = ["simple", "ll", "simple", "ll", "ll", "simple", "ll"]
        for i, proto in enumerate(protos):
            res = job.run(count=1000 - 3 * i, proto=proto, seed=i)
            assert res.ok and res.proto == proto and res.wrong == 0, (i, proto, res.stuck)
        per_launch = slot_zeroings[::4]
        assert per_launch == [False, True, False, True, False, False, True]
