"""The selection's evaluator (``driver/synth_select.py``, :class:`Simulations`): a simulation run
ahead of the selection (:meth:`Simulations.prefetch`, :meth:`Simulations.run_ahead`) is the very
one the selection would have run; and an AllReduce's tree synthesis that starts its selection on
the joint packing, simulating its first program while another thread packs the halves
(``forest._joint_first``, ``forest._Later``), writes what the usual order writes, restart
included (``forest._Restart``)."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.pipeline import load_cluster
from hccc.compiler.synth import forest, network_from_topology
from hccc.compiler.synth.plan import SynthOptions
from hccc.synth_select import Simulations, synthesize_programs, tree_simulated_score
from hccc.util import clock

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _program_text(topo, ahead: bool, collective: str = "allreduce", size: int = 1 << 30) -> tuple[str, list]:
    """The text ``hccc synth --method trees`` writes for ``collective`` chosen at ``size``, and the
    evaluators it made (``Simulations(ahead=ahead)``)."""
    made: list = []

    def evaluator(t, nbytes, deadline):
        made.append(Simulations(t, nbytes, deadline, ahead=ahead))
        return made[-1]

    prog, = synthesize_programs(topo, SynthOptions(collective, method="trees", time_limit=120.0, select_size=size),
                                evaluator=evaluator)
    return prog.text, made


# h20_4_8 and v100_4_8: the joint packing beats the halves' cut bounds together, so its program
# is simulated ahead; h20_4x3: it does not, and the halves are packed before the selection
@pytest.mark.parametrize("name, ahead", [("h20_4_8", True), ("v100_4_8", True), ("h20_4x3", False)])
def test_an_allreduce_simulated_ahead_writes_what_it_writes_without(name, ahead):
    topo = load_cluster(CLUSTERS / f"{name}.topo")
    text, made = _program_text(topo, ahead=True)
    plain, plain_made = _program_text(topo, ahead=False)
    assert text == plain
    assert sum(m.prefetched for m in made) == int(ahead)
    assert sum(m.prefetched for m in plain_made) == 0


def test_the_first_score_is_simulated_ahead_while_another_thread_packs_the_halves(monkeypatch):
    """The selection starts on the joint packing: its first score's program is prepared, simulated
    on this thread while another packs the halves, and then scored from that simulation (none of
    its own)."""
    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    net = network_from_topology(topo)
    sims = Simulations(topo, 1 << 30, clock.now() + 120)
    score = tree_simulated_score(sims)
    prefetched, scored, threads = [], [], {}
    prefetch, run_ahead = score.prefetch, score.run_ahead

    def spy_prefetch(*args):
        prefetched.append(args)
        prefetch(*args)

    def spy_run_ahead():
        threads["simulated"] = threading.current_thread()
        run_ahead()

    def spy_score(*args):
        scored.append(args)
        return score(*args)

    spy_score.settled, spy_score.prefetch, spy_score.run_ahead = score.settled, spy_prefetch, spy_run_ahead
    halves = forest._pack_halves

    def spy_halves(*args, **kw):
        threads["halves"] = threading.current_thread()
        return halves(*args, **kw)

    monkeypatch.setattr(forest, "_pack_halves", spy_halves)
    simulated = []
    real = sims._record
    monkeypatch.setattr(sims, "_record", lambda tkey, timing: simulated.append(timing._out is not None) or
                        real(tkey, timing))
    forest.synthesize_trees(net, "allreduce", score=spy_score, time_limit=120.0)
    assert len(prefetched) == 1 and scored
    (c0, rows0, k0, ch0, w0), (c1, rows1, k1, ch1, w1) = prefetched[0], scored[0]
    assert (c0, k0, ch0, w0) == (c1, k1, ch1, w1) and np.array_equal(rows0, rows1)
    assert simulated[0]                    # the first score took the simulation run ahead
    assert threads["simulated"] is threading.main_thread() and threads["halves"] is not threads["simulated"]


def test_a_simulation_run_ahead_gives_the_time_a_score_would_and_runs_once(monkeypatch):
    from hccc.compiler.synth import synthesize
    from hccc.runtime import simulator

    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    res = synthesize(topo, "allgather", method="trees", time_limit=60.0)
    want = Simulations(topo, 1 << 24, clock.now() + 60).seconds(res, 1)
    calls = []
    real = simulator.simulate_by
    monkeypatch.setattr(simulator, "simulate_by", lambda *a, **k: calls.append(1) or real(*a, **k))
    sims = Simulations(topo, 1 << 24, clock.now() + 60)
    sims.prefetch(res, 1)
    sims.prefetch(res, 1)                  # once
    assert sims.prefetched == 1 and not sims.times
    sims.run_ahead()
    ran = len(calls)
    assert ran >= 1 and not sims.times     # nothing counted until asked for
    assert sims.seconds(res, 1) == want and len(calls) == ran
    assert sims.seconds(res, 1) == want and len(calls) == ran
    # one prepared and never asked for is forgotten: a later score simulates it
    other = Simulations(topo, 1 << 24, clock.now() + 60)
    other.prefetch(res, 1)
    other.drop_ahead()
    assert other.seconds(res, 1) == want and len(calls) > ran


def test_an_evaluator_without_ahead_gives_the_score_no_prefetch():
    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    assert not hasattr(tree_simulated_score(Simulations(topo, 1 << 24, clock.now() + 60, ahead=False)), "prefetch")
    assert hasattr(tree_simulated_score(Simulations(topo, 1 << 24, clock.now() + 60)), "run_ahead")


def test_a_joint_packing_the_halves_then_beat_starts_the_selection_again(monkeypatch):
    """Where the halves, packed once the selection started on the joint packing, beat it in the link
    model after all (as pair bandwidths other than the network's can make them), the selection
    starts again with the halves first, and writes what the usual order writes."""
    halves = forest._pack_halves

    def faster_halves(st, *args, **kw):
        packs, cut = halves(st, *args, **kw)
        for p in packs.values():
            p.rounded_time *= 1e-3          # as if their trees ran faster than the joint packing's
        return packs, cut

    monkeypatch.setattr(forest, "_pack_halves", faster_halves)
    restarts = []
    restart = forest._Restart

    class Counted(restart):
        def __init__(self, *args):
            restarts.append(1)
            super().__init__(*args)

    monkeypatch.setattr(forest, "_Restart", Counted)
    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    text, made = _program_text(topo, ahead=True)
    plain, _ = _program_text(topo, ahead=False)
    assert restarts == [1] and sum(m.prefetched for m in made) == 1
    assert text == plain


def test_a_joint_packing_made_first_stays_a_variant_where_the_time_left_would_skip_it(monkeypatch):
    """The rule that skips the joint packing where less packing time is left than the halves took
    spares the joint packing's time: made first, it is a variant whatever is left (it went first,
    and is the program written)."""
    halves = forest._pack_halves

    def slow_halves(st, *args, **kw):
        out = halves(st, *args, **kw)
        st.halves_s = 1e9           # as if they had taken longer than the time left
        return out

    monkeypatch.setattr(forest, "_pack_halves", slow_halves)
    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    text, made = _program_text(topo, ahead=True)
    plain, _ = _program_text(topo, ahead=False)
    assert sum(m.prefetched for m in made) == 1
    assert "AllReduce joint packing skipped" in plain and "joint packing skipped" not in text


# at 16 GiB the 12-GPU cluster's default runs enough micro-batches to be cut into samples (its
# programs there come within a percent of the bound: every candidate is tried at smaller slices
# here, as 64-GPU ones short of it are at 1 GiB); at 1 GiB it is simulated whole
@pytest.mark.parametrize("size", [16 << 30, 1 << 30])
@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
@pytest.mark.usefixtures("design_target_costs")   # thin slices affordable at 0.5 us a unit
def test_smaller_slices_guessed_beside_the_default_are_the_ones_the_selection_takes(monkeypatch, collective, size):
    """A candidate short of the bound is scored at smaller slices too: where its default's
    simulations run on the pool (here from any size, on two CPUs), the smaller slices it would try
    next are started beside them (:meth:`Simulations.guess`): beside its longest sample, those its
    two shorter samples' time would try; beside its whole call, the smallest slices of all where
    its least time affords them. The selection takes that simulation: the same text as where
    nothing is guessed."""
    import hccc.runtime.simulator as sim
    import hccc.synth_select as select
    monkeypatch.setattr(sim, "SIDE_BY_SIDE_UNITS", 0)
    monkeypatch.setattr(sim, "usable_cpus", lambda: 2)
    monkeypatch.setattr(select, "THIN_SLICES_BELOW", 2.0)
    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    text, made = _program_text(topo, True, collective, size)
    plain, plain_made = _program_text(topo, False, collective, size)
    assert text == plain
    assert sum(m.guesses_taken for m in made) >= 1
    assert sum(m.guessed for m in plain_made) == 0


# thin slices affordable at 0.5 us a unit, and faster in a simulator that charges none (conftest)
@pytest.mark.usefixtures("design_target_costs", "alpha_beta_costs")
def test_a_guess_nobody_asks_for_is_stopped_and_simulated_anew_when_asked(monkeypatch):
    """:meth:`Simulations.drop_guesses` turns the stop switch of a guessed simulation and drops its
    samples not begun; asked for afterwards, the program is simulated anew, to the time a fresh
    evaluator gives it."""
    import hccc.runtime.simulator as sim
    from hccc.runtime.simulator import SimulationStopped
    monkeypatch.setattr(sim, "SIDE_BY_SIDE_UNITS", 0)
    monkeypatch.setattr(sim, "usable_cpus", lambda: 2)
    topo = load_cluster(CLUSTERS / "h20_4_8.topo")
    prog, = synthesize_programs(topo, SynthOptions("allgather", method="trees", time_limit=120.0))
    result = prog.result
    sims = Simulations(topo, 1 << 30, clock.now() + 120)
    sims.guess(result, 1)
    timing, = sims._guessed.values()
    futures = list(timing._futures)
    assert len(futures) == 3 and sims.guessed == 1
    sims.drop_guesses()
    assert timing.stop.turned and not sims._guessed
    for f in futures:
        assert f.cancelled() or f.exception() is None or isinstance(f.exception(), SimulationStopped)
    t = sims.seconds(result, 1)
    assert sims.guesses_taken == 0
    assert t == Simulations(topo, 1 << 30, clock.now() + 120).seconds(result, 1)
