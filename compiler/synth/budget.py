"""What the phases after a search cost, predicted before it, so that ``--time-limit`` holds in every
phase: the search stops early enough to leave them their time.

``hccc synth ... --time-limit T`` runs, in order: the cluster's reading, the bounds and the search
(or packing), then the *closing phases*: the program as transfers, its proof (the verifier), its
check on the cluster's links and its ``.rccl`` text. The closing phases cannot stop half-way (a
program is proven before it is written), so the search gets ``T`` less their predicted cost
(:func:`closing_seconds`, from the transfers the collective needs at least: :func:`least_transfers`).
An AllToAll's search also leaves its list scheduler, which packs every routed hop into steps and
cannot stop either, the time it will take (:func:`schedule_seconds`, from the transfers and the
step lower bound), and routes no block past that point (the blocks left take their direct links).

The predictions are CPU seconds; a deadline counts wall seconds, so each is scaled by how many wall
seconds a CPU second of the command has taken so far (:func:`hccc.util.clock.slowdown`,
:func:`wall_seconds`): on a machine whose cores others share, the search stops as much earlier as
the phases after it will take longer. What is refused (:func:`overruns`) is decided at an idle
machine's pace, so a loaded machine refuses nothing an idle one makes: it writes the same kind of
program, found in less time.

The model, measured on a 2-core machine without a GPU
(docs/measurements.md#synthesis-speed-at-64-gpus-no-gpu, *AllToAll under --time-limit*): the
command ends by ``T + overhead``, the overhead being what the prediction
misses plus, where ``T`` is shorter than the phases that cannot stop, those phases themselves: the
list scheduler (AllToAll), the closing phases, and reading the cluster.
"""
from __future__ import annotations

#: CPU seconds of the closing phases per transfer of the program: transfers as an Algorithm, the
#: proof, the check on the links, the text and its writing. Measured on the 512-GPU AllToAll (64
#: nodes x 8, 261,632 transfers, every one a line of its own): 0.10 + 0.15 + 0.03 + 0.52 + 0.05 s
#: = 3.3 us per transfer; a 512-GPU AllReduce by trees (523,264 transfers, replayed rather than
#: proven at once: reductions) 2.8 us; a 256-GPU AllGather by the step search (65,280 transfers,
#: 30,000 of its runs folded into loops one by one) 0.11 + 0.52 s = 9.7 us. The largest, rounded up.
CLOSING_SECONDS_PER_TRANSFER = 1e-5
#: the same for an AllToAll, whose every transfer is a line of its own and whose proof is the
#: copy proof over all transfers at once: 3.3 us measured unloaded (above); 1,024 GPUs (128 nodes
#: x 8 H20, 1,047,552 transfers) 2.1 + 4.5 s of proof and text on a loaded 2-core machine, 6.3 us;
#: rounded down to 5 us, so that the search's reserve does not refuse what the scheduler and the
#: closing phases can do together within the limit (96 nodes x 8 at --time-limit 10: 2.9 s
#: predicted, where 5.9 s left the scheduler too little and refused it)
CLOSING_SECONDS_PER_ALLTOALL_TRANSFER = 5e-6
#: CPU seconds of the AllToAll list scheduler (:func:`.compose.list_schedule`, compiled) per
#: transfer and step: each step scans the transfers ready and not yet placed until every one left
#: needs a full group, so its time grows as transfers x steps. Measured with the routing order as
#: the priority: 256 GPUs (65,280 transfers, 992 steps) 0.3 s = 4.6e-9; 512 GPUs (261,632
#: transfers, 2,016 steps) 1.85-1.9 s = 3.5-3.6e-9; rounded up. (Every step scanning every ready
#: transfer, as before the early end: 6.8-8.5e-9.)
SCHEDULE_SECONDS_PER_TRANSFER_STEP = 5e-9
#: CPU seconds of the list scheduler's first compiled call in a process: numba loads the kernel
#: from its on-disk cache (measured 0.9 s; its compiling, once after an install, is not counted:
#: the work clock stands still then)
SCHEDULER_LOAD_SECONDS = 1.0


#: CPU seconds per pair of ranks (``nranks ** 2``) of the tree packing's first program on a large
#: cluster, which cannot stop once started: the setting (the networks of the halves, their cut
#: bounds, the symmetry classes, the LP's columns and its first arborescences) and the builder of the
#: first candidate (bundles, blocks per rank, rows). Measured on 128 nodes x 8 H20 (1,024 GPUs),
#: ``--time-limit 10`` on a loaded 2-core machine: AllGather 3.8 s of CPU from the packing's start to
#: its program, 3.6e-6 a pair; rounded up. An AllReduce packs its halves and the joint packing:
#: :data:`TREE_ALLREDUCE_FACTOR` times as much (5.8 s there; 512 GPUs, 1.4 s: 5.3e-6 a pair)
TREE_PROGRAM_SECONDS_PER_PAIR = 4e-6
TREE_ALLREDUCE_FACTOR = 1.6
#: CPU seconds of the closing phases (proof, link check, the engines' checks, text) per transfer
#: of a tree program, whose rows are few long loops: measured 1.2 us (AllGather, 1,047,552
#: transfers) and 3.0 us (AllReduce, 2,095,104, replayed: reductions) on 1,024 GPUs, 2.8 us on
#: the 512-GPU AllReduce (above); rounded up. What the up-front check of a tree program weighs
#: (:func:`tree_unstoppable_seconds`); the search's reserve keeps :data:`CLOSING_SECONDS_PER_TRANSFER`
CLOSING_SECONDS_PER_TREE_TRANSFER = 3.2e-6


