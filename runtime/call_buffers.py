"""A one-rank call's arrays (:class:`~hccc.runtime.communicator.Communicator`): the caller's numpy
arrays, torch tensors or CUDA arrays as (address, elements, dtype, device) (:func:`as_buf`), checked
against the backend, and routed to the kernel's input and output (:func:`route`): the arrays
themselves, aliased where the collective's in-place layout asks for it, or a temporary output
copied back where the program's buffers cannot alias the way the call asks.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.collectives import OWN, CollectiveSpec
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.util import dtypes as dtypes_table

DTYPES = dtypes_table.DTYPE_NAMES
#: numpy's element types (and their __cuda_array_interface__ typestr) of every dtype of the one
#: table, hccc.util.dtypes (bfloat16: ml_dtypes' or torch's, matched by name)
_NP_NAMES = {np.dtype(d.numpy): d.name for d in dtypes_table.DTYPES if d.name != "bfloat16"}
_TYPESTR = {np.dtype(d.numpy).newbyteorder("<").str: d.name for d in dtypes_table.DTYPES if d.name != "bfloat16"}


class CallError(RuntimeError):
    """A call the program cannot make (the Communicator raises it as its own error)."""


class Buf:
    """A caller's array as (address, elements, dtype name, device kind)."""

    def __init__(self, ptr: int, n: int, dtype: str, device: str, keep=None):
        self.ptr, self.n, self.dtype, self.device, self.keep = ptr, n, dtype, device, keep

    def overlaps(self, other: "Buf", es: int) -> bool:
        """Whether the two arrays share an element."""
        return bool(self.n and other.n and other.ptr < self.ptr + self.n * es
                    and self.ptr < other.ptr + other.n * es)


def torch_strided(a):
    """torch's dense layout (torch is imported by whoever passed the tensor ``a``)."""
    import torch
    return torch.strided


class Bfloat16Bits:
    """bfloat16 elements given as their bit patterns: ``bits``, a uint16 numpy array, used in place
    (numpy has no bfloat16 type; the ranks of one process take these instead of torch tensors,
    whose import costs seconds)."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits


class DeviceArray:
    """``n`` elements of ``dtype`` (a name of :mod:`hccc.util.dtypes`) at ``ptr`` in a GPU
    platform's memory: what the ranks of one process take where the caller holds its arrays on the
    host (:func:`hccc.runtime.local_job.staged_on_device` makes them; bfloat16 included, which no
    array interface names)."""

    def __init__(self, ptr: int, n: int, dtype: str):
        self.ptr, self.n, self.dtype = int(ptr), int(n), str(dtype)


def as_buf(a, what: str) -> Buf:
    """``a`` (a numpy array, a torch tensor, a CUDA array or a DLPack object) as a :class:`Buf`;
    TypeError / ValueError naming ``what`` for anything the kernels cannot take."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        name = str(a.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise TypeError(f"{what}: torch dtype {a.dtype} is not one of {', '.join(DTYPES)}")
        if a.layout != torch_strided(a):
            raise TypeError(f"{what}: a {str(a.layout).replace('torch.', '')} tensor; the collectives "
                            "take dense (strided) tensors: pass .to_dense()")
        if a.is_neg() or a.is_conj():      # lazy views: memory holds other values than the tensor
            raise ValueError(f"{what}: a lazily {'negated' if a.is_neg() else 'conjugated'} view, whose "
                             "memory does not hold its values: pass .resolve_neg() / .resolve_conj()")
        if not a.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")
        return Buf(int(a.data_ptr()), int(a.numel()), name, "cuda" if a.is_cuda else a.device.type, a)
    if isinstance(a, Bfloat16Bits):
        bits = a.bits
        if not (isinstance(bits, np.ndarray) and bits.dtype == np.uint16):
            raise TypeError(f"{what}: bfloat16 bit patterns are a uint16 numpy array")
        if not (bits.flags.c_contiguous and bits.flags.writeable):
            raise ValueError(f"{what}: the array must be C-contiguous and writable")
        return Buf(int(bits.ctypes.data), int(bits.size), "bfloat16", "cpu", bits)
    if isinstance(a, DeviceArray):
        if a.dtype not in DTYPES:
            raise TypeError(f"{what}: element type {a.dtype} is not one of {', '.join(DTYPES)}")
        return Buf(a.ptr, a.n, a.dtype, "cuda", a)
    if isinstance(a, np.ndarray):
        name = _NP_NAMES.get(a.dtype) or ("bfloat16" if a.dtype.name == "bfloat16" else None)
        if name is None:
            raise TypeError(f"{what}: numpy dtype {a.dtype} is not one of {', '.join(DTYPES)}")
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"{what}: the array must be C-contiguous and writable")
        return Buf(int(a.ctypes.data), int(a.size), name, "cpu", a)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        name = _TYPESTR.get(cai["typestr"])
        if name is None:
            raise TypeError(f"{what}: element type {cai['typestr']} is not one of {', '.join(DTYPES)}")
        n = int(np.prod(cai["shape"])) if cai["shape"] else 1
        strides = cai.get("strides")
        if strides is not None and tuple(strides) != tuple(
                int(np.prod(cai["shape"][i + 1:])) * np.dtype(cai["typestr"]).itemsize
                for i in range(len(cai["shape"]))):
            raise ValueError(f"{what}: the array must be C-contiguous")
        return Buf(int(cai["data"][0]), n, name, "cuda", a)
    if hasattr(a, "__dlpack__"):
        return as_buf(np.from_dlpack(a), what)
    raise TypeError(f"{what}: expected a numpy array, a torch tensor or a CUDA array "
                    f"(__cuda_array_interface__), not {type(a).__name__}")


