"""Table-driven kernels (``--codegen table``): the binary tables round-trip the program, are
validated on load, the generic kernels (compiled for the CPU emulation) compute what the reference
executor computes for random programs, and the CLI (compile, list-outputs, depfile, run, fuzz)
covers the mode."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.cli import main
from hccc.compiler.backend import table_format as tf
from hccc.compiler.backend import table_units
from hccc.compiler.backend.table_codegen import generate_table
from hccc.compiler.backend.table_program import load_tables, program_from_table, table_path
from hccc.compiler.ir.program_ir import MAX_CHANNELS, PRIM_COLUMNS
from hccc.compiler.passes.channels import with_channels
from hccc.compiler.pipeline.emitters import exports
from hccc.compiler.passes.build import build_program
from hccc.compiler.frontend import generators as gen
from hccc.runtime.reference import alltoall_count, execute, expected_for, inputs_for
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs
from hccc.util import dtypes as dtypes_table

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RING = ROOT / "examples" / "downstream" / "algo.rccl"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def _written_table(ir, tmp_path, platforms=None):
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    generate_table(ir, out, platforms=platforms or ["cuda"] * ir.nranks)
    man = json.loads((out / "manifest.json").read_text())
    return out, man, table_path(out, man).read_bytes()


def _canon(ir):
    """Each rank's primitives in (tb, seq) order with the producer of every dependency named by
    (rank, tb, seq): a form independent of how the primitives are numbered."""
    p = ir.prims
    key = {i: (int(p["rank"][i]), int(p["tb"][i]), int(p["seq"][i])) for i in range(len(p["rank"]))}
    deps: dict = {}
    for w, on in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        deps.setdefault(key[w], set()).add(key[on])
    rows = {}
    for i, k in key.items():
        rows[k] = (tuple(int(p[c][i]) for c in PRIM_COLUMNS if c not in ("rank", "tb", "seq")),
                   frozenset(deps.get(k, ())))
    return rows


@settings(max_examples=12)
@given(data=st.data())
def test_tables_round_trip_the_program(tmp_path_factory, data):
    """The program read back from the tables is the compiled program (every primitive column,
    dependencies, header), and runs to the same result under the reference executor."""
    alg = data.draw(valid_programs(None, max_ranks=6), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([64, 256, 1 << 20])))
    if data.draw(st.booleans(), label="a slice policy of its own"):
        ir.micro_batches = data.draw(st.integers(1, 4096), label="nMicroBatches")
        ir.min_slice_bytes = 16 * data.draw(st.integers(1, 1 << 12), label="MinSliceBytes / 16")
    # any warp count a header may give (threads are capped at 1,024 when emitted) and any channel
    # count the compile takes: what compiled loads back
    ir.nwarps = data.draw(st.sampled_from([1, 16, 32, 33, 64, 1 << 20]), label="nWarps")
    ir = with_channels(ir, data.draw(st.sampled_from([1, 2, MAX_CHANNELS]), label="channels"))
    _, man, blob = _written_table(ir, tmp_path_factory.mktemp("t"))
    back = program_from_table(man, blob)
    assert (back.nwarps, back.nchannels) == (ir.nwarps, ir.nchannels)
    assert back.slice_policy == ir.slice_policy
    assert ("slicing" in man) == (not ir.slice_policy.is_default)
    assert (back.name, back.collective, back.nranks, back.nchunks) == (ir.name, ir.collective,
                                                                       ir.nranks, ir.nchunks)
    assert (back.in_chunks, back.out_chunks, back.scratch_chunks, back.chunk_bytes, back.root) == \
        (ir.in_chunks, ir.out_chunks, ir.scratch_chunks, ir.chunk_bytes, ir.root)
    assert back.ntbs.tolist() == ir.ntbs.tolist()
    assert _canon(back) == _canon(ir)
    # and it computes the collective (the oracle: the collective's definition on the inputs)
    inputs = inputs_for(back, 3 * back.nchunks + 1, "int32", seed=1)
    if back.collective == "alltoall":
        inputs = inputs_for(back, alltoall_count(3 * back.nchunks + 1, back.nranks), "int32", seed=1)
    got = execute(back, inputs, op="max")
    for r, want in enumerate(expected_for(ir, inputs, "max")):
        if want is not None:
            assert np.array_equal(got[r], want), f"rank {r}"


def test_tables_are_validated_on_load(tmp_path):
    ir = build_program(gen.ring_allreduce(4), chunk_bytes=256)
    _, man, blob = _written_table(ir, tmp_path)
    load_tables(blob, man)                                   # the genuine table loads
    head = np.frombuffer(blob[:tf.FILE_HEAD.itemsize], tf.FILE_HEAD)[0]
    assert int(head["version"]) == tf.VERSION and int(head["layout"]) == tf.LAYOUT
    bad_version = bytearray(blob)
    bad_version[4:8] = (tf.VERSION + 1).to_bytes(4, "little")
    bad_layout = bytearray(blob)
    bad_layout[12:16] = (tf.LAYOUT ^ 1).to_bytes(4, "little")
    bad_magic = bytearray(blob)
    bad_magic[0] ^= 0xFF
    cases = {"version": bytes(bad_version), "layout": bytes(bad_layout), "magic": bytes(bad_magic),
             "short": blob[:10], "truncated": blob[:len(blob) // 2]}
    for what, data in cases.items():
        with pytest.raises(tf.TableFormatError):
            load_tables(data, man)
    fewer = dict(man, ranks=man["ranks"][:-1])
    with pytest.raises(tf.TableFormatError, match="rank sections"):
        load_tables(blob, fewer)
    smaller = dict(man, buffers=dict(man["buffers"], output=1))
    with pytest.raises(tf.TableFormatError):
        load_tables(blob, smaller)


@needs_gxx
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "alltoall", "reduce"])
# three builds a collective by default (the channel and direct-mode files draw table kernels for
# random programs too); the thorough profile ten times that
@settings(max_examples=examples(3))
@given(data=st.data())
def test_table_kernels_match_oracle(collective, data):
    """The generic kernels (CPU emulation of the very source the GPUs compile) running random
    programs' tables give exactly the reference executor's result, which is the collective."""
    alg = data.draw(valid_programs(collective, max_ranks=5), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64, 256]), label="chunk"))
    dtype = data.draw(st.sampled_from(["float32", "float16", "bfloat16", "int32"]), label="dtype")
    op = data.draw(st.sampled_from(["sum", "max", "min"]), label="op")
    case = data.draw(kernel_cases(ir, dtypes=[dtype], ops=[op], max_microbatches=10), label="case")
    res = run_case(ir, case, codegen="table")
    assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)
    assert res.oracle == "reference"


# ---- command line ----------------------------------------------------------------------------

@pytest.mark.parametrize("codegen", ["specialized", "table"])
@pytest.mark.parametrize("target", ["cuda", "hip", "all"])
def test_list_outputs_is_what_the_compile_writes(tmp_path, capsys, codegen, target):
    out = tmp_path / "o"
    argv = [str(RING), "-o", str(out), "--codegen", codegen, "--target", target]
    assert main(argv + ["--list-outputs"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert not out.exists()                        # listing writes nothing
    assert main(argv) == 0
    capsys.readouterr()
    assert sorted(listed) == _planned_written(out)
    for pl, ext in (("cuda", ".cu"), ("hip", ".hip")):
        assert main(argv + ["--list-outputs", pl]) == 0
        units = capsys.readouterr().out.splitlines()
        if target not in (pl, "all"):
            assert units == []
            continue
        man = json.loads((out / "manifest.json").read_text())
        if codegen == "table":     # the library's units (hccc.compiler.backend.table_units)
            want = sorted(str(p) for p in out.glob(f"hccc_table_unit*{ext}"))
            assert len(want) == table_units.UNITS
        else:
            want = sorted({str(out / e["sources"][pl]) for e in man["ranks"] if pl in e["sources"]})
        assert sorted(units) == want and all(u.endswith(ext) and Path(u).is_file() for u in units)


def _planned_written(out) -> list[str]:
    """The files in ``out`` but those of the exports that cannot name theirs before compiling
    (they may refuse: the MSCCL XML, the MSCCL++ plan)."""
    man = json.loads((out / "manifest.json").read_text())
    unplanned = set()
    for e in exports():
        named = man.get(e.manifest_key) if e.planned is None else None
        unplanned.update([named] if isinstance(named, str) else named or [])
    return sorted(str(p) for p in out.iterdir() if p.name not in unplanned)


def test_list_outputs_follows_the_cluster(tmp_path, capsys):
    """A mixed-vendor cluster: CUDA sources for the NVIDIA ranks, HIP for the AMD ranks."""
    algo = ROOT / "examples" / "c2c" / "c2c_allreduce_mixed_v100_w7800.rccl"
    topo = ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo"
    for codegen in ("specialized", "table"):
        out = tmp_path / codegen
        argv = [str(algo), "-o", str(out), "--topology", str(topo), "--codegen", codegen]
        assert main(argv + ["--list-outputs"]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert main(argv) == 0
        capsys.readouterr()
        assert sorted(listed) == _planned_written(out)
        assert any(n.endswith(".hip") for n in listed) and any(n.endswith(".cu") for n in listed)


def test_depfile_names_the_inputs_and_hccc(tmp_path):
    d = tmp_path / "dir with space"
    d.mkdir()
    algo = d / "algo.rccl"
    algo.write_text(RING.read_text())
    out, dep = tmp_path / "o", tmp_path / "o.d"
    assert main([str(algo), "-o", str(out), "--depfile", str(dep)]) == 0
    text = dep.read_text()
    target, _, deps = text.partition(":")
    assert target == str(out / "manifest.json")
    names = [t.replace("\\ ", " ") for t in deps.replace("\\\n", " ").replace("\\ ", "\0").split()]
    names = [t.replace("\0", " ") for t in names]
    assert str(algo) in names
    assert any(n.endswith("hccc_prims.h.j2") for n in names)
    assert any(n.endswith("table_codegen.py") for n in names)
    assert all(Path(n).is_file() for n in names)


def test_list_outputs_of_a_bad_algorithm_is_a_located_error(tmp_path, capsys):
    bad = tmp_path / "bad.rccl"
    bad.write_text("def ResCCLAlgo(nRanks=4, AlgoName=\"x\", OpType=\"Allreduce\"):\n    transfer(0, 1, 0, 0, zap)\n")
    assert main([str(bad), "-o", str(tmp_path / "o"), "--list-outputs"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "error" in err and "Traceback" not in err


@needs_gxx
def test_run_a_table_mode_outdir(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table", "--chunk-size", "256"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--bytes", "1K,5000", "--dtype", "int32", "--op", "max",
                 "--iters", "1", "--warmup", "0", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["codegen"] == "table" and len(rep["results"]) == 4   # 2 sizes x 2 placements
    # a damaged table is refused with a located error, not run
    man = json.loads((out / "manifest.json").read_text())
    tpath = table_path(out, man)
    tpath.write_bytes(tpath.read_bytes()[:-8])
    assert main(["run", str(out), "--bytes", "1K"]) == 1
    err = capsys.readouterr().err
    assert "manifest.json:1:1: error:" in err and "Traceback" not in err


@needs_gxx
def test_fuzz_in_table_mode(capsys):
    assert main(["fuzz", str(RING), "--codegen", "table", "--examples", "3", "--dtypes", "int32",
                 "--ops", "sum", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["codegen"] == "table" and rep["cases"] >= 3


@settings(max_examples=60)
@given(data=st.data())
def test_bit_packing_matches_an_integer_oracle(data):
    """pack_bits lays ``bits``-bit values LSB first: the same bytes as one big integer built value
    by value (Python ints as the oracle), padded to whole u64 words plus a spare one; unpack_bits
    inverts it."""
    bits = data.draw(st.integers(0, 64), label="bits")
    vals = data.draw(st.lists(st.integers(0, (1 << bits) - 1 if bits else 0), max_size=70), label="values")
    got = tf.pack_bits(np.array(vals, np.uint64), bits)
    if bits == 0:
        assert got == b""
        return
    big = 0
    for i, x in enumerate(vals):
        big |= x << (i * bits)
    words = (len(vals) * bits + 63) // 64 + 1
    assert got == big.to_bytes(words * 8, "little")
    back = tf.unpack_bits(np.frombuffer(got, "<u8"), bits, len(vals))
    assert back.tolist() == vals


def test_table_kernels_command_writes_the_generic_kernels_once(tmp_path, capsys):
    d = tmp_path / "generic"
    assert main(["--table-kernels", str(d)]) == 0
    names = sorted(p.name for p in d.iterdir())
    assert {"hccc_table.cu", "hccc_table.hip", "hccc_table.h", "hccc_prims.h", "Makefile",
            "CMakeLists.txt"} <= set(names)
    assert "hccc_table_cuda" in (d / "CMakeLists.txt").read_text()
    stamp = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    assert main(["--table-kernels", str(d)]) == 0        # unchanged files are left alone
    assert {p.name: p.stat().st_mtime_ns for p in d.iterdir()} == stamp
    # the generic kernels are the same files a table-mode compile writes
    out = tmp_path / "o"
    assert main([str(RING), "-o", str(out), "--codegen", "table"]) == 0
    for name in ("hccc_table.cu", "hccc_table.h", "hccc_prims.h"):
        assert (out / name).read_bytes() == (d / name).read_bytes()
    assert main(["--table-kernels"]) == 2
    assert "usage" in capsys.readouterr().err
