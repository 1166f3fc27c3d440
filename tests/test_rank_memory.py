"""The one executor of rank memory (hccc.runtime.rank_memory): the launch arguments it packs have
the layout the emitted C++ declares, and the per-call recipe it computes once is the one the
launchers follow.

The oracle for the layouts is g++: ``offsetof`` / ``sizeof`` of ``hccc_table_args``,
``hccc_grid_args`` and ``hccc_table_grid_args`` in a probe compiled against the emitted headers,
and a probe program that reads the packed bytes through those structs and prints their members."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from hccc.compiler.backend import abi
from hccc.compiler.backend.table_codegen import generate_table
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime import kernel_abi
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.rank_memory import LaunchCall, RankMemory, RankPlan, grid_argument, launch_slice_bytes

CXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(CXX is None, reason="g++ not installed")
_LAUNCH = {"hccc_table_args": kernel_abi.TableArgs, "hccc_grid_args": kernel_abi.GridArgs,
           "hccc_table_grid_args": kernel_abi.TableGridArgs}


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    """The table mode's headers (hccc_prims.h with hccc_grid_args, hccc_table.h with the table
    structs), emitted for CUDA."""
    d = tmp_path_factory.mktemp("launch_abi")
    generate_table(build_program(gen.ring_allgather(2), chunk_bytes=64), d, platforms=["cuda"] * 2)
    return d


def _gxx(d: Path, src: str, *args) -> subprocess.CompletedProcess:
    f = d / "probe.cpp"
    f.write_text(src)
    return subprocess.run([CXX, "-std=c++17", "-DHCCC_PLATFORM_CPU=1", f"-I{d}", *args, str(f)],
                          capture_output=True, text=True)


def _layout_probe() -> str:
    lines = ["#include <stddef.h>", '#include "hccc_table.h"']
    for name, cls in _LAUNCH.items():
        lines.append(f"static_assert(sizeof({name}) == {ctypes.sizeof(cls)}, \"sizeof {name}\");")
        for fname, _ in cls._fields_:
            lines.append(f"static_assert(offsetof({name}, {fname}) == {getattr(cls, fname).offset}, "
                         f"\"{name}.{fname}\");")
    lines.append(f"static_assert(sizeof(hccc_table_grid_args::first[0]) == "
                 f"{ctypes.sizeof(kernel_abi._CTYPES[abi.GRID_FIRST])}, \"first\");")
    return "\n".join(lines) + "\n"


def test_launch_records_are_the_abi_s():
    """The ctypes classes are built from the ABI's records, member for member."""
    for name, cls in _LAUNCH.items():
        assert [f for f, _ in cls._fields_] == [f.name for f in abi.LAUNCH_STRUCTS[name]]
    assert kernel_abi.TableArgs.a.size == ctypes.sizeof(kernel_abi.Args)


@needs_gxx
def test_launch_structs_match_the_emitted_headers(headers, tmp_path):
    res = _gxx(headers, _layout_probe(), "-fsyntax-only")
    assert res.returncode == 0, res.stderr[-3000:]


@needs_gxx
@pytest.mark.parametrize("plant", ["table_grid", "grid"])
def test_planted_launch_struct_mismatch_is_caught(headers, tmp_path, plant):
    """The grid arguments are rendered from compiler/backend/abi.py's records; a header edited by
    hand (two members of a grid argument swapped) no longer compiles against the host's records."""
    for f in headers.iterdir():
        if f.suffix == ".h":
            (tmp_path / f.name).write_text(f.read_text())
    name = "hccc_table.h" if plant == "table_grid" else "hccc_prims.h"
    h = (tmp_path / name).read_text()
    if plant == "table_grid":
        h2 = re.sub(r"(  const int32_t\* first;[^\n]*\n)(  int64_t nranks;[^\n]*\n)", r"\2\1", h)
    else:
        h2 = re.sub(r"(  const hccc_args\* ranks;[^\n]*\n)(  int64_t nranks;[^\n]*\n)", r"\2\1", h)
    assert h2 != h
    (tmp_path / name).write_text(h2)
    res = _gxx(tmp_path, _layout_probe(), "-fsyntax-only")
    assert res.returncode != 0


