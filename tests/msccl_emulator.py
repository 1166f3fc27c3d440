"""An independent MSCCL XML executor for tests (shares no code with hccc's importer).

It runs an XML algorithm the way MSCCL XML checkers and the runtimes do: every thread block (TB)
runs its steps in order; a step with ``depid``/``deps`` waits until TB ``depid`` of its GPU has
finished step ``deps`` *and* that step carries ``hasdep="1"``; connections are FIFO mailboxes
``(sender, receiver, channel)`` (unbounded, or ``capacity`` messages); which runnable TB moves next
is chosen at random. Chunk contents are symbolic: a tuple of ``(rank, chunk)`` contributions, so the
result says exactly which contributions reached every output chunk (duplicates show as repeats).

``strict=True`` adds the rules of the out-of-place AllGather checker that MSCCL users run: every
message carries its sender's (srcbuf, srcoff, dstbuf, dstoff, cnt) and the receiving step must
name the same five; an ``rcs`` step must have src == dst and forwards the message with src := dst;
``i_chunks`` is 1 and ``o_chunks`` is ngpus; ``outofplace`` is 1.
"""
from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from collections import deque

RECV = {"r", "rcs", "rrs", "rrc", "rrcs"}
SEND = {"s", "rcs", "rrs", "rrcs"}
REDUCE = {"rrs", "rrc", "rrcs", "re"}


class EmulationError(AssertionError):
    pass


