"""The ``"hccc"`` torch.distributed backend and its algorithm catalog.

Default set (seconds, one process): the catalog's choice per call against a brute-force oracle
(hypothesis), ``catalog.json`` errors, ``hccc catalog``, ranks that disagree on the catalog, and
the backend in a one-rank group (registration, device maps, fallback with reasons, async work and
futures, the refusal under CUDA graph capture); 2 and 3 ranks in threads of one process on the
delegate: calls that disagree (op, kind, root), inputs to the choice and set-up failures named on
every rank, AVG at every dtype's edges against an exact oracle. Slow set (4 processes each): every collective
through the CPU emulation against its definition; DDP and FSDP ``fully_shard`` training, 20 steps,
equal to gloo after every step, with counters proving hccc's kernels carried the collectives; the
example under ``torchrun --nproc-per-node 4``; bad input and a dead rank give every rank an error
within the timeout.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, needs_torch
from torch_ranks import ledgers, ranks_in_threads

torch = needs_torch()
dist = needs_torch("torch.distributed")

from hccc.catalog import Catalog, CatalogError, Entry  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CATALOG4 = ROOT / "examples" / "torch" / "catalog4"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


# ------------------------------------------------------------------------------ the catalog
def test_committed_catalog_is_current(tmp_path):
    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    try:
        from make_catalog import generate
    finally:
        sys.path.pop(0)
    for p in generate(tmp_path):
        assert p.read_text() == (CATALOG4 / p.name).read_text(), p.name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in CATALOG4.iterdir())


def test_catalog_reads_every_kind_of_entry(tmp_path):
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    shutil.copy(CATALOG4 / "ring_allreduce_4.rccl", tmp_path)
    shutil.copy(ROOT / "examples" / "msccl" / "allgather_direct_4.xml", tmp_path)
    (tmp_path / "rs.json").write_text(build_program(gen.ring_reducescatter(4)).to_json())
    (tmp_path / "notes.txt").write_text("not an algorithm")
    (tmp_path / "catalog.json").write_text(json.dumps({"entries": [
        {"file": "ring_allreduce_4.rccl", "dtypes": ["float32"], "ops": ["sum"], "max_bytes": 1 << 20}]}))
    cat = Catalog.load(tmp_path)
    got = {e.name: (e.collective, e.nranks, e.dtypes, e.ops, e.min_bytes, e.max_bytes) for e in cat.entries}
    assert got["ring_allreduce_4.rccl"] == ("allreduce", 4, ("float32",), ("sum",), 0, 1 << 20)
    assert got["allgather_direct_4.xml"][:2] == ("allgather", 4)
    assert got["rs.json"][:2] == ("reducescatter", 4)
    assert len(got) == 3
    e, why = cat.select("allreduce", 4, 4096, "float32", "sum")
    assert e.name == "ring_allreduce_4.rccl" and why == ""
    assert "outside every 4-rank allreduce size band" in cat.select("allreduce", 4, 2 << 20, "float32", "sum")[1]
    assert "declares float16" in cat.select("allreduce", 4, 64, "float16", "sum")[1]
    assert "no allreduce algorithm for 8 ranks" in cat.select("allreduce", 8, 64, "float32", "sum")[1]
    assert "no broadcast algorithm" in cat.select("broadcast", 4, 64, "float32", "sum", root=0)[1]
    assert "int8 has no hccc kernel" in cat.select("allreduce", 4, 64, "int8", "sum")[1]
    assert "no kernel for the integer type int32" in cat.select("allreduce", 4, 64, "int32", "avg")[1]
    assert "op product has no hccc kernel" in cat.select("allreduce", 4, 64, "float32", "product")[1]
    # an all-gather of 4 x 3 elements splits evenly; 13 elements do not
    assert cat.select("allgather", 4, 48, "float32", "sum")[0] is not None
    assert "do not split into equal per-rank shares" in cat.select("allgather", 4, 52, "float32", "sum")[1]
    # the fingerprint follows the files
    before = cat.fingerprint
    (tmp_path / "catalog.json").write_text(json.dumps({"entries": [{"file": "rs.json"}]}))
    assert Catalog.load(tmp_path).fingerprint != before


@pytest.mark.parametrize("text, where, what", [
    ('{"entries": [{"file": "nope.rccl"}]}', (1, 23), "no such file"),
    ('{"entries": [{"file": "ring_allreduce_4.rccl", "ops": ["xor"]}]}', (1, 23), "ops must be"),
    ('{"entries": [{"file": "ring_allreduce_4.rccl", "min_bytes": 9, "max_bytes": 3}]}', (1, 23),
     "is above max_bytes"),
    ('{"entries": [{"file": "ring_allreduce_4.rccl", "band": 3}]}', (1, 23), "unknown key 'band'"),
    ('{"entries": [\n  {"file": 1,}]}', (2, 14), "not valid JSON"),
])
def test_bad_index_is_a_located_error(tmp_path, text, where, what):
    shutil.copy(CATALOG4 / "ring_allreduce_4.rccl", tmp_path)
    (tmp_path / "catalog.json").write_text(text)
    with pytest.raises(CatalogError) as info:
        Catalog.load(tmp_path)
    d = info.value.diagnostics[0]
    assert what in d.message
    assert (d.location.line, d.location.col) == where


def _fake(name, lo, hi, dtypes=("float32",), ops=("sum",)):
    return Entry(name=name, path=Path(name), collective="allreduce", nranks=4, root=None,
                 dtypes=tuple(dtypes), ops=tuple(ops), min_bytes=lo, max_bytes=hi)


bands = st.lists(st.tuples(st.integers(0, 64), st.one_of(st.none(), st.integers(0, 64)),
                           st.sampled_from([("float32",), ("float16",), ("float32", "float16")])),
                 min_size=0, max_size=5)


@settings(max_examples=examples(60))
@given(bands, st.integers(0, 70), st.sampled_from(["float32", "float16"]))
def test_choice_is_the_narrowest_declared_band(spec, kib, dtype):
    entries = [_fake(f"e{i}", lo * 1024, None if hi is None else max(lo, hi) * 1024, dts)
               for i, (lo, hi, dts) in enumerate(spec)]
    cat = Catalog(None, entries, "x")
    nbytes = kib * 1024
    got, why = cat.select("allreduce", 4, nbytes, dtype, "sum")
    # the oracle: every entry whose declarations hold, by brute force over the byte range
    ok = [e for e in entries if dtype in e.dtypes
          and nbytes in range(e.min_bytes, (e.max_bytes if e.max_bytes is not None else 1 << 30) + 1)]
    if not ok:
        assert got is None and why
        return
    width = {e.name: (e.max_bytes if e.max_bytes is not None else 1 << 40) - e.min_bytes for e in ok}
    best = min(width.values())
    assert got is not None and width[got.name] == best
    assert got.name == min(n for n, w in width.items() if w == best)


def test_simulator_breaks_ties_when_a_cluster_is_given():
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime.simulator import simulate
    topo = load_cluster(ROOT / "examples" / "clusters" / "a100_topo1.topo")
    n = topo.nranks
    algs = [("direct", build_program(gen.direct_allgather(n))), ("ring", build_program(gen.ring_allgather(n)))]
    entries = [Entry(name=name, path=Path(name), collective="allgather", nranks=n, root=None,
                     dtypes=("float32",), ops=("sum",), min_bytes=0, max_bytes=None, ir=ir)
               for name, ir in algs]
    cat = Catalog(None, entries, "x")
    for nbytes in (n * 1024, n * (64 << 20)):
        times = {name: simulate(ir, topo, nbytes, slice_bytes="auto").time_s for name, ir in algs}
        got, _ = cat.select("allgather", n, nbytes, "float32", "sum", cluster=topo)
        assert times[got.name] == min(times.values())
        assert cat.select("allgather", n, nbytes, "float32", "sum")[0].name == "direct"  # no cluster: by name


def test_catalog_command_lists_coverage_and_gaps(tmp_path, capsys):
    from hccc.cli import main
    shutil.copy(CATALOG4 / "ring_allreduce_4.rccl", tmp_path)
    shutil.copy(CATALOG4 / "ring_allgather_4.rccl", tmp_path)
    (tmp_path / "catalog.json").write_text(json.dumps({"entries": [
        {"file": "ring_allreduce_4.rccl", "min_bytes": 1024, "max_bytes": 1 << 20}]}))
    assert main(["catalog", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ring_allreduce_4.rccl" in out and "[1 KiB, 1 MiB]" in out
    assert "allreduce on 4 ranks: 0 B .. 1023 B" in out
    assert "allreduce on 4 ranks: 1048577 B and up" in out
    assert "no entries: reducescatter, broadcast, reduce, alltoall, scatter" in out
    assert main(["catalog", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "hccc.catalog/1" and len(doc["entries"]) == 2
    assert {"collective": "allreduce", "nranks": 4, "min_bytes": 1048577, "max_bytes": None} in doc["gaps"]
    (tmp_path / "catalog.json").write_text('{"entries": [{"file": "gone.rccl"}]}')
    assert main(["catalog", str(tmp_path)]) == 1
    assert "catalog.json:1:23: error: entry 'gone.rccl': no such file" in capsys.readouterr().err


# ------------------------------------------------------------------------------ one process
def _two_groups(options):
    """Make a 2-rank HcccProcessGroup in two threads on one store; each thread's result or error."""
    from hccc.torch import HcccProcessGroup
    store = dist.HashStore()
    out = [None, None]

    def make(r):
        try:
            pg = HcccProcessGroup(store, r, 2, datetime.timedelta(seconds=20), options[r])
            out[r] = pg
            pg.shutdown()
        except Exception as exc:
            out[r] = exc
    ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def test_ranks_that_disagree_on_the_catalog_all_get_an_error(tmp_path):
    from hccc.torch import Options
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(CATALOG4 / "ring_allreduce_4.rccl", a)
    shutil.copy(CATALOG4 / "ring_allgather_4.rccl", b)
    out = _two_groups([Options(catalog=a), Options(catalog=b)])
    for r in range(2):
        assert isinstance(out[r], RuntimeError), out[r]
        assert "disagree on the algorithm catalog" in str(out[r])
        assert "rank 0: 1 entries from" in str(out[r]) and "rank 1: 1 entries from" in str(out[r])


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank "hccc" default group (the catalog's 4-rank entries serve none of its calls)."""
    import hccc.torch  # noqa: F401
    made = []

    def make(backend="hccc", catalog=CATALOG4):
        dist.init_process_group(backend, init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                                pg_options=hccc.torch.Options(catalog=catalog),
                                timeout=datetime.timedelta(seconds=30))
        made.append(1)
        return dist.distributed_c10d._get_default_group()
    yield make
    if made and dist.is_initialized():
        dist.destroy_process_group()


def test_registered_backend_falls_back_with_reasons(one_rank, caplog):
    import hccc.torch
    from hccc.torch import routes
    routes._LOGGED.clear()                         # a fallback logs once per process: start fresh
    assert "hccc" in dist.Backend.backend_list
    pg = one_rank()
    assert isinstance(pg, hccc.torch.HcccProcessGroup) and dist.get_backend() == "hccc"
    t = torch.arange(6.0)
    with caplog.at_level("WARNING", logger="hccc.torch"):
        w = dist.all_reduce(t, async_op=True)
        assert w.wait() and w.is_completed()
        assert w.get_future().wait()[0] is t
        dist.all_reduce(t)                    # same reason: logged once
        dist.broadcast(t, src=0)
    assert torch.equal(t, torch.arange(6.0))
    s = hccc.torch.stats()
    assert s["fallback"] == {"allreduce": 2, "broadcast": 1} and s["hccc"] == {}
    # (the built-in catalog, which fills the directory's gaps, has nothing for one rank either)
    why = ("no allreduce algorithm for 1 ranks (the catalog has 4); and the built-in catalog: a group "
           "of one rank (nothing to exchange)")
    assert s["reasons"][why] == 2
    logged = [r.getMessage() for r in caplog.records if r.name == "hccc.torch"]
    assert logged.count(f"hccc: allreduce falls back to gloo: {why}") == 1
    # future callbacks (DDP's communication hooks chain them)
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait(), torch.full((3,), 2.0))


