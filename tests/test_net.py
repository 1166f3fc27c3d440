"""Ranks on several nodes: cross-node connections through the network transport (UCX over TCP,
``UCX_TLS=tcp``), nodes named per rank (``node=``) so one machine runs several; CPU emulation.
Every result is compared with the collective's definition (:func:`hccc.runtime.reference.expected`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime import reference

from cli_runs import run_cli
from rank_pool import RankPool, run_fresh
from communicator_calls import no_leaks, require_torch, calls_for, check  # noqa: F401 (autouse fixture)
from net_ranks import TCP, have_ucx, run_ranks

#: the name tests/test_mscclpp_*.py and test_alltoallv_comm.py still import from here
_have_ucx = have_ucx


pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed"),
              pytest.mark.skipif(not have_ucx() and not os.environ.get("HCCC_REQUIRE_COMPILERS"),
                                 reason="UCX (libucx-dev) not installed")]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    require_torch()
    p = RankPool(4, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


def test_placement_problems():
    """Placement checks against the algorithm's nodes and vendors (no processes)."""
    from hccc.runtime.net import placement_problems
    assert placement_problems(["a", "a", "b", "b"], ["cuda"] * 4, 2) == []
    assert placement_problems(["a", "a", "b", "b"], ["cuda"] * 4, 0) == []
    split = placement_problems(["a", "b", "a", "b"], ["cuda"] * 4, 2)
    assert split and "GPUPerNode=2" in split[0]
    merged = placement_problems(["a", "a", "a", "a"], ["cuda"] * 4, 2)
    assert merged == []                       # one node only: nothing crosses a network
    merged = placement_problems(["a", "a", "a", "b"], ["cuda"] * 4, 2)
    assert any("places on 2 nodes" in m for m in merged)
    mixed = placement_problems(["a", "a", "b", "b"], ["cuda", "hip", "hip", "hip"])
    assert mixed and "node a holds ranks of CUDA and HIP" in mixed[0]


def test_declared_gpus_per_node():
    from hccc.runtime.net import declared_gpus_per_node, placement_problems
    root = Path(__file__).resolve().parent.parent / "examples"
    assert declared_gpus_per_node(root / "hm_allreduce_2x4.rccl") == 4
    assert declared_gpus_per_node(str(root / "hm_allgather_4x4.rccl")) == 4
    assert declared_gpus_per_node(root / "msccl") == 0
    G = declared_gpus_per_node(root / "hm_allreduce_2x4.rccl")
    assert placement_problems([f"n{r // 4}" for r in range(8)], ["cuda"] * 8, G) == []
    assert placement_problems([f"n{r % 2}" for r in range(8)], ["cuda"] * 8, G)


