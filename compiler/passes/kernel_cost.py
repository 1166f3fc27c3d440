"""The kernels' cost model: what a unit, a hop, a block's bytes, an LL line, the launch and a FIFO's
slots cost on a GPU, and how a program's units compose into its time.

One module holds every cost of the generated kernels; the slice policy
(:mod:`hccc.compiler.passes.slicing`: a unit's cost ``c`` and a block's bandwidth ``B``), the
simulator (:data:`SIM_COSTS`: every unit's fixed cost and every dependency's hop,
:func:`hccc.runtime.sim_model.unit_costs`; its per-block limit :data:`SIM_BLOCK_GBPS`, ``hccc sim
--block-bw``, and :func:`block_gbps_at`, through :mod:`hccc.compiler.passes.channels`) and
``benchmarks/kernel_model.py`` read it; ``--fuse``'s, the thread-block allocation's and
synthesis' choices read it through the simulator; so do the built-in catalog's small-message
choices within a node (``ONE_SHOT_BANDS``, ``ONE_SHOT_BYTES``, ``RD_ALLGATHER_MIN_RANKS``:
:func:`hccc.runtime.kernel_time.program_time` with ``one_gpu=False``, recomputed by
tests/test_one_shot.py) and ``--proto auto``'s switch (``abi.LL_AUTO_MAX_BYTES``:
:func:`hccc.runtime.kernel_time.ll_ahead_up_to`, recomputed by tests/test_kernel_cost.py). The
built-in catalog's band of the all-pairs and recursive-doubling programs (``SMALL_BYTES``, 64 KiB)
is not a crossover of this model, which puts them ahead further up (its docstring). Two named
instances of the costs: the measured calibration (:data:`V4_H200`, the simulator's default) and
the v4 design targets (:data:`DESIGN_TARGETS`). Each constant names the GPU run and the table of
docs/archive/measurements-log.md it comes from; ``benchmarks/recorded/gpu_runs.json`` holds
those tables as data and tests/test_kernel_cost.py checks every constant against it.

**Units** (the kernels' grain, docs/kernel-protocol.md): a unit is one micro-batch of one
primitive on one block: wait for its inputs, move its slice, post. :class:`KernelCosts` holds one
kernel generation's unit-level figures on one card:

- a unit's fixed cost by its op and the block's warps (:meth:`KernelCosts.fixed_seconds`): the
  slope of one block's time over its units with the bytes fixed (the fifth run's
  ``slot_anatomy`` table; the v3 kernels' ``slot_cost`` slope, every op alike);
- its bytes (:meth:`KernelCosts.bytes_seconds`; a unit of an op: :func:`hccc.runtime.kernel_time.unit_seconds`): the loads (``HBM_COST``'s reads per byte moved:
  a reduction loads twice) at one block's copy rate by unit size and warps, interpolated in the
  fifth run's copy-engine table (the time of a COPY unit of that size less that of the smallest
  one, the fixed part), or at a flat rate where a run measured none; under LL a line carries
  :data:`LL_DATA_FRACTION` of data, and a unit pays a COPY unit's fixed cost (it waits for no flag
  word and posts none);
- an N-source unit (a receive group, :mod:`hccc.compiler.ir.reduce_groups`): one
  RECV_REDUCE_COPY unit whose loads are its ``k`` received regions and its source
  (:func:`hccc.runtime.kernel_time.unit_seconds`' ``sources``), every message into it one hop,
  where the kernels modelled form it (:func:`hccc.runtime.kernel_time.group_units`: the GPU
  kernels under LL, not the table mode's generic kernels; elsewhere the group's rows are units of
  their own, as those kernels run them);
- a hop (:meth:`KernelCosts.hop_seconds`): what a unit's post takes to reach the unit that waits
  for it on another block, half a flag round trip between two SMs (the ping-pong of the fifth
  run);
- the launch (:meth:`KernelCosts.launch_seconds`): a cost per block of the grid (no recorded run
  measured a launch alone: see :data:`LAUNCH_SECONDS_PER_BLOCK`), or, from a run that did
  (``benchmarks/slot_anatomy.py``'s launch rows), its measured launches by blocks;
- the HBM bound: every byte the kernels read or write (``kernel_traffic``) at the card's rate.

**Bytes in flight** (:func:`block_bytes_in_flight`, :func:`block_bytes_per_round`): what one
block's copy engine has loaded and not yet stored, counted from the engine's structure
(:mod:`hccc.compiler.ir.engine_shape`: the vectors a data thread loads before its first
store, in registers and, on CUDA sm_90, through shared memory; every warp but the sync
warp moves data), not measured. With the round trip the fifth run's
copy rate implies for the v4 engine by Little's law (:data:`LOAD_ROUND_TRIP_SECONDS`), a block's
bytes moved per round give :func:`predicted_block_bytes_per_second`: a prediction for another
engine shape, which no run has measured.

**Composition** (:func:`hccc.runtime.kernel_time.program_time`, in the runtime layer: it counts
the kernels' traffic with :mod:`hccc.runtime.kernel_traffic`): the program's units form a graph: a block runs its
primitives in order, each over all its micro-batches (task-level execution, as the engine does);
micro-batch ``i`` of a primitive waits for micro-batch ``i`` of the primitives it depends on and of
the send its receive is matched with (one hop); and **slot back-pressure**: a connection's FIFO
has :data:`NSLOTS` slots, so its message ``k + NSLOTS`` cannot be written before the receiver
consumed message ``k`` (one hop back). The call takes the launch plus the longest path through
that graph (each unit its cost, each hop its latency), or the HBM bound if longer. Nothing is
fitted to a program: a program the model does not explain is named with a hypothesis by
``benchmarks/kernel_model.py --recorded``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.ir.engine_shape import ASYNC_THREADS, VECTOR_BYTES, vectors_per_source
from hccc.compiler.ir.program_ir import Op

__all__ = ["UNIT_WARPS", "UNIT_US", "COPY_UNIT_KIB", "COPY_GBS", "FLAG_ROUND_TRIP_US", "LL_DATA_FRACTION",
           "LAUNCH_SECONDS_PER_BLOCK", "HBM_BYTES_PER_SECOND", "KernelCosts", "V4_H200",
           "UNIT_SECONDS", "COPY_UNIT_SECONDS", "LL_UNIT_SECONDS", "BLOCK_BYTES_PER_SECOND", "SIM_COSTS",
           "DESIGN_TARGETS", "SIM_BLOCK_GBPS", "FOLDED_BLOCK_GBPS", "BLOCK_GBPS_WARPS", "block_gbps_at", "unit_class",
           "LEAST_DATA_WARPS", "least_block_threads", "block_bytes_in_flight", "block_bytes_per_round",
           "LOAD_ROUND_TRIP_SECONDS", "predicted_block_bytes_per_second"]

# ---------------------------------------------------------------------------------------------
# the measured figures (docs/archive/measurements-log.md, "The fifth GPU run": one H200, the v4 kernels)
# ---------------------------------------------------------------------------------------------
#: warps a block of the fifth run's unit table ran with (its columns)
UNIT_WARPS = (1, 4, 16)
#: What one unit costs its block beyond its bytes, us, by op and :data:`UNIT_WARPS` (the fifth
#: run's table "What one unit costs, before and after", v4 rows: ``slot_anatomy`` units, one block,
#: one primitive over 4 MiB in units of 64 KiB down to 1 KiB, peers pre-satisfied, the slope of the
#: time over the units).
UNIT_US = {
    "COPY": (2.72, 2.02, 2.07),
    "SEND": (3.14, 2.46, 2.47),
    "RECV": (3.99, 2.55, 2.56),
    "RECV_REDUCE_COPY": (4.05, 2.63, 2.65),
}
#: unit sizes (KiB) of the fifth run's copy-engine figures ("One block's copy engine")
COPY_UNIT_KIB = (4, 16, 64, 256, 512)
#: GB/s one block's COPY units moved over 64 MiB, by warps, at :data:`COPY_UNIT_KIB` (the fifth
#: run, "One block's copy engine")
COPY_GBS = {
    16: (2.0, 7.7, 21.2, 36.9, 42.2),
    4: (2.0, 7.3, 14.9, 20.0, 21.3),
    1: (1.4, 3.7, 6.4, 7.7, 8.0),
}
#: The fewest data warps a GPU block is launched with when too many blocks would otherwise not be
#: resident at once: the runtime halves the threads per block down to the sync warp and these
#: (:func:`least_block_threads`), then refuses, saying to pack the program into fewer blocks
#: (fewer channels, state-based thread blocks). The fifth run: one warp (in lock-step, lane 0 the
#: sync lane) moved 6.4 GB/s on 64 KiB units where four warps moved 14.9, and paid 2.72 us a COPY
#: unit against 2.02; HM AllReduce 4x8's 2,048 blocks of one data warp each took 77 ms for 32 MiB.
LEAST_DATA_WARPS = 2


def least_block_threads(warp: int) -> int:
    """Threads of the smallest block the runtime launches on a GPU whose warp (wavefront) is
    ``warp`` threads: the sync warp and :data:`LEAST_DATA_WARPS` data warps."""
    return int(warp) * (1 + LEAST_DATA_WARPS)


#: A flag's round trip between two SMs, us: the v4 kernels' relaxed poll + acquire fence / release
#: fence + relaxed post (the fifth run, "Flag round trip between two SMs"); a hop is half of it.
FLAG_ROUND_TRIP_US = 1.13
#: Data bytes per byte of an LL line: 8 of a 16-byte line, the rest its two 4-byte flags (the v4
#: kernels' layout, docs/kernel-protocol.md: a structure, not a measurement). Under LL a block
#: moves this share of its copy rate as payload, and a slot holds this share of its Simple bytes.
LL_DATA_FRACTION = 0.5
#: What launching a call costs per block of its grid, seconds. No run timed a launch alone: this is
#: the fifth run's direct AllGather 8 at 4 KiB (127 us, "Programs": the program of the shortest
#: critical path, 3 units) less its critical path by this model, over its 112 blocks (1.07 us; the
#: first to fourth runs' same row gives 0.96-1.04 us with the v3 kernels' units). A hypothesis, not
#: a measurement: the blocks' start (the cooperative launch and each block reading its program)
#: grows with the grid; ``benchmarks/kernel_model.py --recorded`` marks that row as the calibration.
LAUNCH_SECONDS_PER_BLOCK = 1.07e-6
#: Bytes a second the H200's HBM reads and writes (the fifth run: "about 1.0 ms at the card's 4.3
#: TB/s"; the first, third and fourth runs' device-to-device copy, 2.08-2.15 TB/s copied).
HBM_BYTES_PER_SECOND = 4.3e12


def unit_class(op: int) -> str:
    """The row of :data:`UNIT_US` a primitive's unit is charged at: a receive that reduces at
    RECV_REDUCE_COPY's, another receive at RECV's, a send at SEND's, a copy (and REDUCE, NOP: no
    peer) at COPY's."""
    o = Op(int(op))
    if o.receives:
        return "RECV_REDUCE_COPY" if o.reduces else "RECV"
    if o.sends:
        return "SEND"
    return "COPY"


