"""Read a table-mode output back: checked rank tables, and the ProgramIR they encode.

:func:`load_tables` decodes the sections of ``NAME.table`` and checks every value the generic
kernel trusts against the manifest (the runtime does this before any upload);
:func:`program_from_table` rebuilds the ProgramIR (primitives, dependencies, header) from the
tables and the manifest, so ``hccc run OUTDIR`` needs no IR JSON in table mode.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hccc.compiler.backend import table_format as tf
from hccc.compiler.ir.program_ir import (COLLECTIVES, MAX_CHANNELS, MAX_WARPS, PRIM_COLUMNS, Buf, ProgramIR,
                                         split_stats)
from hccc.compiler.frontend.slice_policy import MAX_MICRO_BATCHES, MAX_MIN_SLICE_BYTES


#: most ranks, chunks or TBs a manifest field may give (int32 columns; the table format's own bound)
_INT32_MAX = (1 << 31) - 1


def _whole(value, what: str, lo: int = 0, hi: int = _INT32_MAX) -> int:
    """A manifest integer in [lo, hi] (bools and other types refused), else TableFormatError."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise tf.TableFormatError(f"manifest.json: {what} must be an integer in {lo}..{hi}, "
                                  f"not {str(value)[:40]!r}")
    return value


def _buffer_chunks(manifest: dict) -> dict[int, int]:
    b = manifest.get("buffers")
    if b is None:
        b = {}
    if not isinstance(b, dict):
        raise tf.TableFormatError("manifest.json: 'buffers' must be an object "
                                  "{\"input\": N, \"output\": N, \"scratch\": N}")
    return {int(Buf.NONE): 0,
            **{int(code): _whole(b.get(key, 0), f"buffers.{key}")
               for code, key in ((Buf.INPUT, "input"), (Buf.OUTPUT, "output"), (Buf.SCRATCH, "scratch"))}}


def _connections(entry: dict, key: str, nranks: int, r: int) -> list[int]:
    """The peers of rank ``r``'s ``send_conns`` / ``recv_conns`` (pairs [peer, channel])."""
    conns = entry.get(key)
    if not isinstance(conns, list):
        raise tf.TableFormatError(f"manifest.json: rank {r}: '{key}' must be a list of [peer, channel] pairs")
    peers = []
    for c in conns:
        if not isinstance(c, list) or len(c) != 2:
            raise tf.TableFormatError(f"manifest.json: rank {r}: '{key}' must be a list of [peer, channel] pairs")
        peer = _whole(c[0], f"rank {r}: a peer of '{key}'", 0, nranks - 1)
        if peer == r:
            raise tf.TableFormatError(f"manifest.json: rank {r}: '{key}' names the rank itself")
        _whole(c[1], f"rank {r}: a channel of '{key}'")
        peers.append(peer)
    return peers


def read_table(outdir: Path, manifest: dict) -> tuple[Path, bytes]:
    """(path, bytes) of the table file a manifest names, read through the checks of every input
    file (regular files only, never a FIFO or a device, at most the input size cap):
    TableFormatError otherwise."""
    from hccc.util.diagnostics import CompileError, read_input_bytes
    path = table_path(outdir, manifest)
    try:
        return path, read_input_bytes(path)
    except CompileError as exc:
        raise tf.TableFormatError("; ".join(d.message for d in exc.diagnostics)) from None


def table_path(outdir: Path, manifest: dict) -> Path:
    t = manifest.get("table")
    name = t.get("file") if isinstance(t, dict) else None
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise tf.TableFormatError("manifest.json: 'table.file' must name the table file next to it")
    return Path(outdir) / name


def load_tables(data: bytes, manifest: dict, ranks=None, where: str = "table") -> dict[int, tuple[tf.RankTable, memoryview]]:
    """rank -> (decoded table, raw section) for ``ranks`` (all when None), each checked against
    the manifest; TableFormatError naming the rank otherwise."""
    sections = tf.file_sections(data, where)
    entries = manifest.get("ranks") or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise tf.TableFormatError("manifest.json: 'ranks' must be a list of rank objects")
    if not isinstance(manifest.get("nchannels", 1), int):
        raise tf.TableFormatError("manifest.json: 'nchannels' must be an integer")
    if len(sections) != len(entries):
        raise tf.TableFormatError(f"{where}: {len(sections)} rank sections, the manifest lists "
                                  f"{len(entries)} ranks")
    nb = _buffer_chunks(manifest)
    out = {}
    for r in (range(len(entries)) if ranks is None else ranks):
        w = f"{where}: rank {r}"
        t = tf.read_section(sections[r], w)
        tf.check_section(t, {**entries[r], "nchannels": manifest.get("nchannels", 1)}, nb, w)
        if t.consts["nchunks"] != int(manifest.get("nchunks", -1)) or \
                t.consts["chunk_bytes"] != int(manifest.get("chunk_bytes", -1)):
            raise tf.TableFormatError(f"{w}: chunk count or size disagrees with the manifest")
        out[r] = (t, sections[r])
    return out


