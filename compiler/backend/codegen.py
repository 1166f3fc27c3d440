"""Code generation: ProgramIR -> CUDA / HIP kernel sources, primitive headers, manifest, build files.

Each rank gets one source file holding its program as data -- a table of primitive rows (``struct
hccc_pd`` initialisers, one per line, grouped by thread block), its awaited progress counters and
its thread blocks' ranges, in device memory -- and one ``extern "C" __global__`` kernel per (dtype,
op) instantiation, which runs the rank's program through the one engine of ``hccc_prims.h``
(``hccc_run``). The per-primitive lines are built with plain string formatting from the numpy
columns (this is the hot path: ~4M primitives at 1,024 ranks); Jinja renders only the file
skeletons.

The protocol and kernel-argument layout live in the emitted ``hccc_prims.h`` (rank-independent);
every platform-specific construct lives in ``hccc_platform.h``.
"""
from __future__ import annotations

import functools
import json
import pathlib
import time
from dataclasses import dataclass

import jinja2
import numpy as np

from hccc.compiler.backend.file_sink import FileSink
from hccc.compiler.backend.output_dir import MANIFEST_SCHEMA
from hccc.compiler.backend import abi, prim_table
from hccc.compiler.ir import engine_shape
from hccc.compiler.backend.prim_fields import pd_columns
from hccc.compiler.ir.check import check_fifo_order, check_structure
from hccc.compiler.ir.connections import match_connections
from hccc.compiler.ir.extents import buffer_bases, chunk_anchors
from hccc.compiler.ir.int_text import RowText
from hccc.compiler.ir.program_ir import NAME_RE, Buf, Op, ProgramIR
from hccc.compiler.passes.slicing import FIFO_BUDGET_BYTES, slot_share_bytes
from hccc.compiler.ir.sort_order import lexsort
from hccc.util import dtypes as dtypes_table

VERSION = "0.1.0"
PLATFORMS = ("cuda", "hip")
WARP_SIZE = {"cuda": 32, "hip": 64}
EXT = {"cuda": "cu", "hip": "hip"}
#: (dtype, C type) of every element type the kernels instantiate, and the reduction operators: from
#: the one table of them (hccc.util.dtypes)
DTYPES = tuple((d.name, d.ctype) for d in dtypes_table.DTYPES)
REDOPS = dtypes_table.OP_NAMES
NSLOTS = abi.NSLOTS
#: bytes each region of a FIFO slot adds to its share (hccc_prims.h HCCC_REGION_BYTES)
SLOT_OVERHEAD = abi.SLOT_OVERHEAD
ABI_VERSION = abi.VERSION
HEADERS = ("hccc_cpu_emu.h", "hccc_platform.h", "hccc_prims.h")
#: the C++ host API for one rank per process (templates/common/hccc_host.h.j2)
HOST_HEADER = "hccc_host.h"

_SEND_OPS = np.array([Op(o).sends for o in range(len(Op))])
_RECV_OPS = np.array([Op(o).receives for o in range(len(Op))])
_OP_NAMES = [o.name for o in Op]
_BUF_NAMES = [b.name for b in Buf]


def slot_bytes(chunk_bytes: int, max_step_chunks: int) -> int:
    """Bytes of one FIFO slot (hccc_prims.h HCCC_SLOT_BYTES): one region per chunk of a message,
    each a share of the slot plus SLOT_OVERHEAD."""
    regions = max(1, int(max_step_chunks))
    return regions * (slot_share_bytes(chunk_bytes, regions) + SLOT_OVERHEAD)


def channel_count(ir: ProgramIR) -> int:
    """Blocks per thread block (ProgramIR ``nchannels``, at least 1). The manifest's connection
    lists and ``progress_slots`` are one channel's; a rank's kernel argument holds ``nchannels``
    copies of each, channel ``c``'s ``c``-th (see hccc_prims.h), and its grid ``blocks`` =
    ``nchannels * tbs``."""
    return max(1, int(getattr(ir, "nchannels", 1) or 1))


def channel_stride(rank_entries) -> int:
    """1 + the largest ``channel`` of any connection of the manifest's ``rank_entries``: the
    stride of the channels' connections in :func:`replicated_conns`."""
    return 1 + max((int(c) for e in rank_entries for key in ("send_conns", "recv_conns")
                    for _, c in e[key]), default=0)


def replicated_conns(conns, nch: int, stride: int) -> list[tuple[int, int]]:
    """A rank's connections as its kernel argument lays them out with ``nch`` channels: the
    manifest's one-channel list ``[(peer, channel), ...]`` ``nch`` times, channel ``c``'s copy with
    ``channel + c * stride`` (``stride``: :func:`channel_stride`), so that sender and receiver name
    each copy alike (a host pairs the ends by (peer, channel), and the copies stay distinct)."""
    return [(int(p), int(ch) + c * stride) for c in range(max(1, nch)) for p, ch in conns]


def program_type(ir: ProgramIR) -> str:
    """The C++ type of a rank's program in its source: for a blockwise collective (AllToAll: its
    kernels also run as AllToAllv, so its engine has that path) ``HCCC_TVPROGRAM(N)`` where its
    blocks decode their primitives into a table of N entries at launch
    (:mod:`hccc.compiler.backend.prim_table`), else ``hccc_vprogram``; for every other (its engine
    is compiled without the AllToAllv path, and refuses counts) ``HCCC_TPROGRAM(N)``, else
    ``hccc_program``."""
    from hccc.compiler.frontend.collectives import spec_of
    v = spec_of(ir.collective).per_pair_counts
    n = prim_table.ptable_prims(ir, False)
    if n:
        return f"HCCC_TVPROGRAM({n})" if v else f"HCCC_TPROGRAM({n})"
    return "hccc_vprogram" if v else "hccc_program"


