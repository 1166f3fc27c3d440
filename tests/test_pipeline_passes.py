"""The compile as a pass list (``hccc.compiler.pipeline``): the Python API and ``hccc ALGO -o``
compile the same bytes, with and without a cluster; the reader registry serves every command
(``hccc check`` on a ProgramIR); an export registers in a few lines."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import hccc
from hccc.cli import main
from hccc.util.diagnostics import CompileError
from hccc.compiler.pipeline import CompileOptions, compile_passes, reader_for
from hccc.compiler.pipeline.readers import readers
from hccc.compiler.pipeline import emitters

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("algo, cluster", [
    ("ring_allreduce_8.rccl", None),
    ("ring_allreduce_8.rccl", "clusters/a100_topo1.topo"),
    ("c2c/c2c_allgather_2x4.rccl", "clusters/mixed_v100_w7800.topo"),
])
def test_python_api_and_command_line_write_the_same_bytes(tmp_path, algo, cluster, capsys):
    if not (EXAMPLES / algo).exists():
        algo = next(p.relative_to(EXAMPLES).as_posix() for p in sorted((EXAMPLES / "c2c").glob("*.rccl")))
    args = [str(EXAMPLES / algo), "-o", str(tmp_path / "cli")]
    if cluster:
        args += ["--topology", str(EXAMPLES / cluster)]
    assert main(args) == 0
    ctx = hccc.compile(EXAMPLES / algo, tmp_path / "api", CompileOptions(),
                       topology=EXAMPLES / cluster if cluster else None)
    assert _files(tmp_path / "cli") == _files(tmp_path / "api")
    man = json.loads((tmp_path / "api" / "manifest.json").read_text())
    assert ("topology" in man) == bool(cluster)
    if cluster and ctx.ir.allocation.tbs_state_based != ctx.ir.allocation.tbs_connection_based:
        assert "tb_alloc_kept" in ctx.ir.stats       # the cost model chose, without the caller asking


def test_the_pass_list_is_one_list_in_order():
    names = [p.name for p in compile_passes()]
    assert names[:5] == ["verify", "topology", "dag", "schedule", "lower"]
    assert names.index("allocation") < names.index("fusion") < names.index("channels") \
        < names.index("msccl_xml") < names.index("codegen") == len(names) - 1
    assert names.count("channels") == 1


def test_timings_are_the_runners(tmp_path):
    ctx = hccc.compile(EXAMPLES / "ring_allgather_8.rccl", tmp_path / "o")
    t = ctx.times
    for stage in ("parse", "verify", "schedule+lower", "channels", "msccl_xml", "codegen"):
        assert t.seconds[stage] >= 0
    assert {"schedule+lower/dag", "schedule+lower/schedule", "schedule+lower/lower", "codegen/render"} <= set(t.phases)


def test_check_reads_a_program_ir(tmp_path, capsys):
    assert main([str(EXAMPLES / "ring_allreduce_8.rccl"), "-o", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    ir = tmp_path / "o" / "ring_allreduce_8.ir.json"
    assert main(["check", str(ir), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["valid"] and rep["format"] == "program-ir" and rep["collective"] == "allreduce"
    assert rep["nranks"] == 8 and rep["transfers"] == 112


def test_check_refuses_a_program_ir_that_does_not_implement_its_collective(tmp_path, capsys):
    """A ProgramIR whose last send carries the wrong chunk: structurally fine, the proof refuses it."""
    assert main([str(EXAMPLES / "ring_allgather_8.rccl"), "-o", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "ring_allgather_8.ir.json").read_text())
    capsys.readouterr()
    bad = tmp_path / "bad.ir.json"
    _corrupt_a_chunk(data)
    bad.write_text(json.dumps(data))
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:1:1: error:") or "error:" in err
    assert "Traceback" not in err


def _corrupt_a_chunk(data: dict) -> None:
    """Make the first send read the chunk after the one it should (the ``src_off`` column)."""
    col = data["prims"]["src_off"]
    nchunks = int(data["nchunks"])
    if isinstance(col, str):
        vals = col.split()
        vals[0] = str((int(vals[0]) + 1) % nchunks)
        data["prims"]["src_off"] = " ".join(vals)
    else:
        col[0] = (int(col[0]) + 1) % nchunks


def test_every_command_uses_the_reader_registry_and_its_hints(tmp_path, capsys):
    assert reader_for("a.rccl").gives == "algorithm"
    assert reader_for("a.XML").name == "msccl-xml"
    assert reader_for("a.json").name == "program-ir"
    with pytest.raises(CompileError, match="don't know how to read 'a.txt'"):
        reader_for("a.txt")
    # the wrong-file hint still names the right command
    assert main(["check", str(EXAMPLES / "clusters" / "a100_topo1.topo")]) == 1
    assert "hccc topo" in capsys.readouterr().err
    assert {r.name for r in readers()} >= {"rccl", "msccl-xml", "program-ir"}


def test_a_reader_told_apart_by_content(tmp_path, monkeypatch):
    """Two formats sharing ``.json``: the one whose ``claims`` test takes the file wins, the plain
    ProgramIR reader takes the rest."""
    from hccc.compiler.pipeline import readers as reg
    monkeypatch.setattr(reg, "_READERS", list(reg._READERS))
    reg.register_reader(reg.Reader("plan", (".json",), "a plan", "program", lambda p, o: "PLAN",
                                   claims=lambda head: b'"plan_schema"' in head))
    plan, ir = tmp_path / "p.json", tmp_path / "i.json"
    plan.write_text('{"plan_schema": 1}')
    ir.write_text('{"schema": "hccc.ir/1"}')
    assert reg.reader_for(plan).name == "plan"
    assert reg.reader_for(ir).name == "program-ir"


def test_an_export_registers_in_a_few_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(emitters, "_EMITTERS", dict(emitters._EMITTERS))
    emitters.register_emitter(emitters.Emitter(
        "summary", "export", lambda ctx: {f"{ctx.ir.name}.summary.txt": f"{ctx.ir.collective} {ctx.ir.nranks}\n"},
        manifest_key="summary", refusal="summary not written"))
    ctx = hccc.compile(EXAMPLES / "ring_allgather_8.rccl", tmp_path / "o")
    assert (tmp_path / "o" / "ring_allgather_8.summary.txt").read_text() == "allgather 8\n"
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["summary"] == "ring_allgather_8.summary.txt" and "ring_allgather_8.summary.txt" in man["files"]
    assert "summary" in ctx.times.seconds

    def refuse(ctx):
        raise _refusal()
    emitters.register_emitter(emitters.Emitter("summary", "export", refuse, manifest_key="summary",
                                               refusal="summary not written"))
    ctx = hccc.compile(EXAMPLES / "ring_allgather_8.rccl", tmp_path / "o2")
    assert json.loads((tmp_path / "o2" / "manifest.json").read_text())["summary"] is None
    assert any(n.startswith("summary not written: too big") for n in ctx.notes)


def test_list_outputs_asks_the_emitters(tmp_path, capsys, monkeypatch):
    """--list-outputs is what the emitters declare: an export that knows its file in advance is
    listed, and the listing is then exactly what the compile writes (the MSCCL XML and MSCCL++ plan,
    which may refuse, declare nothing)."""
    monkeypatch.setattr(emitters, "_EMITTERS", dict(emitters._EMITTERS))
    algo = EXAMPLES / "ring_allgather_8.rccl"
    out = tmp_path / "o"
    assert main([str(algo), "-o", str(out), "--list-outputs"]) == 0
    before = capsys.readouterr().out.splitlines()
    emitters.register_emitter(emitters.Emitter(
        "summary", "export", lambda ctx: {f"{ctx.ir.name}.summary.txt": "x\n"}, manifest_key="summary",
        planned=lambda name, platforms, which: [f"{name}.summary.txt"]))
    assert main([str(algo), "-o", str(out), "--list-outputs"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert sorted(listed) == sorted(before + [str(out / "ring_allgather_8.summary.txt")])
    assert main([str(algo), "-o", str(out), "--list-outputs", "cuda"]) == 0
    assert not any(u.endswith(".summary.txt") for u in capsys.readouterr().out.splitlines())
    assert main([str(algo), "-o", str(out)]) == 0
    capsys.readouterr()
    man = json.loads((out / "manifest.json").read_text())
    unplanned = {man.get(k) for k in ("msccl_xml", "mscclpp_plan")}
    assert sorted(listed) == sorted(str(p) for p in out.iterdir() if p.name not in unplanned)
    with pytest.raises(ValueError, match="planned"):
        emitters.Emitter("k", "kernels", lambda ctx, outdir: ([], {}))


def _refusal():
    from hccc.util.diagnostics import Diagnostic
    return CompileError([Diagnostic("too big", None)])


@pytest.mark.parametrize("field,value", [("chunk_bytes", "1M"), ("chunk_bytes", 1.5), ("chunk_bytes", True),
                                         ("max_transfers", None), ("xml_instances", "2"), ("channels", 2.0),
                                         ("xml_fuse", "yes")])
def test_compile_options_of_the_wrong_type_are_named_at_once(field, value):
    """A Python caller's option of the wrong type is a TypeError naming the option when the options
    are made, not an error from a comparison deep in a pass."""
    with pytest.raises(TypeError, match=f"CompileOptions.{field} is"):
        CompileOptions(**{field: value})


def test_compile_options_take_numpy_integers():
    import numpy as np
    assert CompileOptions(chunk_bytes=np.int64(1 << 16), channels=np.int32(2)).chunk_bytes == 1 << 16
