"""AllToAllv: AllToAll programs run with per-(source, destination) counts given per call.

The oracle (:func:`_oracle`) is written here with plain Python loops from the definition (rank
``d``'s receive buffer holds, at ``rdispls[d][s]``, the ``counts[s][d]`` elements rank ``s`` sends
from ``sdispls[s][d]``), independent of ``hccc.runtime.alltoallv``.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.program_ir import PRIM_COLUMNS, Buf, Op, Origin, ProgramIR
from hccc.compiler.ir.symbolic import prove
from hccc.compiler.ir.vblocks import VBlockError, vblock_map
from hccc.compiler.passes.build import build_program
from hccc.runtime import alltoallv as av
from hccc.testing import DTYPES, kernel_runner, valid_programs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def _oracle(sends, counts, sd=None, rd=None, recv_lens=None, fill=None):
    """Every rank's receive buffer by the definition (packed displacements when None); elements
    no block lands on are ``fill`` (None: not compared, returned as a mask)."""
    n = len(counts)
    if sd is None:
        sd = [[sum(counts[s][:d]) for d in range(n)] for s in range(n)]
    if rd is None:
        rd = [[sum(counts[i][d] for i in range(s)) for s in range(n)] for d in range(n)]
    if recv_lens is None:
        recv_lens = [sum(counts[s][d] for s in range(n)) for d in range(n)]
    out, mask = [], []
    for d in range(n):
        buf = [None] * int(recv_lens[d])
        for s in range(n):
            for e in range(int(counts[s][d])):
                buf[int(rd[d][s]) + e] = sends[s][int(sd[s][d]) + e]
        out.append(buf)
    return out


def _check(res, sends, counts, **kw):
    assert res.stuck is None, res.stuck
    want = _oracle([list(x) for x in sends], np.asarray(counts).tolist(), **kw)
    for d, (got, exp) in enumerate(zip(res.outputs, want)):
        for e, v in enumerate(exp):
            if v is not None:
                assert got[e] == v or (v != v and got[e] != got[e]), f"rank {d} element {e}: {got[e]} != {v}"
    assert res.ok, res.first_wrong


def _inputs(counts, dtype, seed=0, extra=0):
    rng = np.random.default_rng(seed)
    npdt = {"bfloat16": np.float32}.get(dtype, None) or np.dtype(
        __import__("hccc.util.dtypes", fromlist=["dtype"]).dtype(dtype).numpy)
    return [rng.integers(0, 100, size=int(np.sum(row)) + extra).astype(npdt) for row in np.asarray(counts)]


def _symmetric(c):
    c = np.asarray(c)
    return np.triu(c) + np.triu(c, 1).T


def _skewed(n, total, seed=0):
    """One pair carries 90 % of ``total`` elements, the rest spread at random (zeros included)."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 3, (n, n)) * max(1, total // (10 * n * n))
    s, d = rng.integers(0, n, 2)
    c[s, d] = int(0.9 * total)
    return c


PROGRAMS = {
    "direct4": lambda: gen.direct_alltoall(4),
    "ring4": lambda: gen.ring_alltoall(4),
    "hier2x2": lambda: gen.hierarchical_alltoall(2, 2),
    "ring3_k2": lambda: gen.ring_alltoall(3, chunks_per_rank=2),
    # primitives of 10 chunks: more than a unit round's HCCC_UNIT_PIECES (8), so the kernels build
    # the pieces of each round of each micro-batch from the counts (hccc_v_round)
    "ring3_k10": lambda: gen.ring_alltoall(3, chunks_per_rank=10),
}


