"""A rank of an ``"hccc"`` process group whose call fails while a peer waits for it: the peer is
told at once, whatever ran before in the process.

Two ranks in threads of this process on the delegate (an empty catalog). The waiting rank gives up
on a gloo call that gloo cannot cancel (it ends at the group's timeout); gloo's destructor waits for
such a call, so whichever thread dropped the group's last reference stalled until then -- the
garbage collector's, in a later test's rank thread, when the group sat in a reference cycle (an
exception's traceback). The ledger's failure records (:meth:`hccc.torch.ledger.Ledger.fail`) are
checked against their definition: a failed call's record is reported for that call's number only,
by :meth:`~hccc.torch.ledger.Ledger.conflict` and not by :meth:`~hccc.torch.ledger.Ledger.settle`
(the call completed there); an unusable group's for every later number, by both.
"""
from __future__ import annotations

import gc
import threading
import time

import pytest

from conftest import needs_torch

torch = needs_torch()
dist = needs_torch("torch.distributed")

from torch_ranks import ledgers  # noqa: E402

#: the groups' timeout, seconds: what a rank not told of its peer's failure waits
GROUP_TIMEOUT_S = 15.0
#: what "at once" allows on a loaded host: well under the timeout, well over a call
PROMPT_S = 6.0


def test_a_group_that_gave_up_on_a_delegate_call_is_collected_at_once(tmp_path):
    """After rank 0 gave up on its gloo scatter (the root's call differed), the groups' garbage
    is collected within seconds: the abandoned call is held by a thread of its own until gloo's
    timeout ends it. Before, the collection (forced here, run by chance in a later test's rank
    thread under pytest) waited out gloo's timeout."""
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads, root_with_a_bad_list
    (tmp_path / "empty").mkdir()
    job = root_with_a_bad_list(threading.Barrier(2))
    t0 = time.monotonic()
    got = ranks_in_threads([job(0), job(1)], Options(catalog=tmp_path / "empty", builtin=False),
                           timeout_s=GROUP_TIMEOUT_S)
    errors = [str(res) for res, _ in got]
    assert "the root's scatter_list" in errors[0] and "rank 1 made scatter(" in errors[0], errors
    del got
    gc.collect()
    took = time.monotonic() - t0
    assert took < PROMPT_S, f"the groups and their collection took {took:.1f} s"
    # a later group in the same process is not held up either
    job = root_with_a_bad_list(threading.Barrier(2))
    got = ranks_in_threads([job(0), job(1)], Options(catalog=tmp_path / "empty", builtin=False),
                           timeout_s=GROUP_TIMEOUT_S)
    for rank, (res, seconds) in enumerate(got):
        assert isinstance(res, Exception) and seconds < PROMPT_S, (rank, res, seconds)


class _Refusing:
    """A delegate that refuses every all_reduce (an error in the rank's own backend, after the call
    was posted with the same description as the peer's)."""

    def __init__(self, inner):
        self.inner = inner

    def allreduce(self, *args, **kwargs):
        raise RuntimeError("this rank's delegate refuses the all_reduce")

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("refusing", [0, 1])
def test_a_rank_whose_call_fails_is_named_to_the_peer_waiting_for_it(tmp_path, refusing):
    """The same all_reduce on both ranks; one rank's delegate refuses it after the call was
    posted. The other rank, waiting in gloo, fails at once naming the refusing rank and its error
    (before: gloo's timeout), and its group is unusable afterwards; the refusing rank's own error
    is its backend's."""
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    (tmp_path / "empty").mkdir()
    after = {}

    def job(rank):
        def run(pg):
            t = torch.ones(4)
            pg.allreduce([t]).wait()
            assert t.tolist() == [2.0] * 4
            if rank == refusing:
                pg._delegates["cpu"] = _Refusing(pg._delegates["cpu"])
            try:
                pg.allreduce([torch.ones(4)]).wait()
            finally:
                if rank != refusing:
                    try:
                        pg.allreduce([torch.ones(4)])
                    except RuntimeError as exc:
                        after[rank] = str(exc)
        return run
    got = ranks_in_threads([job(0), job(1)], Options(catalog=tmp_path / "empty", builtin=False),
                           timeout_s=GROUP_TIMEOUT_S)
    waiting = 1 - refusing
    res, seconds = got[waiting]
    assert type(res).__name__ == "CallMismatch", res
    assert seconds < PROMPT_S, f"rank {waiting} waited {seconds:.1f} s"
    assert (f"call #2 of the group, allreduce(op=sum, float32, elements 4, cpu), failed on rank "
            f"{refusing}: RuntimeError: this rank's delegate refuses the all_reduce") in str(res), res
    assert "unusable after an earlier failure" in after[waiting], after
    assert "refuses the all_reduce" in str(got[refusing][0]) and got[refusing][1] < PROMPT_S


