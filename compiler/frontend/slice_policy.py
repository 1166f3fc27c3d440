"""A program's slice policy: how finely the kernels cut its chunks into micro-batches.

The generated kernels stream every chunk of the buffer through FIFO slots one *slice* (micro-batch)
at a time; the slice of a call follows its size (:func:`hccc.compiler.passes.slicing.auto_slice_bytes`,
where the measurements behind the defaults are): about :data:`TARGET_MICRO_BATCHES` slices a chunk,
none below :data:`MIN_SLICE_BYTES` unless the chunk is smaller. A program may set both in its
``.rccl`` header (``nMicroBatches``, ``MinSliceBytes``); its IR and manifest carry them
(``slicing``), and the launcher, the communicator and the simulator cut its calls by them.
``hccc synth`` gives programs of thin streams more, smaller slices where they pay
(:func:`hccc.compiler.passes.slicing.thin_policy`).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TARGET_MICRO_BATCHES", "MIN_SLICE_BYTES", "SLICE_ALIGN", "MAX_MICRO_BATCHES", "MAX_MIN_SLICE_BYTES",
           "SlicePolicy"]

#: Micro-batches per chunk the policy aims for (the measurements: :mod:`hccc.compiler.passes.slicing`).
TARGET_MICRO_BATCHES = 32
#: Smallest slice the policy picks for a chunk at least this large.
MIN_SLICE_BYTES = 64 << 10
#: Slices are multiples of this (the slots' alignment, 16-byte vector accesses).
SLICE_ALIGN = 16
#: The most micro-batches per chunk a program may ask for (``nMicroBatches``).
MAX_MICRO_BATCHES = 4096
#: The largest least slice a program may ask for (``MinSliceBytes``).
MAX_MIN_SLICE_BYTES = MIN_SLICE_BYTES * 1024


@dataclass(frozen=True)
class SlicePolicy:
    """A program's slice policy (``nMicroBatches`` and ``MinSliceBytes`` in its ``.rccl`` header,
    ``slicing`` in its manifest): the micro-batches per chunk :func:`hccc.compiler.passes.slicing.auto_slice_bytes` aims for and
    the smallest slice it picks. hccc's default is :data:`TARGET_MICRO_BATCHES` and
    :data:`MIN_SLICE_BYTES`; a program of thin streams (many chunks in flight at once, each at a
    small share of its links) may ask for more, smaller slices, which shorten its pipeline's fill
    (:func:`hccc.compiler.passes.slicing.thin_policy`)."""

    micro_batches: int = TARGET_MICRO_BATCHES
    min_slice: int = MIN_SLICE_BYTES

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

