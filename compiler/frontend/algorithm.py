"""The Algorithm: a collective's header plus its columnar transfer table.

This is what the ``.rccl`` front end produces (and what synthesis and MSCCL import produce), and
what the verifier, the dependency DAG and the scheduler consume. Transfers are stored as parallel
numpy arrays because real programs reach millions of them.

Data model: each rank's buffer holds ``nchunks = nranks * chunks_per_rank``
chunks (``chunks_per_rank`` is 1 unless the header says ``nChunksPerRank``); ``(rank, chunk)``
names one chunk. Rank ``r`` owns chunks ``r*K .. r*K+K-1`` (``K = chunks_per_rank``): its AllGather
input, its ReduceScatter output. Broadcast and Reduce have a ``root``: the rank whose buffer is
broadcast, or the rank that ends with the reduction. AllToAll (``N`` ranks) has ``N*N*K`` chunk ids:
chunk ``(i*N + j)*K + k`` is the ``k``-th piece of the block rank ``i`` sends to rank ``j``; rank
``i`` starts with it (input position ``j*K + k``), rank ``j`` must end with it (output position
``i*K + k``), and any rank may hold it in between (scratch). ``transfer(src, dst, step, chunk, op)`` moves ``src``'s chunk to
``dst`` (``RECV``: overwrite, ``RRC``: reduce into ``dst``'s chunk). All transfers of a step happen
together, after every smaller step.

An optional sixth argument, ``transfer(src, dst, step, chunk, op, channel)``, names the *channel*
of the transfer (0 when left out): transfers between one pair of ranks on different channels
travel over connections, FIFOs and thread blocks of their own, so they run side by side instead of
one after another (the logical channels of MSCCL's XML; not the header's ``nChannels``, which is
how many blocks run every thread block). The column is ``Algorithm.channel`` (None: all 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hccc.compiler.frontend.collectives import Collective  # re-exported: the collectives' home
from hccc.compiler.frontend.slice_policy import DEFAULT_MICRO_BATCHES, DEFAULT_MIN_SLICE_BYTES
from hccc.util.diagnostics import Location

# Transfer operations (values of Algorithm.op).
RECV = 0  # dst's chunk := src's chunk
RRC = 1   # dst's chunk := dst's chunk (+) src's chunk   (recvReduceCopy)
OP_NAMES = {RECV: "recv", RRC: "rrc"}
#: the largest channel a transfer may name
MAX_CHANNEL = 1023
#: most blocks per thread block (a header's ``nChannels``, a ProgramIR's ``nchannels``): what the
#: kernels' compile takes (:func:`hccc.compiler.passes.channels.resolve_channels`), so what every
#: reader of a count refuses past
MAX_CHANNELS = 64


@dataclass(frozen=True)
class Header:
    """The ``ResCCLAlgo(...)`` parameters."""

    nranks: int
    collective: Collective
    name: str = "algo"           # AlgoName, raw user text (sanitise before using it in code or paths)
    nchannels: int = 1
    nwarps: int = 16
    gpu_per_node: int = 0        # 0 = not given
    nic_per_node: int = 0
    location: Location | None = None  # where the header is, for whole-program diagnostics
    root: int = 0                # the collective's rank parameter (CollectiveSpec.parameter): a rooted
                                 # collective's root (Root), SendRecv's shift (Shift); 0 for the others
    chunks_per_rank: int = 1     # nChunksPerRank: chunks each rank owns (nchunks = nranks * this)
    micro_batches: int = DEFAULT_MICRO_BATCHES   # nMicroBatches: the slice policy (compiler/frontend/slice_policy.py)
    min_slice_bytes: int = DEFAULT_MIN_SLICE_BYTES   # MinSliceBytes: the slice policy's least slice
    # nChannels was written in the header: --channels auto honours it, 1 included (where the text
    # came from, not what the program is: left out of comparisons)
    nchannels_given: bool = field(default=False, compare=False)

    @property
    def nchunks(self) -> int:
        """Chunk ids of the program: ``nranks * K``; AllToAll ``nranks * nranks * K``."""
        return self.collective.spec.nids(self.nranks, self.nranks * self.chunks_per_rank)

    def owner(self, chunk):
        """The rank owning ``chunk`` (int or array): AllGather source, ReduceScatter destination;
        AllToAll: the block's source rank ``i`` (chunk ``(i*N + j)*K + k``)."""
        return self.collective.spec.block_of(chunk, self.nranks, self.nranks * self.chunks_per_rank)[0]

    def block_dest(self, chunk):
        """AllToAll: the destination rank ``j`` of chunk ``(i*N + j)*K + k`` (int or array)."""
        return self.collective.spec.block_of(chunk, self.nranks, self.nranks * self.chunks_per_rank)[1]

    def block_slot(self, chunk):
        """AllToAll: ``(input slot on the source, output slot on the destination)`` of chunk
        ``(i*N + j)*K + k``: ``j*K + k`` and ``i*K + k`` (ints or arrays)."""
        spec, N = self.collective.spec, self.nranks
        C = N * self.chunks_per_rank
        return (spec.slot("input", self.owner(chunk), chunk, N, C),
                spec.slot("output", self.block_dest(chunk), chunk, N, C))


