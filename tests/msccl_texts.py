"""MSCCL XML texts shaped like the real-world files the importer must take (for several tests).

``allpairs_allreduce(n, per)`` is the shape of msccl-tools' allpairs AllReduce as the public
corpus has it: ``nchunksperloop = n * per``, rank ``r`` owns the block of chunks
``[r*per, (r+1)*per)``; one thread block per peer first *sends* the peer's block (one step of
``cnt = per`` chunks) and only then receives the peer's copy of its own block into scratch (so both
peers send before either receives), a local thread block reduces the ``n - 1`` scratch blocks into
its own block, and the peer thread blocks send the reduced block and receive the others. Scratch
holds ``(n - 1) * per`` chunks, fewer than ``nchunksperloop``. In place only, like the originals.
"""
from __future__ import annotations


def _step(s, typ, sb="i", so=-1, db="o", do=-1, cnt=1, depid=-1, deps=-1, hasdep=0) -> str:
    return (f'      <step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
            f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


def allpairs_allreduce(n: int, per: int, proto: str = "Simple", coll: str = "allreduce") -> str:
    C = n * per
    out = [f'<algo name="allpairs_{n}x{per}" proto="{proto}" nchannels="1" nchunksperloop="{C}" '
           f'ngpus="{n}" coll="{coll}" inplace="1">']
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        local = len(peers)                       # id of the reducing thread block
        out.append(f'  <gpu id="{r}" i_chunks="{C}" o_chunks="0" s_chunks="{(n - 1) * per}">')
        for t, p in enumerate(peers):
            slot = t * per                       # where the copy from peer p lands in scratch
            out.append(f'    <tb id="{t}" send="{p}" recv="{p}" chan="0">')
            theirs = [q for q in range(n) if q != p].index(r) * per   # our copy's slot at p
            out.append(_step(0, "s", "i", p * per, "s", theirs, per))
            out.append(_step(1, "r", "i", r * per, "s", slot, per, hasdep=1))
            out.append(_step(2, "s", "i", r * per, "i", r * per, per, depid=local, deps=local - 1))
            out.append(_step(3, "r", "i", p * per, "i", p * per, per))
            out.append('    </tb>')
        out.append(f'    <tb id="{local}" send="-1" recv="-1" chan="0">')
        for t in range(local):
            out.append(_step(t, "re", "s", t * per, "i", r * per, per, depid=t, deps=1,
                             hasdep=int(t == local - 1)))
        out.append('    </tb>')
        out.append('  </gpu>')
    out.append('</algo>')
    return "\n".join(out) + "\n"


def direct_allgather(n: int, k: int, proto: str = "Simple") -> str:
    """AllGather where every rank sends its ``k`` chunks to every peer as one step of ``cnt = k``
    (one thread block per peer: send first, then receive the peer's block), and a local thread
    block copies the rank's own block into place (``cpy`` of ``k`` chunks); in and out of place."""
    C = n * k
    out = [f'<algo name="direct_ag_{n}x{k}" proto="{proto}" nchannels="1" nchunksperloop="{C}" '
           f'ngpus="{n}" coll="allgather" inplace="1" outofplace="1">']
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        out.append(f'  <gpu id="{r}" i_chunks="{k}" o_chunks="{C}" s_chunks="0">')
        for t, p in enumerate(peers):
            out.append(f'    <tb id="{t}" send="{p}" recv="{p}" chan="0">')
            out.append(_step(0, "s", "i", 0, "o", r * k, k))
            out.append(_step(1, "r", "i", 0, "o", p * k, k))
            out.append('    </tb>')
        out.append(f'    <tb id="{len(peers)}" send="-1" recv="-1" chan="0">')
        out.append(_step(0, "cpy", "i", 0, "o", r * k, k))
        out.append('    </tb>')
        out.append('  </gpu>')
    out.append('</algo>')
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ AllToAll programs
def _alltoall_algo(name, proto, nch, C, N, gpus, inplace=0, extra=""):
    head = (f'<algo name="{name}" proto="{proto}" nchannels="{nch}" nchunksperloop="{C}" ngpus="{N}" '
            f'coll="alltoall" inplace="{inplace}"{extra}>')
    return "\n".join(["<!-- test program -->", head] + gpus + ["</algo>"]) + "\n"


def allpairs_xml(N: int, instances: int = 1, proto: str = "Simple", wrong: tuple | None = None) -> str:
    """All-pairs AllToAll; ``wrong=(gpu, peer)`` makes gpu receive peer's block at the wrong slot."""
    I = instances
    C = N * I
    gpus = []
    for g in range(N):
        tbs = []
        tid = 0
        for c in range(I):
            tbs.append(f'    <tb id="{tid}" send="-1" recv="-1" chan="{c}">\n'
                       + _step(0, "cpy", "i", g * I + c, "o", g * I + c) + "\n    </tb>")
            tid += 1
        for c in range(I):
            for p in range(N):
                if p == g:
                    continue
                do = p * I + c
                if wrong == (g, p):
                    do = ((p + 1) % N if (p + 1) % N != g else (p + 2) % N) * I + c
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="{c}">\n'
                           + _step(0, "r", "i", 0, "o", do) + "\n    </tb>")
                tid += 1
        for c in range(I):
            for p in range(N):
                if p == g:
                    continue
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="{c}">\n'
                           + _step(0, "s", "i", p * I + c, "o", 0) + "\n    </tb>")
                tid += 1
        gpus.append(f'  <gpu id="{g}" i_chunks="{C}" o_chunks="{C}" s_chunks="0">\n' + "\n".join(tbs)
                    + "\n  </gpu>")
    return _alltoall_algo(f"alltoall_allpairs_i{I}", proto, I, C, N, gpus, extra=' outofplace="1" minBytes="0" maxBytes="0"')