def threads_per_tb(nwarps: int, platform: str) -> int:
    """Threads per TB: nwarps * warp size, capped at 1024 (and at least one warp)."""
    return max(WARP_SIZE[platform], min(1024, int(nwarps) * WARP_SIZE[platform]))


@functools.lru_cache(maxsize=None)
def _template_env() -> jinja2.Environment:
    """Templates ship as package data of ``hccc.templates``. One environment per process, so each
    template compiles once (jinja reloads a template whose file changed)."""
    from importlib import resources
    root = resources.files("hccc.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False)
    env.globals["abi"] = abi   # every ABI fact the templates print comes from the one source
    env.globals["types"] = dtypes_table   # and every element type and reduction operator
    env.globals["engine"] = engine_shape   # and the copy engine's vectors in flight a thread
    env.globals["prim_table"] = prim_table   # the decoded-primitive table's budget
    from hccc.compiler.ir import ll_chains
    env.globals["ll_chains"] = ll_chains   # the platforms whose kernels run fused LL chains
    return env


# ---------------------------------------------------------------------------- column analysis
@dataclass
class Columns:
    """Per-primitive compile-time constants derived from the IR (all numpy, canonical order)."""
    sconn: np.ndarray      # send connection index within the rank, -1
    spos: np.ndarray       # messages (primitives) posted earlier on that connection
    rconn: np.ndarray
    rpos: np.ndarray
    chunk: np.ndarray      # chunk of the full buffer that defines the slice geometry
    post: np.ndarray       # progress slot this primitive publishes, -1
    send_conns: list       # per rank: [[peer, channel], ...]
    recv_conns: list
    nprogress: np.ndarray  # per rank
    dep_owner: np.ndarray  # sorted indices of primitives that wait for progress counters
    dep_n: np.ndarray      # per dep_owner entry: how many
    dep_slots: np.ndarray  # the awaited slots, grouped by dep_owner entry (in that order)


def _conn_index(rank, peer, channel, mask, count, nranks):
    """Index of (peer, channel) among the rank's connections, and FIFO position (in chunks)."""
    n = len(rank)
    conn = np.full(n, -1, np.int64)
    pos = np.zeros(n, np.int64)
    tables = [[] for _ in range(nranks)]
    idx = np.flatnonzero(mask)
    if not len(idx):
        return conn, pos, tables
    r, p, ch = rank[idx].astype(np.int64), peer[idx].astype(np.int64), channel[idx].astype(np.int64)
    order = lexsort((idx, ch, p, r))          # group by (rank, peer, channel), FIFO order inside
    rs, ps, cs = r[order], p[order], ch[order]
    new = np.r_[True, (rs[1:] != rs[:-1]) | (ps[1:] != ps[:-1]) | (cs[1:] != cs[:-1])]
    gid = np.cumsum(new) - 1                     # global connection id
    gstart = np.flatnonzero(new)
    grank = rs[gstart]
    rank_first = np.r_[True, grank[1:] != grank[:-1]]
    first_gid_of_rank = np.maximum.accumulate(np.where(rank_first, np.arange(len(gstart)), 0))
    local = np.arange(len(gstart)) - first_gid_of_rank
    cnt = count[idx][order].astype(np.int64)
    csum = np.cumsum(cnt) - cnt
    pos_sorted = csum - csum[gstart][gid]
    conn[idx[order]] = local[gid]
    pos[idx[order]] = pos_sorted
    # each rank's connections as [peer, channel] lists, in connection order
    rows = np.stack([ps[gstart], cs[gstart]], axis=1)
    cut = np.flatnonzero(rank_first)
    for rr, part in zip(grank[cut].tolist(), np.split(rows, cut[1:])):
        tables[rr] = part.tolist()
    return conn, pos, tables


def message_anchors(ir: ProgramIR, anchor: np.ndarray) -> np.ndarray:
    """Every primitive of a send/receive chain gets the anchor of the chain's first sender, so
    that both ends of every message name one anchor: the kernels place a FIFO region's data at
    an offset both ends compute from it (``hccc_region_offset``, hccc_prims.h), with no header
    sent. The anchor's role is the size of the chunks a primitive moves, and every chunk of a
    chain has its anchor's size (:func:`~hccc.compiler.ir.extents.chunk_anchors` proved it), so
    the chain's first anchor serves every primitive of it."""
    n = len(anchor)
    s, r = match_connections(ir)
    if n == 0 or len(r) == 0:
        return anchor
    head = np.arange(n, dtype=np.int64)
    head[r] = s
    while True:                          # pointer jumping: each primitive's chain head
        nxt = head[head]
        if np.array_equal(nxt, head):
            return anchor[head]
        head = nxt


def analyse(ir: ProgramIR) -> Columns:
    p = ir.prims
    n = ir.nprims
    op = p["op"].astype(np.int64)
    if n and (op.min() < 0 or op.max() >= len(Op)):
        raise ValueError("primitive table holds an unknown op")
    rank = p["rank"].astype(np.int64)
    sends, recvs = _SEND_OPS[op], _RECV_OPS[op]
    # FIFO positions count messages: one slot per primitive and micro-batch, whatever its count
    ones = np.ones(n, np.int64)
    sconn, spos, stab = _conn_index(rank, p["send_peer"], p["channel"], sends, ones, ir.nranks)
    rconn, rpos, rtab = _conn_index(rank, p["recv_peer"], p["channel"], recvs, ones, ir.nranks)

    # Anchor chunk: the chunk of the full buffer whose size every chunk the primitive names has
    # (proven for every element count, or ExtentError), one per send/receive chain
    chunk = message_anchors(ir, chunk_anchors(ir))

    # Progress slots: one per primitive some other primitive waits for, numbered per rank.
    post = np.full(n, -1, np.int64)
    nprogress = np.zeros(ir.nranks, np.int64)
    dep_owner = np.zeros(0, np.int64)
    dep_n = np.zeros(0, np.int64)
    dep_slots = np.zeros(0, np.int64)
    if len(ir.dep_on):
        mark = np.zeros(n, bool)
        mark[ir.dep_on] = True
        targets = np.flatnonzero(mark)
        trank = rank[targets]
        first = np.r_[True, trank[1:] != trank[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(targets)), 0))
        post[targets] = np.arange(len(targets)) - start
        nprogress += np.bincount(trank, minlength=ir.nranks)
        dp = ir.dep_prim.astype(np.int64)
        slots = post[ir.dep_on.astype(np.int64)]
        order = lexsort((slots, dp))
        dp_s, sl_s = dp[order], slots[order]
        keep = np.r_[True, (dp_s[1:] != dp_s[:-1]) | (sl_s[1:] != sl_s[:-1])]
        dp_s, sl_s = dp_s[keep], sl_s[keep]
        last = np.r_[dp_s[1:] != dp_s[:-1], True]          # last slot of each waiting primitive
        bounds = np.flatnonzero(np.r_[True, last[:-1]])
        dep_owner = dp_s[bounds]
        dep_n = np.diff(np.r_[bounds, len(dp_s)])
        dep_slots = sl_s
    return Columns(sconn, spos, rconn, rpos, chunk, post, stab, rtab, nprogress, dep_owner,
                   dep_n, dep_slots)


