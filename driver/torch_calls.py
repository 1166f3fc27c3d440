"""The torch.distributed calls the ``"hccc"`` backend serves, as one table: :data:`TORCH_CALLS`.

Each :class:`TorchCall` names a method torch calls on a process group, the collective of
:data:`~hccc.compiler.frontend.collectives.SPECS` it runs as through an algorithm of the catalog
(None: the delegate backend always carries it) and its *form*: how torch passes the buffers, which
picks the adapter that turns the call's arguments into the collective's input and output buffer,
root and op (:func:`hccc.torch.forms.install` makes every method of :mod:`hccc.torch.process_group`
from this table; the spec says the rest: whether it reduces, has a root, which buffer is the full
one, how input and output overlay).

This module imports no torch, so that what does not need torch (``hccc catalog``'s list of the
collectives a catalog should cover) reads the same table.
"""
from __future__ import annotations

from dataclasses import dataclass

from hccc.compiler.frontend.collectives import SPECS

# the forms: how torch passes a call's buffers
#: ``(tensors, opts)``: one tensor, the input and the output (allreduce, broadcast, reduce)
IN_PLACE = "in place"
#: ``(output, input, opts)``: one flat tensor each, laid out as the spec's buffers
SINGLE = "output, input"
#: ``(output_tensors, input_tensors, opts)``: the spec's full buffer as a list of one tensor per
#: rank, the other buffer one tensor
LISTS = "tensor lists"
#: ``(outputs, inputs, opts)`` or ``(tensors, opts)``: :attr:`TorchCall.repeats` once per tensor
COALESCED = "coalesced"
#: ``(opts)``: a barrier, run as a one-element allreduce where the catalog has one
BARRIER = "barrier"
#: ``(output_tensors, input_tensors, opts)``: always the delegate
DELEGATE = "delegate"
#: the same, for tensor lists whose sizes may differ between ranks (alltoall of tensor lists): the
#: call's description counts the tensors, not their elements
DELEGATE_LISTS = "delegate, uneven tensor lists"
#: ``(tensors, peer, tag)``: point-to-point, always the delegate, never compared between ranks
POINT = "point-to-point"
FORMS = (IN_PLACE, SINGLE, LISTS, COALESCED, BARRIER, DELEGATE, DELEGATE_LISTS, POINT)


@dataclass(frozen=True)
class TorchCall:
    """One method of torch's ``ProcessGroup`` (see the module docstring)."""

    method: str                    # what torch calls on the group
    collective: str | None         # the SPECS entry it runs as (None: the delegate only)
    form: str                      # one of FORMS
    kind: str                      # its name in the counters (stats) and in the call's description
    options: str | None = None     # torch's options class (None: point-to-point)
    what: str = ""                 # its name in error messages (default: the method)
    delegate: str = ""             # the delegate backend's method (default: the method)
    aliases: tuple[str, ...] = ()  # other names torch calls it by
    strided: bool = False          # a non-contiguous tensor runs on a contiguous copy (else: delegate)
    splits: bool = False           # takes split sizes (all_to_all_single: an AllToAllv when given)
    repeats: str = ""              # COALESCED: the method run once per tensor

    @property
    def name(self) -> str:
        """Its name in error messages."""
        return self.what or self.method

    @property
    def delegate_method(self) -> str:
        """The delegate backend's method that carries it."""
        return self.delegate or self.method

    @property
    def spec(self):
        """The collective's spec (None for a delegate-only call)."""
        return SPECS[self.collective] if self.collective is not None else None

    @property
    def routed(self) -> bool:
        """Whether an algorithm of the catalog can carry it."""
        return self.collective is not None and self.form not in (COALESCED, BARRIER)


