"""Every MSCCL++ plan compiled to an OUTDIR is usable by hccc itself: `hccc PLAN.json -o OUT`, then
what `hccc check`/`run` and the Communicator read back (the manifest and the written ProgramIR,
checked as any file read) is accepted, and `hccc run OUT` computes the collective in CPU emulation.
Before the fix every such OUTDIR was refused with "FIFO order mismatch"."""
from __future__ import annotations

import json

from hccc.compiler.ir.check import load_ir_json
from hccc.compiler.pipeline import load_manifest
from mscclpp_plans import corpus


def _compile(text, tmp_path, k):
    from hccc.cli import main
    f = tmp_path / f"plan{k}.json"
    f.write_text(text)
    out = tmp_path / f"out{k}"
    assert main([str(f), "-o", str(out)]) == 0
    return out


def _reads_back(out):
    from hccc.cli import main
    manifest = json.loads((out / "manifest.json").read_text())
    assert main(["check", str(out / f"{manifest['algorithm']}.ir.json")]) == 0
    ir = load_ir_json((out / f"{manifest['algorithm']}.ir.json").read_text())     # as `hccc check` reads it
    loaded, _ = load_manifest(out / "manifest.json")                               # as the Communicator does
    assert loaded.nranks == ir.nranks and loaded.collective == json.loads(out.joinpath(
        f"{manifest['algorithm']}.ir.json").read_text())["collective"]


def test_every_corpus_plan_compiles_to_an_outdir_hccc_reads_back(tmp_path, capsys):
    for k, text in enumerate(corpus()):
        _reads_back(_compile(text, tmp_path, k))


def test_hccc_run_runs_a_compiled_plan_outdir(tmp_path, capsys):
    from hccc.cli import main
    out = _compile(corpus()[5], tmp_path, 0)      # the semaphore ReduceScatter
    name = json.loads((out / "manifest.json").read_text())["algorithm"]
    assert main(["check", str(out / f"{name}.ir.json")]) == 0
    assert main(["run", str(out), "--sizes", "64K", "-n", "1", "-w", "0"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out