_READ_PROBE = r"""
#include "hccc_table.h"
#include <stdio.h>
#include <string.h>
int main(int argc, char** argv) {
  unsigned char buf[256];
  FILE* f = fopen(argv[1], "rb");
  const size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  hccc_grid_args g; hccc_table_grid_args t; hccc_table_args a;
  if (n == sizeof g) { memcpy(&g, buf, n); printf("grid %llu %lld\n", (unsigned long long)g.ranks, (long long)g.nranks); }
  if (n == sizeof t) { memcpy(&t, buf, n); printf("table_grid %llu %llu %lld\n", (unsigned long long)t.ranks,
                                                  (unsigned long long)t.first, (long long)t.nranks); }
  if (n == sizeof a) { memcpy(&a, buf, n); printf("table_args %llu %llu %llu %u %llu\n", (unsigned long long)a.a.input,
                                                  (unsigned long long)a.a.count, (unsigned long long)a.a.proto,
                                                  a.a.ll_epoch, (unsigned long long)a.table); }
  return 0;
}
"""


class _Memory:
    """A platform that hands out distinct fake addresses and records what it is asked."""
    name, ticks_per_us = "fake", 1000.0

    def __init__(self):
        self.next, self.sizes, self.copies = 1 << 20, [], {}

    def malloc(self, n):
        self.sizes.append(int(n))
        self.next += 1 << 12
        return self.next

    def memcpy_htod(self, ptr, blob):
        self.copies[ptr] = bytes(blob)