# ---------------------------------------------------------------------------- primitive lines
def _prim_lines(ir: ProgramIR, col: Columns, dx: dict | None = None) -> tuple[memoryview, np.ndarray]:
    """One line of C++ per primitive: its row of the rank's program table, then a comment naming
    sub-pipeline, task(s) and peers.

    Hot path (millions of rows): the lines are assembled column by column
    (:class:`~hccc.compiler.ir.int_text.RowText`), all primitives at once, into one buffer.
    Returns the text (each line ends with a newline) and each line's start offset.
    Without progress waits a line reads::

        HCCC_P(seq, OP, sconn, spos, rconn, rpos, SRCBUF, soff, DSTBUF, doff, cnt, chunk, post, task),  // sp P[, task T[+T2]][, from rX][, to rY]

    and with them ``HCCC_PW(..., task, nwaits),`` with the same comment followed by ``, after
    progress S1, S2`` (the awaited counters themselves are the rank's ``deps`` array, in primitive
    order). Primitives with direct-mode fields (``dx``,
    :func:`hccc.compiler.backend.direct_fields.direct_fields`) use ``HCCC_PX`` / ``HCCC_PWX``,
    which take ``direct, dpeer, PBUF, poff, pbase`` last, and their comment ends with ``, direct``.
    The first row of a receive group (:mod:`hccc.compiler.ir.reduce_groups`) and a row of a fused LL
    chain (:mod:`hccc.compiler.ir.ll_chains`) add ``G`` to the macro's name and the group's size and
    the chain's rows from this one on as the last arguments (``nsrc, chain``); the comment ends with
    ``, reduces K receives in one unit`` or ``, LL chain of K rows on``.
    """
    p = ir.prims
    n = ir.nprims
    if n == 0:
        return memoryview(b""), np.zeros(1, np.int64)
    op = p["op"].astype(np.int64)
    task2 = p["task2"].astype(np.int64)
    has_deps = np.zeros(n, bool)
    has_deps[col.dep_owner] = True
    v = pd_columns(ir, col, dx)
    # the awaited slots of each waiting primitive, as text "3, 7" (one blob, a range per primitive)
    dep_start = np.zeros(n, np.int64)
    dep_len = np.zeros(n, np.int64)
    blob = b""
    if len(col.dep_owner):
        rt = RowText(len(col.dep_slots)).int(col.dep_slots)
        blob, off = rt.render(end=", ")
        first = np.r_[0, np.cumsum(col.dep_n)[:-1]]
        last = first + col.dep_n - 1
        dep_start[col.dep_owner] = off[first]
        dep_len[col.dep_owner] = off[last + 1] - 2 - off[first]
    sends, recvs = _SEND_OPS[op], _RECV_OPS[op]
    has_x = dx["direct"] != 0 if dx is not None else np.zeros(n, bool)
    has_g = (v["nsrc"] != 0) | (v["chain"] != 0)
    has_n, has_c = v["nsrc"] != 0, v["chain"] != 0
    rt = RowText(n)
    rt.text("  HCCC_P").text("W", has_deps).text("X", has_x).text("G", has_g).text("(")
    # the macro's arguments in the ABI's call order (hccc.compiler.backend.abi.pd_call_fields)
    for group, where in ((abi.PD_CALL_BASE, None), (abi.PD_CALL_WAITS, has_deps), (abi.PD_CALL_DIRECT, has_x),
                         (abi.PD_CALL_GROUP, has_g)):
        if where is not None and not where.any():
            continue
        for k in group:
            if k != group[0] or group is not abi.PD_CALL_BASE:
                rt.text(", ", where)
            if k in abi.PD_ENUM_PREFIX:
                rt.choice(v[k], _OP_NAMES if k == "op" else _BUF_NAMES, where)
            else:
                rt.int(v[k], where)
    rt.text("),")
    rt.text("  // sp ").int(p["pipeline"])
    t_here = v["task"] >= 0
    rt.text(", task ", t_here).int(v["task"], t_here)
    t2_here = task2 >= 0
    rt.text("+", t2_here).int(task2, t2_here)
    rt.text(", from r", recvs).int(p["recv_peer"], recvs)
    rt.text(", to r", sends).int(p["send_peer"], sends)
    rt.text(", after progress ", has_deps).blob(blob, dep_start, dep_len, has_deps)
    rt.text(", direct", has_x)
    rt.text(", reduces ", has_n).int(v["nsrc"], has_n).text(" receives in one unit", has_n)
    rt.text(", LL chain of ", has_c).int(v["chain"], has_c).text(" rows on", has_c)
    return rt.render_view("\n")