def hierarchical_xml(nnodes: int, G: int, proto: str = "Simple") -> str:
    """2-D hierarchical AllToAll on nnodes x G gpus (rank G*n + r).

    Phase 1 (channel 0): gpu (n, r) sends its block for (m, r2), m != n, into scratch slot
    m'*G + r of its local peer (n, r2) (m' = index of m among the other nodes) and copies its own
    block for (m, r) into its scratch slot m'*G + r; blocks for its own node go straight to the
    output. Phase 2 (channel 1): gpu (n, r) sends scratch slots m'*G .. m'*G+G-1 (cnt G) to
    (m, r), into output G*n .. G*n+G-1; it waits for the gathers through nop steps."""
    N = nnodes * G
    gpus = []
    for n in range(nnodes):
        for r in range(G):
            g = G * n + r
            others = [m for m in range(nnodes) if m != n]
            scr = len(others) * G
            tbs = []
            tid = 0
            gather_tbs = []
            # receive-only thread blocks from local peers (phase 1)
            for r2 in range(G):
                if r2 == r:
                    continue
                p = G * n + r2
                steps = []
                for k, m in enumerate(others):
                    steps.append(_step(len(steps), "r", "i", 0, "s", k * G + r2, hasdep=1))
                steps.append(_step(len(steps), "r", "i", 0, "o", p))
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                gather_tbs.append(tid)
                tid += 1
            # send-only thread blocks to local peers (phase 1)
            own_tb = None
            for r2 in range(G):
                if r2 == r:
                    continue
                p = G * n + r2
                steps = [_step(k, "s", "i", G * m + r2, "o", 0) for k, m in enumerate(others)]
                steps.append(_step(len(steps), "s", "i", p, "o", 0))
                if own_tb is None:
                    for k, m in enumerate(others):
                        steps.append(_step(len(steps), "cpy", "i", G * m + r, "s", k * G + r, hasdep=1))
                    steps.append(_step(len(steps), "cpy", "i", g, "o", g))
                    own_tb = tid
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                tid += 1
            if own_tb is None:   # G == 1: a thread block of its own for the copies
                steps = [_step(k, "cpy", "i", G * m + r, "s", k * G + r, hasdep=1) for k, m in enumerate(others)]
                steps.append(_step(len(steps), "cpy", "i", g, "o", g))
                tbs.append(f'    <tb id="{tid}" send="-1" recv="-1" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                own_tb = tid
                tid += 1
            # phase 2: receive from and send to the same local id on every other node
            for k, m in enumerate(others):
                p = G * m + r
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="1">\n'
                           + _step(0, "r", "i", 0, "o", G * m, cnt=G) + "\n    </tb>")
                tid += 1
            for k, m in enumerate(others):
                p = G * m + r
                waits = [(t, k) for t in gather_tbs] + [(own_tb, len(others) + 1 + k if G > 1 else k)]
                steps = []
                for t, s in waits[:-1]:
                    steps.append(_step(len(steps), "nop", "i", -1, "o", -1, cnt=0, depid=t, deps=s))
                t, s = waits[-1]
                steps.append(_step(len(steps), "s", "s", k * G, "o", 0, cnt=G, depid=t, deps=s))
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="1">\n' + "\n".join(steps) + "\n    </tb>")
                tid += 1
            gpus.append(f'  <gpu id="{g}" i_chunks="{N}" o_chunks="{N}" s_chunks="{scr}">\n' + "\n".join(tbs)
                        + "\n  </gpu>")
    return _alltoall_algo(f"hierarchical_all_to_all_{nnodes}x{G}", proto, 2, N, N, gpus)


def binary_tree_allreduce(n: int) -> str:
    """A binary-tree AllReduce over ``n`` ranks (rank ``i``'s parent ``(i - 1) // 2``: the tree
    ReduceScatter then the tree AllGather of :func:`~hccc.compiler.frontend.generators.tree_allreduce`)
    in msccl-tools' XML, as the MSCCL XML export writes it (in and out of place)."""
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.interop.msccl_export import export_algorithm
    edges = [((i - 1) // 2, i) for i in range(1, n)]
    return export_algorithm(gen.tree_allreduce(n, edges, name=f"binary_tree_allreduce_{n}"), None)[1]
