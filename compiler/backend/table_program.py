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
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, ProgramIR


def _buffer_chunks(manifest: dict) -> dict[int, int]:
    b = manifest.get("buffers") or {}
    return {int(Buf.NONE): 0, int(Buf.INPUT): int(b.get("input", 0)),
            int(Buf.OUTPUT): int(b.get("output", 0)), int(Buf.SCRATCH): int(b.get("scratch", 0))}


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
        for key, conns in (("sconn", e["send_conns"]), ("rconn", e["recv_conns"])):
            table = np.array([int(pc[0]) for pc in conns] + [-1], np.int64)
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
    prims = {k: (np.concatenate(v) if v else np.zeros(0)).astype(dt) for (k, dt), v in
             zip(PRIM_COLUMNS.items(), cols.values())}
    b = manifest.get("buffers") or {}
    return ProgramIR(
        name=str(manifest["algorithm"]), collective=str(manifest["collective"]), nranks=N,
        nchunks=int(manifest["nchunks"]), in_chunks=int(b.get("input", 0)),
        out_chunks=int(b.get("output", 0)), scratch_chunks=int(b.get("scratch", 0)), prims=prims,
        dep_prim=np.concatenate(dep_prim) if dep_prim else np.zeros(0, np.int64),
        dep_on=np.concatenate(dep_on) if dep_on else np.zeros(0, np.int64),
        nwarps=int(manifest.get("nwarps", 16)), chunk_bytes=int(manifest["chunk_bytes"]),
        npipelines=int(manifest.get("npipelines", 0)),
        ntbs=np.array([tables[r][0].ntbs for r in range(N)], np.int32),
        stats=dict(manifest.get("stats") or {}), root=int(manifest.get("root", 0)),
        nchannels=max(1, int(manifest.get("nchannels", 1))))


__all__ = ["load_tables", "program_from_table", "table_path"]