def test_declared_nodes_of_every_input_form(tmp_path):
    """Where each input form says which ranks share a node: an algorithm's GPUPerNode, a
    ProgramIR's gpus_per_node (kept in its JSON), an MSCCL XML's nnodes, a compiled OUTDIR's
    cluster (nodes of any sizes); and what the placement check makes of it."""
    from hccc.compiler.pipeline import load_program
    from hccc.runtime.net import declared_nodes, placement_problems
    from hccc.util.diagnostics import CompileError, render_all
    root = Path(__file__).resolve().parent.parent / "examples"
    rccl = root / "hm_allreduce_2x4.rccl"
    ir = load_program(rccl)
    assert declared_nodes(rccl, ir) == ([0] * 4 + [1] * 4, "GPUPerNode=4")
    assert declared_nodes(ir, ir) is None                 # a ProgramIR without gpus_per_node
    # MSCCL XML: <algo nnodes=...>, carried on into the ProgramIR JSON
    xml = (root / "msccl" / "allreduce_ring_4.xml").read_text().replace("<algo ", '<algo nnodes="2" ', 1)
    (tmp_path / "ring.xml").write_text(xml)
    xir = load_program(tmp_path / "ring.xml")
    assert declared_nodes(tmp_path / "ring.xml", xir) == ([0, 0, 1, 1], "gpus_per_node=2")
    (tmp_path / "ring.json").write_text(xir.to_json())
    jir = load_program(tmp_path / "ring.json")
    assert declared_nodes(tmp_path / "ring.json", jir) == ([0, 0, 1, 1], "gpus_per_node=2")
    bad = placement_problems(["a", "b", "a", "b"], ["cuda"] * 4, assumed=declared_nodes(None, jir))
    assert bad and "gpus_per_node=2" in bad[0]
    (tmp_path / "bad.xml").write_text(xml.replace('nnodes="2"', 'nnodes="3"'))
    with pytest.raises(CompileError) as err:
        load_program(tmp_path / "bad.xml")
    assert re.search(r"bad\.xml:\d+:\d+: error: nnodes=3 does not divide ngpus=4", render_all(err.value))
    # an OUTDIR compiled for a cluster: its nodes, whatever the header says
    out = tmp_path / "out"
    res = run_cli(rccl, "-o", out, "--topology", root / "clusters" / "a100_topo1.topo")
    assert res.returncode == 0, res.stderr
    want, why = declared_nodes(out, ir)
    assert want == [0] * 4 + [1] * 4 and "a100_topo1" in why
    assert declared_nodes(out / "manifest.json", ir)[0] == want
    assert placement_problems([f"n{r // 4}" for r in range(8)], ["cuda"] * 8,
                              assumed=(want, why)) == []
    # uneven nodes (3 + 5) from a cluster; a header whose node size does not divide says nothing
    uneven = [0] * 3 + [1] * 5
    assert placement_problems(["x"] * 3 + ["y"] * 5, ["cuda"] * 8, assumed=(uneven, "c")) == []
    split = placement_problems(["x"] * 4 + ["y"] * 4, ["cuda"] * 8, assumed=(uneven, "c"))
    assert any("places on 2 nodes" in m for m in split)
    ir.origin = dataclasses.replace(ir.origin, gpus_per_node=3)
    assert declared_nodes(None, ir) is None


def test_node_names(monkeypatch):
    from hccc.runtime.net import node_name
    monkeypatch.setenv("HCCC_NODE", "n7")
    assert node_name() == "n7" and node_name("x") == "x"
    monkeypatch.delenv("HCCC_NODE")
    import socket
    assert node_name() == socket.gethostname()
    with pytest.raises(ValueError):
        node_name("two words")


