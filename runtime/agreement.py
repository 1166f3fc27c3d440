"""What the ranks of one communicator must agree on before they map each other's memory.

Every rank of a :class:`~hccc.runtime.communicator.Communicator` loads its algorithm on its own, so
two ranks can load different programs under one name (a ring and the reversed ring, one program
compiled with 1 channel and with 8, slots of 64 KiB and of 4 KiB). A rank sizes its peers' FIFOs
and control blocks from its own view of the program, so a rank that disagrees would write past
the memory a peer mapped, or exchange data the peer does not expect. :func:`program_terms` lists
everything that shapes that memory and the protocol on it; the ranks exchange these terms at
set-up, and :func:`first_difference` names the first term on which they differ (the same text on
every rank, since every rank compares the same gathered list).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

#: the terms in the order a difference is reported (the program digest last: a different channel
#: count or slot size also changes the program, and is the clearer thing to name)
TERMS = ("ranks", "codegen", "abi", "channels", "chunk_bytes", "slot_bytes", "slots", "fifo_slot_bytes",
         "platforms", "dtype", "op", "collective", "program")


def program_digest(ir) -> str:
    """SHA-256 of what a ProgramIR does: its header and every primitive and dependency (not its
    statistics, which may record how long a compile took)."""
    from hccc.compiler.ir.program_ir import PRIM_COLUMNS
    h = hashlib.sha256()
    head = {"name": ir.name, "collective": ir.collective, "nranks": int(ir.nranks),
            "nchunks": int(ir.nchunks), "buffers": [int(ir.in_chunks), int(ir.out_chunks),
                                                    int(ir.scratch_chunks)],
            "chunk_bytes": int(ir.chunk_bytes), "nchannels": int(ir.nchannels),
            "npipelines": int(ir.npipelines), "nwarps": int(ir.nwarps), "root": int(ir.root),
            "tbs": [int(x) for x in ir.ntbs], "placements": [bool(x) for x in ir.placements],
            "algorithm_level": bool(ir.algorithm_level)}
    if not ir.slice_policy.is_default:     # every rank cuts a call into the same slices (the digest as before otherwise)
        head["slicing"] = [int(ir.micro_batches), int(ir.min_slice_bytes)]
    h.update(json.dumps(head, sort_keys=True).encode())
    for k in PRIM_COLUMNS:
        h.update(k.encode())
        h.update(np.ascontiguousarray(ir.prims[k], dtype="<i8").tobytes())
    for a in (ir.dep_prim, ir.dep_on):
        h.update(b"|")
        h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
    return h.hexdigest()


def program_terms(ir, manifest: dict, platforms, codegen: str, dtype: str, op: str,
                  fifo_slot_bytes: int | None = None, digest: str | None = None) -> dict:
    """The terms (:data:`TERMS`) of one rank: the program and what the manifest of its generated
    kernels says about memory (channels, slot size and count) and protocol (ABI version), and the
    slot the rank's FIFOs are allocated with (``fifo_slot_bytes``: the compiled slot cut to the
    per-connection budget, ``HCCC_FIFO_BYTES``; default the manifest's ``slot_bytes``).
    ``digest``: ``ir``'s :func:`program_digest` where the caller has it already."""
    slot = int(manifest.get("slot_bytes", manifest["chunk_bytes"]))
    return {"fifo_slot_bytes": slot if fifo_slot_bytes is None else int(fifo_slot_bytes),"ranks": int(ir.nranks), "codegen": codegen, "abi": manifest.get("abi_version"),
            "channels": int(manifest.get("nchannels", 1)), "chunk_bytes": int(manifest["chunk_bytes"]),
            "slot_bytes": int(manifest.get("slot_bytes", manifest["chunk_bytes"])),
            "slots": int(manifest.get("nslots", 0)), "platforms": ",".join(platforms),
            "dtype": dtype, "op": op, "collective": ir.collective,
            "program": program_digest(ir) if digest is None else digest}


def _shown(term: str, value) -> str:
    text = str(value)
    if term == "program":
        return f"digest {text[:12]}"
    return text if len(text) <= 60 else text[:57] + "..."


def first_difference(terms: list[dict]) -> str | None:
    """None when every rank's terms are equal, else a sentence naming the first term (in
    :data:`TERMS` order) on which two ranks differ: the lowest rank that differs from rank 0."""
    base = terms[0]
    if all(t == base for t in terms[1:]):        # (the usual case, at the cost of one comparison a rank)
        return None
    for term in TERMS:
        for r, t in enumerate(terms[1:], start=1):
            if t.get(term) != base.get(term):
                return (f"the ranks do not run the same program: rank 0 has {term} "
                        f"{_shown(term, base.get(term))}, rank {r} has {term} {_shown(term, t.get(term))} "
                        "(every rank must load the same compiled program with the same options)")
    return None


__all__ = ["TERMS", "program_digest", "program_terms", "first_difference"]
