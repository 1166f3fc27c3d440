"""Channels: how many blocks run each thread block (TB) of a program (ProgramIR ``nchannels``).

With ``K`` channels every TB of every rank runs as ``K`` blocks; block ``c`` (channel ``c``) moves
elements ``[lo_c, hi_c)`` of every micro-batch slice window over connections, FIFOs and progress
counters of its own (:func:`hccc.compiler.ir.program_ir.channel_part`, hccc_prims.h). One block
moves only so many bytes a second (about 21 GB/s on 64 KiB units, 42 on 512 KiB ones: the fifth
GPU run's copy-engine table, :mod:`hccc.compiler.passes.kernel_cost`), so a connection that must
fill a fast link needs several blocks, as NCCL spreads a connection over its channels.

Choosing ``K`` (``--channels``):

* ``K`` (an integer): exactly ``K`` channels, 1 <= K <= ``MAX_CHANNELS``.
* ``auto`` (the default): a ProgramIR's own count when above 1 (a ``.json`` program's
  ``nchannels``, kept as given); otherwise per platform:

  - CPU emulation (``hccc run --backend cpu``): 1 (more blocks only add emulated threads there);
  - CUDA / HIP: the ``.rccl`` header's ``nChannels`` when above 1 (the algorithm asks for it);
    otherwise ``min(8, SMs // (4 * T), share // 16 KiB)`` and at least 1, where ``T`` is the
    most TBs of a rank, ``SMs`` the device's multiprocessors (nominal: 132 for CUDA, an H100
    SXM; 104 for HIP, an MI210, gfx90a) and ``share`` the largest slice one chunk of a message
    gets (``chunk_bytes / max_cnt``): at most a quarter of the device for the collective, and no
    channel with less than 16 KiB of a full slice. With several platforms, the smallest. When
    several ranks share a device (``hccc run`` in one process counts every rank on one GPU, its
    test mode), the SMs are divided among them.

At run time (``hccc run`` on a GPU backend) the device is known: ``auto`` then takes the
multiprocessors the runtime reports for it (132 on an H100 SXM, 104 CUs on an MI210, 304 on an
MI300X) and the ranks the run places on each device, and fills the device as NCCL does for large
messages (:func:`device_channels`): ``min(32, SMs // (T x ranks per device), share // 16 KiB)``,
i.e. at most half of the blocks that are resident at once at two 512-thread blocks per SM (the
kernels keep to 64 registers per thread), so 8 ranks on 8 H100s get 32 channels where the nominal
rule (made for one rank per device without knowing the device) gives 8, and 8 ranks on one H100
get 8.

A rank's ``K * T`` blocks must all be resident at once (the ranks spin on each other): the count
is refused past the platform's maximum (:func:`max_blocks_per_rank`: SMs x resident blocks per SM
at the program's threads per block; the CPU emulation's own thread budget is checked at launch).
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.ir.program_ir import MAX_CHANNELS, ProgramIR
from hccc.compiler.passes import kernel_cost
from hccc.compiler.passes.kernel_cost import BLOCK_GBPS_WARPS, block_gbps_at
from hccc.compiler.passes.slicing import slot_share_bytes

#: multiprocessors of the nominal device of each platform (auto rule, block limit)
NOMINAL_SMS = {"cuda": 132, "hip": 104}
#: resident threads per multiprocessor (H100: 2048; MI200 CU: 32 waves of 64)
THREADS_PER_SM = {"cuda": 2048, "hip": 2048}
WARP = {"cuda": 32, "hip": 64}
#: GB/s one block of :data:`BLOCK_GBPS_WARPS` warps moves, the simulator's per-block limit (``hccc
#: sim --block-bw``): the kernels' cost model's (:data:`hccc.compiler.passes.kernel_cost.SIM_BLOCK_GBPS`,
#: a block's rate on 64 KiB units as the fifth GPU run measured it: 21.1 GB/s)
DEFAULT_BLOCK_GBPS = kernel_cost.SIM_BLOCK_GBPS
#: the most channels ``auto`` picks
AUTO_MAX = 8
#: the least bytes of a full slice ``auto`` gives one channel
AUTO_MIN_PART = 16 << 10
PLATFORMS = ("cpu", "cuda", "hip")


class ChannelError(ValueError):
    """A channel count that cannot run (out of range, or too many blocks per rank). ``declared``:
    the count was the algorithm's own (its header's nChannels, which ``auto`` took), not one asked
    for or chosen by the rule."""

    def __init__(self, message: str, declared: bool = False):
        super().__init__(message)
        self.declared = declared


def parse_channels(text) -> int | None:
    """``"auto"`` -> None, a positive integer (text or int) -> that integer; ValueError otherwise."""
    if text is None:
        return None
    if isinstance(text, str) and text.strip().lower() == "auto":
        return None
    try:
        k = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"channels must be 'auto' or an integer 1..{MAX_CHANNELS}, not {text!r}") from None
    if not 1 <= k <= MAX_CHANNELS:
        raise ValueError(f"channels must be 'auto' or an integer 1..{MAX_CHANNELS}, not {k}")
    return k


def most_tbs(ir: ProgramIR) -> int:
    """The most thread blocks any rank has (at least 1)."""
    t = np.asarray(ir.ntbs, np.int64)
    return max(1, int(t.max()) if len(t) else 1)


def _threads(ir: ProgramIR, platform: str) -> int:
    w = WARP[platform]
    return max(w, min(1024, int(ir.nwarps) * w))


def max_blocks_per_rank(ir: ProgramIR, platform: str, sms: int | None = None,
                        ranks_per_device: int = 1) -> int | None:
    """The most blocks one rank's launch may have on ``platform`` with ``ranks_per_device`` ranks
    sharing a device (None: no fixed limit, the CPU emulation checks its thread budget at launch)."""
    if platform not in NOMINAL_SMS:
        return None
    sms = int(sms or NOMINAL_SMS[platform])
    return sms * max(1, THREADS_PER_SM[platform] // _threads(ir, platform)) // max(1, int(ranks_per_device))


def auto_channels(ir: ProgramIR, platform: str, sms: int | None = None, ranks_per_device: int = 1) -> int:
    """The ``auto`` rule of the module docstring for one platform (ignoring the program's own
    count)."""
    if platform not in NOMINAL_SMS:
        return 1
    sms = int(sms or NOMINAL_SMS[platform])
    share = slot_share_bytes(int(ir.chunk_bytes), int(ir.max_step_chunks))
    k = min(AUTO_MAX, sms // (4 * most_tbs(ir) * max(1, int(ranks_per_device))), share // AUTO_MIN_PART)
    return max(1, int(k))


#: the most channels the run-time rule picks (NCCL's count on an H100 for large messages)
DEVICE_AUTO_MAX = 32


def device_channels(ir: ProgramIR, sms: int, ranks_per_device: int = 1) -> int:
    """The run-time ``auto`` rule (module docstring) for a device of ``sms`` multiprocessors
    shared by ``ranks_per_device`` ranks."""
    share = slot_share_bytes(int(ir.chunk_bytes), int(ir.max_step_chunks))
    k = min(DEVICE_AUTO_MAX, int(sms) // (most_tbs(ir) * max(1, int(ranks_per_device))), share // AUTO_MIN_PART)
    return max(1, int(k))


def resolve_channels(request: int | None, ir: ProgramIR, platforms, sms: int | None = None,
                     declared: int = 0, ranks_per_device: int = 1, device_sms: int | None = None) -> int:
    """The channel count for ``ir`` running on ``platforms`` (names of :data:`PLATFORMS`, one per
    rank or a set): ``request`` (an integer, or None for ``auto``), checked against every
    platform's block limit (:class:`ChannelError` naming the limit). ``declared``: the
    algorithm's own count (``.rccl`` nChannels where the header writes it, 1 included; 0: none),
    which ``auto`` takes for GPU code.
    ``device_sms``: the multiprocessors of the device the run uses, as its runtime reports them
    (None: not known; the nominal rule): ``auto`` then follows :func:`device_channels`."""
    plats = sorted(set(platforms)) or ["cpu"]
    for p in plats:
        if p not in PLATFORMS:
            raise ValueError(f"unknown platform {p!r}")
    from_header = False
    if request is None:
        own = int(getattr(ir, "nchannels", 1) or 1)
        if own > 1:
            k = own
        elif plats == ["cpu"]:
            k = 1
        elif int(declared) > 0:
            k = int(declared)          # the header's nChannels, 1 included
            from_header = True
        elif device_sms:
            k = device_channels(ir, device_sms, ranks_per_device)
        else:
            k = min(auto_channels(ir, p, sms, ranks_per_device) for p in plats)
    else:
        k = int(request)
    if not 1 <= k <= MAX_CHANNELS:
        raise ChannelError(f"{k} channels: must be 1..{MAX_CHANNELS}", from_header)
    t = most_tbs(ir)
    for p in plats:
        cap = max_blocks_per_rank(ir, p, sms, ranks_per_device)
        if k > 1 and cap is not None and k * t > cap:
            m = sms or NOMINAL_SMS[p]
            shared = f", shared by {ranks_per_device} ranks" if ranks_per_device > 1 else ""
            raise ChannelError(
                f"{k} channels x {t} thread blocks = {k * t} blocks per rank, more than a {p.upper()} "
                f"device holds at once ({cap}: {m} multiprocessors x "
                f"{max(1, THREADS_PER_SM[p] // _threads(ir, p))} blocks of {_threads(ir, p)} threads{shared}); "
                f"use at most --channels {max(1, cap // t)}", from_header)
    return k


def with_channels(ir: ProgramIR, k: int) -> ProgramIR:
    """``ir`` with ``nchannels = k`` (a shallow copy when it changes; the table is shared)."""
    if int(getattr(ir, "nchannels", 1)) == int(k):
        return ir
    import copy
    out = copy.copy(ir)
    out.nchannels = int(k)
    return out


__all__ = ["ChannelError", "parse_channels", "auto_channels", "device_channels", "DEVICE_AUTO_MAX", "resolve_channels", "max_blocks_per_rank",
           "with_channels", "most_tbs", "NOMINAL_SMS", "AUTO_MAX", "AUTO_MIN_PART", "DEFAULT_BLOCK_GBPS",
           "BLOCK_GBPS_WARPS", "block_gbps_at"]
