"""The SMT side of the CEGIS loop (HeteCCL section 5.1, Eqs. 2-6 and 8), with z3.

Two encodings over the Send/Has variables of the paper, both solved incrementally (one
``z3.Solver`` per problem; goals go in and out with ``push``/``pop``; constraints learned from
counterexamples are added to the live solver):

* :class:`StepRepair` -- the checkpoint step of a candidate schedule: keep a largest subset of
  its transfers that satisfies link capacities (Eq. 4), the shared groups learned so far (Eq. 5),
  receive-once (Eq. 6) and Eq. 8; galloping search on the count with ``push``/``pop``.
* :class:`SuffixWindow` -- a window of ``w`` steps after a frozen prefix: ``Send(k, u, v, t)`` and
  ``Has(k, u, t)`` for the (chunk, rank) pairs still missing, with causality (Eq. 2), state evolution
  (Eq. 3), receive-once, link and group capacities and Eq. 8, and the postcondition "every rank holds
  every chunk after the window" pushed as the goal. Candidate senders are pruned by hop distance
  (a rank can forward a chunk only once it can have it), and a chunk enters a node at most once (the
  greedy's bandwidth economy). :meth:`SuffixWindow.solve` runs its own
  counterexample loop: a model that overloads a group not yet encoded adds that group's constraints
  to the solver and asks again.

Both return ``None`` when unsatisfiable, out of time or too large (``max_vars``): the caller keeps the
schedule it has.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.synth.check import check
from hccc.compiler.synth.problem import Network, Schedule, Task
from hccc.util import clock


def _z3():
    try:
        import z3
    except ImportError:  # pragma: no cover - z3 is a declared dependency of the synth extra
        return None
    return z3


def available() -> bool:
    return _z3() is not None


#: what z3 says of a check its own SIGINT handler cancelled (Ctrl-C while the check ran)
Z3_INTERRUPTED = "interrupted from keyboard"


def solver_check(s):
    """``s.check()``, with Ctrl-C delivered at once: z3 takes SIGINT over while a check runs and
    only cancels that check (it answers ``unknown``), so an interrupt the user sent would be
    swallowed; here it becomes the KeyboardInterrupt it was, as soon as z3 stops."""
    z3 = _z3()
    result = s.check()
    if result == z3.unknown and s.reason_unknown() == Z3_INTERRUPTED:
        raise KeyboardInterrupt
    return result


def _ms_left(deadline: float) -> int:
    return max(1, int((deadline - clock.now()) * 1000))


@dataclass
class SmtStats:
    calls: int = 0
    sat: int = 0
    unsat: int = 0
    unknown: int = 0
    learned_groups: int = 0
    seconds: float = 0.0
    #: the fewest candidate transfers of a repair whose first call ended ``unknown`` (0: none yet)
    repair_unknown_at: int = 0
    #: repairs not asked of z3 because one no larger already ended ``unknown`` (:meth:`skip_repair`)
    repairs_skipped: int = 0
    #: False: :meth:`skip_repair` never skips (every repair asks z3)
    skip_unknown: bool = True

    def skip_repair(self, ncand: int) -> bool:
        """Whether a repair of ``ncand`` candidate transfers goes straight to its greedy baseline:
        one of at most as many candidates already exhausted its resource limit before beating its
        baseline (z3 answered ``unknown`` to its first, easiest target). A larger step under at
        least as many learned groups is no easier; each such call costs a whole
        :data:`REPAIR_RLIMIT` and returns the baseline anyway (measured on a 64-GPU heterogeneous
        AllGather's search: docs/archive/measurements-log.md#synthesis-speed-at-64-gpus-without-symmetry-the-speed-targets-no-gpu)."""
        if self.skip_unknown and self.repair_unknown_at and ncand >= self.repair_unknown_at:
            self.repairs_skipped += 1
            return True
        return False

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "skip_unknown"}


#: z3 resource limits per call (deterministic, unlike wall-clock timeouts: the same input gives the
#: same schedule on any machine unless the overall time limit cuts in). About 7M units per second.
REPAIR_RLIMIT = 2_000_000
WINDOW_RLIMIT = 8_000_000