@dataclass(frozen=True)
class TransferSite:
    """One ``transfer(...)`` call in the source, and the loop variables in scope there."""

    location: Location | None
    loop_vars: tuple[str, ...] = ()


@dataclass
class Algorithm:
    """Header + transfer table (one row per transfer).

    Columns are int64 numpy arrays of equal length (``op`` is uint8). ``site[i]`` indexes
    ``sites``; the rows of one site are contiguous, and ``loop_values[s]`` is an int64 matrix with
    one row per transfer of site ``s`` (in table order) and one column per ``sites[s].loop_vars``.
    """

    header: Header
    src: np.ndarray
    dst: np.ndarray
    step: np.ndarray
    chunk: np.ndarray
    op: np.ndarray
    site: np.ndarray
    sites: list[TransferSite] = field(default_factory=list)
    loop_values: list[np.ndarray] = field(default_factory=list)
    channel: np.ndarray | None = None     # per transfer (int64); None: every transfer on channel 0

    def __post_init__(self) -> None:
        n = len(self.src)
        for name in ("dst", "step", "chunk", "op", "site"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"column {name} has {len(getattr(self, name))} rows, expected {n}")
        if self.channel is not None:
            self.channel = np.asarray(self.channel, dtype=np.int64)
            if len(self.channel) != n:
                raise ValueError(f"column channel has {len(self.channel)} rows, expected {n}")
            if not self.channel.any():
                self.channel = None
        self._site_start: np.ndarray | None = None

    @property
    def channels(self) -> np.ndarray:
        """The channel of every transfer (zeros when the program names none)."""
        return self.channel if self.channel is not None else np.zeros(len(self.src), dtype=np.int64)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_rows(cls, header: Header, rows, sites: list[TransferSite] | None = None) -> "Algorithm":
        """Build from ``(src, dst, step, chunk, op)`` or ``(src, dst, step, chunk, op, channel)``
        tuples (generators, tests, synthesis).

        Without ``sites`` every row gets one anonymous site with no loop variables.
        """
        arr = np.asarray(list(rows), dtype=np.int64)
        arr = arr.reshape(-1, arr.shape[1] if arr.ndim == 2 and arr.shape[1] == 6 else 5)
        n = len(arr)
        if sites is None:
            sites = [TransferSite(header.location, ())]
        return cls(
            header=header,
            src=arr[:, 0].copy(), dst=arr[:, 1].copy(), step=arr[:, 2].copy(),
            chunk=arr[:, 3].copy(), op=arr[:, 4].astype(np.uint8),
            site=np.zeros(n, dtype=np.int64),
            sites=list(sites),
            loop_values=[np.zeros((n, 0), dtype=np.int64)],
            channel=arr[:, 5].copy() if arr.shape[1] == 6 else None,
        )

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.src)

    @property
    def ntransfers(self) -> int:
        return len(self.src)

    @property
    def nsteps(self) -> int:
        """Number of distinct step values."""
        if not len(self.step):
            return 0
        st = np.sort(self.step)      # (not np.unique: its first call imports numpy.ma, 15 ms of start-up)
        return int(np.count_nonzero(st[1:] != st[:-1])) + 1

    def rows(self):
        """Iterate ``(src, dst, step, chunk, op)`` as Python ints (small programs, tests)."""
        return zip(self.src.tolist(), self.dst.tolist(), self.step.tolist(),
                   self.chunk.tolist(), self.op.tolist())

    def location_of(self, i: int) -> Location | None:
        return self.sites[int(self.site[i])].location

    def loop_bindings(self, i: int) -> dict[str, int]:
        """The loop-variable values that produced transfer ``i``."""
        s = int(self.site[i])
        if self._site_start is None or len(self._site_start) != len(self.sites):
            starts = np.full(len(self.sites), -1, dtype=np.int64)
            if len(self.site):
                first = np.r_[0, np.flatnonzero(np.diff(self.site)) + 1]
                starts[self.site[first]] = first
            self._site_start = starts
        local = i - int(self._site_start[s])
        vals = self.loop_values[s]
        names = self.sites[s].loop_vars
        if vals.shape[0] <= local or vals.shape[1] != len(names):
            return {}
        return {k: int(v) for k, v in zip(names, vals[local])}

    def describe(self, i: int) -> str:
        """``(n=0, r=2)`` suffix for diagnostics, or empty when no loop variables."""
        b = self.loop_bindings(i)
        return "(" + ", ".join(f"{k}={v}" for k, v in b.items()) + ")" if b else ""

    def subset(self, mask: np.ndarray) -> "Algorithm":
        """A new Algorithm with the rows where ``mask`` is true (site bookkeeping kept)."""
        idx = np.flatnonzero(mask)
        new_vals = []
        for s in range(len(self.sites)):
            rows_s = np.flatnonzero(self.site == s)
            keep = np.isin(rows_s, idx)
            v = self.loop_values[s] if s < len(self.loop_values) else np.zeros((len(rows_s), 0), np.int64)
            new_vals.append(v[keep] if len(v) == len(rows_s) else v[:0])
        order = np.argsort(self.site[idx], kind="stable")
        idx = idx[order]
        return Algorithm(self.header, self.src[idx], self.dst[idx], self.step[idx], self.chunk[idx],
                         self.op[idx], self.site[idx], list(self.sites), new_vals,
                         None if self.channel is None else self.channel[idx])
