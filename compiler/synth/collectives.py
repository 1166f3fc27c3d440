"""Collectives from dissemination tasks (HeteCCL section 5, Appendix I).

* **AllGather**: chunk ``k`` starts at rank ``k // K`` (K chunks per rank), every rank gets all.
* **Broadcast**: every chunk starts at the root.
* **ReduceScatter**: the time-reversed AllGather with reduction. An AllGather schedule with
  HeteCCL's Eq. 8 (a rank forwards a chunk to one peer per step) is synthesised on the *transposed*
  network, then every transfer ``u -> v`` at step ``t`` becomes ``v -> u`` at step ``T-1-t`` with
  ``rrc``: each chunk's tree is walked leaves-to-root, partial sums flowing towards the rank that owns
  the chunk (``k // K``: the layout hccc's verifier and executors use). Eq. 8 is what keeps two
  reductions into one (rank, chunk) out of a single step.
* **AllToAll**: every block routed and scheduled by :mod:`.alltoall` (not a dissemination task);
  its cut bound is max over cuts of the bytes that must cross / the cut's capacity.
* **AllReduce** = ReduceScatter (chunk k reduced at rank k // K) followed by an AllGather of the
  reduced chunks (Appendix I).

Step lower bounds: AllGather/Broadcast from :func:`.bounds.step_lower_bound`; ReduceScatter from the
same bound on the transposed network (every cut argument reverses with time); AllReduce reports the
sum, i.e. the bound *within the ReduceScatter + AllGather decomposition* HeteCCL synthesises
(``detail["any_schedule_bound"]`` holds a bound valid for any AllReduce schedule: the larger phase).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hccc.util import clock
from hccc.util.clock import Deadline
from hccc.util.limits import MAX_CHUNK_RANK_PAIRS, check_synth_size  # noqa: F401
from hccc.compiler.frontend.algorithm import RECV, RRC, Header
from hccc.compiler.frontend.slice_policy import SlicePolicy
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.synth.bounds import (StepBound, alltoall_cut_bound_seconds, collective_bound_seconds,
                                       step_lower_bound, unreachable)
from hccc.compiler.synth.cegis import Progress, TaskResult, synthesize_task
from hccc.compiler.synth.plan import COLLECTIVES   # the one list, beside the options
from hccc.compiler.synth.problem import Network, Schedule, Task, allgather_task, broadcast_task, network_from_topology

#: the step search's bandwidth bound (the packing LP for AllGather and ReduceScatter) gets at most
#: this share of ``time_limit``
BOUND_SHARE = 0.25
#: how a schedule is made: the step search (greedy + SMT/CEGIS) or the tree packing (:mod:`.forest`)
METHODS = ("search", "trees")


@dataclass
class Phase:
    name: str            # "allgather" | "broadcast" | "reducescatter"
    op: int              # RECV or RRC
    step0: int           # first step of the phase in the combined program
    result: TaskResult

    @property
    def steps(self) -> int:
        return self.result.steps


@dataclass
class SynthResult:
    """A synthesised collective: transfer rows ``(src, dst, step, chunk, op)`` and its report."""

    collective: str
    nranks: int
    chunks_per_rank: int
    root: int | None
    rows: np.ndarray                      # int64 (M, 5)
    steps: int
    lower_bound_steps: int
    phases: list[Phase]
    seconds: float
    cluster: str
    timed_out: bool = False
    composed: dict | None = None          # hierarchical composition details, if used
    detail: dict = field(default_factory=dict)
    loops: list | None = None             # the rows as loops over a symmetry (tree packing), or None

    @property
    def gap(self) -> int:
        return self.steps - self.lower_bound_steps

    @property
    def warps(self) -> int:
        """Warps per thread block of the program (``nWarps``): the tree packing's choice, else the
        header's default."""
        return int(self.detail.get("warps", Header.nwarps))

    @property
    def slice_policy(self) -> SlicePolicy:
        """The program's slice policy (``nMicroBatches``, ``MinSliceBytes``): hccc's default unless
        ``synth`` chose smaller slices for its thin streams (``detail["slicing"]``)."""
        got = self.detail.get("slicing")
        return SlicePolicy(int(got["micro_batches"]), int(got["min_slice_bytes"])) if got else SlicePolicy()

    @property
    def ntransfers(self) -> int:
        return int(self.rows.shape[0])

    def summary(self) -> dict:
        return {
            "collective": self.collective, "nranks": self.nranks, "chunks_per_rank": self.chunks_per_rank,
            "root": self.root, "steps": self.steps, "lower_bound_steps": self.lower_bound_steps,
            "gap": self.gap, "transfers": self.ntransfers, "seconds": round(self.seconds, 3),
            "timed_out": self.timed_out,
            "phases": [{"name": p.name, "steps": p.steps, "lower_bound_steps": p.result.bound.steps,
                        "greedy_steps": p.result.greedy_steps, "cegis_iterations": p.result.iterations,
                        "greedy_variant": p.result.variant, "variants_tried": p.result.variants,
                        "learned_groups": p.result.learned_groups, "smt": p.result.smt}
                       for p in self.phases],
            "composed": self.composed,
            **self.detail,
        }


