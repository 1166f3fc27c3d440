"""``hccc xml``: exit codes, options, atomic output, located errors for XML input."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hccc.cli import main
from hccc.compiler.interop.msccl_xml import XmlLimits, export_xml
from hccc.compiler.pipeline import load_program

from cli_runs import run_cli

ROOT = Path(__file__).resolve().parent.parent
RING = ROOT / "examples" / "ring_allgather_8.rccl"


def test_writes_the_exported_text(tmp_path, capsys):
    out = tmp_path / "ring.xml"
    assert main(["xml", str(RING), "-o", str(out)]) == 0
    assert out.read_text() == export_xml(load_program(RING), XmlLimits())
    said = capsys.readouterr().out
    assert said.startswith(f"hccc: wrote {out}: ring_allgather_8, allgather on 8 ranks, 16 thread blocks")


def test_stdout_and_options(capsys):
    assert main(["xml", str(RING), "-o", "-", "--proto", "LL128", "--min-bytes", "1K", "--max-bytes", "1M",
                 "--tb-alloc", "connection", "--scheduler", "rr"]) == 0
    root = ET.fromstring(capsys.readouterr().out)
    assert (root.get("proto"), root.get("minBytes"), root.get("maxBytes")) == ("LL128", "1024", str(1 << 20))


def test_limit_error_keeps_the_old_file(tmp_path, capsys):
    out = tmp_path / "ring.xml"
    out.write_text("old")
    assert main(["xml", str(RING), "-o", str(out), "--xml-max-steps", "4", "--xml-max-channels", "1"]) == 1
    err = capsys.readouterr().err
    # located at the algorithm's header: the limit is about the whole program
    assert f"{RING}:" in err.splitlines()[0] and ": error: the algorithm does not fit the MSCCL runtime" in err
    assert "--xml-max-steps" in err and "--xml-max-channels" in err
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ring.xml"], "no temporary file left behind"
    assert main(["xml", str(RING), "-o", str(out), "--xml-max-steps", "4", "--xml-max-channels", "1",
                 "--xml-legacy"]) == 1
    assert main(["xml", str(RING), "-o", str(out), "--xml-legacy"]) == 0


def test_xml_input_is_reexported_and_errors_are_located(tmp_path, capsys):
    sample = ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml"
    out = tmp_path / "again.xml"
    assert main(["xml", str(sample), "-o", str(out)]) == 0
    bad = tmp_path / "bad.xml"
    bad.write_text(sample.read_text().replace('coll="allreduce"', 'coll="alltoallv"'))
    assert main(["xml", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err and "unsupported collective 'alltoallv'" in err and "^" in err


def test_usage_errors_exit_2():
    r = run_cli("xml", RING)
    assert r.returncode == 2 and "-o" in r.stderr
    r = run_cli("xml", RING, "-o", "x.xml", "--proto", "LL256")
    assert r.returncode == 2


def test_output_directory_is_refused(tmp_path, capsys):
    assert main(["xml", str(RING), "-o", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


def test_over_the_element_limit_is_refused_never_half_written(tmp_path, capsys):
    """A program over the loaders' XML elements is refused by hccc xml with an error at the
    algorithm's header and no file; the compile says so and writes no XML (the manifest says none),
    never a warning beside an unusable file."""
    import json
    out = tmp_path / "r.xml"
    assert main(["xml", str(RING), "-o", str(out), "--xml-max-elements", "20"]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"{RING}:") and ": error: " in first and "XML elements" in first
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert main([str(RING), "-o", str(tmp_path / "k"), "--xml-max-elements", "20"]) == 0
    err = capsys.readouterr().err
    assert "MSCCL XML not written (the kernels are)" in err and "XML elements" in err
    assert not list((tmp_path / "k").glob("*.xml"))
    assert json.loads((tmp_path / "k" / "manifest.json").read_text())["msccl_xml"] is None
    plan = tmp_path / "r.json"
    assert main(["plan", str(RING), "-o", str(plan), "--max-tbs", "1"]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"{RING}:") and "MSCCL++ executor" in first and not plan.exists()
