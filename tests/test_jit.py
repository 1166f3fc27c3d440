"""util/jit.py: plain Python below a kernel's threshold, numba from it on, HCCC_JIT
overriding; and the compiled twins of the simulator, the greedy and the list scheduler compute what
the plain functions compute."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hccc.util import clock
from hccc.util import jit
from hccc.util.jit import Kernels

ROOT = Path(__file__).resolve().parent.parent
needs_numba = pytest.mark.skipif(not jit.have_numba(), reason="numba is not installed")


def _add(a, b):
    return a + b


def _twice(x):
    return _add(x, x)


def _toy(min_work=100):
    return Kernels(globals(), ["_add", "_twice"], min_work=min_work)


def test_below_the_threshold_the_plain_function(monkeypatch):
    monkeypatch.delenv("HCCC_JIT", raising=False)
    k = _toy()
    monkeypatch.setattr(k, "_cached", lambda: False)
    assert k.pick("_twice", 99) is _twice
    monkeypatch.setenv("HCCC_JIT", "python")
    assert k.pick("_twice", 10 ** 9) is _twice


@needs_numba
def test_from_the_threshold_the_compiled_twin_and_then_always(monkeypatch):
    monkeypatch.delenv("HCCC_JIT", raising=False)
    k = _toy()
    fast = k.pick("_twice", 100)
    assert fast is not _twice and hasattr(fast, "py_func")
    # the twin's calls reach the compiled _add (numba cannot call a plain Python function)
    assert fast(21) == 42 == _twice(21)
    assert k.pick("_twice", 1) is fast          # compiled once: every later call uses it
    monkeypatch.setenv("HCCC_JIT", "python")
    assert k.pick("_twice", 10 ** 9) is _twice  # the override still wins
    assert _twice.__globals__["_add"] is _add   # the module's own names stay plain
    # numba cached both twins beside this file: a new process's threshold is ten times lower
    again = _toy(min_work=1000)
    monkeypatch.delenv("HCCC_JIT")
    assert again._cached() and again.plain_budget() == 1000 // jit.CACHED_DIVISOR


@needs_numba
def test_small_calls_add_up_to_the_threshold(monkeypatch):
    monkeypatch.delenv("HCCC_JIT", raising=False)
    k = _toy(min_work=100)
    monkeypatch.setattr(k, "_cached", lambda: False)    # as before numba's first compile
    assert k.pick("_twice", 60) is _twice
    assert k.pick("_add", 39) is _add
    assert hasattr(k.pick("_twice", 1), "py_func")     # 60 + 39 + 1 plain work reaches 100


@needs_numba
def test_hccc_jit_numba_compiles_even_small_work(monkeypatch):
    monkeypatch.setenv("HCCC_JIT", "numba")
    assert hasattr(_toy().pick("_add", 0), "py_func")


def test_unknown_names_and_modes_are_refused(monkeypatch):
    with pytest.raises(NameError, match="_nope"):
        Kernels(globals(), ["_nope"], min_work=1)
    with pytest.raises(KeyError):
        _toy().pick("_nope", 1)
    monkeypatch.setenv("HCCC_JIT", "fast")
    with pytest.raises(ValueError, match="HCCC_JIT='fast'"):
        jit.jit_mode()


def test_compiled_for_leaves_small_work_to_the_callers_own_plain_path(monkeypatch):
    """A module with its own plain formulation asks compiled_for: None below the threshold, per
    call (small calls do not add up), and HCCC_JIT=python keeps it None whatever the work."""
    monkeypatch.delenv("HCCC_JIT", raising=False)
    monkeypatch.setattr(jit, "have_numba", lambda: True)
    k = _toy(min_work=100)
    monkeypatch.setattr(k, "compiled", lambda: {"_twice": "the compiled _twice"})
    for _ in range(3):
        assert k.compiled_for("_twice", 99) is None
    assert k.compiled_for("_twice", 100) == "the compiled _twice"
    assert k.compiled_for("_twice", 1) is None          # nor do they follow a compiled call
    monkeypatch.setenv("HCCC_JIT", "numba")
    assert k.compiled_for("_twice", 0) == "the compiled _twice"
    monkeypatch.setenv("HCCC_JIT", "python")
    assert k.compiled_for("_twice", 10 ** 9) is None
    with pytest.raises(KeyError):
        k.compiled_for("_nope", 1)


def test_compiled_for_lowers_its_threshold_only_where_the_cache_is_on_disk(monkeypatch):
    """``cached_min_work``: the threshold where numba's cache of the kernels is on disk (loading,
    not compiling); ``min_work`` where it is not, and ``min_work`` either way without it."""
    monkeypatch.delenv("HCCC_JIT", raising=False)
    monkeypatch.setattr(jit, "have_numba", lambda: True)
    k = jit.Kernels({"__name__": "toy", "_twice": _twice}, ["_twice"], min_work=100, cached_min_work=10)
    monkeypatch.setattr(k, "compiled", lambda: {"_twice": "the compiled _twice"})
    monkeypatch.setattr(k, "_cached", lambda: False)
    assert k.compiled_for("_twice", 99) is None
    assert k.compiled_for("_twice", 100) == "the compiled _twice"
    monkeypatch.setattr(k, "_cached", lambda: True)
    assert k.compiled_for("_twice", 9) is None
    assert k.compiled_for("_twice", 10) == "the compiled _twice"
    assert k.plain_budget() == 10          # one threshold where cached, for pick's plain budget too
    plain = _toy(min_work=100)
    monkeypatch.setattr(plain, "compiled", lambda: {"_twice": "the compiled _twice"})
    monkeypatch.setattr(plain, "_cached", lambda: True)
    assert plain.compiled_for("_twice", 99) is None


def test_without_numba_nothing_compiles_and_require_says_why(monkeypatch):
    monkeypatch.setenv("HCCC_JIT", "numba")
    monkeypatch.setattr(jit, "have_numba", lambda: False)
    k = _toy(min_work=1)
    assert k.compiled_for("_twice", 10 ** 9) is None
    with pytest.raises(RuntimeError, match="needs numba"):
        k.require("_twice")


def _fill(a, x):
    for i in range(a.shape[0]):
        a[i] = _add(x, i)


def _filled(n):
    a = np.zeros(n)
    _fill(a, 1.0)
    return a


def test_borrowing_kernels_are_kernels_and_not_parallel():
    Kernels(globals(), ["_add", "_fill", "_filled"], min_work=1, borrowed=["_add", "_fill"])
    with pytest.raises(NameError, match="borrowing"):
        Kernels(globals(), ["_add"], min_work=1, borrowed=["_other"])
    with pytest.raises(NameError, match="borrowing"):
        Kernels(globals(), ["_add", "_twice"], min_work=1, parallel=["_twice"], borrowed=["_twice"])


@needs_numba
def test_a_borrowing_kernel_writes_its_callers_array(monkeypatch):
    """A kernel compiled without reference counting, called from one that allocates, works on
    the caller's array; called from Python it borrows the argument's buffer too."""
    monkeypatch.setenv("HCCC_JIT", "numba")
    k = Kernels(globals(), ["_add", "_fill", "_filled"], min_work=1, borrowed=["_add", "_fill"])
    assert np.array_equal(k.pick("_filled", 1)(5), _filled(5)) and _filled(5)[4] == 5.0
    a = np.zeros(3)
    k.pick("_fill", 1)(a, 2.0)
    assert a.tolist() == [2.0, 3.0, 4.0]


def test_parallel_names_are_kernels():
    Kernels(globals(), ["_add", "_twice"], min_work=1, parallel=["_twice"])
    with pytest.raises(NameError, match="_other"):
        Kernels(globals(), ["_add"], min_work=1, parallel=["_other"])
    assert jit.prange is range          # what a parallel kernel loops over when run plain


@needs_numba
def test_compiled_for_and_require_give_the_compiled_twin(monkeypatch):
    monkeypatch.setenv("HCCC_JIT", "numba")
    k = _toy()
    fast = k.compiled_for("_twice", 0)
    assert fast is not None and hasattr(fast, "py_func") and fast(4) == 8
    monkeypatch.setenv("HCCC_JIT", "python")
    assert k.require("_twice") is fast          # an explicit request wins over the override


def test_a_bad_hccc_jit_is_a_clear_error_of_the_command_line(tmp_path):
    env = {"HCCC_JIT": "sometimes", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "hccc.cli", "check", str(ROOT / "examples" / "ring_allreduce_8.rccl")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 1
    assert "hccc: error: HCCC_JIT='sometimes': expected one of auto, python, numba" in p.stderr
    assert "Traceback" not in p.stderr


#: runs, compiled, a simulation, the step search, the tree packing (AllReduce, AllToAll, Broadcast) and
#: a check, then prints every compiled kernel's numba signatures (hccc's Kernels, found by gc)
_KERNEL_SIGNATURES = r"""
import gc, json, os, sys
from pathlib import Path
os.environ["HCCC_JIT"] = "numba"
from hccc.cli import main
from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.pipeline import load_program
from hccc.runtime.simulator import prepare, simulate
from hccc.util.jit import Kernels
root, out = Path(sys.argv[1]), Path(sys.argv[2])
clusters = root / "examples" / "clusters"
topo = load_topology(clusters / "a100_topo1.topo")
simulate(prepare(load_program(root / "examples" / "ring_allreduce_8.rccl"), topo), topo, 1 << 20, slice_bytes="auto")
for cl, coll, extra in (("a100_topo1", "allgather", ["--method", "search"]), ("a100_topo2", "allreduce", []),
                        ("a100_topo2", "alltoall", []), ("heteccl_fig10", "broadcast", [])):
    assert main(["synth", str(clusters / f"{cl}.topo"), "--collective", coll, *extra, "-o", str(out / f"{cl}_{coll}.rccl")]) == 0
