"""The report's figure: the written program's simulated time as a fraction of the cut bound, exact
or estimated with its uncertainty (``hccc synth``, ``--exact``).

The selection times every candidate (:class:`hccc.synth_select.Simulations`); an AllGather's or
ReduceScatter's call of many micro-batches is timed there from three short calls, its steady
state's period extrapolated (:mod:`hccc.runtime.sim_periodic`). That choice is made the same way
with and without ``--exact``, so the program written is the same either way; only the figure the
report gives differs:

* a time the selection simulated whole is the figure, exact;
* an extrapolated one is simulated whole where that costs at most :data:`FIGURE_WORK_BUDGET`
  (simulated events, predicted from the samples' own: a budget of work, not of seconds, so the
  same on every machine), or always under ``--exact``; past the budget the figure is the
  extrapolation with its uncertainty (:func:`estimate_interval`), for example ``0.997 +- 0.003 of
  the cut bound, estimated from 3 short calls (9, 17, 25 of 128 micro-batches)``;
* a program the selection did not simulate (over ``SIMULATE_MAX_RANKS`` GPUs, or the limit left no
  time) has no figure, unless ``--exact`` asks for it: then it is simulated whole (by the deadline);
* the time limit stops these simulations as every other: the figure then stays estimated (or
  absent), and the report says the limit bound (only then may it differ between machines).

``hccc sim`` always simulates the whole call.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the most work (events plus re-shared flow classes, as :func:`hccc.runtime.simulator.simulate`
#: counts it, predicted from the samples' own in proportion to the micro-batches) the report's
#: figure may add to the selection's simulations to make an extrapolated time exact: about a second
#: at the rates measured on a loaded 2-core machine (1.5-2 M per second, ``BAND_WORK_BUDGET``'s
#: note in :mod:`hccc.synth_select`); past it the figure is estimated (``--exact`` lifts it)
FIGURE_WORK_BUDGET = 2_000_000
#: the least half-width of an estimated time's interval, a share of the time: the samples' periods
#: can only show a drift that has begun by their last micro-batch, not a regime that sets in later.
#: Measured on random programs and clusters (``tests/sim_programs.py``'s ``periodic_call``, 24-160
#: micro-batches a chunk, hypothesis not derandomised, 29 November 2026): 600 draws, 237 of them
#: extrapolated, 234 within 3.2e-4 of the whole simulation and 3 off by 2.9e-2 to 4.8e-2 (a
#: 4-rank AllGather of 47 micro-batches whose period holds at 159.6 us over its samples of 7, 15
#: and 23 micro-batches and grows to 167.8 us over its last 8: a late regime). 11,400 further draws
#: (30 November 2026) found one 4-rank AllGather tree off by 3.9e-2 at 59 micro-batches and 5.1e-2 at
#: 123 (samples of 3, 11 and 19). The cause: each primitive's end time is a line in the micro-batch
#: count, and where two that meet (one rank, connection or link) cross past the last sample, one
#: catches up with what it waits for, or a pipeline drains early and frees what it shared. The floor
#: covers the worst seen, rounded up; where the whole simulation fits FIGURE_WORK_BUDGET no
#: estimate is made
ESTIMATE_FLOOR = 6e-2


@dataclass(frozen=True)
class Figure:
    """The report's figure: ``fraction`` of the cut bound (None: not simulated), ``low`` and
    ``high`` its interval (the same as ``fraction`` where exact), ``estimated`` (None where there is
    no figure), ``how`` (a phrase: how it was found) and ``limit_bound`` (the time limit stopped the
    simulation that would have made it exact, or made it at all)."""

    fraction: float | None
    low: float | None
    high: float | None
    estimated: bool | None
    how: str
    limit_bound: bool = False

    @property
    def plus_minus(self) -> float | None:
        """Half the interval's width (0 where exact)."""
        if self.fraction is None:
            return None
        return max(self.high - self.fraction, self.fraction - self.low)

    def as_dict(self) -> dict:
        """``--json``'s fields of the figure (beside ``fraction_of_bound``)."""
        return {"figure_estimated": self.estimated,
                "fraction_of_bound_interval": None if self.fraction is None else [self.low, self.high],
                "figure": self.how, "figure_limit_bound": self.limit_bound}

    def phrase(self) -> str:
        """``0.997 +- 0.003 of`` (estimated) or ``0.997 of`` (exact)."""
        if self.estimated:
            return f"{self.fraction:.3f} +- {self.plus_minus:.3f} of"
        return f"{self.fraction:.3f} of"


