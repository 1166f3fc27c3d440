"""AllToAll through the stack: chunk model, generators, lowering (in place and out of place), the
symbolic prover, the reference executor against the collective's definition, and the emitted
kernels in CPU emulation at uneven sizes and every dtype.

The definition used as the oracle (:func:`_definition`) is written here from the data model of compiler/frontend/algorithm.py
with plain Python lists, independent of ``hccc.runtime.reference``.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RECV, Algorithm, Collective, Header
from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.ir.symbolic import ProofError, prove
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import VerifyError, verify
from hccc.runtime.reference import execute, make_inputs
from hccc.testing import KernelCase, assert_implements, run_case, valid_programs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def _definition(inputs: list[np.ndarray]) -> list[list[float]]:
    """Rank j's output: block j of every rank's input, in rank order."""
    n = len(inputs)
    b = len(inputs[0]) // n
    return [[float(v) for i in range(n) for v in inputs[i][j * b:(j + 1) * b]] for j in range(n)]


# ------------------------------------------------------------------------------ chunk model
def test_header_chunk_model():
    h = Header(nranks=3, collective=Collective.ALLTOALL, chunks_per_rank=2)
    assert h.nchunks == 18
    c = (1 * 3 + 2) * 2 + 1           # piece 1 of the block rank 1 sends to rank 2
    assert h.owner(c) == 1 and h.block_dest(c) == 2
    assert h.block_slot(c) == (2 * 2 + 1, 1 * 2 + 1)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_prover_names_the_missing_block_by_source_destination_and_piece(rank):
    """An output slot nothing writes is named as the block it must hold: in ring_alltoall_6
    (K = 2) rank ``r``'s output slot 1 is piece 1 of the block from rank 0, id (0*6 + r)*2 + 1."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "ring_alltoall_6.rccl"
    ir = build_program(parse_rccl(path.read_text(), str(path)), chunk_bytes=64)
    assert (ir.nranks, ir.nchunks) == (6, 12)
    P = ir.prims
    i = np.flatnonzero((P["rank"] == rank) & (P["dst_buf"] == Buf.OUTPUT) & (P["dst_off"] == 1))
    assert len(i) == 1
    P["dst_buf"][i[0]] = Buf.SCRATCH          # the block lands in scratch and stays there
    with pytest.raises(ProofError, match=rf"rank {rank} output chunk 1 must hold block "
                                         rf"{(0 * 6 + rank) * 2 + 1} \(piece 1 of what rank 0 sends "
                                         rf"to rank {rank}\), but nothing ever writes it"):
        prove(ir, False)


def test_wrong_destination_is_located_at_the_delivering_transfer():
    direct = ('def ResCCLAlgo(nRanks=3, OpType="Alltoall"):\n'
              '    for i in range(0, 3):\n'
              '        for o in range(1, 3):\n'
              '            transfer(i, (i + o) % 3, o - 1, i * 3 + (i + o) % 3, recv)\n')
    verify(parse_rccl(direct, "ok.rccl"))
    # an extra copy of chunk 1 (rank 0 -> rank 1) on rank 2 is a harmless transit copy
    verify(parse_rccl(direct + "    transfer(1, 2, 5, 1, recv)\n", "extra.rccl"))
    # every block delivered one rank too far: located at the delivering transfer
    bad = direct.replace("transfer(i, (i + o) % 3, o - 1, i * 3 + (i + o) % 3, recv)",
                         "transfer(i, (i + o) % 3, o - 1, i * 3 + (i + 2 * o) % 3, recv)")
    with pytest.raises(VerifyError) as ei:
        verify(parse_rccl(bad, "bad.rccl"))
    assert set(ei.value.kinds) <= {"postcondition", "postcondition-summary"}
    d = ei.value.diagnostics[0]
    assert "does not hold chunk" in d.message and "output position" in d.message
    assert d.location is not None and (d.location.line, d.location.col) == (4, 13)
    assert any("delivers it to rank" in n and "not to rank" in n for n in d.notes)


def test_reduction_in_alltoall_is_refused():
    alg = Algorithm.from_rows(Header(nranks=2, collective=Collective.ALLTOALL),
                              [(0, 1, 0, 1, RECV), (1, 0, 0, 2, RECV), (0, 1, 1, 1, 1)])
    with pytest.raises(VerifyError) as ei:
        verify(alg)
    assert ei.value.kinds[0] == "allgather-reduction"


