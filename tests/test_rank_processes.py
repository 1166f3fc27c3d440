"""benchmarks/rank_processes.py: the job of N spawned rank processes the per-process benchmarks share.
Every rank's value comes back in rank order; a rank that raises ends the job at once with its
traceback, and the ranks still waiting are stopped; a rank that exits without an answer is named."""
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rp():
    spec = importlib.util.spec_from_file_location("rank_processes", ROOT / "benchmarks" / "rank_processes.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rank_processes"] = mod          # spawned children unpickle its functions by this name
    spec.loader.exec_module(mod)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


def echo(rank, world, store_dir, scale):
    assert os.path.isdir(store_dir)
    return (rank, world, rank * scale, os.path.basename(store_dir))


def fail_on_one(rank, world, store_dir):
    if rank == 1:
        raise ValueError("rank one refuses")
    time.sleep(120)                              # a peer that would wait for rank 1 a long time


def exit_silently(rank, world, store_dir):
    if rank == 0:
        os._exit(3)
    return rank


def test_every_rank_answers_in_rank_order(rp):
    got = rp.run_ranks(echo, 3, (10,), timeout_s=120)
    assert [g[:3] for g in got] == [(0, 3, 0), (1, 3, 10), (2, 3, 20)]
    assert len({g[3] for g in got}) == 1               # one store directory for the whole job
    assert rp.store_url("/x", "s") == "file:///x/s"


def test_a_failing_rank_ends_the_job_at_once(rp):
    t0 = time.monotonic()
    with pytest.raises(rp.RankJobError) as err:
        rp.run_ranks(fail_on_one, 3, timeout_s=100)
    assert time.monotonic() - t0 < 60
    reasons = err.value.reasons
    assert "ValueError: rank one refuses" in reasons[1]
    assert reasons[0] == reasons[2] == "stopped after rank 1 failed"


def test_a_rank_without_an_answer_is_named(rp):
    with pytest.raises(rp.RankJobError) as err:
        rp.run_ranks(exit_silently, 2, timeout_s=100)
    assert err.value.reasons == {0: "exited with status 3 without an answer"}