# ---------------------------------------------------------------------------- entry point
def _check(ir: ProgramIR, platforms: list[tuple[str, ...]]) -> None:
    if not isinstance(ir.name, str) or not NAME_RE.fullmatch(ir.name):
        raise ValueError(f"ProgramIR name {ir.name!r} is not a sanitised identifier")
    if len(platforms) != ir.nranks:
        raise ValueError(f"platforms has {len(platforms)} entries, expected {ir.nranks}")
    for pls in platforms:
        for pl in pls:
            if pl not in PLATFORMS:
                raise ValueError(f"unknown platform {pl!r} (expected one of {', '.join(PLATFORMS)})")
    if ir.chunk_bytes <= 0 or ir.chunk_bytes % 16 or ir.chunk_bytes > (1 << 30):
        raise ValueError("chunk_bytes must be a positive multiple of 16 of at most 1 GiB")
    if ir.chunk_bytes < 16 * ir.max_step_chunks:
        raise ValueError(f"chunk_bytes {ir.chunk_bytes} is too small: a FIFO slot carries one slice of "
                         f"each of up to {ir.max_step_chunks} chunks of a step, at least 16 bytes each")
    if ir.nchunks < 1:
        raise ValueError("nchunks must be positive")


def prepare_output(ir: ProgramIR, outdir, platforms: list, structure_checked: bool = False):
    """What both code-generation modes start from: the platforms as tuples, checked against the
    program; the program in canonical order and structurally checked (value ranges, dense TB ids,
    single-TB connection ends: IRFormatError) unless the caller says it already passed
    :func:`check_structure` (which only canonical programs pass); the output directory as a path."""
    platforms = [(pl,) if isinstance(pl, str) else tuple(pl) for pl in platforms]
    _check(ir, platforms)
    if not structure_checked:
        if not _is_canonical(ir):
            ir = _sorted_copy(ir)
        check_structure(ir)
    # what reading the written .ir.json back checks beyond the structure (check_loaded): never write
    # a program that `hccc run`, `check` or a Communicator would then refuse
    check_fifo_order(ir)
    return ir, pathlib.Path(outdir), platforms


def manifest_text(prog: ProgramIR, written: dict, *, name: str, nthreads: int, codegen: str, headers, libraries: dict,
                  ranks: list, stats: dict, extra_files=(), manifest_extra: dict | None = None, **fields) -> str:
    """``manifest.json`` of an output directory, for either code-generation mode: the program's
    shape, the kernel ABI, the files hccc wrote (``written``'s names, ``manifest.json`` and
    ``extra_files``), plus the mode's own ``fields`` and the caller's ``manifest_extra`` (which may
    not replace a field)."""
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "generator": f"hccc {VERSION}",
        "algorithm": name,
        "collective": prog.collective,
        "root": int(prog.root),
        "nranks": int(prog.nranks),
        "nchunks": int(prog.nchunks),
        "buffers": {"input": int(prog.in_chunks), "output": int(prog.out_chunks),
                    "scratch": int(prog.scratch_chunks)},
        "chunk_bytes": int(prog.chunk_bytes),
        "nslots": NSLOTS,
        "nchannels": channel_count(prog),
        "channel_stride": channel_stride(ranks),
        "slot_bytes": slot_bytes(int(prog.chunk_bytes), int(prog.max_step_chunks)),
        "nwarps": int(prog.nwarps),
        "npipelines": int(prog.npipelines),
        "nthreads": nthreads,
        "dtypes": [d for d, _ in DTYPES],
        "ops": list(REDOPS),
        "kernel_symbol": "{kernel}_{dtype}_{op}",
        "abi_version": ABI_VERSION,
        "codegen": codegen,
        "headers": list(headers),
        "libraries": libraries,
        "ranks": ranks,
        "stats": stats,
        **fields,
    }
    if not prog.slice_policy.is_default:    # the Python runtime's slices (absent: hccc's default)
        manifest["slicing"] = prog.slice_policy.as_dict()
    for key, value in (manifest_extra or {}).items():
        if key in manifest:
            raise ValueError(f"manifest_extra cannot replace the manifest field {key!r}")
        manifest[key] = value
    manifest["files"] = sorted(set(written) | {"manifest.json"} | set(extra_files))
    return manifest_json(manifest)


#: lists longer than this are written one entry per line (each entry on a line of its own)
_LONG_LIST = 32


def manifest_json(manifest: dict) -> str:
    """The manifest as JSON text: keys sorted, indented by one space, but a long list (a large
    program's ranks and files) one compact entry per line: the same document as
    ``json.dumps(manifest, indent=1, sort_keys=True)``, made by the C encoder (the indenting one is
    pure Python: seconds at 1,024 ranks)."""
    if not manifest:
        return "{}\n"
    parts = []
    for key in sorted(manifest):
        value = manifest[key]
        if isinstance(value, list) and len(value) > _LONG_LIST:
            text = "[\n" + ",\n".join("  " + json.dumps(v, sort_keys=True) for v in value) + "\n ]"
        else:
            text = json.dumps(value, indent=1, sort_keys=True).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def generate(ir: ProgramIR, outdir: pathlib.Path, *, platforms: list[str],
             timings: dict | None = None, manifest_extra: dict | None = None,
             extra_files: tuple[str, ...] = (), direct: str = "auto",
             structure_checked: bool = False) -> list[pathlib.Path]:
    """Write kernels, headers, manifest, IR JSON and build files into ``outdir`` (existing, empty).

    ``platforms[r]`` is ``"cuda"`` or ``"hip"`` for rank ``r``, or a tuple of both (``--target all``):
    the first is the platform the rank runs on (manifest ``platform``/``source``), every one gets a
    source (manifest ``sources``). Returns the written paths, sorted.
    ``timings``, when given, receives seconds per phase (analyse, lines, render, write: the IR JSON is made
    on the writer thread meanwhile, so ``write`` is what is left of it and of the file writes).
    ``manifest_extra`` adds top-level manifest fields (JSON-serialisable; e.g. ``topology``); a key
    that the manifest already has is a ValueError. ``extra_files`` names files the caller adds to
    ``outdir`` itself: the manifest's ``files`` (everything hccc wrote there, so that a later run
    replaces only those) lists them too. ``direct``: ``auto`` emits the receives
    :mod:`hccc.compiler.ir.direct` proves safe (and their sends) in direct mode, ``off`` none
    (:mod:`hccc.compiler.backend.direct_fields`). Files are written as they are made (:class:`FileSink`).
    ``structure_checked``: ``ir`` already passed :func:`check_structure` (as :func:`~hccc.compiler.
    passes.build.build_program`'s programs have), which is then not run again.
    """
    with FileSink(pathlib.Path(outdir)) as sink:
        return _generate(ir, outdir, sink, platforms=platforms, timings=timings,
                         manifest_extra=manifest_extra, extra_files=extra_files, direct=direct,
                         structure_checked=structure_checked)


