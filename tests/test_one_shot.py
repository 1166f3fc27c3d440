"""Small messages within a node: the one-shot AllReduce (``one_shot_allreduce``, a ProgramIR: one
dependent hop), the one-step AllGather (``direct_allgather``: one hop) and the all-pairs AllReduce
(``direct_allreduce``: ``n`` hops) are proven for every group of 2 to 16 ranks, run correct on the
CPU emulation, and are what the built-in catalog (and so the torch backend) and ``--proto auto``
pick for them up to ``one_shot_bytes(n)`` / ``SMALL_BYTES``, as the direct ReduceScatter, Broadcast
and Reduce are for theirs: the choice the kernel cost model makes, recomputed here."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RECV, RRC
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


# ---------------------------------------------------------------- independent oracle: dependent hops
def dependent_hops(alg) -> int:
    """The longest chain of transfers each of which needs the one before it (plain loops over the
    rows in step order): a transfer needs the last earlier write of the cell it reads (the
    sender's chunk) and, for ``rrc``, of the cell it adds into (the receiver's chunk)."""
    depth_of: dict[tuple[int, int], int] = {}          # (rank, chunk) -> hops that wrote it last
    longest = 0
    rows = sorted(alg.rows(), key=lambda r: r[2])
    i = 0
    while i < len(rows):
        step = rows[i][2]
        batch = [r for r in rows[i:] if r[2] == step]
        i += len(batch)
        written = {}
        for s, d, _, c, op in batch:           # a step reads the state before it
            need = depth_of.get((s, c), 0)
            if op == RRC:
                need = max(need, depth_of.get((d, c), 0))
            written[(d, c)] = need + 1
            longest = max(longest, need + 1)
        depth_of.update(written)
    return longest


def test_the_hop_oracle_counts_the_ring():
    assert dependent_hops(gen.ring_allreduce(8)) == 14 and dependent_hops(gen.ring_allgather(5)) == 4
    assert dependent_hops(gen.recursive_doubling_allgather(8)) == 3


def _proven(alg) -> None:
    """verify (the transfer program) and the symbolic prover (its lowered ProgramIR, in and out of
    place), as ``hccc check`` and a compile run them."""
    from hccc.compiler.ir.check import check_fifo_order, check_structure
    from hccc.compiler.ir.symbolic import prove
    verify(alg)
    ir = build_program(alg)
    check_structure(ir)
    check_fifo_order(ir)
    for inplace in (False, True):
        prove(ir, inplace)


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 16))
def test_one_step_allgather_is_proven_with_one_hop(n):
    alg = gen.direct_allgather(n)
    _proven(alg)
    assert dependent_hops(alg) == 1 and len(alg) == n * (n - 1)
    assert set(alg.op.tolist()) == {RECV}


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 16))
def test_all_pairs_allreduce_is_proven_with_n_hops(n):
    alg = gen.direct_allreduce(n)
    _proven(alg)
    # n - 1 reductions into each chunk's owner, one copy out: against the ring's 2(n - 1)
    assert dependent_hops(alg) == n <= dependent_hops(gen.ring_allreduce(n))
    assert len(alg) == 2 * n * (n - 1)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13])
def test_direct_allreduce_text_parses_to_the_builder(n):
    from hccc.compiler.frontend import parse_rccl
    assert sorted(parse_rccl(gen.direct_allreduce_rccl(n)).rows()) == sorted(gen.direct_allreduce(n).rows())


def _messages(ir):
    """Plain loops over the primitive table: each rank's sends (peer, buffer, chunks) and its
    reductions in order (peer, source buffer)."""
    sends, reds = {}, {}
    p = ir.prims
    for i in range(ir.nprims):
        r, op = int(p["rank"][i]), Op(int(p["op"][i]))
        if op == Op.SEND:
            sends.setdefault(r, []).append((int(p["send_peer"][i]), Buf(int(p["src_buf"][i])), int(p["count"][i])))
        elif op.receives:
            reds.setdefault(r, []).append((int(p["seq"][i]), int(p["recv_peer"][i]), op))
    return sends, reds


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 16))
def test_one_shot_allreduce_is_proven_with_one_hop(n):
    from hccc.compiler.ir.check import check_deadlock, check_fifo_order, check_structure
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.compiler.ir.symbolic import prove
    ir = one_shot_allreduce(n)
    # proven again here, as `hccc check` proves a ProgramIR
    check_structure(ir)
    check_fifo_order(ir)
    check_deadlock(ir)
    for inplace in (False, True):
        prove(ir, inplace)
    # one hop: every rank sends its whole buffer (from its scratch copy) to every peer, and every
    # receive reduces into the output, none of them forwarding anything
    sends, reds = _messages(ir)
    for r in range(n):
        assert sorted(sends[r]) == [(q, Buf.SCRATCH, n) for q in range(n) if q != r]
        assert sorted(q for _, q, _ in reds[r]) == [q for q in range(n) if q != r]
        assert {op for *_, op in reds[r]} == {Op.RECV_REDUCE_COPY}
    assert not any(Op(int(o)).sends and Op(int(o)).receives for o in ir.prims["op"])


def test_the_shipped_one_shot_example_checks(capsys):
    from pathlib import Path
    from hccc.cli import main
    path = Path(__file__).resolve().parent.parent / "examples" / "one_shot_allreduce_8.json"
    assert main(["check", str(path)]) == 0
    assert "valid allreduce on 8 ranks" in capsys.readouterr().out


def test_one_shot_allreduce_refuses_one_rank():
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    with pytest.raises(ValueError, match="at least 2 ranks"):
        one_shot_allreduce(1)


# ---------------------------------------------------------------- the CPU emulation
@needs_gxx
@pytest.mark.parametrize("n,dtype,op", [(2, "float16", "max"), (3, "float32", "sum"), (4, "int32", "max"),
                                        (5, "bfloat16", "min")])
def test_one_shot_allreduce_runs_correct_on_the_cpu_emulation(n, dtype, op):
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.testing import assert_kernels_match, kernel_runner
    ir = one_shot_allreduce(n, chunk_bytes=64 * n)      # small slots: many micro-batches, FIFO wrap-around
    counts = [0, 1, n, 7 * n + 3, 40 * n + 1]
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts, inplace=(False, True))
    runner = kernel_runner(ir, "cpu", dtype, op)
    for count in counts[1:]:
        for inplace in (False, True):
            res = runner.run(count=count, proto="auto", inplace=inplace)
            assert res.ok and res.proto == "ll", (count, inplace, res)

# ---------------------------------------------------------------- the CPU emulation
@needs_gxx
@pytest.mark.parametrize("make,n,dtype,op", [
    (gen.direct_allreduce, 3, "float32", "sum"), (gen.direct_allreduce, 4, "int32", "max"),
    (gen.direct_allreduce, 5, "bfloat16", "min"), (gen.direct_allgather, 3, "float16", "sum"),
    (gen.direct_allgather, 6, "int32", "sum")])
def test_the_small_programs_run_correct_on_the_cpu_emulation(make, n, dtype, op):
    from hccc.testing import assert_kernels_match, kernel_runner
    ir = build_program(make(n), chunk_bytes=64)
    # empty, one element a chunk, ragged, and sizes of several micro-batches, in and out of place
    counts = [0, 1, ir.nchunks, 7 * ir.nchunks + 3, 40 * ir.nchunks + 1]
    assert_kernels_match(ir, dtypes=[dtype], ops=[op], counts=counts, inplace=(False, True))
    # --proto auto runs these sizes as LL, and LL computes the same
    runner = kernel_runner(ir, "cpu", dtype, op)
    for count in counts[1:]:
        res = runner.run(count=count, proto="auto")
        assert res.ok and res.proto == "ll", (count, res)


@needs_gxx
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_one_shot_allreduce_at_random_sizes_and_in_table_mode(data):
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.testing import describe_failure, kernel_cases, run_case
    ir = one_shot_allreduce(3, chunk_bytes=192)
    case = data.draw(kernel_cases(ir, dtypes=["float32", "int32"], ops=["sum", "max"], max_microbatches=12),
                     label="case")
    for codegen in ("specialized", "table"):
        res = run_case(ir, case, codegen=codegen)
        assert res.ok, (codegen, describe_failure(case, res))


# ---------------------------------------------------------------- the built-in catalog's choice
def _model_us(ir, nbytes: int) -> float:
    """The kernel cost model's time of one call as a torch job runs it: one rank per GPU, the
    Communicator's protocol (``--proto auto``) and slice, no direct mode (a Communicator has none)."""
    from hccc.compiler.passes import kernel_cost as kc
    from hccc.runtime import kernel_time as kt
    from hccc.runtime.rank_memory import launch_slice_bytes
    proto = abi.resolve_proto("auto", nbytes)
    sl = launch_slice_bytes(ir, nbytes, 4, ir.chunk_bytes, proto)
    return kt.program_time(ir, nbytes, kc.V4_H200, slice_bytes=sl, warps=ir.nwarps, proto=proto,
                           direct=False, one_gpu=False).total * 1e6