# ------------------------------------------------------------------------------ host checks
def test_counts_refused_with_the_entry_named():
    with pytest.raises(av.CountsError, match=r"counts\[1\]\[0\] = -2"):
        av.as_counts([[1, 2], [-2, 0]], 2)
    with pytest.raises(av.CountsError, match="2 x 2 matrix"):
        av.as_counts([1, 2, 3], 2)
    with pytest.raises(av.CountsError, match="whole number"):
        av.as_counts([[1.5, 0], [0, 0]], 2)
    # one rank's row (Communicator.all_to_all_v(send_counts=)): the entry named by its one index
    with pytest.raises(av.CountsError, match=r"send_counts\[2\] = -1: a count must be >= 0"):
        av.as_counts([0, 4, -1], 3, "send_counts", row=True)
    with pytest.raises(av.CountsError, match=r"send_counts\[0\] = 0.5 is not a whole"):
        av.as_counts([0.5, 4, 1], 3, "send_counts", row=True)
    with pytest.raises(av.CountsError, match="3 counts are needed"):
        av.as_counts([[0, 4, 1]], 3, "send_counts", row=True)
    assert av.as_counts((0, 4, 1), 3, row=True).tolist() == [0, 4, 1]
    c = av.as_counts([[1, 5], [2, 0]], 2)
    with pytest.raises(av.CountsError, match=r"rank 0's send buffer holds 5 elements.*counts\[0\]\[1\] = 5"):
        av.check_call(c, [5, 2], [3, 5])
    with pytest.raises(av.CountsError, match=r"rank 1's receive buffer holds 4 elements.*counts\[0\]\[1\] = 5"):
        av.check_call(c, [6, 2], [3, 4])
    with pytest.raises(av.CountsError, match="symmetric counts"):
        av.check_call(c, [6, 6], [6, 6], inplace=True)
    with pytest.raises(av.CountsError, match="overlapping"):
        av.check_call(c, [6, 2], [3, 5], rd=[[0, 0], [0, 0]])


def test_packed_displacements_are_prefix_sums():
    c = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    sd, rd = av.packed_displs(c)
    assert sd.tolist() == [[0, 1, 3], [0, 4, 9], [0, 7, 15]]
    # rank d receives from 0, 1, 2 in order: column d
    assert rd.tolist() == [[0, 1, 5], [0, 2, 7], [0, 3, 9]]


# ------------------------------------------------------------------------------ the proof
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("inplace", [False, True])
def test_generated_programs_move_blocks_whole(name, inplace):
    ir = build_program(PROGRAMS[name]())
    vm = vblock_map(ir, inplace)
    N, K = ir.nranks, vm.k
    # every receive carries what its send carries, and every output slot ends with its own piece
    p = ir.prims
    for i in range(ir.nprims):
        if p["op"][i] in (Op.RECV, Op.RECV_COPY_SEND) and p["dst_buf"][i] == Buf.OUTPUT:
            r, off = int(p["rank"][i]), int(p["dst_off"][i])
            for j, g in enumerate(vm.of(i).tolist()):
                src, k = divmod(off + j, K)
                assert g == (src * N + r) * K + k


def _staging_program():
    """2 ranks; rank 1 parks the block from rank 0 in output slot 1 (its own block's place), then
    moves it to slot 0 and copies its own block in: correct when blocks have one size."""
    rows = [
        dict(rank=0, tb=0, seq=0, op=Op.SEND, send_peer=1, src_buf=Buf.INPUT, src_off=1),
        dict(rank=0, tb=1, seq=0, op=Op.RECV, recv_peer=1, dst_buf=Buf.OUTPUT, dst_off=1),
        dict(rank=0, tb=1, seq=1, op=Op.COPY, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=0),
        dict(rank=1, tb=0, seq=0, op=Op.SEND, send_peer=0, src_buf=Buf.INPUT, src_off=0),
        dict(rank=1, tb=1, seq=0, op=Op.RECV, recv_peer=0, dst_buf=Buf.OUTPUT, dst_off=1),
        dict(rank=1, tb=1, seq=1, op=Op.COPY, src_buf=Buf.OUTPUT, src_off=1, dst_buf=Buf.OUTPUT, dst_off=0),
        dict(rank=1, tb=1, seq=2, op=Op.COPY, src_buf=Buf.INPUT, src_off=1, dst_buf=Buf.OUTPUT, dst_off=1),
    ]
    defaults = {"pipeline": 0, "send_peer": -1, "recv_peer": -1, "channel": 0, "src_buf": 0, "src_off": 0,
                "dst_buf": 0, "dst_off": 0, "count": 1, "task": -1, "task2": -1}
    prims = {k: np.array([r.get(k, defaults.get(k, 0)) for r in rows], dtype=dt) for k, dt in PRIM_COLUMNS.items()}
    # proven out of place only (in place, the arrival would race with the send of its slot)
    return ProgramIR(name="staging", collective="alltoall", nranks=2, nchunks=2, in_chunks=2, out_chunks=2,
                     scratch_chunks=0, prims=prims, npipelines=1, ntbs=np.array([2, 2], np.int32),
                     origin=Origin(inplace=False))