def test_two_proxies_in_one_process_carry_a_slot_and_trace_their_steps(monkeypatch):
    """Two transports of one process as two nodes over TCP, driven without kernels: the sender's
    mirror slot and tail reach the receiver's FIFO and tail word (whole slot before the tail),
    the credit comes back, and the steps each progress thread records (the benchmark's
    breakdown of a message's time) come in their order: tail seen, then puts issued on the
    sender and the tail written at the receiver."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    from hccc.runtime.net_ucx import UcxTransport
    slot, nslots = 64, 8
    mem = {r: {"ctrl": np.zeros(8, dtype=np.uint64), "slots": np.zeros(slot * nslots, np.uint8)} for r in (0, 1)}
    mslots, mwords = np.zeros(slot * nslots, np.uint8), np.zeros(2, dtype=np.uint64)
    tx = {r: UcxTransport(r, 2) for r in (0, 1)}
    try:
        keys = {r: [tx[r].register(mem[r][k].ctypes.data, mem[r][k].nbytes)
                    for k in ("ctrl", "slots")] for r in (0, 1)}
        tx[0].register(mslots.ctypes.data, mslots.nbytes, remote=False)
        for r in (0, 1):
            tx[r].connect(1 - r, tx[1 - r].address(), keys[1 - r])
        # rank 0 sends: its mirror of rank 1's FIFO and tail; rank 1 returns credits into rank
        # 0's head (ctrl[1]) from its mirror word
        tx[0].add_send(1, mslots.ctypes.data, mwords.ctypes.data, mem[1]["slots"].ctypes.data,
                       mem[1]["ctrl"].ctypes.data, slot, nslots)
        tx[1].add_recv(0, mwords.ctypes.data + 8, mem[0]["ctrl"].ctypes.data + 8)
        tx[1].add_watch(mem[1]["ctrl"].ctypes.data)
        tx[0].set_shape(0, 0, 1)                      # whole slots
        for r in (0, 1):
            tx[r].trace(1000)
            tx[r].start()
        want = np.arange(1, slot * 2 + 1, dtype=np.uint8)
        mslots[:2 * slot] = want
        mwords[0] = 2                                  # two slots published
        deadline = time.monotonic() + 30
        while mem[1]["ctrl"][0] < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert mem[1]["ctrl"][0] == 2, "the tail did not arrive"
        assert np.array_equal(mem[1]["slots"][:2 * slot], want)
        mwords[1] = 2                                  # rank 1 frees both slots
        while mem[0]["ctrl"][1] < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert mem[0]["ctrl"][1] == 2, "the credit did not come back"
        sent, got = tx[0].trace_take(), tx[1].trace_take()
        seen = [int(t) for t, k, i, v in sent if (k, i, v) == (1, 0, 2)]
        issued = [int(t) for t, k, i, v in sent if (k, i, v) == (2, 0, 2)]
        landed = [int(t) for t, k, i, v in got if (k, i, v) == (3, 0, 2)]
        assert len(seen) == len(issued) == len(landed) == 1, (sent, got)
        # issued is stamped after the put call returns, which may be after the tail has landed
        assert seen[0] <= issued[0] and seen[0] <= landed[0]
        tx[0].trace(0)
        assert len(tx[0].trace_take()) == 0
    finally:
        for t in tx.values():
            t.close()


def run_nodes(pool, ir, count, nodes, dtype="float32", op="sum", seed=0, ncalls=1, **extra):
    calls, want, count = calls_for(ir, count, dtype, op, seed)
    calls = [c * ncalls for c in calls]
    replies = pool.run(ir.to_json(), ir.nranks, calls, dtype=dtype, op=op, nodes=nodes, env=TCP,
                       **extra)
    check(replies, want, f"{ir.name} on nodes {nodes} ({count} x {dtype} {op})", ncalls)


@pytest.mark.slow   # 6.6 s; test_net_am.py's AllReduce across two nodes runs by default
def test_two_nodes_of_two(pool):
    """2 nodes x 2 ranks, a ring AllReduce whose ring crosses the nodes twice, two calls."""
    ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=256)
    run_nodes(pool, ir, 1000, ["a", "a", "b", "b"], ncalls=2)


def _bf16_rank(rank, url, ir_json, nodes, inputs, q):
    """One rank of the bfloat16 job: torch bfloat16 tensors (numpy has none) through the
    Communicator; the results back as float32."""
    try:
        os.environ.update(TCP)
        import torch
        from hccc.compiler.ir.check import load_ir_json
        from hccc.runtime.communicator import Communicator
        outs = []
        with Communicator(load_ir_json(ir_json), rank=rank, world_size=len(nodes), init_method=url,
                          node=nodes[rank], dtype="bfloat16", timeout_s=60) as comm:
            for op, xs in inputs:
                x = torch.from_numpy(xs[rank]).to(torch.bfloat16)
                out = torch.full_like(x, float("nan"))
                comm.all_reduce(x, out=out, op=op)                  # out of place
                comm.all_reduce(x, op=op)                           # in place
                outs.append((out.float().numpy(), x.float().numpy()))
        q.put((rank, outs))
    except BaseException as exc:          # reported by the test
        q.put((rank, f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow
def test_bfloat16_across_nodes(tmp_path):
    """bfloat16 across processes and nodes (2 x 2, 2 channels, an uneven count): a sum of small
    integers and a max of values with every bfloat16 mantissa bit in use, in and out of place,
    against the definition rounded to bfloat16 (reference.round_bf16)."""
    require_torch()
    from hccc.compiler.passes.channels import with_channels
    ir = with_channels(build_program(gen.ring_allreduce(4, [0, 2, 1, 3]), chunk_bytes=256), 2)
    nodes = ["a", "a", "b", "b"]
    count = 1001
    rng = np.random.default_rng(7)
    ints = reference.make_inputs("allreduce", 4, count, "bfloat16", nchunks=ir.nchunks, seed=3)
    wide = [reference.round_bf16(rng.standard_normal(count).astype(np.float32) * 1e3)
            for _ in range(4)]
    inputs = [("sum", ints), ("max", wide)]
    got = run_ranks(_bf16_rank, 4, "file://" + str(tmp_path / "store"), ir.to_json(), nodes, inputs,
                    timeout=300, join=60)
    for r in range(4):
        assert not isinstance(got[r], str), f"rank {r}: {got[r]}"
        for (op, xs), (out, inplace) in zip(inputs, got[r]):
            want = reference.expected("allreduce", xs, op, nchunks=ir.nchunks, bf16=True)[r]
            assert np.array_equal(out, want), f"rank {r} {op} out of place"
            assert np.array_equal(inplace, want), f"rank {r} {op} in place"


# ------------------------------------------------------------------------------ bytes cross TCP
def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    res = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
                         capture_output=True)
    return res.returncode == 0


def run_namespaced(tmp_path, ir, count, nodes, dtype="float32", op="sum", seed=0, timeout=240):
    """Each node's ranks in a mount namespace of their own with a private /dev/shm (a cross-node
    rank that used shared memory could not find its peer's segments); returns (outputs or None,
    errors, puts) per rank."""
    out = tmp_path / "out"
    out.mkdir()
    job = {"ir": ir.to_json(), "world": ir.nranks, "url": "file://" + str(tmp_path / "store"),
           "nodes": nodes, "count": count, "dtype": dtype, "op": op, "seed": seed, "out": str(out)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    worker = str(Path(__file__).with_name("net_worker.py"))
    env = {**os.environ, **TCP}
    procs = []
    for node in sorted(set(nodes)):
        ranks = [r for r, n in enumerate(nodes) if n == node]
        cmd = "mount -t tmpfs tmpfs /dev/shm && " + " ".join(
            f"{shlex.quote(sys.executable)} {shlex.quote(worker)} {shlex.quote(str(tmp_path / 'job.json'))} {r} &"
            for r in ranks) + " wait"
        procs.append(subprocess.Popen(["unshare", "-m", "sh", "-c", cmd], env=env))
    try:
        for p in procs:
            p.wait(timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    res, errs, puts = [], [], []
    for r in range(ir.nranks):
        f = out / f"{r}.npy"
        res.append(np.load(f) if f.exists() else None)
        e = out / f"{r}.err"
        errs.append(e.read_text() if e.exists() else None)
        pf = out / f"{r}.puts"
        puts.append(json.loads(pf.read_text()) if pf.exists() else None)
    return res, errs, puts


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m")


@pytest.mark.slow
@needs_unshare
def test_bytes_cross_tcp(tmp_path):
    """2 nodes x 2 ranks, each node in its own mount namespace (private /dev/shm): the result is
    right and every rank put bytes through UCX, so the cross-node data did not go through shared
    memory."""
    require_torch()
    ir = build_program(gen.ring_allreduce(4, [0, 2, 1, 3]), chunk_bytes=256)
    res, errs, puts = run_namespaced(tmp_path, ir, 777, ["a", "a", "b", "b"])
    _, want, _ = calls_for(ir, 777)
    for r in range(4):
        assert errs[r] is None, f"rank {r}: {errs[r]}"
        assert np.array_equal(res[r], want[r]), f"rank {r}: wrong result"
        assert puts[r][0] > 0 and puts[r][1] > 0, f"rank {r} put nothing over the network"


@pytest.mark.slow
@needs_unshare
def test_private_shm_really_separates(tmp_path):
    """The control: ranks that claim one node but sit in different namespaces cannot map each
    other's shared memory, so the test above would fail if cross-node ranks used it."""
    require_torch()
    ir = build_program(gen.ring_allreduce(2), chunk_bytes=256)
    job_nodes = ["a", "a"]
    out = tmp_path / "out"
    out.mkdir()
    job = {"ir": ir.to_json(), "world": 2, "url": "file://" + str(tmp_path / "store"),
           "nodes": job_nodes, "count": 64, "dtype": "float32", "op": "sum", "seed": 0,
           "out": str(out)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    worker = str(Path(__file__).with_name("net_worker.py"))
    procs = [subprocess.Popen(["unshare", "-m", "sh", "-c",
                               f"mount -t tmpfs tmpfs /dev/shm && {shlex.quote(sys.executable)} "
                               f"{shlex.quote(worker)} {shlex.quote(str(tmp_path / 'job.json'))} {r}"],
                              env={**os.environ, **TCP}) for r in range(2)]
    for p in procs:
        p.wait(240)
    errs = [(out / f"{r}.err").read_text() for r in range(2) if (out / f"{r}.err").exists()]
    assert errs and any("map a peer's memory" in e for e in errs), errs


# ------------------------------------------------------------------------------ failures
#: seconds a failed rank watches its threads and sockets before it answers (the least count seen):
#: a thread of the transport or of the kernel may still be on its way out when the error is raised
LEAK_SETTLE_S = 2.0


def _send_all(pool, ir, calls, nodes, **extra):
    url = "file://" + str(pool.tmpdir / f"store-{time.monotonic_ns()}")
    for r in range(ir.nranks):
        pool.workers[r][1].send({"ir": ir.to_json(), "rank": r, "world": ir.nranks, "url": url,
                                 "calls": calls[r], "nodes": nodes, "env": TCP, "timeout": 20.0,
                                 "kernel_timeout": 10.0, "settle_s": LEAK_SETTLE_S, **extra})


def _replies(pool, ranks, wait_s=120.0):
    out = {}
    for r in ranks:
        conn = pool.workers[r][1]
        try:
            out[r] = conn.recv() if conn.poll(wait_s) else {"ok": False, "error": "no answer"}
        except EOFError:
            out[r] = None
    return out


FAILURES = {
    "sigkill": {"die_in_kernel": True},
    "sigstop": {"stop_in_kernel": True},
    "dropped": {"sever_in_kernel": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(FAILURES))
def test_failed_rank_is_reported_with_its_node_and_nothing_leaks(tmp_path, how):
    """Rank 3 (node b) dies, stops, or loses its connections while the others run the kernel:
    every other rank gets a CommunicatorError naming rank 3 (and node b) within the timeout; the
    survivors' threads and sockets are back to what they were, and a later cross-node
    communicator in the same processes works."""
    require_torch()
    pool = RankPool(4, tmp_path)
    try:
        small = build_program(gen.ring_allreduce(3), chunk_bytes=256)
        scalls, swant, _ = calls_for(small, 300)
        _send_all(pool, small, scalls, ["a", "a", "b"])
        base = _replies(pool, range(3))
        check([base[r] for r in range(3)], swant, "before")
        ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=256)
        calls, _, _ = calls_for(ir, 1000)
        calls[3] = [dict(calls[3][0], **FAILURES[how])]
        t0 = time.monotonic()
        _send_all(pool, ir, calls, ["a", "a", "b", "b"])
        got = _replies(pool, range(3))
        took = time.monotonic() - t0
        for r in range(3):
            assert got[r] is not None and not got[r]["ok"], f"rank {r}: {got[r]}"
            err = got[r]["error"]
            assert "CommunicatorError" in err and "rank 3" in err, f"rank {r}: {err}"
            if r < 2 and how != "dropped":
                assert "node b" in err, f"rank {r}: {err}"
        assert took < 20.0 + 2 * 10.0 + 15, f"reported after {took:.0f} s"
        if how == "sigstop":
            p = pool.workers[3][0]
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
        elif how == "dropped":
            rep = _replies(pool, [3])[3]
            assert rep is not None and not rep["ok"], rep
        after_fail = {r: got[r]["resources"] for r in range(3)}
        _send_all(pool, small, scalls, ["a", "a", "b"])
        later = _replies(pool, range(3))
        check([later[r] for r in range(3)], swant, "after")
        for r in range(3):
            for what in ("threads", "sockets"):
                assert after_fail[r][what] <= base[r]["resources"][what], (r, what, after_fail[r],
                                                                            base[r]["resources"])
                assert later[r]["resources"][what] <= base[r]["resources"][what], (r, what)
    finally:
        for p, _ in pool.workers:
            if p.is_alive():
                p.kill()
        pool.close()


@pytest.mark.slow     # 6 s of network runs; the transport's own tests stay in the default set
def test_stray_connections_do_not_hurt(pool):
    """Garbage (empty, short, 64 KiB) sent to every TCP port the ranks listen on, after set-up and
    before a call: the call is still right."""
    ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=256)
    calls, want, count = calls_for(ir, 500)
    calls = [[dict(c[0], poke_ports=True)] for c in calls]
    replies = pool.run(ir.to_json(), 4, calls, nodes=["a", "a", "b", "b"], env=TCP)
    check(replies, want, "after stray connections")