def _generate(ir: ProgramIR, outdir, written: FileSink, *, platforms: list[str], timings: dict | None,
              manifest_extra: dict | None, extra_files: tuple[str, ...], direct: str,
              structure_checked: bool) -> list[pathlib.Path]:
    from hccc.compiler.backend.direct_fields import direct_fields
    tm = timings if timings is not None else {}
    t0 = time.perf_counter()
    ir, outdir, platforms = prepare_output(ir, outdir, platforms, structure_checked)
    env = _template_env()
    name = ir.name
    ir_file = f"{name}.ir.json"
    written.compute(ir_file, ir.to_json_pieces)      # made on the writer thread, beside the kernels

    col = analyse(ir)
    dx = direct_fields(ir, direct)
    t1 = time.perf_counter()
    text, line_at = _prim_lines(ir, col, dx)
    t2 = time.perf_counter()
    tm["codegen_analyse"] = t1 - t0
    tm["codegen_lines"] = t2 - t1
    lay = _Layout(ir, col)
    present = [pl for pl in PLATFORMS if any(pl in pls for pls in platforms)]
    nthreads = {pl: threads_per_tb(ir.nwarps, pl) for pl in present}
    common = dict(version=VERSION, name=name, collective=ir.collective, nranks=ir.nranks,
                  program_type=program_type(ir))
    rank_tpl = env.get_template("common/rank.j2")
    rank_entries = []
    sources: dict[str, list[str]] = {pl: [] for pl in present}
    for r in range(ir.nranks):
        rank_entries.append(_render_rank(ir, r, platforms[r], lay, col, (text, line_at), rank_tpl,
                                         common, nthreads, written, sources))

    # the one-grid entry lays out each rank's blocks: channels x thread blocks
    grid = grid_entries(env, ir, platforms, written, common, [lay.nch * t for t in lay.ntbs], nthreads)
    umbrella, libraries = _render_shared(env, ir, platforms, present, sources, common, rank_entries,
                                         nthreads, lay, written)
    t3 = time.perf_counter()
    tm["codegen_render"] = t3 - t2

    written["manifest.json"] = manifest_text(
        ir, written, name=name, nthreads=nthreads, codegen="specialized", headers=HEADERS, libraries=libraries,
        ranks=rank_entries, stats=program_stats(ir, col, lay.ntbs), extra_files=extra_files,
        manifest_extra=manifest_extra, ir=ir_file, umbrella=umbrella, grid=grid,
        host_header=HOST_HEADER)

    paths = written.close()
    tm["codegen_write"] = time.perf_counter() - t3     # what is left of the IR JSON and the writes
    return paths


class _Layout:
    """Where a program's rows go in its rank sources: each rank's thread blocks (``ntbs``; the
    thread blocks with rows, in table order, as arrays: ``tb_start`` / ``tb_stop`` their rows,
    ``tb_id`` their index, rank ``r``'s being ``tb_first[r]:tb_first[r + 1]``), their pipelines
    (``tb_pipelines``, a text each), the ranks' first rows (``rank_at``), and every rank's awaited
    progress counters as one text (``dep_text``: "S1, S2, ..., ", with each primitive's start
    ``dep_at`` and each counter's offset ``dep_off``: a rank's deps array is a slice of it). Arrays,
    not a dict per thread block: a 1,024-GPU AllReduce has 4.2 M of them."""

    def __init__(self, ir: ProgramIR, col):
        self.in_base, self.out_base = buffer_bases(ir)
        ntbs = np.zeros(ir.nranks, np.int64)
        ntbs_col = np.asarray(ir.ntbs, np.int64)[:ir.nranks]
        ntbs[:len(ntbs_col)] = ntbs_col
        # the table is in canonical order (rank, thread block, ...): a thread block's rows are a run
        rank = np.asarray(ir.prims["rank"], np.int64)
        tb = np.asarray(ir.prims["tb"], np.int64)
        key = rank * (1 << 20) + tb
        self.tb_start = np.r_[0, np.flatnonzero(np.diff(key)) + 1] if len(key) else np.zeros(0, np.int64)
        self.tb_stop = np.r_[self.tb_start[1:], len(key)].astype(np.int64)
        self.tb_id = tb[self.tb_start]
        self.tb_first = np.searchsorted(rank[self.tb_start], np.arange(ir.nranks + 1))
        has = self.tb_first[1:] > self.tb_first[:-1]
        ntbs[has] = np.maximum(ntbs[has], self.tb_id[self.tb_first[1:][has] - 1] + 1)
        self.ntbs = ntbs.tolist()
        self.tb_pipelines = _tb_pipeline_texts(ir, self.tb_start)
        self.max_cnt = ir.max_step_chunks    # a scan of the whole table: once, not once per rank
        self.nch = channel_count(ir)
        ndeps_col = np.zeros(ir.nprims, np.int64)
        if len(col.dep_owner):
            ndeps_col[col.dep_owner] = col.dep_n
        self.dep_at = np.r_[0, np.cumsum(ndeps_col)]
        if len(col.dep_slots):
            self.dep_text, self.dep_off = RowText(len(col.dep_slots)).int(col.dep_slots).render_view(", ")
        else:
            self.dep_text, self.dep_off = memoryview(b""), np.zeros(1, np.int64)
        self.ptb = np.asarray(ir.prims["tb"], np.int64)
        self.rank_at = np.searchsorted(np.asarray(ir.prims["rank"], np.int64), np.arange(ir.nranks + 1))