def test_size_dependent_placement_is_refused_and_located():
    ir = _staging_program()
    prove(ir, False)                  # an AllToAll when every block has one size ...
    with pytest.raises(VBlockError, match=r"rank 1 tb 1 seq 0 \(recv from rank 0\) writes rank 1 output chunk 1 "
                                          r"holding the block rank 0 sends to rank 1") as e:
        vblock_map(ir, False)         # ... but not with per-pair counts
    assert e.value.prims == [4]


def test_check_command_says_whether_a_program_runs_as_alltoallv(tmp_path, capsys):
    from hccc.cli import main
    f = tmp_path / "staging.json"
    f.write_text(_staging_program().to_json())
    assert main(["check", str(f)]) == 0          # a valid AllToAll ...
    out = capsys.readouterr().out
    assert "valid alltoall" in out and "runs as AllToAllv (per-pair counts): no: out of place: rank 1 tb 1 seq 0" in out
    assert main(["check", str(ROOT / "examples" / "ring_alltoall_6.rccl"), "--json"]) == 0
    assert '"alltoallv": {"ok": true}' in capsys.readouterr().out


def test_non_alltoall_is_refused():
    ir = build_program(gen.ring_allgather(3) if hasattr(gen, "ring_allgather") else gen.direct_allgather(3))
    with pytest.raises(VBlockError, match="implements AllGather: per-pair counts apply to AllToAll"):
        vblock_map(ir)


# ------------------------------------------------------------------------------ the kernels
def test_only_alltoall_programs_kernels_have_the_alltoallv_path(tmp_path):
    """An AllToAll program's rank and one-grid sources run their program as an hccc_vprogram (the
    engine with the AllToAllv path; here an HCCC_TVPROGRAM(N), its blocks' primitives decoded at
    launch, prim_table.ALLTOALL_TABLE); every other collective's as an hccc_program (here an
    HCCC_TPROGRAM(N)), whose engine is compiled without it (its registers stay off every ordinary
    collective's kernels)."""
    from hccc.compiler.backend.codegen import generate
    for prog, want in ((gen.ring_alltoall(3), "HCCC_TVPROGRAM"), (gen.ring_allreduce(3), "HCCC_TPROGRAM"),
                       (gen.ring_allgather(3), "HCCC_TPROGRAM")):
        ir = build_program(prog)
        out = tmp_path / ir.collective
        out.mkdir()
        generate(ir, out, platforms=["cuda"] * ir.nranks)
        for src in sorted(out.glob("*.cu")):
            text = src.read_text()
            if "_program()" not in text:
                continue
            used = set(re.findall(r"\b(hccc_v?program|HCCC_TV?PROGRAM)\b(?:\(\d+\))?(?:\{| \w+_program\(\))",
                                  text))
            assert used == {want}, (src.name, used)


@needs_gxx
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_kernels_random_skewed_zero_counts(name):
    ir = build_program(PROGRAMS[name]())
    N = ir.nranks
    r = kernel_runner(ir, "cpu", "float32")
    rng = np.random.default_rng(7)
    cases = [rng.integers(0, 40, (N, N)), _skewed(N, 2000, 1), np.zeros((N, N), np.int64),
             np.where(rng.random((N, N)) < 0.5, 0, rng.integers(1, 30, (N, N)))]
    for c in cases:
        for inplace in (False, True):
            cc = _symmetric(c) if inplace else c
            sends = _inputs(cc, "float32", seed=int(cc.sum()))
            res = r.run_v(cc, inplace=inplace, inputs=sends, keep_outputs=True)
            if inplace:
                # in place the receive buffer starts as the send buffer: untouched elements keep it
                assert res.stuck is None and res.ok, res.first_wrong
                want = _oracle([list(x) for x in sends], cc.tolist())
                for d in range(N):
                    assert [float(v) for v in res.outputs[d]] == [float(v) for v in want[d]]
            else:
                _check(res, sends, cc)


@needs_gxx
# a build a dtype: by default one dtype of each element size the other kernel tests here do not run
# (1, 2 and 8 bytes; 4 bytes: float32 by the tests above, int32 by the displacement test below); a
# second dtype of a size (bfloat16, int64) and int32 in the slow set
@pytest.mark.parametrize("dtype", [d if d in ("uint8", "float16", "float64") else pytest.param(d, marks=pytest.mark.slow)
                                   for d in DTYPES if d != "float32"])
