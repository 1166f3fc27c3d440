"""The kernel property tests of ``kernels_under_asan.py`` under AddressSanitizer: a child pytest
with the ASan runtime preloaded and the CPU platform's ``sanitize="address"`` build (every buffer
ends in a redzone). Any out-of-bounds access aborts the child with ASan's report, printed here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hccc.runtime.cpu import asan_runtime

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(shutil.which("g++") is None or asan_runtime() is None,
                    reason="g++ with an ASan runtime (libasan) is not installed")
@pytest.mark.slow
def test_kernel_properties_under_address_sanitizer():
    env = dict(os.environ)
    env["LD_PRELOAD"] = asan_runtime()
    env["HCCC_CPU_SANITIZE"] = "address"
    # Python itself leaks by design; stop at the first error with a full report
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0"
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "no:randomly", "--rootdir", str(HERE), str(HERE / "kernels_under_asan.py")]
    res = subprocess.run(cmd, cwd=str(HERE), env=env, capture_output=True, text=True, timeout=1500)
    out = res.stdout[-6000:] + res.stderr[-6000:]
    assert res.returncode == 0, out
    assert "AddressSanitizer" not in res.stderr, out
    assert " passed" in res.stdout and " skipped" not in res.stdout, out


@pytest.mark.skipif(shutil.which("g++") is None or asan_runtime() is None,
                    reason="g++ with an ASan runtime (libasan) is not installed")
@pytest.mark.slow
def test_communicator_device_counts_under_address_sanitizer():
    """The Communicator's AllToAllv with hostile device counts (``kernels_under_asan.py``), alone:
    its ranks are processes the child starts, so they run under the child's ASan runtime."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = asan_runtime()
    env["HCCC_CPU_SANITIZE"] = "address"
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0"
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "no:randomly", "--rootdir", str(HERE), str(HERE / "kernels_under_asan.py"), "-k",
           "communicator_device_counts"]
    res = subprocess.run(cmd, cwd=str(HERE), env=env, capture_output=True, text=True, timeout=1500)
    out = res.stdout[-6000:] + res.stderr[-6000:]
    assert res.returncode == 0, out
    assert "AddressSanitizer" not in res.stderr + res.stdout, out
    assert "1 passed" in res.stdout, out


@pytest.mark.skipif(shutil.which("g++") is None or asan_runtime() is None,
                    reason="g++ with an ASan runtime (libasan) is not installed")
def test_run_sanitize_option(tmp_path, capfd):
    """``hccc run --sanitize`` restarts itself with the ASan runtime and runs the kernels there."""
    from hccc.cli import main
    from msccl_texts import allpairs_allreduce
    xml = tmp_path / "allpairs.xml"
    xml.write_text(allpairs_allreduce(2, 3))
    assert main(["run", str(xml), "--sanitize", "--bytes", "4,100", "--json"]) == 0
    out = capfd.readouterr()
    assert '"ok": true' in out.out.replace("True", "true"), out.out + out.err
    assert "AddressSanitizer" not in out.err
    assert main(["run", str(xml), "--sanitize", "--backend", "cuda"]) == 2
    assert "--sanitize needs --backend cpu" in capfd.readouterr().err
    # several element types: the command restarts once, and its child runs each type once
    assert main(["run", str(xml), "--sanitize", "--bytes", "4", "-d", "float,int32", "--json"]) == 0
    runs = [json.loads(ln) for ln in capfd.readouterr().out.splitlines() if ln.startswith("{")]
    assert [r["results"][0]["dtype"] for r in runs] == ["float32", "int32"]
