"""One rank per process: every collective, every example (up to 8 ranks) and random programs run
through :class:`hccc.runtime.Communicator` in separate processes (CPU emulation, FIFOs and counters
in POSIX shared memory, handles exchanged through a torch.distributed FileStore), compared with the
collective's definition (:func:`hccc.runtime.reference.expected`, computed from the inputs alone);
failures (a killed peer, a peer that never arrives, mismatched calls, bad arrays) give every
surviving rank a clear error within the timeout and leave nothing in ``/dev/shm``.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_program
from hccc.compiler.frontend.collectives import SPECS
from hccc.testing import valid_programs

from rank_pool import RankPool, run_fresh
from communicator_calls import (INSTANCE, POOL_SIZE, PROGRAMS, calls_for, check, no_leaks, pool,  # noqa: F401 (fixtures)
                                require_torch, run)

#: the name tests/test_mscclpp_*.py still import from here
_require_torch = require_torch


pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ every collective
# several processes per case, each building its kernels: with the slow tests (pytest -m slow);
# the default set runs random programs in separate processes (below)
@pytest.mark.slow
@pytest.mark.parametrize("collective", sorted(PROGRAMS))
def test_every_collective_in_separate_processes(pool, collective):
    ir = build_program(PROGRAMS[collective](), chunk_bytes=64)
    dtype, op = INSTANCE[collective]
    # uneven counts (chunks differ by one element; several micro-batches per chunk), two calls
    per_rank = [[] for _ in range(ir.nranks)]
    wants = []
    for count in (1000 + ir.nranks - 1, 37):
        calls, want, _ = calls_for(ir, count, dtype, op, seed=count)
        for r in range(ir.nranks):
            per_rank[r] += calls[r]
        wants.append(want)
    replies = pool.run(ir.to_json(), ir.nranks, per_rank, dtype=dtype, op=op)
    for i, want in enumerate(wants):
        check([{**rep, "outputs": rep["outputs"][:i + 1]} if rep["ok"] else rep for rep in replies],
              want, f"{ir.name} call {i} ({dtype} {op})", ncalls=i + 1)


@pytest.mark.slow
def test_successive_calls_of_different_sizes(pool):
    """Counters are reset between calls; every call meets its peers first."""
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    sizes = [5, 300, 0, 64]
    per_rank = [[] for _ in range(3)]
    wants = []
    for i, n in enumerate(sizes):
        calls, want, _ = calls_for(ir, n, seed=i)
        for r in range(3):
            per_rank[r] += calls[r]
        wants.append(want)
    replies = pool.run(ir.to_json(), 3, per_rank)
    for i, want in enumerate(wants):
        check([{**rep, "outputs": rep["outputs"][:i + 1]} if rep["ok"] else rep for rep in replies],
              want, f"call {i} ({sizes[i]} elements)", ncalls=i + 1)


@pytest.mark.slow   # 13 s: three communicators of three processes; table mode's outdir stays in the default set
def test_algorithm_from_an_outdir_and_from_an_rccl_file(pool, tmp_path):
    """The first argument may be a compiled OUTDIR (its manifest and ProgramIR) or an .rccl file."""
    from hccc.compiler.pipeline import CompileOptions, compile_program

    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    outdir = tmp_path / "out"
    compile_program(ir, outdir, CompileOptions(chunk_bytes=64))
    rccl = tmp_path / "ring.rccl"
    rccl.write_text(gen.ring_allreduce_rccl(3))
    for algo in (outdir, outdir / "manifest.json", rccl):
        calls, want, _ = calls_for(ir, 77, seed=3)
        check(pool.run(str(algo), 3, calls), want, str(algo.name))


def test_table_mode_outdir_in_separate_processes(pool, tmp_path):
    """An OUTDIR compiled with --codegen table: every rank runs the generic kernel on its own
    table (checked against the manifest), with the same v2 memory as the specialised kernels."""
    from hccc.compiler.pipeline import CompileOptions, compile_program

    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    outdir = tmp_path / "table"
    compile_program(ir, outdir, CompileOptions(chunk_bytes=64, codegen="table"))
    for count, seed in ((1000 + 2, 5), (37, 6)):
        calls, want, _ = calls_for(ir, count, seed=seed)
        check(pool.run(str(outdir), 3, calls), want, f"table mode, {count} elements")


def test_damaged_table_is_refused_clearly(pool, tmp_path):
    """A table that does not match its manifest is refused on every rank, the manifest named."""
    from hccc.compiler.backend.table_program import table_path
    from hccc.compiler.pipeline import CompileOptions, compile_program

    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    outdir = tmp_path / "table"
    compile_program(ir, outdir, CompileOptions(chunk_bytes=64, codegen="table"))
    man = json.loads((outdir / "manifest.json").read_text())
    tpath = table_path(outdir, man)
    tpath.write_bytes(tpath.read_bytes()[:-8])
    calls, _want, _ = calls_for(ir, 10, seed=1)
    replies = pool.run(str(outdir), 3, calls)
    assert not any(rep["ok"] for rep in replies)
    assert all("manifest.json" in rep["error"] and "Traceback" not in rep["error"]
               for rep in replies), replies


@pytest.mark.slow
def test_bootstrap_through_an_initialised_process_group(tmp_path):
    """torch.distributed initialised (as under torchrun): the communicator takes rank, world size
    and the handle exchange from the default process group."""
    require_torch()
    ir = build_program(gen.ring_reducescatter(3), chunk_bytes=64)
    calls, want, _ = calls_for(ir, 100)
    check(run_fresh(ir.to_json(), 3, calls, tmp_path, process_group=True), want, "process group")


# ------------------------------------------------------------------------------ every example
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.rccl"))


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_in_separate_processes(pool, name):
    ir = load_program(ROOT / "examples" / name)
    if ir.nranks > POOL_SIZE:
        pytest.skip(f"{ir.nranks} ranks: more processes than this suite starts ({POOL_SIZE}); "
                    "the single-process kernel tests run it")
    run(pool, ir, 4 * ir.nchunks + 3, seed=ir.nranks)


# ------------------------------------------------------------------------------ random programs
@pytest.mark.slow   # 4 s: three programs, each on its own processes (the kernels' own property tests run by default)
@settings(max_examples=3)
@given(alg=valid_programs(list(SPECS), max_ranks=5, min_ranks=2),
       count=st.integers(0, 300), dtype=st.sampled_from(["float32", "int32"]),
       op=st.sampled_from(["sum", "max", "min"]))
def test_random_programs_in_separate_processes(pool, alg, count, dtype, op):
    run(pool, build_program(alg, chunk_bytes=64), count, dtype, op, seed=count)


# ------------------------------------------------------------------------------ failures
def test_mismatched_calls_are_an_error_on_every_rank(pool):
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    calls = [[{"method": "all_reduce", "x": np.ones(10, np.float32)}],
             [{"method": "all_reduce", "x": np.ones(12, np.float32)}]]
    replies = pool.run(ir.to_json(), 2, calls)
    for r, rep in enumerate(replies):
        assert not rep["ok"]
        assert "every rank must make the same call" in rep["error"], rep["error"]


def test_every_rank_cuts_a_call_as_the_launchers_rule_says(pool):
    """Each rank's slice of a call (``last_slice_bytes``) is the one rule's
    (``launch_slice_bytes``, which the Runner and the simulator follow too:
    tests/test_slice_program_policy.py), under Simple and under LL (half the slot's share)."""
    from hccc.runtime.rank_memory import launch_slice_bytes
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=64)
    xs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(2)]
    calls = [[{"method": "all_reduce", "x": xs[r], "proto": proto} for proto in ("simple", "ll")] for r in range(2)]
    want = [launch_slice_bytes(ir, 4000, 4, 64, proto) for proto in ("simple", "ll")]
    assert want == [64, 32]
    for rep in pool.run(ir.to_json(), 2, calls):
        assert rep["ok"], rep.get("error")
        assert [p for p, _ in rep["protos"]] == ["simple", "ll"] and rep["slices"] == want
        assert all(np.array_equal(out, xs[0] + xs[1]) for out in rep["outputs"])


