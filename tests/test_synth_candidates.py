"""``hccc synth`` writes the fastest program it could have written: every candidate (the tree
packing, the step search, hccc's generators that fit the cluster) is scored in the simulator at
the size asked and the fastest kept (``driver/synth_select.py``, ``compiler/synth/classic.py``).

The oracle here is independent of the selection: the test builds each generator's program itself
(:mod:`hccc.compiler.frontend.generators`, kept where the cluster links every pair it uses),
compiles it with ``hccc.build_program`` and times it with ``hccc.simulate``'s simulator at the
channel counts hccc may give it, the best of them; the written program is timed the same way at
the channels its header says. The written program must be within 2 % of every such time.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.synth.selection import SelectionLoop
from hccc.compiler.pipeline import load_cluster
from hccc.synth_api import synthesize_program

from synth_oracles import clusters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import synth_candidates as bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "examples" / "clusters"
#: the written program against the best candidate: at most this ratio (the issue's 1.02)
TOLERANCE = bench.TOLERANCE
#: the channel counts the oracle tries a generator's program at (the best kept)
ORACLE_CHANNELS = bench.CHANNELS


def _time(alg, topo, nbytes: int, channels: int) -> float:
    return bench._time(alg, topo, nbytes, channels)


def _generators(topo, collective: str) -> dict:
    """Every generator's program of ``collective`` whose shape fits ``topo`` and whose pairs it
    links, by name: listed from the generators' own module (benchmarks/synth_candidates.py, the
    guarantee's table), not from the selection's."""
    return bench.generators(topo, collective)


def _check_never_worse(topo, collective: str, nbytes: int, time_limit: float = 60.0):
    prog = synthesize_program(topo, collective, sizes=(nbytes,), time_limit=time_limit)
    s = prog.summary
    scored = {c["candidate"] for c in s["selection"]["candidates"] if c["fraction_of_bound"] is not None}
    written = _time(prog.algorithm, topo, nbytes, prog.algorithm.header.nchannels)
    best = {name: min(_time(alg, topo, nbytes, c) for c in ORACLE_CHANNELS)
            for name, alg in _generators(topo, collective).items()}
    for name, t in best.items():
        assert written <= t * TOLERANCE, (f"{collective} at {nbytes} B: the written {s['method']} program takes "
                                          f"{written * 1e6:.2f} us, the {name} generator {t * 1e6:.2f} us")
    assert set(best) <= scored, ("the time limit bound: a generator's program was not scored", best, scored)
    return prog, written, best


@pytest.mark.slow     # (the longest of the README's command: in the slow set)
def test_size_64k_on_four_a100_nodes_is_never_worse_than_the_trees_or_the_generators(tmp_path, capsys):
    """The issue's case: four 8-GPU A100 nodes, AllReduce at 64 KiB. ``auto`` took the step search
    alone, which ran into the limit and wrote a program of 32.2 us where the tree packing makes one
    of 12.7 us in 1.6 s and the shipped hm_allreduce_4x8 takes 22.2 us. Now every one of them is
    a candidate: the written program is within 2 % of each generator's best time, no slower than
    the tree program, and the report names the runner-up with its ratio."""
    topo = load_cluster(CLUSTERS / "a100_topo4.topo")
    prog, written, best = _check_never_worse(topo, "allreduce", 64 << 10, time_limit=30.0)
    sel = prog.summary["selection"]
    rows = {c["candidate"]: c for c in sel["candidates"]}
    assert rows["trees"]["fraction_of_bound"] is not None
    assert prog.summary["fraction_of_bound"] >= rows["trees"]["fraction_of_bound"]
    assert sel["kept"] == prog.summary["method"]
    run = sel["runner_up"]
    assert run is not None and run["candidate"] != sel["kept"] and run["ratio"] >= 1.0
    others = [c["ratio"] for c in sel["candidates"] if c["ratio"] is not None and c["candidate"] != sel["kept"]]
    assert run["ratio"] == pytest.approx(min(others))
    assert f"runner-up: {run['candidate']}, {run['ratio']:.3f}x its time" in prog.text
    # and in ``hccc sim`` itself (the user's measure): no slower than the shipped hm_allreduce_4x8
    out = tmp_path / "ar.rccl"
    out.write_text(prog.text)
    assert main(["sim", str(out), str(ROOT / "examples" / "hm_allreduce_4x8.rccl"), "--topology",
                 str(CLUSTERS / "a100_topo4.topo"), "--sizes", "64K", "--json"]) == 0
    mine, hm = (r["results"][0]["time_us"] for r in json.loads(capsys.readouterr().out)["runs"])
    assert mine <= hm * TOLERANCE, (mine, hm)


def test_the_same_request_writes_the_same_bytes():
    """Every candidate is timed by the simulator (deterministic) and the search beside them is
    greedy (bounded by its own work): the same request writes the same program."""
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    first, again = (synthesize_program(topo, "allreduce", sizes=(64 << 10,), time_limit=60.0) for _ in range(2))
    assert first.text == again.text and first.summary["selection"]["kept"] == again.summary["selection"]["kept"]


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "alltoall"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=clusters(), size=st.sampled_from([4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30]))
def test_the_written_program_is_never_worse_than_a_generator(collective, topo, size):
    """On small random clusters (2-3 nodes, random intra-node links, shared NICs) and at the
    sizes of the default band, the written program is within 2 % of every generator that fits,
    each timed by the test itself at its best channel count."""
    _check_never_worse(topo, collective, size)


@pytest.mark.parametrize("size", [4 << 10, 64 << 10, 1 << 20, 64 << 20, 1 << 30])
def test_a_shipped_cluster_across_the_band(size):
    """heteccl_fig10 (HeteCCL's two unlike nodes, six GPUs), AllReduce at every size of the band:
    within 2 % of every generator that fits (the hierarchical one does not: the nodes differ)."""
    _check_never_worse(load_cluster(CLUSTERS / "heteccl_fig10.topo"), "allreduce", size)


def test_the_report_adds_up_and_names_the_runner_up(tmp_path, capsys):
    """``hccc synth``'s report: the wall time from its start in parts that add up to it (numba's
    compiling among them where it ran), and the selection's candidates with the seconds each
    took, which with the rest of the selection add up to its time; the runner-up said on stdout."""
    out = tmp_path / "ag.rccl"
    assert main(["synth", str(CLUSTERS / "v100_4x3.topo"), "--collective", "allgather", "--size", "64K",
                 "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    took = s["command_seconds"]
    parts = sum(v for k, v in took.items() if k != "total")
    assert parts == pytest.approx(took["total"], abs=0.01 * len(took))
    phases = s["phase_seconds"]
    cands = {k: v for k, v in phases.items() if k.startswith("candidate ")}
    assert cands and {k.removeprefix("candidate ") for k in cands} == \
        {c["candidate"] for c in s["selection"]["candidates"]}
    assert sum(cands.values()) + phases["selection other"] == pytest.approx(phases["search"], abs=0.01 * len(cands))
    # the synthesis part: the default program (made first, a candidate at 64K), then the size's
    # selection, proof and text; what is left is the options' checks (well under a second)
    inner = phases["default program"] + phases["search"] + phases["proof"] + phases["text"]
    assert phases["default program"] > 0 and inner <= took["synthesis"] + 0.01 < inner + 1.0, (phases, took)
    assert main(["synth", str(CLUSTERS / "v100_4x3.topo"), "--collective", "allgather", "--size", "64K",
                 "-o", str(out)]) == 0
    cap = capsys.readouterr()
    run = s["selection"]["runner_up"]
    assert f"runner-up {run['candidate']} at {run['ratio']:.3f}x its time" in cap.out
    assert "candidate " in cap.err and "s from the command's start" in cap.err
    assert "before it, the default program (a candidate)" in cap.err


class _Jobs(SelectionLoop):
    """A loop over jobs ``(name, cost, children)``: a step spends ``cost`` units of a budget and
    queues its children next; a job runs while its cost fits in what is left."""

    def __init__(self, jobs, budget):
        super().__init__(jobs, deadline=0.0)
        self.left, self.ran, self.not_run = budget, [], None

    def affordable(self, job) -> bool:
        return job[1] <= self.left

    def step(self, job) -> None:
        self.left -= job[1]
        self.ran.append(job[0])
        self.candidates.append(job[0])
        self.queue.extendleft(reversed(job[2]))

    def cut(self, not_run: int, total: int) -> None:
        self.not_run = ([j[0] for j in self.queue], not_run, total)


_job = st.deferred(lambda: st.tuples(st.text("abc", min_size=1, max_size=2), st.integers(0, 5),
                                     st.lists(_job, max_size=2)))


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(_job, min_size=1, max_size=4), budget=st.integers(0, 12))
def test_the_selection_loop_runs_jobs_in_turn_while_affordable(jobs, budget):
    """Synthesis's one selection loop (the tree packing's and ``hccc synth``'s): the first job
    always, then each in queue order (a step's own jobs next) while affordable; the first one that
    is not ends the loop, and it and every job queued after it are the jobs not run (their own
    jobs never queued). Oracle: the same walk written as plain recursion over the job tree."""
    want, left, rest = [], budget, []

    def walk(js, first):
        nonlocal left
        for i, (name, cost, children) in enumerate(js):
            if rest or (not first[0] and cost > left):
                rest.append(name)           # queued, not run: its own jobs never queued
                continue
            first[0] = False
            left -= cost
            want.append(name)
            walk(children, first)

    walk(jobs, [True])
    loop = _Jobs(jobs, budget)
    assert loop.run() == want and loop.ran == want
    if rest:
        names, not_run, total = loop.not_run
        assert names == rest and not_run == len(rest) and total == len(want) + len(rest)
    else:
        assert loop.not_run is None


def test_candidates_the_deadline_leaves_are_listed_not_waited_on(monkeypatch):
    """Where the time left affords no further job, the first candidate is written and every other
    is listed with why it was not made or simulated (the report), none waited on."""
    import hccc.synth_select as sel

    monkeypatch.setattr(sel._Choices, "affordable", lambda self, job: False)
    topo = load_cluster(CLUSTERS / "v100_4x3.topo")
    prog = synthesize_program(topo, "allgather", sizes=(64 << 10,), time_limit=30.0)
    s = prog.summary["selection"]
    rows = s["candidates"]
    assert rows[0]["candidate"] == "trees" and rows[0]["fraction_of_bound"] is not None
    assert s["kept"] == "trees" and s["runner_up"] is None
    assert [r["dropped"] for r in rows[1:]] and all(r["dropped"] == "not made: time limit" for r in rows[1:])
    assert {r["candidate"] for r in rows[1:]} == {"classics", "default", "search"} == set(s["time_limit_cut"])
    assert "# time limit: candidates not made or not simulated: " in prog.text