def _rows(sched: Schedule, op: int, step0: int) -> np.ndarray:
    return np.stack([sched.src, sched.dst, sched.step + step0, sched.chunk,
                     np.full(len(sched), op, np.int64)], axis=1).astype(np.int64)


def reducescatter_task(net: Network, nranks: int, k: int) -> Task:
    return allgather_task(nranks, k, fanout_one=True)


def solve_phase(net: Network, task: Task, *, deadline: float, progress: Progress | None,
                pod_ranks: int | None, use_smt: bool, bound: StepBound | None = None, variants: int = 1,
                score=None) -> tuple[TaskResult, dict | None]:
    """One dissemination task, flat or through hierarchical composition (:mod:`.compose`)."""
    from hccc.compiler.synth import compose

    plan = compose.plan_pods(net, task, pod_ranks)
    if plan is not None:
        return compose.synthesize_composed(net, task, plan, deadline=deadline, progress=progress,
                                           use_smt=use_smt)
    return synthesize_task(net, task, deadline=deadline, progress=progress, use_smt=use_smt, bound=bound,
                           variants=variants, score=score), None


def synthesize(topo: Topology | Network, collective: str, *, root: int = 0, chunks_per_rank: int = 1,
               time_limit: float = 60.0, progress: Progress | None = None, pod_ranks: int | None = None,
               use_smt: bool = True, bandwidth_bound_bytes: float | None = None, variants: int = 1,
               score: Callable[[str, np.ndarray], float] | None = None, method: str = "search",
               tree_score: Callable | None = None, known_bound_seconds: float | None = None,
               engine: Callable | None = None) -> SynthResult:
    """Synthesise ``collective`` on ``topo`` (see the module docstring).

    ``time_limit`` is shared by all phases (anytime: the best schedule so far comes back).
    ``pod_ranks``: compose hierarchically over pods of this many ranks (None: automatic, flat up to
    64 ranks). ``bandwidth_bound_bytes``: also report ForestColl's cut bound for that buffer size.
    ``variants``/``score``: try that many greedy variants per phase and keep, among those with the
    fewest steps, the one ``score(collective, rows)`` rates lowest (lower is better, e.g. a simulated
    time), ``rows`` being the ``(src, dst, step, chunk, op)`` program of the phase ("allgather",
    "reducescatter"; for AllReduce the ReduceScatter candidates are rated as whole "allreduce"
    programs with the AllGather half already chosen). Flat synthesis only.

    ``method``: ``"search"`` (the above), or ``"trees"``: the bandwidth-optimal tree packing of
    :mod:`.forest` (AllGather, ReduceScatter, AllReduce; its chunk count is its own, and
    ``tree_score(collective, rows, chunks_per_rank, channels, warps)`` picks among its shapes).
    ``detail["method"]`` says which ran. ``known_bound_seconds``: the bandwidth bound for
    ``bandwidth_bound_bytes`` where the caller has it already (the tree packing's, before a search
    on the same cluster): taken as it is, not computed again. ``engine(rows)``: the limits of
    the engine the tree packing's program is for (:func:`.forest.synthesize_trees`).
    """
    t0 = clock.now()
    coll = collective.lower()
    if coll not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r} (expected one of {', '.join(COLLECTIVES)})")
    net = topo if isinstance(topo, Network) else network_from_topology(topo)
    n, k = net.nranks, int(chunks_per_rank)
    if method not in METHODS:
        raise ValueError(f"unknown synthesis method {method!r} (expected one of {', '.join(METHODS)})")
    why = unreachable(net, coll, root, None if isinstance(topo, Network) else topo.rank_node)
    if why:
        raise ValueError(why)
    if method == "trees" and n == 1:
        method = "search"            # one GPU: nothing to pack; the search writes its empty program
    if method == "trees":
        return _by_trees(topo, net, coll, root, time_limit, bandwidth_bound_bytes, tree_score, t0, engine)
    check_synth_size(n, k)
    detail: dict = {}
    if known_bound_seconds is not None and bandwidth_bound_bytes:
        detail["cut_bound_seconds"] = float(known_bound_seconds)
    elif bandwidth_bound_bytes and coll != "alltoall":
        # before the search, within a share of the time limit (the packing LP's bound is valid
        # when stopped): the search then has the rest, and the whole stays within the limit
        detail["cut_bound_seconds"] = bandwidth_cut_bound(net, coll, n, k, root, bandwidth_bound_bytes,
                                                          time_limit=float(time_limit) * BOUND_SHARE)
    if coll == "alltoall":
        return _alltoall(net, k, t0, time_limit, bandwidth_bound_bytes, root)
    search = _Search(net, k, t0 + float(time_limit), progress, pod_ranks, use_smt, variants, score)
    if coll in ("allgather", "broadcast"):
        rows, lb, composed = search.dissemination(coll, root)
    else:
        rows, lb, composed = search.reduction(coll, detail)
    steps = int(rows[:, 2].max()) + 1 if rows.size else 0
    detail["method"] = "search"
    return SynthResult(coll, n, k, root if coll == "broadcast" else None, rows, steps, lb, search.phases,
                       clock.now() - t0, net.name,
                       any(p.result.timed_out for p in search.phases), composed, detail)


