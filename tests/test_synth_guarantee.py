"""Synthesis v3's guarantee: on every shipped cluster, for every collective ``hccc synth`` makes, at
4 KiB, 64 KiB, 1 MiB, 64 MiB and 1 GiB, the program ``hccc synth --size SIZE`` writes takes at most
1.02x the time of the best program it could have written.

The rows are ``benchmarks/synth_candidates.py``'s (the benchmark's table, one implementation): the
written program, every candidate the selection scored (each as it would have been written) and
hccc's generators that fit the cluster (built there, not taken from the selection's list, each at
its best of 1 to 8 blocks per thread block) are each timed through the simulator's API as ``hccc
sim`` times a program, none through the selection's own numbers. The default set runs two small
clusters; the sweep every shipped cluster (``pytest -n 2 -m sweep``, about 45 minutes on 2 cores,
in neither the default nor the slow set; ``python benchmarks/synth_candidates.py --clusters
all --collectives all`` prints the same rows as a table).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import synth_candidates as bench  # noqa: E402

from hccc.compiler.synth.selection import SCORE_BAND  # noqa: E402


def _check(cluster: str, collective: str) -> None:
    bad = []
    for size in SCORE_BAND:
        r = bench.row(cluster, collective, size, time_limit=60.0)
        assert r["times_us"], r
        # the best is the least of the programs timed, the written one no slower than 1.02x it
        assert r["best_us"] == min(r["times_us"].values())
        if r["ratio"] > bench.TOLERANCE:
            bad.append((size, r["kept"], round(r["written_us"], 2), r["best"], round(r["best_us"], 2)))
    assert not bad, f"{cluster} {collective}: the written program above {bench.TOLERANCE}x the best: {bad}"


@pytest.mark.parametrize("cluster,collective", [("heteccl_fig10", c) for c in bench.COLLECTIVES]
                         + [("a100_topo1", "allreduce"), ("a100_topo1", "reducescatter")])
def test_the_written_program_is_within_2_percent_of_the_best_on_small_clusters(cluster, collective):
    """heteccl_fig10 (two unlike nodes, six GPUs), every collective; a100_topo1 (two 4-GPU A100
    nodes) AllReduce and ReduceScatter (where the hierarchical mesh leads at the small sizes)."""
    _check(cluster, collective)


@pytest.mark.sweep
@pytest.mark.parametrize("collective", bench.COLLECTIVES)
@pytest.mark.parametrize("cluster", bench.shipped_clusters())
def test_the_written_program_is_within_2_percent_of_the_best_on_every_shipped_cluster(cluster, collective):
    _check(cluster, collective)



def test_channels_are_fitted_where_more_of_them_cut_smaller_slices():
    """What the sweep found: a100_topo2's hierarchical ReduceScatter at 1 MiB ran 48.3 us with one
    channel and as long without the per-block limit (at one channel's slices), 44.4 us with two
    (a slice follows the channels), so the fitting kept one and the step search's 45.2 us was
    written, 1.019x the generator at two. Its fitted count now runs within the fitting's tolerance
    of the fastest resident count, each simulated here."""
    from hccc import load_cluster
    from hccc.compiler.synth.classic import as_result
    from hccc.synth_select import FIT_TOLERANCE, Simulations, _fit_channels
    from hccc.util import clock

    topo = load_cluster(ROOT / "examples" / "clusters" / "a100_topo2.topo")
    alg = bench.generators(topo, "reducescatter")["hm"]
    res = as_result(alg, "hm", topo.name)
    sims = Simulations(topo, 1 << 20, clock.now() + 600)
    fitted = _fit_channels(res, topo, 1 << 20, sims)
    counts = sims.channel_steps(res)
    best = min(bench._time(alg, topo, 1 << 20, c) for c in counts)
    assert res.detail["channels"] > 1 and res.detail["channels_fitted"]
    assert fitted == pytest.approx(bench._time(alg, topo, 1 << 20, res.detail["channels"]), rel=1e-12)
    assert fitted <= best * (1 + FIT_TOLERANCE)
