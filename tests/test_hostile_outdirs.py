"""Compiled OUTDIRs and ProgramIRs that were damaged or crafted: every file an OUTDIR names goes
through the checks of the user's own inputs (no FIFO, device or huge file is read), every value
read back from a table-mode OUTDIR is checked as a ProgramIR JSON file is (no internal error, no
value silently cut to fit), the two ends of every message agree on what it carries, memory the
FIFOs would need is checked before it is allocated, and a checked program runs at every slice
``hccc run`` accepts or the slice is refused (never a run that sticks)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples
from hccc.cli import main
from hccc.compiler.backend import table_format as tf
from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import CompileOptions, compile_program, load_manifest, load_program
from hccc.compiler.ir.check import load_ir_json
from hccc.compiler.ir.program_ir import IRFormatError
from hccc.runtime.memory_limits import check_fifo_memory, plans_memory_bytes
from hccc.runtime.rank_memory import RankPlan, check_slice
from hccc.runtime.platform import PlatformError

from capped_runs import assert_fires, hccc

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def table_outdir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("table") / "ring"
    ir = build_program(gen.ring_allgather(4, name="ring"), chunk_bytes=256)
    compile_program(ir, out, CompileOptions(codegen="table", chunk_bytes=256))
    return out


def _copy(src: Path, dst: Path) -> tuple[Path, dict, Path]:
    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    return dst, man, dst / man["table"]["file"]


def _rewrite_tables(table: Path, change) -> None:
    ranks = [tf.read_section(s) for s in tf.file_sections(table.read_bytes())]
    change(ranks)
    table.write_bytes(tf.encode_file([tf.encode_section(t) for t in ranks]))


def _column(name, f):
    def change(ranks):
        for t in ranks:
            t.columns[name] = f(np.asarray(t.columns[name], np.int64))
    return change


def test_the_table_outdir_loads(table_outdir):
    ir, plats = load_manifest(table_outdir / "manifest.json")
    assert ir.nranks == 4 and plats == ["cuda"] * 4


# ----------------------------------------------------------------------- the table file itself
@pytest.mark.parametrize("kind, pattern", [("fifo", "FIFO"), ("dev-zero", "character device"),
                                           ("sparse", "over the .* input limit")])
def test_special_table_files_are_refused_at_once(table_outdir, tmp_path, kind, pattern):
    out, man, table = _copy(table_outdir, tmp_path / "o")
    table.unlink()
    if kind == "fifo":
        os.mkfifo(table)
    elif kind == "dev-zero":
        table.symlink_to("/dev/zero")
    else:
        with open(table, "wb") as f:
            f.truncate(8 << 30)        # sparse: no disk used
    assert_fires(hccc("run", out, "--sizes", "4K", timeout=60), pattern=pattern)


# ----------------------------------------------------------------------- values read back
TABLE_DAMAGE = {
    "negative task base": _column("task", lambda v: v - 7),
    "negative pipeline base": _column("pipeline", lambda v: v - 7),
    "negative task2 base": _column("task2", lambda v: v - 7),
    "counts of 0": _column("cnt", lambda v: v * 0),
    "a pipeline past int32": _column("pipeline", lambda v: v + (1 << 40)),
    "a channel past int32": _column("channel", lambda v: v + (1 << 33)),
}
MANIFEST_DAMAGE = {
    "send_conns naming peer 99": lambda m: m["ranks"][0]["send_conns"].__setitem__(0, [99, 0]),
    "buffers as a list": lambda m: m.__setitem__("buffers", [1, 2]),
    "a connection with sends but no receives": lambda m: m["ranks"][1].__setitem__("recv_conns", [[3, 0]]),
    "a connection that is not a pair": lambda m: m["ranks"][1].__setitem__("recv_conns", [3]),
    "nchunks as text": lambda m: m.__setitem__("nchunks", "4"),
    "an unknown collective": lambda m: m.__setitem__("collective", "gossip"),
    "ranks as an object": lambda m: m.__setitem__("ranks", {"0": 1}),
}


@pytest.mark.parametrize("what", sorted(TABLE_DAMAGE) + sorted(MANIFEST_DAMAGE))
def test_damaged_table_outdirs_are_located_errors(table_outdir, tmp_path, what):
    out, man, table = _copy(table_outdir, tmp_path / "o")
    if what in TABLE_DAMAGE:
        _rewrite_tables(table, TABLE_DAMAGE[what])
    else:
        MANIFEST_DAMAGE[what](man)
        (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(CompileError) as err:
        load_manifest(out / "manifest.json")
    assert err.value.diagnostics[0].location is not None, what


def test_damaged_table_outdir_through_the_command_line(table_outdir, tmp_path, capsys):
    out, man, table = _copy(table_outdir, tmp_path / "o")
    _rewrite_tables(table, TABLE_DAMAGE["negative task base"])
    assert main(["run", str(out), "--sizes", "4K"]) == 1
    err = capsys.readouterr().err
    assert "manifest.json:1:1: error:" in err and "internal error" not in err


@given(data=st.data())
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_column_damage_is_refused_or_loads(table_outdir, tmp_path_factory, data):
    """Whatever base one column of one rank's section has (the raw bytes of the file, as a damaged
    or crafted file holds them), loading either gives a checked program or a located error: never
    another exception."""
    out, man, table = _copy(table_outdir, tmp_path_factory.mktemp("d") / "o")
    raw = bytearray(table.read_bytes())
    head = np.frombuffer(raw, tf.FILE_HEAD, count=1)[0]
    offsets = np.frombuffer(raw, "<u8", count=int(head["nranks"]) + 1, offset=tf.FILE_HEAD.itemsize)
    rank = data.draw(st.integers(0, 3))
    col = data.draw(st.integers(0, len(tf.COLUMNS) - 1))
    section = np.frombuffer(raw, tf.HEAD, count=1, offset=int(offsets[rank]))
    section[0]["cols"][col]["base"] += data.draw(
        st.sampled_from([-(1 << 62), -(1 << 40), -(1 << 31), -5, -1, 1, 3, 1 << 31, 1 << 40, 1 << 62]))
    table.write_bytes(bytes(raw))
    try:
        ir, _ = load_manifest(out / "manifest.json")
    except CompileError as exc:
        assert exc.diagnostics[0].location is not None
    else:
        assert ir.nranks == 4


# ----------------------------------------------------------------------- both ends of a message
def test_a_receive_longer_than_its_message_is_refused_at_load():
    ir = build_program(gen.ring_allgather(4), chunk_bytes=256)
    doc = json.loads(ir.to_json())
    p = doc["prims"]
    recv = next(i for i, op in enumerate(p["op"]) if doc["ops"][op] == "recv")
    # two chunks where the sender sends one; the destination range stays inside the buffer
    p["count"][recv] = 2
    p["dst_off"][recv] = min(p["dst_off"][recv], doc["buffers"]["output"] - 2)
    with pytest.raises(IRFormatError, match="receives 2 chunks but the matching .* sends 1"):
        load_ir_json(json.dumps(doc))


# ----------------------------------------------------------------------- table mode's slot count
def test_table_mode_runs_programs_whose_local_copies_move_several_chunks(capsys):
    # the in-place -> out-of-place rewrite of an MSCCL import copies 2 chunks in one primitive
    xml = EXAMPLES / "msccl" / "allgather_direct_4.xml"
    ir = load_program(xml)
    assert int(ir.prims["count"].max()) > ir.max_step_chunks
    assert main(["run", str(xml), "--codegen", "table", "--sizes", "1K", "-n", "1", "-w", "0"]) == 0, \
        capsys.readouterr().err


# ----------------------------------------------------------------------- FIFO memory
def test_fifo_memory_is_checked_before_allocating(monkeypatch):
    man = {"nchannels": 1, "nslots": 8, "chunk_bytes": 1 << 20, "slot_bytes": 1 << 20,
           "ranks": [{"recv_conns": [[1, 0]], "send_conns": [[1, 0]], "progress_slots": 1},
                     {"recv_conns": [[0, 0]], "send_conns": [[0, 0], [0, 1]], "progress_slots": 1}]}
    plans = [RankPlan.from_manifest(man, r) for r in range(2)]
    # each rank receives on one connection of 8 MiB slots; rank 1's second send has no receiver
    fifo = 8 << 20
    assert plans_memory_bytes(plans) == sum(p.ctrl_bytes for p in plans) + 2 * fifo + (16 + fifo)
    monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "16M")
    with pytest.raises(PlatformError, match="FIFOs need"):
        check_fifo_memory("x", plans)
    check_fifo_memory("x", plans, [0])            # one rank's share fits


def test_fifo_memory_of_the_command_line(capsys, monkeypatch):
    """The FIFOs are sized by the call (a slot holds a slice of each chunk a message carries, at
    most --chunk-size): a small call runs with a 64 MiB --chunk-size and 32 channels, a call whose
    own FIFOs pass the limit is refused before anything is built."""
    monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "1G")
    algo = str(EXAMPLES / "direct_alltoall_8.rccl")
    assert main(["run", algo, "--channels", "32", "--chunk-size", "64M", "--codegen", "table",
                 "--sizes", "4M", "-n", "1", "-w", "0"]) == 1
    err = capsys.readouterr().err
    assert "FIFOs need 7.0 GiB" in err and "over the limit of 1.0 GiB" in err and "Traceback" not in err
    assert main(["run", algo, "--channels", "32", "--chunk-size", "64M", "--codegen", "table",
                 "--sizes", "4K", "-n", "1", "-w", "0"]) == 0, capsys.readouterr().err
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out


def test_run_shrinks_a_default_slot_whose_fifos_would_not_fit(capsys, monkeypatch):
    """Without --chunk-size, ``hccc run`` of an algorithm whose FIFOs for its largest call pass
    the run's memory limit halves the slot until they fit (checked before anything is built),
    says so, and the run is right; with --chunk-size given the limit refuses as before.
    (Synthesised tree programs of 8-11 GPUs have thousands of connections.)"""
    algo = EXAMPLES / "direct_alltoall_8.rccl"
    monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "100M")    # 1M: 56 connections x 32 channels x 8 slots of 128K
    assert main(["run", str(algo), "--channels", "32", "--sizes", "4K,1M", "-n", "1", "-w", "0"]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("# chunk size"))
    slot = int(note.split()[3])
    assert slot < 1 << 20 and slot & (slot - 1) == 0 and "instead of 1048576 B" in note
    assert "the FIFOs of the run's largest call need 1.8 GiB" in note
    assert f"chunk size {slot} B, " in out
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")
            and line.split()[0].isdigit()]
    assert len(rows) == 2 and all(r[8] == "0" and r[-1] == "0" for r in rows), out
    assert main(["run", str(algo), "--channels", "32", "--sizes", "1M", "-n", "1", "-w", "0",
                 "--chunk-size", "1M"]) == 1
    assert "FIFOs need" in capsys.readouterr().err


# ----------------------------------------------------------------------- slices
def test_algorithm_order_programs_refuse_slices_that_would_stick(capsys):
    xml = EXAMPLES / "msccl" / "allreduce_ring_4.xml"
    ir = load_program(xml)
    assert ir.algorithm_level
    assert main(["run", str(xml), "--sizes", "64K", "--slice-size", "64", "--out-of-place"]) == 1
    err = capsys.readouterr().err
    assert "would stick" in err and "at least 16384 bytes" in err


@pytest.fixture(scope="module")
def ring_xml():
    return load_program(EXAMPLES / "msccl" / "allreduce_ring_4.xml")


@given(count=st.integers(1, 1 << 22), slice_units=st.integers(1, 1 << 16), es=st.sampled_from([2, 4]))
@settings(max_examples=examples(100), suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_check_slice_accepts_exactly_one_micro_batch_per_chunk(ring_xml, count, slice_units, es):
    ir = ring_xml
    slice_bytes = 16 * slice_units
    per_chunk_bytes = -(-count // ir.nchunks) * es          # the largest chunk of the call
    fits = per_chunk_bytes <= (slice_bytes // es) * es
    try:
        check_slice(ir, count, es, slice_bytes)
    except ValueError:
        assert not fits
    else:
        assert fits


@pytest.mark.parametrize("fmt", ["plan", "xml"])
def test_run_shrinks_the_default_slot_of_every_format_lowered_here(fmt, tmp_path, capsys, monkeypatch):
    """An MSCCL++ plan or an MSCCL XML is lowered by ``hccc run`` as a .rccl is, so its default slot
    is shrunk the same way where its FIFOs would not fit; a ProgramIR still runs exactly as
    written (its FIFOs sized by the call all the same)."""
    path = tmp_path / ("a.json" if fmt == "plan" else "a.xml")
    assert main([fmt, str(EXAMPLES / "direct_alltoall_8.rccl"), "-o", str(path)]) == 0
    monkeypatch.setenv("HCCC_MAX_RUN_BYTES", "120M")      # the plan's scratch: 27 MiB of buffers at 1M
    capsys.readouterr()
    assert main(["run", str(path), "--channels", "32", "--sizes", "1M", "-n", "1", "-w", "0"]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert any(line.startswith("# chunk size") and "instead of 1048576 B" in line for line in out.splitlines())
    assert "Out of bounds values : 0 OK" in out
    assert main([str(EXAMPLES / "direct_alltoall_8.rccl"), "--channels", "32", "-o", str(tmp_path / "out")]) == 0
    ir_json = tmp_path / "out" / "direct_alltoall_8.ir.json"
    assert main(["run", str(ir_json), "--sizes", "1M", "-n", "1", "-w", "0"]) == 1
    assert "FIFOs need" in capsys.readouterr().err
    assert main(["run", str(ir_json), "--sizes", "4K", "-n", "1", "-w", "0"]) == 0, capsys.readouterr().err


