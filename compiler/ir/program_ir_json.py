"""Decoding a ProgramIR's JSON form (:func:`decode_json`, the inverse of
:meth:`hccc.compiler.ir.program_ir.ProgramIR.to_json`):
every field's type, every column's length and every value's range checked before anything is
allocated, each failure an :class:`~hccc.compiler.ir.program_ir.IRFormatError` located at its
field. The structure (order, peers, connections) is checked after, by
:func:`hccc.compiler.ir.check.check_structure`."""
from __future__ import annotations

import json
import re

import numpy as np

from hccc.util.diagnostics import line_col
from hccc.compiler.frontend.slice_policy import MAX_MICRO_BATCHES, MAX_MIN_SLICE_BYTES, SLICE_ALIGN, SlicePolicy
from hccc.compiler.ir.program_ir import (CHUNK_ALIGN, COLLECTIVES, MAX_CHANNELS, MAX_CHUNK_BYTES, MAX_CHUNKS,
                                         MAX_PRIMS, MAX_RANKS, MAX_TBS_PER_RANK, MAX_WARPS, NAME_RE,
                                         OLD_SCHEMAS, PARAMETERS, PRIM_COLUMNS, SCHEMA, Buf, IRFormatError, Op,
                                         ProgramIR, split_stats)

_OK = object()
_TYPE_WORDS = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _json_type(v) -> str:
    """What a decoded JSON value is, in JSON's words."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number with a fraction"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    return "object"


def key_position(text: str, key: str) -> tuple[int, int]:
    """Line and column of the first ``"key":`` in a ProgramIR's text (1, 1 if absent)."""
    m = re.search(r'"%s"\s*:' % re.escape(key), text)
    return line_col(text, m.start() if m else 0)


def decode_json(text: str) -> ProgramIR:
    """The ProgramIR that ``text`` holds (types, column lengths, value ranges checked); an
    :class:`IRFormatError` with a clear message otherwise. The structure is not checked here: read
    files with :func:`hccc.compiler.ir.check.load_ir_json`, which decodes and then checks."""
    from hccc.util.diagnostics import CompileError, SourceFile
    from hccc.util.limits import loads_json
    try:
        d = loads_json(SourceFile("<ir>", text))
    except CompileError as exc:
        diag = exc.diagnostics[0]
        loc = diag.location
        raise IRFormatError(diag.message, loc.line if loc else 1, loc.col if loc else 1) from None
    return _Decoder(text).program(d)


