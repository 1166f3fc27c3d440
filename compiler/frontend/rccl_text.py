"""An :class:`~hccc.compiler.frontend.algorithm.Algorithm` as ResCCLang text (:func:`algorithm_text`),
the inverse of the parser on what a compile uses: the header's parameters and the transfer table,
one ``transfer(src, dst, step, chunk, op[, channel])`` per row in table order (loops and the
source's comments are not kept). Parsing the text gives back the same header and columns, so a
dumped algorithm (``hccc ALGO --dump-after algorithm``) is an input like any ``.rccl``."""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.algorithm import OP_NAMES, Algorithm
from hccc.compiler.frontend.slice_policy import SlicePolicy

#: the characters a ResCCLang string writes escaped (the parser's escapes, reversed)
_ESCAPED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def quoted(text: str) -> str:
    """``text`` as a double-quoted ResCCLang string."""
    return '"' + "".join(_ESCAPED.get(c, c) for c in text) + '"'


def header_text(alg: Algorithm) -> str:
    """The ``def ResCCLAlgo(...):`` line of ``alg``'s header (nChannels only where the source wrote
    it: ``--channels auto`` takes a written count)."""
    h = alg.header
    spec = h.collective.spec
    params = [f"nRanks={h.nranks}"]
    if h.nchannels_given:
        params.append(f"nChannels={h.nchannels}")
    params += [f"nWarps={h.nwarps}", f"AlgoName={quoted(h.name)}", f'OpType="{h.collective.dsl_name}"']
    if spec.parameter == "shift":
        params.append(f"Shift={h.root}")
    elif spec.parameter:
        params.append(f"Root={h.root}")
    if h.chunks_per_rank != 1:
        params.append(f"nChunksPerRank={h.chunks_per_rank}")
    if not SlicePolicy(h.micro_batches, h.min_slice_bytes).is_default:
        params += [f"nMicroBatches={h.micro_batches}", f"MinSliceBytes={h.min_slice_bytes}"]
    params += [f"GPUPerNode={h.gpu_per_node}", f"NICPerNode={h.nic_per_node}"]
    return f"def ResCCLAlgo({', '.join(params)}):"


#: rows turned into text at a time (a block's Python objects, not the whole table's, exist at once)
ROWS_PER_BLOCK = 1 << 16


def algorithm_text(alg: Algorithm) -> str:
    """``alg`` as ResCCLang text (see the module's docstring)."""
    lines = [header_text(alg)]
    if not len(alg.src):
        lines.append("    pass")
    chans = alg.channels
    for lo in range(0, len(alg.src), ROWS_PER_BLOCK):
        part = slice(lo, lo + ROWS_PER_BLOCK)
        cols = np.stack([alg.src[part], alg.dst[part], alg.step[part], alg.chunk[part],
                         alg.op[part].astype(np.int64), chans[part]], axis=1)
        lines += [f"    transfer({s}, {d}, {st}, {c}, {OP_NAMES[op]}" + (f", {ch})" if ch else ")")
                  for s, d, st, c, op, ch in cols.tolist()]
    return "\n".join(lines) + "\n"


__all__ = ["algorithm_text", "header_text", "quoted"]