def _candidates(collective: str, n: int) -> dict:
    """Every program the catalog could serve a small call of one node with (the oracle's set,
    written out here, not read from the catalog)."""
    if collective == "allreduce":
        from hccc.compiler.ir.one_shot import one_shot_allreduce
        return {"ring": gen.ring_allreduce(n), "direct": gen.direct_allreduce(n), "one_shot": one_shot_allreduce(n)}
    if collective == "reducescatter":
        return {"ring": gen.ring_reducescatter(n), "direct": gen.direct_reducescatter(n)}
    if collective == "broadcast":
        return {"ring": gen.ring_broadcast(n, ROOT), "direct": gen.direct_broadcast(n, ROOT)}
    if collective == "reduce":
        return {"ring": gen.ring_reduce(n, ROOT), "direct": gen.direct_reduce(n, ROOT)}
    out = {"ring": gen.ring_allgather(n), "direct": gen.direct_allgather(n)}
    if n & (n - 1) == 0:
        out["recursive_doubling"] = gen.recursive_doubling_allgather(n)
    return out


#: the root of the rooted collectives' checks
ROOT = 1


@pytest.mark.parametrize("collective,n", [("allreduce", 3), ("allreduce", 8), ("allgather", 4),
                                          ("allgather", 8), ("allgather", 9), ("allgather", 16),
                                          ("reducescatter", 3), ("reducescatter", 8), ("broadcast", 4),
                                          ("broadcast", 8), ("reduce", 3), ("reduce", 8)])
