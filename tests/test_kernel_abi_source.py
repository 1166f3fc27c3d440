"""One source for the kernel ABI (hccc.compiler.backend.abi): the emitted headers, the rank sources,
the host structures (hccc.runtime.kernel_abi), the memory layout (hccc.runtime.rank_memory.RankPlan)
and the C++ host API (hccc_host.h) agree, as the C++ compiler sees them; a planted mismatch in
any of them is caught; the manifest records the ABI version and loading an OUTDIR checks it.

The oracle is g++: struct offsets from ``offsetof`` in a probe compiled against the emitted
headers, the primitive descriptors the macros really build from ``g++ -E``, and the control-block
offsets the C++ host API computes, from a probe program run on this machine."""
from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hccc.compiler.backend import abi
from hccc.compiler.backend.codegen import analyse, generate
from hccc.compiler.backend.direct_fields import direct_fields
from hccc.compiler.backend.prim_fields import pd_columns
from hccc.util.diagnostics import CompileError
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.compiler.frontend.load import load_rccl
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.channels import with_channels
from hccc.runtime import kernel_abi
from hccc.runtime.rank_memory import RankPlan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(CXX is None, reason="g++ not installed")
_STRUCTS = {"hccc_args": kernel_abi.Args, "hccc_conn": kernel_abi.Conn, "hccc_error": kernel_abi.ErrorRecord}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    """A program with progress waits, direct primitives and channels, emitted for CUDA."""
    ir = with_channels(build_program(load_rccl(EXAMPLES / "ring_allreduce_8.rccl"), chunk_bytes=1 << 16,
                                     name="abi"), 2)
    d = tmp_path_factory.mktemp("abi")
    generate(ir, d, platforms=["cuda"] * ir.nranks)
    return d, ir


def _pd_ctypes():
    return type("Pd", (ctypes.Structure,), {"_fields_": kernel_abi.ctypes_fields(abi.pd_struct_fields())})


def _layout_probe(prims_h: str) -> str:
    """A translation unit that compiles only when the header's structs have the host's layout."""
    lines = ["#include <stddef.h>", prims_h,
             f"static_assert(HCCC_ABI_VERSION == {abi.VERSION}, \"ABI version\");",
             f"static_assert(HCCC_NSLOTS == {abi.NSLOTS}, \"NSLOTS\");",
             f"static_assert(HCCC_REGION_HEADER == {abi.REGION_HEADER}, \"region header\");",
             f"static_assert(HCCC_REGION_BYTES(4096, 1) == 4096 + {abi.SLOT_OVERHEAD}, \"slot overhead\");"]
    structs = dict(_STRUCTS, hccc_pd=_pd_ctypes())
    for name, cls in structs.items():
        lines.append(f"static_assert(sizeof({name}) == {ctypes.sizeof(cls)}, \"sizeof {name}\");")
        for fname, _ in cls._fields_:
            off = getattr(cls, fname).offset
            lines.append(f"static_assert(offsetof({name}, {fname}) == {off}, \"{name}.{fname}\");")
    for o in Op:
        lines.append(f"static_assert(HCCC_{o.name} == {int(o)}, \"op {o.name}\");")
    for b in Buf:
        lines.append(f"static_assert(HCCC_BUF_{b.name} == {int(b)}, \"buf {b.name}\");")
    for n, v in abi.WAITS:
        lines.append(f"static_assert(HCCC_WAIT_{n} == {v}, \"wait {n}\");")
    return "\n".join(lines) + "\n"


