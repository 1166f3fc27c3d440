"""Counterexample-guided inductive synthesis (HeteCCL section 5.2, Appendix H, Algorithm 1).

:func:`synthesize_task` solves one dissemination :class:`~.problem.Task` (AllGather or Broadcast;
ReduceScatter and AllReduce are built from it in :mod:`.collectives`):

1. ``S_init`` = the greedy heuristic with *no* shared group enforced (it saturates links);
2. VERIFY (:func:`.check.check`) returns the counterexamples of the earliest violating step
   ``t_check``; the overloaded groups become permanent constraints (the learned set ``E``);
3. REVISEFULL: the prefix before ``t_check`` is frozen, z3 re-solves step ``t_check`` (a largest
   subset of its transfers under the learned constraints, :class:`.smt.StepRepair`), the greedy fills
   the step's remaining capacity and synthesises the suffix under the learned constraints;
4. repeat from 2 until no counterexample is left;
5. minimise steps: while above the step lower bound, z3 re-solves a suffix window of the valid
   schedule one step shorter (:class:`.smt.SuffixWindow`; windows grow until the solver says the
   window cannot be shortened, runs out of time or the window gets too large).

Anytime: the best valid schedule is kept; when the deadline passes during step 2-4 the greedy
finishes the current prefix with every group enforced (always valid), so a result always comes back,
with its gap to the lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.compiler.synth import smt
from hccc.compiler.synth.bounds import StepBound, step_lower_bound
from hccc.compiler.synth.check import check, earliest_step
from hccc.compiler.synth.greedy import GreedyInputs, GreedyStopped
from hccc.compiler.synth.problem import Network, Schedule, Task, replay
from hccc.util import clock

Progress = Callable[[str, dict], None]


@dataclass
class TaskResult:
    schedule: Schedule
    bound: StepBound
    iterations: int = 0                    # CEGIS iterations (verify -> repair)
    learned_groups: int = 0                # shared groups learned from counterexamples
    greedy_steps: int = 0                  # steps of the first valid schedule
    optimal: bool = False                  # steps == lower bound
    timed_out: bool = False
    smt: dict = field(default_factory=dict)
    seconds: float = 0.0
    variant: int = 0                       # the greedy variant chosen
    variants: int = 1                      # how many variants were tried

    @property
    def steps(self) -> int:
        return self.schedule.nsteps

    @property
    def gap(self) -> int:
        return self.steps - self.bound.steps


def _weights(net: Network, cand: Schedule) -> np.ndarray:
    """REVISEFULL's preference at the checkpoint: transfers across the coarsest hierarchy level weigh
    most (they use the scarce resources the greedy ordered first)."""
    w = np.ones(len(cand), np.int64)
    for lv in net.levels[::-1]:
        w = np.where(lv[cand.src] != lv[cand.dst], w + 1, w)
    return w


def greedy_stop_at(deadline: float) -> float:
    """When a greedy run starting now is stopped: it may go past ``deadline`` to finish the schedule
    the anytime loop needs, by 2 s plus a tenth of the time left (counted from its start when it
    starts after the deadline)."""
    now = clock.now()
    return max(deadline, now) + 2.0 + 0.1 * max(0.0, deadline - now)


def _cegis(net: Network, task: Task, gi: GreedyInputs, stats, use_smt: bool, deadline: float, note,
           repair_rlimit: int = smt.REPAIR_RLIMIT):
    """Steps 1-4 of the module docstring with one greedy variant: (valid schedule, iterations,
    enforced groups, timed out)."""
    enforced = np.zeros(net.ngroups, np.uint8)
    max_steps = task.demand + 1
    sched, complete = gi.run(task.initial(), 0, max_steps, enforced, stop_at=greedy_stop_at(deadline))
    if not complete:
        raise ValueError("the cluster does not connect every rank to every chunk's origin")
    note("greedy", {"steps": sched.nsteps})
    iterations = 0
    timed_out = False
    while True:
        cex = check(net, task, sched, stop_after_first_step=True)
        if not cex:
            break
        iterations += 1
        t = earliest_step(cex)
        cex = [c for c in cex if c.step == t]
        bad = [c for c in cex if c.kind != "group"]
        if bad:  # the greedy keeps every other constraint by construction
            raise AssertionError("greedy schedule violates " + bad[0].message)
        learned = np.zeros(net.ngroups, bool)
        learned[[c.resource for c in cex]] = True
        enforced[learned] = 1
        prefix = sched.before(t)
        has_t = replay(task, prefix)
        if clock.now() >= deadline:
            timed_out = True
            enforced[:] = 1
            suffix, _ = gi.run(has_t, t, max_steps, enforced, stop_at=greedy_stop_at(deadline))
            sched = Schedule.concat([prefix, suffix])
            continue
        frozen = None
        cand = sched.at(t)
        if use_smt and stats.skip_repair(len(cand)):   # z3 would exhaust its limit: its baseline
            keep = smt.greedy_subset(net, cand, net.pair_index(cand.src, cand.dst), enforced.astype(bool),
                                     _weights(net, cand), task.fanout_one)
            frozen = Schedule(cand.src[keep], cand.dst[keep], cand.step[keep], cand.chunk[keep])
        elif use_smt:
            rep = smt.StepRepair(net, task, cand, enforced.astype(bool), _weights(net, cand), stats)
            frozen = rep.solve(deadline, repair_rlimit)
        if frozen is None:  # no solver: drop the transfers on overloaded groups
            keep = ~np.isin(np.flatnonzero(sched.step == t), np.concatenate([c.transfers for c in cex]))
            frozen = Schedule(cand.src[keep], cand.dst[keep], cand.step[keep], cand.chunk[keep])
        suffix, complete = gi.run(has_t, t, max_steps, enforced, frozen=frozen,
                                  stop_at=greedy_stop_at(deadline))
        sched = Schedule.concat([prefix, suffix])
        note("cegis", {"iteration": iterations, "checkpoint": t, "steps": sched.nsteps,
                       "learned": int(enforced.sum())})
    return sched, iterations, enforced, timed_out


def synthesize_task(net: Network, task: Task, *, deadline: float, use_smt: bool = True,
                    progress: Progress | None = None, bound: StepBound | None = None,
                    minimize: bool = True, max_window: int = 6, max_vars: int = 40_000,
                    variants: int = 1, score: Callable[[Schedule], float] | None = None,
                    repair_rlimit: int = smt.REPAIR_RLIMIT, skip_unknown: bool = True) -> TaskResult:
    """CEGIS for ``task`` (module docstring). With ``variants`` > 1 the loop runs once per greedy
    variant (:data:`.greedy.VARIANTS`: different tie-breaking among equally good transfers); the
    candidate with the fewest steps wins, ties broken by ``score`` (lower is better; e.g. a
    simulated completion time) when given, else the first variant. ``repair_rlimit``: z3's resource
    limit per step-repair call; ``skip_unknown`` False: every repair asks z3, even after one no
    larger ended ``unknown`` (:meth:`.smt.SmtStats.skip_repair`; the reference the tests hold the
    skipping to)."""
    t_start = clock.now()
    note = progress or (lambda *_: None)
    bound = bound or step_lower_bound(net, task)
    note("bound", {"steps": bound.steps})
    stats = smt.SmtStats(skip_unknown=skip_unknown)
    use_smt = use_smt and smt.available()
    cands = []
    for v in range(max(1, int(variants))):
        if v and clock.now() >= deadline:
            break
        gi = GreedyInputs(net, task, variant=v)
        try:
            cands.append(_cegis(net, task, gi, stats, use_smt, deadline, note, repair_rlimit))
        except GreedyStopped:
            if cands:
                break       # keep the variants that finished
            fewer = " or use fewer chunks per rank" if task.chunks_per_rank > 1 else ""
            raise GreedyStopped(f"no complete schedule for {task.nranks} ranks and {task.nchunks} chunks "
                                f"within the time limit (the greedy alone needs longer, stopped after "
                                f"{clock.now() - t_start:.1f} s); raise --time-limit{fewer}") from None
    steps = [c[0].nsteps for c in cands]
    pool = [i for i, c in enumerate(cands) if c[0].nsteps == min(steps)]
    if score is not None and len(pool) > 1:
        scores = {i: score(cands[i][0]) for i in pool}
        pool.sort(key=lambda i: (scores[i], i))
        note("select", {"variant": pool[0], "scores": scores})
    sched, iterations, enforced, timed_out = cands[pool[0]]
    greedy_steps = sched.nsteps
    best = sched
    if minimize and use_smt and not timed_out:
        best, timed_out = _minimise(net, task, best, bound.steps, enforced, stats, deadline, note,
                                    max_window, max_vars)
    return TaskResult(best.sorted(), bound, sum(c[1] for c in cands), int(enforced.sum()), greedy_steps,
                      best.nsteps <= bound.steps, timed_out or clock.now() > deadline, stats.as_dict(),
                      clock.now() - t_start, variant=pool[0], variants=len(cands))


def _minimise(net, task, best: Schedule, lb: int, enforced, stats, deadline, note, max_window, max_vars):
    """Shorten ``best`` one step at a time by re-solving suffix windows with z3."""
    timed_out = False
    while best.nsteps > lb:
        improved = False
        T = best.nsteps
        for w in range(2, min(max_window, T) + 1):
            if clock.now() >= deadline:
                timed_out = True
                break
            s = T - w
            has_s = replay(task, best, s)
            win = smt.SuffixWindow(net, task, has_s, s, w - 1, enforced.astype(bool), stats, max_vars=max_vars)
            if win.too_big:
                break
            unknown_before = stats.unknown
            sol = win.solve(deadline)
            enforced |= win.encoded.astype(np.uint8)
            if sol is None and stats.unknown > unknown_before:
                break  # the solver ran out of time: larger windows are harder still
            if sol is not None:
                cand = Schedule.concat([best.before(s), sol])
                if not check(net, task, cand):
                    best = cand
                    improved = True
                    note("minimise", {"steps": best.nsteps, "window": w})
                    break
        if not improved:
            break
    return best, timed_out