@pytest.mark.slow   # 6.5 s: three communicators of two processes
def test_bad_arrays_are_clear_errors(pool):
    ir = build_program(gen.ring_allgather(2), chunk_bytes=64)
    bad = [
        ({"method": "all_gather", "x": np.ones(3, np.float32), "out": 10}, "needs 5"),
        ({"method": "all_gather", "x": np.ones(5, np.int16), "out": 10}, "int16"),
        ({"method": "all_reduce", "x": np.ones(5, np.float32)}, "implements allgather"),
    ]
    for call, text in bad:
        replies = pool.run(ir.to_json(), 2, [[call], [call]])
        for rep in replies:
            assert not rep["ok"] and text in rep["error"], rep


def test_world_size_must_be_the_algorithms(pool):
    ir = build_program(gen.ring_allgather(2), chunk_bytes=64)
    calls, _, _ = calls_for(ir, 10)
    replies = pool.run(ir.to_json(), 2, calls, world_override=3)
    for rep in replies:
        assert not rep["ok"] and "is an algorithm for 2 ranks; this job has 3" in rep["error"], rep


def test_memory_refused_during_set_up_is_out_of_memory_on_every_rank(pool):
    """Rank 1's system refuses its FIFO segment's mapping (ENOMEM, as under ``ulimit -v``): rank 1
    says it is out of memory, naming itself; rank 0 ends its set-up with that reason (not at the
    timeout); nothing is left in /dev/shm (the autouse fixture); a later communicator works."""
    ir = build_program(gen.ring_allgather(2), chunk_bytes=1 << 20)
    calls, want, _ = calls_for(ir, 10)
    replies = pool.run(ir.to_json(), 2, calls, per_rank={1: {"refuse_mappings_from": 1 << 20}})
    assert not replies[1]["ok"] and replies[1]["error"].startswith(
        "CommunicatorError: rank 1: setting up: out of memory: the system refused shared memory"), replies[1]
    assert not replies[0]["ok"] and "rank 1" in replies[0]["error"] and "out of memory" in replies[0]["error"], \
        replies[0]
    check(pool.run(ir.to_json(), 2, calls), want, "after the failure")


