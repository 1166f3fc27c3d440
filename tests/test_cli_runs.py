""":func:`cli_runs.run_cli` answers what the ``hccc`` process answers (status, stdout, stderr) and
leaves this process's working directory and environment as they were."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runs import run_cli

RING = Path(__file__).resolve().parents[1] / "examples" / "ring_allreduce_8.rccl"


@pytest.mark.parametrize("argv", [["check", RING],                       # success, a summary on stdout
                                  ["chek", RING],                        # usage error, exit 2
                                  ["xml", RING, "-o", "-"],              # an export on stdout
                                  ["check", "missing.rccl"]])            # a file error, exit 1
def test_in_process_run_answers_as_the_process_does(tmp_path, argv):
    proc = subprocess.run([sys.executable, "-m", "hccc.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, HCCC_DEBUG=""), timeout=120)
    got = run_cli(*argv, cwd=tmp_path, env={"HCCC_DEBUG": ""})
    assert (got.returncode, got.stdout, got.stderr) == (proc.returncode, proc.stdout, proc.stderr)


def test_cwd_and_environment_are_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("HCCC_DEBUG", "1")
    monkeypatch.delenv("HCCC_JIT", raising=False)
    here = os.getcwd()
    r = run_cli("check", "missing.rccl", cwd=tmp_path, env={"HCCC_DEBUG": None, "HCCC_JIT": "python"})
    assert r.returncode == 1 and "missing.rccl" in r.stderr and "cannot read" in r.stderr
    assert os.getcwd() == here
    assert os.environ["HCCC_DEBUG"] == "1" and "HCCC_JIT" not in os.environ
    assert list(tmp_path.iterdir()) == []
