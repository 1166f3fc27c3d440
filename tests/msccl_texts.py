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
