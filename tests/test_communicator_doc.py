"""docs/communicator.md's one-rank-per-process example runs as written (four processes, the CPU emulation)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from communicator_calls import require_torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow   # four processes importing torch and building a kernel each
def test_documented_example_runs(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    require_torch()
    text = (ROOT / "docs" / "communicator.md").read_text()
    section = text.split("# One rank per process", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(res.stdout.splitlines())
    assert lines == [f"rank {r}: {[float(x) for x in range(4) for _ in range(3)]}" for r in range(4)]