def sync_caller(a) -> None:
    """Wait for the work the caller queued on its current stream (the kernel runs on the
    communicator's own stream, after a host barrier)."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        import torch
        torch.cuda.current_stream(a.device).synchronize()
    elif mod == "cupy":
        import cupy
        cupy.cuda.get_current_stream().synchronize()


def call_arrays(method: str, x, out, platform: str, same_buffer: bool = False) -> tuple[Buf, Buf | None]:
    """The call's input and output (None when ``out`` is; the input again with ``same_buffer``) as
    :class:`Buf`, of one dtype and on the memory the ``platform`` backend runs in."""
    bx = as_buf(x, f"{method}: input")
    bo = bx if same_buffer else (as_buf(out, f"{method}: output") if out is not None else None)
    if bo is not None and bo.dtype != bx.dtype:
        raise TypeError(f"{method}: input is {bx.dtype} but output is {bo.dtype}")
    kind = device_kind(platform)
    for b, what in ((bx, "input"), (bo, "output")):
        if b is not None and b.device != kind:
            raise ValueError(f"{method}: the {what} lives on {b.device}; the {platform} "
                             f"backend needs {'host' if kind == 'cpu' else 'GPU'} arrays")
    return bx, bo


def device_kind(platform: str) -> str:
    """Where the arrays of a backend live: ``"cpu"`` (the CPU emulation) or ``"cuda"``."""
    return "cpu" if platform == "cpu" else "cuda"


def full_count(spec: CollectiveSpec, method: str, bx: Buf, bo: Buf | None, unit: int, nranks: int) -> int:
    """The call's full-buffer element count (nccl-tests' S: the output's for a collective sized
    by its output; SendRecv's every rank's part, so ``nranks`` times the input), a whole number
    of ``unit`` equal blocks (AllToAll, SendRecv; 1 for the others)."""
    count = (bo.n if bo is not None else -1) if spec.full_buffer == "output" else bx.n
    if count < 0:
        raise ValueError(f"{method}: needs an output array")
    count *= spec.parts_in_full(nranks)     # SendRecv: the input is one of nranks equal parts
    if count % unit:
        raise ValueError(f"{method}: {count} elements do not split into {unit} equal blocks "
                         f"({nranks} ranks x {unit // nranks} pieces)")
    return count


def at_place(bx: Buf, bo: Buf | None, in_off: int, out_off: int, es: int) -> bool:
    """Whether the input and output are the collective's in-place layout (an all_gather input
    at its place in the output, a reduce_scatter output at its place in the input)."""
    if bo is None:
        return False
    return bool((in_off >= 0 and bx.ptr == bo.ptr + in_off * es)
                or (out_off >= 0 and bo.ptr == bx.ptr + out_off * es))


def source_text(ir: ProgramIR) -> str:
    """What declared the program's placements, for messages."""
    src = ir.origin.source
    return {"mscclpp-plan": "MSCCL++ plan ('inplace': true)"}.get(
        src, 'MSCCL XML (outofplace="0")' if src == "msccl-xml" else "source")


