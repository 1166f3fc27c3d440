"""The middle of the pipeline: Algorithm -> DAG -> schedule -> lower -> TB allocation -> checks -> ProgramIR.

Fusion back-off. Without fusion every primitive of task ``t`` has order key ``K(t)`` = (sub-pipeline,
insertion position) on every rank, TBs run in key order and every dependency goes from a smaller to
a larger key, so the wait graph is acyclic by construction. A fused primitive ties two tasks whose
keys differ; in unusual programs that can close a cycle. :func:`build_program` therefore runs the
deadlock check and, if it finds a cycle, forbids the fusions on that cycle and lowers again (after a
few rounds it disables fusion altogether). A deadlock in the unfused program would be a bug and is
raised as such.
"""
from __future__ import annotations

import dataclasses
import re
import time

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_fifo_order, check_structure
from hccc.compiler.passes.lower import lower
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.compiler.passes.schedule import Schedule
from hccc.compiler.passes.tb_alloc import allocate

MAX_FUSION_RETRIES = 8


def sanitize_identifier(text: str, default: str = "algo") -> str:
    """A C identifier ``[A-Za-z_][A-Za-z0-9_]{0,63}`` derived from arbitrary text; never empty."""
    s = re.sub(r"[^A-Za-z0-9_]+", "_", str(text)).strip("_")
    s = re.sub(r"_+", "_", s)
    if not s:
        s = default
    if s[0].isdigit():
        s = "_" + s
    return s[:64]


def schedule_algorithm(alg: Algorithm, dag, scheduler: str = "hpds") -> Schedule:
    if scheduler == "hpds":
        from hccc.compiler.passes.hpds import hpds
        return hpds(alg, dag)
    if scheduler in ("rr", "round_robin", "round-robin"):
        from hccc.compiler.passes.round_robin import round_robin
        return round_robin(alg, dag)
    raise ValueError(f"unknown scheduler {scheduler!r} (expected hpds or rr)")


def check_program(ir: ProgramIR) -> None:
    """The IR checks of an unfused lowering (structure, FIFO order, deadlock freedom), for a caller
    that runs them itself (:func:`build_program` with ``check=False``, e.g. beside code
    generation). The lowering of a verified algorithm passes them: a failure is an internal error."""
    check_structure(ir)
    check_fifo_order(ir)
    try:
        check_deadlock(ir)
    except DeadlockError as exc:
        raise AssertionError(f"internal error: unfused lowering deadlocks: {exc}") from None


def build_from_schedule(alg: Algorithm, dag, sched: Schedule, *, tb_alloc: str = "state",
                        chunk_bytes: int = 1 << 20, name: str | None = None, fuse: bool = True,
                        check: bool = True, timings: dict | None = None, phase_order: bool = True) -> ProgramIR:
    """Lower a scheduled algorithm, allocate TBs and run the IR checks (with fusion back-off).
    ``check=False`` (only without fusion: the back-off needs the checks) leaves them to the caller
    (:func:`check_program`). ``phase_order=False``: TBs run their primitives in the schedule's key
    order, not by step first (:mod:`hccc.compiler.passes.phase_order`; the cost model compares
    both)."""
    if not check and fuse:
        raise ValueError("fusion needs the IR checks (its back-off is driven by them)")
    nm = sanitize_identifier(name if name is not None else alg.header.name)
    forbid: set[tuple[int, int]] = set()
    use_fusion = fuse
    t = timings if timings is not None else {}
    for attempt in range(MAX_FUSION_RETRIES + 2):
        t0 = time.perf_counter()
        low = lower(alg, dag, sched, fuse=use_fusion, forbid=forbid)
        if not phase_order:
            low = dataclasses.replace(low, phase=None)
        t1 = time.perf_counter()
        ir = allocate(low, tb_alloc, name=nm, nwarps=alg.header.nwarps, chunk_bytes=chunk_bytes)
        t2 = time.perf_counter()
        t["lower"] = t.get("lower", 0.0) + t1 - t0
        t["tb_alloc"] = t.get("tb_alloc", 0.0) + t2 - t1
        if not check:
            break
        if not use_fusion:          # an unfused lowering has nothing to back off from
            check_program(ir)
            t["checks"] = t.get("checks", 0.0) + time.perf_counter() - t2
            break
        check_structure(ir)
        check_fifo_order(ir)
        try:
            check_deadlock(ir)
        except DeadlockError as exc:
            t["checks"] = t.get("checks", 0.0) + time.perf_counter() - t2
            inv = exc.split if len(exc.split) else exc.involved
            inv = inv[ir.prims["task2"][inv] >= 0]
            pairs = set(zip(ir.prims["task"][inv].tolist(), ir.prims["task2"][inv].tolist()))
            pairs -= forbid
            if not pairs or attempt >= MAX_FUSION_RETRIES:
                use_fusion = False
            forbid |= pairs
            continue
        t["checks"] = t.get("checks", 0.0) + time.perf_counter() - t2
        break
    ir.stats.update({
        "transfers": int(alg.ntransfers),
        "subpipelines": int(sched.nsubpipelines),
        "scheduler": sched.scheduler,
        "fusion_backoffs": len(forbid),
    })
    ir.allocation = dataclasses.replace(ir.allocation, fusion=bool(use_fusion))
    ir.micro_batches = int(alg.header.micro_batches)     # the header's slice policy (slicing.SlicePolicy)
    ir.min_slice_bytes = int(alg.header.min_slice_bytes)
    return ir


