"""The table mode's library units: which (dtype, op) kernels each translation unit compiles.

The generic library (``hccc_table_cuda`` / ``hccc_table_hip``) is compiled from :data:`UNITS`
translation units, ``hccc_table_unit<i>.cu`` / ``.hip``: each the generic source with a fixed set of
instances, every instance of :func:`hccc.util.dtypes.instances` in exactly one unit. The device
compiler compiles a copy of the engine per kernel entry (nvcc's cicc and ptxas: about 1.5-2.5 CPU s
each, sm_90), so a unit costs about the sum of its instances' costs plus a fixed cost (the headers
parsed, the host pass, the functions every kernel calls): the instances are dealt out by that cost,
the largest first, each to the unit with the least so far (longest processing time first), and the
units are numbered largest first, the order ``make`` starts them in. So ``make -j2`` keeps both cores
busy to the end; with element types as units (7 units of 4 or 5 instances, before) the last unit
compiled alone for about a quarter of the build.

A build that enables fewer instances (``HCCC_DTYPES`` / ``HCCC_OPS``) compiles the units holding one
of them, each with the enabled ones only (:func:`enabled_units`; the emitted Makefile and CMake files
say the same).

The costs are measurements (:data:`INSTANCE_COST_S`, :data:`UNIT_COST_S`):
``python benchmarks/table_build.py --instances`` (nvcc 13.0, sm_90, the 2-core development machine
at a load of 4-8, 29 November 2026; CPU seconds, which a quiet machine's wall time follows). Only
their ratios matter: they place instances, they never decide what is built.
"""
from __future__ import annotations

from dataclasses import dataclass

from hccc.util import dtypes as dtypes_table

#: translation units of the generic library: two per core of a ``make -j2`` build (two rounds of
#: two balanced units; a build with more cores runs them all at once), each unit's fixed cost
#: (:data:`UNIT_COST_S`) paid four times instead of seven. (Two units measured the same CPU seconds
#: for HM AllReduce 4x8's ``make -j2``, 61.0 against 61.5, and a longer wall: ``make`` balances four
#: units where the model is off; benchmarks/table_build.py.)
UNITS = 4
#: CPU seconds of a unit with no instance enabled (nvcc, sm_90; the measurement above)
UNIT_COST_S = 1.27
#: CPU seconds each (dtype, op) kernel adds to a unit (nvcc, sm_90; the measurement above)
INSTANCE_COST_S: dict[tuple[str, str], float] = {
    ("float32", "sum"): 1.54, ("float32", "max"): 2.02, ("float32", "min"): 1.87, ("float32", "prod"): 1.57,
    ("float32", "avg"): 2.23,
    ("float16", "sum"): 2.16, ("float16", "max"): 1.58, ("float16", "min"): 1.53, ("float16", "prod"): 1.48,
    ("float16", "avg"): 2.79,
    ("bfloat16", "sum"): 1.68, ("bfloat16", "max"): 1.98, ("bfloat16", "min"): 1.98, ("bfloat16", "prod"): 1.91,
    ("bfloat16", "avg"): 4.2,
    ("int32", "sum"): 2.01, ("int32", "max"): 2.07, ("int32", "min"): 1.41, ("int32", "prod"): 1.58,
    ("int64", "sum"): 1.65, ("int64", "max"): 1.62, ("int64", "min"): 1.59, ("int64", "prod"): 1.49,
    ("uint8", "sum"): 1.78, ("uint8", "max"): 1.7, ("uint8", "min"): 2.15, ("uint8", "prod"): 1.61,
    ("float64", "sum"): 1.6, ("float64", "max"): 1.87, ("float64", "min"): 1.92, ("float64", "prod"): 2.48,
    ("float64", "avg"): 3.65,
}
EXT = {"cuda": "cu", "hip": "hip"}


@dataclass(frozen=True)
class Unit:
    """One translation unit of the generic library: its number and its instances."""
    index: int
    instances: tuple[tuple[str, str], ...]   # (dtype, op), in hccc.util.dtypes' order
    cost_s: float                            # modelled CPU seconds with every instance enabled

    def source(self, platform: str) -> str:
        """The unit's source file of ``platform``."""
        return f"hccc_table_unit{self.index}.{EXT[platform]}"


def instance_cost(dtype: str, op: str) -> float:
    """The modelled CPU seconds of one (dtype, op) kernel; KeyError names an unmeasured one."""
    try:
        return INSTANCE_COST_S[(dtype, op)]
    except KeyError:
        raise KeyError(f"no measured compile cost for the instance ({dtype}, {op}): run "
                       f"benchmarks/table_build.py --instances and add it to INSTANCE_COST_S") from None


def plan_units(instances: list[tuple[str, str]], nunits: int) -> list[Unit]:
    """``instances`` dealt out to ``nunits`` units (fewer where there are fewer instances): the
    costliest first, each to the unit with the least cost so far (the lower number on a tie);
    the units numbered by cost, the largest first, each listing its instances in ``instances``'
    order. Deterministic: the same input gives the same units."""
    if nunits < 1:
        raise ValueError(f"nunits must be at least 1, not {nunits}")
    order = {inst: i for i, inst in enumerate(instances)}
    if len(order) != len(instances):
        raise ValueError("an instance is listed twice")
    n = min(nunits, len(instances))
    bins: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    load = [0.0] * n
    for inst in sorted(instances, key=lambda x: (-instance_cost(*x), order[x])):
        k = min(range(n), key=lambda j: (load[j], j))
        bins[k].append(inst)
        load[k] += instance_cost(*inst)
    ranked = sorted(range(n), key=lambda j: (-load[j], j))
    return [Unit(i, tuple(sorted(bins[j], key=order.__getitem__)), UNIT_COST_S + load[j])
            for i, j in enumerate(ranked)]


def default_units() -> list[Unit]:
    """The units of every instance the kernels have (:func:`hccc.util.dtypes.instances`)."""
    return plan_units([(d.name, o.name) for d, o in dtypes_table.instances()], UNITS)


def enabled_units(dtypes, ops, units: list[Unit] | None = None) -> list[Unit]:
    """The units a build of the instances in ``dtypes`` x ``ops`` compiles (those holding one),
    in the units' order."""
    ds, os_ = set(dtypes), set(ops)
    return [u for u in (units if units is not None else default_units())
            if any(d in ds and o in os_ for d, o in u.instances)]


__all__ = ["UNITS", "UNIT_COST_S", "INSTANCE_COST_S", "Unit", "instance_cost", "plan_units", "default_units",
           "enabled_units"]