# ------------------------------------------------------------------------------ generators
SHAPES = [(lambda: gen.direct_alltoall(5)), (lambda: gen.direct_alltoall(4, chunks_per_rank=3)),
          (lambda: gen.ring_alltoall(5)), (lambda: gen.ring_alltoall(6, [3, 1, 0, 5, 2, 4], chunks_per_rank=2)),
          (lambda: gen.hierarchical_alltoall(2, 4)), (lambda: gen.hierarchical_alltoall(3, 2, chunks_per_rank=2)),
          (lambda: gen.hierarchical_alltoall(1, 3)), (lambda: gen.hierarchical_alltoall(4, 1)),
          (lambda: gen.direct_alltoall(1))]


@pytest.mark.parametrize("make", SHAPES)
def test_generators_are_valid(make):
    verify(make())


@pytest.mark.parametrize("nnodes,g,k", [(2, 4, 1), (3, 2, 2), (4, 3, 1)])
def test_hierarchical_sends_each_block_across_the_network_once(nnodes, g, k):
    alg = gen.hierarchical_alltoall(nnodes, g, chunks_per_rank=k)
    n = nnodes * g
    cross = alg.src // g != alg.dst // g
    # the minimum: every block whose ranks sit on different nodes crosses once
    assert int(cross.sum()) == (n * n - nnodes * g * g) * k
    assert len(np.unique(alg.chunk[cross])) == int(cross.sum())
    # one step per node pair on each inter-node link
    pairs = {(int(s), int(d), int(t)) for s, d, t in zip(alg.src[cross], alg.dst[cross], alg.step[cross])}
    assert len({(s, d) for s, d, _ in pairs}) == len(pairs)


@pytest.mark.parametrize("text,build", [
    (lambda: gen.direct_alltoall_rccl(5, chunks_per_rank=2), lambda: gen.direct_alltoall(5, chunks_per_rank=2)),
    (lambda: gen.ring_alltoall_rccl(4, chunks_per_rank=3), lambda: gen.ring_alltoall(4, chunks_per_rank=3)),
    (lambda: gen.hierarchical_alltoall_rccl(3, 2, chunks_per_rank=2),
     lambda: gen.hierarchical_alltoall(3, 2, chunks_per_rank=2)),
])
def test_text_generators_match_builders(text, build):
    a, b = parse_rccl(text(), "x.rccl"), build()
    assert sorted(a.rows()) == sorted(b.rows())
    assert a.header.collective is Collective.ALLTOALL
    assert a.header.chunks_per_rank == b.header.chunks_per_rank


# ------------------------------------------------------------------------------ lowering, proof, reference
# the thorough profile: ten times as many
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs("alltoall", max_ranks=6), st.sampled_from(["hpds", "rr"]), st.booleans(),
       st.integers(0, 60), st.integers(0, 3))
def test_random_alltoall_programs_prove_and_compute(alg, scheduler, fuse, count, seed):
    ir = build_program(alg, scheduler=scheduler, fuse=fuse)
    assert ir.collective == "alltoall" and ir.nchunks == ir.in_chunks == ir.out_chunks
    for inplace in (False, True):
        prove(ir, inplace=inplace)
        ins = make_inputs("alltoall", ir.nranks, count, "int32", nchunks=ir.nchunks, seed=seed)
        assert all(len(x) % ir.nranks == 0 for x in ins)
        out = execute(ir, ins, inplace=inplace, nmicro=1 + seed % 3, seed=seed)
        assert [list(map(float, o)) for o in out] == _definition(ins)


def test_in_place_needs_the_waits():
    """Dropping the dependencies that hold an arrival until the aliased block has left makes the
    in-place run racy (the prover says so) while out of place stays proven."""
    ir = build_program(gen.direct_alltoall(4))
    prove(ir, inplace=True)
    assert len(ir.dep_prim)
    p = ir.prims
    arrival = (p["op"][ir.dep_prim] == Op.RECV) & (p["dst_buf"][ir.dep_prim] == Buf.OUTPUT)
    assert arrival.any()
    ir.dep_prim, ir.dep_on = ir.dep_prim[~arrival], ir.dep_on[~arrival]
    prove(ir, inplace=False)
    with pytest.raises(ProofError) as ei:
        prove(ir, inplace=True)
    assert ei.value.kind == "race"