def test_wrong_device_and_mixed_dtypes_are_errors(one_rank):
    one_rank()
    with pytest.raises(ValueError, match="tensors on meta are not supported"):
        dist.all_reduce(torch.ones(2, device="meta"))
    with pytest.raises(TypeError, match="different dtypes"):
        dist.all_gather_into_tensor(torch.empty(2, dtype=torch.float16), torch.ones(2))


def test_collectives_under_cuda_graph_capture_are_refused_before_queueing(one_rank, monkeypatch):
    import hccc.torch
    from hccc.torch import process_group as pgmod
    pg = one_rank()
    monkeypatch.setattr(pgmod, "capture_active", lambda: True)
    t = torch.ones(4)
    for call in (lambda: dist.all_reduce(t), lambda: dist.broadcast(t, src=0),
                 lambda: dist.all_gather_into_tensor(torch.empty(4), t), lambda: dist.barrier()):
        with pytest.raises(hccc.torch.CaptureError, match="CUDA graph is being captured"):
            call()
    assert pg._calls_queue.queued() == 0
    s = hccc.torch.stats()
    assert s["hccc"] == {} and s["fallback"] == {} and s["delegated"] == {}


@pytest.mark.parametrize("backend, route", [("cpu:gloo,cuda:hccc", "delegated"),
                                            ("cpu:hccc,cuda:hccc", "fallback")])