def _interp_warps(values: tuple[float, ...], warps_axis: tuple[int, ...], warps: float) -> float:
    """``values`` at ``warps``, linear in log2(warps) between the axis' warps, clamped outside."""
    x = math.log2(max(1.0, float(warps)))
    xs = [math.log2(w) for w in warps_axis]
    return float(np.interp(x, xs, values))


@dataclass(frozen=True)
class KernelCosts:
    """One kernel generation's unit-level figures on one card (module docstring).

    ``unit_us``: op class -> fixed cost a unit (us) at each of ``warps``; ``copy_kib`` and
    ``copy_gbs`` (warps -> GB/s at each size): a block's copy rate by unit size, or ``flat_gbs``
    (one rate, any size and warps) where none was measured; ``flag_round_trip_us``;
    ``launch_per_block_s``; ``hbm_bytes_per_s`` (read + write); ``nslots`` (FIFO slots a
    connection; None: the kernel ABI's, ``abi.NSLOTS``); ``source``: the run and tables these come from;
    ``launch_us_by_blocks``: ((blocks, us), ...) a run measured a launch at (``slot_anatomy``'s
    launch rows), which :meth:`launch_seconds` interpolates instead of ``launch_per_block_s``."""

    unit_us: dict
    warps: tuple[int, ...]
    flag_round_trip_us: float
    launch_per_block_s: float
    hbm_bytes_per_s: float
    copy_kib: tuple[int, ...] = ()
    copy_gbs: dict = field(default_factory=dict)
    flat_gbs: float | None = None
    nslots: int | None = None
    source: str = ""
    launch_us_by_blocks: tuple = ()

    def fixed_seconds(self, op_class: str, warps: float, proto: str = "simple") -> float:
        """A unit's cost beyond its bytes: its op's row at ``warps``; under LL a COPY unit's."""
        row = self.unit_us["COPY" if proto == "ll" else op_class]
        return _interp_warps(tuple(row), self.warps, warps) / 1e6

    def _copy_curve(self, warps: float) -> tuple[np.ndarray, np.ndarray]:
        """(unit sizes, a COPY unit's time at each) of the copy-engine table at ``warps`` (the rates
        interpolated between the table's warps, :func:`_interp_warps`)."""
        sizes = np.array([k * 1024 for k in self.copy_kib], np.float64)
        ws = tuple(sorted(self.copy_gbs))
        rates = np.array([_interp_warps(tuple(self.copy_gbs[w][i] for w in ws), ws, warps)
                          for i in range(len(sizes))])
        return sizes, sizes / (rates * 1e9)

    def copy_rate(self, unit_bytes: float, warps: float) -> float:
        """Bytes a second one block of ``warps`` warps copies in COPY units of ``unit_bytes``: the
        copy-engine table, its times interpolated between its unit sizes (the flat rate where a run
        measured none)."""
        if not self.copy_kib:
            return float(self.flat_gbs) * 1e9
        sizes, times = self._copy_curve(warps)
        u = float(np.clip(unit_bytes, sizes[0], sizes[-1]))
        return u / float(np.interp(u, sizes, times))

    def bytes_seconds(self, loads: float, warps: float) -> float:
        """What ``loads`` bytes of a unit's loads add to its fixed cost on a block of ``warps``
        warps: the copy-engine table's time for a unit of that size less its smallest unit's (the
        fixed part), linear from none at no bytes to it, past the largest unit the table's last
        slope; or ``loads`` at the flat rate."""
        loads = max(0.0, float(loads))
        if not self.copy_kib:
            return loads / (float(self.flat_gbs) * 1e9)
        sizes, times = self._copy_curve(warps)
        extra = times - times[0]
        if loads <= sizes[-1]:
            return float(np.interp(loads, np.r_[0.0, sizes], np.r_[0.0, extra]))
        slope = (extra[-1] - extra[-2]) / (sizes[-1] - sizes[-2])
        return float(extra[-1] + (loads - sizes[-1]) * slope)

    def peak_bytes_per_second(self, warps: float) -> float:
        """A block's copy rate on long units (the copy-engine table's last slope, or the flat rate)."""
        if not self.copy_kib:
            return float(self.flat_gbs) * 1e9
        sizes, times = self._copy_curve(warps)
        return float((sizes[-1] - sizes[-2]) / (times[-1] - times[-2]))

    def hop_seconds(self) -> float:
        """A post reaching the unit that waits for it on another block: half a flag round trip."""
        return self.flag_round_trip_us * 0.5e-6

    def launch_seconds(self, blocks: int) -> float:
        """Launching a grid of ``blocks`` blocks: the measured launches interpolated in the blocks
        (past the largest grid measured, its last slope; below the smallest, its time), or the cost
        per block times the blocks where no launch was measured."""
        b = max(1, int(blocks))
        if not self.launch_us_by_blocks:
            return self.launch_per_block_s * b
        pts = sorted((int(x), float(y)) for x, y in self.launch_us_by_blocks)
        xs, ys = [x for x, _ in pts], [y for _, y in pts]
        if b > xs[-1] and len(xs) > 1:
            us = ys[-1] + (b - xs[-1]) * max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        else:
            us = float(np.interp(b, xs, ys))
        return max(0.0, us) * 1e-6


