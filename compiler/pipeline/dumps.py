"""What ``hccc ALGO --dump-after STAGE`` writes: the representation a stage made
(:data:`~hccc.compiler.pipeline.compile.STAGES`), as text a reader takes back where one exists.

- ``algorithm``: ResCCLang text (:func:`~hccc.compiler.frontend.rccl_text.algorithm_text`),
  an input like any ``.rccl``.
- ``dag``: JSON (``"hccc.dag/1"``): the task count, the dependency edges and each task's link and
  chunk number (:class:`~hccc.compiler.passes.dag.DependencyDAG`'s columns).
- ``schedule``: JSON (``"hccc.schedule/1"``): the scheduler, each task's sub-pipeline and the
  insertion order (:class:`~hccc.compiler.passes.schedule.Schedule`).
- ``lowered``, ``program-ir``: the ProgramIR's JSON form (:meth:`~hccc.compiler.ir.program_ir.
  ProgramIR.to_json`), an input of every command that reads a program; compiling it emits the same
  kernels as the compile it was dumped from.
"""
from __future__ import annotations

import json

import numpy as np

from hccc.compiler.ir.program_ir import int_list_text
from hccc.compiler.pipeline.context import CompileContext

DAG_SCHEMA = "hccc.dag/1"
SCHEDULE_SCHEMA = "hccc.schedule/1"


def _columns(obj, names) -> dict:
    return {k: np.asarray(getattr(obj, k)) for k in names}


def _json(v) -> str:
    """``v`` as one line of JSON; an integer column joined without a Python object per value."""
    if isinstance(v, np.ndarray):
        return "[" + int_list_text(v).replace(",", ", ") + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_json(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def _text(doc: dict) -> str:
    """``doc`` as JSON, a top-level entry a line (a column stays on its line)."""
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {_json(v)}" for k, v in doc.items()) + "\n}\n"


def dag_json(dag) -> str:
    """A :class:`~hccc.compiler.passes.dag.DependencyDAG` as JSON (the CSR helpers left out: they
    follow from the edges)."""
    doc = {"schema": DAG_SCHEMA, "ntasks": int(dag.ntasks),
           "edges": _columns(dag, ("edge_src", "edge_dst")),
           "tasks": _columns(dag, ("link", "chunk_index")),
           "links": _columns(dag, ("link_src", "link_dst")),
           "chunk_ids": np.asarray(dag.chunk_ids)}
    return _text(doc)


def schedule_json(schedule) -> str:
    """A :class:`~hccc.compiler.passes.schedule.Schedule` as JSON."""
    doc = {"schema": SCHEDULE_SCHEMA, "scheduler": schedule.scheduler,
           "nsubpipelines": int(schedule.nsubpipelines), **_columns(schedule, ("subpipeline", "order"))}
    return _text(doc)


def dump(ctx: CompileContext, stage: str) -> str:
    """The text of ``stage``'s representation in ``ctx`` (which ran through that stage)."""
    if stage == "algorithm":
        from hccc.compiler.frontend.rccl_text import algorithm_text
        return algorithm_text(ctx.algorithm)
    if stage == "dag":
        return dag_json(ctx.dag)
    if stage == "schedule":
        return schedule_json(ctx.schedule)
    if stage == "lowered":
        return ctx.lowered.to_json()
    if stage == "program-ir":
        return ctx.ir.to_json()
    raise ValueError(f"unknown stage {stage!r}")


__all__ = ["dump", "dag_json", "schedule_json", "DAG_SCHEMA", "SCHEDULE_SCHEMA"]