assert main(["check", str(root / "examples" / "hm_allreduce_4x8.rccl")]) == 0
sigs = {}
for k in (o for o in gc.get_objects() if isinstance(o, Kernels)):
    for n, tw in (k._compiled or {}).items():
        sigs[tw.dispatcher.py_func.__module__ + "." + n] = [str(s) for s in tw.dispatcher.signatures]
print(json.dumps(sigs))
"""


@pytest.mark.slow
@needs_numba
def test_every_kernel_is_compiled_once_per_call_site_types(tmp_path):
    """numba compiles a kernel once per list of argument types, so a constant passed where a
    variable of the same kind is passed elsewhere (a literal 0, -1 or False beside an int64 or a
    bool) compiles it twice. The instant's epoch of the simulator, a literal 1 before its first
    increment, made numba compile eight of the engine's kernels twice, the sharing among them (about
    a fifth of the engine's first compile); the step search's, the max-flow's and the HPDS heap's
    small kernels were compiled two to four times. In a process of its own with an empty numba cache
    (a kernel loaded from the cache types none of the kernels it calls); slow: these are the
    kernels' whole first compiles."""
    import json
    import os
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = subprocess.run([sys.executable, "-c", _KERNEL_SIGNATURES, str(ROOT), str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    sigs = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("hccc.runtime.sim_engine.run_engine", "hccc.runtime.sim_share._share",
                 "hccc.compiler.synth.greedy._fill_steps", "hccc.compiler.synth.maxflow._bfs"):
        assert sigs.get(name), name          # the runs above compiled it
    twice = {n: s for n, s in sigs.items() if len(s) > 1}
    assert not twice, twice


# ------------------------------------------------------------- compiled twins equal the plain code
@pytest.mark.slow
@needs_numba
@pytest.mark.parametrize("algo,cluster,size", [
    ("ring_allreduce_8.rccl", "a100_topo1", 4 << 20),
    ("hm_allreduce_2x8.rccl", "a100_topo2", 1 << 20),
    ("hierarchical_alltoall_2x8.rccl", "a100_topo2", 16 << 20),
])
def test_simulator_compiled_equals_plain(monkeypatch, algo, cluster, size):
    from hccc.compiler.cluster.topo_parser import load_topology
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.simulator import prepare, simulate
    ir = load_program(ROOT / "examples" / algo)
    topo = load_topology(ROOT / "examples" / "clusters" / f"{cluster}.topo")
    prog = prepare(ir, topo)
    got = {}
    for mode in ("python", "numba"):
        monkeypatch.setenv("HCCC_JIT", mode)
        got[mode] = simulate(prog, topo, size, slice_bytes="auto", record=True)
    a, b = got["python"], got["numba"]
    assert a.time_s == b.time_s and a.events == b.events and a.stats == b.stats
    assert np.array_equal(a.tb_busy, b.tb_busy) and np.array_equal(a.tb_finish, b.tb_finish)
    assert np.array_equal(a.link_busy, b.link_busy)
    for f in ("tb", "prim", "mb", "kind", "t0", "t1"):
        assert np.array_equal(getattr(a.timeline, f), getattr(b.timeline, f))


@pytest.mark.slow
@needs_numba
@pytest.mark.parametrize("cluster,coll,cpr", [("heteccl_fig10", "allgather", 1), ("a100_topo2", "allreduce", 1),
                                              ("a100_topo1", "allgather", 40)])
def test_synthesis_compiled_equals_plain(monkeypatch, cluster, coll, cpr):
    """Equal schedules; 40 chunks per rank on 8 GPUs puts 320 chunks in a part (counts past a byte)."""
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth.collectives import synthesize
    topo = load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.topo")
    rows = {}
    for mode in ("python", "numba"):
        monkeypatch.setenv("HCCC_JIT", mode)
        rows[mode] = synthesize(topo, coll, chunks_per_rank=cpr, time_limit=60).rows
    assert np.array_equal(rows["python"], rows["numba"])


@pytest.mark.slow
@needs_numba
def test_list_schedule_compiled_equals_plain(monkeypatch):
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth.compose import list_schedule
    from hccc.compiler.synth.problem import allgather_task, network_from_topology
    net = network_from_topology(load_cluster(ROOT / "examples" / "clusters" / "a100_topo1.topo"))
    n = 8
    task = allgather_task(n)
    # a ring AllGather's transfers in priority order
    tu = np.array([r for s in range(n - 1) for r in range(n)])
    tv = (tu + 1) % n
    tk = np.array([(r - s) % n for s in range(n - 1) for r in range(n)])
    got = {}
    for mode in ("python", "numba"):
        monkeypatch.setenv("HCCC_JIT", mode)
        got[mode] = list_schedule(net, task, tu, tv, tk).step
    assert np.array_equal(got["python"], got["numba"])
    assert got["python"].tolist() == [s for s in range(n - 1) for _ in range(n)]


def _sim_case():
    from hccc.compiler.cluster.topo_parser import load_topology
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.simulator import prepare
    topo = load_topology(ROOT / "examples" / "clusters" / "a100_topo1.topo")
    return prepare(load_program(ROOT / "examples" / "ring_allreduce_8.rccl"), topo), topo


def test_a_plain_simulation_stops_when_its_budget_is_spent():
    from hccc.runtime import sim_engine as eng
    from hccc.runtime.simulator import _engine_args, geometry
    prog, _ = _sim_case()
    geo = geometry(4 << 20, prog.nchunks, 64 << 10, 4)
    args = _engine_args(prog, geo, "task", 0, 8)
    full = eng.run_engine(*args, -1, 0.0, eng.NO_STOP)
    assert full[0] == eng.STATUS_OK
    work = int(full[10][0] + full[10][2])
    assert eng.run_engine(*args, work, 0.0, eng.NO_STOP)[0] == eng.STATUS_OK
    cut = eng.run_engine(*args, work // 2, 0.0, eng.NO_STOP)
    assert cut[0] == eng.STATUS_BUDGET and work // 2 < cut[10][0] + cut[10][2] < work


@pytest.mark.parametrize("mode", ["python", pytest.param("numba", marks=needs_numba)])
def test_a_simulation_stops_at_its_deadline(monkeypatch, mode):
    """The event loop reads the clock (libc's, through ctypes in plain Python and by its symbol
    compiled): a deadline already passed stops it at its first instant, one far off changes nothing."""
    import time

    from hccc.runtime import sim_engine as eng
    from hccc.runtime.simulator import _engine_args, geometry
    if not eng.HAVE_CLOCK:
        pytest.skip("no clock_gettime on this platform")
    prog, _ = _sim_case()       # compiled before HCCC_JIT is set: the compiler's kernels stay plain
    monkeypatch.setenv("HCCC_JIT", mode)
    assert abs(eng.clock_now() - time.monotonic()) < 1.0 or eng._CLOCK_ID != time.CLOCK_MONOTONIC
    geo = geometry(4 << 20, prog.nchunks, 64 << 10, 4)
    args = _engine_args(prog, geo, "task", 0, 8)
    full = eng.run_within(None, None, *args)
    later = eng.run_within(None, clock.now() + 3600, *args)
    assert full[0] == later[0] == eng.STATUS_OK and full[1] == later[1]
    assert (full[10] == later[10]).all()
    past = eng.run_within(None, clock.now() - 1, *args)
    assert past[0] == eng.STATUS_BUDGET and past[10][3] == 0     # no instant run


@pytest.mark.parametrize("mode", ["python", pytest.param("numba", marks=needs_numba)])
def test_a_simulation_stops_when_another_thread_turns_its_stop_switch(monkeypatch, mode):
    """A switch turned before the run stops it at its first instant; one turned by another thread
    while it runs stops it there (:class:`StopSwitch`, looked at every ``CLOCK_EVERY`` instants),
    with :class:`SimulationStopped` and less work than the run's least; an untouched one changes
    nothing, and a plain run stopped so is not rerun compiled."""
    import threading

    from hccc.runtime import sim_engine as eng
    from hccc.runtime.simulator import SimulationStopped, StopSwitch, simulate
    prog, topo = _sim_case()
    monkeypatch.setenv("HCCC_JIT", mode)
    small = 4 << 20
    whole = simulate(prog, topo, small, slice_bytes=4096)
    untouched = simulate(prog, topo, small, slice_bytes=4096, stop=StopSwitch())
    assert (untouched.time_s, untouched.events) == (whole.time_s, whole.events)
    turned = StopSwitch()
    turned.turn()
    with pytest.raises(SimulationStopped) as before:
        simulate(prog, topo, small, slice_bytes=4096, stop=turned)
    assert before.value.work == 0 and turned.turned
    sends = int(np.count_nonzero(prog.p_flags & eng.F_SEND))
    if mode == "python":
        # the loop itself starts the thread that turns the switch: deterministic
        switch, real = StopSwitch(), eng._event_loop

        def watched(*a):
            started = threading.Event()
            threading.Thread(target=lambda: (started.wait(), switch.turn())).start()
            started.set()
            return real(*a)

        monkeypatch.setattr(eng, "_event_loop", watched)
        monkeypatch.setattr(eng.KERNELS, "plain_budget", lambda: 10 ** 9)      # plain, with a compiled rerun
        monkeypatch.setattr(eng.KERNELS, "compiled", lambda: pytest.fail("a stopped plain run was rerun"))
        with pytest.raises(SimulationStopped) as during:
            simulate(prog, topo, 64 << 20, slice_bytes=4096, stop=switch)
        assert during.value.work < sends * (64 << 20) // (prog.nchunks * 4096)
        return
    # compiled: a timer turns it while the loop runs (a larger call where the timer came too late)
    for nbytes in (64 << 20, 256 << 20, 1 << 30):
        switch = StopSwitch()
        timer = threading.Timer(0.01, switch.turn)
        timer.start()
        try:
            simulate(prog, topo, nbytes, slice_bytes=4096, stop=switch)
        except SimulationStopped as exc:
            assert exc.work < sends * nbytes // (prog.nchunks * 4096)      # the run's least work
            return
        finally:
            timer.join()
    pytest.fail("no run outlasted a timer of 10 ms")


@pytest.mark.slow
@needs_numba
def test_simulations_past_the_budget_rerun_compiled(monkeypatch):
    from hccc.runtime import sim_engine as eng
    from hccc.runtime.simulator import simulate
    prog, topo = _sim_case()
    monkeypatch.setenv("HCCC_JIT", "python")
    want = [simulate(prog, topo, s, slice_bytes="auto") for s in (1 << 20, 16 << 20)]
    monkeypatch.delenv("HCCC_JIT")
    fresh = Kernels(vars(eng), eng.KERNELS._names, min_work=want[0].events + 10)
    monkeypatch.setattr(eng, "KERNELS", fresh)
    got = [simulate(prog, topo, s, slice_bytes="auto") for s in (1 << 20, 16 << 20)]
    assert fresh._compiled is not None          # the second call ran out of plain work
    assert [(r.time_s, r.events) for r in got] == [(r.time_s, r.events) for r in want]


@needs_numba
def test_a_simulation_that_cannot_finish_plain_runs_compiled_at_once(monkeypatch):
    """A run whose least work (an event per sending primitive and micro-batch) reaches what plain
    runs have left is not started plain: no plain work is spent, and the compiled run gives the
    plain engine's result."""
    from hccc.runtime import sim_engine as eng
    from hccc.runtime.simulator import _engine_args, geometry
    prog, _ = _sim_case()
    geo = geometry(16 << 20, prog.nchunks, 64 << 10, 4)
    args = _engine_args(prog, geo, "task", 0, 8)
    want = eng.run_engine(*args, -1, 0.0, eng.NO_STOP)
    least = int(np.count_nonzero(prog.p_flags & eng.F_SEND)) * geo.nmb
    monkeypatch.delenv("HCCC_JIT", raising=False)
    fresh = Kernels(vars(eng), eng.KERNELS._names, min_work=least)
    monkeypatch.setattr(eng, "KERNELS", fresh)
    got = eng.run_within(None, None, *args)
    assert fresh._plain_work == 0 and fresh._compiled is not None
    assert got[1] == want[1] and (got[10] == want[10]).all()


_ONE_COMPILE = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import toy_kernels as t
start = float(sys.argv[2])
while time.time() < start:          # both processes call at once
    time.sleep(0.001)
fn = t.KERNELS.compiled()["toy_sum"]
assert fn(t.np.arange(10.0)) == 45.0
print(sum(fn.dispatcher.stats.cache_misses.values()), sum(fn.dispatcher.stats.cache_hits.values()))
"""

_TOY_MODULE = """
import numpy as np
from hccc.util.jit import Kernels


def toy_sum(x):
    s = 0.0
    for i in range(len(x)):
        for j in range(3):
            s += x[i] * (1 if j == 0 else 0)
    return s


KERNELS = Kernels(globals(), ["toy_sum"], min_work=1)
"""


@needs_numba
def test_processes_starting_together_compile_a_kernel_once(tmp_path):
    """Two processes whose first call of a kernel comes at the same moment (a fresh numba cache):
    one compiles it, the other waits for it and loads what it wrote (numba's own counters: one
    cache miss in all, one hit). Without the compile lock both compiled it."""
    import os
    import time
    (tmp_path / "toy_kernels.py").write_text(_TOY_MODULE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "HCCC_JIT": "numba"}
    start = f"{time.time() + 1.5:.3f}"          # after both have imported numba and hccc
    procs = [subprocess.Popen([sys.executable, "-c", _ONE_COMPILE, str(tmp_path), start], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    counts = [tuple(map(int, o.split())) for o, _ in outs]
    assert sorted(counts) == [(0, 1), (1, 0)], counts


_CACHED_AFTER = """
import sys
sys.path.insert(0, sys.argv[1])
import toy_kernels as t
before = t.KERNELS._cached()
assert t.KERNELS.compiled()["toy_sum"](t.np.arange(4.0)) == 6.0
print(before, sum(t.KERNELS.compiled()["toy_sum"].dispatcher.stats.cache_misses.values()))
"""


@needs_numba
def test_a_cache_in_numba_cache_dir_counts_as_cached(tmp_path):
    """With NUMBA_CACHE_DIR set numba writes its cache there, not beside the source: a process
    after the one that compiled (numba's own cache miss counter says it compiled) finds the
    kernels cached, and one with another, empty NUMBA_CACHE_DIR does not (the threshold was not
    lowered under NUMBA_CACHE_DIR before: the lookup only knew ``__pycache__``)."""
    import os
    (tmp_path / "toy_kernels.py").write_text(_TOY_MODULE)

    def compile_in_a_process(cache):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / cache)}
        env.pop("HCCC_JIT", None)
        r = subprocess.run([sys.executable, "-c", _CACHED_AFTER, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    def look(cache):
        """What a later process's lookup finds (a file lookup that reads NUMBA_CACHE_DIR when
        asked, without numba: this process, with the module loaded afresh, does as one would)."""
        import importlib.util
        spec = importlib.util.spec_from_file_location(f"toy_kernels_{cache}", tmp_path / "toy_kernels.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("NUMBA_CACHE_DIR", str(tmp_path / cache))
            return mod.KERNELS._cached()

    assert compile_in_a_process("a") == ["False", "1"]
    assert look("a") is True
    assert look("b") is False
    assert not (tmp_path / "__pycache__").exists() or not list((tmp_path / "__pycache__").glob("*.nbi"))


_CALLER_MODULE = """
import numpy as np
from hccc.util.jit import Kernels
from toy_callee import toy_step


def toy_total(x):
    s = 0.0
    for i in range(len(x)):
        s += toy_step(x[i])
    return s


KERNELS = Kernels(globals(), ["toy_total", "toy_step"], min_work=1)
"""

_CALL_TOTAL = """
import sys
sys.path.insert(0, sys.argv[1])
import toy_caller as t
print(t.KERNELS.compiled()["toy_total"](t.np.arange(4.0)))
"""


@needs_numba
def test_a_cached_kernel_is_compiled_again_when_a_kernel_it_calls_changes(tmp_path):
    """A twin carries the code of the twins it calls, from other files too (the event loop carries
    ``runtime/sim_share.py``), but numba checks only its own file against its cache: a process
    after the callee's file changed ran the caller's cached code with the old callee inlined.
    The cache is keyed by every file of the set (:func:`hccc.util.jit._sources_tag`), and the
    entries of older sources are removed when the set compiles (``Kernels._drop_older_caches``)."""
    import os
    (tmp_path / "toy_caller.py").write_text(_CALLER_MODULE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HCCC_JIT", None)

    def total(step: str) -> float:
        (tmp_path / "toy_callee.py").write_text(f"def toy_step(v):\n    return {step}\n")
        r = subprocess.run([sys.executable, "-c", _CALL_TOTAL, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return float(r.stdout)

    def cached() -> set[str]:
        """The caller's cache index files (numba's, under NUMBA_CACHE_DIR)."""
        return {p.name for p in (tmp_path / "cache").rglob("toy_caller.toy_total*.nbi")}

    assert total("v") == 6.0           # compiled, and cached
    first = cached()
    assert total("2.0 * v") == 12.0    # the caller's file unchanged, its callee's not
    # the entry of the older sources is gone: one entry per kernel and line, not one per version
    assert len(first) == 1 and len(cached()) == 1 and cached() != first


class _FakeDispatcher:
    """Stands in for a numba dispatcher whose cache lives in ``where``: it records the signature
    it was compiled for, and on each call whether the compile lock file was free then."""

    def __init__(self, where):
        import types
        self._cache = types.SimpleNamespace(_cache_path=str(where))
        self.py_func = types.SimpleNamespace(__qualname__="fake_kernel")
        self.compiled_for = []
        self.lock_free_in_call = []

    def compile(self, sig):
        self.compiled_for.append(sig)

    def __call__(self, *args):
        import fcntl
        import os
        fd = os.open(os.path.join(self._cache._cache_path, "fake_kernel.hccc-lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.lock_free_in_call.append(True)
        except OSError:
            self.lock_free_in_call.append(False)
        finally:
            os.close(fd)
        return sum(args)


@needs_numba
def test_the_compile_lock_is_held_for_the_compile_not_the_run(tmp_path):
    """A kernel's first call compiles it for the call's argument types under the lock, then runs
    it with the lock released, so that threads of one process running a kernel side by side (the
    simulator's periodic samples) wait for its load, not for each other's work. Before, the whole
    first call ran under the lock (the call found the lock held)."""
    from hccc.util.jit import _OneCompiler
    fake = _FakeDispatcher(tmp_path)
    kernel = _OneCompiler(fake)
    assert kernel(1, 2) == 3 and kernel(3, 4) == 7
    assert len(fake.compiled_for) == 1 and len(fake.compiled_for[0]) == 2     # once, for both arguments
    assert fake.lock_free_in_call == [True, True]