def estimate_interval(found) -> tuple[float, float]:
    """``(low, high)`` seconds around an extrapolated call's time (``found``, a
    :class:`~hccc.runtime.sim_periodic.PeriodicTime` with ``extrapolated``): the call's time is
    ``T(m2) + P p2``, ``P`` whole periods past its last sample, ``p1`` and ``p2`` the two periods
    its samples show. A period still drifting as between the samples moves the time by ``P |p2 -
    p1|``; a regime the samples cannot show by at most :data:`ESTIMATE_FLOOR` of it (measured).
    The half-width is the larger."""
    t = float(found.time_s)
    t0, t1, t2 = (float(x) for x in found.sample_times)
    m0, m1, m2 = found.samples
    nslots = max(1, m1 - m0)
    periods = (int(found.micro_batches) - m2) // nslots
    half = max(abs((t2 - t1) - (t1 - t0)) * periods, ESTIMATE_FLOOR * t)
    return t - half, t + half


def whole_work(found) -> int:
    """The work a whole call's simulation takes, predicted from its samples' (``found``): their
    events in proportion to the micro-batches (an event per sending primitive and micro-batch)."""
    return int(found.events * int(found.micro_batches) / max(1, sum(found.samples)))


def figure(result, sims, bound_s: float, *, exact: bool, simulated: bool) -> Figure:
    """The figure of ``result``'s program (as the selection left it: its channels and slices) at
    ``sims.nbytes`` (see the module docstring); ``bound_s``: the cut bound's seconds;
    ``simulated``: whether the selection simulates at this cluster's size."""
    if bound_s <= 0 or not getattr(sims, "available", False) or not hasattr(sims, "whole_seconds") or \
            not (simulated or exact):
        return _none("not simulated")       # (before the program's key: hashing its rows costs at scale)
    channels = int(result.detail.get("channels", 1))
    tkey = sims._key(result) + (channels,)
    t = sims.times.get(tkey)
    found = sims.periodic.get(tkey)
    if t is None:
        if not exact:
            return _none("not simulated")
        whole, stopped = sims.whole_seconds(result, channels, None)
        if whole is None:
            return Figure(None, None, None, None, "not simulated: " + ("time limit" if stopped else "failed"),
                          limit_bound=stopped)
        return _exact(bound_s, whole, "the whole call simulated (--exact)")
    if found is None or not found.extrapolated:
        return _exact(bound_s, t, "the whole call simulated")
    m0, m1, m2 = found.samples
    said = (f"estimated from 3 short calls ({m0}, {m1}, {m2} of {found.micro_batches} micro-batches, "
            "the steady state's period extrapolated)")
    if exact or whole_work(found) <= FIGURE_WORK_BUDGET:
        whole, stopped = sims.whole_seconds(result, channels, None if exact else FIGURE_WORK_BUDGET)
        if whole is not None:
            return _exact(bound_s, whole, "the whole call simulated "
                          + ("(--exact)" if exact else "(within the figure's work budget)"))
        low, high = estimate_interval(found)
        return Figure(bound_s / t, bound_s / high, bound_s / low, True,
                      said + ("; the whole call's simulation stopped by the time limit" if stopped else
                              "; the whole call's simulation went past its work budget"), limit_bound=stopped)
    low, high = estimate_interval(found)
    return Figure(bound_s / t, bound_s / high, bound_s / low, True,
                  said + f"; the whole call would take about {whole_work(found):,} simulated events, past the "
                         f"figure's budget of {FIGURE_WORK_BUDGET:,} (--exact simulates it)")


def _exact(bound_s: float, t: float, how: str) -> Figure:
    f = bound_s / t if t > 0 else None
    return Figure(f, f, f, None if f is None else False, how)


def _none(how: str) -> Figure:
    return Figure(None, None, None, None, how)


__all__ = ["ESTIMATE_FLOOR", "FIGURE_WORK_BUDGET", "Figure", "estimate_interval", "figure", "whole_work"]