def _render_rank(ir: ProgramIR, r: int, rank_platforms: list[str], lay: _Layout, col, lines,
                 rank_tpl, common: dict, nthreads: dict, written: FileSink,
                 sources: dict[str, list[str]]) -> dict:
    """Rank ``r``'s source for each of its platforms (its thread blocks' rows spliced in), and its
    entry of the manifest."""
    text, line_at = lines
    name = ir.name
    pl = rank_platforms[0]
    kernel = f"hccc_{name}_r{r}"
    # each TB's heading and rows, and the TB ranges, joined here rather than looped over in the
    # template: a rank of a 1,024-GPU program has thousands of TBs, which jinja's loop rendered at
    # several microseconds each (the largest phase of the compile at 512 GPUs)
    a, b = int(lay.tb_first[r]), int(lay.tb_first[r + 1])
    start, stop = lay.tb_start[a:b], lay.tb_stop[a:b]
    sizes = (stop - start).tolist()
    heads = [f"  // TB {t}: {m} primitive(s), sub-pipelines {p}.\n{_MARK}{k}{_MARK}\n"
             for k, (t, m, p) in enumerate(zip(lay.tb_id[a:b].tolist(), sizes, lay.tb_pipelines[a:b]))]
    # (start, end, text) of each TB's rows, spliced in below
    bodies = [(x, y, text) for x, y in zip(line_at[start].tolist(), (line_at[stop] - 1).tolist())]
    nprims = sum(sizes)
    prim_rows = "".join(heads) if heads else "  {},\n"
    lo, hi = int(lay.rank_at[r]), int(lay.rank_at[r + 1])
    first = np.searchsorted(lay.ptb[lo:hi], np.arange(lay.ntbs[r] + 1)) + lo
    dep_first = lay.dep_at[first] - lay.dep_at[lo]
    tb_ranges = ", ".join(f"{{{p}, {d}}}" for p, d in zip((first - lo).tolist(), dep_first.tolist()))
    d0, d1 = int(lay.dep_at[lo]), int(lay.dep_at[hi])
    deps_body = f"{_MARK}{len(bodies)}{_MARK}" if d1 > d0 else ""
    if d1 > d0:
        bodies.append((int(lay.dep_off[d0]), int(lay.dep_off[d1]) - 2, lay.dep_text))
    rank_sources = {}
    for rpl in rank_platforms:
        rsrc = f"{name}_r{r}.{EXT[rpl]}"
        written[rsrc] = _splice(rank_tpl.render(
            **common, source=rsrc, rank=r, platform=rpl, ntbs=lay.ntbs[r], nprims=nprims,
            nsend=len(col.send_conns[r]), nrecv=len(col.recv_conns[r]),
            nprogress=int(col.nprogress[r]), kernel=kernel, nthreads=nthreads[rpl],
            ns=f"hccc_{name}_r{r}", nch=lay.nch, nchunks=ir.nchunks, in_base=int(lay.in_base[r]),
            out_base=int(lay.out_base[r]), chunk_bytes=ir.chunk_bytes,
            max_cnt=lay.max_cnt, prim_rows=prim_rows, tb_ranges=tb_ranges, ntb_ranges=len(first),
            deps=deps_body, ndeps=d1 - d0,
            grid_source=f"{name}_grid.{EXT[rpl]}"), bodies)
        sources[rpl].append(rsrc)
        rank_sources[rpl] = rsrc
    return dict(rank=r, platform=pl, tbs=lay.ntbs[r], blocks=lay.nch * lay.ntbs[r], kernel=kernel,
                source=f"{name}_r{r}.{EXT[pl]}", sources=rank_sources,
                send_conns=col.send_conns[r], recv_conns=col.recv_conns[r],
                progress_slots=int(col.nprogress[r]))


def _render_shared(env, ir: ProgramIR, platforms: list, present: list[str], sources: dict,
                   common: dict, rank_entries: list, nthreads: dict, lay: _Layout, written: FileSink):
    """The files every rank's sources share: each platform's umbrella source, the headers, the
    host API and the build files; returns the umbrella and library names per platform."""
    name = ir.name
    umb_tpl = env.get_template("common/umbrella.j2")
    umbrella = {}
    for pl in present:
        fname = f"{name}_{pl}.{EXT[pl]}"
        umbrella[pl] = fname
        written[fname] = umb_tpl.render(**common, source=fname, platform=pl, files=sources[pl],
                                        ranks=[r for r in range(ir.nranks) if pl in platforms[r]])
    hdr_ctx = dict(version=VERSION, nslots=NSLOTS, dtypes=DTYPES, ops=REDOPS)
    written["hccc_platform.h"] = env.get_template("common/hccc_platform.h.j2").render(**hdr_ctx)
    written["hccc_prims.h"] = env.get_template("common/hccc_prims.h.j2").render(**hdr_ctx)
    written["hccc_cpu_emu.h"] = env.get_template("common/hccc_cpu_emu.h.j2").render(**hdr_ctx)
    written[HOST_HEADER] = _host_header(env, ir, rank_entries, nthreads, lay.in_base, lay.out_base)
    libraries = {pl: f"hccc_{name}_{pl}" for pl in present}
    build_ctx = dict(**common, platforms=present, libraries=libraries, sources=sources,
                     headers=list(HEADERS), codegen="specialized", dtypes=DTYPES, ops=REDOPS)
    written["CMakeLists.txt"] = env.get_template("build/CMakeLists.txt.j2").render(**build_ctx)
    written["Makefile"] = env.get_template("build/Makefile.j2").render(**build_ctx)
    return umbrella, libraries


