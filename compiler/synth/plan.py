"""The typed records of one synthesis: what was asked (:class:`SynthOptions`) and every choice the
selection made, carried to the emitter (:class:`SynthPlan`).

``hccc synth`` and :func:`hccc.synthesize` build the same :class:`SynthOptions`; the selection loop
(:mod:`hccc.synth_select`) turns it into a program and a :class:`SynthPlan` per message size, and the emitter
(:mod:`.emit`) writes the program's header from the plan alone: the method, chunks per rank,
channels, warps per thread block and slice policy are read from it, never from a result's report.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hccc.compiler.frontend.algorithm import Header
from hccc.compiler.frontend.slice_policy import SlicePolicy

#: how a schedule may be asked for: ``auto`` resolves per size (:func:`hccc.synth_select.choose_method`)
#: the collectives synthesis makes programs for (``hccc synth``, :func:`hccc.synthesize`, the torch
#: backend's catalog from a topology): the ones the packing or the step search builds
COLLECTIVES = ("allgather", "broadcast", "reducescatter", "allreduce", "alltoall")
METHOD_CHOICES = ("auto", "trees", "search")
#: the engines ``--for`` names: hccc's own (the default), the MSCCL executor (``msccl``, or ``xml``,
#: the name it had first: its programs are MSCCL XML) and the MSCCL++ executor
ENGINE_CHOICES = ("hccc", "msccl", "mscclpp", "xml")
#: each choice as an engine of :mod:`hccc.synth_engines` (None: hccc's own, no other engine's limits)
ENGINE_OF_CHOICE = {"hccc": None, "msccl": "xml", "mscclpp": "mscclpp", "xml": "xml"}
#: ``--method auto`` also runs the step search when the tree program reaches less of the bound than
#: this in the simulator (AllReduce: of the lower throughput of its bound for any schedule and of
#: ReduceScatter + AllGather's optimum, which tree programs reach): below it the simulator has
#: seen the search's few rounds win on small clusters (docs/synthesis.md, *auto*)
AUTO_SEARCH_BELOW = 0.98


@dataclass(frozen=True)
class SynthOptions:
    """What a synthesis is asked for: the options of ``hccc synth`` (docs/commands/synth.md), by
    the names :func:`hccc.synthesize` takes them."""

    collective: str
    root: int = 0
    chunks_per_rank: int | None = None      # None: 1 for the search; the tree packing picks its own
    time_limit: float = 60.0
    pod_size: int | None = None
    smt: bool = True
    variants: int = 3
    select_size: int = 1 << 30
    sim_select: bool = True
    method: str = "auto"
    sizes: tuple[int, ...] = ()              # () : one program, for select_size
    band: tuple[int, ...] = ()               # without sizes: every candidate scored at each of these
                                             # (selection.band_ranked); () : at select_size alone
    engine: str | None = None                # one of ENGINE_CHOICES: fit that engine's limits
    cluster_name: str | None = None          # written in the header comment (the file's name)
    auto_search_below: float = AUTO_SEARCH_BELOW
    exact: bool = False                      # the report's figure simulated whole, whatever its work
                                             # (else estimated past FIGURE_WORK_BUDGET); the program is the same

    @property
    def search_only(self) -> list[str]:
        """The options given that only the step search takes (as ``hccc synth`` spells them)."""
        return [o for o, given in (("--chunks-per-rank", self.chunks_per_rank is not None),
                                   ("--pod-size", self.pod_size is not None), ("--no-smt", not self.smt)) if given]

    @property
    def program_sizes(self) -> tuple[int, ...]:
        return tuple(self.sizes) or (int(self.select_size),)


@dataclass
class SynthPlan:
    """Every choice made for one program, from the selection to the emitter."""

    method: str                              # "trees" | "search": what made the program
    requested: str                           # what was asked: "auto" | "trees" | "search"
    size: int                                # the message size the program was chosen for (bytes)
    chunks_per_rank: int
    channels: int = 1
    channels_fitted: bool | None = None      # True: confirmed by simulation; None: not applicable
    warps: int = Header.nwarps
    slicing: SlicePolicy = field(default_factory=SlicePolicy)
    methods_tried: dict = field(default_factory=dict)   # method -> simulated fraction of the bound
    engine: str | None = None
    trees: dict = field(default_factory=dict)   # tree programs: per half, its trees and chunk count

    @classmethod
    def of(cls, result, *, requested: str | None = None, size: int = 0, methods_tried: dict | None = None,
           engine: str | None = None) -> "SynthPlan":
        """The plan a selected ``result`` (:class:`~.collectives.SynthResult`) ends with."""
        return cls(method=str(result.detail.get("method", "search")), requested=requested or
                   str(result.detail.get("method", "search")), size=int(size),
                   chunks_per_rank=int(result.chunks_per_rank), channels=int(result.detail.get("channels", 1)),
                   channels_fitted=result.detail.get("channels_fitted"), warps=int(result.warps),
                   slicing=result.slice_policy, methods_tried=dict(methods_tried or {}), engine=engine,
                   trees=dict(result.detail.get("trees") or {}))

    def as_dict(self) -> dict:
        out = asdict(self)
        out["slicing"] = self.slicing.as_dict()
        return out


__all__ = ["AUTO_SEARCH_BELOW", "ENGINE_CHOICES", "ENGINE_OF_CHOICE", "METHOD_CHOICES", "SynthOptions", "SynthPlan"]
