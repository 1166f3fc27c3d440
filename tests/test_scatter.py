"""Scatter (NCCL's ncclScatter): the root's send buffer holds one block per rank, in rank order;
every rank's receive buffer gets its block. Its generators (linear from the root, the chain, a tree
and the binomial tree) and hccc.testing's strategies for it; the emitted kernels on the CPU
emulation against a numpy oracle written here, in every element type, in and out of place, under
both FIFO protocols; ``hccc check`` refusing wrong programs at their place; ``hccc run`` / ``sim``
(nccl-tests' busbw factor (n-1)/n, the cluster's cut bound); the MSCCL XML and MSCCL++ plan
exports refusing it with the reason; the Communicator's ``scatter`` one rank per process (slow
set); algorithm catalogs and the built-in one's choice, held to the simulator; and
``torch.distributed.scatter`` through hccc against gloo (in threads; seven dtypes in processes in
the slow set), a root's bad list failing every rank at once."""
from __future__ import annotations

import threading

import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import examples, shm_leaks, needs_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import Collective
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.runtime import shm
from hccc.runtime.launcher import program_layout
from hccc.testing import kernel_runner, mutations, valid_programs
from hccc.util import dtypes as dtypes_table
from hccc.util.diagnostics import CompileError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ring_scatter_8.rccl"
CLUSTERS = ROOT / "examples" / "clusters"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
#: every element type the kernels have (a Scatter reduces nothing: every type runs with "sum")
DTYPES = [d.name for d in dtypes_table.DTYPES]
#: a value no root block holds (the root's values lie in 0..59): what the other ranks' send
#: buffers hold, so that a kernel reading them shows
NOT_SENT = 99


