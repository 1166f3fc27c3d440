"""MSCCL XML elements as one algorithm's checked thread blocks and steps (:func:`read_algorithm`).

The checks are the runtime's rules (the MSCCL executor / RCCL): a thread block runs its steps in
order, for every slice of the buffer; the k-th send on connection (sender, receiver, channel) is
the k-th receive there; a step with ``depid``/``deps`` waits until thread block ``depid`` has
*signalled* a step >= ``deps`` -- only steps with ``hasdep="1"`` signal, so the wait really ends at
the first such step at or after ``deps``; ``nop`` steps only carry extra dependencies for the next
step. In order: the ``<algo>`` header, the GPUs and their buffers (bounded before any work), each
GPU's thread blocks, their steps, the waits resolved to signalling steps, and the connections'
sends paired with their receives. Every error is located at its element or attribute.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hccc.compiler.frontend.collectives import OWN, SPECS
from hccc.compiler.interop.msccl_elements import Element, ElementReader
from hccc.compiler.interop.msccl_format import (BUF_OF_LETTER, COLLECTIVE_ALIASES, COLLECTIVE_OF_COLL, OP_OF_TYPE,
                                                OTHER_COLLECTIVES, PROTOCOLS, SUPPORTED_COLLECTIVES)
from hccc.util.diagnostics import did_you_mean

MAX_GPUS = 4096
MAX_CHUNKS = 1 << 20
MAX_CHANNELS = 1024
#: most chunk slots (GPUs x the chunks of each GPU's input, output and scratch buffers) an import
#: may declare: the checks and runs keep state per slot (about 200 bytes each at most)
MAX_RANK_CHUNKS = 1 << 21
#: most chunks the steps of an import may move in all (the sum of every step's cnt)
MAX_CHUNK_MOVES = 1 << 20

#: which operands a step type uses locally (the runtime's kernel reads/writes exactly these)
USES = {
    "s": (True, False), "r": (False, True), "rcs": (False, True), "rrs": (True, False),
    "rrc": (True, True), "rrcs": (True, True), "cpy": (True, True), "re": (True, True), "nop": (False, False),
}
_ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")
_GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
_TB_ATTRS = ("id", "send", "recv", "chan")
_STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
_BUF_NAME = {"i": "input", "o": "output", "s": "scratch"}
#: most consecutive ``re`` steps the runtimes fuse into one transmission
_FUSED_REDUCTIONS = 16


@dataclass
class Step:
    gpu: int
    tb: int            # XML thread-block id
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int
    el: Element
    real: int = -1     # index among the thread block's non-nop steps
    waits: list = field(default_factory=list)   # [(depid, deps, element), ...] incl. preceding nops


@dataclass
class Tb:
    gpu: int
    id: int
    send: int
    recv: int
    chan: int
    el: Element
    steps: list = field(default_factory=list)   # all steps, nops included
    real: list = field(default_factory=list)    # non-nop steps
    new_id: int = -1


@dataclass
class Header:
    """The ``<algo>`` element's values, and the sizes of the collective's buffers."""

    proto: str
    coll: str              # ProgramIR collective
    nranks: int
    nchannels: int
    nchunks: int
    k: int                 # chunks per rank: nchunks / nranks
    inplace: int
    outofplace: int
    nnodes: int            # 0: not given
    min_bytes: int
    max_bytes: int
    in_n: int              # ProgramIR buffers (the collective's, not the declared ones)
    out_n: int
    scratch_n: int = 0     # the largest declared scratch buffer

    @property
    def bufsize(self) -> dict:
        return {"i": self.in_n, "o": self.out_n, "s": self.scratch_n}


@dataclass
class ReadAlgorithm:
    """A checked algorithm: its ``<algo>`` element, header, and every GPU's thread blocks by id."""

    algo: Element
    header: Header
    tbs: dict             # gpu -> [Tb], by id