def _by_trees(topo, net: Network, coll: str, root: int, time_limit: float, bandwidth_bound_bytes: float | None,
              tree_score: Callable | None, t0: float, engine: Callable | None = None) -> SynthResult:
    """:func:`synthesize` by the tree packing (:mod:`.forest`, :mod:`.broadcast_trees`)."""
    from hccc.compiler.synth.forest import resident_blocks, synthesize_trees
    from hccc.compiler.synth.packing import pair_bandwidth
    from hccc.compiler.synth.trees import TREE_COLLECTIVES

    n = net.nranks
    if coll not in TREE_COLLECTIVES:
        raise ValueError(f"tree packing builds {', '.join(TREE_COLLECTIVES)}, not {coll}")
    pair_bw = None if isinstance(topo, Network) else pair_bandwidth(topo)
    max_blocks = None if isinstance(topo, Network) else resident_blocks(topo.rank_vendor)
    if coll == "broadcast":
        from hccc.compiler.synth.broadcast_trees import synthesize_broadcast_trees
        prog = synthesize_broadcast_trees(net, root, pair_bw=pair_bw, time_limit=time_limit, max_blocks=max_blocks,
                                          total_bytes=float(bandwidth_bound_bytes or (1 << 30)))
    else:
        prog = synthesize_trees(net, coll, pair_bw=pair_bw, total_bytes=float(bandwidth_bound_bytes or (1 << 30)),
                                time_limit=time_limit, score=tree_score, max_blocks=max_blocks,
                                resident=None if isinstance(topo, Network) else
                                lambda warps: resident_blocks(topo.rank_vendor, warps), engine=engine)
    res = SynthResult(coll, n, prog.chunks_per_rank, root if coll == "broadcast" else None, prog.rows, prog.steps,
                      prog.lower_bound_steps, [], clock.now() - t0, net.name, False, None, prog.detail, prog.loops)
    if bandwidth_bound_bytes:
        known = prog.detail.get("cut_seconds_per_rank_byte", {})
        res.detail["cut_bound_seconds"] = (known[coll] * float(bandwidth_bound_bytes) / n if coll in known else
                                           bandwidth_cut_bound(net, coll, n, res.chunks_per_rank, root,
                                                               bandwidth_bound_bytes))
    return res


def _alltoall(net: Network, k: int, t0: float, time_limit: float, bandwidth_bound_bytes: float | None,
              root: int) -> SynthResult:
    """:func:`synthesize`'s AllToAll (:mod:`.alltoall`): the routing, then the cut bound, each within
    its share of one deadline."""
    from hccc.compiler.synth.alltoall import BOUND_SHARE as A2A_BOUND_SHARE, synthesize_alltoall

    n = net.nranks
    limit = Deadline(t0 + float(time_limit))
    # the cut bound in bytes after the routing: a share of what is left then, the emission after it
    sched, lb, detail = synthesize_alltoall(net, k, deadline=limit.share(1 - A2A_BOUND_SHARE), must_end=limit)
    rows = _rows(sched, RECV, 0)
    steps = int(rows[:, 2].max()) + 1 if rows.size else 0
    if bandwidth_bound_bytes:
        t_cut = clock.now()
        seconds, cut = alltoall_cut_bound_seconds(net, float(bandwidth_bound_bytes),
                                                  deadline=limit.share(A2A_BOUND_SHARE))
        detail["cut_bound_seconds"], detail["cut_bound_set"] = seconds, cut
        detail.setdefault("phase_seconds", {})["cut_bound"] = round(clock.now() - t_cut, 3)
    timed_out = bool(detail.pop("timed_out", False))
    detail["method"] = "search"
    return SynthResult("alltoall", n, k, None, rows, steps, lb, [], clock.now() - t0, net.name,
                       timed_out, None, detail)


