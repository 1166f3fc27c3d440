"""Binary primitive tables of the table-driven kernel mode (``--codegen table``), version 1.

A table file (``NAME.table``) holds one self-contained section per rank; a process uploads the
sections of the ranks it runs to device memory and passes each to the generic kernel
(``hccc_table.h``), which rebuilds every ``hccc_pd`` from it and calls the same ``hccc_prim`` as the
specialised kernels. Everything is little-endian.

File::

    u32 magic "HCTF", u32 version, u32 nranks, u32 layout, u64 offsets[nranks + 1]
    sections, each 8-byte aligned: section r = bytes [offsets[r], offsets[r + 1])

Section (offsets relative to its start)::

    head   u32 magic "HCTS", u32 version, u32 layout, u32 ncols,
           i32 <RANK_CONSTS>..., i32 ntbs,
           u64 nbytes, u64 nprims, u64 ndeps, u64 tbs, u64 deps,
           cols[ncols]: {u64 offset, i64 base, u32 bits, u32 reserved}
    tbs    ntbs + 1 entries {u32 first_prim, u32 first_dep}
    deps   i32[ndeps]: awaited progress counters, grouped by primitive
    data   one bit-packed column per entry of COLUMNS: value i = base + the ``bits``-bit unsigned
           integer at bit i * bits of the column's u64 words (LSB first; bits = 0: every value is
           ``base``); each column is followed by one spare u64 so a decoder may read a word past
           the last value.

The columns are the ``column`` fields of :data:`~hccc.compiler.backend.prim_fields.PD_FIELDS`
followed by :data:`HOST_COLUMNS` (kept for the host, which rebuilds the ProgramIR from the table;
the kernel ignores them). ``layout`` is a CRC-32 of the column and rank-constant names, so a table
written for another field list is refused by the host (:func:`read_section`) and by the kernel.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from hccc.compiler.backend.prim_fields import PD_FIELDS
from hccc.compiler.ir.program_ir import Buf, Op

TABLE_FORMAT = "hccc.table/2"
VERSION = 2
FILE_MAGIC = 0x46544348      # "HCTF"
SECTION_MAGIC = 0x53544348   # "HCTS"
#: rank constants (members of ``struct hccc_rank_consts``, in declaration order)
RANK_CONSTS = ("rank", "nchunks", "in_base", "out_base", "chunk_bytes", "max_cnt", "nch", "nsend", "nrecv",
               "nprog", "nranks")
#: columns the host keeps to rebuild the ProgramIR (the kernel does not read them)
HOST_COLUMNS = ("pipeline", "channel", "task2")
DEVICE_COLUMNS = tuple(f.name for f in PD_FIELDS if f.source == "column")
COLUMNS = DEVICE_COLUMNS + HOST_COLUMNS
LAYOUT = zlib.crc32((f"v{VERSION}:" + ",".join(COLUMNS) + ";" + ",".join(RANK_CONSTS)
                     + ";" + ",".join(f"{f.name}={f.source}" for f in PD_FIELDS)).encode())

FILE_HEAD = np.dtype([("magic", "<u4"), ("version", "<u4"), ("nranks", "<u4"), ("layout", "<u4")])
COL = np.dtype([("offset", "<u8"), ("base", "<i8"), ("bits", "<u4"), ("reserved", "<u4")])
HEAD = np.dtype([("magic", "<u4"), ("version", "<u4"), ("layout", "<u4"), ("ncols", "<u4")]
                + [(k, "<i4") for k in RANK_CONSTS] + [("ntbs", "<i4")]
                + [(k, "<u8") for k in ("nbytes", "nprims", "ndeps", "tbs", "deps")]
                + [("cols", COL, (len(COLUMNS),))], align=True)   # C layout: padding before 8-byte members
TB = np.dtype([("first_prim", "<u4"), ("first_dep", "<u4")])


class TableFormatError(ValueError):
    """A table that is not what this hccc writes (message names the rank and the problem)."""


def _align8(n: int) -> int:
    return (n + 7) & ~7


# ---------------------------------------------------------------------------- bit packing
def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Unsigned ``values`` as ``bits``-bit integers, LSB first, in u64 words plus one spare word."""
    n = len(values)
    if bits == 0:
        return b""
    v = np.ascontiguousarray(values, "<u8")
    # every value's 64 bits LSB first, keep the low ``bits`` of each, pack them back densely
    planes = np.unpackbits(v.view(np.uint8), bitorder="little").reshape(n, 64)[:, :bits]
    packed = np.packbits(planes.reshape(-1), bitorder="little").tobytes()
    words = (n * bits + 63) // 64 + 1
    return packed + bytes(words * 8 - len(packed))