def test_direct_uses_scratch_only_for_parked_arrivals():
    ir = build_program(gen.direct_alltoall(4))
    p = ir.prims
    final = (p["op"] == Op.COPY) & (p["src_buf"] == Buf.SCRATCH)
    # every block parked in scratch is copied to the output exactly once
    assert int(final.sum()) == int(((p["op"] == Op.RECV) & (p["dst_buf"] == Buf.SCRATCH)).sum())
    assert ir.scratch_chunks <= ir.nchunks


def test_uneven_count_is_rounded_to_whole_blocks():
    ins = make_inputs("alltoall", 3, 10, "float32", nchunks=6)
    assert [len(x) for x in ins] == [9, 9, 9]
    ir = build_program(gen.direct_alltoall(3, chunks_per_rank=2))
    with pytest.raises(ValueError, match="equal blocks"):
        execute(ir, [np.zeros(10, np.float32)] * 3)


# ------------------------------------------------------------------------------ kernels
EVERY_DTYPE = ["float32", "float16", "bfloat16", "int32"]


@needs_gxx
# a kernel build a dtype: every dtype for the direct AllToAll, a 2-byte one and int32 (the run
# below) for the relaying programs by default (an AllToAll moves elements, so only their size
# matters to it), their other dtypes in the slow set
@pytest.mark.parametrize("make,dtypes", [
    (lambda: gen.direct_alltoall(4, chunks_per_rank=2), EVERY_DTYPE),
    (lambda: gen.ring_alltoall(3, [2, 0, 1], chunks_per_rank=3), ["float16", "int32"]),
    (lambda: gen.hierarchical_alltoall(2, 2, chunks_per_rank=2), ["bfloat16", "int32"]),
    pytest.param(lambda: gen.ring_alltoall(3, [2, 0, 1], chunks_per_rank=3), ["float32", "bfloat16"],
                 marks=pytest.mark.slow),
    pytest.param(lambda: gen.hierarchical_alltoall(2, 2, chunks_per_rank=2), ["float32", "float16"],
                 marks=pytest.mark.slow)])
def test_kernels_match_at_uneven_sizes_every_dtype(make, dtypes):
    alg = make()
    n, k = alg.header.nranks, alg.header.chunks_per_rank
    # blocks of 1, 7 and 67 elements: pieces of unequal size, several micro-batches at 64 B slots
    counts = [n * b for b in (1, 7, 67)] + [n * 67 + 1]
    assert_implements(alg, backend="cpu", counts=counts, dtypes=dtypes, chunk_bytes=64)
    ir = build_program(alg, chunk_bytes=64)
    res = run_case(ir, KernelCase(n * 29 * k + 5, "int32", "sum", True, 3))
    assert res.ok and res.wrong == 0 and res.count % n == 0 and res.oracle == "reference"


# ------------------------------------------------------------------------------ simulator
@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: gen.direct_alltoall(16), lambda: gen.hierarchical_alltoall(2, 8)])
def test_simulated_alltoall_never_beats_the_cut_bound(make):
    from pathlib import Path

    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth import network_from_topology
    from hccc.compiler.synth.bounds import alltoall_cut_bound_seconds
    from hccc.runtime.simulator import simulate_sizes

    topo = load_cluster(Path(__file__).resolve().parents[1] / "examples" / "clusters" / "a100_topo2.topo")
    ir = build_program(make())
    sizes = [1 << 20, 1 << 26]
    for s, r in zip(sizes, simulate_sizes(ir, topo, sizes)):
        bound, _ = alltoall_cut_bound_seconds(network_from_topology(topo), s)
        assert r.time_s >= bound * (1 - 1e-9)
        assert r.busbw_GBps == pytest.approx(s / r.time_s / 1e9 * 15 / 16)


@pytest.mark.slow   # a minute of the default run went to a few CLI and random-cluster runs
def test_hccc_sim_cli_runs_alltoall(tmp_path, capsys):
    from pathlib import Path

    from hccc.cli import main
    algo = tmp_path / "a2a.rccl"
    algo.write_text(gen.hierarchical_alltoall_rccl(2, 8))
    topo = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "a100_topo2.topo"
    assert main(["sim", str(algo), "--topology", str(topo), "--sizes", "1M,16M", "--json"]) == 0
    assert "alltoall" in capsys.readouterr().out
