"""Direct-mode safety (compiler/ir/direct.py), checked by running the programs.

Oracle: an executor written here, independent of the analysis. It runs a ProgramIR one primitive
at a time (one micro-batch, integer sums) with eager senders (every runnable pure send first,
unbounded FIFOs), in two modes: the FIFO protocol, and direct mode for a chosen set of receives,
where the sender writes the receiver's destination at the moment it sends and the receive moves
nothing. A set of receives is safe when both modes leave the same outputs, in place and out of
place. Every receive the analysis marks safe must pass; marking every candidate direct must fail
on some program (so the oracle can fail).
"""
from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.direct import DIRECT_OPS, direct_safe
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.passes.build import build_program
from hccc.testing import valid_programs

SENDS = {Op.SEND, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND}
RECVS = {Op.RECV, Op.RECV_REDUCE_COPY, Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND}


def run(ir, direct: set[int], inplace: bool, seed: int = 0) -> dict:
    p = ir.prims
    n = ir.nprims
    N = ir.nranks
    rng = np.random.default_rng(seed)

    def base(nb, r):
        return r * nb if 0 < nb < ir.nchunks and nb * N == ir.nchunks else 0

    def loc(r, buf, off):
        if buf == Buf.SCRATCH:
            return (r, "s", off)
        if inplace:
            return (r, "io", off + base(ir.in_chunks if buf == Buf.INPUT else ir.out_chunks, r))
        return (r, "in" if buf == Buf.INPUT else "out", off)

    mem = {}
    for r in range(N):
        for j in range(ir.in_chunks):
            mem[loc(r, Buf.INPUT, j)] = int(rng.integers(1, 1 << 20))
    get = lambda k: mem.get(k, 0)  # noqa: E731
    # TB queues, message matching (k-th send <-> k-th receive per connection)
    tbs = defaultdict(list)
    for i in np.lexsort((p["seq"], p["tb"], p["rank"])).tolist():
        tbs[(int(p["rank"][i]), int(p["tb"][i]))].append(i)
    sends, recvs = defaultdict(list), defaultdict(list)
    for lst in tbs.values():
        for i in lst:
            o, r, ch = Op(int(p["op"][i])), int(p["rank"][i]), int(p["channel"][i])
            if o in SENDS:
                sends[(r, int(p["send_peer"][i]), ch)].append(i)
            if o in RECVS:
                recvs[(int(p["recv_peer"][i]), r, ch)].append(i)
    peer_recv = {}
    for k, s in sends.items():
        for a, b in zip(s, recvs[k]):
            peer_recv[a] = b
    deps = defaultdict(list)
    for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        deps[a].append(b)
    fifo = defaultdict(deque)
    done = np.zeros(n, bool)
    head = {k: 0 for k in tbs}

    def cnt(i):
        return max(int(p["count"][i]), 0)

    def read(i, side):
        r = int(p["rank"][i])
        return [get(loc(r, int(p[f"{side}_buf"][i]), int(p[f"{side}_off"][i]) + k)) for k in range(cnt(i))]

    def write(i, vals):
        r = int(p["rank"][i])
        for k, v in enumerate(vals):
            mem[loc(r, int(p["dst_buf"][i]), int(p["dst_off"][i]) + k)] = v

    def runnable(i):
        o = Op(int(p["op"][i]))
        if not all(done[d] for d in deps[i]):
            return False
        if o in RECVS:
            return bool(fifo[(int(p["recv_peer"][i]), int(p["rank"][i]), int(p["channel"][i]))])
        return True

    def fire(i):
        o = Op(int(p["op"][i]))
        r = int(p["rank"][i])
        msg = None
        if o in RECVS:
            msg = fifo[(int(p["recv_peer"][i]), r, int(p["channel"][i]))].popleft()
            if i in direct:
                msg = read(i, "dst")     # the sender already wrote it there
        if o == Op.SEND:
            out = read(i, "src")
        elif o == Op.RECV:
            write(i, msg); out = None
        elif o == Op.RECV_REDUCE_COPY:
            write(i, [a + b for a, b in zip(msg, read(i, "src"))]); out = None
        elif o == Op.RECV_COPY_SEND:
            write(i, msg); out = msg
        elif o == Op.RECV_REDUCE_SEND:
            out = [a + b for a, b in zip(msg, read(i, "src"))]
        elif o == Op.RECV_REDUCE_COPY_SEND:
            out = [a + b for a, b in zip(msg, read(i, "src"))]; write(i, out)
        elif o == Op.COPY:
            write(i, read(i, "src")); out = None
        elif o == Op.REDUCE:
            write(i, [a + b for a, b in zip(read(i, "dst"), read(i, "src"))]); out = None
        else:
            out = None
        if o in SENDS:
            j = peer_recv[i]
            if j in direct:
                write(j, out)            # straight into the receiver's destination
            fifo[(r, int(p["send_peer"][i]), int(p["channel"][i]))].append(out)
        done[i] = True

    while True:
        ready = [lst[head[k]] for k, lst in tbs.items() if head[k] < len(lst) and runnable(lst[head[k]])]
        if not ready:
            break
        # eager senders: pure sends first, then anything else
        ready.sort(key=lambda i: (Op(int(p["op"][i])) != Op.SEND, i))
        i = ready[0]
        fire(i)
        k = (int(p["rank"][i]), int(p["tb"][i]))
        head[k] += 1
    assert done.all(), "the executor got stuck"
    return {k: v for k, v in mem.items() if k[1] in ("out", "io")}


