"""MSCCL XML -> ProgramIR, with located diagnostics and a symbolic proof. See :mod:`msccl_xml`.

Three steps: the text as located elements (:mod:`~hccc.compiler.interop.msccl_elements`), those
checked by the runtime's rules into thread blocks and steps
(:mod:`~hccc.compiler.interop.msccl_read`), and here their lowering to a ProgramIR (in-place-only
algorithms normalised, rows sorted by rank, thread block and step, waits as dependencies) and the
proofs that it runs and implements its collective (:func:`_prove`), each error located at the
element of the step it names.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hccc.compiler.passes.build import sanitize_identifier
from hccc.util.diagnostics import CompileError, Diagnostic, SourceFile
from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_structure
from hccc.compiler.ir.extents import ExtentError, check_extents
from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered, prove
from hccc.compiler.frontend.collectives import SPECS
from hccc.compiler.interop.msccl_elements import INT_RE, Element, ElementReader, parse_elements
from hccc.compiler.interop.msccl_format import MESSAGES_IN_FLIGHT, BUF_OF_LETTER, OP_OF_TYPE
from hccc.compiler.interop.msccl_read import USES, ReadAlgorithm, Step, Tb, read_algorithm
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Allocation, Buf, IRFormatError, Op, Origin, ProgramIR

#: the ProgramIR columns a row of :class:`_Rows` fills, in its order
_ROW_COLUMNS = ("rank", "tb", "seq", "op", "send_peer", "recv_peer", "channel", "src_buf", "src_off", "dst_buf",
                "dst_off", "count")
#: sequence number that sorts the in-place epilogue copy after every step of its thread block
_LAST_SEQ = 1 << 30


@dataclass
class _Rows:
    """The ProgramIR rows made so far (in making order) and what each came from."""

    rows: list = field(default_factory=list)    # (rank, tb, seq, op, sp, rp, ch, sbuf, soff, dbuf, doff, cnt)
    where: list = field(default_factory=list)   # (element, description)
    index: dict = field(default_factory=dict)   # id(Step) -> row
    deps: list = field(default_factory=list)    # (row, Step it waits for)
    first: dict = field(default_factory=dict)   # gpu -> its in-place prologue row
    last: dict = field(default_factory=dict)    # gpu -> its in-place epilogue row


def _import(src: SourceFile, data: bytes) -> ProgramIR:
    rd = ElementReader(src, data)
    alg = read_algorithm(rd, parse_elements(src, data))
    ir, where = _lower(alg)
    _prove(rd, alg, ir, where)
    return ir


# -- lowering ---------------------------------------------------------------------------------------
def _normalised(alg: ReadAlgorithm) -> bool:
    """Whether the algorithm is in-place only, so the ProgramIR is made to run out of place too."""
    return bool(alg.header.inplace) and not alg.header.outofplace


def _lower(alg: ReadAlgorithm) -> tuple[ProgramIR, list]:
    """The ProgramIR of a checked algorithm, and per primitive its (element, description)."""
    hdr = alg.header
    normalise = _normalised(alg)
    ntbs = _number_tbs(alg)
    alias = SPECS[hdr.coll].alias
    made = _Rows()
    if normalise and alias != "output in input":
        _prologue(made, alg, ntbs, alias)
    _step_rows(made, alg, normalise, alias)
    if normalise and alias == "output in input":
        _epilogue(made, alg, ntbs)
    cols, order, inv = _columns(made.rows)
    dp, do = _dependencies(made, cols, inv)
    where = [made.where[i] for i in order.tolist()]
    return _program(alg, cols, dp, do, ntbs, made.rows), where


def _number_tbs(alg: ReadAlgorithm) -> np.ndarray:
    """Number each GPU's thread blocks that have steps (``Tb.new_id``); their count per GPU."""
    ntbs = np.zeros(alg.header.nranks, np.int32)
    for gid in range(alg.header.nranks):
        nt = 0
        for t in alg.tbs[gid]:
            if not t.real:
                continue
            t.new_id = nt
            nt += 1
        ntbs[gid] = nt
    return ntbs


def _prologue(made: _Rows, alg: ReadAlgorithm, ntbs: np.ndarray, alias: str) -> None:
    """The data the in-place program expects in the output, put there by a copy first."""
    k, C = alg.header.k, alg.header.nchunks
    for gid in range(alg.header.nranks):
        if ntbs[gid] == 0:
            ntbs[gid] = 1
        src_off, dst_off, cnt = (0, gid * k, k) if alias == "input in output" else (0, 0, C)
        made.first[gid] = len(made.rows)
        made.rows.append((gid, 0, -1, Op.COPY, -1, -1, 0, Buf.INPUT, src_off, Buf.OUTPUT, dst_off, cnt))
        made.where.append((_gpu_el(alg.algo, gid), f"gpu {gid} in-place prologue (input copied into the output)"))


