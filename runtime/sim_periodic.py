"""A long pipelined call's time from a few short ones: the steady state's period extrapolated.

A call whose chunks each pass in ``M`` micro-batches of one slice runs, once its pipelines are
full, in *periods*: every further ``nslots`` micro-batches (a FIFO's depth, see
:func:`periodic_samples`) add the same time, so at a fixed slice its simulated time is ``fill and
drain + M / nslots x period`` from some ``M`` on. The event
loop's work grows with ``M`` (an event per sending primitive and micro-batch), so a call of many
micro-batches (``hccc synth``'s thin slices: 128 a chunk) costs many times one of a few.

:func:`simulate_periodic` simulates the same call cut to three counts of micro-batches
(:func:`periodic_samples`, a FIFO's depth apart, the last in the call's phase; the same program,
slice and chunks, every chunk shortened by whole slices, so each keeps its last, partial slice:
:func:`cut_geometry`; three independent simulations, side by side on threads where they are large,
:func:`hccc.runtime.simulator.side_by_side`), takes the two periods between them, and where they agree (the part they
extrapolate uncertain by at most :data:`PERIODIC_TOLERANCE` of the time) returns ``T(M2)`` plus
the whole periods from ``M2`` to ``M``. Where they do not,
or where the call has too few micro-batches for the samples to save work
(:data:`PERIODIC_LEAST_RATIO`), the whole call is simulated, so the answer is never a guess
beyond the check: measured against the whole simulation in
docs/archive/measurements-log.md#the-thin-simulation-extrapolated-from-three-short-calls-runtimesim_periodicpy
and by ``tests/test_sim_periodic.py`` on random programs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hccc.compiler.backend.abi import NSLOTS
from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS, DEFAULT_ELEMENT_BYTES, Geometry, SimProgram

#: the extrapolated part's uncertainty, the two periods' difference times the periods
#: extrapolated, at most this share of the time: half the least gain for which ``hccc synth``
#: changes a program's slices (``THIN_GAIN``, 0.002). The figure is a worst case (the period
#: drifting on as between the samples) of what the samples show; a regime that sets in after them
#: they cannot show (random programs: most within 3.2e-4, a few off by up to 4.8e-2 where a period
#: grows over the call's last micro-batches only, ``tests/test_sim_periodic.py``). Measured: the
#: held-out 64-GPU AllGather and ReduceScatter at 16 KiB slices (``synth_quality.py --asym 1``,
#: 128 micro-batches, samples 8, 16, 24) within 1e-6 of the whole simulation, two MI250 nodes'
#: AllGather (``--mi250 2``) within 2e-4
PERIODIC_TOLERANCE = 1e-3
#: the call is cut only where it has at least this many times the micro-batches its samples
#: simulate together (27 to 48 with 8 slots). A micro-batch costs the event loop less in the short
#: samples, where fewer flows run at once, than in the whole call: ReduceScatter's programs at
#: hccc's default slices (``synth_quality.py --asym 1`` and ``2``, 25 micro-batches), their samples
#: of 1, 9 and 17 micro-batches cost a little over half the whole calls and were extrapolated
#: within 5e-9 (docs/archive/measurements-log.md#the-thin-simulation-extrapolated-from-three-short-calls-runtimesim_periodicpy);
#: below this, the samples would cost about
#: the call, and the whole call besides where the check refuses them
PERIODIC_LEAST_RATIO = 0.9


@dataclass(frozen=True)
class PeriodicTime:
    """A call's time (seconds) and how it was found: ``samples`` the micro-batches of the calls
    simulated (the whole call's alone where not extrapolated), ``sample_times`` theirs,
    ``extrapolated`` whether ``time_s`` is extrapolated from them; ``events`` simulated in all."""

    time_s: float
    micro_batches: int
    samples: tuple[int, ...]
    sample_times: tuple[float, ...]
    extrapolated: bool
    events: int


def cut_geometry(geo: Geometry, nmb: int) -> Geometry:
    """``geo`` with ``nmb`` micro-batches: every chunk shortened by the same whole slices (its
    last, partial slice kept), at the same slice."""
    nmb = int(nmb)
    if not 1 <= nmb <= geo.nmb:
        raise ValueError(f"a cut call has 1 to {geo.nmb} micro-batches, not {nmb}")
    drop = (geo.nmb - nmb) * geo.slice_elems
    chunk_len = np.maximum(0, geo.chunk_len - drop).astype(np.int64)
    count = int(chunk_len.sum())
    return Geometry(count * geo.element_bytes, count, geo.element_bytes, geo.slice_elems, nmb, chunk_len)


def periodic_samples(nmb: int, nslots: int = NSLOTS) -> tuple[int, ...]:
    """The micro-batches of the cut calls of a call of ``nmb`` micro-batches with FIFOs of
    ``nslots`` slots: three counts ``nslots`` apart, the least from 1 to ``nslots``, each equal
    to ``nmb`` modulo ``nslots``.

    A sender runs ahead of its receiver by at most ``nslots`` slots, so a pipeline its latency
    holds back runs in steps of ``nslots`` micro-batches, a round trip each, not in even periods
    (two ranks over links of 6 us latency, 256-byte slices: 6.03 us for 2 micro-batches, 6.10 for
    8, 12.03 for 9, 12.12 for 16, 18.13 for 24): its period is ``nslots`` micro-batches, and a
    sample in the call's phase extrapolates by whole periods. Samples of fewer micro-batches than
    the FIFO holds never show it (2, 4 and 6 there: 16 % short at 24 micro-batches), and samples
    past it out of phase err by up to a step (9, 10, 11 on random programs: 2.8 %)."""
    first = (int(nmb) - 1) % int(nslots) + 1
    return first, first + int(nslots), first + 2 * int(nslots)


class PeriodicCall:
    """One call of ``nbytes`` timed as :func:`simulate_periodic` times it, in two halves: its
    :meth:`jobs`, the sample simulations (none where the call is not cut), which the caller runs
    where it likes (side by side on threads, a pool shared with other calls), and :meth:`finish`,
    which takes their results, checks the periods and gives the time (simulating the whole call
    there where the samples do not settle it). :meth:`estimate` reads the call's time from the two
    shorter samples alone, a guess for what to start next before the longest ends. Arguments as
    :func:`simulate_periodic`'s; ``stop``: a :class:`~hccc.runtime.simulator.StopSwitch` every
    simulation of the call is given."""

    def __init__(self, program, topo, nbytes: int, *, slice_bytes: int | str | None = "auto",
                 element_bytes: int = DEFAULT_ELEMENT_BYTES, block_gbps: float | None = DEFAULT_BLOCK_GBPS,
                 deadline: float | None = None, tolerance: float = PERIODIC_TOLERANCE,
                 least_ratio: float = PERIODIC_LEAST_RATIO, stop=None, **kw):
        from hccc.runtime.simulator import _call_geometry, prepare

        self.prog = program if isinstance(program, SimProgram) else prepare(program, topo, block_gbps)
        self.topo, self.nbytes, self.element_bytes = topo, int(nbytes), element_bytes
        self.slice_bytes, self.deadline, self.tolerance, self.kw = slice_bytes, deadline, tolerance, kw
        if stop is not None:
            self.kw["stop"] = stop
        self.nslots = int(kw.get("nslots", NSLOTS))
        self.geo, self.slice_b = _call_geometry(self.prog, self.nbytes, slice_bytes, element_bytes)
        self.samples = periodic_samples(self.geo.nmb, self.nslots)
        self.cut = kw.get("execution", "task") == "task" and self.geo.nmb >= least_ratio * sum(self.samples)

    def _run(self, **k):
        from hccc.runtime.simulator import simulate, simulate_by
        if self.deadline is None:
            return simulate(self.prog, self.topo, self.nbytes, element_bytes=self.element_bytes, **k, **self.kw)
        return simulate_by(self.deadline, self.prog, self.topo, self.nbytes, element_bytes=self.element_bytes,
                           **k, **self.kw)

    def _sample(self, m: int):
        return self._run(call_geometry=(cut_geometry(self.geo, m), self.slice_b))

    def jobs(self) -> list:
        """The sample simulations, longest first (callables giving their results): none where the
        call has too few micro-batches for samples to save work."""
        return [functools.partial(self._sample, m) for m in reversed(self.samples)] if self.cut else []

    def side_by_side(self) -> bool:
        """The samples are large enough to be worth threads of their own."""
        from hccc.runtime.simulator import SIDE_BY_SIDE_UNITS
        return int(self.prog.p_cnt.sum()) * sum(self.samples) >= SIDE_BY_SIDE_UNITS

    def estimate(self, shorter: tuple[float, float]) -> float:
        """The call's time from the two shorter samples' times (least first): the period between
        them extrapolated, a guess where the longest sample would settle it."""
        m1 = self.samples[1]
        return float(shorter[1] + (self.geo.nmb - m1) // self.nslots * (shorter[1] - shorter[0]))

    def finish(self, results) -> PeriodicTime:
        """The call's time from its :meth:`jobs`' results (in the jobs' order): extrapolated where the
        two periods agree, else the whole call simulated here (as where it is not cut)."""
        if not self.cut:
            whole = self._run(slice_bytes=self.slice_bytes)
            return PeriodicTime(whole.time_s, self.geo.nmb, (self.geo.nmb,), (whole.time_s,), False, whole.events)
        done = list(results)[::-1]
        times = [r.time_s for r in done]
        events = sum(r.events for r in done)
        m0, m1, m2 = self.samples
        # one period is ``nslots`` micro-batches; the call is a whole number of them past the last sample
        p1, p2 = times[1] - times[0], times[2] - times[1]
        periods = (self.geo.nmb - m2) // self.nslots
        est = times[2] + periods * p2
        if est > 0 and abs(p2 - p1) * periods <= self.tolerance * est:
            return PeriodicTime(float(est), self.geo.nmb, self.samples, tuple(times), True, events)
        whole = self._run(slice_bytes=self.slice_bytes)
        return PeriodicTime(whole.time_s, self.geo.nmb, (*self.samples, self.geo.nmb), (*times, whole.time_s), False,
                            events + whole.events)


def simulate_periodic(program, topo, nbytes: int, *, slice_bytes: int | str | None = "auto",
                      element_bytes: int = DEFAULT_ELEMENT_BYTES, block_gbps: float | None = DEFAULT_BLOCK_GBPS,
                      deadline: float | None = None, tolerance: float = PERIODIC_TOLERANCE,
                      least_ratio: float = PERIODIC_LEAST_RATIO, **kw) -> PeriodicTime:
    """The time of one task-level call of ``nbytes`` (see the module docstring): ``program`` a
    ProgramIR or a prepared :class:`SimProgram`, the rest as :func:`hccc.runtime.simulator.simulate`
    takes them (``deadline``: every simulation of it runs by
    :func:`~hccc.runtime.simulator.simulate_by`, ending by that work-clock time or raising
    :class:`~hccc.runtime.simulator.SimulationStopped`). The samples run side by side on threads
    where they are large (:class:`PeriodicCall` splits this for callers that run them elsewhere)."""
    from hccc.runtime.simulator import side_by_side

    call = PeriodicCall(program, topo, nbytes, slice_bytes=slice_bytes, element_bytes=element_bytes,
                        block_gbps=block_gbps, deadline=deadline, tolerance=tolerance, least_ratio=least_ratio, **kw)
    jobs = call.jobs()
    # three independent simulations: side by side, the longest first
    return call.finish(side_by_side(jobs) if jobs and call.side_by_side() else [j() for j in jobs])
