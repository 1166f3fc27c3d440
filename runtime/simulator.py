"""Alpha-beta(-gamma) simulation of a ProgramIR on a cluster.

What is simulated (the semantics of the generated kernels, ``templates/common/hccc_prims.h.j2``):

* Every thread block (TB) of every rank starts at time 0 and runs its primitives in order.
  **Task-level** execution (hccc's kernels): a primitive runs all of its micro-batches before the
  TB's next primitive. **Algorithm-level** execution (the MSCCL-like baseline): micro-batch ``m``
  runs the TB's whole primitive list before micro-batch ``m+1``.
* Geometry as in the kernels: with ``count`` elements, chunk ``c`` is elements
  ``[c*count//nchunks, (c+1)*count//nchunks)``; micro-batch ``m`` of a chunk is its slice of
  ``slice_bytes / element_bytes`` elements (possibly empty: empty slices still post their flags).
  A unit of work is one slice of one chunk of one primitive. The slice is a per-call choice up to
  the slot capacity the program was compiled with (``ProgramIR.chunk_bytes``): by default that
  capacity, or with ``slice_bytes="auto"`` the slice of the kernels' model that the launchers use
  too (:func:`hccc.compiler.passes.slicing.auto_slice_bytes` with the program's critical path,
  channels and policy; what ``hccc sim`` and the benchmarks use).
* Connections are FIFOs of ``NSLOTS`` slots (the kernel ABI's,
  :data:`hccc.compiler.backend.abi.NSLOTS`). The k-th slot written on a connection is the k-th
  read; a sender blocks while ``NSLOTS`` slots are unread, a receiver until its slot is visible. A unit
  starts once the TB's cross-TB dependencies for that micro-batch are met (``deps``), its receive
  slot is visible and its send slot is free.
* The kernels' units and hops (the kernel cost model, :mod:`hccc.compiler.passes.kernel_cost`;
  ``costs``, by default ``SIM_COSTS``, the measured calibration; None: neither): once its waits
  are met, a primitive's micro-batch first pays its op's fixed cost at the program's warps
  (:func:`hccc.runtime.sim_model.unit_costs`: what the slice policy counts a unit), then moves
  its slices as below; a dependency on another block of the rank is met a hop (half a flag round
  trip) after the micro-batch it waits for finished. A message's hop is its link's latency. The
  per-block limit is then a block's rate beyond its units' fixed costs.
* Costs of a unit's bytes: a reducing primitive first reduces the slice on its rank's reduction unit
  (``bytes / gamma``; free when the node declares no ``gamma``); a sending primitive then writes
  the slice into the peer's slot: a *flow* over ``Topology.link_between(src, dst)`` and every
  shared group of that link, at a max-min fair share (progressive filling) of the link capacity
  (bandwidth x lanes), of each group's capacity and of the reduction unit, recomputed whenever a
  flow starts or ends. The slot becomes visible to the receiver ``alpha`` (the link's latency)
  after the write ends; latency does not hold the link or the sender, so a stream of slots pays it
  once and a chain of dependent transfers pays it per hop. The receiver's copy out of the slot is
  not charged (it runs at memory speed, well above any link here); it frees the slot at once.
  Hence one transfer of ``S`` bytes (one slice) on an idle link takes exactly ``alpha + S*beta``,
  plus the sender's and the receiver's units where they are charged.
  Local primitives: ``REDUCE`` costs ``bytes / gamma`` like any reduction, ``COPY`` and ``NOP``
  are free. Reductions running at once on one rank share its ``gamma`` max-min fairly.
* Metrics. Completion time = when the last TB finishes. ``algbw = size / time`` and
  ``busbw = algbw * factor`` with nccl-tests' size (the collective's full buffer: AllGather output,
  ReduceScatter / AllReduce input) and factors (AllReduce ``2(n-1)/n``, AllGather and
  ReduceScatter ``(n-1)/n``). A TB is *busy* while it writes or reduces, and while a slot it is
  waiting for is being written to it; its *lifetime* is from launch to its last primitive; its idle
  ratio is ``1 - busy/lifetime`` (ResCCL Table 3's "avg idle" / "max idle"; "comm time" is the
  average busy ratio). Link utilisation = bytes carried / (capacity x completion time).
* :func:`hccc.runtime.sim_model.lower_bound` is a schedule-independent bound (bytes over capacity
  per resource, plus latency on links) that every simulated time respects.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.backend.abi import NSLOTS
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.compiler.passes.slicing import (DEFAULT_SLOT_BYTES, SLICE_ALIGN, CriticalPath, SlicePolicy, auto_slice_bytes,
                                          slot_share_bytes)
from hccc.compiler.passes.schedule import step_schedule
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.pipeline.cost_model import ALLOCATION_SIZES, CostModel

from hccc.runtime import sim_engine as eng
from hccc.runtime.busbw import busbw_factor
from hccc.compiler.passes.kernel_cost import KernelCosts
from hccc.runtime.sim_model import (DEFAULT_BLOCK_GBPS, DEFAULT_ELEMENT_BYTES, MODEL_COSTS, Geometry, SimProgram,
                                    SimulationError, flow_classes, geometry, lower_bound, prepare, resource_bytes)
from hccc.util import clock

#: Default bound on the slices one simulation may process (about a minute of engine time).
MAX_UNITS = 200_000_000
EXECUTIONS = ("task", "algorithm")
GB = 1e9

__all__ = ["NSLOTS", "EXECUTIONS", "SimResult", "Timeline", "SimulationError", "SimulationStopped", "bus_factor",
           "simulate", "simulate_by", "simulate_sizes", "prepare", "step_schedule", "build_for_execution", "faster_fusion",
           "faster_allocation", "faster_order", "SimulatedCost", "ALLOCATION_SIZES",
           "resolve_slice"]


#: nccl-tests' busbw / algbw factor (the one definition, :mod:`hccc.runtime.busbw`)
bus_factor = busbw_factor


@dataclass
class Timeline:
    """Recorded intervals: TB ``tb`` ran ``kind`` (0 send, 1 reduce, 2 receive, 3 a unit's fixed cost) of primitive
    ``prim`` for micro-batch ``mb`` over ``[t0, t1]`` seconds."""

    tb: np.ndarray
    prim: np.ndarray
    mb: np.ndarray
    kind: np.ndarray
    t0: np.ndarray
    t1: np.ndarray


@dataclass
class SimResult:
    """One simulated size (see the module docstring for the definitions)."""

    nbytes: int
    collective: str
    nranks: int
    execution: str
    time_s: float
    micro_batches: int
    lower_bound_s: float
    tb_rank: np.ndarray
    tb_local: np.ndarray
    tb_busy: np.ndarray        # seconds
    tb_finish: np.ndarray      # seconds (the TB's lifetime)
    link_bytes: np.ndarray     # per link of the cluster
    link_capacity: np.ndarray  # bytes/s per link
    link_busy: np.ndarray      # seconds with at least one flow on the link
    events: int
    wall_s: float
    timeline: Timeline | None = None
    stats: dict = field(default_factory=dict)
    slice_bytes: int = 0       # micro-batch slice used (bytes)
    slot_bytes: int = 0        # FIFO slot capacity of the program (bytes)

    @property
    def time_us(self) -> float:
        return self.time_s * 1e6

    @property
    def algbw_GBps(self) -> float:
        return self.nbytes / self.time_s / GB if self.time_s > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * bus_factor(self.collective, self.nranks)

    @property
    def ntbs(self) -> int:
        return int(len(self.tb_busy))

    @property
    def tbs_per_rank_max(self) -> int:
        return int(np.bincount(self.tb_rank, minlength=self.nranks).max()) if self.ntbs else 0

    @property
    def tb_idle(self) -> np.ndarray:
        life = self.tb_finish
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(life > 0, 1.0 - self.tb_busy / np.where(life > 0, life, 1.0), 0.0)
        return np.clip(r, 0.0, 1.0)

    @property
    def tb_idle_avg(self) -> float:
        return float(self.tb_idle.mean()) if self.ntbs else 0.0

    @property
    def tb_idle_max(self) -> float:
        return float(self.tb_idle.max()) if self.ntbs else 0.0

    @property
    def comm_time(self) -> float:
        """Average busy ratio of the TBs (ResCCL Table 3's "comm time")."""
        return 1.0 - self.tb_idle_avg

    @property
    def link_utilisation(self) -> np.ndarray:
        """Per link: bytes carried / (capacity x completion time)."""
        if self.time_s <= 0:
            return np.zeros(len(self.link_bytes))
        return self.link_bytes / (self.link_capacity * self.time_s)

    def summary(self) -> dict:
        """Plain data for ``hccc sim --json`` (one entry of ``results``)."""
        used = self.link_bytes > 0
        util = self.link_utilisation[used]
        return {
            "bytes": int(self.nbytes),
            "time_us": self.time_us,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
            "micro_batches": int(self.micro_batches),
            "chunk_bytes": int(self.slice_bytes),
            "slot_bytes": int(self.slot_bytes),
            "lower_bound_us": self.lower_bound_s * 1e6,
            "tbs": self.ntbs,
            "tbs_per_rank_max": self.tbs_per_rank_max,
            "tb_idle_avg": self.tb_idle_avg,
            "tb_idle_max": self.tb_idle_max,
            "comm_time": self.comm_time,
            "links_used": int(used.sum()),
            "link_util_avg": float(util.mean()) if len(util) else 0.0,
            "link_util_max": float(util.max()) if len(util) else 0.0,
        }


def _engine_args(prog: SimProgram, geo: Geometry, execution: str, rec_lim: int, nslots: int,
                 take_over: bool = True):
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution {execution!r} (expected task or algorithm)")
    cls = flow_classes(prog.route_res_ptr, prog.route_res, prog.rank_cres, prog.res_cap, _private(prog))
    return (0 if execution == "task" else 1, int(nslots), int(geo.nmb), int(geo.slice_elems),
            float(geo.element_bytes), int(rec_lim),
            prog.tb_ptr, prog.p_flags, prog.p_sconn, prog.p_rconn, prog.p_spos, prog.p_rpos,
            prog.p_cnt, prog.p_chunk, prog.p_rank, prog.p_route,
            prog.dep_ptr, prog.dep_on, prog.rdep_ptr, prog.rdep_tb,
            prog.c_total, prog.c_stb, prog.c_rtb, prog.c_alpha,
            prog.route_res_ptr, prog.route_res, prog.res_cap, prog.rank_cres, geo.chunk_len,
            cls.route_cls, cls.rank_cls, cls.ptr, cls.sh, cls.cap, *_unit_costs(prog), bool(take_over))


def _unit_costs(prog: SimProgram) -> tuple[np.ndarray, float]:
    """Each primitive's fixed cost a unit and the hop of a dependency (seconds; none for a
    SimProgram made without them)."""
    if prog.p_unit is None:
        return np.zeros(prog.nprims, np.float64), 0.0
    return np.asarray(prog.p_unit, np.float64), float(prog.hop)


def _private(prog: SimProgram) -> np.ndarray:
    """``prog.res_private``, or no resource private (a SimProgram made without it)."""
    if prog.res_private is None:
        return np.zeros(len(prog.res_cap), np.bool_)
    return np.asarray(prog.res_private, np.bool_)


_WAIT_TEXT = {eng.W_DEP: "waits for another TB (dependency)", eng.W_DATA: "waits for data",
              eng.W_SLOT: "waits for a free FIFO slot", eng.W_NONE: "is stuck"}


def _deadlock_message(prog: SimProgram, tb_state, tb_wait, tb_pos, tb_m) -> str:
    stuck = np.flatnonzero(tb_state != eng.S_DONE)
    parts = []
    for g in stuck[:4].tolist():
        p = int(tb_pos[g])
        what = _WAIT_TEXT.get(int(tb_wait[g]), "is stuck")
        peer = ""
        if tb_wait[g] == eng.W_DATA:
            peer = f" from rank {int(prog.c_src[prog.p_rconn[p]])}"
        elif tb_wait[g] == eng.W_SLOT:
            peer = f" towards rank {int(prog.c_dst[prog.p_sconn[p]])}"
        parts.append(f"rank {int(prog.tb_rank[g])} tb {int(prog.tb_local[g])} {what}{peer} at "
                     f"primitive {p} (micro-batch {int(tb_m[g])})")
    more = f" (and {len(stuck) - 4} more TBs)" if len(stuck) > 4 else ""
    return "simulation deadlock: " + "; ".join(parts) + more


def resolve_slice(slice_bytes, nbytes: int, nchunks: int, slot_bytes: int,
                  element_bytes: int = DEFAULT_ELEMENT_BYTES, policy: SlicePolicy | None = None, *,
                  path: CriticalPath | None = None, nchannels: int = 1) -> int:
    """The slice (bytes) one call uses: ``None`` = the slot capacity ``slot_bytes``, ``"auto"`` =
    :func:`~hccc.compiler.passes.slicing.auto_slice_bytes` for a program of critical path ``path``
    (required) and ``nchannels`` channels under its ``policy`` (hccc's default when None), with
    ``slot_bytes`` as the share, or an explicit positive number of bytes, which must fit a slot
    (the kernels address slots with the slice as stride)."""
    if slice_bytes is None:
        return int(slot_bytes)
    if isinstance(slice_bytes, str):
        if slice_bytes != "auto":
            raise ValueError(f"slice_bytes must be None, 'auto' or a number of bytes, not {slice_bytes!r}")
        if path is None:
            raise ValueError("an 'auto' slice needs the program's critical path")
        return auto_slice_bytes(nbytes, nchunks, max(int(slot_bytes), SLICE_ALIGN), element_bytes, path=path,
                                nchannels=nchannels, policy=policy or SlicePolicy())
    v = int(slice_bytes)
    if v < 1:
        raise ValueError("slice_bytes must be positive")
    if v > int(slot_bytes):
        raise ValueError(f"a slice of {v} bytes does not fit the program's {int(slot_bytes)}-byte slots")
    return v


def simulate(program: ProgramIR | SimProgram, topo: Topology, nbytes: int, *,
             execution: str = "task", element_bytes: int = DEFAULT_ELEMENT_BYTES,
             record: bool | int = False, nslots: int = NSLOTS,
             max_units: int | None = MAX_UNITS, slice_bytes: int | str | None = None,
             block_gbps: float | None = DEFAULT_BLOCK_GBPS, work_budget: int | None = None,
             deadline: float | None = None, call_geometry: tuple[Geometry, int] | None = None,
             stop: "StopSwitch | None" = None, costs: KernelCosts | None | str = MODEL_COSTS) -> SimResult:
    """Simulate one collective call of ``nbytes`` (the full buffer, nccl-tests' size).

    ``program`` is a ProgramIR or the result of :func:`prepare` (reuse it across sizes).
    ``slice_bytes`` is the micro-batch slice of this call (see :func:`resolve_slice`): by default
    the program's slot capacity ``chunk_bytes``; ``"auto"`` picks it from the size.
    ``record`` keeps the busy intervals (of every TB, or of the first ``record`` TBs when it is an
    integer) for :mod:`hccc.runtime.sim_plot`. ``max_units`` bounds the work (slices of primitives);
    past it the call fails fast with advice instead of running for hours. ``block_gbps``: the
    per-block limit (:mod:`hccc.runtime.sim_model`; None: none) and ``costs`` the kernels' unit and
    hop costs (:func:`hccc.runtime.sim_model.prepare`: the model's by default; None: none) when
    ``program`` is a ProgramIR.
    ``work_budget``: events plus re-shared flow classes after which the run stops with
    :class:`SimulationStopped` (None: no limit); ``deadline``: the work-clock time (:func:`hccc.util.clock.now`)
    at which it stops so (None: none; see :func:`simulate_by`).
    ``call_geometry``: the call's (geometry, slice bytes) as the caller computed them (an
    AllToAllv, :mod:`hccc.runtime.sim_alltoallv`), instead of ``nbytes`` and ``slice_bytes``'.
    ``stop``: a :class:`StopSwitch` another thread may turn to end the run with
    :class:`SimulationStopped`.
    Raises :class:`SimulationError` for a program that cannot run on ``topo`` or deadlocks.
    """
    prog = program if isinstance(program, SimProgram) else prepare(program, topo, block_gbps, costs)
    if int(nslots) < 1:
        raise ValueError("nslots must be at least 1")
    geo, slice_b = call_geometry or _call_geometry(prog, nbytes, slice_bytes, element_bytes)
    units = int(prog.p_cnt.sum()) * geo.nmb
    if max_units is not None and units > max_units:
        raise SimulationError(
            f"{nbytes} bytes make {geo.nmb} micro-batches of {prog.nprims} primitives ({units:,} slices, "
            f"more than the limit of {max_units:,}); use a larger chunk size")
    # ``execution`` is validated by _engine_args
    rec_lim = prog.ntbs if record is True else int(record)
    if work_budget is not None:
        _check_work_floor(prog, geo, work_budget)
    if deadline is not None:
        _check_work_floor(prog, geo, int(max(0.0, deadline - clock.now()) * work_rate()))
    t0 = clock.now()
    out = eng.run_within(work_budget, deadline, *_engine_args(prog, geo, execution, rec_lim, nslots),
                         stop=None if stop is None else stop.flag)
    wall = clock.now() - t0
    (status, t_end, _t_last, tb_finish, tb_busy, res_busy, tb_state, tb_wait, tb_pos, tb_m,
     counters, r_tb, r_prim, r_mb, r_kind, r_t0, r_t1) = out
    if status == eng.STATUS_STOPPED:
        raise SimulationStopped(f"simulation stopped by its stop switch ({int(counters[0] + counters[2]):,} "
                                f"events and re-shared flow classes)", work=int(counters[0] + counters[2]),
                                wall_s=wall)
    if status == eng.STATUS_BUDGET:
        spent = work_budget is not None and counters[0] + counters[2] > work_budget
        why = "its work budget" if spent else "its deadline"
        raise SimulationStopped(f"simulation stopped at {why} ({int(counters[0] + counters[2]):,} "
                                f"events and re-shared flow classes) before the program finished",
                                work=int(counters[0] + counters[2]), wall_s=wall)
    if status != eng.STATUS_OK:
        raise SimulationError(_deadlock_message(prog, tb_state, tb_wait, tb_pos, tb_m))
    L = prog.nlinks
    rb = resource_bytes(prog, geo)
    timeline = Timeline(r_tb, r_prim, r_mb, r_kind, r_t0, r_t1) if rec_lim > 0 else None
    return SimResult(
        nbytes=int(nbytes), collective=prog.collective, nranks=prog.nranks, execution=execution,
        time_s=float(t_end), micro_batches=int(geo.nmb), lower_bound_s=lower_bound(prog, geo),
        tb_rank=prog.tb_rank, tb_local=prog.tb_local, tb_busy=np.asarray(tb_busy),
        tb_finish=np.asarray(tb_finish), link_bytes=rb[:L], link_capacity=prog.res_cap[:L],
        link_busy=np.asarray(res_busy[:L]), events=int(counters[0]), wall_s=wall,
        timeline=timeline,
        stats={"instants": int(counters[3]), "share_components": int(counters[1]),
               "share_classes": int(counters[2]), "shares_skipped": int(counters[4])},
        slice_bytes=int(slice_b), slot_bytes=int(prog.chunk_bytes))


def _call_geometry(prog: SimProgram, nbytes: int, slice_bytes, element_bytes: int) -> tuple[Geometry, int]:
    """The geometry of one call of ``nbytes`` with ``slice_bytes`` (see :func:`simulate`), and its
    slice in bytes."""
    # the kernels give each chunk of a step 1/max_cnt of a slot (one slot per step and micro-batch)
    comm = (prog.p_flags & (eng.F_SEND | eng.F_RECV)) > 0
    share = slot_share_bytes(prog.chunk_bytes, int(prog.p_cnt[comm].max()) if comm.any() else 1)
    slot = share if slice_bytes is None or isinstance(slice_bytes, str) else prog.chunk_bytes
    slice_b = min(resolve_slice(slice_bytes, int(nbytes), prog.nchunks, slot, element_bytes, prog.policy,
                                path=prog.path, nchannels=prog.nchannels), share)
    return geometry(int(nbytes), prog.nchunks, slice_b, element_bytes), slice_b


def least_time(program: ProgramIR, topo: Topology, nbytes: int, *,
               element_bytes: int = DEFAULT_ELEMENT_BYTES) -> float:
    """Seconds no simulation of ``program`` at ``nbytes`` beats, whatever its channels, slices or
    schedule: every link, shared group and reduction unit carries the program's bytes at no more
    than its capacity (:func:`hccc.runtime.sim_model.lower_bound` without the per-block limit and
    without the units' fixed costs, whose count follows the slice), at the cost of counting bytes
    instead of running the engine."""
    prog = prepare(program, topo, None, None)
    return lower_bound(prog, _call_geometry(prog, nbytes, "auto", element_bytes)[0])


class SimulationStopped(SimulationError):
    """A simulation given a work budget or a deadline (:func:`simulate_by`) that stopped, or did
    not start, because the program needs more; ``work``: what it did (0 when it did not start)."""

    def __init__(self, message: str, *, work: int = 0, wall_s: float = 0.0):
        super().__init__(message)
        self.work = int(work)
        self.wall_s = float(wall_s)


class StopSwitch:
    """What another thread turns to stop running simulations (:func:`simulate`'s ``stop``): each
    event loop given it looks at it every :data:`~hccc.runtime.sim_engine.CLOCK_EVERY` instants and
    ends with :class:`SimulationStopped`; one not yet started stops at once."""

    def __init__(self):
        self.flag = np.zeros(1, np.int64)

    def turn(self) -> None:
        self.flag[0] = 1

    @property
    def turned(self) -> bool:
        return bool(self.flag[0])


#: work (events plus re-shared flow classes) per second :func:`simulate_by` assumes, until this
#: process has timed a simulation, to refuse a run whose least work the time left cannot buy: the
#: compiled engine on a loaded 2-core machine (a re-shared class costs ~0.1 us, an event a few;
#: tree programs of 24-64 GPUs measured 7-18 M/s here, so this leaves room for a machine a few
#: times slower; the run itself stops by the clock, see :func:`simulate_by`)
ASSUMED_WORK_PER_S = 2_000_000.0
#: runs of less work than this are not timed for the rate (their wall time is mostly overhead)
RATE_MIN_WORK = 50_000
#: the fastest rate timed in this process (None until one run of ``RATE_MIN_WORK`` has been timed)
_measured_rate: list[float] = []


def work_rate() -> float:
    """Work per second :func:`simulate_by` counts on: the fastest this process has timed (a run
    that included numba's compile or plain Python is slower and does not lower it), else
    :data:`ASSUMED_WORK_PER_S`."""
    return max(_measured_rate) if _measured_rate else ASSUMED_WORK_PER_S


def _time_rate(work: int, wall_s: float) -> None:
    if work >= RATE_MIN_WORK and wall_s > 0:
        _measured_rate.append(work / wall_s)


def _check_work_floor(prog: SimProgram, geo: Geometry, budget: int) -> None:
    """Refuse at once a run whose least work exceeds ``budget``: every sending primitive ends one
    flow per micro-batch (an event each), however the bandwidth is shared."""
    sends = int(np.count_nonzero(prog.p_flags & eng.F_SEND))
    least = sends * int(geo.nmb)
    if least > budget:
        raise SimulationStopped(f"simulation not started: it needs at least {least:,} events, "
                                f"more than its budget of {int(budget):,}")


def simulate_by(deadline: float, program: ProgramIR | SimProgram, topo: Topology, nbytes: int,
                **kw) -> SimResult:
    """:func:`simulate` that ends by ``deadline`` (a work-clock time (:func:`hccc.util.clock.now`)) with its
    result or with :class:`SimulationStopped`: the event loop looks at the clock as it runs and
    stops cleanly at the deadline, and a run whose least work (an event per sending primitive and
    micro-batch) the time left cannot buy at :func:`work_rate` does not start. (Where the platform
    gives the compiled loop no clock, the time left buys a work budget at that rate instead.)
    Preparing a ProgramIR is not bounded (pass a prepared program to keep it out of the deadline)."""
    left = deadline - clock.now()
    if left <= 0:
        raise SimulationStopped("simulation not started: no time left")
    if not eng.HAVE_CLOCK:
        kw["work_budget"] = int(left * work_rate())
    try:
        res = simulate(program, topo, nbytes, deadline=deadline, **kw)
    except SimulationStopped as exc:
        _time_rate(exc.work, exc.wall_s)
        raise
    _time_rate(res.events + int(res.stats.get("share_classes", 0)), res.wall_s)
    return res


def simulate_sizes(program: ProgramIR | SimProgram, topo: Topology, sizes, *,
                   slice_bytes: int | str | None = "auto", block_gbps: float | None = DEFAULT_BLOCK_GBPS,
                   costs: KernelCosts | None | str = MODEL_COSTS, **kw) -> list[SimResult]:
    """:func:`simulate` for every size, preparing the program once. Unlike :func:`simulate`, the
    slice follows each size by default (``slice_bytes="auto"``, the policy ``hccc sim`` uses);
    pass ``slice_bytes=None`` for the program's slot capacity at every size."""
    prog = program if isinstance(program, SimProgram) else prepare(program, topo, block_gbps, costs)
    return [simulate(prog, topo, s, slice_bytes=slice_bytes, **kw) for s in sizes]


# ---------------------------------------------------------------------------- programs per mode
# ---------------------------------------------------------------------------- the compile's cost model
#: slices (primitives x micro-batches at the largest size) from which the cost model simulates the
#: programs it compares side by side (a few seconds of the event loop each)
SIDE_BY_SIDE_UNITS = 1_000_000


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def side_by_side(calls) -> list:
    """The results of the callables ``calls``, run side by side on threads (the compiled event
    loop releases the GIL), at most :func:`usable_cpus` at once, the first ones first (put the
    longest first); in order, the first exception raised once every call has ended. One call, or
    one CPU: run here, one after the other."""
    calls = list(calls)
    workers = min(len(calls), usable_cpus())
    if workers <= 1:
        return [c() for c in calls]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hccc-sim") as pool:
        futures = [pool.submit(c) for c in calls]
    return [f.result() for f in futures]


def _units(prog: SimProgram, nbytes: int) -> int:
    """Slices one :func:`simulate` of ``prog`` at ``nbytes`` processes (auto slice)."""
    comm = (prog.p_flags & (eng.F_SEND | eng.F_RECV)) > 0
    share = slot_share_bytes(prog.chunk_bytes, int(prog.p_cnt[comm].max()) if comm.any() else 1)
    slice_b = min(resolve_slice("auto", int(nbytes), prog.nchunks, share, policy=prog.policy, path=prog.path,
                                nchannels=prog.nchannels), share)
    return int(prog.p_cnt.sum()) * geometry(int(nbytes), prog.nchunks, slice_b).nmb


class SimulatedCost(CostModel):
    """The compile's cost model (:class:`hccc.compiler.pipeline.cost_model.CostModel`): a program's
    time on ``topo`` by simulation at each of ``sizes`` (slice per size, as ``hccc sim``);
    ``block_gbps``: the simulator's per-block limit."""

    #: programs whose simulations are kept for :meth:`simulated` (the last ones predicted)
    KEEP = 2

    def __init__(self, topo: Topology, sizes=ALLOCATION_SIZES, block_gbps: float | None = DEFAULT_BLOCK_GBPS):
        self.topo = topo
        self.sizes = tuple(sizes)
        self.block_gbps = block_gbps
        self._kept: list[tuple[ProgramIR, int, SimProgram, list[SimResult]]] = []

    @property
    def cluster_name(self) -> str:
        return self.topo.name

    def times(self, ir: ProgramIR) -> list[float]:
        return self.times_of([ir])[0]

    def times_of(self, irs) -> list[list[float]]:
        """:meth:`times` of each program; large ones (from :data:`SIDE_BY_SIDE_UNITS` slices at
        the largest size) are simulated side by side on threads of their own (the compiled
        event loop releases the GIL), each simulation as it would run alone."""
        progs = [prepare(ir, self.topo, self.block_gbps) for ir in irs]

        def run(prog):
            return simulate_sizes(prog, self.topo, self.sizes)

        big = max(self.sizes, default=0)
        if all(_units(p, big) >= SIDE_BY_SIDE_UNITS for p in progs):
            results = side_by_side([functools.partial(run, p) for p in progs])
        else:
            results = [run(p) for p in progs]
        for ir, prog, res in zip(irs, progs, results):
            self._kept = [*self._kept[-(self.KEEP - 1):], (ir, int(ir.nchannels), prog, res)]
        return [[r.time_s for r in res] for res in results]

    def simulated(self, ir: ProgramIR) -> tuple[SimProgram, dict[int, SimResult]] | None:
        """The prepared program and the results by size (:func:`simulate` with its defaults and
        ``slice_bytes="auto"``) of one of the last programs :meth:`times` predicted, when ``ir``
        is that very program with the same channels, else None: a caller that simulates the
        program a choice kept need not simulate it again."""
        for kept, nch, prog, results in reversed(self._kept):
            if kept is ir and nch == int(ir.nchannels):
                return prog, {r.nbytes: r for r in results}
        return None


def faster_allocation(alg, topo: Topology, state_ir: ProgramIR | None = None, *, sizes=ALLOCATION_SIZES,
                      scheduler: str = "hpds", chunk_bytes: int = DEFAULT_SLOT_BYTES,
                      fuse: bool = False, block_gbps: float | None = DEFAULT_BLOCK_GBPS) -> ProgramIR:
    """:func:`hccc.compiler.pipeline.cost_model.faster_allocation` by simulation on ``topo`` for a
    program built outside a compile (``state_ir``, default the state-based build of ``alg``)."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline.cost_model import faster_allocation as choose

    ir = state_ir if state_ir is not None else build_program(
        alg, scheduler=scheduler, tb_alloc="state", chunk_bytes=chunk_bytes, fuse=fuse)
    return choose(SimulatedCost(topo, sizes, block_gbps), ir, lambda: build_program(
        alg, scheduler=scheduler, tb_alloc="connection", chunk_bytes=ir.chunk_bytes, fuse=fuse))


def faster_order(alg, topo: Topology, ir: ProgramIR, *, sizes=ALLOCATION_SIZES, scheduler: str = "hpds",
                 fuse: bool = False, block_gbps: float | None = DEFAULT_BLOCK_GBPS) -> ProgramIR:
    """:func:`hccc.compiler.pipeline.cost_model.faster_order` by simulation on ``topo`` for a
    program built outside a compile (``ir``: step-ordered, with the allocation it keeps); ``ir``
    itself where the step order moved nothing."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline.cost_model import faster_order as choose

    al = ir.allocation
    if not al.phase_order_moved:
        return ir
    mode = "connection" if al.tb_alloc_kept == "connection" else (al.tb_alloc or "state")
    return choose(SimulatedCost(topo, sizes, block_gbps), ir, lambda: build_program(
        alg, scheduler=scheduler, tb_alloc=mode, chunk_bytes=ir.chunk_bytes, fuse=fuse, phase_order=False))


def faster_fusion(alg, topo: Topology, plain_ir: ProgramIR, fused_ir: ProgramIR | None = None, *,
                  sizes=ALLOCATION_SIZES, scheduler: str = "hpds",
                  chunk_bytes: int | None = None) -> ProgramIR:
    """:func:`hccc.compiler.pipeline.cost_model.faster_fusion` by simulation on ``topo``.
    ``fused_ir`` defaults to the fused build of ``alg`` with the faster allocation on ``topo``,
    compared at the plain program's channel count."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline.cost_model import faster_fusion as choose

    if fused_ir is None:
        from hccc.compiler.passes.channels import with_channels
        fused_ir = build_program(alg, scheduler=scheduler, tb_alloc="state", fuse=True,
                                 chunk_bytes=chunk_bytes or plain_ir.chunk_bytes)
        # compared at the plain program's channel count (each thread block's blocks)
        fused_ir = with_channels(fused_ir, int(getattr(plain_ir, "nchannels", 1)))
        fused_ir = faster_allocation(alg, topo, fused_ir, sizes=sizes, scheduler=scheduler, fuse=True)
    return choose(SimulatedCost(topo, sizes, DEFAULT_BLOCK_GBPS), plain_ir, fused_ir)


def build_for_execution(alg, execution: str = "task", *, scheduler: str = "hpds",
                        tb_alloc: str | None = None, chunk_bytes: int = DEFAULT_SLOT_BYTES,
                        fuse: bool = False, topology: Topology | None = None,
                        sizes=ALLOCATION_SIZES, block_gbps: float | None = DEFAULT_BLOCK_GBPS) -> ProgramIR:
    """The ProgramIR each execution mode runs; ``chunk_bytes`` is its FIFO slot capacity (the
    largest slice a call may use: simulate with ``slice_bytes="auto"`` to follow the size).

    ``task``: hccc's pipeline (``scheduler``, ``tb_alloc`` default state-based; ``fuse=True``
    lowers with receive-and-forward fusion, the compiler's ``--fuse``, for comparisons). With a
    ``topology``, state-based allocation is the faster of the two there (:func:`faster_allocation`
    at ``sizes``), and TBs run by step first unless the schedule's key order is strictly faster
    there (:func:`faster_order`).
    ``algorithm``: the MSCCL-like baseline: transfers in step order (no cross-step fusion, since a
    fused pair would span two steps) and connection-based TBs unless ``tb_alloc`` says otherwise.
    """
    from hccc.compiler.passes.build import build_algorithm_level, build_program

    if execution == "task":
        ir = build_program(alg, scheduler=scheduler, tb_alloc=tb_alloc or "state",
                           chunk_bytes=chunk_bytes, fuse=fuse)
        if topology is not None and (tb_alloc or "state") == "state":
            ir = faster_allocation(alg, topology, ir, sizes=sizes, scheduler=scheduler, fuse=fuse,
                                   block_gbps=block_gbps)
        if topology is not None:
            ir = faster_order(alg, topology, ir, sizes=sizes, scheduler=scheduler, fuse=fuse,
                              block_gbps=block_gbps)
        return ir
    if execution == "algorithm":
        return build_algorithm_level(alg, tb_alloc=tb_alloc or "connection", chunk_bytes=chunk_bytes)
    raise ValueError(f"unknown execution {execution!r} (expected task or algorithm)")