#: The v4 kernels on an H200, as the fifth run measured them: hccc's costs.
V4_H200 = KernelCosts(
    unit_us={k: tuple(v) for k, v in UNIT_US.items()}, warps=UNIT_WARPS, flag_round_trip_us=FLAG_ROUND_TRIP_US,
    launch_per_block_s=LAUNCH_SECONDS_PER_BLOCK, hbm_bytes_per_s=HBM_BYTES_PER_SECOND, copy_kib=COPY_UNIT_KIB,
    copy_gbs={w: tuple(v) for w, v in COPY_GBS.items()},
    source="docs/archive/measurements-log.md, The fifth GPU run (H200, kernels v4)")

# ---------------------------------------------------------------------------------------------
# what the slice policy and the simulator read (each derived from the figures above)
# ---------------------------------------------------------------------------------------------
#: warps of a block as the CUDA kernels are emitted (512 threads), at which the policy's figures hold
BLOCK_GBPS_WARPS = 16
#: The slice policy's ``c`` (Simple): a unit's fixed cost at 16 warps, the median of the fifth
#: run's SEND, RECV and RECV_REDUCE_COPY rows (2.47, 2.56, 2.65 us): 2.56 us.
UNIT_SECONDS = float(np.median([V4_H200.fixed_seconds(k, BLOCK_GBPS_WARPS)
                                for k in ("SEND", "RECV", "RECV_REDUCE_COPY")]))