# ------------------------------------------------------------------------------ coverage (slow)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def big_pool(tmp_path_factory):
    require_torch()
    p = RankPool(16, tmp_path_factory.mktemp("stores16"))
    yield p
    p.close()


def out_of_place(calls, want, coll):
    """The same calls with an output array (AllReduce / Broadcast / Reduce)."""
    if coll not in ("allreduce", "broadcast", "reduce"):
        return calls
    return [[dict(c, out=len(c["x"])) for c in cs] for cs in calls]


@pytest.mark.slow
@pytest.mark.parametrize("name,per_node", [("hm_allreduce_2x4.rccl", 4), ("hm_allgather_2x4.rccl", 4),
                                           ("hierarchical_alltoall_2x4.rccl", 4),
                                           ("hm_allgather_4x4.rccl", 4), ("hm_allreduce_4x4.rccl", 4),
                                           ("ring_allreduce_8.rccl", 2)])
def test_examples_across_nodes(big_pool, name, per_node):
    """Examples whose ranks span nodes, placed as the algorithm's GPUPerNode says (ring_allreduce_8
    on 4 nodes of 2): uneven counts, in and out of place."""
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / "examples" / name)
    nodes = [f"n{r // per_node}" for r in range(ir.nranks)]
    count = 4 * ir.nchunks + 3
    calls, want, count = calls_for(ir, count, seed=ir.nranks)
    for variant in (calls, out_of_place(calls, want, ir.collective)):
        replies = big_pool.run(ir.to_json(), ir.nranks, variant, nodes=nodes, env=TCP)
        check(replies, want, f"{name} on {len(set(nodes))} nodes")