def test_threads_refused_at_the_launch_are_out_of_memory_on_every_rank(pool):
    """Rank 1's launch cannot start its threads: rank 1 says it is out of memory; rank 0, whose
    kernel already waits for rank 1's data, is aborted with that reason well before its kernel's
    own timeout."""
    ir = build_program(gen.ring_allgather(2), chunk_bytes=64)
    calls, _, _ = calls_for(ir, 10)
    calls[1] = [{**calls[1][0], "launch_refused": True}]
    start = time.monotonic()
    replies = pool.run(ir.to_json(), 2, calls, kernel_timeout=60.0)
    assert time.monotonic() - start < 50
    assert not replies[1]["ok"] and "out of memory: the system refused a thread" in replies[1]["error"], replies[1]
    assert replies[1]["error"].startswith("CommunicatorError: rank 1: all_gather #1: "), replies[1]
    assert not replies[0]["ok"] and "rank 1" in replies[0]["error"] and "out of memory" in replies[0]["error"], \
        replies[0]


@pytest.mark.slow
def test_killed_peer_is_reported_by_every_rank_and_a_later_communicator_works(pool, tmp_path):
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    calls, want, _ = calls_for(ir, 500)
    # rank 1 makes one call, then dies before its second: ranks 0 and 2 wait at the next call
    dying = [c + c for c in calls]
    dying[1] = calls[1] + [{**calls[1][0], "die": True}]
    replies = run_fresh(ir.to_json(), 3, dying, tmp_path, timeout=20.0)
    assert replies[1] is None
    for r in (0, 2):
        assert not replies[r]["ok"]
        assert "rank 1" in replies[r]["error"] and "exited" in replies[r]["error"], replies[r]["error"]
    # a later communicator (new processes, new store) works
    check(pool.run(ir.to_json(), 3, calls), want, "after the failure")


@pytest.mark.slow
def test_peer_killed_during_the_kernel(tmp_path):
    """Rank 1 dies after meeting its peers, when it would launch: the others' kernels wait for its
    data, and the host watch aborts them (the error names the dead process: the kernels' own
    60 s timeout, which would report a stuck primitive alone, is not what ends the wait)."""
    require_torch()
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    calls, _, _ = calls_for(ir, 3000)
    calls[1] = [{**calls[1][0], "die_in_kernel": True}]
    replies = run_fresh(ir.to_json(), 3, calls, tmp_path, timeout=20.0, kernel_timeout=60.0)
    assert replies[1] is None
    for r in (0, 2):
        err = replies[r]["error"]
        assert not replies[r]["ok"]
        assert "failed: rank 1 (process" in err and "exited" in err, err
        assert "gave up after 6" not in err, err