def test_kernels_every_dtype(dtype):
    ir = build_program(gen.ring_alltoall(3))
    r = kernel_runner(ir, "cpu", dtype)
    c = np.array([[3, 0, 17], [5, 9, 1], [0, 40, 2]])
    sends = _inputs(c, dtype, seed=3)
    _check(r.run_v(c, inputs=sends, keep_outputs=True), sends, c)


@needs_gxx
def test_kernels_given_displacements_and_larger_buffers():
    ir = build_program(gen.hierarchical_alltoall(2, 2))
    N = 4
    r = kernel_runner(ir, "cpu", "int32")
    rng = np.random.default_rng(5)
    c = rng.integers(0, 20, (N, N))
    # blocks in reverse rank order with gaps of 3 elements
    sd = [[int(sum(c[s][d + 1:]) + 3 * (N - 1 - d)) for d in range(N)] for s in range(N)]
    rd = [[int(sum(c[i][d] for i in range(s + 1, N)) + 3 * (N - 1 - s)) for s in range(N)] for d in range(N)]
    send_lens = [int(c[s].sum()) + 3 * N + 5 for s in range(N)]
    recv_lens = [int(c[:, d].sum()) + 3 * N + 5 for d in range(N)]
    sends = [np.arange(n, dtype=np.int32) + 1000 * s for s, n in enumerate(send_lens)]
    res = r.run_v(c, sdispls=sd, rdispls=rd, send_lens=send_lens, recv_lens=recv_lens, inputs=sends,
                  keep_outputs=True)
    _check(res, sends, c, sd=sd, rd=rd, recv_lens=recv_lens)