#: marks where a TB's lines go in a rendered rank source (templates and names never hold NUL)
_MARK = "\0"


def _splice(rendered: str, bodies: list[tuple[int, int, memoryview]]) -> list:
    """The file's pieces: ``rendered`` with each ``<_MARK>k<_MARK>`` replaced by the bytes
    ``text[a:b]`` of ``bodies[k] = (a, b, text)`` (views, not copies: the primitive rows are most of
    a large program's output)."""
    parts = rendered.split(_MARK)
    if len(parts) != 2 * len(bodies) + 1:
        raise AssertionError("internal error: a rank template dropped or repeated a spliced body")
    out: list = [parts[0]]
    for i in range(1, len(parts), 2):
        a, b, text = bodies[int(parts[i])]
        out += [text[a:b], parts[i + 1]]
    return out


def grid_entries(env: jinja2.Environment, ir: ProgramIR, platforms: list[tuple[str, ...]], written: dict,
                 common: dict, ntbs: list[int], nthreads: dict) -> dict:
    """The one-grid entry of each platform every rank has a source for: ``NAME_grid.EXT`` into
    ``written``; returns the manifest's ``grid`` field, platform -> {kernel, source, blocks}.

    Its kernels ``hccc_NAME_grid_<dtype>_<op>(hccc_grid_args)`` run every rank of a single-GPU run
    in one launch (``blocks`` = the sum of the ranks' thread blocks): block ``b`` runs thread block
    ``b - first[r]`` of rank ``r`` through that rank's own block function, so the primitive code
    is the rank kernels'; the source is compiled in one unit after the rank sources."""
    name = ir.name
    first = np.r_[0, np.cumsum(np.asarray(ntbs, np.int64))].tolist()
    ranks = [dict(rank=r, ntbs=ntbs[r], kernel=f"hccc_{name}_r{r}") for r in range(ir.nranks)]
    tpl = env.get_template("common/grid.j2")
    out = {}
    for pl in PLATFORMS:
        if not all(pl in pls for pls in platforms):
            continue
        src = f"{name}_grid.{EXT[pl]}"
        kernel = f"hccc_{name}_grid"
        written[src] = tpl.render(**common, source=src, platform=pl, kernel=kernel, ns=kernel,
                                  nthreads=nthreads[pl], total=first[-1], first=first, ntbs=ntbs,
                                  ranks=ranks)
        out[pl] = dict(kernel=kernel, source=src, blocks=int(first[-1]))
    return out


def program_stats(ir: ProgramIR, col: Columns, ntbs: list[int], decode_table: bool = True) -> dict:
    """The manifest's ``stats``: the IR's own, completed with transfer, sub-pipeline, TB and
    primitive counts, and how the kernels decode the primitives (:func:`prim_table.ptable_stats`;
    ``decode_table`` False: the table mode's generic kernels, which load each one)."""
    stats = ir.record()
    if "transfers" not in stats:      # (not setdefault: the count is a sort of every primitive's task)
        stats["transfers"] = int(np.unique(ir.prims["task"][ir.prims["task"] >= 0]).size)
    stats.setdefault("subpipelines", int(ir.npipelines))
    stats.setdefault("tbs_state_based", int(sum(ntbs)))
    stats.setdefault("tbs_connection_based",
                     int(sum(len(a) + len(b) for a, b in zip(col.send_conns, col.recv_conns))))
    stats.setdefault("primitives", int(ir.nprims))
    # a rank's launch: channels x its thread blocks (all resident at once)
    stats["blocks_per_rank_max"] = channel_count(ir) * int(max(ntbs, default=0))
    stats.update(prim_table.ptable_stats(ir, not decode_table))
    return _jsonable(stats)


def _host_header(env, ir: ProgramIR, rank_entries: list[dict], nthreads: dict, in_base, out_base) -> str:
    """``hccc_host.h``: the C++ host API with this program's connection tables and buffer layout
    (the tables are joined here, not in the template: thousands of connections render fast)."""
    def ints(vals) -> str:
        return ", ".join(str(int(v)) for v in vals)

    # the host works with every channel's connections and counters (see replicated_conns)
    nch = channel_count(ir)
    stride = channel_stride(rank_entries)
    conns = {key: [replicated_conns(e[key], nch, stride) for e in rank_entries]
             for key in ("send_conns", "recv_conns")}

    def pairs(key: str) -> str:
        return "".join(f"{{ {int(p)}, {int(c)} }}, " for lst in conns[key] for p, c in lst)

    recv_first, send_first = [0], [0]
    for r in range(len(rank_entries)):
        recv_first.append(recv_first[-1] + len(conns["recv_conns"][r]))
        send_first.append(send_first[-1] + len(conns["send_conns"][r]))
    tables = dict(
        tbs=ints(e["blocks"] for e in rank_entries),
        progress=ints(nch * e["progress_slots"] for e in rank_entries),
        nrecv=ints(len(lst) for lst in conns["recv_conns"]),
        nsend=ints(len(lst) for lst in conns["send_conns"]),
        recv_first=ints(recv_first), send_first=ints(send_first),
        recv_conns=pairs("recv_conns"), send_conns=pairs("send_conns"),
        in_base=ints(in_base), out_base=ints(out_base),
        declarations="\n".join(
            f'  extern "C" HCCC_GLOBAL void HCCC_LAUNCH_BOUNDS({nthreads.get(e["platform"], 0)}) '
            f'{e["kernel"]}_##DT##_##OPN(const HCCC_GRID_CONSTANT hccc_args); \\' for e in rank_entries),
        kernels=", ".join(f'{e["kernel"]}_##DT##_##OPN' for e in rank_entries))
    return env.get_template("common/hccc_host.h.j2").render(
        vtables=_host_vtables(ir, ints), version=VERSION, name=ir.name, collective=ir.collective, nranks=ir.nranks,
        nchunks=ir.nchunks, scratch_chunks=ir.scratch_chunks, chunk_bytes=ir.chunk_bytes,
        in_chunks=ir.in_chunks, out_chunks=ir.out_chunks,
        max_cnt=max(1, int(ir.max_step_chunks)), fifo_budget=FIFO_BUDGET_BYTES,
        algorithm_level=bool(ir.algorithm_level), nprims=int(ir.nprims), nthreads=nthreads, tables=tables)