def read_algorithm(rd: ElementReader, root: Element) -> ReadAlgorithm:
    """Check the element tree of an MSCCL XML algorithm; raise the first error, located."""
    if root.tag != "algo":
        raise rd.err(root, f"the root element is <{root.tag}>, expected <algo>")
    hdr = _read_header(rd, root)
    N = hdr.nranks
    gpus = _read_gpus(rd, root, N)
    declared = _declared_buffers(rd, root, gpus, hdr)
    tbs = {gid: _read_tbs(rd, gpus[gid], gid, N, hdr.nchannels) for gid in range(N)}
    moved = 0                 # chunks the steps read so far move, in all
    for gid in range(N):
        for t in tbs[gid]:
            moved = _read_steps(rd, t, gid, declared[gid], hdr, moved)
    for gid in range(N):
        _resolve_waits(rd, gid, tbs[gid])
    _match_connections(rd, tbs)
    return ReadAlgorithm(root, hdr, tbs)


# -- <algo> ----------------------------------------------------------------------------------------
def _collective(rd: ElementReader, a: Element) -> tuple[str, str]:
    """(protocol, ProgramIR collective) of ``<algo>``."""
    proto = a.attrs["proto"]
    if proto not in PROTOCOLS:
        raise rd.err(a, f"unknown protocol '{proto}'{did_you_mean(proto, PROTOCOLS)} (expected {', '.join(PROTOCOLS)})",
                     "proto")
    coll = COLLECTIVE_ALIASES.get(a.attrs["coll"], a.attrs["coll"])
    if coll not in SUPPORTED_COLLECTIVES:
        if coll in OTHER_COLLECTIVES:
            # a collective hccc has but MSCCL XML cannot state (a rooted one: no root attribute)
            spec = SPECS.get(coll)
            why = (f"{spec.msccl_refusal}; hccc reads {', '.join(SUPPORTED_COLLECTIVES)} from MSCCL XML"
                   if spec is not None else f"hccc proves and runs {', '.join(SUPPORTED_COLLECTIVES)}")
            raise rd.err(a, f"unsupported collective '{coll}': {why}", "coll")
        raise rd.err(a, f"unknown collective '{coll}'{did_you_mean(coll, [*SUPPORTED_COLLECTIVES, *COLLECTIVE_ALIASES])} "
                        f"(expected {', '.join(SUPPORTED_COLLECTIVES)})", "coll")
    return proto, COLLECTIVE_OF_COLL[coll]


def _read_header(rd: ElementReader, a: Element) -> Header:
    rd.need(a, _ALGO_ATTRS)
    proto, coll = _collective(rd, a)
    spec = SPECS[coll]
    N = rd.int_(a, "ngpus", 1, MAX_GPUS)
    nch = rd.int_(a, "nchannels", 0, MAX_CHANNELS)
    C = rd.int_(a, "nchunksperloop", 1, MAX_CHUNKS)
    inplace = rd.int_(a, "inplace", 0, 1, "must be 0 or 1")
    outofplace = (rd.int_(a, "outofplace", 0, 1, "must be 0 or 1") if "outofplace" in a.attrs
                  else 1 - inplace)
    if not inplace and not outofplace:
        raise rd.err(a, "the algorithm is neither in-place nor out-of-place (inplace=0 outofplace=0)",
                     "outofplace" if "outofplace" in a.attrs else "inplace")
    # nnodes (optional, not MSCCL's own): the ranks are nnodes nodes of ngpus / nnodes GPUs,
    # in rank order (where a multi-node job's placement is checked against)
    nnodes = rd.int_(a, "nnodes", 1, max(N, 1)) if "nnodes" in a.attrs else 0
    if nnodes and N % nnodes:
        raise rd.err(a, f"nnodes={nnodes} does not divide ngpus={N} into equal nodes", "nnodes")
    min_b = rd.int_(a, "minBytes", 0) if "minBytes" in a.attrs else 0
    max_b = rd.int_(a, "maxBytes", 0) if "maxBytes" in a.attrs else 0
    if max_b and min_b > max_b:
        raise rd.err(a, f"minBytes={min_b} is more than maxBytes={max_b}: the algorithm would "
                        "serve no size (maxBytes=0 means no upper limit)", "minBytes")
    if spec.split_by_rank and C % N:
        raise rd.err(a, f"nchunksperloop={C} is not a multiple of ngpus={N}: every rank of the {coll} "
                        f"owns the same number of chunks", "nchunksperloop")
    return Header(proto, coll, N, nch, C, C // N, inplace, outofplace, nnodes, min_b, max_b,
                  spec.slots("input", N, C), spec.slots("output", N, C))