def _epilogue(made: _Rows, alg: ReadAlgorithm, ntbs: np.ndarray) -> None:
    """The in-place result copied to the output last."""
    k = alg.header.k
    for gid in range(alg.header.nranks):
        if ntbs[gid] == 0:
            ntbs[gid] = 1
        made.last[gid] = len(made.rows)
        made.rows.append((gid, 0, _LAST_SEQ, Op.COPY, -1, -1, 0, Buf.INPUT, gid * k, Buf.OUTPUT, 0, k))
        made.where.append((_gpu_el(alg.algo, gid), f"gpu {gid} in-place epilogue (result copied to the output)"))


def _remapper(alg: ReadAlgorithm, normalise: bool, alias: str):
    """(gpu, buffer, offset) -> the ProgramIR operand: the aliased buffer's references redirected
    where the algorithm is normalised."""
    k = alg.header.k

    def remap(gid, b, off):
        if not normalise:
            return b, off
        if alias == "same" and b == Buf.INPUT:
            return Buf.OUTPUT, off
        if alias == "input in output" and b == Buf.INPUT:
            return Buf.OUTPUT, gid * k + off
        if alias == "output in input" and b == Buf.OUTPUT:
            return Buf.INPUT, gid * k + off
        return b, off
    return remap


def _step_rows(made: _Rows, alg: ReadAlgorithm, normalise: bool, alias: str) -> None:
    """A row for every non-nop step, GPU by GPU, thread block by thread block."""
    remap = _remapper(alg, normalise, alias)
    for gid in range(alg.header.nranks):
        for t in alg.tbs[gid]:
            for st in t.real:
                op = OP_OF_TYPE[st.type]
                use_src, use_dst = USES[st.type]
                sb, so = remap(gid, BUF_OF_LETTER[st.srcbuf], st.srcoff) if use_src else (Buf.NONE, 0)
                db, do = remap(gid, BUF_OF_LETTER[st.dstbuf], st.dstoff) if use_dst else (Buf.NONE, 0)
                made.index[id(st)] = len(made.rows)
                made.rows.append((gid, t.new_id, st.real, op, t.send if op.sends else -1,
                                  t.recv if op.receives else -1, t.chan, sb, so, db, do, st.cnt))
                made.where.append((st.el, f"gpu {gid} thread block {t.id} step {st.s} ({_describe_op(st, t)})"))
                for w in st.waits:
                    made.deps.append((made.index[id(st)], w))


def _columns(rows: list) -> tuple[dict, np.ndarray, np.ndarray]:
    """The rows as ProgramIR columns sorted by (rank, thread block, sequence number), with
    sequence numbers made contiguous; (columns, sorted order, each row's sorted place)."""
    arr = np.array([r[:3] for r in rows], np.int64).reshape(-1, 3)
    order = np.lexsort((arr[:, 2], arr[:, 1], arr[:, 0])) if len(rows) else np.zeros(0, np.int64)
    inv = np.empty(len(rows), np.int64)
    inv[order] = np.arange(len(rows))
    cols = {c: np.zeros(len(rows), dt) for c, dt in PRIM_COLUMNS.items()}
    for j, r in enumerate(rows):
        for c, v in zip(_ROW_COLUMNS, r):
            cols[c][inv[j]] = int(v)
    cols["task"][:] = -1
    cols["task2"][:] = -1
    # sequence numbers: contiguous per (rank, tb) after the extra copies
    rk, tbc = cols["rank"].astype(np.int64), cols["tb"].astype(np.int64)
    if len(rows):
        new = np.r_[True, (rk[1:] != rk[:-1]) | (tbc[1:] != tbc[:-1])]
        start = np.maximum.accumulate(np.where(new, np.arange(len(rows)), 0))
        cols["seq"] = (np.arange(len(rows)) - start).astype(np.int32)
    return cols, order, inv


def _dependencies(made: _Rows, cols: dict, inv: np.ndarray) -> tuple[list, list]:
    """Dependency edges (waiting primitive, waited-for one) in sorted places: the steps' waits,
    then the prologue copy before every thread block's first step and the epilogue after every
    last one."""
    dp = [inv[i] for i, w in made.deps]
    do = [inv[made.index[id(w)]] for i, w in made.deps]
    firsts = {}
    lasts = {}
    for j in range(len(made.rows)):
        key = (int(cols["rank"][j]), int(cols["tb"][j]))
        firsts.setdefault(key, j)
        lasts[key] = j
    for gid, i in made.first.items():
        for (r, t), j in firsts.items():
            if r == gid and t != 0:
                dp.append(j)
                do.append(inv[i])
    for gid, i in made.last.items():
        for (r, t), j in lasts.items():
            if r == gid and t != 0:
                dp.append(inv[i])
                do.append(j)
    return dp, do


