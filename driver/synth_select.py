"""The selection loop of synthesis: one place where a program is made, compared and chosen for
each message size, behind an :class:`Evaluator` (how candidates are timed: the alpha-beta
simulator, :class:`Simulations`, is the one ``hccc synth`` and :func:`hccc.synthesize` wire in).

Stages, in order, per size (docs/architecture.md, *Synthesis*):

1. **method**: ``auto`` resolves by the buffer per rank (:func:`choose_method`);
2. **make**: one selection loop (:class:`_Choices`, the
   :class:`~hccc.compiler.synth.selection.SelectionLoop` the tree packing's own choice runs too):
   the tree packing or the step search (:func:`hccc.compiler.synth.synthesize`), its candidates
   scored by the evaluator (:func:`tree_simulated_score`, :func:`simulated_score`), and under
   ``auto`` every other candidate: the trees first where the search was picked, hccc's generators
   that fit the cluster (:mod:`hccc.compiler.synth.classic`), the default program where a size
   was given, the search (greedy beside programs in hand; after trees that fall short of
   :data:`~hccc.compiler.synth.plan.AUTO_SEARCH_BELOW`);
3. **fit**: channels (:func:`_fit_channels`) and slices (:func:`_thin_slices`) by the evaluator;
4. **compare**: every candidate timed by the same evaluator at the size asked, the fastest kept
   (:func:`ranked`), the runner-up and its ratio reported; with ``--band`` and no ``--size``
   each also timed at every size of the band and the least worst ratio kept (:func:`_band`);
   ``--for`` keeps only what that engine exports (:mod:`hccc.synth_engines`);
5. **emit**: the choices as a :class:`~hccc.compiler.synth.plan.SynthPlan`, the text by
   :func:`hccc.compiler.synth.emit.to_rccl`.

:func:`synthesize_programs` runs the whole for every size of a :class:`~hccc.compiler.synth.plan.SynthOptions`,
sharing its time limit (one work-clock deadline, passed explicitly to every phase).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from hccc.util import clock
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.util.limits import printable
from hccc.util.plural import plural
from hccc.util.sizes import format_size
from hccc.compiler.synth.plan import SynthOptions, SynthPlan
from hccc.compiler.synth.selection import BAND_RULE, BandScore, SelectionLoop

#: ``--method auto`` packs trees from this many bytes per rank (the bandwidth regime: chunks large
#: enough to pipeline); below it the step search, whose few rounds pay fewer latencies
TREES_MIN_PER_RANK = 256 << 10
#: the step search ``--method auto`` adds gets half as long as the tree program took to make (at
#: least this many seconds): on large clusters it rarely comes near the trees, and it must not
#: multiply the command's time for that
AUTO_SEARCH_LEAST_S = 2.0
#: where ``auto`` picks the step search (the latency regime) and the tree packing builds the
#: collective, the trees' program is made first within this share of the time left, the rest left
#: to the generators' programs and the greedy search: on four 8-GPU A100 nodes at 64 KiB
#: (AllReduce) the packing's program is made in 2-9 s (1.6 s on an idle machine) and runs at
#: 12.7 us, where the search given the whole 30 s limit ran into it and wrote 32.2 us
TREES_BESIDE_SHARE = 0.5
#: for an engine's AllReduce on more GPUs than this, the tree packing's program is made within
#: :data:`TREES_BESIDE_SHARE` of the time, the rest left to the reduce and broadcast trees of a few
#: roots and the generators: on 64 GPUs (ho_8x8_switch, the MSCCL executor, 60 s under load) the
#: packing took 45 s and wrote 0.35 of the cut bound, leaving the roots' trees unsimulated (0.80
#: within the share); on 24 GPUs (ho_3x8_switch) the share cut the packing's engine fitting short
#: (0.73 of the bound before, the roots' trees' 0.68 kept)
ROOT_TREES_SHARE_ABOVE = 32


def _root_trees_asked(opts) -> bool:
    """Whether the selection makes the reduce and broadcast trees of a few roots
    (:mod:`hccc.compiler.synth.root_trees`): for an AllReduce written for an engine with limits of
    its own (``--for msccl|mscclpp``), which cut the packing's streams of every rank's trees. hccc's
    own engine runs the packing's program (0.958 and 0.929 of the cut bound on ho_8x4_mesh and
    ho_8x8_switch, where the roots' trees reach 0.954 and 0.799 for the MSCCL executor), and their
    LP costs 10-20 s on 24-32 GPUs under load, which no other synthesis pays."""
    from hccc.compiler.synth.plan import ENGINE_OF_CHOICE
    return opts.collective == "allreduce" and ENGINE_OF_CHOICE.get(opts.engine) is not None


#: how candidates are compared: the simulated time at the size asked (``--size``, else
#: ``--select-size``) alone, the fastest kept; the report gives every other's ratio to it
SCORE_RULE = "the simulated time at the size asked"
#: how candidates are compared across a band (``--band``, no ``--size``)
BAND_RULE_TEXT = "across the band: " + BAND_RULE
#: ``phase_seconds``' name for the time the default program (a candidate of every ``--size``
#: that differs from ``--select-size``) took to make, before the sizes' selections
DEFAULT_MADE = "default program"
#: the share of the time left that an AllReduce's report gives the packing LP of each half's bound
#: where no tree packing computed it (:meth:`Simulations.optimum_seconds`)
OPTIMUM_SHARE = 0.125


class Evaluator(Protocol):
    """How the selection times candidates at one message size, all by one deadline. ``hccc synth``
    and :func:`hccc.synthesize` use :class:`Simulations` (the alpha-beta simulator); another
    evaluator (a link model, a measurement) plugs in through ``synthesize_programs(evaluator=)``,
    a callable ``(topo, nbytes, deadline) -> Evaluator``. One whose ``ahead`` is true also has
    ``prefetch(result, channels)``, ``run_ahead()`` and ``drop_ahead()`` (see :class:`Simulations`):
    a candidate's timing prepared, run before it is scored, and what was not scored forgotten. One
    with ``guess(result, channels)`` and ``drop_guesses()`` also takes ``seconds(result, channels,
    then=...)``: a timing started beside another, on a guess of what the selection asks next."""

    topo: object
    nbytes: int
    available: bool                 # False: nothing is timed (the first candidate of each kind is kept)
    stopped: bool                   # the deadline stopped a timing
    failed: str | None              # why a program could not be timed

    @property
    def time_left(self) -> float: ...

    def seconds(self, result, channels: int | None) -> float | None: ...

    def least_seconds(self, result) -> float: ...

    def bound_seconds(self, collective: str) -> float: ...

    def optimum_seconds(self, collective: str) -> float: ...

    def tighten(self, collective: str, seconds: float) -> None: ...

    def known(self, result, channels: int | None, key: tuple | None = None) -> float | None: ...

    def channel_steps(self, result) -> list[int]: ...


@dataclass
class Program:
    """One size's outcome: the ``.rccl`` text, the plan it was written from, the report (``hccc
    synth --json``'s fields but ``output``), the result, the verified Algorithm the text
    parses to (:func:`hccc.compiler.synth.emit.to_algorithm`: what the compiler takes, so nothing
    reads the text back), and every candidate the selection scored, as it would have written it
    (its channels and slices fitted; for checks that time them on their own)."""

    text: str
    plan: SynthPlan
    summary: dict
    result: object
    algorithm: object = None
    candidates: list = field(default_factory=list)    # (name, result) of every candidate scored, fastest first


class _QuietPhases:
    """Progress phases that show nothing (the API's default)."""

    @contextlib.contextmanager
    def __call__(self, title: str, limit_s: float | None):
        yield _QuietPhase()


def _refuse(option: str, what: str, value) -> CompileError:
    return CompileError([Diagnostic(f"{option}: expected {what}, got {printable(repr(value), limit=60)}", None)])


def _check_values(opts: SynthOptions) -> None:
    """Each option's type and range as ``hccc synth``'s argument parser checks them (the same
    limits: :mod:`hccc.util.limits`), for the options :func:`hccc.synthesize` is given as Python
    values: a CompileError naming the option as the command spells it."""
    import math
    from numbers import Integral, Real

    from hccc.args import MAX_LIST_ITEMS
    from hccc.util.limits import MAX_OPTION_BYTES, MAX_OPTION_COUNT, MAX_OPTION_SECONDS
    from hccc.compiler.synth.plan import COLLECTIVES

    def count(v, low: int) -> bool:
        return isinstance(v, Integral) and not isinstance(v, bool) and low <= v <= MAX_OPTION_COUNT

    def integer(low: int) -> str:
        return f"an integer from {low} to {MAX_OPTION_COUNT}"

    def size(v) -> bool:
        return isinstance(v, Integral) and not isinstance(v, bool) and 1 <= v <= MAX_OPTION_BYTES

    if not isinstance(opts.collective, str) or opts.collective.lower() not in COLLECTIVES:
        raise _refuse("--collective", f"one of {', '.join(COLLECTIVES)}", opts.collective)
    t = opts.time_limit
    if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(t) or not 0 < t <= MAX_OPTION_SECONDS:
        raise _refuse("--time-limit", f"seconds > 0 and at most {MAX_OPTION_SECONDS:g} (one week)", t)
    if not count(opts.root, 0):
        raise _refuse("--root", integer(0), opts.root)
    for flag, v in (("--chunks-per-rank", opts.chunks_per_rank), ("--pod-size", opts.pod_size)):
        if v is not None and not count(v, 1):
            raise _refuse(flag, integer(1), v)
    if not count(opts.variants, 1):
        raise _refuse("--variants", integer(1), opts.variants)
    if not size(opts.select_size):
        raise _refuse("--select-size", f"a whole number of bytes from 1 to {MAX_OPTION_BYTES}", opts.select_size)
    if not isinstance(opts.sizes, tuple) or not all(size(v) for v in opts.sizes):
        raise _refuse("--size", f"whole numbers of bytes from 1 to {MAX_OPTION_BYTES}", opts.sizes)
    if not isinstance(opts.band, tuple) or not all(size(v) for v in opts.band):
        raise _refuse("--band", f"whole numbers of bytes from 1 to {MAX_OPTION_BYTES}", opts.band)
    for flag, v in (("--size", opts.sizes), ("--band", opts.band)):
        if len(v) > MAX_LIST_ITEMS:
            raise CompileError([Diagnostic(f"{flag}: at most {MAX_LIST_ITEMS} sizes, got {len(v)}", None)])
    for flag, v in (("--no-smt", opts.smt), ("--no-sim-select", opts.sim_select), ("--exact", opts.exact)):
        if not isinstance(v, bool):
            raise _refuse(flag, "True or False", v)
    a = opts.auto_search_below
    if isinstance(a, bool) or not isinstance(a, Real) or not math.isfinite(a) or a < 0:
        raise _refuse("auto_search_below", "a fraction of the bound >= 0", a)


def check_options(topo, opts: SynthOptions) -> SynthOptions:
    """``opts`` checked against ``topo`` before any work (a CompileError naming the option), with
    ``auto`` resolved to the search where a search-only option was given."""
    from hccc.util.limits import check_synth_size
    from hccc.compiler.synth.emit import dsl_collective
    from hccc.compiler.synth.plan import ENGINE_CHOICES, ENGINE_OF_CHOICE, METHOD_CHOICES

    _check_values(opts)
    coll = opts.collective.lower()
    if opts.method not in METHOD_CHOICES:
        raise CompileError([Diagnostic(f"unknown method {opts.method!r} (expected one of {', '.join(METHOD_CHOICES)})",
                                       None)])
    if opts.engine is not None and opts.engine not in ENGINE_CHOICES:
        raise CompileError([Diagnostic(f"unknown engine {opts.engine!r} (expected one of {', '.join(ENGINE_CHOICES)})",
                                       None)])
    if opts.root and coll != "broadcast":
        raise CompileError([Diagnostic(f"--root applies to --collective broadcast, not {coll}", None)])
    search_only = opts.search_only
    if search_only and opts.method == "trees":
        raise CompileError([Diagnostic(f"{search_only[0]} applies to --method search (the tree packing picks "
                                       "its own chunks and needs no pods)", None)])
    method = "search" if search_only and opts.method == "auto" else opts.method
    if coll == "broadcast" and not 0 <= opts.root < topo.nranks:
        raise CompileError([Diagnostic(f"--root {opts.root} is not a rank of '{topo.name}' "
                                       f"(ranks 0..{topo.nranks - 1})", None)])
    try:
        check_synth_size(topo.nranks, opts.chunks_per_rank or 1)   # before any work is sized by it
    except ValueError as exc:
        raise CompileError([Diagnostic(f"--chunks-per-rank: {exc}", None)]) from None
    dsl_collective(coll)  # refuse early what ResCCLang cannot express
    sizes = list(opts.sizes)
    twice = sorted({s for s in sizes if sizes.count(s) > 1})
    if twice:
        raise CompileError([Diagnostic(f"--size: {format_size(twice[0])} is given twice (one program per size)", None)])
    band = list(opts.band)
    twice = sorted({s for s in band if band.count(s) > 1})
    if twice:
        raise CompileError([Diagnostic(f"--band: {format_size(twice[0])} is given twice", None)])
    if band and sizes:
        raise CompileError([Diagnostic("--band applies without --size (with --size each program is scored at its "
                                       "own size alone)", None)])
    if band and method != "auto":
        raise CompileError([Diagnostic(f"--band compares every candidate: it applies to --method auto, not {method}",
                                       None)])
    if method == "trees":
        from hccc.compiler.synth.trees import TREE_COLLECTIVES
        if coll not in TREE_COLLECTIVES:
            raise CompileError([Diagnostic(f"--method trees builds {', '.join(TREE_COLLECTIVES)}, "
                                           f"not {coll}", None)])
    return replace(opts, collective=coll, method=method, cluster_name=opts.cluster_name or topo.name,
                   engine=None if opts.engine is None else ENGINE_OF_CHOICE[opts.engine])


def synthesize_programs(topo, opts: SynthOptions, *, deadline: clock.Deadline | None = None,
                        evaluator: Callable | None = None, phases=None) -> list[Program]:
    """One :class:`Program` per size of ``opts`` (see the module docstring), all by ``deadline``
    (default: ``opts.time_limit`` from now). ``evaluator``: ``(topo, nbytes, deadline) ->``
    :class:`Evaluator` (default :class:`Simulations`); ``phases``: ``(title, limit_s) ->`` a context
    manager yielding an object with ``update(text)`` (progress; default: none)."""
    deadline = deadline or clock.Deadline.after(opts.time_limit)
    opts = check_options(topo, opts)
    make_eval = evaluator or Simulations
    phases = phases or _QuietPhases()
    sizes = list(opts.program_sizes)
    # where a size's program is not the default one, the default (``hccc synth`` without
    # ``--size``) is a candidate too: made once, in a share of the time like a size's
    made: list = []
    shares = len(sizes) + 1
    needs_default = opts.method == "auto" and topo.nranks <= SIMULATE_MAX_RANKS and \
        any(s != opts.select_size for s in sizes)

    def default():
        if not made:
            until = clock.now() + max(0.0, deadline.left()) / shares
            made.append(_select(opts, topo, opts.select_size, until, _QuietPhase(), None, make_eval)[0])
        return made[0]

    made_s = 0.0
    if needs_default:
        t0 = clock.now()
        default()       # first, in its share: each size's selection then has its own share whole
        made_s = clock.now() - t0
    programs = []
    for i, size in enumerate(sizes):
        # every program its share of the time left
        share = max(0.0, deadline.left()) / (len(sizes) - i)
        programs.append(_program(opts, topo, size, clock.now() + share, phases,
                                 default if needs_default else None, make_eval))
    if needs_default:       # where that time went: said with the first program's phases
        programs[0].summary["phase_seconds"][DEFAULT_MADE] = round(made_s, 3)
    return programs


#: how synthesis events read in the progress display
EVENTS = {"bound": "lower bound {steps} steps",
          "greedy": "greedy schedule: {steps} steps",
          "cegis": "CEGIS iteration {iteration}: checkpoint step {checkpoint}, {learned} groups learned, {steps} steps",
          "minimise": "z3 shortened the schedule to {steps} steps (window {window})",
          "pod": "pod of {ranks} GPUs: {steps} steps",
          "select": "simulator chose greedy variant {variant}",
          "inter-pod": "inter-pod schedule over {pods} pods: {steps} steps"}


def describe_event(event: str, info: dict) -> str:
    try:
        return EVENTS.get(event, event).format(**info)
    except (KeyError, IndexError):
        return event


def simulated_score(topo, nbytes: int = 1 << 30, *, root: int = 0, chunks_per_rank: int = 1,
                    deadline: float | None = None, ceiling: float | None = None):
    """``score(collective, rows)`` for :func:`hccc.compiler.synth.synthesize`: the completion time of
    a candidate program in the alpha-beta simulator on ``topo`` at ``nbytes`` (None when the
    simulator is not available). With a ``deadline`` (a work-clock time (:func:`hccc.util.clock.now`)), a
    candidate the time left cannot simulate scores infinity (the search keeps its first). With a
    ``ceiling`` (seconds), a candidate whose bytes over the capacities already take that long
    (:func:`hccc.runtime.simulator.least_time`) is not simulated: it scores that least time."""
    try:
        from hccc.runtime.simulator import SimulationStopped, least_time, simulate, simulate_by
    except ImportError:
        return None
    import numpy as np

    from hccc.compiler.frontend.algorithm import Algorithm, Collective, Header
    from hccc.compiler.passes.build import build_program

    def score(phase: str, rows) -> float:
        coll = Collective.parse(phase)
        if coll is None:
            return 0.0
        if deadline is not None and clock.now() >= deadline:
            return float("inf")
        head = Header(topo.nranks, coll, f"candidate_{phase}", root=root if coll.rooted else 0,
                      chunks_per_rank=chunks_per_rank)
        ir = build_program(Algorithm.from_rows(head, np.asarray(rows).tolist()))
        if ceiling is not None:
            least = least_time(ir, topo, int(nbytes))
            if least >= ceiling:
                return least
        if deadline is None:
            return float(simulate(ir, topo, int(nbytes), slice_bytes="auto").time_s)
        try:
            return float(simulate_by(deadline, ir, topo, int(nbytes), slice_bytes="auto").time_s)
        except SimulationStopped:
            return float("inf")

    return score


def tree_simulated_score(sims: "Simulations"):
    """``score(collective, rows, chunks_per_rank, channels, warps)`` for the tree packing: simulated
    seconds of a candidate program with its channels and warps per block, recorded in ``sims`` (None when the simulator
    is not available; a candidate already simulated is not simulated again). Infinity, not
    simulated, past the deadline, or once a candidate ran within :data:`FIT_TOLERANCE` of the
    collective's bound (:meth:`Simulations.bound_seconds`: no other shape can gain more than that;
    the bound is computed only then). An AllGather or ReduceScatter candidate short of
    :data:`THIN_SLICES_BELOW` of the bound is scored at the slices it would be written with
    (:func:`_thinner`; until :data:`THIN_CHOOSE_MOST` such tries ran a simulation, and only
    where it trails the best by less than :data:`THIN_REACH` times what they gained)."""
    if not sims.available:
        return None
    from hccc.compiler.synth.collectives import SynthResult

    best: list[float] = []
    thinned: dict[tuple, float] = {}     # candidates tried at smaller slices -> their score
    gains: list[float] = []              # what each try that ran a simulation gained (a share of its time)

    def candidate(collective: str, rows, chunks_per_rank: int, channels: int, warps: int):
        return SynthResult(collective, sims.topo.nranks, int(chunks_per_rank), None, rows, 0, 0, [], 0.0,
                           sims.topo.name, detail={"channels": int(channels), "warps": int(warps)})

    def score(collective: str, rows, chunks_per_rank: int, channels: int, warps: int) -> float:
        cand = candidate(collective, rows, chunks_per_rank, channels, warps)
        base = sims._key(cand)                       # the rows hashed once, for every lookup below
        key = base + (int(channels),)
        if key in thinned:
            return thinned[key]
        known = sims.known(cand, int(channels), base)
        if known is not None:
            return known
        if best and min(best) <= sims.bound_seconds(collective) * (1 + FIT_TOLERANCE):
            sims.shapes_not_needed += 1
            return float("inf")
        def thin_try(t: float | None) -> bool:
            # short of the bound, where smaller slices may fill its pipelines faster: scored at the
            # slices it would be written with (a candidate that trails at hccc's default may lead
            # at its own; none is tried that cannot beat the best whatever its slices, nor one
            # trailing it by more than smaller slices have gained so far, half as much again).
            # ``t`` None: its time not known yet, the rules that read it taken to pass
            return collective in THIN_WHILE_CHOOSING and len(gains) < THIN_CHOOSE_MOST and \
                (t is None or sims.bound_seconds(collective) < t * THIN_SLICES_BELOW) and \
                not (best and min(best) <= sims.least_seconds(cand)) and \
                not (t is not None and best and gains and t > min(best) * (1 + THIN_REACH * max(gains)))

        def guess(estimate: float | None, took: float) -> None:
            # the default's time as its shorter samples tell it (None: simulated whole, nothing
            # known yet): the smaller slices that time would try first, started beside its longest
            # sample or its whole call (taken by _thinner where they are the ones it tries; stopped
            # where not)
            if thin_try(estimate):
                policy = _thin_first(cand, sims, estimate, took)
                if policy is not None:
                    sims.guess(_sliced(cand, policy), int(channels))

        guessing = collective in THIN_WHILE_CHOOSING and len(gains) < THIN_CHOOSE_MOST and hasattr(sims, "guess")
        t = sims.seconds(cand, int(channels), then=guess) if guessing else sims.seconds(cand, int(channels))
        try:
            if t is None:
                return float("inf")
            if thin_try(t):
                ran = len(sims.times)
                thin = _thinner(cand, sims, t, int(channels))
                if len(sims.times) > ran:
                    gains.append(0.0 if thin is None else 1.0 - thin / t)
                t = thinned[key] = t if thin is None else thin
        finally:
            getattr(sims, "drop_guesses", lambda: None)()
        best.append(t)
        return t

    def settled(collective: str, floor_s: float = 0.0, slack: bool = True) -> bool:
        """A candidate ran within :data:`FIT_TOLERANCE` of the bound, or of ``floor_s`` (the least
        time of the next candidate: its packing's time in the link model, which no program of that
        packing beats; ``slack`` False: no faster than it): that one gains at most the tolerance
        (nothing), so it is not simulated (nor built)."""
        if not best:
            return False
        return min(best) <= sims.bound_seconds(collective) * (1 + FIT_TOLERANCE) or \
            min(best) <= float(floor_s) * ((1 + FIT_TOLERANCE) if slack else 1.0)

    def prefetch(collective: str, rows, chunks_per_rank: int, channels: int, warps: int) -> None:
        """A candidate the selection will score first, prepared now (where the evaluator can:
        ``prefetch``), for ``run_ahead`` to simulate before the selection runs: its score then
        takes that time instead of simulating it."""
        sims.prefetch(candidate(collective, rows, chunks_per_rank, channels, warps), int(channels))

    score.settled = settled
    if getattr(sims, "ahead", False):
        score.prefetch = prefetch
        score.run_ahead = sims.run_ahead
    return score


def choose_method(method: str, collective: str, nranks: int, nbytes: int) -> str:
    """The method ``--method`` asks for at a buffer of ``nbytes`` (see :data:`TREES_MIN_PER_RANK`; a
    Broadcast packs trees on at most :data:`hccc.compiler.synth.broadcast_trees.MAX_RANKS` GPUs)."""
    from hccc.compiler.synth.broadcast_trees import MAX_RANKS as BROADCAST_TREE_RANKS
    from hccc.compiler.synth.trees import TREE_COLLECTIVES

    if method != "auto":
        return method
    if collective == "broadcast" and nranks > BROADCAST_TREE_RANKS:
        return "search"
    if collective in TREE_COLLECTIVES and nbytes >= TREES_MIN_PER_RANK * max(1, nranks):
        return "trees"
    return "search"


def _allreduce_bounds(sims: "Simulations", result=None) -> dict:
    """AllReduce's bound valid for any schedule (the larger of the cut and traffic bounds,
    docs/bounds.md) and the optimum of ReduceScatter followed by AllGather, in seconds, at
    ``sims.nbytes``: the sum of the two halves' bounds as ``hccc synth`` reports them for
    ReduceScatter and AllGather, the packing bound where it is tighter than the cut bound (each
    computed once per command, :meth:`Simulations.optimum_seconds`; a tree ``result`` carries
    its halves' packings' bounds, so their LPs are not solved again)."""
    known = (result.detail.get("cut_seconds_per_rank_byte") or {}) if result is not None else {}
    per_rank = float(sims.nbytes) / max(1, sims.topo.nranks)
    for half, seconds in known.items():
        sims.tighten(half, float(seconds) * per_rank)
    return {"allreduce_bound_seconds": sims.bound_seconds("allreduce"),
            "rs_ag_seconds": sims.optimum_seconds("reducescatter") + sims.optimum_seconds("allgather")}


def _bandwidth_bound(result, nbytes: int) -> dict:
    """ForestColl's cut bound for the collective's full buffer of ``nbytes``, also as nccl-tests busbw."""
    from hccc.runtime.busbw import busbw_factor

    t = float(result.detail["cut_bound_seconds"])
    n = result.nranks
    factor = busbw_factor(result.collective, n)
    out = {"bytes": int(nbytes), "seconds": t, "busbw_GBps": (nbytes / t / 1e9 * factor) if t > 0 else 0.0}
    if "cut_bound_set" in result.detail:   # AllToAll: the cut that attains the bound
        out["cut"] = result.detail["cut_bound_set"]
    return out


class _QuietPhase:
    """A progress phase that shows nothing (the default program made beside a size's)."""

    def update(self, detail: str) -> None:
        pass


@dataclass
class Choice:
    """One candidate of a size's selection (:func:`_select`): its name (``trees``, ``search``, a
    classic generator of :mod:`hccc.compiler.synth.classic`, ``default``), the program, its
    simulated fraction of the bound at the size (None: not scored), the work-clock seconds it took
    to make and score, and why it was dropped (None: it was scored)."""

    name: str
    result: object
    fraction: float | None
    seconds: float = 0.0
    dropped: str | None = None

    def as_dict(self, best: float | None) -> dict:
        """The report's row: ``ratio`` is this candidate's simulated time over the best one's."""
        return {"candidate": self.name, "fraction_of_bound": self.fraction, "seconds": round(self.seconds, 3),
                "ratio": (best / self.fraction) if best and self.fraction else None, "dropped": self.dropped}


def ranked(choices: list) -> list:
    """The scored choices, fastest first (ties: the one made first): the selection's one rule,
    the asked size's simulated time alone (:data:`SCORE_RULE`)."""
    scored = [(i, c) for i, c in enumerate(choices) if c.fraction is not None]
    return [c for _, c in sorted(scored, key=lambda ic: (-ic[1].fraction, ic[0]))]


def _compare_all(opts, forced: bool, simulated: bool, sims) -> bool:
    """Whether the selection compares every candidate (``--method auto``, the simulator there to
    time them) or keeps the method's program."""
    return opts.method == "auto" and not forced and simulated and opts.sim_select and sims.available


def _trees_fit(collective: str, nranks: int) -> bool:
    from hccc.compiler.synth.broadcast_trees import MAX_RANKS as BROADCAST_TREE_RANKS
    from hccc.compiler.synth.trees import TREE_COLLECTIVES
    return collective in TREE_COLLECTIVES and nranks > 1 and not (collective == "broadcast"
                                                                 and nranks > BROADCAST_TREE_RANKS)


def _select(opts, topo, size: int, deadline: float, phase, method: str | None = None, make_eval=None,
            default=None):
    """The program for ``size`` chosen by the simulator: ``(result, fraction, bound, tried, sims,
    simulated, choices)``. ``method`` given: that method's program alone; else, under ``--method
    auto``, every candidate (:class:`_Choices`) is made, scored at ``size`` and the fastest kept
    (``default``: a callable giving the default program, a candidate too where given)."""
    make_eval = make_eval or Simulations
    forced = method is not None
    method = method or choose_method(opts.method, opts.collective, topo.nranks, size)
    simulated = topo.nranks <= SIMULATE_MAX_RANKS
    sims = make_eval(topo, size, deadline)
    compare = _compare_all(opts, forced, simulated, sims)
    choices: list[Choice] = []
    loop = _Choices(opts, topo, size, deadline, phase, method, sims, simulated, compare, choices, default)
    loop.run()
    best = ranked(choices)
    kept = best[0] if best else next(c for c in choices if c.result is not None)
    band = None
    if compare and opts.band and not opts.sizes and len(best) > 1:
        # no size asked: every candidate scored at each size of the band, the least worst kept
        phase.update(f"simulating {plural(len(best), 'candidate')} across the band")
        band = _band(best, sims, loop.bound, opts.band, size, deadline)
        kept = band.choices[band.ranked[0].index]
    # the methods tried (a job the deadline left unmade was not tried: the selection lists it)
    tried = {c.name: c.fraction for c in choices if c.name in ("trees", "search", "default")
             and not (c.dropped or "").startswith("not made")}
    return kept.result, kept.fraction, loop.bound, tried, sims, simulated, choices, band


@dataclass
class Band:
    """The selection across a band (``--band``): its sizes, the candidates ranked by
    :data:`~hccc.compiler.synth.selection.BAND_RULE` (:class:`~hccc.compiler.synth.selection.BandScore`,
    best first; ``index``: the :class:`Choice` in ``choices``), and the sizes whose simulations the
    work budget or the deadline stopped, by candidate (``cut``)."""

    sizes: tuple
    ranked: list
    cut: dict
    choices: list


def _band(best: list, sims: "Simulations", bound: dict, sizes: tuple, size: int, deadline: float) -> Band:
    """Every scored candidate (``best``, fastest at ``size`` first) timed at each of ``sizes``
    with the channels and slices it was fitted with at ``size`` (:meth:`Simulations.at_sizes`:
    built and prepared once, simulated per size, each within :data:`BAND_WORK_BUDGET`; at
    ``size`` itself its time from the selection), ranked by
    :func:`~hccc.compiler.synth.selection.band_ranked`."""
    from hccc.compiler.synth.selection import band_ranked

    rows, cut = [], {}
    for c in best:
        at = sims.at_sizes(c.result, int(c.result.detail.get("channels", 1)),
                           [s for s in sizes if s != size], deadline)
        row = [bound["seconds"] / c.fraction if s == size else at.pop(0) for s in sizes]
        rows.append(row)
        missed = [int(s) for s, t in zip(sizes, row) if t is None]
        if missed:
            cut[c.name] = missed
    ranked_ = band_ranked([c.name for c in best], [c.result.ntransfers for c in best], rows)
    return Band(tuple(int(s) for s in sizes), ranked_, cut, list(best))


class _Choices(SelectionLoop):
    """``hccc synth``'s choice among every program it could write at one size, as synthesis's
    selection loop (:class:`hccc.compiler.synth.selection.SelectionLoop`; the tree packing's own
    choice among its programs is the same loop, :class:`hccc.compiler.synth.forest._Selection`):
    each job makes a candidate (:class:`Choice`), scored by ``sims`` at ``size`` (channels fitted,
    smaller slices where they gain); the fastest is kept (:func:`ranked`).

    Jobs, in order: the tree packing where it builds the collective and ``auto`` picked the search
    (first: its program is the one to beat, made in seconds, within :data:`TREES_BESIDE_SHARE` of
    the time left), the method's program (for an engine's AllReduce the tree packing within that
    share too), for AllReduce the reduce and broadcast trees of a few roots
    (:mod:`hccc.compiler.synth.root_trees`, within the engine's limits; each candidate made a job
    of its own), the classic generators that fit the cluster (each a job
    of its own), the default program (what ``hccc synth`` writes without ``--size``, where
    ``default`` gives it), and the step search: beside programs in hand, greedy only (bounded by
    its own work, so the same on every machine: it must not take the whole limit from programs
    already made, as z3's deadline-bound repairs would); after a tree program only where the best
    program reaches less than ``auto_search_below`` of the least time. A job runs while the
    deadline leaves time; those it leaves are listed as not made."""

    def __init__(self, opts, topo, size: int, deadline: float, phase, method: str, sims, simulated: bool,
                 compare: bool, choices: list, default=None):
        self.opts, self.topo, self.size, self.phase, self.method = opts, topo, size, phase, method
        self.sims, self.simulated, self.compare, self.default = sims, simulated, compare, default
        self.bound: dict | None = None
        trees_first = compare and method == "search" and _trees_fit(opts.collective, topo.nranks)
        jobs = [("trees first",)] if trees_first else []
        jobs.append(("method",))
        if compare:
            jobs += ([("root trees",)] if _root_trees_asked(opts) else []) + [("classics",)]
            jobs += ([("default",)] if default is not None else []) + [("search",)]
        super().__init__(jobs, deadline)
        self.candidates = choices

    # ------------------------------------------------------------ the loop's parts
    def affordable(self, job) -> bool:
        return self.sims.time_left > 0

    def cut(self, not_run: int, total: int) -> None:
        for job in self.queue:
            if job[0] == "classic":
                self.candidates.append(Choice(job[1], job[2], None, 0.0, "not simulated: time limit"))
            elif job[0] in ("classics", "root trees", "default", "search"):     # classics: hccc's generators, none made
                self.candidates.append(Choice(job[0], None, None, 0.0, "not made: time limit"))

    def step(self, job) -> None:
        t0 = clock.now()
        kind = job[0]
        if kind == "trees first":
            # the latency regime: the trees' program first, in a share of the time
            self.phase.update("packing trees first: the program the step search must beat")
            try:
                self._first("trees", clock.now() + max(0.0, self.deadline - clock.now()) * TREES_BESIDE_SHARE, t0)
            except CompileError as exc:
                self.candidates.append(Choice("trees", None, None, clock.now() - t0, str(exc).splitlines()[0]))
        elif kind == "method":
            if not any(c.fraction is not None or c.result is not None for c in self.candidates):
                until = self.deadline
                if self.compare and self.opts.engine and self.opts.collective == "allreduce" and \
                        self.method == "trees" and self.topo.nranks > ROOT_TREES_SHARE_ABOVE:
                    # for an engine the packing's AllReduce has a stream of every rank's trees
                    # through every rank, which the engine's limits cut to a few pieces a chunk
                    # (64 GPUs, the MSCCL executor: 0.35 of the cut bound, its packing 45 s of a
                    # 60 s limit under load); the reduce and broadcast trees of a few roots that
                    # fit it get the rest of the time
                    until = clock.now() + max(0.0, self.deadline - clock.now()) * TREES_BESIDE_SHARE
                self._first(self.method, until, t0)
            # else the trees came first in the latency regime: the search is its own job, bounded
        elif kind == "classics":
            self._classics()
        elif kind == "classic":
            choice = Choice(job[1], job[2], None)
            self._score(choice, thin=False)
            choice.seconds = clock.now() - t0
            self.candidates.append(choice)
        elif kind == "default":
            # the choice by size is never worse than the default program: it is a candidate,
            # compared in the same simulator at this size
            self.phase.update("simulating the default program at this size")
            same = self._same_as(self.default())
            if same is not None:        # made here already (the packing gave the same program)
                self.candidates.append(Choice("default", None, None, clock.now() - t0,
                                              f"the same program as the {same} candidate"))
                self.build_s = max(self.build_s, clock.now() - t0)
                return
            fd, d = _default_fraction(self.opts, self.topo, self.size, self.sims, self.bound, self.default())
            self.candidates.append(Choice("default", d if d is not None else self.default(), fd, clock.now() - t0,
                                          None if fd is not None else "not simulated: time limit"))
        elif kind == "search":
            self._search(t0)
        elif kind == "root trees":
            self._root_trees(t0)
        self.build_s = max(self.build_s, clock.now() - t0)

    # ------------------------------------------------------------ the candidates
    def _same_as(self, result) -> str | None:
        """The name of a candidate made already whose program is ``result``'s (its transfers,
        chunks, warps and slices), or None."""
        if not hasattr(self.sims, "_key"):      # an evaluator that does not key programs
            return None
        key = self.sims._key(result)
        return next((c.name for c in self.candidates if c.result is not None and self.sims._key(c.result) == key),
                    None)

    def _make(self, how: str, until: float, smt: bool | None = None, ceiling: float | None = None,
              known_bound: float | None = None):
        from hccc.compiler.synth import synthesize
        from hccc.synth_engines import transfers_check

        opts, topo, size, sims = self.opts, self.topo, self.size, self.sims
        sim = opts.sim_select and self.simulated
        score = None if not sim or opts.variants == 1 or how == "trees" else simulated_score(
            topo, size, root=opts.root, chunks_per_rank=(opts.chunks_per_rank or 1), deadline=until, ceiling=ceiling)

        def progress(event: str, info: dict) -> None:
            self.phase.update(describe_event(event, info))

        try:
            return synthesize(topo, opts.collective, root=opts.root, chunks_per_rank=(opts.chunks_per_rank or 1),
                              time_limit=max(1e-3, until - clock.now()), progress=progress,
                              pod_ranks=opts.pod_size, use_smt=opts.smt if smt is None else smt,
                              variants=opts.variants, score=score, bandwidth_bound_bytes=size, method=how,
                              tree_score=tree_simulated_score(sims) if sim and how == "trees" else None,
                              known_bound_seconds=known_bound,
                              engine=transfers_check(opts.engine, topo) if opts.engine and how == "trees" else None)
        except ValueError as exc:
            raise CompileError([Diagnostic(f"{opts.cluster_name}: {exc}", None)]) from None
        finally:
            # simulations prepared or started for candidates the selection then did not score
            getattr(sims, "drop_ahead", lambda: None)()
            getattr(sims, "drop_guesses", lambda: None)()

    def _score(self, choice: Choice, thin: bool) -> None:
        """``choice``'s program timed at ``size``: channels fitted, its fraction of the bound."""
        res, bound, sims = choice.result, self.bound, self.sims
        res.detail.setdefault("cut_bound_seconds", bound["seconds"])
        if self.simulated:
            self.phase.update(f"fitting channels and simulating the {choice.name} program")
            _fit_channels(res, self.topo, self.size, sims)
        else:
            _cap_channels(res, self.topo)
        f = _simulated_fraction(res, sims, bound["seconds"]) if self.simulated else None
        choice.fraction = _thin_slices(res, sims, bound, f, self.phase) if thin else f
        if choice.fraction is None and self.compare and self.candidates:
            choice.dropped = "not simulated: " + ("time limit" if sims.stopped else sims.failed or "no time")

    def _first(self, how: str, until: float, t0: float) -> None:
        """The first program made: it sets the bound every fraction is taken of."""
        res = self._make(how, until)
        self.bound = bound = _bandwidth_bound(res, self.size)
        if self.opts.collective == "allreduce":
            bound.update(_allreduce_bounds(self.sims, res))
        choice = Choice(how, res, None)
        self._score(choice, thin=True)
        choice.seconds = clock.now() - t0
        self.candidates.append(choice)

    def _classics(self) -> None:
        """The classic generators that fit the cluster, each queued as a job of its own (next)."""
        from hccc.compiler.synth.classic import classic_candidates

        # the step bound the programs made proved (the search's, or the trees' distance bound)
        lb = max((c.result.lower_bound_steps for c in self.candidates if c.result is not None), default=0)
        got = classic_candidates(self.topo, self.opts.collective, self.opts.root, lb)
        for name, why in got.dropped:
            self.candidates.append(Choice(name, None, None, 0.0, why))
        self.queue.extendleft(reversed([("classic", name, res) for name, res in got.made]))

    def _root_trees(self, t0: float) -> None:
        """AllReduce by reduce and broadcast trees of a few roots
        (:mod:`hccc.compiler.synth.root_trees`), within ``--for``'s engine where given: its
        fastest program in the link model, then the next while it is afforded."""
        from hccc.compiler.synth.root_trees import root_tree_candidates
        from hccc.synth_engines import transfers_check

        self.phase.update("reduce and broadcast trees of a few roots")
        engine = transfers_check(self.opts.engine, self.topo) if self.opts.engine else None
        until = self.deadline - min(self.sims.time_left / 2, 3 * self.sims.longest_s)
        made, why = root_tree_candidates(self.topo, deadline=until, engine=engine)
        for w in why:       # root counts the limit left unmade: listed, so the report says it bound
            if w.endswith("not made: time limit"):
                self.candidates.append(Choice(f"root trees ({w.split(' roots')[0]} roots)", None, None, 0.0,
                                              "not made: time limit"))
        if not made:
            self.candidates.append(Choice("root trees", None, None, clock.now() - t0,
                                          "; ".join(why) or "not made: time limit"))
            return
        self.queue.extendleft(reversed([("classic", f"root trees ({len(r.detail['roots'])} roots)", r)
                                        for r in made]))

    def _search(self, t0: float) -> None:
        """The step search beside the programs in hand (the latency regime: bounded), or after a
        tree program that falls short of ``auto_search_below`` of the least time (greedy only)."""
        opts, sims, bound = self.opts, self.sims, self.bound
        best = ranked(self.candidates)
        if self.method == "search" or (opts.band and not opts.sizes):
            # beside the programs in hand, and across a band (whose small sizes the search's few
            # rounds may lead, whatever the programs in hand reach at this one): greedy only (its
            # variants rated by the simulator), a search bounded by its own work, not by seconds, so that every machine writes the
            # same program (z3's repairs and shortening run until a deadline, which would take
            # the whole limit from the programs in hand); the limit is the user's cap, leaving
            # time to simulate the program as long as the longest simulation took
            self.phase.update("the step search (greedy) beside the programs in hand")
            until = self.deadline - min(sims.time_left / 2, 3 * sims.longest_s)
            try:
                other = self._make("search", until, smt=False, known_bound=bound["seconds"])
            except CompileError as exc:
                self.candidates.append(Choice("search", None, None, clock.now() - t0, str(exc).splitlines()[0]))
                return
            choice = Choice("search", other, None)
            self._score(choice, thin=True)
        else:
            if not best or _reach(bound, best[0].fraction) >= opts.auto_search_below:
                return
            # the best program falls short in the simulator: the search too, leaving time to
            # simulate its program as long as the longest simulation took, and searching half as
            # long as the trees took to make; greedy only (its variants rated by the simulator):
            # z3 shortens the schedule by steps, which at this size is not its time. A search
            # program whose bytes over the capacities alone take the best program's time cannot
            # win: it is not simulated (nor are such variants)
            self.phase.update("best program below the bound in the simulator: trying the step search")
            until = min(self.deadline - min(sims.time_left / 2, 3 * sims.longest_s),
                        clock.now() + max(AUTO_SEARCH_LEAST_S, self.candidates[0].seconds / 2))
            best_s = bound["seconds"] / best[0].fraction
            try:
                other = self._make("search", until, smt=False, ceiling=best_s, known_bound=bound["seconds"])
            except CompileError as exc:      # no search schedule within the limits: the others stand
                self.candidates.append(Choice("search", None, None, clock.now() - t0, str(exc).splitlines()[0]))
                return
            choice = Choice("search", other, None)
            if sims.least_seconds(other) >= best_s:
                choice.dropped = "its bytes over the link capacities alone take the best program's time"
            else:
                self._score(choice, thin=True)
        choice.seconds = clock.now() - t0
        self.candidates.append(choice)


def _fit_engine(opts, topo, size: int, deadline: float, phase, result, sims, bound: dict, simulated: bool,
                make_eval=None):
    """``result`` as ``--for``'s engine runs it (:func:`hccc.synth_engines.for_engine`),
    or the step search's program where the engine's exporter refuses it and accepts that one;
    ``(result, fraction of the bound)``. A CompileError, one line saying why, where neither fits."""
    from hccc.synth_engines import ENGINES, export_refusal, for_engine

    phase.update(f"checking the program against {ENGINES[opts.engine]}")
    for_engine(result)
    why = export_refusal(result, topo, opts.engine)
    if why is not None and result.detail.get("method") != "search" and opts.collective != "alltoall":
        phase.update(f"the tree program does not fit {ENGINES[opts.engine]}: trying the step search")
        try:
            other = _select(opts, topo, size, deadline, phase, "search", make_eval)[0]
        except CompileError:
            other = None
        if other is not None:
            for_engine(other)
            if export_refusal(other, topo, opts.engine) is None:
                result, why = other, None
    if why is not None:
        raise CompileError([Diagnostic(f"--for {opts.engine}: no program synthesized for "
                                       f"'{printable(str(opts.cluster_name))}' fits {ENGINES[opts.engine]}: {why}",
                                       None)])
    fraction = _simulated_fraction(result, sims, bound["seconds"]) if simulated else None
    return result, fraction


def _default_fraction(opts, topo, size: int, sims: "Simulations", bound: dict, default):
    """The default program (what ``hccc synth`` writes without ``--size``: ``default``) run at
    ``size`` in the same simulator as the program made for it: its fraction of the bound there,
    and the program with its channels fitted at that size (None, None where it cannot be
    simulated in the time left)."""
    import copy

    if default is None or sims.time_left <= 0:
        return None, None
    d = copy.deepcopy(default)
    d.detail["cut_bound_seconds"] = bound["seconds"]
    _fit_channels(d, topo, size, sims)
    return _simulated_fraction(d, sims, bound["seconds"]), d


def _program(opts: SynthOptions, topo, size: int, deadline: float, phases, default, make_eval) -> "Program":
    """One size's program: selected (:func:`_select`; the default program a candidate too, and
    ``--for``'s engine fitted), verified on the cluster, and written as text with its report."""
    from hccc.compiler.synth import to_algorithm, to_rccl
    from hccc.compiler.cluster.topology_check import check_on_topology
    from hccc.compiler.passes.verify import verify

    from hccc.compiler.synth.budget import closing_seconds, least_transfers, wall_seconds

    title = f"{opts.collective} on {printable(str(opts.cluster_name))} ({plural(topo.nranks, 'GPU')})"
    if len(opts.sizes) > 1:
        title += f" for {format_size(size)}"
    # the proof and the text cannot stop half-way: the search and the simulations leave them their
    # predicted time (compiler/synth/budget.py)
    least = least_transfers(opts.collective, topo.nranks, opts.chunks_per_rank or 1)
    closing = closing_seconds(least, opts.collective)
    if not opts.engine:
        from hccc.synth_engines import plan_check_seconds
        closing += plan_check_seconds(least)       # the engines' checks of the program written
    _refuse_unstoppable(opts, topo, size, deadline)
    started = clock.now()
    with phases(title, opts.time_limit if len(opts.sizes) <= 1 else round(max(0.0, deadline - clock.now()), 1)) \
            as phase:
        compare_default = default is not None and opts.method == "auto" and size != opts.select_size
        result, fraction, bound, tried, sims, simulated, choices, band = _select(
            opts, topo, size, deadline - wall_seconds(closing), phase, None, make_eval,
            default if compare_default else None)       # (at the pace the machine gives the command)
        if opts.engine:
            result, fraction = _fit_engine(opts, topo, size, deadline, phase, result, sims, bound, simulated,
                                           make_eval)
        # the report's figure: exact, or estimated past its work budget (--exact: always exact);
        # the program is chosen and written the same either way (hccc.synth_figure)
        fig = _figure(opts, result, sims, bound, fraction, simulated, phase)
    searched = clock.now()
    # (the plan's header choices are the result's: the plan adds what was asked and tried)
    plan = SynthPlan.of(result, requested=opts.method, size=size, methods_tried=tried, engine=opts.engine)
    alg = to_algorithm(result, topo, plan)
    verify(alg)
    check_on_topology(alg, topo)
    proven = clock.now()
    why, not_simulated, fitted, limit_cut, extra = _report(result, bound, fraction, sims, simulated)
    selection = _selection_report(choices, result, fraction, band)
    if selection["time_limit_cut"]:
        # the limit bound: the report's time_limit_cut and timed_out say so as the comment does
        extra.append(f"time limit: candidates not made or not simulated: {', '.join(selection['time_limit_cut'])}")
        limit_cut.append(f"candidates not made or not simulated: {', '.join(selection['time_limit_cut'])}")
        result.timed_out = True
    if band is not None:
        extra += _band_lines(selection["band"], selection["kept"], len(choices))
    elif opts.band and not opts.sizes:
        extra.append("not scored across the band: " + (
            f"over {SIMULATE_MAX_RANKS} GPUs, nothing is simulated" if not simulated else
            "--no-sim-select: the candidates are not compared" if not opts.sim_select else
            "simulator not installed" if not sims.available else "fewer than two candidates simulated"))
    elif selection["runner_up"] is not None and selection["kept"] is not None:
        run = selection["runner_up"]
        extra.append(f"kept the {selection['kept']} program, the fastest of {len(choices)} candidates in the "
                     f"simulator at {size} bytes; runner-up: {run['candidate']}, {run['ratio']:.3f}x its time")
    refusing = None
    if not opts.engine:
        # which other engines certainly refuse the program as written, and why (their up-front checks)
        from hccc.synth_engines import ENGINES, certain_refusals
        refusing = certain_refusals(alg, topo)
        for engine, because in refusing.items():
            extra.append(f"{ENGINES[engine]}: " + (f"refuses this program ({because}); hccc synth --for {engine} "
                                                   "looks for one it runs" if because is not None else
                                                   "not checked during synthesis (hccc plan checks it)"))
    text = to_rccl(result, topo, plan, cluster=opts.cluster_name, extra_comments=extra)
    # what each phase took (work clock), with the search's own phases where it reports them
    took = {"search": round(searched - started, 3), **(result.detail.get("phase_seconds") or {}),
            "proof": round(proven - searched, 3), "text": round(clock.now() - proven, 3),
            "closing_predicted": round(closing, 3)}
    # where the selection's time went: each candidate made and scored, and the rest (the bounds,
    # the engine's fit), adding up to it
    for c in choices:
        took[f"candidate {c.name}"] = round(took.get(f"candidate {c.name}", 0.0) + c.seconds, 3)
    took["selection other"] = round(max(0.0, took["search"] - sum(v for k, v in took.items()
                                                                  if k.startswith("candidate "))), 3)
    summary = _summary(result, size, bound, fraction, sims, simulated, tried, why, not_simulated, fitted,
                       limit_cut, took)
    summary["fraction_of_bound"] = fig.fraction
    summary.update(fig.as_dict())
    if fig.limit_bound:
        # said here, not in the program's comments: the program is the same either way
        summary["time_limit_cut"] = [*summary["time_limit_cut"], "the report's figure: " + fig.how]
        summary["timed_out"] = True
    summary["selection"] = selection
    if refusing is not None:
        summary["engines_refusing"] = refusing
    return Program(text, plan, summary, result, alg, [(c.name, c.result) for c in ranked(choices)])


def _refuse_unstoppable(opts, topo, size: int, deadline: float) -> None:
    """A CompileError naming the cluster, before anything is made, where the tree packing's program
    would be made and what cannot stop once it starts (its first program, then the proof and text of it:
    :func:`hccc.compiler.synth.budget.tree_unstoppable_seconds`), at the pace this machine is likely
    to give the command (:func:`hccc.util.clock.pace_ahead`), would end past what ``--time-limit``
    promises (:func:`hccc.compiler.synth.budget.overruns`): at 1,024 GPUs and ``--time-limit 10`` on
    a loaded machine those alone take 15-30 wall seconds. The limit binds then, so the outcome
    depends on the machine, and the message says so."""
    import math

    from hccc.compiler.synth.budget import overruns, tree_unstoppable_seconds

    coll, n = opts.collective, int(topo.nranks)
    if choose_method(opts.method, coll, n, size) != "trees" or not _trees_fit(coll, n) or opts.chunks_per_rank:
        return
    cpu = tree_unstoppable_seconds(coll, n)
    pace = clock.pace_ahead()
    need, left = cpu * pace, deadline - clock.now()
    if not overruns(need, left):
        return
    leaves = f"the time limit leaves {left:.1f} s" if left > 0 else f"the time limit has passed ({-left:.1f} s ago)"
    raise CompileError([Diagnostic(
        f"{printable(str(opts.cluster_name or 'the cluster'))}: the tree packing's first {coll} program on {n:,} GPUs "
        f"and the proof and text of its transfers cannot stop once started and need about {need:.1f} s at this "
        f"machine's present pace ({pace:.1f} wall seconds a CPU second; {cpu:.1f} s on an idle one), and {leaves}: "
        f"the time limit binds; raise --time-limit by {max(1, math.ceil(need - left))} s or more", None)])


def _figure(opts, result, sims, bound: dict, fraction, simulated: bool, phase):
    """The report's figure of the program written (:func:`hccc.synth_figure.figure`); an evaluator
    other than :class:`Simulations` gives the selection's own time, as it timed it."""
    from hccc.synth_figure import Figure, figure
    if not isinstance(sims, Simulations):
        return Figure(fraction, fraction, fraction, None if fraction is None else False, "timed by the evaluator")
    phase.update("the report's figure")
    return figure(result, sims, bound["seconds"], exact=opts.exact, simulated=simulated)


def _selection_report(choices: list, result, fraction, band: "Band | None" = None) -> dict:
    """What ``--json`` says of the selection: its rule, every candidate (its fraction of the
    bound, the seconds it took, its time's ratio to the kept one's, or why it was dropped), the
    one kept, the candidates the time limit left unmade or unscored, and the runner-up with its
    ratio (None where no other was scored). Across a band (``band``): the runner-up by the band's
    rule, ``ratio`` its worst ratio over the band, and ``band`` (:func:`_band_report`)."""
    kept = next((c for c in choices if c.result is result), None)
    # the limit binds where it dropped a candidate, and where it cut short the making of one that
    # was not kept (its own report is not the written program's): either may change what is kept
    cut = [c.name for c in choices if c.dropped and "time limit" in c.dropped]
    cut += [f"{c.name} (made short: {'; '.join(c.result.detail['time_limit_cut'])})" for c in choices
            if c.result is not None and c.result is not result and c.result.detail.get("time_limit_cut")]
    if band is not None:
        out = {"rule": BAND_RULE_TEXT, "kept": kept.name if kept is not None else None,
               "candidates": [c.as_dict(fraction) for c in choices],
               "time_limit_cut": cut}
        out["band"] = _band_report(band, kept)
        run = next((b for b in band.ranked if band.choices[b.index] is not kept), None)
        out["runner_up"] = None if run is None else {"candidate": run.name, "ratio": run.worst}
        return out
    others = [c for c in ranked(choices) if c is not kept]
    runner = others[0] if others else None
    return {"rule": SCORE_RULE, "kept": kept.name if kept is not None else None,
            "candidates": [c.as_dict(fraction) for c in choices],
            "time_limit_cut": cut,
            "runner_up": None if runner is None else {"candidate": runner.name,
                                                      "ratio": (fraction / runner.fraction) if fraction else None}}


def _band_report(band: Band, kept: "Choice | None") -> dict:
    """``--json``'s ``selection.band``: the sizes, the kept program's worst ratio, every candidate's
    times and ratios per size (``candidates``, best by the rule first), and per size the fastest
    candidate there, the kept one's ratio to it and the runner-up there (the fastest other than
    the kept one, ``ratio``: its time over the kept one's); ``not_timed``: the sizes the work
    budget or the deadline left untimed, by candidate."""
    # (the kept program is not among them where --for's engine took another)
    me = next((b for b in band.ranked if band.choices[b.index] is kept), None)
    if me is None:
        me = BandScore(kept.name if kept is not None else "", 0, (None,) * len(band.sizes), (None,) * len(band.sizes))
    per_size = []
    for j, s in enumerate(band.sizes):
        timed = [b for b in band.ranked if b.seconds[j] is not None]
        fastest = min(timed, key=lambda b: b.seconds[j], default=None)
        others = [b for b in timed if b is not me]
        run = min(others, key=lambda b: b.seconds[j], default=None)
        per_size.append({"bytes": int(s), "best": fastest.name if fastest else None, "kept_ratio": me.ratios[j],
                         "runner_up": None if run is None or me.seconds[j] is None else
                         {"candidate": run.name, "ratio": run.seconds[j] / me.seconds[j]}})
    return {"sizes": list(band.sizes), "worst_ratio": me.worst if me.worst != float("inf") else None,
            "per_size": per_size, "not_timed": band.cut,
            "candidates": [{"candidate": b.name, "transfers": b.transfers, "seconds": list(b.seconds),
                            "ratios": list(b.ratios), "worst_ratio": b.worst if b.worst != float("inf") else None}
                           for b in band.ranked]}


def _band_lines(rep: dict, kept: str | None, ncandidates: int) -> list[str]:
    """The program's comment lines on a selection across a band (``rep``: :func:`_band_report`)."""
    worst = rep["worst_ratio"]
    lines = [f"scored across the band ({', '.join(format_size(s) for s in rep['sizes'])}): kept the {kept} program "
             f"of {ncandidates} candidates, " + (f"at most {worst:.3f}x the fastest at each size" if worst is not None
                                                 else "not timed at every size")]
    for row in rep["per_size"]:
        run = row["runner_up"]
        lines.append(f"  at {format_size(row['bytes'])}: fastest {row['best']}"
                     + (f", the kept program {row['kept_ratio']:.3f}x its time" if row["kept_ratio"] is not None
                        else ", the kept program not timed")
                     + (f"; runner-up {run['candidate']}, {run['ratio']:.3f}x the kept one's" if run else ""))
    return lines


def _report(result, bound: dict, fraction, sims, simulated: bool):
    """What the program's text says of how it was made, and what its summary says of the
    simulations: ``(why, not_simulated, fitted, limit_cut, extra)``, why its fraction of the bound
    (or its channel count) was not simulated if it was not, the same for the summary, whether its
    channels were fitted, what the time limit cut, and the comment lines (``extra``). Marks a
    result the time limit cut as timed out, and adds the fractions of the AllReduce bounds to
    ``bound``."""
    # why the program's fraction of the bound (or its channel count) was not simulated, if it was not
    why = ("no transfers: one GPU" if result.nranks < 2 else "simulator not installed" if not sims.available
           else "time limit" if sims.stopped else f"simulation failed: {sims.failed}" if sims.failed else
           "not simulated")
    not_simulated = None if fraction is not None else f"over {SIMULATE_MAX_RANKS} GPUs" if not simulated else why
    fitted = result.detail.get("channels_fitted")
    # what the time limit cut before the program was made (tree packing: a packing stopped short of
    # its LP optimum, a further packing or candidate programs not made)
    limit_cut = list(result.detail.get("time_limit_cut") or [])
    if limit_cut:
        result.timed_out = True
    extra = [f"bandwidth lower bound (ForestColl cut bound) at {bound['bytes']} bytes: {bound['seconds'] * 1e6:.1f} us, "
             + (f"busbw <= {bound['busbw_GBps']:.2f} GB/s" if bound["seconds"] > 0 else "no byte moves")]
    if "allreduce_bound_seconds" in bound:
        extra.append(f"AllReduce bound for any schedule (cut and traffic): {bound['allreduce_bound_seconds'] * 1e6:.1f} us; "
                     f"ReduceScatter + AllGather optimum: {bound['rs_ag_seconds'] * 1e6:.1f} us")
    if limit_cut:
        extra.append(f"time limit: {'; '.join(limit_cut)}")
    if not simulated:
        extra.append(f"method {result.detail.get('method')}: not simulated during synthesis (over "
                     f"{SIMULATE_MAX_RANKS} GPUs; hccc sim measures the program)")
    elif fraction is None:
        extra.append(f"method {result.detail.get('method')}: not simulated during synthesis ({not_simulated}; "
                     "hccc sim measures the program)")
    if simulated and fitted is False:
        extra.append(f"{plural(int(result.detail.get('channels', 1)), 'channel')}: the packing's own count, not "
                     f"confirmed by simulation ({why})")
    if not result.slice_policy.is_default:
        pol = result.slice_policy
        extra.append(f"slices: at least {pol.micro_batches} micro-batches per chunk, none below "
                     f"{format_size(pol.min_slice)} (nMicroBatches, MinSliceBytes): thin streams, whose pipelines "
                     "fill faster in smaller slices")
    if fraction is not None:
        extra.append(f"method {result.detail.get('method')}: simulated at {bound['bytes']} bytes, "
                     f"{fraction:.4f} of the cut bound")
        if "allreduce_bound_seconds" in bound:
            t = bound["seconds"] / fraction
            bound["fraction_of_allreduce_bound"] = bound["allreduce_bound_seconds"] / t
            bound["fraction_of_rs_ag"] = bound["rs_ag_seconds"] / t
            extra.append(f"{bound['fraction_of_allreduce_bound']:.4f} of the AllReduce bound, "
                         f"{bound['fraction_of_rs_ag']:.4f} of the ReduceScatter + AllGather optimum")
    return why, not_simulated, fitted, limit_cut, extra


def _summary(result, size: int, bound: dict, fraction, sims, simulated: bool, tried: dict, why, not_simulated,
             fitted, limit_cut: list, took: dict) -> dict:
    """The program's summary (``hccc synth --json``): its shape, bounds, method, simulations and
    what each phase took (``took``, work clock)."""
    summary = {"collective": result.collective, "nranks": result.nranks, "steps": result.steps,
               "lower_bound_steps": result.lower_bound_steps, "seconds": round(result.seconds, 3),
               "gap": result.gap, "transfers": result.ntransfers,
               "timed_out": result.timed_out, "bandwidth_bound": bound,
               "phases": result.summary()["phases"], "composed": result.composed,
               "method": result.detail.get("method"), "size": int(size),
               "chunks_per_rank": int(result.chunks_per_rank), "channels": int(result.detail.get("channels", 1)),
               "channels_fitted": fitted, "fraction_of_bound": fraction, "not_simulated": not_simulated,
               "simulations_stopped": sims.stopped, "methods_tried": tried, "time_limit_cut": limit_cut,
               "slicing": result.slice_policy.as_dict(), "phase_seconds": took}
    if "trees" in result.detail:
        summary["trees"] = result.detail["trees"]
    if "candidates" in result.detail:
        summary["candidates"] = result.detail["candidates"]
    summary["not_fitted_because"] = why if simulated and fitted is False else None
    return summary


#: channel counts :func:`_fit_channels` tries, fewest first
CHANNEL_STEPS = (1, 2, 4, 8, 16, 32, 64)
#: past this many GPUs ``synth`` does not simulate (shapes, channels, the fraction of the bound):
#: one simulation of such a program takes longer than the whole synthesis; ``hccc sim`` measures it
SIMULATE_MAX_RANKS = 128
#: a program this close to its time without the per-block limit (or to the cut bound, which no
#: program beats) has enough channels; a shape this close to the bound ends the shape search
FIT_TOLERANCE = 0.01
#: a program simulated below this fraction of the least time any program needs is simulated again
#: with smaller slices where its thread blocks can afford them (:func:`_thin_slices`)
THIN_SLICES_BELOW = 0.99
#: and those are kept where they run at least this much faster
THIN_GAIN = 0.002
#: the collectives whose tree candidates are each scored at their own slices (smaller ones where
#: they run faster, :func:`_thinner`), not only the program chosen: AllGather and ReduceScatter;
#: an AllReduce's candidates are simulated at hccc's default slices only (twice the events a
#: simulation; its program is measured against the larger of two references, :func:`_reach`)
THIN_WHILE_CHOOSING = ("allgather", "reducescatter")
#: the collectives whose programs are timed by :func:`hccc.runtime.sim_periodic.simulate_periodic`
#: (a call of many micro-batches extrapolated from three short ones where their periods agree):
#: AllGather and ReduceScatter, whose tree pipelines run their steady state from the second
#: micro-batch on. Not AllReduce: its programs (ReduceScatter then AllGather, one pipeline twice
#: as deep) settle only after 12-16 of the 28 micro-batches a chunk they run at 1 GiB on 64 GPUs
#: (``synth_quality.py --asym 2``: its period 1.580 ms at the fourth micro-batch, 1.533 ms from the twelfth), so
#: the samples' check would refuse them, and their cost would be spent on top of the whole run
PERIODIC_COLLECTIVES = ("allgather", "reducescatter")
#: at most this many of them (the first, in the packing's order of preference): each such try is
#: a simulation of up to four times the events (a 40-GPU mixed cluster's ReduceScatter,
#: ``synth_quality.py --mixed 106``: six candidates, 14 s at the default slices, 37 s where every
#: one was tried, 26 s with three, the second the one kept)
THIN_CHOOSE_MOST = 3
#: and not for a candidate whose time at the default slices trails the best so far by more than
#: this many times the most any such try gained so far (a share of its time): four MI250 nodes'
#: AllGather, 2.0 % gained by the first, its third candidate 5.7 % behind, not tried (4.4 s)
THIN_REACH = 1.5
#: the work (events plus re-shared flow classes, as :func:`hccc.runtime.simulator.simulate` counts
#: it) one simulation of a candidate at another size of a band may take (:meth:`Simulations.at_sizes`):
#: a budget, not a clock, so every machine ranks the same. The default band's sizes below 1 GiB
#: (at 1 GiB the selection's own time is taken) cost the written programs of the largest shipped
#: clusters at most 0.68 M (v100_4x2_8x2 and a100_topo4 AllReduce at 64 MiB, 0.5 s on a loaded
#: 2-core machine; 3.8 M at 1 GiB, 2.5 s): this leaves room for a band of larger sizes, each
#: simulation a few seconds at the rates measured there (1.5-2 M/s)
BAND_WORK_BUDGET = 20_000_000
#: the most threads a process's periodic timings run their samples on (:meth:`Simulations.pool`; no
#: more than the CPUs it may use): one per sample of a call (:func:`hccc.runtime.sim_periodic.periodic_samples`)
SAMPLE_WORKERS = 3


class Simulations:
    """The simulations ``synth`` runs after its search (tree shapes, channel counts, the fraction
    of the bound), all ending by ``deadline`` (a work-clock time (:func:`hccc.util.clock.now`)): each program's
    time is kept, keyed by its transfers and channels, so none is simulated twice.
    ``stopped``: the deadline stopped a simulation or left no time to start one; ``failed``: why a
    program could not be simulated (None: none failed). ``ahead``: the selection may have a
    candidate's simulation run before it scores it (:meth:`prefetch`, :meth:`run_ahead`: the tree
    packing's AllReduce, beside the packing of its halves) or start one on a guess beside another
    (:meth:`guess`: an AllGather's or ReduceScatter's candidate at smaller slices, beside the
    longest sample or the whole call of its default's), which changes no time nor choice; False:
    each is simulated when scored."""

    def __init__(self, topo, nbytes: int, deadline: float, ahead: bool = True):
        self.topo = topo
        self.ahead = bool(ahead)         # simulations may be prepared ahead of need (:meth:`prefetch`)
        self.nbytes = int(nbytes)
        self.deadline = float(deadline)
        self.times: dict[tuple, float] = {}
        self.walls: dict[tuple, float] = {}      # what each simulation took (work clock, preparing it included)
        self.stopped = False
        self.failed: str | None = None
        self.shapes_not_needed = 0       # tree shapes not simulated: one ran at the bound
        self.extrapolated = 0            # times extrapolated from a few micro-batches (PERIODIC_COLLECTIVES)
        self.periodic: dict[tuple, object] = {}   # program -> how its periodic timing found its time (PeriodicTime)
        self.longest_s = 0.0             # the longest simulation so far (preparing it included), seconds
        self.prefetched = 0              # simulations prepared ahead of need (:meth:`prefetch`)
        self._ahead: dict[tuple, _Timing] = {}   # program -> its simulation, prepared by :meth:`prefetch`
        self._guessed: dict[tuple, _Timing] = {}   # program -> its simulation, started by :meth:`guess`
        self.guessed = 0                 # simulations started on a guess (:meth:`guess`)
        self.guesses_taken = 0           # of them, those :meth:`seconds` was asked for
        self._pool = None
        self._irs: dict[tuple, object] = {}
        self._resident: dict[tuple, int] = {}    # program -> the most channels keeping it resident
        self._bounds: dict[str, float] = {}
        self._packed: set[str] = set()   # collectives whose bound is the packing bound (tighten)
        self._net = None
        try:
            from hccc.runtime import simulator  # noqa: F401
            self.available = True
        except ImportError:
            self.available = False

    @property
    def time_left(self) -> float:
        return self.deadline - clock.now()

    def network(self):
        if self._net is None:
            from hccc.compiler.synth import network_from_topology
            self._net = network_from_topology(self.topo)
        return self._net

    def bound_seconds(self, collective: str) -> float:
        """The cut bound of ``collective`` at ``nbytes`` (docs/bounds.md), for AllReduce the larger
        of its cut and traffic bounds, or a tighter bound given to :meth:`tighten`: no program is
        faster. Computed once."""
        if collective not in self._bounds:
            from hccc.compiler.synth.bounds import allreduce_bound_seconds, collective_cut_bound_seconds
            net = self.network()
            self._bounds[collective] = float(
                allreduce_bound_seconds(net, float(self.nbytes)) if collective == "allreduce" else
                collective_cut_bound_seconds(net, collective, self.topo.nranks, 1, 0, float(self.nbytes)))
        return self._bounds[collective]

    def tighten(self, collective: str, seconds: float) -> None:
        """A valid bound of ``collective`` at ``nbytes`` found elsewhere (a packing's): kept where it
        is tighter than the cut bound, and known to be the packing bound (:meth:`optimum_seconds`)."""
        self._bounds[collective] = max(self.bound_seconds(collective), float(seconds))
        self._packed.add(collective)

    def optimum_seconds(self, collective: str) -> float:
        """AllGather's or ReduceScatter's bound as ``hccc synth`` reports it for that collective:
        the packing bound up to :data:`~hccc.compiler.synth.bounds.EXACT_LIMIT` ranks (its LP
        within a share of the time left, valid when stopped), the cut bound above (docs/bounds.md).
        Computed once."""
        if collective not in self._packed:
            from hccc.compiler.synth.bounds import PACKING_BOUND_SECONDS, collective_bound_seconds
            limit = min(PACKING_BOUND_SECONDS, max(0.0, self.time_left) * OPTIMUM_SHARE)
            self.tighten(collective, collective_bound_seconds(self.network(), collective, self.topo.nranks, 1, 0,
                                                              float(self.nbytes), time_limit=limit))
        return self.bound_seconds(collective)

    @staticmethod
    def _key(result) -> tuple:
        import hashlib

        import numpy as np

        from hccc.compiler.synth.emit import _sorted_rows
        rows = np.ascontiguousarray(_sorted_rows(result), dtype=np.int64)
        return (result.collective, int(result.chunks_per_rank), int(result.root or 0),
                result.warps, result.slice_policy, hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest())

    def _ir(self, result, key: tuple):
        """The built program of ``result`` (``key``: its :meth:`_key`), with its slice policy: the
        same transfers under another policy are the same program, not built again."""
        base = key[:4] + key[5:]
        if base not in self._irs:
            from hccc.compiler.passes.build import build_program
            from hccc.compiler.synth import to_algorithm
            self._irs = {base: build_program(to_algorithm(result, self.topo))}   # the latest program only
            self._resident[base] = resident_channels(self._irs[base], self.topo)
        ir = self._irs[base]
        ir.micro_batches, ir.min_slice_bytes = result.slice_policy.micro_batches, result.slice_policy.min_slice
        return ir

    def least_seconds(self, result) -> float:
        """Seconds no simulation of ``result``'s program at ``nbytes`` beats, with any channels
        (:func:`hccc.runtime.simulator.least_time`: its bytes over the capacities)."""
        from hccc.runtime.simulator import least_time
        return least_time(self._ir(result, self._key(result)), self.topo, self.nbytes)

    def channel_steps(self, result) -> list[int]:
        """:data:`CHANNEL_STEPS` with which every thread block of the program stays resident (the
        count is kept per program: the program chosen after several were simulated is not built
        again for it)."""
        key = self._key(result)
        base = key[:4] + key[5:]          # the slice policy changes no thread block
        if base not in self._resident:
            self._ir(result, key)
        return [c for c in CHANNEL_STEPS if c <= self._resident[base]] or [1]

    def known(self, result, channels: int | None, key: tuple | None = None) -> float | None:
        """The time of ``result`` with ``channels`` when already simulated (``key``: its
        :meth:`_key`, where the caller has it)."""
        return self.times.get((self._key(result) if key is None else key) + (channels,))

    def seconds(self, result, channels: int | None, then=None) -> float | None:
        """Simulated seconds of ``result``'s program at ``nbytes`` with ``channels`` blocks per
        thread block (None: without the per-block limit); None when the deadline stopped it (or
        left no time to start it) or the program cannot be simulated (``failed`` says why). A
        program :meth:`prefetch` prepared is taken from there (simulated by :meth:`run_ahead`
        already, or now), one :meth:`guess` started from there (waited for). ``then(estimate,
        took)``: called, where the program's samples run on the pool (:class:`_Timing`), once its
        two shorter samples have ended, with the time they give the call and the seconds spent
        so far, while the longest still runs; where its call is simulated whole, on the pool, as
        it starts, with ``estimate`` None (to start beside it, by :meth:`guess`, what may be
        asked next)."""
        if not self.available:
            return None
        key = self._key(result)
        tkey = key + (channels,)
        if tkey in self.times:
            return self.times[tkey]
        timing = self._guessed.pop(tkey, None)
        self.guesses_taken += timing is not None
        timing = timing or self._ahead.pop(tkey, None) or self._timing(result, key, channels)
        if timing is None:
            return None
        timing.then = then
        return self._record(tkey, timing)

    def at_sizes(self, result, channels: int, sizes, deadline: float) -> list:
        """Simulated seconds of ``result``'s program with ``channels`` at each of ``sizes`` (None
        where the simulation needs more than :data:`BAND_WORK_BUDGET`, a work budget, so the same
        on every machine, or where ``deadline`` stopped it or the program cannot be simulated):
        built and prepared once, each size one whole call at its own slice."""
        if not self.available or not sizes:
            return [None] * len(sizes)
        from hccc.runtime.simulator import SimulationError, prepare, simulate
        from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS

        ir = self._ir(result, self._key(result))
        ir.nchannels = int(channels or 1)
        try:
            prog = prepare(ir, self.topo, DEFAULT_BLOCK_GBPS)
        except (SimulationError, ValueError) as exc:
            self.failed = str(exc)
            return [None] * len(sizes)
        out = []
        for s in sizes:
            try:
                out.append(float(simulate(prog, self.topo, int(s), slice_bytes="auto", work_budget=BAND_WORK_BUDGET,
                                          deadline=deadline).time_s))
            except (SimulationError, ValueError):       # SimulationStopped is a SimulationError
                out.append(None)
        return out

    def whole_seconds(self, result, channels: int | None, work_budget: int | None) -> tuple[float | None, bool]:
        """``(seconds, stopped)``: ``result``'s program with ``channels`` simulated at ``nbytes`` as one
        whole call (never extrapolated: the report's exact figure, :mod:`hccc.synth_figure`), within
        ``work_budget`` (None: no budget) and by the deadline; seconds None where either stopped it
        (``stopped``: the deadline did) or the program cannot be simulated."""
        if not self.available:
            return None, False
        from hccc.runtime.simulator import SimulationError, SimulationStopped, prepare, simulate_by
        from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS

        try:
            ir = self._ir(result, self._key(result))
            ir.nchannels = int(channels or 1)
            prog = prepare(ir, self.topo, DEFAULT_BLOCK_GBPS if channels else None)
            res = simulate_by(self.deadline, prog, self.topo, self.nbytes, slice_bytes="auto",
                              work_budget=work_budget)
        except SimulationStopped as exc:
            return None, "budget" not in str(exc)
        except (SimulationError, ValueError):
            return None, False
        return float(res.time_s), False

    def guess(self, result, channels: int | None) -> None:
        """Start the simulation of ``result``'s program with ``channels`` on the pool's free
        workers now, on a guess that :meth:`seconds` asks for it next (it then waits for it;
        :meth:`drop_guesses` stops it). The same simulation :meth:`seconds` would run, started
        sooner; nothing is counted until :meth:`seconds` takes it."""
        if not self.available or not self.ahead or self._workers() < 2:
            return
        key = self._key(result)
        tkey = key + (channels,)
        if tkey in self.times or tkey in self._guessed:
            return
        from hccc.runtime.simulator import StopSwitch
        said = self.stopped, self.failed      # a guess that cannot start says nothing of the programs asked for
        timing = self._timing(result, key, channels, stop=StopSwitch())
        self.stopped, self.failed = said
        if timing is not None:
            timing.start(self.pool())
            self._guessed[tkey] = timing
            self.guessed += 1

    def drop_guesses(self) -> None:
        """Stop the simulations :meth:`guess` started that nobody asked for."""
        for timing in self._guessed.values():
            timing.cancel()
        self._guessed = {}

    def _workers(self) -> int:
        from hccc.runtime.simulator import usable_cpus
        return min(SAMPLE_WORKERS, usable_cpus())

    def pool(self):
        """The threads the samples of periodic timings run on (:data:`SAMPLE_WORKERS` at most, as
        many as this process may use), made on first use; None: one CPU, samples run in turn."""
        if self._pool is None and self._workers() > 1:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(max_workers=self._workers(), thread_name_prefix="hccc-sim")
        return self._pool

    def prefetch(self, result, channels: int | None) -> None:
        """Prepare the simulation of ``result``'s program with ``channels`` now, for
        :meth:`run_ahead` to run before :meth:`seconds` asks for it (the caller does other work on
        another thread meanwhile: the compiled event loop releases the GIL). Nothing is kept of it
        but its time, which is the one :meth:`seconds` would simulate (the same program, slice and
        deadline), and nothing is counted until :meth:`seconds` takes it."""
        if not self.available:
            return
        key = self._key(result)
        tkey = key + (channels,)
        if tkey in self.times or tkey in self._ahead:
            return
        timing = self._timing(result, key, channels)
        if timing is not None:
            self._ahead[tkey] = timing
            self.prefetched += 1

    def run_ahead(self) -> None:
        """Run here the simulations :meth:`prefetch` prepared, each outcome kept for :meth:`seconds`."""
        for timing in self._ahead.values():
            timing.run()

    def drop_ahead(self) -> None:
        """Forget what :meth:`prefetch` prepared and nobody asked for."""
        self._ahead = {}

    def _timing(self, result, key: tuple, channels: int | None, stop=None) -> "_Timing | None":
        """The simulation of ``result``'s program (``key``) with ``channels``, prepared here; None
        where the deadline leaves no time to start it or the program cannot be prepared
        (``stopped`` or ``failed`` says so). ``stop``: its stop switch, if any."""
        if self.time_left <= 0:
            self.stopped = True
            return None
        from hccc.runtime.simulator import SimulationError, prepare
        from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS

        t0 = clock.now()
        try:
            ir = self._ir(result, key)
            ir.nchannels = int(channels or 1)
            prog = prepare(ir, self.topo, DEFAULT_BLOCK_GBPS if channels else None)
        except (SimulationError, ValueError) as exc:
            self.failed = str(exc)
            self.longest_s = max(self.longest_s, clock.now() - t0)
            return None
        return _Timing(self, prog, key[0] in PERIODIC_COLLECTIVES, clock.now() - t0, stop)

    def _record(self, tkey: tuple, timing: "_Timing") -> float | None:
        """``timing``'s outcome (run now where it has not run), kept as the time of the program
        ``tkey``; None, with ``stopped`` or ``failed`` set, where the simulator stopped or refused it."""
        from hccc.runtime.simulator import SimulationError, SimulationStopped
        try:
            t, extrapolated = timing.outcome()
        except SimulationStopped:
            self.stopped = True
            return None
        except (SimulationError, ValueError) as exc:
            self.failed = str(exc)
            return None
        finally:
            self.longest_s = max(self.longest_s, timing.took)
        self.extrapolated += extrapolated
        self.times[tkey] = t
        if timing.found is not None:
            self.periodic[tkey] = timing.found
        self.walls[tkey] = timing.took
        return t


class _Timing:
    """One simulation of a prepared program (``prog``) at the evaluator's size and deadline:
    ``(seconds, whether extrapolated)``, through :class:`~hccc.runtime.sim_periodic.PeriodicCall`
    where ``periodic`` (AllGather and ReduceScatter: :data:`PERIODIC_COLLECTIVES`; its samples on
    the evaluator's pool), else the whole call. :meth:`run` runs it once (its error kept),
    :meth:`outcome` gives what it gave (running it first where it has not run); :meth:`start`
    puts its samples on the pool now, :meth:`cancel` stops them (``stop``: its stop switch);
    ``then``: see :meth:`Simulations.seconds`; ``took``: its seconds, the preparing included
    (work clock; a started one's from its start, waiting for the pool included)."""

    def __init__(self, sims: Simulations, prog, periodic: bool, prepared_s: float, stop=None):
        self.sims, self.prog, self.periodic, self.stop = sims, prog, periodic, stop
        self.took = prepared_s
        self.then = None
        self.found = None                # the periodic timing's PeriodicTime (samples, periods), where periodic
        self._out: tuple | None = None
        self._error: BaseException | None = None
        self._call = None
        self._futures: list | None = None
        self._started_at: float | None = None

    def _periodic_call(self):
        from hccc.runtime.sim_periodic import PeriodicCall
        if self._call is None:
            sims = self.sims
            self._call = PeriodicCall(self.prog, sims.topo, sims.nbytes, slice_bytes="auto", deadline=sims.deadline,
                                      stop=self.stop)
        return self._call

    def start(self, pool) -> None:
        """Put the samples on ``pool`` (where the call is cut; else it runs when asked for)."""
        if not self.periodic or self._futures is not None or pool is None:
            return
        self._started_at = clock.now()
        self._submit(pool)

    def _submit(self, pool) -> None:
        self._futures = [pool.submit(job) for job in self._periodic_call().jobs()]

    def cancel(self) -> None:
        """Stop the samples started: those not begun are dropped, the running ones stopped."""
        for f in self._futures or ():
            f.cancel()
        if self.stop is not None:
            self.stop.turn()

    def _samples(self, call):
        """The samples' results in the jobs' order: from the pool (calling ``then`` once the two
        shorter ones have ended), else run here."""
        if self._futures is None:
            pool = self.sims.pool() if call.side_by_side() else None
            if pool is None:
                return [job() for job in call.jobs()]
            self._submit(pool)
        if self.then is not None and len(self._futures) == 3:
            from concurrent.futures import wait
            shorter = self._futures[:0:-1]          # the least sample first
            wait(shorter)
            if all(f.exception() is None for f in shorter):
                since = self._started_at if self._started_at is not None else self._t0
                self.then(call.estimate(tuple(f.result().time_s for f in shorter)), self.took + clock.now() - since)
        return [f.result() for f in self._futures]

    def run(self) -> None:
        from hccc.runtime.simulator import SimulationError, simulate_by

        if self._out is not None or self._error is not None:
            return
        sims = self.sims
        self._t0 = t0 = self._started_at if self._started_at is not None else clock.now()
        try:
            if self.periodic:
                # many micro-batches: their steady state's period extrapolated from a few
                call = self._periodic_call()
                pool = self.sims.pool() if self.then is not None and call.side_by_side() else None
                if not call.cut and pool is not None:
                    # simulated whole, on the pool: ``then`` may start a guess beside it at once
                    whole = pool.submit(call.finish, [])
                    self.then(None, self.took + clock.now() - t0)
                    found = whole.result()
                else:
                    found = call.finish(self._samples(call))
                self.found = found
                self._out = (float(found.time_s), int(found.extrapolated))
            else:
                self._out = (float(simulate_by(sims.deadline, self.prog, sims.topo, sims.nbytes,
                                               slice_bytes="auto", stop=self.stop).time_s), 0)
        except (SimulationError, ValueError) as exc:     # SimulationStopped is a SimulationError
            self._error = exc
        finally:
            self.took += clock.now() - t0

    def outcome(self) -> tuple[float, int]:
        self.run()
        if self._error is not None:
            raise self._error
        return self._out


def _fit_channels(result, topo, nbytes: int, sims: Simulations, tol: float = FIT_TOLERANCE) -> float | None:
    """The fewest channels (``CHANNEL_STEPS``) with which the program runs within ``tol`` of its
    time without the simulator's per-block limit at ``nbytes``: the per-block limit then never
    binds where the links could carry more. Starts from the packing's own count (its busiest
    stream's planned rate over the per-block rate, :func:`hccc.compiler.synth.forest.blocks_for`):
    when the program runs within ``tol`` of the cut bound with it, that count is confirmed without
    simulating the unlimited program (which can only be slower than the bound); else the unlimited
    time is simulated and ``CHANNEL_STEPS`` bisected (taking the time as non-increasing in
    channels: each block's share only grows), then the count goes up while the next gains more
    than ``tol`` (a call's slice follows its channels, which the unlimited time, at one channel's
    slices, does not show). Where only one count keeps every thread block
    resident, that count is simulated once and kept. Sets ``result.detail["channels"]`` (and
    ``"channels_fitted"``: whether the simulations confirmed it) and returns the simulated seconds
    with them; None without the simulator, when the program cannot be simulated, or when
    ``sims``' deadline stops the fitting before the chosen count was simulated (the best count
    known so far is kept: the fewest that passed, else the packing's own)."""
    if not sims.available:
        return None
    if sims.time_left <= 0:             # no time to build the program: the packing's count, resident
        sims.stopped = True
        _cap_channels(result, topo)
        result.detail["channels_fitted"] = False
        return None
    steps = sims.channel_steps(result)
    own = int(result.detail.get("channels", 1))
    guess = max([i for i, c in enumerate(steps) if c <= own] or [0])
    passed: dict[int, bool] = {}
    bound = float(result.detail.get("cut_bound_seconds") or 0.0)
    if getattr(result, "collective", None) == "allreduce":   # its bound for any schedule: above the cut bound
        bound = max(bound, sims.bound_seconds("allreduce"))

    def finish(i: int, fitted: bool) -> float | None:
        result.detail["channels"] = int(steps[i])
        result.detail["channels_fitted"] = bool(fitted)
        return sims.times.get(sims._key(result) + (steps[i],))

    def settle() -> float | None:       # the deadline (or a failure) stopped the fitting
        ok = [i for i, p in passed.items() if p]
        return finish(min(ok) if ok else guess, False)

    t = sims.seconds(result, steps[guess])
    if t is None:
        return settle()
    if len(steps) == 1:                 # the one count that stays resident: nothing to compare with
        return finish(0, True)
    if bound > 0 and t <= bound * (1 + tol):
        limit = bound * (1 + tol)       # at the bound: the unlimited program is no faster
    else:
        free = sims.seconds(result, None)
        if free is None:
            return settle()
        limit = free * (1 + tol)

    def passes(i: int) -> bool | None:
        if i not in passed:
            ti = sims.seconds(result, steps[i])
            if ti is None:
                return None
            passed[i] = ti <= limit
        return passed[i]

    lo, hi = 0, len(steps) - 1                 # the answer lies in [lo, hi]; hi is taken if none passes
    first = passes(guess)
    if first:
        hi = guess
        if guess > 0:
            below = passes(guess - 1)
            if below is None:
                return settle()
            if below:
                hi = guess - 1
            else:
                lo = guess
    else:
        lo = min(guess + 1, hi)                # none of the resident counts may pass: the most then
    while lo < hi:
        mid = (lo + hi) // 2
        ok = passes(mid)
        if ok is None:
            return settle()
        if ok:
            hi = mid
        else:
            lo = mid + 1
    t_lo = sims.seconds(result, steps[lo])
    if t_lo is None:
        return settle()
    # more channels also give each call its slices anew (a slice follows the channels), which the
    # time without the per-block limit, at one channel's slices, does not show: up a count while
    # that gains more than ``tol`` (a100_topo2's hierarchical ReduceScatter at 1 MiB: 48.3 us with
    # one channel, the same without the limit, 44.4 us with two). Not from a time at the bound
    while lo + 1 < len(steps) and not (bound > 0 and t_lo <= bound * (1 + tol)):
        t_up = sims.seconds(result, steps[lo + 1])
        if t_up is None or t_up >= t_lo * (1 - tol):
            break
        lo, t_lo = lo + 1, t_up
    return finish(lo, True)


def resident_channels(ir, topo, tbs: int | None = None) -> int:
    """The most channels with which every thread block of a rank fits on its GPU at once (the
    kernels' blocks must all be resident; ``hccc`` refuses more), on the platform of every rank's
    vendor; ``tbs``: the thread blocks of the busiest rank (default: ``ir``'s)."""
    from hccc.compiler.passes.channels import max_blocks_per_rank, most_tbs
    from hccc.compiler.pipeline.options import platforms_for

    plats = {p[0] for p in platforms_for(topo.nranks, "auto", topo)}
    caps = [c for c in (max_blocks_per_rank(ir, p) for p in sorted(plats)) if c is not None]
    t = most_tbs(ir) if tbs is None else max(1, int(tbs))
    return max(1, min(caps) // t) if caps else CHANNEL_STEPS[-1]


def _cap_channels(result, topo) -> None:
    """Lower ``result.detail["channels"]`` (the packing's own count, not simulated) to
    :func:`resident_channels` with a thread block per connection: the state-based allocation
    ``hccc`` uses has at most as many (so the count stays resident), and finding it takes minutes
    on programs of many steps at this scale."""
    if int(result.detail.get("channels", 1)) <= 1:
        return None
    import types

    import numpy as np

    from hccc.compiler.passes.build import schedule_algorithm
    from hccc.compiler.passes.dag import build_dag
    from hccc.compiler.passes.lower import lower
    from hccc.compiler.passes.tb_alloc import connection_units
    from hccc.compiler.synth import to_algorithm

    alg = to_algorithm(result, topo)
    dag = build_dag(alg)
    low = lower(alg, dag, schedule_algorithm(alg, dag), fuse=False)
    unit, urank, _, _ = connection_units(low)
    per_rank = np.bincount(urank, minlength=low.nranks)
    per_rank[np.unique(low.cols["rank"][unit < 0])] += 1      # local primitives' thread block
    cap = resident_channels(types.SimpleNamespace(nwarps=alg.header.nwarps), topo, int(per_rank.max()))
    result.detail["channels"] = min(int(result.detail["channels"]), cap)
    return None


def _reach(bound: dict, fraction: float) -> float:
    """The program's fraction of a reference time, from its ``fraction`` of the cut bound: the
    cut bound, or for AllReduce the larger of its bound for any schedule and RS + AG's optimum.
    The latter is no lower bound (a joint tree packing beat it by 1.13x on a held-out 24-GPU
    cluster): a program may reach more than 1 of it, and is then not thinned."""
    if "allreduce_bound_seconds" not in bound:
        return fraction
    return max(bound["allreduce_bound_seconds"], bound["rs_ag_seconds"]) / (bound["seconds"] / fraction)


def _thin_slices(result, sims: Simulations, bound: dict, fraction: float | None, phase) -> float | None:
    """The program with smaller slices where its thread blocks can afford them and where it then
    runs faster (:func:`_thinner`). Only for a program simulated below :data:`THIN_SLICES_BELOW`
    of the least time any program needs (:func:`_reach`) while the deadline leaves time. Returns
    the program's fraction of the cut bound, as simulated."""
    if fraction is None or _reach(bound, fraction) >= THIN_SLICES_BELOW or sims.time_left <= 0:
        return fraction
    phase.update("simulating the program with smaller slices")
    t = _thinner(result, sims, bound["seconds"] / fraction, int(result.detail.get("channels", 1)))
    return fraction if t is None else bound["seconds"] / t


def _thinner(result, sims: Simulations, before: float, channels: int) -> float | None:
    """Simulated seconds of ``result``'s program (``before`` seconds at its slice policy, hccc's
    default, with ``channels``) at the smallest slices its thread blocks can afford
    (:func:`hccc.compiler.passes.slicing.thin_policy`: thin streams, which wait for their data most
    of the time, so a slot's own costs hide) that run faster by :data:`THIN_GAIN`: more
    micro-batches per chunk shorten the fill and drain of its trees' pipelines, which large chunk
    counts make a large share of a call. Each affordable policy is simulated, smallest slice first,
    until one is faster; one whose simulation would not end before the deadline (the default's
    wall time, scaled by the slots) is not started. The one found faster is kept
    (``result.detail["slicing"]``, the ``.rccl`` header's ``nMicroBatches`` and ``MinSliceBytes``);
    None, the policy unchanged, where none is."""
    key = sims._key(result)
    took = sims.walls.get(key + (channels,), sims.longest_s)
    for policy in _thin_tries(result, sims, before, took):
        result.detail["slicing"] = policy.as_dict()
        t = sims.seconds(result, channels)
        if t is not None and t < before * (1 - THIN_GAIN):
            return t
        del result.detail["slicing"]
        if sims.time_left <= 0:
            break
    return None


def _thin_tries(result, sims: Simulations, before: float, took: float):
    """The slice policies :func:`_thinner` simulates, in its order (``before``: the program's
    seconds at hccc's default slices, whose simulation took ``took`` seconds): those its thread
    blocks can afford, smallest slice first, each looked at as it is reached, and skipped where
    its simulation (its events grow with the slots) would not end before the deadline."""
    from hccc.compiler.passes.slicing import busiest_slots, thin_policy

    ir = sims._ir(result, sims._key(result))
    slots = busiest_slots(ir, ir.slice_policy, sims.nbytes, ir.chunk_bytes)
    for policy in thin_policy(ir, sims.nbytes, before, ir.chunk_bytes):
        if took * busiest_slots(ir, policy, sims.nbytes, ir.chunk_bytes) / max(1, slots) <= sims.time_left:
            yield policy


def _thin_first(result, sims: Simulations, before: float | None, took: float):
    """The first policy of :func:`_thin_tries` (None: none). ``before`` None (the time at hccc's
    default not known yet): the policy first whatever that time is, the smallest slice of all where
    the program affords it at its least time (:meth:`Simulations.least_seconds`, which no
    simulation beats, and a longer time affords more), else None."""
    from hccc.compiler.passes.slicing import thin_policies
    if before is None:
        first = next(iter(_thin_tries(result, sims, sims.least_seconds(result), took)), None)
        return first if first is not None and first == thin_policies()[0] else None
    return next(iter(_thin_tries(result, sims, before, took)), None)


def _sliced(result, policy):
    """``result`` (its transfers shared) with the slice policy ``policy``."""
    return replace(result, detail={**result.detail, "slicing": policy.as_dict()})


def _simulated_fraction(result, sims: Simulations, bound_s: float) -> float | None:
    """Cut bound / simulated time of the program at ``sims.nbytes`` with its channels (None without
    the simulator, when the program cannot be simulated at that size, or when the deadline left no
    time: ``sims.stopped`` says so; None too where the bound is 0, a program with nothing to move,
    whose units still take time)."""
    if bound_s <= 0:
        return None
    t = sims.seconds(result, int(result.detail.get("channels", 1)))
    return bound_s / t if t is not None and t > 0 else None