# -- <gpu> -----------------------------------------------------------------------------------------
def _read_gpus(rd: ElementReader, a: Element, N: int) -> dict[int, Element]:
    gpus: dict[int, Element] = {}
    for g in rd.children(a):
        rd.need(g, _GPU_ATTRS)
        gid = rd.int_(g, "id", 0, N - 1, f"ngpus={N} allows gpu ids 0..{N - 1}")
        if gid in gpus:
            raise rd.err(g, f"gpu {gid} is defined twice (first at line {gpus[gid].line})", "id")
        gpus[gid] = g
    if len(gpus) != N:
        missing = [i for i in range(N) if i not in gpus]
        raise rd.err(a, f"ngpus={N} but gpu(s) {', '.join(map(str, missing[:8]))}"
                        f"{', ...' if len(missing) > 8 else ''} are missing", "ngpus")
    return gpus


def _declared_buffers(rd: ElementReader, a: Element, gpus: dict[int, Element], hdr: Header) -> dict[int, dict]:
    """Every GPU's declared buffer sizes (sets ``hdr.scratch_n``), their chunk slots bounded."""
    N, in_n, out_n = hdr.nranks, hdr.in_n, hdr.out_n
    declared = {}
    scratch_n = 0
    for gid in range(N):
        g = gpus[gid]
        sizes = {b: rd.int_(g, nm, 0, MAX_CHUNKS) for b, nm in (("i", "i_chunks"), ("o", "o_chunks"),
                                                                 ("s", "s_chunks"))}
        declared[gid] = sizes
        scratch_n = max(scratch_n, sizes["s"])
    hdr.scratch_n = scratch_n
    # the proofs and the runs track every chunk slot of every rank's buffers: bound their product
    # before any of that work (a small file can declare 1024 GPUs of a million scratch chunks)
    slots = N * (in_n + out_n + scratch_n)
    if slots > MAX_RANK_CHUNKS:
        big = max(gpus.values(), key=lambda g: int(declared[int(g.attrs["id"].strip())]["s"]))
        where, attr = (big, "s_chunks") if N * scratch_n > MAX_RANK_CHUNKS // 2 else (a, "ngpus")
        raise rd.err(where, f"{N} GPUs x {in_n + out_n + scratch_n} buffer chunks each (input "
                            f"{in_n}, output {out_n}, scratch {scratch_n}) is {slots} chunk slots, "
                            f"more than the {MAX_RANK_CHUNKS} hccc checks and runs", attr)
    return declared


# -- <tb> ------------------------------------------------------------------------------------------
def _read_tbs(rd: ElementReader, g: Element, gid: int, N: int, nch: int) -> list[Tb]:
    found: dict[int, Tb] = {}
    ends: dict[tuple, Tb] = {}          # (send / recv, peer, channel) -> its thread block
    for el in rd.children(g):
        t = _read_tb(rd, el, gid, N, nch, found)
        _claim_ends(rd, t, ends)
        found[t.id] = t
    ids = sorted(found)
    if ids and ids != list(range(len(ids))):
        miss = next(i for i in range(len(ids)) if i not in found)
        raise rd.err(g, f"thread block ids of gpu {gid} must be 0..{len(ids) - 1} without gaps, but "
                        f"{miss} is missing")
    return [found[i] for i in ids]