@needs_gxx
def test_packed_arguments_read_back_through_the_emitted_structs(headers, tmp_path):
    """What the runtime packs (the grid arguments, a table-mode kernel argument) is what the C++
    structs read: a probe program compiled against the emitted headers prints the members."""
    exe = tmp_path / "readback"
    res = _gxx(headers, _READ_PROBE, "-pthread", "-o", str(exe))
    assert res.returncode == 0, res.stderr[-3000:]
    ir = build_program(gen.ring_allgather(2), chunk_bytes=64)
    man = json.loads((headers / "manifest.json").read_text())
    plans = [RankPlan.from_manifest(man, r) for r in range(2)]
    pf = _Memory()
    mem = RankMemory(plans[0], pf, pf.malloc)
    mem.connect(plans, lambda peer: (0x7000000, 0x8000000), [0, 0])
    table = mem.load_table(b"\x01" * 24)
    call = LaunchCall.plan(ir, 1000, 4, ir.chunk_bytes, proto="ll")
    args = mem.args(call, input=0x1234, output=0x5678, scratch=0, abort_flag=1, error=2, timeout_s=0,
                    epoch=77)
    cases = [(grid_argument(0xABCDEF0, 3), "grid 180150000 3"),
             (grid_argument(0xABCDEF0, 5, first=0x2000), "table_grid 180150000 8192 5"),
             (mem.argument(args), f"table_args 4660 1000 {call.proto_code} 77 {table}")]
    assert call.proto == "ll" and call.proto_code == dict(abi.PROTOS)["LL"]
    for blob, want in cases:
        (tmp_path / "arg.bin").write_bytes(blob)
        out = subprocess.run([str(exe), str(tmp_path / "arg.bin")], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == want


def test_table_upload_never_allocates_zero_bytes():
    """The rank's table is allocated at least 8 bytes (a 0-byte device allocation is a null
    pointer on CUDA / HIP) and copied whole."""
    plan = RankPlan(rank=0, recv_conns=(), send_conns=(), progress_slots=1, nslots=abi.NSLOTS,
                    slot_bytes=64)
    pf = _Memory()
    mem = RankMemory(plan, pf, pf.malloc)
    before = len(pf.sizes)
    assert mem.load_table(b"") and pf.sizes[before:] == [8]
    ptr = mem.load_table(b"x" * 40)
    assert pf.sizes[-1] == 40 and pf.copies[ptr] == b"x" * 40 and mem.table == ptr


def test_launch_call_is_the_one_recipe():
    """The call's values: the slot's whole capacity for an algorithm-level program, a fixed slice
    checked, LL refused where the launcher says so, and a new LL epoch per launch."""
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=4096)
    auto = LaunchCall.plan(ir, 1 << 16, 4, ir.chunk_bytes, proto="simple")
    assert auto.slice_bytes == launch_slice_bytes(ir, 4 << 16, 4, ir.chunk_bytes, "simple")
    assert LaunchCall.plan(ir, 1 << 16, 4, ir.chunk_bytes, slice_bytes=256).slice_bytes == 256
    for bad in (0, 24, ir.chunk_bytes + 16):
        with pytest.raises(ValueError, match="multiple of 16"):
            LaunchCall.plan(ir, 1 << 16, 4, ir.chunk_bytes, slice_bytes=bad)
    refused = LaunchCall.plan(ir, 64, 4, ir.chunk_bytes, proto="ll", ll_refused="no LL here")
    assert (refused.proto, refused.note) == ("simple", "no LL here")
    ll = LaunchCall.plan(ir, 64, 4, ir.chunk_bytes, proto="auto")
    assert ll.proto == "ll" and ll.note is None
    epochs = LLEpochs()
    assert [ll.launch(epochs) for _ in range(3)] == [(0, True), (1, False), (2, False)]
    assert refused.launch(epochs) == (0, False) and ll.launch(epochs) == (0, True)
    # a program proven under the algorithm-level order only (an MSCCL import): Simple, one
    # micro-batch per chunk, and a slice that cuts its chunks refused
    ir.origin = dataclasses.replace(ir.origin, execution="algorithm")
    call = LaunchCall.plan(ir, 1 << 16, 4, ir.chunk_bytes, proto="ll")
    assert call.proto == "simple" and "one micro-batch per chunk" in call.note
    assert call.slice_bytes == ir.chunk_bytes
    with pytest.raises(ValueError, match="micro-batches"):
        LaunchCall.plan(ir, 1 << 16, 4, ir.chunk_bytes, slice_bytes=256).check(ir)


def test_simulator_slots_are_the_abi_s():
    from hccc.runtime import simulator
    assert simulator.NSLOTS is abi.NSLOTS or simulator.NSLOTS == abi.NSLOTS
    assert "NSLOTS = " not in Path(simulator.__file__).read_text()


# ---------------------------------------------------------------------------- packing, by hand
_ADDR = st.integers(0, (1 << 64) - 1)
_RING2 = build_program(gen.ring_allreduce(2), chunk_bytes=256)


@given(_ADDR, _ADDR, st.integers(0, (1 << 63) - 1))
def test_grid_arguments_against_an_independent_layout(ranks, first, nranks):
    """``hccc_grid_args`` is ``{const hccc_args* ranks; int64_t nranks}`` and
    ``hccc_table_grid_args`` ``{const hccc_table_args* ranks; const int32_t* first; int64_t
    nranks}`` (hccc_prims.h, hccc_table.h): little-endian, 8-byte members, no padding. Written here
    with struct, independently of the ABI records the runtime packs them from."""
    assert grid_argument(ranks, nranks) == struct.pack("<Qq", ranks, nranks)
    assert grid_argument(ranks, nranks, first=first) == struct.pack("<QQq", ranks, first, nranks)