def test_a_call_refused_on_one_rank_fails_its_peer_at_once_and_then_the_refusing_rank(tmp_path):
    """Rank 1 passes a tensor the group refuses (on the meta device) before queueing the call:
    it raises at once, and its peer, waiting in gloo for that all_reduce, fails at once naming the
    refusal (before: gloo's timeout), its group unusable; rank 1's next call, which its peer will
    never make, fails at once too, naming the peer's unusable group."""
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    (tmp_path / "empty").mkdir()
    seen = {}

    def job(rank):
        def run(pg):
            pg.allreduce([torch.ones(4)]).wait()
            if rank == 1:
                with pytest.raises(ValueError, match="not supported"):
                    pg.allreduce([torch.ones(4, device="meta")])
                t0 = time.monotonic()
                try:
                    pg.allreduce([torch.ones(4)]).wait()
                except Exception as exc:
                    seen["next"] = (exc, time.monotonic() - t0)
                return "done"
            pg.allreduce([torch.ones(4)]).wait()
        return run
    got = ranks_in_threads([job(0), job(1)], Options(catalog=tmp_path / "empty", builtin=False),
                           timeout_s=GROUP_TIMEOUT_S)
    res, seconds = got[0]
    assert type(res).__name__ == "CallMismatch" and seconds < PROMPT_S, (res, seconds)
    assert ("call #2 of the group: rank 1 made allreduce(refused: ValueError: allreduce: tensors "
            "on meta") in str(res), res
    assert got[1][0] == "done", got[1]
    exc, seconds = seen["next"]
    assert type(exc).__name__ == "CallMismatch" and seconds < PROMPT_S, (exc, seconds)
    assert ("call #3 of the group, allreduce(op=sum, float32, elements 4, cpu), cannot complete: "
            "rank 0's group is unusable since its call #2: call #2 of the group: rank 1 made "
            "allreduce(refused: ") in str(exc), exc


class _DoneWork:
    """A delegate's work that completed at once."""

    def is_completed(self):
        return True

    def wait(self):
        return True


def test_a_call_that_completed_against_a_peers_other_call_makes_the_group_unusable():
    """The interleaving behind the test above, driven step by step: rank 1 refused its call #2
    before queueing it, so its call #3 meets rank 0's call #2 in the delegate and both complete.
    Rank 0's look after its call finds rank 1's refusal: its group is unusable from then on, and
    rank 1's look after call #3, waiting for rank 0's post of #3, which never comes, is told so at
    once (before: rank 0 recorded nothing, and rank 1's call #3 returned unchecked after the timeout,
    its data exchanged with another call)."""
    from collections import Counter, defaultdict
    from hccc.torch.jobs import CallJobs
    from hccc.torch.ledger import CallMismatch
    timeout_s = 5.0
    ls = ledgers("shm", 2)
    try:
        jobs = [CallJobs(r, 2, None, ls[r], timeout_s, timeout_s, Counter(), defaultdict(Counter))
                for r in range(2)]
        text = "allreduce(op=sum, float32, elements 4, cpu)"
        for j in jobs:
            j.next_call(text)                                # call #1 on both ranks
        jobs[1].refused_job("allreduce(refused: ValueError: tensors on meta)")()    # rank 1's #2
        with pytest.raises(CallMismatch, match="rank 1 made allreduce.refused"):
            jobs[0].delegate_job("allreduce", "delegate", None, lambda b: _DoneWork(), None, text)()
        assert jobs[0].broken is not None
        assert ls[0].record(0)[:2] == (2, True)
        t0 = time.monotonic()
        with pytest.raises(CallMismatch, match=r"call #3 of the group, allreduce\(op=sum.*cannot complete: "
                           r"rank 0's group is unusable since its call #2"):
            jobs[1].delegate_job("allreduce", "delegate", None, lambda b: _DoneWork(), None, text)()
        assert time.monotonic() - t0 < timeout_s / 2
    finally:
        for led in ls:
            led.close()


