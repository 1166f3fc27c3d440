"""Test oracle: the load-time checks that the MSCCL executors (msccl-executor-nccl and RCCL's
built-in MSCCL) make when they read an algorithm XML, re-implemented from their documented
behaviour (independent of hccc's exporter), so a test can say "this file would load".

Checked, per file: the ``<algo>`` attributes every loader reads (``nchunksperloop``,
``nchannels``, ``ngpus``, ``proto`` in Simple/LL/LL128, ``coll`` one they know, ``minBytes``,
``maxBytes``, ``inplace``, ``outofplace``); per ``<gpu>`` (each rank 0..ngpus-1 exactly once, as
every rank loads its own): ``i_chunks``/``o_chunks``/``s_chunks`` (not negative); per ``<tb>``:
``id`` in 0..max_tbs-1, unique and contiguous from 0, ``send``/``recv`` at least -1 and never the
GPU itself, ``chan`` in 0..nchannels-1; at most 32 thread blocks with a send peer (and 32 with a
receive peer) per channel; per ``<step>``: ``s`` in 0..max_steps-1 and in order, ``type`` one
they run, ``srcbuf``/``dstbuf`` in i/o/s, ``cnt`` in 0..71 for every step but ``nop``, a send
needs the TB's send peer and a receive its receive peer, the offsets the step type reads or
writes within the buffer's chunks (-1 allowed, as the loaders do), ``hasdep`` 0 or 1, ``depid``
naming an existing TB and ``deps`` one of its steps, and a step after ``nop`` dependency steps
carries a dependency of its own (the loaders refuse a chain of dependencies whose last one is not
on the instruction itself).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

COLLS = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "send", "recv",
         "gather", "scatter", "alltoallv"}
PROTOS = {"Simple", "LL", "LL128"}
#: step type -> (sends, receives, reads src, writes dst)
TYPES = {"s": (1, 0, 1, 0), "r": (0, 1, 0, 1), "rcs": (1, 1, 0, 1), "rrs": (1, 1, 1, 0),
         "rrc": (0, 1, 0, 0), "rrcs": (1, 1, 1, 1), "cpy": (0, 0, 1, 1), "re": (0, 0, 1, 1),
         "nop": (0, 0, 0, 0)}
MAX_COUNT = 72
MAX_TBS_PER_CHANNEL = 32


def _int(el, name, errors, where):
    v = el.get(name)
    if v is None:
        errors.append(f"{where}: missing attribute {name}")
        return None
    try:
        return int(v)
    except ValueError:
        errors.append(f"{where}: {name}={v!r} is not an integer")
        return None


def load_time_errors(text: str, *, max_steps: int = 64, max_tbs: int = 108,
                     max_channels: int = 32) -> list[str]:
    """Every reason an MSCCL executor would refuse to load ``text`` (empty: it loads)."""
    errors: list[str] = []
    root = ET.fromstring(text)
    if root.tag != "algo":
        return [f"root element is <{root.tag}>, not <algo>"]
    vals = {n: _int(root, n, errors, "<algo>") for n in
            ("nchunksperloop", "nchannels", "ngpus", "inplace", "outofplace", "minBytes", "maxBytes")}
    if root.get("proto") not in PROTOS:
        errors.append(f"<algo>: proto {root.get('proto')!r} is not one of {sorted(PROTOS)}")
    if root.get("coll") not in COLLS:
        errors.append(f"<algo>: coll {root.get('coll')!r} is not a collective the executors know")
    ngpus, nch = vals["ngpus"] or 0, vals["nchannels"] or 0
    if not 1 <= nch <= max_channels:
        errors.append(f"<algo>: nchannels={nch} outside 1..{max_channels}")
    if vals["minBytes"] is not None and vals["maxBytes"] is not None and vals["maxBytes"] and \
            vals["minBytes"] > vals["maxBytes"]:
        errors.append("<algo>: minBytes > maxBytes")
    seen = []
    for gpu in root.findall("gpu"):
        gid = _int(gpu, "id", errors, "<gpu>")
        where = f"gpu {gid}"
        seen.append(gid)
        nin, nout, nscr = (_int(gpu, n, errors, where) for n in ("i_chunks", "o_chunks", "s_chunks"))
        if nscr is not None and nscr < 0:
            errors.append(f"{where}: s_chunks={nscr} is negative")
        chunks = {"i": nin or 0, "o": nout or 0, "s": nscr or 0}
        tbs = gpu.findall("tb")
        ids, steps_of = [], {}
        sends, recvs = {}, {}
        for tb in tbs:
            bid = _int(tb, "id", errors, where)
            steps_of[bid] = len(tb.findall("step"))
        for tb in tbs:
            bid = _int(tb, "id", errors, where)
            w = f"{where} tb {bid}"
            ids.append(bid)
            if bid is None:
                continue
            if not 0 <= bid < max_tbs:
                errors.append(f"{w}: id outside 0..{max_tbs - 1}")
            send, recv, chan = (_int(tb, n, errors, w) for n in ("send", "recv", "chan"))
            if send is None or recv is None or chan is None:
                continue
            if send < -1 or recv < -1 or send >= ngpus or recv >= ngpus:
                errors.append(f"{w}: send={send} recv={recv} not a peer")
            if send == gid or recv == gid:
                errors.append(f"{w}: peer equals the GPU itself")
            if not 0 <= chan < nch:
                errors.append(f"{w}: chan={chan} outside 0..{nch - 1}")
            if send >= 0:
                sends[chan] = sends.get(chan, 0) + 1
            if recv >= 0:
                recvs[chan] = recvs.get(chan, 0) + 1
            pending_deps = 0
            for k, st in enumerate(tb.findall("step")):
                ws = f"{w} step {k}"
                s = _int(st, "s", errors, ws)
                if s is not None and (s != k or not 0 <= s < max_steps):
                    errors.append(f"{ws}: s={s} (steps must be 0.. in order, fewer than {max_steps})")
                typ = st.get("type")
                if typ not in TYPES:
                    errors.append(f"{ws}: type {typ!r} is not one the executors run")
                    continue
                snd, rcv, rd, wr = TYPES[typ]
                cnt, so, do, depid, deps, hasdep = (_int(st, n, errors, ws) for n in
                                                    ("cnt", "srcoff", "dstoff", "depid", "deps", "hasdep"))
                for b in ("srcbuf", "dstbuf"):
                    if st.get(b) not in chunks:
                        errors.append(f"{ws}: {b}={st.get(b)!r} is not i, o or s")
                if None in (cnt, so, do, depid, deps, hasdep):
                    continue
                if hasdep not in (0, 1):
                    errors.append(f"{ws}: hasdep={hasdep}")
                if depid >= 0:
                    if depid not in steps_of or not 0 <= deps < steps_of[depid]:
                        errors.append(f"{ws}: depends on tb {depid} step {deps}, which does not exist")
                if typ == "nop":
                    if depid >= 0:
                        pending_deps += 1
                    continue
                if not 0 <= cnt < MAX_COUNT:
                    errors.append(f"{ws}: cnt={cnt} outside 0..{MAX_COUNT - 1}")
                if snd and send < 0:
                    errors.append(f"{ws}: a send in a thread block without a send peer")
                if rcv and recv < 0:
                    errors.append(f"{ws}: a receive in a thread block without a receive peer")
                if rd and st.get("srcbuf") in chunks and not -1 <= so < chunks[st.get("srcbuf")]:
                    errors.append(f"{ws}: srcoff={so} outside buffer {st.get('srcbuf')}")
                if wr and st.get("dstbuf") in chunks and not -1 <= do < chunks[st.get("dstbuf")]:
                    errors.append(f"{ws}: dstoff={do} outside buffer {st.get('dstbuf')}")
                if pending_deps and depid < 0:
                    errors.append(f"{ws}: a chain of dependencies whose last one is not on the step")
                pending_deps = 0
        if sorted(i for i in ids if i is not None) != list(range(len(ids))):
            errors.append(f"{where}: thread block ids {sorted(i for i in ids if i is not None)} are not 0..{len(ids) - 1}")
        for side, per in (("send", sends), ("receive", recvs)):
            for ch, n in per.items():
                if n > MAX_TBS_PER_CHANNEL:
                    errors.append(f"{where}: {n} thread blocks with a {side} peer on channel {ch} "
                                  f"(at most {MAX_TBS_PER_CHANNEL})")
    if sorted(g for g in seen if g is not None) != list(range(ngpus)):
        errors.append(f"<gpu> ids {sorted(g for g in seen if g is not None)} are not 0..{ngpus - 1}")
    return errors
