"""What a compile is asked for (:class:`CompileOptions`) and the choices that follow from the options
alone: each rank's platforms, the channel count, the MSCCL XML's instances."""
from __future__ import annotations

from dataclasses import dataclass

from hccc.util.diagnostics import CompileError, Diagnostic, Location

TARGETS = ("auto", "cuda", "hip", "all")
FUSE_MODES = ("auto", "on", "off")
VENDOR_PLATFORM = {"nvidia": "cuda", "amd": "hip"}


@dataclass
class CompileOptions:
    scheduler: str = "hpds"          # hpds | rr
    tb_alloc: str = "state"          # state | connection
    chunk_bytes: int = 1 << 20       # micro-batch slice (FIFO slot) size
    target: str = "auto"             # auto | cuda | hip | all
    max_transfers: int = 10 ** 7
    #: fused recv+send primitives (see build.build_program): on, off, or auto (fused where the
    #: compile's cost model finds it never slower on the cluster; off without one). True / False
    #: are read as on / off.
    fuse: str = "auto"
    xml_order: str = "step"          # MSCCL XML from the algorithm's step order (step) or the kernels' IR (kernel)
    xml_fuse: bool = False           # rcs / rrcs / rrs steps in the MSCCL XML
    xml_instances: int = 1           # instances of the program in the MSCCL XML (msccl-tools' instances)
    codegen: str = "specialized"     # an emitter of kernels: specialized (a kernel per rank) | table
    direct: str = "auto"             # direct mode for proven receives (auto) or the FIFO everywhere (off)
    channels: int | None = None      # blocks per thread block; None = auto (passes/channels.py)

    def __post_init__(self):
        from numbers import Integral

        for name in ("chunk_bytes", "max_transfers", "xml_instances") + (("channels",) if self.channels is not None
                                                                          else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise TypeError(f"CompileOptions.{name} is an integer, not {type(value).__name__} ({value!r:.40})")
        if not isinstance(self.xml_fuse, bool):
            raise TypeError(f"CompileOptions.xml_fuse is True or False, not {type(self.xml_fuse).__name__}")
        if self.fuse is True or self.fuse is False:
            self.fuse = "on" if self.fuse else "off"
        if self.fuse not in FUSE_MODES:
            raise ValueError(f"fuse must be one of {', '.join(FUSE_MODES)}, got {self.fuse!r}")

    @property
    def fused(self) -> bool:
        """Whether the first lowering fuses (``on``; ``auto`` starts unfused and asks the cost model)."""
        return self.fuse == "on"


def platforms_for(nranks: int, target: str, topology=None) -> list[tuple[str, ...]]:
    """Platforms emitted for each rank (the first is the one it runs on).

    ``auto`` takes each rank's platform from its node's vendor when a ``topology`` is given (NVIDIA ->
    CUDA, AMD -> HIP) and is CUDA for every rank otherwise; ``cuda`` / ``hip`` force one platform;
    ``all`` emits CUDA and HIP for every rank (the vendor's platform first with a topology).
    """
    if topology is not None and target in ("auto", "all"):
        if topology.nranks != nranks:
            raise ValueError(f"topology has {topology.nranks} ranks, the program {nranks}")
        own = [VENDOR_PLATFORM[v] for v in topology.rank_vendor]
        if target == "auto":
            return [(p,) for p in own]
        return [(p,) + tuple(q for q in ("cuda", "hip") if q != p) for p in own]
    if target in ("auto", "cuda"):
        return [("cuda",)] * nranks
    if target == "hip":
        return [("hip",)] * nranks
    if target == "all":
        return [("cuda", "hip")] * nranks
    raise ValueError(f"unknown target {target!r}")


def resolve_channel_count(ir, opts: CompileOptions, platforms, declared: int = 0,
                          ranks_per_device: int = 1, device_sms: int | None = None,
                          declared_at: Location | None = None) -> int:
    """The channel count ``opts.channels`` asks for ``ir`` on ``platforms``
    (:func:`hccc.compiler.passes.channels.resolve_channels`); a count that cannot run is a
    :class:`CompileError`, naming ``--channels`` where the command line asked for it, and the
    header's nChannels (located at ``declared_at``, the header) where ``auto`` took that."""
    from hccc.compiler.passes.channels import ChannelError, resolve_channels
    names = [p[0] if isinstance(p, tuple) else p for p in platforms]
    try:
        return resolve_channels(opts.channels, ir, names, declared=declared, ranks_per_device=ranks_per_device,
                                device_sms=device_sms)
    except ChannelError as exc:
        if exc.declared:
            raise CompileError([Diagnostic(f"nChannels={int(declared)} (the header's): {exc}", declared_at)]) from None
        raise CompileError([Diagnostic(f"--channels: {exc}", None)]) from None


def apply_channels(ir, opts: CompileOptions, platforms, declared: int = 0, ranks_per_device: int = 1,
                   device_sms: int | None = None):
    """``ir`` with the channel count ``opts.channels`` asks for on ``platforms`` (per-rank tuples
    as :func:`platforms_for` gives, or names), :func:`hccc.compiler.passes.channels.resolve_channels`;
    ``declared``: the algorithm's own request (the ``.rccl`` header's nChannels), taken by ``auto``
    for GPU code; ``ranks_per_device``: ranks sharing one device; ``device_sms``: the run's
    device's multiprocessors when known (the run-time rule). A count that cannot run is a
    :class:`CompileError`."""
    from hccc.compiler.passes.channels import with_channels
    return with_channels(ir, resolve_channel_count(ir, opts, platforms, declared, ranks_per_device, device_sms))


def xml_instances(opts: CompileOptions, declared: int = 1) -> int:
    """MSCCL XML instances: ``--xml-instances`` x the channels asked for (``--channels K``) or, with
    ``auto``, declared by the program (the ``.rccl`` nChannels, a ProgramIR's ``nchannels``). An
    MSCCL instance is what an hccc channel is: a copy of every thread block on channels of its
    own, moving its share of every chunk (the XML's ``nchannels`` counts them). The hardware rule
    of ``auto`` applies to hccc's kernels only: an MSCCL runtime picks its own parallelism."""
    k = opts.channels if opts.channels is not None else max(1, int(declared))
    return max(1, int(opts.xml_instances)) * int(k)