@given(_ADDR)
def test_table_argument_is_the_rank_s_arguments_then_its_table(table):
    """``hccc_table_args`` is ``{hccc_args a; const uint8_t* table}``: the rank's arguments, then
    the address of its table (8 bytes, little-endian)."""
    plan = RankPlan(rank=0, recv_conns=(), send_conns=(), progress_slots=1, nslots=abi.NSLOTS,
                    slot_bytes=64)
    pf = _Memory()
    mem = RankMemory(plan, pf, pf.malloc)
    mem.connect([plan], lambda peer: (0, 0), [0])
    args = mem.args(LaunchCall.plan(_RING2, 64, 4, 256), input=1, output=2, scratch=3, abort_flag=4,
                    error=5, timeout_s=0)
    assert mem.argument(args) == bytes(args)
    mem.table = table
    assert mem.argument(args) == bytes(args) + struct.pack("<Q", table)


# ---------------------------------------------------------------------------- both launchers
_VALUE_FIELDS = ("count", "timeout", "slice_bytes", "proto", "ll_epoch", "vcounts", "vdispls", "vmap", "vslot")


@needs_gxx
@pytest.mark.parametrize("codegen", ["specialized", "table"])
def test_runner_and_communicator_pack_the_same_arguments(tmp_path, monkeypatch, codegen):
    """The same program and calls through the single-process runner's ranks (a
    :class:`~hccc.runtime.local_job.LocalJob`, its FIFOs grown with the calls) and a one-rank
    Communicator of its own process: every launch's argument has the same values (count,
    spin-wait limit, slice, protocol, LL epoch; in table mode the table's address after it), and
    its addresses are each launcher's own rank memory (connection tables, progress counters,
    flags, table). The slot capacity differs by design: the job's follows the call, the
    Communicator's its per-connection budget."""
    from communicator_calls import require_torch
    require_torch()
    from hccc.runtime.communicator import Communicator
    from hccc.runtime.cpu import CpuPlatform
    from hccc.runtime.local_job import LocalJob
    seen = []
    real = CpuPlatform.launch

    def record(self, fn, grid, block, args, stream):
        seen.append(bytes(args))
        return real(self, fn, grid, block, args, stream)
    monkeypatch.setattr(CpuPlatform, "launch", record)
    ir = build_program(gen.ring_allreduce(1), chunk_bytes=256)
    calls = [(100, "ll"), (100, "ll"), (64, "simple"), (100, "ll")]
    runner_mems = []          # the job's FIFOs follow the calls (reallocated when one needs more)
    with LocalJob(ir, kernel_timeout_s=7, codegen=codegen) as job:
        for count, proto in calls:
            assert job.run(count=count, proto=proto, one_grid=False).ok
            runner_mems.append((job.comms[0].memory, job.comms[0].flags))
    n_runner = len(seen)
    with Communicator(ir, rank=0, world_size=1, init_method=f"file://{tmp_path}/store", codegen=codegen,
                      timeout_s=20, kernel_timeout_s=7) as comm:
        for count, proto in calls:
            comm.proto = proto
            x = np.arange(count, dtype=np.float32)
            assert np.array_equal(comm.all_reduce(x), np.arange(count, dtype=np.float32))
        comm_mem = (comm.memory, comm.flags)
    assert n_runner == len(calls) and len(seen) == 2 * len(calls)
    size = ctypes.sizeof(kernel_abi.Args)
    for i in range(len(calls)):
        got = []
        for blob, (mem, flags) in ((seen[i], runner_mems[i]), (seen[n_runner + i], comm_mem)):
            a = kernel_abi.Args.from_buffer_copy(blob[:size])
            assert (a.send_conns, a.recv_conns, a.progress) == (mem.send_tab, mem.recv_tab, mem.progress)
            assert (a.abort_flag, a.error) == (flags.abort, flags.error)
            if codegen == "table":
                assert len(blob) == size + 8 and struct.unpack("<Q", blob[size:])[0] == mem.table
            else:
                assert len(blob) == size
            got.append({f: getattr(a, f) for f in _VALUE_FIELDS})
        assert got[0] == got[1], (i, calls[i])