def _compile_for_cluster(tmp_path, rccl: Path, topo: Path) -> Path:
    import subprocess as sp
    out = tmp_path / rccl.stem
    res = sp.run([sys.executable, "-m", "hccc", str(rccl), "-o", str(out), "--topology", str(topo)],
                 capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


def _cluster_nodes(topo) -> list[str]:
    """Node name of every rank of a cluster topology (ranks numbered node by node)."""
    out = []
    for i, nd in enumerate(topo.nodes):
        out += [f"node{i}"] * nd.ngpus
    return out


def _run_outdir(pool, outdir: Path, nodes, count, dtype="float32", op="sum"):
    from hccc.compiler.pipeline import load_manifest, manifest_path
    ir, plats = load_manifest(manifest_path(outdir))
    calls, want, count = calls_for(ir, count, dtype, op)
    # the job loads the OUTDIR (per-rank platforms from its manifest): each rank builds its
    # vendor's source
    replies = pool.run(str(outdir), ir.nranks, calls, dtype=dtype, op=op, nodes=nodes, env=TCP)
    check(replies, want, f"{outdir.name} on nodes {sorted(set(nodes))}")
    return plats


C2C = sorted((ROOT / "examples" / "c2c").glob("*.rccl"))


@pytest.mark.slow
@pytest.mark.parametrize("rccl", C2C, ids=[p.stem for p in C2C])
def test_c2c_examples_on_the_mixed_cluster(big_pool, tmp_path, rccl):
    """The c2c examples (16 ranks: 2 NVIDIA nodes, 2 AMD nodes of 4) compiled for the mixed
    cluster: NVIDIA ranks run the CUDA source, AMD ranks the HIP source (both in CPU emulation),
    each node's ranks on a node of their own, every inter-node step over TCP."""
    from hccc.compiler.cluster.topo_parser import load_topology
    topo_path = ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo"
    outdir = _compile_for_cluster(tmp_path, rccl, topo_path)
    plats = _run_outdir(big_pool, outdir, _cluster_nodes(load_topology(topo_path)), 16 * 5 + 3)
    assert sorted(set(plats)) == ["cuda", "hip"]


@pytest.mark.slow
def test_three_cluster_mixed_program(big_pool, tmp_path):
    """A c2c AllReduce over three clusters of different vendors (nodes of 3 A100, 5 MI250,
    2 H100, 1 MI250), generated by hccc gen c2c, each node a node of the job."""
    import subprocess as sp
    from hccc.compiler.cluster.topo_parser import load_topology
    from cluster_texts import MIXED_3, topo_text
    topo_path = tmp_path / "mix3.topo"
    topo_path.write_text(topo_text(MIXED_3))
    rccl = tmp_path / "mix3_allreduce.rccl"
    res = sp.run([sys.executable, "-m", "hccc", "gen", "c2c", str(topo_path), "--collective",
                  "allreduce", "-o", str(rccl)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    outdir = _compile_for_cluster(tmp_path, rccl, topo_path)
    plats = _run_outdir(big_pool, outdir, _cluster_nodes(load_topology(topo_path)), 11 * 7 + 5,
                        "int32", "max")
    assert sorted(set(plats)) == ["cuda", "hip"]


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_random_programs_across_nodes(pool, data):
    """Random valid programs of every collective with a random placement on 2-3 nodes (at least
    one connection crosses nodes), 1-3 channels, fused or not, every dtype and op numpy carries,
    uneven counts, in and out of place."""
    from hccc.compiler.passes.channels import with_channels
    from hccc.testing import valid_programs
    coll = data.draw(st.sampled_from(["allgather", "reducescatter", "allreduce", "broadcast",
                                      "reduce", "alltoall"]), label="collective")
    alg = data.draw(valid_programs([coll], max_ranks=4, min_ranks=2), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([64, 256]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))
    ir = with_channels(ir, data.draw(st.integers(1, 3), label="channels"))
    N = ir.nranks
    nodes = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=N, max_size=N)
                      .filter(lambda ns: len(set(ns)) > 1), label="nodes")
    cross = any(nodes[s] != nodes[d] for s, d in _connections(ir))
    dtype = data.draw(st.sampled_from(["float32", "float16", "int32"]), label="dtype")
    op = data.draw(st.sampled_from(["sum", "max", "min"]), label="op")
    count = data.draw(st.integers(0, 400), label="count")
    calls, want, count = calls_for(ir, count, dtype, op, seed=count)
    if data.draw(st.booleans(), label="out_of_place"):
        calls = out_of_place(calls, want, ir.collective)
    replies = pool.run(ir.to_json(), N, calls, dtype=dtype, op=op, nodes=nodes, env=TCP)
    check(replies, want, f"{ir.name} ({ir.collective}, {ir.nchannels} ch) on {nodes}, "
                         f"{count} x {dtype} {op}, cross-node connections: {cross}")


def _connections(ir):
    """(sender, receiver) of every send of the program."""
    rank, peer = ir.prims["rank"], ir.prims["send_peer"]
    return {(int(r), int(p)) for r, p in zip(rank, peer) if p >= 0}


@pytest.mark.slow
def test_a_stopped_rank_that_resumes_gets_a_communicator_error(tmp_path):
    """Rank 3 (node b) is stopped (SIGSTOP) in the kernel; once its peers have reported it, it
    resumes (SIGCONT): it too ends with a CommunicatorError, never an abort inside UCX."""
    require_torch()
    pool = RankPool(4, tmp_path)
    try:
        ir = build_program(gen.ring_allreduce(4, [0, 1, 2, 3]), chunk_bytes=256)
        calls, _, _ = calls_for(ir, 1000)
        calls[3] = [dict(calls[3][0], stop_in_kernel=True)]
        _send_all(pool, ir, calls, ["a", "a", "b", "b"])
        got = _replies(pool, range(3))
        for r in range(3):
            assert got[r] is not None and not got[r]["ok"] and "rank 3" in got[r]["error"], got[r]
        p = pool.workers[3][0]
        os.kill(p.pid, signal.SIGCONT)
        rep = _replies(pool, [3], wait_s=60.0)[3]
        assert rep is not None, "rank 3 died after it resumed"
        assert not rep["ok"] and "CommunicatorError" in rep["error"], rep
        assert p.is_alive()
    finally:
        for p, _ in pool.workers:
            if p.is_alive():
                p.kill()
        pool.close()