def test_the_catalog_picks_what_the_kernel_cost_model_puts_first(collective, n, tmp_path):
    from hccc.builtin_catalog import SMALL_BYTES, BuiltinCatalog, one_shot_bytes
    from hccc.compiler.ir.program_ir import ProgramIR
    cat = BuiltinCatalog(n, ["node"] * n, cache_dir=tmp_path / "cache")
    root = ROOT if collective in ("broadcast", "reduce") else None
    irs = {k: a if isinstance(a, ProgramIR) else build_program(a) for k, a in _candidates(collective, n).items()}
    band = one_shot_bytes(n)
    for nbytes in sorted({4 << 10, band, min(2 * band, SMALL_BYTES), SMALL_BYTES}):
        nbytes -= nbytes % (4 * n)                           # whole float32 shares for every rank
        best = min(irs, key=lambda k: _model_us(irs[k], nbytes))
        got, why = cat.select(collective, n, nbytes, "float32", "sum", root=root)
        assert got is not None and got.name.startswith(best + "_"), (nbytes, got and got.name, why,
                                                                      {k: _model_us(v, nbytes) for k, v in irs.items()})
        # --proto auto runs it as LL
        from hccc.runtime.rank_memory import launch_proto
        assert launch_proto(got.ir, "auto", nbytes, got.ir.chunk_bytes) == ("ll", None)
    # above the band the ring again
    got, why = cat.select(collective, n, 2 * SMALL_BYTES * n, "float32", "sum", root=root)
    assert got is not None and got.name == f"ring_{collective}_{n}" + ("" if root is None else f"_root{ROOT}"), why


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_each_one_shot_band_is_the_models_crossover(n):
    """ONE_SHOT_BANDS: on each group it lists, the largest power of two up to SMALL_BYTES at which
    the model puts the one-shot AllReduce ahead of the all-pairs one (a sample of them here)."""
    from hccc.builtin_catalog import ONE_SHOT_BANDS, SMALL_BYTES
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    one, direct = one_shot_allreduce(n), build_program(gen.direct_allreduce(n))

    def ahead(nbytes):
        nbytes -= nbytes % (4 * n)
        return _model_us(one, nbytes) < _model_us(direct, nbytes)
    band = ONE_SHOT_BANDS[n]
    assert ahead(band) and (band == SMALL_BYTES or not ahead(2 * band))


def test_the_one_shot_band_of_larger_groups_is_the_models_crossover():
    """ONE_SHOT_BYTES: the largest power of two at which the model puts the one-shot AllReduce
    ahead of the all-pairs one on every group of 9 to 16 ranks (a sample of them here), the
    groups ONE_SHOT_BANDS does not list."""
    from hccc.builtin_catalog import ONE_SHOT_BANDS, ONE_SHOT_BYTES
    from hccc.compiler.ir.one_shot import one_shot_allreduce

    def ahead(n, nbytes):
        nbytes -= nbytes % (4 * n)
        return _model_us(one_shot_allreduce(n), nbytes) < _model_us(build_program(gen.direct_allreduce(n)), nbytes)
    assert not set(ONE_SHOT_BANDS) & {9, 12, 16}
    assert all(ahead(n, ONE_SHOT_BYTES) for n in (9, 12, 16))
    assert not all(ahead(n, 2 * ONE_SHOT_BYTES) for n in (9, 12, 16))