#: A COPY unit's fixed cost at 16 warps (the fifth run's COPY row: 2.07 us).
COPY_UNIT_SECONDS = V4_H200.fixed_seconds("COPY", BLOCK_GBPS_WARPS)
#: An LL unit's fixed cost: a COPY unit's (its lines carry their flags: no flag word to wait for).
LL_UNIT_SECONDS = COPY_UNIT_SECONDS
#: The slice policy's ``B`` (Simple): a block of 16 warps' copy rate on long units, the slope of the
#: fifth run's copy-engine curve between its 256 and 512 KiB units (49.3 GB/s).
BLOCK_BYTES_PER_SECOND = V4_H200.peak_bytes_per_second(BLOCK_GBPS_WARPS)
#: The costs the simulator charges by default (:func:`hccc.runtime.sim_model.unit_costs`: a unit's
#: fixed cost by its op and warps, a dependency's hop): the measured calibration, :data:`V4_H200`.
SIM_COSTS = V4_H200
#: GB/s one block of 16 warps moves beyond its units' fixed costs (the simulator's per-block
#: limit, ``hccc sim --block-bw``): the slice policy's ``B``, :data:`BLOCK_BYTES_PER_SECOND` (the
#: fifth run's copy-engine curve on long units, 49.3 GB/s). The simulator charges every unit its
#: fixed cost apart (:data:`SIM_COSTS`), so its block moves bytes at the rate that remains.
SIM_BLOCK_GBPS = round(BLOCK_BYTES_PER_SECOND / 1e9, 6)
#: GB/s one block of 16 warps moves on 64 KiB units, their fixed costs folded in (the fifth run's
#: copy-engine table there, 21.2 GB/s): the per-block limit of a simulation that charges no unit
#: (``costs=None``), as the simulator had before it charged units; 64 KiB is a 1 MiB slot's 16th,
#: the slices hccc's programs reach at the simulator's sizes.
FOLDED_BLOCK_GBPS = round(V4_H200.copy_rate(64 << 10, BLOCK_GBPS_WARPS) / 1e9, 6)