def route(ir: ProgramIR, spec: CollectiveSpec, rank: int, method: str, bx: Buf, bo: Buf | None,
          inplace: bool, row, count: int, es: int, kind: str):
    """(input pointer, output pointer, copy-back) of rank ``rank``'s kernel for a call of ``count``
    elements on ``bx`` / ``bo`` whose layout row (:func:`hccc.runtime.launcher.program_layout`) is
    ``row``; copy-back is None, or (temporary output, destination, bytes) to copy after the call.
    CallError where the program is not proven for the placement asked; ValueError for arrays of
    the wrong size or overlapping other than in the collective's in-place layout."""
    n_in, n_out, _scr, in_off, out_off = row
    if bool(inplace) not in ir.placements and not inplace and not at_place(bx, bo, in_off, out_off, es):
        raise CallError(f"{ir.name} is proven in place only (its {source_text(ir)} declares it); "
                        f"call {method} in place")
    # an in-place call of a program proven out of place only (an MSCCL XML with inplace="0") runs
    # out of place into a temporary output and copies it back
    alias = True in ir.placements
    if inplace:
        if alias and in_off >= 0 and bx.n == n_out:
            return bx.ptr + in_off * es, bx.ptr, None
        if alias and out_off >= 0 and bx.n == n_in:
            return bx.ptr, bx.ptr + out_off * es, None
        # the algorithm's buffers cannot alias this way: a temporary output, copied back
        if kind != "cpu":
            raise CallError(f"{method} in place is not supported by {ir.name}'s buffers on a GPU; pass out=")
        tmp = np.empty(max(n_out, 1) * es // 4 + 1, dtype=np.uint32)
        return bx.ptr, int(tmp.ctypes.data), (tmp, bx.ptr, min(n_out, bx.n) * es)
    if bx.n != n_in:
        share = "its share of" if spec.input == OWN else "the"
        raise ValueError(f"{method}: rank {rank}'s input holds {bx.n} elements; {share} "
                         f"{count}-element {method} needs {n_in}")
    if bo.n != n_out:
        raise ValueError(f"{method}: rank {rank}'s output holds {bo.n} elements; a "
                         f"{count}-element {method} gives it {n_out}")
    if bx.overlaps(bo, es):
        # the collective's in-place layout (an all_gather input at its place in the output, a
        # reduce_scatter output at its place in the input) runs in place, as the program allows
        placed = at_place(bx, bo, in_off, out_off, es)
        if placed and alias:
            return bx.ptr, bo.ptr, None
        raise ValueError(f"{method}: input and output overlap" + (
            f"; {ir.name} is proven out of place only" if placed else
            " other than in the collective's in-place layout (this rank's block of the larger buffer)"))
    return bx.ptr, bo.ptr, None


__all__ = ["CallError", "Buf", "Bfloat16Bits", "DeviceArray", "as_buf", "torch_strided", "sync_caller", "call_arrays", "device_kind",
           "full_count", "at_place", "source_text", "route"]