def _read_tb(rd: ElementReader, el: Element, gid: int, N: int, nch: int, found: dict[int, Tb]) -> Tb:
    rd.need(el, _TB_ATTRS)
    tid = rd.int_(el, "id", 0, 1 << 20)
    if tid in found:
        raise rd.err(el, f"gpu {gid} has two thread blocks with id {tid} (first at line "
                         f"{found[tid].el.line})", "id")
    send = rd.int_(el, "send", -1, N - 1, f"peers are -1 (none) or gpu ids 0..{N - 1}")
    recv = rd.int_(el, "recv", -1, N - 1, f"peers are -1 (none) or gpu ids 0..{N - 1}")
    for nm, v in (("send", send), ("recv", recv)):
        if v == gid:
            raise rd.err(el, f"thread block {tid} of gpu {gid} cannot {nm} {'to' if nm == 'send' else 'from'} "
                             f"its own gpu", nm)
    # msccl-tools leaves chan="-1" on thread blocks that only copy or reduce locally
    local = send < 0 and recv < 0
    chan = rd.int_(el, "chan", -1 if local else 0, max(nch - 1, 0) if not local else MAX_CHANNELS,
                   f"nchannels={nch} allows channels 0..{nch - 1}")
    chan = max(chan, 0)
    if not local and chan >= nch:
        raise rd.err(el, f"chan={chan} is out of range: nchannels={nch} allows channels "
                         f"0..{nch - 1}", "chan")
    return Tb(gid, tid, send, recv, chan, el)


def _claim_ends(rd: ElementReader, t: Tb, ends: dict[tuple, Tb]) -> None:
    """Record ``t``'s connection ends; each belongs to one thread block."""
    for kind, peer in (("send", t.send), ("recv", t.recv)):
        if peer < 0:
            continue
        key = (kind, peer, t.chan)
        if key in ends:
            o = ends[key]
            raise rd.err(t.el, f"thread blocks {o.id} and {t.id} of gpu {t.gpu} both {kind} "
                               f"{'to' if kind == 'send' else 'from'} gpu {peer} on channel {t.chan}; a "
                               f"connection belongs to one thread block", kind)
        ends[key] = t


# -- <step> ----------------------------------------------------------------------------------------
def _read_steps(rd: ElementReader, t: Tb, gid: int, declared: dict, hdr: Header, moved: int) -> int:
    """Read ``t``'s steps; returns ``moved`` plus the chunks they move (bounded before the work)."""
    bufsize = hdr.bufsize
    for pos, el in enumerate(rd.children(t.el)):
        st = _read_step(rd, el, pos, t, gid)
        moved += st.cnt
        if moved > MAX_CHUNK_MOVES:      # before the work: the proofs follow every chunk of every step
            raise rd.err(el, f"the steps so far move {moved} chunks in all (the sum of their cnt), "
                             f"more than the {MAX_CHUNK_MOVES} hccc checks and runs", "cnt")
        _check_peers(rd, st, t)
        _check_operands(rd, st, gid, declared, bufsize, hdr)
        t.steps.append(st)
    return moved


def _read_step(rd: ElementReader, el: Element, pos: int, t: Tb, gid: int) -> Step:
    rd.need(el, _STEP_ATTRS)
    s = rd.int_(el, "s", 0)
    if s != pos:
        raise rd.err(el, f"step s={s} is step number {pos} of thread block {t.id} (gpu {gid}): steps "
                         f"must be numbered 0, 1, 2, ... in order, the runtimes count them that way", "s")
    typ = el.attrs["type"]
    if typ not in USES:
        raise rd.err(el, f"unknown step type '{typ}'{did_you_mean(typ, USES)} (expected {', '.join(USES)})", "type")
    bufs = {}
    for side in ("src", "dst"):
        b = el.attrs[f"{side}buf"]
        if b not in BUF_OF_LETTER:
            raise rd.err(el, f"{side}buf=\"{b}\" is not a buffer (expected i, o or s)", f"{side}buf")
        bufs[side] = b
    soff = rd.int_(el, "srcoff", -(1 << 31), 1 << 31)
    doff = rd.int_(el, "dstoff", -(1 << 31), 1 << 31)
    cnt = rd.int_(el, "cnt", 0 if typ == "nop" else 1, MAX_CHUNKS,
                  "" if typ == "nop" else "a step moves at least one chunk")
    depid = rd.int_(el, "depid", -1, 1 << 20, "depid is -1 (none) or a thread-block id")
    deps = rd.int_(el, "deps", -1, 1 << 20)
    if depid >= 0 and deps < 0:
        raise rd.err(el, f"depid={depid} names a thread block but deps={deps} names no step", "deps")
    hasdep = rd.int_(el, "hasdep", 0, 1, "must be 0 or 1")
    return Step(gid, t.id, s, typ, bufs["src"], soff, bufs["dst"], doff, cnt, depid, deps, hasdep, el)


