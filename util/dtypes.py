"""The element types and reduction operators of hccc's kernels: the one table every layer reads.

The kernels (``hccc_prims.h``'s instantiation macros), the CPU emulation, the runtimes' builds, the
numpy reference, ``hccc run -d/-o``, ``hccc fuzz`` and the catalogue all take their lists, names,
sizes and C types from :data:`DTYPES` and :data:`OPS` here, so a type or operator added here is
added everywhere (and one left out of a layer fails its tests, not a user).

Semantics (what the kernels compute and :mod:`hccc.runtime.reference` checks, independently):

* **sum**, **prod**: integer results wrap modulo 2**bits (two's complement for the signed types,
  computed in unsigned arithmetic in the kernels, so an overflow is never undefined behaviour);
  floating results are rounded to the element type after every operation (float16 / bfloat16
  through float32, correctly rounded).
* **max**, **min**: for floating types IEEE 754 maxNum / minNum (C's ``fmax`` / ``fmin``, numpy's
  ``fmax`` / ``fmin``): a NaN loses to a number, the result is NaN only where every operand is.
  So the result does not depend on the order of the reduction.
* **avg**: floating types scale first, as NCCL's ``ncclAvg`` does on floats: every rank's
  contribution is multiplied by ``1/nranks`` rounded to the element type (the product rounded to
  the type) as it is first read from the rank's input buffer, then the scaled contributions are
  summed. An average that is representable therefore never overflows on the way (float16 40000
  on 8 ranks, float32 3e38). Integer types have no kernel for ``avg`` (a sum divided at the end
  needs to know where the end is, which hccc's kernels do not): :func:`check_instance` refuses it
  with the reason, and callers fall back or sum and divide themselves.

A collective that reduces nothing (AllGather, Broadcast, AllToAll) ignores the operator.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """One element type of the kernels."""
    name: str          # hccc's name (-d, manifests, kernel symbols)
    ctype: str         # the C type of the kernels' instantiation (hccc_platform.h / hccc_cpu_emu.h)
    bytes: int         # element size
    kind: str          # "float", "int" (two's complement) or "uint"
    numpy: str         # numpy's dtype of an element as the host holds it (bfloat16: float32 values)
    nccl: str          # nccl-tests' -d name
    #: largest magnitude every partial sum of the generated small-integer test data may reach and
    #: stay exact in the type (the significand's range for floats, the positive range for integers)
    exact: int

    @property
    def floating(self) -> bool:
        return self.kind == "float"


@dataclass(frozen=True)
class RedOp:
    """One reduction operator of the kernels."""
    name: str          # hccc's name (-o, manifests, kernel symbols)
    const: str         # the C constant (template argument RED of the kernels)
    code: int          # its value (hccc_platform.h's enum)
    nccl: str          # nccl-tests' -o name
    integer: bool      # has kernels for the integer types


#: every element type, in the order of the kernels' instantiation macros
DTYPES: tuple[DType, ...] = (
    DType("float32", "float", 4, "float", "float32", "float", 1 << 24),
    DType("float16", "hccc_half", 2, "float", "float16", "half", 1 << 11),
    DType("bfloat16", "hccc_bf16", 2, "float", "float32", "bfloat16", 1 << 8),
    DType("int32", "int32_t", 4, "int", "int32", "int32", 1 << 30),
    DType("int64", "int64_t", 8, "int", "int64", "int64", 1 << 62),
    DType("uint8", "uint8_t", 1, "uint", "uint8", "uint8", 1 << 7),
    DType("float64", "double", 8, "float", "float64", "double", 1 << 53),
)
#: every reduction operator, in the order of the kernels' instantiation macros
OPS: tuple[RedOp, ...] = (
    RedOp("sum", "HCCC_SUM", 0, "sum", True),
    RedOp("max", "HCCC_MAX", 1, "max", True),
    RedOp("min", "HCCC_MIN", 2, "min", True),
    RedOp("prod", "HCCC_PROD", 3, "prod", True),
    RedOp("avg", "HCCC_AVG", 4, "avg", False),
)

DTYPE_NAMES: tuple[str, ...] = tuple(d.name for d in DTYPES)
OP_NAMES: tuple[str, ...] = tuple(o.name for o in OPS)
_DT = {d.name: d for d in DTYPES}
_OP = {o.name: o for o in OPS}


def dtype(name: str) -> DType:
    """The element type called ``name`` (hccc's name or nccl-tests'); ValueError names the known ones."""
    d = _DT.get(name) or next((x for x in DTYPES if x.nccl == name), None)
    if d is None:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(DTYPE_NAMES)})")
    return d


def redop(name: str) -> RedOp:
    """The reduction operator called ``name``; ValueError names the known ones."""
    o = _OP.get(name)
    if o is None:
        raise ValueError(f"unknown op {name!r} (expected one of {', '.join(OP_NAMES)})")
    return o


def element_bytes(name: str) -> int:
    return dtype(name).bytes


def instance_error(dtype_name: str, op_name: str) -> str | None:
    """Why the kernels have no instance for (dtype, op), or None where they have one."""
    d, o = dtype(dtype_name), redop(op_name)
    if not d.floating and not o.integer:
        return (f"op {o.name} has no kernel for the integer type {d.name}: hccc's {o.name} scales every "
                f"contribution by 1/nranks before the sum, which only floating types can (for integers, "
                f"run sum and divide the result by the number of ranks)")
    return None


def check_instance(dtype_name: str, op_name: str) -> None:
    """ValueError with the reason where the kernels have no (dtype, op) instance."""
    why = instance_error(dtype_name, op_name)
    if why:
        raise ValueError(why)


def instances() -> list[tuple[DType, RedOp]]:
    """Every (dtype, op) pair the kernels instantiate, in the macros' order."""
    return [(d, o) for d in DTYPES for o in OPS if instance_error(d.name, o.name) is None]


def only_instance_flags(dtype_name: str, op_name: str) -> list[str]:
    """The ``-DHCCC_ENABLE_*`` flags that keep one (dtype, op) instance of an emitted module."""
    dtype(dtype_name), redop(op_name)
    return ([f"-DHCCC_ENABLE_{d.name.upper()}={int(d.name == dtype_name)}" for d in DTYPES]
            + [f"-DHCCC_ENABLE_{o.name.upper()}={int(o.name == op_name)}" for o in OPS])


__all__ = ["DType", "RedOp", "DTYPES", "OPS", "DTYPE_NAMES", "OP_NAMES", "dtype", "redop", "element_bytes",
           "instance_error", "check_instance", "instances", "only_instance_flags"]