def _host_vtables(ir: ProgramIR, ints) -> dict:
    """``hccc_host.h``'s AllToAllv tables: pieces per block (0: the program cannot run with
    per-pair counts), whether it uses scratch, and per placement (out of place, in place) every
    rank's ``hccc_args::vmap`` (:func:`hccc.compiler.ir.vblocks.rank_tables`) joined, with where
    each rank's starts, or the reason that placement cannot run as an AllToAllv."""
    from hccc.compiler.frontend.collectives import spec_of
    from hccc.compiler.ir.vblocks import VBlockError, rank_tables, vblock_map
    # other collectives fail vblock_map at once; only an AllToAll needs the canonical copy
    cir = ir if not spec_of(ir.collective).per_pair_counts or _is_canonical(ir) else _sorted_copy(ir)
    out = {"k": 0, "uses_scratch": 0, "placements": []}
    for inplace in (False, True):
        entry = {"name": "ip" if inplace else "oop", "ok": 0, "why": "", "table": "0", "first": "0, 0"}
        if bool(inplace) not in ir.placements:
            entry["why"] = f"{ir.name} is not proven {'in place' if inplace else 'out of place'}"
        else:
            try:
                vm = vblock_map(cir, inplace)
                tabs = rank_tables(cir, vm)
            except VBlockError as exc:
                entry["why"] = str(exc)
            else:
                first = np.r_[0, np.cumsum([len(t) for t in tabs])]
                body = np.concatenate(tabs) if tabs else np.zeros(0, np.int32)
                entry.update(ok=1, table=ints(body) if len(body) else "0", first=ints(first))
                out["k"], out["uses_scratch"] = int(vm.k), int(vm.uses_scratch)
        entry["why"] = " ".join(entry["why"].split()).replace("*/", "* /")
        out["placements"].append(entry)
    return out


def _tb_pipeline_ranges(ir: ProgramIR, slices: dict) -> dict[int, str]:
    """First primitive of each TB (``slices``: ``ir.tb_slices()``) -> its sub-pipelines as
    ``_ranges`` text (:func:`_tb_pipeline_texts`)."""
    starts = np.array(sorted(sl.start for sl in slices.values()), np.int64)
    return dict(zip(starts.tolist(), _tb_pipeline_texts(ir, starts)))


def _tb_pipeline_texts(ir: ProgramIR, starts: np.ndarray) -> list[str]:
    """Each TB's sub-pipelines as ``_ranges`` text, the TBs given by their first primitives
    (``starts``, increasing, the first 0). A TB runs its sub-pipelines in order, so its distinct
    values are where the column changes (one vectorised pass over the table); a TB whose column
    goes down somewhere is sorted on its own."""
    pipe = ir.prims["pipeline"].astype(np.int64)
    n = len(pipe)
    if not n:
        return []
    starts = np.asarray(starts, np.int64)
    new_tb = np.zeros(n, bool)
    new_tb[starts] = True
    change = new_tb.copy()
    change[1:] |= pipe[1:] != pipe[:-1]
    down = np.zeros(n, bool)
    down[1:] = (pipe[1:] < pipe[:-1]) & ~new_tb[1:]
    owner = np.cumsum(new_tb) - 1
    bad = set(owner[down].tolist())
    at = np.flatnonzero(change)
    vals = pipe[at]
    # runs of consecutive values (as _ranges writes them), each within one TB
    run = new_tb[at].copy()
    run[1:] |= vals[1:] != vals[:-1] + 1
    first = np.flatnonzero(run)
    last = np.r_[first[1:], len(at)] - 1
    texts = [str(a) if a == b else f"{a}-{b}" for a, b in zip(vals[first].tolist(), vals[last].tolist())]
    cut = np.searchsorted(first, np.searchsorted(at, np.r_[starts, n])).tolist()
    ends = np.r_[starts[1:], n].tolist()
    out = []
    for k, s0 in enumerate(starts.tolist()):
        if k in bad:
            out.append(_ranges(np.unique(pipe[s0:ends[k]]).tolist()))
        else:
            out.append(", ".join(texts[cut[k]:cut[k + 1]]))
    return out


def _ranges(vals: list[int]) -> str:
    """[0,1,2,5] -> '0-2, 5'."""
    if not vals:
        return "none"
    out = []
    start = prev = vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


def _is_canonical(ir: ProgramIR) -> bool:
    p = ir.prims
    if ir.nprims < 2:
        return True
    r, t, s = p["rank"], p["tb"], p["seq"]
    later = (r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & ((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) &
                                                                        (s[1:] > s[:-1]))))
    return bool(later.all())


def _sorted_copy(ir: ProgramIR) -> ProgramIR:
    import copy
    c = copy.copy(ir)
    c.prims = dict(ir.prims)
    c.sort_canonical()
    return c