def _check_peers(rd: ElementReader, st: Step, t: Tb) -> None:
    op = OP_OF_TYPE[st.type]
    if op.sends and t.send < 0:
        raise rd.err(st.el, f"a '{st.type}' step sends, but its thread block {t.id} has no send peer (send=-1)",
                     "type")
    if op.receives and t.recv < 0:
        raise rd.err(st.el, f"a '{st.type}' step receives, but its thread block {t.id} has no recv peer "
                            f"(recv=-1)", "type")


def _check_operands(rd: ElementReader, st: Step, gid: int, declared: dict, bufsize: dict, hdr: Header) -> None:
    """The chunks a step uses lie in its GPU's declared buffers (``declared``) and in the
    collective's (``bufsize``: :attr:`Header.bufsize`)."""
    use_src, use_dst = USES[st.type]
    el, cnt = st.el, st.cnt
    for side, used, off, b in (("src", use_src, st.srcoff, st.srcbuf), ("dst", use_dst, st.dstoff, st.dstbuf)):
        if not used:
            continue
        if off < 0:
            raise rd.err(el, f"{side}off={off} must not be negative", f"{side}off")
        if off + cnt > declared[b]:
            raise rd.err(el, f"{_BUF_NAME[b]} chunks {off}..{off + cnt - 1} are outside gpu {gid}'s "
                             f"{_BUF_NAME[b]} buffer ({declared[b]} chunk(s) declared)", f"{side}off")
        if off + cnt > bufsize[b]:
            coll, spec = hdr.coll, SPECS[hdr.coll]
            what = {"i": ("input", spec.input == OWN), "o": ("output", spec.output == OWN)}.get(b)
            why = (f"a {coll} rank's {what[0]} holds nchunksperloop/ngpus = {hdr.k} chunk(s)"
                   if what and what[1] else f"the {coll} buffer has nchunksperloop = {bufsize[b]} chunks")
            raise rd.err(el, f"{_BUF_NAME[b]} chunks {off}..{off + cnt - 1} are outside the buffer: {why}",
                         f"{side}off")


# -- waits -----------------------------------------------------------------------------------------
def _resolve_waits(rd: ElementReader, gid: int, tbs: list[Tb]) -> None:
    """Each non-nop step's waits (its own and its nops') as the steps that end them."""
    by_id = {t.id: t for t in tbs}
    for t in tbs:
        _collect_waits(rd, t)
    for t in tbs:
        for st in t.real:
            st.waits = _signalling_steps(rd, gid, tbs, by_id, t, st)


def _collect_waits(rd: ElementReader, t: Tb) -> None:
    """``t``'s non-nop steps (``t.real``), each with the waits of the nops before it, and the
    fused reductions checked."""
    pending: list = []
    chain: list = []     # consecutive 're' steps the runtimes fuse into one transmission
    for st in t.steps:
        if st.type == "re" and chain and st.depid < 0 and len(chain) < _FUSED_REDUCTIONS:
            head = chain[-1]
            if (head.dstbuf, head.dstoff, head.srcbuf) == (st.dstbuf, st.dstoff, st.srcbuf) \
                    and not head.hasdep:
                if st.cnt != head.cnt:
                    raise rd.err(st.el, f"the runtimes fuse this reduction with step {head.s} (same "
                                        f"destination, no dependency in between) and use one count for "
                                        f"both, but cnt={st.cnt} differs from cnt={head.cnt}", "cnt")
                chain.append(st)
            else:
                chain = [st]
        elif st.type != "nop":
            chain = [st] if st.type == "re" else []
        if st.type == "nop":
            if st.depid < 0:
                raise rd.err(st.el, "a nop step without a dependency: the runtimes count only nops that "
                                    "carry one, so later step numbers would be off", "depid")
            pending.append((st.depid, st.deps, st.el))
            continue
        if pending and st.depid < 0:
            raise rd.err(st.el, "the nop steps before this step carry dependencies, so the runtimes "
                                "require this step to carry one as well (depid/deps)", "depid")
        st.waits = pending + ([(st.depid, st.deps, st.el)] if st.depid >= 0 else [])
        pending = []
        st.real = len(t.real)
        t.real.append(st)


