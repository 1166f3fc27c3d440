"""Test helper: small clusters and hand-made programs for the simulator's closed-form tests
(tests/test_simulator.py, tests/test_sim_unit_costs.py), and a hypothesis strategy of random small
clusters (:func:`clusters`: tests/test_sim_periodic.py, tests/test_synth_figure.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from hccc.compiler.cluster.topology import TopologyBuilder
from hccc.compiler.ir.check import check_all, check_structure
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, Op, ProgramIR

MiB = 1 << 20

def cluster(n: int, links: dict[tuple[int, int], tuple[float, int, float]] | None = None, *,
            gbps: float = 25, lanes: int = 1, alpha_us: float = 0.0, gamma=None,
            groups: list[tuple[list[tuple[int, int]], float]] = ()):
    """One node of ``n`` GPUs. ``links`` maps (u, v) -> (GB/s per lane, lanes, alpha us); without it
    a full mesh of identical links. ``groups``: (member links, capacity GB/s)."""
    b = TopologyBuilder("test")
    b.add_node("node1", n, gamma_gbps=gamma)
    if links is None:
        links = {(u, v): (gbps, lanes, alpha_us) for u in range(n) for v in range(n) if u != v}
    ids = {}
    for (u, v), (bw, ln, a) in links.items():
        pid = b.params("direct", bw, ln, a)
        ids[(u, v)] = int(b.add_links([u], [v], pid)[0])
    for k, (members, cap) in enumerate(groups):
        b.add_group("switch", "a->b", f"g{k}", [ids[m] for m in members], cap, 1, 0)
    return b.build()


_BUFS = {  # op -> (src_buf, dst_buf) for an AllReduce-shaped IR (input and output hold every chunk)
    Op.SEND: (Buf.INPUT, Buf.NONE), Op.RECV: (Buf.NONE, Buf.OUTPUT),
    Op.RECV_REDUCE_COPY: (Buf.INPUT, Buf.OUTPUT), Op.RECV_COPY_SEND: (Buf.NONE, Buf.OUTPUT),
    Op.RECV_REDUCE_SEND: (Buf.INPUT, Buf.NONE), Op.RECV_REDUCE_COPY_SEND: (Buf.INPUT, Buf.OUTPUT),
}


def hand_ir(nranks: int, nchunks: int, tbs: list[tuple[int, list[tuple]]], deps=(), *,
            chunk_bytes: int = MiB, collective: str = "allreduce", check: bool = True) -> ProgramIR:
    """A ProgramIR from TB programs. ``tbs``: (rank, [(op, send_peer, recv_peer, chunk[, count])...])
    in TB order per rank; ``deps``: ((rank, tb, seq), (rank, tb, seq)) = first waits for second."""
    rows = []
    tb_of_rank: dict[int, int] = {}
    for rank, prims in tbs:
        tb = tb_of_rank.get(rank, 0)
        tb_of_rank[rank] = tb + 1
        for seq, pr in enumerate(prims):
            op, sp, rp, ch = pr[:4]
            cnt = pr[4] if len(pr) > 4 else 1
            sb, db = _BUFS[op]
            rows.append(dict(rank=rank, tb=tb, seq=seq, pipeline=0, op=int(op), send_peer=sp,
                             recv_peer=rp, channel=0, src_buf=int(sb), src_off=ch if sb else 0,
                             dst_buf=int(db), dst_off=ch if db else 0, count=cnt, task=-1, task2=-1))
    rows.sort(key=lambda r: (r["rank"], r["tb"], r["seq"]))
    prims = {k: np.array([r[k] for r in rows], dtype=dt) for k, dt in PRIM_COLUMNS.items()}
    index = {(r["rank"], r["tb"], r["seq"]): i for i, r in enumerate(rows)}
    dp = np.array([index[a] for a, _ in deps], dtype=np.int64)
    do = np.array([index[b] for _, b in deps], dtype=np.int64)
    ntbs = np.array([tb_of_rank.get(r, 0) for r in range(nranks)], dtype=np.int32)
    ir = ProgramIR(name="hand", collective=collective, nranks=nranks, nchunks=nchunks,
                   in_chunks=nchunks, out_chunks=nchunks, scratch_chunks=0, prims=prims, dep_prim=dp,
                   dep_on=do, chunk_bytes=chunk_bytes, npipelines=1, ntbs=ntbs)
    if check:
        check_all(ir)
    else:
        check_structure(ir)
    return ir


def single_transfer_ir(chunk_bytes=MiB):
    return hand_ir(2, 1, [(0, [(Op.SEND, 1, -1, 0)]), (1, [(Op.RECV, -1, 0, 0)])], chunk_bytes=chunk_bytes)


@st.composite
def clusters(draw, n: int):
    """``n`` ranks in one or two nodes, every pair linked at a drawn bandwidth and latency, and
    at most one shared group over some of the links."""
    b = TopologyBuilder("random")
    cut = draw(st.integers(1, n)) if n > 1 else n
    b.add_node("a", cut)
    if cut < n:
        b.add_node("b", n - cut)
    ids = []
    for u in range(n):
        for v in range(n):
            if u != v:
                bw = draw(st.sampled_from([5, 12.5, 25, 50]))
                alpha = draw(st.sampled_from([0, 0.5, 2, 6]))
                ids.append(int(b.add_links([u], [v], b.params("direct", bw, 1, alpha))[0]))
    if draw(st.booleans()):
        members = draw(st.lists(st.sampled_from(ids), min_size=2, max_size=min(6, len(ids)), unique=True))
        b.add_group("switch", "a->b", "g0", members, draw(st.sampled_from([4, 10, 30])), 1, 0)
    return b.build()


def periodic_call(data, min_micro_batches: int):
    """Draw a call for the periodic simulation's tests: a random valid program of a tree collective
    (2-6 ranks, 1 or 2 channels, 256-byte chunks) prepared on a random cluster (:func:`clusters`),
    and a size of ``min_micro_batches`` to 160 micro-batches a chunk, a few bytes short or not.
    Returns (prepared program, cluster, bytes)."""
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.simulator import prepare
    from hccc.testing import valid_programs
    alg = data.draw(valid_programs(["allgather", "reducescatter", "allreduce", "broadcast"], max_ranks=6,
                                   min_ranks=2), label="algorithm")
    topo = data.draw(clusters(alg.header.nranks), label="cluster")
    ir = build_program(alg, chunk_bytes=256)
    ir.nchannels = data.draw(st.sampled_from([1, 2]), label="channels")
    prog = prepare(ir, topo)
    nmb = data.draw(st.integers(min_micro_batches, 160), label="micro-batches")
    nbytes = prog.nchunks * 256 * nmb - data.draw(st.sampled_from([0, 4, 100]), label="short by")
    return prog, topo, nbytes
