#!/usr/bin/env python3
"""Write the sample MSCCL XML algorithms in this folder (deterministic; independent of hccc's exporter).

    python examples/msccl/generate.py            # (re)write the .xml files next to this script
    python examples/msccl/generate.py --check    # exit 1 if a file is missing or out of date

Each algorithm is spelled out step by step in the two shapes found in the wild:

* msccl-tools output (``<algo>`` without ``outofplace``/``minBytes``/``maxBytes``, comments none):
  ``allreduce_ring_4.xml`` (one TB per rank doing s / rrs / rrcs / rcs / r around a ring, in place on
  the input buffer) and ``reducescatter_ring_4.xml`` (out of place, rrs chains ending in rrc);
* the runtime dialect the MSCCL executor / RCCL ship: ``allreduce_allpairs_4.xml`` (scratch, local
  ``cpy`` + a chain of ``re``, ``nop`` steps carrying extra dependencies, ``hasdep`` targets) and
  ``allgather_direct_4.xml`` (in place only, ``i_chunks="0"``, two chunks per rank on two channels).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def step(s, typ, sb="i", so=-1, db="o", do=-1, cnt=1, depid=-1, deps=-1, hasdep=0) -> str:
    return (f'      <step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
            f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


def allreduce_ring(n: int = 4) -> str:
    """Chunk c is reduced along c -> c+1 -> ... -> c-1 (rrs), stored at c-1 (rrcs), then copied
    around (rcs) until c-2 receives it (r). Everything lives in the input buffer (in place)."""
    out = [f'<algo name="allreduce_ring" proto="Simple" nchannels="1" nchunksperloop="{n}" ngpus="{n}" '
           f'coll="allreduce" inplace="1">']
    for r in range(n):
        out.append(f'  <gpu id="{r}" i_chunks="{n}" o_chunks="0" s_chunks="0">')
        out.append(f'    <tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">')
        s = 0
        out.append(step(s, "s", "i", r, "i", r))
        s += 1
        for j in range(1, n - 1):
            c = (r - j) % n
            out.append(step(s, "rrs", "i", c, "i", c))
            s += 1
        c = (r + 1) % n
        out.append(step(s, "rrcs", "i", c, "i", c))
        s += 1
        for j in range(1, n - 1):
            c = (r + 1 - j) % n
            out.append(step(s, "rcs", "i", c, "i", c))
            s += 1
        c = (r + 2) % n
        out.append(step(s, "r", "i", c, "i", c))
        out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def reducescatter_ring(n: int = 4) -> str:
    """Chunk c starts at c+1 (s), is reduced on through c+2 .. c-1 (rrs) and lands in rank c's
    output (rrc of its own input contribution). Out of place."""
    out = [f'<algo name="reducescatter_ring" proto="LL" nchannels="1" nchunksperloop="{n}" ngpus="{n}" '
           f'coll="reducescatter" inplace="0">']
    for r in range(n):
        out.append(f'  <gpu id="{r}" i_chunks="{n}" o_chunks="1" s_chunks="0">')
        out.append(f'    <tb id="0" send="{(r + 1) % n}" recv="{(r - 1) % n}" chan="0">')
        c = (r - 1) % n
        out.append(step(0, "s", "i", c, "i", c))
        for j in range(2, n):
            c = (r - j) % n
            out.append(step(j - 1, "rrs", "i", c, "i", c))
        out.append(step(n - 1, "rrc", "i", r, "o", 0))
        out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def allreduce_allpairs(n: int = 4) -> str:
    """Rank r owns chunk r. TB p (one per peer p) sends input chunk p to p's scratch slot r and
    receives p's contribution to chunk r into scratch slot p; the local TB copies input chunk r to
    the output and reduces the n-1 scratch slots into it (waiting for every peer TB: nops); then
    every peer TB sends the result and receives chunk p."""
    out = [f'<algo name="allreduce_allpairs" proto="LL128" nchannels="1" nchunksperloop="{n}" ngpus="{n}" '
           f'coll="allreduce" inplace="1" outofplace="1" minBytes="0" maxBytes="65536">']
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        local = len(peers)
        out.append(f'  <gpu id="{r}" i_chunks="{n}" o_chunks="{n}" s_chunks="{n}">')
        last_re = 0
        for t, p in enumerate(peers):
            out.append(f'    <tb id="{t}" send="{p}" recv="{p}" chan="0">')
            out.append(step(0, "s", "i", p, "s", r))
            out.append(step(1, "r", "i", r, "s", p, hasdep=1))
            last_re = len(peers) - 1 + 1 + len(peers) - 1
            out.append(step(2, "s", "o", r, "o", r, depid=local, deps=last_re))
            out.append(step(3, "r", "o", p, "o", p))
            out.append("    </tb>")
        out.append(f'    <tb id="{local}" send="-1" recv="-1" chan="0">')
        s = 0
        for t in range(len(peers) - 1):
            out.append(step(s, "nop", depid=t, deps=1))
            s += 1
        out.append(step(s, "cpy", "i", r, "o", r, depid=len(peers) - 1, deps=1))
        s += 1
        for j, p in enumerate(peers):
            out.append(step(s, "re", "s", p, "o", r, hasdep=1 if j == len(peers) - 1 else 0))
            s += 1
        assert s - 1 == last_re
        out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


def allgather_direct(n: int = 4, k: int = 2) -> str:
    """In place only: rank r's k chunks sit at output[r*k ..]; one TB per (peer, chunk) on channel
    j sends output chunk r*k+j to the peer and receives the peer's chunk p*k+j."""
    out = ['<!-- in-place all-pairs AllGather, two chunks per rank, one channel per chunk -->',
           f'<algo name="allgather_direct" proto="LL" nchannels="{k}" nchunksperloop="{n * k}" ngpus="{n}" '
           f'coll="allgather" inplace="1" outofplace="0" minBytes="0" maxBytes="8192">']
    for r in range(n):
        out.append(f'  <gpu id="{r}" i_chunks="0" o_chunks="{n * k}" s_chunks="0">')
        t = 0
        for p in range(n):
            if p == r:
                continue
            for j in range(k):
                out.append(f'    <tb id="{t}" send="{p}" recv="{p}" chan="{j}">')
                out.append(step(0, "s", "o", r * k + j, "o", r * k + j))
                out.append(step(1, "r", "o", p * k + j, "o", p * k + j))
                out.append("    </tb>")
                t += 1
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


FILES = {
    "allreduce_ring_4.xml": allreduce_ring,
    "reducescatter_ring_4.xml": reducescatter_ring,
    "allreduce_allpairs_4.xml": allreduce_allpairs,
    "allgather_direct_4.xml": allgather_direct,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a file is missing or out of date")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args(argv)
    stale = []
    for name, fn in FILES.items():
        text = fn()
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
