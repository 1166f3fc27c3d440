"""The compile's second thread (``hccc.compiler.pipeline.context.BESIDE_FROM``): verification beside
scheduling, the IR checks beside code generation. The outputs are those of the one-thread compile,
byte for byte; errors keep their order (verification first, then the checks, then code
generation) and a failed compile leaves no output directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from hccc.compiler.pipeline import context as pipeline
from hccc.util.diagnostics import CompileError
from hccc.compiler.passes import build
from hccc.compiler.pipeline import CompileOptions, StageTimes, compile_algorithm, load_algorithm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("example", ["hm_allreduce_2x4.rccl", "ring_allgather_8.rccl"])
def test_beside_writes_what_one_thread_writes(tmp_path, monkeypatch, example):
    alg = load_algorithm(EXAMPLES / example)
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 10 ** 9)
    compile_algorithm(alg, tmp_path / "one", CompileOptions())
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    times = StageTimes()
    compile_algorithm(alg, tmp_path / "two", CompileOptions(), times)
    assert times.beside == {"verify": "schedule+lower", "checks": "codegen"}
    assert times.seconds["verify"] > 0 and times.seconds["checks"] > 0
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_fusion_keeps_its_checks_inline(tmp_path, monkeypatch):
    """Fusion's back-off is driven by the checks: with ``fuse`` they run inside schedule+lower."""
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    times = StageTimes()
    compile_algorithm(load_algorithm(EXAMPLES / "ring_allreduce_8.rccl"), tmp_path / "o",
                      CompileOptions(fuse=True), times)
    assert times.beside == {"verify": "schedule+lower"}
    assert "schedule+lower/checks" in times.phases


def _unverifiable(tmp_path: Path) -> Path:
    """A ring AllGather missing its last transfer: verification refuses it."""
    lines = (EXAMPLES / "ring_allgather_8.rccl").read_text().splitlines()
    src = tmp_path / "broken.rccl"
    body = "\n".join(lines).replace("for r in range(0, N):", "for r in range(0, N - 1):")
    src.write_text(body + "\n")
    return src


def _failing(exc: BaseException):
    """A stand-in for a stage that raises ``exc``."""
    def fail(*_a, **_k):
        raise exc
    return fail


def _refused(alg, out: Path, exc_type, match: str) -> None:
    """The compile raises ``exc_type`` (message matching ``match``) and leaves no output directory."""
    with pytest.raises(exc_type, match=match):
        compile_algorithm(alg, out, CompileOptions())
    assert not out.exists()


def test_a_verification_error_wins_over_a_failed_schedule(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    alg = load_algorithm(_unverifiable(tmp_path))
    monkeypatch.setattr(build, "schedule_algorithm", _failing(RuntimeError("scheduling failed")))
    _refused(alg, tmp_path / "o", CompileError, "does not hold chunk")


def test_a_failed_check_writes_nothing_and_wins_over_codegen(tmp_path, monkeypatch):
    from hccc.compiler.backend import codegen
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    alg = load_algorithm(EXAMPLES / "ring_allgather_8.rccl")
    monkeypatch.setattr(build, "check_program", _failing(AssertionError("internal error: the checks failed")))
    _refused(alg, tmp_path / "o", AssertionError, "the checks failed")
    monkeypatch.setattr(codegen, "generate", _failing(ValueError("codegen failed")))
    _refused(alg, tmp_path / "o", AssertionError, "the checks failed")


def test_timings_say_what_ran_beside(tmp_path, monkeypatch):
    """A program past the threshold, through the command line (in this process): ``--timings``
    marks the stages."""
    from cli_runs import run_cli
    from hccc.compiler.frontend.generators import hm_allreduce_rccl
    src = tmp_path / "hm.rccl"
    src.write_text(hm_allreduce_rccl(2, 8))
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    r = run_cli(src, "-o", tmp_path / "o", "--timings")
    assert r.returncode == 0, r.stderr
    assert "verify" in r.stdout and "(beside schedule+lower, on a second thread)" in r.stdout
    assert "(beside codegen, on a second thread)" in r.stdout