def _signalling_steps(rd: ElementReader, gid: int, tbs: list[Tb], by_id: dict, t: Tb, st: Step) -> list[Step]:
    """The steps whose signals end ``st``'s waits (waits ended by program order dropped)."""
    out = []
    for depid, deps, el in st.waits:
        if depid not in by_id:
            raise rd.err(el, f"depid={depid} names no thread block of gpu {gid} "
                             f"(it has {len(tbs)}: ids 0..{len(tbs) - 1})", "depid")
        tgt = by_id[depid]
        if deps >= len(tgt.steps):
            raise rd.err(el, f"deps={deps} is beyond the {len(tgt.steps)} step(s) of thread block "
                             f"{depid} of gpu {gid}", "deps")
        sig = next((x for x in tgt.real if x.s >= deps and x.hasdep), None)
        if sig is None:
            raise rd.err(el, f"waits for gpu {gid} thread block {depid} step {deps}, which never "
                             f"signals: neither it nor a later step of that thread block has "
                             f"hasdep=\"1\" (the runtime would wait forever)", "deps")
        if depid == t.id:
            if sig.real < st.real:
                continue
            raise rd.err(el, f"waits for step {deps} of its own thread block, which runs later: "
                             f"deadlock", "deps")
        out.append(sig)
    return out


# -- connections -----------------------------------------------------------------------------------
def _match_connections(rd: ElementReader, tbs: dict[int, list[Tb]]) -> None:
    """The k-th send of every connection is its k-th receive, with the same count."""
    sends: dict[tuple, list[Step]] = {}
    recvs: dict[tuple, list[Step]] = {}
    for gid, lst in tbs.items():
        for t in lst:
            for st in t.real:
                op = OP_OF_TYPE[st.type]
                if op.sends:
                    sends.setdefault((gid, t.send, t.chan), []).append(st)
                if op.receives:
                    recvs.setdefault((t.recv, gid, t.chan), []).append(st)
    for key in sorted(set(sends) | set(recvs)):
        a, b = sends.get(key, []), recvs.get(key, [])
        src, dst, ch = key
        for j, (x, y) in enumerate(zip(a, b)):
            if x.cnt != y.cnt:
                raise rd.err(y.el, f"message {j + 1} from gpu {src} to gpu {dst} on channel {ch} is sent with "
                                   f"cnt={x.cnt} (gpu {src} thread block {x.tb} step {x.s}) but received "
                                   f"with cnt={y.cnt}: sends and receives of a connection pair up in order",
                             "cnt")
        if len(a) != len(b):
            if len(a) > len(b):
                x = a[len(b)]
                raise rd.err(x.el, f"gpu {src} sends {len(a)} message(s) to gpu {dst} on channel {ch}, but gpu "
                                   f"{dst} receives {len(b)}: this send (message {len(b) + 1}) is never "
                                   f"received and the runtime hangs", "type")
            y = b[len(a)]
            raise rd.err(y.el, f"gpu {dst} receives {len(b)} message(s) from gpu {src} on channel {ch}, but "
                               f"gpu {src} sends {len(a)}: this receive (message {len(a) + 1}) waits forever",
                         "type")


__all__ = ["read_algorithm", "ReadAlgorithm", "Header", "Tb", "Step", "USES", "MAX_GPUS", "MAX_CHUNKS",
           "MAX_CHANNELS", "MAX_RANK_CHUNKS", "MAX_CHUNK_MOVES"]