def _gxx(tmp, src: str, *args, run=False) -> subprocess.CompletedProcess:
    f = tmp / "probe.cpp"
    f.write_text(src)
    cmd = [CXX, "-std=c++17", "-DHCCC_PLATFORM_CPU=1", f"-I{tmp}", *args, str(f)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if run and res.returncode == 0:
        return subprocess.run([str(tmp / "probe")], capture_output=True, text=True)
    return res


def _headers(d, tmp):
    for f in ("hccc_platform.h", "hccc_cpu_emu.h", "hccc_prims.h", "hccc_host.h"):
        (tmp / f).write_text((d / f).read_text())


@needs_gxx
def test_header_structs_match_the_host(outdir, tmp_path):
    d, _ = outdir
    _headers(d, tmp_path)
    res = _gxx(tmp_path, _layout_probe('#include "hccc_prims.h"'), "-fsyntax-only")
    assert res.returncode == 0, res.stderr[-3000:]


@needs_gxx
@pytest.mark.parametrize("plant", ["swap", "type", "version"])
def test_planted_header_mismatch_is_caught(outdir, tmp_path, plant):
    """A header edited by hand (two members swapped, a member's type changed, another version)
    no longer compiles against the host's layout."""
    d, _ = outdir
    _headers(d, tmp_path)
    h = (tmp_path / "hccc_prims.h").read_text()
    if plant == "swap":
        h2 = re.sub(r"(  uint64_t timeout;[^\n]*\n)(  uint64_t slice_bytes;[^\n]*\n)", r"\2\1", h)
        h2 = re.sub(r"(  int sconn;[^\n]*\n)(  int rconn;[^\n]*\n)", r"\2\1", h2)
    elif plant == "type":
        h2 = h.replace("  int32_t chunk;", "  int64_t chunk;")
    else:
        h2 = h.replace(f"#define HCCC_ABI_VERSION {abi.VERSION}", f"#define HCCC_ABI_VERSION {abi.VERSION + 1}")
    assert h2 != h
    (tmp_path / "hccc_prims.h").write_text(h2)
    res = _gxx(tmp_path, _layout_probe('#include "hccc_prims.h"'), "-fsyntax-only")
    assert res.returncode != 0


def _descriptors(d, ir, tmp, prims_h=None):
    """Per rank: the hccc_pd initialisers of every row of the rank's program table after the C
    preprocessor (enumerators resolved), sorted."""
    _headers(d, tmp)
    if prims_h is not None:
        (tmp / "hccc_prims.h").write_text(prims_h)
    names = {f"HCCC_{o.name}": int(o) for o in Op} | {f"HCCC_BUF_{b.name}": int(b) for b in Buf}
    names |= {"nullptr": 0}
    out = {}
    for r in range(ir.nranks):
        src = (d / f"abi_r{r}.cu").read_text()
        # only the macros: the calls, expanded by the header's own definitions
        body = "\n".join(ln for ln in src.splitlines() if re.match(r"\s*HCCC_PW?X?\(", ln))
        macros = "\n".join(m.group(0) for m in re.finditer(r"#define HCCC_P\w*\([^)]*\)(?:[^\n]*\\\n)*[^\n]*\n",
                                                              (tmp / "hccc_prims.h").read_text()))
        res = subprocess.run([CXX, "-E", "-P", "-x", "c++", "-"], input=macros + body, capture_output=True,
                             text=True, check=True)
        rows = []
        for m in re.finditer(r"\{([^{}]*)\}", res.stdout):
            vals = [v.strip() for v in m.group(1).split(",")]
            rows.append(tuple(int(names.get(v, v)) for v in vals))
        out[r] = sorted(rows)
    return out


def _expected(ir):
    col = analyse(ir)
    v = pd_columns(ir, col, direct_fields(ir))
    fields = [f.name for f in abi.pd_struct_fields()]
    rank = ir.prims["rank"].astype(np.int64)
    return {r: sorted(tuple(int(v[f][i]) for f in fields) for i in np.flatnonzero(rank == r))
            for r in range(ir.nranks)}


@needs_gxx
def test_emitted_calls_fill_the_descriptor_the_compiler_means(outdir, tmp_path):
    d, ir = outdir
    text = "".join((d / f"abi_r{r}.cu").read_text() for r in range(ir.nranks))
    assert "HCCC_PW(" in text or "HCCC_PWX(" in text     # the program exercises the waits ...
    assert "HCCC_PX(" in text or "HCCC_PWX(" in text     # ... and direct mode
    got = _descriptors(d, ir, tmp_path)
    assert sum(len(v) for v in got.values()) == ir.nprims
    assert got == _expected(ir)


def _int_array(src: str, name: str) -> list[int]:
    m = re.search(rf"\b{name}\[\d+\] = \{{(.*?)\}};", src, flags=re.S)
    assert m, name
    return [int(x) for x in re.findall(r"-?\d+", m.group(1))]


def test_emitted_programs_await_and_split_what_the_compiler_means(outdir):
    """Each rank's deps array holds every primitive's awaited progress counters in primitive
    order, and its tbs array each thread block's first row and first awaited counter."""
    d, ir = outdir
    col = analyse(ir)
    ndeps = np.zeros(ir.nprims, np.int64)
    ndeps[col.dep_owner] = col.dep_n
    at = np.r_[0, np.cumsum(ndeps)]
    rank = ir.prims["rank"].astype(np.int64)
    tb = ir.prims["tb"].astype(np.int64)
    for r in range(ir.nranks):
        src = (d / f"abi_r{r}.cu").read_text()
        lo, hi = np.searchsorted(rank, [r, r + 1])
        want = col.dep_slots[at[lo]:at[hi]].tolist() or [0]
        assert _int_array(src, "deps") == want
        ntb = int(ir.ntbs[r])
        first = np.searchsorted(tb[lo:hi], np.arange(ntb + 1)) + lo
        want_tbs = [v for f in first for v in (int(f - lo), int(at[f] - at[lo]))]
        assert _int_array(src, "tbs") == want_tbs


@needs_gxx
def test_planted_macro_mismatch_is_caught(outdir, tmp_path):
    """Macros whose initialiser swaps two members fill descriptors the compiler did not mean."""
    d, ir = outdir
    h = (d / "hccc_prims.h").read_text()
    h2 = h.replace("{seq, HCCC_##op, sconn, rconn,", "{seq, HCCC_##op, rconn, sconn,")
    assert h2 != h
    assert _descriptors(d, ir, tmp_path, prims_h=h2) != _expected(ir)


_HOST_PROBE = """
#include "hccc_host.h"
int main() {
  for (int r = 0; r < HCCC_HOST_NRANKS; ++r) {
    printf("%d %d %d %d %llu %llu", r, hccc_host_nrecv[r], hccc_host_nsend[r], hccc_host_progress[r],
           (unsigned long long)hccc_host_ctrl_bytes(r), (unsigned long long)hccc_host_progress_offset(r));
    for (int j = 0; j < hccc_host_nrecv[r]; ++j)
      printf(" t%llu u%llu", (unsigned long long)hccc_host_ctrl_off_(r, HCCC_HOST_CTRL_TAIL, j),
             (unsigned long long)hccc_host_ctrl_off_(r, HCCC_HOST_CTRL_UNSENT_HEAD, j));
    for (int k = 0; k < hccc_host_nsend[r]; ++k)
      printf(" h%llu", (unsigned long long)hccc_host_ctrl_off_(r, HCCC_HOST_CTRL_SEND_HEAD, k));
    printf(" o%d\\n", HCCC_HOST_ORPHAN_HEADER);
  }
  return 0;
}
"""


def _plan_lines(d) -> list[str]:
    man = json.loads((d / "manifest.json").read_text())
    out = []
    for r in range(man["nranks"]):
        p = RankPlan.from_manifest(man, r)
        nr, ns = len(p.recv_conns), len(p.send_conns)
        s = f"{r} {nr} {ns} {p.progress_slots} {p.ctrl_bytes} {p.progress_offset}"
        s += "".join(f" t{p.tail_offset(j)} u{p.unsent_head_offset(j)}" for j in range(nr))
        s += "".join(f" h{p.send_head_offset(k)}" for k in range(ns))
        out.append(s + f" o{p.orphan_bytes - p.fifo_bytes}")
    return out


@needs_gxx
def test_host_api_control_block_is_the_runtime_s(outdir, tmp_path):
    d, _ = outdir
    _headers(d, tmp_path)
    res = _gxx(tmp_path, _HOST_PROBE, "-pthread", "-o", str(tmp_path / "probe"), run=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == _plan_lines(d)
    # a planted mismatch: the host API's send heads one word further on
    h = (tmp_path / "hccc_host.h").read_text()
    h2 = h.replace("case HCCC_HOST_CTRL_SEND_HEAD: return 8ull * (uint64_t)((nrecv) + i);",
                   "case HCCC_HOST_CTRL_SEND_HEAD: return 8ull * (uint64_t)((nrecv) + i + 1);")
    assert h2 != h
    (tmp_path / "hccc_host.h").write_text(h2)
    res = _gxx(tmp_path, _HOST_PROBE, "-pthread", "-o", str(tmp_path / "probe"), run=True)
    assert res.returncode == 0 and res.stdout.splitlines() != _plan_lines(d)


def test_control_block_regions_tile_the_block():
    """Independent arithmetic: the regions follow one another without gaps or overlap."""
    for nrecv, nsend, nprog in ((0, 0, 0), (3, 2, 5), (1, 4, 0), (7, 7, 1)):
        words = []
        for name, count, _ in abi.CTRL_REGIONS:
            n = {"nrecv": nrecv, "nsend": nsend, "nprogress": max(nprog, 1)}[count]
            words += [abi.ctrl_offset(name, i, nrecv, nsend) for i in range(n)]
        assert words == [8 * i for i in range(len(words))]
        assert abi.ctrl_bytes(nrecv, nsend, nprog) == 8 * len(words)


def test_manifest_records_the_abi_version(outdir):
    d, _ = outdir
    assert json.loads((d / "manifest.json").read_text())["abi_version"] == abi.VERSION == kernel_abi.ABI_VERSION


@pytest.mark.parametrize("value", [abi.VERSION - 1, None, "3", True])
def test_outdir_of_another_abi_is_refused(outdir, tmp_path, value):
    from hccc.compiler.pipeline import load_manifest
    d, _ = outdir
    man = json.loads((d / "manifest.json").read_text())
    load_manifest(d / "manifest.json")   # this hccc's own output loads
    if value is None:
        del man["abi_version"]
    else:
        man["abi_version"] = value
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(CompileError, match="kernel ABI version"):
        load_manifest(tmp_path / "manifest.json")


def test_host_api_timeouts_count_the_kernels_clock(outdir):
    """hccc_host.h converts a timeout in seconds into the ticks the kernels' hccc_clock() counts
    (global timers), the same as the Python runtime, never an SM cycle rate."""
    from hccc.runtime.cuda import CudaPlatform
    from hccc.runtime.hip import HipPlatform
    d, _ = outdir
    host = (d / "hccc_host.h").read_text()
    assert "ClockRate" not in host and "ClockInstructionRate" not in host
    for plat, guard in (("cuda", "#else"), ("hip", "#elif defined(__HIPCC__)"), ("cpu", "#if defined(HCCC_PLATFORM_CPU)")):
        assert re.search(re.escape(guard) + r"\n  c->ticks_per_us = " + re.escape(repr(abi.TIMER_TICKS_PER_US[plat])), host), plat
    assert CudaPlatform.timer_ticks_per_us == abi.TIMER_TICKS_PER_US["cuda"] == 1000.0      # %globaltimer: ns
    assert HipPlatform.timer_ticks_per_us == abi.TIMER_TICKS_PER_US["hip"] == 100.0         # s_memrealtime