def test_device_maps(one_rank, backend, route):
    import hccc.torch
    pg = one_rank(backend)
    assert isinstance(pg, hccc.torch.HcccProcessGroup)
    t = torch.ones(5)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(5))
    assert hccc.torch.stats()[route] == {"allreduce": 1}


def test_options_must_be_hccc_options(tmp_path):
    import hccc.torch  # noqa: F401
    with pytest.raises(TypeError, match="pg_options must be hccc.torch.Options"):
        dist.init_process_group("hccc", init_method=f"file://{tmp_path}/s", rank=0, world_size=1,
                                pg_options=object())
    if dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ four processes
def _ok(replies):
    for r, (ok, val) in enumerate(replies):
        assert ok, f"rank {r}: {val}"
    return [val for _, val in replies]


@pytest.fixture
def catalog_env(monkeypatch):
    monkeypatch.setenv("HCCC_ALGO_DIR", str(CATALOG4))


@pytest.mark.slow
@needs_gxx
def test_every_collective_through_hccc_on_four_processes(tmp_path, catalog_env):
    from torch_ranks import collectives_job, spawn
    res = _ok(spawn(collectives_job, 4, tmp_path, "hccc"))
    for r, rep in enumerate(res):
        bad = [k for k, v in rep["checks"].items() if not v]
        assert not bad, f"rank {r}: wrong results: {bad}"
        s = rep["stats"]
        assert s["hccc"] == {"allreduce": 7, "allgather": 3, "reducescatter": 2, "broadcast": 1,
                             "reduce": 1, "alltoall": 1, "barrier": 1}, s
        assert s["fallback"] == {"allreduce": 1}, s
        from hccc.util.dtypes import DTYPE_NAMES
        assert set(s["reasons"]) == {f"dtype int8 has no hccc kernel (hccc: {', '.join(DTYPE_NAMES)})"}
        if r < 2:
            # the catalog has no 2-rank algorithms: the built-in catalog fills the gap (1.5 KiB
            # within one host: the one-shot AllReduce)
            assert rep["sub_stats"]["hccc"] == {"allreduce": 1}, rep["sub_stats"]
            assert rep["sub_stats"]["entries"] == {"one_shot_allreduce_2": 1}, rep["sub_stats"]