def test_the_small_programs_stay_within_one_node():
    from hccc.builtin_catalog import ONE_SHOT_BANDS, ONE_SHOT_BYTES, RD_ALLGATHER_MIN_RANKS, SMALL_BYTES, plan
    for n in range(2, 17):
        one = {name: (lo, hi) for name, _, lo, hi in plan("allreduce", n, ["a"] * n, None)}
        band = ONE_SHOT_BANDS.get(n, ONE_SHOT_BYTES)
        assert one == {f"one_shot_allreduce_{n}": (0, band), f"ring_allreduce_{n}": (0, None),
                       **({f"direct_allreduce_{n}": (0, SMALL_BYTES)} if band < SMALL_BYTES else {})}
        ag = {name for name, *_ in plan("allgather", n, ["a"] * n, None)}
        small = (f"recursive_doubling_allgather_{n}" if n & (n - 1) == 0 and n >= RD_ALLGATHER_MIN_RANKS
                 else f"direct_allgather_{n}")
        assert ag == {small, f"ring_allgather_{n}"}
        for coll, r in (("reducescatter", None), ("broadcast", 0), ("reduce", n - 1)):
            tail = "" if r is None else f"_root{r}"
            got = {name: (lo, hi) for name, _, lo, hi in plan(coll, n, ["a"] * n, r)}
            assert got == {f"direct_{coll}_{n}{tail}": (0, SMALL_BYTES), f"ring_{coll}_{n}{tail}": (0, None)}
    # ranks of two nodes in no node-contiguous order (no hierarchical program): never all-pairs
    nodes = ["a", "b"] * 4
    assert [p[0] for p in plan("allreduce", 8, nodes, None)] == ["ring_allreduce_8"]
    assert [p[0] for p in plan("allgather", 8, nodes, None)] == ["recursive_doubling_allgather_8",
                                                                 "ring_allgather_8"]
    assert [p[0] for p in plan("allgather", 6, ["a", "b"] * 3, None)] == ["ring_allgather_6"]
    assert [p[0] for p in plan("broadcast", 8, nodes, 2)] == ["ring_broadcast_8_root2"]
    assert [p[0] for p in plan("reduce", 8, nodes, 2)] == ["ring_reduce_8_root2"]


@needs_gxx
def test_the_torch_backend_runs_small_calls_on_the_small_programs():
    from conftest import needs_torch
    torch = needs_torch()
    needs_torch("torch.distributed")
    from hccc.builtin_catalog import SMALL_BYTES
    from hccc.torch import Options
    from hccc.torch.process_group import stats
    from torch_ranks import ranks_in_threads
    world, sizes = 3, (96, 12288, SMALL_BYTES // 4 + 32)     # float32 elements per rank

    def job(r):
        def run(pg):
            outs = []
            for k in sizes:
                t = torch.arange(k, dtype=torch.float32) + r
                pg.allreduce([t]).wait()
                out = torch.zeros(world * k)
                pg._allgather_base(out, torch.arange(k, dtype=torch.float32) + 100 * r,
                                   torch._C._distributed_c10d.AllgatherOptions()).wait()
                outs.append((t, out))
            return outs, stats(pg)
        return run
    got = ranks_in_threads([job(r) for r in range(world)], Options(builtin=True), timeout_s=240.0)
    for r, res in enumerate(got):
        assert res is not None and not isinstance(res[0], BaseException), (r, res)
        outs, st = res[0]
        for k, (t, out) in zip(sizes, outs):
            assert torch.equal(t, world * torch.arange(k, dtype=torch.float32) + sum(range(world)))
            assert torch.equal(out, torch.cat([torch.arange(k, dtype=torch.float32) + 100 * q
                                               for q in range(world)]))
        # AllReduce: 384 bytes one-shot (up to one_shot_bytes(3), 32 KiB), 48 KiB all-pairs, above
        # 64 KiB the ring; AllGather's full buffer is 3 ranks' parts: 1,152 bytes one-step, then the
        # ring
        assert st["entries"] == {"one_shot_allreduce_3": 1, "direct_allreduce_3": 1, "ring_allreduce_3": 1,
                                 "direct_allgather_3": 1, "ring_allgather_3": 2}, st
        # --proto auto: LL up to LL_AUTO_MAX_BYTES (256 KiB), so every call (the largest
        # AllGather's full buffer is 192.4 KiB)
        assert st["protos"] == {"ll": 6}, st
