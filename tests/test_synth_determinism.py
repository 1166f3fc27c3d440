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


def _pod64():
    """benchmarks/synth_scale.py's 64 heterogeneous V100s: its AllGather's rounding needs the MILP
    (2 chunks per rank: the largest remainders and the regrowing miss the LP there)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from synth_scale import POD64, scaled_cluster

    return scaled_cluster(POD64, "v100", "pod64")


@pytest.mark.slow          # a 64-GPU packing, twice (about 3 s each)
def test_a_rounding_the_clock_ended_is_said_and_one_its_node_limit_ended_is_not():
    """The rounding's integer program is ended by its node limit (the same on every machine) unless
    its seconds guard ends it first: the packing lists the chunk counts whose rounding the clock
    ended, and none where the guard is left its default room."""
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth import rounding
    from hccc.compiler.synth import trees as tr
    from hccc.compiler.synth.packing import PackOptions

    net = network_from_topology(_pod64())
    calls = []
    real = rounding._milp_counts

    def counted(*a, **k):
        calls.append(a[3])
        return real(*a, **k)

    import unittest.mock
    with unittest.mock.patch.object(rounding, "_milp_counts", counted):
        free = tr.pack_trees(net)
    assert calls, "the example needs the MILP"
    assert "rounding_stopped_by_clock" not in free.stats
    starved = tr.pack_trees(net, options=PackOptions(round_milp_each=0.0))
    assert set(starved.stats["rounding_stopped_by_clock"]) >= {k for k in calls if k <= starved.chunks_per_rank}


def test_the_report_says_where_the_clock_ended_a_rounding(monkeypatch):
    """A packing whose rounding the clock ended puts it in ``time_limit_cut`` (the report's "time
    limit:" line), once per packing and count, and the program is marked as cut."""
    from hccc.compiler.synth import forest
    from hccc.compiler.synth.packing import Packing

    cut: list = []
    setting = forest._Setting.__new__(forest._Setting)
    setting.cut_by_limit = cut
    p = Packing(2, 2, [0, 1], [], [2, 2], 1.0, 1.0, 1.0, 1, 2, 0.0, stats={"rounding_stopped_by_clock": [2, 3]})
    setting.clock_cut(p, "AllGather")
    setting.clock_cut(p, "AllGather")
    assert cut == ["AllGather rounding to 2, 3 chunks per rank stopped by the clock before its node limit"]
    setting.clock_cut(Packing(2, 1, [0, 1], [], [1, 1], 1.0, 1.0, 1.0, 1, 2, 0.0), "ReduceScatter")
    assert len(cut) == 1


def test_an_integral_packing_the_clock_ended_is_said(monkeypatch):
    """Two MI250 nodes at 3 chunks per rank seek integral trees (the LP's round to 0.904 of the
    optimum): with no seconds for them (:data:`.branchings.SECONDS` spent) the packing is the
    LP's trees rounded, and it says the clock ended that count; with the default guard it holds
    the integral trees and says nothing."""
    from synth_oracles import mi250
    from hccc.compiler.synth import branchings as br
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth import trees as tr

    net = network_from_topology(mi250(2))
    free = tr.pack_trees(net, min_chunks=3, max_chunks=3)
    assert free.stats.get("integral") and "rounding_stopped_by_clock" not in free.stats
    monkeypatch.setattr(br, "SECONDS", 0.0)
    starved = tr.pack_trees(net, min_chunks=3, max_chunks=3)
    assert not starved.stats.get("integral") and starved.stats["rounding_stopped_by_clock"] == [3]


def test_a_candidate_made_short_by_the_limit_is_reported_though_another_is_kept():
    """The limit may cut short the making of a candidate that is then not kept (the tree packing
    under load losing its one-chunk packing, hm kept instead): the selection's ``time_limit_cut``
    names it, so the report says the limit bound, as it does for candidates not made at all."""
    from types import SimpleNamespace

    from hccc.synth_select import Choice, _selection_report

    kept = SimpleNamespace(detail={})
    short = SimpleNamespace(detail={"time_limit_cut": ["one-chunk packing skipped"]})
    whole = SimpleNamespace(detail={})
    choices = [Choice("trees", short, 0.80), Choice("hm", kept, 0.85), Choice("ring", whole, 0.5)]
    rep = _selection_report(choices, kept, 0.85)
    assert rep["time_limit_cut"] == ["trees (made short: one-chunk packing skipped)"]
    # nothing cut: nothing said
    assert _selection_report([Choice("trees", whole, 0.8), Choice("hm", kept, 0.85)], kept, 0.85)["time_limit_cut"] == []