def _compare_training(tmp_path, mode):
    from torch_ranks import spawn, train_job
    ours = _ok(spawn(train_job, 4, tmp_path, "hccc", mode, 20))
    ref = _ok(spawn(train_job, 4, tmp_path, "gloo", mode, 20))
    for r in range(4):
        assert len(ours[r]["snaps"]) == 20
        for step, (a, b) in enumerate(zip(ours[r]["snaps"], ref[r]["snaps"])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6,
                                       err_msg=f"rank {r}, parameters after step {step}")
        # every rank holds the same parameters (the collectives really synchronised them)
        np.testing.assert_array_equal(ours[r]["snaps"][-1], ours[0]["snaps"][-1])
    return [rep["stats"] for rep in ours]


@pytest.mark.slow
@needs_gxx
def test_ddp_training_equals_gloo_after_every_step(tmp_path, catalog_env):
    for s in _compare_training(tmp_path, "ddp"):
        # DDP: one gradient bucket per step, all-reduced by the catalog's ring; the start-up
        # broadcast of the parameters by its ring broadcast
        assert s["hccc"].get("allreduce", 0) >= 20, s
        assert s["entries"].get("ring_allreduce_4.rccl", 0) >= 20, s
        assert s["hccc"].get("broadcast", 0) >= 1, s
        assert "allreduce" not in s["fallback"], s


@pytest.mark.slow
@needs_gxx
def test_fsdp_training_equals_gloo_after_every_step(tmp_path, catalog_env):
    for s in _compare_training(tmp_path, "fsdp"):
        # fully_shard: parameters all-gathered, gradients reduce-scattered, by the catalog's rings
        assert s["hccc"].get("allgather", 0) >= 20 * 4, s
        assert s["hccc"].get("reducescatter", 0) >= 20 * 3, s
        assert "allgather" not in s["fallback"] and "reducescatter" not in s["fallback"], s