def block_gbps_at(block_gbps: float, nwarps: int) -> float:
    """GB/s a block of ``nwarps`` warps moves where one of :data:`BLOCK_GBPS_WARPS` moves
    ``block_gbps``: scaled as the fifth run's copy-engine rate on long units
    (:meth:`KernelCosts.peak_bytes_per_second`) scales with the warps (1, 4, 16 warps: 8.3, 22.7,
    49.3 GB/s; the rates between them linear in log2 of the warps), never above ``block_gbps``."""
    w = max(1, int(nwarps))
    return float(block_gbps) * min(1.0, V4_H200.peak_bytes_per_second(w)
                                   / V4_H200.peak_bytes_per_second(BLOCK_GBPS_WARPS))


# ---------------------------------------------------------------------------------------------
# bytes in flight: the engine's structure (hccc.compiler.ir.engine_shape), not a measurement
# ---------------------------------------------------------------------------------------------
def _data_threads_and_vectors(warps: int, reduces: bool, warp: int, async_loads: bool) -> tuple[int, int]:
    """(data threads, vectors each loads from one source before its first store) of a block of
    ``warps`` warps: every warp but the sync warp, each thread the engine's unrolled body, and with
    ``async_loads`` its shared-memory vectors too where the buffer has room for every data thread
    (``engine_shape.ASYNC_THREADS``); a one-warp block's lanes but the sync lane, one vector each
    (``hccc_vblocks`` has no whole warp of data threads there: every vector is remainder, one a
    thread)."""
    w = max(1, int(warps))
    if w == 1:
        return int(warp) - 1, 1
    threads = (w - 1) * int(warp)
    return threads, vectors_per_source(reduces, async_loads=async_loads and threads <= ASYNC_THREADS)