# ------------------------------------------------------------------------------ failure records
@pytest.mark.parametrize("kind", ["shm", "store"])
def test_a_failure_record_is_seen_for_its_call_only(kind):
    """Rank 2 records that its call 5 failed (a long, non-ASCII reason); ranks 0 and 1 waiting
    on call 5 are told (its reason, cut to the record's size); on call 4 or 6 (a later call the
    failed rank made after all) they are not; settle does not look (the call completed there);
    a later failure replaces the record; a difference of calls is named before a failure; a record
    of a group unusable from a call on is seen for every later call."""
    from hccc.torch.ledger import FAIL_TEXT_BYTES, CallMismatch, digest
    text = "allreduce(op=sum, float32, elements 8, cpu)"
    other = "barrier(cpu)"
    ls = ledgers(kind, 3)
    try:
        for seq in (4, 5, 6):
            for led in ls:
                led.post(seq, text, digest(text))
        why = "RuntimeError: délai " + "x" * 2 * FAIL_TEXT_BYTES
        ls[2].fail(5, why)
        cut = why.encode()[:FAIL_TEXT_BYTES].decode("utf-8", "replace")
        for r in (0, 1):
            seen = ls[r].conflict(5, text, digest(text))
            assert seen == (f"call #5 of the group, {text}, failed on rank 2: {cut}; the call "
                            "cannot complete without it"), seen
            assert ls[r].failure(2, 5) == (5, cut)
            assert ls[r].conflict(4, text, digest(text)) is None
            assert ls[r].conflict(6, text, digest(text)) is None
            ls[r].settle(5, text, digest(text), 1.0)
        assert ls[2].conflict(5, text, digest(text)) is None      # its own record: not a peer's
        ls[2].fail(6, "ValueError: later")
        assert ls[0].conflict(5, text, digest(text)) is None
        assert ls[0].conflict(6, text, digest(text)).endswith(
            "failed on rank 2: ValueError: later; the call cannot complete without it")
        ls[1].post(6, other, digest(other))
        assert f"rank 1 made {other}" in ls[0].conflict(6, text, digest(text))
        # a record for every later call (the group unusable on rank 2 since call 5): not for
        # call 4 or 5's comparison as a call-5 failure, for 6 and on as the unusable group
        ls[2].fail(5, "unusable", onward=True)
        assert ls[0].conflict(4, text, digest(text)) is None
        assert "failed on rank 2: unusable" in ls[0].conflict(5, text, digest(text))
        for seq in (7, 70):
            assert ls[0].conflict(seq, text, digest(text)) == (
                f"call #{seq} of the group, {text}, cannot complete: rank 2's group is unusable "
                "since its call #5: unusable")
        ls[1].post(7, text, digest(text))
        with pytest.raises(CallMismatch, match="rank 2's group is unusable since its call #5"):
            ls[0].settle(7, text, digest(text), 1.0)
    finally:
        for led in ls:
            led.close()


_EXIT_AFTER_GIVING_UP = """
import sys, threading
sys.path.insert(0, {tests!r})
from hccc.torch import Options
from torch_ranks import ranks_in_threads
from torch_ranks import root_with_a_bad_list
job = root_with_a_bad_list(threading.Barrier(2))
got = ranks_in_threads([job(0), job(1)], Options(catalog={empty!r}, builtin=False), timeout_s={timeout!r})
print("rank 0:", got[0][0])
"""


def test_a_process_that_gave_up_on_a_delegate_call_exits_at_once(tmp_path):
    """A process whose rank gave up on a gloo call (still pending in gloo) exits at once with
    status 0: neither waiting out gloo's timeout nor aborted by the thread holding the call."""
    import subprocess
    import sys
    from pathlib import Path
    (tmp_path / "empty").mkdir()
    script = _EXIT_AFTER_GIVING_UP.format(tests=str(Path(__file__).resolve().parent),
                                          empty=str(tmp_path / "empty"), timeout=GROUP_TIMEOUT_S)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=3 * GROUP_TIMEOUT_S)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 1 made scatter(" in proc.stdout, proc.stdout
    assert took < GROUP_TIMEOUT_S - 3, f"the process took {took:.1f} s to exit"