def unpack_bits(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits` (``words``: u64 array), as uint64."""
    if bits == 0:
        return np.zeros(n, np.uint64)
    pos = np.arange(n, dtype=np.uint64) * np.uint64(bits)
    k = (pos >> np.uint64(6)).astype(np.int64)
    s = pos & np.uint64(63)
    v = words[k] >> s
    two = (s + np.uint64(bits)) > np.uint64(64)
    if two.any():
        v[two] |= words[k[two] + 1] << (np.uint64(64) - s[two])
    if bits < 64:
        v &= np.uint64((1 << bits) - 1)
    return v


# ---------------------------------------------------------------------------- writing
@dataclass
class RankTable:
    """What one rank's section holds, as arrays (the writer's input, the reader's output)."""
    consts: dict[str, int]        # RANK_CONSTS
    ntbs: int
    tb_first: np.ndarray          # int64[ntbs + 1]: first primitive of each TB
    columns: dict[str, np.ndarray]  # COLUMNS -> int64[nprims]
    deps: np.ndarray              # int64[ndeps]

    @property
    def nprims(self) -> int:
        return int(self.tb_first[-1]) if len(self.tb_first) else 0


def encode_section(t: RankTable) -> bytes:
    n = t.nprims
    ndeps = len(t.deps)
    ndep = np.asarray(t.columns["ndeps"], np.int64)
    dep_first = np.r_[0, np.cumsum(ndep)][np.asarray(t.tb_first, np.int64)]
    if int(ndep.sum()) != ndeps:
        raise ValueError("ndeps does not add up to the dependency array")
    if n >= 1 << 32 or ndeps >= 1 << 32:
        raise ValueError("a rank of more than 2^32 primitives does not fit a table")
    head = np.zeros(1, HEAD)
    h = head[0]
    h["magic"], h["version"], h["layout"], h["ncols"] = SECTION_MAGIC, VERSION, LAYOUT, len(COLUMNS)
    for k in RANK_CONSTS:
        h[k] = int(t.consts[k])
    h["ntbs"] = int(t.ntbs)
    tbs = np.zeros(t.ntbs + 1, TB)
    tbs["first_prim"] = t.tb_first
    tbs["first_dep"] = dep_first
    off = _align8(HEAD.itemsize)
    h["tbs"] = off
    parts = [None, tbs.tobytes()]
    off += tbs.nbytes
    pad = _align8(off) - off
    parts.append(bytes(pad))
    off += pad
    h["deps"] = off
    dep_bytes = np.asarray(t.deps, "<i4").tobytes()
    parts.append(dep_bytes + bytes(_align8(len(dep_bytes)) - len(dep_bytes)))
    off += _align8(len(dep_bytes))
    for i, name in enumerate(COLUMNS):
        v = np.asarray(t.columns[name], np.int64)
        lo = int(v.min()) if n else 0
        hi = int(v.max()) if n else 0
        bits = (hi - lo).bit_length()
        data = pack_bits((v - lo).astype(np.uint64), bits) if n else b""
        h["cols"][i] = (off, lo, bits, 0)
        parts.append(data)
        off += len(data)
    h["nbytes"], h["nprims"], h["ndeps"] = off, n, ndeps
    parts[0] = head.tobytes() + bytes(_align8(HEAD.itemsize) - HEAD.itemsize)
    out = b"".join(parts)
    assert len(out) == off
    return out


def encode_file(sections: list[bytes]) -> bytes:
    head = np.zeros(1, FILE_HEAD)
    head[0] = (FILE_MAGIC, VERSION, len(sections), LAYOUT)
    start = _align8(FILE_HEAD.itemsize + 8 * (len(sections) + 1))
    offsets = np.r_[0, np.cumsum([len(s) for s in sections])].astype("<u8") + np.uint64(start)
    pre = head.tobytes() + offsets.tobytes()
    return pre + bytes(start - len(pre)) + b"".join(sections)


# ---------------------------------------------------------------------------- reading
def file_sections(data: bytes | memoryview, where: str = "table") -> list[memoryview]:
    """The rank sections of a table file (header checked)."""
    mv = memoryview(data)
    if len(mv) < FILE_HEAD.itemsize:
        raise TableFormatError(f"{where}: too short for a table file")
    h = np.frombuffer(mv[:FILE_HEAD.itemsize], FILE_HEAD)[0]
    if int(h["magic"]) != FILE_MAGIC:
        raise TableFormatError(f"{where}: not an hccc table file (bad magic)")
    if int(h["version"]) != VERSION or int(h["layout"]) != LAYOUT:
        raise TableFormatError(f"{where}: table version {int(h['version'])} / layout "
                               f"{int(h['layout']):#010x}, this hccc reads version {VERSION} / "
                               f"layout {LAYOUT:#010x}: regenerate it")
    n = int(h["nranks"])
    end = FILE_HEAD.itemsize + 8 * (n + 1)
    if len(mv) < end:
        raise TableFormatError(f"{where}: truncated rank directory")
    offs = np.frombuffer(mv[FILE_HEAD.itemsize:end], "<u8").astype(np.int64)
    if offs[0] < end or (np.diff(offs) < 0).any() or offs[-1] != len(mv) or (offs % 8).any():
        raise TableFormatError(f"{where}: rank directory does not tile the file")
    return [mv[int(a):int(b)] for a, b in zip(offs[:-1], offs[1:])]


def read_section(data: bytes | memoryview, where: str = "table") -> RankTable:
    """Decode and check the structure of one rank section (TableFormatError when malformed)."""
    mv = memoryview(data)
    size = len(mv)

    def bad(msg: str):
        raise TableFormatError(f"{where}: {msg}")

    if size < HEAD.itemsize:
        bad("too short for a table section")
    h = np.frombuffer(mv[:HEAD.itemsize], HEAD)[0]
    if int(h["magic"]) != SECTION_MAGIC:
        bad("not an hccc table section (bad magic)")
    if int(h["version"]) != VERSION or int(h["layout"]) != LAYOUT or int(h["ncols"]) != len(COLUMNS):
        bad(f"version {int(h['version'])} / layout {int(h['layout']):#010x} / {int(h['ncols'])} columns; "
            f"this hccc reads version {VERSION} / layout {LAYOUT:#010x} / {len(COLUMNS)} columns")
    if int(h["nbytes"]) != size:
        bad(f"section says {int(h['nbytes'])} bytes, has {size}")
    ntbs, n, ndeps = int(h["ntbs"]), int(h["nprims"]), int(h["ndeps"])
    if ntbs < 0:
        bad("negative TB count")

    def span(off: int, nbytes: int, what: str) -> memoryview:
        if off % 8 or off < HEAD.itemsize or off + nbytes > size:
            bad(f"{what} lies outside the section")
        return mv[off:off + nbytes]

    tbs = np.frombuffer(span(int(h["tbs"]), (ntbs + 1) * TB.itemsize, "TB table"), TB)
    first = tbs["first_prim"].astype(np.int64)
    if first[0] != 0 or first[-1] != n or (np.diff(first) < 0).any():
        bad("TB table does not tile the primitives")
    deps = np.frombuffer(span(int(h["deps"]), 4 * ndeps, "dependency array"), "<i4").astype(np.int64)
    cols = {}
    for i, name in enumerate(COLUMNS):
        c = h["cols"][i]
        bits = int(c["bits"])
        if bits > 64:
            bad(f"column {name} has {bits} bits")
        nwords = (n * bits + 63) // 64 + 1 if bits else 0
        words = np.frombuffer(span(int(c["offset"]), 8 * nwords, f"column {name}"), "<u8") \
            if bits else np.zeros(0, np.uint64)
        v = unpack_bits(words, bits, n).view(np.int64) + np.int64(int(c["base"]))
        cols[name] = v
    ndep = cols["ndeps"]
    if n and ndep.min() < 0:
        bad("negative dependency count")
    cum = np.r_[0, np.cumsum(ndep)]
    if int(cum[-1]) != ndeps:
        bad("dependency counts do not add up to the dependency array")
    if (tbs["first_dep"].astype(np.int64) != cum[first]).any():
        bad("TB table's dependency starts disagree with the dependency counts")
    consts = {k: int(h[k]) for k in RANK_CONSTS}
    return RankTable(consts, ntbs, first, cols, deps)


def check_section(t: RankTable, entry: dict, nchunks_buf: dict[int, int], where: str) -> None:
    """Values the kernel trusts, against the rank's manifest entry: connection and progress
    indices in range, the connections each op needs present, buffers and chunk ranges valid.
    ``nchunks_buf``: chunks of each buffer (Buf value -> count)."""
    def bad(msg: str):
        raise TableFormatError(f"{where}: {msg}")

    c = t.columns
    n = t.nprims
    if t.ntbs != int(entry.get("tbs", -1)):
        bad(f"{t.ntbs} TBs where the manifest says {entry.get('tbs')}")
    if t.consts["rank"] != int(entry.get("rank", -1)):
        bad(f"section of rank {t.consts['rank']}")
    if t.consts["chunk_bytes"] <= 0 or t.consts["nchunks"] <= 0:
        bad("chunk size and chunk count must be positive")
    if t.consts["max_cnt"] < 1:
        bad("the most chunks one primitive moves must be positive")
    # the kernel indexes channel c's connections and counters at c * nsend, c * nrecv, c * nprog
    for key, want in (("nch", max(1, int(entry.get("nchannels", 1)))),
                      ("nsend", len(entry.get("send_conns", []))), ("nrecv", len(entry.get("recv_conns", []))),
                      ("nprog", int(entry.get("progress_slots", 0)))):
        if t.consts[key] != want:
            bad(f"{key} is {t.consts[key]} where the manifest says {want}")
    if not n:
        return
    nsend, nrecv = len(entry.get("send_conns", [])), len(entry.get("recv_conns", []))
    nprog = int(entry.get("progress_slots", 0))
    op = c["op"]
    if op.min() < 0 or op.max() >= len(Op):
        bad("unknown op")
    sends = np.array([o.sends for o in Op])[op]
    recvs = np.array([o.receives for o in Op])[op]
    # a FIFO slot carries one micro-batch of one sending or receiving primitive: max_cnt is the
    # most chunks such a primitive moves (ProgramIR.max_step_chunks); local copies use no slot
    comm = sends | recvs
    if comm.any() and int(c["cnt"][comm].max()) > t.consts["max_cnt"]:
        bad(f"a primitive moves {int(c['cnt'][comm].max())} chunks through a FIFO slot, more than "
            f"the {t.consts['max_cnt']} a slot holds")
    for name, need, lim in (("sconn", sends, nsend), ("rconn", recvs, nrecv)):
        v = c[name]
        if ((v < -1) | (v >= lim)).any() or (need & (v < 0)).any():
            bad(f"{name} out of range (the rank has {lim} such connections)")
    if ((c["post"] < -1) | (c["post"] >= nprog)).any() or \
            (len(t.deps) and (t.deps.min() < 0 or t.deps.max() >= nprog)):
        bad(f"progress counter out of range (the rank has {nprog})")
    cnt = c["cnt"]
    if cnt.min() < 0 or (c["chunk"] < 0).any() or (c["chunk"] + cnt > t.consts["nchunks"]).any():
        bad("chunk range outside the buffer")
    if (c["spos"] < 0).any() or (c["rpos"] < 0).any():
        bad("negative FIFO position")
    for bname, oname in (("sbuf", "soff"), ("dbuf", "doff")):
        b, o = c[bname], c[oname]
        if b.min() < 0 or b.max() > max(Buf):
            bad(f"unknown buffer in {bname}")
        lim = np.array([nchunks_buf.get(int(x), 0) for x in Buf])[b]
        used = b != Buf.NONE
        if (used & ((o < 0) | (o + cnt > lim))).any():
            bad(f"{oname} outside its buffer")


__all__ = ["TABLE_FORMAT", "VERSION", "LAYOUT", "COLUMNS", "DEVICE_COLUMNS", "HOST_COLUMNS",
           "RANK_CONSTS", "HEAD", "COL", "TB", "RankTable", "TableFormatError", "pack_bits",
           "unpack_bits", "encode_section", "encode_file", "file_sections", "read_section",
           "check_section"]