@pytest.mark.slow
@needs_gxx
def test_torchrun_launch_of_the_example(tmp_path):
    # torchrun is `python -m torch.distributed.run`: run it with this interpreter (a `torchrun` on
    # PATH may belong to another Python)
    env = dict(os.environ, HCCC_ALGO_DIR=str(CATALOG4), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(ROOT / "examples" / "torch" / "train_ddp.py"), "--backend", "hccc",
                           "--steps", "5"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step   4  loss" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("hccc:"))
    assert "'allreduce': 5" in line, line


@pytest.mark.slow
@needs_gxx
def test_bad_input_and_a_dead_rank_error_on_every_rank(tmp_path, catalog_env):
    from torch_ranks import bad_input_job, spawn
    timeout_s = 15.0
    replies = spawn(bad_input_job, 4, tmp_path, timeout_s)
    assert replies[3] == (False, "died")
    for r in range(3):
        ok, seen = replies[r]
        assert ok, seen
        got = {name: (err, secs) for name, err, secs in seen}
        for name in ("count", "dtype", "device", "dead rank"):
            err, secs = got[name]
            assert err is not None, f"rank {r}: {name}: no error"
            assert secs < timeout_s + 10, f"rank {r}: {name}: the error took {secs:.0f} s"
        assert "every rank must make the same call" in got["count"][0] or r != 0
        assert "rank 3" in got["dead rank"][0]
    assert "tensors on meta are not supported" in replies[2][1][2][1]


# ------------------------------------------------------------------------------ calls that disagree
def _allreduce(t, op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return lambda pg: pg.allreduce([t], o).wait()


@pytest.fixture
def no_catalog(tmp_path):
    """Options whose catalog is an empty directory, without the built-in catalog filling it: every
    call goes to the delegate (gloo)."""
    from hccc.torch import Options
    d = tmp_path / "empty"
    d.mkdir()
    return Options(catalog=d, builtin=False)


@pytest.mark.parametrize("ops", [(dist.ReduceOp.AVG, dist.ReduceOp.SUM), (dist.ReduceOp.SUM, dist.ReduceOp.MAX)])
def test_ranks_with_different_ops_both_fail(no_catalog, ops):
    """Both calls complete on the delegate (an AVG runs as a SUM there): the comparison after the
    call still names both calls, on both ranks."""
    out = ranks_in_threads([_allreduce(torch.ones(8), ops[0]), _allreduce(torch.ones(8), ops[1])],
                            no_catalog, timeout_s=5.0)
    names = [hccc_op_name(o) for o in ops]
    for r, (res, secs) in enumerate(out):
        assert isinstance(res, RuntimeError), (r, res)
        assert f"made allreduce(op={names[0]}, float32, elements 8, cpu)" in str(res), str(res)
        assert f"made allreduce(op={names[1]}, float32, elements 8, cpu)" in str(res), str(res)
        assert secs < 3.0


def hccc_op_name(op):
    from hccc.torch.routes import op_name as _op_name
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return _op_name(o)


def test_a_barrier_never_pairs_with_a_one_element_allreduce(no_catalog):
    out = ranks_in_threads([lambda pg: pg.barrier().wait(),
                             _allreduce(torch.ones(1), dist.ReduceOp.SUM)], no_catalog, timeout_s=4.0)
    for r, (res, secs) in enumerate(out):
        assert isinstance(res, RuntimeError), (r, res)
        assert "barrier(cpu)" in str(res) and "allreduce(op=sum, float32, elements 1, cpu)" in str(res)
        assert secs < 2.0, secs             # at once, not at the group's timeout


def test_ranks_that_make_the_same_calls_pass_the_comparison(no_catalog):
    def job(pg):
        t = torch.arange(6.0)
        pg.barrier().wait()
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([t], o).wait()
        b = dist.BroadcastOptions()
        b.rootRank = 1
        pg.broadcast([t], b).wait()
        return t
    out = ranks_in_threads([job, job], no_catalog)
    for res, _ in out:
        assert torch.equal(res, torch.arange(6.0)), res


def test_different_roots_fail_on_both_ranks(no_catalog):
    def bcast(root):
        def job(pg):
            o = dist.BroadcastOptions()
            o.rootRank = root
            return pg.broadcast([torch.ones(4)], o).wait()
        return job
    out = ranks_in_threads([bcast(0), bcast(1)], no_catalog, timeout_s=4.0)
    for res, secs in out:
        assert isinstance(res, RuntimeError) and "root 0" in str(res) and "root 1" in str(res), res


# ------------------------------------------------------------------------------ set-up agreement
def test_an_input_to_the_choice_set_on_one_rank_only_is_named_on_every_rank(tmp_path):
    from hccc.torch import Options
    topo = ROOT / "examples" / "clusters"
    cluster = next(p for p in sorted(topo.iterdir()) if p.suffix == ".topo")
    out = ranks_in_threads([lambda pg: None] * 3,
                            [Options(catalog=CATALOG4), Options(catalog=CATALOG4, cluster=cluster),
                             Options(catalog=CATALOG4)])
    for r, (res, _) in enumerate(out):
        assert isinstance(res, RuntimeError), (r, res)
        text = str(res)
        assert "disagree on HCCC_CLUSTER" in text, text
        assert "ranks 0, 2: (not set)" in text and f"rank 1: {cluster}" in text, text


def test_a_rank_whose_set_up_fails_fails_every_rank_at_once(tmp_path):
    from hccc.torch import Options
    import time as _time
    t0 = _time.monotonic()
    out = ranks_in_threads([lambda pg: None] * 2,
                            [Options(catalog=CATALOG4), Options(catalog=CATALOG4, cluster=tmp_path / "nope.topo")],
                            timeout_s=30.0)
    assert _time.monotonic() - t0 < 10.0
    for r, (res, _) in enumerate(out):
        assert isinstance(res, RuntimeError), (r, res)
        assert "set-up failed on rank 1" in str(res) and "nope.topo" in str(res), str(res)


def test_empty_node_name_fails_every_rank_at_once(monkeypatch):
    """An empty ``HCCC_NODE`` (read by every rank of this process here) is every rank's set-up
    failure, named; nobody waits for the timeout."""
    monkeypatch.setenv("HCCC_NODE", " ")
    out = ranks_in_threads([lambda pg: None] * 2, timeout_s=30.0)
    for res, _ in out:
        assert isinstance(res, RuntimeError) and "node name" in str(res), res


# ------------------------------------------------------------------------------ routes and logging
def test_premul_sum_reason_and_route_cache_are_stable(one_rank, caplog):
    pg = one_rank()
    from hccc.torch.routes import op_name as _op_name
    if not hasattr(dist, "_make_nccl_premul_sum"):
        pytest.skip("this torch has no PREMUL_SUM")
    ops = [dist._make_nccl_premul_sum(float(k)) for k in range(20)]
    for op in ops:
        o = dist.AllreduceOptions()
        o.reduceOp = op
        assert _op_name(o) == "premul_sum"
        route = pg._route("allreduce", torch.device("cpu"), [torch.ones(2)], 8, _op_name(o))
        assert "0x" not in route[1]
    assert len(pg._routes) == 1
    for op in ops:                       # through torch: the delegate refuses, the log stays one line
        with caplog.at_level("WARNING", logger="hccc.torch"):
            try:
                dist.all_reduce(torch.ones(2), op=op)
            except Exception:
                pass
    assert len(pg._routes) == 1
    assert all("0x" not in k for k in hccc_stats()["reasons"])


def hccc_stats():
    import hccc.torch
    return hccc.torch.stats()


def test_a_fallback_is_logged_once_by_rank_zero(no_catalog, caplog):
    from hccc.torch import routes
    routes._LOGGED.clear()
    with caplog.at_level("WARNING", logger="hccc.torch"):
        out = ranks_in_threads([lambda pg: [pg.allreduce([torch.ones(2)]).wait() for _ in range(3)]
                                 + [pg.counters["reasons"]]] * 3, no_catalog)
    for res, _ in out:
        assert not isinstance(res, Exception), res
        assert sum(res[-1].values()) == 3          # every rank counts its own fallbacks
    lines = [r.getMessage() for r in caplog.records if r.name == "hccc.torch"]
    assert len(lines) == 1 and "allreduce falls back to gloo" in lines[0], lines


# ------------------------------------------------------------------------------ AVG at the edges
_FLOATS = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def _edge_values(dtype):
    """Values at the edges of a dtype: its largest, its smallest normal and subnormal, and a few
    ordinary ones, of both signs."""
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        base = [fi.max, fi.max / 2, fi.tiny, fi.tiny * 4, fi.eps, 1.0, 40000.0 if dtype == torch.float16
                else 3e38 if dtype == torch.float32 else fi.max / 3, 0.0]
        if dtype != torch.bfloat16:
            base.append(fi.tiny * fi.eps)   # the smallest subnormal
    else:
        ii = torch.iinfo(dtype)
        base = [ii.max, ii.min, ii.max // 2, ii.min // 2 + 1, 1, 0, 7]
    values = base + [-v for v in base if dtype.is_floating_point or dtype.is_signed]
    if not dtype.is_floating_point:     # -min of a two's complement type is past its max
        values = [v for v in values if ii.min <= v <= ii.max]
    return values


def _avg_oracle(cols, dtype):
    """The average of each column, exactly (Python fractions), rounded once to ``dtype`` (numpy;
    bfloat16 through float32, then rounded to bfloat16 by torch); integers truncate toward zero."""
    from fractions import Fraction
    n = len(cols)
    out = []
    for vals in zip(*cols):
        if dtype.is_floating_point:
            out.append(float(sum(Fraction(float(v)) for v in vals) / n))
        else:
            s = sum(int(v) for v in vals)
            out.append(abs(s) // n * (1 if s >= 0 else -1))
    if dtype.is_floating_point:
        return torch.tensor(out, dtype=torch.float64).to(dtype)
    return torch.tensor(out, dtype=dtype)


def _avg_through_plan(cols, dtype, n):
    """The backend's AVG with the SUM done here, in the plan's dtype, rank after rank (as a ring
    adds)."""
    from hccc.runtime.launcher import DTYPES
    from hccc.torch.averages import avg_input as _avg_input, avg_output as _avg_output, avg_plan
    acc, pre = avg_plan(dtype, DTYPES)
    ys = [_avg_input(torch.tensor(c, dtype=dtype), acc, pre, n, inplace=False) for c in cols]
    total = ys[0].clone()
    for y in ys[1:]:
        total += y
    out = torch.empty(len(cols[0]), dtype=dtype)
    _avg_output(total, out, pre, n)
    return out


def _close(got, want, dtype, n):
    if not dtype.is_floating_point:
        return torch.equal(got, want)
    g, w = got.double(), want.double()
    fi = torch.finfo(dtype)
    # scaling first rounds each rank's share once and the sum n times: n + 1 units in the last place
    tol = (n + 1) * fi.eps * w.abs() + n * fi.tiny * fi.eps * 2
    return bool(torch.isfinite(g).all()) and bool(((g - w).abs() <= tol).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int32, torch.int64, torch.uint8])
@given(data=st.data())
@settings(max_examples=examples(40))
def test_avg_is_the_average_where_it_is_representable(dtype, data):
    n = data.draw(st.integers(2, 8), label="ranks")
    edges = _edge_values(dtype)
    width = data.draw(st.integers(1, 6), label="elements")
    # every rank's values near one edge per element (the average stays representable)
    picks = [data.draw(st.sampled_from(edges)) for _ in range(width)]
    cols = [[p for p in picks] for _ in range(n)]
    for j in range(width):        # vary one rank's value a little: not all ranks equal
        r = data.draw(st.integers(0, n - 1))
        cols[r][j] = edges[data.draw(st.integers(0, len(edges) - 1))] if abs(picks[j]) < 1e4 else picks[j]
    if not dtype.is_floating_point:
        from hccc.runtime.launcher import DTYPES
        from hccc.torch.averages import avg_plan
        if avg_plan(dtype, DTYPES)[0] == dtype:
            # summed in the tensor's own dtype (wraps, as NCCL's): only sums that fit are promised
            ii = torch.iinfo(dtype)
            cols = [[max(min(v, ii.max // n), -(ii.max // n)) for v in c] for c in cols]
    want = _avg_oracle(cols, dtype)
    got = _avg_through_plan(cols, dtype, n)
    assert _close(got, want, dtype, n), (cols, got, want)


def test_avg_of_float16_40000_and_float32_3e38_on_two_ranks_through_the_delegate(no_catalog):
    def job(vals):
        def run(pg):
            res = []
            for v, dt in vals:
                t = torch.full((4,), v, dtype=dt)
                o = dist.AllreduceOptions()
                o.reduceOp = dist.ReduceOp.AVG
                pg.allreduce([t], o).wait()
                res.append(t.clone())
            return res
        return run
    vals = [(40000.0, torch.float16), (3e38, torch.float32), (100, torch.int32)]
    out = ranks_in_threads([job(vals), job([(v * (0.5 if dt.is_floating_point else 1), dt)
                                             for v, dt in vals])], no_catalog)
    for res, _ in out:
        assert not isinstance(res, Exception), res
        assert torch.equal(res[0], torch.full((4,), 30000.0, dtype=torch.float16))
        assert torch.equal(res[1], torch.full((4,), 2.25e38, dtype=torch.float32))
        assert torch.equal(res[2], torch.full((4,), 100, dtype=torch.int32))


def test_avg_of_reduce_and_reduce_scatter_through_the_delegate(no_catalog):
    """Every AVG runs as a SUM on gloo (which has no AVG): a reduce of two tensors averages both on
    the root and leaves the other rank's, a reduce_scatter_tensor averages each rank's part (the
    oracle: the mean computed here from every rank's inputs)."""
    def job(r):
        def run(pg):
            a, b = torch.full((4,), 10.0 * (r + 1)), torch.arange(4.0) * (r + 3)
            o = dist.ReduceOptions()
            o.reduceOp, o.rootRank = dist.ReduceOp.AVG, 0
            pg.reduce([a, b], o).wait()
            full = torch.arange(8, dtype=torch.float32) + 100 * r
            part = torch.empty(4)
            s = dist.ReduceScatterOptions()
            s.reduceOp = dist.ReduceOp.AVG
            pg.reduce_scatter_single(part, full, s).wait()
            return a, b, part
        return run
    out = ranks_in_threads([job(0), job(1)], no_catalog)
    for r, (res, _) in enumerate(out):
        assert not isinstance(res, Exception), res
        a, b, part = res
        if r == 0:
            assert torch.equal(a, torch.full((4,), 15.0))
            assert torch.equal(b, torch.arange(4.0) * 3.5)
        else:
            assert torch.equal(a, torch.full((4,), 20.0))
            assert torch.equal(b, torch.arange(4.0) * 4)
        mean = (torch.arange(8, dtype=torch.float32) * 2 + 100) / 2
        assert torch.equal(part, mean[4 * r:4 * r + 4]), (r, part)


@pytest.mark.slow
@needs_gxx
def test_no_catalog_and_no_environment_runs_on_the_built_in_catalog(tmp_path, monkeypatch):
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    from torch_ranks import builtin_job, spawn
    res = _ok(spawn(builtin_job, 2, tmp_path))
    for r, rep in enumerate(res):
        assert all(rep["checks"].values()), (r, rep["checks"])
        carried = rep["stats"]["carried"]
        assert carried["allreduce"]["float32"] == 1 and carried["allreduce"]["float16"] == 1
        assert carried["allreduce"]["int32"] == 1 and carried["reducescatter"]["float32"] == 1
        assert carried["broadcast"]["float32"] == 1 and carried["allgather"]["float32"] == 1
        assert rep["stats"]["fallback"] == {}, rep["stats"]["reasons"]
        # ranks whose calls differ only in torch's op: refused on both, at once, naming both calls
        assert rep["mismatch"] and "must make the same calls" in rep["mismatch"], rep["mismatch"]
        assert "made allreduce(op=avg" in rep["mismatch"] and "made allreduce(op=sum" in rep["mismatch"]
        assert rep["mismatch_s"] < 10.0
        # two different algorithms, neither set up yet: named at once too, not at the timeout
        assert rep["apart"] and "made allreduce(op=sum" in rep["apart"] and "made broadcast(" in rep["apart"], \
            rep["apart"]
        assert rep["apart_s"] < 30.0


# ------------------------------------------------------------------------------ the call ledger
_call_texts = st.sampled_from(["allreduce(op=sum, float32, elements 8, cpu)",
                               "allreduce(op=avg, float32, elements 8, cpu)", "barrier(cpu)",
                               "broadcast(float32, elements 8, root 1, cpu)"])


@pytest.mark.parametrize("kind", ["shm", "store"])
@given(calls=st.lists(st.lists(_call_texts, min_size=3, max_size=3), min_size=1, max_size=70))
@settings(max_examples=examples(25), deadline=None)
def test_the_ledger_reports_a_difference_exactly_when_the_calls_differ(kind, calls):
    """Every rank posts call after call (more than a ring's worth); after each, every rank's
    comparison finds a difference exactly when the ranks' texts differ (the oracle: string
    equality), and the text it gives names both calls."""
    from hccc.torch.ledger import CallMismatch, digest
    ls = ledgers(kind, 3)
    try:
        for seq, texts in enumerate(calls, start=1):
            for led, text in zip(ls, texts):
                led.post(seq, text, digest(text))
            for r, led in enumerate(ls):
                why = led.conflict(seq, texts[r], digest(texts[r]))
                if len(set(texts)) == 1:
                    assert why is None
                    led.settle(seq, texts[r], digest(texts[r]), 1.0)
                else:
                    other = next(t for t in texts if t != texts[r])
                    assert why is not None and texts[r] in why and other in why, why
                    with pytest.raises(CallMismatch):
                        led.settle(seq, texts[r], digest(texts[r]), 1.0)
    finally:
        for led in ls:
            led.close()


@pytest.mark.slow
@needs_gxx
def test_a_group_across_two_nodes_runs_the_hierarchical_built_in_algorithm(tmp_path, monkeypatch):
    pytest.importorskip("hccc.runtime.net_ucx")
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_TOPOLOGY", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    from torch_ranks import spawn, two_nodes_job
    res = _ok(spawn(two_nodes_job, 4, tmp_path))
    for r, rep in enumerate(res):
        assert rep["ok"], r
        assert rep["stats"]["entries"] == {"hm_allreduce_2x2": 1}, rep["stats"]
