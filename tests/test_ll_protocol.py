"""The LL (low-latency) FIFO protocol of the kernels (``hccc_args::proto``, ``hccc run --proto``).

Under LL every 16-byte line of a slot region carries 8 bytes of data as two 8-byte words, each 4
data bytes and a 4-byte flag, the index of the message on its connection plus ``abi.LL_FLAG_BASE``
plus the launch's flag epoch times 2**20, written with one 16-byte store whose words are each
single-copy atomic; the receiver's threads poll their own lines until both words carry the flag
(no tail, no fence). Checked here:

* the receive of one line, in the CPU emulation: a line whose flag is stale (the previous message
  in that slot, the message before, zeroed memory, the same message of an earlier epoch), or whose
  data has been written without its flag in either word (a torn line), is never consumed; the wait gives up on the timeout and names the
  wait in the error record; once the whole line is stored it is consumed with its data;
* the send of lines: each line holds the part's bytes (zero-padded) and the message's flag;
* programs of several collectives, dtypes, ops, uneven counts, channels, in and out of place,
  specialised and table kernels, run with LL against the reference executor; the slots read back
  after a run hold lines (flag of the slot's last message, the data sent) where Simple leaves a
  header and raw data;
* ``auto`` picks LL up to ``abi.LL_AUTO_MAX_BYTES`` and Simple above; LL falls back to Simple, and
  says why, for MSCCL imports proven with one micro-batch per chunk;
* (slow) random valid programs of every collective under LL.
"""
from __future__ import annotations

import ctypes
import dataclasses
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime import reference
from hccc.runtime.launcher import Runner
from hccc.runtime.local_job import LocalJob
from hccc.compiler.passes.slicing import slot_share_bytes
from hccc.runtime.rank_memory import launch_proto
from conftest import examples, harness_library
from hccc.testing import KernelCase, describe_failure, kernel_cases, run_case, valid_programs

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