@needs_gxx
def test_kernels_refuse_counts_past_the_scratch_slots(monkeypatch):
    """The device-side check: a piece larger than the scratch slots the call allocated stops every
    rank at the start with a located report (the host check normally comes first)."""
    ir = build_program(gen.ring_alltoall(3))
    r = kernel_runner(ir, "cpu", "float32")
    c = np.full((3, 3), 8)
    real = av.scratch_slot
    monkeypatch.setattr(av, "scratch_slot", lambda counts, k: real(counts, k) // 2)
    res = r.run_v(c)
    assert res.stuck is not None and "refused the AllToAllv counts matrix" in res.stuck


@needs_gxx
def test_skewed_counts_slice_for_the_largest_block():
    """One pair with 90 % of the bytes: the slice is the one an equal AllToAll whose blocks are all
    as large as that pair's gets (the big block streams through full slices), not one sized by the
    average block (which would cut it into thin slices)."""
    from hccc.runtime.rank_memory import LaunchCall
    ir = build_program(gen.direct_alltoall(4))
    r = kernel_runner(ir, "cpu", "float32")
    c = _skewed(4, 200000, 2)
    res = r.run_v(c)
    assert res.ok, res.stuck or res.first_wrong
    big = LaunchCall.plan(ir, int(c.max()) * 4, 4, r.chunk_bytes).slice_bytes   # 4 blocks a rank
    avg = LaunchCall.plan(ir, int(c.sum()), 4, r.chunk_bytes).slice_bytes
    assert res.slice_bytes == big and big >= avg


# ------------------------------------------------------------------------------ properties
@st.composite
def _counts(draw, n: int, inplace: bool):
    kind = draw(st.sampled_from(["random", "skewed", "zero", "sparse"]))
    seed = draw(st.integers(0, 2 ** 16))
    rng = np.random.default_rng(seed)
    if kind == "random":
        c = rng.integers(0, 64, (n, n))
    elif kind == "skewed":
        c = _skewed(n, draw(st.integers(10, 5000)), seed)
    elif kind == "zero":
        c = np.zeros((n, n), np.int64)
    else:
        c = np.where(rng.random((n, n)) < 0.7, 0, rng.integers(1, 100, (n, n)))
    return _symmetric(c) if inplace else c


@needs_gxx
@pytest.mark.slow
@settings(max_examples=40)
@given(data=st.data())
def test_property_generated_programs_as_alltoallv(data):
    alg = data.draw(valid_programs("alltoall", max_ranks=6, min_ranks=2))
    ir = build_program(alg)
    inplace = data.draw(st.booleans())
    dtype = data.draw(st.sampled_from(list(DTYPES)))
    c = data.draw(_counts(ir.nranks, inplace))
    r = kernel_runner(ir, "cpu", dtype)
    sends = _inputs(c, dtype, seed=1)
    res = r.run_v(c, inplace=inplace, inputs=sends, keep_outputs=True)
    assert res.stuck is None and res.ok, res.stuck or res.first_wrong
    if not inplace:
        _check(res, sends, c)


@needs_gxx
@settings(max_examples=6)
@given(data=st.data())
def test_property_small_programs_as_alltoallv(data):
    """The default set's share of the property above: few ranks, float32."""
    alg = data.draw(valid_programs("alltoall", max_ranks=3, min_ranks=2, max_chunks_per_rank=2))
    ir = build_program(alg)
    inplace = data.draw(st.booleans())
    c = data.draw(_counts(ir.nranks, inplace))
    r = kernel_runner(ir, "cpu", "float32")
    sends = _inputs(c, "float32", seed=2)
    res = r.run_v(c, inplace=inplace, inputs=sends, keep_outputs=True)
    assert res.stuck is None and res.ok, res.stuck or res.first_wrong
    if not inplace:
        _check(res, sends, c)


@needs_gxx
@settings(max_examples=6)
@given(data=st.data())
def test_property_a_jobs_ranks_in_threads_run_alltoallv(data):
    """Every rank a Communicator in a thread of one job (the path a job of one rank per process
    takes): its AllToAllv run is the definition, packed or with larger buffers at given
    displacements, out of place or in place; launched by each rank or together (timed), under
    the protocol asked for."""
    from hccc.runtime.local_job import LocalJob
    alg = data.draw(valid_programs("alltoall", max_ranks=3, min_ranks=2, max_chunks_per_rank=2))
    ir = build_program(alg)
    inplace = data.draw(st.booleans())
    c = data.draw(_counts(ir.nranks, inplace))
    n = ir.nranks
    spread = 0 if inplace else data.draw(st.integers(0, 3))    # a gap after every block
    kw = {}
    if spread:
        sd = [[int(sum(c[s][:d])) + spread * d for d in range(n)] for s in range(n)]
        rd = [[int(sum(c[i][d] for i in range(s))) + spread * s for s in range(n)] for d in range(n)]
        kw = {"sdispls": sd, "rdispls": rd, "send_lens": [int(sum(c[s])) + spread * n for s in range(n)],
              "recv_lens": [int(sum(c[:, d])) + spread * n for d in range(n)]}
    sends = [np.random.default_rng(s).integers(0, 100, size=int(sum(c[s])) + spread * n).astype(np.float32)
             for s in range(n)]
    # launched by each rank (untimed) or together (timed), with direct mode's peers array or as one grid
    how = data.draw(st.sampled_from([{}, {"together": True}, {"together": True, "direct": True},
                                     {"together": True, "one_grid": None}]))
    proto = data.draw(st.sampled_from([None, "simple", "ll"]))
    with LocalJob(ir, timeout_s=30) as job:
        res = job.run_v(c, inplace=inplace, inputs=sends, proto=proto, iters=2, **kw, **how)
        assert all(comm.proto == "auto" for comm in job.comms)          # (for this run only)
    assert res.stuck is None and res.ok and res.oracle == "alltoallv", res.stuck or res.first_wrong
    assert proto is None or res.proto == proto
    if how:
        assert res.iters == 2 and res.time_us > 0
    else:
        assert res.iters == 0 and np.isnan(res.time_us)
    if not inplace:
        _check(res, sends, c, sd=kw.get("sdispls"), rd=kw.get("rdispls"), recv_lens=kw.get("recv_lens"))


@needs_gxx
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_property_a_jobs_alltoallv_in_bfloat16_and_with_displacements_passed(data):
    """A job's AllToAllv run in bfloat16 (torch tensors over the ranks' memory) or float32, with
    the displacements passed to the kernels or packed ones (``pass_displs``, as the runner's
    ``run_v`` takes it): the definition where the kernels read the given displacements; given
    displacements with a gap after every block that the kernels are told to ignore
    (``pass_displs=False``: packed) land where packed ones put them."""
    pytest.importorskip("torch")
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_alltoall(3))
    n = 3
    dtype = data.draw(st.sampled_from(["float32", "bfloat16"]))
    c = np.asarray(data.draw(st.lists(st.lists(st.integers(0, 5), min_size=n, max_size=n),
                                      min_size=n, max_size=n)), np.int64)
    spread = data.draw(st.integers(0, 2))
    pass_displs = data.draw(st.sampled_from([None, True, False]))
    sd = [[int(sum(c[s][:d])) + spread * d for d in range(n)] for s in range(n)]
    rd = [[int(sum(c[i][d] for i in range(s))) + spread * s for s in range(n)] for d in range(n)]
    kw = {"sdispls": sd, "rdispls": rd, "send_lens": [int(sum(c[s])) + spread * n for s in range(n)],
          "recv_lens": [int(sum(c[:, d])) + spread * n for d in range(n)]}
    sends = _inputs(c, dtype, seed=1, extra=spread * n)
    with LocalJob(ir, timeout_s=30) as job:
        res = job.run_v(c, inputs=sends, dtype=dtype, pass_displs=pass_displs, **kw)
    assert res.stuck is None and res.dtype == dtype, res.stuck
    if pass_displs is False:
        # the kernels took packed displacements: the definition at those, where it lands
        want = _oracle([list(x) for x in sends], c.tolist(), recv_lens=kw["recv_lens"])
        for d in range(n):
            assert all(res.outputs[d][e] == v for e, v in enumerate(want[d]) if v is not None), d
    else:
        _check(res, sends, c, sd=sd, rd=rd, recv_lens=kw["recv_lens"])