def _program(alg: ReadAlgorithm, cols: dict, dp: list, do: list, ntbs: np.ndarray, rows: list) -> ProgramIR:
    hdr, a = alg.header, alg.algo
    N = hdr.nranks
    normalise = _normalised(alg)
    inplace, outofplace = bool(hdr.inplace), bool(hdr.outofplace)
    nsend = sum(1 for r in rows if r[3].sends)
    ir = ProgramIR(name=sanitize_identifier(a.attrs["name"]), collective=hdr.coll, nranks=N, nchunks=hdr.nchunks,
                   in_chunks=hdr.in_n, out_chunks=hdr.out_n, scratch_chunks=hdr.scratch_n, prims=cols,
                   dep_prim=np.asarray(dp, np.int64), dep_on=np.asarray(do, np.int64),
                   npipelines=1, ntbs=ntbs,
                   stats={"msccl_name": a.attrs["name"][:256], "nchannels": hdr.nchannels,
                          "inplace_normalised": bool(normalise), "transfers": nsend},
                   origin=Origin(source="msccl-xml", proto=hdr.proto, min_bytes=hdr.min_bytes,
                                 max_bytes=hdr.max_bytes, inplace=bool(inplace or normalise),
                                 outofplace=bool(outofplace or normalise),
                                 gpus_per_node=N // hdr.nnodes if hdr.nnodes else None),
                   allocation=Allocation(tbs_per_rank_max=int(ntbs.max()) if N else 0,
                                         tbs_connection_based=int(ntbs.sum()), tbs_state_based=int(ntbs.sum())))
    return ir


# -- proofs -----------------------------------------------------------------------------------------
def _prove(rd: ElementReader, alg: ReadAlgorithm, ir: ProgramIR, where: list) -> None:
    """The program is well-formed, deadlock-free as the runtimes run it, implements its collective
    in every mode it declares and touches exactly its chunks; records ``origin.execution``."""
    a, hdr = alg.algo, alg.header

    def describe(i: int) -> str:
        return where[i][1]

    def located(exc: ProofError, msg: str) -> CompileError:
        el = where[exc.prims[0]][0] if exc.prims else a
        return CompileError([Diagnostic(msg, rd.loc(el))])

    try:
        check_structure(ir)
    except IRFormatError as exc:
        raise rd.err(a, f"the program is not well-formed: {exc}") from None
    # MSCCL's execution: each thread block runs its steps once per slice; a connection's FIFO has
    # NCCL_STEPS = 8 slots, a Simple message takes MSCCL_CHUNKSTEPS = 4 of them, an LL/LL128
    # message one. hccc's own kernels (task-level) need the stricter check; remember which holds.
    try:
        check_deadlock_buffered(ir, MESSAGES_IN_FLIGHT[hdr.proto], describe)
    except ProofError as exc:
        raise located(exc, str(exc)) from None
    try:
        check_deadlock(ir)
        ir.origin = replace(ir.origin, execution="task")
    except DeadlockError:
        ir.origin = replace(ir.origin, execution="algorithm")
    modes = []
    if hdr.outofplace or _normalised(alg):
        modes.append(False)
    if hdr.inplace:
        modes.append(True)
    for mode in modes:
        try:
            prove(ir, mode, describe)
        except ProofError as exc:
            raise located(exc, f"the program does not implement {hdr.coll}: {exc}") from None
    # every step touches exactly the elements of the chunks it names, at every element count
    try:
        check_extents(ir, describe)
    except ExtentError as exc:
        raise located(exc, str(exc)) from None


def _gpu_el(a: Element, gid: int) -> Element:
    for g in a.children:
        if g.attrs.get("id") is not None and INT_RE.fullmatch(g.attrs["id"]) and int(g.attrs["id"]) == gid:
            return g
    return a


def _describe_op(st: Step, t: Tb) -> str:
    op = OP_OF_TYPE[st.type]
    parts = [st.type]
    if op.receives:
        parts.append(f"from gpu {t.recv}")
    if op.sends:
        parts.append(f"to gpu {t.send}")
    return " ".join(parts)


def import_xml_text(text: str, name: str = "<input>") -> ProgramIR:
    """Parse and prove MSCCL XML text (see :func:`import_xml`)."""
    src = SourceFile(name, text)
    data = text.encode("utf-8")
    return _import(src, data)


def import_xml(path: str | Path) -> ProgramIR:
    """Read an MSCCL XML algorithm as a ProgramIR, proven to implement its collective.

    Raises :class:`CompileError` with ``FILE:LINE:COL`` diagnostics for malformed XML, unknown
    attribute values, out-of-range ids, send/receive mismatches, deadlocks, races and programs that
    do not implement their collective.
    """
    src = SourceFile.read(path)
    data = src.text.encode("utf-8")
    return _import(src, data)


__all__ = ["import_xml", "import_xml_text"]
