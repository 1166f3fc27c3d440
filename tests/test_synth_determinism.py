"""The same ``hccc synth`` command writes the same bytes on an idle machine and on a loaded one.

Synthesis budgets are counted in work (LP iterations and branch-and-bound nodes, z3 resource
limits, simulated events) and ``--time-limit`` is only the user's cap: where it does not bind, what
the command writes cannot depend on how fast the machine ran. Each case runs the command twice in
fresh processes, once alone and once beside busy processes that take every core, and compares
the ``.rccl`` bytes; the report of both runs says the limit cut nothing (else the comparison would
prove nothing)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTERS = REPO / "examples" / "clusters"

#: busy processes beside the loaded run: more than this machine's cores, so that the command
#: gets a fraction of a core (its phases take several times as long in wall-clock seconds)
HOGS = max(2, 2 * (os.cpu_count() or 1))


@contextlib.contextmanager
def _cpu_hogs(n: int = HOGS):
    """``n`` processes spinning on the CPU for as long as the block runs (each ended by its own
    handle when it leaves)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _synth(tmp_path: Path, name: str, args: list[str]) -> tuple[bytes, dict]:
    out = tmp_path / f"{name}.rccl"
    got = subprocess.run([sys.executable, "-m", "hccc", "synth", *args, "-o", str(out), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr
    return out.read_bytes(), json.loads(got.stdout)


CASES = {
    # tree packing: LP rounds, rounding MILPs by node counts, simulated candidates
    "trees-allgather": [str(CLUSTERS / "v100_4_8.topo"), "--collective", "allgather"],
    "trees-allreduce": [str(CLUSTERS / "v100_4_8.topo"), "--collective", "allreduce"],
    # the step search: greedy variants, z3 repairs and windows under rlimit
    "search-allgather": [str(CLUSTERS / "v100_4_8.topo"), "--collective", "allgather", "--method", "search"],
}


@pytest.mark.slow          # four to six processes of 5-20 s each on a loaded 2-core machine
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bytes_alone_and_under_load(tmp_path, case):
    args = CASES[case]
    alone, rep_alone = _synth(tmp_path, "alone", args)
    with _cpu_hogs():
        loaded, rep_loaded = _synth(tmp_path, "loaded", args)
    for rep in (rep_alone, rep_loaded):
        assert not rep["timed_out"] and not rep.get("time_limit_cut"), rep
    assert alone == loaded, f"{case}: the loaded run wrote other bytes ({len(alone)} vs {len(loaded)})"


def test_cpu_hogs_take_the_cpu():
    """The load is real: a process beside the hogs gets less CPU per wall-clock second than alone
    (so the comparison above runs the command slowed down, not beside idle processes)."""
    import time

    def cpu_share(seconds: float = 0.6) -> float:
        w0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds:
            pass
        return (time.process_time() - c0) / (time.perf_counter() - w0)

    with _cpu_hogs():
        time.sleep(0.2)
        loaded = cpu_share()
    alone = cpu_share()
    assert loaded < 0.9 * alone or loaded < 0.6, (loaded, alone)