def _assert_safe(ir, chosen):
    for inplace in (False, True):
        assert run(ir, chosen, inplace) == run(ir, set(), inplace), \
            f"direct receives {sorted(chosen)} change the result (in place: {inplace})"


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                        "alltoall"])
@settings(max_examples=examples(12))
@given(data=st.data())
def test_direct_safe_receives_keep_the_result(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    ir = build_program(alg, fuse=data.draw(st.booleans(), label="fuse"))
    safe = direct_safe(ir)
    assert not (safe & ~np.isin(ir.prims["op"], [int(o) for o in DIRECT_OPS])).any()
    _assert_safe(ir, set(np.flatnonzero(safe).tolist()))


@pytest.mark.parametrize("make,fuse", [(lambda: gen.ring_allgather(6), False), (lambda: gen.ring_allreduce(5), False),
                                        (lambda: gen.ring_allreduce(5), True), (lambda: gen.hm_allreduce(2, 3), False)])
def test_examples_have_direct_receives(make, fuse):
    """Copy-only receives of rings and HM programs: the AllGather halves are all direct-safe."""
    ir = build_program(make(), fuse=fuse)
    safe = direct_safe(ir)
    cand = np.isin(ir.prims["op"], [int(o) for o in DIRECT_OPS])
    assert safe.any() and (safe <= cand).all()
    _assert_safe(ir, set(np.flatnonzero(safe).tolist()))


def test_the_oracle_catches_an_unsafe_direct_receive():
    """Marking every copy-only receive direct, proven or not, breaks an in-place ring AllToAll:
    a block relayed through a rank lands in a slot whose own block that rank has still to send.
    The analysis refuses those receives, and the executor shows the damage."""
    ir = build_program(gen.ring_alltoall(4))
    cand = set(np.flatnonzero(np.isin(ir.prims["op"], [int(o) for o in DIRECT_OPS])).tolist())
    safe = set(np.flatnonzero(direct_safe(ir)).tolist())
    assert cand - safe
    assert run(ir, cand, True) != run(ir, set(), True)
    _assert_safe(ir, safe)


# ---------------------------------------------------------------------------- the kernels
COLLECTIVES = ["allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("collective", COLLECTIVES)
# two builds a collective by default (the kernel property and fused-channel files run direct mode,
# hccc's default, on random programs too); the thorough profile ten times that
@settings(max_examples=examples(2))
@given(data=st.data())
def test_direct_kernels_match_oracle(collective, data):
    """Random programs (fused or not) whose proven receives run in direct mode on the CPU
    emulation (every rank's peers known): what the reference executor computes, and the
    collective, at random sizes, dtypes, operators, in place or not, one grid or a grid per rank,
    specialised kernels or the table mode's generic ones."""
    from hccc.compiler.backend.direct_fields import direct_fields
    from hccc.testing import describe_failure, kernel_cases, run_case

    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))
    dx = direct_fields(ir)
    assert (dx is None) == (not direct_safe(ir).any())
    case = data.draw(kernel_cases(ir, max_microbatches=12), label="case")
    res = run_case(ir, case, one_grid=data.draw(st.sampled_from([None, False]), label="one_grid"),
                   codegen=data.draw(st.sampled_from(["specialized", "table"]), label="codegen"))
    assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)