def _solver(z3):
    """An incremental solver for these purely Boolean/cardinality problems (z3's finite-domain
    engine: SAT with native cardinality constraints; supports push/pop), in a context of its own
    with a fixed seed, so that a result never depends on earlier solver calls in the process."""
    ctx = z3.Context()
    s = z3.SolverFor("QF_FD", ctx=ctx)
    s.set("random_seed", 0)
    return s, ctx


def _at_most(z3, solver, xs, k):
    if len(xs) > k:
        solver.add(z3.AtMost(*xs, int(k)) if k > 0 else z3.Not(z3.Or(*xs)))


class StepRepair:
    """A largest valid subset of one step's candidate transfers (see module doc)."""

    def __init__(self, net: Network, task: Task, cand: Schedule, enforced: np.ndarray, weights: np.ndarray,
                 stats: SmtStats):
        z3 = _z3()
        self.z3, self.net, self.cand, self.stats = z3, net, cand, stats
        self.fanout_one = task.fanout_one
        self.optimal = False
        s, ctx = _solver(z3)
        self.x = [z3.Bool(f"x{i}", ctx) for i in range(len(cand))]
        self.w = np.asarray(weights, np.int64)
        p = net.pair_index(cand.src, cand.dst)
        self.pairs = p
        for q in np.unique(p).tolist():
            _at_most(z3, s, [self.x[i] for i in np.flatnonzero(p == q).tolist()], int(net.cap[q]))
        self.solver = s
        self.encoded = np.zeros(net.ngroups, bool)
        self.add_groups(enforced)
        key = cand.dst * task.nchunks + cand.chunk
        for kk in np.unique(key).tolist():
            idx = np.flatnonzero(key == kk)
            if idx.size > 1:
                _at_most(z3, s, [self.x[i] for i in idx.tolist()], 1)
        if task.fanout_one:
            key = cand.src * task.nchunks + cand.chunk
            for kk in np.unique(key).tolist():
                idx = np.flatnonzero(key == kk)
                if idx.size > 1:
                    _at_most(z3, s, [self.x[i] for i in idx.tolist()], 1)

    def add_groups(self, mask: np.ndarray) -> None:
        z3, net = self.z3, self.net
        new = np.flatnonzero(np.asarray(mask, bool) & ~self.encoded)
        if not new.size:
            return
        self.encoded[new] = True
        self.stats.learned_groups += int(new.size)
        members: dict[int, list] = {int(g): [] for g in new.tolist()}
        for i, q in enumerate(self.pairs.tolist()):
            for g in net.groups_of(q).tolist():
                if g in members:
                    members[g].append(self.x[i])
        for g, xs in members.items():
            _at_most(z3, self.solver, xs, int(net.gcap[g]))

    def baseline(self) -> np.ndarray:
        """A feasible subset found greedily (heaviest first): the value z3 has to beat."""
        return greedy_subset(self.net, self.cand, self.pairs, self.encoded, self.w, self.fanout_one)

    def solve(self, deadline: float, per_call: int = REPAIR_RLIMIT) -> Schedule:
        """Keep more transfers than :meth:`baseline` with z3 (galloping search on the count, one
        ``push``/``pop`` per target) until the optimum is proven, a call exhausts its resource limit
        ``per_call`` (z3's deterministic ``rlimit``) or ``deadline`` passes. The weights order the
        baseline (and so break ties); the solver maximises the number of transfers kept."""
        z3, s = self.z3, self.solver
        t0 = clock.now()
        best = self.baseline()
        value = int(best.sum())
        upper = len(self.x)
        delta = 1
        asked = 0
        while value < upper and clock.now() < deadline:
            asked += 1
            target = min(upper, value + delta)
            s.push()
            s.add(z3.AtLeast(*self.x, target))
            s.set("timeout", _ms_left(deadline))
            s.set("rlimit", int(per_call))
            r = solver_check(s)
            self.stats.calls += 1
            if r == z3.sat:
                self.stats.sat += 1
                m = s.model()
                best = np.array([z3.is_true(m.eval(x, model_completion=True)) for x in self.x], bool)
                value = int(best.sum())
                delta *= 2
            elif r == z3.unsat:
                self.stats.unsat += 1
                upper = target - 1
                delta = max(1, delta // 2)
            else:
                self.stats.unknown += 1
                if asked == 1:          # its first, easiest target: nothing gained on the baseline
                    at = self.stats.repair_unknown_at
                    self.stats.repair_unknown_at = len(self.x) if not at else min(at, len(self.x))
                s.pop()
                break
            s.pop()
        self.stats.seconds += clock.now() - t0
        self.optimal = value >= upper
        c = self.cand
        return Schedule(c.src[best], c.dst[best], c.step[best], c.chunk[best])


def greedy_subset(net: Network, c: Schedule, pairs: np.ndarray, encoded: np.ndarray, weights: np.ndarray,
                  fanout_one: bool) -> np.ndarray:
    """A feasible subset of the step's candidate transfers ``c`` found greedily, heaviest
    ``weights`` first: within each pair's capacity (``pairs``: their pair indices), each group's
    of the ``encoded`` (learned) groups, receive-once and, with ``fanout_one``, send-once per
    chunk. :class:`StepRepair`'s baseline, and the repair itself where z3 is not asked
    (:meth:`SmtStats.skip_repair`)."""
    order = np.argsort(-np.asarray(weights, np.int64), kind="stable")
    used_p = np.zeros(net.npairs, np.int64)
    used_g = np.zeros(max(net.ngroups, 1), np.int64)
    seen_recv: set[int] = set()
    seen_send: set[int] = set()
    nc = int(c.chunk.max()) + 1 if len(c) else 1
    chosen = np.zeros(len(c), bool)
    for i in order.tolist():
        q = int(pairs[i])
        gs = [g for g in net.groups_of(q).tolist() if encoded[g]]
        rk = int(c.dst[i]) * nc + int(c.chunk[i])
        sk = int(c.src[i]) * nc + int(c.chunk[i])
        if used_p[q] >= net.cap[q] or any(used_g[g] >= net.gcap[g] for g in gs) or rk in seen_recv:
            continue
        if fanout_one and sk in seen_send:
            continue
        used_p[q] += 1
        for g in gs:
            used_g[g] += 1
        seen_recv.add(rk)
        seen_send.add(sk)
        chosen[i] = True
    return chosen


class SuffixWindow:
    """Can the missing (chunk, rank) pairs be delivered in ``w`` steps from state ``has``? (module doc)"""

    def __init__(self, net: Network, task: Task, has: np.ndarray, t0: int, w: int, enforced: np.ndarray,
                 stats: SmtStats, max_vars: int = 40_000, rlimit: int = WINDOW_RLIMIT):
        self.net, self.task, self.t0, self.w, self.stats = net, task, int(t0), int(w), stats
        self.rlimit = rlimit
        self.too_big = False
        self.encoded = np.zeros(net.ngroups, bool)
        self.has = has.astype(bool)
        miss = np.argwhere(~self.has)  # (rank, chunk)
        self.miss = miss
        early = self._earliest()
        if (early[miss[:, 0], miss[:, 1]] > w).any():
            self.impossible = True
            return
        node = np.asarray(net.levels[0], np.int64)
        cand = self._candidates(early, node)
        self.impossible = cand is None
        if cand is None:
            return
        self.ck, self.cp, self.ct = cand
        nvars = self.ck.size + miss.shape[0] * w
        if nvars > max_vars:
            self.too_big = True
            return
        z3 = _z3()
        self.z3 = z3
        s, ctx = _solver(z3)
        self.solver = s
        self.X = [z3.Bool(f"s{i}", ctx) for i in range(self.ck.size)]
        # Has(k, r, t) for missing pairs, t = 1..w; constants elsewhere
        self.H = {(k, r, t): z3.Bool(f"h{k}_{r}_{t}", ctx) for r, k in miss.tolist() for t in range(1, w + 1)}
        self.cu = net.psrc[self.cp].astype(np.int64)
        self.cv = net.pdst[self.cp].astype(np.int64)
        self._encode_state()
        self._encode_capacities(node)
        self.add_groups(enforced)
        self.goal = [self.H[(k, r, w)] for r, k in miss.tolist()]

    def _earliest(self) -> np.ndarray:
        """The earliest step at which each rank can hold each chunk (hop distance from the current
        holders; ``1 << 30``: not within the window)."""
        net, w = self.net, self.w
        INF = 1 << 30
        early = np.where(self.has, 0, INF).astype(np.int64)
        for d in range(1, w + 1):
            reach = np.zeros_like(self.has)
            can = early < d  # holders at the start of step d-1
            cs = can[net.psrc]  # (P, nc)
            np.logical_or.at(reach, net.pdst, cs)
            newly = reach & (early == INF)
            early[newly] = d
        return early

    def _candidates(self, early: np.ndarray, node: np.ndarray):
        """The candidate sends ``(chunks, pairs, steps)``: ``v = pdst[p]`` misses chunk ``k``, the
        sender holds it by ``t`` (``early[u, k] <= t``) and ``t < w``; a chunk enters a node at most
        once, and never again once the node holds it (bandwidth economy, as the greedy). None when
        there is none."""
        net, w, nc = self.net, self.w, self.task.nchunks
        ptr_in, in_pairs = net.in_csr()
        cand_k, cand_p, cand_t = [], [], []
        node_has = np.zeros((int(node.max()) + 1, nc), bool)
        np.logical_or.at(node_has, node, self.has)
        for v, k in self.miss.tolist():
            pr = in_pairs[ptr_in[v]:ptr_in[v + 1]]
            if node_has[node[v], k]:
                pr = pr[node[net.psrc[pr]] == node[v]]
            us = net.psrc[pr]
            e = early[us, k]
            for t in range(w):
                ok = pr[e <= t]
                if ok.size:
                    cand_k.append(np.full(ok.size, k))
                    cand_p.append(ok)
                    cand_t.append(np.full(ok.size, t))
        if not cand_k:
            return None
        return (np.concatenate(cand_k).astype(np.int64), np.concatenate(cand_p).astype(np.int64),
                np.concatenate(cand_t).astype(np.int64))

    def _has_at(self, k: int, r: int, t: int):
        if self.has[r, k]:
            return True
        if t == 0:
            return False
        return self.H[(k, r, t)]

    def _encode_state(self) -> None:
        """Causality (Eq. 2: a send's sender holds the chunk, its receiver does not) and the
        state's evolution (Eq. 3), with one sender per chunk, receiver and step."""
        z3, s, X, H, w = self.z3, self.solver, self.X, self.H, self.w
        incoming: dict[tuple[int, int, int], list] = {}
        for i in range(self.ck.size):
            k, u, v, t = int(self.ck[i]), int(self.cu[i]), int(self.cv[i]), int(self.ct[i])
            hu = self._has_at(k, u, t)
            if hu is not True:  # causality: the sender holds the chunk (Eq. 2)
                s.add(z3.Implies(X[i], hu))
            if t > 0:  # and the receiver does not (Eq. 2); at t = 0 it does not by construction
                s.add(z3.Implies(X[i], z3.Not(H[(k, v, t)])))
            incoming.setdefault((k, v, t), []).append(X[i])
        for r, k in self.miss.tolist():  # state evolution (Eq. 3) and one sender per step
            for t in range(w):
                xs = incoming.get((k, r, t), [])
                prev = self._has_at(k, r, t)
                rhs = z3.Or(prev, *xs) if (xs and prev is not False) else (z3.Or(*xs) if xs else prev)
                s.add(H[(k, r, t + 1)] == rhs)
                if len(xs) > 1:
                    s.add(z3.AtMost(*xs, 1))

    def _encode_capacities(self, node: np.ndarray) -> None:
        """A chunk enters a node at most once per window; link capacity (Eq. 4); with fan-out one,
        a rank sends a chunk at most once a step (Eq. 8)."""
        z3, s, X, net, w, nc = self.z3, self.solver, self.X, self.net, self.w, self.task.nchunks
        cu, cv = self.cu, self.cv

        def runs(key):
            order = np.argsort(key, kind="stable")
            sk = key[order]
            starts = np.r_[0, np.flatnonzero(np.diff(sk)) + 1, sk.size]
            return order, sk, zip(starts[:-1].tolist(), starts[1:].tolist())
        inter = node[cu] != node[cv]
        if inter.any():
            idx = np.flatnonzero(inter)
            order, _, spans = runs(node[cv[inter]] * nc + self.ck[inter])
            for a, b in spans:
                if b - a > 1:
                    s.add(z3.AtMost(*[X[i] for i in idx[order[a:b]].tolist()], 1))
        order, sk, spans = runs(self.cp * w + self.ct)
        for a, b in spans:  # link capacity (Eq. 4)
            q = int(sk[a] // w)
            _at_most(z3, s, [X[i] for i in order[a:b].tolist()], int(net.cap[q]))
        if self.task.fanout_one:  # Eq. 8
            order, _, spans = runs((self.ck * net.nranks + cu) * w + self.ct)
            for a, b in spans:
                if b - a > 1:
                    _at_most(z3, s, [X[i] for i in order[a:b].tolist()], 1)

    def add_groups(self, mask: np.ndarray) -> None:
        """Encode the capacity of more shared groups (Eq. 5) in the live solver."""
        z3, net = self.z3, self.net
        new = np.flatnonzero(np.asarray(mask, bool) & ~self.encoded)
        if not new.size:
            return
        self.encoded[new] = True
        self.stats.learned_groups += int(new.size)
        want = set(new.tolist())
        buckets: dict[tuple[int, int], list] = {}
        for i in range(self.ck.size):
            q = int(self.cp[i])
            for g in net.groups_of(q).tolist():
                if g in want:
                    buckets.setdefault((g, int(self.ct[i])), []).append(self.X[i])
        for (g, _t), xs in buckets.items():
            _at_most(z3, self.solver, xs, int(net.gcap[g]))

    def solve(self, deadline: float) -> Schedule | None:
        """A schedule for the window (steps t0 .. t0+w-1) or None; learns groups on the way."""
        if self.impossible or self.too_big:
            return None
        z3, s = self.z3, self.solver
        t0 = clock.now()
        try:
            while clock.now() < deadline:
                s.push()
                s.add(*self.goal)
                s.set("timeout", _ms_left(deadline))
                s.set("rlimit", int(self.rlimit))
                r = solver_check(s)
                self.stats.calls += 1
                if r != z3.sat:
                    if r == z3.unsat:
                        self.stats.unsat += 1
                    else:
                        self.stats.unknown += 1
                    s.pop()
                    return None
                self.stats.sat += 1
                m = s.model()
                on = np.array([z3.is_true(m.eval(x, model_completion=True)) for x in self.X], bool)
                s.pop()
                sched = Schedule(self.cu[on], self.cv[on], self.ct[on] + self.t0, self.ck[on])
                # verify the window from the frozen state: counterexamples are groups not encoded yet
                cex = _check_window(self.net, self.task, self.has, sched.shifted(-self.t0))
                groups = [c.resource for c in cex if c.kind == "group"]
                if not cex:
                    return sched
                if len(groups) != len(cex):
                    raise AssertionError("SMT window model violates a non-group constraint: "
                                         + cex[0].message)
                mask = np.zeros(self.net.ngroups, bool)
                mask[groups] = True
                self.add_groups(mask)
            return None
        finally:
            self.stats.seconds += clock.now() - t0


def _check_window(net: Network, task: Task, has: np.ndarray, sched: Schedule):
    """check() of a window schedule starting from holdings ``has`` (not the task's initial state)."""
    return check(net, _StateTask(task, has), sched)


class _StateTask:
    """Duck-typed Task whose initial holdings are an arbitrary state (for window verification)."""

    def __init__(self, task: Task, has: np.ndarray):
        self.nranks, self.nchunks = task.nranks, task.nchunks
        self.fanout_one = task.fanout_one
        self._has = has.astype(np.uint8)

    def initial(self) -> np.ndarray:
        return self._has.copy()