@needs_gxx
def test_a_jobs_alltoallv_grows_its_fifos_to_the_call():
    """FIFOs made small grow on a job's AllToAllv run to what the call needs (more than they held,
    at most the compiled slot), never shrink, and every run is the definition."""
    from hccc.runtime.local_job import LocalJob
    ir = build_program(gen.ring_alltoall(3), chunk_bytes=4096)
    rng = np.random.default_rng(5)
    with LocalJob(ir, timeout_s=30, fifo_bytes=256) as job:
        small = job.fifo_capacity
        assert job.grow_fifos and small < 4096
        for total in (300, 30, 900):
            c = rng.integers(0, total // 3, size=(3, 3))
            sends = _inputs(c, "float32", seed=total)
            before = job.fifo_capacity
            res = job.run_v(c, inputs=sends)
            _check(res, sends, c)
            assert before <= job.fifo_capacity <= 4096
        assert job.fifo_capacity > small


@needs_gxx
def test_a_jobs_alltoallv_refuses_what_the_buffers_cannot_take_before_any_call(monkeypatch):
    """Counts the buffers cannot take, and buffers over the run's memory limit (HCCC_MAX_RUN_BYTES:
    here three ranks' 4 KiB send and receive buffers against 10 KB), refused before any rank's call."""
    from hccc.runtime.local_job import LocalJob
    from hccc.runtime.platform import PlatformError
    ir = build_program(gen.ring_alltoall(3))
    with LocalJob(ir, timeout_s=30) as job:
        calls = []
        for comm in job.comms:
            comm.all_to_all_v = lambda *a, **k: calls.append(a)
        with pytest.raises(av.CountsError, match=r"counts\[1\]\[2\]"):
            job.run_v([[0, 1, 2], [3, 4, -5], [6, 7, 8]])
        monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "10000")
        with pytest.raises(PlatformError, match="over the limit of .*HCCC_MAX_RUN_BYTES"):
            job.run_v([[341] * 3] * 3)          # 3 x 1023 elements of 4 bytes sent and received per rank
        monkeypatch.delenv("HCCC_MAX_RUN_BYTES")
        with pytest.raises(ValueError, match="per-pair counts need an AllToAll program"):
            LocalJob.run_v(type("J", (), {"ir": build_program(gen.ring_allgather(3)), "nranks": 3})(), [[0] * 3] * 3)
        assert calls == []


@needs_gxx
@pytest.mark.parametrize("kw, proto", [({"codegen": "table"}, "ll"), ({"one_grid": False}, "simple")])
def test_kernels_table_mode_ll_and_a_kernel_per_rank(kw, proto):
    """The generic table kernels and the LL protocol (every message through the FIFO as lines)
    read the same counts; so do the ranks' own kernels launched one per rank."""
    ir = build_program(gen.ring_alltoall(4, chunks_per_rank=2))
    r = kernel_runner(ir, "cpu", "float16", **kw)
    c = np.random.default_rng(4).integers(0, 300, (4, 4))
    c[2, 1] = 5000
    sends = _inputs(c, "float16", seed=9)
    res = r.run_v(c, proto=proto, inputs=sends, keep_outputs=True)
    assert res.proto == proto
    _check(res, sends, c)