class _Search:
    """:func:`synthesize`'s step search of one collective: its phases (:func:`solve_phase`), each
    scored by ``score`` where given, collected in :attr:`phases`."""

    def __init__(self, net: Network, k: int, deadline: float, progress, pod_ranks, use_smt: bool, variants: int,
                 score):
        self.net, self.k, self.deadline, self.progress = net, k, deadline, progress
        self.pod_ranks, self.use_smt, self.variants, self.score = pod_ranks, use_smt, variants, score
        self.phases: list[Phase] = []

    def scorer(self, phase: str, make_rows):
        if self.score is None:
            return None
        return lambda sc: self.score(phase, make_rows(sc))

    def solve(self, net: Network, task: Task, deadline: float, score, bound: StepBound | None = None):
        return solve_phase(net, task, deadline=deadline, progress=self.progress, pod_ranks=self.pod_ranks,
                           use_smt=self.use_smt, bound=bound, variants=self.variants, score=score)

    def dissemination(self, coll: str, root: int):
        """AllGather or Broadcast: one phase. Rows, step bound, composition."""
        n, k = self.net.nranks, self.k
        task = allgather_task(n, k) if coll == "allgather" else broadcast_task(n, root, k)
        res, composed = self.solve(self.net, task, self.deadline, self.scorer(coll, lambda sc: _rows(sc, RECV, 0)))
        self.phases.append(Phase(coll, RECV, 0, res))
        return _rows(res.schedule, RECV, 0), res.bound.steps, composed

    def reduction(self, coll: str, detail: dict):
        """ReduceScatter (the AllGather of the transposed network, reversed), or AllReduce: the
        AllGather half first, so that the ReduceScatter variant is chosen for the whole AllReduce
        program (the phases overlap when the program runs). Rows, step bound, composition."""
        net, n, k = self.net, self.net.nranks, self.k
        tnet = net.transposed()
        rs_task = allgather_task(n, k, fanout_one=True)
        rs_bound = step_lower_bound(tnet, allgather_task(n, k))
        ag = composed_ag = None
        if coll == "allreduce":
            half = clock.now() + max(0.0, self.deadline - clock.now()) / 2
            ag, composed_ag = self.solve(net, allgather_task(n, k), half,
                                         self.scorer("allgather", lambda sc: _rows(sc, RECV, 0)))

            def combined(sc):
                r = sc.reversed()
                return np.concatenate([_rows(r, RRC, 0), _rows(ag.schedule, RECV, r.nsteps)])

            rs_score = self.scorer("allreduce", combined)
        else:
            rs_score = self.scorer("reducescatter", lambda sc: _rows(sc.reversed(), RRC, 0))
        rs, composed = self.solve(tnet, rs_task, self.deadline, rs_score, bound=rs_bound)
        rs_sched = rs.schedule.reversed()
        self.phases.append(Phase("reducescatter", RRC, 0, rs))
        rows = _rows(rs_sched, RRC, 0)
        lb = rs.bound.steps
        if ag is not None:
            T = rs_sched.nsteps
            self.phases.append(Phase("allgather", RECV, T, ag))
            rows = np.concatenate([rows, _rows(ag.schedule, RECV, T)])
            lb += ag.bound.steps
            detail["any_schedule_bound"] = max(rs.bound.steps, ag.bound.steps)
            if composed is not None or composed_ag is not None:
                composed = {"reducescatter": composed, "allgather": composed_ag}
        return rows, lb, composed


def bandwidth_cut_bound(net: Network, collective: str, n: int, k: int, root: int, total_bytes: float, *,
                        time_limit: float | None = None) -> float:
    """The bandwidth bound in seconds for ``total_bytes`` (the full buffer: AllGather's output,
    ReduceScatter's input, the AllReduce/Broadcast buffer): the cut bound, for AllGather and
    ReduceScatter the packing bound where it is tighter (its LP given at most ``time_limit``
    seconds); see :func:`~hccc.compiler.synth.bounds.collective_bound_seconds`."""
    return collective_bound_seconds(net, collective, n, k, root, total_bytes, time_limit=time_limit)