HARNESS = r"""
#include "hccc_prims.h"
#include <thread>
#include <vector>

// The launch and the unit a data thread's LL wait reports from (rank 3, TB 5; chunk 7, micro-batch 2).
static hccc_launch launch0(uint32_t* abort_flag, hccc_error* err, uint64_t timeout) {
  hccc_launch L;
  __builtin_memset((void*)&L, 0, sizeof L);
  L.abort_flag = abort_flag;
  L.error = err;
  L.timeout = timeout;
  L.rank = 3;
  L.tb = 5;
  return L;
}
static hccc_unit unit0(uint32_t kind) {
  hccc_unit u;
  __builtin_memset((void*)&u, 0, sizeof u);
  u.kind = kind;
  u.op = HCCC_RECV;
  u.chunk = 7;
  u.m = 2;
  return u;
}

// One thread receives one line: 1 and *data (its 8 data bytes) when consumed, 0 when the wait
// gave up (timeout in hccc_clock ticks, 0 = none, or the abort flag); err receives the error record.
extern "C" __attribute__((visibility("default"))) int hccc_test_ll_recv(
    const uint64_t* line, uint32_t flag, uint64_t timeout, uint32_t* abort_flag, hccc_error* err,
    uint64_t* data) {
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, 1);
  int ok = 0;
  struct job { hccc_launch L; hccc_unit u; const uint64_t* line; uint32_t flag; uint64_t* data; int* ok; };
  job j{launch0(abort_flag, err, timeout), unit0(HCCC_K_RUN | HCCC_K_RLL), line, flag, data, &ok};
  std::thread t([&] {
    hccc_cpu_run_thread(+[](const job& x) {
      *x.ok = hccc_ll_wait(x.line, x.flag, x.data, x.L, x.u) ? 1 : 0;
    }, j, &blk, 0);
  });
  t.join();
  return ok;
}

// The flag the kernels give every line of message k of a launch in LL epoch `epoch` (the launch
// holds the epoch shifted into place, as hccc_launch_init puts it).
extern "C" __attribute__((visibility("default"))) uint32_t hccc_test_ll_flag(uint64_t k,
                                                                            uint32_t epoch) {
  return hccc_ll_flag((uint32_t)((uint64_t)epoch << HCCC_LL_EPOCH_SHIFT), k);
}

// The send side of an LL piece: n float32 / float16 elements of src as lines with flag `flag`,
// by nthreads data threads of one TB.
template <typename T> static int send_lines(const void* src, uint64_t* lines, uint32_t flag,
                                            uint64_t n, int nthreads) {
  static uint32_t abort_flag = 0;
  struct job { hccc_launch L; hccc_unit u; };
  job j{launch0(&abort_flag, nullptr, 0), unit0(HCCC_K_RUN | HCCC_K_SLL)};
  j.u.op = HCCC_SEND;
  j.u.sflag = flag;
  j.u.npieces = 1;
  j.u.p[0].a = src;
  j.u.p[0].o1 = lines;
  j.u.p[0].n = n;
  static hccc_cpu_block blk;
  hccc_cpu_block_init(&blk, 0, nthreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t)
    ts.emplace_back([&, t] {
      hccc_cpu_run_thread(+[](const job& x) {
        hccc_unit_data<T, HCCC_SUM>(x.u, x.L, (uint32_t)hccc_tid(), (uint32_t)hccc_nthreads());
      }, j, &blk, t);
    });
  for (auto& t : ts) t.join();
  return 1;
}
extern "C" __attribute__((visibility("default"))) int hccc_test_ll_send(
    int half, const void* src, uint64_t* lines, uint32_t flag, uint64_t n, int nthreads) {
  return half ? send_lines<hccc_half>(src, lines, flag, n, nthreads)
              : send_lines<float>(src, lines, flag, n, nthreads);
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib, _ = harness_library(tmp_path_factory.mktemp("ll"), HARNESS, "ll", opt="-O2")
    lib.hccc_test_ll_recv.restype = ctypes.c_int
    lib.hccc_test_ll_recv.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_void_p]
    lib.hccc_test_ll_flag.restype = ctypes.c_uint32
    lib.hccc_test_ll_flag.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
    lib.hccc_test_ll_send.restype = ctypes.c_int
    lib.hccc_test_ll_send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                      ctypes.c_uint64, ctypes.c_int]
    return lib


class _Err(ctypes.Structure):
    _fields_ = [("claimed", ctypes.c_uint32), ("valid", ctypes.c_uint32), ("rank", ctypes.c_int32),
                ("tb", ctypes.c_int32), ("seq", ctypes.c_int32), ("op", ctypes.c_int32),
                ("wait", ctypes.c_int32), ("chunk", ctypes.c_int32), ("task", ctypes.c_int64),
                ("microbatch", ctypes.c_uint64), ("waited", ctypes.c_uint64)]


def _recv(lib, line: np.ndarray, flag: int, timeout_us: float = 20_000):
    """(consumed, the line's 8 data bytes, error record) of one receive of a line awaiting ``flag``."""
    abort = np.zeros(1, np.uint32)
    err, data = _Err(), np.zeros(1, np.uint64)
    ok = lib.hccc_test_ll_recv(line.ctypes.data, flag, int(timeout_us * abi.TIMER_TICKS_PER_US["cpu"]),
                               abort.ctypes.data, ctypes.addressof(err), data.ctypes.data)
    return bool(ok), int(data[0]), err


def _line(data: int, flag: int, flag2: int | None = None) -> np.ndarray:
    """A 16-byte line: two words, each 4 data bytes (low) and a flag (high)."""
    f2 = flag if flag2 is None else flag2
    return np.array([(flag << 32) | (data & 0xFFFFFFFF), (f2 << 32) | (data >> 32)], np.uint64)


def test_error_record_layout_matches_the_abi():
    assert [f[0] for f in _Err._fields_] == [f.name for f in abi.ERROR]


@pytest.mark.parametrize("stale", ["previous message", "previous round of the slot", "zeroed"])
def test_a_line_with_a_stale_flag_is_never_consumed(lib, stale):
    k = 20                                       # awaited: message 20 on the connection
    want = k + abi.LL_FLAG_BASE
    old = {"previous message": want - 1, "previous round of the slot": want - abi.NSLOTS, "zeroed": 0}[stale]
    line = _line(0xDEADBEEF if stale != "zeroed" else 0, old)
    ok, _, err = _recv(lib, line, want)
    assert not ok
    assert err.valid == 1 and err.wait == 1 and (err.rank, err.tb, err.chunk, err.microbatch) == (3, 5, 7, 2)


@pytest.mark.parametrize("epoch", [1, 2, abi.LL_EPOCHS // 2, abi.LL_EPOCHS - 1])
@pytest.mark.parametrize("k", [0, 5, abi.LL_EPOCH_MESSAGES - 1])
def test_a_line_of_an_earlier_launch_is_never_consumed(lib, epoch, k):
    """Message k of a launch in LL epoch ``epoch`` finds the line message k of the launch before
    (epoch - 1) or of the first epoch left in its slot: the wait gives up; the line of its own
    epoch is consumed. (A kernel whose flag ignored the epoch would take the stale data.)"""
    want = lib.hccc_test_ll_flag(k, epoch)
    for old_epoch in {epoch - 1, 0}:
        stale = lib.hccc_test_ll_flag(k, old_epoch)
        ok, _, err = _recv(lib, _line(0xDEADBEEF, stale), want, timeout_us=1000)
        assert not ok and err.valid == 1, (k, epoch, old_epoch, hex(stale), hex(want))
    ok, data, _ = _recv(lib, _line(0x5678_0000_1234, want), want)
    assert ok and data == 0x5678_0000_1234


@settings(max_examples=examples(200), deadline=None)
@given(k1=st.integers(0, abi.LL_EPOCH_MESSAGES - 1), k2=st.integers(0, abi.LL_EPOCH_MESSAGES - 1),
       e1=st.integers(0, abi.LL_EPOCHS - 1), e2=st.integers(0, abi.LL_EPOCHS - 1))
def test_flags_of_two_epochs_never_meet(lib, k1, k2, e1, e2):
    """Every flag of a launch of at most LL_EPOCH_MESSAGES messages per connection lies in its
    epoch's range of 2**20 values, none of them 0 (zeroed memory): no flag of one epoch is one of
    another's, written out as that interval rather than with the kernels' formula."""
    f1, f2 = lib.hccc_test_ll_flag(k1, e1), lib.hccc_test_ll_flag(k2, e2)
    assert e1 * (1 << 20) < f1 < (e1 + 1) * (1 << 20) and f1 != 0
    assert (f1 == f2) == (e1 == e2 and k1 == k2)


def test_the_last_epoch_s_flags_end_at_the_top_of_32_bits(lib):
    assert abi.LL_EPOCHS * (1 << abi.LL_EPOCH_SHIFT) == 1 << 32
    assert lib.hccc_test_ll_flag(abi.LL_EPOCH_MESSAGES - 1, abi.LL_EPOCHS - 1) == (1 << 32) - 1
    assert lib.hccc_test_ll_flag(0, 0) == abi.LL_FLAG_BASE


def test_a_torn_line_is_not_consumed_until_its_flag_half_lands(lib):
    """The new data half of a word written over an old line (its flag half still stale): not
    consumed; the first word whole but the second stale: not consumed either; both words' flags
    then written: consumed, with the new data of both words."""
    want = 9 + abi.LL_FLAG_BASE
    line = _line(0x33333333_11111111, want - abi.NSLOTS)
    halves = line.view(np.uint32)                # little-endian: [data0, flag0, data1, flag1]
    halves[0] = 0x22222222                       # the first data half alone
    ok, _, _ = _recv(lib, line, want)
    assert not ok
    halves[1] = want                             # the first word whole, the second stale
    ok, _, _ = _recv(lib, line, want)
    assert not ok
    halves[2] = 0x44444444
    halves[3] = want                             # now the second word too
    ok, data, err = _recv(lib, line, want)
    assert ok and data == 0x44444444_22222222 and err.valid == 0


def test_a_whole_line_is_consumed_at_once(lib):
    want = 1 + abi.LL_FLAG_BASE
    ok, data, err = _recv(lib, _line(0x40000000_3F800000, want), want)
    assert ok and data == 0x40000000_3F800000 and err.valid == 0


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 33])
def test_sent_lines_hold_the_data_and_the_flag(lib, half, n):
    """Line j holds bytes [8j, 8j + 8) of the data, zero-padded, as two words of 4 data bytes and
    the flag each (NCCL's LL layout); nothing is written past the last line."""
    dt = np.float16 if half else np.float32
    src = (np.arange(n) * 1.5 - 7).astype(dt)
    per = abi.LL_DATA // src.itemsize
    nlines = -(-n // per)
    words = np.full(2 * nlines + 2, 0xABABABABABABABAB, np.uint64)   # two canary words past the end
    lib.hccc_test_ll_send(int(half), src.ctypes.data if n else None, words.ctypes.data, 77, n, 3)
    packed = np.zeros(nlines * abi.LL_DATA, np.uint8)
    packed[:src.nbytes] = src.view(np.uint8)
    data = packed.view(np.uint32)
    assert ((words[:2 * nlines] >> np.uint64(32)) == 77).all()
    assert np.array_equal((words[:2 * nlines] & np.uint64(0xFFFFFFFF)).astype(np.uint32), data)
    assert (words[2 * nlines:] == 0xABABABABABABABAB).all()


# ---------------------------------------------------------------------------- whole programs
PROGRAMS = {
    "ring allreduce fused": lambda: build_program(gen.ring_allreduce(4), chunk_bytes=128, fuse=True),
    "ring allgather 2 channels": lambda: with_channels(build_program(gen.ring_allgather(3), chunk_bytes=256), 2),
    "direct reducescatter": lambda: build_program(gen.direct_reducescatter(3), chunk_bytes=64),
    "ring broadcast": lambda: build_program(gen.ring_broadcast(3), chunk_bytes=128),
}
CASES = [("ring allreduce fused", "float16", "sum", 1003, False, "specialized"),
         ("ring allreduce fused", "bfloat16", "max", 517, True, "table"),
         ("ring allgather 2 channels", "float32", "min", 3 * 101, False, "specialized"),
         ("direct reducescatter", "int32", "sum", 3 * 77 + 2, True, "specialized"),
         ("ring broadcast", "float16", "sum", 301, False, "table")]


@pytest.mark.parametrize("name,dtype,op,count,inplace,codegen", CASES)
def test_programs_under_ll_match_the_reference(name, dtype, op, count, inplace, codegen):
    ir = PROGRAMS[name]()
    case = KernelCase(count=count, dtype=dtype, op=op, inplace=inplace, nthreads=3)
    res = run_case(ir, case, codegen=codegen, proto="ll")
    assert res.proto == "ll"
    assert res.ok, describe_failure(case, res)


def test_slots_hold_ll_lines_after_an_ll_run():
    """Ring AllGather 2, one message per connection, the FIFO path: the receiver's slot 0, region 0
    holds the peer's chunk as lines (two words of 4 data bytes and the flag 0 + LL_FLAG_BASE each);
    under Simple the same bytes are the region header and the raw data."""
    ir = build_program(gen.ring_allgather(2), chunk_bytes=256)
    count = 2 * 20                                   # 80 bytes per chunk: under the LL share
    inputs = reference.make_inputs("allgather", 2, count, "float32", nchunks=2, seed=0)
    with LocalJob(ir, nthreads=2, direct="off") as job:
        for proto in ("ll", "simple"):
            res = job.run(count=count, proto=proto)
            assert res.ok and res.proto == proto
            for r in range(2):
                mem = job.comms[r].memory                # the rank's own FIFOs, read back
                slots = np.zeros(mem.plan.slots_bytes, np.uint8)
                mem.platform.memcpy_dtoh(slots, mem.slots)
                sent = inputs[1 - r].astype(np.float32)
                if proto == "ll":
                    lines = slots[:80 // abi.LL_DATA * abi.LL_LINE].view(np.uint64)   # its words
                    assert ((lines >> np.uint64(32)) == abi.LL_FLAG_BASE).all()
                    data = (lines & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
                else:
                    mis = int(slots[:4].view(np.uint32)[0]) % 16
                    data = slots[16 + mis:16 + mis + 80].view(np.float32)
                assert np.array_equal(data, sent), (proto, r)


def test_auto_picks_ll_up_to_the_crossover_and_imports_fall_back():
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=1024)
    assert launch_proto(ir, "auto", abi.LL_AUTO_MAX_BYTES, 1024) == ("ll", None)
    assert launch_proto(ir, "auto", abi.LL_AUTO_MAX_BYTES + 4, 1024) == ("simple", None)
    assert launch_proto(ir, "simple", 16, 1024) == ("simple", None)
    assert launch_proto(ir, "ll", 1 << 30, 1024) == ("ll", None)
    with pytest.raises(ValueError, match="protocol"):
        launch_proto(ir, "fast", 16, 1024)
    proto, why = launch_proto(dataclasses.replace(ir, origin=dataclasses.replace(ir.origin, execution="algorithm")), "ll", 16, 1024)
    assert proto == "simple" and "one micro-batch per chunk" in why
    assert abi.ll_share_bytes(15) == 0 and abi.ll_share_bytes(16) == 0 and abi.ll_share_bytes(31) == 0
    assert abi.ll_share_bytes(32) == 16 and abi.ll_share_bytes(96) == 48 and abi.ll_share_bytes(80) == 32


@pytest.mark.parametrize("proto", ["ll", "auto"])
def test_a_slot_whose_ll_half_holds_no_slice_runs_simple(proto):
    """16-byte chunks: LL's half of a slot share (8 bytes) holds no 16-byte slice, so an LL or
    auto launch runs Simple and says why (it raised in the slice model before), with the right
    result."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=16)
    share = slot_share_bytes(16, ir.max_step_chunks)
    got, why = launch_proto(ir, proto, 256, 16)
    assert got == "simple" and f"share of {share} bytes" in why
    with Runner(ir, "cpu", "float32", "sum") as runner:
        res = runner.run(256, proto=proto)
    assert res.proto == "simple" and res.wrong == 0 and res.stuck is None, res


# ---------------------------------------------------------------------------- random programs (slow)
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall")


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_random_programs_under_ll_match_the_reference(collective, data):
    """Random valid programs (fused or not, 1-3 channels), random cases (uneven counts, every
    dtype / op, in and out of place, slices), one grid or a kernel per rank, specialised or table
    kernels, direct mode on (an LL launch sends those messages through the FIFO as lines too) or
    off, under LL."""
    alg = data.draw(valid_programs(collective, max_ranks=5), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([64, 128, 256]), label="chunk_bytes"),
                       fuse=data.draw(st.booleans(), label="fuse"))
    k = data.draw(st.sampled_from([1, 2, 3]), label="channels")
    if k > 1:
        ir = with_channels(ir, k)
    case = data.draw(kernel_cases(ir, max_microbatches=12), label="case")
    res = run_case(ir, case, one_grid=data.draw(st.booleans(), label="one_grid"),
                   codegen=data.draw(st.sampled_from(["specialized", "table"]), label="codegen"),
                   proto="ll")
    assert res.proto == ("simple" if ir.algorithm_level else "ll")
    assert res.ok, describe_failure(case, res)