def scatter_oracle(root_input: np.ndarray, nranks: int, nchunks: int) -> list[np.ndarray]:
    """Rank ``r``'s block of the root's buffer: its ``nchunks // nranks`` chunks, chunk ``c``
    being elements ``[c * count // nchunks, (c + 1) * count // nchunks)`` (hccc's split of a full
    buffer; with a count of whole blocks, as torch's and nccl-tests' calls have, equal blocks)."""
    count, k = len(root_input), nchunks // nranks
    return [root_input[r * k * count // nchunks:(r + 1) * k * count // nchunks] for r in range(nranks)]


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------ generators
@given(n=st.integers(1, 70), data=st.data())
def test_binomial_tree_is_the_binomial_tree(n, data):
    """A spanning tree in which the rank at distance v after the root lies popcount(v) edges deep,
    so it is at most ceil(log2 n) deep."""
    root = data.draw(st.integers(0, n - 1))
    edges = gen.binomial_tree(n, root)
    assert len(edges) == n - 1
    depth = {root: 0}
    for _ in range(n):                       # parents before children, whatever the order
        for p, c in edges:
            if p in depth:
                depth.setdefault(c, depth[p] + 1)
    assert sorted(depth) == list(range(n))
    for v in range(n):
        assert depth[(root + v) % n] == bin(v).count("1")
    assert max(depth.values()) <= (math.ceil(math.log2(n)) if n > 1 else 0)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k", [1, 2])
def test_every_generator_is_a_scatter_of_its_depth(n, k):
    """Verified for every root, in the steps each shape takes: linear one step, the chain
    ``n - 2 + k`` (hop h carries chunk j at step h + j), the binomial tree one per level (the
    most set bits of a distance from the root)."""
    for root in range(n):
        direct = gen.direct_scatter(n, root, chunks_per_rank=k)
        chain = gen.ring_scatter(n, root, list(range(n))[::-1], chunks_per_rank=k)
        tree = gen.tree_scatter(n, gen.binomial_tree(n, root), root, chunks_per_rank=k)
        for alg in (direct, chain, tree):
            verify(alg)
            assert alg.header.collective is Collective.SCATTER and alg.header.root == root
            # the root sends every other rank's chunks, and nothing comes back to it
            assert (alg.dst != root).all()
            assert len(alg) >= (n - 1) * k
        steps = [len(set(a.step.tolist())) for a in (direct, chain, tree)]
        levels = max(bin(v).count("1") for v in range(n))
        assert steps == ([0, 0, 0] if n == 1 else [1, n - 2 + k, levels])
        assert len(direct) == (n - 1) * k


def test_the_example_is_the_chain_from_root_3():
    alg = parse_rccl(EXAMPLE.read_text(), str(EXAMPLE))
    want = gen.ring_scatter(8, 3, chunks_per_rank=2)
    assert alg.header.collective is Collective.SCATTER and alg.header.root == 3
    assert sorted(alg.rows()) == sorted(want.rows())


def test_hccc_testing_draws_every_scatter_family():
    """hccc.testing's strategies know Scatter's three generators, and draw valid programs of it."""
    from hccc import testing
    assert testing._FAMILIES[Collective.SCATTER] == ("ring", "tree", "direct")
    assert testing._generator("direct", Collective.SCATTER) is gen.direct_scatter

    @settings(max_examples=examples(15), deadline=None)
    @given(valid_programs("scatter", max_ranks=7))
    def drawn(alg):
        assert alg.header.collective is Collective.SCATTER and 0 <= alg.header.root < alg.header.nranks
        verify(alg)
    drawn()


def test_generators_refuse_bad_arguments():
    with pytest.raises(ValueError, match="root 4 is out of range"):
        gen.direct_scatter(4, 4)
    with pytest.raises(ValueError, match="permutation"):
        gen.ring_scatter(3, 0, [0, 1, 1])
    with pytest.raises(ValueError, match="spanning tree"):
        gen.tree_scatter(3, [(0, 1)], 0)
    with pytest.raises(ValueError, match="root 3 is out of range"):
        gen.binomial_tree(3, 3)


# ------------------------------------------------------------------------------ the kernels
def _kernels_compute_scatter(data, dtypes, codegens=("specialized",)):
    alg = data.draw(valid_programs("scatter", max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes"))
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    runner = kernel_runner(ir, "cpu", dtype, "sum",
                           codegen=data.draw(st.sampled_from(list(codegens)), label="codegen"))
    np_dt = np.float32 if dtype == "bfloat16" else np.dtype(dtypes_table.dtype(dtype).numpy)
    N, C, root = ir.nranks, ir.nchunks, ir.root
    for _ in range(2):   # two sizes per build
        count = data.draw(st.integers(0, 24 * C), label="count")
        inplace = data.draw(st.booleans(), label="inplace")
        seed = data.draw(st.integers(0, 2 ** 16), label="seed")
        inputs = [np.full(count, NOT_SENT, np_dt) for _ in range(N)]
        inputs[root] = np.random.default_rng(seed).integers(0, 60, count).astype(np_dt)
        res = runner.run(count=count, inplace=inplace, inputs=inputs, keep_outputs=True,
                         nthreads=data.draw(st.sampled_from([1, 2, 3]), label="threads"),
                         proto=data.draw(st.sampled_from(["simple", "ll"]), label="proto"))
        assert res.stuck is None, res.stuck
        want = scatter_oracle(inputs[root], N, C)
        for r in range(N):
            np.testing.assert_array_equal(res.outputs[r], want[r],
                                          err_msg=f"{alg.header.name}: rank {r}, {count} x {dtype}, "
                                                  f"{'in place' if inplace else 'out of place'}")
        assert res.ok and res.wrong == 0


@needs_gxx
@settings(max_examples=examples(3), deadline=None)   # a kernel build each (about a second, cold)
@given(data=st.data())
def test_generated_scatter_programs_compute_scatter(data):
    """Random Scatter programs (chains, trees, linear; relabelled, renumbered, split chunks): the
    emitted kernels, under either FIFO protocol, give every rank its block of the root's buffer,
    whatever the others send."""
    _kernels_compute_scatter(data, ["float32", "float16", "bfloat16", "int32", "uint8"])


@pytest.mark.slow
@needs_gxx
@settings(max_examples=examples(30), deadline=None)
@given(data=st.data())
def test_generated_scatter_programs_compute_scatter_in_every_dtype(data):
    """Every element type, the specialised and the table-mode kernels."""
    _kernels_compute_scatter(data, DTYPES, ("specialized", "table"))


# ------------------------------------------------------------------------------ hccc check
@settings(max_examples=examples(20), deadline=None)
@given(data=st.data())
def test_mutated_scatter_programs_are_refused(data):
    alg = data.draw(valid_programs("scatter", max_ranks=6, min_ranks=2))
    desc, mutant = data.draw(mutations(alg))
    with pytest.raises(CompileError):
        verify(mutant)


@pytest.mark.parametrize("old,new,where,what", [
    # a relay forwards a chunk in the step it receives it
    ("h + j, ((Root", "j, ((Root", ":8:17: error: ", "is written and read at step 0"),
    # the chain stops one hop short of every rank
    ("range(0, i):", "range(0, i - 1):", ":2:1: error: ", "does not hold chunk"),
    # chunks go to the wrong rank (every rank's block one rank on)
    ("((Root + i) % nRanks) * nChunksPerRank", "((Root + i + 1) % nRanks) * nChunksPerRank",
     ":2:1: error: ", "does not hold chunk"),
])
def test_check_refuses_a_wrong_scatter_at_its_place(tmp_path, capsys, old, new, where, what):
    text = EXAMPLE.read_text()
    assert old in text
    bad = tmp_path / "bad.rccl"
    bad.write_text(text.replace(old, new))
    rc, out, err = run_cli(capsys, "check", bad)
    assert rc == 1 and "Traceback" not in err
    assert f"bad.rccl{where}" in err and what in err, err
    rc, out, err = run_cli(capsys, "check", EXAMPLE)
    assert rc == 0 and "valid Scatter on 8 ranks" in out


# ------------------------------------------------------------------------------ run, sim, export
@needs_gxx
def test_run_prints_nccl_tests_scatter_table(capsys, monkeypatch):
    """Size is the root's whole buffer; algbw = size / time, busbw = algbw * (n-1)/n; the redop
    column says none and the root column the program's root; no wrong element in either placement."""
    import json
    monkeypatch.setenv("HCCC_CPU_OPT", "-O0")
    rc, out, err = run_cli(capsys, "run", EXAMPLE, "--sizes", "0,64,4100,65536", "-n", "1", "-w", "0",
                           "--chunk-size", "256", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["collective"] == "scatter" and doc["root"] == 3 and doc["redop"] == "none" and doc["ok"]
    assert {(r["bytes"], r["inplace"]) for r in doc["results"]} == \
        {(b, p) for b in (0, 64, 4100, 65536) for p in (False, True)}
    for r in doc["results"]:
        assert r["wrong"] == 0 and r["stuck"] is None
        if r["bytes"]:
            assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e3))
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)


def test_sim_reports_scatter_bandwidths(capsys):
    """nccl-tests' columns (busbw factor (n-1)/n), and the cluster's cut bound for a Scatter, which
    the program's simulated time never beats."""
    import json
    rc, out, err = run_cli(capsys, "sim", EXAMPLE, "--topology", CLUSTERS / "a100_topo1.topo", "--sizes", "1M,64M",
                           "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["collective"] == "scatter" and doc["root"] == 3 and doc["redop"] == "none"
    assert [r["bytes"] for r in doc["results"]] == [1 << 20, 64 << 20]
    for r in doc["results"]:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)
        assert 0 < r["cut_bound_us"] <= r["time_us"]


@pytest.mark.parametrize("coll", ["scatter", "gather"])
def test_cut_bound_is_the_far_nodes_blocks_across_the_nic(coll):
    """4 + 8 GPUs, one 12 GB/s NIC per node, the intra-node links far faster: the blocks of the
    ranks on the other node than the root cross its NIC, 8 of the 12 from a root on the small node
    and 4 from one on the large; Gather's cross the other way, as many."""
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth.bounds import collective_cut_bound_seconds
    from synth_networks import GB, two_nic_nodes
    net = network_from_topology(two_nic_nodes(4, 8, 12))
    M = 1 << 30
    assert collective_cut_bound_seconds(net, coll, 12, 1, 0, M) == pytest.approx(M * 8 / 12 / (12 * GB), rel=1e-9)
    assert collective_cut_bound_seconds(net, coll, 12, 1, 5, M) == pytest.approx(M * 4 / 12 / (12 * GB), rel=1e-9)


@pytest.mark.parametrize("cmd,why", [
    ("xml", "an MSCCL <algo> has no root attribute, so it cannot express a Scatter"),
    ("plan", "the executor's plans have no root"),
])
def test_exports_refuse_scatter_with_the_reason(tmp_path, capsys, cmd, why):
    out_file = tmp_path / "out"
    rc, out, err = run_cli(capsys, cmd, EXAMPLE, "-o", out_file)
    assert rc == 1 and "Traceback" not in err
    assert f"{EXAMPLE}:2:1: error: cannot export collective 'scatter'" in err and why in err, err
    assert not out_file.exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ the Communicator
@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    needs_torch("torch.distributed")
    from rank_pool import RankPool
    p = RankPool(3, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


@pytest.mark.slow   # 15-20 s: three processes, each building its kernels
@needs_gxx
def test_communicator_scatter_in_and_out_of_place(pool):
    """Three processes, root 1, the binomial tree with two chunks per rank: out of place, then in
    place (the output is this rank's block of its own send buffer, as ncclScatter's in-place
    call); then a call naming another root is refused on every rank."""
    before = set(shm.ours())
    ir = build_program(gen.tree_scatter(3, gen.binomial_tree(3, 1), 1, chunks_per_rank=2), chunk_bytes=64)
    count = 6 * 40 + 5
    lay = program_layout(ir, count)
    rng = np.random.default_rng(5)
    root_x = [rng.integers(0, 60, count).astype(np.float32) for _ in range(2)]
    calls = []
    for r in range(3):
        xs = [x if r == 1 else np.full(count, NOT_SENT, np.float32) for x in root_x]
        calls.append([{"method": "scatter", "x": xs[0], "out": lay[r][1], "kwargs": {"root": 1}},
                      {"method": "scatter", "x": xs[1], "out": lay[r][1], "output_in_input": lay[r][4]}])
    replies = pool.run(ir.to_json(), 3, calls)
    for i, x in enumerate(root_x):
        want = scatter_oracle(x, 3, ir.nchunks)
        for r, rep in enumerate(replies):
            assert rep["ok"], rep.get("error")
            np.testing.assert_array_equal(rep["outputs"][i], want[r], err_msg=f"call {i}, rank {r}")
    bad = [[{"method": "scatter", "x": np.zeros(count, np.float32), "out": lay[r][1],
             "kwargs": {"root": 0}}] for r in range(3)]
    for rep in pool.run(ir.to_json(), 3, bad):
        assert not rep["ok"] and "compiled for root 1, not 0" in rep["error"], rep
    deadline = time.monotonic() + 5
    while shm_leaks(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert shm_leaks(before) == set()


# ------------------------------------------------------------------------------ torch
def test_built_in_catalog_offers_linear_and_across_nodes_the_binomial_tree():
    from hccc.builtin_catalog import plan
    one = plan("scatter", 4, ["a"] * 4, 1)
    assert [name for name, *_ in one] == ["direct_scatter_4_root1"]
    two = plan("scatter", 8, ["a"] * 4 + ["b"] * 4, 5)
    assert [name for name, *_ in two] == ["direct_scatter_8_root5", "tree_scatter_binomial_8_root5"]
    for name, make, lo, hi in one + two:
        alg = make()
        verify(alg)
        assert alg.header.collective is Collective.SCATTER and (lo, hi) == (0, None)
    assert plan("scatter", 4, ["a"] * 4, None) == plan("scatter", 4, ["a"] * 4, 4) == []


def test_a_catalog_serves_scatter_at_its_root(tmp_path, capsys):
    """An algorithm directory holding the example: hccc catalog lists it with its root, and the
    torch backend's choice takes it for a scatter from root 3 only."""
    from hccc.catalog import Catalog
    shutil.copy(EXAMPLE, tmp_path)
    rc, out, err = run_cli(capsys, "catalog", tmp_path)
    assert rc == 0 and "  scatter         8     3  ring_scatter_8.rccl" in out, out
    assert "gather, send, recv" in out and "scatter, send" not in out
    cat = Catalog.load(tmp_path)
    entry, why = cat.select("scatter", 8, 8 * 4 * 100, "float32", "sum", 3)
    assert entry is not None and entry.name == "ring_scatter_8.rccl" and entry.root == 3, why
    entry, why = cat.select("scatter", 8, 8 * 4 * 100, "float32", "sum", 2)
    assert entry is None and why == "no scatter algorithm for root 2 (the catalog's roots: 3)"


@pytest.mark.parametrize("topo,n,faster", [("a100_topo1", 8, "binomial"), ("a100_topo2", 16, "binomial"),
                                           ("a100_topo3", 16, "binomial")])
def test_the_simulator_prefers_what_the_catalog_says(topo, n, faster):
    """The comparison behind the built-in catalog's scatter entries, at 64 MiB: the binomial tree
    on two servers and on four, since the simulator charges the kernels' units (2 x 4 A100s: 1.00
    against 1.37 ms; 2 x 8: 0.95 against 1.36; the alpha-beta model alone had the linear scatter
    ahead on two servers). The catalog offers both across nodes and lets the simulator choose."""
    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime.simulator import simulate
    cluster = load_cluster(CLUSTERS / f"{topo}.topo")
    t = {name: simulate(build_program(alg), cluster, 64 << 20, slice_bytes="auto").time_s
         for name, alg in (("direct", gen.direct_scatter(n, 0)),
                           ("binomial", gen.tree_scatter(n, gen.binomial_tree(n, 0), 0)))}
    assert min(t, key=t.get) == faster, t


@pytest.mark.slow   # about a minute: 3 processes on hccc (kernel builds for seven types), 3 on gloo
@needs_gxx
def test_torch_scatter_equals_gloo_and_hccc_carried_it(tmp_path, monkeypatch):
    """torch.distributed.scatter with no catalog: the built-in one carries every call (seven dtypes,
    three roots), each result equal to gloo's, and a strided output (which gloo fills as if it
    were contiguous) right; a root whose scatter_list is one tensor short fails on every rank (the
    others are told the root's call differs)."""
    needs_torch("torch.distributed")
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    from torch_ranks import scatter_job, spawn
    ours = spawn(scatter_job, 3, tmp_path, "hccc")
    theirs = spawn(scatter_job, 3, tmp_path, "gloo")
    for r, ((ok, mine), (ok2, gloo)) in enumerate(zip(ours, theirs)):
        assert ok and ok2, (mine, gloo)
        assert mine["got"] == gloo["got"], f"rank {r}"
        assert mine["strided"], f"rank {r}: the strided output"
        s = mine["stats"]
        assert s["hccc"] == {"scatter": 8} and s["fallback"] == {}, s
        assert s["carried"]["scatter"] == {"float32": 2, "float16": 1, "bfloat16": 1, "int32": 1,
                                           "int64": 1, "uint8": 1, "float64": 1}, s
        assert mine["bad"], f"rank {r}: the bad call passed"
        if r:
            assert "the root's scatter_list holds 2 tensors of 4/4 elements" in mine["bad"]


@pytest.mark.parametrize("bad", ["short", "dtype"])
def test_a_root_whose_scatter_list_does_not_fit_fails_every_rank(tmp_path, bad):
    """Two ranks in threads on the delegate (an empty catalog): a good scatter first, then a root
    whose list is one tensor short or of another dtype; the root's call is refused, the other rank
    is told the calls differ (instead of waiting for the root), both within seconds."""
    torch = needs_torch()
    dist = needs_torch("torch.distributed")
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    (tmp_path / "empty").mkdir()

    first = {}
    # both ranks finish the good call before the bad one: a root that fails its call leaves the
    # job (shutting its group down) at once, which a rank still receiving the good call would
    # see as a broken connection instead of the comparison this test is about
    between = threading.Barrier(2)

    def job(rank):
        def run(pg):
            opts = dist.ScatterOptions()
            opts.rootRank = 1
            out = torch.zeros(3)
            lists = [[torch.arange(3.0) + 10 * r for r in range(2)]] if rank == 1 else []
            pg.scatter([out], lists, opts).wait()
            first[rank] = out.tolist()
            between.wait(timeout=30)
            wrong = ([torch.ones(3)] if bad == "short" else [torch.ones(3, dtype=torch.int32)] * 2)
            pg.scatter([torch.zeros(3)], [wrong] if rank == 1 else [], opts).wait()
        return run
    got = ranks_in_threads([job(0), job(1)], Options(catalog=tmp_path / "empty", builtin=False), timeout_s=10.0)
    assert first == {0: [0.0, 1.0, 2.0], 1: [10.0, 11.0, 12.0]}
    for rank, (res, seconds) in enumerate(got):
        assert isinstance(res, Exception), f"rank {rank}: {res}"
        assert seconds < 8.0, f"rank {rank} waited {seconds:.1f} s"
    assert "the root's scatter_list" in str(got[0][0]) and "rank 1 made scatter(" in str(got[0][0])


@needs_gxx
def test_torch_scatter_in_threads_equals_gloo_and_hccc_carried_it(tmp_path, monkeypatch):
    """Three ranks in threads of one process: the built-in catalog's linear scatter (root 1) gives
    what gloo gives (the same calls on the delegate, an empty catalog), and hccc's counters say
    hccc carried both calls (the slow set's test above takes seven dtypes through processes)."""
    torch = needs_torch()
    dist = needs_torch("torch.distributed")
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "empty").mkdir()

    def job(rank):
        def run(pg):
            opts = dist.ScatterOptions()
            opts.rootRank = 1
            got = []
            for dtype, n in ((torch.float32, 37), (torch.float32, 4)):
                out = torch.full((n,), -1).to(dtype)
                lists = [[(torch.arange(n) * (r + 3) + r).to(dtype) for r in range(3)]] if rank == 1 else []
                pg.scatter([out], lists, opts).wait()
                got.append(out)
            return got, dict(pg.counters["hccc"]), dict(pg.carried["scatter"])
        return run
    ours = ranks_in_threads([job(r) for r in range(3)], Options(), timeout_s=60.0)
    gloo = ranks_in_threads([job(r) for r in range(3)], Options(catalog=tmp_path / "empty", builtin=False))
    for rank, ((mine, _), (theirs, _)) in enumerate(zip(ours, gloo)):
        assert not isinstance(mine, Exception) and not isinstance(theirs, Exception), (mine, theirs)
        for a, b in zip(mine[0], theirs[0]):
            assert a.dtype == b.dtype and torch.equal(a, b), f"rank {rank}"
        assert mine[1] == {"scatter": 2} and mine[2] == {"float32": 2}, mine[1:]
        assert theirs[1] == {}


TORCH_CATALOG = ROOT / "examples" / "torch" / "catalog4"


def test_the_torch_example_catalog_has_a_scatter_entry():
    """examples/torch/catalog4 covers every collective the torch backend carries, Scatter included
    (from root 0, as its Broadcast and Reduce); a scatter from another root has no entry."""
    from hccc.catalog import Catalog
    cat = Catalog.load(TORCH_CATALOG)
    entry, why = cat.select("scatter", 4, 4 * 4 * 10, "float32", "sum", 0)
    assert entry is not None and entry.name == "ring_scatter_4.rccl" and entry.root == 0, why
    assert cat.select("scatter", 4, 160, "float32", "sum", 1)[0] is None


@pytest.mark.slow
def test_the_torch_example_catalog_carries_scatter_from_its_root(tmp_path, monkeypatch):
    """Four ranks in threads with examples/torch/catalog4 get what gloo gives (an empty catalog)
    for a scatter from root 0, and hccc's counters say the catalog's ring carried it."""
    torch = needs_torch()
    dist = needs_torch("torch.distributed")
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    CATALOG4 = TORCH_CATALOG
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "empty").mkdir()

    def job(rank):
        def run(pg):
            opts = dist.ScatterOptions()
            opts.rootRank = 0
            out = torch.full((29,), -1.0)
            lists = [[torch.arange(29.0) * (r + 3) + r for r in range(4)]] if rank == 0 else []
            pg.scatter([out], lists, opts).wait()
            return out, dict(pg.counters["hccc"])
        return run
    ours = ranks_in_threads([job(r) for r in range(4)], Options(catalog=CATALOG4), timeout_s=60.0)
    gloo = ranks_in_threads([job(r) for r in range(4)], Options(catalog=tmp_path / "empty", builtin=False))
    for rank, ((mine, _), (theirs, _)) in enumerate(zip(ours, gloo)):
        assert not isinstance(mine, Exception) and not isinstance(theirs, Exception), (mine, theirs)
        assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[0], torch.arange(29.0) * (rank + 3) + rank)
        assert mine[1] == {"scatter": 1} and theirs[1] == {}, (mine[1], theirs[1])