def program_from_table(manifest: dict, data: bytes, where: str = "table") -> ProgramIR:
    """The ProgramIR a table-mode output encodes (raises TableFormatError when malformed)."""
    tables = load_tables(data, manifest, None, where)
    N = len(tables)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in PRIM_COLUMNS}
    dep_prim, dep_on = [], []
    offset = 0
    for r in range(N):
        t, _ = tables[r]
        e = manifest["ranks"][r]
        n = t.nprims
        c = t.columns
        tb = np.repeat(np.arange(t.ntbs), np.diff(t.tb_first))
        seq = np.arange(n) - t.tb_first[:-1][tb] if n else np.zeros(0, np.int64)
        peers = {}
        for key, conns in (("sconn", "send_conns"), ("rconn", "recv_conns")):
            table = np.array(_connections(e, conns, N, r) + [-1], np.int64)
            peers[key] = table[c[key]]          # index -1 picks the trailing -1
        vals = {"rank": np.full(n, r), "tb": tb, "seq": seq, "pipeline": c["pipeline"],
                "op": c["op"], "send_peer": peers["sconn"], "recv_peer": peers["rconn"],
                "channel": c["channel"], "src_buf": c["sbuf"], "src_off": c["soff"],
                "dst_buf": c["dbuf"], "dst_off": c["doff"], "count": c["cnt"], "task": c["task"],
                "task2": c["task2"]}
        for k in PRIM_COLUMNS:
            cols[k].append(np.asarray(vals[k]))
        # dependencies: waiting primitive -> the primitive of this rank that posts the slot
        poster = np.full(int(e.get("progress_slots", 0)), -1, np.int64)
        posts = np.flatnonzero(c["post"] >= 0)
        poster[c["post"][posts]] = posts
        if len(t.deps):
            waiter = np.repeat(np.arange(n), c["ndeps"])
            on = poster[t.deps]
            if (on < 0).any():
                raise tf.TableFormatError(f"{where}: rank {r} waits for a progress counter no "
                                          "primitive posts")
            dep_prim.append(waiter + offset)
            dep_on.append(on + offset)
        offset += n
    prims = {}
    for (k, dt), v in zip(PRIM_COLUMNS.items(), cols.values()):
        a = np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64)
        info = np.iinfo(dt)
        if len(a) and (a.min() < info.min or a.max() > info.max):   # never cut a value to fit
            raise tf.TableFormatError(f"{where}: column '{k}' holds a value outside {np.dtype(dt).name}")
        prims[k] = a.astype(dt)
    nb = _buffer_chunks(manifest)
    try:
        stats, origin, allocation = split_stats(manifest.get("stats") if isinstance(manifest.get("stats"), dict) else {})
    except ValueError as exc:
        raise tf.TableFormatError(f"manifest.json: {exc}") from None
    if manifest.get("collective") not in COLLECTIVES:
        raise tf.TableFormatError(f"manifest.json: unknown collective {str(manifest.get('collective'))[:40]!r}")
    ir = ProgramIR(
        name=str(manifest.get("algorithm")), collective=str(manifest.get("collective")), nranks=N,
        nchunks=_whole(manifest.get("nchunks"), "nchunks", 1), in_chunks=nb[int(Buf.INPUT)],
        out_chunks=nb[int(Buf.OUTPUT)], scratch_chunks=nb[int(Buf.SCRATCH)], prims=prims,
        dep_prim=np.concatenate(dep_prim) if dep_prim else np.zeros(0, np.int64),
        dep_on=np.concatenate(dep_on) if dep_on else np.zeros(0, np.int64),
        nwarps=_whole(manifest.get("nwarps", 16), "nwarps", 1, MAX_WARPS),
        chunk_bytes=_whole(manifest.get("chunk_bytes"), "chunk_bytes", 1, 1 << 40),
        npipelines=_whole(manifest.get("npipelines", 0), "npipelines"),
        ntbs=np.array([tables[r][0].ntbs for r in range(N)], np.int32),
        stats=stats, origin=origin, allocation=allocation,
        root=_whole(manifest.get("root", 0), "root", 0, max(0, N - 1)),
        nchannels=_whole(manifest.get("nchannels", 1), "nchannels", 1, MAX_CHANNELS))
    sl = manifest.get("slicing")
    if sl is not None:
        if not isinstance(sl, dict):
            raise tf.TableFormatError("manifest.json: 'slicing' must be an object")
        ir.micro_batches = _whole(sl.get("micro_batches"), "slicing.micro_batches", 1, MAX_MICRO_BATCHES)
        ir.min_slice_bytes = _whole(sl.get("min_slice_bytes"), "slicing.min_slice_bytes", 16, MAX_MIN_SLICE_BYTES)
        try:
            ir.slice_policy.check()
        except ValueError as exc:
            raise tf.TableFormatError(f"manifest.json: slicing: {exc}") from None
    # the checks of a ProgramIR JSON file: a table is the same program in another encoding
    from hccc.compiler.ir.check import check_loaded
    from hccc.compiler.ir.program_ir import IRFormatError
    try:
        check_loaded(ir)
    except IRFormatError as exc:
        raise tf.TableFormatError(f"{where}: {exc}") from None
    return ir


__all__ = ["load_tables", "program_from_table", "read_table", "table_path"]
