"""Channels (ProgramIR ``nchannels``): every thread block runs as K blocks, each moving its part of
every micro-batch slice over connections and progress counters of its own.

Checked here: the partition rule against an independent oracle (parts tile the slice window, cut at
16-byte granules, as even as the granules allow); the kernels' own partition (a replica's counters
and slots, read back after a run) against it; random valid programs of every collective with K in
{2, 3}, uneven counts, every dtype and op, in place and out of place, one grid and a kernel per
rank, specialised and table kernels, against the reference executor (a run that completes is also
the deadlock check: the replicated wait graph projects onto the one-block program's, which
``hccc check`` proves acyclic); the ProgramIR round trip of the new header field and the refusal of
schema /1 files; ``auto`` and the block limit; the command line; the one-rank-per-process
Communicator. nvcc / hipcc builds of a multi-channel program are with the slow tests.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.backend.codegen import generate
from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.check import load_ir_json
from hccc.compiler.ir.program_ir import MAX_CHANNELS, IRFormatError, channel_part
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import (ChannelError, auto_channels, max_blocks_per_rank, parse_channels,
                                           resolve_channels, with_channels)
from hccc.runtime.local_job import LocalJob
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall")


# ---------------------------------------------------------------------------- the partition
@settings(max_examples=200)
@given(slice_elems=st.integers(1, 5000), esize=st.sampled_from([2, 4]), k=st.integers(1, 9))
def test_parts_tile_the_slice_window_at_granules_as_evenly_as_they_allow(slice_elems, esize, k):
    g = 16 // esize
    parts = [channel_part(slice_elems, g, k, c) for c in range(k)]
    # oracle: element e of the window, in granule e // g of ng granules, goes to the channel c
    # with floor(c * ng / k) <= e // g < floor((c + 1) * ng / k)
    ng = -(-slice_elems // g)
    owner = np.empty(slice_elems, np.int64)
    for c in range(k):
        a, b = (c * ng) // k, ((c + 1) * ng) // k
        owner[a * g:b * g] = c
    for c, (lo, hi) in enumerate(parts):
        assert 0 <= lo <= hi <= slice_elems
        assert np.array_equal(np.flatnonzero(owner == c), np.arange(lo, hi))
        assert lo % g == 0
    sizes = [(-(-(hi - lo) // g)) for lo, hi in parts]           # granules per part
    assert sum(sizes) == ng and max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------------------- correctness, CPU
@needs_gxx
@pytest.mark.parametrize("collective", COLLECTIVES)
# two builds a collective by default (the kernel property, fused-channel and direct-mode files run
# random programs of every collective too); the thorough profile runs ten times as many
@settings(max_examples=examples(2), deadline=None)
@given(data=st.data())
def test_random_programs_with_several_channels_match_the_oracle(collective, data):
    """Random valid programs, K in {2, 3}: uneven counts, every dtype / op, in place and out of
    place (kernel_cases), through the one grid and through a kernel per rank, specialised and
    table kernels. A run that completes is also the deadlock check."""
    alg = data.draw(valid_programs(collective, max_ranks=5), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([64, 128, 256]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))     # fused receive-and-forward too
    ir = with_channels(ir, data.draw(st.sampled_from([2, 3]), label="channels"))
    case = data.draw(kernel_cases(ir, max_microbatches=10), label="case")
    one_grid = data.draw(st.booleans(), label="one_grid")
    codegen = data.draw(st.sampled_from(["specialized", "table"]), label="codegen")
    res = run_case(ir, case, one_grid=one_grid, codegen=codegen)
    assert res.ok, f"{alg.header.name}, {ir.nchannels} channels, {codegen}: " + describe_failure(case, res)


@needs_gxx
# by default float16 with sum and min and int32 with max: every op, a build each (float32, bfloat16
# and the rest of float16 and int32: the slow set; the one-grid and kernel property tests run every
# dtype by default too)
@pytest.mark.parametrize("dtype,k,ops", [pytest.param("float32", 2, OPS, marks=pytest.mark.slow),
                                         ("float16", 3, ("sum", "min")),
                                         pytest.param("float16", 3, ("max",), marks=pytest.mark.slow),
                                         pytest.param("bfloat16", 2, OPS, marks=pytest.mark.slow),
                                         ("int32", 3, ("max",)),
                                         pytest.param("int32", 3, ("sum", "min"), marks=pytest.mark.slow),
                                         pytest.param("float32", 1, OPS, marks=pytest.mark.slow)])   # the comparison
def test_channels_every_dtype_and_op_uneven_counts(k, dtype, ops):
    """One program with dependencies across TBs (HM AllReduce), every dtype with 2 or 3 channels
    (and one channel for comparison), every op, sizes with remainders (empty, one-element and
    ragged chunks, ragged last slices), in and out of place."""
    from hccc.testing import assert_kernels_match
    ir = with_channels(build_program(gen.hm_allreduce(2, 2), chunk_bytes=128), k)
    assert len(ir.dep_on), "the program must have cross-TB dependencies"
    assert_kernels_match(ir, dtypes=[dtype], ops=ops, counts=[0, 1, 5, 4 * 24 + 3, 4 * 96 * 3 + 7],
                         nthreads=2)


@needs_gxx
@pytest.mark.parametrize("make,k", [(lambda: gen.ring_broadcast(4, 1), 3), (lambda: gen.ring_reduce(4, 2), 2),
                                    (lambda: gen.hm_allreduce(2, 2), 3)])
def test_fused_primitives_with_channels_match_the_oracle(make, k):
    """Receive-and-forward primitives (recvCopySend, recvReduceSend, ...) split across channels."""
    from hccc.testing import assert_kernels_match
    ir = with_channels(build_program(make(), chunk_bytes=64, fuse=True), k)
    assert np.isin(ir.prims["op"], [3, 4, 5]).any()
    assert_kernels_match(ir, dtypes=["float16"], ops=["max"], counts=[3, 4 * 32 * 3 + 5], nthreads=2)


@needs_gxx
@pytest.mark.parametrize("k", [2, 3])
def test_table_kernels_with_channels_match_the_oracle(k):
    from hccc.testing import assert_kernels_match
    ir = with_channels(build_program(gen.hm_allgather(2, 3), chunk_bytes=64), k)
    for one_grid in (True, False):
        assert_kernels_match(ir, dtypes=["float16"], ops=["sum"], counts=[7, 6 * 16 * 3 + 5],
                             inplace=(False, True), nthreads=2, codegen="table", one_grid=one_grid)


@needs_gxx
def test_each_channel_carries_its_own_part(tmp_path):
    """After a run, read the counters back: every channel's copy of every connection posted one
    message per micro-batch of every primitive (each replica runs the whole protocol), and each
    replica's slot holds its own part of the last slice: the bytes of the part the oracle assigns
    it, at the region's data offset."""
    ring = build_program(gen.ring_allgather(2), chunk_bytes=256)
    k = 3
    ir = with_channels(ring, k)
    count = 2 * 40                       # one chunk = 40 floats = 160 bytes: one micro-batch
    # the FIFO path (direct mode would write the receivers' outputs, leaving the slots unused)
    with LocalJob(ir, nthreads=2, direct="off") as job:
        res = job.run(count=count, slice_bytes=256, proto="simple")
        assert res.ok
        for r in range(2):
            mem = job.comms[r].memory             # the rank's own counters and FIFOs
            plan, pf = mem.plan, mem.platform
            nrecv = len(plan.recv_conns)
            assert nrecv == k * 1 and len(plan.send_conns) == k
            ctrl = np.zeros(plan.ctrl_bytes // 8, np.uint64)
            pf.memcpy_dtoh(ctrl, mem.ctrl)
            assert ctrl[:nrecv].tolist() == [1] * k            # tails: one message per channel
            slots = np.zeros(plan.slots_bytes, np.uint8)
            pf.memcpy_dtoh(slots, mem.slots)
            g = 16 // 4
            for c in range(k):
                # the window: the 256-byte slice capped at the launch's slot share, which holds the
                # call's 160-byte chunk and no more (FIFO slots sized by the call)
                lo, hi = channel_part(160 // 4, g, k, c)
                hi = min(hi, 40)
                lo = min(lo, hi)
                region = slots[c * plan.fifo_bytes:]
                mis = int(region[:4].view(np.uint32)[0]) % 16
                data = region[16 + mis:16 + mis + 4 * (hi - lo)].view(np.float32)
                peer = 1 - r
                # rank `peer` sent its own chunk: the reference inputs of chunk `peer`
                from hccc.runtime import reference
                inputs = reference.make_inputs("allgather", 2, count, "float32", nchunks=2, seed=0)
                assert np.array_equal(data, inputs[peer][lo:hi]), (r, c)


# ---------------------------------------------------------------------------- ProgramIR
@settings(max_examples=10)
@given(k=st.integers(1, MAX_CHANNELS))
def test_ir_round_trip_keeps_the_channels(k):
    ir = with_channels(build_program(gen.ring_allreduce(3), chunk_bytes=64), k)
    text = ir.to_json()
    assert '"schema": "hccc.program/2"' in text and f'"nchannels": {k}' in text
    back = load_ir_json(text)
    assert back.nchannels == k and back.to_json() == text


def test_old_schema_and_bad_channel_counts_are_refused_clearly():
    text = build_program(gen.ring_allreduce(3), chunk_bytes=64).to_json()
    old = text.replace('"schema": "hccc.program/2"', '"schema": "hccc.program/1"')
    with pytest.raises(IRFormatError, match=r"hccc.program/1.*older.*nchannels.*regenerate.*hccc ALGO -o") as e:
        load_ir_json(old)
    assert (e.value.line, e.value.col) != (1, 1)
    for bad in ("0", str(MAX_CHANNELS + 1), '"2"'):
        with pytest.raises(IRFormatError, match="nchannels"):
            load_ir_json(re.sub(r'"nchannels": \d+', f'"nchannels": {bad}', text))
    with pytest.raises(IRFormatError, match="nchannels"):
        load_ir_json(re.sub(r'\n "nchannels": \d+,', "", text))


# ---------------------------------------------------------------------------- choosing K
def test_auto_rule_and_block_limit():
    ir = build_program(gen.ring_allreduce(8), chunk_bytes=1 << 20)
    T = int(max(ir.ntbs))
    assert parse_channels("auto") is None and parse_channels("3") == 3
    for bad in ("0", "x", str(MAX_CHANNELS + 1)):
        with pytest.raises(ValueError):
            parse_channels(bad)
    # CPU emulation: 1; a program's own count is kept; an explicit request wins
    assert resolve_channels(None, ir, ["cpu"]) == 1
    assert resolve_channels(None, with_channels(ir, 3), ["cpu"]) == 3
    assert resolve_channels(2, with_channels(ir, 3), ["cuda"]) == 2
    # GPU: the algorithm's declared count, else min(8, SMs // (4 T), share // 16K)
    assert resolve_channels(None, ir, ["cuda"], declared=4) == 4
    assert auto_channels(ir, "cuda") == max(1, min(8, 132 // (4 * T), (1 << 20) // (16 << 10)))
    assert auto_channels(ir, "cuda", sms=8) == 1
    small = build_program(gen.ring_allreduce(8), chunk_bytes=32 << 10)
    assert auto_channels(small, "hip") == max(1, min(8, 104 // (4 * T), 2))
    assert resolve_channels(None, ir, ["cuda", "hip"]) == min(auto_channels(ir, "cuda"), auto_channels(ir, "hip"))
    # the most blocks a device holds at once: refused past it, with the largest count that fits
    cap = max_blocks_per_rank(ir, "cuda")
    assert cap == 132 * (2048 // min(1024, ir.nwarps * 32))
    # a small device (3 SMs): 3 x 4 blocks of 512 threads
    cap = max_blocks_per_rank(ir, "cuda", sms=3)
    assert cap == 3 * (2048 // min(1024, ir.nwarps * 32))
    fit = cap // T
    with pytest.raises(ChannelError, match=rf"{fit + 1} channels x {T} thread blocks.*at most --channels {fit}"):
        resolve_channels(fit + 1, ir, ["cuda"], sms=3)
    assert resolve_channels(fit, ir, ["cuda"], sms=3) == fit
    assert resolve_channels(fit + 1, ir, ["cpu"], sms=3) == fit + 1      # checked at launch there
    # ranks sharing a device share its SMs (hccc run's single-GPU test mode)
    assert max_blocks_per_rank(ir, "cuda", ranks_per_device=8) == max_blocks_per_rank(ir, "cuda") // 8
    assert auto_channels(ir, "cuda", ranks_per_device=8) == max(1, min(8, 132 // (4 * T * 8), 64))
    with pytest.raises(ChannelError, match="shared by 8 ranks"):
        resolve_channels(max_blocks_per_rank(ir, "cuda", ranks_per_device=8) // T + 1, ir, ["cuda"],
                         ranks_per_device=8)
    assert max_blocks_per_rank(ir, "cpu") is None


# ---------------------------------------------------------------------------- output, command line
def test_run_time_rule_takes_the_device_and_its_ranks():
    """With the device known (hccc run on a GPU), auto fills it as NCCL does for large messages:
    8 ranks on 8 H100s get up to 32 channels, 8 ranks on one H100 an eighth of it."""
    from hccc.compiler.passes.channels import device_channels
    from hccc.commands.run import _device_shape
    ir = build_program(gen.ring_allreduce(8), chunk_bytes=1 << 20)
    T = int(max(ir.ntbs))
    share_parts = (1 << 20) // (16 << 10)                        # 64 parts of 16 KiB in a 1 MiB slot
    assert device_channels(ir, 132, 1) == min(32, 132 // T, share_parts)
    assert device_channels(ir, 132, 8) == max(1, min(32, 132 // (8 * T), share_parts))
    assert device_channels(ir, 304, 1) == min(32, 304 // T, share_parts)       # MI300X: 304 CUs
    assert device_channels(build_program(gen.ring_allreduce(8), chunk_bytes=32 << 10), 132, 1) == 2
    assert resolve_channels(None, ir, ["cuda"], device_sms=132) == device_channels(ir, 132, 1)
    assert device_channels(ir, 132, 1) > auto_channels(ir, "cuda")            # the nominal rule: 8
    # an explicit count, the program's own and the declared one still win
    assert resolve_channels(3, ir, ["cuda"], device_sms=132) == 3
    assert resolve_channels(None, ir, ["cuda"], declared=4, device_sms=132) == 4
    assert _device_shape("cpu", 8) == (None, 8)


def test_manifest_grid_and_sources_count_every_channel(tmp_path):
    ir = with_channels(build_program(gen.hm_allreduce(2, 3), chunk_bytes=64), 3)
    generate(ir, tmp_path, platforms=["cuda"] * ir.nranks)
    man = json.loads((tmp_path / "manifest.json").read_text())
    ntbs = [int(t) for t in ir.ntbs]
    assert man["nchannels"] == 3 and man["stats"]["blocks_per_rank_max"] == 3 * max(ntbs)
    assert man["channel_stride"] == 1 + max(c for e in man["ranks"] for k in ("send_conns", "recv_conns")
                                            for _, c in e[k])
    assert [e["blocks"] for e in man["ranks"]] == [3 * t for t in ntbs]
    assert man["grid"]["cuda"]["blocks"] == 3 * sum(ntbs)
    src = (tmp_path / f"{ir.name}_r0.cu").read_text()
    e = man["ranks"][0]
    consts = f"{ntbs[0]}, 3, {len(e['send_conns'])}, {len(e['recv_conns'])}, {e['progress_slots']}, {ir.nranks}}};"
    assert consts in src
    host = (tmp_path / "hccc_host.h").read_text()
    assert f"hccc_host_tbs[HCCC_HOST_NRANKS] = {{ {', '.join(str(3 * t) for t in ntbs)} }}" in host


def _hccc(*args, cwd=None):
    import sys
    return subprocess.run([sys.executable, "-m", "hccc", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


@pytest.mark.slow   # a minute of the default run went to a few CLI and random-cluster runs
@needs_gxx
def test_command_line_channels(tmp_path):
    alg = tmp_path / "ring.rccl"
    alg.write_text(_ring_text(3))
    out = tmp_path / "out"
    p = _hccc(alg, "-o", out, "--channels", "3", "--chunk-size", "4K")
    assert p.returncode == 0, p.stderr
    assert "3 channels" in p.stdout
    man = json.loads((out / "manifest.json").read_text())
    assert man["nchannels"] == 3
    xml = (out / f"{man['algorithm']}.xml").read_text()
    assert re.search(r'<algo [^>]*nchannels="3"', xml)     # one MSCCL instance per channel
    p = _hccc("run", out, "--bytes", "4K,1000004", "--dtype", "bfloat16", "--op", "max", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True
    p = _hccc("fuzz", alg, "--channels", "2", "--examples", "3", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["channels"] == 2 and json.loads(p.stdout)["ok"] is True
    for bad in ("0", "many"):
        p = _hccc(alg, "-o", tmp_path / "bad", "--channels", bad)
        assert p.returncode == 2 and "--channels" in p.stderr and "Traceback" not in p.stderr
    p = _hccc(alg, "-o", tmp_path / "bad", "--channels", str(MAX_CHANNELS), "--target", "cuda")
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr


def test_a_header_count_that_cannot_run_is_located_at_the_header(tmp_path):
    """A header nChannels past MAX_CHANNELS is refused where it is written, by every command alike:
    ``check`` accepts only what the GPU compile takes (the CPU emulation, which runs one channel
    whatever the header says, refuses it too: a header that checks must compile), naming nChannels,
    not a --channels nobody gave."""
    from cli_runs import run_cli
    alg = tmp_path / "ring.rccl"
    text = _ring_text(3)
    alg.write_text(text.replace("nChannels=1", f"nChannels={MAX_CHANNELS + 1}"))
    col = text.splitlines()[0].index("nChannels=1") + len("nChannels=") + 1
    for cmd in ((alg, "-o", tmp_path / "out", "--target", "cuda"), ("check", alg), ("run", alg, "--sizes", "4096")):
        p = run_cli(*cmd)
        assert p.returncode == 1 and not (tmp_path / "out").exists(), (cmd, p.stderr)
        assert re.match(rf"^{re.escape(str(alg))}:1:{col}: error: header parameter 'nChannels' must be at most "
                        rf"{MAX_CHANNELS} \(MAX_CHANNELS", p.stderr), p.stderr
        assert "--channels" not in p.stderr and "Traceback" not in p.stderr
    # the most the kernels take checks, and runs (one channel on the CPU emulation)
    alg.write_text(text.replace("nChannels=1", f"nChannels={MAX_CHANNELS}"))
    assert run_cli("check", alg).returncode == 0
    assert run_cli("run", alg, "--sizes", "4096").returncode == 0


def _ring_text(n: int) -> str:
    lines = [f'def ResCCLAlgo(nRanks={n}, nChannels=1, nWarps=16, AlgoName="ring", OpType="Allreduce", '
             'GPUPerNode=8, NICPerNode=8):']
    for k in range(n - 1):
        for r in range(n):
            lines.append(f"    transfer({r}, {(r + 1) % n}, {k}, {(r - k) % n}, rrc)")
    for k in range(n - 1):
        for r in range(n):
            lines.append(f"    transfer({r}, {(r + 1) % n}, {n - 1 + k}, {(r + 1 - k) % n}, recv)")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- one rank per process
@pytest.fixture(scope="module")
def pool3(tmp_path_factory):
    from communicator_calls import require_torch
    require_torch()
    from rank_pool import RankPool
    p = RankPool(3, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


@needs_gxx
@pytest.mark.slow     # every process builds its kernels
def test_communicator_runs_several_channels_in_separate_processes(pool3):
    """Each rank in its own process (FIFOs and counters of every channel in POSIX shared memory,
    connected through the manifest's replicated tables): uneven counts, several micro-batches."""
    from communicator_calls import run
    ir = with_channels(build_program(gen.ring_allreduce(3, [0, 2, 1]), chunk_bytes=64), 3)
    for count in (1000 + 2, 37):
        run(pool3, ir, count, "float32", "sum", seed=count)


# ---------------------------------------------------------------------------- nvcc / hipcc
ONE_INSTANCE = ["-DHCCC_ENABLE_FLOAT16=0", "-DHCCC_ENABLE_INT32=0", "-DHCCC_ENABLE_MAX=0", "-DHCCC_ENABLE_MIN=0",
                "-DHCCC_ENABLE_INT64=0", "-DHCCC_ENABLE_UINT8=0", "-DHCCC_ENABLE_FLOAT64=0", "-DHCCC_ENABLE_PROD=0", "-DHCCC_ENABLE_AVG=0"]


def _compile_channels(tmp_path, platform, cmd):
    """A 3-channel program with cross-TB dependencies: every rank source and the one-grid entry in
    one unit, and the table mode's generic kernels, without a warning."""
    from hccc.compiler.backend.table_codegen import generate_table
    ir = with_channels(build_program(gen.hm_allreduce(2, 2), chunk_bytes=4096), 3)
    ext = "cu" if platform == "cuda" else "hip"
    spec, table = tmp_path / "spec", tmp_path / "table"
    spec.mkdir()
    table.mkdir()
    generate(ir, spec, platforms=[platform] * ir.nranks)
    man = json.loads((spec / "manifest.json").read_text())
    tu = spec / f"all.{ext}"
    tu.write_text("".join(f'#include "{e["source"]}"\n' for e in man["ranks"])
                  + f'#include "{man["grid"][platform]["source"]}"\n')
    generate_table(ir, table, platforms=[platform] * ir.nranks)
    for d, src in ((spec, tu), (table, table / f"hccc_table.{ext}")):
        res = subprocess.run(cmd + ["-I", str(d), "-c", str(src), "-o", str(tmp_path / "o.o")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-4000:]
        assert "warning" not in res.stderr.lower(), res.stderr[-4000:]


@pytest.mark.slow
def test_channels_compile_nvcc(tmp_path, nvcc):
    _compile_channels(tmp_path, "cuda", [nvcc, "-std=c++17", "-arch=sm_90", *ONE_INSTANCE])


@pytest.mark.slow
def test_channels_compile_hipcc(tmp_path, hipcc, monkeypatch):
    monkeypatch.setenv("HIP_PLATFORM", "amd")
    _compile_channels(tmp_path, "hip", [hipcc, "-std=c++17", "--offload-arch=gfx90a", "-Wall", *ONE_INSTANCE])