def tree_unstoppable_seconds(collective: str, nranks: int) -> float:
    """Predicted CPU seconds of what cannot stop once the tree packing has started on ``nranks``
    ranks: its first program (:data:`TREE_PROGRAM_SECONDS_PER_PAIR`) and that program's closing
    phases over the least transfers any program has (:func:`least_transfers`)."""
    n = max(0, int(nranks))
    first = TREE_PROGRAM_SECONDS_PER_PAIR * n * n * (TREE_ALLREDUCE_FACTOR if collective == "allreduce" else 1.0)
    return first + CLOSING_SECONDS_PER_TREE_TRANSFER * least_transfers(collective, n)


#: what ``--time-limit T`` promises (docs/files-and-limits.md): the command ends by ``T`` plus
#: this share of ``T`` plus :data:`OVERRUN_SECONDS` (what a phase that cannot stop may run past
#: its share); a phase that would surely end later refuses up front instead (:func:`overruns`)
OVERRUN_FRACTION = 0.1
OVERRUN_SECONDS = 2.0


def overruns(predicted: float, left: float) -> bool:
    """True where work that cannot stop, predicted to take ``predicted`` seconds, would end past
    what the limit allows when ``left`` seconds of it are left (:data:`OVERRUN_FRACTION` of them
    plus :data:`OVERRUN_SECONDS` past them)."""
    left = float(left)
    return float(predicted) > left + OVERRUN_FRACTION * max(0.0, left) + OVERRUN_SECONDS


def least_transfers(collective: str, nranks: int, chunks_per_rank: int = 1) -> int:
    """The fewest transfers any program of ``collective`` on ``nranks`` ranks with
    ``chunks_per_rank`` chunks per rank has: each of the ``nranks * chunks_per_rank`` chunks (an
    AllToAll's blocks: ``nranks * (nranks - 1) * chunks_per_rank`` that move) must reach each of
    the ``nranks - 1`` ranks that lack it (an AllGather's, a Broadcast's), or leave each of them
    (a ReduceScatter's contributions): one transfer each; an AllReduce's chunk twice as many
    (one-way gossip: ``2 (nranks - 1)`` transfers before every rank holds every contribution)."""
    n, k = int(nranks), max(1, int(chunks_per_rank))
    if n < 2:
        return 0
    return n * (n - 1) * k * (2 if collective == "allreduce" else 1)


def closing_seconds(ntransfers: int, collective: str = "") -> float:
    """Predicted seconds of the closing phases of a program of ``collective`` (any, where not
    given) of ``ntransfers`` transfers."""
    per = CLOSING_SECONDS_PER_ALLTOALL_TRANSFER if collective == "alltoall" else CLOSING_SECONDS_PER_TRANSFER
    return per * max(0, int(ntransfers))


def wall_seconds(cpu_seconds: float) -> float:
    """The wall seconds ``cpu_seconds`` of predicted work take at this command's pace so far
    (:func:`hccc.util.clock.slowdown`)."""
    from hccc.util.clock import slowdown
    return float(cpu_seconds) * slowdown()


def schedule_seconds(ntransfers: int, steps: int) -> float:
    """Predicted seconds of the AllToAll list scheduler for ``ntransfers`` hops over about
    ``steps`` steps (loading its compiled kernel included, where it runs compiled)."""
    from hccc.compiler.synth.compose import MIN_COMPILED_TRANSFERS

    m = max(0, int(ntransfers))
    load = SCHEDULER_LOAD_SECONDS if m >= MIN_COMPILED_TRANSFERS else 0.0
    return load + SCHEDULE_SECONDS_PER_TRANSFER_STEP * m * max(1, int(steps))


__all__ = ["CLOSING_SECONDS_PER_TRANSFER", "CLOSING_SECONDS_PER_ALLTOALL_TRANSFER", "CLOSING_SECONDS_PER_TREE_TRANSFER",
           "TREE_ALLREDUCE_FACTOR", "TREE_PROGRAM_SECONDS_PER_PAIR", "tree_unstoppable_seconds", "OVERRUN_FRACTION", "OVERRUN_SECONDS", "overruns", "SCHEDULE_SECONDS_PER_TRANSFER_STEP", "SCHEDULER_LOAD_SECONDS",
           "closing_seconds", "least_transfers", "schedule_seconds", "wall_seconds"]