TORCH_CALLS: tuple[TorchCall, ...] = (
    TorchCall("allreduce", "allreduce", IN_PLACE, "allreduce", "AllreduceOptions", strided=True),
    TorchCall("all_gather_single", "allgather", SINGLE, "allgather", "AllgatherOptions",
              what="all_gather_into_tensor", delegate="_allgather_base", aliases=("_allgather_base",)),
    TorchCall("allgather", "allgather", LISTS, "allgather (tensor list)", "AllgatherOptions"),
    TorchCall("reduce_scatter_single", "reducescatter", SINGLE, "reducescatter", "ReduceScatterOptions",
              what="reduce_scatter_tensor", delegate="_reduce_scatter_base",
              aliases=("_reduce_scatter_base",)),
    TorchCall("reduce_scatter", "reducescatter", LISTS, "reducescatter (tensor list)",
              "ReduceScatterOptions"),
    TorchCall("broadcast", "broadcast", IN_PLACE, "broadcast", "BroadcastOptions", strided=True),
    TorchCall("reduce", "reduce", IN_PLACE, "reduce", "ReduceOptions", strided=True),
    TorchCall("all_to_all_single", "alltoall", SINGLE, "alltoall", "AllToAllOptions",
              delegate="alltoall_base", aliases=("alltoall_base",), splits=True),
    TorchCall("scatter", "scatter", LISTS, "scatter", "ScatterOptions", strided=True),
    TorchCall("allreduce_coalesced", "allreduce", COALESCED, "allreduce", "AllreduceCoalescedOptions",
              repeats="allreduce"),
    TorchCall("allgather_into_tensor_coalesced", "allgather", COALESCED, "allgather", "AllgatherOptions",
              repeats="all_gather_single"),
    TorchCall("reduce_scatter_tensor_coalesced", "reducescatter", COALESCED, "reducescatter",
              "ReduceScatterOptions", repeats="reduce_scatter_single"),
    TorchCall("barrier", "allreduce", BARRIER, "barrier", "BarrierOptions"),
    TorchCall("allgather_coalesced", None, DELEGATE, "allgather_coalesced", "AllgatherOptions"),
    TorchCall("alltoall", None, DELEGATE_LISTS, "alltoall (tensor lists)", "AllToAllOptions"),
    TorchCall("gather", None, DELEGATE, "gather", "GatherOptions"),
    TorchCall("send", None, POINT, "send"),
    TorchCall("recv", None, POINT, "recv"),
)

#: the collectives an algorithm of the catalog can carry for some torch call, in table order
ROUTED: tuple[str, ...] = tuple(dict.fromkeys(c.collective for c in TORCH_CALLS if c.routed))
#: the calls the delegate always carries (``hccc catalog`` names them), in table order
DELEGATE_ONLY: tuple[str, ...] = tuple(c.kind for c in TORCH_CALLS if c.collective is None)


def _check_table() -> None:
    """Every row names a known form and collective, and every method (and alias) once."""
    seen: set[str] = set()
    by_method = {c.method: c for c in TORCH_CALLS}
    for c in TORCH_CALLS:
        if c.form not in FORMS:
            raise ValueError(f"{c.method}: unknown form {c.form!r}")
        if c.collective is not None and c.collective not in SPECS:
            raise ValueError(f"{c.method}: unknown collective {c.collective!r}")
        if (c.collective is None) != (c.form in (DELEGATE, DELEGATE_LISTS, POINT)):
            raise ValueError(f"{c.method}: a delegate-only form names no collective, others one")
        if c.form == COALESCED and by_method.get(c.repeats, c).collective != c.collective:
            raise ValueError(f"{c.method}: repeats {c.repeats!r}, which runs another collective")
        for name in (c.method, *c.aliases):
            if name in seen:
                raise ValueError(f"{name}: in the table twice")
            seen.add(name)


_check_table()

__all__ = ["TorchCall", "TORCH_CALLS", "ROUTED", "DELEGATE_ONLY", "FORMS", "IN_PLACE", "SINGLE", "LISTS",
           "COALESCED", "BARRIER", "DELEGATE", "DELEGATE_LISTS", "POINT"]
