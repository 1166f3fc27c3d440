"""A program's own slice policy: bounds on how finely the kernels cut its chunks into micro-batches.

The generated kernels stream every chunk of the buffer through FIFO slots one *slice* (micro-batch)
at a time; the slice of a call is chosen per call by a model of the kernels' costs
(:func:`hccc.compiler.passes.slicing.auto_slice_bytes`, where the model and its constants are). A
program may bound that choice in its ``.rccl`` header (``nMicroBatches``, ``MinSliceBytes``); its
IR and manifest carry the bounds (``slicing``), and the launcher, the communicator and the
simulator cut its calls within them:

* ``MinSliceBytes = B``: no slice below ``B`` bytes, unless the whole chunk is smaller;
* ``nMicroBatches = M``: no slice above a chunk's ``M``-th part (rounded up to 16 bytes), i.e.
  about ``M`` micro-batches a chunk or more, unless that would go below ``B`` (the floor wins).

hccc's default (``M = 1``, ``B = 16``) bounds nothing: the model alone decides. ``hccc synth``
gives programs of thin streams, whose links (which the model does not see) make their pipelines
fill slowly, more and smaller slices where they pay (:func:`hccc.compiler.passes.slicing.thin_policy`).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MICRO_BATCHES", "DEFAULT_MIN_SLICE_BYTES", "SLICE_ALIGN", "MAX_MICRO_BATCHES",
           "MAX_MIN_SLICE_BYTES", "SlicePolicy"]

#: Slices are multiples of this (the slots' alignment, 16-byte vector accesses).
SLICE_ALIGN = 16
#: The least micro-batches per chunk hccc's default asks for: one, i.e. no bound on the slice.
DEFAULT_MICRO_BATCHES = 1
#: The least slice hccc's default asks for: one 16-byte granule, i.e. no floor.
DEFAULT_MIN_SLICE_BYTES = SLICE_ALIGN
#: The most micro-batches per chunk a program may ask for (``nMicroBatches``).
MAX_MICRO_BATCHES = 4096
#: The largest least slice a program may ask for (``MinSliceBytes``): 64 MiB.
MAX_MIN_SLICE_BYTES = 64 << 20


@dataclass(frozen=True)
class SlicePolicy:
    """A program's slice policy (``nMicroBatches`` and ``MinSliceBytes`` in its ``.rccl`` header,
    ``slicing`` in its manifest): the least micro-batches per chunk (slices no larger than a
    chunk's ``micro_batches``-th part) and the least slice (``min_slice`` bytes, which wins) within
    which :func:`hccc.compiler.passes.slicing.auto_slice_bytes` picks a call's slice. hccc's
    default, :data:`DEFAULT_MICRO_BATCHES` and :data:`DEFAULT_MIN_SLICE_BYTES`, bounds nothing; a
    program of thin streams (many chunks in flight at once, each at a small share of its links)
    may ask for more, smaller slices, which shorten its pipeline's fill
    (:func:`hccc.compiler.passes.slicing.thin_policy`)."""

    micro_batches: int = DEFAULT_MICRO_BATCHES
    min_slice: int = DEFAULT_MIN_SLICE_BYTES

    @property
    def is_default(self) -> bool:
        return self == SlicePolicy()

    def as_dict(self) -> dict:
        """The form an IR, a manifest and ``synth --json`` write it in (``slicing``)."""
        return {"micro_batches": int(self.micro_batches), "min_slice_bytes": int(self.min_slice)}

    def check(self) -> None:
        """ValueError unless ``1 <= micro_batches <= MAX_MICRO_BATCHES`` and ``min_slice`` is a
        positive multiple of :data:`SLICE_ALIGN` of at most :data:`MAX_MIN_SLICE_BYTES`."""
        if not 1 <= int(self.micro_batches) <= MAX_MICRO_BATCHES:
            raise ValueError(f"micro-batches per chunk must be 1 to {MAX_MICRO_BATCHES}, not {self.micro_batches}")
        m = int(self.min_slice)
        if m < SLICE_ALIGN or m % SLICE_ALIGN or m > MAX_MIN_SLICE_BYTES:
            raise ValueError(f"the least slice must be a multiple of {SLICE_ALIGN} bytes from {SLICE_ALIGN} to "
                             f"{MAX_MIN_SLICE_BYTES}, not {m}")