@pytest.mark.slow
def test_peer_that_never_arrives(tmp_path):
    require_torch()
    ir = build_program(gen.ring_allgather(3), chunk_bytes=64)
    calls, _, _ = calls_for(ir, 30)
    pool = RankPool(2, tmp_path)        # only ranks 0 and 1 of 3 exist
    try:
        replies = pool.run(ir.to_json(), 2, calls[:2], timeout=3.0, world_override=3)
    finally:
        pool.close()
    for rep in replies:
        assert not rep["ok"]
        assert "rank 2 of 3 did not arrive within 3 s" in rep["error"], rep["error"]


def test_calls_keep_to_the_placements_the_program_is_proven_for(pool):
    """A program proven out of place only (an MSCCL XML with inplace="0"): an in-place all_reduce
    runs out of place into a temporary output and copies back (its buffers are never aliased); a
    program proven in place only refuses an out-of-place call on every rank."""
    ir = build_program(gen.ring_allreduce(3), chunk_bytes=64)
    ir.origin = dataclasses.replace(ir.origin, inplace=False)
    assert ir.placements == (False,)
    calls, want, _ = calls_for(ir, 77, seed=5)      # all_reduce(x): in place
    check(pool.run(ir.to_json(), 3, calls), want, "out-of-place-only program called in place")
    ir.origin = dataclasses.replace(ir.origin, inplace=True, outofplace=False)
    calls = [[dict(c[0], out=77)] for c in calls]
    for rep in pool.run(ir.to_json(), 3, calls):
        assert not rep["ok"] and "proven in place only" in rep["error"]


def test_in_place_only_gathers_and_scatters_take_their_in_place_layout(pool):
    """A program proven in place only (an MSCCL++ plan with 'inplace': true) is called in place
    with all_gather's input at its block of the output and reduce_scatter's output at its block of
    the input (they were refused as out-of-place calls)."""
    for make, how in ((gen.ring_allgather, "input_in_output"), (gen.ring_reducescatter, "output_in_input")):
        ir = build_program(make(3), chunk_bytes=64)
        ir.origin = dataclasses.replace(ir.origin, inplace=True, outofplace=False)
        assert ir.placements == (True,)
        calls, want, _ = calls_for(ir, 3 * 40, seed=2)
        check(pool.run(ir.to_json(), 3, [[dict(c, **{how: True}) for c in cs] for cs in calls]), want,
              f"in-place-only {ir.collective} in its in-place layout")
        for rep in pool.run(ir.to_json(), 3, calls):                  # separate buffers: refused
            assert not rep["ok"] and "proven in place only" in rep["error"]


def test_a_call_leaves_no_thread_of_its_own(tmp_path, monkeypatch):
    """The thread that waits for the kernel has ended when a call returns, even when it is slow
    to finish after reporting (as on a loaded machine): the leak checks of the failure tests count
    threads right after a call."""
    require_torch()
    import threading
    import types
    from hccc.runtime import communicator as mod
    from hccc.runtime import rank_memory     # the waiter: rank_memory.synchronize_in_background

    class Lingering(threading.Event):           # the waiter is late to end after reporting
        def set(self):
            super().set()
            if threading.current_thread().name == "hccc-comm-wait":
                time.sleep(0.3)

    ir = build_program(gen.ring_allreduce(1), chunk_bytes=256)
    with mod.Communicator(ir, rank=0, world_size=1, init_method=f"file://{tmp_path}/store",
                          timeout_s=20, kernel_timeout_s=10) as comm:
        monkeypatch.setattr(rank_memory, "threading", types.SimpleNamespace(Event=Lingering,
                                                                            Thread=threading.Thread))
        x = np.arange(64, dtype=np.float32)
        assert np.array_equal(comm.all_reduce(x), np.arange(64, dtype=np.float32))
        assert [t.name for t in threading.enumerate() if t.name == "hccc-comm-wait"] == []