def run(text: str, *, inplace: bool = False, seed: int = 0, capacity: int | None = None,
        strict: bool = False) -> tuple[list[list], dict]:
    """Run the XML; returns (per-rank output chunk contents, the algo attributes)."""
    root = ET.fromstring(text)
    if root.tag != "algo":
        raise EmulationError("root is not <algo>")
    A = root.attrib
    N = int(A["ngpus"])
    C = int(A["nchunksperloop"])
    coll = A["coll"]
    k = C // N
    gpus = sorted(root.findall("gpu"), key=lambda g: int(g.get("id")))
    if [int(g.get("id")) for g in gpus] != list(range(N)):
        raise EmulationError("gpu ids are not 0..ngpus-1")
    if strict:
        if int(A["outofplace"]) != 1:
            raise EmulationError("only out-of-place algorithms are checked")
        for g in gpus:
            if int(g.get("i_chunks")) != 1 or int(g.get("o_chunks")) != N:
                raise EmulationError("input must be 1 chunk and output ngpus chunks")
    mem: list[dict] = []
    for r, g in enumerate(gpus):
        sizes = {"i": int(g.get("i_chunks")), "o": int(g.get("o_chunks")), "s": int(g.get("s_chunks"))}
        full = C
        m = {("o", j): None for j in range(max(sizes["o"], k if coll == "reducescatter" else full))}
        m.update({("s", j): None for j in range(sizes["s"])})
        part = k if coll == "allgather" else full
        for j in range(max(part, sizes["i"])):
            # AllToAll: input slot j of rank r is piece j % k of its block for rank j // k,
            # named by its global id r*C + j
            c = r * k + j if coll == "allgather" else (r * C + j if coll == "alltoall" else j)
            m[("i", j)] = ((r, c),) if j < part else None
        mem.append({"cells": m, "sizes": sizes})

    def key(r, buf, off):
        if inplace:
            if coll in ("allreduce", "alltoall") and buf == "i":
                return ("o", off)
            if coll == "allgather" and buf == "i":
                return ("o", r * k + off)
            if coll == "reducescatter" and buf == "o":
                return ("i", r * k + off)
        return (buf, off)

    if inplace:
        for r in range(N):
            cells = mem[r]["cells"]
            if coll in ("allreduce", "alltoall"):
                for j in range(C):
                    cells[("o", j)] = cells[("i", j)]
            elif coll == "allgather":
                for j in range(k):
                    cells[("o", r * k + j)] = cells[("i", j)]

    def cell(r, buf, off, step):
        if not 0 <= off < mem[r]["sizes"][buf]:
            raise EmulationError(f"gpu {r}: {buf}[{off}] is outside the declared buffer ({step})")
        return key(r, buf, off)

    tbs = []
    for r, g in enumerate(gpus):
        lst = sorted(g.findall("tb"), key=lambda t: int(t.get("id")))
        if [int(t.get("id")) for t in lst] != list(range(len(lst))):
            raise EmulationError(f"gpu {r}: thread block ids are not contiguous")
        row = []
        for t in lst:
            steps = [s.attrib for s in t.findall("step")]
            if [int(s["s"]) for s in steps] != list(range(len(steps))):
                raise EmulationError(f"gpu {r} tb {t.get('id')}: steps out of order")
            row.append({"send": int(t.get("send")), "recv": int(t.get("recv")), "chan": int(t.get("chan")),
                        "steps": steps, "pc": 0})
        tbs.append(row)
    box: dict = {}
    done = [set() for _ in range(N)]
    rnd = random.Random(seed)

    def mailbox(src, dst, ch):
        return box.setdefault((src, dst, ch), deque())

    def runnable(r, t):
        tb = tbs[r][t]
        if tb["pc"] >= len(tb["steps"]):
            return False
        st = tb["steps"][tb["pc"]]
        d, ds = int(st["depid"]), int(st["deps"])
        if d >= 0 and (d, ds) not in done[r]:
            return False
        if st["type"] in RECV and not mailbox(tb["recv"], r, tb["chan"]):
            return False
        if st["type"] in SEND and capacity is not None and len(mailbox(r, tb["send"], tb["chan"])) >= capacity:
            return False
        return True

    def reduce(a, b):
        if a is None or b is None:
            return None
        return tuple(sorted(a + b))

    while True:
        ready = [(r, t) for r in range(N) for t in range(len(tbs[r])) if runnable(r, t)]
        if not ready:
            break
        r, t = rnd.choice(ready)
        tb = tbs[r][t]
        st = tb["steps"][tb["pc"]]
        typ = st["type"]
        cnt = int(st["cnt"])
        sb, so, db, do = st["srcbuf"], int(st["srcoff"]), st["dstbuf"], int(st["dstoff"])
        where = f"gpu {r} tb {t} step {st['s']}"
        cells = mem[r]["cells"]
        msg = None
        if typ in RECV:
            msg = mailbox(tb["recv"], r, tb["chan"]).popleft()
            if msg["cnt"] != cnt:
                raise EmulationError(f"{where}: receives cnt {cnt}, the message has {msg['cnt']}")
            if strict and (msg["src"] != (sb, so) or msg["dst"] != (db, do)):
                raise EmulationError(f"{where}: message fields {msg['src']}->{msg['dst']} do not match the "
                                     f"step's {(sb, so)}->{(db, do)}")
        if strict and typ == "rcs" and (sb, so) != (db, do):
            raise EmulationError(f"{where}: rcs needs src == dst")
        if typ not in ("r", "rcs", "nop"):
            src_vals = [cells[cell(r, sb, so + j, where)] for j in range(cnt)]
        vals = None
        if typ == "s":
            vals = src_vals
        elif typ in ("r", "rcs"):
            vals = msg["vals"]
        elif typ in ("rrs", "rrc", "rrcs"):
            vals = [reduce(a, b) for a, b in zip(msg["vals"], src_vals)]
        elif typ == "cpy":
            vals = src_vals
        elif typ == "re":
            vals = [reduce(cells[cell(r, db, do + j, where)], b) for j, b in enumerate(src_vals)]
        elif typ != "nop":
            raise EmulationError(f"{where}: unknown type {typ}")
        if typ in ("r", "rcs", "rrc", "rrcs", "cpy", "re"):
            for j in range(cnt):
                cells[cell(r, db, do + j, where)] = vals[j]
        if typ in SEND:
            out_src = (db, do) if typ == "rcs" else (sb, so)
            out_dst = msg["dst"] if (typ == "rcs" and strict) else (db, do)
            mailbox(r, tb["send"], tb["chan"]).append({"vals": list(vals), "cnt": cnt, "src": out_src,
                                                       "dst": out_dst})
        if int(st["hasdep"]):
            done[r].add((t, int(st["s"])))
        tb["pc"] += 1
    stuck = [(r, t, tbs[r][t]["pc"]) for r in range(N) for t in range(len(tbs[r]))
             if tbs[r][t]["pc"] < len(tbs[r][t]["steps"])]
    if stuck:
        raise EmulationError(f"deadlock: {len(stuck)} thread block(s) cannot proceed, e.g. gpu {stuck[0][0]} "
                             f"tb {stuck[0][1]} at step {stuck[0][2]}")
    left = [kk for kk, q in box.items() if q]
    if left:
        raise EmulationError(f"messages never received on connection(s) {left[:3]}")
    outs = []
    for r in range(N):
        nout = k if coll == "reducescatter" else C
        outs.append([mem[r]["cells"][key(r, "o", j)] for j in range(nout)])
    return outs, dict(A)


def expected(coll: str, nranks: int, nchunks: int) -> list[list]:
    k = nchunks // nranks
    if coll == "allgather":
        return [[((c // k, c),) for c in range(nchunks)] for _ in range(nranks)]
    if coll == "alltoall":
        # output slot i*k + p of rank r: piece p of the block rank i sends to rank r
        return [[(((j // k), (j // k) * nchunks + r * k + j % k),) for j in range(nchunks)]
                for r in range(nranks)]
    full = [tuple((q, c) for q in range(nranks)) for c in range(nchunks)]
    if coll == "allreduce":
        return [list(full) for _ in range(nranks)]
    return [[full[r * k + j] for j in range(k)] for r in range(nranks)]


def check(text: str, *, inplace: bool = False, seed: int = 0, capacity: int | None = None,
          strict: bool = False) -> None:
    """Run and compare with the collective's definition; raises EmulationError."""
    outs, A = run(text, inplace=inplace, seed=seed, capacity=capacity, strict=strict)
    want = expected(A["coll"], int(A["ngpus"]), int(A["nchunksperloop"]))
    for r, (got, exp) in enumerate(zip(outs, want)):
        for j, (a, b) in enumerate(zip(got, exp)):
            if a != b:
                raise EmulationError(f"gpu {r} output chunk {j}: {a} != {b}")
