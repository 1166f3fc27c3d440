"""ProgramIR -> MSCCL XML (the dialect the MSCCL executor and RCCL load). See :mod:`msccl_xml`.

The export works on a table of primitives (:mod:`hccc.compiler.interop.msccl_prims`, numpy
columns and a wait-edge list) and the MSCCL thread blocks laid over it
(:mod:`hccc.compiler.interop.msccl_tbs`). The passes, in order (each keeps the program's meaning;
the module docstring of :mod:`hccc.compiler.interop.msccl_xml` explains why):

1. drop NOP primitives, moving their waits to their successors and dependents;
2. AllGather: sends that read the rank's input chunk read the output copy of it instead (after the
   local copy), so a chunk keeps one buffer position along its whole path;
3. with ``fuse``: a receive and the send forwarding what it stored become one step
   (:mod:`hccc.compiler.interop.msccl_fuse`);
4. un-fuse forwarding primitives whose receive and send ends cannot share one MSCCL TB;
5. split hccc thread blocks into MSCCL thread blocks (one send peer, one recv peer, one channel),
   merging the pieces of one hccc TB back while they fit (retried without merging if a merged TB
   breaks a limit), and restore the original order with waits where a TB was split;
6. spread connections over channels when a channel has too many peer TBs on one rank;
7. drop waits already implied by others, number the steps (extra waits become ``nop`` steps),
   make the instances, check the runtime limits and write the text.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.collectives import SPECS, one_of, spec_of
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.msccl_format import MESSAGES_IN_FLIGHT, XmlLimits
from hccc.compiler.interop.msccl_prims import (Prims, allgather_sources, export_error, from_ir,
                                               unfuse)
from hccc.compiler.interop.msccl_tbs import Layout, OrderCycle, Segments, lay_out, segments, split_connections
from hccc.compiler.interop.msccl_text import xml_text
from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure
from hccc.compiler.ir.program_ir import Buf, IRFormatError, ProgramIR
from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered


def _quick_step_check(ir: ProgramIR, lim: XmlLimits, instances: int = 1) -> None:
    """Refuse at once (numpy, before the per-primitive export) a program whose MSCCL thread blocks
    must exceed ``lim.max_steps`` however its connections are cut: every primitive that sends to
    peer ``p`` on channel ``c`` (or receives from it) lands in a thread block that owns that
    connection end, one step or more each; a connection of ``n`` messages cut into runs of at most
    ``max_steps`` (:func:`~hccc.compiler.interop.msccl_tbs.split_connections`) needs that many
    channels of its own per instance, so more than ``max_channels`` of them cannot fit."""
    P = ir.prims
    worst = None
    for peer, what in (("send_peer", "sends to"), ("recv_peer", "receives from")):
        m = P[peer] >= 0
        if not m.any():
            continue
        key = (P["rank"][m].astype(np.int64) * (ir.nranks + 1) + P[peer][m]) * (1 << 16) + P["channel"][m]
        keys, counts = np.unique(key, return_counts=True)
        i = int(np.argmax(counts))
        if worst is None or counts[i] > worst[0]:
            k = int(keys[i])
            rank, rest = divmod(k >> 16, ir.nranks + 1)
            worst = (int(counts[i]), rank, what, rest, k & 0xFFFF)
    if worst is None:
        return
    n, rank, what, peer, ch = worst
    runs = -(-n // lim.max_steps) * max(1, instances)
    if runs > lim.max_channels:
        raise export_error([f"the algorithm does not fit the MSCCL runtime: rank {rank} {what} rank {peer} on "
                            f"channel {ch} in {n} primitives, which at most {lim.max_steps} steps per thread "
                            f"block cut into {runs} thread blocks (with {max(1, instances)} instance(s)) on as "
                            f"many channels, but the target runtime has {lim.max_channels} channels "
                            "(--xml-max-channels); the older msccl executor allows 256 steps "
                            "(--xml-max-steps 256 or --xml-legacy)"])


def export_algorithm(alg, limits: XmlLimits | None = None, *, fuse: bool = False, instances: int = 1,
                     chunk_bytes: int = 1 << 20, name: str | None = None, dag=None) -> tuple[ProgramIR, str]:
    """An Algorithm as MSCCL XML, built for the way the runtimes execute it: (program, text).
    ``dag``: the algorithm's DAG when the caller has built it already (a compile's).

    The runtimes run every thread block's whole step list once per slice (algorithm-level
    execution), so the export starts from the program that execution runs best
    (:func:`hccc.compiler.passes.build.build_algorithm_level`: the algorithm's steps in order, one
    thread block per connection end) rather than from hccc's task-level kernels, whose thread
    blocks serve several connections one after another and would serialise them slice by slice.
    The runtime limits are checked on the transfer table first
    (:func:`~hccc.compiler.interop.msccl_limits.check_algorithm_fits`), so a program that cannot fit
    is refused before anything is built."""
    from hccc.compiler.interop.msccl_limits import check_algorithm_fits
    from hccc.compiler.passes.build import build_algorithm_level
    lim = limits or XmlLimits()
    _check_collective(alg.header.collective.value)
    check_algorithm_fits(alg, lim, instances=instances, fuse=fuse)
    if instances < 1:
        raise ValueError("instances must be at least 1")
    # built and checked (structure, FIFO order, deadlock freedom) by build_algorithm_level
    ir = build_algorithm_level(alg, chunk_bytes=chunk_bytes, name=name, dag=dag)
    return ir, _export_program(ir, lim, fuse, instances, True)


def export_xml(ir: ProgramIR, limits: XmlLimits | None = None, *, fuse: bool = False, instances: int = 1,
               prove: bool = True) -> str:
    """The MSCCL XML text of ``ir``; raises :class:`CompileError` when it exceeds ``limits``.

    ``fuse``: receives and the sends forwarding what they stored become one ``rcs``/``rrcs``/``rrs``
    step where their connection ends can share a TB (:func:`~hccc.compiler.interop.msccl_fuse.fuse_forwarding`). ``instances``: ``k``
    copies of the program on their own TBs and channels, each moving ``1/k`` of every chunk
    (:func:`~hccc.compiler.interop.msccl_tbs.instantiate`). Fused output, and instances of programs with multi-chunk steps, are
    re-read with the importer, which proves the collective and checks deadlock freedom under the
    runtimes' execution (``prove``); a fused export that fails is written unfused, an instanced one
    is refused. Instances are a renaming of the one-instance export's chunks wherever every step's
    chunk range stays inside one segment of the collective (:func:`~hccc.compiler.interop.msccl_tbs.segments`,
    always with one-chunk steps) and are then not re-read.
    """
    lim = limits or XmlLimits()
    if instances < 1:
        raise ValueError("instances must be at least 1")
    _quick_step_check(ir, lim, instances)
    _check_exportable(ir, lim)
    return _export_program(ir, lim, fuse, instances, prove)


def _check_exportable(ir: ProgramIR, lim: XmlLimits) -> None:
    """A given program is valid (deadlock-free the way it is meant to run) and of a collective
    MSCCL XML can express."""
    try:
        check_structure(ir)
        check_fifo_order(ir)
        if ir.algorithm_level:
            # an MSCCL-style program (imported XML): deadlock-free the way the runtimes run it
            check_deadlock_buffered(ir, MESSAGES_IN_FLIGHT[lim.proto])
        else:
            check_deadlock(ir)
    except (IRFormatError, ProofError) as exc:
        raise export_error([f"cannot export an invalid program: {exc}"]) from None
    _check_collective(ir.collective)


def _check_collective(name: str) -> None:
    """Refuse a collective MSCCL XML cannot express, saying why (its spec's ``msccl_refusal``)."""
    spec = spec_of(name)
    if spec.msccl_refusal:
        ok = one_of([s.title for s in SPECS.values() if s.msccl], "and")
        raise export_error([f"cannot export collective '{name}': {spec.msccl_refusal} "
                            f"(hccc exports {ok} as MSCCL XML)"])


def _export_program(ir: ProgramIR, lim: XmlLimits, fuse: bool, instances: int, prove: bool) -> str:
    """The text of a valid program: fused first when asked (written plain when that fails), then
    instances re-read where they are not a renaming (:func:`export_xml`)."""
    plain = allgather_sources(ir, from_ir(ir))
    if fuse:
        from hccc.compiler.interop.msccl_fuse import fuse_forwarding
        fused = fuse_forwarding(plain)
        if fused is not None:
            try:
                text, _ = _export(ir, fused, lim, instances)
                if not prove:
                    return text
                from hccc.compiler.interop.msccl_import import import_xml_text
                import_xml_text(text, f"{ir.name}.xml")
                return text
            except OrderCycle:
                pass          # fusing ordered two thread blocks against a path between them
            except CompileError:
                pass          # a limit, or the importer's proof: written unfused
    text, cut = _export(ir, plain, lim, instances)
    renamed = instances == 1 or _segments(ir, unfuse(plain)) is not None
    if not prove or (renamed and not cut):
        return text
    from hccc.compiler.interop.msccl_import import import_xml_text
    try:
        import_xml_text(text, f"{ir.name}.xml")
    except CompileError as exc:
        what = f"{instances} instances of this program" if not renamed else \
            "this program with its long thread blocks cut over channels"
        raise export_error([f"cannot export {what}: "
                            + "; ".join(d.message for d in exc.diagnostics[:2])]) from None
    return text


def _segments(ir: ProgramIR, rows: Prims) -> Segments | None:
    """How ``k`` instances rename the chunks of these rows (:func:`~hccc.compiler.interop.msccl_tbs.segments`):
    the collective's own segment is an AllToAll's block, else the smaller of its input and output
    (an AllGather's input, a ReduceScatter's output, an AllReduce's whole buffer)."""
    unit = spec_of(ir.collective).segment_chunks(ir.nranks, ir.in_chunks, ir.out_chunks)
    return segments(rows, max(1, int(unit)), ir.scratch_chunks)


#: fractions of the step limit tried, in order, as the most messages of one connection per thread
#: block when long connections are cut over channels: a run of that many messages shares its
#: thread block with the local steps next to it and the nops of its waits, so a full run may
#: not fit and a shorter one is tried
SPLIT_FRACTIONS = (1.0, 0.75, 0.5, 0.25)


def _export(ir: ProgramIR, rows: Prims, lim: XmlLimits, k: int) -> tuple[str, bool]:
    """Thread blocks, waits, instances, limits and text for prepared rows: (text, whether long
    connections were cut over channels, :func:`~hccc.compiler.interop.msccl_tbs.split_connections`)."""
    base = unfuse(rows)
    first = None
    for frac in (None, *SPLIT_FRACTIONS):
        if frac is None:
            cut = base
        else:
            cut = split_connections(base, max(1, int(lim.max_steps * frac)))
            if cut is None:
                break
            if cut is base:
                continue       # no connection that long: the steps are local ones and nops
        try:
            return _laid_out(ir, cut, lim, k), frac is not None
        except CompileError as exc:
            first = first or exc
            if not _too_long(exc):
                break          # another limit: cutting connections would not help
    raise first


def _too_long(exc: CompileError) -> bool:
    """Whether a limit check failed (also) for a thread block's steps (:func:`_check_limits`)."""
    return bool(getattr(exc, "too_long", False))


def _laid_out(ir: ProgramIR, base: Prims, lim: XmlLimits, k: int) -> str:
    segs = _segments(ir, base) if k > 1 else None
    # first try merging the pieces of each hccc thread block (fewer TBs); if that breaks a limit
    # (long TBs), fall back to one MSCCL TB per group of connection ends
    for merge in (lim.max_steps, 0):
        full = lay_out(base, lim, merge, k, segs)
        try:
            _check_limits(ir, full, lim)
            break
        except CompileError:
            if merge == 0:
                raise
    return xml_text(ir, full, lim, k)


# ---------------------------------------------------------------------------------------------
def _describe_tb(lay: Layout, t: int) -> str:
    parts = []
    if lay.tb_send[t] >= 0:
        parts.append(f"sends to rank {lay.tb_send[t]}")
    if lay.tb_recv[t] >= 0:
        parts.append(f"receives from rank {lay.tb_recv[t]}")
    return (f"rank {lay.tb_rank[t]} thread block {lay.tb_id[t]} ({' and '.join(parts) or 'local copies'}, "
            f"channel {lay.tb_ch[t]})")


def _check_limits(ir: ProgramIR, lay: Layout, lim: XmlLimits) -> None:
    """Every runtime limit on the laid-out (instantiated) export; raises naming each broken one."""
    msgs, too_long = _step_limits(lay, lim)
    msgs += _table_limits(ir, lay, lim)
    if msgs:
        err = export_error(["the algorithm does not fit the MSCCL runtime: " + m for m in msgs])
        err.too_long = too_long          # a thread block's steps are among the limits broken
        raise err


def _step_limits(lay: Layout, lim: XmlLimits) -> tuple[list[str], bool]:
    """The limits on steps: per thread block, chunks per step, chunk offsets, dependency targets;
    (messages, whether a thread block has too many steps)."""
    msgs: list[str] = []
    rows = lay.rows
    nt = lay.ntbs
    members = np.bincount(lay.tb, minlength=nt)
    too_long = bool(nt and lay.tb_nsteps.max() > lim.max_steps)
    if too_long:
        w = int(np.argmax(lay.tb_nsteps))
        nops = int(lay.tb_nsteps[w] - members[w])
        n_over = int((lay.tb_nsteps > lim.max_steps).sum())
        msgs.append(f"{_describe_tb(lay, w)} needs {lay.tb_nsteps[w]} steps"
                    + (f" ({nops} of them nops carrying extra dependencies)" if nops else "")
                    + f", but the target runtime runs at most {lim.max_steps} per thread block"
                    + (f" ({n_over - 1} more thread block(s) are too long)" if n_over > 1 else "")
                    + "; the older msccl executor allows 256 (--xml-max-steps 256 or --xml-legacy)")
    mtb = lay.mtb
    if len(rows) and rows.cnt.max() > lim.max_count:
        b = int(np.argmax(rows.cnt))
        msgs.append(f"rank {rows.rank[b]} thread block {mtb[b]} step {lay.s[b]} moves {rows.cnt[b]} "
                    f"chunks at once, but the target runtime allows at most {lim.max_count} "
                    f"(--xml-max-count)")
    # chunk offsets, in row order, a row's source before its destination
    far = np.stack([np.where(rows.sbuf != int(Buf.NONE), rows.soff + rows.cnt - 1, -1),
                    np.where(rows.dbuf != int(Buf.NONE), rows.doff + rows.cnt - 1, -1)], axis=1).ravel()
    if len(far) and far.max() > lim.max_offset:
        j = int(np.argmax(far))
        x = j // 2
        msgs.append(f"rank {rows.rank[x]} thread block {mtb[x]} step {lay.s[x]} uses chunk offset {far[j]}, but "
                    f"the target runtime stores offsets up to {lim.max_offset}")
    late = np.flatnonzero(mtb[rows.wait_b] > lim.max_dep_tb)
    if len(late):
        a, b = rows.wait_a[late], rows.wait_b[late]
        first = late[np.lexsort((mtb[b], lay.idx[a], lay.tb[a]))[0]]
        t = int(lay.tb[rows.wait_a[first]])
        msgs.append(f"{_describe_tb(lay, t)} waits for thread block {mtb[rows.wait_b[first]]} of its rank, but "
                    f"dependency targets must have ids <= {lim.max_dep_tb} in the target runtime")
    return msgs, too_long


def _table_limits(ir: ProgramIR, lay: Layout, lim: XmlLimits) -> list[str]:
    """The limits on the thread-block table: channels, thread blocks per rank and per channel,
    XML elements."""
    msgs: list[str] = []
    nch = int(lay.tb_ch.max(initial=0)) + 1
    if nch > lim.max_channels:
        msgs.append(f"the program uses {nch} channels, but the target runtime has {lim.max_channels} "
                    f"(--xml-max-channels)")
    nr = int(lay.tb_rank.max(initial=-1)) + 1
    per_rank = np.bincount(lay.tb_rank, minlength=nr)
    ranks = np.flatnonzero(per_rank)               # ranks with thread blocks, in order
    over = ranks[per_rank[ranks] > lim.max_tbs]
    if len(over):
        msgs.append(f"rank {over[0]} needs {per_rank[over[0]]} thread blocks, more than the runtime's {lim.max_tbs}")
    msgs += _per_channel_limit(lay, lim, nch)
    steps = np.bincount(lay.tb_rank, weights=lay.tb_nsteps, minlength=nr).astype(np.int64)
    nodes = 1 + ir.nranks + per_rank + steps
    for rank in ranks.tolist():
        if nodes[rank] > lim.max_xml_nodes:
            msgs.append(f"rank {rank} needs {nodes[rank]} XML elements (algo + gpus + thread blocks + steps), but "
                        f"the runtime's XML loader holds at most {lim.max_xml_nodes}")
            break
        if per_rank[rank] > lim.max_children or ir.nranks > lim.max_children:
            msgs.append(f"rank {rank}: more than {lim.max_children} child elements in one XML element")
            break
    return msgs


def _per_channel_limit(lay: Layout, lim: XmlLimits, nch_all: int) -> list[str]:
    """The first (rank, channel) with more receiving or sending thread blocks than allowed."""
    worst = None
    for kind, peer, code in (("receiving", lay.tb_recv, 0), ("sending", lay.tb_send, 1)):
        m = peer >= 0
        if not m.any():
            continue
        keys, counts = np.unique((lay.tb_rank[m] * nch_all + lay.tb_ch[m]) * 2 + code, return_counts=True)
        bad = keys[counts > lim.max_tbs_per_channel]
        if len(bad) and (worst is None or bad[0] < worst[0]):
            worst = (int(bad[0]), int(counts[counts > lim.max_tbs_per_channel][0]), kind)
    if worst is None:
        return []
    key, c, kind = worst
    rank, ch = divmod(key // 2, nch_all)
    return [f"rank {rank} has {c} thread blocks {kind} on channel {ch}, but the runtime "
            f"allows {lim.max_tbs_per_channel} per channel, and spreading connections over "
            f"{lim.max_channels} channels does not make room (--xml-max-tbs-per-channel, "
            f"--xml-max-channels)"]


def export_summary(text: str) -> dict:
    """Counts of an exported text (thread blocks, steps, nops) for progress messages."""
    return {"tbs": text.count("<tb "), "steps": text.count("<step "), "nops": text.count('type="nop"')}


__all__ = ["export_xml", "export_algorithm", "export_summary"]