def block_bytes_in_flight(warps: int, reduces: bool = False, *, warp: int = 32, async_loads: bool = True) -> int:
    """Bytes of loads one block of ``warps`` warps has in flight at once in its copy engine: data
    threads x vectors a source x sources (two when it reduces) x 16 B (a structure). ``async_loads``:
    the engine as built on CUDA sm_90, whose data threads also load
    ``engine_shape.ASYNC_VECTORS`` vectors through shared memory (16 warps: 15 x 32 x 10 x 16 =
    76,800 B copying, 15 x 32 x 5 x 2 x 16 reducing); without (the v4 engine, HIP): 61,440 B both."""
    threads, vectors = _data_threads_and_vectors(warps, reduces, warp, async_loads)
    return threads * vectors * (2 if reduces else 1) * VECTOR_BYTES


def block_bytes_per_round(warps: int, reduces: bool = False, *, warp: int = 32, async_loads: bool = True) -> int:
    """Bytes one block stores per round of its loads (one round trip): data threads x vectors a
    source x 16 B (16 warps: 76,800 B copying, 38,400 B reducing, a reduction loading two sources;
    without ``async_loads`` 61,440 and 30,720 B)."""
    threads, vectors = _data_threads_and_vectors(warps, reduces, warp, async_loads)
    return threads * vectors * VECTOR_BYTES


#: The round trip of one round of loads, seconds, that the fifth run's copy rate implies by
#: Little's law: the v4 engine's bytes per round at :data:`BLOCK_GBPS_WARPS` warps (61,440 B, a
#: structure: registers only) over its measured copy rate on long units
#: (:data:`BLOCK_BYTES_PER_SECOND`, 49.3 GB/s): 1.25 us. A derived figure: it folds in whatever
#: else a round of the copy loop waits for.
LOAD_ROUND_TRIP_SECONDS = block_bytes_per_round(BLOCK_GBPS_WARPS, async_loads=False) / BLOCK_BYTES_PER_SECOND


def predicted_block_bytes_per_second(bytes_per_round: float) -> float:
    """A prediction, not a measurement: the bytes a second one block moves on long units if a round
    of ``bytes_per_round`` takes :data:`LOAD_ROUND_TRIP_SECONDS` (Little's law at the v4 engine's
    measured round trip; the v4 shape itself gives back :data:`BLOCK_BYTES_PER_SECOND`)."""
    return float(bytes_per_round) / LOAD_ROUND_TRIP_SECONDS


#: The v4 kernels' design targets (docs/measurements.md#gpu-kernels-v4-one-nvidia-h200-every-rank-on-it,
#: "What one unit costs": 0.5 us a unit, 0.2 us a COPY or LL unit, 100 GB/s a block, the slice
#: policy's constants until the fifth run measured them): the second named instance of the costs, for the worked examples written at those figures
#: (tests/conftest.py's ``design_target_costs``). The targets name no flag latency (a unit's cost
#: holds its flag: no hop), launch or card of their own (the measured calibration's).
DESIGN_TARGETS = KernelCosts(
    unit_us={"COPY": (0.2,) * 3, "SEND": (0.5,) * 3, "RECV": (0.5,) * 3, "RECV_REDUCE_COPY": (0.5,) * 3},
    warps=UNIT_WARPS, flag_round_trip_us=0.0, launch_per_block_s=LAUNCH_SECONDS_PER_BLOCK,
    hbm_bytes_per_s=HBM_BYTES_PER_SECOND, flat_gbs=100.0,
    source="docs/measurements.md#gpu-kernels-v4-one-nvidia-h200-every-rank-on-it (the v4 kernels' design targets)")
