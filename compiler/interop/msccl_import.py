"""MSCCL XML -> ProgramIR, with located diagnostics and a symbolic proof. See :mod:`msccl_xml`.

Reading: the stdlib expat parser, with DOCTYPE and entity declarations refused (no entity
expansion, no external fetches) and every element's position kept, so each error points at the
offending element or attribute as ``FILE:LINE:COL``.

Semantics are the runtime's (the MSCCL executor / RCCL): a thread block runs its steps in order,
for every slice of the buffer; the k-th send on connection (sender, receiver, channel) is the k-th
receive there; a step with ``depid``/``deps`` waits until thread block ``depid`` has *signalled* a
step >= ``deps`` -- only steps with ``hasdep="1"`` signal, so the wait really ends at the first
such step at or after ``deps``; ``nop`` steps only carry extra dependencies for the next step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hccc.compiler.passes.build import sanitize_identifier
from hccc.util.diagnostics import CompileError, Diagnostic, Location, SourceFile
from hccc.util import safe_xml
from hccc.compiler.ir.check import DeadlockError, check_deadlock, check_structure
from hccc.compiler.ir.extents import ExtentError, check_extents
from hccc.compiler.ir.symbolic import ProofError, check_deadlock_buffered, prove
from hccc.compiler.frontend.collectives import OWN, SPECS
from hccc.compiler.interop.msccl_format import COLLECTIVE_ALIASES, COLLECTIVE_OF_COLL, MESSAGES_IN_FLIGHT, BUF_OF_LETTER, OP_OF_TYPE, OTHER_COLLECTIVES, PROTOCOLS, SUPPORTED_COLLECTIVES
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, IRFormatError, Op, ProgramIR

MAX_GPUS = 4096
MAX_CHUNKS = 1 << 20
MAX_CHANNELS = 1024
#: most chunk slots (GPUs x the chunks of each GPU's input, output and scratch buffers) an import
#: may declare: the checks and runs keep state per slot (about 200 bytes each at most)
MAX_RANK_CHUNKS = 1 << 21
#: most chunks the steps of an import may move in all (the sum of every step's cnt)
MAX_CHUNK_MOVES = 1 << 20
_INT_RE = re.compile(r"-?[0-9]{1,18}")

# which operands a step type uses locally (the runtime's kernel reads/writes exactly these)
_USES = {
    "s": (True, False), "r": (False, True), "rcs": (False, True), "rrs": (True, False),
    "rrc": (True, True), "rrcs": (True, True), "cpy": (True, True), "re": (True, True), "nop": (False, False),
}
_ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")
_GPU_ATTRS = ("id", "i_chunks", "o_chunks", "s_chunks")
_TB_ATTRS = ("id", "send", "recv", "chan")
_STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
_CHILD = {"algo": "gpu", "gpu": "tb", "tb": "step", "step": None}


@dataclass
class _El:
    tag: str
    attrs: dict
    line: int
    col: int
    byte: int
    children: list = field(default_factory=list)


def _parse(src: SourceFile, data: bytes) -> _El:
    p = safe_xml.new_parser()
    stack: list[_El] = []
    root: list[_El] = []

    def start(name, attrs):
        line, col = safe_xml.position(p)
        if len(stack) >= len(_CHILD):   # <algo><gpu><tb><step>: nothing deeper, refused at once
            raise safe_xml.XmlStop(f"unexpected <{name[:40]}> inside <{stack[-1].tag[:40]}> (MSCCL XML nests "
                                   "<algo>, <gpu>, <tb>, <step> and nothing deeper)", line, col)
        el = _El(name, dict(attrs), line, col, p.CurrentByteIndex)
        if stack:
            stack[-1].children.append(el)
        else:
            root.append(el)
        stack.append(el)

    def end(name):
        stack.pop()

    def text(data):
        if data.strip():
            raise safe_xml.XmlStop(f"unexpected text {data.strip()[:20]!r} (MSCCL XML has only elements and "
                                   "attributes)", *safe_xml.position(p))

    safe_xml.parse(p, src, data, "MSCCL XML", start=start, end=end, text=text)
    if not root:
        raise CompileError([Diagnostic("empty document: expected an <algo> element", Location(src, 1, 1))])
    return root[0]


@dataclass
class _Step:
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
    el: _El
    real: int = -1     # index among the thread block's non-nop steps
    waits: list = field(default_factory=list)   # [(depid, deps, element), ...] incl. preceding nops


@dataclass
class _Tb:
    gpu: int
    id: int
    send: int
    recv: int
    chan: int
    el: _El
    steps: list = field(default_factory=list)   # all steps, nops included
    real: list = field(default_factory=list)    # non-nop steps
    new_id: int = -1


class _Importer:
    def __init__(self, src: SourceFile, data: bytes):
        self.src = src
        self.moved = 0            # chunks the steps read so far move, in all
        self.data = data
        self._line_starts = None

    # -- locations ---------------------------------------------------------------------------------
    def _pos(self, byte: int) -> tuple[int, int]:
        if self._line_starts is None:
            self._line_starts = np.r_[0, np.flatnonzero(np.frombuffer(self.data, np.uint8) == 10) + 1]
        li = int(np.searchsorted(self._line_starts, byte, side="right")) - 1
        start = int(self._line_starts[li])
        col = len(self.data[start:byte].decode("utf-8", "replace")) + 1
        return li + 1, col

    def loc(self, el: _El | None, attr: str | None = None) -> Location:
        if el is None:
            return Location(self.src, 1, 1)
        if attr is not None:
            end = self.data.find(b">", el.byte)
            seg = self.data[el.byte:end if end >= 0 else len(self.data)]
            m = re.search(rb"\s" + re.escape(attr.encode()) + rb"\s*=", seg)
            if m:
                return Location(self.src, *self._pos(el.byte + m.start() + 1))
        return Location(self.src, el.line, el.col)

    def err(self, el, msg: str, attr: str | None = None, notes=()) -> CompileError:
        return CompileError([Diagnostic(msg, self.loc(el, attr), notes=tuple(notes))])

    # -- attributes --------------------------------------------------------------------------------
    def need(self, el: _El, names) -> None:
        missing = [a for a in names if a not in el.attrs]
        if missing:
            raise self.err(el, f"<{el.tag}> lacks attribute(s) {', '.join(missing)}")

    def int_(self, el: _El, name: str, lo: int | None = None, hi: int | None = None, what: str = "") -> int:
        v = el.attrs[name]
        if not _INT_RE.fullmatch(v):
            raise self.err(el, f"{name}=\"{v}\" is not an integer", name)
        x = int(v)
        if lo is not None and x < lo:
            raise self.err(el, f"{name}={x} is out of range: {what or f'must be >= {lo}'}", name)
        if hi is not None and x > hi:
            raise self.err(el, f"{name}={x} is out of range: {what or f'must be <= {hi}'}", name)
        return x

    def children(self, el: _El) -> list[_El]:
        want = _CHILD[el.tag]
        for ch in el.children:
            if ch.tag != want:
                raise self.err(ch, f"unexpected <{ch.tag}> inside <{el.tag}>"
                               + (f" (expected <{want}>)" if want else ""))
        return el.children

    # -- main -------------------------------------------------------------------------------------
    def run(self, root: _El) -> ProgramIR:
        if root.tag != "algo":
            raise self.err(root, f"the root element is <{root.tag}>, expected <algo>")
        a = root
        self.need(a, _ALGO_ATTRS)
        proto = a.attrs["proto"]
        if proto not in PROTOCOLS:
            raise self.err(a, f"unknown protocol '{proto}' (expected {', '.join(PROTOCOLS)})", "proto")
        coll = COLLECTIVE_ALIASES.get(a.attrs["coll"], a.attrs["coll"])
        if coll not in SUPPORTED_COLLECTIVES:
            if coll in OTHER_COLLECTIVES:
                # a collective hccc has but MSCCL XML cannot state (a rooted one: no root attribute)
                spec = SPECS.get(coll)
                why = (f"{spec.msccl_refusal}; hccc reads {', '.join(SUPPORTED_COLLECTIVES)} from MSCCL XML"
                       if spec is not None else f"hccc proves and runs {', '.join(SUPPORTED_COLLECTIVES)}")
                raise self.err(a, f"unsupported collective '{coll}': {why}", "coll")
            raise self.err(a, f"unknown collective '{coll}' (expected {', '.join(SUPPORTED_COLLECTIVES)})", "coll")
        coll = COLLECTIVE_OF_COLL[coll]
        spec = SPECS[coll]
        N = self.int_(a, "ngpus", 1, MAX_GPUS)
        nch = self.int_(a, "nchannels", 0, MAX_CHANNELS)
        C = self.int_(a, "nchunksperloop", 1, MAX_CHUNKS)
        inplace = self.int_(a, "inplace", 0, 1, "must be 0 or 1")
        outofplace = (self.int_(a, "outofplace", 0, 1, "must be 0 or 1") if "outofplace" in a.attrs
                      else 1 - inplace)
        if not inplace and not outofplace:
            raise self.err(a, "the algorithm is neither in-place nor out-of-place (inplace=0 outofplace=0)",
                           "outofplace" if "outofplace" in a.attrs else "inplace")
        # nnodes (optional, not MSCCL's own): the ranks are nnodes nodes of ngpus / nnodes GPUs,
        # in rank order (where a multi-node job's placement is checked against)
        nnodes = self.int_(a, "nnodes", 1, max(N, 1)) if "nnodes" in a.attrs else 0
        if nnodes and N % nnodes:
            raise self.err(a, f"nnodes={nnodes} does not divide ngpus={N} into equal nodes", "nnodes")
        min_b = self.int_(a, "minBytes", 0) if "minBytes" in a.attrs else 0
        max_b = self.int_(a, "maxBytes", 0) if "maxBytes" in a.attrs else 0
        if max_b and min_b > max_b:
            raise self.err(a, f"minBytes={min_b} is more than maxBytes={max_b}: the algorithm would "
                              "serve no size (maxBytes=0 means no upper limit)", "minBytes")
        if spec.split_by_rank and C % N:
            raise self.err(a, f"nchunksperloop={C} is not a multiple of ngpus={N}: every rank of the {coll} "
                              f"owns the same number of chunks", "nchunksperloop")
        k = C // N
        # sizes of the ProgramIR buffers (the collective's, not the declared ones)
        in_n, out_n = spec.slots("input", N, C), spec.slots("output", N, C)

        gpus: dict[int, _El] = {}
        for g in self.children(a):
            self.need(g, _GPU_ATTRS)
            gid = self.int_(g, "id", 0, N - 1, f"ngpus={N} allows gpu ids 0..{N - 1}")
            if gid in gpus:
                raise self.err(g, f"gpu {gid} is defined twice (first at line {gpus[gid].line})", "id")
            gpus[gid] = g
        if len(gpus) != N:
            missing = [i for i in range(N) if i not in gpus]
            raise self.err(a, f"ngpus={N} but gpu(s) {', '.join(map(str, missing[:8]))}"
                              f"{', ...' if len(missing) > 8 else ''} are missing", "ngpus")
        declared = {}
        scratch_n = 0
        tbs: dict[int, list[_Tb]] = {}
        for gid in range(N):
            g = gpus[gid]
            sizes = {b: self.int_(g, nm, 0, MAX_CHUNKS) for b, nm in (("i", "i_chunks"), ("o", "o_chunks"),
                                                                       ("s", "s_chunks"))}
            declared[gid] = sizes
            scratch_n = max(scratch_n, sizes["s"])
        # the proofs and the runs track every chunk slot of every rank's buffers: bound their product
        # before any of that work (a small file can declare 1024 GPUs of a million scratch chunks)
        slots = N * (in_n + out_n + scratch_n)
        if slots > MAX_RANK_CHUNKS:
            big = max(gpus.values(), key=lambda g: int(declared[int(g.attrs["id"].strip())]["s"]))
            where, attr = (big, "s_chunks") if N * scratch_n > MAX_RANK_CHUNKS // 2 else (a, "ngpus")
            raise self.err(where, f"{N} GPUs x {in_n + out_n + scratch_n} buffer chunks each (input "
                                  f"{in_n}, output {out_n}, scratch {scratch_n}) is {slots} chunk slots, "
                                  f"more than the {MAX_RANK_CHUNKS} hccc checks and runs", attr)
        for gid in range(N):
            tbs[gid] = self.read_tbs(gpus[gid], gid, N, nch)
        bufsize = {"i": in_n, "o": out_n, "s": scratch_n}
        bufname = {"i": "input", "o": "output", "s": "scratch"}
        # steps
        for gid in range(N):
            for t in tbs[gid]:
                self.read_steps(t, gid, declared[gid], bufsize, bufname, coll, k)
        for gid in range(N):
            self.resolve_waits(gid, tbs[gid])
        self.match_connections(tbs, N)
        return self.build(a, tbs, N, C, k, coll, in_n, out_n, scratch_n, proto, nch,
                          bool(inplace), bool(outofplace), min_b, max_b)

    def read_tbs(self, g: _El, gid: int, N: int, nch: int) -> list[_Tb]:
        found: dict[int, _Tb] = {}
        ends: dict[tuple, _Tb] = {}
        for el in self.children(g):
            self.need(el, _TB_ATTRS)
            tid = self.int_(el, "id", 0, 1 << 20)
            if tid in found:
                raise self.err(el, f"gpu {gid} has two thread blocks with id {tid} (first at line "
                                   f"{found[tid].el.line})", "id")
            send = self.int_(el, "send", -1, N - 1, f"peers are -1 (none) or gpu ids 0..{N - 1}")
            recv = self.int_(el, "recv", -1, N - 1, f"peers are -1 (none) or gpu ids 0..{N - 1}")
            for nm, v in (("send", send), ("recv", recv)):
                if v == gid:
                    raise self.err(el, f"thread block {tid} of gpu {gid} cannot {nm} {'to' if nm == 'send' else 'from'} "
                                       f"its own gpu", nm)
            # msccl-tools leaves chan="-1" on thread blocks that only copy or reduce locally
            local = send < 0 and recv < 0
            chan = self.int_(el, "chan", -1 if local else 0, max(nch - 1, 0) if not local else MAX_CHANNELS,
                             f"nchannels={nch} allows channels 0..{nch - 1}")
            chan = max(chan, 0)
            if not local and chan >= nch:
                raise self.err(el, f"chan={chan} is out of range: nchannels={nch} allows channels "
                                   f"0..{nch - 1}", "chan")
            t = _Tb(gid, tid, send, recv, chan, el)
            for kind, peer in (("send", send), ("recv", recv)):
                if peer < 0:
                    continue
                key = (kind, peer, chan)
                if key in ends:
                    o = ends[key]
                    raise self.err(el, f"thread blocks {o.id} and {tid} of gpu {gid} both {kind} "
                                       f"{'to' if kind == 'send' else 'from'} gpu {peer} on channel {chan}; a "
                                       f"connection belongs to one thread block", kind)
                ends[key] = t
            found[tid] = t
        ids = sorted(found)
        if ids and ids != list(range(len(ids))):
            miss = next(i for i in range(len(ids)) if i not in found)
            raise self.err(g, f"thread block ids of gpu {gid} must be 0..{len(ids) - 1} without gaps, but "
                              f"{miss} is missing")
        return [found[i] for i in ids]

    def read_steps(self, t: _Tb, gid: int, declared: dict, bufsize: dict, bufname: dict, coll: str, k: int):
        for pos, el in enumerate(self.children(t.el)):
            self.need(el, _STEP_ATTRS)
            s = self.int_(el, "s", 0)
            if s != pos:
                raise self.err(el, f"step s={s} is step number {pos} of thread block {t.id} (gpu {gid}): steps "
                                   f"must be numbered 0, 1, 2, ... in order, the runtimes count them that way", "s")
            typ = el.attrs["type"]
            if typ not in _USES:
                raise self.err(el, f"unknown step type '{typ}' (expected {', '.join(_USES)})", "type")
            bufs = {}
            for side in ("src", "dst"):
                b = el.attrs[f"{side}buf"]
                if b not in BUF_OF_LETTER:
                    raise self.err(el, f"{side}buf=\"{b}\" is not a buffer (expected i, o or s)", f"{side}buf")
                bufs[side] = b
            soff = self.int_(el, "srcoff", -(1 << 31), 1 << 31)
            doff = self.int_(el, "dstoff", -(1 << 31), 1 << 31)
            cnt = self.int_(el, "cnt", 0 if typ == "nop" else 1, MAX_CHUNKS,
                            "" if typ == "nop" else "a step moves at least one chunk")
            depid = self.int_(el, "depid", -1, 1 << 20, "depid is -1 (none) or a thread-block id")
            deps = self.int_(el, "deps", -1, 1 << 20)
            if depid >= 0 and deps < 0:
                raise self.err(el, f"depid={depid} names a thread block but deps={deps} names no step", "deps")
            hasdep = self.int_(el, "hasdep", 0, 1, "must be 0 or 1")
            st = _Step(gid, t.id, s, typ, bufs["src"], soff, bufs["dst"], doff, cnt, depid, deps, hasdep, el)
            self.moved += cnt
            if self.moved > MAX_CHUNK_MOVES:      # before the work: the proofs follow every chunk of every step
                raise self.err(el, f"the steps so far move {self.moved} chunks in all (the sum of their cnt), "
                                   f"more than the {MAX_CHUNK_MOVES} hccc checks and runs", "cnt")
            use_src, use_dst = _USES[typ]
            op = OP_OF_TYPE[typ]
            if op.sends and t.send < 0:
                raise self.err(el, f"a '{typ}' step sends, but its thread block {t.id} has no send peer (send=-1)",
                               "type")
            if op.receives and t.recv < 0:
                raise self.err(el, f"a '{typ}' step receives, but its thread block {t.id} has no recv peer "
                                   f"(recv=-1)", "type")
            for side, used, off in (("src", use_src, soff), ("dst", use_dst, doff)):
                if not used:
                    continue
                b = bufs[side]
                if off < 0:
                    raise self.err(el, f"{side}off={off} must not be negative", f"{side}off")
                if off + cnt > declared[b]:
                    raise self.err(el, f"{bufname[b]} chunks {off}..{off + cnt - 1} are outside gpu {gid}'s "
                                       f"{bufname[b]} buffer ({declared[b]} chunk(s) declared)", f"{side}off")
                if off + cnt > bufsize[b]:
                    spec = SPECS[coll]
                    what = {"i": ("input", spec.input == OWN), "o": ("output", spec.output == OWN)}.get(b)
                    why = (f"a {coll} rank's {what[0]} holds nchunksperloop/ngpus = {k} chunk(s)"
                           if what and what[1] else f"the {coll} buffer has nchunksperloop = {bufsize[b]} chunks")
                    raise self.err(el, f"{bufname[b]} chunks {off}..{off + cnt - 1} are outside the buffer: {why}",
                                   f"{side}off")
            t.steps.append(st)

    def resolve_waits(self, gid: int, tbs: list[_Tb]) -> None:
        by_id = {t.id: t for t in tbs}
        for t in tbs:
            pending: list = []
            chain: list = []     # consecutive 're' steps the runtimes fuse into one transmission
            for st in t.steps:
                if st.type == "re" and chain and st.depid < 0 and len(chain) < 16:
                    head = chain[-1]
                    if (head.dstbuf, head.dstoff, head.srcbuf) == (st.dstbuf, st.dstoff, st.srcbuf) \
                            and not head.hasdep:
                        if st.cnt != head.cnt:
                            raise self.err(st.el, f"the runtimes fuse this reduction with step {head.s} (same "
                                                  f"destination, no dependency in between) and use one count for "
                                                  f"both, but cnt={st.cnt} differs from cnt={head.cnt}", "cnt")
                        chain.append(st)
                    else:
                        chain = [st]
                elif st.type != "nop":
                    chain = [st] if st.type == "re" else []
                if st.type == "nop":
                    if st.depid < 0:
                        raise self.err(st.el, "a nop step without a dependency: the runtimes count only nops that "
                                              "carry one, so later step numbers would be off", "depid")
                    pending.append((st.depid, st.deps, st.el))
                    continue
                if pending and st.depid < 0:
                    raise self.err(st.el, "the nop steps before this step carry dependencies, so the runtimes "
                                          "require this step to carry one as well (depid/deps)", "depid")
                st.waits = pending + ([(st.depid, st.deps, st.el)] if st.depid >= 0 else [])
                pending = []
                st.real = len(t.real)
                t.real.append(st)
        for t in tbs:
            for st in t.real:
                out = []
                for depid, deps, el in st.waits:
                    if depid not in by_id:
                        raise self.err(el, f"depid={depid} names no thread block of gpu {gid} "
                                           f"(it has {len(tbs)}: ids 0..{len(tbs) - 1})", "depid")
                    tgt = by_id[depid]
                    if deps >= len(tgt.steps):
                        raise self.err(el, f"deps={deps} is beyond the {len(tgt.steps)} step(s) of thread block "
                                           f"{depid} of gpu {gid}", "deps")
                    sig = next((x for x in tgt.real if x.s >= deps and x.hasdep), None)
                    if sig is None:
                        raise self.err(el, f"waits for gpu {gid} thread block {depid} step {deps}, which never "
                                           f"signals: neither it nor a later step of that thread block has "
                                           f"hasdep=\"1\" (the runtime would wait forever)", "deps")
                    if depid == t.id:
                        if sig.real < st.real:
                            continue
                        raise self.err(el, f"waits for step {deps} of its own thread block, which runs later: "
                                           f"deadlock", "deps")
                    out.append(sig)
                st.waits = out

    def match_connections(self, tbs: dict[int, list[_Tb]], N: int) -> None:
        sends: dict[tuple, list[_Step]] = {}
        recvs: dict[tuple, list[_Step]] = {}
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
                    raise self.err(y.el, f"message {j + 1} from gpu {src} to gpu {dst} on channel {ch} is sent with "
                                         f"cnt={x.cnt} (gpu {src} thread block {x.tb} step {x.s}) but received "
                                         f"with cnt={y.cnt}: sends and receives of a connection pair up in order",
                                   "cnt")
            if len(a) != len(b):
                if len(a) > len(b):
                    x = a[len(b)]
                    raise self.err(x.el, f"gpu {src} sends {len(a)} message(s) to gpu {dst} on channel {ch}, but gpu "
                                         f"{dst} receives {len(b)}: this send (message {len(b) + 1}) is never "
                                         f"received and the runtime hangs", "type")
                y = b[len(a)]
                raise self.err(y.el, f"gpu {dst} receives {len(b)} message(s) from gpu {src} on channel {ch}, but "
                                     f"gpu {src} sends {len(a)}: this receive (message {len(a) + 1}) waits forever",
                               "type")

    # -- ProgramIR ----------------------------------------------------------------------------------
    def build(self, a: _El, tbs, N, C, k, coll, in_n, out_n, scratch_n, proto, nch, inplace, outofplace,
              min_b, max_b) -> ProgramIR:
        normalise = inplace and not outofplace
        rows: list[tuple] = []        # (rank, tb, seq, op, sp, rp, ch, sbuf, soff, dbuf, doff, cnt)
        where: list[tuple] = []       # (element, description)
        index: dict[int, int] = {}    # id(_Step) -> prim
        deps: list[tuple[int, object]] = []
        ntbs = np.zeros(N, np.int32)
        for gid in range(N):
            nt = 0
            for t in tbs[gid]:
                if not t.real:
                    continue
                t.new_id = nt
                nt += 1
            ntbs[gid] = nt
        extra_first = {}
        alias = SPECS[coll].alias
        if normalise and alias != "output in input":
            # prologue: the data the in-place program expects in the output, put there by a copy
            for gid in range(N):
                if ntbs[gid] == 0:
                    ntbs[gid] = 1
                src_off, dst_off, cnt = (0, gid * k, k) if alias == "input in output" else (0, 0, C)
                extra_first[gid] = len(rows)
                rows.append((gid, 0, -1, Op.COPY, -1, -1, 0, Buf.INPUT, src_off, Buf.OUTPUT, dst_off, cnt))
                where.append((self.gpu_el(a, gid), f"gpu {gid} in-place prologue (input copied into the output)"))

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

        for gid in range(N):
            for t in tbs[gid]:
                for st in t.real:
                    op = OP_OF_TYPE[st.type]
                    use_src, use_dst = _USES[st.type]
                    sb, so = remap(gid, BUF_OF_LETTER[st.srcbuf], st.srcoff) if use_src else (Buf.NONE, 0)
                    db, do = remap(gid, BUF_OF_LETTER[st.dstbuf], st.dstoff) if use_dst else (Buf.NONE, 0)
                    index[id(st)] = len(rows)
                    rows.append((gid, t.new_id, st.real, op, t.send if op.sends else -1,
                                 t.recv if op.receives else -1, t.chan, sb, so, db, do, st.cnt))
                    where.append((st.el, f"gpu {gid} thread block {t.id} step {st.s} ({self.describe_op(st, t)})"))
                    for w in st.waits:
                        deps.append((index[id(st)], w))
        extra_last = {}
        if normalise and alias == "output in input":
            for gid in range(N):
                if ntbs[gid] == 0:
                    ntbs[gid] = 1
                extra_last[gid] = len(rows)
                rows.append((gid, 0, 1 << 30, Op.COPY, -1, -1, 0, Buf.INPUT, gid * k, Buf.OUTPUT, 0, k))
                where.append((self.gpu_el(a, gid), f"gpu {gid} in-place epilogue (result copied to the output)"))
        arr = np.array([r[:3] for r in rows], np.int64).reshape(-1, 3)
        order = np.lexsort((arr[:, 2], arr[:, 1], arr[:, 0])) if len(rows) else np.zeros(0, np.int64)
        inv = np.empty(len(rows), np.int64)
        inv[order] = np.arange(len(rows))
        cols = {c: np.zeros(len(rows), dt) for c, dt in PRIM_COLUMNS.items()}
        names = ("rank", "tb", "seq", "op", "send_peer", "recv_peer", "channel", "src_buf", "src_off", "dst_buf",
                 "dst_off", "count")
        for j, r in enumerate(rows):
            for c, v in zip(names, r):
                cols[c][inv[j]] = int(v)
        cols["task"][:] = -1
        cols["task2"][:] = -1
        # sequence numbers: contiguous per (rank, tb) after the extra copies
        rk, tbc = cols["rank"].astype(np.int64), cols["tb"].astype(np.int64)
        if len(rows):
            new = np.r_[True, (rk[1:] != rk[:-1]) | (tbc[1:] != tbc[:-1])]
            start = np.maximum.accumulate(np.where(new, np.arange(len(rows)), 0))
            cols["seq"] = (np.arange(len(rows)) - start).astype(np.int32)
        dp = [inv[i] for i, w in deps]
        do = [inv[index[id(w)]] for i, w in deps]
        # the prologue copy runs before every thread block's first step; the epilogue after every last one
        firsts = {}
        lasts = {}
        for j in range(len(rows)):
            key = (int(cols["rank"][j]), int(cols["tb"][j]))
            firsts.setdefault(key, j)
            lasts[key] = j
        for gid, i in extra_first.items():
            for (r, t), j in firsts.items():
                if r == gid and t != 0:
                    dp.append(j)
                    do.append(inv[i])
        for gid, i in extra_last.items():
            for (r, t), j in lasts.items():
                if r == gid and t != 0:
                    dp.append(inv[i])
                    do.append(j)
        self.where = [where[i] for i in order.tolist()]
        nsend = sum(1 for r in rows if r[3].sends)
        ir = ProgramIR(name=sanitize_identifier(a.attrs["name"]), collective=coll, nranks=N, nchunks=C,
                       in_chunks=in_n, out_chunks=out_n, scratch_chunks=scratch_n, prims=cols,
                       dep_prim=np.asarray(dp, np.int64), dep_on=np.asarray(do, np.int64),
                       npipelines=1, ntbs=ntbs,
                       stats={"source": "msccl-xml", "msccl_name": a.attrs["name"][:256], "proto": proto,
                              "nchannels": nch, "msccl_inplace": bool(inplace or normalise),
                              "msccl_outofplace": bool(outofplace or normalise),
                              "inplace_normalised": bool(normalise), "minBytes": min_b, "maxBytes": max_b,
                              "transfers": nsend, "tbs_per_rank_max": int(ntbs.max()) if N else 0,
                              "tbs_connection_based": int(ntbs.sum()), "tbs_state_based": int(ntbs.sum())})
        if "nnodes" in a.attrs:     # checked in run()
            ir.stats["gpus_per_node"] = N // int(a.attrs["nnodes"])
        try:
            check_structure(ir)
        except IRFormatError as exc:
            raise self.err(a, f"the program is not well-formed: {exc}") from None
        # MSCCL's execution: each thread block runs its steps once per slice; a connection's FIFO has
        # NCCL_STEPS = 8 slots, a Simple message takes MSCCL_CHUNKSTEPS = 4 of them, an LL/LL128
        # message one. hccc's own kernels (task-level) need the stricter check; remember which holds.
        try:
            check_deadlock_buffered(ir, MESSAGES_IN_FLIGHT[proto], self.describe)
        except ProofError as exc:
            el = self.where[exc.prims[0]][0] if exc.prims else a
            raise CompileError([Diagnostic(str(exc), self.loc(el))]) from None
        try:
            check_deadlock(ir)
            ir.stats["execution"] = "task"
        except DeadlockError:
            ir.stats["execution"] = "algorithm"
        describe = self.describe
        modes = []
        if outofplace or normalise:
            modes.append(False)
        if inplace:
            modes.append(True)
        for mode in modes:
            try:
                prove(ir, mode, describe)
            except ProofError as exc:
                el = self.where[exc.prims[0]][0] if exc.prims else a
                raise CompileError([Diagnostic(f"the program does not implement {coll}: {exc}", self.loc(el))]) \
                    from None
        # every step touches exactly the elements of the chunks it names, at every element count
        try:
            check_extents(ir, self.describe)
        except ExtentError as exc:
            el = self.where[exc.prims[0]][0] if exc.prims else a
            raise CompileError([Diagnostic(str(exc), self.loc(el))]) from None
        return ir

    def gpu_el(self, a: _El, gid: int) -> _El:
        for g in a.children:
            if g.attrs.get("id") is not None and _INT_RE.fullmatch(g.attrs["id"]) and int(g.attrs["id"]) == gid:
                return g
        return a

    @staticmethod
    def describe_op(st: _Step, t: _Tb) -> str:
        op = OP_OF_TYPE[st.type]
        parts = [st.type]
        if op.receives:
            parts.append(f"from gpu {t.recv}")
        if op.sends:
            parts.append(f"to gpu {t.send}")
        return " ".join(parts)

    def describe(self, i: int) -> str:
        return self.where[i][1]


def import_xml_text(text: str, name: str = "<input>") -> ProgramIR:
    """Parse and prove MSCCL XML text (see :func:`import_xml`)."""
    src = SourceFile(name, text)
    data = text.encode("utf-8")
    imp = _Importer(src, data)
    return imp.run(_parse(src, data))


def import_xml(path: str | Path) -> ProgramIR:
    """Read an MSCCL XML algorithm as a ProgramIR, proven to implement its collective.

    Raises :class:`CompileError` with ``FILE:LINE:COL`` diagnostics for malformed XML, unknown
    attribute values, out-of-range ids, send/receive mismatches, deadlocks, races and programs that
    do not implement their collective.
    """
    src = SourceFile.read(path)
    data = src.text.encode("utf-8")
    imp = _Importer(src, data)
    return imp.run(_parse(src, data))


__all__ = ["import_xml", "import_xml_text"]