def scheduler_name(scheduler: str) -> str:
    """The name a program's ``stats["scheduler"]`` records for ``scheduler``."""
    return "rr" if scheduler in ("rr", "round_robin", "round-robin") else scheduler


def build_program(alg: Algorithm, *, scheduler: str = "hpds", tb_alloc: str = "state",
                  chunk_bytes: int = 1 << 20, name: str | None = None, fuse: bool = False,
                  timings: dict | None = None, check: bool = True, phase_order: bool = True) -> ProgramIR:
    """Run dag -> schedule -> lower -> TB allocation -> checks; ``stats`` holds transfers,
    subpipelines, tbs_state_based, tbs_connection_based, tbs_per_rank_max, scheduler, tb_alloc.
    ``check=False`` (without ``fuse``) skips the IR checks; the caller runs :func:`check_program`.
    (A compile runs the same steps as passes over its context, :mod:`hccc.compiler.pipeline.compile`.)

    ``fuse`` (off by default) merges a receive and the send that forwards the same chunk into one
    fused primitive (recvCopySend / recvReduceCopySend). It saves a pass over memory; fused traffic
    runs on channels and TBs of its own, one per connection pair (:mod:`.lower`), beside the unfused
    traffic of the same links, which the simulator finds slower on some programs
    (benchmarks/fusion.py), so the compiler fuses by default only where its cost model
    (:func:`hccc.compiler.pipeline.cost_model.faster_fusion`) finds it never slower on the given cluster.
    ``phase_order``: see :func:`build_from_schedule`."""
    from hccc.compiler.passes.dag import build_dag
    t = timings if timings is not None else {}
    t0 = time.perf_counter()
    dag = build_dag(alg)
    t1 = time.perf_counter()
    sched = schedule_algorithm(alg, dag, scheduler)
    t2 = time.perf_counter()
    t["dag"] = t1 - t0
    t["schedule"] = t2 - t1
    ir = build_from_schedule(alg, dag, sched, tb_alloc=tb_alloc, chunk_bytes=chunk_bytes, name=name,
                             fuse=fuse, timings=t, check=check, phase_order=phase_order)
    ir.stats["scheduler"] = scheduler_name(scheduler)
    return ir


def build_algorithm_level(alg: Algorithm, *, tb_alloc: str = "connection", chunk_bytes: int = 1 << 20,
                          name: str | None = None, timings: dict | None = None, dag=None) -> ProgramIR:
    """The program MSCCL-style algorithm-level execution runs best (what the MSCCL XML export
    starts from): transfers in step order (:func:`~hccc.compiler.passes.schedule.step_schedule`, no
    fusion, since a fused pair would span two steps) on one thread block per connection end unless
    ``tb_alloc`` says otherwise. Every micro-batch runs a TB's whole list, so a TB that served
    several connections one after another (state-based allocation) would serialise them.
    ``dag``: the algorithm's DAG when the caller has built it (a compile shares its own)."""
    from hccc.compiler.passes.dag import build_dag
    from hccc.compiler.passes.schedule import step_schedule
    t = timings if timings is not None else {}
    if dag is None:
        t0 = time.perf_counter()
        dag = build_dag(alg)
        t["dag"] = t.get("dag", 0.0) + time.perf_counter() - t0
    ir = build_from_schedule(alg, dag, step_schedule(alg), tb_alloc=tb_alloc, chunk_bytes=chunk_bytes,
                             name=name, fuse=False, timings=t)
    ir.stats["scheduler"] = "step"
    return ir


__all__ = ["build_program", "scheduler_name", "check_program", "build_algorithm_level", "build_from_schedule", "schedule_algorithm", "sanitize_identifier"]