def test_direct_fields_pair_both_ends():
    """Every direct receive's message comes from a send marked direct with the receiver's
    destination, and nothing else is marked."""
    from hccc.compiler.backend.direct_fields import direct_fields
    from hccc.compiler.ir.connections import match_connections

    ir = build_program(gen.ring_allreduce(5), fuse=True)
    dx = direct_fields(ir)
    safe = direct_safe(ir)
    p = ir.prims
    sends, recvs = match_connections(ir)
    pair = dict(zip(recvs.tolist(), sends.tolist()))
    expect_send = {pair[i] for i in np.flatnonzero(safe).tolist()}
    assert set(np.flatnonzero(dx["direct"] & 2).tolist()) == set(np.flatnonzero(safe).tolist())
    assert set(np.flatnonzero(dx["direct"] & 1).tolist()) == expect_send
    for i in np.flatnonzero(safe).tolist():
        s = pair[i]
        assert dx["dpeer"][s] == p["rank"][i] and dx["pbuf"][s] == p["dst_buf"][i]
        assert dx["poff"][s] == p["dst_off"][i]
    assert direct_fields(ir, "off") is None


def test_compile_direct_option(tmp_path):
    from pathlib import Path

    from hccc.cli import main

    algo = str(Path(__file__).resolve().parent.parent / "examples" / "ring_allreduce_8.rccl")

    def direct_lines(*opts):
        out = tmp_path / f"o{len(list(tmp_path.iterdir()))}"
        assert main([algo, "-o", str(out), *opts]) == 0
        return sum(f.read_text().count("HCCC_PX(") + f.read_text().count("HCCC_PWX(")
                   for f in out.glob("*_r[0-9]*.cu"))

    assert direct_lines() > 0
    assert direct_lines("--direct", "off") == 0


def test_run_direct_option(capsys):
    """``hccc run --direct off`` builds kernels without direct fields (the FIFO for every
    primitive) and ``auto`` with them; both compute the collective. The Runner keys its generated
    sources by the mode, so the two never share a cache entry."""
    import json
    from pathlib import Path

    from hccc.cli import main
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.generated import GeneratedProgram
    from hccc.runtime.launcher import Runner

    algo = Path(__file__).resolve().parent.parent / "examples" / "ring_allgather_8.rccl"
    for mode in ("auto", "off"):
        assert main(["run", str(algo), "-b", "4K", "-e", "4K", "--direct", mode, "--json"]) == 0
        res = json.loads(capsys.readouterr().out)
        rows = res["results"] if isinstance(res, dict) else res
        assert rows and all(r["wrong"] == 0 for r in rows)
    ir = load_program(algo)
    # the sources a runner builds in each mode (the one generation of them: GeneratedProgram)
    a, b = (GeneratedProgram(ir, ["cuda"] * ir.nranks, None, "specialized", mode) for mode in ("auto", "off"))
    assert a.gendir != b.gendir
    count = [sum(f.read_text().count(m) for f in g.gendir.iterdir() if f.suffix in (".cu", ".hip")
                 for m in ("HCCC_PX(", "HCCC_PWX(")) for g in (a, b)]
    assert count[0] > 0 and count[1] == 0
    with Runner(ir, "cpu", direct="auto") as a, Runner(ir, "cpu", direct="off") as b:
        assert a.direct_receives() > 0 and b.direct_receives() == 0
    with pytest.raises(ValueError, match="direct mode"):
        Runner(ir, "cpu", direct="on")