@needs_gxx
def test_imported_msccl_and_c2c_programs_as_alltoallv(tmp_path):
    """MSCCL XML AllToAlls (all pairs, hierarchical through scratch) and a C2C AllToAll (blocks
    gathered to border ranks and scattered again) pass the check and run with per-pair counts."""
    from hccc.cli import main
    from hccc.compiler.interop.msccl_xml import import_xml_text
    from hccc.compiler.pipeline import load_algorithm
    from msccl_texts import allpairs_xml, hierarchical_xml
    irs = [import_xml_text(allpairs_xml(4, 2), "a.xml"), import_xml_text(hierarchical_xml(2, 2), "h.xml")]
    out = tmp_path / "c2c.rccl"
    assert main(["gen", "c2c", str(ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo"),
                 "--collective", "alltoall", "--pipeline", "2", "-o", str(out)]) == 0
    c2c = build_program(load_algorithm(str(out)))
    assert vblock_map(c2c, False).k == 2 and vblock_map(c2c, True).k == 2
    for ir in irs:
        r = kernel_runner(ir, "cpu", "float32")
        c = np.random.default_rng(1).integers(0, 50, (4, 4))
        sends = _inputs(c, "float32", seed=5)
        _check(r.run_v(c, inputs=sends, keep_outputs=True), sends, c)


REFUSE_HARNESS = r"""
#include "hccc_prims.h"
// hccc_launch_init of a one-primitive program of 2 ranks, as an ordinary program's engine
// (hccc_program) or an AllToAll program's (hccc_vprogram), given a counts matrix or none:
// 1 = it would run; else 0, with the error record's wait and chunk and the abort flag.
static hccc_rank_consts consts = {0, 2, 0, 0, 1024, 1, 1, 1, 0, 0, 0, 2};
static hccc_pd prims[1];
static int32_t deps[1];
static hccc_tb_range tbs[2] = {{0, 0}, {1, 0}};
static hccc_shared sh;
extern "C" __attribute__((visibility("default"))) int hccc_test_init(int vprog, int counts, int* wait,
                                                                    int* chunk, uint32_t* abort_flag) {
  static int64_t matrix[4] = {1, 2, 3, 4};
  static int32_t vmap[2] = {1, -1};
  static hccc_error err;
  err = hccc_error{};
  *abort_flag = 0;
  hccc_args a{};
  a.count = 64;
  a.abort_flag = abort_flag;
  a.error = &err;
  a.vcounts = counts ? matrix : nullptr;
  a.vmap = counts ? vmap : nullptr;
  const hccc_program p{&consts, prims, deps, tbs};
  const bool go = vprog ? hccc_launch_init<float>(sh, &a, hccc_vprogram{p}, 0)
                        : hccc_launch_init<float>(sh, &a, p, 0);
  *wait = err.valid ? err.wait : -1;
  *chunk = err.valid ? err.chunk : -2;
  return go ? 1 : 0;
}
"""


@needs_gxx
def test_a_kernel_without_the_alltoallv_path_refuses_counts(tmp_path):
    """Counts given to an ordinary program's kernels (compiled without the AllToAllv path) stop the
    launch with a record the runtime describes (no entry of the matrix named), where an AllToAll
    program's kernels take them; both run without counts."""
    import ctypes
    from conftest import harness_library
    from hccc.runtime.kernel_abi import WAIT_COUNTS
    from hccc.runtime.kernel_errors import describe_stuck
    lib, _ = harness_library(tmp_path, REFUSE_HARNESS, "refuse")
    lib.hccc_test_init.restype = ctypes.c_int
    wait, chunk, abort = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint32()

    def init(vprog, counts):
        return lib.hccc_test_init(vprog, counts, ctypes.byref(wait), ctypes.byref(chunk), ctypes.byref(abort))

    assert init(0, 1) == 0 and (wait.value, chunk.value, abort.value) == (WAIT_COUNTS, -1, 1)
    assert init(1, 1) == 1 and (wait.value, abort.value) == (-1, 0)
    assert init(0, 0) == 1 and init(1, 0) == 1 and abort.value == 0
    from hccc.runtime.kernel_abi import ErrorRecord
    rec = ErrorRecord(valid=1, rank=1, tb=0, seq=-1, op=-1, wait=WAIT_COUNTS, chunk=-1, task=-1)
    assert "not an AllToAll program's" in describe_stuck(build_program(gen.ring_allreduce(2)), rec, 0.0)