class _Decoder:
    """Reads the fields of one decoded file, locating each failure at its key in ``text``."""

    def __init__(self, text: str):
        self.text = text

    def at(self, key: str) -> tuple[int, int]:
        return key_position(self.text, key)

    def need(self, obj, key, typ, where="top level"):
        if key not in obj or not isinstance(obj[key], typ) or isinstance(obj[key], bool):
            got = "missing" if key not in obj else f"a {_json_type(obj[key])}"
            raise IRFormatError(f"{where}: field '{key}' must be {_TYPE_WORDS.get(typ, typ.__name__)}, "
                                f"not {got}", *self.at(key))
        return obj[key]

    def need_int(self, obj, key, lo, hi, where="top level"):
        v = self.need(obj, key, int, where)
        if not lo <= v <= hi:
            raise IRFormatError(f"{where}: field '{key}' must be between {lo} and {hi}, not {v}", *self.at(key))
        return v

    def int_list(self, obj, key, where, lo, hi, length=None):
        col = self.need(obj, key, list, where)
        bad = next((x for x in col if type(x) is not int), _OK)
        if bad is not _OK:
            raise IRFormatError(f"{where}: '{key}' must hold integers only, found a {_json_type(bad)}",
                                *self.at(key))
        if length is not None and len(col) != length:
            raise IRFormatError(f"{where}: '{key}' has {len(col)} entries, expected {length}", *self.at(key))
        if col and (min(col) < lo or max(col) > hi):
            raise IRFormatError(f"{where}: '{key}' has values outside {lo}..{hi}", *self.at(key))
        return np.asarray(col, dtype=np.int64)

    def program(self, d) -> ProgramIR:
        self.schema(d)
        name = self.need(d, "name", str)
        if not NAME_RE.fullmatch(name):
            raise IRFormatError("field 'name' must be an identifier of at most 64 characters")
        coll = self.need(d, "collective", str)
        if coll not in COLLECTIVES:
            raise IRFormatError(f"unsupported collective '{coll[:40]}'")
        nranks = self.need_int(d, "nranks", 1, MAX_RANKS)
        root = self.need_int(d, PARAMETERS[coll], 0, nranks - 1) if coll in PARAMETERS else 0
        nchunks = self.need_int(d, "nchunks", 1, MAX_CHUNKS)
        bufs = self.need(d, "buffers", dict)
        sizes = [self.need_int(bufs, k, 0, MAX_CHUNKS, "buffers") for k in ("input", "output", "scratch")]
        nwarps = self.need_int(d, "nwarps", 1, MAX_WARPS)
        chunk_bytes = self.need_int(d, "chunk_bytes", CHUNK_ALIGN, MAX_CHUNK_BYTES)
        if chunk_bytes % CHUNK_ALIGN:
            raise IRFormatError(f"top level: field 'chunk_bytes' must be a multiple of {CHUNK_ALIGN}, "
                                f"not {chunk_bytes}", *self.at("chunk_bytes"))
        npipelines = self.need_int(d, "npipelines", 0, MAX_PRIMS)
        nchannels = self.need_int(d, "nchannels", 1, MAX_CHANNELS)
        policy = self.slicing(d)
        prims, n = self.prims(d)
        deps = self.need(d, "deps", dict)
        dp = self.int_list(deps, "prim", "deps", 0, max(n - 1, 0))
        do = self.int_list(deps, "on", "deps", 0, max(n - 1, 0), len(dp))
        if len(dp) and not n:
            raise IRFormatError("deps: 'prim' and 'on' must be equal-length lists of primitive indices")
        tbs = self.int_list(d, "tbs_per_rank", "top level", 0, MAX_TBS_PER_RANK, nranks)
        stats, origin, allocation = self.stats(d)
        return ProgramIR(name=name, collective=coll, nranks=nranks, nchunks=nchunks,
                   in_chunks=sizes[0], out_chunks=sizes[1], scratch_chunks=sizes[2],
                   prims=prims, dep_prim=dp, dep_on=do,
                   nwarps=nwarps, chunk_bytes=chunk_bytes, npipelines=npipelines,
                   ntbs=tbs.astype(np.int32), stats=stats, root=root, nchannels=nchannels,
                   micro_batches=policy.micro_batches, min_slice_bytes=policy.min_slice, origin=origin,
                   allocation=allocation)

    def schema(self, d) -> None:
        """A file of this schema, numbering ops and buffers as this hccc does."""
        if isinstance(d, dict) and isinstance(d.get("schema"), str) and d["schema"] in OLD_SCHEMAS:
            old = d["schema"]
            raise IRFormatError(f"ProgramIR schema '{old}' is older than this hccc's '{SCHEMA}' "
                                f"({OLD_SCHEMAS[old]}): regenerate the file from its algorithm with "
                                "`hccc ALGO -o OUTDIR` (OUTDIR/<name>.ir.json)", *self.at("schema"))
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise IRFormatError(f"not a ProgramIR file (expected \"schema\": \"{SCHEMA}\")")
        for key, names in (("ops", [o.name.lower() for o in Op]), ("buffer_names", [b.name.lower() for b in Buf])):
            # the numbering the columns use: a file written with another one cannot be read as this
            if key in d and d[key] != names:
                raise IRFormatError(f"top level: field '{key}' must be {json.dumps(names)} (the numbering "
                                    "the 'prims' columns use)", *self.at(key))

    def slicing(self, d) -> SlicePolicy:
        if "slicing" not in d:
            return SlicePolicy()
        sl = self.need(d, "slicing", dict)
        policy = SlicePolicy(self.need_int(sl, "micro_batches", 1, MAX_MICRO_BATCHES, "slicing"),
                             self.need_int(sl, "min_slice_bytes", SLICE_ALIGN, MAX_MIN_SLICE_BYTES, "slicing"))
        try:
            policy.check()
        except ValueError as exc:
            raise IRFormatError(f"slicing: {exc}", *self.at("slicing")) from None
        return policy

    def prims(self, d) -> tuple[dict, int]:
        prims_d = self.need(d, "prims", dict)
        prims = {}
        n = None
        for k, dt in PRIM_COLUMNS.items():
            info = np.iinfo(dt)
            arr = self.int_list(prims_d, k, "prims", int(info.min), int(info.max), n)
            if n is None:
                n = len(arr)
                if n > MAX_PRIMS:
                    raise IRFormatError(f"prims: {n} primitives, more than the limit {MAX_PRIMS}")
            prims[k] = arr.astype(dt)
        return prims, n

    def stats(self, d) -> tuple:
        """The statistics and the typed records they carry (:func:`~hccc.compiler.ir.program_ir.split_stats`)."""
        stats = d.get("stats", {})
        if stats is None:
            stats = {}
        if not isinstance(stats, dict) or not all(
                isinstance(v, (str, int, float)) or v is None for v in stats.values()):
            raise IRFormatError("top level: field 'stats' must be an object of numbers, strings, "
                                "booleans and nulls", *self.at("stats"))
        if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 63 for v in stats.values()):
            raise IRFormatError("top level: field 'stats' holds an integer out of the 64-bit range",
                                *self.at("stats"))
        try:
            return split_stats(stats)
        except ValueError as exc:
            raise IRFormatError(f"top level: {exc}", *self.at("stats")) from None
