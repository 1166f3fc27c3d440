"""util/clock.py: the work clock stands still while numba compiles, so a time limit cuts the same
work on a cold numba cache as on a warm one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hccc.util import clock
from hccc.util import jit

from synth_oracles import MEASURED_UNITS_LEAST

ROOT = Path(__file__).resolve().parent.parent
needs_numba = pytest.mark.skipif(not jit.have_numba(), reason="numba is not installed")


def test_a_compile_stops_the_work_clock_once_however_nested():
    before_now, before_c = clock.now(), clock.compile_seconds()
    w0 = time.perf_counter()
    clock._begin()                  # what numba's "numba:compile" events call
    time.sleep(0.05)
    clock._begin()                  # a callee compiled while its caller is typed
    time.sleep(0.05)
    assert clock.now() - before_now < 0.02          # standing still mid-compile
    clock._end()
    time.sleep(0.05)
    clock._end()
    wall = time.perf_counter() - w0
    spent = clock.compile_seconds() - before_c
    assert 0.15 <= spent <= wall + 1e-6             # counted once, not 0.05 more for the nesting
    time.sleep(0.05)
    after = clock.now() - before_now
    assert 0.05 <= after < 0.05 + (wall - spent) + 0.02   # running again, less the compile


def test_the_work_clock_never_runs_backwards():
    seen = [clock.now()]
    for _ in range(3):
        clock._begin()
        seen.append(clock.now())
        clock._end()
        seen.append(clock.now())
    assert seen == sorted(seen)


KERNEL_MODULE = textwrap.dedent('''
    import time
    from hccc.util import clock
    from hccc.util.jit import Kernels

    def _inner(x):
        s = 0
        for i in range(x):
            s += i * i % 7
        return s

    def outer(x):
        return _inner(x) + _inner(x + 1)

    KERNELS = Kernels(globals(), ["_inner", "outer"], min_work=1)

    def main():
        fn = KERNELS.require("outer")
        w0, n0 = time.perf_counter(), clock.now()
        assert fn(1000) == outer(1000)
        print(time.perf_counter() - w0, clock.now() - n0, clock.compile_seconds())
''')


@needs_numba
def test_numbas_compiles_are_what_the_work_clock_leaves_out(tmp_path):
    (tmp_path / "toy_kernels.py").write_text(KERNEL_MODULE)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import toy_kernels; toy_kernels.main()"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    wall, work, compiled = map(float, out.stdout.split())
    assert compiled > 0.05                  # numba compiled both kernels (a fresh cache)
    assert compiled <= wall + 1e-3          # the nested compile of _inner counted once
    assert abs((wall - work) - compiled) < 0.05
    # the same process again loads the cache: nothing compiled, the clocks agree
    again = subprocess.run([sys.executable, "-c", "import toy_kernels; toy_kernels.main()"], env=env,
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    wall, work, compiled = map(float, again.stdout.split())
    assert compiled == 0.0 and work == pytest.approx(wall, abs=0.01)


LIMIT_S = 20


@needs_numba
@pytest.mark.slow
def test_a_cold_numba_cache_changes_nothing_synth_decides(tmp_path):
    """Every kernel compiled from scratch (a fresh numba cache, ``HCCC_JIT=numba``: 30-40 s of
    compiling) under a 20 s time limit that the work itself fits (about 2 s alone, 3 s beside two
    busy processes, more beside the suite's multi-process tests): the packing, the candidates and
    the simulations all run, and the program is the one a warm cache writes. (Before the work
    clock, at 5 s: timed out, 2 of 3 candidates not built, nothing simulated.)"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "HCCC_JIT": "numba"}
    runs = []
    for name in ("cold", "warm"):
        out = tmp_path / f"{name}.rccl"
        w0 = time.perf_counter()
        got = subprocess.run([sys.executable, "-m", "hccc", "synth", str(ROOT / "examples/clusters/a100_topo1.topo"),
                              "--collective", "allgather", "--method", "trees", "--time-limit", str(LIMIT_S),
                              "-o", str(out), "--json"], env=env, capture_output=True, text=True, timeout=600)
        assert got.returncode == 0, got.stderr
        if name == "cold":
            assert time.perf_counter() - w0 > LIMIT_S      # compiling took longer than the limit
        summary = json.loads(got.stdout)
        assert not summary["timed_out"] and summary["time_limit_cut"] == [], (name, summary)
        assert summary["fraction_of_bound"] > MEASURED_UNITS_LEAST   # (the simulator charges units)
        runs.append([line for line in out.read_text().splitlines() if not line.startswith("# synthesis time:")])
    assert runs[0] == runs[1]
