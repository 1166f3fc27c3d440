"""The kernel property tests with the CPU emulation built as ``hccc run`` builds it (-O1): README's
command and the slow set build at -O0 for speed (``conftest.pytest_configure``); this child pytest,
in the slow set, runs the same property tests against the optimised build, where the compiler may
reorder what the emulated memory model does not order."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import OPTIMISED_RERUN

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.slow
@pytest.mark.parametrize("test_file", OPTIMISED_RERUN)    # one child per file: the slow set's workers share them
def test_kernel_properties_with_the_optimised_emulation(test_file):
    env = dict(os.environ)
    env["HCCC_CPU_OPT"] = "-O1"
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-m", "not slow", "--rootdir", str(HERE), str(HERE / test_file)]
    res = subprocess.run(cmd, cwd=str(HERE), env=env, capture_output=True, text=True, timeout=1800, check=False)
    out = res.stdout[-6000:] + res.stderr[-6000:]
    assert res.returncode == 0, out
    assert " passed" in res.stdout and " failed" not in res.stdout, out


def test_readme_command_builds_the_emulation_at_o0_and_the_rerun_list_exists():
    """Under README's command and the slow set the emulation builds at -O0 (unless the user set
    HCCC_CPU_OPT), and every file the slow set reruns optimised exists."""
    import conftest
    from hccc.runtime.cpu import CpuPlatform
    for f in OPTIMISED_RERUN:
        assert (HERE / f).is_file(), f
    if not conftest.DEFAULT_RUN_AT_O0:
        pytest.skip("HCCC_CPU_OPT given, or neither README's command nor the slow set")
    assert CpuPlatform().opt == "-O0"
